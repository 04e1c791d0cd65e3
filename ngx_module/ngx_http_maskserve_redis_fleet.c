/*
 * ngx_http_maskserve_redis_fleet.c: a front's read of the worker
 * registry.  One scan is SMEMBERS <prefix>:workers followed by one
 * HGETALL per member, all pipelined on the command link; the scan ends
 * when the last reply arrived (or the link failed, which answers every
 * pending command with a NULL reply).
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include <hiredis/hiredis.h>
#include <hiredis/async.h>

#include "ngx_http_maskserve_redis.h"
#include "ngx_http_maskserve_redis_ctx.h"
#include "ngx_http_maskserve_redis_cmd.h"
#include "ngx_http_maskserve_redis_fleet.h"


typedef struct {
    ngx_http_maskserve_redis_scan_pt        cb;
    void                                   *data;
    ngx_http_maskserve_redis_worker_rec_t  *recs;
    ngx_uint_t                              n;
    ngx_uint_t                              owed;    /* HGETALL replies */
    ngx_uint_t                              failed;
} msv_redis_scan_t;


static void msv_redis_scan_members_cb(redisAsyncContext *ac, void *r,
    void *privdata);
static void msv_redis_scan_worker_cb(redisAsyncContext *ac, void *r,
    void *privdata);
static void msv_redis_scan_done(msv_redis_scan_t *s);
static void msv_redis_scan_field(ngx_http_maskserve_redis_worker_rec_t *w,
    redisReply *k, redisReply *v);


/* the scan in flight, if any: one per process */
static msv_redis_scan_t  *msv_redis_scan;


ngx_int_t
ngx_http_maskserve_redis_scan_workers(ngx_http_maskserve_redis_scan_pt cb,
    void *data)
{
    msv_redis_cmd_t    cmd;
    msv_redis_ctx_t   *ctx;
    msv_redis_scan_t  *s;

    ctx = msv_redis;

    if (ctx == NULL || !ctx->cmd.ready || ctx->exiting) {
        return NGX_DECLINED;
    }

    if (msv_redis_scan != NULL) {
        return NGX_BUSY;
    }

    s = ngx_calloc(sizeof(msv_redis_scan_t), ctx->log);
    if (s == NULL) {
        return NGX_ERROR;
    }

    s->cb = cb;
    s->data = data;

    msv_redis_cmd_init(&cmd);
    msv_redis_arg_cstr(&cmd, "SMEMBERS");
    msv_redis_arg(&cmd, ctx->workers.data, ctx->workers.len);

    if (msv_redis_link_send(&ctx->cmd, msv_redis_scan_members_cb, s, &cmd)
        != NGX_OK)
    {
        ngx_free(s);
        return NGX_DECLINED;
    }

    msv_redis_scan = s;

    return NGX_OK;
}


static void
msv_redis_scan_members_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    size_t             i;
    redisReply        *reply = r, *m;
    msv_redis_cmd_t    cmd;
    msv_redis_ctx_t   *ctx;
    msv_redis_scan_t  *s = privdata;

    ctx = msv_redis;

    msv_redis_link_replied(&ctx->cmd, reply);

    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY || ctx->exiting) {
        if (reply != NULL && reply->type == REDIS_REPLY_ERROR) {
            msv_redis_reply_error(ctx, "SMEMBERS", &ctx->workers, reply);
        }

        s->failed = 1;
        msv_redis_scan_done(s);
        return;
    }

    s->n = ngx_min(reply->elements, NGX_HTTP_MASKSERVE_FLEET_SCAN_MAX);

    if (reply->elements > NGX_HTTP_MASKSERVE_FLEET_SCAN_MAX) {
        ngx_log_error(NGX_LOG_WARN, ctx->log, 0,
                      "maskserve fleet: \"%V\" has %uz members, only the "
                      "first %d are read", &ctx->workers, reply->elements,
                      NGX_HTTP_MASKSERVE_FLEET_SCAN_MAX);
    }

    if (s->n == 0) {
        msv_redis_scan_done(s);
        return;
    }

    s->recs = ngx_calloc(s->n * sizeof(ngx_http_maskserve_redis_worker_rec_t),
                         ctx->log);
    if (s->recs == NULL) {
        s->failed = 1;
        msv_redis_scan_done(s);
        return;
    }

    for (i = 0; i < s->n; i++) {
        m = reply->element[i];

        if (m->type != REDIS_REPLY_STRING || m->len == 0
            || m->len > MSV_REDIS_ARG_BYTES - ctx->prefix.len - 16)
        {
            continue;
        }

        msv_redis_cmd_init(&cmd);
        msv_redis_arg_cstr(&cmd, "HGETALL");
        msv_redis_arg_fmt(&cmd, "%V:worker:%*s", &ctx->prefix,
                          (size_t) m->len, m->str);

        /* recs[i] is the privdata: the reply lands in its own record */
        if (msv_redis_link_send(&ctx->cmd, msv_redis_scan_worker_cb,
                                &s->recs[i], &cmd)
            != NGX_OK)
        {
            s->failed = 1;
            break;
        }

        s->owed++;
    }

    if (s->owed == 0) {
        msv_redis_scan_done(s);
    }
}


static void
msv_redis_scan_worker_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    size_t                                  i;
    redisReply                             *reply = r;
    msv_redis_ctx_t                        *ctx;
    msv_redis_scan_t                       *s;
    ngx_http_maskserve_redis_worker_rec_t  *w = privdata;

    ctx = msv_redis;
    s = msv_redis_scan;

    msv_redis_link_replied(&ctx->cmd, reply);

    if (reply == NULL) {
        s->failed = 1;

    } else if (reply->type == REDIS_REPLY_ARRAY && reply->elements > 0
               && reply->elements % 2 == 0)
    {
        w->present = 1;

        for (i = 0; i + 1 < reply->elements; i += 2) {
            if (reply->element[i]->type == REDIS_REPLY_STRING
                && reply->element[i + 1]->type == REDIS_REPLY_STRING)
            {
                msv_redis_scan_field(w, reply->element[i],
                                     reply->element[i + 1]);
            }
        }

        /* a key without a host or address cannot be routed to */
        if (w->host_len == 0) {
            w->present = 0;
        }

    } else if (reply->type == REDIS_REPLY_ERROR) {
        msv_redis_reply_error(ctx, "HGETALL", NULL, reply);
    }

    if (--s->owed == 0) {
        msv_redis_scan_done(s);
    }
}


static void
msv_redis_scan_field(ngx_http_maskserve_redis_worker_rec_t *w, redisReply *k,
    redisReply *v)
{
    ngx_int_t  n;

#define msv_field_is(name)                                                    \
    (k->len == sizeof(name) - 1 && ngx_strncmp(k->str, name, k->len) == 0)

    if (msv_field_is("host") || msv_field_is("addr")) {
        if (v->len == 0 || v->len > NGX_HTTP_MASKSERVE_FLEET_NAME_MAX) {
            return;
        }

        if (k->str[0] == 'h') {
            ngx_memcpy(w->host, v->str, v->len);
            w->host[v->len] = '\0';
            w->host_len = v->len;

        } else {
            ngx_memcpy(w->addr, v->str, v->len);
            w->addr[v->len] = '\0';
            w->addr_len = v->len;
        }

        return;
    }

    n = ngx_atoi((u_char *) v->str, v->len);
    if (n == NGX_ERROR) {
        return;
    }

    if (msv_field_is("capacity")) {
        w->capacity = n;

    } else if (msv_field_is("load")) {
        w->load = n;

    } else if (msv_field_is("alive")) {
        w->alive = n ? 1 : 0;

    } else if (msv_field_is("draining")) {
        w->draining = n ? 1 : 0;

    } else if (msv_field_is("heartbeat")) {
        w->heartbeat = (uint64_t) n;
    }

#undef msv_field_is
}


static void
msv_redis_scan_done(msv_redis_scan_t *s)
{
    ngx_uint_t                              i, k;
    ngx_http_maskserve_redis_worker_rec_t  *w;

    msv_redis_scan = NULL;

    /* keep only the members whose key still exists */
    k = 0;
    w = s->recs;

    for (i = 0; w != NULL && i < s->n; i++) {
        if (w[i].present) {
            if (k != i) {
                w[k] = w[i];
            }

            k++;
        }
    }

    s->cb(s->data, s->failed ? NGX_ERROR : NGX_OK, w, k);

    ngx_free(s->recs);
    ngx_free(s);
}
