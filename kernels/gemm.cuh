/*
 * gemm.cuh: linear layers through cuBLAS.  Weights are row-major
 * [rows = out features][cols = in features] as in the checkpoint, fp32
 * or bf16; activations row-major [n][cols]; outputs fp32 [n][rows].
 * Products accumulate in fp32 (CUBLAS_COMPUTE_32F: no TF32).  The
 * default path is cublasGemmEx (cuBLAS picks the algorithm per call) or,
 * for 1 to 8 rows of bf16, gemv_kernel; the batch-invariant one is
 * cublasLtMatmul with an algorithm pinned per weight shape, or for 1 to
 * 8 rows of bf16 gemv_fixed_kernel with the same bits.
 */

#ifndef MSV_GEMM_CUH
#define MSV_GEMM_CUH

#include <cublasLt.h>

#include "cuda_common.cuh"

struct msv_dmat {
    void      *p;               /* device memory */
    int        dtype;           /* MSV_F32 or MSV_BF16 */
    uint32_t   rows;
    uint32_t   cols;
};

#define MSV_GEMV_MAX  8               /* batch rows of the GEMV path */
#define MSV_GEMV_FIXED_MAX  8         /* of the fixed-order GEMV */
#define MSV_GEMM_FIXED_MAX  16        /* of the fixed-order GEMM */

/*
 * Batch-invariant products (MSV_CUDA_INVARIANT=1, --batch-invariant).
 * For each weight shape (dtype, rows, cols) one cuBLASLt algorithm is
 * pinned at create and used for every product of that shape, whatever
 * its number of rows n, 1 included (the GEMV path stays off), prefill
 * chunks and the lm_head alike.
 *
 * Why a row's output then does not depend on n: an algorithm here is a
 * fixed kernel configuration (tile, stages, swizzle, cluster shape, ...)
 * with split-K 1 and reduction scheme NONE, so each output element
 * (weight row r, token m) is summed over k by exactly one thread block,
 * in an order set by the tile and the K loop, which do not depend on n;
 * more tokens only add tiles along n.  The element is fp32 acc * alpha
 * (+ beta * the old value when accumulating), per element.  Split-K and
 * stream-K (K divided among blocks according to the grid, hence to n,
 * partial sums added in a workspace or the output) are excluded by the
 * heuristic's preference (reduction scheme mask NONE) and by reading each
 * candidate's config back; and gemm_inv_pin runs each candidate at n =
 * 1, 64 and 256 on the same leading rows and drops any whose bits differ.
 *
 * Products of 1 to MSV_GEMV_FIXED_MAX rows of bf16 take the fixed-order
 * GEMV (gemv_fixed.cuh: tensor-core steps of 16 k in ascending order, as
 * such an algorithm sums) where gemm_inv_pin found a candidate whose bits
 * it reproduces: then the plan's fixed flag is set, and every candidate
 * with those bits sums in that one order, so the plan keeps two of them:
 * the fastest at n = 64 for 9 to MSV_INV_MID_MAX rows and the fastest at
 * n = 256 past that, each checked equal to the minimax pick on a whole
 * product of that size.  Where no candidate has the GEMV's bits, every
 * size goes through the one minimax pick.
 *
 * The workspace is fixed device memory: decode steps are captured as CUDA
 * graphs, which bake in its pointer; cublasLtMatmul on a stream with a
 * caller-given workspace allocates nothing and can be captured.
 */
#define MSV_INV_SHAPES  8             /* distinct weight shapes of a model */

struct msv_inv_plan {
    int                   dtype;
    uint32_t              rows;
    uint32_t              cols;
    int                   fixed;      /* small products by gemv_fixed */
    int                   gemm;       /* with fixed: products of 9 to
                                         MSV_GEMM_FIXED_MAX rows by
                                         gemm_fixed, measured faster than
                                         algo_mid at that size */
    cublasLtMatmulAlgo_t  algo;       /* past MSV_INV_MID_MAX rows */
    cublasLtMatmulAlgo_t  algo_mid;   /* up to MSV_INV_MID_MAX rows: the
                                         same bits as algo */
};

#define MSV_INV_MID_MAX  128          /* rows of algo_mid's products */

struct msv_gemm_inv {
    cublasLtHandle_t      lt;
    void                 *ws;         /* device, fixed */
    size_t                ws_bytes;
    struct msv_inv_plan   plan[MSV_INV_SHAPES];
    int                   n_plans;
};


/* Whether every plan of inv takes the fixed-order GEMV at 1 to
 * MSV_GEMV_FIXED_MAX rows (0 with no plans). */
int gemm_inv_fixed_all(const struct msv_gemm_inv *inv);

/* lt handle for workspace ws (ws_bytes, device memory the caller owns and
 * keeps for inv's life); no plans yet.  0, or -1 with err set. */
int gemm_inv_init(struct msv_gemm_inv *inv, void *ws, size_t ws_bytes,
    char *err, size_t errlen);

void gemm_inv_free(struct msv_gemm_inv *inv);

/*
 * Pin an algorithm for w's shape unless one is pinned already (then 0
 * and line[0] = 0).  Candidates: the heuristic's results for n = 1, 64,
 * 256 without split-K; each timed on w itself at n = 1, 64, 256 (scratch
 * activations, synchronous on stream), the one whose worst ratio to the
 * default path's time over those n is smallest kept.  Where the
 * fixed-order GEMV takes w (gemv_fixed_usable), the candidates whose
 * leading MSV_GEMV_FIXED_MAX rows are its bits come first and n = 1 is
 * left out of their ratio (the GEMV runs it), and the plan's per-size
 * picks come from them (above).  line: one line naming the chosen
 * configs, their times, the default path's, that ratio and the GEMV's
 * use.  cublas times the default path.  0, or -1 with err set.
 */
int gemm_inv_pin(struct msv_gemm_inv *inv, cublasHandle_t cublas,
    const struct msv_dmat *w, cudaStream_t stream, char *line,
    size_t linelen, char *err, size_t errlen);

/* Whether linear_forward takes the GEMV path: bf16 weights and
 * activations, 1 to MSV_GEMV_MAX rows, cols a multiple of 8, not
 * batch invariant. */
int gemv_usable(const struct msv_dmat *w, int fmt, uint32_t n,
    int invariant);

/* out[n][w->rows] (+)= act[n][w->cols] . w^T, bf16 act, n <= 8. */
cudaError_t gemv_forward(const struct msv_dmat *w, const void *act,
    uint32_t n, float *out, int accumulate, cudaStream_t stream);

/* Whether gemm_fixed_forward takes the product of w with n activation
 * rows of format fmt: bf16, MSV_GEMV_FIXED_MAX < n <= MSV_GEMM_FIXED_MAX,
 * cols a multiple of 8, w 16-byte aligned. */
int gemm_fixed_usable(const struct msv_dmat *w, int fmt, uint32_t n);

/* out fp32 [n][w->rows] (+)= act [n][w->cols] . w^T in the fixed order
 * (gemv_fixed.cuh: gemm_fixed_kernel), for gemm_fixed_usable's n. */
cudaError_t gemm_fixed_forward(const struct msv_dmat *w, const void *act,
    uint32_t n, float *out, int accumulate, cudaStream_t stream);

/* Whether gemv_fixed_forward takes the product: bf16 weights (16-byte
 * aligned, cols a multiple of 8) and activations, 1 to
 * MSV_GEMV_FIXED_MAX rows. */
int gemv_fixed_usable(const struct msv_dmat *w, int fmt, uint32_t n);

/* out[n][w->rows] (+)= act[n][w->cols] . w^T in the fixed k order of
 * gemv_fixed.cuh, bf16 act, 1 <= n <= MSV_GEMV_FIXED_MAX. */
cudaError_t gemv_fixed_forward(const struct msv_dmat *w, const void *act,
    uint32_t n, float *out, int accumulate, cudaStream_t stream);

/* Whether gemv_silu_forward takes w: gemv_usable, and an even number of
 * rows (gate rows, then as many up rows). */
int gemv_silu_usable(const struct msv_dmat *w, int fmt, uint32_t n,
    int invariant);

/* out [n][w->rows / 2] = silu(gate) * up as bf16, gate and up the two
 * halves of act . w^T (rows 0 .. rows/2 - 1 and rows/2 ..): bit for bit
 * gemv_forward's fp32 products through silu_mul_forward to bf16, in one
 * kernel.  out must not overlap act. */
cudaError_t gemv_silu_forward(const struct msv_dmat *w, const void *act,
    uint32_t n, void *out, cudaStream_t stream);

/* The activation format (enum msv_act_fmt) a product with w reads: fp32
 * for fp32 weights; for bf16 weights BF16X2 when split, else BF16. */
int msv_act_fmt_for(const struct msv_dmat *w, int split);

/*
 * out = act . w^T (+ out when accumulate), act in format fmt (as
 * msv_act_fmt_for gives).  For BF16X2, tmp is scratch of [2 n][w->rows]
 * fp32; otherwise unused.  inv != NULL (not with BF16X2, which is not
 * batch invariant): through the algorithm pinned for w's shape
 * (gemm_inv_pin), an error if there is none.  The cuBLAS handle runs on
 * stream.  0, or -1 with err set.
 */
int linear_forward(cublasHandle_t cublas, const struct msv_gemm_inv *inv,
    const struct msv_dmat *w, const void *act, int fmt, uint32_t n,
    float *out, int accumulate, float *tmp, cudaStream_t stream, char *err,
    size_t errlen);

/*
 * out [n][w->rows] = act . w^T written as bf16 (the fp32 sums rounded
 * once), bf16 weights and act (MSV_ACT_BF16), no accumulation: the
 * default path's product (cublasGemmEx) for a batch that takes neither
 * the GEMV (gemv_usable) nor the batch-invariant path.  0, or -1 with
 * err set.
 */
int linear_forward_bf16(cublasHandle_t cublas, const struct msv_dmat *w,
    const void *act, uint32_t n, void *out, char *err, size_t errlen);

#endif /* MSV_GEMM_CUH */
