/*
 * ngx_http_maskserve_route.h: requests to and from the worker regions:
 * pick, submit, cancel, find, and the rows of the ring routed to their
 * requests through this process's slot table (slot -> request).
 */

#ifndef NGX_HTTP_MASKSERVE_ROUTE_H
#define NGX_HTTP_MASKSERVE_ROUTE_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_maskserve_module.h"
#include "ngx_http_maskserve_parse.h"


/* a stream sends what it holds once it reaches this, even mid-pass */
#define NGX_HTTP_MASKSERVE_FLUSH_BYTES (256 * 1024)


/*
 * The least loaded region among the location's that is attached and
 * ready, or NULL with a 503 in err (none attached, none ready).
 */
ngx_http_maskserve_region_t *ngx_http_maskserve_route_pick(
    ngx_http_maskserve_main_conf_t *mcf, ngx_http_maskserve_loc_conf_t *lcf,
    ngx_http_maskserve_err_t *err);

/* The same, among the regions with at least `want` free slots. */
ngx_http_maskserve_region_t *ngx_http_maskserve_route_pick_n(
    ngx_http_maskserve_main_conf_t *mcf, ngx_http_maskserve_loc_conf_t *lcf,
    ngx_uint_t want, ngx_http_maskserve_err_t *err);

/*
 * Claim a slot in rg for each choice of the request (ctx->n_choices, all
 * or none), fill and publish them (choice i with seed s + i), kick the
 * worker and enter the request in this process's slot table.  NGX_OK, or
 * NGX_DECLINED when not enough slots are free.
 */
ngx_int_t ngx_http_maskserve_route_submit(ngx_http_maskserve_region_t *rg,
    ngx_http_maskserve_ctx_t *ctx, ngx_http_maskserve_gen_t *g);

/*
 * The request stops before its last row: set the cancel flag of every
 * slot it holds and leave their slot table entries as orphans, released
 * when the worker's final row for each arrives.
 */
void ngx_http_maskserve_route_cancel(ngx_http_maskserve_ctx_t *ctx);

/*
 * An abort of the whole request: set the cancel flag of every slot it
 * still holds, keeping them routed to it, so that each choice ends with
 * "abort" and the tokens it produced.
 */
void ngx_http_maskserve_route_abort(ngx_http_maskserve_ctx_t *ctx);

/* Put ctx on its region's list of contexts with output to flush. */
void ngx_http_maskserve_route_dirty(ngx_http_maskserve_ctx_t *ctx);

/*
 * Look for a request in flight (claimed, submitted or running) in the
 * slot tables of every configured region this process is attached to.
 * NGX_OK with *rgp, *slot, *cookie and *state set, or NGX_DECLINED.
 */
ngx_int_t ngx_http_maskserve_route_find(ngx_http_maskserve_main_conf_t *mcf,
    u_char *id, size_t len, ngx_http_maskserve_region_t **rgp,
    ngx_uint_t *slot, uint64_t *cookie, uint32_t *state);

/*
 * Set the cancel flag of every slot of rg in flight for request id (every
 * choice of it), whichever process serves it.  The number of slots.
 */
ngx_uint_t ngx_http_maskserve_route_cancel_id(ngx_http_maskserve_region_t *rg,
    u_char *id, size_t len);

/*
 * The slots of rg in flight for request id (its choices), with the tokens
 * they produced so far and how many run.
 */
ngx_uint_t ngx_http_maskserve_route_count_id(ngx_http_maskserve_region_t *rg,
    u_char *id, size_t len, ngx_uint_t *out, ngx_uint_t *running);

/*
 * The ring consumer's callback (msv_consume, ud: the region): format the
 * row into its request's output.  Always 0: a row nobody waits for is
 * skipped.
 */
int ngx_http_maskserve_route_row(void *ud, uint64_t seq,
    const struct msv_row *w);

/*
 * The consumer's hint for a row some rows ahead (msv_consume_ahead): the
 * request state the row will touch, fetched in stages, each from what the
 * stage before brought in (4: the request, 3: its choice, 2: the
 * sections' buffers, 1: the bytes they will be written at).
 */
void ngx_http_maskserve_route_hint(void *ud, const struct msv_row *w,
    unsigned ahead);

/* Send what the region's requests hold (the contexts marked dirty). */
void ngx_http_maskserve_route_flush(ngx_http_maskserve_region_t *rg);


#endif /* NGX_HTTP_MASKSERVE_ROUTE_H */
