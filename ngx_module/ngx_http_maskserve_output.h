/*
 * ngx_http_maskserve_output.h: ring rows -> JSON text in a request's own
 * buffers, and the assembly of those buffers into a response body or a
 * stream event.
 *
 * A request keeps, for each choice, sections that are chains of buffers:
 * the token ids, the mask rows, the mask logprobs and the logprobs content
 * (and, packed, the row lengths and the top entries' parts).  Every row is
 * appended to them as it is consumed (numbers written by msv_json, or
 * base64 by msv_b64; no intermediate objects).  A stream event or the final body links the
 * sections between small pieces of glue, without copying them.
 */

#ifndef NGX_HTTP_MASKSERVE_OUTPUT_H
#define NGX_HTTP_MASKSERVE_OUTPUT_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "msv_shm.h"
#include "ngx_http_maskserve_module.h"


/*
 * Prepare the choices and their sections (empty) of a new request:
 * NGX_OK, or NGX_ERROR when out of memory.
 */
ngx_int_t ngx_http_maskserve_output_init(ngx_http_maskserve_ctx_t *ctx);

/*
 * Append a row to the sections.  NGX_ERROR when the request must fail
 * (the row is malformed or wider than maskserve_max_support, the output
 * limit is exceeded, no memory); ctx->err says why.
 */
ngx_int_t ngx_http_maskserve_output_row(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch, const struct msv_row *w);

/*
 * Does any section hold output not sent yet (or, streaming, has a choice
 * ended that no event told yet)?
 */
ngx_int_t ngx_http_maskserve_output_pending(ngx_http_maskserve_ctx_t *ctx);

/*
 * Link the sections into a chain, empty them, and return the chain and its
 * length.  Stream: one "data: {...}\n\n" event of the choices with new
 * tokens or a new end (each choice's finish_reason in the event that ends
 * it), with usage when final, then "data: [DONE]\n\n".  Otherwise the
 * whole JSON body, every choice.  NULL when out of memory.
 */
ngx_chain_t *ngx_http_maskserve_output_compose(ngx_http_maskserve_ctx_t *ctx,
    ngx_uint_t final, off_t *len);

/* The stream's error event and "data: [DONE]". */
ngx_chain_t *ngx_http_maskserve_output_error_event(
    ngx_http_maskserve_ctx_t *ctx);

/* Bytes of memory the request's output occupies: pending + busy. */
size_t ngx_http_maskserve_output_held(ngx_http_maskserve_ctx_t *ctx);


#endif /* NGX_HTTP_MASKSERVE_OUTPUT_H */
