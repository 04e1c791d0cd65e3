/*
 * ngx_http_maskserve_util.h: helpers every file of the module uses: the
 * regions of a configuration, and JSON answers and errors.
 */

#ifndef NGX_HTTP_MASKSERVE_UTIL_H
#define NGX_HTTP_MASKSERVE_UTIL_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_maskserve_module.h"


ngx_http_maskserve_region_t *ngx_http_maskserve_region(
    ngx_http_maskserve_main_conf_t *mcf, ngx_uint_t i);


/* The regions a location serves: its maskserve_worker list, else all. */
ngx_uint_t ngx_http_maskserve_loc_nregions(
    ngx_http_maskserve_main_conf_t *mcf, ngx_http_maskserve_loc_conf_t *lcf);
ngx_http_maskserve_region_t *ngx_http_maskserve_loc_region(
    ngx_http_maskserve_main_conf_t *mcf, ngx_http_maskserve_loc_conf_t *lcf,
    ngx_uint_t i);

/* Send b as a JSON answer and return what finalize expects. */
ngx_int_t ngx_http_maskserve_send_json(ngx_http_request_t *r,
    ngx_uint_t status, ngx_buf_t *b);

/* Send b whole, with this status and content type (a string that
 * outlives the request); what finalize expects. */
ngx_int_t ngx_http_maskserve_send_buf(ngx_http_request_t *r,
    ngx_uint_t status, ngx_str_t *type, ngx_buf_t *b);

/* The inside of a JSON string: control bytes, DEL, quotes and backslashes
 * escaped, and with ascii every byte >= 0x80 too (as \u00XX); at most 6
 * bytes out for each byte in. */
u_char *ngx_http_maskserve_json_escape(u_char *p, u_char *s, size_t len,
    ngx_uint_t ascii);

/* Send a JSON error answer and return what finalize expects. */
ngx_int_t ngx_http_maskserve_send_error(ngx_http_request_t *r,
    ngx_http_maskserve_err_t *err);

/* Fill err; message is a static string or one allocated in a pool. */
void ngx_http_maskserve_set_error(ngx_http_maskserve_err_t *err,
    ngx_uint_t status, const char *type, const char *param,
    u_char *message, size_t len);

#define ngx_http_maskserve_error(err, st, type, param, msg)                  \
    ngx_http_maskserve_set_error(err, st, type, param, (u_char *) msg,       \
                                 sizeof(msg) - 1)

#define NGX_HTTP_MASKSERVE_INVALID   "invalid_request_error"
#define NGX_HTTP_MASKSERVE_SERVER    "server_error"
#define NGX_HTTP_MASKSERVE_OVERLOAD  "overloaded"


#endif /* NGX_HTTP_MASKSERVE_UTIL_H */
