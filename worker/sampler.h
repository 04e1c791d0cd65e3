/*
 * sampler.h: the sampler contract (docs/SAMPLER.md) on fp32 logits, with
 * mask capture.  The CPU implementation is the reference the GPU sampler
 * must match.
 */

#ifndef MSV_SAMPLER_H
#define MSV_SAMPLER_H

#include <stdint.h>

#include "../shm/msv_shm.h"

#ifdef __cplusplus
extern "C" {
#endif

struct msv_sample_req {
    const struct msv_params  *p;
    const struct msv_bias    *bias;       /* p->n_bias entries */
    uint64_t                  seed;       /* the seed in use */
    uint32_t                  t;          /* output position */
    const int32_t            *prompt;
    uint32_t                  n_prompt;
    const int32_t            *out;        /* tokens sampled so far (t) */
    const int32_t            *eos;        /* model eos ids */
    uint32_t                  n_eos;
};

struct msv_sample_out {
    int32_t          token;
    float            logprob;    /* lp(token) over S (0 when greedy) */
    uint32_t         n_support;  /* |S|, filled when mask_mode != OFF */
    int32_t         *ids;        /* S ascending (sampler-owned scratch) */
    float           *lps;        /* lp of each id (support mode) */
    uint32_t         n_top;      /* min(logprobs, |S|) when logprobs >= 0 */
    struct msv_top  *top;        /* best first, ties by lower id */
};

struct msv_sampler;

struct msv_sampler *msv_sampler_new(uint32_t vocab);
void msv_sampler_free(struct msv_sampler *s);

/* Sample one token from logits[vocab] (modified in place).  Only the
 * capture the request asks for is done.  0, or -1 on invalid params. */
int msv_sample(struct msv_sampler *s, float *logits,
    const struct msv_sample_req *rq, struct msv_sample_out *out);

/* Uniform in (0, 1) from Philox4x32-10 keyed by seed, counter (t, id). */
float msv_philox_uniform(uint64_t seed, uint32_t t, uint32_t id);

#ifdef __cplusplus
}
#endif

#endif /* MSV_SAMPLER_H */
