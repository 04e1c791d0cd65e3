/*
 * sse.h: the SSE splitter of the e2e clients.  Decoded body bytes of a
 * stream go in; each event's data is fed to the response's JSON parser
 * (resp.c: msv_resp_json) as it arrives, and a complete event is taken
 * as a whole: JSON, or the final data: [DONE].
 */

#ifndef MSV_E2E_SSE_H
#define MSV_E2E_SSE_H

#include <stddef.h>

#include "array.h"


typedef enum {
    MSV_SSE_START = 0,                  /* at the start of a line */
    MSV_SSE_FIELD,                      /* in the field name */
    MSV_SSE_SPACE,                      /* after "data:" */
    MSV_SSE_DATA,                       /* in a data line's value */
    MSV_SSE_SKIP                        /* in a line we ignore */
} msv_sse_state_t;

typedef struct {
    msv_sse_state_t    state;
    int                field_n;
    char               field[8];        /* the line's field name so far */
    int                data_seen;       /* the event has a data line */
    int                data_kind;       /* 0: no byte yet, 1: JSON, 2: other */
    msv_bytes_t        data;            /* data that is not JSON ([DONE]) */
} msv_sse_t;

typedef struct msv_resp_s  msv_resp_t;


/* At the start of a stream (keeps the memory). */
void msv_sse_reset(msv_sse_t *s);

/* Is the stream inside an event (it may not end there)? */
int msv_sse_in_event(const msv_sse_t *s);

/* Feed stream bytes; 0, or -1 with the response's failure set. */
int msv_sse_input(msv_resp_t *r, const char *p, size_t n);


#endif /* MSV_E2E_SSE_H */
