/*
 * gpu_sampler.c: time the GPU sampler (kernels/sampling.cu) on one step's
 * logits already on the device: sampling + capture + packing (the
 * kernels, CUDA events) and the copy of the packed rows into registered
 * host memory (as into the ring), separately, per case and batch size.
 * The copy is timed on the host from its start (msv_gsampler_copy) to
 * its end (msv_gsampler_wait); in the worker it runs beside the next
 * forward instead.
 * The PyTorch way of doing the same work is timed by
 * bench/gpu_sampler_torch.py in the same run (bench/gpu_sampler.sh).
 *
 *   gpu_sampler [-V vocab] [-r repeats] [-s sets] [-p] [-v]
 *
 * -p: also the mean SM cycles of each stage of the sampling kernel for one
 * row (block 0 of its cluster).
 *
 * Each step samples other logits than the step before: NSET sets, the
 * first drawn, the others the same rows in another order, scaled by 0.75
 * to 1.25 and shifted by -1 to 1 nat a row, so that the streaming
 * kernel's floor predicted from a request's previous step is tested as it
 * would be by a model whose logits move from step to step.  -s 1: the
 * same logits every step (the prediction's best case), up to -s 4.
 * -v: the rows each path took, step by step.  Each case is
 * a new set of requests (new cookies).  The rows each path of the sampler
 * took in the timed steps are printed per case.
 *
 * Prints one line per case and a table last.
 */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "sampler.h"

#ifdef MSV_HAVE_CUDA
#include <cuda_runtime_api.h>
#include "../kernels/sampling.h"
#endif

#define NSET 4

#ifndef MSV_HAVE_CUDA
int
main(void)
{
    fprintf(stderr, "gpu_sampler: built without CUDA\n");
    return 1;
}
#else

struct bcase {
    const char  *name;
    int32_t      top_k;
    float        top_p;
    float        min_p;
};

static const struct bcase cases[] = {
    { "top_k 20",              20,   1.0f,  0.0f },
    { "top_k 1000",            1000, 1.0f,  0.0f },
    { "top_k 8192",            8192, 1.0f,  0.0f },
    { "top_k 1024, top_p 0.95", 1024, 0.95f, 0.0f },
    { "min_p 0.05",            0,    1.0f,  0.05f },
    { "whole vocabulary",      0,    1.0f,  0.0f },
};

static uint64_t  rng = 0x2545f4914f6cdd1dULL;

static double
unif(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return ((double) (rng >> 11) + 0.5) / 9007199254740992.0;
}

static double
now_ms(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int
cmp_d(const void *a, const void *b)
{
    double  x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : x > y;
}

int
main(int argc, char **argv)
{
    static const uint32_t  batches[] = { 64, 256 };
    static const char     *modes[] = { "off", "selected", "support" };
    uint32_t               V = 151936, reps = 20, nset = NSET, B, i, bi, ci,
                           mi, r, n;
    int                    opt, prof = 0, verbose = 0;
    double                 cyc[7];
    float                 *h, *hv, *d, *ds[NSET];
    unsigned long long     pa[3], pb[3], pv[3];
    long long              sa = 0;
    uint8_t               *dst;
    size_t                 dst_bytes;
    double                 km[64], cm[64], pm[4][64], kmed, cmed, bytes;
    float                  parts[4];
    struct msv_gsampler   *g;
    struct msv_sample_row *sr;
    struct msv_sample_res *res;
    struct msv_params      p;
    char                   err[256];
    char                   table[8192];
    size_t                 tl = 0;

    while ((opt = getopt(argc, argv, "V:r:s:pv")) != -1) {
        if (opt == 'p') {
            prof = 1;
        } else if (opt == 'v') {
            verbose = 1;
        } else if (opt == 's') {
            nset = (uint32_t) atoi(optarg);
            if (nset < 1 || nset > NSET) {
                fprintf(stderr, "gpu_sampler: -s takes 1 to %d\n", NSET);
                return 2;
            }
        } else if (opt == 'V') {
            V = (uint32_t) atoi(optarg);
        } else if (opt == 'r') {
            reps = (uint32_t) atoi(optarg);
        } else {
            fprintf(stderr, "usage: gpu_sampler [-V vocab] [-r repeats] "
                    "[-s sets] [-p] [-v]\n");
            return 2;
        }
    }
    if (reps < 3 || reps > 64) {
        reps = 20;
    }

    B = 256;
    h = malloc((size_t) B * V * sizeof(float));
    hv = malloc((size_t) B * V * sizeof(float));
    sr = calloc(B, sizeof(*sr));
    res = calloc(B, sizeof(*res));
    dst_bytes = (size_t) B * msv_row_size(V, V, 0);
    dst = malloc(dst_bytes);
    if (h == NULL || hv == NULL || sr == NULL || res == NULL || dst == NULL
        || msv_cuda_host_register(dst, dst_bytes, err, sizeof(err)) != 0)
    {
        fprintf(stderr, "gpu_sampler: out of memory\n");
        return 1;
    }
    /* logits shaped like a model's: most mass on a few hundred ids */
    for (i = 0; i < B * V; i++) {
        double  u = unif();

        h[i] = (float) (2.5 * sqrt(-2.0 * log(u))
                        * cos(6.283185307179586 * unif()));
    }
    for (r = 0; r < NSET; r++) {
        for (i = 0; i < B; i++) {
            const float  *s = h + (size_t) ((i + 37 * r) % B) * V;
            float        *o = hv + (size_t) i * V;
            float         sc = r == 0 ? 1.0f : (float) (0.75 + 0.5 * unif());
            float         sh = r == 0 ? 0.0f : (float) (2.0 * unif() - 1.0);

            for (uint32_t j = 0; j < V; j++) {
                o[j] = s[j] * sc + sh;
            }
        }
        if (cudaMalloc((void **) &ds[r], (size_t) B * V * sizeof(float))
            != cudaSuccess)
        {
            fprintf(stderr, "gpu_sampler: out of device memory\n");
            return 1;
        }
        cudaMemcpy(ds[r], hv, (size_t) B * V * sizeof(float),
                   cudaMemcpyHostToDevice);
    }

    g = msv_gsampler_new(V, B, B, 0, NULL, err, sizeof(err));
    if (g == NULL) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }

    printf("V %u, clusters of the sampling kernel at once: %d of 8 blocks, "
           "%d of 4\n", V, msv_gsampler_clusters(g, 8),
           msv_gsampler_clusters(g, 4));
    if (prof && msv_gsampler_profile(g, cyc) != 0) {
        fprintf(stderr, "gpu_sampler: no memory for the profile\n");
        return 1;
    }
    tl += snprintf(table + tl, sizeof(table) - tl,
                   "| batch | case | mask | blocks a row | kernels ms | copy ms "
                   "| bytes |\n|---|---|---|---|---|---|---|\n");

    for (bi = 0; bi < 2; bi++) {
        n = batches[bi];
        for (ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
            for (mi = 0; mi < 3; mi++) {
                memset(&p, 0, sizeof(p));
                p.max_tokens = 1 << 20;
                p.temperature = 1.0f;
                p.top_k = cases[ci].top_k;
                p.top_p = cases[ci].top_p;
                p.min_p = cases[ci].min_p;
                p.repetition_penalty = 1.0f;
                p.mask_mode = mi;
                p.logprobs = -1;
                for (i = 0; i < n; i++) {
                    sr[i].row = i;
                    sr[i].slot = i;
                    sr[i].cookie = 1 + i + (uint64_t) B
                                   * (1 + mi + 3 * (ci + 16 * bi));
                    sr[i].rq.p = &p;
                    sr[i].rq.seed = 5 + i;
                }
                bytes = 0;
                for (r = 0; r < reps + 2; r++) {
                    double  t0, t1;

                    for (i = 0; i < n; i++) {
                        sr[i].rq.t = r;
                    }
                    d = ds[r % nset];
                    if (r == 2) {
                        msv_gsampler_paths(g, pa);
                        sa = msv_gsampler_sorted(g);
                    }
                    if (verbose) {
                        msv_gsampler_paths(g, pv);
                    }
                    if (msv_gsampler_run(g, d, sr, n, res, err,
                                         sizeof(err)) != 0)
                    {
                        fprintf(stderr, "%s\n", err);
                        return 1;
                    }
                    if (verbose && msv_gsampler_paths(g, pb) == 1) {
                        printf("  step %u: predicted %llu, histogram %llu, "
                               "resident %llu\n", r, pb[0] - pv[0],
                               pb[1] - pv[1], pb[2] - pv[2]);
                    }
                    t0 = now_ms();
                    if (msv_gsampler_copy(g, 0, n, dst, err,
                                          sizeof(err)) != 0
                        || msv_gsampler_wait(g, err, sizeof(err)) != 0)
                    {
                        fprintf(stderr, "%s\n", err);
                        return 1;
                    }
                    t1 = now_ms();
                    if (r >= 2) {
                        km[r - 2] = msv_gsampler_last_ms(g, parts);
                        cm[r - 2] = t1 - t0;
                        pm[0][r - 2] = parts[0];
                        pm[1][r - 2] = parts[1];
                        pm[2][r - 2] = parts[2];
                        pm[3][r - 2] = parts[3];
                    }
                    bytes = 0;
                    for (i = 0; i < n; i++) {
                        bytes += res[i].bytes;
                    }
                }
                qsort(km, reps, sizeof(double), cmp_d);
                qsort(cm, reps, sizeof(double), cmp_d);
                for (i = 0; i < 4; i++) {
                    qsort(pm[i], reps, sizeof(double), cmp_d);
                }
                kmed = km[reps / 2];
                cmed = cm[reps / 2];
                if (msv_gsampler_paths(g, pb) == 1) {
                    printf("  rows by path in the timed steps: predicted "
                           "%llu, histogram %llu, resident %llu; cut on a "
                           "sort %lld\n", pb[0] - pa[0], pb[1] - pa[1],
                           pb[2] - pa[2], msv_gsampler_sorted(g) - sa);
                }
                printf("batch %u, %s, mask %s, %u blocks a row: kernels %.4f "
                       "ms (uploads %.4f, streaming %.4f, resident %.4f, "
                       "packing %.4f), copy %.4f ms (%.0f bytes)\n", n,
                       cases[ci].name, modes[mi], msv_gsampler_last_nc(g),
                       kmed, pm[0][reps / 2], pm[1][reps / 2],
                       pm[2][reps / 2], pm[3][reps / 2], cmed, bytes);
                if (prof && msv_gsampler_profile(g, cyc) > 0) {
                    if (msv_gsampler_paths(g, pb) == 1) {
                        printf("  stage cycles (streaming kernel; the "
                               "resident one's for the rows it took): walk "
                               "and max %.0f, -, histogram and compaction "
                               "%.0f, count %.0f, gather %.0f, select %.0f, "
                               "race+capture %.0f\n", cyc[0] + cyc[1],
                               cyc[2], cyc[3], cyc[4], cyc[5], cyc[6]);
                    } else {
                        printf("  stage cycles: load %.0f, max %.0f, "
                               "histogram %.0f, compaction %.0f, gather "
                               "%.0f, select %.0f, race+capture %.0f\n",
                               cyc[0], cyc[1], cyc[2], cyc[3], cyc[4],
                               cyc[5], cyc[6]);
                    }
                }
                tl += snprintf(table + tl, sizeof(table) - tl,
                               "| %u | %s | %s | %u | %.4f | %.4f | %.0f |\n",
                               n, cases[ci].name, modes[mi],
                               msv_gsampler_last_nc(g), kmed, cmed, bytes);
            }
        }
    }
    printf("\n%s", table);
    msv_gsampler_free(g);
    return 0;
}
#endif
