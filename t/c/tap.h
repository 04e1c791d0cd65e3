/*
 * tap.h: a minimal TAP producer for the C tests run by prove.
 */

#ifndef MSV_TAP_H
#define MSV_TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define TAP_FN static __attribute__((unused))

static int tap_n, tap_failed;

TAP_FN void
tap_plan(int n)
{
    printf("1..%d\n", n);
    fflush(stdout);
}

TAP_FN int
tap_ok(int cond, const char *fmt, ...)
{
    va_list  ap;

    tap_n++;
    if (!cond) {
        tap_failed++;
    }
    printf("%sok %d - ", cond ? "" : "not ", tap_n);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    return cond;
}

TAP_FN void
tap_diag(const char *fmt, ...)
{
    va_list  ap;

    printf("# ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

/* Call at the end when no plan was given up front. */
TAP_FN int
tap_done(void)
{
    printf("1..%d\n", tap_n);
    fflush(stdout);
    return tap_failed ? 1 : 0;
}

#endif /* MSV_TAP_H */
