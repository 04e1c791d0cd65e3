/*
 * resp.c: one response, checked as it arrives and as a whole (see
 * resp.h).  The documents are parsed as their bytes come (yajl with
 * check.c's callbacks), so neither the body nor an event is buffered.
 */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "resp.h"
#include "sse.h"


void
msv_resp_reset(msv_resp_t *r)
{
    r->t_first = 0;
    msv_sse_reset(&r->sse);
    msv_resp_stop(r);
    r->n_events = 0;
    r->n_tokens = 0;
    r->n_rows = 0;
    r->n_mask_ids = 0;
    r->final_seen = 0;
    r->done_seen = 0;
    r->finish[0] = '\0';
    r->completion_tokens = -1;
    r->prompt_tokens = -1;
    r->hash = 0xcbf29ce484222325ULL;
    r->mhash = 0xcbf29ce484222325ULL;
    r->bad[0] = '\0';
}


void
msv_resp_stop(msv_resp_t *r)
{
    if (r->yh) {
        yajl_free(r->yh);
        r->yh = NULL;
    }
}


void
msv_resp_free(msv_resp_t *r)
{
    msv_resp_stop(r);
    msv_doc_free(&r->doc);
    free(r->sse.data.p);
    memset(&r->doc, 0, sizeof(r->doc));
    memset(&r->sse.data, 0, sizeof(r->sse.data));
}


int
msv_resp_fail(msv_resp_t *r, const char *fmt, ...)
{
    va_list  ap;

    if (r->bad[0] == '\0') {
        va_start(ap, fmt);
        vsnprintf(r->bad, sizeof(r->bad), fmt, ap);
        va_end(ap);
    }
    return -1;
}


/* One complete JSON document (an event, or the whole body). */

static int
msv_resp_doc(msv_resp_t *r, msv_doc_t *d)
{
    size_t  i, j, end;

    if (msv_doc_check(d, &r->e) != 0) {
        return msv_resp_fail(r, "%s%s", r->stream ? "event: " : "", d->bad);
    }

    if (r->final_seen) {
        return msv_resp_fail(r, "an event after the one with the "
                             "finish_reason");
    }

    r->n_events++;
    r->n_tokens += (long) d->tokens.n;
    r->n_rows += (long) d->row_off.n;
    r->n_mask_ids += (long long) d->row_ids.n;
    for (i = 0; i < d->tokens.n; i++) {
        r->hash = (r->hash ^ (uint32_t) d->tokens.v[i]) * 0x100000001b3ULL;
    }
    /* row by row, length then ids: the same whatever the events */
    for (i = 0; i < d->row_off.n; i++) {
        end = i + 1 < d->row_off.n ? (size_t) d->row_off.v[i + 1]
                                   : d->row_ids.n;
        r->mhash = (r->mhash ^ (uint32_t) (end - (size_t) d->row_off.v[i]))
                   * 0x100000001b3ULL;
        for (j = (size_t) d->row_off.v[i]; j < end; j++) {
            r->mhash = (r->mhash ^ (uint32_t) d->row_ids.v[j])
                       * 0x100000001b3ULL;
        }
    }

    if (d->finish == 2) {
        r->final_seen = 1;
        snprintf(r->finish, sizeof(r->finish), "%s", d->finish_str);
        if (d->completion_tokens < 0 || d->prompt_tokens < 0) {
            return msv_resp_fail(r, "the last event has no usage");
        }
        r->completion_tokens = d->completion_tokens;
        r->prompt_tokens = d->prompt_tokens;
    } else if (d->completion_tokens >= 0) {
        return msv_resp_fail(r, "usage before the last event");
    }
    return 0;
}


int
msv_resp_json(msv_resp_t *r, const char *p, size_t n, int end)
{
    yajl_status     st;
    unsigned char  *msg;

    if (r->yh == NULL) {
        msv_doc_reset(&r->doc);
        r->yh = yajl_alloc(&msv_doc_callbacks, NULL, &r->doc);
        if (r->yh == NULL) {
            fprintf(stderr, "e2e: yajl_alloc failed\n");
            exit(1);
        }
    }

    st = n ? yajl_parse(r->yh, (const unsigned char *) p, n) : yajl_status_ok;
    if (st == yajl_status_ok && end) {
        st = yajl_complete_parse(r->yh);
    }

    if (st == yajl_status_client_canceled) {
        return msv_resp_fail(r, "%s%s", r->stream ? "event: " : "",
                             r->doc.bad);
    }
    if (st != yajl_status_ok) {
        msg = yajl_get_error(r->yh, 0, (const unsigned char *) p, n);
        msv_resp_fail(r, "invalid JSON: %s",
                      msg ? (char *) msg : "(no message)");
        if (msg) {
            yajl_free_error(r->yh, msg);
        }
        return -1;
    }

    if (end) {
        yajl_free(r->yh);
        r->yh = NULL;
        if (!r->doc.top_done) {
            return msv_resp_fail(r, "empty JSON document");
        }
        return msv_resp_doc(r, &r->doc);
    }
    return 0;
}


int
msv_resp_data(msv_resp_t *r, const char *p, size_t n)
{
    if (!r->stream) {
        if (r->t_first == 0 && r->clock) {
            r->t_first = r->clock();
        }
        return msv_resp_json(r, p, n, 0);
    }

    return msv_sse_input(r, p, n);
}


int
msv_resp_end(msv_resp_t *r)
{
    if (r->stream) {
        if (msv_sse_in_event(&r->sse)) {
            return msv_resp_fail(r, "the stream ended inside an event");
        }
        return 0;
    }
    return msv_resp_json(r, NULL, 0, 1);
}


int
msv_resp_check(msv_resp_t *r)
{
    int  aborted;

    if (r->bad[0] != '\0') {
        return -1;
    }
    aborted = r->abort_ok && strcmp(r->finish, "abort") == 0;

    if (r->stream && !r->done_seen) {
        return msv_resp_fail(r, "the stream did not end with data: [DONE]");
    }
    if (!r->final_seen) {
        return msv_resp_fail(r, "no event carried a finish_reason");
    }
    if (r->completion_tokens != r->n_tokens) {
        return msv_resp_fail(r, "usage.completion_tokens %ld, tokens "
                             "received %ld", r->completion_tokens,
                             r->n_tokens);
    }
    if (r->prompt_len >= 0 && r->prompt_tokens != r->prompt_len) {
        return msv_resp_fail(r, "usage.prompt_tokens %ld, prompt of %ld",
                             r->prompt_tokens, r->prompt_len);
    }
    if (r->ignore_eos && !aborted && r->n_tokens != r->max_tokens) {
        return msv_resp_fail(r, "%ld tokens with ignore_eos, max_tokens "
                             "%ld", r->n_tokens, r->max_tokens);
    }
    if (strcmp(r->finish, "length") != 0 && strcmp(r->finish, "stop") != 0
        && !aborted)
    {
        return msv_resp_fail(r, "finish_reason \"%s\"", r->finish);
    }
    if (r->ignore_eos && !aborted && strcmp(r->finish, "length") != 0) {
        return msv_resp_fail(r, "finish_reason \"%s\" with ignore_eos, "
                             "expected \"length\"", r->finish);
    }
    if (r->max_tokens >= 0 && r->n_tokens > r->max_tokens) {
        return msv_resp_fail(r, "%ld tokens, max_tokens %ld", r->n_tokens,
                             r->max_tokens);
    }
    if (r->e.variant != MSV_MODE_OFF && r->n_rows != r->n_tokens) {
        return msv_resp_fail(r, "%ld mask rows for %ld tokens", r->n_rows,
                             r->n_tokens);
    }
    return 0;
}
