/*
 * json_bench.c: JSON arrays of token ids and float32 logprobs per second
 * on one core: msv_json_ids / msv_json_f32s against snprintf("%d"),
 * snprintf("%.9g") (round-trips, not shortest) and a printf-shortest loop
 * ("%.{n}g" for n = 1.. until strtof gives the float back).
 *
 *   make B=build bench && build/bench/json_bench [seconds [repeats]]
 *   build/bench/json_bench --dump rows.bin     (rows for json_bench.py)
 *
 * Rows are support masks as the worker emits them: L ascending ids spread
 * over a 151,936-token vocabulary and their logprobs, log-softmax of
 * normal logits (sd 2.5) over the support, computed in double and stored
 * as float32.  L = 1, 20, 1000, 8192; about 64k items per row size.  Each
 * measurement formats the whole row set as often as fits in `seconds` of
 * the thread's CPU time (default 0.1), so that other load on the machine
 * does not count; the median of `repeats` (default 5) is reported.  Every
 * output is parsed back and compared with the input before timing: a
 * wrong answer aborts the run.
 */

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "msv_json.h"
#include "mix.h"
#include "thread_cpu.h"


#define VOCAB        151936
#define ITEMS        65536          /* items per row size, about */
#define MAX_REPEATS  64

static const uint32_t  row_sizes[] = { 1, 20, 1000, 8192 };
#define N_SIZES  (sizeof(row_sizes) / sizeof(row_sizes[0]))

struct rowset {
    uint32_t   len;                 /* L */
    uint32_t   n_rows;
    int32_t   *ids;                 /* n_rows * len */
    float     *lps;
};

typedef size_t (*fmt_rows_pt)(const struct rowset *rs, char *out);

struct method {
    const char   *name;
    fmt_rows_pt   run;
    int           floats;           /* formats lps, else ids */
};

static uint64_t  rng_state = 0x6a736f6e62656e63ULL;


static uint64_t
rng_next(void)
{
    return msv_splitmix64(&rng_state);
}


static int
make_rows(struct rowset *rs, uint32_t len)
{
    double    *z, mx, sum, lse;
    uint32_t   r, j, step;
    size_t     n;

    rs->len = len;
    rs->n_rows = ITEMS / len > 0 ? ITEMS / len : 1;
    n = (size_t) rs->n_rows * len;

    rs->ids = malloc(n * sizeof(int32_t));
    rs->lps = malloc(n * sizeof(float));
    z = malloc(len * sizeof(double));
    if (rs->ids == NULL || rs->lps == NULL || z == NULL) {
        fprintf(stderr, "json_bench: out of memory\n");
        return -1;
    }

    step = VOCAB / len;

    for (r = 0; r < rs->n_rows; r++) {
        mx = -INFINITY;
        for (j = 0; j < len; j++) {
            rs->ids[(size_t) r * len + j] =
                (int32_t) (j * step + rng_next() % step);
            z[j] = 2.5 * msv_normal(&rng_state);
            mx = z[j] > mx ? z[j] : mx;
        }

        sum = 0;
        for (j = 0; j < len; j++) {
            sum += exp(z[j] - mx);
        }
        lse = mx + log(sum);

        for (j = 0; j < len; j++) {
            rs->lps[(size_t) r * len + j] = (float) (z[j] - lse);
        }
    }

    free(z);
    return 0;
}


/* ------------------------------------------------------------------ */
/* The methods                                                          */

static size_t
ids_ours(const struct rowset *rs, char *out)
{
    char      *p = out;
    uint32_t   r;

    for (r = 0; r < rs->n_rows; r++) {
        p = msv_json_ids(p, rs->ids + (size_t) r * rs->len, rs->len);
        *p++ = '\n';
    }
    return (size_t) (p - out);
}


static size_t
ids_snprintf(const struct rowset *rs, char *out)
{
    char      *p = out;
    uint32_t   r, j;

    for (r = 0; r < rs->n_rows; r++) {
        *p++ = '[';
        for (j = 0; j < rs->len; j++) {
            p += snprintf(p, 16, "%d,", rs->ids[(size_t) r * rs->len + j]);
        }
        p[-1] = ']';
        *p++ = '\n';
    }
    return (size_t) (p - out);
}


static size_t
f32_ours(const struct rowset *rs, char *out)
{
    char      *p = out;
    uint32_t   r;

    for (r = 0; r < rs->n_rows; r++) {
        p = msv_json_f32s(p, rs->lps + (size_t) r * rs->len, rs->len);
        *p++ = '\n';
    }
    return (size_t) (p - out);
}


static size_t
f32_g9(const struct rowset *rs, char *out)
{
    char      *p = out;
    uint32_t   r, j;

    for (r = 0; r < rs->n_rows; r++) {
        *p++ = '[';
        for (j = 0; j < rs->len; j++) {
            p += snprintf(p, 24, "%.9g,",
                          (double) rs->lps[(size_t) r * rs->len + j]);
        }
        p[-1] = ']';
        *p++ = '\n';
    }
    return (size_t) (p - out);
}


static size_t
f32_shortest_printf(const struct rowset *rs, char *out)
{
    char      *p = out;
    uint32_t   r, j;
    float      v;
    int        n, len;

    for (r = 0; r < rs->n_rows; r++) {
        *p++ = '[';
        for (j = 0; j < rs->len; j++) {
            v = rs->lps[(size_t) r * rs->len + j];
            for (n = 1; ; n++) {
                len = snprintf(p, 24, "%.*g", n, (double) v);
                if (n == 9 || strtof(p, NULL) == v) {
                    break;
                }
            }
            p += len;
            *p++ = ',';
        }
        p[-1] = ']';
        *p++ = '\n';
    }
    return (size_t) (p - out);
}


static const struct method  methods[] = {
    { "ids msv_json_ids",        ids_ours,            0 },
    { "ids snprintf %d",         ids_snprintf,        0 },
    { "f32 msv_json_f32s",       f32_ours,            1 },
    { "f32 snprintf %.9g",       f32_g9,              1 },
    { "f32 printf shortest",     f32_shortest_printf, 1 },
};
#define N_METHODS  (sizeof(methods) / sizeof(methods[0]))


/* ------------------------------------------------------------------ */
/* Validation: the text must give back every item                       */

static int
validate(const struct method *m, const struct rowset *rs, const char *out,
         size_t len)
{
    const char  *p = out, *end = out + len;
    char        *e;
    uint32_t     r, j;
    size_t       i;
    float        f;
    long         v;

    for (r = 0; r < rs->n_rows; r++) {
        if (p >= end || *p++ != '[') {
            goto bad;
        }
        for (j = 0; j < rs->len; j++) {
            i = (size_t) r * rs->len + j;
            errno = 0;
            if (m->floats) {
                f = strtof(p, &e);
                if (e == p || memcmp(&f, &rs->lps[i], sizeof(f)) != 0) {
                    goto bad;
                }
            } else {
                v = strtol(p, &e, 10);
                if (e == p || errno != 0 || v != rs->ids[i]) {
                    goto bad;
                }
            }
            p = e;
            if (*p++ != (j + 1 < rs->len ? ',' : ']')) {
                goto bad;
            }
        }
        if (*p++ != '\n') {
            goto bad;
        }
    }

    if (p == end) {
        return 0;
    }

bad:

    fprintf(stderr, "json_bench: %s, rows of %u: output does not give the "
            "input back near byte %zu\n", m->name, rs->len,
            (size_t) (p - out));
    return -1;
}


static int
cmp_double(const void *a, const void *b)
{
    double  x = *(const double *) a, y = *(const double *) b;

    return (x > y) - (x < y);
}


static int
dump_rows(const char *path, struct rowset *sets)
{
    FILE      *f;
    size_t     n, i;
    uint32_t   hdr[2];

    f = fopen(path, "wb");
    if (f == NULL) {
        fprintf(stderr, "json_bench: %s: %s\n", path, strerror(errno));
        return -1;
    }

    /* per row size: uint32 len, uint32 n_rows, int32 ids[], float lps[] */
    for (i = 0; i < N_SIZES; i++) {
        hdr[0] = sets[i].len;
        hdr[1] = sets[i].n_rows;
        n = (size_t) sets[i].len * sets[i].n_rows;
        if (fwrite(hdr, sizeof(hdr), 1, f) != 1
            || fwrite(sets[i].ids, sizeof(int32_t), n, f) != n
            || fwrite(sets[i].lps, sizeof(float), n, f) != n)
        {
            fprintf(stderr, "json_bench: %s: write failed\n", path);
            fclose(f);
            return -1;
        }
    }

    if (fclose(f) != 0) {
        fprintf(stderr, "json_bench: %s: %s\n", path, strerror(errno));
        return -1;
    }

    return 0;
}


int
main(int argc, char **argv)
{
    struct rowset  sets[N_SIZES];
    double         seconds = 0.1, t0, dt, rate[MAX_REPEATS];
    double         mrate[N_METHODS][N_SIZES], bytes[N_METHODS][N_SIZES];
    size_t         cap, len, items;
    uint64_t       sink = 0;
    char          *out, *e;
    long           repeats = 5, iters, k;
    size_t         s, m;
    int            rep;

    if (argc == 3 && strcmp(argv[1], "--dump") == 0) {
        for (s = 0; s < N_SIZES; s++) {
            if (make_rows(&sets[s], row_sizes[s]) != 0) {
                return 1;
            }
        }
        return dump_rows(argv[2], sets) == 0 ? 0 : 1;
    }

    if (argc > 3) {
        fprintf(stderr, "usage: json_bench [seconds [repeats]] | "
                "json_bench --dump FILE\n");
        return 2;
    }

    if (argc > 1) {
        errno = 0;
        seconds = strtod(argv[1], &e);
        if (errno != 0 || *e != '\0' || !(seconds > 0 && seconds <= 60)) {
            fprintf(stderr, "json_bench: seconds: \"%s\" is not in (0, 60]"
                    "\n", argv[1]);
            return 2;
        }
    }

    if (argc > 2) {
        errno = 0;
        repeats = strtol(argv[2], &e, 10);
        if (errno != 0 || *e != '\0' || repeats < 1
            || repeats > MAX_REPEATS)
        {
            fprintf(stderr, "json_bench: repeats: \"%s\" is not in 1..%d\n",
                    argv[2], MAX_REPEATS);
            return 2;
        }
    }

    cap = 0;
    for (s = 0; s < N_SIZES; s++) {
        if (make_rows(&sets[s], row_sizes[s]) != 0) {
            return 1;
        }
        /* the widest method: 15 characters and a separator per float */
        len = (size_t) sets[s].n_rows * (msv_json_f32s_max(sets[s].len) + 1);
        cap = len > cap ? len : cap;
    }

    out = malloc(cap + 64);
    if (out == NULL) {
        fprintf(stderr, "json_bench: out of memory\n");
        return 1;
    }

    printf("# json_bench: %.2f s per measurement, median of %ld\n",
           seconds, repeats);

    for (m = 0; m < N_METHODS; m++) {
        for (s = 0; s < N_SIZES; s++) {
            items = (size_t) sets[s].n_rows * sets[s].len;

            len = methods[m].run(&sets[s], out);
            if (len > cap || validate(&methods[m], &sets[s], out, len) != 0) {
                return 1;
            }
            bytes[m][s] = (double) (len - sets[s].n_rows * 3) / items;

            for (rep = 0; rep < repeats; rep++) {
                iters = 0;
                t0 = msv_thread_cpu();
                do {
                    sink += methods[m].run(&sets[s], out);
                    iters++;
                    dt = msv_thread_cpu() - t0;
                } while (dt < seconds);
                rate[rep] = (double) items * iters / dt;
            }

            qsort(rate, (size_t) repeats, sizeof(double), cmp_double);
            mrate[m][s] = rate[repeats / 2];

            printf("# %-22s L=%-5u %8.1f M items/s  %5.2f bytes/item\n",
                   methods[m].name, sets[s].len, mrate[m][s] / 1e6,
                   bytes[m][s]);
            fflush(stdout);
        }
    }

    /* the table: M items/s per core, and ours / reference */
    printf("\n| row L | ids ours | ids %%d | x | f32 ours | f32 %%.9g | x "
           "| f32 printf-shortest | x | bytes/f32 ours, %%.9g |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");

    for (s = 0; s < N_SIZES; s++) {
        printf("| %u | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | "
               "%.0f | %.2f, %.2f |\n",
               sets[s].len, mrate[0][s] / 1e6, mrate[1][s] / 1e6,
               mrate[0][s] / mrate[1][s], mrate[2][s] / 1e6,
               mrate[3][s] / 1e6, mrate[2][s] / mrate[3][s],
               mrate[4][s] / 1e6, mrate[2][s] / mrate[4][s],
               bytes[2][s], bytes[3][s]);
    }

    printf("(M items/s on one core, thread CPU time; x = ours / reference; "
           "bytes per item include the separator)\n");

    for (k = 0; k < (long) N_SIZES; k++) {
        free(sets[k].ids);
        free(sets[k].lps);
    }
    free(out);

    return sink == 0;
}
