/*
 * e2e_load.c: end-to-end load client for POST /inference/v1/generate.
 *
 * Keeps N streaming (or non-streaming) requests in flight over HTTP/1.1
 * keep-alive connections (one request per connection at a time, epoll,
 * nonblocking sockets), for a fixed number of requests or seconds, and
 * measures requests/s, tokens/s, bytes/s, time to first event and total
 * latency (p50/p99).  The mask modes (off, selected, support), in JSON
 * or packed (mask_format "packed": selected-packed, support-packed), run
 * side by side in one invocation, interleaved over the repeats, at the
 * same load; the median over the repeats is reported in a table printed
 * last.
 *
 * Every response is validated; a fast wrong answer is not a result:
 *   - HTTP status 200 and the content type of the mode;
 *   - chunked transfer encoding decoded, SSE `data:` events split, each
 *     event's JSON parsed (yajl) and checked: one choice, token_ids
 *     integers, when masks were asked exactly one mask row and one
 *     logprob entry per token of the event, rows ascending and unique,
 *     the sampled token in its row, |row| <= top_k, support logprobs
 *     aligned with their row and logsumexp to 0, selected logprobs <= 0;
 *     packed masks are base64-decoded (strictly) and their lengths, ids
 *     and logprobs go through the same checks, none skipped;
 *   - the stream ends with `data: [DONE]`, the last event carries the
 *     finish_reason (and only the last) and usage; completion_tokens is
 *     the number of tokens received; with ignore_eos the number of
 *     tokens is max_tokens and the finish_reason is "length";
 *   - request i carries the same prompt and seed in every mode and every
 *     repeat: its token_ids must be identical each time (masks must not
 *     change what is sampled), and its mask ids identical in JSON and
 *     packed form of the same mode.
 * Any failure is counted, the first few are printed, and the exit status
 * is 1.
 *
 * The parts: this file is the HTTP/1.1 client (connections, chunked
 * decoding, SSE splitting), the load driver with its statistics and the
 * options; bench/e2e/check.c parses and checks each JSON document (also
 * tested alone, t/c/test_e2e_check.c); bench/e2e/array.c the growable
 * arrays both use.  t/50-client.t runs this client against a live stack.
 *
 *   e2e_load --port 8080 [-c 64] [-n 512 | -d 10] [--max-tokens 16]
 *            [--modes off,selected,support,selected-packed,support-packed]
 *            [--top-k 50] [--no-stream]
 *
 * Run with --help for every option.
 */

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <yajl/yajl_parse.h>

#include "array.h"
#include "check.h"


#define MSV_LOAD_MAX_CONC     4096
#define MSV_LOAD_MAX_REPEATS  64
#define MSV_LOAD_HDR_MAX      16384
#define MSV_LOAD_ERR_MAX      MSV_CHECK_ERR_MAX
#define MSV_LOAD_READ_BUF     (256 * 1024)
#define MSV_LOAD_MAX_WATCH    4
#define MSV_LOAD_WATCH_PIDS   32



/* server processes whose CPU time is sampled around every run */
typedef struct {
    const char  *label;
    int          n;
    pid_t        pid[MSV_LOAD_WATCH_PIDS];
} msv_watch_t;

typedef struct {
    const char  *host;
    const char  *port;
    long         conc;
    long         requests;          /* per run; 0: use duration */
    double       duration;          /* seconds per run */
    long         max_tokens;
    long         top_k;
    double       top_p;
    double       temperature;
    long         prompt_len;
    long         vocab;             /* prompt ids are drawn below this */
    int          stream;
    int          ignore_eos;
    long         repeats;
    long         warmup;            /* requests before the first run */
    double       timeout;           /* seconds per request */
    uint64_t     seed;
    long         print_errors;
    int          modes[MSV_N_MODES];
    int          n_modes;
    msv_watch_t  watch[MSV_LOAD_MAX_WATCH];
    int          n_watch;
} msv_load_opts_t;


/* ------------------------------------------------------------------ */
/* Connections                                                          */

typedef enum {
    MSV_C_CLOSED = 0,
    MSV_C_CONNECTING,
    MSV_C_WRITING,
    MSV_C_READING,
    MSV_C_IDLE
} msv_conn_state_t;

typedef enum {
    MSV_H_HEADERS = 0,
    MSV_H_BODY,
    MSV_H_DONE
} msv_http_state_t;

typedef enum {
    MSV_CH_SIZE = 0,
    MSV_CH_EXT,
    MSV_CH_DATA,
    MSV_CH_DATA_CR,
    MSV_CH_DATA_LF,
    MSV_CH_TRAILER,
    MSV_CH_TRAILER_LINE,
    MSV_CH_DONE
} msv_chunk_state_t;

typedef enum {
    MSV_SSE_START = 0,                  /* at the start of a line */
    MSV_SSE_FIELD,                      /* in the field name */
    MSV_SSE_SPACE,                      /* after "data:" */
    MSV_SSE_DATA,                       /* in a data line's value */
    MSV_SSE_SKIP                        /* in a line we ignore */
} msv_sse_state_t;

typedef struct {
    int                fd;
    msv_conn_state_t   state;
    int                reused;          /* served a request before */

    /* the request */
    long               idx;
    msv_bytes_t        req;
    size_t             req_off;
    double             t_start;
    double             t_first;         /* first event (or first byte) */

    /* the response */
    msv_http_state_t   http;
    msv_bytes_t        hdr;
    int                status;
    int                chunked;
    long long          clen;            /* -1: none */
    long long          got;             /* body bytes (content-length) */
    int                close_after;
    int                ctype_ok;
    msv_chunk_state_t  ch;
    unsigned long long ch_left;
    int                ch_digits;
    int                ch_line_len;
    long long          bytes;           /* on the wire, headers included */

    /* SSE, parsed as it arrives: the values of data lines go straight
     * into the JSON parser, events are never buffered whole */
    msv_sse_state_t    sse;
    int                field_n;
    char               field[8];        /* the line's field name so far */
    int                data_seen;       /* the event has a data line */
    int                data_kind;       /* 0: no byte yet, 1: JSON, 2: other */
    msv_bytes_t        data;            /* data that is not JSON ([DONE]) */

    /* JSON of the body (non-streaming) or of the current event */
    yajl_handle        yh;
    msv_doc_t          doc;
    msv_bytes_t        errbody;         /* non-200 bodies, for messages */

    /* accumulated over the events */
    long               n_events;
    long               n_tokens;
    long               n_rows;
    long long          n_mask_ids;
    int                final_seen;
    int                done_seen;
    char               finish[16];
    long               completion_tokens;
    long               prompt_tokens;
    uint64_t           hash;            /* FNV-1a of the token ids */
    uint64_t           mhash;           /* of the rows' lengths and ids */
    char               bad[MSV_LOAD_ERR_MAX];
} msv_conn_t;


/* ------------------------------------------------------------------ */
/* One run: a mode at a load                                            */

typedef struct {
    int          mode;
    long         issued;
    long         done;
    long         ok;
    long         failed;
    long         mismatches;        /* token_ids differ from another run */
    long long    tokens;            /* of the valid responses */
    long long    mask_ids;
    long long    bytes;
    long         events;
    double       t0;
    double       t_last;            /* the last completion */
    double       t_issue;           /* the last request issued */
    double       deadline;          /* duration mode */
    double       cpu;               /* client CPU seconds */
    double       wcpu[MSV_LOAD_MAX_WATCH];  /* watched processes' */
    msv_f64s_t   done_t;            /* completion times, all outcomes */
    msv_f64s_t   ok_t;              /* completion times, valid ones */
    msv_f64s_t   start_t;           /* per valid response: its start, */
    msv_f64s_t   ttfe;              /* time to first event, */
    msv_f64s_t   lat;               /* latency (seconds) */

    /* the summary (msv_run_summary) */
    int          steady;            /* a steady window was found */
    double       win;               /* its length */
    double       rps;
    double       tps;
    double       mbps;
    double       kb_resp;           /* bytes on the wire per response */
    double       ids_per_token;
    double       cpu_pct;
    double       cpu_ms;            /* client CPU per valid response */
    double       wcpu_ms[MSV_LOAD_MAX_WATCH];
    double       ttfe50, ttfe99, lat50, lat99;
} msv_run_t;


typedef struct {
    msv_load_opts_t   o;
    int               ep;
    struct addrinfo  *ai;
    msv_conn_t       *conns;
    msv_run_t        *run;
    char             *rbuf;
    long              errors_printed;
    uint64_t         *hashes;       /* per request index; 0: not yet */
    size_t            hashes_cap;
    uint64_t         *mhashes[2];   /* mask ids, selected and support */
    size_t            mhashes_cap[2];
    long long         total_failed;
    long long         total_mismatches;
} msv_load_t;


static double
msv_now(void)
{
    struct timespec  ts;

    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) {
        perror("e2e_load: clock_gettime");
        exit(1);
    }
    return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}


static double
msv_cpu_seconds(void)
{
    struct rusage  ru;

    if (getrusage(RUSAGE_SELF, &ru) != 0) {
        perror("e2e_load: getrusage");
        exit(1);
    }
    return (double) ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6
           + (double) ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}


/* CPU seconds (user + system, all threads) of a process; -1 if gone */

static double
msv_proc_cpu(pid_t pid)
{
    char                buf[1024], path[64], *p;
    int                 fd, field;
    ssize_t             n;
    unsigned long long  ut, st;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int) pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return -1;
    }
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) {
        return -1;
    }
    buf[n] = '\0';

    /* the command may hold spaces and parentheses: start after the last
     * ')'; the state is field 3, utime and stime fields 14 and 15 */
    p = strrchr(buf, ')');
    if (p == NULL) {
        return -1;
    }
    p++;
    for (field = 2; field < 13; field++) {
        p = strchr(p + 1, ' ');
        if (p == NULL) {
            return -1;
        }
    }
    if (sscanf(p, " %llu %llu", &ut, &st) != 2) {
        return -1;
    }
    return (double) (ut + st) / (double) sysconf(_SC_CLK_TCK);
}


/* the watched processes of one label together */

static double
msv_watch_cpu(const msv_watch_t *w)
{
    double  sum = 0, t;
    int     i;

    for (i = 0; i < w->n; i++) {
        t = msv_proc_cpu(w->pid[i]);
        if (t < 0) {
            fprintf(stderr, "e2e_load: --cpu %s: process %d is gone\n",
                    w->label, (int) w->pid[i]);
            return NAN;
        }
        sum += t;
    }
    return sum;
}


static uint64_t
msv_mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}


/* The body of request `idx`: the same prompt and seed in every mode. */

static void
msv_build_request(msv_load_t *L, msv_conn_t *c, int mode)
{
    const msv_load_opts_t  *o = &L->o;
    msv_bytes_t             body = { NULL, 0, 0 };
    char                    num[64], head[512];
    uint64_t                r;
    long                    i;
    int                     n;

    msv_bytes_add(&body, "{\"token_ids\":[", 14);
    r = msv_mix(o->seed ^ ((uint64_t) c->idx * 0x9e3779b97f4a7c15ULL));
    for (i = 0; i < o->prompt_len; i++) {
        r = msv_mix(r + (uint64_t) i + 1);
        n = snprintf(num, sizeof(num), "%s%ld", i ? "," : "",
                     (long) (1 + r % (uint64_t) (o->vocab - 1)));
        msv_bytes_add(&body, num, (size_t) n);
    }

    n = snprintf(head, sizeof(head),
                 "],\"sampling_params\":{\"max_tokens\":%ld,"
                 "\"temperature\":%.17g,\"top_k\":%ld,\"top_p\":%.17g,"
                 "\"ignore_eos\":%s,\"seed\":%llu},\"stream\":%s,"
                 "\"return_sampling_mask\":%s%s%s%s}",
                 o->max_tokens, o->temperature, o->top_k, o->top_p,
                 o->ignore_eos ? "true" : "false",
                 (unsigned long long) ((o->seed + (uint64_t) c->idx)
                                       & 0x7fffffffffffffffULL),
                 o->stream ? "true" : "false",
                 mode == MSV_MODE_OFF ? "false" : "true",
                 mode == MSV_MODE_OFF ? ""
                     : ",\"sampling_logprobs_mode\":",
                 mode == MSV_MODE_OFF ? ""
                     : msv_mask_of(mode) == MSV_MODE_SELECTED
                       ? "\"selected\"" : "\"support\"",
                 msv_packed_of(mode) ? ",\"mask_format\":\"packed\"" : "");
    msv_bytes_add(&body, head, (size_t) n);

    c->req.n = 0;
    n = snprintf(head, sizeof(head),
                 "POST /inference/v1/generate HTTP/1.1\r\n"
                 "Host: %s:%s\r\n"
                 "Content-Type: application/json\r\n"
                 "Accept: %s\r\n"
                 "Content-Length: %zu\r\n\r\n",
                 o->host, o->port,
                 o->stream ? "text/event-stream" : "application/json",
                 body.n);
    msv_bytes_add(&c->req, head, (size_t) n);
    msv_bytes_add(&c->req, body.p, body.n);
    free(body.p);
    c->req_off = 0;
}


static void
msv_conn_close(msv_load_t *L, msv_conn_t *c)
{
    if (c->fd >= 0) {
        if (epoll_ctl(L->ep, EPOLL_CTL_DEL, c->fd, NULL) != 0) {
            perror("e2e_load: epoll_ctl(DEL)");
        }
        close(c->fd);
    }
    c->fd = -1;
    c->state = MSV_C_CLOSED;
    c->reused = 0;
    if (c->yh) {
        yajl_free(c->yh);
        c->yh = NULL;
    }
}


static int
msv_conn_watch(msv_load_t *L, msv_conn_t *c, uint32_t events, int op)
{
    struct epoll_event  ev;

    memset(&ev, 0, sizeof(ev));
    ev.events = events;
    ev.data.ptr = c;
    if (epoll_ctl(L->ep, op, c->fd, &ev) != 0) {
        perror("e2e_load: epoll_ctl");
        return -1;
    }
    return 0;
}


static int
msv_conn_connect(msv_load_t *L, msv_conn_t *c)
{
    int  fd, one = 1;

    fd = socket(L->ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                0);
    if (fd < 0) {
        perror("e2e_load: socket");
        return -1;
    }
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
        perror("e2e_load: setsockopt(TCP_NODELAY)");
        close(fd);
        return -1;
    }
    if (connect(fd, L->ai->ai_addr, L->ai->ai_addrlen) != 0
        && errno != EINPROGRESS)
    {
        fprintf(stderr, "e2e_load: connect to %s:%s: %s\n", L->o.host,
                L->o.port, strerror(errno));
        close(fd);
        return -1;
    }
    c->fd = fd;
    c->state = MSV_C_CONNECTING;
    c->reused = 0;
    return msv_conn_watch(L, c, EPOLLOUT, EPOLL_CTL_ADD);
}


static void
msv_resp_reset(msv_conn_t *c)
{
    c->http = MSV_H_HEADERS;
    c->hdr.n = 0;
    c->status = 0;
    c->chunked = 0;
    c->clen = -1;
    c->got = 0;
    c->close_after = 0;
    c->ctype_ok = 0;
    c->ch = MSV_CH_SIZE;
    c->ch_left = 0;
    c->ch_digits = 0;
    c->ch_line_len = 0;
    c->bytes = 0;
    c->sse = MSV_SSE_START;
    c->field_n = 0;
    c->data.n = 0;
    c->data_seen = 0;
    c->data_kind = 0;
    c->errbody.n = 0;
    c->n_events = 0;
    c->n_tokens = 0;
    c->n_rows = 0;
    c->n_mask_ids = 0;
    c->final_seen = 0;
    c->done_seen = 0;
    c->finish[0] = '\0';
    c->completion_tokens = -1;
    c->prompt_tokens = -1;
    c->hash = 0xcbf29ce484222325ULL;
    c->mhash = 0xcbf29ce484222325ULL;
    c->bad[0] = '\0';
    c->t_first = 0;
    if (c->yh) {
        yajl_free(c->yh);
        c->yh = NULL;
    }
}


/* Is there another request to issue in this run? */

static int
msv_run_more(msv_load_t *L)
{
    msv_run_t  *run = L->run;

    if (L->o.requests > 0) {
        return run->issued < L->o.requests;
    }
    return msv_now() < run->deadline;
}


static int
msv_conn_start(msv_load_t *L, msv_conn_t *c)
{
    msv_run_t  *run = L->run;

    c->idx = run->issued++;
    msv_build_request(L, c, run->mode);
    msv_resp_reset(c);
    c->t_start = msv_now();
    run->t_issue = c->t_start;

    if (c->state == MSV_C_CLOSED) {
        return msv_conn_connect(L, c);
    }
    c->state = MSV_C_WRITING;
    return msv_conn_watch(L, c, EPOLLOUT, EPOLL_CTL_MOD);
}


static void
msv_fail(msv_load_t *L, msv_conn_t *c, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void
msv_fail(msv_load_t *L, msv_conn_t *c, const char *fmt, ...)
{
    va_list  ap;

    if (c->bad[0] != '\0') {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(c->bad, sizeof(c->bad), fmt, ap);
    va_end(ap);
}


/* The response is over (or failed): account for it and go on. */

static void
msv_conn_finish(msv_load_t *L, msv_conn_t *c, int broken)
{
    msv_run_t  *run = L->run;
    double      now = msv_now();
    size_t      need;

    run->done++;
    run->t_last = now;
    msv_f64s_push(&run->done_t, now);

    if (c->bad[0] == '\0' && !broken) {
        /* the end of the response: checks over the whole of it */
        if (c->status != 200) {
            msv_fail(L, c, "HTTP %d: %.200s", c->status,
                     c->errbody.n ? c->errbody.p : "");
        } else if (!c->ctype_ok) {
            msv_fail(L, c, "wrong Content-Type for %s",
                     L->o.stream ? "a stream" : "a JSON body");
        } else if (L->o.stream && !c->done_seen) {
            msv_fail(L, c, "the stream did not end with data: [DONE]");
        } else if (!c->final_seen) {
            msv_fail(L, c, "no event carried a finish_reason");
        } else if (c->completion_tokens != c->n_tokens) {
            msv_fail(L, c, "usage.completion_tokens %ld, tokens received "
                     "%ld", c->completion_tokens, c->n_tokens);
        } else if (c->prompt_tokens != L->o.prompt_len) {
            msv_fail(L, c, "usage.prompt_tokens %ld, prompt of %ld",
                     c->prompt_tokens, L->o.prompt_len);
        } else if (L->o.ignore_eos && c->n_tokens != L->o.max_tokens) {
            msv_fail(L, c, "%ld tokens with ignore_eos, max_tokens %ld",
                     c->n_tokens, L->o.max_tokens);
        } else if (strcmp(c->finish, "length") != 0
                   && strcmp(c->finish, "stop") != 0)
        {
            msv_fail(L, c, "finish_reason \"%s\"", c->finish);
        } else if (L->o.ignore_eos && strcmp(c->finish, "length") != 0) {
            msv_fail(L, c, "finish_reason \"%s\" with ignore_eos, expected "
                     "\"length\"", c->finish);
        } else if (c->n_tokens > L->o.max_tokens) {
            msv_fail(L, c, "%ld tokens, max_tokens %ld", c->n_tokens,
                     L->o.max_tokens);
        } else if (run->mode != MSV_MODE_OFF && c->n_rows != c->n_tokens) {
            msv_fail(L, c, "%ld mask rows for %ld tokens", c->n_rows,
                     c->n_tokens);
        }
    }

    if (c->bad[0] == '\0' && !broken) {
        run->ok++;
        run->tokens += c->n_tokens;
        run->mask_ids += c->n_mask_ids;
        run->events += c->n_events;
        run->bytes += c->bytes;
        msv_f64s_push(&run->ok_t, now);
        msv_f64s_push(&run->start_t, c->t_start);
        msv_f64s_push(&run->ttfe, c->t_first - c->t_start);
        msv_f64s_push(&run->lat, now - c->t_start);

        /* the same request gives the same tokens in every mode and run */
        need = (size_t) c->idx + 1;
        if (need > L->hashes_cap) {
            size_t  old = L->hashes_cap;

            L->hashes = msv_grow(L->hashes, &L->hashes_cap, need,
                                 sizeof(uint64_t));
            memset(L->hashes + old, 0,
                   (L->hashes_cap - old) * sizeof(uint64_t));
        }
        c->hash |= 1;               /* never 0 */
        c->mhash |= 1;

        /* the same mask in JSON and packed form */
        if (msv_mask_of(run->mode) != MSV_MODE_OFF) {
            int        k = msv_mask_of(run->mode) - MSV_MODE_SELECTED;
            uint64_t  *mh;

            if (need > L->mhashes_cap[k]) {
                size_t  old = L->mhashes_cap[k];

                L->mhashes[k] = msv_grow(L->mhashes[k], &L->mhashes_cap[k],
                                         need, sizeof(uint64_t));
                memset(L->mhashes[k] + old, 0,
                       (L->mhashes_cap[k] - old) * sizeof(uint64_t));
            }
            mh = &L->mhashes[k][c->idx];
            if (*mh == 0) {
                *mh = c->mhash;
            } else if (*mh != c->mhash) {
                run->mismatches++;
                L->total_mismatches++;
                if (L->errors_printed++ < L->o.print_errors) {
                    fprintf(stderr, "e2e_load: request %ld (mask %s): mask "
                            "rows differ from an earlier run of the same "
                            "request\n", c->idx, msv_mode_names[run->mode]);
                }
            }
        }

        if (L->hashes[c->idx] == 0) {
            L->hashes[c->idx] = c->hash;
        } else if (L->hashes[c->idx] != c->hash) {
            run->mismatches++;
            L->total_mismatches++;
            if (L->errors_printed++ < L->o.print_errors) {
                fprintf(stderr, "e2e_load: request %ld (mask %s): token_ids "
                        "differ from an earlier run of the same request\n",
                        c->idx, msv_mode_names[run->mode]);
            }
        }

    } else {
        if (c->bad[0] == '\0') {
            msv_fail(L, c, "connection failed");
        }
        run->failed++;
        L->total_failed++;
        if (L->errors_printed++ < L->o.print_errors) {
            fprintf(stderr, "e2e_load: request %ld (mask %s): %s\n", c->idx,
                    msv_mode_names[run->mode], c->bad);
        }
    }

    if (broken || c->close_after || c->bad[0] != '\0') {
        msv_conn_close(L, c);
    } else {
        c->state = MSV_C_IDLE;
        c->reused = 1;
        if (msv_conn_watch(L, c, EPOLLIN, EPOLL_CTL_MOD) != 0) {
            msv_conn_close(L, c);
        }
    }

    if (msv_run_more(L)) {
        if (msv_conn_start(L, c) != 0) {
            /* could not even start: count it and let the loop go on */
            run->done++;
            run->failed++;
            L->total_failed++;
            msv_conn_close(L, c);
        }
    }
}


/* One complete JSON document (an event, or the whole body). */

static int
msv_conn_doc(msv_load_t *L, msv_conn_t *c, msv_doc_t *d)
{
    msv_run_t  *run = L->run;
    size_t      i;

    if (msv_doc_check(d, L->o.top_k, L->o.temperature, run->mode) != 0) {
        msv_fail(L, c, "%s%s", L->o.stream ? "event: " : "", d->bad);
        return -1;
    }

    if (c->final_seen) {
        msv_fail(L, c, "an event after the one with the finish_reason");
        return -1;
    }

    c->n_events++;
    c->n_tokens += (long) d->tokens.n;
    c->n_rows += (long) d->row_off.n;
    c->n_mask_ids += (long long) d->row_ids.n;
    for (i = 0; i < d->tokens.n; i++) {
        c->hash = (c->hash ^ (uint32_t) d->tokens.v[i])
                  * 0x100000001b3ULL;
    }
    /* row by row, length then ids: the same whatever the events */
    for (i = 0; i < d->row_off.n; i++) {
        size_t  j, end;

        end = i + 1 < d->row_off.n ? (size_t) d->row_off.v[i + 1]
                                   : d->row_ids.n;
        c->mhash = (c->mhash ^ (uint32_t) (end - (size_t) d->row_off.v[i]))
                   * 0x100000001b3ULL;
        for (j = (size_t) d->row_off.v[i]; j < end; j++) {
            c->mhash = (c->mhash ^ (uint32_t) d->row_ids.v[j])
                       * 0x100000001b3ULL;
        }
    }

    if (d->finish == 2) {
        c->final_seen = 1;
        snprintf(c->finish, sizeof(c->finish), "%s", d->finish_str);
        if (d->completion_tokens < 0 || d->prompt_tokens < 0) {
            msv_fail(L, c, "the last event has no usage");
            return -1;
        }
        c->completion_tokens = d->completion_tokens;
        c->prompt_tokens = d->prompt_tokens;
    } else if (d->completion_tokens >= 0) {
        msv_fail(L, c, "usage before the last event");
        return -1;
    }
    return 0;
}


static int
msv_json_run(msv_load_t *L, msv_conn_t *c, const char *p, size_t n, int end)
{
    yajl_status     st;
    unsigned char  *msg;

    if (c->yh == NULL) {
        msv_doc_reset(&c->doc);
        c->yh = yajl_alloc(&msv_doc_callbacks, NULL, &c->doc);
        if (c->yh == NULL) {
            fprintf(stderr, "e2e_load: yajl_alloc failed\n");
            exit(1);
        }
    }

    st = n ? yajl_parse(c->yh, (const unsigned char *) p, n) : yajl_status_ok;
    if (st == yajl_status_ok && end) {
        st = yajl_complete_parse(c->yh);
    }

    if (st == yajl_status_client_canceled) {
        msv_fail(L, c, "%s%s", L->o.stream ? "event: " : "", c->doc.bad);
        return -1;
    }
    if (st != yajl_status_ok) {
        msg = yajl_get_error(c->yh, 0, (const unsigned char *) p, n);
        msv_fail(L, c, "invalid JSON: %s",
                 msg ? (char *) msg : "(no message)");
        if (msg) {
            yajl_free_error(c->yh, msg);
        }
        return -1;
    }

    if (end) {
        yajl_free(c->yh);
        c->yh = NULL;
        if (!c->doc.top_done) {
            msv_fail(L, c, "empty JSON document");
            return -1;
        }
        return msv_conn_doc(L, c, &c->doc);
    }
    return 0;
}


/* SSE: an event is complete (a blank line after data lines). */

static int
msv_sse_event(msv_load_t *L, msv_conn_t *c)
{
    int  kind;

    if (!c->data_seen) {
        return 0;                   /* a blank line, or comments only */
    }
    kind = c->data_kind;
    c->data_seen = 0;
    c->data_kind = 0;

    if (c->t_first == 0) {
        c->t_first = msv_now();
    }

    if (c->done_seen) {
        msv_fail(L, c, "an event after data: [DONE]");
        return -1;
    }

    if (kind == 1) {
        return msv_json_run(L, c, NULL, 0, 1);
    }

    while (c->data.n > 0 && c->data.p[c->data.n - 1] == '\r') {
        c->data.n--;
    }
    if (kind == 2 && c->data.n == 6 && memcmp(c->data.p, "[DONE]", 6) == 0) {
        c->done_seen = 1;
        c->data.n = 0;
        if (!c->final_seen) {
            msv_fail(L, c, "data: [DONE] before an event with a "
                     "finish_reason");
            return -1;
        }
        return 0;
    }

    msv_fail(L, c, "an event that is neither JSON nor [DONE]: \"%.*s\"",
             (int) c->data.n, c->data.n ? c->data.p : "");
    return -1;
}


/* Bytes of a data line's value. */

static int
msv_sse_data(msv_load_t *L, msv_conn_t *c, const char *p, size_t n)
{
    if (n == 0) {
        return 0;
    }
    if (c->data_kind == 0) {
        c->data_kind = p[0] == '{' ? 1 : 2;
    }
    if (c->data_kind == 1) {
        return msv_json_run(L, c, p, n, 0);
    }
    if (c->data.n + n > 64) {
        msv_fail(L, c, "an event that is neither JSON nor [DONE]");
        return -1;
    }
    msv_bytes_add(&c->data, p, n);
    return 0;
}


/* A data line begins: lines of one event are joined by a newline. */

static int
msv_sse_data_line(msv_load_t *L, msv_conn_t *c)
{
    if (c->data_seen && c->data_kind != 0) {
        if (msv_sse_data(L, c, "\n", 1) != 0) {
            return -1;
        }
    }
    c->data_seen = 1;
    return 0;
}


static int
msv_sse_is_data(msv_conn_t *c)
{
    return c->field_n == 4 && memcmp(c->field, "data", 4) == 0;
}


static int
msv_sse_input(msv_load_t *L, msv_conn_t *c, const char *p, size_t n)
{
    const char  *nl;
    size_t       k;

    while (n > 0) {

        switch (c->sse) {

        case MSV_SSE_START:
            if (*p == '\n') {
                p++;
                n--;
                if (msv_sse_event(L, c) != 0) {
                    return -1;
                }
                continue;
            }
            if (*p == '\r') {       /* of a CRLF */
                p++;
                n--;
                continue;
            }
            c->field_n = 0;
            c->sse = MSV_SSE_FIELD;
            /* fall through */

        case MSV_SSE_FIELD:
            if (*p == ':') {
                p++;
                n--;
                c->sse = msv_sse_is_data(c) ? MSV_SSE_SPACE : MSV_SSE_SKIP;
                continue;
            }
            if (*p == '\n') {
                /* a field without a value: "data" is an empty data line */
                p++;
                n--;
                c->sse = MSV_SSE_START;
                if (msv_sse_is_data(c) && msv_sse_data_line(L, c) != 0) {
                    return -1;
                }
                continue;
            }
            if (*p != '\r') {
                if (c->field_n < (int) sizeof(c->field)) {
                    c->field[c->field_n] = *p;
                }
                c->field_n++;
            }
            p++;
            n--;
            continue;

        case MSV_SSE_SPACE:
            if (msv_sse_data_line(L, c) != 0) {
                return -1;
            }
            if (*p == ' ') {
                p++;
                n--;
            }
            c->sse = MSV_SSE_DATA;
            continue;

        case MSV_SSE_DATA:
            nl = memchr(p, '\n', n);
            k = nl ? (size_t) (nl - p) : n;
            if (msv_sse_data(L, c, p, k) != 0) {
                return -1;
            }
            p += k;
            n -= k;
            if (nl) {
                p++;
                n--;
                c->sse = MSV_SSE_START;
            }
            continue;

        case MSV_SSE_SKIP:
            nl = memchr(p, '\n', n);
            if (nl == NULL) {
                return 0;
            }
            k = (size_t) (nl - p) + 1;
            p += k;
            n -= k;
            c->sse = MSV_SSE_START;
            continue;
        }
    }
    return 0;
}


/* Decoded body bytes. */

static int
msv_body_data(msv_load_t *L, msv_conn_t *c, const char *p, size_t n)
{
    if (c->status != 200) {
        if (c->errbody.n < 1024) {
            msv_bytes_add(&c->errbody, p, n > 1024 ? 1024 : n);
        }
        return 0;
    }

    if (!L->o.stream) {
        if (c->t_first == 0) {
            c->t_first = msv_now();
        }
        return msv_json_run(L, c, p, n, 0);
    }

    return msv_sse_input(L, c, p, n);
}


/* The body is complete. */

static int
msv_body_end(msv_load_t *L, msv_conn_t *c)
{
    c->http = MSV_H_DONE;

    if (c->status != 200) {
        return 0;
    }
    if (L->o.stream) {
        if (c->sse != MSV_SSE_START || c->data_seen) {
            msv_fail(L, c, "the stream ended inside an event");
            return -1;
        }
        return 0;
    }
    return msv_json_run(L, c, NULL, 0, 1);
}


static int
msv_hdr_has(const char *v, size_t n, const char *tok)
{
    size_t  t = strlen(tok), i;

    for (i = 0; i + t <= n; i++) {
        if (strncasecmp(v + i, tok, t) == 0) {
            return 1;
        }
    }
    return 0;
}


static int
msv_headers_parse(msv_load_t *L, msv_conn_t *c)
{
    char    *p, *end, *eol, *colon, *v;
    size_t   name_n, vn;
    int      http10 = 0;
    long     st;

    p = c->hdr.p;
    end = p + c->hdr.n;

    eol = memchr(p, '\n', (size_t) (end - p));
    if (eol == NULL || eol - p < 12 || memcmp(p, "HTTP/1.", 7) != 0) {
        msv_fail(L, c, "not an HTTP/1.x response");
        return -1;
    }
    http10 = p[7] == '0';
    st = strtol(p + 9, NULL, 10);
    if (st < 100 || st > 599) {
        msv_fail(L, c, "bad HTTP status line");
        return -1;
    }
    c->status = (int) st;
    c->close_after = http10;

    for (p = eol + 1; p < end; p = eol + 1) {
        eol = memchr(p, '\n', (size_t) (end - p));
        if (eol == NULL) {
            break;
        }
        if (eol == p || (eol == p + 1 && p[0] == '\r')) {
            break;                  /* the blank line */
        }
        colon = memchr(p, ':', (size_t) (eol - p));
        if (colon == NULL) {
            msv_fail(L, c, "a header line without a colon");
            return -1;
        }
        name_n = (size_t) (colon - p);
        v = colon + 1;
        while (v < eol && (*v == ' ' || *v == '\t')) {
            v++;
        }
        vn = (size_t) (eol - v);
        while (vn > 0 && (v[vn - 1] == '\r' || v[vn - 1] == ' ')) {
            vn--;
        }

#define MSV_HDR(s)  (name_n == sizeof(s) - 1 && strncasecmp(p, s, name_n) == 0)

        if (MSV_HDR("Content-Length")) {
            char  *e;

            errno = 0;
            c->clen = strtoll(v, &e, 10);
            if (errno != 0 || e == v || c->clen < 0) {
                msv_fail(L, c, "bad Content-Length");
                return -1;
            }
        } else if (MSV_HDR("Transfer-Encoding")) {
            c->chunked = msv_hdr_has(v, vn, "chunked");
        } else if (MSV_HDR("Connection")) {
            if (msv_hdr_has(v, vn, "close")) {
                c->close_after = 1;
            } else if (msv_hdr_has(v, vn, "keep-alive")) {
                c->close_after = 0;
            }
        } else if (MSV_HDR("Content-Type")) {
            c->ctype_ok = msv_hdr_has(v, vn, L->o.stream
                                      ? "text/event-stream"
                                      : "application/json");
        }

#undef MSV_HDR
    }

    if (c->chunked) {
        c->clen = -1;
    } else if (c->clen < 0) {
        c->close_after = 1;         /* the body ends with the connection */
    }
    return 0;
}


/* Feed response bytes; returns -1 on a protocol or validation failure,
 * 1 when the response is complete, 0 for more. */

static int
msv_conn_input(msv_load_t *L, msv_conn_t *c, const char *p, size_t n)
{
    const char  *e, *q;
    size_t       k, from, hl;
    int          ch, d;

    c->bytes += (long long) n;

    while (n > 0 || c->http == MSV_H_BODY) {

        switch (c->http) {

        case MSV_H_HEADERS:
            from = c->hdr.n > 3 ? c->hdr.n - 3 : 0;
            msv_bytes_add(&c->hdr, p, n);
            e = NULL;
            for (q = c->hdr.p + from; q + 3 < c->hdr.p + c->hdr.n; q++) {
                if (q[0] == '\r' && q[1] == '\n' && q[2] == '\r'
                    && q[3] == '\n')
                {
                    e = q + 4;
                    break;
                }
            }
            if (e == NULL) {
                if (c->hdr.n > MSV_LOAD_HDR_MAX) {
                    msv_fail(L, c, "response headers over %d bytes",
                             MSV_LOAD_HDR_MAX);
                    return -1;
                }
                return 0;
            }
            hl = (size_t) (e - c->hdr.p);
            k = c->hdr.n - hl;          /* body bytes that came along */
            p = p + n - k;
            n = k;
            if (msv_headers_parse(L, c) != 0) {
                return -1;
            }
            if (c->status >= 100 && c->status < 200) {
                /* an interim response: drop it, read the next head */
                c->hdr.n = 0;
                continue;
            }
            c->http = MSV_H_BODY;
            if (!c->chunked && c->clen == 0) {
                if (msv_body_end(L, c) != 0) {
                    return -1;
                }
            }
            continue;

        case MSV_H_BODY:
            if (!c->chunked) {
                if (c->clen >= 0) {
                    k = (long long) n > c->clen - c->got
                        ? (size_t) (c->clen - c->got) : n;
                } else {
                    k = n;
                }
                if (k && msv_body_data(L, c, p, k) != 0) {
                    return -1;
                }
                c->got += (long long) k;
                p += k;
                n -= k;
                if (c->clen >= 0 && c->got == c->clen) {
                    if (msv_body_end(L, c) != 0) {
                        return -1;
                    }
                    continue;
                }
                return 0;
            }

            /* chunked */
            if (n == 0) {
                return 0;
            }
            if (c->ch == MSV_CH_DATA) {
                k = (unsigned long long) n > c->ch_left ? (size_t) c->ch_left
                                                        : n;
                if (msv_body_data(L, c, p, k) != 0) {
                    return -1;
                }
                c->ch_left -= k;
                p += k;
                n -= k;
                if (c->ch_left == 0) {
                    c->ch = MSV_CH_DATA_CR;
                }
                continue;
            }

            ch = (unsigned char) *p++;
            n--;

            switch (c->ch) {

            case MSV_CH_SIZE:
                if (ch >= '0' && ch <= '9') {
                    d = ch - '0';
                } else if (ch >= 'a' && ch <= 'f') {
                    d = ch - 'a' + 10;
                } else if (ch >= 'A' && ch <= 'F') {
                    d = ch - 'A' + 10;
                } else {
                    d = -1;
                }
                if (d >= 0) {
                    if (c->ch_left >> 56) {
                        msv_fail(L, c, "chunk size too large");
                        return -1;
                    }
                    c->ch_left = c->ch_left * 16 + (unsigned) d;
                    c->ch_digits++;
                    break;
                }
                if (c->ch_digits == 0) {
                    msv_fail(L, c, "bad chunk size line");
                    return -1;
                }
                if (ch == '\n') {
                    goto size_done;
                }
                c->ch = MSV_CH_EXT;
                break;

            case MSV_CH_EXT:
                if (ch != '\n') {
                    break;
                }

            size_done:
                c->ch_digits = 0;
                if (c->ch_left == 0) {
                    c->ch = MSV_CH_TRAILER;
                    c->ch_line_len = 0;
                } else {
                    c->ch = MSV_CH_DATA;
                }
                break;

            case MSV_CH_DATA_CR:
                if (ch == '\r') {
                    c->ch = MSV_CH_DATA_LF;
                } else if (ch == '\n') {
                    c->ch = MSV_CH_SIZE;
                } else {
                    msv_fail(L, c, "no CRLF after a chunk");
                    return -1;
                }
                break;

            case MSV_CH_DATA_LF:
                if (ch != '\n') {
                    msv_fail(L, c, "no CRLF after a chunk");
                    return -1;
                }
                c->ch = MSV_CH_SIZE;
                break;

            case MSV_CH_TRAILER:
            case MSV_CH_TRAILER_LINE:
                if (ch == '\n') {
                    if (c->ch_line_len == 0) {
                        c->ch = MSV_CH_DONE;
                        if (msv_body_end(L, c) != 0) {
                            return -1;
                        }
                        break;
                    }
                    c->ch_line_len = 0;
                } else if (ch != '\r') {
                    c->ch_line_len++;
                }
                break;

            default:
                break;
            }
            continue;

        case MSV_H_DONE:
            if (n > 0) {
                msv_fail(L, c, "%zu bytes after the end of the response",
                         n);
                return -1;
            }
            return 1;
        }
    }

    return c->http == MSV_H_DONE ? 1 : 0;
}


static void
msv_conn_readable(msv_load_t *L, msv_conn_t *c)
{
    ssize_t  r;
    int      rc, reads;

    for (reads = 0; reads < 16; reads++) {
        r = recv(c->fd, L->rbuf, MSV_LOAD_READ_BUF, 0);
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                return;
            }
            if (errno == EINTR) {
                continue;
            }
            if (c->state == MSV_C_IDLE) {
                msv_conn_close(L, c);
                return;
            }
            msv_fail(L, c, "recv: %s", strerror(errno));
            msv_conn_finish(L, c, 1);
            return;
        }

        if (c->state == MSV_C_IDLE) {
            /* the server closed an idle keep-alive connection */
            if (r > 0) {
                fprintf(stderr, "e2e_load: %zd unexpected bytes on an idle "
                        "connection\n", r);
            }
            msv_conn_close(L, c);
            return;
        }

        if (r == 0) {
            if (c->http == MSV_H_BODY && !c->chunked && c->clen < 0) {
                rc = msv_body_end(L, c);
                msv_conn_finish(L, c, rc != 0);
                return;
            }
            msv_fail(L, c, "connection closed %s",
                     c->bytes ? "in the middle of the response"
                              : "before a response");
            msv_conn_finish(L, c, 1);
            return;
        }

        rc = msv_conn_input(L, c, L->rbuf, (size_t) r);
        if (rc < 0) {
            msv_conn_finish(L, c, 1);
            return;
        }
        if (rc == 1) {
            msv_conn_finish(L, c, 0);
            return;
        }
    }
}


static void
msv_conn_writable(msv_load_t *L, msv_conn_t *c)
{
    ssize_t    w;
    int        err = 0;
    socklen_t  len = sizeof(err);

    if (c->state == MSV_C_CONNECTING) {
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
            err = errno;
        }
        if (err != 0) {
            msv_fail(L, c, "connect to %s:%s: %s", L->o.host, L->o.port,
                     strerror(err));
            msv_conn_finish(L, c, 1);
            return;
        }
        c->state = MSV_C_WRITING;
    }

    while (c->req_off < c->req.n) {
        w = send(c->fd, c->req.p + c->req_off, c->req.n - c->req_off,
                 MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                return;
            }
            if (errno == EINTR) {
                continue;
            }
            msv_fail(L, c, "send: %s", strerror(errno));
            msv_conn_finish(L, c, 1);
            return;
        }
        c->req_off += (size_t) w;
    }

    c->state = MSV_C_READING;
    if (msv_conn_watch(L, c, EPOLLIN, EPOLL_CTL_MOD) != 0) {
        msv_fail(L, c, "epoll");
        msv_conn_finish(L, c, 1);
    }
}


/* ------------------------------------------------------------------ */
/* Runs                                                                 */

static void
msv_run_free(msv_run_t *run)
{
    free(run->done_t.v);
    free(run->ok_t.v);
    free(run->start_t.v);
    free(run->ttfe.v);
    free(run->lat.v);
    memset(run, 0, sizeof(*run));
}


static int
msv_cmp_f64(const void *a, const void *b)
{
    double  x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : x > y;
}


/* nearest rank */

static double
msv_pct(msv_f64s_t *a, double p)
{
    size_t  k;

    if (a->n == 0) {
        return NAN;
    }
    k = (size_t) ceil(p * (double) a->n);
    k = k == 0 ? 0 : k - 1;
    return a->v[k < a->n ? k : a->n - 1];
}


static int
msv_run(msv_load_t *L, msv_run_t *run, int mode, long requests)
{
    struct epoll_event  evs[256];
    msv_conn_t         *c;
    long                i, saved = L->o.requests;
    double              now, cpu0;
    int                 n, k;

    memset(run, 0, sizeof(*run));
    run->mode = mode;
    L->run = run;
    L->o.requests = requests;

    for (i = 0; i < L->o.n_watch; i++) {
        run->wcpu[i] = msv_watch_cpu(&L->o.watch[i]);
    }
    cpu0 = msv_cpu_seconds();
    run->t0 = msv_now();
    run->deadline = run->t0 + L->o.duration;
    run->t_last = run->t0;

    for (i = 0; i < L->o.conc && msv_run_more(L); i++) {
        c = &L->conns[i];
        if (msv_conn_start(L, c) != 0) {
            fprintf(stderr, "e2e_load: cannot start a request on "
                    "connection %ld\n", i);
            L->o.requests = saved;
            return -1;
        }
    }

    while (run->done < run->issued) {
        n = epoll_wait(L->ep, evs, 256, 100);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            perror("e2e_load: epoll_wait");
            L->o.requests = saved;
            return -1;
        }

        for (k = 0; k < n; k++) {
            c = evs[k].data.ptr;
            if (c->fd < 0) {
                continue;
            }
            if (c->state == MSV_C_CONNECTING || c->state == MSV_C_WRITING) {
                if (evs[k].events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) {
                    msv_conn_writable(L, c);
                }
            } else if (evs[k].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
                msv_conn_readable(L, c);
            }
        }

        /* requests past their time */
        now = msv_now();
        for (i = 0; i < L->o.conc; i++) {
            c = &L->conns[i];
            if ((c->state == MSV_C_CONNECTING || c->state == MSV_C_WRITING
                 || c->state == MSV_C_READING)
                && now - c->t_start > L->o.timeout)
            {
                msv_fail(L, c, "no complete response within %.0f s "
                         "(%lld bytes received)", L->o.timeout, c->bytes);
                msv_conn_finish(L, c, 1);
            }
        }
    }

    run->cpu = msv_cpu_seconds() - cpu0;
    for (i = 0; i < L->o.n_watch; i++) {
        run->wcpu[i] = msv_watch_cpu(&L->o.watch[i]) - run->wcpu[i];
    }
    L->o.requests = saved;
    return 0;
}


/*
 * The numbers of a run, over its steady window: from the completion of
 * the first `conc` requests (the first wave, which all start together)
 * to the last request issued (after it the number in flight falls).
 * While the window lasts every connection has a request in flight.
 * Rates count the valid completions inside the window; times are those
 * of the requests started inside it.  A run too short to have a window
 * falls back to the whole run, and says so.
 */

static void
msv_run_summary(const msv_load_opts_t *o, msv_run_t *run)
{
    msv_f64s_t  t1 = { NULL, 0, 0 }, t2 = { NULL, 0, 0 };
    double      from, to, w;
    size_t      i, in = 0;

    from = run->done_t.n > (size_t) o->conc ? run->done_t.v[o->conc - 1]
                                            : run->t_last;
    to = run->t_issue;
    run->steady = to - from > 1e-3;
    if (!run->steady) {
        from = run->t0;
        to = run->t_last;
    }
    w = to - from > 1e-9 ? to - from : 1e-9;

    for (i = 0; i < run->ok_t.n; i++) {
        if (run->ok_t.v[i] > from && run->ok_t.v[i] <= to) {
            in++;
        }
        if (!run->steady || run->start_t.v[i] >= from) {
            msv_f64s_push(&t1, run->ttfe.v[i]);
            msv_f64s_push(&t2, run->lat.v[i]);
        }
    }
    if (!run->steady) {
        in = (size_t) run->ok;
    }

    qsort(t1.v, t1.n, sizeof(double), msv_cmp_f64);
    qsort(t2.v, t2.n, sizeof(double), msv_cmp_f64);

    run->win = w;
    run->rps = (double) in / w;
    run->tps = run->ok ? run->rps * (double) run->tokens / (double) run->ok
                       : 0;
    run->mbps = run->ok ? run->rps * (double) run->bytes / (double) run->ok
                          / 1e6
                        : 0;
    run->kb_resp = run->ok ? (double) run->bytes / (double) run->ok / 1e3
                           : 0;
    run->ids_per_token = run->tokens ? (double) run->mask_ids
                                       / (double) run->tokens
                                     : 0;
    w = run->t_last - run->t0;
    run->cpu_pct = w > 0 ? run->cpu / w * 100.0 : 0;
    run->cpu_ms = run->ok ? run->cpu * 1e3 / (double) run->ok : NAN;
    for (i = 0; i < (size_t) o->n_watch; i++) {
        run->wcpu_ms[i] = run->ok ? run->wcpu[i] * 1e3 / (double) run->ok
                                  : NAN;
    }
    run->ttfe50 = msv_pct(&t1, 0.50) * 1e3;
    run->ttfe99 = msv_pct(&t1, 0.99) * 1e3;
    run->lat50 = msv_pct(&t2, 0.50) * 1e3;
    run->lat99 = msv_pct(&t2, 0.99) * 1e3;

    free(t1.v);
    free(t2.v);
}


static void
msv_run_print(const msv_load_opts_t *o, msv_run_t *run, long rep)
{
    int  i;

    printf("run %-8s rep %ld: %ld ok, %ld failed, %ld mismatched in %.2f s"
           " (%s %.2f s): %.1f req/s, %.0f tok/s, %s p50 %.1f ms p99 %.1f "
           "ms, latency p50 %.1f ms p99 %.1f ms, %.2f MB/s, %.1f KB/resp; "
           "CPU per response: client %.2f ms (%.0f%% of a core)",
           msv_mode_names[run->mode], rep + 1, run->ok, run->failed,
           run->mismatches, run->t_last - run->t0,
           run->steady ? "steady window" : "NO steady window, whole run",
           run->win, run->rps, run->tps, o->stream ? "TTFE" : "TTFB",
           run->ttfe50, run->ttfe99, run->lat50, run->lat99, run->mbps,
           run->kb_resp, run->cpu_ms, run->cpu_pct);
    for (i = 0; i < o->n_watch; i++) {
        printf(", %s %.2f ms", o->watch[i].label, run->wcpu_ms[i]);
    }
    printf("\n");
    fflush(stdout);
}


static double
msv_median(double *v, long n)
{
    qsort(v, (size_t) n, sizeof(double), msv_cmp_f64);
    if (n == 0) {
        return NAN;
    }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}


/* ------------------------------------------------------------------ */
/* Options                                                              */

static void
msv_usage(FILE *f)
{
    fprintf(f,
"usage: e2e_load --port PORT [options]\n"
"  --host HOST            server address (default 127.0.0.1)\n"
"  --port PORT            server port (required)\n"
"  -c, --concurrency N    requests in flight, one per connection (64)\n"
"  -n, --requests N       requests per run (default 512)\n"
"  -d, --duration SEC     instead of -n: issue requests for SEC seconds\n"
"                         per run, then wait for those in flight\n"
"  --max-tokens N         sampling_params.max_tokens (16)\n"
"  --ignore-eos 0|1       sampling_params.ignore_eos (1); with 1 every\n"
"                         response must carry exactly max_tokens tokens\n"
"  --modes LIST           mask modes to compare, comma-separated, from\n"
"                         off, selected, support (JSON), selected-packed,\n"
"                         support-packed (mask_format \"packed\"), or all\n"
"                         (default off,selected,support)\n"
"  --top-k K              sampling_params.top_k (default -1: off)\n"
"  --top-p P              sampling_params.top_p (1.0)\n"
"  --temperature T        sampling_params.temperature (1.0)\n"
"  --prompt-len N         prompt tokens per request (16)\n"
"  --vocab N              prompt ids are drawn from [1, N) (1000)\n"
"  --no-stream            non-streaming requests (\"stream\": false)\n"
"  --repeats R            runs per mode, interleaved; medians reported (3)\n"
"  --warmup N             requests before the first run, not counted\n"
"                         (default: the concurrency)\n"
"  --timeout SEC          a request's limit (60)\n"
"  --seed S               request i uses seed S + i (default 1)\n"
"  --print-errors N       failures printed in full (10)\n"
"  --cpu LABEL=PID[,PID]  sample the CPU time of these server processes\n"
"                         around every run and report it per response\n"
"                         (repeatable, up to 4 labels)\n");
}


static int
msv_opt_long(const char *name, const char *s, long lo, long hi, long *out)
{
    char  *e;
    long   v;

    errno = 0;
    v = strtol(s, &e, 10);
    if (errno != 0 || e == s || *e != '\0' || v < lo || v > hi) {
        fprintf(stderr, "e2e_load: %s: \"%s\" is not an integer in "
                "[%ld, %ld]\n", name, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}


static int
msv_opt_double(const char *name, const char *s, double lo, double hi,
    double *out)
{
    char    *e;
    double   v;

    errno = 0;
    v = strtod(s, &e);
    if (errno != 0 || e == s || *e != '\0' || !(v >= lo && v <= hi)) {
        fprintf(stderr, "e2e_load: %s: \"%s\" is not a number in "
                "[%g, %g]\n", name, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}


static int
msv_opt_modes(msv_load_opts_t *o, const char *s)
{
    const char  *p = s, *e;
    size_t       n;
    int          m, i;

    o->n_modes = 0;
    if (strcmp(s, "all") == 0) {
        for (m = 0; m < MSV_N_MODES; m++) {
            o->modes[o->n_modes++] = m;
        }
        return 0;
    }
    while (*p) {
        e = strchr(p, ',');
        n = e ? (size_t) (e - p) : strlen(p);
        for (m = 0; m < MSV_N_MODES; m++) {
            if (strlen(msv_mode_names[m]) == n
                && memcmp(msv_mode_names[m], p, n) == 0)
            {
                break;
            }
        }
        if (m == MSV_N_MODES) {
            fprintf(stderr, "e2e_load: --modes: unknown mode \"%.*s\" "
                    "(off, selected, support, selected-packed, "
                    "support-packed, all)\n", (int) n, p);
            return -1;
        }
        for (i = 0; i < o->n_modes; i++) {
            if (o->modes[i] == m) {
                fprintf(stderr, "e2e_load: --modes: \"%s\" twice\n",
                        msv_mode_names[m]);
                return -1;
            }
        }
        o->modes[o->n_modes++] = m;
        p += n;
        if (*p == ',') {
            p++;
        }
    }
    if (o->n_modes == 0) {
        fprintf(stderr, "e2e_load: --modes: empty list\n");
        return -1;
    }
    return 0;
}


static int
msv_opt_watch(msv_load_opts_t *o, char *s)
{
    msv_watch_t  *w;
    char         *eq, *p, *e;
    long          v;

    eq = strchr(s, '=');
    if (eq == NULL || eq == s || eq[1] == '\0') {
        fprintf(stderr, "e2e_load: --cpu: \"%s\" is not LABEL=PID[,PID...]"
                "\n", s);
        return -1;
    }
    if (o->n_watch == MSV_LOAD_MAX_WATCH) {
        fprintf(stderr, "e2e_load: --cpu: at most %d labels\n",
                MSV_LOAD_MAX_WATCH);
        return -1;
    }
    w = &o->watch[o->n_watch];
    *eq = '\0';
    w->label = s;
    w->n = 0;

    for (p = eq + 1; *p; p = *e ? e + 1 : e) {
        errno = 0;
        v = strtol(p, &e, 10);
        if (errno != 0 || e == p || (*e != ',' && *e != '\0') || v <= 0
            || v > INT32_MAX)
        {
            fprintf(stderr, "e2e_load: --cpu %s: bad pid list \"%s\"\n",
                    s, eq + 1);
            return -1;
        }
        if (w->n == MSV_LOAD_WATCH_PIDS) {
            fprintf(stderr, "e2e_load: --cpu %s: at most %d pids\n", s,
                    MSV_LOAD_WATCH_PIDS);
            return -1;
        }
        w->pid[w->n++] = (pid_t) v;
    }
    if (isnan(msv_watch_cpu(w))) {
        return -1;
    }
    o->n_watch++;
    return 0;
}


static int
msv_parse_opts(int argc, char **argv, msv_load_opts_t *o)
{
    int          c, idx;
    long         v;
    const char  *modes = "off,selected,support";

    static const struct option  longopts[] = {
        { "host",         required_argument, 0, 'H' },
        { "port",         required_argument, 0, 'p' },
        { "concurrency",  required_argument, 0, 'c' },
        { "requests",     required_argument, 0, 'n' },
        { "duration",     required_argument, 0, 'd' },
        { "max-tokens",   required_argument, 0, 'm' },
        { "ignore-eos",   required_argument, 0, 'E' },
        { "modes",        required_argument, 0, 'M' },
        { "top-k",        required_argument, 0, 'k' },
        { "top-p",        required_argument, 0, 'P' },
        { "temperature",  required_argument, 0, 'T' },
        { "prompt-len",   required_argument, 0, 'l' },
        { "vocab",        required_argument, 0, 'V' },
        { "no-stream",    no_argument,       0, 'N' },
        { "repeats",      required_argument, 0, 'r' },
        { "warmup",       required_argument, 0, 'w' },
        { "timeout",      required_argument, 0, 't' },
        { "seed",         required_argument, 0, 'S' },
        { "print-errors", required_argument, 0, 'e' },
        { "cpu",          required_argument, 0, 'C' },
        { "help",         no_argument,       0, 'h' },
        { 0, 0, 0, 0 }
    };

    memset(o, 0, sizeof(*o));
    o->host = "127.0.0.1";
    o->conc = 64;
    o->requests = 512;
    o->max_tokens = 16;
    o->ignore_eos = 1;
    o->top_k = -1;
    o->top_p = 1.0;
    o->temperature = 1.0;
    o->prompt_len = 16;
    o->vocab = 1000;
    o->stream = 1;
    o->repeats = 3;
    o->warmup = -1;
    o->timeout = 60;
    o->seed = 1;
    o->print_errors = 10;

    while ((c = getopt_long(argc, argv, "c:n:d:h", longopts, &idx)) != -1) {
        switch (c) {
        case 'H':
            o->host = optarg;
            break;
        case 'p':
            if (msv_opt_long("--port", optarg, 1, 65535, &v) != 0) {
                return -1;
            }
            o->port = optarg;
            break;
        case 'c':
            if (msv_opt_long("--concurrency", optarg, 1, MSV_LOAD_MAX_CONC,
                             &o->conc) != 0)
            {
                return -1;
            }
            break;
        case 'n':
            if (msv_opt_long("--requests", optarg, 1, 100000000,
                             &o->requests) != 0)
            {
                return -1;
            }
            o->duration = 0;
            break;
        case 'd':
            if (msv_opt_double("--duration", optarg, 0.01, 86400,
                               &o->duration) != 0)
            {
                return -1;
            }
            o->requests = 0;
            break;
        case 'm':
            if (msv_opt_long("--max-tokens", optarg, 1, 1000000,
                             &o->max_tokens) != 0)
            {
                return -1;
            }
            break;
        case 'E':
            if (msv_opt_long("--ignore-eos", optarg, 0, 1, &v) != 0) {
                return -1;
            }
            o->ignore_eos = (int) v;
            break;
        case 'M':
            modes = optarg;
            break;
        case 'k':
            if (msv_opt_long("--top-k", optarg, -1, INT32_MAX, &o->top_k)
                != 0)
            {
                return -1;
            }
            break;
        case 'P':
            if (msv_opt_double("--top-p", optarg, 1e-9, 1.0, &o->top_p)
                != 0)
            {
                return -1;
            }
            break;
        case 'T':
            if (msv_opt_double("--temperature", optarg, 0, 1000,
                               &o->temperature) != 0)
            {
                return -1;
            }
            break;
        case 'l':
            if (msv_opt_long("--prompt-len", optarg, 1, 1000000,
                             &o->prompt_len) != 0)
            {
                return -1;
            }
            break;
        case 'V':
            if (msv_opt_long("--vocab", optarg, 2, INT32_MAX, &o->vocab)
                != 0)
            {
                return -1;
            }
            break;
        case 'N':
            o->stream = 0;
            break;
        case 'r':
            if (msv_opt_long("--repeats", optarg, 1, MSV_LOAD_MAX_REPEATS,
                             &o->repeats) != 0)
            {
                return -1;
            }
            break;
        case 'w':
            if (msv_opt_long("--warmup", optarg, 0, 100000000, &o->warmup)
                != 0)
            {
                return -1;
            }
            break;
        case 't':
            if (msv_opt_double("--timeout", optarg, 0.1, 86400, &o->timeout)
                != 0)
            {
                return -1;
            }
            break;
        case 'S':
            if (msv_opt_long("--seed", optarg, 0, LONG_MAX, &v) != 0) {
                return -1;
            }
            o->seed = (uint64_t) v;
            break;
        case 'e':
            if (msv_opt_long("--print-errors", optarg, 0, 1000000,
                             &o->print_errors) != 0)
            {
                return -1;
            }
            break;
        case 'C':
            if (msv_opt_watch(o, optarg) != 0) {
                return -1;
            }
            break;
        case 'h':
            msv_usage(stdout);
            exit(0);
        default:
            msv_usage(stderr);
            return -1;
        }
    }

    if (optind != argc) {
        fprintf(stderr, "e2e_load: unexpected argument \"%s\"\n",
                argv[optind]);
        return -1;
    }
    if (o->port == NULL) {
        fprintf(stderr, "e2e_load: --port is required\n");
        msv_usage(stderr);
        return -1;
    }
    if (o->warmup < 0) {
        o->warmup = o->conc;
    }
    return msv_opt_modes(o, modes);
}


/* ------------------------------------------------------------------ */

int
main(int argc, char **argv)
{
    msv_load_t        L;
    msv_load_opts_t  *o = &L.o;
    msv_run_t        *runs, warm;
    struct addrinfo   hints;
    double            v[MSV_LOAD_MAX_REPEATS];
    int               base_m;
    long              i, r;
    int               m, mode, rc;

    memset(&L, 0, sizeof(L));
    if (msv_parse_opts(argc, argv, o) != 0) {
        return 2;
    }

    if (signal(SIGPIPE, SIG_IGN) == SIG_ERR) {
        perror("e2e_load: signal");
        return 1;
    }

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc = getaddrinfo(o->host, o->port, &hints, &L.ai);
    if (rc != 0) {
        fprintf(stderr, "e2e_load: %s:%s: %s\n", o->host, o->port,
                gai_strerror(rc));
        return 1;
    }

    L.ep = epoll_create1(EPOLL_CLOEXEC);
    if (L.ep < 0) {
        perror("e2e_load: epoll_create1");
        return 1;
    }

    L.conns = calloc((size_t) o->conc, sizeof(msv_conn_t));
    L.rbuf = malloc(MSV_LOAD_READ_BUF);
    runs = calloc((size_t) (o->repeats * o->n_modes), sizeof(msv_run_t));
    if (L.conns == NULL || L.rbuf == NULL || runs == NULL) {
        fprintf(stderr, "e2e_load: out of memory\n");
        return 1;
    }
    for (i = 0; i < o->conc; i++) {
        L.conns[i].fd = -1;
    }

    printf("e2e_load: %s:%s, %ld streams%s, %s%ld requests per run, "
           "max_tokens %ld, ignore_eos %d, prompt %ld tokens, top_k %ld, "
           "top_p %g, temperature %g, %ld repeats\n",
           o->host, o->port, o->conc, o->stream ? "" : " (non-streaming)",
           o->requests ? "" : "duration mode: ",
           o->requests ? o->requests : 0, o->max_tokens, o->ignore_eos,
           o->prompt_len, o->top_k, o->top_p, o->temperature, o->repeats);
    if (o->requests == 0) {
        printf("e2e_load: %.1f s per run\n", o->duration);
    }

    /* warm-up: opens the connections; its tokens seed the cross-checks */
    if (o->warmup > 0) {
        if (msv_run(&L, &warm, o->modes[0], o->warmup) != 0) {
            return 1;
        }
        printf("warm-up (mask %s): %ld ok, %ld failed\n",
               msv_mode_names[o->modes[0]], warm.ok, warm.failed);
        msv_run_free(&warm);
    }

    for (r = 0; r < o->repeats; r++) {
        for (m = 0; m < o->n_modes; m++) {
            /* rotate the order so no mode always runs first */
            mode = o->modes[(m + r) % o->n_modes];
            msv_run_t  *run = &runs[r * o->n_modes + (m + r) % o->n_modes];

            if (msv_run(&L, run, mode, o->requests) != 0) {
                return 1;
            }
            msv_run_summary(o, run);
            msv_run_print(o, run, r);
        }
    }

    /* the table: medians over the repeats */
    printf("\n%ld concurrent %s, max_tokens %ld, top_k %ld; median of %ld "
           "runs per mode; req/s vs off: median of the ratios within a "
           "repeat (min-max)\n\n", o->conc,
           o->stream ? "streams" : "requests", o->max_tokens, o->top_k,
           o->repeats);
    printf("| mask | req/s | tokens/s | %s p50 ms | %s p99 ms | latency "
           "p50 ms | latency p99 ms | MB/s | KB/resp | mask ids/token | "
           "client CPU ms/resp |", o->stream ? "TTFE" : "TTFB",
           o->stream ? "TTFE" : "TTFB");
    for (i = 0; i < o->n_watch; i++) {
        printf(" %s CPU ms/resp |", o->watch[i].label);
    }
    printf(" req/s vs off |\n|---|---|---|---|---|---|---|---|---|---|---|");
    for (i = 0; i < o->n_watch; i++) {
        printf("---|");
    }
    printf("---|\n");

    base_m = -1;
    for (m = 0; m < o->n_modes; m++) {
        if (o->modes[m] == MSV_MODE_OFF) {
            base_m = m;
        }
    }

    for (m = 0; m < o->n_modes; m++) {
        msv_run_t  *run;
        long        fail = 0;
        double      med[10 + MSV_LOAD_MAX_WATCH], lo, hi;
        int         q;

        for (q = 0; q < 10 + o->n_watch; q++) {
            for (r = 0; r < o->repeats; r++) {
                run = &runs[r * o->n_modes + m];

                switch (q) {
                case 0: v[r] = run->rps; break;
                case 1: v[r] = run->tps; break;
                case 2: v[r] = run->ttfe50; break;
                case 3: v[r] = run->ttfe99; break;
                case 4: v[r] = run->lat50; break;
                case 5: v[r] = run->lat99; break;
                case 6: v[r] = run->mbps; break;
                case 7: v[r] = run->ids_per_token; break;
                case 8: v[r] = run->cpu_ms; break;
                case 9: v[r] = run->kb_resp; break;
                default: v[r] = run->wcpu_ms[q - 10]; break;
                }
            }
            med[q] = msv_median(v, o->repeats);
        }
        for (r = 0; r < o->repeats; r++) {
            run = &runs[r * o->n_modes + m];
            fail += run->failed + run->mismatches + !run->steady;
        }

        mode = o->modes[m];
        printf("| %s | %.1f | %.0f | %.1f | %.1f | %.1f | %.1f | %.2f | "
               "%.1f | %.1f | %.2f | ", msv_mode_names[mode], med[0], med[1],
               med[2], med[3], med[4], med[5], med[6], med[9], med[7],
               med[8]);
        for (q = 0; q < o->n_watch; q++) {
            printf("%.3f | ", med[10 + q]);
        }

        if (base_m < 0) {
            printf("- |");
        } else {
            for (r = 0; r < o->repeats; r++) {
                v[r] = runs[r * o->n_modes + m].rps
                       / runs[r * o->n_modes + base_m].rps;
            }
            lo = hi = v[0];
            for (r = 1; r < o->repeats; r++) {
                lo = v[r] < lo ? v[r] : lo;
                hi = v[r] > hi ? v[r] : hi;
            }
            printf("%.2f (%.2f-%.2f) |", msv_median(v, o->repeats), lo, hi);
        }
        printf("%s\n", fail ? " (failures or runs without a steady window)"
                            : "");
    }

    printf("\nvalidation: %lld failed responses, %lld token_ids mismatches "
           "across modes and repeats\n", L.total_failed, L.total_mismatches);

    for (i = 0; i < o->conc; i++) {
        msv_conn_close(&L, &L.conns[i]);
        free(L.conns[i].req.p);
        free(L.conns[i].hdr.p);
        free(L.conns[i].data.p);
        free(L.conns[i].errbody.p);
        msv_doc_free(&L.conns[i].doc);
    }
    for (i = 0; i < o->repeats * o->n_modes; i++) {
        msv_run_free(&runs[i]);
    }
    free(runs);
    free(L.conns);
    free(L.rbuf);
    free(L.hashes);
    free(L.mhashes[0]);
    free(L.mhashes[1]);
    freeaddrinfo(L.ai);
    close(L.ep);

    return L.total_failed || L.total_mismatches ? 1 : 0;
}
