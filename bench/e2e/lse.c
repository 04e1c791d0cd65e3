/*
 * lse.c: the logsumexp of a support row (see lse.h).
 *
 * The vector exp (x <= 0): x is clamped to -708, above the smallest
 * normal double's logarithm (a value below it adds less than 1e-307 to a
 * sum of at least 1, the row's maximum's term); x = n ln2 + r with n the
 * nearest integer to x / ln2 and |r| <= ln2 / 2, ln2 split in two so that
 * r is exact to within an ulp; exp(r) by its Taylor series to r^13 (the
 * next term is below 5e-18 of it); 2^n put in the exponent bits.  The
 * rounding of the thirteen fused multiply-adds stays within a few ulp:
 * below 1e-15 of the result.  n comes out of the bits of n + 1.5 * 2^52,
 * which AVX2 can read as integers.  The rest of the file is built with
 * the compiler's default flags.
 */

#include <math.h>
#include <stdint.h>

#include "lse.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MSV_LSE_AVX2  1
#include <immintrin.h>
#endif


static double
msv_lse_max_f64(const double *x, size_t n)
{
    size_t  i;
    double  m = -INFINITY;

    for (i = 0; i < n; i++) {
        m = x[i] > m ? x[i] : m;
    }
    return m;
}


static double
msv_lse_max_f32(const float *x, size_t n)
{
    size_t  i;
    float   m = -INFINITY;

    for (i = 0; i < n; i++) {
        m = x[i] > m ? x[i] : m;
    }
    return m;
}


#if (MSV_LSE_AVX2)

#define MSV_LSE_MAGIC   6755399441055744.0          /* 1.5 * 2^52 */
#define MSV_LSE_LN2_HI  0.6931471805599453094       /* ln 2, rounded */
#define MSV_LSE_LN2_LO  2.319046813846299558e-17    /* what is left */

__attribute__((target("avx2,fma"), always_inline))
static inline __m256d
msv_exp4_avx2(__m256d x)
{
    __m256d  k, n, r, p;
    __m256i  e;

    x = _mm256_max_pd(x, _mm256_set1_pd(-708.0));
    k = _mm256_fmadd_pd(x, _mm256_set1_pd(M_LOG2E),
                        _mm256_set1_pd(MSV_LSE_MAGIC));
    n = _mm256_sub_pd(k, _mm256_set1_pd(MSV_LSE_MAGIC));
    r = _mm256_fnmadd_pd(n, _mm256_set1_pd(MSV_LSE_LN2_HI), x);
    r = _mm256_fnmadd_pd(n, _mm256_set1_pd(MSV_LSE_LN2_LO), r);

    p = _mm256_set1_pd(1.0 / 6227020800.0);
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 479001600.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 39916800.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 3628800.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 362880.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 40320.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 5040.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 720.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 120.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 24.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 6.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(0.5));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0));

    /* the low bits of k hold n + 2^51: (n + 1023) << 52 is 2^n */
    e = _mm256_slli_epi64(_mm256_add_epi64(_mm256_castpd_si256(k),
                                           _mm256_set1_epi64x(1023)), 52);

    return _mm256_mul_pd(p, _mm256_castsi256_pd(e));
}


__attribute__((target("avx2,fma")))
static double
msv_hsum_avx2(__m256d v)
{
    __m128d  s;

    s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}


/* lanes 0 .. left - 1 of four, as a mask */
__attribute__((target("avx2,fma")))
static __m256i
msv_lanes_avx2(size_t left)
{
    return _mm256_cmpgt_epi64(_mm256_set1_epi64x((long long) left),
                              _mm256_setr_epi64x(0, 1, 2, 3));
}


/* four elements from x + i as doubles: float32 (f32) or float64 */
__attribute__((target("avx2,fma"), always_inline))
static inline __m256d
msv_load4_avx2(const void *x, size_t i, int f32)
{
    return f32 ? _mm256_cvtps_pd(_mm_loadu_ps((const float *) x + i))
               : _mm256_loadu_pd((const double *) x + i);
}


/* the elements at x + i of lanes, zeros in the others */
__attribute__((target("avx2,fma"), always_inline))
static inline __m256d
msv_load_lanes_avx2(const void *x, size_t i, __m256i lanes, int f32)
{
    if (!f32) {
        return _mm256_maskload_pd((const double *) x + i, lanes);
    }
    /* a 32-bit lane mask from the low halves of the 64-bit one */
    return _mm256_cvtps_pd(_mm_maskload_ps((const float *) x + i,
               _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(lanes,
                   _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6)))));
}


/*
 * The sum for either width, below a maximum m already found: one body,
 * inlined into each width's function with f32 a constant, so that each
 * keeps its own loads and nothing else differs.
 */
__attribute__((target("avx2,fma"), always_inline))
static inline double
msv_lse_avx2_of(const void *x, size_t n, double m, int f32)
{
    size_t   i;
    __m256d  vm, s0, s1, s2, s3, v;
    __m256i  lanes;

    vm = _mm256_set1_pd(m);
    s0 = s1 = s2 = s3 = _mm256_setzero_pd();

    for (i = 0; i + 16 <= n; i += 16) {
        s0 = _mm256_add_pd(s0, msv_exp4_avx2(_mm256_sub_pd(
                 msv_load4_avx2(x, i, f32), vm)));
        s1 = _mm256_add_pd(s1, msv_exp4_avx2(_mm256_sub_pd(
                 msv_load4_avx2(x, i + 4, f32), vm)));
        s2 = _mm256_add_pd(s2, msv_exp4_avx2(_mm256_sub_pd(
                 msv_load4_avx2(x, i + 8, f32), vm)));
        s3 = _mm256_add_pd(s3, msv_exp4_avx2(_mm256_sub_pd(
                 msv_load4_avx2(x, i + 12, f32), vm)));
    }
    for ( /* void */ ; i + 4 <= n; i += 4) {
        s0 = _mm256_add_pd(s0, msv_exp4_avx2(_mm256_sub_pd(
                 msv_load4_avx2(x, i, f32), vm)));
    }
    if (i < n) {
        lanes = msv_lanes_avx2(n - i);
        v = msv_load_lanes_avx2(x, i, lanes, f32);
        v = msv_exp4_avx2(_mm256_sub_pd(v, vm));
        s1 = _mm256_add_pd(s1, _mm256_and_pd(v, _mm256_castsi256_pd(lanes)));
    }

    s0 = _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3));
    return m + log(msv_hsum_avx2(s0));
}


__attribute__((target("avx2,fma")))
static double
msv_lse_f64_avx2(const double *x, size_t n)
{
    double  m = msv_lse_max_f64(x, n);

    return m == -INFINITY ? -INFINITY : msv_lse_avx2_of(x, n, m, 0);
}


__attribute__((target("avx2,fma")))
static double
msv_lse_f32_avx2(const float *x, size_t n)
{
    double  m = msv_lse_max_f32(x, n);

    return m == -INFINITY ? -INFINITY : msv_lse_avx2_of(x, n, m, 1);
}


__attribute__((target("avx2,fma")))
static double
msv_exp1_avx2(double x)
{
    return _mm256_cvtsd_f64(msv_exp4_avx2(_mm256_set1_pd(x)));
}

#endif


static int  msv_lse_avx2 = -1;      /* unknown yet */


int
msv_lse_simd(int on)
{
#if (MSV_LSE_AVX2)
    __builtin_cpu_init();
    msv_lse_avx2 = on && __builtin_cpu_supports("avx2")
                   && __builtin_cpu_supports("fma");
#else
    msv_lse_avx2 = 0;
#endif
    return msv_lse_avx2;
}


static int
msv_lse_vector(void)
{
    if (msv_lse_avx2 < 0) {
        msv_lse_simd(1);
    }
    return msv_lse_avx2;
}


double
msv_lse_f64(const double *x, size_t n)
{
    size_t  i;
    double  m, sum = 0;

#if (MSV_LSE_AVX2)
    if (msv_lse_vector()) {
        return msv_lse_f64_avx2(x, n);
    }
#endif

    m = msv_lse_max_f64(x, n);
    if (m == -INFINITY) {
        return -INFINITY;
    }
    for (i = 0; i < n; i++) {
        sum += exp(x[i] - m);
    }
    return m + log(sum);
}


double
msv_lse_f32(const float *x, size_t n)
{
    size_t  i;
    double  m, sum = 0;

#if (MSV_LSE_AVX2)
    if (msv_lse_vector()) {
        return msv_lse_f32_avx2(x, n);
    }
#endif

    m = msv_lse_max_f32(x, n);
    if (m == -INFINITY) {
        return -INFINITY;
    }
    for (i = 0; i < n; i++) {
        sum += exp((double) x[i] - m);
    }
    return m + log(sum);
}


double
msv_lse_exp(double x)
{
#if (MSV_LSE_AVX2)
    if (msv_lse_vector()) {
        return msv_exp1_avx2(x);
    }
#endif
    return exp(x);
}
