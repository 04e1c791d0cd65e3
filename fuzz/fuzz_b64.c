/*
 * fuzz_b64.c: libFuzzer target for the streaming base64 encoder and the
 * strict decoder (ngx_module/msv_b64.c) of the packed mask format.
 *
 * The input after its first byte is the data.  It is encoded in pieces
 * whose sizes come from a generator seeded by the first byte, once through
 * the portable code and once through the vector path where the CPU has
 * it (writing around the cache when the first byte is odd), into a buffer of exactly msv_b64_len bytes (so that a store past it
 * is reported): both must equal a plain one-shot reference encoder, every
 * piece must stay within msv_b64_put_max, and the text must decode back to
 * the data.  The input is also given to the decoder as text: when it is
 * accepted, encoding what it decoded to gives the same text back (the
 * decoder accepts canonical base64 only).
 */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msv_b64.h"
#include "b64_ref.h"


#define msv_fz_check(cond)                                                   \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "fuzz_b64: %s:%d: %s\n", __FILE__, __LINE__,     \
                    #cond);                                                  \
            abort();                                                         \
        }                                                                    \
    } while (0)


static void
msv_fz_encode(const uint8_t *in, size_t n, unsigned seed, const char *ref)
{
    char       *out, *p, *end;
    long        dn;
    size_t      i, piece, len;
    uint8_t    *back;
    uint32_t    r;
    msv_b64_t   s;

    len = msv_b64_len(n);
    out = malloc(len ? len : 1);
    back = malloc(n ? n : 1);
    msv_fz_check(out != NULL && back != NULL);

    /* the seed's low bit: write around the cache */
    msv_b64_init(&s, (int) (seed & 1));
    p = out;
    r = seed * 2654435761u + 1;

    for (i = 0; i < n; i += piece) {
        r = r * 1103515245u + 12345u;
        switch (r >> 30) {
        case 0: piece = 4; break;
        case 1: piece = 1 + (r >> 8) % 5; break;
        case 2: piece = (r >> 8) % 97; break;
        default: piece = (r >> 8) % 4096; break;
        }

        if (piece > n - i) {
            piece = n - i;
        }

        end = msv_b64_put(&s, p, in + i, piece);
        msv_fz_check((size_t) (end - p) <= msv_b64_put_max(piece));
        p = end;
    }

    p = msv_b64_end(&s, p);
    msv_fz_check((size_t) (p - out) == len);
    msv_fz_check(memcmp(out, ref, len) == 0);

    dn = msv_b64_decode(out, len, back);
    msv_fz_check(dn == (long) n && memcmp(back, in, n) == 0);

    free(out);
    free(back);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int        simd;
    char      *ref, *text;
    long       dn;
    size_t     n;
    uint8_t   *dec;
    unsigned   seed;

    if (size < 1) {
        return 0;
    }

    seed = data[0];
    data++;
    size--;

    ref = malloc(msv_b64_len(size) + 1);
    msv_fz_check(ref != NULL);
    n = msv_b64_ref(data, size, ref);
    msv_fz_check(n == msv_b64_len(size));

    for (simd = 0; simd < 2; simd++) {
        if (msv_b64_simd(simd) == simd) {
            msv_fz_encode(data, size, seed, ref);
        }
    }

    msv_b64_simd(1);
    free(ref);

    /* the input as text: canonical, or refused */
    dec = malloc(size / 4 * 3 + 1);
    msv_fz_check(dec != NULL);
    dn = msv_b64_decode((const char *) data, size, dec);

    if (dn >= 0) {
        text = malloc(msv_b64_len(dn) + 1);
        msv_fz_check(text != NULL);
        n = msv_b64_ref(dec, dn, text);
        msv_fz_check(n == size && memcmp(text, data, size) == 0);
        free(text);
    }

    free(dec);

    return 0;
}
