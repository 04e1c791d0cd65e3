/*
 * kernel_check.cu: host-array wrappers around single kernels, for the
 * per-kernel comparisons of the backend suite (t/c/kernel_twins.h).
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "kernel_check.h"
#include "cuda_common.cuh"
#include "norm.cuh"
#include "rope.cuh"
#include "attention.cuh"
#include "gemm.cuh"
#include "elementwise.cuh"
#include "model.h"

static_assert(MSV_CHECK_F32 == MSV_ACT_F32
              && MSV_CHECK_BF16 == MSV_ACT_BF16
              && MSV_CHECK_BF16X2 == MSV_ACT_BF16X2,
              "kernel_check.h formats match enum msv_act_fmt");
static_assert(MSV_CHECK_ATTN_AUTO == MSV_ATTN_AUTO
              && MSV_CHECK_ATTN_FOLD == MSV_ATTN_FOLD
              && MSV_CHECK_ATTN_PARALLEL == MSV_ATTN_PARALLEL,
              "kernel_check.h attention modes match attention.cuh");
static_assert(MSV_CHECK_TILED_AUTO == MSV_ATTN_TILED_AUTO
              && MSV_CHECK_TILED_OFF == MSV_ATTN_TILED_OFF
              && MSV_CHECK_TILED_ON == MSV_ATTN_TILED_ON,
              "kernel_check.h tiled values match attention.cuh");

#define MSV_CHECK_MAX_BUFS  16

/* Device buffers of one call, freed together. */
struct msv_check_bufs {
    void  *p[MSV_CHECK_MAX_BUFS];
    int    n;
};


static void
msv_check_free(struct msv_check_bufs *bufs)
{
    int  i;

    for (i = 0; i < bufs->n; i++) {
        cudaFree(bufs->p[i]);
    }
    bufs->n = 0;
}


/* A device copy of host (bytes; host NULL: uninitialised). */
static int
msv_check_put(struct msv_check_bufs *bufs, void **dev, const void *host,
    size_t bytes, char *err, size_t errlen)
{
    *dev = NULL;
    if (bufs->n == MSV_CHECK_MAX_BUFS) {
        snprintf(err, errlen, "kernel check: too many buffers");
        return -1;
    }
    MSV_CUDA_TRY(cudaMalloc(dev, bytes > 0 ? bytes : 1), err, errlen);
    bufs->p[bufs->n++] = *dev;
    if (host != NULL && bytes > 0) {
        MSV_CUDA_TRY(cudaMemcpy(*dev, host, bytes, cudaMemcpyHostToDevice),
                     err, errlen);
    }
    return 0;
}


static float
msv_check_bf16(uint16_t h)
{
    uint32_t  u;
    float     f;

    u = (uint32_t) h << 16;
    memcpy(&f, &u, sizeof(f));
    return f;
}


static uint16_t
msv_check_to_bf16(float f)
{
    uint32_t  u;

    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t) ((u >> 16) | 0x40);
    }
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t) (u >> 16);
}


/* A device cache from host floats, bf16 or fp32. */
static int
msv_check_cache_put(struct msv_check_bufs *bufs, void **dev, const float *host,
    size_t n, int bf16, char *err, size_t errlen)
{
    uint16_t  *h;
    size_t     i;
    int        rc;

    if (!bf16) {
        return msv_check_put(bufs, dev, host, n * sizeof(float), err, errlen);
    }
    h = (uint16_t *) malloc(n * sizeof(uint16_t) + 1);
    if (h == NULL) {
        snprintf(err, errlen, "kernel check: out of host memory");
        return -1;
    }
    for (i = 0; i < n; i++) {
        h[i] = msv_check_to_bf16(host[i]);
    }
    rc = msv_check_put(bufs, dev, h, n * sizeof(uint16_t), err, errlen);
    free(h);
    return rc;
}


static int
msv_check_cache_get(float *host, const void *dev, size_t n, int bf16,
    char *err, size_t errlen)
{
    uint16_t  *h;
    size_t     i;

    if (!bf16) {
        MSV_CUDA_TRY(cudaMemcpy(host, dev, n * sizeof(float),
                                cudaMemcpyDeviceToHost), err, errlen);
        return 0;
    }
    h = (uint16_t *) malloc(n * sizeof(uint16_t) + 1);
    if (h == NULL) {
        snprintf(err, errlen, "kernel check: out of host memory");
        return -1;
    }
    if (cudaMemcpy(h, dev, n * sizeof(uint16_t), cudaMemcpyDeviceToHost)
        != cudaSuccess)
    {
        free(h);
        return msv_cuda_fail(err, errlen, "cudaMemcpy", __FILE__, __LINE__,
                             cudaGetLastError());
    }
    for (i = 0; i < n; i++) {
        host[i] = msv_check_bf16(h[i]);
    }
    free(h);
    return 0;
}


/* The [total] activation matrix at dev (format fmt) as fp32: BF16
 * widened, BF16X2 as hi + lo. */
static int
msv_check_act_get(float *out, const void *dev, int fmt, size_t total,
    char *err, size_t errlen)
{
    uint16_t  *h;
    size_t     i;

    if (fmt == MSV_ACT_F32) {
        MSV_CUDA_TRY(cudaMemcpy(out, dev, total * sizeof(float),
                                cudaMemcpyDeviceToHost), err, errlen);
        return 0;
    }
    h = (uint16_t *) malloc((total > 0 ? total : 1) * 2 * sizeof(uint16_t));
    if (h == NULL) {
        snprintf(err, errlen, "kernel check: out of host memory");
        return -1;
    }
    if (cudaMemcpy(h, dev, total * (fmt == MSV_ACT_BF16X2 ? 4 : 2),
                   cudaMemcpyDeviceToHost) != cudaSuccess)
    {
        free(h);
        return msv_cuda_fail(err, errlen, "cudaMemcpy", __FILE__, __LINE__,
                             cudaGetLastError());
    }
    for (i = 0; i < total; i++) {
        out[i] = msv_check_bf16(h[i]);
        if (fmt == MSV_ACT_BF16X2) {
            out[i] += msv_check_bf16(h[total + i]);
        }
    }
    free(h);
    return 0;
}


static int
msv_check_rmsnorm(struct msv_check_bufs *bufs, float *out, int fmt,
    const float *x, uint32_t n_in_rows, const int32_t *rows, const float *w,
    uint32_t n_rows, uint32_t n, float eps, char *err, size_t errlen)
{
    void            *dx, *drows, *dw, *dout;
    size_t           total;
    struct msv_l2pf  pf;

    total = (size_t) n_rows * n;
    drows = NULL;
    if (msv_check_put(bufs, &dx, x, (size_t) n_in_rows * n * sizeof(float),
                      err, errlen) != 0
        || msv_check_put(bufs, &dw, w, n * sizeof(float), err, errlen) != 0
        || msv_check_put(bufs, &dout, NULL, total * 4, err, errlen) != 0
        || (rows != NULL
            && msv_check_put(bufs, &drows, rows, n_rows * sizeof(int32_t),
                             err, errlen) != 0))
    {
        return -1;
    }

    /* the input asked into L2 as well: the prefetch runs under the
     * checks (and the sanitizer), and must not change the output */
    pf.p = (const char *) dx;
    pf.bytes = (size_t) n_in_rows * n * sizeof(float) / 16 * 16;
    MSV_CUDA_TRY(rmsnorm_forward(dout, fmt, (const float *) dx,
                                 (const int32_t *) drows,
                                 (const float *) dw, n_rows, n, eps, pf, 0),
                 err, errlen);
    MSV_CUDA_TRY(cudaDeviceSynchronize(), err, errlen);
    return msv_check_act_get(out, dout, fmt, total, err, errlen);
}


extern "C" int
msv_cuda_run_rmsnorm(float *out, int fmt, const float *x, uint32_t n_in_rows,
    const int32_t *rows, const float *w, uint32_t n_rows, uint32_t n,
    float eps, char *err, size_t errlen)
{
    struct msv_check_bufs  bufs;
    int                    rc;

    bufs.n = 0;
    rc = msv_check_rmsnorm(&bufs, out, fmt, x, n_in_rows, rows, w, n_rows, n,
                           eps, err, errlen);
    msv_check_free(&bufs);
    return rc;
}


/* Device copies of the batch's KV map and caches. */
static int
msv_check_kv_put(struct msv_check_bufs *bufs, const struct msv_check_kv *kv,
    size_t cache_floats, struct msv_kv_map *map, char *err, size_t errlen)
{
    void  *p[6];

    if (msv_check_put(bufs, &p[0], kv->pos, kv->n_tokens * sizeof(int32_t),
                      err, errlen) != 0
        || msv_check_put(bufs, &p[1], kv->tok_seq,
                         kv->n_tokens * sizeof(int32_t), err, errlen) != 0
        || msv_check_put(bufs, &p[2], kv->page_off,
                         kv->n_seqs * sizeof(int32_t), err, errlen) != 0
        || msv_check_put(bufs, &p[3], kv->pages,
                         kv->n_entries * sizeof(int32_t), err, errlen) != 0)
    {
        return -1;
    }

    p[4] = NULL;
    p[5] = NULL;
    if (kv->k_cache != NULL
        && (msv_check_cache_put(bufs, &p[4], kv->k_cache, cache_floats,
                                kv->kv_bf16, err, errlen) != 0
            || msv_check_cache_put(bufs, &p[5], kv->v_cache, cache_floats,
                                   kv->kv_bf16, err, errlen) != 0))
    {
        return -1;
    }

    map->pos = (const int32_t *) p[0];
    map->tok_seq = (const int32_t *) p[1];
    map->page_off = (const int32_t *) p[2];
    map->pages = (const int32_t *) p[3];
    map->k_cache = p[4];
    map->v_cache = p[5];
    map->kv_bf16 = kv->kv_bf16;
    return 0;
}


static int
msv_check_qkv_rope(struct msv_check_bufs *bufs, float *qkv, uint32_t n_heads,
    uint32_t n_kv_heads, uint32_t head_dim, const float *bias,
    const float *q_norm, const float *k_norm, float eps,
    const float *inv_freq, const struct msv_check_kv *kv, char *err,
    size_t errlen)
{
    struct msv_qkv_args  a;
    size_t               width, cache;
    void                *p[5];

    width = (size_t) (n_heads + 2 * n_kv_heads) * head_dim;
    cache = (size_t) kv->n_pages * n_kv_heads * MSV_KV_BLOCK * head_dim;

    memset(&a, 0, sizeof(a));
    p[1] = p[2] = p[3] = NULL;
    if (msv_check_put(bufs, &p[0], qkv, kv->n_tokens * width * sizeof(float),
                      err, errlen) != 0
        || (bias != NULL
            && msv_check_put(bufs, &p[1], bias, width * sizeof(float), err,
                             errlen) != 0)
        || (q_norm != NULL
            && msv_check_put(bufs, &p[2], q_norm, head_dim * sizeof(float),
                             err, errlen) != 0)
        || (k_norm != NULL
            && msv_check_put(bufs, &p[3], k_norm, head_dim * sizeof(float),
                             err, errlen) != 0)
        || msv_check_put(bufs, &p[4], inv_freq,
                         head_dim / 2 * sizeof(float), err, errlen) != 0
        || msv_check_kv_put(bufs, kv, cache, &a.kv, err, errlen) != 0)
    {
        return -1;
    }

    a.qkv = (float *) p[0];
    a.n_tokens = kv->n_tokens;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv_heads;
    a.head_dim = head_dim;
    a.bias = (const float *) p[1];
    a.q_norm = (const float *) p[2];
    a.k_norm = (const float *) p[3];
    a.eps = eps;
    a.inv_freq = (const float *) p[4];
    a.pf.p = (const char *) p[0];       /* asked into L2: no effect */
    a.pf.bytes = kv->n_tokens * width * sizeof(float) / 16 * 16;

    MSV_CUDA_TRY(qkv_rope_forward(&a, 0), err, errlen);
    MSV_CUDA_TRY(cudaDeviceSynchronize(), err, errlen);

    MSV_CUDA_TRY(cudaMemcpy(qkv, a.qkv, kv->n_tokens * width * sizeof(float),
                            cudaMemcpyDeviceToHost), err, errlen);
    if (kv->k_cache != NULL
        && (msv_check_cache_get(kv->k_cache, a.kv.k_cache, cache,
                                kv->kv_bf16, err, errlen) != 0
            || msv_check_cache_get(kv->v_cache, a.kv.v_cache, cache,
                                   kv->kv_bf16, err, errlen) != 0))
    {
        return -1;
    }
    return 0;
}


extern "C" int
msv_cuda_run_qkv_rope(float *qkv, uint32_t n_heads, uint32_t n_kv_heads,
    uint32_t head_dim, const float *bias, const float *q_norm,
    const float *k_norm, float eps, const float *inv_freq,
    const struct msv_check_kv *kv, char *err, size_t errlen)
{
    struct msv_check_bufs  bufs;
    int                    rc;

    bufs.n = 0;
    rc = msv_check_qkv_rope(&bufs, qkv, n_heads, n_kv_heads, head_dim, bias,
                            q_norm, k_norm, eps, inv_freq, kv, err, errlen);
    msv_check_free(&bufs);
    return rc;
}


static int
msv_check_attention(struct msv_check_bufs *bufs, float *out, const float *q,
    uint32_t q_stride, uint32_t n_heads, uint32_t n_kv_heads,
    uint32_t head_dim, float scale, const struct msv_check_kv *kv, int mode,
    int stages, uint32_t walk_cols, int tiled, uint32_t min_run,
    uint32_t *n_tiles, char *err, size_t errlen)
{
    struct msv_attn_args  a;
    size_t                cache, out_n, part;
    uint32_t              t, max_ctx, nt, nr;
    void                 *dq, *dout, *dpart, *dplan;
    int32_t              *plan;
    int                   rc;

    cache = (size_t) kv->n_pages * n_kv_heads * MSV_KV_BLOCK * head_dim;
    out_n = (size_t) kv->n_tokens * n_heads * head_dim;

    max_ctx = 1;
    for (t = 0; t < kv->n_tokens; t++) {
        max_ctx = (uint32_t) kv->pos[t] + 1 > max_ctx
                  ? (uint32_t) kv->pos[t] + 1 : max_ctx;
    }
    part = attention_part_floats(kv->n_tokens, n_heads, head_dim, max_ctx);

    memset(&a, 0, sizeof(a));
    if (msv_check_put(bufs, &dq, q, (size_t) kv->n_tokens * q_stride
                                    * sizeof(float), err, errlen) != 0
        || msv_check_put(bufs, &dout, NULL, out_n * sizeof(float), err,
                         errlen) != 0
        || msv_check_put(bufs, &dpart, NULL, part * sizeof(float), err,
                         errlen) != 0
        || msv_check_kv_put(bufs, kv, cache, &a.kv, err, errlen) != 0)
    {
        return -1;
    }

    a.out = dout;
    a.out_fmt = MSV_ACT_F32;
    a.max_ctx = max_ctx;
    a.part = (float *) dpart;
    a.part_floats = part;
    a.mode = mode;
    a.stages = stages;
    a.walk_cols = walk_cols;
    a.q = (const float *) dq;
    a.q_stride = q_stride;
    a.n_tokens = kv->n_tokens;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv_heads;
    a.head_dim = head_dim;
    a.scale = scale;

    /* the plan: tiles[2 n_tokens] then rest[n_tokens], as attention_plan
     * writes them */
    a.tiled = tiled;
    nt = 0;
    if (tiled != MSV_ATTN_TILED_OFF) {
        plan = (int32_t *) malloc((size_t) 3 * kv->n_tokens
                                  * sizeof(int32_t));
        if (plan == NULL) {
            snprintf(err, errlen, "kernel check: out of memory");
            return -1;
        }
        nt = attention_plan(kv->pos, kv->tok_seq, kv->n_tokens,
                            n_heads / n_kv_heads, min_run, plan,
                            plan + 2 * (size_t) kv->n_tokens, &nr);
        rc = msv_check_put(bufs, &dplan, plan, (size_t) 3 * kv->n_tokens
                                               * sizeof(int32_t),
                           err, errlen);
        free(plan);
        if (rc != 0) {
            return -1;
        }
        a.tiles = (const int32_t *) dplan;
        a.n_tiles = nt;
        a.rest = (const int32_t *) dplan + 2 * (size_t) kv->n_tokens;
        a.n_rest = nr;
    }
    if (n_tiles != NULL) {
        *n_tiles = nt;
    }

    MSV_CUDA_TRY(attention_forward(&a, 0), err, errlen);
    MSV_CUDA_TRY(cudaDeviceSynchronize(), err, errlen);
    MSV_CUDA_TRY(cudaMemcpy(out, dout, out_n * sizeof(float),
                            cudaMemcpyDeviceToHost), err, errlen);
    return 0;
}


extern "C" int
msv_cuda_run_attention(float *out, const float *q, uint32_t q_stride,
    uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, float scale,
    const struct msv_check_kv *kv, int mode, int stages, uint32_t walk_cols,
    int tiled, uint32_t min_run, uint32_t *n_tiles, char *err, size_t errlen)
{
    struct msv_check_bufs  bufs;
    int                    rc;

    bufs.n = 0;
    rc = msv_check_attention(&bufs, out, q, q_stride, n_heads, n_kv_heads,
                             head_dim, scale, kv, mode, stages, walk_cols,
                             tiled, min_run, n_tiles, err, errlen);
    msv_check_free(&bufs);
    return rc;
}


/* The GEMV on the device: plain (out fp32 [n][rows], uploaded first for
 * accumulate) or with SiLU·up fused (silu: out bf16 [n][rows / 2]). */
static int
msv_check_gemv(struct msv_check_bufs *bufs, void *out, const uint16_t *w,
    const uint16_t *act, uint32_t rows, uint32_t cols, uint32_t n,
    int accumulate, int silu, char *err, size_t errlen)
{
    struct msv_dmat  m;
    void            *dw, *dx, *dout;
    size_t           out_bytes;

    out_bytes = silu ? (size_t) n * (rows / 2) * 2
                     : (size_t) n * rows * sizeof(float);
    if (msv_check_put(bufs, &dw, w, (size_t) rows * cols * 2, err, errlen)
        != 0
        || msv_check_put(bufs, &dx, act, (size_t) n * cols * 2, err, errlen)
           != 0
        || msv_check_put(bufs, &dout, silu ? NULL : out, out_bytes, err,
                         errlen) != 0)
    {
        return -1;
    }
    m.p = dw;
    m.dtype = MSV_BF16;
    m.rows = rows;
    m.cols = cols;
    if (silu ? !gemv_silu_usable(&m, MSV_ACT_BF16, n, 0)
             : !gemv_usable(&m, MSV_ACT_BF16, n, 0))
    {
        snprintf(err, errlen, "kernel check: gemv%s not usable for %u x %u, "
                 "n %u", silu ? " with SiLU·up" : "", rows, cols, n);
        return -1;
    }
    if (silu) {
        MSV_CUDA_TRY(gemv_silu_forward(&m, dx, n, dout, 0), err, errlen);
    } else {
        MSV_CUDA_TRY(gemv_forward(&m, dx, n, (float *) dout, accumulate, 0),
                     err, errlen);
    }
    MSV_CUDA_TRY(cudaDeviceSynchronize(), err, errlen);
    MSV_CUDA_TRY(cudaMemcpy(out, dout, out_bytes, cudaMemcpyDeviceToHost),
                 err, errlen);
    return 0;
}


extern "C" int
msv_cuda_run_gemv(float *out, const uint16_t *w, const uint16_t *act,
    uint32_t rows, uint32_t cols, uint32_t n, int accumulate, char *err,
    size_t errlen)
{
    struct msv_check_bufs  bufs;
    int                    rc;

    bufs.n = 0;
    rc = msv_check_gemv(&bufs, out, w, act, rows, cols, n, accumulate, 0,
                        err, errlen);
    msv_check_free(&bufs);
    return rc;
}


extern "C" int
msv_cuda_run_gemv_silu(uint16_t *out, const uint16_t *w, const uint16_t *act,
    uint32_t rows, uint32_t cols, uint32_t n, char *err, size_t errlen)
{
    struct msv_check_bufs  bufs;
    int                    rc;

    bufs.n = 0;
    rc = msv_check_gemv(&bufs, out, w, act, rows, cols, n, 0, 1, err,
                        errlen);
    msv_check_free(&bufs);
    return rc;
}


static int
msv_check_silu_mul(struct msv_check_bufs *bufs, float *out, int fmt,
    const float *gu, int gu_bf16, uint32_t n_rows, uint32_t n, char *err,
    size_t errlen)
{
    void      *dgu, *dout;
    uint16_t  *h;
    size_t     total, i;
    int        rc;

    total = (size_t) n_rows * n;
    h = (uint16_t *) malloc((total > 0 ? 2 * total : 1) * sizeof(uint16_t));
    if (h == NULL) {
        snprintf(err, errlen, "kernel check: out of host memory");
        return -1;
    }
    for (i = 0; gu_bf16 && i < 2 * total; i++) {
        h[i] = msv_check_to_bf16(gu[i]);
    }
    rc = gu_bf16 ? msv_check_put(bufs, &dgu, h, 2 * total * 2, err, errlen)
                 : msv_check_put(bufs, &dgu, gu, 2 * total * sizeof(float),
                                 err, errlen);
    free(h);
    if (rc != 0
        || msv_check_put(bufs, &dout, NULL, total * 4, err, errlen) != 0)
    {
        return -1;
    }
    MSV_CUDA_TRY(silu_mul_forward(dout, fmt, dgu,
                                  gu_bf16 ? MSV_BF16 : MSV_F32, n_rows, n, 0),
                 err, errlen);
    MSV_CUDA_TRY(cudaDeviceSynchronize(), err, errlen);
    return msv_check_act_get(out, dout, fmt, total, err, errlen);
}


extern "C" int
msv_cuda_run_silu_mul(float *out, int fmt, const float *gu, int gu_bf16,
    uint32_t n_rows, uint32_t n, char *err, size_t errlen)
{
    struct msv_check_bufs  bufs;
    int                    rc;

    bufs.n = 0;
    rc = msv_check_silu_mul(&bufs, out, fmt, gu, gu_bf16, n_rows, n, err,
                            errlen);
    msv_check_free(&bufs);
    return rc;
}


static int
msv_check_linear_bf16(struct msv_check_bufs *bufs, uint16_t *out,
    const uint16_t *w, const uint16_t *act, uint32_t rows, uint32_t cols,
    uint32_t n, char *err, size_t errlen)
{
    struct msv_dmat  m;
    cublasHandle_t   h;
    void            *dw, *dx, *dout;
    int              rc;

    if (msv_check_put(bufs, &dw, w, (size_t) rows * cols * 2, err, errlen)
        != 0
        || msv_check_put(bufs, &dx, act, (size_t) n * cols * 2, err, errlen)
           != 0
        || msv_check_put(bufs, &dout, NULL, (size_t) n * rows * 2, err,
                         errlen) != 0)
    {
        return -1;
    }
    m.p = dw;
    m.dtype = MSV_BF16;
    m.rows = rows;
    m.cols = cols;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "kernel check: cublasCreate failed");
        return -1;
    }
    rc = linear_forward_bf16(h, &m, dx, n, dout, err, errlen);
    cublasDestroy(h);
    if (rc != 0) {
        return -1;
    }
    MSV_CUDA_TRY(cudaDeviceSynchronize(), err, errlen);
    MSV_CUDA_TRY(cudaMemcpy(out, dout, (size_t) n * rows * 2,
                            cudaMemcpyDeviceToHost), err, errlen);
    return 0;
}


extern "C" int
msv_cuda_run_linear_bf16(uint16_t *out, const uint16_t *w,
    const uint16_t *act, uint32_t rows, uint32_t cols, uint32_t n, char *err,
    size_t errlen)
{
    struct msv_check_bufs  bufs;
    int                    rc;

    bufs.n = 0;
    rc = msv_check_linear_bf16(&bufs, out, w, act, rows, cols, n, err,
                               errlen);
    msv_check_free(&bufs);
    return rc;
}


/* Bytes rounded up to 256: each run's rows start aligned, as the
 * backend's buffers (cudaMalloc'd, lm_head chunks of 512 rows) do. */
#define MSV_CHECK_ALIGN(bytes)  (((bytes) + 255) & ~(size_t) 255)

static int
msv_check_linear_inv(struct msv_check_bufs *bufs, float *out, const void *w,
    const void *act, int fmt, uint32_t rows, uint32_t cols,
    const uint32_t *n, uint32_t n_runs, int accumulate, int silu,
    int *fixed, char *line, size_t linelen, char *err, size_t errlen)
{
    struct msv_gemm_inv  inv;
    struct msv_dmat      m;
    cublasHandle_t       cublas;
    cudaStream_t         stream;
    cudaError_t          e;
    void                *dw, *dx, *dout, *ws, *dsilu;
    uint16_t            *hs;
    size_t               esz, xb, ob, sb, xo, oo, so, r0, i, half;
    uint32_t             k;
    int                  rc;

    *fixed = 0;
    line[0] = '\0';
    if (fmt != MSV_ACT_BF16 && fmt != MSV_ACT_F32) {
        snprintf(err, errlen, "kernel check: linear_inv: format %d", fmt);
        return -1;
    }
    if (silu && (fmt != MSV_ACT_BF16 || accumulate || rows % 2 != 0)) {
        snprintf(err, errlen, "kernel check: linear_inv: SiLU·up takes "
                 "bf16, no accumulate, even rows");
        return -1;
    }
    esz = fmt == MSV_ACT_F32 ? 4 : 2;
    half = rows / 2;
    xb = 0;
    ob = 0;
    sb = 0;
    for (k = 0; k < n_runs; k++) {
        xb += MSV_CHECK_ALIGN((size_t) n[k] * cols * esz);
        ob += MSV_CHECK_ALIGN((size_t) n[k] * rows * sizeof(float));
        sb += MSV_CHECK_ALIGN((size_t) n[k] * half * 2);
    }
    if (msv_check_put(bufs, &dw, w, (size_t) rows * cols * esz, err, errlen)
        != 0
        || msv_check_put(bufs, &dx, NULL, xb, err, errlen) != 0
        || msv_check_put(bufs, &dout, NULL, ob, err, errlen) != 0
        || msv_check_put(bufs, &ws, NULL, 32u << 20, err, errlen) != 0
        || msv_check_put(bufs, &dsilu, NULL, sb, err, errlen) != 0)
    {
        return -1;
    }
    xo = 0;
    oo = 0;
    r0 = 0;
    for (k = 0; k < n_runs; k++) {
        MSV_CUDA_TRY(cudaMemcpy((char *) dx + xo,
                                (const char *) act + r0 * cols * esz,
                                (size_t) n[k] * cols * esz,
                                cudaMemcpyHostToDevice), err, errlen);
        MSV_CUDA_TRY(cudaMemcpy((char *) dout + oo, out + r0 * rows,
                                (size_t) n[k] * rows * sizeof(float),
                                cudaMemcpyHostToDevice), err, errlen);
        xo += MSV_CHECK_ALIGN((size_t) n[k] * cols * esz);
        oo += MSV_CHECK_ALIGN((size_t) n[k] * rows * sizeof(float));
        r0 += n[k];
    }
    m.p = dw;
    m.dtype = fmt == MSV_ACT_F32 ? MSV_F32 : MSV_BF16;
    m.rows = rows;
    m.cols = cols;

    MSV_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                 err, errlen);
    cublas = NULL;
    rc = -1;
    if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS
        || cublasSetStream(cublas, stream) != CUBLAS_STATUS_SUCCESS)
    {
        snprintf(err, errlen, "kernel check: cublasCreate failed");
        goto done;
    }
    if (gemm_inv_init(&inv, ws, 32u << 20, err, errlen) != 0) {
        goto done;
    }
    if (gemm_inv_pin(&inv, cublas, &m, stream, line, linelen, err,
                     errlen) == 0)
    {
        *fixed = inv.plan[0].fixed;
        rc = 0;
        xo = 0;
        oo = 0;
        so = 0;
        for (k = 0; k < n_runs && rc == 0; k++) {
            /* the backend's path: the product, then SiLU·up */
            rc = linear_forward(cublas, &inv, &m, (const char *) dx + xo,
                                fmt, n[k], (float *) ((char *) dout + oo),
                                accumulate, NULL, stream, err, errlen);
            if (rc == 0 && silu) {
                e = silu_mul_forward((char *) dsilu + so, MSV_ACT_BF16,
                                     (char *) dout + oo, MSV_F32, n[k],
                                     (uint32_t) half, stream);
                rc = e == cudaSuccess ? 0
                     : msv_cuda_fail(err, errlen, "silu_mul_forward",
                                     __FILE__, __LINE__, e);
            }
            xo += MSV_CHECK_ALIGN((size_t) n[k] * cols * esz);
            oo += MSV_CHECK_ALIGN((size_t) n[k] * rows * sizeof(float));
            so += MSV_CHECK_ALIGN((size_t) n[k] * half * 2);
        }
        if (rc == 0 && cudaStreamSynchronize(stream) != cudaSuccess) {
            snprintf(err, errlen, "kernel check: linear_inv: the products "
                     "failed");
            rc = -1;
        }
    }
    gemm_inv_free(&inv);

done:
    if (cublas != NULL) {
        cublasDestroy(cublas);
    }
    cudaStreamDestroy(stream);
    if (rc != 0) {
        return -1;
    }
    oo = 0;
    so = 0;
    r0 = 0;
    for (k = 0; k < n_runs; k++) {
        if (silu) {
            /* bf16 values, exactly as floats */
            hs = (uint16_t *) malloc((size_t) n[k] * half * 2);
            if (hs == NULL) {
                snprintf(err, errlen, "kernel check: out of memory");
                return -1;
            }
            e = cudaMemcpy(hs, (char *) dsilu + so, (size_t) n[k] * half * 2,
                           cudaMemcpyDeviceToHost);
            for (i = 0; e == cudaSuccess && i < (size_t) n[k] * half; i++) {
                uint32_t  u = (uint32_t) hs[i] << 16;

                memcpy(out + r0 * half + i, &u, sizeof(float));
            }
            free(hs);
            MSV_CUDA_TRY(e, err, errlen);
        } else {
            MSV_CUDA_TRY(cudaMemcpy(out + r0 * rows, (char *) dout + oo,
                                    (size_t) n[k] * rows * sizeof(float),
                                    cudaMemcpyDeviceToHost), err, errlen);
        }
        oo += MSV_CHECK_ALIGN((size_t) n[k] * rows * sizeof(float));
        so += MSV_CHECK_ALIGN((size_t) n[k] * half * 2);
        r0 += n[k];
    }
    return 0;
}


extern "C" int
msv_cuda_run_linear_inv(float *out, const void *w, const void *act, int fmt,
    uint32_t rows, uint32_t cols, const uint32_t *n, uint32_t n_runs,
    int accumulate, int silu, int *fixed, char *line, size_t linelen,
    char *err, size_t errlen)
{
    struct msv_check_bufs  bufs;
    int                    rc;

    bufs.n = 0;
    rc = msv_check_linear_inv(&bufs, out, w, act, fmt, rows, cols, n, n_runs,
                              accumulate, silu, fixed, line, linelen, err,
                              errlen);
    msv_check_free(&bufs);
    return rc;
}
