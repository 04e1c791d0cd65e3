/*
 * attention.cuh: causal grouped-query attention over the paged KV cache.
 * Token t (at position pos[t]) attends to positions 0..pos[t] of its own
 * sequence, which the KV store of this step has already written.
 */

#ifndef MSV_ATTENTION_CUH
#define MSV_ATTENTION_CUH

#include "cuda_common.cuh"
#include "rope.cuh"

#define MSV_ATTN_MAX_HEAD_DIM  256

struct msv_attn_args {
    float          *out;        /* [n_tokens][n_heads * head_dim] */
    const float    *q;          /* token t, head h at
                                   q + t * q_stride + h * head_dim */
    uint32_t        q_stride;
    uint32_t        n_tokens;
    uint32_t        n_heads;
    uint32_t        n_kv_heads; /* divides n_heads */
    uint32_t        head_dim;   /* at most MSV_ATTN_MAX_HEAD_DIM */
    float           scale;      /* 1 / sqrt(head_dim) */
    struct msv_kv_map  kv;      /* read only here */
};

cudaError_t attention_forward(const struct msv_attn_args *a,
    cudaStream_t stream);

#endif /* MSV_ATTENTION_CUH */
