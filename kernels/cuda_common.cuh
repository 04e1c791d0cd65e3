/*
 * cuda_common.cuh: what every kernel file shares: error reporting into
 * an (err, errlen) buffer, grid arithmetic, and the activation formats
 * a producer kernel writes for the matrix product that consumes it.
 */

#ifndef MSV_CUDA_COMMON_CUH
#define MSV_CUDA_COMMON_CUH

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>

#define MSV_CEIL_DIV(a, b)  (((a) + (b) - 1) / (b))

/*
 * How an activation matrix [rows][cols] is stored for the product that
 * reads it:
 *   MSV_ACT_F32     fp32, for fp32 weights;
 *   MSV_ACT_BF16    bf16 (rounded), for bf16 weights, fast mode;
 *   MSV_ACT_BF16X2  two bf16 matrices stacked: rows [0, rows) hold
 *                   hi = bf16(x), rows [rows, 2 rows) hold
 *                   lo = bf16(x - hi); W.hi + W.lo carries x to about
 *                   2^-16 relative, so bf16 weights multiply fp32
 *                   activations (the default for bf16 weights).
 * F32 and BF16X2 take 4 bytes an element, BF16 takes 2.
 */
enum msv_act_fmt {
    MSV_ACT_F32    = 0,
    MSV_ACT_BF16   = 1,
    MSV_ACT_BF16X2 = 2
};

/*
 * Programmatic dependent launch (sm_90).  A kernel launched by msv_launch
 * while msv_cuda_pdl is set may start before the kernel ahead of it in
 * the stream has finished: it must call msv_grid_wait() before it reads
 * anything an earlier kernel wrote and before it writes anything (the
 * wait returns once every kernel ahead has completed and its writes are
 * visible); before the wait it may only read what no kernel of the step
 * writes (weights).  msv_grid_release() lets the kernel after it start
 * once every block of this one has called it (or exited); every kernel
 * calls it after its wait, so at most the running kernel and the next
 * one hold SM slots (released before the wait, each waiting kernel let
 * the next one in, and a chain of waiting blocks took the slots the
 * running kernel's later blocks needed: decode at batch 1 ran 13%
 * slower than with plain launches).  Launched otherwise, both are
 * no-ops.  In a CUDA graph the launches become
 * programmatic edges: the next layer's weight loads overlap the tail of
 * the kernel before them, where a plain launch waits for it to drain.
 */
static __device__ __forceinline__ void
msv_grid_wait(void)
{
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

static __device__ __forceinline__ void
msv_grid_release(void)
{
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

/*
 * A range of weights to bring into L2 ahead of the product that reads
 * them: bytes from p, both multiples of 16 (bytes 0: none).  At small
 * batch every product reads its weight once at the memory's rate, and
 * the kernels between two products (the RMSNorm, the q/k norm and RoPE,
 * the attention) barely use the bus; a kernel given a range asks for it
 * with cp.async.bulk.prefetch (a hint: nothing waits for it, nothing is
 * written), so that the next product finds part of its weight in L2
 * (MSV_CUDA_PREFETCH, backend_cuda.cu).
 */
struct msv_l2pf {
    const char  *p;
    size_t       bytes;
};

#define MSV_L2PF_CHUNK  16384u      /* bytes a prefetch instruction asks */

/* Every thread of the grid asks for its chunks of pf, in turn. */
static __device__ __forceinline__ void
msv_l2_prefetch(struct msv_l2pf pf)
{
    size_t    i, step;
    uint32_t  n;

    step = (size_t) gridDim.x * gridDim.y * blockDim.x * MSV_L2PF_CHUNK;
    i = ((size_t) blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x
        + threadIdx.x;
    for (i *= MSV_L2PF_CHUNK; i < pf.bytes; i += step) {
        n = (uint32_t) (pf.bytes - i < MSV_L2PF_CHUNK ? pf.bytes - i
                                                      : MSV_L2PF_CHUNK);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n"
                     :: "l"(__cvta_generic_to_global(pf.p + i)), "r"(n)
                     : "memory");
    }
}

/* Whether msv_launch asks for programmatic dependent launch: set by the
 * backend (MSV_CUDA_PDL, on by default), off for other callers. */
extern int  msv_cuda_pdl;

template <typename... KArgs, typename... Args>
static inline cudaError_t
msv_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
    cudaStream_t stream, Args... args)
{
    cudaLaunchConfig_t   cfg;
    cudaLaunchAttribute  at;

    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &at;
    cfg.numAttrs = msv_cuda_pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

/* Write v as element (row, col) of a [rows][cols] activation matrix. */
static __device__ __forceinline__ void
msv_store_act(void *out, int fmt, size_t rows, size_t row, size_t cols,
    size_t col, float v)
{
    __nv_bfloat16  *o, hi;

    if (fmt == MSV_ACT_F32) {
        ((float *) out)[row * cols + col] = v;
        return;
    }

    o = (__nv_bfloat16 *) out;
    hi = __float2bfloat16_rn(v);
    o[row * cols + col] = hi;

    if (fmt == MSV_ACT_BF16X2) {
        o[(rows + row) * cols + col] =
            __float2bfloat16_rn(v - __bfloat162float(hi));
    }
}

/* KV cache elements: fp32 (split precision) or bf16, read as fp32. */
static __device__ __forceinline__ void
msv_kv_put(float *p, float v)
{
    *p = v;
}

static __device__ __forceinline__ void
msv_kv_put(__nv_bfloat16 *p, float v)
{
    *p = __float2bfloat16_rn(v);
}

/* Two adjacent elements (the index even). */
static __device__ __forceinline__ float2
msv_kv_get2(const float *p)
{
    return *(const float2 *) p;
}

static __device__ __forceinline__ float2
msv_kv_get2(const __nv_bfloat16 *p)
{
    return __bfloat1622float2(*(const __nv_bfloat162 *) p);
}

/* Sum over a warp, the result in every lane. */
static __device__ __forceinline__ float
msv_warp_sum(float v)
{
    int  off;

    for (off = 16; off > 0; off >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, off);
    }
    return v;
}

/*
 * Sum over the block (blockDim.x a multiple of 32, at most 1024); every
 * thread gets the result.  red is __shared__ float[33].
 */
static __device__ __forceinline__ float
msv_block_sum(float v, float *red)
{
    int  lane, warp, nwarps, i;

    lane = threadIdx.x & 31;
    warp = threadIdx.x >> 5;
    nwarps = blockDim.x >> 5;

    v = msv_warp_sum(v);
    if (lane == 0) {
        red[warp] = v;
    }
    __syncthreads();

    if (threadIdx.x == 0) {
        v = 0.0f;
        for (i = 0; i < nwarps; i++) {
            v += red[i];
        }
        red[32] = v;
    }
    __syncthreads();

    v = red[32];
    __syncthreads();    /* red may be reused by the caller */
    return v;
}

/* Format "what: file:line: name: description" into err; always -1. */
int msv_cuda_fail(char *err, size_t errlen, const char *what,
    const char *file, int line, cudaError_t e);
int msv_cublas_fail(char *err, size_t errlen, const char *what,
    const char *file, int line, cublasStatus_t s);

#define MSV_CUDA_TRY(call, err, errlen)                                      \
    do {                                                                     \
        cudaError_t  e_ = (call);                                            \
        if (e_ != cudaSuccess) {                                             \
            return msv_cuda_fail(err, errlen, #call, __FILE__, __LINE__, e_);\
        }                                                                    \
    } while (0)

#define MSV_CUBLAS_TRY(call, err, errlen)                                    \
    do {                                                                     \
        cublasStatus_t  s_ = (call);                                         \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                   \
            return msv_cublas_fail(err, errlen, #call, __FILE__, __LINE__,   \
                                   s_);                                      \
        }                                                                    \
    } while (0)

#endif /* MSV_CUDA_COMMON_CUH */
