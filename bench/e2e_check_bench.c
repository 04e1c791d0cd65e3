/*
 * e2e_check_bench.c: CPU time of the load client's response checker
 * (bench/e2e/resp.c and check.c) per MB of response body, for the four
 * mask variants: selected and support, JSON and packed.
 *
 *   make build/bench/e2e_check_bench
 *   build/bench/e2e_check_bench [--tokens 512] [--top-k 8192]
 *       [--vocab 151936] [--piece 65536] [--repeats 5]
 *       [--modes selected,support,selected-packed,support-packed]
 *       [--stream]
 *
 * The bodies are made as the module writes them: per token a row of
 * top_k distinct ids, ascending, drawn uniformly below the vocabulary,
 * with float32 logprobs that are the log-softmax over the row of normal
 * logits (sd 2.5) computed in float32, and the sampled token drawn from
 * the row; JSON numbers by ngx_module/msv_json.c (the shortest float32
 * text), packed masks by ngx_module/msv_b64.c (docs/API.md, "Packed
 * masks"); one body, or with --stream an SSE event per token.  Each
 * body is fed to msv_resp_data in pieces of --piece bytes, as the HTTP
 * client hands over its reads, and must pass every check: a body the
 * checker refuses aborts the run.  The time is the thread's CPU
 * time of one whole response (reset, data, end, check), the median of
 * --repeats; the table printed last gives it per response, per MB of body
 * and per mask id.
 */

#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "msv_b64.h"
#include "msv_json.h"
#include "mix.h"
#include "thread_cpu.h"
#include "array.h"
#include "check.h"
#include "resp.h"


#define MAX_REPEATS  64

typedef struct {
    long      tokens;
    long      top_k;
    long      vocab;
    size_t    piece;
    int       repeats;
    int       stream;               /* an SSE event per token */
    int       modes[MSV_N_MODES];   /* variants to run */
} bench_opts_t;

/* the rows of one response: tokens x top_k */
typedef struct {
    long      tokens;
    long      k;
    int32_t  *tok;                  /* sampled, per token */
    int32_t  *ids;                  /* tokens * k, each row ascending */
    float    *lps;                  /* aligned with ids */
} bench_rows_t;

static uint64_t  rng_state = 0x6532656368656b21ULL;


static uint64_t
rng_next(void)
{
    return msv_splitmix64(&rng_state);
}


static void *
xmalloc(size_t n)
{
    void  *p = malloc(n ? n : 1);

    if (p == NULL) {
        fprintf(stderr, "e2e_check_bench: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}


/*
 * k distinct ids below vocab, ascending: selection sampling (each id
 * taken with probability needed / left), so every k-subset is as likely.
 */

static void
make_row_ids(int32_t *ids, long k, long vocab)
{
    long  v, got = 0;

    for (v = 0; v < vocab && got < k; v++) {
        if ((double) (k - got) > msv_unit(&rng_state) * (double) (vocab - v)) {
            ids[got++] = (int32_t) v;
        }
    }
}


/* log-softmax of normal logits over the row, in float32 */

static void
make_row_lps(float *lps, long k)
{
    long   j;
    float  mx = -INFINITY, sum = 0.0f, lse;

    for (j = 0; j < k; j++) {
        lps[j] = 2.5f * (float) msv_normal(&rng_state);
        mx = lps[j] > mx ? lps[j] : mx;
    }
    for (j = 0; j < k; j++) {
        sum += expf(lps[j] - mx);
    }
    lse = mx + logf(sum);
    for (j = 0; j < k; j++) {
        lps[j] = lps[j] - lse;
    }
}


static void
make_rows(bench_rows_t *r, long tokens, long k, long vocab)
{
    long  t;

    r->tokens = tokens;
    r->k = k;
    r->tok = xmalloc((size_t) tokens * sizeof(int32_t));
    r->ids = xmalloc((size_t) (tokens * k) * sizeof(int32_t));
    r->lps = xmalloc((size_t) (tokens * k) * sizeof(float));

    for (t = 0; t < tokens; t++) {
        make_row_ids(r->ids + t * k, k, vocab);
        make_row_lps(r->lps + t * k, k);
        r->tok[t] = r->ids[t * k + (long) (rng_next() % (uint64_t) k)];
    }
}


/* The sampled token's logprob in its row (selected mode). */

static float
row_lp_of(const bench_rows_t *r, long t)
{
    long  j;

    for (j = 0; j < r->k; j++) {
        if (r->ids[t * r->k + j] == r->tok[t]) {
            break;
        }
    }
    return r->lps[t * r->k + j];
}


static char *
put_str(char *p, const char *s)
{
    size_t  n = strlen(s);

    memcpy(p, s, n);
    return p + n;
}


static char *
put_b64(char *p, const void *src, size_t n)
{
    msv_b64_t  st;

    msv_b64_init(&st, 0);
    p = msv_b64_put(&st, p, src, n);
    return msv_b64_end(&st, p);
}


/*
 * The choice of tokens t0 .. t1 - 1 (all: a body; one: a stream's event)
 * in the given variant, up to its finish_reason, laid out as the module
 * writes it.
 */

static char *
put_choice(char *p, const bench_rows_t *r, int variant, long t0, long t1)
{
    long     t, n = t1 - t0, k = r->k;
    float   *sel;
    int32_t *lens;
    int      mode = msv_mask_of(variant);

    sel = xmalloc((size_t) n * sizeof(float));
    lens = xmalloc((size_t) n * sizeof(int32_t));
    for (t = 0; t < n; t++) {
        sel[t] = row_lp_of(r, t0 + t);
        lens[t] = (int32_t) k;
    }

    p = put_str(p, "{\"index\":0,\"token_ids\":");
    p = msv_json_ids(p, r->tok + t0, (uint32_t) n);

    if (msv_packed_of(variant)) {
        p = put_str(p, ",\"sampling_mask_packed\":{\"format\":\""
                    MSV_PACKED_FORMAT "\",\"lengths\":\"");
        p = put_b64(p, lens, (size_t) n * 4);
        p = put_str(p, "\",\"ids\":\"");
        p = put_b64(p, r->ids + t0 * k, (size_t) (n * k) * 4);
        p = put_str(p, "\",\"logprobs\":\"");
        if (mode == MSV_MODE_SUPPORT) {
            p = put_b64(p, r->lps + t0 * k, (size_t) (n * k) * 4);
        } else {
            p = put_b64(p, sel, (size_t) n * 4);
        }
        p = put_str(p, "\"}");

    } else {
        p = put_str(p, ",\"sampling_mask\":[");
        for (t = t0; t < t1; t++) {
            p = msv_json_ids(p, r->ids + t * k, (uint32_t) k);
            *p++ = ',';
        }
        p[-1] = ']';
        p = put_str(p, ",\"sampling_mask_logprobs\":");
        if (mode == MSV_MODE_SUPPORT) {
            *p++ = '[';
            for (t = t0; t < t1; t++) {
                p = msv_json_f32s(p, r->lps + t * k, (uint32_t) k);
                *p++ = ',';
            }
            p[-1] = ']';
        } else {
            p = msv_json_f32s(p, sel, (uint32_t) n);
        }
    }

    free(sel);
    free(lens);
    return p;
}


/*
 * The body of one response in the given variant: one JSON document, or
 * (stream) an SSE event per token, then data: [DONE]; its length in *len.
 */

static char *
make_body(const bench_rows_t *r, int variant, int stream, size_t *len)
{
    char    *body, *p;
    long     t, n_ids = r->tokens * r->k;
    size_t   cap;

    cap = 4096 + (size_t) r->tokens * (MSV_I32_MAX_CHARS + 256)
          + (size_t) n_ids * (MSV_I32_MAX_CHARS + MSV_F32_MAX_CHARS + 4);
    body = xmalloc(cap);
    p = body;

    if (!stream) {
        p = put_str(p, "{\"request_id\":\"bench\",\"choices\":[");
        p = put_choice(p, r, variant, 0, r->tokens);
        p = put_str(p, ",\"finish_reason\":\"length\"}]");
    } else {
        for (t = 0; t < r->tokens; t++) {
            p = put_str(p, "data: {\"request_id\":\"bench\",\"choices\":[");
            p = put_choice(p, r, variant, t, t + 1);
            if (t + 1 < r->tokens) {
                p = put_str(p, ",\"finish_reason\":null}]}\n\n");
            } else {
                p = put_str(p, ",\"finish_reason\":\"length\"}]");
            }
        }
    }

    p += sprintf(p, ",\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":"
                 "%ld}}%s", r->tokens, stream ? "\n\ndata: [DONE]\n\n" : "");

    *len = (size_t) (p - body);
    return body;
}


/* One response through the checker, as the load client feeds it; its CPU
 * seconds, or -1 when the checker refuses it (why printed). */

static double
check_body(msv_resp_t *rs, const char *body, size_t len, size_t piece)
{
    size_t  off, k;
    int     rc = 0;
    double  t0;

    t0 = msv_thread_cpu();
    msv_resp_reset(rs);
    for (off = 0; off < len && rc == 0; off += k) {
        k = len - off > piece ? piece : len - off;
        rc = msv_resp_data(rs, body + off, k);
    }
    if (rc == 0 && msv_resp_end(rs) == 0) {
        msv_resp_check(rs);
    }
    t0 = msv_thread_cpu() - t0;

    if (rs->bad[0] != '\0') {
        fprintf(stderr, "e2e_check_bench: the checker refused the body: %s\n",
                rs->bad);
        return -1;
    }
    return t0;
}


static int
cmp_double(const void *a, const void *b)
{
    double  x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : x > y;
}


static void
usage(void)
{
    fprintf(stderr, "usage: e2e_check_bench [--tokens N] [--top-k K] "
            "[--vocab V] [--piece BYTES] [--repeats R] [--modes LIST] "
            "[--stream]\n");
    exit(2);
}


static void
parse_modes(bench_opts_t *o, const char *list)
{
    char  *s, *tok, *save;
    int    v, found;

    memset(o->modes, 0, sizeof(o->modes));
    s = strdup(list);
    for (tok = strtok_r(s, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save))
    {
        found = 0;
        for (v = MSV_MODE_SELECTED; v < MSV_N_MODES; v++) {
            if (strcmp(tok, msv_mode_names[v]) == 0) {
                o->modes[v] = 1;
                found = 1;
            }
        }
        if (!found) {
            fprintf(stderr, "e2e_check_bench: unknown mode \"%s\"\n", tok);
            exit(2);
        }
    }
    free(s);
}


static void
parse_opts(bench_opts_t *o, int argc, char **argv)
{
    static const struct option  longs[] = {
        { "tokens", required_argument, NULL, 't' },
        { "top-k", required_argument, NULL, 'k' },
        { "vocab", required_argument, NULL, 'v' },
        { "piece", required_argument, NULL, 'p' },
        { "repeats", required_argument, NULL, 'r' },
        { "modes", required_argument, NULL, 'm' },
        { "stream", no_argument, NULL, 's' },
        { NULL, 0, NULL, 0 }
    };
    int  c, v;

    o->tokens = 512;
    o->top_k = 8192;
    o->vocab = 151936;
    o->piece = 65536;
    o->repeats = 5;
    o->stream = 0;
    for (v = MSV_MODE_SELECTED; v < MSV_N_MODES; v++) {
        o->modes[v] = 1;
    }

    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 't': o->tokens = atol(optarg); break;
        case 'k': o->top_k = atol(optarg); break;
        case 'v': o->vocab = atol(optarg); break;
        case 'p': o->piece = (size_t) atol(optarg); break;
        case 'r': o->repeats = atoi(optarg); break;
        case 'm': parse_modes(o, optarg); break;
        case 's': o->stream = 1; break;
        default: usage();
        }
    }
    if (o->tokens < 1 || o->top_k < 1 || o->vocab < o->top_k
        || o->piece < 1 || o->repeats < 1 || o->repeats > MAX_REPEATS)
    {
        usage();
    }
}


int
main(int argc, char **argv)
{
    bench_opts_t  o;
    bench_rows_t  rows;
    msv_resp_t    rs;
    char         *body;
    size_t        len;
    double        t[MAX_REPEATS], med[MSV_N_MODES], mb[MSV_N_MODES];
    int           v, i;

    parse_opts(&o, argc, argv);
    make_rows(&rows, o.tokens, o.top_k, o.vocab);

    printf("# e2e_check_bench: %ld tokens x %ld ids, vocab %ld, %s, pieces "
           "of %zu bytes, median of %d\n", o.tokens, o.top_k, o.vocab,
           o.stream ? "an SSE event per token" : "one body", o.piece,
           o.repeats);

    for (v = MSV_MODE_SELECTED; v < MSV_N_MODES; v++) {
        if (!o.modes[v]) {
            continue;
        }
        body = make_body(&rows, v, o.stream, &len);

        memset(&rs, 0, sizeof(rs));
        rs.e.top_k = o.top_k;
        rs.e.temperature = 1.0;
        rs.e.variant = v;
        rs.e.vocab = o.vocab;
        rs.e.max_tokens = o.tokens;
        rs.e.logprobs = -1;
        rs.e.whole = !o.stream;
        rs.e.n = 1;
        rs.stream = o.stream;
        rs.prompt_len = 4;
        rs.max_tokens = o.tokens;
        rs.ignore_eos = 1;

        for (i = 0; i < o.repeats; i++) {
            t[i] = check_body(&rs, body, len, o.piece);
            if (t[i] < 0) {
                return 1;
            }
        }
        if (rs.n_mask_ids != (long long) o.tokens * o.top_k) {
            fprintf(stderr, "e2e_check_bench: %lld mask ids counted, %ld "
                    "sent\n", rs.n_mask_ids, o.tokens * o.top_k);
            return 1;
        }
        qsort(t, (size_t) o.repeats, sizeof(double), cmp_double);
        med[v] = t[o.repeats / 2];
        mb[v] = (double) len / 1e6;
        printf("%-16s body %8.2f MB  runs (ms):", msv_mode_names[v], mb[v]);
        for (i = 0; i < o.repeats; i++) {
            printf(" %.1f", t[i] * 1e3);
        }
        printf("\n");

        msv_resp_free(&rs);
        free(body);
    }

    printf("\n%-16s %10s %12s %10s %10s\n", "mode", "body MB", "ms/response",
           "ms/MB", "ns/id");
    for (v = MSV_MODE_SELECTED; v < MSV_N_MODES; v++) {
        if (o.modes[v]) {
            printf("%-16s %10.2f %12.1f %10.2f %10.2f\n", msv_mode_names[v],
                   mb[v], med[v] * 1e3, med[v] * 1e3 / mb[v],
                   med[v] * 1e9 / (double) (o.tokens * o.top_k));
        }
    }

    free(rows.tok);
    free(rows.ids);
    free(rows.lps);
    return 0;
}
