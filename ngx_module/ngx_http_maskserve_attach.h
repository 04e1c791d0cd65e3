/*
 * ngx_http_maskserve_attach.h: each nginx worker process's attachments to
 * the maskserve worker regions: attach and re-attach, the wakeup and
 * liveness fds in nginx's event loop, the heartbeat, and the ring
 * consumer whose rows ngx_http_maskserve_route.c hands to their requests.
 */

#ifndef NGX_HTTP_MASKSERVE_ATTACH_H
#define NGX_HTTP_MASKSERVE_ATTACH_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_maskserve_module.h"


/* the re-attach period (ms) */
#define NGX_HTTP_MASKSERVE_RETRY       500
/* how long an attach waits for the worker's welcome (without blocking) */
#define NGX_HTTP_MASKSERVE_WELCOME     10000
/* the tick (ms): our heartbeat, the worker's liveness, a ring poll */
#define NGX_HTTP_MASKSERVE_TICK        200

/* consume passes in a row before other events get their turn */
#define NGX_HTTP_MASKSERVE_ROUNDS      4


ngx_int_t ngx_http_maskserve_attach_init_process(ngx_cycle_t *cycle,
    ngx_http_maskserve_main_conf_t *mcf);
void ngx_http_maskserve_attach_exit_process(ngx_cycle_t *cycle,
    ngx_http_maskserve_main_conf_t *mcf);

/* Slots not FREE in a region (all processes), for load and health. */
ngx_uint_t ngx_http_maskserve_attach_in_use(ngx_http_maskserve_region_t *rg);

/*
 * Is the region attached, ready and beating (a heartbeat within the stall
 * limit, maskserve_worker_stall_timeout)?  New requests go only there.
 */
ngx_int_t ngx_http_maskserve_attach_ready(ngx_http_maskserve_region_t *rg);

/*
 * Is the region's worker stalled: attached, but its heartbeat late
 * (MSV_HEARTBEAT_LATE_NS) though not yet past the stall limit?
 */
ngx_uint_t ngx_http_maskserve_attach_stalled(
    ngx_http_maskserve_region_t *rg);

/* The stall limit of the region's worker, in ns. */
uint64_t ngx_http_maskserve_attach_stall_ns(ngx_http_maskserve_region_t *rg);


#endif /* NGX_HTTP_MASKSERVE_ATTACH_H */
