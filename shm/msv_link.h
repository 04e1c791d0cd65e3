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

/* How long msv_attach waits for the worker's welcome. */
#define MSV_ATTACH_TIMEOUT_MS   2000

/* Worker: a nonblocking listening socket at path, mode 0600. */
int msv_listen(const char *path, char *err, size_t errlen);

/*
 * Worker: accept one connection and read its hello with the reader's
 * eventfd (waits at most timeout_ms for the hello).  The peer's pid
 * (SO_PEERCRED) must be the one in the hello.  Returns the connection fd
 * (nonblocking afterwards) or -1: errno EAGAIN when nobody is waiting,
 * otherwise the hello was bad and a line saying why went to stderr.
 * *evfd is made nonblocking, so a wakeup can never block the worker.
 */
int msv_accept_hello(int lfd, struct msv_hello *h, int *evfd,
    int timeout_ms);

/* Worker: answer with a welcome and the worker's submission eventfd
 * (evfd < 0: none).  0, or -1 with errno. */
int msv_send_welcome(int conn, const struct msv_welcome *w, int evfd);

/*
 * Worker: admit the reader that sent hello h.  Checks its generation,
 * entry index, and that the entry is CLAIMED by h->pid; then sets the
 * entry's tail to head and marks it ATTACHED.  Call it from the producer's
 * thread with head = ctrl->head (the published head), so the new tail is
 * never behind bytes the producer may already overwrite.  Returns 0 and
 * the tail in *tail_out, or a negative errno for the welcome's status:
 * -EPROTO bad magic, -ESTALE other generation, -EINVAL bad index or pid,
 * -EPERM entry not claimed by that pid.
 */
int msv_reader_admit(struct msv_ctrl *c, const struct msv_hello *h,
    uint64_t head, uint64_t *tail_out);

/*
 * Worker: free reader entry i (its tail stops holding the ring back),
 * unless it is CLAIMED by a live process: that is a new reader between
 * its claim and its hello, not the one being evicted.  Returns 1 if the
 * entry was freed.  The worker then closes the connection and the wake
 * fd, and calls msv_slots_reap(c, i, ...).  Counting evictions
 * (ctrl->readers_evicted) is the caller's business.
 */
int msv_reader_evict(struct msv_ctrl *c, uint32_t i);

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
    uint64_t             stall_ns;   /* 0: MSV_HEARTBEAT_STALE_NS */
    char                 lost[128];  /* why msv_attachment_check said -1 */
};

/*
 * Reader: open the region, claim a reader entry, create our eventfd,
 * connect, hello, welcome.  All fds nonblocking and close-on-exec.
 * Returns 0, or -1 with a one-line message (no worker, stale region,
 * table full, ...).
 */
int msv_attach(struct msv_attachment *a, const char *name, char *err,
    size_t errlen);

/*
 * The same in two steps, for readers that must not block (nginx):
 * msv_attach_start does everything up to sending the hello (0, or -1 with
 * err, detached); then, when conn_fd turns readable or from a timer,
 * msv_attach_finish takes the welcome: 1 not here yet, 0 attached, -1
 * failed (err set, detached).  A reader that gives up waiting calls
 * msv_detach.
 */
int msv_attach_start(struct msv_attachment *a, const char *name, char *err,
    size_t errlen);
int msv_attach_finish(struct msv_attachment *a, char *err, size_t errlen);

/*
 * Reader: free the slots this attachment still holds that can be freed
 * (claimed, finished, aborted), cancel the ones submitted or running (the
 * worker frees those when it sees us go), release the entry, close fds,
 * unmap.  Safe to call twice.
 */
void msv_detach(struct msv_attachment *a);

/*
 * Reader: is the worker we attached to still the one in charge?  0 yes;
 * -1 it died or was replaced, or evicted us: connection EOF or error, our
 * entry no longer ours, worker STOPPED, worker pid gone, no heartbeat for
 * longer than a->stall_ns (MSV_HEARTBEAT_STALE_NS when 0), or the name now
 * holds another generation (or none); a->lost then says which, as seen
 * ("no heartbeat from the worker for 10.2 s").  Costs a few syscalls;
 * call it from a timer.
 */
int msv_attachment_check(struct msv_attachment *a);

/*
 * Reader: note that we are alive (our entry's heartbeat_ns).  A worker may
 * evict a reader that holds the ring back while its heartbeat is stale, so
 * call this from the reader's event loop (a timer), not from the code
 * that consumes: a live reader that is merely slow keeps its entry.
 */
void msv_reader_heartbeat(struct msv_attachment *a);

/* eventfd helpers: add 1; read until EAGAIN (returns count seen). */
void msv_kick(int evfd);
uint64_t msv_drain(int evfd);

#ifdef __cplusplus
}
#endif

#endif /* MSV_LINK_H */
