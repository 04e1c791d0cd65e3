/*
 * msv_ring.h: the output ring.  One producer (the worker) appends
 * variable-length records; every attached reader consumes all of them at
 * its own pace and picks out its own requests' rows.
 */

#ifndef MSV_RING_H
#define MSV_RING_H

#include <stdint.h>

#include "msv_shm.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Called by the producer while the ring is full because some attached
 * reader lags.  It should service liveness (detach dead readers, which
 * frees their tails) and sleep briefly.  waited_ns is how long this wait
 * has lasted.  Return 0 to keep waiting, -1 to give up (the reserve then
 * fails).
 */
typedef int (*msv_wait_fn)(void *ud, uint64_t waited_ns);

struct msv_producer {
    struct msv_ctrl  *c;
    uint8_t          *data;
    uint64_t          cap;          /* ring_bytes */
    uint64_t          head;         /* private copy of c->head */
    uint64_t          seq;          /* step of the open record */
    uint64_t          rec_at;       /* start of the open record, or ~0 */
    uint32_t          rec_bytes;    /* header + rows so far */
    uint32_t          rec_rows;
    uint32_t          reserved;     /* bytes of the last reserve */
    uint64_t          limit;        /* writable below this (cached
                                       min tail + cap) */

    /* deferred runs (msv_ring_defer): nothing from `held` on is public */
    uint64_t          held;         /* start of the record the first
                                       deferred run went into, or ~0 */
    uint32_t          n_defer;      /* runs deferred and not settled */
    uint32_t          held_bytes;   /* that record before the run: what */
    uint32_t          held_rows;    /* msv_ring_drop keeps of it */
    uint64_t          held_seq;

    msv_wait_fn       wait;
    void             *wait_ud;
    int               wake_fd[MSV_MAX_READERS];   /* -1: none */
};

void msv_producer_init(struct msv_producer *p, struct msv_ctrl *c,
    msv_wait_fn wait, void *wait_ud);

/* Open a step.  Rows reserved until msv_ring_end carry this seq. */
void msv_ring_begin(struct msv_producer *p, uint64_t seq);

/*
 * Contiguous room for `bytes` (rows, 8-aligned) in the open step.  If the
 * open record cannot grow that far (ctrl->max_rec_bytes, or the end of
 * the ring) the record so far is published as one part and a new part
 * begins.  Waits through p->wait while readers lag.  Returns NULL when
 * bytes > max_row_bytes, the wait gave up, or runs are deferred (see
 * msv_ring_defer).
 */
void *msv_ring_reserve(struct msv_producer *p, uint32_t bytes);

/* The caller wrote `bytes` (<= reserved) holding n_rows rows.  The rows
 * are checked (each row's bytes == msv_row_size of its counts); bad ones
 * are dropped with a message on stderr. */
void msv_ring_commit(struct msv_producer *p, uint32_t bytes,
    uint32_t n_rows);

/* Publish the open record (if it has rows) and wake armed readers.
 * With runs deferred, their records and those after are closed but held
 * back: msv_ring_settle publishes them. */
void msv_ring_end(struct msv_producer *p);

/*
 * Deferred runs, for rows whose bytes arrive after the reservation (a
 * DMA copy from the device that runs while the producer goes on):
 * contiguous room for `bytes` holding n_rows rows in the open step, laid
 * out as msv_ring_reserve does and counted into the open record at once;
 * the caller has them written later.  Nothing from the record of the
 * first deferred run on is published until msv_ring_settle, which checks
 * them, or msv_ring_drop, which forgets them; a step may begin and end
 * meanwhile (its records close and wait), and runs may be deferred over
 * several steps, in order.  Until then msv_ring_reserve refuses: nothing
 * else goes between the runs and their commit.
 *
 * Returns 0 with *at set.  1 when the room is not there now and runs are
 * already deferred: readers may be waiting for exactly those records, so
 * this does not wait (settle, then defer again; nothing was reserved).
 * -1 when bytes > max_row_bytes, n_rows is 0 or more than bytes holds,
 * or, with nothing deferred, the wait gave up as in msv_ring_reserve.
 */
int msv_ring_defer(struct msv_producer *p, uint32_t bytes, uint32_t n_rows,
    void **at);

/*
 * Every deferred byte has been written: check the held records as a
 * reader would, then publish everything closed.  0 (also when nothing
 * was deferred); -1 if a row is malformed, and then every deferred run
 * is dropped as by msv_ring_drop, with a message on stderr.
 */
int msv_ring_settle(struct msv_producer *p);

/*
 * Forget every deferred run, once nothing writes their bytes any more:
 * head goes back to where the first one began, the records after it
 * vanish unseen (they never were public).  The rows committed before the
 * first run in its record stay: that record is closed, with its own seq,
 * and published.
 */
void msv_ring_drop(struct msv_producer *p);

/* Smallest tail among attached readers, or head when there are none. */
uint64_t msv_ring_min_tail(struct msv_ctrl *c, uint64_t head);


/* Consumer side. */
typedef int (*msv_row_fn)(void *ud, uint64_t seq, const struct msv_row *w);

struct msv_consumer {
    struct msv_ctrl    *c;
    struct msv_reader  *me;
    const uint8_t      *data;
    uint64_t            cap;
    uint64_t            tail;       /* private copy of me->tail */
    uint64_t            word;       /* me->state when attached: any
                                       change means we were evicted */
};

/* Call once the entry is ATTACHED (msv_attach does): the state word
 * seen here is how msv_consume notices an eviction later. */
void msv_consumer_init(struct msv_consumer *k, struct msv_ctrl *c,
    uint32_t reader, uint64_t tail);

/*
 * Read every record published since the last call, call fn for each row
 * (the row is valid only during the call), and release the tail after
 * each record.  Returns the number of rows, or -1 if a record is
 * malformed or this reader was evicted (the reader should detach: the
 * region is not what it thinks).  A non-zero return from fn stops early,
 * -1 as well; the tail then stays before that record.
 */
long msv_consume(struct msv_consumer *k, msv_row_fn fn, void *ud);

/*
 * msv_consume that also tells the reader, before each row, of the rows
 * of the same record up to MSV_CONSUME_AHEAD ahead of it: hint(ud, w, d)
 * for the row d rows ahead, d = MSV_CONSUME_AHEAD .. 1, so that a reader
 * whose rows go to state scattered in memory (a request each) can fetch
 * that state in stages while it handles the rows before.  A hint must
 * not change anything; the row is valid only during the call.
 */
#define MSV_CONSUME_AHEAD  4

typedef void (*msv_hint_fn)(void *ud, const struct msv_row *w,
    unsigned ahead);

long msv_consume_ahead(struct msv_consumer *k, msv_row_fn fn,
    msv_hint_fn hint, void *ud);

/*
 * Before blocking on its eventfd: arm, then look again.  Returns 1 if
 * records arrived meanwhile (consume again instead of sleeping), 0 if
 * it is safe to sleep.
 */
int msv_consumer_arm(struct msv_consumer *k);

#ifdef __cplusplus
}
#endif

#endif /* MSV_RING_H */
