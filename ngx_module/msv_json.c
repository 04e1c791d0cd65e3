/*
 * msv_json.c: decimal integers and shortest float32 for JSON output.
 *
 * Integers.  A value below 10^8 becomes eight ASCII digits in one 64-bit
 * word without a loop (split in two 4-digit halves, then 2-digit quarters,
 * then digits, each split a multiply and a shift done on all lanes at
 * once); the leading zero digits are counted with one ctz and shifted out,
 * and the word is stored whole.
 *
 * Float32.  The method is the one of R. Giulietti's paper "The Schubfach
 * way to render doubles" (2020), worked out here for float32 with a table
 * of 64-bit powers of ten.  For v = c * 2^q (c < 2^24) the reals that
 * strtof rounds to v fill the interval [u, w] around v, u = v - 2^(q-1) (or
 * v - 2^(q-2) at the bottom of a binade, where the float below is closer),
 * w = v + 2^(q-1); both ends belong to it when c is even (strtof rounds
 * ties to even).  Pick k with 10^k <= width < 10^(k+1).  Scaled by 10^-k
 * the interval is between 1 and 10 units wide, so it holds at least one
 * integer and at most one multiple of ten:
 *   - if a multiple of ten lies inside, it has fewer digits than any other
 *     candidate, and only the two multiples around v need testing;
 *   - otherwise s = floor(v * 10^-k) and s + 1 bracket v: take whichever
 *     is inside, or the nearer one (ties: the even one) when both are.
 * The scaled ends are computed as 4 * x * 10^-k from a 64-bit g >= 10^-k *
 * 2^(63 - b) (b = floor(log2 10^-k)) by one 64x64->128 multiply; the top
 * word keeps 31 fraction bits, the rest of the product is dropped, and a
 * nonzero fraction is recorded in the lowest bit ("round to odd").  That
 * is enough to compare each end exactly with the even integers 4s, 4s+4,
 * 4*sp10 ... and v with the midpoint 4s+2.  tools/f32_check_all.c checks
 * every float32; t/c/test_json.c checks the table against exact powers
 * and floats of every exponent against an exact big-number reference.
 *
 * Vector path.  On x86-64 with AVX2 (checked at run time; the file is
 * built with the compiler's default flags) the array writers take eight
 * numbers at a time.  Floats: the split, the shortest decimal and its
 * nine digits in 64-bit lanes, each 64x64->128 product of
 * msv_f32_shortest made of two 32x32->64 multiplies (the three ends' top
 * words come out as the same numbers the scalar code gets with its borrow
 * and carry), then the text of each laid out by the scalar code
 * (msv_f32_text).  Ids below 10^8: the digit words with their ',' shifted
 * into place, stored whole.  An array of eight or more ends with the
 * eight numbers that end it, of which only the lanes not yet written are
 * written (no scalar tail).  The text is the scalar code's, byte for byte
 * (t/c/test_json.c; tools/f32_check_all.c on every float32).
 */

#include <string.h>

#include "msv_json.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MSV_JSON_AVX2  1
#include <immintrin.h>
#endif


typedef unsigned __int128  msv_u128;

/* forced: at -O2 gcc leaves the larger static inline ones out of line */
#define MSV_HOT  static inline __attribute__((always_inline))

#define MSV_ZEROS8      0x3030303030303030ULL   /* "00000000" */
#define MSV_1E8         100000000u

#define MSV_F32_Q_MIN   (-149)                  /* exponent of denormals */
#define MSV_F32_C_MIN   0x800000u               /* 2^23, implicit bit */

/* see msv_json.h; m = -31..45 */
const uint64_t
msv_json_pow10[MSV_JSON_POW10_MAX - MSV_JSON_POW10_MIN + 1] = {
    0x81ceb32c4b43fcf5ULL,  /* 10^-31 */
    0xa2425ff75e14fc32ULL,  /* 10^-30 */
    0xcad2f7f5359a3b3fULL,  /* 10^-29 */
    0xfd87b5f28300ca0eULL,  /* 10^-28 */
    0x9e74d1b791e07e49ULL,  /* 10^-27 */
    0xc612062576589ddbULL,  /* 10^-26 */
    0xf79687aed3eec552ULL,  /* 10^-25 */
    0x9abe14cd44753b53ULL,  /* 10^-24 */
    0xc16d9a0095928a28ULL,  /* 10^-23 */
    0xf1c90080baf72cb2ULL,  /* 10^-22 */
    0x971da05074da7befULL,  /* 10^-21 */
    0xbce5086492111aebULL,  /* 10^-20 */
    0xec1e4a7db69561a6ULL,  /* 10^-19 */
    0x9392ee8e921d5d08ULL,  /* 10^-18 */
    0xb877aa3236a4b44aULL,  /* 10^-17 */
    0xe69594bec44de15cULL,  /* 10^-16 */
    0x901d7cf73ab0acdaULL,  /* 10^-15 */
    0xb424dc35095cd810ULL,  /* 10^-14 */
    0xe12e13424bb40e14ULL,  /* 10^-13 */
    0x8cbccc096f5088ccULL,  /* 10^-12 */
    0xafebff0bcb24aaffULL,  /* 10^-11 */
    0xdbe6fecebdedd5bfULL,  /* 10^-10 */
    0x89705f4136b4a598ULL,  /* 10^-9 */
    0xabcc77118461cefdULL,  /* 10^-8 */
    0xd6bf94d5e57a42bdULL,  /* 10^-7 */
    0x8637bd05af6c69b6ULL,  /* 10^-6 */
    0xa7c5ac471b478424ULL,  /* 10^-5 */
    0xd1b71758e219652cULL,  /* 10^-4 */
    0x83126e978d4fdf3cULL,  /* 10^-3 */
    0xa3d70a3d70a3d70bULL,  /* 10^-2 */
    0xcccccccccccccccdULL,  /* 10^-1 */
    0x8000000000000001ULL,  /* 10^0 */
    0xa000000000000001ULL,  /* 10^1 */
    0xc800000000000001ULL,  /* 10^2 */
    0xfa00000000000001ULL,  /* 10^3 */
    0x9c40000000000001ULL,  /* 10^4 */
    0xc350000000000001ULL,  /* 10^5 */
    0xf424000000000001ULL,  /* 10^6 */
    0x9896800000000001ULL,  /* 10^7 */
    0xbebc200000000001ULL,  /* 10^8 */
    0xee6b280000000001ULL,  /* 10^9 */
    0x9502f90000000001ULL,  /* 10^10 */
    0xba43b74000000001ULL,  /* 10^11 */
    0xe8d4a51000000001ULL,  /* 10^12 */
    0x9184e72a00000001ULL,  /* 10^13 */
    0xb5e620f480000001ULL,  /* 10^14 */
    0xe35fa931a0000001ULL,  /* 10^15 */
    0x8e1bc9bf04000001ULL,  /* 10^16 */
    0xb1a2bc2ec5000001ULL,  /* 10^17 */
    0xde0b6b3a76400001ULL,  /* 10^18 */
    0x8ac7230489e80001ULL,  /* 10^19 */
    0xad78ebc5ac620001ULL,  /* 10^20 */
    0xd8d726b7177a8001ULL,  /* 10^21 */
    0x878678326eac9001ULL,  /* 10^22 */
    0xa968163f0a57b401ULL,  /* 10^23 */
    0xd3c21bcecceda101ULL,  /* 10^24 */
    0x84595161401484a1ULL,  /* 10^25 */
    0xa56fa5b99019a5c9ULL,  /* 10^26 */
    0xcecb8f27f4200f3bULL,  /* 10^27 */
    0x813f3978f8940985ULL,  /* 10^28 */
    0xa18f07d736b90be6ULL,  /* 10^29 */
    0xc9f2c9cd04674edfULL,  /* 10^30 */
    0xfc6f7c4045812297ULL,  /* 10^31 */
    0x9dc5ada82b70b59eULL,  /* 10^32 */
    0xc5371912364ce306ULL,  /* 10^33 */
    0xf684df56c3e01bc7ULL,  /* 10^34 */
    0x9a130b963a6c115dULL,  /* 10^35 */
    0xc097ce7bc90715b4ULL,  /* 10^36 */
    0xf0bdc21abb48db21ULL,  /* 10^37 */
    0x96769950b50d88f5ULL,  /* 10^38 */
    0xbc143fa4e250eb32ULL,  /* 10^39 */
    0xeb194f8e1ae525feULL,  /* 10^40 */
    0x92efd1b8d0cf37bfULL,  /* 10^41 */
    0xb7abc627050305aeULL,  /* 10^42 */
    0xe596b7b0c643c71aULL,  /* 10^43 */
    0x8f7e32ce7bea5c70ULL,  /* 10^44 */
    0xb35dbf821ae4f38cULL,  /* 10^45 */
};

static const char  msv_dig2[200] =
    "0001020304050607080910111213141516171819"
    "2021222324252627282930313233343536373839"
    "4041424344454647484950515253545556575859"
    "6061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";


MSV_HOT void
msv_store64(char *p, uint64_t v)
{
    /* digit words keep the first character in the low byte */
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    memcpy(p, &v, 8);
}


/* Eight ASCII digits of v < 10^8, zero-padded, first digit in byte 0. */
MSV_HOT uint64_t
msv_digits8(uint32_t v)
{
    uint64_t  x, h, y, t;

    /* 32-bit lanes: v / 10^4, v % 10^4 */
    x = (v / 10000) | ((uint64_t) (v % 10000) << 32);

    /* 16-bit lanes: each lane / 100 (5243 / 2^19 is exact below 10^4) */
    h = ((x * 5243) >> 19) & 0x0000007f0000007fULL;
    y = h | ((x - h * 100) << 16);

    /* 8-bit lanes: each lane / 10 (103 / 2^10 is exact below 100) */
    t = ((y * 103) >> 10) & 0x000f000f000f000fULL;

    return t | ((y - t * 10) << 8) | MSV_ZEROS8;
}


MSV_HOT char *
msv_put_u32(char *p, uint32_t v)
{
    uint64_t  z;
    uint32_t  hi;
    int       lz;

    if (v < MSV_1E8) {
        z = msv_digits8(v);

        /* leading zero digits; the top bit keeps one digit for v == 0 */
        lz = __builtin_ctzll((z ^ MSV_ZEROS8) | (1ULL << 63)) >> 3;
        msv_store64(p, z >> (lz * 8));
        return p + 8 - lz;
    }

    hi = v / MSV_1E8;
    v -= hi * MSV_1E8;

    if (hi >= 10) {
        memcpy(p, &msv_dig2[hi * 2], 2);
        p += 2;

    } else {
        *p++ = (char) ('0' + hi);
    }

    msv_store64(p, msv_digits8(v));
    return p + 8;
}


MSV_HOT char *
msv_put_i32(char *p, int32_t v)
{
    if (v < 0) {
        *p++ = '-';
        return msv_put_u32(p, 0u - (uint32_t) v);
    }

    return msv_put_u32(p, (uint32_t) v);
}


char *
msv_fmt_u32(char *p, uint32_t v)
{
    return msv_put_u32(p, v);
}


char *
msv_fmt_i32(char *p, int32_t v)
{
    return msv_put_i32(p, v);
}


char *
msv_fmt_u64(char *p, uint64_t v)
{
    uint64_t  top;
    uint32_t  lo, mid;

    if (v <= UINT32_MAX) {
        return msv_put_u32(p, (uint32_t) v);
    }

    lo = (uint32_t) (v % MSV_1E8);
    top = v / MSV_1E8;

    if (top < MSV_1E8) {
        p = msv_put_u32(p, (uint32_t) top);

    } else {
        mid = (uint32_t) (top % MSV_1E8);
        p = msv_put_u32(p, (uint32_t) (top / MSV_1E8));
        msv_store64(p, msv_digits8(mid));
        p += 8;
    }

    msv_store64(p, msv_digits8(lo));
    return p + 8;
}


char *
msv_fmt_i64(char *p, int64_t v)
{
    if (v < 0) {
        *p++ = '-';
        return msv_fmt_u64(p, 0 - (uint64_t) v);
    }

    return msv_fmt_u64(p, (uint64_t) v);
}


/* ------------------------------------------------------------------ */
/* float32                                                              */

static const uint32_t  msv_pow10_u32[10] = {
    1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000,
    1000000000
};


/* floor(x / 2^31) with a nonzero remainder recorded in the low bit */
MSV_HOT uint64_t
msv_rop(uint64_t x)
{
    return (x >> 31) | ((x & 0x7fffffff) != 0);
}


/*
 * The shortest, closest decimal d * 10^k of c * 2^q (c > 0); d may end in
 * zeros.  Integer forms of the logarithms:
 *   floor(q log10 2)          = (q * 315653) >> 20
 *   floor(log10(3/4 * 2^q))   = (q * 315653 - 131008) >> 20
 *   floor(e log2 10)          = (e * 1741647) >> 19
 * exact over the exponents a float32 has.  The three ends share one
 * product, g * (4c +- 2) 2^h = g * 4c 2^h +- g 2^(h+1) exactly.  The
 * choice is written as selects: branches would follow the digits.
 */
MSV_HOT uint32_t
msv_f32_shortest(uint32_t c, int q, int *kp)
{
    msv_u128  pv;
    uint64_t  g, lo, hi, dlo, llo, vb, vbl, vbr, s, sp10, out, near, ten;
    int       k, h, low, uin, win, upin, wpin, up;

    /* bottom of a binade: the float below is half as far */
    low = (c == MSV_F32_C_MIN) & (q != MSV_F32_Q_MIN);

    k = (q * 315653 - (low ? 131008 : 0)) >> 20;
    h = q + ((-k * 1741647) >> 19) + 32;
    g = msv_json_pow10[-k - MSV_JSON_POW10_MIN];

    /*
     * The top words of g 4c 2^h and of it -+ the distances to the ends,
     * g 2^(h+1) (g 2^h below v at the bottom of a binade).  h is in
     * 32..35, so each shifted g splits over two words.  Plain 64-bit
     * halves: compilers move 128-bit values through memory.
     */
    pv = (msv_u128) g * ((uint64_t) c << (h + 2));
    lo = (uint64_t) pv;
    hi = (uint64_t) (pv >> 64);
    dlo = g << (h + 1);
    llo = g << (h + 1 - low);

    vb = msv_rop(hi);
    vbl = msv_rop(hi - (g >> (63 - h + low)) - (lo < llo));
    vbr = msv_rop(hi + (g >> (63 - h)) + (lo + dlo < lo));

    *kp = k;
    out = c & 1;            /* odd c: the ends are not in the interval */

    /*
     * s and s + 1: which are inside; both: the nearer, ties to even
     * (vb & 3 is 4v - 4s: above 2 is past the midpoint, 2 is on it)
     */
    s = vb >> 2;
    uin = vbl + out <= s << 2;
    win = ((s + 1) << 2) + out <= vbr;
    up = (vb & 3) + (s & 1) > 2;
    near = s + (uint64_t) (win & ((!uin) | up));

    /* a multiple of ten inside has fewer digits: it wins */
    sp10 = (s / 10) * 10;
    upin = vbl + out <= sp10 << 2;
    wpin = ((sp10 + 10) << 2) + out <= vbr;
    ten = upin ? sp10 : sp10 + 10;

    return (uint32_t) ((upin != wpin && s >= 10) ? ten : near);
}


/* split a float32 into c * 2^q; returns 0 for zero, -1 for NaN/Inf */
MSV_HOT int
msv_f32_split(uint32_t bits, uint32_t *c, int *q)
{
    uint32_t  e, f;

    e = (bits >> 23) & 0xff;
    f = bits & 0x7fffff;

    if (e == 0xff) {
        return -1;
    }

    if (e == 0) {
        *c = f;
        *q = MSV_F32_Q_MIN;
        return f != 0;
    }

    *c = f | MSV_F32_C_MIN;
    *q = (int) e - 150;
    return 1;
}


int
msv_f32_decimal(float v, uint32_t *digits, int *exp10)
{
    uint32_t  bits, c, d;
    int       q, k, rc;

    memcpy(&bits, &v, 4);

    rc = msv_f32_split(bits, &c, &q);
    if (rc < 0) {
        return -1;
    }

    if (rc == 0) {
        *digits = 0;
        *exp10 = 0;
        return 0;
    }

    d = msv_f32_shortest(c, q, &k);
    while (d % 10 == 0) {
        d /= 10;
        k++;
    }

    *digits = d;
    *exp10 = k;
    return 0;
}


/* bytes msv_f32_text may store (22 used) */
#define MSV_F32_ROOM   MSV_F32_ARRAY_STORE

/*
 * The digits of d (0 < d < 10^9) left-aligned to nine, as msv_f32_text
 * takes them: the first in *hi, the next eight in *w (first in the low
 * byte).  Returns the decimal exponent of the first digit of d * 10^k.
 */
MSV_HOT int
msv_f32_digits(uint32_t d, int k, uint32_t *hi, uint64_t *w)
{
    uint32_t  nd;
    int       b;

    b = 32 - __builtin_clz(d);
    nd = (uint32_t) (b * 1233) >> 12;
    nd += d >= msv_pow10_u32[nd];
    d *= msv_pow10_u32[9 - nd];
    *hi = d / MSV_1E8;
    *w = msv_digits8(d - *hi * MSV_1E8);

    return k + (int) nd - 1;
}


/*
 * The text of the float32 with these bits at p, returns its end; stores
 * up to MSV_F32_ROOM bytes.  For a finite nonzero value, hi, w and x are
 * its digits and the exponent of the first (msv_f32_digits); zero, NaN
 * and the infinities do not read them.
 */
MSV_HOT char *
msv_f32_text(char *p, uint32_t bits, uint32_t hi, uint64_t w, int x)
{
    uint32_t  ex;
    uint64_t  z, slo, shi, frac;
    char     *o;
    int       n, ip;

    /* the sign is stored always and kept for negative values */
    p[0] = '-';
    o = p + (bits >> 31);

    if ((bits & 0x7fffffff) >= 0x7f800000) {
        memcpy(p, "null", 4);
        return p + 4;
    }

    if ((bits & 0x7fffffff) == 0) {
        memcpy(o, "0.0", 3);
        return o + 3;
    }

    /* significant digits: nine less the trailing zeros */
    z = w ^ MSV_ZEROS8;
    n = 9 - (z ? __builtin_clzll(z) >> 3 : 8);

    /* the nine digits, then '0' up to byte 15, in two words */
    slo = (w << 8) | ('0' + hi);
    shi = (w >> 56) | (MSV_ZEROS8 << 8);

    if (x >= 0 && x <= 8) {
        /* ddd.ddd, or ddd000.0: the padding gives the zeros */
        ip = x + 1;
        msv_store64(o, slo);
        msv_store64(o + 8, shi);
        o[ip] = '.';
        frac = ip < 8 ? (slo >> (ip * 8)) | (shi << (64 - ip * 8))
                      : shi >> (ip * 8 - 64);
        msv_store64(o + ip + 1, frac);
        return o + ip + 1 + (n > ip ? n - ip : 1);
    }

    if (x < 0 && x >= -4) {
        /* 0.000ddd: "0." and -x - 1 zeros */
        msv_store64(o, MSV_ZEROS8 ^ ((uint64_t) ('0' ^ '.') << 8));
        msv_store64(o + 1 - x, slo);
        msv_store64(o + 9 - x, shi);
        return o + 1 - x + n;
    }

    /* d.ddde-x; with one digit the 'e' goes over the '.' */
    o[0] = (char) ('0' + hi);
    msv_store64(o + 1, (w << 8) | '.');
    msv_store64(o + 9, w >> 56);
    o += n > 1 ? n + 1 : 1;
    *o++ = 'e';

    ex = (uint32_t) x;
    if (x < 0) {
        *o++ = '-';
        ex = (uint32_t) -x;
    }

    if (ex >= 10) {
        memcpy(o, &msv_dig2[ex * 2], 2);
        return o + 2;
    }

    *o = (char) ('0' + ex);
    return o + 1;
}


/* writes v at p, returns the end; stores up to MSV_F32_ROOM bytes */
MSV_HOT char *
msv_put_f32(char *p, float v)
{
    uint32_t  bits, c, d, hi;
    uint64_t  w;
    int       q, k, x;

    memcpy(&bits, &v, 4);

    hi = 0;
    w = 0;
    x = 0;

    if (msv_f32_split(bits, &c, &q) > 0) {
        d = msv_f32_shortest(c, q, &k);
        x = msv_f32_digits(d, k, &hi, &w);
    }

    return msv_f32_text(p, bits, hi, w, x);
}


char *
msv_fmt_f32(char *p, float v)
{
    char    buf[MSV_F32_ROOM] = { 0 };
    size_t  len;

    /* a bounce buffer keeps the stores within MSV_F32_MAX_CHARS */
    len = (size_t) (msv_put_f32(buf, v) - buf);
    memcpy(p, buf, MSV_F32_MAX_CHARS);
    return p + len;
}


#if (MSV_JSON_AVX2)

/* ------------------------------------------------------------------ */
/* AVX2: eight numbers at a time                                        */

#define MSV_AVX2  __attribute__((target("avx2")))
#define MSV_AVX2_HOT  MSV_HOT MSV_AVX2

#define msv_v32(x)  _mm256_set1_epi32((int) (x))
#define msv_v64(x)  _mm256_set1_epi64x((long long) (x))


/* msv_digits8 on four values < 10^8, one a 64-bit lane */
MSV_AVX2_HOT __m256i
msv_digits8_avx2(__m256i v)
{
    __m256i  a, y, t;

    /* 32-bit fields: v / 10^4, v % 10^4 */
    a = _mm256_srli_epi64(_mm256_mul_epu32(v, msv_v64(0xd1b71759)), 45);
    y = _mm256_or_si256(a, _mm256_slli_epi64(
            _mm256_sub_epi64(v, _mm256_mul_epu32(a, msv_v64(10000))), 32));

    /* 16-bit fields: each / 100, % 100 */
    t = _mm256_srli_epi16(_mm256_mulhi_epu16(y, _mm256_set1_epi16(5243)), 3);
    y = _mm256_or_si256(t, _mm256_slli_epi32(
            _mm256_sub_epi16(y, _mm256_mullo_epi16(t, _mm256_set1_epi16(100))),
            16));

    /* bytes: each / 10, % 10 (6554 / 2^16 is exact below 100) */
    t = _mm256_mulhi_epu16(y, _mm256_set1_epi16(6554));
    y = _mm256_sub_epi16(y, _mm256_mullo_epi16(t, _mm256_set1_epi16(10)));

    return _mm256_or_si256(_mm256_or_si256(t, _mm256_slli_epi16(y, 8)),
                           _mm256_set1_epi8('0'));
}


/* the digit count less one of values below 10^9 (32-bit lanes) */
MSV_AVX2_HOT __m256i
msv_count9_avx2(__m256i d)
{
    __m256i   n;
    uint32_t  i, p;

    n = _mm256_setzero_si256();

    for (i = 1, p = 10; i < 9; i++, p *= 10) {
        n = _mm256_sub_epi32(n, _mm256_cmpgt_epi32(d, msv_v32(p - 1)));
    }

    return n;
}


/* msv_rop of the top word of g * cc * 2^h (cc < 2^32; h - 32, 64 - h) */
MSV_AVX2_HOT __m256i
msv_rop_avx2(__m256i gh, __m256i g, __m256i cc, __m256i shl, __m256i shr)
{
    __m256i  hi, z;

    /* g * cc = gh * cc * 2^32 + (g mod 2^32) * cc; shifted by h - 64 */
    hi = _mm256_add_epi64(_mm256_sllv_epi64(_mm256_mul_epu32(gh, cc), shl),
                          _mm256_srlv_epi64(_mm256_mul_epu32(g, cc), shr));

    z = _mm256_cmpeq_epi64(_mm256_and_si256(hi, msv_v64(0x7fffffff)),
                           _mm256_setzero_si256());

    return _mm256_or_si256(_mm256_srli_epi64(hi, 31),
                           _mm256_add_epi64(z, msv_v64(1)));
}


/*
 * msv_f32_shortest on four floats, one a 64-bit lane, from their c, h,
 * low (all ones or zero) and table index in 32-bit lanes.  The three ends
 * are g * (4c - 2 + low), g * 4c and g * (4c + 2), shifted by h: the
 * products msv_f32_shortest takes apart with its borrow and carry, made
 * whole here, each from two 32x32->64 multiplies.
 */
MSV_AVX2_HOT __m256i
msv_f32_shortest_avx2(__m128i c32, __m128i h32, __m128i low32,
    __m128i idx)
{
    __m256i  g, gh, h, shl, shr, c, cv, vb, vbl, vbr, out, s, s4, vblo;
    __m256i  nuin, nwin, up, near, sp10, nupin, nwpin, ten, sel;

    g = _mm256_i32gather_epi64((const long long *) msv_json_pow10, idx, 8);
    gh = _mm256_srli_epi64(g, 32);

    h = _mm256_cvtepu32_epi64(h32);
    shl = _mm256_sub_epi64(h, msv_v64(32));
    shr = _mm256_sub_epi64(msv_v64(64), h);

    c = _mm256_cvtepu32_epi64(c32);
    cv = _mm256_slli_epi64(c, 2);

    vb = msv_rop_avx2(gh, g, cv, shl, shr);
    vbl = msv_rop_avx2(gh, g, _mm256_sub_epi64(
              _mm256_sub_epi64(cv, msv_v64(2)), _mm256_cvtepi32_epi64(low32)),
              shl, shr);
    vbr = msv_rop_avx2(gh, g, _mm256_add_epi64(cv, msv_v64(2)), shl, shr);

    /* the choice of msv_f32_shortest; a mask is all ones where false */
    out = _mm256_and_si256(c, msv_v64(1));

    s = _mm256_srli_epi64(vb, 2);
    s4 = _mm256_slli_epi64(s, 2);
    vblo = _mm256_add_epi64(vbl, out);

    nuin = _mm256_cmpgt_epi64(vblo, s4);
    nwin = _mm256_cmpgt_epi64(
               _mm256_add_epi64(_mm256_add_epi64(s4, msv_v64(4)), out), vbr);
    up = _mm256_cmpgt_epi64(
             _mm256_add_epi64(_mm256_and_si256(vb, msv_v64(3)),
                              _mm256_and_si256(s, msv_v64(1))),
             msv_v64(2));
    near = _mm256_sub_epi64(s, _mm256_andnot_si256(nwin,
                                   _mm256_or_si256(nuin, up)));

    sp10 = _mm256_srli_epi64(_mm256_mul_epu32(s, msv_v64(0xcccccccd)), 35);
    sp10 = _mm256_add_epi64(_mm256_slli_epi64(sp10, 3),
                            _mm256_slli_epi64(sp10, 1));

    nupin = _mm256_cmpgt_epi64(vblo, _mm256_slli_epi64(sp10, 2));
    nwpin = _mm256_cmpgt_epi64(
                _mm256_add_epi64(_mm256_slli_epi64(
                    _mm256_add_epi64(sp10, msv_v64(10)), 2), out), vbr);
    ten = _mm256_add_epi64(sp10, _mm256_and_si256(nupin, msv_v64(10)));
    sel = _mm256_and_si256(_mm256_xor_si256(nupin, nwpin),
                           _mm256_cmpgt_epi64(s, msv_v64(9)));

    return _mm256_blendv_epi8(near, ten, sel);
}


/*
 * The fixed-point layouts of msv_f32_text (-4 <= x <= 8) as byte
 * shuffles of a float's record (msv_f32_digits_avx2): bytes 0-8 the nine
 * digits, 9-14 '0', 15 '.'.  Entry x + 4 writes the integer part (x + 1
 * digits, or one '0' for x < 0), the '.', then the fraction ("0" and
 * -x - 1 zeros for x < 0, then the digits), padded with '0': every text
 * of that layout is a prefix of its 16 bytes.
 */
static const uint8_t  msv_f32_fixed[13][16] = {
    {  9, 15,  9,  9,  9,  0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  9 },
    {  9, 15,  9,  9,  0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  9,  9 },
    {  9, 15,  9,  0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  9,  9,  9 },
    {  9, 15,  0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  9,  9,  9,  9 },
    {  0, 15,  1,  2,  3,  4,  5,  6,  7,  8,  9,  9,  9,  9,  9,  9 },
    {  0,  1, 15,  2,  3,  4,  5,  6,  7,  8,  9,  9,  9,  9,  9,  9 },
    {  0,  1,  2, 15,  3,  4,  5,  6,  7,  8,  9,  9,  9,  9,  9,  9 },
    {  0,  1,  2,  3, 15,  4,  5,  6,  7,  8,  9,  9,  9,  9,  9,  9 },
    {  0,  1,  2,  3,  4, 15,  5,  6,  7,  8,  9,  9,  9,  9,  9,  9 },
    {  0,  1,  2,  3,  4,  5, 15,  6,  7,  8,  9,  9,  9,  9,  9,  9 },
    {  0,  1,  2,  3,  4,  5,  6, 15,  7,  8,  9,  9,  9,  9,  9,  9 },
    {  0,  1,  2,  3,  4,  5,  6,  7, 15,  8,  9,  9,  9,  9,  9,  9 },
    {  0,  1,  2,  3,  4,  5,  6,  7,  8, 15,  9,  9,  9,  9,  9,  9 },
};

/* a record's high word past its ninth digit: six '0' and the '.' */
#define MSV_F32_REC_TAIL  0x2e30303030303000ULL


/* msv_f32_digits_avx2's records of four floats (64-bit lanes: the first
 * digit r, the eight after it w) at rec, in order */
MSV_AVX2_HOT void
msv_f32_records_avx2(__m256i r, __m256i w, __m128i *rec)
{
    __m256i  lo, hq, a, b;

    lo = _mm256_or_si256(_mm256_slli_epi64(w, 8),
                         _mm256_add_epi64(r, msv_v64('0')));
    hq = _mm256_or_si256(_mm256_srli_epi64(w, 56), msv_v64(MSV_F32_REC_TAIL));
    a = _mm256_unpacklo_epi64(lo, hq);          /* floats 0 and 2 */
    b = _mm256_unpackhi_epi64(lo, hq);          /* 1 and 3 */
    _mm256_storeu_si256((__m256i *) rec, _mm256_permute2x128_si256(a, b,
                                                                   0x20));
    _mm256_storeu_si256((__m256i *) (rec + 2),
                        _mm256_permute2x128_si256(a, b, 0x31));
}


/*
 * msv_f32_split, msv_f32_shortest and msv_f32_digits on the eight floats
 * at v: for each, its record rec[i] (the first digit and the eight after
 * it as text, then msv_f32_fixed's constants) and the exponent x[i] of
 * its first digit.  Returns a mask with bit i set where float i is finite,
 * nonzero and of a fixed-point layout (-4 <= x <= 8).  The lanes of
 * zero, NaN and the infinities come out as garbage (every table index
 * stays inside the table), which is not read.
 */
MSV_AVX2_HOT uint32_t
msv_f32_digits_avx2(const float *v, __m128i *rec, int32_t *x)
{
    __m256i  bits, e, f, c, q, low, k, h, idx, d0, d1, d, n, m, dl, r, xv;
    __m256i  ok;

    bits = _mm256_loadu_si256((const __m256i *) v);
    e = _mm256_and_si256(_mm256_srli_epi32(bits, 23), msv_v32(0xff));
    f = _mm256_and_si256(bits, msv_v32(0x7fffff));

    c = _mm256_or_si256(f, _mm256_andnot_si256(
            _mm256_cmpeq_epi32(e, _mm256_setzero_si256()),
            msv_v32(MSV_F32_C_MIN)));
    q = _mm256_sub_epi32(_mm256_max_epi32(e, msv_v32(1)), msv_v32(150));
    low = _mm256_and_si256(_mm256_cmpeq_epi32(f, _mm256_setzero_si256()),
                           _mm256_cmpgt_epi32(e, msv_v32(1)));

    k = _mm256_srai_epi32(_mm256_sub_epi32(
            _mm256_mullo_epi32(q, msv_v32(315653)),
            _mm256_and_si256(low, msv_v32(131008))), 20);
    h = _mm256_add_epi32(_mm256_add_epi32(q, _mm256_srai_epi32(
            _mm256_mullo_epi32(_mm256_sub_epi32(_mm256_setzero_si256(), k),
                               msv_v32(1741647)), 19)), msv_v32(32));
    idx = _mm256_sub_epi32(msv_v32(-MSV_JSON_POW10_MIN), k);

    d0 = msv_f32_shortest_avx2(_mm256_castsi256_si128(c),
                               _mm256_castsi256_si128(h),
                               _mm256_castsi256_si128(low),
                               _mm256_castsi256_si128(idx));
    d1 = msv_f32_shortest_avx2(_mm256_extracti128_si256(c, 1),
                               _mm256_extracti128_si256(h, 1),
                               _mm256_extracti128_si256(low, 1),
                               _mm256_extracti128_si256(idx, 1));

    /* the eight d in 32-bit lanes, in order */
    d = _mm256_permutevar8x32_epi32(
            _mm256_blend_epi32(d0, _mm256_slli_epi64(d1, 32), 0xaa),
            _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));

    /* msv_f32_digits: n digits less one, d * 10^(8 - n) */
    n = msv_count9_avx2(d);
    xv = _mm256_add_epi32(k, n);
    _mm256_storeu_si256((__m256i *) x, xv);

    /* fixed layouts: an exponent field below 0xff, a value not zero,
     * x + 4 in 0..12 */
    ok = _mm256_andnot_si256(
            _mm256_or_si256(_mm256_cmpeq_epi32(e, msv_v32(0xff)),
                            _mm256_cmpeq_epi32(_mm256_or_si256(e, f),
                                               _mm256_setzero_si256())),
            _mm256_and_si256(_mm256_cmpgt_epi32(xv, msv_v32(-5)),
                             _mm256_cmpgt_epi32(msv_v32(9), xv)));

    m = _mm256_permutevar8x32_epi32(
            _mm256_setr_epi32(100000000, 10000000, 1000000, 100000, 10000,
                              1000, 100, 10), n);
    m = _mm256_blendv_epi8(m, msv_v32(1), _mm256_cmpeq_epi32(n, msv_v32(8)));
    dl = _mm256_mullo_epi32(d, m);

    /* the first digit, and the eight after it */
    d = _mm256_cvtepu32_epi64(_mm256_castsi256_si128(dl));
    r = _mm256_srli_epi64(_mm256_mul_epu32(d, msv_v64(0x55e63b89)), 57);
    msv_f32_records_avx2(r, msv_digits8_avx2(_mm256_sub_epi64(
        d, _mm256_mul_epu32(r, msv_v64(MSV_1E8)))), rec);

    d = _mm256_cvtepu32_epi64(_mm256_extracti128_si256(dl, 1));
    r = _mm256_srli_epi64(_mm256_mul_epu32(d, msv_v64(0x55e63b89)), 57);
    msv_f32_records_avx2(r, msv_digits8_avx2(_mm256_sub_epi64(
        d, _mm256_mul_epu32(r, msv_v64(MSV_1E8)))), rec + 4);

    return (uint32_t) _mm256_movemask_ps(_mm256_castsi256_ps(ok));
}


/*
 * The text of floats from..7 of a batch of eight at v, each with its ',',
 * from their records and exponents (msv_f32_digits_avx2).  A float of a
 * fixed-point layout is one shuffle of its record, stored whole after its
 * sign, with no branch on the layout; the others go through msv_f32_text.
 */
MSV_AVX2_HOT char *
msv_f32s_text_avx2(char *p, const float *v, uint32_t from, uint32_t fixed,
    const __m128i *rec, const int32_t *x)
{
    uint32_t  j, bits, nd, il, fl;
    uint64_t  lo, hq, z;

    for (j = from; j < 8; j++) {
        memcpy(&bits, &v[j], 4);
        lo = (uint64_t) _mm_cvtsi128_si64(rec[j]);
        hq = (uint64_t) _mm_extract_epi64(rec[j], 1);

        if ((fixed >> j) & 1) {
            /* significant digits: nine less the trailing zeros; the
             * integer part's length, then the fraction's (at least 1) */
            z = ((lo >> 8) | (hq << 56)) ^ MSV_ZEROS8;
            nd = 9 - (z ? (uint32_t) __builtin_clzll(z) >> 3 : 8);
            il = x[j] >= 0 ? (uint32_t) x[j] + 1 : 1;
            fl = (int32_t) nd - x[j] - 1 > 0 ? nd - x[j] - 1 : 1;

            p[0] = '-';
            p += bits >> 31;
            _mm_storeu_si128((__m128i *) p, _mm_shuffle_epi8(rec[j],
                _mm_loadu_si128((const __m128i *) msv_f32_fixed[x[j] + 4])));
            p += il + 1 + fl;

        } else {
            p = msv_f32_text(p, bits, (uint32_t) (lo & 0xff) - '0',
                             (lo >> 8) | (hq << 56), x[j]);
        }

        *p++ = ',';
    }

    return p;
}


/*
 * msv_json_f32s_part, eight floats at a time (n >= 8), the last n % 8 as
 * the last lanes of the eight that end the array.  Batch b's digits come
 * before batch b - 1's text, so that the vector work of the one runs
 * beside the scalar work of the other (bench/results/json.md,
 * 2026-12-04 21:50).
 */
MSV_AVX2 static char *
msv_json_f32s_avx2(char *p, const float *v, uint32_t n)
{
    uint32_t   last, b, fixed[2];
    int32_t    x[2][8];
    __m128i    rec[2][8];

    last = (n - 1) / 8;     /* the last batch, which ends at v + n */

    fixed[0] = msv_f32_digits_avx2(v, rec[0], x[0]);

    for (b = 1; b <= last; b++) {
        fixed[b & 1] = msv_f32_digits_avx2(b < last ? v + 8 * b : v + n - 8,
                                           rec[b & 1], x[b & 1]);
        p = msv_f32s_text_avx2(p, v + 8 * (b - 1), 0, fixed[(b - 1) & 1],
                               rec[(b - 1) & 1], x[(b - 1) & 1]);
    }

    return msv_f32s_text_avx2(p, v + n - 8, 8 * (last + 1) - n,
                              fixed[last & 1], rec[last & 1], x[last & 1]);
}


/*
 * Four ids below 10^8 with their digit counts less one (64-bit lanes): the
 * word msv_put_i32 stores, shifted down over the leading zeros, with the
 * ',' after the digits (an 8-digit id has it in the next byte).
 */
MSV_AVX2_HOT void
msv_ids_words_avx2(__m256i v, __m256i nd, uint64_t *word)
{
    __m256i  sh;

    sh = _mm256_sub_epi64(msv_v64(56), _mm256_slli_epi64(nd, 3));

    _mm256_storeu_si256((__m256i *) word, _mm256_or_si256(
        _mm256_srlv_epi64(msv_digits8_avx2(v), sh),
        _mm256_sllv_epi64(msv_v64(','), _mm256_sub_epi64(msv_v64(64), sh))));
}


/*
 * The eight ids at ids from lane "from" on, each with its ','; all eight
 * must be readable (an array's last few ids are the last lanes of the
 * eight that end it: msv_json_ids_avx2).
 */
MSV_AVX2_HOT char *
msv_ids8_avx2(char *p, const int32_t *ids, uint32_t from)
{
    __m256i   v, bad, nd;
    uint32_t  j, len[8];
    uint64_t  word[8];

    v = _mm256_loadu_si256((const __m256i *) ids);
    bad = _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_setzero_si256(), v),
                          _mm256_cmpgt_epi32(v, msv_v32(MSV_1E8 - 1)));

    if (!_mm256_testz_si256(bad, bad)) {
        for (j = from; j < 8; j++) {
            p = msv_put_i32(p, ids[j]);
            *p++ = ',';
        }

        return p;
    }

    /* digits less one (0..7); the text takes them and the ',' */
    nd = msv_count9_avx2(v);
    _mm256_storeu_si256((__m256i *) len, _mm256_add_epi32(nd, msv_v32(2)));

    msv_ids_words_avx2(_mm256_cvtepu32_epi64(_mm256_castsi256_si128(v)),
                       _mm256_cvtepu32_epi64(_mm256_castsi256_si128(nd)),
                       word);
    msv_ids_words_avx2(_mm256_cvtepu32_epi64(_mm256_extracti128_si256(v, 1)),
                       _mm256_cvtepu32_epi64(_mm256_extracti128_si256(nd, 1)),
                       word + 4);

    for (j = from; j < 8; j++) {
        msv_store64(p, word[j]);
        p[8] = ',';
        p += len[j];
    }

    return p;
}


/*
 * msv_json_ids_part, eight ids at a time (n >= 8), the last n % 8 as the
 * last lanes of the eight that end the array (which overlap ids already
 * written): at a cost no higher than the scalar code's for one id, and
 * lower from two on.
 */
MSV_AVX2 static char *
msv_json_ids_avx2(char *p, const int32_t *ids, uint32_t n)
{
    uint32_t  i;

    for (i = 0; i + 8 <= n; i += 8) {
        p = msv_ids8_avx2(p, ids + i, 0);
    }

    if (i < n) {
        p = msv_ids8_avx2(p, ids + n - 8, 8 - (n - i));
    }

    return p;
}


static int  msv_json_avx2 = -1;     /* unknown yet */


/* whether an array of n goes through the vector path */
static inline int
msv_json_vector(uint32_t n)
{
    if (n < 8) {
        return 0;
    }

    if (msv_json_avx2 < 0) {
        msv_json_simd(1);
    }

    return msv_json_avx2;
}

#endif


/* ------------------------------------------------------------------ */
/* Arrays                                                               */

char *
msv_json_ids(char *p, const int32_t *ids, uint32_t n)
{
    *p++ = '[';

    if (n == 0) {
        *p++ = ']';
        return p;
    }

    p = msv_json_ids_part(p, ids, n);
    p[-1] = ']';
    return p;
}


uint32_t
msv_json_ids_fit(size_t room)
{
    /* each id stores at most its 11 characters, then the ',' */
    room /= MSV_I32_MAX_CHARS + 1;
    return room > UINT32_MAX ? UINT32_MAX : (uint32_t) room;
}


int
msv_json_simd(int on)
{
#if (MSV_JSON_AVX2)
    __builtin_cpu_init();
    msv_json_avx2 = on && __builtin_cpu_supports("avx2");

    return msv_json_avx2;
#else
    return 0;
#endif
}


char *
msv_json_ids_part(char *p, const int32_t *ids, uint32_t n)
{
    uint32_t  i;

#if (MSV_JSON_AVX2)
    if (msv_json_vector(n)) {
        return msv_json_ids_avx2(p, ids, n);
    }
#endif

    for (i = 0; i < n; i++) {
        p = msv_put_i32(p, ids[i]);
        *p++ = ',';
    }

    return p;
}


char *
msv_json_f32s(char *p, const float *v, uint32_t n)
{
    *p++ = '[';

    if (n == 0) {
        *p++ = ']';
        return p;
    }

    p = msv_json_f32s_part(p, v, n);
    p[-1] = ']';
    return p;
}


uint32_t
msv_json_f32s_fit(size_t room)
{
    /*
     * each float's text and ',' take at most MSV_F32_MAX_CHARS; the last
     * one stores up to MSV_F32_ROOM past its start
     */
    if (room < MSV_F32_ROOM) {
        return 0;
    }

    room = (room - MSV_F32_ROOM) / MSV_F32_MAX_CHARS + 1;
    return room > UINT32_MAX ? UINT32_MAX : (uint32_t) room;
}


char *
msv_json_f32s_part(char *p, const float *v, uint32_t n)
{
    uint32_t  i;

#if (MSV_JSON_AVX2)
    if (msv_json_vector(n)) {
        return msv_json_f32s_avx2(p, v, n);
    }
#endif

    for (i = 0; i < n; i++) {
        p = msv_put_f32(p, v[i]);
        *p++ = ',';
    }

    return p;
}
