/*
 * norm.cu: RMSNorm, one block per row.
 */

#include "norm.cuh"

#define MSV_NORM_THREADS  256

static __global__ void
rmsnorm_kernel(void *out, int fmt, const float *x, const int32_t *rows,
    const float *w, uint32_t n_rows, uint32_t n, float eps)
{
    __shared__ float  red[33];
    const float      *xr;
    uint32_t          r, i;
    float             ss, scale, v;

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

cudaError_t
rmsnorm_forward(void *out, int fmt, const float *x, const int32_t *rows,
    const float *w, uint32_t n_rows, uint32_t n, float eps,
    cudaStream_t stream)
{
    if (n_rows == 0) {
        return cudaSuccess;
    }

    rmsnorm_kernel<<<n_rows, MSV_NORM_THREADS, 0, stream>>>(out, fmt, x,
        rows, w, n_rows, n, eps);
    return cudaGetLastError();
}
