/*
 * backend.h: what a backend (CPU reference, CUDA) implements.  The
 * scheduler hands it a batch of sequences, each with some new tokens
 * (a prefill chunk or one decode token), and gets fp32 logits back.
 * KV memory is paged: a sequence reserves tokens before it runs.
 */

#ifndef MSV_BACKEND_H
#define MSV_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MSV_KV_BLOCK  16        /* tokens per KV page */

struct msv_batch {
    uint32_t        n_seqs;
    const uint32_t *seq;        /* sequence (KV owner) ids, < max_seqs */
    const uint32_t *n_new;      /* new tokens of each sequence */
    const uint32_t *pos0;       /* position of each one's first new token
                                   (= tokens already in its KV) */
    const int32_t  *tokens;     /* all new tokens, sequence after sequence */
    int             all_logits; /* 0: logits of each sequence's last new
                                   token, [n_seqs][vocab]; 1: of every new
                                   token, [sum n_new][vocab] */
};

struct msv_backend;

struct msv_backend_ops {
    const char *name;

    /* Build from the config and the host tensor table.  max_seqs
     * sequences, each up to max_len tokens; kv_tokens of KV pages in all
     * (0: enough for max_seqs * max_len).  Returns NULL with err set. */
    struct msv_backend *(*create)(const struct msv_model_config *cfg,
        const struct msv_weights *w, uint32_t max_seqs, uint32_t max_len,
        uint64_t kv_tokens, int threads, char *err, size_t errlen);

    /* Make sure seq has pages for n_tokens in all; 0, or -1 if the pool
     * has not enough free pages (nothing is taken then). */
    int (*kv_reserve)(struct msv_backend *b, uint32_t seq,
        uint32_t n_tokens);

    /* Give back all of seq's pages. */
    void (*kv_release)(struct msv_backend *b, uint32_t seq);

    /* Tokens' worth of free pages. */
    uint64_t (*kv_free)(struct msv_backend *b);

    /* Run the batch; write logits (see msv_batch.all_logits).
     * 0, or -1 with err set. */
    int (*forward)(struct msv_backend *b, const struct msv_batch *batch,
        float *logits, char *err, size_t errlen);

    void (*destroy)(struct msv_backend *b);

    /* Optional: host memory the backend writes logits into fastest
     * (pinned for the GPU).  NULL: malloc and free. */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);
};

extern const struct msv_backend_ops msv_backend_cpu;

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
