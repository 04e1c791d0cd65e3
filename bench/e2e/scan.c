/*
 * scan.c: candidates for the checker's fast path (see scan.h).  Outside
 * strings and inside them it jumps from quote to quote (memchr); only the
 * few bytes after a string that names a key of ours are looked at one by
 * one.
 */

#include <string.h>

#include "scan.h"


enum {
    MSV_SCAN_OUT = 0,               /* outside strings */
    MSV_SCAN_STR,                   /* inside one */
    MSV_SCAN_ESC,                   /* inside, after a backslash */
    MSV_SCAN_KEY,                   /* after a string of our names */
    MSV_SCAN_COLON                  /* and a colon after it */
};

/* the keys whose values fast.c reads (check.c's frame decides) */
static const char  *msv_scan_keys[] = {
    "sampling_mask", "sampling_mask_logprobs", "lengths", "ids", "logprobs"
};


void
msv_scan_reset(msv_scan_t *s)
{
    s->state = MSV_SCAN_OUT;
    s->escaped = 0;
    s->str_n = 0;
}


void
msv_scan_in_string(msv_scan_t *s)
{
    s->state = MSV_SCAN_STR;
    s->escaped = 1;                 /* a value, not a key */
    s->str_n = MSV_SCAN_KEY_MAX;
}


static int
msv_scan_is_key(const msv_scan_t *s)
{
    size_t  i, n;

    if (s->escaped || s->str_n >= MSV_SCAN_KEY_MAX) {
        return 0;
    }
    for (i = 0; i < sizeof(msv_scan_keys) / sizeof(msv_scan_keys[0]); i++) {
        n = strlen(msv_scan_keys[i]);
        if (n == s->str_n && memcmp(s->str, msv_scan_keys[i], n) == 0) {
            return 1;
        }
    }
    return 0;
}


/* Bytes of the string being scanned: the first ones kept. */

static void
msv_scan_keep(msv_scan_t *s, const char *p, size_t n)
{
    size_t  k;

    if (s->str_n < MSV_SCAN_KEY_MAX) {
        k = MSV_SCAN_KEY_MAX - s->str_n;
        k = n < k ? n : k;
        memcpy(s->str + s->str_n, p, k);
    }
    s->str_n += n;
}


/* yajl's whitespace */
static int
msv_scan_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v'
           || c == '\f';
}


size_t
msv_scan(msv_scan_t *s, const char *p, size_t n, int *found)
{
    const char  *q, *b, *lim;
    size_t       i = 0;

    *found = 0;

    while (i < n) {

        switch (s->state) {

        case MSV_SCAN_OUT:
            q = memchr(p + i, '"', n - i);
            if (q == NULL) {
                return n;
            }
            i = (size_t) (q - p) + 1;
            s->state = MSV_SCAN_STR;
            s->escaped = 0;
            s->str_n = 0;
            break;

        case MSV_SCAN_STR:
            q = memchr(p + i, '"', n - i);
            lim = q ? q : p + n;
            b = memchr(p + i, '\\', (size_t) (lim - (p + i)));
            if (b != NULL) {
                msv_scan_keep(s, p + i, (size_t) (b - (p + i)));
                s->escaped = 1;
                s->state = MSV_SCAN_ESC;
                i = (size_t) (b - p) + 1;
                break;
            }
            msv_scan_keep(s, p + i, (size_t) (lim - (p + i)));
            if (q == NULL) {
                return n;
            }
            i = (size_t) (q - p) + 1;
            s->state = msv_scan_is_key(s) ? MSV_SCAN_KEY : MSV_SCAN_OUT;
            break;

        case MSV_SCAN_ESC:
            i++;                    /* the escaped byte, whatever it is */
            s->state = MSV_SCAN_STR;
            break;

        case MSV_SCAN_KEY:
            if (msv_scan_space(p[i])) {
                i++;
            } else if (p[i] == ':') {
                i++;
                s->state = MSV_SCAN_COLON;
            } else {
                s->state = MSV_SCAN_OUT;
            }
            break;

        case MSV_SCAN_COLON:
            if (msv_scan_space(p[i])) {
                i++;
                break;
            }
            s->state = MSV_SCAN_OUT;
            *found = 1;
            return i;
        }
    }

    return n;
}
