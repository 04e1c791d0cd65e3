/*
 * main.c: the maskserve worker process.  One per GPU (or one on the CPU):
 * load a model, create the shared-memory region, then schedule, run,
 * sample and publish until SIGTERM.
 *
 * On SIGTERM or SIGINT the worker drains: it stops admitting (state
 * DRAINING: nginx takes no new request for it and takes it out of the
 * Redis registry) and keeps stepping the requests in flight until they
 * have all finished or --drain-timeout has passed (no reader attached:
 * nobody would read them, so at once).  Those still running then are
 * aborted with abort reason "shutdown" (each gets its abort row); the
 * readers get up to MSV_DRAIN_READERS_NS more to consume those rows, then
 * the region is marked STOPPED and unlinked.  A second signal ends the
 * drain at once and skips the wait.
 */

#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../shm/msv_region.h"
#include "../shm/msv_ipc.h"
#include "../shm/msv_ring.h"
#include "backend.h"
#include "control.h"
#include "log.h"
#include "model.h"
#include "scheduler.h"

struct msv_opts {
    const char  *model_dir;
    const char  *dummy;
    const char  *backend;
    const char  *sampler;
    const char  *precision;
    int          batch_invariant;
    const char  *shm;
    const char  *weight_version;
    uint32_t     max_num_seqs;
    uint32_t     max_model_len;
    uint32_t     max_batched;
    uint32_t     max_logprobs;
    uint64_t     ring_bytes;
    uint64_t     kv_tokens;
    double       gpu_fraction;
    int          no_prefix_caching;
    uint64_t     seed;
    int          has_seed;
    int          threads;
    int          sample_threads;
    double       reader_timeout;
    double       drain_timeout;
    double       step_timeout;
    const char  *step_log;
    uint32_t     share_group;    /* --group given */
    uint32_t     gid;
};

static volatile sig_atomic_t  msv_stop;
static struct msv_ctrl       *msv_hb_ctrl;

/*
 * What the heartbeat thread watches: the main loop's last turn, and when
 * the step it is in began (0: between steps).
 */
static _Atomic uint64_t       msv_loop_ns;
static _Atomic uint64_t       msv_step_ns;
static uint64_t               msv_step_timeout_ns;

/* the main loop comes round every 100 ms when idle; this late, it hangs */
#define MSV_LOOP_HUNG_NS      2000000000ULL

/* after the drain deadline: how long readers have to read the abort rows */
#define MSV_DRAIN_READERS_NS  1000000000ULL


static void
msv_on_signal(int sig)
{
    (void) sig;
    msv_stop++;
}


static void
msv_usage(FILE *f)
{
    fprintf(f,
"usage: maskserve-worker (--model DIR | --dummy PRESET|CONFIG.json) [options]\n"
"  --model DIR              Hugging Face checkpoint: config.json + *.safetensors\n"
"  --dummy PRESET|FILE      random weights: tiny, qwen3-0.6b, qwen3-8b,\n"
"                           llama3-8b, or a config.json\n"
"  --backend auto|cpu|cuda  (default auto: cuda when a GPU is usable)\n"
"  --precision bf16|split   CUDA activations and KV: bf16 (default) or\n"
"                           split fp32 (hi + lo bf16 products, fp32 KV)\n"
"  --batch-invariant        CUDA: a request's logits do not depend on the\n"
"                           batch it runs in (one summation order pinned\n"
"                           per product shape)\n"
"  --shm NAME               region name (default maskserve-0)\n"
"  --weight-version STR     the version of the weights served, reported in\n"
"                           /health, /v1/models and /metrics (default 0)\n"
"  --max-num-seqs N         concurrent requests (default 64)\n"
"  --max-model-len N        prompt + output tokens (default: the model's,\n"
"                           at most 32768)\n"
"  --max-num-batched-tokens N  tokens per step (default 2048)\n"
"  --max-logprobs N         largest sampling_params.logprobs (default 128)\n"
"  --kv-tokens N            KV cache size in tokens (default: cpu, enough\n"
"                           for every sequence at full length; cuda, what\n"
"                           fits in --gpu-memory-fraction)\n"
"  --gpu-memory-fraction F  share of GPU memory the cuda backend fills with\n"
"                           weights, scratch and KV when --kv-tokens is not\n"
"                           given, 0 < F <= 1 (default 0.9)\n"
"  --no-prefix-caching      do not share KV pages between prompts that\n"
"                           start alike (default: shared)\n"
"  --ring-bytes SIZE        output ring size, power of two (default 64M)\n"
"  --seed N                 seed for requests that bring none (default:\n"
"                           random)\n"
"  --threads N              CPU backend threads (default: all cores)\n"
"  --sample-threads N       threads sampling the rows of a step (default:\n"
"                           one per core, at most 16)\n"
"  --sampler auto|cpu       where tokens are sampled (default auto: on the\n"
"                           GPU with the CUDA backend, else on the CPU)\n"
"  --reader-timeout SEC     evict a reader that stalls the ring (default 10)\n"
"  --drain-timeout SEC      on SIGTERM, the requests in flight have this\n"
"                           long to finish; those still running then end\n"
"                           with a \"shutting down\" error (default 30)\n"
"  --step-timeout SEC       a step running longer is hung: the heartbeat\n"
"                           stops (default 600)\n""  --step-log FILE          a line per model step: times, batch, stage\n"
"                           costs (docs/SCHEDULER.md, \"Step log\")\n"
"  --group NAME|GID         region and socket 0660 for this group (nginx's\n"
"                           workers run in it); default 0600, owner only\n"
"  --log-level LEVEL        error, warn, info, debug (default info)\n");
}


static int
msv_parse_u64(const char *opt, const char *s, uint64_t *out, int sizes)
{
    char               *end;
    unsigned long long  v;

    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || s[0] == '-') {
        goto bad;
    }
    if (sizes && *end != '\0') {
        switch (*end++) {
        case 'k': case 'K': v <<= 10; break;
        case 'm': case 'M': v <<= 20; break;
        case 'g': case 'G': v <<= 30; break;
        default: goto bad;
        }
    }
    if (*end != '\0') {
        goto bad;
    }
    *out = v;
    return 0;

bad:
    fprintf(stderr, "maskserve-worker: %s: invalid value \"%s\"\n", opt, s);
    return -1;
}


static int
msv_parse_args(int argc, char **argv, struct msv_opts *o)
{
    int             c, idx;
    char           *end;
    double          d;
    uint64_t        v;
    unsigned long   ul;
    struct group   *gr;

    static const struct option  longopts[] = {
        { "model",                  required_argument, 0, 'm' },
        { "dummy",                  required_argument, 0, 'd' },
        { "backend",                required_argument, 0, 'b' },
        { "precision",              required_argument, 0, 'A' },
        { "batch-invariant",        no_argument,       0, 'I' },
        { "shm",                    required_argument, 0, 's' },
        { "weight-version",         required_argument, 0, 'W' },
        { "max-num-seqs",           required_argument, 0, 'n' },
        { "max-model-len",          required_argument, 0, 'l' },
        { "max-num-batched-tokens", required_argument, 0, 'B' },
        { "max-logprobs",           required_argument, 0, 'L' },
        { "kv-tokens",              required_argument, 0, 'k' },
        { "gpu-memory-fraction",    required_argument, 0, 'G' },
        { "no-prefix-caching",      no_argument,       0, 'C' },
        { "ring-bytes",             required_argument, 0, 'r' },
        { "seed",                   required_argument, 0, 'S' },
        { "threads",                required_argument, 0, 't' },
        { "sample-threads",         required_argument, 0, 'T' },
        { "sampler",                required_argument, 0, 'P' },
        { "reader-timeout",         required_argument, 0, 'R' },
        { "drain-timeout",          required_argument, 0, 'D' },
        { "step-timeout",           required_argument, 0, 'X' },
        { "step-log",               required_argument, 0, 'Z' },
        { "group",                  required_argument, 0, 'g' },
        { "log-level",              required_argument, 0, 'v' },
        { "help",                   no_argument,       0, 'h' },
        { 0, 0, 0, 0 }
    };

    memset(o, 0, sizeof(*o));
    o->backend = "auto";
    o->sampler = "auto";
    o->shm = "maskserve-0";
    o->weight_version = "0";
    o->max_num_seqs = 64;
    o->max_batched = 2048;
    o->max_logprobs = 128;
    o->ring_bytes = 64ULL << 20;
    o->reader_timeout = 10.0;
    o->drain_timeout = 30.0;
    o->step_timeout = 600.0;

    while ((c = getopt_long(argc, argv, "h", longopts, &idx)) != -1) {
        switch (c) {
        case 'm': o->model_dir = optarg; break;
        case 'd': o->dummy = optarg; break;
        case 'b': o->backend = optarg; break;
        case 'P': o->sampler = optarg; break;
        case 'A': o->precision = optarg; break;
        case 'I': o->batch_invariant = 1; break;
        case 's': o->shm = optarg; break;
        case 'W':
            if (optarg[0] == '\0' || strlen(optarg) > MSV_VERSION_MAX
                || strpbrk(optarg, "\"\\\n") != NULL)
            {
                fprintf(stderr, "maskserve-worker: --weight-version: 1..%d "
                        "characters, no quote, backslash or newline\n",
                        MSV_VERSION_MAX);
                return -1;
            }
            o->weight_version = optarg;
            break;
        case 'n':
            if (msv_parse_u64("--max-num-seqs", optarg, &v, 0) || v < 1
                || v > 4096)
            {
                fprintf(stderr, "maskserve-worker: --max-num-seqs: must be "
                        "1..4096\n");
                return -1;
            }
            o->max_num_seqs = (uint32_t) v;
            break;
        case 'l':
            if (msv_parse_u64("--max-model-len", optarg, &v, 0) || v < 2
                || v > (1u << 20))
            {
                fprintf(stderr, "maskserve-worker: --max-model-len: must be "
                        "2..1048576\n");
                return -1;
            }
            o->max_model_len = (uint32_t) v;
            break;
        case 'B':
            if (msv_parse_u64("--max-num-batched-tokens", optarg, &v, 0)
                || v < 1 || v > (1u << 20))
            {
                fprintf(stderr, "maskserve-worker: --max-num-batched-tokens: "
                        "must be 1..1048576\n");
                return -1;
            }
            o->max_batched = (uint32_t) v;
            break;
        case 'L':
            if (msv_parse_u64("--max-logprobs", optarg, &v, 0)
                || v > MSV_MAX_LOGPROBS)
            {
                fprintf(stderr, "maskserve-worker: --max-logprobs: must be "
                        "0..%d\n", MSV_MAX_LOGPROBS);
                return -1;
            }
            o->max_logprobs = (uint32_t) v;
            break;
        case 'k':
            if (msv_parse_u64("--kv-tokens", optarg, &o->kv_tokens, 0)) {
                return -1;
            }
            break;
        case 'G':
            errno = 0;
            d = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(d > 0) || d > 1) {
                fprintf(stderr, "maskserve-worker: --gpu-memory-fraction: "
                        "must be in (0, 1], not \"%s\"\n", optarg);
                return -1;
            }
            o->gpu_fraction = d;
            break;
        case 'C':
            o->no_prefix_caching = 1;
            break;
        case 'r':
            if (msv_parse_u64("--ring-bytes", optarg, &o->ring_bytes, 1)) {
                return -1;
            }
            break;
        case 'S':
            if (msv_parse_u64("--seed", optarg, &o->seed, 0)) {
                return -1;
            }
            o->has_seed = 1;
            break;
        case 't':
            if (msv_parse_u64("--threads", optarg, &v, 0) || v > 1024) {
                fprintf(stderr, "maskserve-worker: --threads: must be "
                        "0..1024\n");
                return -1;
            }
            o->threads = (int) v;
            break;
        case 'Z':
            o->step_log = optarg;
            break;
        case 'T':
            if (msv_parse_u64("--sample-threads", optarg, &v, 0) || v > 16) {
                fprintf(stderr, "maskserve-worker: --sample-threads: must be "
                        "0..16\n");
                return -1;
            }
            o->sample_threads = (int) v;
            break;
        case 'R':
        case 'D':
        case 'X':
            errno = 0;
            d = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(d >= 0) || d > 86400
                || (c == 'X' && d < 1))
            {
                fprintf(stderr, "maskserve-worker: --%s: invalid value "
                        "\"%s\"%s\n", c == 'R' ? "reader-timeout"
                        : c == 'D' ? "drain-timeout" : "step-timeout",
                        optarg, c == 'X' ? " (1 to 86400 s)" : "");
                return -1;
            }
            if (c == 'R') {
                o->reader_timeout = d;
            } else if (c == 'D') {
                o->drain_timeout = d;
            } else {
                o->step_timeout = d;
            }
            break;
        case 'g':
            errno = 0;
            gr = getgrnam(optarg);
            if (gr != NULL) {
                o->gid = (uint32_t) gr->gr_gid;
            } else {
                ul = strtoul(optarg, &end, 10);
                if (end == optarg || *end || optarg[0] == '-'
                    || ul > UINT32_MAX - 1)
                {
                    fprintf(stderr, "maskserve-worker: --group: no group "
                            "\"%s\"\n", optarg);
                    return -1;
                }
                o->gid = (uint32_t) ul;
            }
            o->share_group = 1;
            break;
        case 'v':
            if (strcmp(optarg, "error") == 0) {
                msv_log_level = MSV_LOG_ERROR;
            } else if (strcmp(optarg, "warn") == 0) {
                msv_log_level = MSV_LOG_WARN;
            } else if (strcmp(optarg, "info") == 0) {
                msv_log_level = MSV_LOG_INFO;
            } else if (strcmp(optarg, "debug") == 0) {
                msv_log_level = MSV_LOG_DEBUG;
            } else {
                fprintf(stderr, "maskserve-worker: --log-level: unknown "
                        "level \"%s\"\n", optarg);
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

    if (optind < argc) {
        fprintf(stderr, "maskserve-worker: unexpected argument \"%s\"\n",
                argv[optind]);
        return -1;
    }
    if ((o->model_dir == NULL) == (o->dummy == NULL)) {
        fprintf(stderr, "maskserve-worker: give exactly one of --model DIR "
                "or --dummy PRESET\n");
        return -1;
    }
    if (!msv_name_valid(o->shm)) {
        fprintf(stderr, "maskserve-worker: --shm: \"%s\" is not a valid name "
                "([A-Za-z0-9._-], 1..%d characters)\n", o->shm, MSV_NAME_MAX);
        return -1;
    }
    if (o->ring_bytes < (1u << 16) || (o->ring_bytes & (o->ring_bytes - 1))) {
        fprintf(stderr, "maskserve-worker: --ring-bytes: must be a power of "
                "two of at least 64K\n");
        return -1;
    }
    if (strcmp(o->backend, "auto") && strcmp(o->backend, "cpu")
        && strcmp(o->backend, "cuda"))
    {
        fprintf(stderr, "maskserve-worker: --backend: must be auto, cpu or "
                "cuda\n");
        return -1;
    }
    if (strcmp(o->sampler, "auto") && strcmp(o->sampler, "cpu")) {
        fprintf(stderr, "maskserve-worker: --sampler: must be auto or cpu\n");
        return -1;
    }
    if (o->precision != NULL && strcmp(o->precision, "bf16")
        && strcmp(o->precision, "split"))
    {
        fprintf(stderr, "maskserve-worker: --precision: must be bf16 or "
                "split\n");
        return -1;
    }

    return 0;
}


/*
 * The heartbeat comes from its own thread so that a long step (a long
 * prefill, a weight update, a CUDA graph capture, a big model on the CPU)
 * does not look like a dead worker.  It beats only while the main loop is
 * alive: between steps the loop must come round within MSV_LOOP_HUNG_NS,
 * and a step may run up to --step-timeout.  Past either the worker is
 * hung, the heartbeat stops, and readers give up on it after their stall
 * limit.  A stopped or dead process stops it too.  step_ms tells readers
 * how long the running step has taken ("busy", not "hung").
 */
static void *
msv_heartbeat_main(void *arg)
{
    int              hung, was_hung;
    uint64_t         now, loop, step;
    struct timespec  ts = { 0, 100 * 1000000L };

    (void) arg;
    was_hung = 0;

    for ( ;; ) {
        now = msv_now_ns();
        loop = atomic_load_explicit(&msv_loop_ns, memory_order_relaxed);
        step = atomic_load_explicit(&msv_step_ns, memory_order_relaxed);

        if (step != 0) {
            hung = now > step && now - step > msv_step_timeout_ns;
            atomic_store_explicit(&msv_hb_ctrl->step_ms,
                                  now > step ? (uint32_t) ((now - step)
                                                           / 1000000) : 0,
                                  memory_order_relaxed);
        } else {
            hung = now > loop && now - loop > MSV_LOOP_HUNG_NS;
            atomic_store_explicit(&msv_hb_ctrl->step_ms, 0,
                                  memory_order_relaxed);
        }

        if (!hung) {
            atomic_store_explicit(&msv_hb_ctrl->heartbeat_ns, now,
                                  memory_order_relaxed);
        }

        if (hung != was_hung) {
            if (hung && step != 0) {
                msv_err("a step has run for %.0f s (--step-timeout): the "
                        "worker is hung, heartbeat stopped",
                        (double) (now - step) / 1e9);
            } else if (hung) {
                msv_err("the main loop has not come round for %.1f s: the "
                        "worker is hung, heartbeat stopped",
                        (double) (now - loop) / 1e9);
            } else {
                msv_warn("the worker makes progress again: heartbeat "
                         "resumed");
            }
            was_hung = hung;
        }

        nanosleep(&ts, NULL);
    }
    return NULL;
}


static void
msv_forget(void *ud, uint32_t slot)
{
    msv_sched_forget(ud, slot);
}


/*
 * One turn of the main loop: submissions and reader events (waiting up
 * to idle_ms when nothing can run, once the last step's rows are out),
 * the control mailbox between two steps, then a step.  A signal count
 * reaching stop_at while polling skips the step.  -1 (the scheduler's
 * error logged): the worker must stop.
 */
static int
msv_loop_once(struct msv_ipc *ipc, struct msv_control *control,
    struct msv_sched *sched, int idle_ms, int stop_at)
{
    int  runnable;

    atomic_store_explicit(&msv_loop_ns, msv_now_ns(), memory_order_relaxed);
    runnable = msv_sched_runnable(sched);
    if (!runnable && msv_sched_flush(sched) != 0) {
        msv_err("fatal: %s", sched->err);
        return -1;
    }
    msv_ipc_poll(ipc, runnable ? 0 : idle_ms);
    if (msv_stop >= stop_at) {
        return 0;
    }
    if (msv_control_poll(control) != 0) {
        msv_err("fatal: %s", sched->err);
        return -1;
    }
    atomic_store_explicit(&msv_step_ns, msv_now_ns(), memory_order_relaxed);
    if (msv_sched_step(sched) < 0) {
        atomic_store_explicit(&msv_step_ns, 0, memory_order_relaxed);
        msv_err("fatal: %s", sched->err);
        return -1;
    }
    atomic_store_explicit(&msv_step_ns, 0, memory_order_relaxed);
    return 0;
}


int
main(int argc, char **argv)
{
    int                             rc, use_cuda;
    uint32_t                        page_tokens;
    char                            err[512];
    uint64_t                        t0, seed, head;
    pthread_t                       hb;
    struct msv_opts                 o;
    struct msv_ipc                  ipc;
    struct msv_sched                sched;
    struct msv_control              control;
    struct msv_layout               lay;
    struct msv_region               rg;
    struct msv_weights              w;
    struct msv_backend             *be;
    struct msv_producer             prod;
    struct sigaction                sa;
    struct msv_model_config         cfg;
    const struct msv_backend_ops   *ops;

    if (msv_parse_args(argc, argv, &o) != 0) {
        return 2;
    }

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = msv_on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* model */
    memset(&w, 0, sizeof(w));
    t0 = msv_now_ns();

    if (o.model_dir != NULL) {
        char  path[4096];

        snprintf(path, sizeof(path), "%s/config.json", o.model_dir);
        if (msv_config_load(path, &cfg, err, sizeof(err)) != 0) {
            fprintf(stderr, "maskserve-worker: %s\n", err);
            return 1;
        }
        msv_info("loading %s (%s)", o.model_dir, cfg.name);
        if (msv_weights_load(o.model_dir, &w, err, sizeof(err)) != 0) {
            fprintf(stderr, "maskserve-worker: %s\n", err);
            return 1;
        }

    } else {
        /* a preset name, or a config.json path: shapes for dummy weights */
        if (msv_config_preset(o.dummy, &cfg, err, sizeof(err)) != 0) {
            fprintf(stderr, "maskserve-worker: %s\n", err);
            return 1;
        }
        msv_info("making dummy weights for %s", cfg.name);
        if (msv_weights_dummy(&cfg, o.has_seed ? o.seed : 0, &w, err,
                              sizeof(err)) != 0)
        {
            fprintf(stderr, "maskserve-worker: %s\n", err);
            return 1;
        }
    }

    if (msv_weights_check(&cfg, &w, err, sizeof(err)) != 0) {
        fprintf(stderr, "maskserve-worker: %s\n", err);
        return 1;
    }

    msv_info("%d tensors loaded in %.1f s", w.n,
             (double) (msv_now_ns() - t0) / 1e9);

    if (o.max_model_len == 0) {
        o.max_model_len = cfg.max_pos < 32768 ? cfg.max_pos : 32768;
    }
    if (o.max_model_len > cfg.max_pos) {
        fprintf(stderr, "maskserve-worker: --max-model-len %u exceeds the "
                "model's max_position_embeddings %u\n", o.max_model_len,
                cfg.max_pos);
        return 1;
    }

    /* backend */
    use_cuda = strcmp(o.backend, "cuda") == 0
               || (strcmp(o.backend, "auto") == 0 && msv_cuda_available());
    ops = use_cuda ? msv_backend_cuda() : &msv_backend_cpu;
    if (ops == NULL) {
        fprintf(stderr, "maskserve-worker: --backend cuda: this build has no "
                "CUDA backend (nvcc was not found at build time)\n");
        return 1;
    }
    if (use_cuda && !msv_cuda_available()) {
        fprintf(stderr, "maskserve-worker: --backend cuda: no usable GPU\n");
        return 1;
    }
    if (!use_cuda && strcmp(o.backend, "auto") == 0) {
        /* say why: a GPU machine may serve on the CPU without noticing */
        if (msv_backend_cuda() == NULL) {
            msv_warn("serving on the CPU: this build has no CUDA backend "
                     "(nvcc was not found when it was built); install the "
                     "CUDA toolkit and rebuild to use a GPU");
        } else {
            msv_warn("serving on the CPU: no usable GPU was found (CUDA "
                     "reports no device)");
        }
    }

    msv_info("building the %s backend: %s, %llu parameters, %s",
             ops->name, msv_arch_name(cfg.arch),
             (unsigned long long) msv_config_n_params(&cfg),
             msv_dtype_name(cfg.dtype));
    /* the CUDA backend reads its precision from MSV_CUDA_ACT and the
     * batch-invariant mode from MSV_CUDA_INVARIANT at create */
    if ((o.precision != NULL && setenv("MSV_CUDA_ACT", o.precision, 1) != 0)
        || (o.batch_invariant && setenv("MSV_CUDA_INVARIANT", "1", 1) != 0))
    {
        fprintf(stderr, "maskserve-worker: --precision: setenv failed\n");
        return 1;
    }
    t0 = msv_now_ns();
    if (o.gpu_fraction > 0) {
        msv_cuda_set_memory_fraction(o.gpu_fraction);
    }
    be = ops->create(&cfg, &w, o.max_num_seqs, o.max_model_len, o.kv_tokens,
                     o.threads, err, sizeof(err));
    if (be == NULL) {
        fprintf(stderr, "maskserve-worker: %s backend: %s\n", ops->name, err);
        return 1;
    }
    msv_info("%s backend ready in %.1f s: %u sequences x %u tokens, "
             "%llu KV tokens", ops->name,
             (double) (msv_now_ns() - t0) / 1e9, o.max_num_seqs,
             o.max_model_len,
             (unsigned long long) ops->kv_pages(be, &page_tokens)
             * page_tokens);

    /* region */
    memset(&lay, 0, sizeof(lay));
    lay.n_slots = o.max_num_seqs;
    lay.n_readers = MSV_MAX_READERS;
    lay.vocab_size = cfg.vocab_size;
    lay.max_model_len = o.max_model_len;
    lay.max_logprobs = o.max_logprobs;
    lay.n_eos = cfg.n_eos;
    memcpy(lay.eos_ids, cfg.eos_ids, sizeof(lay.eos_ids));
    lay.ring_bytes = o.ring_bytes;
    lay.model = o.model_dir != NULL ? o.model_dir : cfg.name;
    lay.backend = ops->name;
    lay.share_group = o.share_group;
    lay.gid = o.gid;

    if (msv_region_create(&rg, o.shm, &lay, err, sizeof(err)) != 0) {
        fprintf(stderr, "maskserve-worker: %s\n", err);
        ops->destroy(be);
        return 1;
    }

    msv_hb_ctrl = rg.ctrl;
    msv_step_timeout_ns = (uint64_t) (o.step_timeout * 1e9);
    atomic_store(&msv_loop_ns, msv_now_ns());
    /* what is left of the start-up (the scheduler's set-up) counts as a
     * step: busy, not hung; the first step of the main loop ends it */
    atomic_store(&msv_step_ns, msv_now_ns());
    atomic_store(&rg.ctrl->heartbeat_ns, msv_now_ns());
    if (pthread_create(&hb, NULL, msv_heartbeat_main, NULL) != 0) {
        fprintf(stderr, "maskserve-worker: cannot start heartbeat thread\n");
        return 1;
    }
    pthread_detach(hb);

    if (msv_ipc_init(&ipc, rg.ctrl, &prod, (uint64_t) (o.reader_timeout * 1e9),
                     &msv_stop, err, sizeof(err)) != 0)
    {
        fprintf(stderr, "maskserve-worker: %s\n", err);
        msv_region_unlink(o.shm);
        return 1;
    }

    ipc.log = msv_log;
    if (o.share_group
        && msv_sock_share(rg.ctrl->sock_path, o.gid, err, sizeof(err)) != 0)
    {
        fprintf(stderr, "maskserve-worker: %s\n", err);
        msv_region_unlink(o.shm);
        return 1;
    }

    msv_producer_init(&prod, rg.ctrl, msv_ipc_ring_wait, &ipc);

    if (o.has_seed) {
        seed = o.seed;
    } else {
        seed = rg.ctrl->generation ^ msv_now_ns();
    }

    if (msv_sched_init(&sched, rg.ctrl, ops, be, &prod, o.max_batched, seed,
                       o.sample_threads, !o.no_prefix_caching) != 0)
    {
        fprintf(stderr, "maskserve-worker: %s\n", sched.err);
        msv_region_unlink(o.shm);
        return 1;
    }
    if (o.step_log != NULL && msv_sched_step_log(&sched, o.step_log) != 0) {
        fprintf(stderr, "maskserve-worker: %s\n", sched.err);
        msv_region_unlink(o.shm);
        return 1;
    }
    if (strcmp(o.sampler, "auto") == 0
        && msv_sched_device_sampler(&sched, err, sizeof(err)))
    {
        msv_info("sampler: on the device (logits stay there; rows are "
                 "copied into the ring)");
    } else {
        msv_info("sampler: on the CPU, %d threads%s%s",
                 msv_sample_pool_threads(sched.pool),
                 strcmp(o.sampler, "auto") == 0 ? "; " : "",
                 strcmp(o.sampler, "auto") == 0 ? err : "");
    }
    ipc.forget = msv_forget;
    ipc.forget_ud = &sched;
    if (msv_control_init(&control, rg.ctrl, &sched, o.weight_version, &cfg,
                         &w) != 0)
    {
        fprintf(stderr, "maskserve-worker: out of memory\n");
        msv_region_unlink(o.shm);
        return 1;
    }

    /* The GPU holds its own copy now, and the control has the names,
     * shapes and dtypes an update is checked against: drop the host copy
     * (file mappings or the dummy tensors), so the worker's resident
     * memory is its ring, staging and request state.  The CPU backend
     * computes from it. */
    if (use_cuda) {
        msv_weights_free(&w);
        msv_info("host copy of the weights released");
    }

    atomic_store_explicit(&rg.ctrl->state, MSV_WORKER_READY,
                          memory_order_release);
    msv_info("ready: region /%s, socket %s, generation %016llx, vocab %u",
             o.shm, rg.ctrl->sock_path,
             (unsigned long long) rg.ctrl->generation, cfg.vocab_size);

    /* serve */
    rc = 0;
    while (!msv_stop) {
        if (msv_loop_once(&ipc, &control, &sched, 100, 1) != 0) {
            rc = 1;
            break;
        }
    }

    /* drain: nothing new; the requests in flight run to their end or to
     * the deadline, whichever comes first */
    atomic_store(&rg.ctrl->state, MSV_WORKER_DRAINING);
    if (rc == 0) {
        msv_info("stopping: draining %u requests, %.1f s to finish",
                 msv_sched_pending(&sched), o.drain_timeout);
        t0 = msv_now_ns();
        while (msv_stop < 2 && msv_sched_pending(&sched) > 0
               && msv_ipc_readers(&ipc) > 0
               && msv_now_ns() - t0 < (uint64_t) (o.drain_timeout * 1e9))
        {
            if (msv_loop_once(&ipc, &control, &sched, 10, 2) != 0) {
                rc = 1;
                break;
            }
        }
    }

    /* the deadline: what still runs ends with an explicit error */
    msv_info("stopping: aborting %u requests", msv_sched_pending(&sched));
    if (rc == 0 && msv_sched_abort_all(&sched, MSV_ABORT_SHUTDOWN) == 0) {
        t0 = msv_now_ns();
        head = atomic_load(&rg.ctrl->head);
        while (msv_stop < 2 && msv_ipc_readers(&ipc) > 0
               && msv_ring_min_tail(rg.ctrl, head) < head
               && msv_now_ns() - t0 < MSV_DRAIN_READERS_NS)
        {
            atomic_store_explicit(&msv_loop_ns, msv_now_ns(),
                                  memory_order_relaxed);
            msv_ipc_poll(&ipc, 10);
        }
    } else if (rc != 0) {
        msv_sched_abort_all(&sched, MSV_ABORT_INTERNAL);
    }

    atomic_store(&rg.ctrl->state, MSV_WORKER_STOPPED);
    msv_ipc_close(&ipc);
    msv_region_unlink(o.shm);
    msv_info("stopped after %llu steps, %llu tokens",
             (unsigned long long) atomic_load(&rg.ctrl->steps),
             (unsigned long long) atomic_load(&rg.ctrl->tokens));

    msv_control_free(&control);
    msv_sched_free(&sched);
    ops->destroy(be);
    msv_weights_free(&w);
    return rc;
}
