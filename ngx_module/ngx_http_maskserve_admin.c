/*
 * ngx_http_maskserve_admin.c: abort by request id, request status and
 * health.
 *
 * The slot tables of the regions are shared by every nginx worker process
 * on the host, so a request running on this host is found (and
 * cancelled) by scanning them, whichever process serves it.  Requests of
 * other hosts are known through Redis: status reads their key, abort
 * publishes on the abort channel, and the host that runs the request
 * cancels it locally (ngx_http_maskserve_abort_local_id).
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>

#include "msv_shm.h"
#include "msv_region.h"
#include "msv_slots.h"
#include "ngx_http_maskserve_module.h"
#include "ngx_http_maskserve_parse.h"
#include "ngx_http_maskserve_link.h"
#include "ngx_http_maskserve_stream.h"
#include "ngx_http_maskserve_generate.h"
#include "ngx_http_maskserve_admin.h"
#include "ngx_http_maskserve_redis.h"


typedef struct {
    ngx_http_request_t            *r;
    ngx_str_t                      id;
    void                          *handle;   /* pending Redis lookup */
} ngx_http_maskserve_admin_ctx_t;


static void ngx_http_maskserve_abort_body(ngx_http_request_t *r);
static ngx_int_t ngx_http_maskserve_abort_local(
    ngx_http_maskserve_main_conf_t *mcf, ngx_str_t *id);
static void ngx_http_maskserve_abort_redis(void *data, ngx_int_t rc,
    ngx_str_t *json);
static ngx_int_t ngx_http_maskserve_in_flight(ngx_http_request_t *r,
    ngx_str_t *json);
static ngx_int_t ngx_http_maskserve_aborted(ngx_http_request_t *r,
    ngx_str_t *id);
static ngx_int_t ngx_http_maskserve_not_found(ngx_http_request_t *r);
static void ngx_http_maskserve_status_redis(void *data, ngx_int_t rc,
    ngx_str_t *json);
static ngx_int_t ngx_http_maskserve_status_local(ngx_http_request_t *r,
    ngx_str_t *id);
static ngx_int_t ngx_http_maskserve_admin_ctx(ngx_http_request_t *r,
    ngx_str_t *id, ngx_http_maskserve_admin_ctx_t **actxp);
static void ngx_http_maskserve_admin_cleanup(void *data);
static u_char *ngx_http_maskserve_health_region(u_char *p,
    ngx_http_maskserve_region_t *rg);


/* abort */

ngx_int_t
ngx_http_maskserve_abort_handler(ngx_http_request_t *r)
{
    ngx_int_t  rc;

    if (ngx_http_maskserve_check_post(r, &rc) != NGX_OK) {
        return rc;
    }

    rc = ngx_http_read_client_request_body(r, ngx_http_maskserve_abort_body);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    return NGX_DONE;
}


static void
ngx_http_maskserve_abort_body(ngx_http_request_t *r)
{
    ngx_str_t                        id;
    ngx_http_maskserve_err_t         err;
    ngx_http_maskserve_admin_ctx_t  *actx;
    ngx_http_maskserve_main_conf_t  *mcf;

    ngx_memzero(&err, sizeof(ngx_http_maskserve_err_t));

    if (ngx_http_maskserve_parse_abort(r, &id, &err) != NGX_OK) {
        ngx_http_finalize_request(r,
                                  ngx_http_maskserve_send_error(r, &err));
        return;
    }

    mcf = ngx_http_get_module_main_conf(r, ngx_http_maskserve_module);

    if (mcf->running && ngx_http_maskserve_abort_local(mcf, &id) == NGX_OK) {
        ngx_http_finalize_request(r, ngx_http_maskserve_aborted(r, &id));
        return;
    }

    if (!mcf->redis_on || !ngx_http_maskserve_redis_connected()) {
        ngx_http_finalize_request(r, ngx_http_maskserve_not_found(r));
        return;
    }

    /* maybe another host runs it: ask Redis */

    if (ngx_http_maskserve_admin_ctx(r, &id, &actx) != NGX_OK) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    actx->handle = ngx_http_maskserve_redis_req_get(&actx->id,
                                         ngx_http_maskserve_abort_redis, actx);
    if (actx->handle == NULL) {
        ngx_http_finalize_request(r, ngx_http_maskserve_not_found(r));
        return;
    }

    /* the body-reading reference keeps the request until the answer */
}


static void
ngx_http_maskserve_abort_redis(void *data, ngx_int_t rc, ngx_str_t *json)
{
    ngx_http_maskserve_admin_ctx_t  *actx = data;

    ngx_http_request_t  *r;

    r = actx->r;
    actx->handle = NULL;

    if (rc == NGX_OK && ngx_http_maskserve_in_flight(r, json) == NGX_OK) {
        ngx_http_maskserve_redis_publish_abort(&actx->id);
        ngx_http_maskserve_stream_finalize(r,
                                 ngx_http_maskserve_aborted(r, &actx->id));
        return;
    }

    ngx_http_maskserve_stream_finalize(r, ngx_http_maskserve_not_found(r));
}


/* Is the request of this Redis record still generating? */

static ngx_int_t
ngx_http_maskserve_in_flight(ngx_http_request_t *r, ngx_str_t *json)
{
    char         *z, *state;
    ngx_int_t     rc;
    yajl_val      tree, v;
    const char   *path[] = { "state", NULL };

    z = ngx_pnalloc(r->pool, json->len + 1);
    if (z == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(z, json->data, json->len);
    z[json->len] = '\0';

    tree = yajl_tree_parse(z, NULL, 0);
    if (tree == NULL) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "maskserve: unreadable request record from Redis");
        return NGX_ERROR;
    }

    rc = NGX_DECLINED;

    v = yajl_tree_get(tree, path, yajl_t_string);
    if (v) {
        state = YAJL_GET_STRING(v);

        if (ngx_strcmp(state, "admitted") == 0
            || ngx_strcmp(state, "running") == 0)
        {
            rc = NGX_OK;
        }
    }

    yajl_tree_free(tree);

    return rc;
}


static ngx_int_t
ngx_http_maskserve_abort_local(ngx_http_maskserve_main_conf_t *mcf,
    ngx_str_t *id)
{
    uint32_t                      state;
    uint64_t                      cookie;
    ngx_uint_t                    slot;
    ngx_http_maskserve_region_t  *rg;

    if (ngx_http_maskserve_link_find(mcf, id->data, id->len, &rg, &slot,
                                     &cookie, &state)
        != NGX_OK)
    {
        return NGX_DECLINED;
    }

    msv_slot_cancel(rg->att.rg.ctrl, (uint32_t) slot, cookie);
    msv_kick(rg->att.kick_fd);

    ngx_log_error(NGX_LOG_INFO, rg->log, 0,
                  "maskserve: request \"%V\" aborted by id (\"%V\" slot %ui)",
                  id, &rg->name, slot);

    return NGX_OK;
}


void
ngx_http_maskserve_abort_local_id(ngx_str_t *id)
{
    ngx_http_maskserve_main_conf_t  *mcf;

    mcf = ngx_http_maskserve_process_conf();

    if (mcf == NULL || !mcf->running) {
        return;
    }

    (void) ngx_http_maskserve_abort_local(mcf, id);
}


static ngx_int_t
ngx_http_maskserve_aborted(ngx_http_request_t *r, ngx_str_t *id)
{
    ngx_buf_t  *b;

    b = ngx_create_temp_buf(r->pool, id->len + 64);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last = ngx_sprintf(b->last, "{\"request_id\":\"%V\",\"aborted\":true}",
                          id);

    return ngx_http_maskserve_send_json(r, NGX_HTTP_OK, b);
}


static ngx_int_t
ngx_http_maskserve_not_found(ngx_http_request_t *r)
{
    ngx_http_maskserve_err_t  err;

    ngx_http_maskserve_error(&err, NGX_HTTP_NOT_FOUND,
                             NGX_HTTP_MASKSERVE_INVALID, "request_id",
                             "no request with this request_id is in flight");

    return ngx_http_maskserve_send_error(r, &err);
}


/* status */

ngx_int_t
ngx_http_maskserve_status_handler(ngx_http_request_t *r)
{
    u_char                          *p, *last;
    ngx_int_t                        rc;
    ngx_str_t                        id;
    ngx_http_maskserve_err_t         err;
    ngx_http_maskserve_admin_ctx_t  *actx;
    ngx_http_maskserve_main_conf_t  *mcf;

    if (r->method != NGX_HTTP_GET && r->method != NGX_HTTP_HEAD) {
        ngx_http_maskserve_error(&err, NGX_HTTP_NOT_ALLOWED,
                                 NGX_HTTP_MASKSERVE_INVALID, NULL,
                                 "only GET is allowed here");
        rc = ngx_http_discard_request_body(r);
        if (rc != NGX_OK) {
            return rc;
        }

        return ngx_http_maskserve_send_error(r, &err);
    }

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    /* the id is the last segment of the path */
    last = r->uri.data + r->uri.len;
    for (p = last; p > r->uri.data && p[-1] != '/'; p--) { /* void */ }

    id.data = p;
    id.len = last - p;

    if (!ngx_http_maskserve_id_valid(id.data, id.len)) {
        ngx_http_maskserve_error(&err, NGX_HTTP_BAD_REQUEST,
                                 NGX_HTTP_MASKSERVE_INVALID, "request_id",
                                 "the path must end with a request id of 1 "
                                 "to 128 characters of [A-Za-z0-9._:-]");
        return ngx_http_maskserve_send_error(r, &err);
    }

    mcf = ngx_http_get_module_main_conf(r, ngx_http_maskserve_module);

    if (!mcf->redis_on || !ngx_http_maskserve_redis_connected()) {
        return ngx_http_maskserve_status_local(r, &id);
    }

    if (ngx_http_maskserve_admin_ctx(r, &id, &actx) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    actx->handle = ngx_http_maskserve_redis_req_get(&actx->id,
                                        ngx_http_maskserve_status_redis, actx);
    if (actx->handle == NULL) {
        return ngx_http_maskserve_status_local(r, &actx->id);
    }

    r->main->count++;

    return NGX_DONE;
}


static void
ngx_http_maskserve_status_redis(void *data, ngx_int_t rc, ngx_str_t *json)
{
    ngx_http_maskserve_admin_ctx_t  *actx = data;

    ngx_buf_t           *b;
    ngx_http_request_t  *r;

    r = actx->r;
    actx->handle = NULL;

    if (rc != NGX_OK) {
        /* not in Redis (or Redis failed): what this host knows */
        ngx_http_maskserve_stream_finalize(r,
                               ngx_http_maskserve_status_local(r, &actx->id));
        return;
    }

    b = ngx_create_temp_buf(r->pool, actx->id.len + json->len + 64);
    if (b == NULL) {
        ngx_http_maskserve_stream_finalize(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    b->last = ngx_sprintf(b->last, "{\"request_id\":\"%V\",\"source\":"
                          "\"redis\",\"record\":%V}", &actx->id, json);

    ngx_http_maskserve_stream_finalize(r,
                               ngx_http_maskserve_send_json(r, NGX_HTTP_OK, b));
}


static ngx_int_t
ngx_http_maskserve_status_local(ngx_http_request_t *r, ngx_str_t *id)
{
    uint32_t                         state;
    uint64_t                         cookie;
    ngx_buf_t                       *b;
    ngx_uint_t                       slot;
    struct msv_slot                 *s;
    ngx_http_maskserve_region_t     *rg;
    ngx_http_maskserve_main_conf_t  *mcf;

    mcf = ngx_http_get_module_main_conf(r, ngx_http_maskserve_module);

    if (!mcf->running
        || ngx_http_maskserve_link_find(mcf, id->data, id->len, &rg, &slot,
                                        &cookie, &state)
           != NGX_OK)
    {
        return ngx_http_maskserve_not_found(r);
    }

    s = msv_slot_at(rg->att.rg.ctrl, (uint32_t) slot);

    b = ngx_create_temp_buf(r->pool, id->len + rg->name.len + 256);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last = ngx_sprintf(b->last, "{\"request_id\":\"%V\",\"source\":"
                          "\"local\",\"record\":{\"state\":\"%s\","
                          "\"worker\":\"%V\",\"slot\":%ui,"
                          "\"prompt_tokens\":%uD,\"completion_tokens\":%uD}}",
                          id, state == MSV_SLOT_RUNNING ? "running"
                                                        : "admitted",
                          &rg->name, slot, s->n_prompt, s->n_out);

    return ngx_http_maskserve_send_json(r, NGX_HTTP_OK, b);
}


static ngx_int_t
ngx_http_maskserve_admin_ctx(ngx_http_request_t *r, ngx_str_t *id,
    ngx_http_maskserve_admin_ctx_t **actxp)
{
    ngx_http_cleanup_t              *cln;
    ngx_http_maskserve_admin_ctx_t  *actx;

    actx = ngx_pcalloc(r->pool, sizeof(ngx_http_maskserve_admin_ctx_t));
    if (actx == NULL) {
        return NGX_ERROR;
    }

    actx->id.data = ngx_pstrdup(r->pool, id);
    if (actx->id.data == NULL) {
        return NGX_ERROR;
    }

    actx->id.len = id->len;
    actx->r = r;

    cln = ngx_http_cleanup_add(r, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_http_maskserve_admin_cleanup;
    cln->data = actx;

    *actxp = actx;

    return NGX_OK;
}


static void
ngx_http_maskserve_admin_cleanup(void *data)
{
    ngx_http_maskserve_admin_ctx_t  *actx = data;

    if (actx->handle) {
        ngx_http_maskserve_redis_cancel(actx->handle);
        actx->handle = NULL;
    }
}


/* health */

ngx_int_t
ngx_http_maskserve_health_handler(ngx_http_request_t *r)
{
    u_char                            *p;
    size_t                             len;
    ngx_int_t                          rc;
    ngx_buf_t                         *b;
    ngx_uint_t                         i, n, ready;
    const char                        *redis, *status;
    ngx_http_maskserve_err_t           err;
    ngx_http_maskserve_region_t       *rg;
    ngx_http_maskserve_loc_conf_t     *lcf;
    ngx_http_maskserve_main_conf_t    *mcf;
    ngx_http_maskserve_redis_stats_t   st;

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    if (r->method != NGX_HTTP_GET && r->method != NGX_HTTP_HEAD) {
        ngx_http_maskserve_error(&err, NGX_HTTP_NOT_ALLOWED,
                                 NGX_HTTP_MASKSERVE_INVALID, NULL,
                                 "only GET is allowed here");
        return ngx_http_maskserve_send_error(r, &err);
    }

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_maskserve_module);
    mcf = ngx_http_get_module_main_conf(r, ngx_http_maskserve_module);

    n = ngx_http_maskserve_loc_nregions(mcf, lcf);

    len = 512 + n * 2048;

    b = ngx_create_temp_buf(r->pool, len);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ready = 0;

    for (i = 0; i < n; i++) {
        rg = ngx_http_maskserve_loc_region(mcf, lcf, i);

        if (mcf->running && ngx_http_maskserve_link_ready(rg) == NGX_OK) {
            ready++;
        }
    }

    if (!mcf->redis_on) {
        redis = "off";

    } else {
        redis = ngx_http_maskserve_redis_connected() ? "up" : "down";
    }

    /* a configured Redis that is down degrades, never fails, health */
    status = !ready ? "unavailable"
             : (ready < n || redis[0] == 'd') ? "degraded" : "ok";

    p = b->last;
    p = ngx_sprintf(p, "{\"status\":\"%s\",\"nginx_pid\":%P,\"redis\":\"%s\","
                    "\"workers\":[", status, ngx_pid, redis);

    for (i = 0; i < n; i++) {
        rg = ngx_http_maskserve_loc_region(mcf, lcf, i);

        if (i) {
            *p++ = ',';
        }

        p = ngx_http_maskserve_health_region(p, rg);
    }

    *p++ = ']';

    if (mcf->redis_on) {
        ngx_http_maskserve_redis_stats(&st);

        p = ngx_sprintf(p, ",\"redis_stats\":{\"tracked\":%ui,"
                        "\"unsynced\":%ui,\"dropped\":%ui,"
                        "\"reconnects\":%ui}",
                        st.tracked, st.unsynced, st.dropped, st.reconnects);
    }

    p = ngx_cpymem(p, "}\n", 2);
    b->last = p;

    return ngx_http_maskserve_send_json(r, ready ? NGX_HTTP_OK
                                        : NGX_HTTP_SERVICE_UNAVAILABLE, b);
}


static u_char *
ngx_http_maskserve_health_region(u_char *p, ngx_http_maskserve_region_t *rg)
{
    size_t            len;
    uint32_t          census[6], state;
    uint64_t          hb, now, age;
    struct msv_ctrl  *c;

    static const char  *states[] = { "starting", "ready", "draining",
                                     "stopped" };

    p = ngx_sprintf(p, "{\"name\":\"%V\",\"attached\":%s", &rg->name,
                    rg->attached ? "true" : "false");

    if (!rg->attached) {
        len = ngx_strlen(rg->err);
        p = ngx_cpymem(p, ",\"error\":\"", 10);
        p = (u_char *) ngx_escape_json(p, rg->err, ngx_min(len, 255));
        p = ngx_cpymem(p, "\"}", 2);
        return p;
    }

    c = rg->att.rg.ctrl;

    state = atomic_load_explicit(&c->state, memory_order_relaxed);
    hb = atomic_load_explicit(&c->heartbeat_ns, memory_order_relaxed);
    now = msv_now_ns();
    age = now > hb ? (now - hb) / 1000000 : 0;

    msv_slot_census(c, census);

    p = ngx_sprintf(p, ",\"ready\":%s,\"state\":\"%s\",\"pid\":%D,"
                    "\"generation\":\"%016uxL\",\"heartbeat_age_ms\":%uL,",
                    ngx_http_maskserve_link_ready(rg) == NGX_OK
                    ? "true" : "false",
                    state < 4 ? states[state] : "unknown", c->worker_pid,
                    c->generation, age);

    p = ngx_cpymem(p, "\"model\":\"", 9);
    len = ngx_strnlen((u_char *) c->model, sizeof(c->model));
    p = (u_char *) ngx_escape_json(p, (u_char *) c->model, len);

    p = ngx_cpymem(p, "\",\"backend\":\"", 13);
    len = ngx_strnlen((u_char *) c->backend, sizeof(c->backend));
    p = (u_char *) ngx_escape_json(p, (u_char *) c->backend, len);

    p = ngx_sprintf(p, "\",\"vocab_size\":%uD,\"max_model_len\":%uD,"
                    "\"max_logprobs\":%uD,\"slots\":%uD,\"slots_in_use\":%uD,"
                    "\"slots_running\":%uD,\"running\":%uD,\"waiting\":%uD,"
                    "\"steps\":%uL,\"tokens\":%uL,\"requests_done\":%uL,"
                    "\"local_requests\":%ui}",
                    c->vocab_size, c->max_model_len, c->max_logprobs,
                    c->n_slots, c->n_slots - census[MSV_SLOT_FREE],
                    census[MSV_SLOT_RUNNING],
                    atomic_load_explicit(&c->running, memory_order_relaxed),
                    atomic_load_explicit(&c->waiting, memory_order_relaxed),
                    atomic_load_explicit(&c->steps, memory_order_relaxed),
                    atomic_load_explicit(&c->tokens, memory_order_relaxed),
                    atomic_load_explicit(&c->requests_done,
                                         memory_order_relaxed),
                    rg->inflight);

    return p;
}
