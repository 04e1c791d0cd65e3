/*
 * norm.cuh: RMSNorm over rows, as Hugging Face computes it in fp32:
 * out = w * (x * rsqrt(mean(x^2) + eps)).
 */

#ifndef MSV_NORM_CUH
#define MSV_NORM_CUH

#include "cuda_common.cuh"

/*
 * x is [*][n] fp32; output row r normalizes input row rows[r] (rows NULL:
 * row r) and is written as row r of the [n_rows][n] activation matrix out
 * in format fmt (enum msv_act_fmt).  w is [n].  The kernel asks for pf
 * (bytes 0: nothing) to be brought into L2 (msv_l2_prefetch).
 */
cudaError_t rmsnorm_forward(void *out, int fmt, const float *x,
    const int32_t *rows, const float *w, uint32_t n_rows, uint32_t n,
    float eps, struct msv_l2pf pf, cudaStream_t stream);

#endif /* MSV_NORM_CUH */
