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

/*
 * After ngx_chain_update_chains: the sections a stream event held go on
 * in the rest of their buffers, and what nginx gave back goes to the
 * request's free lists, while it is still in the CPU's cache.
 */
void ngx_http_maskserve_output_sent(ngx_http_maskserve_ctx_t *ctx);

/* The stream's error event and "data: [DONE]". */
ngx_chain_t *ngx_http_maskserve_output_error_event(
    ngx_http_maskserve_ctx_t *ctx);

/* Bytes of memory the request's output occupies: pending + busy. */
size_t ngx_http_maskserve_output_held(ngx_http_maskserve_ctx_t *ctx);


/*
 * What this process formatted of mask payloads (sampling_mask and its
 * logprobs, not token_ids nor logprobs.content), by mask_format: rows,
 * ids, float32 logprobs, bytes of text (JSON: the rows' arrays with the
 * commas between them; packed: base64 characters, each string's padding
 * included) and the nanoseconds spent writing the ids (packed: with the
 * row lengths) and the logprobs (the time-stamp counter on x86,
 * CLOCK_MONOTONIC elsewhere, read before, between and after, about 30 ns
 * a row; converted at the end of each pass over the ring against
 * CLOCK_MONOTONIC, and scaled by the share of the pass the process was on
 * a CPU).
 */
#define NGX_HTTP_MASKSERVE_FMT_JSON    0
#define NGX_HTTP_MASKSERVE_FMT_PACKED  1
#define NGX_HTTP_MASKSERVE_FMT_N       2

typedef struct {
    uint64_t                       rows;
    uint64_t                       ids;
    uint64_t                       floats;
    uint64_t                       bytes;
    uint64_t                       ids_ns;
    uint64_t                       floats_ns;
} ngx_http_maskserve_fmt_count_t;

/*
 * The clock of the formatting intervals, in units the end of each pass
 * over the ring converts to nanoseconds: the time-stamp counter on x86,
 * CLOCK_MONOTONIC (ns) elsewhere.
 */
static ngx_inline uint64_t
ngx_http_maskserve_output_tick(void)
{
#if ((defined(__x86_64__) || defined(__i386__))                               \
     && (defined(__GNUC__) || defined(__clang__)))
    return __builtin_ia32_rdtsc();
#else
    struct timespec  ts;

    (void) clock_gettime(CLOCK_MONOTONIC, &ts);

    return (uint64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
#endif
}

/*
 * Copy the tally since the last call into out[NGX_HTTP_MASKSERVE_FMT_N]
 * (unless NULL) and zero it; whether there was any.
 */
ngx_uint_t ngx_http_maskserve_output_take(
    ngx_http_maskserve_fmt_count_t *out);


#endif /* NGX_HTTP_MASKSERVE_OUTPUT_H */
