/*
 * fuzz_json.c: libFuzzer target for the JSON number writers
 * (ngx_module/msv_json.c): every number written reads back as itself.
 *
 * The input is taken as a run of values: float32 bit patterns, int32,
 * uint32, int64 and uint64 (byte 0 picks which), each written into a
 * buffer of exactly the writer's documented size (so a store past it is
 * reported) and parsed back with strtof/strtoll/strtoull; then the whole
 * run is written as a "[...]" array with msv_json_f32s or msv_json_ids
 * into a buffer of exactly msv_json_*_max(n) bytes and read back item by
 * item, by the scalar writers and by the vector path, which must write
 * the same text.  Float text must also follow the documented format: at most 15
 * characters, "null" exactly for NaN and infinities, a fraction part or
 * an exponent so that every reader takes it for a float.
 */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msv_json.h"


#define msv_fz_check(cond)                                                   \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "fuzz_json: %s:%d: %s\n", __FILE__, __LINE__,    \
                    #cond);                                                  \
            abort();                                                         \
        }                                                                    \
    } while (0)


/* Check one float's text; returns the value read back (or NaN). */
static void
msv_fz_f32_text(float v, const char *s, size_t len)
{
    char      tmp[32], *end;
    float     back;
    uint32_t  a, b;

    msv_fz_check(len >= 3 && len <= 15);
    memcpy(tmp, s, len);
    tmp[len] = '\0';

    if (!isfinite(v)) {
        msv_fz_check(strcmp(tmp, "null") == 0);
        return;
    }
    msv_fz_check(strcmp(tmp, "null") != 0);
    msv_fz_check(strchr(tmp, '.') != NULL || strchr(tmp, 'e') != NULL);
    msv_fz_check(strchr(tmp, '+') == NULL);

    back = strtof(tmp, &end);
    msv_fz_check(*end == '\0');
    memcpy(&a, &v, 4);
    memcpy(&b, &back, 4);
    msv_fz_check(a == b);
}


static void
msv_fz_scalars(const uint8_t *d, size_t n, unsigned kind)
{
    char      *buf, *end, *e;
    float      f;
    int32_t    i32;
    int64_t    i64;
    uint32_t   u32;
    uint64_t   u64;

    switch (kind) {
    case 0:
        memcpy(&f, d, 4);
        buf = malloc(MSV_F32_MAX_CHARS);
        end = msv_fmt_f32(buf, f);
        msv_fz_f32_text(f, buf, end - buf);
        break;
    case 1:
        memcpy(&i32, d, 4);
        buf = malloc(MSV_I32_MAX_CHARS + 1);
        end = msv_fmt_i32(buf, i32);
        *end = '\0';
        msv_fz_check(strtoll(buf, &e, 10) == i32 && e == end);
        break;
    case 2:
        memcpy(&u32, d, 4);
        buf = malloc(MSV_U32_MAX_CHARS + 1);
        end = msv_fmt_u32(buf, u32);
        *end = '\0';
        msv_fz_check(strtoull(buf, &e, 10) == u32 && e == end);
        break;
    case 3:
        memcpy(&i64, d, 8);
        buf = malloc(MSV_I64_MAX_CHARS + 1);
        end = msv_fmt_i64(buf, i64);
        *end = '\0';
        msv_fz_check(strtoll(buf, &e, 10) == i64 && e == end);
        break;
    default:
        memcpy(&u64, d, 8);
        buf = malloc(MSV_U64_MAX_CHARS + 1);
        end = msv_fmt_u64(buf, u64);
        *end = '\0';
        msv_fz_check(strtoull(buf, &e, 10) == u64 && e == end);
        break;
    }

    /* no leading zeros, no '+' */
    msv_fz_check(buf[0] != '+');
    msv_fz_check(kind == 0 || !(buf[0] == '0' && end - buf > 1));
    msv_fz_check(kind == 0 || !(buf[0] == '-' && buf[1] == '0'));
    free(buf);
}


/* Read back "[a,b,...]" item by item; returns the text (freed by the
 * caller) and its length. */
static char *
msv_fz_array(const uint8_t *d, uint32_t n, int floats, size_t *len)
{
    char      *buf, *end, *p, *q, tmp[32];
    size_t     max;
    float      f;
    int32_t    id;
    uint32_t   i;

    max = floats ? msv_json_f32s_max(n) : msv_json_ids_max(n);
    buf = malloc(max);

    if (floats) {
        float  *v = malloc(n * sizeof(float) + 1);

        memcpy(v, d, n * sizeof(float));
        end = msv_json_f32s(buf, v, n);
        free(v);
    } else {
        int32_t  *v = malloc(n * sizeof(int32_t) + 1);

        memcpy(v, d, n * sizeof(int32_t));
        end = msv_json_ids(buf, v, n);
        free(v);
    }

    msv_fz_check(end > buf && (size_t) (end - buf) <= max);
    msv_fz_check(buf[0] == '[' && end[-1] == ']');

    p = buf + 1;
    for (i = 0; i < n; i++) {
        for (q = p; *q != ',' && *q != ']'; q++) {
            msv_fz_check(q < end);
        }
        msv_fz_check(q - p < (long) sizeof(tmp));
        msv_fz_check(*q == (i + 1 == n ? ']' : ','));
        if (floats) {
            memcpy(&f, d + 4 * i, 4);
            msv_fz_f32_text(f, p, q - p);
        } else {
            memcpy(&id, d + 4 * i, 4);
            memcpy(tmp, p, q - p);
            tmp[q - p] = '\0';
            msv_fz_check(strtoll(tmp, NULL, 10) == id);
        }
        p = q + 1;
    }
    msv_fz_check(n > 0 ? p == end : end - buf == 2);

    *len = (size_t) (end - buf);
    return buf;
}


/*
 * The array through the scalar writers and, where the CPU has it, the
 * vector path (msv_json_simd): both read back, with the same text.
 */
static void
msv_fz_arrays(const uint8_t *d, uint32_t n, int floats)
{
    char    *a, *b;
    size_t   na, nb;

    msv_json_simd(0);
    a = msv_fz_array(d, n, floats, &na);

    if (msv_json_simd(1)) {
        b = msv_fz_array(d, n, floats, &nb);
        msv_fz_check(na == nb && memcmp(a, b, na) == 0);
        free(b);
    }

    free(a);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t    i, w;
    unsigned  kind;

    if (size < 1) {
        return 0;
    }
    kind = data[0] % 5;
    data++;
    size--;

    w = kind >= 3 ? 8 : 4;
    for (i = 0; i + w <= size; i += w) {
        msv_fz_scalars(data + i, w, kind);
    }

    if (kind <= 1) {
        msv_fz_arrays(data, (uint32_t) (size / 4), kind == 0);
    }
    return 0;
}
