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
 *
 * Prefill runs (many consecutive query tokens of one sequence) can be
 * computed instead by a tiled kernel that loads each K/V split once for a
 * tile of queries (attention_plan cuts the runs into tiles); its splits
 * and fold are the same, its score and value sums are not (tensor-core
 * products over the tile), so a token's output then depends on whether
 * its run was tiled: the batch-invariant mode never tiles.
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

/* Whether attention_forward computes the plan's tiles with the tiled
 * prefill kernel (tiled). */
#define MSV_ATTN_TILED_AUTO  0         /* when the KV and shapes allow it */
#define MSV_ATTN_TILED_OFF   1         /* never: every token per token */
#define MSV_ATTN_TILED_ON    2         /* always; cudaErrorInvalidValue
                                          when the shapes do not allow it */

#define MSV_ATTN_TILE_ROWS   64        /* (token, head) rows of a tile */
#define MSV_ATTN_TILE_MIN    16        /* the shortest run worth a tile:
                                          a full one at 4 heads per kv
                                          head; shorter runs (decode,
                                          short chunks) re-read few keys */

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
    int             stages;     /* K/V stages of the tensor-core decode
                                   kernel: 2, 3 or 4; 0: chosen by the
                                   grid (the same bits either way) */

    /* the prefill plan (attention_plan), device arrays; n_tiles 0: none */
    const int32_t  *tiles;      /* [n_tiles][2]: first token, count */
    uint32_t        n_tiles;
    const int32_t  *rest;       /* [n_rest]: the tokens of no tile */
    uint32_t        n_rest;
    int             tiled;      /* MSV_ATTN_TILED_AUTO, _OFF, _ON */

    /* the decode kernel's serial form: blocks of a kv head at most
     * (0: as many as the GPU holds at once, each walking every
     * walk_cols-th token; tests set a few, so that blocks walk several);
     * walk_n is set by the decode kernel's launcher (the tokens it walks) */
    uint32_t        walk_cols;
    uint32_t        walk_n;
};

/*
 * The context bound to capture a decode step of n_tokens tokens (one a
 * sequence, no tile) for, so that its graph serves every step of that
 * size whose longest context is at most max_ctx: max_len (the model's
 * longest) where the form attention_forward takes for such a batch
 * (mode, MSV_ATTN_*) walks each token's splits in one block, whatever the
 * context, so one graph serves every context; else the power-of-two
 * bound of max_ctx in positions (the parallel form's grid has a block
 * per split), from MSV_ATTN_SPLIT up.
 */
uint32_t attention_decode_bound(uint32_t n_tokens, uint32_t n_heads,
    uint32_t n_kv_heads, uint32_t head_dim, int kv_bf16, int mode,
    uint32_t max_ctx, uint32_t max_len);

/* Query tokens of a tile when ratio query heads share a kv head. */
uint32_t attention_tile_tokens(uint32_t ratio);

/*
 * The prefill plan of a batch (host arrays pos, tok_seq of n_tokens):
 * each run of at least min_run consecutive tokens of one sequence at
 * consecutive positions is cut into tiles of attention_tile_tokens(ratio)
 * tokens, written to tiles as (first token, count) pairs (room for
 * n_tokens pairs); every other token goes to rest (room for n_tokens), in
 * batch order.  Returns the number of tiles, *n_rest the rest's length.
 */
uint32_t attention_plan(const int32_t *pos, const int32_t *tok_seq,
    uint32_t n_tokens, uint32_t ratio, uint32_t min_run, int32_t *tiles,
    int32_t *rest, uint32_t *n_rest);

/* Floats of workspace the parallel form needs for the batch. */
size_t attention_part_floats(uint32_t n_tokens, uint32_t n_heads,
    uint32_t head_dim, uint32_t max_ctx);

/* cudaErrorInvalidValue when mode is MSV_ATTN_PARALLEL and the workspace
 * is too small, or tiled is MSV_ATTN_TILED_ON and the tiled kernel cannot
 * take the batch (fp32 KV, head_dim other than 16, 32, 64, 128, more than
 * 8 query heads per kv head, no tiles). */
cudaError_t attention_forward(const struct msv_attn_args *a,
    cudaStream_t stream);

#endif /* MSV_ATTENTION_CUH */
