/*
 * kv_direct.h: for code that drives a backend without the scheduler
 * (backend tests, kernel checks, benchmarks).  Each backend made through
 * msv_kvd_create gets its own page allocator (kv.h, no prefix caching),
 * kept in a small table keyed by the backend; msv_kvd_forward fills in a
 * batch's page tables from it.  The worker does not use this: its
 * scheduler owns the allocator.
 */

#ifndef MSV_KV_DIRECT_H
#define MSV_KV_DIRECT_H

#include <stdlib.h>

#include "backend.h"
#include "kv.h"

#define MSV_KVD_MAX  8

struct msv_kvd {
    struct msv_backend  *b;
    struct msv_kv        kv;
    uint32_t             max_len;
    const uint32_t     **pages;       /* [kv.max_seqs] */
    uint32_t            *n_pages;
};

static struct msv_kvd  msv_kvd_tab[MSV_KVD_MAX];


static inline struct msv_kvd *
msv_kvd_of(struct msv_backend *b)
{
    int  i;

    for (i = 0; i < MSV_KVD_MAX; i++) {
        if (b != NULL && msv_kvd_tab[i].b == b) {
            return &msv_kvd_tab[i];
        }
    }
    return NULL;
}


static inline void
msv_kvd_destroy(const struct msv_backend_ops *ops, struct msv_backend *b)
{
    struct msv_kvd  *d = msv_kvd_of(b);

    if (d != NULL) {
        msv_kv_free(&d->kv);
        free(d->pages);
        free(d->n_pages);
        d->b = NULL;
    }
    ops->destroy(b);
}


static inline struct msv_backend *
msv_kvd_create(const struct msv_backend_ops *ops,
    const struct msv_model_config *cfg, const struct msv_weights *w,
    uint32_t max_seqs, uint32_t max_len, uint64_t kv_tokens, int threads,
    char *err, size_t errlen)
{
    int                  i;
    uint32_t             n, pt;
    struct msv_kvd      *d;
    struct msv_backend  *b;

    b = ops->create(cfg, w, max_seqs, max_len, kv_tokens, threads, err,
                    errlen);
    if (b == NULL) {
        return NULL;
    }

    d = NULL;
    for (i = 0; i < MSV_KVD_MAX && d == NULL; i++) {
        if (msv_kvd_tab[i].b == NULL) {
            d = &msv_kvd_tab[i];
        }
    }

    n = ops->kv_pages(b, &pt);
    if (d == NULL || msv_kv_init(&d->kv, n, pt, max_seqs, max_len, 0) != 0) {
        snprintf(err, errlen, "no room for the page allocator of %u pages",
                 n);
        ops->destroy(b);
        return NULL;
    }
    d->b = b;
    d->max_len = max_len;
    d->pages = calloc(max_seqs, sizeof(const uint32_t *));
    d->n_pages = calloc(max_seqs, sizeof(uint32_t));
    if (d->pages == NULL || d->n_pages == NULL) {
        snprintf(err, errlen, "out of memory");
        msv_kvd_destroy(ops, b);
        return NULL;
    }

    return b;
}


/* Pages for n_tokens in all (the old backend kv_reserve): 0, or -1 with
 * nothing taken. */
static inline int
msv_kvd_reserve(struct msv_backend *b, uint32_t seq, uint32_t n_tokens)
{
    struct msv_kvd  *d = msv_kvd_of(b);

    if (d == NULL || n_tokens > d->max_len) {
        return -1;
    }
    return msv_kv_grow(&d->kv, seq, n_tokens);
}


static inline void
msv_kvd_release(struct msv_backend *b, uint32_t seq)
{
    struct msv_kvd  *d = msv_kvd_of(b);

    if (d != NULL) {
        msv_kv_release(&d->kv, seq);
    }
}


static inline uint64_t
msv_kvd_free(struct msv_backend *b)
{
    struct msv_kvd  *d = msv_kvd_of(b);

    return d != NULL ? msv_kv_free_tokens(&d->kv) : 0;
}


/* The batch with each sequence's page table from b's allocator (a
 * sequence id past max_seqs gets none, for the backend to refuse). */
static inline int
msv_kvd_forward(const struct msv_backend_ops *ops, struct msv_backend *b,
    struct msv_batch *bt, float *logits, char *err, size_t errlen)
{
    uint32_t         s, id;
    struct msv_kvd  *d = msv_kvd_of(b);

    if (d != NULL && bt->seq != NULL && bt->n_seqs <= d->kv.max_seqs) {
        for (s = 0; s < bt->n_seqs; s++) {
            id = bt->seq[s];
            d->pages[s] = id < d->kv.max_seqs ? msv_kv_table(&d->kv, id)
                                              : NULL;
            d->n_pages[s] = id < d->kv.max_seqs
                            ? msv_kv_seq_pages(&d->kv, id) : 0;
        }
        bt->pages = d->pages;
        bt->n_pages = d->n_pages;
    } else {
        bt->pages = NULL;
        bt->n_pages = NULL;
    }

    return ops->forward(b, bt, logits, err, errlen);
}

#endif /* MSV_KV_DIRECT_H */
