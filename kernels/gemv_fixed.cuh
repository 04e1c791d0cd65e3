/*
 * gemv_fixed.cuh: the product of a bf16 weight with 1 to 8 activation
 * rows on tensor cores, each output summed over k in ascending steps of
 * 16 in one fp32 accumulator: the order of a tensor-core GEMM without
 * split-K.  It is the batch-invariant mode's path at small batch
 * (gemm.cu: gemv_fixed_forward), where the pinned cuBLASLt algorithms
 * read the weights at half the rate of a GEMV; it is used for a weight
 * shape only where its bits have been found equal to the pinned
 * algorithm's (gemm_inv_pin), so a row's output is the same whether its
 * batch takes this path or the pinned one.
 *
 * out[m][r] (+)= sum_k act[m][k] w[r][k].  A warp owns 8 weight rows and
 * walks all of k (no k split: that would change the order); the
 * activation rows are the mma's first 8 rows (m16n8k16: A = act,
 * row-major, rows 8..15 zeros; B = w^T, w's rows being B's columns, k
 * contiguous).  Both stream through a ring of S stages of KC columns in
 * shared memory a warp, a stage holding the 8 weight rows and the 8
 * activation rows,
 * filled by cp.async (16-byte words, 16-byte aligned rows: cols a
 * multiple of 8), each word stored at (word ^ row) within its row so that
 * ldmatrix reads 8 rows without bank conflicts; the stages past the first
 * S - 1 are requested while the first ones are used, the weights' first
 * ones before the kernel ahead has finished.  The mma chain is one
 * dependent accumulator (the order), so a warp takes a whole stage's
 * fragments before it starts the stage's chain.  Columns past cols are
 * zeros on both sides (their products add nothing); activation rows past
 * n are zeros written once, weight rows past rows are read clamped and
 * not written.
 *
 * The epilogue is cuBLAS's with alpha 1 and beta 0 or 1: the sum, or the
 * old value plus the sum, rounded once.  SiLU·up stays a kernel of its
 * own after the gate/up product: two forms with it in this kernel (a
 * warp's 8 gate rows and their 8 up rows; 4 gate rows and their 4 up
 * rows in one tile) ran the decode step at batch 1 slower than the
 * product then silu_mul_forward (bench/results/engine.md).
 */

#ifndef MSV_GEMV_FIXED_CUH
#define MSV_GEMV_FIXED_CUH

#include "cuda_common.cuh"
#include "gemm.cuh"                  /* MSV_GEMV_FIXED_MAX: one mma tile */
#include "mma.cuh"

/* Request stage st of a warp's tiles into its ring slot st % S: lane's
 * word j from src[j] + st * KC into word dst[j] of the slot (kw[j]: its
 * column in the stage) where use[j], zeros past cols. */
template <int KC, int S, int WS, int WPT>
static __device__ __forceinline__ void
msv_gemv_fixed_issue(uint4 *ring, const __nv_bfloat16 *const src[WPT],
    const uint32_t dst[WPT], const uint32_t kw[WPT], const bool use[WPT],
    const __nv_bfloat16 *any, uint32_t cols, uint32_t st)
{
    uint4  *slot = ring + (st % S) * WS;

#pragma unroll
    for (int j = 0; j < WPT; j++) {
        uint32_t  k = st * KC + kw[j];

        if (use[j]) {
            msv_cp_async16(slot + dst[j], k < cols ? src[j] + st * KC : any,
                           k < cols ? 16 : 0);
        }
    }
}

/* Lane's words of a tile of `rows` rows of WPR words (the tile's word
 * lane + 32 j is lane's word j): source row base + min(row, last) * cols,
 * stored at word ^ (row & 7) of its row, from offset off of the slot. */
template <int WPR, int WPT>
static __device__ __forceinline__ void
msv_gemv_fixed_words(const __nv_bfloat16 *src[WPT], uint32_t dst[WPT],
    uint32_t kw[WPT], const __nv_bfloat16 *base, uint32_t last,
    uint32_t cols, uint32_t off, uint32_t lane)
{
#pragma unroll
    for (int j = 0; j < WPT; j++) {
        uint32_t  row = (lane + 32 * j) / WPR;
        uint32_t  word = (lane + 32 * j) % WPR;

        src[j] = base + (size_t) min(row, last) * cols + word * 8;
        dst[j] = off + row * WPR + (word ^ (row & 7));
        kw[j] = word * 8;
    }
}

/* A stage's fragments, of k steps 2 i and 2 i + 1: b[h], the B of the
 * weights' h-th 8 rows; a, the activations' a0 and a2 of A (a1 = a3 =
 * 0, the rows past 8). */
template <int KC, int H>
struct msv_gemv_fixed_frag {
    uint32_t  b[H][KC / 32][4];
    uint32_t  a[KC / 32][4];
};

/* Every fragment of the stage in slot: lanes 8 i .. 8 i + 7 address rows
 * 0..7 of word 2 c + i, of each 8 weight rows and of the activations. */
template <int KC, int H>
static __device__ __forceinline__ void
msv_gemv_fixed_load(struct msv_gemv_fixed_frag<KC, H> &f, const uint4 *slot,
    uint32_t lane)
{
    constexpr int  WPR = KC / 8;
    constexpr int  WW = 8 * H * WPR;
    const uint4   *p = slot + (lane & 7) * WPR;

#pragma unroll
    for (int c = 0; c < KC / 16; c += 2) {
        uint32_t  word = (c * 2 + (lane >> 3)) ^ (lane & 7);

#pragma unroll
        for (int h = 0; h < H; h++) {
            msv_ldmatrix_x4(f.b[h][c / 2], p + h * 8 * WPR + word);
        }
        msv_ldmatrix_x4(f.a[c / 2], p + WW + word);
    }
}

/* The stage's mma chains from column k0 (acc[h]: weight rows 8 h ..),
 * each in k order, none past cols. */
template <int KC, int H>
static __device__ __forceinline__ void
msv_gemv_fixed_chain(float acc[H][4],
    const struct msv_gemv_fixed_frag<KC, H> &f, uint32_t k0, uint32_t cols)
{
    uint32_t  fa[4];

#pragma unroll
    for (int c = 0; c < KC / 16; c++) {
        if (k0 + 16 * c >= cols) {
            continue;
        }
        fa[0] = f.a[c / 2][2 * (c & 1)];
        fa[1] = 0u;
        fa[2] = f.a[c / 2][2 * (c & 1) + 1];
        fa[3] = 0u;
#pragma unroll
        for (int h = 0; h < H; h++) {
            msv_mma_bf16(acc[h], fa, f.b[h][c / 2][2 * (c & 1)],
                         f.b[h][c / 2][2 * (c & 1) + 1]);
        }
    }
}

template <int KC, int S, int NW>
static __global__ void __launch_bounds__(NW * 32)
gemv_fixed_kernel(const __nv_bfloat16 *w, const __nv_bfloat16 *x,
    uint32_t rows, uint32_t cols, uint32_t n, float *out, int accumulate)
{
    constexpr int  H = 1;                 /* 8 weight rows a chain */
    constexpr int  WPR = KC / 8;          /* 16-byte words of a row a stage */
    constexpr int  WW = 8 * H * WPR;      /* words of a stage: weights, */
    constexpr int  WX = 8 * WPR;          /* activations */
    constexpr int  WS = WW + WX;
    constexpr int  WPT = WW / 32;         /* lane's words a stage */
    constexpr int  XPT = WX / 32;
    extern __shared__ uint4  msv_gemv_fixed_ring[];

    const __nv_bfloat16               *wsrc[WPT], *xsrc[XPT];
    struct msv_gemv_fixed_frag<KC, H>    f;
    uint4                             *ring;
    uint32_t                           wdst[WPT], wkw[WPT], xdst[XPT];
    uint32_t                           xkw[XPT], lane, warp, r0, g, t, nst;
    uint32_t                           s;
    bool                               wuse[WPT], xuse[XPT];
    float                              acc[H][4];

    static_assert(KC % 64 == 0, "a row of a stage is a multiple of 8 words "
                  "(the swizzle keeps to each 8), read 4 at a time");
    static_assert(S >= 2, "a stage in use, one landing");

    lane = threadIdx.x & 31;
    warp = threadIdx.x >> 5;
    r0 = (blockIdx.x * NW + warp) * 8;
    if (r0 >= rows) {
        return;
    }
    g = lane >> 2;
    t = lane & 3;
    nst = MSV_CEIL_DIV(cols, (uint32_t) KC);
    ring = msv_gemv_fixed_ring + (size_t) warp * S * WS;

    /* a slot: the warp's 8 weight rows (rows past the last read as the
     * last, not written), then 8 activation rows, those past n zeros
     * written once and never requested */
    msv_gemv_fixed_words<WPR, WPT>(wsrc, wdst, wkw, w + (size_t) r0 * cols,
                                   rows - 1 - r0, cols, 0, lane);
    msv_gemv_fixed_words<WPR, XPT>(xsrc, xdst, xkw, x, n - 1, cols, WW,
                                   lane);
#pragma unroll
    for (int j = 0; j < WPT; j++) {
        wuse[j] = true;
    }
#pragma unroll
    for (int j = 0; j < XPT; j++) {
        xuse[j] = (lane + 32 * j) / WPR < n;
        if (!xuse[j]) {
            for (s = 0; s < S; s++) {
                ring[s * WS + xdst[j]] = make_uint4(0, 0, 0, 0);
            }
        }
    }

    /* the weights are no kernel's output: their first S - 1 stages are
     * requested before waiting for the kernel that writes x; group s of
     * the prologue holds stage s's activations (group 0 all the weights) */
    for (s = 0; s < S - 1; s++) {
        if (s < nst) {
            msv_gemv_fixed_issue<KC, S, WS, WPT>(ring, wsrc, wdst, wkw, wuse,
                                                 w, cols, s);
        }
    }
    msv_grid_wait();
    msv_grid_release();
    for (s = 0; s < S - 1; s++) {
        if (s < nst) {
            msv_gemv_fixed_issue<KC, S, WS, XPT>(ring, xsrc, xdst, xkw, xuse,
                                                 w, cols, s);
        }
        msv_cp_async_commit();
    }

    /* a stage: request stage s + S - 1, wait for stage s, take its
     * fragments, run its chain (taking the next stage's fragments before
     * this chain, one stage fewer in flight, measured slower: 5.10 ms the
     * step's products at n = 1 against 4.71, bench/results/engine.md) */
#pragma unroll
    for (int h = 0; h < H; h++) {
        acc[h][0] = acc[h][1] = acc[h][2] = acc[h][3] = 0.0f;
    }
    for (s = 0; s < nst; s++) {
        if (s + S - 1 < nst) {
            msv_gemv_fixed_issue<KC, S, WS, WPT>(ring, wsrc, wdst, wkw, wuse,
                                                 w, cols, s + S - 1);
            msv_gemv_fixed_issue<KC, S, WS, XPT>(ring, xsrc, xdst, xkw, xuse,
                                                 w, cols, s + S - 1);
        }
        msv_cp_async_commit();
        /* groups 0 .. s complete: stage s landed, for every lane's copies
         * (and the zeros) */
        msv_cp_async_wait_newest<S - 1>();
        __syncwarp();
        msv_gemv_fixed_load<KC, H>(f, ring + (s % S) * WS, lane);
        /* every lane's reads of the slot are done before it is refilled */
        __syncwarp();
        msv_gemv_fixed_chain<KC, H>(acc, f, s * KC, cols);
    }
    msv_cp_async_wait_all();

    /* acc[0][0], acc[0][1]: activation row g, weight rows r0 + 2 t and
     * + 1 (acc[0][2], acc[0][3]: rows g + 8, zeros) */
    if (g < n) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            uint32_t   r = r0 + 2 * t + e;
            float     *o = out + (size_t) g * rows + r;

            if (r < rows) {
                *o = accumulate ? *o + acc[0][e] : acc[0][e];
            }
        }
    }
}

/* Launch gemv_fixed_kernel<KC, S, NW> over every output of w
 * [rows][cols] (cols a multiple of 8, w and x 16-byte aligned) for n
 * activation rows, 1 <= n <= MSV_GEMV_FIXED_MAX: out fp32 [n][rows]
 * (+)= x . w^T.  The first launch sets the kernel's shared memory limit,
 * which a graph capture does not take: it runs before any capture
 * (gemm_inv_pin times it). */
template <int KC, int S, int NW>
static inline cudaError_t
gemv_fixed_launch(const __nv_bfloat16 *w, const __nv_bfloat16 *x,
    uint32_t rows, uint32_t cols, uint32_t n, float *out, int accumulate,
    cudaStream_t stream)
{
    constexpr size_t  smem = (size_t) NW * S * (8 + 8) * KC
                             * sizeof(__nv_bfloat16);
    static int        ready;
    dim3              grid(MSV_CEIL_DIV(MSV_CEIL_DIV(rows, 8u),
                                        (uint32_t) NW));
    cudaError_t       e;

    static_assert(smem <= 227 * 1024, "a block's ring fits an SM");

    if (n < 1 || n > MSV_GEMV_FIXED_MAX) {
        return cudaErrorInvalidValue;
    }
    if (!ready) {
        e = cudaFuncSetAttribute(
                (const void *) gemv_fixed_kernel<KC, S, NW>,
                cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem);
        if (e != cudaSuccess) {
            return e;
        }
        ready = 1;
    }
    return msv_launch(gemv_fixed_kernel<KC, S, NW>, grid, dim3(NW * 32),
                      smem, stream, w, x, rows, cols, n, out, accumulate);
}


/*
 * The fixed-order product at 9 to MSV_GEMM_FIXED_MAX rows: the same sums
 * in the same order (each output over k in ascending steps of 16, one
 * fp32 accumulator, mma.m16n8k16), where the pinned algorithms without
 * split-K leave the GPU part idle (at n = 16 the 4096 x 12288 down
 * product 0.0489 ms against 0.0550 pinned, lm_head 0.2946 against
 * 0.3083; at 32 to 128 rows, with MT = 2 to 8, it was 1.2x to 11x slower
 * than the pinned algorithms, bench/results/engine.md).  A block's NW
 * warps each own 8 weight rows (the mma's B, as in the GEMV) and share
 * the MT x 16 activation rows (A: the whole m16 tile now, MT tiles),
 * staged together
 * through a ring of S stages of KC columns in shared memory, each row's
 * words swizzled (word ^ (row & 7)) for ldmatrix; the block meets at two
 * barriers a stage (the stage landed; its slot free again).  A warp's MT
 * accumulators are MT independent chains, each in k order.  Activation
 * rows past n are zeros written once, weight rows past rows read clamped
 * and not written.  Used for a shape only where gemm_inv_pin found its
 * bits equal to the pinned algorithm's and its time lower.
 */
template <int KC, int S, int NW, int MT>
static __global__ void __launch_bounds__(NW * 32)
gemm_fixed_kernel(const __nv_bfloat16 *w, const __nv_bfloat16 *x,
    uint32_t rows, uint32_t cols, uint32_t n, float *out, int accumulate)
{
    constexpr int  WPR = KC / 8;          /* 16-byte words of a row a stage */
    constexpr int  WR = NW * 8;           /* weight rows of the block */
    constexpr int  XR = MT * 16;          /* activation rows */
    constexpr int  WS = (WR + XR) * WPR;  /* words of a stage */
    constexpr int  WPT = 8 * WPR / 32;    /* lane's weight words a stage */
    constexpr int  XPT = XR * WPR / (NW * 32);  /* thread's activation words */
    extern __shared__ uint4  msv_gemm_fixed_ring[];

    const __nv_bfloat16  *wsrc[WPT], *xsrc[XPT];
    uint32_t              wdst[WPT], wkw[WPT], xdst[XPT], xkw[XPT];
    bool                  wuse[WPT], xuse[XPT];
    uint32_t              lane, warp, r0, g, t, nst, s, tid;
    float                 acc[MT][4];

    static_assert(KC % 64 == 0, "a row of a stage is a multiple of 8 words");
    static_assert(S >= 2, "a stage in use, one landing");
    static_assert(XR * WPR % (NW * 32) == 0, "the activation words split "
                  "evenly over the block");

    tid = threadIdx.x;
    lane = tid & 31;
    warp = tid >> 5;
    r0 = (blockIdx.x * NW + warp) * 8;    /* this warp's weight rows */
    g = lane >> 2;
    t = lane & 3;
    nst = MSV_CEIL_DIV(cols, (uint32_t) KC);

    /* the warp's 8 weight rows at rows warp * 8 .. of a slot (a warp past
     * the last row reads the last one and writes nothing), then the
     * activation rows, those past n zeros written once */
    msv_gemv_fixed_words<WPR, WPT>(wsrc, wdst, wkw, w + (size_t) min(r0,
                                   rows - 1) * cols,
                                   r0 < rows ? rows - 1 - r0 : 0, cols,
                                   warp * 8 * WPR, lane);
#pragma unroll
    for (int j = 0; j < WPT; j++) {
        wuse[j] = true;
    }
#pragma unroll
    for (int j = 0; j < XPT; j++) {
        uint32_t  i = tid + NW * 32 * j;
        uint32_t  row = i / WPR, word = i % WPR;

        xsrc[j] = x + (size_t) min(row, n - 1) * cols + word * 8;
        xdst[j] = WR * WPR + row * WPR + (word ^ (row & 7));
        xkw[j] = word * 8;
        xuse[j] = row < n;
        if (!xuse[j]) {
            for (s = 0; s < S; s++) {
                msv_gemm_fixed_ring[s * WS + xdst[j]] = make_uint4(0, 0, 0,
                                                                   0);
            }
        }
    }

    for (s = 0; s < S - 1; s++) {
        if (s < nst) {
            msv_gemv_fixed_issue<KC, S, WS, WPT>(msv_gemm_fixed_ring, wsrc,
                                                 wdst, wkw, wuse, w, cols, s);
        }
    }
    msv_grid_wait();
    msv_grid_release();
    for (s = 0; s < S - 1; s++) {
        if (s < nst) {
            msv_gemv_fixed_issue<KC, S, WS, XPT>(msv_gemm_fixed_ring, xsrc,
                                                 xdst, xkw, xuse, w, cols, s);
        }
        msv_cp_async_commit();
    }

#pragma unroll
    for (int m = 0; m < MT; m++) {
        acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.0f;
    }
    for (s = 0; s < nst; s++) {
        const uint4  *slot;

        /* every thread is done with the slot stage s + S - 1 goes into
         * (stage s - 1's) */
        __syncthreads();
        if (s + S - 1 < nst) {
            msv_gemv_fixed_issue<KC, S, WS, WPT>(msv_gemm_fixed_ring, wsrc,
                                                 wdst, wkw, wuse, w, cols,
                                                 s + S - 1);
            msv_gemv_fixed_issue<KC, S, WS, XPT>(msv_gemm_fixed_ring, xsrc,
                                                 xdst, xkw, xuse, w, cols,
                                                 s + S - 1);
        }
        msv_cp_async_commit();
        msv_cp_async_wait_newest<S - 1>();
        __syncthreads();                  /* stage s landed, every copy */
        slot = msv_gemm_fixed_ring + (s % S) * WS;

#pragma unroll
        for (int c = 0; c < KC / 16; c += 2) {
            uint32_t  b[4], a[4];

            /* B of k steps c and c + 1: rows 0..7 of words 2c .. 2c + 3
             * of the warp's weight rows */
            msv_ldmatrix_x4(b, slot + (warp * 8 + (lane & 7)) * WPR
                               + ((c * 2 + (lane >> 3)) ^ (lane & 7)));
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (s * KC + 16 * (c + h) >= cols) {
                    continue;
                }
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    /* A of m tile m, k step c + h: rows 0-7 / 8-15 of
                     * words 2 (c + h) and + 1 */
                    uint32_t  row = m * 16 + (lane & 15);

                    msv_ldmatrix_x4(a, slot + WR * WPR + row * WPR
                                       + ((2 * (c + h) + (lane >> 4))
                                          ^ (row & 7)));
                    msv_mma_bf16(acc[m], a, b[2 * h], b[2 * h + 1]);
                }
            }
        }
    }
    msv_cp_async_wait_all();

    /* acc[m][0..1]: activation row m * 16 + g, weight rows r0 + 2 t, + 1;
     * acc[m][2..3]: activation row m * 16 + g + 8 */
#pragma unroll
    for (int m = 0; m < MT; m++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            uint32_t  ar = m * 16 + g + (e >> 1) * 8;
            uint32_t  r = r0 + 2 * t + (e & 1);
            float    *o = out + (size_t) ar * rows + r;

            if (ar < n && r < rows) {
                *o = accumulate ? *o + acc[m][e] : acc[m][e];
            }
        }
    }
}

/* Launch gemm_fixed_kernel<KC, S, NW, MT> over every output of w for n
 * activation rows, 1 <= n <= 16 MT (w, x as gemv_fixed_launch wants).
 * The first launch sets the shared memory limit: gemm_inv_pin runs it
 * before any capture. */
template <int KC, int S, int NW, int MT>
static inline cudaError_t
gemm_fixed_launch(const __nv_bfloat16 *w, const __nv_bfloat16 *x,
    uint32_t rows, uint32_t cols, uint32_t n, float *out, int accumulate,
    cudaStream_t stream)
{
    constexpr size_t  smem = (size_t) S * (NW * 8 + MT * 16) * KC
                             * sizeof(__nv_bfloat16);
    static int        ready;
    dim3              grid(MSV_CEIL_DIV(MSV_CEIL_DIV(rows, 8u),
                                        (uint32_t) NW));
    cudaError_t       e;

    static_assert(smem <= 227 * 1024, "a block's ring fits an SM");

    if (n < 1 || n > 16 * MT) {
        return cudaErrorInvalidValue;
    }
    if (!ready) {
        e = cudaFuncSetAttribute(
                (const void *) gemm_fixed_kernel<KC, S, NW, MT>,
                cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem);
        if (e != cudaSuccess) {
            return e;
        }
        ready = 1;
    }
    return msv_launch(gemm_fixed_kernel<KC, S, NW, MT>, grid, dim3(NW * 32),
                      smem, stream, w, x, rows, cols, n, out, accumulate);
}

#endif /* MSV_GEMV_FIXED_CUH */
