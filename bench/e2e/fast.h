/*
 * fast.h: the values of a choice that the checker reads straight from the
 * text, not through yajl: the rows of sampling_mask and
 * sampling_mask_logprobs (JSON numbers) and the base64 strings of
 * sampling_mask_packed.  They are nearly all of a body with masks, and
 * yajl's lexer, with a callback per number, or its copy of a long string
 * and the scan of each of its bytes, cost most of the checking.
 *
 * resp.c starts one where scan.c finds a candidate and check.c's frame
 * says the value is one of those (msv_fast_begin), then gives it the
 * bytes that follow, piece by piece, until the value ends.  What it reads
 * goes into the msv_doc_t through the same callbacks yajl would call
 * (msv_doc_callbacks), in the same order, save the numbers and strings it
 * takes itself, which it checks as the callbacks would; anything else it
 * hands back to yajl (MSV_FAST_BACK): from the first byte it does not
 * take (whitespace, a number of another form, a string with an escape or
 * not in base64 ...), with the text that puts yajl where the value has
 * got to, muted (f->mute: only brackets, which the callbacks ignore while
 * msv_doc_t.mute is set), then f->real, bytes that yajl must parse as
 * they came (a number cut by a piece's end, a base64 string's beginning,
 * written again).  So every document gets the verdict, and the message,
 * that yajl and the callbacks alone would give it.
 */

#ifndef MSV_E2E_FAST_H
#define MSV_E2E_FAST_H

#include <stddef.h>

#include "array.h"
#include "check.h"


#define MSV_FAST_TOKEN_MAX  64      /* a number cut by a piece's end */

typedef struct {
    int           kind;             /* MSV_FAST_ARRAY, _B64; 0: none */
    int           at;               /* array: where in it (fast.c) */

    /* a base64 string: the packed array (0, 1, 2), the bytes decoded and
     * the characters taken, those of a group not yet whole and the '='
     * after them */
    int           key;
    size_t        got;
    size_t        chars;
    char          grp[4];
    int           grp_n;
    int           pads;

    char          tok[MSV_FAST_TOKEN_MAX];
    size_t        tok_n;

    /* what to feed yajl (MSV_FAST_DONE, MSV_FAST_BACK) */
    const char   *mute;
    msv_bytes_t   real;
} msv_fast_t;

enum {
    MSV_FAST_ARRAY = 1,
    MSV_FAST_B64
};

/* what msv_fast_feed says */
enum {
    MSV_FAST_MORE = 0,              /* every byte taken: the value goes on */
    MSV_FAST_DONE,                  /* the value ended: yajl gets f->mute,
                                       its stand-in */
    MSV_FAST_BACK,                  /* yajl goes on: f->mute, f->real, then
                                       the bytes from *used on */
    MSV_FAST_FAIL                   /* a check failed: d->bad */
};


/*
 * A value begins with byte c, after a key that scan.c found and yajl
 * parsed; 1 when it is one of ours (f is then set up for it and takes
 * the value from its first byte), 0 when yajl is to parse it.
 */
int msv_fast_begin(msv_fast_t *f, const msv_doc_t *d, int c);

/* The next n bytes of the value; *used: how many it took.  MSV_FAST_*. */
int msv_fast_feed(msv_fast_t *f, msv_doc_t *d, const char *p, size_t n,
    size_t *used);

/* The document ended inside the value: hand it back (MSV_FAST_BACK). */
int msv_fast_stop(msv_fast_t *f, msv_doc_t *d);

void msv_fast_free(msv_fast_t *f);


#endif /* MSV_E2E_FAST_H */
