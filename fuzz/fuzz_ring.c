/*
 * fuzz_ring.c: libFuzzer target for the ring's reader (msv_consume_ahead
 * in shm/msv_ring.c, as the module calls it) fed hostile record
 * contents, as a reader would see them if the worker wrote garbage or
 * the region were tampered with.
 *
 * Input: 2 bytes of tail position, 2 bytes of head distance (in 16-byte
 * units, possibly more than the ring holds), then the ring's bytes from
 * the tail on, wrapping at the end.  The ring is its own allocation of
 * exactly MSV_FZ_CAP bytes, so a read outside it is reported.  The row
 * callback reads every payload entry the way the module does (ids, lps,
 * top entries, each formatted with the msv_json writers), so a row the
 * reader lets through with counts that overrun its record is caught too;
 * the hint callback checks the rows ahead it is shown the same way.
 *
 * Checked: the reader either rejects the ring (-1) or returns a row
 * count and a tail that moved forward by whole records, never past head.
 */

#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msv_ring.h"
#include "msv_json.h"


#define MSV_FZ_CAP   4096
#define MSV_FZ_BASE  ((uint64_t) 1 << 40)   /* free-running indices */

#define msv_fz_check(cond)                                                   \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "fuzz_ring: %s:%d: %s\n", __FILE__, __LINE__,    \
                    #cond);                                                  \
            abort();                                                         \
        }                                                                    \
    } while (0)


struct msv_fz_region {
    struct msv_ctrl    ctrl;
    struct msv_reader  reader;
};

static struct msv_fz_region  *msv_fz_rg;
static uint8_t               *msv_fz_ring;


static int
msv_fz_row(void *ud, uint64_t seq, const struct msv_row *w)
{
    char                  *buf;
    uint32_t               i;
    const uint8_t         *p = (const uint8_t *) w;
    const struct msv_top  *top;

    msv_fz_check(p >= msv_fz_ring
                 && p + w->bytes <= msv_fz_ring + MSV_FZ_CAP);
    msv_fz_check(w->bytes == msv_row_size(w->n_support, w->n_lps,
                                          w->n_top));

    buf = malloc(msv_json_ids_max(w->n_support));
    msv_json_ids(buf, msv_row_ids(w), w->n_support);
    free(buf);

    buf = malloc(msv_json_f32s_max(w->n_lps));
    msv_json_f32s(buf, msv_row_lps(w), w->n_lps);
    free(buf);

    buf = malloc(MSV_I32_MAX_CHARS + MSV_F32_MAX_CHARS);
    top = msv_row_top(w);
    for (i = 0; i < w->n_top; i++) {
        msv_fmt_i32(buf, top[i].id);
        msv_fmt_f32(buf + MSV_I32_MAX_CHARS, top[i].lp);
    }
    msv_fmt_f32(buf, w->logprob);
    free(buf);

    (*(long *) ud)++;
    return 0;
}


static void
msv_fz_hint(void *ud, const struct msv_row *w, unsigned ahead)
{
    const uint8_t  *p = (const uint8_t *) w;

    msv_fz_check(ahead >= 1 && ahead <= MSV_CONSUME_AHEAD);
    msv_fz_check(p >= msv_fz_ring
                 && p + w->bytes <= msv_fz_ring + MSV_FZ_CAP);
    msv_fz_check(w->bytes == msv_row_size(w->n_support, w->n_lps,
                                          w->n_top));
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    long                 n, rows;
    size_t               i, pos;
    uint64_t             tail, head;
    struct msv_consumer  k;

    if (size < 4) {
        return 0;
    }

    tail = MSV_FZ_BASE + ((uint64_t) (data[0] | data[1] << 8) * 16)
                         % MSV_FZ_CAP;
    head = tail + (uint64_t) (data[2] | data[3] << 8) * 16;
    data += 4;
    size -= 4;

    memset(msv_fz_ring, 0, MSV_FZ_CAP);
    for (i = 0; i < size && i < MSV_FZ_CAP; i++) {
        pos = (tail + i) & (MSV_FZ_CAP - 1);
        msv_fz_ring[pos] = data[i];
    }

    atomic_store(&msv_fz_rg->ctrl.head, head);
    atomic_store(&msv_fz_rg->reader.tail, tail);

    msv_consumer_init(&k, &msv_fz_rg->ctrl, 0, tail);
    k.data = msv_fz_ring;

    rows = 0;
    n = msv_consume_ahead(&k, msv_fz_row, msv_fz_hint, &rows);

    msv_fz_check(n == -1 || n == rows);
    msv_fz_check(k.tail >= tail && k.tail <= head);
    msv_fz_check(k.tail % 16 == 0);
    msv_fz_check(atomic_load(&msv_fz_rg->reader.tail) == k.tail);
    msv_fz_check(n == -1 || k.tail == head);
    return 0;
}


int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct msv_ctrl  *c;

    msv_fz_rg = aligned_alloc(alignof(struct msv_fz_region),
                              sizeof(struct msv_fz_region));
    msv_fz_ring = malloc(MSV_FZ_CAP);
    if (msv_fz_rg == NULL || msv_fz_ring == NULL) {
        abort();
    }
    memset(msv_fz_rg, 0, sizeof(*msv_fz_rg));

    c = &msv_fz_rg->ctrl;
    c->readers_off = offsetof(struct msv_fz_region, reader);
    c->n_readers = 1;
    c->ring_bytes = MSV_FZ_CAP;
    c->max_rec_bytes = MSV_FZ_CAP / 2;
    c->max_row_bytes = MSV_FZ_CAP / 4;
    atomic_store(&msv_fz_rg->reader.state, MSV_STATE_WORD(1, 2));
    return 0;
}
