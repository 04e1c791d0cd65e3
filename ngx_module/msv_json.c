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
 */

#include <string.h>

#include "msv_json.h"


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


#define MSV_F32_ROOM   24   /* bytes msv_put_f32 may store (22 used) */

/* writes v at p, returns the end; stores up to MSV_F32_ROOM bytes */
MSV_HOT char *
msv_put_f32(char *p, float v)
{
    uint32_t  bits, c, d, hi, nd, ex;
    uint64_t  w, z, slo, shi, frac;
    char     *o;
    int       q, k, rc, x, n, ip, b;

    memcpy(&bits, &v, 4);

    /* the sign is stored always and kept for negative values */
    p[0] = '-';
    o = p + (bits >> 31);

    rc = msv_f32_split(bits, &c, &q);

    if (rc <= 0) {
        if (rc < 0) {
            memcpy(p, "null", 4);
            return p + 4;
        }
        memcpy(o, "0.0", 3);
        return o + 3;
    }

    d = msv_f32_shortest(c, q, &k);

    /* nd digits, left-aligned to nine: hi, then eight in w */
    b = 32 - __builtin_clz(d);
    nd = (uint32_t) (b * 1233) >> 12;
    nd += d >= msv_pow10_u32[nd];
    d *= msv_pow10_u32[9 - nd];
    hi = d / MSV_1E8;
    w = msv_digits8(d - hi * MSV_1E8);

    /* significant digits: nine less the trailing zeros */
    z = w ^ MSV_ZEROS8;
    n = 9 - (z ? __builtin_clzll(z) >> 3 : 8);

    /* the nine digits, then '0' up to byte 15, in two words */
    slo = (w << 8) | ('0' + hi);
    shi = (w >> 56) | (MSV_ZEROS8 << 8);

    x = k + (int) nd - 1;           /* v = d.ddd * 10^x */

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


/* ------------------------------------------------------------------ */
/* Arrays                                                               */

size_t
msv_json_ids_max(uint32_t n)
{
    /* each id and its ',' or ']' */
    return 2 + (size_t) n * (MSV_I32_MAX_CHARS + 1);
}


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


char *
msv_json_ids_part(char *p, const int32_t *ids, uint32_t n)
{
    uint32_t  i;

    for (i = 0; i < n; i++) {
        p = msv_put_i32(p, ids[i]);
        *p++ = ',';
    }

    return p;
}


size_t
msv_json_f32s_max(uint32_t n)
{
    /*
     * each float's text and separator fit in 16 bytes; the last one
     * stores up to MSV_F32_ROOM past its start
     */
    return (size_t) n * MSV_F32_MAX_CHARS + MSV_F32_ROOM;
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

    for (i = 0; i < n; i++) {
        p = msv_put_f32(p, v[i]);
        *p++ = ',';
    }

    return p;
}
