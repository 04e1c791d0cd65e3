/*
 * test_sched_device.c: the scheduler's path for a device sampler
 * (worker/scheduler.c: msv_sched_sample_device, msv_sched_flush) without
 * a GPU.  A backend whose device is host memory: its forward makes logits
 * from each sequence's last token and position (a hash; all NaN after
 * token 99), its sample() runs the CPU sampler and packs each row in the
 * ring's format into a staging buffer as kernels/sampling.cu does, its
 * sample_copy() only poisons the destination and notes the copy, and the
 * bytes land at sample_wait(), the latest a DMA may land: a row whose
 * finish fields were written, or that was checked or published, before
 * its wait is caught.  A reader in this process checks every row (each
 * request's positions in order, nothing after its last row).
 *
 * The same requests run twice, through that path and through the CPU
 * sampler (the same forward, logits to the host), with the same events
 * at the same loop turns: a cancel of a running request, a request
 * cancelled before admission, a pause that holds every step, an abort of
 * everything in flight, a ring small enough that rows wait for room.  The
 * two streams of (seq, row) must be identical, byte for byte, and so the
 * control page's counters and the step log's lines; the device path's
 * copies must have run beside the next forward.  Then a copy that fails
 * and rows that come back malformed: the step fails, nothing of them is
 * published, and the aborts that follow reach the reader.
 */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap.h"
#include "shm_harness.h"
#include "backend.h"
#include "log.h"
#include "sampler.h"
#include "scheduler.h"


#define VOCAB      512
#define MAX_LP     8
#define SLOTS      8
#define MAX_LEN    96
#define RING       32768        /* 7 support rows of the whole vocab */
#define POISON     0xa5
#define STREAM_MAX (4u << 20)


/* ------------------------------------------------------------------ */
/* The backend                                                          */

struct fake_copy {
    uint8_t   *dst;
    uint64_t   off;
    uint64_t   bytes;
};

struct msv_backend {
    float                *dlogits;     /* [SLOTS][VOCAB]: the device's */
    float                *work;
    uint8_t              *pack;        /* packed rows of the last sample */
    uint64_t              off[SLOTS + 1];
    struct fake_copy      copy[SLOTS];
    uint32_t              n_copy;      /* started, not landed */
    struct msv_sampler   *smp;

    uint64_t              forwards;
    uint64_t              beside;      /* forwards with copies started */
    uint64_t              sample_early; /* samples with copies started */
    uint64_t              copies;
    uint64_t              lands;       /* waits that landed something */
    uint64_t              mid_lands;   /* of those, before the sample's
                                          last copy was started */
    int                   sampled;     /* a sample's copies go on */
    int                   fail_wait;   /* the next wait fails */
    int                   bad_row;     /* the next sample packs one row
                                          8 bytes short of its counts */
};


static uint32_t
fake_kv_pages(struct msv_backend *b, uint32_t *page_tokens)
{
    *page_tokens = MSV_KV_BLOCK;
    return 64;
}


static void
fake_logits(float *z, int32_t tok, uint32_t pos)
{
    uint32_t  v;
    uint64_t  r;

    for (v = 0; v < VOCAB; v++) {
        r = msv_mix64((uint64_t) tok * 1000003 + (uint64_t) pos * 7919
                      + v * 104729ULL);
        z[v] = tok == 99 ? NAN
               : (float) ((double) (r >> 40) / 16777216.0 - 0.5) * 8.0f;
    }
}


static int
fake_forward(struct msv_backend *b, const struct msv_batch *bt,
    float *logits, char *err, size_t errlen)
{
    uint32_t  s, t;
    float    *dst;

    b->forwards++;
    if (b->n_copy > 0) {
        b->beside++;
    }
    for (s = 0, t = 0; s < bt->n_seqs; s++) {
        t += bt->n_new[s];
        dst = (logits != NULL ? logits : b->dlogits) + (size_t) s * VOCAB;
        fake_logits(dst, bt->tokens[t - 1], bt->pos0[s] + bt->n_new[s] - 1);
    }
    return 0;
}


static void
fake_land(struct msv_backend *b)
{
    uint32_t  i;

    for (i = 0; i < b->n_copy; i++) {
        memcpy(b->copy[i].dst, b->pack + b->copy[i].off, b->copy[i].bytes);
    }
    if (b->n_copy > 0) {
        b->lands++;
    }
    b->n_copy = 0;
}


static int
fake_sample_init(struct msv_backend *b, uint32_t max_rows,
    uint32_t max_slots, uint32_t max_logprobs, void *ring,
    size_t ring_bytes, char *err, size_t errlen)
{
    return 0;
}


/* A row as the device packs it: the CPU path's row, finish 0, an abort
 * row with the request's mode (the scheduler sets it off). */
static uint32_t
fake_pack(uint8_t *at, const struct msv_sample_row *sr, int rc,
    const struct msv_sample_out *o)
{
    uint32_t         mode = sr->rq.p->mask_mode, n_sup = 0, n_lps = 0;
    uint32_t         n_top = 0, bytes;
    uint8_t         *p;
    struct msv_row  *w = (struct msv_row *) at;

    if (rc == 0) {
        if (mode != MSV_MASK_OFF) {
            n_sup = o->n_support;
            n_lps = mode == MSV_MASK_SUPPORT ? n_sup : 1;
        }
        n_top = o->n_top;
    }
    bytes = msv_row_size(n_sup, n_lps, n_top);

    memset(w, 0, bytes);
    w->bytes = bytes;
    w->slot = sr->slot;
    w->cookie = sr->cookie;
    w->token = rc == 0 ? o->token : -1;
    w->pos = sr->rq.t;
    w->n_support = n_sup;
    w->n_lps = n_lps;
    w->n_top = n_top;
    w->logprob = rc == 0 ? o->logprob : 0.0f;
    w->mode = (uint8_t) mode;

    p = (uint8_t *) (w + 1);
    if (n_sup > 0) {
        memcpy(p, o->ids, 4 * (size_t) n_sup);
        p += 4 * (size_t) n_sup;
        memcpy(p, n_lps == 1 ? &o->logprob : o->lps, 4 * (size_t) n_lps);
        p += 4 * (size_t) n_lps;
    }
    if (n_top > 0) {
        memcpy(p, o->top, sizeof(struct msv_top) * n_top);
    }
    return bytes;
}


static int
fake_sample(struct msv_backend *b, const struct msv_sample_row *rows,
    uint32_t n, struct msv_sample_res *res, char *err, size_t errlen)
{
    int                    rc;
    uint32_t               i;
    struct msv_sample_out  o;

    /* the packing waits on the device for copies still reading */
    if (b->n_copy > 0) {
        b->sample_early++;
        fake_land(b);
    }

    b->off[0] = 0;
    for (i = 0; i < n; i++) {
        memcpy(b->work, b->dlogits + (size_t) rows[i].row * VOCAB,
               VOCAB * sizeof(float));
        rc = msv_sample(b->smp, b->work, &rows[i].rq, &o);
        res[i].bytes = fake_pack(b->pack + b->off[i], &rows[i], rc, &o);
        res[i].token = rc == 0 ? o.token : -1;
        res[i].logprob = rc == 0 ? o.logprob : 0.0f;
        res[i].n_support = rc == 0 ? o.n_support : 0;
        b->off[i + 1] = b->off[i] + res[i].bytes;
    }
    if (b->bad_row && n > 0) {
        b->bad_row = 0;
        ((struct msv_row *) (b->pack + b->off[n - 1]))->n_top += 1;
    }
    b->sampled = 1;
    return 0;
}


static int
fake_sample_copy(struct msv_backend *b, uint32_t first, uint32_t n,
    void *dst, char *err, size_t errlen)
{
    struct fake_copy  *c = &b->copy[b->n_copy++];

    if (!b->sampled) {
        b->mid_lands++;         /* a wait came between two copies */
        b->sampled = 1;
    }
    c->dst = dst;
    c->off = b->off[first];
    c->bytes = b->off[first + n] - b->off[first];
    memset(dst, POISON, c->bytes);      /* the copy is under way */
    b->copies++;
    return 0;
}


static int
fake_sample_wait(struct msv_backend *b, char *err, size_t errlen)
{
    if (b->fail_wait) {
        b->fail_wait = 0;
        b->n_copy = 0;
        snprintf(err, errlen, "fake: copy failed");
        return -1;
    }
    fake_land(b);
    b->sampled = 0;
    return 0;
}


static const struct msv_backend_ops  fake_ops = {
    "fake",
    NULL,
    fake_kv_pages,
    fake_forward,
    NULL,
    NULL,
    NULL,
    fake_sample_init,
    fake_sample,
    fake_sample_copy,
    fake_sample_wait,
    NULL,
    NULL,
    NULL,
    NULL
};


/* ------------------------------------------------------------------ */
/* The reader                                                           */

struct req {
    uint64_t   cookie;
    uint32_t   slot;
    uint32_t   next;            /* position of the next row */
    int        done;
    uint32_t   finish, why;
};

struct run {
    struct hw             w;
    struct msv_consumer   k;
    struct msv_sched      s;
    struct msv_backend    be;
    int                   dev;
    struct req            req[32];
    uint32_t              n_req;
    uint8_t              *stream;   /* (seq, row with ids for cookies) */
    size_t                len;
    uint64_t              rows;
    int                   gap_ok;   /* an abort row may follow lost rows */
    int                   bad;
    char                  why[200];
    char                  log[128];
};


static int
on_row(void *ud, uint64_t seq, const struct msv_row *w)
{
    uint32_t        i;
    struct run     *r = ud;
    struct req     *q;
    struct msv_row  h;

    for (i = 0; i < r->n_req && r->req[i].cookie != w->cookie; i++) { }
    if (i == r->n_req || r->req[i].done
        || (w->pos != r->req[i].next
            && !(r->gap_ok && w->token == -1 && w->pos > r->req[i].next))
        || w->slot != r->req[i].slot
        || r->len + 8 + w->bytes > STREAM_MAX)
    {
        snprintf(r->why, sizeof(r->why), "seq %llu: a row of no request, "
                 "after a request's last, or out of order (pos %u, slot %u)",
                 (unsigned long long) seq, w->pos, w->slot);
        r->bad = 1;
        return -1;
    }
    q = &r->req[i];
    q->next = w->pos + 1;
    if (w->finish != MSV_FINISH_NONE) {
        q->done = 1;
        q->finish = w->finish;
        q->why = w->abort_reason;
    }

    /* the stream names requests by index: cookies differ between runs */
    h = *w;
    h.cookie = i;
    memcpy(r->stream + r->len, &seq, 8);
    memcpy(r->stream + r->len + 8, &h, sizeof(h));
    memcpy(r->stream + r->len + 8 + sizeof(h), w + 1, w->bytes - sizeof(h));
    r->len += 8 + w->bytes;
    r->rows++;
    return 0;
}


static void
consume(struct run *r)
{
    if (!r->bad && msv_consume(&r->k, on_row, r) < 0 && !r->bad) {
        snprintf(r->why, sizeof(r->why), "msv_consume: a malformed record");
        r->bad = 1;
    }
}


/* The producer's wait: the reader reads meanwhile. */
static int
reader_wait(void *ud, uint64_t waited_ns)
{
    struct run  *r = ud;

    consume(r);
    return r->bad || waited_ns > 5000000000ULL ? -1 : 0;
}


static uint32_t
submit(struct run *r, const struct msv_params *p, uint32_t n_prompt,
    int32_t last)
{
    int         i;
    int32_t     prompt[MAX_LEN];
    uint32_t    j;
    char        id[32];
    struct req *q = &r->req[r->n_req];

    for (j = 0; j < n_prompt; j++) {
        prompt[j] = (int32_t) (1 + (r->n_req * 37 + j * 11) % 90);
    }
    prompt[n_prompt - 1] = last;
    snprintf(id, sizeof(id), "r%u", r->n_req);
    i = msv_slot_claim(r->w.rg.ctrl, 0, (int32_t) getpid());
    memset(q, 0, sizeof(*q));
    q->slot = (uint32_t) i;
    q->cookie = i < 0 ? 0 : msv_slot_submit(r->w.rg.ctrl, (uint32_t) i, id,
                                            p, prompt, n_prompt, NULL);
    if (q->cookie == 0) {
        r->bad = 1;
        snprintf(r->why, sizeof(r->why), "request %u not submitted",
                 r->n_req);
    }
    return r->n_req++;
}


/* Give every finished slot back, as the reader does after a last row. */
static void
release_done(struct run *r)
{
    uint32_t  i;

    for (i = 0; i < r->n_req; i++) {
        if (r->req[i].done && r->req[i].cookie != 0) {
            msv_slot_release(r->w.rg.ctrl, r->req[i].slot, r->req[i].cookie);
            r->req[i].cookie = ~(uint64_t) i;   /* no row matches any more */
        }
    }
}


/* One turn of the worker's main loop (worker/main.c), the reader after
 * it.  -1 when the step failed. */
static int
turn(struct run *r)
{
    int  rc;

    rc = 0;
    if (!msv_sched_runnable(&r->s)) {
        rc = msv_sched_flush(&r->s);    /* before it would wait for work */
    }
    consume(r);
    if (rc == 0 && msv_sched_step(&r->s) < 0) {
        rc = -1;
    }
    consume(r);
    return rc;
}


static int
start(struct run *r, int dev, const char *tag, const char *dir)
{
    char               name[64], why[256];
    struct msv_layout  lay;

    memset(r, 0, sizeof(*r));
    r->dev = dev;
    r->stream = malloc(STREAM_MAX);
    r->be.dlogits = malloc((size_t) SLOTS * VOCAB * sizeof(float));
    r->be.work = malloc(VOCAB * sizeof(float));
    r->be.pack = malloc((size_t) SLOTS * msv_row_size(VOCAB, VOCAB, MAX_LP));
    r->be.smp = msv_sampler_new(VOCAB);
    if (r->stream == NULL || r->be.dlogits == NULL || r->be.work == NULL
        || r->be.pack == NULL || r->be.smp == NULL)
    {
        return -1;
    }

    memset(&lay, 0, sizeof(lay));
    lay.n_slots = SLOTS;
    lay.n_readers = 2;
    lay.vocab_size = VOCAB;
    lay.max_model_len = MAX_LEN;
    lay.max_logprobs = MAX_LP;
    lay.n_eos = 1;
    lay.eos_ids[0] = 2;
    lay.ring_bytes = RING;
    lay.model = "test-model";
    lay.backend = "fake";
    hx_name(name, sizeof(name), tag);
    if (hw_start(&r->w, name, &lay) != 0
        || hw_self_attach(&r->w, 0, &r->k) != 0)
    {
        return -1;
    }
    r->w.p.wait = reader_wait;
    r->w.p.wait_ud = r;

    if (msv_sched_init(&r->s, r->w.rg.ctrl, &fake_ops, &r->be, &r->w.p, 64,
                       7, 1, 1) != 0)
    {
        tap_diag("%s", r->s.err);
        return -1;
    }
    snprintf(r->log, sizeof(r->log), "%s/%s.log", dir, tag);
    if (msv_sched_step_log(&r->s, r->log) != 0) {
        return -1;
    }
    if (dev && msv_sched_device_sampler(&r->s, why, sizeof(why)) != 1) {
        tap_diag("%s", why);
        return -1;
    }
    return 0;
}


static void
stop(struct run *r)
{
    char  name[64];

    snprintf(name, sizeof(name), "%s", r->w.rg.name + 1);
    msv_sched_free(&r->s);
    hw_close(&r->w);
    msv_region_unlink(name);
    msv_sampler_free(r->be.smp);
    free(r->be.dlogits);
    free(r->be.work);
    free(r->be.pack);
    free(r->stream);
}


static void
params(struct msv_params *p, uint32_t mode, int32_t top_k, int32_t lp,
    uint32_t max_tokens)
{
    memset(p, 0, sizeof(*p));
    p->max_tokens = max_tokens;
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->top_k = top_k;
    p->repetition_penalty = 1.0f;
    p->mask_mode = mode;
    p->logprobs = lp;
    p->has_seed = 1;
    p->seed = 1000 + max_tokens * 7 + (uint64_t) top_k;
    p->n = 1;
}


/*
 * The scenario, the same for both runs: events keyed to loop turns.
 * Returns 0 once everything ran; -1 if a step failed.
 */
static int
scenario(struct run *r)
{
    int                 it;
    uint32_t            i, n, cancel, late;
    struct msv_params   p;

    /* 1: seven requests of every kind, one of them aborted by its logits */
    params(&p, MSV_MASK_SUPPORT, 20, 3, 12);
    submit(r, &p, 5, 7);
    params(&p, MSV_MASK_SELECTED, 0, -1, 15);
    p.top_p = 0.9f;
    p.repetition_penalty = 1.2f;
    submit(r, &p, 9, 8);
    params(&p, MSV_MASK_OFF, 0, -1, 30);
    cancel = submit(r, &p, 4, 9);
    params(&p, MSV_MASK_SUPPORT, 0, 2, 10);
    submit(r, &p, 6, 99);                           /* NaN logits */
    params(&p, MSV_MASK_SUPPORT, 50, -1, 8);
    p.temperature = 0.0f;
    submit(r, &p, 3, 10);
    params(&p, MSV_MASK_SELECTED, 0, 1, 25);
    p.n_stop = 2;
    p.stop_ids[0] = 17;
    p.stop_ids[1] = 301;
    submit(r, &p, 7, 11);
    params(&p, MSV_MASK_SUPPORT, 0, MAX_LP, 20);    /* whole vocab rows */
    p.min_tokens = 5;
    submit(r, &p, 8, 12);
    late = 0;

    for (it = 0; it < 12 || msv_sched_pending(&r->s) > 0; it++) {
        if (it == 3) {
            msv_slot_cancel(r->w.rg.ctrl, r->req[cancel].slot,
                            r->req[cancel].cookie);
        }
        if (it == 4) {
            /* aborted at admission while the last step's rows wait */
            params(&p, MSV_MASK_SUPPORT, 5, -1, 4);
            late = submit(r, &p, 3, 13);
            msv_slot_cancel(r->w.rg.ctrl, r->req[late].slot,
                            r->req[late].cookie);
        }
        r->s.hold = it >= 6 && it < 8 ? MSV_HOLD_ALL : MSV_HOLD_NONE;
        if (turn(r) != 0 || r->bad || it > 400) {
            return -1;
        }
    }
    /* as the worker before it waits for work */
    if (msv_sched_flush(&r->s) != 0) {
        return -1;
    }
    consume(r);
    release_done(r);

    /* 2: four requests of the largest rows, everything in flight aborted
     * after a few steps */
    n = r->n_req;
    for (i = 0; i < 4; i++) {
        params(&p, MSV_MASK_SUPPORT, 0, MAX_LP, 30);
        p.seed += i;
        submit(r, &p, 4 + i, 20 + (int32_t) i);
    }
    for (it = 0; it < 4; it++) {
        if (turn(r) != 0) {
            return -1;
        }
    }
    if (msv_sched_abort_in_flight(&r->s, MSV_ABORT_PAUSED, &i) != 0
        || i != 4)
    {
        return -1;
    }
    consume(r);
    for (it = 0; it < 3; it++) {
        if (turn(r) != 0) {
            return -1;
        }
    }
    for (i = n; i < r->n_req; i++) {
        if (!r->req[i].done || r->req[i].why != MSV_ABORT_PAUSED) {
            snprintf(r->why, sizeof(r->why), "request %u: no abort row", i);
            r->bad = 1;
        }
    }
    return 0;
}


/* ------------------------------------------------------------------ */
/* Step logs                                                            */

struct steps {
    uint32_t  n;
    uint64_t  sampled[512], bytes[512], flush[512];
    int       bad;
};

static void
read_steps(const char *path, struct steps *st)
{
    char                line[512];
    unsigned long long  v[14];
    FILE               *f;

    memset(st, 0, sizeof(*st));
    f = fopen(path, "r");
    if (f == NULL) {
        st->bad = 1;
        return;
    }
    while (fgets(line, sizeof(line), f) != NULL && st->n < 512) {
        if (sscanf(line, "step %llu t0_ns %llu t1_ns %llu seqs %llu decode "
                   "%llu prefill %llu sampled %llu active %llu fwd_ns %llu "
                   "sample_ns %llu ring_ns %llu ring_bytes %llu host_ns %llu "
                   "flush_ns %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                   &v[6], &v[7], &v[8], &v[9], &v[10], &v[11], &v[12],
                   &v[13]) != 14
            || v[8] + v[9] + v[10] + v[12] + v[13] != v[2] - v[1])
        {
            st->bad = 1;
        }
        st->sampled[st->n] = v[6];
        st->bytes[st->n] = v[11];
        st->flush[st->n] = v[13];
        st->n++;
    }
    fclose(f);
}


/* ------------------------------------------------------------------ */
/* Tests                                                                */

static void
test_same_rows(const char *dir)
{
    int           rc[2], same_ctrl, same_log;
    uint32_t      i, m, flushed;
    struct run   *r;
    struct steps  st[2];

    r = calloc(2, sizeof(*r));
    for (m = 0; m < 2; m++) {
        rc[m] = start(&r[m], m, m ? "dev" : "cpu", dir);
        if (rc[m] == 0) {
            rc[m] = scenario(&r[m]);
        }
        tap_ok(rc[m] == 0 && !r[m].bad, "%s sampler: the scenario ran, "
               "every row in order and the last of each request last (%llu "
               "rows)%s%s", m ? "device" : "CPU",
               (unsigned long long) r[m].rows, r[m].bad ? ": " : "",
               r[m].why);
    }

    tap_ok(r[0].len == r[1].len && r[0].len > 0
           && memcmp(r[0].stream, r[1].stream, r[0].len) == 0,
           "device rows, copied and flushed late: the same (seq, row) "
           "stream as the CPU sampler's, byte for byte (%zu / %zu bytes)",
           r[0].len, r[1].len);

    same_ctrl = 1;
    for (i = 0; i < 4; i++) {
        same_ctrl &= atomic_load(&r[0].w.rg.ctrl->rows_by_mode[i])
                     == atomic_load(&r[1].w.rg.ctrl->rows_by_mode[i])
                     && atomic_load(&r[0].w.rg.ctrl->row_bytes_by_mode[i])
                        == atomic_load(&r[1].w.rg.ctrl->row_bytes_by_mode[i])
                     && atomic_load(&r[0].w.rg.ctrl->finished[i])
                        == atomic_load(&r[1].w.rg.ctrl->finished[i]);
    }
    for (i = 0; i < 8; i++) {
        same_ctrl &= atomic_load(&r[0].w.rg.ctrl->aborted[i])
                     == atomic_load(&r[1].w.rg.ctrl->aborted[i]);
    }
    same_ctrl &= atomic_load(&r[0].w.rg.ctrl->tokens)
                 == atomic_load(&r[1].w.rg.ctrl->tokens)
                 && atomic_load(&r[0].w.rg.ctrl->steps)
                    == atomic_load(&r[1].w.rg.ctrl->steps);
    tap_ok(same_ctrl && atomic_load(&r[1].w.rg.ctrl->rows_by_mode[0]) > 0
           && atomic_load(&r[1].w.rg.ctrl->aborted[MSV_ABORT_INTERNAL]) >= 1
           && atomic_load(&r[1].w.rg.ctrl->aborted[MSV_ABORT_CANCELLED]) == 2
           && atomic_load(&r[1].w.rg.ctrl->aborted[MSV_ABORT_PAUSED]) == 4,
           "the control page's rows and bytes by mode, finishes, aborts, "
           "tokens and steps: the same");

    tap_ok(r[1].be.copies > 0 && r[1].be.beside * 2 > r[1].be.forwards,
           "device: %llu of %llu forwards ran while the last step's copies "
           "were still under way", (unsigned long long) r[1].be.beside,
           (unsigned long long) r[1].be.forwards);
    tap_ok(r[1].be.sample_early == 0,
           "device: every copy landed before the next sample");
    tap_ok(atomic_load(&r[1].w.rg.ctrl->ring_waits) > 0
           && r[1].be.mid_lands > 0,
           "device: rows waited for room (%llu waits); %llu times the runs "
           "held back went out first",
           (unsigned long long) atomic_load(&r[1].w.rg.ctrl->ring_waits),
           (unsigned long long) r[1].be.mid_lands);

    for (m = 0; m < 2; m++) {
        stop(&r[m]);                    /* closes the step log */
        read_steps(r[m].log, &st[m]);
    }
    same_log = st[0].n == st[1].n && st[0].n > 0;
    flushed = 0;
    for (i = 0; same_log && i < st[0].n; i++) {
        same_log = st[0].sampled[i] == st[1].sampled[i]
                   && st[0].bytes[i] == st[1].bytes[i] && st[0].flush[i] == 0;
        flushed += st[1].flush[i] > 0;
    }
    tap_ok(!st[0].bad && !st[1].bad && same_log && flushed > 0,
           "step logs: %u lines each, every stage adding up to the step, the "
           "same tokens and ring bytes on each; flush_ns 0 on the CPU, "
           "above 0 on %u device lines", st[0].n, flushed);

    free(r);
}


/*
 * A step whose flush fails (the copy failed, or its rows came back
 * malformed): the step fails, the rows are never published, and the
 * aborts of the shutdown after it reach the reader.
 */
static void
test_failure(const char *dir, int malformed)
{
    int                 it, rc;
    uint32_t            i;
    uint64_t            head;
    struct run         *r;
    struct msv_params   p;
    const char         *what = malformed ? "malformed rows" : "a failed copy";

    r = calloc(1, sizeof(*r));
    if (!tap_ok(start(r, 1, malformed ? "bad" : "fail", dir) == 0,
                "%s: started", what))
    {
        free(r);
        return;
    }
    for (i = 0; i < 3; i++) {
        params(&p, MSV_MASK_SUPPORT, 30, 2, 40);
        p.seed += i;
        submit(r, &p, 4, 30 + (int32_t) i);
    }
    for (it = 0; it < 4; it++) {
        turn(r);
    }

    /* the rows of the step about to be sampled fail */
    if (malformed) {
        r->be.bad_row = 1;
        rc = turn(r);           /* samples, defers */
    } else {
        rc = turn(r);
        r->be.fail_wait = 1;
    }
    head = atomic_load(&r->w.rg.ctrl->head);
    fprintf(stderr, "# expected: %s\n", malformed
            ? "a settle message about malformed rows" : "nothing");
    rc = rc == 0 ? turn(r) : rc;
    tap_ok(rc == -1 && strstr(r->s.err, malformed ? "malformed" : "copy")
                       != NULL,
           "%s: the step fails (%s)", what, r->s.err);
    consume(r);
    tap_ok(!r->bad && atomic_load(&r->w.rg.ctrl->head) == head
           && r->s.pend_from == r->s.n_pend && r->w.p.n_defer == 0,
           "%s: nothing of those rows published, none left pending", what);

    r->gap_ok = 1;
    tap_ok(msv_sched_abort_all(&r->s, MSV_ABORT_INTERNAL) == 0,
           "%s: then the shutdown's aborts", what);
    consume(r);
    for (i = 0; i < r->n_req; i++) {
        if (!r->req[i].done || r->req[i].why != MSV_ABORT_INTERNAL) {
            break;
        }
    }
    tap_ok(!r->bad && i == r->n_req, "%s: every request's abort row reached "
           "the reader, after its earlier rows%s%s", what,
           r->bad ? ": " : "", r->why);
    stop(r);
    free(r);
}


int
main(void)
{
    char  dir[] = "/tmp/msv-sched-XXXXXX";
    char  cmd[64];

    alarm(120);
    msv_log_level = MSV_LOG_ERROR;
    if (mkdtemp(dir) == NULL) {
        tap_ok(0, "a scratch directory");
        return tap_done();
    }

    test_same_rows(dir);
    test_failure(dir, 0);
    test_failure(dir, 1);

    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0) {
        tap_diag("could not remove %s", dir);
    }
    return tap_done();
}
