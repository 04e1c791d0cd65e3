/*
 * test_backend.c: every backend this build and machine have, the CPU
 * always and CUDA when a GPU is there, against the Hugging Face
 * fixtures and against the CPU backend; the CUDA kernels against their
 * CPU twins (kernel_twins.h).  What needs CUDA is skipped, with the
 * reason printed ("# skip: cuda backend: ..."), when the build has no
 * CUDA or the machine no usable GPU.
 *
 *   1. Kernels against double-precision CPU twins (kernel_twins.h).
 *   2. The CUDA interface: create errors, KV page accounting, forward
 *      errors.
 *   3. Whole model, CUDA against the CPU backend: the same schedule
 *      (prefills, decodes, mixed and chunked batches, page reuse) through
 *      both, logits compared step by step, in both precisions (MSV_CUDA_ACT
 *      split and bf16) and in bf16 batch invariant (MSV_CUDA_INVARIANT=1):
 *      the tiny preset, its weights rounded to bf16, each fixture, and
 *      qwen3-0.6b (dummy bf16; not with -q); and CUDA against CUDA with
 *      MSV_CUDA_PREFETCH=64 (weights asked into L2), bit for bit.
 *   4. Each fixture in t/fixtures (config.json, model.safetensors,
 *      ref.json, ref.bin; made by tools/make_fixtures.py), loaded once,
 *      against its Hugging Face float64 logits on every backend: (a) each
 *      prompt prefilled with all logits, (b) the rest decoded a token at a
 *      time, (c) all sequences in shared batches mixing two-chunk prefills
 *      and decode steps, every row within 1e-4 (CPU, CUDA split) or 5e-2
 *      (CUDA bf16); and every prompt in one batch, then the continuation
 *      as mixed decode batches (CPU and CUDA split within 1e-4, 1e-3 for
 *      bf16 weights; CUDA bf16 within 5e-2).  A missing fixture fails.
 *   5. The CPU backend on dummy weights: determinism, prefill versus
 *      decode versus mixed batches, KV page accounting, batch validation.
 *
 * Each comparison of 1 and 3, and each fixture's one-batch comparison of
 * 4, is also a row of the table printed at the end (as TAP comments),
 * with "N of M comparisons within tolerance".  Decode timing is
 * bench/forward_time.
 *
 * usage: test_backend [-f fixtures_dir] [-k] [-q] [-s seed]
 *   -f  fixtures (default t/fixtures; environment MSV_FIXTURES)
 *   -k  the kernel checks only (environment MSV_TEST_KERNELS=1)
 *   -q  no qwen3-0.6b comparison, quicker (environment MSV_TEST_QUICK=1)
 *   -s  the random inputs' seed (environment MSV_TEST_SEED; default from
 *       the clock, printed first)
 * MSV_TEST_REQUIRE_CUDA=1: no usable CUDA backend is a failure, not a
 * skip (kernels/check.sh sets it).
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

#include "tap.h"
#include "backend.h"
#include "kv_direct.h"
#include "model.h"
#include "backend_check.h"
#include "kernel_twins.h"

/* the fixtures that must be there (any other one found runs too) */
static const char  *fixtures_required[] = {
    "qwen3-tiny", "qwen3-tiny-bf16", "llama-tiny", "qwen2-tiny"
};

static char  msg[1024];


/* ---- weights rounded to bf16 -------------------------------------------- */

struct chk_bf16w {
    struct msv_weights   w;
    void               **bufs;
    int                  n_bufs;
};


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


/* ---- the CUDA interface ------------------------------------------------- */

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
    static const uint32_t          bad_page[1] = { 1u << 30 };
    const uint32_t                *bad_tab[1] = { bad_page };
    uint32_t                       bad_n[1] = { 1 };
    size_t                         i;
    static const char             *bad_env[][2] = {
        { "MSV_CUDA_ACT", "bogus" },
        { "MSV_CUDA_PREFETCH", "2000" },
        { "MSV_CUDA_PREFETCH", "16MB" },
    };

    lg = chk_alloc(4 * (size_t) cfg->vocab_size * sizeof(float));

#define API(cond, what)                                                      \
    do {                                                                     \
        if (cond) {                                                          \
            tap_ok(1, "cuda api: %s", what);                                 \
        } else {                                                             \
            chk_fail("cuda api: %s", what);                                  \
        }                                                                    \
    } while (0)

    bad = *cfg;
    bad.head_dim = 15;
    err[0] = '\0';
    API(msv_kvd_create(ops, &bad, w, 2, 64, 0, 1, err, sizeof(err)) == NULL
        && err[0] != '\0', "odd head_dim is refused with a message");

    /* a bad value of a variable create reads: refused, naming it */
    for (i = 0; i < sizeof(bad_env) / sizeof(bad_env[0]); i++) {
        setenv(bad_env[i][0], bad_env[i][1], 1);
        err[0] = '\0';
        b = msv_kvd_create(ops, cfg, w, 2, 64, 0, 1, err, sizeof(err));
        unsetenv(bad_env[i][0]);
        if (b == NULL && strstr(err, bad_env[i][0]) != NULL) {
            tap_ok(1, "cuda api: %s=%s is refused with a message naming "
                   "it", bad_env[i][0], bad_env[i][1]);
        } else {
            chk_fail("cuda api: %s=%s is refused with a message naming it "
                     "(%s)", bad_env[i][0], bad_env[i][1],
                     b == NULL ? err : "created");
            if (b != NULL) {
                msv_kvd_destroy(ops, b);
            }
        }
    }

    b = msv_kvd_create(ops, cfg, w, 4, 64, 64, 1, err, sizeof(err));
    if (b == NULL) {
        chk_fail("cuda api: create: %s", err);
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
        tap_diag("(%s)", err);
    }

    msv_kvd_release(b, 0);
    API(msv_kvd_free(b) == 64, "release gives every page back");
    API(msv_kvd_reserve(b, 1, 64) == 0 && msv_kvd_free(b) == 0,
        "the whole pool for one sequence");

    msv_kvd_destroy(ops, b);
    free(lg);

#undef API
}


/* ---- models: CUDA against the CPU backend ------------------------------- */

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


/*
 * The schedule through both backends; records the largest error.  With
 * pf_mb > 0 the two are CUDA backends alike but for MSV_CUDA_PREFETCH
 * (unset against pf_mb megabytes): asking weights into L2 must not change
 * a bit (tol 0).
 */
static void
check_model(const char *name, const struct msv_model_config *cfg,
    const struct msv_weights *w, const char *act, int invariant, double tol,
    int pf_mb)
{
    char        mb[16];
    struct duo  d;
    char        err[512];
    uint32_t    s[4], n[4], i;

    memset(&d, 0, sizeof(d));
    d.name = name;
    d.vocab = cfg->vocab_size;
    d.ops[0] = pf_mb > 0 ? msv_backend_cuda() : &msv_backend_cpu;
    d.ops[1] = msv_backend_cuda();
    d.max_rows = CHK_MAX_LEN;
    d.out[0] = chk_alloc(d.max_rows * d.vocab * sizeof(float));
    d.out[1] = chk_alloc(d.max_rows * d.vocab * sizeof(float));

    setenv("MSV_CUDA_ACT", act, 1);
    setenv("MSV_CUDA_INVARIANT", invariant ? "1" : "0", 1);
    d.b[0] = msv_kvd_create(d.ops[0], cfg, w, CHK_MAX_SEQS, CHK_MAX_LEN, 0,
                              chk_threads, err, sizeof(err));
    if (d.b[0] == NULL) {
        chk_fail("%s: cpu create: %s", name, err);
        goto done;
    }
    if (pf_mb > 0) {
        snprintf(mb, sizeof(mb), "%d", pf_mb);
        setenv("MSV_CUDA_PREFETCH", mb, 1);
    }
    d.b[1] = msv_kvd_create(d.ops[1], cfg, w, CHK_MAX_SEQS, CHK_MAX_LEN, 0,
                              chk_threads, err, sizeof(err));
    unsetenv("MSV_CUDA_PREFETCH");
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

    if (!d.broken && pf_mb > 0) {
        chk_record(d.err, tol, "%s cuda prefetch %d MB vs none (%d "
                   "steps)%s", name, pf_mb, d.step, invariant
                   ? " invariant" : "");
    } else if (!d.broken) {
        chk_record(d.err, tol, "%s cuda vs cpu (%d steps)%s%s", name,
                   d.step, chk_any_bf16(w) && strcmp(act, "bf16") == 0
                   ? " bf16 act" : "", invariant ? " invariant" : "");
    }

done:
    if (d.b[0] != NULL) {
        msv_kvd_destroy(d.ops[0], d.b[0]);
    }
    if (d.b[1] != NULL) {
        msv_kvd_destroy(d.ops[1], d.b[1]);
    }
    unsetenv("MSV_CUDA_ACT");
    unsetenv("MSV_CUDA_INVARIANT");
    free(d.out[0]);
    free(d.out[1]);
}


/* CPU vs CUDA for one model; bf16 weights also with bf16 activations. */
static void
check_model_modes(const char *name, const struct msv_model_config *cfg,
    const struct msv_weights *w)
{
    /* split: fp32 KV and hi + lo products; bf16: bf16 KV (and bf16
     * activations for bf16 weights); bf16 batch invariant: every product
     * through its pinned cuBLASLt algorithm, the lm_head included */
    check_model(name, cfg, w, "split", 0,
                chk_any_bf16(w) ? CHK_TOL_BF16 : CHK_TOL_F32, 0);
    check_model(name, cfg, w, "bf16", 0, CHK_TOL_BF16_ACT, 0);
    check_model(name, cfg, w, "bf16", 1, CHK_TOL_BF16_ACT, 0);
    /* the weights asked into L2 ahead of each product (decode steps of
     * at most 8 rows): the same bits */
    check_model(name, cfg, w, "bf16", 0, 0.0, 64);
    check_model(name, cfg, w, "bf16", 1, 0.0, 64);
}


/* ---- fixtures against Hugging Face -------------------------------------- */

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

    msg[0] = '\0';
    return msv_kvd_forward(ops, b, &bt, logits, msg, sizeof(msg));
}



/* ---------------------------------------------------------------- */
/* fixtures                                                           */

/* The fixture on one backend: ops, with MSV_CUDA_ACT = act for CUDA
 * (NULL for the CPU), within tol of the Hugging Face logits: (a) each
 * prompt prefilled with all logits, (b) the rest decoded one token at a
 * time, (c) all sequences in shared batches mixing prefill chunks and
 * decode steps. */
static void
test_fixture(const char *fname, const struct msv_model_config *cfgp,
    const struct msv_weights *wp, const struct hf_ref *fxp,
    const struct msv_backend_ops *ops, const char *act, double tol)
{
    int                            rc, all;
    float                         *lg;
    double                         e, wa, wb, wc;
    uint32_t                       i, k, t, n, maxlen, steps, step, rows;
    uint32_t                      *ids, *nn, *p0;
    int32_t                       *tk;
    const struct hf_ref            fx = *fxp;
    const struct msv_model_config  cfg = *cfgp;
    struct msv_backend            *b;
    struct seq_state              *st;
    char                           name[160];

    snprintf(name, sizeof(name), "%s%s%s %s", ops->name, act ? " " : "",
             act ? act : "", fname);

    tap_ok(fx.vocab == cfg.vocab_size, "%s: %s, %u sequences, vocab %u, "
           "weights %s", name, msv_arch_name(cfg.arch), fx.n_seqs, fx.vocab,
           msv_dtype_name(wp->t[0].dtype));
    if (fx.vocab != cfg.vocab_size) {
        return;
    }

    maxlen = 0;
    for (i = 0; i < fx.n_seqs; i++) {
        maxlen = fx.len[i] > maxlen ? fx.len[i] : maxlen;
    }

    if (act != NULL) {
        setenv("MSV_CUDA_ACT", act, 1);
    }
    b = msv_kvd_create(ops, &cfg, wp, fx.n_seqs + 3, maxlen + 5, 0, 2, msg,
                       sizeof(msg));
    unsetenv("MSV_CUDA_ACT");
    if (!tap_ok(b != NULL, "%s: backend created (%s)", name,
                b ? "ok" : msg))
    {
        return;
    }

    lg = malloc((size_t) (maxlen * fx.n_seqs + 1) * fx.vocab
                * sizeof(float));
    ids = calloc(fx.n_seqs, sizeof(uint32_t));
    nn = calloc(fx.n_seqs, sizeof(uint32_t));
    p0 = calloc(fx.n_seqs, sizeof(uint32_t));
    tk = malloc((size_t) (maxlen * fx.n_seqs + 1) * sizeof(int32_t));
    st = calloc(fx.n_seqs, sizeof(struct seq_state));
    if (lg == NULL || ids == NULL || nn == NULL || p0 == NULL || tk == NULL
        || st == NULL)
    {
        tap_ok(0, "%s: out of memory", name);
        goto done;
    }

    /* (a) prefill and (b) decode, one sequence at a time */

    wa = wb = 0;
    rc = 0;
    for (i = 0; i < fx.n_seqs && rc == 0; i++) {
        uint32_t  id = i + 1, zero = 0, one = 1, P = fx.plen[i];

        rc = msv_kvd_reserve(b, id, fx.len[i]);
        if (rc != 0) {
            snprintf(msg, sizeof(msg), "kv_reserve failed");
            break;
        }

        rc = run(ops, b, 1, &id, &P, &zero, fx.tok[i], 1, lg);
        for (t = 0; rc == 0 && t < P; t++) {
            e = row_err(lg + (size_t) t * fx.vocab,
                        fx.logits[i] + (size_t) t * fx.vocab, fx.vocab);
            wa = e > wa ? e : wa;
        }

        for (t = P; rc == 0 && t < fx.len[i]; t++) {
            rc = run(ops, b, 1, &id, &one, &t, fx.tok[i] + t, 0, lg);
            e = row_err(lg, fx.logits[i] + (size_t) t * fx.vocab, fx.vocab);
            wb = e > wb ? e : wb;
        }

        msv_kvd_release(b, id);
    }

    tap_ok(rc == 0 && wa <= tol, "%s: (a) prefill, all logits: max rel err "
           "%.2e%s%s", name, wa, rc ? ": " : "", rc ? msg : "");
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

        for (i = 0; i < fx.n_seqs; i++) {
            st[i].done = 0;
            st[i].start = i;
            if (msv_kvd_reserve(b, fx.n_seqs + 1 - i, fx.len[i]) != 0) {
                rc = -1;
                snprintf(msg, sizeof(msg), "kv_reserve failed");
            }
        }

        for (step = 0; rc == 0; step++) {
            n = 0;
            t = 0;
            for (i = 0; i < fx.n_seqs; i++) {
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

                ids[n] = fx.n_seqs + 1 - i;
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
                i = fx.n_seqs + 1 - ids[k];
                if (all) {
                    for (t = 0; t < nn[k]; t++) {
                        e = row_err(lg + (size_t) rows++ * fx.vocab,
                                    fx.logits[i] + (size_t) (p0[k] + t)
                                    * fx.vocab, fx.vocab);
                        wc = e > wc ? e : wc;
                    }
                } else {
                    e = row_err(lg + (size_t) rows++ * fx.vocab,
                                fx.logits[i] + (size_t) (p0[k] + nn[k] - 1)
                                * fx.vocab, fx.vocab);
                    wc = e > wc ? e : wc;
                }
                st[i].done += nn[k];
            }
        }

        for (i = 0; i < fx.n_seqs; i++) {
            msv_kvd_release(b, fx.n_seqs + 1 - i);
        }

        tap_ok(rc == 0 && wc <= tol, "%s: (c) mixed prefill/decode batches "
               "(%u steps, %s): max rel err %.2e%s%s", name, steps,
               all ? "all logits" : "last logits", wc, rc ? ": " : "",
               rc ? msg : "");
    }

    tap_ok(msv_kvd_free(b) == (uint64_t) (fx.n_seqs + 3)
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
        snprintf(msg, sizeof(msg), "kv_reserve(%u) failed", n);
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

    if (msv_weights_dummy(cfg, seed, &w, msg, sizeof(msg)) != 0) {
        tap_ok(0, "%s: dummy weights: %s", label, msg);
        return;
    }

    b = msv_kvd_create(&msv_backend_cpu, cfg, &w, 8, 128, 0, 2, msg,
                       sizeof(msg));
    if (!tap_ok(b != NULL, "%s: backend created (%s)", label,
                b ? "ok" : msg))
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
           rc ? ": " : "", rc ? msg : "");
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
           label, e3, rc ? ": " : "", rc ? msg : "");

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

    if (!tap_ok(msv_config_preset("tiny", &cfg, msg, sizeof(msg)) == 0,
                "tiny preset"))
    {
        return;
    }
    V = cfg.vocab_size;

    /* same seed: same weights; 1 thread and 3 threads: same bits */
    rc = msv_weights_dummy(&cfg, 5, &w1, msg, sizeof(msg));
    rc |= msv_weights_dummy(&cfg, 5, &w2, msg, sizeof(msg));
    rc |= msv_weights_dummy(&cfg, 6, &w3, msg, sizeof(msg));
    if (!tap_ok(rc == 0, "dummy weights")) {
        return;
    }

    b1 = msv_kvd_create(&msv_backend_cpu, &cfg, &w1, 2, 64, 0, 1, msg,
                        sizeof(msg));
    b2 = msv_kvd_create(&msv_backend_cpu, &cfg, &w2, 2, 64, 0, 3, msg,
                        sizeof(msg));
    b3 = msv_kvd_create(&msv_backend_cpu, &cfg, &w3, 2, 64, 0, 0, msg,
                        sizeof(msg));
    if (!tap_ok(b1 && b2 && b3, "three backends created%s%s",
                b1 && b2 && b3 ? "" : ": ", b1 && b2 && b3 ? "" : msg))
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

    if (msv_config_preset("tiny", &base, msg, sizeof(msg)) != 0) {
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

    if (msv_config_preset("tiny", &cfg, msg, sizeof(msg)) != 0
        || msv_weights_dummy(&cfg, 1, &w, msg, sizeof(msg)) != 0)
    {
        tap_ok(0, "tiny: %s", msg);
        return;
    }

    /* 4 pages of 16 tokens, 3 sequences of up to 64 */
    b = msv_kvd_create(ops, &cfg, &w, 3, 64, 64, 1, msg, sizeof(msg));
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
    tap_ok(rc == -1 && strstr(msg, "reserved") != NULL,
           "positions beyond the reservation: %s", msg);

    nn[0] = 3;
    toks[1] = (int32_t) cfg.vocab_size;
    rc = run(ops, b, 1, id, nn, p0, toks, 0, lg);
    tap_ok(rc == -1 && strstr(msg, "vocab_size") != NULL,
           "token id out of range: %s", msg);
    toks[1] = -1;
    rc = run(ops, b, 1, id, nn, p0, toks, 0, lg);
    tap_ok(rc == -1 && strstr(msg, "vocab_size") != NULL,
           "negative token id: %s", msg);
    toks[1] = 0;

    id[1] = 1;
    nn[1] = 1;
    p0[1] = 3;
    rc = run(ops, b, 2, id, nn, p0, toks, 0, lg);
    tap_ok(rc == -1 && strstr(msg, "twice") != NULL,
           "a sequence twice in one batch: %s", msg);

    id[1] = 7;
    rc = run(ops, b, 2, id, nn, p0, toks, 0, lg);
    tap_ok(rc == -1 && strstr(msg, "max_seqs") != NULL,
           "sequence id beyond max_seqs: %s", msg);

    nn[0] = 0;
    rc = run(ops, b, 1, id, nn, p0, toks, 0, lg);
    tap_ok(rc == -1 && strstr(msg, "no new tokens") != NULL,
           "empty entry: %s", msg);

    rc = run(ops, b, 0, id, nn, p0, toks, 0, lg);
    tap_ok(rc == -1, "empty batch: %s", msg);

    nn[0] = 3;
    rc = run(ops, b, 1, id, nn, p0, toks, 0, lg);
    tap_ok(rc == 0, "and a valid batch still runs (%s)", rc ? msg : "ok");

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
        rc = ops->forward(b, &bt, lg, msg, sizeof(msg));
        tap_ok(rc == -1 && strstr(msg, "pool") != NULL,
               "a page outside the pool: %s", msg);
    }

    free(lg);
    msv_kvd_destroy(ops, b);

    b = msv_kvd_create(ops, &cfg, &w, 0, 48, 0, 1, msg, sizeof(msg));
    tap_ok(b == NULL && strstr(msg, "max_seqs") != NULL,
           "create with max_seqs 0: %s", msg);

    msv_weights_free(&w);
}



/* ---------------------------------------------------------------- */
/* the fixtures, each loaded once, on every backend                   */

static void
check_fixture(const char *name, const char *dir, const char *cuda_why)
{
    struct msv_model_config   cfg;
    struct msv_weights        w;
    struct hf_ref             ref;
    char                      path[1024], err[512];
    double                    tol;
    int                       have_ref;

    snprintf(path, sizeof(path), "%.900s/config.json", dir);
    if (msv_config_load(path, &cfg, err, sizeof(err)) != 0) {
        chk_fail("fixture %s: %s", name, err);
        return;
    }
    if (msv_weights_load(dir, &w, err, sizeof(err)) != 0) {
        chk_fail("fixture %s: %s", name, err);
        return;
    }
    have_ref = hf_ref_load(dir, &ref, err, sizeof(err)) == 0;
    if (!have_ref) {
        chk_fail("fixture %s: %s", name, err);
    }

    /* (a), (b), (c): 1e-4 for every fixture, bf16 weights included (both
     * sides read the same bf16 values) */
    if (have_ref) {
        test_fixture(name, &cfg, &w, &ref, &msv_backend_cpu, NULL,
                     CHK_TOL_F32);
        if (cuda_why == NULL) {
            test_fixture(name, &cfg, &w, &ref, msv_backend_cuda(), "split",
                         CHK_TOL_F32);
            test_fixture(name, &cfg, &w, &ref, msv_backend_cuda(), "bf16",
                         CHK_TOL_BF16_ACT);
        }
    }

    if (cuda_why == NULL) {
        check_model_modes(name, &cfg, &w);
    }

    tol = chk_any_bf16(&w) ? CHK_TOL_BF16 : CHK_TOL_F32;
    if (have_ref) {
        if (cuda_why == NULL) {
            check_hf(name, msv_backend_cuda(), &cfg, &w, &ref, "split", tol);
            check_hf(name, msv_backend_cuda(), &cfg, &w, &ref, "bf16",
                     CHK_TOL_BF16_ACT);
        }
        check_hf(name, &msv_backend_cpu, &cfg, &w, &ref, "split", tol);
        hf_ref_free(&ref);
    }

    msv_weights_free(&w);
}


/* Every fixture in dir (those with a config.json), in name order; each
 * required one must be among them. */
static void
check_fixtures(const char *dir, const char *cuda_why)
{
    struct dirent  **ents;
    struct stat      st;
    char             path[1024], sub[1024];
    size_t           k;
    int              n, i, found[sizeof(fixtures_required)
                                 / sizeof(fixtures_required[0])];

    memset(found, 0, sizeof(found));
    n = scandir(dir, &ents, NULL, alphasort);
    if (n < 0) {
        chk_fail("fixtures: %s: %s", dir, strerror(errno));
        n = 0;
        ents = NULL;
    }

    for (i = 0; i < n; i++) {
        snprintf(sub, sizeof(sub), "%.700s/%.250s", dir, ents[i]->d_name);
        snprintf(path, sizeof(path), "%.900s/config.json", sub);
        if (ents[i]->d_name[0] != '.' && stat(path, &st) == 0) {
            for (k = 0; k < sizeof(found) / sizeof(found[0]); k++) {
                found[k] |= strcmp(ents[i]->d_name, fixtures_required[k])
                            == 0;
            }
            check_fixture(ents[i]->d_name, sub, cuda_why);
        }
        free(ents[i]);
    }
    free(ents);

    for (k = 0; k < sizeof(found) / sizeof(found[0]); k++) {
        if (!found[k]) {
            chk_fail("fixture %s: not in %s", fixtures_required[k], dir);
        }
    }
}


/* ---------------------------------------------------------------- */
/* main                                                               */

/* The table of comparisons (kernel rows only when they failed). */
static void
report(void)
{
    int  i, n_ok;

    n_ok = 0;
    for (i = 0; i < chk_n_results; i++) {
        n_ok += chk_results[i].ok;
    }
    tap_diag("");
    tap_diag("%-64s %10s %8s", "case", "max rel", "tol");
    for (i = 0; i < chk_n_results; i++) {
        if (strncmp(chk_results[i].name, "kernel ", 7) == 0
            && chk_results[i].ok)
        {
            continue;
        }
        tap_diag("%-64s %10.2e %8.0e %s", chk_results[i].name,
                 chk_results[i].err, chk_results[i].tol,
                 chk_results[i].ok ? "ok" : "FAIL");
    }
    tap_diag("%d of %d comparisons within tolerance (passing kernel rows "
             "above), %d failures", n_ok, chk_n_results, tap_failed);
    tap_diag("test_backend: %s (%d failures)", tap_failed ? "FAILED"
                                                           : "passed",
             tap_failed);
}


/* An option from the environment: set, and not "" or "0". */
static int
env_flag(const char *name)
{
    const char  *v = getenv(name);

    return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}


static int
parse_seed(const char *what, const char *s, uint64_t *seed)
{
    char  *end;

    errno = 0;
    *seed = strtoull(s, &end, 0);
    if (errno != 0 || *end != '\0' || end == s) {
        fprintf(stderr, "test_backend: %s %s: not a number\n", what, s);
        return -1;
    }
    return 0;
}


int
main(int argc, char **argv)
{
    struct msv_model_config  cfg;
    struct msv_weights       w;
    struct chk_bf16w         wb;
    const char              *fixtures, *cuda_why;
    char                     err[512];
    long                     ncpu;
    int                      opt, big, only_kernels;
    uint64_t                 seed;

    (void) tap_plan;

    fixtures = getenv("MSV_FIXTURES") != NULL ? getenv("MSV_FIXTURES")
                                              : "t/fixtures";
    only_kernels = env_flag("MSV_TEST_KERNELS");
    big = !env_flag("MSV_TEST_QUICK");
    seed = (uint64_t) time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t) getpid();
    if (getenv("MSV_TEST_SEED") != NULL
        && parse_seed("MSV_TEST_SEED", getenv("MSV_TEST_SEED"), &seed) != 0)
    {
        return 2;
    }

    while ((opt = getopt(argc, argv, "f:kqs:")) != -1) {
        switch (opt) {
        case 'f':
            fixtures = optarg;
            break;
        case 'k':
            only_kernels = 1;
            break;
        case 'q':
            big = 0;
            break;
        case 's':
            if (parse_seed("-s", optarg, &seed) != 0) {
                return 2;
            }
            break;
        default:
            fprintf(stderr, "usage: %s [-f fixtures_dir] [-k] [-q] "
                    "[-s seed]\n", argv[0]);
            return 2;
        }
    }

    tap_diag("seed %llu (-s %llu or MSV_TEST_SEED=%llu repeats this run)",
             (unsigned long long) seed, (unsigned long long) seed,
             (unsigned long long) seed);
    chk_rng = seed != 0 ? seed : 1;

    ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    chk_threads = ncpu < 1 ? 1 : ncpu > 16 ? 16 : (int) ncpu;

    /* every backend this build and machine have: the CPU always, CUDA
     * in both precisions when a GPU is there */
    cuda_why = NULL;
    if (msv_backend_cuda() == NULL) {
        cuda_why = "this build has none (no nvcc)";
    } else if (!msv_cuda_available()) {
        cuda_why = "no usable GPU";
    }
    if (cuda_why != NULL && env_flag("MSV_TEST_REQUIRE_CUDA")) {
        tap_ok(0, "cuda backend (MSV_TEST_REQUIRE_CUDA): %s", cuda_why);
    } else if (cuda_why != NULL) {
        tap_diag("skip: cuda backend: %s: the kernels against their CPU "
                 "twins, the interface, cuda vs cpu, the fixtures on cuda",
                 cuda_why);
    }

#ifdef MSV_HAVE_CUDA
    if (cuda_why == NULL) {
        check_kernels();
    }
#endif

    if (only_kernels) {
        goto done;
    }

    if (cuda_why == NULL) {
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
    }

    check_fixtures(fixtures, cuda_why);

    if (big && cuda_why == NULL) {
        if (msv_config_preset("qwen3-0.6b", &cfg, err, sizeof(err)) != 0
            || msv_weights_dummy(&cfg, 3, &w, err, sizeof(err)) != 0)
        {
            chk_fail("qwen3-0.6b preset: %s", err);
        } else {
            check_model_modes("qwen3-0.6b", &cfg, &w);
            msv_weights_free(&w);
        }
    }

    test_tiny();
    test_variants();
    test_kv_and_errors();

done:
    report();
    return tap_done();
}
