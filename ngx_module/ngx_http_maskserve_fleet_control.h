/*
 * ngx_http_maskserve_fleet_control.h: the control endpoints on a front
 * (pause, resume, update_weights_from_disk, flush_cache, abort_requests),
 * fanned out to every GPU host of the registry through nginx subrequests
 * to an internal location that proxies to $maskserve_fleet_host, and
 * answered with one JSON object that gathers the hosts' answers.
 * docs/FLEET.md, "Control endpoints on a front".
 */

#ifndef NGX_HTTP_MASKSERVE_FLEET_CONTROL_H
#define NGX_HTTP_MASKSERVE_FLEET_CONTROL_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_maskserve_module.h"


/* maskserve_fleet_control LOCATION;  (location, front) */
char *ngx_http_maskserve_fleet_control_conf(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);

/* $maskserve_fleet_host: ip:port of the host a fan-out subrequest is for */
ngx_int_t ngx_http_maskserve_fleet_control_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);


#endif /* NGX_HTTP_MASKSERVE_FLEET_CONTROL_H */
