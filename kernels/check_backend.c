/*
 * check_backend.c: the CUDA backend against its CPU twins.
 *
 *   1. Kernels: RMSNorm, bias + q/k norm + RoPE + KV store, and paged
 *      attention, each against a double-precision CPU twin on fresh
 *      random inputs with odd sizes.
 *   2. Interface: KV page accounting and the errors forward reports.
 *   3. Models: the same schedule (prefills, decodes, mixed and chunked
 *      batches, page reuse) through the CPU backend and the CUDA backend,
 *      logits compared step by step; for each fixture also against the
 *      Hugging Face float64 logits in ref.bin.
 *   4. Timing: a decode step of the qwen3-8b preset (dummy bf16 weights)
 *      at batch 1, 32 and 256.
 *
 * Error measure: for each logits row (or kernel output) max |a - ref| /
 * max |ref|, the largest over rows; NaN counts as failure.
 *
 * usage: check_backend [-f fixtures_dir] [-n] [-q] [-s seed]
 *   -n  no timing      -q  no qwen3-0.6b comparison (quicker)
 *   -s  the random inputs' seed (default: from the clock; printed first)
 */

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <yajl/yajl_tree.h>

#include "backend.h"
#include "kv_direct.h"
#include "model.h"
#include "backend_cuda.h"
#include "kernel_check.h"

#define CHK_TOL_F32       1e-4
#define CHK_TOL_BF16      1e-3
#define CHK_TOL_BF16_ACT  5e-2    /* bf16-rounded activations: sanity */
#define CHK_TOL_KERNEL    1e-5
#define CHK_MAX_SEQS      8
#define CHK_MAX_LEN       160
#define CHK_MAX_RESULTS   256
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

static uint64_t
chk_next(void)
{
    /* xorshift64* */
    chk_rng ^= chk_rng >> 12;
    chk_rng ^= chk_rng << 25;
    chk_rng ^= chk_rng >> 27;
    return chk_rng * 0x2545f4914f6cdd1dull;
}


static float
chk_uniform(void)
{
    return (float) ((chk_next() >> 40) * (2.0 / (double) (1u << 24)) - 1.0);
}


static uint32_t
chk_below(uint32_t n)
{
    return (uint32_t) (chk_next() % n);
}


static void
chk_fill(float *p, size_t n, float scale)
{
    size_t  i;

    for (i = 0; i < n; i++) {
        p[i] = scale * chk_uniform();
    }
}


static void *
chk_alloc(size_t bytes)
{
    void  *p;

    p = malloc(bytes > 0 ? bytes : 1);
    if (p == NULL) {
        fprintf(stderr, "check_backend: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}


static double
chk_now(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}


/* Record one comparison; prints it at once. */
static void
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
    printf("%s %-60s max rel err %.3g (tol %.0e)\n", ok ? "ok  " : "FAIL",
           r->name, err, tol);
    fflush(stdout);
}


/* A failure that has no error figure. */
static void
chk_fail(const char *fmt, ...)
{
    va_list  ap;

    chk_failed++;
    printf("FAIL ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}


/* max |a - ref| / max |ref| over n values (NaN: NaN). */
static double
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
static double
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


static void
chk_poison(float *p, size_t n)
{
    size_t  i;

    for (i = 0; i < n; i++) {
        p[i] = NAN;
    }
}


static int32_t
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


/* ---- kernel twins ----------------------------------------------------- */

static void
twin_rmsnorm(float *out, const float *x, const int32_t *rows, const float *w,
    uint32_t n_rows, uint32_t n, float eps)
{
    const float  *xr;
    double        ss, scale;
    uint32_t      r, i;

    for (r = 0; r < n_rows; r++) {
        xr = x + (size_t) (rows != NULL ? (uint32_t) rows[r] : r) * n;
        ss = 0.0;
        for (i = 0; i < n; i++) {
            ss += (double) xr[i] * xr[i];
        }
        scale = 1.0 / sqrt(ss / n + eps);
        for (i = 0; i < n; i++) {
            out[(size_t) r * n + i] = (float) (w[i] * (xr[i] * scale));
        }
    }
}


/* f rounded to the nearest bf16 (ties to even), as a float. */
static float
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


/* Cache offset of (token t's slot, kv head). */
static size_t
twin_slot(const struct msv_check_kv *kv, uint32_t n_kv_heads,
    uint32_t head_dim, uint32_t t, uint32_t kvh)
{
    int32_t  p, page;

    p = kv->pos[t];
    page = kv->pages[kv->page_off[kv->tok_seq[t]] + p / MSV_KV_BLOCK];
    return (((size_t) page * n_kv_heads + kvh) * MSV_KV_BLOCK
            + (size_t) (p % MSV_KV_BLOCK)) * head_dim;
}


/* Same contract as msv_cuda_run_qkv_rope; written marks cache entries
 * the twin wrote. */
static void
twin_qkv_rope(float *qkv, uint32_t nh, uint32_t nkv, uint32_t hd,
    const float *bias, const float *q_norm, const float *k_norm, float eps,
    const float *inv_freq, const struct msv_check_kv *kv, uint8_t *written)
{
    uint32_t      t, h, d, half, heads;
    double        v[512], ss, scale, ang, y0, y1;
    float        *row, *cache;
    const float  *nw;
    size_t        off;
    int           is_q, is_k;

    half = hd / 2;
    heads = nh + 2 * nkv;

    for (t = 0; t < kv->n_tokens; t++) {
        for (h = 0; h < heads; h++) {
            row = qkv + ((size_t) t * heads + h) * hd;
            is_q = h < nh;
            is_k = !is_q && h < nh + nkv;

            for (d = 0; d < hd; d++) {
                v[d] = (double) row[d]
                       + (bias != NULL ? bias[(size_t) h * hd + d] : 0.0);
            }

            nw = is_q ? q_norm : (is_k ? k_norm : NULL);
            if (nw != NULL) {
                ss = 0.0;
                for (d = 0; d < hd; d++) {
                    ss += v[d] * v[d];
                }
                scale = 1.0 / sqrt(ss / hd + eps);
                for (d = 0; d < hd; d++) {
                    v[d] = nw[d] * (v[d] * scale);
                }
            }

            if (is_q || is_k) {
                for (d = 0; d < half; d++) {
                    /* the angle is the fp32 product, as in HF */
                    ang = (double) ((float) kv->pos[t] * inv_freq[d]);
                    y0 = v[d] * cos(ang) - v[d + half] * sin(ang);
                    y1 = v[d + half] * cos(ang) + v[d] * sin(ang);
                    v[d] = y0;
                    v[d + half] = y1;
                }
            }

            for (d = 0; d < hd; d++) {
                row[d] = (float) v[d];
            }

            if (!is_q && kv->k_cache != NULL) {
                off = twin_slot(kv, nkv, hd, t,
                                is_k ? h - nh : h - nh - nkv);
                cache = is_k ? kv->k_cache : kv->v_cache;
                for (d = 0; d < hd; d++) {
                    cache[off + d] = kv->kv_bf16 ? chk_round_bf16((float) v[d])
                                                 : (float) v[d];
                    written[off + d] |= is_k ? 1 : 2;
                }
            }
        }
    }
}


static void
twin_attention(float *out, const float *q, uint32_t q_stride, uint32_t nh,
    uint32_t nkv, uint32_t hd, float scale, const struct msv_check_kv *kv)
{
    uint32_t      t, h, kvh, d;
    int32_t       j, p, page;
    double       *sc, m, sum, o;
    const float  *qr;
    size_t        base;

    sc = chk_alloc(((size_t) CHK_MAX_CTX + 1) * sizeof(double));

    for (t = 0; t < kv->n_tokens; t++) {
        p = kv->pos[t] < CHK_MAX_CTX ? kv->pos[t] : CHK_MAX_CTX;
        for (h = 0; h < nh; h++) {
            kvh = h / (nh / nkv);
            qr = q + (size_t) t * q_stride + (size_t) h * hd;
            m = -INFINITY;
            for (j = 0; j <= p; j++) {
                page = kv->pages[kv->page_off[kv->tok_seq[t]]
                                 + j / MSV_KV_BLOCK];
                base = (((size_t) page * nkv + kvh) * MSV_KV_BLOCK
                        + (size_t) (j % MSV_KV_BLOCK)) * hd;
                o = 0.0;
                for (d = 0; d < hd; d++) {
                    o += (double) qr[d] * kv->k_cache[base + d];
                }
                sc[j] = o * scale;
                m = sc[j] > m ? sc[j] : m;
            }
            sum = 0.0;
            for (j = 0; j <= p; j++) {
                sc[j] = exp(sc[j] - m);
                sum += sc[j];
            }
            for (d = 0; d < hd; d++) {
                o = 0.0;
                for (j = 0; j <= p; j++) {
                    page = kv->pages[kv->page_off[kv->tok_seq[t]]
                                     + j / MSV_KV_BLOCK];
                    base = (((size_t) page * nkv + kvh) * MSV_KV_BLOCK
                            + (size_t) (j % MSV_KV_BLOCK)) * hd;
                    o += sc[j] * kv->v_cache[base + d];
                }
                out[((size_t) t * nh + h) * hd + d] = (float) (o / sum);
            }
        }
    }
    free(sc);
}


/* ---- random batches over a paged cache --------------------------------- */

struct chk_map {
    struct msv_check_kv  kv;
    int32_t             *pos, *tok_seq, *page_off, *pages;
};


/* n_seqs sequences of ctx[s] tokens, the last n_new[s] of them new; pages
 * drawn at random out of a pool with spare pages. */
static void
chk_map_make(struct chk_map *m, uint32_t n_seqs, const uint32_t *ctx,
    const uint32_t *n_new)
{
    uint32_t  s, k, T, E, n_pages, *perm, tmp, j, t;

    T = 0;
    E = 0;
    for (s = 0; s < n_seqs; s++) {
        T += n_new[s];
        E += (ctx[s] + MSV_KV_BLOCK - 1) / MSV_KV_BLOCK;
    }
    n_pages = E + 5;

    m->pos = chk_alloc(T * sizeof(int32_t));
    m->tok_seq = chk_alloc(T * sizeof(int32_t));
    m->page_off = chk_alloc(n_seqs * sizeof(int32_t));
    m->pages = chk_alloc(E * sizeof(int32_t));

    perm = chk_alloc(n_pages * sizeof(uint32_t));
    for (k = 0; k < n_pages; k++) {
        perm[k] = k;
    }
    for (k = n_pages - 1; k > 0; k--) {
        j = chk_below(k + 1);
        tmp = perm[k];
        perm[k] = perm[j];
        perm[j] = tmp;
    }

    t = 0;
    E = 0;
    for (s = 0; s < n_seqs; s++) {
        m->page_off[s] = (int32_t) E;
        for (k = 0; k < (ctx[s] + MSV_KV_BLOCK - 1) / MSV_KV_BLOCK; k++) {
            m->pages[E] = (int32_t) perm[E];
            E++;
        }
        for (k = ctx[s] - n_new[s]; k < ctx[s]; k++) {
            m->pos[t] = (int32_t) k;
            m->tok_seq[t] = (int32_t) s;
            t++;
        }
    }
    free(perm);

    memset(&m->kv, 0, sizeof(m->kv));
    m->kv.n_tokens = T;
    m->kv.n_seqs = n_seqs;
    m->kv.n_entries = E;
    m->kv.n_pages = n_pages;
    m->kv.pos = m->pos;
    m->kv.tok_seq = m->tok_seq;
    m->kv.page_off = m->page_off;
    m->kv.pages = m->pages;
}


static void
chk_map_free(struct chk_map *m)
{
    free(m->pos);
    free(m->tok_seq);
    free(m->page_off);
    free(m->pages);
}


/* ---- 1. kernels --------------------------------------------------------- */

static void
check_rmsnorm(void)
{
    static const uint32_t  shapes[][2] = {
        { 1, 1 }, { 3, 77 }, { 17, 1000 }, { 5, 4099 }, { 2, 8192 },
        { 64, 4096 }
    };
    static const char     *fmt_name[] = { "f32", "bf16", "bf16x2" };
    static const double    fmt_tol[] = { CHK_TOL_KERNEL, 4e-3,
                                         CHK_TOL_KERNEL };
    char                   err[512];
    float                 *x, *w, *out, *ref;
    int32_t               *rows;
    uint32_t               i, s, nr, n, n_in;
    int                    fmt, gather;

    for (s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        for (fmt = 0; fmt < 3; fmt++) {
            for (gather = 0; gather < 2; gather++) {
                nr = shapes[s][0];
                n = shapes[s][1];
                n_in = nr + 3;
                x = chk_alloc((size_t) n_in * n * sizeof(float));
                w = chk_alloc(n * sizeof(float));
                out = chk_alloc((size_t) nr * n * sizeof(float));
                ref = chk_alloc((size_t) nr * n * sizeof(float));
                rows = chk_alloc(nr * sizeof(int32_t));

                chk_fill(x, (size_t) n_in * n, 3.0f);
                /* an outlier, so rows are not uniform */
                x[chk_below(n_in * n)] = 40.0f;
                for (i = 0; i < n; i++) {
                    w[i] = 1.0f + 0.5f * chk_uniform();
                }
                for (i = 0; i < nr; i++) {
                    rows[i] = (int32_t) chk_below(n_in);
                }
                chk_poison(out, (size_t) nr * n);

                if (msv_cuda_run_rmsnorm(out, fmt, x, n_in,
                                         gather ? rows : NULL, w, nr, n,
                                         1e-6f, err, sizeof(err)) != 0)
                {
                    chk_fail("kernel rmsnorm %ux%u: %s", nr, n, err);
                } else {
                    twin_rmsnorm(ref, x, gather ? rows : NULL, w, nr, n,
                                 1e-6f);
                    chk_record(chk_rel_rows(out, ref, nr, n), fmt_tol[fmt],
                               "kernel rmsnorm %ux%u %s%s", nr, n,
                               fmt_name[fmt], gather ? " gather" : "");
                }
                free(x);
                free(w);
                free(out);
                free(ref);
                free(rows);
            }
        }
    }
}


struct rope_case {
    uint32_t  nh, nkv, hd, n_seqs, max_ctx;
    int       bias, norm;
};


static void
check_qkv_rope(void)
{
    static const struct rope_case  cases[] = {
        { 4, 2, 16, 3, 40, 1, 1 },
        { 12, 3, 64, 4, 5000, 0, 1 },
        { 8, 8, 128, 2, 300, 1, 0 },
        { 2, 1, 256, 2, 33, 0, 0 },
        { 3, 1, 6, 5, 70, 1, 1 },
        { 32, 8, 128, 3, 2000, 0, 1 },
    };
    const struct rope_case        *c;
    struct chk_map                 m;
    char                           err[512];
    uint32_t                       ctx[8], n_new[8], s, heads, k;
    float                         *qkv, *ref, *bias, *qn, *kn, *inv;
    float                         *kc, *vc, *rkc, *rvc, *gk, *gv, *rk, *rv;
    uint8_t                       *written;
    size_t                         nq, cache, i, nw, bad;
    double                         e1, e2, e3;
    int                            kb;

    for (k = 0; k < 2 * sizeof(cases) / sizeof(cases[0]); k++) {
        c = &cases[k / 2];
        kb = k % 2;
        for (s = 0; s < c->n_seqs; s++) {
            ctx[s] = 1 + chk_below(c->max_ctx);
            n_new[s] = 1 + chk_below(ctx[s] < 19 ? ctx[s] : 19);
        }
        chk_map_make(&m, c->n_seqs, ctx, n_new);

        heads = c->nh + 2 * c->nkv;
        nq = (size_t) m.kv.n_tokens * heads * c->hd;
        cache = (size_t) m.kv.n_pages * c->nkv * MSV_KV_BLOCK * c->hd;

        qkv = chk_alloc(nq * sizeof(float));
        ref = chk_alloc(nq * sizeof(float));
        bias = chk_alloc((size_t) heads * c->hd * sizeof(float));
        qn = chk_alloc(c->hd * sizeof(float));
        kn = chk_alloc(c->hd * sizeof(float));
        inv = chk_alloc(c->hd / 2 * sizeof(float));
        kc = chk_alloc(cache * sizeof(float));
        vc = chk_alloc(cache * sizeof(float));
        rkc = chk_alloc(cache * sizeof(float));
        rvc = chk_alloc(cache * sizeof(float));
        written = calloc(cache, 1);
        if (written == NULL) {
            fprintf(stderr, "check_backend: out of memory\n");
            exit(2);
        }

        chk_fill(qkv, nq, 2.0f);
        memcpy(ref, qkv, nq * sizeof(float));
        chk_fill(bias, (size_t) heads * c->hd, 0.5f);
        for (i = 0; i < c->hd; i++) {
            qn[i] = 1.0f + 0.3f * chk_uniform();
            kn[i] = 1.0f + 0.3f * chk_uniform();
        }
        for (i = 0; i < c->hd / 2; i++) {
            inv[i] = (float) pow(10000.0, -2.0 * i / c->hd);
        }
        for (i = 0; i < cache; i++) {
            kc[i] = -768.0f;     /* poison (exact in bf16): must survive */
            vc[i] = -768.0f;     /* where unwritten */
        }
        memcpy(rkc, kc, cache * sizeof(float));
        memcpy(rvc, vc, cache * sizeof(float));

        m.kv.k_cache = kc;
        m.kv.v_cache = vc;
        m.kv.kv_bf16 = kb;
        if (msv_cuda_run_qkv_rope(qkv, c->nh, c->nkv, c->hd,
                                  c->bias ? bias : NULL,
                                  c->norm ? qn : NULL, c->norm ? kn : NULL,
                                  1e-6f, inv, &m.kv, err, sizeof(err)) != 0)
        {
            chk_fail("kernel qkv_rope: %s", err);
        } else {
            m.kv.k_cache = rkc;
            m.kv.v_cache = rvc;
            twin_qkv_rope(ref, c->nh, c->nkv, c->hd, c->bias ? bias : NULL,
                          c->norm ? qn : NULL, c->norm ? kn : NULL, 1e-6f,
                          inv, &m.kv, written);

            /* written slots compared; every other one still the poison */
            gk = chk_alloc(cache * sizeof(float));
            gv = chk_alloc(cache * sizeof(float));
            rk = chk_alloc(cache * sizeof(float));
            rv = chk_alloc(cache * sizeof(float));
            nw = 0;
            bad = 0;
            for (i = 0; i < cache; i++) {
                if (written[i]) {
                    gk[nw] = kc[i];
                    gv[nw] = vc[i];
                    rk[nw] = rkc[i];
                    rv[nw] = rvc[i];
                    nw++;
                } else if (kc[i] != -768.0f || vc[i] != -768.0f) {
                    bad++;
                }
            }
            /* a bf16 store rounds the fp32 result: within one bf16 step
             * (2^-8 relative) of the rounded reference */
            e1 = chk_rel_rows(qkv, ref, m.kv.n_tokens, (size_t) heads * c->hd);
            e2 = chk_rel(gk, rk, nw);
            e3 = chk_rel(gv, rv, nw);
            e2 = isnan(e3) || e3 > e2 ? e3 : e2;
            if (bad != 0) {
                chk_fail("kernel qkv_rope nh=%u nkv=%u hd=%u: %zu cache "
                         "entries written outside the batch's slots",
                         c->nh, c->nkv, c->hd, bad);
            }
            chk_record(e1, CHK_TOL_KERNEL, "kernel qkv_rope nh=%u nkv=%u "
                       "hd=%u T=%u%s%s%s", c->nh, c->nkv, c->hd,
                       m.kv.n_tokens, c->bias ? " bias" : "",
                       c->norm ? " qknorm" : "", kb ? " kv-bf16" : "");
            chk_record(e2, kb ? 4e-3 : CHK_TOL_KERNEL, "kernel kv store "
                       "nkv=%u hd=%u%s", c->nkv, c->hd, kb ? " bf16" : "");
            free(gk);
            free(gv);
            free(rk);
            free(rv);
        }

        free(qkv);
        free(ref);
        free(bias);
        free(qn);
        free(kn);
        free(inv);
        free(kc);
        free(vc);
        free(rkc);
        free(rvc);
        free(written);
        chk_map_free(&m);
    }
}


struct attn_case {
    uint32_t  nh, nkv, hd, n_seqs, max_ctx;
    float     qscale;    /* large: peaked softmax */
    int       ties;      /* every key equal: uniform softmax */
};


static void
check_attention(void)
{
    static const struct attn_case  cases[] = {
        { 4, 2, 16, 3, 40, 1.0f, 0 },
        { 7, 1, 40, 4, 300, 1.0f, 0 },
        { 8, 8, 128, 2, 1000, 1.0f, 0 },
        { 32, 8, 128, 5, 700, 6.0f, 0 },
        { 2, 1, 256, 3, 100, 1.0f, 0 },
        { 6, 2, 64, 3, 90, 1.0f, 1 },
        { 4, 4, 6, 2, 17, 2.0f, 0 },
        { 32, 8, 128, 6, 3000, 1.0f, 0 },
        { 10, 2, 128, 3, 129, 1.0f, 0 },
    };
    const struct attn_case        *c;
    struct chk_map                 m;
    char                           err[512];
    uint32_t                       ctx[8], n_new[8], s, k, stride;
    float                         *q, *out, *out2, *ref, *kc, *vc;
    size_t                         nq, nout, cache, i;
    int                            kb;

    for (k = 0; k < 2 * sizeof(cases) / sizeof(cases[0]); k++) {
        c = &cases[k / 2];
        kb = k % 2;
        for (s = 0; s < c->n_seqs; s++) {
            ctx[s] = 1 + chk_below(c->max_ctx);
            n_new[s] = 1 + chk_below(ctx[s] < 9 ? ctx[s] : 9);
        }
        ctx[0] = 1;         /* a sequence with a single position */
        n_new[0] = 1;
        chk_map_make(&m, c->n_seqs, ctx, n_new);

        /* q rows as in the fused qkv buffer: q heads then k, v heads */
        stride = (c->nh + 2 * c->nkv) * c->hd;
        nq = (size_t) m.kv.n_tokens * stride;
        nout = (size_t) m.kv.n_tokens * c->nh * c->hd;
        cache = (size_t) m.kv.n_pages * c->nkv * MSV_KV_BLOCK * c->hd;

        q = chk_alloc(nq * sizeof(float));
        out = chk_alloc(nout * sizeof(float));
        out2 = chk_alloc(nout * sizeof(float));
        ref = chk_alloc(nout * sizeof(float));
        kc = chk_alloc(cache * sizeof(float));
        vc = chk_alloc(cache * sizeof(float));

        chk_fill(q, nq, c->qscale);
        chk_fill(kc, cache, 1.0f);
        chk_fill(vc, cache, 1.0f);
        if (c->ties) {
            for (i = 0; i < cache; i++) {
                kc[i] = 0.25f;
            }
        }
        if (kb) {           /* the twin reads what the bf16 cache holds */
            for (i = 0; i < cache; i++) {
                kc[i] = chk_round_bf16(kc[i]);
                vc[i] = chk_round_bf16(vc[i]);
            }
        }
        chk_poison(out, nout);
        chk_poison(out2, nout);

        m.kv.k_cache = kc;
        m.kv.v_cache = vc;
        m.kv.kv_bf16 = kb;
        if (msv_cuda_run_attention(out, q, stride, c->nh, c->nkv, c->hd,
                                   (float) (1.0 / sqrt(c->hd)), &m.kv,
                                   MSV_CHECK_ATTN_FOLD, err, sizeof(err)) != 0
            || msv_cuda_run_attention(out2, q, stride, c->nh, c->nkv, c->hd,
                                      (float) (1.0 / sqrt(c->hd)), &m.kv,
                                      MSV_CHECK_ATTN_PARALLEL, err,
                                      sizeof(err)) != 0)
        {
            chk_fail("kernel attention: %s", err);
        } else {
            /* batch invariance: one block walking the splits and one
             * block per split + merge give the same bits */
            if (memcmp(out, out2, nout * sizeof(float)) != 0) {
                chk_fail("kernel attention nh=%u nkv=%u hd=%u%s: serial "
                         "and split forms differ", c->nh, c->nkv, c->hd,
                         kb ? " kv-bf16" : "");
            }
            twin_attention(ref, q, stride, c->nh, c->nkv, c->hd,
                           (float) (1.0 / sqrt(c->hd)), &m.kv);
            chk_record(chk_rel_rows(out, ref, (size_t) m.kv.n_tokens * c->nh,
                                    c->hd),
                       CHK_TOL_KERNEL, "kernel attention nh=%u nkv=%u hd=%u "
                       "T=%u%s%s%s", c->nh, c->nkv, c->hd, m.kv.n_tokens,
                       c->qscale > 1.0f ? " peaked" : "",
                       c->ties ? " ties" : "", kb ? " kv-bf16" : "");
        }

        free(q);
        free(out);
        free(out2);
        free(ref);
        free(kc);
        free(vc);
        chk_map_free(&m);
    }
}


static float
chk_bf16_val(uint16_t h)
{
    uint32_t  u = (uint32_t) h << 16;
    float     f;

    memcpy(&f, &u, sizeof(f));
    return f;
}


static uint16_t chk_to_bf16(float f);


/* The small-batch GEMV path against a double-precision product. */
static void
check_gemv(void)
{
    static const uint32_t  cases[][4] = {   /* rows, cols, n, accumulate */
        { 37, 8, 1, 0 }, { 4096, 4096, 1, 1 }, { 1000, 12288, 3, 0 },
        { 6144, 4096, 8, 1 }, { 33, 2056, 5, 0 }, { 151, 1024, 2, 1 },
        { 1, 64, 7, 0 },
    };
    char       err[512];
    uint16_t  *w, *x;
    float     *out, *ref;
    double     sum;
    uint32_t   k, r, m, i, rows, cols, n;
    size_t     nw;

    for (k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        rows = cases[k][0];
        cols = cases[k][1];
        n = cases[k][2];
        nw = (size_t) rows * cols;
        w = chk_alloc(nw * sizeof(uint16_t));
        x = chk_alloc((size_t) n * cols * sizeof(uint16_t));
        out = chk_alloc((size_t) n * rows * sizeof(float));
        ref = chk_alloc((size_t) n * rows * sizeof(float));
        for (i = 0; i < nw; i++) {
            w[i] = chk_to_bf16((float) (chk_uniform() * 2.0 - 1.0)
                               / sqrtf((float) cols));
        }
        for (i = 0; i < n * cols; i++) {
            x[i] = chk_to_bf16((float) (chk_uniform() * 4.0 - 2.0));
        }
        chk_fill(out, (size_t) n * rows, 1.0f);
        for (m = 0; m < n; m++) {
            for (r = 0; r < rows; r++) {
                sum = cases[k][3] ? out[(size_t) m * rows + r] : 0.0;
                for (i = 0; i < cols; i++) {
                    sum += (double) chk_bf16_val(w[(size_t) r * cols + i])
                           * chk_bf16_val(x[(size_t) m * cols + i]);
                }
                ref[(size_t) m * rows + r] = (float) sum;
            }
        }
        if (msv_cuda_run_gemv(out, w, x, rows, cols, n, (int) cases[k][3],
                              err, sizeof(err)) != 0)
        {
            chk_fail("kernel gemv: %s", err);
        } else {
            chk_record(chk_rel_rows(out, ref, n, rows), CHK_TOL_KERNEL,
                       "kernel gemv %ux%u n=%u%s", rows, cols, n,
                       cases[k][3] ? " accumulate" : "");
        }
        free(w);
        free(x);
        free(out);
        free(ref);
    }
}


/* ---- weights rounded to bf16 ------------------------------------------- */

struct chk_bf16w {
    struct msv_weights   w;
    void               **bufs;
    int                  n_bufs;
};


static uint16_t
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


/* A copy of src's table with every tensor stored as bf16. */
static void
chk_bf16_weights(const struct msv_weights *src, struct chk_bf16w *dst)
{
    const struct msv_tensor  *t;
    struct msv_tensor        *o;
    size_t                    n, i, off, k;
    uint16_t                 *h;
    float                    *f;
    int                       j;

    memset(dst, 0, sizeof(*dst));
    dst->w.t = chk_alloc(src->n * sizeof(struct msv_tensor));
    dst->bufs = chk_alloc(src->n * sizeof(void *));
    dst->w.n = src->n;
    snprintf(dst->w.source, sizeof(dst->w.source), "%.400s, rounded to "
             "bf16", src->source);

    f = chk_alloc(65536 * sizeof(float));
    for (j = 0; j < src->n; j++) {
        t = &src->t[j];
        o = &dst->w.t[j];
        *o = *t;
        n = t->bytes / (t->dtype == MSV_F32 ? 4 : 2);
        h = chk_alloc(n * sizeof(uint16_t));
        for (off = 0; off < n; off += k) {
            k = n - off < 65536 ? n - off : 65536;
            msv_tensor_to_f32(t, off, k, f);
            for (i = 0; i < k; i++) {
                h[off + i] = chk_to_bf16(f[i]);
            }
        }
        o->dtype = MSV_BF16;
        o->data = h;
        o->bytes = n * sizeof(uint16_t);
        o->file = -1;
        dst->bufs[dst->n_bufs++] = h;
    }
    free(f);
}


static void
chk_bf16_free(struct chk_bf16w *b)
{
    int  i;

    for (i = 0; i < b->n_bufs; i++) {
        free(b->bufs[i]);
    }
    free(b->bufs);
    free(b->w.t);
}


/* ---- 2. interface ------------------------------------------------------- */

static void
check_api(const struct msv_model_config *cfg, const struct msv_weights *w)
{
    const struct msv_backend_ops  *ops = msv_backend_cuda();
    struct msv_backend            *b;
    struct msv_model_config        bad;
    struct msv_batch               bt;
    char                           err[512];
    uint32_t                       seq[2], n_new[2], pos0[2];
    int32_t                        tok[4];
    float                         *lg;
    int                            fails0;
    static const uint32_t          bad_page[1] = { 1u << 30 };
    const uint32_t                *bad_tab[1] = { bad_page };
    uint32_t                       bad_n[1] = { 1 };

    fails0 = chk_failed;
    lg = chk_alloc(4 * (size_t) cfg->vocab_size * sizeof(float));

#define API(cond, what)                                                      \
    do {                                                                     \
        if (!(cond)) {                                                       \
            chk_fail("api: %s", what);                                       \
        }                                                                    \
    } while (0)

    bad = *cfg;
    bad.head_dim = 15;
    err[0] = '\0';
    API(msv_kvd_create(ops, &bad, w, 2, 64, 0, 1, err, sizeof(err)) == NULL
        && err[0] != '\0', "odd head_dim is refused with a message");

    setenv("MSV_CUDA_ACT", "bogus", 1);
    err[0] = '\0';
    API(msv_kvd_create(ops, cfg, w, 2, 64, 0, 1, err, sizeof(err)) == NULL
        && strstr(err, "MSV_CUDA_ACT") != NULL,
        "MSV_CUDA_ACT=bogus is refused with a message naming it");
    unsetenv("MSV_CUDA_ACT");

    b = msv_kvd_create(ops, cfg, w, 4, 64, 64, 1, err, sizeof(err));
    if (b == NULL) {
        chk_fail("api: create: %s", err);
        free(lg);
        return;
    }

    API(msv_kvd_free(b) == 64, "kv_tokens 64 gives 64 free");
    API(msv_kvd_reserve(b, 0, 40) == 0, "reserve 40 tokens");
    API(msv_kvd_free(b) == 16, "3 pages taken");
    API(msv_kvd_reserve(b, 1, 32) == -1, "reserve past the pool fails");
    API(msv_kvd_free(b) == 16, "a failed reserve takes nothing");
    API(msv_kvd_reserve(b, 0, 30) == 0 && msv_kvd_free(b) == 16,
        "reserving less than held is a no-op");
    API(msv_kvd_reserve(b, 1, 65) == -1, "reserve past max_len fails");
    API(msv_kvd_reserve(b, 4, 1) == -1, "reserve of seq >= max_seqs fails");

    memset(&bt, 0, sizeof(bt));
    bt.seq = seq;
    bt.n_new = n_new;
    bt.pos0 = pos0;
    bt.tokens = tok;
    tok[0] = 1; tok[1] = 2; tok[2] = 3; tok[3] = 4;

    bt.n_seqs = 1; seq[0] = 1; n_new[0] = 2; pos0[0] = 0;
    err[0] = '\0';
    API(msv_kvd_forward(ops, b, &bt, lg, err,
                        sizeof(err)) == -1 && err[0] != '\0',
        "forward of an unreserved sequence fails with a message");

    seq[0] = 0; tok[0] = (int32_t) cfg->vocab_size;
    err[0] = '\0';
    API(msv_kvd_forward(ops, b, &bt, lg, err, sizeof(err)) == -1
        && strstr(err, "vocab") != NULL,
        "a token outside the vocabulary fails with a message");
    tok[0] = 1;

    bt.n_seqs = 2; seq[1] = 0; n_new[1] = 1; pos0[1] = 2;
    err[0] = '\0';
    API(msv_kvd_forward(ops, b, &bt, lg, err, sizeof(err)) == -1
        && strstr(err, "twice") != NULL, "a duplicate sequence fails");

    bt.n_seqs = 1; pos0[0] = 0;
    bt.pages = bad_tab;
    bt.n_pages = bad_n;
    err[0] = '\0';
    API(ops->forward(b, &bt, lg, err, sizeof(err)) == -1 && err[0] != '\0',
        "a page id outside the pool fails");

    pos0[0] = 0; n_new[0] = 0;
    err[0] = '\0';
    API(msv_kvd_forward(ops, b, &bt, lg, err,
                        sizeof(err)) == -1 && err[0] != '\0',
        "a sequence with no new tokens fails");

    n_new[0] = 3;
    err[0] = '\0';
    API(msv_kvd_forward(ops, b, &bt, lg, err, sizeof(err)) == 0,
                        "a valid forward");
    if (err[0] != '\0') {
        printf("     (%s)\n", err);
    }

    msv_kvd_release(b, 0);
    API(msv_kvd_free(b) == 64, "release gives every page back");
    API(msv_kvd_reserve(b, 1, 64) == 0 && msv_kvd_free(b) == 0,
        "the whole pool for one sequence");

    msv_kvd_destroy(ops, b);
    free(lg);

#undef API

    if (chk_failed == fails0) {
        printf("ok   api: create errors, KV accounting, forward errors\n");
    }
}


/* ---- 3. models: CPU vs CUDA -------------------------------------------- */

struct duo {
    const struct msv_backend_ops  *ops[2];    /* 0 cpu, 1 cuda */
    struct msv_backend            *b[2];
    uint32_t                       vocab;
    float                         *out[2];
    size_t                         max_rows;
    int32_t                        next[CHK_MAX_SEQS];
    uint32_t                       len[CHK_MAX_SEQS];
    double                         err;
    int                            step;
    int                            broken;
    const char                    *name;
};


/* One batch through both backends: seqs[i] gets n_new[i] tokens (a
 * decode uses the CPU's argmax from the previous step, a prefill chunk
 * random tokens). */
static void
duo_step(struct duo *d, uint32_t n, const uint32_t *seqs,
    const uint32_t *n_new, int all_logits)
{
    struct msv_batch  bt;
    char              err[512];
    uint32_t          pos0[CHK_MAX_SEQS], i, k, T, rows, r;
    int32_t           tok[CHK_MAX_LEN * CHK_MAX_SEQS];
    double            e;
    int               j;

    if (d->broken) {
        return;
    }
    d->step++;

    T = 0;
    for (i = 0; i < n; i++) {
        pos0[i] = d->len[seqs[i]];
        for (k = 0; k < n_new[i]; k++) {
            tok[T++] = n_new[i] == 1 && pos0[i] > 0
                       ? d->next[seqs[i]]
                       : (int32_t) chk_below(d->vocab);
        }
        for (j = 0; j < 2; j++) {
            if (msv_kvd_reserve(d->b[j], seqs[i], pos0[i] + n_new[i])
                != 0)
            {
                chk_fail("%s: step %d: %s kv_reserve(%u, %u) failed",
                         d->name, d->step, d->ops[j]->name, seqs[i],
                         pos0[i] + n_new[i]);
                d->broken = 1;
                return;
            }
        }
    }
    if (msv_kvd_free(d->b[0]) != msv_kvd_free(d->b[1])) {
        chk_fail("%s: step %d: kv_free differs: cpu %llu, cuda %llu",
                 d->name, d->step,
                 (unsigned long long) msv_kvd_free(d->b[0]),
                 (unsigned long long) msv_kvd_free(d->b[1]));
    }

    memset(&bt, 0, sizeof(bt));
    bt.n_seqs = n;
    bt.seq = seqs;
    bt.n_new = n_new;
    bt.pos0 = pos0;
    bt.tokens = tok;
    bt.all_logits = all_logits;
    rows = all_logits ? T : n;

    for (j = 0; j < 2; j++) {
        chk_poison(d->out[j], (size_t) rows * d->vocab);
        if (msv_kvd_forward(d->ops[j], d->b[j], &bt, d->out[j], err,
                            sizeof(err))
            != 0)
        {
            chk_fail("%s: step %d: %s forward: %s", d->name, d->step,
                     d->ops[j]->name, err);
            d->broken = 1;
            return;
        }
    }

    e = chk_rel_rows(d->out[1], d->out[0], rows, d->vocab);
    if (!isnan(d->err) && (isnan(e) || e > d->err)) {
        d->err = e;
    }

    /* next decode token: the CPU's argmax of each sequence's last row */
    r = 0;
    for (i = 0; i < n; i++) {
        r += all_logits ? n_new[i] : 1;
        d->next[seqs[i]] = chk_argmax(d->out[0] + (size_t) (r - 1) * d->vocab,
                                      d->vocab);
        d->len[seqs[i]] = pos0[i] + n_new[i];
    }
}


static void
duo_release(struct duo *d, uint32_t seq)
{
    msv_kvd_release(d->b[0], seq);
    msv_kvd_release(d->b[1], seq);
    d->len[seq] = 0;
}


static int
chk_any_bf16(const struct msv_weights *w)
{
    int  i;

    for (i = 0; i < w->n; i++) {
        if (w->t[i].dtype == MSV_BF16) {
            return 1;
        }
    }
    return 0;
}


/* The schedule through both backends; records the largest error. */
static void
check_model(const char *name, const struct msv_model_config *cfg,
    const struct msv_weights *w, const char *act, double tol)
{
    struct duo  d;
    char        err[512];
    uint32_t    s[4], n[4], i;

    memset(&d, 0, sizeof(d));
    d.name = name;
    d.vocab = cfg->vocab_size;
    d.ops[0] = &msv_backend_cpu;
    d.ops[1] = msv_backend_cuda();
    d.max_rows = CHK_MAX_LEN;
    d.out[0] = chk_alloc(d.max_rows * d.vocab * sizeof(float));
    d.out[1] = chk_alloc(d.max_rows * d.vocab * sizeof(float));

    setenv("MSV_CUDA_ACT", act, 1);
    d.b[0] = msv_kvd_create(d.ops[0], cfg, w, CHK_MAX_SEQS, CHK_MAX_LEN, 0,
                              chk_threads, err, sizeof(err));
    if (d.b[0] == NULL) {
        chk_fail("%s: cpu create: %s", name, err);
        goto done;
    }
    d.b[1] = msv_kvd_create(d.ops[1], cfg, w, CHK_MAX_SEQS, CHK_MAX_LEN, 0,
                              chk_threads, err, sizeof(err));
    if (d.b[1] == NULL) {
        chk_fail("%s: cuda create: %s", name, err);
        goto done;
    }

#define STEP(all, ...)                                                       \
    do {                                                                     \
        uint32_t  pairs_[] = { __VA_ARGS__ };                                \
        uint32_t  k_;                                                        \
        for (k_ = 0; k_ < sizeof(pairs_) / sizeof(pairs_[0]) / 2; k_++) {    \
            s[k_] = pairs_[2 * k_];                                          \
            n[k_] = pairs_[2 * k_ + 1];                                      \
        }                                                                    \
        duo_step(&d, k_, s, n, all);                                         \
    } while (0)

    /* (sequence, new tokens) pairs */
    STEP(1, 0, 5, 1, 1, 2, 37);             /* prefills across pages */
    for (i = 0; i < 3; i++) {
        STEP(0, 0, 1, 1, 1, 2, 1);          /* decodes */
    }
    STEP(0, 0, 1, 3, 20, 2, 1);             /* decode + first chunk */
    STEP(1, 3, 13, 1, 1);                   /* second chunk + decode */
    duo_release(&d, 1);
    STEP(0, 7, 18, 0, 1, 3, 1);             /* reuses seq 1's pages */
    for (i = 0; i < 3; i++) {
        STEP(0, 7, 1, 0, 1, 3, 1, 2, 1);    /* decodes, shuffled order */
    }
    STEP(1, 5, 100, 2, 1);                  /* long prefill + decode */
    STEP(0, 5, 1, 0, 1, 7, 1, 3, 1);
#undef STEP

    if (!d.broken) {
        chk_record(d.err, tol, "%s cuda vs cpu (%d steps)%s", name, d.step,
                   chk_any_bf16(w) && strcmp(act, "bf16") == 0
                   ? " bf16 act" : "");
    }

done:
    if (d.b[0] != NULL) {
        msv_kvd_destroy(d.ops[0], d.b[0]);
    }
    if (d.b[1] != NULL) {
        msv_kvd_destroy(d.ops[1], d.b[1]);
    }
    unsetenv("MSV_CUDA_ACT");
    free(d.out[0]);
    free(d.out[1]);
}


/* CPU vs CUDA for one model; bf16 weights also with bf16 activations. */
static void
check_model_modes(const char *name, const struct msv_model_config *cfg,
    const struct msv_weights *w)
{
    /* split: fp32 KV and hi + lo products; bf16: bf16 KV (and bf16
     * activations for bf16 weights) */
    check_model(name, cfg, w, "split",
                chk_any_bf16(w) ? CHK_TOL_BF16 : CHK_TOL_F32);
    check_model(name, cfg, w, "bf16", CHK_TOL_BF16_ACT);
}


/* ---- 3b. fixtures vs Hugging Face -------------------------------------- */

struct hf_ref {
    uint32_t   vocab;
    uint32_t   n_seqs;
    int32_t   *tok[CHK_MAX_SEQS];
    uint32_t   len[CHK_MAX_SEQS];
    uint32_t   plen[CHK_MAX_SEQS];
    float     *logits[CHK_MAX_SEQS];     /* [len][vocab] */
    float     *blob;
};


static char *
chk_slurp(const char *path, size_t *size)
{
    FILE   *f;
    char   *buf;
    long    n;

    f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0
        || fseek(f, 0, SEEK_SET) != 0)
    {
        fclose(f);
        return NULL;
    }
    buf = chk_alloc((size_t) n + 1);
    if (fread(buf, 1, (size_t) n, f) != (size_t) n) {
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    buf[n] = '\0';
    *size = (size_t) n;
    return buf;
}


static void
hf_ref_free(struct hf_ref *r)
{
    uint32_t  i;

    for (i = 0; i < r->n_seqs; i++) {
        free(r->tok[i]);
    }
    free(r->blob);
    memset(r, 0, sizeof(*r));
}


/* ref.json: {"vocab": V, "sequences": [[...], ...], "prompt_lens": [...]}
 * and ref.bin: float32 [len][V] per sequence. */
static int
hf_ref_load(const char *dir, struct hf_ref *r, char *err, size_t errlen)
{
    static const char  *p_vocab[] = { "vocab", NULL };
    static const char  *p_seqs[] = { "sequences", NULL };
    static const char  *p_plen[] = { "prompt_lens", NULL };
    char                path[1024], ebuf[256], *text;
    yajl_val            root, v, seqs, plen, s;
    size_t              size, rows, i, k;
    float              *blob;

    memset(r, 0, sizeof(*r));
    snprintf(path, sizeof(path), "%.900s/ref.json", dir);
    text = chk_slurp(path, &size);
    if (text == NULL) {
        snprintf(err, errlen, "%.300s: %s", path, strerror(errno));
        return -1;
    }
    root = yajl_tree_parse(text, ebuf, sizeof(ebuf));
    free(text);
    if (root == NULL) {
        snprintf(err, errlen, "%.300s: %.200s", path, ebuf);
        return -1;
    }

    v = yajl_tree_get(root, p_vocab, yajl_t_number);
    seqs = yajl_tree_get(root, p_seqs, yajl_t_array);
    plen = yajl_tree_get(root, p_plen, yajl_t_array);
    if (v == NULL || !YAJL_IS_INTEGER(v) || seqs == NULL || plen == NULL
        || YAJL_GET_ARRAY(seqs)->len != YAJL_GET_ARRAY(plen)->len
        || YAJL_GET_ARRAY(seqs)->len == 0
        || YAJL_GET_ARRAY(seqs)->len > CHK_MAX_SEQS)
    {
        snprintf(err, errlen, "%.300s: needs vocab, sequences and prompt_lens "
                 "(1 to %d sequences)", path, CHK_MAX_SEQS);
        yajl_tree_free(root);
        return -1;
    }
    r->vocab = (uint32_t) YAJL_GET_INTEGER(v);
    r->n_seqs = (uint32_t) YAJL_GET_ARRAY(seqs)->len;

    rows = 0;
    for (i = 0; i < r->n_seqs; i++) {
        s = YAJL_GET_ARRAY(seqs)->values[i];
        v = YAJL_GET_ARRAY(plen)->values[i];
        if (!YAJL_IS_ARRAY(s) || YAJL_GET_ARRAY(s)->len == 0
            || YAJL_GET_ARRAY(s)->len > CHK_MAX_LEN || !YAJL_IS_INTEGER(v)
            || YAJL_GET_INTEGER(v) < 1
            || (size_t) YAJL_GET_INTEGER(v) > YAJL_GET_ARRAY(s)->len)
        {
            snprintf(err, errlen, "%.300s: sequences[%zu] or prompt_lens[%zu] "
                     "invalid", path, i, i);
            yajl_tree_free(root);
            r->n_seqs = (uint32_t) i;
            hf_ref_free(r);
            return -1;
        }
        r->len[i] = (uint32_t) YAJL_GET_ARRAY(s)->len;
        r->plen[i] = (uint32_t) YAJL_GET_INTEGER(v);
        r->tok[i] = chk_alloc(r->len[i] * sizeof(int32_t));
        for (k = 0; k < r->len[i]; k++) {
            v = YAJL_GET_ARRAY(s)->values[k];
            if (!YAJL_IS_INTEGER(v) || YAJL_GET_INTEGER(v) < 0
                || YAJL_GET_INTEGER(v) >= r->vocab)
            {
                snprintf(err, errlen, "%.300s: sequences[%zu][%zu] is not a "
                         "token id", path, i, k);
                yajl_tree_free(root);
                r->n_seqs = (uint32_t) i + 1;
                hf_ref_free(r);
                return -1;
            }
            r->tok[i][k] = (int32_t) YAJL_GET_INTEGER(v);
        }
        rows += r->len[i];
    }
    yajl_tree_free(root);

    snprintf(path, sizeof(path), "%.900s/ref.bin", dir);
    blob = (float *) chk_slurp(path, &size);
    if (blob == NULL || size != rows * r->vocab * sizeof(float)) {
        snprintf(err, errlen, "%.300s: %s", path,
                 blob == NULL ? strerror(errno)
                              : "size does not match ref.json");
        free(blob);
        hf_ref_free(r);
        return -1;
    }
    r->blob = blob;
    for (i = 0, rows = 0; i < r->n_seqs; i++) {
        r->logits[i] = blob + rows * r->vocab;
        rows += r->len[i];
    }
    return 0;
}


/* Every sequence's prompt in one batch (all logits), then one decode
 * step at a time for the sequences that have tokens left. */
static void
check_hf(const char *name, const struct msv_backend_ops *ops,
    const struct msv_model_config *cfg, const struct msv_weights *w,
    const struct hf_ref *r, const char *act, double tol)
{
    struct msv_backend  *b;
    struct msv_batch     bt;
    char                 err[512];
    uint32_t             seq[CHK_MAX_SEQS], n_new[CHK_MAX_SEQS];
    uint32_t             pos0[CHK_MAX_SEQS], i, n, T, k, step, row;
    int32_t              tok[CHK_MAX_LEN * CHK_MAX_SEQS];
    float               *out;
    double               e, worst;

    if (r->vocab != cfg->vocab_size) {
        chk_fail("%s: ref.json vocab %u, config %u", name, r->vocab,
                 cfg->vocab_size);
        return;
    }

    setenv("MSV_CUDA_ACT", act, 1);
    b = msv_kvd_create(ops, cfg, w, CHK_MAX_SEQS, CHK_MAX_LEN, 0, chk_threads,
                       err,
                    sizeof(err));
    unsetenv("MSV_CUDA_ACT");
    if (b == NULL) {
        chk_fail("%s: %s create: %s", name, ops->name, err);
        return;
    }
    out = chk_alloc((size_t) CHK_MAX_LEN * CHK_MAX_SEQS * r->vocab
                    * sizeof(float));
    worst = 0.0;

    for (step = 0; ; step++) {
        n = 0;
        T = 0;
        for (i = 0; i < r->n_seqs; i++) {
            if (step == 0) {
                pos0[n] = 0;
                n_new[n] = r->plen[i];
            } else if (r->plen[i] + step - 1 < r->len[i]) {
                pos0[n] = r->plen[i] + step - 1;
                n_new[n] = 1;
            } else {
                continue;
            }
            seq[n] = i;
            for (k = 0; k < n_new[n]; k++) {
                tok[T++] = r->tok[i][pos0[n] + k];
            }
            if (msv_kvd_reserve(b, i, pos0[n] + n_new[n]) != 0) {
                chk_fail("%s: %s kv_reserve failed", name, ops->name);
                goto done;
            }
            n++;
        }
        if (n == 0) {
            break;
        }

        memset(&bt, 0, sizeof(bt));
        bt.n_seqs = n;
        bt.seq = seq;
        bt.n_new = n_new;
        bt.pos0 = pos0;
        bt.tokens = tok;
        bt.all_logits = step == 0;
        chk_poison(out, (size_t) T * r->vocab);
        if (msv_kvd_forward(ops, b, &bt, out, err, sizeof(err)) != 0) {
            chk_fail("%s: %s forward: %s", name, ops->name, err);
            goto done;
        }

        row = 0;
        for (i = 0; i < n; i++) {
            for (k = 0; k < n_new[i]; k++) {
                e = chk_rel(out + (size_t) row * r->vocab,
                            r->logits[seq[i]]
                            + (size_t) (pos0[i] + k) * r->vocab, r->vocab);
                worst = isnan(e) || isnan(worst) || e > worst ? e : worst;
                row++;
            }
        }
    }

    chk_record(worst, tol, "%s %s%s%s vs hf float64", name, ops->name,
               ops == &msv_backend_cpu ? "" : " ",
               ops == &msv_backend_cpu ? "" : act);

done:
    msv_kvd_destroy(ops, b);
    free(out);
}


static void
check_fixtures(const char *dir)
{
    struct msv_model_config   cfg;
    struct msv_weights        w;
    struct hf_ref             ref;
    struct dirent           **ents;
    struct stat               st;
    char                      path[1024], sub[1024], err[512];
    double                    tol;
    int                       n, i;

    n = scandir(dir, &ents, NULL, alphasort);
    if (n < 0) {
        printf("note fixtures: %s: %s (skipped)\n", dir, strerror(errno));
        return;
    }

    for (i = 0; i < n; i++) {
        snprintf(sub, sizeof(sub), "%.700s/%.250s", dir, ents[i]->d_name);
        snprintf(path, sizeof(path), "%.900s/config.json", sub);
        if (ents[i]->d_name[0] == '.' || stat(path, &st) != 0) {
            free(ents[i]);
            continue;
        }

        if (msv_config_load(path, &cfg, err, sizeof(err)) != 0) {
            chk_fail("fixture %s: %s", ents[i]->d_name, err);
            free(ents[i]);
            continue;
        }
        if (msv_weights_load(sub, &w, err, sizeof(err)) != 0) {
            chk_fail("fixture %s: %s", ents[i]->d_name, err);
            free(ents[i]);
            continue;
        }

        check_model_modes(ents[i]->d_name, &cfg, &w);

        tol = chk_any_bf16(&w) ? CHK_TOL_BF16 : CHK_TOL_F32;
        if (hf_ref_load(sub, &ref, err, sizeof(err)) != 0) {
            chk_fail("fixture %s: %s", ents[i]->d_name, err);
        } else {
            check_hf(ents[i]->d_name, msv_backend_cuda(), &cfg, &w, &ref,
                     "split", tol);
            check_hf(ents[i]->d_name, msv_backend_cuda(), &cfg, &w, &ref,
                     "bf16", CHK_TOL_BF16_ACT);
            check_hf(ents[i]->d_name, &msv_backend_cpu, &cfg, &w, &ref,
                     "split", tol);
            hf_ref_free(&ref);
        }

        msv_weights_free(&w);
        free(ents[i]);
    }
    free(ents);
}


/* ---- 4. timing ---------------------------------------------------------- */

#define BENCH_SEQS     256
#define BENCH_LEN      4096
#define BENCH_PROMPT   64
#define BENCH_CHUNK    32       /* sequences per prefill batch */
#define BENCH_LONG     4096     /* one long prefill, sequence BENCH_SEQS */
#define BENCH_WARM     3
#define BENCH_STEPS    10
#define BENCH_ROWS     4

struct bench_row {
    uint32_t  batch;
    int       pageable;          /* logits into malloc'd memory */
    double    ms[2];             /* split, bf16: median */
    double    lo[2], hi[2];      /* fastest and slowest step */
};


static int
chk_cmp_double(const void *a, const void *b)
{
    double  x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : x > y;
}


/* Step times (ms) of decode batches of n over sequences 0..n-1: median,
 * fastest, slowest. */
static int
bench_decode(const struct msv_backend_ops *ops, struct msv_backend *b,
    uint32_t vocab, uint32_t n, uint32_t *len, float *logits, double *ms,
    double *lo, double *hi)
{
    struct msv_batch  bt;
    char              err[512];
    uint32_t          seq[BENCH_SEQS], n_new[BENCH_SEQS], pos0[BENCH_SEQS];
    int32_t           tok[BENCH_SEQS];
    double            t[BENCH_STEPS], t0;
    size_t            i;
    int               step;

    for (step = 0; step < BENCH_WARM + BENCH_STEPS; step++) {
        for (i = 0; i < n; i++) {
            seq[i] = (uint32_t) i;
            n_new[i] = 1;
            pos0[i] = len[i];
            tok[i] = (int32_t) chk_below(vocab);
            if (msv_kvd_reserve(b, (uint32_t) i, len[i] + 1) != 0) {
                chk_fail("bench: kv_reserve failed");
                return -1;
            }
        }
        memset(&bt, 0, sizeof(bt));
        bt.n_seqs = n;
        bt.seq = seq;
        bt.n_new = n_new;
        bt.pos0 = pos0;
        bt.tokens = tok;

        chk_poison(logits, (size_t) n * vocab);
        t0 = chk_now();
        if (msv_kvd_forward(ops, b, &bt, logits, err, sizeof(err)) != 0) {
            chk_fail("bench: forward at batch %u: %s", n, err);
            return -1;
        }
        if (step >= BENCH_WARM) {
            t[step - BENCH_WARM] = (chk_now() - t0) * 1e3;
        }
        for (i = 0; i < n; i++) {
            len[i]++;
        }
    }

    /* a fast wrong answer is not a result */
    for (i = 0; i < (size_t) n * vocab; i++) {
        if (!isfinite(logits[i])) {
            chk_fail("bench: batch %u: logit %zu is not finite", n, i);
            return -1;
        }
    }

    qsort(t, BENCH_STEPS, sizeof(double), chk_cmp_double);
    *ms = (t[BENCH_STEPS / 2 - 1] + t[BENCH_STEPS / 2]) / 2;
    *lo = t[0];
    *hi = t[BENCH_STEPS - 1];
    return 0;
}


/* One forward of n sequences of len tokens each from position 0
 * (sequences first..first+n-1); its wall time in ms, or -1. */
static double
bench_prefill(const struct msv_backend_ops *ops, struct msv_backend *b,
    uint32_t vocab, uint32_t first, uint32_t n, uint32_t len, float *logits)
{
    struct msv_batch  bt;
    char              err[512];
    uint32_t          seq[BENCH_CHUNK], n_new[BENCH_CHUNK];
    uint32_t          pos0[BENCH_CHUNK], i;
    int32_t          *tok;
    double            t0, ms;

    tok = chk_alloc((size_t) n * len * sizeof(int32_t));
    for (i = 0; i < n * len; i++) {
        tok[i] = (int32_t) chk_below(vocab);
    }
    for (i = 0; i < n; i++) {
        seq[i] = first + i;
        n_new[i] = len;
        pos0[i] = 0;
        if (msv_kvd_reserve(b, first + i, len) != 0) {
            chk_fail("bench: kv_reserve failed");
            free(tok);
            return -1.0;
        }
    }
    memset(&bt, 0, sizeof(bt));
    bt.n_seqs = n;
    bt.seq = seq;
    bt.n_new = n_new;
    bt.pos0 = pos0;
    bt.tokens = tok;

    chk_poison(logits, (size_t) n * vocab);
    t0 = chk_now();
    if (msv_kvd_forward(ops, b, &bt, logits, err, sizeof(err)) != 0) {
        chk_fail("bench: prefill %u x %u: %s", n, len, err);
        free(tok);
        return -1.0;
    }
    ms = (chk_now() - t0) * 1e3;
    free(tok);

    for (i = 0; i < n * vocab; i++) {
        if (!isfinite(logits[i])) {
            chk_fail("bench: prefill %u x %u: logit %u is not finite", n,
                     len, i);
            return -1.0;
        }
    }
    return ms;
}


static void
bench(void)
{
    static const char           *modes[2] = { "split", "bf16" };
    static const uint32_t        batches[BENCH_ROWS] = { 1, 32, 256, 256 };
    const struct msv_backend_ops *ops = msv_backend_cuda();
    struct msv_model_config      cfg;
    struct msv_weights           w;
    struct msv_backend          *b;
    struct bench_row             rows[BENCH_ROWS];
    char                         err[512];
    uint32_t                     len[BENCH_SEQS], s;
    float                       *pinned, *pageable;
    double                       t0, ms, chunk_ms[2], long_ms[2];
    int                          m, k, n_chunks;

    if (msv_config_preset("qwen3-8b", &cfg, err, sizeof(err)) != 0) {
        chk_fail("bench: %s", err);
        return;
    }
    t0 = chk_now();
    if (msv_weights_dummy(&cfg, 42, &w, err, sizeof(err)) != 0) {
        chk_fail("bench: %s", err);
        return;
    }
    printf("bench: qwen3-8b dummy weights (%s) in %.1f s\n",
           msv_dtype_name(w.t[0].dtype), chk_now() - t0);

    pinned = msv_cuda_host_alloc((size_t) BENCH_SEQS * cfg.vocab_size
                                 * sizeof(float));
    pageable = chk_alloc((size_t) BENCH_SEQS * cfg.vocab_size
                         * sizeof(float));
    if (pinned == NULL) {
        chk_fail("bench: pinned logits buffer");
        msv_weights_free(&w);
        free(pageable);
        return;
    }
    memset(rows, 0, sizeof(rows));
    chunk_ms[0] = chunk_ms[1] = long_ms[0] = long_ms[1] = 0.0;

    for (m = 0; m < 2; m++) {
        setenv("MSV_CUDA_ACT", modes[m], 1);
        t0 = chk_now();
        b = msv_kvd_create(ops, &cfg, &w, BENCH_SEQS + 1, BENCH_LEN,
                        (uint64_t) BENCH_SEQS * 256 + BENCH_LONG, 1, err,
                        sizeof(err));
        unsetenv("MSV_CUDA_ACT");
        if (b == NULL) {
            chk_fail("bench: create (%s): %s", modes[m], err);
            break;
        }
        printf("bench: %s: create (upload + KV) %.1f s\n", modes[m],
               chk_now() - t0);

        /* one long prompt (the second of two timed), then its pages
         * back to the pool */
        if (bench_prefill(ops, b, cfg.vocab_size, BENCH_SEQS, 1, BENCH_LONG,
                          pinned) < 0
            || (long_ms[m] = bench_prefill(ops, b, cfg.vocab_size,
                                           BENCH_SEQS, 1, BENCH_LONG,
                                           pinned)) < 0)
        {
            goto next;
        }
        msv_kvd_release(b, BENCH_SEQS);

        /* BENCH_PROMPT tokens into every sequence, BENCH_CHUNK at a time */
        n_chunks = 0;
        for (s = 0; s < BENCH_SEQS; s += BENCH_CHUNK) {
            ms = bench_prefill(ops, b, cfg.vocab_size, s, BENCH_CHUNK,
                               BENCH_PROMPT, pinned);
            if (ms < 0) {
                goto next;
            }
            chunk_ms[m] += ms;
            n_chunks++;
        }
        chunk_ms[m] /= n_chunks;
        for (s = 0; s < BENCH_SEQS; s++) {
            len[s] = BENCH_PROMPT;
        }

        for (k = 0; k < BENCH_ROWS; k++) {
            rows[k].batch = batches[k];
            rows[k].pageable = k == BENCH_ROWS - 1;
            if (bench_decode(ops, b, cfg.vocab_size, batches[k], len,
                             rows[k].pageable ? pageable : pinned,
                             &rows[k].ms[m], &rows[k].lo[m], &rows[k].hi[m])
                != 0)
            {
                goto next;
            }
            printf("bench: %s: batch %u%s: median %.2f ms, range %.2f-%.2f"
                   "\n", modes[m], batches[k],
                   rows[k].pageable ? " (pageable logits)" : "",
                   rows[k].ms[m], rows[k].lo[m], rows[k].hi[m]);
        }

    next:
        msv_kvd_destroy(ops, b);
    }

    printf("\nqwen3-8b preset, dummy bf16 weights; wall time of forward "
           "including logits to host\n(pinned unless noted), median of %d "
           "steps after %d warm-up, context %u-%u tokens\n", BENCH_STEPS,
           BENCH_WARM, BENCH_PROMPT,
           BENCH_PROMPT + BENCH_ROWS * (BENCH_WARM + BENCH_STEPS));
    printf("prefill %d x %d tokens:  split %7.1f ms   bf16 act %7.1f ms\n",
           BENCH_CHUNK, BENCH_PROMPT, chunk_ms[0], chunk_ms[1]);
    printf("prefill 1 x %d tokens:  split %7.1f ms   bf16 act %7.1f ms\n",
           BENCH_LONG, long_ms[0], long_ms[1]);
    printf("%16s | %14s | %11s | %11s | %10s\n", "decode batch",
           "split hi+lo ms", "bf16 act ms", "split tok/s", "bf16 tok/s");
    for (k = 0; k < BENCH_ROWS; k++) {
        printf("%5u%-11s | %14.2f | %11.2f | %11.0f | %10.0f\n",
               rows[k].batch, rows[k].pageable ? " pageable" : "",
               rows[k].ms[0], rows[k].ms[1],
               rows[k].ms[0] > 0 ? rows[k].batch * 1e3 / rows[k].ms[0] : 0.0,
               rows[k].ms[1] > 0 ? rows[k].batch * 1e3 / rows[k].ms[1] : 0.0);
    }

    msv_cuda_host_free(pinned);
    free(pageable);
    msv_weights_free(&w);
}


/* ---- main ---------------------------------------------------------------- */

int
main(int argc, char **argv)
{
    struct msv_model_config  cfg;
    struct msv_weights       w;
    struct chk_bf16w         wb;
    const char              *fixtures = "t/fixtures";
    char                     err[512];
    long                     ncpu;
    int                      opt, timing = 1, big = 1, i, n_ok;
    int                      only_kernels = 0;
    uint64_t                 seed;
    char                    *end;

    seed = (uint64_t) time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t) getpid();

    while ((opt = getopt(argc, argv, "f:knqs:")) != -1) {
        switch (opt) {
        case 'f':
            fixtures = optarg;
            break;
        case 'n':
            timing = 0;
            break;
        case 'k':
            only_kernels = 1;
            break;
        case 'q':
            big = 0;
            break;
        case 's':
            errno = 0;
            seed = strtoull(optarg, &end, 0);
            if (errno != 0 || *end != '\0' || end == optarg) {
                fprintf(stderr, "check_backend: -s %s: not a number\n",
                        optarg);
                return 2;
            }
            break;
        default:
            fprintf(stderr, "usage: %s [-f fixtures_dir] [-k] [-n] [-q] "
                    "[-s seed]\n", argv[0]);
            return 2;
        }
    }

    printf("check_backend: seed %llu (-s %llu repeats this run)\n",
           (unsigned long long) seed, (unsigned long long) seed);
    chk_rng = seed != 0 ? seed : 1;

    if (msv_backend_cuda() == NULL || msv_cuda_device_count() == 0) {
        fprintf(stderr, "check_backend: no CUDA device (built with CUDA: "
                "%s)\n", msv_backend_cuda() != NULL ? "yes" : "no");
        return 2;
    }

    ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    chk_threads = ncpu < 1 ? 1 : ncpu > 16 ? 16 : (int) ncpu;

    check_rmsnorm();
    check_qkv_rope();
    check_attention();
    check_gemv();

    if (only_kernels) {
        timing = 0;
        big = 0;
        goto report;
    }

    if (msv_config_preset("tiny", &cfg, err, sizeof(err)) != 0
        || msv_weights_dummy(&cfg, 1, &w, err, sizeof(err)) != 0)
    {
        chk_fail("tiny preset: %s", err);
    } else {
        check_api(&cfg, &w);
        check_model_modes("tiny", &cfg, &w);
        chk_bf16_weights(&w, &wb);
        check_model_modes("tiny-bf16", &cfg, &wb.w);
        chk_bf16_free(&wb);
        msv_weights_free(&w);
    }

    check_fixtures(fixtures);

    if (big) {
        if (msv_config_preset("qwen3-0.6b", &cfg, err, sizeof(err)) != 0
            || msv_weights_dummy(&cfg, 3, &w, err, sizeof(err)) != 0)
        {
            chk_fail("qwen3-0.6b preset: %s", err);
        } else {
            check_model_modes("qwen3-0.6b", &cfg, &w);
            msv_weights_free(&w);
        }
    }

report:
    n_ok = 0;
    for (i = 0; i < chk_n_results; i++) {
        n_ok += chk_results[i].ok;
    }
    printf("\n%-64s %10s %8s\n", "case", "max rel", "tol");
    for (i = 0; i < chk_n_results; i++) {
        if (strncmp(chk_results[i].name, "kernel ", 7) == 0
            && chk_results[i].ok)
        {
            continue;
        }
        printf("%-64s %10.2e %8.0e %s\n", chk_results[i].name,
               chk_results[i].err, chk_results[i].tol,
               chk_results[i].ok ? "ok" : "FAIL");
    }
    printf("%d of %d comparisons within tolerance (passing kernel rows "
           "above), %d failures\n\n", n_ok, chk_n_results, chk_failed);

    if (timing) {
        bench();
    }

    printf("\ncheck_backend: %s (%d failures)\n",
           chk_failed ? "FAILED" : "passed", chk_failed);
    return chk_failed ? 1 : 0;
}
