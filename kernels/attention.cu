/*
 * attention.cu: one block per (token, kv head, group of up to
 * MSV_ATTN_GROUP query heads sharing that kv head), so each K and V row
 * is read once for the whole group; in the parallel form also per split.
 *
 * A block walks its keys one KV page (MSV_KV_BLOCK positions) at a time:
 *   load:    the page's K and V rows into shared memory as fp32, with
 *            coalesced loads of two elements;
 *   scores:  R threads per (head, key) pair, R = 8, 4, 2 for 1, 2, 3-4
 *            heads, each summing every R-th dimension, then R-lane
 *            shuffles; K rows are padded by R floats so the pairs of a
 *            warp hit distinct banks;
 *   softmax: one warp per head updates its running max and sum;
 *   values:  each thread owns (head, dimension) elements and adds the
 *            page's weighted V rows.
 * At the end of a split the (m, l, output) state is folded into the
 * token's state (serial form) or written to the workspace for the merge
 * kernel (parallel form); both fold with the same rounding-explicit code,
 * in split order.
 */

#include <math.h>

#include "backend.h"
#include "attention.cuh"

#define MSV_ATTN_GROUP    4            /* heads per block: one warp each */
#define MSV_ATTN_THREADS  (MSV_ATTN_GROUP * 32)
#define MSV_ATTN_PER_THR  (MSV_ATTN_GROUP * MSV_ATTN_MAX_HEAD_DIM        \
                           / MSV_ATTN_THREADS)
#define MSV_ATTN_WIDE     1024         /* blocks that fill the GPU: no
                                          need to split further */

static_assert(MSV_ATTN_SPLIT % MSV_KV_BLOCK == 0,
              "a split is whole pages");
static_assert(MSV_KV_BLOCK <= 32, "one lane per key of a page");


/* Fold the partial state (m, l, acc) into (M, L, A).  Explicit roundings
 * (no contraction) so every kernel that folds gets the same bits. */
static __device__ __forceinline__ void
msv_attn_fold(float *M, float *L, float *A, float m, float l, float acc)
{
    float  mn, a, b;

    mn = fmaxf(*M, m);
    a = expf(*M - mn);                 /* *M = -inf at first: a = 0 */
    b = expf(m - mn);
    *L = __fadd_rn(__fmul_rn(*L, a), __fmul_rn(l, b));
    *A = __fadd_rn(__fmul_rn(*A, a), __fmul_rn(acc, b));
    *M = mn;
}


template <typename KV>
static __global__ void __launch_bounds__(MSV_ATTN_THREADS)
attention_kernel(struct msv_attn_args a, uint32_t n_groups, uint32_t S)
{
    extern __shared__ float  sm[];
    uint32_t                 t, kvh, gz, h0, ng, hd, ratio, tid, lane, warp,
                             R, kst, nkeys, ns, s, j0, j1, pg, nk, pair,
                             part, g, j, d, e, i;
    int32_t                  poff, page;
    const KV                *kp, *vp;
    float                   *qs, *ks, *vs, *ps, *cs, *ml;
    float                    acc[MSV_ATTN_PER_THR], A[MSV_ATTN_PER_THR],
                             M[MSV_ATTN_PER_THR], L[MSV_ATTN_PER_THR];
    float                    dot, v, mx, mn, pr, sum, cr, m_run, l_run, o;
    float2                   k2, v2;
    size_t                   kvoff, w;
    int                      off;

    t = blockIdx.x;
    kvh = blockIdx.y / n_groups;
    gz = blockIdx.y % n_groups;
    hd = a.head_dim;
    ratio = a.n_heads / a.n_kv_heads;
    h0 = kvh * ratio + gz * MSV_ATTN_GROUP;
    ng = min((uint32_t) MSV_ATTN_GROUP, ratio - gz * MSV_ATTN_GROUP);
    tid = threadIdx.x;
    lane = tid & 31;
    warp = tid >> 5;

    nkeys = (uint32_t) a.kv.pos[t] + 1;
    ns = MSV_CEIL_DIV(nkeys, (uint32_t) MSV_ATTN_SPLIT);
    if (blockIdx.z >= ns) {
        return;                        /* the whole block: no barrier yet */
    }

    R = ng == 1 ? 8 : (ng == 2 ? 4 : 2);
    kst = hd + R;
    qs = sm;                                   /* [GROUP][hd] */
    ks = qs + MSV_ATTN_GROUP * hd;             /* [KV_BLOCK][hd + R] */
    vs = ks + MSV_KV_BLOCK * (hd + 8);         /* [KV_BLOCK][hd] */
    ps = vs + MSV_KV_BLOCK * hd;               /* [GROUP][KV_BLOCK] */
    cs = ps + MSV_ATTN_GROUP * MSV_KV_BLOCK;   /* [GROUP] */
    ml = cs + MSV_ATTN_GROUP;                  /* [GROUP][2] */

    for (e = tid; e < ng * hd; e += MSV_ATTN_THREADS) {
        qs[e] = a.q[(size_t) t * a.q_stride + (size_t) h0 * hd + e];
    }

    poff = a.kv.page_off[a.kv.tok_seq[t]];
    kvoff = (size_t) kvh * MSV_KV_BLOCK * hd;

#pragma unroll
    for (i = 0; i < MSV_ATTN_PER_THR; i++) {
        A[i] = 0.0f;
        M[i] = -INFINITY;
        L[i] = 0.0f;
    }

    for (s = blockIdx.z; s < ns; s += gridDim.z) {
        j0 = s * MSV_ATTN_SPLIT;
        j1 = min(j0 + MSV_ATTN_SPLIT, nkeys);
        m_run = -INFINITY;
        l_run = 0.0f;
#pragma unroll
        for (i = 0; i < MSV_ATTN_PER_THR; i++) {
            acc[i] = 0.0f;
        }

        for (pg = j0; pg < j1; pg += MSV_KV_BLOCK) {
            nk = min((uint32_t) MSV_KV_BLOCK, j1 - pg);
            page = a.kv.pages[poff + pg / MSV_KV_BLOCK];
            w = (size_t) page * a.n_kv_heads * MSV_KV_BLOCK * hd + kvoff;
            kp = (const KV *) a.kv.k_cache + w;
            vp = (const KV *) a.kv.v_cache + w;

            __syncthreads();           /* the last page's readers are done */
            for (e = 2 * tid; e < nk * hd; e += 2 * MSV_ATTN_THREADS) {
                k2 = msv_kv_get2(kp + e);
                v2 = msv_kv_get2(vp + e);
                j = e / hd;
                d = e % hd;
                ks[j * kst + d] = k2.x;
                ks[j * kst + d + 1] = k2.y;
                vs[e] = v2.x;
                vs[e + 1] = v2.y;
            }
            __syncthreads();

            /* scores: R threads per (head, key) */
            pair = tid / R;
            part = tid % R;
            g = pair / MSV_KV_BLOCK;
            j = pair % MSV_KV_BLOCK;
            dot = 0.0f;
            if (g < ng && j < nk) {
                for (d = part; d < hd; d += R) {
                    dot += qs[g * hd + d] * ks[j * kst + d];
                }
            }
            for (off = (int) R / 2; off > 0; off >>= 1) {
                dot += __shfl_xor_sync(0xffffffffu, dot, off);
            }
            if (part == 0 && g < ng) {
                ps[g * MSV_KV_BLOCK + j] = j < nk ? dot * a.scale : -INFINITY;
            }
            __syncthreads();

            /* softmax: warp g for head g */
            if (warp < ng) {
                v = lane < MSV_KV_BLOCK ? ps[warp * MSV_KV_BLOCK + lane]
                                        : -INFINITY;
                mx = v;
                for (off = 16; off > 0; off >>= 1) {
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
                }
                mn = fmaxf(m_run, mx);
                pr = lane < nk ? expf(v - mn) : 0.0f;
                sum = msv_warp_sum(pr);
                cr = expf(m_run - mn);
                l_run = l_run * cr + sum;
                m_run = mn;
                if (lane < MSV_KV_BLOCK) {
                    ps[warp * MSV_KV_BLOCK + lane] = pr;
                }
                if (lane == 0) {
                    cs[warp] = cr;
                }
            }
            __syncthreads();

            /* values */
#pragma unroll
            for (i = 0; i < MSV_ATTN_PER_THR; i++) {
                e = tid + i * MSV_ATTN_THREADS;
                if (e < ng * hd) {
                    g = e / hd;
                    d = e % hd;
                    o = acc[i] * cs[g];
                    for (j = 0; j < nk; j++) {
                        o += ps[g * MSV_KV_BLOCK + j] * vs[j * hd + d];
                    }
                    acc[i] = o;
                }
            }
        }

        /* the split's state */
        if (warp < ng && lane == 0) {
            ml[2 * warp] = m_run;
            ml[2 * warp + 1] = l_run;
        }
        __syncthreads();

#pragma unroll
        for (i = 0; i < MSV_ATTN_PER_THR; i++) {
            e = tid + i * MSV_ATTN_THREADS;
            if (e >= ng * hd) {
                continue;
            }
            g = e / hd;
            d = e % hd;
            if (gridDim.z == 1) {
                msv_attn_fold(&M[i], &L[i], &A[i], ml[2 * g], ml[2 * g + 1],
                              acc[i]);
            } else {
                w = (((size_t) t * a.n_heads + h0 + g) * S + s) * (hd + 2);
                a.part[w + d] = acc[i];
                if (d == 0) {
                    a.part[w + hd] = ml[2 * g];
                    a.part[w + hd + 1] = ml[2 * g + 1];
                }
            }
        }
        __syncthreads();               /* ml is rewritten by the next split */
    }

    if (gridDim.z == 1) {
#pragma unroll
        for (i = 0; i < MSV_ATTN_PER_THR; i++) {
            e = tid + i * MSV_ATTN_THREADS;
            if (e < ng * hd) {
                g = e / hd;
                d = e % hd;
                msv_store_act(a.out, a.out_fmt, a.n_tokens, t,
                              (size_t) a.n_heads * hd,
                              (size_t) (h0 + g) * hd + d, A[i] / L[i]);
            }
        }
    }
}


/*
 * The same attention for head_dim a multiple of 8 (every model preset),
 * vectorised and pipelined: a thread loads 16-byte words of the next page
 * into registers while the block computes on the current one, scores read
 * q and K as float4 (K rows padded by 4 R floats, so each quarter-warp
 * hits distinct banks), and each thread owns float4 slots of (head,
 * dimensions) for the V sums.  NW: 16-byte words of a K page per thread.
 * Its arithmetic differs from attention_kernel's only in the order of the
 * score sums; the choice depends on head_dim alone.
 */
template <typename KV, int NW>
static __global__ void __launch_bounds__(MSV_ATTN_THREADS)
attention_vec_kernel(struct msv_attn_args a, uint32_t n_groups, uint32_t S)
{
    extern __shared__ float4  sm4[];
    const uint32_t            esz = sizeof(KV);
    uint32_t                  t, kvh, gz, h0, ng, hd, ratio, tid, lane, warp,
                              R, kst, nkeys, ns, s, j1, pg, nk, pair, part,
                              g, j, d, e, i, nwords, wi, ns2, npg, nk2;
    int32_t                   poff;
    const uint4              *kp, *vp;
    float                    *sm, *qs, *ks, *vs, *ps, *cs, *ml;
    uint4                     rk[NW], rv[NW];
    float4                    acc[MSV_ATTN_PER_THR / 4],
                              A[MSV_ATTN_PER_THR / 4], q4, k4, v4;
    float                     M[MSV_ATTN_PER_THR / 4],
                              L[MSV_ATTN_PER_THR / 4];
    float                     dot, v, mx, mn, pr, sum, cr, m_run, l_run, w1,
                              f[8];
    size_t                    kvoff, w;
    int                       off;

    t = blockIdx.x;
    kvh = blockIdx.y / n_groups;
    gz = blockIdx.y % n_groups;
    hd = a.head_dim;
    ratio = a.n_heads / a.n_kv_heads;
    h0 = kvh * ratio + gz * MSV_ATTN_GROUP;
    ng = min((uint32_t) MSV_ATTN_GROUP, ratio - gz * MSV_ATTN_GROUP);
    tid = threadIdx.x;
    lane = tid & 31;
    warp = tid >> 5;

    nkeys = (uint32_t) a.kv.pos[t] + 1;
    ns = MSV_CEIL_DIV(nkeys, (uint32_t) MSV_ATTN_SPLIT);
    if (blockIdx.z >= ns) {
        return;
    }

    R = ng == 1 ? 8 : (ng == 2 ? 4 : 2);
    kst = hd + 4 * R;
    sm = (float *) sm4;
    qs = sm;                                   /* [GROUP][hd] */
    ks = qs + MSV_ATTN_GROUP * hd;             /* [KV_BLOCK][hd + 4 R] */
    vs = ks + MSV_KV_BLOCK * (hd + 32);        /* [KV_BLOCK][hd] */
    ps = vs + MSV_KV_BLOCK * hd;               /* [GROUP][KV_BLOCK] */
    cs = ps + MSV_ATTN_GROUP * MSV_KV_BLOCK;   /* [GROUP] */
    ml = cs + MSV_ATTN_GROUP;                  /* [GROUP][2] */

    for (e = tid; e < ng * hd; e += MSV_ATTN_THREADS) {
        qs[e] = a.q[(size_t) t * a.q_stride + (size_t) h0 * hd + e];
    }

    poff = a.kv.page_off[a.kv.tok_seq[t]];
    kvoff = (size_t) kvh * MSV_KV_BLOCK * hd;

#pragma unroll
    for (i = 0; i < MSV_ATTN_PER_THR / 4; i++) {
        A[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        acc[i] = A[i];
        M[i] = -INFINITY;
        L[i] = 0.0f;
    }
    m_run = -INFINITY;
    l_run = 0.0f;

    /* the first page of the first split */
    s = blockIdx.z;
    pg = s * MSV_ATTN_SPLIT;
    nk = min((uint32_t) MSV_KV_BLOCK, nkeys - pg);

#define MSV_ATTN_FETCH(PG, NK)                                               \
    do {                                                                     \
        w = (size_t) a.kv.pages[poff + (PG) / MSV_KV_BLOCK]                  \
            * a.n_kv_heads * MSV_KV_BLOCK * hd + kvoff;                      \
        kp = (const uint4 *) ((const KV *) a.kv.k_cache + w);                \
        vp = (const uint4 *) ((const KV *) a.kv.v_cache + w);                \
        nwords = (NK) * hd * esz / 16;                                       \
        _Pragma("unroll")                                                    \
        for (i = 0; i < NW; i++) {                                           \
            wi = tid + i * MSV_ATTN_THREADS;                                 \
            if (wi < nwords) {                                               \
                rk[i] = kp[wi];                                              \
                rv[i] = vp[wi];                                              \
            }                                                                \
        }                                                                    \
    } while (0)

    MSV_ATTN_FETCH(pg, nk);

    for ( ;; ) {
        j1 = min((s + 1) * MSV_ATTN_SPLIT, nkeys);

        __syncthreads();               /* the last page's readers are done */
#pragma unroll
        for (i = 0; i < NW; i++) {
            wi = tid + i * MSV_ATTN_THREADS;
            if (wi < nk * hd * esz / 16) {
                e = wi * (16 / esz);
                j = e / hd;
                d = e % hd;
                if (esz == 2) {
                    const __nv_bfloat162  *hk = (const __nv_bfloat162 *) &rk[i];
                    const __nv_bfloat162  *hv = (const __nv_bfloat162 *) &rv[i];
                    float2  x;
                    int     u;

                    for (u = 0; u < 4; u++) {
                        x = __bfloat1622float2(hk[u]);
                        f[2 * u] = x.x;
                        f[2 * u + 1] = x.y;
                    }
                    *(float4 *) &ks[j * kst + d] =
                        make_float4(f[0], f[1], f[2], f[3]);
                    *(float4 *) &ks[j * kst + d + 4] =
                        make_float4(f[4], f[5], f[6], f[7]);
                    for (u = 0; u < 4; u++) {
                        x = __bfloat1622float2(hv[u]);
                        f[2 * u] = x.x;
                        f[2 * u + 1] = x.y;
                    }
                    *(float4 *) &vs[e] = make_float4(f[0], f[1], f[2], f[3]);
                    *(float4 *) &vs[e + 4] =
                        make_float4(f[4], f[5], f[6], f[7]);
                } else {
                    *(uint4 *) &ks[j * kst + d] = rk[i];
                    *(uint4 *) &vs[e] = rv[i];
                }
            }
        }
        __syncthreads();

        /* the next page, in flight while this one is computed */
        npg = pg + MSV_KV_BLOCK;
        ns2 = s;
        if (npg >= j1) {
            ns2 = s + gridDim.z;
            npg = ns2 * MSV_ATTN_SPLIT;
        }
        if (ns2 < ns) {
            nk2 = min((uint32_t) MSV_KV_BLOCK,
                      min((ns2 + 1) * MSV_ATTN_SPLIT, nkeys) - npg);
            MSV_ATTN_FETCH(npg, nk2);
        } else {
            nk2 = 0;
        }

        /* scores: R threads per (head, key), float4 steps */
        pair = tid / R;
        part = tid % R;
        g = pair / MSV_KV_BLOCK;
        j = pair % MSV_KV_BLOCK;
        dot = 0.0f;
        if (g < ng && j < nk) {
            for (d = 4 * part; d < hd; d += 4 * R) {
                q4 = *(const float4 *) &qs[g * hd + d];
                k4 = *(const float4 *) &ks[j * kst + d];
                dot += q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w;
            }
        }
        for (off = (int) R / 2; off > 0; off >>= 1) {
            dot += __shfl_xor_sync(0xffffffffu, dot, off);
        }
        if (part == 0 && g < ng) {
            ps[g * MSV_KV_BLOCK + j] = j < nk ? dot * a.scale : -INFINITY;
        }
        __syncthreads();

        /* softmax: warp g for head g */
        if (warp < ng) {
            v = lane < MSV_KV_BLOCK ? ps[warp * MSV_KV_BLOCK + lane]
                                    : -INFINITY;
            mx = v;
            for (off = 16; off > 0; off >>= 1) {
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            }
            mn = fmaxf(m_run, mx);
            pr = lane < nk ? expf(v - mn) : 0.0f;
            sum = msv_warp_sum(pr);
            cr = expf(m_run - mn);
            l_run = l_run * cr + sum;
            m_run = mn;
            if (lane < MSV_KV_BLOCK) {
                ps[warp * MSV_KV_BLOCK + lane] = pr;
            }
            if (lane == 0) {
                cs[warp] = cr;
            }
        }
        __syncthreads();

        /* values: float4 slots */
#pragma unroll
        for (i = 0; i < MSV_ATTN_PER_THR / 4; i++) {
            e = 4 * (tid + i * MSV_ATTN_THREADS);
            if (e < ng * hd) {
                g = e / hd;
                d = e % hd;
                cr = cs[g];
                q4 = make_float4(acc[i].x * cr, acc[i].y * cr, acc[i].z * cr,
                                 acc[i].w * cr);
                for (j = 0; j < nk; j++) {
                    w1 = ps[g * MSV_KV_BLOCK + j];
                    v4 = *(const float4 *) &vs[j * hd + d];
                    q4.x += w1 * v4.x;
                    q4.y += w1 * v4.y;
                    q4.z += w1 * v4.z;
                    q4.w += w1 * v4.w;
                }
                acc[i] = q4;
            }
        }

        if (pg + MSV_KV_BLOCK >= j1) {
            /* the split's state */
            if (warp < ng && lane == 0) {
                ml[2 * warp] = m_run;
                ml[2 * warp + 1] = l_run;
            }
            __syncthreads();

#pragma unroll
            for (i = 0; i < MSV_ATTN_PER_THR / 4; i++) {
                e = 4 * (tid + i * MSV_ATTN_THREADS);
                if (e >= ng * hd) {
                    continue;
                }
                g = e / hd;
                d = e % hd;
                if (gridDim.z == 1) {
                    mn = M[i];
                    sum = L[i];
                    msv_attn_fold(&mn, &sum, &A[i].x, ml[2 * g],
                                  ml[2 * g + 1], acc[i].x);
                    mn = M[i];
                    sum = L[i];
                    msv_attn_fold(&mn, &sum, &A[i].y, ml[2 * g],
                                  ml[2 * g + 1], acc[i].y);
                    mn = M[i];
                    sum = L[i];
                    msv_attn_fold(&mn, &sum, &A[i].z, ml[2 * g],
                                  ml[2 * g + 1], acc[i].z);
                    mn = M[i];
                    sum = L[i];
                    msv_attn_fold(&M[i], &L[i], &A[i].w, ml[2 * g],
                                  ml[2 * g + 1], acc[i].w);
                } else {
                    w = (((size_t) t * a.n_heads + h0 + g) * S + s) * (hd + 2);
                    a.part[w + d] = acc[i].x;
                    a.part[w + d + 1] = acc[i].y;
                    a.part[w + d + 2] = acc[i].z;
                    a.part[w + d + 3] = acc[i].w;
                    if (d == 0) {
                        a.part[w + hd] = ml[2 * g];
                        a.part[w + hd + 1] = ml[2 * g + 1];
                    }
                }
                acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
            m_run = -INFINITY;
            l_run = 0.0f;
            /* ml is rewritten only after the next page's two barriers */
        }

        if (nk2 == 0) {
            break;
        }
        pg = npg;
        s = ns2;
        nk = nk2;
    }
#undef MSV_ATTN_FETCH

    if (gridDim.z == 1) {
#pragma unroll
        for (i = 0; i < MSV_ATTN_PER_THR / 4; i++) {
            e = 4 * (tid + i * MSV_ATTN_THREADS);
            if (e < ng * hd) {
                g = e / hd;
                d = e % hd;
                w = (size_t) (h0 + g) * hd + d;
                msv_store_act(a.out, a.out_fmt, a.n_tokens, t,
                              (size_t) a.n_heads * hd, w, A[i].x / L[i]);
                msv_store_act(a.out, a.out_fmt, a.n_tokens, t,
                              (size_t) a.n_heads * hd, w + 1, A[i].y / L[i]);
                msv_store_act(a.out, a.out_fmt, a.n_tokens, t,
                              (size_t) a.n_heads * hd, w + 2, A[i].z / L[i]);
                msv_store_act(a.out, a.out_fmt, a.n_tokens, t,
                              (size_t) a.n_heads * hd, w + 3, A[i].w / L[i]);
            }
        }
    }
}


/* One block per (token, head): fold the token's splits in order. */
static __global__ void
attention_merge_kernel(struct msv_attn_args a, uint32_t S)
{
    uint32_t      t, h, hd, ns, s, d;
    const float  *p;
    float         M, L, A;

    t = blockIdx.x;
    h = blockIdx.y;
    hd = a.head_dim;
    ns = MSV_CEIL_DIV((uint32_t) a.kv.pos[t] + 1, (uint32_t) MSV_ATTN_SPLIT);
    p = a.part + ((size_t) t * a.n_heads + h) * S * (hd + 2);

    for (d = threadIdx.x; d < hd; d += blockDim.x) {
        M = -INFINITY;
        L = 0.0f;
        A = 0.0f;
        for (s = 0; s < ns; s++) {
            msv_attn_fold(&M, &L, &A, p[s * (hd + 2) + hd],
                          p[s * (hd + 2) + hd + 1], p[s * (hd + 2) + d]);
        }
        msv_store_act(a.out, a.out_fmt, a.n_tokens, t, (size_t) a.n_heads * hd,
                      (size_t) h * hd + d, A / L);
    }
}


size_t
attention_part_floats(uint32_t n_tokens, uint32_t n_heads, uint32_t head_dim,
    uint32_t max_ctx)
{
    return (size_t) n_tokens * n_heads
           * MSV_CEIL_DIV(max_ctx, (uint32_t) MSV_ATTN_SPLIT)
           * (head_dim + 2);
}


cudaError_t
attention_forward(const struct msv_attn_args *a, cudaStream_t stream)
{
    dim3      grid;
    size_t    smem;
    uint32_t  n_groups, S, blocks, nw;
    int       parallel;

#define MSV_ATTN_VEC(KV, NW)                                                 \
    attention_vec_kernel<KV, NW><<<grid, MSV_ATTN_THREADS, smem, stream>>>(  \
        *a, n_groups, S)

    if (a->n_tokens == 0) {
        return cudaSuccess;
    }

    n_groups = MSV_CEIL_DIV(a->n_heads / a->n_kv_heads,
                            (uint32_t) MSV_ATTN_GROUP);
    S = MSV_CEIL_DIV(a->max_ctx, (uint32_t) MSV_ATTN_SPLIT);
    blocks = a->n_tokens * a->n_kv_heads * n_groups;

    parallel = S > 1 && a->part != NULL
               && attention_part_floats(a->n_tokens, a->n_heads,
                                        a->head_dim, a->max_ctx)
                  <= a->part_floats;
    if (a->mode == MSV_ATTN_PARALLEL && !parallel && S > 1) {
        return cudaErrorInvalidValue;
    }
    if (a->mode == MSV_ATTN_FOLD
        || (a->mode == MSV_ATTN_AUTO && blocks >= MSV_ATTN_WIDE))
    {
        parallel = 0;
    }

    grid = dim3(a->n_tokens, a->n_kv_heads * n_groups, parallel ? S : 1);
    smem = ((size_t) MSV_ATTN_GROUP * a->head_dim
            + MSV_KV_BLOCK * (a->head_dim + 8) + MSV_KV_BLOCK * a->head_dim
            + MSV_ATTN_GROUP * MSV_KV_BLOCK + 3 * MSV_ATTN_GROUP)
           * sizeof(float);

    nw = MSV_CEIL_DIV(a->head_dim * (a->kv.kv_bf16 ? 2u : 4u),
                      (uint32_t) MSV_ATTN_THREADS);
    if (a->head_dim % 8 == 0) {
        smem = ((size_t) MSV_ATTN_GROUP * a->head_dim
                + MSV_KV_BLOCK * (a->head_dim + 32)
                + MSV_KV_BLOCK * a->head_dim
                + MSV_ATTN_GROUP * MSV_KV_BLOCK + 3 * MSV_ATTN_GROUP)
               * sizeof(float);
        if (a->kv.kv_bf16) {
            if (nw <= 1) {
                MSV_ATTN_VEC(__nv_bfloat16, 1);
            } else if (nw <= 2) {
                MSV_ATTN_VEC(__nv_bfloat16, 2);
            } else {
                MSV_ATTN_VEC(__nv_bfloat16, 4);
            }
        } else if (nw <= 1) {
            MSV_ATTN_VEC(float, 1);
        } else if (nw <= 2) {
            MSV_ATTN_VEC(float, 2);
        } else if (nw <= 4) {
            MSV_ATTN_VEC(float, 4);
        } else {
            MSV_ATTN_VEC(float, 8);
        }

    } else if (a->kv.kv_bf16) {
        attention_kernel<__nv_bfloat16><<<grid, MSV_ATTN_THREADS, smem,
                                          stream>>>(*a, n_groups, S);
    } else {
        attention_kernel<float><<<grid, MSV_ATTN_THREADS, smem, stream>>>(
            *a, n_groups, S);
    }

    if (parallel) {
        attention_merge_kernel<<<dim3(a->n_tokens, a->n_heads),
                                 a->head_dim < 128 ? 64 : 128, 0, stream>>>(
            *a, S);
    }
    return cudaGetLastError();
}
