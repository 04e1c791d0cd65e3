/*
 * ngx_http_maskserve_redis_link.h: one link to Redis (a
 * redisAsyncContext), made and remade with capped exponential backoff,
 * with a handshake (AUTH, SELECT, PING or SUBSCRIBE) and a reply
 * watchdog.
 */

#ifndef NGX_HTTP_MASKSERVE_REDIS_LINK_H
#define NGX_HTTP_MASKSERVE_REDIS_LINK_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include <hiredis/hiredis.h>
#include <hiredis/async.h>

#include "ngx_http_maskserve_redis_cmd.h"


typedef struct msv_redis_link_s   msv_redis_link_t;

struct msv_redis_link_s {
    const char                       *name;     /* for the log */
    redisAsyncContext                *ac;       /* NULL while down */
    ngx_event_t                       reconnect;
    ngx_event_t                       watchdog; /* reply progress */
    ngx_event_t                       close;    /* posted from callbacks */
    const char                       *reason;   /* why it is closed */
    ngx_msec_t                        backoff;
    ngx_uint_t                        pending;  /* replies owed to us */
    ngx_uint_t                        handshake;/* handshake replies owed */
    ngx_uint_t                        failures; /* attempts since ready */
    ngx_uint_t                        readies;
    unsigned                          ready:1;
    unsigned                          closing:1;
    unsigned                          subscriber:1;
};


void msv_redis_link_init(msv_redis_link_t *link, const char *name,
    ngx_uint_t subscriber, ngx_log_t *log);
void msv_redis_link_connect(msv_redis_link_t *link);
void msv_redis_link_close(msv_redis_link_t *link, const char *reason);
void msv_redis_link_fail(msv_redis_link_t *link, const char *reason);
ngx_int_t msv_redis_link_send(msv_redis_link_t *link, redisCallbackFn *fn,
    void *privdata, msv_redis_cmd_t *cmd);
void msv_redis_link_replied(msv_redis_link_t *link, void *reply);
void msv_redis_exit_flush(msv_redis_link_t *link);


#endif /* NGX_HTTP_MASKSERVE_REDIS_LINK_H */
