/*
 * cuda_bench.h: what the CUDA benchmark programs in bench/ share: every
 * CUDA and cuBLAS call checked (a failure ends the run with the call and
 * the error), and a piece of device work timed by CUDA events, median of
 * MSV_BENCH_REPS runs after MSV_BENCH_WARM.
 */

#ifndef MSV_CUDA_BENCH_H
#define MSV_CUDA_BENCH_H

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#define MSV_BENCH_REPS  7
#define MSV_BENCH_WARM  2

/* the program's name in the error lines; each program defines it */
extern const char  *msv_bench_prog;

#define MSV_BENCH_TRY(call)                                                  \
    do {                                                                     \
        cudaError_t  e_ = (call);                                            \
        if (e_ != cudaSuccess) {                                             \
            fprintf(stderr, "%s: %s:%d: %s: %s\n", msv_bench_prog,           \
                    __FILE__, __LINE__, #call, cudaGetErrorString(e_));      \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

/* cuBLAS status codes are not cudaError_t: any but success ends the run */
#define MSV_BENCH_BTRY(call)                                                 \
    do {                                                                     \
        if ((call) != 0) {                                                   \
            fprintf(stderr, "%s: %s:%d: %s failed\n", msv_bench_prog,        \
                    __FILE__, __LINE__, #call);                              \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

/* The work to time: enqueues its launches or copies on the default
 * stream; its launches' errors are checked after each run. */
typedef void (*msv_bench_work_t)(void *ctx);

static int
msv_bench_cmp_float(const void *a, const void *b)
{
    float  x = *(const float *) a, y = *(const float *) b;

    return (x > y) - (x < y);
}

/* Milliseconds of one run of work, the median of MSV_BENCH_REPS runs
 * after MSV_BENCH_WARM, each between two events on the default stream. */
static float
msv_bench_ms(msv_bench_work_t work, void *ctx)
{
    static cudaEvent_t  e0, e1;
    float               t[MSV_BENCH_REPS + MSV_BENCH_WARM];
    int                 r;

    if (e0 == NULL) {
        MSV_BENCH_TRY(cudaEventCreate(&e0));
        MSV_BENCH_TRY(cudaEventCreate(&e1));
    }
    for (r = 0; r < MSV_BENCH_REPS + MSV_BENCH_WARM; r++) {
        MSV_BENCH_TRY(cudaEventRecord(e0));
        work(ctx);
        MSV_BENCH_TRY(cudaGetLastError());
        MSV_BENCH_TRY(cudaEventRecord(e1));
        MSV_BENCH_TRY(cudaEventSynchronize(e1));
        MSV_BENCH_TRY(cudaEventElapsedTime(&t[r], e0, e1));
    }
    qsort(t + MSV_BENCH_WARM, MSV_BENCH_REPS, sizeof(float),
          msv_bench_cmp_float);
    return t[MSV_BENCH_WARM + MSV_BENCH_REPS / 2];
}

#endif /* MSV_CUDA_BENCH_H */
