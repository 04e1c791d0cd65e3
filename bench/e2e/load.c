/*
 * load.c: the load driver of the e2e load client and its statistics
 * (see load.h): requests built and issued, each response checked as it
 * arrives (its documents by check.c) and as a whole when it ends, by the
 * loop (thread) that owns its connection, into that loop's part of the
 * run; the parts merged and the comparisons over runs made once the
 * loops are done; runs over their steady window, percentiles and
 * medians.
 */

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
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
#include "mix.h"
#include "http.h"
#include "resp.h"


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


/*
 * CPU seconds (user + system, all threads) of a process; its system part
 * and its minor page faults in *st; -1 if gone
 */

static double
msv_proc_cpu(pid_t pid, msv_proc_stat_t *st)
{
    char                buf[1024], path[64], *p;
    int                 fd;
    ssize_t             n;
    unsigned long long  flt, ut, sy;

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
     * ')'; the state is field 3, minflt field 10, utime and stime fields
     * 14 and 15 */
    p = strrchr(buf, ')');
    if (p == NULL) {
        return -1;
    }
    if (sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %llu %*u %*u %*u %llu "
               "%llu", &flt, &ut, &sy) != 3)
    {
        return -1;
    }
    st->sys = (double) sy / (double) sysconf(_SC_CLK_TCK);
    st->faults = (double) flt;
    return (double) (ut + sy) / (double) sysconf(_SC_CLK_TCK);
}


/* the watched processes of one label together; st may be NULL */

double
msv_watch_cpu(const msv_watch_t *w, msv_proc_stat_t *st)
{
    double           sum = 0, t;
    int              i;
    msv_proc_stat_t  one, all = { 0, 0 };

    for (i = 0; i < w->n; i++) {
        t = msv_proc_cpu(w->pid[i], &one);
        if (t < 0) {
            fprintf(stderr, "e2e_load: --cpu %s: process %d is gone\n",
                    w->label, (int) w->pid[i]);
            return NAN;
        }
        sum += t;
        all.sys += one.sys;
        all.faults += one.faults;
    }
    if (st) {
        *st = all;
    }
    return sum;
}


void
msv_watch_mem(const msv_watch_t *w, long long *rss, long long *hwm)
{
    char        path[64], line[256];
    long long   v;
    FILE       *f;
    int         i;

    *rss = 0;
    *hwm = 0;
    for (i = 0; i < w->n; i++) {
        snprintf(path, sizeof(path), "/proc/%d/status", (int) w->pid[i]);
        f = fopen(path, "r");
        if (f == NULL) {
            *rss = *hwm = -1;
            return;
        }
        while (fgets(line, sizeof(line), f) != NULL) {
            if (sscanf(line, "VmRSS: %lld", &v) == 1) {
                *rss += v;
            } else if (sscanf(line, "VmHWM: %lld", &v) == 1) {
                *hwm += v;
            }
        }
        fclose(f);
    }
}


long
msv_req_max_tokens(const msv_load_opts_t *o, long idx)
{
    long  n = o->requests;

    if (o->max_tokens_hi <= 0 || n < 2) {
        return o->max_tokens;
    }
    return o->max_tokens + (o->max_tokens_hi - o->max_tokens) * (idx % n)
                           / (n - 1);
}


/* The body of request `idx`: the same prompt and seed in every mode. */

static void
msv_build_request(msv_load_t *L, msv_conn_t *c, int mode)
{
    const msv_load_opts_t  *o = &L->o;
    msv_bytes_t             body = { NULL, 0, 0 };
    char                    num[64], head[512], nfield[32] = "";
    uint64_t                r;
    long                    i;
    int                     n;

    if (o->n > 1) {
        snprintf(nfield, sizeof(nfield), ",\"n\":%ld", o->n);
    }
    msv_bytes_add(&body, "{\"token_ids\":[", 14);
    /* a group of requests shares the prompt; each has its own seed */
    r = msv_mix64(o->seed ^ ((uint64_t) (c->idx / o->group)
                           * 0x9e3779b97f4a7c15ULL));
    for (i = 0; i < o->prompt_len; i++) {
        r = msv_mix64(r + (uint64_t) i + 1);
        n = snprintf(num, sizeof(num), "%s%ld", i ? "," : "",
                     (long) (1 + r % (uint64_t) (o->vocab - 1)));
        msv_bytes_add(&body, num, (size_t) n);
    }

    n = snprintf(head, sizeof(head),
                 "],\"sampling_params\":{\"max_tokens\":%ld,"
                 "\"temperature\":%.17g,\"top_k\":%ld,\"top_p\":%.17g,"
                 "\"ignore_eos\":%s,\"seed\":%llu%s},\"stream\":%s,"
                 "\"return_sampling_mask\":%s%s%s%s}",
                 msv_req_max_tokens(o, c->idx), o->temperature, o->top_k,
                 o->top_p,
                 o->ignore_eos ? "true" : "false",
                 (unsigned long long) ((o->seed + (uint64_t) c->idx)
                                       & 0x7fffffffffffffffULL), nfield,
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
msv_conn_reset(msv_conn_t *c)
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
    c->errbody.n = 0;
    msv_resp_reset(&c->r);
}


/* What the request asks, for the checks of its response: each event
 * alone (the counts over the stream are checked at its end), a body as
 * n whole choices; the client asks no logprobs and does not know the
 * vocabulary. */

static void
msv_conn_expect(msv_load_t *L, msv_conn_t *c, int mode)
{
    msv_resp_t  *r = &c->r;

    r->e.top_k = L->o.top_k;
    r->e.temperature = L->o.temperature;
    r->e.variant = mode;
    r->e.vocab = 0;
    r->e.max_tokens = -1;
    r->e.logprobs = -1;
    r->e.whole = !L->o.stream;
    r->e.n = L->o.n;
    r->stream = L->o.stream;
    r->prompt_len = L->o.prompt_len;
    r->max_tokens = msv_req_max_tokens(&L->o, c->idx);
    r->ignore_eos = L->o.ignore_eos;
    r->abort_ok = 0;
    r->clock = msv_now;
}


/* The next request of this run, if there is one: its index, from the
 * counter the loops share (request i is the same in every run, whichever
 * loop sends it).  1, or 0 when the run issues no more. */

static int
msv_take(msv_load_t *L, long *idx)
{
    msv_share_t  *sh = L->sh;
    int           more;

    if (sh->requests == 0 && msv_now() >= sh->deadline) {
        return 0;
    }
    pthread_mutex_lock(&sh->lock);
    more = sh->requests == 0 || sh->next < sh->requests;
    if (more) {
        *idx = sh->next++;
    }
    pthread_mutex_unlock(&sh->lock);
    return more;
}


static int
msv_conn_start(msv_load_t *L, msv_conn_t *c, long idx)
{
    msv_run_t  *run = &L->run;

    c->idx = idx;
    run->issued++;
    msv_build_request(L, c, run->mode);
    msv_conn_expect(L, c, run->mode);
    msv_conn_reset(c);
    c->t_start = msv_now();
    run->t_issue = c->t_start;

    if (c->state == MSV_C_CLOSED) {
        return msv_conn_connect(L, c);
    }
    c->state = MSV_C_WRITING;
    return msv_conn_watch(L, c, EPOLLOUT, EPOLL_CTL_MOD);
}


/* May this failure be printed?  The first print_errors of a run's loops. */

static int
msv_may_print(msv_share_t *sh, long limit)
{
    int  yes;

    pthread_mutex_lock(&sh->lock);
    yes = sh->printed++ < limit;
    pthread_mutex_unlock(&sh->lock);
    return yes;
}


void
msv_fail(msv_load_t *L, msv_conn_t *c, const char *fmt, ...)
{
    va_list  ap;

    if (c->r.bad[0] != '\0') {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(c->r.bad, sizeof(c->r.bad), fmt, ap);
    va_end(ap);
}


/* The response is over (or failed): account for it and go on. */

void
msv_conn_finish(msv_load_t *L, msv_conn_t *c, int broken)
{
    msv_run_t   *run = &L->run;
    msv_seen_t  *sn;
    double       now = msv_now();
    long         idx;

    run->done++;
    run->t_last = now;
    msv_f64s_push(&run->done_t, now);

    if (c->r.bad[0] == '\0' && !broken) {
        /* the end of the response: checks over the whole of it */
        if (c->status != 200) {
            msv_fail(L, c, "HTTP %d: %.200s", c->status,
                     c->errbody.n ? c->errbody.p : "");
        } else if (!c->ctype_ok) {
            msv_fail(L, c, "wrong Content-Type for %s",
                     L->o.stream ? "a stream" : "a JSON body");
        } else {
            msv_resp_check(&c->r);
        }
    }

    if (c->r.bad[0] == '\0' && !broken) {
        run->ok++;
        run->tokens += c->r.n_tokens;
        run->mask_ids += c->r.n_mask_ids;
        run->events += c->r.n_events;
        run->bytes += c->bytes;
        msv_f64s_push(&run->ok_t, now);
        msv_f64s_push(&run->start_t, c->t_start);
        msv_f64s_push(&run->ttfe, c->r.t_first - c->t_start);
        msv_f64s_push(&run->lat, now - c->t_start);

        /* compared with the other runs once this one is over */
        if (L->n_seen == L->seen_cap) {
            L->seen = msv_grow(L->seen, &L->seen_cap, L->n_seen + 1,
                               sizeof(msv_seen_t));
        }
        sn = &L->seen[L->n_seen++];
        sn->idx = c->idx;
        sn->hash = c->r.hash | 1;     /* never 0 */
        sn->mhash = c->r.mhash | 1;

    } else {
        if (c->r.bad[0] == '\0') {
            msv_fail(L, c, "connection failed");
        }
        run->failed++;
        if (msv_may_print(L->sh, L->o.print_errors)) {
            fprintf(stderr, "e2e_load: request %ld (mask %s): %s\n", c->idx,
                    msv_mode_names[run->mode], c->r.bad);
        }
    }

    if (broken || c->close_after || c->r.bad[0] != '\0') {
        msv_conn_close(L, c);
    } else {
        c->state = MSV_C_IDLE;
        c->reused = 1;
        if (msv_conn_watch(L, c, EPOLLIN, EPOLL_CTL_MOD) != 0) {
            msv_conn_close(L, c);
        }
    }

    if (msv_take(L, &idx)) {
        if (msv_conn_start(L, c, idx) != 0) {
            /* could not even start: count it and let the loop go on */
            run->done++;
            run->failed++;
            msv_conn_close(L, c);
        }
    }
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

    return msv_resp_data(&c->r, p, n);
}


/* The body is complete. */

int
msv_body_end(msv_load_t *L, msv_conn_t *c)
{
    c->http = MSV_H_DONE;

    if (c->status != 200) {
        return 0;
    }
    return msv_resp_end(&c->r);
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


/* One loop's part of a run: its connections until the run issues no
 * more requests and those in flight ended.  L->rc: 0 or -1. */

static void *
msv_loop_run(void *arg)
{
    msv_load_t          *L = arg;
    msv_run_t           *run = &L->run;
    struct epoll_event   evs[256];
    msv_conn_t          *c;
    long                 i, idx;
    double               now;
    int                  n, k;

    L->rc = 0;
    for (i = 0; i < L->n_conns && msv_take(L, &idx); i++) {
        c = &L->conns[i];
        if (msv_conn_start(L, c, idx) != 0) {
            fprintf(stderr, "e2e_load: cannot start a request on "
                    "connection %ld\n", (long) (c - L->conns));
            L->rc = -1;
            return NULL;
        }
    }

    while (run->done < run->issued) {
        n = epoll_wait(L->ep, evs, 256, 100);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            perror("e2e_load: epoll_wait");
            L->rc = -1;
            return NULL;
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
        for (i = 0; i < L->n_conns; i++) {
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
    return NULL;
}


static void
msv_f64s_cat(msv_f64s_t *a, const msv_f64s_t *b)
{
    if (b->n == 0) {
        return;
    }
    if (a->n + b->n > a->cap) {
        a->v = msv_grow(a->v, &a->cap, a->n + b->n, sizeof(double));
    }
    memcpy(a->v + a->n, b->v, b->n * sizeof(double));
    a->n += b->n;
}


/* the slot of request idx in a table of hashes, grown (zeroed) to hold it */

static uint64_t *
msv_hash_slot(uint64_t **t, size_t *cap, long idx)
{
    size_t  need = (size_t) idx + 1, old = *cap;

    if (need > *cap) {
        *t = msv_grow(*t, cap, need, sizeof(uint64_t));
        memset(*t + old, 0, (*cap - old) * sizeof(uint64_t));
    }
    return &(*t)[idx];
}


/* A loop's part into the run, and its valid responses compared with
 * those of earlier runs: the same request gives the same tokens in every
 * mode and run, and the same mask in JSON and packed form. */

static void
msv_run_merge(msv_client_t *C, msv_run_t *run, msv_load_t *L)
{
    msv_run_t   *p = &L->run;
    msv_seen_t  *sn;
    uint64_t    *h;
    size_t       i;
    int          k = msv_mask_of(run->mode) - MSV_MODE_SELECTED;

    run->issued += p->issued;
    run->done += p->done;
    run->ok += p->ok;
    run->failed += p->failed;
    run->tokens += p->tokens;
    run->mask_ids += p->mask_ids;
    run->bytes += p->bytes;
    run->events += p->events;
    run->t_last = p->t_last > run->t_last ? p->t_last : run->t_last;
    run->t_issue = p->t_issue > run->t_issue ? p->t_issue : run->t_issue;
    msv_f64s_cat(&run->done_t, &p->done_t);
    /* parallel arrays, kept aligned */
    msv_f64s_cat(&run->ok_t, &p->ok_t);
    msv_f64s_cat(&run->start_t, &p->start_t);
    msv_f64s_cat(&run->ttfe, &p->ttfe);
    msv_f64s_cat(&run->lat, &p->lat);

    for (i = 0; i < L->n_seen; i++) {
        sn = &L->seen[i];
        if (msv_mask_of(run->mode) != MSV_MODE_OFF) {
            h = msv_hash_slot(&C->mhashes[k], &C->mhashes_cap[k], sn->idx);
            if (*h == 0) {
                *h = sn->mhash;
            } else if (*h != sn->mhash) {
                run->mismatches++;
                if (msv_may_print(&C->sh, C->o.print_errors)) {
                    fprintf(stderr, "e2e_load: request %ld (mask %s): mask "
                            "rows differ from an earlier run of the same "
                            "request\n", sn->idx, msv_mode_names[run->mode]);
                }
            }
        }
        h = msv_hash_slot(&C->hashes, &C->hashes_cap, sn->idx);
        if (*h == 0) {
            *h = sn->hash;
        } else if (*h != sn->hash) {
            run->mismatches++;
            if (msv_may_print(&C->sh, C->o.print_errors)) {
                fprintf(stderr, "e2e_load: request %ld (mask %s): token_ids "
                        "differ from an earlier run of the same request\n",
                        sn->idx, msv_mode_names[run->mode]);
            }
        }
    }
}


int
msv_run(msv_client_t *C, msv_run_t *run, int mode, long requests)
{
    pthread_t   tid[MSV_LOAD_MAX_THREADS];
    msv_load_t *L;
    long        i, t;
    double      cpu0;
    int         rc = 0, err;
    msv_metrics_t  m0, m1;

    memset(run, 0, sizeof(*run));
    run->mode = mode;

    /* outside the CPU samples: the fetches cost nginx a little */
    if (C->o.metrics != NULL
        && msv_metrics_fetch(C->ai, C->o.metrics, &m0) != 0)
    {
        return -1;
    }

    for (i = 0; i < C->o.n_watch; i++) {
        run->wcpu[i] = msv_watch_cpu(&C->o.watch[i], &run->wst[i]);
    }
    cpu0 = msv_cpu_seconds();
    run->t0 = msv_now();
    run->deadline = run->t0 + C->o.duration;
    run->t_last = run->t0;

    C->sh.next = 0;
    C->sh.requests = requests;
    C->sh.deadline = run->deadline;

    for (t = 0; t < C->n_loops; t++) {
        L = &C->loops[t];
        msv_run_free(&L->run);
        L->run.mode = mode;
        L->run.t0 = run->t0;
        L->run.t_last = run->t0;
        L->n_seen = 0;
        L->o.requests = requests;
    }

    /* one loop runs here; several, a thread each (what they share is
     * C->sh, under its lock; each writes only its own loop) */
    if (C->n_loops == 1) {
        msv_loop_run(&C->loops[0]);
    } else {
        for (t = 0; t < C->n_loops; t++) {
            err = pthread_create(&tid[t], NULL, msv_loop_run, &C->loops[t]);
            if (err != 0) {
                fprintf(stderr, "e2e_load: pthread_create: %s\n",
                        strerror(err));
                exit(1);
            }
        }
        for (t = 0; t < C->n_loops; t++) {
            pthread_join(tid[t], NULL);
        }
    }

    run->cpu = msv_cpu_seconds() - cpu0;
    for (i = 0; i < C->o.n_watch; i++) {
        msv_proc_stat_t  st;

        run->wcpu[i] = msv_watch_cpu(&C->o.watch[i], &st) - run->wcpu[i];
        run->wst[i].sys = st.sys - run->wst[i].sys;
        run->wst[i].faults = st.faults - run->wst[i].faults;
        msv_watch_mem(&C->o.watch[i], &run->rss_kb[i], &run->hwm_kb[i]);
    }

    if (C->o.metrics != NULL) {
        if (msv_metrics_fetch(C->ai, C->o.metrics, &m1) != 0) {
            return -1;
        }
        msv_metrics_sub(&m1, &m0, &run->fmt);
    }

    for (t = 0; t < C->n_loops; t++) {
        L = &C->loops[t];
        rc |= L->rc;
        msv_run_merge(C, run, L);
    }
    /* completions in time order: the steady window starts at the conc-th */
    qsort(run->done_t.v, run->done_t.n, sizeof(double), msv_cmp_f64);
    C->total_failed += run->failed;
    C->total_mismatches += run->mismatches;
    return rc;
}


int
msv_client_init(msv_client_t *C)
{
    msv_load_t  *L;
    long         t, per, extra, start = 0, i;

    C->n_loops = C->o.threads < C->o.conc ? C->o.threads : C->o.conc;
    C->conns = calloc((size_t) C->o.conc, sizeof(msv_conn_t));
    C->loops = calloc((size_t) C->n_loops, sizeof(msv_load_t));
    if (C->conns == NULL || C->loops == NULL) {
        fprintf(stderr, "e2e_load: out of memory\n");
        return -1;
    }
    for (i = 0; i < C->o.conc; i++) {
        C->conns[i].fd = -1;
    }
    if ((errno = pthread_mutex_init(&C->sh.lock, NULL)) != 0) {
        perror("e2e_load: pthread_mutex_init");
        return -1;
    }

    /* the connections shared out as evenly as they go */
    per = C->o.conc / C->n_loops;
    extra = C->o.conc % C->n_loops;
    for (t = 0; t < C->n_loops; t++) {
        L = &C->loops[t];
        L->o = C->o;
        L->ai = C->ai;
        L->sh = &C->sh;
        L->conns = C->conns + start;
        L->n_conns = per + (t < extra);
        start += L->n_conns;
        L->ep = epoll_create1(EPOLL_CLOEXEC);
        L->rbuf = malloc(MSV_LOAD_READ_BUF);
        if (L->ep < 0 || L->rbuf == NULL) {
            perror("e2e_load: epoll_create1 or malloc");
            return -1;
        }
    }
    return 0;
}


void
msv_client_free(msv_client_t *C)
{
    msv_load_t  *L;
    long         t, i;

    for (t = 0; t < C->n_loops; t++) {
        L = &C->loops[t];
        for (i = 0; i < L->n_conns; i++) {
            msv_conn_close(L, &L->conns[i]);
            free(L->conns[i].req.p);
            free(L->conns[i].hdr.p);
            free(L->conns[i].errbody.p);
            msv_resp_free(&L->conns[i].r);
        }
        msv_run_free(&L->run);
        free(L->seen);
        free(L->rbuf);
        close(L->ep);
    }
    free(C->loops);
    free(C->conns);
    free(C->hashes);
    free(C->mhashes[0]);
    free(C->mhashes[1]);
    pthread_mutex_destroy(&C->sh.lock);
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
        run->wsys_ms[i] = run->ok ? run->wst[i].sys * 1e3 / (double) run->ok
                                  : NAN;
        run->wfaults[i] = run->ok ? run->wst[i].faults / (double) run->ok
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
        printf(", %s %.2f ms (system %.2f, %.0f page faults)",
               o->watch[i].label, run->wcpu_ms[i], run->wsys_ms[i],
               run->wfaults[i]);
    }
    if (o->metrics != NULL && run->mode != MSV_MODE_OFF) {
        const msv_fmt_count_t  *c = &run->fmt.f[msv_packed_of(run->mode)];

        printf("; formatted in nginx (%s): %.0f rows, %.0f ids in %.2f ms "
               "(%.1f M/s), %.0f logprobs in %.2f ms (%.1f M/s), %.2f MB",
               msv_packed_of(run->mode) ? "packed" : "json", c->rows, c->ids,
               c->ids_s * 1e3, c->ids_s > 0 ? c->ids / c->ids_s / 1e6 : 0,
               c->floats, c->floats_s * 1e3,
               c->floats_s > 0 ? c->floats / c->floats_s / 1e6 : 0,
               c->bytes / 1e6);
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
