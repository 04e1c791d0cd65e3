/*
 * e2e_load.c: end-to-end load client for POST /inference/v1/generate.
 *
 * Keeps N streaming (or non-streaming) requests in flight over HTTP/1.1
 * keep-alive connections (one request per connection at a time, epoll,
 * nonblocking sockets; the connections shared out among --threads
 * threads, each with its own epoll loop, parsing and checking its own
 * responses), for a fixed number of requests or seconds, and
 * measures requests/s, tokens/s, bytes/s, time to first event and total
 * latency (p50/p99).  The mask modes (off, selected, support), in JSON
 * or packed (mask_format "packed": selected-packed, support-packed), run
 * side by side in one invocation, interleaved over the repeats, at the
 * same load; the median over the repeats is reported in a table printed
 * last.
 *
 * Every response is validated; a fast wrong answer is not a result:
 *   - HTTP status 200 and the content type of the mode;
 *   - chunked transfer encoding decoded, SSE `data:` events split, each
 *     event's JSON parsed (yajl) and checked: with --n N, N choices in a
 *     body, index 0..N-1 once each, one to N of them in an event, each
 *     checked as a single choice is (otherwise one choice), token_ids
 *     integers, when masks were asked exactly one mask row and one
 *     logprob entry per token of the event, rows ascending and unique,
 *     the sampled token in its row, |row| <= top_k, support logprobs
 *     aligned with their row and logsumexp to 0, selected logprobs <= 0;
 *     packed masks are base64-decoded (strictly) and their lengths, ids
 *     and logprobs go through the same checks, none skipped;
 *   - the stream ends with `data: [DONE]`; nothing of a choice follows the
 *     event with its finish_reason; the event that ends the last choice
 *     carries usage, and no other; completion_tokens is the number of
 *     tokens received over all choices; with ignore_eos every choice has
 *     max_tokens tokens and the finish_reason "length";
 *   - request i carries the same prompt and seed in every mode and every
 *     repeat: its token_ids must be identical each time (masks must not
 *     change what is sampled), and its mask ids identical in JSON and
 *     packed form of the same mode.
 * Any failure is counted, the first few are printed, and the exit status
 * is 1.  The statistics of a run are those of all its responses whatever
 * thread received them (percentiles over every sample), and the client
 * CPU is the process's, all threads.
 *
 * The parts, one concern a file: this file parses the options and runs
 * the repeats; bench/e2e/load.c is the load driver with its statistics,
 * bench/e2e/http.c the HTTP/1.1 client (connections, chunked decoding),
 * bench/e2e/resp.c a response checked as it arrives and as a whole,
 * bench/e2e/sse.c the SSE splitter, bench/e2e/check.c parses and checks
 * each JSON document (also tested alone, t/c/test_e2e_check.c, and the
 * checker of the end-to-end tests through bench/e2e_check.c);
 * bench/e2e/array.c the growable arrays they use.  t/50-client.t runs
 * this client against a live stack.
 *
 *   e2e_load --port 8080 [-c 64] [-n 512 | -d 10] [--max-tokens 16]
 *            [--modes off,selected,support,selected-packed,support-packed]
 *            [--top-k 50] [--no-stream] [--n 4] [--threads 8]
 *
 * Run with --help for every option.
 */

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "array.h"
#include "check.h"
#include "load.h"


/* ------------------------------------------------------------------ */
/* Options                                                              */

static void
msv_usage(FILE *f)
{
    fprintf(f,
"usage: e2e_load --port PORT [options]\n"
"  --host HOST            server address (default 127.0.0.1)\n"
"  --port PORT            server port (required)\n"
"  -c, --concurrency N    requests in flight, one per connection (64)\n"
"  -n, --requests N       requests per run (default 512)\n"
"  -d, --duration SEC     instead of -n: issue requests for SEC seconds\n"
"                         per run, then wait for those in flight\n"
"  --max-tokens N|LO:HI   sampling_params.max_tokens (16); LO:HI spreads\n"
"                         it evenly over the requests of a run, request i\n"
"                         asking LO + (HI - LO) * i / (n - 1)\n"
"  --ignore-eos 0|1       sampling_params.ignore_eos (1); with 1 every\n"
"                         response must carry exactly max_tokens tokens\n"
"  --modes LIST           mask modes to compare, comma-separated, from\n"
"                         off, selected, support (JSON), selected-packed,\n"
"                         support-packed (mask_format \"packed\"), or all\n"
"                         (default off,selected,support)\n"
"  --top-k K              sampling_params.top_k (default -1: off)\n"
"  --top-p P              sampling_params.top_p (1.0)\n"
"  --temperature T        sampling_params.temperature (1.0)\n"
"  --prompt-len N         prompt tokens per request (16)\n"
"  --vocab N              prompt ids are drawn from [1, N) (1000)\n"
"  --group G              G consecutive requests share a prompt (their\n"
"                         seeds differ), as rollouts of one prompt (1)\n"
"  --n N                  sampling_params.n: N completions of the prompt\n"
"                         in one request, each choice checked; tokens\n"
"                         count over all choices (1)\n"
"  --threads N            client threads, each with its own epoll loop,\n"
"                         connections and checks (default: online CPUs,\n"
"                         at most 8; never more than the concurrency)\n"
"  --no-stream            non-streaming requests (\"stream\": false)\n"
"  --repeats R            runs per mode, interleaved; medians reported (3)\n"
"  --warmup N             requests before the first run, not counted\n"
"                         (default: the concurrency)\n"
"  --timeout SEC          a request's limit (60)\n"
"  --seed S               request i uses seed S + i (default 1)\n"
"  --print-errors N       failures printed in full (10)\n"
"  --same-tokens 0|1      1 (default): request i must return the same\n"
"                         token_ids (and mask rows) in every mode and\n"
"                         repeat, a difference fails the run; 0: the\n"
"                         differences are counted and reported only (a\n"
"                         server whose numerics depend on the batch)\n"
"  --cpu LABEL=PID[,PID]  sample the CPU time of these server processes\n"
"                         around every run and report it per response\n"
"                         (repeatable, up to 4 labels)\n"
"  --csv FILE             append a line per run (header first if FILE is\n"
"                         empty): label, mode, repeat, start and end of\n"
"                         the run (CLOCK_MONOTONIC ns), counts, bytes,\n"
"                         client CPU (all threads), choices per request,\n"
"                         per --cpu label CPU seconds, VmRSS at the end\n"
"                         and VmHWM (kB)\n"
"  --label STR            the first column of those lines (\"-\")\n"
"  --metrics PATH         GET PATH (the module's /metrics) before and\n"
"                         after every run: the mask ids, float32 logprobs\n"
"                         and bytes nginx formatted in the run's format\n"
"                         (JSON or packed) and the seconds it took, inside\n"
"                         the module; printed per run and in the CSV\n"
"                         (fmt_rows, fmt_ids, fmt_floats, fmt_bytes,\n"
"                         fmt_ids_s, fmt_floats_s)\n");
}


static int
msv_opt_long(const char *name, const char *s, long lo, long hi, long *out)
{
    char  *e;
    long   v;

    errno = 0;
    v = strtol(s, &e, 10);
    if (errno != 0 || e == s || *e != '\0' || v < lo || v > hi) {
        fprintf(stderr, "e2e_load: %s: \"%s\" is not an integer in "
                "[%ld, %ld]\n", name, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}


static int
msv_opt_double(const char *name, const char *s, double lo, double hi,
    double *out)
{
    char    *e;
    double   v;

    errno = 0;
    v = strtod(s, &e);
    if (errno != 0 || e == s || *e != '\0' || !(v >= lo && v <= hi)) {
        fprintf(stderr, "e2e_load: %s: \"%s\" is not a number in "
                "[%g, %g]\n", name, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}


static int
msv_opt_modes(msv_load_opts_t *o, const char *s)
{
    const char  *p = s, *e;
    size_t       n;
    int          m, i;

    o->n_modes = 0;
    if (strcmp(s, "all") == 0) {
        for (m = 0; m < MSV_N_MODES; m++) {
            o->modes[o->n_modes++] = m;
        }
        return 0;
    }
    while (*p) {
        e = strchr(p, ',');
        n = e ? (size_t) (e - p) : strlen(p);
        for (m = 0; m < MSV_N_MODES; m++) {
            if (strlen(msv_mode_names[m]) == n
                && memcmp(msv_mode_names[m], p, n) == 0)
            {
                break;
            }
        }
        if (m == MSV_N_MODES) {
            fprintf(stderr, "e2e_load: --modes: unknown mode \"%.*s\" "
                    "(off, selected, support, selected-packed, "
                    "support-packed, all)\n", (int) n, p);
            return -1;
        }
        for (i = 0; i < o->n_modes; i++) {
            if (o->modes[i] == m) {
                fprintf(stderr, "e2e_load: --modes: \"%s\" twice\n",
                        msv_mode_names[m]);
                return -1;
            }
        }
        o->modes[o->n_modes++] = m;
        p += n;
        if (*p == ',') {
            p++;
        }
    }
    if (o->n_modes == 0) {
        fprintf(stderr, "e2e_load: --modes: empty list\n");
        return -1;
    }
    return 0;
}


static int
msv_opt_watch(msv_load_opts_t *o, char *s)
{
    msv_watch_t  *w;
    char         *eq, *p, *e;
    long          v;

    eq = strchr(s, '=');
    if (eq == NULL || eq == s || eq[1] == '\0') {
        fprintf(stderr, "e2e_load: --cpu: \"%s\" is not LABEL=PID[,PID...]"
                "\n", s);
        return -1;
    }
    if (o->n_watch == MSV_LOAD_MAX_WATCH) {
        fprintf(stderr, "e2e_load: --cpu: at most %d labels\n",
                MSV_LOAD_MAX_WATCH);
        return -1;
    }
    w = &o->watch[o->n_watch];
    *eq = '\0';
    w->label = s;
    w->n = 0;

    for (p = eq + 1; *p; p = *e ? e + 1 : e) {
        errno = 0;
        v = strtol(p, &e, 10);
        if (errno != 0 || e == p || (*e != ',' && *e != '\0') || v <= 0
            || v > INT32_MAX)
        {
            fprintf(stderr, "e2e_load: --cpu %s: bad pid list \"%s\"\n",
                    s, eq + 1);
            return -1;
        }
        if (w->n == MSV_LOAD_WATCH_PIDS) {
            fprintf(stderr, "e2e_load: --cpu %s: at most %d pids\n", s,
                    MSV_LOAD_WATCH_PIDS);
            return -1;
        }
        w->pid[w->n++] = (pid_t) v;
    }
    if (isnan(msv_watch_cpu(w, NULL))) {
        return -1;
    }
    o->n_watch++;
    return 0;
}


static int
msv_parse_opts(int argc, char **argv, msv_load_opts_t *o)
{
    int          c, idx;
    long         v;
    char        *colon;
    const char  *modes = "off,selected,support";

    static const struct option  longopts[] = {
        { "host",         required_argument, 0, 'H' },
        { "port",         required_argument, 0, 'p' },
        { "concurrency",  required_argument, 0, 'c' },
        { "requests",     required_argument, 0, 'n' },
        { "duration",     required_argument, 0, 'd' },
        { "max-tokens",   required_argument, 0, 'm' },
        { "ignore-eos",   required_argument, 0, 'E' },
        { "modes",        required_argument, 0, 'M' },
        { "top-k",        required_argument, 0, 'k' },
        { "top-p",        required_argument, 0, 'P' },
        { "temperature",  required_argument, 0, 'T' },
        { "prompt-len",   required_argument, 0, 'l' },
        { "vocab",        required_argument, 0, 'V' },
        { "no-stream",    no_argument,       0, 'N' },
        { "repeats",      required_argument, 0, 'r' },
        { "warmup",       required_argument, 0, 'w' },
        { "timeout",      required_argument, 0, 't' },
        { "seed",         required_argument, 0, 'S' },
        { "print-errors", required_argument, 0, 'e' },
        { "same-tokens",  required_argument, 0, 'Y' },
        { "cpu",          required_argument, 0, 'C' },
        { "group",        required_argument, 0, 'G' },
        { "n",            required_argument, 0, 'K' },
        { "threads",      required_argument, 0, 'j' },
        { "csv",          required_argument, 0, 'F' },
        { "label",        required_argument, 0, 'L' },
        { "metrics",      required_argument, 0, 'X' },
        { "help",         no_argument,       0, 'h' },
        { 0, 0, 0, 0 }
    };

    memset(o, 0, sizeof(*o));
    o->host = "127.0.0.1";
    o->conc = 64;
    o->requests = 512;
    o->max_tokens = 16;
    o->group = 1;
    o->n = 1;
    o->threads = -1;
    o->label = "-";
    o->ignore_eos = 1;
    o->top_k = -1;
    o->top_p = 1.0;
    o->temperature = 1.0;
    o->prompt_len = 16;
    o->vocab = 1000;
    o->stream = 1;
    o->repeats = 3;
    o->warmup = -1;
    o->timeout = 60;
    o->seed = 1;
    o->print_errors = 10;
    o->same_tokens = 1;

    while ((c = getopt_long(argc, argv, "c:n:d:h", longopts, &idx)) != -1) {
        switch (c) {
        case 'H':
            o->host = optarg;
            break;
        case 'p':
            if (msv_opt_long("--port", optarg, 1, 65535, &v) != 0) {
                return -1;
            }
            o->port = optarg;
            break;
        case 'c':
            if (msv_opt_long("--concurrency", optarg, 1, MSV_LOAD_MAX_CONC,
                             &o->conc) != 0)
            {
                return -1;
            }
            break;
        case 'n':
            if (msv_opt_long("--requests", optarg, 1, 100000000,
                             &o->requests) != 0)
            {
                return -1;
            }
            o->duration = 0;
            break;
        case 'd':
            if (msv_opt_double("--duration", optarg, 0.01, 86400,
                               &o->duration) != 0)
            {
                return -1;
            }
            o->requests = 0;
            break;
        case 'm':
            colon = strchr(optarg, ':');
            if (colon != NULL) {
                *colon = '\0';
            }
            if (msv_opt_long("--max-tokens", optarg, 1, 1000000,
                             &o->max_tokens) != 0
                || (colon != NULL
                    && msv_opt_long("--max-tokens", colon + 1,
                                    o->max_tokens, 1000000,
                                    &o->max_tokens_hi) != 0))
            {
                return -1;
            }
            o->max_tokens_hi = colon != NULL ? o->max_tokens_hi : 0;
            break;
        case 'G':
            if (msv_opt_long("--group", optarg, 1, 1000000, &o->group)
                != 0)
            {
                return -1;
            }
            break;
        case 'K':
            if (msv_opt_long("--n", optarg, 1, 1024, &o->n) != 0) {
                return -1;
            }
            break;
        case 'j':
            if (msv_opt_long("--threads", optarg, 1, MSV_LOAD_MAX_THREADS,
                             &o->threads) != 0)
            {
                return -1;
            }
            break;
        case 'F':
            o->csv = optarg;
            break;
        case 'L':
            o->label = optarg;
            break;
        case 'X':
            if (optarg[0] != '/' || strpbrk(optarg, " \r\n") != NULL) {
                fprintf(stderr, "e2e_load: --metrics: \"%s\" is not a path "
                        "(\"/metrics\")\n", optarg);
                return -1;
            }
            o->metrics = optarg;
            break;
        case 'E':
            if (msv_opt_long("--ignore-eos", optarg, 0, 1, &v) != 0) {
                return -1;
            }
            o->ignore_eos = (int) v;
            break;
        case 'M':
            modes = optarg;
            break;
        case 'k':
            if (msv_opt_long("--top-k", optarg, -1, INT32_MAX, &o->top_k)
                != 0)
            {
                return -1;
            }
            break;
        case 'P':
            if (msv_opt_double("--top-p", optarg, 1e-9, 1.0, &o->top_p)
                != 0)
            {
                return -1;
            }
            break;
        case 'T':
            if (msv_opt_double("--temperature", optarg, 0, 1000,
                               &o->temperature) != 0)
            {
                return -1;
            }
            break;
        case 'l':
            if (msv_opt_long("--prompt-len", optarg, 1, 1000000,
                             &o->prompt_len) != 0)
            {
                return -1;
            }
            break;
        case 'V':
            if (msv_opt_long("--vocab", optarg, 2, INT32_MAX, &o->vocab)
                != 0)
            {
                return -1;
            }
            break;
        case 'N':
            o->stream = 0;
            break;
        case 'r':
            if (msv_opt_long("--repeats", optarg, 1, MSV_LOAD_MAX_REPEATS,
                             &o->repeats) != 0)
            {
                return -1;
            }
            break;
        case 'w':
            if (msv_opt_long("--warmup", optarg, 0, 100000000, &o->warmup)
                != 0)
            {
                return -1;
            }
            break;
        case 't':
            if (msv_opt_double("--timeout", optarg, 0.1, 86400, &o->timeout)
                != 0)
            {
                return -1;
            }
            break;
        case 'S':
            if (msv_opt_long("--seed", optarg, 0, LONG_MAX, &v) != 0) {
                return -1;
            }
            o->seed = (uint64_t) v;
            break;
        case 'e':
            if (msv_opt_long("--print-errors", optarg, 0, 1000000,
                             &o->print_errors) != 0)
            {
                return -1;
            }
            break;
        case 'Y':
            if (msv_opt_long("--same-tokens", optarg, 0, 1, &v) != 0) {
                return -1;
            }
            o->same_tokens = (int) v;
            break;
        case 'C':
            if (msv_opt_watch(o, optarg) != 0) {
                return -1;
            }
            break;
        case 'h':
            msv_usage(stdout);
            exit(0);
        default:
            msv_usage(stderr);
            return -1;
        }
    }

    if (optind != argc) {
        fprintf(stderr, "e2e_load: unexpected argument \"%s\"\n",
                argv[optind]);
        return -1;
    }
    if (o->port == NULL) {
        fprintf(stderr, "e2e_load: --port is required\n");
        msv_usage(stderr);
        return -1;
    }
    if (o->warmup < 0) {
        o->warmup = o->conc;
    }
    if (o->threads < 0) {
        v = sysconf(_SC_NPROCESSORS_ONLN);
        o->threads = v < 1 ? 1 : v > 8 ? 8 : v;
    }
    if (o->threads > o->conc) {
        o->threads = o->conc;
    }
    return msv_opt_modes(o, modes);
}


/* ------------------------------------------------------------------ */
/* The per-run CSV (--csv)                                              */

static FILE *
msv_csv_open(const msv_load_opts_t *o)
{
    FILE  *f;
    int    i;

    f = fopen(o->csv, "a");
    if (f == NULL) {
        fprintf(stderr, "e2e_load: --csv %s: %s\n", o->csv, strerror(errno));
        return NULL;
    }
    if (ftell(f) == 0) {
        fprintf(f, "label,mode,repeat,t0_ns,t1_ns,requests,ok,failed,"
                "mismatches,tokens,mask_ids,bytes,wall_s,client_cpu_s,"
                "choices,same_tokens");
        for (i = 0; i < o->n_watch; i++) {
            fprintf(f, ",%s_cpu_s,%s_rss_kb,%s_hwm_kb", o->watch[i].label,
                    o->watch[i].label, o->watch[i].label);
        }
        if (o->metrics != NULL) {
            fprintf(f, ",fmt_rows,fmt_ids,fmt_floats,fmt_bytes,fmt_ids_s,"
                    "fmt_floats_s");
        }
        fprintf(f, "\n");
    }
    return f;
}


static int
msv_csv_run(const msv_load_opts_t *o, const msv_run_t *run, long rep)
{
    FILE  *f;
    int    i;

    if (o->csv == NULL) {
        return 0;
    }
    f = msv_csv_open(o);
    if (f == NULL) {
        return -1;
    }
    fprintf(f, "%s,%s,%ld,%lld,%lld,%ld,%ld,%ld,%ld,%lld,%lld,%lld,%.6f,"
            "%.6f,%ld,%d", o->label, msv_mode_names[run->mode], rep + 1,
            (long long) (run->t0 * 1e9), (long long) (run->t_last * 1e9),
            run->issued, run->ok, run->failed, run->mismatches, run->tokens,
            run->mask_ids, run->bytes, run->t_last - run->t0, run->cpu,
            o->n, o->same_tokens);
    for (i = 0; i < o->n_watch; i++) {
        fprintf(f, ",%.6f,%lld,%lld", run->wcpu[i], run->rss_kb[i],
                run->hwm_kb[i]);
    }
    if (o->metrics != NULL) {
        const msv_fmt_count_t  *c = &run->fmt.f[msv_packed_of(run->mode)];

        fprintf(f, ",%.0f,%.0f,%.0f,%.0f,%.9f,%.9f", c->rows, c->ids,
                c->floats, c->bytes, c->ids_s, c->floats_s);
    }
    fprintf(f, "\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "e2e_load: --csv %s: write failed\n", o->csv);
        return -1;
    }
    return 0;
}


/* ------------------------------------------------------------------ */

int
main(int argc, char **argv)
{
    msv_client_t      C;
    msv_load_opts_t  *o = &C.o;
    msv_run_t        *runs, warm;
    struct addrinfo   hints;
    double            v[MSV_LOAD_MAX_REPEATS];
    int               base_m;
    long              i, r;
    int               m, mode, rc;

    memset(&C, 0, sizeof(C));
    if (msv_parse_opts(argc, argv, o) != 0) {
        return 2;
    }

    if (signal(SIGPIPE, SIG_IGN) == SIG_ERR) {
        perror("e2e_load: signal");
        return 1;
    }

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc = getaddrinfo(o->host, o->port, &hints, &C.ai);
    if (rc != 0) {
        fprintf(stderr, "e2e_load: %s:%s: %s\n", o->host, o->port,
                gai_strerror(rc));
        return 1;
    }

    if (msv_client_init(&C) != 0) {
        return 1;
    }
    runs = calloc((size_t) (o->repeats * o->n_modes), sizeof(msv_run_t));
    if (runs == NULL) {
        fprintf(stderr, "e2e_load: out of memory\n");
        return 1;
    }

    printf("e2e_load: %s:%s, %ld streams%s, %s%ld requests per run, "
           "max_tokens %ld, ignore_eos %d, prompt %ld tokens, top_k %ld, "
           "top_p %g, temperature %g, n %ld, %ld repeats, %ld client "
           "threads\n",
           o->host, o->port, o->conc, o->stream ? "" : " (non-streaming)",
           o->requests ? "" : "duration mode: ",
           o->requests ? o->requests : 0, o->max_tokens, o->ignore_eos,
           o->prompt_len, o->top_k, o->top_p, o->temperature, o->n,
           o->repeats, C.n_loops);
    if (o->requests == 0) {
        printf("e2e_load: %.1f s per run\n", o->duration);
    }

    /* warm-up: opens the connections; its tokens seed the cross-checks */
    if (o->warmup > 0) {
        if (msv_run(&C, &warm, o->modes[0], o->warmup) != 0) {
            return 1;
        }
        printf("warm-up (mask %s): %ld ok, %ld failed\n",
               msv_mode_names[o->modes[0]], warm.ok, warm.failed);
        msv_run_free(&warm);
    }

    for (r = 0; r < o->repeats; r++) {
        for (m = 0; m < o->n_modes; m++) {
            /* rotate the order so no mode always runs first */
            mode = o->modes[(m + r) % o->n_modes];
            msv_run_t  *run = &runs[r * o->n_modes + (m + r) % o->n_modes];

            if (msv_run(&C, run, mode, o->requests) != 0) {
                return 1;
            }
            msv_run_summary(o, run);
            msv_run_print(o, run, r);
            if (msv_csv_run(o, run, r) != 0) {
                return 1;
            }
        }
    }

    /* the table: medians over the repeats */
    printf("\n%ld concurrent %s, max_tokens %ld, top_k %ld; median of %ld "
           "runs per mode; req/s vs off: median of the ratios within a "
           "repeat (min-max)\n\n", o->conc,
           o->stream ? "streams" : "requests", o->max_tokens, o->top_k,
           o->repeats);
    printf("| mask | req/s | tokens/s | %s p50 ms | %s p99 ms | latency "
           "p50 ms | latency p99 ms | MB/s | KB/resp | mask ids/token | "
           "client CPU ms/resp |", o->stream ? "TTFE" : "TTFB",
           o->stream ? "TTFE" : "TTFB");
    for (i = 0; i < o->n_watch; i++) {
        printf(" %s CPU ms/resp |", o->watch[i].label);
    }
    printf(" req/s vs off |\n|---|---|---|---|---|---|---|---|---|---|---|");
    for (i = 0; i < o->n_watch; i++) {
        printf("---|");
    }
    printf("---|\n");

    base_m = -1;
    for (m = 0; m < o->n_modes; m++) {
        if (o->modes[m] == MSV_MODE_OFF) {
            base_m = m;
        }
    }

    for (m = 0; m < o->n_modes; m++) {
        msv_run_t  *run;
        long        fail = 0;
        double      med[10 + MSV_LOAD_MAX_WATCH], lo, hi;
        int         q;

        for (q = 0; q < 10 + o->n_watch; q++) {
            for (r = 0; r < o->repeats; r++) {
                run = &runs[r * o->n_modes + m];

                switch (q) {
                case 0: v[r] = run->rps; break;
                case 1: v[r] = run->tps; break;
                case 2: v[r] = run->ttfe50; break;
                case 3: v[r] = run->ttfe99; break;
                case 4: v[r] = run->lat50; break;
                case 5: v[r] = run->lat99; break;
                case 6: v[r] = run->mbps; break;
                case 7: v[r] = run->ids_per_token; break;
                case 8: v[r] = run->cpu_ms; break;
                case 9: v[r] = run->kb_resp; break;
                default: v[r] = run->wcpu_ms[q - 10]; break;
                }
            }
            med[q] = msv_median(v, o->repeats);
        }
        for (r = 0; r < o->repeats; r++) {
            run = &runs[r * o->n_modes + m];
            fail += run->failed + !run->steady
                    + (o->same_tokens ? run->mismatches : 0);
        }

        mode = o->modes[m];
        printf("| %s | %.1f | %.0f | %.1f | %.1f | %.1f | %.1f | %.2f | "
               "%.1f | %.1f | %.2f | ", msv_mode_names[mode], med[0], med[1],
               med[2], med[3], med[4], med[5], med[6], med[9], med[7],
               med[8]);
        for (q = 0; q < o->n_watch; q++) {
            printf("%.3f | ", med[10 + q]);
        }

        if (base_m < 0) {
            printf("- |");
        } else {
            for (r = 0; r < o->repeats; r++) {
                v[r] = runs[r * o->n_modes + m].rps
                       / runs[r * o->n_modes + base_m].rps;
            }
            lo = hi = v[0];
            for (r = 1; r < o->repeats; r++) {
                lo = v[r] < lo ? v[r] : lo;
                hi = v[r] > hi ? v[r] : hi;
            }
            printf("%.2f (%.2f-%.2f) |", msv_median(v, o->repeats), lo, hi);
        }
        printf("%s\n", fail ? " (failures or runs without a steady window)"
                            : "");
    }

    printf("\nvalidation: %lld failed responses, %lld token_ids mismatches "
           "across modes and repeats%s\n", C.total_failed, C.total_mismatches,
           o->same_tokens ? "" : " (--same-tokens 0: reported, not failed)");

    for (i = 0; i < o->repeats * o->n_modes; i++) {
        msv_run_free(&runs[i]);
    }
    free(runs);
    msv_client_free(&C);
    freeaddrinfo(C.ai);

    return C.total_failed || (o->same_tokens && C.total_mismatches) ? 1 : 0;
}
