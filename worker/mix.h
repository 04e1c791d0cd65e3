/*
 * mix.h: splitmix64 (S. Vigna), the one 64-bit mixer of the project: the
 * worker's seeds and dummy weights, and the random inputs of the tests
 * and benchmarks.
 */

#ifndef MSV_MIX_H
#define MSV_MIX_H

#include <stdint.h>

/* splitmix64's finaliser: a bijection of x whose bits all depend on all
 * of x's. */
static inline uint64_t
msv_mix64(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* The next value of the splitmix64 sequence whose state is *state. */
static inline uint64_t
msv_splitmix64(uint64_t *state)
{
    return msv_mix64(*state += 0x9e3779b97f4a7c15ULL);
}

#endif /* MSV_MIX_H */
