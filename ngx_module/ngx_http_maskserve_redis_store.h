/*
 * ngx_http_maskserve_redis_store.h: the per-process map of request states
 * and the worker registry, and the backlog writer that puts them in Redis
 * whenever the command link is ready.  The public half is
 * ngx_http_maskserve_redis_req_update and _worker_update.
 */

#ifndef NGX_HTTP_MASKSERVE_REDIS_STORE_H
#define NGX_HTTP_MASKSERVE_REDIS_STORE_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_maskserve_redis_ctx.h"


void msv_redis_resync(msv_redis_ctx_t *ctx);
void msv_redis_flush_handler(ngx_event_t *ev);
void msv_redis_entry_unlink(msv_redis_ctx_t *ctx, msv_redis_entry_t *e);


#endif /* NGX_HTTP_MASKSERVE_REDIS_STORE_H */
