/*
 * ngx_http_maskserve_link.h: each nginx worker process's attachments to
 * the maskserve worker regions: attach and re-attach, the wakeup and
 * liveness fds in nginx's event loop, the ring consumer that hands rows
 * to their requests, and the slot table (slot -> request) of this
 * process.
 */

#ifndef NGX_HTTP_MASKSERVE_LINK_H
#define NGX_HTTP_MASKSERVE_LINK_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_maskserve_module.h"
#include "ngx_http_maskserve_parse.h"


/* the re-attach period, and the heartbeat period */
#define NGX_HTTP_MASKSERVE_RETRY       500
/* how long an attach waits for the worker's welcome (without blocking) */
#define NGX_HTTP_MASKSERVE_WELCOME     10000
#define NGX_HTTP_MASKSERVE_TICK        200

/* consume passes in a row before other events get their turn */
#define NGX_HTTP_MASKSERVE_ROUNDS      4

/* a stream sends what it holds once it reaches this, even mid-pass */
#define NGX_HTTP_MASKSERVE_FLUSH_BYTES (256 * 1024)

/* a worker whose heartbeat is older than this is not admitted to */
#define NGX_HTTP_MASKSERVE_STALE_NS    (10ULL * 1000 * 1000 * 1000)


ngx_int_t ngx_http_maskserve_link_init_process(ngx_cycle_t *cycle,
    ngx_http_maskserve_main_conf_t *mcf);
void ngx_http_maskserve_link_exit_process(ngx_cycle_t *cycle,
    ngx_http_maskserve_main_conf_t *mcf);

/*
 * The least loaded region among the location's that is attached and
 * ready, or NULL with a 503 in err (none attached, none ready).
 */
ngx_http_maskserve_region_t *ngx_http_maskserve_link_pick(
    ngx_http_maskserve_main_conf_t *mcf, ngx_http_maskserve_loc_conf_t *lcf,
    ngx_http_maskserve_err_t *err);

/*
 * Claim a slot in rg, fill and publish it, kick the worker and enter the
 * request in this process's slot table.  NGX_OK, or NGX_DECLINED when no
 * slot is free.
 */
ngx_int_t ngx_http_maskserve_link_submit(ngx_http_maskserve_region_t *rg,
    ngx_http_maskserve_ctx_t *ctx, ngx_http_maskserve_gen_t *g);

/*
 * The request stops before its last row: set the slot's cancel flag and
 * leave the slot table entry as an orphan, released when the worker's
 * final row for it arrives.
 */
void ngx_http_maskserve_link_cancel(ngx_http_maskserve_ctx_t *ctx);

/* Put ctx on its region's list of contexts with output to flush. */
void ngx_http_maskserve_link_dirty(ngx_http_maskserve_ctx_t *ctx);

/*
 * Look for a request in flight (claimed, submitted or running) in the
 * slot tables of every configured region this process is attached to.
 * NGX_OK with *rgp, *slot, *cookie and *state set, or NGX_DECLINED.
 */
ngx_int_t ngx_http_maskserve_link_find(ngx_http_maskserve_main_conf_t *mcf,
    u_char *id, size_t len, ngx_http_maskserve_region_t **rgp,
    ngx_uint_t *slot, uint64_t *cookie, uint32_t *state);

/* Slots not FREE in a region (all processes), for load and health. */
ngx_uint_t ngx_http_maskserve_link_in_use(ngx_http_maskserve_region_t *rg);

/* Is the region attached, ready and beating? */
ngx_int_t ngx_http_maskserve_link_ready(ngx_http_maskserve_region_t *rg);


#endif /* NGX_HTTP_MASKSERVE_LINK_H */
