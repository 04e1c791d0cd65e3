/*
 * kv.c: the KV page allocator (see kv.h).  Everything is O(1) per page
 * except removing a page from its hash bucket, which walks the bucket;
 * buckets are sized to the pool, so that walk is short.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv.h"


static uint64_t
msv_kv_hash(uint64_t parent, const int32_t *toks, uint32_t n)
{
    uint32_t  i;
    uint64_t  h = parent ^ 0xcbf29ce484222325ULL;

    /* FNV-1a over the parent hash and the token ids, then a 64-bit
     * finalizer so that nearby chains spread over the buckets */
    for (i = 0; i < n; i++) {
        h ^= (uint32_t) toks[i];
        h *= 0x100000001b3ULL;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;

    return h != 0 ? h : 1;      /* 0 means "not registered" */
}


int
msv_kv_init(struct msv_kv *kv, uint32_t n_pages, uint32_t page_tokens,
    uint32_t max_seqs, uint32_t max_len, int caching)
{
    uint32_t  i;

    memset(kv, 0, sizeof(*kv));

    if (n_pages == 0 || n_pages >= MSV_KV_NONE || page_tokens == 0
        || max_seqs == 0 || max_len == 0)
    {
        return -1;
    }

    kv->page_tokens = page_tokens;
    kv->n_pages = n_pages;
    kv->max_seqs = max_seqs;
    kv->pages_per_seq = (max_len + page_tokens - 1) / page_tokens;
    kv->caching = caching;

    for (kv->n_buckets = 16; kv->n_buckets < n_pages; kv->n_buckets <<= 1) {
        /* void */
    }

    kv->ref = calloc(n_pages, sizeof(uint32_t));
    kv->hash = calloc(n_pages, sizeof(uint64_t));
    kv->parent = calloc(n_pages, sizeof(uint64_t));
    kv->toks = malloc((size_t) n_pages * page_tokens * sizeof(int32_t));
    kv->prev = malloc(n_pages * sizeof(uint32_t));
    kv->next = malloc(n_pages * sizeof(uint32_t));
    kv->chain = malloc(n_pages * sizeof(uint32_t));
    kv->bucket = malloc(kv->n_buckets * sizeof(uint32_t));
    kv->free_stack = malloc(n_pages * sizeof(uint32_t));
    kv->table = malloc((size_t) max_seqs * kv->pages_per_seq
                       * sizeof(uint32_t));
    kv->seq = calloc(max_seqs, sizeof(struct msv_kv_seq));

    if (kv->ref == NULL || kv->hash == NULL || kv->parent == NULL
        || kv->toks == NULL || kv->prev == NULL || kv->next == NULL
        || kv->chain == NULL || kv->bucket == NULL || kv->free_stack == NULL
        || kv->table == NULL || kv->seq == NULL)
    {
        msv_kv_free(kv);
        return -1;
    }

    for (i = 0; i < kv->n_buckets; i++) {
        kv->bucket[i] = MSV_KV_NONE;
    }

    /* pop order 0, 1, 2, ...: a fresh pool hands out pages in order */
    for (i = 0; i < n_pages; i++) {
        kv->free_stack[i] = n_pages - 1 - i;
    }
    kv->n_free = n_pages;
    kv->lru_head = MSV_KV_NONE;
    kv->lru_tail = MSV_KV_NONE;

    return 0;
}


void
msv_kv_free(struct msv_kv *kv)
{
    free(kv->ref);
    free(kv->hash);
    free(kv->parent);
    free(kv->toks);
    free(kv->prev);
    free(kv->next);
    free(kv->chain);
    free(kv->bucket);
    free(kv->free_stack);
    free(kv->table);
    free(kv->seq);
    memset(kv, 0, sizeof(*kv));
}


static void
msv_kv_lru_remove(struct msv_kv *kv, uint32_t p)
{
    if (kv->prev[p] != MSV_KV_NONE) {
        kv->next[kv->prev[p]] = kv->next[p];
    } else {
        kv->lru_head = kv->next[p];
    }
    if (kv->next[p] != MSV_KV_NONE) {
        kv->prev[kv->next[p]] = kv->prev[p];
    } else {
        kv->lru_tail = kv->prev[p];
    }
    kv->n_cached--;
}


static void
msv_kv_lru_append(struct msv_kv *kv, uint32_t p)
{
    kv->prev[p] = kv->lru_tail;
    kv->next[p] = MSV_KV_NONE;
    if (kv->lru_tail != MSV_KV_NONE) {
        kv->next[kv->lru_tail] = p;
    } else {
        kv->lru_head = p;
    }
    kv->lru_tail = p;
    kv->n_cached++;
}


static void
msv_kv_unregister(struct msv_kv *kv, uint32_t p)
{
    uint32_t  *link = &kv->bucket[kv->hash[p] & (kv->n_buckets - 1)];

    while (*link != p) {
        link = &kv->chain[*link];
    }
    *link = kv->chain[p];
    kv->hash[p] = 0;
}


/* The registered page for (parent, toks), or MSV_KV_NONE. */
static uint32_t
msv_kv_lookup(const struct msv_kv *kv, uint64_t h, uint64_t parent,
    const int32_t *toks)
{
    uint32_t  p;

    for (p = kv->bucket[h & (kv->n_buckets - 1)]; p != MSV_KV_NONE;
         p = kv->chain[p])
    {
        if (kv->hash[p] == h && kv->parent[p] == parent
            && memcmp(kv->toks + (size_t) p * kv->page_tokens, toks,
                      kv->page_tokens * sizeof(int32_t)) == 0)
        {
            return p;
        }
    }

    return MSV_KV_NONE;
}


/* A page for a new owner (ref 1): a free one, else the oldest cached. */
static uint32_t
msv_kv_take(struct msv_kv *kv)
{
    uint32_t  p;

    if (kv->n_free > 0) {
        p = kv->free_stack[--kv->n_free];
    } else {
        p = kv->lru_head;
        msv_kv_lru_remove(kv, p);
        msv_kv_unregister(kv, p);
        kv->evictions++;
    }

    kv->ref[p] = 1;
    return p;
}


int
msv_kv_grow(struct msv_kv *kv, uint32_t seq, uint32_t n_tokens)
{
    uint32_t            need, *tab;
    struct msv_kv_seq  *sq;

    if (seq >= kv->max_seqs) {
        return -1;
    }

    sq = &kv->seq[seq];
    need = msv_kv_pages_for(kv, n_tokens);
    if (need <= sq->n_pages) {
        return 0;
    }
    if (need > kv->pages_per_seq || need - sq->n_pages > msv_kv_available(kv))
    {
        return -1;
    }

    tab = kv->table + (size_t) seq * kv->pages_per_seq;
    while (sq->n_pages < need) {
        tab[sq->n_pages++] = msv_kv_take(kv);
    }

    return 0;
}


void
msv_kv_release(struct msv_kv *kv, uint32_t seq)
{
    uint32_t            p, *tab;
    struct msv_kv_seq  *sq;

    if (seq >= kv->max_seqs) {
        return;
    }

    sq = &kv->seq[seq];
    tab = kv->table + (size_t) seq * kv->pages_per_seq;

    while (sq->n_pages > 0) {
        p = tab[--sq->n_pages];
        if (--kv->ref[p] > 0) {
            continue;
        }
        if (kv->hash[p] != 0) {
            msv_kv_lru_append(kv, p);
        } else {
            kv->free_stack[kv->n_free++] = p;
        }
    }

    sq->n_hashed = 0;
    sq->hash = 0;
}


uint32_t
msv_kv_match(struct msv_kv *kv, uint32_t seq, const int32_t *toks,
    uint32_t n, uint32_t max_pages)
{
    uint32_t            i, p, full, *tab;
    uint64_t            h, hh;
    struct msv_kv_seq  *sq;

    if (!kv->caching || seq >= kv->max_seqs || kv->seq[seq].n_pages != 0) {
        return 0;
    }

    sq = &kv->seq[seq];
    tab = kv->table + (size_t) seq * kv->pages_per_seq;
    full = n / kv->page_tokens;
    if (full > max_pages) {
        full = max_pages;
    }
    if (full > kv->pages_per_seq) {
        full = kv->pages_per_seq;
    }
    kv->lookup_pages += full;

    h = 0;
    for (i = 0; i < full; i++) {
        hh = msv_kv_hash(h, toks + (size_t) i * kv->page_tokens,
                         kv->page_tokens);
        p = msv_kv_lookup(kv, hh, h, toks + (size_t) i * kv->page_tokens);
        if (p == MSV_KV_NONE) {
            break;
        }
        if (kv->ref[p]++ == 0) {
            msv_kv_lru_remove(kv, p);
        }
        tab[i] = p;
        h = hh;
    }

    sq->n_pages = i;
    sq->n_hashed = i;
    sq->hash = h;
    kv->hit_pages += i;

    return i;
}


void
msv_kv_share(struct msv_kv *kv, uint32_t seq, uint32_t from,
    uint32_t n_pages)
{
    uint32_t            i, *tab;
    const uint32_t     *src;
    struct msv_kv_seq  *sq;

    if (seq >= kv->max_seqs || from >= kv->max_seqs || seq == from
        || kv->seq[seq].n_pages != 0)
    {
        return;
    }

    if (n_pages > kv->seq[from].n_pages) {
        n_pages = kv->seq[from].n_pages;
    }

    sq = &kv->seq[seq];
    tab = kv->table + (size_t) seq * kv->pages_per_seq;
    src = msv_kv_table(kv, from);
    for (i = 0; i < n_pages; i++) {
        tab[i] = src[i];
        kv->ref[src[i]]++;      /* held by from: never on the LRU */
    }

    sq->n_pages = n_pages;
    sq->n_hashed = 0;           /* publish walks the chain again */
    sq->hash = 0;
}


void
msv_kv_publish(struct msv_kv *kv, uint32_t seq, const int32_t *toks,
    uint32_t n_done)
{
    uint32_t            i, p, full, *tab, *link;
    uint64_t            h, hh;
    const int32_t      *pt;
    struct msv_kv_seq  *sq;

    if (!kv->caching || seq >= kv->max_seqs) {
        return;
    }

    sq = &kv->seq[seq];
    tab = kv->table + (size_t) seq * kv->pages_per_seq;
    full = n_done / kv->page_tokens;
    if (full > sq->n_pages) {
        full = sq->n_pages;
    }

    h = sq->hash;
    for (i = sq->n_hashed; i < full; i++) {
        pt = toks + (size_t) i * kv->page_tokens;
        hh = msv_kv_hash(h, pt, kv->page_tokens);
        p = tab[i];

        if (kv->hash[p] == 0
            && msv_kv_lookup(kv, hh, h, pt) == MSV_KV_NONE)
        {
            kv->hash[p] = hh;
            kv->parent[p] = h;
            memcpy(kv->toks + (size_t) p * kv->page_tokens, pt,
                   kv->page_tokens * sizeof(int32_t));
            link = &kv->bucket[hh & (kv->n_buckets - 1)];
            kv->chain[p] = *link;
            *link = p;
        }

        h = hh;
    }

    if (full > sq->n_hashed) {
        sq->n_hashed = full;
        sq->hash = h;
    }
}


void
msv_kv_drop_cache(struct msv_kv *kv)
{
    uint32_t  p;

    while (kv->lru_head != MSV_KV_NONE) {
        p = kv->lru_head;
        msv_kv_lru_remove(kv, p);
        msv_kv_unregister(kv, p);
        kv->free_stack[kv->n_free++] = p;
    }

    /* pages still held stay where they are but are no longer found; their
     * holders register them again on their next publish */
    for (p = 0; p < kv->n_pages; p++) {
        if (kv->hash[p] != 0) {
            msv_kv_unregister(kv, p);
        }
    }
    for (p = 0; p < kv->max_seqs; p++) {
        kv->seq[p].n_hashed = 0;
        kv->seq[p].hash = 0;
    }
}


int
msv_kv_check(const struct msv_kv *kv, char *err, size_t errlen)
{
    int        rc;
    uint32_t   s, i, p, n, *cnt;
    uint8_t   *where;

    cnt = calloc(kv->n_pages, sizeof(uint32_t));
    where = calloc(kv->n_pages, 1);
    if (cnt == NULL || where == NULL) {
        free(cnt);
        free(where);
        snprintf(err, errlen, "out of memory");
        return -1;
    }

    rc = -1;

    for (s = 0; s < kv->max_seqs; s++) {
        for (i = 0; i < kv->seq[s].n_pages; i++) {
            p = msv_kv_table(kv, s)[i];
            if (p >= kv->n_pages) {
                snprintf(err, errlen, "seq %u page %u: id %u", s, i, p);
                goto done;
            }
            cnt[p]++;
        }
    }

    for (i = 0; i < kv->n_free; i++) {
        p = kv->free_stack[i];
        if (where[p]++ != 0 || kv->hash[p] != 0) {
            snprintf(err, errlen, "free page %u listed twice or hashed", p);
            goto done;
        }
    }

    n = 0;
    for (p = kv->lru_head; p != MSV_KV_NONE; p = kv->next[p]) {
        if (where[p]++ != 0 || kv->hash[p] == 0 || ++n > kv->n_pages) {
            snprintf(err, errlen, "cached page %u: listed twice or "
                     "unhashed", p);
            goto done;
        }
    }
    if (n != kv->n_cached) {
        snprintf(err, errlen, "%u pages on the LRU, %u counted", n,
                 kv->n_cached);
        goto done;
    }

    for (p = 0; p < kv->n_pages; p++) {
        if (cnt[p] != kv->ref[p]) {
            snprintf(err, errlen, "page %u: ref %u, held %u times", p,
                     kv->ref[p], cnt[p]);
            goto done;
        }
        if ((cnt[p] == 0) != (where[p] == 1)) {
            snprintf(err, errlen, "page %u: held %u times, listed %u "
                     "times", p, cnt[p], where[p]);
            goto done;
        }
        if (kv->hash[p] != 0
            && msv_kv_lookup(kv, kv->hash[p], kv->parent[p],
                             kv->toks + (size_t) p * kv->page_tokens) != p)
        {
            snprintf(err, errlen, "page %u: hashed but not found", p);
            goto done;
        }
    }

    rc = 0;

done:

    free(cnt);
    free(where);
    return rc;
}


void
msv_kv_seal(struct msv_kv *kv, uint64_t salt)
{
    uint32_t  i;

    msv_kv_drop_cache(kv);

    for (i = 0; i < kv->max_seqs; i++) {
        if (kv->seq[i].n_pages > 0) {
            kv->seq[i].n_hashed = kv->seq[i].n_pages;
            kv->seq[i].hash = salt | 1;
        }
    }
}
