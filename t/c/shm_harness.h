/*
 * shm_harness.h: shared pieces of the shm tests: a worker made of the
 * worker's own code (region, and shm/msv_ipc.c for the listening socket,
 * admission, eviction and the producer's wait callback), and rows whose
 * every byte follows from (seq, row index) so a consumer in another
 * process can check them all.
 */

#ifndef MSV_SHM_HARNESS_H
#define MSV_SHM_HARNESS_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE         /* pipe2 */
#endif

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "msv_ipc.h"
#include "msv_link.h"
#include "msv_region.h"
#include "msv_ring.h"
#include "msv_slots.h"
#include "mix.h"


/* ------------------------------------------------------------------ */
/* Deterministic rows                                                   */

static inline uint64_t
hx_mix(uint64_t a, uint64_t b)
{
    return msv_mix64(a * 0x9e3779b97f4a7c15ULL + b + 0x632be59bd9b4e019ULL);
}


struct hx_spec {
    int32_t   token;
    uint32_t  n_support;
    uint32_t  n_lps;
    uint32_t  n_top;
    uint32_t  mode;
    uint32_t  bytes;
};


/*
 * Support sizes of real traffic (1, 20, 1000, 8192 ids), the whole
 * vocabulary with every logprob now and then (the largest row there is),
 * random sizes, all three mask modes, abort rows.
 */
static inline void
hx_spec_of(uint64_t seq, uint32_t idx, uint32_t vocab, uint32_t max_lp,
    struct hx_spec *sp)
{
    uint64_t  r = hx_mix(seq, idx);
    uint32_t  k = (uint32_t) (r % 64), n;

    if (k < 16) {
        n = 1;
    } else if (k < 28) {
        n = 20;
    } else if (k < 36) {
        n = 1000;
    } else if (k < 40) {
        n = 8192;
    } else if (k == 40) {
        n = vocab;
    } else {
        n = (uint32_t) ((r >> 8) % 2001);
    }
    if (n > vocab) {
        n = vocab;
    }

    memset(sp, 0, sizeof(*sp));
    sp->token = (int32_t) ((r >> 20) % vocab);

    if (k == 40) {
        sp->mode = MSV_MASK_SUPPORT;
        sp->n_top = max_lp;
    } else {
        sp->mode = (uint32_t) ((r >> 32) % 3);
        sp->n_top = (r >> 36) % 4 == 0 ? (uint32_t) ((r >> 40) % (max_lp + 1))
                                       : 0;
    }
    if (sp->mode != MSV_MASK_OFF) {
        sp->n_support = n;
        sp->n_lps = sp->mode == MSV_MASK_SUPPORT ? n : 1;
    }
    if (k != 40 && (r >> 48) % 40 == 0) {      /* an abort row */
        sp->token = -1;
        sp->n_support = sp->n_lps = sp->n_top = 0;
    }
    sp->bytes = msv_row_size(sp->n_support, sp->n_lps, sp->n_top);
}


/* Header and payload of row (seq, idx); payload words from a xorshift
 * stream seeded by both, the alignment tail zero. */
static inline void
hx_fill(uint8_t *dst, uint64_t seq, uint32_t idx, const struct hx_spec *sp)
{
    uint32_t         j, nw, *wd;
    uint64_t         x;
    struct msv_row  *w = (struct msv_row *) dst;

    memset(w, 0, sizeof(*w));
    w->bytes = sp->bytes;
    w->slot = idx;
    w->cookie = hx_mix(seq ^ 0x5a5a, idx);
    w->token = sp->token;
    w->pos = (uint32_t) seq;
    w->n_support = sp->n_support;
    w->n_lps = sp->n_lps;
    w->n_top = sp->n_top;
    w->mode = (uint8_t) sp->mode;
    w->finish = sp->token < 0 ? MSV_FINISH_ABORT : MSV_FINISH_NONE;

    nw = (sp->bytes - (uint32_t) sizeof(*w)) / 4;
    wd = (uint32_t *) (w + 1);
    x = hx_mix(seq, idx) | 1;
    for (j = 0; j < nw; j++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        wd[j] = (uint32_t) x;
    }
    /* the words beyond the counts are the 8-byte alignment tail */
    j = sp->n_support + sp->n_lps + 2 * sp->n_top;
    for ( ; j < nw; j++) {
        wd[j] = 0;
    }
}


/* 0 if w is exactly row (seq, idx) of shape *spp; else why. */
static inline int
hx_check(const struct msv_row *w, uint64_t seq, uint32_t idx,
    const struct hx_spec *spp, char *why, size_t whylen)
{
    uint32_t         j, nw, used;
    uint64_t         x;
    const uint32_t  *wd;
    struct hx_spec   sp = *spp;

    if (w->bytes != sp.bytes || w->slot != idx
        || w->cookie != hx_mix(seq ^ 0x5a5a, idx) || w->token != sp.token
        || w->pos != (uint32_t) seq || w->n_support != sp.n_support
        || w->n_lps != sp.n_lps || w->n_top != sp.n_top
        || w->mode != sp.mode)
    {
        snprintf(why, whylen, "seq %llu row %u: header differs (bytes %u/%u "
                 "slot %u n_support %u/%u)", (unsigned long long) seq, idx,
                 w->bytes, sp.bytes, w->slot, w->n_support, sp.n_support);
        return -1;
    }

    nw = (sp.bytes - (uint32_t) sizeof(*w)) / 4;
    used = sp.n_support + sp.n_lps + 2 * sp.n_top;
    wd = (const uint32_t *) (w + 1);
    x = hx_mix(seq, idx) | 1;
    for (j = 0; j < nw; j++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if (wd[j] != (j < used ? (uint32_t) x : 0)) {
            snprintf(why, whylen, "seq %llu row %u: word %u of %u differs",
                     (unsigned long long) seq, idx, j, nw);
            return -1;
        }
    }
    return 0;
}


/* Rows in step seq: mostly a few dozen, now and then more than a ring. */
static inline uint32_t
hx_rows_in(uint64_t seq)
{
    uint64_t  r = hx_mix(seq, 0xabcdef);

    return r % 23 == 0 ? 300 : 1 + (uint32_t) (r % 48);
}


/* Produce step seq (every row through reserve/commit).  0 or -1. */
static inline int
hx_produce(struct msv_producer *p, uint64_t seq, uint32_t vocab,
    uint32_t max_lp)
{
    uint32_t        i, n = hx_rows_in(seq);
    uint8_t        *dst;
    struct hx_spec  sp;

    msv_ring_begin(p, seq);
    for (i = 0; i < n; i++) {
        hx_spec_of(seq, i, vocab, max_lp, &sp);
        dst = msv_ring_reserve(p, sp.bytes);
        if (dst == NULL) {
            return -1;
        }
        hx_fill(dst, seq, i, &sp);
        msv_ring_commit(p, sp.bytes, 1);
    }
    msv_ring_end(p);
    return 0;
}


/*
 * Steps as the worker's device sampler makes them (msv_ring_defer): the
 * rows' bytes land after their reservation, like the DMA copies that
 * run beside the next forward.  A step's rows after its first are
 * deferred in runs (each as many rows as max_row_bytes takes, as the
 * scheduler forms them) and filled with a poison a reader must never
 * see; they land (are written) and are settled only once the next step
 * has begun, or when a run finds no room.
 */
#define HX_MAX_ROWS  300        /* the most hx_rows_in gives */

struct hx_deferred {
    uint64_t   seq;             /* step of the rows deferred */
    uint32_t   first;           /* row index of the first of them */
    uint32_t   n;               /* rows deferred */
    uint32_t   landed;          /* rows written so far */
    uint8_t   *at[HX_MAX_ROWS];
    uint32_t   vocab, max_lp;
    uint64_t   runs;            /* runs deferred, in all */
    uint64_t   full;            /* of those, found no room at first */
};


/* The deferred rows land, then are settled (msv_sched_flush). */
static inline int
hx_land(struct msv_producer *p, struct hx_deferred *d)
{
    struct hx_spec  sp;

    for ( ; d->landed < d->n; d->landed++) {
        hx_spec_of(d->seq, d->first + d->landed, d->vocab, d->max_lp, &sp);
        hx_fill(d->at[d->landed], d->seq, d->first + d->landed, &sp);
    }
    return msv_ring_settle(p);
}


/* Step seq: the last step's rows land after the begin, the first row is
 * written in place, the others deferred.  0 or -1. */
static inline int
hx_produce_deferred(struct msv_producer *p, uint64_t seq,
    struct hx_deferred *d)
{
    int             rc;
    void           *at;
    uint8_t        *w;
    uint32_t        i, j, k, n = hx_rows_in(seq), bytes;
    struct hx_spec  sp;

    msv_ring_begin(p, seq);
    if (hx_land(p, d) != 0) {
        return -1;
    }

    hx_spec_of(seq, 0, d->vocab, d->max_lp, &sp);
    w = msv_ring_reserve(p, sp.bytes);
    if (w == NULL) {
        return -1;
    }
    hx_fill(w, seq, 0, &sp);
    msv_ring_commit(p, sp.bytes, 1);

    d->seq = seq;
    d->first = 1;
    d->n = d->landed = 0;
    for (i = 1; i < n; i = j) {
        hx_spec_of(seq, i, d->vocab, d->max_lp, &sp);
        bytes = sp.bytes;
        for (j = i + 1; j < n; j++) {
            hx_spec_of(seq, j, d->vocab, d->max_lp, &sp);
            if (bytes + sp.bytes > p->c->max_row_bytes) {
                break;
            }
            bytes += sp.bytes;
        }

        rc = msv_ring_defer(p, bytes, j - i, &at);
        if (rc == 1) {
            d->full++;
            if (hx_land(p, d) != 0) {
                return -1;
            }
            rc = msv_ring_defer(p, bytes, j - i, &at);
        }
        if (rc != 0) {
            return -1;
        }
        d->runs++;

        memset(at, 0xa5, bytes);
        for (k = i, w = at; k < j; k++) {
            hx_spec_of(seq, k, d->vocab, d->max_lp, &sp);
            d->at[d->n++] = w;
            w += sp.bytes;
        }
    }
    msv_ring_end(p);
    return 0;
}


/* A consumer's place in the stream of steps. */
struct hx_cursor {
    uint64_t  seq;          /* step expected next */
    uint32_t  idx;          /* row expected next */
    uint64_t  last_seq;     /* stop after this step */
    uint64_t  rows;
    uint64_t  bytes;
    uint32_t  vocab;
    uint32_t  max_lp;
    int       done;
    int       bad;
    char      why[200];
};


static inline int
hx_on_row(void *ud, uint64_t seq, const struct msv_row *w)
{
    struct hx_spec     sp;
    struct hx_cursor  *k = ud;

    if (k->done) {
        return 1;       /* past our last step: stop here, not an error */
    }
    if (seq != k->seq) {
        snprintf(k->why, sizeof(k->why), "expected seq %llu row %u, got seq "
                 "%llu", (unsigned long long) k->seq, k->idx,
                 (unsigned long long) seq);
        k->bad = 1;
        return -1;
    }
    hx_spec_of(seq, k->idx, k->vocab, k->max_lp, &sp);
    if (hx_check(w, seq, k->idx, &sp, k->why, sizeof(k->why)) != 0) {
        k->bad = 1;
        return -1;
    }

    k->rows++;
    k->bytes += w->bytes;
    if (++k->idx == hx_rows_in(seq)) {
        k->idx = 0;
        k->seq++;
        if (seq == k->last_seq) {
            k->done = 1;
        }
    }
    return 0;
}


/* ------------------------------------------------------------------ */
/* The worker: the worker's own reader handling (shm/msv_ipc.c)         */

struct hw;
typedef void (*hw_hook_fn)(struct hw *w, uint64_t waited_ns);

struct hw {
    struct msv_region      rg;
    struct msv_producer    p;
    struct msv_ipc         ipc;
    int                    kick_fd;        /* ipc.evfd, readers kick it */
    volatile sig_atomic_t  stop;
    uint32_t               evicted;        /* readers dropped */
    uint64_t               slots_reaped;
    uint64_t               give_up_ns;     /* wait callback fails after */
    int                    no_beat;        /* play a hung worker */
    hw_hook_fn             hook;           /* test's view of a wait */
    void                  *hook_ud;
};


static inline void
hw_forget(void *ud, uint32_t slot)
{
    struct hw  *w = ud;

    (void) slot;
    w->slots_reaped++;
}


static inline void
hw_counts(struct hw *w)
{
    w->evicted = w->ipc.evicted;
}


static inline void
hw_evict(struct hw *w, uint32_t i)
{
    msv_ipc_evict(&w->ipc, i, "evicted by the test");
    hw_counts(w);
}


/* Heartbeat, hellos, submissions, connections that closed. */
static inline void
hw_service(struct hw *w)
{
    if (!w->no_beat) {
        atomic_store(&w->rg.ctrl->heartbeat_ns, msv_now_ns());
    }

    msv_ipc_poll(&w->ipc, 0);
    hw_counts(w);
}


/* The producer's wait callback: the worker's, plus the test's hook. */
static inline int
hw_wait(void *ud, uint64_t waited_ns)
{
    int         rc;
    struct hw  *w = ud;

    if (!w->no_beat) {
        atomic_store(&w->rg.ctrl->heartbeat_ns, msv_now_ns());
    }

    rc = msv_ipc_ring_wait(&w->ipc, waited_ns);     /* polls for 1 ms */
    hw_counts(w);

    if (w->hook != NULL) {
        w->hook(w, waited_ns);
    }
    if (rc != 0 || waited_ns > w->give_up_ns) {
        return -1;
    }
    return 0;
}


static inline int
hw_start(struct hw *w, const char *name, const struct msv_layout *lay)
{
    char  err[256];

    memset(w, 0, sizeof(*w));
    w->kick_fd = -1;
    w->give_up_ns = 20000000000ULL;

    if (msv_region_create(&w->rg, name, lay, err, sizeof(err)) != 0) {
        fprintf(stderr, "# hw_start: %s\n", err);
        return -1;
    }
    /* reader timeout 20 s: the tests evict on purpose, never by time */
    if (msv_ipc_init(&w->ipc, w->rg.ctrl, &w->p, 20000000000ULL, &w->stop,
                     err, sizeof(err)) != 0)
    {
        fprintf(stderr, "# hw_start: %s\n", err);
        return -1;
    }
    w->ipc.forget = hw_forget;
    w->ipc.forget_ud = w;
    w->kick_fd = w->ipc.evfd;
    msv_producer_init(&w->p, w->rg.ctrl, hw_wait, w);
    atomic_store(&w->rg.ctrl->state, MSV_WORKER_READY);
    return 0;
}


/* Serve hellos until `n` readers were admitted (or 10 s pass). */
static inline int
hw_await_readers(struct hw *w, uint32_t n)
{
    uint64_t         t0 = msv_now_ns();
    struct timespec  ts = { 0, 200000 };

    while (w->ipc.admitted < n) {
        if (msv_now_ns() - t0 > 10000000000ULL) {
            return -1;
        }
        hw_service(w);
        nanosleep(&ts, NULL);
    }
    return 0;
}


/* This process as reader entry i, admitted the way the worker does it. */
static inline int
hw_self_attach(struct hw *w, uint32_t i, struct msv_consumer *k)
{
    uint64_t            word, tail;
    struct msv_hello    h;
    struct msv_reader  *r = msv_reader_at(w->rg.ctrl, i);

    word = 0;
    if (!atomic_compare_exchange_strong(&r->state, &word,
            MSV_STATE_WORD(getpid(), MSV_READER_CLAIMED)))
    {
        return -1;
    }
    memset(&h, 0, sizeof(h));
    h.magic = MSV_HELLO_MAGIC;
    h.reader = i;
    h.generation = w->rg.ctrl->generation;
    h.pid = (int32_t) getpid();
    if (msv_reader_admit(w->rg.ctrl, &h, atomic_load(&w->rg.ctrl->head),
                         &tail) != 0)
    {
        return -1;
    }
    msv_consumer_init(k, w->rg.ctrl, i, tail);
    return 0;
}


/* Close everything as a dying worker would (the region stays linked). */
static inline void
hw_close(struct hw *w)
{
    msv_ipc_close(&w->ipc);
    msv_region_unmap(&w->rg);
}


/* ------------------------------------------------------------------ */
/* Reader side                                                          */

/*
 * Consume through the real wakeup path until the cursor is done: consume,
 * arm, sleep on the eventfd.  usleep_per_record > 0 makes a slow reader.
 * Returns 0, or -1 with a message in k->why.
 */
static inline int
hx_read_all(struct msv_attachment *a, struct hx_cursor *k,
    unsigned slow_us)
{
    long           n;
    uint64_t       last_check = msv_now_ns();
    struct pollfd  pf;

    while (!k->done) {
        n = msv_consume(&a->cons, hx_on_row, k);
        if (n < 0 && k->done && !k->bad) {
            break;      /* stopped at the row after our last step */
        }
        if (n < 0) {
            if (!k->bad) {
                snprintf(k->why, sizeof(k->why), "msv_consume: malformed "
                         "record or evicted at tail %llu",
                         (unsigned long long) a->cons.tail);
            }
            return -1;
        }
        if (msv_now_ns() - last_check > 100000000ULL) {
            last_check = msv_now_ns();
            msv_reader_heartbeat(a);
            if (msv_attachment_check(a) != 0) {
                snprintf(k->why, sizeof(k->why), "attachment check failed");
                return -1;
            }
        }
        if (n > 0) {
            if (slow_us) {
                usleep(slow_us);
            }
            continue;
        }
        if (msv_consumer_arm(&a->cons)) {
            continue;
        }
        pf.fd = a->wake_fd;
        pf.events = POLLIN;
        if (poll(&pf, 1, 200) < 0 && errno != EINTR) {
            snprintf(k->why, sizeof(k->why), "poll: %s", strerror(errno));
            return -1;
        }
        msv_drain(a->wake_fd);
    }
    return 0;
}


/* A unique region name for this test process. */
static inline void
hx_name(char *out, size_t len, const char *tag)
{
    snprintf(out, len, "msvt-%d-%s", (int) getpid(), tag);
}


/* Wait for a child; its exit status (or 128 + signal). */
static inline int
hx_wait_child(pid_t pid)
{
    int  st;

    while (waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR) {
            return -1;
        }
    }
    if (WIFEXITED(st)) {
        return WEXITSTATUS(st);
    }
    return 128 + WTERMSIG(st);
}

#endif /* MSV_SHM_HARNESS_H */
