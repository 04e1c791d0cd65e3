/*
 * elementwise.cu: grid-stride loops over matrices, one thread an element.
 */

#include "model.h"
#include "elementwise.cuh"

#define MSV_EW_THREADS  256
#define MSV_EW_MAX_BLOCKS  65535u

static unsigned
msv_ew_blocks(size_t total)
{
    size_t  b;

    b = MSV_CEIL_DIV(total, (size_t) MSV_EW_THREADS);
    return b > MSV_EW_MAX_BLOCKS ? MSV_EW_MAX_BLOCKS : (unsigned) b;
}

static __global__ void
embed_kernel(float *out, const void *table, int dtype, const int32_t *tokens,
    uint32_t n_tokens, uint32_t n)
{
    size_t  i, total, t, c, src;

    total = (size_t) n_tokens * n;
    for (i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t) gridDim.x * blockDim.x)
    {
        t = i / n;
        c = i % n;
        src = (size_t) tokens[t] * n + c;
        out[i] = dtype == MSV_BF16
                 ? __bfloat162float(((const __nv_bfloat16 *) table)[src])
                 : ((const float *) table)[src];
    }
}

/* gate and up values of the product as fp32: one, or four at once (p a
 * multiple of 4 elements from an aligned base) */
static __device__ __forceinline__ float
msv_gu_at(const float *p, size_t i)
{
    return p[i];
}

static __device__ __forceinline__ float
msv_gu_at(const __nv_bfloat16 *p, size_t i)
{
    return __bfloat162float(p[i]);
}

static __device__ __forceinline__ float4
msv_gu4(const float *p)
{
    return *(const float4 *) p;
}

static __device__ __forceinline__ float4
msv_gu4(const __nv_bfloat16 *p)
{
    uint2   w = *(const uint2 *) p;
    float2  a = __bfloat1622float2(*(const __nv_bfloat162 *) &w.x);
    float2  b = __bfloat1622float2(*(const __nv_bfloat162 *) &w.y);

    return make_float4(a.x, a.y, b.x, b.y);
}

template <typename T>
static __global__ void
silu_mul_kernel(void *out, int fmt, const T *gu, uint32_t n_rows, uint32_t n)
{
    size_t  i, total, r, c;
    float   g, u;

    msv_grid_wait();
    msv_grid_release();
    total = (size_t) n_rows * n;
    for (i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t) gridDim.x * blockDim.x)
    {
        r = i / n;
        c = i % n;
        g = msv_gu_at(gu, r * 2 * n + c);
        u = msv_gu_at(gu, r * 2 * n + n + c);
        msv_store_act(out, fmt, n_rows, r, n, c, g / (1.0f + expf(-g)) * u);
    }
}

/* n % 4 == 0: one thread per 4 columns of a row, four values a load, no
 * index division (the row is blockIdx.y). */
template <typename T>
static __global__ void
silu_mul4_kernel(void *out, int fmt, const T *gu, uint32_t n_rows,
    uint32_t n)
{
    size_t           r, c;
    float4           g, u;
    float            y[4];
    __nv_bfloat162   b[2];

    msv_grid_wait();
    msv_grid_release();
    r = blockIdx.y;
    c = 4 * ((size_t) blockIdx.x * blockDim.x + threadIdx.x);
    if (c >= n) {
        return;
    }
    g = msv_gu4(gu + r * 2 * n + c);
    u = msv_gu4(gu + r * 2 * n + n + c);
    y[0] = g.x / (1.0f + expf(-g.x)) * u.x;
    y[1] = g.y / (1.0f + expf(-g.y)) * u.y;
    y[2] = g.z / (1.0f + expf(-g.z)) * u.z;
    y[3] = g.w / (1.0f + expf(-g.w)) * u.w;
    if (fmt == MSV_ACT_BF16 && (uintptr_t) out % 8 == 0) {  /* one store */
        b[0] = __floats2bfloat162_rn(y[0], y[1]);
        b[1] = __floats2bfloat162_rn(y[2], y[3]);
        *(uint2 *) ((__nv_bfloat16 *) out + r * n + c) = *(uint2 *) b;
        return;
    }
    msv_store_act(out, fmt, n_rows, r, n, c, y[0]);
    msv_store_act(out, fmt, n_rows, r, n, c + 1, y[1]);
    msv_store_act(out, fmt, n_rows, r, n, c + 2, y[2]);
    msv_store_act(out, fmt, n_rows, r, n, c + 3, y[3]);
}

static __global__ void
to_act_kernel(void *out, int fmt, const float *x, uint32_t n_rows,
    uint32_t n)
{
    size_t  i, total;

    total = (size_t) n_rows * n;
    for (i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t) gridDim.x * blockDim.x)
    {
        msv_store_act(out, fmt, n_rows, i / n, n, i % n, x[i]);
    }
}

static __global__ void
split_sum_kernel(float *out, const float *tmp, uint32_t n_rows, uint32_t n,
    int accumulate)
{
    size_t  i, total;
    float   v;

    total = (size_t) n_rows * n;
    for (i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t) gridDim.x * blockDim.x)
    {
        v = tmp[i] + tmp[total + i];
        out[i] = accumulate ? out[i] + v : v;
    }
}

cudaError_t
embed_forward(float *out, const void *table, int dtype, const int32_t *tokens,
    uint32_t n_tokens, uint32_t n, cudaStream_t stream)
{
    size_t  total = (size_t) n_tokens * n;

    if (total == 0) {
        return cudaSuccess;
    }
    embed_kernel<<<msv_ew_blocks(total), MSV_EW_THREADS, 0, stream>>>(out,
        table, dtype, tokens, n_tokens, n);
    return cudaGetLastError();
}

template <typename T>
static cudaError_t
msv_silu_mul(void *out, int fmt, const T *gu, uint32_t n_rows, uint32_t n,
    cudaStream_t stream)
{
    size_t  total = (size_t) n_rows * n;

    if (n % 4 == 0 && n_rows <= 65535 && (uintptr_t) gu % 16 == 0) {
        return msv_launch(silu_mul4_kernel<T>,
                          dim3(MSV_CEIL_DIV(n / 4, (uint32_t) MSV_EW_THREADS),
                               n_rows),
                          dim3(MSV_EW_THREADS), 0, stream, out, fmt, gu,
                          n_rows, n);
    }
    return msv_launch(silu_mul_kernel<T>, dim3(msv_ew_blocks(total)),
                      dim3(MSV_EW_THREADS), 0, stream, out, fmt, gu, n_rows,
                      n);
}

cudaError_t
silu_mul_forward(void *out, int fmt, const void *gu, int gu_dtype,
    uint32_t n_rows, uint32_t n, cudaStream_t stream)
{
    if ((size_t) n_rows * n == 0) {
        return cudaSuccess;
    }
    if (gu_dtype == MSV_BF16) {
        return msv_silu_mul(out, fmt, (const __nv_bfloat16 *) gu, n_rows, n,
                            stream);
    }
    return msv_silu_mul(out, fmt, (const float *) gu, n_rows, n, stream);
}

cudaError_t
to_act_forward(void *out, int fmt, const float *x, uint32_t n_rows,
    uint32_t n, cudaStream_t stream)
{
    size_t  total = (size_t) n_rows * n;

    if (total == 0) {
        return cudaSuccess;
    }
    to_act_kernel<<<msv_ew_blocks(total), MSV_EW_THREADS, 0, stream>>>(out,
        fmt, x, n_rows, n);
    return cudaGetLastError();
}

cudaError_t
split_sum_forward(float *out, const float *tmp, uint32_t n_rows, uint32_t n,
    int accumulate, cudaStream_t stream)
{
    size_t  total = (size_t) n_rows * n;

    if (total == 0) {
        return cudaSuccess;
    }
    split_sum_kernel<<<msv_ew_blocks(total), MSV_EW_THREADS, 0, stream>>>(
        out, tmp, n_rows, n, accumulate);
    return cudaGetLastError();
}
