/*
 * ngx_http_maskserve_control.h: the endpoints an RL trainer drives
 * between rollouts: pause, resume, abort requests, flush the prefix
 * cache, the models served and the metrics.  Admin endpoints: docs/API.md
 * shows them on their own location with allow/deny.
 */

#ifndef NGX_HTTP_MASKSERVE_CONTROL_H
#define NGX_HTTP_MASKSERVE_CONTROL_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_maskserve_module.h"


/* POST /inference/v1/pause {"mode": "abort" | "wait" | "keep"} */
ngx_int_t ngx_http_maskserve_pause_handler(ngx_http_request_t *r);

/* POST /inference/v1/resume {} */
ngx_int_t ngx_http_maskserve_resume_handler(ngx_http_request_t *r);

/* POST /inference/v1/update_weights_from_disk
 * {"model_path": DIR, "weight_version": "v17", "mode": ...} */
ngx_int_t ngx_http_maskserve_update_weights_handler(ngx_http_request_t *r);

/* POST /inference/v1/flush_cache {} */
ngx_int_t ngx_http_maskserve_flush_cache_handler(ngx_http_request_t *r);

/* POST /inference/v1/abort_requests {"request_ids": [...]} */
ngx_int_t ngx_http_maskserve_abort_requests_handler(ngx_http_request_t *r);

/*
 * Cancel every request in flight in every region this process attached
 * (the Redis abort channel's "*", from abort_requests with all_hosts).
 * Returns how many slots were cancelled.
 */
ngx_uint_t ngx_http_maskserve_abort_all_local(
    ngx_http_maskserve_main_conf_t *mcf);

/* GET /v1/models */
ngx_int_t ngx_http_maskserve_models_handler(ngx_http_request_t *r);

/* GET /metrics */
ngx_int_t ngx_http_maskserve_metrics_handler(ngx_http_request_t *r);


#endif /* NGX_HTTP_MASKSERVE_CONTROL_H */
