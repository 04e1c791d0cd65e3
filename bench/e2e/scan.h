/*
 * scan.h: where, in the text of a JSON document arriving piece by piece,
 * the value of a key whose value the checker can read straight from the
 * text begins (the mask rows, their logprobs, the packed arrays: fast.c),
 * so that resp.c can stop feeding yajl there.  It follows strings (with
 * their escapes) and nothing else: what it finds is only a candidate, a
 * string of one of those names followed by a colon; check.c's frame, once
 * yajl has parsed up to there, says whether it is one.  Whatever yajl
 * takes for a string, the scanner does too, up to yajl's first error.
 */

#ifndef MSV_E2E_SCAN_H
#define MSV_E2E_SCAN_H

#include <stddef.h>


#define MSV_SCAN_KEY_MAX  24        /* longer keys are none of ours */

typedef struct {
    int     state;                  /* MSV_SCAN_* (scan.c) */
    int     escaped;                /* the string has an escape */
    size_t  str_n;                  /* its bytes so far */
    char    str[MSV_SCAN_KEY_MAX];  /* its first ones */
} msv_scan_t;


/* A new document. */
void msv_scan_reset(msv_scan_t *s);

/* Go on inside a string, whose bytes so far were no key of ours (after a
 * fast path handed a string back to yajl). */
void msv_scan_in_string(msv_scan_t *s);

/*
 * Scan the n bytes at p.  Returns how many were scanned: n, or, when a
 * candidate's value begins at p[k] (its first byte, not whitespace),
 * k with *found = 1; scanning goes on there as if nothing was found.
 */
size_t msv_scan(msv_scan_t *s, const char *p, size_t n, int *found);


#endif /* MSV_E2E_SCAN_H */
