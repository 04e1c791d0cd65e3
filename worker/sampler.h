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

/* Largest vocabulary a sampler takes: ids fit int32 and the top-p
 * weights of a whole vocabulary sum exactly in a double (<= 2^53). */
#define MSV_SAMPLER_MAX_VOCAB  (1u << 21)

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

/*
 * ids, lps and top point into the sampler and stay valid until its next
 * msv_sample() call.  Fields a request did not ask for are 0 / NULL.
 */
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

/* A sampler for one vocabulary size, with all its scratch; one per
 * thread.  NULL with errno set (EINVAL: vocab is 0 or above
 * MSV_SAMPLER_MAX_VOCAB; ENOMEM). */
struct msv_sampler *msv_sampler_new(uint32_t vocab);
void msv_sampler_free(struct msv_sampler *s);

/* Sample one token from logits[vocab] (modified in place).  Only the
 * capture the request asks for is done.  0, or -1 on invalid params. */
int msv_sample(struct msv_sampler *s, float *logits,
    const struct msv_sample_req *rq, struct msv_sample_out *out);

/* One line saying why the last msv_sample() returned -1. */
const char *msv_sampler_error(const struct msv_sampler *s);

/* Uniform in (0, 1) from Philox4x32-10 keyed by seed, counter (t, id):
 * (x + 0.5) * 2^-32 for the 32 random bits x, exact in a double. */
double msv_philox_uniform(uint64_t seed, uint32_t t, uint32_t id);

/* The Gumbel value the race adds to token id at position t:
 * -log(-log(msv_philox_uniform(seed, t, id))). */
double msv_philox_gumbel(uint64_t seed, uint32_t t, uint32_t id);

#ifdef __cplusplus
}
#endif

#endif /* MSV_SAMPLER_H */
