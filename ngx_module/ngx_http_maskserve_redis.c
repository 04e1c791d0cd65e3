/*
 * ngx_http_maskserve_redis.c: the life cycle of a process's Redis state,
 * its configuration, and the commands whose replies someone waits for
 * (HGETALL, PUBLISH).
 *
 * Each nginx worker process owns two links to Redis, created in
 * init_process: "command" (HSET/PEXPIRE/SADD/HGETALL/PUBLISH) and
 * "subscriber" (SUBSCRIBE <prefix>:abort); see
 * ngx_http_maskserve_redis_link.c.  Request metadata and the worker
 * registry are kept and written by ngx_http_maskserve_redis_store.c; the
 * sockets join nginx's event loop through
 * ngx_http_maskserve_redis_adapter.c.
 *
 * Every command's privdata outlives the HTTP request that caused it
 * (req_get handles are cleared by ngx_http_maskserve_redis_cancel).
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include <netdb.h>
#include <sys/socket.h>

#include <hiredis/hiredis.h>
#include <hiredis/async.h>

#include "ngx_http_maskserve_redis.h"
#include "ngx_http_maskserve_redis_ctx.h"
#include "ngx_http_maskserve_redis_store.h"
#include "ngx_http_maskserve_redis_cmd.h"


static void msv_redis_ctx_free(msv_redis_ctx_t *ctx);
static ngx_int_t msv_redis_conf(msv_redis_ctx_t *ctx,
    ngx_http_maskserve_redis_conf_t *rcf, ngx_cycle_t *cycle);
static ngx_str_t *msv_redis_strdup(ngx_str_t *dst, u_char *src, size_t len,
    ngx_log_t *log);
static void msv_redis_plain_cb(redisAsyncContext *ac, void *r,
    void *privdata);
static void msv_redis_get_cb(redisAsyncContext *ac, void *r,
    void *privdata);
static void msv_redis_get_local_handler(ngx_event_t *ev);
static ngx_int_t msv_redis_reply_record(redisReply *reply,
    ngx_http_maskserve_redis_record_t *rec, ngx_log_t *log);




/*
 * Per-process state, created in init_process of a worker process.  It is
 * never shared: each nginx worker has its own links and map.
 */
msv_redis_ctx_t  *msv_redis;
void  (*msv_redis_abort_handler)(ngx_str_t *id);



/* ------------------------------------------------------------------ */
/* Life cycle                                                           */

ngx_int_t
ngx_http_maskserve_redis_init_process(ngx_cycle_t *cycle,
    ngx_http_maskserve_redis_conf_t *rcf)
{
    msv_redis_ctx_t  *ctx;

    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return NGX_OK;
    }

    if (rcf == NULL || rcf->host.len == 0 || msv_redis != NULL) {
        return NGX_OK;
    }

    ctx = ngx_calloc(sizeof(msv_redis_ctx_t), cycle->log);
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    ctx->log = cycle->log;

    ctx->buckets = ngx_calloc(MSV_REDIS_BUCKETS * sizeof(msv_redis_entry_t *),
                              cycle->log);
    if (ctx->buckets == NULL) {
        ngx_free(ctx);
        return NGX_ERROR;
    }

    ngx_queue_init(&ctx->active);
    ngx_queue_init(&ctx->finished);

    if (msv_redis_conf(ctx, rcf, cycle) != NGX_OK) {
        msv_redis_ctx_free(ctx);
        return NGX_ERROR;
    }

    msv_redis_link_init(&ctx->cmd, "command", 0, ctx->log);
    msv_redis_link_init(&ctx->sub, "subscriber", 1, ctx->log);

    ctx->flush.handler = msv_redis_flush_handler;
    ctx->flush.data = ctx;
    ctx->flush.log = ctx->log;

    msv_redis = ctx;

    msv_redis_link_connect(&ctx->cmd);
    msv_redis_link_connect(&ctx->sub);

    return NGX_OK;
}


void
ngx_http_maskserve_redis_exit_process(ngx_cycle_t *cycle)
{
    ngx_uint_t          i;
    ngx_queue_t        *q, *queues[2];
    msv_redis_ctx_t    *ctx;
    msv_redis_entry_t  *e;

    ctx = msv_redis;
    if (ctx == NULL) {
        return;
    }

    ctx->exiting = 1;

    if (ctx->flush.posted) {
        ngx_delete_posted_event(&ctx->flush);
    }

    /* hand what is already queued to the kernel before closing */
    msv_redis_exit_flush(&ctx->cmd);

    msv_redis_link_close(&ctx->cmd, "process exiting");
    msv_redis_link_close(&ctx->sub, "process exiting");

    queues[0] = &ctx->active;
    queues[1] = &ctx->finished;

    /* the links are gone, so nothing is in flight any more */
    for (i = 0; i < 2; i++) {
        while (!ngx_queue_empty(queues[i])) {
            q = ngx_queue_head(queues[i]);
            e = ngx_queue_data(q, msv_redis_entry_t, queue);
            msv_redis_entry_unlink(ctx, e);
            ngx_free(e);
        }
    }

    msv_redis = NULL;

    msv_redis_ctx_free(ctx);
}


/* free ctx and what msv_redis_conf allocated (ngx_free(NULL) is harmless) */
static void
msv_redis_ctx_free(msv_redis_ctx_t *ctx)
{
    ngx_free(ctx->password.data);
    ngx_free(ctx->prefix.data);
    ngx_free(ctx->hostname.data);
    ngx_free(ctx->address.data);
    ngx_free(ctx->channel.data);
    ngx_free(ctx->workers.data);
    ngx_free(ctx->buckets);
    ngx_free(ctx);
}


ngx_int_t
ngx_http_maskserve_redis_connected(void)
{
    msv_redis_ctx_t  *ctx;

    ctx = msv_redis;

    if (ctx == NULL) {
        return 0;
    }

    return (ctx->cmd.ready && ctx->sub.ready) ? 1 : 0;
}


void
ngx_http_maskserve_redis_stats(ngx_http_maskserve_redis_stats_t *st)
{
    ngx_uint_t          i;
    ngx_queue_t        *q, *queues[2];
    msv_redis_ctx_t    *ctx;
    msv_redis_entry_t  *e;

    ngx_memzero(st, sizeof(ngx_http_maskserve_redis_stats_t));

    ctx = msv_redis;
    if (ctx == NULL) {
        return;
    }

    st->connected = ngx_http_maskserve_redis_connected();
    st->tracked = ctx->nentries;
    st->dropped = ctx->dropped;
    st->reconnects = (ctx->cmd.readies > 0 ? ctx->cmd.readies - 1 : 0)
                     + (ctx->sub.readies > 0 ? ctx->sub.readies - 1 : 0);

    queues[0] = &ctx->active;
    queues[1] = &ctx->finished;

    for (i = 0; i < 2; i++) {
        for (q = ngx_queue_head(queues[i]);
             q != ngx_queue_sentinel(queues[i]);
             q = ngx_queue_next(q))
        {
            e = ngx_queue_data(q, msv_redis_entry_t, queue);
            st->unsynced += (e->dirty || e->inflight) ? 1 : 0;
        }
    }
}


static ngx_int_t
msv_redis_conf(msv_redis_ctx_t *ctx, ngx_http_maskserve_redis_conf_t *rcf,
    ngx_cycle_t *cycle)
{
    u_char     *p;
    ngx_str_t   prefix, hostname;

    if (rcf->host.len > MSV_REDIS_HOST_MAX) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                      "maskserve redis: host \"%V\" is longer than %d bytes",
                      &rcf->host, MSV_REDIS_HOST_MAX);
        return NGX_ERROR;
    }

    if (ngx_strlchr(rcf->host.data, rcf->host.data + rcf->host.len, '\0')
        != NULL)
    {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                      "maskserve redis: host contains a NUL byte");
        return NGX_ERROR;
    }

    ngx_memcpy(ctx->host, rcf->host.data, rcf->host.len);
    ctx->host[rcf->host.len] = '\0';

    if (rcf->host.len > 5 && ngx_strncmp(ctx->host, "unix:", 5) == 0) {
        ctx->unix_socket = 1;

    } else if (rcf->port < 1 || rcf->port > 65535) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                      "maskserve redis: port %i is out of range 1..65535",
                      rcf->port);
        return NGX_ERROR;
    }

    ctx->port = (int) rcf->port;

    if (!ctx->unix_socket) {
        if (rcf->addr.len == 0 || rcf->addr.len >= sizeof(ctx->addr)) {
            ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                          "maskserve redis: host \"%s\" was not resolved",
                          ctx->host);
            return NGX_ERROR;
        }

        ngx_memcpy(ctx->addr, rcf->addr.data, rcf->addr.len);
        ctx->addr[rcf->addr.len] = '\0';
    }

    if (ctx->unix_socket) {
        ngx_cpystrn((u_char *) ctx->peer, (u_char *) ctx->host,
                    sizeof(ctx->peer));

    } else {
        *ngx_snprintf((u_char *) ctx->peer, sizeof(ctx->peer) - 1, "%s:%d",
                      ctx->host, ctx->port) = '\0';
    }

    if (rcf->db < 0 || rcf->db > 0x7fffffff) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                      "maskserve redis: db %i is invalid", rcf->db);
        return NGX_ERROR;
    }

    ctx->db = rcf->db;
    ctx->req_ttl = rcf->req_ttl;

    prefix = rcf->prefix;
    if (prefix.len == 0) {
        ngx_str_set(&prefix, "msv");
    }

    if (prefix.len > MSV_REDIS_PREFIX_MAX) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                      "maskserve redis: prefix \"%V\" is longer than %d "
                      "bytes", &prefix, MSV_REDIS_PREFIX_MAX);
        return NGX_ERROR;
    }

    hostname = rcf->hostname;
    if (hostname.len == 0) {
        hostname = cycle->hostname;
    }

    if (hostname.len == 0 || hostname.len > MSV_REDIS_HOST_MAX) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                      "maskserve redis: hostname \"%V\" must be 1..%d bytes",
                      &hostname, MSV_REDIS_HOST_MAX);
        return NGX_ERROR;
    }

    if (msv_redis_strdup(&ctx->password, rcf->password.data,
                         rcf->password.len, cycle->log) == NULL
        || msv_redis_strdup(&ctx->prefix, prefix.data, prefix.len,
                            cycle->log) == NULL
        || msv_redis_strdup(&ctx->hostname, hostname.data, hostname.len,
                            cycle->log) == NULL
        || msv_redis_strdup(&ctx->address, rcf->address.data,
                            rcf->address.len, cycle->log) == NULL
        || msv_redis_strdup(&ctx->channel, NULL, prefix.len + 6,
                            cycle->log) == NULL
        || msv_redis_strdup(&ctx->workers, NULL, prefix.len + 8,
                            cycle->log) == NULL)
    {
        return NGX_ERROR;
    }

    p = ngx_cpymem(ctx->channel.data, prefix.data, prefix.len);
    ngx_memcpy(p, ":abort", 6);

    p = ngx_cpymem(ctx->workers.data, prefix.data, prefix.len);
    ngx_memcpy(p, ":workers", 8);

    return NGX_OK;
}


/* dst = copy of src (len bytes, or uninitialized when src is NULL) */
static ngx_str_t *
msv_redis_strdup(ngx_str_t *dst, u_char *src, size_t len, ngx_log_t *log)
{
    dst->data = ngx_alloc(len + 1, log);
    if (dst->data == NULL) {
        dst->len = 0;
        return NULL;
    }

    if (src != NULL) {
        ngx_memcpy(dst->data, src, len);
    }

    dst->data[len] = '\0';
    dst->len = len;

    return dst;
}


/*
 * Resolved here, at configuration time (in the master, as nginx resolves
 * proxy_pass), so that neither a worker process's start nor a reconnect
 * ever waits on DNS.
 */
char *
ngx_http_maskserve_redis_resolve(ngx_conf_t *cf,
    ngx_http_maskserve_redis_conf_t *rcf)
{
    int               rc;
    u_char           *host;
    struct addrinfo   hints, *res, *ai;
    char              addr[NI_MAXHOST];

    if (rcf->host.len > 5 && ngx_strncmp(rcf->host.data, "unix:", 5) == 0) {
        return NGX_CONF_OK;
    }

    host = ngx_pnalloc(cf->pool, rcf->host.len + 1);
    if (host == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_cpystrn(host, rcf->host.data, rcf->host.len + 1);

    ngx_memzero(&hints, sizeof(struct addrinfo));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;

    rc = getaddrinfo((char *) host, NULL, &hints, &res);
    if (rc != 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "maskserve_redis: host \"%s\" not found: %s",
                           host, gai_strerror(rc));
        return NGX_CONF_ERROR;
    }

    /* "localhost" often lists ::1 first; Redis binds 127.0.0.1 by default */
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET) {
            break;
        }
    }

    if (ai == NULL) {
        ai = res;
    }

    rc = getnameinfo(ai->ai_addr, ai->ai_addrlen, addr, sizeof(addr), NULL, 0,
                     NI_NUMERICHOST);
    freeaddrinfo(res);

    if (rc != 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "maskserve_redis: host \"%s\": getnameinfo() "
                           "failed: %s", host, gai_strerror(rc));
        return NGX_CONF_ERROR;
    }

    rcf->addr.len = ngx_strlen(addr);
    rcf->addr.data = ngx_pnalloc(cf->pool, rcf->addr.len + 1);
    if (rcf->addr.data == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_cpystrn(rcf->addr.data, (u_char *) addr, rcf->addr.len + 1);

    return NGX_CONF_OK;
}



/* replies nobody waits for (PUBLISH); privdata: the command's name */
static void
msv_redis_plain_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply       *reply = r;
    msv_redis_ctx_t  *ctx;

    ctx = msv_redis;

    msv_redis_link_replied(&ctx->cmd, reply);

    if (reply != NULL && reply->type == REDIS_REPLY_ERROR) {
        msv_redis_reply_error(ctx, (char *) privdata, NULL, reply);
    }
}


static void
msv_redis_get_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    void                             *data;
    ngx_int_t                         rc;
    redisReply                       *reply = r;
    ngx_http_maskserve_redis_record_t   rec;
    msv_redis_get_t                  *h = privdata;
    msv_redis_ctx_t                  *ctx;
    ngx_http_maskserve_redis_get_pt   cb;

    ctx = msv_redis;

    msv_redis_link_replied(&ctx->cmd, reply);

    cb = h->cb;
    data = h->data;

    if (cb != NULL && ctx->exiting) {
        /*
         * The process is exiting: its requests are not finalized any more,
         * but one may still call cancel with this handle.  Keep it.
         */
        h->done = 1;
        return;
    }

    ngx_free(h);

    if (cb == NULL) {
        return;
    }

    rec.fields = NULL;

    if (reply == NULL) {
        rc = NGX_ERROR;

    } else if (reply->type == REDIS_REPLY_ERROR) {
        msv_redis_reply_error(ctx, "HGETALL", NULL, reply);
        rc = NGX_ERROR;

    } else if (reply->type != REDIS_REPLY_ARRAY) {
        ngx_log_error(NGX_LOG_ERR, ctx->log, 0,
                      "maskserve redis: HGETALL: unexpected reply type %d",
                      reply->type);
        rc = NGX_ERROR;

    } else if (reply->elements == 0) {
        rc = NGX_DECLINED;

    } else {
        rc = msv_redis_reply_record(reply, &rec, ctx->log);
    }

    cb(data, rc, rc == NGX_OK ? &rec : NULL);

    if (rec.fields != NULL) {
        ngx_free(rec.fields);
    }
}


static void
msv_redis_get_local_handler(ngx_event_t *ev)
{
    void                             *data;
    msv_redis_get_t                  *h;
    ngx_http_maskserve_redis_get_pt   cb;

    h = ev->data;

    cb = h->cb;
    data = h->data;
    ngx_free(h);

    if (cb != NULL) {
        cb(data, NGX_ERROR, NULL);
    }
}


/*
 * Error replies (WRONGTYPE, OOM, MISCONF, ...) can come for every command
 * while Redis is unhealthy: log one per second and count the rest.
 */
void
msv_redis_reply_error(msv_redis_ctx_t *ctx, const char *what,
    ngx_str_t *name, redisReply *reply)
{
    ngx_str_t  none = ngx_null_string;

    if (ctx->err_time == ngx_time()) {
        ctx->err_quiet++;
        return;
    }

    if (ctx->err_quiet) {
        ngx_log_error(NGX_LOG_ERR, ctx->log, 0,
                      "maskserve redis: %ui more error replies not logged",
                      ctx->err_quiet);
    }

    ngx_log_error(NGX_LOG_ERR, ctx->log, 0,
                  "maskserve redis: %s%s%V%s failed: %*s",
                  what, name ? " \"" : "", name ? name : &none,
                  name ? "\"" : "", (size_t) reply->len, reply->str);

    ctx->err_time = ngx_time();
    ctx->err_quiet = 0;
}


/* ------------------------------------------------------------------ */
/* Public commands                                                      */

void
ngx_http_maskserve_redis_set_abort_handler(void (*h)(ngx_str_t *id))
{
    msv_redis_abort_handler = h;
}


void
ngx_http_maskserve_redis_publish_abort(ngx_str_t *id)
{
    msv_redis_cmd_t   cmd;
    msv_redis_ctx_t  *ctx;

    ctx = msv_redis;

    if (ctx == NULL) {
        return;
    }

    if (msv_redis_check_len(ctx, id, MSV_REQ_ID_MAX, "abort: id")
        != NGX_OK)
    {
        return;
    }

    if (!ctx->cmd.ready) {
        ngx_log_error(NGX_LOG_WARN, ctx->log, 0,
                      "maskserve redis: down, abort of \"%V\" not published",
                      id);
        return;
    }

    msv_redis_cmd_init(&cmd);
    msv_redis_arg_cstr(&cmd, "PUBLISH");
    msv_redis_arg(&cmd, ctx->channel.data, ctx->channel.len);
    msv_redis_arg(&cmd, id->data, id->len);

    if (msv_redis_link_send(&ctx->cmd, msv_redis_plain_cb, (void *) "PUBLISH",
                            &cmd)
        != NGX_OK)
    {
        ngx_log_error(NGX_LOG_WARN, ctx->log, 0,
                      "maskserve redis: abort of \"%V\" not published", id);
    }
}


void *
ngx_http_maskserve_redis_req_get(ngx_str_t *id,
    ngx_http_maskserve_redis_get_pt cb, void *data)
{
    ngx_log_t        *log;
    msv_redis_cmd_t   cmd;
    msv_redis_get_t  *h;
    msv_redis_ctx_t  *ctx;

    ctx = msv_redis;
    log = ctx ? ctx->log : ngx_cycle->log;

    h = ngx_calloc(sizeof(msv_redis_get_t), log);
    if (h == NULL) {
        return NULL;
    }

    h->cb = cb;
    h->data = data;

    if (ctx != NULL && ctx->cmd.ready && id->len > 0
        && id->len <= MSV_REQ_ID_MAX)
    {
        msv_redis_cmd_init(&cmd);
        msv_redis_arg_cstr(&cmd, "HGETALL");
        msv_redis_arg_fmt(&cmd, "%V:req:%V", &ctx->prefix, id);

        if (msv_redis_link_send(&ctx->cmd, msv_redis_get_cb, h, &cmd)
            == NGX_OK)
        {
            return h;
        }
    }

    /* answer NGX_ERROR from the event loop, not from inside this call */
    h->local = 1;
    h->ev.handler = msv_redis_get_local_handler;
    h->ev.data = h;
    h->ev.log = log;

    ngx_post_event(&h->ev, &ngx_posted_events);

    return h;
}


void
ngx_http_maskserve_redis_cancel(void *handle)
{
    msv_redis_get_t  *h = handle;

    if (h == NULL) {
        return;
    }

    if (h->local || h->done) {
        if (h->ev.posted) {
            ngx_delete_posted_event(&h->ev);
        }

        ngx_free(h);
        return;
    }

    /* the reply callback frees it */
    h->cb = NULL;
    h->data = NULL;
}


/* NGX_OK when s is 1..max bytes; otherwise logs "<what> must be ..." */
ngx_int_t
msv_redis_check_len(msv_redis_ctx_t *ctx, ngx_str_t *s, size_t max,
    const char *what)
{
    if (s->len == 0 || s->len > max) {
        ngx_log_error(NGX_LOG_ERR, ctx->log, 0,
                      "maskserve redis: %s must be 1..%uz bytes", what, max);
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* HGETALL's array of field, value, field, value ... as a record */
static ngx_int_t
msv_redis_reply_record(redisReply *reply,
    ngx_http_maskserve_redis_record_t *rec, ngx_log_t *log)
{
    size_t         i;
    ngx_uint_t     st;
    ngx_keyval_t  *kv;

    static ngx_str_t  states[] = {
        ngx_string("admitted"),
        ngx_string("running"),
        ngx_string("finished"),
        ngx_string("aborted")
    };

    if (reply->elements % 2) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "maskserve redis: HGETALL: odd number of elements");
        return NGX_ERROR;
    }

    for (i = 0; i < reply->elements; i++) {
        if (reply->element[i]->type != REDIS_REPLY_STRING) {
            ngx_log_error(NGX_LOG_ERR, log, 0,
                          "maskserve redis: HGETALL: element %uz is not a "
                          "string", i);
            return NGX_ERROR;
        }
    }

    rec->nfields = reply->elements / 2;
    rec->state = NGX_HTTP_MASKSERVE_REQ_UNKNOWN;

    rec->fields = ngx_alloc(rec->nfields * sizeof(ngx_keyval_t), log);
    if (rec->fields == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < rec->nfields; i++) {
        kv = &rec->fields[i];
        kv->key.data = (u_char *) reply->element[2 * i]->str;
        kv->key.len = reply->element[2 * i]->len;
        kv->value.data = (u_char *) reply->element[2 * i + 1]->str;
        kv->value.len = reply->element[2 * i + 1]->len;

        if (kv->key.len != 5 || ngx_strncmp(kv->key.data, "state", 5) != 0) {
            continue;
        }

        for (st = 0; st < NGX_HTTP_MASKSERVE_REQ_UNKNOWN; st++) {
            if (kv->value.len == states[st].len
                && ngx_strncmp(kv->value.data, states[st].data,
                               states[st].len) == 0)
            {
                rec->state = st;
                break;
            }
        }
    }

    return NGX_OK;
}
