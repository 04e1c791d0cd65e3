/*
 * sampling.cu: the sampler contract (docs/SAMPLER.md) on the GPU, with
 * mask capture packed into the ring's row format.
 *
 * Two sampling kernels: the streaming kernel (its own section below)
 * takes every row it can, keeping only candidates in shared memory; the
 * resident kernel, described here, takes the rest.
 *
 * One thread-block cluster of MSV_GS_CLUSTER blocks takes one row of
 * logits.  Each block copies its slice of the row (vocab / cluster ids)
 * into shared memory once, processes it there (bias, penalties,
 * min_tokens, temperature) and keeps it there: every later stage is a
 * pass over shared memory, and the blocks meet only to combine small
 * partial results through distributed shared memory (cluster.sync and
 * map_shared_rank).  The logits are read from device memory exactly once.
 *
 * The support S is a prefix of the rank order (z' desc, id asc) of the
 * finite processed logits, so it is carried as two numbers: a float
 * floor `lo` (min_p) and a rank-key bound (top_k, top_p): S = { i :
 * z'(i) >= lo, rank_key(z'(i), i) <= bound }.  top_k and top_p bounds are
 * found by radix selection over the 32-bit order keys of z', 8 bits a
 * round, on histograms of counts (top_k) or of the exact integer top-p
 * weights (top_p); ties at the last key are cut by id, as the contract
 * says.  The race, the fixed-point logsumexp and the compaction of S in
 * id order are one pass each.
 *
 * The second kernel writes each row (struct msv_row, ids ascending,
 * logprobs, top entries sorted) at its realized size into a staging
 * buffer, rows back to back; only those bytes go to the host, copied on
 * a stream of their own (copy_stream) so that they travel while the
 * compute stream goes on with the next forward.  Two events order the
 * streams: ev1 (packing done) before a copy reads the staging buffer,
 * ev_copied (the last copy started) before the next packing writes it.
 * One staging buffer, not two: a step's copy (up to about 17 MB, 0.3 ms
 * at 55 GB/s) ends long before the next forward and sampling reach the
 * packing, so the wait costs nothing, and a second buffer would be
 * another max_rows largest rows of device memory (0.3 GB at 256 rows of
 * 151,936 ids).
 */

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../shm/msv_shm.h"
#include "sample_contract.h"
#include "sampling.h"

namespace cg = cooperative_groups;

#define MSV_GS_CLUSTER   8          /* blocks per row */
#define MSV_GS_THREADS   512
#define MSV_GS_WARPS     (MSV_GS_THREADS / 32)
#define MSV_GS_NT        blockDim.x /* threads of the running kernel's blocks */
#define MSV_GS_NW        (blockDim.x >> 5)
#define MSV_GS_MAX_CHUNK 49152      /* floats of a row slice in smem */
#define MSV_GS_NX        24         /* scalar exchanges per kernel */
#define MSV_GS_NH        2          /* histogram slots: rounds alternate,
                                       and a block reuses a slot only after
                                       a later round's barrier, when no
                                       block still reads it */
#define MSV_GS_MAX_MASK  (MSV_MAX_STOP + MSV_MAX_EOS)
#define MSV_GS_PACK_THREADS 512
#define MSV_GS_NB        128        /* candidate bins: 1/4 nat below max */
#define MSV_GS_BIN_SCALE 4.0f
#define MSV_GS_QBIN      92         /* bins holding every d >= -23 */
#define MSV_GS_CAP       4096       /* candidates a block compacts */
#define MSV_GS_MARKS     8          /* stage marks when profiling */
#define MSV_GS_SORT      2048       /* top_k/top_p by a sort: the most
                                       elements block 0 sorts */

enum {
    MSV_GS_GREEDY = 1u << 0,
    MSV_GS_MASKON = 1u << 1,        /* t < min_tokens: mask ids */
    MSV_GS_REP    = 1u << 2,
    MSV_GS_FREQ   = 1u << 3,        /* frequency or presence */
    MSV_GS_TOPK   = 1u << 4,
    MSV_GS_TOPP   = 1u << 5,
    MSV_GS_MINP   = 1u << 6,
    MSV_GS_CAPT   = 1u << 7,        /* a mask or logprobs was asked */
    MSV_GS_FAST   = 1u << 8,        /* the streaming kernel may take it */
    MSV_GS_RADIX  = 1u << 9         /* top_k and top_p by radix rounds
                                       only (MSV_CUDA_SAMPLER_SORT=0) */
};

/* One row of a step, as the kernels read it. */
struct msv_gs_row {
    uint64_t  seed;
    uint64_t  cookie;
    uint32_t  lrow;
    uint32_t  slot;
    uint32_t  t;
    uint32_t  flags;
    float     temp;
    float     top_p;
    float     min_p;
    int32_t   top_k;
    float     rep;
    float     pres;
    float     freq;
    int32_t   logprobs;
    uint32_t  mode;
    uint32_t  _pad[3];
};

/* What the sampling kernel found for a row. */
struct msv_gs_res {
    int32_t   token;
    float     logprob;
    uint32_t  n_support;
    uint32_t  n_top;
    uint32_t  n_lps;
    uint32_t  bytes;
    uint32_t  top_fill;             /* candidates written (atomic) */
    uint32_t  _pad;
};

/* Setting up a slot's device state when a request starts (or its
 * history is not the one the device holds). */
struct msv_gs_setup {
    uint32_t  slot;
    uint32_t  n_bias;
    uint32_t  n_mask;
    uint32_t  n_prompt;
    uint32_t  n_out;
    uint32_t  penalties;            /* rebuild counts and seen ids */
    uint64_t  off;                  /* into the upload buffer, 8-aligned:
                                       bias ids, bias values, mask ids,
                                       prompt, output (int32 each) */
};

/* Device-side state of every slot. */
struct msv_gs_state {
    int32_t   *bias_id;             /* [slots][MSV_MAX_BIAS], id order */
    float     *bias_val;
    uint32_t  *n_bias;              /* [slots] */
    int32_t   *mask;                /* [slots][MSV_GS_MAX_MASK] */
    uint32_t  *n_mask;
    uint32_t  *count;               /* [slots][vocab] output counts */
    uint32_t  *seen;                /* [slots][words] prompt or output */
    uint32_t   words;
    float     *pred_t;              /* [slots] candidate floor predicted
                                       for the next step (NaN: none) */
    float     *pred_g;              /* [slots] its gap below the cut */
};

struct msv_gsampler {
    uint32_t             vocab;
    uint32_t             max_rows;
    uint32_t             max_slots;
    uint32_t             max_lp;
    uint32_t             chunk;
    size_t               smem;
    cudaStream_t         stream;
    cudaStream_t         copy_stream;    /* packed rows to the host */
    cudaEvent_t          ev_copied;      /* the last copy started */

    struct msv_gs_state  st;

    /* host mirror of each slot's device state */
    uint64_t            *h_cookie;
    uint32_t            *h_t;        /* output tokens the counts hold */
    uint8_t             *h_valid;
    uint8_t             *h_pen;

    struct msv_gs_row   *h_rows;     /* pinned */
    struct msv_gs_row   *d_rows;
    struct msv_gs_res   *h_res;      /* pinned */
    struct msv_gs_res   *d_res;
    struct msv_gs_setup *h_setup;    /* pinned, [max_rows] */
    struct msv_gs_setup *d_setup;
    uint8_t             *h_up;       /* pinned upload data */
    uint8_t             *d_up;
    size_t               up_cap;

    int                  stream_on;  /* the streaming kernel runs first */
    int                  sort_on;    /* top_k and top_p cuts by a sort
                                        where they can */
    uint32_t             chunk4;     /* its slice at clusters of 4 */
    int                  ncl[2];     /* its clusters at once, of 8 and 4
                                        blocks (0: unknown) */
    int                  nc_force;   /* MSV_CUDA_SAMPLER_NC: 8, 4, or 0
                                        (chosen per run) */
    uint32_t             nc_last;    /* the last run's cluster size */
    uint32_t            *d_slow;     /* [max_rows] left to the resident
                                        kernel */
    unsigned long long  *d_paths;    /* rows a path took: predicted,
                                        histogram, resident; [3]: rows
                                        the streaming kernel left to the
                                        resident kernel; [4]: rows it cut
                                        on the sort */
    unsigned long long  *h_left;     /* pinned: [3] after the last run */
    unsigned long long   left_seen;  /* [3] before it */
    int32_t             *d_ids;      /* [max_rows][vocab] support ids */
    float               *d_lps;      /* [max_rows][vocab] their lps */
    uint64_t            *d_topk;     /* [max_rows][max_lp] rank keys */
    float               *d_toplp;
    uint8_t             *d_pack;     /* packed rows */
    size_t               pack_cap;
    uint64_t            *h_off;      /* row offsets of the last run */

    long long           *d_prof;     /* stage marks (profiling), or NULL */
    long long           *h_prof;
    cudaEvent_t          ev0, ev1, eva, evb;
    float                last_ms;
    float                part_ms[4];     /* uploads, streaming kernel,
                                            resident kernel, packing */
    cudaEvent_t          evs;
    uint32_t             prof_rows;
};


/* ------------------------------------------------------------------ */
/* Block and cluster helpers                                            */

struct msv_gs_smem {
    uint64_t   x[MSV_GS_NX][4];     /* scalar exchanges, one slot each */
    uint64_t   g[MSV_GS_CLUSTER][4];/* gathered words of the last one */
    union {
        struct {
            uint32_t  h[MSV_GS_NH][256];    /* count histograms, one slot
                                               each */
            uint32_t  wh[MSV_GS_NH][256][2];/* top-p weights, (lo, hi):
                                               32-bit atomics are native,
                                               64-bit ones a
                                               compare-and-swap loop */
            uint64_t  H[256];       /* the cluster's sum of the last one */
        };
        uint32_t  k32[MSV_GS_SORT];     /* or the inverted order keys of
                                           a set block 0 sorts */
    };
    uint64_t   red[MSV_GS_WARPS][3];
    uint32_t   wsum[MSV_GS_WARPS];
    uint32_t   flag;
    float      saved[MSV_GS_MAX_MASK];
    uint32_t   bh[MSV_GS_NB];       /* this block's candidate bins */
    uint32_t   bs[MSV_GS_NB];       /* the cluster's */
    uint32_t   own;                 /* this block's candidates */
    uint32_t   nr;                  /* blocks still at work: the
                                       cluster's, or 1 once block 0
                                       gathered every candidate */
    uint32_t  *gid;                 /* then: the candidates' ids */
};

/* Every block of the cluster at work, on its own slice's ids. */
__device__ static void
msv_gs_start(cg::cluster_group &cl, msv_gs_smem &S)
{
    if (threadIdx.x == 0) {
        S.nr = cl.num_blocks();
        S.gid = NULL;
    }
    __syncthreads();
}

/* A row's result before a kernel takes it: empty (what packing writes
 * for a row the streaming kernel leaves to the resident one, until that
 * one runs), top_fill 0.  Block 0 writes it before the cluster's first
 * barrier, so before any block adds to top_fill or writes the result. */
__device__ static void
msv_gs_res_clear(cg::cluster_group &cl, struct msv_gs_res *res, uint32_t ri)
{
    if (cl.block_rank() == 0 && threadIdx.x == 0) {
        struct msv_gs_res  e;

        memset(&e, 0, sizeof(e));
        e.token = -1;
        e.bytes = msv_row_size(0, 0, 0);
        res[ri] = e;
    }
}

/* Publish four words as exchange k, then gather every block's four. */
__device__ static void
msv_gs_exchange(cg::cluster_group &cl, msv_gs_smem &S, int k,
    uint64_t w0, uint64_t w1, uint64_t w2, uint64_t w3)
{
    if (S.nr == 1) {                    /* block 0 alone */
        if (threadIdx.x == 0) {
            S.g[0][0] = w0;
            S.g[0][1] = w1;
            S.g[0][2] = w2;
            S.g[0][3] = w3;
        }
        __syncthreads();
        return;
    }
    if (threadIdx.x == 0) {
        S.x[k][0] = w0;
        S.x[k][1] = w1;
        S.x[k][2] = w2;
        S.x[k][3] = w3;
    }
    /* the cluster barrier orders the writes above before the remote
     * reads below, in every block */
    cl.sync();
    if (threadIdx.x < S.nr * 4) {
        uint32_t   r = threadIdx.x / 4, j = threadIdx.x % 4;
        uint64_t  *p = cl.map_shared_rank(&S.x[k][0], r);

        S.g[r][j] = p[j];
    }
    __syncthreads();
}

/* The cluster's sum of histogram k into S.H: the count histogram S.h[k]
 * or, with weights, the top-p weight histogram S.wh[k] (lo, hi words). */
__device__ static void
msv_gs_hist_sum(cg::cluster_group &cl, msv_gs_smem &S, int k, bool weights)
{
    if (S.nr != 1) {
        cl.sync();
    } else {
        __syncthreads();
    }
    for (uint32_t b = threadIdx.x; b < 256; b += MSV_GS_NT) {
        uint64_t  s = 0;

        for (uint32_t r = 0; r < S.nr; r++) {
            if (weights) {
                const uint32_t  *p = cl.map_shared_rank(&S.wh[k][b][0], r);

                s += ((uint64_t) p[1] << 32) + p[0];
            } else {
                s += *cl.map_shared_rank(&S.h[k][b], r);
            }
        }
        S.H[b] = s;
    }
    __syncthreads();
}

__device__ static uint64_t
msv_gs_sum64(msv_gs_smem &S, uint64_t v)
{
    uint32_t  lane = threadIdx.x & 31, w = threadIdx.x >> 5;

    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, o);
    }
    if (lane == 0) {
        S.red[w][0] = v;
    }
    __syncthreads();
    v = 0;
    for (uint32_t k = 0; k < MSV_GS_NW; k++) {
        v += S.red[k][0];
    }
    __syncthreads();
    return v;
}

/* 128-bit sum (hi, lo) over the block. */
__device__ static void
msv_gs_sum128(msv_gs_smem &S, uint64_t *hi, uint64_t *lo)
{
    uint32_t  lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    uint64_t  h = *hi, l = *lo, oh, ol;

    for (int o = 16; o > 0; o >>= 1) {
        oh = __shfl_down_sync(0xffffffffu, h, o);
        ol = __shfl_down_sync(0xffffffffu, l, o);
        l += ol;
        h += oh + (l < ol);
    }
    if (lane == 0) {
        S.red[w][0] = h;
        S.red[w][1] = l;
    }
    __syncthreads();
    h = 0;
    l = 0;
    for (uint32_t k = 0; k < MSV_GS_NW; k++) {
        ol = S.red[k][1];
        l += ol;
        h += S.red[k][0] + (l < ol);
    }
    __syncthreads();
    *hi = h;
    *lo = l;
}

/* Does (bv, bi) beat (av, ai)?  Larger value, then lower id. */
__device__ static inline bool
msv_gs_better(float av, uint32_t ai, float bv, uint32_t bi)
{
    return bv > av || (bv == av && bi < ai);
}

__device__ static inline bool
msv_gs_better_d(double av, uint32_t ai, double bv, uint32_t bi)
{
    return bv > av || (bv == av && bi < ai);
}

/* Best (value, id) and the sum of cnt over the block. */
__device__ static void
msv_gs_best(msv_gs_smem &S, float *v, uint32_t *id, uint32_t *cnt)
{
    uint32_t  lane = threadIdx.x & 31, w = threadIdx.x >> 5, oi, oc;
    float     ov;
    float     bv = *v;
    uint32_t  bi = *id, c = *cnt;

    for (int o = 16; o > 0; o >>= 1) {
        ov = __shfl_down_sync(0xffffffffu, bv, o);
        oi = __shfl_down_sync(0xffffffffu, bi, o);
        oc = __shfl_down_sync(0xffffffffu, c, o);
        if (msv_gs_better(bv, bi, ov, oi)) {
            bv = ov;
            bi = oi;
        }
        c += oc;
    }
    if (lane == 0) {
        S.red[w][0] = __float_as_uint(bv);
        S.red[w][1] = bi;
        S.red[w][2] = c;
    }
    __syncthreads();
    bv = -INFINITY;
    bi = UINT32_MAX;
    c = 0;
    for (uint32_t k = 0; k < MSV_GS_NW; k++) {
        ov = __uint_as_float((uint32_t) S.red[k][0]);
        oi = (uint32_t) S.red[k][1];
        if (msv_gs_better(bv, bi, ov, oi)) {
            bv = ov;
            bi = oi;
        }
        c += (uint32_t) S.red[k][2];
    }
    __syncthreads();
    *v = bv;
    *id = bi;
    *cnt = c;
}

/* Best race key over the block, with the winner's logit. */
__device__ static void
msv_gs_best_key(msv_gs_smem &S, double *key, uint32_t *id, float *z)
{
    uint32_t  lane = threadIdx.x & 31, w = threadIdx.x >> 5, oi;
    double    ok, bk = *key;
    float     oz, bz = *z;
    uint32_t  bi = *id;

    for (int o = 16; o > 0; o >>= 1) {
        ok = __shfl_down_sync(0xffffffffu, bk, o);
        oi = __shfl_down_sync(0xffffffffu, bi, o);
        oz = __shfl_down_sync(0xffffffffu, bz, o);
        if (msv_gs_better_d(bk, bi, ok, oi)) {
            bk = ok;
            bi = oi;
            bz = oz;
        }
    }
    if (lane == 0) {
        S.red[w][0] = (uint64_t) __double_as_longlong(bk);
        S.red[w][1] = bi;
        S.red[w][2] = __float_as_uint(bz);
    }
    __syncthreads();
    bk = -INFINITY;
    bi = UINT32_MAX;
    bz = -INFINITY;
    for (uint32_t k = 0; k < MSV_GS_NW; k++) {
        ok = __longlong_as_double((long long) S.red[k][0]);
        oi = (uint32_t) S.red[k][1];
        if (msv_gs_better_d(bk, bi, ok, oi)) {
            bk = ok;
            bi = oi;
            bz = __uint_as_float((uint32_t) S.red[k][2]);
        }
    }
    __syncthreads();
    *key = bk;
    *id = bi;
    *z = bz;
}

/* Exclusive prefix of `pred` over the block's threads in order, and the
 * block's total. */
__device__ static uint32_t
msv_gs_scan(msv_gs_smem &S, bool pred, uint32_t *total)
{
    uint32_t  lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    uint32_t  m = __ballot_sync(0xffffffffu, pred);
    uint32_t  base = 0, tot = 0, c;

    if (lane == 0) {
        S.wsum[w] = __popc(m);
    }
    __syncthreads();
    for (uint32_t k = 0; k < MSV_GS_NW; k++) {
        c = S.wsum[k];
        base += k < w ? c : 0;
        tot += c;
    }
    __syncthreads();
    *total = tot;
    return base + __popc(m & ((1u << lane) - 1));
}

/* The candidate bin of a finite logit x <= m: 1/16 nat steps below the
 * max, the last bin taking the rest.  Monotone in x, so the bins are
 * prefixes of the rank order. */
__device__ static inline uint32_t
msv_gs_bin(float m, float x)
{
    float  f = __fmul_rn(__fsub_rn(m, x), MSV_GS_BIN_SCALE);

    return f < (float) (MSV_GS_NB - 1) ? (uint32_t) f : MSV_GS_NB - 1;
}

/* The first bin of S.bs (best first) where the cumulative count reaches
 * k, or MSV_GS_NB - 1; warp 0 finds it, every thread gets it. */
__device__ static uint32_t
msv_gs_bin_of_k(msv_gs_smem &S, uint64_t k)
{
    if (threadIdx.x < 32) {
        const uint32_t  per = MSV_GS_NB / 32, lane = threadIdx.x;
        uint64_t        own = 0, pre, v;
        uint32_t        j, hit;

        for (j = 0; j < per; j++) {
            own += S.bs[lane * per + j];
        }
        pre = own;
        for (int o = 1; o < 32; o <<= 1) {
            v = __shfl_up_sync(0xffffffffu, pre, o);
            if (lane >= (uint32_t) o) {
                pre += v;
            }
        }
        hit = __ballot_sync(0xffffffffu, pre >= k);
        if (hit == 0) {
            if (lane == 0) {
                S.flag = MSV_GS_NB - 1;
            }
        } else if (lane == (uint32_t) (__ffs(hit) - 1)) {
            uint64_t  c = pre - own;

            for (j = 0; j < per - 1; j++) {
                c += S.bs[lane * per + j];
                if (c >= k) {
                    break;
                }
            }
            S.flag = lane * per + j;
        }
    }
    __syncthreads();
    {
        uint32_t  b = S.flag;

        __syncthreads();
        return b;
    }
}

/*
 * From the warps' candidate bins wh[][] just counted: the block's (S.bh),
 * the cluster's (S.bs), the count of finite logits >= lo in them (*n1),
 * and the last bin the support can reach: the one holding the k-th
 * (top_k), or every bin with a top-p weight (top_p alone), or the last.
 */
__device__ static uint32_t
msv_gs_bins(cg::cluster_group &cl, msv_gs_smem &S, const struct msv_gs_row &R,
    uint32_t (*wh)[MSV_GS_NB], uint64_t *n1)
{
    uint32_t  i, r, bsel = MSV_GS_NB - 1;
    uint64_t  c1 = 0;

    __syncthreads();
    for (i = threadIdx.x; i < MSV_GS_NB; i += MSV_GS_NT) {
        uint32_t  c = 0;

        for (r = 0; r < MSV_GS_NW; r++) {
            c += wh[r][i];
        }
        S.bh[i] = c;
    }
    cl.sync();
    for (i = threadIdx.x; i < MSV_GS_NB; i += MSV_GS_NT) {
        uint32_t  c = 0;

        for (r = 0; r < S.nr; r++) {
            c += *cl.map_shared_rank(&S.bh[i], r);
        }
        S.bs[i] = c;
    }
    __syncthreads();
    for (i = 0; i < MSV_GS_NB; i++) {
        c1 += S.bs[i];
    }
    if ((R.flags & MSV_GS_TOPP) && !(R.flags & MSV_GS_TOPK)) {
        bsel = MSV_GS_QBIN;
    }
    if ((R.flags & MSV_GS_TOPK) && (uint64_t) R.top_k < c1) {
        uint32_t  bk = msv_gs_bin_of_k(S, (uint64_t) R.top_k);

        bsel = bk < bsel ? bk : bsel;
    }
    *n1 = c1;
    return bsel;
}

/* Element i of a block's slice in use, its id and value: the slice
 * itself, or its candidates (ix: their offsets in the slice, ascending). */
#define MSV_GS_ID(i)   (S.gid != NULL ? S.gid[i]                        \
                        : (ix != NULL ? c0 + ix[i] : c0 + (i)))
#define MSV_GS_VAL(i)  (ix != NULL ? z[ix[i]] : z[i])

/* Where a block scan keeps its warps' totals: 32-bit ones in S.wsum,
 * 64-bit ones in S.red. */
__device__ static uint32_t &
msv_gs_wtot(msv_gs_smem &S, uint32_t w, uint32_t)
{
    return S.wsum[w];
}

__device__ static uint64_t &
msv_gs_wtot(msv_gs_smem &S, uint32_t w, uint64_t)
{
    return S.red[w][0];
}

/* Exclusive prefix of v over the block's threads in order, and the
 * block's total. */
template <typename T>
__device__ static T
msv_gs_xscan(msv_gs_smem &S, T v, T *total)
{
    uint32_t  lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    T         inc = v, o, base = 0, tot = 0, c;

    for (int d = 1; d < 32; d <<= 1) {
        o = __shfl_up_sync(0xffffffffu, inc, d);
        if (lane >= (uint32_t) d) {
            inc += o;
        }
    }
    if (lane == 31) {
        msv_gs_wtot(S, w, v) = inc;
    }
    __syncthreads();
    for (uint32_t k = 0; k < MSV_GS_NW; k++) {
        c = msv_gs_wtot(S, k, v);
        base += k < w ? c : 0;
        tot += c;
    }
    __syncthreads();
    *total = tot;
    return base + inc - v;
}

/* The support predicate on one logit. */
__device__ static inline bool
msv_gs_in(float x, uint32_t id, float lo, uint64_t bound)
{
    return x >= lo && msv_rank_key(x, id) <= bound;
}

/*
 * Digit search over a 256-bin histogram in S.H (bins are the next 8 key
 * bits; a higher bin ranks first).  Count mode: the bin where the
 * cumulative count from the top reaches `need`; *need becomes the count
 * still to take inside it.  Weight mode: the first bin whose cumulative
 * weight (plus *above) as a double reaches tau; *above becomes the
 * weight of the bins before it.  Done by warp 0; the result is in S.flag
 * for every thread.
 */
__device__ static uint32_t
msv_gs_digit(msv_gs_smem &S, int weight, uint64_t *need, uint64_t *above,
    double tau)
{
    if (threadIdx.x < 32) {
        uint32_t  lane = threadIdx.x, d, j, hit;
        uint64_t  own = 0, pre, v, base;

        /* lane l holds bins 255 - 8l ... 248 - 8l, best first */
        for (j = 0; j < 8; j++) {
            own += S.H[255 - 8 * lane - j];
        }
        pre = own;
        for (int o = 1; o < 32; o <<= 1) {
            v = __shfl_up_sync(0xffffffffu, pre, o);
            if (lane >= (uint32_t) o) {
                pre += v;
            }
        }
        base = weight ? *above : 0;
        /* inclusive prefix `pre`: the first lane reaching the target */
        if (weight) {
            hit = __ballot_sync(0xffffffffu,
                                (double) (base + pre) >= tau);
        } else {
            hit = __ballot_sync(0xffffffffu, pre >= *need);
        }
        if (hit == 0) {
            hit = 1u << 31;             /* cannot happen: the last bin */
        }
        j = __ffs(hit) - 1;
        if (lane == j) {
            uint64_t  c = pre - own;    /* before this lane's bins */

            for (d = 0; d < 8; d++) {
                v = S.H[255 - 8 * lane - d];
                if (weight ? (double) (base + c + v) >= tau
                           : c + v >= *need)
                {
                    break;
                }
                c += v;
            }
            if (d == 8) {
                d = 7;
            }
            S.x[MSV_GS_NX - 1][0] = 255 - 8 * lane - d;
            S.x[MSV_GS_NX - 1][1] = c;
        }
    }
    __syncthreads();
    {
        uint32_t  digit = (uint32_t) S.x[MSV_GS_NX - 1][0];
        uint64_t  c = S.x[MSV_GS_NX - 1][1];

        __syncthreads();
        if (weight) {
            *above += c;
        } else {
            *need -= c;
        }
        return digit;
    }
}

/*
 * Among the ids of this block's slice with key `key` (and in the current
 * set: z >= lo, rank key <= bound), in id order, the cluster-wide
 * need-th (1-based) overall; every block gets it.  Uses exchanges xk and
 * xk + 1.
 */
__device__ static uint32_t
msv_gs_cut(cg::cluster_group &cl, msv_gs_smem &S, int xk, const float *z,
    const uint16_t *ix, uint32_t n, uint32_t c0, uint32_t key, float lo,
    uint64_t bound, uint64_t need)
{
    uint32_t  br = cl.block_rank(), r, i, tot, pre, mine;
    uint64_t  cnt = 0, before = 0, owner = MSV_GS_CLUSTER;

    for (i = threadIdx.x; i < n; i += MSV_GS_NT) {
        float  x = MSV_GS_VAL(i);

        cnt += msv_gs_in(x, MSV_GS_ID(i), lo, bound) && msv_fkey(x) == key;
    }
    cnt = msv_gs_sum64(S, cnt);
    msv_gs_exchange(cl, S, xk, cnt, 0, 0, 0);
    for (r = 0; r < S.nr; r++) {
        if (owner == MSV_GS_CLUSTER && before + S.g[r][0] >= need) {
            owner = r;
            break;
        }
        before += S.g[r][0];
    }

    mine = UINT32_MAX;
    if (owner == br) {
        uint64_t  left = need - before;     /* 1-based within the slice */

        for (uint32_t t0 = 0; t0 < n; t0 += MSV_GS_NT) {
            i = t0 + threadIdx.x;
            float x = i < n ? MSV_GS_VAL(i) : -INFINITY;
            bool  p = i < n && msv_gs_in(x, MSV_GS_ID(i), lo, bound)
                      && msv_fkey(x) == key;

            pre = msv_gs_scan(S, p, &tot);
            if (left <= tot) {
                if (p && pre + 1 == left) {
                    S.flag = MSV_GS_ID(i);
                }
                __syncthreads();
                mine = S.flag;
                __syncthreads();
                break;
            }
            left -= tot;
        }
    }
    msv_gs_exchange(cl, S, xk + 1, mine, 0, 0, 0);
    mine = UINT32_MAX;
    for (r = 0; r < S.nr; r++) {
        mine = (uint32_t) S.g[r][0] < mine ? (uint32_t) S.g[r][0] : mine;
    }
    return mine;
}

/*
 * The cluster's smallest *mn and largest *mx of the threads' values, and
 * (if sum is not NULL) the sum of *sum, through exchange xk (w0: a word
 * that goes along, summed too).
 */
__device__ static void
msv_gs_minmax(cg::cluster_group &cl, msv_gs_smem &S, int xk, uint64_t w0,
    uint32_t *mn, uint32_t *mx, uint64_t *sum)
{
    uint32_t  lane = threadIdx.x & 31, w = threadIdx.x >> 5, i, r, o;
    uint32_t  a = *mn, b = *mx;

    for (int d = 16; d > 0; d >>= 1) {
        o = __shfl_down_sync(0xffffffffu, a, d);
        a = o < a ? o : a;
        o = __shfl_down_sync(0xffffffffu, b, d);
        b = o > b ? o : b;
    }
    if (lane == 0) {
        S.red[w][0] = a;
        S.red[w][1] = b;
    }
    __syncthreads();
    a = UINT32_MAX;
    b = 0;
    for (i = 0; i < MSV_GS_NW; i++) {
        a = (uint32_t) S.red[i][0] < a ? (uint32_t) S.red[i][0] : a;
        b = (uint32_t) S.red[i][1] > b ? (uint32_t) S.red[i][1] : b;
    }
    __syncthreads();
    msv_gs_exchange(cl, S, xk, a, b, w0, 0);
    a = UINT32_MAX;
    b = 0;
    w0 = 0;
    for (r = 0; r < S.nr; r++) {
        a = (uint32_t) S.g[r][0] < a ? (uint32_t) S.g[r][0] : a;
        b = (uint32_t) S.g[r][1] > b ? (uint32_t) S.g[r][1] : b;
        w0 += S.g[r][2];
    }
    *mn = a;
    *mx = b;
    if (sum != NULL) {
        *sum = w0;
    }
}

/*
 * The smallest order key in the current set (*kmin) and the bits where
 * the keys differ from it (*diff: the OR over the set of key ^ kmin is
 * bounded by max ^ min, which is what is returned).  Uses exchange xk + 2.
 */
__device__ static void
msv_gs_key_range(cg::cluster_group &cl, msv_gs_smem &S, int xk,
    const float *z, const uint16_t *ix, uint32_t n, uint32_t c0, float lo,
    uint64_t bound, uint32_t *kmin, uint32_t *diff)
{
    uint32_t  i;
    uint32_t  mn = UINT32_MAX, mx = 0;

    for (i = threadIdx.x; i < n; i += MSV_GS_NT) {
        float  x = MSV_GS_VAL(i);

        if (msv_gs_in(x, MSV_GS_ID(i), lo, bound)) {
            uint32_t  u = msv_fkey(x);

            mn = u < mn ? u : mn;
            mx = u > mx ? u : mx;
        }
    }
    msv_gs_minmax(cl, S, xk + 2, 0, &mn, &mx, NULL);
    *kmin = mn;
    *diff = mn ^ mx;
}

/*
 * Count mode selection: the rank-key bound of the k-th best (1-based)
 * element of the current set.  Uses the histogram slots and
 * exchanges xk .. xk + 2.
 */
__device__ static uint64_t
msv_gs_select_k(cg::cluster_group &cl, msv_gs_smem &S, int xk,
    const float *z, const uint16_t *ix, uint32_t n, uint32_t c0, float lo,
    uint64_t bound, uint64_t k)
{
    uint32_t  prefix, mask, shift, digit, i, id, top;
    uint64_t  need = k, dummy = 0;

    if (S.nr == 1 && n <= 256) {
        /* few, in one block: each element's rank is how many rank keys
         * of the set are lower than its own (keys differ: ids do) */
        for (i = threadIdx.x; i < 256; i += MSV_GS_NT) {
            float  x = i < n ? MSV_GS_VAL(i) : -INFINITY;

            S.H[i] = i < n && msv_gs_in(x, MSV_GS_ID(i), lo, bound)
                     ? msv_rank_key(x, MSV_GS_ID(i)) : UINT64_MAX;
        }
        __syncthreads();
        for (i = threadIdx.x; i < n; i += MSV_GS_NT) {
            const uint64_t  key = S.H[i];
            uint64_t        rank = 0;

            if (key == UINT64_MAX) {
                continue;
            }
            for (uint32_t j = 0; j < n; j++) {
                rank += S.H[j] < key;
            }
            if (rank + 1 == k) {
                S.x[MSV_GS_NX - 1][0] = key;
            }
        }
        __syncthreads();
        {
            uint64_t  key = S.x[MSV_GS_NX - 1][0];

            __syncthreads();
            return key;
        }
    }

    msv_gs_key_range(cl, S, xk, z, ix, n, c0, lo, bound, &prefix, &top);
    if (top == 0) {
        /* one key: the cut alone decides */
        id = msv_gs_cut(cl, S, xk, z, ix, n, c0, prefix, lo, bound, need);
        return ((uint64_t) (uint32_t) ~prefix << 32) | id;
    }
    shift = 8 * ((31 - __clz(top)) / 8);     /* first byte that differs */
    mask = shift == 24 ? 0 : ~0u << (shift + 8);
    prefix &= mask;

    for (int r = 0; r < 4 && shift <= 24; r++, shift -= 8) {
        for (i = threadIdx.x; i < 256; i += MSV_GS_NT) {
            S.h[r & 1][i] = 0;
        }
        __syncthreads();
        for (i = threadIdx.x; i < n; i += MSV_GS_NT) {
            float     x = MSV_GS_VAL(i);
            uint32_t  u = msv_fkey(x);

            if (msv_gs_in(x, MSV_GS_ID(i), lo, bound) && (u & mask) == prefix) {
                atomicAdd(&S.h[r & 1][(u >> shift) & 255], 1u);
            }
        }
        msv_gs_hist_sum(cl, S, r & 1, false);
        digit = msv_gs_digit(S, 0, &need, &dummy, 0.0);
        prefix |= digit << shift;
        mask |= 255u << shift;
        if (shift == 0) {
            break;
        }
    }

    id = msv_gs_cut(cl, S, xk, z, ix, n, c0, prefix, lo, bound, need);
    return ((uint64_t) (uint32_t) ~prefix << 32) | id;
}


/*
 * The first index of value v in the ascending array a[0..n) (v is there),
 * for every thread of the block; `first` is shared scratch.
 */
__device__ static uint32_t
msv_gs_first_of(const uint32_t *a, uint32_t n, uint32_t v, uint32_t *first)
{
    uint32_t  i, f;

    for (i = threadIdx.x; i < n; i += MSV_GS_NT) {
        if (a[i] == v && (i == 0 || a[i - 1] != v)) {
            *first = i;                 /* one thread: the index is unique */
        }
    }
    __syncthreads();
    f = *first;
    __syncthreads();
    return f;
}

/*
 * Stages 6 and 7 (top_k, top_p) on a set that block 0 holds alone
 * (S.nr == 1) of at most MSV_GS_SORT elements: the inverted order keys
 * ~msv_fkey(z') of the set sorted ascending in shared memory (bitonic),
 * which is the rank order up to ties of value; ties weigh the same and
 * are cut by id in id order (msv_gs_cut), as the radix rounds cut them.
 * top_k: the k-th key v, and among the ids of value v the (k - those
 * above)-th.  top_p: one prefix sum of the integer weights over the first
 * min(k, |set|) keys, the first position reaching tau = top_p * W, then
 * the same cut among its ties.  The same bounds as the rounds (the
 * weights are integers: no summation order shows).  *bk: top_k's bound
 * (UINT64_MAX: none); returns the bound of both.  Uses exchanges xk to
 * xk + 3.  Not inlined: inside the streaming kernel (64 registers a
 * thread) its registers would be allocated with the walk's, which then
 * spilled three times as much (ptxas -v: 208 bytes of spill stores
 * against 64-72).
 */
__device__ static __noinline__ uint64_t
msv_gs_sorted_cut(cg::cluster_group &cl, msv_gs_smem &S,
    const struct msv_gs_row &R, int xk, const float *z, const uint16_t *ix,
    uint32_t nn, uint32_t c0, float lo, float m, uint64_t n1, uint64_t *bk)
{
    __shared__ uint32_t  cnt, first;
    uint32_t * const     a = S.k32;
    uint32_t             i, j, k, P, ns, v, fv, id;
    uint64_t             b = UINT64_MAX;

    if (threadIdx.x == 0) {
        cnt = 0;
    }
    __syncthreads();
    for (i = threadIdx.x; i < nn; i += MSV_GS_NT) {
        float  x = MSV_GS_VAL(i);

        if (msv_gs_in(x, MSV_GS_ID(i), lo, UINT64_MAX)) {
            a[atomicAdd(&cnt, 1u)] = ~msv_fkey(x);  /* nn <= MSV_GS_SORT */
        }
    }
    __syncthreads();
    ns = cnt;
    if (ns == 0) {                      /* not seen: the max is in the set */
        __syncthreads();
        *bk = UINT64_MAX;
        return UINT64_MAX;
    }
    for (P = 2; P < ns; P <<= 1) {
    }
    for (i = ns + threadIdx.x; i < P; i += MSV_GS_NT) {
        a[i] = UINT32_MAX;              /* after every real key */
    }
    __syncthreads();
    for (k = 2; k <= P; k <<= 1) {
        for (j = k >> 1; j > 0; j >>= 1) {
            for (i = threadIdx.x; i < P / 2; i += MSV_GS_NT) {
                const uint32_t  l = 2 * j * (i / j) + i % j;
                const uint32_t  x0 = a[l], x1 = a[l + j];

                if ((x0 > x1) == ((l & k) == 0)) {
                    a[l] = x1;
                    a[l + j] = x0;
                }
            }
            __syncthreads();
        }
    }

    /* 6. top_k: the k-th of the survivors, if there are more than k */
    if ((R.flags & MSV_GS_TOPK) && (uint64_t) R.top_k < n1
        && (uint32_t) R.top_k < ns)
    {
        k = (uint32_t) R.top_k;
        v = a[k - 1];
        fv = msv_gs_first_of(a, k, v, &first);
        id = msv_gs_cut(cl, S, xk, z, ix, nn, c0, ~v, lo, UINT64_MAX, k - fv);
        b = ((uint64_t) v << 32) | id;
        ns = k;
    }
    *bk = b;

    /* 7. top_p: each thread a run of the order, its weight, the runs
     * before it, then the first position reaching tau */
    if (R.flags & MSV_GS_TOPP) {
        const double    md = (double) m;
        const uint32_t  per = (ns + MSV_GS_NT - 1) / MSV_GS_NT;
        const uint32_t  a0 = threadIdx.x * per < ns ? threadIdx.x * per : ns;
        const uint32_t  a1 = a0 + per < ns ? a0 + per : ns;
        uint64_t        own = 0, pre, u, W;
        double          tau;

        if (threadIdx.x == 0) {
            first = UINT32_MAX;
        }
        for (i = a0; i < a1; i++) {
            own += msv_weight((double) msv_fkey_value(~a[i]) - md);
        }
        pre = msv_gs_xscan(S, own, &W);     /* the runs before this one */
        tau = (double) R.top_p * (double) W;
        for (i = a0; i < a1; i++) {
            pre += msv_weight((double) msv_fkey_value(~a[i]) - md);
            if ((double) pre >= tau) {
                atomicMin(&first, i);
                break;
            }
        }
        __syncthreads();
        j = first < ns ? first : ns - 1;    /* W >= tau: always found */
        __syncthreads();                /* first is free again */
        v = a[j];
        fv = msv_gs_first_of(a, j + 1, v, &first);
        id = msv_gs_cut(cl, S, xk + 2, z, ix, nn, c0, ~v, lo, b, j - fv + 1);
        u = ((uint64_t) v << 32) | id;
        b = u < b ? u : b;
    }
    __syncthreads();                    /* before S.k32 is reused */
    return b;
}


/* ------------------------------------------------------------------ */
/* Per-logit processing, one definition for every pass that does it    */

/* Repetition, then frequency and presence penalties of logit id. */
static __device__ __forceinline__ float
msv_gs_penalize(float x, uint32_t id, uint32_t fl, const struct msv_gs_row &R,
    const uint32_t *sn, const uint32_t *cn)
{
    /* an id with an output count is a seen id: one bit to test first */
    if (!((sn[id >> 5] >> (id & 31)) & 1u)) {
        return x;
    }
    if (fl & MSV_GS_REP) {
        x = msv_rep_penalty(x, R.rep);
    }
    if ((fl & MSV_GS_FREQ) && cn[id] > 0) {
        x = msv_freq_penalty(x, R.freq, cn[id], R.pres);
    }
    return x;
}

/* The running max, the lowest id holding it (ids rise along a thread's
 * elements, so the first one seen wins) and the count of finite logits. */
static __device__ __forceinline__ void
msv_gs_note(float x, uint32_t id, float *m, uint32_t *amax, uint32_t *cnt)
{
    if (x != -INFINITY) {
        (*cnt)++;
        if (x > *m) {
            *m = x;
            *amax = id;
        }
    }
}


/* ------------------------------------------------------------------ */
/* The sampling kernel: one cluster per row                             */

/* stage times of block 0 (bench/gpu_sampler -p): SM clock at each mark */
#define MSV_GS_MARK(k)                                                   \
    do {                                                                 \
        if (prof != NULL && br == 0 && threadIdx.x == 0) {               \
            prof[(size_t) ri * MSV_GS_MARKS + (k)] = clock64();          \
        }                                                                \
    } while (0)

/* The token joins the request's history for the next step's penalties
 * (its slice's block is the only reader of that entry); then no block
 * leaves while another may still read its shared memory. */
__device__ static void
msv_gs_update(cg::cluster_group &cl, msv_gs_smem &S,
    const struct msv_gs_row &R, const struct msv_gs_state &st, uint32_t V,
    uint32_t c0, uint32_t n, uint32_t amax)
{
    const uint32_t  fl = R.flags;

    if ((fl & (MSV_GS_REP | MSV_GS_FREQ)) && threadIdx.x == 0
        && (S.nr == 1 || (amax >= c0 && amax < c0 + n)))
    {
        st.count[(size_t) R.slot * V + amax]++;
        st.seen[(size_t) R.slot * st.words + (amax >> 5)] |= 1u << (amax & 31);
    }
    /* no block leaves while another may still read its shared memory */
    if (S.nr != 1) {
        cl.sync();
    }
}


/*
 * The result of a row without a draw (one thread): no finite logit
 * (token -1, an empty row) or greedy (the max's lowest id, amax, a
 * one-id support and top entry when asked).
 */
__device__ static void
msv_gs_emit_max(const struct msv_gs_row &R, uint32_t ri, uint32_t V,
    bool finite, float m, uint32_t amax, int32_t *out_ids, float *out_lps,
    uint64_t *top_key, float *top_lp, uint32_t max_lp,
    struct msv_gs_res *res)
{
    uint32_t  ns = finite && R.mode != MSV_MASK_OFF ? 1 : 0;
    uint32_t  nt = finite && R.logprobs > 0 ? 1 : 0;

    res[ri].token = finite ? (int32_t) amax : -1;
    res[ri].logprob = 0.0f;
    res[ri].n_support = ns;
    res[ri].n_lps = ns;
    res[ri].n_top = nt;
    res[ri].bytes = msv_row_size(ns, ns, nt);
    if (finite) {
        out_ids[(size_t) ri * V] = (int32_t) amax;
        out_lps[(size_t) ri * V] = 0.0f;
        top_key[(size_t) ri * max_lp] = msv_rank_key(m, amax);
        top_lp[(size_t) ri * max_lp] = 0.0f;
    }
}


/*
 * Whether msv_gs_finish makes the cuts of a set on the sort
 * (msv_gs_sorted_cut): block 0 holds it alone, small enough, the sort
 * not turned off, and a cut to make (top_k alone on 256 or fewer keeps
 * its rank count).
 */
__device__ static __forceinline__ bool
msv_gs_sorts(const msv_gs_smem &S, const struct msv_gs_row &R, uint32_t nn,
    uint64_t n1)
{
    const uint32_t  fl = R.flags;

    return S.nr == 1 && nn <= MSV_GS_SORT && !(fl & MSV_GS_RADIX)
           && (((fl & MSV_GS_TOPK) && (uint64_t) R.top_k < n1 && nn > 256)
               || (fl & MSV_GS_TOPP));
}


/*
 * Stages 6-9 (top_k, top_p, the race, capture) and the history update,
 * over what each block holds: its slice, its candidates, or (S.nr == 1)
 * every candidate of the row in block 0.  Returns the rank-key bound
 * that top_k set (UINT64_MAX: none).
 */
__device__ static uint64_t
msv_gs_finish(cg::cluster_group &cl, msv_gs_smem &S,
    const struct msv_gs_row &R, uint32_t ri, int xk, const float *z,
    const uint16_t *ix, uint32_t nn, uint32_t c0, uint32_t n, uint32_t V,
    float m, uint32_t amax, float lo, uint64_t n1,
    const struct msv_gs_state &st, int32_t *out_ids, float *out_lps,
    uint64_t *top_key, float *top_lp, uint32_t max_lp,
    struct msv_gs_res *res, long long *prof)
{
    const uint32_t  br = cl.block_rank();
    const uint32_t  fl = R.flags;
    bool            sorted = false; /* both cuts made on the sorted set */
    uint64_t        bound = UINT64_MAX, bk = UINT64_MAX;
    uint32_t        i, id, r;
    float           x;

    MSV_GS_MARK(5);

    /* 6-7 on a set block 0 holds alone, small enough to sort */
    if (msv_gs_sorts(S, R, nn, n1)) {
        bound = msv_gs_sorted_cut(cl, S, R, xk, z, ix, nn, c0, lo, m, n1,
                                  &bk);
        xk += 4;
        sorted = true;
    }

    /* 6. top_k: the k-th of the survivors, if there are more than k */
    if (!sorted) {
        if ((fl & MSV_GS_TOPK) && (uint64_t) R.top_k < n1) {
            bound = msv_gs_select_k(cl, S, xk, z, ix, nn, c0, lo, bound,
                                    (uint64_t) R.top_k);
            xk += 3;
        }
        bk = bound;
    }

    /* 7. top_p: integer weights, the first prefix reaching tau */
    if (!sorted && (fl & MSV_GS_TOPP)) {
        uint64_t  w = 0, above = 0, dummy = 0, q;
        uint32_t  prefix = 0, mask = 0, shift, digit;
        double    tau, d;
        const double  md = (double) m;

        uint32_t  kmn = UINT32_MAX, kmx = 0;

        for (i = threadIdx.x; i < nn; i += MSV_GS_NT) {
            x = MSV_GS_VAL(i);
            if (msv_gs_in(x, MSV_GS_ID(i), lo, bound)) {
                q = msv_weight((double) x - md);
                w += q;
                if (q > 0) {
                    uint32_t  u = msv_fkey(x);

                    kmn = u < kmn ? u : kmn;
                    kmx = u > kmx ? u : kmx;
                }
            }
        }
        w = msv_gs_sum64(S, w);
        msv_gs_minmax(cl, S, xk++, w, &kmn, &kmx, &w);
        tau = (double) R.top_p * (double) w;

        /* the bytes above the first where the weighted keys differ are
         * theirs: the rounds that would find them are skipped */
        {
            uint32_t  df = kmn ^ kmx;

            shift = df == 0 ? 0 : 8 * ((31 - __clz(df)) / 8);
            mask = shift == 24 ? 0 : ~0u << (shift + 8);
            prefix = kmn & mask;
        }
        for (int rd = (24 - (int) shift) / 8; rd < 4; rd++) {
            shift = 24 - 8 * rd;
            for (i = threadIdx.x; i < 256; i += MSV_GS_NT) {
                S.wh[rd & 1][i][0] = 0;
                S.wh[rd & 1][i][1] = 0;
            }
            __syncthreads();
            for (i = threadIdx.x; i < nn; i += MSV_GS_NT) {
                x = MSV_GS_VAL(i);
                uint32_t  u = msv_fkey(x);

                if (msv_gs_in(x, MSV_GS_ID(i), lo, bound) && (u & mask) == prefix) {
                    d = (double) x - md;
                    q = msv_weight(d);
                    if (q > 0) {
                        uint32_t  *c = S.wh[rd & 1][(u >> shift) & 255];
                        uint32_t   ql = (uint32_t) q, old;
                        uint32_t   qh = (uint32_t) (q >> 32);

                        old = atomicAdd(&c[0], ql);
                        qh += old + ql < old;       /* the carry */
                        if (qh != 0) {
                            atomicAdd(&c[1], qh);
                        }
                    }
                }
            }
            msv_gs_hist_sum(cl, S, rd & 1, true);
            digit = msv_gs_digit(S, 1, &dummy, &above, tau);
            prefix |= digit << shift;
            mask |= 255u << shift;
        }

        /* every id with this key weighs the same: take the fewest, in id
         * order, that reach tau */
        {
            uint64_t  qv = msv_weight((double) msv_fkey_value(prefix) - md);
            uint64_t  j;

            j = qv > 0 ? (uint64_t) ((tau - (double) above) / (double) qv)
                       : 1;
            if (j < 1) {
                j = 1;
            }
            while (j > 1 && (double) (above + (j - 1) * qv) >= tau) {
                j--;
            }
            while ((double) (above + j * qv) < tau) {
                j++;
            }
            id = msv_gs_cut(cl, S, xk, z, ix, nn, c0, prefix, lo, bound, j);
            xk += 2;
            q = ((uint64_t) (uint32_t) ~prefix << 32) | id;
            bound = q < bound ? q : bound;
        }
    }

    MSV_GS_MARK(6);

    /* 8. the race: argmax over S of z' + Gumbel, from the max's key */
    {
        double    best, key;
        uint32_t  tok = amax;
        float     zt = m;

        best = (double) m + msv_gumbel(msv_philox_bits(R.seed, R.t, amax));
        for (i = threadIdx.x; i < nn; i += MSV_GS_NT) {
            x = MSV_GS_VAL(i);
            id = MSV_GS_ID(i);
            if (id == amax || (double) x + MSV_GUMBEL_MAX < best
                || !msv_gs_in(x, id, lo, bound))
            {
                continue;
            }
            key = (double) x + msv_gumbel(msv_philox_bits(R.seed, R.t, id));
            if (msv_gs_better_d(best, tok, key, id)) {
                best = key;
                tok = id;
                zt = x;
            }
        }
        msv_gs_best_key(S, &best, &tok, &zt);
        msv_gs_exchange(cl, S, xk++, (uint64_t) __double_as_longlong(best),
                        tok, __float_as_uint(zt), 0);
        best = -INFINITY;
        tok = UINT32_MAX;
        for (r = 0; r < S.nr; r++) {
            key = __longlong_as_double((long long) S.g[r][0]);
            if (msv_gs_better_d(best, tok, key, (uint32_t) S.g[r][1])) {
                best = key;
                tok = (uint32_t) S.g[r][1];
                zt = __uint_as_float((uint32_t) S.g[r][2]);
            }
        }
        amax = tok;                     /* from here on: the token */
        x = zt;
    }

    if (!(fl & MSV_GS_CAPT)) {
        if (br == 0 && threadIdx.x == 0) {
            res[ri].token = (int32_t) amax;
            res[ri].logprob = 0.0f;
            res[ri].n_support = 0;
            res[ri].n_lps = 0;
            res[ri].n_top = 0;
            res[ri].bytes = msv_row_size(0, 0, 0);
        }
        goto update;
    }

    /* 9. capture: the exact logsumexp, S in id order, top logprobs */
    {
        const double  md = (double) m;
        const float   tokz = x;
        uint64_t      hi = 0, lo64 = 0, t, ns = 0, base = 0, nS = 0;
        uint32_t      tot, pre;
        double        L;

        for (i = threadIdx.x; i < nn; i += MSV_GS_NT) {
            x = MSV_GS_VAL(i);
            if (msv_gs_in(x, MSV_GS_ID(i), lo, bound)) {
                t = msv_lse_term((double) x - md);
                lo64 += t;
                hi += lo64 < t;
                ns++;
            }
        }
        msv_gs_sum128(S, &hi, &lo64);
        ns = msv_gs_sum64(S, ns);
        msv_gs_exchange(cl, S, xk++, hi, lo64, ns, 0);
        hi = 0;
        lo64 = 0;
        for (r = 0; r < S.nr; r++) {
            lo64 += S.g[r][1];
            hi += S.g[r][0] + (lo64 < S.g[r][1]);
            base += r < br ? S.g[r][2] : 0;
            nS += S.g[r][2];
        }
        L = msv_lse_log(hi, lo64);

        if (R.mode != MSV_MASK_OFF) {
            int32_t  *oi = out_ids + (size_t) ri * V + base;
            float    *ol = out_lps + (size_t) ri * V + base;

            for (uint32_t t0 = 0; t0 < nn; t0 += MSV_GS_NT) {
                i = t0 + threadIdx.x;
                x = i < nn ? MSV_GS_VAL(i) : -INFINITY;
                bool  p = i < nn && msv_gs_in(x, MSV_GS_ID(i), lo, bound);

                pre = msv_gs_scan(S, p, &tot);
                if (p) {
                    oi[pre] = (int32_t) (MSV_GS_ID(i));
                    if (R.mode == MSV_MASK_SUPPORT) {
                        ol[pre] = msv_lp((double) x - md, L);
                    }
                }
                oi += tot;
                ol += tot;
            }
        }

        uint32_t  nt = 0;

        if (R.logprobs > 0) {
            uint64_t  tb = bound;

            nt = (uint64_t) R.logprobs < nS ? (uint32_t) R.logprobs
                                            : (uint32_t) nS;
            if (nt < nS) {
                tb = msv_gs_select_k(cl, S, xk, z, ix, nn, c0, lo, bound, nt);
                xk += 3;
            }
            for (i = threadIdx.x; i < nn; i += MSV_GS_NT) {
                x = MSV_GS_VAL(i);
                if (msv_gs_in(x, MSV_GS_ID(i), lo, tb)) {
                    uint32_t  at = atomicAdd(&res[ri].top_fill, 1u);

                    top_key[(size_t) ri * max_lp + at] =
                        msv_rank_key(x, MSV_GS_ID(i));
                    top_lp[(size_t) ri * max_lp + at] =
                        msv_lp((double) x - md, L);
                }
            }
        }

        if (br == 0 && threadIdx.x == 0) {
            uint32_t  nsup = R.mode != MSV_MASK_OFF ? (uint32_t) nS : 0;
            uint32_t  nl = R.mode == MSV_MASK_SUPPORT ? nsup
                           : (R.mode == MSV_MASK_SELECTED ? 1 : 0);

            res[ri].token = (int32_t) amax;
            res[ri].logprob = msv_lp((double) tokz - md, L);
            res[ri].n_support = nsup;
            res[ri].n_lps = nl;
            res[ri].n_top = nt;
            res[ri].bytes = msv_row_size(nsup, nl, nt);
        }
    }

update:
    MSV_GS_MARK(7);
    msv_gs_update(cl, S, R, st, V, c0, n, amax);
    return bk;
}


__global__ void __cluster_dims__(MSV_GS_CLUSTER, 1, 1)
__launch_bounds__(MSV_GS_THREADS, 2)
msv_sample_kernel(float *logits, uint32_t V, uint32_t chunk,
    const struct msv_gs_row *rows, struct msv_gs_state st,
    int32_t *out_ids, float *out_lps, uint64_t *top_key, float *top_lp,
    uint32_t max_lp, struct msv_gs_res *res, const uint32_t *slow,
    long long *prof)
{
    cg::cluster_group            cl = cg::this_cluster();
    extern __shared__ float      z[];
    __shared__ msv_gs_smem       S;
    __shared__ uint16_t          sx[MSV_GS_CAP];    /* candidates' offsets */
    __shared__ uint32_t          rwh[MSV_GS_WARPS][MSV_GS_NB];  /* bins */

    const uint32_t  br = cl.block_rank();
    const uint32_t  ri = blockIdx.x / MSV_GS_CLUSTER;
    const struct msv_gs_row  R = rows[ri];
    const uint32_t  c0 = br * chunk;
    const uint32_t  n = c0 < V ? (V - c0 < chunk ? V - c0 : chunk) : 0;
    const uint32_t  fl = R.flags;
    const float    *src = logits + (size_t) R.lrow * V + c0;

    uint32_t  i, id, cnt, amax, n_fin, r;
    float     x, m, lo;

    /* a row the streaming kernel finished (every block reads the same) */
    if (slow != NULL && slow[ri] == 0) {
        return;
    }
    msv_gs_res_clear(cl, res, ri);
    msv_gs_start(cl, S);
    MSV_GS_MARK(0);
    int       xk = 0;

    const uint16_t  *ix = NULL;     /* candidates compacted (see 5.) */
    uint32_t         nn;            /* elements of the slice in use */
    uint64_t         n1;            /* finite logits >= lo */

    /*
     * 0-4. Processing: sanitize, logit_bias, penalties, min_tokens,
     * temperature, then the max, the lowest id of the max and the count
     * of finite logits.  Rows without bias or an active min_tokens mask
     * (nearly all) do it in the same pass that loads the slice.
     */
    const uint32_t  nb = st.n_bias[R.slot];
    const uint32_t  nm = (fl & MSV_GS_MASKON) ? st.n_mask[R.slot] : 0;
    const int32_t  *mk = st.mask + (size_t) R.slot * MSV_GS_MAX_MASK;
    const float     temp = (fl & MSV_GS_GREEDY) ? 1.0f : R.temp;
    const bool      pen = (fl & (MSV_GS_REP | MSV_GS_FREQ)) != 0;
    const bool      fused = nb == 0 && nm == 0;
    const uint32_t *cn = st.count + (size_t) R.slot * V;
    const uint32_t *sn = st.seen + (size_t) R.slot * st.words;

    if (fused) {
        m = -INFINITY;
        amax = UINT32_MAX;
        cnt = 0;
        /* four at a time where the slice allows 16-byte loads; ids rise
         * along each thread's elements either way */
        const uint32_t  n4 = ((V & 3) == 0) ? n & ~3u : 0;

#pragma unroll 2
        for (i = threadIdx.x * 4; i < n4; i += MSV_GS_THREADS * 4) {
            float4  v4 = *(const float4 *) (src + i);
            float   e4[4] = { v4.x, v4.y, v4.z, v4.w };

#pragma unroll
            for (uint32_t l = 0; l < 4; l++) {
                x = msv_clean(e4[l]);
                if (pen) {
                    x = msv_gs_penalize(x, c0 + i + l, fl, R, sn, cn);
                }
                if (temp != 1.0f) {
                    x = msv_temp_div(x, temp);
                }
                z[i + l] = x;
                msv_gs_note(x, c0 + i + l, &m, &amax, &cnt);
            }
        }
        for (i = n4 + threadIdx.x; i < n; i += MSV_GS_THREADS) {
            x = msv_clean(src[i]);
            if (pen) {
                x = msv_gs_penalize(x, c0 + i, fl, R, sn, cn);
            }
            if (temp != 1.0f) {
                x = msv_temp_div(x, temp);
            }
            z[i] = x;
            msv_gs_note(x, c0 + i, &m, &amax, &cnt);
        }
    } else {
        for (i = threadIdx.x; i < n; i += MSV_GS_THREADS) {
            z[i] = msv_clean(src[i]);
        }
        __syncthreads();

        /* logit_bias: entries sorted by id (stably), so one thread runs
         * each id's entries in request order */
        const int32_t  *bid = st.bias_id + (size_t) R.slot * MSV_MAX_BIAS;
        const float    *bv = st.bias_val + (size_t) R.slot * MSV_MAX_BIAS;

        for (i = threadIdx.x; i < nb; i += MSV_GS_THREADS) {
            id = (uint32_t) bid[i];
            if ((i > 0 && bid[i - 1] == bid[i]) || id < c0 || id >= c0 + n) {
                continue;
            }
            x = z[id - c0];
            for (uint32_t j = i; j < nb && bid[j] == bid[i]; j++) {
                x = msv_bias_add(x, bv[j]);
            }
            z[id - c0] = x;
        }
        __syncthreads();

        if (pen) {
            for (i = threadIdx.x; i < n; i += MSV_GS_THREADS) {
                z[i] = msv_gs_penalize(z[i], c0 + i, fl, R, sn, cn);
            }
            __syncthreads();
        }

        /* min_tokens: mask the stop and eos ids (distinct), keeping what
         * they were in case nothing else is finite */
        if (nm > 0) {
            if (threadIdx.x < nm) {
                id = (uint32_t) mk[threadIdx.x];
                if (id >= c0 && id < c0 + n) {
                    S.saved[threadIdx.x] = z[id - c0];
                    z[id - c0] = -INFINITY;
                }
            }
            __syncthreads();
        }
    }

    for (int pass = 0; pass < 2; pass++) {
        if (!(fused && pass == 0)) {
            m = -INFINITY;
            amax = UINT32_MAX;
            cnt = 0;
            for (i = threadIdx.x; i < n; i += MSV_GS_THREADS) {
                x = z[i];
                if (pass == 0 && temp != 1.0f) {
                    x = msv_temp_div(x, temp);
                    z[i] = x;
                }
                msv_gs_note(x, c0 + i, &m, &amax, &cnt);
            }
        }
        MSV_GS_MARK(1);
        msv_gs_best(S, &m, &amax, &cnt);
        msv_gs_exchange(cl, S, xk++, __float_as_uint(m), amax, cnt, 0);
        MSV_GS_MARK(2);
        m = -INFINITY;
        amax = UINT32_MAX;
        n_fin = 0;
        for (r = 0; r < S.nr; r++) {
            x = __uint_as_float((uint32_t) S.g[r][0]);
            if (msv_gs_better(m, amax, x, (uint32_t) S.g[r][1])) {
                m = x;
                amax = (uint32_t) S.g[r][1];
            }
            n_fin += (uint32_t) S.g[r][2];
        }
        if (n_fin > 0 || nm == 0 || pass == 1) {
            break;
        }
        /* the mask took every finite logit: it does not apply */
        if (threadIdx.x < nm) {
            id = (uint32_t) mk[threadIdx.x];
            if (id >= c0 && id < c0 + n) {
                x = S.saved[threadIdx.x];
                z[id - c0] = temp != 1.0f ? msv_temp_div(x, temp) : x;
            }
        }
        __syncthreads();
    }

    if (n_fin == 0) {
        if (br == 0 && threadIdx.x == 0) {
            msv_gs_emit_max(R, ri, V, false, m, amax, out_ids, out_lps,
                            top_key, top_lp, max_lp, res);
        }
        cl.sync();
        return;
    }

    /* greedy: the first id in rank order */
    if (fl & MSV_GS_GREEDY) {
        if (br == 0 && threadIdx.x == 0) {
            msv_gs_emit_max(R, ri, V, true, m, amax, out_ids, out_lps,
                            top_key, top_lp, max_lp, res);
        }
        MSV_GS_MARK(7);
        msv_gs_update(cl, S, R, st, V, c0, n, amax);
        return;
    }

    /* 5. min_p: a float floor */
    lo = msv_floor(m, (fl & MSV_GS_MINP) ? log((double) R.min_p)
                                         : -INFINITY);

    /*
     * Candidates: with any truncation, S lies within the first few bins
     * of the rank order (enough bins for top_k ids; the ids with a top-p
     * weight; the min_p floor).  When every block's share fits, the
     * candidates are compacted in id order to the front of the slice and
     * every later stage runs over them alone.
     */
    nn = n;
    n1 = n_fin;

    if (fl & (MSV_GS_TOPK | MSV_GS_TOPP | MSV_GS_MINP)) {
        uint32_t  bsel = MSV_GS_NB - 1, own = 0, most = 0;

        /* a histogram per warp (in the selection histograms' space, free
         * until then), so atomics contend within a warp only */
        uint32_t  (*wh)[MSV_GS_NB] = rwh;

        for (i = threadIdx.x; i < MSV_GS_WARPS * MSV_GS_NB;
             i += MSV_GS_THREADS)
        {
            wh[0][i] = 0;
        }
        __syncthreads();
        for (i = threadIdx.x; i < n; i += MSV_GS_THREADS) {
            x = z[i];
            if (x >= lo) {
                atomicAdd(&wh[threadIdx.x >> 5][msv_gs_bin(m, x)], 1u);
            }
        }
        bsel = msv_gs_bins(cl, S, R, wh, &n1);
        uint32_t  all = 0;

        for (i = threadIdx.x; i <= bsel; i += MSV_GS_THREADS) {
            own += S.bh[i];
            all += S.bs[i];
        }
        own = (uint32_t) msv_gs_sum64(S, own);
        all = (uint32_t) msv_gs_sum64(S, all);
        MSV_GS_MARK(3);
        /* every share fits if all of them together do; otherwise ask */
        most = all;
        if (all > MSV_GS_CAP) {
            msv_gs_exchange(cl, S, xk++, own, 0, 0, 0);
            most = 0;
            for (r = 0; r < S.nr; r++) {
                most = S.g[r][0] > most ? (uint32_t) S.g[r][0] : most;
            }
        }

        if (most <= MSV_GS_CAP) {
            /* each thread a run of the slice: count, one scan, write */
            const uint32_t  seg = (n + MSV_GS_THREADS - 1) / MSV_GS_THREADS;
            const uint32_t  a0 = threadIdx.x * seg;
            const uint32_t  a1 = a0 + seg < n ? a0 + seg : n;
            uint32_t        c = 0, tot, at;

            for (i = a0; i < a1; i++) {
                x = z[i];
                c += x >= lo && msv_gs_bin(m, x) <= bsel;
            }
            at = msv_gs_xscan(S, c, &tot);
            for (i = a0; i < a1 && c > 0; i++) {
                x = z[i];
                if (x >= lo && msv_gs_bin(m, x) <= bsel) {
                    sx[at++] = (uint16_t) i;
                    c--;
                }
            }
            if (threadIdx.x == 0) {
                S.own = tot;
            }
            __syncthreads();
            ix = sx;
            nn = tot;

            /*
             * Few enough candidates for one block: every block moves its
             * candidates' values to the front of its slice, block 0
             * copies them all (values, ids) into its own and goes on
             * alone, with block barriers instead of cluster barriers.
             */
            const uint32_t  G = chunk / 2;

            MSV_GS_MARK(4);

            if (all > 0 && all <= G) {
                float  v[MSV_GS_CAP / MSV_GS_THREADS];

#pragma unroll
                for (uint32_t k = 0; k < MSV_GS_CAP / MSV_GS_THREADS; k++) {
                    uint32_t  j = threadIdx.x + k * MSV_GS_THREADS;

                    v[k] = j < nn ? z[ix[j]] : 0.0f;
                }
                __syncthreads();
#pragma unroll
                for (uint32_t k = 0; k < MSV_GS_CAP / MSV_GS_THREADS; k++) {
                    uint32_t  j = threadIdx.x + k * MSV_GS_THREADS;

                    if (j < nn) {
                        z[j] = v[k];
                    }
                }
                /* every slice's front is written before block 0 reads */
                cl.sync();
                if (br == 0) {
                    uint32_t  *gid = (uint32_t *) (z + G);
                    uint32_t   at = 0;

                    for (r = 0; r < MSV_GS_CLUSTER; r++) {
                        const float     *rz = cl.map_shared_rank(z, r);
                        const uint16_t  *rx = cl.map_shared_rank(sx, r);
                        const uint32_t   nr_ = *cl.map_shared_rank(&S.own, r);

                        for (uint32_t j = threadIdx.x; j < nr_;
                             j += MSV_GS_THREADS)
                        {
                            if (r > 0) {
                                z[at + j] = rz[j];
                            }
                            gid[at + j] = r * chunk + rx[j];
                        }
                        at += nr_;
                    }
                }
                /* block 0 has read every other block's shared memory */
                cl.sync();
                if (br != 0) {
                    return;
                }
                if (threadIdx.x == 0) {
                    S.nr = 1;
                    S.gid = (uint32_t *) (z + G);
                }
                __syncthreads();
                ix = NULL;
                nn = all;
            }
        }
    }

    (void) msv_gs_finish(cl, S, R, ri, xk, z, ix, nn, c0, n, V, m, amax, lo,
                         n1, st, out_ids, out_lps, top_key, top_lp, max_lp,
                         res, prof);
}


/* ------------------------------------------------------------------ */
/* The streaming kernel: candidates only in shared memory               */

/*
 * A cluster of MSV_GS_CLUSTER blocks still takes a row, but a block keeps
 * only the candidates of its slice, not the slice: its warps each walk a
 * span of the slice once, in id order, and keep the logits at or above a
 * floor t predicted from the request's previous step (st.pred_t) in a
 * region of their own.  One exchange gives the max and how many logits
 * are >= t; the candidates are the whole support whenever
 *   - top_k: at least k logits are >= t (the k best are then >= t), or
 *   - min_p: t <= the min_p floor, or
 *   - top_p alone: t is below every logit with a top-p weight,
 * and no warp's region overflowed.  Otherwise the row reads its slice
 * twice more (from L2, mostly: it read it a moment ago): a histogram of
 * the bins below the max, as the resident kernel makes, then the
 * compaction of the bins that hold the support.  Rows whose candidates
 * do not fit even then, and rows this kernel does not take (logit bias,
 * an active min_tokens mask, no truncation at all), are left to the
 * resident kernel (slow[row] = 1).  Stages 6-9 are the resident
 * kernel's, on the candidates: the result is the same, bit for bit.
 *
 * A block has 128 threads and ~26 KB of shared memory (the resident
 * kernel's: 512 and ~105 KB), so eight fit an SM and up to four times
 * as many rows are in flight; each logit is read from device memory
 * once when the prediction holds.
 */
#define MSV_GS_ST_THREADS 128
#define MSV_GS_ST_WARPS   (MSV_GS_ST_THREADS / 32)
#define MSV_GS_WCAP       512       /* candidates a warp keeps */
#define MSV_GS_ST_CAP     (MSV_GS_ST_WARPS * MSV_GS_WCAP)
#define MSV_GS_PRED_MAX   12288     /* candidates a prediction aims at */

/* A logit as every stage sees it (rows here have no bias and no mask).
 * PROC 0: cleaned only (temperature 1, no penalties); 1: and divided by
 * the temperature; 2: whatever the row asks. */
template <int PROC>
static __device__ __forceinline__ float
msv_gs_proc(float raw, uint32_t id, uint32_t fl, const struct msv_gs_row &R,
    const uint32_t *sn, const uint32_t *cn, float temp)
{
    float  x = msv_clean(raw);

    if (PROC == 2 && (fl & (MSV_GS_REP | MSV_GS_FREQ))) {
        x = msv_gs_penalize(x, id, fl, R, sn, cn);
    }
    if (PROC == 1 || (PROC == 2 && temp != 1.0f)) {
        x = msv_temp_div(x, temp);
    }
    return x;
}

/* Keep the logits of one step of a warp (up to 8 a lane, in id order
 * across the warp: lane-major within each group of four) where p[] is
 * set, at the warp's count; returns the new count (which may pass
 * MSV_GS_WCAP: those beyond are counted, not kept). */
static __device__ __forceinline__ uint32_t
msv_gs_keep4(uint32_t kept, const float *x, const bool *p, uint32_t id0,
    float *wz, uint32_t *wi)
{
    const uint32_t  lt = (1u << (threadIdx.x & 31)) - 1;
    uint32_t        b[4], at = kept, tot = 0;

    if (!__any_sync(0xffffffffu, p[0] | p[1] | p[2] | p[3])) {
        return kept;                    /* most steps of a walk */
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        b[j] = __ballot_sync(0xffffffffu, p[j]);
        at += __popc(b[j] & lt);
        tot += __popc(b[j]);
    }
    if (b[0] | b[1] | b[2] | b[3]) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (p[j]) {
                if (at < MSV_GS_WCAP) {
                    wz[at] = x[j];
                    wi[at] = id0 + j;
                }
                at++;
            }
        }
    }
    return kept + tot;
}

/*
 * One walk of a warp over its span [a0, a1) of the slice (ids c0 + i),
 * MSV_GS_UNROLL loads a lane in flight.
 * MODE 0: note the max, its id and the finite count, keep x >= t.
 * MODE 1: keep x >= lo within bins <= bsel below m.
 * MODE 2: count x >= lo into the warp's bins hist[] (no keeping).
 * MODE 3 (PROC 0 or 1: processing is monotone): the largest raw logit
 * into *m, keep raw x >= t (t: the raw floor, msv_gs_raw_floor), and
 * process only the logits kept.
 */
#ifndef MSV_GS_UNROLL
#define MSV_GS_UNROLL 3
#endif

template <int MODE, bool VEC, int PROC>
static __device__ __forceinline__ uint32_t
msv_gs_walk(const float *src, uint32_t a0, uint32_t a1, uint32_t c0,
    uint32_t fl, const struct msv_gs_row &R, const uint32_t *sn,
    const uint32_t *cn, float temp, float t, float lo, float mref,
    uint32_t bsel, float *wz, uint32_t *wi, uint32_t *hist, float *m,
    uint32_t *amax, uint32_t *cnt)
{
    const uint32_t  lane = threadIdx.x & 31;
    const uint32_t  sub = VEC ? 128u : 32u;     /* ids a load of the warp */
    const uint32_t  nj = VEC ? 4 : 1;           /* ids a lane a load */
    uint32_t        kept = 0;

    for (uint32_t b = a0; b < a1; b += sub * MSV_GS_UNROLL) {
        const bool  full = b + sub * MSV_GS_UNROLL <= a1;
        float       x[MSV_GS_UNROLL][4];

        /* every load first */
#pragma unroll
        for (int u = 0; u < MSV_GS_UNROLL; u++) {
            const uint32_t  i0 = b + u * sub + lane * nj;

            if (VEC && (full || i0 + 3 < a1)) {
                float4  v = __ldg((const float4 *) (src + i0));

                x[u][0] = v.x;
                x[u][1] = v.y;
                x[u][2] = v.z;
                x[u][3] = v.w;
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    x[u][j] = j < (int) nj && i0 + j < a1 ? __ldg(src + i0 + j)
                                                          : -INFINITY;
                }
            }
        }

#pragma unroll
        for (int u = 0; u < MSV_GS_UNROLL; u++) {
            const uint32_t  i0 = b + u * sub + lane * nj;
            bool            p[4] = { false, false, false, false };

            if (MODE == 3) {
                /* out of the span: -inf, which neither raises the max
                 * nor passes a finite floor */
#pragma unroll
                for (int j = 0; j < (int) nj; j++) {
                    *m = fmaxf(*m, x[u][j]);
                    p[j] = x[u][j] >= t;
                }
                if (__any_sync(0xffffffffu, p[0] | p[1] | p[2] | p[3])) {
#pragma unroll
                    for (int j = 0; j < (int) nj; j++) {
                        if (p[j]) {
                            x[u][j] = msv_gs_proc<PROC>(x[u][j], c0 + i0 + j,
                                                        fl, R, sn, cn, temp);
                        }
                    }
                    kept = msv_gs_keep4(kept, x[u], p, c0 + i0, wz, wi);
                }
            }
#pragma unroll
            for (int j = 0; j < (MODE == 3 ? 0 : (int) nj); j++) {
                if (full || i0 + j < a1) {
                    x[u][j] = msv_gs_proc<PROC>(x[u][j], c0 + i0 + j, fl, R,
                                                sn, cn, temp);
                }
                if (MODE == 0) {
                    msv_gs_note(x[u][j], c0 + i0 + j, m, amax, cnt);
                    p[j] = x[u][j] >= t;
                } else if (MODE == 1) {
                    p[j] = x[u][j] >= lo && msv_gs_bin(mref, x[u][j]) <= bsel;
                } else if (x[u][j] >= lo) {
                    atomicAdd(&hist[msv_gs_bin(mref, x[u][j])], 1u);
                }
            }
            if (MODE == 0 || MODE == 1) {
                /* lane-major groups of four (one a lane when scalar): id
                 * order across the warp */
                kept = msv_gs_keep4(kept, x[u], p, c0 + i0, wz, wi);
            }
        }
    }
    return kept;
}

/* The walk for the row's kind: 16-byte loads or not, and how much of the
 * processing it asks for. */
template <int MODE>
static __device__ __forceinline__ uint32_t
msv_gs_walk_any(bool vec, int proc, const float *src, uint32_t a0,
    uint32_t a1, uint32_t c0, uint32_t fl, const struct msv_gs_row &R,
    const uint32_t *sn, const uint32_t *cn, float temp, float t, float lo,
    float mref, uint32_t bsel, float *wz, uint32_t *wi, uint32_t *hist,
    float *m, uint32_t *amax, uint32_t *cnt)
{
    /* MODE 3 runs for monotone processing only: no PROC 2 of it */
    constexpr int  P2 = MODE == 3 ? 1 : 2;

#define MSV_GS_W(V_, P_)                                                 \
    msv_gs_walk<MODE, V_, P_>(src, a0, a1, c0, fl, R, sn, cn, temp, t, lo,\
                              mref, bsel, wz, wi, hist, m, amax, cnt)
    if (vec) {
        return proc == 0 ? MSV_GS_W(true, 0)
               : proc == 1 ? MSV_GS_W(true, 1) : MSV_GS_W(true, P2);
    }
    return proc == 0 ? MSV_GS_W(false, 0)
           : proc == 1 ? MSV_GS_W(false, 1) : MSV_GS_W(false, P2);
#undef MSV_GS_W
}

/*
 * The raw floor of a processed floor t, for monotone processing (PROC 0:
 * cleaning; 1: and the temperature): the smallest raw float r with P(r)
 * >= t, so that P(x) >= t exactly when x >= r (NaN: P(x) >= t for no x).
 */
static __device__ float
msv_gs_raw_floor(float t, int proc, float temp)
{
    float  r, q;

    if (!(t >= -FLT_MAX && t <= FLT_MAX)) {
        return NAN;
    }
    if (proc == 0) {
        return t;                       /* clean is the identity on finite
                                           floats, +inf becomes FLT_MAX */
    }
#define MSV_GS_P(x) msv_temp_div(msv_clean(x), temp)
    if (MSV_GS_P(FLT_MAX) < t) {
        return NAN;
    }
    if (MSV_GS_P(-FLT_MAX) >= t) {
        return -FLT_MAX;
    }
    r = (float) ((double) t * (double) temp);
    if (!(r >= -FLT_MAX)) {
        r = -FLT_MAX;
    } else if (!(r <= FLT_MAX)) {
        r = FLT_MAX;
    }
    while (MSV_GS_P(r) < t) {
        r = nextafterf(r, INFINITY);
    }
    for ( ;; ) {
        q = nextafterf(r, -INFINITY);
        if (q < -FLT_MAX || MSV_GS_P(q) < t) {
            return r;
        }
        r = q;
    }
#undef MSV_GS_P
}

__global__ void
__launch_bounds__(MSV_GS_ST_THREADS, 8)
msv_sample_stream_kernel(const float *logits, uint32_t V, uint32_t chunk,
    const struct msv_gs_row *rows, struct msv_gs_state st,
    int32_t *out_ids, float *out_lps, uint64_t *top_key, float *top_lp,
    uint32_t max_lp, struct msv_gs_res *res, uint32_t *slow,
    unsigned long long *paths, long long *prof)
{
    cg::cluster_group        cl = cg::this_cluster();
    extern __shared__ float  cz[];              /* candidates' values */
    __shared__ msv_gs_smem   S;
    __shared__ uint32_t      wk[MSV_GS_ST_WARPS];       /* kept a warp */

    uint32_t        *cid = (uint32_t *) (cz + MSV_GS_ST_CAP);
    const uint32_t   br = cl.block_rank();
    const uint32_t   nc = cl.num_blocks();      /* the launch's: 8 or 4 */
    const uint32_t   ri = blockIdx.x / nc;
    const uint32_t   pmax = nc * (MSV_GS_PRED_MAX / MSV_GS_CLUSTER);
    const struct msv_gs_row  R = rows[ri];
    const uint32_t   c0 = br * chunk;
    const uint32_t   n = c0 < V ? (V - c0 < chunk ? V - c0 : chunk) : 0;
    const uint32_t   fl = R.flags;
    const float     *src = logits + (size_t) R.lrow * V + c0;
    const uint32_t   w = threadIdx.x >> 5, lane = threadIdx.x & 31;

    msv_gs_res_clear(cl, res, ri);
    if (!(fl & MSV_GS_FAST)) {
        if (br == 0 && threadIdx.x == 0) {
            slow[ri] = 1;
            atomicAdd(&paths[2], 1ull);
            atomicAdd(&paths[3], 1ull);
        }
        return;
    }
    msv_gs_start(cl, S);
    MSV_GS_MARK(0);

    const float     temp = (fl & MSV_GS_GREEDY) ? 1.0f : R.temp;
    const bool      pen = (fl & (MSV_GS_REP | MSV_GS_FREQ)) != 0;
    const int       proc = pen ? 2 : (temp != 1.0f ? 1 : 0);
    const bool      raw = proc != 2 && !(fl & MSV_GS_GREEDY);
    const uint32_t *cn = st.count + (size_t) R.slot * V;
    const uint32_t *sn = st.seen + (size_t) R.slot * st.words;
    const bool      vec = (V & 3) == 0;
    const float     t = (fl & MSV_GS_GREEDY) ? NAN : st.pred_t[R.slot];
    /* each warp a span of the slice, a multiple of 4 ids long */
    const uint32_t  wl = ((n + MSV_GS_ST_WARPS - 1) / MSV_GS_ST_WARPS + 3)
                         & ~3u;
    const uint32_t  a0 = w * wl < n ? w * wl : n;
    const uint32_t  a1 = a0 + wl < n ? a0 + wl : n;
    float          *wz = cz + w * MSV_GS_WCAP;
    uint32_t       *wi = cid + w * MSV_GS_WCAP;

    float     m = -INFINITY, lo, t_hist = NAN, t_cap = NAN;
    uint32_t  amax = UINT32_MAX, cnt = 0, kept, r, i;
    uint64_t  n_fin = 0, kc = 0, n1, all, base = 0;
    bool      ovf = false, hit;
    int       xk = 0;

    /* 1. the walk: processing, the max, the predicted candidates */
    if (raw) {
        const float  rt = msv_gs_raw_floor(t, proc, temp);

        kept = msv_gs_walk_any<3>(vec, proc, src, a0, a1, c0, fl, R, sn, cn,
                                  temp, rt, 0.0f, 0.0f, 0, wz, wi, NULL, &m,
                                  NULL, NULL);
        /* the max of the processed logits is the processed raw max; its
         * lowest id is found among the candidates (it is one of them
         * whenever they hold the support) */
        m = msv_clean(m);
        if (proc == 1) {
            m = msv_temp_div(m, temp);
        }
        cnt = m != -INFINITY;
    } else {
        kept = msv_gs_walk_any<0>(vec, proc, src, a0, a1, c0, fl, R, sn, cn,
                                  temp, t, 0.0f, 0.0f, 0, wz, wi, NULL, &m,
                                  &amax, &cnt);
    }
    if (lane == 0) {
        wk[w] = kept;
    }
    msv_gs_best(S, &m, &amax, &cnt);            /* wk[] is visible after */
    {
        uint64_t  kb = 0;

        for (i = 0; i < MSV_GS_ST_WARPS; i++) {
            kb += wk[i];
            ovf |= wk[i] > MSV_GS_WCAP;
        }
        msv_gs_exchange(cl, S, xk++, __float_as_uint(m), amax, cnt,
                        kb | ((uint64_t) ovf << 32));
    }
    m = -INFINITY;
    amax = UINT32_MAX;
    ovf = false;
    for (r = 0; r < nc; r++) {
        float  x = __uint_as_float((uint32_t) S.g[r][0]);

        if (msv_gs_better(m, amax, x, (uint32_t) S.g[r][1])) {
            m = x;
            amax = (uint32_t) S.g[r][1];
        }
        n_fin += (uint32_t) S.g[r][2];
        kc += (uint32_t) S.g[r][3];
        base += r < br ? (uint32_t) S.g[r][3] : 0;
        ovf |= (S.g[r][3] >> 32) != 0;
    }
    MSV_GS_MARK(1);

    if (n_fin == 0 || (fl & MSV_GS_GREEDY)) {
        if (br == 0 && threadIdx.x == 0) {
            msv_gs_emit_max(R, ri, V, n_fin > 0, m, amax, out_ids, out_lps,
                            top_key, top_lp, max_lp, res);
            slow[ri] = 0;
            atomicAdd(&paths[0], 1ull);
        }
        MSV_GS_MARK(7);
        if (n_fin > 0) {
            msv_gs_update(cl, S, R, st, V, c0, n, amax);
        } else {
            cl.sync();
        }
        return;
    }

    lo = msv_floor(m, (fl & MSV_GS_MINP) ? log((double) R.min_p)
                                         : -INFINITY);
    hit = !ovf
          && (((fl & MSV_GS_TOPK) && kc >= (uint64_t) R.top_k)
              || ((fl & MSV_GS_MINP) && t <= lo)
              || ((fl & MSV_GS_TOPP) && !(fl & (MSV_GS_TOPK | MSV_GS_MINP))
                  && t <= m && msv_gs_bin(m, t) > MSV_GS_QBIN));
    MSV_GS_MARK(2);

    if (!hit) {
        /* 2. the bins below the max, a histogram a warp (S.h's space) */
        uint32_t  (*wh)[MSV_GS_NB] = (uint32_t (*)[MSV_GS_NB]) &S.h[0][0];
        uint32_t  bsel = MSV_GS_NB - 1, need = 0, fits;

        for (i = threadIdx.x; i < MSV_GS_ST_WARPS * MSV_GS_NB;
             i += MSV_GS_ST_THREADS)
        {
            wh[0][i] = 0;
        }
        __syncthreads();
        (void) msv_gs_walk_any<2>(vec, proc, src, a0, a1, c0, fl, R, sn, cn,
                                  temp, 0.0f, lo, m, 0, NULL, NULL, wh[w],
                                  NULL, NULL, NULL);
        bsel = msv_gs_bins(cl, S, R, wh, &n1);
        /* the floor to predict for the next step: the bins holding about
         * one and a half times what this one needs */
        {
            uint64_t  T = pmax / 2;
            uint32_t  bt;

            if ((fl & MSV_GS_TOPK) && (uint64_t) R.top_k < n1) {
                T = (uint64_t) R.top_k + R.top_k / 2 + 32;
                T = T < pmax ? T : pmax;
            }
            bt = msv_gs_bin_of_k(S, T);
            t_hist = __fsub_rn(m, (float) (bt + 1) / MSV_GS_BIN_SCALE);
            if ((fl & MSV_GS_MINP) && __fsub_rn(lo, 0.25f) > t_hist) {
                t_hist = __fsub_rn(lo, 0.25f);
            }
            /* and the lowest floor that keeps at most pmax */
            bt = msv_gs_bin_of_k(S, pmax);
            t_cap = bt + 1 < MSV_GS_NB
                    ? __fsub_rn(m, (float) bt / MSV_GS_BIN_SCALE) : -FLT_MAX;
        }
        /* this warp's share of the bins kept */
        for (i = lane; i <= bsel; i += 32) {
            need += wh[w][i];
        }
        for (int o = 16; o > 0; o >>= 1) {
            need += __shfl_down_sync(0xffffffffu, need, o);
        }
        if (lane == 0) {
            wk[w] = need;
        }
        __syncthreads();
        fits = 1;
        for (i = 0; i < MSV_GS_ST_WARPS; i++) {
            fits &= wk[i] <= MSV_GS_WCAP;
        }
        msv_gs_exchange(cl, S, xk++, fits, 0, 0, 0);
        for (r = 0; r < nc; r++) {
            fits &= (uint32_t) S.g[r][0];
        }
        if (!fits) {
            /* too many candidates for the regions: the resident kernel */
            if (br == 0 && threadIdx.x == 0) {
                st.pred_t[R.slot] = NAN;
                slow[ri] = 1;
                atomicAdd(&paths[2], 1ull);
                atomicAdd(&paths[3], 1ull);
            }
            cl.sync();
            return;
        }
        /* 3. the compaction of the kept bins */
        __syncthreads();
        kept = msv_gs_walk_any<1>(vec, proc, src, a0, a1, c0, fl, R, sn, cn,
                                  temp, 0.0f, lo, m, bsel, wz, wi, NULL,
                                  NULL, NULL, NULL);
        if (lane == 0) {
            wk[w] = kept;
        }
    }
    MSV_GS_MARK(3);

    /* the rest of each region holds NaN: no stage takes a NaN */
    __syncwarp();
    kept = wk[w];
    for (i = kept + lane; i < MSV_GS_WCAP; i += 32) {
        wz[i] = NAN;
    }
    if (threadIdx.x == 0) {
        S.flag = UINT32_MAX;
    }
    __syncthreads();
    if (hit && !(fl & MSV_GS_MINP) && kc <= MSV_GS_ST_CAP) {
        /* every candidate is finite and >= lo, the first exchange said
         * how many there are, and block 0 will hold them all */
        all = kc;
        n1 = kc;
    } else {
        uint64_t  own = 0, nlo = 0;

        for (i = 0; i < MSV_GS_ST_WARPS; i++) {
            own += wk[i];
        }
        for (i = threadIdx.x; i < MSV_GS_ST_CAP; i += MSV_GS_ST_THREADS) {
            nlo += cz[i] >= lo;
            /* ids rise with the position: the first is the lowest */
            if (amax == UINT32_MAX && cz[i] == m) {
                atomicMin(&S.flag, cid[i]);
            }
        }
        nlo = msv_gs_sum64(S, nlo);         /* S.flag is final after */
        msv_gs_exchange(cl, S, xk++, own, nlo, S.flag, 0);
        all = 0;
        n1 = 0;
        base = 0;
        for (r = 0; r < nc; r++) {
            all += S.g[r][0];
            n1 += S.g[r][1];
            base += r < br ? S.g[r][0] : 0;
            amax = (uint32_t) S.g[r][2] < amax ? (uint32_t) S.g[r][2] : amax;
        }
    }
    MSV_GS_MARK(4);

    uint32_t  nn = MSV_GS_ST_CAP;

    if (all <= MSV_GS_ST_CAP) {
        /*
         * Few enough for block 0: every block writes its candidates, in
         * slice order, at its place in the row's scratch (the support's
         * ids and logprobs, which capture writes only later), and block 0
         * reads them all back and goes on alone.  The cluster barrier
         * orders the writes before the reads.
         */
        float     *gz = out_lps + (size_t) ri * V;
        int32_t   *gi = out_ids + (size_t) ri * V;
        uint32_t   off = (uint32_t) base;

        for (i = 0; i < w; i++) {
            off += wk[i];
        }
        for (i = lane; i < kept; i += 32) {
            gz[off + i] = wz[i];
            gi[off + i] = (int32_t) wi[i];
        }
        cl.sync();
        if (br != 0) {
            return;
        }
        for (i = threadIdx.x; i < all; i += MSV_GS_ST_THREADS) {
            cz[i] = __ldcg(gz + i);
            cid[i] = (uint32_t) __ldcg(gi + i);
        }
        if (threadIdx.x == 0) {
            S.nr = 1;
        }
        nn = (uint32_t) all;
        if (amax == UINT32_MAX) {
            __syncthreads();
            for (i = threadIdx.x; i < nn; i += MSV_GS_ST_THREADS) {
                if (cz[i] == m) {
                    atomicMin(&S.flag, cid[i]);
                }
            }
            __syncthreads();
            amax = S.flag;
        }
    }
    if (amax == UINT32_MAX) {
        /* cannot happen when the candidates hold the support (the max is
         * one of them); if it did, the resident kernel takes the row */
        if (br == 0 && threadIdx.x == 0) {
            st.pred_t[R.slot] = NAN;
            slow[ri] = 1;
            atomicAdd(&paths[2], 1ull);
            atomicAdd(&paths[3], 1ull);
        }
        if (S.nr != 1) {
            cl.sync();
        }
        return;
    }
    if (threadIdx.x == 0) {
        S.gid = cid;
    }
    __syncthreads();
    MSV_GS_MARK(5);

    uint64_t  bk = msv_gs_finish(cl, S, R, ri, xk, cz, NULL, nn, c0, n, V,
                                 m, amax, lo, n1, st, out_ids, out_lps,
                                 top_key, top_lp, max_lp, res, prof);

    /*
     * The next step's floor: the cut (the k-th logit, or the min_p floor)
     * less a gap.  On a hit the gap follows how many candidates the step
     * kept; after a miss it is what the histogram says one and a half
     * times the need takes, or twice the gap that missed, whichever is
     * wider, as long as the floor keeps at most pmax.
     */
    if (br == 0 && threadIdx.x == 0) {
        float  vk = bk != UINT64_MAX
                    ? msv_fkey_value(~(uint32_t) (bk >> 32)) : -INFINITY;
        float  vc = (fl & MSV_GS_MINP) && lo > vk ? lo : vk;
        float  pt = NAN, g = st.pred_g[R.slot];

        if (vc > -FLT_MAX && vc <= FLT_MAX) {
            if (hit) {
                uint64_t  need = bk != UINT64_MAX ? (uint64_t) R.top_k : n1;

                if (!(g > 0.0f)) {
                    /* the gap that just held */
                    g = fmaxf(__fsub_rn(vc, t), 1e-6f);
                }
                if (kc > 3 * need + 256) {
                    g *= 0.75f;
                } else if (kc < need + need / 4 + 16) {
                    g *= 1.5f;
                }
                pt = __fsub_rn(vc, g);
            } else {
                pt = t_hist < vc ? t_hist : vc;
                if (g > 0.0f && __fsub_rn(vc, 2.0f * g) < pt) {
                    pt = __fsub_rn(vc, 2.0f * g);
                }
                if (pt < t_cap) {
                    pt = t_cap;
                }
                g = __fsub_rn(vc, pt);
            }
        } else if ((fl & MSV_GS_TOPK) && (hit ? t : t_hist) > -FLT_MAX) {
            /* exactly k candidates, so no cut was looked for: the floor
             * that held, or the one the histogram gives, stays */
            pt = hit ? t : (t_hist < t_cap ? t_cap : t_hist);
        } else {
            g = NAN;
        }
        st.pred_t[R.slot] = pt;
        st.pred_g[R.slot] = g;
        slow[ri] = 0;
        atomicAdd(&paths[hit ? 0 : 1], 1ull);
        if (msv_gs_sorts(S, R, nn, n1)) {
            atomicAdd(&paths[4], 1ull);
        }
    }
}


/* ------------------------------------------------------------------ */
/* Slot setup and packing                                               */

__global__ void
msv_gs_setup_kernel(const struct msv_gs_setup *su, const uint8_t *up,
    struct msv_gs_state st, uint32_t V)
{
    const struct msv_gs_setup  s = su[blockIdx.x];
    const int32_t  *bid = (const int32_t *) (up + s.off);
    const float    *bv = (const float *) (bid + s.n_bias);
    const int32_t  *mk = (const int32_t *) (bv + s.n_bias);
    const int32_t  *pr = mk + s.n_mask;
    const int32_t  *ou = pr + s.n_prompt;
    uint32_t        i;

    for (i = threadIdx.x; i < s.n_bias; i += blockDim.x) {
        st.bias_id[(size_t) s.slot * MSV_MAX_BIAS + i] = bid[i];
        st.bias_val[(size_t) s.slot * MSV_MAX_BIAS + i] = bv[i];
    }
    for (i = threadIdx.x; i < s.n_mask; i += blockDim.x) {
        st.mask[(size_t) s.slot * MSV_GS_MAX_MASK + i] = mk[i];
    }
    if (threadIdx.x == 0) {
        st.n_bias[s.slot] = s.n_bias;
        st.n_mask[s.slot] = s.n_mask;
        st.pred_t[s.slot] = NAN;        /* a new request: no prediction */
        st.pred_g[s.slot] = NAN;
    }
    if (!s.penalties) {
        return;
    }

    uint32_t  *cn = st.count + (size_t) s.slot * V;
    uint32_t  *sn = st.seen + (size_t) s.slot * st.words;

    for (i = threadIdx.x; i < V; i += blockDim.x) {
        cn[i] = 0;
    }
    for (i = threadIdx.x; i < st.words; i += blockDim.x) {
        sn[i] = 0;
    }
    __syncthreads();
    for (i = threadIdx.x; i < s.n_prompt; i += blockDim.x) {
        atomicOr(&sn[(uint32_t) pr[i] >> 5], 1u << (pr[i] & 31));
    }
    for (i = threadIdx.x; i < s.n_out; i += blockDim.x) {
        atomicOr(&sn[(uint32_t) ou[i] >> 5], 1u << (ou[i] & 31));
        atomicAdd(&cn[ou[i]], 1u);
    }
}


/* One block per row: its header, ids, logprobs and sorted top entries
 * at the row's offset (the sum of the sizes before it). */
__global__ void __launch_bounds__(MSV_GS_PACK_THREADS)
msv_gs_pack_kernel(const struct msv_gs_row *rows,
    const struct msv_gs_res *res, uint32_t V, const int32_t *ids,
    const float *lps, const uint64_t *top_key, const float *top_lp,
    uint32_t max_lp, uint8_t *pack)
{
    __shared__ uint64_t  sk[MSV_MAX_LOGPROBS];
    __shared__ float     sl[MSV_MAX_LOGPROBS];
    __shared__ uint64_t  off_s;

    const uint32_t           ri = blockIdx.x;
    const struct msv_gs_res  o = res[ri];
    uint32_t                 i;
    uint8_t                 *p;

    {
        __shared__ uint64_t  part[MSV_GS_PACK_THREADS / 32];
        uint64_t             sum = 0;

        for (i = threadIdx.x; i < ri; i += blockDim.x) {
            sum += res[i].bytes;
        }
        for (int o = 16; o > 0; o >>= 1) {
            sum += __shfl_down_sync(0xffffffffu, sum, o);
        }
        if ((threadIdx.x & 31) == 0) {
            part[threadIdx.x >> 5] = sum;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            sum = 0;
            for (i = 0; i < blockDim.x / 32; i++) {
                sum += part[i];
            }
            off_s = sum;
        }
        __syncthreads();
    }
    p = pack + off_s;

    if (threadIdx.x == 0) {
        struct msv_row  w;

        memset(&w, 0, sizeof(w));
        w.bytes = o.bytes;
        w.slot = rows[ri].slot;
        w.cookie = rows[ri].cookie;
        w.token = o.token;
        w.pos = rows[ri].t;
        w.n_support = o.n_support;
        w.n_lps = o.n_lps;
        w.n_top = o.n_top;
        w.logprob = o.logprob;
        w.mode = (uint8_t) rows[ri].mode;
        memcpy(p, &w, sizeof(w));
    }

    int32_t  *pi = (int32_t *) (p + sizeof(struct msv_row));
    float    *pl = (float *) (pi + o.n_support);
    struct msv_top  *pt = (struct msv_top *) (pl + o.n_lps);

    for (i = threadIdx.x; i < o.n_support; i += blockDim.x) {
        pi[i] = ids[(size_t) ri * V + i];
    }
    if (rows[ri].mode == MSV_MASK_SUPPORT) {
        for (i = threadIdx.x; i < o.n_lps; i += blockDim.x) {
            pl[i] = lps[(size_t) ri * V + i];
        }
    } else if (o.n_lps == 1 && threadIdx.x == 0) {
        pl[0] = o.logprob;      /* selected: the sampled token's */
    }

    if (o.n_top > 0) {
        uint32_t  cap = 1;

        while (cap < o.n_top) {
            cap <<= 1;
        }
        for (i = threadIdx.x; i < cap; i += blockDim.x) {
            sk[i] = i < o.n_top ? top_key[(size_t) ri * max_lp + i]
                                : UINT64_MAX;
            sl[i] = i < o.n_top ? top_lp[(size_t) ri * max_lp + i] : 0.0f;
        }
        __syncthreads();
        /* bitonic sort by rank key, ascending */
        for (uint32_t k = 2; k <= cap; k <<= 1) {
            for (uint32_t j = k >> 1; j > 0; j >>= 1) {
                for (i = threadIdx.x; i < cap; i += blockDim.x) {
                    uint32_t  l = i ^ j;

                    if (l > i) {
                        bool  up = (i & k) == 0;

                        if ((sk[i] > sk[l]) == up) {
                            uint64_t  tk = sk[i];
                            float     tl = sl[i];

                            sk[i] = sk[l];
                            sl[i] = sl[l];
                            sk[l] = tk;
                            sl[l] = tl;
                        }
                    }
                }
                __syncthreads();
            }
        }
        for (i = threadIdx.x; i < o.n_top; i += blockDim.x) {
            struct msv_top  t;

            t.id = (int32_t) (uint32_t) sk[i];
            t.lp = sl[i];
            memcpy(pt + i, &t, sizeof(t));
        }
    }

    /* zero the alignment tail: rows are compared byte for byte */
    {
        uint8_t  *end = (uint8_t *) (pt + o.n_top);
        uint32_t  pad = (uint32_t) (p + o.bytes - end);

        for (i = threadIdx.x; i < pad; i += blockDim.x) {
            end[i] = 0;
        }
    }
}


/* ------------------------------------------------------------------ */
/* Host side                                                            */

static int
msv_gs_err(char *err, size_t errlen, const char *what, cudaError_t e)
{
    snprintf(err, errlen, "gpu sampler: %s: %s", what, cudaGetErrorString(e));
    return -1;
}

/* A failed call's error is reported once: a launch's (not sticky) is also
 * taken off the runtime, lest the next run's cudaGetLastError report it */
#define MSV_GS_TRY(call, what)                                           \
    do {                                                                 \
        cudaError_t  e_ = (call);                                        \
        if (e_ != cudaSuccess) {                                         \
            (void) cudaGetLastError();                                   \
            return msv_gs_err(err, errlen, (what), e_);                  \
        }                                                                \
    } while (0)


extern "C" void
msv_gsampler_free(struct msv_gsampler *g)
{
    if (g == NULL) {
        return;
    }
    if (g->copy_stream != NULL) {
        /* no copy reads the staging buffer once it is freed */
        cudaStreamSynchronize(g->copy_stream);
        cudaStreamDestroy(g->copy_stream);
    }
    if (g->ev_copied != NULL) {
        cudaEventDestroy(g->ev_copied);
    }
    cudaFree(g->st.bias_id);
    cudaFree(g->st.bias_val);
    cudaFree(g->st.n_bias);
    cudaFree(g->st.mask);
    cudaFree(g->st.n_mask);
    cudaFree(g->st.count);
    cudaFree(g->st.seen);
    cudaFree(g->st.pred_t);
    cudaFree(g->st.pred_g);
    cudaFree(g->d_slow);
    cudaFree(g->d_paths);
    cudaFreeHost(g->h_left);
    cudaFreeHost(g->h_rows);
    cudaFree(g->d_rows);
    cudaFreeHost(g->h_res);
    cudaFree(g->d_res);
    cudaFreeHost(g->h_setup);
    cudaFree(g->d_setup);
    cudaFreeHost(g->h_up);
    cudaFree(g->d_up);
    cudaFree(g->d_ids);
    cudaFree(g->d_lps);
    cudaFree(g->d_topk);
    cudaFree(g->d_toplp);
    cudaFree(g->d_pack);
    cudaFree(g->d_prof);
    free(g->h_prof);
    if (g->ev0 != NULL) {
        cudaEventDestroy(g->ev0);
    }
    if (g->ev1 != NULL) {
        cudaEventDestroy(g->ev1);
    }
    if (g->eva != NULL) {
        cudaEventDestroy(g->eva);
    }
    if (g->evb != NULL) {
        cudaEventDestroy(g->evb);
    }
    if (g->evs != NULL) {
        cudaEventDestroy(g->evs);
    }
    free(g->h_cookie);
    free(g->h_t);
    free(g->h_valid);
    free(g->h_pen);
    free(g->h_off);
    free(g);
}


static int
msv_gs_alloc(void **p, size_t bytes, char *err, size_t errlen,
    const char *what)
{
    cudaError_t  e = cudaMalloc(p, bytes > 0 ? bytes : 16);

    if (e != cudaSuccess) {
        *p = NULL;
        snprintf(err, errlen, "gpu sampler: %s (%zu bytes): %s", what, bytes,
                 cudaGetErrorString(e));
        return -1;
    }
    return 0;
}


/* The streaming kernel's launch shape at nc blocks a row. */
static void
msv_gs_stream_cfg(const struct msv_gsampler *g, uint32_t n, uint32_t nc,
    cudaLaunchConfig_t *cfg, cudaLaunchAttribute *at)
{
    memset(cfg, 0, sizeof(*cfg));
    memset(at, 0, sizeof(*at));
    at->id = cudaLaunchAttributeClusterDimension;
    at->val.clusterDim.x = nc;
    at->val.clusterDim.y = 1;
    at->val.clusterDim.z = 1;
    cfg->gridDim = dim3(n * nc);
    cfg->blockDim = dim3(MSV_GS_ST_THREADS);
    cfg->dynamicSmemBytes = MSV_GS_ST_CAP * 8;
    cfg->stream = g->stream;
    cfg->attrs = at;
    cfg->numAttrs = 1;
}

/* Clusters of nc blocks of the streaming kernel the device runs at once
 * (0: unknown). */
static int
msv_gs_max_clusters(const struct msv_gsampler *g, uint32_t nc)
{
    cudaLaunchConfig_t   cfg;
    cudaLaunchAttribute  at;
    int                  n = 0;

    msv_gs_stream_cfg(g, g->max_rows, nc, &cfg, &at);
    if (cudaOccupancyMaxActiveClusters(&n, msv_sample_stream_kernel, &cfg)
        != cudaSuccess)
    {
        cudaGetLastError();
        return 0;
    }
    return n;
}

/*
 * The streaming kernel's cluster size for a run of n rows: 4 blocks a row
 * when that takes fewer rounds of the device's clusters than 8 and every
 * row's candidates fit four blocks' regions as well as they fit eight
 * (no top_k above 2,048, no top_p without top_k or min_p: those aim at
 * more candidates than four blocks keep); else 8, where each row's walk
 * and chain run on twice as many blocks.  MSV_CUDA_SAMPLER_NC forces one.
 */
static uint32_t
msv_gs_pick_nc(const struct msv_gsampler *g, uint32_t n)
{
    uint32_t  i, r8, r4;

    if (g->nc_force != 0) {
        return (uint32_t) g->nc_force;
    }
    if (g->ncl[0] <= 0 || g->ncl[1] <= 0) {
        return MSV_GS_CLUSTER;
    }
    r8 = (n + g->ncl[0] - 1) / g->ncl[0];
    r4 = (n + g->ncl[1] - 1) / g->ncl[1];
    if (r4 >= r8) {
        return MSV_GS_CLUSTER;
    }
    for (i = 0; i < n; i++) {
        const struct msv_gs_row  *w = &g->h_rows[i];

        if (((w->flags & MSV_GS_TOPK) && w->top_k > 2048)
            || ((w->flags & MSV_GS_TOPP)
                && !(w->flags & (MSV_GS_TOPK | MSV_GS_MINP))))
        {
            return MSV_GS_CLUSTER;
        }
    }
    return 4;
}


extern "C" struct msv_gsampler *
msv_gsampler_new(uint32_t vocab, uint32_t max_rows, uint32_t max_slots,
    uint32_t max_logprobs, void *stream, char *err, size_t errlen)
{
    struct msv_gsampler  *g;
    cudaError_t           e;
    size_t                V = vocab, R = max_rows, row_max;

    if (vocab == 0 || vocab > MSV_SAMPLER_MAX_VOCAB || max_rows == 0
        || max_slots == 0 || max_logprobs > MSV_MAX_LOGPROBS)
    {
        snprintf(err, errlen, "gpu sampler: bad sizes (vocab %u, rows %u, "
                 "slots %u, logprobs %u)", vocab, max_rows, max_slots,
                 max_logprobs);
        return NULL;
    }

    g = (struct msv_gsampler *) calloc(1, sizeof(*g));
    if (g == NULL) {
        snprintf(err, errlen, "gpu sampler: out of memory");
        return NULL;
    }
    g->vocab = vocab;
    g->max_rows = max_rows;
    g->max_slots = max_slots;
    g->max_lp = max_logprobs > 0 ? max_logprobs : 1;
    g->stream = (cudaStream_t) stream;
    g->chunk = (vocab + MSV_GS_CLUSTER - 1) / MSV_GS_CLUSTER;
    g->chunk = (g->chunk + 3) & ~3u;
    if (g->chunk > MSV_GS_MAX_CHUNK) {
        snprintf(err, errlen, "gpu sampler: a vocabulary of %u ids does not "
                 "fit the shared memory of %d blocks (at most %d)", vocab,
                 MSV_GS_CLUSTER, MSV_GS_CLUSTER * MSV_GS_MAX_CHUNK);
        free(g);
        return NULL;
    }
    g->smem = (size_t) g->chunk * sizeof(float);
    {
        const char  *sv = getenv("MSV_CUDA_SAMPLER_STREAM");

        g->stream_on = sv == NULL || strcmp(sv, "0") != 0;
        sv = getenv("MSV_CUDA_SAMPLER_SORT");
        g->sort_on = sv == NULL || strcmp(sv, "0") != 0;
        sv = getenv("MSV_CUDA_SAMPLER_NC");
        if (sv != NULL && *sv != '\0' && strcmp(sv, "4") != 0
            && strcmp(sv, "8") != 0)
        {
            snprintf(err, errlen, "gpu sampler: MSV_CUDA_SAMPLER_NC is "
                     "\"%s\": 4 or 8 blocks a row, or unset", sv);
            free(g);
            return NULL;
        }
        g->nc_force = sv != NULL && *sv != '\0' ? atoi(sv) : 0;
    }
    g->chunk4 = ((vocab + 3) / 4 + 3) & ~3u;
    g->st.words = (vocab + 31) / 32;
    row_max = msv_row_size(vocab, vocab, g->max_lp);
    g->pack_cap = R * row_max;

    g->h_cookie = (uint64_t *) calloc(max_slots, sizeof(uint64_t));
    g->h_t = (uint32_t *) calloc(max_slots, sizeof(uint32_t));
    g->h_valid = (uint8_t *) calloc(max_slots, 1);
    g->h_pen = (uint8_t *) calloc(max_slots, 1);
    g->h_off = (uint64_t *) calloc(R + 1, sizeof(uint64_t));
    g->up_cap = 1 << 20;
    if (g->h_cookie == NULL || g->h_t == NULL || g->h_valid == NULL
        || g->h_pen == NULL || g->h_off == NULL)
    {
        snprintf(err, errlen, "gpu sampler: out of memory");
        goto fail;
    }

    e = cudaFuncSetAttribute(msv_sample_kernel,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int) g->smem);
    if (e != cudaSuccess) {
        msv_gs_err(err, errlen, "shared memory size", e);
        goto fail;
    }

    if (msv_gs_alloc((void **) &g->st.bias_id,
                     max_slots * (size_t) MSV_MAX_BIAS * 4, err, errlen,
                     "bias ids") != 0
        || msv_gs_alloc((void **) &g->st.bias_val,
                        max_slots * (size_t) MSV_MAX_BIAS * 4, err, errlen,
                        "bias values") != 0
        || msv_gs_alloc((void **) &g->st.n_bias, max_slots * 4, err, errlen,
                        "bias counts") != 0
        || msv_gs_alloc((void **) &g->st.mask,
                        max_slots * (size_t) MSV_GS_MAX_MASK * 4, err,
                        errlen, "masks") != 0
        || msv_gs_alloc((void **) &g->st.n_mask, max_slots * 4, err, errlen,
                        "mask counts") != 0
        || msv_gs_alloc((void **) &g->st.count, max_slots * V * 4, err,
                        errlen, "token counts") != 0
        || msv_gs_alloc((void **) &g->st.seen,
                        max_slots * (size_t) g->st.words * 4, err, errlen,
                        "seen ids") != 0
        || msv_gs_alloc((void **) &g->st.pred_t, max_slots * 4, err, errlen,
                        "predicted floors") != 0
        || msv_gs_alloc((void **) &g->st.pred_g, max_slots * 4, err, errlen,
                        "predicted gaps") != 0
        || msv_gs_alloc((void **) &g->d_slow, R * 4, err, errlen,
                        "resident rows") != 0
        || msv_gs_alloc((void **) &g->d_paths, 5 * 8, err, errlen,
                        "path counts") != 0
        || msv_gs_alloc((void **) &g->d_rows, R * sizeof(msv_gs_row), err,
                        errlen, "rows") != 0
        || msv_gs_alloc((void **) &g->d_res, R * sizeof(msv_gs_res), err,
                        errlen, "results") != 0
        || msv_gs_alloc((void **) &g->d_setup, R * sizeof(msv_gs_setup), err,
                        errlen, "setup") != 0
        || msv_gs_alloc((void **) &g->d_up, g->up_cap, err, errlen,
                        "upload") != 0
        || msv_gs_alloc((void **) &g->d_ids, R * V * 4, err, errlen,
                        "support ids") != 0
        || msv_gs_alloc((void **) &g->d_lps, R * V * 4, err, errlen,
                        "support logprobs") != 0
        || msv_gs_alloc((void **) &g->d_topk, R * g->max_lp * 8, err, errlen,
                        "top keys") != 0
        || msv_gs_alloc((void **) &g->d_toplp, R * g->max_lp * 4, err,
                        errlen, "top logprobs") != 0
        || msv_gs_alloc((void **) &g->d_pack, g->pack_cap, err, errlen,
                        "packed rows") != 0)
    {
        goto fail;
    }

    if ((e = cudaMemset(g->st.n_bias, 0, max_slots * 4)) != cudaSuccess
        /* no prediction yet: NaN */
        || (e = cudaMemset(g->st.pred_t, 0xff, max_slots * 4)) != cudaSuccess
        || (e = cudaMemset(g->st.pred_g, 0xff, max_slots * 4)) != cudaSuccess
        || (e = cudaMemset(g->d_paths, 0, 5 * 8)) != cudaSuccess
        || (e = cudaMemset(g->st.n_mask, 0, max_slots * 4)) != cudaSuccess
        || (e = cudaMallocHost((void **) &g->h_rows,
                               R * sizeof(msv_gs_row))) != cudaSuccess
        || (e = cudaMallocHost((void **) &g->h_res,
                               R * sizeof(msv_gs_res))) != cudaSuccess
        || (e = cudaMallocHost((void **) &g->h_setup,
                               R * sizeof(msv_gs_setup))) != cudaSuccess
        || (e = cudaMallocHost((void **) &g->h_up, g->up_cap)) != cudaSuccess
        || (e = cudaMallocHost((void **) &g->h_left, 8)) != cudaSuccess
        || (e = cudaEventCreate(&g->ev0)) != cudaSuccess
        || (e = cudaEventCreate(&g->ev1)) != cudaSuccess
        || (e = cudaEventCreate(&g->eva)) != cudaSuccess
        || (e = cudaEventCreate(&g->evb)) != cudaSuccess
        || (e = cudaEventCreate(&g->evs)) != cudaSuccess
        || (e = cudaEventCreateWithFlags(&g->ev_copied,
                                         cudaEventDisableTiming))
           != cudaSuccess
        /* no implicit ordering with the legacy default stream either:
         * the events above order the copies, nothing else */
        || (e = cudaStreamCreateWithFlags(&g->copy_stream,
                                          cudaStreamNonBlocking))
           != cudaSuccess
        /* unwritten scratch shows up as NaN, not as a plausible value */
        || (e = cudaMemset(g->d_lps, 0xff, R * V * 4)) != cudaSuccess)
    {
        msv_gs_err(err, errlen, "host buffers", e);
        goto fail;
    }
    g->ncl[0] = msv_gs_max_clusters(g, 8);
    g->ncl[1] = msv_gs_max_clusters(g, 4);
    g->nc_last = MSV_GS_CLUSTER;
    return g;

fail:
    msv_gsampler_free(g);
    return NULL;
}


/* Room for `bytes` more in the upload buffer (both copies). */
static int
msv_gs_up_reserve(struct msv_gsampler *g, size_t used, size_t bytes,
    char *err, size_t errlen)
{
    size_t    cap = g->up_cap;
    uint8_t  *h, *d;

    if (used + bytes <= cap) {
        return 0;
    }
    while (cap < used + bytes) {
        cap *= 2;
    }
    MSV_GS_TRY(cudaMallocHost((void **) &h, cap), "upload buffer");
    if (cudaMalloc((void **) &d, cap) != cudaSuccess) {
        cudaFreeHost(h);
        snprintf(err, errlen, "gpu sampler: upload buffer of %zu bytes",
                 cap);
        return -1;
    }
    memcpy(h, g->h_up, used);
    cudaFreeHost(g->h_up);
    cudaFree(g->d_up);
    g->h_up = h;
    g->d_up = d;
    g->up_cap = cap;
    return 0;
}


static int
msv_gs_cmp_bias(const void *a, const void *b)
{
    const struct msv_bias  *x = (const struct msv_bias *) a;
    const struct msv_bias  *y = (const struct msv_bias *) b;

    return x->id < y->id ? -1 : x->id > y->id;
}


/* Queue the setup of a slot whose device state is not this request's. */
static int
msv_gs_queue_setup(struct msv_gsampler *g, const struct msv_sample_row *sr,
    uint32_t *n_setup, size_t *used, char *err, size_t errlen)
{
    const struct msv_sample_req  *rq = &sr->rq;
    const struct msv_params      *p = rq->p;
    struct msv_gs_setup          *su = &g->h_setup[*n_setup];
    struct msv_bias               tmp[MSV_MAX_BIAS];
    int32_t                      *w;
    uint32_t                      i, j, nm, pen;
    size_t                        bytes;

    pen = p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f
          || p->presence_penalty != 0.0f;
    bytes = 4 * (2 * (size_t) p->n_bias + MSV_GS_MAX_MASK)
            + (pen ? 4 * ((size_t) rq->n_prompt + rq->t) : 0);
    bytes = (bytes + 7) & ~(size_t) 7;
    if (msv_gs_up_reserve(g, *used, bytes, err, errlen) != 0) {
        return -1;
    }

    su->slot = sr->slot;
    su->n_bias = p->n_bias;
    su->off = *used;
    su->penalties = pen;
    su->n_prompt = pen ? rq->n_prompt : 0;
    su->n_out = pen ? rq->t : 0;

    /* bias entries by id, stable: each id's entries keep request order */
    memcpy(tmp, rq->bias, (size_t) p->n_bias * sizeof(tmp[0]));
    for (i = 1; i < p->n_bias; i++) {       /* insertion sort: stable */
        struct msv_bias  v = tmp[i];

        for (j = i; j > 0 && msv_gs_cmp_bias(&tmp[j - 1], &v) > 0; j--) {
            tmp[j] = tmp[j - 1];
        }
        tmp[j] = v;
    }
    w = (int32_t *) (g->h_up + *used);
    for (i = 0; i < p->n_bias; i++) {
        w[i] = tmp[i].id;
        memcpy(&w[p->n_bias + i], &tmp[i].value, 4);
    }
    w += 2 * p->n_bias;

    /* min_tokens mask: stop ids, eos ids unless ignored, distinct */
    nm = 0;
    for (i = 0; i < p->n_stop + rq->n_eos; i++) {
        int32_t  id = i < p->n_stop ? p->stop_ids[i] : rq->eos[i - p->n_stop];

        if (i >= p->n_stop && p->ignore_eos) {
            break;
        }
        if (id < 0 || (uint32_t) id >= g->vocab) {
            continue;
        }
        for (j = 0; j < nm && w[j] != id; j++) {
        }
        if (j == nm) {
            w[nm++] = id;
        }
    }
    su->n_mask = nm;
    w += nm;
    if (pen) {
        memcpy(w, rq->prompt, 4 * (size_t) rq->n_prompt);
        memcpy(w + rq->n_prompt, rq->out, 4 * (size_t) rq->t);
    }

    *used += bytes;
    (*n_setup)++;

    g->h_cookie[sr->slot] = sr->cookie;
    g->h_valid[sr->slot] = 1;
    g->h_pen[sr->slot] = (uint8_t) pen;
    g->h_t[sr->slot] = rq->t;
    return 0;
}


/* The rest of a run after the streaming kernel: the resident kernel (if
 * `resident`), packing, the results and the count of rows the streaming
 * kernel left to the resident one back to the host. */
static int
msv_gs_finish_run(struct msv_gsampler *g, float *logits, uint32_t n,
    int resident, char *err, size_t errlen)
{
    if (resident) {
        msv_sample_kernel<<<n * MSV_GS_CLUSTER, MSV_GS_THREADS, g->smem,
                            g->stream>>>(logits, g->vocab, g->chunk,
            g->d_rows, g->st, g->d_ids, g->d_lps, g->d_topk, g->d_toplp,
            g->max_lp, g->d_res, g->stream_on ? g->d_slow : NULL,
            g->d_prof);
        MSV_GS_TRY(cudaGetLastError(), "sampling kernel");
    }
    MSV_GS_TRY(cudaEventRecord(g->evb, g->stream), "event");

    /* the last run's rows may still be on their way to the host
     * (msv_gsampler_copy): packing over them waits on the device (an
     * event never recorded is already complete) */
    MSV_GS_TRY(cudaStreamWaitEvent(g->stream, g->ev_copied, 0), "event");
    msv_gs_pack_kernel<<<n, MSV_GS_PACK_THREADS, 0, g->stream>>>(g->d_rows,
        g->d_res, g->vocab, g->d_ids, g->d_lps, g->d_topk, g->d_toplp,
        g->max_lp, g->d_pack);
    MSV_GS_TRY(cudaGetLastError(), "packing kernel");
    MSV_GS_TRY(cudaEventRecord(g->ev1, g->stream), "event");

    MSV_GS_TRY(cudaMemcpyAsync(g->h_res, g->d_res, n * sizeof(msv_gs_res),
                               cudaMemcpyDeviceToHost, g->stream),
               "results");
    MSV_GS_TRY(cudaMemcpyAsync(g->h_left, g->d_paths + 3, 8,
                               cudaMemcpyDeviceToHost, g->stream), "results");
    return 0;
}


extern "C" int
msv_gsampler_run(struct msv_gsampler *g, float *logits,
    const struct msv_sample_row *rows, uint32_t n,
    struct msv_sample_res *res, char *err, size_t errlen)
{
    uint32_t   i, n_setup = 0, n_res = 0;
    size_t     used = 0;
    cudaError_t e;

    if (n == 0) {
        g->h_off[0] = 0;
        return 0;
    }
    if (n > g->max_rows) {
        snprintf(err, errlen, "gpu sampler: %u rows, at most %u", n,
                 g->max_rows);
        return -1;
    }

    for (i = 0; i < n; i++) {
        const struct msv_sample_row  *sr = &rows[i];
        const struct msv_params      *p = sr->rq.p;
        struct msv_gs_row            *w = &g->h_rows[i];
        uint32_t                      fl = 0, pen;

        if (sr->slot >= g->max_slots) {
            snprintf(err, errlen, "gpu sampler: slot %u, at most %u",
                     sr->slot, g->max_slots);
            return -1;
        }
        pen = p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f
              || p->presence_penalty != 0.0f;
        if (!g->h_valid[sr->slot] || g->h_cookie[sr->slot] != sr->cookie
            || (pen && g->h_t[sr->slot] != sr->rq.t))
        {
            if (msv_gs_queue_setup(g, sr, &n_setup, &used, err, errlen)
                != 0)
            {
                return -1;
            }
        }
        g->h_t[sr->slot] = sr->rq.t + 1;    /* after this draw */

        if (p->temperature == 0.0f) {
            fl |= MSV_GS_GREEDY;
        } else {
            if (p->top_k > 0 && (uint32_t) p->top_k < g->vocab) {
                fl |= MSV_GS_TOPK;
            }
            if (p->top_p < 1.0f) {
                fl |= MSV_GS_TOPP;
            }
            if (p->min_p > 0.0f) {
                fl |= MSV_GS_MINP;
            }
        }
        if (sr->rq.t < p->min_tokens) {
            fl |= MSV_GS_MASKON;
        }
        if (p->repetition_penalty != 1.0f) {
            fl |= MSV_GS_REP;
        }
        if (p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f) {
            fl |= MSV_GS_FREQ;
        }
        if (p->mask_mode != MSV_MASK_OFF || p->logprobs >= 0) {
            fl |= MSV_GS_CAPT;
        }
        if (!g->sort_on) {
            fl |= MSV_GS_RADIX;
        }
        if (p->n_bias == 0 && !(fl & MSV_GS_MASKON)
            && (fl & (MSV_GS_GREEDY | MSV_GS_TOPK | MSV_GS_TOPP
                      | MSV_GS_MINP)))
        {
            fl |= MSV_GS_FAST;
        } else {
            n_res++;
        }

        memset(w, 0, sizeof(*w));
        w->seed = sr->rq.seed;
        w->cookie = sr->cookie;
        w->lrow = sr->row;
        w->slot = sr->slot;
        w->t = sr->rq.t;
        w->flags = fl;
        w->temp = p->temperature;
        w->top_p = p->top_p;
        w->min_p = p->min_p;
        w->top_k = p->top_k;
        w->rep = p->repetition_penalty;
        w->pres = p->presence_penalty;
        w->freq = p->frequency_penalty;
        w->logprobs = p->logprobs < (int32_t) g->max_lp ? p->logprobs
                                                        : (int32_t) g->max_lp;
        w->mode = p->mask_mode;
    }

    MSV_GS_TRY(cudaEventRecord(g->ev0, g->stream), "event");
    if (n_setup > 0) {
        MSV_GS_TRY(cudaMemcpyAsync(g->d_up, g->h_up, used,
                                   cudaMemcpyHostToDevice, g->stream),
                   "upload");
        MSV_GS_TRY(cudaMemcpyAsync(g->d_setup, g->h_setup,
                                   n_setup * sizeof(msv_gs_setup),
                                   cudaMemcpyHostToDevice, g->stream),
                   "upload");
        msv_gs_setup_kernel<<<n_setup, 256, 0, g->stream>>>(g->d_setup,
                                                            g->d_up, g->st,
                                                            g->vocab);
        MSV_GS_TRY(cudaGetLastError(), "setup kernel");
    }
    MSV_GS_TRY(cudaMemcpyAsync(g->d_rows, g->h_rows,
                               n * sizeof(msv_gs_row),
                               cudaMemcpyHostToDevice, g->stream), "upload");
    /* no resets: each row's result is written whole by the kernel that
     * takes it (top_fill too), and paths[3] counts on across runs */
    MSV_GS_TRY(cudaEventRecord(g->eva, g->stream), "event");

    if (g->stream_on) {
        cudaLaunchConfig_t   cfg;
        cudaLaunchAttribute  at;
        const uint32_t       nc = msv_gs_pick_nc(g, n);

        msv_gs_stream_cfg(g, n, nc, &cfg, &at);
        MSV_GS_TRY(cudaLaunchKernelEx(&cfg, msv_sample_stream_kernel,
                                      (const float *) logits, g->vocab,
                                      nc == 4 ? g->chunk4 : g->chunk,
                                      (const struct msv_gs_row *) g->d_rows,
                                      g->st, g->d_ids, g->d_lps, g->d_topk,
                                      g->d_toplp, g->max_lp, g->d_res,
                                      g->d_slow, g->d_paths, g->d_prof),
                   "streaming sampling kernel");
        MSV_GS_TRY(cudaGetLastError(), "streaming sampling kernel");
        g->nc_last = nc;
    }
    MSV_GS_TRY(cudaEventRecord(g->evs, g->stream), "event");
    /* the resident kernel, now if a row is known to need it; else only if
     * the streaming kernel left it one (rare: its candidates did not fit),
     * once the run's end has shown that */
    if (msv_gs_finish_run(g, logits, n, !g->stream_on || n_res > 0, err,
                          errlen) != 0)
    {
        return -1;
    }
    e = cudaStreamSynchronize(g->stream);
    if (e == cudaSuccess && g->stream_on && n_res == 0
        && *g->h_left > g->left_seen)
    {
        if (msv_gs_finish_run(g, logits, n, 1, err, errlen) != 0) {
            return -1;
        }
        e = cudaStreamSynchronize(g->stream);
    }
    if (e != cudaSuccess) {
        return msv_gs_err(err, errlen, "sampling", e);
    }
    g->left_seen = *g->h_left;
    cudaEventElapsedTime(&g->last_ms, g->ev0, g->ev1);
    if (g->d_prof != NULL) {
        cudaMemcpy(g->h_prof, g->d_prof,
                   (size_t) n * MSV_GS_MARKS * sizeof(long long),
                   cudaMemcpyDeviceToHost);
        g->prof_rows = n;
    }
    cudaEventElapsedTime(&g->part_ms[0], g->ev0, g->eva);
    cudaEventElapsedTime(&g->part_ms[1], g->eva, g->evs);
    cudaEventElapsedTime(&g->part_ms[2], g->evs, g->evb);
    cudaEventElapsedTime(&g->part_ms[3], g->evb, g->ev1);

    g->h_off[0] = 0;
    for (i = 0; i < n; i++) {
        res[i].token = g->h_res[i].token;
        res[i].logprob = g->h_res[i].logprob;
        res[i].n_support = g->h_res[i].n_support;
        res[i].bytes = g->h_res[i].bytes;
        g->h_off[i + 1] = g->h_off[i] + g->h_res[i].bytes;
    }
    return 0;
}


extern "C" int
msv_gsampler_copy(struct msv_gsampler *g, uint32_t first, uint32_t n,
    void *dst, char *err, size_t errlen)
{
    size_t  bytes;

    if (n == 0) {
        return 0;
    }
    bytes = g->h_off[first + n] - g->h_off[first];

    /* after the packing of the last run (msv_gsampler_run returned once
     * the stream had passed it: this costs the copy stream nothing) */
    MSV_GS_TRY(cudaStreamWaitEvent(g->copy_stream, g->ev1, 0), "event");
    MSV_GS_TRY(cudaMemcpyAsync(dst, g->d_pack + g->h_off[first], bytes,
                               cudaMemcpyDeviceToHost, g->copy_stream),
               "copy");
    MSV_GS_TRY(cudaEventRecord(g->ev_copied, g->copy_stream), "event");
    return 0;
}


extern "C" int
msv_gsampler_wait(struct msv_gsampler *g, char *err, size_t errlen)
{
    cudaError_t  e;

    e = cudaStreamSynchronize(g->copy_stream);
    if (e != cudaSuccess) {
        return msv_gs_err(err, errlen, "copy", e);
    }
    return 0;
}


extern "C" float
msv_gsampler_last_ms(const struct msv_gsampler *g, float parts[4])
{
    if (parts != NULL) {
        memcpy(parts, g->part_ms, sizeof(g->part_ms));
    }
    return g->last_ms;
}


extern "C" int
msv_gsampler_profile(struct msv_gsampler *g, double cycles[7])
{
    uint32_t  i, k, n = 0;

    if (g->d_prof == NULL) {
        g->h_prof = (long long *) calloc((size_t) g->max_rows * MSV_GS_MARKS,
                                         sizeof(long long));
        if (g->h_prof == NULL
            || cudaMalloc((void **) &g->d_prof, (size_t) g->max_rows
                          * MSV_GS_MARKS * sizeof(long long)) != cudaSuccess)
        {
            return -1;
        }
        cudaMemset(g->d_prof, 0, (size_t) g->max_rows * MSV_GS_MARKS
                                 * sizeof(long long));
        return 0;
    }
    for (k = 0; k < 7; k++) {
        cycles[k] = 0;
    }
    for (i = 0; i < g->prof_rows; i++) {
        const long long  *p = g->h_prof + (size_t) i * MSV_GS_MARKS;
        long long         last = p[0];

        if (p[0] == 0 || p[7] < p[0]) {
            continue;
        }
        for (k = 1; k < MSV_GS_MARKS; k++) {
            /* a stage a row skipped left its mark 0 or stale: count it
             * as no time */
            if (p[k] >= last && p[k] <= p[7]) {
                cycles[k - 1] += (double) (p[k] - last);
                last = p[k];
            }
        }
        n++;
    }
    for (k = 0; k < 7 && n > 0; k++) {
        cycles[k] /= n;
    }
    cudaMemset(g->d_prof, 0, (size_t) g->max_rows * MSV_GS_MARKS
                             * sizeof(long long));
    return (int) n;
}


/* Counts [from, from + n) of d_paths into out; 0, or -1 on an error. */
static int
msv_gs_counts(struct msv_gsampler *g, uint32_t from, uint32_t n,
    unsigned long long *out)
{
    if (cudaMemcpy(out, g->d_paths + from, n * sizeof(*out),
                   cudaMemcpyDeviceToHost) != cudaSuccess)
    {
        cudaGetLastError();
        return -1;
    }
    return 0;
}


extern "C" int
msv_gsampler_paths(struct msv_gsampler *g, unsigned long long paths[3])
{
    return msv_gs_counts(g, 0, 3, paths) != 0 ? -1 : g->stream_on;
}


extern "C" long long
msv_gsampler_sorted(struct msv_gsampler *g)
{
    unsigned long long  h;

    return msv_gs_counts(g, 4, 1, &h) != 0 ? -1 : (long long) h;
}


extern "C" int
msv_gsampler_clusters(const struct msv_gsampler *g, uint32_t nc)
{
    cudaLaunchConfig_t  cfg;
    int                 n = 0;

    if (g->stream_on) {
        n = nc == 8 ? g->ncl[0] : nc == 4 ? g->ncl[1] : 0;
        return n > 0 ? n : -1;
    }
    if (nc != MSV_GS_CLUSTER) {
        return -1;                      /* the resident kernel's is 8 */
    }
    memset(&cfg, 0, sizeof(cfg));
    cfg.gridDim = dim3(g->max_rows * MSV_GS_CLUSTER);
    cfg.blockDim = dim3(MSV_GS_THREADS);
    cfg.dynamicSmemBytes = g->smem;
    if (cudaOccupancyMaxActiveClusters(&n, msv_sample_kernel, &cfg)
        != cudaSuccess)
    {
        cudaGetLastError();
        return -1;
    }
    return n;
}


extern "C" uint32_t
msv_gsampler_last_nc(const struct msv_gsampler *g)
{
    return g->stream_on ? g->nc_last : MSV_GS_CLUSTER;
}


extern "C" int
msv_cuda_host_register(void *p, size_t bytes, char *err, size_t errlen)
{
    MSV_GS_TRY(cudaHostRegister(p, bytes, cudaHostRegisterDefault),
               "registering host memory");
    return 0;
}


extern "C" void
msv_cuda_host_unregister(void *p)
{
    cudaHostUnregister(p);
}
