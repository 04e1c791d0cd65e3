/*
 * e2e_report.c: the tables of bench/gpu_e2e.sh, from what the run left:
 * the per-run CSV of bench/e2e_load (--csv) and the worker's step log
 * (--step-log), one pair per worker that served (a part of the matrix).
 *
 *   e2e_report CSV_OUT RUNS.csv STEPS.txt [RUNS.csv STEPS.txt ...] > table.md
 *
 * Each run's steps are those that started between its first request and
 * its last completion.  Its steady window: the steps where every sequence
 * of the wave (requests x choices, sampling_params.n) decodes and none
 * prefills; steady tokens/s = tokens
 * sampled in the window / (end of its last step - start of its first).
 * Stage costs are medians over the window (the whole run when there is
 * none): forward, sampling with capture, rows into the ring (with the
 * step log's flush_ns, when it has it: the wait for the last step's
 * copies that the forward did not hide, and their commit), the
 * scheduler's host time, and the gap between steps.  The ratio mask-on /
 * mask-off compares a run with the mask-off run of the same row and
 * repeat: steady tokens/s for waves, client wall time (off / on) for
 * rows whose requests end at different times (staggered, groups).
 *
 * A row label is KIND:BATCH:MAX_TOKENS:TOP_K:TOP_P:STREAM (wave,
 * stagger or grpo; BATCH 64x4 for groups; MAX_TOKENS LO-HI when
 * spread).  The targets are those of the project's end-to-end claim;
 * for a missed one the report names the stage whose cost grew most
 * against mask-off (or, for the absolute mask-off target, the largest
 * stage), with its numbers, and how busy nginx and the client were.
 *
 * Formatting inside nginx (the client's fmt_* columns: the module's
 * maskserve_format_* counters before and after each run, e2e_load
 * --metrics): M ids/s and M float32/s over the time the module spent
 * writing each array, its share of nginx's CPU, and nginx's CPU per
 * 1000-id row (nginx CPU seconds / (mask ids / 1000)).  Targets: JSON
 * support rows formatted at >= 100 M ids/s and >= 40 M float32/s; packed
 * support rows at most a tenth of the nginx CPU per 1000-id row of the
 * JSON support run of the same row and repeat (runs where nginx used
 * under 50 ms of CPU have no such figure: /proc counts 10 ms ticks).
 * Runs of a client without
 * those columns (older CSVs, PART=merge) show "-" there and have no
 * formatting target; nginx CPU per 1000-id row needs only the client's
 * mask_ids and nginx CPU.
 */

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#define MSV_MAX_COLS   64
#define MSV_LINE_MAX   4096

/* the least nginx CPU (s) a run needs for its CPU per 1000-id row */
#define MSV_NGINX_CPU_MIN  0.05

/* one step of the log */
typedef struct {
    double  t0, t1;                 /* seconds */
    long    seqs, decode, prefill, sampled;
    double  fwd, smp, ring, host;   /* ms */
    double  bytes;
} msv_step_t;

/* the stages a step is made of, and the gap before the next */
enum { S_FWD, S_SMP, S_RING, S_HOST, S_GAP, S_TAIL, S_N };

/* S_TAIL is a whole-run total only: no step has it */
static const char  *msv_stage_names[S_N] = {
    "GPU forward", "sampling + capture", "copy into the ring",
    "scheduler host", "between steps (waiting for requests or readers)",
    "after the last step (nginx sending the last bodies, the client "
    "receiving and checking them)"
};

typedef struct {
    /* from the label and the client */
    char    label[128], kind[16], batch[16], maxtok[24], mode[24];
    long    top_k, stream, repeat;
    double  top_p;
    double  t0, t1;
    long    requests, ok, failed, mismatches;
    long    same_tokens;            /* 0: mismatches reported, not failed */
    long    choices;                /* per request (sampling_params.n) */
    double  tokens, bytes, wall, ccpu;
    double  wcpu, wrss, whwm, ncpu, nrss, nhwm;
    double  mask_ids;

    /* formatting inside nginx (NAN: not measured) */
    double  fmt_rows, fmt_ids, fmt_floats, fmt_bytes, fmt_ids_s, fmt_floats_s;
    double  fmt_ids_rate, fmt_floats_rate;      /* M/s */
    double  fmt_share;                          /* of nginx CPU */
    double  ngx_us_krow;                        /* nginx CPU us per 1000 ids */
    int     fmt_met;                            /* -1: no target */
    char    fmt_bound[512];

    /* from the steps */
    long    n_steps, n_win;
    double  steady_tps, step_ms, stage[S_N], ring_mb;
    double  tot[S_N], tot_step;     /* whole-run sums, s */

    double  ratio;                  /* vs off; NAN for off */
    double  target;                 /* NAN: none */
    int     met;                    /* -1: no target */
    char    bound[512];
} msv_row_t;


static msv_step_t  *steps;
static size_t       n_steps, cap_steps;
static msv_row_t   *rows;
static size_t       n_rows, cap_rows;


static int
msv_cmp_dbl(const void *a, const void *b)
{
    double  x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : x > y;
}


static double
msv_median(double *v, size_t n)
{
    if (n == 0) {
        return NAN;
    }
    qsort(v, n, sizeof(double), msv_cmp_dbl);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}


/* The step log's lines into steps[from..]. */
static int
msv_read_steps(const char *path)
{
    char                line[MSV_LINE_MAX], key[32];
    unsigned long long  v[14];
    FILE               *f;
    msv_step_t         *s;
    int                 n, k, off, used;

    f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "e2e_report: %s: %s\n", path, strerror(errno));
        return -1;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        /* step t0_ns t1_ns seqs decode prefill sampled active fwd_ns
         * sample_ns ring_ns ring_bytes host_ns, in that order, then
         * flush_ns in logs that have it */
        v[13] = 0;
        for (k = 0, off = 0; k < 14; k++, off += used) {
            n = sscanf(line + off, "%31s %llu%n", key, &v[k], &used);
            if (n != 2) {
                break;
            }
        }
        if (k < 13) {
            fprintf(stderr, "e2e_report: %s: a line without the 13 fields: "
                    "%s", path, line);
            fclose(f);
            return -1;
        }
        if (n_steps == cap_steps) {
            cap_steps = cap_steps ? 2 * cap_steps : 4096;
            steps = realloc(steps, cap_steps * sizeof(*steps));
            if (steps == NULL) {
                fprintf(stderr, "e2e_report: out of memory\n");
                exit(1);
            }
        }
        s = &steps[n_steps++];
        s->t0 = v[1] / 1e9;
        s->t1 = v[2] / 1e9;
        s->seqs = (long) v[3];
        s->decode = (long) v[4];
        s->prefill = (long) v[5];
        s->sampled = (long) v[6];
        s->fwd = v[8] / 1e6;
        s->smp = v[9] / 1e6;
        s->ring = (v[10] + v[13]) / 1e6;
        s->bytes = (double) v[11];
        s->host = v[12] / 1e6;
    }
    fclose(f);
    return 0;
}


/* Split a CSV line in place. */
static int
msv_split(char *line, char **col)
{
    int  n = 0;

    line[strcspn(line, "\r\n")] = '\0';
    col[n++] = line;
    for (; *line && n < MSV_MAX_COLS; line++) {
        if (*line == ',') {
            *line = '\0';
            col[n++] = line + 1;
        }
    }
    return n;
}


static int
msv_col(char **head, int nh, const char *name)
{
    int  i;

    for (i = 0; i < nh; i++) {
        if (strcmp(head[i], name) == 0) {
            return i;
        }
    }
    return -1;
}


/* One part's steps [s0, s1): the window numbers of each of its runs. */
static void
msv_row_steps(msv_row_t *r, size_t s0, size_t s1)
{
    double     *v[S_N + 2], tps_tok = 0, first = NAN, last = NAN;
    double      end = NAN;              /* the run's last step ended */
    size_t      i, nw = 0, na = 0, cap = s1 - s0 + 1;
    long        wave;
    int         k, use_win;
    msv_step_t *s, *prev;

    for (k = 0; k < S_N + 2; k++) {
        v[k] = malloc(cap * sizeof(double));
    }
    wave = r->requests * r->choices;     /* sequences */
    memset(r->tot, 0, sizeof(r->tot));
    r->tot_step = 0;

    /* the window first, then (none) every step of the run */
    for (use_win = 1; use_win >= 0; use_win--) {
        nw = 0;
        prev = NULL;
        for (i = s0; i < s1; i++) {
            s = &steps[i];
            if (s->t0 < r->t0 || s->t0 > r->t1) {
                continue;
            }
            if (use_win) {
                na++;
                r->tot[S_FWD] += s->fwd / 1e3;
                r->tot[S_SMP] += s->smp / 1e3;
                r->tot[S_RING] += s->ring / 1e3;
                r->tot[S_HOST] += s->host / 1e3;
                r->tot_step += s->t1 - s->t0;
                end = isnan(end) || s->t1 > end ? s->t1 : end;
            }
            if (use_win && !(s->decode == wave && s->prefill == 0)) {
                prev = NULL;
                continue;
            }
            v[S_FWD][nw] = s->fwd;
            v[S_SMP][nw] = s->smp;
            v[S_RING][nw] = s->ring;
            v[S_HOST][nw] = s->host;
            v[S_GAP][nw] = prev != NULL ? (s->t0 - prev->t1) * 1e3 : NAN;
            v[S_TAIL][nw] = NAN;
            v[S_N][nw] = (s->t1 - s->t0) * 1e3;
            v[S_N + 1][nw] = s->bytes / 1e6;
            if (use_win) {
                tps_tok += (double) s->sampled;
                if (isnan(first)) {
                    first = s->t0;
                }
                last = s->t1;
            }
            prev = s;
            nw++;
        }
        if (use_win) {
            r->n_steps = (long) na;
            r->n_win = (long) nw;
            r->steady_tps = nw > 0 && last > first ? tps_tok / (last - first)
                                                   : NAN;
        }
        if (nw > 0) {
            break;
        }
    }

    for (k = 0; k < S_N; k++) {
        size_t  j, m = 0;

        for (j = 0; j < nw; j++) {      /* the gaps: not before the first */
            if (!isnan(v[k][j])) {
                v[k][m++] = v[k][j];
            }
        }
        r->stage[k] = msv_median(v[k], m);
    }
    r->step_ms = msv_median(v[S_N], nw);
    r->ring_mb = msv_median(v[S_N + 1], nw);
    r->tot[S_TAIL] = !isnan(end) && r->t1 > end ? r->t1 - end : 0;
    r->tot[S_GAP] = r->wall - r->tot_step - r->tot[S_TAIL];
    for (k = 0; k < S_N + 2; k++) {
        free(v[k]);
    }
}


/* The client's lines of one part. */
static int
msv_read_runs(const char *path, size_t s0, size_t s1)
{
    char       line[MSV_LINE_MAX], hline[MSV_LINE_MAX], *head[MSV_MAX_COLS],
              *col[MSV_MAX_COLS], *p;
    FILE      *f;
    int        nh, nc;
    msv_row_t *r;

    f = fopen(path, "r");
    if (f == NULL || fgets(hline, sizeof(hline), f) == NULL) {
        fprintf(stderr, "e2e_report: %s: %s\n", path,
                f == NULL ? strerror(errno) : "empty");
        return -1;
    }
    nh = msv_split(hline, head);
#define C(name) (msv_col(head, nh, name) >= 0 \
                 ? col[msv_col(head, nh, name)] : "nan")

    while (fgets(line, sizeof(line), f) != NULL) {
        nc = msv_split(line, col);
        if (nc != nh) {
            fprintf(stderr, "e2e_report: %s: %d columns, header has %d\n",
                    path, nc, nh);
            fclose(f);
            return -1;
        }
        if (n_rows == cap_rows) {
            cap_rows = cap_rows ? 2 * cap_rows : 64;
            rows = realloc(rows, cap_rows * sizeof(*rows));
            if (rows == NULL) {
                fprintf(stderr, "e2e_report: out of memory\n");
                exit(1);
            }
        }
        r = &rows[n_rows++];
        memset(r, 0, sizeof(*r));
        snprintf(r->label, sizeof(r->label), "%s", C("label"));
        snprintf(r->mode, sizeof(r->mode), "%s", C("mode"));

        /* KIND:BATCH:MAX_TOKENS:TOP_K:TOP_P:STREAM */
        p = r->label;
        if (sscanf(p, "%15[^:]:%15[^:]:%23[^:]:%ld:%lf:%ld", r->kind,
                   r->batch, r->maxtok, &r->top_k, &r->top_p, &r->stream)
            != 6)
        {
            fprintf(stderr, "e2e_report: %s: label \"%s\" is not "
                    "KIND:BATCH:MAX_TOKENS:TOP_K:TOP_P:STREAM\n", path, p);
            fclose(f);
            return -1;
        }
        r->repeat = atol(C("repeat"));
        r->t0 = atof(C("t0_ns")) / 1e9;
        r->t1 = atof(C("t1_ns")) / 1e9;
        r->requests = atol(C("requests"));
        r->ok = atol(C("ok"));
        r->failed = atol(C("failed"));
        r->mismatches = atol(C("mismatches"));
        /* absent (a client before the column): differences failed */
        r->same_tokens = strcmp(C("same_tokens"), "nan") == 0
                         || atol(C("same_tokens")) != 0;
        /* absent (a client before the column): one choice each */
        r->choices = atol(C("choices")) > 1 ? atol(C("choices")) : 1;
        r->tokens = atof(C("tokens"));
        r->bytes = atof(C("bytes"));
        r->wall = atof(C("wall_s"));
        r->ccpu = atof(C("client_cpu_s"));
        r->wcpu = atof(C("worker_cpu_s"));
        r->wrss = atof(C("worker_rss_kb")) / 1024;
        r->whwm = atof(C("worker_hwm_kb")) / 1024;
        r->ncpu = atof(C("nginx_cpu_s"));
        r->nrss = atof(C("nginx_rss_kb")) / 1024;
        r->nhwm = atof(C("nginx_hwm_kb")) / 1024;
        r->mask_ids = atof(C("mask_ids"));
        r->fmt_rows = atof(C("fmt_rows"));
        r->fmt_ids = atof(C("fmt_ids"));
        r->fmt_floats = atof(C("fmt_floats"));
        r->fmt_bytes = atof(C("fmt_bytes"));
        r->fmt_ids_s = atof(C("fmt_ids_s"));
        r->fmt_floats_s = atof(C("fmt_floats_s"));
        msv_row_steps(r, s0, s1);
    }
#undef C
    fclose(f);
    return 0;
}


/* The targets: a ratio on/off (or tokens/s for mask off). */
static double
msv_target(const msv_row_t *r)
{
    int  b256 = strcmp(r->batch, "256") == 0;
    int  sel = strncmp(r->mode, "selected", 8) == 0;
    int  sup = strncmp(r->mode, "support", 7) == 0;
    int  packed = strstr(r->mode, "packed") != NULL;

    if (strcmp(r->kind, "wave") == 0 && b256 && r->top_p == 1.0) {
        if (strcmp(r->mode, "off") == 0) {
            return 21000;
        }
        if (sel) {
            return r->top_k == 20 ? 0.99 : r->top_k == 1000 ? 0.98
                   : r->top_k == 8192 ? 0.95 : NAN;
        }
        if (sup) {
            return r->top_k == 1000 ? 0.97
                   : r->top_k == 8192 ? (packed ? 0.95 : 0.85) : NAN;
        }
    }
    if (strcmp(r->kind, "stagger") == 0 && r->top_k == 8192 && sup) {
        return 1 / 1.2;             /* wall within 1.2x of mask off */
    }
    return NAN;
}


static msv_row_t *
msv_off_of(const msv_row_t *r)
{
    size_t  i;

    for (i = 0; i < n_rows; i++) {
        if (strcmp(rows[i].label, r->label) == 0 && rows[i].repeat == r->repeat
            && strcmp(rows[i].mode, "off") == 0)
        {
            return &rows[i];
        }
    }
    return NULL;
}


static int
msv_is_wave(const msv_row_t *r)
{
    return strcmp(r->kind, "wave") == 0;
}


/* The stage that bounds a missed target, with its numbers. */
static void
msv_bound(msv_row_t *r, const msv_row_t *off)
{
    double  d, best = -INFINITY, a = 0, b = 0, ncores, ccores;
    int     k, bk = -1, per_step;
    char    busy[160];

    ncores = r->wall > 0 ? r->ncpu / r->wall : NAN;
    ccores = r->wall > 0 ? r->ccpu / r->wall : NAN;
    snprintf(busy, sizeof(busy), "; nginx %.2f cores busy (%.1f ms CPU per "
             "MB), client %.2f cores", ncores,
             r->bytes > 0 ? r->ncpu * 1e3 / (r->bytes / 1e6) : NAN, ccores);

    if (off == NULL) {                  /* the mask-off throughput */
        for (k = 0; k < S_N; k++) {
            if (!isnan(r->stage[k]) && r->stage[k] > best) {
                best = r->stage[k];
                bk = k;
            }
        }
        snprintf(r->bound, sizeof(r->bound), "%s %.2f of %.2f ms per step "
                 "(%.0f tokens/s needs %.2f ms)%s", bk >= 0
                 ? msv_stage_names[bk] : "?", best, r->step_ms, r->target,
                 atof(r->batch) / r->target * 1e3, busy);
        return;
    }

    per_step = msv_is_wave(r) && r->n_win > 0 && off->n_win > 0;
    for (k = 0; k < S_N; k++) {
        if (per_step) {
            d = r->stage[k] - off->stage[k];
        } else {
            d = r->tot[k] - off->tot[k];
        }
        if (!isnan(d) && d > best) {
            best = d;
            bk = k;
            a = per_step ? off->stage[k] : off->tot[k];
            b = per_step ? r->stage[k] : r->tot[k];
        }
    }
    if (bk < 0) {
        snprintf(r->bound, sizeof(r->bound), "no stage measured");
        return;
    }
    snprintf(r->bound, sizeof(r->bound), "%s: %+.3f %s (%.3f off, %.3f on)%s",
             msv_stage_names[bk], best, per_step ? "ms per step"
             : "s over the run", a, b, busy);
}


/* The formatting numbers of a run, from its fmt_* columns. */
static void
msv_fmt_rates(msv_row_t *r)
{
    double  t = r->fmt_ids_s + r->fmt_floats_s;

    r->fmt_ids_rate = r->fmt_ids_s > 0 ? r->fmt_ids / r->fmt_ids_s / 1e6
                                       : NAN;
    r->fmt_floats_rate = r->fmt_floats_s > 0
                         ? r->fmt_floats / r->fmt_floats_s / 1e6 : NAN;
    r->fmt_share = t > 0 && r->ncpu > 0 ? t / r->ncpu : NAN;
    /* /proc counts CPU time in 10 ms ticks: less than 5 is not a number */
    r->ngx_us_krow = r->mask_ids > 0 && r->ncpu >= MSV_NGINX_CPU_MIN
                     ? r->ncpu * 1e6 / (r->mask_ids / 1000) : NAN;
}


static msv_row_t *
msv_mode_of(const msv_row_t *r, const char *mode)
{
    size_t  i;

    for (i = 0; i < n_rows; i++) {
        if (strcmp(rows[i].label, r->label) == 0 && rows[i].repeat == r->repeat
            && strcmp(rows[i].mode, mode) == 0)
        {
            return &rows[i];
        }
    }
    return NULL;
}


/*
 * The formatting targets: JSON support at >= 100 M ids/s and >= 40 M
 * float32/s inside the module; packed support at most a tenth of JSON's
 * nginx CPU per 1000-id row.  A missed one names its bound.
 */
static void
msv_fmt_target(msv_row_t *r)
{
    msv_row_t  *j;
    double      us_fmt, us_rest;

    r->fmt_met = -1;

    if (strcmp(r->mode, "support") == 0 && !isnan(r->fmt_ids_rate)
        && !isnan(r->fmt_floats_rate))
    {
        r->fmt_met = r->fmt_ids_rate >= 100 && r->fmt_floats_rate >= 40;
        if (!r->fmt_met) {
            snprintf(r->fmt_bound, sizeof(r->fmt_bound), "%s%s: ids %.1f M/s "
                     "(%.2f ns each) against >= 100, float32 %.1f M/s (%.2f "
                     "ns each) against >= 40, over %.0f rows of %.0f ids",
                     r->fmt_ids_rate < 100 ? "the ids" : "",
                     r->fmt_floats_rate < 40
                     ? (r->fmt_ids_rate < 100 ? " and the logprobs"
                                              : "the logprobs") : "",
                     r->fmt_ids_rate, 1e3 / r->fmt_ids_rate,
                     r->fmt_floats_rate, 1e3 / r->fmt_floats_rate,
                     r->fmt_rows, r->fmt_rows > 0 ? r->fmt_ids / r->fmt_rows
                                                  : NAN);
        }
        return;
    }

    if (strcmp(r->mode, "support-packed") == 0 && !isnan(r->ngx_us_krow)
        && (j = msv_mode_of(r, "support")) != NULL && !isnan(j->ngx_us_krow))
    {
        r->fmt_met = r->ngx_us_krow <= j->ngx_us_krow / 10;
        if (!r->fmt_met) {
            us_fmt = r->fmt_ids > 0
                     ? (r->fmt_ids_s + r->fmt_floats_s) * 1e6
                       / (r->fmt_ids / 1000) : NAN;
            us_rest = r->ngx_us_krow - us_fmt;
            snprintf(r->fmt_bound, sizeof(r->fmt_bound), "nginx CPU %.2f us "
                     "per 1000-id row packed against %.2f JSON (%.1fx less; "
                     "needs 10x): of packed's, base64 %.2f us, the rest of "
                     "nginx (ring reading, chains, sends) %.2f us",
                     r->ngx_us_krow, j->ngx_us_krow,
                     j->ngx_us_krow / r->ngx_us_krow, us_fmt, us_rest);
        }
    }
}


static void
msv_fmt(char *buf, size_t n, const char *fmt, double v)
{
    if (isnan(v)) {
        snprintf(buf, n, "-");
    } else {
        snprintf(buf, n, fmt, v);
    }
}


int
main(int argc, char **argv)
{
    FILE       *csv;
    size_t      i, s0;
    int         a, bad = 0;
    long        differ = 0, loose = 0;
    msv_row_t  *r, *off;
    double      rmin = INFINITY, rmax = -INFINITY;
    char        f[12][32];

    if (argc < 4 || (argc - 2) % 2 != 0) {
        fprintf(stderr, "usage: e2e_report CSV_OUT RUNS.csv STEPS.txt "
                "[RUNS.csv STEPS.txt ...]\n");
        return 2;
    }
    for (a = 2; a < argc; a += 2) {
        s0 = n_steps;
        if (msv_read_steps(argv[a + 1]) != 0
            || msv_read_runs(argv[a], s0, n_steps) != 0)
        {
            return 1;
        }
    }

    for (i = 0; i < n_rows; i++) {
        msv_fmt_rates(&rows[i]);
    }

    for (i = 0; i < n_rows; i++) {
        r = &rows[i];
        msv_fmt_target(r);
        off = msv_off_of(r);
        r->ratio = NAN;
        if (strcmp(r->mode, "off") != 0 && off != NULL) {
            r->ratio = msv_is_wave(r) ? r->steady_tps / off->steady_tps
                                      : off->wall / r->wall;
        }
        r->target = msv_target(r);
        r->met = -1;
        if (!isnan(r->target)) {
            double  v = strcmp(r->mode, "off") == 0 ? r->steady_tps
                                                    : r->ratio;

            r->met = !isnan(v) && v >= r->target;
            if (!r->met) {
                msv_bound(r, strcmp(r->mode, "off") == 0 ? NULL : off);
            }
        }
        if (r->wrss > 0) {
            rmin = r->wrss < rmin ? r->wrss : rmin;
            rmax = r->wrss > rmax ? r->wrss : rmax;
        }
        bad += r->failed > 0 || r->ok != r->requests
               || (r->same_tokens && r->mismatches > 0);
        if (!r->same_tokens) {
            loose++;
            differ += r->mismatches;
        }
    }

    csv = fopen(argv[1], "w");
    if (csv == NULL) {
        fprintf(stderr, "e2e_report: %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    fprintf(csv, "row,kind,batch,max_tokens,top_k,top_p,stream,mode,repeat,"
            "requests,ok,failed,mismatches,tokens,steps,steady_steps,"
            "steady_tok_s,client_wall_s,client_tok_s,ratio,target,met,"
            "step_ms,fwd_ms,sample_ms,ring_ms,host_ms,gap_ms,ring_mb_step,"
            "fwd_s,sample_s,ring_s,host_s,between_steps_s,after_steps_s,wire_mb_s,"
            "nginx_cpu_s,nginx_cpu_ms_per_mb,client_cpu_s,"
            "client_cpu_ms_per_mb,worker_cpu_s,worker_rss_mb,worker_hwm_mb,"
            "nginx_rss_mb,nginx_hwm_mb,bound,mask_ids,fmt_rows,fmt_ids,"
            "fmt_floats,fmt_bytes,fmt_ids_s,fmt_floats_s,fmt_ids_m_s,"
            "fmt_floats_m_s,fmt_share_of_nginx_cpu,nginx_cpu_us_per_1000_ids,"
            "fmt_met,fmt_bound\n");
    for (i = 0; i < n_rows; i++) {
        r = &rows[i];
        fprintf(csv, "%s,%s,%s,%s,%ld,%g,%ld,%s,%ld,%ld,%ld,%ld,%ld,%.0f,"
                "%ld,%ld,%.1f,%.3f,%.1f,%.4f,%g,%d,%.3f,%.3f,%.3f,%.3f,%.3f,"
                "%.3f,%.4f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.2f,%.3f,%.3f,%.3f,%.3f,"
                "%.3f,%.0f,%.0f,%.0f,%.0f,\"%s\",%.0f,%.0f,%.0f,%.0f,%.0f,"
                "%.6f,%.6f,%.2f,%.2f,%.4f,%.3f,%d,\"%s\"\n", r->label, r->kind,
                r->batch, r->maxtok, r->top_k, r->top_p, r->stream, r->mode,
                r->repeat, r->requests, r->ok, r->failed, r->mismatches,
                r->tokens, r->n_steps, r->n_win, r->steady_tps, r->wall,
                r->wall > 0 ? r->tokens / r->wall : NAN, r->ratio, r->target,
                r->met, r->step_ms, r->stage[S_FWD], r->stage[S_SMP],
                r->stage[S_RING], r->stage[S_HOST], r->stage[S_GAP],
                r->ring_mb, r->tot[S_FWD], r->tot[S_SMP], r->tot[S_RING],
                r->tot[S_HOST], r->tot[S_GAP], r->tot[S_TAIL],
                r->wall > 0 ? r->bytes / r->wall / 1e6 : NAN, r->ncpu,
                r->bytes > 0 ? r->ncpu * 1e3 / (r->bytes / 1e6) : NAN,
                r->ccpu, r->bytes > 0 ? r->ccpu * 1e3 / (r->bytes / 1e6) : NAN,
                r->wcpu, r->wrss, r->whwm, r->nrss, r->nhwm, r->bound,
                r->mask_ids, r->fmt_rows, r->fmt_ids, r->fmt_floats,
                r->fmt_bytes, r->fmt_ids_s, r->fmt_floats_s, r->fmt_ids_rate,
                r->fmt_floats_rate, r->fmt_share, r->ngx_us_krow, r->fmt_met,
                r->fmt_bound);
    }
    if (fclose(csv) != 0) {
        fprintf(stderr, "e2e_report: %s: write failed\n", argv[1]);
        return 1;
    }

    printf("| row | mask | steady tok/s | on/off | target | client wall s "
           "| step ms | forward ms | sample+capture ms | ring copy ms | "
           "host ms | gap ms | wire MB/s | nginx CPU ms/MB | client CPU "
           "ms/MB | worker RSS MB (max) | nginx RSS MB (max) |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
           "---|---|\n");
    for (i = 0; i < n_rows; i++) {
        r = &rows[i];
        msv_fmt(f[0], 32, "%.0f", r->steady_tps);
        msv_fmt(f[1], 32, "%.3f", r->ratio);
        if (isnan(r->target)) {
            snprintf(f[2], 32, "-");
        } else {
            snprintf(f[2], 32, r->target > 10 ? ">= %.0f %s" : ">= %.3f %s",
                     r->target, r->met ? "met" : "**missed**");
        }
        msv_fmt(f[3], 32, "%.3f", r->step_ms);
        msv_fmt(f[4], 32, "%.3f", r->stage[S_FWD]);
        msv_fmt(f[5], 32, "%.3f", r->stage[S_SMP]);
        msv_fmt(f[6], 32, "%.3f", r->stage[S_RING]);
        msv_fmt(f[7], 32, "%.3f", r->stage[S_HOST]);
        msv_fmt(f[8], 32, "%.3f", r->stage[S_GAP]);
        printf("| %s%s | %s | %s%s | %s | %s | %.2f | %s | %s | %s | %s | %s "
               "| %s | %.1f | %.2f | %.2f | %.0f (%.0f) | %.0f (%.0f) |\n",
               r->label, r->repeat > 1 ? " r2" : "", r->mode, f[0],
               r->n_win > 0 ? "" : " (no window)", f[1], f[2], r->wall, f[3],
               f[4], f[5], f[6], f[7], f[8],
               r->wall > 0 ? r->bytes / r->wall / 1e6 : NAN,
               r->bytes > 0 ? r->ncpu * 1e3 / (r->bytes / 1e6) : NAN,
               r->bytes > 0 ? r->ccpu * 1e3 / (r->bytes / 1e6) : NAN,
               r->wrss, r->whwm, r->nrss, r->nhwm);
    }

    printf("\nFormatting inside nginx, from the module's /metrics before and "
           "after each run (maskserve_format_*): rates over the time spent "
           "writing each array (CLOCK_MONOTONIC around each row's arrays), "
           "format share = that time / nginx CPU, nginx CPU per 1000-id row "
           "= nginx CPU / (mask ids / 1000), \"-\" when nginx used under "
           "50 ms of CPU in the run.  Targets: JSON support >= 100 M "
           "ids/s and >= 40 M float32/s; packed support nginx CPU per "
           "1000-id row <= JSON's / 10 (same row).\n\n");
    printf("| row | mask | rows | ids/row | ids M/s | float32 M/s | format "
           "ms | MB written | format share of nginx CPU | nginx CPU us per "
           "1000-id row | target |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (i = 0; i < n_rows; i++) {
        r = &rows[i];
        if (strcmp(r->mode, "off") == 0) {
            continue;
        }
        msv_fmt(f[0], 32, "%.0f", r->fmt_rows);
        msv_fmt(f[1], 32, "%.1f", r->fmt_rows > 0 ? r->fmt_ids / r->fmt_rows
                                                  : NAN);
        msv_fmt(f[2], 32, "%.1f", r->fmt_ids_rate);
        msv_fmt(f[3], 32, "%.1f", r->fmt_floats_rate);
        msv_fmt(f[4], 32, "%.2f", (r->fmt_ids_s + r->fmt_floats_s) * 1e3);
        msv_fmt(f[5], 32, "%.2f", r->fmt_bytes / 1e6);
        msv_fmt(f[6], 32, "%.3f", r->fmt_share);
        msv_fmt(f[7], 32, "%.2f", r->ngx_us_krow);
        snprintf(f[8], 32, "%s", r->fmt_met < 0 ? "-" : r->fmt_met ? "met"
                                 : "**missed**");
        printf("| %s%s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
               r->label, r->repeat > 1 ? " r2" : "", r->mode, f[0], f[1],
               f[2], f[3], f[4], f[5], f[6], f[7], f[8]);
    }

    printf("\nMissed targets and the stage that bounds each (computed from "
           "the stage columns):\n\n");
    a = 0;
    for (i = 0; i < n_rows; i++) {
        r = &rows[i];
        if (r->met == 0) {
            msv_fmt(f[0], 32, r->target > 10 ? "%.0f" : "%.3f",
                    strcmp(r->mode, "off") == 0 ? r->steady_tps : r->ratio);
            msv_fmt(f[1], 32, r->target > 10 ? "%.0f" : "%.3f", r->target);
            printf("- %s %s: %s against >= %s: %s\n", r->label, r->mode,
                   f[0], f[1], r->bound);
            a++;
        }
        if (r->fmt_met == 0) {
            printf("- %s %s, formatting: %s\n", r->label, r->mode,
                   r->fmt_bound);
            a++;
        }
    }
    if (a == 0) {
        printf("- none\n");
    }
    if (rmax >= rmin) {
        printf("\nWorker RSS at the end of each row: %.0f to %.0f MB (spread "
               "%.0f MB over every row: output lengths and mask sizes of the "
               "matrix; target: independent of both, met when the spread "
               "is under 64 MB: %s)\n", rmin, rmax, rmax - rmin,
               rmax - rmin < 64 ? "met" : "**missed**");
    }
    if (bad) {
        printf("\nvalidation: **FAILED** (see the failed and mismatches "
               "columns of the CSV)\n");
    } else if (loose == 0) {
        printf("\nvalidation: every response valid, token_ids identical "
               "across the modes of each row\n");
    } else {
        printf("\nvalidation: every response valid; %ld difference%s in "
               "%ld runs (a request's token_ids or mask rows unlike the "
               "same request's in an earlier mode of its row; counted, not "
               "failed: e2e_load --same-tokens 0, for a worker outside "
               "--batch-invariant, whose logits depend on the batch)\n",
               differ, differ == 1 ? "" : "s", loose);
    }
    return bad ? 1 : 0;
}
