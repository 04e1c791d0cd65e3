/*
 * msv_link.h: the unix socket between a worker and its readers: the
 * handshake that exchanges eventfds, wakeups, and liveness (EOF).
 */

#ifndef MSV_LINK_H
#define MSV_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "msv_region.h"
#include "msv_ring.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Worker: a nonblocking listening socket at path, mode 0600. */
int msv_listen(const char *path, char *err, size_t errlen);

/*
 * Worker: accept one connection and read its hello with the reader's
 * eventfd (waits at most timeout_ms for the hello).  Returns the
 * connection fd (nonblocking afterwards) or -1.
 */
int msv_accept_hello(int lfd, struct msv_hello *h, int *evfd,
    int timeout_ms);

/* Worker: answer with a welcome and the worker's submission eventfd. */
int msv_send_welcome(int conn, const struct msv_welcome *w, int evfd);

/* A reader attached to one worker. */
struct msv_attachment {
    struct msv_region    rg;
    struct msv_consumer  cons;
    uint32_t             reader;     /* index of our msv_reader entry */
    int32_t              pid;
    uint64_t             generation;
    int                  conn_fd;    /* EOF/error: the worker is gone */
    int                  wake_fd;    /* ours: readable when rows arrive */
    int                  kick_fd;    /* the worker's: write after submit */
};

/*
 * Reader: open the region, claim a reader entry, create our eventfd,
 * connect, hello, welcome.  All fds nonblocking and close-on-exec.
 * Returns 0, or -1 with a one-line message (no worker, stale region,
 * table full, ...).
 */
int msv_attach(struct msv_attachment *a, const char *name, char *err,
    size_t errlen);

/* Reader: release the entry, close fds, unmap. */
void msv_detach(struct msv_attachment *a);

/* Reader: is the worker we attached to still the one in charge?
 * 0 yes; -1 it died or was replaced (conn EOF, generation or pid). */
int msv_attachment_check(struct msv_attachment *a);

/* eventfd helpers: add 1; read until EAGAIN (returns count seen). */
void msv_kick(int evfd);
uint64_t msv_drain(int evfd);

#ifdef __cplusplus
}
#endif

#endif /* MSV_LINK_H */
