/*
 * gemm.cu: cuBLAS is column-major; a row-major [n][rows] output is a
 * column-major rows x n matrix, so out = W . act^T there: W (row-major
 * [rows][cols], column-major cols x rows) transposed, act (column-major
 * cols x n) as is.
 */

#include "model.h"
#include "gemm.cuh"
#include "elementwise.cuh"

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
    const void *act, int fmt, uint32_t n, float *out, int accumulate,
    float *tmp, cudaStream_t stream, char *err, size_t errlen)
{
    const float   one = 1.0f, zero = 0.0f;
    cudaDataType  ab;
    float        *c;
    uint32_t      cols_n;

    if (n == 0) {
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
