/*
 * attention.cuh: causal grouped-query attention over the paged KV cache.
 * Token t (at position pos[t]) attends to positions 0..pos[t] of its own
 * sequence, which the KV store of this step has already written.
 *
 * The keys of a token are cut into splits of MSV_ATTN_SPLIT positions
 * (split s holds positions [s * MSV_ATTN_SPLIT, (s + 1) * MSV_ATTN_SPLIT)),
 * fixed by the position alone.  Each split gives a partial softmax state
 * (max m, sum l, unnormalised output); the states are folded in split
 * order.  Whether one block walks a token's splits one after another or
 * several blocks compute them at once and a merge kernel folds them
 * (flash-decoding), the arithmetic is the same: a token's output does not
 * depend on the batch it runs in.
 */

#ifndef MSV_ATTENTION_CUH
#define MSV_ATTENTION_CUH

#include "cuda_common.cuh"
#include "rope.cuh"

#define MSV_ATTN_MAX_HEAD_DIM  256
#define MSV_ATTN_SPLIT         64      /* positions per split, a multiple
                                          of MSV_KV_BLOCK */

/* How attention_forward spreads the splits (mode). */
#define MSV_ATTN_AUTO      0           /* parallel when it pays and fits */
#define MSV_ATTN_FOLD      1           /* one block per token, serial */
#define MSV_ATTN_PARALLEL  2           /* one block per split + merge */

struct msv_attn_args {
    void           *out;        /* [n_tokens][n_heads * head_dim], out_fmt */
    int             out_fmt;    /* enum msv_act_fmt */
    const float    *q;          /* token t, head h at
                                   q + t * q_stride + h * head_dim */
    uint32_t        q_stride;
    uint32_t        n_tokens;
    uint32_t        n_heads;
    uint32_t        n_kv_heads; /* divides n_heads */
    uint32_t        head_dim;   /* even, at most MSV_ATTN_MAX_HEAD_DIM */
    float           scale;      /* 1 / sqrt(head_dim) */
    struct msv_kv_map  kv;      /* read only here */
    uint32_t        max_ctx;    /* at least every pos[t] + 1 */
    float          *part;       /* workspace for the parallel form, or
                                   NULL; part_floats floats */
    size_t          part_floats;
    int             mode;       /* MSV_ATTN_AUTO, _FOLD, _PARALLEL */
};

/* Floats of workspace the parallel form needs for the batch. */
size_t attention_part_floats(uint32_t n_tokens, uint32_t n_heads,
    uint32_t head_dim, uint32_t max_ctx);

/* cudaErrorInvalidValue when mode is MSV_ATTN_PARALLEL and the workspace
 * is too small. */
cudaError_t attention_forward(const struct msv_attn_args *a,
    cudaStream_t stream);

#endif /* MSV_ATTENTION_CUH */
