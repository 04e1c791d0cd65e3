/*
 * ngx_http_maskserve_control.c: pause, resume, abort requests, flush the
 * prefix cache, models and metrics.
 *
 * Pause, resume and flush are commands to the workers of the location,
 * through each region's control channel (struct msv_cmd, shm/msv_cmd.h):
 * the handler claims every region's mailbox (one busy: 409 and nothing
 * is posted), posts the command, kicks the worker and polls the mailboxes
 * on a timer until every worker answered, between two of its steps.  A
 * client that goes away abandons the commands; the workers finish them
 * anyway.
 *
 * Abort requests needs no command: the slot tables are shared by every
 * process of the host, so the handler sets the cancel flag of each
 * request it finds, as the abort by id does.  Models and metrics read the
 * control pages.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_tree.h>

#include "msv_shm.h"
#include "msv_cmd.h"
#include "msv_region.h"
#include "msv_slots.h"
#include "ngx_http_maskserve_module.h"
#include "ngx_http_maskserve_util.h"
#include "ngx_http_maskserve_parse.h"
#include "ngx_http_maskserve_attach.h"
#include "ngx_http_maskserve_generate.h"
#include "ngx_http_maskserve_control.h"
#include "ngx_http_maskserve_redis.h"
#include "ngx_http_maskserve_stats.h"


/* how often a waiting command looks at the mailboxes (ms): often at
 * first (most commands take a step or two), then less (a pause that
 * waits for long requests, a large update) */
#define NGX_HTTP_MASKSERVE_CMD_POLL   2
#define NGX_HTTP_MASKSERVE_CMD_SLOW   20

/* the largest control body read (bytes) */
#define NGX_HTTP_MASKSERVE_CTL_BODY   (1024 * 1024)


typedef struct {
    ngx_http_maskserve_region_t   *rg;
    uint64_t                       generation;
    struct msv_cmd                 res;
    ngx_int_t                      state;    /* 0 waiting, 1 answered,
                                                -1 lost */
} ngx_http_maskserve_cmd_region_t;


typedef struct {
    ngx_http_request_t            *r;
    uint32_t                       op;       /* enum msv_cmd_op */
    uint32_t                       arg;
    const char                    *path;     /* MSV_OP_UPDATE */
    const char                    *version;
    ngx_http_maskserve_cmd_region_t  *regions;
    ngx_uint_t                     n;
    ngx_uint_t                     waiting;
    ngx_event_t                    timer;
    ngx_msec_t                     start;
} ngx_http_maskserve_cmd_ctx_t;


static ngx_int_t ngx_http_maskserve_ctl_start(ngx_http_request_t *r,
    ngx_http_client_body_handler_pt handler);
static void ngx_http_maskserve_pause_body(ngx_http_request_t *r);
static void ngx_http_maskserve_empty_body(ngx_http_request_t *r,
    uint32_t op);
static void ngx_http_maskserve_resume_body(ngx_http_request_t *r);
static void ngx_http_maskserve_flush_body(ngx_http_request_t *r);
static void ngx_http_maskserve_abort_requests_body(ngx_http_request_t *r);
static yajl_val ngx_http_maskserve_ctl_json(ngx_http_request_t *r,
    ngx_http_maskserve_err_t *err);
static ngx_int_t ngx_http_maskserve_ctl_only(ngx_http_request_t *r,
    yajl_val v, const char *allowed, ngx_http_maskserve_err_t *err);
static void ngx_http_maskserve_ctl_json_free(void *data);
static void ngx_http_maskserve_update_body(ngx_http_request_t *r);
static ngx_int_t ngx_http_maskserve_ctl_string(ngx_http_request_t *r,
    yajl_val v, const char *field, size_t max, const char **out,
    ngx_http_maskserve_err_t *err);
static void ngx_http_maskserve_cmd_send(ngx_http_request_t *r, uint32_t op,
    uint32_t arg, const char *path, const char *version);
static void ngx_http_maskserve_cmd_poll(ngx_event_t *ev);
static void ngx_http_maskserve_cmd_cleanup(void *data);
static ngx_int_t ngx_http_maskserve_cmd_answer(
    ngx_http_maskserve_cmd_ctx_t *cctx);
static void ngx_http_maskserve_ctl_fail(ngx_http_request_t *r,
    ngx_http_maskserve_err_t *err);
static ngx_int_t ngx_http_maskserve_ctl_get(ngx_http_request_t *r);
static u_char *ngx_http_maskserve_metrics_region(u_char *p,
    ngx_http_maskserve_region_t *rg, ngx_uint_t section);


static const char  *ngx_http_maskserve_pause_modes[] = { "abort", "wait",
                                                          "keep" };


/* ------------------------------------------------------------------ */
/* Handlers                                                             */

ngx_int_t
ngx_http_maskserve_pause_handler(ngx_http_request_t *r)
{
    return ngx_http_maskserve_ctl_start(r, ngx_http_maskserve_pause_body);
}


ngx_int_t
ngx_http_maskserve_resume_handler(ngx_http_request_t *r)
{
    return ngx_http_maskserve_ctl_start(r, ngx_http_maskserve_resume_body);
}


ngx_int_t
ngx_http_maskserve_flush_cache_handler(ngx_http_request_t *r)
{
    return ngx_http_maskserve_ctl_start(r, ngx_http_maskserve_flush_body);
}


ngx_int_t
ngx_http_maskserve_update_weights_handler(ngx_http_request_t *r)
{
    return ngx_http_maskserve_ctl_start(r, ngx_http_maskserve_update_body);
}


ngx_int_t
ngx_http_maskserve_abort_requests_handler(ngx_http_request_t *r)
{
    return ngx_http_maskserve_ctl_start(r,
                                     ngx_http_maskserve_abort_requests_body);
}


/*
 * A POST with a JSON body, or with no body at all (a trainer's bare
 * `curl -X POST`): that reads as {}.
 */
static ngx_int_t
ngx_http_maskserve_ctl_start(ngx_http_request_t *r,
    ngx_http_client_body_handler_pt handler)
{
    ngx_int_t  rc;

    if (r->method != NGX_HTTP_POST
        || r->headers_in.content_type != NULL
        || r->headers_in.content_length_n > 0
        || r->headers_in.chunked)
    {
        if (ngx_http_maskserve_check_post(r, &rc) != NGX_OK) {
            return rc;
        }
    }

    rc = ngx_http_read_client_request_body(r, handler);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    return NGX_DONE;
}


static void
ngx_http_maskserve_pause_body(ngx_http_request_t *r)
{
    yajl_val                   v, m;
    ngx_uint_t                 mode;
    ngx_http_maskserve_err_t   err;
    static const char         *path[] = { "mode", NULL };

    ngx_memzero(&err, sizeof(ngx_http_maskserve_err_t));

    v = ngx_http_maskserve_ctl_json(r, &err);
    if (v == NULL || ngx_http_maskserve_ctl_only(r, v, "mode", &err)
                     != NGX_OK)
    {
        ngx_http_maskserve_ctl_fail(r, &err);
        return;
    }

    mode = MSV_PAUSE_ABORT;
    m = yajl_tree_get(v, path, yajl_t_any);

    if (m != NULL && !YAJL_IS_NULL(m)) {
        if (!YAJL_IS_STRING(m)) {
            goto bad;
        }

        for (mode = 0; mode < 3; mode++) {
            if (ngx_strcmp(m->u.string,
                           ngx_http_maskserve_pause_modes[mode]) == 0)
            {
                break;
            }
        }

        if (mode == 3) {
            goto bad;
        }
    }

    ngx_http_maskserve_cmd_send(r, MSV_OP_PAUSE, (uint32_t) mode, NULL,
                                NULL);
    return;

bad:

    ngx_http_maskserve_error(&err, NGX_HTTP_BAD_REQUEST,
                             NGX_HTTP_MASKSERVE_INVALID, "mode",
                             "mode must be \"abort\", \"wait\" or \"keep\"");
    ngx_http_maskserve_ctl_fail(r, &err);
}


/* A command whose body is {} (no field allowed). */
static void
ngx_http_maskserve_empty_body(ngx_http_request_t *r, uint32_t op)
{
    yajl_val                  v;
    ngx_http_maskserve_err_t  err;

    ngx_memzero(&err, sizeof(ngx_http_maskserve_err_t));

    v = ngx_http_maskserve_ctl_json(r, &err);
    if (v == NULL || ngx_http_maskserve_ctl_only(r, v, NULL, &err) != NGX_OK)
    {
        ngx_http_maskserve_ctl_fail(r, &err);
        return;
    }

    ngx_http_maskserve_cmd_send(r, op, 0, NULL, NULL);
}


static void
ngx_http_maskserve_resume_body(ngx_http_request_t *r)
{
    ngx_http_maskserve_empty_body(r, MSV_OP_RESUME);
}


static void
ngx_http_maskserve_flush_body(ngx_http_request_t *r)
{
    ngx_http_maskserve_empty_body(r, MSV_OP_FLUSH_CACHE);
}


/*
 * {"model_path": DIR, "weight_version": "v17", "mode": ...}: both strings
 * required; the version is what responses, /health and /metrics show, so
 * it is 1..64 printable characters without quotes or backslashes.
 */
static void
ngx_http_maskserve_update_body(ngx_http_request_t *r)
{
    yajl_val                   v, m;
    ngx_uint_t                 mode, i;
    const char                *path, *version;
    ngx_http_maskserve_err_t   err;
    static const char         *mpath[] = { "mode", NULL };
    static const char         *fields[] = { "model_path", "weight_version",
                                            "mode" };

    ngx_memzero(&err, sizeof(ngx_http_maskserve_err_t));

    v = ngx_http_maskserve_ctl_json(r, &err);
    if (v == NULL) {
        ngx_http_maskserve_ctl_fail(r, &err);
        return;
    }

    for (i = 0; i < v->u.object.len; i++) {
        if (ngx_strcmp(v->u.object.keys[i], fields[0]) != 0
            && ngx_strcmp(v->u.object.keys[i], fields[1]) != 0
            && ngx_strcmp(v->u.object.keys[i], fields[2]) != 0)
        {
            (void) ngx_http_maskserve_ctl_only(r, v, NULL, &err);
            ngx_http_maskserve_ctl_fail(r, &err);
            return;
        }
    }

    if (ngx_http_maskserve_ctl_string(r, v, "model_path",
                                      MSV_CMD_PATH_MAX - 1, &path, &err)
        != NGX_OK
        || ngx_http_maskserve_ctl_string(r, v, "weight_version",
                                         MSV_VERSION_MAX, &version, &err)
           != NGX_OK)
    {
        ngx_http_maskserve_ctl_fail(r, &err);
        return;
    }

    for (i = 0; version[i] != '\0'; i++) {
        if ((u_char) version[i] < 0x20 || version[i] == '"'
            || version[i] == '\\' || version[i] == 0x7f)
        {
            ngx_http_maskserve_error(&err, NGX_HTTP_BAD_REQUEST,
                                     NGX_HTTP_MASKSERVE_INVALID,
                                     "weight_version",
                                     "weight_version must not hold quotes, "
                                     "backslashes or control characters");
            ngx_http_maskserve_ctl_fail(r, &err);
            return;
        }
    }

    mode = MSV_PAUSE_ABORT;
    m = yajl_tree_get(v, mpath, yajl_t_any);

    if (m != NULL && !YAJL_IS_NULL(m)) {
        for (mode = 0; YAJL_IS_STRING(m) && mode < 3; mode++) {
            if (ngx_strcmp(m->u.string,
                           ngx_http_maskserve_pause_modes[mode]) == 0)
            {
                break;
            }
        }

        if (!YAJL_IS_STRING(m) || mode == 3) {
            ngx_http_maskserve_error(&err, NGX_HTTP_BAD_REQUEST,
                                     NGX_HTTP_MASKSERVE_INVALID, "mode",
                                     "mode must be \"abort\", \"wait\" or "
                                     "\"keep\"");
            ngx_http_maskserve_ctl_fail(r, &err);
            return;
        }
    }

    ngx_http_maskserve_cmd_send(r, MSV_OP_UPDATE, (uint32_t) mode, path,
                                version);
}


/* A required string field of 1..max bytes, without NUL bytes. */
static ngx_int_t
ngx_http_maskserve_ctl_string(ngx_http_request_t *r, yajl_val v,
    const char *field, size_t max, const char **out,
    ngx_http_maskserve_err_t *err)
{
    u_char      *msg;
    size_t       len;
    yajl_val     s;
    const char  *path[2];

    path[0] = field;
    path[1] = NULL;

    s = yajl_tree_get(v, path, yajl_t_any);

    if (s != NULL && YAJL_IS_STRING(s)) {
        len = ngx_strlen(s->u.string);
        if (len >= 1 && len <= max) {
            *out = s->u.string;
            return NGX_OK;
        }
    }

    msg = ngx_pnalloc(r->pool, 128);
    if (msg == NULL) {
        return NGX_ERROR;
    }

    ngx_http_maskserve_set_error(err, NGX_HTTP_BAD_REQUEST,
                                 NGX_HTTP_MASKSERVE_INVALID, field, msg,
                                 ngx_snprintf(msg, 128, "%s is required: a "
                                              "string of 1 to %uz bytes",
                                              field, max) - msg);
    return NGX_ERROR;
}


/* ------------------------------------------------------------------ */
/* Control bodies                                                       */

/*
 * The body as a yajl tree (freed with the request), {} when there is
 * none; NULL with err filled when it is not a JSON object.
 */
static yajl_val
ngx_http_maskserve_ctl_json(ngx_http_request_t *r,
    ngx_http_maskserve_err_t *err)
{
    off_t                 off;
    size_t                len, n;
    u_char               *buf, *p, *msg;
    ssize_t               got;
    yajl_val              v;
    ngx_buf_t            *b;
    ngx_chain_t          *cl;
    ngx_pool_cleanup_t   *cln;
    char                  ebuf[128];

    len = 0;

    if (r->request_body != NULL) {
        for (cl = r->request_body->bufs; cl; cl = cl->next) {
            b = cl->buf;
            len += b->in_file ? (size_t) (b->file_last - b->file_pos)
                              : (size_t) (b->last - b->pos);
        }
    }

    if (len > NGX_HTTP_MASKSERVE_CTL_BODY) {
        ngx_http_maskserve_error(err, NGX_HTTP_REQUEST_ENTITY_TOO_LARGE,
                                 NGX_HTTP_MASKSERVE_INVALID, NULL,
                                 "the body is larger than 1 MiB");
        return NULL;
    }

    buf = ngx_pnalloc(r->pool, len + 3);
    if (buf == NULL) {
        goto internal;
    }

    p = buf;

    if (r->request_body != NULL) {
        for (cl = r->request_body->bufs; cl; cl = cl->next) {
            b = cl->buf;

            if (!b->in_file) {
                p = ngx_cpymem(p, b->pos, b->last - b->pos);
                continue;
            }

            for (off = b->file_pos; off < b->file_last; off += got) {
                n = (size_t) (b->file_last - off);
                got = ngx_read_file(b->file, p, n, off);
                if (got <= 0) {
                    goto internal;
                }
                p += got;
            }
        }
    }

    /* only whitespace: no body, read as {} */
    for (n = 0; n < (size_t) (p - buf); n++) {
        if (buf[n] != ' ' && buf[n] != '\t' && buf[n] != '\r'
            && buf[n] != '\n')
        {
            break;
        }
    }

    if (n == (size_t) (p - buf)) {
        p = ngx_cpymem(buf, "{}", 2);
    }

    *p = '\0';

    if (ngx_strlen(buf) != (size_t) (p - buf)) {
        ngx_http_maskserve_error(err, NGX_HTTP_BAD_REQUEST,
                                 NGX_HTTP_MASKSERVE_INVALID, NULL,
                                 "the body is not valid JSON (a NUL byte)");
        return NULL;
    }

    ebuf[0] = '\0';
    v = yajl_tree_parse((const char *) buf, ebuf, sizeof(ebuf));

    if (v == NULL) {
        /* yajl's message spans lines: keep its first */
        for (n = 0; ebuf[n] != '\0' && ebuf[n] != '\n'; n++) { /* void */ }

        msg = ngx_pnalloc(r->pool, n + 32);
        if (msg == NULL) {
            goto internal;
        }

        ngx_http_maskserve_set_error(err, NGX_HTTP_BAD_REQUEST,
                                     NGX_HTTP_MASKSERVE_INVALID, NULL, msg,
                                     ngx_snprintf(msg, n + 32, "invalid JSON: "
                                                  "%*s", n, ebuf) - msg);
        return NULL;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        yajl_tree_free(v);
        goto internal;
    }

    cln->handler = ngx_http_maskserve_ctl_json_free;
    cln->data = v;

    if (!YAJL_IS_OBJECT(v)) {
        ngx_http_maskserve_error(err, NGX_HTTP_BAD_REQUEST,
                                 NGX_HTTP_MASKSERVE_INVALID, NULL,
                                 "the body must be a JSON object");
        return NULL;
    }

    return v;

internal:

    ngx_http_maskserve_error(err, NGX_HTTP_INTERNAL_SERVER_ERROR,
                             NGX_HTTP_MASKSERVE_SERVER, NULL,
                             "could not read the request body");
    return NULL;
}


/* Every key of the object is `allowed` (NULL: none is); else a 400
 * naming the first one that is not. */
static ngx_int_t
ngx_http_maskserve_ctl_only(ngx_http_request_t *r, yajl_val v,
    const char *allowed, ngx_http_maskserve_err_t *err)
{
    u_char      *msg, *key;
    size_t       i, k, len;
    const char  *param;

    for (i = 0; i < v->u.object.len; i++) {
        if (allowed != NULL
            && ngx_strcmp(v->u.object.keys[i], allowed) == 0)
        {
            continue;
        }

        key = (u_char *) v->u.object.keys[i];
        len = ngx_min(ngx_strlen(key), 64);

        msg = ngx_pnalloc(r->pool, 2 * len + 64);
        if (msg == NULL) {
            return NGX_ERROR;
        }

        /* the field is named when it is a plain name (nothing to escape) */
        param = (const char *) key;
        for (k = 0; key[k] != '\0'; k++) {
            if (!((key[k] >= 'a' && key[k] <= 'z')
                  || (key[k] >= 'A' && key[k] <= 'Z')
                  || (key[k] >= '0' && key[k] <= '9') || key[k] == '_')
                || k >= 64)
            {
                param = NULL;
                break;
            }
        }

        if (param == NULL) {
            ngx_http_maskserve_error(err, NGX_HTTP_BAD_REQUEST,
                                     NGX_HTTP_MASKSERVE_INVALID, NULL,
                                     "unknown field");
            return NGX_ERROR;
        }

        ngx_http_maskserve_set_error(err, NGX_HTTP_BAD_REQUEST,
                                     NGX_HTTP_MASKSERVE_INVALID, param, msg,
                                     ngx_snprintf(msg, 2 * len + 64,
                                                  "unknown field \"%*s\"",
                                                  len, key) - msg);
        return NGX_ERROR;
    }

    return NGX_OK;
}


static void
ngx_http_maskserve_ctl_json_free(void *data)
{
    yajl_tree_free(data);
}


static void
ngx_http_maskserve_ctl_fail(ngx_http_request_t *r,
    ngx_http_maskserve_err_t *err)
{
    if (err->status == 0) {
        ngx_http_maskserve_error(err, NGX_HTTP_INTERNAL_SERVER_ERROR,
                                 NGX_HTTP_MASKSERVE_SERVER, NULL,
                                 "out of memory");
    }

    ngx_http_finalize_request(r, ngx_http_maskserve_send_error(r, err));
}


/* ------------------------------------------------------------------ */
/* Commands through the control channel                                 */

static void
ngx_http_maskserve_cmd_send(ngx_http_request_t *r, uint32_t op, uint32_t arg,
    const char *path, const char *version)
{
    u_char                           *msg;
    ngx_uint_t                        i, k, n;
    struct msv_ctrl                  *c;
    ngx_http_cleanup_t               *cln;
    ngx_http_maskserve_err_t          err;
    ngx_http_maskserve_region_t      *rg;
    ngx_http_maskserve_cmd_ctx_t     *cctx;
    ngx_http_maskserve_loc_conf_t    *lcf;
    ngx_http_maskserve_main_conf_t   *mcf;

    ngx_memzero(&err, sizeof(ngx_http_maskserve_err_t));

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_maskserve_module);
    mcf = ngx_http_get_module_main_conf(r, ngx_http_maskserve_module);

    n = ngx_http_maskserve_loc_nregions(mcf, lcf);

    cctx = ngx_pcalloc(r->pool, sizeof(ngx_http_maskserve_cmd_ctx_t));
    if (cctx == NULL) {
        goto internal;
    }

    cctx->regions = ngx_pcalloc(r->pool,
                         (n + 1) * sizeof(ngx_http_maskserve_cmd_region_t));
    if (cctx->regions == NULL) {
        goto internal;
    }

    cctx->r = r;
    cctx->op = op;
    cctx->arg = arg;
    cctx->path = path;
    cctx->version = version;

    /* every ready worker of the location, its mailbox claimed */
    for (i = 0; mcf->running && i < n; i++) {
        rg = ngx_http_maskserve_loc_region(mcf, lcf, i);

        if (ngx_http_maskserve_attach_ready(rg) != NGX_OK) {
            continue;
        }

        c = rg->att.rg.ctrl;

        if (msv_cmd_claim(c, (int32_t) ngx_pid) != 0) {
            for (k = 0; k < cctx->n; k++) {
                msv_cmd_unclaim(cctx->regions[k].rg->att.rg.ctrl,
                                (int32_t) ngx_pid);
            }

            msg = ngx_pnalloc(r->pool, rg->name.len + 128);
            if (msg == NULL) {
                goto internal;
            }

            ngx_http_maskserve_set_error(&err, NGX_HTTP_CONFLICT,
                NGX_HTTP_MASKSERVE_INVALID, NULL, msg,
                ngx_snprintf(msg, rg->name.len + 128, "another control "
                             "command is in progress on worker \"%V\"; "
                             "retry when it ends", &rg->name) - msg);
            ngx_http_maskserve_ctl_fail(r, &err);
            return;
        }

        cctx->regions[cctx->n].rg = rg;
        cctx->regions[cctx->n].generation = rg->generation;
        cctx->n++;
    }

    if (cctx->n == 0) {
        ngx_http_maskserve_error(&err, NGX_HTTP_SERVICE_UNAVAILABLE,
                                 NGX_HTTP_MASKSERVE_OVERLOAD, NULL,
                                 "no maskserve worker is attached and "
                                 "ready; retry later");
        ngx_http_maskserve_ctl_fail(r, &err);
        return;
    }

    cln = ngx_http_cleanup_add(r, 0);
    if (cln == NULL) {
        for (k = 0; k < cctx->n; k++) {
            msv_cmd_unclaim(cctx->regions[k].rg->att.rg.ctrl,
                            (int32_t) ngx_pid);
        }
        goto internal;
    }

    cln->handler = ngx_http_maskserve_cmd_cleanup;
    cln->data = cctx;

    for (k = 0; k < cctx->n; k++) {
        rg = cctx->regions[k].rg;
        msv_cmd_post(rg->att.rg.ctrl, (int32_t) ngx_pid, op, arg, path,
                     version);
        msv_kick(rg->att.kick_fd);
    }

    cctx->waiting = cctx->n;
    cctx->start = ngx_current_msec;

    cctx->timer.handler = ngx_http_maskserve_cmd_poll;
    cctx->timer.data = cctx;
    cctx->timer.log = r->connection->log;

    /* the client may go away meanwhile: that ends the wait (cleanup) */
    r->read_event_handler = ngx_http_test_reading;
    r->write_event_handler = ngx_http_request_empty_handler;

    ngx_add_timer(&cctx->timer, NGX_HTTP_MASKSERVE_CMD_POLL);
    return;

internal:

    ngx_http_maskserve_ctl_fail(r, &err);
}


static void
ngx_http_maskserve_cmd_poll(ngx_event_t *ev)
{
    ngx_http_maskserve_cmd_ctx_t  *cctx = ev->data;

    ngx_int_t                         rc;
    ngx_uint_t                        k;
    ngx_http_request_t               *r;
    ngx_http_maskserve_region_t      *rg;
    ngx_http_maskserve_cmd_region_t  *cr;

    r = cctx->r;

    for (k = 0; k < cctx->n; k++) {
        cr = &cctx->regions[k];

        if (cr->state != 0) {
            continue;
        }

        rg = cr->rg;

        if (!rg->attached || rg->generation != cr->generation) {
            cr->state = -1;     /* the worker went away */
            cctx->waiting--;
            continue;
        }

        rc = msv_cmd_poll(rg->att.rg.ctrl, (int32_t) ngx_pid, &cr->res);

        if (rc != 0) {
            cr->state = rc;
            cctx->waiting--;
        }
    }

    if (cctx->waiting > 0) {
        ngx_add_timer(&cctx->timer, ngx_current_msec - cctx->start < 200
                                    ? NGX_HTTP_MASKSERVE_CMD_POLL
                                    : NGX_HTTP_MASKSERVE_CMD_SLOW);
        return;
    }

    ngx_http_finalize_request(r, ngx_http_maskserve_cmd_answer(cctx));
}


static void
ngx_http_maskserve_cmd_cleanup(void *data)
{
    ngx_http_maskserve_cmd_ctx_t  *cctx = data;

    ngx_uint_t                        k;
    ngx_http_maskserve_cmd_region_t  *cr;

    if (cctx->timer.timer_set) {
        ngx_del_timer(&cctx->timer);
    }

    for (k = 0; k < cctx->n; k++) {
        cr = &cctx->regions[k];

        if (cr->state == 0 && cr->rg->attached
            && cr->rg->generation == cr->generation)
        {
            msv_cmd_abandon(cr->rg->att.rg.ctrl, (int32_t) ngx_pid);
        }
    }
}


/*
 * The answer once every worker answered: the outcome summed over them and
 * each worker's own.  A worker that went away meanwhile makes it a 503.
 */
static ngx_int_t
ngx_http_maskserve_cmd_answer(ngx_http_maskserve_cmd_ctx_t *cctx)
{
    u_char                           *p, *msg;
    size_t                            len;
    uint64_t                          count;
    ngx_buf_t                        *b;
    ngx_uint_t                        k, was;
    ngx_http_request_t               *r;
    ngx_http_maskserve_err_t          err;
    ngx_http_maskserve_cmd_region_t  *cr;

    r = cctx->r;
    count = 0;
    was = 0;

    for (k = 0; k < cctx->n; k++) {
        cr = &cctx->regions[k];

        if (cr->state < 0 || cr->res.status != 0) {
            msg = ngx_pnalloc(r->pool, cr->rg->name.len + 2 * MSV_CMD_MSG_MAX);
            if (msg == NULL) {
                return NGX_HTTP_INTERNAL_SERVER_ERROR;
            }

            /* a checkpoint that does not fit is the client's error (400,
             * naming the field); a backend that cannot update, 501 */
            ngx_memzero(&err, sizeof(ngx_http_maskserve_err_t));
            ngx_http_maskserve_set_error(&err,
                cr->state < 0 ? NGX_HTTP_SERVICE_UNAVAILABLE
                : cr->res.status == -EINVAL ? NGX_HTTP_BAD_REQUEST
                : cr->res.status == -ENOTSUP ? NGX_HTTP_NOT_IMPLEMENTED
                : cr->res.status == -EBUSY ? NGX_HTTP_CONFLICT
                : NGX_HTTP_INTERNAL_SERVER_ERROR,
                cr->state >= 0 && cr->res.status == -EINVAL
                ? NGX_HTTP_MASKSERVE_INVALID : NGX_HTTP_MASKSERVE_SERVER,
                cr->state >= 0 && cr->res.status == -EINVAL
                && cctx->op == MSV_OP_UPDATE ? "model_path" : NULL,
                msg,
                ngx_snprintf(msg, cr->rg->name.len + 2 * MSV_CMD_MSG_MAX,
                             "worker \"%V\": %s%s", &cr->rg->name,
                             cr->state < 0 ? "went away before it answered"
                                           : "",
                             cr->state < 0 ? "" : cr->res.msg) - msg);
            return ngx_http_maskserve_send_error(r, &err);
        }

        count += cr->res.count;
        if (cr->res.was_paused != MSV_RUNNING) {
            was++;
        }
    }

    len = 512 + MSV_VERSION_MAX + cctx->n * (256 + MSV_CMD_MSG_MAX * 6);

    for (k = 0; k < cctx->n; k++) {
        len += cctx->regions[k].rg->name.len;
    }

    b = ngx_create_temp_buf(r->pool, len);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p = b->last;

    switch (cctx->op) {

    case MSV_OP_PAUSE:
        p = ngx_sprintf(p, "{\"paused\":true,\"mode\":\"%s\","
                        "\"was_paused\":%s,\"%s\":%uL,",
                        ngx_http_maskserve_pause_modes[cctx->arg],
                        was == cctx->n ? "true" : "false",
                        cctx->arg == MSV_PAUSE_KEEP ? "kept" : "aborted",
                        cctx->arg == MSV_PAUSE_WAIT ? 0 : count);
        break;

    case MSV_OP_RESUME:
        p = ngx_sprintf(p, "{\"paused\":false,\"resumed\":%s,",
                        was ? "true" : "false");
        break;

    case MSV_OP_UPDATE:
        p = ngx_sprintf(p, "{\"updated\":true,\"weight_version\":\"%s\","
                        "\"mode\":\"%s\",\"%s\":%uL,\"pause_seconds\":%.3f,",
                        cctx->version,
                        ngx_http_maskserve_pause_modes[cctx->arg],
                        cctx->arg == MSV_PAUSE_KEEP ? "kept" : "aborted",
                        cctx->arg == MSV_PAUSE_WAIT ? 0 : count,
                        (double) atomic_load_explicit(
                            &cctx->regions[0].rg->att.rg.ctrl->weight_pause_ms,
                            memory_order_relaxed) / 1000);
        break;

    default: /* MSV_OP_FLUSH_CACHE */
        p = ngx_sprintf(p, "{\"flushed\":true,\"pages_dropped\":%uL,",
                        count);
        break;
    }

    p = ngx_sprintf(p, "\"seconds\":%.3f,\"workers\":[",
                    (double) (ngx_current_msec - cctx->start) / 1000);

    for (k = 0; k < cctx->n; k++) {
        cr = &cctx->regions[k];

        p = ngx_sprintf(p, "%s{\"name\":\"%V\",\"was_paused\":%s,"
                        "\"count\":%uD,\"seconds\":%.3f,\"message\":\"",
                        k ? "," : "", &cr->rg->name,
                        cr->res.was_paused != MSV_RUNNING ? "true" : "false",
                        cr->res.count,
                        (double) (cr->res.t_done_ns - cr->res.t_taken_ns)
                        / 1e9);
        p = (u_char *) ngx_escape_json(p, (u_char *) cr->res.msg,
                                       ngx_strnlen((u_char *) cr->res.msg,
                                                   MSV_CMD_MSG_MAX));
        p = ngx_cpymem(p, "\"}", 2);
    }

    p = ngx_cpymem(p, "]}\n", 3);
    b->last = p;

    return ngx_http_maskserve_send_json(r, NGX_HTTP_OK, b);
}


/* ------------------------------------------------------------------ */
/* Abort requests                                                       */

/*
 * {"request_ids": [...]}: cancel each request of the list in flight on
 * the location's workers; absent, null or [] cancels every one.  Answers
 * the ids found (each once, whatever number of slots it holds) and the
 * ids of the list that are not in flight here.
 */
static void
ngx_http_maskserve_abort_requests_body(ngx_http_request_t *r)
{
    u_char                          *p;
    size_t                           len;
    uint32_t                         st, i;
    uint64_t                         ck;
    yajl_val                         v, ids, e;
    ngx_buf_t                       *b;
    ngx_uint_t                       k, j, n, nids, nfound, all, kick;
    ngx_str_t                       *found;
    struct msv_ctrl                 *c;
    struct msv_slot                 *s;
    ngx_http_maskserve_err_t         err;
    ngx_http_maskserve_region_t     *rg;
    ngx_http_maskserve_loc_conf_t   *lcf;
    ngx_http_maskserve_main_conf_t  *mcf;
    u_char                          *hit;
    yajl_val                         ah;
    ngx_uint_t                       hosts;
    ngx_str_t                        star = ngx_string("*"), one;
    static const char               *path[] = { "request_ids", NULL };
    static const char               *hpath[] = { "all_hosts", NULL };

    ngx_memzero(&err, sizeof(ngx_http_maskserve_err_t));

    v = ngx_http_maskserve_ctl_json(r, &err);
    if (v == NULL) {
        ngx_http_maskserve_ctl_fail(r, &err);
        return;
    }

    for (j = 0; j < v->u.object.len; j++) {
        if (ngx_strcmp(v->u.object.keys[j], "request_ids") != 0
            && ngx_strcmp(v->u.object.keys[j], "all_hosts") != 0)
        {
            (void) ngx_http_maskserve_ctl_only(r, v, NULL, &err);
            ngx_http_maskserve_ctl_fail(r, &err);
            return;
        }
    }

    mcf = ngx_http_get_module_main_conf(r, ngx_http_maskserve_module);

    ah = yajl_tree_get(v, hpath, yajl_t_any);
    hosts = 0;

    if (ah != NULL && !YAJL_IS_NULL(ah)) {
        if (!YAJL_IS_TRUE(ah) && !YAJL_IS_FALSE(ah)) {
            ngx_http_maskserve_error(&err, NGX_HTTP_BAD_REQUEST,
                                     NGX_HTTP_MASKSERVE_INVALID, "all_hosts",
                                     "all_hosts must be a boolean");
            ngx_http_maskserve_ctl_fail(r, &err);
            return;
        }

        hosts = YAJL_IS_TRUE(ah);

        if (hosts && (!mcf->redis_on
                      || !ngx_http_maskserve_redis_connected()))
        {
            ngx_http_maskserve_error(&err, NGX_HTTP_SERVICE_UNAVAILABLE,
                                     NGX_HTTP_MASKSERVE_OVERLOAD,
                                     "all_hosts",
                                     "all_hosts needs Redis (maskserve_redis),"
                                     " which is not connected");
            ngx_http_maskserve_ctl_fail(r, &err);
            return;
        }
    }

    ids = yajl_tree_get(v, path, yajl_t_any);
    nids = 0;

    if (ids != NULL && !YAJL_IS_NULL(ids)) {
        if (!YAJL_IS_ARRAY(ids)) {
            ngx_http_maskserve_error(&err, NGX_HTTP_BAD_REQUEST,
                                     NGX_HTTP_MASKSERVE_INVALID,
                                     "request_ids",
                                     "request_ids must be an array of "
                                     "request ids");
            ngx_http_maskserve_ctl_fail(r, &err);
            return;
        }

        nids = ids->u.array.len;

        for (j = 0; j < nids; j++) {
            e = ids->u.array.values[j];

            if (!YAJL_IS_STRING(e)
                || !ngx_http_maskserve_id_valid((u_char *) e->u.string,
                                                ngx_strlen(e->u.string)))
            {
                ngx_http_maskserve_error(&err, NGX_HTTP_BAD_REQUEST,
                                         NGX_HTTP_MASKSERVE_INVALID,
                                         "request_ids",
                                         "each of request_ids must be a "
                                         "string of 1 to 128 characters of "
                                         "[A-Za-z0-9._:-]");
                ngx_http_maskserve_ctl_fail(r, &err);
                return;
            }
        }
    }

    all = (nids == 0);

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_maskserve_module);

    n = ngx_http_maskserve_loc_nregions(mcf, lcf);

    /* at most one entry per slot of every region, or per listed id */
    len = nids;
    for (k = 0; mcf->running && k < n; k++) {
        rg = ngx_http_maskserve_loc_region(mcf, lcf, k);
        if (rg->attached) {
            len += rg->att.rg.ctrl->n_slots;
        }
    }

    found = ngx_pcalloc(r->pool, (len + 1) * sizeof(ngx_str_t));
    hit = ngx_pcalloc(r->pool, nids + 1);
    if (found == NULL || hit == NULL) {
        ngx_http_maskserve_ctl_fail(r, &err);
        return;
    }

    nfound = 0;

    for (k = 0; mcf->running && k < n; k++) {
        rg = ngx_http_maskserve_loc_region(mcf, lcf, k);

        if (!rg->attached) {
            continue;
        }

        c = rg->att.rg.ctrl;
        kick = 0;

        for (i = 0; i < c->n_slots; i++) {
            st = msv_slot_state(c, i);

            if (st != MSV_SLOT_SUBMITTED && st != MSV_SLOT_RUNNING) {
                continue;
            }

            s = msv_slot_at(c, i);
            ck = s->cookie;

            if (!all) {
                for (j = 0; j < nids; j++) {
                    e = ids->u.array.values[j];
                    if (ngx_strncmp(s->request_id, e->u.string,
                                    MSV_REQ_ID_MAX + 1) == 0)
                    {
                        break;
                    }
                }

                if (j == nids) {
                    continue;
                }
            }

            /* the slot may have changed hands while we compared */
            if (s->cookie != ck || msv_slot_state(c, i) != st) {
                continue;
            }

            msv_slot_cancel(c, i, ck);
            kick = 1;

            if (!all) {
                if (!hit[j]) {
                    hit[j] = 1;
                    e = ids->u.array.values[j];
                    found[nfound].data = (u_char *) e->u.string;
                    found[nfound].len = ngx_strlen(found[nfound].data);
                    nfound++;
                }
                continue;
            }

            /* every request once, however many slots it holds */
            len = ngx_strnlen((u_char *) s->request_id, MSV_REQ_ID_MAX);

            for (j = 0; j < nfound; j++) {
                if (found[j].len == len
                    && ngx_strncmp(found[j].data, s->request_id, len) == 0)
                {
                    break;
                }
            }

            if (j == nfound) {
                found[nfound].data = ngx_pnalloc(r->pool, len);
                if (found[nfound].data == NULL) {
                    ngx_http_maskserve_ctl_fail(r, &err);
                    return;
                }
                ngx_memcpy(found[nfound].data, s->request_id, len);
                found[nfound].len = len;
                nfound++;
            }
        }

        if (kick) {
            msv_kick(rg->att.kick_fd);
        }
    }

    if (nfound) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "maskserve: %ui requests aborted by abort_requests",
                      nfound);
    }

    /* every other host: the ids not found here, or "*" for all */
    if (hosts && all) {
        ngx_http_maskserve_redis_publish_abort(&star);
    }

    for (j = 0; hosts && j < nids; j++) {
        if (!hit[j]) {
            one.data = (u_char *) ids->u.array.values[j]->u.string;
            one.len = ngx_strlen(one.data);
            ngx_http_maskserve_redis_publish_abort(&one);
        }
    }

    len = 96;
    for (j = 0; j < nfound; j++) {
        len += found[j].len + 3;
    }
    for (j = 0; j < nids; j++) {
        len += ngx_strlen(ids->u.array.values[j]->u.string) + 3;
    }

    b = ngx_create_temp_buf(r->pool, len);
    if (b == NULL) {
        ngx_http_maskserve_ctl_fail(r, &err);
        return;
    }

    /* ids are of [A-Za-z0-9._:-]: nothing to escape */
    p = ngx_sprintf(b->last, "{\"aborted\":%ui,\"request_ids\":[", nfound);

    for (j = 0; j < nfound; j++) {
        p = ngx_sprintf(p, "%s\"%V\"", j ? "," : "", &found[j]);
    }

    p = ngx_cpymem(p, "],\"not_found\":[", 15);

    for (k = 0, j = 0; j < nids; j++) {
        if (hit[j]) {
            continue;
        }

        p = ngx_sprintf(p, "%s\"%s\"", k++ ? "," : "",
                        ids->u.array.values[j]->u.string);
    }

    p = ngx_sprintf(p, "],\"all_hosts\":%s}\n", hosts ? "true" : "false");
    b->last = p;

    ngx_http_finalize_request(r,
                              ngx_http_maskserve_send_json(r, NGX_HTTP_OK, b));
}


ngx_uint_t
ngx_http_maskserve_abort_all_local(ngx_http_maskserve_main_conf_t *mcf)
{
    uint32_t                      st, i;
    uint64_t                      ck;
    ngx_uint_t                    k, n, kick;
    struct msv_ctrl              *c;
    ngx_http_maskserve_region_t  *rg;

    n = 0;

    for (k = 0; k < mcf->regions.nelts; k++) {
        rg = ngx_http_maskserve_region(mcf, k);

        if (!rg->attached) {
            continue;
        }

        c = rg->att.rg.ctrl;
        kick = 0;

        for (i = 0; i < c->n_slots; i++) {
            st = msv_slot_state(c, i);

            if (st != MSV_SLOT_SUBMITTED && st != MSV_SLOT_RUNNING) {
                continue;
            }

            ck = msv_slot_at(c, i)->cookie;
            if (msv_slot_state(c, i) != st) {
                continue;
            }

            msv_slot_cancel(c, i, ck);
            kick = 1;
            n++;
        }

        if (kick) {
            msv_kick(rg->att.kick_fd);
        }
    }

    if (n) {
        ngx_log_error(NGX_LOG_INFO, mcf->log, 0, "maskserve: %ui requests "
                      "aborted by abort_requests of another host", n);
    }

    return n;
}


/* ------------------------------------------------------------------ */
/* Models                                                               */

static ngx_int_t
ngx_http_maskserve_ctl_get(ngx_http_request_t *r)
{
    ngx_int_t                 rc;
    ngx_http_maskserve_err_t  err;

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    if (r->method != NGX_HTTP_GET && r->method != NGX_HTTP_HEAD) {
        ngx_memzero(&err, sizeof(ngx_http_maskserve_err_t));
        ngx_http_maskserve_error(&err, NGX_HTTP_NOT_ALLOWED,
                                 NGX_HTTP_MASKSERVE_INVALID, NULL,
                                 "only GET is allowed here");
        return ngx_http_maskserve_send_error(r, &err);
    }

    return NGX_OK;
}


#define NGX_HTTP_MASKSERVE_MODEL_MID                                          \
    "\",\"object\":\"model\",\"created\":0,\"owned_by\":\"maskserve\","        \
    "\"root\":\""


/*
 * OpenAI's and vLLM's list of models: one entry per model name among the
 * location's attached workers (the first worker's facts for each).
 */
ngx_int_t
ngx_http_maskserve_models_handler(ngx_http_request_t *r)
{
    u_char                          *p;
    size_t                           len;
    ngx_int_t                        rc;
    ngx_buf_t                       *b;
    ngx_uint_t                       i, k, n, listed;
    struct msv_ctrl                 *c, *o;
    ngx_http_maskserve_region_t     *rg, *og;
    ngx_http_maskserve_loc_conf_t   *lcf;
    ngx_http_maskserve_main_conf_t  *mcf;

    rc = ngx_http_maskserve_ctl_get(r);
    if (rc != NGX_OK) {
        return rc;
    }

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_maskserve_module);
    mcf = ngx_http_get_module_main_conf(r, ngx_http_maskserve_module);

    n = mcf->running ? ngx_http_maskserve_loc_nregions(mcf, lcf) : 0;

    len = 64 + n * (512 + 2 * 6 * sizeof(c->model)
                    + 2 * 6 * sizeof(c->weight_version));

    b = ngx_create_temp_buf(r->pool, len);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p = ngx_cpymem(b->last, "{\"object\":\"list\",\"data\":[", 25);
    listed = 0;

    for (i = 0; i < n; i++) {
        rg = ngx_http_maskserve_loc_region(mcf, lcf, i);

        if (!rg->attached) {
            continue;
        }

        c = rg->att.rg.ctrl;

        for (k = 0; k < i; k++) {
            og = ngx_http_maskserve_loc_region(mcf, lcf, k);
            if (!og->attached) {
                continue;
            }
            o = og->att.rg.ctrl;
            if (ngx_strncmp(o->model, c->model, sizeof(c->model)) == 0) {
                break;
            }
        }

        if (k < i) {
            continue;
        }

        len = ngx_strnlen((u_char *) c->model, sizeof(c->model));

        if (listed++) {
            *p++ = ',';
        }

        p = ngx_cpymem(p, "{\"id\":\"", 7);
        p = (u_char *) ngx_escape_json(p, (u_char *) c->model, len);
        p = ngx_cpymem(p, NGX_HTTP_MASKSERVE_MODEL_MID,
                       sizeof(NGX_HTTP_MASKSERVE_MODEL_MID) - 1);
        p = (u_char *) ngx_escape_json(p, (u_char *) c->model, len);
        p = ngx_sprintf(p, "\",\"parent\":null,\"max_model_len\":%uD,"
                        "\"vocab_size\":%uD,\"weight_version\":\"",
                        c->max_model_len, c->vocab_size);
        p = (u_char *) ngx_escape_json(p, (u_char *) c->weight_version,
                                       ngx_strnlen((u_char *)
                                                   c->weight_version,
                                                   MSV_VERSION_MAX));
        p = ngx_cpymem(p, "\"}", 2);
    }

    p = ngx_cpymem(p, "]}\n", 3);
    b->last = p;

    return ngx_http_maskserve_send_json(r, NGX_HTTP_OK, b);
}


/* ------------------------------------------------------------------ */
/* Metrics                                                              */

/*
 * Prometheus text exposition: every family once (HELP, TYPE), then one
 * sample per worker (label worker="name").  The counters are the
 * workers' own, in their control pages, so every nginx process answers
 * the same; the module adds what it sees of each worker (attached,
 * heartbeat age, slots in use across the host's processes).
 */

typedef struct {
    const char   *name;
    const char   *type;
    const char   *help;
} ngx_http_maskserve_metric_t;


static ngx_http_maskserve_metric_t  ngx_http_maskserve_metrics[] = {
    { "maskserve_up", "gauge",
      "1 when nginx is attached to the worker and it is ready" },
    { "maskserve_paused", "gauge",
      "0 running, 1 pausing (mode wait, requests finishing), 2 paused" },
    { "maskserve_weight_version_info", "gauge",
      "the version of the weights the worker serves (label version)" },
    { "maskserve_heartbeat_age_seconds", "gauge",
      "age of the worker's last heartbeat" },
    { "maskserve_requests_running", "gauge",
      "requests admitted and not finished" },
    { "maskserve_requests_waiting", "gauge",
      "requests submitted and not admitted" },
    { "maskserve_requests_preempted", "gauge",
      "running requests without KV pages right now" },
    { "maskserve_slots_in_use", "gauge",
      "request slots held, by every nginx process of the host" },
    { "maskserve_requests_finished_total", "counter",
      "requests ended, by finish reason" },
    { "maskserve_requests_aborted_total", "counter",
      "requests ended with finish reason abort, by abort reason" },
    { "maskserve_prompt_tokens_total", "counter",
      "prompt tokens of the requests admitted" },
    { "maskserve_generation_tokens_total", "counter",
      "tokens generated" },
    { "maskserve_prefill_tokens_total", "counter",
      "prompt tokens computed (not found in the prefix cache)" },
    { "maskserve_steps_total", "counter",
      "model steps run" },
    { "maskserve_step_duration_seconds", "histogram",
      "time of a model step (admission, forward, sampling, publication)" },
    { "maskserve_step_batch_sequences", "histogram",
      "sequences in a model step" },
    { "maskserve_rows_total", "counter",
      "rows published (one per token, and abort rows), by mask mode" },
    { "maskserve_row_bytes_total", "counter",
      "bytes of those rows in the ring (masks, logprobs), by mask mode" },
    { "maskserve_kv_used_pages", "gauge",
      "KV pages held by sequences" },
    { "maskserve_kv_cached_pages", "gauge",
      "KV pages held by no sequence, kept for prefix reuse" },
    { "maskserve_kv_free_pages", "gauge",
      "KV pages free" },
    { "maskserve_kv_page_tokens", "gauge",
      "tokens per KV page" },
    { "maskserve_kv_evictions_total", "counter",
      "cached KV pages taken for reuse" },
    { "maskserve_preemptions_total", "counter",
      "sequences preempted (their pages taken back)" },
    { "maskserve_prefix_query_tokens_total", "counter",
      "prompt tokens admissions looked up in the prefix cache" },
    { "maskserve_prefix_hit_tokens_total", "counter",
      "of those, tokens found cached" },
    { "maskserve_cache_flushes_total", "counter",
      "prefix cache flushes" },
    { "maskserve_weight_updates_total", "counter",
      "weight updates done" },
    { "maskserve_weight_update_failures_total", "counter",
      "weight updates refused or failed (the old weights served on)" },
    { "maskserve_weight_update_seconds", "gauge",
      "duration of the last weight update, load to swap" },
    { "maskserve_weight_update_pause_seconds", "gauge",
      "of that, the time between two steps (no step ran)" },
    { "maskserve_ring_waits_total", "counter",
      "times the worker waited for a reader to free ring space" },
    { "maskserve_readers_evicted_total", "counter",
      "readers the worker gave up on" },
    { NULL, NULL, NULL }
};


#define NGX_HTTP_MASKSERVE_METRIC_LINE  (MSV_NAME_MAX + MSV_VERSION_MAX + 128)


ngx_int_t
ngx_http_maskserve_metrics_handler(ngx_http_request_t *r)
{
    static ngx_str_t                 type =
        ngx_string("text/plain; version=0.0.4; charset=utf-8");
    u_char                          *p;
    size_t                           len;
    ngx_int_t                        rc;
    ngx_buf_t                       *b;
    ngx_uint_t                       i, m, n;
    ngx_http_maskserve_region_t     *rg;
    ngx_http_maskserve_loc_conf_t   *lcf;
    ngx_http_maskserve_main_conf_t  *mcf;

    rc = ngx_http_maskserve_ctl_get(r);
    if (rc != NGX_OK) {
        return rc;
    }

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_maskserve_module);
    mcf = ngx_http_get_module_main_conf(r, ngx_http_maskserve_module);

    n = ngx_http_maskserve_loc_nregions(mcf, lcf);

    /* per family: its header, then at most 16 samples per worker */
    len = 0;
    for (m = 0; ngx_http_maskserve_metrics[m].name; m++) {
        len += 256 + n * 16 * NGX_HTTP_MASKSERVE_METRIC_LINE;
    }

    len += NGX_HTTP_MASKSERVE_STATS_TEXT;

    b = ngx_create_temp_buf(r->pool, len);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p = b->last;

    for (m = 0; ngx_http_maskserve_metrics[m].name; m++) {
        p = ngx_sprintf(p, "# HELP %s %s\n# TYPE %s %s\n",
                        ngx_http_maskserve_metrics[m].name,
                        ngx_http_maskserve_metrics[m].help,
                        ngx_http_maskserve_metrics[m].name,
                        ngx_http_maskserve_metrics[m].type);

        for (i = 0; i < n; i++) {
            rg = ngx_http_maskserve_loc_region(mcf, lcf, i);

            if (m == 0) {
                p = ngx_sprintf(p, "maskserve_up{worker=\"%V\"} %d\n",
                                &rg->name, mcf->running
                                && ngx_http_maskserve_attach_ready(rg)
                                   == NGX_OK);
                continue;
            }

            if (mcf->running && rg->attached) {
                p = ngx_http_maskserve_metrics_region(p, rg, m);
            }
        }
    }

    /* nginx's own, every worker process summed */
    p = ngx_http_maskserve_stats_metrics(mcf, p);

    b->last = p;

    return ngx_http_maskserve_send_buf(r, NGX_HTTP_OK, &type, b);
}


/* The samples of family m for one attached worker. */
static u_char *
ngx_http_maskserve_metrics_region(u_char *p, ngx_http_maskserve_region_t *rg,
    ngx_uint_t m)
{
    uint32_t          census[6], pt;
    uint64_t          v, hb, now, total, freet, cached;
    ngx_uint_t        k;
    ngx_str_t        *w;
    struct msv_ctrl  *c;
    const char       *name;

    static const char  *finish[] = { NULL, "stop", "length", "abort" };
    static const char  *abort[] = { NULL, "cancelled", "shutdown",
                                    "invalid", "no_kv", "internal",
                                    "paused" };

#define msv_load(f)  atomic_load_explicit(&c->f, memory_order_relaxed)

    c = rg->att.rg.ctrl;
    w = &rg->name;
    name = ngx_http_maskserve_metrics[m].name;

    pt = c->kv_page_tokens ? c->kv_page_tokens : 1;
    total = msv_load(kv_tokens_total) / pt;
    freet = msv_load(kv_tokens_free) / pt;      /* free + cached */
    cached = msv_load(kv_tokens_cached) / pt;

    if (ngx_strcmp(name, "maskserve_weight_version_info") == 0) {
        return ngx_sprintf(p, "%s{worker=\"%V\",version=\"%*s\"} 1\n", name,
                           w, ngx_strnlen((u_char *) c->weight_version,
                                          MSV_VERSION_MAX),
                           c->weight_version);
    }

    if (ngx_strcmp(name, "maskserve_heartbeat_age_seconds") == 0) {
        hb = msv_load(heartbeat_ns);
        now = msv_now_ns();
        return ngx_sprintf(p, "%s{worker=\"%V\"} %.3f\n", name, w,
                           now > hb ? (double) (now - hb) / 1e9 : 0.0);
    }

    if (ngx_strcmp(name, "maskserve_weight_update_seconds") == 0
        || ngx_strcmp(name, "maskserve_weight_update_pause_seconds") == 0)
    {
        v = ngx_strcmp(name, "maskserve_weight_update_seconds") == 0
            ? msv_load(weight_update_ms) : msv_load(weight_pause_ms);
        return ngx_sprintf(p, "%s{worker=\"%V\"} %.3f\n", name, w,
                           (double) v / 1000);
    }

    if (ngx_strcmp(name, "maskserve_step_duration_seconds") == 0) {
        static const char  *le[MSV_STEP_BUCKETS] = {
            "0.001", "0.002", "0.005", "0.01", "0.02", "0.05", "0.1", "0.2",
            "0.5", "1", "2", "+Inf"
        };

        for (k = 0, v = 0; k < MSV_STEP_BUCKETS; k++) {
            v += msv_load(step_hist[k]);
            p = ngx_sprintf(p, "%s_bucket{worker=\"%V\",le=\"%s\"} %uL\n",
                            name, w, le[k], v);
        }
        p = ngx_sprintf(p, "%s_sum{worker=\"%V\"} %.6f\n", name, w,
                        (double) msv_load(step_us_sum) / 1e6);
        return ngx_sprintf(p, "%s_count{worker=\"%V\"} %uL\n", name, w, v);
    }

    if (ngx_strcmp(name, "maskserve_step_batch_sequences") == 0) {
        for (k = 0, v = 0; k < MSV_BATCH_BUCKETS; k++) {
            v += msv_load(batch_hist[k]);
            if (k < MSV_BATCH_BUCKETS - 1) {
                p = ngx_sprintf(p, "%s_bucket{worker=\"%V\",le=\"%ui\"} "
                                "%uL\n", name, w, (ngx_uint_t) 1 << k, v);
            } else {
                p = ngx_sprintf(p, "%s_bucket{worker=\"%V\",le=\"+Inf\"} "
                                "%uL\n", name, w, v);
            }
        }
        p = ngx_sprintf(p, "%s_sum{worker=\"%V\"} %uL\n", name, w,
                        msv_load(batch_sum));
        return ngx_sprintf(p, "%s_count{worker=\"%V\"} %uL\n", name, w, v);
    }

    if (ngx_strcmp(name, "maskserve_requests_finished_total") == 0) {
        for (k = 1; k < 4; k++) {
            p = ngx_sprintf(p, "%s{worker=\"%V\",reason=\"%s\"} %uL\n", name,
                            w, finish[k], msv_load(finished[k]));
        }
        return p;
    }

    if (ngx_strcmp(name, "maskserve_rows_total") == 0
        || ngx_strcmp(name, "maskserve_row_bytes_total") == 0)
    {
        static const char  *mode[] = { "off", "selected", "support" };

        for (k = 0; k < 3; k++) {
            p = ngx_sprintf(p, "%s{worker=\"%V\",mode=\"%s\"} %uL\n", name,
                            w, mode[k],
                            ngx_strcmp(name, "maskserve_rows_total") == 0
                            ? msv_load(rows_by_mode[k])
                            : msv_load(row_bytes_by_mode[k]));
        }
        return p;
    }

    if (ngx_strcmp(name, "maskserve_requests_aborted_total") == 0) {
        for (k = 1; k < 7; k++) {
            p = ngx_sprintf(p, "%s{worker=\"%V\",reason=\"%s\"} %uL\n", name,
                            w, abort[k], msv_load(aborted[k]));
        }
        return p;
    }

    if (ngx_strcmp(name, "maskserve_slots_in_use") == 0) {
        msv_slot_census(c, census);
        v = c->n_slots - census[MSV_SLOT_FREE];

    } else if (ngx_strcmp(name, "maskserve_paused") == 0) {
        v = msv_load(paused);
    } else if (ngx_strcmp(name, "maskserve_requests_running") == 0) {
        v = msv_load(running);
    } else if (ngx_strcmp(name, "maskserve_requests_waiting") == 0) {
        v = msv_load(waiting);
    } else if (ngx_strcmp(name, "maskserve_requests_preempted") == 0) {
        v = msv_load(preempted);
    } else if (ngx_strcmp(name, "maskserve_prompt_tokens_total") == 0) {
        v = msv_load(prompt_tokens);
    } else if (ngx_strcmp(name, "maskserve_generation_tokens_total") == 0) {
        v = msv_load(tokens);
    } else if (ngx_strcmp(name, "maskserve_prefill_tokens_total") == 0) {
        v = msv_load(prefill_tokens);
    } else if (ngx_strcmp(name, "maskserve_steps_total") == 0) {
        v = msv_load(steps);
    } else if (ngx_strcmp(name, "maskserve_kv_used_pages") == 0) {
        v = total > freet ? total - freet : 0;
    } else if (ngx_strcmp(name, "maskserve_kv_cached_pages") == 0) {
        v = cached;
    } else if (ngx_strcmp(name, "maskserve_kv_free_pages") == 0) {
        v = freet > cached ? freet - cached : 0;
    } else if (ngx_strcmp(name, "maskserve_kv_page_tokens") == 0) {
        v = c->kv_page_tokens;
    } else if (ngx_strcmp(name, "maskserve_kv_evictions_total") == 0) {
        v = msv_load(kv_evictions);
    } else if (ngx_strcmp(name, "maskserve_preemptions_total") == 0) {
        v = msv_load(preemptions);
    } else if (ngx_strcmp(name, "maskserve_prefix_query_tokens_total") == 0) {
        v = msv_load(prefix_query_tokens);
    } else if (ngx_strcmp(name, "maskserve_prefix_hit_tokens_total") == 0) {
        v = msv_load(prefix_hit_tokens);
    } else if (ngx_strcmp(name, "maskserve_cache_flushes_total") == 0) {
        v = msv_load(cache_flushes);
    } else if (ngx_strcmp(name, "maskserve_weight_updates_total") == 0) {
        v = msv_load(weight_updates);
    } else if (ngx_strcmp(name,
                          "maskserve_weight_update_failures_total") == 0)
    {
        v = msv_load(weight_update_failures);
    } else if (ngx_strcmp(name, "maskserve_ring_waits_total") == 0) {
        v = msv_load(ring_waits);
    } else if (ngx_strcmp(name, "maskserve_readers_evicted_total") == 0) {
        v = msv_load(readers_evicted);
    } else {
        return p;
    }

#undef msv_load

    return ngx_sprintf(p, "%s{worker=\"%V\"} %uL\n", name, w, v);
}

