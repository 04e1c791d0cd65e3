/*
 * philox.c: Philox4x32-10.  Each round multiplies counter words 0 and 2 by
 * two odd constants, swaps the halves of the products in with words 1
 * and 3 and the key (a Feistel-like step); the key is bumped by two Weyl
 * constants between rounds.
 */

#include "philox.h"

#define MSV_PHILOX_M0  0xd2511f53u   /* round multipliers */
#define MSV_PHILOX_M1  0xcd9e8d57u
#define MSV_PHILOX_W0  0x9e3779b9u   /* key schedule: golden ratio */
#define MSV_PHILOX_W1  0xbb67ae85u   /* and sqrt(3) - 1 */
#define MSV_PHILOX_ROUNDS  10


void
msv_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
    uint32_t out[4])
{
    int       r;
    uint32_t  c0, c1, c2, c3, k0, k1;
    uint64_t  p0, p1;

    c0 = ctr[0];
    c1 = ctr[1];
    c2 = ctr[2];
    c3 = ctr[3];
    k0 = key[0];
    k1 = key[1];

    for (r = 0; r < MSV_PHILOX_ROUNDS; r++) {
        if (r > 0) {
            k0 += MSV_PHILOX_W0;
            k1 += MSV_PHILOX_W1;
        }

        p0 = (uint64_t) MSV_PHILOX_M0 * c0;
        p1 = (uint64_t) MSV_PHILOX_M1 * c2;

        c0 = (uint32_t) (p1 >> 32) ^ c1 ^ k0;
        c1 = (uint32_t) p1;
        c2 = (uint32_t) (p0 >> 32) ^ c3 ^ k1;
        c3 = (uint32_t) p0;
    }

    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}


uint32_t
msv_philox_bits(uint64_t seed, uint32_t t, uint32_t id)
{
    uint32_t  ctr[4], key[2], out[4];

    ctr[0] = t;
    ctr[1] = 0;
    ctr[2] = id;
    ctr[3] = 0;
    key[0] = (uint32_t) seed;
    key[1] = (uint32_t) (seed >> 32);

    msv_philox4x32_10(ctr, key, out);
    return out[0];
}


void
msv_philox_bits4(uint64_t seed, uint32_t t, const uint32_t id[4],
    uint32_t out[4])
{
    int       r, l;
    uint32_t  c0[4], c1[4], c2[4], c3[4], k0, k1, n0, n2;
    uint64_t  p0, p1;

    k0 = (uint32_t) seed;
    k1 = (uint32_t) (seed >> 32);
    for (l = 0; l < 4; l++) {
        c0[l] = t;
        c1[l] = 0;
        c2[l] = id[l];
        c3[l] = 0;
    }

    /* the rounds of msv_philox4x32_10, lane by lane within each round so
     * the four multiply chains overlap */
    for (r = 0; r < MSV_PHILOX_ROUNDS; r++) {
        if (r > 0) {
            k0 += MSV_PHILOX_W0;
            k1 += MSV_PHILOX_W1;
        }
        for (l = 0; l < 4; l++) {
            p0 = (uint64_t) MSV_PHILOX_M0 * c0[l];
            p1 = (uint64_t) MSV_PHILOX_M1 * c2[l];
            n0 = (uint32_t) (p1 >> 32) ^ c1[l] ^ k0;
            n2 = (uint32_t) (p0 >> 32) ^ c3[l] ^ k1;
            c1[l] = (uint32_t) p1;
            c3[l] = (uint32_t) p0;
            c0[l] = n0;
            c2[l] = n2;
        }
    }

    for (l = 0; l < 4; l++) {
        out[l] = c0[l];
    }
}
