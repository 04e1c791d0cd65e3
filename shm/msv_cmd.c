/*
 * msv_cmd.c: the control channel's state machine (msv_shm.h, struct
 * msv_cmd).  The state word carries the owner's pid, as a slot's does, so
 * a reader that dies holding the mailbox leaves it to the worker.
 */

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "msv_cmd.h"
#include "msv_region.h"


int
msv_cmd_claim(struct msv_ctrl *c, int32_t pid)
{
    uint64_t  w;

    w = MSV_STATE_WORD(0, MSV_CMD_FREE);

    /* relaxed: nothing is read through the mailbox until POSTED */
    if (!atomic_compare_exchange_strong_explicit(&c->cmd.state, &w,
            MSV_STATE_WORD(pid, MSV_CMD_CLAIMED), memory_order_acquire,
            memory_order_relaxed))
    {
        return -1;
    }

    atomic_store_explicit(&c->cmd.abandon, 0, memory_order_relaxed);
    c->cmd.seq++;
    return 0;
}


void
msv_cmd_unclaim(struct msv_ctrl *c, int32_t pid)
{
    uint64_t  w = MSV_STATE_WORD(pid, MSV_CMD_CLAIMED);

    atomic_compare_exchange_strong_explicit(&c->cmd.state, &w,
        MSV_STATE_WORD(0, MSV_CMD_FREE), memory_order_release,
        memory_order_relaxed);
}


void
msv_cmd_post(struct msv_ctrl *c, int32_t pid, uint32_t op, uint32_t arg,
    const char *path, const char *version)
{
    snprintf(c->cmd.path, sizeof(c->cmd.path), "%s", path ? path : "");
    snprintf(c->cmd.version, sizeof(c->cmd.version), "%s",
             version ? version : "");
    c->cmd.op = op;
    c->cmd.arg = arg;
    c->cmd.status = 0;
    c->cmd.count = 0;
    c->cmd.msg[0] = '\0';

    /*
     * C-post: release, pairs with the acquire CAS in msv_cmd_take: op and
     * arg written above are visible to the worker that takes it.
     */
    atomic_store_explicit(&c->cmd.state, MSV_STATE_WORD(pid, MSV_CMD_POSTED),
                          memory_order_release);
}


int
msv_cmd_poll(struct msv_ctrl *c, int32_t pid, struct msv_cmd *out)
{
    uint64_t  w;

    /*
     * C-done: acquire, pairs with the release CAS in msv_cmd_done: the
     * result fields are visible once DONE is.
     */
    w = atomic_load_explicit(&c->cmd.state, memory_order_acquire);

    if (MSV_PID_OF(w) != pid) {
        return -1;
    }

    switch (MSV_STATE_OF(w)) {

    case MSV_CMD_POSTED:
    case MSV_CMD_TAKEN:
        return 0;

    case MSV_CMD_DONE:
        out->op = c->cmd.op;
        out->arg = c->cmd.arg;
        out->seq = c->cmd.seq;
        out->status = c->cmd.status;
        out->count = c->cmd.count;
        out->was_paused = c->cmd.was_paused;
        out->t_taken_ns = c->cmd.t_taken_ns;
        out->t_done_ns = c->cmd.t_done_ns;
        memcpy(out->msg, c->cmd.msg, sizeof(out->msg));
        out->msg[sizeof(out->msg) - 1] = '\0';

        /* C-free: release, the copy above is made before anyone reclaims */
        if (!atomic_compare_exchange_strong_explicit(&c->cmd.state, &w,
                MSV_STATE_WORD(0, MSV_CMD_FREE), memory_order_release,
                memory_order_relaxed))
        {
            return -1;
        }
        return 1;

    default:
        return -1;
    }
}


void
msv_cmd_abandon(struct msv_ctrl *c, int32_t pid)
{
    uint64_t  w;

    w = atomic_load_explicit(&c->cmd.state, memory_order_relaxed);
    if (MSV_PID_OF(w) != pid) {
        return;
    }

    if (MSV_STATE_OF(w) == MSV_CMD_CLAIMED) {
        msv_cmd_unclaim(c, pid);
        return;
    }

    /*
     * seq_cst store then load, against the worker's seq_cst CAS to DONE
     * then load of abandon (msv_cmd_done): one of the two sides sees the
     * other and frees the mailbox; both trying is harmless (one CAS wins).
     */
    atomic_store(&c->cmd.abandon, 1);
    w = atomic_load(&c->cmd.state);

    if (MSV_PID_OF(w) == pid && MSV_STATE_OF(w) == MSV_CMD_DONE) {
        atomic_compare_exchange_strong(&c->cmd.state, &w,
                                       MSV_STATE_WORD(0, MSV_CMD_FREE));
    }
}


int
msv_cmd_take(struct msv_ctrl *c, uint32_t *op, uint32_t *arg)
{
    int32_t   pid;
    uint64_t  w;

    w = atomic_load_explicit(&c->cmd.state, memory_order_relaxed);
    if (MSV_STATE_OF(w) == MSV_CMD_FREE) {
        return 0;
    }

    pid = MSV_PID_OF(w);

    /* an owner that died: whatever it left is nobody's (TAKEN is ours,
     * and msv_cmd_done finds out when it tries to answer) */
    if (MSV_STATE_OF(w) != MSV_CMD_TAKEN && pid > 0 && kill(pid, 0) != 0
        && errno == ESRCH)
    {
        atomic_compare_exchange_strong_explicit(&c->cmd.state, &w,
            MSV_STATE_WORD(0, MSV_CMD_FREE), memory_order_relaxed,
            memory_order_relaxed);
        return 0;
    }

    if (MSV_STATE_OF(w) != MSV_CMD_POSTED) {
        return 0;
    }

    /* C-take: acquire, pairs with the release store in msv_cmd_post */
    if (!atomic_compare_exchange_strong_explicit(&c->cmd.state, &w,
            MSV_STATE_WORD(pid, MSV_CMD_TAKEN), memory_order_acquire,
            memory_order_relaxed))
    {
        return 0;
    }

    c->cmd.t_taken_ns = msv_now_ns();
    *op = c->cmd.op;
    *arg = c->cmd.arg;
    return 1;
}


void
msv_cmd_done(struct msv_ctrl *c, int32_t status, uint32_t count,
    uint32_t was_paused, const char *msg)
{
    uint64_t  w;

    w = atomic_load_explicit(&c->cmd.state, memory_order_relaxed);
    if (MSV_STATE_OF(w) != MSV_CMD_TAKEN) {
        return;
    }

    c->cmd.status = status;
    c->cmd.count = count;
    c->cmd.was_paused = was_paused;
    c->cmd.t_done_ns = msv_now_ns();
    if (msg != NULL) {
        strncpy(c->cmd.msg, msg, sizeof(c->cmd.msg) - 1);
        c->cmd.msg[sizeof(c->cmd.msg) - 1] = '\0';
    } else {
        c->cmd.msg[0] = '\0';
    }

    /* C-done: release (seq_cst), pairs with the acquire load in
     * msv_cmd_poll; seq_cst for the abandon hand-off below */
    if (!atomic_compare_exchange_strong(&c->cmd.state, &w,
            MSV_STATE_WORD(MSV_PID_OF(w), MSV_CMD_DONE)))
    {
        return;
    }

    if (atomic_load(&c->cmd.abandon)) {
        w = MSV_STATE_WORD(MSV_PID_OF(w), MSV_CMD_DONE);
        atomic_compare_exchange_strong(&c->cmd.state, &w,
                                       MSV_STATE_WORD(0, MSV_CMD_FREE));
    }
}
