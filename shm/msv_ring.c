/*
 * msv_ring.c: the output ring, one producer and many consumers.
 *
 * Indices (ctrl->head, every reader's tail) count bytes and never wrap in
 * practice (2^64); a position in the ring is index & (cap - 1).  The
 * producer owns head, each consumer owns its tail.
 *
 * Memory ordering.  Every acquire and release names its partner:
 *
 *   R1  producer: release store of ctrl->head after a record is written
 *   A1  consumer: acquire load of ctrl->head before reading records
 *       A1 pairs with R1: record bytes are visible once head covers them.
 *
 *   R0  consumer: release store of its tail after it is done with a record
 *   A0  producer: acquire load of each tail in msv_ring_min_tail
 *       A0 pairs with R0: the consumer's reads of a record happen before
 *       the producer's writes over the same bytes.
 *
 *   R2  worker: release CAS of a reader entry to ATTACHED (msv_link.c)
 *   A2  producer: acquire load of the entry state in msv_ring_min_tail
 *       A2 pairs with R2: the tail written at admission is seen with it.
 *
 *   F1  producer: seq_cst fence between storing head and reading `armed`
 *   F0  consumer: seq_cst store of `armed`, then seq_cst load of head
 *       F1 and F0 form a Dekker pair: either the producer sees armed == 1
 *       and writes the eventfd, or the consumer sees the new head and
 *       does not sleep.  A wakeup is never lost.
 *
 *   F2  worker: seq_cst fence after an eviction (msv_reader_evict)
 *   F3  consumer: acquire fence before rechecking its entry after reading
 *       F3 pairs with F2: if the consumer still sees its entry ATTACHED,
 *       the producer had not overwritten the record it read.
 *
 * Deferred runs (msv_ring_defer) are written by someone else after their
 * reservation, a DMA engine copying from the device.  R1 covers them as
 * any row: the producer stores head only after it knows the copy landed
 * (the wait that tells it so orders the copy's writes before what the
 * producer does next), and until then head stops at p->held, before the
 * first record they are in.  Space is reserved for them exactly as for
 * rows written in place, against the same tails, so a reader never has
 * unread bytes where a copy lands.
 */

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "msv_region.h"
#include "msv_ring.h"


#define MSV_NO_REC         (~(uint64_t) 0)
#define MSV_REC_HDR        ((uint32_t) sizeof(struct msv_rec))
#define MSV_ROW_MIN        ((uint32_t) sizeof(struct msv_row))
#define MSV_ALIGN16(x)     (((x) + (MSV_REC_ALIGN - 1)) \
                            & ~(uint64_t) (MSV_REC_ALIGN - 1))


static int64_t msv_rows_span(const uint8_t *p, uint64_t limit,
    uint32_t n_rows);
static void msv_rec_close(struct msv_producer *p);
static void msv_publish(struct msv_producer *p);
static int msv_room(struct msv_producer *p, uint64_t end, int may_wait);
static uint8_t *msv_place(struct msv_producer *p, uint32_t bytes,
    int may_wait, int *rc);
static int msv_rec_valid(const uint8_t *at, uint32_t bytes, uint32_t n_rows,
    uint32_t max_rec);
static int msv_evicted(const struct msv_consumer *k);


/* ------------------------------------------------------------------ */
/* Shared checks                                                        */

/*
 * The bytes taken by n_rows rows laid back to back from p, none reaching
 * past `limit`, each exactly as large as its header says its payload
 * needs (computed in 64 bits, so garbage counts cannot wrap into a
 * plausible size); -1 if they are not that.
 */
static int64_t
msv_rows_span(const uint8_t *p, uint64_t limit, uint32_t n_rows)
{
    uint32_t               k;
    uint64_t               off, want;
    const struct msv_row  *w;

    off = 0;
    for (k = 0; k < n_rows; k++) {
        if (off + MSV_ROW_MIN > limit) {
            return -1;
        }
        w = (const struct msv_row *) (p + off);
        want = MSV_ROW_MIN + 4 * (uint64_t) w->n_support
               + 4 * (uint64_t) w->n_lps
               + sizeof(struct msv_top) * (uint64_t) w->n_top;
        want = (want + MSV_ROW_ALIGN - 1) & ~(uint64_t) (MSV_ROW_ALIGN - 1);
        if (w->bytes != want || off + want > limit) {
            return -1;
        }
        off += want;
    }

    return (int64_t) off;
}


/*
 * What a reader demands of a step record of `bytes` (header included, not
 * necessarily written yet) holding n_rows rows: rows that fill it up to
 * its 16-byte padding.  1 if they do.
 */
static int
msv_rec_valid(const uint8_t *at, uint32_t bytes, uint32_t n_rows,
    uint32_t max_rec)
{
    int64_t  span;

    if (bytes < MSV_REC_HDR || bytes % MSV_REC_ALIGN || bytes > max_rec
        || n_rows == 0)
    {
        return 0;
    }
    span = msv_rows_span(at + MSV_REC_HDR, bytes - MSV_REC_HDR, n_rows);
    return span >= 0
           && MSV_ALIGN16(MSV_REC_HDR + (uint64_t) span) == bytes;
}


uint64_t
msv_ring_min_tail(struct msv_ctrl *c, uint64_t head)
{
    uint32_t            i;
    uint64_t            w, t, lag, max_lag;
    struct msv_reader  *r;

    max_lag = 0;
    for (i = 0; i < c->n_readers; i++) {
        r = msv_reader_at(c, i);

        /* A2: acquire, pairs with R2 (admission wrote tail, then state) */
        w = atomic_load_explicit(&r->state, memory_order_acquire);
        if (MSV_STATE_OF(w) != MSV_READER_ATTACHED) {
            continue;
        }

        /* A0: acquire, pairs with R0 (the consumer is done with [.., t)) */
        t = atomic_load_explicit(&r->tail, memory_order_acquire);
        lag = head - t;
        if ((int64_t) lag < 0) {
            continue;   /* ahead of head: not a valid tail, holds nothing */
        }
        if (lag > max_lag) {
            max_lag = lag;
        }
    }

    return head - max_lag;
}


/* ------------------------------------------------------------------ */
/* Producer                                                             */

void
msv_producer_init(struct msv_producer *p, struct msv_ctrl *c,
    msv_wait_fn wait, void *wait_ud)
{
    int  i;

    memset(p, 0, sizeof(*p));
    p->c = c;
    p->data = msv_ring_data(c);
    p->cap = c->ring_bytes;
    /* relaxed: we are the only writer of head */
    p->head = atomic_load_explicit(&c->head, memory_order_relaxed);
    p->rec_at = MSV_NO_REC;
    p->held = MSV_NO_REC;
    p->wait = wait;
    p->wait_ud = wait_ud;
    p->limit = p->head;         /* forces a look at the tails first */
    for (i = 0; i < MSV_MAX_READERS; i++) {
        p->wake_fd[i] = -1;
    }
}


void
msv_ring_begin(struct msv_producer *p, uint64_t seq)
{
    if (p->rec_at != MSV_NO_REC) {
        msv_ring_end(p);        /* a step left open: publish what it has */
    }
    p->seq = seq;
}


/*
 * Wait until [.., end) may be written: no attached reader still has
 * unread bytes there.  p->limit caches min_tail + cap; tails only grow
 * and a newly admitted reader starts at the published head, so a cached
 * limit is never too generous.  0 when it may; 1 when it may not yet and
 * may_wait is 0 (the tails were read once); -1 when the wait gave up.
 */
static int
msv_room(struct msv_producer *p, uint64_t end, int may_wait)
{
    uint64_t  t0, pub;
    struct timespec  ts;

    if (end <= p->limit) {
        return 0;
    }

    t0 = 0;
    for ( ;; ) {
        /*
         * Against the published head: with no reader attached the limit
         * is head + cap, and a reader admitted now starts at that head.
         */
        pub = atomic_load_explicit(&p->c->head, memory_order_relaxed);
        p->limit = msv_ring_min_tail(p->c, pub) + p->cap;
        if (end <= p->limit) {
            return 0;
        }
        if (!may_wait) {
            return 1;
        }

        if (t0 == 0) {
            t0 = msv_now_ns();
            atomic_fetch_add_explicit(&p->c->ring_waits, 1,
                                      memory_order_relaxed);
        }

        if (p->wait != NULL) {
            if (p->wait(p->wait_ud, msv_now_ns() - t0) != 0) {
                return -1;
            }

        } else {
            ts.tv_sec = 0;
            ts.tv_nsec = 50000;
            nanosleep(&ts, NULL);
        }
    }
}


/* Write the open record's header; head moves past it (not yet public). */
static void
msv_rec_close(struct msv_producer *p)
{
    uint8_t         *at;
    uint64_t         size;
    struct msv_rec  *h;

    at = p->data + (p->rec_at & (p->cap - 1));
    size = MSV_ALIGN16(p->rec_bytes);
    if (size > p->rec_bytes) {
        memset(at + p->rec_bytes, 0, size - p->rec_bytes);
    }

    h = (struct msv_rec *) at;
    h->bytes = (uint32_t) size;
    h->kind = MSV_REC_STEP;
    h->n_rows = (uint16_t) p->rec_rows;
    h->seq = p->seq;

    p->head = p->rec_at + size;
    p->rec_at = MSV_NO_REC;
    p->rec_bytes = 0;
    p->rec_rows = 0;
}


/* Make everything up to p->head (p->held while runs are deferred) public
 * and wake sleeping readers. */
static void
msv_publish(struct msv_producer *p)
{
    uint32_t            i;
    uint64_t            one = 1, to;
    struct msv_reader  *r;

    /* deferred runs: their records wait, and so does all after them */
    to = p->held != MSV_NO_REC ? p->held : p->head;

    if (atomic_load_explicit(&p->c->head, memory_order_relaxed) == to) {
        return;
    }

    /* R1: release, pairs with A1 in msv_consume */
    atomic_store_explicit(&p->c->head, to, memory_order_release);

    /* F1: pairs with F0 in msv_consumer_arm (see the top of this file) */
    atomic_thread_fence(memory_order_seq_cst);

    for (i = 0; i < p->c->n_readers && i < MSV_MAX_READERS; i++) {
        if (p->wake_fd[i] < 0) {
            continue;
        }
        r = msv_reader_at(p->c, i);
        if (atomic_load_explicit(&r->armed, memory_order_relaxed) == 0
            || atomic_exchange_explicit(&r->armed, 0, memory_order_relaxed)
               == 0)
        {
            continue;
        }
        /* EAGAIN means the counter is already huge: the reader is awake */
        while (write(p->wake_fd[i], &one, sizeof(one)) < 0
               && errno == EINTR)
        {
            /* retry */
        }
    }
}


/*
 * Where `bytes` more rows of the open step go (msv_ring_reserve): in the
 * open record if it can grow that far, else in a new one, after a pad
 * when the ring's end is too near.  NULL with *rc 1 (no room, may_wait
 * 0) or -1 (bad size, or the wait gave up).
 */
static uint8_t *
msv_place(struct msv_producer *p, uint32_t bytes, int may_wait, int *rc)
{
    uint64_t         pos, pad, need, grow, end;
    struct msv_rec  *h;

    p->reserved = 0;
    *rc = -1;
    if (bytes < MSV_ROW_MIN || bytes % MSV_ROW_ALIGN
        || bytes > p->c->max_row_bytes)
    {
        return NULL;
    }

    if (p->rec_at != MSV_NO_REC) {
        grow = MSV_ALIGN16((uint64_t) p->rec_bytes + bytes);

        /* every row is at least MSV_ROW_MIN bytes: a bound on its count */
        if (grow <= p->c->max_rec_bytes
            && (p->rec_at & (p->cap - 1)) + grow <= p->cap
            && p->rec_rows + bytes / MSV_ROW_MIN <= UINT16_MAX)
        {
            *rc = msv_room(p, p->rec_at + grow, may_wait);
            if (*rc != 0) {
                return NULL;
            }
            p->reserved = bytes;
            return p->data + (p->rec_at & (p->cap - 1)) + p->rec_bytes;
        }

        /* publish this part; the step goes on in a new record */
        if (p->rec_rows > 0) {
            msv_rec_close(p);
        } else {
            p->rec_at = MSV_NO_REC;
        }
        msv_publish(p);
    }

    pos = p->head & (p->cap - 1);
    need = MSV_ALIGN16((uint64_t) MSV_REC_HDR + bytes);
    pad = pos + need > p->cap ? p->cap - pos : 0;
    end = p->head + pad + need;

    *rc = msv_room(p, end, may_wait);
    if (*rc != 0) {
        return NULL;
    }

    if (pad > 0) {
        /* a record never wraps: fill the rest of the ring with a pad */
        h = (struct msv_rec *) (p->data + pos);
        h->bytes = (uint32_t) pad;
        h->kind = MSV_REC_PAD;
        h->n_rows = 0;
        h->seq = p->seq;
        p->head += pad;
    }

    p->rec_at = p->head;
    p->rec_bytes = MSV_REC_HDR;
    p->rec_rows = 0;
    p->reserved = bytes;
    return p->data + (p->rec_at & (p->cap - 1)) + MSV_REC_HDR;
}


void *
msv_ring_reserve(struct msv_producer *p, uint32_t bytes)
{
    int  rc;

    if (p->n_defer > 0) {
        fprintf(stderr, "msv_ring_reserve: %u deferred runs not settled: "
                "nothing may go between them and their commit\n",
                p->n_defer);
        p->reserved = 0;
        return NULL;
    }
    return msv_place(p, bytes, 1, &rc);
}


void
msv_ring_commit(struct msv_producer *p, uint32_t bytes, uint32_t n_rows)
{
    const uint8_t  *rows;

    if (p->rec_at == MSV_NO_REC || bytes > p->reserved
        || bytes % MSV_ROW_ALIGN || (bytes == 0) != (n_rows == 0))
    {
        fprintf(stderr, "msv_ring_commit: %u bytes / %u rows do not match "
                "the %u bytes reserved; rows dropped\n", bytes, n_rows,
                p->reserved);
        p->reserved = 0;
        return;
    }

    /*
     * Check the rows now, in cache, rather than let every reader find a
     * malformed record and detach.
     */
    rows = p->data + (p->rec_at & (p->cap - 1)) + p->rec_bytes;
    if (msv_rows_span(rows, bytes, n_rows) != (int64_t) bytes) {
        fprintf(stderr, "msv_ring_commit: %u rows in %u bytes are malformed "
                "(row bytes must equal msv_row_size of its counts); rows "
                "dropped\n", n_rows, bytes);
        p->reserved = 0;
        return;
    }

    p->rec_bytes += bytes;
    p->rec_rows += n_rows;
    p->reserved = 0;
}


void
msv_ring_end(struct msv_producer *p)
{
    if (p->rec_at != MSV_NO_REC) {
        if (p->rec_rows > 0) {
            msv_rec_close(p);
        } else {
            p->rec_at = MSV_NO_REC;     /* reserved, never committed */
        }
    }
    msv_publish(p);     /* also covers a pad written for nothing */
}


int
msv_ring_defer(struct msv_producer *p, uint32_t bytes, uint32_t n_rows,
    void **at)
{
    int       rc;
    uint8_t  *w;

    *at = NULL;
    if (n_rows == 0 || n_rows > bytes / MSV_ROW_MIN) {
        return -1;
    }

    /* the first run may wait for readers as any reserve; later ones would
     * wait for readers held up by the runs themselves */
    w = msv_place(p, bytes, p->n_defer == 0, &rc);
    if (w == NULL) {
        return rc;
    }

    if (p->n_defer++ == 0) {
        p->held = p->rec_at;
        p->held_bytes = p->rec_bytes;
        p->held_rows = p->rec_rows;
        p->held_seq = p->seq;
    }

    /* counted now: a record closed before the bytes land has its header */
    p->rec_bytes += bytes;
    p->rec_rows += n_rows;
    p->reserved = 0;
    *at = w;
    return 0;
}


int
msv_ring_settle(struct msv_producer *p)
{
    uint64_t              at;
    const uint8_t        *r;
    const struct msv_rec *h;

    if (p->n_defer == 0) {
        return 0;
    }

    /*
     * The closed records from the held one on (headers written by
     * msv_rec_close, the pads by msv_place), then the open one.  Bounds
     * are checked too: a copy that ran past its run would show here.
     */
    for (at = p->held; at < p->head; at += h->bytes) {
        r = p->data + (at & (p->cap - 1));
        h = (const struct msv_rec *) r;
        if (h->bytes < MSV_REC_HDR || h->bytes % MSV_REC_ALIGN
            || at + h->bytes > p->head)
        {
            goto malformed;
        }
        if (h->kind == MSV_REC_PAD) {
            continue;
        }
        if (h->kind != MSV_REC_STEP
            || !msv_rec_valid(r, h->bytes, h->n_rows, p->c->max_rec_bytes))
        {
            goto malformed;
        }
    }
    if (p->rec_at != MSV_NO_REC && p->rec_rows > 0) {
        r = p->data + (p->rec_at & (p->cap - 1));
        if (msv_rows_span(r + MSV_REC_HDR, p->rec_bytes - MSV_REC_HDR,
                          p->rec_rows)
            != (int64_t) (p->rec_bytes - MSV_REC_HDR))
        {
            goto malformed;
        }
    }

    p->held = MSV_NO_REC;
    p->n_defer = 0;
    msv_publish(p);
    return 0;

malformed:

    fprintf(stderr, "msv_ring_settle: the rows of %u deferred runs are "
            "malformed (row bytes must equal msv_row_size of its counts); "
            "they are dropped\n", p->n_defer);
    msv_ring_drop(p);
    return -1;
}


void
msv_ring_drop(struct msv_producer *p)
{
    uint64_t  seq;

    if (p->n_defer == 0) {
        return;
    }

    /* the held record as it was before the first run (open: head is its
     * start); nothing of it or after it was public */
    p->head = p->held;
    p->rec_at = p->held;
    p->rec_bytes = p->held_bytes;
    p->rec_rows = p->held_rows;
    p->reserved = 0;
    p->held = MSV_NO_REC;
    p->n_defer = 0;

    if (p->rec_rows > 0) {
        seq = p->seq;
        p->seq = p->held_seq;       /* a step may have begun since */
        msv_rec_close(p);
        p->seq = seq;
    } else {
        p->rec_at = MSV_NO_REC;
    }
    msv_publish(p);
}


/* ------------------------------------------------------------------ */
/* Consumer                                                             */

void
msv_consumer_init(struct msv_consumer *k, struct msv_ctrl *c,
    uint32_t reader, uint64_t tail)
{
    k->c = c;
    k->me = msv_reader_at(c, reader);
    k->data = msv_ring_data(c);
    k->cap = c->ring_bytes;
    k->tail = tail;
    k->word = atomic_load_explicit(&k->me->state, memory_order_acquire);
}


/*
 * F3: acquire fence, pairs with F2 in msv_reader_evict.  If we still see
 * our entry as it was when we attached, the producer respected our tail
 * while we read, so what we read was the record it published.
 */
static int
msv_evicted(const struct msv_consumer *k)
{
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit(&k->me->state, memory_order_relaxed)
           != k->word;
}


long
msv_consume(struct msv_consumer *k, msv_row_fn fn, void *ud)
{
    return msv_consume_ahead(k, fn, NULL, ud);
}


long
msv_consume_ahead(struct msv_consumer *k, msv_row_fn fn, msv_hint_fn hint,
    void *ud)
{
    long                   n;
    uint32_t               r, d, known;
    uint64_t               head, avail, pos, off;
    uint64_t               offs[MSV_CONSUME_AHEAD + 1];
    const uint8_t         *at;
    const struct msv_rec  *h;
    const struct msv_row  *w;

    if (msv_evicted(k)) {
        return -1;      /* our tail no longer holds anything */
    }

    /* A1: acquire, pairs with R1 in msv_publish */
    head = atomic_load_explicit(&k->c->head, memory_order_acquire);

    avail = head - k->tail;
    if (avail > k->cap || avail % MSV_REC_ALIGN) {
        return -1;      /* lapped (evicted long ago) or a bad head */
    }

    n = 0;
    while (k->tail != head) {
        avail = head - k->tail;
        pos = k->tail & (k->cap - 1);
        at = k->data + pos;
        h = (const struct msv_rec *) at;

        if (h->bytes < MSV_REC_HDR || h->bytes % MSV_REC_ALIGN
            || h->bytes > avail || pos + h->bytes > k->cap)
        {
            return -1;
        }

        if (h->kind == MSV_REC_PAD) {
            if (pos + h->bytes != k->cap || h->n_rows != 0) {
                return -1;
            }

        } else if (h->kind == MSV_REC_STEP) {
            /* the rows fill the record up to its 16-byte padding */
            if (!msv_rec_valid(at, h->bytes, h->n_rows, k->c->max_rec_bytes))
            {
                return -1;
            }

            if (msv_evicted(k)) {
                return -1;      /* what we validated may not be the record */
            }

            /*
             * offs[(r + i) % (AHEAD + 1)], i < known: where rows r .. r +
             * known - 1 begin; off: the row after them (the layout was
             * validated above, so every row's bytes can be trusted)
             */
            off = MSV_REC_HDR;
            known = 0;
            for (r = 0; r < h->n_rows; r++) {
                while (known <= MSV_CONSUME_AHEAD && r + known < h->n_rows) {
                    offs[(r + known) % (MSV_CONSUME_AHEAD + 1)] = off;
                    off += ((const struct msv_row *) (at + off))->bytes;
                    known++;
                }

                if (hint != NULL) {
                    for (d = known - 1; d >= 1; d--) {
                        hint(ud, (const struct msv_row *)
                                 (at + offs[(r + d)
                                            % (MSV_CONSUME_AHEAD + 1)]), d);
                    }
                }

                w = (const struct msv_row *)
                    (at + offs[r % (MSV_CONSUME_AHEAD + 1)]);
                known--;

                if (fn != NULL && fn(ud, h->seq, w) != 0) {
                    return -1;  /* tail stays before this record */
                }
                n++;
            }

        } else {
            return -1;
        }

        if (msv_evicted(k)) {
            return -1;          /* the rows handed to fn may be garbage */
        }

        k->tail += h->bytes;

        /* R0: release, pairs with A0 in msv_ring_min_tail */
        atomic_store_explicit(&k->me->tail, k->tail, memory_order_release);
    }

    return n;
}


int
msv_consumer_arm(struct msv_consumer *k)
{
    uint64_t  head;

    /* F0: seq_cst store then seq_cst load, pairs with F1 in msv_publish */
    atomic_store_explicit(&k->me->armed, 1, memory_order_seq_cst);
    head = atomic_load_explicit(&k->c->head, memory_order_seq_cst);

    if (head != k->tail) {
        /* not sleeping after all: spare the producer an eventfd write */
        atomic_store_explicit(&k->me->armed, 0, memory_order_relaxed);
        return 1;
    }
    return 0;
}
