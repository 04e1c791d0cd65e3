/*
 * check.c: the e2e load client's response checker (see check.h).
 *
 * The parser is a stack of frames (the document, choices, a choice,
 * usage, error, token_ids, the mask and its rows, the logprobs and their
 * rows, the packed mask) with the pending key of each map; values of
 * keys it does not know are skipped whatever their shape.  Numbers are
 * converted by hand (num.c); a support row's logsumexp is taken over its
 * values once the row ends (lse.c).  Each choice is checked when its
 * object ends and only its summary kept (msv_choice_t), so a document of
 * n choices holds the rows of one choice at a time.  Packed arrays are
 * decoded in place: the ids straight into row_ids, the logprobs read as
 * the float32 they are.  The rows' values and base64 strings may also
 * come from fast.c, which reads them from the text and calls the same
 * callbacks for what it does not take itself.
 */

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "msv_b64.h"
#include "b64dec.h"
#include "check.h"
#include "lse.h"
#include "num.h"


const char  *msv_mode_names[MSV_N_MODES] = {
    "off", "selected", "support", "selected-packed", "support-packed"
};

/* the choices sampling_params.n asked */
static long
msv_n_of(const msv_expect_t *e)
{
    return e->n > 1 ? e->n : 1;
}


/* Empty the fields of one choice, for the next. */

static void
msv_doc_choice_reset(msv_doc_t *d)
{
    d->index = -1;
    d->has_tokens = 0;
    d->tokens.n = 0;
    d->has_mask = 0;
    d->has_mlps = 0;
    d->has_packed = 0;
    d->row_ids.n = 0;
    d->row_off.n = 0;
    d->mlps_num = 0;
    d->mlps_arr = 0;
    d->lprow_len.n = 0;
    d->lprow_lse.n = 0;
    d->lp_vals.n = 0;
    d->has_logprobs = 0;
    d->has_lpcontent = 0;
    d->lpc_tok.n = 0;
    d->lpc_lp.n = 0;
    d->lpc_ntop.n = 0;
    d->finish = 0;
    d->finish_str[0] = '\0';
}


void
msv_doc_reset(msv_doc_t *d, const msv_expect_t *e)
{
    size_t  n = (size_t) msv_n_of(e);

    d->e = e;
    d->depth = 0;
    d->skip_depth = 0;
    d->top_done = 0;
    d->is_error = 0;
    d->error[0] = '\0';
    d->n_choices = 0;
    if (n > d->ch_seen.cap) {
        d->ch_seen.p = msv_grow(d->ch_seen.p, &d->ch_seen.cap, n, 1);
    }
    memset(d->ch_seen.p, 0, n);
    d->ch_seen.n = n;
    d->prompt_tokens = -1;
    d->completion_tokens = -1;
    d->bad[0] = '\0';
    msv_doc_choice_reset(d);
}


static int
msv_doc_fail(msv_doc_t *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int
msv_doc_fail(msv_doc_t *d, const char *fmt, ...)
{
    va_list  ap;

    if (d->bad[0] == '\0') {
        va_start(ap, fmt);
        vsnprintf(d->bad, sizeof(d->bad), fmt, ap);
        va_end(ap);
    }
    return 0;                       /* stops the parser */
}


static int msv_doc_b64(msv_doc_t *d, int k, const char *s, size_t n);
static int msv_doc_choice_end(msv_doc_t *d);
static int msv_doc_packed(msv_doc_t *d);
static int msv_doc_packed_lps(msv_doc_t *d, int mode);


/* Where a scalar or a container lands: the frame on top and, for maps,
 * the pending key.  Containers: returns the kind of the new frame. */

static msv_frame_t *
msv_doc_top(msv_doc_t *d)
{
    return d->depth > 0 ? &d->stack[d->depth - 1] : NULL;
}


static int
msv_doc_push(msv_doc_t *d, msv_frame_kind_t kind)
{
    if (kind == MSV_F_SKIP && d->depth > 0
        && d->stack[d->depth - 1].kind == MSV_F_SKIP)
    {
        d->skip_depth++;
        return 1;
    }
    if (d->depth == MSV_CHECK_MAX_DEPTH) {
        return msv_doc_fail(d, "JSON nested too deep");
    }
    d->stack[d->depth].kind = kind;
    d->stack[d->depth].key = MSV_K_NONE;
    d->stack[d->depth].seen = 0;
    d->depth++;
    return 1;
}


static int
msv_doc_pop(msv_doc_t *d)
{
    msv_frame_t  *f;
    double        lse;
    size_t        n;

    f = msv_doc_top(d);
    if (f == NULL) {
        return msv_doc_fail(d, "unbalanced JSON");
    }
    if (f->kind == MSV_F_SKIP && d->skip_depth > 0) {
        d->skip_depth--;
        return 1;
    }

    switch (f->kind) {

    case MSV_F_LPROW:
        n = d->lp_vals.n - d->lp_start;
        lse = n ? msv_lse_f64(d->lp_vals.v + d->lp_start, n) : 0.0;
        msv_i32s_push(&d->lprow_len, (int32_t) n);
        msv_f64s_push(&d->lprow_lse, lse);
        break;

    case MSV_F_TOP:
        d->top_done = 1;
        break;

    case MSV_F_CHOICE:
        if (msv_doc_choice_end(d) == 0) {
            return 0;
        }
        break;

    case MSV_F_TOPENTRY:
        if (isnan(d->top_lp)) {
            return msv_doc_fail(d, "logprobs.content: a top_logprobs entry "
                                "without a logprob");
        }
        if (++d->lpe_ntop == 1) {
            d->lpe_top0 = d->top_lp;
        } else if (d->top_lp > d->lpe_prev) {
            return msv_doc_fail(d, "logprobs.content: top_logprobs not "
                                "best first");
        }
        d->lpe_prev = d->top_lp;
        break;

    case MSV_F_LPENTRY:
        if (d->lpe_tok < 0 || isnan(d->lpe_lp) || d->lpe_ntop < 0) {
            return msv_doc_fail(d, "logprobs.content: an entry without its "
                                "token_id, logprob or top_logprobs");
        }
        if (d->lpe_ntop > 0 && d->lpe_lp > d->lpe_top0 + 1e-6) {
            return msv_doc_fail(d, "logprobs.content: the sampled logprob "
                                "above the best of top_logprobs");
        }
        msv_i32s_push(&d->lpc_tok, (int32_t) d->lpe_tok);
        msv_f64s_push(&d->lpc_lp, d->lpe_lp);
        msv_i32s_push(&d->lpc_ntop, (int32_t) d->lpe_ntop);
        break;

    case MSV_F_PACKED:
        if (f->seen != (1u << MSV_K_PFORMAT | 1u << MSV_K_PLENGTHS
                        | 1u << MSV_K_PIDS | 1u << MSV_K_PLPS))
        {
            return msv_doc_fail(d, "sampling_mask_packed: a key is "
                                "missing");
        }
        if (msv_doc_packed(d) == 0) {
            return 0;
        }
        break;

    default:
        break;
    }

    d->depth--;
    return 1;
}


/*
 * Where the bytes of packed array k go: the ids straight into row_ids,
 * after the rows it holds (msv_doc_packed adds them once the map ends),
 * the lengths and logprobs into pk[k].  Room for `bytes` and the slack
 * of msv_b64dec_groups.
 */

char *
msv_doc_b64_room(msv_doc_t *d, int k, size_t bytes)
{
    msv_i32s_t   *a = &d->row_ids;
    msv_bytes_t  *b = &d->pk[k];
    size_t        need;

    if (k == 1) {
        need = a->n + (bytes + MSV_B64DEC_SLACK + 3) / 4;
        if (need > a->cap) {
            a->v = msv_grow(a->v, &a->cap, need, sizeof(int32_t));
        }
        return (char *) (a->v + a->n);
    }

    need = bytes + MSV_B64DEC_SLACK;
    if (need > b->cap) {
        b->p = msv_grow(b->p, &b->cap, need, 1);
    }
    return b->p;
}


int
msv_doc_b64_done(msv_doc_t *d, int k, long got, size_t chars)
{
    if (got < 0 || got % 4) {
        return msv_doc_fail(d, "sampling_mask_packed: %s base64 (%zu "
                            "characters)", got < 0 ? "invalid"
                            : "not whole 4-byte values in", chars);
    }
    d->pk[k].n = (size_t) got;
    return 1;
}


/* A base64 string of sampling_mask_packed, decoded (strictly). */

static int
msv_doc_b64(msv_doc_t *d, int k, const char *s, size_t n)
{
    char  *out;

    out = msv_doc_b64_room(d, k, n / 4 * 3 + 1);
    return msv_doc_b64_done(d, k, msv_b64_decode(s, n, out), n);
}


/* The first of the n ids at v that is negative or not above the one
 * before it, or n (ascending and unique, none below 0). */

static size_t
msv_ids_first_bad(const int32_t *v, size_t n)
{
    size_t  i;
    int     bad;

    if (n == 0) {
        return 0;
    }
    if (v[0] < 0) {
        return 0;
    }
    /* whole blocks without a branch per id, then the one at fault */
    for (i = 1; i + 8 <= n; i += 8) {
        bad = (v[i] <= v[i - 1]) | (v[i + 1] <= v[i])
              | (v[i + 2] <= v[i + 1]) | (v[i + 3] <= v[i + 2])
              | (v[i + 4] <= v[i + 3]) | (v[i + 5] <= v[i + 4])
              | (v[i + 6] <= v[i + 5]) | (v[i + 7] <= v[i + 6]);
        if (bad) {
            break;
        }
    }
    for ( /* void */ ; i < n; i++) {
        if (v[i] <= v[i - 1]) {
            return i;
        }
    }
    return n;
}


/*
 * The packed mask, decoded, into the fields the JSON parser fills (rows
 * and their ids; the logprobs once the mode is known, msv_doc_packed_lps),
 * so that msv_choice_check runs the same checks on both.  The ids are in
 * row_ids already, after its n: each row is checked there and added.
 */

static int
msv_doc_packed(msv_doc_t *d)
{
    size_t          t, n, total, start, base;
    int32_t         len;
    const int32_t  *ids;

    n = d->pk[0].n / 4;
    total = 0;

    for (t = 0; t < n; t++) {
        memcpy(&len, d->pk[0].p + 4 * t, 4);
        if (len <= 0) {
            return msv_doc_fail(d, "sampling_mask_packed: row %zu has "
                                "length %d", t, (int) len);
        }
        total += (size_t) len;
    }
    if (d->pk[1].n / 4 != total) {
        return msv_doc_fail(d, "sampling_mask_packed: %zu ids, the lengths "
                            "add up to %zu", d->pk[1].n / 4, total);
    }

    base = d->row_ids.n;
    ids = d->row_ids.v + base;
    start = 0;
    for (t = 0; t < n; t++) {
        memcpy(&len, d->pk[0].p + 4 * t, 4);
        msv_i32s_push(&d->row_off, (int32_t) (base + start));
        if (msv_ids_first_bad(ids + start, (size_t) len) != (size_t) len) {
            return msv_doc_fail(d, "sampling_mask_packed: row %zu: ids "
                                "not ascending and unique", t);
        }
        start += (size_t) len;
    }
    d->row_ids.n = base + total;

    d->has_packed = 1;
    d->has_mask = 1;
    d->has_mlps = 1;
    return 1;
}


/* Whether one of the n float32 at v is above 0 (1e-6) or NaN. */

static int
msv_lps_above_0(const float *v, size_t n)
{
    size_t  i;
    int     bad = 0;

    for (i = 0; i < n; i++) {
        bad |= !(v[i] <= 1e-6f);
    }
    return bad;
}


/*
 * The packed logprobs, read as the request's mode says (one per token
 * or one per id), into mlps_num or each support row's logsumexp; they
 * stay in pk[2], where msv_doc_check_mask reads them.  Returns 0 or -1
 * with d->bad set.
 */

static int
msv_doc_packed_lps(msv_doc_t *d, int mode)
{
    size_t        t, n, total, start, len;
    const float  *lps = (const float *) d->pk[2].p;

    n = d->row_off.n;
    total = d->row_ids.n;

    if (d->pk[2].n / 4 != (mode == MSV_MODE_SELECTED ? n : total)) {
        snprintf(d->bad, sizeof(d->bad), "sampling_mask_packed: %zu "
                 "logprobs in %s mode for %zu tokens and %zu ids",
                 d->pk[2].n / 4, msv_mode_names[mode], n, total);
        return -1;
    }

    if (msv_lps_above_0(lps, d->pk[2].n / 4)) {
        snprintf(d->bad, sizeof(d->bad), "sampling_mask_packed: a "
                 "logprob above 0");
        return -1;
    }

    if (mode == MSV_MODE_SELECTED) {
        d->mlps_num = (long) n;
        return 0;
    }

    for (t = 0; t < n; t++) {
        start = (size_t) d->row_off.v[t];
        len = (t + 1 < n ? (size_t) d->row_off.v[t + 1] : total) - start;
        msv_i32s_push(&d->lprow_len, (int32_t) len);
        msv_f64s_push(&d->lprow_lse, msv_lse_f32(lps + start, len));
    }
    d->mlps_arr = (long) n;
    return 0;
}


static int
msv_cb_key(void *ctx, const unsigned char *k, size_t n)
{
    msv_doc_t    *d = ctx;
    msv_frame_t  *f = msv_doc_top(d);
    int           key = MSV_K_OTHER;

#define MSV_IS(s)  (n == sizeof(s) - 1 && memcmp(k, s, n) == 0)

    if (d->mute) {
        return 1;
    }
    if (f == NULL) {
        return msv_doc_fail(d, "key outside an object");
    }

    switch (f->kind) {

    case MSV_F_TOP:
        if (MSV_IS("request_id")) {
            key = MSV_K_REQUEST_ID;
        } else if (MSV_IS("seed")) {
            key = MSV_K_SEED;
        } else if (MSV_IS("choices")) {
            key = MSV_K_CHOICES;
        } else if (MSV_IS("usage")) {
            key = MSV_K_USAGE;
        } else if (MSV_IS("error")) {
            key = MSV_K_ERRORK;
        }
        break;

    case MSV_F_CHOICE:
        if (MSV_IS("index")) {
            key = MSV_K_INDEX;
        } else if (MSV_IS("token_ids")) {
            key = MSV_K_TOKEN_IDS;
        } else if (MSV_IS("sampling_mask")) {
            key = MSV_K_MASK;
        } else if (MSV_IS("sampling_mask_logprobs")) {
            key = MSV_K_MLPS;
        } else if (MSV_IS("sampling_mask_packed")) {
            key = MSV_K_PACKED;
        } else if (MSV_IS("logprobs")) {
            key = MSV_K_LOGPROBS;
        } else if (MSV_IS("finish_reason")) {
            key = MSV_K_FINISH;
        }
        break;

    case MSV_F_USAGE:
        if (MSV_IS("prompt_tokens")) {
            key = MSV_K_PROMPT;
        } else if (MSV_IS("completion_tokens")) {
            key = MSV_K_COMPLETION;
        }
        break;

    case MSV_F_ERROR:
        if (MSV_IS("message")) {
            key = MSV_K_MESSAGE;
        }
        break;

    case MSV_F_PACKED:
        if (MSV_IS("format")) {
            key = MSV_K_PFORMAT;
        } else if (MSV_IS("lengths")) {
            key = MSV_K_PLENGTHS;
        } else if (MSV_IS("ids")) {
            key = MSV_K_PIDS;
        } else if (MSV_IS("logprobs")) {
            key = MSV_K_PLPS;
        } else {
            return msv_doc_fail(d, "sampling_mask_packed: unknown key "
                                "\"%.*s\"", (int) n, (const char *) k);
        }
        break;

    case MSV_F_LOGPROBS:
        if (MSV_IS("content")) {
            key = MSV_K_CONTENT;
        }
        break;

    case MSV_F_LPENTRY:
    case MSV_F_TOPENTRY:
        if (MSV_IS("token_id")) {
            key = MSV_K_TOKEN_ID;
        } else if (MSV_IS("logprob")) {
            key = MSV_K_LOGPROB;
        } else if (MSV_IS("top_logprobs") && f->kind == MSV_F_LPENTRY) {
            key = MSV_K_TOPS;
        }
        break;

    case MSV_F_SKIP:
        return 1;

    default:
        return msv_doc_fail(d, "key inside an array");
    }

#undef MSV_IS

    if (key != MSV_K_OTHER) {
        if (f->seen & (1u << key)) {
            return msv_doc_fail(d, "duplicate key \"%.*s\"", (int) n,
                                (const char *) k);
        }
        f->seen |= 1u << key;
    }
    f->key = key;
    return 1;
}


/* a scalar: 'n' number (text in s), 's' string, 'b' boolean, '0' null */

static int
msv_doc_scalar(msv_doc_t *d, int type, const char *s, size_t n)
{
    msv_frame_t  *f = msv_doc_top(d);
    long          v;
    double        x;
    size_t        nr;
    int32_t       prev;

    if (d->mute) {
        return 1;
    }
    if (f == NULL) {
        return msv_doc_fail(d, "a document that is not an object");
    }

    switch (f->kind) {

    case MSV_F_SKIP:
        return 1;

    case MSV_F_TOP:
        if (f->key == MSV_K_CHOICES || f->key == MSV_K_USAGE) {
            return msv_doc_fail(d, "%s has the wrong type",
                                f->key == MSV_K_CHOICES ? "choices" : "usage");
        }
        if (f->key == MSV_K_ERRORK) {
            d->is_error = 1;
            snprintf(d->error, sizeof(d->error), "%.*s",
                     (int) (n > 200 ? 200 : n), s ? s : "");
        }
        return 1;

    case MSV_F_CHOICE:
        switch (f->key) {

        case MSV_K_INDEX:
            if (msv_n_of(d->e) == 1) {
                if (type != 'n' || msv_parse_int(s, n, &v) != 0 || v != 0) {
                    return msv_doc_fail(d, "choices[0].index is not 0");
                }
            } else if (type != 'n' || msv_parse_int(s, n, &v) != 0 || v < 0
                       || v >= msv_n_of(d->e))
            {
                return msv_doc_fail(d, "choices[%ld].index is not in 0..%ld "
                                    "(n %ld)", d->n_choices - 1,
                                    msv_n_of(d->e) - 1, msv_n_of(d->e));
            }
            d->index = v;
            return 1;

        case MSV_K_FINISH:
            if (type == '0') {
                d->finish = 1;
                return 1;
            }
            if (type != 's' || n == 0 || n >= sizeof(d->finish_str)) {
                return msv_doc_fail(d, "bad finish_reason");
            }
            memcpy(d->finish_str, s, n);
            d->finish_str[n] = '\0';
            d->finish = 2;
            return 1;

        case MSV_K_LOGPROBS:
            d->has_logprobs = 1;    /* sent, even as null */
            return 1;

        case MSV_K_TOKEN_IDS:
        case MSV_K_MASK:
        case MSV_K_MLPS:
            return msv_doc_fail(d, "%s is not an array",
                                f->key == MSV_K_TOKEN_IDS ? "token_ids"
                                : f->key == MSV_K_MASK ? "sampling_mask"
                                : "sampling_mask_logprobs");
        default:
            return 1;
        }

    case MSV_F_USAGE:
        if (f->key == MSV_K_PROMPT || f->key == MSV_K_COMPLETION) {
            if (type != 'n' || msv_parse_int(s, n, &v) != 0 || v < 0) {
                return msv_doc_fail(d, "usage.%s is not a count",
                                    f->key == MSV_K_PROMPT
                                    ? "prompt_tokens" : "completion_tokens");
            }
            if (f->key == MSV_K_PROMPT) {
                d->prompt_tokens = v;
            } else {
                d->completion_tokens = v;
            }
        }
        return 1;

    case MSV_F_ERROR:
        if (f->key == MSV_K_MESSAGE && type == 's') {
            snprintf(d->error, sizeof(d->error), "%.*s",
                     (int) (n > 200 ? 200 : n), s);
        }
        return 1;

    case MSV_F_PACKED:
        if (type != 's') {
            return msv_doc_fail(d, "sampling_mask_packed: a value is not a "
                                "string");
        }
        if (f->key == MSV_K_PFORMAT) {
            if (n != sizeof(MSV_PACKED_FORMAT) - 1
                || memcmp(s, MSV_PACKED_FORMAT, n) != 0)
            {
                return msv_doc_fail(d, "sampling_mask_packed: format "
                                    "\"%.*s\"", (int) (n > 40 ? 40 : n), s);
            }
            return 1;
        }
        return msv_doc_b64(d, f->key - MSV_K_PLENGTHS, s, n);

    case MSV_F_LOGPROBS:
        if (f->key == MSV_K_CONTENT) {
            return msv_doc_fail(d, "logprobs.content is not an array");
        }
        return 1;

    case MSV_F_LPCONTENT:
    case MSV_F_TOPS:
        return msv_doc_fail(d, "logprobs.content: an entry is not an "
                            "object");

    case MSV_F_LPENTRY:
    case MSV_F_TOPENTRY:
        if (f->key == MSV_K_TOKEN_ID) {
            if (type != 'n' || msv_parse_int(s, n, &v) != 0
                || v < 0 || v > INT32_MAX)
            {
                return msv_doc_fail(d, "logprobs.content: token_id is not "
                                    "a token id");
            }
            if (f->kind == MSV_F_LPENTRY) {
                d->lpe_tok = v;
            }
        } else if (f->key == MSV_K_LOGPROB) {
            if (type != 'n' || msv_parse_num(s, n, &x) != 0) {
                return msv_doc_fail(d, "logprobs.content: logprob is not "
                                    "a number");
            }
            if (f->kind == MSV_F_LPENTRY) {
                d->lpe_lp = x;
            } else {
                d->top_lp = x;
            }
        } else if (f->key == MSV_K_TOPS) {
            return msv_doc_fail(d, "logprobs.content: top_logprobs is not "
                                "an array");
        }
        return 1;

    case MSV_F_TOKENS:
        if (type != 'n' || msv_parse_int(s, n, &v) != 0
            || v < 0 || v > INT32_MAX)
        {
            return msv_doc_fail(d, "token_ids: not a token id");
        }
        msv_i32s_push(&d->tokens, (int32_t) v);
        return 1;

    case MSV_F_ROW:
        if (type != 'n' || msv_parse_int(s, n, &v) != 0
            || v < 0 || v > INT32_MAX)
        {
            return msv_doc_fail(d, "sampling_mask: not a token id");
        }
        nr = d->row_off.n;
        if (d->row_ids.n > (size_t) d->row_off.v[nr - 1]) {
            prev = d->row_ids.v[d->row_ids.n - 1];
            if ((int32_t) v <= prev) {
                return msv_doc_fail(d, "sampling_mask: row ids not "
                                    "ascending and unique");
            }
        }
        msv_i32s_push(&d->row_ids, (int32_t) v);
        return 1;

    case MSV_F_MLPS:
        if (type != 'n' || msv_parse_num(s, n, &x) != 0) {
            return msv_doc_fail(d, "sampling_mask_logprobs: not a "
                                "number");
        }
        if (!(x <= 1e-6)) {
            return msv_doc_fail(d, "sampling_mask_logprobs: a selected "
                                "logprob above 0");
        }
        msv_f64s_push(&d->lp_vals, x);
        d->mlps_num++;
        return 1;

    case MSV_F_LPROW:
        if (type != 'n' || msv_parse_num(s, n, &x) != 0) {
            return msv_doc_fail(d, "sampling_mask_logprobs: not a "
                                "number");
        }
        if (!(x <= 1e-6)) {
            return msv_doc_fail(d, "sampling_mask_logprobs: a support "
                                "logprob above 0");
        }
        msv_f64s_push(&d->lp_vals, x);    /* the row's logsumexp at its end */
        return 1;

    case MSV_F_CHOICES:
        return msv_doc_fail(d, "choices: an element is not an object");

    case MSV_F_MASK:
        return msv_doc_fail(d, "sampling_mask: a row is not an array");
    }

    return 1;
}


static int
msv_cb_null(void *ctx)
{
    return msv_doc_scalar(ctx, '0', NULL, 0);
}


static int
msv_cb_bool(void *ctx, int b)
{
    return msv_doc_scalar(ctx, 'b', NULL, 0);
}


static int
msv_cb_number(void *ctx, const char *s, size_t n)
{
    return msv_doc_scalar(ctx, 'n', s, n);
}


static int
msv_cb_string(void *ctx, const unsigned char *s, size_t n)
{
    return msv_doc_scalar(ctx, 's', (const char *) s, n);
}


static int
msv_cb_start_map(void *ctx)
{
    msv_doc_t    *d = ctx;
    msv_frame_t  *f = msv_doc_top(d);

    if (d->mute) {
        return 1;
    }
    if (f == NULL) {
        if (d->top_done) {
            return msv_doc_fail(d, "two JSON documents in one");
        }
        return msv_doc_push(d, MSV_F_TOP);
    }

    switch (f->kind) {

    case MSV_F_TOP:
        if (f->key == MSV_K_USAGE) {
            return msv_doc_push(d, MSV_F_USAGE);
        }
        if (f->key == MSV_K_ERRORK) {
            d->is_error = 1;
            return msv_doc_push(d, MSV_F_ERROR);
        }
        if (f->key == MSV_K_CHOICES) {
            return msv_doc_fail(d, "choices is not an array");
        }
        return msv_doc_push(d, MSV_F_SKIP);

    case MSV_F_CHOICES:
        if (++d->n_choices > msv_n_of(d->e)) {
            return msv_doc_fail(d, "more than %ld choice%s, n %ld",
                                msv_n_of(d->e), msv_n_of(d->e) > 1 ? "s" : "",
                                msv_n_of(d->e));
        }
        msv_doc_choice_reset(d);
        return msv_doc_push(d, MSV_F_CHOICE);

    case MSV_F_CHOICE:
        if (f->key == MSV_K_PACKED) {
            return msv_doc_push(d, MSV_F_PACKED);
        }
        if (f->key == MSV_K_LOGPROBS) {
            d->has_logprobs = 1;
            return msv_doc_push(d, MSV_F_LOGPROBS);
        }
        if (f->key == MSV_K_TOKEN_IDS || f->key == MSV_K_MASK
            || f->key == MSV_K_MLPS || f->key == MSV_K_FINISH)
        {
            return msv_doc_fail(d, "choices[0]: a field has the wrong "
                                "type");
        }
        return msv_doc_push(d, MSV_F_SKIP);

    case MSV_F_LPCONTENT:
        d->lpe_tok = -1;
        d->lpe_lp = NAN;
        d->lpe_ntop = -1;
        d->lpe_top0 = NAN;
        d->lpe_prev = NAN;
        return msv_doc_push(d, MSV_F_LPENTRY);

    case MSV_F_TOPS:
        d->top_lp = NAN;
        return msv_doc_push(d, MSV_F_TOPENTRY);

    case MSV_F_LOGPROBS:
    case MSV_F_LPENTRY:
    case MSV_F_TOPENTRY:
        if (f->key == MSV_K_CONTENT || f->key == MSV_K_TOPS
            || f->key == MSV_K_TOKEN_ID || f->key == MSV_K_LOGPROB)
        {
            return msv_doc_fail(d, "logprobs: a field has the wrong type");
        }
        return msv_doc_push(d, MSV_F_SKIP);

    case MSV_F_SKIP:
    case MSV_F_USAGE:
    case MSV_F_ERROR:
        return msv_doc_push(d, MSV_F_SKIP);

    default:
        return msv_doc_fail(d, "an object where numbers or rows belong");
    }
}


static int
msv_cb_start_array(void *ctx)
{
    msv_doc_t    *d = ctx;
    msv_frame_t  *f = msv_doc_top(d);

    if (d->mute) {
        return 1;
    }
    if (f == NULL) {
        return msv_doc_fail(d, "a document that is not an object");
    }

    switch (f->kind) {

    case MSV_F_TOP:
        if (f->key == MSV_K_CHOICES) {
            return msv_doc_push(d, MSV_F_CHOICES);
        }
        if (f->key == MSV_K_USAGE || f->key == MSV_K_ERRORK) {
            return msv_doc_fail(d, "usage or error is an array");
        }
        return msv_doc_push(d, MSV_F_SKIP);

    case MSV_F_CHOICE:
        switch (f->key) {
        case MSV_K_TOKEN_IDS:
            d->has_tokens = 1;
            return msv_doc_push(d, MSV_F_TOKENS);
        case MSV_K_LOGPROBS:
            d->has_logprobs = 1;
            return msv_doc_fail(d, "logprobs is not an object");
        case MSV_K_MASK:
            d->has_mask = 1;
            return msv_doc_push(d, MSV_F_MASK);
        case MSV_K_MLPS:
            d->has_mlps = 1;
            return msv_doc_push(d, MSV_F_MLPS);
        case MSV_K_FINISH:
        case MSV_K_INDEX:
            return msv_doc_fail(d, "choices[0]: a field has the wrong "
                                "type");
        default:
            return msv_doc_push(d, MSV_F_SKIP);
        }

    case MSV_F_MASK:
        msv_i32s_push(&d->row_off, (int32_t) d->row_ids.n);
        return msv_doc_push(d, MSV_F_ROW);

    case MSV_F_MLPS:
        d->mlps_arr++;
        d->lp_start = d->lp_vals.n;
        return msv_doc_push(d, MSV_F_LPROW);

    case MSV_F_LOGPROBS:
        if (f->key == MSV_K_CONTENT) {
            d->has_lpcontent = 1;
            return msv_doc_push(d, MSV_F_LPCONTENT);
        }
        return msv_doc_push(d, MSV_F_SKIP);

    case MSV_F_LPENTRY:
    case MSV_F_TOPENTRY:
        if (f->key == MSV_K_TOPS) {
            d->lpe_ntop = 0;
            return msv_doc_push(d, MSV_F_TOPS);
        }
        if (f->key == MSV_K_TOKEN_ID || f->key == MSV_K_LOGPROB) {
            return msv_doc_fail(d, "logprobs: a field has the wrong type");
        }
        return msv_doc_push(d, MSV_F_SKIP);

    case MSV_F_LPCONTENT:
    case MSV_F_TOPS:
        return msv_doc_fail(d, "logprobs.content: an entry is not an "
                            "object");

    case MSV_F_SKIP:
    case MSV_F_USAGE:
    case MSV_F_ERROR:
        return msv_doc_push(d, MSV_F_SKIP);

    default:
        return msv_doc_fail(d, "an array where a number belongs");
    }
}


static int
msv_cb_end(void *ctx)
{
    msv_doc_t  *d = ctx;

    return d->mute ? 1 : msv_doc_pop(d);
}


yajl_callbacks  msv_doc_callbacks = {
    msv_cb_null,
    msv_cb_bool,
    NULL,                           /* integers and doubles come */
    NULL,                           /* through the number callback */
    msv_cb_number,
    msv_cb_string,
    msv_cb_start_map,
    msv_cb_key,
    msv_cb_end,
    msv_cb_start_array,
    msv_cb_end
};


/* Mask logprob i: a packed one as the float32 it is, or a JSON one. */

static double
msv_doc_lp(const msv_doc_t *d, size_t i)
{
    float  x;

    if (d->has_packed) {
        memcpy(&x, d->pk[2].p + 4 * i, 4);
        return x;
    }
    return d->lp_vals.v[i];
}


/* The mask rows against the tokens and the request; 0 or -1. */

static int
msv_doc_check_mask(msv_doc_t *d, const msv_expect_t *e)
{
    size_t   i, r, len, lo, hi, mid, start;
    int32_t  t;
    int      found, mode;
    double   lp;

    mode = msv_mask_of(e->variant);

    if (mode == MSV_MODE_OFF) {
        if (d->has_mask || d->has_mlps) {
            snprintf(d->bad, sizeof(d->bad),
                     "sampling_mask sent although not asked for");
            return -1;
        }
        return 0;
    }

    if (d->has_packed != msv_packed_of(e->variant)) {
        snprintf(d->bad, sizeof(d->bad), "%s mask, %s asked",
                 d->has_packed ? "a packed" : "a JSON",
                 msv_packed_of(e->variant) ? "packed" : "JSON");
        return -1;
    }
    if (!d->has_mask || !d->has_mlps) {
        snprintf(d->bad, sizeof(d->bad), "no sampling_mask%s",
                 d->has_mask ? "_logprobs" : "");
        return -1;
    }
    if (d->has_packed && msv_doc_packed_lps(d, mode) != 0) {
        return -1;
    }
    if (d->row_off.n != d->tokens.n) {
        snprintf(d->bad, sizeof(d->bad), "%zu mask rows for %zu tokens",
                 d->row_off.n, d->tokens.n);
        return -1;
    }
    if (mode == MSV_MODE_SELECTED
        && (d->mlps_arr != 0 || (size_t) d->mlps_num != d->tokens.n))
    {
        snprintf(d->bad, sizeof(d->bad), "selected logprobs: %ld numbers "
                 "and %ld arrays for %zu tokens", d->mlps_num, d->mlps_arr,
                 d->tokens.n);
        return -1;
    }
    if (mode == MSV_MODE_SUPPORT
        && (d->mlps_num != 0 || (size_t) d->mlps_arr != d->tokens.n))
    {
        snprintf(d->bad, sizeof(d->bad), "support logprobs: %ld numbers "
                 "and %ld arrays for %zu tokens", d->mlps_num, d->mlps_arr,
                 d->tokens.n);
        return -1;
    }

    for (r = 0; r < d->row_off.n; r++) {
        start = (size_t) d->row_off.v[r];
        len = (r + 1 < d->row_off.n ? (size_t) d->row_off.v[r + 1]
                                    : d->row_ids.n) - start;
        if (len == 0) {
            snprintf(d->bad, sizeof(d->bad), "mask row %zu is empty", r);
            return -1;
        }
        if (e->top_k > 0 && len > (size_t) e->top_k) {
            snprintf(d->bad, sizeof(d->bad), "mask row %zu has %zu ids, "
                     "top_k %ld", r, len, e->top_k);
            return -1;
        }
        if (e->temperature == 0 && len != 1) {
            snprintf(d->bad, sizeof(d->bad), "greedy mask row %zu has %zu "
                     "ids", r, len);
            return -1;
        }
        /* ascending: the last id is the largest */
        if (e->vocab > 0 && d->row_ids.v[start + len - 1] >= e->vocab) {
            snprintf(d->bad, sizeof(d->bad), "mask row %zu: id %d outside "
                     "the vocabulary of %ld", r,
                     (int) d->row_ids.v[start + len - 1], e->vocab);
            return -1;
        }

        /* the sampled token is in its row (ids ascending: bisect) */
        t = d->tokens.v[r];
        lo = start;
        hi = start + len;
        found = 0;
        mid = start;
        while (lo < hi) {
            mid = lo + (hi - lo) / 2;
            if (d->row_ids.v[mid] == t) {
                found = 1;
                break;
            }
            if (d->row_ids.v[mid] < t) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if (!found) {
            snprintf(d->bad, sizeof(d->bad), "sampled token %d is not in "
                     "its mask row", (int) t);
            return -1;
        }

        if (mode == MSV_MODE_SUPPORT) {
            i = r;
            if ((size_t) d->lprow_len.v[i] != len) {
                snprintf(d->bad, sizeof(d->bad), "support logprobs row %zu: "
                         "%d values for %zu ids", r, (int) d->lprow_len.v[i],
                         len);
                return -1;
            }
            if (fabs(d->lprow_lse.v[i]) > 1e-4) {
                snprintf(d->bad, sizeof(d->bad), "support logprobs row %zu: "
                         "logsumexp %.3g, expected 0", r, d->lprow_lse.v[i]);
                return -1;
            }
            /* the rows so far have as many values as ids: aligned */
            lp = msv_doc_lp(d, mid);

            /* what logprobs.content says of the sampled token, when sent */
            if (r < d->lpc_lp.n && fabs(d->lpc_lp.v[r] - lp) > 1e-6) {
                snprintf(d->bad, sizeof(d->bad), "row %zu: logprobs.content "
                         "logprob %.9g, the support's %.9g", r,
                         d->lpc_lp.v[r], lp);
                return -1;
            }
        } else {
            lp = msv_doc_lp(d, r);
        }
        if (e->temperature == 0 && fabs(lp) > 1e-6) {
            snprintf(d->bad, sizeof(d->bad), "greedy mask row %zu: logprob "
                     "%.9g, expected 0", r, lp);
            return -1;
        }
    }

    return 0;
}


/* logprobs.content against the tokens and sampling_params.logprobs. */

static int
msv_doc_check_logprobs(msv_doc_t *d, const msv_expect_t *e)
{
    size_t  i;

    if (e->logprobs < 0) {
        if (d->has_logprobs) {
            snprintf(d->bad, sizeof(d->bad),
                     "logprobs sent although not asked for");
            return -1;
        }
        return 0;
    }
    if (!d->has_lpcontent) {
        snprintf(d->bad, sizeof(d->bad), "no logprobs.content");
        return -1;
    }
    if (d->lpc_tok.n != d->tokens.n) {
        snprintf(d->bad, sizeof(d->bad), "logprobs.content: %zu entries for "
                 "%zu tokens", d->lpc_tok.n, d->tokens.n);
        return -1;
    }
    for (i = 0; i < d->lpc_tok.n; i++) {
        if (d->lpc_tok.v[i] != d->tokens.v[i]) {
            snprintf(d->bad, sizeof(d->bad), "logprobs.content[%zu]: "
                     "token_id %d, sampled %d", i, (int) d->lpc_tok.v[i],
                     (int) d->tokens.v[i]);
            return -1;
        }
        if (d->lpc_ntop.v[i] > e->logprobs) {
            snprintf(d->bad, sizeof(d->bad), "logprobs.content[%zu]: %d "
                     "top_logprobs, %ld asked", i, (int) d->lpc_ntop.v[i],
                     e->logprobs);
            return -1;
        }
    }
    return 0;
}


/* Checks of one choice against the request, once it is parsed.
 * Returns 0 or -1 with d->bad set. */

static int
msv_choice_check(msv_doc_t *d, const msv_expect_t *e)
{
    size_t  i;

    if (d->finish == 0) {
        snprintf(d->bad, sizeof(d->bad), "no finish_reason in choices[%ld]",
                 d->n_choices - 1);
        return -1;
    }
    if (e->whole) {
        if (!d->has_tokens) {
            snprintf(d->bad, sizeof(d->bad), "no token_ids");
            return -1;
        }
        if (d->finish != 2
            || (strcmp(d->finish_str, "stop") != 0
                && strcmp(d->finish_str, "length") != 0
                && strcmp(d->finish_str, "abort") != 0))
        {
            snprintf(d->bad, sizeof(d->bad), "finish_reason %s%s%s",
                     d->finish == 2 ? "\"" : "",
                     d->finish == 2 ? d->finish_str : "null",
                     d->finish == 2 ? "\"" : "");
            return -1;
        }
    }
    if (e->max_tokens >= 0 && d->tokens.n > (size_t) e->max_tokens) {
        snprintf(d->bad, sizeof(d->bad), "more tokens (%zu) than max_tokens "
                 "%ld", d->tokens.n, e->max_tokens);
        return -1;
    }
    for (i = 0; e->vocab > 0 && i < d->tokens.n; i++) {
        if (d->tokens.v[i] >= e->vocab) {
            snprintf(d->bad, sizeof(d->bad), "token %d outside the "
                     "vocabulary of %ld", (int) d->tokens.v[i], e->vocab);
            return -1;
        }
    }

    if (msv_doc_check_mask(d, e) != 0) {
        return -1;
    }
    return msv_doc_check_logprobs(d, e);
}


/*
 * A choice ends: its index once in the document, its checks, and its
 * summary kept (counts, hashes, finish_reason) before the next choice
 * reuses the fields.  Returns 1, or 0 (stops the parser) with d->bad set.
 */

static int
msv_doc_choice_end(msv_doc_t *d)
{
    msv_choice_t  *c;
    size_t         r, start, end;
    int32_t        len;
    long           idx = d->index;
    char           why[MSV_CHECK_ERR_MAX];

    if (idx < 0) {
        if (msv_n_of(d->e) > 1) {
            return msv_doc_fail(d, "choices[%ld] has no index (n %ld)",
                                d->n_choices - 1, msv_n_of(d->e));
        }
        idx = 0;                    /* one choice: the index may be left out */
    }
    if (d->ch_seen.p[idx]) {
        return msv_doc_fail(d, "choice index %ld twice", idx);
    }
    d->ch_seen.p[idx] = 1;

    if (msv_choice_check(d, d->e) != 0) {
        if (msv_n_of(d->e) > 1) {
            snprintf(why, sizeof(why), "%s", d->bad);
            snprintf(d->bad, sizeof(d->bad), "choice %ld: %.200s", idx, why);
        }
        return 0;
    }

    if ((size_t) d->n_choices > d->ch_cap) {
        d->ch = msv_grow(d->ch, &d->ch_cap, (size_t) d->n_choices,
                         sizeof(msv_choice_t));
    }
    c = &d->ch[d->n_choices - 1];
    c->index = idx;
    c->n_tokens = (long) d->tokens.n;
    c->n_rows = (long) d->row_off.n;
    c->n_mask_ids = (long long) d->row_ids.n;
    c->finish = d->finish;
    memcpy(c->finish_str, d->finish_str, sizeof(c->finish_str));

    c->hpow = 1;
    c->hash = msv_hash_i32s(0, &c->hpow, d->tokens.v, d->tokens.n);
    /* row by row, length then ids: the same whatever the events */
    c->mhash = 0;
    c->mpow = 1;
    for (r = 0; r < d->row_off.n; r++) {
        start = (size_t) d->row_off.v[r];
        end = r + 1 < d->row_off.n ? (size_t) d->row_off.v[r + 1]
                                   : d->row_ids.n;
        len = (int32_t) (end - start);
        c->mhash = msv_hash_i32s(c->mhash, &c->mpow, &len, 1);
        c->mhash = msv_hash_i32s(c->mhash, &c->mpow, d->row_ids.v + start,
                                 end - start);
    }
    return 1;
}


/*
 * The polynomial hash (check.h) over n more values: four a step, h * P^4
 * plus the four values times P^3 .. P^0, so that the multiplications of
 * a step do not wait on each other, only the one by P^4 on the step
 * before (the same sum, modulo 2^64, as one value at a time).
 */

uint64_t
msv_hash_i32s(uint64_t h, uint64_t *pow, const int32_t *v, size_t n)
{
    const uint64_t  p1 = MSV_HASH_P, p2 = p1 * p1, p3 = p2 * p1,
                    p4 = p2 * p2;
    uint64_t        pw = *pow;
    size_t          i;

    for (i = 0; i + 4 <= n; i += 4) {
        h = h * p4 + ((uint64_t) (uint32_t) v[i] + 1) * p3
            + ((uint64_t) (uint32_t) v[i + 1] + 1) * p2
            + ((uint64_t) (uint32_t) v[i + 2] + 1) * p1
            + (uint64_t) (uint32_t) v[i + 3] + 1;
        pw *= p4;
    }
    for ( /* void */ ; i < n; i++) {
        h = h * p1 + (uint64_t) (uint32_t) v[i] + 1;
        pw *= p1;
    }
    *pow = pw;
    return h;
}


/* Checks of the whole document once parsed (each choice was checked as it
 * ended).  Returns 0 or -1 with d->bad set. */

int
msv_doc_check(msv_doc_t *d)
{
    const msv_expect_t  *e = d->e;
    long                 n = msv_n_of(e), k;

    if (d->is_error) {
        snprintf(d->bad, sizeof(d->bad), "error event: %.200s",
                 d->error[0] ? d->error : "(no message)");
        return -1;
    }
    if (n == 1 && d->n_choices != 1) {
        snprintf(d->bad, sizeof(d->bad), "%ld choices, expected 1",
                 d->n_choices);
        return -1;
    }
    if (e->whole && d->n_choices != n) {
        snprintf(d->bad, sizeof(d->bad), "%ld choices, expected %ld (n)",
                 d->n_choices, n);
        return -1;
    }
    if (d->n_choices < 1) {
        snprintf(d->bad, sizeof(d->bad), "an event without choices");
        return -1;
    }
    /* each index once (checked as they came), and in order when whole */
    for (k = 0; e->whole && k < d->n_choices; k++) {
        if (d->ch[k].index != k) {
            snprintf(d->bad, sizeof(d->bad), "choices[%ld].index is %ld",
                     k, d->ch[k].index);
            return -1;
        }
    }
    return 0;
}


void
msv_doc_free(msv_doc_t *d)
{
    free(d->tokens.v);
    free(d->row_ids.v);
    free(d->row_off.v);
    free(d->lprow_len.v);
    free(d->lprow_lse.v);
    free(d->lp_vals.v);
    free(d->lpc_tok.v);
    free(d->lpc_lp.v);
    free(d->lpc_ntop.v);
    free(d->pk[0].p);
    free(d->pk[1].p);
    free(d->pk[2].p);
    free(d->ch);
    free(d->ch_seen.p);
}
