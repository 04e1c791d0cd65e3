/*
 * b64dec.h: base64 groups decoded fast, for the checker's packed masks
 * (fast.c decodes them as they arrive; the padding of a string's last
 * group, and every string that is not plain base64, go through
 * ngx_module/msv_b64.c's strict msv_b64_decode as before).
 */

#ifndef MSV_E2E_B64DEC_H
#define MSV_E2E_B64DEC_H

#include <stddef.h>
#include <stdint.h>


/* bytes msv_b64dec_groups may store past what it decodes */
#define MSV_B64DEC_SLACK  32

/*
 * Decode the whole groups of four characters at in (len a multiple of 4)
 * into out, which has room for len / 4 * 3 + MSV_B64DEC_SLACK bytes.
 * Returns the characters decoded: len, or fewer where a group holds a
 * character outside the alphabet A-Z a-z 0-9 + / ('=' included): the
 * groups before it are decoded, that one and the rest are not.
 */
size_t msv_b64dec_groups(const char *in, size_t len, uint8_t *out);

/*
 * Whether the vector path (AVX2, 32 characters a step) may be used: by
 * default it is where the CPU has it.  on = 0 keeps to the table of the
 * portable path (the test compares the two); returns whether the vector
 * path is now in use.
 */
int msv_b64dec_simd(int on);


#endif /* MSV_E2E_B64DEC_H */
