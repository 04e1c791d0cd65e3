/*
 * kernel_twins.h: each CUDA kernel against a double-precision CPU twin,
 * on fresh random inputs with odd sizes (part of test_backend; the
 * kernels run on host arrays through kernels/kernel_check.h, test code
 * linked only into the test, not part of libmsv_worker.a):
 *
 *   - RMSNorm: 1 to 8192 columns, each activation format, with and
 *     without row gather;
 *   - bias + q/k norm + RoPE + KV store, fp32 and bf16 KV: every slot
 *     outside the batch must keep its poison;
 *   - paged attention, fp32 and bf16 KV, GQA ratios 1 to 7, a peaked
 *     case and one with every key equal: the serial and the split + merge
 *     forms must give identical bytes;
 *   - the tiled prefill attention (bf16 KV): batches of runs of 1 to 700
 *     query tokens, from position 0 and continuing earlier positions
 *     (tiles across page boundaries), head_dim 16 to 128, GQA ratios 1,
 *     2, 4, 5 and 6, peaked cases, every token in a tile: against the twin,
 *     against the per-token kernels on the same batch, and its serial and
 *     split + merge forms bit for bit;
 *   - the bf16 GEMV of small batches, with and without accumulate, and
 *     the bf16-output product (the gate/up product of wide bf16
 *     batches);
 *   - SiLU·up from fp32 and bf16 gate/up products, each output format;
 *   - batch-invariant products (the pinned cuBLASLt algorithm): one row's
 *     output the same bits at every position in products of 1 to 256
 *     rows, bf16 and fp32 weights, odd shapes.
 *
 * Tolerance 1e-5 (4e-3 for bf16 output and the bf16 KV store).
 * Header-only, after backend_check.h; needs a build with CUDA.
 */

#ifndef MSV_KERNEL_TWINS_H
#define MSV_KERNEL_TWINS_H

#ifdef MSV_HAVE_CUDA

#include "backend.h"
#include "kernel_check.h"
#include "backend_check.h"


/* ---- kernel twins ------------------------------------------------------- */

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


/* ---- random batches over a paged cache ---------------------------------- */

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

/* ---- the kernels -------------------------------------------------------- */

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
            fprintf(stderr, "test_backend: out of memory\n");
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
             * of the rounded reference, where the fp32 and the double
             * results round to neighbours; a step is 2^-7 of a value at
             * the bottom of its binade (2^-8 at the top: 4e-3 failed a
             * run at 5.85e-3, one step of such a value) */
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
            chk_record(e2, kb ? 0x1p-7 : CHK_TOL_KERNEL, "kernel kv store "
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
    int                            kb, st;

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
                                   MSV_CHECK_ATTN_FOLD, 0,
                                   0, MSV_CHECK_TILED_OFF, 0, NULL, err,
                                   sizeof(err)) != 0
            || msv_cuda_run_attention(out2, q, stride, c->nh, c->nkv, c->hd,
                                      (float) (1.0 / sqrt(c->hd)), &m.kv,
                                      MSV_CHECK_ATTN_PARALLEL, 0,
                                      0, MSV_CHECK_TILED_OFF, 0, NULL, err,
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
            /* and whatever the decode kernel's stages: 2, 3, 4 pages a
             * warp, serial and split; the serial form with one block a
             * kv head walking every token (2 stages) and three (4) */
            for (st = 2; kb && st <= 4; st++) {
                if (msv_cuda_run_attention(out2, q, stride, c->nh, c->nkv,
                                           c->hd, (float) (1.0 / sqrt(c->hd)),
                                           &m.kv, st % 2 == 0
                                           ? MSV_CHECK_ATTN_FOLD
                                           : MSV_CHECK_ATTN_PARALLEL, st,
                                           st == 2 ? 1 : st == 4 ? 3 : 0,
                                           MSV_CHECK_TILED_OFF, 0, NULL, err,
                                           sizeof(err)) != 0)
                {
                    chk_fail("kernel attention: %s", err);
                } else if (memcmp(out, out2, nout * sizeof(float)) != 0) {
                    chk_fail("kernel attention nh=%u nkv=%u hd=%u kv-bf16: "
                             "%d stages differ", c->nh, c->nkv, c->hd, st);
                }
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


/* One batch of prefill runs: n_new[s] new tokens of sequence s, after
 * ctx[s] - n_new[s] positions already in the cache. */
struct tiled_case {
    uint32_t  nh, nkv, hd, n_seqs;
    uint32_t  n_new[6], ctx[6];
    float     qscale;    /* large: peaked softmax */
    uint32_t  min_run;   /* the plan's shortest tiled run */
};


/* The tiled prefill kernel against the twin and against the per-token
 * kernels on the same batch (each within CHK_TOL_KERNEL); its serial and
 * split + merge forms must give identical bytes. */
static void
check_attention_tiled(void)
{
    static const struct tiled_case  cases[] = {
        /* peaked cases only with up to 4 heads per kv head: with more,
         * the per-token kernel carries q as two bf16 terms (the tiled
         * one as three always) */
        /* qwen3-8b's heads: runs of 1 and 15 tokens stay per token */
        { 32, 8, 128, 5, { 1, 15, 64, 130, 700 }, { 1, 15, 101, 130, 783 },
          1.0f, 16 },
        { 32, 8, 128, 4, { 15, 64, 130, 300 }, { 40, 64, 200, 300 },
          6.0f, 16 },
        { 8, 8, 64, 5, { 1, 15, 64, 130, 700 }, { 20, 15, 64, 167, 700 },
          1.0f, 16 },
        { 10, 2, 128, 4, { 1, 64, 130, 700 }, { 1, 99, 130, 745 },
          1.0f, 16 },
        { 20, 4, 64, 5, { 15, 64, 130, 17, 250 }, { 15, 64, 161, 50, 250 },
          1.0f, 16 },
        { 16, 4, 64, 4, { 1, 15, 64, 130 }, { 9, 15, 80, 130 }, 6.0f, 16 },
        /* the small head sizes (the tiny preset's 16) */
        { 4, 2, 16, 3, { 1, 40, 100 }, { 5, 40, 130 }, 1.0f, 16 },
        { 6, 1, 32, 3, { 20, 16, 90 }, { 20, 33, 150 }, 1.0f, 16 },
        /* every token in a tile, runs of one token too */
        { 32, 8, 128, 4, { 1, 3, 15, 70 }, { 1, 30, 15, 86 }, 1.0f, 1 },
        { 5, 1, 64, 3, { 1, 2, 33 }, { 7, 2, 40 }, 1.0f, 1 },
    };
    const struct tiled_case        *c;
    struct chk_map                  m;
    char                            err[512];
    uint32_t                        k, s, stride, nt, nt2, want, tq;
    float                          *q, *out, *out2, *tok, *ref, *kc, *vc,
                                    scale;
    size_t                          nq, nout, cache, i;

    for (k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        c = &cases[k];
        chk_map_make(&m, c->n_seqs, c->ctx, c->n_new);
        scale = (float) (1.0 / sqrt(c->hd));

        /* the plan's tiles: 64 rows of (token, head), runs of min_run
         * tokens or more */
        tq = 64 / (c->nh / c->nkv);
        want = 0;
        for (s = 0; s < c->n_seqs; s++) {
            want += c->n_new[s] >= c->min_run
                    ? (c->n_new[s] + tq - 1) / tq : 0;
        }

        stride = (c->nh + 2 * c->nkv) * c->hd;
        nq = (size_t) m.kv.n_tokens * stride;
        nout = (size_t) m.kv.n_tokens * c->nh * c->hd;
        cache = (size_t) m.kv.n_pages * c->nkv * MSV_KV_BLOCK * c->hd;

        q = chk_alloc(nq * sizeof(float));
        out = chk_alloc(nout * sizeof(float));
        out2 = chk_alloc(nout * sizeof(float));
        tok = chk_alloc(nout * sizeof(float));
        ref = chk_alloc(nout * sizeof(float));
        kc = chk_alloc(cache * sizeof(float));
        vc = chk_alloc(cache * sizeof(float));

        chk_fill(q, nq, c->qscale);
        chk_fill(kc, cache, 1.0f);
        chk_fill(vc, cache, 1.0f);
        for (i = 0; i < cache; i++) {   /* what the bf16 cache holds */
            kc[i] = chk_round_bf16(kc[i]);
            vc[i] = chk_round_bf16(vc[i]);
        }
        chk_poison(out, nout);
        chk_poison(out2, nout);
        chk_poison(tok, nout);

        m.kv.k_cache = kc;
        m.kv.v_cache = vc;
        m.kv.kv_bf16 = 1;
        nt = 0;
        nt2 = 0;
        if (msv_cuda_run_attention(out, q, stride, c->nh, c->nkv, c->hd,
                                   scale, &m.kv, MSV_CHECK_ATTN_FOLD, 0,
                                   2, MSV_CHECK_TILED_ON, c->min_run, &nt, err,
                                   sizeof(err)) != 0
            || msv_cuda_run_attention(out2, q, stride, c->nh, c->nkv, c->hd,
                                      scale, &m.kv, MSV_CHECK_ATTN_PARALLEL,
                                      0, 0, MSV_CHECK_TILED_ON, c->min_run,
                                      &nt2, err, sizeof(err)) != 0
            || msv_cuda_run_attention(tok, q, stride, c->nh, c->nkv, c->hd,
                                      scale, &m.kv, MSV_CHECK_ATTN_FOLD, 0,
                                      0, MSV_CHECK_TILED_OFF, 0, NULL, err,
                                      sizeof(err)) != 0)
        {
            chk_fail("kernel attention tiled: %s", err);
        } else {
            /* the plan must have tiled, or nothing was tested */
            if (nt == 0 || nt != want || nt2 != want) {
                chk_fail("kernel attention tiled nh=%u nkv=%u hd=%u: plans "
                         "of %u and %u tiles, not %u", c->nh, c->nkv, c->hd,
                         nt, nt2, want);
            }
            if (memcmp(out, out2, nout * sizeof(float)) != 0) {
                chk_fail("kernel attention tiled nh=%u nkv=%u hd=%u: serial "
                         "and split forms differ", c->nh, c->nkv, c->hd);
            }
            twin_attention(ref, q, stride, c->nh, c->nkv, c->hd, scale,
                           &m.kv);
            chk_record(chk_rel_rows(out, ref, (size_t) m.kv.n_tokens * c->nh,
                                    c->hd),
                       CHK_TOL_KERNEL, "kernel attention tiled nh=%u nkv=%u "
                       "hd=%u T=%u tiles=%u%s%s", c->nh, c->nkv, c->hd,
                       m.kv.n_tokens, nt, c->qscale > 1.0f ? " peaked" : "",
                       c->min_run <= 1 ? " all" : "");
            chk_record(chk_rel_rows(out, tok, (size_t) m.kv.n_tokens * c->nh,
                                    c->hd),
                       CHK_TOL_KERNEL, "kernel attention tiled vs per-token "
                       "nh=%u nkv=%u hd=%u T=%u%s", c->nh, c->nkv, c->hd,
                       m.kv.n_tokens, c->qscale > 1.0f ? " peaked" : "");
        }

        free(q);
        free(out);
        free(out2);
        free(tok);
        free(ref);
        free(kc);
        free(vc);
        chk_map_free(&m);
    }
}


/* ref [n][rows] = (acc ? acc : 0) + x [n][cols] . w [rows][cols]^T in
 * double, bf16 w and x. */
static void
twin_product_bf16(float *ref, const uint16_t *w, const uint16_t *x,
    uint32_t rows, uint32_t cols, uint32_t n, const float *acc)
{
    double    sum;
    uint32_t  m, r, i;

    for (m = 0; m < n; m++) {
        for (r = 0; r < rows; r++) {
            sum = acc != NULL ? acc[(size_t) m * rows + r] : 0.0;
            for (i = 0; i < cols; i++) {
                sum += (double) chk_bf16_val(w[(size_t) r * cols + i])
                       * chk_bf16_val(x[(size_t) m * cols + i]);
            }
            ref[(size_t) m * rows + r] = (float) sum;
        }
    }
}


/* The GEMV with SiLU·up fused, w the gate/up matrix [rows][cols] (rows
 * even): bit for bit the plain GEMV's fp32 products gu [n][rows] through
 * silu_mul_forward (on the device), and within bf16 rounding of SiLU·up
 * on the double products ref [n][rows]. */
static void
check_gemv_silu(const uint16_t *w, const uint16_t *x, uint32_t rows,
    uint32_t cols, uint32_t n, const float *gu, const float *ref)
{
    char       err[512];
    uint16_t  *o16;
    float     *fused, *unfused, *twin;
    uint32_t   h = rows / 2, r, c;
    size_t     i, diff;
    double     g, u;

    o16 = chk_alloc((size_t) n * h * sizeof(uint16_t));
    fused = chk_alloc((size_t) n * h * sizeof(float));
    unfused = chk_alloc((size_t) n * h * sizeof(float));
    twin = chk_alloc((size_t) n * h * sizeof(float));
    for (r = 0; r < n; r++) {
        for (c = 0; c < h; c++) {
            g = ref[(size_t) r * rows + c];
            u = ref[(size_t) r * rows + h + c];
            twin[(size_t) r * h + c] = (float) (g / (1.0 + exp(-g)) * u);
        }
    }
    if (msv_cuda_run_gemv_silu(o16, w, x, rows, cols, n, err, sizeof(err))
        != 0)
    {
        chk_fail("kernel gemv+silu: %s", err);
    } else if (msv_cuda_run_silu_mul(unfused, MSV_CHECK_BF16, gu, 0, n, h,
                                     err, sizeof(err)) != 0)
    {
        chk_fail("kernel silu_mul: %s", err);
    } else {
        diff = 0;
        for (i = 0; i < (size_t) n * h; i++) {
            fused[i] = chk_bf16_val(o16[i]);
            diff += memcmp(&fused[i], &unfused[i], sizeof(float)) != 0;
        }
        tap_ok(diff == 0, "kernel gemv+silu %ux%u n=%u: the GEMV then "
               "silu_mul, bit for bit (%zu of %zu differ)", rows, cols, n,
               diff, (size_t) n * h);
        if (diff != 0) {
            chk_failed++;
        }
        chk_record(chk_rel_rows(fused, twin, n, h), 4e-3,
                   "kernel gemv+silu %ux%u n=%u", rows, cols, n);
    }
    free(o16);
    free(fused);
    free(unfused);
    free(twin);
}


/* The small-batch GEMV path (n <= 8), with and without accumulate, with
 * SiLU·up fused (even rows, no accumulate), and the bf16-output product
 * (the gate/up product of bf16 batches the GEMV does not take; every case
 * without accumulate) against a double-precision product. */
static void
check_gemv(void)
{
    static const uint32_t  cases[][4] = {   /* rows, cols, n, accumulate */
        { 37, 8, 1, 0 }, { 4096, 4096, 1, 1 }, { 1000, 12288, 3, 0 },
        { 6144, 4096, 8, 1 }, { 33, 2056, 5, 0 }, { 151, 1024, 2, 1 },
        { 1, 64, 7, 0 }, { 4099, 4104, 4, 1 }, { 257, 136, 6, 0 },
        { 2048, 4096, 1, 0 }, { 130, 1032, 2, 0 }, { 98, 2056, 5, 0 },
        { 6, 136, 8, 0 }, { 37, 8, 9, 0 }, { 2048, 4096, 64, 0 },
        { 1000, 1024, 17, 0 }, { 96, 2056, 256, 0 },
    };
    char       err[512];
    uint16_t  *w, *x, *o16;
    float     *out, *ref;
    uint32_t   k, rows, cols, n;
    size_t     i, nw;

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
        for (i = 0; i < (size_t) n * cols; i++) {
            x[i] = chk_to_bf16((float) (chk_uniform() * 4.0 - 2.0));
        }
        chk_fill(out, (size_t) n * rows, 1.0f);
        twin_product_bf16(ref, w, x, rows, cols, n,
                          cases[k][3] ? out : NULL);
        if (n > 8) {
            /* the bf16 product only */
        } else if (msv_cuda_run_gemv(out, w, x, rows, cols, n,
                                     (int) cases[k][3], err,
                                     sizeof(err)) != 0)
        {
            chk_fail("kernel gemv: %s", err);
        } else {
            chk_record(chk_rel_rows(out, ref, n, rows), CHK_TOL_KERNEL,
                       "kernel gemv %ux%u n=%u%s", rows, cols, n,
                       cases[k][3] ? " accumulate" : "");
            if (!cases[k][3] && rows % 2 == 0) {
                check_gemv_silu(w, x, rows, cols, n, out, ref);
            }
        }
        if (!cases[k][3]) {
            o16 = chk_alloc((size_t) n * rows * sizeof(uint16_t));
            if (msv_cuda_run_linear_bf16(o16, w, x, rows, cols, n, err,
                                         sizeof(err)) != 0)
            {
                chk_fail("kernel linear bf16: %s", err);
            } else {
                for (i = 0; i < (size_t) n * rows; i++) {
                    out[i] = chk_bf16_val(o16[i]);
                }
                chk_record(chk_rel_rows(out, ref, n, rows), 4e-3,
                           "kernel linear bf16 out %ux%u n=%u", rows, cols,
                           n);
            }
            free(o16);
        }
        free(w);
        free(x);
        free(out);
        free(ref);
    }
}


/* SiLU·up against its double twin: fp32 and bf16 gate/up products, each
 * activation format, odd widths (the scalar kernel) and widths of 4k. */
static void
check_silu_mul(void)
{
    static const uint32_t  shapes[][2] = {
        { 1, 1 }, { 3, 77 }, { 5, 1000 }, { 2, 12288 }, { 9, 4100 }
    };
    static const char     *fmt_name[] = { "f32", "bf16", "bf16x2" };
    static const double    fmt_tol[] = { CHK_TOL_KERNEL, 4e-3,
                                         CHK_TOL_KERNEL };
    char                   err[512];
    float                 *gu, *out, *ref;
    double                 g, u;
    uint32_t               s, nr, n, r, c;
    size_t                 i;
    int                    fmt, in16;

    for (s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        for (in16 = 0; in16 < 2; in16++) {
            for (fmt = 0; fmt < 3; fmt++) {
                nr = shapes[s][0];
                n = shapes[s][1];
                gu = chk_alloc((size_t) nr * 2 * n * sizeof(float));
                out = chk_alloc((size_t) nr * n * sizeof(float));
                ref = chk_alloc((size_t) nr * n * sizeof(float));
                chk_fill(gu, (size_t) nr * 2 * n, 6.0f);
                for (i = 0; in16 && i < (size_t) nr * 2 * n; i++) {
                    gu[i] = chk_bf16_val(chk_to_bf16(gu[i]));
                }
                chk_poison(out, (size_t) nr * n);
                for (r = 0; r < nr; r++) {
                    for (c = 0; c < n; c++) {
                        g = gu[(size_t) r * 2 * n + c];
                        u = gu[(size_t) r * 2 * n + n + c];
                        ref[(size_t) r * n + c] =
                            (float) (g / (1.0 + exp(-g)) * u);
                    }
                }
                if (msv_cuda_run_silu_mul(out, fmt, gu, in16, nr, n, err,
                                          sizeof(err)) != 0)
                {
                    chk_fail("kernel silu_mul %ux%u: %s", nr, n, err);
                } else {
                    chk_record(chk_rel_rows(out, ref, nr, n), fmt_tol[fmt],
                               "kernel silu_mul %ux%u %s from %s", nr, n,
                               fmt_name[fmt], in16 ? "bf16" : "f32");
                }
                free(gu);
                free(out);
                free(ref);
            }
        }
    }
}


/* One value of a random matrix, stored as fmt (bf16 bits or fp32) at
 * element i of dst; the value stored, as a float, in val[i]. */
static void
chk_put_val(void *dst, float *val, size_t i, int fmt, float v)
{
    uint16_t  h;

    if (fmt == MSV_CHECK_BF16) {
        h = chk_to_bf16(v);
        ((uint16_t *) dst)[i] = h;
        val[i] = chk_bf16_val(h);
    } else {
        ((float *) dst)[i] = v;
        val[i] = v;
    }
}


/*
 * Batch-invariant products (linear_forward through the cuBLASLt algorithm
 * pinned for the shape, and for 1 to 8 rows of bf16 through the
 * fixed-order GEMV, which must have found a candidate with its bits): one
 * activation row, the probe, at a different position inside products of
 * 1, 3, 8, 9, 64, 100 and 256 rows whose other rows are random.  The
 * probe's output row must be the same bits in every product (with
 * accumulate, over the same old values), and every row of every product
 * within CHK_TOL_KERNEL of a double-precision product (scaled by cols /
 * 4096 past 4096 columns).
 */
static void
check_linear_invariant(void)
{
    static const uint32_t  sizes[] = { 1, 3, 8, 9, 64, 100, 256 };
    static const uint32_t  probe_at[] = { 0, 2, 5, 8, 37, 99, 200 };
    static const uint32_t  cases[][4] = {   /* rows, cols, fmt, accumulate */
        { 96, 64, MSV_CHECK_BF16, 0 }, { 200, 136, MSV_CHECK_BF16, 1 },
        { 151, 1000, MSV_CHECK_BF16, 0 }, { 64, 4096, MSV_CHECK_BF16, 1 },
        { 1000, 4096, MSV_CHECK_BF16, 1 }, { 520, 12288, MSV_CHECK_BF16, 0 },
        { 96, 64, MSV_CHECK_F32, 0 }, { 200, 136, MSV_CHECK_F32, 1 },
    };
    enum { RUNS = sizeof(sizes) / sizeof(sizes[0]) };
    char        err[512], line[1024];
    void       *w, *x;
    float      *wv, *xv, *pv, *old, *out, *ref;
    double      sum;
    uint32_t    c, k, m, r, i, rows, cols, total, row0, first, bad_n;
    size_t      esz;
    int         fmt, acc, bad, fixed;

    total = 0;
    for (k = 0; k < RUNS; k++) {
        total += sizes[k];
    }
    for (c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        rows = cases[c][0];
        cols = cases[c][1];
        fmt = (int) cases[c][2];
        acc = (int) cases[c][3];
        esz = fmt == MSV_CHECK_BF16 ? 2 : 4;
        w = chk_alloc((size_t) rows * cols * esz);
        wv = chk_alloc((size_t) rows * cols * sizeof(float));
        x = chk_alloc((size_t) total * cols * esz);
        xv = chk_alloc((size_t) total * cols * sizeof(float));
        pv = chk_alloc((size_t) cols * sizeof(float));
        old = chk_alloc((size_t) rows * sizeof(float));
        out = chk_alloc((size_t) total * rows * sizeof(float));
        ref = chk_alloc((size_t) total * rows * sizeof(float));

        for (i = 0; i < rows * cols; i++) {
            chk_put_val(w, wv, i, fmt, chk_uniform() / sqrtf((float) cols));
        }
        chk_fill(pv, cols, 2.0f);
        chk_fill(old, rows, 1.0f);
        chk_fill(out, (size_t) total * rows, 1.0f);
        row0 = 0;
        for (k = 0; k < RUNS; k++) {
            for (m = 0; m < sizes[k]; m++) {
                for (i = 0; i < cols; i++) {
                    chk_put_val(x, xv, (size_t) (row0 + m) * cols + i, fmt,
                                m == probe_at[k] ? pv[i]
                                                 : 2.0f * chk_uniform());
                }
            }
            /* the probe's old output values: the same in every product */
            memcpy(out + (size_t) (row0 + probe_at[k]) * rows, old,
                   rows * sizeof(float));
            row0 += sizes[k];
        }
        for (m = 0; m < total; m++) {
            for (r = 0; r < rows; r++) {
                sum = acc ? out[(size_t) m * rows + r] : 0.0;
                for (i = 0; i < cols; i++) {
                    sum += (double) wv[(size_t) r * cols + i]
                           * xv[(size_t) m * cols + i];
                }
                ref[(size_t) m * rows + r] = (float) sum;
            }
        }

        if (msv_cuda_run_linear_inv(out, w, x, fmt, rows, cols, sizes, RUNS,
                                    acc, 0, &fixed, line, sizeof(line), err,
                                    sizeof(err)) != 0)
        {
            chk_fail("kernel linear invariant %ux%u: %s", rows, cols, err);
        } else {
            tap_diag("%s", line);
            /* bf16 products of 1 to 8 rows (1, 3, 8 here) take the
             * fixed-order GEMV, with the pinned algorithm's bits */
            tap_ok(fmt == MSV_CHECK_F32 || fixed, "kernel linear invariant "
                   "%ux%u %s: %s", rows, cols,
                   fmt == MSV_CHECK_BF16 ? "bf16" : "f32",
                   fmt == MSV_CHECK_F32 ? "fp32: no fixed-order GEMV"
                   : fixed ? "n <= 8 by the fixed-order GEMV"
                   : "the fixed-order GEMV has no candidate's bits");
            /* the probe of the n = 1 product against every other */
            first = probe_at[0];
            bad = 0;
            bad_n = 0;
            row0 = 0;
            for (k = 0; k < RUNS; k++) {
                if (!bad && memcmp(out + (size_t) (row0 + probe_at[k]) * rows,
                                   out + (size_t) first * rows,
                                   rows * sizeof(float)) != 0)
                {
                    bad = 1;
                    bad_n = sizes[k];
                }
                row0 += sizes[k];
            }
            if (bad) {
                chk_fail("kernel linear invariant %ux%u %s: the probe row "
                         "at n=%u differs from n=1", rows, cols,
                         fmt == MSV_CHECK_BF16 ? "bf16" : "f32", bad_n);
            } else {
                tap_ok(1, "kernel linear invariant %ux%u %s%s: the probe "
                       "row the same bits at n = 1, 3, 8, 9, 64, 100, 256",
                       rows, cols, fmt == MSV_CHECK_BF16 ? "bf16" : "f32",
                       acc ? " accumulate" : "");
            }
            /* one fp32 sum over cols terms against double: its error
             * grows with cols (2.05e-5 measured at 12288), the tolerance
             * with it past 4096 */
            chk_record(chk_rel_rows(out, ref, total, rows),
                       CHK_TOL_KERNEL * (cols > 4096 ? cols / 4096.0 : 1.0),
                       "kernel linear invariant %ux%u %s%s", rows, cols,
                       fmt == MSV_CHECK_BF16 ? "bf16" : "f32",
                       acc ? " accumulate" : "");
        }
        free(w);
        free(wv);
        free(x);
        free(xv);
        free(pv);
        free(old);
        free(out);
        free(ref);
    }
}


/*
 * The batch-invariant SiLU·up, as the backend runs the MLP in that mode:
 * a gate/up weight [2 I][cols] (bf16), one probe activation row at a
 * different position in products of 1, 3 and 8 rows (the fixed-order
 * GEMV) and 9 and 64 (the pinned product), each then silu_mul_forward.
 * The probe's bf16 outputs must be the same bits in every product, and
 * every output within 4e-3 (bf16 rounding) of silu(gate) * up from
 * double-precision products.
 */
static void
check_linear_invariant_silu(void)
{
    static const uint32_t  sizes[] = { 1, 3, 8, 9, 64 };
    static const uint32_t  probe_at[] = { 0, 2, 5, 8, 37 };
    static const uint32_t  cases[][2] = {       /* rows (2 I), cols */
        { 200, 136 }, { 2048, 1000 }, { 1024, 4096 },
    };
    enum { RUNS = sizeof(sizes) / sizeof(sizes[0]) };
    char        err[512], line[1024];
    uint16_t   *w, *x;
    float      *wv, *xv, *pv, *out, *ref;
    double      g, u;
    uint32_t    c, k, m, j, i, rows, cols, half, total, row0, first, bad_n;
    int         bad, fixed;

    total = 0;
    for (k = 0; k < RUNS; k++) {
        total += sizes[k];
    }
    for (c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        rows = cases[c][0];
        cols = cases[c][1];
        half = rows / 2;
        w = chk_alloc((size_t) rows * cols * 2);
        wv = chk_alloc((size_t) rows * cols * sizeof(float));
        x = chk_alloc((size_t) total * cols * 2);
        xv = chk_alloc((size_t) total * cols * sizeof(float));
        pv = chk_alloc((size_t) cols * sizeof(float));
        out = chk_alloc((size_t) total * half * sizeof(float));
        ref = chk_alloc((size_t) total * half * sizeof(float));

        for (i = 0; i < rows * cols; i++) {
            chk_put_val(w, wv, i, MSV_CHECK_BF16,
                        chk_uniform() * 4.0f / sqrtf((float) cols));
        }
        chk_fill(pv, cols, 2.0f);
        row0 = 0;
        for (k = 0; k < RUNS; k++) {
            for (m = 0; m < sizes[k]; m++) {
                for (i = 0; i < cols; i++) {
                    chk_put_val(x, xv, (size_t) (row0 + m) * cols + i,
                                MSV_CHECK_BF16, m == probe_at[k] ? pv[i]
                                : 2.0f * chk_uniform());
                }
            }
            row0 += sizes[k];
        }
        for (m = 0; m < total; m++) {
            for (j = 0; j < half; j++) {
                g = 0.0;
                u = 0.0;
                for (i = 0; i < cols; i++) {
                    g += (double) wv[(size_t) j * cols + i]
                         * xv[(size_t) m * cols + i];
                    u += (double) wv[(size_t) (half + j) * cols + i]
                         * xv[(size_t) m * cols + i];
                }
                ref[(size_t) m * half + j] = (float) (g / (1.0 + exp(-g))
                                                      * u);
            }
        }

        if (msv_cuda_run_linear_inv(out, w, x, MSV_CHECK_BF16, rows, cols,
                                    sizes, RUNS, 0, 1, &fixed, line,
                                    sizeof(line), err, sizeof(err)) != 0)
        {
            chk_fail("kernel SiLU·up invariant %ux%u: %s", rows, cols, err);
        } else {
            tap_ok(fixed, "kernel SiLU·up invariant %ux%u: n <= 8 by the "
                   "fixed-order GEMV with SiLU·up%s", rows, cols,
                   fixed ? "" : " (no candidate has its bits)");
            first = probe_at[0];
            bad = 0;
            bad_n = 0;
            row0 = 0;
            for (k = 0; k < RUNS; k++) {
                if (!bad && memcmp(out + (size_t) (row0 + probe_at[k]) * half,
                                   out + (size_t) first * half,
                                   half * sizeof(float)) != 0)
                {
                    bad = 1;
                    bad_n = sizes[k];
                }
                row0 += sizes[k];
            }
            if (bad) {
                chk_fail("kernel SiLU·up invariant %ux%u: the probe row at "
                         "n=%u differs from n=1", rows, cols, bad_n);
            } else {
                tap_ok(1, "kernel SiLU·up invariant %ux%u: the probe row "
                       "the same bits at n = 1, 3, 8, 9, 64", rows, cols);
            }
            chk_record(chk_rel_rows(out, ref, total, half), 4e-3,
                       "kernel SiLU·up invariant %ux%u", rows, cols);
        }
        free(w);
        free(wv);
        free(x);
        free(xv);
        free(pv);
        free(out);
        free(ref);
    }
}


/* Every kernel check, in this order (the random inputs follow the seed). */
static void
check_kernels(void)
{
    check_rmsnorm();
    check_qkv_rope();
    check_attention();
    check_attention_tiled();
    check_gemv();
    check_silu_mul();
    check_linear_invariant();
    check_linear_invariant_silu();
}

#endif /* MSV_HAVE_CUDA */

#endif /* MSV_KERNEL_TWINS_H */
