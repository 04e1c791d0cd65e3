/*
 * sse.c: the SSE splitter of the e2e load client (see sse.h).
 *
 * Parsed as it arrives, byte by byte across reads: the values of data
 * lines go straight into the JSON parser of the event (msv_json_run),
 * so an event is never buffered whole; only data that is not JSON
 * ([DONE]) is kept, and only its first bytes.
 */

#include <stdio.h>
#include <string.h>

#include "load.h"
#include "sse.h"



/* SSE: an event is complete (a blank line after data lines). */

static int
msv_sse_event(msv_load_t *L, msv_conn_t *c)
{
    int  kind;

    if (!c->data_seen) {
        return 0;                   /* a blank line, or comments only */
    }
    kind = c->data_kind;
    c->data_seen = 0;
    c->data_kind = 0;

    if (c->t_first == 0) {
        c->t_first = msv_now();
    }

    if (c->done_seen) {
        msv_fail(L, c, "an event after data: [DONE]");
        return -1;
    }

    if (kind == 1) {
        return msv_json_run(L, c, NULL, 0, 1);
    }

    while (c->data.n > 0 && c->data.p[c->data.n - 1] == '\r') {
        c->data.n--;
    }
    if (kind == 2 && c->data.n == 6 && memcmp(c->data.p, "[DONE]", 6) == 0) {
        c->done_seen = 1;
        c->data.n = 0;
        if (!c->final_seen) {
            msv_fail(L, c, "data: [DONE] before an event with a "
                     "finish_reason");
            return -1;
        }
        return 0;
    }

    msv_fail(L, c, "an event that is neither JSON nor [DONE]: \"%.*s\"",
             (int) c->data.n, c->data.n ? c->data.p : "");
    return -1;
}


/* Bytes of a data line's value. */

static int
msv_sse_data(msv_load_t *L, msv_conn_t *c, const char *p, size_t n)
{
    if (n == 0) {
        return 0;
    }
    if (c->data_kind == 0) {
        c->data_kind = p[0] == '{' ? 1 : 2;
    }
    if (c->data_kind == 1) {
        return msv_json_run(L, c, p, n, 0);
    }
    if (c->data.n + n > 64) {
        msv_fail(L, c, "an event that is neither JSON nor [DONE]");
        return -1;
    }
    msv_bytes_add(&c->data, p, n);
    return 0;
}


/* A data line begins: lines of one event are joined by a newline. */

static int
msv_sse_data_line(msv_load_t *L, msv_conn_t *c)
{
    if (c->data_seen && c->data_kind != 0) {
        if (msv_sse_data(L, c, "\n", 1) != 0) {
            return -1;
        }
    }
    c->data_seen = 1;
    return 0;
}


static int
msv_sse_is_data(msv_conn_t *c)
{
    return c->field_n == 4 && memcmp(c->field, "data", 4) == 0;
}


int
msv_sse_input(msv_load_t *L, msv_conn_t *c, const char *p, size_t n)
{
    const char  *nl;
    size_t       k;

    while (n > 0) {

        switch (c->sse) {

        case MSV_SSE_START:
            if (*p == '\n') {
                p++;
                n--;
                if (msv_sse_event(L, c) != 0) {
                    return -1;
                }
                continue;
            }
            if (*p == '\r') {       /* of a CRLF */
                p++;
                n--;
                continue;
            }
            c->field_n = 0;
            c->sse = MSV_SSE_FIELD;
            /* fall through */

        case MSV_SSE_FIELD:
            if (*p == ':') {
                p++;
                n--;
                c->sse = msv_sse_is_data(c) ? MSV_SSE_SPACE : MSV_SSE_SKIP;
                continue;
            }
            if (*p == '\n') {
                /* a field without a value: "data" is an empty data line */
                p++;
                n--;
                c->sse = MSV_SSE_START;
                if (msv_sse_is_data(c) && msv_sse_data_line(L, c) != 0) {
                    return -1;
                }
                continue;
            }
            if (*p != '\r') {
                if (c->field_n < (int) sizeof(c->field)) {
                    c->field[c->field_n] = *p;
                }
                c->field_n++;
            }
            p++;
            n--;
            continue;

        case MSV_SSE_SPACE:
            if (msv_sse_data_line(L, c) != 0) {
                return -1;
            }
            if (*p == ' ') {
                p++;
                n--;
            }
            c->sse = MSV_SSE_DATA;
            continue;

        case MSV_SSE_DATA:
            nl = memchr(p, '\n', n);
            k = nl ? (size_t) (nl - p) : n;
            if (msv_sse_data(L, c, p, k) != 0) {
                return -1;
            }
            p += k;
            n -= k;
            if (nl) {
                p++;
                n--;
                c->sse = MSV_SSE_START;
            }
            continue;

        case MSV_SSE_SKIP:
            nl = memchr(p, '\n', n);
            if (nl == NULL) {
                return 0;
            }
            k = (size_t) (nl - p) + 1;
            p += k;
            n -= k;
            c->sse = MSV_SSE_START;
            continue;
        }
    }
    return 0;
}
