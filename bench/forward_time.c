/*
 * forward_time.c: wall time of the CUDA backend's forward for the
 * qwen3-8b preset (dummy bf16 weights), in both precisions (MSV_CUDA_ACT
 * split and bf16): one 4096-token prefill, 32 x 64-token prefills, and
 * decode steps at batch 1, 32 and 256 (and 256 with the logits copied
 * into pageable memory), median of 10 steps after 3 warm-up.  Every
 * logit of the timed steps must be finite: a fast wrong answer is not a
 * result.  The correctness checks are t/c/test_backend.
 *
 * usage: forward_time [-s seed]    (the random tokens; default 1)
 * Exit status 1 on any failure, 2 on a usage error or no GPU.
 */

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "kv_direct.h"
#include "model.h"

#ifndef MSV_HAVE_CUDA
int
main(void)
{
    fprintf(stderr, "forward_time: built without CUDA\n");
    return 2;
}
#else

#include "../kernels/backend_cuda.h"

#define BENCH_SEQS     256
#define BENCH_LEN      4096
#define BENCH_PROMPT   64
#define BENCH_CHUNK    32       /* sequences per prefill batch */
#define BENCH_LONG     4096     /* one long prefill, sequence BENCH_SEQS */
#define BENCH_WARM     3
#define BENCH_STEPS    10
#define BENCH_ROWS     4

struct bench_row {
    uint32_t  batch;
    int       pageable;          /* logits into malloc'd memory */
    double    ms[2];             /* split, bf16: median */
    double    lo[2], hi[2];      /* fastest and slowest step */
};


static uint64_t  rng = 1;
static int       failed;


static uint32_t
rng_below(uint32_t n)
{
    /* xorshift64* */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t) ((rng * 0x2545f4914f6cdd1dull) % n);
}


static void *
xalloc(size_t bytes)
{
    void  *p;

    p = malloc(bytes > 0 ? bytes : 1);
    if (p == NULL) {
        fprintf(stderr, "forward_time: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}


static double
now_s(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}


static void
poison(float *p, size_t n)
{
    size_t  i;

    for (i = 0; i < n; i++) {
        p[i] = NAN;
    }
}


static void
bench_fail(const char *fmt, ...)
{
    va_list  ap;

    failed++;
    printf("FAIL ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}


static int
cmp_double(const void *a, const void *b)
{
    double  x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : x > y;
}


/* One forward of the n sequences seq with n_new[i] tokens from pos0[i]
 * (tokens tok) into logits, poisoned first; its wall time in ms, or -1
 * with err set. */
static double
bench_forward(const struct msv_backend_ops *ops, struct msv_backend *b,
    uint32_t n, uint32_t *seq, uint32_t *n_new, uint32_t *pos0,
    int32_t *tok, float *logits, uint32_t vocab, char *err, size_t errlen)
{
    struct msv_batch  bt;
    double            t0;

    memset(&bt, 0, sizeof(bt));
    bt.n_seqs = n;
    bt.seq = seq;
    bt.n_new = n_new;
    bt.pos0 = pos0;
    bt.tokens = tok;

    poison(logits, (size_t) n * vocab);
    t0 = now_s();
    if (msv_kvd_forward(ops, b, &bt, logits, err, errlen) != 0) {
        return -1.0;
    }
    return (now_s() - t0) * 1e3;
}


/* Step times (ms) of decode batches of n over sequences 0..n-1: median,
 * fastest, slowest. */
static int
bench_decode(const struct msv_backend_ops *ops, struct msv_backend *b,
    uint32_t vocab, uint32_t n, uint32_t *len, float *logits, double *ms,
    double *lo, double *hi)
{
    char              err[512];
    uint32_t          seq[BENCH_SEQS], n_new[BENCH_SEQS], pos0[BENCH_SEQS];
    int32_t           tok[BENCH_SEQS];
    double            t[BENCH_STEPS], step_ms;
    size_t            i;
    int               step;

    for (step = 0; step < BENCH_WARM + BENCH_STEPS; step++) {
        for (i = 0; i < n; i++) {
            seq[i] = (uint32_t) i;
            n_new[i] = 1;
            pos0[i] = len[i];
            tok[i] = (int32_t) rng_below(vocab);
            if (msv_kvd_reserve(b, (uint32_t) i, len[i] + 1) != 0) {
                bench_fail("bench: kv_reserve failed");
                return -1;
            }
        }
        step_ms = bench_forward(ops, b, n, seq, n_new, pos0, tok, logits,
                                vocab, err, sizeof(err));
        if (step_ms < 0) {
            bench_fail("bench: forward at batch %u: %s", n, err);
            return -1;
        }
        if (step >= BENCH_WARM) {
            t[step - BENCH_WARM] = step_ms;
        }
        for (i = 0; i < n; i++) {
            len[i]++;
        }
    }

    /* a fast wrong answer is not a result */
    for (i = 0; i < (size_t) n * vocab; i++) {
        if (!isfinite(logits[i])) {
            bench_fail("bench: batch %u: logit %zu is not finite", n, i);
            return -1;
        }
    }

    qsort(t, BENCH_STEPS, sizeof(double), cmp_double);
    *ms = (t[BENCH_STEPS / 2 - 1] + t[BENCH_STEPS / 2]) / 2;
    *lo = t[0];
    *hi = t[BENCH_STEPS - 1];
    return 0;
}


/* One forward of n sequences of len tokens each from position 0
 * (sequences first..first+n-1); its wall time in ms, or -1. */
static double
bench_prefill(const struct msv_backend_ops *ops, struct msv_backend *b,
    uint32_t vocab, uint32_t first, uint32_t n, uint32_t len, float *logits)
{
    char              err[512];
    uint32_t          seq[BENCH_CHUNK], n_new[BENCH_CHUNK];
    uint32_t          pos0[BENCH_CHUNK], i;
    int32_t          *tok;
    double            ms;

    tok = xalloc((size_t) n * len * sizeof(int32_t));
    for (i = 0; i < n * len; i++) {
        tok[i] = (int32_t) rng_below(vocab);
    }
    for (i = 0; i < n; i++) {
        seq[i] = first + i;
        n_new[i] = len;
        pos0[i] = 0;
        if (msv_kvd_reserve(b, first + i, len) != 0) {
            bench_fail("bench: kv_reserve failed");
            free(tok);
            return -1.0;
        }
    }
    ms = bench_forward(ops, b, n, seq, n_new, pos0, tok, logits, vocab, err,
                       sizeof(err));
    free(tok);
    if (ms < 0) {
        bench_fail("bench: prefill %u x %u: %s", n, len, err);
        return -1.0;
    }

    for (i = 0; i < n * vocab; i++) {
        if (!isfinite(logits[i])) {
            bench_fail("bench: prefill %u x %u: logit %u is not finite", n,
                     len, i);
            return -1.0;
        }
    }
    return ms;
}


static void
bench(void)
{
    static const char           *modes[2] = { "split", "bf16" };
    static const uint32_t        batches[BENCH_ROWS] = { 1, 32, 256, 256 };
    const struct msv_backend_ops *ops = msv_backend_cuda();
    struct msv_model_config      cfg;
    struct msv_weights           w;
    struct msv_backend          *b;
    struct bench_row             rows[BENCH_ROWS];
    char                         err[512];
    uint32_t                     len[BENCH_SEQS], s;
    float                       *pinned, *pageable;
    double                       t0, ms, chunk_ms[2], long_ms[2];
    int                          m, k, n_chunks;

    if (msv_config_preset("qwen3-8b", &cfg, err, sizeof(err)) != 0) {
        bench_fail("bench: %s", err);
        return;
    }
    t0 = now_s();
    if (msv_weights_dummy(&cfg, 42, &w, err, sizeof(err)) != 0) {
        bench_fail("bench: %s", err);
        return;
    }
    printf("bench: qwen3-8b dummy weights (%s) in %.1f s\n",
           msv_dtype_name(w.t[0].dtype), now_s() - t0);

    pinned = msv_cuda_host_alloc((size_t) BENCH_SEQS * cfg.vocab_size
                                 * sizeof(float));
    pageable = xalloc((size_t) BENCH_SEQS * cfg.vocab_size
                         * sizeof(float));
    if (pinned == NULL) {
        bench_fail("bench: pinned logits buffer");
        msv_weights_free(&w);
        free(pageable);
        return;
    }
    memset(rows, 0, sizeof(rows));
    chunk_ms[0] = chunk_ms[1] = long_ms[0] = long_ms[1] = 0.0;

    for (m = 0; m < 2; m++) {
        setenv("MSV_CUDA_ACT", modes[m], 1);
        t0 = now_s();
        b = msv_kvd_create(ops, &cfg, &w, BENCH_SEQS + 1, BENCH_LEN,
                        (uint64_t) BENCH_SEQS * 256 + BENCH_LONG, 1, err,
                        sizeof(err));
        unsetenv("MSV_CUDA_ACT");
        if (b == NULL) {
            bench_fail("bench: create (%s): %s", modes[m], err);
            break;
        }
        printf("bench: %s: create (upload + KV) %.1f s\n", modes[m],
               now_s() - t0);

        /* one long prompt (the second of two timed), then its pages
         * back to the pool */
        if (bench_prefill(ops, b, cfg.vocab_size, BENCH_SEQS, 1, BENCH_LONG,
                          pinned) < 0
            || (long_ms[m] = bench_prefill(ops, b, cfg.vocab_size,
                                           BENCH_SEQS, 1, BENCH_LONG,
                                           pinned)) < 0)
        {
            goto next;
        }
        msv_kvd_release(b, BENCH_SEQS);

        /* BENCH_PROMPT tokens into every sequence, BENCH_CHUNK at a time */
        n_chunks = 0;
        for (s = 0; s < BENCH_SEQS; s += BENCH_CHUNK) {
            ms = bench_prefill(ops, b, cfg.vocab_size, s, BENCH_CHUNK,
                               BENCH_PROMPT, pinned);
            if (ms < 0) {
                goto next;
            }
            chunk_ms[m] += ms;
            n_chunks++;
        }
        chunk_ms[m] /= n_chunks;
        for (s = 0; s < BENCH_SEQS; s++) {
            len[s] = BENCH_PROMPT;
        }

        for (k = 0; k < BENCH_ROWS; k++) {
            rows[k].batch = batches[k];
            rows[k].pageable = k == BENCH_ROWS - 1;
            if (bench_decode(ops, b, cfg.vocab_size, batches[k], len,
                             rows[k].pageable ? pageable : pinned,
                             &rows[k].ms[m], &rows[k].lo[m], &rows[k].hi[m])
                != 0)
            {
                goto next;
            }
            printf("bench: %s: batch %u%s: median %.2f ms, range %.2f-%.2f"
                   "\n", modes[m], batches[k],
                   rows[k].pageable ? " (pageable logits)" : "",
                   rows[k].ms[m], rows[k].lo[m], rows[k].hi[m]);
        }

    next:
        msv_kvd_destroy(ops, b);
    }

    printf("\nqwen3-8b preset, dummy bf16 weights; wall time of forward "
           "including logits to host\n(pinned unless noted), median of %d "
           "steps after %d warm-up, context %u-%u tokens\n", BENCH_STEPS,
           BENCH_WARM, BENCH_PROMPT,
           BENCH_PROMPT + BENCH_ROWS * (BENCH_WARM + BENCH_STEPS));
    printf("prefill %d x %d tokens:  split %7.1f ms   bf16 act %7.1f ms\n",
           BENCH_CHUNK, BENCH_PROMPT, chunk_ms[0], chunk_ms[1]);
    printf("prefill 1 x %d tokens:  split %7.1f ms   bf16 act %7.1f ms\n",
           BENCH_LONG, long_ms[0], long_ms[1]);
    printf("%16s | %14s | %11s | %11s | %10s\n", "decode batch",
           "split hi+lo ms", "bf16 act ms", "split tok/s", "bf16 tok/s");
    for (k = 0; k < BENCH_ROWS; k++) {
        printf("%5u%-11s | %14.2f | %11.2f | %11.0f | %10.0f\n",
               rows[k].batch, rows[k].pageable ? " pageable" : "",
               rows[k].ms[0], rows[k].ms[1],
               rows[k].ms[0] > 0 ? rows[k].batch * 1e3 / rows[k].ms[0] : 0.0,
               rows[k].ms[1] > 0 ? rows[k].batch * 1e3 / rows[k].ms[1] : 0.0);
    }

    msv_cuda_host_free(pinned);
    free(pageable);
    msv_weights_free(&w);
}


int
main(int argc, char **argv)
{
    char      *end;
    uint64_t   seed = 1;
    int        opt;

    while ((opt = getopt(argc, argv, "s:")) != -1) {
        switch (opt) {
        case 's':
            errno = 0;
            seed = strtoull(optarg, &end, 0);
            if (errno != 0 || *end != '\0' || end == optarg) {
                fprintf(stderr, "forward_time: -s %s: not a number\n",
                        optarg);
                return 2;
            }
            break;
        default:
            fprintf(stderr, "usage: %s [-s seed]\n", argv[0]);
            return 2;
        }
    }
    rng = seed != 0 ? seed : 1;

    if (msv_backend_cuda() == NULL || msv_cuda_device_count() == 0) {
        fprintf(stderr, "forward_time: no CUDA device\n");
        return 2;
    }

    bench();
    printf("\nforward_time: %s (%d failures)\n",
           failed ? "FAILED" : "passed", failed);
    return failed ? 1 : 0;
}

#endif /* MSV_HAVE_CUDA */
