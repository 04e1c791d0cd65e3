/*
 * gemv.cuh: the product of a bf16 weight with 1 to 8 activation rows,
 * the decode path at small batch (gemm.cu's gemv_forward), where every
 * weight is read once and the time is the time to read it.
 *
 * out[m][r] (+)= sum_k w[r][k] act[m][k] for M activation rows, bf16 in,
 * fp32 sums.  A block of W warps takes W / KS * R weight rows: each group
 * of KS warps shares R rows, each warp of it a 1/KS slice of their
 * columns.  A lane reads 16-byte words (8 elements) of each of the R
 * rows, U of them a round (words k + 32 i, i < U, of its slice); with
 * PIPE the next round's words are requested before this round's are
 * used, so that a warp always has a round of loads in flight.  The
 * activation words come through the cache, each used for every row.  A
 * weight word is used once: loaded streaming (__ldcs).
 *
 * With SILU, w is a gate/up matrix (gate rows, then as many up rows) and
 * a warp group's R rows are R / 2 gate rows and their up rows: each pair
 * ends as silu(gate) * up, rounded to bf16 once (SiLU·up fused into the
 * gate/up product, for the down product to read).
 *
 * The sum of a row: each lane's words in k order, then the warp's lanes
 * by the xor butterfly, then the KS warps' sums in warp order.  It
 * depends on KS alone (a lane's words are those of its lane number mod
 * 32, in order, whatever R and U), not on where the row sits in the grid
 * or which rows share its warps: the SILU form's gate and up sums are the
 * plain form's bit for bit.  gemm.cu picks the shape from M, so a row's
 * sum depends on the batch size (the batch-invariant mode does not take
 * this path).
 *
 * bench/gemv_rate.cu instantiates other shapes of the kernel to compare
 * them; the backend's launcher uses gemm.cu's choice.
 */

#ifndef MSV_GEMV_CUH
#define MSV_GEMV_CUH

#include "cuda_common.cuh"

/* The weight words of the round from word k of each of the R rows: k +
 * 32 i, i < U, zero past the slice's end at word e. */
template <int R, int U>
static __device__ __forceinline__ void
msv_gemv_words(uint4 wv[U][R], const uint4 *const wr[R], uint32_t k,
    uint32_t e)
{
#pragma unroll
    for (int i = 0; i < U; i++) {
#pragma unroll
        for (int q = 0; q < R; q++) {
            wv[i][q] = k + 32 * i < e ? __ldcs(wr[q] + k + 32 * i)
                                      : make_uint4(0, 0, 0, 0);
        }
    }
}

/* acc[q][m] += the round's words of row q times act row m's */
template <int M, int R, int U>
static __device__ __forceinline__ void
msv_gemv_round(float acc[R][M], const uint4 wv[U][R],
    const uint4 *const xr[M], uint32_t k, uint32_t e)
{
    uint4   xv;
    float2  a, b;

#pragma unroll
    for (int i = 0; i < U; i++) {
        if (k + 32 * i >= e) {
            continue;
        }
#pragma unroll
        for (int m = 0; m < M; m++) {
            xv = __ldg(xr[m] + k + 32 * i);
#pragma unroll
            for (int u = 0; u < 4; u++) {
                a = __bfloat1622float2(((const __nv_bfloat162 *) &xv)[u]);
#pragma unroll
                for (int q = 0; q < R; q++) {
                    b = __bfloat1622float2(
                            ((const __nv_bfloat162 *) &wv[i][q])[u]);
                    acc[q][m] += a.x * b.x + a.y * b.y;
                }
            }
        }
    }
}

template <int M, int R, int U, int KS, bool PIPE, int W, bool SILU>
static __global__ void __launch_bounds__(W * 32)
gemv_kernel(const __nv_bfloat16 *w, const __nv_bfloat16 *act,
    uint32_t rows, uint32_t cols, void *out, int accumulate)
{
    const uint4  *wr[R], *xr[M];
    uint4         wv[U][R], nv[U][R];
    float         acc[R][M];
    uint32_t      r0, lane, warp, s, nw, k0, e, k;
    __shared__ float  part[KS > 1 ? W : 1][R][M];

    static_assert(W % KS == 0, "KS divides the block's warps");
    static_assert(!SILU || R % 2 == 0, "SILU pairs gate and up rows");

    /* SILU: the outputs are rows / 2; a warp group's R / 2 outputs read
     * their gate rows (0 .. rows / 2 - 1) and their up rows (rows / 2 ..) */
    constexpr int  OUT = SILU ? R / 2 : R;      /* outputs a warp group */
    const uint32_t n_out = SILU ? rows / 2 : rows;

    lane = threadIdx.x & 31;
    warp = threadIdx.x >> 5;
    s = warp % KS;                                  /* slice of the row */
    r0 = (blockIdx.x * (W / KS) + warp / KS) * OUT;
    nw = cols / 8;
    k0 = s * (nw / KS) + min(s, nw % KS);
    e = k0 + nw / KS + (s < nw % KS ? 1 : 0);

#pragma unroll
    for (int q = 0; q < R; q++) {
        uint32_t  wrow = min(r0 + q % OUT, n_out - 1)
                         + (q < OUT ? 0 : n_out);

        wr[q] = (const uint4 *) (w + (size_t) wrow * cols);
#pragma unroll
        for (int m = 0; m < M; m++) {
            acc[q][m] = 0.0f;
        }
    }
#pragma unroll
    for (int m = 0; m < M; m++) {
        xr[m] = (const uint4 *) (act + (size_t) m * cols);
    }

    /* the first round's weight words are requested before waiting for
     * the kernel that writes act (msv_grid_wait): under a programmatic
     * launch they load while that kernel finishes */
    msv_gemv_words<R, U>(wv, wr, k0 + lane, e);
    msv_grid_wait();
    msv_grid_release();

    for (k = k0 + lane; k < e; k += 32 * U) {
        if (PIPE) {
            /* the next round's words in flight while this one is used */
            msv_gemv_words<R, U>(nv, wr, k + 32 * U, e);
        } else if (k != k0 + lane) {
            msv_gemv_words<R, U>(wv, wr, k, e);
        }
        msv_gemv_round<M, R, U>(acc, wv, xr, k, e);
        if (PIPE) {
#pragma unroll
            for (int i = 0; i < U; i++) {
#pragma unroll
                for (int q = 0; q < R; q++) {
                    wv[i][q] = nv[i][q];
                }
            }
        }
    }

#pragma unroll
    for (int q = 0; q < R; q++) {
#pragma unroll
        for (int m = 0; m < M; m++) {
            for (int off = 16; off > 0; off >>= 1) {
                acc[q][m] += __shfl_xor_sync(0xffffffffu, acc[q][m], off);
            }
        }
    }

    if (KS > 1) {
        if (lane == 0) {
#pragma unroll
            for (int q = 0; q < R; q++) {
#pragma unroll
                for (int m = 0; m < M; m++) {
                    part[warp][q][m] = acc[q][m];
                }
            }
        }
        __syncthreads();
        if (s != 0 || lane != 0) {
            return;
        }
#pragma unroll
        for (int q = 0; q < R; q++) {
#pragma unroll
            for (int m = 0; m < M; m++) {
                acc[q][m] = part[warp][q][m];
                for (int j = 1; j < KS; j++) {
                    acc[q][m] += part[warp + j][q][m];
                }
            }
        }
    } else if (lane != 0) {
        return;
    }

    if (r0 >= n_out) {
        return;
    }
#pragma unroll
    for (int q = 0; q < OUT; q++) {
        if (r0 + q >= n_out) {
            break;
        }
#pragma unroll
        for (int m = 0; m < M; m++) {
            if (SILU) {
                /* silu(gate) * up rounded once, as silu_mul_forward
                 * computes it from the fp32 products */
                float  g = acc[q][m], u = acc[q + OUT][m];

                ((__nv_bfloat16 *) out)[(size_t) m * n_out + r0 + q] =
                    __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
            } else {
                float  *o = (float *) out + (size_t) m * rows + r0 + q;

                *o = accumulate ? *o + acc[q][m] : acc[q][m];
            }
        }
    }
}

/* Launch gemv_kernel<M, R, U, KS, PIPE, W, SILU> over every row of w
 * [rows][cols] (cols a multiple of 8) for M activation rows: out is fp32
 * [M][rows], or with SILU bf16 [M][rows / 2] (rows even). */
template <int M, int R, int U, int KS, bool PIPE, int W, bool SILU>
static inline cudaError_t
gemv_launch_m(const __nv_bfloat16 *w, const __nv_bfloat16 *x, uint32_t rows,
    uint32_t cols, void *out, int accumulate, cudaStream_t stream)
{
    uint32_t  outs = SILU ? rows / 2 : rows;

    return msv_launch(gemv_kernel<M, R, U, KS, PIPE, W, SILU>,
                      dim3(MSV_CEIL_DIV(outs,
                                        (uint32_t) (W / KS * (SILU ? R / 2
                                                                   : R)))),
                      dim3(W * 32), 0, stream, w, x, rows, cols, out,
                      accumulate);
}

/* The same shape for M = n, 1 <= n <= 8; cudaErrorInvalidValue for
 * another n. */
template <int R, int U, int KS, bool PIPE, int W>
static inline cudaError_t
gemv_launch(const __nv_bfloat16 *w, const __nv_bfloat16 *x, uint32_t rows,
    uint32_t cols, uint32_t n, float *out, int accumulate,
    cudaStream_t stream)
{
    switch (n) {
#define MSV_GEMV_CASE(M)                                                     \
    case M:                                                                  \
        return gemv_launch_m<M, R, U, KS, PIPE, W, false>(w, x, rows, cols,  \
                                                          out, accumulate,   \
                                                          stream)
    MSV_GEMV_CASE(1);
    MSV_GEMV_CASE(2);
    MSV_GEMV_CASE(3);
    MSV_GEMV_CASE(4);
    MSV_GEMV_CASE(5);
    MSV_GEMV_CASE(6);
    MSV_GEMV_CASE(7);
    MSV_GEMV_CASE(8);
#undef MSV_GEMV_CASE
    default:
        return cudaErrorInvalidValue;
    }
}

#endif /* MSV_GEMV_CUH */
