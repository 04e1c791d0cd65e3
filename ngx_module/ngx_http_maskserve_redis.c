/*
 * ngx_http_maskserve_redis.c: hiredis's asynchronous API inside nginx's
 * event loop.
 *
 * Each nginx worker process owns two links to Redis, created in
 * init_process: "command" (HSET/PEXPIRE/SADD/HGETALL/PUBLISH) and
 * "subscriber" (SUBSCRIBE <prefix>:abort).  A link is a redisAsyncContext
 * whose socket is wrapped in an nginx connection (the adapter below).
 * Links are made and remade from timers with capped exponential backoff;
 * a reply watchdog closes a link that stops answering.
 *
 * Request metadata goes through a bounded per-process map: req_update
 * records the latest state of a request id and writes it when the command
 * link is ready; entries stay until their last state is written, so
 * whatever happened while Redis was away is written again when it comes
 * back.
 *
 * Rules that keep this safe:
 *   - hiredis is never re-entered from one of its own callbacks: a link is
 *     closed (redisAsyncFree) only from a timer or a posted event;
 *   - the adapter's cleanup frees the nginx connection but never closes
 *     the fd: hiredis closes it right after;
 *   - every command's privdata outlives the HTTP request that caused it
 *     (req_get handles are cleared by ngx_http_maskserve_redis_cancel).
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <hiredis/hiredis.h>
#include <hiredis/async.h>

#include "ngx_http_maskserve_redis.h"


#if (HIREDIS_MAJOR >= 1)
/* hiredis 1.x: ev.scheduleTimer, redisAsyncSetTimeout, HandleTimeout */
#define MSV_REDIS_HIREDIS_TIMER  1
#else
#define MSV_REDIS_HIREDIS_TIMER  0
#endif


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

#define MSV_REDIS_ID_MAX         512     /* request id bytes */
#define MSV_REDIS_NAME_MAX       255     /* region and host name bytes */
#define MSV_REDIS_PREFIX_MAX     128
#define MSV_REDIS_FINISH_MAX     47
#define MSV_REDIS_REGION_MIN     64      /* region room in a new entry */

#define MSV_REDIS_MAX_ARGS       32
#define MSV_REDIS_ARG_BYTES      2048    /* keys and numbers of a command */


typedef struct msv_redis_link_s   msv_redis_link_t;
typedef struct msv_redis_entry_s  msv_redis_entry_t;


/* ev.data of a redisAsyncContext: one per context, freed in cleanup */
typedef struct {
    ngx_connection_t                 *conn;
    redisAsyncContext                *ac;
    msv_redis_link_t                 *link;
#if (MSV_REDIS_HIREDIS_TIMER)
    ngx_event_t                       timer;    /* ev.scheduleTimer */
#endif
} msv_redis_adapter_t;


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
    ngx_uint_t                        state;    /* msv_redis_states[] */
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
    u_char                            region[MSV_REDIS_NAME_MAX];
    size_t                            region_len;
    ngx_uint_t                        capacity;
    ngx_uint_t                        load;
    uint64_t                          generation;
    ngx_int_t                         alive;
    uint64_t                          heartbeat;  /* ms epoch */
    unsigned                          dirty:1;
} msv_redis_worker_t;


/* a command being assembled: argv plus room for keys and numbers */
typedef struct {
    const char                       *argv[MSV_REDIS_MAX_ARGS];
    size_t                            argvlen[MSV_REDIS_MAX_ARGS];
    int                               argc;
    ngx_uint_t                        overflow;
    u_char                           *pos;
    u_char                            buf[MSV_REDIS_ARG_BYTES];
} msv_redis_cmd_t;


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
    char                              host[MSV_REDIS_NAME_MAX + 1];
    char                              addr[NI_MAXHOST];   /* numeric */
    char                              peer[MSV_REDIS_NAME_MAX + 8]; /* log */
    int                               port;
    unsigned                          unix_socket:1;
    ngx_str_t                         password;
    ngx_int_t                         db;
    ngx_str_t                         prefix;
    ngx_str_t                         hostname;
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


static void msv_redis_ctx_free(msv_redis_ctx_t *ctx);
static ngx_int_t msv_redis_conf(msv_redis_ctx_t *ctx,
    ngx_http_maskserve_redis_conf_t *rcf, ngx_cycle_t *cycle);
static ngx_int_t msv_redis_resolve(msv_redis_ctx_t *ctx);
static ngx_str_t *msv_redis_strdup(ngx_str_t *dst, u_char *src, size_t len,
    ngx_log_t *log);

static void msv_redis_link_init(msv_redis_link_t *link, const char *name,
    ngx_uint_t subscriber, ngx_log_t *log);
static void msv_redis_link_connect(msv_redis_link_t *link);
static void msv_redis_link_reset(msv_redis_link_t *link,
    redisAsyncContext *ac);
static ngx_int_t msv_redis_link_handshake(msv_redis_link_t *link,
    msv_redis_cmd_t *cmd);
static void msv_redis_link_retry(msv_redis_link_t *link);
static void msv_redis_link_close(msv_redis_link_t *link, const char *reason);
static void msv_redis_link_fail(msv_redis_link_t *link, const char *reason);
static void msv_redis_link_lost(msv_redis_link_t *link,
    const redisAsyncContext *ac, const char *reason);
static void msv_redis_link_ready(msv_redis_link_t *link);
static ngx_int_t msv_redis_link_send(msv_redis_link_t *link,
    redisCallbackFn *fn, void *privdata, msv_redis_cmd_t *cmd);
static void msv_redis_link_replied(msv_redis_link_t *link, void *reply);
static void msv_redis_reconnect_handler(ngx_event_t *ev);
static void msv_redis_watchdog_handler(ngx_event_t *ev);
static void msv_redis_close_handler(ngx_event_t *ev);
static void msv_redis_exit_flush(msv_redis_link_t *link);

static ngx_int_t msv_redis_attach(redisAsyncContext *ac,
    msv_redis_link_t *link);
static void msv_redis_add_read(void *privdata);
static void msv_redis_del_read(void *privdata);
static void msv_redis_add_write(void *privdata);
static void msv_redis_del_write(void *privdata);
static void msv_redis_event_set(msv_redis_adapter_t *a, ngx_uint_t write,
    ngx_uint_t add, const char *reason);
static void msv_redis_cleanup(void *privdata);
static void msv_redis_read_handler(ngx_event_t *rev);
static void msv_redis_write_handler(ngx_event_t *wev);
#if (MSV_REDIS_HIREDIS_TIMER)
static void msv_redis_schedule_timer(void *privdata, struct timeval tv);
static void msv_redis_timer_handler(ngx_event_t *ev);
#endif

static void msv_redis_connect_cb(const redisAsyncContext *ac, int status);
static void msv_redis_disconnect_cb(const redisAsyncContext *ac,
    int status);
static void msv_redis_handshake_cb(redisAsyncContext *ac, void *r,
    void *privdata);
static void msv_redis_sub_cb(redisAsyncContext *ac, void *r,
    void *privdata);
static void msv_redis_entry_cb(redisAsyncContext *ac, void *r,
    void *privdata);
static void msv_redis_worker_cb(redisAsyncContext *ac, void *r,
    void *privdata);
static void msv_redis_plain_cb(redisAsyncContext *ac, void *r,
    void *privdata);
static void msv_redis_get_cb(redisAsyncContext *ac, void *r,
    void *privdata);
static void msv_redis_get_local_handler(ngx_event_t *ev);
static void msv_redis_reply_error(msv_redis_ctx_t *ctx, const char *what,
    ngx_str_t *name, redisReply *reply);

static ngx_int_t msv_redis_check_len(msv_redis_ctx_t *ctx, ngx_str_t *s,
    size_t max, const char *what);
static ngx_uint_t msv_redis_can_send(msv_redis_ctx_t *ctx);
static void msv_redis_resync(msv_redis_ctx_t *ctx);
static void msv_redis_flush_handler(ngx_event_t *ev);
static ngx_int_t msv_redis_entry_send(msv_redis_ctx_t *ctx,
    msv_redis_entry_t *e);
static ngx_int_t msv_redis_worker_send(msv_redis_ctx_t *ctx,
    msv_redis_worker_t *w);
static msv_redis_entry_t *msv_redis_entry_find(msv_redis_ctx_t *ctx,
    ngx_str_t *id, ngx_uint_t hash);
static msv_redis_entry_t *msv_redis_entry_new(msv_redis_ctx_t *ctx,
    ngx_str_t *id, ngx_uint_t hash, size_t region_len);
static void msv_redis_entry_unlink(msv_redis_ctx_t *ctx,
    msv_redis_entry_t *e);
static void msv_redis_entry_release(msv_redis_ctx_t *ctx,
    msv_redis_entry_t *e);
static ngx_int_t msv_redis_evict(msv_redis_ctx_t *ctx);

static void msv_redis_cmd_init(msv_redis_cmd_t *cmd);
static void msv_redis_arg(msv_redis_cmd_t *cmd, const void *p, size_t len);
static void msv_redis_arg_cstr(msv_redis_cmd_t *cmd, const char *s);
static void msv_redis_arg_uint(msv_redis_cmd_t *cmd, uint64_t v);
static void msv_redis_cmd_pexpire(msv_redis_cmd_t *cmd, uint64_t ms);
static void msv_redis_arg_fmt(msv_redis_cmd_t *cmd, const char *fmt, ...);

static ngx_int_t msv_redis_reply_json(redisReply *reply, ngx_str_t *json,
    ngx_log_t *log);
static size_t msv_redis_json_string(u_char *dst, const u_char *src,
    size_t len);
static size_t msv_redis_utf8_seq(const u_char *p, const u_char *end);
static ngx_uint_t msv_redis_json_number(const u_char *p, size_t len);
static uint64_t msv_redis_now_ms(void);


static const char  *msv_redis_states[] = {
    "admitted", "running", "finished", "aborted", NULL
};

#define MSV_REDIS_STATE_FINISHED  2     /* this and later are terminal */

/* HGETALL fields given to req_get callbacks as JSON numbers */
static const char  *msv_redis_numeric[] = {
    "pid", "slot", "prompt_tokens", "completion_tokens", "t_admit",
    "t_update", NULL
};


/*
 * Per-process state, created in init_process of a worker process.  It is
 * never shared: each nginx worker has its own links and map.
 */
static msv_redis_ctx_t  *msv_redis;
static void            (*msv_redis_abort_handler)(ngx_str_t *id);


/* ------------------------------------------------------------------ */
/* Life cycle                                                           */

ngx_int_t
ngx_http_maskserve_redis_init_process(ngx_cycle_t *cycle,
    ngx_http_maskserve_redis_conf_t *rcf)
{
    msv_redis_ctx_t  *ctx;

    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return NGX_OK;
    }

    if (rcf == NULL || rcf->host.len == 0 || msv_redis != NULL) {
        return NGX_OK;
    }

    ctx = ngx_calloc(sizeof(msv_redis_ctx_t), cycle->log);
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    ctx->log = cycle->log;

    ctx->buckets = ngx_calloc(MSV_REDIS_BUCKETS * sizeof(msv_redis_entry_t *),
                              cycle->log);
    if (ctx->buckets == NULL) {
        ngx_free(ctx);
        return NGX_ERROR;
    }

    ngx_queue_init(&ctx->active);
    ngx_queue_init(&ctx->finished);

    if (msv_redis_conf(ctx, rcf, cycle) != NGX_OK) {
        msv_redis_ctx_free(ctx);
        return NGX_ERROR;
    }

    msv_redis_link_init(&ctx->cmd, "command", 0, ctx->log);
    msv_redis_link_init(&ctx->sub, "subscriber", 1, ctx->log);

    ctx->flush.handler = msv_redis_flush_handler;
    ctx->flush.data = ctx;
    ctx->flush.log = ctx->log;

    msv_redis = ctx;

    /*
     * A host name is resolved once here, at process start, so that no
     * reconnect ever waits on DNS; if that fails it is tried again before
     * each connection attempt.
     */
    if (!ctx->unix_socket && msv_redis_resolve(ctx) != NGX_OK) {
        ngx_log_error(NGX_LOG_ERR, ctx->log, 0,
                      "maskserve redis: cannot resolve \"%s\", "
                      "will retry", ctx->host);
    }

    msv_redis_link_connect(&ctx->cmd);
    msv_redis_link_connect(&ctx->sub);

    return NGX_OK;
}


void
ngx_http_maskserve_redis_exit_process(ngx_cycle_t *cycle)
{
    ngx_uint_t          i;
    ngx_queue_t        *q, *queues[2];
    msv_redis_ctx_t    *ctx;
    msv_redis_entry_t  *e;

    ctx = msv_redis;
    if (ctx == NULL) {
        return;
    }

    ctx->exiting = 1;

    if (ctx->flush.posted) {
        ngx_delete_posted_event(&ctx->flush);
    }

    /* hand what is already queued to the kernel before closing */
    msv_redis_exit_flush(&ctx->cmd);

    msv_redis_link_close(&ctx->cmd, "process exiting");
    msv_redis_link_close(&ctx->sub, "process exiting");

    queues[0] = &ctx->active;
    queues[1] = &ctx->finished;

    /* the links are gone, so nothing is in flight any more */
    for (i = 0; i < 2; i++) {
        while (!ngx_queue_empty(queues[i])) {
            q = ngx_queue_head(queues[i]);
            e = ngx_queue_data(q, msv_redis_entry_t, queue);
            msv_redis_entry_unlink(ctx, e);
            ngx_free(e);
        }
    }

    msv_redis = NULL;

    msv_redis_ctx_free(ctx);
}


/* free ctx and what msv_redis_conf allocated (ngx_free(NULL) is harmless) */
static void
msv_redis_ctx_free(msv_redis_ctx_t *ctx)
{
    ngx_free(ctx->password.data);
    ngx_free(ctx->prefix.data);
    ngx_free(ctx->hostname.data);
    ngx_free(ctx->channel.data);
    ngx_free(ctx->workers.data);
    ngx_free(ctx->buckets);
    ngx_free(ctx);
}


ngx_int_t
ngx_http_maskserve_redis_connected(void)
{
    msv_redis_ctx_t  *ctx;

    ctx = msv_redis;

    if (ctx == NULL) {
        return 0;
    }

    return (ctx->cmd.ready && ctx->sub.ready) ? 1 : 0;
}


void
ngx_http_maskserve_redis_stats(ngx_http_maskserve_redis_stats_t *st)
{
    ngx_uint_t          i;
    ngx_queue_t        *q, *queues[2];
    msv_redis_ctx_t    *ctx;
    msv_redis_entry_t  *e;

    ngx_memzero(st, sizeof(ngx_http_maskserve_redis_stats_t));

    ctx = msv_redis;
    if (ctx == NULL) {
        return;
    }

    st->connected = ngx_http_maskserve_redis_connected();
    st->tracked = ctx->nentries;
    st->dropped = ctx->dropped;
    st->reconnects = (ctx->cmd.readies > 0 ? ctx->cmd.readies - 1 : 0)
                     + (ctx->sub.readies > 0 ? ctx->sub.readies - 1 : 0);

    queues[0] = &ctx->active;
    queues[1] = &ctx->finished;

    for (i = 0; i < 2; i++) {
        for (q = ngx_queue_head(queues[i]);
             q != ngx_queue_sentinel(queues[i]);
             q = ngx_queue_next(q))
        {
            e = ngx_queue_data(q, msv_redis_entry_t, queue);
            st->unsynced += (e->dirty || e->inflight) ? 1 : 0;
        }
    }
}


static ngx_int_t
msv_redis_conf(msv_redis_ctx_t *ctx, ngx_http_maskserve_redis_conf_t *rcf,
    ngx_cycle_t *cycle)
{
    u_char     *p;
    ngx_str_t   prefix, hostname;

    if (rcf->host.len > MSV_REDIS_NAME_MAX) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                      "maskserve redis: host \"%V\" is longer than %d bytes",
                      &rcf->host, MSV_REDIS_NAME_MAX);
        return NGX_ERROR;
    }

    if (ngx_strlchr(rcf->host.data, rcf->host.data + rcf->host.len, '\0')
        != NULL)
    {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                      "maskserve redis: host contains a NUL byte");
        return NGX_ERROR;
    }

    ngx_memcpy(ctx->host, rcf->host.data, rcf->host.len);
    ctx->host[rcf->host.len] = '\0';

    if (rcf->host.len > 5 && ngx_strncmp(ctx->host, "unix:", 5) == 0) {
        ctx->unix_socket = 1;

    } else if (rcf->port < 1 || rcf->port > 65535) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                      "maskserve redis: port %i is out of range 1..65535",
                      rcf->port);
        return NGX_ERROR;
    }

    ctx->port = (int) rcf->port;

    if (ctx->unix_socket) {
        ngx_cpystrn((u_char *) ctx->peer, (u_char *) ctx->host,
                    sizeof(ctx->peer));

    } else {
        *ngx_snprintf((u_char *) ctx->peer, sizeof(ctx->peer) - 1, "%s:%d",
                      ctx->host, ctx->port) = '\0';
    }

    if (rcf->db < 0 || rcf->db > 0x7fffffff) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                      "maskserve redis: db %i is invalid", rcf->db);
        return NGX_ERROR;
    }

    ctx->db = rcf->db;
    ctx->req_ttl = rcf->req_ttl;

    prefix = rcf->prefix;
    if (prefix.len == 0) {
        ngx_str_set(&prefix, "msv");
    }

    if (prefix.len > MSV_REDIS_PREFIX_MAX) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                      "maskserve redis: prefix \"%V\" is longer than %d "
                      "bytes", &prefix, MSV_REDIS_PREFIX_MAX);
        return NGX_ERROR;
    }

    hostname = rcf->hostname;
    if (hostname.len == 0) {
        hostname = cycle->hostname;
    }

    if (hostname.len == 0 || hostname.len > MSV_REDIS_NAME_MAX) {
        ngx_log_error(NGX_LOG_EMERG, cycle->log, 0,
                      "maskserve redis: hostname \"%V\" must be 1..%d bytes",
                      &hostname, MSV_REDIS_NAME_MAX);
        return NGX_ERROR;
    }

    if (msv_redis_strdup(&ctx->password, rcf->password.data,
                         rcf->password.len, cycle->log) == NULL
        || msv_redis_strdup(&ctx->prefix, prefix.data, prefix.len,
                            cycle->log) == NULL
        || msv_redis_strdup(&ctx->hostname, hostname.data, hostname.len,
                            cycle->log) == NULL
        || msv_redis_strdup(&ctx->channel, NULL, prefix.len + 6,
                            cycle->log) == NULL
        || msv_redis_strdup(&ctx->workers, NULL, prefix.len + 8,
                            cycle->log) == NULL)
    {
        return NGX_ERROR;
    }

    p = ngx_cpymem(ctx->channel.data, prefix.data, prefix.len);
    ngx_memcpy(p, ":abort", 6);

    p = ngx_cpymem(ctx->workers.data, prefix.data, prefix.len);
    ngx_memcpy(p, ":workers", 8);

    return NGX_OK;
}


/* dst = copy of src (len bytes, or uninitialized when src is NULL) */
static ngx_str_t *
msv_redis_strdup(ngx_str_t *dst, u_char *src, size_t len, ngx_log_t *log)
{
    dst->data = ngx_alloc(len + 1, log);
    if (dst->data == NULL) {
        dst->len = 0;
        return NULL;
    }

    if (src != NULL) {
        ngx_memcpy(dst->data, src, len);
    }

    dst->data[len] = '\0';
    dst->len = len;

    return dst;
}


static ngx_int_t
msv_redis_resolve(msv_redis_ctx_t *ctx)
{
    int               rc;
    struct addrinfo   hints, *res, *ai;

    ngx_memzero(&hints, sizeof(struct addrinfo));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;

    rc = getaddrinfo(ctx->host, NULL, &hints, &res);
    if (rc != 0) {
        ngx_log_error(NGX_LOG_INFO, ctx->log, 0,
                      "maskserve redis: getaddrinfo(\"%s\") failed: %s",
                      ctx->host, gai_strerror(rc));
        return NGX_ERROR;
    }

    /* "localhost" often lists ::1 first; Redis binds 127.0.0.1 by default */
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET) {
            break;
        }
    }

    if (ai == NULL) {
        ai = res;
    }

    rc = getnameinfo(ai->ai_addr, ai->ai_addrlen, ctx->addr,
                     sizeof(ctx->addr), NULL, 0, NI_NUMERICHOST);
    freeaddrinfo(res);

    if (rc != 0) {
        ngx_log_error(NGX_LOG_INFO, ctx->log, 0,
                      "maskserve redis: getnameinfo(\"%s\") failed: %s",
                      ctx->host, gai_strerror(rc));
        ctx->addr[0] = '\0';
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* ------------------------------------------------------------------ */
/* Links: connect, handshake, watchdog, close, reconnect                */

static void
msv_redis_link_init(msv_redis_link_t *link, const char *name,
    ngx_uint_t subscriber, ngx_log_t *log)
{
    link->name = name;
    link->subscriber = subscriber ? 1 : 0;
    link->backoff = MSV_REDIS_BACKOFF_MIN;

    link->reconnect.handler = msv_redis_reconnect_handler;
    link->reconnect.data = link;
    link->reconnect.log = log;
    link->reconnect.cancelable = 1;

    link->watchdog.handler = msv_redis_watchdog_handler;
    link->watchdog.data = link;
    link->watchdog.log = log;
    link->watchdog.cancelable = 1;

    link->close.handler = msv_redis_close_handler;
    link->close.data = link;
    link->close.log = log;
}


static void
msv_redis_link_connect(msv_redis_link_t *link)
{
    ngx_uint_t          level;
    msv_redis_cmd_t     cmd;
    msv_redis_ctx_t    *ctx;
    redisAsyncContext  *ac;

    ctx = msv_redis;

    level = (link->failures == 0) ? NGX_LOG_ERR : NGX_LOG_INFO;

    if (ctx->unix_socket) {
        ac = redisAsyncConnectUnix(ctx->host + 5);

    } else {
        if (ctx->addr[0] == '\0' && msv_redis_resolve(ctx) != NGX_OK) {
            goto retry;
        }

        ac = redisAsyncConnect(ctx->addr, ctx->port);
    }

    if (ac == NULL) {
        ngx_log_error(NGX_LOG_ALERT, ctx->log, 0,
                      "maskserve redis: %s connection: out of memory",
                      link->name);
        goto retry;
    }

    if (ac->err) {
        ngx_log_error(level, ctx->log, 0,
                      "maskserve redis: %s connection to %s failed: %s",
                      link->name, ctx->peer, ac->errstr);
        goto free_ac;
    }

    ac->data = link;

    if (msv_redis_attach(ac, link) != NGX_OK) {
        goto free_ac;
    }

    if (redisAsyncSetConnectCallback(ac, msv_redis_connect_cb) != REDIS_OK
        || redisAsyncSetDisconnectCallback(ac, msv_redis_disconnect_cb)
           != REDIS_OK)
    {
        ngx_log_error(NGX_LOG_ALERT, ctx->log, 0,
                      "maskserve redis: %s connection: cannot set "
                      "callbacks", link->name);
        goto free_ac;
    }

    if (!ctx->unix_socket && redisEnableKeepAlive(&ac->c) != REDIS_OK) {
        ngx_log_error(NGX_LOG_INFO, ctx->log, 0,
                      "maskserve redis: %s connection: keepalive: %s",
                      link->name, ac->c.errstr);
    }

    msv_redis_link_reset(link, ac);

    /*
     * The handshake is queued before the socket is connected; hiredis
     * writes it once connect(2) completes, which it notices through the
     * write event that queueing a command asks for.
     */
    if (ctx->password.len) {
        msv_redis_cmd_init(&cmd);
        msv_redis_arg_cstr(&cmd, "AUTH");
        msv_redis_arg(&cmd, ctx->password.data, ctx->password.len);

        if (msv_redis_link_handshake(link, &cmd) != NGX_OK) {
            goto failed;
        }
    }

    if (link->subscriber) {
        msv_redis_cmd_init(&cmd);
        msv_redis_arg_cstr(&cmd, "SUBSCRIBE");
        msv_redis_arg(&cmd, ctx->channel.data, ctx->channel.len);

        if (msv_redis_link_send(link, msv_redis_sub_cb, link, &cmd)
            != NGX_OK)
        {
            goto failed;
        }

    } else {
        if (ctx->db > 0) {
            msv_redis_cmd_init(&cmd);
            msv_redis_arg_cstr(&cmd, "SELECT");
            msv_redis_arg_uint(&cmd, (uint64_t) ctx->db);

            if (msv_redis_link_handshake(link, &cmd) != NGX_OK) {
                goto failed;
            }
        }

        msv_redis_cmd_init(&cmd);
        msv_redis_arg_cstr(&cmd, "PING");

        if (msv_redis_link_handshake(link, &cmd) != NGX_OK) {
            goto failed;
        }
    }

    return;

failed:

    link->failures++;
    msv_redis_link_close(link, "cannot queue the handshake");
    return;

free_ac:

    redisAsyncFree(ac);

retry:

    link->failures++;
    msv_redis_link_retry(link);
}


/* forget the state of the previous context and take ac (NULL: none) */
static void
msv_redis_link_reset(msv_redis_link_t *link, redisAsyncContext *ac)
{
    link->ac = ac;
    link->ready = 0;
    link->closing = 0;
    link->pending = 0;
    link->handshake = 0;
    link->reason = NULL;
}


/* queue a handshake command (AUTH, SELECT, PING) on link */
static ngx_int_t
msv_redis_link_handshake(msv_redis_link_t *link, msv_redis_cmd_t *cmd)
{
    if (msv_redis_link_send(link, msv_redis_handshake_cb, link, cmd)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    link->handshake++;

    return NGX_OK;
}


/* schedule the next connection attempt */
static void
msv_redis_link_retry(msv_redis_link_t *link)
{
    if (msv_redis == NULL || msv_redis->exiting) {
        return;
    }

    ngx_add_timer(&link->reconnect, link->backoff);

    link->backoff *= 2;
    if (link->backoff > MSV_REDIS_BACKOFF_MAX) {
        link->backoff = MSV_REDIS_BACKOFF_MAX;
    }
}


static void
msv_redis_reconnect_handler(ngx_event_t *ev)
{
    msv_redis_link_t  *link;

    link = ev->data;

    if (msv_redis == NULL || msv_redis->exiting || link->ac != NULL) {
        return;
    }

    msv_redis_link_connect(link);
}


/*
 * Close a link now.  Never called from inside a hiredis callback (use
 * msv_redis_link_fail there): redisAsyncFree runs every pending callback
 * with a NULL reply, calls the adapter's cleanup and closes the fd.
 */
static void
msv_redis_link_close(msv_redis_link_t *link, const char *reason)
{
    redisAsyncContext  *ac;

    if (link->close.posted) {
        ngx_delete_posted_event(&link->close);
    }

    if (link->reconnect.timer_set) {
        ngx_del_timer(&link->reconnect);
    }

    ac = link->ac;

    if (ac == NULL) {
        return;
    }

    link->closing = 1;
    link->ready = 0;

    if (link->reason == NULL) {
        link->reason = reason;
    }

    redisAsyncFree(ac);

    /* the disconnect callback runs only for connected contexts */
    msv_redis_link_lost(link, ac, link->reason);
}


/* close a link from inside a hiredis callback: defer to a posted event */
static void
msv_redis_link_fail(msv_redis_link_t *link, const char *reason)
{
    if (link->ac == NULL || link->closing) {
        return;
    }

    link->ready = 0;
    link->closing = 1;
    link->reason = reason;

    ngx_post_event(&link->close, &ngx_posted_events);
}


static void
msv_redis_close_handler(ngx_event_t *ev)
{
    msv_redis_link_t  *link;

    link = ev->data;

    msv_redis_link_close(link, link->reason);
}


/*
 * The context ac of link is gone (freed by hiredis or by us; ac must not
 * be dereferenced).  Forget it and schedule a new connection.
 */
static void
msv_redis_link_lost(msv_redis_link_t *link, const redisAsyncContext *ac,
    const char *reason)
{
    ngx_uint_t        was_ready, level;
    msv_redis_ctx_t  *ctx;

    ctx = msv_redis;

    if (link->ac != ac || ac == NULL) {
        return;
    }

    was_ready = link->readies > 0 && link->failures == 0;

    msv_redis_link_reset(link, NULL);

    if (link->watchdog.timer_set) {
        ngx_del_timer(&link->watchdog);
    }

    if (link->close.posted) {
        ngx_delete_posted_event(&link->close);
    }

    if (ctx == NULL || ctx->exiting) {
        return;
    }

    if (link == &ctx->cmd) {
        ctx->throttled = 0;
    }

    level = (was_ready || link->failures == 0) ? NGX_LOG_ERR : NGX_LOG_INFO;

    ngx_log_error(level, ctx->log, 0,
                  "maskserve redis: %s connection to %s %s: %s, "
                  "retrying in %M ms", link->name, ctx->peer,
                  was_ready ? "lost" : "failed",
                  reason ? reason : "closed", link->backoff);

    link->failures++;
    msv_redis_link_retry(link);
}


static void
msv_redis_link_ready(msv_redis_link_t *link)
{
    ngx_uint_t        level;
    msv_redis_ctx_t  *ctx;

    ctx = msv_redis;

    link->ready = 1;
    link->backoff = MSV_REDIS_BACKOFF_MIN;
    link->readies++;

    level = (link->readies > 1) ? NGX_LOG_WARN : NGX_LOG_NOTICE;

    ngx_log_error(level, ctx->log, 0,
                  "maskserve redis: %s connection to %s is ready%s",
                  link->name, ctx->peer,
                  link->readies > 1 ? " again" : "");

    link->failures = 0;

    if (link == &ctx->cmd) {
        msv_redis_resync(ctx);
    }
}


/* queue cmd on link; NGX_OK means exactly one callback will follow */
static ngx_int_t
msv_redis_link_send(msv_redis_link_t *link, redisCallbackFn *fn,
    void *privdata, msv_redis_cmd_t *cmd)
{
    if (link->ac == NULL || link->closing) {
        return NGX_DECLINED;
    }

    if (cmd->overflow) {
        ngx_log_error(NGX_LOG_ALERT, msv_redis->log, 0,
                      "maskserve redis: command \"%s\" too large",
                      cmd->argv[0]);
        return NGX_ERROR;
    }

    if (redisAsyncCommandArgv(link->ac, fn, privdata, cmd->argc,
                              cmd->argv, cmd->argvlen)
        != REDIS_OK)
    {
        return NGX_ERROR;
    }

    link->pending++;

    if (!link->watchdog.timer_set) {
        ngx_add_timer(&link->watchdog, MSV_REDIS_TIMEOUT);
    }

    return NGX_OK;
}


/*
 * A reply arrived on link (reply NULL: the context is being freed).  The
 * watchdog measures time since the last reply while replies are owed.
 */
static void
msv_redis_link_replied(msv_redis_link_t *link, void *reply)
{
    msv_redis_ctx_t  *ctx;

    if (reply == NULL || link->closing) {
        return;
    }

    if (link->pending > 0) {
        link->pending--;
    }

    if (link->pending == 0 && link->ready) {
        if (link->watchdog.timer_set) {
            ngx_del_timer(&link->watchdog);
        }

    } else {
        ngx_add_timer(&link->watchdog, MSV_REDIS_TIMEOUT);
    }

    ctx = msv_redis;

    if (link == &ctx->cmd && ctx->throttled
        && link->pending <= MSV_REDIS_LOW_PENDING)
    {
        ctx->throttled = 0;

        if (!ctx->flush.posted) {
            ngx_post_event(&ctx->flush, &ngx_posted_events);
        }
    }
}


static void
msv_redis_watchdog_handler(ngx_event_t *ev)
{
    msv_redis_link_t  *link;

    link = ev->data;

    if (link->ac == NULL || (link->ready && link->pending == 0)) {
        return;
    }

    msv_redis_link_close(link, link->ready ? "no reply in time"
                                           : "connect timed out");
}


/*
 * At exit, write what is queued on the command link (blocking, for at
 * most MSV_REDIS_EXIT_FLUSH ms): the last states of requests that just
 * finished would be lost otherwise.  Replies are not waited for.
 */
static void
msv_redis_exit_flush(msv_redis_link_t *link)
{
    int                 done, n;
    ngx_msec_t          left, start;
    struct pollfd       pfd;
    redisAsyncContext  *ac;

    ac = link->ac;

    if (ac == NULL || !link->ready || link->closing) {
        return;
    }

    start = ngx_current_msec;
    left = MSV_REDIS_EXIT_FLUSH;

    for ( ;; ) {
        done = 0;

        if (redisBufferWrite(&ac->c, &done) != REDIS_OK || done) {
            return;
        }

        pfd.fd = ac->c.fd;
        pfd.events = POLLOUT;
        pfd.revents = 0;

        n = poll(&pfd, 1, (int) left);
        if (n <= 0) {
            return;
        }

        ngx_time_update();

        if (ngx_current_msec - start >= MSV_REDIS_EXIT_FLUSH) {
            return;
        }

        left = MSV_REDIS_EXIT_FLUSH - (ngx_current_msec - start);
    }
}


/* ------------------------------------------------------------------ */
/* The adapter: a redisAsyncContext's socket as an nginx connection     */

static ngx_int_t
msv_redis_attach(redisAsyncContext *ac, msv_redis_link_t *link)
{
    ngx_log_t            *log;
    ngx_connection_t     *c;
    msv_redis_adapter_t  *a;
#if (MSV_REDIS_HIREDIS_TIMER)
    struct timeval        tv;
#endif

    log = msv_redis->log;

    if (ac->ev.data != NULL) {
        ngx_log_error(NGX_LOG_ALERT, log, 0,
                      "maskserve redis: context already attached");
        return NGX_ERROR;
    }

    a = ngx_calloc(sizeof(msv_redis_adapter_t), log);
    if (a == NULL) {
        return NGX_ERROR;
    }

    c = ngx_get_connection(ac->c.fd, log);
    if (c == NULL) {
        ngx_free(a);
        return NGX_ERROR;
    }

    c->data = a;
    c->read->handler = msv_redis_read_handler;
    c->write->handler = msv_redis_write_handler;
    c->read->log = log;
    c->write->log = log;

    a->conn = c;
    a->ac = ac;
    a->link = link;

    ac->ev.data = a;
    ac->ev.addRead = msv_redis_add_read;
    ac->ev.delRead = msv_redis_del_read;
    ac->ev.addWrite = msv_redis_add_write;
    ac->ev.delWrite = msv_redis_del_write;
    ac->ev.cleanup = msv_redis_cleanup;

#if (MSV_REDIS_HIREDIS_TIMER)
    a->timer.handler = msv_redis_timer_handler;
    a->timer.data = a;
    a->timer.log = log;
    a->timer.cancelable = 1;

    ac->ev.scheduleTimer = msv_redis_schedule_timer;

    tv.tv_sec = MSV_REDIS_TIMEOUT / 1000;
    tv.tv_usec = (MSV_REDIS_TIMEOUT % 1000) * 1000;

    if (redisAsyncSetTimeout(ac, tv) != REDIS_OK) {
        ngx_log_error(NGX_LOG_ALERT, log, 0,
                      "maskserve redis: redisAsyncSetTimeout() failed");
        /* cleanup runs from redisAsyncFree */
        return NGX_ERROR;
    }
#endif

    return NGX_OK;
}


/*
 * Events are registered level-triggered (NGX_LEVEL_EVENT): hiredis reads
 * at most 16 KiB per redisAsyncHandleRead, so with edge-triggered epoll a
 * large or pipelined reply could sit unread.  Level-triggered, epoll
 * reports the socket again while bytes remain.
 */
static void
msv_redis_add_read(void *privdata)
{
    msv_redis_event_set(privdata, 0, 1, "cannot add the read event");
}


static void
msv_redis_del_read(void *privdata)
{
    msv_redis_event_set(privdata, 0, 0, "cannot delete the read event");
}


static void
msv_redis_add_write(void *privdata)
{
    msv_redis_event_set(privdata, 1, 1, "cannot add the write event");
}


static void
msv_redis_del_write(void *privdata)
{
    msv_redis_event_set(privdata, 1, 0, "cannot delete the write event");
}


/*
 * Add (add 1) or delete (add 0) the read (write 0) or write (write 1)
 * event of a's connection unless it already is in that state; on failure
 * the link is closed, giving reason.
 */
static void
msv_redis_event_set(msv_redis_adapter_t *a, ngx_uint_t write,
    ngx_uint_t add, const char *reason)
{
    ngx_int_t     event, rc;
    ngx_event_t  *ev;

    ev = write ? a->conn->write : a->conn->read;
    event = write ? NGX_WRITE_EVENT : NGX_READ_EVENT;

    if (ev->active == add) {
        return;
    }

    rc = add ? ngx_add_event(ev, event, NGX_LEVEL_EVENT)
             : ngx_del_event(ev, event, NGX_LEVEL_EVENT);

    if (rc != NGX_OK) {
        msv_redis_link_fail(a->link, reason);
    }
}


/*
 * Called by hiredis just before it closes the socket (redisFree): take
 * the fd out of epoll and give the connection back, but leave the fd
 * alone.  May run from inside redisAsyncHandleRead/Write, so the event
 * handlers below touch nothing after calling into hiredis.
 */
static void
msv_redis_cleanup(void *privdata)
{
    msv_redis_adapter_t  *a = privdata;
    ngx_connection_t     *c;

    c = a->conn;

    if (c->read->active) {
        (void) ngx_del_event(c->read, NGX_READ_EVENT, 0);
    }

    if (c->write->active) {
        (void) ngx_del_event(c->write, NGX_WRITE_EVENT, 0);
    }

    if (c->read->posted) {
        ngx_delete_posted_event(c->read);
    }

    if (c->write->posted) {
        ngx_delete_posted_event(c->write);
    }

    if (c->read->timer_set) {
        ngx_del_timer(c->read);
    }

    if (c->write->timer_set) {
        ngx_del_timer(c->write);
    }

#if (MSV_REDIS_HIREDIS_TIMER)
    if (a->timer.timer_set) {
        ngx_del_timer(&a->timer);
    }
#endif

    c->read->closed = 1;
    c->write->closed = 1;

    ngx_free_connection(c);
    c->fd = (ngx_socket_t) -1;

    a->ac->ev.data = NULL;
    ngx_free(a);
}


static void
msv_redis_read_handler(ngx_event_t *rev)
{
    ngx_connection_t     *c;
    msv_redis_adapter_t  *a;

    c = rev->data;
    a = c->data;

    redisAsyncHandleRead(a->ac);
}


static void
msv_redis_write_handler(ngx_event_t *wev)
{
    ngx_connection_t     *c;
    msv_redis_adapter_t  *a;

    c = wev->data;
    a = c->data;

    redisAsyncHandleWrite(a->ac);
}


#if (MSV_REDIS_HIREDIS_TIMER)

static void
msv_redis_schedule_timer(void *privdata, struct timeval tv)
{
    msv_redis_adapter_t  *a = privdata;
    ngx_msec_t            ms;

    ms = (ngx_msec_t) tv.tv_sec * 1000 + (ngx_msec_t) tv.tv_usec / 1000;

    ngx_add_timer(&a->timer, ms ? ms : 1);
}


static void
msv_redis_timer_handler(ngx_event_t *ev)
{
    msv_redis_adapter_t  *a;

    a = ev->data;

    /* may free the context, and with it a */
    redisAsyncHandleTimeout(a->ac);
}

#endif


/* ------------------------------------------------------------------ */
/* hiredis callbacks                                                    */

static void
msv_redis_connect_cb(const redisAsyncContext *ac, int status)
{
    msv_redis_link_t  *link;

    link = ac->data;

    if (status == REDIS_OK) {
        ngx_log_debug1(NGX_LOG_DEBUG_EVENT, msv_redis->log, 0,
                       "maskserve redis: %s connection established",
                       link->name);
        return;
    }

    /* hiredis frees the context after this returns */
    msv_redis_link_lost(link, ac, ac->c.err ? ac->c.errstr : "refused");
}


static void
msv_redis_disconnect_cb(const redisAsyncContext *ac, int status)
{
    msv_redis_link_t  *link;
    const char        *reason;

    link = ac->data;

    if (link->closing && link->reason != NULL) {
        reason = link->reason;

    } else if (ac->c.err) {
        reason = ac->c.errstr;

    } else {
        reason = "closed";
    }

    msv_redis_link_lost(link, ac, reason);
}


static void
msv_redis_handshake_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    ngx_uint_t         level;
    redisReply        *reply = r;
    msv_redis_link_t  *link = privdata;

    msv_redis_link_replied(link, reply);

    if (reply == NULL || link->closing) {
        return;
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        level = (link->failures == 0) ? NGX_LOG_ERR : NGX_LOG_INFO;

        ngx_log_error(level, msv_redis->log, 0,
                      "maskserve redis: %s connection: handshake refused: "
                      "%*s", link->name, (size_t) reply->len, reply->str);
        msv_redis_link_fail(link, "handshake refused");
        return;
    }

    if (link->handshake > 0) {
        link->handshake--;
    }

    if (link->handshake == 0 && !link->subscriber) {
        msv_redis_link_ready(link);
    }
}


static void
msv_redis_sub_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    ngx_str_t          id;
    redisReply        *reply = r, *kind, *payload;
    msv_redis_link_t  *link = privdata;

    if (reply == NULL || link->closing) {
        return;
    }

    if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 3
        || reply->element[0]->type != REDIS_REPLY_STRING)
    {
        ngx_log_error(NGX_LOG_ERR, msv_redis->log, 0,
                      "maskserve redis: subscriber connection: "
                      "unexpected reply type %d", reply->type);
        msv_redis_link_fail(link, "unexpected reply");
        return;
    }

    kind = reply->element[0];
    payload = reply->element[2];

    if (kind->len == 9 && ngx_strncasecmp((u_char *) kind->str,
                                          (u_char *) "subscribe", 9) == 0)
    {
        msv_redis_link_replied(link, reply);

        if (link->handshake == 0 && !link->ready) {
            msv_redis_link_ready(link);
        }

        return;
    }

    if (kind->len != 7 || ngx_strncasecmp((u_char *) kind->str,
                                          (u_char *) "message", 7) != 0)
    {
        return;
    }

    if (payload->type != REDIS_REPLY_STRING || payload->len == 0) {
        ngx_log_error(NGX_LOG_WARN, msv_redis->log, 0,
                      "maskserve redis: abort message without an id");
        return;
    }

    id.data = (u_char *) payload->str;
    id.len = payload->len;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, msv_redis->log, 0,
                   "maskserve redis: abort message for \"%V\"", &id);

    if (msv_redis_abort_handler != NULL) {
        msv_redis_abort_handler(&id);
    }
}


static void
msv_redis_entry_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply         *reply = r;
    msv_redis_ctx_t    *ctx;
    msv_redis_entry_t  *e = privdata;

    ctx = msv_redis;

    msv_redis_link_replied(&ctx->cmd, reply);

    if (e->inflight > 0) {
        e->inflight--;
    }

    if (reply == NULL) {
        /* the link went down first: write it again when it comes back */
        e->dirty = 1;

    } else if (reply->type == REDIS_REPLY_ERROR) {
        msv_redis_reply_error(ctx, "writing request", &e->id, reply);
    }

    if (e->inflight > 0) {
        return;
    }

    if (e->orphan) {
        ngx_free(e);
        return;
    }

    if (e->finished && !e->dirty && !ctx->exiting) {
        msv_redis_entry_unlink(ctx, e);
        ngx_free(e);
    }
}


static void
msv_redis_worker_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    ngx_str_t            region;
    redisReply          *reply = r;
    msv_redis_ctx_t     *ctx;
    msv_redis_worker_t  *w = privdata;

    ctx = msv_redis;

    msv_redis_link_replied(&ctx->cmd, reply);

    if (reply == NULL) {
        w->dirty = 1;

    } else if (reply->type == REDIS_REPLY_ERROR) {
        region.data = w->region;
        region.len = w->region_len;
        msv_redis_reply_error(ctx, "writing worker", &region, reply);
    }
}


/* replies nobody waits for (PUBLISH); privdata: the command's name */
static void
msv_redis_plain_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply       *reply = r;
    msv_redis_ctx_t  *ctx;

    ctx = msv_redis;

    msv_redis_link_replied(&ctx->cmd, reply);

    if (reply != NULL && reply->type == REDIS_REPLY_ERROR) {
        msv_redis_reply_error(ctx, (char *) privdata, NULL, reply);
    }
}


static void
msv_redis_get_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    void                             *data;
    ngx_int_t                         rc;
    ngx_str_t                         json;
    redisReply                       *reply = r;
    msv_redis_get_t                  *h = privdata;
    msv_redis_ctx_t                  *ctx;
    ngx_http_maskserve_redis_get_pt   cb;

    ctx = msv_redis;

    msv_redis_link_replied(&ctx->cmd, reply);

    cb = h->cb;
    data = h->data;

    if (cb != NULL && ctx->exiting) {
        /*
         * The process is exiting: its requests are not finalized any more,
         * but one may still call cancel with this handle.  Keep it.
         */
        h->done = 1;
        return;
    }

    ngx_free(h);

    if (cb == NULL) {
        return;
    }

    json.len = 0;
    json.data = NULL;

    if (reply == NULL) {
        rc = NGX_ERROR;

    } else if (reply->type == REDIS_REPLY_ERROR) {
        msv_redis_reply_error(ctx, "HGETALL", NULL, reply);
        rc = NGX_ERROR;

    } else if (reply->type != REDIS_REPLY_ARRAY) {
        ngx_log_error(NGX_LOG_ERR, ctx->log, 0,
                      "maskserve redis: HGETALL: unexpected reply type %d",
                      reply->type);
        rc = NGX_ERROR;

    } else if (reply->elements == 0) {
        rc = NGX_DECLINED;

    } else {
        rc = msv_redis_reply_json(reply, &json, ctx->log);
    }

    cb(data, rc, rc == NGX_OK ? &json : NULL);

    if (json.data != NULL) {
        ngx_free(json.data);
    }
}


static void
msv_redis_get_local_handler(ngx_event_t *ev)
{
    void                             *data;
    msv_redis_get_t                  *h;
    ngx_http_maskserve_redis_get_pt   cb;

    h = ev->data;

    cb = h->cb;
    data = h->data;
    ngx_free(h);

    if (cb != NULL) {
        cb(data, NGX_ERROR, NULL);
    }
}


/*
 * Error replies (WRONGTYPE, OOM, MISCONF, ...) can come for every command
 * while Redis is unhealthy: log one per second and count the rest.
 */
static void
msv_redis_reply_error(msv_redis_ctx_t *ctx, const char *what,
    ngx_str_t *name, redisReply *reply)
{
    ngx_str_t  none = ngx_null_string;

    if (ctx->err_time == ngx_time()) {
        ctx->err_quiet++;
        return;
    }

    if (ctx->err_quiet) {
        ngx_log_error(NGX_LOG_ERR, ctx->log, 0,
                      "maskserve redis: %ui more error replies not logged",
                      ctx->err_quiet);
    }

    ngx_log_error(NGX_LOG_ERR, ctx->log, 0,
                  "maskserve redis: %s%s%V%s failed: %*s",
                  what, name ? " \"" : "", name ? name : &none,
                  name ? "\"" : "", (size_t) reply->len, reply->str);

    ctx->err_time = ngx_time();
    ctx->err_quiet = 0;
}


/* ------------------------------------------------------------------ */
/* Public commands                                                      */

void
ngx_http_maskserve_redis_set_abort_handler(void (*h)(ngx_str_t *id))
{
    msv_redis_abort_handler = h;
}


void
ngx_http_maskserve_redis_publish_abort(ngx_str_t *id)
{
    msv_redis_cmd_t   cmd;
    msv_redis_ctx_t  *ctx;

    ctx = msv_redis;

    if (ctx == NULL) {
        return;
    }

    if (msv_redis_check_len(ctx, id, MSV_REDIS_ID_MAX, "abort: id")
        != NGX_OK)
    {
        return;
    }

    if (!ctx->cmd.ready) {
        ngx_log_error(NGX_LOG_WARN, ctx->log, 0,
                      "maskserve redis: down, abort of \"%V\" not published",
                      id);
        return;
    }

    msv_redis_cmd_init(&cmd);
    msv_redis_arg_cstr(&cmd, "PUBLISH");
    msv_redis_arg(&cmd, ctx->channel.data, ctx->channel.len);
    msv_redis_arg(&cmd, id->data, id->len);

    if (msv_redis_link_send(&ctx->cmd, msv_redis_plain_cb, (void *) "PUBLISH",
                            &cmd)
        != NGX_OK)
    {
        ngx_log_error(NGX_LOG_WARN, ctx->log, 0,
                      "maskserve redis: abort of \"%V\" not published", id);
    }
}


void *
ngx_http_maskserve_redis_req_get(ngx_str_t *id,
    ngx_http_maskserve_redis_get_pt cb, void *data)
{
    ngx_log_t        *log;
    msv_redis_cmd_t   cmd;
    msv_redis_get_t  *h;
    msv_redis_ctx_t  *ctx;

    ctx = msv_redis;
    log = ctx ? ctx->log : ngx_cycle->log;

    h = ngx_calloc(sizeof(msv_redis_get_t), log);
    if (h == NULL) {
        return NULL;
    }

    h->cb = cb;
    h->data = data;

    if (ctx != NULL && ctx->cmd.ready && id->len > 0
        && id->len <= MSV_REDIS_ID_MAX)
    {
        msv_redis_cmd_init(&cmd);
        msv_redis_arg_cstr(&cmd, "HGETALL");
        msv_redis_arg_fmt(&cmd, "%V:req:%V", &ctx->prefix, id);

        if (msv_redis_link_send(&ctx->cmd, msv_redis_get_cb, h, &cmd)
            == NGX_OK)
        {
            return h;
        }
    }

    /* answer NGX_ERROR from the event loop, not from inside this call */
    h->local = 1;
    h->ev.handler = msv_redis_get_local_handler;
    h->ev.data = h;
    h->ev.log = log;

    ngx_post_event(&h->ev, &ngx_posted_events);

    return h;
}


void
ngx_http_maskserve_redis_cancel(void *handle)
{
    msv_redis_get_t  *h = handle;

    if (h == NULL) {
        return;
    }

    if (h->local || h->done) {
        if (h->ev.posted) {
            ngx_delete_posted_event(&h->ev);
        }

        ngx_free(h);
        return;
    }

    /* the reply callback frees it */
    h->cb = NULL;
    h->data = NULL;
}


void
ngx_http_maskserve_redis_worker_update(ngx_str_t *region,
    ngx_uint_t capacity, ngx_uint_t load, uint64_t generation,
    ngx_int_t alive)
{
    ngx_uint_t           i;
    msv_redis_ctx_t     *ctx;
    msv_redis_worker_t  *w;

    ctx = msv_redis;

    if (ctx == NULL) {
        return;
    }

    if (msv_redis_check_len(ctx, region, MSV_REDIS_NAME_MAX, "worker region")
        != NGX_OK)
    {
        return;
    }

    w = NULL;

    for (i = 0; i < ctx->nwk; i++) {
        if (ctx->wk[i].region_len == region->len
            && ngx_memcmp(ctx->wk[i].region, region->data, region->len) == 0)
        {
            w = &ctx->wk[i];
            break;
        }
    }

    if (w == NULL) {
        if (ctx->nwk == MSV_REDIS_MAX_WORKERS) {
            ngx_log_error(NGX_LOG_ERR, ctx->log, 0,
                          "maskserve redis: more than %d worker regions, "
                          "\"%V\" not registered", MSV_REDIS_MAX_WORKERS,
                          region);
            return;
        }

        w = &ctx->wk[ctx->nwk++];
        ngx_memcpy(w->region, region->data, region->len);
        w->region_len = region->len;
    }

    w->capacity = capacity;
    w->load = load;
    w->generation = generation;
    w->alive = alive ? 1 : 0;
    w->heartbeat = msv_redis_now_ms();
    w->dirty = 1;

    if (msv_redis_can_send(ctx)) {
        (void) msv_redis_worker_send(ctx, w);
    }
}


void
ngx_http_maskserve_redis_req_update(ngx_str_t *id, ngx_str_t *region,
    ngx_uint_t slot, uint64_t cookie, const char *state,
    ngx_uint_t prompt_tokens, ngx_uint_t completion_tokens,
    const char *finish)
{
    size_t              flen;
    uint64_t            now;
    ngx_uint_t          st, hash, finished;
    msv_redis_ctx_t    *ctx;
    msv_redis_entry_t  *e;

    ctx = msv_redis;

    if (ctx == NULL) {
        return;
    }

    if (msv_redis_check_len(ctx, id, MSV_REDIS_ID_MAX, "request id")
        != NGX_OK)
    {
        return;
    }

    if (region->len > MSV_REDIS_NAME_MAX) {
        ngx_log_error(NGX_LOG_ERR, ctx->log, 0,
                      "maskserve redis: request \"%V\": region longer "
                      "than %d bytes", id, MSV_REDIS_NAME_MAX);
        return;
    }

    for (st = 0; msv_redis_states[st] != NULL; st++) {
        if (state != NULL && ngx_strcmp(state, msv_redis_states[st]) == 0) {
            break;
        }
    }

    if (msv_redis_states[st] == NULL) {
        ngx_log_error(NGX_LOG_ERR, ctx->log, 0,
                      "maskserve redis: request \"%V\": unknown state "
                      "\"%s\"", id, state ? state : "(null)");
        return;
    }

    flen = finish ? ngx_strlen(finish) : 0;

    if (flen > MSV_REDIS_FINISH_MAX) {
        ngx_log_error(NGX_LOG_ERR, ctx->log, 0,
                      "maskserve redis: request \"%V\": finish reason "
                      "longer than %d bytes", id, MSV_REDIS_FINISH_MAX);
        return;
    }

    now = msv_redis_now_ms();
    hash = ngx_hash_key(id->data, id->len);
    finished = (st >= MSV_REDIS_STATE_FINISHED);

    e = msv_redis_entry_find(ctx, id, hash);

    if (e == NULL) {
        e = msv_redis_entry_new(ctx, id, hash, region->len);
        if (e == NULL) {
            ctx->dropped++;
            return;
        }

        e->t_admit = now;

    } else if (region->len > e->region_room) {
        ngx_log_error(NGX_LOG_ERR, ctx->log, 0,
                      "maskserve redis: request \"%V\" moved to region "
                      "\"%V\", keeping \"%V\"", id, region, &e->region);
        region = &e->region;
    }

    if (region != &e->region) {
        ngx_memcpy(e->region.data, region->data, region->len);
        e->region.len = region->len;
    }

    e->slot = slot;
    e->cookie = cookie;
    e->state = st;
    e->prompt_tokens = prompt_tokens;
    e->completion_tokens = completion_tokens;
    e->t_update = now;
    ngx_memcpy(e->finish, finish ? finish : "", flen);
    e->finish[flen] = '\0';
    e->dirty = 1;

    if (finished != e->finished) {
        /* keep each queue in order of the last move into it */
        ngx_queue_remove(&e->queue);
        ngx_queue_insert_tail(finished ? &ctx->finished : &ctx->active,
                              &e->queue);
        e->finished = finished ? 1 : 0;
    }

    if (msv_redis_can_send(ctx)) {
        (void) msv_redis_entry_send(ctx, e);
    }
}


/* NGX_OK when s is 1..max bytes; otherwise logs "<what> must be ..." */
static ngx_int_t
msv_redis_check_len(msv_redis_ctx_t *ctx, ngx_str_t *s, size_t max,
    const char *what)
{
    if (s->len == 0 || s->len > max) {
        ngx_log_error(NGX_LOG_ERR, ctx->log, 0,
                      "maskserve redis: %s must be 1..%uz bytes", what, max);
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* ------------------------------------------------------------------ */
/* Writing the backlog                                                  */

static ngx_uint_t
msv_redis_can_send(msv_redis_ctx_t *ctx)
{
    if (!ctx->cmd.ready || ctx->cmd.closing || ctx->exiting) {
        return 0;
    }

    if (ctx->throttled) {
        return 0;
    }

    if (ctx->cmd.pending >= MSV_REDIS_HIGH_PENDING) {
        /* Redis answers slower than we write: hold updates in the map */
        ctx->throttled = 1;
        ngx_log_error(NGX_LOG_WARN, ctx->log, 0,
                      "maskserve redis: %ui replies outstanding, holding "
                      "updates", ctx->cmd.pending);
        return 0;
    }

    return 1;
}


/* the command link is (again) ready: everything known is written again */
static void
msv_redis_resync(msv_redis_ctx_t *ctx)
{
    ngx_uint_t          i;
    ngx_queue_t        *q, *queues[2];
    msv_redis_entry_t  *e;

    queues[0] = &ctx->active;
    queues[1] = &ctx->finished;

    for (i = 0; i < 2; i++) {
        for (q = ngx_queue_head(queues[i]);
             q != ngx_queue_sentinel(queues[i]);
             q = ngx_queue_next(q))
        {
            e = ngx_queue_data(q, msv_redis_entry_t, queue);
            e->dirty = 1;
        }
    }

    for (i = 0; i < ctx->nwk; i++) {
        ctx->wk[i].dirty = 1;
    }

    if (!ctx->flush.posted) {
        ngx_post_event(&ctx->flush, &ngx_posted_events);
    }
}


static void
msv_redis_flush_handler(ngx_event_t *ev)
{
    uint64_t            now;
    ngx_uint_t          i, n;
    ngx_queue_t        *q, *next;
    msv_redis_ctx_t    *ctx;
    msv_redis_entry_t  *e;
    ngx_queue_t        *queues[2];

    ctx = ev->data;
    n = 0;

    queues[0] = &ctx->finished;
    queues[1] = &ctx->active;

    for (i = 0; i < 2; i++) {
        for (q = ngx_queue_head(queues[i]);
             q != ngx_queue_sentinel(queues[i]);
             q = next)
        {
            next = ngx_queue_next(q);
            e = ngx_queue_data(q, msv_redis_entry_t, queue);

            if (!e->dirty) {
                continue;
            }

            if (!msv_redis_can_send(ctx)) {
                goto done;
            }

            if (msv_redis_entry_send(ctx, e) == NGX_OK) {
                n++;
            }
        }
    }

    now = msv_redis_now_ms();

    for (i = 0; i < ctx->nwk; i++) {
        if (!ctx->wk[i].dirty) {
            continue;
        }

        if (now - ctx->wk[i].heartbeat >= MSV_REDIS_WORKER_TTL) {
            /* too old to announce: its key would claim a live worker */
            ctx->wk[i].dirty = 0;
            continue;
        }

        if (!msv_redis_can_send(ctx)) {
            goto done;
        }

        (void) msv_redis_worker_send(ctx, &ctx->wk[i]);
    }

done:

    if (n > 0) {
        ngx_log_error(NGX_LOG_NOTICE, ctx->log, 0,
                      "maskserve redis: wrote %ui request records again", n);
    }
}


static ngx_int_t
msv_redis_entry_send(msv_redis_ctx_t *ctx, msv_redis_entry_t *e)
{
    ngx_int_t        rc;
    msv_redis_cmd_t  cmd;

    msv_redis_cmd_init(&cmd);
    msv_redis_arg_cstr(&cmd, "HSET");
    msv_redis_arg_fmt(&cmd, "%V:req:%V", &ctx->prefix, &e->id);
    msv_redis_arg_cstr(&cmd, "host");
    msv_redis_arg(&cmd, ctx->hostname.data, ctx->hostname.len);
    msv_redis_arg_cstr(&cmd, "pid");
    msv_redis_arg_uint(&cmd, (uint64_t) ngx_pid);
    msv_redis_arg_cstr(&cmd, "region");
    msv_redis_arg(&cmd, e->region.data, e->region.len);
    msv_redis_arg_cstr(&cmd, "slot");
    msv_redis_arg_uint(&cmd, e->slot);
    msv_redis_arg_cstr(&cmd, "cookie");
    msv_redis_arg_uint(&cmd, e->cookie);
    msv_redis_arg_cstr(&cmd, "state");
    msv_redis_arg_cstr(&cmd, msv_redis_states[e->state]);
    msv_redis_arg_cstr(&cmd, "prompt_tokens");
    msv_redis_arg_uint(&cmd, e->prompt_tokens);
    msv_redis_arg_cstr(&cmd, "completion_tokens");
    msv_redis_arg_uint(&cmd, e->completion_tokens);
    msv_redis_arg_cstr(&cmd, "finish_reason");
    msv_redis_arg_cstr(&cmd, (char *) e->finish);
    msv_redis_arg_cstr(&cmd, "t_admit");
    msv_redis_arg_uint(&cmd, e->t_admit);
    msv_redis_arg_cstr(&cmd, "t_update");
    msv_redis_arg_uint(&cmd, e->t_update);

    rc = msv_redis_link_send(&ctx->cmd, msv_redis_entry_cb, e, &cmd);
    if (rc != NGX_OK) {
        return rc;
    }

    e->inflight++;
    e->dirty = 0;

    if (ctx->req_ttl == 0) {
        return NGX_OK;
    }

    /* argv[1] (the key) stays valid: cmd is still in scope */
    msv_redis_cmd_pexpire(&cmd, ctx->req_ttl);

    rc = msv_redis_link_send(&ctx->cmd, msv_redis_entry_cb, e, &cmd);
    if (rc != NGX_OK) {
        e->dirty = 1;
        return rc;
    }

    e->inflight++;

    return NGX_OK;
}


static ngx_int_t
msv_redis_worker_send(msv_redis_ctx_t *ctx, msv_redis_worker_t *w)
{
    ngx_str_t        region;
    msv_redis_cmd_t  cmd;

    region.data = w->region;
    region.len = w->region_len;

    msv_redis_cmd_init(&cmd);
    msv_redis_arg_cstr(&cmd, "HSET");
    msv_redis_arg_fmt(&cmd, "%V:worker:%V:%V", &ctx->prefix, &ctx->hostname,
                      &region);
    msv_redis_arg_cstr(&cmd, "host");
    msv_redis_arg(&cmd, ctx->hostname.data, ctx->hostname.len);
    msv_redis_arg_cstr(&cmd, "region");
    msv_redis_arg(&cmd, region.data, region.len);
    msv_redis_arg_cstr(&cmd, "capacity");
    msv_redis_arg_uint(&cmd, w->capacity);
    msv_redis_arg_cstr(&cmd, "load");
    msv_redis_arg_uint(&cmd, w->load);
    msv_redis_arg_cstr(&cmd, "generation");
    msv_redis_arg_uint(&cmd, w->generation);
    msv_redis_arg_cstr(&cmd, "alive");
    msv_redis_arg_uint(&cmd, (uint64_t) w->alive);
    msv_redis_arg_cstr(&cmd, "heartbeat");
    msv_redis_arg_uint(&cmd, w->heartbeat);

    if (msv_redis_link_send(&ctx->cmd, msv_redis_worker_cb, w, &cmd)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    w->dirty = 0;

    msv_redis_cmd_pexpire(&cmd, MSV_REDIS_WORKER_TTL);

    if (msv_redis_link_send(&ctx->cmd, msv_redis_worker_cb, w, &cmd)
        != NGX_OK)
    {
        w->dirty = 1;
        return NGX_ERROR;
    }

    msv_redis_cmd_init(&cmd);
    msv_redis_arg_cstr(&cmd, "SADD");
    msv_redis_arg(&cmd, ctx->workers.data, ctx->workers.len);
    msv_redis_arg_fmt(&cmd, "%V:%V", &ctx->hostname, &region);

    if (msv_redis_link_send(&ctx->cmd, msv_redis_worker_cb, w, &cmd)
        != NGX_OK)
    {
        w->dirty = 1;
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* ------------------------------------------------------------------ */
/* The request map                                                      */

static msv_redis_entry_t *
msv_redis_entry_find(msv_redis_ctx_t *ctx, ngx_str_t *id, ngx_uint_t hash)
{
    msv_redis_entry_t  *e;

    for (e = ctx->buckets[hash & (MSV_REDIS_BUCKETS - 1)];
         e != NULL;
         e = e->hnext)
    {
        if (e->hash == hash && e->id.len == id->len
            && ngx_memcmp(e->id.data, id->data, id->len) == 0)
        {
            return e;
        }
    }

    return NULL;
}


static msv_redis_entry_t *
msv_redis_entry_new(msv_redis_ctx_t *ctx, ngx_str_t *id, ngx_uint_t hash,
    size_t region_len)
{
    size_t              room;
    msv_redis_entry_t  *e, **bucket;

    if (ctx->nentries >= MSV_REDIS_MAX_ENTRIES
        && msv_redis_evict(ctx) != NGX_OK)
    {
        return NULL;
    }

    room = ngx_max(region_len, MSV_REDIS_REGION_MIN);

    e = ngx_calloc(sizeof(msv_redis_entry_t) + id->len + room, ctx->log);
    if (e == NULL) {
        return NULL;
    }

    e->hash = hash;
    e->id.data = (u_char *) (e + 1);
    e->id.len = id->len;
    ngx_memcpy(e->id.data, id->data, id->len);
    e->region.data = e->id.data + id->len;
    e->region.len = 0;
    e->region_room = room;

    bucket = &ctx->buckets[hash & (MSV_REDIS_BUCKETS - 1)];
    e->hnext = *bucket;
    *bucket = e;

    ngx_queue_insert_tail(&ctx->active, &e->queue);
    ctx->nentries++;

    return e;
}


/* take e out of the hash and its queue */
static void
msv_redis_entry_unlink(msv_redis_ctx_t *ctx, msv_redis_entry_t *e)
{
    msv_redis_entry_t  **pp;

    for (pp = &ctx->buckets[e->hash & (MSV_REDIS_BUCKETS - 1)];
         *pp != NULL;
         pp = &(*pp)->hnext)
    {
        if (*pp == e) {
            *pp = e->hnext;
            break;
        }
    }

    ngx_queue_remove(&e->queue);
    ctx->nentries--;
}


/* unlink e; free it now or, while replies are owed, from the callback */
static void
msv_redis_entry_release(msv_redis_ctx_t *ctx, msv_redis_entry_t *e)
{
    msv_redis_entry_unlink(ctx, e);

    if (e->inflight > 0) {
        e->orphan = 1;
        return;
    }

    ngx_free(e);
}


/*
 * The map is full: drop the oldest finished request, or failing that the
 * oldest active one.  Its latest state is lost if it was not written.
 */
static ngx_int_t
msv_redis_evict(msv_redis_ctx_t *ctx)
{
    ngx_queue_t        *q;
    msv_redis_entry_t  *e;

    if (!ngx_queue_empty(&ctx->finished)) {
        q = ngx_queue_head(&ctx->finished);

    } else if (!ngx_queue_empty(&ctx->active)) {
        q = ngx_queue_head(&ctx->active);

    } else {
        return NGX_ERROR;
    }

    e = ngx_queue_data(q, msv_redis_entry_t, queue);

    if (e->dirty) {
        ctx->dropped++;

        if (ctx->dropped == 1 || ctx->dropped % 1000 == 0) {
            ngx_log_error(NGX_LOG_WARN, ctx->log, 0,
                          "maskserve redis: %d requests tracked, dropping "
                          "unwritten state of \"%V\" (%ui dropped so far)",
                          MSV_REDIS_MAX_ENTRIES, &e->id, ctx->dropped);
        }
    }

    msv_redis_entry_release(ctx, e);

    return NGX_OK;
}


/* ------------------------------------------------------------------ */
/* Command assembly                                                     */

static void
msv_redis_cmd_init(msv_redis_cmd_t *cmd)
{
    cmd->argc = 0;
    cmd->overflow = 0;
    cmd->pos = cmd->buf;
}


/* p must stay valid until the command is queued */
static void
msv_redis_arg(msv_redis_cmd_t *cmd, const void *p, size_t len)
{
    if (cmd->argc == MSV_REDIS_MAX_ARGS) {
        cmd->overflow = 1;
        return;
    }

    cmd->argv[cmd->argc] = p;
    cmd->argvlen[cmd->argc] = len;
    cmd->argc++;
}


static void
msv_redis_arg_cstr(msv_redis_cmd_t *cmd, const char *s)
{
    msv_redis_arg(cmd, s, ngx_strlen(s));
}


static void
msv_redis_arg_uint(msv_redis_cmd_t *cmd, uint64_t v)
{
    msv_redis_arg_fmt(cmd, "%uL", v);
}


/* turn cmd, sent on a key (argv[1]), into PEXPIRE <key> <ms> */
static void
msv_redis_cmd_pexpire(msv_redis_cmd_t *cmd, uint64_t ms)
{
    cmd->argc = 2;
    cmd->argv[0] = "PEXPIRE";
    cmd->argvlen[0] = 7;
    msv_redis_arg_uint(cmd, ms);
}


/* an argument formatted into the command's own buffer */
static void
msv_redis_arg_fmt(msv_redis_cmd_t *cmd, const char *fmt, ...)
{
    u_char   *p, *end;
    va_list   args;

    end = cmd->buf + sizeof(cmd->buf);

    va_start(args, fmt);
    p = ngx_vslprintf(cmd->pos, end, fmt, args);
    va_end(args);

    if (p == end) {
        /* ngx_vslprintf stops at end: the argument may be cut short */
        cmd->overflow = 1;
        return;
    }

    msv_redis_arg(cmd, cmd->pos, p - cmd->pos);
    cmd->pos = p;
}


/* ------------------------------------------------------------------ */
/* HGETALL reply -> JSON object                                         */

static ngx_int_t
msv_redis_reply_json(redisReply *reply, ngx_str_t *json, ngx_log_t *log)
{
    u_char       *p;
    size_t        len, i;
    ngx_uint_t    k, num;
    redisReply   *f, *v;

    if (reply->elements % 2) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "maskserve redis: HGETALL: odd number of elements");
        return NGX_ERROR;
    }

    for (i = 0; i < reply->elements; i++) {
        if (reply->element[i]->type != REDIS_REPLY_STRING) {
            ngx_log_error(NGX_LOG_ERR, log, 0,
                          "maskserve redis: HGETALL: element %uz is not a "
                          "string", i);
            return NGX_ERROR;
        }
    }

    /* two passes: length, then bytes */

    len = sizeof("{}") - 1;
    p = NULL;

    for ( ;; ) {
        if (p != NULL) {
            *p++ = '{';
        }

        for (i = 0; i < reply->elements; i += 2) {
            f = reply->element[i];
            v = reply->element[i + 1];

            num = 0;
            for (k = 0; msv_redis_numeric[k] != NULL; k++) {
                if (f->len == ngx_strlen(msv_redis_numeric[k])
                    && ngx_strncmp(f->str, msv_redis_numeric[k], f->len) == 0)
                {
                    num = msv_redis_json_number((u_char *) v->str, v->len);
                    break;
                }
            }

            if (p == NULL) {
                len += (i ? 1 : 0) + 2
                       + msv_redis_json_string(NULL, (u_char *) f->str,
                                               f->len)
                       + 1;
                len += num ? v->len
                           : 2 + msv_redis_json_string(NULL,
                                                       (u_char *) v->str,
                                                       v->len);
                continue;
            }

            if (i) {
                *p++ = ',';
            }

            *p++ = '"';
            p += msv_redis_json_string(p, (u_char *) f->str, f->len);
            *p++ = '"';
            *p++ = ':';

            if (num) {
                p = ngx_cpymem(p, v->str, v->len);

            } else {
                *p++ = '"';
                p += msv_redis_json_string(p, (u_char *) v->str, v->len);
                *p++ = '"';
            }
        }

        if (p != NULL) {
            *p++ = '}';
            break;
        }

        json->data = ngx_alloc(len, log);
        if (json->data == NULL) {
            return NGX_ERROR;
        }

        p = json->data;
    }

    json->len = p - json->data;

    if (json->len != len) {
        ngx_log_error(NGX_LOG_ALERT, log, 0,
                      "maskserve redis: JSON length %uz, expected %uz",
                      json->len, len);
        ngx_free(json->data);
        json->data = NULL;
        json->len = 0;
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * The body of a JSON string (no quotes) for len bytes at src; returns its
 * length, and writes it to dst unless dst is NULL.  Bytes that are not
 * valid UTF-8 become U+FFFD.
 */
static size_t
msv_redis_json_string(u_char *dst, const u_char *src, size_t len)
{
    u_char         c, esc;
    size_t         n, seq;
    const u_char  *end;

    static const u_char  hex[] = "0123456789abcdef";

    n = 0;
    end = src + len;

    while (src < end) {
        c = *src;

        if (c >= 0x80) {
            seq = msv_redis_utf8_seq(src, end);

            if (seq == 0) {
                if (dst) {
                    dst = ngx_cpymem(dst, "\\ufffd", 6);
                }

                n += 6;
                src++;
                continue;
            }

            if (dst) {
                dst = ngx_cpymem(dst, src, seq);
            }

            n += seq;
            src += seq;
            continue;
        }

        src++;

        /* the letter after a backslash, for characters that have one */
        switch (c) {
        case '"':  esc = '"'; break;
        case '\\': esc = '\\'; break;
        case '\n': esc = 'n'; break;
        case '\r': esc = 'r'; break;
        case '\t': esc = 't'; break;
        case '\b': esc = 'b'; break;
        case '\f': esc = 'f'; break;
        default:   esc = '\0';
        }

        if (esc != '\0') {
            if (dst) {
                *dst++ = '\\';
                *dst++ = esc;
            }

            n += 2;

        } else if (c < 0x20) {
            if (dst) {
                dst = ngx_cpymem(dst, "\\u00", 4);
                *dst++ = hex[c >> 4];
                *dst++ = hex[c & 0xf];
            }

            n += 6;

        } else {
            if (dst) {
                *dst++ = c;
            }

            n++;
        }
    }

    return n;
}


/* length of the valid UTF-8 sequence at p (first byte >= 0x80), or 0 */
static size_t
msv_redis_utf8_seq(const u_char *p, const u_char *end)
{
    size_t  n, i;
    u_char  c, lo, hi;

    c = p[0];
    lo = 0x80;
    hi = 0xbf;

    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;

    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        if (c == 0xe0) {
            lo = 0xa0;          /* no overlong forms */
        } else if (c == 0xed) {
            hi = 0x9f;          /* no surrogates */
        }

    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        if (c == 0xf0) {
            lo = 0x90;
        } else if (c == 0xf4) {
            hi = 0x8f;          /* nothing above U+10FFFF */
        }

    } else {
        return 0;
    }

    if ((size_t) (end - p) < n) {
        return 0;
    }

    if (p[1] < lo || p[1] > hi) {
        return 0;
    }

    for (i = 2; i < n; i++) {
        if (p[i] < 0x80 || p[i] > 0xbf) {
            return 0;
        }
    }

    return n;
}


/* 1 when p is a JSON integer that a double holds exactly */
static ngx_uint_t
msv_redis_json_number(const u_char *p, size_t len)
{
    size_t  i;

    i = (len > 0 && p[0] == '-') ? 1 : 0;

    if (len - i == 0 || len - i > 15) {
        return 0;
    }

    if (p[i] == '0' && len - i > 1) {
        return 0;
    }

    for ( /* void */ ; i < len; i++) {
        if (p[i] < '0' || p[i] > '9') {
            return 0;
        }
    }

    return 1;
}


static uint64_t
msv_redis_now_ms(void)
{
    ngx_time_t  *tp;

    tp = ngx_timeofday();

    return (uint64_t) tp->sec * 1000 + tp->msec;
}
