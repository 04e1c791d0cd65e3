/*
 * ngx_http_maskserve_redis_fleet.h: reading the worker registry (the
 * <prefix>:workers set and the <prefix>:worker:<host>:<region> hashes
 * that GPU hosts write) for a front that routes to them.  docs/REDIS.md
 * describes the keys, docs/FLEET.md the front.
 */

#ifndef NGX_HTTP_MASKSERVE_REDIS_FLEET_H
#define NGX_HTTP_MASKSERVE_REDIS_FLEET_H

#include <ngx_config.h>
#include <ngx_core.h>


#define NGX_HTTP_MASKSERVE_FLEET_NAME_MAX   255   /* host, addr */
#define NGX_HTTP_MASKSERVE_FLEET_SCAN_MAX   1024  /* registry members read */


/* one registry hash as read; strings are NUL-terminated copies */
typedef struct {
    u_char       host[NGX_HTTP_MASKSERVE_FLEET_NAME_MAX + 1];
    u_char       addr[NGX_HTTP_MASKSERVE_FLEET_NAME_MAX + 1];
    size_t       host_len;
    size_t       addr_len;
    ngx_uint_t   capacity;
    ngx_uint_t   load;
    ngx_uint_t   alive;
    ngx_uint_t   draining;      /* its worker is draining (SIGTERM) */
    uint64_t     heartbeat;     /* ms epoch, the host's clock */
    unsigned     present:1;     /* the key existed */
} ngx_http_maskserve_redis_worker_rec_t;


/*
 * Called from the event loop with rc NGX_OK and every registry member
 * whose key still exists (recs valid during the call only), or with
 * NGX_ERROR when Redis failed or went away during the scan.
 */
typedef void (*ngx_http_maskserve_redis_scan_pt)(void *data, ngx_int_t rc,
    ngx_http_maskserve_redis_worker_rec_t *recs, ngx_uint_t n);

/*
 * SMEMBERS <prefix>:workers, then HGETALL of each member, pipelined.
 * Returns NGX_OK when the scan was sent (cb will run), NGX_BUSY while the
 * previous one is unanswered, NGX_DECLINED when Redis is not connected.
 * The process must not exit with a scan in flight unanswered: Redis's
 * exit closes the link, which answers it with NGX_ERROR.
 */
ngx_int_t ngx_http_maskserve_redis_scan_workers(
    ngx_http_maskserve_redis_scan_pt cb, void *data);


#endif /* NGX_HTTP_MASKSERVE_REDIS_FLEET_H */
