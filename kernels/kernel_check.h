/*
 * kernel_check.h: run one kernel on host arrays (upload, launch,
 * download), so that the backend suite (t/c/test_backend, its kernel
 * checks in t/c/kernel_twins.h) can compare each kernel with its CPU
 * twin.  Test code: kernel_check.cu is linked into that test only, never
 * into libmsv_worker.a.  Every function returns 0, or -1 with err set.
 */

#ifndef MSV_KERNEL_CHECK_H
#define MSV_KERNEL_CHECK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Activation formats, as enum msv_act_fmt in cuda_common.cuh. */
#define MSV_CHECK_F32     0
#define MSV_CHECK_BF16    1
#define MSV_CHECK_BF16X2  2

/* A batch's view of a paged KV cache (see struct msv_kv_map in rope.cuh);
 * the caches are host arrays [n_pages][n_kv_heads][MSV_KV_BLOCK]
 * [head_dim] of fp32.  kv_bf16: the device cache is bf16 (the host
 * values are rounded to bf16 on the way up, widened on the way back). */
struct msv_check_kv {
    uint32_t        n_tokens;
    uint32_t        n_seqs;
    uint32_t        n_entries;  /* length of pages */
    uint32_t        n_pages;
    const int32_t  *pos;        /* [n_tokens] */
    const int32_t  *tok_seq;    /* [n_tokens] */
    const int32_t  *page_off;   /* [n_seqs] */
    const int32_t  *pages;      /* [n_entries] */
    float          *k_cache;
    float          *v_cache;
    int             kv_bf16;
};

/* msv_cuda_run_attention's mode, as MSV_ATTN_* in attention.cuh. */
#define MSV_CHECK_ATTN_AUTO      0
#define MSV_CHECK_ATTN_FOLD      1
#define MSV_CHECK_ATTN_PARALLEL  2

/* out[r] = rmsnorm(x[rows ? rows[r] : r]) as format fmt, read back as
 * fp32 (BF16X2 as hi + lo).  x is [n_in_rows][n]. */
int msv_cuda_run_rmsnorm(float *out, int fmt, const float *x,
    uint32_t n_in_rows, const int32_t *rows, const float *w, uint32_t n_rows,
    uint32_t n, float eps, char *err, size_t errlen);

/* qkv [n_tokens][(n_heads + 2 n_kv_heads) head_dim] in place; bias,
 * q_norm, k_norm may be NULL; kv->k_cache/v_cache are read and written
 * back (k_cache NULL: no store). */
int msv_cuda_run_qkv_rope(float *qkv, uint32_t n_heads, uint32_t n_kv_heads,
    uint32_t head_dim, const float *bias, const float *q_norm,
    const float *k_norm, float eps, const float *inv_freq,
    const struct msv_check_kv *kv, char *err, size_t errlen);

/* msv_cuda_run_attention's tiled, as MSV_ATTN_TILED_* in attention.cuh. */
#define MSV_CHECK_TILED_AUTO  0
#define MSV_CHECK_TILED_OFF   1
#define MSV_CHECK_TILED_ON    2

/* out [n_tokens][n_heads head_dim]; q rows q_stride floats apart; mode
 * MSV_CHECK_ATTN_*: the serial and the parallel (split + merge) forms
 * must agree bit for bit; stages: the tensor-core decode kernel's K/V
 * stages (2, 3, 4; 0: chosen by the grid), the same bits whichever;
 * walk_cols: its serial form's blocks a kv head at most (0: as many as
 * the GPU holds), the same bits whichever.  tiled MSV_CHECK_TILED_*: the
 * runs of at least min_run tokens (attention_plan) by the tiled prefill
 * kernel; *n_tiles (may be NULL) the number of tiles the plan had. */
int msv_cuda_run_attention(float *out, const float *q, uint32_t q_stride,
    uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, float scale,
    const struct msv_check_kv *kv, int mode, int stages, uint32_t walk_cols,
    int tiled, uint32_t min_run, uint32_t *n_tiles, char *err,
    size_t errlen);

/* out[n][rows] (+)= act[n][cols] . w[rows][cols]^T through the GEMV path
 * (bf16 bits, n <= 8, cols a multiple of 8); out is read first when
 * accumulate. */
int msv_cuda_run_gemv(float *out, const uint16_t *w, const uint16_t *act,
    uint32_t rows, uint32_t cols, uint32_t n, int accumulate, char *err,
    size_t errlen);

/* out [n][rows / 2] = silu(gate) * up as bf16 bits, gate and up the two
 * halves of act . w^T, through the GEMV with SiLU·up fused
 * (gemv_silu_forward; rows even, n <= 8). */
int msv_cuda_run_gemv_silu(uint16_t *out, const uint16_t *w,
    const uint16_t *act, uint32_t rows, uint32_t cols, uint32_t n,
    char *err, size_t errlen);

/* out [n_rows][n] = silu(gate) * up as format fmt, read back as fp32
 * (BF16X2 as hi + lo); gu [n_rows][2 n] (gate, then up), uploaded as
 * bf16 (rounded) when gu_bf16, else fp32. */
int msv_cuda_run_silu_mul(float *out, int fmt, const float *gu,
    int gu_bf16, uint32_t n_rows, uint32_t n, char *err, size_t errlen);

/* out [n][rows] = act [n][cols] . w[rows][cols]^T written as bf16 bits
 * (linear_forward_bf16: the bf16 gate/up product), bf16 w and act. */
int msv_cuda_run_linear_bf16(uint16_t *out, const uint16_t *w,
    const uint16_t *act, uint32_t rows, uint32_t cols, uint32_t n,
    char *err, size_t errlen);

/*
 * Batch-invariant products: one cuBLASLt algorithm pinned for the shape
 * (gemm_inv_pin), then linear_forward with it for each of n_runs
 * products, run k of n[k] rows: out_k [n[k]][rows] (+)= act_k [n[k]][cols]
 * . w[rows][cols]^T, the runs' act and out concatenated in order.  fmt
 * MSV_CHECK_BF16: w and act are bf16 bits (uint16_t); MSV_CHECK_F32:
 * fp32.  out is read first when accumulate.  With silu (bf16, no
 * accumulate, rows even: w a gate/up matrix), each run is the backend's
 * SiLU·up instead: the product then silu_mul_forward, out_k [n[k]][rows /
 * 2] the bf16 results as floats.  *fixed: whether the plan sends products of 1 to 8
 * rows to the fixed-order GEMV; line: gemm_inv_pin's line.
 */
int msv_cuda_run_linear_inv(float *out, const void *w, const void *act,
    int fmt, uint32_t rows, uint32_t cols, const uint32_t *n,
    uint32_t n_runs, int accumulate, int silu, int *fixed, char *line,
    size_t linelen, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* MSV_KERNEL_CHECK_H */
