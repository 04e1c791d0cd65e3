/*
 * sampler.c: the CPU sampler of docs/SAMPLER.md.  Logit processing
 * (bias, penalties, min_tokens, temperature), support selection (min-p,
 * top-k, top-p) without sorting the vocabulary, the Philox/Gumbel race,
 * and mask capture.
 *
 * The support S is always a prefix of the rank order (z' desc, id asc)
 * over the finite processed logits, so it is carried either "dense" (the
 * ids with z' - max >= log(min_p), which is z' >= a float floor found
 * once) or as a list of rank keys in s->cand, sorted or not.  A rank key
 * is (~orderable(z') << 32 | id): ascending keys are the rank order.
 */

/* Every float operation of the contract is rounded on its own: no fused
 * multiply-add, so the CUDA twin can reproduce the processed logits. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize ("fp-contract=off")
#endif

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msv_params.h"
#include "sample_contract.h"
#include "sampler.h"


#define MSV_GTAB_BINS    4096       /* Gumbel bounds per top 12 random bits */
#define MSV_GTAB_SHIFT   20
#define MSV_BEST_SLACK   4096       /* top-k buffer beyond k (or V/8) */
#define MSV_MASS_BINS    185        /* top-p bins, 1/8 nat, d in [-23, 0] */
#define MSV_MASS_SCALE   8.0
#define MSV_SMALL_SORT   32         /* insertion sort up to this size */
#define MSV_MAX_MASKED   (MSV_MAX_EOS + MSV_MAX_STOP)

struct msv_sampler {
    uint32_t         vocab;
    uint32_t         epoch;         /* this call's stamp in mark[] */
    double           gbound;        /* above every Gumbel value */
    uint32_t        *mark;          /* [vocab] repetition-penalty stamps */
    uint32_t        *count;         /* [vocab] output counts, 0 between calls */
    uint64_t        *cand;          /* [vocab] rank keys of the support */
    uint64_t        *tmp;           /* [vocab] sort buffer, top-p weights */
    int32_t         *ids;           /* [vocab] support ids, ascending */
    float           *lps;           /* [vocab] their logprobs */
    uint32_t         n_masked;      /* min_tokens: masked ids, old values */
    int32_t          masked_id[MSV_MAX_MASKED];
    float            masked_z[MSV_MAX_MASKED];
    double           gtab[MSV_GTAB_BINS];   /* Gumbel bound per top 12 bits */
    uint64_t         mass[MSV_MASS_BINS];
    struct msv_top   top[MSV_MAX_LOGPROBS];
    char             err[160];
};

/* One dense pass over the logits: what it does and what it found. */
struct msv_pass {
    float     temp;        /* divisor; 1: none */

    uint32_t  n_fin;       /* finite processed logits */
    uint32_t  amax;        /* lowest id of the largest */
    float     m;           /* the largest */
};

/* Four floats, and the lane masks comparing them gives. */
typedef float    msv_vf __attribute__((vector_size(16)));
typedef int32_t  msv_vi __attribute__((vector_size(16)));
#define MSV_VW   4

/* The support, between the stages. */
struct msv_set {
    int       list;        /* 0: dense predicate; 1: s->cand[0..n) */
    int       sorted;      /* list in rank order */
    uint32_t  n;
    double    m;           /* max z' (as a double) */
    float     lo;          /* dense support: z' >= lo, the min-p floor */
};


static int msv_sample_valid(struct msv_sampler *s,
    const struct msv_sample_req *rq);
static int msv_fail(struct msv_sampler *s, const char *fmt, ...);
static void msv_process(struct msv_sampler *s, float *z,
    const struct msv_sample_req *rq);
static void msv_mask(struct msv_sampler *s, float *z, int32_t id);
static void msv_dense(struct msv_sampler *s, float *z, struct msv_pass *ps);
static uint32_t msv_best(struct msv_sampler *s, const float *z,
    const struct msv_set *S, uint32_t k, int sorted);
static uint32_t msv_top_p_list(struct msv_sampler *s, const float *z,
    const struct msv_set *S, float top_p);
static uint32_t msv_top_p_dense(struct msv_sampler *s, const float *z,
    const struct msv_set *S, float top_p);
static int32_t msv_race_list(const struct msv_sampler *s, const float *z,
    const struct msv_set *S, uint64_t seed, uint32_t t);
static int32_t msv_race_dense(const struct msv_sampler *s, const float *z,
    const struct msv_set *S, uint32_t amax, uint64_t seed, uint32_t t);
static double msv_lse(const struct msv_sampler *s, const float *z,
    const struct msv_set *S);
static uint32_t msv_top_logprobs(struct msv_sampler *s, const float *z,
    struct msv_set *S, uint32_t k, double lse);
static uint32_t msv_support_ids(struct msv_sampler *s, const float *z,
    const struct msv_set *S);
static void msv_select(uint64_t *a, uint32_t n, uint32_t k, uint64_t *tmp);
static void msv_sort(uint64_t *a, uint32_t n, uint64_t *tmp);


/* ------------------------------------------------------------------ */
/* Small helpers                                                        */

/* The first id >= i with z[id] >= lo, or n; eight logits per test where
 * none qualifies. */
static inline uint32_t
msv_next(const float *z, uint32_t i, uint32_t n, float lo)
{
    msv_vf  a, b, lv;
    msv_vi  hit;

    lv = (msv_vf) { lo, lo, lo, lo };
    while (i < n) {
        if (i % (2 * MSV_VW) == 0 && i + 2 * MSV_VW <= n) {
            memcpy(&a, z + i, sizeof(a));
            memcpy(&b, z + i + MSV_VW, sizeof(b));
            hit = (a >= lv) | (b >= lv);
            if ((hit[0] | hit[1] | hit[2] | hit[3]) == 0) {
                i += 2 * MSV_VW;
                continue;
            }
        }
        if (z[i] >= lo) {
            return i;
        }
        i++;
    }
    return n;
}


/* ------------------------------------------------------------------ */
/* Public functions                                                     */

struct msv_sampler *
msv_sampler_new(uint32_t vocab)
{
    uint32_t             i;
    struct msv_sampler  *s;

    if (vocab == 0 || vocab > MSV_SAMPLER_MAX_VOCAB) {
        errno = EINVAL;
        return NULL;
    }

    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return NULL;
    }

    s->vocab = vocab;
    s->mark = calloc(vocab, sizeof(*s->mark));
    s->count = calloc(vocab, sizeof(*s->count));
    s->cand = malloc((size_t) vocab * sizeof(*s->cand));
    s->tmp = malloc((size_t) vocab * sizeof(*s->tmp));
    s->ids = malloc((size_t) vocab * sizeof(*s->ids));
    s->lps = malloc((size_t) vocab * sizeof(*s->lps));

    if (s->mark == NULL || s->count == NULL || s->cand == NULL
        || s->tmp == NULL || s->ids == NULL || s->lps == NULL)
    {
        msv_sampler_free(s);
        errno = ENOMEM;
        return NULL;
    }

    /* the Gumbel value grows with x: bound it by the largest x of each
     * bucket of the top 12 bits, with a margin for a log() that is not
     * exactly monotone */
    for (i = 0; i < MSV_GTAB_BINS; i++) {
        s->gtab[i] = msv_gumbel((i << MSV_GTAB_SHIFT)
                                | ((1u << MSV_GTAB_SHIFT) - 1)) + 1e-6;
    }
    s->gbound = s->gtab[MSV_GTAB_BINS - 1];

    return s;
}


void
msv_sampler_free(struct msv_sampler *s)
{
    if (s == NULL) {
        return;
    }
    free(s->mark);
    free(s->count);
    free(s->cand);
    free(s->tmp);
    free(s->ids);
    free(s->lps);
    free(s);
}


const char *
msv_sampler_error(const struct msv_sampler *s)
{
    return s != NULL ? s->err : "sampler: no sampler";
}


double
msv_philox_uniform(uint64_t seed, uint32_t t, uint32_t id)
{
    return ((double) msv_philox_bits(seed, t, id) + 0.5) * 0x1p-32;
}


double
msv_philox_gumbel(uint64_t seed, uint32_t t, uint32_t id)
{
    return msv_gumbel(msv_philox_bits(seed, t, id));
}


int
msv_sample(struct msv_sampler *s, float *logits,
    const struct msv_sample_req *rq, struct msv_sample_out *out)
{
    int                       greedy, capture, top_k, top_p;
    double                    lse;
    uint32_t                  i, k;
    struct msv_set            S;
    struct msv_pass           ps;
    const struct msv_params  *p;

    if (s == NULL || out == NULL) {
        return -1;
    }
    memset(out, 0, sizeof(*out));
    out->token = -1;
    s->err[0] = '\0';

    if (logits == NULL || rq == NULL || rq->p == NULL) {
        return msv_fail(s, "sampler: no logits, request or params");
    }
    if (msv_sample_valid(s, rq) != 0) {
        return -1;
    }

    p = rq->p;
    greedy = p->temperature == 0.0f;
    capture = p->mask_mode != MSV_MASK_OFF || p->logprobs >= 0;
    top_k = !greedy && p->top_k > 0 && (uint32_t) p->top_k < s->vocab;
    top_p = !greedy && p->top_p < 1.0f;

    S.list = 0;
    S.sorted = 0;
    S.n = 0;

    /* bias, penalties, min_tokens: sparse */
    msv_process(s, logits, rq);

    /* sanitize, temperature, max */
    ps.temp = greedy ? 1.0f : p->temperature;

    msv_dense(s, logits, &ps);

    if (ps.n_fin == 0 && s->n_masked > 0) {
        /* min_tokens masked the last finite logits: it does not apply */
        for (i = 0; i < s->n_masked; i++) {
            logits[s->masked_id[i]] = s->masked_z[i];
        }
        msv_dense(s, logits, &ps);
    }
    if (ps.n_fin == 0) {
        return msv_fail(s, "sampler: every logit is -inf or NaN");
    }

    S.m = ps.m;
    S.lo = msv_floor(ps.m, !greedy && p->min_p > 0.0f
                           ? log((double) p->min_p) : -INFINITY);

    if (greedy) {
        out->token = (int32_t) ps.amax;
        out->logprob = 0.0f;
        if (p->mask_mode != MSV_MASK_OFF) {
            s->ids[0] = (int32_t) ps.amax;
            s->lps[0] = 0.0f;
            out->n_support = 1;
            out->ids = s->ids;
            out->lps = p->mask_mode == MSV_MASK_SUPPORT ? s->lps : NULL;
        }
        if (p->logprobs > 0) {
            s->top[0].id = (int32_t) ps.amax;
            s->top[0].lp = 0.0f;
            out->n_top = 1;
            out->top = s->top;
        }
        return 0;
    }

    /* the support */
    if (top_k) {
        S.n = msv_best(s, logits, &S, (uint32_t) p->top_k, top_p);
        S.list = 1;
        S.sorted = top_p;
    }
    if (top_p) {
        S.n = S.list ? msv_top_p_list(s, logits, &S, p->top_p)
                     : msv_top_p_dense(s, logits, &S, p->top_p);
        S.list = 1;
        S.sorted = 1;
    }

    /* the draw */
    if (S.list) {
        out->token = msv_race_list(s, logits, &S, rq->seed, rq->t);
    } else {
        out->token = msv_race_dense(s, logits, &S, ps.amax, rq->seed, rq->t);
    }

    if (!capture) {
        return 0;
    }

    lse = msv_lse(s, logits, &S);
    out->logprob = msv_lp((double) logits[out->token] - S.m, lse);

    if (p->logprobs > 0) {
        out->n_top = msv_top_logprobs(s, logits, &S, (uint32_t) p->logprobs,
                                      lse);
        out->top = s->top;
    }

    if (p->mask_mode != MSV_MASK_OFF) {
        out->n_support = msv_support_ids(s, logits, &S);
        out->ids = s->ids;
        if (p->mask_mode == MSV_MASK_SUPPORT) {
            for (i = 0; i < out->n_support; i++) {
                k = (uint32_t) s->ids[i];
                s->lps[i] = msv_lp((double) logits[k] - S.m, lse);
            }
            out->lps = s->lps;
        }
    }

    return 0;
}


/* ------------------------------------------------------------------ */
/* Validation                                                           */

static int
msv_fail(struct msv_sampler *s, const char *fmt, ...)
{
    va_list  ap;

    va_start(ap, fmt);
    vsnprintf(s->err, sizeof(s->err), fmt, ap);
    va_end(ap);
    return -1;
}


static int
msv_ids_valid(struct msv_sampler *s, const int32_t *ids, uint32_t n,
    const char *what)
{
    uint32_t  i;

    if (n > 0 && ids == NULL) {
        return msv_fail(s, "sampler: %s: %u ids but no array", what, n);
    }
    for (i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t) ids[i] >= s->vocab) {
            return msv_fail(s, "sampler: %s[%u] = %d not in [0, %u)",
                            what, i, ids[i], s->vocab);
        }
    }
    return 0;
}


/*
 * The rules of shm/msv_params.h, which every request passed when it was
 * admitted: here a few compares plus the bias and stop entries, cheap
 * beside the pass over the vocabulary, so a caller that skipped
 * admission (a test, a benchmark) still cannot get a row out of range.
 */
static int
msv_sample_valid(struct msv_sampler *s, const struct msv_sample_req *rq)
{
    char                      err[MSV_PARAM_ERR_MAX];
    struct msv_limits         lim;
    const struct msv_params  *p = rq->p;

    lim.vocab_size = s->vocab;
    lim.max_model_len = 0;
    lim.max_logprobs = 0;

    if (msv_params_check_sampling(p, rq->bias, &lim, err) != NULL) {
        return msv_fail(s, "sampler: %s", err);
    }
    if (rq->n_eos > MSV_MAX_EOS || (rq->n_eos > 0 && rq->eos == NULL)) {
        return msv_fail(s, "sampler: n_eos %u (at most %d, with an array)",
                        rq->n_eos, MSV_MAX_EOS);
    }

    /* token histories are read only by the penalties */
    if (p->repetition_penalty != 1.0f
        && msv_ids_valid(s, rq->prompt, rq->n_prompt, "prompt") != 0)
    {
        return -1;
    }
    if ((p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f
         || p->presence_penalty != 0.0f)
        && msv_ids_valid(s, rq->out, rq->t, "output") != 0)
    {
        return -1;
    }

    return 0;
}


/* ------------------------------------------------------------------ */
/* Logit processing                                                     */

static void
msv_process(struct msv_sampler *s, float *z, const struct msv_sample_req *rq)
{
    float                     r, f, pr;
    uint32_t                  i, c, n;
    int32_t                   id;
    const int32_t            *toks;
    const struct msv_params  *p = rq->p;

    /* 1. logit_bias, entries in order */
    for (i = 0; i < p->n_bias; i++) {
        id = rq->bias[i].id;
        z[id] = msv_bias_add(msv_clean(z[id]), rq->bias[i].value);
    }

    /* 2a. repetition penalty, once per distinct prompt or output token */
    r = p->repetition_penalty;
    if (r != 1.0f) {
        if (++s->epoch == 0) {
            memset(s->mark, 0, (size_t) s->vocab * sizeof(*s->mark));
            s->epoch = 1;
        }
        for (n = 0; n < 2; n++) {
            toks = n == 0 ? rq->prompt : rq->out;
            c = n == 0 ? rq->n_prompt : rq->t;
            for (i = 0; i < c; i++) {
                id = toks[i];
                if (s->mark[id] == s->epoch) {
                    continue;
                }
                s->mark[id] = s->epoch;
                z[id] = msv_rep_penalty(msv_clean(z[id]), r);
            }
        }
    }

    /* 2b. frequency then presence penalty, once per distinct output
     * token; count[] is back to all zeros afterwards */
    f = p->frequency_penalty;
    pr = p->presence_penalty;
    if (f != 0.0f || pr != 0.0f) {
        for (i = 0; i < rq->t; i++) {
            s->count[rq->out[i]]++;
        }
        for (i = 0; i < rq->t; i++) {
            id = rq->out[i];
            c = s->count[id];
            if (c == 0) {
                continue;
            }
            s->count[id] = 0;
            z[id] = msv_freq_penalty(msv_clean(z[id]), f, c, pr);
        }
    }

    /* 3. min_tokens: stop ids, and eos unless ignored */
    s->n_masked = 0;
    if (rq->t < p->min_tokens) {
        for (i = 0; i < p->n_stop; i++) {
            msv_mask(s, z, p->stop_ids[i]);
        }
        if (!p->ignore_eos) {
            for (i = 0; i < rq->n_eos; i++) {
                if (rq->eos[i] >= 0 && (uint32_t) rq->eos[i] < s->vocab) {
                    msv_mask(s, z, rq->eos[i]);
                }
            }
        }
    }
}


static void
msv_mask(struct msv_sampler *s, float *z, int32_t id)
{
    uint32_t  i;

    for (i = 0; i < s->n_masked; i++) {
        if (s->masked_id[i] == id) {
            return;
        }
    }
    s->masked_id[s->n_masked] = id;
    s->masked_z[s->n_masked] = msv_clean(z[id]);
    s->n_masked++;
    z[id] = -INFINITY;
}


static inline msv_vf
msv_vsel(msv_vi mask, msv_vf a, msv_vf b)
{
    return (msv_vf) ((mask & (msv_vi) a) | (~mask & (msv_vi) b));
}


/* Sanitize, divide by the temperature, find the max and its lowest id,
 * count the finite; four lanes at a time, without branches. */
static void
msv_dense(struct msv_sampler *s, float *z, struct msv_pass *ps)
{
    int       l;
    float     x, m, temp;
    msv_vf    v, y, mv, tv;
    msv_vi    fin, nv, iv, av, big;
    uint32_t  i, n, n_fin, amax;

    const msv_vf  ninf = { -INFINITY, -INFINITY, -INFINITY, -INFINITY };
    const msv_vf  fmax = { FLT_MAX, FLT_MAX, FLT_MAX, FLT_MAX };
    const msv_vf  fmin = { -FLT_MAX, -FLT_MAX, -FLT_MAX, -FLT_MAX };
    const msv_vi  step = { MSV_VW, MSV_VW, MSV_VW, MSV_VW };

    temp = ps->temp;
    tv = (msv_vf) { temp, temp, temp, temp };
    mv = ninf;
    nv = (msv_vi) { 0, 0, 0, 0 };
    iv = (msv_vi) { 0, 1, 2, 3 };
    av = iv;
    n = s->vocab - s->vocab % MSV_VW;

    for (i = 0; i < n; i += MSV_VW) {
        memcpy(&v, z + i, sizeof(v));
        fin = v > ninf;                         /* false for NaN, -inf */
        v = msv_vsel(fin, v, ninf);
        v = msv_vsel(v < fmax, v, fmax);        /* +inf */
        if (temp != 1.0f) {
            y = v / tv;
            y = msv_vsel(y < fmax, y, fmax);
            v = msv_vsel((y >= fmin) | ~fin, y, fmin);
        }
        memcpy(z + i, &v, sizeof(v));

        big = v > mv;                           /* the first max per lane */
        mv = msv_vsel(big, v, mv);
        av = (big & iv) | (~big & av);
        nv -= fin;
        iv += step;
    }

    m = -INFINITY;
    amax = 0;
    n_fin = 0;
    for (l = 0; l < MSV_VW; l++) {
        n_fin += (uint32_t) nv[l];
        if (mv[l] > m || (mv[l] == m && m != -INFINITY
                          && (uint32_t) av[l] < amax))
        {
            m = mv[l];
            amax = (uint32_t) av[l];
        }
    }

    for (i = n; i < s->vocab; i++) {
        x = msv_clean(z[i]);
        if (temp != 1.0f) {
            x = msv_temp_div(x, temp);
        }
        z[i] = x;
        if (x != -INFINITY) {
            n_fin++;
            if (x > m) {
                m = x;
                amax = i;
            }
        }
    }

    ps->n_fin = n_fin;
    ps->amax = amax;
    ps->m = m;
}


/* ------------------------------------------------------------------ */
/* Support selection                                                    */

/* The k best of the dense support into s->cand (sorted if asked); the
 * count, min(k, |dense support|).  One pass in id order keeps a buffer
 * of candidates over a bar: when it fills, quickselect keeps the best k
 * and the bar rises to the k-th of them.  Ids come in ascending order,
 * so a later id with the bar's value ranks below it: "z > bar" is exact. */
static uint32_t
msv_best(struct msv_sampler *s, const float *z, const struct msv_set *S,
    uint32_t k, int sorted)
{
    float     lo;
    uint32_t  i, j, n, cap, V = s->vocab;
    uint64_t  worst;

    cap = V / 8 < MSV_BEST_SLACK ? V / 8 : MSV_BEST_SLACK;
    cap = k + (k > cap ? k : cap);
    cap = cap < V ? cap : V;
    lo = S->lo;
    n = 0;

    for (i = msv_next(z, 0, V, lo); i < V; i = msv_next(z, i + 1, V, lo)) {
        s->cand[n++] = msv_rank_key(z[i], i);
        if (n == cap && n > k) {
            msv_select(s->cand, n, k, s->tmp);
            n = k;
            worst = 0;
            for (j = 0; j < k; j++) {
                worst = s->cand[j] > worst ? s->cand[j] : worst;
            }
            lo = nextafterf(z[(uint32_t) worst], INFINITY);
        }
    }

    if (n > k) {
        msv_select(s->cand, n, k, s->tmp);
        n = k;
    }
    if (sorted) {
        msv_sort(s->cand, n, s->tmp);
    }
    return n;
}


/* Top-p over a sorted list: the shortest prefix whose weight reaches
 * top_p times the list's weight. */
static uint32_t
msv_top_p_list(struct msv_sampler *s, const float *z,
    const struct msv_set *S, float top_p)
{
    double    tau;
    uint32_t  j;
    uint64_t  q, w, c;

    w = 0;
    for (j = 0; j < S->n; j++) {
        q = msv_weight((double) z[(uint32_t) s->cand[j]] - S->m);
        s->tmp[j] = q;
        w += q;
    }

    tau = (double) top_p * (double) w;
    c = 0;
    for (j = 0; j < S->n; j++) {
        c += s->tmp[j];
        if ((double) c >= tau) {
            return j + 1;
        }
    }
    return S->n;
}


/* Top-p over the dense support: sum the weights per 1/8-nat bin below
 * the max, find the bin where the cumulative weight reaches the target,
 * and sort only the ids down to that bin. */
static uint32_t
msv_top_p_dense(struct msv_sampler *s, const float *z,
    const struct msv_set *S, float top_p)
{
    float           lo, qlo;
    double          d, tau;
    uint32_t        i, bmax, n, V = s->vocab;
    uint64_t        q, w, c;
    struct msv_set  C;

    /* ids below the cut weigh 0 */
    qlo = msv_floor((float) S->m, MSV_Q_CUT);
    lo = qlo > S->lo ? qlo : S->lo;

    memset(s->mass, 0, sizeof(s->mass));
    w = 0;
    for (i = msv_next(z, 0, V, lo); i < V; i = msv_next(z, i + 1, V, lo)) {
        d = (double) z[i] - S->m;
        q = msv_weight(d);
        if (q == 0) {
            continue;
        }
        s->mass[(uint32_t) (-d * MSV_MASS_SCALE)] += q;
        w += q;
    }

    tau = (double) top_p * (double) w;

    /* bins are prefixes of the rank order, so the exact prefix sum at the
     * end of bin bmax is c: the nucleus ends inside bins 0..bmax, whose
     * ids have d > -(bmax + 1) / 8 */
    c = 0;
    for (bmax = 0; bmax < MSV_MASS_BINS - 1; bmax++) {
        c += s->mass[bmax];
        if ((double) c >= tau) {
            break;
        }
    }

    C = *S;
    C.lo = msv_floor((float) S->m,
                     nextafter(-(double) (bmax + 1) / MSV_MASS_SCALE,
                               INFINITY));
    C.lo = C.lo > lo ? C.lo : lo;
    n = msv_best(s, z, &C, V, 1);

    c = 0;
    for (i = 0; i < n; i++) {
        c += msv_weight((double) z[(uint32_t) s->cand[i]] - S->m);
        if ((double) c >= tau) {
            return i + 1;
        }
    }
    return n;
}


/* ------------------------------------------------------------------ */
/* The race: argmax over S of z' + Gumbel(seed, t, id), ties to the
 * lower id.  An id with z' + gbound below the best key cannot win, nor
 * one whose bits' bucket bound keeps it below: the logs are taken only
 * for ids that may.                                                     */

/* The race state; candidates queue up by four for msv_philox_bits4. */
struct msv_racer {
    const struct msv_sampler  *s;
    uint64_t                   seed;
    uint32_t                   t;
    uint32_t                   tok;
    double                     best;
    uint32_t                   n;
    uint32_t                   id[4];
    double                     x[4];
};

static void
msv_racer_flush(struct msv_racer *r)
{
    double    key;
    uint32_t  l, id, bits[4];

    for (l = r->n; l < 4; l++) {
        r->id[l] = r->id[0];
    }
    msv_philox_bits4(r->seed, r->t, r->id, bits);

    for (l = 0; l < r->n; l++) {
        if (r->x[l] + r->s->gtab[bits[l] >> MSV_GTAB_SHIFT] < r->best) {
            continue;
        }
        id = r->id[l];
        key = r->x[l] + msv_gumbel(bits[l]);
        if (key > r->best || (key == r->best && id < r->tok)) {
            r->best = key;
            r->tok = id;
        }
    }
    r->n = 0;
}

/* Race id with logit x, unless it cannot reach the best key so far. */
static inline void
msv_racer_add(struct msv_racer *r, uint32_t id, double x)
{
    if (x + r->s->gbound < r->best) {
        return;
    }
    r->id[r->n] = id;
    r->x[r->n] = x;
    if (++r->n == 4) {
        msv_racer_flush(r);
    }
}

static void
msv_racer_init(struct msv_racer *r, const struct msv_sampler *s,
    uint64_t seed, uint32_t t)
{
    r->s = s;
    r->seed = seed;
    r->t = t;
    r->tok = UINT32_MAX;
    r->best = -INFINITY;
    r->n = 0;
}

static int32_t
msv_racer_done(struct msv_racer *r)
{
    if (r->n > 0) {
        msv_racer_flush(r);
    }
    return (int32_t) r->tok;
}


static int32_t
msv_race_list(const struct msv_sampler *s, const float *z,
    const struct msv_set *S, uint64_t seed, uint32_t t)
{
    double            x;
    uint32_t          j, id;
    struct msv_racer  r;

    if (S->n == 1) {
        return (int32_t) (uint32_t) s->cand[0];
    }

    msv_racer_init(&r, s, seed, t);
    for (j = 0; j < S->n; j++) {
        id = (uint32_t) s->cand[j];
        x = z[id];
        if (S->sorted && x + s->gbound < r.best) {
            break;              /* the rest rank lower still */
        }
        msv_racer_add(&r, id, x);
    }
    return msv_racer_done(&r);
}


static int32_t
msv_race_dense(const struct msv_sampler *s, const float *z,
    const struct msv_set *S, uint32_t amax, uint64_t seed, uint32_t t)
{
    uint32_t          i;
    struct msv_racer  r;

    /* start from the max: it bounds the rest best */
    msv_racer_init(&r, s, seed, t);
    r.tok = amax;
    r.best = (double) z[amax] + msv_philox_gumbel(seed, t, amax);

    for (i = msv_next(z, 0, s->vocab, S->lo); i < s->vocab;
         i = msv_next(z, i + 1, s->vocab, S->lo))
    {
        if (i != amax) {
            msv_racer_add(&r, i, z[i]);
        }
    }
    return msv_racer_done(&r);
}


/* ------------------------------------------------------------------ */
/* Capture                                                              */

/* log sum over S of e^(z' - max), the log of an exact fixed-point sum,
 * so it does not depend on the order the support is visited in. */
static double
msv_lse(const struct msv_sampler *s, const float *z, const struct msv_set *S)
{
    uint32_t   i;
    uint64_t   hi, lo, t;

    hi = 0;
    lo = 0;
    if (S->list) {
        for (i = 0; i < S->n; i++) {
            t = msv_lse_term((double) z[(uint32_t) s->cand[i]] - S->m);
            lo += t;
            hi += lo < t;
        }
    } else {
        for (i = msv_next(z, 0, s->vocab, S->lo); i < s->vocab;
             i = msv_next(z, i + 1, s->vocab, S->lo))
        {
            t = msv_lse_term((double) z[i] - S->m);
            lo += t;
            hi += lo < t;
        }
    }

    /* the max contributes 2^62, so the log is >= 0 */
    return msv_lse_log(hi, lo);
}


/* The min(k, |S|) best of S with their logprobs into s->top. */
static uint32_t
msv_top_logprobs(struct msv_sampler *s, const float *z, struct msv_set *S,
    uint32_t k, double lse)
{
    uint32_t  j, n, id;

    if (S->list) {
        n = k < S->n ? k : S->n;
        if (!S->sorted) {
            if (n < S->n) {
                msv_select(s->cand, S->n, n, s->tmp);
            }
            msv_sort(s->cand, n, s->tmp);
            /* the first n are now in rank order; the rest are not */
            S->sorted = n == S->n;
        }
    } else {
        n = msv_best(s, z, S, k, 1);
    }

    for (j = 0; j < n; j++) {
        id = (uint32_t) s->cand[j];
        s->top[j].id = (int32_t) id;
        s->top[j].lp = msv_lp((double) z[id] - S->m, lse);
    }
    return n;
}


/* S in s->ids, ascending; its size. */
static uint32_t
msv_support_ids(struct msv_sampler *s, const float *z,
    const struct msv_set *S)
{
    float     lo;
    uint32_t  i, n;
    uint64_t  last;

    n = 0;

    if (!S->list) {
        for (i = msv_next(z, 0, s->vocab, S->lo); i < s->vocab;
             i = msv_next(z, i + 1, s->vocab, S->lo))
        {
            s->ids[n++] = (int32_t) i;
        }
        return n;
    }

    if ((uint64_t) S->n * 8 <= s->vocab) {
        /* small: sort the ids */
        for (i = 0; i < S->n; i++) {
            s->tmp[i] = (uint32_t) s->cand[i];
        }
        msv_sort(s->tmp, S->n, s->cand);
        for (i = 0; i < S->n; i++) {
            s->ids[i] = (int32_t) s->tmp[i];
        }
        return S->n;
    }

    /* large: S is every finite id ranked no lower than its last */
    last = 0;
    for (i = 0; i < S->n; i++) {
        if (s->cand[i] > last) {
            last = s->cand[i];
        }
    }
    lo = z[(uint32_t) last];
    for (i = msv_next(z, 0, s->vocab, lo); i < s->vocab;
         i = msv_next(z, i + 1, s->vocab, lo))
    {
        if (msv_rank_key(z[i], i) <= last) {
            s->ids[n++] = (int32_t) i;
        }
    }
    return n;
}


/* ------------------------------------------------------------------ */
/* Selection and sorting of 64-bit keys                                 */

static void
msv_isort(uint64_t *a, uint32_t n)
{
    uint32_t  i, j;
    uint64_t  v;

    for (i = 1; i < n; i++) {
        v = a[i];
        for (j = i; j > 0 && a[j - 1] > v; j--) {
            a[j] = a[j - 1];
        }
        a[j] = v;
    }
}


static inline void
msv_swap(uint64_t *a, uint32_t i, uint32_t j)
{
    uint64_t  v = a[i];

    a[i] = a[j];
    a[j] = v;
}


/* Reorder a[0..n) so that a[0..k) are its k smallest (keys distinct,
 * 0 < k < n): quickselect, median-of-three pivots, and a radix sort of
 * what is left if the partitions keep coming out lopsided. */
static void
msv_select(uint64_t *a, uint32_t n, uint32_t k, uint64_t *tmp)
{
    int       budget;
    uint32_t  lo, hi, mid, st, j, pi;
    uint64_t  pv, x, y, w;

    lo = 0;
    hi = n;
    budget = 64;

    while (lo < k && k < hi && hi - lo > MSV_SMALL_SORT) {
        if (budget-- == 0) {
            msv_sort(a + lo, hi - lo, tmp);
            return;
        }

        mid = lo + (hi - lo) / 2;
        x = a[lo];
        y = a[mid];
        w = a[hi - 1];
        if ((x < y) == (y < w)) {
            pi = mid;
        } else if ((y < x) == (x < w)) {
            pi = lo;
        } else {
            pi = hi - 1;
        }

        msv_swap(a, pi, hi - 1);
        pv = a[hi - 1];
        st = lo;
        for (j = lo; j < hi - 1; j++) {
            if (a[j] < pv) {
                msv_swap(a, j, st++);
            }
        }
        msv_swap(a, st, hi - 1);

        /* a[lo..st) < a[st] < a(st..hi) */
        if (k < st) {
            hi = st;
        } else {
            lo = st + 1;
        }
    }

    if (lo < k && k < hi) {
        msv_isort(a + lo, hi - lo);
    }
}


/* Ascending sort: LSD radix on bytes, skipping bytes all keys share. */
static void
msv_sort(uint64_t *a, uint32_t n, uint64_t *tmp)
{
    int        d;
    uint32_t   cnt[8][256], i, c, sum;
    uint64_t   v, *src, *dst, *t;

    if (n <= MSV_SMALL_SORT) {
        msv_isort(a, n);
        return;
    }

    memset(cnt, 0, sizeof(cnt));
    for (i = 0; i < n; i++) {
        v = a[i];
        for (d = 0; d < 8; d++) {
            cnt[d][(v >> (8 * d)) & 0xff]++;
        }
    }

    src = a;
    dst = tmp;
    for (d = 0; d < 8; d++) {
        if (cnt[d][(src[0] >> (8 * d)) & 0xff] == n) {
            continue;
        }
        sum = 0;
        for (i = 0; i < 256; i++) {
            c = cnt[d][i];
            cnt[d][i] = sum;
            sum += c;
        }
        for (i = 0; i < n; i++) {
            v = src[i];
            dst[cnt[d][(v >> (8 * d)) & 0xff]++] = v;
        }
        t = src;
        src = dst;
        dst = t;
    }

    if (src != a) {
        memcpy(a, src, (size_t) n * sizeof(*a));
    }
}
