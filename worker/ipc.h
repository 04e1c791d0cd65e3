/*
 * ipc.h: the worker's side of the reader link: the listening socket,
 * reader connections, the submission eventfd, liveness and eviction.
 */

#ifndef MSV_IPC_H
#define MSV_IPC_H

#include <signal.h>
#include <stdint.h>

#include "../shm/msv_ring.h"
#include "../shm/msv_shm.h"

#ifdef __cplusplus
extern "C" {
#endif

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

void msv_ipc_close(struct msv_ipc *x);

#ifdef __cplusplus
}
#endif

#endif /* MSV_IPC_H */
