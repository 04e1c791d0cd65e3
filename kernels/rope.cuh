/*
 * rope.cuh: after the fused q/k/v projection, per token and head: add
 * the q/k/v bias (Qwen2), RMSNorm each q and k head (Qwen3), rotate q
 * and k by the token's position (Hugging Face rotate_half RoPE), and
 * store k and v into the paged KV cache.
 */

#ifndef MSV_ROPE_CUH
#define MSV_ROPE_CUH

#include "cuda_common.cuh"

/*
 * KV cache pages: k_cache and v_cache are each [n_pages][n_kv_heads]
 * [MSV_KV_BLOCK][head_dim], bf16 when kv_bf16 (the default precision),
 * fp32 otherwise (split precision).  Token t of the batch belongs to batch
 * sequence tok_seq[t] and sits at position pos[t]; its slot is page
 * pages[page_off[tok_seq[t]] + pos[t] / MSV_KV_BLOCK], row
 * pos[t] % MSV_KV_BLOCK.
 */
struct msv_kv_map {
    const int32_t  *pos;        /* [n_tokens] */
    const int32_t  *tok_seq;    /* [n_tokens] */
    const int32_t  *page_off;   /* [n_seqs] */
    const int32_t  *pages;
    void           *k_cache;
    void           *v_cache;
    int             kv_bf16;    /* elements are __nv_bfloat16, else float */
};

struct msv_qkv_args {
    float          *qkv;        /* [n_tokens][(n_heads + 2 n_kv_heads)
                                   head_dim]: q heads, k heads, v heads;
                                   rewritten in place */
    uint32_t        n_tokens;
    uint32_t        n_heads;
    uint32_t        n_kv_heads;
    uint32_t        head_dim;   /* even, at most 256 */
    const float    *bias;       /* [(n_heads + 2 n_kv_heads) head_dim]
                                   or NULL */
    const float    *q_norm;     /* [head_dim] or NULL */
    const float    *k_norm;     /* [head_dim] or NULL */
    float           eps;
    const float    *inv_freq;   /* [head_dim / 2] */
    struct msv_kv_map  kv;      /* k_cache NULL: no store */
    struct msv_l2pf    pf;      /* asked into L2 (msv_l2_prefetch) */
};

cudaError_t qkv_rope_forward(const struct msv_qkv_args *a,
    cudaStream_t stream);

#endif /* MSV_ROPE_CUH */
