/*
 * http.h: the HTTP/1.1 client of the e2e load client: one connection
 * per request in flight, keep-alive, nonblocking under epoll; the
 * response head is parsed, the body decoded (chunked or not) and handed
 * to load.c (msv_body_data, msv_body_end) as it comes, which checks it
 * with resp.c.
 */

#ifndef MSV_E2E_HTTP_H
#define MSV_E2E_HTTP_H

#include <stdint.h>

#include <yajl/yajl_parse.h>

#include "array.h"
#include "check.h"
#include "resp.h"


#define MSV_LOAD_HDR_MAX      16384
#define MSV_LOAD_READ_BUF     (256 * 1024)

typedef enum {
    MSV_C_CLOSED = 0,
    MSV_C_CONNECTING,
    MSV_C_WRITING,
    MSV_C_READING,
    MSV_C_IDLE
} msv_conn_state_t;

typedef enum {
    MSV_H_HEADERS = 0,
    MSV_H_BODY,
    MSV_H_DONE
} msv_http_state_t;

typedef enum {
    MSV_CH_SIZE = 0,
    MSV_CH_EXT,
    MSV_CH_DATA,
    MSV_CH_DATA_CR,
    MSV_CH_DATA_LF,
    MSV_CH_TRAILER,
    MSV_CH_TRAILER_LINE,
    MSV_CH_DONE
} msv_chunk_state_t;

typedef struct msv_load_s  msv_load_t;
typedef struct msv_conn_s  msv_conn_t;

struct msv_conn_s {
    int                fd;
    msv_conn_state_t   state;
    int                reused;          /* served a request before */

    /* the request */
    long               idx;
    msv_bytes_t        req;
    size_t             req_off;
    double             t_start;

    /* the response */
    msv_http_state_t   http;
    msv_bytes_t        hdr;
    int                status;
    int                chunked;
    long long          clen;            /* -1: none */
    long long          got;             /* body bytes (content-length) */
    int                close_after;
    int                ctype_ok;
    msv_chunk_state_t  ch;
    unsigned long long ch_left;
    int                ch_digits;
    int                ch_line_len;
    long long          bytes;           /* on the wire, headers included */

    msv_bytes_t        errbody;         /* non-200 bodies, for messages */

    /* the body, checked as it arrives and as a whole */
    msv_resp_t         r;
};


/* Close the connection (it may be reopened by msv_conn_connect). */
void msv_conn_close(msv_load_t *L, msv_conn_t *c);

/* Watch the connection's fd for events (op: EPOLL_CTL_ADD or _MOD). */
int msv_conn_watch(msv_load_t *L, msv_conn_t *c, uint32_t events, int op);

/* Open a nonblocking connection to the server; 0 or -1. */
int msv_conn_connect(msv_load_t *L, msv_conn_t *c);

/* epoll said the connection can be read from, or written to. */
void msv_conn_readable(msv_load_t *L, msv_conn_t *c);
void msv_conn_writable(msv_load_t *L, msv_conn_t *c);


#endif /* MSV_E2E_HTTP_H */
