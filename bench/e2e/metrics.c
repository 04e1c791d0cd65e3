/*
 * metrics.c: a blocking GET of the server's /metrics (HTTP/1.0, so the
 * server closes the connection after the body) and the maskserve_format_*
 * samples in it.
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "metrics.h"


#define MSV_METRICS_MAX  (4 << 20)


static int
msv_metrics_get(const struct addrinfo *ai, const char *path, char **body,
    size_t *len)
{
    char            req[512], *buf, *p;
    size_t          n = 0, cap = 65536;
    ssize_t         k;
    int             fd, status;
    struct timeval  tv = { 10, 0 };

    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        fprintf(stderr, "e2e_load: --metrics: socket: %s\n", strerror(errno));
        return -1;
    }
    (void) setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    (void) setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        fprintf(stderr, "e2e_load: --metrics: connect: %s\n",
                strerror(errno));
        close(fd);
        return -1;
    }
    k = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: e2e_load\r\n"
                 "\r\n", path);
    if (k <= 0 || (size_t) k >= sizeof(req)
        || write(fd, req, (size_t) k) != k)
    {
        fprintf(stderr, "e2e_load: --metrics: cannot send the request\n");
        close(fd);
        return -1;
    }

    buf = malloc(cap + 1);
    if (buf == NULL) {
        close(fd);
        return -1;
    }
    for ( ;; ) {
        if (n == cap) {
            if (cap >= MSV_METRICS_MAX) {
                fprintf(stderr, "e2e_load: --metrics: answer over %d "
                        "bytes\n", MSV_METRICS_MAX);
                goto fail;
            }
            cap *= 2;
            p = realloc(buf, cap + 1);
            if (p == NULL) {
                goto fail;
            }
            buf = p;
        }
        k = read(fd, buf + n, cap - n);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k < 0) {
            fprintf(stderr, "e2e_load: --metrics: read: %s\n",
                    strerror(errno));
            goto fail;
        }
        if (k == 0) {
            break;
        }
        n += (size_t) k;
    }
    close(fd);
    buf[n] = '\0';

    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1 || status != 200) {
        fprintf(stderr, "e2e_load: --metrics: GET %s: %.*s\n", path,
                (int) strcspn(buf, "\r\n"), buf);
        free(buf);
        return -1;
    }
    p = strstr(buf, "\r\n\r\n");
    if (p == NULL) {
        fprintf(stderr, "e2e_load: --metrics: no end of the headers\n");
        free(buf);
        return -1;
    }
    *body = buf;
    memmove(buf, p + 4, n - (size_t) (p + 4 - buf) + 1);
    *len = strlen(buf);
    return 0;

fail:
    close(fd);
    free(buf);
    return -1;
}


int
msv_metrics_fetch(const struct addrinfo *ai, const char *path,
    msv_metrics_t *m)
{
    char        *body, *line, *next, *lab, *val, *e;
    size_t       len;
    double       v;
    int          f, found = 0;
    msv_fmt_count_t  *c;

    memset(m, 0, sizeof(*m));
    if (msv_metrics_get(ai, path, &body, &len) != 0) {
        return -1;
    }

    for (line = body; line != NULL && *line; line = next) {
        next = strchr(line, '\n');
        if (next != NULL) {
            *next++ = '\0';
        }
        if (strncmp(line, "maskserve_format_", 17) != 0) {
            continue;
        }
        lab = strchr(line, '{');
        val = strrchr(line, ' ');
        if (lab == NULL || val == NULL || val < lab) {
            continue;
        }
        f = strstr(lab, "format=\"json\"") != NULL ? 0
            : strstr(lab, "format=\"packed\"") != NULL ? 1 : -1;
        v = strtod(val + 1, &e);
        if (f < 0 || e == val + 1) {
            fprintf(stderr, "e2e_load: --metrics: a sample it cannot read: "
                    "%s\n", line);
            free(body);
            return -1;
        }
        c = &m->f[f];
        *lab = '\0';
        if (strcmp(line, "maskserve_format_rows_total") == 0) {
            c->rows += v;
        } else if (strcmp(line, "maskserve_format_ids_total") == 0) {
            c->ids += v;
        } else if (strcmp(line, "maskserve_format_floats_total") == 0) {
            c->floats += v;
        } else if (strcmp(line, "maskserve_format_bytes_total") == 0) {
            c->bytes += v;
        } else if (strcmp(line, "maskserve_format_seconds_total") == 0) {
            *lab = '{';
            if (strstr(lab, "array=\"ids\"") != NULL) {
                c->ids_s += v;
            } else if (strstr(lab, "array=\"logprobs\"") != NULL) {
                c->floats_s += v;
            }
        } else {
            continue;
        }
        found++;
    }
    free(body);

    if (found == 0) {
        fprintf(stderr, "e2e_load: --metrics: %s has no maskserve_format_* "
                "samples (a location with maskserve_metrics, and a module "
                "that counts its formatting)\n", path);
        return -1;
    }
    return 0;
}


void
msv_metrics_sub(const msv_metrics_t *b, const msv_metrics_t *a,
    msv_metrics_t *d)
{
    int  f;

    for (f = 0; f < MSV_FMT_N; f++) {
        d->f[f].rows = b->f[f].rows - a->f[f].rows;
        d->f[f].ids = b->f[f].ids - a->f[f].ids;
        d->f[f].floats = b->f[f].floats - a->f[f].floats;
        d->f[f].bytes = b->f[f].bytes - a->f[f].bytes;
        d->f[f].ids_s = b->f[f].ids_s - a->f[f].ids_s;
        d->f[f].floats_s = b->f[f].floats_s - a->f[f].floats_s;
    }
}
