/*
 * sse.h: the SSE splitter of the e2e load client.  Decoded body bytes of
 * a stream go in; each event's data is fed to the JSON parser of the
 * connection (load.c: msv_json_run) as it arrives, and a complete event
 * is checked as a whole: JSON, or the final data: [DONE].
 */

#ifndef MSV_E2E_SSE_H
#define MSV_E2E_SSE_H

#include <stddef.h>


typedef enum {
    MSV_SSE_START = 0,                  /* at the start of a line */
    MSV_SSE_FIELD,                      /* in the field name */
    MSV_SSE_SPACE,                      /* after "data:" */
    MSV_SSE_DATA,                       /* in a data line's value */
    MSV_SSE_SKIP                        /* in a line we ignore */
} msv_sse_state_t;

typedef struct msv_load_s  msv_load_t;
typedef struct msv_conn_s  msv_conn_t;

/* Feed stream bytes; 0, or -1 with the connection's failure set. */
int msv_sse_input(msv_load_t *L, msv_conn_t *c, const char *p, size_t n);


#endif /* MSV_E2E_SSE_H */
