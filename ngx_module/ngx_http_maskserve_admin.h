/*
 * ngx_http_maskserve_admin.h: the handlers around generation: abort by
 * request id, request status, and health.
 */

#ifndef NGX_HTTP_MASKSERVE_ADMIN_H
#define NGX_HTTP_MASKSERVE_ADMIN_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/* POST /inference/v1/abort {"request_id": "..."} */
ngx_int_t ngx_http_maskserve_abort_handler(ngx_http_request_t *r);

/* GET /inference/v1/requests/{id} */
ngx_int_t ngx_http_maskserve_status_handler(ngx_http_request_t *r);

/* GET /health */
ngx_int_t ngx_http_maskserve_health_handler(ngx_http_request_t *r);

/*
 * Cancel a request in flight on this host by id (the Redis abort
 * channel's handler).  NGX_OK when found, else NGX_DECLINED.
 */
void ngx_http_maskserve_abort_local_id(ngx_str_t *id);


#endif /* NGX_HTTP_MASKSERVE_ADMIN_H */
