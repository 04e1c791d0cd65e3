/*
 * load.h: the load driver of the e2e load client: its options, runs (a
 * mode at a load) and their statistics.  The driver keeps `conc`
 * requests in flight over the connections of http.c, shared out among
 * `threads` loops (a thread each, its own epoll set and connections),
 * which take the next request index from one counter, account for each
 * response when it ends (resp.c checks it) in their own part of the run;
 * the parts are merged when the run ends, and the tokens and masks of a
 * request compared over the modes and repeats; the summary of a run is
 * taken over its steady window.
 */

#ifndef MSV_E2E_LOAD_H
#define MSV_E2E_LOAD_H

#include <netdb.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "array.h"
#include "check.h"
#include "http.h"
#include "metrics.h"


#define MSV_LOAD_MAX_CONC     4096
#define MSV_LOAD_MAX_THREADS  64
#define MSV_LOAD_MAX_REPEATS  64
#define MSV_LOAD_MAX_WATCH    4
#define MSV_LOAD_WATCH_PIDS   32


/* server processes whose CPU time is sampled around every run */
typedef struct {
    const char  *label;
    int          n;
    pid_t        pid[MSV_LOAD_WATCH_PIDS];
} msv_watch_t;

/* what /proc says of a watched process besides its CPU time */
typedef struct {
    double       sys;               /* system CPU seconds */
    double       faults;            /* minor page faults */
} msv_proc_stat_t;

typedef struct {
    const char  *host;
    const char  *port;
    long         conc;
    long         requests;          /* per run; 0: use duration */
    double       duration;          /* seconds per run */
    long         max_tokens;
    long         max_tokens_hi;     /* > 0: request i of a run asks
                                       max_tokens + (hi - max_tokens) *
                                       i / (requests - 1) */
    long         group;             /* requests that share one prompt */
    long         n;                 /* sampling_params.n: choices each */
    long         threads;           /* loops, a thread each */
    const char  *csv;               /* a line per run appended here */
    const char  *label;             /* its first column */
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
    int          same_tokens;       /* 0: runs may differ in token_ids */
    int          modes[MSV_N_MODES];
    int          n_modes;
    msv_watch_t  watch[MSV_LOAD_MAX_WATCH];
    int          n_watch;
    const char  *metrics;           /* GET it around every run; NULL: no */
} msv_load_opts_t;


typedef struct {
    int          mode;
    long         issued;
    long         done;
    long         ok;
    long         failed;
    long         mismatches;        /* token_ids differ from another run */
    long long    tokens;            /* of the valid responses, all choices */
    long long    mask_ids;
    long long    bytes;
    long         events;
    double       t0;
    double       t_last;            /* the last completion */
    double       t_issue;           /* the last request issued */
    double       deadline;          /* duration mode */
    double       cpu;               /* client CPU seconds, all threads */
    double       wcpu[MSV_LOAD_MAX_WATCH];  /* watched processes' */
    msv_proc_stat_t  wst[MSV_LOAD_MAX_WATCH];  /* their system part, faults */
    long long    rss_kb[MSV_LOAD_MAX_WATCH];  /* their VmRSS at the end */
    long long    hwm_kb[MSV_LOAD_MAX_WATCH];  /* and VmHWM (peaks) */
    msv_metrics_t  fmt;             /* --metrics: what nginx formatted */
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
    double       wsys_ms[MSV_LOAD_MAX_WATCH];
    double       wfaults[MSV_LOAD_MAX_WATCH];  /* minor faults per response */
    double       ttfe50, ttfe99, lat50, lat99;
} msv_run_t;


/* a valid response of a run: for the comparisons over the runs */
typedef struct {
    long         idx;               /* the request */
    uint64_t     hash;              /* its token ids (never 0) */
    uint64_t     mhash;             /* its mask rows (never 0) */
} msv_seen_t;

/* what the loops of a run share */
typedef struct {
    pthread_mutex_t   lock;         /* guards next and printed */
    long              next;         /* the next request index */
    long              printed;      /* failures printed so far */
    long              requests;     /* of this run; 0: until deadline */
    double            deadline;
} msv_share_t;

/* one loop: a thread, its connections and its part of the run */
struct msv_load_s {
    msv_load_opts_t   o;            /* a copy of the client's */
    int               ep;
    struct addrinfo  *ai;
    msv_conn_t       *conns;        /* its share of the client's */
    long              n_conns;
    msv_run_t         run;          /* its part of the current run */
    msv_seen_t       *seen;         /* its valid responses in the run */
    size_t            n_seen, seen_cap;
    msv_share_t      *sh;
    char             *rbuf;
    int               rc;           /* of the loop: 0 or -1 */
};

/* the client: its loops, and what the runs compare */
typedef struct {
    msv_load_opts_t   o;
    struct addrinfo  *ai;
    msv_conn_t       *conns;        /* all of them */
    msv_load_t       *loops;
    long              n_loops;
    msv_share_t       sh;
    uint64_t         *hashes;       /* per request index; 0: not yet */
    size_t            hashes_cap;
    uint64_t         *mhashes[2];   /* mask ids, selected and support */
    size_t            mhashes_cap[2];
    long long         total_failed;
    long long         total_mismatches;
} msv_client_t;


/* Monotonic seconds. */
double msv_now(void);

/*
 * CPU seconds of the watched processes of one label (their system time and
 * minor page faults in *st unless NULL); NAN if one is gone.
 */
double msv_watch_cpu(const msv_watch_t *w, msv_proc_stat_t *st);

/* Resident memory of the watched processes of one label, summed (kB):
 * now and their peaks.  -1 in both if one is gone. */
void msv_watch_mem(const msv_watch_t *w, long long *rss, long long *hwm);

/* max_tokens of request idx of a run. */
long msv_req_max_tokens(const msv_load_opts_t *o, long idx);

/* The client's loops over its connections (o.threads, at most one per
 * connection); 0 or -1. */
int msv_client_init(msv_client_t *C);
void msv_client_free(msv_client_t *C);

/* One run of `requests` (0: for o.duration) in mode `mode`, its loops in
 * threads of their own (one loop: this thread); 0 or -1. */
int msv_run(msv_client_t *C, msv_run_t *run, int mode, long requests);
void msv_run_free(msv_run_t *run);

/* The numbers of a run over its steady window, and their line. */
void msv_run_summary(const msv_load_opts_t *o, msv_run_t *run);
void msv_run_print(const msv_load_opts_t *o, msv_run_t *run, long rep);

/* The median of v (sorts it in place). */
double msv_median(double *v, long n);

/* The first failure of the connection's response (later ones are dropped). */
void msv_fail(msv_load_t *L, msv_conn_t *c, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The response is over (broken: the connection failed): account for it. */
void msv_conn_finish(msv_load_t *L, msv_conn_t *c, int broken);

/* Decoded body bytes, and the end of the body. */
int msv_body_data(msv_load_t *L, msv_conn_t *c, const char *p, size_t n);
int msv_body_end(msv_load_t *L, msv_conn_t *c);


#endif /* MSV_E2E_LOAD_H */
