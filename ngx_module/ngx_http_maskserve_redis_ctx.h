/*
 * ngx_http_maskserve_redis_ctx.h: the per-process Redis state shared by
 * the files that implement ngx_http_maskserve_redis.h: the links
 * (ngx_http_maskserve_redis_link.c), the request map and its backlog
 * (ngx_http_maskserve_redis_store.c), and the life cycle and lookups
 * (ngx_http_maskserve_redis.c).  Nothing outside them includes it.
 * The state itself is created and freed by ngx_http_maskserve_redis.c.
 */

#ifndef NGX_HTTP_MASKSERVE_REDIS_CTX_H
#define NGX_HTTP_MASKSERVE_REDIS_CTX_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include <netdb.h>

#include <hiredis/hiredis.h>
#include <hiredis/async.h>

#include "msv_shm.h"
#include "ngx_http_maskserve_redis.h"
#include "ngx_http_maskserve_redis_cmd.h"
#include "ngx_http_maskserve_redis_link.h"


#define MSV_REDIS_MAX_ENTRIES    10000   /* request ids kept per process */
#define MSV_REDIS_BUCKETS        16384   /* hash buckets, a power of two */
#define MSV_REDIS_MAX_WORKERS    64      /* registry entries per process */
#define MSV_REDIS_WORKER_TTL     10000   /* ms, registry key lifetime */
#define MSV_REDIS_TIMEOUT        2000    /* ms without a reply: link dead */
#define MSV_REDIS_BACKOFF_MIN    100     /* ms, first reconnect delay */
#define MSV_REDIS_BACKOFF_MAX    2000    /* ms, reconnect delay cap */
#define MSV_REDIS_EXIT_FLUSH     500     /* ms spent writing at exit */
#define MSV_REDIS_HIGH_PENDING   100000  /* replies owed: stop sending */
#define MSV_REDIS_LOW_PENDING    10000   /* ... and resume below this */

/* request ids are at most MSV_REQ_ID_MAX, regions MSV_NAME_MAX bytes */
#define MSV_REDIS_HOST_MAX       255     /* Redis host, our host name */
#define MSV_REDIS_PREFIX_MAX     128
#define MSV_REDIS_FINISH_MAX     47
#define MSV_REDIS_REGION_MIN     64      /* region room in a new entry */


typedef struct msv_redis_entry_s  msv_redis_entry_t;


/* the latest known state of one request id */
struct msv_redis_entry_s {
    msv_redis_entry_t                *hnext;    /* hash chain */
    ngx_queue_t                       queue;    /* active or finished */
    ngx_uint_t                        hash;
    ngx_str_t                         id;       /* bytes after the struct */
    ngx_str_t                         region;   /* bytes after the id */
    size_t                            region_room;
    ngx_uint_t                        slot;
    uint64_t                          cookie;
    ngx_http_maskserve_req_state_e    state;
    ngx_uint_t                        prompt_tokens;
    ngx_uint_t                        completion_tokens;
    uint64_t                          t_admit;  /* ms epoch */
    uint64_t                          t_update;
    ngx_uint_t                        inflight; /* commands owed replies */
    u_char                            finish[MSV_REDIS_FINISH_MAX + 1];
    unsigned                          dirty:1;  /* not yet sent */
    unsigned                          finished:1;
    unsigned                          orphan:1; /* evicted while in flight */
};


typedef struct {
    u_char                            region[MSV_NAME_MAX];
    size_t                            region_len;
    ngx_uint_t                        capacity;
    ngx_uint_t                        load;
    uint64_t                          generation;
    ngx_int_t                         alive;
    uint64_t                          heartbeat;  /* ms epoch */
    unsigned                          dirty:1;
    unsigned                          draining:1;
    unsigned                          removed:1;  /* deregistered */
} msv_redis_worker_t;


typedef struct {
    ngx_http_maskserve_redis_get_pt   cb;       /* NULL once cancelled */
    void                             *data;
    ngx_event_t                       ev;       /* answers without Redis */
    unsigned                          local:1;  /* ev posted, not sent */
    unsigned                          done:1;   /* answered during exit */
} msv_redis_get_t;


typedef struct {
    ngx_log_t                        *log;

    /* configuration, copied */
    char                              host[MSV_REDIS_HOST_MAX + 1];
    char                              addr[NI_MAXHOST];   /* numeric */
    char                              peer[MSV_REDIS_HOST_MAX + 8]; /* log */
    int                               port;
    unsigned                          unix_socket:1;
    ngx_str_t                         password;
    ngx_int_t                         db;
    ngx_str_t                         prefix;
    ngx_str_t                         hostname;
    ngx_str_t                         address;   /* "addr" in the registry */
    ngx_msec_t                        req_ttl;
    ngx_str_t                         channel;   /* <prefix>:abort */
    ngx_str_t                         workers;   /* <prefix>:workers */

    msv_redis_link_t                  cmd;
    msv_redis_link_t                  sub;
    ngx_event_t                       flush;     /* posted: write backlog */

    /* request map */
    msv_redis_entry_t               **buckets;
    ngx_queue_t                       active;    /* oldest first */
    ngx_queue_t                       finished;  /* oldest first */
    ngx_uint_t                        nentries;
    ngx_uint_t                        dropped;

    msv_redis_worker_t                wk[MSV_REDIS_MAX_WORKERS];
    ngx_uint_t                        nwk;

    time_t                            err_time;  /* last error reply logged */
    ngx_uint_t                        err_quiet; /* ... and not logged since */

    unsigned                          throttled:1;
    unsigned                          exiting:1;
} msv_redis_ctx_t;


/*
 * Per-process state, created in init_process of a worker process.  It is
 * never shared: each nginx worker has its own links and map.
 */
extern msv_redis_ctx_t  *msv_redis;
extern void            (*msv_redis_abort_handler)(ngx_str_t *id);


/* ngx_http_maskserve_redis.c */
void msv_redis_reply_error(msv_redis_ctx_t *ctx, const char *what,
    ngx_str_t *name, redisReply *reply);
ngx_int_t msv_redis_check_len(msv_redis_ctx_t *ctx, ngx_str_t *s,
    size_t max, const char *what);


#endif /* NGX_HTTP_MASKSERVE_REDIS_CTX_H */
