/*
 * ngx_http_maskserve_parse.c: streaming JSON parsing of request bodies
 * with yajl, and their validation.
 *
 * The parser is a small state machine driven by yajl's callbacks: a stack
 * of frames (root object, sampling_params, logit_bias, token_ids,
 * stop_token_ids), the field the next value belongs to, and a depth
 * counter that skips the values of unknown keys whatever their shape.
 * Numbers arrive as raw text (yajl_number) so that integers are parsed
 * exactly, seeds up to 2^64 - 1 included.  Strings are copied into the
 * request pool: yajl's pointers are only valid during the callback.
 *
 * The fields of sampling_params, their types, ranges and defaults are
 * the table msv_param_rules (shm/msv_params.c), shared with the worker,
 * the slot code and maskserve-cli; this file only walks the JSON.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include <yajl/yajl_parse.h>

#include "msv_params.h"
#include "ngx_http_maskserve_module.h"
#include "ngx_http_maskserve_util.h"
#include "ngx_http_maskserve_parse.h"


/* unknown keys remembered per request, to refuse duplicates among them */
#define NGX_HTTP_MASKSERVE_KEYS_MIN  16


typedef enum {
    MSV_FR_TOP = 0,     /* before the root value */
    MSV_FR_ROOT,        /* the root object */
    MSV_FR_SP,          /* sampling_params */
    MSV_FR_BIAS,        /* sampling_params.logit_bias */
    MSV_FR_TOKENS,      /* token_ids */
    MSV_FR_STOP,        /* sampling_params.stop_token_ids */
    MSV_FR_END          /* after the root value */
} ngx_http_maskserve_frame_e;


typedef enum {
    MSV_K_UNKNOWN = 0,
    MSV_K_REQUEST_ID,
    MSV_K_TOKEN_IDS,
    MSV_K_SAMPLING_PARAMS,
    MSV_K_STREAM,
    MSV_K_RETURN_MASK,
    MSV_K_MODE,
    MSV_K_MASK_FORMAT,
    MSV_K_PARAM         /* a field of sampling_params: ps->rule */
} ngx_http_maskserve_key_e;


typedef enum {
    MSV_V_NULL = 0,
    MSV_V_BOOL,
    MSV_V_NUMBER,
    MSV_V_STRING,
    MSV_V_MAP,
    MSV_V_ARRAY
} ngx_http_maskserve_vtype_e;


typedef struct {
    ngx_str_t                      name;
    ngx_uint_t                     key;
    const char                    *param;   /* as named in errors */
} ngx_http_maskserve_field_t;


/* an unknown key seen, in the set that finds duplicates among them */
typedef struct {
    ngx_uint_t                     hash;    /* 0: empty entry */
    ngx_uint_t                     frame;
    ngx_str_t                      name;
} ngx_http_maskserve_key_t;


typedef struct {
    ngx_http_request_t            *r;
    ngx_http_maskserve_gen_t      *g;       /* NULL: an abort body */
    ngx_str_t                     *abort_id;
    ngx_http_maskserve_err_t      *err;

    ngx_uint_t                     stack[4];
    ngx_uint_t                     depth;   /* frames on the stack */
    ngx_uint_t                     skip;    /* nesting of a skipped value */
    ngx_http_maskserve_field_t    *field;   /* the next value's field */
    const struct msv_param_rule   *rule;    /* its rule, in sampling_params */
    uint32_t                       seen[2]; /* keys seen: root, params */
    int32_t                        bias_id;

    ngx_http_maskserve_key_t      *keys;    /* unknown keys: open hash */
    ngx_uint_t                     n_keys;
    ngx_uint_t                     keys_cap;

    yajl_handle                    h;
    size_t                         end;     /* the root's end in its chunk */

    ngx_array_t                    tokens;  /* int32_t */
    ngx_array_t                    bias;    /* struct msv_bias */

    unsigned                       mask:1;
    unsigned                       support:1;
    unsigned                       seen_abort_id:1;
    unsigned                       ended:1; /* the root object is closed */
} ngx_http_maskserve_ps_t;


typedef struct {
    u_char                        *pos;
    const unsigned char           *s;
    size_t                         len;
} ngx_http_maskserve_value_t;


static ngx_int_t ngx_http_maskserve_parse_body(ngx_http_maskserve_ps_t *ps);
static ngx_int_t ngx_http_maskserve_parse_chunk(ngx_http_maskserve_ps_t *ps,
    u_char *p, size_t n);
static int ngx_http_maskserve_unknown_key(ngx_http_maskserve_ps_t *ps,
    ngx_uint_t frame, const unsigned char *s, size_t len);
static ngx_int_t ngx_http_maskserve_yajl_status(ngx_http_maskserve_ps_t *ps,
    yajl_handle h, yajl_status status);
static void ngx_http_maskserve_yajl_cleanup(void *data);
static int ngx_http_maskserve_fail(ngx_http_maskserve_ps_t *ps,
    const char *param, const char *fmt, ...);
static ngx_int_t ngx_http_maskserve_invalid(ngx_http_request_t *r,
    ngx_http_maskserve_err_t *err, const char *param, const char *fmt, ...);
static ngx_int_t ngx_http_maskserve_vinvalid(ngx_http_request_t *r,
    ngx_http_maskserve_err_t *err, const char *param, const char *fmt,
    va_list args);
static int ngx_http_maskserve_value(ngx_http_maskserve_ps_t *ps,
    ngx_uint_t type, const unsigned char *s, size_t len, int b);
static int ngx_http_maskserve_root_value(ngx_http_maskserve_ps_t *ps,
    ngx_http_maskserve_field_t *f, ngx_uint_t type, const unsigned char *s,
    size_t len, int b);
static int ngx_http_maskserve_sp_value(ngx_http_maskserve_ps_t *ps,
    const struct msv_param_rule *rule, ngx_uint_t type,
    const unsigned char *s, size_t len, int b);
static int ngx_http_maskserve_push(ngx_http_maskserve_ps_t *ps,
    ngx_uint_t frame);
static int ngx_http_maskserve_bias_cmp(const void *a, const void *b);

static int ngx_http_maskserve_on_null(void *ctx);
static int ngx_http_maskserve_on_boolean(void *ctx, int b);
static int ngx_http_maskserve_on_number(void *ctx, const char *s,
    size_t len);
static int ngx_http_maskserve_on_string(void *ctx, const unsigned char *s,
    size_t len);
static int ngx_http_maskserve_on_start_map(void *ctx);
static int ngx_http_maskserve_on_map_key(void *ctx, const unsigned char *s,
    size_t len);
static int ngx_http_maskserve_on_end_map(void *ctx);
static int ngx_http_maskserve_on_start_array(void *ctx);
static int ngx_http_maskserve_on_end_array(void *ctx);


static yajl_callbacks  ngx_http_maskserve_callbacks = {
    ngx_http_maskserve_on_null,
    ngx_http_maskserve_on_boolean,
    NULL,                                  /* integers: as numbers */
    NULL,                                  /* doubles: as numbers */
    ngx_http_maskserve_on_number,
    ngx_http_maskserve_on_string,
    ngx_http_maskserve_on_start_map,
    ngx_http_maskserve_on_map_key,
    ngx_http_maskserve_on_end_map,
    ngx_http_maskserve_on_start_array,
    ngx_http_maskserve_on_end_array
};


static ngx_http_maskserve_field_t  ngx_http_maskserve_root_fields[] = {
    { ngx_string("request_id"), MSV_K_REQUEST_ID, "request_id" },
    { ngx_string("token_ids"), MSV_K_TOKEN_IDS, "token_ids" },
    { ngx_string("sampling_params"), MSV_K_SAMPLING_PARAMS,
      "sampling_params" },
    { ngx_string("stream"), MSV_K_STREAM, "stream" },
    { ngx_string("return_sampling_mask"), MSV_K_RETURN_MASK,
      "return_sampling_mask" },
    { ngx_string("sampling_logprobs_mode"), MSV_K_MODE,
      "sampling_logprobs_mode" },
    { ngx_string("mask_format"), MSV_K_MASK_FORMAT, "mask_format" },
    { ngx_null_string, 0, NULL }
};


/* sampling_params: the table of msv_param_rules, what this stands for */
static ngx_http_maskserve_field_t  ngx_http_maskserve_param = {
    ngx_null_string, MSV_K_PARAM, NULL
};


static ngx_http_maskserve_field_t  ngx_http_maskserve_abort_fields[] = {
    { ngx_string("request_id"), MSV_K_REQUEST_ID, "request_id" },
    { ngx_null_string, 0, NULL }
};


/* what a value of an unknown key, or an array element, is filed under */
static ngx_http_maskserve_field_t  ngx_http_maskserve_unknown = {
    ngx_null_string, MSV_K_UNKNOWN, NULL
};


ngx_int_t
ngx_http_maskserve_parse_generate(ngx_http_request_t *r,
    ngx_http_maskserve_gen_t *g, ngx_http_maskserve_err_t *err)
{
    char                     msg[MSV_PARAM_ERR_MAX];
    ngx_uint_t               i;
    const char              *param;
    ngx_http_maskserve_ps_t  ps;

    ngx_memzero(g, sizeof(ngx_http_maskserve_gen_t));
    ngx_memzero(&ps, sizeof(ngx_http_maskserve_ps_t));

    msv_params_init(&g->params);

    ps.r = r;
    ps.g = g;
    ps.err = err;

    if (ngx_array_init(&ps.tokens, r->pool, 256, sizeof(int32_t)) != NGX_OK
        || ngx_array_init(&ps.bias, r->pool, 4, sizeof(struct msv_bias))
           != NGX_OK)
    {
        ngx_http_maskserve_error(err, NGX_HTTP_INTERNAL_SERVER_ERROR,
                                 NGX_HTTP_MASKSERVE_SERVER, NULL,
                                 "out of memory");
        return NGX_ERROR;
    }

    if (ngx_http_maskserve_parse_body(&ps) != NGX_OK) {
        return NGX_ERROR;
    }

    if (!g->prompt_set) {
        ngx_http_maskserve_error(err, NGX_HTTP_BAD_REQUEST,
                                 NGX_HTTP_MASKSERVE_INVALID, "token_ids",
                                 "token_ids is required");
        return NGX_ERROR;
    }

    g->prompt = ps.tokens.elts;
    g->n_prompt = ps.tokens.nelts;
    g->bias = ps.bias.elts;
    g->params.n_bias = ps.bias.nelts;

    if (ps.mask) {
        g->params.mask_mode = ps.support ? MSV_MASK_SUPPORT
                                         : MSV_MASK_SELECTED;
    }

    if (g->params.n_bias > 1) {
        ngx_qsort(g->bias, g->params.n_bias, sizeof(struct msv_bias),
                  ngx_http_maskserve_bias_cmp);

        for (i = 1; i < g->params.n_bias; i++) {
            if (g->bias[i].id == g->bias[i - 1].id) {
                ngx_http_maskserve_fail(&ps, "sampling_params.logit_bias",
                                        "logit_bias names token %D twice",
                                        g->bias[i].id);
                return NGX_ERROR;
            }
        }
    }

    /* what involves more than one field (min_tokens <= max_tokens) */
    param = msv_params_check(&g->params, g->bias, NULL, msg);
    if (param != NULL) {
        ngx_http_maskserve_fail(&ps, param, "%s", msg);
        return NGX_ERROR;
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_maskserve_check_generate(ngx_http_request_t *r,
    ngx_http_maskserve_gen_t *g, struct msv_ctrl *c,
    ngx_http_maskserve_loc_conf_t *lcf, ngx_http_maskserve_err_t *err)
{
    char               msg[MSV_PARAM_ERR_MAX];
    const char        *param;
    struct msv_limits  lim;

    msv_limits_of(c, &lim);

    param = msv_prompt_check(g->prompt, (uint32_t) ngx_min(g->n_prompt,
                                                           UINT32_MAX),
                             &lim, msg);
    if (param != NULL) {
        return ngx_http_maskserve_invalid(r, err, param, "%s", msg);
    }

    if (lcf->max_prompt && g->n_prompt > lcf->max_prompt) {
        return ngx_http_maskserve_invalid(r, err, "token_ids",
                                          "prompt of %ui tokens exceeds "
                                          "maskserve_max_prompt_tokens %ui",
                                          g->n_prompt, lcf->max_prompt);
    }

    param = msv_params_check(&g->params, g->bias, &lim, msg);
    if (param != NULL) {
        return ngx_http_maskserve_invalid(r, err, param, "%s", msg);
    }

    /* each choice takes a slot of its own, all of them at once */
    if (g->params.n > (uint32_t) lcf->max_n) {
        return ngx_http_maskserve_invalid(r, err, "sampling_params.n",
                                          "sampling_params.n %uD exceeds "
                                          "maskserve_max_n %i",
                                          g->params.n, lcf->max_n);
    }

    if (g->params.n > c->n_slots) {
        return ngx_http_maskserve_invalid(r, err, "sampling_params.n",
                                          "sampling_params.n %uD exceeds "
                                          "the worker's %uD request slots",
                                          g->params.n, c->n_slots);
    }

    /* max_tokens to the context left, top_k to the vocabulary */
    msv_params_fit(&g->params, (uint32_t) g->n_prompt, &lim);

    if (lcf->max_support && g->params.mask_mode != MSV_MASK_OFF
        && g->params.top_k > 0 && (ngx_uint_t) g->params.top_k
                                  > lcf->max_support)
    {
        return ngx_http_maskserve_invalid(r, err, "sampling_params.top_k",
                                          "top_k %D exceeds "
                                          "maskserve_max_support %ui: the "
                                          "sampling mask could not be "
                                          "returned", g->params.top_k,
                                          lcf->max_support);
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_maskserve_parse_abort(ngx_http_request_t *r, ngx_str_t *id,
    ngx_http_maskserve_err_t *err)
{
    ngx_http_maskserve_ps_t  ps;

    ngx_memzero(&ps, sizeof(ngx_http_maskserve_ps_t));
    ngx_str_null(id);

    ps.r = r;
    ps.abort_id = id;
    ps.err = err;

    if (ngx_http_maskserve_parse_body(&ps) != NGX_OK) {
        return NGX_ERROR;
    }

    if (id->len == 0) {
        ngx_http_maskserve_error(err, NGX_HTTP_BAD_REQUEST,
                                 NGX_HTTP_MASKSERVE_INVALID, "request_id",
                                 "request_id is required");
        return NGX_ERROR;
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_maskserve_id_valid(u_char *p, size_t len)
{
    /* the rule is shared with the worker and the CLI (shm/msv_params.c) */
    return msv_request_id_valid((const char *) p, len);
}


/* Run yajl over the request body, in memory or in a temporary file. */

static ngx_int_t
ngx_http_maskserve_parse_body(ngx_http_maskserve_ps_t *ps)
{
    off_t                  off;
    size_t                 size;
    ssize_t                n;
    u_char                *buf;
    yajl_handle            h;
    ngx_buf_t             *b;
    ngx_chain_t           *cl;
    ngx_uint_t             any;
    ngx_pool_cleanup_t    *cln;
    ngx_http_request_t    *r;
    ngx_http_maskserve_err_t  *err;

    r = ps->r;
    err = ps->err;

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        goto nomem;
    }

    h = yajl_alloc(&ngx_http_maskserve_callbacks, NULL, ps);
    if (h == NULL) {
        goto nomem;
    }

    cln->handler = ngx_http_maskserve_yajl_cleanup;
    cln->data = h;
    ps->h = h;

    any = 0;
    buf = NULL;

    if (r->request_body) {
        for (cl = r->request_body->bufs; cl; cl = cl->next) {
            b = cl->buf;

            if (ngx_buf_in_memory(b)) {
                if (b->last > b->pos) {
                    any = 1;
                    if (ngx_http_maskserve_parse_chunk(ps, b->pos,
                                                       b->last - b->pos)
                        != NGX_OK)
                    {
                        return NGX_ERROR;
                    }
                }

                continue;
            }

            if (!b->in_file || b->file == NULL) {
                continue;
            }

            if (buf == NULL) {
                buf = ngx_pnalloc(r->pool, 16384);
                if (buf == NULL) {
                    goto nomem;
                }
            }

            for (off = b->file_pos; off < b->file_last; off += n) {
                size = (size_t) ngx_min(16384, b->file_last - off);

                n = ngx_read_file(b->file, buf, size, off);
                if (n == NGX_ERROR || n == 0) {
                    ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                                  "maskserve: reading the request body from "
                                  "\"%V\" failed", &b->file->name);
                    ngx_http_maskserve_error(err,
                                             NGX_HTTP_INTERNAL_SERVER_ERROR,
                                             NGX_HTTP_MASKSERVE_SERVER, NULL,
                                             "could not read the request "
                                             "body");
                    return NGX_ERROR;
                }

                any = 1;
                if (ngx_http_maskserve_parse_chunk(ps, buf, n) != NGX_OK) {
                    return NGX_ERROR;
                }
            }
        }
    }

    if (!any) {
        ngx_http_maskserve_error(err, NGX_HTTP_BAD_REQUEST,
                                 NGX_HTTP_MASKSERVE_INVALID, NULL,
                                 "the request body is empty: a JSON object "
                                 "is expected");
        return NGX_ERROR;
    }

    return ngx_http_maskserve_yajl_status(ps, h, yajl_complete_parse(h));

nomem:

    ngx_http_maskserve_error(err, NGX_HTTP_INTERNAL_SERVER_ERROR,
                             NGX_HTTP_MASKSERVE_SERVER, NULL,
                             "out of memory");
    return NGX_ERROR;
}


/*
 * One piece of the body.  After the root object only whitespace may
 * follow: yajl refuses a complete trailing token itself, but an
 * unterminated one (a lone quote) it keeps waiting for and then
 * forgets, so the bytes after the root are checked here.
 */

static ngx_int_t
ngx_http_maskserve_parse_chunk(ngx_http_maskserve_ps_t *ps, u_char *p,
    size_t n)
{
    size_t  i;

    if (!ps->ended) {
        if (ngx_http_maskserve_yajl_status(ps, ps->h, yajl_parse(ps->h, p, n))
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        if (!ps->ended) {
            return NGX_OK;
        }

        i = ps->end;
        ps->end = 0;

    } else {
        i = 0;
    }

    for ( /* void */ ; i < n; i++) {
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\n' && p[i] != '\r') {
            ngx_http_maskserve_fail(ps, NULL, "invalid JSON: trailing data "
                                    "after the object");
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/* What yajl_parse or yajl_complete_parse answered, as NGX_OK or NGX_ERROR. */

static ngx_int_t
ngx_http_maskserve_yajl_status(ngx_http_maskserve_ps_t *ps, yajl_handle h,
    yajl_status status)
{
    unsigned char  *msg;

    if (status == yajl_status_ok) {
        return NGX_OK;
    }

    if (ps->err->status) {
        /* a callback refused a value and said why */
        return NGX_ERROR;
    }

    msg = yajl_get_error(h, 0, NULL, 0);
    ngx_http_maskserve_fail(ps, NULL, "invalid JSON: %s",
                            msg ? (char *) msg : "parse error");
    if (msg) {
        yajl_free_error(h, msg);
    }

    return NGX_ERROR;
}


static void
ngx_http_maskserve_yajl_cleanup(void *data)
{
    yajl_free((yajl_handle) data);
}


/* Record a 400 naming param; returns 0, which makes yajl stop. */

static int
ngx_http_maskserve_fail(ngx_http_maskserve_ps_t *ps, const char *param,
    const char *fmt, ...)
{
    va_list  args;

    if (ps->err->status) {
        return 0;
    }

    va_start(args, fmt);
    (void) ngx_http_maskserve_vinvalid(ps->r, ps->err, param, fmt, args);
    va_end(args);

    return 0;
}


/* Record a 400 naming param; returns NGX_ERROR. */

static ngx_int_t
ngx_http_maskserve_invalid(ngx_http_request_t *r,
    ngx_http_maskserve_err_t *err, const char *param, const char *fmt, ...)
{
    ngx_int_t  rc;
    va_list    args;

    va_start(args, fmt);
    rc = ngx_http_maskserve_vinvalid(r, err, param, fmt, args);
    va_end(args);

    return rc;
}


static ngx_int_t
ngx_http_maskserve_vinvalid(ngx_http_request_t *r,
    ngx_http_maskserve_err_t *err, const char *param, const char *fmt,
    va_list args)
{
    u_char  *msg, *p, *last;

    msg = ngx_pnalloc(r->pool, 256);
    if (msg == NULL) {
        ngx_http_maskserve_error(err, NGX_HTTP_INTERNAL_SERVER_ERROR,
                                 NGX_HTTP_MASKSERVE_SERVER, NULL,
                                 "out of memory");
        return NGX_ERROR;
    }

    last = ngx_vslprintf(msg, msg + 256, fmt, args);

    /* yajl's messages end with a newline: keep the answer one line */
    for (p = msg; p < last; p++) {
        if (*p == '\n' || *p == '\r') {
            break;
        }
    }

    ngx_http_maskserve_set_error(err, NGX_HTTP_BAD_REQUEST,
                                 NGX_HTTP_MASKSERVE_INVALID, param, msg,
                                 p - msg);
    return NGX_ERROR;
}


/* yajl callbacks */

static int
ngx_http_maskserve_on_null(void *ctx)
{
    return ngx_http_maskserve_value(ctx, MSV_V_NULL, NULL, 0, 0);
}


static int
ngx_http_maskserve_on_boolean(void *ctx, int b)
{
    return ngx_http_maskserve_value(ctx, MSV_V_BOOL, NULL, 0, b);
}


static int
ngx_http_maskserve_on_number(void *ctx, const char *s, size_t len)
{
    return ngx_http_maskserve_value(ctx, MSV_V_NUMBER,
                                    (const unsigned char *) s, len, 0);
}


static int
ngx_http_maskserve_on_string(void *ctx, const unsigned char *s, size_t len)
{
    return ngx_http_maskserve_value(ctx, MSV_V_STRING, s, len, 0);
}


static int
ngx_http_maskserve_on_start_map(void *ctx)
{
    return ngx_http_maskserve_value(ctx, MSV_V_MAP, NULL, 0, 0);
}


static int
ngx_http_maskserve_on_start_array(void *ctx)
{
    return ngx_http_maskserve_value(ctx, MSV_V_ARRAY, NULL, 0, 0);
}


static int
ngx_http_maskserve_on_map_key(void *ctx, const unsigned char *s, size_t len)
{
    ngx_http_maskserve_ps_t  *ps = ctx;

    char                          msg[MSV_PARAM_ERR_MAX];
    uint32_t                     *seen;
    ngx_uint_t                    i, frame;
    ngx_http_maskserve_field_t   *f;
    const struct msv_param_rule  *rule;

    if (ps->skip) {
        return 1;
    }

    frame = ps->stack[ps->depth - 1];

    if (frame == MSV_FR_BIAS) {
        if (msv_param_bias_id((const char *) s, len, &ps->bias_id, msg) != 0)
        {
            return ngx_http_maskserve_fail(ps, "sampling_params.logit_bias",
                                           "%s", msg);
        }

        if (ps->bias.nelts >= MSV_MAX_BIAS) {
            return ngx_http_maskserve_fail(ps, "sampling_params.logit_bias",
                                           "logit_bias has more than %d "
                                           "entries", MSV_MAX_BIAS);
        }

        return 1;
    }

    if (frame == MSV_FR_SP) {
        rule = msv_param_find((const char *) s, len);
        if (rule == NULL) {
            ps->field = &ngx_http_maskserve_unknown;
            return ngx_http_maskserve_unknown_key(ps, frame, s, len);
        }

        i = rule - msv_param_rules;

        if (ps->seen[1] & (1u << i)) {
            return ngx_http_maskserve_fail(ps, rule->param,
                                           "duplicate key \"%s\"",
                                           rule->name);
        }

        ps->seen[1] |= 1u << i;
        ps->field = &ngx_http_maskserve_param;
        ps->rule = rule;

        return 1;
    }

    f = ps->g ? ngx_http_maskserve_root_fields
              : ngx_http_maskserve_abort_fields;
    seen = &ps->seen[0];

    for (i = 0; f[i].name.len; i++) {
        if (f[i].name.len == len
            && ngx_strncmp(f[i].name.data, s, len) == 0)
        {
            break;
        }
    }

    if (f[i].name.len == 0) {
        ps->field = &ngx_http_maskserve_unknown;
        return ngx_http_maskserve_unknown_key(ps, frame, s, len);
    }

    if (*seen & (1u << i)) {
        return ngx_http_maskserve_fail(ps, f[i].param,
                                       "duplicate key \"%V\"", &f[i].name);
    }

    *seen |= 1u << i;
    ps->field = &f[i];

    return 1;
}


/*
 * An unknown key of the root or of sampling_params: ignored, but twice
 * is a duplicate like any other.  The keys seen go into an open hash
 * table in the pool, doubled at half full, so a body of many keys costs
 * linear time.
 */

static int
ngx_http_maskserve_unknown_key(ngx_http_maskserve_ps_t *ps, ngx_uint_t frame,
    const unsigned char *s, size_t len)
{
    u_char                    *p;
    ngx_uint_t                 hash, i, n, cap;
    ngx_http_maskserve_key_t  *k, *old;

    hash = ngx_hash_key((u_char *) s, len) * 2 + frame;
    hash = hash ? hash : 1;

    if (2 * (ps->n_keys + 1) > ps->keys_cap) {
        cap = ps->keys_cap ? 2 * ps->keys_cap : NGX_HTTP_MASKSERVE_KEYS_MIN;

        k = ngx_pcalloc(ps->r->pool, cap * sizeof(ngx_http_maskserve_key_t));
        if (k == NULL) {
            return ngx_http_maskserve_fail(ps, NULL, "out of memory");
        }

        old = ps->keys;
        n = ps->keys_cap;
        ps->keys = k;
        ps->keys_cap = cap;

        for (i = 0; i < n; i++) {
            if (old[i].hash) {
                k = &ps->keys[old[i].hash & (cap - 1)];
                while (k->hash) {
                    k = (k == &ps->keys[cap - 1]) ? ps->keys : k + 1;
                }
                *k = old[i];
            }
        }
    }

    cap = ps->keys_cap;
    k = &ps->keys[hash & (cap - 1)];

    while (k->hash) {
        if (k->hash == hash && k->frame == frame && k->name.len == len
            && ngx_memcmp(k->name.data, s, len) == 0)
        {
            /* the param names the key where it was found */
            n = (frame == MSV_FR_SP) ? sizeof("sampling_params.") - 1 : 0;
            p = ngx_pnalloc(ps->r->pool, n + ngx_min(len, 64) + 1);
            if (p == NULL) {
                return ngx_http_maskserve_fail(ps, NULL, "out of memory");
            }

            ngx_memcpy(p, "sampling_params.", n);
            ngx_memcpy(p + n, s, ngx_min(len, 64));
            p[n + ngx_min(len, 64)] = '\0';

            return ngx_http_maskserve_fail(ps, (char *) p,
                                           "duplicate key \"%s\"",
                                           p + n);
        }

        k = (k == &ps->keys[cap - 1]) ? ps->keys : k + 1;
    }

    p = ngx_pnalloc(ps->r->pool, len ? len : 1);
    if (p == NULL) {
        return ngx_http_maskserve_fail(ps, NULL, "out of memory");
    }

    ngx_memcpy(p, s, len);

    k->hash = hash;
    k->frame = frame;
    k->name.data = p;
    k->name.len = len;
    ps->n_keys++;

    return 1;
}


static int
ngx_http_maskserve_on_end_map(void *ctx)
{
    ngx_http_maskserve_ps_t  *ps = ctx;

    if (ps->skip) {
        ps->skip--;
        return 1;
    }

    ps->depth--;

    if (ps->depth == 0) {
        ps->stack[0] = MSV_FR_END;
        ps->depth = 1;

        /* what yajl has read of this chunk: the root ends there */
        ps->ended = 1;
        ps->end = yajl_get_bytes_consumed(ps->h);
    }

    return 1;
}


static int
ngx_http_maskserve_on_end_array(void *ctx)
{
    return ngx_http_maskserve_on_end_map(ctx);
}


static int
ngx_http_maskserve_push(ngx_http_maskserve_ps_t *ps, ngx_uint_t frame)
{
    if (ps->depth == sizeof(ps->stack) / sizeof(ps->stack[0])) {
        return ngx_http_maskserve_fail(ps, NULL, "JSON nested too deep");
    }

    ps->stack[ps->depth++] = frame;

    return 1;
}


/* Every value, by the frame it appears in. */

static int
ngx_http_maskserve_value(ngx_http_maskserve_ps_t *ps, ngx_uint_t type,
    const unsigned char *s, size_t len, int b)
{
    char              msg[MSV_PARAM_ERR_MAX];
    int32_t          *t;
    ngx_uint_t        frame;
    const char       *param;
    struct msv_bias  *bias;

    if (ps->skip) {
        if (type == MSV_V_MAP || type == MSV_V_ARRAY) {
            ps->skip++;
        }

        return 1;
    }

    if (ps->depth == 0) {
        ps->depth = 1;
        ps->stack[0] = MSV_FR_TOP;
    }

    frame = ps->stack[ps->depth - 1];

    switch (frame) {

    case MSV_FR_TOP:
        if (type != MSV_V_MAP) {
            return ngx_http_maskserve_fail(ps, NULL, "the request body must "
                                           "be a JSON object");
        }

        ps->stack[0] = MSV_FR_ROOT;
        return 1;

    case MSV_FR_ROOT:
    case MSV_FR_SP:
        if (ps->field == NULL) {
            /* yajl calls map_key before every value of an object */
            return ngx_http_maskserve_fail(ps, NULL, "invalid JSON");
        }

        if (ps->field->key == MSV_K_UNKNOWN) {
            /* ignored, as vLLM ignores extra fields; skip it whole */
            if (type == MSV_V_MAP || type == MSV_V_ARRAY) {
                ps->skip = 1;
            }

            return 1;
        }

        if (frame == MSV_FR_ROOT) {
            return ngx_http_maskserve_root_value(ps, ps->field, type, s, len,
                                                 b);
        }

        return ngx_http_maskserve_sp_value(ps, ps->rule, type, s, len, b);

    case MSV_FR_BIAS:
        bias = ngx_array_push(&ps->bias);
        if (bias == NULL) {
            return ngx_http_maskserve_fail(ps, NULL, "out of memory");
        }

        bias->id = ps->bias_id;

        if (type != MSV_V_NUMBER) {
            return ngx_http_maskserve_fail(ps, "sampling_params.logit_bias",
                                           "sampling_params.logit_bias "
                                           "values must be numbers in "
                                           "[-100, 100]");
        }

        if (msv_param_bias_value((const char *) s, len, &bias->value, msg)
            != 0)
        {
            return ngx_http_maskserve_fail(ps, "sampling_params.logit_bias",
                                           "%s", msg);
        }

        return 1;

    case MSV_FR_TOKENS:
    case MSV_FR_STOP:
        param = (frame == MSV_FR_TOKENS) ? "token_ids"
                                         : "sampling_params.stop_token_ids";

        if (type != MSV_V_NUMBER) {
            return ngx_http_maskserve_fail(ps, param, "%s must be an array "
                                           "of integer token ids", param);
        }

        if (frame == MSV_FR_STOP) {
            if (msv_param_add_stop(&ps->g->params, (const char *) s, len,
                                   msg)
                != 0)
            {
                return ngx_http_maskserve_fail(ps, param, "%s", msg);
            }

            return 1;
        }

        t = ngx_array_push(&ps->tokens);
        if (t == NULL) {
            return ngx_http_maskserve_fail(ps, NULL, "out of memory");
        }

        if (msv_param_token((const char *) s, len, t, msg) != 0) {
            return ngx_http_maskserve_fail(ps, param, "%s", msg);
        }

        return 1;

    default: /* MSV_FR_END */
        return ngx_http_maskserve_fail(ps, NULL, "invalid JSON: trailing "
                                       "data after the object");
    }
}


/* The value of a known key of the root object. */

static int
ngx_http_maskserve_root_value(ngx_http_maskserve_ps_t *ps,
    ngx_http_maskserve_field_t *f, ngx_uint_t type, const unsigned char *s,
    size_t len, int b)
{
    u_char                    *p;
    ngx_http_maskserve_gen_t  *g;

    g = ps->g;

    switch (f->key) {

    case MSV_K_REQUEST_ID:
        if (type == MSV_V_NULL && g != NULL) {
            return 1;
        }

        if (type != MSV_V_STRING) {
            return ngx_http_maskserve_fail(ps, f->param, "request_id must "
                                           "be a string");
        }

        if (!ngx_http_maskserve_id_valid((u_char *) s, len)) {
            return ngx_http_maskserve_fail(ps, f->param, "request_id must "
                                           "be 1 to %d characters of "
                                           "[A-Za-z0-9._:-], and not \".\" "
                                           "or \"..\"", MSV_REQ_ID_MAX);
        }

        p = ngx_pnalloc(ps->r->pool, len + 1);
        if (p == NULL) {
            return ngx_http_maskserve_fail(ps, NULL, "out of memory");
        }

        ngx_memcpy(p, s, len);
        p[len] = '\0';

        if (g) {
            g->request_id.data = p;
            g->request_id.len = len;

        } else {
            ps->abort_id->data = p;
            ps->abort_id->len = len;
        }

        return 1;

    case MSV_K_TOKEN_IDS:
        if (type != MSV_V_ARRAY) {
            return ngx_http_maskserve_fail(ps, f->param, "token_ids must be "
                                           "an array of integer token ids");
        }

        g->prompt_set = 1;
        return ngx_http_maskserve_push(ps, MSV_FR_TOKENS);

    case MSV_K_SAMPLING_PARAMS:
        if (type == MSV_V_NULL) {
            return 1;
        }

        if (type != MSV_V_MAP) {
            return ngx_http_maskserve_fail(ps, f->param, "sampling_params "
                                           "must be an object");
        }

        ps->field = NULL;
        return ngx_http_maskserve_push(ps, MSV_FR_SP);

    case MSV_K_STREAM:
    case MSV_K_RETURN_MASK:
        if (type == MSV_V_NULL) {
            return 1;
        }

        if (type != MSV_V_BOOL) {
            return ngx_http_maskserve_fail(ps, f->param, "%s must be true or "
                                           "false", f->param);
        }

        if (f->key == MSV_K_STREAM) {
            g->stream = b ? 1 : 0;

        } else {
            ps->mask = b ? 1 : 0;
        }

        return 1;

    case MSV_K_MASK_FORMAT:
        if (type == MSV_V_NULL) {
            return 1;
        }

        if (type == MSV_V_STRING) {
            if (len == 4 && ngx_strncmp(s, "json", 4) == 0) {
                g->packed = 0;
                return 1;
            }

            if (len == 6 && ngx_strncmp(s, "packed", 6) == 0) {
                g->packed = 1;
                return 1;
            }
        }

        return ngx_http_maskserve_fail(ps, f->param, "mask_format must be "
                                       "\"json\" or \"packed\"");

    default: /* MSV_K_MODE */
        if (type == MSV_V_NULL) {
            return 1;
        }

        if (type == MSV_V_STRING) {
            if (len == 8 && ngx_strncmp(s, "selected", 8) == 0) {
                ps->support = 0;
                return 1;
            }

            if (len == 7 && ngx_strncmp(s, "support", 7) == 0) {
                ps->support = 1;
                return 1;
            }
        }

        return ngx_http_maskserve_fail(ps, f->param, "sampling_logprobs_mode "
                                       "must be \"selected\" or \"support\"");
    }
}


/* The value of a known key of sampling_params: its rule says the rest. */

static int
ngx_http_maskserve_sp_value(ngx_http_maskserve_ps_t *ps,
    const struct msv_param_rule *rule, ngx_uint_t type,
    const unsigned char *s, size_t len, int b)
{
    int                 rc;
    char                msg[MSV_PARAM_ERR_MAX];
    struct msv_params  *p;

    static const char  *names[] = {
        "null", "a boolean", "a number", "a string", "an object", "an array"
    };

    p = &ps->g->params;

    switch (type) {

    case MSV_V_NULL:
        /* the default, as vLLM's optional fields do */
        msv_param_set_null(p, rule);
        return 1;

    case MSV_V_BOOL:
        rc = msv_param_set_bool(p, rule, b, msg);
        break;

    case MSV_V_NUMBER:
        rc = msv_param_set_number(p, rule, (const char *) s, len, msg);
        break;

    case MSV_V_ARRAY:
        if (rule->kind == MSV_PK_STOP) {
            return ngx_http_maskserve_push(ps, MSV_FR_STOP);
        }

        rc = msv_param_wrong_type(rule, names[type], msg);
        break;

    case MSV_V_MAP:
        if (rule->kind == MSV_PK_BIAS) {
            return ngx_http_maskserve_push(ps, MSV_FR_BIAS);
        }

        /* fall through */

    default:
        rc = msv_param_wrong_type(rule, names[type], msg);
        break;
    }

    if (rc != 0) {
        return ngx_http_maskserve_fail(ps, rule->param, "%s", msg);
    }

    return 1;
}


static int
ngx_http_maskserve_bias_cmp(const void *a, const void *b)
{
    const struct msv_bias  *x = a, *y = b;

    return (x->id > y->id) - (x->id < y->id);
}
