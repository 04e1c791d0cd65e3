/*
 * control.c: commands from readers through the control page, acted on
 * between two steps.
 *
 * Pause holds the scheduler (enum msv_hold): mode "abort" ends every
 * request in flight with abort reason "paused" and holds everything;
 * mode "keep" holds everything, so the running sequences keep their KV
 * pages and go on after resume; mode "wait" holds admissions only and
 * answers once the last running request ended.  While paused, requests
 * that reach the queue stay there (readers stop submitting when they see
 * the paused state; one that raced with the pause waits for resume).
 * Resume lifts the hold.  Flush drops the cached prefix pages.
 */

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "../shm/msv_cmd.h"
#include "control.h"
#include "log.h"


static const char  *msv_pause_names[] = { "abort", "wait", "keep" };


void
msv_control_init(struct msv_control *k, struct msv_ctrl *c,
    struct msv_sched *s, const char *weight_version)
{
    memset(k, 0, sizeof(*k));
    k->c = c;
    k->s = s;

    snprintf(c->weight_version, sizeof(c->weight_version), "%s",
             weight_version);
    atomic_store_explicit(&c->paused, MSV_RUNNING, memory_order_relaxed);
}


static void
msv_control_set(struct msv_control *k, uint32_t paused, uint32_t mode)
{
    atomic_store_explicit(&k->c->pause_mode, mode, memory_order_relaxed);
    /*
     * P-state: release, pairs with the reader's acquire load of paused
     * before it submits: a reader that sees RUNNING again after a resume
     * also sees the mode reset.
     */
    atomic_store_explicit(&k->c->paused, paused, memory_order_release);
}


static int
msv_control_pause(struct msv_control *k, uint32_t mode)
{
    char       msg[MSV_CMD_MSG_MAX];
    uint32_t   was, n;

    was = atomic_load_explicit(&k->c->paused, memory_order_relaxed);

    if (mode > MSV_PAUSE_KEEP) {
        msv_cmd_done(k->c, -EINVAL, 0, was, "unknown pause mode");
        return 0;
    }

    if (was == MSV_PAUSED) {
        /* paused already: nothing changes, not even the mode */
        msv_cmd_done(k->c, 0, 0, was, "already paused");
        return 0;
    }

    n = 0;

    switch (mode) {

    case MSV_PAUSE_ABORT:
        k->s->hold = MSV_HOLD_ALL;
        if (msv_sched_abort_in_flight(k->s, MSV_ABORT_PAUSED, &n) != 0) {
            return -1;
        }
        break;

    case MSV_PAUSE_KEEP:
        k->s->hold = MSV_HOLD_ALL;
        n = k->s->n_active;
        break;

    case MSV_PAUSE_WAIT:
        if (k->s->hold == MSV_HOLD_NONE) {
            k->s->hold = MSV_HOLD_ADMIT;
        }
        msv_control_set(k, MSV_PAUSING, mode);
        k->pending_op = MSV_OP_PAUSE;
        k->was_paused = was;
        msv_info("control: pausing (wait): %u requests to finish",
                 k->s->n_active);
        return 0;
    }

    msv_control_set(k, MSV_PAUSED, mode);

    snprintf(msg, sizeof(msg), "paused (%s): %u requests %s",
             msv_pause_names[mode], n, mode == MSV_PAUSE_ABORT ? "aborted"
                                                               : "kept");
    msv_info("control: %s", msg);
    msv_cmd_done(k->c, 0, n, was, msg);
    return 0;
}


static void
msv_control_resume(struct msv_control *k)
{
    uint32_t  was;

    was = atomic_load_explicit(&k->c->paused, memory_order_relaxed);

    k->s->hold = MSV_HOLD_NONE;
    msv_control_set(k, MSV_RUNNING, MSV_PAUSE_ABORT);

    if (was != MSV_RUNNING) {
        msv_info("control: resumed, %u requests running, %u queued",
                 k->s->n_active,
                 atomic_load_explicit(&k->c->waiting, memory_order_relaxed));
    }

    msv_cmd_done(k->c, 0, k->s->n_active, was,
                 was == MSV_RUNNING ? "not paused" : "resumed");
}


int
msv_control_poll(struct msv_control *k)
{
    char      msg[MSV_CMD_MSG_MAX];
    uint32_t  op, arg, n;

    if (k->pending_op == MSV_OP_PAUSE) {
        if (k->s->n_active > 0) {
            return 0;
        }
        k->pending_op = MSV_OP_NONE;
        k->s->hold = MSV_HOLD_ALL;
        msv_control_set(k, MSV_PAUSED, MSV_PAUSE_WAIT);
        msv_info("control: paused (wait): requests in flight finished");
        msv_cmd_done(k->c, 0, 0, k->was_paused, "paused (wait)");
        return 0;
    }

    if (!msv_cmd_take(k->c, &op, &arg)) {
        return 0;
    }

    switch (op) {

    case MSV_OP_PAUSE:
        return msv_control_pause(k, arg);

    case MSV_OP_RESUME:
        msv_control_resume(k);
        return 0;

    case MSV_OP_FLUSH_CACHE:
        n = msv_sched_flush_cache(k->s);
        snprintf(msg, sizeof(msg), "%u cached pages dropped", n);
        msv_info("control: cache flushed, %s", msg);
        msv_cmd_done(k->c, 0, n,
                     atomic_load_explicit(&k->c->paused,
                                          memory_order_relaxed), msg);
        return 0;

    default:
        msv_cmd_done(k->c, -EINVAL, 0,
                     atomic_load_explicit(&k->c->paused,
                                          memory_order_relaxed),
                     "unknown command");
        return 0;
    }
}
