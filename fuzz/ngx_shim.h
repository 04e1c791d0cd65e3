/*
 * ngx_shim.h: pools for fuzzing nginx module code outside nginx (see
 * ngx_shim.c).
 */

#ifndef MSV_NGX_SHIM_H
#define MSV_NGX_SHIM_H

#include <ngx_config.h>
#include <ngx_core.h>

ngx_pool_t *msv_shim_pool(void);
void msv_shim_pool_free(ngx_pool_t *pool);

#endif /* MSV_NGX_SHIM_H */
