/*
 * ngx_http_maskserve_util.c: what every file of the module calls back
 * into: the regions a configuration names, and JSON answers and errors.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_maskserve_module.h"
#include "ngx_http_maskserve_util.h"


ngx_http_maskserve_region_t *
ngx_http_maskserve_region(ngx_http_maskserve_main_conf_t *mcf, ngx_uint_t i)
{
    ngx_http_maskserve_region_t  *rg;

    rg = mcf->regions.elts;

    return &rg[i];
}


ngx_uint_t
ngx_http_maskserve_loc_nregions(ngx_http_maskserve_main_conf_t *mcf,
    ngx_http_maskserve_loc_conf_t *lcf)
{
    return lcf->regions ? lcf->regions->nelts : mcf->regions.nelts;
}


ngx_http_maskserve_region_t *
ngx_http_maskserve_loc_region(ngx_http_maskserve_main_conf_t *mcf,
    ngx_http_maskserve_loc_conf_t *lcf, ngx_uint_t i)
{
    ngx_uint_t  *idx;

    if (lcf->regions == NULL) {
        return ngx_http_maskserve_region(mcf, i);
    }

    idx = lcf->regions->elts;

    return ngx_http_maskserve_region(mcf, idx[i]);
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


ngx_int_t
ngx_http_maskserve_send_error(ngx_http_request_t *r,
    ngx_http_maskserve_err_t *err)
{
    u_char           *p;
    size_t            len, mlen, plen;
    ngx_buf_t        *b;
    ngx_table_elt_t  *h;

    mlen = ngx_escape_json(NULL, err->message.data, err->message.len);
    plen = err->param ? ngx_strlen(err->param) : 0;

    len = sizeof("{\"error\":{\"message\":\"") - 1 + err->message.len + mlen
          + sizeof("\",\"type\":\"") - 1 + ngx_strlen(err->type)
          + sizeof("\",\"param\":\"") - 1 + plen
          + sizeof("\",\"code\":}}\n") - 1 + NGX_INT_T_LEN;

    b = ngx_create_temp_buf(r->pool, len);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p = b->last;
    p = ngx_cpymem(p, "{\"error\":{\"message\":\"",
                   sizeof("{\"error\":{\"message\":\"") - 1);
    p = (u_char *) ngx_escape_json(p, err->message.data, err->message.len);
    p = ngx_sprintf(p, "\",\"type\":\"%s\",\"param\":", err->type);

    if (err->param) {
        p = ngx_sprintf(p, "\"%s\"", err->param);

    } else {
        p = ngx_cpymem(p, "null", 4);
    }

    p = ngx_sprintf(p, ",\"code\":%ui}}\n", err->status);
    b->last = p;

    if (err->status == NGX_HTTP_NOT_ALLOWED
        || err->status == NGX_HTTP_SERVICE_UNAVAILABLE)
    {
        h = ngx_list_push(&r->headers_out.headers);
        if (h == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        h->hash = 1;

        if (err->status == NGX_HTTP_NOT_ALLOWED) {
            ngx_str_set(&h->key, "Allow");
            ngx_str_set(&h->value, "POST");

        } else {
            ngx_str_set(&h->key, "Retry-After");
            ngx_str_set(&h->value, "1");
        }
    }

    return ngx_http_maskserve_send_json(r, err->status, b);
}


ngx_int_t
ngx_http_maskserve_send_json(ngx_http_request_t *r, ngx_uint_t status,
    ngx_buf_t *b)
{
    static ngx_str_t  json = ngx_string("application/json");

    return ngx_http_maskserve_send_buf(r, status, &json, b);
}


ngx_int_t
ngx_http_maskserve_send_buf(ngx_http_request_t *r, ngx_uint_t status,
    ngx_str_t *type, ngx_buf_t *b)
{
    ngx_int_t    rc;
    ngx_chain_t  out;

    r->headers_out.status = status;
    r->headers_out.content_length_n = b->last - b->pos;
    r->headers_out.content_type = *type;
    r->headers_out.content_type_len = r->headers_out.content_type.len;
    r->headers_out.content_type_lowcase = NULL;

    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


u_char *
ngx_http_maskserve_json_escape(u_char *p, u_char *s, size_t len,
    ngx_uint_t ascii)
{
    size_t  i;

    for (i = 0; i < len; i++) {
        if (s[i] < 0x20 || s[i] == 0x7f || (ascii && s[i] >= 0x80)) {
            p = ngx_sprintf(p, "\\u%04xd", (int) s[i]);

        } else if (s[i] == '"' || s[i] == '\\') {
            *p++ = '\\';
            *p++ = s[i];

        } else {
            *p++ = s[i];
        }
    }

    return p;
}
