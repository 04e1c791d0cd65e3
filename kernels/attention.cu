/*
 * attention.cu: one block per (token, kv head, group of up to
 * MSV_ATTN_GROUP query heads sharing that kv head), so each K and V row
 * is read once for the whole group.  Each warp walks every
 * MSV_ATTN_WARPS-th key of the sequence with an online softmax per head
 * (running max m, running sum l, running weighted sum of v); the warps'
 * states are merged at the end.  Lane i holds dimensions i, i + 32, ...
 * of q, k, v and the accumulators.
 */

#include <math.h>

#include "backend.h"
#include "attention.cuh"

#define MSV_ATTN_WARPS  4
#define MSV_ATTN_GROUP  4


template <int PER_LANE>
static __global__ void
attention_kernel(struct msv_attn_args a)
{
    extern __shared__ float  sm[];     /* acc [WARPS][GROUP][hd],
                                          m, l [WARPS][GROUP] */
    uint32_t                 t, kvh, h0, ng, hd, lane, warp, d, w;
    int32_t                  p, j, page, poff;
    const float             *qr, *kp, *vp;
    float                    qv[MSV_ATTN_GROUP][PER_LANE];
    float                    acc[MSV_ATTN_GROUP][PER_LANE];
    float                    m[MSV_ATTN_GROUP], l[MSV_ATTN_GROUP];
    float                    kv_k[PER_LANE], kv_v[PER_LANE];
    float                    dot, sc, mn, corr, pr, mx, den, o, f;
    float                   *sacc, *sm_m, *sm_l;
    size_t                   base;
    int                      i, g;

    t = blockIdx.x;
    kvh = blockIdx.y;
    hd = a.head_dim;
    h0 = kvh * (a.n_heads / a.n_kv_heads) + blockIdx.z * MSV_ATTN_GROUP;
    ng = min((uint32_t) MSV_ATTN_GROUP,
             (kvh + 1) * (a.n_heads / a.n_kv_heads) - h0);
    lane = threadIdx.x & 31;
    warp = threadIdx.x >> 5;

    p = a.kv.pos[t];
    poff = a.kv.page_off[a.kv.tok_seq[t]];
    qr = a.q + (size_t) t * a.q_stride + (size_t) h0 * hd;

#pragma unroll
    for (g = 0; g < MSV_ATTN_GROUP; g++) {
#pragma unroll
        for (i = 0; i < PER_LANE; i++) {
            d = lane + 32 * i;
            qv[g][i] = (uint32_t) g < ng && d < hd ? qr[g * hd + d] : 0.0f;
            acc[g][i] = 0.0f;
        }
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }

    for (j = (int32_t) warp; j <= p; j += MSV_ATTN_WARPS) {
        page = a.kv.pages[poff + j / MSV_KV_BLOCK];
        base = (((size_t) page * a.n_kv_heads + kvh) * MSV_KV_BLOCK
                + (size_t) (j % MSV_KV_BLOCK)) * hd;
        kp = a.kv.k_cache + base;
        vp = a.kv.v_cache + base;

#pragma unroll
        for (i = 0; i < PER_LANE; i++) {
            d = lane + 32 * i;
            kv_k[i] = d < hd ? kp[d] : 0.0f;
            kv_v[i] = d < hd ? vp[d] : 0.0f;
        }

#pragma unroll
        for (g = 0; g < MSV_ATTN_GROUP; g++) {
            if ((uint32_t) g >= ng) {
                break;
            }
            dot = 0.0f;
#pragma unroll
            for (i = 0; i < PER_LANE; i++) {
                dot += qv[g][i] * kv_k[i];
            }
            dot = msv_warp_sum(dot);

            sc = dot * a.scale;
            mn = fmaxf(m[g], sc);
            corr = expf(m[g] - mn);
            pr = expf(sc - mn);
            l[g] = l[g] * corr + pr;
#pragma unroll
            for (i = 0; i < PER_LANE; i++) {
                acc[g][i] = acc[g][i] * corr + pr * kv_v[i];
            }
            m[g] = mn;
        }
    }

    sacc = sm;
    sm_m = sm + MSV_ATTN_WARPS * MSV_ATTN_GROUP * hd;
    sm_l = sm_m + MSV_ATTN_WARPS * MSV_ATTN_GROUP;

#pragma unroll
    for (g = 0; g < MSV_ATTN_GROUP; g++) {
#pragma unroll
        for (i = 0; i < PER_LANE; i++) {
            d = lane + 32 * i;
            if (d < hd) {
                sacc[(warp * MSV_ATTN_GROUP + g) * hd + d] = acc[g][i];
            }
        }
        if (lane == 0) {
            sm_m[warp * MSV_ATTN_GROUP + g] = m[g];
            sm_l[warp * MSV_ATTN_GROUP + g] = l[g];
        }
    }
    __syncthreads();

    /* Warps that saw no key have m = -inf and contribute exp(-inf) = 0. */
    for (g = 0; (uint32_t) g < ng; g++) {
        mx = -INFINITY;
        for (w = 0; w < MSV_ATTN_WARPS; w++) {
            mx = fmaxf(mx, sm_m[w * MSV_ATTN_GROUP + g]);
        }
        den = 0.0f;
        for (w = 0; w < MSV_ATTN_WARPS; w++) {
            den += sm_l[w * MSV_ATTN_GROUP + g]
                   * expf(sm_m[w * MSV_ATTN_GROUP + g] - mx);
        }

        for (d = threadIdx.x; d < hd; d += blockDim.x) {
            o = 0.0f;
            for (w = 0; w < MSV_ATTN_WARPS; w++) {
                f = expf(sm_m[w * MSV_ATTN_GROUP + g] - mx);
                o += sacc[(w * MSV_ATTN_GROUP + g) * hd + d] * f;
            }
            a.out[(size_t) t * a.n_heads * hd + (size_t) (h0 + g) * hd + d] =
                o / den;
        }
    }
}


cudaError_t
attention_forward(const struct msv_attn_args *a, cudaStream_t stream)
{
    dim3    grid;
    size_t  smem;
    int     threads;

    if (a->n_tokens == 0) {
        return cudaSuccess;
    }

    grid = dim3(a->n_tokens, a->n_kv_heads,
                MSV_CEIL_DIV(a->n_heads / a->n_kv_heads, MSV_ATTN_GROUP));
    smem = (size_t) MSV_ATTN_WARPS * MSV_ATTN_GROUP * (a->head_dim + 2)
           * sizeof(float);
    threads = MSV_ATTN_WARPS * 32;

    if (a->head_dim <= 64) {
        attention_kernel<2><<<grid, threads, smem, stream>>>(*a);
    } else if (a->head_dim <= 128) {
        attention_kernel<4><<<grid, threads, smem, stream>>>(*a);
    } else {
        attention_kernel<8><<<grid, threads, smem, stream>>>(*a);
    }
    return cudaGetLastError();
}
