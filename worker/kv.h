/*
 * kv.h: the KV page allocator, one for every backend.  A backend owns
 * n_pages pages of page_tokens tokens each (ids 0 .. n_pages - 1) and only
 * maps an id to memory; this allocator decides which sequence holds which
 * page.  Pages are reference-counted: a full page of a prompt can be held
 * by many sequences at once (prefix caching, the choices of one request).
 *
 * A page is in one of three places:
 *   free       ref 0, no content worth keeping        (the free stack)
 *   cached     ref 0, full page registered by hash    (the LRU list)
 *   held       ref >= 1, in one or more page tables
 * A cached page is found again by the hash of its tokens chained with the
 * hash of the pages before it, so only a true prefix matches; its tokens
 * are kept and compared on every hit, so a hash collision cannot share a
 * wrong page.  Taking a page takes a free one first, then evicts the least
 * recently released cached page.
 */

#ifndef MSV_KV_H
#define MSV_KV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MSV_KV_NONE  UINT32_MAX

struct msv_kv_seq {
    uint32_t   n_pages;     /* entries in table */
    uint32_t   n_hashed;    /* leading pages registered (or found) by hash */
    uint64_t   hash;        /* chained hash of those pages, 0 for none */
};

struct msv_kv {
    uint32_t            page_tokens;
    uint32_t            n_pages;
    uint32_t            max_seqs;
    uint32_t            pages_per_seq;  /* max_len, in pages */
    int                 caching;        /* register full pages by hash */

    uint32_t           *ref;            /* [n_pages] */
    uint64_t           *hash;           /* [n_pages]: 0, not registered */
    uint64_t           *parent;         /* [n_pages]: hash before it */
    int32_t            *toks;           /* [n_pages][page_tokens] */
    uint32_t           *prev, *next;    /* LRU links; MSV_KV_NONE ends */
    uint32_t            lru_head;       /* oldest: evicted first */
    uint32_t            lru_tail;
    uint32_t            n_cached;       /* pages on the LRU list */
    uint32_t           *bucket;         /* [n_buckets]: first page */
    uint32_t           *chain;          /* [n_pages]: next in its bucket */
    uint32_t            n_buckets;      /* power of two */
    uint32_t           *free_stack;
    uint32_t            n_free;

    uint32_t           *table;          /* [max_seqs][pages_per_seq] */
    struct msv_kv_seq  *seq;            /* [max_seqs] */

    /* counters for the stats page */
    uint64_t            hit_pages;      /* pages found by hash */
    uint64_t            lookup_pages;   /* full prompt pages looked up */
    uint64_t            evictions;      /* cached pages taken for reuse */
};

/* 0, or -1 when out of memory or the sizes are out of range. */
int msv_kv_init(struct msv_kv *kv, uint32_t n_pages, uint32_t page_tokens,
    uint32_t max_seqs, uint32_t max_len, int caching);
void msv_kv_free(struct msv_kv *kv);

/* Pages a sequence could get now: free plus cached-and-unused. */
static inline uint32_t
msv_kv_available(const struct msv_kv *kv)
{
    return kv->n_free + kv->n_cached;
}

/* Tokens' worth of available pages. */
static inline uint64_t
msv_kv_free_tokens(const struct msv_kv *kv)
{
    return (uint64_t) msv_kv_available(kv) * kv->page_tokens;
}

/* Pages needed to hold n tokens. */
static inline uint32_t
msv_kv_pages_for(const struct msv_kv *kv, uint64_t n)
{
    return (uint32_t) ((n + kv->page_tokens - 1) / kv->page_tokens);
}

/* seq's page table: ids of the pages holding its positions in order. */
static inline const uint32_t *
msv_kv_table(const struct msv_kv *kv, uint32_t seq)
{
    return kv->table + (size_t) seq * kv->pages_per_seq;
}

static inline uint32_t
msv_kv_seq_pages(const struct msv_kv *kv, uint32_t seq)
{
    return kv->seq[seq].n_pages;
}

/* Make seq's table cover n_tokens, with new private pages.  All or
 * nothing: 0, or -1 (pool short, n_tokens past max_len, seq out of range)
 * with nothing taken. */
int msv_kv_grow(struct msv_kv *kv, uint32_t seq, uint32_t n_tokens);

/* Drop all of seq's pages: each one's count goes down; a page nobody
 * holds any more is cached if it is registered, else freed.  Pages are let
 * go last first, so a prefix outlives what follows it in the LRU. */
void msv_kv_release(struct msv_kv *kv, uint32_t seq);

/* seq (holding nothing) takes the cached pages that hold the longest
 * prefix of toks[0 .. n) made of at most max_pages full pages.  Returns
 * the number of pages taken (their tokens need no computing). */
uint32_t msv_kv_match(struct msv_kv *kv, uint32_t seq, const int32_t *toks,
    uint32_t n, uint32_t max_pages);

/* seq (holding nothing) takes the first n_pages pages of from's table,
 * whose tokens it has too: the choices of one request sharing the
 * prompt.  Works with caching off as well. */
void msv_kv_share(struct msv_kv *kv, uint32_t seq, uint32_t from,
    uint32_t n_pages);

/* The first n_done tokens of seq (toks) are in its KV now: register its
 * newly full pages by hash so later sequences can find them.  A page whose
 * hash is registered already (another sequence computed the same tokens
 * at the same time) stays private. */
void msv_kv_publish(struct msv_kv *kv, uint32_t seq, const int32_t *toks,
    uint32_t n_done);

/* Forget every cached page (they become free).  For tests and for turning
 * caching off. */
void msv_kv_drop_cache(struct msv_kv *kv);

/* After a weight update: forget every cached page (msv_kv_drop_cache),
 * and let no page held now be found later either: what the holders
 * publish from now on chains from `salt` (nonzero), which no prompt's
 * lookup starts from. */
void msv_kv_seal(struct msv_kv *kv, uint64_t salt);

/* Consistency check for tests: references equal table entries, every
 * page is in exactly one place.  0, or -1 with a message in err. */
int msv_kv_check(const struct msv_kv *kv, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* MSV_KV_H */
