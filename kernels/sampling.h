/*
 * sampling.h: the GPU sampler (kernels/sampling.cu), C ABI.
 *
 * It implements docs/SAMPLER.md on fp32 logits that are already on the
 * device, and writes each sampled row in the ring's row format (struct
 * msv_row + payload, shm/msv_shm.h) at its realized length into a device
 * staging buffer, back to back in row order.  The caller (the CUDA
 * backend, or the check program) has those bytes copied into the ring
 * (msv_gsampler_copy, msv_gsampler_wait).
 *
 * Per-request state that the penalties need (token counts of the output,
 * the set of prompt and output ids) and the request's logit bias and
 * min_tokens mask live on the device, keyed by slot; they are rebuilt
 * from the host's copy when a slot's cookie or position is not the one
 * the device expects, and updated on the device after every draw.
 */

#ifndef MSV_SAMPLING_H
#define MSV_SAMPLING_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

struct msv_gsampler;

/* A sampler for `vocab` ids, up to max_rows rows a step, slots [0,
 * max_slots) and top logprobs up to max_logprobs, running on `stream`
 * (a cudaStream_t; NULL: the default stream).  NULL with err set. */
struct msv_gsampler *msv_gsampler_new(uint32_t vocab, uint32_t max_rows,
    uint32_t max_slots, uint32_t max_logprobs, void *stream, char *err,
    size_t errlen);
void msv_gsampler_free(struct msv_gsampler *g);

/*
 * Sample n rows of logits (device memory, [rows][vocab], modified in
 * place) and pack them.  Returns when the tokens and row sizes are in
 * res; the packed rows stay on the device until the next call.  The
 * rows' params must be valid (msv_sample would accept them).  0, or -1
 * with err set.
 */
int msv_gsampler_run(struct msv_gsampler *g, float *logits,
    const struct msv_sample_row *rows, uint32_t n,
    struct msv_sample_res *res, char *err, size_t errlen);

/*
 * Start the copy of the packed rows [first, first + n) of the last run
 * (contiguous) to dst in host memory, on the sampler's copy stream, and
 * return: the copy runs beside what the caller's stream does next.  The
 * next run's packing waits for it on the device.  Into registered memory
 * (msv_cuda_host_register) it is a DMA at full rate; into pageable
 * memory CUDA copies it before returning.  0, or -1 with err set.
 */
int msv_gsampler_copy(struct msv_gsampler *g, uint32_t first, uint32_t n,
    void *dst, char *err, size_t errlen);

/* Return once every copy started has landed: the host may read dst.
 * The time from msv_gsampler_copy to here is the copy's.  0, or -1
 * with err set if a copy failed. */
int msv_gsampler_wait(struct msv_gsampler *g, char *err, size_t errlen);

/* Milliseconds the last run spent on the device (CUDA events), and in
 * parts[4] (if not NULL): uploads, the streaming sampling kernel (0 when
 * it is off), the resident one, packing. */
float msv_gsampler_last_ms(const struct msv_gsampler *g, float parts[4]);

/* Stage profile: the first call turns it on (0); later calls return
 * the rows of the last run and, per row, the mean SM cycles of block 0
 * in: load and process, max exchange, candidate histogram, count
 * exchange and compaction, gather, top_k/top_p, race and capture. */
int msv_gsampler_profile(struct msv_gsampler *g, double cycles[7]);

/* Rows the streaming kernel finished on its prediction (paths[0], greedy
 * rows included), after its histogram (paths[1]), and rows it left to the
 * resident kernel (paths[2]), since the sampler was made.  Returns 1 if
 * the streaming kernel runs, 0 if it is off (MSV_CUDA_SAMPLER_STREAM=0;
 * every row is the resident kernel's), -1 on a device error. */
int msv_gsampler_paths(struct msv_gsampler *g, unsigned long long paths[3]);

/* Rows whose top_k and top_p cuts the streaming kernel made on a sort of
 * the set (docs/SAMPLER.md section 9) since the sampler was made; -1 on
 * a device error. */
long long msv_gsampler_sorted(struct msv_gsampler *g);

/* Clusters of nc blocks (8, or 4 for the streaming kernel) of the
 * sampling kernel (the streaming one when it runs) the device runs at
 * once (-1: unknown, or no such launch). */
int msv_gsampler_clusters(const struct msv_gsampler *g, uint32_t nc);

/* Blocks a row of the last run's streaming kernel (8 or 4; docs/SAMPLER.md
 * section 9 says how it is chosen, MSV_CUDA_SAMPLER_NC forces it). */
uint32_t msv_gsampler_last_nc(const struct msv_gsampler *g);

/* Register host memory (the ring) so copies into it run as DMA at full
 * rate.  0, or -1 with err set. */
int msv_cuda_host_register(void *p, size_t bytes, char *err, size_t errlen);
void msv_cuda_host_unregister(void *p);

#ifdef __cplusplus
}
#endif

#endif /* MSV_SAMPLING_H */
