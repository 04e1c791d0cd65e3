/*
 * ngx_http_maskserve_generate.c: the generation request, from its headers
 * to its admission.
 *
 * Everything is checked before anything is admitted: method, content
 * type, length, then the body (syntax, types, ranges), then what depends
 * on the model of the region picked, then the uniqueness of the request
 * id among the requests in flight.  Only then is a slot claimed.  From
 * there the request lives on rows (ngx_http_maskserve_link.c) and output
 * (ngx_http_maskserve_stream.c); the body-reading reference keeps it
 * alive until the stream code finalizes it.
 *
 * A request that goes away early (client disconnect, send timeout)
 * passes through the cleanup handler: the slot's cancel flag is set and
 * the slot table entry stays as an orphan until the worker's final row
 * for it, when the slot is released.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "msv_shm.h"
#include "ngx_http_maskserve_module.h"
#include "ngx_http_maskserve_util.h"
#include "ngx_http_maskserve_parse.h"
#include "ngx_http_maskserve_route.h"
#include "ngx_http_maskserve_output.h"
#include "ngx_http_maskserve_stream.h"
#include "ngx_http_maskserve_generate.h"
#include "ngx_http_maskserve_redis.h"


/* claim attempts when other processes take the slots we saw free */
#define NGX_HTTP_MASKSERVE_CLAIM_TRIES  4


static void ngx_http_maskserve_generate_body(ngx_http_request_t *r);
static ngx_int_t ngx_http_maskserve_generate_id(ngx_http_request_t *r,
    ngx_http_maskserve_main_conf_t *mcf, ngx_str_t *id);
static void ngx_http_maskserve_generate_cleanup(void *data);


ngx_int_t
ngx_http_maskserve_generate_handler(ngx_http_request_t *r)
{
    ngx_int_t  rc;

    if (ngx_http_maskserve_check_post(r, &rc) != NGX_OK) {
        return rc;
    }

    rc = ngx_http_read_client_request_body(r,
                                           ngx_http_maskserve_generate_body);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    return NGX_DONE;
}


ngx_int_t
ngx_http_maskserve_check_post(ngx_http_request_t *r, ngx_int_t *rcp)
{
    u_char                    *p, *last;
    ngx_int_t                  rc;
    ngx_str_t                 *ct;
    ngx_http_maskserve_err_t   err;

    ngx_memzero(&err, sizeof(ngx_http_maskserve_err_t));

    if (r->method != NGX_HTTP_POST) {
        ngx_http_maskserve_error(&err, NGX_HTTP_NOT_ALLOWED,
                                 NGX_HTTP_MASKSERVE_INVALID, NULL,
                                 "only POST is allowed here");
        goto fail;
    }

    if (r->headers_in.content_type == NULL) {
        ngx_http_maskserve_error(&err, NGX_HTTP_UNSUPPORTED_MEDIA_TYPE,
                                 NGX_HTTP_MASKSERVE_INVALID, NULL,
                                 "Content-Type must be application/json");
        goto fail;
    }

    /* "application/json", optionally with parameters (charset) */
    ct = &r->headers_in.content_type->value;
    p = ct->data;
    last = ct->data + ct->len;

    while (p < last && *p != ';' && *p != ' ' && *p != '\t') {
        p++;
    }

    if (p - ct->data != 16
        || ngx_strncasecmp(ct->data, (u_char *) "application/json", 16) != 0)
    {
        ngx_http_maskserve_error(&err, NGX_HTTP_UNSUPPORTED_MEDIA_TYPE,
                                 NGX_HTTP_MASKSERVE_INVALID, NULL,
                                 "Content-Type must be application/json");
        goto fail;
    }

    if (r->headers_in.content_length_n < 0 && !r->headers_in.chunked) {
        ngx_http_maskserve_error(&err, NGX_HTTP_LENGTH_REQUIRED,
                                 NGX_HTTP_MASKSERVE_INVALID, NULL,
                                 "a request body with Content-Length is "
                                 "required");
        goto fail;
    }

    /*
     * A body above client_max_body_size is refused by nginx itself (413)
     * before this handler runs; docs/nginx.conf gives it a JSON body with
     * error_page.
     */

    return NGX_OK;

fail:

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        *rcp = rc;
        return NGX_DECLINED;
    }

    /* without a length the body cannot be told apart from what follows */
    if (err.status == NGX_HTTP_LENGTH_REQUIRED) {
        r->keepalive = 0;
    }

    *rcp = ngx_http_maskserve_send_error(r, &err);

    return NGX_DECLINED;
}


static void
ngx_http_maskserve_generate_body(ngx_http_request_t *r)
{
    ngx_int_t                        rc;
    ngx_uint_t                       tries, slot;
    uint32_t                         state;
    uint64_t                         cookie;
    ngx_http_cleanup_t              *cln;
    ngx_http_maskserve_ctx_t        *ctx;
    ngx_http_maskserve_gen_t         g;
    ngx_http_maskserve_err_t         err;
    ngx_http_maskserve_region_t     *rg, *other;
    ngx_http_maskserve_loc_conf_t   *lcf;
    ngx_http_maskserve_main_conf_t  *mcf;

    ngx_memzero(&err, sizeof(ngx_http_maskserve_err_t));

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_maskserve_module);
    mcf = ngx_http_get_module_main_conf(r, ngx_http_maskserve_module);

    if (ngx_http_maskserve_parse_generate(r, &g, &err) != NGX_OK) {
        goto fail;
    }

    if (!mcf->running) {
        ngx_http_maskserve_error(&err, NGX_HTTP_SERVICE_UNAVAILABLE,
                                 NGX_HTTP_MASKSERVE_OVERLOAD, NULL,
                                 "no maskserve worker is attached; "
                                 "retry later");
        goto fail;
    }

    /*
     * One slot per choice (sampling_params.n), all in one region.  When
     * no region has that many free, any ready one: its checks say why
     * the request cannot run (n above its slots), or it is busy (503).
     */
    rg = ngx_http_maskserve_route_pick_n(mcf, lcf, g.params.n, &err);

    if (rg == NULL) {
        rg = ngx_http_maskserve_route_pick(mcf, lcf, &err);
        if (rg == NULL) {
            goto fail;
        }
    }

    if (ngx_http_maskserve_check_generate(r, &g, rg->att.rg.ctrl, lcf, &err)
        != NGX_OK)
    {
        goto fail;
    }

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_maskserve_ctx_t));
    if (ctx == NULL) {
        goto internal;
    }

    if (g.request_id.len) {
        if (ngx_http_maskserve_route_find(mcf, g.request_id.data,
                                         g.request_id.len, &other, &slot,
                                         &cookie, &state)
            == NGX_OK)
        {
            ngx_http_maskserve_error(&err, NGX_HTTP_CONFLICT,
                                     NGX_HTTP_MASKSERVE_INVALID,
                                     "request_id",
                                     "a request with this request_id is "
                                     "already in flight");
            goto fail;
        }

        ctx->id = g.request_id;

    } else if (ngx_http_maskserve_generate_id(r, mcf, &ctx->id) != NGX_OK) {
        goto internal;
    }

    ctx->r = r;
    ctx->lcf = lcf;
    ctx->stream = g.stream;
    ctx->packed = g.packed;
    ctx->mode = g.params.mask_mode;
    ctx->logprobs = g.params.logprobs;
    ctx->prompt_tokens = g.n_prompt;
    ctx->n_choices = g.params.n;

    if (g.params.has_seed) {
        ctx->seed = g.params.seed;
        ctx->seed_known = 1;
    }

    if (ngx_http_maskserve_output_init(ctx) != NGX_OK) {
        goto internal;
    }

    cln = ngx_http_cleanup_add(r, 0);
    if (cln == NULL) {
        goto internal;
    }

    cln->handler = ngx_http_maskserve_generate_cleanup;
    cln->data = ctx;

    ngx_http_set_ctx(r, ctx, ngx_http_maskserve_module);

    for (tries = 0; /* void */ ; tries++) {
        rc = ngx_http_maskserve_route_submit(rg, ctx, &g);

        if (rc == NGX_OK) {
            break;
        }

        /* taken meanwhile by another process: look again */
        if (tries + 1 == NGX_HTTP_MASKSERVE_CLAIM_TRIES) {
            ngx_http_maskserve_error(&err, NGX_HTTP_SERVICE_UNAVAILABLE,
                                     NGX_HTTP_MASKSERVE_OVERLOAD, NULL,
                                     "no free request slot in any ready "
                                     "maskserve worker; retry later");
            goto fail;
        }

        /* one slot per choice (sampling_params.n), all in one region */
        other = ngx_http_maskserve_route_pick_n(mcf, lcf, g.params.n, &err);
        if (other == NULL) {
            goto fail;
        }

        /* the model facts were checked against rg's: keep to the same */
        if (other->att.rg.ctrl->vocab_size != rg->att.rg.ctrl->vocab_size
            || other->att.rg.ctrl->max_model_len
               != rg->att.rg.ctrl->max_model_len)
        {
            if (ngx_http_maskserve_check_generate(r, &g,
                                                  other->att.rg.ctrl, lcf,
                                                  &err)
                != NGX_OK)
            {
                goto fail;
            }
        }

        rg = other;
    }

    ngx_log_debug6(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "maskserve: \"%V\" admitted to \"%V\" slot %ui, "
                   "%ui choices, %ui prompt tokens, stream %d",
                   &ctx->id, &rg->name, ctx->slot, ctx->n_choices,
                   g.n_prompt, (int) ctx->stream);

    ngx_http_maskserve_redis_req_update(&ctx->id, &rg->name, ctx->slot,
                                        ctx->cookie,
                                        NGX_HTTP_MASKSERVE_REQ_ADMITTED,
                                        ctx->prompt_tokens, 0, NULL);

    ngx_http_maskserve_stream_start(ctx);

    /* the reference taken to read the body keeps the request alive */
    return;

internal:

    ngx_http_maskserve_error(&err, NGX_HTTP_INTERNAL_SERVER_ERROR,
                             NGX_HTTP_MASKSERVE_SERVER, NULL,
                             "out of memory");

fail:

    if (err.status >= NGX_HTTP_INTERNAL_SERVER_ERROR
        && err.status != NGX_HTTP_SERVICE_UNAVAILABLE)
    {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "maskserve: %V", &err.message);
    }

    ngx_http_finalize_request(r, ngx_http_maskserve_send_error(r, &err));
}


static ngx_int_t
ngx_http_maskserve_generate_id(ngx_http_request_t *r,
    ngx_http_maskserve_main_conf_t *mcf, ngx_str_t *id)
{
    u_char  *p;

    p = ngx_pnalloc(r->pool, sizeof("msv-") + 3 * 8 + 2 * NGX_INT_T_LEN + 4);
    if (p == NULL) {
        return NGX_ERROR;
    }

    id->data = p;
    p = ngx_sprintf(p, "msv-%08xD%08xD-%xP-%xi", (uint32_t) ngx_random(),
                    (uint32_t) ngx_random(), ngx_pid, ++mcf->id_seq);
    *p = '\0';
    id->len = p - id->data;

    return NGX_OK;
}


static void
ngx_http_maskserve_generate_cleanup(void *data)
{
    ngx_http_maskserve_ctx_t  *ctx = data;

    if (ctx->timer.timer_set) {
        ngx_del_timer(&ctx->timer);
    }

    if (ctx->dirty) {
        ngx_queue_remove(&ctx->queue);
        ctx->dirty = 0;
    }

    if (ctx->admitted) {
        /* gone before its last row: the worker stops it at its next step */
        ngx_log_error(NGX_LOG_INFO, ctx->r->connection->log, 0,
                      "maskserve: request \"%V\" cancelled after %ui tokens "
                      "(client gone)", &ctx->id, ctx->completion_tokens);

        ngx_http_maskserve_route_cancel(ctx);

        ngx_http_maskserve_redis_req_update(&ctx->id, &ctx->region->name,
                                            ctx->slot, ctx->cookie,
                                            NGX_HTTP_MASKSERVE_REQ_ABORTED,
                                            ctx->prompt_tokens,
                                            ctx->completion_tokens, "abort");
    }

    ctx->r = NULL;
}
