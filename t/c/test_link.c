/*
 * test_link.c: the unix-socket link.  A worker stand-in runs in a child
 * process (driven by one-byte commands on a pipe); this process is the
 * reader: the attach handshake with fd passing, kicks and wakeups through
 * the eventfds, refusals with clear messages, and every way the reader
 * learns that its worker is gone.
 */

#include <signal.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "tap.h"
#include "shm_harness.h"


#define VOCAB   4096
#define MAXLP   8

static int   cmd_w = -1, ans_r = -1;
static char  name[64];


static void
layout(struct msv_layout *lay, uint32_t n_readers)
{
    memset(lay, 0, sizeof(*lay));
    lay->n_slots = 4;
    lay->n_readers = n_readers;
    lay->vocab_size = VOCAB;
    lay->max_model_len = 16;
    lay->max_logprobs = MAXLP;
    lay->ring_bytes = 1u << 20;
    lay->model = "m";
    lay->backend = "cpu";
}


/* The worker process: serve hellos, obey commands. */
static void
worker(const struct msv_layout *lay, int cmd, int ans)
{
    char           c, arg;
    uint64_t       seq = 0, n, kicks = 0;
    struct hw      w;
    struct pollfd  pf;

    alarm(60);
    if (hw_start(&w, name, lay) != 0) {
        _exit(2);
    }
    if (write(ans, "R", 1) != 1) {
        _exit(3);
    }

    for ( ;; ) {
        hw_service(&w);
        pf.fd = cmd;
        pf.events = POLLIN;
        if (poll(&pf, 1, 1) <= 0) {
            continue;
        }
        if (read(cmd, &c, 1) != 1) {
            _exit(4);           /* the test went away */
        }
        switch (c) {
        case 'p':               /* publish one step */
            hx_produce(&w.p, ++seq, VOCAB, MAXLP);
            break;
        case 'k':               /* how many kicks arrived since */
            hw_service(&w);
            n = w.ipc.kicks - kicks;
            kicks = w.ipc.kicks;
            if (write(ans, &n, sizeof(n)) != sizeof(n)) {
                _exit(5);
            }
            continue;
        case 'c':               /* drop every connection, as in a crash */
            hw_close(&w);
            if (hw_start(&w, name, lay) != 0) {
                _exit(6);
            }
            kicks = 0;
            break;
        case 'e':               /* evict reader entry `arg` */
            if (read(cmd, &arg, 1) != 1) {
                _exit(7);
            }
            hw_evict(&w, (uint32_t) arg);
            break;
        case 'h':
            w.no_beat = 1;
            break;
        case 'b':
            w.no_beat = 0;
            break;
        case 'x':
            hw_close(&w);
            msv_region_unlink(name);
            _exit(0);
        }
        if (write(ans, &c, 1) != 1) {
            _exit(8);
        }
    }
}


static pid_t
worker_start(uint32_t n_readers)
{
    int                cp[2], ap[2];
    char               c;
    pid_t              pid;
    struct msv_layout  lay;

    layout(&lay, n_readers);
    if (pipe(cp) != 0 || pipe(ap) != 0) {
        return -1;
    }
    pid = fork();
    if (pid == 0) {
        close(cp[1]);
        close(ap[0]);
        worker(&lay, cp[0], ap[1]);
    }
    close(cp[0]);
    close(ap[1]);
    cmd_w = cp[1];
    ans_r = ap[0];
    if (read(ans_r, &c, 1) != 1 || c != 'R') {
        return -1;
    }
    return pid;
}


/* Send a command, wait for its echo. */
static int
cmd(char c)
{
    char  back;

    if (write(cmd_w, &c, 1) != 1 || read(ans_r, &back, 1) != 1) {
        return -1;
    }
    return back == c ? 0 : -1;
}


static uint64_t
kicks_seen(void)
{
    char      c = 'k';
    uint64_t  n = 0;

    if (write(cmd_w, &c, 1) != 1 || read(ans_r, &n, sizeof(n)) != sizeof(n)) {
        return UINT64_MAX;
    }
    return n;
}


static int
worker_stop(pid_t pid)
{
    char  c = 'x';

    if (write(cmd_w, &c, 1) != 1) {
        return -1;
    }
    close(cmd_w);
    close(ans_r);
    return hx_wait_child(pid);
}


static int
flags_ok(int fd, int want_nonblock)
{
    int  fl = fcntl(fd, F_GETFL), fdfl = fcntl(fd, F_GETFD);

    return fl >= 0 && fdfl >= 0 && (fdfl & FD_CLOEXEC)
           && (!want_nonblock || (fl & O_NONBLOCK));
}


/* Wait up to ms for fd to be readable (or hung up). */
static int
readable(int fd, int ms)
{
    struct pollfd  pf = { fd, POLLIN, 0 };

    return poll(&pf, 1, ms) == 1;
}


/* ------------------------------------------------------------------ */

/*
 * The attach in two steps, as nginx does it: the hello goes out at once,
 * the welcome is taken when it comes, and a reader that gives up on a
 * stopped worker leaves nothing behind that blocks a later attach.
 */
static void
test_two_steps(void)
{
    int                    rc, tries;
    char                   err[256];
    pid_t                  pid;
    struct msv_attachment  a;

    pid = worker_start(4);
    if (!tap_ok(pid > 0, "two steps: worker started")) {
        return;
    }

    kill(pid, SIGSTOP);
    rc = msv_attach_start(&a, name, err, sizeof(err));
    tap_ok(rc == 0 && a.conn_fd >= 0, "start sends the hello while the "
           "worker is stopped (%s)", rc ? err : "ok");
    tap_ok(rc == 0 && msv_attach_finish(&a, err, sizeof(err)) == 1,
           "finish: no welcome yet, and no wait");

    kill(pid, SIGCONT);
    rc = readable(a.conn_fd, 2000)
         ? msv_attach_finish(&a, err, sizeof(err)) : 1;
    tap_ok(rc == 0 && flags_ok(a.conn_fd, 1) && a.kick_fd >= 0,
           "finish once the welcome is there: attached (%s)",
           rc ? err : "ok");
    if (rc == 0) {
        tap_ok(msv_consumer_arm(&a.cons) == 0 && cmd('p') == 0
               && readable(a.wake_fd, 2000),
               "rows published after a two-step attach wake the reader");
        msv_detach(&a);
    }

    /* give up on a stopped worker, then attach again once it runs */
    kill(pid, SIGSTOP);
    rc = msv_attach_start(&a, name, err, sizeof(err));
    tap_ok(rc == 0 && msv_attach_finish(&a, err, sizeof(err)) == 1,
           "second hello to a stopped worker: pending");
    msv_detach(&a);
    kill(pid, SIGCONT);

    for (tries = 0; tries < 5; tries++) {
        if (msv_attach(&a, name, err, sizeof(err)) == 0) {
            break;
        }
        usleep(100 * 1000);
    }
    tap_ok(tries < 5, "after giving up once, a new attach succeeds "
           "(%d refused first)", tries);
    if (tries < 5) {
        msv_detach(&a);
    }

    tap_ok(worker_stop(pid) == 0, "two steps: worker exits");
}


/* ------------------------------------------------------------------ */

static void
test_handshake_and_wake(void)
{
    int                    ep, n;
    char                   err[256];
    long                   rows;
    pid_t                  pid;
    uint64_t               t0, hb;
    struct msv_ctrl       *c;
    struct hx_cursor       cur;
    struct epoll_event     ev;
    struct msv_attachment  a;

    pid = worker_start(4);
    if (!tap_ok(pid > 0, "worker started")) {
        return;
    }

    if (!tap_ok(msv_attach(&a, name, err, sizeof(err)) == 0,
                "attach: handshake through %s", "the socket"))
    {
        tap_diag("%s", err);
        worker_stop(pid);
        return;
    }
    c = a.rg.ctrl;
    tap_ok(a.generation == c->generation && a.pid == getpid()
           && a.reader < c->n_readers,
           "attach: generation %016llx, reader entry %u",
           (unsigned long long) a.generation, a.reader);
    tap_ok(atomic_load(&msv_reader_at(c, a.reader)->state)
           == MSV_STATE_WORD(getpid(), MSV_READER_ATTACHED)
           && a.cons.tail == atomic_load(&c->head)
           && atomic_load(&msv_reader_at(c, a.reader)->tail) == a.cons.tail,
           "attach: the worker marked the entry ATTACHED at head %llu",
           (unsigned long long) a.cons.tail);
    tap_ok(a.kick_fd >= 0 && flags_ok(a.kick_fd, 0)
           && flags_ok(a.wake_fd, 1) && flags_ok(a.conn_fd, 1),
           "attach: worker's eventfd received; fds close-on-exec and "
           "nonblocking");
    tap_ok(msv_attachment_check(&a) == 0, "check: attachment healthy");

    /* kick: the worker's submission eventfd, passed over the socket */
    msv_kick(a.kick_fd);
    msv_kick(a.kick_fd);
    tap_ok(kicks_seen() == 2, "kick: the worker counted 2 kicks");

    /* wake: arm, sleep in epoll, the publish wakes us */
    memset(&cur, 0, sizeof(cur));
    cur.seq = 1;
    cur.last_seq = 1000;
    cur.vocab = VOCAB;
    cur.max_lp = MAXLP;

    ep = epoll_create1(EPOLL_CLOEXEC);
    ev.events = EPOLLIN | EPOLLET;
    ev.data.u32 = 1;
    if (!tap_ok(ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, a.wake_fd, &ev) == 0,
                "wake: epoll set up"))
    {
        msv_detach(&a);
        worker_stop(pid);
        return;
    }

    tap_ok(msv_consume(&a.cons, hx_on_row, &cur) == 0
           && msv_consumer_arm(&a.cons) == 0,
           "wake: nothing to read, armed");
    t0 = msv_now_ns();
    if (write(cmd_w, "p", 1) != 1) {
        tap_ok(0, "wake: command");
    }
    n = epoll_wait(ep, &ev, 1, 5000);
    t0 = msv_now_ns() - t0;
    tap_ok(n == 1 && msv_drain(a.wake_fd) >= 1,
           "wake: epoll_wait woke on the eventfd (%.0f us after the "
           "command)", t0 / 1e3);
    rows = msv_consume(&a.cons, hx_on_row, &cur);
    tap_ok(rows == (long) hx_rows_in(1) && cur.seq == 2 && !cur.bad,
           "wake: step 1's %ld rows read and verified", rows);
    tap_ok(atomic_load(&msv_reader_at(c, a.reader)->armed) == 0,
           "wake: the producer disarmed us when it woke us");
    if (read(ans_r, err, 1) != 1) {
        tap_ok(0, "wake: echo");
    }

    /* not armed: the producer does not write the eventfd */
    cmd('p');
    tap_ok(!readable(a.wake_fd, 50), "wake: not armed -> no eventfd write");

    /* rows already there when arming: arm says so and disarms */
    tap_ok(msv_consumer_arm(&a.cons) == 1
           && atomic_load(&msv_reader_at(c, a.reader)->armed) == 0,
           "arm: records pending -> 1, stays unarmed");
    rows = msv_consume(&a.cons, hx_on_row, &cur);
    tap_ok(rows == (long) hx_rows_in(2) && cur.seq == 3 && !cur.bad,
           "arm: step 2 read");
    close(ep);

    /* heartbeat */
    atomic_store(&msv_reader_at(c, a.reader)->heartbeat_ns, 1);
    msv_reader_heartbeat(&a);
    hb = atomic_load(&msv_reader_at(c, a.reader)->heartbeat_ns);
    tap_ok(hb > 1 && msv_now_ns() - hb < 1000000000ULL,
           "heartbeat: entry updated");

    /* a hung worker: its heartbeat stops */
    cmd('h');
    atomic_store(&c->heartbeat_ns, msv_now_ns() - 4000000000ULL);
    tap_ok(msv_attachment_check(&a) == 0, "check: worker heartbeat 4 s old, "
           "default limit %.0f s -> 0 (late, not given up)",
           (double) MSV_HEARTBEAT_STALE_NS / 1e9);
    a.stall_ns = 3000000000ULL;
    tap_ok(msv_attachment_check(&a) == -1
           && strstr(a.lost, "no heartbeat from the worker") != NULL
           && strstr(a.lost, "for 4.0 s") != NULL,
           "check: heartbeat 4 s old, limit 3 s -> -1, says \"%s\"", a.lost);
    a.stall_ns = 0;
    atomic_store(&c->heartbeat_ns, msv_now_ns() - MSV_HEARTBEAT_STALE_NS
                                   - 1000000000ULL);
    tap_ok(msv_attachment_check(&a) == -1, "check: worker heartbeat past the "
           "default limit -> -1");
    {
        struct msv_attachment  b;

        tap_ok(msv_attach(&b, name, err, sizeof(err)) == -1
               && strstr(err, "heartbeat") != NULL,
               "attach refused: \"%s\"", err);
    }
    cmd('b');
    cmd('p');           /* a service round refreshes the heartbeat */
    tap_ok(msv_attachment_check(&a) == 0, "check: heartbeat back -> 0");

    /* the worker evicts us */
    if (write(cmd_w, "e", 1) != 1 || write(cmd_w, &a.reader, 1) != 1
        || read(ans_r, err, 1) != 1)
    {
        tap_ok(0, "evict: command");
    }
    tap_ok(msv_attachment_check(&a) == -1 && msv_consume(&a.cons, NULL, NULL)
           == -1, "evicted: check -> -1, consume -> -1");
    msv_detach(&a);

    /* a fresh attach works; then the worker drops its connections */
    tap_ok(msv_attach(&a, name, err, sizeof(err)) == 0, "re-attach");
    cmd('c');
    readable(a.conn_fd, 1000);
    tap_ok(msv_attachment_check(&a) == -1,
           "check: worker closed the connection (and recreated the "
           "region) -> -1");
    msv_detach(&a);
    msv_detach(&a);     /* twice is harmless */

    tap_ok(worker_stop(pid) == 0, "worker stopped cleanly");
}


/* Connect by hand and send hello h with fd (or none): the welcome's
 * status, or 1 when the worker just closed the connection. */
static int
raw_hello(const char *path, const struct msv_hello *h, int fd)
{
    int                  s, rc;
    ssize_t              n;
    struct iovec         iov;
    struct msghdr        msg;
    struct cmsghdr      *cm;
    struct msv_welcome   w;
    struct sockaddr_un   sa;
    union {
        struct cmsghdr   align;
        char             buf[CMSG_SPACE(sizeof(int))];
    } cb;

    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    if (connect(s, (struct sockaddr *) &sa, sizeof(sa)) != 0) {
        close(s);
        return -100;
    }

    iov.iov_base = (void *) h;
    iov.iov_len = sizeof(*h);
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (fd >= 0) {
        memset(&cb, 0, sizeof(cb));
        msg.msg_control = cb.buf;
        msg.msg_controllen = sizeof(cb.buf);
        cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    }
    if (sendmsg(s, &msg, MSG_NOSIGNAL) != (ssize_t) sizeof(*h)) {
        close(s);
        return -101;
    }

    readable(s, 3000);
    n = recv(s, &w, sizeof(w), MSG_DONTWAIT);
    rc = n == 0 || (n < 0 && errno == ECONNRESET) ? 1
         : n == (ssize_t) sizeof(w) && w.magic == MSV_WELCOME_MAGIC
         ? w.status : -102;
    close(s);
    return rc;
}


static void
test_refusals(void)
{
    int                    evfd, ok;
    char                   err[256];
    pid_t                  pid, dead;
    uint64_t               word;
    struct msv_ctrl       *c;
    struct msv_region      rg;
    struct msv_hello       h;
    struct msv_reader     *e;
    struct msv_attachment  a, b, d;

    tap_ok(msv_attach(&a, "msvt-no-such-region", err, sizeof(err)) == -1
           && strstr(err, "no worker serves this name") != NULL,
           "attach refused: \"%s\"", err);

    pid = worker_start(2);
    if (!tap_ok(pid > 0, "worker with 2 reader entries")) {
        return;
    }
    if (msv_region_open(&rg, name, err, sizeof(err)) != 0) {
        tap_ok(0, "open: %s", err);
        return;
    }
    c = rg.ctrl;

    atomic_store(&c->state, MSV_WORKER_STARTING);
    tap_ok(msv_attach(&a, name, err, sizeof(err)) == -1
           && strstr(err, "starting, not ready") != NULL,
           "attach refused: \"%s\"", err);
    atomic_store(&c->state, MSV_WORKER_DRAINING);
    tap_ok(msv_attach(&a, name, err, sizeof(err)) == -1
           && strstr(err, "draining") != NULL,
           "attach refused: \"%s\"", err);
    atomic_store(&c->state, MSV_WORKER_READY);

    /* hand-made hellos: the worker side's checks */
    evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!tap_ok(evfd >= 0, "an eventfd to pass")) {
        return;
    }
    e = msv_reader_at(c, 0);
    word = 0;
    atomic_compare_exchange_strong(&e->state, &word,
                                   MSV_STATE_WORD(getpid(),
                                                  MSV_READER_CLAIMED));
    memset(&h, 0, sizeof(h));
    h.magic = MSV_HELLO_MAGIC;
    h.reader = 0;
    h.generation = c->generation ^ 1;
    h.pid = getpid();
    fprintf(stderr, "# expected: msv_accept_hello complaints below\n");
    tap_ok(raw_hello(c->sock_path, &h, evfd) == -ESTALE,
           "hello for another generation -> welcome status -ESTALE");
    h.generation = c->generation;
    h.reader = 1;
    tap_ok(raw_hello(c->sock_path, &h, evfd) == -EPERM,
           "hello for an entry we did not claim -> -EPERM");
    h.reader = 7;
    tap_ok(raw_hello(c->sock_path, &h, evfd) == -EINVAL,
           "hello for an entry out of range -> -EINVAL");
    h.reader = 0;
    h.pid = getpid() + 1;
    tap_ok(raw_hello(c->sock_path, &h, evfd) == 1,
           "hello whose pid is not the peer's -> connection dropped");
    h.pid = getpid();
    tap_ok(raw_hello(c->sock_path, &h, -1) == 1,
           "hello without an eventfd -> connection dropped");
    h.magic = 0x12345678;
    tap_ok(raw_hello(c->sock_path, &h, evfd) == 1,
           "hello with a bad magic -> connection dropped");
    atomic_store(&e->state, 0);
    close(evfd);

    /* the table: two entries */
    ok = msv_attach(&a, name, err, sizeof(err)) == 0
         && msv_attach(&b, name, err, sizeof(err)) == 0;
    tap_ok(ok && a.reader != b.reader, "two attachments in entries %u and %u",
           a.reader, b.reader);
    tap_ok(msv_attach(&d, name, err, sizeof(err)) == -1
           && strstr(err, "reader entries are taken") != NULL,
           "attach refused: \"%s\"", err);

    /* an entry whose owner died is reclaimed by the next attach */
    dead = fork();
    if (dead == 0) {
        _exit(0);
    }
    hx_wait_child(dead);
    msv_detach(&b);
    atomic_store(&msv_reader_at(c, 1)->state,
                 MSV_STATE_WORD(dead, MSV_READER_CLAIMED));
    tap_ok(msv_attach(&d, name, err, sizeof(err)) == 0 && d.reader == 1,
           "attach reclaims the entry of dead pid %d (entry %u)",
           (int) dead, d.reader);
    msv_detach(&d);
    tap_ok(atomic_load(&msv_reader_at(c, 1)->state) == 0,
           "detach frees the entry");

    /* a worker pid that is gone */
    c->worker_pid = dead;
    tap_ok(msv_attachment_check(&a) == -1, "check: worker pid gone -> -1");
    tap_ok(msv_attach(&d, name, err, sizeof(err)) == -1
           && strstr(err, "stale region") != NULL,
           "attach refused: \"%s\"", err);
    c->worker_pid = pid;
    tap_ok(msv_attachment_check(&a) == 0, "check: back -> 0");

    /* STOPPED */
    atomic_store(&c->state, MSV_WORKER_STOPPED);
    tap_ok(msv_attachment_check(&a) == -1, "check: worker STOPPED -> -1");
    atomic_store(&c->state, MSV_WORKER_READY);

    msv_detach(&a);
    msv_region_unmap(&rg);
    tap_ok(worker_stop(pid) == 0, "worker stopped cleanly");

    /* the worker is gone and so is its region */
    tap_ok(msv_attach(&a, name, err, sizeof(err)) == -1,
           "attach after the worker left: \"%s\"", err);
}


static void
test_listen(void)
{
    int          fd;
    char         err[256], path[200];
    struct stat  st;

    snprintf(path, sizeof(path), "/dev/shm/msvt-%d-l.sock", (int) getpid());
    fd = msv_listen(path, err, sizeof(err));
    tap_ok(fd >= 0 && stat(path, &st) == 0 && S_ISSOCK(st.st_mode)
           && (st.st_mode & 0777) == 0600 && flags_ok(fd, 1),
           "listen: socket file mode 0600, fd nonblocking, close-on-exec");
    close(fd);
    fd = msv_listen(path, err, sizeof(err));
    tap_ok(fd >= 0, "listen: a stale socket file is replaced");
    close(fd);
    unlink(path);

    memset(path, 'a', sizeof(path));
    path[0] = '/';
    path[sizeof(path) - 1] = '\0';
    tap_ok(msv_listen(path, err, sizeof(err)) == -1
           && strstr(err, "longer than") != NULL,
           "listen refused: \"%.60s...\"", err);
}


int
main(void)
{
    signal(SIGPIPE, SIG_IGN);
    alarm(60);
    hx_name(name, sizeof(name), "link");

    test_handshake_and_wake();
    test_refusals();
    test_listen();
    test_two_steps();
    return tap_done();
}
