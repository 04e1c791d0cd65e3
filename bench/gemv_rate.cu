/*
 * gemv_rate.cu: the decode products at batch 1 to 8 (kernels/gemv.cuh)
 * against the rate at which the GPU reads their weights.  Qwen3-8B's
 * shapes, 36 layers of distinct weights (qkv 6144 x 4096, o 4096 x 4096,
 * gate/up 24576 x 4096, down 4096 x 12288) and the lm_head (151936 x
 * 4096): 15.1 GB of bf16, so no launch finds its weights in L2.
 *
 * For each shape of the kernel compared (rows a warp group R, words a
 * lane a round U, warps sharing a row KS, the next round in flight PIPE,
 * warps a block W), and of the batch-invariant mode's fixed-order GEMV
 * (kernels/gemv_fixed.cuh: columns a stage KC, stages a warp's ring S,
 * warps a block NW):
 *  - its outputs against a double-precision sum on the host for sampled
 *    rows of every weight shape, at n = 1 and 8 (a wrong kernel ends the
 *    run); every fixed-order shape's outputs the same bits as the first
 *    one's (the order is the kernel's, not its shape's);
 *  - the step's 145 products in order, captured as one CUDA graph with
 *    programmatic launches, at n = 1, 2, 4 and 8: ms and TB/s of weights;
 *  - each weight shape alone (its 36 launches, one graph), n = 1.
 * Beside them, in the same run: a sequential read of the same 15.1 GB in
 * one launch, the ceiling.  Times are medians of 7 after 2
 * (cuda_bench.h).
 *
 *   gemv_rate
 *
 * Built and run by bench/engine_gpu.sh (nvcc with kernels/cuda_common.cu).
 */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "cuda_bench.h"
#include "gemv.cuh"
#include "gemv_fixed.cuh"

#define TRY(call)  MSV_BENCH_TRY(call)

const char  *msv_bench_prog = "gemv_rate";

#define LAYERS   36
#define SHAPES   5                      /* qkv, o, gate/up, down, lm_head */
#define HIDDEN   4096
#define MAX_N    8
#define SAMPLES  48                     /* rows checked a shape */

struct shape {
    const char  *name;
    uint32_t     rows;
    uint32_t     cols;
    int          accumulate;
    int          count;                 /* weights of the shape a step */
};

static const struct shape  shapes[SHAPES] = {
    { "qkv",     6144,   HIDDEN, 0, LAYERS },
    { "o",       HIDDEN, HIDDEN, 1, LAYERS },
    { "gate/up", 24576,  HIDDEN, 0, LAYERS },
    { "down",    HIDDEN, 12288,  1, LAYERS },
    { "lm_head", 151936, HIDDEN, 0, 1 },
};

typedef cudaError_t (*gemv_fn)(const __nv_bfloat16 *, const __nv_bfloat16 *,
    uint32_t, uint32_t, uint32_t, float *, int, cudaStream_t);

struct variant {
    const char  *name;
    gemv_fn      fn;
    int          fixed;                 /* the fixed-order GEMV */
};

#define V(R, U, KS, P, W)                                                    \
    { P ? "R" #R " U" #U " KS" #KS " W" #W " pipe"                           \
        : "R" #R " U" #U " KS" #KS " W" #W, gemv_launch<R, U, KS, P, W>, 0 }
#define F(KC, S, NW)                                                         \
    { "fixed KC" #KC " S" #S " NW" #NW, gemv_fixed_launch<KC, S, NW>, 1 }

static const struct variant  variants[] = {
    V(2, 4, 1, false, 4),
    V(2, 4, 2, false, 4),
    V(2, 4, 4, false, 4),
    V(2, 4, 4, true, 4),
    V(1, 4, 4, false, 4),
    V(2, 2, 4, false, 4),
    V(4, 2, 4, false, 4),
    V(2, 8, 4, false, 4),
    V(2, 4, 8, false, 8),
    V(1, 4, 8, false, 8),
    V(2, 2, 8, false, 8),
    V(4, 2, 8, false, 8),
    V(2, 1, 8, false, 8),
    V(4, 1, 8, false, 8),
    V(2, 2, 16, false, 16),
    V(2, 1, 16, false, 16),
    F(256, 3, 4),                       /* kernels/gemm.cu's */
    F(128, 6, 4),
    F(256, 4, 4),
    F(128, 4, 4),
    F(128, 8, 4),
    F(64, 12, 4),
    F(128, 6, 2),
    F(128, 4, 8),
};

#define N_VARIANTS  (int) (sizeof(variants) / sizeof(variants[0]))

static __nv_bfloat16  *weights[SHAPES][LAYERS];
static __nv_bfloat16  *act;
static float          *out;

/* the work of one timed run */
struct chain {
    gemv_fn       fn;
    uint32_t      n;
    int           only;                 /* a shape, or -1: the step */
    cudaGraphExec_t  exec;
};

static __global__ void
fill_kernel(__nv_bfloat16 *p, size_t n, uint32_t seed)
{
    size_t    i;
    uint32_t  h;

    for (i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < n;
         i += (size_t) gridDim.x * blockDim.x)
    {
        h = (uint32_t) i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        /* uniform in [-1, 1) */
        p[i] = __float2bfloat16((float) (h >> 8) * (1.0f / 8388608.0f)
                                - 1.0f);
    }
}

/* Every word of p once, streaming; the xor keeps the loads alive. */
static __global__ void
read_kernel(const uint4 *const *p, const size_t *words, int parts,
    uint32_t *sink)
{
    uint32_t  acc;
    uint4     v;
    size_t    i;
    int       j;

    acc = 0;
    for (j = 0; j < parts; j++) {
        for (i = blockIdx.x * (size_t) blockDim.x + threadIdx.x;
             i < words[j]; i += (size_t) gridDim.x * blockDim.x)
        {
            v = __ldcs(p[j] + i);
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    }
    if (acc == 0x12345678u) {
        sink[0] = acc;
    }
}

static void
enqueue(const struct chain *c, cudaStream_t s)
{
    int  l, h;

    for (l = 0; l < LAYERS; l++) {
        for (h = 0; h < SHAPES; h++) {
            if (l >= shapes[h].count || (c->only >= 0 && c->only != h)) {
                continue;
            }
            TRY(c->fn(weights[h][l], act, shapes[h].rows, shapes[h].cols,
                      c->n, out, shapes[h].accumulate, s));
        }
    }
}

static void
run_graph(void *ctx)
{
    struct chain  *c = (struct chain *) ctx;

    TRY(cudaGraphLaunch(c->exec, 0));
}

/* ms of the chain's launches as one graph on a capturing stream */
static float
time_chain(struct chain *c)
{
    cudaStream_t  s;
    cudaGraph_t   g;
    float         ms;

    TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    enqueue(c, s);
    TRY(cudaStreamEndCapture(s, &g));
    TRY(cudaGraphInstantiate(&c->exec, g, 0));
    ms = msv_bench_ms(run_graph, c);
    TRY(cudaGraphExecDestroy(c->exec));
    TRY(cudaGraphDestroy(g));
    TRY(cudaStreamDestroy(s));
    return ms;
}

struct reads {
    const uint4  **p;
    size_t        *words;
    uint32_t      *sink;
    int            parts;
    int            blocks;
};

static void
run_reads(void *ctx)
{
    struct reads  *r = (struct reads *) ctx;

    read_kernel<<<r->blocks, 512>>>(r->p, r->words, r->parts, r->sink);
}

static float
bf16_host(uint16_t b)
{
    uint32_t  u = (uint32_t) b << 16;
    float     f;

    memcpy(&f, &u, 4);
    return f;
}

/* the first fixed-order shape's outputs, [shape][n = 1, MAX_N] */
static float  *fixed_ref[SHAPES][2];

/* v's outputs for sampled rows of every shape, n = 1 and MAX_N, against
 * double sums, and a fixed-order shape's, whole, against the first one's;
 * 0 or -1 (printed) */
static int
check(const struct variant *v, const uint16_t *hact)
{
    static const uint32_t  ns[2] = { 1, MAX_N };
    uint16_t  *row;
    float     *hout;
    double     ref, mag, err, worst;
    uint32_t   r, k, m;
    int        h, i, t, rc;

    row = (uint16_t *) malloc(12288 * sizeof(uint16_t));
    hout = (float *) malloc(151936 * sizeof(float) * MAX_N);
    if (row == NULL || hout == NULL) {
        fprintf(stderr, "gemv_rate: out of host memory\n");
        exit(1);
    }
    rc = 0;
    worst = 0.0;
    for (h = 0; h < SHAPES; h++) {
        const struct shape  *sh = &shapes[h];

        for (t = 0; t < 2; t++) {
            /* accumulate onto 1.0 where the shape accumulates */
            TRY(cudaMemset(out, 0, sizeof(float) * sh->rows * ns[t]));
            if (sh->accumulate) {
                for (i = 0; i < (int) (sh->rows * ns[t]); i++) {
                    hout[i] = 1.0f;
                }
                TRY(cudaMemcpy(out, hout, sizeof(float) * sh->rows * ns[t],
                               cudaMemcpyHostToDevice));
            }
            TRY(v->fn(weights[h][0], act, sh->rows, sh->cols, ns[t], out,
                      sh->accumulate, 0));
            TRY(cudaGetLastError());
            TRY(cudaMemcpy(hout, out, sizeof(float) * sh->rows * ns[t],
                           cudaMemcpyDeviceToHost));
            if (v->fixed && fixed_ref[h][t] == NULL) {
                fixed_ref[h][t] = (float *) malloc(sizeof(float) * sh->rows
                                                   * ns[t]);
                if (fixed_ref[h][t] == NULL) {
                    fprintf(stderr, "gemv_rate: out of host memory\n");
                    exit(1);
                }
                memcpy(fixed_ref[h][t], hout,
                       sizeof(float) * sh->rows * ns[t]);
            } else if (v->fixed
                       && memcmp(fixed_ref[h][t], hout,
                                 sizeof(float) * sh->rows * ns[t]) != 0
                       && rc == 0)
            {
                fprintf(stderr, "gemv_rate: %s: %s n %u: not the bits of "
                        "%s\n", v->name, sh->name, ns[t], "the first "
                        "fixed-order shape");
                rc = -1;
            }
            for (i = 0; i < SAMPLES; i++) {
                /* the first and last rows, and rows spread between */
                r = i == 0 ? 0 : i == SAMPLES - 1
                    ? sh->rows - 1 : (uint32_t) (i * 7919u) % sh->rows;
                TRY(cudaMemcpy(row, weights[h][0] + (size_t) r * sh->cols,
                               sh->cols * 2, cudaMemcpyDeviceToHost));
                for (m = 0; m < ns[t]; m++) {
                    ref = sh->accumulate ? 1.0 : 0.0;
                    mag = 0.0;
                    for (k = 0; k < sh->cols; k++) {
                        double  p = (double) bf16_host(row[k])
                                    * bf16_host(hact[(size_t) m * sh->cols
                                                     + k]);
                        ref += p;
                        mag += fabs(p);
                    }
                    err = fabs(hout[(size_t) m * sh->rows + r] - ref)
                          / (mag > 0 ? mag : 1.0);
                    if (err > worst) {
                        worst = err;
                    }
                    if (err > 1e-5 && rc == 0) {
                        fprintf(stderr, "gemv_rate: %s: %s row %u n %u "
                                "token %u: %.9g, expected %.9g\n", v->name,
                                sh->name, r, ns[t], m,
                                hout[(size_t) m * sh->rows + r], ref);
                        rc = -1;
                    }
                }
            }
        }
    }
    printf("check %-22s worst |error| / sum |terms| %.2e%s\n", v->name,
           worst, rc ? "  FAILED" : "");
    free(row);
    free(hout);
    return rc;
}

int
main(void)
{
    static const uint4  *parts[SHAPES * LAYERS];
    static size_t        words[SHAPES * LAYERS];
    cudaDeviceProp   prop;
    struct reads     rd;
    struct chain     c;
    uint16_t        *hact;
    double           bytes, shape_bytes[SHAPES], read_ms;
    float            ms1, ms2, ms4, ms8, ms;
    size_t           n;
    int              h, l, i, np, failed;
    const uint4    **dparts;
    size_t          *dwords;

    TRY(cudaGetDeviceProperties(&prop, 0));
    msv_cuda_pdl = 1;

    bytes = 0.0;
    np = 0;
    for (h = 0; h < SHAPES; h++) {
        n = (size_t) shapes[h].rows * shapes[h].cols;
        shape_bytes[h] = 2.0 * n * shapes[h].count;
        bytes += shape_bytes[h];
        for (l = 0; l < shapes[h].count; l++) {
            TRY(cudaMalloc((void **) &weights[h][l], n * 2));
            fill_kernel<<<1024, 256>>>(weights[h][l], n,
                                       (uint32_t) (h * 977 + l * 31 + 1));
            TRY(cudaGetLastError());
            parts[np] = (const uint4 *) weights[h][l];
            words[np++] = n / 8;
        }
    }
    TRY(cudaMalloc((void **) &act, 12288 * MAX_N * 2));
    fill_kernel<<<64, 256>>>(act, 12288 * MAX_N, 0xabcdefu);
    TRY(cudaMalloc((void **) &out, sizeof(float) * 151936 * MAX_N));
    TRY(cudaDeviceSynchronize());

    hact = (uint16_t *) malloc(12288 * MAX_N * 2);
    if (hact == NULL) {
        fprintf(stderr, "gemv_rate: out of host memory\n");
        return 1;
    }
    TRY(cudaMemcpy(hact, act, 12288 * MAX_N * 2, cudaMemcpyDeviceToHost));

    printf("gemv_rate: %s, %d SMs; weights of a step %.3f GB "
           "(36 layers + lm_head, bf16)\n", prop.name,
           prop.multiProcessorCount, bytes / 1e9);

    /* the ceiling: every weight once, one launch */
    TRY(cudaMalloc((void **) &dparts, sizeof(parts)));
    TRY(cudaMalloc((void **) &dwords, sizeof(words)));
    TRY(cudaMemcpy(dparts, parts, sizeof(parts), cudaMemcpyHostToDevice));
    TRY(cudaMemcpy(dwords, words, sizeof(words), cudaMemcpyHostToDevice));
    TRY(cudaMalloc((void **) &rd.sink, 4));
    rd.p = dparts;
    rd.words = dwords;
    rd.parts = np;
    rd.blocks = prop.multiProcessorCount * 4;
    read_ms = msv_bench_ms(run_reads, &rd);
    printf("sequential read of the same weights: %.3f ms, %.2f TB/s\n",
           read_ms, bytes / read_ms / 1e9);

    failed = 0;
    for (i = 0; i < N_VARIANTS; i++) {
        if (check(&variants[i], hact) != 0) {
            failed = 1;
        }
    }
    if (failed) {
        fprintf(stderr, "gemv_rate: a kernel's outputs are wrong\n");
        return 1;
    }

    printf("\n| kernel | step n=1 ms | TB/s | of read | n=2 ms | n=4 ms "
           "| n=8 ms | TB/s |");
    for (h = 0; h < SHAPES; h++) {
        printf(" %s n=1 us a launch (TB/s) |", shapes[h].name);
    }
    printf("\n|---|---:|---:|---:|---:|---:|---:|---:|");
    for (h = 0; h < SHAPES; h++) {
        printf("---:|");
    }
    printf("\n");
    for (i = 0; i < N_VARIANTS; i++) {
        c.fn = variants[i].fn;
        c.only = -1;
        c.n = 1;
        ms1 = time_chain(&c);
        c.n = 2;
        ms2 = time_chain(&c);
        c.n = 4;
        ms4 = time_chain(&c);
        c.n = MAX_N;
        ms8 = time_chain(&c);
        printf("| %s | %.3f | %.2f | %.3f | %.3f | %.3f | %.3f | %.2f |",
               variants[i].name, ms1, bytes / ms1 / 1e9, read_ms / ms1, ms2,
               ms4, ms8, bytes / ms8 / 1e9);

        for (h = 0; h < SHAPES; h++) {
            c.n = 1;
            c.only = h;
            ms = time_chain(&c);
            printf(" %.2f (%.2f) |", 1e3 * ms / shapes[h].count,
                   shape_bytes[h] / ms / 1e9);
        }
        printf("\n");
        fflush(stdout);
    }
    return 0;
}
