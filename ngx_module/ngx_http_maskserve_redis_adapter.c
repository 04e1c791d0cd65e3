/*
 * ngx_http_maskserve_redis_adapter.c: a redisAsyncContext's socket as an
 * nginx connection, modelled on hiredis's adapters/libevent.h.
 *
 * The adapter's cleanup frees the nginx connection but never closes the
 * fd: hiredis closes it right after.  The adapter knows nothing of its
 * user: when the event loop refuses an event it calls the failure
 * callback it was given, and the user closes the context later (never
 * from inside hiredis).
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include <hiredis/hiredis.h>
#include <hiredis/async.h>

#include "ngx_http_maskserve_redis_adapter.h"


#if (HIREDIS_MAJOR >= 1)
/* hiredis 1.x: ev.scheduleTimer, redisAsyncSetTimeout, HandleTimeout */
#define MSV_REDIS_HIREDIS_TIMER  1
#else
#define MSV_REDIS_HIREDIS_TIMER  0
#endif


/* ev.data of a redisAsyncContext: one per context, freed in cleanup */
typedef struct {
    ngx_connection_t                 *conn;
    redisAsyncContext                *ac;
    ngx_http_maskserve_redis_fail_pt  fail;
    void                             *data;     /* fail's argument */
#if (MSV_REDIS_HIREDIS_TIMER)
    ngx_event_t                       timer;    /* ev.scheduleTimer */
#endif
} msv_redis_adapter_t;


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


ngx_int_t
ngx_http_maskserve_redis_adapter_attach(redisAsyncContext *ac, ngx_log_t *log,
    ngx_msec_t timeout, ngx_http_maskserve_redis_fail_pt fail, void *data)
{
    ngx_connection_t     *c;
    msv_redis_adapter_t  *a;
#if (MSV_REDIS_HIREDIS_TIMER)
    struct timeval        tv;
#endif

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
    a->fail = fail;
    a->data = data;

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

    tv.tv_sec = timeout / 1000;
    tv.tv_usec = (timeout % 1000) * 1000;

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
 * the failure callback hears of it, with reason.
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
        a->fail(a->data, reason);
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

