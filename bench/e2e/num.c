/*
 * num.c: JSON numbers of the response checker (see num.h).
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "num.h"


int
msv_parse_int(const char *s, size_t n, long *out)
{
    size_t  i = 0;
    long    v = 0;
    int     neg = 0;

    if (n > 0 && s[0] == '-') {
        neg = 1;
        i = 1;
    }
    if (i == n || n - i > 18) {
        return -1;
    }
    for ( /* void */ ; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return -1;
        }
        v = v * 10 + (s[i] - '0');
    }
    *out = neg ? -v : v;
    return 0;
}


/*
 * A JSON number (its syntax checked by the lexer) as a double.  Up to 19
 * significant digits and a decimal exponent within 10^+-22 are converted
 * directly (within an ulp or so: plenty for the checks here, and several
 * times faster than strtod); anything else goes through strtod.
 */

const double  msv_pow10[] = {
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12,
    1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22
};

int
msv_parse_num(const char *s, size_t n, double *out)
{
    char      buf[64], *end;
    size_t    i = 0;
    uint64_t  m = 0;
    int       neg = 0, digits = 0, scale = 0, e = 0, eneg = 0;
    double    x;

    if (i < n && s[i] == '-') {
        neg = 1;
        i++;
    }
    for ( /* void */ ; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
        if (digits < 19) {
            m = m * 10 + (uint64_t) (s[i] - '0');
            digits += m != 0;
        } else {
            scale++;
        }
    }
    if (i < n && s[i] == '.') {
        for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
            if (digits < 19) {
                m = m * 10 + (uint64_t) (s[i] - '0');
                digits += m != 0;
                scale--;
            }
        }
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '-' || s[i] == '+')) {
            eneg = s[i] == '-';
            i++;
        }
        for ( /* void */ ; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
            if (e < 10000) {
                e = e * 10 + (s[i] - '0');
            }
        }
    }
    scale += eneg ? -e : e;

    if (i == n && scale >= -22 && scale <= 22) {
        x = (double) m;
        x = scale < 0 ? x / msv_pow10[-scale] : x * msv_pow10[scale];
        *out = neg ? -x : x;
        return 0;
    }

    if (n == 0 || n >= sizeof(buf)) {
        return -1;
    }
    memcpy(buf, s, n);
    buf[n] = '\0';
    *out = strtod(buf, &end);
    return end == buf + n ? 0 : -1;
}


/* Digits from s on, before end; returns the first byte that is not one
 * (end when they run to it). */

static const char *
msv_lex_digits(const char *s, const char *end)
{
    while (s < end && (unsigned char) (*s - '0') <= 9) {
        s++;
    }
    return s;
}


int
msv_lex_num(const char *s, const char *end, size_t *len, int *flags)
{
    const char  *p = s;
    int          plain = 1;

    if (p < end && *p == '-') {
        plain = 0;
        p++;
    }
    if (p == end) {
        return MSV_NUM_MORE;
    }
    if (*p == '0') {
        p++;                        /* a leading 0 stands alone */
    } else if ((unsigned char) (*p - '1') <= 8) {
        p = msv_lex_digits(p + 1, end);
    } else {
        return MSV_NUM_BAD;         /* "-" without digits */
    }
    if (p == end) {
        return MSV_NUM_MORE;
    }

    if (*p == '.') {
        plain = 0;
        if (++p == end) {
            return MSV_NUM_MORE;
        }
        if ((unsigned char) (*p - '0') > 9) {
            return MSV_NUM_BAD;
        }
        p = msv_lex_digits(p, end);
        if (p == end) {
            return MSV_NUM_MORE;
        }
    }

    if (*p == 'e' || *p == 'E') {
        plain = 0;
        if (++p == end) {
            return MSV_NUM_MORE;
        }
        if (*p == '+' || *p == '-') {
            if (++p == end) {
                return MSV_NUM_MORE;
            }
        }
        if ((unsigned char) (*p - '0') > 9) {
            return MSV_NUM_BAD;
        }
        p = msv_lex_digits(p, end);
        if (p == end) {
            return MSV_NUM_MORE;
        }
    }

    *len = (size_t) (p - s);
    *flags = plain ? MSV_NUM_PLAIN : 0;
    return MSV_NUM_OK;
}


/*
 * The digits of msv_parse_num: up to 19 significant ones into *m, the
 * rest counted in *scale (before the point) or dropped (after it).
 */

static const char *
msv_lex_mantissa_digits(const char *s, const char *end, uint64_t *m,
    int *digits, int *scale, int frac)
{
    unsigned  c;

    for ( /* void */ ; s < end && (c = (unsigned char) (*s - '0')) <= 9; s++) {
        if (*digits < 19) {
            *m = *m * 10 + c;
            *digits += *m != 0;
            *scale -= frac;
        } else {
            *scale += !frac;
        }
    }
    return s;
}


int
msv_lex_f64_bytes(const char *s, const char *end, size_t *len, double *x)
{
    const char  *p = s;
    uint64_t     m = 0;
    int          neg = 0, digits = 0, scale = 0, e = 0, eneg = 0;
    unsigned     c;

    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p == end) {
        return MSV_NUM_MORE;
    }
    if (*p == '0') {
        p++;                        /* a leading 0 stands alone */
    } else if ((unsigned char) (*p - '1') <= 8) {
        p = msv_lex_mantissa_digits(p, end, &m, &digits, &scale, 0);
    } else {
        return MSV_NUM_BAD;
    }
    if (p == end) {
        return MSV_NUM_MORE;
    }

    if (*p == '.') {
        if (++p == end) {
            return MSV_NUM_MORE;
        }
        if ((unsigned char) (*p - '0') > 9) {
            return MSV_NUM_BAD;
        }
        p = msv_lex_mantissa_digits(p, end, &m, &digits, &scale, 1);
        if (p == end) {
            return MSV_NUM_MORE;
        }
    }

    if (*p == 'e' || *p == 'E') {
        if (++p == end) {
            return MSV_NUM_MORE;
        }
        if (*p == '+' || *p == '-') {
            eneg = *p == '-';
            if (++p == end) {
                return MSV_NUM_MORE;
            }
        }
        if ((unsigned char) (*p - '0') > 9) {
            return MSV_NUM_BAD;
        }
        for ( /* void */ ; p < end && (c = (unsigned char) (*p - '0')) <= 9;
             p++)
        {
            if (e < 10000) {
                e = e * 10 + (int) c;
            }
        }
        if (p == end) {
            return MSV_NUM_MORE;
        }
    }

    *len = (size_t) (p - s);
    scale += eneg ? -e : e;
    if (scale < -22 || scale > 22) {
        return MSV_NUM_SLOW;
    }
    *x = (double) m;
    *x = scale < 0 ? *x / msv_pow10[-scale] : *x * msv_pow10[scale];
    *x = neg ? -*x : *x;
    return MSV_NUM_OK;
}
