/*
 * msv_json.h: JSON numbers written straight into an output buffer: integers
 * in decimal, float32 as the shortest decimal that reads back as the same
 * float32, and the "[...]" arrays the module builds from ring rows.  Plain
 * C, no nginx headers, no allocation, no printf.
 *
 * Every writer takes the position p to write at and returns the end of what
 * it wrote.  It needs room for its documented maximum at p: a writer stores
 * whole machine words, so the bytes between the returned end and that bound
 * may be overwritten with scratch.  Writing the next item at the returned
 * end is always fine.
 *
 * Float text (msv_fmt_f32), chosen so that every JSON parser reads it and
 * rounding what it reads to float32 (strtof, numpy.float32) gives back the
 * same bits:
 *   - the digits are the fewest that strtof() maps back to the same float;
 *     when several such strings exist, the one closest to the value (ties:
 *     even last digit);
 *   - decimal exponent x of the first digit (value = d.ddd * 10^x):
 *     -4 <= x <= 8: plain decimal, always with a fraction part (so that
 *     parsers which tell integers apart, Python's json, read a float):
 *        -0.757  12.5  0.0001234  1.0  -30.0  123456790.0
 *     otherwise: d[.ddd]e[-]x, no '+', no leading zeros in the exponent:
 *        1e-5  -1.1920929e-7  3.4028235e38  1e-45
 *   - zero keeps its sign: "0.0" and "-0.0" (both read back bit-exact);
 *   - NaN and +-Inf are not JSON numbers: they are written as "null".
 * The longest text is 15 characters ("-0.000123456789",
 * "-1.23456789e-38"); the writer always stores exactly 16 bytes.
 */

#ifndef MSV_JSON_H
#define MSV_JSON_H

#include <stddef.h>
#include <stdint.h>


#define MSV_U32_MAX_CHARS   10   /* "4294967295" */
#define MSV_I32_MAX_CHARS   11   /* "-2147483648" */
#define MSV_U64_MAX_CHARS   20   /* "18446744073709551615" */
#define MSV_I64_MAX_CHARS   20   /* "-9223372036854775808" */
#define MSV_F32_MAX_CHARS   16   /* bytes stored; the text is <= 15 */
#define MSV_F32_ARRAY_STORE 24   /* the array writers: bytes stored past
                                    the start of a float's text */


/* Scalars.  Each stores at most its MAX_CHARS bytes at p. */
char *msv_fmt_u32(char *p, uint32_t v);
char *msv_fmt_i32(char *p, int32_t v);
char *msv_fmt_u64(char *p, uint64_t v);
char *msv_fmt_i64(char *p, int64_t v);
char *msv_fmt_f32(char *p, float v);

/*
 * The decimal behind msv_fmt_f32, for callers that lay digits out
 * themselves and for tests: for finite v sets *digits and *exp10 so that
 * |v| reads back from digits * 10^exp10, with digits shortest, closest and
 * free of trailing zeros (0 and 0 for a zero); returns 0.  Returns -1 for
 * NaN and infinities and leaves the outputs alone.
 */
int msv_f32_decimal(float v, uint32_t *digits, int *exp10);

/*
 * The powers of ten behind msv_fmt_f32, exported for the exact check in
 * t/c/test_json.c: msv_json_pow10[m - MSV_JSON_POW10_MIN] =
 * floor(10^m * 2^(63 - floor(log2 10^m))) + 1.
 */
#define MSV_JSON_POW10_MIN  (-31)
#define MSV_JSON_POW10_MAX  45

extern const uint64_t
    msv_json_pow10[MSV_JSON_POW10_MAX - MSV_JSON_POW10_MIN + 1];

/*
 * Arrays: "[1,5,9]", "[-0.1,-2.5]", "[]" for n == 0.  The _max functions
 * give the bytes the writer may store for n items, which bounds the text
 * length too; size the output buffer with them (inline: a caller checks
 * them before every short row).
 */
static inline size_t
msv_json_ids_max(uint32_t n)
{
    /* each id and its ',' or ']' */
    return 2 + (size_t) n * (MSV_I32_MAX_CHARS + 1);
}

char *msv_json_ids(char *p, const int32_t *ids, uint32_t n);

static inline size_t
msv_json_f32s_max(uint32_t n)
{
    /*
     * each float's text and separator fit in 16 bytes; the last one
     * stores up to MSV_F32_ARRAY_STORE past its start
     */
    return (size_t) n * MSV_F32_MAX_CHARS + MSV_F32_ARRAY_STORE;
}

char *msv_json_f32s(char *p, const float *v, uint32_t n);

/*
 * The elements alone, each followed by ',' ("1,5,9,"), for an array
 * written piece by piece across buffers (its '[' before the first piece,
 * its last ',' replaced by ']').  The _fit functions give how many
 * elements may be written into room bytes (0 when not one).
 */
uint32_t msv_json_ids_fit(size_t room);
char *msv_json_ids_part(char *p, const int32_t *ids, uint32_t n);
uint32_t msv_json_f32s_fit(size_t room);
char *msv_json_f32s_part(char *p, const float *v, uint32_t n);

/*
 * Whether the array writers may use the CPU's vector instructions (AVX2
 * on x86-64, eight numbers at a time): by default they do where the CPU
 * has them.  on = 0 keeps them to the scalar code (tests and benchmarks
 * compare the two, which write the same text); returns whether the
 * vector path is now in use.
 */
int msv_json_simd(int on);


#endif /* MSV_JSON_H */
