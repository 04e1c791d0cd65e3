/*
 * http.c: the HTTP/1.1 client of the e2e load client (see http.h):
 * nonblocking connections under epoll, the request written out, the
 * response head parsed and the body delivered as it comes, through the
 * chunked decoder or by Content-Length (or up to the close).
 */

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <yajl/yajl_parse.h>

#include "load.h"
#include "http.h"


void
msv_conn_close(msv_load_t *L, msv_conn_t *c)
{
    if (c->fd >= 0) {
        if (epoll_ctl(L->ep, EPOLL_CTL_DEL, c->fd, NULL) != 0) {
            perror("e2e_load: epoll_ctl(DEL)");
        }
        close(c->fd);
    }
    c->fd = -1;
    c->state = MSV_C_CLOSED;
    c->reused = 0;
    msv_resp_stop(&c->r);
}


int
msv_conn_watch(msv_load_t *L, msv_conn_t *c, uint32_t events, int op)
{
    struct epoll_event  ev;

    memset(&ev, 0, sizeof(ev));
    ev.events = events;
    ev.data.ptr = c;
    if (epoll_ctl(L->ep, op, c->fd, &ev) != 0) {
        perror("e2e_load: epoll_ctl");
        return -1;
    }
    return 0;
}


int
msv_conn_connect(msv_load_t *L, msv_conn_t *c)
{
    int  fd, one = 1;

    fd = socket(L->ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                0);
    if (fd < 0) {
        perror("e2e_load: socket");
        return -1;
    }
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
        perror("e2e_load: setsockopt(TCP_NODELAY)");
        close(fd);
        return -1;
    }
    if (connect(fd, L->ai->ai_addr, L->ai->ai_addrlen) != 0
        && errno != EINPROGRESS)
    {
        fprintf(stderr, "e2e_load: connect to %s:%s: %s\n", L->o.host,
                L->o.port, strerror(errno));
        close(fd);
        return -1;
    }
    c->fd = fd;
    c->state = MSV_C_CONNECTING;
    c->reused = 0;
    return msv_conn_watch(L, c, EPOLLOUT, EPOLL_CTL_ADD);
}


static int
msv_hdr_has(const char *v, size_t n, const char *tok)
{
    size_t  t = strlen(tok), i;

    for (i = 0; i + t <= n; i++) {
        if (strncasecmp(v + i, tok, t) == 0) {
            return 1;
        }
    }
    return 0;
}


static int
msv_headers_parse(msv_load_t *L, msv_conn_t *c)
{
    char    *p, *end, *eol, *colon, *v;
    size_t   name_n, vn;
    int      http10 = 0;
    long     st;

    p = c->hdr.p;
    end = p + c->hdr.n;

    eol = memchr(p, '\n', (size_t) (end - p));
    if (eol == NULL || eol - p < 12 || memcmp(p, "HTTP/1.", 7) != 0) {
        msv_fail(L, c, "not an HTTP/1.x response");
        return -1;
    }
    http10 = p[7] == '0';
    st = strtol(p + 9, NULL, 10);
    if (st < 100 || st > 599) {
        msv_fail(L, c, "bad HTTP status line");
        return -1;
    }
    c->status = (int) st;
    c->close_after = http10;

    for (p = eol + 1; p < end; p = eol + 1) {
        eol = memchr(p, '\n', (size_t) (end - p));
        if (eol == NULL) {
            break;
        }
        if (eol == p || (eol == p + 1 && p[0] == '\r')) {
            break;                  /* the blank line */
        }
        colon = memchr(p, ':', (size_t) (eol - p));
        if (colon == NULL) {
            msv_fail(L, c, "a header line without a colon");
            return -1;
        }
        name_n = (size_t) (colon - p);
        v = colon + 1;
        while (v < eol && (*v == ' ' || *v == '\t')) {
            v++;
        }
        vn = (size_t) (eol - v);
        while (vn > 0 && (v[vn - 1] == '\r' || v[vn - 1] == ' ')) {
            vn--;
        }

#define MSV_HDR(s)  (name_n == sizeof(s) - 1 && strncasecmp(p, s, name_n) == 0)

        if (MSV_HDR("Content-Length")) {
            char  *e;

            errno = 0;
            c->clen = strtoll(v, &e, 10);
            if (errno != 0 || e == v || c->clen < 0) {
                msv_fail(L, c, "bad Content-Length");
                return -1;
            }
        } else if (MSV_HDR("Transfer-Encoding")) {
            c->chunked = msv_hdr_has(v, vn, "chunked");
        } else if (MSV_HDR("Connection")) {
            if (msv_hdr_has(v, vn, "close")) {
                c->close_after = 1;
            } else if (msv_hdr_has(v, vn, "keep-alive")) {
                c->close_after = 0;
            }
        } else if (MSV_HDR("Content-Type")) {
            c->ctype_ok = msv_hdr_has(v, vn, L->o.stream
                                      ? "text/event-stream"
                                      : "application/json");
        }

#undef MSV_HDR
    }

    if (c->chunked) {
        c->clen = -1;
    } else if (c->clen < 0) {
        c->close_after = 1;         /* the body ends with the connection */
    }
    return 0;
}


/* Feed response bytes; returns -1 on a protocol or validation failure,
 * 1 when the response is complete, 0 for more. */

static int
msv_conn_input(msv_load_t *L, msv_conn_t *c, const char *p, size_t n)
{
    const char  *e, *q;
    size_t       k, from, hl;
    int          ch, d;

    c->bytes += (long long) n;

    while (n > 0 || c->http == MSV_H_BODY) {

        switch (c->http) {

        case MSV_H_HEADERS:
            from = c->hdr.n > 3 ? c->hdr.n - 3 : 0;
            msv_bytes_add(&c->hdr, p, n);
            e = NULL;
            for (q = c->hdr.p + from; q + 3 < c->hdr.p + c->hdr.n; q++) {
                if (q[0] == '\r' && q[1] == '\n' && q[2] == '\r'
                    && q[3] == '\n')
                {
                    e = q + 4;
                    break;
                }
            }
            if (e == NULL) {
                if (c->hdr.n > MSV_LOAD_HDR_MAX) {
                    msv_fail(L, c, "response headers over %d bytes",
                             MSV_LOAD_HDR_MAX);
                    return -1;
                }
                return 0;
            }
            hl = (size_t) (e - c->hdr.p);
            k = c->hdr.n - hl;          /* body bytes that came along */
            p = p + n - k;
            n = k;
            if (msv_headers_parse(L, c) != 0) {
                return -1;
            }
            if (c->status >= 100 && c->status < 200) {
                /* an interim response: drop it, read the next head */
                c->hdr.n = 0;
                continue;
            }
            c->http = MSV_H_BODY;
            if (!c->chunked && c->clen == 0) {
                if (msv_body_end(L, c) != 0) {
                    return -1;
                }
            }
            continue;

        case MSV_H_BODY:
            if (!c->chunked) {
                if (c->clen >= 0) {
                    k = (long long) n > c->clen - c->got
                        ? (size_t) (c->clen - c->got) : n;
                } else {
                    k = n;
                }
                if (k && msv_body_data(L, c, p, k) != 0) {
                    return -1;
                }
                c->got += (long long) k;
                p += k;
                n -= k;
                if (c->clen >= 0 && c->got == c->clen) {
                    if (msv_body_end(L, c) != 0) {
                        return -1;
                    }
                    continue;
                }
                return 0;
            }

            /* chunked */
            if (n == 0) {
                return 0;
            }
            if (c->ch == MSV_CH_DATA) {
                k = (unsigned long long) n > c->ch_left ? (size_t) c->ch_left
                                                        : n;
                if (msv_body_data(L, c, p, k) != 0) {
                    return -1;
                }
                c->ch_left -= k;
                p += k;
                n -= k;
                if (c->ch_left == 0) {
                    c->ch = MSV_CH_DATA_CR;
                }
                continue;
            }

            ch = (unsigned char) *p++;
            n--;

            switch (c->ch) {

            case MSV_CH_SIZE:
                if (ch >= '0' && ch <= '9') {
                    d = ch - '0';
                } else if (ch >= 'a' && ch <= 'f') {
                    d = ch - 'a' + 10;
                } else if (ch >= 'A' && ch <= 'F') {
                    d = ch - 'A' + 10;
                } else {
                    d = -1;
                }
                if (d >= 0) {
                    if (c->ch_left >> 56) {
                        msv_fail(L, c, "chunk size too large");
                        return -1;
                    }
                    c->ch_left = c->ch_left * 16 + (unsigned) d;
                    c->ch_digits++;
                    break;
                }
                if (c->ch_digits == 0) {
                    msv_fail(L, c, "bad chunk size line");
                    return -1;
                }
                if (ch == '\n') {
                    goto size_done;
                }
                c->ch = MSV_CH_EXT;
                break;

            case MSV_CH_EXT:
                if (ch != '\n') {
                    break;
                }

            size_done:
                c->ch_digits = 0;
                if (c->ch_left == 0) {
                    c->ch = MSV_CH_TRAILER;
                    c->ch_line_len = 0;
                } else {
                    c->ch = MSV_CH_DATA;
                }
                break;

            case MSV_CH_DATA_CR:
                if (ch == '\r') {
                    c->ch = MSV_CH_DATA_LF;
                } else if (ch == '\n') {
                    c->ch = MSV_CH_SIZE;
                } else {
                    msv_fail(L, c, "no CRLF after a chunk");
                    return -1;
                }
                break;

            case MSV_CH_DATA_LF:
                if (ch != '\n') {
                    msv_fail(L, c, "no CRLF after a chunk");
                    return -1;
                }
                c->ch = MSV_CH_SIZE;
                break;

            case MSV_CH_TRAILER:
            case MSV_CH_TRAILER_LINE:
                if (ch == '\n') {
                    if (c->ch_line_len == 0) {
                        c->ch = MSV_CH_DONE;
                        if (msv_body_end(L, c) != 0) {
                            return -1;
                        }
                        break;
                    }
                    c->ch_line_len = 0;
                } else if (ch != '\r') {
                    c->ch_line_len++;
                }
                break;

            default:
                break;
            }
            continue;

        case MSV_H_DONE:
            if (n > 0) {
                msv_fail(L, c, "%zu bytes after the end of the response",
                         n);
                return -1;
            }
            return 1;
        }
    }

    return c->http == MSV_H_DONE ? 1 : 0;
}


void
msv_conn_readable(msv_load_t *L, msv_conn_t *c)
{
    ssize_t  r;
    int      rc, reads;

    for (reads = 0; reads < 16; reads++) {
        r = recv(c->fd, L->rbuf, MSV_LOAD_READ_BUF, 0);
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                return;
            }
            if (errno == EINTR) {
                continue;
            }
            if (c->state == MSV_C_IDLE) {
                msv_conn_close(L, c);
                return;
            }
            msv_fail(L, c, "recv: %s", strerror(errno));
            msv_conn_finish(L, c, 1);
            return;
        }

        if (c->state == MSV_C_IDLE) {
            /* the server closed an idle keep-alive connection */
            if (r > 0) {
                fprintf(stderr, "e2e_load: %zd unexpected bytes on an idle "
                        "connection\n", r);
            }
            msv_conn_close(L, c);
            return;
        }

        if (r == 0) {
            if (c->http == MSV_H_BODY && !c->chunked && c->clen < 0) {
                rc = msv_body_end(L, c);
                msv_conn_finish(L, c, rc != 0);
                return;
            }
            msv_fail(L, c, "connection closed %s",
                     c->bytes ? "in the middle of the response"
                              : "before a response");
            msv_conn_finish(L, c, 1);
            return;
        }

        rc = msv_conn_input(L, c, L->rbuf, (size_t) r);
        if (rc < 0) {
            msv_conn_finish(L, c, 1);
            return;
        }
        if (rc == 1) {
            msv_conn_finish(L, c, 0);
            return;
        }
    }
}


void
msv_conn_writable(msv_load_t *L, msv_conn_t *c)
{
    ssize_t    w;
    int        err = 0;
    socklen_t  len = sizeof(err);

    if (c->state == MSV_C_CONNECTING) {
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
            err = errno;
        }
        if (err != 0) {
            msv_fail(L, c, "connect to %s:%s: %s", L->o.host, L->o.port,
                     strerror(err));
            msv_conn_finish(L, c, 1);
            return;
        }
        c->state = MSV_C_WRITING;
    }

    while (c->req_off < c->req.n) {
        w = send(c->fd, c->req.p + c->req_off, c->req.n - c->req_off,
                 MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                return;
            }
            if (errno == EINTR) {
                continue;
            }
            msv_fail(L, c, "send: %s", strerror(errno));
            msv_conn_finish(L, c, 1);
            return;
        }
        c->req_off += (size_t) w;
    }

    c->state = MSV_C_READING;
    if (msv_conn_watch(L, c, EPOLLIN, EPOLL_CTL_MOD) != 0) {
        msv_fail(L, c, "epoll");
        msv_conn_finish(L, c, 1);
    }
}
