/*
 * ngx_http_maskserve_module.c: directives, configuration, the module's
 * per-process life cycle, log variables and JSON error answers.
 *
 * The handlers live in ngx_http_maskserve_generate.c (generation) and
 * ngx_http_maskserve_admin.c (abort, request status, health); the worker
 * regions in ngx_http_maskserve_link.c.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "msv_region.h"
#include "ngx_http_maskserve_module.h"
#include "ngx_http_maskserve_attach.h"
#include "ngx_http_maskserve_util.h"
#include "ngx_http_maskserve_generate.h"
#include "ngx_http_maskserve_admin.h"
#include "ngx_http_maskserve_control.h"
#include "ngx_http_maskserve_redis.h"
#include "ngx_http_maskserve_fleet.h"
#include "ngx_http_maskserve_fleet_control.h"
#include "ngx_http_maskserve_stats.h"


static ngx_int_t ngx_http_maskserve_add_variables(ngx_conf_t *cf);
static void *ngx_http_maskserve_create_main_conf(ngx_conf_t *cf);
static char *ngx_http_maskserve_init_main_conf(ngx_conf_t *cf, void *conf);
static void *ngx_http_maskserve_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_maskserve_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);
static ngx_int_t ngx_http_maskserve_init_process(ngx_cycle_t *cycle);
static void ngx_http_maskserve_exit_process(ngx_cycle_t *cycle);

static char *ngx_http_maskserve_conf_worker(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_maskserve_conf_handler_set(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_maskserve_conf_fleet_handler(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_maskserve_conf_max_support(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_maskserve_conf_stream_flush(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_maskserve_conf_redis(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);

static ngx_int_t ngx_http_maskserve_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);


#define NGX_HTTP_MASKSERVE_VAR_ID          0
#define NGX_HTTP_MASKSERVE_VAR_PROMPT      1
#define NGX_HTTP_MASKSERVE_VAR_COMPLETION  2
#define NGX_HTTP_MASKSERVE_VAR_MASK        3
#define NGX_HTTP_MASKSERVE_VAR_FINISH      4


static ngx_conf_num_bounds_t  ngx_http_maskserve_db_bounds = {
    ngx_conf_check_num_bounds, 0, 65535
};


static ngx_command_t  ngx_http_maskserve_commands[] = {

    { ngx_string("maskserve_worker"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_maskserve_conf_worker,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("maskserve_generate"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_maskserve_conf_handler_set,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      (void *) ngx_http_maskserve_generate_handler },

    { ngx_string("maskserve_abort"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_maskserve_conf_handler_set,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      (void *) ngx_http_maskserve_abort_handler },

    { ngx_string("maskserve_request_status"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_maskserve_conf_handler_set,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      (void *) ngx_http_maskserve_status_handler },

    { ngx_string("maskserve_health"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_maskserve_conf_handler_set,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      (void *) ngx_http_maskserve_health_handler },

    { ngx_string("maskserve_pause"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_maskserve_conf_handler_set,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      (void *) ngx_http_maskserve_pause_handler },

    { ngx_string("maskserve_resume"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_maskserve_conf_handler_set,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      (void *) ngx_http_maskserve_resume_handler },

    { ngx_string("maskserve_abort_requests"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_maskserve_conf_handler_set,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      (void *) ngx_http_maskserve_abort_requests_handler },

    { ngx_string("maskserve_update_weights"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_maskserve_conf_handler_set,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      (void *) ngx_http_maskserve_update_weights_handler },

    { ngx_string("maskserve_flush_cache"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_maskserve_conf_handler_set,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      (void *) ngx_http_maskserve_flush_cache_handler },

    { ngx_string("maskserve_models"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_maskserve_conf_handler_set,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      (void *) ngx_http_maskserve_models_handler },

    { ngx_string("maskserve_metrics"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_maskserve_conf_handler_set,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      (void *) ngx_http_maskserve_metrics_handler },

    { ngx_string("maskserve_max_prompt_tokens"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_maskserve_loc_conf_t, max_prompt),
      NULL },

    { ngx_string("maskserve_worker_stall_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_maskserve_main_conf_t, stall_timeout),
      NULL },

    { ngx_string("maskserve_max_n"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_maskserve_loc_conf_t, max_n),
      NULL },

    { ngx_string("maskserve_max_support"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_maskserve_conf_max_support,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("maskserve_stream_flush"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE12,
      ngx_http_maskserve_conf_stream_flush,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("maskserve_output_limit"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_maskserve_loc_conf_t, output_limit),
      NULL },

    { ngx_string("maskserve_redis"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_http_maskserve_conf_redis,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("maskserve_redis_password"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_maskserve_main_conf_t, redis.password),
      NULL },

    { ngx_string("maskserve_redis_db"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_maskserve_main_conf_t, redis.db),
      &ngx_http_maskserve_db_bounds },

    { ngx_string("maskserve_redis_prefix"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_maskserve_main_conf_t, redis.prefix),
      NULL },

    { ngx_string("maskserve_redis_ttl"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_maskserve_main_conf_t, redis.req_ttl),
      NULL },

    { ngx_string("maskserve_hostname"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_maskserve_main_conf_t, redis.hostname),
      NULL },

    { ngx_string("maskserve_fleet_address"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_maskserve_main_conf_t, redis.address),
      NULL },

    { ngx_string("maskserve_fleet"),
      NGX_HTTP_UPS_CONF|NGX_CONF_ANY,
      ngx_http_maskserve_fleet_conf,
      NGX_HTTP_SRV_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("maskserve_fleet_owner"),
      NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_maskserve_loc_conf_t, fleet_owner),
      NULL },

    { ngx_string("maskserve_fleet_health"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_maskserve_conf_fleet_handler,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      (void *) ngx_http_maskserve_fleet_health_handler },

    { ngx_string("maskserve_fleet_control"),
      NGX_HTTP_LOC_CONF|NGX_CONF_TAKE12,
      ngx_http_maskserve_fleet_control_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_maskserve_module_ctx = {
    ngx_http_maskserve_add_variables,      /* preconfiguration */
    ngx_http_maskserve_fleet_postconf,     /* postconfiguration */

    ngx_http_maskserve_create_main_conf,   /* create main configuration */
    ngx_http_maskserve_init_main_conf,     /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_maskserve_create_loc_conf,    /* create location configuration */
    ngx_http_maskserve_merge_loc_conf      /* merge location configuration */
};


ngx_module_t  ngx_http_maskserve_module = {
    NGX_MODULE_V1,
    &ngx_http_maskserve_module_ctx,        /* module context */
    ngx_http_maskserve_commands,           /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    ngx_http_maskserve_init_process,       /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_maskserve_exit_process,       /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


static ngx_http_variable_t  ngx_http_maskserve_vars[] = {

    { ngx_string("maskserve_request_id"), NULL,
      ngx_http_maskserve_variable, NGX_HTTP_MASKSERVE_VAR_ID,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("maskserve_prompt_tokens"), NULL,
      ngx_http_maskserve_variable, NGX_HTTP_MASKSERVE_VAR_PROMPT,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("maskserve_completion_tokens"), NULL,
      ngx_http_maskserve_variable, NGX_HTTP_MASKSERVE_VAR_COMPLETION,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("maskserve_mask_entries"), NULL,
      ngx_http_maskserve_variable, NGX_HTTP_MASKSERVE_VAR_MASK,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("maskserve_finish_reason"), NULL,
      ngx_http_maskserve_variable, NGX_HTTP_MASKSERVE_VAR_FINISH,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("maskserve_fleet_host"), NULL,
      ngx_http_maskserve_fleet_control_variable, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

      ngx_http_null_variable
};


/* the main conf of this process's cycle, set in init_process */
static ngx_http_maskserve_main_conf_t  *ngx_http_maskserve_process_mcf;


static void *
ngx_http_maskserve_create_main_conf(ngx_conf_t *cf)
{
    ngx_http_maskserve_main_conf_t  *mcf;

    mcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_maskserve_main_conf_t));
    if (mcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     mcf->redis.host = { 0, NULL };
     *     mcf->redis.password = { 0, NULL };
     *     mcf->redis.prefix = { 0, NULL };
     *     mcf->redis.hostname = { 0, NULL };
     *     mcf->used = 0;
     */

    if (ngx_array_init(&mcf->regions, cf->pool, 4,
                       sizeof(ngx_http_maskserve_region_t))
        != NGX_OK)
    {
        return NULL;
    }

    mcf->redis.port = NGX_CONF_UNSET;
    mcf->redis.db = NGX_CONF_UNSET;
    mcf->redis.req_ttl = NGX_CONF_UNSET_MSEC;
    mcf->redis_on = NGX_CONF_UNSET;
    mcf->stall_timeout = NGX_CONF_UNSET_MSEC;

    return mcf;
}


static char *
ngx_http_maskserve_init_main_conf(ngx_conf_t *cf, void *conf)
{
    ngx_http_maskserve_main_conf_t  *mcf = conf;

    ngx_conf_init_value(mcf->redis_on, 0);
    ngx_conf_init_msec_value(mcf->stall_timeout,
                             MSV_HEARTBEAT_STALE_NS / 1000000);

    if (mcf->stall_timeout < 1000) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"maskserve_worker_stall_timeout\" must be at "
                           "least 1s: the worker beats every 100ms and a "
                           "heartbeat is late after %uLms",
                           (uint64_t) (MSV_HEARTBEAT_LATE_NS / 1000000));
        return NGX_CONF_ERROR;
    }
    ngx_conf_init_value(mcf->redis.port, 6379);
    ngx_conf_init_value(mcf->redis.db, 0);
    ngx_conf_init_msec_value(mcf->redis.req_ttl, 3600 * 1000);

    if (mcf->redis.prefix.len == 0) {
        ngx_str_set(&mcf->redis.prefix, "msv");
    }

    if (mcf->redis_on
        && ngx_http_maskserve_redis_resolve(cf, &mcf->redis) != NGX_CONF_OK)
    {
        return NGX_CONF_ERROR;
    }

    if (ngx_http_maskserve_fleet_check(cf, mcf) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    if (mcf->used && mcf->regions.nelts == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "maskserve handlers are configured but no "
                           "\"maskserve_worker\" names a worker region");
        return NGX_CONF_ERROR;
    }

    if (mcf->used && ngx_http_maskserve_stats_conf(cf, mcf) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


static void *
ngx_http_maskserve_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_maskserve_loc_conf_t  *lcf;

    lcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_maskserve_loc_conf_t));
    if (lcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     lcf->regions = NULL;
     */

    lcf->max_prompt = NGX_CONF_UNSET_UINT;
    lcf->max_support = NGX_CONF_UNSET_UINT;
    lcf->max_n = NGX_CONF_UNSET;
    lcf->flush = NGX_CONF_UNSET_UINT;
    lcf->flush_interval = NGX_CONF_UNSET_MSEC;
    lcf->output_limit = NGX_CONF_UNSET_SIZE;
    lcf->fleet_owner = NGX_CONF_UNSET;

    return lcf;
}


static char *
ngx_http_maskserve_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_maskserve_loc_conf_t  *prev = parent;
    ngx_http_maskserve_loc_conf_t  *conf = child;

    if (conf->regions == NULL) {
        conf->regions = prev->regions;
    }

    ngx_conf_merge_uint_value(conf->max_prompt, prev->max_prompt, 0);
    ngx_conf_merge_uint_value(conf->max_support, prev->max_support, 0);
    ngx_conf_merge_uint_value(conf->flush, prev->flush,
                              NGX_HTTP_MASKSERVE_FLUSH_STEP);
    ngx_conf_merge_msec_value(conf->flush_interval, prev->flush_interval,
                              0);
    ngx_conf_merge_size_value(conf->output_limit, prev->output_limit,
                              64 * 1024 * 1024);

    ngx_conf_merge_value(conf->max_n, prev->max_n, 64);

    if (conf->max_n < 1 || conf->max_n > MSV_MAX_N) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"maskserve_max_n\" must be in [1, %d]",
                           MSV_MAX_N);
        return NGX_CONF_ERROR;
    }

    ngx_conf_merge_value(conf->fleet_owner, prev->fleet_owner, 0);

    if (conf->output_limit < 4096) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"maskserve_output_limit\" must be at least 4k");
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


static char *
ngx_http_maskserve_conf_worker(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_maskserve_loc_conf_t  *lcf = conf;

    ngx_str_t                       *value;
    ngx_uint_t                       i, k, *idx;
    ngx_http_maskserve_region_t     *rg;
    ngx_http_maskserve_main_conf_t  *mcf;

    value = cf->args->elts;

    if (value[1].len == 0 || value[1].len > MSV_NAME_MAX
        || !msv_name_valid((char *) value[1].data))
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid worker region name \"%V\": 1 to %d of "
                           "[A-Za-z0-9._-]", &value[1], MSV_NAME_MAX);
        return NGX_CONF_ERROR;
    }

    mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_maskserve_module);

    rg = mcf->regions.elts;
    for (i = 0; i < mcf->regions.nelts; i++) {
        if (rg[i].name.len == value[1].len
            && ngx_strncmp(rg[i].name.data, value[1].data, value[1].len) == 0)
        {
            break;
        }
    }

    if (i == mcf->regions.nelts) {
        rg = ngx_array_push(&mcf->regions);
        if (rg == NULL) {
            return NGX_CONF_ERROR;
        }

        ngx_memzero(rg, sizeof(ngx_http_maskserve_region_t));
        rg->name = value[1];    /* NUL-terminated by the parser */
        rg->index = i;
    }

    if (lcf->regions == NULL) {
        lcf->regions = ngx_array_create(cf->pool, 2, sizeof(ngx_uint_t));
        if (lcf->regions == NULL) {
            return NGX_CONF_ERROR;
        }

    } else {
        idx = lcf->regions->elts;
        for (k = 0; k < lcf->regions->nelts; k++) {
            if (idx[k] == i) {
                return "names this region twice";
            }
        }
    }

    idx = ngx_array_push(lcf->regions);
    if (idx == NULL) {
        return NGX_CONF_ERROR;
    }

    *idx = i;

    return NGX_CONF_OK;
}


static char *
ngx_http_maskserve_conf_handler_set(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_core_loc_conf_t        *clcf;
    ngx_http_maskserve_main_conf_t  *mcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    if (clcf->handler != NULL) {
        return "is duplicate: the location already has a content handler";
    }

    clcf->handler = (ngx_http_handler_pt) cmd->post;

    mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_maskserve_module);
    mcf->used = 1;

    return NGX_CONF_OK;
}


/* a front's handler: unlike the others it needs no worker region */
static char *
ngx_http_maskserve_conf_fleet_handler(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    if (clcf->handler != NULL) {
        return "is duplicate: the location already has a content handler";
    }

    clcf->handler = (ngx_http_handler_pt) cmd->post;

    return NGX_CONF_OK;
}


static char *
ngx_http_maskserve_conf_max_support(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_maskserve_loc_conf_t  *lcf = conf;

    ngx_int_t   n;
    ngx_str_t  *value;

    if (lcf->max_support != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "off") == 0) {
        lcf->max_support = 0;
        return NGX_CONF_OK;
    }

    n = ngx_atoi(value[1].data, value[1].len);
    if (n == NGX_ERROR || n < 1 || n > INT32_MAX) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid maskserve_max_support \"%V\": a positive "
                           "number of token ids or \"off\"", &value[1]);
        return NGX_CONF_ERROR;
    }

    lcf->max_support = (ngx_uint_t) n;

    return NGX_CONF_OK;
}


static char *
ngx_http_maskserve_conf_stream_flush(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_maskserve_loc_conf_t  *lcf = conf;

    ngx_str_t   *value;
    ngx_msec_t   ms;

    if (lcf->flush != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (cf->args->nelts == 2 && ngx_strcmp(value[1].data, "every_step") == 0)
    {
        lcf->flush = NGX_HTTP_MASKSERVE_FLUSH_STEP;
        lcf->flush_interval = 0;
        return NGX_CONF_OK;
    }

    if (cf->args->nelts == 3 && ngx_strcmp(value[1].data, "interval") == 0) {
        ms = ngx_parse_time(&value[2], 0);
        if (ms == (ngx_msec_t) NGX_ERROR || ms == 0 || ms > 60000) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid maskserve_stream_flush interval "
                               "\"%V\": 1ms to 60s", &value[2]);
            return NGX_CONF_ERROR;
        }

        lcf->flush = NGX_HTTP_MASKSERVE_FLUSH_INTERVAL;
        lcf->flush_interval = ms;
        return NGX_CONF_OK;
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid maskserve_stream_flush: expected "
                       "\"every_step\" or \"interval <time>\"");
    return NGX_CONF_ERROR;
}


static char *
ngx_http_maskserve_conf_redis(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_maskserve_main_conf_t  *mcf = conf;

    u_char     *colon;
    ngx_int_t   port;
    ngx_str_t  *value;

    if (mcf->redis_on != NGX_CONF_UNSET) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "off") == 0) {
        mcf->redis_on = 0;
        return NGX_CONF_OK;
    }

    mcf->redis_on = 1;

    if (value[1].len > 5 && ngx_strncmp(value[1].data, "unix:", 5) == 0) {
        mcf->redis.host = value[1];
        mcf->redis.port = 0;
        return NGX_CONF_OK;
    }

    colon = ngx_strlchr(value[1].data, value[1].data + value[1].len, ':');

    if (colon == NULL) {
        mcf->redis.host = value[1];
        return NGX_CONF_OK;
    }

    port = ngx_atoi(colon + 1, value[1].data + value[1].len - colon - 1);
    if (port == NGX_ERROR || port < 1 || port > 65535
        || colon == value[1].data)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid maskserve_redis \"%V\": expected "
                           "host[:port], unix:/path or off", &value[1]);
        return NGX_CONF_ERROR;
    }

    mcf->redis.host.data = value[1].data;
    mcf->redis.host.len = colon - value[1].data;
    mcf->redis.host.data[mcf->redis.host.len] = '\0';
    mcf->redis.port = port;

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_maskserve_init_process(ngx_cycle_t *cycle)
{
    ngx_http_maskserve_main_conf_t  *mcf;

    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return NGX_OK;
    }

    if (cycle->conf_ctx[ngx_http_module.index] == NULL) {
        return NGX_OK;
    }

    mcf = ngx_http_cycle_get_module_main_conf(cycle,
                                              ngx_http_maskserve_module);
    if (mcf == NULL || (mcf->regions.nelts == 0 && !mcf->redis_on)) {
        return NGX_OK;
    }

    mcf->log = cycle->log;
    ngx_http_maskserve_process_mcf = mcf;

    ngx_http_maskserve_stats_init_process(mcf);

    if (mcf->redis_on) {
        if (ngx_http_maskserve_redis_init_process(cycle, &mcf->redis)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        ngx_http_maskserve_redis_set_abort_handler(
                                         ngx_http_maskserve_abort_local_id);
    }

    if (ngx_http_maskserve_fleet_init_process(cycle, mcf) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_maskserve_attach_init_process(cycle, mcf);
}


static void
ngx_http_maskserve_exit_process(ngx_cycle_t *cycle)
{
    ngx_http_maskserve_main_conf_t  *mcf;

    mcf = ngx_http_maskserve_process_mcf;
    if (mcf == NULL) {
        return;
    }

    ngx_http_maskserve_attach_exit_process(cycle, mcf);
    ngx_http_maskserve_fleet_exit_process(cycle);
    ngx_http_maskserve_stats_exit_process();

    if (mcf->redis_on) {
        ngx_http_maskserve_redis_exit_process(cycle);
    }

    ngx_http_maskserve_process_mcf = NULL;
}


ngx_http_maskserve_main_conf_t *
ngx_http_maskserve_process_conf(void)
{
    return ngx_http_maskserve_process_mcf;
}


static ngx_int_t
ngx_http_maskserve_add_variables(ngx_conf_t *cf)
{
    ngx_http_variable_t  *var, *v;

    for (v = ngx_http_maskserve_vars; v->name.len; v++) {
        var = ngx_http_add_variable(cf, &v->name, v->flags);
        if (var == NULL) {
            return NGX_ERROR;
        }

        var->get_handler = v->get_handler;
        var->data = v->data;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_maskserve_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    u_char                    *p;
    ngx_uint_t                 n;
    ngx_http_maskserve_ctx_t  *ctx;

    static const char  *finish[] = { "", "stop", "length", "abort" };

    ctx = ngx_http_get_module_ctx(r, ngx_http_maskserve_module);
    if (ctx == NULL) {
        v->not_found = 1;
        return NGX_OK;
    }

    switch (data) {

    case NGX_HTTP_MASKSERVE_VAR_ID:
        v->data = ctx->id.data;
        v->len = ctx->id.len;
        goto found;

    case NGX_HTTP_MASKSERVE_VAR_FINISH:
        if (ctx->err.status) {
            ngx_str_set(v, "error");
            goto found;
        }

        if (ctx->finish == MSV_FINISH_NONE || ctx->finish > MSV_FINISH_ABORT)
        {
            v->not_found = 1;
            return NGX_OK;
        }

        v->data = (u_char *) finish[ctx->finish];
        v->len = ngx_strlen(finish[ctx->finish]);
        goto found;

    case NGX_HTTP_MASKSERVE_VAR_PROMPT:
        n = ctx->prompt_tokens;
        break;

    case NGX_HTTP_MASKSERVE_VAR_COMPLETION:
        n = ctx->completion_tokens;
        break;

    default: /* NGX_HTTP_MASKSERVE_VAR_MASK */
        n = ctx->mask_entries;
        break;
    }

    p = ngx_pnalloc(r->pool, NGX_INT_T_LEN);
    if (p == NULL) {
        return NGX_ERROR;
    }

    v->data = p;
    v->len = ngx_sprintf(p, "%ui", n) - p;

found:

    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;

    return NGX_OK;
}
