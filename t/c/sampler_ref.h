/*
 * sampler_ref.h: an independent brute-force implementation of the
 * sampler contract (docs/SAMPLER.md), for the tests and the benchmark:
 * every step written out plainly, the whole vocabulary sorted, sums in
 * double and long double.  Header-only; include it once per program.
 */

#ifndef MSV_SAMPLER_REF_H
#define MSV_SAMPLER_REF_H

/* the reference rounds every float operation on its own, as the
 * contract does (this applies to the rest of the including file) */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize ("fp-contract=off")
#endif

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sample_contract.h"
#include "sampler.h"


/* ------------------------------------------------------------------ */
/* A request: raw logits and everything msv_sample_req points at        */

#define MSV_REF_MAX_HIST  40

struct msv_ref_case {
    uint32_t           V;
    float             *z0;                  /* raw logits */
    struct msv_params  p;
    struct msv_bias    bias[8];
    int32_t            prompt[MSV_REF_MAX_HIST];
    uint32_t           n_prompt;
    int32_t            out[MSV_REF_MAX_HIST];
    uint32_t           t;
    int32_t            eos[2];
    uint32_t           n_eos;
    uint64_t           seed;
};

static void
msv_ref_req(const struct msv_ref_case *c, struct msv_sample_req *rq)
{
    memset(rq, 0, sizeof(*rq));
    rq->p = &c->p;
    rq->bias = c->bias;
    rq->seed = c->seed;
    rq->t = c->t;
    rq->prompt = c->prompt;
    rq->n_prompt = c->n_prompt;
    rq->out = c->out;
    rq->eos = c->eos;
    rq->n_eos = c->n_eos;
}

/* Defaults: temperature 1, no truncation, no penalties, no capture. */
static void
msv_ref_params(struct msv_params *p)
{
    memset(p, 0, sizeof(*p));
    p->max_tokens = 16;
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->top_k = -1;
    p->repetition_penalty = 1.0f;
    p->logprobs = -1;
}


/* ------------------------------------------------------------------ */
/* The reference                                                        */

struct msv_ref {
    float        *zp;       /* processed logits */
    uint32_t     *order;    /* finite ids, rank order */
    uint64_t     *q;        /* top-p weights along order */
    uint32_t      n_fin;
    uint32_t      n1;       /* after min-p and top-k */
    uint32_t      n;        /* |S|: S = order[0..n) */
    double        tau;      /* top-p target, when top-p applies */
    long double   lse;
    int32_t       token;
};

static int
msv_ref_alloc(struct msv_ref *r, uint32_t V)
{
    r->zp = malloc(V * sizeof(float));
    r->order = malloc(V * sizeof(uint32_t));
    r->q = malloc(V * sizeof(uint64_t));
    return r->zp != NULL && r->order != NULL && r->q != NULL ? 0 : -1;
}

static void
msv_ref_free(struct msv_ref *r)
{
    free(r->zp);
    free(r->order);
    free(r->q);
}

static const float  *msv_ref_z;

static int
msv_ref_cmp(const void *a, const void *b)
{
    uint32_t  i = *(const uint32_t *) a, j = *(const uint32_t *) b;

    if (msv_ref_z[i] != msv_ref_z[j]) {
        return msv_ref_z[i] > msv_ref_z[j] ? -1 : 1;
    }
    return i < j ? -1 : (i > j);
}

static float
msv_ref_sat(float x)
{
    return x > FLT_MAX ? FLT_MAX : (x < -FLT_MAX ? -FLT_MAX : x);
}

static double
msv_ref_gumbel(uint64_t seed, uint32_t t, uint32_t id)
{
    double  u = ((double) msv_philox_bits(seed, t, id) + 0.5) / 4294967296.0;

    return -log(-log(u));
}

static void
msv_ref_run(const struct msv_ref_case *c, struct msv_ref *r)
{
    int                       *seen, *masked;
    uint32_t                   i, j, V = c->V, *cnt, n_out_masked;
    float                      x, fc, T = c->p.temperature;
    double                     m, best, key;
    long double                sum;
    uint64_t                   w, acc;
    const struct msv_params   *p = &c->p;

    seen = calloc(V, sizeof(*seen));
    masked = calloc(V, sizeof(*masked));
    cnt = calloc(V, sizeof(*cnt));

    for (i = 0; i < V; i++) {
        x = c->z0[i];
        if (isnan(x) || x == -INFINITY) {
            x = -INFINITY;
        } else if (x == INFINITY) {
            x = FLT_MAX;
        }
        r->zp[i] = x;
    }
    for (i = 0; i < p->n_bias; i++) {
        j = (uint32_t) c->bias[i].id;
        if (isfinite(r->zp[j])) {
            r->zp[j] = msv_ref_sat(r->zp[j] + c->bias[i].value);
        }
    }
    if (p->repetition_penalty != 1.0f) {
        for (i = 0; i < c->n_prompt; i++) {
            seen[c->prompt[i]] = 1;
        }
        for (i = 0; i < c->t; i++) {
            seen[c->out[i]] = 1;
        }
        for (i = 0; i < V; i++) {
            if (seen[i] && isfinite(r->zp[i])) {
                x = r->zp[i];
                r->zp[i] = msv_ref_sat(x > 0 ? x / p->repetition_penalty
                                         : x * p->repetition_penalty);
            }
        }
    }
    /* the output history is read only by the penalties */
    for (i = 0; (p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f)
                && i < c->t; i++)
    {
        cnt[c->out[i]]++;
    }
    for (i = 0; i < V; i++) {
        if (cnt[i] > 0 && isfinite(r->zp[i])) {
            fc = p->frequency_penalty * (float) cnt[i];
            x = msv_ref_sat(r->zp[i] - fc);
            r->zp[i] = msv_ref_sat(x - p->presence_penalty);
        }
    }
    if (c->t < p->min_tokens) {
        for (i = 0; i < p->n_stop; i++) {
            masked[p->stop_ids[i]] = 1;
        }
        for (i = 0; !p->ignore_eos && i < c->n_eos; i++) {
            masked[c->eos[i]] = 1;
        }
        n_out_masked = 0;
        for (i = 0; i < V; i++) {
            n_out_masked += !masked[i] && isfinite(r->zp[i]);
        }
        for (i = 0; n_out_masked > 0 && i < V; i++) {
            if (masked[i]) {
                r->zp[i] = -INFINITY;
            }
        }
    }
    for (i = 0; T > 0.0f && i < V; i++) {
        if (isfinite(r->zp[i])) {
            r->zp[i] = msv_ref_sat(r->zp[i] / T);
        }
    }

    r->n_fin = 0;
    for (i = 0; i < V; i++) {
        if (isfinite(r->zp[i])) {
            r->order[r->n_fin++] = i;
        }
    }
    msv_ref_z = r->zp;
    qsort(r->order, r->n_fin, sizeof(*r->order), msv_ref_cmp);

    r->tau = -1.0;
    r->token = -1;
    r->n1 = 0;
    r->n = 0;
    r->lse = 0;
    if (r->n_fin == 0) {
        goto done;
    }

    if (T == 0.0f) {
        r->n1 = r->n = 1;
        r->lse = r->zp[r->order[0]];
        r->token = (int32_t) r->order[0];
        goto done;
    }

    m = r->zp[r->order[0]];
    r->n1 = r->n_fin;
    if (p->min_p > 0.0f) {
        for (i = 0; i < r->n1; i++) {
            if ((double) r->zp[r->order[i]] - m < log((double) p->min_p)) {
                break;
            }
        }
        r->n1 = i;
    }
    if (p->top_k > 0 && (uint32_t) p->top_k < r->n1) {
        r->n1 = (uint32_t) p->top_k;
    }
    r->n = r->n1;

    if (p->top_p < 1.0f) {
        w = 0;
        for (i = 0; i < r->n1; i++) {
            r->q[i] = (uint64_t) floor(
                ldexp(exp((double) r->zp[r->order[i]] - m), 32) + 0.5);
            w += r->q[i];
        }
        r->tau = (double) p->top_p * (double) w;
        acc = 0;
        for (i = 0; i < r->n1; i++) {
            acc += r->q[i];
            if ((double) acc >= r->tau) {
                break;
            }
        }
        r->n = i + 1;
    }

    sum = 0;
    for (i = 0; i < r->n; i++) {
        sum += expl((long double) r->zp[r->order[i]] - (long double) m);
    }
    r->lse = (long double) m + logl(sum);

    best = -INFINITY;
    for (i = 0; i < r->n; i++) {
        j = r->order[i];
        key = (double) r->zp[j] + msv_ref_gumbel(c->seed, c->t, j);
        if (key > best || (key == best && (int32_t) j < r->token)) {
            best = key;
            r->token = (int32_t) j;
        }
    }

done:
    free(seen);
    free(masked);
    free(cnt);
}



static int
msv_ref_cmp_id(const void *a, const void *b)
{
    uint32_t  x = *(const uint32_t *) a, y = *(const uint32_t *) b;

    return x < y ? -1 : (x > y);
}

/* S of a reference run into ids[0..r->n), ascending. */
static void
msv_ref_support(const struct msv_ref *r, uint32_t *ids)
{
    memcpy(ids, r->order, r->n * sizeof(uint32_t));
    qsort(ids, r->n, sizeof(uint32_t), msv_ref_cmp_id);
}

#endif /* MSV_SAMPLER_REF_H */
