/*
 * ngx_http_maskserve_fleet.c: the front role.
 *
 * Each nginx worker process of a front reads the worker registry from
 * Redis every `refresh` (250 ms by default) and folds it into a table of
 * GPU hosts: address, ready regions, capacity and load, when its
 * heartbeat last moved, and what this process itself sent there.  The
 * upstream balancer (maskserve_fleet in an upstream block) picks a host
 * from that table for each try of nginx's proxy, so connecting, retries
 * (proxy_next_upstream), unbuffered streaming, keepalive and timeouts are
 * nginx's own.  The rules:
 *
 *   - a host is live while its newest heartbeat moved within `stale`, as
 *     seen on this front's clock (so clocks need not agree), it has a
 *     ready region and an address (maskserve_fleet_address on the host);
 *   - a host that failed a try (connect error, timeout, or an invalid
 *     answer before the response started) max_fails times in a row is
 *     skipped for fail_timeout;
 *   - with an affinity key, the live host with free capacity that ranks
 *     first for the key (rendezvous hashing) takes it, so a group stays
 *     on one host while the set of hosts does not change;
 *   - otherwise the live host with the lowest estimated load / capacity
 *     (ngx_http_maskserve_fleet_est), hosts with free capacity first.
 *
 * maskserve_fleet_owner locations (abort, request status) look the
 * request id up in Redis first and pin the balancer to the host that
 * runs it.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_maskserve_module.h"
#include "ngx_http_maskserve_fleet.h"
#include "ngx_http_maskserve_parse.h"
#include "ngx_http_maskserve_redis.h"
#include "ngx_http_maskserve_redis_fleet.h"
#include "ngx_http_maskserve_stream.h"
#include "ngx_http_maskserve_util.h"


#define NGX_HTTP_MASKSERVE_FLEET_HOSTS   256   /* hosts a front tracks */
#define NGX_HTTP_MASKSERVE_FLEET_WORDS   (NGX_HTTP_MASKSERVE_FLEET_HOSTS / 64)


typedef struct {
    ngx_http_complex_value_t  *affinity;     /* NULL: none */
    ngx_msec_t                 stale;
    ngx_msec_t                 refresh;
    ngx_uint_t                 max_fails;
    ngx_msec_t                 fail_timeout;
} ngx_http_maskserve_fleet_conf_t;


typedef struct {
    u_char                     name_buf[NGX_HTTP_MASKSERVE_FLEET_NAME_MAX + 1];
    u_char                     addr_buf[NGX_HTTP_MASKSERVE_FLEET_NAME_MAX + 1];
    ngx_str_t                  name;
    ngx_str_t                  addr;         /* the peer's name in logs */
    ngx_sockaddr_t             sockaddr;
    socklen_t                  socklen;

    /* from the last registry scan that saw the host */
    ngx_uint_t                 regions;
    ngx_uint_t                 ready;        /* regions alive */
    ngx_uint_t                 draining;     /* regions draining */
    ngx_uint_t                 capacity;     /* of the ready regions */
    ngx_uint_t                 load;
    uint64_t                   heartbeat;    /* newest, the host's clock */
    ngx_msec_t                 beat_at;      /* ours: when it last moved */

    /* this process */
    ngx_uint_t                 inflight;
    ngx_uint_t                 inflight_at_beat; /* when load was read */
    ngx_uint_t                 requests;
    ngx_uint_t                 fails;        /* failed tries in a row */
    ngx_msec_t                 skip_until;

    unsigned                   seen:1;       /* in the last scan */
    unsigned                   routable:1;   /* addr parsed */
    unsigned                   used:1;
} ngx_http_maskserve_fleet_host_t;


/*
 * A front request held by the precontent handler: until this process has
 * read the registry once, and for requests about one request id, during
 * the lookup of its owner.
 */
typedef struct {
    ngx_http_request_t        *r;
    ngx_int_t                  status;       /* of the owner lookup */
    void                      *handle;       /* pending Redis lookup */
    ngx_str_t                  owner;        /* host name; empty: none */
    ngx_msec_t                 wait_start;   /* for the first registry read */
    unsigned                   looking:1;    /* owner lookup started */
} ngx_http_maskserve_fleet_req_t;


/* how long a request waits for its process's first registry read */
#define NGX_HTTP_MASKSERVE_FLEET_FIRST_WAIT  2000
#define NGX_HTTP_MASKSERVE_FLEET_WAIT_STEP   10


/* one proxied request's tries */
typedef struct {
    ngx_http_request_t        *r;
    ngx_http_maskserve_fleet_conf_t  *fcf;
    ngx_str_t                  key;          /* affinity; empty: none */
    ngx_str_t                  owner;        /* pinned host; empty: none */
    ngx_int_t                  current;      /* host of the open try */
    uint64_t                   tried[NGX_HTTP_MASKSERVE_FLEET_WORDS];
} ngx_http_maskserve_fleet_peer_t;


typedef enum {
    NGX_HTTP_MASKSERVE_HOST_UP = 0,
    NGX_HTTP_MASKSERVE_HOST_FULL,            /* live, no free capacity */
    NGX_HTTP_MASKSERVE_HOST_FAILING,         /* skipped after failures */
    NGX_HTTP_MASKSERVE_HOST_NOT_READY,       /* no region alive */
    NGX_HTTP_MASKSERVE_HOST_DRAINING,        /* none alive, some draining */
    NGX_HTTP_MASKSERVE_HOST_STALE,           /* heartbeat stopped */
    NGX_HTTP_MASKSERVE_HOST_NO_ADDRESS,
    NGX_HTTP_MASKSERVE_HOST_GONE             /* registry keys expired */
} ngx_http_maskserve_host_state_e;


static ngx_int_t ngx_http_maskserve_fleet_init_upstream(ngx_conf_t *cf,
    ngx_http_upstream_srv_conf_t *us);
static ngx_int_t ngx_http_maskserve_fleet_init_peer(ngx_http_request_t *r,
    ngx_http_upstream_srv_conf_t *us);
static ngx_int_t ngx_http_maskserve_fleet_get_peer(ngx_peer_connection_t *pc,
    void *data);
static void ngx_http_maskserve_fleet_free_peer(ngx_peer_connection_t *pc,
    void *data, ngx_uint_t state);
static ngx_int_t ngx_http_maskserve_fleet_pick(
    ngx_http_maskserve_fleet_peer_t *fp);
static ngx_http_maskserve_host_state_e ngx_http_maskserve_fleet_state(
    ngx_http_maskserve_fleet_host_t *h);
static ngx_int_t ngx_http_maskserve_fleet_find(ngx_str_t *name);
static ngx_uint_t ngx_http_maskserve_fleet_est(
    ngx_http_maskserve_fleet_host_t *h);

static void ngx_http_maskserve_fleet_tick(ngx_event_t *ev);
static void ngx_http_maskserve_fleet_scanned(void *data, ngx_int_t rc,
    ngx_http_maskserve_redis_worker_rec_t *recs, ngx_uint_t n);
static ngx_http_maskserve_fleet_host_t *ngx_http_maskserve_fleet_host(
    u_char *name, size_t len);

static ngx_int_t ngx_http_maskserve_fleet_owner_handler(ngx_http_request_t *r);
static void ngx_http_maskserve_fleet_wait_handler(ngx_http_request_t *r);
static void ngx_http_maskserve_fleet_owner_body(ngx_http_request_t *r);
static void ngx_http_maskserve_fleet_owner_found(void *data, ngx_int_t rc,
    ngx_http_maskserve_redis_record_t *rec);
static void ngx_http_maskserve_fleet_owner_cleanup(void *data);
static void ngx_http_maskserve_fleet_fail(ngx_http_request_t *r,
    ngx_uint_t status, const char *param, u_char *msg, size_t len);
static u_char *ngx_http_maskserve_fleet_json_str(u_char *p, ngx_str_t *s);
static ngx_int_t ngx_http_maskserve_fleet_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);


static ngx_http_output_body_filter_pt  ngx_http_maskserve_fleet_next_body;


static const char  *ngx_http_maskserve_host_states[] = {
    "up", "full", "failing", "not_ready", "draining", "stale", "no_address",
    "gone"
};


static ngx_str_t  ngx_http_maskserve_fleet_name = ngx_string("maskserve_fleet");


/* per process */
static ngx_http_maskserve_fleet_conf_t  *ngx_http_maskserve_fleet_fcf;
static ngx_http_maskserve_fleet_host_t  *ngx_http_maskserve_fleet_hosts;
static ngx_uint_t                        ngx_http_maskserve_fleet_nhosts;
static ngx_uint_t                        ngx_http_maskserve_fleet_rr;
static ngx_msec_t                        ngx_http_maskserve_fleet_scan_at;
static ngx_uint_t                        ngx_http_maskserve_fleet_scans;
static ngx_event_t                       ngx_http_maskserve_fleet_timer;


/* ------------------------------------------------------------------ */
/* Configuration                                                        */

char *
ngx_http_maskserve_fleet_conf(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_str_t                          *value, s;
    ngx_uint_t                          i;
    ngx_msec_t                         *ms;
    ngx_http_upstream_srv_conf_t       *uscf;
    ngx_http_maskserve_fleet_conf_t    *fcf;
    ngx_http_maskserve_main_conf_t     *mcf;
    ngx_http_compile_complex_value_t    ccv;

    mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_maskserve_module);
    uscf = ngx_http_conf_get_module_srv_conf(cf, ngx_http_upstream_module);

    if (mcf->fleet != NULL) {
        return "is duplicate: one maskserve_fleet upstream per configuration";
    }

    if (uscf->peer.init_upstream) {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "load balancing method redefined");
    }

    fcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_maskserve_fleet_conf_t));
    if (fcf == NULL) {
        return NGX_CONF_ERROR;
    }

    fcf->stale = 3000;
    fcf->refresh = 250;
    fcf->max_fails = 1;
    fcf->fail_timeout = 10000;

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "affinity=", 9) == 0) {
            s.data = value[i].data + 9;
            s.len = value[i].len - 9;

            fcf->affinity = ngx_palloc(cf->pool,
                                       sizeof(ngx_http_complex_value_t));
            if (fcf->affinity == NULL) {
                return NGX_CONF_ERROR;
            }

            ngx_memzero(&ccv, sizeof(ngx_http_compile_complex_value_t));
            ccv.cf = cf;
            ccv.value = &s;
            ccv.complex_value = fcf->affinity;

            if (ngx_http_compile_complex_value(&ccv) != NGX_OK) {
                return NGX_CONF_ERROR;
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "max_fails=", 10) == 0) {
            fcf->max_fails = ngx_atoi(value[i].data + 10, value[i].len - 10);
            if (fcf->max_fails == (ngx_uint_t) NGX_ERROR) {
                goto invalid;
            }

            continue;
        }

        ms = NULL;

        if (ngx_strncmp(value[i].data, "stale=", 6) == 0) {
            ms = &fcf->stale;
            s.data = value[i].data + 6;

        } else if (ngx_strncmp(value[i].data, "refresh=", 8) == 0) {
            ms = &fcf->refresh;
            s.data = value[i].data + 8;

        } else if (ngx_strncmp(value[i].data, "fail_timeout=", 13) == 0) {
            ms = &fcf->fail_timeout;
            s.data = value[i].data + 13;
        }

        if (ms == NULL) {
            goto invalid;
        }

        s.len = value[i].data + value[i].len - s.data;
        *ms = ngx_parse_time(&s, 0);

        if (*ms == (ngx_msec_t) NGX_ERROR || *ms == 0) {
            goto invalid;
        }
    }

    if (fcf->stale < 1500) {
        return "stale= must be at least 1500ms: hosts report every second";
    }

    uscf->peer.init_upstream = ngx_http_maskserve_fleet_init_upstream;
    uscf->peer.data = fcf;
    uscf->flags = 0;          /* the hosts come from Redis: no "server" */

    /*
     * The upstream block insists on a server; this empty one, never used,
     * stands for the hosts of the registry (init_upstream refuses others).
     */
    if (uscf->servers == NULL || uscf->servers->nelts != 0
        || ngx_array_push(uscf->servers) == NULL)
    {
        return "must come first in its upstream block, before any \"server\"";
    }

    ngx_memzero(uscf->servers->elts, sizeof(ngx_http_upstream_server_t));

    mcf->fleet = fcf;

    return NGX_CONF_OK;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid maskserve_fleet parameter \"%V\": expected "
                       "affinity=, stale=, refresh=, max_fails= or "
                       "fail_timeout=", &value[i]);
    return NGX_CONF_ERROR;
}


char *
ngx_http_maskserve_fleet_check(ngx_conf_t *cf,
    ngx_http_maskserve_main_conf_t *mcf)
{
    ngx_url_t  u;

    /* fronts parse it without resolving: check it here, where it is set */
    if (mcf->redis.address.len) {
        ngx_memzero(&u, sizeof(ngx_url_t));
        u.url = mcf->redis.address;
        u.no_resolve = 1;

        if (mcf->redis.address.len > NGX_HTTP_MASKSERVE_FLEET_NAME_MAX
            || ngx_parse_url(cf->pool, &u) != NGX_OK || u.naddrs == 0
            || u.no_port || u.uri.len)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid maskserve_fleet_address \"%V\": "
                               "expected a numeric ip:port that fronts "
                               "connect to", &mcf->redis.address);
            return NGX_CONF_ERROR;
        }

        if (!mcf->redis_on) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"maskserve_fleet_address\" is written to "
                               "the registry in Redis: \"maskserve_redis\" "
                               "must be set");
            return NGX_CONF_ERROR;
        }
    }

    if (mcf->fleet != NULL && !mcf->redis_on) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"maskserve_fleet\" reads the GPU hosts from "
                           "Redis: \"maskserve_redis\" must be set");
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_maskserve_fleet_init_upstream(ngx_conf_t *cf,
    ngx_http_upstream_srv_conf_t *us)
{
    if (us->servers && us->servers->nelts > 1) {
        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "upstream \"%V\" with maskserve_fleet takes its hosts "
                      "from Redis: it must have no \"server\"", &us->host);
        return NGX_ERROR;
    }

    us->peer.init = ngx_http_maskserve_fleet_init_peer;

    return NGX_OK;
}


ngx_int_t
ngx_http_maskserve_fleet_postconf(ngx_conf_t *cf)
{
    ngx_http_handler_pt        *h;
    ngx_http_core_main_conf_t  *cmcf;

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_PRECONTENT_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_maskserve_fleet_owner_handler;

    ngx_http_maskserve_fleet_next_body = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_maskserve_fleet_body_filter;

    return NGX_OK;
}


/* ------------------------------------------------------------------ */
/* The host table                                                       */

ngx_int_t
ngx_http_maskserve_fleet_init_process(ngx_cycle_t *cycle,
    ngx_http_maskserve_main_conf_t *mcf)
{
    ngx_event_t  *ev;

    if (mcf->fleet == NULL) {
        return NGX_OK;
    }

    ngx_http_maskserve_fleet_hosts = ngx_calloc(NGX_HTTP_MASKSERVE_FLEET_HOSTS
                                     * sizeof(ngx_http_maskserve_fleet_host_t),
                                     cycle->log);
    if (ngx_http_maskserve_fleet_hosts == NULL) {
        return NGX_ERROR;
    }

    ngx_http_maskserve_fleet_fcf = mcf->fleet;
    ngx_http_maskserve_fleet_nhosts = 0;
    ngx_http_maskserve_fleet_scans = 0;

    ev = &ngx_http_maskserve_fleet_timer;
    ev->handler = ngx_http_maskserve_fleet_tick;
    ev->log = cycle->log;
    ev->cancelable = 1;

    /* Redis connects asynchronously: the first scans are declined */
    ngx_add_timer(ev, 10);

    return NGX_OK;
}


void
ngx_http_maskserve_fleet_exit_process(ngx_cycle_t *cycle)
{
    if (ngx_http_maskserve_fleet_fcf == NULL) {
        return;
    }

    if (ngx_http_maskserve_fleet_timer.timer_set) {
        ngx_del_timer(&ngx_http_maskserve_fleet_timer);
    }

    /*
     * The table stays: Redis's exit, which runs later, answers a scan in
     * flight, and requests being torn down still free their peers.
     */
    ngx_http_maskserve_fleet_fcf = NULL;
}


static void
ngx_http_maskserve_fleet_tick(ngx_event_t *ev)
{
    ngx_int_t  rc;

    if (ngx_http_maskserve_fleet_fcf == NULL || ngx_exiting) {
        return;
    }

    rc = ngx_http_maskserve_redis_scan_workers(
                                    ngx_http_maskserve_fleet_scanned, NULL);

    if (rc == NGX_DECLINED || rc == NGX_ERROR) {
        /*
         * Redis is down: route on the table as last read.  Staleness is
         * measured up to the last scan, so hosts do not all expire while
         * Redis fails over; connect failures still skip dead ones.
         */
        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, ev->log, 0,
                       "maskserve fleet: registry not read, Redis down");
    }

    ngx_add_timer(ev, ngx_http_maskserve_fleet_fcf->refresh);
}


static void
ngx_http_maskserve_fleet_scanned(void *data, ngx_int_t rc,
    ngx_http_maskserve_redis_worker_rec_t *recs, ngx_uint_t n)
{
    ngx_msec_t                              now;
    ngx_uint_t                              i;
    uint64_t                                wall;
    ngx_url_t                               u;
    ngx_time_t                             *tp;
    ngx_http_maskserve_fleet_host_t        *h;
    ngx_http_maskserve_redis_worker_rec_t  *w;
    uint64_t                                prev[NGX_HTTP_MASKSERVE_FLEET_HOSTS];
    ngx_uint_t                              was[NGX_HTTP_MASKSERVE_FLEET_HOSTS];

    if (rc != NGX_OK || ngx_http_maskserve_fleet_hosts == NULL) {
        return;
    }

    now = ngx_current_msec;
    tp = ngx_timeofday();
    wall = (uint64_t) tp->sec * 1000 + tp->msec;

    ngx_memzero(prev, sizeof(prev));
    ngx_memzero(was, sizeof(was));

    for (i = 0; i < ngx_http_maskserve_fleet_nhosts; i++) {
        h = &ngx_http_maskserve_fleet_hosts[i];
        prev[i] = h->heartbeat;
        was[i] = h->seen;
        h->seen = 0;
        h->regions = 0;
        h->ready = 0;
        h->draining = 0;
        h->capacity = 0;
        h->load = 0;
        h->heartbeat = 0;
    }

    for (i = 0; i < n; i++) {
        w = &recs[i];

        h = ngx_http_maskserve_fleet_host(w->host, w->host_len);
        if (h == NULL) {
            continue;
        }

        h->seen = 1;
        h->regions++;
        h->heartbeat = ngx_max(h->heartbeat, w->heartbeat);

        if (w->draining) {
            h->draining++;

        } else if (w->alive && w->capacity > 0) {
            h->ready++;
            h->capacity += w->capacity;
            h->load += w->load;
        }

        if (w->addr_len == 0
            || (h->routable && h->addr.len == w->addr_len
                && ngx_strncmp(h->addr.data, w->addr, w->addr_len) == 0))
        {
            continue;
        }

        /* a new or changed address: numeric host:port, never resolved */
        ngx_memzero(&u, sizeof(ngx_url_t));
        u.url.data = w->addr;
        u.url.len = w->addr_len;
        u.no_resolve = 1;

        if (ngx_parse_url(ngx_cycle->pool, &u) != NGX_OK || u.naddrs == 0
            || u.no_port || u.uri.len)
        {
            ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                          "maskserve fleet: host \"%V\" has an invalid "
                          "address \"%s\": expected a numeric ip:port",
                          &h->name, w->addr);
            h->routable = 0;
            continue;
        }

        ngx_memcpy(&h->sockaddr, u.addrs[0].sockaddr, u.addrs[0].socklen);
        h->socklen = u.addrs[0].socklen;
        ngx_memcpy(h->addr_buf, w->addr, w->addr_len + 1);
        h->addr.data = h->addr_buf;
        h->addr.len = w->addr_len;
        h->routable = 1;
    }

    for (i = 0; i < ngx_http_maskserve_fleet_nhosts; i++) {
        h = &ngx_http_maskserve_fleet_hosts[i];

        if (!h->seen || h->heartbeat == prev[i]) {
            continue;
        }

        /* a new sample of its load: it includes what we had sent by now */
        h->inflight_at_beat = h->inflight;

        if (was[i] || prev[i] != 0) {
            h->beat_at = now;

        } else {
            /* first sight: only the host's clock says how old it is */
            h->beat_at = (wall > h->heartbeat
                          && wall - h->heartbeat
                             > ngx_http_maskserve_fleet_fcf->stale)
                         ? now - ngx_http_maskserve_fleet_fcf->stale - 1
                         : now;
        }
    }

    ngx_http_maskserve_fleet_scan_at = now;
    ngx_http_maskserve_fleet_scans++;
}


/* the table entry of a host, created on first sight */
static ngx_http_maskserve_fleet_host_t *
ngx_http_maskserve_fleet_host(u_char *name, size_t len)
{
    ngx_int_t                         i;
    ngx_str_t                         s;
    ngx_uint_t                        k;
    ngx_http_maskserve_fleet_host_t  *h;

    s.data = name;
    s.len = len;

    i = ngx_http_maskserve_fleet_find(&s);
    if (i >= 0) {
        return &ngx_http_maskserve_fleet_hosts[i];
    }

    if (ngx_http_maskserve_fleet_nhosts < NGX_HTTP_MASKSERVE_FLEET_HOSTS) {
        h = &ngx_http_maskserve_fleet_hosts[ngx_http_maskserve_fleet_nhosts++];

    } else {
        /* reuse a host that is gone and that nothing is connected to */
        h = NULL;

        for (k = 0; k < NGX_HTTP_MASKSERVE_FLEET_HOSTS; k++) {
            if (!ngx_http_maskserve_fleet_hosts[k].seen
                && ngx_http_maskserve_fleet_hosts[k].inflight == 0)
            {
                h = &ngx_http_maskserve_fleet_hosts[k];
                break;
            }
        }

        if (h == NULL) {
            ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                          "maskserve fleet: more than %d hosts, \"%V\" is "
                          "not routed to", NGX_HTTP_MASKSERVE_FLEET_HOSTS,
                          &s);
            return NULL;
        }
    }

    ngx_memzero(h, sizeof(ngx_http_maskserve_fleet_host_t));
    ngx_memcpy(h->name_buf, name, len);
    h->name.data = h->name_buf;
    h->name.len = len;
    h->used = 1;

    return h;
}


static ngx_int_t
ngx_http_maskserve_fleet_find(ngx_str_t *name)
{
    ngx_uint_t                        i;
    ngx_http_maskserve_fleet_host_t  *h;

    for (i = 0; i < ngx_http_maskserve_fleet_nhosts; i++) {
        h = &ngx_http_maskserve_fleet_hosts[i];

        if (h->used && h->name.len == name->len
            && ngx_strncmp(h->name.data, name->data, name->len) == 0)
        {
            return (ngx_int_t) i;
        }
    }

    return -1;
}


/*
 * A host's load as this process estimates it: the registry's last sample
 * plus the requests this process sent there since (those sent before are
 * in the sample already; those that ended since are not subtracted, so
 * the estimate errs high, towards spreading).
 */
static ngx_uint_t
ngx_http_maskserve_fleet_est(ngx_http_maskserve_fleet_host_t *h)
{
    return h->load + (h->inflight > h->inflight_at_beat
                      ? h->inflight - h->inflight_at_beat : 0);
}


static ngx_http_maskserve_host_state_e
ngx_http_maskserve_fleet_state(ngx_http_maskserve_fleet_host_t *h)
{
    ngx_http_maskserve_fleet_conf_t  *fcf;

    fcf = ngx_http_maskserve_fleet_fcf;

    if (!h->seen) {
        return NGX_HTTP_MASKSERVE_HOST_GONE;
    }

    if (!h->routable) {
        return NGX_HTTP_MASKSERVE_HOST_NO_ADDRESS;
    }

    if (fcf == NULL
        || (ngx_msec_int_t) (ngx_http_maskserve_fleet_scan_at - h->beat_at)
           > (ngx_msec_int_t) fcf->stale)
    {
        return NGX_HTTP_MASKSERVE_HOST_STALE;
    }

    if (h->ready == 0) {
        return h->draining ? NGX_HTTP_MASKSERVE_HOST_DRAINING
                           : NGX_HTTP_MASKSERVE_HOST_NOT_READY;
    }

    if ((ngx_msec_int_t) (h->skip_until - ngx_current_msec) > 0) {
        return NGX_HTTP_MASKSERVE_HOST_FAILING;
    }

    if (ngx_http_maskserve_fleet_est(h) >= h->capacity) {
        return NGX_HTTP_MASKSERVE_HOST_FULL;
    }

    return NGX_HTTP_MASKSERVE_HOST_UP;
}


ngx_int_t
ngx_http_maskserve_fleet_targets(ngx_pool_t *pool, ngx_uint_t draining,
    ngx_array_t *out)
{
    ngx_uint_t                         i;
    ngx_http_maskserve_fleet_host_t   *h;
    ngx_http_maskserve_host_state_e    st;
    ngx_http_maskserve_fleet_target_t *t;

    if (ngx_http_maskserve_fleet_fcf == NULL) {
        return NGX_DECLINED;
    }

    for (i = 0; i < ngx_http_maskserve_fleet_nhosts; i++) {
        h = &ngx_http_maskserve_fleet_hosts[i];
        st = ngx_http_maskserve_fleet_state(h);

        if (st == NGX_HTTP_MASKSERVE_HOST_GONE
            || st == NGX_HTTP_MASKSERVE_HOST_NO_ADDRESS
            || (st == NGX_HTTP_MASKSERVE_HOST_DRAINING && !draining))
        {
            continue;
        }

        t = ngx_array_push(out);
        if (t == NULL) {
            return NGX_ERROR;
        }

        t->name.data = ngx_pstrdup(pool, &h->name);
        t->addr.data = ngx_pstrdup(pool, &h->addr);
        if (t->name.data == NULL || t->addr.data == NULL) {
            return NGX_ERROR;
        }

        t->name.len = h->name.len;
        t->addr.len = h->addr.len;
        t->state = ngx_http_maskserve_host_states[st];
    }

    return NGX_OK;
}


/* ------------------------------------------------------------------ */
/* The balancer                                                         */

static ngx_int_t
ngx_http_maskserve_fleet_init_peer(ngx_http_request_t *r,
    ngx_http_upstream_srv_conf_t *us)
{
    ngx_uint_t                        i, n;
    ngx_http_maskserve_ctx_t         *ctx;
    ngx_http_maskserve_fleet_req_t   *fr;
    ngx_http_maskserve_fleet_peer_t  *fp;

    fp = ngx_pcalloc(r->pool, sizeof(ngx_http_maskserve_fleet_peer_t));
    if (fp == NULL) {
        return NGX_ERROR;
    }

    fp->r = r;
    fp->fcf = us->peer.data;
    fp->current = -1;

    ctx = ngx_http_get_module_ctx(r, ngx_http_maskserve_module);
    fr = ctx ? ctx->fleet : NULL;

    if (fr != NULL && fr->owner.len) {
        fp->owner = fr->owner;

    } else if (fp->fcf->affinity != NULL) {
        if (ngx_http_complex_value(r, fp->fcf->affinity, &fp->key) != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    /* one try per live host; a pinned request has its owner only */
    n = 0;

    for (i = 0; ngx_http_maskserve_fleet_fcf != NULL
                && i < ngx_http_maskserve_fleet_nhosts; i++)
    {
        if (ngx_http_maskserve_fleet_state(&ngx_http_maskserve_fleet_hosts[i])
            <= NGX_HTTP_MASKSERVE_HOST_FULL)
        {
            n++;
        }
    }

    r->upstream->peer.data = fp;
    r->upstream->peer.get = ngx_http_maskserve_fleet_get_peer;
    r->upstream->peer.free = ngx_http_maskserve_fleet_free_peer;
    r->upstream->peer.tries = (fp->owner.len || n == 0) ? 1 : n;

    return NGX_OK;
}


static ngx_int_t
ngx_http_maskserve_fleet_get_peer(ngx_peer_connection_t *pc, void *data)
{
    ngx_http_maskserve_fleet_peer_t  *fp = data;

    ngx_int_t                         i;
    ngx_http_maskserve_fleet_host_t  *h;

    pc->cached = 0;
    pc->connection = NULL;

    i = ngx_http_maskserve_fleet_pick(fp);

    if (i < 0) {
        /* no further try either: ngx_http_upstream_next ends with a 502 */
        pc->tries = 0;
        pc->name = &ngx_http_maskserve_fleet_name;

        ngx_log_error(NGX_LOG_ERR, pc->log, 0,
                      "maskserve fleet: no live GPU host%s%V%s",
                      fp->owner.len ? " (the request runs on \"" : "",
                      &fp->owner, fp->owner.len ? "\")" : "");
        return NGX_BUSY;
    }

    h = &ngx_http_maskserve_fleet_hosts[i];

    pc->sockaddr = &h->sockaddr.sockaddr;
    pc->socklen = h->socklen;
    pc->name = &h->addr;

    h->inflight++;
    h->requests++;

    fp->current = i;
    fp->tried[i / 64] |= (uint64_t) 1 << (i % 64);

    return NGX_OK;
}


static void
ngx_http_maskserve_fleet_free_peer(ngx_peer_connection_t *pc, void *data,
    ngx_uint_t state)
{
    ngx_http_maskserve_fleet_peer_t  *fp = data;

    ngx_http_maskserve_fleet_host_t  *h;

    if (fp->current < 0) {
        return;
    }

    h = &ngx_http_maskserve_fleet_hosts[fp->current];
    fp->current = -1;

    if (h->inflight) {
        h->inflight--;
    }

    if (state & NGX_PEER_FAILED) {
        h->fails++;

        if (h->fails >= fp->fcf->max_fails && fp->fcf->max_fails > 0) {
            h->skip_until = ngx_current_msec + fp->fcf->fail_timeout;
            h->fails = 0;

            ngx_log_error(NGX_LOG_WARN, pc->log, 0,
                          "maskserve fleet: host \"%V\" (%V) failed, "
                          "skipped for %Mms", &h->name, &h->addr,
                          fp->fcf->fail_timeout);
        }

    } else {
        h->fails = 0;
    }

    if (pc->tries) {
        pc->tries--;
    }
}


/* 32-bit FNV-1a, then a finalizer: the rendezvous score of key and host */
static uint32_t
ngx_http_maskserve_fleet_score(ngx_str_t *key, ngx_str_t *host)
{
    size_t    i;
    uint32_t  x;

    x = 2166136261u;

    for (i = 0; i < key->len; i++) {
        x = (x ^ key->data[i]) * 16777619u;
    }

    x = (x ^ 0xff) * 16777619u;

    for (i = 0; i < host->len; i++) {
        x = (x ^ host->data[i]) * 16777619u;
    }

    x ^= x >> 16;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    x *= 0xc2b2ae35u;
    x ^= x >> 16;

    return x;
}


/* index of the host for the next try, or -1 */
static ngx_int_t
ngx_http_maskserve_fleet_pick(ngx_http_maskserve_fleet_peer_t *fp)
{
    uint32_t                          score, best_score;
    ngx_int_t                         best, i;
    ngx_uint_t                        k, n, best_full, full;
    uint64_t                          est, best_est;
    ngx_http_maskserve_fleet_host_t  *h, *b;
    ngx_http_maskserve_host_state_e   st;

    n = ngx_http_maskserve_fleet_nhosts;

    if (ngx_http_maskserve_fleet_fcf == NULL || n == 0) {
        return -1;
    }

    if (fp->owner.len) {
        i = ngx_http_maskserve_fleet_find(&fp->owner);
        if (i < 0 || (fp->tried[i / 64] & ((uint64_t) 1 << (i % 64)))) {
            return -1;
        }

        /* the owner, whatever its load: only it knows the request */
        st = ngx_http_maskserve_fleet_state(&ngx_http_maskserve_fleet_hosts[i]);

        return st <= NGX_HTTP_MASKSERVE_HOST_DRAINING ? i : -1;
    }

    best = -1;
    best_full = 1;
    best_score = 0;
    best_est = 0;

    /* start at a rotating host so that equal hosts take turns */
    ngx_http_maskserve_fleet_rr++;

    for (k = 0; k < n; k++) {
        i = (ngx_int_t) ((ngx_http_maskserve_fleet_rr + k) % n);
        h = &ngx_http_maskserve_fleet_hosts[i];

        if (fp->tried[i / 64] & ((uint64_t) 1 << (i % 64))) {
            continue;
        }

        st = ngx_http_maskserve_fleet_state(h);
        if (st > NGX_HTTP_MASKSERVE_HOST_FULL) {
            continue;
        }

        full = (st == NGX_HTTP_MASKSERVE_HOST_FULL);

        if (best >= 0 && full > best_full) {
            continue;                 /* free capacity first */
        }

        if (fp->key.len) {
            score = ngx_http_maskserve_fleet_score(&fp->key, &h->name);

            if (best < 0 || full < best_full || score > best_score) {
                best = i;
                best_full = full;
                best_score = score;
            }

            continue;
        }

        /* least loaded: est/capacity, compared without division */
        est = ngx_http_maskserve_fleet_est(h);

        if (best >= 0 && full == best_full) {
            b = &ngx_http_maskserve_fleet_hosts[best];

            if (est * b->capacity >= best_est * h->capacity) {
                continue;
            }
        }

        best = i;
        best_full = full;
        best_est = est;
    }

    return best;
}


/* ------------------------------------------------------------------ */
/* Requests about one request id: pinned to its host                   */

/*
 * The precontent handler of a front.  A worker process that has not read
 * the registry yet (just started, or after a reload) holds requests until
 * it has, up to NGX_HTTP_MASKSERVE_FLEET_FIRST_WAIT, rather than answer
 * "no live GPU host"; the wait is a timer on the connection's write
 * event, as ngx_http_limit_req_module delays.  Then, in
 * maskserve_fleet_owner locations, it reads the body and looks the
 * request's owner up (ngx_http_maskserve_fleet_owner_body).
 */
static ngx_int_t
ngx_http_maskserve_fleet_owner_handler(ngx_http_request_t *r)
{
    ngx_int_t                        rc;
    ngx_uint_t                       wait;
    ngx_pool_cleanup_t              *cln;
    ngx_http_maskserve_ctx_t        *ctx;
    ngx_http_core_loc_conf_t        *clcf;
    ngx_http_maskserve_fleet_req_t  *fr;
    ngx_http_maskserve_loc_conf_t   *lcf;
    ngx_http_maskserve_main_conf_t  *mcf;

    mcf = ngx_http_get_module_main_conf(r, ngx_http_maskserve_module);

    if (mcf->fleet == NULL || r != r->main) {
        return NGX_DECLINED;
    }

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_maskserve_module);
    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    /* health answers at once: it says what the process knows */
    wait = ngx_http_maskserve_fleet_scans == 0
           && ngx_http_maskserve_fleet_fcf != NULL
           && clcf->handler != ngx_http_maskserve_fleet_health_handler;

    ctx = ngx_http_get_module_ctx(r, ngx_http_maskserve_module);
    fr = ctx ? ctx->fleet : NULL;

    if (fr == NULL) {
        if (!wait && !lcf->fleet_owner) {
            return NGX_DECLINED;
        }

        ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_maskserve_ctx_t));
        fr = ngx_pcalloc(r->pool, sizeof(ngx_http_maskserve_fleet_req_t));
        cln = ngx_pool_cleanup_add(r->pool, 0);

        if (ctx == NULL || fr == NULL || cln == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        ctx->fleet = fr;
        ctx->logprobs = -1;
        fr->r = r;
        fr->status = NGX_DECLINED;
        fr->wait_start = ngx_current_msec;

        cln->handler = ngx_http_maskserve_fleet_owner_cleanup;
        cln->data = fr;

        ngx_http_set_ctx(r, ctx, ngx_http_maskserve_module);
    }

    if (wait && ngx_current_msec - fr->wait_start
                < NGX_HTTP_MASKSERVE_FLEET_FIRST_WAIT)
    {
        r->read_event_handler = ngx_http_test_reading;
        r->write_event_handler = ngx_http_maskserve_fleet_wait_handler;
        r->connection->write->delayed = 1;
        ngx_add_timer(r->connection->write,
                      NGX_HTTP_MASKSERVE_FLEET_WAIT_STEP);
        return NGX_AGAIN;
    }

    if (!lcf->fleet_owner) {
        return NGX_DECLINED;
    }

    if (fr->looking) {
        return fr->status;
    }

    fr->looking = 1;
    fr->status = NGX_DONE;

    /* as ngx_http_mirror_module: the body is read here and kept for proxy */
    rc = ngx_http_read_client_request_body(r,
                                         ngx_http_maskserve_fleet_owner_body);
    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    ngx_http_finalize_request(r, NGX_DONE);

    return NGX_DONE;
}


static void
ngx_http_maskserve_fleet_wait_handler(ngx_http_request_t *r)
{
    ngx_event_t  *wev;

    wev = r->connection->write;

    if (wev->delayed && !wev->timedout) {
        /* a write event before the timer: keep waiting */
        if (ngx_handle_write_event(wev, 0) != NGX_OK) {
            ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        }

        return;
    }

    wev->delayed = 0;
    wev->timedout = 0;

    r->read_event_handler = ngx_http_block_reading;
    r->write_event_handler = ngx_http_core_run_phases;

    /* back in the handler: waits another step, or goes on */
    ngx_http_core_run_phases(r);
}


static void
ngx_http_maskserve_fleet_owner_body(ngx_http_request_t *r)
{
    u_char                          *p, *last;
    ngx_str_t                        id;
    ngx_http_maskserve_ctx_t        *ctx;
    ngx_http_maskserve_err_t         err;
    ngx_http_maskserve_fleet_req_t  *fr;

    ctx = ngx_http_get_module_ctx(r, ngx_http_maskserve_module);
    fr = ctx->fleet;

    ngx_memzero(&err, sizeof(ngx_http_maskserve_err_t));

    if (r->method == NGX_HTTP_POST) {
        /* abort: {"request_id": "..."} */
        if (ngx_http_maskserve_parse_abort(r, &id, &err) != NGX_OK) {
            ngx_http_finalize_request(r,
                                      ngx_http_maskserve_send_error(r, &err));
            return;
        }

    } else if (r->method == NGX_HTTP_GET || r->method == NGX_HTTP_HEAD) {
        /* status: the id is the last segment of the path */
        last = r->uri.data + r->uri.len;
        for (p = last; p > r->uri.data && p[-1] != '/'; p--) { /* void */ }

        id.data = p;
        id.len = last - p;

        if (!ngx_http_maskserve_id_valid(id.data, id.len)) {
            ngx_http_maskserve_fleet_fail(r, NGX_HTTP_BAD_REQUEST,
                "request_id", (u_char *) "the path must end with a valid "
                "request id", sizeof("the path must end with a valid "
                "request id") - 1);
            return;
        }

    } else {
        ngx_http_maskserve_fleet_fail(r, NGX_HTTP_NOT_ALLOWED, NULL,
            (u_char *) "only POST (abort) and GET (status) are allowed here",
            sizeof("only POST (abort) and GET (status) are allowed here")
            - 1);
        return;
    }

    ctx->id.data = ngx_pstrdup(r->pool, &id);
    if (ctx->id.data == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    ctx->id.len = id.len;

    if (!ngx_http_maskserve_redis_connected()) {
        ngx_http_maskserve_fleet_fail(r, NGX_HTTP_SERVICE_UNAVAILABLE, NULL,
            (u_char *) "Redis is down: the host that runs the request cannot "
            "be found", sizeof("Redis is down: the host that runs the "
            "request cannot be found") - 1);
        return;
    }

    fr->handle = ngx_http_maskserve_redis_req_get(&ctx->id,
                                    ngx_http_maskserve_fleet_owner_found, fr);
    if (fr->handle == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    /* the request waits, held by its main reference, for the answer */
}


static void
ngx_http_maskserve_fleet_owner_found(void *data, ngx_int_t rc,
    ngx_http_maskserve_redis_record_t *rec)
{
    ngx_http_maskserve_fleet_req_t  *fr = data;

    u_char               *p;
    ngx_int_t             i;
    ngx_uint_t            k;
    ngx_str_t             host;
    ngx_connection_t     *c;
    ngx_http_request_t   *r;

    r = fr->r;
    c = r->connection;
    fr->handle = NULL;

    if (rc == NGX_DECLINED) {
        ngx_http_maskserve_fleet_fail(r, NGX_HTTP_NOT_FOUND, "request_id",
            (u_char *) "no request with this request_id is known",
            sizeof("no request with this request_id is known") - 1);
        return;
    }

    if (rc != NGX_OK) {
        ngx_http_maskserve_fleet_fail(r, NGX_HTTP_SERVICE_UNAVAILABLE, NULL,
            (u_char *) "Redis did not answer: the host that runs the request "
            "cannot be found", sizeof("Redis did not answer: the host that "
            "runs the request cannot be found") - 1);
        return;
    }

    ngx_str_null(&host);

    for (k = 0; k < rec->nfields; k++) {
        if (rec->fields[k].key.len == 4
            && ngx_strncmp(rec->fields[k].key.data, "host", 4) == 0)
        {
            host = rec->fields[k].value;
        }
    }

    i = host.len ? ngx_http_maskserve_fleet_find(&host) : -1;

    if (i < 0 || ngx_http_maskserve_fleet_state(
                     &ngx_http_maskserve_fleet_hosts[i])
                 > NGX_HTTP_MASKSERVE_HOST_DRAINING)
    {
        p = ngx_pnalloc(r->pool, 128 + host.len);
        if (p == NULL) {
            ngx_http_maskserve_stream_finalize(r,
                                            NGX_HTTP_INTERNAL_SERVER_ERROR);
            return;
        }

        ngx_http_maskserve_fleet_fail(r, NGX_HTTP_SERVICE_UNAVAILABLE, NULL,
            p, ngx_sprintf(p, "the host \"%V\" that runs the request is not "
                           "live", &host) - p);
        return;
    }

    fr->owner.data = ngx_pstrdup(r->pool, &host);
    if (fr->owner.data == NULL) {
        ngx_http_maskserve_stream_finalize(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    fr->owner.len = host.len;

    /* on to the content phase: proxy_pass, pinned by init_peer */
    fr->status = NGX_DECLINED;
    r->preserve_body = 1;
    r->write_event_handler = ngx_http_core_run_phases;
    ngx_http_core_run_phases(r);

    ngx_http_run_posted_requests(c);
}


static void
ngx_http_maskserve_fleet_owner_cleanup(void *data)
{
    ngx_http_maskserve_fleet_req_t  *fr = data;

    if (fr->handle != NULL) {
        ngx_http_maskserve_redis_cancel(fr->handle);
        fr->handle = NULL;
    }
}


/* answer a JSON error for a request the front holds (not proxied) */
static void
ngx_http_maskserve_fleet_fail(ngx_http_request_t *r, ngx_uint_t status,
    const char *param, u_char *msg, size_t len)
{
    ngx_http_maskserve_err_t  err;

    ngx_http_maskserve_set_error(&err, status,
                                 status >= 500 ? NGX_HTTP_MASKSERVE_SERVER
                                               : NGX_HTTP_MASKSERVE_INVALID,
                                 param, msg, len);

    ngx_http_maskserve_stream_finalize(r,
                                       ngx_http_maskserve_send_error(r, &err));
}


/* ------------------------------------------------------------------ */
/* A stream whose host went away                                        */

/*
 * When the connection to a host fails after the response started (the
 * host died, or proxy_read_timeout passed), nginx's upstream closes it
 * and sends a flush, not the last buffer, before closing the client's
 * connection without the chunked encoding's end.  For a stream of the
 * fleet upstream, this filter puts the API's error event and [DONE]
 * before that flush, as a host does when its worker dies, so that the
 * client reads why before the connection ends.
 */
static ngx_int_t
ngx_http_maskserve_fleet_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    u_char                          *p;
    size_t                           len;
    ngx_buf_t                       *b;
    ngx_chain_t                     *cl, *out;
    ngx_uint_t                       flush;
    ngx_str_t                       *peer;
    ngx_http_upstream_t             *u;
    ngx_http_maskserve_main_conf_t  *mcf;

    static ngx_str_t  sse = ngx_string("text/event-stream");
    static ngx_str_t  none = ngx_null_string;

    u = r->upstream;

    if (in == NULL || u == NULL || r != r->main || u->upstream == NULL
        || u->peer.connection != NULL || !u->header_sent)
    {
        return ngx_http_maskserve_fleet_next_body(r, in);
    }

    mcf = ngx_http_get_module_main_conf(r, ngx_http_maskserve_module);

    if (mcf->fleet == NULL || u->upstream->peer.data != mcf->fleet
        || r->headers_out.content_type.len < sse.len
        || ngx_strncasecmp(r->headers_out.content_type.data, sse.data,
                           sse.len) != 0)
    {
        return ngx_http_maskserve_fleet_next_body(r, in);
    }

    flush = 0;

    for (cl = in; cl; cl = cl->next) {
        if (cl->buf->last_buf || cl->buf->last_in_chain) {
            return ngx_http_maskserve_fleet_next_body(r, in);
        }

        flush |= cl->buf->flush;
    }

    if (!flush) {
        return ngx_http_maskserve_fleet_next_body(r, in);
    }

    peer = (u->state && u->state->peer) ? u->state->peer : NULL;

    len = sizeof("data: {\"error\":{\"message\":\"the GPU host  serving "
                 "this request went away mid-stream (connection lost or "
                 "timed out)\",\"type\":\"server_error\",\"param\":null,"
                 "\"code\":502}}\n\ndata: [DONE]\n\n")
          + (peer ? 6 * peer->len : 0);

    b = ngx_create_temp_buf(r->pool, len);
    cl = ngx_alloc_chain_link(r->pool);
    if (b == NULL || cl == NULL) {
        return NGX_ERROR;
    }

    p = ngx_cpymem(b->last, "data: {\"error\":{\"message\":\"the GPU host ",
                   sizeof("data: {\"error\":{\"message\":\"the GPU host ") - 1);

    if (peer) {
        p = ngx_http_maskserve_json_escape(p, peer->data, peer->len, 1);
        *p++ = ' ';
    }

    p = ngx_cpymem(p, "serving this request went away mid-stream (connection "
                   "lost or timed out)\",\"type\":\"server_error\","
                   "\"param\":null,\"code\":502}}\n\ndata: [DONE]\n\n",
                   sizeof("serving this request went away mid-stream "
                          "(connection lost or timed out)\",\"type\":"
                          "\"server_error\",\"param\":null,\"code\":502}}"
                          "\n\ndata: [DONE]\n\n") - 1);
    b->last = p;

    ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                  "maskserve fleet: the host%s%V went away mid-stream, "
                  "error event sent", peer ? " " : "", peer ? peer : &none);

    cl->buf = b;
    cl->next = in;
    out = cl;

    return ngx_http_maskserve_fleet_next_body(r, out);
}


/* ------------------------------------------------------------------ */
/* /health of a front                                                   */

ngx_int_t
ngx_http_maskserve_fleet_health_handler(ngx_http_request_t *r)
{
    u_char                           *p;
    ngx_int_t                         rc;
    ngx_buf_t                        *b;
    ngx_uint_t                        i, up, live, seen;
    ngx_msec_t                        age, skip;
    const char                       *redis;
    ngx_http_maskserve_err_t          err;
    ngx_http_maskserve_fleet_host_t  *h;
    ngx_http_maskserve_host_state_e   st;

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    if (r->method != NGX_HTTP_GET && r->method != NGX_HTTP_HEAD) {
        ngx_http_maskserve_error(&err, NGX_HTTP_NOT_ALLOWED,
                                 NGX_HTTP_MASKSERVE_INVALID, NULL,
                                 "only GET is allowed here");
        return ngx_http_maskserve_send_error(r, &err);
    }

    if (ngx_http_maskserve_fleet_fcf == NULL) {
        ngx_http_maskserve_error(&err, NGX_HTTP_INTERNAL_SERVER_ERROR,
                                 NGX_HTTP_MASKSERVE_SERVER, NULL,
                                 "no \"maskserve_fleet\" upstream is "
                                 "configured");
        return ngx_http_maskserve_send_error(r, &err);
    }

    b = ngx_create_temp_buf(r->pool,
                            256 + ngx_http_maskserve_fleet_nhosts
                                  * (2 * 6 * NGX_HTTP_MASKSERVE_FLEET_NAME_MAX
                                     + 512));
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    redis = ngx_http_maskserve_redis_connected() ? "up" : "down";

    p = b->last;
    p = ngx_sprintf(p, "{\"role\":\"front\",\"nginx_pid\":%P,\"redis\":\"%s\","
                    "\"registry_scans\":%ui,\"hosts\":[", ngx_pid, redis,
                    ngx_http_maskserve_fleet_scans);

    up = 0;
    live = 0;
    seen = 0;

    for (i = 0; i < ngx_http_maskserve_fleet_nhosts; i++) {
        h = &ngx_http_maskserve_fleet_hosts[i];
        st = ngx_http_maskserve_fleet_state(h);

        up += (st == NGX_HTTP_MASKSERVE_HOST_UP);
        live += (st <= NGX_HTTP_MASKSERVE_HOST_FULL);
        seen += h->seen;

        age = ngx_current_msec - h->beat_at;
        skip = (ngx_msec_int_t) (h->skip_until - ngx_current_msec) > 0
               ? h->skip_until - ngx_current_msec : 0;

        if (i) {
            *p++ = ',';
        }

        p = ngx_cpymem(p, "{\"host\":", 8);
        p = ngx_http_maskserve_fleet_json_str(p, &h->name);
        p = ngx_cpymem(p, ",\"address\":", 11);
        p = ngx_http_maskserve_fleet_json_str(p, &h->addr);
        p = ngx_sprintf(p, ",\"state\":\"%s\",\"regions\":%ui,"
                        "\"ready_regions\":%ui,\"draining_regions\":%ui,"
                        "\"capacity\":%ui,\"load\":%ui,"
                        "\"inflight\":%ui,\"requests\":%ui,"
                        "\"heartbeat_age_ms\":%M,\"fails\":%ui,"
                        "\"skip_ms\":%M}",
                        ngx_http_maskserve_host_states[st], h->regions,
                        h->ready, h->draining, h->capacity, h->load,
                        h->inflight,
                        h->requests, h->seen ? age : 0, h->fails, skip);
    }

    p = ngx_sprintf(p, "],\"hosts_up\":%ui,\"hosts_live\":%ui,"
                    "\"status\":\"%s\"}\n", up, live,
                    live == 0 ? "unavailable"
                    : (live < seen || redis[0] == 'd') ? "degraded" : "ok");

    b->last = p;

    return ngx_http_maskserve_send_json(r, live ? NGX_HTTP_OK
                                        : NGX_HTTP_SERVICE_UNAVAILABLE, b);
}


/* s as a JSON string */
static u_char *
ngx_http_maskserve_fleet_json_str(u_char *p, ngx_str_t *s)
{
    *p++ = '"';
    p = ngx_http_maskserve_json_escape(p, s->data, s->len, 1);
    *p++ = '"';

    return p;
}
