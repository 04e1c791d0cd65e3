/*
 * backend_check.h: what the backend suite (test_backend.c) and its kernel
 * checks (kernel_twins.h) share: the random inputs, the error measure,
 * and the record of comparisons.  Header-only; include it once per
 * program, after tap.h.
 *
 * Error measure: for each logits row (or kernel output row) max |a - ref|
 * / max |ref|, the largest over rows; NaN or infinity counts as failure.
 * Every comparison is one TAP line and one row of the summary table.
 */

#ifndef MSV_BACKEND_CHECK_H
#define MSV_BACKEND_CHECK_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"

/* not every program uses every helper */
#define CHK_FN static __attribute__((unused))

#define CHK_TOL_F32       1e-4
#define CHK_TOL_BF16      1e-3
#define CHK_TOL_BF16_ACT  5e-2    /* bf16-rounded activations: sanity */
#define CHK_TOL_KERNEL    1e-5
#define CHK_MAX_SEQS      8
#define CHK_MAX_LEN       160
#define CHK_MAX_RESULTS   320
#define CHK_MAX_CTX       8192    /* kernel checks' longest context */

struct chk_result {
    char    name[96];
    double  err;
    double  tol;
    int     ok;
};

static struct chk_result  chk_results[CHK_MAX_RESULTS];
static int                chk_n_results;
static int                chk_failed;
static uint64_t           chk_rng = 0x9e3779b97f4a7c15ull;
static int                chk_threads = 4;


/* ---- small helpers ---------------------------------------------------- */

CHK_FN uint64_t
chk_next(void)
{
    /* xorshift64* */
    chk_rng ^= chk_rng >> 12;
    chk_rng ^= chk_rng << 25;
    chk_rng ^= chk_rng >> 27;
    return chk_rng * 0x2545f4914f6cdd1dull;
}


CHK_FN float
chk_uniform(void)
{
    return (float) ((chk_next() >> 40) * (2.0 / (double) (1u << 24)) - 1.0);
}


CHK_FN uint32_t
chk_below(uint32_t n)
{
    return (uint32_t) (chk_next() % n);
}


CHK_FN void
chk_fill(float *p, size_t n, float scale)
{
    size_t  i;

    for (i = 0; i < n; i++) {
        p[i] = scale * chk_uniform();
    }
}


CHK_FN void *
chk_alloc(size_t bytes)
{
    void  *p;

    p = malloc(bytes > 0 ? bytes : 1);
    if (p == NULL) {
        fprintf(stderr, "test_backend: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}


/* Record one comparison as a TAP line, at once. */
CHK_FN void
chk_record(double err, double tol, const char *fmt, ...)
{
    struct chk_result  *r, dummy;
    va_list             ap;
    int                 ok;

    ok = !isnan(err) && err <= tol;
    r = chk_n_results < CHK_MAX_RESULTS ? &chk_results[chk_n_results++]
                                        : &dummy;
    va_start(ap, fmt);
    vsnprintf(r->name, sizeof(r->name), fmt, ap);
    va_end(ap);
    r->err = err;
    r->tol = tol;
    r->ok = ok;
    if (!ok) {
        chk_failed++;
    }
    tap_ok(ok, "%-60s max rel err %.3g (tol %.0e)", r->name, err, tol);
}


/* A failure that has no error figure. */
CHK_FN void
chk_fail(const char *fmt, ...)
{
    char     line[1024];
    va_list  ap;

    chk_failed++;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    tap_ok(0, "%s", line);
}


/* max |a - ref| / max |ref| over n values (NaN: NaN). */
CHK_FN double
chk_rel(const float *a, const float *ref, size_t n)
{
    double  d, m, r;
    size_t  i;

    d = 0.0;
    m = 0.0;
    for (i = 0; i < n; i++) {
        if (isnan(a[i]) || isinf(a[i])) {
            return NAN;
        }
        r = fabs((double) a[i] - ref[i]);
        d = r > d ? r : d;
        r = fabs((double) ref[i]);
        m = r > m ? r : m;
    }
    return m > 0.0 ? d / m : d;
}


/* The largest chk_rel over rows of n. */
CHK_FN double
chk_rel_rows(const float *a, const float *ref, size_t rows, size_t n)
{
    double  e, worst;
    size_t  r;

    worst = 0.0;
    for (r = 0; r < rows; r++) {
        e = chk_rel(a + r * n, ref + r * n, n);
        if (isnan(e)) {
            return NAN;
        }
        worst = e > worst ? e : worst;
    }
    return worst;
}


CHK_FN void
chk_poison(float *p, size_t n)
{
    size_t  i;

    for (i = 0; i < n; i++) {
        p[i] = NAN;
    }
}


CHK_FN int32_t
chk_argmax(const float *p, uint32_t n)
{
    uint32_t  i, best;

    best = 0;
    for (i = 1; i < n; i++) {
        if (p[i] > p[best]) {
            best = i;
        }
    }
    return (int32_t) best;
}


/* f rounded to the nearest bf16 (ties to even), as a float. */
CHK_FN float
chk_round_bf16(float f)
{
    uint32_t  u;

    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return f;
    }
    u += 0x7fffu + ((u >> 16) & 1);
    u &= 0xffff0000u;
    memcpy(&f, &u, sizeof(f));
    return f;
}


/* bf16 bits h as a float. */
CHK_FN float
chk_bf16_val(uint16_t h)
{
    uint32_t  u = (uint32_t) h << 16;
    float     f;

    memcpy(&f, &u, sizeof(f));
    return f;
}


/* f as bf16 bits, rounded to the nearest (ties to even). */
CHK_FN uint16_t
chk_to_bf16(float f)
{
    uint32_t  u;

    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t) ((u >> 16) | 0x40);       /* quiet NaN */
    }
    u += 0x7fffu + ((u >> 16) & 1);                 /* nearest even */
    return (uint16_t) (u >> 16);
}

#endif /* MSV_BACKEND_CHECK_H */
