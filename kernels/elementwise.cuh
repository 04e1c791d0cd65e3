/*
 * elementwise.cuh: the small kernels between the matrix products:
 * embedding gather, SiLU(gate) * up, fp32 -> activation format, and the
 * hi + lo sum after a BF16X2 product (with the residual add).
 */

#ifndef MSV_ELEMENTWISE_CUH
#define MSV_ELEMENTWISE_CUH

#include "cuda_common.cuh"

/* out[t][:] = table[tokens[t]][:], table [*][n] fp32 or bf16 (dtype is
 * enum msv_dtype: MSV_F32 or MSV_BF16). */
cudaError_t embed_forward(float *out, const void *table, int dtype,
    const int32_t *tokens, uint32_t n_tokens, uint32_t n,
    cudaStream_t stream);

/* gu is [n_rows][2 n], fp32 (gu_dtype MSV_F32) or bf16 (MSV_BF16): gate
 * in columns [0, n), up in [n, 2 n).  Writes silu(gate) * up as the
 * [n_rows][n] activation matrix out (fmt). */
cudaError_t silu_mul_forward(void *out, int fmt, const void *gu,
    int gu_dtype, uint32_t n_rows, uint32_t n, cudaStream_t stream);

/* Writes the fp32 [n_rows][n] matrix x as activation matrix out (fmt). */
cudaError_t to_act_forward(void *out, int fmt, const float *x,
    uint32_t n_rows, uint32_t n, cudaStream_t stream);

/* tmp is [2 n_rows][n] (the products with hi and with lo):
 * out = (accumulate ? out : 0) + tmp[r] + tmp[n_rows + r]. */
cudaError_t split_sum_forward(float *out, const float *tmp, uint32_t n_rows,
    uint32_t n, int accumulate, cudaStream_t stream);

#endif /* MSV_ELEMENTWISE_CUH */
