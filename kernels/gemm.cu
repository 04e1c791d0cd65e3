/*
 * gemm.cu: cuBLAS is column-major; a row-major [n][rows] output is a
 * column-major rows x n matrix, so out = W . act^T there: W (row-major
 * [rows][cols], column-major cols x rows) transposed, act (column-major
 * cols x n) as is.
 */

#include <stdio.h>
#include <string.h>

#include "model.h"
#include "gemm.cuh"
#include "gemv.cuh"
#include "gemv_fixed.cuh"
#include "elementwise.cuh"

int
gemv_usable(const struct msv_dmat *w, int fmt, uint32_t n, int invariant)
{
    return !invariant && w->dtype == MSV_BF16 && fmt == MSV_ACT_BF16
           && n >= 1 && n <= MSV_GEMV_MAX && w->cols % 8 == 0;
}


/*
 * The GEMV's shape for n rows (gemv.cuh's M, R, U, KS and W), the fastest
 * of bench/gemv_rate.cu's candidates on the H200 at n = 1, 2, 4 and 8
 * (bench/results/engine.md): eight warps to a row at n <= 2, where the
 * time is the weight read (at n = 2 four rows a group, a word a lane a
 * round), down to one at n >= 6, where the products weigh.  Every R is
 * even (the SILU form pairs rows).
 */
#define MSV_GEMV_SHAPES(X)                                                   \
    X(1, 2, 2, 8, 8) X(2, 4, 1, 8, 8)                                        \
    X(3, 4, 2, 4, 4) X(4, 4, 2, 4, 4) X(5, 4, 2, 4, 4)                       \
    X(6, 2, 4, 1, 4) X(7, 2, 4, 1, 4) X(8, 2, 4, 1, 4)

template <bool SILU>
static cudaError_t
msv_gemv(const struct msv_dmat *w, const void *act, uint32_t n, void *out,
    int accumulate, cudaStream_t stream)
{
    const __nv_bfloat16  *wp = (const __nv_bfloat16 *) w->p;
    const __nv_bfloat16  *x = (const __nv_bfloat16 *) act;

    switch (n) {
#define MSV_GEMV_CASE(M, R, U, KS, W)                                        \
    case M:                                                                  \
        return gemv_launch_m<M, R, U, KS, false, W, SILU>(                   \
                   wp, x, w->rows, w->cols, out, accumulate, stream);
    MSV_GEMV_SHAPES(MSV_GEMV_CASE)
#undef MSV_GEMV_CASE
    default:
        return cudaErrorInvalidValue;
    }
}


cudaError_t
gemv_forward(const struct msv_dmat *w, const void *act, uint32_t n,
    float *out, int accumulate, cudaStream_t stream)
{
    return msv_gemv<false>(w, act, n, out, accumulate, stream);
}


int
gemv_silu_usable(const struct msv_dmat *w, int fmt, uint32_t n,
    int invariant)
{
    return gemv_usable(w, fmt, n, invariant) && w->rows % 2 == 0;
}


cudaError_t
gemv_silu_forward(const struct msv_dmat *w, const void *act, uint32_t n,
    void *out, cudaStream_t stream)
{
    return msv_gemv<true>(w, act, n, out, 0, stream);
}


int
gemv_fixed_usable(const struct msv_dmat *w, int fmt, uint32_t n)
{
    return w->dtype == MSV_BF16 && fmt == MSV_ACT_BF16 && n >= 1
           && n <= MSV_GEMV_FIXED_MAX && w->cols % 8 == 0
           && (uintptr_t) w->p % 16 == 0;
}


/*
 * The fixed-order GEMV's shape (gemv_fixed.cuh's KC, S, NW): stages of
 * 256 columns (4 KB of a warp's 8 weight rows, as much of its activation
 * rows), 3 of them in a warp's ring, 4 warps a block (96 KB of shared
 * memory: two blocks an SM), the fastest of bench/gemv_rate.cu's
 * candidates on the H200 for every Qwen3-8B shape at n = 1 (the step's
 * products 4.37 ms against 4.71 for 128 columns, 6 stages; the default
 * GEMV 3.67, bench/results/engine.md).  A 16-row form was slower than the
 * pinned algorithms at 9 to 16 rows.
 */
cudaError_t
gemv_fixed_forward(const struct msv_dmat *w, const void *act, uint32_t n,
    float *out, int accumulate, cudaStream_t stream)
{
    return gemv_fixed_launch<256, 3, 4>((const __nv_bfloat16 *) w->p,
                                        (const __nv_bfloat16 *) act,
                                        w->rows, w->cols, n, out,
                                        accumulate, stream);
}


int
gemm_fixed_usable(const struct msv_dmat *w, int fmt, uint32_t n)
{
    return w->dtype == MSV_BF16 && fmt == MSV_ACT_BF16
           && n > MSV_GEMV_FIXED_MAX && n <= MSV_GEMM_FIXED_MAX
           && w->cols % 8 == 0 && (uintptr_t) w->p % 16 == 0;
}


/*
 * The fixed-order GEMM's shape: stages of 128 columns, 4 of them, 4
 * warps (32 weight rows) a block, one m tile (up to 16 activation rows):
 * 48 KB a block.  Forms with 2, 4 and 8 m tiles a warp (up to 128 rows)
 * had the bits but ran 1.2x-11x slower than the pinned algorithms at 32
 * to 128 rows (bench/results/engine.md).
 */
cudaError_t
gemm_fixed_forward(const struct msv_dmat *w, const void *act, uint32_t n,
    float *out, int accumulate, cudaStream_t stream)
{
    return gemm_fixed_launch<128, 4, 4, 1>((const __nv_bfloat16 *) w->p,
                                           (const __nv_bfloat16 *) act,
                                           w->rows, w->cols, n, out,
                                           accumulate, stream);
}


/* ---- batch-invariant products: pinned cuBLASLt algorithms --------------- */

#define MSV_INV_CAND   8       /* heuristic results asked per batch size */
#define MSV_INV_TN     3       /* batch sizes of msv_inv_time_n */
#define MSV_INV_MAXC   (MSV_INV_TN * MSV_INV_CAND)
#define MSV_INV_REPS   5       /* timed runs of a product */
#define MSV_INV_ALIGN  16      /* bytes of alignment an algorithm may need */

/* The batch sizes candidates come from and are timed at.  The timing runs
 * share the scratch activations' leading rows, so their outputs' leading
 * rows must be the same bits. */
static const uint32_t  msv_inv_time_n[MSV_INV_TN] = { 1, 64, 256 };

/* Batch sizes a candidate must accept (cublasLtMatmulAlgoCheck): decode
 * buckets, prefill chunks, lm_head chunks and odd sizes between. */
static const uint32_t  msv_inv_check_n[] = {
    1, 2, 3, 5, 8, 9, 16, 17, 33, 64, 100, 255, 256, 512, 1000, 4096, 8192,
    65536
};

/*
 * out [n][rows] = act [n][cols] . w^T in cuBLASLt's column-major terms:
 * D (rows x n) = op(A) B with A = w as a cols x rows matrix, transposed,
 * B = act as cols x n, and C = D = out as rows x n.
 */
struct msv_inv_op {
    cublasLtMatmulDescOpaque_t    desc;
    cublasLtMatrixLayoutOpaque_t  a;
    cublasLtMatrixLayoutOpaque_t  b;
    cublasLtMatrixLayoutOpaque_t  c;
};

/* An algorithm's configuration, as cublasLtMatmulAlgoConfigAttributes_t
 * types it. */
struct msv_inv_cfg {
    int32_t   id;
    uint32_t  tile;
    int32_t   splitk;
    uint32_t  reduction;
    uint32_t  swizzle;
    uint32_t  custom;
    uint32_t  stages;
    uint16_t  inner;
    uint16_t  cluster;
};


/* Pseudo-random values in [-1, 1) (a hash of the index): the scratch
 * activations of the timing runs, finite and with varied low bits. */
static __global__ void
inv_fill_kernel(void *p, int f32, size_t n)
{
    size_t    i;
    uint32_t  h;
    float     v;

    for (i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < n;
         i += (size_t) gridDim.x * blockDim.x)
    {
        h = (uint32_t) i * 2654435761u + 0x9e3779b9u;
        h ^= h >> 15;
        h *= 0x2c1b3c6du;
        h ^= h >> 12;
        v = (float) (h >> 8) * (2.0f / 16777216.0f) - 1.0f;
        if (f32) {
            ((float *) p)[i] = v;
        } else {
            ((__nv_bfloat16 *) p)[i] = __float2bfloat16(v);
        }
    }
}


/* *count += the number of 32-bit words where a and b differ. */
static __global__ void
inv_differ_kernel(const uint32_t *a, const uint32_t *b, size_t n,
    unsigned int *count)
{
    size_t  i;

    for (i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < n;
         i += (size_t) gridDim.x * blockDim.x)
    {
        if (a[i] != b[i]) {
            atomicAdd(count, 1u);
        }
    }
}


static const char *
msv_inv_dtype(const struct msv_dmat *w)
{
    return w->dtype == MSV_F32 ? "f32" : "bf16";
}


static const struct msv_inv_plan *
msv_inv_find(const struct msv_gemm_inv *inv, const struct msv_dmat *w)
{
    int  i;

    for (i = 0; i < inv->n_plans; i++) {
        if (inv->plan[i].dtype == w->dtype && inv->plan[i].rows == w->rows
            && inv->plan[i].cols == w->cols)
        {
            return &inv->plan[i];
        }
    }
    return NULL;
}


/* The descriptors of a product of n rows with w: host-side structures
 * initialised in place, nothing allocated. */
static int
msv_inv_op_init(struct msv_inv_op *op, const struct msv_dmat *w, uint32_t n,
    char *err, size_t errlen)
{
    cudaDataType  ab;
    int32_t       ta;

    ab = w->dtype == MSV_F32 ? CUDA_R_32F : CUDA_R_16BF;
    ta = CUBLAS_OP_T;
    MSV_CUBLAS_TRY(cublasLtMatmulDescInit(&op->desc, CUBLAS_COMPUTE_32F,
                                          CUDA_R_32F), err, errlen);
    MSV_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(&op->desc,
                                                  CUBLASLT_MATMUL_DESC_TRANSA,
                                                  &ta, sizeof(ta)),
                   err, errlen);
    MSV_CUBLAS_TRY(cublasLtMatrixLayoutInit(&op->a, ab, w->cols, w->rows,
                                            w->cols), err, errlen);
    MSV_CUBLAS_TRY(cublasLtMatrixLayoutInit(&op->b, ab, w->cols, n, w->cols),
                   err, errlen);
    MSV_CUBLAS_TRY(cublasLtMatrixLayoutInit(&op->c, CUDA_R_32F, w->rows, n,
                                            w->rows), err, errlen);
    return 0;
}


/* out (+)= act . w^T through algo, on stream, with inv's workspace. */
static int
msv_inv_run(const struct msv_gemm_inv *inv, const cublasLtMatmulAlgo_t *algo,
    const struct msv_dmat *w, const void *act, uint32_t n, float *out,
    int accumulate, cudaStream_t stream, char *err, size_t errlen)
{
    const float        one = 1.0f, zero = 0.0f;
    struct msv_inv_op  op;

    if (msv_inv_op_init(&op, w, n, err, errlen) != 0) {
        return -1;
    }
    MSV_CUBLAS_TRY(cublasLtMatmul(inv->lt, &op.desc, &one, w->p, &op.a, act,
                                  &op.b, accumulate ? &one : &zero, out,
                                  &op.c, out, &op.c, algo, inv->ws,
                                  inv->ws_bytes, stream),
                   err, errlen);
    return 0;
}


static int
msv_inv_cfg_get(const cublasLtMatmulAlgo_t *algo, struct msv_inv_cfg *c,
    char *err, size_t errlen)
{
    size_t  got;

#define MSV_INV_CFG(attr, field)                                             \
    MSV_CUBLAS_TRY(cublasLtMatmulAlgoConfigGetAttribute(algo, attr,          \
                       &c->field, sizeof(c->field), &got), err, errlen)
    MSV_INV_CFG(CUBLASLT_ALGO_CONFIG_ID, id);
    MSV_INV_CFG(CUBLASLT_ALGO_CONFIG_TILE_ID, tile);
    MSV_INV_CFG(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, splitk);
    MSV_INV_CFG(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, reduction);
    MSV_INV_CFG(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, swizzle);
    MSV_INV_CFG(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, custom);
    MSV_INV_CFG(CUBLASLT_ALGO_CONFIG_STAGES_ID, stages);
    MSV_INV_CFG(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, inner);
    MSV_INV_CFG(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, cluster);
#undef MSV_INV_CFG
    return 0;
}


/* Whether algo runs products of every size of msv_inv_check_n with w
 * within the workspace: 1 or 0; -1 with err set. */
static int
msv_inv_accepts(const struct msv_gemm_inv *inv, const struct msv_dmat *w,
    const cublasLtMatmulAlgo_t *algo, char *err, size_t errlen)
{
    cublasLtMatmulHeuristicResult_t  r;
    struct msv_inv_op                op;
    size_t                           i;

    for (i = 0; i < sizeof(msv_inv_check_n) / sizeof(msv_inv_check_n[0]);
         i++)
    {
        if (msv_inv_op_init(&op, w, msv_inv_check_n[i], err, errlen) != 0) {
            return -1;
        }
        memset(&r, 0, sizeof(r));
        if (cublasLtMatmulAlgoCheck(inv->lt, &op.desc, &op.a, &op.b, &op.c,
                                    &op.c, algo, &r)
            != CUBLAS_STATUS_SUCCESS
            || r.workspaceSize > inv->ws_bytes)
        {
            return 0;
        }
    }
    return 1;
}


/* The heuristic's algorithms for w at each batch size of msv_inv_time_n,
 * without split-K or any reduction across blocks, that accept every size
 * of msv_inv_check_n; each once. */
static int
msv_inv_candidates(const struct msv_gemm_inv *inv, const struct msv_dmat *w,
    cublasLtMatmulAlgo_t *cand, int *n_cand, char *err, size_t errlen)
{
    cublasLtMatmulPreferenceOpaque_t  pref;
    cublasLtMatmulHeuristicResult_t   res[MSV_INV_CAND];
    struct msv_inv_op                 op;
    struct msv_inv_cfg                cfg;
    uint64_t                          ws;
    uint32_t                          mask, align;
    cublasStatus_t                    s;
    int                               got, i, j, k, a;
    static const cublasLtMatmulPreferenceAttributes_t  aligns[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES
    };

    *n_cand = 0;
    ws = inv->ws_bytes;
    mask = CUBLASLT_REDUCTION_SCHEME_NONE;
    align = MSV_INV_ALIGN;
    MSV_CUBLAS_TRY(cublasLtMatmulPreferenceInit(&pref), err, errlen);
    MSV_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(&pref,
                       CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                       sizeof(ws)), err, errlen);
    MSV_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(&pref,
                       CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask,
                       sizeof(mask)), err, errlen);
    for (a = 0; a < (int) (sizeof(aligns) / sizeof(aligns[0])); a++) {
        MSV_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(&pref, aligns[a],
                           &align, sizeof(align)), err, errlen);
    }

    for (k = 0; k < MSV_INV_TN; k++) {
        if (msv_inv_op_init(&op, w, msv_inv_time_n[k], err, errlen) != 0) {
            return -1;
        }
        got = 0;
        s = cublasLtMatmulAlgoGetHeuristic(inv->lt, &op.desc, &op.a, &op.b,
                                           &op.c, &op.c, &pref, MSV_INV_CAND,
                                           res, &got);
        if (s == CUBLAS_STATUS_NOT_SUPPORTED) {
            continue;       /* nothing for this size */
        }
        if (s != CUBLAS_STATUS_SUCCESS) {
            return msv_cublas_fail(err, errlen,
                                   "cublasLtMatmulAlgoGetHeuristic",
                                   __FILE__, __LINE__, s);
        }
        for (i = 0; i < got; i++) {
            if (res[i].state != CUBLAS_STATUS_SUCCESS) {
                continue;
            }
            if (msv_inv_cfg_get(&res[i].algo, &cfg, err, errlen) != 0) {
                return -1;
            }
            if (cfg.splitk > 1
                || cfg.reduction != CUBLASLT_REDUCTION_SCHEME_NONE)
            {
                continue;
            }
            for (j = 0; j < *n_cand; j++) {
                if (memcmp(&cand[j], &res[i].algo, sizeof(cand[j])) == 0) {
                    break;
                }
            }
            if (j < *n_cand) {
                continue;
            }
            a = msv_inv_accepts(inv, w, &res[i].algo, err, errlen);
            if (a < 0) {
                return -1;
            }
            if (a) {
                cand[(*n_cand)++] = res[i].algo;
            }
        }
    }
    return 0;
}


int
gemm_inv_fixed_all(const struct msv_gemm_inv *inv)
{
    int  i;

    for (i = 0; i < inv->n_plans; i++) {
        if (!inv->plan[i].fixed) {
            return 0;
        }
    }
    return inv->n_plans > 0;
}


/* The path msv_inv_time times when no algorithm is given. */
#define MSV_INV_DEFAULT  0            /* the default path */
#define MSV_INV_FIXED    1            /* the fixed-order GEMV */
#define MSV_INV_GEMM     2            /* the fixed-order GEMM */

/* Every word of p[0 .. words) read once: what the L2 cache held is
 * evicted for clean lines (the sink is never written in practice). */
static __global__ void
inv_flush_kernel(const uint4 *p, size_t words, unsigned int *sink)
{
    unsigned int  acc = 0;
    size_t        i;

    for (i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < words;
         i += (size_t) gridDim.x * blockDim.x)
    {
        uint4  v = __ldcg(p + i);

        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) {
        *sink = acc;
    }
}

/*
 * Mean milliseconds of MSV_INV_REPS products out [n] = act [n] . w^T
 * after one untimed one, through algo or (NULL) the path named by
 * other, each timed alone after flush (flush_words 16-byte words, twice
 * the L2 cache) has been read: a decode step reads every weight from
 * memory (36 layers of distinct weights, 15 GB), where timings one after
 * another find most of a weight of 48 MB or less in the cache (the pick
 * at n = 64 by such timings ran the step's products 1.40 ms slower than
 * the default path's, bench/results/engine.md).  sink: the flush's.
 * 0, or -1 with err set.
 */
static int
msv_inv_time(const struct msv_gemm_inv *inv, cublasHandle_t cublas,
    const cublasLtMatmulAlgo_t *algo, int other, const struct msv_dmat *w,
    const void *act, uint32_t n, float *out, const uint4 *flush,
    size_t flush_words, unsigned int *sink, cudaStream_t stream,
    cudaEvent_t ev[2], float *ms, char *err, size_t errlen)
{
    cudaError_t  e;
    float        t, sum;
    int          i, fmt, rc;

    fmt = w->dtype == MSV_F32 ? MSV_ACT_F32 : MSV_ACT_BF16;
    sum = 0.0f;
    for (i = 0; i <= MSV_INV_REPS; i++) {
        inv_flush_kernel<<<1024, 256, 0, stream>>>(flush, flush_words, sink);
        MSV_CUDA_TRY(cudaGetLastError(), err, errlen);
        MSV_CUDA_TRY(cudaEventRecord(ev[0], stream), err, errlen);
        if (algo != NULL) {
            rc = msv_inv_run(inv, algo, w, act, n, out, 0, stream, err,
                             errlen);
        } else if (other == MSV_INV_FIXED) {
            e = gemv_fixed_forward(w, act, n, out, 0, stream);
            rc = e == cudaSuccess ? 0
                 : msv_cuda_fail(err, errlen, "gemv_fixed_forward",
                                 __FILE__, __LINE__, e);
        } else if (other == MSV_INV_GEMM) {
            e = gemm_fixed_forward(w, act, n, out, 0, stream);
            rc = e == cudaSuccess ? 0
                 : msv_cuda_fail(err, errlen, "gemm_fixed_forward",
                                 __FILE__, __LINE__, e);
        } else {
            rc = linear_forward(cublas, NULL, w, act, fmt, n, out, 0, NULL,
                                stream, err, errlen);
        }
        if (rc != 0) {
            return -1;
        }
        MSV_CUDA_TRY(cudaEventRecord(ev[1], stream), err, errlen);
        MSV_CUDA_TRY(cudaEventSynchronize(ev[1]), err, errlen);
        MSV_CUDA_TRY(cudaEventElapsedTime(&t, ev[0], ev[1]), err, errlen);
        if (i > 0) {
            sum += t;
        }
    }
    *ms = sum / MSV_INV_REPS;
    return 0;
}


/* The number of 32-bit words where a and b differ, n of them. */
static int
msv_inv_differ(const float *a, const float *b, size_t n, unsigned int *dcount,
    unsigned int *count, cudaStream_t stream, char *err, size_t errlen)
{
    MSV_CUDA_TRY(cudaMemsetAsync(dcount, 0, sizeof(*dcount), stream),
                 err, errlen);
    inv_differ_kernel<<<256, 256, 0, stream>>>((const uint32_t *) a,
                                               (const uint32_t *) b, n,
                                               dcount);
    MSV_CUDA_TRY(cudaGetLastError(), err, errlen);
    MSV_CUDA_TRY(cudaMemcpyAsync(count, dcount, sizeof(*count),
                                 cudaMemcpyDeviceToHost, stream),
                 err, errlen);
    MSV_CUDA_TRY(cudaStreamSynchronize(stream), err, errlen);
    return 0;
}


/* Scratch of one gemm_inv_pin. */
struct msv_inv_scratch {
    void          *act;                  /* [256][cols] */
    float         *out[MSV_INV_TN];      /* [msv_inv_time_n[k]][rows] */
    float         *fix;                  /* [MSV_GEMV_FIXED_MAX][rows] */
    float         *cmp;                  /* [256][rows]: comparisons */
    uint4         *flush;                /* twice the L2 cache */
    size_t         flush_words;
    unsigned int  *dcount;
    cudaEvent_t    ev[2];
};


static void
msv_inv_scratch_free(struct msv_inv_scratch *s)
{
    int  k;

    cudaFree(s->act);
    for (k = 0; k < MSV_INV_TN; k++) {
        cudaFree(s->out[k]);
    }
    cudaFree(s->fix);
    cudaFree(s->flush);
    cudaFree(s->cmp);
    cudaFree(s->dcount);
    for (k = 0; k < 2; k++) {
        if (s->ev[k] != NULL) {
            cudaEventDestroy(s->ev[k]);
        }
    }
    memset(s, 0, sizeof(*s));
}


static int
msv_inv_scratch_new(struct msv_inv_scratch *s, const struct msv_dmat *w,
    cudaStream_t stream, char *err, size_t errlen)
{
    size_t  n_act, esz;
    int     k, dev, l2;

    memset(s, 0, sizeof(*s));
    MSV_CUDA_TRY(cudaGetDevice(&dev), err, errlen);
    MSV_CUDA_TRY(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev),
                 err, errlen);
    s->flush_words = 2 * (size_t) (l2 > 0 ? l2 : 64 << 20) / sizeof(uint4);
    MSV_CUDA_TRY(cudaMalloc((void **) &s->flush,
                            s->flush_words * sizeof(uint4)), err, errlen);
    MSV_CUDA_TRY(cudaMemsetAsync(s->flush, 0, s->flush_words * sizeof(uint4),
                                 stream), err, errlen);
    esz = w->dtype == MSV_F32 ? 4 : 2;
    n_act = (size_t) msv_inv_time_n[MSV_INV_TN - 1] * w->cols;
    MSV_CUDA_TRY(cudaMalloc(&s->act, n_act * esz), err, errlen);
    for (k = 0; k < MSV_INV_TN; k++) {
        MSV_CUDA_TRY(cudaMalloc((void **) &s->out[k],
                                (size_t) msv_inv_time_n[k] * w->rows
                                * sizeof(float)), err, errlen);
    }
    MSV_CUDA_TRY(cudaMalloc((void **) &s->fix, (size_t) MSV_GEMV_FIXED_MAX
                                                * w->rows * sizeof(float)),
                 err, errlen);
    MSV_CUDA_TRY(cudaMalloc((void **) &s->cmp,
                            (size_t) msv_inv_time_n[MSV_INV_TN - 1] * w->rows
                            * sizeof(float)), err, errlen);
    MSV_CUDA_TRY(cudaMalloc((void **) &s->dcount, sizeof(*s->dcount)),
                 err, errlen);
    for (k = 0; k < 2; k++) {
        MSV_CUDA_TRY(cudaEventCreate(&s->ev[k]), err, errlen);
    }
    inv_fill_kernel<<<1024, 256, 0, stream>>>(s->act, w->dtype == MSV_F32,
                                              n_act);
    MSV_CUDA_TRY(cudaGetLastError(), err, errlen);
    return 0;
}


int
gemm_inv_init(struct msv_gemm_inv *inv, void *ws, size_t ws_bytes,
    char *err, size_t errlen)
{
    cublasLtHandle_t  lt;

    memset(inv, 0, sizeof(*inv));
    MSV_CUBLAS_TRY(cublasLtCreate(&lt), err, errlen);
    inv->lt = lt;
    inv->ws = ws;
    inv->ws_bytes = ws_bytes;
    return 0;
}


void
gemm_inv_free(struct msv_gemm_inv *inv)
{
    if (inv->lt != NULL) {
        cublasLtDestroy(inv->lt);
    }
    memset(inv, 0, sizeof(*inv));
}


/* Time candidate c at every batch size into t[], and count in *differ the
 * words of the leading rows where its outputs at the sizes disagree.
 * 1: it ran; 0: cuBLASLt refused it (err set); -1: a CUDA error. */
static int
msv_inv_try(struct msv_gemm_inv *inv, const cublasLtMatmulAlgo_t *algo,
    const struct msv_dmat *w, struct msv_inv_scratch *s, cudaStream_t stream,
    float *t, unsigned int *differ, char *err, size_t errlen)
{
    unsigned int  d;
    cudaError_t   e;
    int           k;

    for (k = 0; k < MSV_INV_TN; k++) {
        if (msv_inv_time(inv, NULL, algo, 0, w, s->act, msv_inv_time_n[k],
                         s->out[k], s->flush, s->flush_words, s->dcount,
                         stream, s->ev, &t[k], err, errlen) != 0)
        {
            e = cudaStreamSynchronize(stream);
            if (e != cudaSuccess) {
                return msv_cuda_fail(err, errlen, "cudaStreamSynchronize",
                                     __FILE__, __LINE__, e);
            }
            return 0;
        }
    }
    *differ = 0;
    for (k = 0; k < MSV_INV_TN - 1; k++) {
        if (msv_inv_differ(s->out[k], s->out[MSV_INV_TN - 1],
                           (size_t) msv_inv_time_n[k] * w->rows, s->dcount,
                           &d, stream, err, errlen) != 0)
        {
            return -1;
        }
        *differ += d;
    }
    return 1;
}


int
gemm_inv_pin(struct msv_gemm_inv *inv, cublasHandle_t cublas,
    const struct msv_dmat *w, cudaStream_t stream, char *line,
    size_t linelen, char *err, size_t errlen)
{
    cublasLtMatmulAlgo_t     cand[MSV_INV_MAXC];
    float                    t[MSV_INV_MAXC][MSV_INV_TN], ref[MSV_INV_TN];
    float                    t_fix, t_fixm;
    double                   score, best_score;
    unsigned int             differ;
    int                      n_cand, n_other, n_refused, n_fix;
    int                      ok[MSV_INV_MAXC], same_fix[MSV_INV_MAXC];
    int                      c, k, pick, mid, big, rc, fixed, pass;
    struct msv_inv_scratch   s;
    struct msv_inv_cfg       cfg, cfg_mid, cfg_big;
    struct msv_inv_plan     *p;
    cudaError_t              e;
    char                     why[256], fix_note[160], gemm_note[96];

    line[0] = '\0';
    if (msv_inv_find(inv, w) != NULL) {
        return 0;
    }
    if (inv->n_plans == MSV_INV_SHAPES) {
        snprintf(err, errlen, "cublasLt: batch invariant: more than %d "
                 "weight shapes", MSV_INV_SHAPES);
        return -1;
    }

    if (msv_inv_candidates(inv, w, cand, &n_cand, err, errlen) != 0) {
        return -1;
    }
    if (n_cand == 0) {
        snprintf(err, errlen, "cublasLt: batch invariant: no algorithm "
                 "without split-K for %u x %u %s", w->rows, w->cols,
                 msv_inv_dtype(w));
        return -1;
    }

    rc = -1;
    if (msv_inv_scratch_new(&s, w, stream, err, errlen) != 0) {
        goto done;
    }

    /* the default path: the yardstick of the choice, and the log */
    for (k = 0; k < MSV_INV_TN; k++) {
        if (msv_inv_time(inv, cublas, NULL, MSV_INV_DEFAULT, w, s.act,
                         msv_inv_time_n[k], s.out[k], s.flush, s.flush_words,
                         s.dcount, stream, s.ev, &ref[k], err, errlen) != 0)
        {
            goto done;
        }
    }

    /* the fixed-order GEMV: its time at n = 1, then its bits at n =
     * MSV_GEMV_FIXED_MAX (the leading rows of the scratch activations)
     * for the candidates to match */
    fixed = gemv_fixed_usable(w, MSV_ACT_BF16, MSV_GEMV_FIXED_MAX);
    t_fix = 0.0f;
    t_fixm = 0.0f;
    if (fixed
        && (msv_inv_time(inv, NULL, NULL, MSV_INV_FIXED, w, s.act, 1, s.fix,
                         s.flush, s.flush_words, s.dcount, stream, s.ev,
                         &t_fix, err, errlen) != 0
            || msv_inv_time(inv, NULL, NULL, MSV_INV_FIXED, w, s.act,
                            MSV_GEMV_FIXED_MAX, s.fix, s.flush,
                            s.flush_words, s.dcount, stream, s.ev, &t_fixm,
                            err, errlen) != 0))
    {
        goto done;
    }

    n_other = 0;
    n_refused = 0;
    n_fix = 0;
    why[0] = '\0';
    for (c = 0; c < n_cand; c++) {
        differ = 0;
        same_fix[c] = 0;
        ok[c] = msv_inv_try(inv, &cand[c], w, &s, stream, t[c], &differ,
                            err, errlen);
        if (ok[c] < 0) {
            goto done;
        }
        if (ok[c] == 0) {
            n_refused++;
            snprintf(why, sizeof(why), "%s", err);
        } else if (differ != 0) {
            ok[c] = 0;
            n_other++;
        } else if (fixed) {
            if (msv_inv_differ(s.fix, s.out[MSV_INV_TN - 1],
                               (size_t) MSV_GEMV_FIXED_MAX * w->rows,
                               s.dcount, &differ, stream, err, errlen) != 0)
            {
                goto done;
            }
            same_fix[c] = differ == 0;
            n_fix += same_fix[c];
        }
    }

    /* the candidate whose worst ratio to the default path over the
     * timed sizes is smallest: the mode's cost at any batch is bounded by
     * that ratio (measured at 1, 64, 256 with the earlier rule, the sum
     * of the times relative to the fastest candidate, the pick cost
     * +18% to +20% a decode step at batch 256: bench/results/engine.md).
     * First among the candidates with the fixed-order GEMV's bits, which
     * runs n = 1 for them; if there are none, among all. */
    pick = -1;
    best_score = 0.0;
    for (pass = n_fix > 0 ? 0 : 1; pass < 2 && pick < 0; pass++) {
        for (c = 0; c < n_cand; c++) {
            if (!ok[c] || (pass == 0 && !same_fix[c])) {
                continue;
            }
            score = 0.0;
            for (k = pass == 0 ? 1 : 0; k < MSV_INV_TN; k++) {
                if (ref[k] > 0.0f && t[c][k] / ref[k] > score) {
                    score = t[c][k] / ref[k];
                }
            }
            if (pick < 0 || score < best_score) {
                pick = c;
                best_score = score;
            }
        }
    }
    /* among the candidates with the fixed-order GEMV's bits (they sum in
     * its order, so their bits are the pick's: checked on a whole product
     * of each size) the fastest at n = 64 for 9 to MSV_INV_MID_MAX rows
     * and the fastest at n = 256 past that: one algorithm for both sizes
     * is a compromise (the gate/up shape: tile 208 0.051 ms at 64, 0.096
     * at 256; tile 21 0.068 and 0.086, bench/results/engine.md) */
    mid = pick;
    big = pick;
    for (c = 0; pick >= 0 && same_fix[pick] && c < n_cand; c++) {
        if (ok[c] && same_fix[c] && t[c][1] < t[mid][1]) {
            mid = c;
        }
        if (ok[c] && same_fix[c] && t[c][2] < t[big][2]) {
            big = c;
        }
    }
    for (k = 1; k < MSV_INV_TN; k++) {
        int  *alt = k == 1 ? &mid : &big;

        if (*alt == pick) {
            continue;
        }
        if (msv_inv_run(inv, &cand[pick], w, s.act, msv_inv_time_n[k],
                        s.out[k], 0, stream, err, errlen) != 0
            || msv_inv_run(inv, &cand[*alt], w, s.act, msv_inv_time_n[k],
                           s.cmp, 0, stream, err, errlen) != 0
            || msv_inv_differ(s.out[k], s.cmp,
                              (size_t) msv_inv_time_n[k] * w->rows,
                              s.dcount, &differ, stream, err, errlen) != 0)
        {
            goto done;
        }
        if (differ != 0) {
            *alt = pick;              /* not the same bits: the pick */
        }
    }

    if (pick < 0) {
        snprintf(err, errlen, "cublasLt: batch invariant: %u x %u %s: none "
                 "of %d algorithms without split-K is usable (%d give other "
                 "bits at n = 1, 64, 256; %d refused%s%s)", w->rows, w->cols,
                 msv_inv_dtype(w), n_cand, n_other, n_refused,
                 why[0] ? ": " : "", why);
        goto done;
    }

    if (msv_inv_cfg_get(&cand[pick], &cfg, err, errlen) != 0) {
        goto done;
    }
    p = &inv->plan[inv->n_plans++];
    p->dtype = w->dtype;
    p->rows = w->rows;
    p->cols = w->cols;
    p->fixed = same_fix[pick];
    p->algo = cand[big];
    p->algo_mid = cand[mid];
    if (msv_inv_cfg_get(&cand[mid], &cfg_mid, err, errlen) != 0
        || msv_inv_cfg_get(&cand[big], &cfg_big, err, errlen) != 0)
    {
        goto done;
    }

    /* the fixed-order GEMM against algo_mid at MSV_GEMM_FIXED_MAX rows:
     * its bits on a whole product, then both timed; it takes 9 to
     * MSV_GEMM_FIXED_MAX rows where it has the bits and is faster.  Its
     * first launch, which sets its shared memory limit, comes before any
     * capture. */
    p->gemm = 0;
    gemm_note[0] = '\0';
    if (p->fixed && gemm_fixed_usable(w, MSV_ACT_BF16, MSV_GEMM_FIXED_MAX)) {
        float  t_g, t_m;

        if (msv_inv_run(inv, &cand[mid], w, s.act, MSV_GEMM_FIXED_MAX,
                        s.out[MSV_INV_TN - 1], 0, stream, err, errlen) != 0)
        {
            goto done;
        }
        e = gemm_fixed_forward(w, s.act, MSV_GEMM_FIXED_MAX, s.cmp, 0,
                               stream);
        if (e != cudaSuccess) {
            msv_cuda_fail(err, errlen, "gemm_fixed_forward", __FILE__,
                          __LINE__, e);
            goto done;
        }
        if (msv_inv_differ(s.out[MSV_INV_TN - 1], s.cmp,
                           (size_t) MSV_GEMM_FIXED_MAX * w->rows, s.dcount,
                           &differ, stream, err, errlen) != 0
            || msv_inv_time(inv, cublas, &cand[mid], 0, w, s.act,
                            MSV_GEMM_FIXED_MAX, s.out[MSV_INV_TN - 1],
                            s.flush, s.flush_words, s.dcount, stream, s.ev,
                            &t_m, err, errlen) != 0
            || msv_inv_time(inv, NULL, NULL, MSV_INV_GEMM, w, s.act,
                            MSV_GEMM_FIXED_MAX, s.cmp, s.flush,
                            s.flush_words, s.dcount, stream, s.ev, &t_g,
                            err, errlen) != 0)
        {
            goto done;
        }
        p->gemm = differ == 0 && t_g < t_m;
        snprintf(gemm_note, sizeof(gemm_note), "; fixed-order GEMM at n = "
                 "%d: %.4f ms against %.4f%s", MSV_GEMM_FIXED_MAX, t_g, t_m,
                 differ != 0 ? " (other bits)" : p->gemm ? " (taken for "
                 "9 to 16 rows)" : "");
    }

    if (!fixed) {
        snprintf(fix_note, sizeof(fix_note), "fixed-order GEMV: not this "
                 "shape");
    } else if (p->fixed) {
        snprintf(fix_note, sizeof(fix_note), "fixed-order GEMV at n <= %d "
                 "(%d of the candidates its bits): %.4f ms at n = 1, %.4f "
                 "at %d", MSV_GEMV_FIXED_MAX, n_fix, t_fix, t_fixm,
                 MSV_GEMV_FIXED_MAX);
    } else {
        snprintf(fix_note, sizeof(fix_note), "fixed-order GEMV: no "
                 "candidate has its bits, not used (%.4f ms at n = 1, %.4f "
                 "at %d)", t_fix, t_fixm, MSV_GEMV_FIXED_MAX);
    }
    snprintf(line, linelen, "batch invariant: %u x %u %s: cuBLASLt algo %d "
             "tile %u stages %u swizzle %u custom %u inner %u cluster %u "
             "(minimax of %d, %d with other bits, %d refused); ms at n = 1, "
             "64, 256: %.4f %.4f %.4f, default path %.4f %.4f %.4f (worst "
             "ratio %.2f); at n = %d to %d algo %d tile %u stages %u "
             "cluster %u, %.4f ms at 64%s; past %d algo %d tile %u stages "
             "%u cluster %u, %.4f ms at 256%s; %s%s",
             w->rows, w->cols, msv_inv_dtype(w), cfg.id, cfg.tile,
             cfg.stages, cfg.swizzle, cfg.custom, cfg.inner, cfg.cluster,
             n_cand, n_other, n_refused, t[pick][0], t[pick][1], t[pick][2],
             ref[0], ref[1], ref[2], best_score,
             p->fixed ? MSV_GEMV_FIXED_MAX + 1 : 1, MSV_INV_MID_MAX,
             cfg_mid.id, cfg_mid.tile, cfg_mid.stages, cfg_mid.cluster,
             t[mid][1], mid == pick ? " (the pick)" : "", MSV_INV_MID_MAX,
             cfg_big.id, cfg_big.tile, cfg_big.stages, cfg_big.cluster,
             t[big][2], big == pick ? " (the pick)" : "", fix_note,
             gemm_note);
    rc = 0;

done:
    if (cudaStreamSynchronize(stream) != cudaSuccess && rc == 0) {
        snprintf(err, errlen, "cuda: batch invariant: the timing runs "
                 "failed");
        rc = -1;
    }
    msv_inv_scratch_free(&s);
    return rc;
}


int
msv_act_fmt_for(const struct msv_dmat *w, int split)
{
    if (w->dtype == MSV_F32) {
        return MSV_ACT_F32;
    }
    return split ? MSV_ACT_BF16X2 : MSV_ACT_BF16;
}

int
linear_forward(cublasHandle_t cublas, const struct msv_gemm_inv *inv,
    const struct msv_dmat *w, const void *act, int fmt, uint32_t n,
    float *out, int accumulate, float *tmp, cudaStream_t stream, char *err,
    size_t errlen)
{
    const float                 one = 1.0f, zero = 0.0f;
    const struct msv_inv_plan  *p;
    cudaDataType                ab;
    float                      *c;
    uint32_t                    cols_n;

    if (n == 0) {
        return 0;
    }

    if (inv != NULL && fmt != MSV_ACT_BF16X2) {
        p = msv_inv_find(inv, w);
        if (p == NULL) {
            snprintf(err, errlen, "cublasLt: batch invariant: no algorithm "
                     "pinned for %u x %u %s", w->rows, w->cols,
                     msv_inv_dtype(w));
            return -1;
        }
        if (p->fixed && gemv_fixed_usable(w, fmt, n)) {
            MSV_CUDA_TRY(gemv_fixed_forward(w, act, n, out, accumulate,
                                            stream), err, errlen);
            return 0;
        }
        if (p->gemm && gemm_fixed_usable(w, fmt, n)) {
            MSV_CUDA_TRY(gemm_fixed_forward(w, act, n, out, accumulate,
                                            stream), err, errlen);
            return 0;
        }
        return msv_inv_run(inv, n <= MSV_INV_MID_MAX ? &p->algo_mid
                                                     : &p->algo,
                           w, act, n, out, accumulate, stream, err, errlen);
    }

    if (gemv_usable(w, fmt, n, inv != NULL)) {
        MSV_CUDA_TRY(gemv_forward(w, act, n, out, accumulate, stream),
                     err, errlen);
        return 0;
    }

    ab = w->dtype == MSV_F32 ? CUDA_R_32F : CUDA_R_16BF;
    c = out;
    cols_n = n;

    if (fmt == MSV_ACT_BF16X2) {
        c = tmp;
        cols_n = 2 * n;
    }

    MSV_CUBLAS_TRY(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N,
                                (int) w->rows, (int) cols_n, (int) w->cols,
                                &one, w->p, ab, (int) w->cols,
                                act, ab, (int) w->cols,
                                (accumulate && c == out) ? &one : &zero,
                                c, CUDA_R_32F, (int) w->rows,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   err, errlen);

    if (fmt == MSV_ACT_BF16X2) {
        MSV_CUDA_TRY(split_sum_forward(out, tmp, n, w->rows, accumulate,
                                       stream), err, errlen);
    }
    return 0;
}


int
linear_forward_bf16(cublasHandle_t cublas, const struct msv_dmat *w,
    const void *act, uint32_t n, void *out, char *err, size_t errlen)
{
    const float  one = 1.0f, zero = 0.0f;

    if (n == 0) {
        return 0;
    }
    if (w->dtype != MSV_BF16) {
        snprintf(err, errlen, "cublas: a bf16 product of %u x %u fp32 "
                 "weights", w->rows, w->cols);
        return -1;
    }
    MSV_CUBLAS_TRY(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N,
                                (int) w->rows, (int) n, (int) w->cols,
                                &one, w->p, CUDA_R_16BF, (int) w->cols,
                                act, CUDA_R_16BF, (int) w->cols,
                                &zero, out, CUDA_R_16BF, (int) w->rows,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   err, errlen);
    return 0;
}
