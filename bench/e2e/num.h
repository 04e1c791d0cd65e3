/*
 * num.h: JSON numbers of the e2e response checker (check.c), read from
 * the text yajl hands to its number callback and, in the fast path
 * (fast.c), straight from the body: the lexer that finds where a number
 * token ends, with the grammar yajl's lexer accepts, and the conversions.
 */

#ifndef MSV_E2E_NUM_H
#define MSV_E2E_NUM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>


/* A decimal integer of at most 18 digits, optionally negative (the
 * text of a JSON number); 0, or -1 when it is not one. */
int msv_parse_int(const char *s, size_t n, long *out);

/* A JSON number as a double (see num.c for the precision); 0, or -1
 * when the text is not a number strtod reads whole. */
int msv_parse_num(const char *s, size_t n, double *out);


/* what msv_lex_num found */
enum {
    MSV_NUM_MORE = 0,       /* the text ends before the token does */
    MSV_NUM_OK = 1,         /* a number of *len bytes, s[*len] after it */
    MSV_NUM_BAD = -1        /* not a number token yajl would accept */
};

#define MSV_NUM_PLAIN  1    /* flags: digits only (no sign, fraction or
                               exponent) */

/*
 * The JSON number token at s (before end), as yajl's lexer takes it:
 * -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, ended by the first byte
 * that cannot go on, which must be before end (a number is only known to
 * be whole once the next byte is seen).  *flags: MSV_NUM_PLAIN or 0.
 */
int msv_lex_num(const char *s, const char *end, size_t *len, int *flags);

#define MSV_NUM_SLOW  2     /* msv_lex_f64: a number, but one that
                               msv_parse_num sends to strtod */

/*
 * msv_lex_num and msv_parse_num in one pass, byte by byte: MSV_NUM_OK
 * with *x exactly what msv_parse_num gives for the token's *len bytes;
 * MSV_NUM_SLOW when it is a number (of *len bytes) that msv_parse_num
 * does not convert directly; otherwise as msv_lex_num.
 */
int msv_lex_f64_bytes(const char *s, const char *end, size_t *len,
    double *x);

/* 10^0 .. 10^22, msv_parse_num's */
extern const double  msv_pow10[23];


/*
 * The decimal digits that begin the 8 bytes at s (all readable): how
 * many (0 to 8), their value in *v.  Eight bytes at a time: a byte is
 * not a digit when below '0' (its subtraction borrows: exact for the
 * first such byte, which is all that counts), above '9' (adding 0x46 to
 * its low 7 bits sets the top one) or above 0x7f; the digits, moved to
 * the top of the word behind zeros, are joined in pairs, fours and eights
 * by three multiplications.
 */
static inline unsigned
msv_digits8(const char *s, uint64_t *v)
{
    uint64_t  x, t, nd;
    unsigned  k;

    memcpy(&x, s, 8);
    t = x - 0x3030303030303030ULL;
    nd = ((t & ~x) | ((x & 0x7f7f7f7f7f7f7f7fULL) + 0x4646464646464646ULL)
          | x) & 0x8080808080808080ULL;
    k = nd ? (unsigned) __builtin_ctzll(nd) >> 3 : 8;
    if (k == 0) {
        *v = 0;
        return 0;
    }
    t <<= 8 * (8 - k);
    t = (t * 10 + (t >> 8)) & 0x00ff00ff00ff00ffULL;
    t = (t * 100 + (t >> 16)) & 0x0000ffff0000ffffULL;
    t = (t * 10000 + (t >> 32)) & 0x00000000ffffffffULL;
    *v = t;
    return k;
}


/*
 * msv_lex_f64_bytes, the common case eight digits at a time: an integer
 * part of 1 to 7 digits, a fraction of 1 to 7, no exponent, 24 bytes
 * readable.  Then every digit counts (at most 14: msv_parse_num takes up
 * to 19), m is the digits read as one integer and the scale minus the
 * fraction's length, as msv_parse_num has them, and the same division
 * gives the same double.  Anything else: byte by byte.
 */
static inline int
msv_lex_f64(const char *s, const char *end, size_t *len, double *x)
{
    static const uint64_t  pow10u[8] = {
        1, 10, 100, 1000, 10000, 100000, 1000000, 10000000
    };
    const char  *p = s;
    uint64_t     ip, fp;
    unsigned     ki, kf;
    int          neg;

    if (end - s < 24) {
        goto bytes;
    }

    neg = *p == '-';
    p += neg;
    ki = msv_digits8(p, &ip);
    if (ki == 0 || ki == 8 || (p[0] == '0' && ki > 1) || p[ki] != '.') {
        goto bytes;
    }
    p += ki + 1;
    kf = msv_digits8(p, &fp);
    if (kf == 0 || kf == 8 || p[kf] == 'e' || p[kf] == 'E') {
        goto bytes;
    }

    /* m < 10^14: exact as a signed integer and as a double */
    *len = (size_t) (p + kf - s);
    *x = (double) (int64_t) (ip * pow10u[kf] + fp) / msv_pow10[kf];
    *x = neg ? -*x : *x;
    return MSV_NUM_OK;

bytes:
    return msv_lex_f64_bytes(s, end, len, x);
}


#endif /* MSV_E2E_NUM_H */
