/*
 * sample_pool.c: the rows of a step sampled on several threads.
 *
 * The caller's thread takes part; the others wait on a condition variable
 * for the next run.  Items are handed out through an atomic counter.  A
 * thread copies each result (support ids, logprobs, top entries) out of
 * its sampler's scratch into its own arena (grown by doubling, addressed
 * by offset), and the pointers are set once every thread is done.
 */

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sample_pool.h"

#define MSV_POOL_MAX  16

struct msv_sample_thread {
    struct msv_sample_pool  *pool;
    struct msv_sampler      *smp;
    uint8_t                 *arena;
    size_t                   cap;
    size_t                   used;
    uint32_t                 id;
    int                      oom;
    pthread_t                tid;
};

struct msv_sample_pool {
    struct msv_sample_thread  t[MSV_POOL_MAX];
    int                       n;
    pthread_mutex_t           mu;
    pthread_cond_t            go;
    pthread_cond_t            done;
    uint64_t                  gen;       /* run number */
    int                       running;   /* helper threads still busy */
    int                       stop;
    struct msv_sample_item   *items;
    uint32_t                  n_items;
    atomic_uint               next;
};


static void *
msv_pool_arena(struct msv_sample_thread *t, size_t bytes)
{
    size_t   cap;
    uint8_t *a;

    bytes = (bytes + 7) & ~(size_t) 7;
    if (t->used + bytes > t->cap) {
        cap = t->cap ? t->cap : 1 << 20;
        while (cap < t->used + bytes) {
            cap *= 2;
        }
        a = realloc(t->arena, cap);
        if (a == NULL) {
            return NULL;
        }
        t->arena = a;
        t->cap = cap;
    }
    t->used += bytes;
    return t->arena + t->used - bytes;
}


static void
msv_pool_work(struct msv_sample_thread *t)
{
    size_t                   ni, nl, nt;
    uint32_t                 i;
    uint8_t                 *p;
    struct msv_sample_pool  *pool = t->pool;
    struct msv_sample_item  *it;

    t->used = 0;

    for ( ;; ) {
        i = atomic_fetch_add_explicit(&pool->next, 1, memory_order_relaxed);
        if (i >= pool->n_items) {
            return;
        }
        it = &pool->items[i];
        it->thread = t->id;
        it->rc = msv_sample(t->smp, it->logits, &it->rq, &it->out);
        if (it->rc != 0) {
            snprintf(it->err, sizeof(it->err), "%s",
                     msv_sampler_error(t->smp));
            continue;
        }

        ni = (size_t) it->out.n_support * 4;
        nl = it->rq.p->mask_mode == MSV_MASK_SUPPORT ? ni : 0;
        nt = (size_t) it->out.n_top * sizeof(struct msv_top);
        it->off = 0;
        if (ni + nl + nt == 0) {
            continue;               /* nothing captured */
        }
        p = msv_pool_arena(t, ni + nl + nt);
        if (p == NULL) {
            it->rc = -1;
            snprintf(it->err, sizeof(it->err), "out of memory");
            continue;
        }
        it->off = (size_t) (p - t->arena);
        if (ni) {
            memcpy(p, it->out.ids, ni);
        }
        if (nl) {
            memcpy(p + ni, it->out.lps, nl);
        }
        if (nt) {
            memcpy(p + ni + nl, it->out.top, nt);
        }
    }
}


static void *
msv_pool_main(void *arg)
{
    uint64_t                  seen = 0;
    struct msv_sample_thread *t = arg;
    struct msv_sample_pool   *p = t->pool;

    pthread_mutex_lock(&p->mu);
    for ( ;; ) {
        while (p->gen == seen && !p->stop) {
            pthread_cond_wait(&p->go, &p->mu);
        }
        if (p->stop) {
            break;
        }
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);

        msv_pool_work(t);

        pthread_mutex_lock(&p->mu);
        if (--p->running == 0) {
            pthread_cond_signal(&p->done);
        }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}


struct msv_sample_pool *
msv_sample_pool_new(uint32_t vocab, int threads)
{
    int                      i;
    long                     ncpu;
    struct msv_sample_pool  *p;

    if (threads <= 0) {
        ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        threads = ncpu > 0 ? (int) ncpu : 1;
    }
    if (threads > MSV_POOL_MAX) {
        threads = MSV_POOL_MAX;
    }

    p = calloc(1, sizeof(*p));
    if (p == NULL) {
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);

    for (i = 0; i < threads; i++) {
        p->t[i].pool = p;
        p->t[i].id = (uint32_t) i;
        p->t[i].smp = msv_sampler_new(vocab);
        if (p->t[i].smp == NULL) {
            p->n = i;
            msv_sample_pool_free(p);
            return NULL;
        }
        p->n = i + 1;
        if (i > 0 && pthread_create(&p->t[i].tid, NULL, msv_pool_main,
                                    &p->t[i]) != 0)
        {
            msv_sampler_free(p->t[i].smp);
            p->n = i;
            break;
        }
    }

    return p;
}


void
msv_sample_pool_run(struct msv_sample_pool *p, struct msv_sample_item *items,
    uint32_t n)
{
    uint32_t                 i;
    uint8_t                 *base;
    size_t                   ni, nl;
    struct msv_sample_item  *it;

    p->items = items;
    p->n_items = n;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);

    if (p->n > 1 && n > 1) {
        pthread_mutex_lock(&p->mu);
        p->running = p->n - 1;
        p->gen++;
        pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->mu);
    }

    msv_pool_work(&p->t[0]);

    if (p->n > 1 && n > 1) {
        pthread_mutex_lock(&p->mu);
        while (p->running > 0) {
            pthread_cond_wait(&p->done, &p->mu);
        }
        pthread_mutex_unlock(&p->mu);
    }

    /* the arenas are final now: point each result into its arena */
    for (i = 0; i < n; i++) {
        it = &items[i];
        if (it->rc != 0) {
            continue;
        }
        if (p->t[it->thread].arena == NULL) {
            continue;               /* this thread captured nothing */
        }
        base = p->t[it->thread].arena + it->off;
        ni = (size_t) it->out.n_support * 4;
        nl = it->rq.p->mask_mode == MSV_MASK_SUPPORT ? ni : 0;
        it->out.ids = (int32_t *) base;
        it->out.lps = (float *) (base + ni);
        it->out.top = (struct msv_top *) (base + ni + nl);
    }
}


int
msv_sample_pool_threads(const struct msv_sample_pool *p)
{
    return p->n;
}


void
msv_sample_pool_free(struct msv_sample_pool *p)
{
    int  i;

    if (p == NULL) {
        return;
    }

    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);

    for (i = 0; i < p->n; i++) {
        if (i > 0) {
            pthread_join(p->t[i].tid, NULL);
        }
        msv_sampler_free(p->t[i].smp);
        free(p->t[i].arena);
    }

    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p);
}
