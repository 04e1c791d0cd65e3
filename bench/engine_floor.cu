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
 * after "copy_tb_s X".  Each time is the median of 7 runs after 2.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>

#include "model.h"

#define REPS  7
#define WARM  2

#define TRY(call)                                                            \
    do {                                                                     \
        cudaError_t  e_ = (call);                                            \
        if (e_ != cudaSuccess) {                                             \
            fprintf(stderr, "engine_floor: %s: %s\n", #call,                 \
                    cudaGetErrorString(e_));                                 \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

#define BTRY(call)                                                           \
    do {                                                                     \
        if ((call) != CUBLAS_STATUS_SUCCESS) {                               \
            fprintf(stderr, "engine_floor: %s failed\n", #call);             \
            exit(1);                                                         \
        }                                                                    \
    } while (0)


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


static int
cmp_float(const void *a, const void *b)
{
    float  x = *(const float *) a, y = *(const float *) b;

    return (x > y) - (x < y);
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


int
main(int argc, char **argv)
{
    struct msv_model_config   c;
    cublasHandle_t            h;
    cudaEvent_t               e0, e1;
    __nv_bfloat16           **wq, **wo, **wgu, **wd, *lm, *act;
    float                    *out, t[REPS + WARM], gemm_ms, lm_ms, copy, ms;
    char                      err[256];
    void                     *src, *dst;
    size_t                    big, q, kv, maxm, kv_bytes;
    uint32_t                  l, M, i;
    double                    ctx, kv_ms;
    int                       a, r;

    if (argc < 4) {
        fprintf(stderr, "usage: engine_floor PRESET MEAN_CTX M [M ...]\n");
        return 2;
    }
    if (msv_config_preset(argv[1], &c, err, sizeof(err)) != 0) {
        fprintf(stderr, "engine_floor: %s\n", err);
        return 2;
    }
    ctx = atof(argv[2]);

    TRY(cudaEventCreate(&e0));
    TRY(cudaEventCreate(&e1));
    BTRY(cublasCreate(&h));

    /* copy rate: 2 GiB device to device, bytes read + written */
    big = (size_t) 2 << 30;
    TRY(cudaMalloc(&src, big));
    TRY(cudaMalloc(&dst, big));
    TRY(cudaMemset(src, 1, big));
    for (r = 0; r < REPS + WARM; r++) {
        TRY(cudaEventRecord(e0));
        TRY(cudaMemcpy(dst, src, big, cudaMemcpyDeviceToDevice));
        TRY(cudaEventRecord(e1));
        TRY(cudaEventSynchronize(e1));
        TRY(cudaEventElapsedTime(&t[r], e0, e1));
    }
    qsort(t + WARM, REPS, sizeof(float), cmp_float);
    copy = 2.0 * big / (t[WARM + REPS / 2] * 1e-3) / 1e12;   /* TB/s */
    TRY(cudaFree(src));
    TRY(cudaFree(dst));
    printf("copy_tb_s %.3f\n", copy);

    q = (size_t) c.n_heads * c.head_dim;
    kv = (size_t) c.n_kv_heads * c.head_dim;
    wq = (__nv_bfloat16 **) calloc(c.n_layers, sizeof(void *));
    wo = (__nv_bfloat16 **) calloc(c.n_layers, sizeof(void *));
    wgu = (__nv_bfloat16 **) calloc(c.n_layers, sizeof(void *));
    wd = (__nv_bfloat16 **) calloc(c.n_layers, sizeof(void *));
    for (l = 0; l < c.n_layers; l++) {
        wq[l] = rand_bf16((q + 2 * kv) * c.hidden, 4 * l + 1);
        wo[l] = rand_bf16((size_t) c.hidden * q, 4 * l + 2);
        wgu[l] = rand_bf16((size_t) 2 * c.intermediate * c.hidden, 4 * l + 3);
        wd[l] = rand_bf16((size_t) c.hidden * c.intermediate, 4 * l + 4);
    }
    lm = rand_bf16((size_t) c.vocab_size * c.hidden, 7);

    maxm = 0;
    for (a = 3; a < argc; a++) {
        M = (uint32_t) atoi(argv[a]);
        maxm = M > maxm ? M : maxm;
    }
    act = rand_bf16(maxm * (c.intermediate > q ? c.intermediate
                            : (q > c.hidden ? q : c.hidden)), 9);
    TRY(cudaMalloc((void **) &out, maxm * (size_t) (c.vocab_size
                                                   > 2 * c.intermediate
                                                   ? c.vocab_size
                                                   : 2 * c.intermediate)
                                   * sizeof(float)));
    TRY(cudaDeviceSynchronize());

    printf("%-6s %9s %9s %9s %9s %10s\n", "M", "gemm_ms", "lm_ms", "kv_ms",
           "floor_ms", "tok_s");
    for (a = 3; a < argc; a++) {
        M = (uint32_t) atoi(argv[a]);

        for (r = 0; r < REPS + WARM; r++) {
            TRY(cudaEventRecord(e0));
            for (l = 0; l < c.n_layers; l++) {
                gemm(h, wq[l], (uint32_t) (q + 2 * kv), c.hidden, act, M, out);
                gemm(h, wo[l], c.hidden, (uint32_t) q, act, M, out);
                gemm(h, wgu[l], 2 * c.intermediate, c.hidden, act, M, out);
                gemm(h, wd[l], c.hidden, c.intermediate, act, M, out);
            }
            TRY(cudaEventRecord(e1));
            TRY(cudaEventSynchronize(e1));
            TRY(cudaEventElapsedTime(&t[r], e0, e1));
        }
        qsort(t + WARM, REPS, sizeof(float), cmp_float);
        gemm_ms = t[WARM + REPS / 2];

        for (r = 0; r < REPS + WARM; r++) {
            TRY(cudaEventRecord(e0));
            gemm(h, lm, c.vocab_size, c.hidden, act, M, out);
            TRY(cudaEventRecord(e1));
            TRY(cudaEventSynchronize(e1));
            TRY(cudaEventElapsedTime(&t[r], e0, e1));
        }
        qsort(t + WARM, REPS, sizeof(float), cmp_float);
        lm_ms = t[WARM + REPS / 2];

        /* K and V of every layer for M sequences of ctx tokens, bf16 */
        kv_bytes = (size_t) ((double) M * ctx) * c.n_layers * 2 * kv * 2;
        kv_ms = (double) kv_bytes / (copy * 1e12) * 1e3;
        ms = gemm_ms + lm_ms + (float) kv_ms;
        printf("floor %-6u %9.3f %9.3f %9.3f %9.3f %10.1f\n", M, gemm_ms,
               lm_ms, kv_ms, ms, M / (ms * 1e-3));
    }

    for (i = 0; i < c.n_layers; i++) {
        cudaFree(wq[i]);
        cudaFree(wo[i]);
        cudaFree(wgu[i]);
        cudaFree(wd[i]);
    }
    cudaFree(lm);
    cudaFree(act);
    cudaFree(out);
    cublasDestroy(h);
    return 0;
}
