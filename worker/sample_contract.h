/*
 * sample_contract.h: the arithmetic of the sampler contract
 * (docs/SAMPLER.md), as static inline functions that both the C compiler
 * and nvcc take.  The CPU sampler (worker/sampler.c) and the GPU sampler
 * (kernels/sampling.cu) call these and nothing else for every value that
 * decides a token, a support or a logprob, so the two cannot drift:
 *
 *   processing   msv_clean, msv_sat, msv_bias_add, msv_rep_penalty,
 *                msv_freq_penalty, msv_temp_div       (order: SAMPLER.md 1)
 *   rank order   msv_fkey, msv_rank_key               (z' desc, id asc)
 *   min_p        msv_floor                            (a float bound)
 *   top_p        msv_weight                           (integer weights)
 *   logprobs     msv_lse_term, msv_lse_log, msv_lp    (exact fixed point)
 *   the draw     msv_philox_bits, msv_gumbel          (Philox4x32-10)
 *
 * Every float operation is rounded on its own (no fused multiply-add):
 * on the device through the __f*_rn intrinsics, on the host because the
 * including file is compiled with fp-contract off.
 */

#ifndef MSV_SAMPLE_CONTRACT_H
#define MSV_SAMPLE_CONTRACT_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define MSV_HD            __host__ __device__ __forceinline__
#else
#define MSV_HD            static inline
#endif

#if defined(__CUDA_ARCH__)
#define MSV_FADD(a, b)    __fadd_rn((a), (b))
#define MSV_FSUB(a, b)    __fsub_rn((a), (b))
#define MSV_FMUL(a, b)    __fmul_rn((a), (b))
#define MSV_FDIV(a, b)    __fdiv_rn((a), (b))
#define MSV_DADD(a, b)    __dadd_rn((a), (b))
#define MSV_DMUL(a, b)    __dmul_rn((a), (b))
#else
#define MSV_FADD(a, b)    ((a) + (b))
#define MSV_FSUB(a, b)    ((a) - (b))
#define MSV_FMUL(a, b)    ((a) * (b))
#define MSV_FDIV(a, b)    ((a) / (b))
#define MSV_DADD(a, b)    ((a) + (b))
#define MSV_DMUL(a, b)    ((a) * (b))
#endif

#define MSV_Q_CUT        (-23.0)    /* d below this: top-p weight is 0 */
#define MSV_Q_SCALE      0x1p32     /* top-p weight resolution */
#define MSV_R_CUT        (-43.7)    /* d below this: lse term is 0 */
#define MSV_R_SCALE      0x1p62     /* lse fixed-point resolution */

/* Above every Gumbel value msv_gumbel() can return (x = 2^32 - 1 gives
 * 22.8739...), with a margin for a log() that is off by an ulp. */
#define MSV_GUMBEL_MAX   22.875


/* ------------------------------------------------------------------ */
/* Processing (SAMPLER.md section 1)                                    */

/* NaN (and -inf) to -inf, +inf to the largest float. */
MSV_HD float
msv_clean(float x)
{
    if (!(x > -INFINITY)) {
        return -INFINITY;
    }
    return x > FLT_MAX ? FLT_MAX : x;
}

/* A finite operation that overflowed saturates at +-FLT_MAX. */
MSV_HD float
msv_sat(float x)
{
    if (x > FLT_MAX) {
        return FLT_MAX;
    }
    return x < -FLT_MAX ? -FLT_MAX : x;
}

/* One logit_bias entry on a cleaned logit. */
MSV_HD float
msv_bias_add(float x, float v)
{
    return x == -INFINITY ? x : msv_sat(MSV_FADD(x, v));
}

/* The repetition penalty r on a cleaned logit. */
MSV_HD float
msv_rep_penalty(float x, float r)
{
    if (x == -INFINITY) {
        return x;
    }
    return msv_sat(x > 0.0f ? MSV_FDIV(x, r) : MSV_FMUL(x, r));
}

/* Frequency f (times the count c) then presence p, on a cleaned logit. */
MSV_HD float
msv_freq_penalty(float x, float f, uint32_t c, float p)
{
    float  fc;

    if (x == -INFINITY) {
        return x;
    }
    fc = MSV_FMUL(f, (float) c);
    x = msv_sat(MSV_FSUB(x, fc));
    return msv_sat(MSV_FSUB(x, p));
}

/* Temperature on a cleaned logit (t != 1 and t > 0). */
MSV_HD float
msv_temp_div(float x, float t)
{
    return x == -INFINITY ? x : msv_sat(MSV_FDIV(x, t));
}


/* ------------------------------------------------------------------ */
/* Rank order                                                           */

/* Order-preserving unsigned image of a float; -0 is taken as +0. */
MSV_HD uint32_t
msv_fkey(float x)
{
    uint32_t  u;

    memcpy(&u, &x, sizeof(u));
    if (u == 0x80000000u) {
        u = 0;
    }
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* The float of a key (the inverse of msv_fkey, +0 for either zero). */
MSV_HD float
msv_fkey_value(uint32_t k)
{
    uint32_t  u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float     x;

    memcpy(&x, &u, sizeof(x));
    return x;
}

/* Ascending rank keys are the rank order: z' descending, then id. */
MSV_HD uint64_t
msv_rank_key(float x, uint32_t id)
{
    return ((uint64_t) (uint32_t) ~msv_fkey(x) << 32) | id;
}


/* ------------------------------------------------------------------ */
/* Support and logprobs                                                 */

/* The smallest float f with (double) f - m >= c, for c <= 0: a test of
 * z' - max against a bound is monotone in z', so it is z' >= f.
 * -FLT_MAX for c = -inf (every finite logit passes). */
MSV_HD float
msv_floor(float m, double c)
{
    float  f, g;

    if (c == -INFINITY) {
        return -FLT_MAX;
    }
    f = (float) MSV_DADD((double) m, c);
    if (!(f >= -FLT_MAX)) {
        f = -FLT_MAX;
    }
    /* f = m passes: both walks are a step or two */
    while ((double) f - (double) m < c) {
        f = nextafterf(f, INFINITY);
    }
    for ( ;; ) {
        g = nextafterf(f, -INFINITY);
        if (g < -FLT_MAX || (double) g - (double) m < c) {
            return f;
        }
        f = g;
    }
}

/* Top-p weight of a token d = z' - max below the top:
 * floor(e^d 2^32 + 1/2), the sum exact (e^d 2^32 < 2^33: no rounding). */
MSV_HD uint64_t
msv_weight(double d)
{
    if (d < MSV_Q_CUT) {
        return 0;
    }
    return (uint64_t) MSV_DADD(MSV_DMUL(exp(d), MSV_Q_SCALE), 0.5);
}

/* Fixed-point term of the logsumexp: floor(e^d 2^62). */
MSV_HD uint64_t
msv_lse_term(double d)
{
    if (d < MSV_R_CUT) {
        return 0;
    }
    return (uint64_t) MSV_DMUL(exp(d), MSV_R_SCALE);
}

/* log of the fixed-point sum (hi, lo) of lse terms, scaled back by 2^-62:
 * the log-sum-exp of the support minus its max.  The 128-bit sum is
 * rounded to a double once, to nearest, so every backend that sums the
 * same terms gets the same value. */
MSV_HD double
msv_lse_log(uint64_t hi, uint64_t lo)
{
    double    s;
    uint32_t  sh;
    uint64_t  top;

    if (hi == 0) {
        s = (double) lo;
    } else {
        /* the top 64 bits, the bits shifted out folded into a sticky bit
         * below the 53 a double keeps: rounding is unchanged */
        sh = 0;
        while ((hi >> sh) != 0) {
            sh++;
        }
        top = (hi << (64 - sh)) | (lo >> sh);
        if (lo & ((1ULL << sh) - 1)) {
            top |= 1;
        }
        s = ldexp((double) top, (int) sh);
    }
    return log(s / MSV_R_SCALE);
}

/* The logprob of a token d = z' - max below the top, over the support
 * whose msv_lse_log is L.  Computed from d, not from z' - (max + L), so a
 * huge max loses nothing; a token further below the max than a float
 * reaches (FLT_MAX next to -FLT_MAX) gets -FLT_MAX, never -inf. */
MSV_HD float
msv_lp(double d, double L)
{
    double  v = d - L;

    return v < -FLT_MAX ? -FLT_MAX : (float) v;
}


/* ------------------------------------------------------------------ */
/* The draw (SAMPLER.md section 4)                                      */

#define MSV_PHILOX_M0  0xd2511f53u   /* round multipliers */
#define MSV_PHILOX_M1  0xcd9e8d57u
#define MSV_PHILOX_W0  0x9e3779b9u   /* key schedule: golden ratio */
#define MSV_PHILOX_W1  0xbb67ae85u   /* and sqrt(3) - 1 */
#define MSV_PHILOX_ROUNDS  10

/*
 * out = Philox4x32-10(ctr, key) (Salmon, Moraes, Dror, Shaw, "Parallel
 * Random Numbers: As Easy as 1, 2, 3", SC 2011), words in the published
 * order.  Each round multiplies counter words 0 and 2 by two odd
 * constants and swaps the halves of the products in with words 1 and 3
 * and the key; the key is bumped by two Weyl constants between rounds.
 */
MSV_HD void
msv_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
    uint32_t out[4])
{
    int       r;
    uint32_t  c0, c1, c2, c3, k0, k1;
    uint64_t  p0, p1;

    c0 = ctr[0];
    c1 = ctr[1];
    c2 = ctr[2];
    c3 = ctr[3];
    k0 = key[0];
    k1 = key[1];

    for (r = 0; r < MSV_PHILOX_ROUNDS; r++) {
        if (r > 0) {
            k0 += MSV_PHILOX_W0;
            k1 += MSV_PHILOX_W1;
        }

        p0 = (uint64_t) MSV_PHILOX_M0 * c0;
        p1 = (uint64_t) MSV_PHILOX_M1 * c2;

        c0 = (uint32_t) (p1 >> 32) ^ c1 ^ k0;
        c1 = (uint32_t) p1;
        c2 = (uint32_t) (p0 >> 32) ^ c3 ^ k1;
        c3 = (uint32_t) p0;
    }

    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The sampler's 32 random bits for output position t and token id:
 * word 0 of Philox4x32-10 with key (seed lo, seed hi) and counter
 * (t, 0, id, 0). */
MSV_HD uint32_t
msv_philox_bits(uint64_t seed, uint32_t t, uint32_t id)
{
    uint32_t  ctr[4], key[2], out[4];

    ctr[0] = t;
    ctr[1] = 0;
    ctr[2] = id;
    ctr[3] = 0;
    key[0] = (uint32_t) seed;
    key[1] = (uint32_t) (seed >> 32);

    msv_philox4x32_10(ctr, key, out);
    return out[0];
}

/* The same for four ids at once, lane by lane within each round so the
 * four multiply chains overlap (about twice the rate on a CPU). */
MSV_HD void
msv_philox_bits4(uint64_t seed, uint32_t t, const uint32_t id[4],
    uint32_t out[4])
{
    int       r, l;
    uint32_t  c0[4], c1[4], c2[4], c3[4], k0, k1, n0, n2;
    uint64_t  p0, p1;

    k0 = (uint32_t) seed;
    k1 = (uint32_t) (seed >> 32);
    for (l = 0; l < 4; l++) {
        c0[l] = t;
        c1[l] = 0;
        c2[l] = id[l];
        c3[l] = 0;
    }

    for (r = 0; r < MSV_PHILOX_ROUNDS; r++) {
        if (r > 0) {
            k0 += MSV_PHILOX_W0;
            k1 += MSV_PHILOX_W1;
        }
        for (l = 0; l < 4; l++) {
            p0 = (uint64_t) MSV_PHILOX_M0 * c0[l];
            p1 = (uint64_t) MSV_PHILOX_M1 * c2[l];
            n0 = (uint32_t) (p1 >> 32) ^ c1[l] ^ k0;
            n2 = (uint32_t) (p0 >> 32) ^ c3[l] ^ k1;
            c1[l] = (uint32_t) p1;
            c3[l] = (uint32_t) p0;
            c0[l] = n0;
            c2[l] = n2;
        }
    }

    for (l = 0; l < 4; l++) {
        out[l] = c0[l];
    }
}

/* The Gumbel value of 32 random bits x: -log(-log((x + 0.5) 2^-32)). */
MSV_HD double
msv_gumbel(uint32_t x)
{
    return -log(-log(MSV_DMUL(MSV_DADD((double) x, 0.5), 0x1p-32)));
}

#endif /* MSV_SAMPLE_CONTRACT_H */
