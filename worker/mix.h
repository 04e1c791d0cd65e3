/*
 * mix.h: splitmix64 (S. Vigna), the one 64-bit mixer of the project: the
 * worker's seeds and dummy weights, and the random inputs of the tests
 * and benchmarks (uniform and normal values drawn from its sequence).
 */

#ifndef MSV_MIX_H
#define MSV_MIX_H

#include <math.h>
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

/* A double in (0, 1] from the next value of *state (its top 53 bits). */
static inline double
msv_unit(uint64_t *state)
{
    return ((double) (msv_splitmix64(state) >> 11) + 1.0)
           / 9007199254740992.0;
}

/* A standard normal value from two of *state's (Box-Muller). */
static inline double
msv_normal(uint64_t *state)
{
    double  u = msv_unit(state);

    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * msv_unit(state));
}

#endif /* MSV_MIX_H */
