/*
 * ngx_http_maskserve_parse.h: request bodies (JSON, parsed as a stream
 * with yajl straight from the body buffers) and their validation.
 *
 * Parsing checks syntax, types and every range that does not depend on
 * the model; ngx_http_maskserve_check_generate then checks what does
 * (vocabulary, context length, logprobs) against the region the request
 * is about to be admitted to.  The rules of sampling_params are
 * shm/msv_params.h's.  Every failure fills an error naming the field
 * ("param") it is about.
 */

#ifndef NGX_HTTP_MASKSERVE_PARSE_H
#define NGX_HTTP_MASKSERVE_PARSE_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "msv_shm.h"
#include "ngx_http_maskserve_module.h"


/* A parsed POST /inference/v1/generate body. */
typedef struct {
    ngx_str_t            request_id;     /* len 0: none given */
    int32_t             *prompt;
    ngx_uint_t           n_prompt;
    struct msv_params    params;         /* mask_mode and logprobs set */
    struct msv_bias     *bias;           /* params.n_bias entries */
    unsigned             stream:1;
    unsigned             packed:1;       /* mask_format "packed" */
    unsigned             prompt_set:1;
} ngx_http_maskserve_gen_t;


/* Parse r->request_body.  NGX_OK, or NGX_ERROR with err filled. */
ngx_int_t ngx_http_maskserve_parse_generate(ngx_http_request_t *r,
    ngx_http_maskserve_gen_t *g, ngx_http_maskserve_err_t *err);

/*
 * The checks that need the model: token ids and stop ids below the
 * vocabulary, prompt length, logprobs, the support cap; clips max_tokens
 * (and min_tokens) to the context and top_k to the vocabulary.  NGX_OK,
 * or NGX_ERROR with err filled.
 */
ngx_int_t ngx_http_maskserve_check_generate(ngx_http_request_t *r,
    ngx_http_maskserve_gen_t *g, struct msv_ctrl *c,
    ngx_http_maskserve_loc_conf_t *lcf, ngx_http_maskserve_err_t *err);

/* Parse a POST /inference/v1/abort body: {"request_id": "..."}. */
ngx_int_t ngx_http_maskserve_parse_abort(ngx_http_request_t *r,
    ngx_str_t *id, ngx_http_maskserve_err_t *err);

/* A request id is 1..MSV_REQ_ID_MAX of [A-Za-z0-9._:-], not . or .. */
ngx_int_t ngx_http_maskserve_id_valid(u_char *p, size_t len);


#endif /* NGX_HTTP_MASKSERVE_PARSE_H */
