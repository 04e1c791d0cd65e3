/*
 * gemm.cu: cuBLAS is column-major; a row-major [n][rows] output is a
 * column-major rows x n matrix, so out = W . act^T there: W (row-major
 * [rows][cols], column-major cols x rows) transposed, act (column-major
 * cols x n) as is.
 */

#include "model.h"
#include "gemm.cuh"
#include "elementwise.cuh"

#define MSV_GEMV_WARPS  4
#define MSV_GEMV_ROWS   2              /* weight rows per warp */
#define MSV_GEMV_UNROLL 4


/*
 * out[m][r] (+)= sum_k w[r][k] act[m][k] for M batch rows, bf16 in, fp32
 * sums: a warp takes MSV_GEMV_ROWS weight rows, each lane 16-byte words
 * (8 elements) of them, MSV_GEMV_UNROLL words in flight; the activation
 * words come through the cache, each used for every row of the warp.
 * Decode at small batch reads every weight once at near copy speed,
 * which cuBLAS does not at M = 1.
 */
template <int M>
static __global__ void __launch_bounds__(MSV_GEMV_WARPS * 32)
gemv_kernel(const __nv_bfloat16 *w, const __nv_bfloat16 *act,
    uint32_t rows, uint32_t cols, float *out, int accumulate)
{
    const uint4  *wr[MSV_GEMV_ROWS], *xr[M];
    uint4         wv[MSV_GEMV_UNROLL][MSV_GEMV_ROWS], xv;
    float         acc[MSV_GEMV_ROWS][M];
    uint32_t      r0, lane, nw, k, i, u;
    int           q, m, off;
    float2        a, b;

    r0 = (blockIdx.x * MSV_GEMV_WARPS + (threadIdx.x >> 5)) * MSV_GEMV_ROWS;
    lane = threadIdx.x & 31;
    if (r0 >= rows) {
        return;
    }
    nw = cols / 8;

#pragma unroll
    for (q = 0; q < MSV_GEMV_ROWS; q++) {
        wr[q] = (const uint4 *) (w + (size_t) min(r0 + q, rows - 1) * cols);
#pragma unroll
        for (m = 0; m < M; m++) {
            acc[q][m] = 0.0f;
        }
    }
#pragma unroll
    for (m = 0; m < M; m++) {
        xr[m] = (const uint4 *) (act + (size_t) m * cols);
    }

    for (k = lane; k < nw; k += 32 * MSV_GEMV_UNROLL) {
        /* every weight word of this round first: loads in flight */
#pragma unroll
        for (i = 0; i < MSV_GEMV_UNROLL; i++) {
#pragma unroll
            for (q = 0; q < MSV_GEMV_ROWS; q++) {
                wv[i][q] = k + 32 * i < nw ? __ldcs(wr[q] + k + 32 * i)
                                           : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (i = 0; i < MSV_GEMV_UNROLL; i++) {
            if (k + 32 * i >= nw) {
                continue;
            }
#pragma unroll
            for (m = 0; m < M; m++) {
                xv = __ldg(xr[m] + k + 32 * i);
#pragma unroll
                for (u = 0; u < 4; u++) {
                    a = __bfloat1622float2(((const __nv_bfloat162 *) &xv)[u]);
#pragma unroll
                    for (q = 0; q < MSV_GEMV_ROWS; q++) {
                        b = __bfloat1622float2(
                                ((const __nv_bfloat162 *) &wv[i][q])[u]);
                        acc[q][m] += a.x * b.x + a.y * b.y;
                    }
                }
            }
        }
    }

#pragma unroll
    for (q = 0; q < MSV_GEMV_ROWS; q++) {
#pragma unroll
        for (m = 0; m < M; m++) {
            for (off = 16; off > 0; off >>= 1) {
                acc[q][m] += __shfl_xor_sync(0xffffffffu, acc[q][m], off);
            }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (q = 0; q < MSV_GEMV_ROWS; q++) {
            if (r0 + q >= rows) {
                break;
            }
#pragma unroll
            for (m = 0; m < M; m++) {
                float  *o = out + (size_t) m * rows + r0 + q;

                *o = accumulate ? *o + acc[q][m] : acc[q][m];
            }
        }
    }
}


int
gemv_usable(const struct msv_dmat *w, int fmt, uint32_t n, uint32_t slice)
{
    return slice == 0 && w->dtype == MSV_BF16 && fmt == MSV_ACT_BF16
           && n >= 1 && n <= MSV_GEMV_MAX && w->cols % 8 == 0;
}


cudaError_t
gemv_forward(const struct msv_dmat *w, const void *act, uint32_t n,
    float *out, int accumulate, cudaStream_t stream)
{
    const __nv_bfloat16  *wp = (const __nv_bfloat16 *) w->p;
    const __nv_bfloat16  *x = (const __nv_bfloat16 *) act;
    unsigned              blocks;

    blocks = MSV_CEIL_DIV(w->rows, (uint32_t) (MSV_GEMV_WARPS
                                               * MSV_GEMV_ROWS));
    switch (n) {
#define MSV_GEMV_CASE(M)                                                     \
    case M:                                                                  \
        gemv_kernel<M><<<blocks, MSV_GEMV_WARPS * 32, 0, stream>>>(wp, x,    \
            w->rows, w->cols, out, accumulate);                              \
        break
    MSV_GEMV_CASE(1);
    MSV_GEMV_CASE(2);
    MSV_GEMV_CASE(3);
    MSV_GEMV_CASE(4);
    MSV_GEMV_CASE(5);
    MSV_GEMV_CASE(6);
    MSV_GEMV_CASE(7);
    MSV_GEMV_CASE(8);
#undef MSV_GEMV_CASE
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}


int
msv_act_fmt_for(const struct msv_dmat *w, int split)
{
    if (w->dtype == MSV_F32) {
        return MSV_ACT_F32;
    }
    return split ? MSV_ACT_BF16X2 : MSV_ACT_BF16;
}

int
linear_forward(cublasHandle_t cublas, const struct msv_dmat *w,
    const void *act, int fmt, uint32_t n, uint32_t slice, float *out,
    int accumulate, float *tmp, cudaStream_t stream, char *err,
    size_t errlen)
{
    const float   one = 1.0f, zero = 0.0f;
    cudaDataType  ab;
    float        *c;
    uint32_t      cols_n, r0;
    size_t        esz;

    if (n == 0) {
        return 0;
    }

    if (gemv_usable(w, fmt, n, slice)) {
        MSV_CUDA_TRY(gemv_forward(w, act, n, out, accumulate, stream),
                     err, errlen);
        return 0;
    }

    /* batch invariant: every row goes through a product of exactly slice
     * rows, so cuBLAS picks the same algorithm (and reduction order)
     * whatever the batch; rows past n are scratch */
    if (slice != 0 && fmt != MSV_ACT_BF16X2) {
        ab = w->dtype == MSV_F32 ? CUDA_R_32F : CUDA_R_16BF;
        esz = fmt == MSV_ACT_F32 ? 4 : 2;
        for (r0 = 0; r0 < n; r0 += slice) {
            MSV_CUBLAS_TRY(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N,
                                        (int) w->rows, (int) slice,
                                        (int) w->cols, &one, w->p, ab,
                                        (int) w->cols,
                                        (const char *) act
                                        + (size_t) r0 * w->cols * esz,
                                        ab, (int) w->cols,
                                        accumulate ? &one : &zero,
                                        out + (size_t) r0 * w->rows,
                                        CUDA_R_32F, (int) w->rows,
                                        CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT),
                           err, errlen);
        }
        return 0;
    }

    ab = w->dtype == MSV_F32 ? CUDA_R_32F : CUDA_R_16BF;
    c = out;
    cols_n = n;

    if (fmt == MSV_ACT_BF16X2) {
        c = tmp;
        cols_n = 2 * n;
    }

    MSV_CUBLAS_TRY(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N,
                                (int) w->rows, (int) cols_n, (int) w->cols,
                                &one, w->p, ab, (int) w->cols,
                                act, ab, (int) w->cols,
                                (accumulate && c == out) ? &one : &zero,
                                c, CUDA_R_32F, (int) w->rows,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   err, errlen);

    if (fmt == MSV_ACT_BF16X2) {
        MSV_CUDA_TRY(split_sum_forward(out, tmp, n, w->rows, accumulate,
                                       stream), err, errlen);
    }
    return 0;
}
