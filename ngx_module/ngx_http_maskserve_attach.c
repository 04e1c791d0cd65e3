/*
 * ngx_http_maskserve_attach.c: attachments to the worker regions, per
 * nginx worker process.
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
 * Each record is handed to ngx_http_maskserve_route.c, which routes it to
 * its request.
 *
 * A 200 ms cancelable timer writes our heartbeat into the region, checks
 * the worker's generation and heartbeat and polls the ring as a safety
 * net; once a second it refreshes the worker registry in Redis.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "msv_region.h"
#include "msv_ring.h"
#include "msv_slots.h"
#include "msv_link.h"
#include "ngx_http_maskserve_module.h"
#include "ngx_http_maskserve_util.h"
#include "ngx_http_maskserve_attach.h"
#include "ngx_http_maskserve_route.h"
#include "ngx_http_maskserve_redis.h"


static ngx_int_t ngx_http_maskserve_attach_start(
    ngx_http_maskserve_region_t *rg);
static void ngx_http_maskserve_attach_hello_handler(ngx_event_t *ev);
static void ngx_http_maskserve_attach_abandon(
    ngx_http_maskserve_region_t *rg);
static void ngx_http_maskserve_attach_failed(
    ngx_http_maskserve_region_t *rg, const char *err);
static ngx_int_t ngx_http_maskserve_attach_done(
    ngx_http_maskserve_region_t *rg);
static void ngx_http_maskserve_attach_orphan(void *ud, uint32_t slot,
    uint64_t cookie);
static ngx_connection_t *ngx_http_maskserve_attach_watch(
    ngx_http_maskserve_region_t *rg, int fd, ngx_event_handler_pt handler);
static void ngx_http_maskserve_attach_unwatch(ngx_connection_t *c);
static void ngx_http_maskserve_attach_detach(ngx_http_maskserve_region_t *rg);
static void ngx_http_maskserve_attach_lost(ngx_http_maskserve_region_t *rg,
    const char *why, ngx_uint_t corrupt);
static void ngx_http_maskserve_attach_poll(ngx_http_maskserve_region_t *rg);
static void ngx_http_maskserve_attach_wake_handler(ngx_event_t *ev);
static void ngx_http_maskserve_attach_conn_handler(ngx_event_t *ev);
static void ngx_http_maskserve_attach_retry_handler(ngx_event_t *ev);
static void ngx_http_maskserve_attach_tick_handler(ngx_event_t *ev);
static void ngx_http_maskserve_attach_registry(
    ngx_http_maskserve_main_conf_t *mcf);


ngx_int_t
ngx_http_maskserve_attach_init_process(ngx_cycle_t *cycle,
    ngx_http_maskserve_main_conf_t *mcf)
{
    ngx_uint_t                    i;
    ngx_http_maskserve_region_t  *rg;

    rg = mcf->regions.elts;

    for (i = 0; i < mcf->regions.nelts; i++) {
        rg[i].log = cycle->log;
        ngx_queue_init(&rg[i].dirty);

        rg[i].retry.handler = ngx_http_maskserve_attach_retry_handler;
        rg[i].retry.data = &rg[i];
        rg[i].retry.log = cycle->log;
        rg[i].retry.cancelable = 1;

        rg[i].att.conn_fd = -1;
        rg[i].att.wake_fd = -1;
        rg[i].att.kick_fd = -1;

        if (ngx_http_maskserve_attach_start(&rg[i]) != NGX_OK) {
            ngx_add_timer(&rg[i].retry, NGX_HTTP_MASKSERVE_RETRY);
        }
    }

    mcf->tick.handler = ngx_http_maskserve_attach_tick_handler;
    mcf->tick.data = mcf;
    mcf->tick.log = cycle->log;
    mcf->tick.cancelable = 1;
    mcf->running = 1;

    ngx_http_maskserve_attach_registry(mcf);
    ngx_add_timer(&mcf->tick, NGX_HTTP_MASKSERVE_TICK);

    return NGX_OK;
}


void
ngx_http_maskserve_attach_exit_process(ngx_cycle_t *cycle,
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
            ngx_http_maskserve_attach_detach(&rg[i]);

        } else if (rg[i].attaching) {
            ngx_http_maskserve_attach_abandon(&rg[i]);
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
ngx_http_maskserve_attach_start(ngx_http_maskserve_region_t *rg)
{
    char  err[256];

    if (msv_attach_start(&rg->att, (char *) rg->name.data, err, sizeof(err))
        != 0)
    {
        ngx_http_maskserve_attach_failed(rg, err);
        return NGX_ERROR;
    }

    rg->conn = ngx_http_maskserve_attach_watch(rg, rg->att.conn_fd,
                                      ngx_http_maskserve_attach_hello_handler);
    if (rg->conn == NULL) {
        msv_detach(&rg->att);
        ngx_http_maskserve_attach_failed(rg,
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
ngx_http_maskserve_attach_failed(ngx_http_maskserve_region_t *rg,
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
ngx_http_maskserve_attach_hello_handler(ngx_event_t *ev)
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
        ngx_http_maskserve_attach_abandon(rg);
        ngx_http_maskserve_attach_failed(rg, err);
        ngx_add_timer(&rg->retry, NGX_HTTP_MASKSERVE_RETRY);
        return;
    }

    if (ngx_http_maskserve_attach_done(rg) != NGX_OK) {
        ngx_add_timer(&rg->retry, NGX_HTTP_MASKSERVE_RETRY);
    }
}


/* Give up an attach in progress (msv_detach is harmless when done). */

static void
ngx_http_maskserve_attach_abandon(ngx_http_maskserve_region_t *rg)
{
    rg->attaching = 0;
    ngx_http_maskserve_attach_unwatch(rg->conn);
    rg->conn = NULL;
    msv_detach(&rg->att);
}


/* The welcome came: watch the wakeups, serve rows. */

static ngx_int_t
ngx_http_maskserve_attach_done(ngx_http_maskserve_region_t *rg)
{
    uint32_t                         n;
    struct msv_ctrl                 *c;
    ngx_http_maskserve_slot_t       *slots;
    ngx_http_maskserve_main_conf_t  *mcf;

    rg->conn->read->handler = ngx_http_maskserve_attach_conn_handler;

    c = rg->att.rg.ctrl;

    if (rg->slots == NULL || rg->n_slots != c->n_slots) {
        slots = ngx_alloc(c->n_slots * sizeof(ngx_http_maskserve_slot_t),
                          rg->log);
        if (slots == NULL) {
            ngx_http_maskserve_attach_unwatch(rg->conn);
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

    /* the slots of the requests this process ended when it lost the
     * region (a worker stalled past the limit, then back): freed, or
     * orphans freed at their last row (msv_slots_adopt) */
    n = msv_slots_adopt(c, (int32_t) ngx_pid,
                        ngx_http_maskserve_attach_orphan, rg);
    if (n > 0 || rg->inflight > 0) {
        ngx_log_error(NGX_LOG_NOTICE, rg->log, 0,
                      "maskserve: worker region \"%V\": %uD slots of "
                      "ended requests freed, %ui left to their last row",
                      &rg->name, n, rg->inflight);
    }

    rg->wake = ngx_http_maskserve_attach_watch(rg, rg->att.wake_fd,
                                      ngx_http_maskserve_attach_wake_handler);
    if (rg->wake == NULL) {
        ngx_http_maskserve_attach_unwatch(rg->conn);
        rg->conn = NULL;
        msv_detach(&rg->att);
        ngx_cpystrn(rg->err, (u_char *) "cannot watch the wakeup fd",
                    sizeof(rg->err));
        return NGX_ERROR;
    }

    rg->attached = 1;
    rg->fails = 0;
    rg->draining = 0;
    rg->drained = 0;
    rg->generation = rg->att.generation;
    rg->err[0] = '\0';

    ngx_log_error(NGX_LOG_NOTICE, rg->log, 0,
                  "maskserve: attached to worker region \"%V\" "
                  "(pid %D, generation %016uxL, %uD slots, vocab %uD, "
                  "reader %uD)", &rg->name, c->worker_pid, rg->generation,
                  c->n_slots, c->vocab_size, rg->att.reader);

    /* rows may be waiting already */
    ngx_http_maskserve_attach_poll(rg);

    /* the registry hears of it now, not at the next tick */
    mcf = ngx_http_maskserve_process_conf();
    if (mcf != NULL) {
        ngx_http_maskserve_attach_registry(mcf);
    }

    return NGX_OK;
}


/* A slot of an ended request still running: an orphan, which the row
 * router frees at its last row. */
static void
ngx_http_maskserve_attach_orphan(void *ud, uint32_t slot, uint64_t cookie)
{
    ngx_http_maskserve_region_t  *rg = ud;
    ngx_http_maskserve_slot_t    *e;

    if (slot >= rg->n_slots) {
        return;
    }

    e = &rg->slots[slot];
    e->used = 1;
    e->ctx = NULL;
    e->cookie = cookie;
    rg->inflight++;
}


static ngx_connection_t *
ngx_http_maskserve_attach_watch(ngx_http_maskserve_region_t *rg, int fd,
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
        ngx_http_maskserve_attach_unwatch(c);
        return NULL;
    }

    return c;
}


/* Take a connection out of the loop; msv_detach closes the fd. */

static void
ngx_http_maskserve_attach_unwatch(ngx_connection_t *c)
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
ngx_http_maskserve_attach_detach(ngx_http_maskserve_region_t *rg)
{
    if (rg->wake) {
        ngx_http_maskserve_attach_unwatch(rg->wake);
        rg->wake = NULL;
    }

    if (rg->conn) {
        ngx_http_maskserve_attach_unwatch(rg->conn);
        rg->conn = NULL;
    }

    msv_detach(&rg->att);

    rg->attached = 0;
    rg->detached_at = ngx_current_msec;
}


/*
 * The worker is gone (or replaced, or the region is corrupt): read what it
 * published before it went, end every remaining request of the region
 * with an error, detach, and start looking for its successor.  A corrupt
 * ring is not read again.
 */

static void
ngx_http_maskserve_attach_lost(ngx_http_maskserve_region_t *rg,
    const char *why, ngx_uint_t corrupt)
{
    u_char                     *msg;
    ngx_uint_t                  i, state;
    ngx_http_maskserve_ctx_t   *ctx;
    ngx_http_maskserve_slot_t  *e;

    if (!rg->attached) {
        return;
    }

    ngx_log_error(NGX_LOG_ERR, rg->log, 0,
                  "maskserve: worker region \"%V\" lost: %s; %ui requests "
                  "in flight", &rg->name, why, rg->inflight);

    /*
     * A worker that went after a drain (SIGTERM) left on purpose: its
     * region leaves the registry now, so that fronts stop choosing this
     * host at once; one that died stays there, not alive, until its key
     * expires.  The mapping is still ours until the detach below.
     */
    state = atomic_load_explicit(&rg->att.rg.ctrl->state,
                                 memory_order_relaxed);

    if (!corrupt
        && (state == MSV_WORKER_DRAINING || state == MSV_WORKER_STOPPED))
    {
        rg->drained = 1;
        ngx_http_maskserve_redis_worker_remove(&rg->name);
    }

    /* the worker's last rows (abort rows on shutdown) come first */
    if (!corrupt) {
        rg->consuming = 1;
        (void) msv_consume(&rg->att.cons, ngx_http_maskserve_route_row, rg);
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
        ngx_http_maskserve_route_dirty(ctx);
    }

    rg->inflight = 0;

    ngx_cpystrn(rg->err, (u_char *) why, sizeof(rg->err));
    ngx_http_maskserve_attach_detach(rg);

    ngx_http_maskserve_route_flush(rg);

    if (!rg->retry.timer_set) {
        ngx_add_timer(&rg->retry, NGX_HTTP_MASKSERVE_RETRY);
    }
}


static void
ngx_http_maskserve_attach_poll(ngx_http_maskserve_region_t *rg)
{
    long        n;
    ngx_uint_t  rounds;

    if (!rg->attached || rg->consuming) {
        return;
    }

    for (rounds = 0; /* void */ ; rounds++) {
        rg->consuming = 1;
        n = msv_consume_ahead(&rg->att.cons, ngx_http_maskserve_route_row,
                              ngx_http_maskserve_route_hint, rg);
        rg->consuming = 0;

        if (n < 0) {
            ngx_http_maskserve_attach_lost(rg, "malformed record in the ring",
                                           1);
            return;
        }

        /* what this pass formatted goes out before the next pass */
        ngx_http_maskserve_route_flush(rg);

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


ngx_int_t
ngx_http_maskserve_attach_ready(ngx_http_maskserve_region_t *rg)
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

    if (now > hb && now - hb > ngx_http_maskserve_attach_stall_ns(rg)) {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


ngx_uint_t
ngx_http_maskserve_attach_stalled(ngx_http_maskserve_region_t *rg)
{
    uint64_t  hb, now;

    if (!rg->attached) {
        return 0;
    }

    hb = atomic_load_explicit(&rg->att.rg.ctrl->heartbeat_ns,
                              memory_order_relaxed);
    now = msv_now_ns();

    return (now > hb && now - hb > MSV_HEARTBEAT_LATE_NS) ? 1 : 0;
}


uint64_t
ngx_http_maskserve_attach_stall_ns(ngx_http_maskserve_region_t *rg)
{
    ngx_http_maskserve_main_conf_t  *mcf;

    mcf = ngx_http_maskserve_process_conf();

    if (mcf == NULL || mcf->stall_timeout == 0) {
        return MSV_HEARTBEAT_STALE_NS;
    }

    return (uint64_t) mcf->stall_timeout * 1000000;
}


ngx_uint_t
ngx_http_maskserve_attach_in_use(ngx_http_maskserve_region_t *rg)
{
    uint32_t  census[6];

    if (!rg->attached) {
        return 0;
    }

    msv_slot_census(rg->att.rg.ctrl, census);

    return rg->n_slots - census[MSV_SLOT_FREE];
}



static void
ngx_http_maskserve_attach_wake_handler(ngx_event_t *ev)
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

    ngx_http_maskserve_attach_poll(rg);
}


static void
ngx_http_maskserve_attach_conn_handler(ngx_event_t *ev)
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
            ngx_http_maskserve_attach_lost(rg, "the worker closed its socket",
                                           0);
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
        ngx_http_maskserve_attach_lost(rg, "error on the worker socket", 0);
        return;
    }
}


static void
ngx_http_maskserve_attach_retry_handler(ngx_event_t *ev)
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
        ngx_http_maskserve_attach_hello_handler(rg->conn->read);

        if (rg->attaching) {
            ngx_http_maskserve_attach_abandon(rg);
            ngx_http_maskserve_attach_failed(rg, "no welcome from the "
                                             "worker in time");
            ngx_add_timer(&rg->retry, NGX_HTTP_MASKSERVE_RETRY);
        }
        return;
    }

    if (ngx_http_maskserve_attach_start(rg) != NGX_OK) {
        ngx_add_timer(&rg->retry, NGX_HTTP_MASKSERVE_RETRY);
    }
}


static void
ngx_http_maskserve_attach_tick_handler(ngx_event_t *ev)
{
    ngx_uint_t                       i, draining;
    ngx_http_maskserve_region_t     *rg;
    ngx_http_maskserve_main_conf_t  *mcf;

    mcf = ev->data;

    if (!mcf->running) {
        return;
    }

    draining = 0;

    for (i = 0; i < mcf->regions.nelts; i++) {
        rg = ngx_http_maskserve_region(mcf, i);

        if (!rg->attached) {
            continue;
        }

        msv_reader_heartbeat(&rg->att);

        rg->att.stall_ns = ngx_http_maskserve_attach_stall_ns(rg);

        if (msv_attachment_check(&rg->att) != 0) {
            /* what was seen: no heartbeat for N s, EOF, a new worker ... */
            ngx_http_maskserve_attach_lost(rg, rg->att.lost, 0);
            continue;
        }

        /* a drain began: the registry hears of it now, not in a second */
        if (!rg->draining && atomic_load_explicit(&rg->att.rg.ctrl->state,
                                                  memory_order_relaxed)
                             >= MSV_WORKER_DRAINING)
        {
            ngx_log_error(NGX_LOG_NOTICE, rg->log, 0,
                          "maskserve: worker region \"%V\" is draining",
                          &rg->name);
            rg->draining = 1;
            draining = 1;
        }

        /* a safety net under the eventfd wakeups */
        ngx_http_maskserve_attach_poll(rg);
    }

    if (draining || ngx_current_msec - mcf->registry_at >= 1000) {
        ngx_http_maskserve_attach_registry(mcf);
    }

    ngx_add_timer(&mcf->tick, NGX_HTTP_MASKSERVE_TICK);
}


static void
ngx_http_maskserve_attach_registry(ngx_http_maskserve_main_conf_t *mcf)
{
    ngx_uint_t                    i, load, state;
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
            if (rg->drained) {
                continue;           /* deregistered until it is back */
            }

            ngx_http_maskserve_redis_worker_update(&rg->name, 0, 0,
                                                   rg->generation, 0, 0);
            continue;
        }

        c = rg->att.rg.ctrl;
        load = atomic_load_explicit(&c->running, memory_order_relaxed)
               + atomic_load_explicit(&c->waiting, memory_order_relaxed);
        state = atomic_load_explicit(&c->state, memory_order_relaxed);
        rg->draining = (state >= MSV_WORKER_DRAINING);

        ngx_http_maskserve_redis_worker_update(&rg->name, c->n_slots, load,
            rg->generation, ngx_http_maskserve_attach_ready(rg) == NGX_OK,
            rg->draining);
    }
}

