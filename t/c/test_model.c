/*
 * test_model.c: the CPU backend against reference logits computed by
 * Hugging Face transformers (t/fixtures/<name>/: config.json,
 * model.safetensors, ref.json, ref.bin; made by tools/make_fixtures.py),
 * and its own consistency on dummy weights: determinism, prefill versus
 * decode versus mixed batches, KV page accounting, batch validation.
 *
 * For each fixture: (a) prefill each prompt with all logits, (b) decode
 * the rest of the sequence one token at a time, (c) all sequences in
 * shared batches mixing prefill chunks and decode steps.  Every row must
 * satisfy max|ours - ref| / max|ref| <= 1e-4.  A missing fixture fails.
 */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_tree.h>

#include "tap.h"
#include "backend.h"
#include "kv_direct.h"
#include "model.h"


#define TOL           1e-4
#define TOL_BF16_ACT  5e-2     /* CUDA bf16 activations and KV: sanity */

static const char  *fixtures[] = {
    "qwen3-tiny", "qwen3-tiny-bf16", "llama-tiny", "qwen2-tiny"
};

static char  err[1024];

struct fixture {
    uint32_t    vocab;
    uint32_t    n;           /* sequences */
    int32_t   **tok;         /* [n][len] */
    uint32_t   *len;
    uint32_t   *plen;        /* prompt lengths */
    float     **ref;         /* [n][len][vocab] */
    float      *bin;
};

/* a mixed-batch schedule step for one sequence */
struct seq_state {
    uint32_t  done;          /* tokens already in the KV */
    uint32_t  start;         /* step it joins at */
};


/* ---------------------------------------------------------------- */
/* helpers                                                            */

static double
row_err(const float *a, const float *b, size_t n)
{
    double  d, m, bm;

    m = 0;
    bm = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) {
            return INFINITY;
        }
        d = fabs((double) a[i] - b[i]);
        m = d > m ? d : m;
        bm = fabs(b[i]) > bm ? fabs(b[i]) : bm;
    }

    return bm > 0 ? m / bm : m;
}


static int
run(const struct msv_backend_ops *ops, struct msv_backend *b, uint32_t n,
    const uint32_t *seq, const uint32_t *n_new, const uint32_t *pos0,
    const int32_t *tokens, int all, float *logits)
{
    struct msv_batch  bt;

    bt.n_seqs = n;
    bt.seq = seq;
    bt.n_new = n_new;
    bt.pos0 = pos0;
    bt.tokens = tokens;
    bt.all_logits = all;

    err[0] = '\0';
    return msv_kvd_forward(ops, b, &bt, logits, err, sizeof(err));
}


static void *
read_all(const char *path, size_t *n)
{
    FILE  *f;
    char  *buf;
    long   sz;

    f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (sz = ftell(f)) < 0
        || fseek(f, 0, SEEK_SET) != 0)
    {
        fclose(f);
        return NULL;
    }
    buf = malloc((size_t) sz + 1);
    if (buf == NULL || fread(buf, 1, (size_t) sz, f) != (size_t) sz) {
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[sz] = '\0';
    *n = (size_t) sz;
    return buf;
}


static yajl_val
obj_get(yajl_val o, const char *key)
{
    for (size_t i = 0; YAJL_IS_OBJECT(o) && i < o->u.object.len; i++) {
        if (strcmp(o->u.object.keys[i], key) == 0) {
            return o->u.object.values[i];
        }
    }
    return NULL;
}


static void
fixture_free(struct fixture *fx)
{
    for (uint32_t i = 0; fx->tok != NULL && i < fx->n; i++) {
        free(fx->tok[i]);
    }
    free(fx->tok);
    free(fx->len);
    free(fx->plen);
    free(fx->ref);
    free(fx->bin);
    memset(fx, 0, sizeof(*fx));
}


static int
fixture_load(const char *dir, struct fixture *fx)
{
    char      path[600], ebuf[256], *text;
    size_t    n, need;
    yajl_val  root, seqs, plens, v;
    float    *p;

    memset(fx, 0, sizeof(*fx));

    snprintf(path, sizeof(path), "%s/ref.json", dir);
    text = read_all(path, &n);
    if (text == NULL) {
        snprintf(err, sizeof(err), "%s: cannot read", path);
        return -1;
    }
    root = yajl_tree_parse(text, ebuf, sizeof(ebuf));
    free(text);
    if (root == NULL) {
        snprintf(err, sizeof(err), "%s: invalid JSON", path);
        return -1;
    }

    v = obj_get(root, "vocab");
    seqs = obj_get(root, "sequences");
    plens = obj_get(root, "prompt_lens");
    if (!YAJL_IS_INTEGER(v) || !YAJL_IS_ARRAY(seqs) || !YAJL_IS_ARRAY(plens)
        || seqs->u.array.len == 0
        || plens->u.array.len != seqs->u.array.len)
    {
        snprintf(err, sizeof(err), "%s: needs vocab, sequences, prompt_lens",
                 path);
        yajl_tree_free(root);
        return -1;
    }

    fx->vocab = (uint32_t) v->u.number.i;
    fx->n = (uint32_t) seqs->u.array.len;
    fx->tok = calloc(fx->n, sizeof(int32_t *));
    fx->len = calloc(fx->n, sizeof(uint32_t));
    fx->plen = calloc(fx->n, sizeof(uint32_t));
    fx->ref = calloc(fx->n, sizeof(float *));
    if (fx->tok == NULL || fx->len == NULL || fx->plen == NULL
        || fx->ref == NULL)
    {
        goto bad;
    }

    need = 0;
    for (uint32_t i = 0; i < fx->n; i++) {
        yajl_val  s = seqs->u.array.values[i];
        yajl_val  pl = plens->u.array.values[i];

        if (!YAJL_IS_ARRAY(s) || s->u.array.len == 0 || !YAJL_IS_INTEGER(pl)
            || pl->u.number.i < 1
            || (size_t) pl->u.number.i > s->u.array.len)
        {
            goto bad;
        }
        fx->len[i] = (uint32_t) s->u.array.len;
        fx->plen[i] = (uint32_t) pl->u.number.i;
        fx->tok[i] = malloc(fx->len[i] * sizeof(int32_t));
        if (fx->tok[i] == NULL) {
            goto bad;
        }
        for (uint32_t j = 0; j < fx->len[i]; j++) {
            if (!YAJL_IS_INTEGER(s->u.array.values[j])) {
                goto bad;
            }
            fx->tok[i][j] = (int32_t) s->u.array.values[j]->u.number.i;
        }
        need += (size_t) fx->len[i] * fx->vocab * sizeof(float);
    }
    yajl_tree_free(root);
    root = NULL;

    snprintf(path, sizeof(path), "%s/ref.bin", dir);
    fx->bin = read_all(path, &n);
    if (fx->bin == NULL || n != need) {
        snprintf(err, sizeof(err), "%s: %zu bytes, expected %zu", path,
                 fx->bin ? n : 0, need);
        fixture_free(fx);
        return -1;
    }

    p = fx->bin;
    for (uint32_t i = 0; i < fx->n; i++) {
        fx->ref[i] = p;
        p += (size_t) fx->len[i] * fx->vocab;
    }

    return 0;

bad:

    snprintf(err, sizeof(err), "%s: malformed", path);
    yajl_tree_free(root);
    fixture_free(fx);
    return -1;
}


/* ---------------------------------------------------------------- */
/* fixtures                                                           */

/* The fixture on one backend: ops, with MSV_CUDA_ACT = act for CUDA
 * (NULL for the CPU), within tol of the Hugging Face logits. */
static void
test_fixture(const char *base, const char *fname,
    const struct msv_backend_ops *ops, const char *act, double tol)
{
    int                            rc, all;
    char                           dir[512], path[600];
    float                         *lg;
    double                         e, wa, wb, wc;
    uint32_t                       i, k, t, n, maxlen, steps, step, rows;
    uint32_t                      *ids, *nn, *p0;
    int32_t                       *tk;
    struct fixture                 fx;
    struct msv_backend            *b;
    struct msv_weights             w;
    struct seq_state              *st;
    struct msv_model_config        cfg;
    char                           name[160];

    snprintf(name, sizeof(name), "%s%s%s %s", ops->name, act ? " " : "",
             act ? act : "", fname);
    snprintf(dir, sizeof(dir), "%s/%s", base, fname);
    snprintf(path, sizeof(path), "%s/config.json", dir);

    if (msv_config_load(path, &cfg, err, sizeof(err)) != 0) {
        tap_ok(0, "%s: config loads: %s", name, err);
        return;
    }

    if (msv_weights_load(dir, &w, err, sizeof(err)) != 0) {
        tap_ok(0, "%s: weights load: %s", name, err);
        return;
    }

    if (fixture_load(dir, &fx) != 0) {
        tap_ok(0, "%s: reference data: %s", name, err);
        msv_weights_free(&w);
        return;
    }

    tap_ok(fx.vocab == cfg.vocab_size, "%s: %s, %u sequences, vocab %u, "
           "weights %s", name, msv_arch_name(cfg.arch), fx.n, fx.vocab,
           msv_dtype_name(w.t[0].dtype));

    maxlen = 0;
    for (i = 0; i < fx.n; i++) {
        maxlen = fx.len[i] > maxlen ? fx.len[i] : maxlen;
    }

    if (act != NULL) {
        setenv("MSV_CUDA_ACT", act, 1);
    }
    b = msv_kvd_create(ops, &cfg, &w, fx.n + 3, maxlen + 5, 0, 2, err,
                       sizeof(err));
    unsetenv("MSV_CUDA_ACT");
    if (!tap_ok(b != NULL, "%s: backend created (%s)", name,
                b ? "ok" : err))
    {
        fixture_free(&fx);
        msv_weights_free(&w);
        return;
    }

    lg = malloc((size_t) (maxlen * fx.n + 1) * fx.vocab * sizeof(float));
    ids = calloc(fx.n, sizeof(uint32_t));
    nn = calloc(fx.n, sizeof(uint32_t));
    p0 = calloc(fx.n, sizeof(uint32_t));
    tk = malloc((size_t) (maxlen * fx.n + 1) * sizeof(int32_t));
    st = calloc(fx.n, sizeof(struct seq_state));
    if (lg == NULL || ids == NULL || nn == NULL || p0 == NULL || tk == NULL
        || st == NULL)
    {
        tap_ok(0, "%s: out of memory", name);
        goto done;
    }

    /* (a) prefill and (b) decode, one sequence at a time */

    wa = wb = 0;
    rc = 0;
    for (i = 0; i < fx.n && rc == 0; i++) {
        uint32_t  id = i + 1, zero = 0, one = 1, P = fx.plen[i];

        rc = msv_kvd_reserve(b, id, fx.len[i]);
        if (rc != 0) {
            snprintf(err, sizeof(err), "kv_reserve failed");
            break;
        }

        rc = run(ops, b, 1, &id, &P, &zero, fx.tok[i], 1, lg);
        for (t = 0; rc == 0 && t < P; t++) {
            e = row_err(lg + (size_t) t * fx.vocab,
                        fx.ref[i] + (size_t) t * fx.vocab, fx.vocab);
            wa = e > wa ? e : wa;
        }

        for (t = P; rc == 0 && t < fx.len[i]; t++) {
            rc = run(ops, b, 1, &id, &one, &t, fx.tok[i] + t, 0, lg);
            e = row_err(lg, fx.ref[i] + (size_t) t * fx.vocab, fx.vocab);
            wb = e > wb ? e : wb;
        }

        msv_kvd_release(b, id);
    }

    tap_ok(rc == 0 && wa <= tol, "%s: (a) prefill, all logits: max rel err "
           "%.2e%s%s", name, wa, rc ? ": " : "", rc ? err : "");
    tap_ok(rc == 0 && wb <= tol, "%s: (b) decode one token at a time: max "
           "rel err %.2e", name, wb);

    /* (c) one shared batch per step: sequence i joins at step i, prefills
     * its prompt in two chunks, then decodes; sequence ids reversed so
     * they differ from the batch order.  Once with every row's logits,
     * once with each sequence's last row only. */

    for (all = 1; all >= 0; all--) {
        wc = 0;
        rc = 0;
        steps = 0;

        for (i = 0; i < fx.n; i++) {
            st[i].done = 0;
            st[i].start = i;
            if (msv_kvd_reserve(b, fx.n + 1 - i, fx.len[i]) != 0) {
                rc = -1;
                snprintf(err, sizeof(err), "kv_reserve failed");
            }
        }

        for (step = 0; rc == 0; step++) {
            n = 0;
            t = 0;
            for (i = 0; i < fx.n; i++) {
                uint32_t  P = fx.plen[i], take;

                if (step < st[i].start || st[i].done == fx.len[i]) {
                    continue;
                }

                if (st[i].done < P) {
                    /* first chunk: half the prompt (at least 1) */
                    take = st[i].done == 0 ? (P + 1) / 2 : P - st[i].done;
                } else {
                    take = 1;
                }

                ids[n] = fx.n + 1 - i;
                nn[n] = take;
                p0[n] = st[i].done;
                memcpy(tk + t, fx.tok[i] + st[i].done,
                       take * sizeof(int32_t));
                t += take;
                n++;
            }

            if (n == 0) {
                break;
            }
            steps++;

            rc = run(ops, b, n, ids, nn, p0, tk, all, lg);
            if (rc != 0) {
                break;
            }

            /* compare: rows in batch order */
            rows = 0;
            for (k = 0; k < n; k++) {
                i = fx.n + 1 - ids[k];
                if (all) {
                    for (t = 0; t < nn[k]; t++) {
                        e = row_err(lg + (size_t) rows++ * fx.vocab,
                                    fx.ref[i] + (size_t) (p0[k] + t)
                                    * fx.vocab, fx.vocab);
                        wc = e > wc ? e : wc;
                    }
                } else {
                    e = row_err(lg + (size_t) rows++ * fx.vocab,
                                fx.ref[i] + (size_t) (p0[k] + nn[k] - 1)
                                * fx.vocab, fx.vocab);
                    wc = e > wc ? e : wc;
                }
                st[i].done += nn[k];
            }
        }

        for (i = 0; i < fx.n; i++) {
            msv_kvd_release(b, fx.n + 1 - i);
        }

        tap_ok(rc == 0 && wc <= tol, "%s: (c) mixed prefill/decode batches "
               "(%u steps, %s): max rel err %.2e%s%s", name, steps,
               all ? "all logits" : "last logits", wc, rc ? ": " : "",
               rc ? err : "");
    }

    tap_ok(msv_kvd_free(b) == (uint64_t) (fx.n + 3)
                              * ((maxlen + 5 + MSV_KV_BLOCK - 1)
                                 / MSV_KV_BLOCK) * MSV_KV_BLOCK,
           "%s: every KV page returned", name);

done:

    free(lg);
    free(ids);
    free(nn);
    free(p0);
    free(tk);
    free(st);
    msv_kvd_destroy(ops, b);
    fixture_free(&fx);
    msv_weights_free(&w);
}


/* ---------------------------------------------------------------- */
/* dummy weights: consistency                                         */

/* Logits of every position of toks, prefilled in chunks of "chunk"
 * tokens (0: all at once) on sequence id. */
static int
prefill_chunks(struct msv_backend *b, uint32_t id, const int32_t *toks,
    uint32_t n, uint32_t chunk, float *out, uint32_t V)
{
    uint32_t  pos, take;

    if (msv_kvd_reserve(b, id, n) != 0) {
        snprintf(err, sizeof(err), "kv_reserve(%u) failed", n);
        return -1;
    }

    for (pos = 0; pos < n; pos += take) {
        take = chunk == 0 || n - pos < chunk ? n - pos : chunk;
        if (run(&msv_backend_cpu, b, 1, &id, &take, &pos, toks + pos, 1,
                out + (size_t) pos * V) != 0)
        {
            return -1;
        }
    }

    return 0;
}


static void
test_consistency(const char *label, const struct msv_model_config *cfg,
    uint64_t seed)
{
    int                  rc;
    double               e1, e2, e3, sd, mean;
    float               *a, *c, *d, *m;
    int32_t              toks[3][100], all[300];
    uint32_t             V, i, j, n, id[3], nn[3], p0[3], r;
    struct msv_backend  *b;
    struct msv_weights   w;

    V = cfg->vocab_size;

    if (msv_weights_dummy(cfg, seed, &w, err, sizeof(err)) != 0) {
        tap_ok(0, "%s: dummy weights: %s", label, err);
        return;
    }

    b = msv_kvd_create(&msv_backend_cpu, cfg, &w, 8, 128, 0, 2, err,
                       sizeof(err));
    if (!tap_ok(b != NULL, "%s: backend created (%s)", label,
                b ? "ok" : err))
    {
        msv_weights_free(&w);
        return;
    }

    /* three sequences of 100, 37 and 16 tokens (page boundaries at 16) */
    n = 100;
    for (i = 0; i < 3; i++) {
        for (j = 0; j < n; j++) {
            toks[i][j] = (int32_t) ((j * 2654435761u + i * 977 + 13) % V);
        }
    }

    a = malloc((size_t) n * V * sizeof(float));
    c = malloc((size_t) n * V * sizeof(float));
    d = malloc((size_t) n * V * sizeof(float));
    m = malloc((size_t) 3 * n * V * sizeof(float));

    /* prefill at once, in chunks of 7, one token at a time */
    rc = prefill_chunks(b, 0, toks[0], n, 0, a, V);
    rc |= prefill_chunks(b, 1, toks[0], n, 7, c, V);
    rc |= prefill_chunks(b, 2, toks[0], n, 1, d, V);

    e1 = e2 = 0;
    sd = mean = 0;
    for (i = 0; rc == 0 && i < n; i++) {
        double  x = row_err(c + (size_t) i * V, a + (size_t) i * V, V);
        double  y = row_err(d + (size_t) i * V, a + (size_t) i * V, V);

        e1 = x > e1 ? x : e1;
        e2 = y > e2 ? y : e2;
    }
    for (i = 0; rc == 0 && i < V; i++) {
        mean += a[i];
        sd += (double) a[i] * a[i];
    }
    mean /= V;
    sd = sqrt(sd / V - mean * mean);

    tap_ok(rc == 0 && e1 <= 1e-5 && e2 <= 1e-5, "%s: prefill at once = "
           "chunks of 7 (%.1e) = token by token (%.1e)%s%s", label, e1, e2,
           rc ? ": " : "", rc ? err : "");
    tap_ok(rc == 0 && sd > 0.3 && sd < 10, "%s: logits finite, std %.2f",
           label, sd);

    for (i = 0; i < 3; i++) {
        msv_kvd_release(b, i);
    }

    /* the same three prefills again on reused pages: bit for bit */
    rc = prefill_chunks(b, 4, toks[0], n, 0, c, V);
    tap_ok(rc == 0 && memcmp(a, c, (size_t) n * V * sizeof(float)) == 0,
           "%s: rerun on reused KV pages is bit-identical", label);
    msv_kvd_release(b, 4);

    /* three sequences in one batch, then a decode step for all three */
    id[0] = 5; id[1] = 2; id[2] = 7;
    nn[0] = 37; nn[1] = 16; nn[2] = 50;
    p0[0] = p0[1] = p0[2] = 0;
    r = 0;
    for (i = 0; i < 3; i++) {
        memcpy(all + r, toks[i], nn[i] * sizeof(int32_t));
        r += nn[i];
        rc |= msv_kvd_reserve(b, id[i], nn[i] + 1);
    }
    rc |= run(&msv_backend_cpu, b, 3, id, nn, p0, all, 1, m);

    e3 = 0;
    r = 0;
    for (i = 0; rc == 0 && i < 3; i++) {
        /* each alone */
        if (prefill_chunks(b, 0, toks[i], nn[i] + 1, 0, d, V) != 0) {
            rc = -1;
            break;
        }
        msv_kvd_release(b, 0);
        for (j = 0; j < nn[i]; j++) {
            double  x = row_err(m + (size_t) (r + j) * V,
                                d + (size_t) j * V, V);
            e3 = x > e3 ? x : e3;
        }
        r += nn[i];
    }

    if (rc == 0) {
        uint32_t  one[3] = { 1, 1, 1 };

        for (i = 0; i < 3; i++) {
            p0[i] = nn[i];
            all[i] = toks[i][nn[i]];
        }
        rc = run(&msv_backend_cpu, b, 3, id, one, p0, all, 0, m);
        for (i = 0; rc == 0 && i < 3; i++) {
            if (prefill_chunks(b, 0, toks[i], nn[i] + 1, 0, d, V) != 0) {
                rc = -1;
                break;
            }
            msv_kvd_release(b, 0);
            double  x = row_err(m + (size_t) i * V, d + (size_t) nn[i] * V,
                                V);
            e3 = x > e3 ? x : e3;
        }
    }

    tap_ok(rc == 0 && e3 <= 1e-5, "%s: mixed batch = each alone (%.1e)%s%s",
           label, e3, rc ? ": " : "", rc ? err : "");

    for (i = 0; i < 3; i++) {
        msv_kvd_release(b, id[i]);
    }

    free(a);
    free(c);
    free(d);
    free(m);
    msv_kvd_destroy(&msv_backend_cpu, b);
    msv_weights_free(&w);
}


static void
test_tiny(void)
{
    int                      rc;
    float                   *l1, *l2, *l3;
    uint32_t                 id, n, pos, V;
    int32_t                  toks[40];
    struct msv_backend      *b1, *b2, *b3;
    struct msv_weights       w1, w2, w3;
    struct msv_model_config  cfg;

    if (!tap_ok(msv_config_preset("tiny", &cfg, err, sizeof(err)) == 0,
                "tiny preset"))
    {
        return;
    }
    V = cfg.vocab_size;

    /* same seed: same weights; 1 thread and 3 threads: same bits */
    rc = msv_weights_dummy(&cfg, 5, &w1, err, sizeof(err));
    rc |= msv_weights_dummy(&cfg, 5, &w2, err, sizeof(err));
    rc |= msv_weights_dummy(&cfg, 6, &w3, err, sizeof(err));
    if (!tap_ok(rc == 0, "dummy weights")) {
        return;
    }

    b1 = msv_kvd_create(&msv_backend_cpu, &cfg, &w1, 2, 64, 0, 1, err,
                        sizeof(err));
    b2 = msv_kvd_create(&msv_backend_cpu, &cfg, &w2, 2, 64, 0, 3, err,
                        sizeof(err));
    b3 = msv_kvd_create(&msv_backend_cpu, &cfg, &w3, 2, 64, 0, 0, err,
                        sizeof(err));
    if (!tap_ok(b1 && b2 && b3, "three backends created%s%s",
                b1 && b2 && b3 ? "" : ": ", b1 && b2 && b3 ? "" : err))
    {
        return;
    }

    for (n = 0; n < 40; n++) {
        toks[n] = (int32_t) ((n * 7919 + 3) % V);
    }
    n = 40;
    id = 1;
    pos = 0;
    l1 = malloc((size_t) n * V * sizeof(float));
    l2 = malloc((size_t) n * V * sizeof(float));
    l3 = malloc((size_t) n * V * sizeof(float));

    rc = msv_kvd_reserve(b1, id, n)
         | msv_kvd_reserve(b2, id, n)
         | msv_kvd_reserve(b3, id, n)
         | run(&msv_backend_cpu, b1, 1, &id, &n, &pos, toks, 1, l1)
         | run(&msv_backend_cpu, b2, 1, &id, &n, &pos, toks, 1, l2)
         | run(&msv_backend_cpu, b3, 1, &id, &n, &pos, toks, 1, l3);

    tap_ok(rc == 0 && memcmp(l1, l2, (size_t) n * V * sizeof(float)) == 0,
           "tiny: same seed, 1 vs 3 threads: identical logits");
    tap_ok(rc == 0 && row_err(l1, l3, V) > 1e-2,
           "tiny: another seed gives other logits");

    /* the same prefill again on the same sequence id overwrites its KV */
    rc = run(&msv_backend_cpu, b1, 1, &id, &n, &pos, toks, 1, l2);
    tap_ok(rc == 0 && memcmp(l1, l2, (size_t) n * V * sizeof(float)) == 0,
           "tiny: rerun identical");

    free(l1);
    free(l2);
    free(l3);
    msv_kvd_destroy(&msv_backend_cpu, b1);
    msv_kvd_destroy(&msv_backend_cpu, b2);
    msv_kvd_destroy(&msv_backend_cpu, b3);
    msv_weights_free(&w1);
    msv_weights_free(&w2);
    msv_weights_free(&w3);

    test_consistency("tiny", &cfg, 11);
}


/* Variants of the tiny shapes for the other architectures and RoPE
 * scalings, on dummy weights. */
static void
test_variants(void)
{
    struct msv_model_config  base, c;

    if (msv_config_preset("tiny", &base, err, sizeof(err)) != 0) {
        tap_ok(0, "tiny preset");
        return;
    }

    c = base;
    c.arch = MSV_ARCH_LLAMA;
    c.qk_norm = 0;
    c.tie_embeddings = 1;
    c.rope_type = MSV_ROPE_LLAMA3;
    c.rope_theta = 500000.0f;
    c.rope_factor = 8.0f;
    c.rope_low_freq_factor = 1.0f;
    c.rope_high_freq_factor = 4.0f;
    c.rope_orig_max_pos = 64;
    c.n_kv_heads = 1;
    test_consistency("llama3-rope tied", &c, 3);

    c = base;
    c.arch = MSV_ARCH_QWEN2;
    c.qk_norm = 0;
    c.qkv_bias = 1;
    c.rope_type = MSV_ROPE_LINEAR;
    c.rope_factor = 4.0f;
    c.n_kv_heads = 4;
    test_consistency("qwen2 linear-rope", &c, 4);
}


static void
test_kv_and_errors(void)
{
    int                      rc;
    float                   *lg;
    uint32_t                 id[2], nn[2], p0[2];
    int32_t                  toks[40] = { 0 };
    struct msv_backend      *b;
    struct msv_weights       w;
    struct msv_model_config  cfg;
    const struct msv_backend_ops  *ops = &msv_backend_cpu;

    if (msv_config_preset("tiny", &cfg, err, sizeof(err)) != 0
        || msv_weights_dummy(&cfg, 1, &w, err, sizeof(err)) != 0)
    {
        tap_ok(0, "tiny: %s", err);
        return;
    }

    /* 4 pages of 16 tokens, 3 sequences of up to 64 */
    b = msv_kvd_create(ops, &cfg, &w, 3, 64, 64, 1, err, sizeof(err));
    if (!tap_ok(b != NULL, "backend with a 64-token KV pool")) {
        msv_weights_free(&w);
        return;
    }
    lg = malloc(40 * (size_t) cfg.vocab_size * sizeof(float));

    tap_ok(msv_kvd_free(b) == 64, "64 tokens free");
    tap_ok(msv_kvd_reserve(b, 0, 40) == 0 && msv_kvd_free(b) == 16,
           "reserve 40 tokens takes 3 pages");
    tap_ok(msv_kvd_reserve(b, 1, 32) == -1 && msv_kvd_free(b) == 16,
           "reserve beyond the pool fails and takes nothing");
    tap_ok(msv_kvd_reserve(b, 1, 16) == 0 && msv_kvd_free(b) == 0,
           "the last page");
    tap_ok(msv_kvd_reserve(b, 0, 33) == 0 && msv_kvd_free(b) == 0,
           "reserving what a sequence already has is free");
    tap_ok(msv_kvd_reserve(b, 0, 49) == -1 && msv_kvd_free(b) == 0,
           "growing with no pages left fails");
    tap_ok(msv_kvd_reserve(b, 2, 65) == -1, "beyond max_len fails");
    tap_ok(msv_kvd_reserve(b, 3, 1) == -1, "sequence id beyond max_seqs "
           "fails");
    msv_kvd_release(b, 0);
    tap_ok(msv_kvd_free(b) == 48, "release gives 3 pages back");
    msv_kvd_release(b, 0);
    tap_ok(msv_kvd_free(b) == 48, "double release is harmless");

    /* batch validation */
    id[0] = 1;
    nn[0] = 17;
    p0[0] = 0;
    rc = run(ops, b, 1, id, nn, p0, toks, 0, lg);
    tap_ok(rc == -1 && strstr(err, "reserved") != NULL,
           "positions beyond the reservation: %s", err);

    nn[0] = 3;
    toks[1] = (int32_t) cfg.vocab_size;
    rc = run(ops, b, 1, id, nn, p0, toks, 0, lg);
    tap_ok(rc == -1 && strstr(err, "vocab_size") != NULL,
           "token id out of range: %s", err);
    toks[1] = -1;
    rc = run(ops, b, 1, id, nn, p0, toks, 0, lg);
    tap_ok(rc == -1 && strstr(err, "vocab_size") != NULL,
           "negative token id: %s", err);
    toks[1] = 0;

    id[1] = 1;
    nn[1] = 1;
    p0[1] = 3;
    rc = run(ops, b, 2, id, nn, p0, toks, 0, lg);
    tap_ok(rc == -1 && strstr(err, "twice") != NULL,
           "a sequence twice in one batch: %s", err);

    id[1] = 7;
    rc = run(ops, b, 2, id, nn, p0, toks, 0, lg);
    tap_ok(rc == -1 && strstr(err, "max_seqs") != NULL,
           "sequence id beyond max_seqs: %s", err);

    nn[0] = 0;
    rc = run(ops, b, 1, id, nn, p0, toks, 0, lg);
    tap_ok(rc == -1 && strstr(err, "no new tokens") != NULL,
           "empty entry: %s", err);

    rc = run(ops, b, 0, id, nn, p0, toks, 0, lg);
    tap_ok(rc == -1, "empty batch: %s", err);

    nn[0] = 3;
    rc = run(ops, b, 1, id, nn, p0, toks, 0, lg);
    tap_ok(rc == 0, "and a valid batch still runs (%s)", rc ? err : "ok");

    {
        /* page ids are the allocator's; one outside the pool is refused */
        static const uint32_t  bad_page[1] = { 1000 };
        const uint32_t        *bad_tab[1] = { bad_page };
        uint32_t               bad_n[1] = { 1 };
        struct msv_batch       bt;

        memset(&bt, 0, sizeof(bt));
        bt.n_seqs = 1;
        bt.seq = id;
        bt.n_new = nn;
        bt.pos0 = p0;
        bt.tokens = toks;
        bt.pages = bad_tab;
        bt.n_pages = bad_n;
        rc = ops->forward(b, &bt, lg, err, sizeof(err));
        tap_ok(rc == -1 && strstr(err, "pool") != NULL,
               "a page outside the pool: %s", err);
    }

    free(lg);
    msv_kvd_destroy(ops, b);

    b = msv_kvd_create(ops, &cfg, &w, 0, 48, 0, 1, err, sizeof(err));
    tap_ok(b == NULL && strstr(err, "max_seqs") != NULL,
           "create with max_seqs 0: %s", err);

    msv_weights_free(&w);
}


int
main(void)
{
    const char  *base;

    (void) tap_plan;

    base = getenv("MSV_FIXTURES");
    if (base == NULL) {
        base = "t/fixtures";
    }

    /* every backend this build and machine have: the CPU always, CUDA
     * in both precisions when a GPU is there */
    for (size_t i = 0; i < sizeof(fixtures) / sizeof(fixtures[0]); i++) {
        test_fixture(base, fixtures[i], &msv_backend_cpu, NULL, TOL);
    }
    if (msv_backend_cuda() == NULL) {
        tap_diag("skip: cuda backend: this build has none (no nvcc)");
    } else if (!msv_cuda_available()) {
        tap_diag("skip: cuda backend: no usable GPU");
    } else {
        for (size_t i = 0; i < sizeof(fixtures) / sizeof(fixtures[0]); i++) {
            test_fixture(base, fixtures[i], msv_backend_cuda(), "split", TOL);
            test_fixture(base, fixtures[i], msv_backend_cuda(), "bf16",
                         TOL_BF16_ACT);
        }
    }

    test_tiny();
    test_variants();
    test_kv_and_errors();

    return tap_done();
}
