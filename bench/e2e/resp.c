/*
 * resp.c: one response, checked as it arrives and as a whole (see
 * resp.h).  The documents are parsed as their bytes come (yajl with
 * check.c's callbacks), in pieces of bounded size (msv_resp_json), so
 * neither the body nor an event is buffered whole; the values of the
 * masks are read by fast.c, from the pieces as they come.
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
    size_t  n = (size_t) msv_resp_n(r);

    r->t_first = 0;
    msv_sse_reset(&r->sse);
    msv_resp_stop(r);
    r->n_events = 0;
    r->n_tokens = 0;
    r->n_rows = 0;
    r->n_mask_ids = 0;
    r->n_final = 0;
    r->done_seen = 0;
    r->completion_tokens = -1;
    r->prompt_tokens = -1;
    if (n > r->ch_cap) {
        r->ch = msv_grow(r->ch, &r->ch_cap, n, sizeof(msv_resp_choice_t));
    }
    memset(r->ch, 0, n * sizeof(msv_resp_choice_t));
    r->hash = 0;
    r->mhash = 0;
    r->bad[0] = '\0';
}


void
msv_resp_stop(msv_resp_t *r)
{
    if (r->yh) {
        yajl_free(r->yh);
        r->yh = NULL;
    }
    r->fast.kind = 0;
}


void
msv_resp_free(msv_resp_t *r)
{
    msv_resp_stop(r);
    msv_doc_free(&r->doc);
    free(r->stage.p);
    memset(&r->stage, 0, sizeof(r->stage));
    free(r->sse.data.p);
    msv_fast_free(&r->fast);
    free(r->ch);
    r->ch = NULL;
    r->ch_cap = 0;
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


/* One complete JSON document (an event, or the whole body): its choices
 * added to theirs so far. */

static int
msv_resp_doc(msv_resp_t *r, msv_doc_t *d)
{
    msv_choice_t       *c;
    msv_resp_choice_t  *rc;
    long                n = msv_resp_n(r), k;

    if (msv_doc_check(d) != 0) {
        return msv_resp_fail(r, "%s%s", r->stream ? "event: " : "", d->bad);
    }

    if (r->n_final == n) {
        return msv_resp_fail(r, "an event after the one with the "
                             "finish_reason");
    }

    r->n_events++;
    for (k = 0; k < d->n_choices; k++) {
        c = &d->ch[k];
        rc = &r->ch[c->index];
        if (rc->final_seen) {
            return msv_resp_fail(r, "choice %ld in an event after the one "
                                 "with its finish_reason", c->index);
        }
        rc->n_tokens += c->n_tokens;
        rc->n_rows += c->n_rows;
        rc->hash = msv_hash_cat(rc->hash, c->hash, c->hpow);
        rc->mhash = msv_hash_cat(rc->mhash, c->mhash, c->mpow);
        r->n_tokens += c->n_tokens;
        r->n_rows += c->n_rows;
        r->n_mask_ids += c->n_mask_ids;
        if (c->finish == 2) {
            rc->final_seen = 1;
            snprintf(rc->finish, sizeof(rc->finish), "%s", c->finish_str);
            r->n_final++;
        }
    }

    /* usage comes with the end of the last choice, and only then */
    if (r->n_final == n) {
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


/* What yajl said of the bytes it was given; 0, or -1 with r->bad set. */

static int
msv_resp_status(msv_resp_t *r, yajl_status st)
{
    unsigned char  *msg;

    if (st == yajl_status_ok) {
        return 0;
    }
    if (st == yajl_status_client_canceled) {
        return msv_resp_fail(r, "%s%s", r->stream ? "event: " : "",
                             r->doc.bad);
    }
    msg = yajl_get_error(r->yh, 0, NULL, 0);
    msv_resp_fail(r, "invalid JSON: %s", msg ? (char *) msg : "(no message)");
    if (msg) {
        yajl_free_error(r->yh, msg);
    }
    return -1;
}


/* n bytes to yajl; mute: text that only puts yajl where fast.c got to,
 * which the callbacks ignore.  0, or -1 with r->bad set. */

static int
msv_resp_parse(msv_resp_t *r, const char *p, size_t n, int mute)
{
    yajl_status  st;

    if (n == 0) {
        return 0;
    }
    r->doc.mute = mute;
    st = yajl_parse(r->yh, (const unsigned char *) p, n);
    r->doc.mute = 0;
    if (!mute) {
        r->fed += n;
    }
    return msv_resp_status(r, st);
}


static int
msv_resp_flush(msv_resp_t *r)
{
    size_t  n = r->stage.n;

    r->stage.n = 0;
    return msv_resp_parse(r, r->stage.p, n, 0);
}


/* What the fast path said (kind: of the value it read); 0 or -1. */

static int
msv_resp_fast_said(msv_resp_t *r, int kind, int rc)
{
    msv_fast_t  *f = &r->fast;

    switch (rc) {

    case MSV_FAST_FAIL:
        return msv_resp_fail(r, "%s%s", r->stream ? "event: " : "",
                             r->doc.bad);

    case MSV_FAST_DONE:
        return msv_resp_parse(r, f->mute, strlen(f->mute), 1);

    case MSV_FAST_BACK:
        if (msv_resp_parse(r, f->mute, strlen(f->mute), 1) != 0) {
            return -1;
        }
        if (kind == MSV_FAST_B64 && f->real.n > 0) {
            msv_scan_in_string(&r->scan);   /* a string handed back */
        }
        if (f->real.n > 0) {
            msv_bytes_add(&r->stage, f->real.p, f->real.n);
        }
        return 0;

    default:
        return 0;
    }
}


/*
 * yajl lexes a token that a piece ends inside of again from its start
 * with the next piece, so a string of S bytes fed in pieces of C costs
 * about S * S / 2C.  The masks' values, the packed base64 arrays
 * included, do not go to yajl (fast.c), but any other long string would:
 * the bytes wait in r->stage until they reach half of what the document
 * has had, between MSV_RESP_FEED_MIN and MSV_RESP_FEED_MAX: a few
 * re-lexed megabytes per long string at most, at most MSV_RESP_FEED_MAX
 * held.  They go at once where scan.c finds a value fast.c may read, so
 * that yajl has parsed up to its key when check.c's frame is asked.
 */
#define MSV_RESP_FEED_MIN  (64u << 10)
#define MSV_RESP_FEED_MAX  (8u << 20)

int
msv_resp_json(msv_resp_t *r, const char *p, size_t n, int end)
{
    size_t  want, k;
    int     found, kind, rc;

    if (r->yh == NULL) {
        msv_doc_reset(&r->doc, &r->e);
        r->yh = yajl_alloc(&msv_doc_callbacks, NULL, &r->doc);
        if (r->yh == NULL) {
            fprintf(stderr, "e2e: yajl_alloc failed\n");
            exit(1);
        }
        r->stage.n = 0;
        r->fed = 0;
        msv_scan_reset(&r->scan);
        r->fast.kind = 0;
    }

    while (n > 0) {
        if (r->fast.kind) {
            kind = r->fast.kind;
            rc = msv_fast_feed(&r->fast, &r->doc, p, n, &k);
            p += k;
            n -= k;
            if (msv_resp_fast_said(r, kind, rc) != 0) {
                return -1;
            }
            continue;
        }

        found = 0;
        k = r->no_fast ? n : msv_scan(&r->scan, p, n, &found);
        if (k > 0) {
            msv_bytes_add(&r->stage, p, k);
        }
        p += k;
        n -= k;
        if (found) {
            if (msv_resp_flush(r) != 0) {
                return -1;
            }
            msv_fast_begin(&r->fast, &r->doc, p[0]);
        }
    }

    if (end && r->fast.kind) {
        kind = r->fast.kind;
        if (msv_resp_fast_said(r, kind, msv_fast_stop(&r->fast, &r->doc))
            != 0)
        {
            return -1;
        }
    }

    want = r->fed / 2;
    want = want < MSV_RESP_FEED_MIN ? MSV_RESP_FEED_MIN
           : want > MSV_RESP_FEED_MAX ? MSV_RESP_FEED_MAX : want;
    if (!end && r->stage.n < want) {
        return 0;
    }

    if (msv_resp_flush(r) != 0) {
        return -1;
    }

    if (end) {
        rc = msv_resp_status(r, yajl_complete_parse(r->yh));
        if (rc != 0) {
            return -1;
        }
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


/* The checks of one choice over the whole response; 0 or -1. */

static int
msv_resp_check_choice(msv_resp_t *r, long i, const char *pre)
{
    msv_resp_choice_t  *c = &r->ch[i];
    int                 aborted;

    aborted = r->abort_ok && strcmp(c->finish, "abort") == 0;

    if (r->ignore_eos && !aborted && c->n_tokens != r->max_tokens) {
        return msv_resp_fail(r, "%s%ld tokens with ignore_eos, max_tokens "
                             "%ld", pre, c->n_tokens, r->max_tokens);
    }
    if (strcmp(c->finish, "length") != 0 && strcmp(c->finish, "stop") != 0
        && !aborted)
    {
        return msv_resp_fail(r, "%sfinish_reason \"%s\"", pre, c->finish);
    }
    if (r->ignore_eos && !aborted && strcmp(c->finish, "length") != 0) {
        return msv_resp_fail(r, "%sfinish_reason \"%s\" with ignore_eos, "
                             "expected \"length\"", pre, c->finish);
    }
    if (r->max_tokens >= 0 && c->n_tokens > r->max_tokens) {
        return msv_resp_fail(r, "%s%ld tokens, max_tokens %ld", pre,
                             c->n_tokens, r->max_tokens);
    }
    if (r->e.variant != MSV_MODE_OFF && c->n_rows != c->n_tokens) {
        return msv_resp_fail(r, "%s%ld mask rows for %ld tokens", pre,
                             c->n_rows, c->n_tokens);
    }
    return 0;
}


int
msv_resp_check(msv_resp_t *r)
{
    long  n = msv_resp_n(r), i;
    char  pre[32] = "";

    if (r->bad[0] != '\0') {
        return -1;
    }

    if (r->stream && !r->done_seen) {
        return msv_resp_fail(r, "the stream did not end with data: [DONE]");
    }
    for (i = 0; i < n; i++) {
        if (!r->ch[i].final_seen) {
            return n == 1
                   ? msv_resp_fail(r, "no event carried a finish_reason")
                   : msv_resp_fail(r, "choice %ld: no event carried its "
                                   "finish_reason", i);
        }
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

    /* the hashes of the request: its choices' in index order */
    r->hash = 0;
    r->mhash = 0;
    for (i = 0; i < n; i++) {
        if (n > 1) {
            snprintf(pre, sizeof(pre), "choice %ld: ", i);
        }
        if (msv_resp_check_choice(r, i, pre) != 0) {
            return -1;
        }
        r->hash = r->hash * MSV_HASH_P + r->ch[i].hash;
        r->mhash = r->mhash * MSV_HASH_P + r->ch[i].mhash;
    }
    return 0;
}
