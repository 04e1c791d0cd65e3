/*
 * control.h: the worker's side of the control channel (struct msv_cmd in
 * the control page): pause, resume and cache flushes, acted on between
 * two steps of the scheduler.
 */

#ifndef MSV_CONTROL_H
#define MSV_CONTROL_H

#include <stdint.h>

#include "scheduler.h"

#ifdef __cplusplus
extern "C" {
#endif

struct msv_control {
    struct msv_ctrl   *c;
    struct msv_sched  *s;
    uint32_t           pending_op;  /* a TAKEN command not answered yet */
    uint32_t           was_paused;
};

void msv_control_init(struct msv_control *k, struct msv_ctrl *c,
    struct msv_sched *s, const char *weight_version);

/*
 * Between two steps: take a posted command and act on it, or finish one
 * in progress (pause with mode "wait" once nothing runs).  0, or -1 on a
 * fatal scheduler error (s->err).
 */
int msv_control_poll(struct msv_control *k);

#ifdef __cplusplus
}
#endif

#endif /* MSV_CONTROL_H */
