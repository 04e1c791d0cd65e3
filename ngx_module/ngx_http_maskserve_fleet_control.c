/*
 * ngx_http_maskserve_fleet_control.c: a control request to a front,
 * fanned out to every GPU host.
 *
 * The handler reads the body, takes the hosts of the registry as this
 * process last read it (ngx_http_maskserve_fleet_targets), and starts one
 * subrequest per host, in memory and waited, to the internal location
 * named by maskserve_fleet_control.  That location proxies to
 * $maskserve_fleet_host (the subrequest's host) with the main request's
 * URI: connecting, timeouts and HTTP are nginx's proxy's, the body is the
 * main request's, sent as it came.  When every subrequest has ended the
 * front answers one JSON object with each host's status and answer; 200
 * only when every host answered 2xx.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>

#include "ngx_http_maskserve_module.h"
#include "ngx_http_maskserve_fleet.h"
#include "ngx_http_maskserve_fleet_control.h"
#include "ngx_http_maskserve_util.h"


typedef struct ngx_http_maskserve_fanout_s  ngx_http_maskserve_fanout_t;


/* one host's part */
typedef struct {
    ngx_http_maskserve_fleet_target_t   target;
    ngx_http_maskserve_fanout_t        *fo;
    ngx_http_post_subrequest_t          ps;
    ngx_uint_t                          status;   /* HTTP status */
    ngx_str_t                           body;     /* its answer, a copy */
    const char                         *error;    /* no usable answer */
    unsigned                            done:1;
    unsigned                            answered:1; /* the host answered */
    unsigned                            json:1;   /* body is valid JSON */
} ngx_http_maskserve_fanout_host_t;


struct ngx_http_maskserve_fanout_s {
    ngx_http_request_t                 *r;
    ngx_http_maskserve_fanout_host_t   *hosts;
    ngx_uint_t                          n;
    ngx_uint_t                          pending;
    unsigned                            finished:1;
};


static ngx_int_t ngx_http_maskserve_fleet_control_handler(
    ngx_http_request_t *r);
static void ngx_http_maskserve_fleet_control_body(ngx_http_request_t *r);
static ngx_int_t ngx_http_maskserve_fleet_control_done(ngx_http_request_t *sr,
    void *data, ngx_int_t rc);
static void ngx_http_maskserve_fleet_control_wake(ngx_http_request_t *r);
static ngx_int_t ngx_http_maskserve_fleet_control_answer(
    ngx_http_maskserve_fanout_t *fo);
static void ngx_http_maskserve_fleet_control_fail(ngx_http_request_t *r,
    ngx_uint_t status, u_char *msg, size_t len);
static void ngx_http_maskserve_fanout_message(ngx_http_request_t *r,
    ngx_http_maskserve_fanout_host_t *h, ngx_str_t *out);


/* ------------------------------------------------------------------ */
/* Configuration                                                        */

/* maskserve_fleet_control LOCATION [draining]; */
char *
ngx_http_maskserve_fleet_control_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_maskserve_loc_conf_t  *lcf = conf;

    ngx_str_t                 *value;
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    if (clcf->handler != NULL) {
        return "is duplicate: the location already has a content handler";
    }

    value = cf->args->elts;

    if (value[1].len == 0 || value[1].data[0] != '/') {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "maskserve_fleet_control: \"%V\" is not a "
                           "location (a URI starting with \"/\")", &value[1]);
        return NGX_CONF_ERROR;
    }

    if (cf->args->nelts == 3) {
        if (ngx_strcmp(value[2].data, "draining") != 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "maskserve_fleet_control: invalid parameter "
                               "\"%V\", expected \"draining\"", &value[2]);
            return NGX_CONF_ERROR;
        }

        lcf->fleet_control_draining = 1;
    }

    lcf->fleet_control = value[1];
    clcf->handler = ngx_http_maskserve_fleet_control_handler;

    return NGX_CONF_OK;
}


/* ------------------------------------------------------------------ */
/* The fan-out                                                          */

static ngx_int_t
ngx_http_maskserve_fleet_control_handler(ngx_http_request_t *r)
{
    ngx_int_t                 rc;
    ngx_http_maskserve_err_t  err;

    if (r != r->main) {
        return NGX_HTTP_NOT_FOUND;
    }

    if (r->method != NGX_HTTP_POST) {
        rc = ngx_http_discard_request_body(r);
        if (rc != NGX_OK) {
            return rc;
        }

        ngx_http_maskserve_error(&err, NGX_HTTP_NOT_ALLOWED,
                                 NGX_HTTP_MASKSERVE_INVALID, NULL,
                                 "only POST is allowed here");
        return ngx_http_maskserve_send_error(r, &err);
    }

    rc = ngx_http_read_client_request_body(r,
                                     ngx_http_maskserve_fleet_control_body);
    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    return NGX_DONE;
}


static void
ngx_http_maskserve_fleet_control_body(ngx_http_request_t *r)
{
    ngx_int_t                          rc;
    ngx_uint_t                         i;
    ngx_array_t                        targets;
    ngx_http_request_t                *sr;
    ngx_http_maskserve_ctx_t          *ctx;
    ngx_http_maskserve_fanout_t       *fo;
    ngx_http_maskserve_loc_conf_t     *lcf;
    ngx_http_maskserve_fanout_host_t  *h;
    ngx_http_maskserve_fleet_target_t *t;

    if (r->connection->error) {
        ngx_http_finalize_request(r, NGX_HTTP_CLIENT_CLOSED_REQUEST);
        return;
    }

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_maskserve_module);

    if (ngx_array_init(&targets, r->pool, 8,
                       sizeof(ngx_http_maskserve_fleet_target_t))
        != NGX_OK)
    {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    rc = ngx_http_maskserve_fleet_targets(r->pool,
                                          lcf->fleet_control_draining,
                                          &targets);

    if (rc == NGX_DECLINED) {
        ngx_http_maskserve_fleet_control_fail(r,
            NGX_HTTP_INTERNAL_SERVER_ERROR, (u_char *) "no \"maskserve_fleet\" "
            "upstream is configured: this nginx is not a front",
            sizeof("no \"maskserve_fleet\" upstream is configured: this "
                   "nginx is not a front") - 1);
        return;
    }

    if (rc != NGX_OK) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    if (targets.nelts == 0) {
        ngx_http_maskserve_fleet_control_fail(r,
            NGX_HTTP_SERVICE_UNAVAILABLE, (u_char *) "no GPU host in the "
            "registry to send the command to",
            sizeof("no GPU host in the registry to send the command to") - 1);
        return;
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_maskserve_module);
    if (ctx == NULL) {
        ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_maskserve_ctx_t));
        if (ctx == NULL) {
            ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
            return;
        }

        ngx_http_set_ctx(r, ctx, ngx_http_maskserve_module);
    }

    fo = ngx_pcalloc(r->pool, sizeof(ngx_http_maskserve_fanout_t));
    if (fo == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    fo->r = r;
    fo->n = targets.nelts;
    fo->hosts = ngx_pcalloc(r->pool,
                            fo->n * sizeof(ngx_http_maskserve_fanout_host_t));
    if (fo->hosts == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    ctx->fanout = fo;

    t = targets.elts;

    for (i = 0; i < fo->n; i++) {
        h = &fo->hosts[i];
        h->target = t[i];
        h->fo = fo;
        h->ps.handler = ngx_http_maskserve_fleet_control_done;
        h->ps.data = h;

        /*
         * In memory (the answer is read, not sent on), waited (done as
         * soon as it ends, in whatever order).  The subrequest shares the
         * main request's body and headers; its method is the main one's.
         */
        if (ngx_http_subrequest(r, &lcf->fleet_control, NULL, &sr, &h->ps,
                                NGX_HTTP_SUBREQUEST_IN_MEMORY
                                |NGX_HTTP_SUBREQUEST_WAITED)
            != NGX_OK)
        {
            /* the ones started end on their own; this one counts failed */
            h->done = 1;
            h->status = NGX_HTTP_INTERNAL_SERVER_ERROR;
            h->error = "the subrequest could not be created";
            continue;
        }

        sr->method = r->method;
        sr->method_name = r->method_name;
        fo->pending++;
    }

    r->write_event_handler = ngx_http_maskserve_fleet_control_wake;

    if (fo->pending == 0) {
        ngx_http_maskserve_fleet_control_wake(r);
    }
}


/* a subrequest ended: keep its answer (called again on later finalizes) */
static ngx_int_t
ngx_http_maskserve_fleet_control_done(ngx_http_request_t *sr, void *data,
    ngx_int_t rc)
{
    ngx_http_maskserve_fanout_host_t *h = data;

    u_char               *p;
    size_t                len;
    yajl_val              v;
    ngx_buf_t            *b;
    ngx_http_upstream_t  *u;

    if (h->done) {
        return rc;
    }

    h->done = 1;
    h->fo->pending--;

    u = sr->upstream;

    if (u == NULL || u->headers_in.status_n == 0) {
        h->status = (rc >= NGX_HTTP_SPECIAL_RESPONSE)
                    ? (ngx_uint_t) rc : NGX_HTTP_BAD_GATEWAY;
        h->error = "no answer from the host (connection refused, reset or "
                   "timed out)";
        return rc;
    }

    h->answered = 1;
    h->status = u->headers_in.status_n;

    if (rc == NGX_ERROR) {
        h->error = "the host's answer could not be read whole (larger than "
                   "subrequest_output_buffer_size, or cut off)";
        return rc;
    }

    b = (sr->out && sr->out->buf) ? sr->out->buf : NULL;
    len = b ? (size_t) (b->last - b->pos) : 0;

    if (len == 0) {
        h->error = "the host's answer has no body";
        return rc;
    }

    p = ngx_pnalloc(h->fo->r->pool, len + 1);
    if (p == NULL) {
        h->error = "out of memory";
        return rc;
    }

    ngx_memcpy(p, b->pos, len);
    p[len] = '\0';
    h->body.data = p;
    h->body.len = len;

    v = yajl_tree_parse((const char *) p, NULL, 0);
    if (v == NULL) {
        h->error = "the host's answer is not JSON";
        return rc;
    }

    h->json = 1;
    yajl_tree_free(v);

    return rc;
}


static void
ngx_http_maskserve_fleet_control_wake(ngx_http_request_t *r)
{
    ngx_http_maskserve_ctx_t     *ctx;
    ngx_http_maskserve_fanout_t  *fo;

    ctx = ngx_http_get_module_ctx(r, ngx_http_maskserve_module);
    fo = ctx->fanout;

    if (fo->pending > 0 || fo->finished) {
        return;
    }

    fo->finished = 1;
    r->write_event_handler = ngx_http_request_empty_handler;

    ngx_http_finalize_request(r, ngx_http_maskserve_fleet_control_answer(fo));
}


/*
 * {"hosts": [{"host", "address", "state", "status", "ok", "response"
 *  (the host's JSON answer, or null), "error" (when it gave none)}, ...],
 *  "hosts_ok": N, "hosts_failed": M, "failed": ["name", ...],
 *  "error": {...} (only when a host failed)}
 */
static ngx_int_t
ngx_http_maskserve_fleet_control_answer(ngx_http_maskserve_fanout_t *fo)
{
    u_char                            *p;
    size_t                             len;
    ngx_buf_t                         *b;
    ngx_str_t                          msg;
    ngx_uint_t                         i, ok, failed, status, same;
    const char                        *type;
    ngx_http_maskserve_fanout_host_t  *h;

    len = sizeof("{\"hosts\":[],\"hosts_ok\":,\"hosts_failed\":,"
                 "\"failed\":[],\"error\":{\"message\":\" of  GPU hosts "
                 "failed\",\"type\":\"invalid_request_error\","
                 "\"param\":null,\"code\":}}\n") + 4 * NGX_INT_T_LEN;
    ok = 0;
    failed = 0;
    status = 0;
    same = 1;

    for (i = 0; i < fo->n; i++) {
        h = &fo->hosts[i];

        ngx_http_maskserve_fanout_message(fo->r, h, &msg);

        /* per host, and its name in "failed" and in the message */
        len += sizeof("{\"host\":\"\",\"address\":\"\",\"state\":\"\","
                      "\"status\":,\"ok\":false,\"response\":null,"
                      "\"error\":\"\"},")
               + 3 * 6 * (h->target.name.len + h->target.addr.len)
               + 32 + NGX_INT_T_LEN + h->body.len
               + 6 * (h->error ? ngx_strlen(h->error) : 0)
               + 6 * msg.len + 64;

        if (h->status >= 200 && h->status < 300 && h->error == NULL) {
            ok++;
            continue;
        }

        if (failed++ == 0) {
            status = h->status;

        } else if (status != h->status) {
            same = 0;
        }
    }

    b = ngx_create_temp_buf(fo->r->pool, len);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p = ngx_cpymem(b->last, "{\"hosts\":[", sizeof("{\"hosts\":[") - 1);

    for (i = 0; i < fo->n; i++) {
        h = &fo->hosts[i];

        if (i) {
            *p++ = ',';
        }

        p = ngx_cpymem(p, "{\"host\":\"", sizeof("{\"host\":\"") - 1);
        p = ngx_http_maskserve_json_escape(p, h->target.name.data,
                                           h->target.name.len, 0);
        p = ngx_cpymem(p, "\",\"address\":\"", sizeof("\",\"address\":\"") - 1);
        p = ngx_http_maskserve_json_escape(p, h->target.addr.data,
                                           h->target.addr.len, 0);
        p = ngx_sprintf(p, "\",\"state\":\"%s\",\"status\":%ui,\"ok\":%s,"
                        "\"response\":", h->target.state, h->status,
                        (h->status >= 200 && h->status < 300
                         && h->error == NULL) ? "true" : "false");

        if (h->json) {
            p = ngx_cpymem(p, h->body.data, h->body.len);

        } else {
            p = ngx_cpymem(p, "null", 4);
        }

        if (h->error) {
            p = ngx_cpymem(p, ",\"error\":\"", sizeof(",\"error\":\"") - 1);
            p = ngx_http_maskserve_json_escape(p, (u_char *) h->error,
                                               ngx_strlen(h->error), 0);
            *p++ = '"';
        }

        *p++ = '}';
    }

    p = ngx_sprintf(p, "],\"hosts_ok\":%ui,\"hosts_failed\":%ui,\"failed\":[",
                    ok, failed);

    for (i = 0, failed = 0; i < fo->n; i++) {
        h = &fo->hosts[i];

        if (h->status >= 200 && h->status < 300 && h->error == NULL) {
            continue;
        }

        if (failed++) {
            *p++ = ',';
        }

        *p++ = '"';
        p = ngx_http_maskserve_json_escape(p, h->target.name.data,
                                           h->target.name.len, 0);
        *p++ = '"';
    }

    *p++ = ']';

    if (failed == 0) {
        p = ngx_cpymem(p, "}\n", 2);
        b->last = p;

        return ngx_http_maskserve_send_json(fo->r, NGX_HTTP_OK, b);
    }

    /*
     * Every host refused it alike (a 4xx: the same bad field, 409 busy
     * everywhere): that status.  Otherwise the fleet did not do it as a
     * whole: 502, naming each failed host.
     */
    if (!(failed == fo->n && same && status >= 400 && status < 500)) {
        status = NGX_HTTP_BAD_GATEWAY;
    }

    type = status < 500 ? NGX_HTTP_MASKSERVE_INVALID
                        : NGX_HTTP_MASKSERVE_SERVER;

    p = ngx_sprintf(p, ",\"error\":{\"message\":\"%ui of %ui GPU hosts failed",
                    failed, fo->n);

    for (i = 0, failed = 0; i < fo->n; i++) {
        h = &fo->hosts[i];

        if (h->status >= 200 && h->status < 300 && h->error == NULL) {
            continue;
        }

        p = ngx_cpymem(p, failed++ ? "; " : ": ", 2);
        p = ngx_http_maskserve_json_escape(p, h->target.name.data,
                                           h->target.name.len, 0);
        p = ngx_cpymem(p, " (", 2);
        p = ngx_http_maskserve_json_escape(p, h->target.addr.data,
                                           h->target.addr.len, 0);
        p = ngx_sprintf(p, ") %ui", h->status);

        ngx_http_maskserve_fanout_message(fo->r, h, &msg);

        if (msg.len) {
            p = ngx_cpymem(p, " ", 1);
            p = ngx_http_maskserve_json_escape(p, msg.data, msg.len, 0);
        }
    }

    p = ngx_sprintf(p, "\",\"type\":\"%s\",\"param\":null,\"code\":%ui}}\n",
                    type, status);
    b->last = p;

    ngx_log_error(NGX_LOG_WARN, fo->r->connection->log, 0,
                  "maskserve fleet: \"%V\" failed on %ui of %ui hosts",
                  &fo->r->uri, failed, fo->n);

    return ngx_http_maskserve_send_json(fo->r, status, b);
}


/* why a host failed, in a few words: its error message, else ours */
static void
ngx_http_maskserve_fanout_message(ngx_http_request_t *r,
    ngx_http_maskserve_fanout_host_t *h, ngx_str_t *out)
{
    yajl_val     v, m;
    const char  *path[] = { "error", "message", NULL };

    ngx_str_null(out);

    if (h->error) {
        out->data = (u_char *) h->error;
        out->len = ngx_strlen(h->error);
        return;
    }

    if (!h->json || (h->status >= 200 && h->status < 300)) {
        return;
    }

    v = yajl_tree_parse((const char *) h->body.data, NULL, 0);
    if (v == NULL) {
        return;
    }

    m = yajl_tree_get(v, path, yajl_t_string);

    if (m != NULL) {
        out->len = ngx_strlen(m->u.string);
        out->data = ngx_pnalloc(r->pool, out->len);

        if (out->data == NULL) {
            out->len = 0;

        } else {
            ngx_memcpy(out->data, m->u.string, out->len);
        }
    }

    yajl_tree_free(v);
}


/* answer a JSON error before any host was asked */
static void
ngx_http_maskserve_fleet_control_fail(ngx_http_request_t *r,
    ngx_uint_t status, u_char *msg, size_t len)
{
    ngx_http_maskserve_err_t  err;

    ngx_http_maskserve_set_error(&err, status, NGX_HTTP_MASKSERVE_SERVER,
                                 NULL, msg, len);

    ngx_http_finalize_request(r, ngx_http_maskserve_send_error(r, &err));
}


/* ------------------------------------------------------------------ */
/* $maskserve_fleet_host                                                */

ngx_int_t
ngx_http_maskserve_fleet_control_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_http_maskserve_fanout_host_t  *h;

    if (r->post_subrequest == NULL
        || r->post_subrequest->handler
           != ngx_http_maskserve_fleet_control_done)
    {
        v->not_found = 1;
        return NGX_OK;
    }

    h = r->post_subrequest->data;

    v->data = h->target.addr.data;
    v->len = h->target.addr.len;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;

    return NGX_OK;
}
