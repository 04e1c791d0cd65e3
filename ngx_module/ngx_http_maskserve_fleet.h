/*
 * ngx_http_maskserve_fleet.h: the front role.  A front nginx runs no
 * maskserve worker: it reads the GPU hosts from the worker registry in
 * Redis and hands each request to nginx's own proxy through an upstream
 * whose balancer (maskserve_fleet) picks the host.  Requests about one
 * request id (abort, status) are pinned to the host that runs it
 * (maskserve_fleet_owner).  docs/FLEET.md describes the role.
 */

#ifndef NGX_HTTP_MASKSERVE_FLEET_H
#define NGX_HTTP_MASKSERVE_FLEET_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_maskserve_module.h"


/* maskserve_fleet [affinity=V] [stale=T] [max_fails=N] [fail_timeout=T]
 * [refresh=T];  (upstream) */
char *ngx_http_maskserve_fleet_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* the precontent handler of maskserve_fleet_owner locations */
ngx_int_t ngx_http_maskserve_fleet_postconf(ngx_conf_t *cf);

/* maskserve_fleet_health: the front's /health */
ngx_int_t ngx_http_maskserve_fleet_health_handler(ngx_http_request_t *r);

/* NGX_ERROR: maskserve_fleet without maskserve_redis */
char *ngx_http_maskserve_fleet_check(ngx_conf_t *cf,
    ngx_http_maskserve_main_conf_t *mcf);

/* a host a control request is fanned out to */
typedef struct {
    ngx_str_t    name;
    ngx_str_t    addr;          /* ip:port */
    const char  *state;         /* as in the front's /health */
} ngx_http_maskserve_fleet_target_t;

/*
 * Every host of the registry as this process last read it whose keys
 * exist and that has an address, whatever its load, heartbeat or
 * failures (a host that cannot answer is then named as failed), draining
 * hosts only when draining is set; pushed to out, copied into pool.
 * NGX_DECLINED: this nginx is not a front.
 */
ngx_int_t ngx_http_maskserve_fleet_targets(ngx_pool_t *pool,
    ngx_uint_t draining, ngx_array_t *out);

/* the registry scans of a front process */
ngx_int_t ngx_http_maskserve_fleet_init_process(ngx_cycle_t *cycle,
    ngx_http_maskserve_main_conf_t *mcf);
void ngx_http_maskserve_fleet_exit_process(ngx_cycle_t *cycle);


#endif /* NGX_HTTP_MASKSERVE_FLEET_H */
