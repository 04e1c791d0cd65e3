/*
 * norm.cu: RMSNorm, one block per row.
 */

#include "norm.cuh"

#define MSV_NORM_THREADS  256
#define MSV_NORM_VEC_MAX  8            /* float4 words a thread holds */

static __global__ void
rmsnorm_kernel(void *out, int fmt, const float *x, const int32_t *rows,
    const float *w, uint32_t n_rows, uint32_t n, float eps,
    struct msv_l2pf pf)
{
    __shared__ float  red[33];
    const float      *xr;
    uint32_t          r, i;
    float             ss, scale, v;

    msv_l2_prefetch(pf);
    msv_grid_wait();
    msv_grid_release();
    r = blockIdx.x;
    xr = x + (size_t) (rows != NULL ? (uint32_t) rows[r] : r) * n;

    ss = 0.0f;
    for (i = threadIdx.x; i < n; i += blockDim.x) {
        v = xr[i];
        ss += v * v;
    }
    ss = msv_block_sum(ss, red);

    scale = 1.0f / sqrtf(ss / (float) n + eps);

    for (i = threadIdx.x; i < n; i += blockDim.x) {
        msv_store_act(out, fmt, n_rows, r, n, i, w[i] * (xr[i] * scale));
    }
}

/*
 * n % 4 == 0 and n <= 4 * MSV_NORM_VEC_MAX * MSV_NORM_THREADS (every model
 * preset): the row is read once, as float4 words kept in registers (NV a
 * thread), and written from them; the generic kernel above reads it twice
 * with scalar loads, which at decode sizes is latency, not bytes.
 */
template <int NV>
static __global__ void __launch_bounds__(MSV_NORM_THREADS)
rmsnorm_vec_kernel(void *out, int fmt, const float *x, const int32_t *rows,
    const float *w, uint32_t n_rows, uint32_t n, float eps,
    struct msv_l2pf pf)
{
    __shared__ float  red[33];
    const float4     *xr, *wr;
    float4            v[NV], g[NV];
    uint32_t          r, c, n4;
    float             ss, scale, y[4];
    int               i, j;

    r = blockIdx.x;
    n4 = n / 4;
    wr = (const float4 *) w;

    /* the weights are loaded before the row, not after the sum: their
     * latency overlaps the row's (and, under a programmatic launch, the
     * end of the kernel that writes x: msv_grid_wait) */
#pragma unroll
    for (i = 0; i < NV; i++) {
        c = threadIdx.x + i * MSV_NORM_THREADS;
        g[i] = c < n4 ? __ldg(wr + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    msv_l2_prefetch(pf);
    msv_grid_wait();
    msv_grid_release();
    xr = (const float4 *) (x + (size_t) (rows != NULL ? (uint32_t) rows[r]
                                                      : r) * n);
    ss = 0.0f;
#pragma unroll
    for (i = 0; i < NV; i++) {
        c = threadIdx.x + i * MSV_NORM_THREADS;
        v[i] = c < n4 ? xr[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (i = 0; i < NV; i++) {
        ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z
              + v[i].w * v[i].w;
    }
    ss = msv_block_sum(ss, red);

    scale = 1.0f / sqrtf(ss / (float) n + eps);

#pragma unroll
    for (i = 0; i < NV; i++) {
        c = threadIdx.x + i * MSV_NORM_THREADS;
        if (c >= n4) {
            continue;
        }
        y[0] = g[i].x * (v[i].x * scale);
        y[1] = g[i].y * (v[i].y * scale);
        y[2] = g[i].z * (v[i].z * scale);
        y[3] = g[i].w * (v[i].w * scale);
        if (fmt == MSV_ACT_F32) {
            ((float4 *) out)[(size_t) r * n4 + c] =
                make_float4(y[0], y[1], y[2], y[3]);
        } else if (fmt == MSV_ACT_BF16) {
            __nv_bfloat162  b[2];

            b[0] = __floats2bfloat162_rn(y[0], y[1]);
            b[1] = __floats2bfloat162_rn(y[2], y[3]);
            ((uint2 *) out)[(size_t) r * n4 + c] = *(uint2 *) b;
        } else {
#pragma unroll
            for (j = 0; j < 4; j++) {
                msv_store_act(out, fmt, n_rows, r, n, 4 * c + j, y[j]);
            }
        }
    }
}

cudaError_t
rmsnorm_forward(void *out, int fmt, const float *x, const int32_t *rows,
    const float *w, uint32_t n_rows, uint32_t n, float eps,
    struct msv_l2pf pf, cudaStream_t stream)
{
    cudaError_t  e;
    uint32_t     nv;

    if (n_rows == 0) {
        return cudaSuccess;
    }

    nv = MSV_CEIL_DIV(n / 4, (uint32_t) MSV_NORM_THREADS);
    if (n % 4 != 0 || nv > MSV_NORM_VEC_MAX
        || ((uintptr_t) x | (uintptr_t) w | (uintptr_t) out) % 16 != 0)
    {
        return msv_launch(rmsnorm_kernel, dim3(n_rows),
                          dim3(MSV_NORM_THREADS), 0, stream, out, fmt, x,
                          rows, w, n_rows, n, eps, pf);
    }

#define MSV_NORM_VEC(NV)                                                     \
    e = msv_launch(rmsnorm_vec_kernel<NV>, dim3(n_rows),                     \
                   dim3(MSV_NORM_THREADS), 0, stream, out, fmt, x, rows, w,  \
                   n_rows, n, eps, pf)

    if (nv <= 1) {
        MSV_NORM_VEC(1);
    } else if (nv <= 2) {
        MSV_NORM_VEC(2);
    } else if (nv <= 4) {
        MSV_NORM_VEC(4);
    } else {
        MSV_NORM_VEC(8);
    }
#undef MSV_NORM_VEC
    return e;
}
