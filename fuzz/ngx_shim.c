/*
 * ngx_shim.c: the few nginx core functions the request parser calls,
 * for fuzzing it outside nginx.  Debian's nginx-dev ships nginx's headers
 * but not its core sources, so the parser (ngx_http_maskserve_parse.c,
 * compiled unchanged against those headers) is linked with these instead.
 *
 * Every pool allocation is its own malloc, kept on the pool's `large`
 * list, so that AddressSanitizer puts a red zone around each one: an
 * overrun of a pool buffer is reported where nginx's real pool (which
 * carves allocations out of big blocks) would let it pass silently.
 */

#include <ngx_config.h>
#include <ngx_core.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ngx_http_maskserve_module.h"
#include "ngx_shim.h"


ngx_pool_t *
msv_shim_pool(void)
{
    ngx_pool_t  *p;

    p = calloc(1, sizeof(ngx_pool_t));
    if (p == NULL) {
        abort();
    }
    return p;
}


void
msv_shim_pool_free(ngx_pool_t *pool)
{
    ngx_pool_large_t    *l, *next;
    ngx_pool_cleanup_t  *c;

    for (c = pool->cleanup; c; c = c->next) {
        if (c->handler) {
            c->handler(c->data);
        }
    }

    for (l = pool->large; l; l = next) {
        next = l->next;
        free(l->alloc);
        free(l);
    }

    free(pool);
}


void *
ngx_pnalloc(ngx_pool_t *pool, size_t size)
{
    ngx_pool_large_t  *l;

    l = malloc(sizeof(ngx_pool_large_t));
    if (l == NULL) {
        return NULL;
    }
    /* malloc(0) may return NULL, which the caller would take for OOM */
    l->alloc = malloc(size ? size : 1);
    if (l->alloc == NULL) {
        free(l);
        return NULL;
    }
    l->next = pool->large;
    pool->large = l;
    return l->alloc;
}


void *
ngx_palloc(ngx_pool_t *pool, size_t size)
{
    return ngx_pnalloc(pool, size);
}


void *
ngx_pcalloc(ngx_pool_t *pool, size_t size)
{
    void  *p;

    p = ngx_pnalloc(pool, size);
    if (p) {
        memset(p, 0, size);
    }
    return p;
}


ngx_pool_cleanup_t *
ngx_pool_cleanup_add(ngx_pool_t *p, size_t size)
{
    ngx_pool_cleanup_t  *c;

    c = ngx_palloc(p, sizeof(ngx_pool_cleanup_t));
    if (c == NULL) {
        return NULL;
    }
    c->data = size ? ngx_palloc(p, size) : NULL;
    c->handler = NULL;
    c->next = p->cleanup;
    p->cleanup = c;
    return c;
}


/* As nginx's: double the array, in the pool (never in place here). */
void *
ngx_array_push(ngx_array_t *a)
{
    void  *new;

    if (a->nelts == a->nalloc) {
        new = ngx_palloc(a->pool, 2 * a->size * a->nalloc);
        if (new == NULL) {
            return NULL;
        }
        memcpy(new, a->elts, a->size * a->nalloc);
        a->elts = new;
        a->nalloc *= 2;
    }
    return (u_char *) a->elts + a->size * a->nelts++;
}


/* As nginx's: ngx_hash() over the bytes. */
ngx_uint_t
ngx_hash_key(u_char *data, size_t len)
{
    ngx_uint_t  i, key;

    key = 0;
    for (i = 0; i < len; i++) {
        key = ngx_hash(key, data[i]);
    }
    return key;
}


ssize_t
ngx_read_file(ngx_file_t *file, u_char *buf, size_t size, off_t offset)
{
    ssize_t  n;

    n = pread(file->fd, buf, size, offset);
    return n < 0 ? NGX_ERROR : n;
}


void
ngx_log_error_core(ngx_uint_t level, ngx_log_t *log, ngx_err_t err,
    const char *fmt, ...)
{
    u_char   buf[512];
    va_list  args;

    /* format it anyway: a bad argument list shows up under ASan */
    va_start(args, fmt);
    (void) ngx_vslprintf(buf, buf + sizeof(buf), fmt, args);
    va_end(args);
}


/*
 * The subset of nginx's formats the parser uses (%s %*s %V %d %D %uD %ui
 * %i %L %uL %z %uz %c %%), with nginx's rule that nothing is written at
 * or past `last`.  Unknown formats abort: a new one in the parser must be
 * added here rather than be formatted wrongly.
 */
u_char *
ngx_vslprintf(u_char *buf, u_char *last, const char *fmt, va_list args)
{
    char         tmp[64];
    size_t       len, n;
    ngx_uint_t   uns, star;
    ngx_str_t   *v;
    const char  *s;

    while (*fmt && buf < last) {
        if (*fmt != '%') {
            *buf++ = (u_char) *fmt++;
            continue;
        }
        fmt++;
        uns = 0;
        star = 0;
        len = (size_t) -1;

        for ( ;; ) {
            if (*fmt == 'u') {
                uns = 1;
            } else if (*fmt == '*') {
                star = 1;
                len = va_arg(args, size_t);
            } else {
                break;
            }
            fmt++;
        }

        s = tmp;
        switch (*fmt++) {
        case 's':
            s = va_arg(args, char *);
            n = star ? len : strlen(s);
            goto copy;
        case 'V':
            v = va_arg(args, ngx_str_t *);
            s = (const char *) v->data;
            n = v->len;
            goto copy;
        case 'c':
            tmp[0] = (char) va_arg(args, int);
            n = 1;
            goto copy;
        case '%':
            tmp[0] = '%';
            n = 1;
            goto copy;
        case 'd':
            n = uns ? (size_t) snprintf(tmp, sizeof(tmp), "%u",
                                        va_arg(args, unsigned))
                    : (size_t) snprintf(tmp, sizeof(tmp), "%d",
                                        va_arg(args, int));
            goto copy;
        case 'D':
            n = uns ? (size_t) snprintf(tmp, sizeof(tmp), "%u",
                                        va_arg(args, uint32_t))
                    : (size_t) snprintf(tmp, sizeof(tmp), "%d",
                                        va_arg(args, int32_t));
            goto copy;
        case 'i':
            n = uns ? (size_t) snprintf(tmp, sizeof(tmp), "%lu",
                                        (unsigned long) va_arg(args,
                                                               ngx_uint_t))
                    : (size_t) snprintf(tmp, sizeof(tmp), "%ld",
                                        (long) va_arg(args, ngx_int_t));
            goto copy;
        case 'L':
            n = uns ? (size_t) snprintf(tmp, sizeof(tmp), "%llu",
                                        (unsigned long long) va_arg(args,
                                                                  uint64_t))
                    : (size_t) snprintf(tmp, sizeof(tmp), "%lld",
                                        (long long) va_arg(args, int64_t));
            goto copy;
        case 'z':
            n = uns ? (size_t) snprintf(tmp, sizeof(tmp), "%zu",
                                        va_arg(args, size_t))
                    : (size_t) snprintf(tmp, sizeof(tmp), "%zd",
                                        va_arg(args, ssize_t));
            goto copy;
        default:
            fprintf(stderr, "ngx_shim: format %%%c is not supported\n",
                    fmt[-1]);
            abort();
        }

    copy:
        if (n > (size_t) (last - buf)) {
            n = last - buf;
        }
        memcpy(buf, s, n);
        buf += n;
    }

    return buf;
}


void
ngx_http_maskserve_set_error(ngx_http_maskserve_err_t *err,
    ngx_uint_t status, const char *type, const char *param, u_char *message,
    size_t len)
{
    err->status = status;
    err->type = type;
    err->param = param;
    err->message.data = message;
    err->message.len = len;
}


/* What the module's output writer (ngx_http_maskserve_output.c) calls
 * besides the pool; bench/packed_bench.c runs it outside nginx. */

ngx_module_t  ngx_http_maskserve_module;


/* As nginx's: a link from the pool's free list, or a new one. */
ngx_chain_t *
ngx_alloc_chain_link(ngx_pool_t *pool)
{
    ngx_chain_t  *cl;

    cl = pool->chain;

    if (cl) {
        pool->chain = cl->next;
        return cl;
    }

    return ngx_palloc(pool, sizeof(ngx_chain_t));
}


ngx_buf_t *
ngx_create_temp_buf(ngx_pool_t *pool, size_t size)
{
    ngx_buf_t  *b;

    b = ngx_calloc_buf(pool);
    if (b == NULL) {
        return NULL;
    }

    b->start = ngx_palloc(pool, size);
    if (b->start == NULL) {
        return NULL;
    }

    b->pos = b->start;
    b->last = b->start;
    b->end = b->last + size;
    b->temporary = 1;

    return b;
}


/* As nginx's: at most n - 1 bytes, then a NUL; returns the NUL. */
u_char *
ngx_cpystrn(u_char *dst, u_char *src, size_t n)
{
    if (n == 0) {
        return dst;
    }

    while (--n) {
        *dst = *src;

        if (*dst == '\0') {
            return dst;
        }

        dst++;
        src++;
    }

    *dst = '\0';

    return dst;
}


u_char * ngx_cdecl
ngx_sprintf(u_char *buf, const char *fmt, ...)
{
    u_char   *p;
    va_list   args;

    va_start(args, fmt);
    p = ngx_vslprintf(buf, (void *) -1, fmt, args);
    va_end(args);

    return p;
}


/*
 * As nginx's: with dst NULL, the number of bytes escaping adds; else the
 * escaped text, and the end of it.
 */
uintptr_t
ngx_escape_json(u_char *dst, u_char *src, size_t size)
{
    u_char      ch;
    ngx_uint_t  len;

    static const char  hex[] = "0123456789abcdef";

    if (dst == NULL) {
        len = 0;

        while (size) {
            ch = *src++;

            if (ch == '\\' || ch == '"') {
                len++;

            } else if (ch <= 0x1f) {
                len += ch == '\n' || ch == '\r' || ch == '\t' || ch == '\b'
                       || ch == '\f' ? 1 : sizeof("\\u001F") - 2;
            }

            size--;
        }

        return (uintptr_t) len;
    }

    while (size) {
        ch = *src++;

        if (ch > 0x1f && ch != '\\' && ch != '"') {
            *dst++ = ch;

        } else {
            *dst++ = '\\';

            switch (ch) {
            case '\\': case '"': *dst++ = ch; break;
            case '\n': *dst++ = 'n'; break;
            case '\r': *dst++ = 'r'; break;
            case '\t': *dst++ = 't'; break;
            case '\b': *dst++ = 'b'; break;
            case '\f': *dst++ = 'f'; break;
            default:
                *dst++ = 'u'; *dst++ = '0'; *dst++ = '0';
                *dst++ = '0' + (ch >> 4);
                *dst++ = hex[ch & 0xf];
            }
        }

        size--;
    }

    return (uintptr_t) dst;
}


/*
 * As nginx's: what was handed out joins busy; links from the front of busy
 * whose buffers were sent go to free when they carry the tag (reset, for
 * reuse), back to the pool otherwise.
 */
void
ngx_chain_update_chains(ngx_pool_t *p, ngx_chain_t **free, ngx_chain_t **busy,
    ngx_chain_t **out, ngx_buf_tag_t tag)
{
    ngx_chain_t  *cl;

    if (*out) {
        if (*busy == NULL) {
            *busy = *out;

        } else {
            for (cl = *busy; cl->next; cl = cl->next) { /* void */ }

            cl->next = *out;
        }

        *out = NULL;
    }

    while (*busy) {
        cl = *busy;

        if (cl->buf->tag != tag) {
            *busy = cl->next;
            ngx_free_chain(p, cl);
            continue;
        }

        if (ngx_buf_size(cl->buf) != 0) {
            break;
        }

        cl->buf->pos = cl->buf->start;
        cl->buf->last = cl->buf->start;

        *busy = cl->next;
        cl->next = *free;
        *free = cl;
    }
}


void *
ngx_alloc(size_t size, ngx_log_t *log)
{
    return malloc(size);
}
