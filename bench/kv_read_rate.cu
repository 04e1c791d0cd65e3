/*
 * kv_read_rate.cu: the read-only ceilings that the decode attention's
 * floor leans on, on a machine with an NVIDIA GPU: a sequential read of
 * 4 GiB, and reads in the attention's pattern at batch 256 of qwen3-8b (a
 * one-warp block per (token, kv head) reading 24 pages of 4 KB of K and
 * of V, 8 kv heads, rotating over 8 sets of 400 MB so that L2 holds none
 * of a launch's pages), grid in token and in head order, at each of the
 * occupancies asked for (warps an SM, held by dynamic shared memory; the
 * walking kernel runs 8, bench/results/engine.md).  Each time is the
 * median of 7 launches after 2 (cuda_bench.h).
 *
 *   kv_read_rate [WARPS_AN_SM ...]      (default: 32 8)
 *
 *   nvcc -O2 -gencode arch=compute_90,code=sm_90 -o kv_read_rate \
 *       bench/kv_read_rate.cu && ./kv_read_rate
 */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#include "cuda_bench.h"

#define TRY(call)  MSV_BENCH_TRY(call)

const char  *msv_bench_prog = "kv_read_rate";

/* the pattern: batch 256, 24 pages (mean context 384), 8 kv heads, 4 KB
 * (256 16-byte words) a page's K and V each at head_dim 128 */
#define KV_TOKENS  256
#define KV_PAGES   24
#define KV_HEADS   8
#define KV_WORDS   256
#define KV_SETS    8


/* Every word of p once, streaming; the xor keeps the loads alive. */
static __global__ void
seq_read_kernel(const uint4 *p, size_t n, uint32_t *out)
{
    uint32_t  acc;
    uint4     v;
    size_t    i;

    acc = 0;
    for (i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < n;
         i += (size_t) gridDim.x * blockDim.x)
    {
        v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) {
        out[0] = acc;
    }
}


/* One warp a block: (token, kv head) reads its npg pages of K and V, a
 * page's 8 passes of the warp's 512 bytes issued before any is used. */
static __global__ void
kv_read_kernel(const uint4 *k, const uint4 *v, int npg, int heads_inner,
    int nheads, uint32_t *out)
{
    uint32_t  acc;
    uint4     a[8], b[8];
    size_t    base;
    int       t, h, p, c;

    t = heads_inner ? blockIdx.y : blockIdx.x;
    h = heads_inner ? blockIdx.x : blockIdx.y;
    acc = 0;
    for (p = 0; p < npg; p++) {
        base = (((size_t) t * npg + p) * nheads + h) * KV_WORDS;
#pragma unroll
        for (c = 0; c < 8; c++) {
            a[c] = __ldcs(k + base + c * 32 + threadIdx.x);
            b[c] = __ldcs(v + base + c * 32 + threadIdx.x);
        }
#pragma unroll
        for (c = 0; c < 8; c++) {
            acc ^= a[c].x ^ a[c].w ^ b[c].y ^ b[c].z;
        }
    }
    if (acc == 0x12345678u) {
        out[0] = acc;
    }
}


struct read_work {
    const uint4  *buf;
    size_t        words;      /* of buf */
    size_t        set;        /* words of one set's K (V follows it) */
    uint32_t     *out;
    int           sms;
    int           heads_inner;
    int           run;        /* launches so far: the set to read */
    size_t        smem;
};


static void
seq_work(void *ctx)
{
    struct read_work  *w = (struct read_work *) ctx;

    seq_read_kernel<<<w->sms * 8, 512>>>(w->buf, w->words, w->out);
}


static void
kv_work(void *ctx)
{
    struct read_work  *w = (struct read_work *) ctx;
    const uint4       *k;
    dim3               grid;

    k = w->buf + (size_t) (w->run++ % KV_SETS) * 2 * w->set;
    grid = w->heads_inner ? dim3(KV_HEADS, KV_TOKENS)
                          : dim3(KV_TOKENS, KV_HEADS);
    kv_read_kernel<<<grid, 32, w->smem>>>(k, k + w->set, KV_PAGES,
                                          w->heads_inner, KV_HEADS, w->out);
}


int
main(int argc, char **argv)
{
    static const int  dflt[] = { 32, 8 };
    struct read_work  w;
    size_t            bytes, per_sm, reserved;
    float             ms;
    int               i, n, warps, held, dev, v;

    n = argc > 1 ? argc - 1 : 2;
    for (i = 1; i < argc; i++) {
        warps = atoi(argv[i]);
        if (warps < 1 || warps > 32) {
            fprintf(stderr, "kv_read_rate: warps an SM: \"%s\" is not 1 to "
                    "32\n", argv[i]);
            return 2;
        }
    }

    bytes = (size_t) 4 << 30;
    w.words = bytes / sizeof(uint4);
    w.set = (size_t) KV_TOKENS * KV_PAGES * KV_HEADS * KV_WORDS;
    if (2 * KV_SETS * w.set > w.words) {
        fprintf(stderr, "kv_read_rate: the sets do not fit the buffer\n");
        return 1;
    }
    TRY(cudaMalloc((void **) &w.buf, bytes));
    TRY(cudaMalloc((void **) &w.out, sizeof(uint32_t)));
    TRY(cudaMemset((void *) w.buf, 0x5a, bytes));
    TRY(cudaGetDevice(&dev));
    TRY(cudaDeviceGetAttribute(&w.sms, cudaDevAttrMultiProcessorCount, dev));
    TRY(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerMultiprocessor,
                               dev));
    per_sm = (size_t) v;
    TRY(cudaDeviceGetAttribute(&v, cudaDevAttrReservedSharedMemoryPerBlock,
                               dev));
    reserved = (size_t) v;
    TRY(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                               dev));
    TRY(cudaFuncSetAttribute(kv_read_kernel,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, v));

    ms = msv_bench_ms(seq_work, &w);
    printf("sequential read %.3f ms %.3f TB/s\n", ms, bytes / ms / 1e9);

    for (i = 0; i < n; i++) {
        warps = argc > 1 ? atoi(argv[i + 1]) : dflt[i];
        /* the most shared memory a block that still lets `warps` blocks
         * share an SM, so that no more than that many do */
        w.smem = warps >= 32 ? 0 : per_sm / (size_t) warps - reserved;
        if (w.smem > (size_t) v) {
            w.smem = (size_t) v;
        }
        TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&held,
                                                          kv_read_kernel, 32,
                                                          w.smem));
        for (w.heads_inner = 0; w.heads_inner < 2; w.heads_inner++) {
            w.run = 0;
            ms = msv_bench_ms(kv_work, &w);
            printf("kv pattern %s, %d warps an SM (%zu bytes of shared "
                   "memory a block): %.4f ms a layer, %.3f TB/s (x36 = "
                   "%.3f ms)\n", w.heads_inner ? "head-inner" : "token-major",
                   held, w.smem, ms, 2.0 * w.set * sizeof(uint4) / ms / 1e9,
                   ms * 36);
        }
    }
    TRY(cudaDeviceSynchronize());
    return 0;
}
