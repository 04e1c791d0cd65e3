/*
 * ngx_http_maskserve_link.c: attachments to the worker regions, per nginx
 * worker process.
 *
 * In init_process every configured region is attached (msv_attach); a
 * region that cannot be attached is retried from a timer every 500 ms,
 * which is also how a restarted worker (new generation) is picked up
 * without reloading nginx.  Two fds of an attachment join nginx's event
 * loop:
 *
 *   wake_fd  our eventfd, written by the worker when it publishes rows
 *            while we are armed: drain it, consume every record, arm,
 *            and consume again if records arrived meanwhile (epoll is
 *            edge-triggered: nothing may be left behind);
 *   conn_fd  the unix socket to the worker: EOF or an error means the
 *            worker is gone: every request of the region ends with an
 *            explicit error, the region is detached and re-attached.
 *
 * Rows are matched to requests through this process's slot table (slot
 * index -> context, checked by cookie).  Each row is formatted into its
 * request's buffers during the callback (the row is not valid after it),
 * so the ring always advances whatever the clients do.  Requests whose
 * output changed are flushed once the records at hand are consumed, which
 * coalesces the steps that arrived together into one stream event (a
 * stream that gathers much output in one pass is flushed at once).
 *
 * A 200 ms cancelable timer writes our heartbeat into the region, checks
 * the worker's generation and polls the ring as a safety net; once a
 * second it refreshes the worker registry in Redis.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "msv_region.h"
#include "msv_ring.h"
#include "msv_slots.h"
#include "msv_link.h"
#include "ngx_http_maskserve_module.h"
#include "ngx_http_maskserve_link.h"
#include "ngx_http_maskserve_output.h"
#include "ngx_http_maskserve_stream.h"
#include "ngx_http_maskserve_redis.h"


static ngx_int_t ngx_http_maskserve_link_attach(
    ngx_http_maskserve_region_t *rg);
static void ngx_http_maskserve_link_hello_handler(ngx_event_t *ev);
static void ngx_http_maskserve_link_attach_failed(
    ngx_http_maskserve_region_t *rg, const char *err);
static ngx_int_t ngx_http_maskserve_link_attached(
    ngx_http_maskserve_region_t *rg);
static ngx_connection_t *ngx_http_maskserve_link_watch(
    ngx_http_maskserve_region_t *rg, int fd, ngx_event_handler_pt handler);
static void ngx_http_maskserve_link_unwatch(ngx_connection_t *c);
static void ngx_http_maskserve_link_detach(ngx_http_maskserve_region_t *rg);
static void ngx_http_maskserve_link_lost(ngx_http_maskserve_region_t *rg,
    const char *why);
static void ngx_http_maskserve_link_poll(ngx_http_maskserve_region_t *rg);
static int ngx_http_maskserve_link_row(void *ud, uint64_t seq,
    const struct msv_row *w);
static void ngx_http_maskserve_link_flush(ngx_http_maskserve_region_t *rg);
static void ngx_http_maskserve_link_wake_handler(ngx_event_t *ev);
static void ngx_http_maskserve_link_conn_handler(ngx_event_t *ev);
static void ngx_http_maskserve_link_retry_handler(ngx_event_t *ev);
static void ngx_http_maskserve_link_tick_handler(ngx_event_t *ev);
static void ngx_http_maskserve_link_registry(
    ngx_http_maskserve_main_conf_t *mcf);


ngx_int_t
ngx_http_maskserve_link_init_process(ngx_cycle_t *cycle,
    ngx_http_maskserve_main_conf_t *mcf)
{
    ngx_uint_t                    i;
    ngx_http_maskserve_region_t  *rg;

    rg = mcf->regions.elts;

    for (i = 0; i < mcf->regions.nelts; i++) {
        rg[i].log = cycle->log;
        ngx_queue_init(&rg[i].dirty);

        rg[i].retry.handler = ngx_http_maskserve_link_retry_handler;
        rg[i].retry.data = &rg[i];
        rg[i].retry.log = cycle->log;
        rg[i].retry.cancelable = 1;

        rg[i].att.conn_fd = -1;
        rg[i].att.wake_fd = -1;
        rg[i].att.kick_fd = -1;

        if (ngx_http_maskserve_link_attach(&rg[i]) != NGX_OK) {
            ngx_add_timer(&rg[i].retry, NGX_HTTP_MASKSERVE_RETRY);
        }
    }

    mcf->tick.handler = ngx_http_maskserve_link_tick_handler;
    mcf->tick.data = mcf;
    mcf->tick.log = cycle->log;
    mcf->tick.cancelable = 1;
    mcf->running = 1;

    ngx_http_maskserve_link_registry(mcf);
    ngx_add_timer(&mcf->tick, NGX_HTTP_MASKSERVE_TICK);

    return NGX_OK;
}


void
ngx_http_maskserve_link_exit_process(ngx_cycle_t *cycle,
    ngx_http_maskserve_main_conf_t *mcf)
{
    ngx_uint_t                    i;
    ngx_http_maskserve_region_t  *rg;

    mcf->running = 0;

    if (mcf->tick.timer_set) {
        ngx_del_timer(&mcf->tick);
    }

    rg = mcf->regions.elts;

    for (i = 0; i < mcf->regions.nelts; i++) {
        if (rg[i].retry.timer_set) {
            ngx_del_timer(&rg[i].retry);
        }

        if (rg[i].attached) {
            ngx_http_maskserve_link_detach(&rg[i]);

        } else if (rg[i].attaching) {
            rg[i].attaching = 0;
            ngx_http_maskserve_link_unwatch(rg[i].conn);
            rg[i].conn = NULL;
            msv_detach(&rg[i].att);
        }

        if (rg[i].slots) {
            ngx_free(rg[i].slots);
            rg[i].slots = NULL;
        }
    }
}


/*
 * Attaching does not block: the hello goes out here, and the welcome is
 * taken by the hello handler when the worker's answer makes the socket
 * readable (or the retry timer gives up after NGX_HTTP_MASKSERVE_WELCOME
 * ms).  A worker busy with a long step then delays only its own attach.
 */

static ngx_int_t
ngx_http_maskserve_link_attach(ngx_http_maskserve_region_t *rg)
{
    char  err[256];

    if (msv_attach_start(&rg->att, (char *) rg->name.data, err, sizeof(err))
        != 0)
    {
        ngx_http_maskserve_link_attach_failed(rg, err);
        return NGX_ERROR;
    }

    rg->conn = ngx_http_maskserve_link_watch(rg, rg->att.conn_fd,
                                      ngx_http_maskserve_link_hello_handler);
    if (rg->conn == NULL) {
        msv_detach(&rg->att);
        ngx_http_maskserve_link_attach_failed(rg,
                                              "cannot watch the worker socket");
        return NGX_ERROR;
    }

    rg->attaching = 1;
    ngx_cpystrn(rg->err, (u_char *) "waiting for the worker's welcome",
                sizeof(rg->err));

    if (rg->retry.timer_set) {
        ngx_del_timer(&rg->retry);
    }
    ngx_add_timer(&rg->retry, NGX_HTTP_MASKSERVE_WELCOME);

    return NGX_OK;
}


static void
ngx_http_maskserve_link_attach_failed(ngx_http_maskserve_region_t *rg,
    const char *err)
{
    rg->fails++;

    /* say it once per cause, not every 500 ms */
    if (rg->fails == 1 || ngx_strncmp(rg->err, err, sizeof(rg->err)) != 0) {
        ngx_log_error(NGX_LOG_WARN, rg->log, 0,
                      "maskserve: worker region \"%V\" not attached: %s",
                      &rg->name, err);
    }

    ngx_cpystrn(rg->err, (u_char *) err, sizeof(rg->err));
}


/* The worker socket while attaching: the welcome, or a refusal. */

static void
ngx_http_maskserve_link_hello_handler(ngx_event_t *ev)
{
    char                          err[256];
    ngx_int_t                     rc;
    ngx_connection_t             *c;
    ngx_http_maskserve_region_t  *rg;

    c = ev->data;
    rg = c->data;

    if (!rg->attaching) {
        return;
    }

    rc = msv_attach_finish(&rg->att, err, sizeof(err));
    if (rc == 1) {
        return;                 /* not the welcome yet */
    }

    rg->attaching = 0;

    if (rg->retry.timer_set) {
        ngx_del_timer(&rg->retry);
    }

    if (rc != 0) {
        /* msv_attach_finish detached (and closed the socket) already */
        ngx_http_maskserve_link_unwatch(rg->conn);
        rg->conn = NULL;
        ngx_http_maskserve_link_attach_failed(rg, err);
        ngx_add_timer(&rg->retry, NGX_HTTP_MASKSERVE_RETRY);
        return;
    }

    if (ngx_http_maskserve_link_attached(rg) != NGX_OK) {
        ngx_add_timer(&rg->retry, NGX_HTTP_MASKSERVE_RETRY);
    }
}


/* The welcome came: watch the wakeups, serve rows. */

static ngx_int_t
ngx_http_maskserve_link_attached(ngx_http_maskserve_region_t *rg)
{
    struct msv_ctrl                 *c;
    ngx_http_maskserve_slot_t       *slots;
    ngx_http_maskserve_main_conf_t  *mcf;

    rg->conn->read->handler = ngx_http_maskserve_link_conn_handler;

    c = rg->att.rg.ctrl;

    if (rg->slots == NULL || rg->n_slots != c->n_slots) {
        slots = ngx_alloc(c->n_slots * sizeof(ngx_http_maskserve_slot_t),
                          rg->log);
        if (slots == NULL) {
            ngx_http_maskserve_link_unwatch(rg->conn);
            rg->conn = NULL;
            msv_detach(&rg->att);
            ngx_cpystrn(rg->err, (u_char *) "out of memory", sizeof(rg->err));
            return NGX_ERROR;
        }

        if (rg->slots) {
            ngx_free(rg->slots);
        }

        rg->slots = slots;
        rg->n_slots = c->n_slots;
    }

    ngx_memzero(rg->slots, rg->n_slots * sizeof(ngx_http_maskserve_slot_t));
    rg->inflight = 0;

    rg->wake = ngx_http_maskserve_link_watch(rg, rg->att.wake_fd,
                                      ngx_http_maskserve_link_wake_handler);
    if (rg->wake == NULL) {
        ngx_http_maskserve_link_unwatch(rg->conn);
        rg->conn = NULL;
        msv_detach(&rg->att);
        ngx_cpystrn(rg->err, (u_char *) "cannot watch the wakeup fd",
                    sizeof(rg->err));
        return NGX_ERROR;
    }

    rg->attached = 1;
    rg->fails = 0;
    rg->generation = rg->att.generation;
    rg->err[0] = '\0';

    ngx_log_error(NGX_LOG_NOTICE, rg->log, 0,
                  "maskserve: attached to worker region \"%V\" "
                  "(pid %D, generation %016uxL, %uD slots, vocab %uD, "
                  "reader %uD)", &rg->name, c->worker_pid, rg->generation,
                  c->n_slots, c->vocab_size, rg->att.reader);

    /* rows may be waiting already */
    ngx_http_maskserve_link_poll(rg);

    /* the registry hears of it now, not at the next tick */
    mcf = ngx_http_maskserve_process_conf();
    if (mcf != NULL) {
        ngx_http_maskserve_link_registry(mcf);
    }

    return NGX_OK;
}


static ngx_connection_t *
ngx_http_maskserve_link_watch(ngx_http_maskserve_region_t *rg, int fd,
    ngx_event_handler_pt handler)
{
    ngx_connection_t  *c;

    c = ngx_get_connection(fd, rg->log);
    if (c == NULL) {
        return NULL;
    }

    c->data = rg;

    c->read->handler = handler;
    c->read->log = rg->log;
    c->write->log = rg->log;

    /* not a client: the shutdown timer must leave it alone */
    c->read->channel = 1;
    c->write->channel = 1;

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        ngx_http_maskserve_link_unwatch(c);
        return NULL;
    }

    return c;
}


/* Take a connection out of the loop; msv_detach closes the fd. */

static void
ngx_http_maskserve_link_unwatch(ngx_connection_t *c)
{
    if (c->read->timer_set) {
        ngx_del_timer(c->read);
    }

    if (c->read->posted) {
        ngx_delete_posted_event(c->read);
    }

    if (c->write->posted) {
        ngx_delete_posted_event(c->write);
    }

    if (c->read->active) {
        /* the fd is closed right after: epoll forgets it then */
        ngx_del_event(c->read, NGX_READ_EVENT, NGX_CLOSE_EVENT);
    }

    ngx_free_connection(c);
    c->fd = (ngx_socket_t) -1;
}


static void
ngx_http_maskserve_link_detach(ngx_http_maskserve_region_t *rg)
{
    if (rg->wake) {
        ngx_http_maskserve_link_unwatch(rg->wake);
        rg->wake = NULL;
    }

    if (rg->conn) {
        ngx_http_maskserve_link_unwatch(rg->conn);
        rg->conn = NULL;
    }

    msv_detach(&rg->att);

    rg->attached = 0;
    rg->detached_at = ngx_current_msec;
}


/*
 * The worker is gone (or replaced, or the region is corrupt): read what it
 * published before it went, end every remaining request of the region
 * with an error, detach, and start looking for its successor.
 */

static void
ngx_http_maskserve_link_lost(ngx_http_maskserve_region_t *rg,
    const char *why)
{
    u_char                     *msg;
    ngx_uint_t                  i;
    ngx_http_maskserve_ctx_t   *ctx;
    ngx_http_maskserve_slot_t  *e;

    if (!rg->attached) {
        return;
    }

    ngx_log_error(NGX_LOG_ERR, rg->log, 0,
                  "maskserve: worker region \"%V\" lost: %s; %ui requests "
                  "in flight", &rg->name, why, rg->inflight);

    /* the worker's last rows (abort rows on shutdown) come first */
    if (ngx_strcmp(why, "malformed record in the ring") != 0) {
        rg->consuming = 1;
        (void) msv_consume(&rg->att.cons, ngx_http_maskserve_link_row, rg);
        rg->consuming = 0;
    }

    for (i = 0; i < rg->n_slots; i++) {
        e = &rg->slots[i];

        if (!e->used) {
            continue;
        }

        ctx = e->ctx;
        e->used = 0;
        e->ctx = NULL;

        if (ctx == NULL) {
            continue;
        }

        ctx->admitted = 0;

        if (ctx->done) {
            continue;
        }

        msg = NULL;
        if (ctx->r) {
            msg = ngx_pnalloc(ctx->r->pool, 256);
        }

        if (msg) {
            ngx_http_maskserve_set_error(&ctx->err, NGX_HTTP_BAD_GATEWAY,
                NGX_HTTP_MASKSERVE_SERVER, NULL, msg,
                ngx_snprintf(msg, 256, "the maskserve worker \"%V\" serving "
                             "this request is gone (%s)", &rg->name, why)
                - msg);

        } else {
            ngx_http_maskserve_error(&ctx->err, NGX_HTTP_BAD_GATEWAY,
                                     NGX_HTTP_MASKSERVE_SERVER, NULL,
                                     "the maskserve worker serving this "
                                     "request is gone");
        }

        ctx->done = 1;
        ngx_http_maskserve_link_dirty(ctx);
    }

    rg->inflight = 0;

    ngx_cpystrn(rg->err, (u_char *) why, sizeof(rg->err));
    ngx_http_maskserve_link_detach(rg);

    ngx_http_maskserve_link_flush(rg);

    if (!rg->retry.timer_set) {
        ngx_add_timer(&rg->retry, NGX_HTTP_MASKSERVE_RETRY);
    }
}


static void
ngx_http_maskserve_link_poll(ngx_http_maskserve_region_t *rg)
{
    long        n;
    ngx_uint_t  rounds;

    if (!rg->attached || rg->consuming) {
        return;
    }

    for (rounds = 0; /* void */ ; rounds++) {
        rg->consuming = 1;
        n = msv_consume(&rg->att.cons, ngx_http_maskserve_link_row, rg);
        rg->consuming = 0;

        if (n < 0) {
            ngx_http_maskserve_link_lost(rg, "malformed record in the ring");
            return;
        }

        /* what this pass formatted goes out before the next pass */
        ngx_http_maskserve_link_flush(rg);

        if (!rg->attached) {
            return;
        }

        if (rounds == NGX_HTTP_MASKSERVE_ROUNDS) {
            /*
             * The worker publishes as fast as we read: let the other
             * events of this cycle run, and come back right after them.
             */
            ngx_post_event(rg->wake->read, &ngx_posted_events);
            return;
        }

        /* arm before sleeping; records that raced in are read now */
        if (msv_consumer_arm(&rg->att.cons) == 0) {
            return;
        }
    }
}


/* One row of the ring: route it to its request by slot and cookie. */

static int
ngx_http_maskserve_link_row(void *ud, uint64_t seq, const struct msv_row *w)
{
    ngx_http_maskserve_region_t  *rg = ud;

    ngx_http_maskserve_ctx_t   *ctx;
    ngx_http_maskserve_slot_t  *e;

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

    if (!ctx->started) {
        ctx->started = 1;

        if (!ctx->seed_known) {
            ctx->seed = msv_slot_at(rg->att.rg.ctrl, w->slot)->seed_used;
            ctx->seed_known = 1;
        }

        ngx_http_maskserve_redis_req_update(&ctx->id, &rg->name, w->slot,
                                            w->cookie, NGX_HTTP_MASKSERVE_REQ_RUNNING,
                                            ctx->prompt_tokens, 0, NULL);
    }

    if (ngx_http_maskserve_output_row(ctx, w) != NGX_OK) {
        /* the request failed (support cap, output limit, memory) */
        ctx->done = 1;

        if (w->finish != MSV_FINISH_NONE) {
            goto release;
        }

        ngx_http_maskserve_link_cancel(ctx);
        ngx_http_maskserve_link_dirty(ctx);
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
            ngx_http_maskserve_link_dirty(ctx);
        }

        return 0;
    }

    if (w->finish <= MSV_FINISH_ABORT) {
        ctx->finish = w->finish;
        ctx->abort_reason = w->abort_reason;

    } else {
        /* a finish this module does not know: an abort it can explain */
        ctx->finish = MSV_FINISH_ABORT;
        ctx->abort_reason = MSV_ABORT_INTERNAL;
    }

    ctx->done = 1;

release:

    /* the row is formatted: the slot may go back to the worker */
    (void) msv_slot_release(rg->att.rg.ctrl, w->slot, w->cookie);
    e->used = 0;
    e->ctx = NULL;
    rg->inflight--;
    ctx->admitted = 0;

    ngx_http_maskserve_link_dirty(ctx);

    return 0;
}


void
ngx_http_maskserve_link_dirty(ngx_http_maskserve_ctx_t *ctx)
{
    if (ctx->dirty || ctx->r == NULL) {
        return;
    }

    ctx->dirty = 1;
    ngx_queue_insert_tail(&ctx->region->dirty, &ctx->queue);
}


static void
ngx_http_maskserve_link_flush(ngx_http_maskserve_region_t *rg)
{
    ngx_queue_t               *q;
    ngx_http_maskserve_ctx_t  *ctx;

    while (!ngx_queue_empty(&rg->dirty)) {
        q = ngx_queue_head(&rg->dirty);
        ngx_queue_remove(q);

        ctx = ngx_queue_data(q, ngx_http_maskserve_ctx_t, queue);
        ctx->dirty = 0;

        /* may finalize the request: ctx is not touched afterwards */
        ngx_http_maskserve_stream_flush(ctx);
    }
}


ngx_http_maskserve_region_t *
ngx_http_maskserve_link_pick(ngx_http_maskserve_main_conf_t *mcf,
    ngx_http_maskserve_loc_conf_t *lcf, ngx_http_maskserve_err_t *err)
{
    ngx_uint_t                    i, n, used, best_used, attached;
    ngx_http_maskserve_region_t  *rg, *best;

    n = ngx_http_maskserve_loc_nregions(mcf, lcf);

    best = NULL;
    best_used = 0;
    attached = 0;

    for (i = 0; i < n; i++) {
        rg = ngx_http_maskserve_loc_region(mcf, lcf, i);

        if (!rg->attached) {
            continue;
        }

        attached++;

        if (ngx_http_maskserve_link_ready(rg) != NGX_OK) {
            continue;
        }

        used = ngx_http_maskserve_link_in_use(rg);

        if (used >= rg->n_slots) {
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

    if (attached == 0) {
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
ngx_http_maskserve_link_ready(ngx_http_maskserve_region_t *rg)
{
    uint64_t          hb, now;
    struct msv_ctrl  *c;

    if (!rg->attached) {
        return NGX_DECLINED;
    }

    c = rg->att.rg.ctrl;

    if (atomic_load_explicit(&c->state, memory_order_relaxed)
        != MSV_WORKER_READY)
    {
        return NGX_DECLINED;
    }

    hb = atomic_load_explicit(&c->heartbeat_ns, memory_order_relaxed);
    now = msv_now_ns();

    if (now > hb && now - hb > NGX_HTTP_MASKSERVE_STALE_NS) {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


ngx_uint_t
ngx_http_maskserve_link_in_use(ngx_http_maskserve_region_t *rg)
{
    uint32_t  census[6];

    if (!rg->attached) {
        return 0;
    }

    msv_slot_census(rg->att.rg.ctrl, census);

    return rg->n_slots - census[MSV_SLOT_FREE];
}


ngx_int_t
ngx_http_maskserve_link_submit(ngx_http_maskserve_region_t *rg,
    ngx_http_maskserve_ctx_t *ctx, ngx_http_maskserve_gen_t *g)
{
    int                         i;
    uint64_t                    cookie;
    struct msv_ctrl            *c;
    ngx_http_maskserve_ctx_t   *other;
    ngx_http_maskserve_slot_t  *e;

    c = rg->att.rg.ctrl;

    i = msv_slot_claim(c, rg->att.reader, (int32_t) ngx_pid);
    if (i < 0) {
        return NGX_DECLINED;
    }

    if ((ngx_uint_t) i >= rg->n_slots) {
        ngx_log_error(NGX_LOG_ALERT, rg->log, 0,
                      "maskserve: claimed slot %d of %ui in \"%V\"",
                      i, rg->n_slots, &rg->name);
        msv_slot_unclaim(c, (uint32_t) i);
        return NGX_DECLINED;
    }

    e = &rg->slots[i];
    other = NULL;

    if (e->used) {
        /*
         * The worker took the slot back while we still listed it (it
         * evicted this reader): the request that had it cannot go on.
         */
        other = e->ctx;
        rg->inflight--;

        if (other && !other->done) {
            other->admitted = 0;
            other->done = 1;
            ngx_http_maskserve_error(&other->err, NGX_HTTP_BAD_GATEWAY,
                                     NGX_HTTP_MASKSERVE_SERVER, NULL,
                                     "the maskserve worker took back the "
                                     "slot of this request");
            ngx_http_maskserve_link_dirty(other);
        }
    }

    cookie = msv_slot_submit(c, (uint32_t) i, (char *) ctx->id.data,
                             &g->params, g->prompt, (uint32_t) g->n_prompt,
                             g->bias);

    e->used = 1;
    e->ctx = ctx;
    e->cookie = cookie;
    rg->inflight++;

    ctx->region = rg;
    ctx->slot = (ngx_uint_t) i;
    ctx->cookie = cookie;
    ctx->admitted = 1;

    msv_kick(rg->att.kick_fd);

    if (other) {
        ngx_http_maskserve_link_flush(rg);
    }

    return NGX_OK;
}


void
ngx_http_maskserve_link_cancel(ngx_http_maskserve_ctx_t *ctx)
{
    ngx_http_maskserve_region_t  *rg;
    ngx_http_maskserve_slot_t    *e;

    if (!ctx->admitted) {
        return;
    }

    rg = ctx->region;
    ctx->admitted = 0;
    ctx->cancelled = 1;

    if (!rg->attached || ctx->slot >= rg->n_slots) {
        return;
    }

    e = &rg->slots[ctx->slot];

    if (e->used && e->cookie == ctx->cookie) {
        e->ctx = NULL;
        msv_slot_cancel(rg->att.rg.ctrl, (uint32_t) ctx->slot, ctx->cookie);
        msv_kick(rg->att.kick_fd);
    }
}


ngx_int_t
ngx_http_maskserve_link_find(ngx_http_maskserve_main_conf_t *mcf, u_char *id,
    size_t len, ngx_http_maskserve_region_t **rgp, ngx_uint_t *slot,
    uint64_t *cookie, uint32_t *state)
{
    uint32_t                      st, i;
    uint64_t                      ck;
    ngx_uint_t                    k;
    struct msv_ctrl              *c;
    struct msv_slot              *s;
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
            st = msv_slot_state(c, i);

            if (st != MSV_SLOT_CLAIMED && st != MSV_SLOT_SUBMITTED
                && st != MSV_SLOT_RUNNING)
            {
                continue;
            }

            s = msv_slot_at(c, i);
            ck = s->cookie;

            if (ngx_strncmp(s->request_id, id, len) != 0
                || s->request_id[len] != '\0')
            {
                continue;
            }

            /* the slot may have changed hands while we compared */
            if (s->cookie != ck || msv_slot_state(c, i) != st) {
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


static void
ngx_http_maskserve_link_wake_handler(ngx_event_t *ev)
{
    ngx_connection_t             *c;
    ngx_http_maskserve_region_t  *rg;

    c = ev->data;
    rg = c->data;

    if (c->close) {
        return;
    }

    (void) msv_drain(rg->att.wake_fd);
    ev->ready = 0;

    ngx_http_maskserve_link_poll(rg);
}


static void
ngx_http_maskserve_link_conn_handler(ngx_event_t *ev)
{
    u_char                        buf[256];
    ssize_t                       n;
    ngx_err_t                     err;
    ngx_connection_t             *c;
    ngx_http_maskserve_region_t  *rg;

    c = ev->data;
    rg = c->data;

    if (c->close) {
        return;
    }

    /* the worker sends nothing after the welcome: drain, look for EOF */
    for ( ;; ) {
        n = recv(c->fd, buf, sizeof(buf), 0);

        if (n > 0) {
            continue;
        }

        if (n == 0) {
            ngx_http_maskserve_link_lost(rg, "the worker closed its socket");
            return;
        }

        err = ngx_socket_errno;

        if (err == NGX_EAGAIN) {
            ev->ready = 0;
            return;
        }

        if (err == NGX_EINTR) {
            continue;
        }

        ngx_log_error(NGX_LOG_ERR, rg->log, err,
                      "maskserve: worker socket of \"%V\"", &rg->name);
        ngx_http_maskserve_link_lost(rg, "error on the worker socket");
        return;
    }
}


static void
ngx_http_maskserve_link_retry_handler(ngx_event_t *ev)
{
    ngx_http_maskserve_region_t     *rg;
    ngx_http_maskserve_main_conf_t  *mcf;

    rg = ev->data;
    mcf = ngx_http_maskserve_process_conf();

    if (mcf == NULL || !mcf->running || rg->attached) {
        return;
    }

    if (rg->attaching) {
        /* no welcome in time: take it if it just came, else give up */
        ngx_http_maskserve_link_hello_handler(rg->conn->read);

        if (rg->attaching) {
            rg->attaching = 0;
            ngx_http_maskserve_link_unwatch(rg->conn);
            rg->conn = NULL;
            msv_detach(&rg->att);
            ngx_http_maskserve_link_attach_failed(rg, "no welcome from the "
                                                  "worker in time");
            ngx_add_timer(&rg->retry, NGX_HTTP_MASKSERVE_RETRY);
        }
        return;
    }

    if (ngx_http_maskserve_link_attach(rg) != NGX_OK) {
        ngx_add_timer(&rg->retry, NGX_HTTP_MASKSERVE_RETRY);
    }
}


static void
ngx_http_maskserve_link_tick_handler(ngx_event_t *ev)
{
    uint64_t                         now;
    ngx_uint_t                       i;
    ngx_http_maskserve_region_t     *rg;
    ngx_http_maskserve_main_conf_t  *mcf;

    mcf = ev->data;

    if (!mcf->running) {
        return;
    }

    now = msv_now_ns();

    for (i = 0; i < mcf->regions.nelts; i++) {
        rg = ngx_http_maskserve_region(mcf, i);

        if (!rg->attached) {
            continue;
        }

        atomic_store_explicit(&rg->att.cons.me->heartbeat_ns, now,
                              memory_order_relaxed);

        if (msv_attachment_check(&rg->att) != 0) {
            ngx_http_maskserve_link_lost(rg, "the worker died or was "
                                         "replaced");
            continue;
        }

        /* a safety net under the eventfd wakeups */
        ngx_http_maskserve_link_poll(rg);
    }

    if (ngx_current_msec - mcf->registry_at >= 1000) {
        ngx_http_maskserve_link_registry(mcf);
    }

    ngx_add_timer(&mcf->tick, NGX_HTTP_MASKSERVE_TICK);
}


static void
ngx_http_maskserve_link_registry(ngx_http_maskserve_main_conf_t *mcf)
{
    ngx_uint_t                    i, load;
    struct msv_ctrl              *c;
    ngx_http_maskserve_region_t  *rg;

    mcf->registry_at = ngx_current_msec;

    if (!mcf->redis_on) {
        return;
    }

    for (i = 0; i < mcf->regions.nelts; i++) {
        rg = ngx_http_maskserve_region(mcf, i);

        if (rg->attaching) {
            continue;               /* the outcome will be written */
        }

        if (!rg->attached) {
            ngx_http_maskserve_redis_worker_update(&rg->name, 0, 0,
                                                   rg->generation, 0);
            continue;
        }

        c = rg->att.rg.ctrl;
        load = atomic_load_explicit(&c->running, memory_order_relaxed)
               + atomic_load_explicit(&c->waiting, memory_order_relaxed);

        ngx_http_maskserve_redis_worker_update(&rg->name, c->n_slots, load,
            rg->generation, ngx_http_maskserve_link_ready(rg) == NGX_OK);
    }
}
