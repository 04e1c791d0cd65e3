/*
 * ngx_http_maskserve_redis_adapter.h: hiredis's asynchronous API in
 * nginx's event loop.  A redisAsyncContext's socket becomes an nginx
 * connection; read and write events drive redisAsyncHandleRead/Write, and
 * hiredis's timer (1.x) becomes an nginx timer.
 */

#ifndef NGX_HTTP_MASKSERVE_REDIS_ADAPTER_H
#define NGX_HTTP_MASKSERVE_REDIS_ADAPTER_H

#include <ngx_config.h>
#include <ngx_core.h>

#include <hiredis/async.h>


/*
 * Called when the event loop refuses to add or delete one of the
 * context's events; reason says which.  It runs from inside hiredis: the
 * callee must not free the context there (post an event to do it).
 */
typedef void (*ngx_http_maskserve_redis_fail_pt)(void *data,
    const char *reason);

/*
 * Wrap ac's socket in an nginx connection and set ac's event hooks.
 * timeout (ms) is hiredis's connect and command timeout where hiredis has
 * one.  NGX_ERROR: out of connections or memory, or ac already attached;
 * free ac then (redisAsyncFree runs the adapter's cleanup if needed).
 */
ngx_int_t ngx_http_maskserve_redis_adapter_attach(redisAsyncContext *ac,
    ngx_log_t *log, ngx_msec_t timeout, ngx_http_maskserve_redis_fail_pt fail,
    void *data);


#endif /* NGX_HTTP_MASKSERVE_REDIS_ADAPTER_H */
