/*
 * array.c: growable arrays (see array.h).
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "array.h"


void *
msv_grow(void *p, size_t *cap, size_t need, size_t elt)
{
    size_t   c;
    void    *np;

    c = *cap ? *cap : 64;
    while (c < need) {
        c *= 2;
    }
    np = realloc(p, c * elt);
    if (np == NULL) {
        fprintf(stderr, "e2e_load: out of memory (%zu bytes)\n", c * elt);
        exit(1);
    }
    *cap = c;
    return np;
}


void
msv_i32s_push(msv_i32s_t *a, int32_t x)
{
    if (a->n == a->cap) {
        a->v = msv_grow(a->v, &a->cap, a->n + 1, sizeof(int32_t));
    }
    a->v[a->n++] = x;
}


void
msv_f64s_push(msv_f64s_t *a, double x)
{
    if (a->n == a->cap) {
        a->v = msv_grow(a->v, &a->cap, a->n + 1, sizeof(double));
    }
    a->v[a->n++] = x;
}


void
msv_bytes_add(msv_bytes_t *b, const char *p, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->p = msv_grow(b->p, &b->cap, b->n + n + 1, 1);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = '\0';
}
