/*
 * msv_b64.h: base64 (RFC 4648 section 4, standard alphabet, '=' padding)
 * written straight into an output buffer, fed piece by piece.  Plain C, no
 * nginx headers, no allocation.
 *
 * The packed mask format (docs/API.md) is base64 of arrays that arrive one
 * row at a time, straight from the ring.  A stream keeps the last one or
 * two input bytes that do not fill a 3-byte group; msv_b64_put encodes
 * every whole group at once from the caller's memory, msv_b64_end writes
 * the last group with its padding and starts a new string.
 *
 * The decoder is for tests and benchmarks: it accepts exactly what the
 * encoder writes (length a multiple of 4, padding only at the end, the
 * unused bits of the last group zero) and nothing else.
 */

#ifndef MSV_B64_H
#define MSV_B64_H

#include <stddef.h>
#include <stdint.h>


typedef struct {
    uint8_t   carry[2];
    uint8_t   n;            /* bytes in carry: 0, 1 or 2 */
    uint8_t   around;       /* write around the cache (msv_b64_init) */
} msv_b64_t;


/*
 * A new stream.  around = 1 when the text is not read again soon (a body
 * sent only once it is whole): the vector path then writes the whole
 * 64-byte lines of long pieces with non-temporal stores, which spare the
 * read of each destination line into the cache that an ordinary store
 * makes first.  The text is the same either way.
 */
static inline void
msv_b64_init(msv_b64_t *s, int around)
{
    s->n = 0;
    s->around = (uint8_t) around;
}

/* The most characters msv_b64_put may write for n more bytes. */
static inline size_t
msv_b64_put_max(size_t n)
{
    return (n + 2) / 3 * 4;
}

/* Characters of the whole encoding of n bytes. */
static inline size_t
msv_b64_len(size_t n)
{
    return (n + 2) / 3 * 4;
}

/* Bytes that can be fed with at most room characters written. */
static inline size_t
msv_b64_fits(size_t room)
{
    return room < 4 ? 0 : (room / 4 - 1) * 3 + 1;
}

/* Encode n more bytes at p; returns the end of what was written. */
char *msv_b64_put(msv_b64_t *s, char *p, const void *src, size_t n);

/*
 * Whether msv_b64_put may use the CPU's vector instructions (AVX2 on
 * x86-64): by default it does where the CPU has them.  on = 0 keeps it to
 * the portable code (tests and benchmarks compare the two); returns
 * whether the vector path is now in use.
 */
int msv_b64_simd(int on);

/* Write what is left (0 or 4 characters) and reset the stream. */
char *msv_b64_end(msv_b64_t *s, char *p);

/*
 * Decode len characters into out (room for len / 4 * 3 bytes).  Returns
 * the bytes decoded, or -1 when the text is not canonical base64.
 */
long msv_b64_decode(const char *in, size_t len, void *out);


#endif /* MSV_B64_H */
