/*
 * control.h: the worker's side of the control channel (struct msv_cmd in
 * the control page): pause, resume and cache flushes, acted on between
 * two steps of the scheduler.
 */

#ifndef MSV_CONTROL_H
#define MSV_CONTROL_H

#include <stdint.h>

#include <pthread.h>

#include "model.h"
#include "scheduler.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A tensor of the weights served: what an update must match. */
struct msv_tensor_sig {
    char      name[128];
    int       dtype;
    int       ndim;
    int64_t   shape[4];
};

/* A weight update in progress: loaded and staged on its own thread. */
struct msv_update {
    pthread_t                  th;
    int                        started;
    _Atomic int                done;      /* the thread finished */
    int                        status;    /* 0, or a negative errno */
    char                       err[MSV_CMD_MSG_MAX];
    char                       path[MSV_CMD_PATH_MAX];
    char                       version[MSV_VERSION_MAX + 1];
    uint32_t                   mode;      /* enum msv_pause_mode */
    void                      *staged;    /* the backend's new weights */
    uint64_t                   t0;
    struct msv_control        *k;
};

struct msv_control {
    struct msv_ctrl                *c;
    struct msv_sched               *s;
    uint32_t                        pending_op;  /* a TAKEN command not
                                                    answered yet */
    uint32_t                        was_paused;
    int                             prev_hold;

    /* what an update must match */
    struct msv_model_config         cfg;
    struct msv_tensor_sig          *sig;
    int                             n_sig;
    struct msv_update               up;
};

/* w: the weights served (names, dtypes and shapes are kept; w itself
 * may be freed afterwards).  0, or -1 when out of memory. */
int msv_control_init(struct msv_control *k, struct msv_ctrl *c,
    struct msv_sched *s, const char *weight_version,
    const struct msv_model_config *cfg, const struct msv_weights *w);
void msv_control_free(struct msv_control *k);

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
