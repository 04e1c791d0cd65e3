/*
 * ngx_http_maskserve_redis.h: request metadata, the worker registry and
 * cross-process aborts in Redis, through hiredis's asynchronous API
 * running inside nginx's event loop.
 *
 * Every nginx worker process holds two connections to Redis: one for
 * commands and one subscribed to the abort channel.  Nothing here blocks:
 * a command is queued on the connection and its reply handled when it
 * arrives.  While Redis is down, request updates are kept in a bounded
 * per-process map (latest state per request id) and written again once
 * Redis is back.  docs/REDIS.md describes the keys and their fields.
 *
 * All functions are safe to call when Redis is not configured or the
 * process holds no connection (master, cache manager): they do nothing,
 * and req_get answers NGX_ERROR.
 */

#ifndef NGX_HTTP_MASKSERVE_REDIS_H
#define NGX_HTTP_MASKSERVE_REDIS_H

#include <ngx_config.h>
#include <ngx_core.h>


typedef struct {
    ngx_str_t    host;       /* address, name, or "unix:/path" */
    ngx_str_t    addr;       /* host's numeric address, see _resolve */
    ngx_int_t    port;
    ngx_str_t    password;   /* AUTH on connect when not empty */
    ngx_int_t    db;         /* SELECT on connect when > 0 */
    ngx_str_t    prefix;     /* key prefix, "msv" when empty */
    ngx_msec_t   req_ttl;    /* request key lifetime; 0: never expire */
    ngx_str_t    hostname;   /* this host in keys; gethostname() if empty */
    ngx_str_t    address;    /* HTTP address fronts reach this host at */
} ngx_http_maskserve_redis_conf_t;


/*
 * Resolve rcf->host into rcf->addr at configuration time (nothing for a
 * unix socket); logs and returns NGX_CONF_ERROR when the name is unknown.
 */
char *ngx_http_maskserve_redis_resolve(ngx_conf_t *cf,
    ngx_http_maskserve_redis_conf_t *rcf);

/*
 * Per-process life cycle, called from the module's init_process and
 * exit_process.  init_process connects only in worker (or single)
 * processes and returns NGX_OK elsewhere; NGX_ERROR means bad
 * configuration or no memory.  The connection itself is made
 * asynchronously and retried with capped exponential backoff.
 */
ngx_int_t ngx_http_maskserve_redis_init_process(ngx_cycle_t *cycle,
    ngx_http_maskserve_redis_conf_t *rcf);
void ngx_http_maskserve_redis_exit_process(ngx_cycle_t *cycle);

/* 1: both connections up and ready; 0: down, connecting, or degraded */
ngx_int_t ngx_http_maskserve_redis_connected(void);

/*
 * Worker registry: HSET <prefix>:worker:<hostname>:<region>, PEXPIRE
 * 10 s, SADD <prefix>:workers <hostname>:<region>.  Call it at least
 * every few seconds per attached region (the key expires otherwise).
 * draining: the region's worker is draining (SIGTERM), written as the
 * "draining" field.
 */
void ngx_http_maskserve_redis_worker_update(ngx_str_t *region,
    ngx_uint_t capacity, ngx_uint_t load, uint64_t generation,
    ngx_int_t alive, ngx_uint_t draining);

/*
 * Deregister a region whose worker drained: DEL its key, SREM it from
 * <prefix>:workers (sent again after a reconnect while it is not
 * updated again).
 */
void ngx_http_maskserve_redis_worker_remove(ngx_str_t *region);

/* The "state" field of a request's key. */
typedef enum {
    NGX_HTTP_MASKSERVE_REQ_ADMITTED = 0,
    NGX_HTTP_MASKSERVE_REQ_RUNNING,
    NGX_HTTP_MASKSERVE_REQ_FINISHED,        /* this and later: terminal */
    NGX_HTTP_MASKSERVE_REQ_ABORTED,
    NGX_HTTP_MASKSERVE_REQ_UNKNOWN          /* a record: absent, or other */
} ngx_http_maskserve_req_state_e;

/*
 * Request metadata: HSET <prefix>:req:<id> + PEXPIRE req_ttl.  finish may
 * be NULL (no finish reason yet).  The strings are copied.  t_admit is
 * taken when a request id is first seen, t_update on every call.
 */
void ngx_http_maskserve_redis_req_update(ngx_str_t *id, ngx_str_t *region,
    ngx_uint_t slot, uint64_t cookie, ngx_http_maskserve_req_state_e state,
    ngx_uint_t prompt_tokens, ngx_uint_t completion_tokens,
    const char *finish);

/*
 * A request's key as HGETALL returned it: every field in Redis's order
 * (the strings are raw bytes, not NUL-terminated), and its state.
 */
typedef struct {
    ngx_http_maskserve_req_state_e  state;
    ngx_keyval_t                   *fields;
    ngx_uint_t                      nfields;
} ngx_http_maskserve_redis_record_t;

/*
 * HGETALL <prefix>:req:<id>.  The callback runs later from the event
 * loop, never from inside req_get, with rc:
 *   NGX_OK        rec holds the key's fields, valid only during the
 *                 callback;
 *   NGX_DECLINED  no such key (rec NULL);
 *   NGX_ERROR     Redis down, timed out or answered an error (rec NULL).
 * Returns a handle for ngx_http_maskserve_redis_cancel, or NULL when out
 * of memory (the callback will not run).
 */
typedef void (*ngx_http_maskserve_redis_get_pt)(void *data, ngx_int_t rc,
    ngx_http_maskserve_redis_record_t *rec);

void *ngx_http_maskserve_redis_req_get(ngx_str_t *id,
    ngx_http_maskserve_redis_get_pt cb, void *data);

/*
 * Forget a req_get before its callback ran (from a request cleanup): the
 * callback will not run.  Must not be called after the callback ran.
 */
void ngx_http_maskserve_redis_cancel(void *handle);

/*
 * Abort by id across processes and hosts: PUBLISH <prefix>:abort <id>.
 * Every subscribed process (this one included) calls the handler set with
 * set_abort_handler with the id, from its event loop.  While Redis is down
 * the message is dropped with a warning (check _connected() first to
 * tell the client).
 */
void ngx_http_maskserve_redis_publish_abort(ngx_str_t *id);
void ngx_http_maskserve_redis_set_abort_handler(void (*h)(ngx_str_t *id));


/* counters for /health */
typedef struct {
    ngx_uint_t   connected;     /* as ngx_http_maskserve_redis_connected */
    ngx_uint_t   tracked;       /* request ids in the per-process map */
    ngx_uint_t   unsynced;      /* of those, not yet written to Redis */
    ngx_uint_t   dropped;       /* updates lost to the map's bound */
    ngx_uint_t   reconnects;    /* connections made after the first */
} ngx_http_maskserve_redis_stats_t;

void ngx_http_maskserve_redis_stats(ngx_http_maskserve_redis_stats_t *st);


#endif /* NGX_HTTP_MASKSERVE_REDIS_H */
