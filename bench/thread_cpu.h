/*
 * thread_cpu.h: the calling thread's CPU time, the clock the single-core
 * benchmarks time their work by (a busy or shared host does not inflate
 * it).  Header-only.
 */

#ifndef MSV_BENCH_THREAD_CPU_H
#define MSV_BENCH_THREAD_CPU_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>


/* Seconds of CPU this thread has used; exits when the clock fails. */
static inline double
msv_thread_cpu(void)
{
    struct timespec  ts;

    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) {
        perror("clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
        exit(1);
    }
    return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

#endif /* MSV_BENCH_THREAD_CPU_H */
