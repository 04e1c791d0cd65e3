/*
 * ngx_http_maskserve_redis_link.c: the links to Redis.  A link is a
 * redisAsyncContext made and remade from timers with capped exponential
 * backoff; a reply watchdog closes a link that stops answering.
 *
 * hiredis is never re-entered from one of its own callbacks: a link is
 * closed (redisAsyncFree) only from a timer or a posted event.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include <poll.h>

#include <hiredis/hiredis.h>
#include <hiredis/async.h>

#include "ngx_http_maskserve_redis_ctx.h"
#include "ngx_http_maskserve_redis_store.h"
#include "ngx_http_maskserve_redis_cmd.h"
#include "ngx_http_maskserve_redis_adapter.h"


static ngx_int_t msv_redis_id_valid(ngx_str_t *id);


static void msv_redis_link_reset(msv_redis_link_t *link,
    redisAsyncContext *ac);
static ngx_int_t msv_redis_link_handshake(msv_redis_link_t *link,
    msv_redis_cmd_t *cmd);
static void msv_redis_link_retry(msv_redis_link_t *link);
static void msv_redis_link_lost(msv_redis_link_t *link,
    const redisAsyncContext *ac, const char *reason);
static void msv_redis_link_ready(msv_redis_link_t *link);
static void msv_redis_link_failed(void *data, const char *reason);
static void msv_redis_reconnect_handler(ngx_event_t *ev);
static void msv_redis_watchdog_handler(ngx_event_t *ev);
static void msv_redis_close_handler(ngx_event_t *ev);
static void msv_redis_connect_cb(const redisAsyncContext *ac, int status);
static void msv_redis_disconnect_cb(const redisAsyncContext *ac,
    int status);
static void msv_redis_handshake_cb(redisAsyncContext *ac, void *r,
    void *privdata);
static void msv_redis_sub_cb(redisAsyncContext *ac, void *r,
    void *privdata);


/* ------------------------------------------------------------------ */
/* Links: connect, handshake, watchdog, close, reconnect                */

void
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


void
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

    if (ngx_http_maskserve_redis_adapter_attach(ac, ctx->log,
                                                MSV_REDIS_TIMEOUT,
                                                msv_redis_link_failed, link)
        != NGX_OK)
    {
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
void
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
void
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


/* the adapter's failure callback */
static void
msv_redis_link_failed(void *data, const char *reason)
{
    msv_redis_link_fail(data, reason);
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
ngx_int_t
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
void
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
void
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

    /*
     * Anyone who can PUBLISH sends this: only a well-formed request id
     * (or "*") goes further, into the log or a lookup; the bytes of a bad one are
     * not logged (they could forge log lines).
     */
    /* "*" (abort everything, see abort_requests) is the one exception */
    if (!(id.len == 1 && id.data[0] == '*') && !msv_redis_id_valid(&id)) {
        ngx_log_error(NGX_LOG_WARN, msv_redis->log, 0,
                      "maskserve redis: abort message with an invalid "
                      "request id (%uz bytes) ignored", id.len);
        return;
    }

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, msv_redis->log, 0,
                   "maskserve redis: abort message for \"%V\"", &id);

    if (msv_redis_abort_handler != NULL) {
        msv_redis_abort_handler(&id);
    }
}


/* The module's request id rule: 1..MSV_REQ_ID_MAX of [A-Za-z0-9._:-]. */
static ngx_int_t
msv_redis_id_valid(ngx_str_t *id)
{
    u_char  ch;
    size_t  i;

    if (id->len == 0 || id->len > MSV_REQ_ID_MAX) {
        return 0;
    }

    for (i = 0; i < id->len; i++) {
        ch = id->data[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')
              || (ch >= '0' && ch <= '9')
              || ch == '.' || ch == '_' || ch == ':' || ch == '-'))
        {
            return 0;
        }
    }

    return 1;
}

