/*
 * ngx_http_maskserve_route.c: requests to and from the worker regions:
 * pick a region, submit a request into one of its slots, cancel it, find
 * a request in flight by id, and route each row of the ring to its
 * request.
 *
 * Rows are matched to requests through this process's slot table (slot
 * index -> context and choice, checked by cookie): a request with several
 * choices (sampling_params.n) holds a slot for each, and ends when the
 * last of them has.  Each row is formatted into its
 * request's buffers during the callback (the row is not valid after it),
 * so the ring always advances whatever the clients do.  Requests whose
 * output changed are flushed once the records at hand are consumed, which
 * coalesces the steps that arrived together into one stream event (a
 * stream that gathers much output in one pass is flushed at once).
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "msv_region.h"
#include "msv_ring.h"
#include "msv_slots.h"
#include "msv_link.h"
#include "msv_json.h"
#include "ngx_http_maskserve_module.h"
#include "ngx_http_maskserve_util.h"
#include "ngx_http_maskserve_attach.h"
#include "ngx_http_maskserve_route.h"
#include "ngx_http_maskserve_output.h"
#include "ngx_http_maskserve_stream.h"
#include "ngx_http_maskserve_redis.h"
#include "ngx_http_maskserve_stats.h"


static void ngx_http_maskserve_route_finish(ngx_http_maskserve_ctx_t *ctx);
static void ngx_http_maskserve_route_release(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch);
static ngx_int_t ngx_http_maskserve_route_match(struct msv_ctrl *c,
    uint32_t i, u_char *id, size_t len, uint64_t *cookie, uint32_t *state);
static void ngx_http_maskserve_route_version(ngx_http_maskserve_choice_t *ch,
    struct msv_ctrl *c, uint32_t slot);


/*
 * A row's request state lies in the request's pool, apart from every other
 * request's: a step of 64 requests' rows of 20 ids spent more time missing
 * the cache on it (the context, the choice, the buffers and where they are
 * written next) than writing the numbers.  Prefetches only: nothing is
 * written, and a pointer is followed only while its slot entry says the
 * request is there (a request that ends in between clears e->ctx).  Only
 * the lines a row touches are fetched (the first parts of the context and
 * of the choice, laid out for it, the words of a buffer that say where it
 * is written, and the bytes the row will write there, up to
 * NGX_HTTP_MASKSERVE_PREFETCH_OUT a section): prefetches beyond them
 * held up the reader more than they saved.
 */

#if defined(__GNUC__) || defined(__clang__)
#define NGX_HTTP_MASKSERVE_PREFETCH_LINE(p, w)  __builtin_prefetch(p, w)
#else
#define NGX_HTTP_MASKSERVE_PREFETCH_LINE(p, w)  ((void) (p))
#endif

#define NGX_HTTP_MASKSERVE_PREFETCH_OUT  512

/* the estimated text of n numbers of a row: ids, float32 (JSON; packed) */
#define NGX_HTTP_MASKSERVE_ID_TEXT(packed, n)                                 \
    ((packed) ? (size_t) (n) * 16 / 3 + 8 : (size_t) (n) * 8 + 2)
#define NGX_HTTP_MASKSERVE_F32_TEXT(packed, n)                                \
    ((packed) ? (size_t) (n) * 16 / 3 + 8 : (size_t) (n) * 12 + 2)


static ngx_inline void
ngx_http_maskserve_prefetch(const void *p, size_t bytes, int w)
{
    uintptr_t  a, end;

    end = (uintptr_t) p + bytes;

    for (a = (uintptr_t) p & ~(uintptr_t) 63; a < end; a += 64) {
        NGX_HTTP_MASKSERVE_PREFETCH_LINE((const void *) a, w);
    }
}


void
ngx_http_maskserve_route_hint(void *ud, const struct msv_row *w,
    unsigned ahead)
{
    ngx_http_maskserve_region_t  *rg = ud;

    size_t                        end, est[4];
    ngx_buf_t                    *b;
    ngx_uint_t                    i, n;
    ngx_http_maskserve_ctx_t     *ctx;
    ngx_http_maskserve_slot_t    *e;
    ngx_http_maskserve_sec_t     *sec[4];
    ngx_http_maskserve_choice_t  *ch;

    if (w->slot >= rg->n_slots) {
        return;
    }

    e = &rg->slots[w->slot];
    ctx = e->ctx;

    if (!e->used || e->cookie != w->cookie || ctx == NULL) {
        return;
    }

    if (ahead >= 4) {
        ngx_http_maskserve_prefetch(ctx,
                                    offsetof(ngx_http_maskserve_ctx_t, blocks),
                                    0);
        return;
    }

    if (ctx->done || e->choice >= ctx->n_choices) {
        return;
    }

    ch = &ctx->choices[e->choice];

    if (ahead == 3) {
        end = ctx->logprobs >= 0
              ? (ctx->packed ? offsetof(ngx_http_maskserve_choice_t, slot)
                             : offsetof(ngx_http_maskserve_choice_t, tlen))
              : ctx->packed ? offsetof(ngx_http_maskserve_choice_t, lpc)
                            : offsetof(ngx_http_maskserve_choice_t, mlen);

        ngx_http_maskserve_prefetch(ch, end, 0);
        return;
    }

    n = 0;
    sec[n] = &ch->ids;
    est[n++] = MSV_I32_MAX_CHARS + 1;

    if (w->token >= 0 && ctx->mode != MSV_MASK_OFF) {
        sec[n] = &ch->mask;
        est[n++] = NGX_HTTP_MASKSERVE_ID_TEXT(ctx->packed, w->n_support);
        sec[n] = &ch->mlps;
        est[n++] = NGX_HTTP_MASKSERVE_F32_TEXT(ctx->packed, w->n_lps);

        if (ctx->packed) {
            sec[n] = &ch->mlen;
            est[n++] = 8;
        }
    }

    for (i = 0; i < n; i++) {
        b = sec[i]->buf;

        if (b == NULL) {
            continue;
        }

        if (ahead == 2) {
            /* pos .. end: where the buffer is written and its room */
            ngx_http_maskserve_prefetch(b, offsetof(ngx_buf_t, file), 0);
            continue;
        }

        ngx_http_maskserve_prefetch(b->last,
            ngx_min(est[i], ngx_min((size_t) (b->end - b->last),
                                    NGX_HTTP_MASKSERVE_PREFETCH_OUT)), 1);
    }
}


/* One row of the ring: route it to its request by slot and cookie. */

int
ngx_http_maskserve_route_row(void *ud, uint64_t seq, const struct msv_row *w)
{
    ngx_http_maskserve_region_t  *rg = ud;

    ngx_http_maskserve_ctx_t     *ctx;
    ngx_http_maskserve_slot_t    *e;
    ngx_http_maskserve_choice_t  *ch;

    if (w->slot >= rg->n_slots) {
        return 0;
    }

    e = &rg->slots[w->slot];

    if (!e->used || e->cookie != w->cookie) {
        /* another process's request, or an earlier one of this slot */
        return 0;
    }

    ctx = e->ctx;

    if (ctx == NULL || ctx->done) {
        /* an orphan: the request is gone; free the slot at its end */
        if (w->finish != MSV_FINISH_NONE) {
            (void) msv_slot_release(rg->att.rg.ctrl, w->slot, w->cookie);
            e->used = 0;
            e->ctx = NULL;
            rg->inflight--;
        }

        return 0;
    }

    ch = &ctx->choices[e->choice];

    if (!ch->started) {
        ch->started = 1;

        if (!ch->seed_known) {
            ch->seed = msv_slot_at(rg->att.rg.ctrl, w->slot)->seed_used;
            ch->seed_known = 1;
        }

        if (ch->index == 0 && !ctx->seed_known) {
            ctx->seed = ch->seed;
            ctx->seed_known = 1;
        }
    }

    if (!ctx->started) {
        ctx->started = 1;

        ngx_http_maskserve_redis_req_update(&ctx->id, &rg->name, ctx->slot,
                                            ctx->cookie,
                                            NGX_HTTP_MASKSERVE_REQ_RUNNING,
                                            ctx->prompt_tokens, 0, NULL);
    }

    if (ngx_http_maskserve_output_row(ctx, ch, w) != NGX_OK) {
        /* the request failed (support cap, output limit, memory) */
        ctx->done = 1;

        if (w->finish != MSV_FINISH_NONE) {
            ngx_http_maskserve_route_release(ctx, ch);
        }

        /* the other choices' slots become orphans */
        ngx_http_maskserve_route_cancel(ctx);
        ngx_http_maskserve_route_dirty(ctx);
        return 0;
    }

    if (w->finish == MSV_FINISH_NONE) {
        if (!ctx->stream) {
            return 0;
        }

        if (ctx->pending >= NGX_HTTP_MASKSERVE_FLUSH_BYTES
            && ctx->busy == NULL)
        {
            /*
             * Much output in one pass (nginx fell behind the worker):
             * send it now rather than hold it to the end of the pass.
             * This may finalize the request; ctx is not touched after.
             */
            ngx_http_maskserve_stream_flush(ctx);
            return 0;
        }

        if (ctx->lcf->flush == NGX_HTTP_MASKSERVE_FLUSH_STEP) {
            ngx_http_maskserve_route_dirty(ctx);
        }

        return 0;
    }

    if (w->finish <= MSV_FINISH_ABORT) {
        ch->finish = w->finish;
        ch->abort_reason = w->abort_reason;

    } else {
        /* a finish this module does not know: an abort it can explain */
        ch->finish = MSV_FINISH_ABORT;
        ch->abort_reason = MSV_ABORT_INTERNAL;
    }

    ngx_http_maskserve_route_version(ch, rg->att.rg.ctrl, w->slot);

    /* the row is formatted: the slot may go back to the worker */
    ngx_http_maskserve_route_release(ctx, ch);
    ch->done = 1;
    ctx->live--;

    if (ch->finish == MSV_FINISH_ABORT) {

        if (ch->abort_reason != MSV_ABORT_CANCELLED
            && ch->abort_reason != MSV_ABORT_PAUSED)
        {
            /*
             * The worker stopped it for its own reasons (shutdown, no
             * KV, a fault): the request fails as a whole, and says why.
             * A pause (mode abort) ends it as a cancel does.
             */
            ctx->finish = MSV_FINISH_ABORT;
            ctx->abort_reason = ch->abort_reason;
            ctx->done = 1;
            ngx_http_maskserve_route_cancel(ctx);
            ngx_http_maskserve_route_dirty(ctx);
            return 0;
        }

        /* an abort acts on the whole request: stop the other choices */
        ngx_http_maskserve_route_abort(ctx);
    }

    if (ctx->live == 0) {
        ngx_http_maskserve_route_finish(ctx);
        ctx->done = 1;
    }

    ngx_http_maskserve_route_dirty(ctx);

    return 0;
}


/*
 * The request's finish reason, for the log variable and the Redis record:
 * "abort" when a choice was aborted, else "length" when a choice ran to
 * its length, else "stop".
 */

static void
ngx_http_maskserve_route_finish(ngx_http_maskserve_ctx_t *ctx)
{
    ngx_uint_t                    i;
    ngx_http_maskserve_choice_t  *ch;

    ctx->finish = MSV_FINISH_STOP;
    ctx->abort_reason = MSV_ABORT_NONE;

    for (i = 0; i < ctx->n_choices; i++) {
        ch = &ctx->choices[i];

        if (ch->finish == MSV_FINISH_ABORT) {
            ctx->finish = MSV_FINISH_ABORT;
            ctx->abort_reason = ch->abort_reason;
            return;
        }

        if (ch->finish == MSV_FINISH_LENGTH) {
            ctx->finish = MSV_FINISH_LENGTH;
        }
    }
}


/* A choice's last row is consumed: its slot goes back to the worker. */

static void
ngx_http_maskserve_route_release(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch)
{
    ngx_uint_t                    i;
    ngx_http_maskserve_region_t  *rg;
    ngx_http_maskserve_slot_t    *e;

    if (!ch->admitted) {
        return;
    }

    rg = ctx->region;
    e = &rg->slots[ch->slot];
    ch->admitted = 0;

    if (e->used && e->cookie == ch->cookie) {
        (void) msv_slot_release(rg->att.rg.ctrl, (uint32_t) ch->slot,
                                ch->cookie);
        e->used = 0;
        e->ctx = NULL;
        rg->inflight--;
    }

    for (i = 0; i < ctx->n_choices; i++) {
        if (ctx->choices[i].admitted) {
            return;
        }
    }

    ctx->admitted = 0;
}


void
ngx_http_maskserve_route_dirty(ngx_http_maskserve_ctx_t *ctx)
{
    if (ctx->dirty || ctx->r == NULL) {
        return;
    }

    ctx->dirty = 1;
    ngx_queue_insert_tail(&ctx->region->dirty, &ctx->queue);
}


void
ngx_http_maskserve_route_flush(ngx_http_maskserve_region_t *rg)
{
    ngx_queue_t               *q;
    ngx_http_maskserve_ctx_t  *ctx;

    /* what the pass formatted is counted before any of it is sent */
    ngx_http_maskserve_stats_publish();

    while (!ngx_queue_empty(&rg->dirty)) {
        q = ngx_queue_head(&rg->dirty);
        ngx_queue_remove(q);

        ctx = ngx_queue_data(q, ngx_http_maskserve_ctx_t, queue);
        ctx->dirty = 0;

        /* may finalize the request: ctx is not touched afterwards */
        ngx_http_maskserve_stream_flush(ctx);
    }
}



/*
 * The version of the weights the request ran on: the slot carries the
 * worker's weight_seq at admission; the control page holds the current
 * version and the one before (a request spans at most one update unless
 * it is kept through several).
 */
static void
ngx_http_maskserve_route_version(ngx_http_maskserve_choice_t *ch,
    struct msv_ctrl *c, uint32_t slot)
{
    uint32_t          cur, seq;
    const char       *v;
    struct msv_slot  *s;

    /* W-seq: acquire, pairs with the worker's release bump (control.c) */
    cur = atomic_load_explicit(&c->weight_seq, memory_order_acquire);
    s = msv_slot_at(c, slot);
    seq = s->weight_seq;

    v = seq == cur ? c->weight_version
        : seq + 1 == cur ? c->prev_weight_version : "";

    ngx_cpystrn(ch->weight_version, (u_char *) v, MSV_VERSION_MAX + 1);

    /* kept through an update: its tokens from weight_pos on are the next
     * version's (the current one, when it was the last update) */
    if (s->weight_pos != UINT32_MAX && seq + 1 == cur) {
        ngx_cpystrn(ch->weight_next, (u_char *) c->weight_version,
                    MSV_VERSION_MAX + 1);
        ch->weight_pos = s->weight_pos;
        ch->weight_end = s->n_out;
        ch->weight_spans = 1;
    }
}


ngx_http_maskserve_region_t *
ngx_http_maskserve_route_pick(ngx_http_maskserve_main_conf_t *mcf,
    ngx_http_maskserve_loc_conf_t *lcf, ngx_http_maskserve_err_t *err)
{
    return ngx_http_maskserve_route_pick_n(mcf, lcf, 1, err);
}


ngx_http_maskserve_region_t *
ngx_http_maskserve_route_pick_n(ngx_http_maskserve_main_conf_t *mcf,
    ngx_http_maskserve_loc_conf_t *lcf, ngx_uint_t want,
    ngx_http_maskserve_err_t *err)
{
    ngx_uint_t                    i, n, used, best_used, attached, paused,
                                  draining;
    ngx_http_maskserve_region_t  *rg, *best;

    n = ngx_http_maskserve_loc_nregions(mcf, lcf);

    best = NULL;
    best_used = 0;
    attached = 0;
    paused = 0;
    draining = 0;

    for (i = 0; i < n; i++) {
        rg = ngx_http_maskserve_loc_region(mcf, lcf, i);

        if (!rg->attached) {
            continue;
        }

        attached++;

        if (atomic_load_explicit(&rg->att.rg.ctrl->state,
                                 memory_order_relaxed)
            >= MSV_WORKER_DRAINING)
        {
            draining++;
            continue;
        }

        if (ngx_http_maskserve_attach_ready(rg) != NGX_OK) {
            continue;
        }

        /*
         * P-state: acquire, pairs with the worker's release store of
         * paused (worker/control.c): paused or pausing, it takes nothing
         * new (docs/API.md, pause).
         */
        if (atomic_load_explicit(&rg->att.rg.ctrl->paused,
                                 memory_order_acquire)
            != MSV_RUNNING)
        {
            paused++;
            continue;
        }

        used = ngx_http_maskserve_attach_in_use(rg);

        /* every choice of the request needs a slot of this region */
        if (used + want > rg->n_slots) {
            continue;
        }

        /* compare used / n_slots without dividing */
        if (best == NULL || used * best->n_slots < best_used * rg->n_slots) {
            best = rg;
            best_used = used;
        }
    }

    if (best) {
        return best;
    }

    if (paused > 0) {
        ngx_http_maskserve_error(err, NGX_HTTP_SERVICE_UNAVAILABLE,
                                 NGX_HTTP_MASKSERVE_OVERLOAD, NULL,
                                 "generation is paused (POST "
                                 "/inference/v1/resume); retry later");

    } else if (draining > 0 && draining == attached) {
        ngx_http_maskserve_error(err, NGX_HTTP_SERVICE_UNAVAILABLE,
                                 NGX_HTTP_MASKSERVE_OVERLOAD, NULL,
                                 "the maskserve worker is draining (shutting "
                                 "down) and takes no new request; retry "
                                 "later or on another host");

    } else if (attached == 0) {
        ngx_http_maskserve_error(err, NGX_HTTP_SERVICE_UNAVAILABLE,
                                 NGX_HTTP_MASKSERVE_OVERLOAD, NULL,
                                 "no maskserve worker is attached; "
                                 "retry later");

    } else {
        ngx_http_maskserve_error(err, NGX_HTTP_SERVICE_UNAVAILABLE,
                                 NGX_HTTP_MASKSERVE_OVERLOAD, NULL,
                                 "no free request slot in any ready "
                                 "maskserve worker; retry later");
    }

    return NULL;
}



ngx_int_t
ngx_http_maskserve_route_submit(ngx_http_maskserve_region_t *rg,
    ngx_http_maskserve_ctx_t *ctx, ngx_http_maskserve_gen_t *g)
{
    int                           i;
    uint64_t                      cookie;
    ngx_uint_t                    k, n, taken;
    struct msv_ctrl              *c;
    struct msv_params             params;
    ngx_http_maskserve_ctx_t     *other;
    ngx_http_maskserve_slot_t    *e;
    ngx_http_maskserve_choice_t  *ch;

    c = rg->att.rg.ctrl;
    n = ctx->n_choices;

    /* a slot for every choice, or none: the group runs whole */

    for (k = 0; k < n; k++) {
        i = msv_slot_claim(c, rg->att.reader, (int32_t) ngx_pid);

        if (i >= 0 && (ngx_uint_t) i >= rg->n_slots) {
            ngx_log_error(NGX_LOG_ALERT, rg->log, 0,
                          "maskserve: claimed slot %d of %ui in \"%V\"",
                          i, rg->n_slots, &rg->name);
            msv_slot_unclaim(c, (uint32_t) i);
            i = -1;
        }

        if (i < 0) {
            while (k--) {
                msv_slot_unclaim(c, (uint32_t) ctx->choices[k].slot);
            }

            return NGX_DECLINED;
        }

        ctx->choices[k].slot = (ngx_uint_t) i;
    }

    taken = 0;

    for (k = 0; k < n; k++) {
        ch = &ctx->choices[k];
        e = &rg->slots[ch->slot];

        if (e->used) {
            /*
             * The worker took the slot back while we still listed it (it
             * evicted this reader): the request that had it cannot go on.
             */
            other = e->ctx;
            rg->inflight--;
            taken = 1;

            if (other) {
                /* not that slot: it is ours now */
                other->choices[e->choice].admitted = 0;
            }

            if (other && !other->done) {
                other->done = 1;
                ngx_http_maskserve_error(&other->err, NGX_HTTP_BAD_GATEWAY,
                                         NGX_HTTP_MASKSERVE_SERVER, NULL,
                                         "the maskserve worker took back "
                                         "the slot of this request");
                ngx_http_maskserve_route_cancel(other);
                ngx_http_maskserve_route_dirty(other);
            }
        }

        /*
         * Choice i runs with seed s + i (mod 2^64), so that it gives what
         * a request of its own with that seed gives; without a seed the
         * worker draws one per slot.
         */
        params = g->params;

        if (params.has_seed) {
            params.seed += k;
        }

        cookie = msv_slot_submit(c, (uint32_t) ch->slot, (char *) ctx->id.data,
                                 &params, g->prompt, (uint32_t) g->n_prompt,
                                 g->bias);

        e->used = 1;
        e->ctx = ctx;
        e->choice = k;
        e->cookie = cookie;
        rg->inflight++;

        ch->cookie = cookie;
        ch->admitted = 1;

        if (params.has_seed) {
            ch->seed = params.seed;
            ch->seed_known = 1;
        }
    }

    ctx->region = rg;
    ctx->slot = ctx->choices[0].slot;
    ctx->cookie = ctx->choices[0].cookie;
    ctx->admitted = 1;

    msv_kick(rg->att.kick_fd);

    if (taken) {
        ngx_http_maskserve_route_flush(rg);
    }

    return NGX_OK;
}


void
ngx_http_maskserve_route_cancel(ngx_http_maskserve_ctx_t *ctx)
{
    ngx_uint_t                    k, kick;
    ngx_http_maskserve_region_t  *rg;
    ngx_http_maskserve_slot_t    *e;
    ngx_http_maskserve_choice_t  *ch;

    if (!ctx->admitted) {
        return;
    }

    rg = ctx->region;
    ctx->admitted = 0;
    ctx->cancelled = 1;

    if (!rg->attached) {
        return;
    }

    kick = 0;

    for (k = 0; k < ctx->n_choices; k++) {
        ch = &ctx->choices[k];

        if (!ch->admitted || ch->slot >= rg->n_slots) {
            continue;
        }

        ch->admitted = 0;
        e = &rg->slots[ch->slot];

        if (e->used && e->cookie == ch->cookie) {
            e->ctx = NULL;
            msv_slot_cancel(rg->att.rg.ctrl, (uint32_t) ch->slot, ch->cookie);
            kick = 1;
        }
    }

    if (kick) {
        msv_kick(rg->att.kick_fd);
    }
}


void
ngx_http_maskserve_route_abort(ngx_http_maskserve_ctx_t *ctx)
{
    ngx_uint_t                    k, kick;
    ngx_http_maskserve_region_t  *rg;
    ngx_http_maskserve_choice_t  *ch;

    if (!ctx->admitted || ctx->aborting) {
        return;
    }

    rg = ctx->region;
    ctx->aborting = 1;

    if (!rg->attached) {
        return;
    }

    kick = 0;

    for (k = 0; k < ctx->n_choices; k++) {
        ch = &ctx->choices[k];

        if (ch->admitted && ch->slot < rg->n_slots) {
            msv_slot_cancel(rg->att.rg.ctrl, (uint32_t) ch->slot, ch->cookie);
            kick = 1;
        }
    }

    if (kick) {
        msv_kick(rg->att.kick_fd);
    }
}


ngx_int_t
ngx_http_maskserve_route_find(ngx_http_maskserve_main_conf_t *mcf, u_char *id,
    size_t len, ngx_http_maskserve_region_t **rgp, ngx_uint_t *slot,
    uint64_t *cookie, uint32_t *state)
{
    uint32_t                      st, i;
    uint64_t                      ck;
    ngx_uint_t                    k;
    struct msv_ctrl              *c;
    ngx_http_maskserve_region_t  *rg;

    if (len == 0 || len > MSV_REQ_ID_MAX) {
        return NGX_DECLINED;
    }

    for (k = 0; k < mcf->regions.nelts; k++) {
        rg = ngx_http_maskserve_region(mcf, k);

        if (!rg->attached) {
            continue;
        }

        c = rg->att.rg.ctrl;

        for (i = 0; i < c->n_slots; i++) {
            if (ngx_http_maskserve_route_match(c, i, id, len, &ck, &st)
                != NGX_OK)
            {
                continue;
            }

            *rgp = rg;
            *slot = i;
            *cookie = ck;
            *state = st;

            return NGX_OK;
        }
    }

    return NGX_DECLINED;
}



ngx_uint_t
ngx_http_maskserve_route_cancel_id(ngx_http_maskserve_region_t *rg,
    u_char *id, size_t len)
{
    uint32_t          i, st;
    uint64_t          ck;
    ngx_uint_t        n;
    struct msv_ctrl  *c;

    c = rg->att.rg.ctrl;
    n = 0;

    /* every choice of the request: one slot each, all in one region */
    for (i = 0; i < c->n_slots; i++) {
        if (ngx_http_maskserve_route_match(c, i, id, len, &ck, &st)
            == NGX_OK)
        {
            msv_slot_cancel(c, i, ck);
            n++;
        }
    }

    if (n) {
        msv_kick(rg->att.kick_fd);
    }

    return n;
}


ngx_uint_t
ngx_http_maskserve_route_count_id(ngx_http_maskserve_region_t *rg,
    u_char *id, size_t len, ngx_uint_t *out, ngx_uint_t *running)
{
    uint32_t          i, st;
    uint64_t          ck;
    ngx_uint_t        n;
    struct msv_ctrl  *c;

    c = rg->att.rg.ctrl;
    n = 0;
    *out = 0;
    *running = 0;

    for (i = 0; i < c->n_slots; i++) {
        if (ngx_http_maskserve_route_match(c, i, id, len, &ck, &st)
            == NGX_OK)
        {
            *out += msv_slot_at(c, i)->n_out;
            *running += (st == MSV_SLOT_RUNNING);
            n++;
        }
    }

    return n;
}


/*
 * Is slot i in flight (claimed, submitted or running) for request id?
 * NGX_OK with its cookie and state, read consistently, or NGX_DECLINED.
 */

static ngx_int_t
ngx_http_maskserve_route_match(struct msv_ctrl *c, uint32_t i, u_char *id,
    size_t len, uint64_t *cookie, uint32_t *state)
{
    uint32_t          st;
    uint64_t          ck;
    struct msv_slot  *s;

    st = msv_slot_state(c, i);

    if (st != MSV_SLOT_CLAIMED && st != MSV_SLOT_SUBMITTED
        && st != MSV_SLOT_RUNNING)
    {
        return NGX_DECLINED;
    }

    s = msv_slot_at(c, i);
    ck = s->cookie;

    if (ngx_strncmp(s->request_id, id, len) != 0
        || s->request_id[len] != '\0')
    {
        return NGX_DECLINED;
    }

    /* the slot may have changed hands while we compared */
    if (s->cookie != ck || msv_slot_state(c, i) != st) {
        return NGX_DECLINED;
    }

    *cookie = ck;
    *state = st;

    return NGX_OK;
}
