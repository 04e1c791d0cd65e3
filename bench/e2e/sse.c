/*
 * sse.c: the SSE splitter of the e2e clients (see sse.h).
 *
 * Parsed as it arrives, byte by byte across reads: the values of data
 * lines go straight into the JSON parser of the event (msv_resp_json),
 * so an event is never buffered whole; only data that is not JSON
 * ([DONE]) is kept, and only its first bytes.
 */

#include <string.h>

#include "resp.h"
#include "sse.h"


void
msv_sse_reset(msv_sse_t *s)
{
    s->state = MSV_SSE_START;
    s->field_n = 0;
    s->data.n = 0;
    s->data_seen = 0;
    s->data_kind = 0;
}


int
msv_sse_in_event(const msv_sse_t *s)
{
    return s->state != MSV_SSE_START || s->data_seen;
}


/* SSE: an event is complete (a blank line after data lines). */

static int
msv_sse_event(msv_resp_t *r)
{
    int  kind;

    if (!r->sse.data_seen) {
        return 0;                   /* a blank line, or comments only */
    }
    kind = r->sse.data_kind;
    r->sse.data_seen = 0;
    r->sse.data_kind = 0;

    if (r->t_first == 0 && r->clock) {
        r->t_first = r->clock();
    }

    if (r->done_seen) {
        msv_resp_fail(r, "an event after data: [DONE]");
        return -1;
    }

    if (kind == 1) {
        return msv_resp_json(r, NULL, 0, 1);
    }

    while (r->sse.data.n > 0 && r->sse.data.p[r->sse.data.n - 1] == '\r') {
        r->sse.data.n--;
    }
    if (kind == 2 && r->sse.data.n == 6
        && memcmp(r->sse.data.p, "[DONE]", 6) == 0)
    {
        r->done_seen = 1;
        r->sse.data.n = 0;
        if (r->n_final < msv_resp_n(r)) {
            msv_resp_fail(r, "data: [DONE] before an event with a "
                          "finish_reason");
            return -1;
        }
        return 0;
    }

    msv_resp_fail(r, "an event that is neither JSON nor [DONE]: \"%.*s\"",
                  (int) r->sse.data.n, r->sse.data.n ? r->sse.data.p : "");
    return -1;
}


/* Bytes of a data line's value. */

static int
msv_sse_data(msv_resp_t *r, const char *p, size_t n)
{
    if (n == 0) {
        return 0;
    }
    if (r->sse.data_kind == 0) {
        r->sse.data_kind = p[0] == '{' ? 1 : 2;
    }
    if (r->sse.data_kind == 1) {
        return msv_resp_json(r, p, n, 0);
    }
    if (r->sse.data.n + n > 64) {
        msv_resp_fail(r, "an event that is neither JSON nor [DONE]");
        return -1;
    }
    msv_bytes_add(&r->sse.data, p, n);
    return 0;
}


/* A data line begins: lines of one event are joined by a newline. */

static int
msv_sse_data_line(msv_resp_t *r)
{
    if (r->sse.data_seen && r->sse.data_kind != 0) {
        if (msv_sse_data(r, "\n", 1) != 0) {
            return -1;
        }
    }
    r->sse.data_seen = 1;
    return 0;
}


static int
msv_sse_is_data(msv_sse_t *s)
{
    return s->field_n == 4 && memcmp(s->field, "data", 4) == 0;
}


int
msv_sse_input(msv_resp_t *r, const char *p, size_t n)
{
    const char  *nl;
    size_t       k;

    while (n > 0) {

        switch (r->sse.state) {

        case MSV_SSE_START:
            if (*p == '\n') {
                p++;
                n--;
                if (msv_sse_event(r) != 0) {
                    return -1;
                }
                continue;
            }
            if (*p == '\r') {       /* of a CRLF */
                p++;
                n--;
                continue;
            }
            r->sse.field_n = 0;
            r->sse.state = MSV_SSE_FIELD;
            /* fall through */

        case MSV_SSE_FIELD:
            if (*p == ':') {
                p++;
                n--;
                r->sse.state = msv_sse_is_data(&r->sse) ? MSV_SSE_SPACE
                                                        : MSV_SSE_SKIP;
                continue;
            }
            if (*p == '\n') {
                /* a field without a value: "data" is an empty data line */
                p++;
                n--;
                r->sse.state = MSV_SSE_START;
                if (msv_sse_is_data(&r->sse) && msv_sse_data_line(r) != 0) {
                    return -1;
                }
                continue;
            }
            if (*p != '\r') {
                if (r->sse.field_n < (int) sizeof(r->sse.field)) {
                    r->sse.field[r->sse.field_n] = *p;
                }
                r->sse.field_n++;
            }
            p++;
            n--;
            continue;

        case MSV_SSE_SPACE:
            if (msv_sse_data_line(r) != 0) {
                return -1;
            }
            if (*p == ' ') {
                p++;
                n--;
            }
            r->sse.state = MSV_SSE_DATA;
            continue;

        case MSV_SSE_DATA:
            nl = memchr(p, '\n', n);
            k = nl ? (size_t) (nl - p) : n;
            if (msv_sse_data(r, p, k) != 0) {
                return -1;
            }
            p += k;
            n -= k;
            if (nl) {
                p++;
                n--;
                r->sse.state = MSV_SSE_START;
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
            r->sse.state = MSV_SSE_START;
            continue;
        }
    }
    return 0;
}
