/*
 * test_e2e_check.c: the response checker of bench/e2e_load and of the
 * end-to-end tests (bench/e2e/check.c), on documents made here: valid
 * JSON and packed masks pass, and each kind of broken mask, JSON or
 * packed, or of broken logprobs, tokens or finish_reason in a whole
 * choice, is caught with a message saying what is wrong; and whole
 * responses (bench/e2e/resp.c, sse.c), streams fed a byte or a few at a
 * time, with what spans their events checked; and responses of several
 * choices (sampling_params.n), whole and streamed, with a missing or a
 * duplicate index or a bad row in one choice caught, and their hashes the
 * same however the events split them.  The parts of its fast path, each
 * against the code it stands in for, on random inputs and edge cases:
 * the vector logsumexp against libm's exp (lse.c), the base64 group
 * decoder against msv_b64_decode (b64dec.c), the number lexer against
 * msv_lex_num and msv_parse_num (num.c), the hash four values a step
 * against one at a time; and the fast path as a whole (scan.c, fast.c)
 * against yajl alone (no_fast), on documents of every mask variant, valid
 * and broken at random, fed in pieces of every size: the same verdict,
 * message and hashes.  t/50-client.t runs the load client itself against
 * a live stack.
 */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "tap.h"
#include "mix.h"
#include "msv_b64.h"
#include "msv_json.h"
#include "b64dec.h"
#include "check.h"
#include "lse.h"
#include "num.h"
#include "resp.h"


/* Parse one document and check it; returns the checker's verdict. */

static int
check_expect(const char *json, const msv_expect_t *e, char *why,
    size_t whylen)
{
    int           rc;
    msv_doc_t     d;
    yajl_handle   h;
    yajl_status   st;

    memset(&d, 0, sizeof(d));
    msv_doc_reset(&d, e);
    h = yajl_alloc(&msv_doc_callbacks, NULL, &d);
    st = yajl_parse(h, (const unsigned char *) json, strlen(json));
    if (st == yajl_status_ok) {
        st = yajl_complete_parse(h);
    }
    yajl_free(h);

    if (st != yajl_status_ok) {
        snprintf(why, whylen, "%s", d.bad[0] ? d.bad : "(yajl error)");
        rc = -1;
    } else {
        rc = msv_doc_check(&d);
        snprintf(why, whylen, "%s", d.bad);
    }

    msv_doc_free(&d);
    return rc;
}


/* One event of a stream: no vocabulary, logprobs or max_tokens known. */

static int
check(const char *json, long top_k, double temperature, int variant,
    char *why, size_t whylen)
{
    msv_expect_t  e = { top_k, temperature, variant, 0, -1, -1, 0, 1 };

    return check_expect(json, &e, why, whylen);
}


static char *
b64(const void *p, size_t n)
{
    char       *s, *e;
    msv_b64_t   st;

    s = malloc(msv_b64_len(n) + 1);
    msv_b64_init(&st, 0);
    e = msv_b64_put(&st, s, p, n);
    e = msv_b64_end(&st, e);
    *e = '\0';
    return s;
}


/* A packed choice: tokens, lengths, ids, logprobs. */

static char *
packed(const char *tokens, const int32_t *len, size_t n, const int32_t *ids,
    size_t n_ids, const float *lps, size_t n_lps, const char *fmt)
{
    char  *l, *i, *p, *out;

    l = b64(len, 4 * n);
    i = b64(ids, 4 * n_ids);
    p = b64(lps, 4 * n_lps);
    out = malloc(strlen(l) + strlen(i) + strlen(p) + 512);
    sprintf(out, "{\"request_id\":\"r\",\"choices\":[{\"index\":0,"
            "\"token_ids\":[%s],\"sampling_mask_packed\":{\"format\":\"%s\","
            "\"lengths\":\"%s\",\"ids\":\"%s\",\"logprobs\":\"%s\"},"
            "\"finish_reason\":null}]}", tokens, fmt, l, i, p);
    free(l);
    free(i);
    free(p);
    return out;
}


/* A whole choice, as the end-to-end tests check it: its parts. */

static char *
choice(const char *tokens, const char *mask, const char *mlps,
    const char *logprobs, const char *finish)
{
    char  *out;

    out = malloc(strlen(tokens) + strlen(mask) + strlen(mlps)
                 + strlen(logprobs) + strlen(finish) + 256);
    sprintf(out, "{\"choices\":[{\"index\":0%s%s%s%s%s%s%s%s%s,"
            "\"finish_reason\":%s}]}",
            tokens[0] ? ",\"token_ids\":" : "", tokens,
            mask[0] ? ",\"sampling_mask\":" : "", mask,
            mlps[0] ? ",\"sampling_mask_logprobs\":" : "", mlps,
            logprobs[0] ? ",\"logprobs\":" : "", logprobs, "", finish);
    return out;
}


/* A whole response of n choices through resp.c, fed `step` bytes at a
 * time (0: all at once); returns its verdict, and its hash in *hash. */

static int
check_resp_n(const char *body, int stream, long n_choices, size_t step,
    uint64_t *hash, char *why, size_t whylen)
{
    msv_resp_t  r;
    size_t      n = strlen(body), off, k;
    int         rc = 0;

    memset(&r, 0, sizeof(r));
    r.e.top_k = 10;
    r.e.temperature = 1.0;
    r.e.variant = MSV_MODE_SELECTED;
    r.e.vocab = 16;
    r.e.max_tokens = 2;
    r.e.logprobs = -1;
    r.e.whole = !stream;
    r.e.n = n_choices;
    r.stream = stream;
    r.prompt_len = 3;
    r.max_tokens = 2;
    r.ignore_eos = 1;
    msv_resp_reset(&r);

    for (off = 0; off < n && rc == 0; off += k) {
        k = step && n - off > step ? step : n - off;
        rc = msv_resp_data(&r, body + off, k);
    }
    if (rc == 0 && msv_resp_end(&r) == 0) {
        msv_resp_check(&r);
    }
    snprintf(why, whylen, "%s", r.bad);
    rc = r.bad[0] ? -1 : 0;
    if (hash != NULL) {
        *hash = r.hash;
    }
    msv_resp_free(&r);
    return rc;
}


static int
check_resp(const char *body, int stream, size_t step, char *why,
    size_t whylen)
{
    return check_resp_n(body, stream, 1, step, NULL, why, whylen);
}


/* ------------------------------------------------------------------ */
/* The fast path's parts against what they stand in for                 */

static uint64_t  rng_state = 0x7465737465326521ULL;


static uint64_t
rng(void)
{
    return msv_splitmix64(&rng_state);
}


static double
rng_unit(void)
{
    return (double) (rng() >> 11) / 9007199254740992.0;
}


/* A support row: the log-softmax, in double, of normal-ish logits (sd
 * about 2.5), stored as float32, as the worker's rows are. */

static void
make_lp_row(float *v, size_t n)
{
    size_t  i;
    double  mx = -INFINITY, sum = 0, z;

    for (i = 0; i < n; i++) {
        z = 2.5 * (rng_unit() + rng_unit() + rng_unit() - 1.5) * 2;
        v[i] = (float) z;
        mx = z > mx ? z : mx;
    }
    for (i = 0; i < n; i++) {
        sum += exp(v[i] - mx);
    }
    for (i = 0; i < n; i++) {
        v[i] = (float) (v[i] - mx - log(sum));
    }
}


/* The vector logsumexp and its exp against libm's, on the rows the
 * checker sees and on the edge cases. */

static void
test_lse(void)
{
    static const size_t  sizes[] = { 1, 2, 3, 4, 5, 7, 15, 16, 17, 100, 1000,
                                     8192, 151936 };
    static float   v[151936];
    static double  w[151936];
    double         x, got, want, rel, worst = 0, a, b, c, e;
    size_t         k, i, n;
    int            r, kind, ok;

    if (!msv_lse_simd(1)) {
        tap_diag("no AVX2 and FMA here: the vector logsumexp is not used");
    }

    /* the exp: relative error against libm's over [-708, 0] */
    for (k = 0; k < 2000000; k++) {
        x = k < 1000000 ? -2.0 * rng_unit() : -708.0 * rng_unit();
        got = msv_lse_exp(x);
        want = exp(x);
        rel = fabs(got - want) / want;
        worst = rel > worst ? rel : worst;
    }
    tap_ok(worst < 1e-15, "the logsumexp's exp: relative error %.3g "
           "against libm's on 2e6 values in [-708, 0]", worst);
    tap_ok(msv_lse_exp(0.0) == 1.0 && msv_lse_exp(-INFINITY) < 1e-300
           && msv_lse_exp(-1e300) < 1e-300 && msv_lse_exp(-745.5) < 1e-300,
           "its exp of 0 is 1, of -inf and below -708 under 1e-300");

    /* rows: the vector sum against the same formula with libm's exp */
    worst = 0;
    ok = 1;
    for (r = 0; r < 12; r++) {
        for (k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
            n = sizes[k];
            make_lp_row(v, n);
            kind = r % 4;
            for (i = 0; i < n; i++) {
                if (kind == 1 && rng() % 5 == 0) {
                    v[i] = -INFINITY;       /* a probability of 0 */
                } else if (kind == 2 && rng() % 3 == 0) {
                    v[i] = rng() % 2 ? -1e30f
                           : -700.0f - 100.0f * (float) rng_unit();
                }
                w[i] = v[i];
            }
            if (kind == 1) {
                v[rng() % n] = -0.5f;       /* not all of them -inf */
                for (i = 0; i < n; i++) {
                    w[i] = v[i];
                }
            }
            msv_lse_simd(1);
            a = msv_lse_f32(v, n);
            c = msv_lse_f64(w, n);
            msv_lse_simd(0);
            b = msv_lse_f32(v, n);
            e = msv_lse_f64(w, n);
            ok &= isfinite(a) && isfinite(c) && a == c;
            worst = fabs(a - b) > worst ? fabs(a - b) : worst;
            worst = fabs(c - e) > worst ? fabs(c - e) : worst;
        }
    }
    msv_lse_simd(1);
    tap_ok(ok && worst < 1e-12, "logsumexp of rows of 1 to 151936 values "
           "(some -inf, some below -700 or -1e30): float and double the "
           "same, %.3g at most from libm's exp", worst);

    v[0] = -3.0f;
    w[0] = -3.0;
    tap_ok(msv_lse_f32(v, 1) == -3.0 && msv_lse_f64(w, 1) == -3.0,
           "the logsumexp of a row of one value is that value");
    for (i = 0; i < 5; i++) {
        v[i] = -INFINITY;
        w[i] = -INFINITY;
    }
    a = msv_lse_f32(v, 5);
    c = msv_lse_f64(w, 5);
    msv_lse_simd(0);
    b = msv_lse_f32(v, 5);
    e = msv_lse_f64(w, 5);
    msv_lse_simd(1);
    tap_ok(a == -INFINITY && b == -INFINITY && c == -INFINITY
           && e == -INFINITY && msv_lse_f32(v, 0) == -INFINITY,
           "a row of -inf only (or of nothing) has a logsumexp of -inf");
}


static int
is_b64char(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')
           || (c >= '0' && c <= '9') || c == '+' || c == '/';
}


/* The group decoder against msv_b64_decode, valid text and text with a
 * character changed, vector and table paths. */

static void
test_b64dec(void)
{
    static uint8_t  src[3 * 40000], a[3 * 40000 + 64], b[3 * 40000 + 64];
    static char     txt[4 * 40000 + 8];
    size_t          n, len, got, k, whole = 0, stopped = 0;
    int             it, simd, bad = 0, pos, valid;
    msv_b64_t       st;
    char           *e;

    for (it = 0; it < 6000; it++) {
        n = it == 0 ? sizeof(src) : rng() % 700;
        for (k = 0; k < n; k++) {
            src[k] = (uint8_t) rng();
        }
        msv_b64_init(&st, 0);
        e = msv_b64_put(&st, txt, src, n);
        e = msv_b64_end(&st, e);
        len = (size_t) (e - txt);
        pos = -1;
        if (it % 2 && len > 0) {
            pos = (int) (rng() % len);
            txt[pos] = (char) (rng() % 256);
        }
        for (simd = 1; simd >= 0; simd--) {
            msv_b64dec_simd(simd);
            got = msv_b64dec_groups(txt, len / 4 * 4, a);
            /* what it decoded is what msv_b64_decode makes of it */
            if (got % 4 || got > len
                || msv_b64_decode(txt, got, b) != (long) (got / 4 * 3)
                || memcmp(a, b, got / 4 * 3) != 0)
            {
                bad++;
            }
            /* and it stopped only at a group with a character outside
             * the alphabet */
            if (got < len / 4 * 4) {
                valid = 1;
                for (k = 0; k < 4; k++) {
                    valid &= is_b64char(txt[got + k]);
                }
                bad += valid;
                stopped++;
            } else {
                whole++;
            }
        }
    }
    msv_b64dec_simd(1);
    tap_ok(bad == 0 && whole > 1000 && stopped > 1000,
           "base64 groups, vector and table: as msv_b64_decode, stopping "
           "at the first group not in the alphabet (%zu whole, %zu "
           "stopped, %d wrong)", whole, stopped, bad);
}


/* A random JSON number, or something near one. */

static size_t
make_number(char *s)
{
    static const char  *odd[] = { "-", "00", "01", "-0", "1.", ".5", "1e",
                                  "1e+", "1E-", "-.5", "1.e5", "0.0", "1e5",
                                  "9999999999", "2147483647", "2147483648",
                                  "-1", "1.5e-7", "12345678901234567890123",
                                  "0.000000000000000000000001", "1e400",
                                  "-1e-400", "1.0000000000000000000001" };
    size_t  n = 0, k, i;

    if (rng() % 8 == 0) {
        k = rng() % (sizeof(odd) / sizeof(odd[0]));
        strcpy(s, odd[k]);
        return strlen(s);
    }
    if (rng() % 2) {
        s[n++] = '-';
    }
    k = rng() % 4 == 0 ? 1 + rng() % 25 : 1 + rng() % 3;
    s[n++] = (char) (k > 1 || rng() % 2 ? '1' + rng() % 9 : '0');
    for (i = 1; i < k; i++) {
        s[n++] = (char) ('0' + rng() % 10);
    }
    if (rng() % 4) {
        s[n++] = '.';
        k = rng() % 4 == 0 ? 1 + rng() % 25 : 1 + rng() % 9;
        for (i = 0; i < k; i++) {
            s[n++] = (char) ('0' + rng() % 10);
        }
    }
    if (rng() % 5 == 0) {
        s[n++] = rng() % 2 ? 'e' : 'E';
        if (rng() % 2) {
            s[n++] = rng() % 2 ? '-' : '+';
        }
        k = 1 + rng() % 3;
        for (i = 0; i < k; i++) {
            s[n++] = (char) ('0' + rng() % 10);
        }
    }
    if (rng() % 16 == 0) {
        s[rng() % n] = (char) (rng() % 128);    /* broken */
    }
    return n;
}


/* The number lexer against msv_lex_num and msv_parse_num, the digits of
 * eight bytes against one at a time. */

static void
test_num(void)
{
    static const char  after[] = ",]} x.e-9";
    char                buf[128];
    size_t              n, room, len1, len2, k;
    int                 it, r1, r2, flags, bad = 0, oks = 0, fast = 0;
    double              x1, x2;
    uint64_t            v, want;
    unsigned            got;

    for (it = 0; it < 300000; it++) {
        memset(buf, 'Q', sizeof(buf));
        n = make_number(buf);
        buf[n] = after[rng() % (sizeof(after) - 1)];
        /* where the text ends: right after, or well after (the word path
         * needs 24 bytes), or inside the number */
        room = rng() % 3 == 0 ? n + 1 : rng() % 3 ? n + 40 : rng() % (n + 1);

        r1 = msv_lex_num(buf, buf + room, &len1, &flags);
        r2 = msv_lex_f64(buf, buf + room, &len2, &x2);
        if (r1 != MSV_NUM_OK) {
            bad += r2 != r1;
            continue;
        }
        if ((r2 != MSV_NUM_OK && r2 != MSV_NUM_SLOW) || len2 != len1) {
            bad++;
            continue;
        }
        oks++;
        if (r2 == MSV_NUM_OK) {
            fast += room >= 24;
            if (msv_parse_num(buf, len1, &x1) != 0
                || memcmp(&x1, &x2, sizeof(double)) != 0)
            {
                bad++;
            }
        }
    }
    tap_ok(bad == 0 && oks > 100000 && fast > 50000, "the number lexer and "
           "its conversion: as msv_lex_num and msv_parse_num, bit for bit "
           "(%d numbers, %d through the word path, %d wrong)", oks, fast,
           bad);

    bad = 0;
    for (it = 0; it < 200000; it++) {
        for (k = 0; k < 8; k++) {
            buf[k] = (char) (rng() % 3 ? '0' + rng() % 10 : rng() % 256);
        }
        got = msv_digits8(buf, &v);
        for (k = 0, want = 0; k < 8 && buf[k] >= '0' && buf[k] <= '9'; k++) {
            want = want * 10 + (uint64_t) (buf[k] - '0');
        }
        bad += got != k || v != want;
    }
    tap_ok(bad == 0, "the digits of eight bytes at once: as one at a time");
}


/* The hash four values a step against one at a time, and joined. */

static void
test_hash(void)
{
    static int32_t  v[3000];
    uint64_t        h1, p1, h2, p2, ha, pa, hb, pb;
    size_t          n, k, cut;
    int             it, bad = 0;

    for (it = 0; it < 3000; it++) {
        n = it % 100 == 0 ? 3000 : rng() % 40;
        for (k = 0; k < n; k++) {
            v[k] = (int32_t) (rng() % 4 == 0 ? rng() : rng() % 151936);
        }
        h1 = rng();
        p1 = 1;
        h2 = h1;
        p2 = 1;
        for (k = 0; k < n; k++) {
            h1 = h1 * MSV_HASH_P + (uint32_t) v[k] + 1;
            p1 *= MSV_HASH_P;
        }
        h2 = msv_hash_i32s(h2, &p2, v, n);
        bad += h1 != h2 || p1 != p2;

        /* two parts, joined as resp.c joins events */
        cut = n ? rng() % (n + 1) : 0;
        pa = 1;
        ha = msv_hash_i32s(0, &pa, v, cut);
        pb = 1;
        hb = msv_hash_i32s(0, &pb, v + cut, n - cut);
        p2 = 1;
        h2 = msv_hash_i32s(0, &p2, v, n);
        bad += msv_hash_cat(ha, hb, pb) != h2 || pa * pb != p2;
    }
    tap_ok(bad == 0, "the hash four values a step: as one at a time, and "
           "parts joined as the whole");
}


/* ------------------------------------------------------------------ */
/* The fast path as a whole against yajl alone                          */

/* A choice of t tokens, rows of 1 to k ids below vocab, in variant; now
 * and then a row with an id twice or two ids swapped, a logprob of -inf
 * (lp_kind 1), -1e30 (2) or about the limit of 1e-6 (3). */

static char *
gen_choice(char *p, long idx, int with_idx, int t, int k, long vocab,
    int variant, const char *finish, int lp_kind)
{
    static int32_t  tok[16], ids[16 * 300], lens[16];
    static float    lps[16 * 300], sel[16];
    msv_b64_t       st;
    int             i, j, n = 0, mode = msv_mask_of(variant), o;
    int32_t         id;

    for (i = 0; i < t; i++) {
        lens[i] = 1 + (int32_t) (rng() % (uint64_t) k);
        id = (int32_t) (rng() % 5);
        for (j = 0; j < lens[i]; j++) {
            ids[n + j] = id;
            id += 1 + (int32_t) (rng() % (uint64_t) (vocab / 8 + 1));
        }
        if (lens[i] > 1 && rng() % 20 == 0) {
            j = 1 + (int) (rng() % (uint64_t) (lens[i] - 1));
            if (rng() % 2) {
                ids[n + j] = ids[n + j - 1];
            } else {
                id = ids[n + j];
                ids[n + j] = ids[n + j - 1];
                ids[n + j - 1] = id;
            }
        }
        make_lp_row(lps + n, (size_t) lens[i]);
        for (j = 0; lp_kind && j < lens[i]; j++) {
            if (rng() % 4 == 0) {
                lps[n + j] = lp_kind == 1 ? -INFINITY
                             : lp_kind == 2 ? -1e30f
                             : rng() % 2 ? 5e-6f : 1e-6f;
            }
        }
        j = (int) (rng() % (uint64_t) lens[i]);
        tok[i] = ids[n + j];
        sel[i] = lps[n + j];
        n += lens[i];
    }

    p += sprintf(p, with_idx ? "{\"index\":%ld," : "{", idx);
    p += sprintf(p, "\"token_ids\":");
    p = msv_json_ids(p, tok, (uint32_t) t);

    if (mode != MSV_MODE_OFF && msv_packed_of(variant)) {
        p += sprintf(p, ",\"sampling_mask_packed\":{\"format\":\""
                     MSV_PACKED_FORMAT "\",\"lengths\":\"");
        msv_b64_init(&st, 0);
        p = msv_b64_end(&st, msv_b64_put(&st, p, lens, 4 * (size_t) t));
        p += sprintf(p, "\",\"ids\":\"");
        p = msv_b64_end(&st, msv_b64_put(&st, p, ids, 4 * (size_t) n));
        p += sprintf(p, "\",\"logprobs\":\"");
        p = mode == MSV_MODE_SUPPORT
            ? msv_b64_end(&st, msv_b64_put(&st, p, lps, 4 * (size_t) n))
            : msv_b64_end(&st, msv_b64_put(&st, p, sel, 4 * (size_t) t));
        p += sprintf(p, "\"}");

    } else if (mode != MSV_MODE_OFF) {
        p += sprintf(p, ",\"sampling_mask\":[");
        for (i = 0, o = 0; i < t; i++) {
            p = msv_json_ids(p, ids + o, (uint32_t) lens[i]);
            *p++ = ',';
            o += lens[i];
        }
        p[-1] = ']';
        p += sprintf(p, ",\"sampling_mask_logprobs\":");
        if (mode == MSV_MODE_SUPPORT) {
            *p++ = '[';
            for (i = 0, o = 0; i < t; i++) {
                p = msv_json_f32s(p, lps + o, (uint32_t) lens[i]);
                *p++ = ',';
                o += lens[i];
            }
            p[-1] = ']';
        } else {
            p = msv_json_f32s(p, sel, (uint32_t) t);
        }
    }

    return p + sprintf(p, ",\"finish_reason\":%s}", finish);
}


/* Break a document at random: a byte changed, removed, or text put in
 * (of the kinds the fast path must hand back to yajl), or the end cut. */

static void
gen_break(char *s, size_t *n, size_t cap)
{
    static const char  *put[] = {
        " ", "\n", "\\u0041", "\\/", "\\\"", "=", "==", "e5", ".5", "-",
        "0", "00", "1e", "[", "]", ",", "\"", "{}", "null", "9999999999",
        "1.5", "E-3", "\t", "\x01", "\xc3\xa9", "}", ":", "-0", "1E+2",
        "12345678901234567890", "[]", ",,", "1.", "\"ids\":", "\xff"
    };
    size_t       pos = *n ? rng() % *n : 0, k;
    const char  *t;

    switch (rng() % 4) {
    case 0:
        s[pos] = (char) (rng() % 128);
        break;
    case 1:
        if (*n) {
            memmove(s + pos, s + pos + 1, *n - pos - 1);
            (*n)--;
        }
        break;
    case 2:
        t = put[rng() % (sizeof(put) / sizeof(put[0]))];
        k = strlen(t);
        if (*n + k < cap) {
            memmove(s + pos + k, s + pos, *n - pos);
            memcpy(s + pos, t, k);
            *n += k;
        }
        break;
    default:
        *n = pos;
    }
    s[*n] = '\0';
}


/* One response through resp.c, fast path on or off, in pieces of step
 * bytes (0: at once); its verdict and hashes. */

static void
run_resp(const char *body, size_t n, const msv_expect_t *e, int stream,
    int no_fast, size_t step, char *out, size_t outlen)
{
    msv_resp_t  r;
    size_t      off, k;
    int         rc = 0;

    memset(&r, 0, sizeof(r));
    r.e = *e;
    r.stream = stream;
    r.prompt_len = 3;
    r.max_tokens = -1;
    r.no_fast = no_fast;
    msv_resp_reset(&r);
    for (off = 0; off < n && rc == 0; off += k) {
        k = step && n - off > step ? step : n - off;
        rc = msv_resp_data(&r, body + off, k);
    }
    if (rc == 0 && msv_resp_end(&r) == 0) {
        msv_resp_check(&r);
    }
    snprintf(out, outlen, "%s|%llx|%llx", r.bad,
             (unsigned long long) r.hash, (unsigned long long) r.mhash);
    msv_resp_free(&r);
}


static void
test_fast(void)
{
    static char         body[1 << 20];
    static const size_t  steps[] = { 0, 1, 3, 7, 64, 1000 };
    char                got[512], want[512];
    char               *p;
    size_t              n, si;
    long                c;
    int                 it, t, k, nch, stream, variant, breaks, b, lp_kind;
    int                 same = 0, cut = 0, differ = 0, pass = 0, fail = 0;
    long                vocab;
    msv_expect_t        e;

    for (it = 0; it < 4000; it++) {
        variant = rng() % 10 == 0 ? MSV_MODE_OFF : 1 + (int) (rng() % 4);
        t = 1 + (int) (rng() % 5);
        k = rng() % 3 == 0 ? 1 + (int) (rng() % 300) : 1 + (int) (rng() % 12);
        nch = rng() % 4 == 0 ? 2 : 1;
        stream = rng() % 3 == 0;
        vocab = rng() % 2 ? 64 : 151936;
        lp_kind = rng() % 8 == 0 ? 1 + (int) (rng() % 3) : 0;

        p = body;
        if (!stream) {
            p += sprintf(p, "{\"request_id\":\"r%d\",\"choices\":[", it);
            for (c = 0; c < nch; c++) {
                p = gen_choice(p, c, nch > 1 || rng() % 2, t, k, vocab,
                               variant, "\"length\"", lp_kind);
                *p++ = ',';
            }
            p[-1] = ']';
            p += sprintf(p, ",\"usage\":{\"prompt_tokens\":3,"
                         "\"completion_tokens\":%d}}", t * nch);
        } else {
            for (c = 0; c < 2 * nch; c++) {
                p += sprintf(p, "data: {\"choices\":[");
                p = gen_choice(p, c % nch, 1, c < nch ? t : 1, k, vocab,
                               variant, c < nch ? "null" : "\"stop\"",
                               lp_kind);
                p += sprintf(p, "]%s}\n\n", c < 2 * nch - 1 ? ""
                             : ",\"usage\":{\"prompt_tokens\":3,"
                               "\"completion_tokens\":0}");
            }
            p += sprintf(p, "data: [DONE]\n\n");
        }
        n = (size_t) (p - body);
        breaks = rng() % 3 == 0 ? 0 : 1 + (int) (rng() % 3);
        for (b = 0; b < breaks; b++) {
            gen_break(body, &n, sizeof(body) - 64);
        }

        e.top_k = rng() % 5 == 0 ? 3 : 400;
        e.temperature = 1.0;
        e.variant = variant;
        e.vocab = vocab;
        e.max_tokens = -1;
        e.logprobs = -1;
        e.whole = !stream;
        e.n = nch;

        for (si = 0; si < sizeof(steps) / sizeof(steps[0]); si++) {
            run_resp(body, n, &e, stream, 1, steps[si], want, sizeof(want));
            run_resp(body, n, &e, stream, 0, steps[si], got, sizeof(got));
            if (strcmp(got, want) == 0) {
                same++;
                pass += want[0] == '|';
                fail += want[0] != '|';
            } else if (strncmp(want, "the stream ended inside an event",
                               32) == 0 && got[0] != '|')
            {
                cut++;      /* the fast path read what yajl had not yet */
            } else if (differ++ < 5) {
                tap_diag("document %d, pieces of %zu: yajl alone \"%s\", "
                         "fast \"%s\"", it, steps[si], want, got);
            }
        }
    }
    tap_ok(differ == 0 && pass > 2000 && fail > 8000, "the fast path "
           "against yajl alone, %d documents of every variant, valid and "
           "broken, in pieces of 1 byte to whole: %d the same verdict and "
           "hashes (%d passing, %d failing), %d streams cut inside an event "
           "failing on what the fast path read first, %d else",
           it, same, pass, fail, cut, differ);
}


int
main(void)
{
    char            why[256];
    int             rc;
    size_t          k;

    /* rows [3, 9, 12] and [5]; the tokens 9 and 5 */
    static const int32_t  len[] = { 3, 1 };
    static const int32_t  ids[] = { 3, 9, 12, 5 };
    static const int32_t  unsorted[] = { 3, 12, 9, 5 };
    static const float    sel[] = { -1.5f, 0.0f };
    static const float    sup[] = { -1.0986123f, -1.0986123f, -1.0986123f,
                                    0.0f };
    static const float    sup_bad[] = { -1.0f, -1.0f, -1.0f, 0.0f };
    static const float    sup_inf[] = { -INFINITY, -INFINITY, -INFINITY,
                                        0.0f };
    static const float    pos[] = { 0.5f, 0.0f };

    static const char  *json_ok =
        "{\"request_id\":\"r\",\"choices\":[{\"index\":0,\"token_ids\":[9,5],"
        "\"sampling_mask\":[[3,9,12],[5]],\"sampling_mask_logprobs\":"
        "[[-1.0986123,-1.0986123,-1.0986123],[0.0]],\"finish_reason\":"
        "\"length\"}],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":"
        "2}}";

    struct {
        const char  *name;
        char        *doc;
        long         top_k;
        int          variant;
        const char  *want;          /* NULL: valid */
    } cases[] = {
        { "JSON support", (char *) json_ok, 10, MSV_MODE_SUPPORT, NULL },
        { "packed selected",
          packed("9,5", len, 2, ids, 4, sel, 2, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SELECTED_PACKED, NULL },
        { "packed support",
          packed("9,5", len, 2, ids, 4, sup, 4, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SUPPORT_PACKED, NULL },
        { "a JSON mask where packed was asked", (char *) json_ok, 10,
          MSV_MODE_SUPPORT_PACKED, "a JSON mask, packed asked" },
        { "a packed mask where JSON was asked",
          packed("9,5", len, 2, ids, 4, sel, 2, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SELECTED, "a packed mask, JSON asked" },
        { "packed ids out of order",
          packed("9,5", len, 2, unsorted, 4, sel, 2, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SELECTED_PACKED, "not ascending" },
        { "packed lengths that do not add up",
          packed("9,5", len, 2, ids, 3, sel, 2, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SELECTED_PACKED, "the lengths add up to 4" },
        { "packed support rows not summing to 1",
          packed("9,5", len, 2, ids, 4, sup_bad, 4, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SUPPORT_PACKED, "logsumexp" },
        { "a packed support row of -inf only (its probabilities sum to 0)",
          packed("9,5", len, 2, ids, 4, sup_inf, 4, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SUPPORT_PACKED, "logsumexp -inf" },
        { "packed selected logprobs in support mode",
          packed("9,5", len, 2, ids, 4, sel, 2, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SUPPORT_PACKED, "2 logprobs in support mode" },
        { "a packed logprob above 0",
          packed("9,5", len, 2, ids, 4, pos, 2, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SELECTED_PACKED, "above 0" },
        { "a sampled token outside its packed row",
          packed("8,5", len, 2, ids, 4, sel, 2, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SELECTED_PACKED, "not in its mask row" },
        { "a packed row wider than top_k",
          packed("9,5", len, 2, ids, 4, sel, 2, MSV_PACKED_FORMAT), 2,
          MSV_MODE_SELECTED_PACKED, "top_k 2" },
        { "a packed row for fewer tokens",
          packed("9,5,7", len, 2, ids, 4, sel, 2, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SELECTED_PACKED, "2 mask rows for 3 tokens" },
        { "another packed format",
          packed("9,5", len, 2, ids, 4, sel, 2, "csr-i32-f16-le-v1"), 10,
          MSV_MODE_SELECTED_PACKED, "format" },
        { "packed data that is not base64",
          strdup("{\"choices\":[{\"index\":0,\"token_ids\":[9],"
                 "\"sampling_mask_packed\":{\"format\":\"csr-i32-f32-le-v1\","
                 "\"lengths\":\"AQAAAA=\",\"ids\":\"CQAAAA==\",\"logprobs\":"
                 "\"AAAAAA==\"},\"finish_reason\":null}]}"), 10,
          MSV_MODE_SELECTED_PACKED, "invalid base64" },
        { "a packed object without its ids",
          strdup("{\"choices\":[{\"index\":0,\"token_ids\":[9],"
                 "\"sampling_mask_packed\":{\"format\":\"csr-i32-f32-le-v1\","
                 "\"lengths\":\"AQAAAA==\",\"logprobs\":\"AAAAAA==\"},"
                 "\"finish_reason\":null}]}"), 10,
          MSV_MODE_SELECTED_PACKED, "a key is missing" },
    };

    for (k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        rc = check(cases[k].doc, cases[k].top_k, 1.0, cases[k].variant, why,
                   sizeof(why));
        if (cases[k].want == NULL) {
            tap_ok(rc == 0, "%s passes%s%s", cases[k].name,
                   rc ? ": " : "", rc ? why : "");
        } else {
            tap_ok(rc != 0 && strstr(why, cases[k].want) != NULL,
                   "%s is caught (\"%s\")", cases[k].name, why);
        }
        if (cases[k].doc != json_ok) {
            free(cases[k].doc);
        }
    }

    /* whole choices with logprobs.content, as the tests check them */
    {
        static const char  *rows = "[[3,9,12],[5]]";
        static const char  *sup3 = "[[-1.0986123,-1.0986123,-1.0986123],"
                                   "[0.0]]";
        static const char  *lp_ok =
            "{\"content\":[{\"token_id\":9,\"logprob\":-1.0986123,"
            "\"top_logprobs\":[{\"token_id\":3,\"logprob\":-1.0986123},"
            "{\"token_id\":9,\"logprob\":-1.0986123}]},{\"token_id\":5,"
            "\"logprob\":0.0,\"top_logprobs\":[{\"token_id\":5,"
            "\"logprob\":0.0}]}]}";
        static const char  *lp_one =
            "{\"content\":[{\"token_id\":9,\"logprob\":-1.0986123,"
            "\"top_logprobs\":[]}]}";
        static const char  *lp_other =
            "{\"content\":[{\"token_id\":3,\"logprob\":-1.0986123,"
            "\"top_logprobs\":[]},{\"token_id\":5,\"logprob\":0.0,"
            "\"top_logprobs\":[]}]}";
        static const char  *lp_unsorted =
            "{\"content\":[{\"token_id\":9,\"logprob\":-1.0986123,"
            "\"top_logprobs\":[{\"token_id\":3,\"logprob\":-2},"
            "{\"token_id\":9,\"logprob\":-1.0986123}]},{\"token_id\":5,"
            "\"logprob\":0.0,\"top_logprobs\":[]}]}";
        static const char  *lp_above =
            "{\"content\":[{\"token_id\":9,\"logprob\":-1.0986123,"
            "\"top_logprobs\":[{\"token_id\":3,\"logprob\":-1.5}]},"
            "{\"token_id\":5,\"logprob\":0.0,\"top_logprobs\":[]}]}";
        static const char  *lp_differs =
            "{\"content\":[{\"token_id\":9,\"logprob\":-1.5,"
            "\"top_logprobs\":[{\"token_id\":3,\"logprob\":-1.0986123}]},"
            "{\"token_id\":5,\"logprob\":0.0,\"top_logprobs\":[]}]}";
        static const char  *lp_no_top =
            "{\"content\":[{\"token_id\":9,\"logprob\":-1.0986123},"
            "{\"token_id\":5,\"logprob\":0.0,\"top_logprobs\":[]}]}";

        struct {
            const char    *name;
            char          *doc;
            msv_expect_t   e;
            const char    *want;    /* NULL: valid */
        } wc[] = {
            { "a whole support choice with logprobs",
              choice("[9,5]", rows, sup3, lp_ok, "\"stop\""),
              { 10, 1.0, MSV_MODE_SUPPORT, 16, 4, 2, 1, 1 }, NULL },
            { "a whole choice without the mask, aborted",
              choice("[9,5]", "", "", "", "\"abort\""),
              { 10, 1.0, MSV_MODE_OFF, 16, 4, -1, 1, 1 }, NULL },
            { "a token outside the vocabulary",
              choice("[9,5]", rows, sup3, "", "\"stop\""),
              { 10, 1.0, MSV_MODE_SUPPORT, 8, 4, -1, 1, 1 },
              "token 9 outside the vocabulary of 8" },
            { "a mask id outside the vocabulary",
              choice("[9,5]", rows, sup3, "", "\"stop\""),
              { 10, 1.0, MSV_MODE_SUPPORT, 10, 4, -1, 1, 1 },
              "id 12 outside the vocabulary" },
            { "more tokens than max_tokens",
              choice("[9,5]", rows, sup3, "", "\"length\""),
              { 10, 1.0, MSV_MODE_SUPPORT, 16, 1, -1, 1, 1 },
              "more tokens (2) than max_tokens 1" },
            { "a whole choice with a null finish_reason",
              choice("[9,5]", rows, sup3, "", "null"),
              { 10, 1.0, MSV_MODE_SUPPORT, 16, 4, -1, 1, 1 },
              "finish_reason null" },
            { "an unknown finish_reason",
              choice("[9,5]", rows, sup3, "", "\"eos\""),
              { 10, 1.0, MSV_MODE_SUPPORT, 16, 4, -1, 1, 1 },
              "finish_reason \"eos\"" },
            { "a whole choice without token_ids",
              choice("", "", "", "", "\"stop\""),
              { 10, 1.0, MSV_MODE_OFF, 16, 4, -1, 1, 1 }, "no token_ids" },
            { "logprobs not asked for",
              choice("[9,5]", rows, sup3, lp_ok, "\"stop\""),
              { 10, 1.0, MSV_MODE_SUPPORT, 16, 4, -1, 1, 1 },
              "logprobs sent although not asked for" },
            { "logprobs null, not asked for",
              choice("[9,5]", "", "", "null", "\"stop\""),
              { 10, 1.0, MSV_MODE_OFF, 16, 4, -1, 1, 1 },
              "logprobs sent although not asked for" },
            { "logprobs asked for, not sent",
              choice("[9,5]", rows, sup3, "", "\"stop\""),
              { 10, 1.0, MSV_MODE_SUPPORT, 16, 4, 2, 1, 1 },
              "no logprobs.content" },
            { "fewer logprobs entries than tokens",
              choice("[9,5]", rows, sup3, lp_one, "\"stop\""),
              { 10, 1.0, MSV_MODE_SUPPORT, 16, 4, 2, 1, 1 },
              "1 entries for 2 tokens" },
            { "a logprobs entry of another token",
              choice("[9,5]", "", "", lp_other, "\"stop\""),
              { 10, 1.0, MSV_MODE_OFF, 16, 4, 2, 1, 1 },
              "token_id 3, sampled 9" },
            { "more top_logprobs than asked",
              choice("[9,5]", rows, sup3, lp_ok, "\"stop\""),
              { 10, 1.0, MSV_MODE_SUPPORT, 16, 4, 1, 1, 1 },
              "2 top_logprobs, 1 asked" },
            { "top_logprobs not best first",
              choice("[9,5]", "", "", lp_unsorted, "\"stop\""),
              { 10, 1.0, MSV_MODE_OFF, 16, 4, 2, 1, 1 }, "not best first" },
            { "a sampled logprob above the best",
              choice("[9,5]", "", "", lp_above, "\"stop\""),
              { 10, 1.0, MSV_MODE_OFF, 16, 4, 2, 1, 1 }, "above the best" },
            { "logprobs.content differing from the support",
              choice("[9,5]", rows, sup3, lp_differs, "\"stop\""),
              { 10, 1.0, MSV_MODE_SUPPORT, 16, 4, 2, 1, 1 },
              "logprobs.content logprob -1.5" },
            { "a logprobs entry without top_logprobs",
              choice("[9,5]", "", "", lp_no_top, "\"stop\""),
              { 10, 1.0, MSV_MODE_OFF, 16, 4, 2, 1, 1 },
              "an entry without its token_id" },
            { "a greedy selected logprob that is not 0",
              choice("[9,5]", "[[9],[5]]", "[-0.5,0.0]", "", "\"stop\""),
              { 10, 0.0, MSV_MODE_SELECTED, 16, 4, -1, 1, 1 },
              "greedy mask row 0: logprob -0.5" },
            { "a greedy support logprob that is not 0",
              choice("[9,5]", "[[9],[5]]", "[[-5e-05],[0.0]]", "",
                     "\"stop\""),
              { 10, 0.0, MSV_MODE_SUPPORT, 16, 4, -1, 1, 1 },
              "greedy mask row 0: logprob" },
            { "a greedy choice with logprob 0",
              choice("[9,5]", "[[9],[5]]", "[[0.0],[-0.0]]", "",
                     "\"stop\""),
              { 10, 0.0, MSV_MODE_SUPPORT, 16, 4, -1, 1, 1 }, NULL },
        };

        for (k = 0; k < sizeof(wc) / sizeof(wc[0]); k++) {
            rc = check_expect(wc[k].doc, &wc[k].e, why, sizeof(why));
            if (wc[k].want == NULL) {
                tap_ok(rc == 0, "%s passes%s%s", wc[k].name,
                       rc ? ": " : "", rc ? why : "");
            } else {
                tap_ok(rc != 0 && strstr(why, wc[k].want) != NULL,
                       "%s is caught (\"%s\")", wc[k].name, why);
            }
            free(wc[k].doc);
        }
    }

    /* whole responses, streams split anywhere */
    {
#define EV1  "{\"choices\":[{\"index\":0,\"token_ids\":[9],"             \
             "\"sampling_mask\":[[3,9]],\"sampling_mask_logprobs\":[-0.5],"  \
             "\"finish_reason\":null}]}"
#define EV2  "{\"choices\":[{\"index\":0,\"token_ids\":[5],"             \
             "\"sampling_mask\":[[5]],\"sampling_mask_logprobs\":[0],"       \
             "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":3," \
             "\"completion_tokens\":2}}"

        static const struct {
            const char  *name;
            const char  *body;
            int          stream;
            const char  *want;      /* NULL: valid */
        } rc_[] = {
            { "a stream", "data: " EV1 "\n\ndata: " EV2 "\n\ndata: [DONE]\n\n",
              1, NULL },
            { "a stream with CRLF lines and a comment",
              ": hi\r\n\r\ndata: " EV1 "\r\n\r\ndata: " EV2
              "\r\n\r\ndata: [DONE]\r\n\r\n", 1, NULL },
            { "a body", "{\"choices\":[{\"index\":0,\"token_ids\":[9,5],"
              "\"sampling_mask\":[[3,9],[5]],\"sampling_mask_logprobs\":"
              "[-0.5,0],\"finish_reason\":\"length\"}],\"usage\":"
              "{\"prompt_tokens\":3,\"completion_tokens\":2}}", 0, NULL },
            { "a stream without [DONE]",
              "data: " EV1 "\n\ndata: " EV2 "\n\n", 1,
              "did not end with data: [DONE]" },
            { "a stream ending inside an event",
              "data: " EV1 "\n\ndata: " EV2 "\n\ndata: [DONE]", 1,
              "ended inside an event" },
            { "an event after the last",
              "data: " EV2 "\n\ndata: " EV1 "\n\ndata: [DONE]\n\n", 1,
              "an event after the one with the finish_reason" },
            { "an event after [DONE]",
              "data: " EV1 "\n\ndata: " EV2 "\n\ndata: [DONE]\n\ndata: "
              EV1 "\n\n", 1, "an event after data: [DONE]" },
            { "a stream short of max_tokens with ignore_eos",
              "data: " EV2 "\n\ndata: [DONE]\n\n", 1,
              "usage.completion_tokens 2, tokens received 1" },
        };
        size_t  steps[] = { 0, 1, 7 }, si;
        char    how[48];

        for (k = 0; k < sizeof(rc_) / sizeof(rc_[0]); k++) {
            for (si = 0; si < sizeof(steps) / sizeof(steps[0]); si++) {
                rc = check_resp(rc_[k].body, rc_[k].stream, steps[si], why,
                                sizeof(why));
                if (steps[si] == 0) {
                    snprintf(how, sizeof(how), "in one read");
                } else {
                    snprintf(how, sizeof(how), "%zu bytes a read", steps[si]);
                }
                if (rc_[k].want == NULL) {
                    tap_ok(rc == 0, "%s, %s, passes%s%s", rc_[k].name, how,
                           rc ? ": " : "", rc ? why : "");
                } else {
                    tap_ok(rc != 0 && strstr(why, rc_[k].want) != NULL,
                           "%s, %s, is caught (\"%s\")", rc_[k].name, how,
                           why);
                }
            }
        }
#undef EV1
#undef EV2
    }

    /* several choices (sampling_params.n): whole bodies and streams */
    {
#define CH(i, tok, row, lp, fin)                                             \
        "{\"index\":" #i ",\"token_ids\":[" tok "],\"sampling_mask\":["      \
        row "],\"sampling_mask_logprobs\":[" lp "],\"finish_reason\":" fin "}"
#define USAGE(n)  ",\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":"    \
                  #n "}"
#define BODY(chs, n)  "{\"choices\":[" chs "]" USAGE(n) "}"
#define A0   CH(0, "9,5", "[3,9],[5]", "-0.5,0", "\"length\"")
#define A1   CH(1, "3,5", "[3,9],[5,7]", "-0.5,-0.1", "\"length\"")
#define A2   CH(2, "12,7", "[12],[5,7]", "0,-0.2", "\"length\"")
#define E(chs, u)  "data: {\"choices\":[" chs "]" u "}\n\n"

        /* whole documents, as check.c sees them: n = 3 */
        static const struct {
            const char  *name;
            const char  *doc;
            const char  *want;      /* NULL: valid */
        } nd[] = {
            { "three choices", BODY(A0 "," A1 "," A2, 6), NULL },
            { "three choices, a missing index",
              BODY(A0 "," A2, 4), "2 choices, expected 3" },
            { "three choices, a duplicate index",
              BODY(A0 "," A1 "," A1, 6), "choice index 1 twice" },
            { "three choices, an index out of range",
              BODY(A0 "," A1 "," CH(3, "12,7", "[12],[5,7]", "0,-0.2",
                                    "\"length\""), 6),
              "choices[2].index is not in 0..2" },
            { "three choices, one without its index",
              "{\"choices\":[" A0 "," A1 ",{\"token_ids\":[12,7],"
              "\"sampling_mask\":[[12],[5,7]],\"sampling_mask_logprobs\":"
              "[0,-0.2],\"finish_reason\":\"length\"}]" USAGE(6) "}",
              "choices[2] has no index" },
            { "three choices out of order",
              BODY(A1 "," A0 "," A2, 6), "choices[0].index is 1" },
            { "three choices, a sampled token outside its row in one",
              BODY(A0 "," CH(1, "3,5", "[3,9],[7]", "-0.5,-0.1",
                             "\"length\"") "," A2, 6),
              "choice 1: sampled token 5 is not in its mask row" },
            { "three choices, a row out of order in one",
              BODY(A0 "," A1 "," CH(2, "12,7", "[12],[7,5]", "0,-0.2",
                                    "\"length\""), 6),
              "row ids not ascending and unique" },
            { "four choices for n 3",
              BODY(A0 "," A1 "," A2 "," A2, 8), "more than 3 choices" },
        };
        msv_expect_t  e3 = { 10, 1.0, MSV_MODE_SELECTED, 16, 2, -1, 1, 3 };

        for (k = 0; k < sizeof(nd) / sizeof(nd[0]); k++) {
            rc = check_expect(nd[k].doc, &e3, why, sizeof(why));
            if (nd[k].want == NULL) {
                tap_ok(rc == 0, "%s passes%s%s", nd[k].name, rc ? ": " : "",
                       rc ? why : "");
            } else {
                tap_ok(rc != 0 && strstr(why, nd[k].want) != NULL,
                       "%s is caught (\"%s\")", nd[k].name, why);
            }
        }

        /* whole responses of n = 2, streams split anywhere; events carry
         * some of the choices, each with its index */
#define S0a  CH(0, "9", "[3,9]", "-0.5", "null")
#define S0b  CH(0, "5", "[5]", "0", "\"length\"")
#define S1a  CH(1, "3", "[3,9]", "-0.5", "null")
#define S1b  CH(1, "5", "[5,7]", "-0.1", "\"length\"")
        static const struct {
            const char  *name;
            const char  *body;
            int          stream;
            const char  *want;      /* NULL: valid */
        } nr[] = {
            { "a body of two choices", BODY(A0 "," A1, 4), 0, NULL },
            { "a stream of two choices",
              E(S0a "," S1a, "") E(S1b, "") E(S0b, USAGE(4))
              "data: [DONE]\n\n", 1, NULL },
            { "a stream of two choices, one event each",
              E(S1a, "") E(S0a, "") E(S0b, "") E(S1b, USAGE(4))
              "data: [DONE]\n\n", 1, NULL },
            { "a body of two choices, usage of one",
              BODY(A0 "," A1, 2), 0,
              "usage.completion_tokens 2, tokens received 4" },
            { "a choice after its finish_reason",
              E(S0a "," S1a, "") E(S0b, "") E(S0b "," S1b, USAGE(4))
              "data: [DONE]\n\n", 1,
              "choice 0 in an event after the one with its finish_reason" },
            { "usage before the last choice ended",
              E(S0a "," S1a, "") E(S0b, USAGE(4)) E(S1b, USAGE(4))
              "data: [DONE]\n\n", 1, "usage before the last event" },
            { "a stream where one choice never ends",
              E(S0a "," S1a, "") E(S0b, "") "data: [DONE]\n\n", 1,
              "data: [DONE] before an event with a finish_reason" },
            { "a choice short of max_tokens with ignore_eos",
              E(S0a "," S1b, "") E(S0b, USAGE(3)) "data: [DONE]\n\n", 1,
              "choice 1: 1 tokens with ignore_eos" },
            { "an event of two choices with the same index",
              E(S0a "," S0a, "") E(S0b "," S1b, USAGE(3))
              "data: [DONE]\n\n", 1, "choice index 0 twice" },
            { "an event without choices",
              E(S0a "," S1a, "") "data: {\"choices\":[]}\n\n"
              E(S0b "," S1b, USAGE(4)) "data: [DONE]\n\n", 1,
              "an event without choices" },
        };
        size_t    steps[] = { 0, 1, 7 }, si;
        uint64_t  h_body = 0, h;

        for (k = 0; k < sizeof(nr) / sizeof(nr[0]); k++) {
            for (si = 0; si < sizeof(steps) / sizeof(steps[0]); si++) {
                rc = check_resp_n(nr[k].body, nr[k].stream, 2, steps[si],
                                  &h, why, sizeof(why));
                if (nr[k].want == NULL) {
                    tap_ok(rc == 0, "%s, %zu bytes a read (0: all), "
                           "passes%s%s", nr[k].name, steps[si],
                           rc ? ": " : "", rc ? why : "");
                    /* the same tokens, however split into events */
                    if (k == 0 && si == 0) {
                        h_body = h;
                    } else {
                        tap_ok(rc == 0 && h == h_body, "%s, %zu bytes a "
                               "read: the hash of the body", nr[k].name,
                               steps[si]);
                    }
                } else {
                    tap_ok(rc != 0 && strstr(why, nr[k].want) != NULL,
                           "%s, %zu bytes a read (0: all), is caught "
                           "(\"%s\")", nr[k].name, steps[si], why);
                }
            }
        }

        /* another token in one choice: another hash */
        rc = check_resp_n(BODY(A0 "," CH(1, "9,5", "[3,9],[5,7]",
                                         "-0.5,-0.1", "\"length\""), 4),
                          0, 2, 0, &h, why, sizeof(why));
        tap_ok(rc == 0 && h != h_body, "another token of one choice changes "
               "the hash%s%s", rc ? ": " : "", rc ? why : "");
        /* the same choices under other indices: another hash */
        rc = check_resp_n(BODY(CH(0, "3,5", "[3,9],[5,7]", "-0.5,-0.1",
                                  "\"length\"") ","
                               CH(1, "9,5", "[3,9],[5]", "-0.5,0",
                                  "\"length\""), 4),
                          0, 2, 0, &h, why, sizeof(why));
        tap_ok(rc == 0 && h != h_body, "the choices swapped change the "
               "hash%s%s", rc ? ": " : "", rc ? why : "");

        /* a body of 700 KB (whitespace between its tokens): the parser
         * gets it in pieces of growing size (resp.c), whatever the reads;
         * the same hash, and a broken end still caught */
        {
            static const char  *small = BODY(A0 "," A1, 4);
            static const size_t  big_steps[] = { 1, 7, 4096, 0 };
            size_t   pad = 350000, len = strlen(small), half, bi;
            char    *big;

            big = malloc(len + 2 * pad + 2);
            half = strcspn(small, ",");        /* after the first key */
            memcpy(big, small, 1);
            memset(big + 1, ' ', pad);
            memcpy(big + 1 + pad, small + 1, half - 1);
            memset(big + pad + half, '\n', pad);
            memcpy(big + 2 * pad + half, small + half, len - half + 1);
            for (bi = 0; bi < sizeof(big_steps) / sizeof(big_steps[0]);
                 bi++)
            {
                rc = check_resp_n(big, 0, 2, big_steps[bi], &h, why,
                                  sizeof(why));
                tap_ok(rc == 0 && h == h_body, "a body of %zu bytes, %zu "
                       "bytes a read (0: all): passes, the same hash%s%s",
                       strlen(big), big_steps[bi], rc ? ": " : "",
                       rc ? why : "");
            }
            big[strlen(big) - 1] = ',';
            rc = check_resp_n(big, 0, 2, 4096, &h, why, sizeof(why));
            tap_ok(rc != 0 && strstr(why, "invalid JSON") != NULL,
                   "a body of %zu bytes broken at its end is caught "
                   "(\"%s\")", strlen(big), why);
            free(big);
        }
#undef CH
#undef USAGE
#undef BODY
#undef A0
#undef A1
#undef A2
#undef E
#undef S0a
#undef S0b
#undef S1a
#undef S1b
    }

    /* bodies that the fast path hands back to yajl, in part, fed whole and
     * a byte at a time: the same verdicts as yajl alone */
    {
        static const struct {
            const char  *name;
            const char  *ids;       /* sampling_mask_packed.ids */
            const char  *rows;      /* or sampling_mask, */
            const char  *lps;       /* and its logprobs */
            const char  *want;      /* NULL: valid */
        } fc[] = {
            { "packed ids with an escape yajl decodes",
              "\\u0041wAAAAkAAAAMAAAABQAAAA==", NULL, NULL, NULL },
            { "packed ids with a line break", "AwAAAAkAAAAM\\nAAAABQAAAA==",
              NULL, NULL, "invalid base64 (25 characters)" },
            { "packed ids with padding inside", "AwAAAAkAAAAMAA==ABQAAAA=",
              NULL, NULL, "invalid base64 (24 characters)" },
            { "packed ids whose padding hides bits",
              "AwAAAAkAAAAMAAAABQAAAB==", NULL, NULL, "invalid base64" },
            { "packed ids cut short", "AwAAAAkAAAAMAAAABQAAAA", NULL, NULL,
              "invalid base64 (22 characters)" },
            { "packed ids of 3 bytes too many", "AwAAAAkAAAAMAAAABQAAAAAA",
              NULL, NULL, "not whole 4-byte values" },
            { "JSON rows with whitespace", NULL, "[ [3, 9,12] ,[5]\n]",
              "[[-1.0986123, -1.0986123,-1.0986123],[ 0.0 ]]", NULL },
            { "JSON logprobs with exponents and long digits", NULL,
              "[[3,9,12],[5]]", "[[-10986123e-7,-1.09861230000000000000001,"
              "-0.10986123E1],[-0.0]]", NULL },
            { "a JSON row with an id of 2^31", NULL, "[[3,9,2147483648],[5]]",
              "[[-1.0986123,-1.0986123,-1.0986123],[0.0]]",
              "sampling_mask: not a token id" },
            { "a JSON row with a leading zero", NULL, "[[09,12],[5]]",
              "[[-1.0986123,-1.0986123],[0.0]]", "invalid JSON" },
            { "a JSON row with a string in it", NULL, "[[3,9,\"12\"],[5]]",
              "[[-1.0986123,-1.0986123,-1.0986123],[0.0]]",
              "sampling_mask: not a token id" },
            { "JSON logprobs one above 0", NULL, "[[3,9,12],[5]]",
              "[[-1.0986123,-1.0986123,-1.0986123],[2e-6]]",
              "a support logprob above 0" },
        };
        msv_expect_t  ef = { 10, 1.0, MSV_MODE_SUPPORT_PACKED, 16, -1, -1, 1,
                             1 };
        char          body[2048], got[512], want[512], *lp3;
        size_t        fi;

        lp3 = b64(sup, sizeof(sup));
        for (fi = 0; fi < sizeof(fc) / sizeof(fc[0]); fi++) {
            if (fc[fi].ids != NULL) {
                ef.variant = MSV_MODE_SUPPORT_PACKED;
                snprintf(body, sizeof(body), "{\"choices\":[{\"index\":0,"
                         "\"token_ids\":[9,5],\"sampling_mask_packed\":{"
                         "\"format\":\"" MSV_PACKED_FORMAT "\",\"lengths\":"
                         "\"AwAAAAEAAAA=\",\"ids\":\"%s\",\"logprobs\":"
                         "\"%s\"},\"finish_reason\":\"length\"}],\"usage\":"
                         "{\"prompt_tokens\":3,\"completion_tokens\":2}}",
                         fc[fi].ids, lp3);
            } else {
                ef.variant = MSV_MODE_SUPPORT;
                snprintf(body, sizeof(body), "{\"choices\":[{\"index\":0,"
                         "\"token_ids\":[9,5],\"sampling_mask\":%s%s%s,"
                         "\"finish_reason\":\"length\"}],\"usage\":"
                         "{\"prompt_tokens\":3,\"completion_tokens\":2}}",
                         fc[fi].rows,
                         fc[fi].lps ? ",\"sampling_mask_logprobs\":" : "",
                         fc[fi].lps ? fc[fi].lps : "");
            }
            for (k = 0; k < 2; k++) {
                run_resp(body, strlen(body), &ef, 0, 0, k, got, sizeof(got));
                run_resp(body, strlen(body), &ef, 0, 1, k, want,
                         sizeof(want));
                if (fc[fi].want == NULL) {
                    tap_ok(strcmp(got, want) == 0 && got[0] == '|',
                           "%s passes, %s (\"%s\")", fc[fi].name,
                           k ? "a byte at a time" : "whole", got);
                } else {
                    tap_ok(strcmp(got, want) == 0
                           && strstr(got, fc[fi].want) != NULL,
                           "%s is caught as yajl alone catches it, %s "
                           "(\"%s\")", fc[fi].name,
                           k ? "a byte at a time" : "whole", got);
                }
            }
        }
        free(lp3);
    }

    test_lse();
    test_b64dec();
    test_num();
    test_hash();
    test_fast();

    return tap_done();
}
