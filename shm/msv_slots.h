/*
 * msv_slots.h: the request slot table, reader side and worker side.
 */

#ifndef MSV_SLOTS_H
#define MSV_SLOTS_H

#include <stdint.h>

#include "msv_shm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reader: claim a FREE slot (CAS with pid).  Returns its index or -1. */
int msv_slot_claim(struct msv_ctrl *c, uint32_t reader, int32_t pid);

/* Reader: give back a claimed slot that was never submitted. */
void msv_slot_unclaim(struct msv_ctrl *c, uint32_t i);

/*
 * Reader: fill a claimed slot and publish it (SUBMITTED, release).
 * Returns the request's cookie (never 0), or 0 when the slot is not
 * CLAIMED by this process or the request breaks the rules of
 * msv_params.h against the region's model (msv_prompt_check,
 * msv_params_check: check with them first to say why).  The caller then
 * kicks the worker's eventfd.
 */
uint64_t msv_slot_submit(struct msv_ctrl *c, uint32_t i,
    const char *request_id, const struct msv_params *params,
    const int32_t *prompt, uint32_t n_prompt,
    const struct msv_bias *bias);

/* Reader: ask the worker to stop this request at its next step. */
void msv_slot_cancel(struct msv_ctrl *c, uint32_t i, uint64_t cookie);

/* Reader: after consuming the last row, FINISHED/ABORTED -> FREE.
 * Returns 0, or -1 if the slot is not that request's any more. */
int msv_slot_release(struct msv_ctrl *c, uint32_t i, uint64_t cookie);

/*
 * Reader, right after it attaches to a region it held before: the slots
 * this process (pid) owned then, whose requests it ended when it lost the
 * region; it holds none other there yet.  A worker that stalled past the
 * readers' limit and came back can see the old connections close only
 * after the readers have claimed entries again, and its reap then leaves
 * these slots alone (the entry reused by the same pid, or by another
 * process: not the old holder's any more).  FINISHED or ABORTED ones are
 * freed here (their last row is behind the new attach point); SUBMITTED
 * or RUNNING ones are cancelled and passed to orphan(ud, slot, cookie),
 * for the reader to free at their last row.  Returns how many were freed.
 */
uint32_t msv_slots_adopt(struct msv_ctrl *c, int32_t pid,
    void (*orphan)(void *ud, uint32_t slot, uint64_t cookie), void *ud);

/* State of slot i, and whether it still holds `cookie`. */
uint32_t msv_slot_state(struct msv_ctrl *c, uint32_t i);

/* Counts by state, for health and tests: out[6] indexed by state. */
void msv_slot_census(struct msv_ctrl *c, uint32_t out[6]);

/*
 * Worker: free every slot owned by a reader that is gone.  reader >= 0:
 * slots past CLAIMED whose reader index is `reader`, unless that entry is
 * ATTACHED by the slot's own pid (a live reader reusing the index).
 * reader == -1: slots in any state whose owner pid is dead.  Every freed
 * slot is listed in out; once max are listed the rest wait for the next
 * call (call again while it returns max).  out == NULL: free them all.
 * Returns how many it freed.
 */
uint32_t msv_slots_reap(struct msv_ctrl *c, int reader, uint32_t *out,
    uint32_t max);

#ifdef __cplusplus
}
#endif

#endif /* MSV_SLOTS_H */
