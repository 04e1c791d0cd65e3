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
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include <yajl/yajl_parse.h>

#include "ngx_http_maskserve_module.h"
#include "ngx_http_maskserve_parse.h"


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
    MSV_K_MAX_TOKENS,
    MSV_K_MIN_TOKENS,
    MSV_K_TEMPERATURE,
    MSV_K_TOP_K,
    MSV_K_TOP_P,
    MSV_K_MIN_P,
    MSV_K_SEED,
    MSV_K_STOP_TOKEN_IDS,
    MSV_K_IGNORE_EOS,
    MSV_K_REPETITION,
    MSV_K_PRESENCE,
    MSV_K_FREQUENCY,
    MSV_K_LOGIT_BIAS,
    MSV_K_LOGPROBS
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


typedef struct {
    ngx_http_request_t            *r;
    ngx_http_maskserve_gen_t      *g;       /* NULL: an abort body */
    ngx_str_t                     *abort_id;
    ngx_http_maskserve_err_t      *err;

    ngx_uint_t                     stack[4];
    ngx_uint_t                     depth;   /* frames on the stack */
    ngx_uint_t                     skip;    /* nesting of a skipped value */
    ngx_http_maskserve_field_t    *field;   /* the next value's field */
    uint32_t                       seen[2]; /* keys seen: root, params */
    int32_t                        bias_id;

    ngx_array_t                    tokens;  /* int32_t */
    ngx_array_t                    bias;    /* struct msv_bias */

    unsigned                       mask:1;
    unsigned                       support:1;
    unsigned                       seen_abort_id:1;
} ngx_http_maskserve_ps_t;


typedef struct {
    u_char                        *pos;
    const unsigned char           *s;
    size_t                         len;
} ngx_http_maskserve_value_t;


static ngx_int_t ngx_http_maskserve_parse_body(ngx_http_maskserve_ps_t *ps);
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
    ngx_http_maskserve_field_t *f, ngx_uint_t type, const unsigned char *s,
    size_t len, int b);
static int ngx_http_maskserve_push(ngx_http_maskserve_ps_t *ps,
    ngx_uint_t frame);
static ngx_int_t ngx_http_maskserve_int(const unsigned char *s, size_t len,
    int64_t *v);
static ngx_int_t ngx_http_maskserve_u64(const unsigned char *s, size_t len,
    uint64_t *v);
static ngx_int_t ngx_http_maskserve_float(ngx_http_maskserve_ps_t *ps,
    const unsigned char *s, size_t len, float *v);
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
    { ngx_null_string, 0, NULL }
};


static ngx_http_maskserve_field_t  ngx_http_maskserve_sp_fields[] = {
    { ngx_string("max_tokens"), MSV_K_MAX_TOKENS,
      "sampling_params.max_tokens" },
    { ngx_string("min_tokens"), MSV_K_MIN_TOKENS,
      "sampling_params.min_tokens" },
    { ngx_string("temperature"), MSV_K_TEMPERATURE,
      "sampling_params.temperature" },
    { ngx_string("top_k"), MSV_K_TOP_K, "sampling_params.top_k" },
    { ngx_string("top_p"), MSV_K_TOP_P, "sampling_params.top_p" },
    { ngx_string("min_p"), MSV_K_MIN_P, "sampling_params.min_p" },
    { ngx_string("seed"), MSV_K_SEED, "sampling_params.seed" },
    { ngx_string("stop_token_ids"), MSV_K_STOP_TOKEN_IDS,
      "sampling_params.stop_token_ids" },
    { ngx_string("ignore_eos"), MSV_K_IGNORE_EOS,
      "sampling_params.ignore_eos" },
    { ngx_string("repetition_penalty"), MSV_K_REPETITION,
      "sampling_params.repetition_penalty" },
    { ngx_string("presence_penalty"), MSV_K_PRESENCE,
      "sampling_params.presence_penalty" },
    { ngx_string("frequency_penalty"), MSV_K_FREQUENCY,
      "sampling_params.frequency_penalty" },
    { ngx_string("logit_bias"), MSV_K_LOGIT_BIAS,
      "sampling_params.logit_bias" },
    { ngx_string("logprobs"), MSV_K_LOGPROBS, "sampling_params.logprobs" },
    { ngx_null_string, 0, NULL }
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
    ngx_uint_t               i;
    ngx_http_maskserve_ps_t  ps;

    ngx_memzero(g, sizeof(ngx_http_maskserve_gen_t));
    ngx_memzero(&ps, sizeof(ngx_http_maskserve_ps_t));

    g->params.max_tokens = 16;
    g->params.min_tokens = 0;
    g->params.temperature = 1.0f;
    g->params.top_p = 1.0f;
    g->params.min_p = 0.0f;
    g->params.top_k = -1;
    g->params.repetition_penalty = 1.0f;
    g->params.presence_penalty = 0.0f;
    g->params.frequency_penalty = 0.0f;
    g->params.logprobs = -1;
    g->params.mask_mode = MSV_MASK_OFF;

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

    if (g->max_tokens_set && g->params.min_tokens > g->params.max_tokens) {
        ngx_http_maskserve_error(err, NGX_HTTP_BAD_REQUEST,
                                 NGX_HTTP_MASKSERVE_INVALID,
                                 "sampling_params.min_tokens",
                                 "min_tokens must not exceed max_tokens");
        return NGX_ERROR;
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

    return NGX_OK;
}


ngx_int_t
ngx_http_maskserve_check_generate(ngx_http_request_t *r,
    ngx_http_maskserve_gen_t *g, struct msv_ctrl *c,
    ngx_http_maskserve_loc_conf_t *lcf, ngx_http_maskserve_err_t *err)
{
    ngx_uint_t  i, room;

    if (g->n_prompt == 0) {
        return ngx_http_maskserve_invalid(r, err, "token_ids",
                                          "token_ids must not be empty");
    }

    if (g->n_prompt >= c->max_model_len) {
        return ngx_http_maskserve_invalid(r, err, "token_ids",
                                          "prompt of %ui tokens does not "
                                          "fit: max_model_len is %uD, so at "
                                          "most %uD prompt tokens",
                                          g->n_prompt, c->max_model_len,
                                          c->max_model_len - 1);
    }

    if (lcf->max_prompt && g->n_prompt > lcf->max_prompt) {
        return ngx_http_maskserve_invalid(r, err, "token_ids",
                                          "prompt of %ui tokens exceeds "
                                          "maskserve_max_prompt_tokens %ui",
                                          g->n_prompt, lcf->max_prompt);
    }

    for (i = 0; i < g->n_prompt; i++) {
        if ((uint32_t) g->prompt[i] >= c->vocab_size) {
            return ngx_http_maskserve_invalid(r, err, "token_ids",
                                              "token_ids[%ui] = %D is "
                                              "outside the vocabulary "
                                              "[0, %uD)", i, g->prompt[i],
                                              c->vocab_size);
        }
    }

    for (i = 0; i < g->params.n_stop; i++) {
        if ((uint32_t) g->params.stop_ids[i] >= c->vocab_size) {
            return ngx_http_maskserve_invalid(r, err,
                                              "sampling_params.stop_token_ids",
                                              "stop_token_ids[%ui] = %D is "
                                              "outside the vocabulary "
                                              "[0, %uD)", i,
                                              g->params.stop_ids[i],
                                              c->vocab_size);
        }
    }

    for (i = 0; i < g->params.n_bias; i++) {
        if ((uint32_t) g->bias[i].id >= c->vocab_size) {
            return ngx_http_maskserve_invalid(r, err,
                                              "sampling_params.logit_bias",
                                              "logit_bias key %D is outside "
                                              "the vocabulary [0, %uD)",
                                              g->bias[i].id, c->vocab_size);
        }
    }

    if (g->params.logprobs >= 0
        && (uint32_t) g->params.logprobs > c->max_logprobs)
    {
        return ngx_http_maskserve_invalid(r, err, "sampling_params.logprobs",
                                          "logprobs %D exceeds the maximum "
                                          "%uD", g->params.logprobs,
                                          c->max_logprobs);
    }

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

    /* as vLLM does: the output is clipped to the context left */
    room = c->max_model_len - g->n_prompt;
    if (g->params.max_tokens > room) {
        g->params.max_tokens = (uint32_t) room;
    }

    if (g->params.min_tokens > g->params.max_tokens) {
        g->params.min_tokens = g->params.max_tokens;
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
    u_char  ch;
    size_t  i;

    if (len == 0 || len > MSV_REQ_ID_MAX) {
        return 0;
    }

    for (i = 0; i < len; i++) {
        ch = p[i];

        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')
            || (ch >= '0' && ch <= '9')
            || ch == '.' || ch == '_' || ch == ':' || ch == '-')
        {
            continue;
        }

        return 0;
    }

    return 1;
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

    any = 0;
    buf = NULL;

    if (r->request_body) {
        for (cl = r->request_body->bufs; cl; cl = cl->next) {
            b = cl->buf;

            if (ngx_buf_in_memory(b)) {
                if (b->last > b->pos) {
                    any = 1;
                    if (ngx_http_maskserve_yajl_status(ps, h,
                            yajl_parse(h, b->pos, b->last - b->pos))
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
                if (ngx_http_maskserve_yajl_status(ps, h,
                                                   yajl_parse(h, buf, n))
                    != NGX_OK)
                {
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

    uint32_t                     *seen;
    uint64_t                      id;
    ngx_uint_t                    i, frame;
    ngx_http_maskserve_field_t   *f;

    if (ps->skip) {
        return 1;
    }

    frame = ps->stack[ps->depth - 1];

    if (frame == MSV_FR_BIAS) {
        if (ngx_http_maskserve_u64(s, len, &id) != NGX_OK
            || id > INT32_MAX || len == 0 || (len > 1 && s[0] == '0'))
        {
            return ngx_http_maskserve_fail(ps, "sampling_params.logit_bias",
                                           "logit_bias keys must be token "
                                           "ids in decimal, not \"%*s\"",
                                           ngx_min(len, 32), s);
        }

        if (ps->bias.nelts >= MSV_MAX_BIAS) {
            return ngx_http_maskserve_fail(ps, "sampling_params.logit_bias",
                                           "logit_bias has more than %d "
                                           "entries", MSV_MAX_BIAS);
        }

        ps->bias_id = (int32_t) id;
        return 1;
    }

    if (frame == MSV_FR_ROOT) {
        f = ps->g ? ngx_http_maskserve_root_fields
                  : ngx_http_maskserve_abort_fields;
        seen = &ps->seen[0];

    } else {
        f = ngx_http_maskserve_sp_fields;
        seen = &ps->seen[1];
    }

    for (i = 0; f[i].name.len; i++) {
        if (f[i].name.len == len
            && ngx_strncmp(f[i].name.data, s, len) == 0)
        {
            break;
        }
    }

    if (f[i].name.len == 0) {
        ps->field = &ngx_http_maskserve_unknown;
        return 1;
    }

    if (*seen & (1u << i)) {
        return ngx_http_maskserve_fail(ps, f[i].param,
                                       "duplicate key \"%V\"", &f[i].name);
    }

    *seen |= 1u << i;
    ps->field = &f[i];

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
    int64_t           v;
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

        return ngx_http_maskserve_sp_value(ps, ps->field, type, s, len, b);

    case MSV_FR_BIAS:
        if (type != MSV_V_NUMBER) {
            return ngx_http_maskserve_fail(ps, "sampling_params.logit_bias",
                                           "logit_bias values must be "
                                           "numbers");
        }

        bias = ngx_array_push(&ps->bias);
        if (bias == NULL) {
            return ngx_http_maskserve_fail(ps, NULL, "out of memory");
        }

        bias->id = ps->bias_id;

        if (ngx_http_maskserve_float(ps, s, len, &bias->value) != NGX_OK) {
            return ngx_http_maskserve_fail(ps, "sampling_params.logit_bias",
                                           "logit_bias values must be "
                                           "finite numbers");
        }

        return 1;

    case MSV_FR_TOKENS:
    case MSV_FR_STOP:
        param = (frame == MSV_FR_TOKENS) ? "token_ids"
                                         : "sampling_params.stop_token_ids";

        if (type != MSV_V_NUMBER
            || ngx_http_maskserve_int(s, len, &v) != NGX_OK)
        {
            return ngx_http_maskserve_fail(ps, param, "%s must be an array "
                                           "of integer token ids", param);
        }

        if (v < 0 || v > INT32_MAX) {
            return ngx_http_maskserve_fail(ps, param, "%s holds %L, which "
                                           "is not a token id", param, v);
        }

        if (frame == MSV_FR_STOP) {
            if (ps->g->params.n_stop == MSV_MAX_STOP) {
                return ngx_http_maskserve_fail(ps, param, "stop_token_ids "
                                               "has more than %d entries",
                                               MSV_MAX_STOP);
            }

            ps->g->params.stop_ids[ps->g->params.n_stop++] = (int32_t) v;
            return 1;
        }

        t = ngx_array_push(&ps->tokens);
        if (t == NULL) {
            return ngx_http_maskserve_fail(ps, NULL, "out of memory");
        }

        *t = (int32_t) v;
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
                                           "[A-Za-z0-9._:-]", MSV_REQ_ID_MAX);
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


/* The value of a known key of sampling_params. */

static int
ngx_http_maskserve_sp_value(ngx_http_maskserve_ps_t *ps,
    ngx_http_maskserve_field_t *f, ngx_uint_t type, const unsigned char *s,
    size_t len, int b)
{
    float               x;
    int64_t             v;
    uint64_t            u;
    struct msv_params  *p;

    p = &ps->g->params;

    /* null leaves the default, as vLLM's optional fields do */
    if (type == MSV_V_NULL) {
        if (f->key == MSV_K_SEED) {
            p->has_seed = 0;

        } else if (f->key == MSV_K_LOGPROBS) {
            p->logprobs = -1;
        }

        return 1;
    }

    switch (f->key) {

    case MSV_K_IGNORE_EOS:
        if (type != MSV_V_BOOL) {
            return ngx_http_maskserve_fail(ps, f->param, "ignore_eos must be "
                                           "true or false");
        }

        p->ignore_eos = b ? 1 : 0;
        return 1;

    case MSV_K_STOP_TOKEN_IDS:
        if (type != MSV_V_ARRAY) {
            return ngx_http_maskserve_fail(ps, f->param, "stop_token_ids "
                                           "must be an array of integer "
                                           "token ids");
        }

        return ngx_http_maskserve_push(ps, MSV_FR_STOP);

    case MSV_K_LOGIT_BIAS:
        if (type != MSV_V_MAP) {
            return ngx_http_maskserve_fail(ps, f->param, "logit_bias must be "
                                           "an object of token id to bias");
        }

        return ngx_http_maskserve_push(ps, MSV_FR_BIAS);

    case MSV_K_MAX_TOKENS:
    case MSV_K_MIN_TOKENS:
    case MSV_K_TOP_K:
    case MSV_K_LOGPROBS:
        if (type != MSV_V_NUMBER) {
            goto not_integer;
        }

        if (ngx_http_maskserve_int(s, len, &v) != NGX_OK) {
            goto not_integer;
        }

        switch (f->key) {

        case MSV_K_MAX_TOKENS:
            if (v < 1 || v > UINT32_MAX) {
                return ngx_http_maskserve_fail(ps, f->param, "max_tokens "
                                               "must be at least 1, not %L",
                                               v);
            }

            p->max_tokens = (uint32_t) v;
            ps->g->max_tokens_set = 1;
            return 1;

        case MSV_K_MIN_TOKENS:
            if (v < 0 || v > UINT32_MAX) {
                return ngx_http_maskserve_fail(ps, f->param, "min_tokens "
                                               "must be 0 or more, not %L",
                                               v);
            }

            p->min_tokens = (uint32_t) v;
            return 1;

        case MSV_K_TOP_K:
            if (v < -1 || v > INT32_MAX) {
                return ngx_http_maskserve_fail(ps, f->param, "top_k must be "
                                               "-1 or 0 (off) or at least 1, "
                                               "not %L", v);
            }

            p->top_k = (int32_t) v;
            return 1;

        default: /* MSV_K_LOGPROBS */
            if (v < 0 || v > MSV_MAX_LOGPROBS) {
                return ngx_http_maskserve_fail(ps, f->param, "logprobs must "
                                               "be null or 0 to %d, not %L",
                                               MSV_MAX_LOGPROBS, v);
            }

            p->logprobs = (int32_t) v;
            return 1;
        }

    case MSV_K_SEED:
        if (type != MSV_V_NUMBER) {
            goto not_integer;
        }

        if (len > 0 && s[0] == '-') {
            return ngx_http_maskserve_fail(ps, f->param, "seed must be a "
                                           "non-negative integer");
        }

        if (ngx_http_maskserve_u64(s, len, &u) != NGX_OK) {
            return ngx_http_maskserve_fail(ps, f->param, "seed must be an "
                                           "integer in [0, 2^64)");
        }

        p->seed = u;
        p->has_seed = 1;
        return 1;

    default:
        /* the floats */
        if (type != MSV_V_NUMBER) {
            return ngx_http_maskserve_fail(ps, f->param, "%s must be a "
                                           "number", f->param);
        }

        if (ngx_http_maskserve_float(ps, s, len, &x) != NGX_OK) {
            return ngx_http_maskserve_fail(ps, f->param, "%s must be a "
                                           "finite number", f->param);
        }

        switch (f->key) {

        case MSV_K_TEMPERATURE:
            if (x < 0.0f) {
                return ngx_http_maskserve_fail(ps, f->param, "temperature "
                                               "must be 0 (greedy) or "
                                               "more");
            }

            p->temperature = x;
            return 1;

        case MSV_K_TOP_P:
            if (!(x > 0.0f && x <= 1.0f)) {
                return ngx_http_maskserve_fail(ps, f->param, "top_p must be "
                                               "in (0, 1]");
            }

            p->top_p = x;
            return 1;

        case MSV_K_MIN_P:
            if (!(x >= 0.0f && x <= 1.0f)) {
                return ngx_http_maskserve_fail(ps, f->param, "min_p must be "
                                               "in [0, 1]");
            }

            p->min_p = x;
            return 1;

        case MSV_K_REPETITION:
            if (!(x > 0.0f)) {
                return ngx_http_maskserve_fail(ps, f->param,
                                               "repetition_penalty must be "
                                               "greater than 0");
            }

            p->repetition_penalty = x;
            return 1;

        case MSV_K_PRESENCE:
            p->presence_penalty = x;
            return 1;

        default: /* MSV_K_FREQUENCY */
            p->frequency_penalty = x;
            return 1;
        }
    }

not_integer:

    return ngx_http_maskserve_fail(ps, f->param, "%s must be an integer",
                                   f->param);
}


/* Numbers, from yajl's raw text (already valid JSON number syntax). */

static ngx_int_t
ngx_http_maskserve_int(const unsigned char *s, size_t len, int64_t *v)
{
    size_t    i;
    uint64_t  u;

    i = (len > 0 && s[0] == '-') ? 1 : 0;

    if (ngx_http_maskserve_u64(s + i, len - i, &u) != NGX_OK) {
        return NGX_ERROR;
    }

    if (i) {
        if (u > (uint64_t) INT64_MAX + 1) {
            return NGX_ERROR;
        }

        *v = (int64_t) (0 - u);
        return NGX_OK;
    }

    if (u > INT64_MAX) {
        return NGX_ERROR;
    }

    *v = (int64_t) u;

    return NGX_OK;
}


static ngx_int_t
ngx_http_maskserve_u64(const unsigned char *s, size_t len, uint64_t *v)
{
    size_t    i;
    uint64_t  u, d;

    if (len == 0) {
        return NGX_ERROR;
    }

    u = 0;

    for (i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return NGX_ERROR;   /* a fraction, an exponent or a sign */
        }

        d = s[i] - '0';

        if (u > (UINT64_MAX - d) / 10) {
            return NGX_ERROR;
        }

        u = u * 10 + d;
    }

    *v = u;

    return NGX_OK;
}


static ngx_int_t
ngx_http_maskserve_float(ngx_http_maskserve_ps_t *ps, const unsigned char *s,
    size_t len, float *v)
{
    char    buf[64], *z, *end;
    double  d;

    if (len < sizeof(buf)) {
        z = buf;

    } else {
        z = ngx_pnalloc(ps->r->pool, len + 1);
        if (z == NULL) {
            return NGX_ERROR;
        }
    }

    ngx_memcpy(z, s, len);
    z[len] = '\0';

    errno = 0;
    d = strtod(z, &end);

    if (end != z + len || !isfinite(d)) {
        return NGX_ERROR;
    }

    if (d > FLT_MAX || d < -FLT_MAX) {
        return NGX_ERROR;
    }

    *v = (float) d;

    return NGX_OK;
}


static int
ngx_http_maskserve_bias_cmp(const void *a, const void *b)
{
    const struct msv_bias  *x = a, *y = b;

    return (x->id > y->id) - (x->id < y->id);
}
