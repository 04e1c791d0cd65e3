/*
 * b64_ref.h: the textbook base64 encoder (RFC 4648, with padding), one
 * 6-bit group at a time: the reference msv_b64 is checked against, by
 * t/c/test_b64.c and fuzz/fuzz_b64.c.  Header-only.
 */

#ifndef MSV_B64_REF_H
#define MSV_B64_REF_H

#include <stddef.h>
#include <stdint.h>

/* in[0..n) as base64 into out (4 * ceil(n / 3) bytes); their number */
static size_t
msv_b64_ref(const uint8_t *in, size_t n, char *out)
{
    static const char  a[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t             i, o;
    uint32_t           g;

    o = 0;
    for (i = 0; i < n; i += 3) {
        g = (uint32_t) in[i] << 16;
        if (i + 1 < n) {
            g |= (uint32_t) in[i + 1] << 8;
        }
        if (i + 2 < n) {
            g |= in[i + 2];
        }
        out[o++] = a[g >> 18];
        out[o++] = a[(g >> 12) & 63];
        out[o++] = i + 1 < n ? a[(g >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? a[g & 63] : '=';
    }

    return o;
}

#endif /* MSV_B64_REF_H */
