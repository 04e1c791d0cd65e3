/*
 * fast.c: mask values read straight from the text (see fast.h).
 *
 * An array value (sampling_mask, sampling_mask_logprobs) is followed
 * token by token: '[', ']', ',' and numbers, nothing else, with no
 * whitespace; where it is is one of MSV_AT_*, and yajl's state there
 * (before the value: yajl has parsed up to its key) is reached again by
 * msv_fast_mute_at[at], brackets that stand for what was read.  The
 * brackets go through the callbacks as yajl would send them; a number of
 * the form the server writes (a token id of digits only, a logprob that
 * msv_parse_num converts without strtod), that passes its check, is added
 * to the row here, by loops that take a row's numbers one after another
 * (msv_fast_ids, msv_fast_lps); any other number goes to the number
 * callback, which checks it, and fails, as before.  A number cut by the
 * end of a piece waits in f->tok; any other byte hands the array back to
 * yajl where it is.
 *
 * A base64 string is decoded as it comes, whole groups at a time
 * (b64dec.c), into check.c's place for it; a group not yet whole waits
 * in f->grp.  The first character that is not in the alphabet (an
 * escape, a control character, '=' before the end ...) hands the string
 * back to yajl: its characters so far are written again (the decoded
 * groups encoded: base64 groups and their bytes map one to one) and yajl
 * parses the string whole, as before.  At the closing quote the verdict
 * is msv_b64_decode's: the groups before the last are valid (each
 * checked), and the last, with its padding, goes through it.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "msv_b64.h"
#include "b64dec.h"
#include "fast.h"
#include "num.h"


/* where in an array value */
enum {
    MSV_AT_START = 0,               /* before its '[' */
    MSV_AT_OUTER_FIRST,             /* after it: a row, a number, ']' */
    MSV_AT_OUTER_NEXT,              /* after a ',': a row or a number */
    MSV_AT_OUTER_AFTER,             /* after an element: ',' or ']' */
    MSV_AT_ROW_FIRST,               /* the same inside a row */
    MSV_AT_ROW_NEXT,
    MSV_AT_ROW_AFTER
};

/* yajl's state at each place, from before the value (inner "[]" stand
 * for elements) */
static const char  *msv_fast_mute_at[] = {
    "", "[", "[[],", "[[]", "[[", "[[[],", "[[[]"
};

/* a base64 string: before its opening quote, after it */
enum {
    MSV_AT_QUOTE = 0,
    MSV_AT_TEXT
};


int
msv_fast_begin(msv_fast_t *f, const msv_doc_t *d, int c)
{
    const msv_frame_t  *t;

    if (d->depth == 0 || d->bad[0] != '\0') {
        return 0;
    }
    t = &d->stack[d->depth - 1];

    if (t->kind == MSV_F_CHOICE && c == '['
        && (t->key == MSV_K_MASK || t->key == MSV_K_MLPS))
    {
        f->kind = MSV_FAST_ARRAY;
        f->at = MSV_AT_START;
        f->tok_n = 0;
        return 1;
    }

    if (t->kind == MSV_F_PACKED && c == '"'
        && t->key >= MSV_K_PLENGTHS && t->key <= MSV_K_PLPS)
    {
        f->kind = MSV_FAST_B64;
        f->at = MSV_AT_QUOTE;
        f->key = t->key - MSV_K_PLENGTHS;
        f->got = 0;
        f->chars = 0;
        f->grp_n = 0;
        f->pads = 0;
        return 1;
    }

    return 0;
}


/* ------------------------------------------------------------------ */
/* Arrays                                                               */

/*
 * A number token of n bytes in the row (or array) on top: taken here
 * when it has the server's form and passes, otherwise given to the
 * number callback.  1, or 0 when a check failed.
 */

static int
msv_fast_take(msv_doc_t *d, const char *s, size_t n, int flags)
{
    msv_frame_t  *t = &d->stack[d->depth - 1];
    uint64_t      v;
    size_t        i;
    double        x;
    int32_t       first;

    switch (t->kind) {

    case MSV_F_ROW:
        if (!(flags & MSV_NUM_PLAIN) || n > 10) {
            break;
        }
        for (v = 0, i = 0; i < n; i++) {
            v = v * 10 + (uint64_t) (s[i] - '0');
        }
        first = d->row_off.v[d->row_off.n - 1];
        if (v > INT32_MAX
            || (d->row_ids.n > (size_t) first
                && (int32_t) v <= d->row_ids.v[d->row_ids.n - 1]))
        {
            break;                  /* the callback says what is wrong */
        }
        msv_i32s_push(&d->row_ids, (int32_t) v);
        return 1;

    case MSV_F_LPROW:
    case MSV_F_MLPS:
        if (msv_parse_num(s, n, &x) != 0 || !(x <= 1e-6)) {
            break;
        }
        msv_f64s_push(&d->lp_vals, x);
        d->mlps_num += t->kind == MSV_F_MLPS;
        return 1;

    default:
        break;
    }

    return msv_doc_callbacks.yajl_number(d, s, n);
}


static int
msv_fast_numchar(char c)
{
    return (unsigned char) (c - '0') <= 9 || c == '-' || c == '+' || c == '.'
           || c == 'e' || c == 'E';
}


/* hand the array back at its current place, with f->tok to parse */
static int
msv_fast_array_back(msv_fast_t *f)
{
    f->mute = msv_fast_mute_at[f->at];
    f->real.n = 0;
    if (f->tok_n) {
        msv_bytes_add(&f->real, f->tok, f->tok_n);
        f->tok_n = 0;
    }
    f->kind = 0;
    return MSV_FAST_BACK;
}


/*
 * The number that the last piece ended in (f->tok), with the bytes of
 * this one: *i past them once it is whole.  MSV_FAST_MORE: go on (taken,
 * or still cut: *i == n); otherwise what msv_fast_feed says.
 */

static int
msv_fast_cut_number(msv_fast_t *f, msv_doc_t *d, const char *p, size_t n,
    size_t *i)
{
    size_t  j = 0, len;
    int     flags;

    while (j < n && msv_fast_numchar(p[j])
           && f->tok_n < MSV_FAST_TOKEN_MAX - 1)
    {
        f->tok[f->tok_n++] = p[j++];
    }
    *i = j;
    if (j == n) {
        return MSV_FAST_MORE;
    }
    if (msv_fast_numchar(p[j])) {
        return msv_fast_array_back(f);      /* too long for us */
    }

    f->tok[f->tok_n] = p[j];                /* what ends it */
    if (msv_lex_num(f->tok, f->tok + f->tok_n + 1, &len, &flags)
            != MSV_NUM_OK
        || len != f->tok_n || (p[j] != ',' && p[j] != ']'))
    {
        return msv_fast_array_back(f);
    }
    if (!msv_fast_take(d, f->tok, len, flags)) {
        return MSV_FAST_FAIL;
    }
    f->tok_n = 0;
    f->at = f->at == MSV_AT_ROW_FIRST || f->at == MSV_AT_ROW_NEXT
            ? MSV_AT_ROW_AFTER : MSV_AT_OUTER_AFTER;
    return MSV_FAST_MORE;
}


/*
 * A number at p[*i], in a row or in the outer array (after).  MSV_FAST_MORE
 * when taken (*i past it) or cut by the end (kept in f->tok, *i = n);
 * otherwise what msv_fast_feed says.
 */

static int
msv_fast_number(msv_fast_t *f, msv_doc_t *d, const char *p, size_t n,
    size_t *i, int after)
{
    size_t  len;
    int     flags, rc;

    rc = msv_lex_num(p + *i, p + n, &len, &flags);

    if (rc == MSV_NUM_MORE && n - *i < MSV_FAST_TOKEN_MAX - 1) {
        memcpy(f->tok, p + *i, n - *i);
        f->tok_n = n - *i;
        *i = n;
        return MSV_FAST_MORE;
    }
    if (rc != MSV_NUM_OK || (p[*i + len] != ',' && p[*i + len] != ']')) {
        return msv_fast_array_back(f);
    }
    if (!msv_fast_take(d, p + *i, len, flags)) {
        return MSV_FAST_FAIL;
    }
    *i += len;
    f->at = after;
    return MSV_FAST_MORE;
}


/*
 * The loops for the rows as the server writes them, one element a step,
 * with what msv_fast_take does for an element inlined: from p[i], while
 * each element is a number of the server's form that passes, followed by
 * ',' or ']' (before n); f->at is set past each.  Returns where they
 * stopped; msv_fast_array goes on from there, one token at a time.  At
 * most MSV_FAST_STEP elements a call, so that the room they make ahead
 * stays small whatever the size of the piece.
 */

#define MSV_FAST_STEP  4096

static size_t
msv_fast_ids(msv_fast_t *f, msv_doc_t *d, const char *p, size_t n, size_t i)
{
    msv_i32s_t  *a = &d->row_ids;
    const char  *s;
    size_t       j, k, room;
    uint64_t     v;
    int64_t      prev;
    int32_t     *out;

    /* the row's last id so far; -1: none yet */
    prev = a->n > (size_t) d->row_off.v[d->row_off.n - 1]
           ? a->v[a->n - 1] : -1;

    /* room for as many ids as these bytes may hold (2 bytes each at
     * least), up to MSV_FAST_STEP */
    room = (n - i) / 2 < MSV_FAST_STEP ? (n - i) / 2 : MSV_FAST_STEP;
    if (a->n + room > a->cap) {
        a->v = msv_grow(a->v, &a->cap, a->n + room, sizeof(int32_t));
    }
    out = a->v + a->n;
    k = 0;

    while (k < room && n - i >= 16) {
        s = p + i;
        if ((unsigned char) (s[0] - '1') > 8) {
            break;                  /* 0, a sign, or no number */
        }
        j = msv_digits8(s, &v);     /* ids have at most 6 digits */
        if (j == 8 || (s[j] != ',' && s[j] != ']') || (int64_t) v <= prev) {
            break;                  /* msv_fast_number sees to it */
        }
        out[k++] = (int32_t) v;
        prev = (int64_t) v;

        if (s[j] == ']') {
            f->at = MSV_AT_ROW_AFTER;
            i += j;
            break;
        }
        f->at = MSV_AT_ROW_NEXT;
        i += j + 1;
    }

    a->n += k;
    return i;
}


static size_t
msv_fast_lps(msv_fast_t *f, msv_doc_t *d, const char *p, size_t n, size_t i,
    int sel)
{
    msv_f64s_t  *a = &d->lp_vals;
    size_t       len, k, room;
    double       x, *out;

    room = (n - i) / 2 < MSV_FAST_STEP ? (n - i) / 2 : MSV_FAST_STEP;
    if (a->n + room > a->cap) {
        a->v = msv_grow(a->v, &a->cap, a->n + room, sizeof(double));
    }
    out = a->v + a->n;
    k = 0;

    while (k < room) {
        if (msv_lex_f64(p + i, p + n, &len, &x) != MSV_NUM_OK
            || (p[i + len] != ',' && p[i + len] != ']') || !(x <= 1e-6))
        {
            break;
        }
        out[k++] = x;

        if (p[i + len] == ']') {
            f->at = sel ? MSV_AT_OUTER_AFTER : MSV_AT_ROW_AFTER;
            i += len;
            break;
        }
        f->at = sel ? MSV_AT_OUTER_NEXT : MSV_AT_ROW_NEXT;
        i += len + 1;
    }

    a->n += k;
    d->mlps_num += sel ? (long) k : 0;
    return i;
}


/* The fast loop for the top frame, at an element; where it stopped. */

static size_t
msv_fast_run(msv_fast_t *f, msv_doc_t *d, const char *p, size_t n, size_t i)
{
    switch (d->stack[d->depth - 1].kind) {
    case MSV_F_ROW:
        return msv_fast_ids(f, d, p, n, i);
    case MSV_F_LPROW:
        return msv_fast_lps(f, d, p, n, i, 0);
    case MSV_F_MLPS:
        return p[i] == '[' ? i : msv_fast_lps(f, d, p, n, i, 1);
    default:
        return i;
    }
}


static int
msv_fast_array(msv_fast_t *f, msv_doc_t *d, const char *p, size_t n,
    size_t *used)
{
    size_t  i = 0, k;
    int     rc = MSV_FAST_MORE;

    if (f->tok_n) {
        rc = msv_fast_cut_number(f, d, p, n, &i);
    }

    while (rc == MSV_FAST_MORE && i < n) {

        switch (f->at) {

        case MSV_AT_START:
            /* p[i] is '[' (msv_fast_begin) */
        case MSV_AT_OUTER_FIRST:
        case MSV_AT_OUTER_NEXT:
            if (p[i] == '[') {
                if (!msv_doc_callbacks.yajl_start_array(d)) {
                    rc = MSV_FAST_FAIL;
                    break;
                }
                f->at = f->at == MSV_AT_START ? MSV_AT_OUTER_FIRST
                                              : MSV_AT_ROW_FIRST;
                i++;
            } else if (p[i] == ']' && f->at == MSV_AT_OUTER_FIRST) {
                goto end;
            } else if (f->at != MSV_AT_START
                       && (k = msv_fast_run(f, d, p, n, i)) != i)
            {
                i = k;
            } else {
                rc = msv_fast_number(f, d, p, n, &i, MSV_AT_OUTER_AFTER);
            }
            break;

        case MSV_AT_OUTER_AFTER:
            if (p[i] == ',') {
                f->at = MSV_AT_OUTER_NEXT;
                i++;
            } else if (p[i] == ']') {
                goto end;
            } else {
                rc = msv_fast_array_back(f);
            }
            break;

        case MSV_AT_ROW_FIRST:
        case MSV_AT_ROW_NEXT:
            if (p[i] == ']' && f->at == MSV_AT_ROW_FIRST) {
                goto row_end;
            }
            k = msv_fast_run(f, d, p, n, i);
            if (k != i) {
                i = k;
            } else {
                rc = msv_fast_number(f, d, p, n, &i, MSV_AT_ROW_AFTER);
            }
            break;

        case MSV_AT_ROW_AFTER:
            if (p[i] == ',') {
                f->at = MSV_AT_ROW_NEXT;
                i++;
            } else if (p[i] == ']') {
                goto row_end;
            } else {
                rc = msv_fast_array_back(f);
            }
            break;
        }
        continue;

    row_end:
        if (!msv_doc_callbacks.yajl_end_array(d)) {
            rc = MSV_FAST_FAIL;
            break;
        }
        f->at = MSV_AT_OUTER_AFTER;
        i++;
    }

    *used = i;
    return rc;

end:
    /* the value's ']' */
    *used = i + 1;
    if (!msv_doc_callbacks.yajl_end_array(d)) {
        return MSV_FAST_FAIL;
    }
    f->mute = "[]";
    f->kind = 0;
    return MSV_FAST_DONE;
}


/* ------------------------------------------------------------------ */
/* Base64 strings                                                       */

static int
msv_fast_b64char(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')
           || (c >= '0' && c <= '9') || c == '+' || c == '/';
}


/* hand the string back: its characters so far, written again */
static int
msv_fast_b64_back(msv_fast_t *f, msv_doc_t *d)
{
    const char  *out;
    char        *e;
    msv_b64_t    st;
    int          k;

    f->mute = "";
    f->real.n = 0;
    f->kind = 0;
    if (f->at == MSV_AT_QUOTE) {
        return MSV_FAST_BACK;               /* nothing taken */
    }

    msv_bytes_add(&f->real, "\"", 1);
    if (f->real.n + msv_b64_len(f->got) + 1 > f->real.cap) {
        f->real.p = msv_grow(f->real.p, &f->real.cap,
                             f->real.n + msv_b64_len(f->got) + 1, 1);
    }
    out = msv_doc_b64_room(d, f->key, f->got);
    msv_b64_init(&st, 0);
    e = msv_b64_put(&st, f->real.p + f->real.n, out, f->got);
    f->real.n = (size_t) (e - f->real.p);
    msv_bytes_add(&f->real, f->grp, (size_t) f->grp_n);
    for (k = 0; k < f->pads; k++) {
        msv_bytes_add(&f->real, "=", 1);
    }
    return MSV_FAST_BACK;
}


/* The closing quote: the verdict on the string. */

static int
msv_fast_b64_end(msv_fast_t *f, msv_doc_t *d)
{
    char   last[4], *out;
    long   got, r;

    if (f->pads) {
        got = -1;
        if (f->grp_n + f->pads == 4) {
            memcpy(last, f->grp, (size_t) f->grp_n);
            memset(last + f->grp_n, '=', (size_t) f->pads);
            out = msv_doc_b64_room(d, f->key, f->got + 3);
            r = msv_b64_decode(last, 4, out + f->got);
            got = r < 0 ? -1 : (long) f->got + r;
        }
    } else {
        got = f->grp_n ? -1 : (long) f->got;
    }

    f->kind = 0;
    if (!msv_doc_b64_done(d, f->key, got, f->chars)) {
        return MSV_FAST_FAIL;
    }
    f->mute = "\"\"";
    return MSV_FAST_DONE;
}


static int
msv_fast_b64(msv_fast_t *f, msv_doc_t *d, const char *p, size_t n,
    size_t *used)
{
    const char  *q;
    char        *out;
    size_t       i = 0, lim, k, dec;
    char         c;

    if (f->at == MSV_AT_QUOTE) {
        f->at = MSV_AT_TEXT;                /* p[0] is '"' */
        i = 1;
    }

    while (i < n) {

        /* whole groups, up to the closing quote */
        if (f->grp_n == 0 && f->pads == 0) {
            q = memchr(p + i, '"', n - i);
            lim = q ? (size_t) (q - p) : n;
            k = (lim - i) / 4 * 4;
            if (k) {
                out = msv_doc_b64_room(d, f->key, f->got + k / 4 * 3);
                dec = msv_b64dec_groups(p + i, k, (uint8_t *) out + f->got);
                f->got += dec / 4 * 3;
                f->chars += dec;
                i += dec;
                if (i == n) {
                    break;
                }
            }
        }

        /* one character: of a group, padding, or the end */
        c = p[i];
        if (c == '"') {
            *used = i + 1;
            return msv_fast_b64_end(f, d);
        }
        if (f->pads == 0 && msv_fast_b64char(c)) {
            f->grp[f->grp_n++] = c;
            if (f->grp_n == 4) {
                out = msv_doc_b64_room(d, f->key, f->got + 3);
                msv_b64dec_groups(f->grp, 4, (uint8_t *) out + f->got);
                f->got += 3;
                f->grp_n = 0;
            }
        } else if (c == '=' && f->grp_n + f->pads < 4) {
            f->pads++;
        } else {
            *used = i;
            return msv_fast_b64_back(f, d);
        }
        f->chars++;
        i++;
    }

    *used = n;
    return MSV_FAST_MORE;
}


/* ------------------------------------------------------------------ */

int
msv_fast_feed(msv_fast_t *f, msv_doc_t *d, const char *p, size_t n,
    size_t *used)
{
    return f->kind == MSV_FAST_ARRAY ? msv_fast_array(f, d, p, n, used)
                                     : msv_fast_b64(f, d, p, n, used);
}


int
msv_fast_stop(msv_fast_t *f, msv_doc_t *d)
{
    return f->kind == MSV_FAST_ARRAY ? msv_fast_array_back(f)
                                     : msv_fast_b64_back(f, d);
}


void
msv_fast_free(msv_fast_t *f)
{
    free(f->real.p);
    memset(&f->real, 0, sizeof(f->real));
}
