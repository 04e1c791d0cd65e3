/*
 * kernel_check.cu: host-array wrappers around single kernels, for the
 * per-kernel comparisons in kernels/check_backend.
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

static_assert(MSV_CHECK_F32 == MSV_ACT_F32
              && MSV_CHECK_BF16 == MSV_ACT_BF16
              && MSV_CHECK_BF16X2 == MSV_ACT_BF16X2,
              "kernel_check.h formats match enum msv_act_fmt");

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


static int
msv_check_rmsnorm(struct msv_check_bufs *bufs, float *out, int fmt,
    const float *x, uint32_t n_in_rows, const int32_t *rows, const float *w,
    uint32_t n_rows, uint32_t n, float eps, char *err, size_t errlen)
{
    void      *dx, *drows, *dw, *dout;
    uint16_t  *h;
    size_t     total, i;

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

    MSV_CUDA_TRY(rmsnorm_forward(dout, fmt, (const float *) dx,
                                 (const int32_t *) drows,
                                 (const float *) dw, n_rows, n, eps, 0),
                 err, errlen);
    MSV_CUDA_TRY(cudaDeviceSynchronize(), err, errlen);

    if (fmt == MSV_ACT_F32) {
        MSV_CUDA_TRY(cudaMemcpy(out, dout, total * sizeof(float),
                                cudaMemcpyDeviceToHost), err, errlen);
        return 0;
    }

    h = (uint16_t *) malloc(total * 2 * sizeof(uint16_t));
    if (h == NULL) {
        snprintf(err, errlen, "kernel check: out of host memory");
        return -1;
    }
    if (cudaMemcpy(h, dout, total * (fmt == MSV_ACT_BF16X2 ? 4 : 2),
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
        && (msv_check_put(bufs, &p[4], kv->k_cache,
                          cache_floats * sizeof(float), err, errlen) != 0
            || msv_check_put(bufs, &p[5], kv->v_cache,
                             cache_floats * sizeof(float), err, errlen) != 0))
    {
        return -1;
    }

    map->pos = (const int32_t *) p[0];
    map->tok_seq = (const int32_t *) p[1];
    map->page_off = (const int32_t *) p[2];
    map->pages = (const int32_t *) p[3];
    map->k_cache = (float *) p[4];
    map->v_cache = (float *) p[5];
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

    MSV_CUDA_TRY(qkv_rope_forward(&a, 0), err, errlen);
    MSV_CUDA_TRY(cudaDeviceSynchronize(), err, errlen);

    MSV_CUDA_TRY(cudaMemcpy(qkv, a.qkv, kv->n_tokens * width * sizeof(float),
                            cudaMemcpyDeviceToHost), err, errlen);
    if (kv->k_cache != NULL) {
        MSV_CUDA_TRY(cudaMemcpy(kv->k_cache, a.kv.k_cache,
                                cache * sizeof(float),
                                cudaMemcpyDeviceToHost), err, errlen);
        MSV_CUDA_TRY(cudaMemcpy(kv->v_cache, a.kv.v_cache,
                                cache * sizeof(float),
                                cudaMemcpyDeviceToHost), err, errlen);
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
    uint32_t head_dim, float scale, const struct msv_check_kv *kv,
    char *err, size_t errlen)
{
    struct msv_attn_args  a;
    size_t                cache, out_n;
    void                 *dq, *dout;

    cache = (size_t) kv->n_pages * n_kv_heads * MSV_KV_BLOCK * head_dim;
    out_n = (size_t) kv->n_tokens * n_heads * head_dim;

    memset(&a, 0, sizeof(a));
    if (msv_check_put(bufs, &dq, q, (size_t) kv->n_tokens * q_stride
                                    * sizeof(float), err, errlen) != 0
        || msv_check_put(bufs, &dout, NULL, out_n * sizeof(float), err,
                         errlen) != 0
        || msv_check_kv_put(bufs, kv, cache, &a.kv, err, errlen) != 0)
    {
        return -1;
    }

    a.out = (float *) dout;
    a.q = (const float *) dq;
    a.q_stride = q_stride;
    a.n_tokens = kv->n_tokens;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv_heads;
    a.head_dim = head_dim;
    a.scale = scale;

    MSV_CUDA_TRY(attention_forward(&a, 0), err, errlen);
    MSV_CUDA_TRY(cudaDeviceSynchronize(), err, errlen);
    MSV_CUDA_TRY(cudaMemcpy(out, dout, out_n * sizeof(float),
                            cudaMemcpyDeviceToHost), err, errlen);
    return 0;
}


extern "C" int
msv_cuda_run_attention(float *out, const float *q, uint32_t q_stride,
    uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, float scale,
    const struct msv_check_kv *kv, char *err, size_t errlen)
{
    struct msv_check_bufs  bufs;
    int                    rc;

    bufs.n = 0;
    rc = msv_check_attention(&bufs, out, q, q_stride, n_heads, n_kv_heads,
                             head_dim, scale, kv, err, errlen);
    msv_check_free(&bufs);
    return rc;
}
