/*
 * ring_bench.c: the output ring between two processes.
 *
 *   throughput: the producer publishes steps of --batch rows in support
 *   mode (ids + lps) for 1, 20, 1000 and 8192 support ids; a reader in
 *   another process (attached through the real socket handshake, woken by
 *   its eventfd) copies every row out and checks it.  Side by side, the
 *   same rows through a unix stream socket (the plain-IPC alternative),
 *   and a memcpy of the same bytes in one process (the ceiling).
 *
 *   wakeup: the reader sleeps in epoll_wait; the producer publishes one
 *   row and writes the armed reader's eventfd; the reader's latency is
 *   from before the publish to having read the row.  Side by side, a bare
 *   eventfd ping-pong with no ring.
 *
 * Each measurement is repeated (--repeat) and the median reported; the
 * ring / socket column is the median of each run's own ratio (the two
 * ran back to back).  Every row a reader receives is checked; a run with
 * a bad row fails the benchmark.
 *
 *   ring_bench [--ring-bytes N] [--batch N] [--seconds S] [--rounds N]
 *              [--repeat N]
 */

#include <getopt.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/utsname.h>

#include "../t/c/shm_harness.h"


#define VOCAB       151936      /* a real vocabulary: Qwen3 */
#define MAX_LP      20
#define SLOT_START  0xfffffffeu /* marker rows */
#define SLOT_END    0xffffffffu

static const uint32_t  sizes[] = { 1, 20, 1000, 8192 };
#define N_SIZES  (sizeof(sizes) / sizeof(sizes[0]))

struct opts {
    uint64_t  ring_bytes;
    uint32_t  batch;
    double    seconds;
    uint32_t  rounds;
    uint32_t  repeat;
};

/* What a reader process reports back through a pipe. */
struct result {
    uint64_t  rows;
    uint64_t  bytes;
    uint64_t  bad;
    uint64_t  t_start;
    uint64_t  t_end;
    double    p50_us;
    double    p99_us;
};

struct reader_state {
    uint32_t   n_support;
    uint64_t   seq;
    uint32_t   idx;
    int        counting;
    int        end;
    uint8_t   *copy;
    struct result r;
};


static char  name[64];


/* ------------------------------------------------------------------ */
/* Rows                                                                 */

/* A support row: ids 0..n-1 ascending, lps -j (filled once, copied). */
static uint8_t *
row_template(uint32_t n)
{
    uint32_t         j, bytes = msv_row_size(n, n, 0);
    uint8_t         *t = calloc(1, bytes);
    int32_t         *ids;
    float           *lps;
    struct msv_row  *w = (struct msv_row *) t;

    if (t == NULL) {
        return NULL;
    }
    w->bytes = bytes;
    w->n_support = n;
    w->n_lps = n;
    w->mode = MSV_MASK_SUPPORT;
    ids = (int32_t *) (w + 1);
    lps = (float *) (ids + n);
    for (j = 0; j < n; j++) {
        ids[j] = (int32_t) j;
        lps[j] = -(float) j;
    }
    return t;
}


/* The per-row header fields that change, as the worker writes them. */
static void
row_stamp(uint8_t *dst, const uint8_t *tmpl, uint64_t seq, uint32_t idx,
    uint32_t slot)
{
    struct msv_row  *w = (struct msv_row *) dst;

    memcpy(dst, tmpl, ((const struct msv_row *) tmpl)->bytes);
    w->slot = slot;
    w->cookie = seq;
    w->pos = idx;
    w->token = (int32_t) (idx % VOCAB);
}


/* Check a row the reader holds privately; count it. */
static int
row_take(struct reader_state *st, uint64_t seq, const struct msv_row *c)
{
    uint32_t         n = st->n_support;
    const int32_t   *ids;
    const float     *lps;

    if (c->slot == SLOT_START) {
        st->counting = 1;
        st->r.t_start = msv_now_ns();
        return 0;
    }
    if (c->slot == SLOT_END) {
        st->r.t_end = msv_now_ns();
        st->end = 1;
        return 0;
    }

    ids = msv_row_ids(c);
    lps = msv_row_lps(c);
    if (c->bytes != msv_row_size(n, n, 0) || c->n_support != n
        || c->cookie != seq || c->pos != c->slot
        || ids[0] != 0 || ids[n - 1] != (int32_t) (n - 1)
        || lps[n - 1] != -(float) (n - 1))
    {
        st->r.bad++;
    }
    if (st->counting) {
        st->r.rows++;
        st->r.bytes += c->bytes;
    }
    return 0;
}


/* Ring rows live in shared memory: copy out first, as a server must. */
static int
ring_row(void *ud, uint64_t seq, const struct msv_row *w)
{
    struct reader_state  *st = ud;

    memcpy(st->copy, w, w->bytes);
    return row_take(st, seq, (const struct msv_row *) st->copy);
}


/* ------------------------------------------------------------------ */
/* Ring throughput                                                      */

static void
ring_reader(uint32_t n_support, int out)
{
    int                    ep;
    char                   err[256];
    long                   n;
    struct epoll_event     ev;
    struct reader_state    st;
    struct msv_attachment  a;

    alarm(120);
    memset(&st, 0, sizeof(st));
    st.n_support = n_support;
    st.copy = malloc(msv_row_size(VOCAB, VOCAB, MAX_LP));

    if (st.copy == NULL || msv_attach(&a, name, err, sizeof(err)) != 0) {
        fprintf(stderr, "ring reader: %s\n", err);
        _exit(1);
    }
    ep = epoll_create1(EPOLL_CLOEXEC);
    ev.events = EPOLLIN | EPOLLET;
    ev.data.u32 = 0;
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, a.wake_fd, &ev) != 0) {
        _exit(1);
    }

    while (!st.end) {
        n = msv_consume(&a.cons, ring_row, &st);
        if (n < 0) {
            fprintf(stderr, "ring reader: msv_consume failed\n");
            _exit(1);
        }
        if (n > 0 || msv_consumer_arm(&a.cons)) {
            continue;
        }
        if (epoll_wait(ep, &ev, 1, 1000) > 0) {
            msv_drain(a.wake_fd);
        }
    }

    if (write(out, &st.r, sizeof(st.r)) != sizeof(st.r)) {
        _exit(1);
    }
    msv_detach(&a);
    _exit(0);
}


/* One step of `batch` rows; slot == SLOT_START/END for a marker row. */
static int
ring_step(struct hw *w, const uint8_t *tmpl, uint64_t seq, uint32_t batch,
    uint32_t marker)
{
    uint8_t   *dst;
    uint32_t   i, bytes = ((const struct msv_row *) tmpl)->bytes;

    msv_ring_begin(&w->p, seq);
    for (i = 0; i < batch; i++) {
        dst = msv_ring_reserve(&w->p, bytes);
        if (dst == NULL) {
            return -1;
        }
        row_stamp(dst, tmpl, seq, i, marker ? marker : i);
        msv_ring_commit(&w->p, bytes, 1);
    }
    msv_ring_end(&w->p);
    return 0;
}


static int
run_ring(const struct opts *o, uint32_t n_support, struct result *r)
{
    int                fd[2], rc;
    pid_t              pid;
    uint8_t           *tmpl;
    uint64_t           seq, t0, warm;
    struct hw          w;
    struct msv_layout  lay;

    memset(&lay, 0, sizeof(lay));
    lay.n_slots = 256;
    lay.n_readers = 4;
    lay.vocab_size = VOCAB;
    lay.max_model_len = 4096;
    lay.max_logprobs = MAX_LP;
    lay.ring_bytes = o->ring_bytes;
    lay.model = "bench";
    lay.backend = "cpu";

    tmpl = row_template(n_support);
    if (tmpl == NULL || pipe(fd) != 0 || hw_start(&w, name, &lay) != 0) {
        return -1;
    }

    pid = fork();
    if (pid == 0) {
        close(fd[0]);
        ring_reader(n_support, fd[1]);
    }
    close(fd[1]);
    if (hw_await_readers(&w, 1) != 0) {
        return -1;
    }

    /* warm up: go round the ring twice so every page is mapped */
    seq = 0;
    warm = 2 * o->ring_bytes;
    while (atomic_load(&w.rg.ctrl->head) < warm) {
        ring_step(&w, tmpl, ++seq, o->batch, 0);
    }

    rc = ring_step(&w, tmpl, ++seq, 1, SLOT_START);
    t0 = msv_now_ns();
    while (rc == 0 && msv_now_ns() - t0 < (uint64_t) (o->seconds * 1e9)) {
        rc = ring_step(&w, tmpl, ++seq, o->batch, 0);
    }
    if (rc == 0) {
        rc = ring_step(&w, tmpl, ++seq, 1, SLOT_END);
    }

    if (read(fd[0], r, sizeof(*r)) != sizeof(*r)) {
        rc = -1;
    }
    if (hx_wait_child(pid) != 0) {
        rc = -1;
    }
    close(fd[0]);
    hw_close(&w);
    msv_region_unlink(name);
    free(tmpl);
    return rc;
}


/* ------------------------------------------------------------------ */
/* Socket throughput (the same rows, the same checks)                   */

static void
sock_reader(uint32_t n_support, int s, int out)
{
    size_t               have, off, cap = 32u << 20;
    ssize_t              n;
    uint8_t             *buf;
    const struct msv_row *w;
    struct reader_state  st;

    alarm(120);
    memset(&st, 0, sizeof(st));
    st.n_support = n_support;
    buf = malloc(cap);
    if (buf == NULL) {
        _exit(1);
    }

    have = 0;
    while (!st.end) {
        n = read(s, buf + have, cap - have);
        if (n <= 0) {
            _exit(1);
        }
        have += (size_t) n;

        /* rows complete in the buffer; the rest waits for more */
        off = 0;
        while (have - off >= sizeof(struct msv_row)) {
            w = (const struct msv_row *) (buf + off);
            if (w->bytes > have - off) {
                break;
            }
            /* read() already copied it out: check in place */
            row_take(&st, w->cookie, w);
            off += w->bytes;
        }
        memmove(buf, buf + off, have - off);
        have -= off;
    }

    if (write(out, &st.r, sizeof(st.r)) != sizeof(st.r)) {
        _exit(1);
    }
    _exit(0);
}


static int
sock_step(int s, uint8_t *batch_buf, const uint8_t *tmpl, uint64_t seq,
    uint32_t batch, uint32_t marker)
{
    size_t    len, done;
    ssize_t   n;
    uint32_t  i, bytes = ((const struct msv_row *) tmpl)->bytes;

    for (i = 0; i < batch; i++) {
        row_stamp(batch_buf + (size_t) i * bytes, tmpl, seq, i,
                  marker ? marker : i);
    }
    len = (size_t) batch * bytes;
    for (done = 0; done < len; done += (size_t) n) {
        n = write(s, batch_buf + done, len - done);
        if (n < 0) {
            return -1;
        }
    }
    return 0;
}


static int
run_sock(const struct opts *o, uint32_t n_support, struct result *r)
{
    int       sv[2], fd[2], rc;
    pid_t     pid;
    uint8_t  *tmpl, *buf;
    uint64_t  seq, t0, sent, warm;

    tmpl = row_template(n_support);
    buf = malloc((size_t) o->batch * msv_row_size(n_support, n_support, 0));
    if (tmpl == NULL || buf == NULL
        || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0
        || pipe(fd) != 0)
    {
        return -1;
    }

    pid = fork();
    if (pid == 0) {
        close(sv[0]);
        close(fd[0]);
        sock_reader(n_support, sv[1], fd[1]);
    }
    close(sv[1]);
    close(fd[1]);

    seq = 0;
    sent = 0;
    warm = 2 * o->ring_bytes;
    while (sent < warm) {
        sock_step(sv[0], buf, tmpl, ++seq, o->batch, 0);
        sent += (uint64_t) o->batch * msv_row_size(n_support, n_support, 0);
    }

    rc = sock_step(sv[0], buf, tmpl, ++seq, 1, SLOT_START);
    t0 = msv_now_ns();
    while (rc == 0 && msv_now_ns() - t0 < (uint64_t) (o->seconds * 1e9)) {
        rc = sock_step(sv[0], buf, tmpl, ++seq, o->batch, 0);
    }
    if (rc == 0) {
        rc = sock_step(sv[0], buf, tmpl, ++seq, 1, SLOT_END);
    }

    if (read(fd[0], r, sizeof(*r)) != sizeof(*r)) {
        rc = -1;
    }
    if (hx_wait_child(pid) != 0) {
        rc = -1;
    }
    close(sv[0]);
    close(fd[0]);
    free(tmpl);
    free(buf);
    return rc;
}


/*
 * The copy ceiling: what the reader does (copy each row out of a buffer
 * as large as the ring into a row-sized one), in one process, no IPC.
 */
static double
run_memcpy(const struct opts *o, uint32_t n_support)
{
    size_t    row = msv_row_size(n_support, n_support, 0);
    size_t    span = o->ring_bytes, at;
    uint32_t  i;
    uint8_t  *src, *dst;
    uint64_t  t0, moved, sum;
    double    gbs;

    src = malloc(span);
    dst = malloc(row);
    if (src == NULL || dst == NULL) {
        return 0;
    }
    memset(src, 1, span);

    moved = 0;
    sum = 0;
    at = 0;
    t0 = msv_now_ns();
    while (msv_now_ns() - t0 < (uint64_t) (o->seconds * 1e9)) {
        for (i = 0; i < o->batch; i++) {
            if (at + row > span) {
                at = 0;
            }
            memcpy(dst, src + at, row);
            sum += dst[row - 1];    /* every copy is used */
            at += row;
        }
        moved += (uint64_t) o->batch * row;
    }
    gbs = moved / ((msv_now_ns() - t0) / 1e9) / 1e9;
    if (sum != moved / row) {
        gbs = 0;
    }
    free(src);
    free(dst);
    return gbs;
}


/* ------------------------------------------------------------------ */
/* Wakeup latency                                                       */

static int
cmp_u64(const void *a, const void *b)
{
    uint64_t  x = *(const uint64_t *) a, y = *(const uint64_t *) b;

    return x < y ? -1 : x > y;
}


static void
percentiles(uint64_t *lat, uint32_t n, struct result *r)
{
    qsort(lat, n, sizeof(uint64_t), cmp_u64);
    r->p50_us = lat[n / 2] / 1e3;
    r->p99_us = lat[(uint64_t) n * 99 / 100] / 1e3;
}


struct wake_row {
    uint64_t  t_pub;
    int       got;
};

static int
wake_row(void *ud, uint64_t seq, const struct msv_row *w)
{
    struct wake_row  *k = ud;

    k->t_pub = w->cookie;
    k->got = 1;
    return 0;
}


static void
wake_reader(uint32_t rounds, int out)
{
    int                    ep;
    char                   err[256];
    uint32_t               i;
    uint64_t              *lat;
    struct result          r;
    struct wake_row        k;
    struct epoll_event     ev;
    struct msv_attachment  a;

    alarm(120);
    lat = calloc(rounds, sizeof(uint64_t));
    if (lat == NULL || msv_attach(&a, name, err, sizeof(err)) != 0) {
        fprintf(stderr, "wake reader: %s\n", err);
        _exit(1);
    }
    ep = epoll_create1(EPOLL_CLOEXEC);
    ev.events = EPOLLIN | EPOLLET;
    ev.data.u32 = 0;
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, a.wake_fd, &ev) != 0) {
        _exit(1);
    }

    memset(&r, 0, sizeof(r));
    for (i = 0; i < rounds; i++) {
        memset(&k, 0, sizeof(k));
        while (!k.got) {
            if (msv_consume(&a.cons, wake_row, &k) < 0) {
                _exit(1);
            }
            if (k.got || msv_consumer_arm(&a.cons)) {
                continue;
            }
            if (epoll_wait(ep, &ev, 1, 1000) > 0) {
                msv_drain(a.wake_fd);
            }
        }
        lat[i] = msv_now_ns() - k.t_pub;
        msv_kick(a.kick_fd);        /* ack: the producer goes on */
    }

    percentiles(lat, rounds, &r);
    r.rows = rounds;
    if (write(out, &r, sizeof(r)) != sizeof(r)) {
        _exit(1);
    }
    msv_detach(&a);
    _exit(0);
}


/* Block until the reader's ack arrives on the kick eventfd. */
static void
await_ack(int kick)
{
    struct pollfd  pf = { kick, POLLIN, 0 };

    while (poll(&pf, 1, 1000) == 0) {
        /* the reader is slow: keep waiting (its alarm bounds this) */
    }
    msv_drain(kick);
}


static int
run_wake(const struct opts *o, struct result *r)
{
    int                 fd[2], rc;
    pid_t               pid;
    uint8_t            *dst;
    uint32_t            i, bytes = msv_row_size(0, 0, 0);
    struct hw           w;
    struct timespec     ts = { 0, 50000 };
    struct msv_layout   lay;
    struct msv_reader  *e;

    memset(&lay, 0, sizeof(lay));
    lay.n_slots = 8;
    lay.n_readers = 2;
    lay.vocab_size = VOCAB;
    lay.max_model_len = 64;
    lay.max_logprobs = MAX_LP;
    lay.ring_bytes = 4u << 20;
    lay.model = "bench";
    lay.backend = "cpu";

    if (pipe(fd) != 0 || hw_start(&w, name, &lay) != 0) {
        return -1;
    }
    pid = fork();
    if (pid == 0) {
        close(fd[0]);
        wake_reader(o->rounds, fd[1]);
    }
    close(fd[1]);
    if (hw_await_readers(&w, 1) != 0) {
        return -1;
    }
    e = msv_reader_at(w.rg.ctrl, 0);

    rc = 0;
    for (i = 0; i < o->rounds && rc == 0; i++) {
        /* publish only once the reader is asleep, so it must be woken */
        while (atomic_load(&e->armed) == 0) {
            sched_yield();
        }
        nanosleep(&ts, NULL);

        msv_ring_begin(&w.p, i + 1);
        dst = msv_ring_reserve(&w.p, bytes);
        if (dst == NULL) {
            rc = -1;
            break;
        }
        memset(dst, 0, bytes);
        ((struct msv_row *) dst)->bytes = bytes;
        ((struct msv_row *) dst)->cookie = msv_now_ns();
        msv_ring_commit(&w.p, bytes, 1);
        msv_ring_end(&w.p);

        await_ack(w.kick_fd);
    }

    if (read(fd[0], r, sizeof(*r)) != sizeof(*r)) {
        rc = -1;
    }
    if (hx_wait_child(pid) != 0) {
        rc = -1;
    }
    close(fd[0]);
    hw_close(&w);
    msv_region_unlink(name);
    return rc;
}


/* The same ping-pong with bare eventfds: the kernel's part alone. */
static int
run_eventfd(const struct opts *o, struct result *r)
{
    int                 go, ack, fd[2], ep;
    pid_t               pid;
    uint32_t            i;
    uint64_t           *lat, *t_pub;
    struct timespec     ts = { 0, 50000 };
    struct epoll_event  ev;

    go = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ack = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    t_pub = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (go < 0 || ack < 0 || t_pub == MAP_FAILED || pipe(fd) != 0) {
        return -1;
    }

    pid = fork();
    if (pid == 0) {
        struct result  res;

        alarm(120);
        close(fd[0]);
        lat = calloc(o->rounds, sizeof(uint64_t));
        ep = epoll_create1(EPOLL_CLOEXEC);
        ev.events = EPOLLIN | EPOLLET;
        ev.data.u32 = 0;
        if (lat == NULL || ep < 0
            || epoll_ctl(ep, EPOLL_CTL_ADD, go, &ev) != 0)
        {
            _exit(1);
        }
        for (i = 0; i < o->rounds; i++) {
            __atomic_store_n(&t_pub[1], 1, __ATOMIC_SEQ_CST);   /* asleep */
            while (msv_drain(go) == 0) {
                epoll_wait(ep, &ev, 1, 1000);
            }
            lat[i] = msv_now_ns() - __atomic_load_n(&t_pub[0],
                                                    __ATOMIC_ACQUIRE);
            msv_kick(ack);
        }
        memset(&res, 0, sizeof(res));
        percentiles(lat, o->rounds, &res);
        res.rows = o->rounds;
        _exit(write(fd[1], &res, sizeof(res)) == sizeof(res) ? 0 : 1);
    }
    close(fd[1]);

    for (i = 0; i < o->rounds; i++) {
        while (__atomic_exchange_n(&t_pub[1], 0, __ATOMIC_SEQ_CST) == 0) {
            sched_yield();
        }
        nanosleep(&ts, NULL);
        __atomic_store_n(&t_pub[0], msv_now_ns(), __ATOMIC_RELEASE);
        msv_kick(go);
        await_ack(ack);
    }

    i = read(fd[0], r, sizeof(*r)) == sizeof(*r) && hx_wait_child(pid) == 0;
    close(fd[0]);
    close(go);
    close(ack);
    munmap(t_pub, 4096);
    return i ? 0 : -1;
}


/* ------------------------------------------------------------------ */

static int
cmp_d(const void *a, const void *b)
{
    double  x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : x > y;
}


static double
median(double *v, uint32_t n)
{
    qsort(v, n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}


static void
machine(void)
{
    char            line[256];
    FILE           *f;
    struct utsname  u;

    if (uname(&u) == 0) {
        printf("# machine: %s %s, %ld cpus online\n", u.sysname, u.machine,
               sysconf(_SC_NPROCESSORS_ONLN));
    }
    f = fopen("/proc/cpuinfo", "r");
    if (f != NULL) {
        while (fgets(line, sizeof(line), f) != NULL) {
            if (strncmp(line, "model name", 10) == 0) {
                printf("# cpu: %s", strchr(line, ':') + 2);
                break;
            }
        }
        fclose(f);
    }
    f = fopen("/proc/loadavg", "r");
    if (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        printf("# load average at start: %s", line);
    }
    if (f != NULL) {
        fclose(f);
    }
}


static int
parse_count(const char *opt, const char *arg, unsigned long max,
    unsigned long *out)
{
    char  *end;

    errno = 0;
    *out = strtoul(arg, &end, 10);
    if (errno != 0 || *end != '\0' || *out == 0 || *out > max) {
        fprintf(stderr, "ring_bench: --%s %s: want an integer in 1..%lu\n",
                opt, arg, max);
        return -1;
    }
    return 0;
}


static int
parse(int argc, char **argv, struct opts *o)
{
    int                   c;
    char                 *end;
    unsigned long         v;
    static struct option  lo[] = {
        { "ring-bytes", required_argument, NULL, 'r' },
        { "batch", required_argument, NULL, 'b' },
        { "seconds", required_argument, NULL, 's' },
        { "rounds", required_argument, NULL, 'n' },
        { "repeat", required_argument, NULL, 'k' },
        { NULL, 0, NULL, 0 }
    };

    o->ring_bytes = 64u << 20;
    o->batch = 256;
    o->seconds = 1.0;
    o->rounds = 20000;
    o->repeat = 3;

    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'r':
            if (parse_count("ring-bytes", optarg, 1ul << 34, &v) != 0) {
                return -1;
            }
            o->ring_bytes = v;  /* msv_region_create checks the rest */
            break;
        case 'b':
            if (parse_count("batch", optarg, 4096, &v) != 0) {
                return -1;
            }
            o->batch = (uint32_t) v;
            break;
        case 'n':
            if (parse_count("rounds", optarg, 10000000, &v) != 0) {
                return -1;
            }
            o->rounds = (uint32_t) v;
            break;
        case 'k':
            if (parse_count("repeat", optarg, 99, &v) != 0) {
                return -1;
            }
            o->repeat = (uint32_t) v;
            break;
        case 's':
            o->seconds = strtod(optarg, &end);
            if (*end != '\0' || !(o->seconds > 0 && o->seconds <= 60)) {
                fprintf(stderr, "ring_bench: --seconds %s: want (0, 60]\n",
                        optarg);
                return -1;
            }
            break;
        default:
            return -1;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "ring_bench: unexpected argument %s\n", argv[optind]);
        return -1;
    }
    return 0;
}


int
main(int argc, char **argv)
{
    uint32_t       s, k;
    double         ring_r[99], ring_g[99], sock_r[99], sock_g[99], cp[99];
    double         ratio[99];
    double         rp50[99], rp99[99], ep50[99], ep99[99];
    double         row[N_SIZES][6], wake[4];
    struct opts    o;
    struct result  r;

    memset(&r, 0, sizeof(r));
    if (parse(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: ring_bench [--ring-bytes N] [--batch N] "
                "[--seconds S] [--rounds N] [--repeat N]\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    snprintf(name, sizeof(name), "msvb-%d", (int) getpid());

    machine();
    printf("# ring %llu bytes, %u rows per step, %.1f s per run, %u wake "
           "rounds, median of %u\n", (unsigned long long) o.ring_bytes,
           o.batch, o.seconds, o.rounds, o.repeat);
    fflush(stdout);

    for (s = 0; s < N_SIZES; s++) {
        for (k = 0; k < o.repeat; k++) {
            if (run_ring(&o, sizes[s], &r) != 0 || r.bad || r.rows == 0) {
                fprintf(stderr, "ring_bench: ring run failed (%llu bad "
                        "rows)\n", (unsigned long long) r.bad);
                return 1;
            }
            ring_r[k] = r.rows / ((r.t_end - r.t_start) / 1e9);
            ring_g[k] = r.bytes / ((r.t_end - r.t_start) / 1e9) / 1e9;

            if (run_sock(&o, sizes[s], &r) != 0 || r.bad || r.rows == 0) {
                fprintf(stderr, "ring_bench: socket run failed\n");
                return 1;
            }
            sock_r[k] = r.rows / ((r.t_end - r.t_start) / 1e9);
            sock_g[k] = r.bytes / ((r.t_end - r.t_start) / 1e9) / 1e9;

            ratio[k] = ring_r[k] / sock_r[k];   /* this run's pair */
            cp[k] = run_memcpy(&o, sizes[s]);
            printf("# %5u ids run %u: ring %.3g rows/s %.2f GB/s | socket "
                   "%.3g rows/s %.2f GB/s | memcpy %.2f GB/s\n", sizes[s],
                   k + 1, ring_r[k], ring_g[k], sock_r[k], sock_g[k], cp[k]);
            fflush(stdout);
        }
        row[s][0] = median(ring_r, o.repeat);
        row[s][1] = median(ring_g, o.repeat);
        row[s][2] = median(sock_r, o.repeat);
        row[s][3] = median(sock_g, o.repeat);
        row[s][4] = median(cp, o.repeat);
        row[s][5] = median(ratio, o.repeat);
    }

    for (k = 0; k < o.repeat; k++) {
        if (run_wake(&o, &r) != 0) {
            fprintf(stderr, "ring_bench: wake run failed\n");
            return 1;
        }
        rp50[k] = r.p50_us;
        rp99[k] = r.p99_us;
        if (run_eventfd(&o, &r) != 0) {
            fprintf(stderr, "ring_bench: eventfd run failed\n");
            return 1;
        }
        ep50[k] = r.p50_us;
        ep99[k] = r.p99_us;
        printf("# wake run %u: ring p50 %.1f us p99 %.1f us | eventfd p50 "
               "%.1f us p99 %.1f us\n", k + 1, rp50[k], rp99[k], ep50[k],
               ep99[k]);
        fflush(stdout);
    }
    wake[0] = median(rp50, o.repeat);
    wake[1] = median(rp99, o.repeat);
    wake[2] = median(ep50, o.repeat);
    wake[3] = median(ep99, o.repeat);

    printf("\n| support ids | row bytes | ring rows/s | ring GB/s "
           "| socket rows/s | socket GB/s | ring / socket | memcpy GB/s |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (s = 0; s < N_SIZES; s++) {
        printf("| %u | %u | %.3g | %.2f | %.3g | %.2f | %.2fx | %.2f |\n",
               sizes[s], msv_row_size(sizes[s], sizes[s], 0), row[s][0],
               row[s][1], row[s][2], row[s][3], row[s][5], row[s][4]);
    }
    printf("\n| wakeup (%u round trips) | median us | p99 us |\n", o.rounds);
    printf("|---|---:|---:|\n");
    printf("| ring: publish, eventfd, epoll_wait, row read | %.1f | %.1f |\n",
           wake[0], wake[1]);
    printf("| bare eventfd ping-pong, no ring | %.1f | %.1f |\n", wake[2],
           wake[3]);
    return 0;
}
