/*
 * resp.h: one response of POST /inference/v1/generate, checked as it
 * arrives and as a whole.  Its decoded body, one JSON document or an SSE
 * stream that sse.c splits into events of one document each, goes
 * through check.c document by document; what spans the events is checked
 * here, per choice (sampling_params.n of them, by index): nothing of a
 * choice after the event with its finish_reason, usage in the event that
 * ends the last one and only there, the stream's data: [DONE], and at the
 * end the counts against the request (usage over every choice; per
 * choice max_tokens, ignore_eos, a mask row per token).  The load client
 * (load.c) and bench/e2e_check.c use it.
 */

#ifndef MSV_E2E_RESP_H
#define MSV_E2E_RESP_H

#include <stddef.h>
#include <stdint.h>

#include <yajl/yajl_parse.h>

#include "array.h"
#include "check.h"
#include "fast.h"
#include "scan.h"
#include "sse.h"


/* one choice over the events */
typedef struct {
    long           n_tokens;
    long           n_rows;
    uint64_t       hash;            /* check.c's polynomial hashes of its */
    uint64_t       mhash;           /* tokens and rows, events joined */
    int            final_seen;
    char           finish[16];
} msv_resp_choice_t;

struct msv_resp_s {
    /* what was asked: set before the first byte, kept by msv_resp_reset */
    msv_expect_t   e;               /* for each document; e.n choices */
    int            stream;
    long           prompt_len;      /* -1: not checked */
    long           max_tokens;      /* -1: not checked */
    int            ignore_eos;
    int            abort_ok;        /* finish_reason "abort" is valid */
    double       (*clock)(void);    /* stamps t_first; NULL: none */
    int            no_fast;         /* every byte through yajl, none
                                       through fast.c (tests compare) */

    double         t_first;         /* first event (or first byte) */
    msv_sse_t      sse;

    /* JSON of the body (non-streaming) or of the current event: its
     * bytes go to yajl in pieces of a size that grows with the document
     * (msv_resp_json), held in stage until then, save the mask values
     * that fast.c reads where scan.c finds them */
    yajl_handle    yh;
    msv_doc_t      doc;
    msv_bytes_t    stage;
    size_t         fed;             /* bytes of the document parsed */
    msv_scan_t     scan;
    msv_fast_t     fast;

    /* accumulated over the events, all choices */
    long           n_events;
    long           n_tokens;
    long           n_rows;
    long long      n_mask_ids;
    long           n_final;         /* choices that ended */
    int            done_seen;
    long           completion_tokens;
    long           prompt_tokens;
    msv_resp_choice_t  *ch;         /* per choice index: e.n of them */
    size_t         ch_cap;

    /* set by msv_resp_check: of the choices in index order */
    uint64_t       hash;            /* their token ids */
    uint64_t       mhash;           /* their rows' lengths and ids */

    /* the first problem found */
    char           bad[MSV_CHECK_ERR_MAX];
};


/* The number of choices asked. */
static inline long
msv_resp_n(const msv_resp_t *r)
{
    return r->e.n > 1 ? r->e.n : 1;
}

/* Ready for the next response (keeps what was asked, and the memory). */
void msv_resp_reset(msv_resp_t *r);

/* The connection is gone: drop a document half parsed. */
void msv_resp_stop(msv_resp_t *r);

void msv_resp_free(msv_resp_t *r);

/* Record the first problem (later ones are dropped); returns -1. */
int msv_resp_fail(msv_resp_t *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Decoded body bytes of a 200 response; 0, or -1 with r->bad set. */
int msv_resp_data(msv_resp_t *r, const char *p, size_t n);

/* The body is complete; 0, or -1 with r->bad set. */
int msv_resp_end(msv_resp_t *r);

/* The checks over the whole response, once it ended; 0 or -1. */
int msv_resp_check(msv_resp_t *r);

/* JSON bytes of the body or of an event (end: the document is over);
 * for sse.c.  0, or -1 with r->bad set. */
int msv_resp_json(msv_resp_t *r, const char *p, size_t n, int end);


#endif /* MSV_E2E_RESP_H */
