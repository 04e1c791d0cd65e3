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

/* The activation format (enum msv_act_fmt) a product with w reads: fp32
 * for fp32 weights; for bf16 weights BF16X2 when split, else BF16. */
int msv_act_fmt_for(const struct msv_dmat *w, int split);

/*
 * out = act . w^T (+ out when accumulate), act in format fmt (as
 * msv_act_fmt_for gives).  For BF16X2, tmp is scratch of [2 n][w->rows]
 * fp32; otherwise unused.  The cuBLAS handle runs on stream.  0, or -1
 * with err set.
 */
int linear_forward(cublasHandle_t cublas, const struct msv_dmat *w,
    const void *act, int fmt, uint32_t n, float *out, int accumulate,
    float *tmp, cudaStream_t stream, char *err, size_t errlen);

#endif /* MSV_GEMM_CUH */
