/*
 * test_cmd.c: the control channel's mailbox: one command at a time (a
 * second claim is busy), post / take / done / poll, a command that stays
 * taken, abandon on either side of the answer, a dead owner reclaimed,
 * and processes racing for the mailbox.
 */

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tap.h"
#include "shm_harness.h"
#include "../../shm/msv_cmd.h"


#define N_PROCS   4
#define N_ITER    500


static void
layout(struct msv_layout *lay)
{
    memset(lay, 0, sizeof(*lay));
    lay->n_slots = 4;
    lay->n_readers = 4;
    lay->vocab_size = 1000;
    lay->max_model_len = 33;
    lay->max_logprobs = 5;
    lay->ring_bytes = 65536;
    lay->model = "m";
    lay->backend = "cpu";
}


static uint32_t
cmd_state(struct msv_ctrl *c)
{
    return MSV_STATE_OF(atomic_load(&c->cmd.state));
}


static void
test_cycle(struct msv_ctrl *c)
{
    uint32_t        op, arg;
    struct msv_cmd  res;
    int32_t         me = getpid();

    tap_ok(cmd_state(c) == MSV_CMD_FREE, "cycle: a new region's mailbox is FREE");
    tap_ok(msv_cmd_take(c, &op, &arg) == 0, "cycle: nothing to take");
    tap_ok(msv_cmd_claim(c, me) == 0, "cycle: claim");
    tap_ok(msv_cmd_claim(c, me + 1) == -1, "cycle: a second claim is busy");
    tap_ok(msv_cmd_take(c, &op, &arg) == 0, "cycle: a claimed mailbox is not taken");
    msv_cmd_post(c, me, MSV_OP_PAUSE, MSV_PAUSE_KEEP, NULL, NULL);
    tap_ok(msv_cmd_poll(c, me, &res) == 0, "cycle: posted, no answer yet");
    tap_ok(msv_cmd_poll(c, me + 1, &res) == -1, "cycle: not another pid's");
    tap_ok(msv_cmd_take(c, &op, &arg) == 1 && op == MSV_OP_PAUSE
           && arg == MSV_PAUSE_KEEP, "cycle: the worker takes op and arg");
    tap_ok(msv_cmd_take(c, &op, &arg) == 0, "cycle: taken once");
    tap_ok(msv_cmd_poll(c, me, &res) == 0, "cycle: taken, no answer yet");
    tap_ok(msv_cmd_claim(c, me + 1) == -1, "cycle: busy while taken");
    msv_cmd_done(c, 0, 7, MSV_RUNNING, "paused (keep): 7 requests kept");
    tap_ok(msv_cmd_poll(c, me, &res) == 1 && res.status == 0
           && res.count == 7 && res.op == MSV_OP_PAUSE
           && strcmp(res.msg, "paused (keep): 7 requests kept") == 0
           && res.t_done_ns >= res.t_taken_ns,
           "cycle: the answer, with its result");
    tap_ok(cmd_state(c) == MSV_CMD_FREE, "cycle: FREE after the answer");
    tap_ok(msv_cmd_poll(c, me, &res) == -1, "cycle: polled once");

    /* unclaim */
    tap_ok(msv_cmd_claim(c, me) == 0, "unclaim: claim");
    msv_cmd_unclaim(c, me + 1);
    tap_ok(cmd_state(c) == MSV_CMD_CLAIMED, "unclaim: not by another pid");
    msv_cmd_unclaim(c, me);
    tap_ok(cmd_state(c) == MSV_CMD_FREE, "unclaim: FREE");

    /* a done without a taken command changes nothing */
    msv_cmd_done(c, 0, 1, 0, NULL);
    tap_ok(cmd_state(c) == MSV_CMD_FREE, "done: nothing taken, nothing done");
}


static void
test_abandon(struct msv_ctrl *c)
{
    uint32_t        op, arg;
    struct msv_cmd  res;
    int32_t         me = getpid();

    /* abandoned before the answer: the worker frees it */
    msv_cmd_claim(c, me);
    msv_cmd_post(c, me, MSV_OP_PAUSE, MSV_PAUSE_WAIT, NULL, NULL);
    msv_cmd_take(c, &op, &arg);
    msv_cmd_abandon(c, me);
    tap_ok(cmd_state(c) == MSV_CMD_TAKEN, "abandon: stays taken while it runs");
    msv_cmd_done(c, 0, 0, 0, "paused (wait)");
    tap_ok(cmd_state(c) == MSV_CMD_FREE, "abandon: the worker frees it when done");
    tap_ok(msv_cmd_claim(c, me + 1) == 0 && atomic_load(&c->cmd.abandon) == 0,
           "abandon: the next claim starts clean");
    msv_cmd_unclaim(c, me + 1);

    /* abandoned after the answer: the reader frees it */
    msv_cmd_claim(c, me);
    msv_cmd_post(c, me, MSV_OP_RESUME, 0, NULL, NULL);
    msv_cmd_take(c, &op, &arg);
    msv_cmd_done(c, 0, 0, 0, NULL);
    msv_cmd_abandon(c, me);
    tap_ok(cmd_state(c) == MSV_CMD_FREE, "abandon: after DONE, freed by the reader");
    tap_ok(msv_cmd_poll(c, me, &res) == -1, "abandon: no answer to poll");

    /* abandoned while only claimed */
    msv_cmd_claim(c, me);
    msv_cmd_abandon(c, me);
    tap_ok(cmd_state(c) == MSV_CMD_FREE, "abandon: a claim is given back");
}


static void
test_dead_owner(struct msv_ctrl *c)
{
    int       st;
    pid_t     pid;
    uint32_t  op, arg;

    pid = fork();
    if (pid == 0) {
        msv_cmd_claim(c, getpid());
        msv_cmd_post(c, getpid(), MSV_OP_FLUSH_CACHE, 0, NULL, NULL);
        _exit(0);
    }
    waitpid(pid, &st, 0);
    tap_ok(cmd_state(c) == MSV_CMD_POSTED, "dead owner: left POSTED");
    tap_ok(msv_cmd_take(c, &op, &arg) == 0, "dead owner: its command is dropped");
    tap_ok(cmd_state(c) == MSV_CMD_FREE, "dead owner: the mailbox is FREE");
}


/* processes claim, post, and wait for a worker loop here: every command
 * is answered exactly once, to the process that posted it */
static void
test_race(struct msv_ctrl *c)
{
    int             i, st, ok, answered;
    pid_t           pids[N_PROCS];
    uint32_t        op, arg, n;
    struct msv_cmd  res;

    for (i = 0; i < N_PROCS; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            int32_t  me = getpid();

            ok = 1;
            for (n = 0; n < N_ITER; n++) {
                while (msv_cmd_claim(c, me) != 0) {
                    sched_yield();      /* busy: retry */
                }
                msv_cmd_post(c, me, MSV_OP_FLUSH_CACHE, (uint32_t) me, NULL, NULL);
                while ((answered = msv_cmd_poll(c, me, &res)) == 0) {
                    sched_yield();
                }
                if (answered != 1 || res.count != (uint32_t) me) {
                    ok = 0;
                }
            }
            _exit(ok ? 0 : 1);
        }
    }

    /* the worker: answer each with the poster's pid (its arg) */
    n = 0;
    while (n < N_PROCS * N_ITER) {
        if (msv_cmd_take(c, &op, &arg)) {
            msv_cmd_done(c, 0, arg, 0, NULL);
            n++;
        } else {
            sched_yield();
        }
    }

    ok = 1;
    for (i = 0; i < N_PROCS; i++) {
        waitpid(pids[i], &st, 0);
        ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    tap_ok(ok, "race: %d processes x %d commands, each answered to its "
           "poster", N_PROCS, N_ITER);
    tap_ok(cmd_state(c) == MSV_CMD_FREE, "race: FREE at the end");
}


int
main(void)
{
    char               err[256], name[64];
    struct msv_region  rg;
    struct msv_layout  lay;

    hx_name(name, sizeof(name), "cmd");
    layout(&lay);
    if (msv_region_create(&rg, name, &lay, err, sizeof(err)) != 0) {
        tap_ok(0, "region: %s", err);
        return tap_done();
    }

    test_cycle(rg.ctrl);
    test_abandon(rg.ctrl);
    test_dead_owner(rg.ctrl);
    test_race(rg.ctrl);

    msv_region_unmap(&rg);
    msv_region_unlink(name);
    return tap_done();
}
