/*
 * load.c: the load driver of the e2e load client and its statistics
 * (see load.h): requests built and issued, each response checked as it
 * arrives (its documents by check.c) and as a whole when it ends, runs
 * over their steady window, percentiles and medians.
 */

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <yajl/yajl_parse.h>

#include "load.h"
#include "http.h"
#include "sse.h"


double
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

double
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


void
msv_fail(msv_load_t *L, msv_conn_t *c, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

void
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

void
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
    msv_run_t     *run = L->run;
    size_t         i;
    msv_expect_t   e;

    /* each event alone: the counts over the stream are checked at its end;
     * the client asks no logprobs and does not know the vocabulary */
    e.top_k = L->o.top_k;
    e.temperature = L->o.temperature;
    e.variant = run->mode;
    e.vocab = 0;
    e.max_tokens = -1;
    e.logprobs = -1;
    e.whole = 0;

    if (msv_doc_check(d, &e) != 0) {
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


int
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



/* Decoded body bytes. */

int
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

int
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


/* ------------------------------------------------------------------ */
/* Runs                                                                 */

void
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


int
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

void
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


void
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


double
msv_median(double *v, long n)
{
    qsort(v, (size_t) n, sizeof(double), msv_cmp_f64);
    if (n == 0) {
        return NAN;
    }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
