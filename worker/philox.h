/*
 * philox.h: the Philox4x32-10 counter-based generator (Salmon, Moraes,
 * Dror, Shaw, "Parallel Random Numbers: As Easy as 1, 2, 3", SC 2011).
 * A pure function of a 128-bit counter and a 64-bit key; the sampler's
 * keying and counter layout are in docs/SAMPLER.md.
 */

#ifndef MSV_PHILOX_H
#define MSV_PHILOX_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out = Philox4x32-10(ctr, key), words in the published order. */
void msv_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
    uint32_t out[4]);

/* The sampler's 32 random bits for output position t and token id:
 * word 0 of Philox4x32-10 with key (seed lo, seed hi) and counter
 * (t, 0, id, 0). */
uint32_t msv_philox_bits(uint64_t seed, uint32_t t, uint32_t id);

/* The same for four ids at once (interleaved: about twice the rate). */
void msv_philox_bits4(uint64_t seed, uint32_t t, const uint32_t id[4],
    uint32_t out[4]);

#ifdef __cplusplus
}
#endif

#endif /* MSV_PHILOX_H */
