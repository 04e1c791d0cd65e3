/*
 * ngx_http_maskserve_stream.c: output of a generation request.
 *
 * Streaming: headers go out with the first event (text/event-stream,
 * content length cleared so the chunked filter frames each event,
 * X-Accel-Buffering: no).  An event is sent only when the previous one
 * has left the request's buffers (busy empty), as the upstream module's
 * non-buffered mode does: while the client is slow, rows keep being
 * formatted into the sections and go out together in the next event.
 * What a request holds is bounded by maskserve_output_limit (checked as
 * rows arrive, ngx_http_maskserve_output.c); the ring never waits.
 *
 * Non-streaming: the sections grow until the last row, then the body is
 * linked from them and sent with its length.
 *
 * The request's timer is the flush clock in "interval" mode and a
 * watchdog otherwise.  It is deliberately not cancelable: an nginx worker
 * shutting down gracefully (reload) waits for in-flight generations.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_maskserve_module.h"
#include "ngx_http_maskserve_util.h"
#include "ngx_http_maskserve_output.h"
#include "ngx_http_maskserve_stream.h"
#include "ngx_http_maskserve_redis.h"


static ngx_int_t ngx_http_maskserve_stream_header(
    ngx_http_maskserve_ctx_t *ctx);
static ngx_int_t ngx_http_maskserve_stream_send(ngx_http_maskserve_ctx_t *ctx,
    ngx_chain_t *out);
static ngx_int_t ngx_http_maskserve_stream_event(
    ngx_http_maskserve_ctx_t *ctx, ngx_uint_t final);
static void ngx_http_maskserve_stream_finish(ngx_http_maskserve_ctx_t *ctx);
static void ngx_http_maskserve_stream_abort_error(
    ngx_http_maskserve_ctx_t *ctx);
static ngx_int_t ngx_http_maskserve_stream_arm(ngx_http_request_t *r);
static void ngx_http_maskserve_stream_writer(ngx_http_request_t *r);
static void ngx_http_maskserve_stream_timer(ngx_event_t *ev);


void
ngx_http_maskserve_stream_start(ngx_http_maskserve_ctx_t *ctx)
{
    ngx_http_request_t  *r;

    r = ctx->r;

    /* notice a client that goes away while we wait for rows */
    r->read_event_handler = ngx_http_test_reading;
    r->write_event_handler = ngx_http_maskserve_stream_writer;

    ctx->timer.handler = ngx_http_maskserve_stream_timer;
    ctx->timer.data = ctx;
    ctx->timer.log = r->connection->log;

    ngx_add_timer(&ctx->timer,
                  ctx->stream && ctx->lcf->flush
                                 == NGX_HTTP_MASKSERVE_FLUSH_INTERVAL
                  ? ctx->lcf->flush_interval : NGX_HTTP_MASKSERVE_WATCHDOG);
}


void
ngx_http_maskserve_stream_flush(ngx_http_maskserve_ctx_t *ctx)
{
    ngx_int_t            rc;
    ngx_http_request_t  *r;

    r = ctx->r;

    if (r == NULL || ctx->finished) {
        return;
    }

    if (ctx->done) {
        ngx_http_maskserve_stream_finish(ctx);
        return;
    }

    if (!ctx->stream || ctx->busy || !ngx_http_maskserve_output_pending(ctx))
    {
        return;
    }

    rc = ngx_http_maskserve_stream_event(ctx, 0);

    if (rc == NGX_ERROR) {
        ngx_http_maskserve_stream_finalize(r, NGX_ERROR);
    }
}


void
ngx_http_maskserve_stream_finalize(ngx_http_request_t *r, ngx_int_t rc)
{
    ngx_connection_t  *c;

    c = r->connection;

    ngx_http_finalize_request(r, rc);

    /*
     * A termination is carried out as a posted request: run it now, as
     * this is not the request's own event.  Once the request is gone
     * (closed, or the connection idles in keepalive) there is nothing to
     * run.
     */
    if (!c->destroyed && c->data == r) {
        ngx_http_run_posted_requests(c);
    }
}


static ngx_int_t
ngx_http_maskserve_stream_header(ngx_http_maskserve_ctx_t *ctx)
{
    ngx_int_t            rc;
    ngx_table_elt_t     *h;
    ngx_http_request_t  *r;

    r = ctx->r;

    r->headers_out.status = NGX_HTTP_OK;
    ngx_str_set(&r->headers_out.content_type, "text/event-stream");
    r->headers_out.content_type_len = r->headers_out.content_type.len;
    r->headers_out.content_type_lowcase = NULL;

    /* no length: the chunked filter frames every event */
    ngx_http_clear_content_length(r);
    ngx_http_clear_accept_ranges(r);

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    ngx_str_set(&h->key, "Cache-Control");
    ngx_str_set(&h->value, "no-cache");

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    ngx_str_set(&h->key, "X-Accel-Buffering");
    ngx_str_set(&h->value, "no");

    ctx->header_sent = 1;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* Hand a chain to the output filters and recycle what was sent. */

static ngx_int_t
ngx_http_maskserve_stream_send(ngx_http_maskserve_ctx_t *ctx,
    ngx_chain_t *out)
{
    ngx_int_t            rc;
    ngx_chain_t         *cl;
    ngx_http_request_t  *r;

    r = ctx->r;

    rc = ngx_http_output_filter(r, out);

    ngx_chain_update_chains(r->pool, &ctx->free, &ctx->busy, &out,
                            (ngx_buf_tag_t) &ngx_http_maskserve_module);
    ngx_http_maskserve_output_sent(ctx);

    ctx->in_flight = 0;
    for (cl = ctx->busy; cl; cl = cl->next) {
        ctx->in_flight += ngx_buf_size(cl->buf);
    }

    if (rc == NGX_ERROR) {
        return NGX_ERROR;
    }

    if (ngx_http_maskserve_stream_arm(r) != NGX_OK) {
        return NGX_ERROR;
    }

    return rc;
}


static ngx_int_t
ngx_http_maskserve_stream_event(ngx_http_maskserve_ctx_t *ctx,
    ngx_uint_t final)
{
    off_t         len;
    ngx_chain_t  *out, *cl;

    if (!ctx->header_sent) {
        if (ngx_http_maskserve_stream_header(ctx) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    out = ngx_http_maskserve_output_compose(ctx, final, &len);
    if (out == NULL) {
        return NGX_ERROR;
    }

    for (cl = out; cl->next; cl = cl->next) { /* void */ }

    cl->buf->flush = 1;

    ctx->events++;

    return ngx_http_maskserve_stream_send(ctx, out);
}


/*
 * The last row arrived, or the request failed: send the end and finalize.
 */

static void
ngx_http_maskserve_stream_finish(ngx_http_maskserve_ctx_t *ctx)
{
    off_t                          len;
    ngx_int_t                      rc;
    ngx_chain_t                   *out, *cl;
    ngx_http_request_t            *r;
    ngx_http_maskserve_region_t   *rg;
    static const char             *finish[] = { NULL, "stop", "length",
                                                "abort" };

    r = ctx->r;
    ctx->finished = 1;

    if (ctx->timer.timer_set) {
        ngx_del_timer(&ctx->timer);
    }

    if (ctx->dirty) {
        ngx_queue_remove(&ctx->queue);
        ctx->dirty = 0;
    }

    if (ctx->err.status == 0 && ctx->finish == MSV_FINISH_ABORT
        && ctx->abort_reason != MSV_ABORT_CANCELLED
        && ctx->abort_reason != MSV_ABORT_PAUSED)
    {
        ngx_http_maskserve_stream_abort_error(ctx);
    }

    rg = ctx->region;

    if (rg) {
        ngx_http_maskserve_redis_req_update(&ctx->id, &rg->name, ctx->slot,
            ctx->cookie,
            (ctx->err.status || ctx->finish == MSV_FINISH_ABORT)
                ? NGX_HTTP_MASKSERVE_REQ_ABORTED
                : NGX_HTTP_MASKSERVE_REQ_FINISHED,
            ctx->prompt_tokens, ctx->completion_tokens,
            ctx->err.status ? "error"
                            : (ctx->finish <= MSV_FINISH_ABORT
                               ? finish[ctx->finish] : NULL));
    }

    if (ctx->err.status) {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "maskserve: request \"%V\" failed after %ui tokens: "
                      "%V", &ctx->id, ctx->completion_tokens,
                      &ctx->err.message);

        if (!ctx->stream || !ctx->header_sent) {
            rc = ngx_http_maskserve_send_error(r, &ctx->err);
            ngx_http_maskserve_stream_finalize(r, rc);
            return;
        }

        out = ngx_http_maskserve_output_error_event(ctx);
        if (out == NULL) {
            ngx_http_maskserve_stream_finalize(r, NGX_ERROR);
            return;
        }

        out->buf->flush = 1;

        if (ngx_http_maskserve_stream_send(ctx, out) == NGX_ERROR) {
            ngx_http_maskserve_stream_finalize(r, NGX_ERROR);
            return;
        }

        rc = ngx_http_send_special(r, NGX_HTTP_LAST);
        ngx_http_maskserve_stream_finalize(r, rc);
        return;
    }

    if (ctx->stream) {
        if (ngx_http_maskserve_stream_event(ctx, 1) == NGX_ERROR) {
            ngx_http_maskserve_stream_finalize(r, NGX_ERROR);
            return;
        }

        rc = ngx_http_send_special(r, NGX_HTTP_LAST);
        ngx_http_maskserve_stream_finalize(r, rc);
        return;
    }

    out = ngx_http_maskserve_output_compose(ctx, 1, &len);
    if (out == NULL) {
        ngx_http_maskserve_stream_finalize(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    for (cl = out; cl->next; cl = cl->next) { /* void */ }

    cl->buf->last_buf = (r == r->main) ? 1 : 0;
    cl->buf->last_in_chain = 1;

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = len;
    ngx_str_set(&r->headers_out.content_type, "application/json");
    r->headers_out.content_type_len = r->headers_out.content_type.len;
    r->headers_out.content_type_lowcase = NULL;

    ctx->header_sent = 1;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        ngx_http_maskserve_stream_finalize(r, rc);
        return;
    }

    rc = ngx_http_maskserve_stream_send(ctx, out);
    ngx_http_maskserve_stream_finalize(r, rc);
}


/* The worker stopped the request for its own reasons: say which. */

static void
ngx_http_maskserve_stream_abort_error(ngx_http_maskserve_ctx_t *ctx)
{
    switch (ctx->abort_reason) {

    case MSV_ABORT_SHUTDOWN:
        ngx_http_maskserve_error(&ctx->err, NGX_HTTP_SERVICE_UNAVAILABLE,
                                 NGX_HTTP_MASKSERVE_SERVER, NULL,
                                 "the maskserve worker is shutting down");
        break;

    case MSV_ABORT_INVALID:
        ngx_http_maskserve_error(&ctx->err, NGX_HTTP_INTERNAL_SERVER_ERROR,
                                 NGX_HTTP_MASKSERVE_SERVER, NULL,
                                 "the maskserve worker found the request "
                                 "invalid");
        break;

    case MSV_ABORT_NO_KV:
        ngx_http_maskserve_error(&ctx->err, NGX_HTTP_BAD_REQUEST,
                                 NGX_HTTP_MASKSERVE_INVALID, "token_ids",
                                 "the request can never fit the worker's "
                                 "KV cache");
        break;

    default: /* MSV_ABORT_INTERNAL and anything newer */
        ngx_http_maskserve_error(&ctx->err, NGX_HTTP_INTERNAL_SERVER_ERROR,
                                 NGX_HTTP_MASKSERVE_SERVER, NULL,
                                 "the maskserve worker failed while "
                                 "generating");
        break;
    }
}


/* After a send: wait for the socket if nginx still holds output. */

static ngx_int_t
ngx_http_maskserve_stream_arm(ngx_http_request_t *r)
{
    ngx_event_t               *wev;
    ngx_connection_t          *c;
    ngx_http_core_loc_conf_t  *clcf;

    c = r->connection;
    wev = c->write;
    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    if (r->buffered || c->buffered) {
        if (!wev->delayed && !wev->timer_set) {
            ngx_add_timer(wev, clcf->send_timeout);
        }

        if (ngx_handle_write_event(wev, clcf->send_lowat) != NGX_OK) {
            return NGX_ERROR;
        }

        return NGX_OK;
    }

    if (wev->timer_set && !wev->delayed) {
        ngx_del_timer(wev);
    }

    return NGX_OK;
}


/* The client's socket can take more. */

static void
ngx_http_maskserve_stream_writer(ngx_http_request_t *r)
{
    ngx_int_t                  rc;
    ngx_event_t               *wev;
    ngx_http_maskserve_ctx_t  *ctx;

    wev = r->connection->write;

    ctx = ngx_http_get_module_ctx(r, ngx_http_maskserve_module);
    if (ctx == NULL || ctx->finished) {
        return;
    }

    if (wev->timedout) {
        if (!wev->delayed) {
            ngx_log_error(NGX_LOG_INFO, r->connection->log, NGX_ETIMEDOUT,
                          "maskserve: client timed out reading the stream "
                          "of \"%V\"", &ctx->id);
            r->connection->timedout = 1;
            ngx_http_finalize_request(r, NGX_HTTP_REQUEST_TIME_OUT);
            return;
        }

        wev->timedout = 0;
        wev->delayed = 0;
    }

    if (wev->delayed) {
        if (ngx_handle_write_event(wev, 0) != NGX_OK) {
            ngx_http_finalize_request(r, NGX_ERROR);
        }

        return;
    }

    if (!ctx->header_sent) {
        return;
    }

    rc = ngx_http_maskserve_stream_send(ctx, NULL);

    if (rc == NGX_ERROR) {
        ngx_http_finalize_request(r, NGX_ERROR);
        return;
    }

    if (ctx->busy == NULL) {
        /* what was held back while the client was slow goes now */
        if (ctx->done) {
            ngx_http_maskserve_stream_finish(ctx);
            return;
        }

        if (ngx_http_maskserve_output_pending(ctx)) {
            if (ngx_http_maskserve_stream_event(ctx, 0) == NGX_ERROR) {
                ngx_http_finalize_request(r, NGX_ERROR);
            }
        }
    }
}


static void
ngx_http_maskserve_stream_timer(ngx_event_t *ev)
{
    ngx_http_request_t        *r;
    ngx_http_maskserve_ctx_t  *ctx;

    ctx = ev->data;
    r = ctx->r;

    if (r == NULL || ctx->finished) {
        return;
    }

    if (ctx->admitted && !ctx->region->attached) {
        /* the region went without telling its requests: end them */
        ctx->admitted = 0;
        ngx_http_maskserve_error(&ctx->err, NGX_HTTP_BAD_GATEWAY,
                                 NGX_HTTP_MASKSERVE_SERVER, NULL,
                                 "the maskserve worker serving this request "
                                 "is gone");
        ctx->done = 1;
        ngx_http_maskserve_stream_flush(ctx);
        return;
    }

    if (ctx->stream && ctx->lcf->flush == NGX_HTTP_MASKSERVE_FLUSH_INTERVAL) {
        ngx_add_timer(&ctx->timer, ctx->lcf->flush_interval);
        ngx_http_maskserve_stream_flush(ctx);
        return;
    }

    ngx_add_timer(&ctx->timer, NGX_HTTP_MASKSERVE_WATCHDOG);
}
