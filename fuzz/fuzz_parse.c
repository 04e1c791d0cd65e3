/*
 * fuzz_parse.c: libFuzzer target for the request parser and validator
 * (ngx_http_maskserve_parse.c, compiled unchanged against nginx's headers).
 *
 * Input: byte 0 picks the body kind (generate or abort), where the body
 * lives (memory buffers or a temporary file, as nginx leaves large
 * bodies) and the vocabulary the validator checks against; byte 1 seeds
 * where the body is cut into buffers (yajl parses as a stream, so a
 * token split across buffers is a case of its own); the rest is the
 * body.  Each buffer is its own allocation, so a read past a buffer's end
 * is reported.
 *
 * Checked on every input: an error carries status 400, a non-empty one-
 * line message, and no allocation failure is claimed; an accepted
 * request holds only what the worker may be given (token ids inside the
 * vocabulary, max_tokens inside the context, min_tokens <= max_tokens,
 * finite parameters, bias ids sorted and unique, a valid request id).
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ngx_http_maskserve_module.h"
#include "ngx_http_maskserve_parse.h"
#include "ngx_shim.h"


#define MSV_FZ_MAX_CHUNKS  4

#define msv_fz_check(cond)                                                   \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "fuzz_parse: %s:%d: %s\n", __FILE__, __LINE__,   \
                    #cond);                                                  \
            abort();                                                         \
        }                                                                    \
    } while (0)


static int  msv_fz_fd = -1;


static void
msv_fz_check_err(ngx_http_maskserve_err_t *err)
{
    size_t  i;

    msv_fz_check(err->status == NGX_HTTP_BAD_REQUEST);
    msv_fz_check(err->type != NULL);
    msv_fz_check(err->message.len > 0 && err->message.data != NULL);
    for (i = 0; i < err->message.len; i++) {
        msv_fz_check(err->message.data[i] != '\n'
                     && err->message.data[i] != '\0');
    }
}


static void
msv_fz_check_gen(ngx_http_maskserve_gen_t *g, struct msv_ctrl *c)
{
    ngx_uint_t  i;

    msv_fz_check(g->n_prompt >= 1 && g->n_prompt < c->max_model_len);
    for (i = 0; i < g->n_prompt; i++) {
        msv_fz_check((uint32_t) g->prompt[i] < c->vocab_size);
    }
    msv_fz_check(g->params.max_tokens <= c->max_model_len - g->n_prompt);
    msv_fz_check(g->params.min_tokens <= g->params.max_tokens);
    msv_fz_check(isfinite(g->params.temperature)
                 && g->params.temperature >= 0);
    msv_fz_check(isfinite(g->params.top_p) && g->params.top_p > 0
                 && g->params.top_p <= 1);
    msv_fz_check(isfinite(g->params.min_p) && g->params.min_p >= 0
                 && g->params.min_p <= 1);
    msv_fz_check(isfinite(g->params.repetition_penalty)
                 && g->params.repetition_penalty > 0);
    msv_fz_check(isfinite(g->params.presence_penalty));
    msv_fz_check(isfinite(g->params.frequency_penalty));
    msv_fz_check(g->params.n_stop <= MSV_MAX_STOP);
    for (i = 0; i < g->params.n_stop; i++) {
        msv_fz_check((uint32_t) g->params.stop_ids[i] < c->vocab_size);
    }
    msv_fz_check(g->params.n_bias <= MSV_MAX_BIAS);
    for (i = 0; i < g->params.n_bias; i++) {
        msv_fz_check((uint32_t) g->bias[i].id < c->vocab_size);
        msv_fz_check(isfinite(g->bias[i].value));
        msv_fz_check(i == 0 || g->bias[i].id > g->bias[i - 1].id);
    }
    msv_fz_check(g->params.logprobs >= -1
                 && (g->params.logprobs < 0
                     || (uint32_t) g->params.logprobs <= c->max_logprobs));
    msv_fz_check(g->params.mask_mode <= MSV_MASK_SUPPORT);
    msv_fz_check(g->request_id.len == 0
                 || ngx_http_maskserve_id_valid(g->request_id.data,
                                                g->request_id.len));
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    u_char                         *copy;
    size_t                          len, cut[MSV_FZ_MAX_CHUNKS + 1];
    uint32_t                        h;
    ngx_int_t                       rc;
    ngx_str_t                       id;
    ngx_log_t                       log;
    ngx_buf_t                      *b;
    ngx_uint_t                      i, n, mode;
    ngx_file_t                      file;
    ngx_pool_t                     *pool;
    ngx_chain_t                    *cl, **ll;
    struct msv_ctrl                 ctrl;
    ngx_connection_t                conn;
    ngx_http_request_t              r;
    ngx_http_request_body_t         body;
    ngx_http_maskserve_gen_t        g;
    ngx_http_maskserve_err_t        err;
    ngx_http_maskserve_loc_conf_t   lcf;

    if (size < 2) {
        return 0;
    }
    mode = data[0];
    h = data[1] * 2654435761u;
    data += 2;
    size -= 2;

    pool = msv_shim_pool();

    ngx_memzero(&log, sizeof(log));
    log.log_level = NGX_LOG_DEBUG;
    ngx_memzero(&conn, sizeof(conn));
    conn.log = &log;
    ngx_memzero(&r, sizeof(r));
    r.pool = pool;
    r.connection = &conn;
    ngx_memzero(&body, sizeof(body));
    r.request_body = (mode & 0x40) ? NULL : &body;

    ll = &body.bufs;

    if (mode & 0x02) {
        /* a body nginx wrote to a temporary file */
        msv_fz_check(ftruncate(msv_fz_fd, 0) == 0);
        msv_fz_check(size == 0
                     || pwrite(msv_fz_fd, data, size, 0) == (ssize_t) size);
        ngx_memzero(&file, sizeof(file));
        file.fd = msv_fz_fd;
        ngx_str_set(&file.name, "fuzz-body");
        b = ngx_pcalloc(pool, sizeof(ngx_buf_t));
        cl = ngx_palloc(pool, sizeof(ngx_chain_t));
        b->in_file = 1;
        b->file = &file;
        b->file_pos = 0;
        b->file_last = size;
        cl->buf = b;
        *ll = cl;
        ll = &cl->next;

    } else {
        n = 1 + (mode >> 2) % MSV_FZ_MAX_CHUNKS;
        cut[0] = 0;
        for (i = 1; i < n; i++) {
            h = h * 1103515245u + 12345u;
            cut[i] = size ? (h >> 8) % (size + 1) : 0;
            if (cut[i] < cut[i - 1]) {
                cut[i] = cut[i - 1];
            }
        }
        cut[n] = size;

        for (i = 0; i < n; i++) {
            len = cut[i + 1] - cut[i];
            copy = ngx_pnalloc(pool, len);
            memcpy(copy, data + cut[i], len);
            b = ngx_pcalloc(pool, sizeof(ngx_buf_t));
            cl = ngx_palloc(pool, sizeof(ngx_chain_t));
            b->pos = copy;
            b->last = copy + len;
            b->temporary = 1;
            cl->buf = b;
            *ll = cl;
            ll = &cl->next;
        }
    }
    *ll = NULL;

    ngx_memzero(&err, sizeof(err));

    if (mode & 0x01) {
        rc = ngx_http_maskserve_parse_abort(&r, &id, &err);
        if (rc == NGX_OK) {
            msv_fz_check(ngx_http_maskserve_id_valid(id.data, id.len));
        } else {
            msv_fz_check_err(&err);
        }
        msv_shim_pool_free(pool);
        return 0;
    }

    rc = ngx_http_maskserve_parse_generate(&r, &g, &err);
    if (rc != NGX_OK) {
        msv_fz_check_err(&err);
        msv_shim_pool_free(pool);
        return 0;
    }

    /* two model shapes: a tiny vocabulary, and Qwen3's */
    ngx_memzero(&ctrl, sizeof(ctrl));
    ctrl.vocab_size = (mode & 0x20) ? 151936 : 256;
    ctrl.max_model_len = (mode & 0x20) ? 40960 : 512;
    ctrl.max_logprobs = 20;

    ngx_memzero(&lcf, sizeof(lcf));
    lcf.max_prompt = (mode & 0x80) ? 64 : 0;
    lcf.max_support = (mode & 0x80) ? 1024 : 0;

    ngx_memzero(&err, sizeof(err));
    rc = ngx_http_maskserve_check_generate(&r, &g, &ctrl, &lcf, &err);
    if (rc == NGX_OK) {
        msv_fz_check_gen(&g, &ctrl);
    } else {
        msv_fz_check_err(&err);
    }

    msv_shim_pool_free(pool);
    return 0;
}


int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
    msv_fz_fd = memfd_create("fuzz-body", 0);
    if (msv_fz_fd < 0) {
        perror("memfd_create");
        abort();
    }
    return 0;
}
