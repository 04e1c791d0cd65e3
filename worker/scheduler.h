/*
 * scheduler.h: continuous batching.  Requests come from the slot table, run
 * as sequences on the backend, and leave as rows through the ring.
 */

#ifndef MSV_SCHEDULER_H
#define MSV_SCHEDULER_H

#include <stdint.h>
#include <stdio.h>

#include "../shm/msv_ring.h"
#include "../shm/msv_shm.h"
#include "backend.h"
#include "kv.h"
#include "sample_pool.h"
#include "sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

struct msv_sched_pend;

enum msv_seq_phase {
    MSV_SEQ_IDLE    = 0,
    MSV_SEQ_PREFILL = 1,     /* prompt not fully in the KV yet */
    MSV_SEQ_DECODE  = 2,
    MSV_SEQ_WAIT    = 3      /* preempted: no pages, queued to come back */
};

struct msv_seq {
    int                 phase;      /* enum msv_seq_phase */
    uint32_t            slot;       /* == index; also the KV owner id */
    uint64_t            cookie;
    struct msv_params   p;
    struct msv_bias    *bias;       /* [MSV_MAX_BIAS], copied at admit */
    int32_t            *toks;       /* [max_len]: prompt, then outputs */
    uint32_t            n_prompt;
    uint32_t            n_out;
    uint32_t            n_kv;       /* tokens already in the KV cache */
    uint32_t            n_fill;     /* tokens the KV must hold before the
                                       next sample: the prompt, or after a
                                       preemption prompt + outputs */
    uint32_t            max_out;    /* max_tokens clipped to max_len */
    uint64_t            seed;
};

/* What a pause holds back (worker/control.c sets it). */
enum msv_hold {
    MSV_HOLD_NONE  = 0,
    MSV_HOLD_ADMIT = 1,      /* no admissions; running sequences go on */
    MSV_HOLD_ALL   = 2       /* no admissions and no steps */
};

struct msv_sched {
    struct msv_ctrl                *c;
    const struct msv_backend_ops   *ops;
    struct msv_backend             *be;
    struct msv_sample_pool         *pool;
    struct msv_producer            *prod;

    struct msv_seq                 *seqs;       /* [n_slots] */
    struct msv_kv                   kv;         /* pages of the backend */
    uint32_t                        n_wait;     /* sequences in SEQ_WAIT */
    uint32_t                        n_slots;
    uint32_t                        vocab;
    uint32_t                        max_len;
    uint32_t                        max_batched; /* tokens per step */
    int32_t                         eos[MSV_MAX_EOS];
    uint32_t                        n_eos;

    /* batch scratch */
    float                          *logits;     /* [n_slots][vocab] */
    uint32_t                       *b_seq;
    uint32_t                       *b_new;
    uint32_t                       *b_pos0;
    const uint32_t                **b_pages;    /* page table of each */
    uint32_t                       *b_npages;
    uint32_t                       *r_order;    /* preemption scratch */
    uint32_t                       *a_order;    /* [n_active]: admitted
                                                   sequences (any phase
                                                   but IDLE) in admission
                                                   order, kept across
                                                   preemptions */
    uint32_t                       *p_list;     /* prefilling sequences,
                                                   during admission */
    uint32_t                        n_pf;
    int32_t                        *b_tok;
    uint32_t                       *b_order;    /* admission order, then
                                                   the slots to sample */
    struct msv_sample_item         *items;      /* rows to sample */

    /* sampling on the device (msv_sched_device_sampler) */
    int                             dev_sample;
    struct msv_sample_row          *srows;      /* [n_slots] */
    struct msv_sample_res          *sres;

    /* rows [pend_from, n_pend) of the last device sample: in the ring,
     * their copies started, their finish fields and commit still to come
     * (msv_sched_flush) */
    struct msv_sched_pend          *pend;       /* [n_slots] */
    uint32_t                        pend_from;
    uint32_t                        n_pend;

    /* --step-log: a line per step that ran the model (msv_sched_step_log) */
    FILE                           *step_log;
    char                           *step_log_buf;
    int                             step_log_dirty;
    uint64_t                        log_bytes;  /* ring bytes of the step */
    uint64_t                        log_t_sampled; /* sampling's end */
    uint64_t                        log_flush;  /* ns of the step's
                                                   msv_sched_flush */

    uint64_t                        step;
    uint64_t                        seed_state;
    uint32_t                        n_active;
    int                             draining;
    int                             hold;       /* enum msv_hold */
    char                            err[256];
};

int msv_sched_init(struct msv_sched *s, struct msv_ctrl *c,
    const struct msv_backend_ops *ops, struct msv_backend *be,
    struct msv_producer *prod, uint32_t max_batched, uint64_t seed,
    int sample_threads, int prefix_caching);
void msv_sched_free(struct msv_sched *s);

/*
 * Sample on the backend's device from now on, when it can: logits then
 * never leave the device and each step's rows are copied straight into
 * the ring, the copy running beside the next step's forward (see
 * msv_sched_flush).  1 if it does, 0 if the backend has no device
 * sampler or it could not start (why says which), and the CPU sampler
 * stays in use.
 */
int msv_sched_device_sampler(struct msv_sched *s, char *why, size_t len);

/*
 * The rows of the last device sample whose copies into the ring may still
 * run: wait for the copies, fill in their finish fields, commit and
 * publish them.  A step does it itself right after its forward (which
 * is what the copies ran beside), and before it writes any other row;
 * the caller must do it before waiting for work with nothing runnable,
 * and before acting on the worker between steps (a pause, a weight
 * update), so that no row waits for a step that may not come.  Nothing
 * to do (the CPU sampler, or nothing pending): returns at once.  0, or
 * -1 with s->err set: a copy failed or its rows are malformed, and they
 * were dropped, never published.
 */
int msv_sched_flush(struct msv_sched *s);

/*
 * One scheduler iteration: admit submitted requests, honour cancels, run
 * one model step over the running sequences, sample, publish the rows
 * (with the device sampler: the last step's, after this forward; this
 * step's copies go on until msv_sched_flush).  Returns 1 if it did
 * anything, 0 if there was nothing to do, -1 on a fatal error (s->err).
 */
int msv_sched_step(struct msv_sched *s);

/*
 * Write a line per step that runs the model to `path` (created or
 * truncated), buffered and flushed whenever no request is left running
 * and at msv_sched_free; the format is in docs/SCHEDULER.md ("Step log").  The times are
 * host clocks around calls that already wait for the device, so nothing
 * is synchronized for it.  0, or -1 with s->err set.
 */
int msv_sched_step_log(struct msv_sched *s, const char *path);

/* Requests waiting for admission or running. */
uint32_t msv_sched_pending(struct msv_sched *s);

/* A reader died: its slots are already freed; forget their sequences. */
void msv_sched_forget(struct msv_sched *s, uint32_t slot);

/* Shutdown: abort every submitted and running request (abort rows with
 * reason `why`), published in one record. */
int msv_sched_abort_all(struct msv_sched *s, uint32_t why);

/* Abort every submitted and running request (abort rows with reason
 * `why`) in one record, and go on serving.  *count: how many. */
int msv_sched_abort_in_flight(struct msv_sched *s, uint32_t why,
    uint32_t *count);

/* Drop every cached prefix page nobody holds; pages held stay with their
 * sequences and are no longer found by later prompts.  Returns the number
 * of pages dropped. */
uint32_t msv_sched_flush_cache(struct msv_sched *s);

/* 1 when a step would do something now (the main loop then does not
 * sleep): requests to admit or to run, as far as a pause allows. */
int msv_sched_runnable(struct msv_sched *s);

#ifdef __cplusplus
}
#endif

#endif /* MSV_SCHEDULER_H */
