/*
 * ngx_http_maskserve_stream.h: getting a generation request's output to
 * the client: server-sent events as rows arrive (streaming) or one JSON
 * body at the end, write back-pressure, the flush and watchdog timer, and
 * the request's end.
 */

#ifndef NGX_HTTP_MASKSERVE_STREAM_H
#define NGX_HTTP_MASKSERVE_STREAM_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_maskserve_module.h"


/* The request was admitted: install the event handlers and the timer. */
void ngx_http_maskserve_stream_start(ngx_http_maskserve_ctx_t *ctx);

/*
 * Rows were added or the request ended: send what the flush policy and
 * the client's pace allow; at the end send the last event or the body (or
 * the error) and finalize the request.  ctx may be gone on return.
 */
void ngx_http_maskserve_stream_flush(ngx_http_maskserve_ctx_t *ctx);

/* Finalize from an event that is not the request's own. */
void ngx_http_maskserve_stream_finalize(ngx_http_request_t *r,
    ngx_int_t rc);


#endif /* NGX_HTTP_MASKSERVE_STREAM_H */
