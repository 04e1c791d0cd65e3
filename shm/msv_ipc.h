/*
 * msv_ipc.h: the worker's side of the reader link: the listening socket,
 * reader connections, the submission eventfd, liveness and eviction.  The
 * worker runs it in its main loop and as the ring producer's wait
 * callback; the shm tests run the same code as their worker.
 */

#ifndef MSV_IPC_H
#define MSV_IPC_H

#include <signal.h>
#include <stdint.h>

#include "msv_ring.h"
#include "msv_shm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* levels of the log callback (the worker's msv_log levels) */
#define MSV_IPC_WARN  1
#define MSV_IPC_INFO  2

typedef void (*msv_ipc_log_fn)(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

struct msv_ipc {
    struct msv_ctrl       *c;
    struct msv_producer   *prod;
    int                    epfd;
    int                    lfd;        /* listening socket */
    int                    evfd;       /* readers kick it after submit */
    int                    conn[MSV_MAX_READERS];
    int32_t                pid[MSV_MAX_READERS];    /* at attach */
    uint64_t               last_sweep_ns;
    uint64_t               last_wait_log_ns;
    uint64_t               reader_timeout_ns;
    volatile sig_atomic_t *stop;

    /* called for every slot freed because its reader went away */
    void                 (*forget)(void *ud, uint32_t slot);
    void                  *forget_ud;

    /* one line per attach, detach and eviction; NULL: quiet */
    msv_ipc_log_fn         log;

    /* counters, for the log and the tests */
    uint64_t               kicks;      /* submissions signalled */
    uint32_t               admitted;   /* readers welcomed */
    uint32_t               evicted;    /* entries taken from readers */
    uint64_t               slots_freed;
};

int msv_ipc_init(struct msv_ipc *x, struct msv_ctrl *c,
    struct msv_producer *prod, uint64_t reader_timeout_ns,
    volatile sig_atomic_t *stop, char *err, size_t errlen);

/* Wait up to timeout_ms for events (attach, detach, submissions) and
 * handle them.  Returns the number of events handled. */
int msv_ipc_poll(struct msv_ipc *x, int timeout_ms);

/* The producer's wait callback (msv_wait_fn) with x as ud. */
int msv_ipc_ring_wait(void *ud, uint64_t waited_ns);

/* Attached readers. */
uint32_t msv_ipc_readers(struct msv_ipc *x);

/*
 * Evict reader entry i: close its connection and wake fd, free the entry
 * and its slots, unless the entry was meanwhile freed by its reader and
 * claimed by another process (that one's entry and slots are not ours).
 */
void msv_ipc_evict(struct msv_ipc *x, uint32_t i, const char *why);

void msv_ipc_close(struct msv_ipc *x);

#ifdef __cplusplus
}
#endif

#endif /* MSV_IPC_H */
