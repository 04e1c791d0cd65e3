/*
 * packed_bench.c: where nginx's CPU goes when it writes support masks,
 * packed (mask_format "packed") and as JSON, stage by stage, on one core.
 *
 *   make B=build build/bench/packed_bench
 *   build/bench/packed_bench [seconds [repeats]]
 *
 * A response is 512 ring rows of L support ids (L = 1000 and 8192),
 * ascending over a 151,936-token vocabulary, with their float32 logprobs
 * (log-softmax of normal logits, sd 2.5), laid out as the ring holds them
 * (struct msv_row, then the ids, then the logprobs).  Stages, each timed
 * over the whole response:
 *
 *   copy        memcpy of the rows' ids and logprobs: the memory floor
 *   b64         msv_b64_put alone, from the rows into one flat buffer per
 *               array (lengths, ids, logprobs), as the module feeds it;
 *               b64-portable the same without the vector path
 *   b64-clock   b64 with the clock read three times a row, as the
 *               module's formatting counters do
 *               (ngx_http_maskserve_output_tick)
 *   evict       a pass over 64 MB of other memory, which leaves neither
 *               the rows nor the output in the CPU's caches
 *   b64-cold    evict, then b64: rows and output come from memory, as in
 *               nginx when the worker wrote the rows on another core and
 *               the output buffers were last touched many bodies ago
 *               (subtract evict for the encoding's share)
 *   b64-around, b64-cold-around
 *               b64 and b64-cold with the text written around the cache
 *               (msv_b64_init), as the module writes a non-streaming body
 *   b64-fresh   b64 into pages just mapped: every output page faults in,
 *               as a body's buffers do when malloc takes them anew from
 *               the kernel (the unmapping included)
 *   json        msv_json_ids + msv_json_f32s alone, into a flat buffer
 *   module-*    the module's own writer (ngx_http_maskserve_output.c,
 *               compiled unchanged): ngx_http_maskserve_output_row for
 *               every row, then output_compose of the body, in a fresh
 *               pool each time (16 KB body buffers, chain links); the
 *               pool is freed after the timing
 *   stream-*    the same writer streaming, one event per row (as when
 *               the client keeps up): output_row, output_compose of the
 *               event, its buffers recycled through the free list as
 *               ngx_http_maskserve_stream.c does once nginx sent them
 *   send-*      writev of the body's chain, 64 buffers per call as nginx's
 *               ngx_writev does, to a loopback TCP socket that a child
 *               process drains: the kernel's share (system time)
 *
 * Then the JSON writer's rates by row size (L = 20, 1000 and 8192), the
 * module's against the number writers' alone, in the same run:
 *
 *   alone       msv_json_ids and msv_json_f32s over about 64k items of
 *               rows into one buffer reused for every pass (what
 *               bench/json_bench measures: output and rows stay in cache)
 *   module      whole non-streaming bodies of 512 rows through the
 *               module's writer, its rates from its own counters
 *               (ngx_http_maskserve_output_take: the time it measures
 *               around each row's arrays, what GET /metrics reports), and
 *               the page faults the process took per MB of body; the
 *               body's memory is the memory of the bodies before it
 *   new memory  the same, one body in a child process each time: every
 *               page the body is written to is new to the process (never
 *               touched, or the parent's, copied on the first write), as
 *               in an nginx worker whose bodies outgrow what it kept of
 *               earlier ones
 *
 * The rows of each size are checked first as the stages' are (the
 * module's body and stream, and the writers' own arrays, parsed back).
 *
 * Times are the thread's CPU time (CLOCK_THREAD_CPUTIME_ID; send: the
 * thread's user + system time), so that other load on the machine counts
 * little; each figure is the median of `repeats` (default 5) measurements
 * of as many responses as fit in `seconds` (default 0.2).  Reported: ms
 * per response and ns per output byte (the stage's own output: base64
 * text, JSON text, the whole body or all events).  Before timing, every
 * body and every stream event the module writes is checked: the packed
 * strings are decoded and compared with the rows bit for bit, the JSON
 * arrays parsed and compared (ids exactly, logprobs as float32); a wrong
 * answer aborts the run.
 *
 * The module's sources are built here with the flags nginx's own build
 * gives them (tools/build-module.sh: -O2), through the nginx core
 * functions of fuzz/ngx_shim.c (pool allocations are malloc, as nginx's
 * for buffers larger than a page).
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>

#include "msv_shm.h"
#include "msv_json.h"
#include "msv_b64.h"
#include "ngx_http_maskserve_module.h"
#include "ngx_http_maskserve_output.h"
#include "ngx_shim.h"
#include "mix.h"
#include "loopback.h"
#include "thread_cpu.h"


#define VOCAB        151936
#define N_ROWS       512
#define MAX_REPEATS  64
#define SEND_IOVS    64             /* NGX_IOVS_PREALLOCATE */

static const uint32_t  row_sizes[] = { 1000, 8192 };
#define N_SIZES  (sizeof(row_sizes) / sizeof(row_sizes[0]))

typedef struct {
    uint32_t            len;
    u_char             *ring;       /* N_ROWS rows back to back */
    struct msv_row     *row[N_ROWS];
    size_t              data;       /* bytes of ids and logprobs */
    char               *flat;       /* output of the flat stages */
    size_t              flat_size;
    u_char             *scratch;    /* copy's destination */
} bench_rows_t;

#define EVICT_BYTES  (64u << 20)
static u_char   *evict_mem;

typedef struct {
    ngx_pool_t                     *pool;
    ngx_http_request_t              r;
    ngx_http_maskserve_loc_conf_t   lcf;
    ngx_http_maskserve_ctx_t        ctx;
    ngx_chain_t                    *out;
    off_t                           len;
} bench_resp_t;

typedef struct {
    const char   *name;
    size_t      (*run)(bench_rows_t *rs, int packed);
    int           packed;
} bench_stage_t;

static uint64_t  rng_state = 0x7061636b65646231ULL;
static int       send_fd = -1;


static uint64_t
rng_next(void)
{
    return msv_splitmix64(&rng_state);
}


static double
thread_rusage(void)
{
    struct rusage  u;

    getrusage(RUSAGE_THREAD, &u);
    return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6
           + u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6;
}


static void
rows_make(bench_rows_t *rs, uint32_t len)
{
    double           *x, m, sum;
    size_t            size, off;
    int32_t          *ids;
    float            *lps;
    uint32_t          i, k, id, gap;
    struct msv_row   *w;

    rs->len = len;
    size = msv_row_size(len, len, 0);
    rs->ring = aligned_alloc(64, (size_t) N_ROWS * size);
    rs->data = (size_t) N_ROWS * len * 8;
    rs->flat_size = msv_json_ids_max(len) + msv_json_f32s_max(len);
    rs->flat_size = rs->flat_size * N_ROWS + 4096;
    rs->flat = malloc(rs->flat_size);
    rs->scratch = malloc(rs->data);
    x = malloc(len * sizeof(double));

    if (rs->ring == NULL || rs->flat == NULL || rs->scratch == NULL
        || x == NULL)
    {
        fprintf(stderr, "packed_bench: out of memory\n");
        exit(1);
    }

    for (i = 0, off = 0; i < N_ROWS; i++, off += size) {
        w = (struct msv_row *) (rs->ring + off);
        memset(w, 0, sizeof(*w));
        w->bytes = (uint32_t) size;
        w->pos = i;
        w->n_support = len;
        w->n_lps = len;
        w->mode = MSV_MASK_SUPPORT;
        rs->row[i] = w;

        ids = (int32_t *) msv_row_ids(w);
        lps = (float *) msv_row_lps(w);

        /* ascending ids, gaps spread over the vocabulary */
        gap = VOCAB / len;
        id = (uint32_t) (rng_next() % gap);
        for (k = 0; k < len; k++) {
            ids[k] = (int32_t) id;
            id += 1 + (uint32_t) (rng_next() % (2 * gap - 1));
            if (id >= VOCAB - (len - k)) {
                id = ids[k] + 1;
            }
        }

        m = -INFINITY;
        for (k = 0; k < len; k++) {
            x[k] = 2.5 * msv_normal(&rng_state);
            m = x[k] > m ? x[k] : m;
        }
        sum = 0;
        for (k = 0; k < len; k++) {
            sum += exp(x[k] - m);
        }
        for (k = 0; k < len; k++) {
            lps[k] = (float) (x[k] - m - log(sum));
        }

        w->token = ids[rng_next() % len];
        w->logprob = lps[0];
    }

    free(x);
}


/* ------------------------------------------------------------------ */
/* flat stages                                                          */

static size_t
stage_copy(bench_rows_t *rs, int packed)
{
    u_char    *p;
    uint32_t   i;

    p = rs->scratch;
    for (i = 0; i < N_ROWS; i++) {
        memcpy(p, msv_row_ids(rs->row[i]), (size_t) rs->len * 8);
        p += (size_t) rs->len * 8;
    }

    return p - rs->scratch;
}


static volatile uint64_t  clock_sink;

/*
 * the three strings side by side from out; clocks: read as the module;
 * around: written around the cache, as the module writes a body
 */

static size_t
b64_rows(bench_rows_t *rs, char *out, int clocks, int around)
{
    char       *l, *d, *v, *l0, *d0, *v0;
    int32_t     n;
    uint32_t    i;
    uint64_t    t;
    msv_b64_t   sl, sd, sv;

    l0 = l = out;
    d0 = d = l0 + msv_b64_len(4 * N_ROWS) + 64;
    v0 = v = d0 + msv_b64_len(rs->data / 2) + 64;

    msv_b64_init(&sl, around);
    msv_b64_init(&sd, around);
    msv_b64_init(&sv, around);

    t = 0;

    for (i = 0; i < N_ROWS; i++) {
        n = (int32_t) rs->row[i]->n_support;
        if (clocks) {
            t += ngx_http_maskserve_output_tick();
        }
        l = msv_b64_put(&sl, l, &n, 4);
        d = msv_b64_put(&sd, d, msv_row_ids(rs->row[i]), 4 * (size_t) n);
        if (clocks) {
            t += ngx_http_maskserve_output_tick();
        }
        v = msv_b64_put(&sv, v, msv_row_lps(rs->row[i]), 4 * (size_t) n);
        if (clocks) {
            t += ngx_http_maskserve_output_tick();
        }
    }

    clock_sink += t;

    l = msv_b64_end(&sl, l);
    d = msv_b64_end(&sd, d);
    v = msv_b64_end(&sv, v);

    return (l - l0) + (d - d0) + (v - v0);
}


static size_t
stage_b64(bench_rows_t *rs, int packed)
{
    return b64_rows(rs, rs->flat, 0, 0);
}


static size_t
stage_b64_around(bench_rows_t *rs, int packed)
{
    return b64_rows(rs, rs->flat, 0, 1);
}


static size_t
stage_b64_clock(bench_rows_t *rs, int packed)
{
    return b64_rows(rs, rs->flat, 1, 0);
}


static size_t
stage_evict(bench_rows_t *rs, int packed)
{
    size_t     i;
    uint64_t  *m;

    /* read and write every line: the caches end up holding only this */
    m = (uint64_t *) evict_mem;
    for (i = 0; i < EVICT_BYTES / 8; i += 8) {
        m[i]++;
    }

    return EVICT_BYTES;
}


static size_t
stage_b64_cold(bench_rows_t *rs, int packed)
{
    (void) stage_evict(rs, packed);

    return b64_rows(rs, rs->flat, 0, 0);
}


static size_t
stage_b64_cold_around(bench_rows_t *rs, int packed)
{
    (void) stage_evict(rs, packed);

    return b64_rows(rs, rs->flat, 0, 1);
}


static size_t
stage_b64_fresh(bench_rows_t *rs, int packed)
{
    char    *out;
    size_t   n;

    out = mmap(NULL, rs->flat_size, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (out == MAP_FAILED) {
        perror("packed_bench: mmap");
        exit(1);
    }

    n = b64_rows(rs, out, 0, 0);

    munmap(out, rs->flat_size);

    return n;
}


/* The same through the portable code only (hosts without AVX2). */

static size_t
stage_b64_portable(bench_rows_t *rs, int packed)
{
    size_t  n;

    msv_b64_simd(0);
    n = stage_b64(rs, packed);
    msv_b64_simd(1);

    return n;
}


static size_t
stage_json(bench_rows_t *rs, int packed)
{
    char      *p;
    uint32_t   i;

    p = rs->flat;
    for (i = 0; i < N_ROWS; i++) {
        p = msv_json_ids(p, msv_row_ids(rs->row[i]), rs->len);
        *p++ = ',';
    }
    for (i = 0; i < N_ROWS; i++) {
        p = msv_json_f32s(p, msv_row_lps(rs->row[i]), rs->len);
        *p++ = ',';
    }

    return p - rs->flat;
}


/* ------------------------------------------------------------------ */
/* the module's writer                                                  */

static void
resp_init(bench_resp_t *rp, int packed, int stream)
{
    memset(rp, 0, sizeof(*rp));

    rp->pool = msv_shim_pool();
    rp->r.pool = rp->pool;
    rp->lcf.output_limit = (size_t) 1 << 40;

    rp->ctx.r = &rp->r;
    rp->ctx.lcf = &rp->lcf;
    ngx_str_set(&rp->ctx.id, "bench-0123456789abcdef");
    rp->ctx.mode = MSV_MASK_SUPPORT;
    rp->ctx.logprobs = -1;
    rp->ctx.packed = packed;
    rp->ctx.stream = stream;
    rp->ctx.n_choices = 1;

    if (ngx_http_maskserve_output_init(&rp->ctx) != NGX_OK) {
        fprintf(stderr, "packed_bench: output_init failed\n");
        exit(1);
    }
}


static void
resp_row(bench_resp_t *rp, const struct msv_row *w)
{
    if (ngx_http_maskserve_output_row(&rp->ctx, &rp->ctx.choices[0], w)
        != NGX_OK)
    {
        fprintf(stderr, "packed_bench: output_row: %.*s\n",
                (int) rp->ctx.err.message.len, rp->ctx.err.message.data);
        exit(1);
    }
}


static void
resp_compose(bench_resp_t *rp, int final)
{
    if (final) {
        rp->ctx.choices[0].done = 1;
        rp->ctx.choices[0].finish = MSV_FINISH_LENGTH;
    }

    rp->out = ngx_http_maskserve_output_compose(&rp->ctx, final, &rp->len);
    if (rp->out == NULL) {
        fprintf(stderr, "packed_bench: output_compose failed\n");
        exit(1);
    }
}


/*
 * The event was sent: its buffers are drained (as the write filter leaves
 * them) and recycled as ngx_http_maskserve_stream_send does.
 */

static void
resp_sent(bench_resp_t *rp)
{
    ngx_chain_t  *cl;

    for (cl = rp->out; cl; cl = cl->next) {
        cl->buf->pos = cl->buf->last;
    }

    ngx_chain_update_chains(rp->pool, &rp->ctx.free, &rp->ctx.busy,
                            &rp->out,
                            (ngx_buf_tag_t) &ngx_http_maskserve_module);
    ngx_http_maskserve_output_sent(&rp->ctx);
}


/* A non-streaming body of all the rows. */

static void
resp_write(bench_rows_t *rs, bench_resp_t *rp, int packed)
{
    uint32_t  i;

    resp_init(rp, packed, 0);

    for (i = 0; i < N_ROWS; i++) {
        resp_row(rp, rs->row[i]);
    }

    resp_compose(rp, 1);
}


static size_t
stage_module(bench_rows_t *rs, int packed)
{
    off_t         len;
    bench_resp_t  rp;

    resp_write(rs, &rp, packed);
    len = rp.len;
    msv_shim_pool_free(rp.pool);

    return (size_t) len;
}


/* A stream, one event per row, as when the client keeps up. */

static size_t
stage_stream(bench_rows_t *rs, int packed)
{
    size_t        bytes;
    uint32_t      i;
    bench_resp_t  rp;

    resp_init(&rp, packed, 1);

    for (i = 0, bytes = 0; i < N_ROWS; i++) {
        resp_row(&rp, rs->row[i]);
        resp_compose(&rp, i + 1 == N_ROWS);
        bytes += rp.len;
        resp_sent(&rp);
    }

    msv_shim_pool_free(rp.pool);

    return bytes;
}


/* The body, as one string (for the checks). */

static char *
resp_flatten(bench_resp_t *rp)
{
    char         *s, *p;
    ngx_chain_t  *cl;

    s = malloc((size_t) rp->len + 1);
    if (s == NULL) {
        fprintf(stderr, "packed_bench: out of memory\n");
        exit(1);
    }

    for (p = s, cl = rp->out; cl; cl = cl->next) {
        p = (char *) ngx_cpymem(p, cl->buf->pos, ngx_buf_size(cl->buf));
    }
    *p = '\0';

    return s;
}


/* The base64 string after "key":", decoded; NULL when absent or bad. */

static uint8_t *
body_b64(const char *body, const char *key, long *n)
{
    char        *q;
    uint8_t     *out;
    const char  *p, *e;

    q = malloc(strlen(key) + 8);
    sprintf(q, "\"%s\":\"", key);
    p = strstr(body, q);
    free(q);

    if (p == NULL) {
        return NULL;
    }

    p += strlen(key) + 4;
    e = strchr(p, '"');
    out = malloc((e - p) / 4 * 3 + 1);

    *n = msv_b64_decode(p, e - p, out);
    if (*n < 0) {
        free(out);
        return NULL;
    }

    return out;
}


static int
check_packed(bench_rows_t *rs, const char *body, uint32_t first,
    uint32_t n_rows)
{
    int       ok;
    long      nl, nd, nv;
    size_t    off;
    int32_t   len;
    uint8_t  *l, *d, *v;
    uint32_t  i;

    l = body_b64(body, "lengths", &nl);
    d = body_b64(body, "ids", &nd);
    v = body_b64(body, "logprobs", &nv);

    ok = l && d && v && strstr(body, "\"format\":\"csr-i32-f32-le-v1\"")
         && nl == 4 * (long) n_rows && nd == 4 * (long) n_rows * rs->len
         && nv == 4 * (long) n_rows * rs->len;

    for (i = 0, off = 0; ok && i < n_rows; i++) {
        memcpy(&len, l + 4 * i, 4);
        ok = len == (int32_t) rs->len
             && memcmp(d + off, msv_row_ids(rs->row[first + i]),
                       4 * rs->len) == 0
             && memcmp(v + off, msv_row_lps(rs->row[first + i]),
                       4 * rs->len) == 0;
        off += 4 * (size_t) rs->len;
    }

    free(l);
    free(d);
    free(v);

    return ok;
}


/* [[a,b,..],[..],..] against the rows: ids exactly, floats as float32 */

static int
check_json_array(bench_rows_t *rs, const char *body, const char *key,
    int f32, uint32_t first, uint32_t n_rows)
{
    char        *q, *end;
    float        f, want_f;
    long         id;
    uint32_t     i, k;
    const char  *p;

    q = malloc(strlen(key) + 8);
    sprintf(q, "\"%s\":[", key);
    p = strstr(body, q);
    free(q);

    if (p == NULL) {
        return 0;
    }

    p += strlen(key) + 4;

    for (i = first; i < first + n_rows; i++) {
        if (*p++ != '[') {
            return 0;
        }

        for (k = 0; k < rs->len; k++) {
            if (f32) {
                f = strtof(p, &end);
                want_f = msv_row_lps(rs->row[i])[k];
                if (end == p || memcmp(&f, &want_f, 4) != 0) {
                    return 0;
                }

            } else {
                id = strtol(p, &end, 10);
                if (end == p || id != msv_row_ids(rs->row[i])[k]) {
                    return 0;
                }
            }

            p = end;
            if (*p++ != (k + 1 < rs->len ? ',' : ']')) {
                return 0;
            }
        }

        if (*p++ != (i + 1 < first + n_rows ? ',' : ']')) {
            return 0;
        }
    }

    return 1;
}


static void
check_module(bench_rows_t *rs, int packed)
{
    int           ok;
    char         *body;
    uint32_t      i;
    bench_resp_t  rp;

    resp_write(rs, &rp, packed);
    body = resp_flatten(&rp);

    ok = packed ? check_packed(rs, body, 0, N_ROWS)
                : check_json_array(rs, body, "sampling_mask", 0, 0, N_ROWS)
                  && check_json_array(rs, body, "sampling_mask_logprobs", 1,
                                      0, N_ROWS);

    if (!ok) {
        fprintf(stderr, "packed_bench: L=%u: the module's %s body does not "
                "match the rows\n", rs->len, packed ? "packed" : "JSON");
        exit(1);
    }

    free(body);
    msv_shim_pool_free(rp.pool);

    /* a stream: every event "data: {...}\n\n" with exactly its row */
    resp_init(&rp, packed, 1);

    for (i = 0; i < N_ROWS; i++) {
        resp_row(&rp, rs->row[i]);
        resp_compose(&rp, i + 1 == N_ROWS);
        body = resp_flatten(&rp);

        ok = strncmp(body, "data: {", 7) == 0
             && strstr(body, "}\n\n") != NULL
             && (packed ? check_packed(rs, body, i, 1)
                 : check_json_array(rs, body, "sampling_mask", 0, i, 1)
                   && check_json_array(rs, body, "sampling_mask_logprobs",
                                       1, i, 1));

        if (!ok) {
            fprintf(stderr, "packed_bench: L=%u: event %u of the module's "
                    "%s stream does not match its row\n", rs->len, i,
                    packed ? "packed" : "JSON");
            exit(1);
        }

        free(body);
        resp_sent(&rp);
    }

    msv_shim_pool_free(rp.pool);
}


/* ------------------------------------------------------------------ */
/* sending                                                              */

static void
send_open(void)
{
    int                 ls, c;
    char               *b;
    struct sockaddr_in  a;

    ls = msv_loopback_listen(&a);
    if (ls < 0) {
        perror("packed_bench: loopback listener");
        exit(1);
    }

    if (fork() == 0) {
        c = socket(AF_INET, SOCK_STREAM, 0);
        b = malloc(1 << 20);
        if (c < 0 || b == NULL
            || connect(c, (struct sockaddr *) &a, sizeof(a)) != 0)
        {
            _exit(1);
        }
        while (read(c, b, 1 << 20) > 0) {
            /* drain */
        }
        _exit(0);
    }

    send_fd = accept(ls, NULL, NULL);
    if (send_fd < 0) {
        perror("packed_bench: accept");
        exit(1);
    }

    close(ls);
}


static void
send_chain(ngx_chain_t *cl)
{
    int           n;
    size_t        off, left;
    ssize_t       sent;
    struct iovec  iov[SEND_IOVS];

    off = 0;

    while (cl) {
        ngx_chain_t  *c;

        for (n = 0, c = cl; c && n < SEND_IOVS; c = c->next, n++) {
            iov[n].iov_base = c->buf->pos + (n ? 0 : off);
            iov[n].iov_len = ngx_buf_size(c->buf) - (n ? 0 : off);
        }

        sent = writev(send_fd, iov, n);
        if (sent < 0) {
            perror("packed_bench: writev");
            exit(1);
        }

        while (sent && cl) {
            left = ngx_buf_size(cl->buf) - off;
            if ((size_t) sent >= left) {
                sent -= left;
                cl = cl->next;
                off = 0;
            } else {
                off += sent;
                sent = 0;
            }
        }
    }
}


/* ------------------------------------------------------------------ */
/* timing                                                               */

static int
cmp_double(const void *a, const void *b)
{
    double  x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : x > y;
}


/* Median seconds per response and the stage's bytes per response. */

static double
time_stage(bench_rows_t *rs, const bench_stage_t *st, double seconds,
    int repeats, size_t *bytes)
{
    int     k;
    long    n;
    double  t0, t, s[MAX_REPEATS];

    *bytes = st->run(rs, st->packed);        /* warm-up */

    for (k = 0; k < repeats; k++) {
        n = 0;
        t0 = msv_thread_cpu();
        do {
            st->run(rs, st->packed);
            n++;
            t = msv_thread_cpu() - t0;
        } while (t < seconds);
        s[k] = t / n;
    }

    qsort(s, repeats, sizeof(double), cmp_double);
    return s[repeats / 2];
}


/* The kernel's share: only the writev calls are timed. */

static double
time_send(bench_rows_t *rs, int packed, double seconds, int repeats,
    size_t *bytes)
{
    int           k;
    long          n;
    double        t, s[MAX_REPEATS];
    bench_resp_t  rp;

    resp_write(rs, &rp, packed);
    *bytes = (size_t) rp.len;
    send_chain(rp.out);

    for (k = 0; k < repeats; k++) {
        n = 0;
        t = 0;
        do {
            double  t0 = thread_rusage();

            send_chain(rp.out);
            t += thread_rusage() - t0;
            n++;
        } while (t < seconds || n < 8);
        s[k] = t / n;
    }

    msv_shim_pool_free(rp.pool);

    qsort(s, repeats, sizeof(double), cmp_double);
    return s[repeats / 2];
}


/* ------------------------------------------------------------------ */
/* the JSON writer's rates, inside the module and alone                 */

static const uint32_t  rate_sizes[] = { 20, 1000, 8192 };
#define N_RATE_SIZES  (sizeof(rate_sizes) / sizeof(rate_sizes[0]))

typedef struct {
    double  ids;                    /* M/s */
    double  f32;
} bench_rate_t;


static int
cmp_rate_ids(const void *a, const void *b)
{
    return cmp_double(&((const bench_rate_t *) a)->ids,
                      &((const bench_rate_t *) b)->ids);
}


static int
cmp_rate_f32(const void *a, const void *b)
{
    return cmp_double(&((const bench_rate_t *) a)->f32,
                      &((const bench_rate_t *) b)->f32);
}


/* the medians of each rate over the repeats */

static bench_rate_t
rate_median(bench_rate_t *r, int repeats)
{
    bench_rate_t  m;

    qsort(r, repeats, sizeof(bench_rate_t), cmp_rate_ids);
    m.ids = r[repeats / 2].ids;
    qsort(r, repeats, sizeof(bench_rate_t), cmp_rate_f32);
    m.f32 = r[repeats / 2].f32;

    return m;
}


/* What the writers alone write for the first rows, parsed back. */

static void
check_alone(bench_rows_t *rs, uint32_t rows)
{
    int        f32;
    char      *p;
    uint32_t   i;

    for (f32 = 0; f32 < 2; f32++) {
        p = (char *) ngx_cpymem(rs->flat, "\"a\":[", 5);
        for (i = 0; i < rows; i++) {
            p = f32 ? msv_json_f32s(p, msv_row_lps(rs->row[i]), rs->len)
                    : msv_json_ids(p, msv_row_ids(rs->row[i]), rs->len);
            *p++ = ',';
        }
        p[-1] = ']';
        *p = '\0';

        if (!check_json_array(rs, rs->flat, "a", f32, 0, rows)) {
            fprintf(stderr, "packed_bench: L=%u: the %s written alone do "
                    "not match the rows\n", rs->len, f32 ? "logprobs" : "ids");
            exit(1);
        }
    }
}


/* The number writers alone: about 64k items a pass into a reused buffer. */

static bench_rate_t
rate_alone(bench_rows_t *rs, double seconds, int repeats)
{
    int            k, f32;
    char          *p;
    long           n;
    double         t0, t, rate;
    uint32_t       i, rows;
    bench_rate_t   r[MAX_REPEATS];

    rows = 65536 / rs->len;
    rows = rows < 1 ? 1 : rows > N_ROWS ? N_ROWS : rows;

    check_alone(rs, rows);

    for (k = 0; k < repeats; k++) {
        for (f32 = 0; f32 < 2; f32++) {
            n = 0;
            t0 = msv_thread_cpu();

            do {
                p = rs->flat;
                for (i = 0; i < rows; i++) {
                    p = f32 ? msv_json_f32s(p, msv_row_lps(rs->row[i]),
                                            rs->len)
                            : msv_json_ids(p, msv_row_ids(rs->row[i]),
                                           rs->len);
                    *p++ = ',';
                }
                n += rows;
                t = msv_thread_cpu() - t0;
            } while (t < seconds);

            rate = (double) n * rs->len / t * 1e-6;
            if (f32) {
                r[k].f32 = rate;
            } else {
                r[k].ids = rate;
            }
        }
    }

    return rate_median(r, repeats);
}


/*
 * The module's writer, whole bodies, rated by its own counters; *faults:
 * the minor page faults of the process per MB of body, over all repeats.
 */

static bench_rate_t
rate_module(bench_rows_t *rs, double seconds, int repeats, double *faults)
{
    int                              k;
    long                             n;
    double                           t0, bytes;
    struct rusage                    u0, u1;
    bench_rate_t                     r[MAX_REPEATS];
    bench_resp_t                     rp;
    ngx_http_maskserve_fmt_count_t   c[NGX_HTTP_MASKSERVE_FMT_N], sum;

    /* warm-up, and what earlier stages left in the counters */
    resp_write(rs, &rp, 0);
    msv_shim_pool_free(rp.pool);
    (void) ngx_http_maskserve_output_take(NULL);

    bytes = 0;
    getrusage(RUSAGE_SELF, &u0);

    for (k = 0; k < repeats; k++) {
        memset(&sum, 0, sizeof(sum));
        n = 0;
        t0 = msv_thread_cpu();

        do {
            resp_write(rs, &rp, 0);
            bytes += (double) rp.len;
            msv_shim_pool_free(rp.pool);

            if (!ngx_http_maskserve_output_take(c)) {
                fprintf(stderr, "packed_bench: the module counted "
                        "nothing\n");
                exit(1);
            }

            sum.ids += c[NGX_HTTP_MASKSERVE_FMT_JSON].ids;
            sum.floats += c[NGX_HTTP_MASKSERVE_FMT_JSON].floats;
            sum.ids_ns += c[NGX_HTTP_MASKSERVE_FMT_JSON].ids_ns;
            sum.floats_ns += c[NGX_HTTP_MASKSERVE_FMT_JSON].floats_ns;
            n++;
        } while (msv_thread_cpu() - t0 < seconds);

        if (sum.ids != (uint64_t) n * N_ROWS * rs->len
            || sum.floats != sum.ids || sum.ids_ns == 0
            || sum.floats_ns == 0)
        {
            fprintf(stderr, "packed_bench: L=%u: the module counted %llu "
                    "ids and %llu floats for %ld bodies\n", rs->len,
                    (unsigned long long) sum.ids,
                    (unsigned long long) sum.floats, n);
            exit(1);
        }

        r[k].ids = (double) sum.ids / (double) sum.ids_ns * 1e3;
        r[k].f32 = (double) sum.floats / (double) sum.floats_ns * 1e3;
    }

    getrusage(RUSAGE_SELF, &u1);
    *faults = (double) (u1.ru_minflt - u0.ru_minflt) / (bytes / 1e6);

    return rate_median(r, repeats);
}


/* One body in a child each time: the module's rates with new memory. */

static bench_rate_t
rate_module_new(bench_rows_t *rs, int repeats, double *faults)
{
    int                              k, fd[2], status;
    pid_t                            pid;
    double                           f[MAX_REPEATS];
    struct rusage                    u0, u1;
    bench_rate_t                     r[MAX_REPEATS];
    bench_resp_t                     rp;
    ngx_http_maskserve_fmt_count_t   c[NGX_HTTP_MASKSERVE_FMT_N];

    struct {
        bench_rate_t                 rate;
        double                       faults;
    } out;

    (void) ngx_http_maskserve_output_take(NULL);

    for (k = 0; k < repeats; k++) {
        if (pipe(fd) != 0) {
            perror("packed_bench: pipe");
            exit(1);
        }

        pid = fork();
        if (pid < 0) {
            perror("packed_bench: fork");
            exit(1);
        }

        if (pid == 0) {
            close(fd[0]);
            getrusage(RUSAGE_SELF, &u0);
            resp_write(rs, &rp, 0);
            getrusage(RUSAGE_SELF, &u1);

            if (!ngx_http_maskserve_output_take(c)
                || c[NGX_HTTP_MASKSERVE_FMT_JSON].ids
                   != (uint64_t) N_ROWS * rs->len
                || c[NGX_HTTP_MASKSERVE_FMT_JSON].ids_ns == 0
                || c[NGX_HTTP_MASKSERVE_FMT_JSON].floats_ns == 0)
            {
                _exit(1);
            }

            out.rate.ids = (double) c[NGX_HTTP_MASKSERVE_FMT_JSON].ids
                           / (double) c[NGX_HTTP_MASKSERVE_FMT_JSON].ids_ns
                           * 1e3;
            out.rate.f32 = (double) c[NGX_HTTP_MASKSERVE_FMT_JSON].floats
                           / (double) c[NGX_HTTP_MASKSERVE_FMT_JSON].floats_ns
                           * 1e3;
            out.faults = (double) (u1.ru_minflt - u0.ru_minflt)
                         / ((double) rp.len / 1e6);

            _exit(write(fd[1], &out, sizeof(out)) == sizeof(out) ? 0 : 1);
        }

        close(fd[1]);

        if (read(fd[0], &out, sizeof(out)) != sizeof(out)
            || waitpid(pid, &status, 0) != pid
            || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        {
            fprintf(stderr, "packed_bench: L=%u: the child writing a body "
                    "failed\n", rs->len);
            exit(1);
        }

        close(fd[0]);
        r[k] = out.rate;
        f[k] = out.faults;
    }

    qsort(f, repeats, sizeof(double), cmp_double);
    *faults = f[repeats / 2];

    return rate_median(r, repeats);
}


static void
rates_table(double seconds, int repeats)
{
    double         faults, faults_new;
    uint32_t       i;
    bench_rows_t   rs;
    bench_rate_t   alone, mod, mod_new;

    printf("\nThe JSON writer inside the module (its own counters) and "
           "alone (warm buffer), M items/s, median of %d x %.2f s\n\n",
           repeats, seconds);
    printf("| row L | ids alone | ids module | / alone | ids module, "
           "new memory | / alone | f32 alone | f32 module | / alone | "
           "f32 module, new memory | / alone | page faults per MB of body, "
           "module, new memory |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
           "---:|\n");

    for (i = 0; i < N_RATE_SIZES; i++) {
        rows_make(&rs, rate_sizes[i]);
        check_module(&rs, 0);

        /* side by side: the module's, then the writers alone */
        mod = rate_module(&rs, seconds, repeats, &faults);
        mod_new = rate_module_new(&rs, repeats, &faults_new);
        alone = rate_alone(&rs, seconds, repeats);

        printf("| %u | %.1f | %.1f | %.2f | %.1f | %.2f | %.1f | %.1f | "
               "%.2f | %.1f | %.2f | %.1f, %.1f |\n", rs.len, alone.ids,
               mod.ids, mod.ids / alone.ids, mod_new.ids,
               mod_new.ids / alone.ids, alone.f32, mod.f32,
               mod.f32 / alone.f32, mod_new.f32, mod_new.f32 / alone.f32,
               faults, faults_new);

        free(rs.ring);
        free(rs.flat);
        free(rs.scratch);
    }
}


static const bench_stage_t  stages[] = {
    { "copy", stage_copy, 0 },
    { "b64", stage_b64, 1 },
    { "json", stage_json, 0 },
    { "b64-portable", stage_b64_portable, 1 },
    { "b64-clock", stage_b64_clock, 1 },
    { "evict", stage_evict, 1 },
    { "b64-cold", stage_b64_cold, 1 },
    { "b64-around", stage_b64_around, 1 },
    { "b64-cold-around", stage_b64_cold_around, 1 },
    { "b64-fresh", stage_b64_fresh, 1 },
    { "module-packed", stage_module, 1 },
    { "module-json", stage_module, 0 },
    { "stream-packed", stage_stream, 1 },
    { "stream-json", stage_stream, 0 },
};
#define N_STAGES  (sizeof(stages) / sizeof(stages[0]))


static uint32_t
stage_index(const char *name)
{
    uint32_t  k;

    for (k = 0; k < N_STAGES; k++) {
        if (strcmp(stages[k].name, name) == 0) {
            return k;
        }
    }

    fprintf(stderr, "packed_bench: no stage \"%s\"\n", name);
    exit(1);
}


int
main(int argc, char **argv)
{
    int            repeats, p;
    uint32_t       mp, mj, sp, sj;
    size_t         bytes[N_SIZES][N_STAGES + 2];
    double         seconds, ms[N_SIZES][N_STAGES + 2];
    uint32_t       i, k;
    bench_rows_t   rs[N_SIZES];
    const char    *names[N_STAGES + 2];

    seconds = argc > 1 ? atof(argv[1]) : 0.2;
    repeats = argc > 2 ? atoi(argv[2]) : 5;
    if (seconds <= 0 || repeats < 1 || repeats > MAX_REPEATS) {
        fprintf(stderr, "usage: %s [seconds [repeats (1-%d)]]\n", argv[0],
                MAX_REPEATS);
        return 2;
    }

    send_open();

    evict_mem = malloc(EVICT_BYTES);
    if (evict_mem == NULL) {
        fprintf(stderr, "packed_bench: out of memory\n");
        return 1;
    }
    memset(evict_mem, 1, EVICT_BYTES);

    for (i = 0; i < N_SIZES; i++) {
        rows_make(&rs[i], row_sizes[i]);
        check_module(&rs[i], 1);
        check_module(&rs[i], 0);
        printf("L=%u: %u rows, the module's packed and JSON bodies match "
               "the rows\n", row_sizes[i], N_ROWS);
    }

    for (i = 0; i < N_SIZES; i++) {
        for (k = 0; k < N_STAGES; k++) {
            names[k] = stages[k].name;
            ms[i][k] = 1e3 * time_stage(&rs[i], &stages[k], seconds,
                                        repeats, &bytes[i][k]);
        }

        for (p = 1; p >= 0; p--) {
            names[N_STAGES + 1 - p] = p ? "send-packed" : "send-json";
            ms[i][N_STAGES + 1 - p] = 1e3 * time_send(&rs[i], p, seconds,
                                                 repeats,
                                                 &bytes[i][N_STAGES + 1 - p]);
        }
    }

    printf("\n%d rows per response, median of %d x %.2f s of thread CPU\n\n",
           N_ROWS, repeats, seconds);
    printf("| stage |");
    for (i = 0; i < N_SIZES; i++) {
        printf(" L=%u bytes | ms/resp | ns/byte |", row_sizes[i]);
    }
    printf("\n|---|");
    for (i = 0; i < N_SIZES; i++) {
        printf("---|---|---|");
    }
    printf("\n");

    for (k = 0; k < N_STAGES + 2; k++) {
        printf("| %s |", names[k]);
        for (i = 0; i < N_SIZES; i++) {
            printf(" %zu | %.3f | %.3f |", bytes[i][k], ms[i][k],
                   ms[i][k] * 1e6 / (double) bytes[i][k]);
        }
        printf("\n");
    }

    mp = stage_index("module-packed");
    mj = stage_index("module-json");
    sp = stage_index("stream-packed");
    sj = stage_index("stream-json");

    for (i = 0; i < N_SIZES; i++) {
        printf("\nL=%u: body (module + send), JSON / packed: %.2fx; "
               "stream (module), JSON / packed: %.2fx\n", row_sizes[i],
               (ms[i][mj] + ms[i][N_STAGES + 1])
               / (ms[i][mp] + ms[i][N_STAGES]), ms[i][sj] / ms[i][sp]);
    }

    rates_table(seconds, repeats);

    close(send_fd);
    wait(NULL);

    return 0;
}
