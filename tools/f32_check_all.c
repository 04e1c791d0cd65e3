/*
 * f32_check_all.c: checks msv_fmt_f32 (ngx_module/msv_json.c) on every
 * float32 bit pattern.  Not part of CI.  Cost per pattern on one
 * core of a 2 GHz EPYC: about 130 ns for the round-trip checks, 800 ns with
 * the minimality and closeness checks (printf and strtof dominate); all
 * 2^32 patterns with every check take about 57 core-minutes.
 *
 *   cc -O2 -pthread -Ingx_module tools/f32_check_all.c \
 *       ngx_module/msv_json.c -o build/f32_check_all -lm
 *   build/f32_check_all [threads [stride [min_every]]]
 *
 * threads    worker threads (default 2)
 * stride     check every stride-th pattern (default 1: all of them)
 * min_every  run the minimality and closeness checks on one in min_every
 *            of the checked patterns, picked by a hash of the index
 *            (default 1: all of them)
 *
 * For each pattern that is not a NaN:
 *   - the text is at most 15 characters, and the writer stored nothing
 *     past its 16 bytes;
 *   - the text is a JSON number in the documented layout (plain for
 *     decimal exponents -4..8, d.ddde[-]x otherwise; "null" for +-Inf);
 *   - strtof gives back the same bits (sign of zero included);
 *   - its significant digits and exponent are those msv_f32_decimal
 *     reports;
 * and on the sampled ones, with n the count of significant digits:
 *   - minimal: no decimal of n - 1 digits reads back as the float.  The
 *     nearest one, "%.{n-2}e", and its two neighbours on that digit
 *     lattice are tried with strtof (if one of the farther decimals of
 *     n - 1 digits were inside the rounding interval, the nearest or a
 *     neighbour would be too);
 *   - closest: if the correctly rounded n-digit decimal "%.{n-1}e" reads
 *     back as the float, the text has exactly its digits.
 * And the array writer msv_json_f32s_part, with its vector path where the
 * CPU has one (msv_json_simd), on every visited pattern in runs of 1024:
 * the text of each item is msv_fmt_f32's, then ','.
 * Prints the counts, and the first failures of each thread.
 */

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msv_json.h"


#define CHUNK        (1u << 20)     /* patterns taken at a time */
#define MAX_REPORT   8              /* failures printed per thread */

struct counts {
    uint64_t  checked;
    uint64_t  nan_skipped;
    uint64_t  sampled;
    uint64_t  bad_length;
    uint64_t  bad_syntax;
    uint64_t  bad_roundtrip;
    uint64_t  bad_decimal;
    uint64_t  bad_minimal;
    uint64_t  bad_closest;
    uint64_t  bad_vector;
    uint64_t  reported;
};

static uint64_t          stride = 1;
static uint64_t          min_every = 1;
static uint64_t          n_patterns;        /* patterns to visit */
static _Atomic uint64_t  next_chunk;


/*
 * A decimal read off a text: significant digits (no leading or trailing
 * zeros) and the exponent of the last one.
 */
struct dec {
    uint64_t  digits;
    int       exp;
    int       neg;
};


/*
 * Parses a JSON number and checks our layout; returns 0 and fills d, or
 * -1.  Grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
 */
static int
parse_number(const char *s, struct dec *d)
{
    const char  *p = s;
    uint64_t     m = 0;
    int          nd = 0, exp = 0, e = 0, eneg = 0, int_digits = 0;
    int          frac_digits = 0, has_exp = 0, lead = 1, sig = 0;

    d->neg = 0;
    if (*p == '-') {
        d->neg = 1;
        p++;
    }

    if (*p < '0' || *p > '9') {
        return -1;
    }

    if (*p == '0' && p[1] >= '0' && p[1] <= '9') {
        return -1;                          /* leading zero */
    }

    for (; *p >= '0' && *p <= '9'; p++) {
        int_digits++;
        if (lead && *p == '0') {
            continue;
        }
        lead = 0;
        if (++nd > 19) {
            return -1;
        }
        m = m * 10 + (uint64_t) (*p - '0');
    }

    if (*p == '.') {
        p++;
        if (*p < '0' || *p > '9') {
            return -1;
        }
        for (; *p >= '0' && *p <= '9'; p++) {
            frac_digits++;
            exp--;
            if (lead && *p == '0') {
                continue;
            }
            lead = 0;
            if (++nd > 19) {
                return -1;
            }
            m = m * 10 + (uint64_t) (*p - '0');
        }
    }

    if (*p == 'e' || *p == 'E') {
        has_exp = 1;
        p++;
        if (*p == '+' || *p == '-') {
            eneg = *p == '-';
            p++;
        }
        if (*p < '0' || *p > '9') {
            return -1;
        }
        for (; *p >= '0' && *p <= '9'; p++) {
            e = e * 10 + (*p - '0');
            if (e > 1000) {
                return -1;
            }
        }
        exp += eneg ? -e : e;
    }

    if (*p != '\0') {
        return -1;
    }

    if (m == 0) {
        d->digits = 0;
        d->exp = 0;
        /* zero: exactly "0.0" or "-0.0" */
        return strcmp(s + d->neg, "0.0") == 0 ? 0 : -1;
    }

    while (m % 10 == 0) {
        m /= 10;
        exp++;
    }

    for (uint64_t t = m; t >= 10; t /= 10) {
        sig++;
    }
    sig++;

    d->digits = m;
    d->exp = exp;

    /* the layout: x = exponent of the first digit */
    {
        int  x = exp + sig - 1;

        if (x >= -4 && x <= 8) {
            /* plain, a fraction part, no exponent, no needless zeros */
            if (has_exp || frac_digits == 0) {
                return -1;
            }
            if (x >= 0 && int_digits != x + 1) {
                return -1;
            }
            if (x < 0 && int_digits != 1) {
                return -1;
            }
            if (frac_digits > 1 && s[strlen(s) - 1] == '0') {
                return -1;
            }

        } else {
            /* d[.ddd]e[-]x: one integer digit, exponent without '+' */
            if (!has_exp || int_digits != 1 || strchr(s, '+') != NULL) {
                return -1;
            }
            if (frac_digits != sig - 1) {
                return -1;
            }
        }
    }

    return 0;
}


/* "%.{prec}e" of v split into its digits and exponent of the last digit */
static int
printf_decimal(float v, int prec, uint64_t *digits, int *exp)
{
    char      buf[64];
    char     *p, *end;
    uint64_t  m = 0;
    long      e;
    int       n;

    n = snprintf(buf, sizeof(buf), "%.*e", prec, (double) fabsf(v));
    if (n < 0 || n >= (int) sizeof(buf)) {
        return -1;
    }

    for (p = buf; *p && *p != 'e'; p++) {
        if (*p >= '0' && *p <= '9') {
            m = m * 10 + (uint64_t) (*p - '0');
        }
    }

    if (*p != 'e') {
        return -1;
    }

    errno = 0;
    e = strtol(p + 1, &end, 10);
    if (errno != 0 || *end != '\0') {
        return -1;
    }

    *digits = m;
    *exp = (int) e - prec;
    return 0;
}


/* does digits * 10^exp, with the sign of v, read back as v? */
static int
reads_back(float v, uint64_t digits, int exp)
{
    char      buf[48], tmp[24];
    char     *p = buf;
    float     r;
    int       n = 0;
    unsigned  e;

    if (signbit(v)) {
        *p++ = '-';
    }

    do {
        tmp[n++] = (char) ('0' + digits % 10);
        digits /= 10;
    } while (digits != 0);

    while (n > 0) {
        *p++ = tmp[--n];
    }

    *p++ = 'e';
    if (exp < 0) {
        *p++ = '-';
    }

    e = exp < 0 ? (unsigned) -exp : (unsigned) exp;
    do {
        tmp[n++] = (char) ('0' + e % 10);
        e /= 10;
    } while (e != 0);

    while (n > 0) {
        *p++ = tmp[--n];
    }

    *p = '\0';

    r = strtof(buf, NULL);
    return memcmp(&r, &v, sizeof(float)) == 0;
}


static int
n_digits(uint64_t m)
{
    int  n = 1;

    while (m >= 10) {
        m /= 10;
        n++;
    }
    return n;
}


static void
report(struct counts *c, uint32_t bits, const char *what, const char *text)
{
    if (c->reported++ < MAX_REPORT) {
        fprintf(stderr, "FAIL %08x %s: \"%s\"\n", bits, what, text);
    }
}


static void
check_one(struct counts *c, uint32_t bits, uint64_t idx)
{
    char        buf[40], text[24];
    char       *end;
    float       v, r;
    struct dec  d;
    uint32_t    dd;
    uint64_t    m;
    int         len, i, de, n, e;

    memcpy(&v, &bits, sizeof(float));

    if (isnan(v)) {
        c->nan_skipped++;
        return;
    }

    c->checked++;

    memset(buf, 0x5a, sizeof(buf));
    end = msv_fmt_f32(buf, v);
    len = (int) (end - buf);

    for (i = MSV_F32_MAX_CHARS; i < (int) sizeof(buf); i++) {
        if ((unsigned char) buf[i] != 0x5a) {
            break;
        }
    }

    if (len < 3 || len > 15 || i != (int) sizeof(buf)) {
        c->bad_length++;
        report(c, bits, "length or store bound", "");
        return;
    }

    memcpy(text, buf, (size_t) len);
    text[len] = '\0';

    if (isinf(v)) {
        if (strcmp(text, "null") != 0) {
            c->bad_syntax++;
            report(c, bits, "infinity is not null", text);
        }
        return;
    }

    if (parse_number(text, &d) != 0 || d.neg != (signbit(v) != 0)) {
        c->bad_syntax++;
        report(c, bits, "syntax or layout", text);
        return;
    }

    r = strtof(text, NULL);
    if (memcmp(&r, &v, sizeof(float)) != 0) {
        c->bad_roundtrip++;
        report(c, bits, "does not read back", text);
        return;
    }

    if (msv_f32_decimal(v, &dd, &de) != 0 || dd != d.digits
        || (dd != 0 && de != d.exp))
    {
        c->bad_decimal++;
        report(c, bits, "text differs from msv_f32_decimal", text);
        return;
    }

    /* a hashed sample: every min_every-th by index would pick one parity */
    if (d.digits == 0
        || ((idx * 0x9e3779b97f4a7c15ULL) >> 32) % min_every != 0)
    {
        return;
    }

    c->sampled++;
    n = n_digits(d.digits);

    if (n >= 2) {
        if (printf_decimal(v, n - 2, &m, &e) != 0) {
            c->bad_minimal++;
            report(c, bits, "printf failed", text);
            return;
        }

        if (reads_back(v, m, e) || reads_back(v, m - 1, e)
            || reads_back(v, m + 1, e))
        {
            c->bad_minimal++;
            report(c, bits, "a shorter decimal reads back", text);
            return;
        }
    }

    if (printf_decimal(v, n - 1, &m, &e) != 0) {
        c->bad_closest++;
        report(c, bits, "printf failed", text);
        return;
    }

    if (reads_back(v, m, e)) {
        while (m % 10 == 0) {
            m /= 10;
            e++;
        }
        if (m != d.digits || e != d.exp) {
            c->bad_closest++;
            report(c, bits, "not the closest shortest decimal", text);
        }
    }
}


/*
 * The array writer (msv_json_f32s_part, its vector path where the CPU
 * has one) on patterns lo..hi - 1, against msv_fmt_f32 item by item.
 */
static void
check_array(struct counts *c, uint64_t lo, uint64_t hi)
{
    enum { BLOCK = 1024 };

    char      out[BLOCK * MSV_F32_MAX_CHARS + 64], one[MSV_F32_MAX_CHARS];
    char     *p, *end, *e;
    float     v[BLOCK];
    uint32_t  bits, j, n;
    uint64_t  i;

    for (i = lo; i < hi; i += n) {
        n = hi - i < BLOCK ? (uint32_t) (hi - i) : BLOCK;

        for (j = 0; j < n; j++) {
            bits = (uint32_t) ((i + j) * stride);
            memcpy(&v[j], &bits, sizeof(float));
        }

        end = msv_json_f32s_part(out, v, n);

        for (j = 0, p = out; j < n; j++) {
            e = msv_fmt_f32(one, v[j]);

            if (end - p < e - one + 1 || memcmp(p, one, e - one) != 0
                || p[e - one] != ',')
            {
                memcpy(&bits, &v[j], sizeof(float));
                c->bad_vector++;
                report(c, bits, "array writer differs from msv_fmt_f32", "");
                return;
            }

            p += e - one + 1;
        }

        if (p != end) {
            c->bad_vector++;
            report(c, (uint32_t) (i * stride), "array writer length", "");
            return;
        }
    }
}


static void *
worker(void *arg)
{
    struct counts  *c = arg;
    uint64_t        chunk, i, lo, hi;

    for ( ;; ) {
        chunk = atomic_fetch_add(&next_chunk, 1);
        lo = chunk * CHUNK;
        if (lo >= n_patterns) {
            break;
        }
        hi = lo + CHUNK < n_patterns ? lo + CHUNK : n_patterns;

        for (i = lo; i < hi; i++) {
            check_one(c, (uint32_t) (i * stride), i);
        }

        check_array(c, lo, hi);
    }

    return NULL;
}


static int
parse_arg(const char *s, const char *name, uint64_t max, uint64_t *out)
{
    char                *end;
    unsigned long long   v;

    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v == 0 || v > max) {
        fprintf(stderr, "f32_check_all: %s: \"%s\" is not a number in "
                "1..%llu\n", name, s, (unsigned long long) max);
        return -1;
    }

    *out = v;
    return 0;
}


int
main(int argc, char **argv)
{
    pthread_t      *tid;
    struct counts  *cs, t;
    uint64_t        n_threads = 2, bad;
    uint64_t        i;
    int             rc;

    if (argc > 4) {
        fprintf(stderr, "usage: f32_check_all [threads [stride "
                "[min_every]]]\n");
        return 2;
    }

    if ((argc > 1 && parse_arg(argv[1], "threads", 1024, &n_threads) != 0)
        || (argc > 2 && parse_arg(argv[2], "stride", 1u << 31, &stride) != 0)
        || (argc > 3
            && parse_arg(argv[3], "min_every", UINT32_MAX, &min_every) != 0))
    {
        return 2;
    }

    n_patterns = ((1ULL << 32) + stride - 1) / stride;

    tid = calloc(n_threads, sizeof(*tid));
    cs = calloc(n_threads, sizeof(*cs));
    if (tid == NULL || cs == NULL) {
        fprintf(stderr, "f32_check_all: out of memory\n");
        return 1;
    }

    for (i = 0; i < n_threads; i++) {
        rc = pthread_create(&tid[i], NULL, worker, &cs[i]);
        if (rc != 0) {
            fprintf(stderr, "f32_check_all: pthread_create: %s\n",
                    strerror(rc));
            return 1;
        }
    }

    memset(&t, 0, sizeof(t));

    for (i = 0; i < n_threads; i++) {
        rc = pthread_join(tid[i], NULL);
        if (rc != 0) {
            fprintf(stderr, "f32_check_all: pthread_join: %s\n",
                    strerror(rc));
            return 1;
        }

        t.checked += cs[i].checked;
        t.nan_skipped += cs[i].nan_skipped;
        t.sampled += cs[i].sampled;
        t.bad_length += cs[i].bad_length;
        t.bad_syntax += cs[i].bad_syntax;
        t.bad_roundtrip += cs[i].bad_roundtrip;
        t.bad_decimal += cs[i].bad_decimal;
        t.bad_minimal += cs[i].bad_minimal;
        t.bad_closest += cs[i].bad_closest;
        t.bad_vector += cs[i].bad_vector;
    }

    bad = t.bad_length + t.bad_syntax + t.bad_roundtrip + t.bad_decimal
          + t.bad_minimal + t.bad_closest + t.bad_vector;

    printf("patterns visited   %llu (stride %llu, %llu threads)\n",
           (unsigned long long) n_patterns, (unsigned long long) stride,
           (unsigned long long) n_threads);
    printf("NaN skipped        %llu\n", (unsigned long long) t.nan_skipped);
    printf("checked            %llu\n", (unsigned long long) t.checked);
    printf("min/closest tested %llu (every %llu)\n",
           (unsigned long long) t.sampled, (unsigned long long) min_every);
    printf("bad length/bound   %llu\n", (unsigned long long) t.bad_length);
    printf("bad syntax/layout  %llu\n", (unsigned long long) t.bad_syntax);
    printf("bad round-trip     %llu\n", (unsigned long long) t.bad_roundtrip);
    printf("bad decimal        %llu\n", (unsigned long long) t.bad_decimal);
    printf("not minimal        %llu\n", (unsigned long long) t.bad_minimal);
    printf("not closest        %llu\n", (unsigned long long) t.bad_closest);
    printf("array writer (%s) differs %llu\n",
           msv_json_simd(1) ? "vector" : "scalar",
           (unsigned long long) t.bad_vector);
    printf("%s\n", bad == 0 ? "PASS" : "FAIL");

    free(tid);
    free(cs);

    return bad == 0 ? 0 : 1;
}
