/*
 * ngx_http_maskserve_stats.h: what nginx itself did, summed over its
 * worker processes: the mask payloads each process formatted (rows, ids,
 * float32 logprobs, bytes of text and the time spent writing them), for
 * GET /metrics.
 *
 * The output writer tallies each row in its process
 * (ngx_http_maskserve_output_take); after every pass over the ring the
 * process adds its tally to its own slot of a shared zone; /metrics sums
 * the slots.  The zone outlives reloads (same name and size), so the
 * counters only start again from zero when nginx restarts.
 */

#ifndef NGX_HTTP_MASKSERVE_STATS_H
#define NGX_HTTP_MASKSERVE_STATS_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_maskserve_module.h"


/* The most the metrics text below takes. */
#define NGX_HTTP_MASKSERVE_STATS_TEXT  4096


/* Add the zone to the configuration (init main conf); NGX_OK or
 * NGX_ERROR. */
ngx_int_t ngx_http_maskserve_stats_conf(ngx_conf_t *cf,
    ngx_http_maskserve_main_conf_t *mcf);

/* This process's slot (init process). */
void ngx_http_maskserve_stats_init_process(
    ngx_http_maskserve_main_conf_t *mcf);
void ngx_http_maskserve_stats_exit_process(void);

/* Add what this process formatted since the last call to its slot. */
void ngx_http_maskserve_stats_publish(void);

/* The maskserve_format_* families, every slot summed, at p (at most
 * NGX_HTTP_MASKSERVE_STATS_TEXT bytes); nothing without a zone. */
u_char *ngx_http_maskserve_stats_metrics(ngx_http_maskserve_main_conf_t *mcf,
    u_char *p);


#endif /* NGX_HTTP_MASKSERVE_STATS_H */
