/*
 * gemm.cuh: linear layers through cuBLAS.  Weights are row-major
 * [rows = out features][cols = in features] as in the checkpoint, fp32
 * or bf16; activations row-major [n][cols]; outputs fp32 [n][rows].
 * Products accumulate in fp32 (CUBLAS_COMPUTE_32F: no TF32).
 */

#ifndef MSV_GEMM_CUH
#define MSV_GEMM_CUH

#include "cuda_common.cuh"

struct msv_dmat {
    void      *p;               /* device memory */
    int        dtype;           /* MSV_F32 or MSV_BF16 */
    uint32_t   rows;
    uint32_t   cols;
};

#define MSV_GEMV_MAX  8               /* batch rows of the GEMV path */

/* Whether linear_forward takes the GEMV path: bf16 weights and
 * activations, 1 to MSV_GEMV_MAX rows, cols a multiple of 8, no slices. */
int gemv_usable(const struct msv_dmat *w, int fmt, uint32_t n,
    uint32_t slice);

/* out[n][w->rows] (+)= act[n][w->cols] . w^T, bf16 act, n <= 8. */
cudaError_t gemv_forward(const struct msv_dmat *w, const void *act,
    uint32_t n, float *out, int accumulate, cudaStream_t stream);

/* The activation format (enum msv_act_fmt) a product with w reads: fp32
 * for fp32 weights; for bf16 weights BF16X2 when split, else BF16. */
int msv_act_fmt_for(const struct msv_dmat *w, int split);

/*
 * out = act . w^T (+ out when accumulate), act in format fmt (as
 * msv_act_fmt_for gives).  For BF16X2, tmp is scratch of [2 n][w->rows]
 * fp32; otherwise unused.  slice > 0 (not with BF16X2): products of
 * exactly slice rows each, for batch invariance; act and out then have
 * rows up to n rounded up to slice.  The cuBLAS handle runs on stream.
 * 0, or -1 with err set.
 */
int linear_forward(cublasHandle_t cublas, const struct msv_dmat *w,
    const void *act, int fmt, uint32_t n, uint32_t slice, float *out,
    int accumulate, float *tmp, cudaStream_t stream, char *err,
    size_t errlen);

#endif /* MSV_GEMM_CUH */
