/*
 * metrics.h: the module's formatting counters (GET /metrics, the
 * maskserve_format_* families, docs/API.md), read by the e2e load client
 * before and after every run: what nginx formatted of the run's masks,
 * and the time it took, inside the module.
 */

#ifndef MSV_E2E_METRICS_H
#define MSV_E2E_METRICS_H

#include <netdb.h>


/* by format: 0 json, 1 packed */
#define MSV_FMT_N  2

typedef struct {
    double  rows;
    double  ids;
    double  floats;
    double  bytes;
    double  ids_s;                  /* seconds writing the ids */
    double  floats_s;               /* and the logprobs */
} msv_fmt_count_t;

typedef struct {
    msv_fmt_count_t  f[MSV_FMT_N];
} msv_metrics_t;


/*
 * GET path from the server (one connection, closed after the answer) and
 * sum each maskserve_format_* family by format; 0, or -1 with a message
 * on stderr (no answer, not 200, or no such families).
 */
int msv_metrics_fetch(const struct addrinfo *ai, const char *path,
    msv_metrics_t *m);

/* d = b - a */
void msv_metrics_sub(const msv_metrics_t *b, const msv_metrics_t *a,
    msv_metrics_t *d);


#endif /* MSV_E2E_METRICS_H */
