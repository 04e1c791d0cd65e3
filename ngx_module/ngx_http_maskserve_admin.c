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

#include "msv_shm.h"
#include "msv_region.h"
#include "msv_slots.h"
#include "ngx_http_maskserve_module.h"
#include "ngx_http_maskserve_util.h"
#include "ngx_http_maskserve_parse.h"
#include "ngx_http_maskserve_attach.h"
#include "ngx_http_maskserve_route.h"
#include "ngx_http_maskserve_stream.h"
#include "ngx_http_maskserve_generate.h"
#include "ngx_http_maskserve_admin.h"
#include "ngx_http_maskserve_control.h"
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
    ngx_http_maskserve_redis_record_t *rec);
static ngx_int_t ngx_http_maskserve_aborted(ngx_http_request_t *r,
    ngx_str_t *id);
static ngx_int_t ngx_http_maskserve_not_found(ngx_http_request_t *r);
static void ngx_http_maskserve_status_redis(void *data, ngx_int_t rc,
    ngx_http_maskserve_redis_record_t *rec);
static u_char *ngx_http_maskserve_record_json(u_char *p,
    ngx_http_maskserve_redis_record_t *rec, size_t *lenp);
static size_t ngx_http_maskserve_json_string(u_char *dst, const u_char *src,
    size_t len);
static size_t ngx_http_maskserve_utf8_seq(const u_char *p, const u_char *end);
static ngx_uint_t ngx_http_maskserve_json_integer(const u_char *p,
    size_t len);
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
ngx_http_maskserve_abort_redis(void *data, ngx_int_t rc,
    ngx_http_maskserve_redis_record_t *rec)
{
    ngx_http_maskserve_admin_ctx_t  *actx = data;

    ngx_http_request_t  *r;

    r = actx->r;
    actx->handle = NULL;

    /* is the request of this record still generating? */
    if (rc == NGX_OK
        && (rec->state == NGX_HTTP_MASKSERVE_REQ_ADMITTED
            || rec->state == NGX_HTTP_MASKSERVE_REQ_RUNNING))
    {
        ngx_http_maskserve_redis_publish_abort(&actx->id);
        ngx_http_maskserve_stream_finalize(r,
                                 ngx_http_maskserve_aborted(r, &actx->id));
        return;
    }

    ngx_http_maskserve_stream_finalize(r, ngx_http_maskserve_not_found(r));
}


static ngx_int_t
ngx_http_maskserve_abort_local(ngx_http_maskserve_main_conf_t *mcf,
    ngx_str_t *id)
{
    uint32_t                      state;
    uint64_t                      cookie;
    ngx_uint_t                    slot, n;
    ngx_http_maskserve_region_t  *rg;

    if (ngx_http_maskserve_route_find(mcf, id->data, id->len, &rg, &slot,
                                     &cookie, &state)
        != NGX_OK)
    {
        return NGX_DECLINED;
    }

    /* every choice of the request (sampling_params.n): one slot each */
    n = ngx_http_maskserve_route_cancel_id(rg, id->data, id->len);

    ngx_log_error(NGX_LOG_INFO, rg->log, 0,
                  "maskserve: request \"%V\" aborted by id (\"%V\" slot %ui, "
                  "%ui slots)", id, &rg->name, slot, n);

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

    /* "*" is no request id: abort_requests with all_hosts, for all */
    if (id->len == 1 && id->data[0] == '*') {
        ngx_http_maskserve_abort_all_local(mcf);
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
        p = ngx_pnalloc(r->pool, 128);
        if (p == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        ngx_http_maskserve_set_error(&err, NGX_HTTP_BAD_REQUEST,
                                     NGX_HTTP_MASKSERVE_INVALID, "request_id",
                                     p, ngx_snprintf(p, 128, "the path must "
                                     "end with a request id of 1 to %d "
                                     "characters of [A-Za-z0-9._:-]",
                                     MSV_REQ_ID_MAX) - p);
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
ngx_http_maskserve_status_redis(void *data, ngx_int_t rc,
    ngx_http_maskserve_redis_record_t *rec)
{
    ngx_http_maskserve_admin_ctx_t  *actx = data;

    size_t               len;
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

    (void) ngx_http_maskserve_record_json(NULL, rec, &len);

    b = ngx_create_temp_buf(r->pool, actx->id.len + len + 64);
    if (b == NULL) {
        ngx_http_maskserve_stream_finalize(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    b->last = ngx_sprintf(b->last, "{\"request_id\":\"%V\",\"source\":"
                          "\"redis\",\"record\":", &actx->id);
    b->last = ngx_http_maskserve_record_json(b->last, rec, NULL);
    *b->last++ = '}';

    ngx_http_maskserve_stream_finalize(r,
                               ngx_http_maskserve_send_json(r, NGX_HTTP_OK, b));
}


static ngx_int_t
ngx_http_maskserve_status_local(ngx_http_request_t *r, ngx_str_t *id)
{
    uint32_t                         state;
    uint64_t                         cookie;
    ngx_buf_t                       *b;
    ngx_uint_t                       slot, n, out, running;
    ngx_http_maskserve_region_t     *rg;
    ngx_http_maskserve_main_conf_t  *mcf;

    mcf = ngx_http_get_module_main_conf(r, ngx_http_maskserve_module);

    if (!mcf->running
        || ngx_http_maskserve_route_find(mcf, id->data, id->len, &rg, &slot,
                                        &cookie, &state)
           != NGX_OK)
    {
        return ngx_http_maskserve_not_found(r);
    }

    /* the whole request: every choice's slot, the tokens of all */
    n = ngx_http_maskserve_route_count_id(rg, id->data, id->len, &out,
                                          &running);
    if (n == 0) {
        return ngx_http_maskserve_not_found(r);
    }

    b = ngx_create_temp_buf(r->pool, id->len + rg->name.len + 256);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last = ngx_sprintf(b->last, "{\"request_id\":\"%V\",\"source\":"
                          "\"local\",\"record\":{\"state\":\"%s\","
                          "\"worker\":\"%V\",\"slot\":%ui,\"choices\":%ui,"
                          "\"prompt_tokens\":%uD,\"completion_tokens\":%ui}}",
                          id, running ? "running" : "admitted",
                          &rg->name, slot, n,
                          msv_slot_at(rg->att.rg.ctrl, (uint32_t) slot)
                              ->n_prompt, out);

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
    ngx_uint_t                         i, n, ready, stalled;
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
    stalled = 0;

    for (i = 0; i < n; i++) {
        rg = ngx_http_maskserve_loc_region(mcf, lcf, i);

        if (mcf->running && ngx_http_maskserve_attach_ready(rg) == NGX_OK) {
            ready++;
        }

        if (mcf->running && ngx_http_maskserve_attach_stalled(rg)) {
            stalled++;
        }
    }

    if (!mcf->redis_on) {
        redis = "off";

    } else {
        redis = ngx_http_maskserve_redis_connected() ? "up" : "down";
    }

    /* a configured Redis that is down degrades, never fails, health */
    status = !ready ? "unavailable"
             : (ready < n || stalled || redis[0] == 'd') ? "degraded" : "ok";

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
                    "\"generation\":\"%016uxL\",\"heartbeat_age_ms\":%uL,"
                    "\"stalled\":%s,\"stall_limit_ms\":%uL,\"step_ms\":%uD,",
                    ngx_http_maskserve_attach_ready(rg) == NGX_OK
                    ? "true" : "false",
                    state < 4 ? states[state] : "unknown", c->worker_pid,
                    c->generation, age,
                    ngx_http_maskserve_attach_stalled(rg) ? "true" : "false",
                    ngx_http_maskserve_attach_stall_ns(rg) / 1000000,
                    atomic_load_explicit(&c->step_ms, memory_order_relaxed));

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
                    "\"local_requests\":%ui,",
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

    state = atomic_load_explicit(&c->paused, memory_order_relaxed);
    p = ngx_sprintf(p, "\"paused\":%s,\"pause_state\":\"%s\","
                    "\"weight_version\":\"",
                    state != MSV_RUNNING ? "true" : "false",
                    state == MSV_PAUSED ? "paused"
                    : state == MSV_PAUSING ? "pausing" : "running");
    len = ngx_strnlen((u_char *) c->weight_version, MSV_VERSION_MAX);
    p = (u_char *) ngx_escape_json(p, (u_char *) c->weight_version, len);
    p = ngx_cpymem(p, "\"}", 2);

    return p;
}


/* fields of a Redis record written as JSON numbers */
static const char  *ngx_http_maskserve_record_numeric[] = {
    "pid", "slot", "prompt_tokens", "completion_tokens", "t_admit",
    "t_update", NULL
};


/* ------------------------------------------------------------------ */
/* A Redis record as a JSON object                                      */

/*
 * The JSON object of a record: its numeric fields as numbers, the rest
 * (cookie included) as strings.  Two passes: length, then bytes.
 */
static u_char *
ngx_http_maskserve_record_json(u_char *p,
    ngx_http_maskserve_redis_record_t *rec, size_t *lenp)
{
    size_t         len;
    ngx_uint_t     i, k, num;
    ngx_keyval_t  *f;

    len = sizeof("{}") - 1;

    if (p != NULL) {
        *p++ = '{';
    }

    for (i = 0; i < rec->nfields; i++) {
        f = &rec->fields[i];

        num = 0;
        for (k = 0; ngx_http_maskserve_record_numeric[k] != NULL; k++) {
            if (f->key.len == ngx_strlen(ngx_http_maskserve_record_numeric[k])
                && ngx_strncmp(f->key.data,
                               ngx_http_maskserve_record_numeric[k],
                               f->key.len) == 0)
            {
                num = ngx_http_maskserve_json_integer(f->value.data,
                                                      f->value.len);
                break;
            }
        }

        if (p == NULL) {
            len += (i ? 1 : 0) + 2
                   + ngx_http_maskserve_json_string(NULL, f->key.data,
                                                    f->key.len)
                   + 1;
            len += num ? f->value.len
                       : 2 + ngx_http_maskserve_json_string(NULL,
                                                            f->value.data,
                                                            f->value.len);
            continue;
        }

        if (i) {
            *p++ = ',';
        }

        *p++ = '"';
        p += ngx_http_maskserve_json_string(p, f->key.data, f->key.len);
        *p++ = '"';
        *p++ = ':';

        if (num) {
            p = ngx_cpymem(p, f->value.data, f->value.len);

        } else {
            *p++ = '"';
            p += ngx_http_maskserve_json_string(p, f->value.data,
                                                f->value.len);
            *p++ = '"';
        }
    }

    if (p != NULL) {
        *p++ = '}';
    }

    if (lenp) {
        *lenp = len;
    }

    return p;
}


/*
 * The body of a JSON string (no quotes) for len bytes at src; returns its
 * length, and writes it to dst unless dst is NULL.  Bytes that are not
 * valid UTF-8 become U+FFFD.
 */
static size_t
ngx_http_maskserve_json_string(u_char *dst, const u_char *src, size_t len)
{
    u_char         c, esc;
    size_t         n, seq;
    const u_char  *end;

    static const u_char  hex[] = "0123456789abcdef";

    n = 0;
    end = src + len;

    while (src < end) {
        c = *src;

        if (c >= 0x80) {
            seq = ngx_http_maskserve_utf8_seq(src, end);

            if (seq == 0) {
                if (dst) {
                    dst = ngx_cpymem(dst, "\\ufffd", 6);
                }

                n += 6;
                src++;
                continue;
            }

            if (dst) {
                dst = ngx_cpymem(dst, src, seq);
            }

            n += seq;
            src += seq;
            continue;
        }

        src++;

        /* the letter after a backslash, for characters that have one */
        switch (c) {
        case '"':  esc = '"'; break;
        case '\\': esc = '\\'; break;
        case '\n': esc = 'n'; break;
        case '\r': esc = 'r'; break;
        case '\t': esc = 't'; break;
        case '\b': esc = 'b'; break;
        case '\f': esc = 'f'; break;
        default:   esc = '\0';
        }

        if (esc != '\0') {
            if (dst) {
                *dst++ = '\\';
                *dst++ = esc;
            }

            n += 2;

        } else if (c < 0x20) {
            if (dst) {
                dst = ngx_cpymem(dst, "\\u00", 4);
                *dst++ = hex[c >> 4];
                *dst++ = hex[c & 0xf];
            }

            n += 6;

        } else {
            if (dst) {
                *dst++ = c;
            }

            n++;
        }
    }

    return n;
}


/* length of the valid UTF-8 sequence at p (first byte >= 0x80), or 0 */
static size_t
ngx_http_maskserve_utf8_seq(const u_char *p, const u_char *end)
{
    size_t  n, i;
    u_char  c, lo, hi;

    c = p[0];
    lo = 0x80;
    hi = 0xbf;

    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;

    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        if (c == 0xe0) {
            lo = 0xa0;          /* no overlong forms */
        } else if (c == 0xed) {
            hi = 0x9f;          /* no surrogates */
        }

    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        if (c == 0xf0) {
            lo = 0x90;
        } else if (c == 0xf4) {
            hi = 0x8f;          /* nothing above U+10FFFF */
        }

    } else {
        return 0;
    }

    if ((size_t) (end - p) < n) {
        return 0;
    }

    if (p[1] < lo || p[1] > hi) {
        return 0;
    }

    for (i = 2; i < n; i++) {
        if (p[i] < 0x80 || p[i] > 0xbf) {
            return 0;
        }
    }

    return n;
}


/* 1 when p is a JSON integer that a double holds exactly */
static ngx_uint_t
ngx_http_maskserve_json_integer(const u_char *p, size_t len)
{
    size_t  i;

    i = (len > 0 && p[0] == '-') ? 1 : 0;

    if (len - i == 0 || len - i > 15) {
        return 0;
    }

    if (p[i] == '0' && len - i > 1) {
        return 0;
    }

    for ( /* void */ ; i < len; i++) {
        if (p[i] < '0' || p[i] > '9') {
            return 0;
        }
    }

    return 1;
}


