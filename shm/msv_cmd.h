/*
 * msv_cmd.h: the control channel of a region (struct msv_cmd in the
 * control page), reader side and worker side.  The protocol is in
 * msv_shm.h and shm/README.md.
 */

#ifndef MSV_CMD_H
#define MSV_CMD_H

#include <stdint.h>

#include "msv_shm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reader: claim the FREE mailbox (CAS with pid).  0, or -1 when busy. */
int msv_cmd_claim(struct msv_ctrl *c, int32_t pid);

/* Reader: give back a claimed mailbox without posting. */
void msv_cmd_unclaim(struct msv_ctrl *c, int32_t pid);

/* Reader: post the claimed mailbox's command; then kick the worker.
 * path and version: NULL, or strings for MSV_OP_UPDATE (truncated to
 * their fields: check lengths first). */
void msv_cmd_post(struct msv_ctrl *c, int32_t pid, uint32_t op,
    uint32_t arg, const char *path, const char *version);

/*
 * Reader: 1 when the worker answered (*out holds a copy of the mailbox,
 * which is FREE again), 0 while it works, -1 when the mailbox is not this
 * reader's any more (the worker restarted or reclaimed it).
 */
int msv_cmd_poll(struct msv_ctrl *c, int32_t pid, struct msv_cmd *out);

/* Reader: stop waiting; the worker frees the mailbox when done. */
void msv_cmd_abandon(struct msv_ctrl *c, int32_t pid);

/*
 * Worker: take a POSTED command (POSTED -> TAKEN).  1 with *op and *arg
 * set, or 0.  Frees a mailbox whose owner died first.
 */
int msv_cmd_take(struct msv_ctrl *c, uint32_t *op, uint32_t *arg);

/* Worker: answer the TAKEN command (TAKEN -> DONE, or FREE if the reader
 * abandoned it).  msg: NULL or a short sentence for the reader's log. */
void msv_cmd_done(struct msv_ctrl *c, int32_t status, uint32_t count,
    uint32_t was_paused, const char *msg);

#ifdef __cplusplus
}
#endif

#endif /* MSV_CMD_H */
