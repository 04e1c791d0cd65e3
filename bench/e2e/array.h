/*
 * array.h: the growable arrays of the e2e load client (bench/e2e_load.c)
 * and its response checker (check.c).  Out of memory ends the process:
 * a benchmark has nothing better to do.
 */

#ifndef MSV_E2E_ARRAY_H
#define MSV_E2E_ARRAY_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int32_t  *v;
    size_t    n;
    size_t    cap;
} msv_i32s_t;

typedef struct {
    char    *p;
    size_t   n;
    size_t   cap;
} msv_bytes_t;

typedef struct {
    double  *v;
    size_t   n;
    size_t   cap;
} msv_f64s_t;


/* Grow p to hold need elements of elt bytes (capacities double). */
void *msv_grow(void *p, size_t *cap, size_t need, size_t elt);
void msv_i32s_push(msv_i32s_t *a, int32_t x);
void msv_f64s_push(msv_f64s_t *a, double x);
/* Append n bytes and keep a NUL after them. */
void msv_bytes_add(msv_bytes_t *b, const char *p, size_t n);


#endif /* MSV_E2E_ARRAY_H */
