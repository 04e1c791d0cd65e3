/*
 * test_b64.c: the streaming base64 encoder and strict decoder
 * (ngx_module/msv_b64.c) behind the packed mask format.
 *
 *   - RFC 4648's test vectors;
 *   - random data fed in random pieces (as rows arrive) against a plain
 *     one-shot reference encoder, and the store bound of every piece,
 *     through the portable code and, where the CPU has it, the vector
 *     path (msv_b64_simd), each also writing around the cache
 *     (msv_b64_init); every length from 0 to 100 at every carry and
 *     source alignment, and pieces of 1000..1100 bytes at every output
 *     offset, the same every way;
 *   - pieces that start right after, or end right before, a page that
 *     cannot be read: the encoder reads nothing outside what it is given
 *     (the vector path loads 32 bytes at a time);
 *   - decoding round trips, and every kind of malformed text rejected.
 *
 * MSV_TEST_SEED (environment) changes the random seed.
 */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

#include "tap.h"
#include "msv_b64.h"
#include "b64_ref.h"
#include "mix.h"


static uint64_t  rng_state;


static uint64_t
rng_next(void)
{
    return msv_splitmix64(&rng_state);
}


static size_t
enc_all(const void *in, size_t n, char *out)
{
    char       *p;
    msv_b64_t   s;

    msv_b64_init(&s, 0);
    p = msv_b64_put(&s, out, in, n);
    p = msv_b64_end(&s, p);

    return p - out;
}


/*
 * 2000 random buffers (lengths below 101 for the first 1000, then up to
 * 60000) fed in random pieces, against the reference, the text starting
 * at a random offset of out (0..67).
 */

static void
random_rounds(uint8_t *in, uint8_t *back, char *out, char *ref,
    const char *path, int around)
{
    char      *o;
    long       dn;
    char      *p, *end;
    size_t     i, n, len, piece, rlen;
    unsigned   rounds, bad_enc, bad_bound, bad_dec;
    msv_b64_t  s;

    bad_enc = bad_bound = bad_dec = 0;

    for (rounds = 0; rounds < 2000; rounds++) {
        n = rng_next() % (rounds < 1000 ? 101 : 60000);

        for (i = 0; i < n; i++) {
            in[i] = (uint8_t) rng_next();
        }

        /* fed in random pieces, 4-byte ones most often (as the rows are) */
        msv_b64_init(&s, around);
        o = out + rng_next() % 68;
        p = o;

        for (i = 0; i < n; i += piece) {
            switch (rng_next() % 4) {
            case 0: piece = 4; break;
            case 1: piece = 1 + rng_next() % 5; break;
            case 2: piece = 4 * (1 + rng_next() % 100); break;
            default: piece = rng_next() % 3000; break;
            }

            if (piece > n - i) {
                piece = n - i;
            }

            end = msv_b64_put(&s, p, in + i, piece);
            if ((size_t) (end - p) > msv_b64_put_max(piece)) {
                bad_bound++;
            }

            p = end;
        }

        p = msv_b64_end(&s, p);
        len = p - o;

        rlen = msv_b64_ref(in, n, ref);
        if (len != rlen || len != msv_b64_len(n)
            || memcmp(o, ref, len) != 0)
        {
            if (bad_enc++ < 3) {
                tap_diag("%s, round %u: %zu bytes encoded to %zu chars, "
                         "reference %zu", path, rounds, n, len, rlen);
            }
        }

        dn = msv_b64_decode(o, len, back);
        if (dn != (long) n || memcmp(back, in, n) != 0) {
            bad_dec++;
        }
    }

    tap_ok(bad_enc == 0, "%s: 2000 random buffers fed in random pieces "
           "encode as the one-shot reference (%u differ)", path, bad_enc);
    tap_ok(bad_bound == 0, "%s: no piece writes more than msv_b64_put_max "
           "(%u did)", path, bad_bound);
    tap_ok(bad_dec == 0, "%s: every encoding decodes back to its bytes (%u "
           "did not)", path, bad_dec);
}


/*
 * c bytes at in, then n more, through a new stream into out: 0 when the
 * text is ref (rlen characters).
 */

static int
enc_after_carry(const uint8_t *in, size_t c, size_t n, char *out,
    const char *ref, size_t rlen, int around)
{
    char       *p;
    msv_b64_t   s;

    msv_b64_init(&s, around);
    p = msv_b64_put(&s, out, in, c);
    p = msv_b64_put(&s, p, in + c, n);
    p = msv_b64_end(&s, p);

    return (size_t) (p - out) != rlen || memcmp(out, ref, rlen) != 0;
}


/*
 * Pieces of every length n0..n1 of random bytes, put after a carry of 0,
 * 1 or 2 bytes (which sit just before the piece) from each of srcs source
 * alignments, the text starting at each of dsts offsets of out.
 *   - 0..100 from 8 alignments: the steps of 6 and 24 bytes and the
 *     group-by-group tail all meet the carry somewhere;
 *   - 1000..1100 (those of 1024 bytes and more may be written around the
 *     cache in whole lines) at offsets 0..67: every distance to the next
 *     line boundary, and starts that never reach one in whole groups.
 */

static void
pieces(uint8_t *in, char *out, char *ref, const char *path, int around,
    size_t n0, size_t n1, size_t srcs, size_t dsts)
{
    size_t    i, n, c, a, o, rlen;
    unsigned  bad;

    bad = 0;

    for (n = n0; n <= n1; n++) {
        for (c = 0; c < 3; c++) {
            for (a = 0; a < srcs; a++) {
                for (i = 0; i < c + n + a; i++) {
                    in[i] = (uint8_t) rng_next();
                }

                rlen = msv_b64_ref(in + a, c + n, ref);

                for (o = 0; o < dsts; o++) {
                    if (enc_after_carry(in + a, c, n, out + o, ref, rlen,
                                        around)
                        && bad++ < 3)
                    {
                        tap_diag("%s: %zu bytes after a carry of %zu, source "
                                 "offset %zu, output offset %zu differ",
                                 path, n, c, a, o);
                    }
                }
            }
        }
    }

    tap_ok(bad == 0, "%s: lengths %zu..%zu after every carry, from %zu "
           "source alignments into %zu output offsets, encode as the "
           "reference (%u differ)", path, n0, n1, srcs, dsts, bad);
}


/*
 * Pieces of every length 0..n1 (after a carry of 0, 1 or 2 bytes) placed
 * at the very start and at the very end of a readable page between two
 * that are not: a load outside the piece faults, in any build.  The
 * carry is fed from another buffer, so the piece's neighbours are the
 * guard pages themselves.
 */

static void
guarded(char *out, char *ref, const char *path, int around, size_t n1)
{
    char       *p;
    size_t      n, c, i, page, rlen, at;
    uint8_t    *map, *b, all[3 + 4096];
    unsigned    bad;
    msv_b64_t   s;

    page = (size_t) sysconf(_SC_PAGESIZE);
    if (n1 > page || n1 + 3 > sizeof(all)) {
        n1 = page < sizeof(all) - 3 ? page : sizeof(all) - 3;
    }

    map = mmap(NULL, 3 * page, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED
        || mprotect(map, page, PROT_NONE) != 0
        || mprotect(map + 2 * page, page, PROT_NONE) != 0)
    {
        tap_ok(0, "%s: guard pages mapped", path);
        return;
    }

    bad = 0;

    for (n = 0; n <= n1; n++) {
        for (c = 0; c < 3; c++) {
            for (at = 0; at < 2; at++) {
                b = at ? map + 2 * page - n : map + page;

                for (i = 0; i < c + n; i++) {
                    all[i] = (uint8_t) rng_next();
                }

                memcpy(b, all + c, n);
                rlen = msv_b64_ref(all, c + n, ref);

                msv_b64_init(&s, around);
                p = msv_b64_put(&s, out, all, c);
                p = msv_b64_put(&s, p, b, n);
                p = msv_b64_end(&s, p);

                if (((size_t) (p - out) != rlen || memcmp(out, ref, rlen))
                    && bad++ < 3)
                {
                    tap_diag("%s: %zu bytes after a carry of %zu at the %s "
                             "of a page differ", path, n, c,
                             at ? "end" : "start");
                }
            }
        }
    }

    munmap(map, 3 * page);

    tap_ok(bad == 0, "%s: pieces of 0..%zu bytes flush against unreadable "
           "pages encode as the reference, reading nothing outside them (%u "
           "differ)", path, n1, bad);
}


int
main(void)
{
    static const char  *rfc[][2] = {
        { "", "" }, { "f", "Zg==" }, { "fo", "Zm8=" }, { "foo", "Zm9v" },
        { "foob", "Zm9vYg==" }, { "fooba", "Zm9vYmE=" },
        { "foobar", "Zm9vYmFy" }
    };
    static const char  *bad[] = {
        "Zg=", "Zg", "Z===", "Zg==Zg==", "Zh==", "Zm9=", "Zm=v", "Zm9v!A==",
        "Zm9v\nA==", "====", "Zm 9"
    };

    int          simd, around;
    char        *out, *ref;
    long         dn;
    size_t       i, k, n, len;
    uint8_t     *in, *back;
    msv_b64_t    s;
    const char  *path;

    rng_state = getenv("MSV_TEST_SEED") ? strtoull(getenv("MSV_TEST_SEED"),
                                                   NULL, 0)
                                        : 0x6b36340aULL;
    tap_diag("seed %llu", (unsigned long long) rng_state);

    for (i = 0; i < sizeof(rfc) / sizeof(rfc[0]); i++) {
        char  buf[32];

        n = enc_all(rfc[i][0], strlen(rfc[i][0]), buf);
        tap_ok(n == strlen(rfc[i][1]) && memcmp(buf, rfc[i][1], n) == 0,
               "RFC 4648 vector \"%s\" -> \"%s\"", rfc[i][0], rfc[i][1]);
    }

    in = malloc(1 << 16);
    back = malloc(1 << 16);
    out = malloc((1 << 16) / 3 * 4 + 128);
    ref = malloc((1 << 16) / 3 * 4 + 64);

    for (simd = 0; simd < 2; simd++) {
        if (msv_b64_simd(simd) != simd) {
            tap_diag("no vector path on this CPU: the portable code only");
            continue;
        }

        for (around = 0; around < 2; around++) {
            path = simd ? (around ? "vector, around the cache" : "vector")
                        : (around ? "portable, around asked" : "portable");

            random_rounds(in, back, out, ref, path, around);
            pieces(in, out, ref, path, around, 0, 100, 8, 1);
            pieces(in, out, ref, path, around, 1000, 1100, 1, 68);
            guarded(out, ref, path, around, 1200);
        }
    }

    msv_b64_simd(1);

    /* the bound msv_b64_fits promises, whatever the carry */
    k = 0;
    for (i = 0; i < 3; i++) {
        for (len = 0; len < 200; len++) {
            char  buf[256];

            msv_b64_init(&s, 0);
            msv_b64_put(&s, buf, in, i);
            n = msv_b64_fits(len);
            if ((size_t) (msv_b64_put(&s, buf, in, n) - buf) > len) {
                k++;
            }
        }
    }
    tap_ok(k == 0, "msv_b64_fits(room) bytes never write more than room "
           "characters");

    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        dn = msv_b64_decode(bad[i], strlen(bad[i]), back);
        tap_ok(dn == -1, "malformed text %zu (of length %zu) is rejected", i,
               strlen(bad[i]));
    }

    free(in);
    free(back);
    free(out);
    free(ref);

    return tap_done();
}
