/*
 * ngx_http_maskserve_redis_store.c: request metadata and the worker
 * registry, and the backlog that writes them.
 *
 * Request metadata goes through a bounded per-process map: req_update
 * records the latest state of a request id and writes it when the command
 * link is ready; entries stay until their last state is written, so
 * whatever happened while Redis was away is written again when it comes
 * back.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include <hiredis/hiredis.h>
#include <hiredis/async.h>

#include "ngx_http_maskserve_redis.h"
#include "ngx_http_maskserve_redis_ctx.h"
#include "ngx_http_maskserve_redis_store.h"
#include "ngx_http_maskserve_redis_cmd.h"


static void msv_redis_entry_cb(redisAsyncContext *ac, void *r,
    void *privdata);
static void msv_redis_worker_cb(redisAsyncContext *ac, void *r,
    void *privdata);
static ngx_uint_t msv_redis_can_send(msv_redis_ctx_t *ctx);
static ngx_int_t msv_redis_entry_send(msv_redis_ctx_t *ctx,
    msv_redis_entry_t *e);
static ngx_int_t msv_redis_worker_send(msv_redis_ctx_t *ctx,
    msv_redis_worker_t *w);
static ngx_int_t msv_redis_worker_send_remove(msv_redis_ctx_t *ctx,
    msv_redis_worker_t *w);
static msv_redis_worker_t *msv_redis_worker_find(msv_redis_ctx_t *ctx,
    ngx_str_t *region);
static msv_redis_entry_t *msv_redis_entry_find(msv_redis_ctx_t *ctx,
    ngx_str_t *id, ngx_uint_t hash);
static msv_redis_entry_t *msv_redis_entry_new(msv_redis_ctx_t *ctx,
    ngx_str_t *id, ngx_uint_t hash, size_t region_len);
static void msv_redis_entry_release(msv_redis_ctx_t *ctx,
    msv_redis_entry_t *e);
static ngx_int_t msv_redis_evict(msv_redis_ctx_t *ctx);
static uint64_t msv_redis_now_ms(void);


/* the "state" field, by ngx_http_maskserve_req_state_e */
static ngx_str_t  msv_redis_states[] = {
    ngx_string("admitted"),
    ngx_string("running"),
    ngx_string("finished"),
    ngx_string("aborted")
};



static void
msv_redis_entry_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply         *reply = r;
    msv_redis_ctx_t    *ctx;
    msv_redis_entry_t  *e = privdata;

    ctx = msv_redis;

    msv_redis_link_replied(&ctx->cmd, reply);

    if (e->inflight > 0) {
        e->inflight--;
    }

    if (reply == NULL) {
        /* the link went down first: write it again when it comes back */
        e->dirty = 1;

    } else if (reply->type == REDIS_REPLY_ERROR) {
        msv_redis_reply_error(ctx, "writing request", &e->id, reply);
    }

    if (e->inflight > 0) {
        return;
    }

    if (e->orphan) {
        ngx_free(e);
        return;
    }

    if (e->finished && !e->dirty && !ctx->exiting) {
        msv_redis_entry_unlink(ctx, e);
        ngx_free(e);
    }
}


static void
msv_redis_worker_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    ngx_str_t            region;
    redisReply          *reply = r;
    msv_redis_ctx_t     *ctx;
    msv_redis_worker_t  *w = privdata;

    ctx = msv_redis;

    msv_redis_link_replied(&ctx->cmd, reply);

    if (reply == NULL) {
        w->dirty = 1;

    } else if (reply->type == REDIS_REPLY_ERROR) {
        region.data = w->region;
        region.len = w->region_len;
        msv_redis_reply_error(ctx, "writing worker", &region, reply);
    }
}



void
ngx_http_maskserve_redis_worker_update(ngx_str_t *region,
    ngx_uint_t capacity, ngx_uint_t load, uint64_t generation,
    ngx_int_t alive, ngx_uint_t draining)
{
    msv_redis_ctx_t     *ctx;
    msv_redis_worker_t  *w;

    ctx = msv_redis;

    if (ctx == NULL) {
        return;
    }

    if (msv_redis_check_len(ctx, region, MSV_NAME_MAX, "worker region")
        != NGX_OK)
    {
        return;
    }

    w = msv_redis_worker_find(ctx, region);

    if (w == NULL) {
        if (ctx->nwk == MSV_REDIS_MAX_WORKERS) {
            ngx_log_error(NGX_LOG_ERR, ctx->log, 0,
                          "maskserve redis: more than %d worker regions, "
                          "\"%V\" not registered", MSV_REDIS_MAX_WORKERS,
                          region);
            return;
        }

        w = &ctx->wk[ctx->nwk++];
        ngx_memcpy(w->region, region->data, region->len);
        w->region_len = region->len;
    }

    w->capacity = capacity;
    w->load = load;
    w->generation = generation;
    w->alive = alive ? 1 : 0;
    w->draining = draining ? 1 : 0;
    w->removed = 0;
    w->heartbeat = msv_redis_now_ms();
    w->dirty = 1;

    if (msv_redis_can_send(ctx)) {
        (void) msv_redis_worker_send(ctx, w);
    }
}


void
ngx_http_maskserve_redis_worker_remove(ngx_str_t *region)
{
    msv_redis_ctx_t     *ctx;
    msv_redis_worker_t  *w;

    ctx = msv_redis;

    if (ctx == NULL || region->len > MSV_NAME_MAX) {
        return;
    }

    w = msv_redis_worker_find(ctx, region);

    if (w == NULL || w->removed) {
        return;                 /* never written: nothing to take back */
    }

    w->removed = 1;
    w->alive = 0;
    w->heartbeat = msv_redis_now_ms();
    w->dirty = 1;

    if (msv_redis_can_send(ctx)) {
        (void) msv_redis_worker_send_remove(ctx, w);
    }
}


static msv_redis_worker_t *
msv_redis_worker_find(msv_redis_ctx_t *ctx, ngx_str_t *region)
{
    ngx_uint_t  i;

    for (i = 0; i < ctx->nwk; i++) {
        if (ctx->wk[i].region_len == region->len
            && ngx_memcmp(ctx->wk[i].region, region->data, region->len) == 0)
        {
            return &ctx->wk[i];
        }
    }

    return NULL;
}


void
ngx_http_maskserve_redis_req_update(ngx_str_t *id, ngx_str_t *region,
    ngx_uint_t slot, uint64_t cookie, ngx_http_maskserve_req_state_e state,
    ngx_uint_t prompt_tokens, ngx_uint_t completion_tokens,
    const char *finish)
{
    size_t              flen;
    uint64_t            now;
    ngx_uint_t          hash, finished;
    msv_redis_ctx_t    *ctx;
    msv_redis_entry_t  *e;

    ctx = msv_redis;

    if (ctx == NULL) {
        return;
    }

    if (msv_redis_check_len(ctx, id, MSV_REQ_ID_MAX, "request id")
        != NGX_OK)
    {
        return;
    }

    if (region->len > MSV_NAME_MAX) {
        ngx_log_error(NGX_LOG_ERR, ctx->log, 0,
                      "maskserve redis: request \"%V\": region longer "
                      "than %d bytes", id, MSV_NAME_MAX);
        return;
    }

    if ((ngx_uint_t) state >= NGX_HTTP_MASKSERVE_REQ_UNKNOWN) {
        ngx_log_error(NGX_LOG_ALERT, ctx->log, 0,
                      "maskserve redis: request \"%V\": state %d",
                      id, (int) state);
        return;
    }

    flen = finish ? ngx_strlen(finish) : 0;

    if (flen > MSV_REDIS_FINISH_MAX) {
        ngx_log_error(NGX_LOG_ERR, ctx->log, 0,
                      "maskserve redis: request \"%V\": finish reason "
                      "longer than %d bytes", id, MSV_REDIS_FINISH_MAX);
        return;
    }

    now = msv_redis_now_ms();
    hash = ngx_hash_key(id->data, id->len);
    finished = (state >= NGX_HTTP_MASKSERVE_REQ_FINISHED);

    e = msv_redis_entry_find(ctx, id, hash);

    if (e == NULL) {
        e = msv_redis_entry_new(ctx, id, hash, region->len);
        if (e == NULL) {
            ctx->dropped++;
            return;
        }

        e->t_admit = now;

    } else if (region->len > e->region_room) {
        ngx_log_error(NGX_LOG_ERR, ctx->log, 0,
                      "maskserve redis: request \"%V\" moved to region "
                      "\"%V\", keeping \"%V\"", id, region, &e->region);
        region = &e->region;
    }

    if (region != &e->region) {
        ngx_memcpy(e->region.data, region->data, region->len);
        e->region.len = region->len;
    }

    e->slot = slot;
    e->cookie = cookie;
    e->state = state;
    e->prompt_tokens = prompt_tokens;
    e->completion_tokens = completion_tokens;
    e->t_update = now;
    ngx_memcpy(e->finish, finish ? finish : "", flen);
    e->finish[flen] = '\0';
    e->dirty = 1;

    if (finished != e->finished) {
        /* keep each queue in order of the last move into it */
        ngx_queue_remove(&e->queue);
        ngx_queue_insert_tail(finished ? &ctx->finished : &ctx->active,
                              &e->queue);
        e->finished = finished ? 1 : 0;
    }

    if (msv_redis_can_send(ctx)) {
        (void) msv_redis_entry_send(ctx, e);
    }
}



/* ------------------------------------------------------------------ */
/* Writing the backlog                                                  */

static ngx_uint_t
msv_redis_can_send(msv_redis_ctx_t *ctx)
{
    if (!ctx->cmd.ready || ctx->cmd.closing || ctx->exiting) {
        return 0;
    }

    if (ctx->throttled) {
        return 0;
    }

    if (ctx->cmd.pending >= MSV_REDIS_HIGH_PENDING) {
        /* Redis answers slower than we write: hold updates in the map */
        ctx->throttled = 1;
        ngx_log_error(NGX_LOG_WARN, ctx->log, 0,
                      "maskserve redis: %ui replies outstanding, holding "
                      "updates", ctx->cmd.pending);
        return 0;
    }

    return 1;
}


/* the command link is (again) ready: everything known is written again */
void
msv_redis_resync(msv_redis_ctx_t *ctx)
{
    ngx_uint_t          i;
    ngx_queue_t        *q, *queues[2];
    msv_redis_entry_t  *e;

    queues[0] = &ctx->active;
    queues[1] = &ctx->finished;

    for (i = 0; i < 2; i++) {
        for (q = ngx_queue_head(queues[i]);
             q != ngx_queue_sentinel(queues[i]);
             q = ngx_queue_next(q))
        {
            e = ngx_queue_data(q, msv_redis_entry_t, queue);
            e->dirty = 1;
        }
    }

    for (i = 0; i < ctx->nwk; i++) {
        ctx->wk[i].dirty = 1;
    }

    if (!ctx->flush.posted) {
        ngx_post_event(&ctx->flush, &ngx_posted_events);
    }
}


void
msv_redis_flush_handler(ngx_event_t *ev)
{
    uint64_t            now;
    ngx_uint_t          i, n;
    ngx_queue_t        *q, *next;
    msv_redis_ctx_t    *ctx;
    msv_redis_entry_t  *e;
    ngx_queue_t        *queues[2];

    ctx = ev->data;
    n = 0;

    queues[0] = &ctx->finished;
    queues[1] = &ctx->active;

    for (i = 0; i < 2; i++) {
        for (q = ngx_queue_head(queues[i]);
             q != ngx_queue_sentinel(queues[i]);
             q = next)
        {
            next = ngx_queue_next(q);
            e = ngx_queue_data(q, msv_redis_entry_t, queue);

            if (!e->dirty) {
                continue;
            }

            if (!msv_redis_can_send(ctx)) {
                goto done;
            }

            if (msv_redis_entry_send(ctx, e) == NGX_OK) {
                n++;
            }
        }
    }

    now = msv_redis_now_ms();

    for (i = 0; i < ctx->nwk; i++) {
        if (!ctx->wk[i].dirty) {
            continue;
        }

        if (now - ctx->wk[i].heartbeat >= MSV_REDIS_WORKER_TTL) {
            /* too old to announce: its key would claim a live worker */
            ctx->wk[i].dirty = 0;
            continue;
        }

        if (!msv_redis_can_send(ctx)) {
            goto done;
        }

        if (ctx->wk[i].removed) {
            (void) msv_redis_worker_send_remove(ctx, &ctx->wk[i]);

        } else {
            (void) msv_redis_worker_send(ctx, &ctx->wk[i]);
        }
    }

done:

    if (n > 0) {
        ngx_log_error(NGX_LOG_NOTICE, ctx->log, 0,
                      "maskserve redis: wrote %ui request records again", n);
    }
}


static ngx_int_t
msv_redis_entry_send(msv_redis_ctx_t *ctx, msv_redis_entry_t *e)
{
    ngx_int_t        rc;
    msv_redis_cmd_t  cmd;

    msv_redis_cmd_init(&cmd);
    msv_redis_arg_cstr(&cmd, "HSET");
    msv_redis_arg_fmt(&cmd, "%V:req:%V", &ctx->prefix, &e->id);
    msv_redis_arg_cstr(&cmd, "host");
    msv_redis_arg(&cmd, ctx->hostname.data, ctx->hostname.len);
    msv_redis_arg_cstr(&cmd, "pid");
    msv_redis_arg_uint(&cmd, (uint64_t) ngx_pid);
    msv_redis_arg_cstr(&cmd, "region");
    msv_redis_arg(&cmd, e->region.data, e->region.len);
    msv_redis_arg_cstr(&cmd, "slot");
    msv_redis_arg_uint(&cmd, e->slot);
    msv_redis_arg_cstr(&cmd, "cookie");
    msv_redis_arg_uint(&cmd, e->cookie);
    msv_redis_arg_cstr(&cmd, "state");
    msv_redis_arg(&cmd, msv_redis_states[e->state].data,
                  msv_redis_states[e->state].len);
    msv_redis_arg_cstr(&cmd, "prompt_tokens");
    msv_redis_arg_uint(&cmd, e->prompt_tokens);
    msv_redis_arg_cstr(&cmd, "completion_tokens");
    msv_redis_arg_uint(&cmd, e->completion_tokens);
    msv_redis_arg_cstr(&cmd, "finish_reason");
    msv_redis_arg_cstr(&cmd, (char *) e->finish);
    msv_redis_arg_cstr(&cmd, "t_admit");
    msv_redis_arg_uint(&cmd, e->t_admit);
    msv_redis_arg_cstr(&cmd, "t_update");
    msv_redis_arg_uint(&cmd, e->t_update);

    rc = msv_redis_link_send(&ctx->cmd, msv_redis_entry_cb, e, &cmd);
    if (rc != NGX_OK) {
        return rc;
    }

    e->inflight++;
    e->dirty = 0;

    if (ctx->req_ttl == 0) {
        return NGX_OK;
    }

    /* argv[1] (the key) stays valid: cmd is still in scope */
    msv_redis_cmd_pexpire(&cmd, ctx->req_ttl);

    rc = msv_redis_link_send(&ctx->cmd, msv_redis_entry_cb, e, &cmd);
    if (rc != NGX_OK) {
        e->dirty = 1;
        return rc;
    }

    e->inflight++;

    return NGX_OK;
}


static ngx_int_t
msv_redis_worker_send(msv_redis_ctx_t *ctx, msv_redis_worker_t *w)
{
    ngx_str_t        region;
    msv_redis_cmd_t  cmd;

    region.data = w->region;
    region.len = w->region_len;

    msv_redis_cmd_init(&cmd);
    msv_redis_arg_cstr(&cmd, "HSET");
    msv_redis_arg_fmt(&cmd, "%V:worker:%V:%V", &ctx->prefix, &ctx->hostname,
                      &region);
    msv_redis_arg_cstr(&cmd, "host");
    msv_redis_arg(&cmd, ctx->hostname.data, ctx->hostname.len);
    msv_redis_arg_cstr(&cmd, "region");
    msv_redis_arg(&cmd, region.data, region.len);
    msv_redis_arg_cstr(&cmd, "capacity");
    msv_redis_arg_uint(&cmd, w->capacity);
    msv_redis_arg_cstr(&cmd, "load");
    msv_redis_arg_uint(&cmd, w->load);
    msv_redis_arg_cstr(&cmd, "generation");
    msv_redis_arg_uint(&cmd, w->generation);
    msv_redis_arg_cstr(&cmd, "alive");
    msv_redis_arg_uint(&cmd, (uint64_t) w->alive);
    msv_redis_arg_cstr(&cmd, "draining");
    msv_redis_arg_uint(&cmd, (uint64_t) w->draining);
    msv_redis_arg_cstr(&cmd, "heartbeat");
    msv_redis_arg_uint(&cmd, w->heartbeat);

    /* where a front (maskserve_fleet) proxies this host's requests */
    if (ctx->address.len) {
        msv_redis_arg_cstr(&cmd, "addr");
        msv_redis_arg(&cmd, ctx->address.data, ctx->address.len);
    }

    if (msv_redis_link_send(&ctx->cmd, msv_redis_worker_cb, w, &cmd)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    w->dirty = 0;

    msv_redis_cmd_pexpire(&cmd, MSV_REDIS_WORKER_TTL);

    if (msv_redis_link_send(&ctx->cmd, msv_redis_worker_cb, w, &cmd)
        != NGX_OK)
    {
        w->dirty = 1;
        return NGX_ERROR;
    }

    msv_redis_cmd_init(&cmd);
    msv_redis_arg_cstr(&cmd, "SADD");
    msv_redis_arg(&cmd, ctx->workers.data, ctx->workers.len);
    msv_redis_arg_fmt(&cmd, "%V:%V", &ctx->hostname, &region);

    if (msv_redis_link_send(&ctx->cmd, msv_redis_worker_cb, w, &cmd)
        != NGX_OK)
    {
        w->dirty = 1;
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* the region's worker drained: its key and its member go */
static ngx_int_t
msv_redis_worker_send_remove(msv_redis_ctx_t *ctx, msv_redis_worker_t *w)
{
    ngx_str_t        region;
    msv_redis_cmd_t  cmd;

    region.data = w->region;
    region.len = w->region_len;

    msv_redis_cmd_init(&cmd);
    msv_redis_arg_cstr(&cmd, "DEL");
    msv_redis_arg_fmt(&cmd, "%V:worker:%V:%V", &ctx->prefix, &ctx->hostname,
                      &region);

    if (msv_redis_link_send(&ctx->cmd, msv_redis_worker_cb, w, &cmd)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    w->dirty = 0;

    msv_redis_cmd_init(&cmd);
    msv_redis_arg_cstr(&cmd, "SREM");
    msv_redis_arg(&cmd, ctx->workers.data, ctx->workers.len);
    msv_redis_arg_fmt(&cmd, "%V:%V", &ctx->hostname, &region);

    if (msv_redis_link_send(&ctx->cmd, msv_redis_worker_cb, w, &cmd)
        != NGX_OK)
    {
        w->dirty = 1;
        return NGX_ERROR;
    }

    ngx_log_error(NGX_LOG_NOTICE, ctx->log, 0,
                  "maskserve redis: worker region \"%V\" deregistered "
                  "(drained)", &region);

    return NGX_OK;
}


/* ------------------------------------------------------------------ */
/* The request map                                                      */

static msv_redis_entry_t *
msv_redis_entry_find(msv_redis_ctx_t *ctx, ngx_str_t *id, ngx_uint_t hash)
{
    msv_redis_entry_t  *e;

    for (e = ctx->buckets[hash & (MSV_REDIS_BUCKETS - 1)];
         e != NULL;
         e = e->hnext)
    {
        if (e->hash == hash && e->id.len == id->len
            && ngx_memcmp(e->id.data, id->data, id->len) == 0)
        {
            return e;
        }
    }

    return NULL;
}


static msv_redis_entry_t *
msv_redis_entry_new(msv_redis_ctx_t *ctx, ngx_str_t *id, ngx_uint_t hash,
    size_t region_len)
{
    size_t              room;
    msv_redis_entry_t  *e, **bucket;

    if (ctx->nentries >= MSV_REDIS_MAX_ENTRIES
        && msv_redis_evict(ctx) != NGX_OK)
    {
        return NULL;
    }

    room = ngx_max(region_len, MSV_REDIS_REGION_MIN);

    e = ngx_calloc(sizeof(msv_redis_entry_t) + id->len + room, ctx->log);
    if (e == NULL) {
        return NULL;
    }

    e->hash = hash;
    e->id.data = (u_char *) (e + 1);
    e->id.len = id->len;
    ngx_memcpy(e->id.data, id->data, id->len);
    e->region.data = e->id.data + id->len;
    e->region.len = 0;
    e->region_room = room;

    bucket = &ctx->buckets[hash & (MSV_REDIS_BUCKETS - 1)];
    e->hnext = *bucket;
    *bucket = e;

    ngx_queue_insert_tail(&ctx->active, &e->queue);
    ctx->nentries++;

    return e;
}


/* take e out of the hash and its queue */
void
msv_redis_entry_unlink(msv_redis_ctx_t *ctx, msv_redis_entry_t *e)
{
    msv_redis_entry_t  **pp;

    for (pp = &ctx->buckets[e->hash & (MSV_REDIS_BUCKETS - 1)];
         *pp != NULL;
         pp = &(*pp)->hnext)
    {
        if (*pp == e) {
            *pp = e->hnext;
            break;
        }
    }

    ngx_queue_remove(&e->queue);
    ctx->nentries--;
}


/* unlink e; free it now or, while replies are owed, from the callback */
static void
msv_redis_entry_release(msv_redis_ctx_t *ctx, msv_redis_entry_t *e)
{
    msv_redis_entry_unlink(ctx, e);

    if (e->inflight > 0) {
        e->orphan = 1;
        return;
    }

    ngx_free(e);
}


/*
 * The map is full: drop the oldest finished request, or failing that the
 * oldest active one.  Its latest state is lost if it was not written.
 */
static ngx_int_t
msv_redis_evict(msv_redis_ctx_t *ctx)
{
    ngx_queue_t        *q;
    msv_redis_entry_t  *e;

    if (!ngx_queue_empty(&ctx->finished)) {
        q = ngx_queue_head(&ctx->finished);

    } else if (!ngx_queue_empty(&ctx->active)) {
        q = ngx_queue_head(&ctx->active);

    } else {
        return NGX_ERROR;
    }

    e = ngx_queue_data(q, msv_redis_entry_t, queue);

    if (e->dirty) {
        ctx->dropped++;

        if (ctx->dropped == 1 || ctx->dropped % 1000 == 0) {
            ngx_log_error(NGX_LOG_WARN, ctx->log, 0,
                          "maskserve redis: %d requests tracked, dropping "
                          "unwritten state of \"%V\" (%ui dropped so far)",
                          MSV_REDIS_MAX_ENTRIES, &e->id, ctx->dropped);
        }
    }

    msv_redis_entry_release(ctx, e);

    return NGX_OK;
}


static uint64_t
msv_redis_now_ms(void)
{
    ngx_time_t  *tp;

    tp = ngx_timeofday();

    return (uint64_t) tp->sec * 1000 + tp->msec;
}

