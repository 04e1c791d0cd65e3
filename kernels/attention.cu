/*
 * attention.cu: one block per (token, kv head, group of up to
 * MSV_ATTN_GROUP query heads sharing that kv head), so each K and V row
 * is read once for the whole group; in the parallel form also per split.
 * The per-token kernels take the tokens of a.rest (block x: rest[x]), or
 * every token when rest is NULL; the tiled prefill kernel (at the end)
 * takes the plan's tiles.
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
#include <string.h>

#include "backend.h"
#include "attention.cuh"
#include "mma.cuh"

#define MSV_ATTN_GROUP    4            /* heads per block: one warp each */
#define MSV_ATTN_THREADS  (MSV_ATTN_GROUP * 32)
#define MSV_ATTN_PER_THR  (MSV_ATTN_GROUP * MSV_ATTN_MAX_HEAD_DIM        \
                           / MSV_ATTN_THREADS)
#define MSV_ATTN_WIDE     1024         /* blocks that fill the GPU: no
                                          need to split further */
#define MSV_ATTN_MMA_WIDE 512          /* the same for the tensor-core
                                          form (measured on an H200: batch
                                          64 of 8 kv heads runs faster
                                          serial, batch 1 parallel) */

static_assert(MSV_ATTN_SPLIT % MSV_KV_BLOCK == 0,
              "a split is whole pages");
static_assert(MSV_KV_BLOCK <= 32, "one lane per key of a page");


/* Fold the partial state (m, l, acc) into (M, L, A).  Explicit roundings
 * (no contraction) so every kernel that folds gets the same bits.  The
 * factors depend on the head alone (M, L, m, l are per head): a kernel may
 * take them once a head (msv_attn_fold_scale) and apply them to each
 * element (msv_attn_fold_out) with the same result bit for bit. */
static __device__ __forceinline__ void
msv_attn_fold_scale(float *M, float *L, float m, float l, float *fa,
    float *fb)
{
    float  mn;

    mn = fmaxf(*M, m);
    *fa = expf(*M - mn);               /* *M = -inf at first: fa = 0 */
    *fb = expf(m - mn);
    *L = __fadd_rn(__fmul_rn(*L, *fa), __fmul_rn(l, *fb));
    *M = mn;
}

/* An output element of the fold, with msv_attn_fold_scale's factors. */
static __device__ __forceinline__ float
msv_attn_fold_out(float A, float acc, float fa, float fb)
{
    return __fadd_rn(__fmul_rn(A, fa), __fmul_rn(acc, fb));
}

static __device__ __forceinline__ void
msv_attn_fold(float *M, float *L, float *A, float m, float l, float acc)
{
    float  fa, fb;

    msv_attn_fold_scale(M, L, m, l, &fa, &fb);
    *A = msv_attn_fold_out(*A, acc, fa, fb);
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

    t = a.rest != NULL ? (uint32_t) a.rest[blockIdx.x] : blockIdx.x;
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

    t = a.rest != NULL ? (uint32_t) a.rest[blockIdx.x] : blockIdx.x;
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


/*
 * The tensor-core forms (bf16 KV, head_dim 16, 32, 64 or 128, up to
 * MSV_ATTN_MMA_HEADS query heads per kv head: every model preset) share
 * the helpers below (bf16 packing and splitting) and mma.cuh's.
 */
#define MSV_ATTN_MMA_HEADS  8

static_assert(MSV_KV_BLOCK == 16, "an mma tile of keys is one page");

static __device__ __forceinline__ uint32_t
msv_pack_bf16(float first, float second)
{
    __nv_bfloat162  v = __floats2bfloat162_rn(first, second);

    return *(uint32_t *) &v;
}

/* x as bf16 hi plus bf16 remainder. */
static __device__ __forceinline__ void
msv_split_bf16(float x, float *hi, float *lo)
{
    *hi = __bfloat162float(__float2bfloat16_rn(x));
    *lo = __bfloat162float(__float2bfloat16_rn(x - *hi));
}

/*
 * The tiled prefill form (bf16 KV, head_dim 16, 32, 64 or 128, up to 8
 * query heads per kv head).  One block per (tile, kv head), per split in
 * the parallel form.  A tile is up to attention_tile_tokens(g) = 64 / g
 * consecutive query tokens of one sequence (g query heads per kv head),
 * taken as MSV_ATTN_TILE_ROWS = 64 rows (token i, head h) -> row i g + h,
 * so that the block's 64 rows are full whatever g is (up to 64 mod g
 * idle) and every K/V split it loads serves 64 query rows, as in
 * flash-attention 2 with 64-row tiles; 16 tokens x 4 heads for Qwen3-8B.
 * (16 queries x g heads would leave the rows idle for g = 1, and 64
 * queries x g heads would need g times the registers.)  Four warps, warp
 * w owns rows 16 w .. 16 w + 15, the A rows of its mma tiles.
 *
 * A block walks the splits (MSV_ATTN_SPLIT = 64 keys, four pages) up to
 * the tile's last position.  Per split:
 *   load:    cp.async of the split's K and V rows (bf16, as stored, through
 *            the page table) into one of two shared stages, once for the
 *            whole tile; rows past the tile's last key zero-filled; the
 *            next split is in flight while this one computes;
 *   scores:  S = Q K^T by mma m16n8k16, fp32 accumulate; q is carried as
 *            three bf16 terms hi + lo + lo2 (hi = bf16(q), lo = bf16(q -
 *            hi), lo2 = bf16(q - hi - lo): q to fp32 precision), so three
 *            mma per tile product where the per-token kernel put the
 *            terms into its idle rows; K fragments by ldmatrix;
 *   mask:    key j of the split for a row at position p only if j <= p,
 *            the others -inf; pages past the warp's last position are
 *            neither multiplied nor read;
 *   softmax: the split's row max m over a quad of lanes, p = exp(s - m)
 *            split into bf16 hi + lo, l = the sum of hi + lo;
 *   values:  O_split = P V by mma, hi and lo each (two mma), V fragments
 *            by ldmatrix.trans, into fresh accumulators;
 *   fold:    the split's (m, l, O_split) into the row's state with
 *            msv_attn_fold_scale / msv_attn_fold_out, in split order
 *            (serial form), or written to the workspace for the merge
 *            kernel (parallel form): the forms give the same bits.
 * A row whose position is before the split's first key takes no part in
 * it, as the per-token kernels never see such a split.
 */
#define MSV_ATTN_TILE_WARPS  (MSV_ATTN_TILE_ROWS / 16)

static_assert(MSV_ATTN_TILE_WARPS * 32 == MSV_ATTN_THREADS,
              "16 rows per warp, the block's threads");
static_assert(MSV_ATTN_TILE_ROWS / MSV_ATTN_MMA_HEADS >= 1,
              "a tile holds a token of every head");

/* Bytes of the stages: two, each the K and V rows of a split. */
static size_t
msv_attn_tile_smem(uint32_t hd)
{
    return (size_t) 2 * 2 * MSV_ATTN_SPLIT * (hd + 8)
           * sizeof(__nv_bfloat16);
}

template <int HD>
static __global__ void __launch_bounds__(MSV_ATTN_THREADS, 2)
attention_tile_kernel(struct msv_attn_args a, uint32_t S)
{
    extern __shared__ uint4   smt[];
    const uint32_t            RS = HD + 8;     /* row stride, elements */
    const uint32_t            SB = 2 * MSV_ATTN_SPLIT * RS;   /* a stage */
    __nv_bfloat16            *sm, *kt, *vt;
    const float              *qp[2];
    uint32_t                  qa[3][HD / 16][4], ph[4][4], pl[4][4], fr[4],
                              t0, cnt, kvh, g, h0, tid, lane, warp, r, q,
                              pos0, nkeys, ns, s, sn, cur, key0, npg, kk, ks,
                              n, i, u, d, row, hh[2], ti[2], rp[2], wmax,
                              tix;
    int                       act[2], ok[2], wbusy;
    int32_t                   poff;
    float                     sc[8][4], A[HD / 8][4], o[2][4], x[4], M[2],
                              L[2], mx[2], l[2], fa[2], fb[2], hi, lo, lo2,
                              e0, e1;
    size_t                    wp;

    /* the last tiles first: a run's later tiles walk more splits, so
     * the long blocks start in the first wave and the short ones fill the
     * tail */
    msv_grid_wait();
    msv_grid_release();
    tix = gridDim.x - 1 - blockIdx.x;
    t0 = (uint32_t) a.tiles[2 * tix];
    cnt = (uint32_t) a.tiles[2 * tix + 1];
    kvh = blockIdx.y;
    g = a.n_heads / a.n_kv_heads;
    h0 = kvh * g;
    tid = threadIdx.x;
    lane = tid & 31;
    warp = tid >> 5;
    r = lane >> 2;
    q = lane & 3;

    pos0 = (uint32_t) a.kv.pos[t0];
    nkeys = pos0 + cnt;                /* the keys of the tile's last row */
    ns = MSV_CEIL_DIV(nkeys, (uint32_t) MSV_ATTN_SPLIT);
    if (blockIdx.z >= ns) {
        return;                        /* the whole block: no barrier yet */
    }

    /* the lane's rows: r (u = 0) and r + 8 (u = 1) of the warp's 16; an
     * idle row (past the tile) computes at the tile's first position on
     * zeros and is never stored */
    for (u = 0; u < 2; u++) {
        row = warp * 16 + r + 8 * u;
        ti[u] = row / g;
        hh[u] = row % g;
        ok[u] = ti[u] < cnt;
        rp[u] = ok[u] ? pos0 + ti[u] : pos0;
        qp[u] = a.q + (size_t) (t0 + (ok[u] ? ti[u] : 0)) * a.q_stride
                + (size_t) (h0 + hh[u]) * HD;
    }
    /* the warp's last position (rows are in token order); a warp whose
     * rows are all idle computes nothing */
    wmax = pos0 + min(cnt - 1, (warp * 16 + 15) / g);
    wbusy = warp * 16 / g < cnt;

    /* q fragments, three terms: a[0] row r, a[1] row r + 8, a[2], a[3]
     * the same rows 8 dimensions on */
#pragma unroll
    for (ks = 0; ks < HD / 16; ks++) {
#pragma unroll
        for (i = 0; i < 4; i++) {
            u = i & 1;
            d = ks * 16 + 2 * q + (i >> 1) * 8;
            x[0] = ok[u] ? qp[u][d] : 0.0f;
            x[1] = ok[u] ? qp[u][d + 1] : 0.0f;
            msv_split_bf16(x[0], &hi, &lo);
            lo2 = __bfloat162float(__float2bfloat16_rn(x[0] - hi - lo));
            x[0] = hi;
            x[2] = lo;
            x[3] = lo2;
            msv_split_bf16(x[1], &hi, &lo);
            lo2 = __bfloat162float(__float2bfloat16_rn(x[1] - hi - lo));
            qa[0][ks][i] = msv_pack_bf16(x[0], hi);
            qa[1][ks][i] = msv_pack_bf16(x[2], lo);
            qa[2][ks][i] = msv_pack_bf16(x[3], lo2);
        }
    }

#pragma unroll
    for (n = 0; n < HD / 8; n++) {
        A[n][0] = A[n][1] = A[n][2] = A[n][3] = 0.0f;
    }
    M[0] = M[1] = -INFINITY;           /* the rows' states */
    L[0] = L[1] = 0.0f;

    sm = (__nv_bfloat16 *) smt;
    poff = a.kv.page_off[a.kv.tok_seq[t0]];

#define MSV_ATTN_TILE_FETCH(SPLIT, STAGE)                                    \
    do {                                                                     \
        __nv_bfloat16  *kt_ = sm + (size_t) (STAGE) * SB;                    \
        __nv_bfloat16  *vt_ = kt_ + MSV_ATTN_SPLIT * RS;                     \
        uint32_t        c_, row_, col_, key_;                                \
        for (c_ = tid; c_ < MSV_ATTN_SPLIT * HD / 8;                         \
             c_ += MSV_ATTN_THREADS)                                         \
        {                                                                    \
            row_ = c_ / (HD / 8);                                            \
            col_ = (c_ % (HD / 8)) * 8;                                      \
            key_ = (SPLIT) * MSV_ATTN_SPLIT + row_;                          \
            const __nv_bfloat16  *kg_ =                                      \
                (const __nv_bfloat16 *) a.kv.k_cache;                        \
            const __nv_bfloat16  *vg_ =                                      \
                (const __nv_bfloat16 *) a.kv.v_cache;                        \
            if (key_ < nkeys) {                                              \
                size_t  b_ = (((size_t) a.kv.pages[poff                      \
                                   + key_ / MSV_KV_BLOCK] * a.n_kv_heads     \
                               + kvh) * MSV_KV_BLOCK                         \
                              + key_ % MSV_KV_BLOCK) * HD + col_;            \
                kg_ += b_;                                                   \
                vg_ += b_;                                                   \
            }                                                                \
            msv_cp_async16(kt_ + row_ * RS + col_, kg_,                      \
                           key_ < nkeys ? 16u : 0u);                         \
            msv_cp_async16(vt_ + row_ * RS + col_, vg_,                      \
                           key_ < nkeys ? 16u : 0u);                         \
        }                                                                    \
        msv_cp_async_commit();                                               \
    } while (0)

    s = blockIdx.z;
    cur = 0;
    MSV_ATTN_TILE_FETCH(s, 0);

    for ( ;; ) {
        msv_cp_async_wait_all();
        __syncthreads();               /* the stage is there for every
                                          warp, and every warp is done
                                          with the one the next fetch
                                          fills */
        sn = s + gridDim.z;
        if (sn < ns) {
            MSV_ATTN_TILE_FETCH(sn, cur ^ 1);
        }

        key0 = s * MSV_ATTN_SPLIT;
        kt = sm + (size_t) cur * SB;
        vt = kt + MSV_ATTN_SPLIT * RS;
        /* pages of the split the warp's rows reach (warp-uniform) */
        npg = wbusy && key0 <= wmax ? min((uint32_t) (MSV_ATTN_SPLIT / MSV_KV_BLOCK),
                                 (wmax - key0) / MSV_KV_BLOCK + 1)
                           : 0;
        act[0] = ok[0] && key0 <= rp[0];
        act[1] = ok[1] && key0 <= rp[1];

        if (npg > 0) {
            /* scores: keys 16 kk + 8 (n & 1) + 2 q + {0, 1} of tile n */
#pragma unroll
            for (n = 0; n < 8; n++) {
                sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
            }
#pragma unroll
            for (kk = 0; kk < 4; kk++) {
                if (kk >= npg) {
                    break;
                }
#pragma unroll
                for (ks = 0; ks < HD / 16; ks++) {
                    msv_ldmatrix_x4(fr, kt + (kk * 16 + (lane >> 4) * 8
                                              + (lane & 7)) * RS
                                           + ks * 16 + ((lane >> 3) & 1) * 8);
                    /* the small terms first */
                    msv_mma_bf16(sc[2 * kk], qa[2][ks], fr[0], fr[1]);
                    msv_mma_bf16(sc[2 * kk + 1], qa[2][ks], fr[2], fr[3]);
                    msv_mma_bf16(sc[2 * kk], qa[1][ks], fr[0], fr[1]);
                    msv_mma_bf16(sc[2 * kk + 1], qa[1][ks], fr[2], fr[3]);
                    msv_mma_bf16(sc[2 * kk], qa[0][ks], fr[0], fr[1]);
                    msv_mma_bf16(sc[2 * kk + 1], qa[0][ks], fr[2], fr[3]);
                }
            }

            /* mask and the split's row max; c[0], c[1] row r, c[2], c[3]
             * row r + 8 */
            mx[0] = mx[1] = -INFINITY;
#pragma unroll
            for (n = 0; n < 8; n++) {
#pragma unroll
                for (i = 0; i < 4; i++) {
                    u = i >> 1;
                    d = key0 + n * 8 + 2 * q + (i & 1);   /* the key */
                    sc[n][i] = n / 2 < npg && d <= rp[u]
                               ? sc[n][i] * a.scale : -INFINITY;
                    mx[u] = fmaxf(mx[u], sc[n][i]);
                }
            }
#pragma unroll
            for (u = 0; u < 2; u++) {
                mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xffffffffu, mx[u], 1));
                mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xffffffffu, mx[u], 2));
                l[u] = 0.0f;
            }

            /* probabilities as bf16 hi + lo, in the A layout of P V:
             * tile 2 kk gives a[0] (row r) and a[1] (row r + 8), tile
             * 2 kk + 1 a[2] and a[3] */
#pragma unroll
            for (kk = 0; kk < 4; kk++) {
#pragma unroll
                for (i = 0; i < 4; i++) {
                    n = 2 * kk + (i >> 1);
                    u = i & 1;
                    /* a row without keys here (act 0) has mx -inf */
                    e0 = act[u] ? expf(sc[n][2 * u] - mx[u]) : 0.0f;
                    e1 = act[u] ? expf(sc[n][2 * u + 1] - mx[u]) : 0.0f;
                    msv_split_bf16(e0, &hi, &lo);
                    msv_split_bf16(e1, &e0, &e1);
                    l[u] += (hi + lo) + (e0 + e1);
                    ph[kk][i] = msv_pack_bf16(hi, e0);
                    pl[kk][i] = msv_pack_bf16(lo, e1);
                }
            }
#pragma unroll
            for (u = 0; u < 2; u++) {
                l[u] += __shfl_xor_sync(0xffffffffu, l[u], 1);
                l[u] += __shfl_xor_sync(0xffffffffu, l[u], 2);
                fa[u] = 1.0f;
                fb[u] = 0.0f;
                if (act[u] && gridDim.z == 1) {
                    msv_attn_fold_scale(&M[u], &L[u], mx[u], l[u], &fa[u],
                                        &fb[u]);
                }
            }

            /* values: dimensions 16 n + 8 {0, 1} + 2 q + {0, 1} */
#pragma unroll
            for (n = 0; n < HD / 16; n++) {
                o[0][0] = o[0][1] = o[0][2] = o[0][3] = 0.0f;
                o[1][0] = o[1][1] = o[1][2] = o[1][3] = 0.0f;
#pragma unroll
                for (kk = 0; kk < 4; kk++) {
                    if (kk >= npg) {
                        break;
                    }
                    msv_ldmatrix_x4_trans(fr, vt + (kk * 16
                                                    + ((lane >> 3) & 1) * 8
                                                    + (lane & 7)) * RS
                                                 + n * 16 + (lane >> 4) * 8);
                    msv_mma_bf16(o[0], pl[kk], fr[0], fr[1]);
                    msv_mma_bf16(o[1], pl[kk], fr[2], fr[3]);
                    msv_mma_bf16(o[0], ph[kk], fr[0], fr[1]);
                    msv_mma_bf16(o[1], ph[kk], fr[2], fr[3]);
                }
#pragma unroll
                for (i = 0; i < 4; i++) {
                    u = i >> 1;
                    if (!act[u]) {
                        continue;
                    }
                    if (gridDim.z == 1) {
                        A[2 * n][i] = msv_attn_fold_out(A[2 * n][i],
                                                        o[0][i], fa[u],
                                                        fb[u]);
                        A[2 * n + 1][i] = msv_attn_fold_out(A[2 * n + 1][i],
                                                            o[1][i], fa[u],
                                                            fb[u]);
                    } else {
                        wp = (((size_t) (t0 + ti[u]) * a.n_heads + h0
                               + hh[u]) * S + s) * (HD + 2);
                        d = n * 16 + 2 * q + (i & 1);
                        a.part[wp + d] = o[0][i];
                        a.part[wp + d + 8] = o[1][i];
                        if (n == 0 && i % 2 == 0 && q == 0) {
                            a.part[wp + HD] = mx[u];
                            a.part[wp + HD + 1] = l[u];
                        }
                    }
                }
            }
        }

        if (sn >= ns) {
            break;
        }
        s = sn;
        cur ^= 1;
    }
#undef MSV_ATTN_TILE_FETCH

    if (gridDim.z == 1) {
#pragma unroll
        for (n = 0; n < HD / 8; n++) {
#pragma unroll
            for (i = 0; i < 4; i++) {
                u = i >> 1;
                if (ok[u]) {
                    msv_store_act(a.out, a.out_fmt, a.n_tokens, t0 + ti[u],
                                  (size_t) a.n_heads * HD,
                                  (size_t) (h0 + hh[u]) * HD + n * 8 + 2 * q
                                  + (i & 1), A[n][i] / L[u]);
                }
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

    msv_grid_wait();
    msv_grid_release();
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


/* Whether mode takes the serial form whatever the context: FOLD, or AUTO
 * where a split's blocks already fill the GPU (blocks >= wide). */
static int
msv_attn_serial(int mode, uint32_t blocks, uint32_t wide)
{
    return mode == MSV_ATTN_FOLD || (mode == MSV_ATTN_AUTO && blocks >= wide);
}


/*
 * The form of a batch whose splits would take `blocks` blocks each: 1 for
 * parallel (a block per split, then the merge), 0 for serial (AUTO: when
 * blocks >= wide), -1 when MSV_ATTN_PARALLEL is asked for and the
 * workspace cannot hold it.
 */
static int
msv_attn_parallel(const struct msv_attn_args *a, uint32_t S, uint32_t blocks,
    uint32_t wide)
{
    int  parallel;

    parallel = S > 1 && a->part != NULL
               && attention_part_floats(a->n_tokens, a->n_heads,
                                        a->head_dim, a->max_ctx)
                  <= a->part_floats;
    if (a->mode == MSV_ATTN_PARALLEL && !parallel && S > 1) {
        return -1;
    }
    if (msv_attn_serial(a->mode, blocks, wide)) {
        parallel = 0;
    }
    return parallel;
}


/* The parallel form's second kernel: each token's splits folded. */
static cudaError_t
msv_attn_merge(const struct msv_attn_args *a, uint32_t S, cudaStream_t stream)
{
    return msv_launch(attention_merge_kernel, dim3(a->n_tokens, a->n_heads),
                      dim3(a->head_dim < 128 ? 64 : 128), 0, stream, *a, S);
}


/* Whether the tensor-core kernels take the batch: bf16 KV, up to
 * MSV_ATTN_MMA_HEADS query heads per kv head, head_dim 16, 32, 64 or 128
 * (every model preset). */
static int
msv_attn_mma_fits(const struct msv_attn_args *a)
{
    return a->kv.kv_bf16 && a->n_heads / a->n_kv_heads <= MSV_ATTN_MMA_HEADS
           && (a->head_dim == 16 || a->head_dim == 32 || a->head_dim == 64
               || a->head_dim == 128);
}


/* Blocks a token (and split) of the per-token kernels takes per kv head:
 * 1 on the tensor cores, else one per MSV_ATTN_GROUP query heads. */
static uint32_t
msv_attn_groups(const struct msv_attn_args *a)
{
    return msv_attn_mma_fits(a)
           ? 1 : MSV_CEIL_DIV(a->n_heads / a->n_kv_heads,
                              (uint32_t) MSV_ATTN_GROUP);
}


/* The blocks that fill the GPU, past which AUTO takes the serial form. */
static uint32_t
msv_attn_wide(const struct msv_attn_args *a)
{
    return msv_attn_mma_fits(a) ? MSV_ATTN_MMA_WIDE : MSV_ATTN_WIDE;
}


/*
 * The decode form on the tensor cores: one warp a block per (kv head,
 * every gridDim.x-th token from blockIdx.x), as many blocks as the GPU
 * holds at once (serial form), or per (token, kv head, split) (parallel
 * form).  The warp walks its tokens' pages one after another, a token's
 * result the same whichever block walks it, the next NST - 1 pages in
 * flight while this one computes (cp.async of their K and V rows, bf16 as
 * stored, into NST stages of shared memory, rows past the sequence
 * zero-filled), and keeps the split's softmax state in registers:
 *   scores:  mma m16n8k16 with the group's q in the rows: row g holds
 *            bf16(q) of head g, row g + 8 the remainder bf16(q - hi), so
 *            the sum of the two rows carries q to about 2^-16 relative
 *            (the rows would be idle otherwise); with at most 4 heads,
 *            row g + 4 holds the remainder of that, and q is carried to
 *            fp32 precision; K fragments by ldmatrix;
 *   softmax: the row max over the quad of lanes that holds a row, the
 *            running output rescaled by exp(m_old - m_new);
 *   values:  mma again with the probabilities split the same way (hi in
 *            row g, remainder in row g + 8), V fragments by
 *            ldmatrix.trans, accumulating into the running output.
 * At a split's end its state (max, sum, output) is folded into the
 * token's (serial form) or written to the workspace for the merge kernel
 * (parallel form) with the merge kernel's arithmetic, so the two forms
 * give the same bits.  No block barrier: the warps of an SM run
 * independently (a block of four warps, one per page of a split, folding
 * the pages through shared memory with three barriers a split, ran
 * attention 1.3x slower at batch 256: bench/results/engine.md).  NST (2,
 * 3 or 4) is chosen by the grid (msv_attn_walk_stages); it changes when
 * the loads are issued, not the arithmetic.
 */

/* Warps (blocks) an SM for NST stages of K/V: as many as shared memory
 * holds at head_dim 128 (NST x 8 KB a warp), registers allowing. */
#define MSV_ATTN_WALK_MINB(NST)  ((NST) == 2 ? 12 : (NST) == 3 ? 8 : 6)

/* A stage's rows: unpadded and swizzled from head_dim 64 up (16-byte
 * word w of row j stored at word w ^ (j & 7)), padded by 8 elements below
 * (rows of 32 or 64 bytes, too short to swizzle over 8 words).  Padded
 * rows of 272 bytes made each 512-byte cp.async pass of the warp ask L2
 * for 24 sectors, not 16 (Nsight Compute, bench/results/engine.md). */
#define MSV_ATTN_WALK_SWIZZLE(HD)  ((HD) >= 64)
#define MSV_ATTN_WALK_RS(HD)       (MSV_ATTN_WALK_SWIZZLE(HD) ? (HD) : (HD) + 8)

static size_t
msv_attn_walk_smem(uint32_t hd, uint32_t nst)
{
    return (size_t) nst * 2 * MSV_KV_BLOCK * MSV_ATTN_WALK_RS(hd)
           * sizeof(__nv_bfloat16);
}

template <int HD, int NST>
static __global__ void __launch_bounds__(32, MSV_ATTN_WALK_MINB(NST))
attention_walk_kernel(struct msv_attn_args a, uint32_t S)
{
    extern __shared__ uint4   smw[];
    const bool                SW = MSV_ATTN_WALK_SWIZZLE(HD);
    const uint32_t            RS = MSV_ATTN_WALK_RS(HD);  /* row stride */
    const uint32_t            SB = 2 * MSV_KV_BLOCK * RS;  /* a stage */
    const uint32_t            PPS = MSV_ATTN_SPLIT / MSV_KV_BLOCK;
    __nv_bfloat16            *sm, *kt, *vt;
    const float              *qp;
    uint32_t                  qa[HD / 16][4], pa[4], fr[4], t, kvh, ng, h0,
                              lane, r, q, nkeys, ns, s, pg, pe, key0, nk, d,
                              c, row, i, ks, nt, hr, cx, gk, gf, cn_t, cn_n,
                              fpg, fpend, fnk, fpbase, fnx, fnt, fnn, fnpend;
    int                       three, fpf;
    int32_t                   fpoff, fpid, fnts, fnpoff, fnpid;
    float                     sc[2][4], o[HD / 8][4], A[HD / 4], x[4], hi,
                              lo, v[4], mx, mn, f, l, mr, lr, mt, lt, fa, fb;
    size_t                    wp;

    /* the block's tasks: in the serial form tokens blockIdx.x, + gridDim.x,
     * ... of the walk_n (one a block in the parallel form) */
    cx = blockIdx.x;
    t = a.rest != NULL ? (uint32_t) a.rest[cx] : cx;
    kvh = blockIdx.y;
    ng = a.n_heads / a.n_kv_heads;
    h0 = kvh * ng;
    lane = threadIdx.x;
    r = lane >> 2;
    q = lane & 3;

    /* the token's position and sequence in one round trip (the page
     * offset, the page table and the first fetch each wait for the one
     * before: a quarter of the kernel's stall samples were here); these
     * and the page table are the batch's, copied before the step's first
     * kernel and written by none, so they are read before the grid wait:
     * launched programmatically, the block reads them while the kernel
     * ahead (q/k norm + RoPE, which writes q and the new K/V) drains */
    nkeys = (uint32_t) a.kv.pos[t] + 1;
    fnts = a.kv.tok_seq[t];
    ns = MSV_CEIL_DIV(nkeys, (uint32_t) MSV_ATTN_SPLIT);
    if (blockIdx.z >= ns) {
        return;
    }

    sm = (__nv_bfloat16 *) smw;

    /* a page's K (and V) rows are 16-byte words, HD / 8 a row: lane l
     * copies word l % (HD / 8) of rows l / (HD / 8) + FROWS c, c <
     * FPASS, so every address is the lane's first plus a constant (a
     * loop from the lane's word index, trip count unknown to the
     * compiler, spent about 12 instructions a copy); swizzled, row
     * frow + FROWS c has (row & 7) = frow ^ ((FROWS c) & 7), FROWS being
     * a power of two above frow, so the word is fsw ^ a constant */
    const uint32_t  FROWS = 32 / (HD / 8);
    const uint32_t  FPASS = MSV_KV_BLOCK / FROWS;
    static_assert(HD % 8 == 0 && 32 % (HD / 8) == 0
                  && MSV_KV_BLOCK % (32 / (HD / 8)) == 0,
                  "a page's words in whole passes of the warp");
    const uint32_t  frow = lane / (HD / 8);
    const uint32_t  fcol = (lane % (HD / 8)) * 8;
    const uint32_t  fsw = (lane % (HD / 8)) ^ (frow & 7);

    /*
     * The fetch cursor runs NST - 1 pages ahead of the arithmetic, over
     * the block's pages in the order they are used: the split's in the
     * parallel form; in the serial form every page of the token, then
     * every page of the block's next token, so a block's later tokens
     * start with their first pages already in flight.  Page fpg (of
     * fpend) of the task whose position count is fnk, page table at
     * fpoff, its ids fpbase + l in lane l.  The next task's position,
     * page-table offset and first 32 page ids are read one level an
     * iteration while the pages before it are used (fpf: the levels
     * done, 3 all; -1 no next task), so that none waits when the cursor
     * reaches it.  Page k of the sequence goes to stage k % NST (gf
     * pages fetched so far, gk used), one commit group a page (an empty
     * one past the last).
     */
#define MSV_ATTN_WALK_NEXT_LEVEL()                                           \
    do {                                                                     \
        if (fpf == 0) {                                                      \
            fnt = a.rest != NULL ? (uint32_t) a.rest[fnx] : fnx;             \
            fnn = (uint32_t) a.kv.pos[fnt] + 1;                              \
            fnts = a.kv.tok_seq[fnt];                                        \
            fpf = 1;                                                         \
        } else if (fpf == 1) {                                               \
            fnpoff = a.kv.page_off[fnts];                                    \
            fnpend = MSV_CEIL_DIV(fnn, (uint32_t) MSV_KV_BLOCK);             \
            fpf = 2;                                                         \
        } else if (fpf == 2) {                                               \
            fnpid = lane < fnpend ? a.kv.pages[fnpoff + lane] : 0;           \
            fpf = 3;                                                         \
        }                                                                    \
    } while (0)

#define MSV_ATTN_WALK_FETCH()                                                \
    do {                                                                     \
        if (fpg < fpend) {                                                   \
            uint32_t  nk_ = min((uint32_t) MSV_KV_BLOCK,                     \
                                fnk - fpg * MSV_KV_BLOCK);                   \
            int32_t   pg_;                                                   \
            if (fpg >= fpbase + 32) {                                        \
                fpbase += 32;                                                \
                fpid = fpbase + lane < fpend                                 \
                       ? a.kv.pages[fpoff + fpbase + lane] : 0;              \
            }                                                                \
            pg_ = __shfl_sync(0xffffffffu, fpid, fpg - fpbase);              \
            size_t    b_ = ((size_t) pg_ * a.n_kv_heads + kvh)               \
                           * MSV_KV_BLOCK * HD;                              \
            __nv_bfloat16  *kt_ = sm + (size_t) (gf % NST) * SB;             \
            __nv_bfloat16  *vt_ = kt_ + MSV_KV_BLOCK * RS;                   \
            const __nv_bfloat16  *kg_ =                                      \
                (const __nv_bfloat16 *) a.kv.k_cache + b_;                   \
            const __nv_bfloat16  *vg_ =                                      \
                (const __nv_bfloat16 *) a.kv.v_cache + b_;                   \
            kt_ += frow * RS;                                                \
            vt_ += frow * RS;                                                \
            kg_ += frow * HD + fcol;                                         \
            vg_ += frow * HD + fcol;                                         \
            _Pragma("unroll")                                                \
            for (c = 0; c < FPASS; c++) {                                    \
                uint32_t  so_ = c * FROWS * RS                               \
                                + (SW ? (fsw ^ ((c * FROWS) & 7)) * 8        \
                                      : fcol);                               \
                row = frow + c * FROWS;                                      \
                msv_cp_async16(kt_ + so_, kg_ + c * FROWS * HD,              \
                               row < nk_ ? 16u : 0u);                        \
                msv_cp_async16(vt_ + so_, vg_ + c * FROWS * HD,              \
                               row < nk_ ? 16u : 0u);                        \
            }                                                                \
            if (++fpg == fpend && fpf >= 0) {                                \
                while (fpf < 3) {                                            \
                    MSV_ATTN_WALK_NEXT_LEVEL();                              \
                }                                                            \
                fnk = fnn;                                                   \
                fpend = fnpend;                                              \
                fpoff = fnpoff;                                              \
                fpid = fnpid;                                                \
                fpbase = 0;                                                  \
                fpg = 0;                                                     \
                fnx += gridDim.x;                                            \
                fpf = fnx < a.walk_n ? 0 : -1;                               \
            }                                                                \
        }                                                                    \
        msv_cp_async_commit();                                               \
        gf++;                                                                \
    } while (0)

    /* the first task's pages: all the token's in the serial form, its
     * split's in the parallel form */
    s = blockIdx.z;
    pg = s * PPS;
    fnk = nkeys;
    fpg = pg;
    fpend = MSV_CEIL_DIV(nkeys, (uint32_t) MSV_KV_BLOCK);
    if (gridDim.z > 1) {
        fpend = min(fpend, pg + PPS);
    }
    fpoff = a.kv.page_off[fnts];
    fpbase = pg;
    fpid = pg + lane < fpend ? a.kv.pages[fpoff + pg + lane] : 0;
    fnx = cx + gridDim.x;
    fpf = gridDim.z == 1 && fnx < a.walk_n ? 0 : -1;
    fnt = fnn = fnpend = 0;
    fnpoff = fnpid = 0;
    /* the compute's next token, read while this one is walked */
    cn_t = cn_n = 0;
    if (gridDim.z == 1 && cx + gridDim.x < a.walk_n) {
        cn_t = a.rest != NULL ? (uint32_t) a.rest[cx + gridDim.x]
                              : cx + gridDim.x;
        cn_n = (uint32_t) a.kv.pos[cn_t] + 1;
    }
    msv_grid_wait();
    msv_grid_release();

    gf = 0;
    gk = 0;
#pragma unroll
    for (i = 0; i < NST - 1; i++) {
        MSV_ATTN_WALK_FETCH();
    }

    three = ng <= 4;
    hr = three ? (r & 3) : r;
    /* the ldmatrix rows: K's (lane >> 4) 8 + (lane & 7), word 2 ks +
     * ((lane >> 3) & 1); V's ((lane >> 3) & 1) 8 + (lane & 7), word 2 nt +
     * (lane >> 4); swizzled, the lane's part of the word is XORed with
     * its row's (lane & 7), 2 ks and 2 nt having a zero low bit */
    const uint32_t  kw = SW ? ((lane >> 3) & 1) ^ (lane & 7) : (lane >> 3) & 1;
    const uint32_t  vw = SW ? (lane >> 4) ^ (lane & 7) : lane >> 4;

    for ( ;; ) {
        /* token t: q in the rows of the mma (its heads' hi, remainders) */
        qp = a.q + (size_t) t * a.q_stride + (size_t) (h0 + hr) * HD;
#pragma unroll
        for (ks = 0; ks < HD / 16; ks++) {
            d = ks * 16 + 2 * q;
            if (hr < ng) {
                x[0] = qp[d];
                x[1] = qp[d + 1];
                x[2] = qp[d + 8];
                x[3] = qp[d + 9];
            } else {
                x[0] = x[1] = x[2] = x[3] = 0.0f;
            }
#pragma unroll
            for (i = 0; i < 4; i++) {
                msv_split_bf16(x[i], &hi, &lo);
                if (r >= 4 && three) {
                    x[i] = __bfloat162float(__float2bfloat16_rn(x[i] - hi
                                                                - lo));
                    v[i] = 0.0f;
                } else {
                    x[i] = hi;
                    v[i] = lo;
                }
            }
            qa[ks][0] = msv_pack_bf16(x[0], x[1]);
            qa[ks][1] = msv_pack_bf16(v[0], v[1]);
            qa[ks][2] = msv_pack_bf16(x[2], x[3]);
            qa[ks][3] = msv_pack_bf16(v[2], v[3]);
        }

#pragma unroll
        for (i = 0; i < HD / 4; i++) {
            A[i] = 0.0f;
        }
        mt = -INFINITY;                /* the token's state, row r */
        lt = 0.0f;

        for ( ;; ) {
            /* split s: pages pg .. pe - 1 */
            pe = min((s + 1) * PPS,
                     MSV_CEIL_DIV(nkeys, (uint32_t) MSV_KV_BLOCK));
            mr = -INFINITY;
            lr = 0.0f;
#pragma unroll
            for (nt = 0; nt < HD / 8; nt++) {
                o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
            }

            for ( ; pg < pe; pg++) {
                /* page gk + NST - 1 of the block's into the stage page
                 * gk - 1 used (read by every lane: the __syncwarp at the
                 * loop's end) */
                MSV_ATTN_WALK_FETCH();
                msv_cp_async_wait_newest<NST - 1>();
                __syncwarp();

                key0 = pg * MSV_KV_BLOCK;
                nk = min((uint32_t) MSV_KV_BLOCK, nkeys - key0);
                kt = sm + (size_t) (gk % NST) * SB;
                vt = kt + MSV_KV_BLOCK * RS;

                /* scores: keys 8 n + 2 q + {0, 1} of row r, tiles n = 0, 1 */
#pragma unroll
                for (i = 0; i < 4; i++) {
                    sc[0][i] = 0.0f;
                    sc[1][i] = 0.0f;
                }
#pragma unroll
                for (ks = 0; ks < HD / 16; ks++) {
                    msv_ldmatrix_x4(fr, kt + ((lane >> 4) * 8 + (lane & 7))
                                             * RS
                                           + (SW ? ((2 * ks) ^ kw)
                                                 : 2 * ks + kw) * 8);
                    msv_mma_bf16(sc[0], qa[ks], fr[0], fr[1]);
                    msv_mma_bf16(sc[1], qa[ks], fr[2], fr[3]);
                }
                x[0] = sc[0][0] + sc[0][2];
                x[1] = sc[0][1] + sc[0][3];
                x[2] = sc[1][0] + sc[1][2];
                x[3] = sc[1][1] + sc[1][3];
                if (three) {           /* row r + 4, in lane + 16 */
                    x[0] += __shfl_xor_sync(0xffffffffu, sc[0][0], 16);
                    x[1] += __shfl_xor_sync(0xffffffffu, sc[0][1], 16);
                    x[2] += __shfl_xor_sync(0xffffffffu, sc[1][0], 16);
                    x[3] += __shfl_xor_sync(0xffffffffu, sc[1][1], 16);
                }
#pragma unroll
                for (i = 0; i < 4; i++) {
                    x[i] *= a.scale;
                }
                if (2 * q >= nk) {
                    x[0] = -INFINITY;
                }
                if (2 * q + 1 >= nk) {
                    x[1] = -INFINITY;
                }
                if (2 * q + 8 >= nk) {
                    x[2] = -INFINITY;
                }
                if (2 * q + 9 >= nk) {
                    x[3] = -INFINITY;
                }
                mx = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));

                /* the running state to the new max (key 0 of a page is
                 * always a key: mx is finite) */
                mn = fmaxf(mr, mx);
                f = expf(mr - mn);     /* mr = -inf at first: f = 0 */
                /* where no row's max moved, f is 1 in every lane and
                 * the products would change no bit: skipped */
                if (__any_sync(0xffffffffu, mn != mr)) {
#pragma unroll
                    for (nt = 0; nt < HD / 8; nt++) {
                        o[nt][0] *= f;
                        o[nt][1] *= f;
                        o[nt][2] *= f;
                        o[nt][3] *= f;
                    }
                }
#pragma unroll
                for (i = 0; i < 4; i++) {
                    msv_split_bf16(expf(x[i] - mn), &x[i], &v[i]);
                }
                l = (x[0] + v[0] + (x[1] + v[1]))
                    + (x[2] + v[2] + (x[3] + v[3]));
                l += __shfl_xor_sync(0xffffffffu, l, 1);
                l += __shfl_xor_sync(0xffffffffu, l, 2);
                lr = __fadd_rn(__fmul_rn(lr, f), l);
                mr = mn;
                pa[0] = msv_pack_bf16(x[0], x[1]);
                pa[1] = msv_pack_bf16(v[0], v[1]);
                pa[2] = msv_pack_bf16(x[2], x[3]);
                pa[3] = msv_pack_bf16(v[2], v[3]);

                /* values: dimensions 8 n + 2 q + {0, 1} of row r */
#pragma unroll
                for (nt = 0; nt < HD / 16; nt++) {
                    msv_ldmatrix_x4_trans(fr, vt + (((lane >> 3) & 1) * 8
                                                    + (lane & 7)) * RS
                                                 + (SW ? ((2 * nt) ^ vw)
                                                       : 2 * nt + vw) * 8);
                    msv_mma_bf16(o[2 * nt], pa, fr[0], fr[1]);
                    msv_mma_bf16(o[2 * nt + 1], pa, fr[2], fr[3]);
                }
                __syncwarp();          /* the stage is read: the next
                                          fetch may fill it */
                gk++;
                MSV_ATTN_WALK_NEXT_LEVEL();
            }

            /* the split's state: row r's output is rows r and r + 8 */
            if (gridDim.z == 1) {
                msv_attn_fold_scale(&mt, &lt, mr, lr, &fa, &fb);
#pragma unroll
                for (nt = 0; nt < HD / 8; nt++) {
                    A[2 * nt] = msv_attn_fold_out(A[2 * nt],
                                                  o[nt][0] + o[nt][2], fa,
                                                  fb);
                    A[2 * nt + 1] = msv_attn_fold_out(A[2 * nt + 1],
                                                      o[nt][1] + o[nt][3],
                                                      fa, fb);
                }
            } else if (r < ng) {
                wp = (((size_t) t * a.n_heads + h0 + r) * S + s) * (HD + 2);
#pragma unroll
                for (nt = 0; nt < HD / 8; nt++) {
                    *(float2 *) &a.part[wp + nt * 8 + 2 * q] =
                        make_float2(o[nt][0] + o[nt][2],
                                    o[nt][1] + o[nt][3]);
                }
                if (q == 0) {
                    a.part[wp + HD] = mr;
                    a.part[wp + HD + 1] = lr;
                }
            }

            s += gridDim.z;
            if (s >= ns) {
                break;
            }
            /* pg is the next split's first page when gridDim.z is 1; in
             * the parallel form the block has no other split */
            pg = s * PPS;
        }

        if (gridDim.z > 1) {
            break;
        }
        if (r < ng) {
#pragma unroll
            for (nt = 0; nt < HD / 8; nt++) {
                d = (h0 + r) * HD + nt * 8 + 2 * q;
                msv_store_act(a.out, a.out_fmt, a.n_tokens, t,
                              (size_t) a.n_heads * HD, d, A[2 * nt] / lt);
                msv_store_act(a.out, a.out_fmt, a.n_tokens, t,
                              (size_t) a.n_heads * HD, d + 1,
                              A[2 * nt + 1] / lt);
            }
        }

        /* the block's next token (its first pages are in flight) */
        cx += gridDim.x;
        if (cx >= a.walk_n) {
            break;
        }
        t = cn_t;
        nkeys = cn_n;
        ns = MSV_CEIL_DIV(nkeys, (uint32_t) MSV_ATTN_SPLIT);
        s = 0;
        pg = 0;
        if (cx + gridDim.x < a.walk_n) {
            cn_t = a.rest != NULL ? (uint32_t) a.rest[cx + gridDim.x]
                                  : cx + gridDim.x;
            cn_n = (uint32_t) a.kv.pos[cn_t] + 1;
        }
    }
    msv_cp_async_wait_all();
#undef MSV_ATTN_WALK_FETCH
#undef MSV_ATTN_WALK_NEXT_LEVEL
}


/* A tensor-core kernel of one head_dim (msv_attn_hd_index). */
typedef void (*msv_attn_kernel_t)(struct msv_attn_args a, uint32_t S);

/* 0, 1, 2, 3 for head_dim 16, 32, 64, 128 (msv_attn_mma_fits). */
static int
msv_attn_hd_index(uint32_t head_dim)
{
    return head_dim == 16 ? 0 : head_dim == 32 ? 1 : head_dim == 64 ? 2 : 3;
}

/* kern<<<grid, threads, smem>>>(*a, S) by msv_launch (the kernel calls
 * msv_grid_wait first), its dynamic shared memory limit raised to smem at
 * the first launch (*ready). */
static cudaError_t
msv_attn_launch(msv_attn_kernel_t kern, int *ready, dim3 grid,
    unsigned threads, size_t smem, const struct msv_attn_args *a,
    uint32_t S, cudaStream_t stream)
{
    cudaError_t  e;

    if (!*ready) {
        e = cudaFuncSetAttribute((const void *) kern,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int) smem);
        if (e != cudaSuccess) {
            return e;
        }
        *ready = 1;
    }
    return msv_launch(kern, grid, dim3(threads), smem, stream, *a, S);
}


/*
 * The number of K/V stages of the walking warp for a grid of `blocks`
 * warps.  Two stages let 12 warps an SM run, three 8, four 6.  A grid
 * that two stages hold in one wave runs with two (measured at batch 64
 * of 8 kv heads, 512 warps: two stages 1.28 ms of attention a step, four
 * 1.34).  A larger one takes the count whose waves (rounds of blocks the
 * GPU holds at once) are fullest, because a last wave that fills the
 * GPU only in part runs with few bytes in flight: at batch 256 (2,048
 * warps) two stages run 1,584 then 464, three 1,056 then 992 (4.27 ms a
 * step against 4.83, bench/results/engine.md).  a->stages 2, 3 or 4
 * asks for one.
 */
static cudaError_t
msv_attn_walk_stages(const struct msv_attn_args *a, uint32_t blocks,
    const msv_attn_kernel_t *kern, int *stages, uint32_t *held)
{
    static int   slots_hd[4][3];    /* blocks the GPU holds, 2..4 stages */
    int         *slots = slots_hd[msv_attn_hd_index(a->head_dim)];
    uint32_t     w;
    int          n, dev, sms, per, best;
    double       f, fill;
    cudaError_t  e;

    if (slots[0] == 0) {
        per = 0;
        e = cudaGetDevice(&dev);
        if (e == cudaSuccess) {
            e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
                                       dev);
        }
        for (n = 0; n < 3 && e == cudaSuccess; n++) {
            e = cudaFuncSetAttribute((const void *) kern[n],
                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                    (int) msv_attn_walk_smem(a->head_dim, n + 2));
            if (e == cudaSuccess) {
                e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per,
                        kern[n], 32, msv_attn_walk_smem(a->head_dim, n + 2));
            }
            slots[n] = per > 0 ? per * sms : 1;
        }
        if (e != cudaSuccess) {
            slots[0] = 0;
            return e;
        }
    }
    best = 2;
    if (a->stages >= 2 && a->stages <= 4) {
        best = a->stages;
    } else if (blocks > (uint32_t) slots[0]) {
        fill = 0.0;
        for (n = 0; n < 3; n++) {
            w = MSV_CEIL_DIV(blocks, (uint32_t) slots[n]);
            f = (double) blocks / ((double) w * slots[n]);
            if (f >= fill) {
                fill = f;
                best = n + 2;
            }
        }
    }
    *stages = best;
    *held = (uint32_t) slots[best - 2];
    return cudaSuccess;
}


/* The tensor-core form of the per-token kernels: one warp a block per
 * (token of a->rest, or of the batch, kv head), per split in the parallel
 * form. */
static cudaError_t
attention_mma_forward(const struct msv_attn_args *a, uint32_t n_tok,
    uint32_t S, int parallel, cudaStream_t stream)
{
#define MSV_ATTN_WALK_ROW(HD)                                                \
    { attention_walk_kernel<HD, 2>, attention_walk_kernel<HD, 3>,            \
      attention_walk_kernel<HD, 4> }
    static const msv_attn_kernel_t  kern[4][3] = {
        MSV_ATTN_WALK_ROW(16), MSV_ATTN_WALK_ROW(32),
        MSV_ATTN_WALK_ROW(64), MSV_ATTN_WALK_ROW(128)
    };
#undef MSV_ATTN_WALK_ROW
    static int                      ready[4][3];
    struct msv_attn_args            p;
    int                             k, nst;
    uint32_t                        held, cols;
    dim3                            grid(n_tok, a->n_kv_heads,
                                         parallel ? S : 1);
    cudaError_t                     e;

    k = msv_attn_hd_index(a->head_dim);
    e = msv_attn_walk_stages(a, grid.x * grid.y * grid.z, kern[k], &nst,
                             &held);
    if (e != cudaSuccess) {
        return e;
    }
    /* the serial form: as many blocks as the GPU holds at once, each
     * walking every cols-th token, the next one's pages fetched while it
     * finishes the last (a block a token ran in two waves at batch 256,
     * each block's first pages fetched after four dependent loads) */
    p = *a;
    p.walk_n = n_tok;
    if (!parallel) {
        cols = held / a->n_kv_heads > 0 ? held / a->n_kv_heads : 1;
        if (a->walk_cols > 0 && a->walk_cols < cols) {
            cols = a->walk_cols;
        }
        grid.x = cols < n_tok ? cols : n_tok;
    }
    return msv_attn_launch(kern[k][nst - 2], &ready[k][nst - 2], grid, 32,
                           msv_attn_walk_smem(a->head_dim, nst), &p, S,
                           stream);
}


/* The tiled prefill form: one block per (tile, kv head), per split in
 * the parallel form. */
static cudaError_t
attention_tile_forward(const struct msv_attn_args *a, uint32_t S,
    int parallel, cudaStream_t stream)
{
    static const msv_attn_kernel_t  kern[4] = {
        attention_tile_kernel<16>, attention_tile_kernel<32>,
        attention_tile_kernel<64>, attention_tile_kernel<128>
    };
    static int                      ready[4];
    int                             k;

    k = msv_attn_hd_index(a->head_dim);
    return msv_attn_launch(kern[k], &ready[k],
                           dim3(a->n_tiles, a->n_kv_heads, parallel ? S : 1),
                           MSV_ATTN_THREADS, msv_attn_tile_smem(a->head_dim),
                           a, S, stream);
}


/* Whether the tiled kernel takes the plan's tiles: 1, 0, or -1 when
 * MSV_ATTN_TILED_ON is asked for and it cannot. */
static int
msv_attn_tiled(const struct msv_attn_args *a)
{
    int  fits;

    fits = msv_attn_mma_fits(a);
    if (a->tiled == MSV_ATTN_TILED_ON && !fits) {
        return -1;
    }
    return a->tiled != MSV_ATTN_TILED_OFF && fits && a->n_tiles > 0
           && a->tiles != NULL && (a->n_rest == 0 || a->rest != NULL);
}


uint32_t
attention_decode_bound(uint32_t n_tokens, uint32_t n_heads,
    uint32_t n_kv_heads, uint32_t head_dim, int kv_bf16, int mode,
    uint32_t max_ctx, uint32_t max_len)
{
    struct msv_attn_args  a;
    uint32_t              bound;

    memset(&a, 0, sizeof(a));
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv_heads;
    a.head_dim = head_dim;
    a.kv.kv_bf16 = kv_bf16;
    if (msv_attn_serial(mode, n_tokens * n_kv_heads * msv_attn_groups(&a),
                        msv_attn_wide(&a)))
    {
        return max_len;
    }
    for (bound = MSV_ATTN_SPLIT; bound < max_ctx; bound <<= 1) { }
    return bound;
}


uint32_t
attention_tile_tokens(uint32_t ratio)
{
    return ratio == 0 || ratio > MSV_ATTN_TILE_ROWS
           ? 1 : MSV_ATTN_TILE_ROWS / ratio;
}


uint32_t
attention_plan(const int32_t *pos, const int32_t *tok_seq, uint32_t n_tokens,
    uint32_t ratio, uint32_t min_run, int32_t *tiles, int32_t *rest,
    uint32_t *n_rest)
{
    uint32_t  tq, nt, nr, t, e, k;

    tq = attention_tile_tokens(ratio);
    nt = 0;
    nr = 0;
    for (t = 0; t < n_tokens; t = e) {
        for (e = t + 1; e < n_tokens && tok_seq[e] == tok_seq[t]
                        && pos[e] == pos[e - 1] + 1; e++)
        { }
        if (e - t >= min_run) {
            for (k = t; k < e; k += tq) {
                tiles[2 * nt] = (int32_t) k;
                tiles[2 * nt + 1] = (int32_t) (e - k < tq ? e - k : tq);
                nt++;
            }
        } else {
            for (k = t; k < e; k++) {
                rest[nr++] = (int32_t) k;
            }
        }
    }
    *n_rest = nr;
    return nt;
}


/*
 * The plan's tiles by the tiled kernel when it can take them (and tiled
 * allows), the other tokens (all when no tile) by the per-token kernels:
 * the tensor-core one when it fits, else the fp32 ones.  The serial or
 * parallel form is chosen once for the call, over all its blocks, so one
 * merge folds every token's splits.
 */
cudaError_t
attention_forward(const struct msv_attn_args *a, cudaStream_t stream)
{
    struct msv_attn_args  p;
    dim3                  grid;
    size_t                smem;
    uint32_t              n_groups, S, blocks, nw, n_tok;
    int                   parallel, tiled, mma;
    cudaError_t           e;

#define MSV_ATTN_VEC(KV, NW)                                                 \
    attention_vec_kernel<KV, NW><<<grid, MSV_ATTN_THREADS, smem, stream>>>(  \
        p, n_groups, S)

    if (a->n_tokens == 0) {
        return cudaSuccess;
    }
    tiled = msv_attn_tiled(a);
    if (tiled < 0) {
        return cudaErrorInvalidValue;
    }
    p = *a;
    n_tok = a->n_tokens;
    if (tiled) {
        n_tok = a->n_rest;
    } else {
        p.rest = NULL;
        p.n_rest = 0;
        p.tiles = NULL;
        p.n_tiles = 0;
    }

    mma = msv_attn_mma_fits(a);
    n_groups = msv_attn_groups(a);
    S = MSV_CEIL_DIV(a->max_ctx, (uint32_t) MSV_ATTN_SPLIT);
    blocks = n_tok * a->n_kv_heads * n_groups
             + (tiled ? a->n_tiles * a->n_kv_heads : 0);

    parallel = msv_attn_parallel(a, S, blocks, msv_attn_wide(a));
    if (parallel < 0) {
        return cudaErrorInvalidValue;
    }

    if (tiled) {
        e = attention_tile_forward(&p, S, parallel, stream);
        if (e != cudaSuccess) {
            return e;
        }
    }

    if (n_tok == 0) {
        /* every token in a tile */

    } else if (mma) {
        e = attention_mma_forward(&p, n_tok, S, parallel, stream);
        if (e != cudaSuccess) {
            return e;
        }

    } else {
        grid = dim3(n_tok, a->n_kv_heads * n_groups, parallel ? S : 1);
        smem = ((size_t) MSV_ATTN_GROUP * a->head_dim
                + MSV_KV_BLOCK * (a->head_dim + 8)
                + MSV_KV_BLOCK * a->head_dim
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
                                              stream>>>(p, n_groups, S);
        } else {
            attention_kernel<float><<<grid, MSV_ATTN_THREADS, smem,
                                      stream>>>(p, n_groups, S);
        }
    }
#undef MSV_ATTN_VEC

    e = cudaGetLastError();
    if (e == cudaSuccess && parallel) {
        e = msv_attn_merge(a, S, stream);
    }
    return e;
}
