/*
 * sample_pool.h: sample the rows of one step on several threads.  Each
 * thread owns a sampler and an arena the results are copied into, so the
 * scheduler can then write the rows into the ring in batch order.
 * Results don't depend on the number of threads: the sampler is a pure
 * function of each request's logits, history and seed.
 */

#ifndef MSV_SAMPLE_POOL_H
#define MSV_SAMPLE_POOL_H

#include <stdint.h>

#include "sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

struct msv_sample_item {
    float                  *logits;  /* [vocab], modified in place */
    struct msv_sample_req   rq;
    int                     rc;      /* msv_sample's return */
    char                    err[128];
    struct msv_sample_out   out;     /* valid until the next run */

    /* private: where the thread put the results */
    uint32_t                thread;
    size_t                  off;
};

struct msv_sample_pool;

/* threads <= 0: one per core, at most 16.  NULL on failure. */
struct msv_sample_pool *msv_sample_pool_new(uint32_t vocab, int threads);

/* Sample items[0..n) and fill each one's rc and out. */
void msv_sample_pool_run(struct msv_sample_pool *p,
    struct msv_sample_item *items, uint32_t n);

int msv_sample_pool_threads(const struct msv_sample_pool *p);

void msv_sample_pool_free(struct msv_sample_pool *p);

#ifdef __cplusplus
}
#endif

#endif /* MSV_SAMPLE_POOL_H */
