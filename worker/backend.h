/*
 * backend.h: what a backend (CPU reference, CUDA) implements.  The
 * scheduler hands it a batch of sequences, each with some new tokens
 * (a prefill chunk or one decode token), and gets fp32 logits back.
 * KV memory is paged: the backend owns a pool of pages and maps page ids
 * to memory; which sequence holds which page is decided by the allocator
 * in kv.h, and every batch carries each sequence's page table.
 */

#ifndef MSV_BACKEND_H
#define MSV_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MSV_KV_BLOCK  16        /* tokens per KV page of both backends */

struct msv_batch {
    uint32_t        n_seqs;
    const uint32_t *seq;        /* sequence ids, < max_seqs, each once */
    const uint32_t *n_new;      /* new tokens of each sequence */
    const uint32_t *pos0;       /* position of each one's first new token
                                   (= tokens already in its KV) */
    const int32_t  *tokens;     /* all new tokens, sequence after sequence */
    const uint32_t *const *pages; /* each sequence's page table: page ids
                                   holding positions 0, 1, ... in order */
    const uint32_t *n_pages;    /* entries in each table, enough to hold
                                   pos0 + n_new tokens */
    int             all_logits; /* 0: logits of each sequence's last new
                                   token, [n_seqs][vocab]; 1: of every new
                                   token, [sum n_new][vocab] */
};

/* A row to sample on the device (see msv_backend_ops.sample). */
struct msv_sample_row {
    uint32_t               row;      /* logits row of the last forward */
    uint32_t               slot;     /* sequence id: owner of the
                                        device-side penalty state */
    uint64_t               cookie;   /* the request; rows carry it */
    struct msv_sample_req  rq;       /* params, seed, t, histories */
};

struct msv_sample_res {
    int32_t   token;      /* -1: no finite logit (the row is an abort) */
    float     logprob;
    uint32_t  n_support;
    uint32_t  bytes;      /* of its packed row */
};

struct msv_backend;

struct msv_backend_ops {
    const char *name;

    /* Build from the config and the host tensor table.  max_seqs
     * sequences, each up to max_len tokens; kv_tokens of KV pages in all
     * (0: the backend's default, see kv_pages).  Returns NULL with err
     * set. */
    struct msv_backend *(*create)(const struct msv_model_config *cfg,
        const struct msv_weights *w, uint32_t max_seqs, uint32_t max_len,
        uint64_t kv_tokens, int threads, char *err, size_t errlen);

    /* The KV pool made at create: *page_tokens tokens a page, returns the
     * number of pages (ids 0 .. n - 1).  The caller's allocator (kv.h)
     * hands them out. */
    uint32_t (*kv_pages)(struct msv_backend *b, uint32_t *page_tokens);

    /* Run the batch; write logits (see msv_batch.all_logits).
     * 0, or -1 with err set. */
    int (*forward)(struct msv_backend *b, const struct msv_batch *batch,
        float *logits, char *err, size_t errlen);

    void (*destroy)(struct msv_backend *b);

    /* Optional: host memory the backend writes logits into fastest
     * (pinned for the GPU).  NULL: malloc and free. */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);

    /*
     * Optional: sampling on the device (NULL, or sample_init failing,
     * means the scheduler samples on the CPU from host logits).
     *
     * sample_init: get ready for up to max_rows rows a step, sequences
     * below max_slots, top logprobs up to max_logprobs; `ring` (bytes) is
     * host memory the packed rows will be copied into, registered for
     * DMA.  0, or -1 with err set.
     *
     * After forward(..., logits = NULL, ...) the logits stay on the
     * device, and forward may return before the device has run it: its
     * host-side inputs are copied, and a fault of it is reported by the
     * sample() or forward() that next waits for the device.  sample()
     * draws the rows (their params already validated),
     * captures what each asked for and packs each row in the ring's row
     * format (struct msv_row + payload, finish 0) at its realized size,
     * rows back to back on the device; it returns once res has each
     * row's token and size (the host needs the tokens for the next
     * forward).
     *
     * sample_copy() starts the copy of rows [first, first + n) of the
     * last sample() to dst (inside `ring`) and returns without waiting
     * for it: the copy runs on the device beside whatever comes next,
     * the next forward in particular.  sample_wait() returns once every
     * copy started has landed in dst (0), or -1 with err set if one
     * failed; only then may the host touch those bytes.  A sample()
     * before the wait is safe: its packing waits on the device for the
     * copies still reading the rows it replaces (its tokens do not).
     */
    int (*sample_init)(struct msv_backend *b, uint32_t max_rows,
        uint32_t max_slots, uint32_t max_logprobs, void *ring,
        size_t ring_bytes, char *err, size_t errlen);
    int (*sample)(struct msv_backend *b, const struct msv_sample_row *rows,
        uint32_t n, struct msv_sample_res *res, char *err, size_t errlen);
    int (*sample_copy)(struct msv_backend *b, uint32_t first, uint32_t n,
        void *dst, char *err, size_t errlen);
    int (*sample_wait)(struct msv_backend *b, char *err, size_t errlen);

    /*
     * Optional: a weight update (NULL: the backend cannot).  stage_weights
     * builds new weights of the same config from w beside the ones in
     * use, while steps go on (it runs on another thread than forward and
     * touches nothing forward reads): 0 with *staged set, or -1 with err
     * set and nothing changed.  commit_weights, between two steps: the
     * staged weights serve from the next forward on and the old ones are
     * freed.  drop_weights frees staged weights never committed.
     */
    int (*stage_weights)(struct msv_backend *b, const struct msv_weights *w,
        void **staged, char *err, size_t errlen);
    void (*commit_weights)(struct msv_backend *b, void *staged);
    void (*drop_weights)(struct msv_backend *b, void *staged);

    /* Optional (NULL: unknown): the device's time, in ms, of the last
     * sample() from the end of the forward before it to the end of its
     * packing.  A forward whose logits stay on the device may return
     * before the device has run it, and sample() then waits for it too:
     * the step log (docs/SCHEDULER.md) counts that wait as the
     * forward's. */
    float (*sample_ms)(struct msv_backend *b);
};

extern const struct msv_backend_ops msv_backend_cpu;

/* Fraction of the GPU's memory the CUDA backend may fill (weights, scratch
 * and KV) when kv_tokens is 0; set before create.  0 < f <= 1, default
 * 0.9 (others are ignored). */
void msv_cuda_set_memory_fraction(double f);
double msv_cuda_memory_fraction(void);

/* The CUDA backend, when built with nvcc (NULL otherwise), and whether a
 * usable GPU is present. */
const struct msv_backend_ops *msv_backend_cuda(void);
int msv_cuda_available(void);

/* Provided by kernels/ (C linkage) when built with MSV_HAVE_CUDA; the
 * two functions above forward to them. */
const struct msv_backend_ops *msv_backend_cuda_ops(void);
int msv_cuda_device_count(void);

#ifdef __cplusplus
}
#endif

#endif /* MSV_BACKEND_H */
