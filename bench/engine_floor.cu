/*
 * engine_floor.cu: the decode floor of a model preset on this GPU,
 * measured: the cuBLAS bf16 time of one decode step's products at batch
 * M (every layer's own weights, so they come from device memory, and
 * the lm_head), plus the bf16 KV bytes that step reads over the measured
 * device copy rate.  Built and run by bench/engine.sh beside the worker
 * benchmark, so the floor comes from the same run.
 *
 *   engine_floor PRESET MEAN_CTX M [M ...]
 *
 * Prints one line per M: "floor M gemm_ms lm_ms kv_ms floor_ms tok_s",
 * after "copy_tb_s X".  Each time is the median of 7 runs after 2
 * (cuda_bench.h).
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>

#include "model.h"
#include "cuda_bench.h"

#define TRY(call)   MSV_BENCH_TRY(call)
#define BTRY(call)  MSV_BENCH_BTRY(call)

const char  *msv_bench_prog = "engine_floor";


static __global__ void
fill_kernel(__nv_bfloat16 *p, size_t n, uint32_t seed)
{
    size_t    i;
    uint32_t  h;

    for (i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t) gridDim.x * blockDim.x)
    {
        h = (uint32_t) i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = __float2bfloat16((float) (h & 0xffff) / 65536.0f - 0.5f);
    }
}


static __nv_bfloat16 *
rand_bf16(size_t n, uint32_t seed)
{
    __nv_bfloat16  *p;

    TRY(cudaMalloc((void **) &p, n * sizeof(*p)));
    fill_kernel<<<1024, 256>>>(p, n, seed);
    TRY(cudaGetLastError());
    return p;
}


/* out[M][rows] = act[M][cols] . w[rows][cols]^T, bf16 in, fp32 out */
static void
gemm(cublasHandle_t h, const __nv_bfloat16 *w, uint32_t rows, uint32_t cols,
    const __nv_bfloat16 *act, uint32_t M, float *out)
{
    const float  one = 1.0f, zero = 0.0f;

    BTRY(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int) rows, (int) M,
                      (int) cols, &one, w, CUDA_R_16BF, (int) cols, act,
                      CUDA_R_16BF, (int) cols, &zero, out, CUDA_R_32F,
                      (int) rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}


/* The timed pieces: a device-to-device copy, one step's layer products,
 * the lm_head. */
struct floor_work {
    const struct msv_model_config  *c;
    cublasHandle_t                  h;
    __nv_bfloat16                 **wq, **wo, **wgu, **wd, *lm, *act;
    float                          *out;
    void                           *src, *dst;
    size_t                          big, q, kv;
    uint32_t                        M;
};


static void
copy_work(void *ctx)
{
    struct floor_work  *w = (struct floor_work *) ctx;

    TRY(cudaMemcpy(w->dst, w->src, w->big, cudaMemcpyDeviceToDevice));
}


static void
layers_work(void *ctx)
{
    struct floor_work  *w = (struct floor_work *) ctx;
    uint32_t            l;

    for (l = 0; l < w->c->n_layers; l++) {
        gemm(w->h, w->wq[l], (uint32_t) (w->q + 2 * w->kv), w->c->hidden,
             w->act, w->M, w->out);
        gemm(w->h, w->wo[l], w->c->hidden, (uint32_t) w->q, w->act, w->M,
             w->out);
        gemm(w->h, w->wgu[l], 2 * w->c->intermediate, w->c->hidden, w->act,
             w->M, w->out);
        gemm(w->h, w->wd[l], w->c->hidden, w->c->intermediate, w->act,
             w->M, w->out);
    }
}


static void
lm_work(void *ctx)
{
    struct floor_work  *w = (struct floor_work *) ctx;

    gemm(w->h, w->lm, w->c->vocab_size, w->c->hidden, w->act, w->M, w->out);
}


int
main(int argc, char **argv)
{
    struct msv_model_config   c;
    struct floor_work         w;
    float                     gemm_ms, lm_ms, copy, ms;
    char                      err[256];
    size_t                    q, kv, maxm, kv_bytes;
    uint32_t                  l, M;
    double                    ctx, kv_ms;
    int                       a;

    if (argc < 4) {
        fprintf(stderr, "usage: engine_floor PRESET MEAN_CTX M [M ...]\n");
        return 2;
    }
    if (msv_config_preset(argv[1], &c, err, sizeof(err)) != 0) {
        fprintf(stderr, "engine_floor: %s\n", err);
        return 2;
    }
    ctx = atof(argv[2]);

    memset(&w, 0, sizeof(w));
    w.c = &c;
    BTRY(cublasCreate(&w.h));

    /* copy rate: 2 GiB device to device, bytes read + written */
    w.big = (size_t) 2 << 30;
    TRY(cudaMalloc(&w.src, w.big));
    TRY(cudaMalloc(&w.dst, w.big));
    TRY(cudaMemset(w.src, 1, w.big));
    copy = 2.0 * w.big / (msv_bench_ms(copy_work, &w) * 1e-3) / 1e12;
    TRY(cudaFree(w.src));
    TRY(cudaFree(w.dst));
    printf("copy_tb_s %.3f\n", copy);

    q = (size_t) c.n_heads * c.head_dim;
    kv = (size_t) c.n_kv_heads * c.head_dim;
    w.q = q;
    w.kv = kv;
    w.wq = (__nv_bfloat16 **) calloc(c.n_layers, sizeof(void *));
    w.wo = (__nv_bfloat16 **) calloc(c.n_layers, sizeof(void *));
    w.wgu = (__nv_bfloat16 **) calloc(c.n_layers, sizeof(void *));
    w.wd = (__nv_bfloat16 **) calloc(c.n_layers, sizeof(void *));
    if (w.wq == NULL || w.wo == NULL || w.wgu == NULL || w.wd == NULL) {
        fprintf(stderr, "engine_floor: out of memory\n");
        return 1;
    }
    for (l = 0; l < c.n_layers; l++) {
        w.wq[l] = rand_bf16((q + 2 * kv) * c.hidden, 4 * l + 1);
        w.wo[l] = rand_bf16((size_t) c.hidden * q, 4 * l + 2);
        w.wgu[l] = rand_bf16((size_t) 2 * c.intermediate * c.hidden,
                             4 * l + 3);
        w.wd[l] = rand_bf16((size_t) c.hidden * c.intermediate, 4 * l + 4);
    }
    w.lm = rand_bf16((size_t) c.vocab_size * c.hidden, 7);

    maxm = 0;
    for (a = 3; a < argc; a++) {
        M = (uint32_t) atoi(argv[a]);
        maxm = M > maxm ? M : maxm;
    }
    w.act = rand_bf16(maxm * (c.intermediate > q ? c.intermediate
                              : (q > c.hidden ? q : c.hidden)), 9);
    TRY(cudaMalloc((void **) &w.out, maxm * (size_t) (c.vocab_size
                                                     > 2 * c.intermediate
                                                     ? c.vocab_size
                                                     : 2 * c.intermediate)
                                     * sizeof(float)));
    TRY(cudaDeviceSynchronize());

    printf("%-6s %9s %9s %9s %9s %10s\n", "M", "gemm_ms", "lm_ms", "kv_ms",
           "floor_ms", "tok_s");
    for (a = 3; a < argc; a++) {
        w.M = M = (uint32_t) atoi(argv[a]);
        gemm_ms = msv_bench_ms(layers_work, &w);
        lm_ms = msv_bench_ms(lm_work, &w);

        /* K and V of every layer for M sequences of ctx tokens, bf16 */
        kv_bytes = (size_t) ((double) M * ctx) * c.n_layers * 2 * kv * 2;
        kv_ms = (double) kv_bytes / (copy * 1e12) * 1e3;
        ms = gemm_ms + lm_ms + (float) kv_ms;
        printf("floor %-6u %9.3f %9.3f %9.3f %9.3f %10.1f\n", M, gemm_ms,
               lm_ms, kv_ms, ms, M / (ms * 1e-3));
    }

    for (l = 0; l < c.n_layers; l++) {
        cudaFree(w.wq[l]);
        cudaFree(w.wo[l]);
        cudaFree(w.wgu[l]);
        cudaFree(w.wd[l]);
    }
    cudaFree(w.lm);
    cudaFree(w.act);
    cudaFree(w.out);
    cublasDestroy(w.h);
    return 0;
}
