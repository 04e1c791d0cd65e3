/*
 * test_kv.c: the KV page allocator (worker/kv.c).  Accounting of grow and
 * release; prefix matching by chained page hashes (true prefixes only,
 * full pages only, tokens compared); sharing between the choices of a
 * request; LRU eviction order; and a random walk of every operation with
 * the consistency check after each step.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "kv.h"


static char  err[256];


static int
check(const struct msv_kv *kv)
{
    return msv_kv_check(kv, err, sizeof(err)) == 0;
}


static void
test_grow_release(void)
{
    struct msv_kv  kv;

    tap_ok(msv_kv_init(&kv, 0, 16, 2, 64, 0) == -1, "an empty pool is "
           "refused");
    tap_ok(msv_kv_init(&kv, 4, 16, 3, 64, 0) == 0, "4 pages of 16");
    tap_ok(msv_kv_free_tokens(&kv) == 64, "64 tokens free");
    tap_ok(msv_kv_grow(&kv, 0, 40) == 0 && msv_kv_free_tokens(&kv) == 16
           && msv_kv_seq_pages(&kv, 0) == 3, "40 tokens take 3 pages");
    tap_ok(msv_kv_table(&kv, 0)[0] == 0 && msv_kv_table(&kv, 0)[2] == 2,
           "a fresh pool hands out pages in order");
    tap_ok(msv_kv_grow(&kv, 1, 32) == -1 && msv_kv_free_tokens(&kv) == 16
           && msv_kv_seq_pages(&kv, 1) == 0,
           "growing past the pool fails and takes nothing");
    tap_ok(msv_kv_grow(&kv, 0, 33) == 0 && msv_kv_free_tokens(&kv) == 16,
           "growing to what it has is free");
    tap_ok(msv_kv_grow(&kv, 2, 65) == -1, "past max_len fails");
    tap_ok(msv_kv_grow(&kv, 3, 1) == -1, "sequence id past max_seqs fails");
    tap_ok(check(&kv), "consistent (%s)", err);
    msv_kv_release(&kv, 0);
    tap_ok(msv_kv_free_tokens(&kv) == 64, "release gives the pages back");
    msv_kv_release(&kv, 0);
    tap_ok(msv_kv_free_tokens(&kv) == 64 && check(&kv),
           "a second release is harmless");
    msv_kv_free(&kv);
}


static void
fill(int32_t *t, uint32_t n, int32_t base)
{
    for (uint32_t i = 0; i < n; i++) {
        t[i] = base + (int32_t) i;
    }
}


static void
test_prefix(void)
{
    int32_t        a[64], b[64];
    uint32_t       hit;
    struct msv_kv  kv;

    msv_kv_init(&kv, 16, 16, 4, 256, 1);
    fill(a, 64, 100);

    /* seq 0 computes 50 tokens of a: 3 full pages are registered */
    msv_kv_grow(&kv, 0, 50);
    msv_kv_publish(&kv, 0, a, 50);
    tap_ok(check(&kv), "after publish (%s)", err);

    hit = msv_kv_match(&kv, 1, a, 64, 4);
    tap_ok(hit == 3, "the same prompt finds the 3 full pages (%u)", hit);
    tap_ok(memcmp(msv_kv_table(&kv, 1), msv_kv_table(&kv, 0),
                  3 * sizeof(uint32_t)) == 0, "the very same pages");
    tap_ok(kv.ref[msv_kv_table(&kv, 0)[0]] == 2, "held twice");
    msv_kv_release(&kv, 1);

    hit = msv_kv_match(&kv, 1, a, 64, 2);
    tap_ok(hit == 2, "max_pages caps the match (%u)", hit);
    msv_kv_release(&kv, 1);

    memcpy(b, a, sizeof(b));
    b[20] = 7;                      /* differs inside page 1 */
    hit = msv_kv_match(&kv, 1, b, 64, 4);
    tap_ok(hit == 1, "a prompt that differs in page 1 shares page 0 only "
           "(%u)", hit);
    msv_kv_release(&kv, 1);

    /* c: another first page, then a's page 1: computed by seq 2; a
     * lookup of c must get c's own page 1, whose KV saw c's first page,
     * never a's page 1 with the same tokens */
    fill(b, 64, 100);
    b[3] = 9;
    hit = msv_kv_match(&kv, 1, b, 64, 4);
    tap_ok(hit == 0, "a different first page matches nothing (%u)", hit);
    msv_kv_release(&kv, 1);
    msv_kv_grow(&kv, 2, 32);
    msv_kv_publish(&kv, 2, b, 32);
    hit = msv_kv_match(&kv, 1, b, 64, 4);
    tap_ok(hit == 2 && msv_kv_table(&kv, 1)[1] == msv_kv_table(&kv, 2)[1]
           && msv_kv_table(&kv, 1)[1] != msv_kv_table(&kv, 0)[1],
           "equal later pages are told apart by what precedes them: the "
           "hash is chained (%u)", hit);
    msv_kv_release(&kv, 1);
    msv_kv_release(&kv, 2);
    msv_kv_drop_cache(&kv);
    msv_kv_publish(&kv, 0, a, 50);

    hit = msv_kv_match(&kv, 2, a, 15, 4);
    tap_ok(hit == 0, "a prompt shorter than a page shares nothing");
    msv_kv_release(&kv, 2);

    /* 10 tokens in common: not a full page, nothing shared */
    fill(b, 64, 100);
    for (uint32_t i = 10; i < 64; i++) {
        b[i] = 5000 + (int32_t) i;
    }
    hit = msv_kv_match(&kv, 2, b, 64, 4);
    tap_ok(hit == 0, "prompts sharing part of a page do not share it");
    msv_kv_release(&kv, 2);

    /* released, the pages stay cached; they count as available */
    msv_kv_release(&kv, 0);
    tap_ok(kv.n_cached == 3 && msv_kv_free_tokens(&kv) == 256,
           "unused cached pages are kept and count as free");
    hit = msv_kv_match(&kv, 3, a, 64, 4);
    tap_ok(hit == 3 && kv.n_cached == 0, "and are found again (%u)", hit);
    msv_kv_release(&kv, 3);
    tap_ok(check(&kv), "consistent (%s)", err);

    msv_kv_drop_cache(&kv);
    tap_ok(kv.n_cached == 0 && msv_kv_match(&kv, 3, a, 64, 4) == 0
           && check(&kv), "drop_cache forgets them");
    msv_kv_release(&kv, 3);

    /* caching off: nothing is registered or found */
    kv.caching = 0;
    msv_kv_grow(&kv, 0, 64);
    msv_kv_publish(&kv, 0, a, 64);
    msv_kv_release(&kv, 0);
    tap_ok(kv.n_cached == 0 && msv_kv_match(&kv, 1, a, 64, 4) == 0,
           "caching off: nothing cached");
    msv_kv_free(&kv);
}


static void
test_share_and_duplicates(void)
{
    int32_t        a[48];
    uint32_t       p;
    struct msv_kv  kv;

    msv_kv_init(&kv, 8, 16, 4, 128, 1);
    fill(a, 48, 1);

    msv_kv_grow(&kv, 0, 40);
    msv_kv_share(&kv, 1, 0, 2);
    tap_ok(msv_kv_seq_pages(&kv, 1) == 2
           && kv.ref[msv_kv_table(&kv, 0)[1]] == 2
           && kv.ref[msv_kv_table(&kv, 0)[2]] == 1,
           "share takes the leading pages, the partial one stays private");
    msv_kv_grow(&kv, 1, 40);
    tap_ok(msv_kv_table(&kv, 1)[2] != msv_kv_table(&kv, 0)[2]
           && check(&kv), "growing after a share takes a private page");

    /* both publish the same tokens: one copy is registered */
    msv_kv_publish(&kv, 0, a, 40);
    msv_kv_publish(&kv, 1, a, 40);
    tap_ok(check(&kv), "publishing shared pages twice (%s)", err);

    /* a sequence that computed the same page on its own keeps it private */
    msv_kv_grow(&kv, 2, 16);
    p = msv_kv_table(&kv, 2)[0];
    msv_kv_publish(&kv, 2, a, 16);
    tap_ok(kv.hash[p] == 0, "a duplicate of a registered page stays "
           "private");
    msv_kv_release(&kv, 2);
    tap_ok(kv.ref[p] == 0 && check(&kv), "and is freed, not cached");

    msv_kv_release(&kv, 0);
    msv_kv_release(&kv, 1);
    tap_ok(msv_kv_free_tokens(&kv) == 128 && check(&kv), "all back");
    msv_kv_free(&kv);
}


static void
test_lru(void)
{
    int32_t        a[64], b[64];
    uint32_t       hit;
    struct msv_kv  kv;

    msv_kv_init(&kv, 6, 16, 4, 96, 1);
    fill(a, 64, 1);
    fill(b, 64, 1000);

    /* a: 3 cached pages; then b: 3 cached pages, released later */
    msv_kv_grow(&kv, 0, 48);
    msv_kv_publish(&kv, 0, a, 48);
    msv_kv_release(&kv, 0);
    msv_kv_grow(&kv, 1, 48);
    msv_kv_publish(&kv, 1, b, 48);
    msv_kv_release(&kv, 1);
    tap_ok(kv.n_cached == 6 && kv.n_free == 0, "6 cached pages, none free");

    /* 2 pages of pressure evict from a, its last pages first */
    msv_kv_grow(&kv, 2, 32);
    tap_ok(kv.evictions == 2, "two evictions");
    hit = msv_kv_match(&kv, 3, a, 64, 4);
    tap_ok(hit == 1, "the oldest release loses its tail first: a keeps its "
           "first page (%u)", hit);
    msv_kv_release(&kv, 3);
    hit = msv_kv_match(&kv, 3, b, 64, 4);
    tap_ok(hit == 3, "the newer b is intact (%u)", hit);
    msv_kv_release(&kv, 3);
    msv_kv_release(&kv, 2);
    tap_ok(check(&kv), "consistent (%s)", err);
    msv_kv_free(&kv);
}


/* Random operations on few pages, with the check after each. */
static void
test_random(void)
{
    int            bad;
    int32_t        toks[4][96];
    uint32_t       i, s, op, n, steps;
    struct msv_kv  kv;

    srand(12345);
    msv_kv_init(&kv, 12, 16, 4, 96, 1);
    for (s = 0; s < 4; s++) {
        for (i = 0; i < 96; i++) {
            toks[s][i] = (int32_t) (i < 40 ? i : s * 100 + i);
        }
    }

    bad = 0;
    steps = 20000;
    for (i = 0; i < steps && !bad; i++) {
        s = (uint32_t) rand() % 4;
        op = (uint32_t) rand() % 5;
        n = msv_kv_seq_pages(&kv, s) * 16;
        switch (op) {
        case 0:
            msv_kv_grow(&kv, s, n + 1 + (uint32_t) rand() % 20);
            break;
        case 1:
            msv_kv_publish(&kv, s, toks[s], n);
            break;
        case 2:
            msv_kv_release(&kv, s);
            break;
        case 3:
            if (n == 0) {
                msv_kv_match(&kv, s, toks[s], 96, 5);
            }
            break;
        default:
            if (n == 0) {
                msv_kv_share(&kv, s, (s + 1) % 4, 2);
            }
            break;
        }
        if (!check(&kv)) {
            bad = 1;
        }
    }
    tap_ok(!bad, "%u random operations keep the pool consistent (%s)", i,
           bad ? err : "ok");
    tap_ok(kv.hit_pages > 0 && kv.evictions > 0, "the walk found cached "
           "pages (%llu) and evicted some (%llu)",
           (unsigned long long) kv.hit_pages,
           (unsigned long long) kv.evictions);
    for (s = 0; s < 4; s++) {
        msv_kv_release(&kv, s);
    }
    tap_ok(msv_kv_free_tokens(&kv) == 12 * 16 && check(&kv),
           "every page available at the end");
    msv_kv_free(&kv);
}


int
main(void)
{
    (void) tap_plan;
    (void) tap_diag;

    test_grow_release();
    test_prefix();
    test_share_and_duplicates();
    test_lru();
    test_random();

    return tap_done();
}
