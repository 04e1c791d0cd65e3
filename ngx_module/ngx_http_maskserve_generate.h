/*
 * ngx_http_maskserve_generate.h: POST /inference/v1/generate: checks the
 * request, validates the body, admits it to a worker region and keeps it
 * alive until its last row.
 */

#ifndef NGX_HTTP_MASKSERVE_GENERATE_H
#define NGX_HTTP_MASKSERVE_GENERATE_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/* The content handler of "maskserve_generate". */
ngx_int_t ngx_http_maskserve_generate_handler(ngx_http_request_t *r);

/*
 * Checks shared by the POST handlers before the body is read: method,
 * Content-Type, Content-Length (or chunked).  NGX_OK when they pass;
 * otherwise the error has been sent, *rc is what the handler returns, and
 * the result is NGX_DECLINED.
 */
ngx_int_t ngx_http_maskserve_check_post(ngx_http_request_t *r,
    ngx_int_t *rc);


#endif /* NGX_HTTP_MASKSERVE_GENERATE_H */
