/*
 * scheduler.c: continuous batching over the slot table.
 *
 * Each iteration: bring back preempted sequences, then pick up SUBMITTED
 * slots (FIFO by submission time) while KV pages for what each needs now
 * are available; turn cancels into abort rows; give every decoding
 * sequence the page its next token needs, preempting the most recently
 * admitted sequences when the pool runs dry; run one forward over the
 * decoding sequences (one token each) and prefill chunks (up to
 * max_batched tokens per step); sample; publish one record of rows.  Rows
 * sampled on the device are copied into the ring while the next step's
 * forward runs, and published right after it (msv_sched_flush).
 *
 * KV pages come from the allocator in kv.h.  A request is admitted with
 * pages for its prompt; full prompt pages already cached by an earlier
 * request (same tokens from position 0) are shared instead of computed.
 * A preempted sequence keeps its tokens and its slot (still RUNNING for
 * the reader); when it comes back it recomputes prompt + outputs into
 * new pages, mostly found in the cache, and goes on sampling at the next
 * output position.  Rows leave through the ring as they are made, so
 * nothing is sent twice.  A request that could not fit even alone in the
 * whole pool ends with MSV_ABORT_NO_KV at admission.
 */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../shm/msv_params.h"
#include "../shm/msv_region.h"
#include "../shm/msv_ring.h"
#include "../shm/msv_slots.h"
#include "log.h"
#include "mix.h"
#include "scheduler.h"


/* A device-sampled row waiting for its copy (msv_sched_flush). */
struct msv_sched_pend {
    struct msv_row   *w;            /* where its copy lands in the ring */
    uint8_t           finish;       /* its finish fields, taken already */
    uint8_t           why;
};


/* Move a slot between states, keeping its owner pid.  0 if it moved. */
static int
msv_slot_move(struct msv_slot *sl, uint32_t from, uint32_t to)
{
    uint64_t  w = atomic_load_explicit(&sl->state, memory_order_relaxed);

    if (MSV_STATE_OF(w) != from) {
        return -1;
    }

    /*
     * R-slot: release, so the worker-written fields (seed_used, finish,
     * times) are visible to a reader that acquires this state word;
     * pairs with the acquire loads in msv_slot_release/msv_slot_state.
     */
    return atomic_compare_exchange_strong_explicit(&sl->state, &w,
               MSV_STATE_WORD(MSV_PID_OF(w), to), memory_order_acq_rel,
               memory_order_relaxed) ? 0 : -1;
}


int
msv_sched_init(struct msv_sched *s, struct msv_ctrl *c,
    const struct msv_backend_ops *ops, struct msv_backend *be,
    struct msv_producer *prod, uint32_t max_batched, uint64_t seed,
    int sample_threads, int prefix_caching)
{
    uint32_t  i, n, n_pages, page_tokens;

    memset(s, 0, sizeof(*s));
    s->c = c;
    s->ops = ops;
    s->be = be;
    s->prod = prod;
    s->n_slots = n = c->n_slots;
    s->vocab = c->vocab_size;
    s->max_len = c->max_model_len;
    s->max_batched = max_batched < n ? n : max_batched;
    s->n_eos = c->n_eos;
    memcpy(s->eos, c->eos_ids, sizeof(s->eos));
    s->seed_state = seed;

    s->pool = msv_sample_pool_new(s->vocab, sample_threads);
    s->items = calloc(n, sizeof(struct msv_sample_item));
    s->seqs = calloc(n, sizeof(struct msv_seq));
    s->logits = ops->host_alloc != NULL
                ? ops->host_alloc((size_t) n * s->vocab * sizeof(float))
                : malloc((size_t) n * s->vocab * sizeof(float));
    s->b_seq = malloc(n * sizeof(uint32_t));
    s->b_new = malloc(n * sizeof(uint32_t));
    s->b_pos0 = malloc(n * sizeof(uint32_t));
    s->b_pages = malloc(n * sizeof(const uint32_t *));
    s->b_npages = malloc(n * sizeof(uint32_t));
    s->r_order = malloc(n * sizeof(uint32_t));
    s->a_order = malloc(n * sizeof(uint32_t));
    s->p_list = malloc(n * sizeof(uint32_t));
    s->b_order = malloc(n * sizeof(uint32_t));
    s->b_tok = malloc((size_t) (s->max_batched + n) * sizeof(int32_t));

    if (s->pool == NULL || s->items == NULL || s->seqs == NULL || s->logits == NULL
        || s->b_seq == NULL || s->b_new == NULL || s->b_pos0 == NULL
        || s->b_pages == NULL || s->b_npages == NULL || s->r_order == NULL
        || s->a_order == NULL
        || s->p_list == NULL
        || s->b_order == NULL || s->b_tok == NULL)
    {
        snprintf(s->err, sizeof(s->err), "out of memory for the scheduler");
        return -1;
    }

    n_pages = ops->kv_pages(be, &page_tokens);
    if (msv_kv_init(&s->kv, n_pages, page_tokens, n, s->max_len,
                    prefix_caching) != 0)
    {
        snprintf(s->err, sizeof(s->err), "out of memory for %u KV pages of "
                 "%u tokens", n_pages, page_tokens);
        return -1;
    }
    atomic_store_explicit(&c->kv_tokens_total,
                          (uint64_t) n_pages * page_tokens,
                          memory_order_relaxed);
    atomic_store_explicit(&c->kv_tokens_free, msv_kv_free_tokens(&s->kv),
                          memory_order_relaxed);
    c->kv_page_tokens = page_tokens;

    for (i = 0; i < n; i++) {
        s->seqs[i].slot = i;
        s->seqs[i].toks = malloc((size_t) s->max_len * sizeof(int32_t));
        s->seqs[i].bias = malloc(MSV_MAX_BIAS * sizeof(struct msv_bias));
        if (s->seqs[i].toks == NULL || s->seqs[i].bias == NULL) {
            snprintf(s->err, sizeof(s->err),
                     "out of memory for %u sequences of %u tokens",
                     n, s->max_len);
            return -1;
        }
    }

    return 0;
}


void
msv_sched_free(struct msv_sched *s)
{
    uint32_t  i;

    if (s->seqs != NULL) {
        for (i = 0; i < s->n_slots; i++) {
            free(s->seqs[i].toks);
            free(s->seqs[i].bias);
        }
    }
    free(s->seqs);
    if (s->logits != NULL && s->ops->host_free != NULL) {
        s->ops->host_free(s->logits);
    } else {
        free(s->logits);
    }
    free(s->b_seq);
    free(s->b_new);
    free(s->b_pos0);
    free(s->b_pages);
    free(s->b_npages);
    free(s->r_order);
    free(s->a_order);
    free(s->p_list);
    free(s->b_order);
    free(s->b_tok);
    free(s->items);
    if (s->step_log != NULL) {
        if (fclose(s->step_log) != 0) {
            msv_warn("step log: write failed");
        }
    }
    free(s->step_log_buf);
    free(s->srows);
    free(s->sres);
    free(s->pend);
    msv_sample_pool_free(s->pool);
    msv_kv_free(&s->kv);
    memset(s, 0, sizeof(*s));
}


int
msv_sched_device_sampler(struct msv_sched *s, char *why, size_t len)
{
    if (s->ops->sample_init == NULL || s->ops->sample == NULL
        || s->ops->sample_copy == NULL || s->ops->sample_wait == NULL)
    {
        snprintf(why, len, "the %s backend has no device sampler",
                 s->ops->name);
        return 0;
    }
    s->srows = calloc(s->n_slots, sizeof(*s->srows));
    s->sres = calloc(s->n_slots, sizeof(*s->sres));
    s->pend = calloc(s->n_slots, sizeof(*s->pend));
    if (s->srows == NULL || s->sres == NULL || s->pend == NULL) {
        snprintf(why, len, "out of memory");
        return 0;
    }
    if (s->ops->sample_init(s->be, s->n_slots, s->n_slots,
                            s->c->max_logprobs, s->prod->data,
                            s->prod->cap, why, len) != 0)
    {
        return 0;
    }
    s->dev_sample = 1;
    return 1;
}


#define MSV_STEP_LOG_BUF  (1u << 20)

int
msv_sched_step_log(struct msv_sched *s, const char *path)
{
    s->step_log = fopen(path, "w");
    if (s->step_log == NULL) {
        snprintf(s->err, sizeof(s->err), "--step-log %s: cannot open it",
                 path);
        return -1;
    }
    /* a line is ~200 bytes: a flush every few thousand steps at most */
    s->step_log_buf = malloc(MSV_STEP_LOG_BUF);
    if (s->step_log_buf != NULL) {
        setvbuf(s->step_log, s->step_log_buf, _IOFBF, MSV_STEP_LOG_BUF);
    }
    return 0;
}


/*
 * A step's line: its index, start and end (CLOCK_MONOTONIC ns), the
 * sequences in the batch, decode rows, prefill tokens, tokens sampled,
 * sequences active after it, then the stages: forward, sampling with the
 * mask capture, rows into the ring (with any wait for space), the ring
 * bytes the step's rows take, the scheduler's own host time (the rest),
 * and last the flush of the step before's device rows (their copies'
 * wait, finish fields, commit): last so that readers of the first
 * thirteen fields read on.
 */
static void
msv_sched_log_step(struct msv_sched *s, uint64_t t0, uint64_t t1,
    uint32_t nb, uint32_t n_dec, uint32_t n_pf, uint32_t ns, uint64_t fwd,
    uint64_t smp, uint64_t ring)
{
    uint64_t  host = t1 - t0 - fwd - smp - ring - s->log_flush;

    fprintf(s->step_log, "step %llu t0_ns %llu t1_ns %llu seqs %u "
            "decode %u prefill %u sampled %u active %u fwd_ns %llu "
            "sample_ns %llu ring_ns %llu ring_bytes %llu host_ns %llu "
            "flush_ns %llu\n",
            (unsigned long long) s->step, (unsigned long long) t0,
            (unsigned long long) t1, nb, n_dec, n_pf, ns, s->n_active,
            (unsigned long long) fwd, (unsigned long long) smp,
            (unsigned long long) ring, (unsigned long long) s->log_bytes,
            (unsigned long long) host, (unsigned long long) s->log_flush);
    s->step_log_dirty = 1;
}


uint32_t
msv_sched_pending(struct msv_sched *s)
{
    return s->n_active
           + atomic_load_explicit(&s->c->waiting, memory_order_relaxed);
}


/* A row published, into the control page's counters by mask mode. */
static void
msv_sched_count_row(struct msv_sched *s, uint32_t mode, uint32_t bytes)
{
    atomic_fetch_add_explicit(&s->c->rows_by_mode[mode & 3], 1,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&s->c->row_bytes_by_mode[mode & 3], bytes,
                              memory_order_relaxed);
}


/*
 * Write one row into the open record, after the rows still pending (a
 * request's rows go out in order).  0, or -1 if the ring gave up.
 */
static int
msv_sched_row(struct msv_sched *s, uint32_t slot, uint64_t cookie,
    int32_t token, uint32_t pos, uint32_t mode, const struct msv_sample_out *o,
    uint32_t finish, uint32_t why)
{
    uint32_t         n_sup, n_lps, n_top, bytes;
    struct msv_row  *w;
    uint8_t         *p;

    if (msv_sched_flush(s) != 0) {
        return -1;
    }

    n_sup = 0;
    n_lps = 0;
    n_top = 0;

    if (o != NULL) {
        if (mode != MSV_MASK_OFF) {
            n_sup = o->n_support;
            n_lps = mode == MSV_MASK_SUPPORT ? n_sup : 1;
        }
        n_top = o->n_top;
    }

    bytes = msv_row_size(n_sup, n_lps, n_top);
    w = msv_ring_reserve(s->prod, bytes);
    if (w == NULL) {
        snprintf(s->err, sizeof(s->err),
                 "output ring: could not reserve %u bytes", bytes);
        return -1;
    }

    memset(w, 0, sizeof(*w));
    w->bytes = bytes;
    w->slot = slot;
    w->cookie = cookie;
    w->token = token;
    w->pos = pos;
    w->n_support = n_sup;
    w->n_lps = n_lps;
    w->n_top = n_top;
    w->logprob = o != NULL ? o->logprob : 0.0f;
    w->finish = (uint8_t) finish;
    w->abort_reason = (uint8_t) why;
    w->mode = (uint8_t) mode;

    p = (uint8_t *) (w + 1);
    if (n_sup) {
        memcpy(p, o->ids, 4 * (size_t) n_sup);
        p += 4 * (size_t) n_sup;
        if (mode == MSV_MASK_SUPPORT) {
            memcpy(p, o->lps, 4 * (size_t) n_sup);
        } else {
            memcpy(p, &o->logprob, 4);
        }
        p += 4 * (size_t) n_lps;
    }
    if (n_top) {
        memcpy(p, o->top, sizeof(struct msv_top) * n_top);
        p += sizeof(struct msv_top) * n_top;
    }
    /* zero the alignment tail: rows are compared byte for byte */
    memset(p, 0, (uint8_t *) w + bytes - p);

    msv_ring_commit(s->prod, bytes, 1);
    msv_sched_count_row(s, mode, bytes);
    s->log_bytes += bytes;
    return 0;
}


/* End a request's slot: its sequence, the slot's end fields and state.
 * 0, or 1 if the owner died and the slot was reaped (nobody to tell). */
static int
msv_sched_end(struct msv_sched *s, uint32_t slot, uint32_t from,
    int32_t token, uint32_t pos, uint32_t finish, uint32_t why)
{
    struct msv_slot  *sl = msv_slot_at(s->c, slot);

    msv_sched_forget(s, slot);

    sl->n_out = token >= 0 ? pos + 1 : pos;
    sl->finish = finish;
    sl->abort_reason = why;
    sl->t_end_ns = msv_now_ns();

    if (msv_slot_move(sl, from, finish == MSV_FINISH_ABORT
                                ? MSV_SLOT_ABORTED : MSV_SLOT_FINISHED) != 0)
    {
        return 1;
    }

    atomic_fetch_add_explicit(&s->c->requests_done, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->c->finished[finish & 3], 1,
                              memory_order_relaxed);
    if (finish == MSV_FINISH_ABORT) {
        atomic_fetch_add_explicit(&s->c->aborted[why & 7], 1,
                                  memory_order_relaxed);
    }
    return 0;
}


/* End a request: its rows still pending out, the slot state, then its
 * last row in the record. */
static int
msv_sched_finish(struct msv_sched *s, uint32_t slot, uint32_t from,
    uint64_t cookie, int32_t token, uint32_t pos, uint32_t mode,
    const struct msv_sample_out *o, uint32_t finish, uint32_t why)
{
    if (msv_sched_flush(s) != 0) {
        return -1;
    }
    if (msv_sched_end(s, slot, from, token, pos, finish, why) != 0) {
        return 0;
    }
    return msv_sched_row(s, slot, cookie, token, pos, mode, o, finish, why);
}


/* Defensive checks of a submitted slot (the reader validated already). */
static int
msv_sched_valid(struct msv_sched *s, struct msv_slot *sl)
{
    char                  err[MSV_PARAM_ERR_MAX];
    const char           *param;
    struct msv_limits     lim;

    /*
     * The rules the reader applied before it submitted (shm/msv_params.h),
     * again: the slot was written by another process.  Once admitted, the
     * request is not checked again but for the sampler's cheap test.
     */
    msv_limits_of(s->c, &lim);
    lim.vocab_size = s->vocab;
    lim.max_model_len = s->max_len;

    /* the id goes into log lines: never print one that breaks the rule */
    if (sl->request_id[0] != '\0'
        && !msv_request_id_valid(sl->request_id,
                                 strnlen(sl->request_id, MSV_REQ_ID_MAX + 1)))
    {
        msv_warn("a request whose id is not 1 to %d characters of "
                 "[A-Za-z0-9._:-]", MSV_REQ_ID_MAX);
        return 0;
    }

    param = msv_prompt_check(msv_slot_prompt(s->c, sl), sl->n_prompt, &lim,
                             err);
    if (param == NULL) {
        param = msv_params_check(&sl->params, msv_slot_bias(s->c, sl), &lim,
                                 err);
    }
    if (param != NULL) {
        msv_warn("request \"%s\": %s", sl->request_id, err);
        return 0;
    }

    return 1;
}


static int
msv_cmp_submit(const void *a, const void *b, void *ud)
{
    struct msv_ctrl  *c = ud;
    uint64_t          ta = msv_slot_at(c, *(const uint32_t *) a)->t_submit_ns;
    uint64_t          tb = msv_slot_at(c, *(const uint32_t *) b)->t_submit_ns;

    if (ta != tb) {
        return ta < tb ? -1 : 1;
    }
    return *(const uint32_t *) a < *(const uint32_t *) b ? -1 : 1;
}


/*
 * Pages for q's n_fill tokens: cached pages of its prefix first (at most
 * n_fill - 1 tokens of them, so the last token is computed and gives the
 * logits to sample from), then new ones.  Admission keeps one page in
 * reserve per running sequence, so what it admits does not force a
 * preemption at the very next decode step.  0, or -1 with nothing taken.
 */
static int
msv_sched_place(struct msv_sched *s, struct msv_seq *q)
{
    uint32_t  hit, need, reserve;

    hit = msv_kv_match(&s->kv, q->slot, q->toks, q->n_fill,
                       (q->n_fill - 1) / s->kv.page_tokens);
    need = msv_kv_pages_for(&s->kv, q->n_fill) - hit;
    reserve = s->n_active - s->n_wait;

    if ((uint64_t) need + reserve > msv_kv_available(&s->kv)
        && s->n_active > s->n_wait)
    {
        msv_kv_release(&s->kv, q->slot);
        return -1;
    }

    if (msv_kv_grow(&s->kv, q->slot, q->n_fill) != 0) {
        msv_kv_release(&s->kv, q->slot);
        return -1;
    }

    q->n_kv = hit * s->kv.page_tokens;
    q->phase = MSV_SEQ_PREFILL;

    atomic_fetch_add_explicit(&s->c->prefix_query_tokens, q->n_fill,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&s->c->prefix_hit_tokens, q->n_kv,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&s->c->prefill_tokens, q->n_fill - q->n_kv,
                              memory_order_relaxed);
    return 0;
}


/*
 * Whether q should wait a step instead of computing prompt pages that a
 * running prefill is computing right now: with caching on, q will find
 * them cached once that sequence has them.  This is what makes requests
 * with one prompt submitted together (a group of rollouts) prefill it
 * once.  Those that wait do not hold up the requests behind them.
 */
static int
msv_sched_defer(struct msv_sched *s, struct msv_seq *q)
{
    uint32_t         i, B, mine, same, theirs;
    struct msv_seq  *l;

    if (!s->kv.caching) {
        return 0;
    }

    B = s->kv.page_tokens;
    mine = (q->n_fill - 1) / B;

    for (i = 0; i < s->n_pf && mine > 0; i++) {
        l = &s->seqs[s->p_list[i]];
        if (l == q || l->phase != MSV_SEQ_PREFILL) {
            continue;
        }
        theirs = l->n_fill / B;
        if (theirs > mine) {
            theirs = mine;
        }
        if ((uint64_t) theirs * B <= l->n_kv) {
            continue;           /* nothing of use left to compute */
        }
        for (same = 0; same < theirs; same++) {
            if (memcmp(q->toks + (size_t) same * B,
                       l->toks + (size_t) same * B, B * sizeof(int32_t))
                != 0)
            {
                break;
            }
        }
        if ((uint64_t) same * B > l->n_kv) {
            return 1;
        }
    }

    return 0;
}


/*
 * Admitted sequences in the given phases into r_order, oldest admission
 * first; returns how many.  a_order holds them in that order as they come
 * (admission appends) and go (msv_sched_forget), so a step filters it
 * instead of sorting the sequences.
 */
static uint32_t
msv_sched_in_order(struct msv_sched *s, int phase_a, int phase_b)
{
    uint32_t  i, n;
    int       ph;

    n = 0;
    for (i = 0; i < s->n_active; i++) {
        ph = s->seqs[s->a_order[i]].phase;
        if (ph == phase_a || ph == phase_b) {
            s->r_order[n++] = s->a_order[i];
        }
    }
    return n;
}


/* Running sequences (those with pages), oldest admission first. */
static uint32_t
msv_sched_running(struct msv_sched *s)
{
    return msv_sched_in_order(s, MSV_SEQ_PREFILL, MSV_SEQ_DECODE);
}


/* Take q's pages back; it waits at the head of the queue with every token
 * it has, to recompute them when it comes back. */
static void
msv_sched_preempt(struct msv_sched *s, struct msv_seq *q)
{
    if (q->phase == MSV_SEQ_PREFILL) {
        /* counted at admission, never computed */
        atomic_fetch_sub_explicit(&s->c->prefill_tokens, q->n_fill - q->n_kv,
                                  memory_order_relaxed);
    }
    msv_kv_publish(&s->kv, q->slot, q->toks, q->n_kv);
    msv_kv_release(&s->kv, q->slot);
    q->phase = MSV_SEQ_WAIT;
    q->n_kv = 0;
    q->n_fill = q->n_prompt + q->n_out;
    s->n_wait++;
    atomic_fetch_add_explicit(&s->c->preemptions, 1, memory_order_relaxed);
    msv_debug("slot %u: preempted after %u outputs", q->slot, q->n_out);
}


/*
 * Before the batch is built: every decoding sequence gets the page its
 * next token goes into, oldest first.  When the pool is dry the most
 * recently admitted running sequence is preempted (possibly the one that
 * asked).  The oldest never is: admission made sure it fits alone.
 */
static void
msv_sched_grow(struct msv_sched *s)
{
    uint32_t         i, n;
    struct msv_seq  *q;

    n = msv_sched_running(s);

    for (i = 0; i < n; i++) {
        q = &s->seqs[s->r_order[i]];
        if (q->phase != MSV_SEQ_DECODE) {
            continue;
        }
        while (msv_kv_grow(&s->kv, q->slot, q->n_kv + 1) != 0) {
            while (n > i + 1
                   && s->seqs[s->r_order[n - 1]].phase != MSV_SEQ_PREFILL
                   && s->seqs[s->r_order[n - 1]].phase != MSV_SEQ_DECODE)
            {
                n--;
            }
            if (n == i + 1) {
                msv_sched_preempt(s, q);
                n--;
                break;
            }
            msv_sched_preempt(s, &s->seqs[s->r_order[--n]]);
        }
    }
}


/* Preempted sequences come back first, oldest admission first; while one
 * cannot, nothing new is admitted.  0, or 1 if one is still waiting. */
static int
msv_sched_readmit(struct msv_sched *s)
{
    uint32_t         i, n;
    struct msv_seq  *q;

    if (s->n_wait == 0) {
        return 0;
    }

    n = msv_sched_in_order(s, MSV_SEQ_WAIT, MSV_SEQ_WAIT);

    for (i = 0; i < n; i++) {
        q = &s->seqs[s->r_order[i]];
        if (msv_sched_place(s, q) != 0) {
            return 1;
        }
        s->n_wait--;
        msv_debug("slot %u: back after a preemption, %u tokens to fill, "
                  "%u cached", q->slot, q->n_fill, q->n_kv);
    }

    return 0;
}


/* Admit SUBMITTED slots in submission order while resources allow. */
static int
msv_sched_admit(struct msv_sched *s)
{
    int               blocked;
    uint32_t          i, n, waiting, need;
    uint64_t          w;
    struct msv_seq   *q;
    struct msv_slot  *sl;

    n = 0;
    for (i = 0; i < s->n_slots; i++) {
        sl = msv_slot_at(s->c, i);
        /*
         * A-submit: acquire, pairs with the release store of SUBMITTED in
         * msv_slot_submit: the slot's params and prompt written before it
         * are visible after this load.
         */
        w = atomic_load_explicit(&sl->state, memory_order_acquire);
        if (MSV_STATE_OF(w) == MSV_SLOT_SUBMITTED) {
            s->b_order[n++] = i;
        }
    }

    if (n > 1) {
        qsort_r(s->b_order, n, sizeof(uint32_t), msv_cmp_submit, s->c);
    }

    /* held (a pause): no newcomer, and with MSV_HOLD_ALL no preempted
     * sequence comes back either */
    blocked = s->draining || s->hold == MSV_HOLD_ALL ? 1
              : msv_sched_readmit(s) || s->hold != MSV_HOLD_NONE;

    /* the sequences a newcomer may wait for (msv_sched_defer) */
    s->n_pf = 0;
    for (i = 0; i < s->n_slots; i++) {
        if (s->seqs[i].phase == MSV_SEQ_PREFILL) {
            s->p_list[s->n_pf++] = i;
        }
    }

    waiting = n;
    for (i = 0; i < n; i++) {
        sl = msv_slot_at(s->c, s->b_order[i]);
        q = &s->seqs[s->b_order[i]];

        if (s->draining) {
            break;
        }

        if (!msv_sched_valid(s, sl)) {
            msv_warn("slot %u: invalid request, aborted", q->slot);
            if (msv_sched_finish(s, q->slot, MSV_SLOT_SUBMITTED, sl->cookie,
                                 -1, 0, MSV_MASK_OFF, NULL, MSV_FINISH_ABORT,
                                 MSV_ABORT_INVALID) != 0)
            {
                return -1;
            }
            waiting--;
            continue;
        }

        if (atomic_load_explicit(&sl->cancel, memory_order_relaxed)) {
            if (msv_sched_finish(s, q->slot, MSV_SLOT_SUBMITTED, sl->cookie,
                                 -1, 0, sl->params.mask_mode, NULL,
                                 MSV_FINISH_ABORT, MSV_ABORT_CANCELLED) != 0)
            {
                return -1;
            }
            waiting--;
            continue;
        }

        q->max_out = sl->params.max_tokens;
        if (q->max_out > s->max_len - sl->n_prompt) {
            q->max_out = s->max_len - sl->n_prompt;
        }
        need = sl->n_prompt + q->max_out;

        if (msv_kv_pages_for(&s->kv, need) > s->kv.n_pages) {
            /* even alone in the pool it could not reach max_tokens */
            msv_warn("slot %u: %u tokens exceed the KV cache of %llu, "
                     "aborted", q->slot, need,
                     (unsigned long long) s->kv.n_pages * s->kv.page_tokens);
            if (msv_sched_finish(s, q->slot, MSV_SLOT_SUBMITTED,
                                 sl->cookie, -1, 0, MSV_MASK_OFF, NULL,
                                 MSV_FINISH_ABORT, MSV_ABORT_NO_KV) != 0)
            {
                return -1;
            }
            waiting--;
            continue;
        }

        if (blocked) {
            if (s->hold != MSV_HOLD_NONE) {
                continue;   /* paused: every queued cancel is still seen */
            }
            break;      /* FIFO: later requests wait behind this one */
        }

        q->cookie = sl->cookie;
        q->p = sl->params;
        q->n_prompt = sl->n_prompt;
        q->n_out = 0;
        q->n_kv = 0;
        q->n_fill = q->n_prompt;
        memcpy(q->toks, msv_slot_prompt(s->c, sl),
               (size_t) q->n_prompt * sizeof(int32_t));

        if (msv_sched_defer(s, q)) {
            continue;   /* its prompt is being computed: next step */
        }

        if (msv_sched_place(s, q) != 0) {
            q->phase = MSV_SEQ_IDLE;
            break;      /* FIFO: later requests wait behind this one */
        }

        memcpy(q->bias, msv_slot_bias(s->c, sl),
               (size_t) q->p.n_bias * sizeof(struct msv_bias));
        q->seed = q->p.has_seed ? q->p.seed
                                : msv_splitmix64(&s->seed_state)
                                  & ((1ULL << 53) - 1);   /* exact in JSON */
        sl->seed_used = q->seed;
        sl->weight_seq = atomic_load_explicit(&s->c->weight_seq,
                                              memory_order_relaxed);
        sl->n_out = 0;
        sl->t_start_ns = msv_now_ns();

        if (msv_slot_move(sl, MSV_SLOT_SUBMITTED, MSV_SLOT_RUNNING) != 0) {
            msv_kv_release(&s->kv, q->slot);    /* reaped meanwhile */
            q->phase = MSV_SEQ_IDLE;
            waiting--;
            continue;
        }

        s->a_order[s->n_active++] = q->slot;
        s->p_list[s->n_pf++] = q->slot;
        atomic_fetch_add_explicit(&s->c->prompt_tokens, q->n_prompt,
                                  memory_order_relaxed);
        waiting--;
        msv_debug("slot %u: admitted \"%s\", %u prompt tokens (%u cached), "
                  "seed %llu", q->slot, sl->request_id, q->n_prompt, q->n_kv,
                  (unsigned long long) q->seed);
    }

    atomic_store_explicit(&s->c->waiting, waiting, memory_order_relaxed);
    return 0;
}


static int
msv_sched_is_stop(struct msv_sched *s, struct msv_seq *q, int32_t tok)
{
    uint32_t  i;

    if (!q->p.ignore_eos) {
        for (i = 0; i < s->n_eos; i++) {
            if (s->eos[i] == tok) {
                return 1;
            }
        }
    }
    for (i = 0; i < q->p.n_stop; i++) {
        if (q->p.stop_ids[i] == tok) {
            return 1;
        }
    }
    return 0;
}


/* The sampler's view of one sequence at its next output position. */
static void
msv_sched_prepare(struct msv_sched *s, struct msv_seq *q, float *logits,
    struct msv_sample_item *it)
{
    memset(&it->rq, 0, sizeof(it->rq));
    it->logits = logits;
    it->rq.p = &q->p;
    it->rq.bias = q->bias;
    it->rq.seed = q->seed;
    it->rq.t = q->n_out;
    it->rq.prompt = q->toks;
    it->rq.n_prompt = q->n_prompt;
    it->rq.out = q->toks + q->n_prompt;
    it->rq.eos = s->eos;
    it->rq.n_eos = s->n_eos;
}


/* Append a sampled token to q's history; the finish it brings. */
static uint32_t
msv_sched_append(struct msv_sched *s, struct msv_seq *q, int32_t token)
{
    q->toks[q->n_prompt + q->n_out++] = token;
    atomic_fetch_add_explicit(&s->c->tokens, 1, memory_order_relaxed);

    if (msv_sched_is_stop(s, q, token)) {
        return MSV_FINISH_STOP;
    }
    return q->n_out >= q->max_out ? MSV_FINISH_LENGTH : MSV_FINISH_NONE;
}


/* Take a sampled token: history, finish conditions, its row. */
static int
msv_sched_take(struct msv_sched *s, struct msv_seq *q,
    const struct msv_sample_item *it)
{
    uint32_t                      finish, pos;
    const struct msv_sample_out  *o = &it->out;

    if (it->rc != 0) {
        msv_err("slot %u: sampler failed (%s), aborted", q->slot, it->err);
        return msv_sched_finish(s, q->slot, MSV_SLOT_RUNNING, q->cookie, -1,
                                q->n_out, MSV_MASK_OFF, NULL,
                                MSV_FINISH_ABORT, MSV_ABORT_INTERNAL);
    }

    pos = q->n_out;
    finish = msv_sched_append(s, q, o->token);

    if (finish != MSV_FINISH_NONE) {
        return msv_sched_finish(s, q->slot, MSV_SLOT_RUNNING, q->cookie,
                                o->token, pos, q->p.mask_mode, o, finish,
                                MSV_ABORT_NONE);
    }

    msv_slot_at(s->c, q->slot)->n_out = q->n_out;
    q->phase = MSV_SEQ_DECODE;
    return msv_sched_row(s, q->slot, q->cookie, o->token, pos, q->p.mask_mode,
                         o, MSV_FINISH_NONE, MSV_ABORT_NONE);
}


/*
 * Take a token sampled on the device: history, finish conditions, and
 * the finish fields its row gets once its copy has landed (d).
 */
static void
msv_sched_take_row(struct msv_sched *s, struct msv_seq *q,
    const struct msv_sample_res *r, struct msv_sched_pend *d)
{
    uint32_t  finish, pos = q->n_out;

    d->finish = MSV_FINISH_NONE;
    d->why = MSV_ABORT_NONE;

    if (r->token < 0) {
        msv_err("slot %u: sampler failed (every logit is -inf or NaN), "
                "aborted", q->slot);
        (void) msv_sched_end(s, q->slot, MSV_SLOT_RUNNING, -1, pos,
                             MSV_FINISH_ABORT, MSV_ABORT_INTERNAL);
        d->finish = MSV_FINISH_ABORT;
        d->why = MSV_ABORT_INTERNAL;
        return;
    }

    finish = msv_sched_append(s, q, r->token);

    if (finish != MSV_FINISH_NONE) {
        (void) msv_sched_end(s, q->slot, MSV_SLOT_RUNNING, r->token, pos,
                             finish, MSV_ABORT_NONE);
        d->finish = (uint8_t) finish;
        return;
    }

    msv_slot_at(s->c, q->slot)->n_out = q->n_out;
    q->phase = MSV_SEQ_DECODE;
}


/*
 * Rows [pend_from, n_pend) once their copies have landed (sample_wait):
 * only then may their finish fields be written (a copy still running
 * would write over them) and the runs be committed and published.  An
 * abort row goes out with mode off, as the CPU sampler writes it.
 */
static int
msv_sched_land(struct msv_sched *s)
{
    uint32_t                k;
    struct msv_sched_pend  *d;

    if (s->ops->sample_wait(s->be, s->err, sizeof(s->err)) != 0) {
        msv_ring_drop(s->prod);
        s->pend_from = s->n_pend;
        return -1;
    }

    for (k = s->pend_from; k < s->n_pend; k++) {
        d = &s->pend[k];
        d->w->finish = d->finish;
        d->w->abort_reason = d->why;
        if (d->finish == MSV_FINISH_ABORT) {
            d->w->mode = MSV_MASK_OFF;
        }
    }

    if (msv_ring_settle(s->prod) != 0) {
        snprintf(s->err, sizeof(s->err), "output ring: rows %u..%u copied "
                 "from the device are malformed, dropped", s->pend_from,
                 s->n_pend - 1);
        s->pend_from = s->n_pend;
        return -1;
    }

    for (k = s->pend_from; k < s->n_pend; k++) {
        msv_sched_count_row(s, s->pend[k].w->mode, s->pend[k].w->bytes);
    }
    s->pend_from = s->n_pend;
    return 0;
}


/* Device rows given up on an error: once no copy writes into the ring
 * any more, the ring forgets their space. */
static void
msv_sched_drop(struct msv_sched *s)
{
    char  err[256];

    (void) s->ops->sample_wait(s->be, err, sizeof(err));
    msv_ring_drop(s->prod);
    s->pend_from = s->n_pend;
}


int
msv_sched_flush(struct msv_sched *s)
{
    int       rc;
    uint64_t  t;

    if (s->pend_from == s->n_pend) {
        return 0;
    }

    t = s->step_log != NULL ? msv_now_ns() : 0;
    rc = msv_sched_land(s);
    if (s->step_log != NULL) {
        s->log_flush += msv_now_ns() - t;
    }
    return rc;
}


/*
 * Sample the step's ns rows (s->srows) on the device.  The tokens go into
 * the histories at once (the next forward needs them); the packed rows go
 * into the ring in runs as large as one reservation takes, each copied by
 * DMA straight into its space while the scheduler goes on.  The runs stay
 * deferred in the ring until msv_sched_flush, after the next forward.
 * The rows of the step before were flushed after this step's forward, so
 * s->pend is free.
 */
static int
msv_sched_sample_device(struct msv_sched *s, uint32_t ns)
{
    int              rc;
    uint32_t         i, j, k, bytes;
    uint8_t         *p;
    void            *w;

    if (s->ops->sample(s->be, s->srows, ns, s->sres, s->err,
                       sizeof(s->err)) != 0)
    {
        return -1;
    }
    if (s->step_log != NULL) {
        s->log_t_sampled = msv_now_ns();
    }

    s->pend_from = 0;
    s->n_pend = 0;
    for (k = 0; k < ns; k++) {
        msv_sched_take_row(s, &s->seqs[s->b_order[k]], &s->sres[k],
                           &s->pend[k]);
        s->log_bytes += s->sres[k].bytes;
    }

    for (i = 0; i < ns; i = j) {
        bytes = s->sres[i].bytes;
        for (j = i + 1; j < ns && bytes + s->sres[j].bytes
                                  <= s->c->max_row_bytes; j++)
        {
            bytes += s->sres[j].bytes;
        }

        rc = msv_ring_defer(s->prod, bytes, j - i, &w);
        if (rc == 1) {
            /* readers wait for the runs held back: those go out first,
             * then this one waits for room as any row does */
            if (msv_sched_land(s) != 0) {
                return -1;
            }
            rc = msv_ring_defer(s->prod, bytes, j - i, &w);
        }
        if (rc != 0) {
            snprintf(s->err, sizeof(s->err),
                     "output ring: could not reserve %u bytes", bytes);
            msv_sched_drop(s);
            return -1;
        }

        if (s->ops->sample_copy(s->be, i, j - i, w, s->err,
                                sizeof(s->err)) != 0)
        {
            msv_sched_drop(s);
            return -1;
        }
        for (k = i, p = w; k < j; k++) {
            s->pend[k].w = (struct msv_row *) p;
            p += s->sres[k].bytes;
        }
        s->n_pend = j;
    }
    return 0;
}


/* After a step: newly full pages into the cache, counters to the page. */
static void
msv_sched_publish(struct msv_sched *s)
{
    uint32_t         i;
    struct msv_seq  *q;

    for (i = 0; i < s->n_slots; i++) {
        q = &s->seqs[i];
        if (q->phase == MSV_SEQ_PREFILL || q->phase == MSV_SEQ_DECODE) {
            msv_kv_publish(&s->kv, i, q->toks, q->n_kv);
        }
    }

    atomic_store_explicit(&s->c->running, s->n_active, memory_order_relaxed);
    atomic_store_explicit(&s->c->preempted, s->n_wait, memory_order_relaxed);
    atomic_store_explicit(&s->c->kv_tokens_free, msv_kv_free_tokens(&s->kv),
                          memory_order_relaxed);
    atomic_store_explicit(&s->c->kv_tokens_cached,
                          (uint64_t) s->kv.n_cached * s->kv.page_tokens,
                          memory_order_relaxed);
    atomic_store_explicit(&s->c->kv_evictions, s->kv.evictions,
                          memory_order_relaxed);
}


/* A step that ran the model, into the control page's histograms. */
static void
msv_sched_histograms(struct msv_sched *s, uint64_t ns, uint32_t nb)
{
    uint32_t   i;
    uint64_t   us = ns / 1000;

    static const uint64_t  le_us[MSV_STEP_BUCKETS - 1] = {
        1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000, 500000,
        1000000, 2000000
    };

    for (i = 0; i < MSV_STEP_BUCKETS - 1 && us > le_us[i]; i++) { }
    atomic_fetch_add_explicit(&s->c->step_hist[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->c->step_us_sum, us, memory_order_relaxed);

    for (i = 0; i < MSV_BATCH_BUCKETS - 1 && nb > (1u << i); i++) { }
    atomic_fetch_add_explicit(&s->c->batch_hist[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->c->batch_sum, nb, memory_order_relaxed);
}


int
msv_sched_step(struct msv_sched *s)
{
    int              did;
    uint64_t         t0, t_f0, t_f1, t_x, t_s1, t_r1;
    uint32_t         i, nb, ns, ntok, budget, take, n_dec, n_smp;

    t_f0 = t_f1 = t_x = t_s1 = t_r1 = 0;
    n_smp = 0;
    struct msv_seq  *q;
    struct msv_slot *sl;
    struct msv_batch b;

    did = 0;
    t0 = msv_now_ns();
    s->log_bytes = 0;
    s->log_flush = 0;
    s->step++;
    msv_ring_begin(s->prod, s->step);

    if (msv_sched_admit(s) != 0) {
        return -1;
    }

    /* cancels take effect at this step */
    for (i = 0; i < s->n_slots; i++) {
        q = &s->seqs[i];
        if (q->phase == MSV_SEQ_IDLE) {
            continue;
        }
        sl = msv_slot_at(s->c, i);
        if (sl->cookie != q->cookie
            || MSV_STATE_OF(atomic_load_explicit(&sl->state,
                                                 memory_order_relaxed))
               != MSV_SLOT_RUNNING)
        {
            msv_sched_forget(s, i);        /* reaped under us */
            continue;
        }
        if (atomic_load_explicit(&sl->cancel, memory_order_relaxed)) {
            did = 1;
            if (msv_sched_finish(s, i, MSV_SLOT_RUNNING, q->cookie, -1,
                                 q->n_out, q->p.mask_mode, NULL,
                                 MSV_FINISH_ABORT, MSV_ABORT_CANCELLED) != 0)
            {
                return -1;
            }
        }
    }

    if (s->hold == MSV_HOLD_ALL) {
        /* paused with requests kept in place: nothing runs */
        if (msv_sched_flush(s) != 0) {
            return -1;
        }
        msv_ring_end(s->prod);
        msv_sched_publish(s);
        return did;
    }

    msv_sched_grow(s);

    /* batch: every decoding sequence, then prefill chunks within budget */
    nb = 0;
    ntok = 0;
    budget = s->max_batched;

    for (i = 0; i < s->n_slots; i++) {
        q = &s->seqs[i];
        if (q->phase != MSV_SEQ_DECODE) {
            continue;
        }
        s->b_seq[nb] = i;
        s->b_new[nb] = 1;
        s->b_pos0[nb] = q->n_kv;
        s->b_pages[nb] = msv_kv_table(&s->kv, i);
        s->b_npages[nb] = msv_kv_seq_pages(&s->kv, i);
        s->b_tok[ntok++] = q->toks[q->n_kv];
        nb++;
        budget = budget > 0 ? budget - 1 : 0;
    }
    n_dec = nb;

    for (i = 0; i < s->n_slots && budget > 0; i++) {
        q = &s->seqs[i];
        if (q->phase != MSV_SEQ_PREFILL) {
            continue;
        }
        take = q->n_fill - q->n_kv;
        if (take > budget) {
            take = budget;
        }
        s->b_seq[nb] = i;
        s->b_new[nb] = take;
        s->b_pos0[nb] = q->n_kv;
        s->b_pages[nb] = msv_kv_table(&s->kv, i);
        s->b_npages[nb] = msv_kv_seq_pages(&s->kv, i);
        memcpy(s->b_tok + ntok, q->toks + q->n_kv, take * sizeof(int32_t));
        ntok += take;
        budget -= take;
        nb++;
    }

    if (nb > 0) {
        did = 1;
        b.n_seqs = nb;
        b.seq = s->b_seq;
        b.n_new = s->b_new;
        b.pos0 = s->b_pos0;
        b.tokens = s->b_tok;
        b.pages = s->b_pages;
        b.n_pages = s->b_npages;
        b.all_logits = 0;

        t_f0 = s->step_log != NULL ? msv_now_ns() : 0;
        if (s->ops->forward(s->be, &b, s->dev_sample ? NULL : s->logits,
                            s->err, sizeof(s->err)) != 0)
        {
            return -1;
        }
        t_f1 = s->step_log != NULL ? msv_now_ns() : 0;

        /* the last step's device rows were copied while the forward ran:
         * they go out now, before this step's are made */
        if (msv_sched_flush(s) != 0) {
            return -1;
        }
        t_x = s->step_log != NULL ? msv_now_ns() : 0;

        /* sample every sequence whose prompt is complete, in parallel
         * (b_order: their slots); then take the tokens and write the rows
         * in batch order */
        ns = 0;
        for (i = 0; i < nb; i++) {
            q = &s->seqs[s->b_seq[i]];
            q->n_kv += s->b_new[i];
            if (q->phase == MSV_SEQ_PREFILL && q->n_kv < q->n_fill) {
                continue;           /* chunk of a longer prompt */
            }
            s->b_order[ns] = s->b_seq[i];
            msv_sched_prepare(s, q, s->logits + (size_t) i * s->vocab,
                              &s->items[ns]);
            if (s->dev_sample) {
                s->srows[ns].row = i;
                s->srows[ns].slot = q->slot;
                s->srows[ns].cookie = q->cookie;
                s->srows[ns].rq = s->items[ns].rq;
            }
            ns++;
        }

        n_smp = ns;
        s->log_t_sampled = 0;
        if (s->dev_sample) {
            if (msv_sched_sample_device(s, ns) != 0) {
                return -1;
            }
            ns = 0;                 /* taken already */
        } else {
            msv_sample_pool_run(s->pool, s->items, ns);
            if (s->step_log != NULL) {
                s->log_t_sampled = msv_now_ns();
            }
        }

        for (i = 0; i < ns; i++) {
            if (msv_sched_take(s, &s->seqs[s->b_order[i]], &s->items[i])
                != 0)
            {
                return -1;
            }
        }

        if (s->step_log != NULL) {
            t_r1 = msv_now_ns();
            /* no rows to sample: no sampling, no copy */
            t_s1 = s->log_t_sampled != 0 ? s->log_t_sampled : t_x;
            if (n_smp == 0) {
                t_s1 = t_r1 = t_x;
            }
        }

        atomic_fetch_add_explicit(&s->c->steps, 1, memory_order_relaxed);
        msv_sched_histograms(s, msv_now_ns() - t0, nb);

    } else if (msv_sched_flush(s) != 0) {
        return -1;      /* no forward to run the copies beside */
    }

    msv_ring_end(s->prod);

    msv_sched_publish(s);

    if (s->step_log != NULL && nb > 0) {
        uint64_t  fwd = t_f1 - t_f0, smp = t_s1 - t_x, dev;

        /* a forward that returned once launched: the sampling call's
         * wait for it is the forward's, the sampler's own device time
         * the sampling's */
        if (s->dev_sample && n_smp > 0 && s->ops->sample_ms != NULL) {
            dev = (uint64_t) ((double) s->ops->sample_ms(s->be) * 1e6);
            if (dev < smp) {
                fwd += smp - dev;
                smp = dev;
            }
        }
        msv_sched_log_step(s, t0, msv_now_ns(), nb, n_dec, ntok - n_dec,
                           n_smp, fwd, smp, t_r1 - t_s1);
    }
    if (s->step_log_dirty && s->n_active == 0) {
        /* idle: what was buffered goes out, for a reader of the file */
        if (fflush(s->step_log) != 0) {
            msv_warn("step log: write failed");
        }
        s->step_log_dirty = 0;
    }

    return did;
}


void
msv_sched_forget(struct msv_sched *s, uint32_t slot)
{
    uint32_t         i;
    struct msv_seq  *q = &s->seqs[slot];

    if (q->phase == MSV_SEQ_IDLE) {
        return;
    }
    for (i = 0; i < s->n_active && s->a_order[i] != slot; i++) { }
    if (i < s->n_active) {
        memmove(&s->a_order[i], &s->a_order[i + 1],
                (s->n_active - i - 1) * sizeof(uint32_t));
    }
    if (q->phase == MSV_SEQ_WAIT) {
        s->n_wait--;
    } else {
        /* what it computed stays findable for the next prompt like it */
        msv_kv_publish(&s->kv, slot, q->toks, q->n_kv);
        msv_kv_release(&s->kv, slot);
    }
    q->phase = MSV_SEQ_IDLE;
    s->n_active--;
}


int
msv_sched_abort_all(struct msv_sched *s, uint32_t why)
{
    s->draining = 1;
    return msv_sched_abort_in_flight(s, why, NULL);
}


int
msv_sched_abort_in_flight(struct msv_sched *s, uint32_t why, uint32_t *count)
{
    int               rc;
    uint32_t          i, st, n;
    struct msv_seq   *q;
    struct msv_slot  *sl;

    /* the last step's rows before the aborts; if they are lost, the
     * aborts still go out */
    rc = msv_sched_flush(s);

    n = 0;
    s->step++;
    msv_ring_begin(s->prod, s->step);

    for (i = 0; i < s->n_slots; i++) {
        q = &s->seqs[i];
        sl = msv_slot_at(s->c, i);
        st = MSV_STATE_OF(atomic_load_explicit(&sl->state,
                                               memory_order_acquire));
        if (st == MSV_SLOT_RUNNING && q->phase != MSV_SEQ_IDLE) {
            if (msv_sched_finish(s, i, MSV_SLOT_RUNNING, q->cookie, -1,
                                 q->n_out, q->p.mask_mode, NULL,
                                 MSV_FINISH_ABORT, why) != 0)
            {
                return -1;
            }
            n++;
        } else if (st == MSV_SLOT_SUBMITTED) {
            if (msv_sched_finish(s, i, MSV_SLOT_SUBMITTED, sl->cookie, -1, 0,
                                 sl->params.mask_mode, NULL,
                                 MSV_FINISH_ABORT, why) != 0)
            {
                return -1;
            }
            n++;
        }
    }

    if (count != NULL) {
        *count = n;
    }

    msv_ring_end(s->prod);
    msv_sched_publish(s);
    atomic_store_explicit(&s->c->running, 0, memory_order_relaxed);
    atomic_store_explicit(&s->c->preempted, 0, memory_order_relaxed);
    atomic_store_explicit(&s->c->waiting, 0, memory_order_relaxed);
    return rc;
}


uint32_t
msv_sched_flush_cache(struct msv_sched *s)
{
    uint32_t  n = s->kv.n_cached;

    msv_kv_drop_cache(&s->kv);
    atomic_fetch_add_explicit(&s->c->cache_flushes, 1, memory_order_relaxed);
    msv_sched_publish(s);
    return n;
}


int
msv_sched_runnable(struct msv_sched *s)
{
    if (s->hold == MSV_HOLD_ALL) {
        return 0;
    }
    if (s->hold == MSV_HOLD_ADMIT) {
        return s->n_active > 0;
    }
    return msv_sched_pending(s) > 0;
}
