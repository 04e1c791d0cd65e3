/*
 * ngx_http_maskserve_module.h: the types shared by the module's files:
 * configuration, the per-process state of each worker region, and the
 * per-request context.
 *
 * A location names the worker regions it uses (maskserve_worker).  Every
 * nginx worker process attaches to each region once (see
 * ngx_http_maskserve_attach.c), reads every row the maskserve worker
 * publishes and hands the rows of its own requests to their contexts,
 * which format them straight into output buffers.
 */

#ifndef NGX_HTTP_MASKSERVE_MODULE_H
#define NGX_HTTP_MASKSERVE_MODULE_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "msv_shm.h"
#include "msv_link.h"
#include "msv_b64.h"
#include "ngx_http_maskserve_redis.h"


#define NGX_HTTP_MASKSERVE_FLUSH_STEP      0
#define NGX_HTTP_MASKSERVE_FLUSH_INTERVAL  1

/* the watchdog period of an in-flight request */
#define NGX_HTTP_MASKSERVE_WATCHDOG        1000

/*
 * Output buffers are allocated this large: small for JSON streams, which
 * send one event at a time, larger for whole non-streaming bodies and for
 * packed streams (a 1000-id row is 5.3 KB of base64 per array: one
 * buffer per array and event).
 */
#define NGX_HTTP_MASKSERVE_STREAM_BUF      4096
#define NGX_HTTP_MASKSERVE_BODY_BUF        16384

/*
 * Buffers of BODY_BUF bytes a worker process keeps for its next requests
 * when a request ends (32 MB): a body's memory is then not faulted in
 * again page by page for every response.
 */
#define NGX_HTTP_MASKSERVE_BLOCK_CACHE     2048


typedef struct ngx_http_maskserve_region_s  ngx_http_maskserve_region_t;
typedef struct ngx_http_maskserve_ctx_s     ngx_http_maskserve_ctx_t;


/* An error answer: HTTP status, OpenAI-style type, message, field. */
typedef struct {
    ngx_uint_t                     status;
    const char                    *type;     /* "invalid_request_error" */
    ngx_str_t                      message;
    const char                    *param;    /* NULL: no field */
} ngx_http_maskserve_err_t;


/* One slot of a region as this process sees it. */
typedef struct {
    ngx_http_maskserve_ctx_t      *ctx;      /* NULL: orphan, request gone */
    ngx_uint_t                     choice;   /* the choice of ctx it runs */
    uint64_t                       cookie;
    unsigned                       used:1;
} ngx_http_maskserve_slot_t;


struct ngx_http_maskserve_region_s {
    ngx_str_t                      name;     /* NUL-terminated */
    ngx_uint_t                     index;    /* in the main conf array */

    /* per process, from init_process on */
    struct msv_attachment          att;
    ngx_connection_t              *wake;     /* att.wake_fd in the loop */
    ngx_connection_t              *conn;     /* att.conn_fd in the loop */
    ngx_event_t                    retry;    /* re-attach timer */
    ngx_http_maskserve_slot_t     *slots;    /* ctrl->n_slots entries */
    ngx_uint_t                     n_slots;
    ngx_uint_t                     inflight; /* slots held, orphans too */
    ngx_queue_t                    dirty;    /* contexts to flush */
    ngx_log_t                     *log;
    ngx_uint_t                     fails;    /* attach failures in a row */
    ngx_msec_t                     detached_at;
    uint64_t                       generation;
    u_char                         err[256]; /* why it is detached */
    unsigned                       attached:1;
    unsigned                       attaching:1; /* hello sent, no welcome */
    unsigned                       consuming:1;
    unsigned                       draining:1;  /* written as draining */
    unsigned                       drained:1;   /* its worker stopped after
                                                   a drain: out of the
                                                   registry until the next
                                                   attach */
};


typedef struct {
    ngx_array_t                    regions;  /* ngx_http_maskserve_region_t */

    ngx_http_maskserve_redis_conf_t  redis;
    ngx_flag_t                     redis_on;
    ngx_flag_t                     used;     /* a handler is configured */
    ngx_msec_t                     stall_timeout; /* no heartbeat: lost */
    void                          *fleet;    /* a front: maskserve_fleet */
    ngx_shm_zone_t                *stats;    /* nginx's own counters */

    /* per process */
    ngx_event_t                    tick;     /* heartbeat and registry */
    ngx_msec_t                     registry_at;
    ngx_uint_t                     id_seq;   /* generated request ids */
    ngx_log_t                     *log;
    unsigned                       running:1;
} ngx_http_maskserve_main_conf_t;


typedef struct {
    ngx_array_t                   *regions;  /* ngx_uint_t; NULL: all */
    ngx_uint_t                     max_prompt;    /* 0: the model's */
    ngx_uint_t                     max_support;   /* 0: no cap */
    ngx_int_t                      max_n;         /* choices a request */
    ngx_uint_t                     flush;
    ngx_msec_t                     flush_interval;
    size_t                         output_limit;
    ngx_flag_t                     fleet_owner;   /* front: pin to owner */
    ngx_str_t                      fleet_control; /* front: fan-out via */
    ngx_flag_t                     fleet_control_draining; /* ... to
                                                   draining hosts too */
} ngx_http_maskserve_loc_conf_t;


/* A growing piece of output: a chain of buffers written number by number. */
typedef struct {
    ngx_chain_t                   *first;
    ngx_chain_t                  **last;     /* &tail->next */
    ngx_buf_t                     *buf;      /* the one being written */
    size_t                         bytes;
    ngx_uint_t                     count;    /* elements, for commas */
    msv_b64_t                      b64;      /* packed: the open group */
    uint32_t                       rest;     /* held by a stream event:
                                                where in buf the next rows
                                                go; 0: not held; RENEW:
                                                a new buffer once it is
                                                sent */
} ngx_http_maskserve_sec_t;

#define NGX_HTTP_MASKSERVE_RENEW  ((uint32_t) -1)


/*
 * The output of one choice, in sections.  JSON: ids, mask, mlps and lpc
 * hold the token_ids, sampling_mask, sampling_mask_logprobs and
 * logprobs.content arrays.  Packed: ids stays JSON, the others hold base64
 * strings (mask: the ids, mlps: the mask logprobs, lpc: the sampled
 * tokens' logprobs) and mlen, tlen, tids, tlps the row lengths and the top
 * entries' lengths, ids and logprobs.
 */
typedef struct {
    /*
     * What every row touches first, up to and with the sections a row
     * writes (ids, mask, mlps, mlen), in the order of the sections:
     * ngx_http_maskserve_route_hint prefetches this part only.
     */
    unsigned                       admitted:1;    /* holds its slot */
    unsigned                       done:1;        /* its last row came */
    unsigned                       reported:1;    /* finish_reason sent */
    unsigned                       seed_known:1;
    unsigned                       started:1;     /* first row seen */
    ngx_uint_t                     index;
    ngx_uint_t                     completion_tokens;
    ngx_http_maskserve_sec_t       ids;
    ngx_http_maskserve_sec_t       mask;
    ngx_http_maskserve_sec_t       mlps;
    ngx_http_maskserve_sec_t       mlen;
    ngx_http_maskserve_sec_t       lpc;
    ngx_http_maskserve_sec_t       tlen;
    ngx_http_maskserve_sec_t       tids;
    ngx_http_maskserve_sec_t       tlps;

    /* the slot that runs the choice (one slot per choice) */
    ngx_uint_t                     slot;
    uint64_t                       cookie;
    uint64_t                       seed;
    ngx_uint_t                     finish;        /* enum msv_finish */
    ngx_uint_t                     abort_reason;  /* enum msv_abort */

    /* the version of the weights it ran on, set at its end; kept
     * through an update, the tokens from weight_pos to weight_end came
     * from weight_next */
    u_char                         weight_version[MSV_VERSION_MAX + 1];
    u_char                         weight_next[MSV_VERSION_MAX + 1];
    ngx_uint_t                     weight_pos;
    ngx_uint_t                     weight_end;
    unsigned                       weight_spans:1;
} ngx_http_maskserve_choice_t;


struct ngx_http_maskserve_ctx_s {
    /*
     * What every row touches, through the output's free lists:
     * ngx_http_maskserve_route_hint prefetches this part only (up to
     * free_big).
     */
    unsigned                       stream:1;
    unsigned                       packed:1;      /* mask_format "packed" */
    unsigned                       admitted:1;    /* holds slots */
    unsigned                       done:1;        /* no more rows */
    unsigned                       finished:1;    /* final output sent */
    unsigned                       header_sent:1;
    unsigned                       seed_known:1;
    unsigned                       started:1;     /* first row seen */
    unsigned                       dirty:1;       /* in region->dirty */
    unsigned                       cancelled:1;
    unsigned                       aborting:1;    /* every slot cancelled */
    unsigned                       carry:1;       /* sections held by the
                                                     event being sent */
    ngx_http_maskserve_loc_conf_t *lcf;
    ngx_uint_t                     mode;          /* enum msv_mask_mode */
    ngx_int_t                      logprobs;      /* -1: none */
    ngx_uint_t                     completion_tokens;
    ngx_uint_t                     mask_entries;

    /* output, formatted as rows arrive */
    ngx_http_maskserve_choice_t   *choices;
    ngx_uint_t                     n_choices;     /* sampling_params.n */
    size_t                         buf_size;      /* of section buffers */
    size_t                         pending;       /* bytes in the sections */
    size_t                         in_flight;     /* bytes handed to nginx */
    ngx_chain_t                   *busy;
    ngx_chain_t                   *free;          /* sent, any size */
    ngx_chain_t                   *free_small;    /* free, by size */
    ngx_chain_t                   *free_big;
    ngx_array_t                    blocks;        /* of BODY_BUF, u_char *,
                                                     back to the process's
                                                     cache at the end */
    ngx_chain_t                   *free_bare;     /* sent, their memory
                                                     taken on by a later
                                                     buffer: the ngx_buf_t
                                                     and link only */
    ngx_uint_t                     events;        /* stream events sent */

    ngx_http_request_t            *r;        /* NULL once the request is gone */
    ngx_http_maskserve_region_t   *region;
    ngx_uint_t                     slot;     /* choice 0's: the record's */
    uint64_t                       cookie;
    ngx_str_t                      id;

    uint64_t                       seed;
    ngx_uint_t                     prompt_tokens;
    ngx_uint_t                     finish;        /* enum msv_finish */
    ngx_uint_t                     abort_reason;  /* enum msv_abort */
    ngx_uint_t                     live;          /* choices not done */

    ngx_http_maskserve_err_t       err;           /* err.status 0: none */

    ngx_event_t                    timer;         /* flush and watchdog */
    ngx_queue_t                    queue;         /* in region->dirty */
    void                          *redis_get;     /* pending lookup */
    void                          *fleet;         /* front: owner lookup */
    void                          *fanout;        /* front: control fan-out */
};


extern ngx_module_t  ngx_http_maskserve_module;


/* The process's main conf once init_process ran, else NULL. */
ngx_http_maskserve_main_conf_t *ngx_http_maskserve_process_conf(void);


#endif /* NGX_HTTP_MASKSERVE_MODULE_H */
