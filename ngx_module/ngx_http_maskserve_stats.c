/*
 * ngx_http_maskserve_stats.c: nginx's own counters, in a shared zone of
 * nginx's (only nginx processes use it; the maskserve worker never maps
 * it), one slot per worker process, so that GET /metrics answers the same
 * totals whichever process serves it.
 *
 * A process adds to its slot (ngx_worker modulo the slots) with atomic
 * additions, once per pass over the ring rather than per row: two
 * processes that share a slot (an old one still finishing its requests
 * after a reload, and its successor) both count.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_maskserve_module.h"
#include "ngx_http_maskserve_output.h"
#include "ngx_http_maskserve_stats.h"


#define NGX_HTTP_MASKSERVE_STATS_SLOTS  64


typedef struct {
    ngx_atomic_t                   rows;
    ngx_atomic_t                   ids;
    ngx_atomic_t                   floats;
    ngx_atomic_t                   bytes;
    ngx_atomic_t                   ids_ns;
    ngx_atomic_t                   floats_ns;
} ngx_http_maskserve_stats_fmt_t;


/* a slot: both formats, on cache lines of its own */
typedef struct {
    ngx_http_maskserve_stats_fmt_t  fmt[NGX_HTTP_MASKSERVE_FMT_N];
    u_char                          pad[128 - NGX_HTTP_MASKSERVE_FMT_N
                                        * sizeof(ngx_http_maskserve_stats_fmt_t)];
} ngx_http_maskserve_stats_slot_t;


static ngx_int_t ngx_http_maskserve_stats_init_zone(ngx_shm_zone_t *zone,
    void *data);


/* this process's slot, from init_process on */
static ngx_http_maskserve_stats_slot_t  *ngx_http_maskserve_stats_mine;


ngx_int_t
ngx_http_maskserve_stats_conf(ngx_conf_t *cf,
    ngx_http_maskserve_main_conf_t *mcf)
{
    ngx_str_t        name = ngx_string("maskserve_stats");
    ngx_shm_zone_t  *zone;

    zone = ngx_shared_memory_add(cf, &name, 16 * ngx_pagesize,
                                 &ngx_http_maskserve_module);
    if (zone == NULL) {
        return NGX_ERROR;
    }

    zone->init = ngx_http_maskserve_stats_init_zone;
    mcf->stats = zone;

    return NGX_OK;
}


static ngx_int_t
ngx_http_maskserve_stats_init_zone(ngx_shm_zone_t *zone, void *data)
{
    ngx_slab_pool_t  *shpool;

    if (data) {
        /* a reload: the previous cycle's slots go on counting */
        zone->data = data;
        return NGX_OK;
    }

    shpool = (ngx_slab_pool_t *) zone->shm.addr;

    zone->data = ngx_slab_calloc(shpool, NGX_HTTP_MASKSERVE_STATS_SLOTS
                                 * sizeof(ngx_http_maskserve_stats_slot_t));
    if (zone->data == NULL) {
        return NGX_ERROR;
    }

    return NGX_OK;
}


void
ngx_http_maskserve_stats_init_process(ngx_http_maskserve_main_conf_t *mcf)
{
    ngx_http_maskserve_stats_slot_t  *slots;

    /* what an earlier cycle of this process left is not ours */
    (void) ngx_http_maskserve_output_take(NULL);

    if (mcf->stats == NULL || mcf->stats->data == NULL) {
        ngx_http_maskserve_stats_mine = NULL;
        return;
    }

    slots = mcf->stats->data;
    ngx_http_maskserve_stats_mine =
        &slots[ngx_worker % NGX_HTTP_MASKSERVE_STATS_SLOTS];
}


void
ngx_http_maskserve_stats_exit_process(void)
{
    ngx_http_maskserve_stats_publish();
    ngx_http_maskserve_stats_mine = NULL;
}


void
ngx_http_maskserve_stats_publish(void)
{
    ngx_uint_t                       f;
    ngx_http_maskserve_fmt_count_t   c[NGX_HTTP_MASKSERVE_FMT_N];
    ngx_http_maskserve_stats_fmt_t  *s;

    if (!ngx_http_maskserve_output_take(c)
        || ngx_http_maskserve_stats_mine == NULL)
    {
        return;
    }

    for (f = 0; f < NGX_HTTP_MASKSERVE_FMT_N; f++) {
        if (c[f].rows == 0) {
            continue;
        }

        s = &ngx_http_maskserve_stats_mine->fmt[f];

        (void) ngx_atomic_fetch_add(&s->rows, c[f].rows);
        (void) ngx_atomic_fetch_add(&s->ids, c[f].ids);
        (void) ngx_atomic_fetch_add(&s->floats, c[f].floats);
        (void) ngx_atomic_fetch_add(&s->bytes, c[f].bytes);
        (void) ngx_atomic_fetch_add(&s->ids_ns, c[f].ids_ns);
        (void) ngx_atomic_fetch_add(&s->floats_ns, c[f].floats_ns);
    }
}


u_char *
ngx_http_maskserve_stats_metrics(ngx_http_maskserve_main_conf_t *mcf,
    u_char *p)
{
    ngx_uint_t                        i, f, k;
    ngx_atomic_uint_t                 v[NGX_HTTP_MASKSERVE_FMT_N][6];
    ngx_http_maskserve_stats_slot_t  *slots;

    static const char  *format[NGX_HTTP_MASKSERVE_FMT_N] = { "json",
                                                             "packed" };
    static const char  *family[5][2] = {
        { "maskserve_format_rows_total",
          "mask rows nginx formatted, by mask_format" },
        { "maskserve_format_ids_total",
          "mask ids nginx formatted (sampling_mask entries)" },
        { "maskserve_format_floats_total",
          "mask float32 logprobs nginx formatted" },
        { "maskserve_format_bytes_total",
          "bytes of mask text written: JSON arrays, or base64 characters" },
        { "maskserve_format_seconds_total",
          "time nginx spent formatting those masks, by array (ids: with "
          "the packed row lengths; logprobs)" }
    };

    if (mcf->stats == NULL || mcf->stats->data == NULL) {
        return p;
    }

    slots = mcf->stats->data;
    ngx_memzero(v, sizeof(v));

    for (i = 0; i < NGX_HTTP_MASKSERVE_STATS_SLOTS; i++) {
        for (f = 0; f < NGX_HTTP_MASKSERVE_FMT_N; f++) {
            v[f][0] += slots[i].fmt[f].rows;
            v[f][1] += slots[i].fmt[f].ids;
            v[f][2] += slots[i].fmt[f].floats;
            v[f][3] += slots[i].fmt[f].bytes;
            v[f][4] += slots[i].fmt[f].ids_ns;
            v[f][5] += slots[i].fmt[f].floats_ns;
        }
    }

    for (k = 0; k < 5; k++) {
        p = ngx_sprintf(p, "# HELP %s %s\n# TYPE %s counter\n",
                        family[k][0], family[k][1], family[k][0]);

        for (f = 0; f < NGX_HTTP_MASKSERVE_FMT_N; f++) {
            if (k < 4) {
                p = ngx_sprintf(p, "%s{format=\"%s\"} %uA\n", family[k][0],
                                format[f], v[f][k]);
                continue;
            }

            p = ngx_sprintf(p, "%s{format=\"%s\",array=\"ids\"} %.9f\n"
                            "%s{format=\"%s\",array=\"logprobs\"} %.9f\n",
                            family[k][0], format[f], (double) v[f][4] / 1e9,
                            family[k][0], format[f], (double) v[f][5] / 1e9);
        }
    }

    return p;
}
