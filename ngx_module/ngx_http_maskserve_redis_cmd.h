/*
 * ngx_http_maskserve_redis_cmd.h: a Redis command assembled as argv for
 * redisAsyncCommandArgv, keys and numbers formatted into the command's
 * own buffer.  An argument that does not fit sets overflow; the link
 * refuses to send such a command.
 */

#ifndef NGX_HTTP_MASKSERVE_REDIS_CMD_H
#define NGX_HTTP_MASKSERVE_REDIS_CMD_H

#include <ngx_config.h>
#include <ngx_core.h>


#define MSV_REDIS_MAX_ARGS       32
#define MSV_REDIS_ARG_BYTES      2048    /* keys and numbers of a command */


/* a command being assembled: argv plus room for keys and numbers */
typedef struct {
    const char                       *argv[MSV_REDIS_MAX_ARGS];
    size_t                            argvlen[MSV_REDIS_MAX_ARGS];
    int                               argc;
    ngx_uint_t                        overflow;
    u_char                           *pos;
    u_char                            buf[MSV_REDIS_ARG_BYTES];
} msv_redis_cmd_t;


void msv_redis_cmd_init(msv_redis_cmd_t *cmd);
/* p must stay valid until the command is queued */
void msv_redis_arg(msv_redis_cmd_t *cmd, const void *p, size_t len);
void msv_redis_arg_cstr(msv_redis_cmd_t *cmd, const char *s);
void msv_redis_arg_uint(msv_redis_cmd_t *cmd, uint64_t v);
/* turn cmd, sent on a key (argv[1]), into PEXPIRE <key> <ms> */
void msv_redis_cmd_pexpire(msv_redis_cmd_t *cmd, uint64_t ms);
/* an argument formatted (ngx_vslprintf) into the command's own buffer */
void msv_redis_arg_fmt(msv_redis_cmd_t *cmd, const char *fmt, ...);


#endif /* NGX_HTTP_MASKSERVE_REDIS_CMD_H */
