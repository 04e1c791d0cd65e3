/*
 * test_gpu_sampler.c: the GPU sampler (kernels/sampling.cu) against the
 * CPU sampler (worker/sampler.c, the reference) on the same logits:
 * random and adversarial rows (ties at the top-k boundary, flat rows, one
 * dominant token, -inf, NaN and +inf entries, values on a grid so that
 * top_k and top_p cut inside a level of ties), every truncation, greedy,
 * penalties over several steps (the GPU keeps the counts), logit bias,
 * min_tokens, every mask mode and top logprobs; at the real vocabulary
 * size (151,936) and an odd one.  Tokens, supports and top ids must be
 * identical; logprobs within 2e-6 (absolute, or relative when larger).
 * The packed rows are parsed as a ring reader would.  And a copy of the
 * packed rows still running when the next run packs over them (as in the
 * worker, where the copy runs beside the next forward) lands what the
 * first run packed.
 *
 * Without CUDA in the build, or without a GPU, the test says so and
 * skips (TAP "1..0 # SKIP").  MSV_GS_QUICK=1 runs the smaller sizes alone
 * (under compute-sanitizer's memcheck), MSV_GS_QUICK=2 V = 4,099 alone
 * (racecheck, synccheck).
 */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "sampler.h"
#include "tap.h"

#ifdef MSV_HAVE_CUDA
#include <cuda_runtime_api.h>
#include "../../kernels/sampling.h"
#endif

#define ROWS     108      /* each shape with each top_k twice (make_row) */
#define STEPS    5
#define MAX_LP   16
#define LP_TOL   2e-6

#ifndef MSV_HAVE_CUDA

int
main(void)
{
    printf("1..0 # SKIP built without CUDA\n");
    return 0;
}

#else

static uint64_t  rng = 0x9e3779b97f4a7c15ULL;

static double
unif(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return ((double) (rng >> 11) + 0.5) / 9007199254740992.0;
}

static double
gauss(void)
{
    return sqrt(-2.0 * log(unif())) * cos(6.283185307179586 * unif());
}


struct row {
    struct msv_params  p;
    struct msv_bias    bias[8];
    int32_t            prompt[6];
    int32_t            out[STEPS];
    uint32_t           shape;
};

static const char *shapes[] = {
    "gaussian", "wide gaussian", "ties at the top-k boundary", "flat",
    "one dominant", "-inf entries", "NaN and +inf entries", "huge values",
    "gaussian on a quarter-nat grid"
};

static void
fill_logits(float *z, uint32_t V, uint32_t shape)
{
    uint32_t  i;

    for (i = 0; i < V; i++) {
        switch (shape) {
        case 0:  z[i] = (float) (3.0 * gauss()); break;
        case 1:  z[i] = (float) (8.0 * gauss()); break;
        case 2:  z[i] = (float) (int) (4.0 * unif()) * 0.5f; break;
        case 3:  z[i] = 1.25f; break;
        case 4:  z[i] = (float) gauss(); break;
        case 5:  z[i] = unif() < 0.3 ? -INFINITY : (float) (2.0 * gauss());
                 break;
        case 6:  z[i] = unif() < 0.01 ? NAN
                        : (unif() < 0.001 ? INFINITY : (float) gauss());
                 break;
        case 7:  z[i] = (float) (1e30 * gauss()); break;
        /* ties at every level, a few hundred ids a level where top_k
         * 1000 and the top_p cuts fall: both cut inside a level */
        default: z[i] = 0.25f * (float) (int) (12.0 * gauss()); break;
        }
    }
    if (shape == 4) {
        z[(uint32_t) (unif() * V) % V] = 40.0f;
    }
}

static void
make_row(struct row *r, uint32_t i, uint32_t V)
{
    static const int32_t  ks[] = { 0, 1, 20, 1000, 8192, -1 };
    static const float    ps[] = { 1.0f, 0.95f, 0.5f };
    uint32_t              j;

    memset(r, 0, sizeof(*r));
    r->shape = i % 9;
    r->p.max_tokens = 16;
    r->p.temperature = i % 13 == 0 ? 0.0f : (float) (0.3 + 1.2 * unif());
    /* row i = 9 a + shape: each shape meets each top_k twice (a % 6),
     * with two different top_p, and each top_p four times */
    r->p.top_k = ks[(i / 9) % 6] == -1 ? (int32_t) V : ks[(i / 9) % 6];
    r->p.top_p = ps[(i / 9 + i / 54 + i % 9) % 3];
    r->p.min_p = i % 5 == 0 ? 0.05f : 0.0f;
    r->p.repetition_penalty = i % 7 == 1 ? 1.3f : 1.0f;
    r->p.frequency_penalty = i % 9 == 2 ? 0.4f : 0.0f;
    r->p.presence_penalty = i % 9 == 2 ? 0.25f : 0.0f;
    r->p.mask_mode = i % 3;
    r->p.logprobs = i % 4 == 0 ? -1 : (i % 4 == 1 ? 0 : (int32_t) (1 + i % MAX_LP));
    r->p.min_tokens = i % 6 == 0 ? 2 : 0;
    r->p.n_stop = i % 6 == 0 ? 2 : 0;
    r->p.stop_ids[0] = 7;
    r->p.stop_ids[1] = (int32_t) V - 1;
    r->p.ignore_eos = i % 12 == 6;
    r->p.seed = 1000 + i;
    r->p.has_seed = 1;
    if (i % 10 == 3) {
        r->p.n_bias = 5;
        for (j = 0; j < 5; j++) {
            r->bias[j].id = (int32_t) ((j * 977 + i) % V);
            r->bias[j].value = (float) (j % 2 ? 3.0 : -2.5);
        }
        r->bias[4].id = r->bias[1].id;      /* a duplicate adds up */
    }
    for (j = 0; j < 6; j++) {
        r->prompt[j] = (int32_t) ((j * 131 + i * 7) % V);
    }
}


/* One packed row, parsed and checked against the CPU's answer. */
static int
compare(const struct msv_row *w, const struct msv_sample_out *o, int rc,
    const struct row *r, uint32_t i, uint32_t t, uint32_t V, uint64_t *lp_bad,
    double *lp_max)
{
    const int32_t         *ids = msv_row_ids(w);
    const float           *lps = msv_row_lps(w);
    const struct msv_top  *top = msv_row_top(w);
    uint32_t               j, n_lps;
    double                 d;

    if (rc != 0) {
        if (w->token != -1) {
            tap_diag("row %u step %u: CPU failed, GPU gave %d", i, t,
                     w->token);
            return 0;
        }
        return 1;
    }
    if (w->token != o->token) {
        tap_diag("row %u step %u (%s, T %g, k %d, p %g, min_p %g): token "
                 "GPU %d CPU %d", i, t, shapes[r->shape],
                 (double) r->p.temperature, r->p.top_k, (double) r->p.top_p,
                 (double) r->p.min_p, w->token, o->token);
        return 0;
    }
    n_lps = r->p.mask_mode == MSV_MASK_SUPPORT ? o->n_support
            : (r->p.mask_mode == MSV_MASK_SELECTED ? 1 : 0);
    if (w->n_support != o->n_support || w->n_lps != n_lps
        || w->n_top != o->n_top
        || w->bytes != msv_row_size(w->n_support, w->n_lps, w->n_top)
        || (uint32_t) w->pos != t || w->mode != r->p.mask_mode)
    {
        tap_diag("row %u step %u (%s, k %d, p %g): support %u/%u lps %u/%u "
                 "top %u/%u bytes %u", i, t, shapes[r->shape], r->p.top_k,
                 (double) r->p.top_p, w->n_support, o->n_support, w->n_lps,
                 n_lps, w->n_top, o->n_top, w->bytes);
        return 0;
    }
    for (j = 0; j < o->n_support; j++) {
        if (ids[j] != o->ids[j]) {
            tap_diag("row %u step %u: support id %u GPU %d CPU %d", i, t, j,
                     ids[j], o->ids[j]);
            return 0;
        }
    }
    for (j = 0; j < o->n_top; j++) {
        if (top[j].id != o->top[j].id) {
            tap_diag("row %u step %u: top %u GPU %d CPU %d", i, t, j,
                     top[j].id, o->top[j].id);
            return 0;
        }
    }

#define LP_CHECK(g, c)                                                   \
    do {                                                                 \
        d = fabs((double) (g) - (double) (c));                           \
        if (d > *lp_max) {                                               \
            *lp_max = d;                                                 \
        }                                                                \
        if (!(d <= LP_TOL * (fabs((double) (c)) > 1 ? fabs((double) (c)) \
                                                    : 1)))               \
        {                                                                \
            (*lp_bad)++;                                                 \
        }                                                                \
    } while (0)

    LP_CHECK(w->logprob, o->logprob);
    if (r->p.mask_mode == MSV_MASK_SUPPORT) {
        for (j = 0; j < o->n_support; j++) {
            LP_CHECK(lps[j], o->lps[j]);
        }
    } else if (r->p.mask_mode == MSV_MASK_SELECTED) {
        LP_CHECK(lps[0], o->logprob);
    }
    for (j = 0; j < o->n_top; j++) {
        LP_CHECK(top[j].lp, o->top[j].lp);
    }
    (void) V;
    return 1;
}


/* all_fast: no row that only the resident kernel takes (logit bias,
 * min_tokens, no truncation), so that it runs only when the streaming
 * kernel leaves it a row (the flat rows overflow its regions). */
static void
run_vocab(uint32_t V, int all_fast)
{
    static const int32_t  eos[2] = { 3, 11 };
    struct msv_gsampler  *g;
    struct msv_sampler   *cpu;
    struct row           *rows;
    struct msv_sample_row *sr;
    struct msv_sample_res *res;
    struct msv_sample_out  o;
    float                *h, *work, *d;
    uint8_t              *pack;
    uint64_t              off, lp_bad = 0, n_rows = 0, n_same = 0, n_ids = 0;
    double                lp_max = 0;
    uint32_t              i, t;
    int                   rc, ok_rows = 1;
    char                  err[256];

    rows = calloc(ROWS, sizeof(*rows));
    sr = calloc(ROWS, sizeof(*sr));
    res = calloc(ROWS, sizeof(*res));
    h = malloc((size_t) ROWS * V * sizeof(float));
    work = malloc((size_t) V * sizeof(float));
    pack = malloc((size_t) ROWS * msv_row_size(V, V, MAX_LP));
    cpu = msv_sampler_new(V);
    g = msv_gsampler_new(V, ROWS, ROWS, MAX_LP, NULL, err, sizeof(err));
    if (!tap_ok(g != NULL && cpu != NULL && rows != NULL && h != NULL
                && pack != NULL, "V %u: GPU sampler created (%s)", V,
                g != NULL ? "ok" : err))
    {
        return;
    }
    if (cudaMalloc((void **) &d, (size_t) ROWS * V * sizeof(float))
        != cudaSuccess)
    {
        tap_ok(0, "V %u: device logits", V);
        return;
    }

    for (i = 0; i < ROWS; i++) {
        make_row(&rows[i], i, V);
        if (all_fast) {
            struct msv_params  *p = &rows[i].p;

            p->n_bias = 0;
            p->min_tokens = 0;
            if (p->temperature != 0.0f && p->top_p == 1.0f
                && p->min_p == 0.0f && p->top_k >= (int32_t) V)
            {
                p->top_k = 1000;
            }
        }
    }

    for (t = 0; t < STEPS; t++) {
        for (i = 0; i < ROWS; i++) {
            fill_logits(h + (size_t) i * V, V, rows[i].shape);
            sr[i].row = i;
            sr[i].slot = i;
            sr[i].cookie = 77 + i;
            sr[i].rq.p = &rows[i].p;
            sr[i].rq.bias = rows[i].bias;
            sr[i].rq.seed = rows[i].p.seed;
            sr[i].rq.t = t;
            sr[i].rq.prompt = rows[i].prompt;
            sr[i].rq.n_prompt = 6;
            sr[i].rq.out = rows[i].out;
            sr[i].rq.eos = eos;
            sr[i].rq.n_eos = 2;
        }
        cudaMemcpy(d, h, (size_t) ROWS * V * sizeof(float),
                   cudaMemcpyHostToDevice);
        rc = msv_gsampler_run(g, d, sr, ROWS, res, err, sizeof(err));
        if (rc == 0) {
            rc = msv_gsampler_copy(g, 0, ROWS, pack, err, sizeof(err));
        }
        if (rc == 0) {
            rc = msv_gsampler_wait(g, err, sizeof(err));
        }
        if (!tap_ok(rc == 0, "V %u step %u: GPU run (%s)", V, t,
                    rc == 0 ? "ok" : err))
        {
            return;
        }

        off = 0;
        for (i = 0; i < ROWS; i++) {
            const struct msv_row  *w = (const struct msv_row *) (pack + off);

            memcpy(work, h + (size_t) i * V, (size_t) V * sizeof(float));
            rc = msv_sample(cpu, work, &sr[i].rq, &o);
            n_rows++;
            if (w->bytes != res[i].bytes || w->slot != i
                || w->cookie != 77 + i || w->token != res[i].token)
            {
                tap_diag("row %u step %u: header does not match the result",
                         i, t);
                ok_rows = 0;
            } else if (compare(w, &o, rc, &rows[i], i, t, V, &lp_bad,
                               &lp_max))
            {
                n_same++;
                n_ids += o.n_support;
            }
            off += w->bytes;
            if (rc == 0) {
                rows[i].out[t] = o.token;
            } else {
                rows[i].out[t] = 0;
            }
        }
    }

    tap_ok(ok_rows, "V %u: every packed row's header is the run's result",
           V);
    {
        unsigned long long  pth[3];
        int                 on = msv_gsampler_paths(g, pth);
        long long           ns = msv_gsampler_sorted(g);
        const char         *sort = getenv("MSV_CUDA_SAMPLER_SORT");

        /* the rows above went through every path of the sampler: the
         * streaming kernel on its prediction and after its histogram,
         * and the resident kernel */
        if (on == 1) {
            tap_ok(pth[0] > 0 && pth[1] > 0 && pth[2] > 0, "V %u%s: rows by "
                   "path: predicted %llu, histogram %llu, resident %llu", V,
                   all_fast ? " (no row only the resident kernel takes)" : "",
                   pth[0], pth[1], pth[2]);
        } else {
            tap_ok(on == 0, "V %u: the resident kernel alone "
                   "(MSV_CUDA_SAMPLER_STREAM=0)", V);
        }

        /* the cuts made on a sort (set in block 0, at most 2,048) ran on
         * some rows, unless turned off; the rounds made the others */
        if (on == 0) {
            tap_ok(ns == 0, "V %u: no cut on a sort counted without the "
                   "streaming kernel (%lld)", V, ns);
        } else if (sort != NULL && strcmp(sort, "0") == 0) {
            tap_ok(ns == 0, "V %u: no cut on a sort with "
                   "MSV_CUDA_SAMPLER_SORT=0 (%lld)", V, ns);
        } else {
            tap_ok(ns > 0, "V %u: %lld rows cut on a sort", V, ns);
        }
    }
    tap_ok(n_same == n_rows, "V %u: %llu of %llu rows identical in token, "
           "support and top ids (%llu support ids)", V,
           (unsigned long long) n_same, (unsigned long long) n_rows,
           (unsigned long long) n_ids);
    tap_ok(lp_bad == 0, "V %u: logprobs within %g (largest difference %.3g, "
           "%llu outside)", V, LP_TOL, lp_max, (unsigned long long) lp_bad);

    cudaFree(d);
    msv_gsampler_free(g);
    msv_sampler_free(cpu);
    free(rows);
    free(sr);
    free(res);
    free(h);
    free(work);
    free(pack);
}


/*
 * A run's rows copied into registered memory while the next run, on other
 * logits, packs: the copy must land the first run's bytes.  The rows are
 * the largest there are (support mode over every id: 8 bytes an id), so
 * the copy (COPY_ROWS x 1.2 MB at 151,936 ids) outlasts the second run's
 * sampling by far and a packing that did not wait would write over what
 * is still being copied.  The reference is the first run again, alone.
 */
#define COPY_ROWS  48

static void *
registered(size_t bytes)
{
    void  *p;
    char   err[256];

    if (posix_memalign(&p, 4096, bytes) != 0) {
        return NULL;
    }
    memset(p, 0, bytes);
    if (msv_cuda_host_register(p, bytes, err, sizeof(err)) != 0) {
        tap_diag("%s", err);
        free(p);
        return NULL;
    }
    return p;
}

static int
run_copy(struct msv_gsampler *g, float *d, const struct msv_sample_row *sr,
    struct msv_sample_res *res, uint8_t *dst, int wait, size_t *bytes)
{
    uint32_t  i;
    char      err[256];

    if (msv_gsampler_run(g, d, sr, COPY_ROWS, res, err, sizeof(err)) != 0
        || msv_gsampler_copy(g, 0, COPY_ROWS, dst, err, sizeof(err)) != 0
        || (wait && msv_gsampler_wait(g, err, sizeof(err)) != 0))
    {
        tap_diag("%s", err);
        return -1;
    }
    *bytes = 0;
    for (i = 0; i < COPY_ROWS; i++) {
        *bytes += res[i].bytes;
    }
    return 0;
}

static void
copy_beside_run(uint32_t V)
{
    struct msv_gsampler    *g;
    struct msv_params       p;
    struct msv_sample_row   sa[COPY_ROWS], sb[COPY_ROWS];
    struct msv_sample_res   res[COPY_ROWS];
    float                  *ha, *hb, *da, *db;
    uint8_t                *x, *y, *z;
    size_t                  cap, na, ny, nz, lb;
    uint32_t                i;
    char                    err[256];
    int                     rc;

    memset(&p, 0, sizeof(p));
    p.max_tokens = 16;
    p.temperature = 1.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    p.mask_mode = MSV_MASK_SUPPORT;
    p.logprobs = -1;

    memset(sa, 0, sizeof(sa));
    memset(sb, 0, sizeof(sb));
    for (i = 0; i < COPY_ROWS; i++) {
        sa[i].row = sb[i].row = i;
        sa[i].slot = i;
        sb[i].slot = COPY_ROWS + i;         /* no state changes hands */
        sa[i].cookie = 500 + i;
        sb[i].cookie = 900 + i;
        sa[i].rq.p = sb[i].rq.p = &p;
        sa[i].rq.seed = 31 + i;
        sb[i].rq.seed = 77 + i;
    }

    cap = (size_t) COPY_ROWS * msv_row_size(V, V, 0);
    lb = (size_t) COPY_ROWS * V * sizeof(float);
    g = msv_gsampler_new(V, COPY_ROWS, 2 * COPY_ROWS, 0, NULL, err,
                         sizeof(err));
    ha = malloc(lb);
    hb = malloc(lb);
    x = registered(cap);
    y = registered(cap);
    z = registered(cap);
    da = db = NULL;
    if (!tap_ok(g != NULL && ha != NULL && hb != NULL && x != NULL
                && y != NULL && z != NULL
                && cudaMalloc((void **) &da, lb) == cudaSuccess
                && cudaMalloc((void **) &db, lb) == cudaSuccess,
                "V %u: copy beside the next run: set up", V))
    {
        return;
    }
    for (i = 0; i < COPY_ROWS; i++) {
        fill_logits(ha + (size_t) i * V, V, 0);
        fill_logits(hb + (size_t) i * V, V, 1);
    }

    /* both uploaded first (a run changes its logits in place): nothing
     * but B's run comes between A's copy starting and B's packing */
    cudaMemcpy(da, ha, lb, cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb, lb, cudaMemcpyHostToDevice);
    rc = run_copy(g, da, sa, res, x, 0, &na);
    rc = rc == 0 ? run_copy(g, db, sb, res, z, 1, &nz) : rc;

    /* the reference: A again, alone */
    cudaMemcpy(da, ha, lb, cudaMemcpyHostToDevice);
    rc = rc == 0 ? run_copy(g, da, sa, res, y, 1, &ny) : rc;

    tap_ok(rc == 0 && na == ny && na == cap && nz == cap,
           "V %u: %u rows of %u ids, %zu bytes copied each run", V,
           COPY_ROWS, V, na);
    tap_ok(rc == 0 && memcmp(x, z, cap) != 0,
           "V %u: the second run packed other bytes (the check can fail)",
           V);
    tap_ok(rc == 0 && memcmp(x, y, cap) == 0,
           "V %u: the copy running while the next run packed landed the "
           "first run's rows, byte for byte", V);

    msv_cuda_host_unregister(x);
    msv_cuda_host_unregister(y);
    msv_cuda_host_unregister(z);
    free(x);
    free(y);
    free(z);
    free(ha);
    free(hb);
    cudaFree(da);
    cudaFree(db);
    msv_gsampler_free(g);
}


int
main(void)
{
    if (msv_cuda_device_count() == 0) {
        printf("1..0 # SKIP no CUDA device\n");
        return 0;
    }
    if (getenv("MSV_GS_QUICK") != NULL) {      /* under a memory checker */
        run_vocab(4099, 0);
        if (strcmp(getenv("MSV_GS_QUICK"), "2") == 0) {
            return tap_done();                 /* racecheck, synccheck */
        }
        run_vocab(32003, 1);
        copy_beside_run(4099);
        return tap_done();
    }
    copy_beside_run(151936);
    run_vocab(151936, 0);
    run_vocab(4099, 0);
    run_vocab(32003, 0);
    run_vocab(32003, 1);
    return tap_done();
}

#endif
