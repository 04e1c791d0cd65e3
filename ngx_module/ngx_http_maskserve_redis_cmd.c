/*
 * ngx_http_maskserve_redis_cmd.c: Redis commands assembled as argv, with
 * room for keys and numbers in the command itself.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_maskserve_redis_cmd.h"


void
msv_redis_cmd_init(msv_redis_cmd_t *cmd)
{
    cmd->argc = 0;
    cmd->overflow = 0;
    cmd->pos = cmd->buf;
}


/* p must stay valid until the command is queued */
void
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


void
msv_redis_arg_cstr(msv_redis_cmd_t *cmd, const char *s)
{
    msv_redis_arg(cmd, s, ngx_strlen(s));
}


void
msv_redis_arg_uint(msv_redis_cmd_t *cmd, uint64_t v)
{
    msv_redis_arg_fmt(cmd, "%uL", v);
}


/* turn cmd, sent on a key (argv[1]), into PEXPIRE <key> <ms> */
void
msv_redis_cmd_pexpire(msv_redis_cmd_t *cmd, uint64_t ms)
{
    cmd->argc = 2;
    cmd->argv[0] = "PEXPIRE";
    cmd->argvlen[0] = 7;
    msv_redis_arg_uint(cmd, ms);
}


/* an argument formatted into the command's own buffer */
void
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

