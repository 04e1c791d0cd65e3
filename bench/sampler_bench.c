/*
 * sampler_bench.c: the CPU sampler on a Qwen-sized vocabulary (151936),
 * per mask mode and truncation, side by side with the brute-force
 * reference (full sort of the vocabulary, t/c/sampler_ref.h).  Every
 * draw is checked against the reference: token, and S in support mode.
 *
 *   sampler_bench [rows [reps]]     defaults: 32 rows, 5 repetitions
 *
 * Logits are bf16-rounded (as a bf16 lm_head gives them, many ties): a
 * normal body (mean -1, sd 2.5) and 24 peaks in [12, 26), roughly the
 * shape of a language model's next-token logits.  Times are CPU time
 * of the calling thread per row (one request, one position), the median
 * over repetitions.
 */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sampler.h"
#include "../t/c/sampler_ref.h"
#include "mix.h"
#include "thread_cpu.h"


#define B_VOCAB     151936
#define B_MAX_REPS  64
#define B_SEED      0x0123456789abcdefull   /* row r draws with B_SEED + r */

static uint64_t  b_rng = 0x5eed;

static double
b_unif(void)
{
    return (double) (msv_splitmix64(&b_rng) >> 11) * 0x1p-53;
}

/* Round to the nearest bf16 (ties to even). */
static float
b_bf16(float x)
{
    uint32_t  u;

    memcpy(&u, &x, sizeof(u));
    u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u;
    memcpy(&x, &u, sizeof(x));
    return x;
}

static void
b_logits(float *z, uint32_t V)
{
    uint32_t  i, n;
    double    u, v;

    for (i = 0; i < V; i++) {
        u = b_unif();
        v = b_unif();
        z[i] = (float) (-1.0 + 2.5 * sqrt(-2.0 * log(u + 0x1p-60))
                                   * cos(2.0 * M_PI * v));
    }
    for (n = 0; n < 24; n++) {
        z[(uint32_t) (b_unif() * V)] = (float) (12.0 + 14.0 * b_unif());
    }
    for (i = 0; i < V; i++) {
        z[i] = b_bf16(z[i]);
    }
}

static int
b_cmp_double(const void *a, const void *b)
{
    double  x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : (x > y);
}

static double
b_median(double *v, int n)
{
    qsort(v, (size_t) n, sizeof(*v), b_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}


struct b_cfg {
    const char  *name;
    float        temperature;
    int32_t      top_k;
    float        top_p;
    float        min_p;
};

static const struct b_cfg  b_cfgs[] = {
    { "greedy",             0.0f,  -1, 1.0f,  0.0f  },
    { "full softmax",       1.0f,  -1, 1.0f,  0.0f  },
    { "top_k 50",           1.0f,  50, 1.0f,  0.0f  },
    { "top_p 0.95",         1.0f,  -1, 0.95f, 0.0f  },
    { "top_k 20 + top_p 0.8", 0.7f, 20, 0.8f, 0.0f  },
    { "min_p 0.05",         1.0f,  -1, 1.0f,  0.05f },
};

#define B_N_CFG    (sizeof(b_cfgs) / sizeof(b_cfgs[0]))
#define B_N_MODES  3

static const char  *b_mode_name[B_N_MODES] = { "off", "selected", "support" };


int
main(int argc, char **argv)
{
    int                    reps, rep, bad;
    float                 *rows, *z;
    uint32_t              *sids;
    double                 t0, total, times[B_MAX_REPS];
    double                 us[B_N_CFG][B_N_MODES], ref_us[B_N_CFG];
    uint32_t               nrows, r, c, m, i, sup_sum[B_N_CFG];
    struct msv_ref         ref;
    struct msv_ref_case    tc;
    struct msv_sample_req  rq;
    struct msv_sample_out  o;
    struct msv_sampler    *s;

    nrows = argc > 1 ? (uint32_t) strtoul(argv[1], NULL, 10) : 32;
    reps = argc > 2 ? atoi(argv[2]) : 5;
    if (nrows == 0 || nrows > 4096 || reps < 1 || reps > B_MAX_REPS) {
        fprintf(stderr, "sampler_bench: rows in [1, 4096], reps in "
                "[1, %d]\n", B_MAX_REPS);
        return 2;
    }

    rows = malloc((size_t) nrows * B_VOCAB * sizeof(float));
    z = malloc(B_VOCAB * sizeof(float));
    sids = malloc(B_VOCAB * sizeof(uint32_t));
    s = msv_sampler_new(B_VOCAB);
    if (rows == NULL || z == NULL || sids == NULL || s == NULL
        || msv_ref_alloc(&ref, B_VOCAB) != 0)
    {
        fprintf(stderr, "sampler_bench: out of memory\n");
        return 1;
    }
    for (r = 0; r < nrows; r++) {
        b_logits(rows + (size_t) r * B_VOCAB, B_VOCAB);
    }

    bad = 0;
    memset(&tc, 0, sizeof(tc));
    tc.V = B_VOCAB;

    for (c = 0; c < B_N_CFG; c++) {
        msv_ref_params(&tc.p);
        tc.p.temperature = b_cfgs[c].temperature;
        tc.p.top_k = b_cfgs[c].top_k;
        tc.p.top_p = b_cfgs[c].top_p;
        tc.p.min_p = b_cfgs[c].min_p;

        /* the reference, once per row; it validates every mode below */
        total = 0.0;
        sup_sum[c] = 0;
        for (r = 0; r < nrows; r++) {
            tc.z0 = rows + (size_t) r * B_VOCAB;
            tc.t = r % MSV_REF_MAX_HIST;
            tc.seed = B_SEED + r;
            t0 = msv_thread_cpu();
            msv_ref_run(&tc, &ref);
            total += msv_thread_cpu() - t0;
            sup_sum[c] += ref.n;

            for (m = 0; m < B_N_MODES; m++) {
                tc.p.mask_mode = m;
                msv_ref_req(&tc, &rq);
                memcpy(z, tc.z0, B_VOCAB * sizeof(float));
                if (msv_sample(s, z, &rq, &o) != 0 || o.token != ref.token) {
                    bad++;
                    continue;
                }
                if (m == MSV_MASK_SUPPORT) {
                    msv_ref_support(&ref, sids);
                    for (i = 0; i < ref.n; i++) {
                        if (o.n_support != ref.n
                            || (uint32_t) o.ids[i] != sids[i])
                        {
                            bad++;
                            break;
                        }
                    }
                }
            }
        }
        ref_us[c] = 1e6 * total / nrows;

        for (m = 0; m < B_N_MODES; m++) {
            tc.p.mask_mode = m;
            for (rep = 0; rep < reps; rep++) {
                total = 0.0;
                for (r = 0; r < nrows; r++) {
                    tc.z0 = rows + (size_t) r * B_VOCAB;
                    tc.t = r % MSV_REF_MAX_HIST;
                    tc.seed = B_SEED + r;
                    msv_ref_req(&tc, &rq);
                    memcpy(z, tc.z0, B_VOCAB * sizeof(float));
                    t0 = msv_thread_cpu();
                    if (msv_sample(s, z, &rq, &o) != 0) {
                        bad++;
                    }
                    total += msv_thread_cpu() - t0;
                }
                times[rep] = 1e6 * total / nrows;
            }
            us[c][m] = b_median(times, reps);
        }
    }

    printf("# sampler_bench: V %u, %u rows, %d repetitions, median "
           "us per row\n", B_VOCAB, nrows, reps);
    printf("# validation: %d mismatches against the reference\n\n", bad);
    printf("| %-22s | %7s | %9s | %9s | %9s | %9s | %12s | %11s |\n",
           "config", "mean |S|", "reference", b_mode_name[0],
           b_mode_name[1], b_mode_name[2], "support/off", "ref/support");
    printf("|%s|%s|%s|%s|%s|%s|%s|%s|\n", "------------------------",
           "---------", "-----------", "-----------", "-----------",
           "-----------", "--------------", "-------------");
    for (c = 0; c < B_N_CFG; c++) {
        printf("| %-22s | %8.1f | %9.1f | %9.1f | %9.1f | %9.1f | %12.2f "
               "| %11.1f |\n", b_cfgs[c].name, (double) sup_sum[c] / nrows,
               ref_us[c], us[c][0], us[c][1], us[c][2],
               us[c][2] / us[c][0], ref_us[c] / us[c][2]);
    }

    msv_ref_free(&ref);
    msv_sampler_free(s);
    free(rows);
    free(z);
    free(sids);
    return bad ? 1 : 0;
}
