/*
 * test_sample_pool.c: the rows of a step sampled on several threads give
 * exactly what one sampler gives row by row, in every mask mode, for any
 * thread count, and runs after runs don't leak into each other.
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sample_pool.h"
#include "sampler.h"
#include "tap.h"

#define V      3001
#define ROWS   97

static uint64_t  rng = 88172645463325252ULL;


static double
unif(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double) (rng >> 11) / 9007199254740992.0;
}


struct row {
    struct msv_params  p;
    float             *logits;
    int32_t            prompt[4];
    int32_t            out[3];      /* tokens sampled before t = 3 */
    int32_t            tok;
    float              lp;
    uint32_t           n;
    int32_t           *ids;
    float             *lps;
    uint32_t           n_top;
    struct msv_top     top[8];
};


static void
make_rows(struct row *r)
{
    int       i, j;
    int32_t   ks[] = { -1, 1, 20, 1000, V };
    float     ps[] = { 1.0f, 0.95f, 0.5f };

    for (i = 0; i < ROWS; i++) {
        memset(&r[i].p, 0, sizeof(r[i].p));
        r[i].p.max_tokens = 4;
        r[i].p.temperature = i % 11 == 0 ? 0.0f : 0.5f + (float) unif();
        r[i].p.top_k = ks[i % 5];
        r[i].p.top_p = ps[i % 3];
        r[i].p.min_p = i % 4 == 0 ? 0.05f : 0.0f;
        r[i].p.repetition_penalty = i % 6 == 0 ? 1.3f : 1.0f;
        r[i].p.frequency_penalty = i % 7 == 0 ? 0.4f : 0.0f;
        r[i].p.mask_mode = (uint32_t) (i % 3);
        r[i].p.logprobs = i % 5 == 0 ? 8 : -1;
        r[i].p.has_seed = 1;
        r[i].p.seed = 1000 + (uint64_t) i;
        r[i].logits = malloc(V * sizeof(float));
        for (j = 0; j < V; j++) {
            /* coarse values: plenty of ties */
            r[i].logits[j] = (float) floor(unif() * 40.0) / 4.0f;
        }
        for (j = 0; j < 4; j++) {
            r[i].prompt[j] = (int32_t) (unif() * V);
        }
        for (j = 0; j < 3; j++) {
            r[i].out[j] = (int32_t) (unif() * V);
        }
    }
}


static void
fill_req(struct msv_sample_req *rq, struct row *r)
{
    memset(rq, 0, sizeof(*rq));
    rq->p = &r->p;
    rq->seed = r->p.seed;
    rq->t = 3;
    rq->prompt = r->prompt;
    rq->n_prompt = 4;
    rq->out = r->out;
}


int
main(void)
{
    int                      threads[] = { 1, 2, 5, 16 }, ti, rep, bad;
    uint32_t                 i;
    float                   *work;
    struct row               r[ROWS];
    struct msv_sampler      *smp;
    struct msv_sample_out    o;
    struct msv_sample_req    rq;
    struct msv_sample_pool  *pool;
    struct msv_sample_item   it[ROWS];

    make_rows(r);
    work = malloc(V * sizeof(float));
    smp = msv_sampler_new(V);

    /* the reference: one sampler, row by row, results copied out */
    for (i = 0; i < ROWS; i++) {
        memcpy(work, r[i].logits, V * sizeof(float));
        fill_req(&rq, &r[i]);
        if (msv_sample(smp, work, &rq, &o) != 0) {
            tap_ok(0, "reference sample of row %u: %s", i,
                   msv_sampler_error(smp));
            return tap_done();
        }
        r[i].tok = o.token;
        r[i].lp = o.logprob;
        r[i].n = o.n_support;
        r[i].ids = malloc((o.n_support + 1) * sizeof(int32_t));
        r[i].lps = malloc((o.n_support + 1) * sizeof(float));
        /* o.ids and o.top may be NULL when empty: memcpy wants neither */
        if (o.n_support) {
            memcpy(r[i].ids, o.ids, o.n_support * sizeof(int32_t));
        }
        if (r[i].p.mask_mode == MSV_MASK_SUPPORT && o.n_support) {
            memcpy(r[i].lps, o.lps, o.n_support * sizeof(float));
        }
        r[i].n_top = o.n_top;
        if (o.n_top) {
            memcpy(r[i].top, o.top, o.n_top * sizeof(struct msv_top));
        }
    }

    for (ti = 0; ti < 4; ti++) {
        pool = msv_sample_pool_new(V, threads[ti]);
        tap_ok(pool != NULL && msv_sample_pool_threads(pool) == threads[ti],
               "pool of %d threads", threads[ti]);
        if (pool == NULL) {
            continue;
        }

        for (rep = 0; rep < 3; rep++) {
            float  *lg = malloc((size_t) ROWS * V * sizeof(float));

            for (i = 0; i < ROWS; i++) {
                memcpy(lg + (size_t) i * V, r[i].logits, V * sizeof(float));
                it[i].logits = lg + (size_t) i * V;
                fill_req(&it[i].rq, &r[i]);
            }

            msv_sample_pool_run(pool, it, ROWS);

            bad = 0;
            for (i = 0; i < ROWS; i++) {
                const struct msv_sample_out  *q = &it[i].out;

                if (it[i].rc != 0 || q->token != r[i].tok
                    || memcmp(&q->logprob, &r[i].lp, 4) != 0
                    || q->n_support != r[i].n || q->n_top != r[i].n_top
                    || (r[i].n && memcmp(q->ids, r[i].ids, r[i].n * 4) != 0)
                    || (r[i].p.mask_mode == MSV_MASK_SUPPORT && r[i].n
                        && memcmp(q->lps, r[i].lps, r[i].n * 4) != 0)
                    || (r[i].n_top
                        && memcmp(q->top, r[i].top,
                                  r[i].n_top * sizeof(struct msv_top)) != 0))
                {
                    bad++;
                }
            }
            tap_ok(bad == 0, "%d threads, run %d: %u rows bit-identical to "
                   "one sampler (%d differ)", threads[ti], rep, ROWS, bad);
            free(lg);
        }

        /* a run of one row, then of none */
        memcpy(work, r[3].logits, V * sizeof(float));
        it[0].logits = work;
        fill_req(&it[0].rq, &r[3]);
        msv_sample_pool_run(pool, it, 0);
        msv_sample_pool_run(pool, it, 1);
        tap_ok(it[0].rc == 0 && it[0].out.token == r[3].tok,
               "%d threads: an empty run, then a single row", threads[ti]);

        msv_sample_pool_free(pool);
    }

    /* bad params are reported per row, the others still sampled */
    pool = msv_sample_pool_new(V, 2);
    for (i = 0; i < 4; i++) {
        it[i].logits = r[i].logits;
        fill_req(&it[i].rq, &r[i]);
    }
    r[2].p.temperature = -1.0f;
    msv_sample_pool_run(pool, it, 4);
    tap_ok(it[2].rc != 0 && it[2].err[0] != '\0'
           && it[0].rc == 0 && it[1].rc == 0 && it[3].rc == 0,
           "an invalid row fails alone: \"%s\"", it[2].err);
    msv_sample_pool_free(pool);

    msv_sampler_free(smp);
    return tap_done();
}
