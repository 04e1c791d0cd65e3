/*
 * rope.cu: bias, q/k norm, RoPE and KV store, one block per (token,
 * head).  The store rounds k and v to the cache's element type (bf16 or
 * fp32); q and the rows left in qkv stay fp32.
 */

#include "backend.h"
#include "rope.cuh"

#define MSV_ROPE_THREADS  128

/* Where head h (a k or v head) of token t at position p goes in the
 * cache, or NULL when the step stores no KV. */
template <typename KV>
static __device__ __forceinline__ KV *
msv_rope_kv_dst(const struct msv_qkv_args *a, uint32_t t, uint32_t h, int p,
    int is_k, uint32_t hd)
{
    uint32_t  kvh, slot;
    size_t    off;

    if (a->kv.k_cache == NULL) {
        return NULL;
    }
    kvh = is_k ? h - a->n_heads : h - a->n_heads - a->n_kv_heads;
    slot = (uint32_t) p % MSV_KV_BLOCK;
    off = (size_t) a->kv.pages[a->kv.page_off[a->kv.tok_seq[t]]
                               + p / MSV_KV_BLOCK];
    off = ((off * a->n_kv_heads + kvh) * MSV_KV_BLOCK + slot) * hd;
    return (KV *) (is_k ? a->kv.k_cache : a->kv.v_cache) + off;
}

template <typename KV>
static __global__ void
qkv_rope_kernel(struct msv_qkv_args a)
{
    extern __shared__ float  s[];      /* [head_dim] */
    __shared__ float         red[33];
    uint32_t                 h, t, d, hd, half;
    KV                      *dst;
    float                   *row, x0, x1, y0, y1, ang, sn, cs, ss,
                             scale;
    const float             *nw;
    int                      is_q, is_k, is_v, p;

    msv_l2_prefetch(a.pf);
    t = blockIdx.x;
    h = blockIdx.y;
    hd = a.head_dim;
    half = hd / 2;
    is_q = h < a.n_heads;
    is_k = !is_q && h < a.n_heads + a.n_kv_heads;
    is_v = !is_q && !is_k;

    row = a.qkv + (size_t) t * (a.n_heads + 2 * a.n_kv_heads) * hd
          + (size_t) h * hd;

    for (d = threadIdx.x; d < hd; d += blockDim.x) {
        s[d] = row[d] + (a.bias != NULL ? a.bias[(size_t) h * hd + d] : 0.0f);
    }
    __syncthreads();

    nw = is_q ? a.q_norm : (is_k ? a.k_norm : NULL);
    if (nw != NULL) {
        ss = 0.0f;
        for (d = threadIdx.x; d < hd; d += blockDim.x) {
            ss += s[d] * s[d];
        }
        ss = msv_block_sum(ss, red);
        scale = 1.0f / sqrtf(ss / (float) hd + a.eps);
        for (d = threadIdx.x; d < hd; d += blockDim.x) {
            s[d] = nw[d] * (s[d] * scale);
        }
        __syncthreads();
    }

    p = a.kv.pos[t];

    dst = is_q ? NULL : msv_rope_kv_dst<KV>(&a, t, h, p, is_k, hd);

    if (is_v) {
        for (d = threadIdx.x; d < hd; d += blockDim.x) {
            row[d] = s[d];
            if (dst != NULL) {
                msv_kv_put(&dst[d], s[d]);
            }
        }
        return;
    }

    /* Hugging Face: cos/sin of the fp32 product position * inv_freq,
     * x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1). */
    for (d = threadIdx.x; d < half; d += blockDim.x) {
        ang = __fmul_rn((float) p, a.inv_freq[d]);
        sincosf(ang, &sn, &cs);
        x0 = s[d];
        x1 = s[d + half];
        y0 = x0 * cs - x1 * sn;
        y1 = x1 * cs + x0 * sn;
        row[d] = y0;
        row[d + half] = y1;
        if (dst != NULL) {
            msv_kv_put(&dst[d], y0);
            msv_kv_put(&dst[d + half], y1);
        }
    }
}

/*
 * head_dim a multiple of 64, at most 256 (every model preset): one warp
 * per (token, head), NP = head_dim / 32 elements a lane, kept in
 * registers; lane l holds dimensions l + 32 i, so with half = head_dim / 2
 * a multiple of 32 the rotation's partner of element i is the same lane's
 * element i + NP / 2.  The norm is a warp sum; no shared memory, no block
 * barrier (the kernel above spends a block and three barriers on a
 * 128-element head).
 */
#define MSV_ROPE_WARPS  4

template <typename KV, int NP>
static __global__ void __launch_bounds__(MSV_ROPE_WARPS * 32)
qkv_rope_warp_kernel(struct msv_qkv_args a)
{
    uint32_t      h, t, hd, lane, d;
    KV           *dst;
    float        *row, v[NP], ss, scale, ang, sn, cs, x0, x1;
    const float  *nw;
    int           is_q, is_k, p, i;

    msv_l2_prefetch(a.pf);
    msv_grid_wait();
    msv_grid_release();
    t = blockIdx.x;
    h = blockIdx.y * MSV_ROPE_WARPS + (threadIdx.x >> 5);
    if (h >= a.n_heads + 2 * a.n_kv_heads) {
        return;
    }
    lane = threadIdx.x & 31;
    hd = NP * 32;
    is_q = h < a.n_heads;
    is_k = !is_q && h < a.n_heads + a.n_kv_heads;

    row = a.qkv + (size_t) t * (a.n_heads + 2 * a.n_kv_heads) * hd
          + (size_t) h * hd;
#pragma unroll
    for (i = 0; i < NP; i++) {
        d = lane + 32 * i;
        v[i] = row[d] + (a.bias != NULL ? a.bias[(size_t) h * hd + d] : 0.0f);
    }

    nw = is_q ? a.q_norm : (is_k ? a.k_norm : NULL);
    if (nw != NULL) {
        ss = 0.0f;
#pragma unroll
        for (i = 0; i < NP; i++) {
            ss += v[i] * v[i];
        }
        ss = msv_warp_sum(ss);
        scale = 1.0f / sqrtf(ss / (float) hd + a.eps);
#pragma unroll
        for (i = 0; i < NP; i++) {
            v[i] = nw[lane + 32 * i] * (v[i] * scale);
        }
    }

    p = a.kv.pos[t];

    dst = is_q ? NULL : msv_rope_kv_dst<KV>(&a, t, h, p, is_k, hd);

    if (is_q || is_k) {
        /* as the kernel above: cos/sin of the fp32 product position *
         * inv_freq, x * cos + rotate_half(x) * sin */
#pragma unroll
        for (i = 0; i < NP / 2; i++) {
            d = lane + 32 * i;
            ang = __fmul_rn((float) p, a.inv_freq[d]);
            sincosf(ang, &sn, &cs);
            x0 = v[i];
            x1 = v[i + NP / 2];
            v[i] = x0 * cs - x1 * sn;
            v[i + NP / 2] = x1 * cs + x0 * sn;
        }
    }

#pragma unroll
    for (i = 0; i < NP; i++) {
        d = lane + 32 * i;
        row[d] = v[i];
        if (dst != NULL) {
            msv_kv_put(&dst[d], v[i]);
        }
    }
}

cudaError_t
qkv_rope_forward(const struct msv_qkv_args *a, cudaStream_t stream)
{
    cudaError_t  e;
    dim3         grid;
    uint32_t     nh;

    if (a->n_tokens == 0) {
        return cudaSuccess;
    }

    nh = a->n_heads + 2 * a->n_kv_heads;
    if (a->head_dim % 64 == 0 && a->head_dim <= 256) {
        grid = dim3(a->n_tokens, MSV_CEIL_DIV(nh, (uint32_t) MSV_ROPE_WARPS));

#define MSV_ROPE_WARP(KV, NP)                                                \
        e = msv_launch(qkv_rope_warp_kernel<KV, NP>, grid,                   \
                       dim3(MSV_ROPE_WARPS * 32), 0, stream, *a)

        if (a->kv.kv_bf16) {
            if (a->head_dim == 64) {
                MSV_ROPE_WARP(__nv_bfloat16, 2);
            } else if (a->head_dim == 128) {
                MSV_ROPE_WARP(__nv_bfloat16, 4);
            } else if (a->head_dim == 192) {
                MSV_ROPE_WARP(__nv_bfloat16, 6);
            } else {
                MSV_ROPE_WARP(__nv_bfloat16, 8);
            }
        } else if (a->head_dim == 64) {
            MSV_ROPE_WARP(float, 2);
        } else if (a->head_dim == 128) {
            MSV_ROPE_WARP(float, 4);
        } else if (a->head_dim == 192) {
            MSV_ROPE_WARP(float, 6);
        } else {
            MSV_ROPE_WARP(float, 8);
        }
#undef MSV_ROPE_WARP
        return e;
    }

    grid = dim3(a->n_tokens, a->n_heads + 2 * a->n_kv_heads);
    if (a->kv.kv_bf16) {
        qkv_rope_kernel<__nv_bfloat16><<<grid, MSV_ROPE_THREADS,
            a->head_dim * sizeof(float), stream>>>(*a);
    } else {
        qkv_rope_kernel<float><<<grid, MSV_ROPE_THREADS,
            a->head_dim * sizeof(float), stream>>>(*a);
    }
    return cudaGetLastError();
}
