/*
 * msv_shm.h: the shared-memory contract between one maskserve worker (the
 * producer, one process per GPU) and its readers (nginx worker processes,
 * the command-line client).  This is the only header that defines the
 * layout; both sides include it.  shm/README.md describes the protocol in
 * prose; everything a reader needs is here.
 *
 * Region (one per worker, POSIX shm object "/<name>", mode 0600):
 *
 *   +--------------------+ 0
 *   | struct msv_ctrl    |  control page: magic, version, offsets, model
 *   +--------------------+ ctrl->readers_off
 *   | msv_reader[R]      |  one per attached reader process (tails)
 *   +--------------------+ ctrl->slots_off
 *   | slot[S]            |  request slots, ctrl->slot_bytes each:
 *   |                    |  struct msv_slot, then prompt ids, logit bias
 *   +--------------------+ ctrl->ring_off
 *   | ring data          |  ctrl->ring_bytes, a power of two
 *   +--------------------+ ctrl->region_bytes
 *
 * All offsets are from the start of the region; nothing in the region is a
 * pointer.  Integers are native-endian (both sides run on one host).
 *
 * Wakeups and liveness travel over a unix stream socket, ctrl->sock_path:
 * a reader connects, sends struct msv_hello with its eventfd (SCM_RIGHTS);
 * the worker answers with struct msv_welcome and its own submission
 * eventfd.  The connection stays open: EOF on either side means the peer
 * died.
 */

#ifndef MSV_SHM_H
#define MSV_SHM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#include <atomic>
#define MSV_ATOMIC(t) std::atomic<t>
extern "C" {
#else
#include <stdalign.h>
#include <stdatomic.h>
#define MSV_ATOMIC(t) _Atomic t
#endif


#define MSV_MAGIC            0x31474b534d56534dULL   /* "MSVMSKG1" */
#define MSV_LAYOUT_VERSION   3
#define MSV_CACHELINE        64

#define MSV_MAX_EOS          8       /* eos ids the model declares */
#define MSV_MAX_STOP         32      /* stop_token_ids per request */
#define MSV_MAX_BIAS         1024    /* logit_bias entries per request */
#define MSV_MAX_LOGPROBS     1024    /* hard cap on sampling_params.logprobs */
#define MSV_MAX_N            1024    /* hard cap on sampling_params.n */
#define MSV_MAX_READERS      64
#define MSV_REQ_ID_MAX       128     /* request id, without the NUL */

/*
 * Liveness.  The worker's heartbeat thread beats every ~100 ms while the
 * worker is alive: between steps, and during a step however long it runs
 * (up to the worker's --step-timeout).  A heartbeat older than
 * MSV_HEARTBEAT_LATE_NS is late (the worker is stalled: stopped, swapped
 * out, hung); older than MSV_HEARTBEAT_STALE_NS (the default of nginx's
 * maskserve_worker_stall_timeout) the worker is given up and its requests
 * fail.  Readers beat too; the worker evicts readers with its own
 * --reader-timeout.
 */
#define MSV_HEARTBEAT_LATE_NS   1000000000ULL
#define MSV_HEARTBEAT_STALE_NS  10000000000ULL
#define MSV_NAME_MAX         64      /* region name, without the NUL */
#define MSV_SOCK_PATH_MAX    108     /* sizeof sun_path */

#define MSV_VERSION_MAX      64      /* weight version, without the NUL */
#define MSV_CMD_MSG_MAX      256     /* a command's message, with the NUL */
#define MSV_CMD_PATH_MAX     1024    /* a command's path, with the NUL */

/* histogram buckets of the control page (upper bounds, the last +Inf) */
#define MSV_STEP_BUCKETS     12      /* step time: 1 2 5 10 20 50 100 200
                                        500 1000 2000 ms, +Inf */
#define MSV_BATCH_BUCKETS    10      /* sequences a step: 1 2 4 ... 256,
                                        +Inf */

#define MSV_REC_ALIGN        16      /* records start on 16-byte bounds */
#define MSV_ROW_ALIGN        8       /* rows inside a record, 8 bytes */


/* ------------------------------------------------------------------ */
/* Control page                                                         */

enum msv_worker_state {
    MSV_WORKER_STARTING = 0,  /* region exists, model still loading */
    MSV_WORKER_READY    = 1,  /* accepting submissions */
    MSV_WORKER_DRAINING = 2,  /* SIGTERM: no new admissions */
    MSV_WORKER_STOPPED  = 3   /* exited cleanly; region about to go */
};

/*
 * The control channel: a mailbox in the control page through which a
 * reader asks the worker to act on the whole worker (pause, resume, flush
 * the prefix cache).  One command at a time:
 *
 *   FREE -> CLAIMED (reader, CAS with its pid) -> POSTED (reader, release,
 *   after op and arg) -> TAKEN (worker, CAS) -> DONE (worker, release,
 *   after the result) -> FREE (reader, after it read the result).
 *
 * A reader that finds the mailbox anything but FREE answers "busy" (HTTP
 * 409).  The worker acts between two steps; a command may stay TAKEN over
 * many steps (pause with mode "wait" is DONE once the last request in
 * flight ended).  A reader that stops waiting sets abandon; the worker
 * then frees the mailbox itself when it is done.  The worker also frees a
 * mailbox whose owner pid is gone.
 */
enum msv_cmd_state {
    MSV_CMD_FREE    = 0,
    MSV_CMD_CLAIMED = 1,
    MSV_CMD_POSTED  = 2,
    MSV_CMD_TAKEN   = 3,
    MSV_CMD_DONE    = 4
};

enum msv_cmd_op {
    MSV_OP_NONE        = 0,
    MSV_OP_PAUSE       = 1,   /* arg: enum msv_pause_mode */
    MSV_OP_RESUME      = 2,
    MSV_OP_FLUSH_CACHE = 3,
    MSV_OP_UPDATE      = 4    /* weights from cmd.path, version cmd.version;
                                 arg: enum msv_pause_mode */
};

enum msv_pause_mode {
    MSV_PAUSE_ABORT = 0,      /* end requests in flight (reason "paused") */
    MSV_PAUSE_WAIT  = 1,      /* admit nothing; paused once they finished */
    MSV_PAUSE_KEEP  = 2       /* freeze them; they go on after resume */
};

enum msv_pause_state {
    MSV_RUNNING = 0,
    MSV_PAUSING = 1,          /* mode wait: requests in flight finishing */
    MSV_PAUSED  = 2
};

struct msv_cmd {
    alignas(MSV_CACHELINE)
    MSV_ATOMIC(uint64_t) state;     /* (pid << 8) | msv_cmd_state */
    MSV_ATOMIC(uint32_t) abandon;   /* the reader stopped waiting */
    uint32_t  op;                   /* enum msv_cmd_op */
    uint32_t  arg;
    uint32_t  _pad0;
    uint64_t  seq;                  /* bumps on every claim */
    char      path[MSV_CMD_PATH_MAX];        /* MSV_OP_UPDATE */
    char      version[MSV_VERSION_MAX + 1];  /* MSV_OP_UPDATE */
    char      _pad2[7];

    /* written by the worker before DONE */
    int32_t   status;               /* 0, or a negative errno */
    uint32_t  count;                /* requests aborted, pages dropped */
    uint32_t  was_paused;           /* enum msv_pause_state before */
    uint32_t  _pad1;
    uint64_t  t_taken_ns;
    uint64_t  t_done_ns;
    char      msg[MSV_CMD_MSG_MAX];
};

struct msv_ctrl {
    /* identity: written once before the region is made visible */
    uint64_t  magic;               /* MSV_MAGIC */
    uint32_t  version;             /* MSV_LAYOUT_VERSION */
    uint32_t  ctrl_bytes;          /* sizeof(struct msv_ctrl) */
    uint64_t  region_bytes;        /* size of the whole mapping */
    uint64_t  generation;          /* new random value on every start */
    int32_t   worker_pid;
    uint32_t  _pad0;

    /* layout */
    uint64_t  readers_off;         /* struct msv_reader[n_readers] */
    uint32_t  n_readers;           /* <= MSV_MAX_READERS */
    uint32_t  n_slots;             /* max concurrent requests */
    uint64_t  slots_off;
    uint32_t  slot_bytes;          /* stride, multiple of 64 */
    uint32_t  slot_prompt_off;     /* int32 prompt ids, from slot start */
    uint32_t  slot_bias_off;       /* struct msv_bias[MSV_MAX_BIAS] */
    uint32_t  _pad1;
    uint64_t  ring_off;
    uint64_t  ring_bytes;          /* power of two */
    uint32_t  max_row_bytes;       /* largest row the worker can emit */
    uint32_t  max_rec_bytes;       /* largest record, <= ring_bytes / 2 */

    /* model facts readers validate requests against */
    uint32_t  vocab_size;
    uint32_t  max_model_len;       /* prompt + output tokens */
    uint32_t  max_logprobs;        /* largest sampling_params.logprobs */
    uint32_t  n_eos;
    int32_t   eos_ids[MSV_MAX_EOS];
    char      model[128];          /* model name or path, NUL-terminated */
    char      backend[16];         /* "cpu" or "cuda" */
    char      sock_path[MSV_SOCK_PATH_MAX];
    char      name[MSV_NAME_MAX + 1];
    char      _pad2[7];

    /* liveness: written by the worker while it runs */
    alignas(MSV_CACHELINE)
    MSV_ATOMIC(uint64_t) heartbeat_ns;  /* CLOCK_MONOTONIC, every ~100ms */
    MSV_ATOMIC(uint32_t) state;         /* enum msv_worker_state */
    MSV_ATOMIC(uint32_t) step_ms;       /* the running step's age; 0: none */

    /* statistics, relaxed, for /health and benchmarks */
    MSV_ATOMIC(uint64_t) steps;
    MSV_ATOMIC(uint64_t) tokens;
    MSV_ATOMIC(uint64_t) requests_done;
    MSV_ATOMIC(uint32_t) running;       /* slots RUNNING */
    MSV_ATOMIC(uint32_t) waiting;       /* slots SUBMITTED, not admitted */
    MSV_ATOMIC(uint64_t) kv_tokens_free;
    MSV_ATOMIC(uint64_t) ring_waits;    /* back-pressure waits */
    MSV_ATOMIC(uint64_t) readers_evicted;

    /* KV pages, preemption and prefix caching (since layout version 2) */
    MSV_ATOMIC(uint64_t) kv_tokens_total;     /* the whole pool */
    MSV_ATOMIC(uint64_t) kv_tokens_cached;    /* held by no sequence, kept
                                                 for reuse (LRU) */
    MSV_ATOMIC(uint64_t) kv_evictions;        /* cached pages reused */
    MSV_ATOMIC(uint64_t) prefix_query_tokens; /* tokens admissions needed
                                                 in the KV */
    MSV_ATOMIC(uint64_t) prefix_hit_tokens;   /* of those, found cached */
    MSV_ATOMIC(uint64_t) prefill_tokens;      /* tokens prefill computed */
    MSV_ATOMIC(uint64_t) preemptions;
    MSV_ATOMIC(uint32_t) preempted;           /* RUNNING slots without
                                                 pages right now */
    uint32_t  _pad4;

    /* counters and state for /metrics and /health (since layout
     * version 3) */
    MSV_ATOMIC(uint64_t) prompt_tokens;       /* prompts admitted, summed */
    MSV_ATOMIC(uint64_t) finished[4];         /* by enum msv_finish */
    MSV_ATOMIC(uint64_t) aborted[8];          /* by enum msv_abort */
    MSV_ATOMIC(uint64_t) cache_flushes;
    MSV_ATOMIC(uint32_t) paused;              /* enum msv_pause_state */
    MSV_ATOMIC(uint32_t) pause_mode;          /* enum msv_pause_mode */
    uint32_t  kv_page_tokens;                 /* tokens per KV page */
    uint32_t  _pad6;
    char      weight_version[MSV_VERSION_MAX + 1];
    char      _pad5[7];
    char      prev_weight_version[MSV_VERSION_MAX + 1];  /* the one before */
    char      _pad7[7];
    MSV_ATOMIC(uint32_t) weight_seq;          /* bumps on every update;
                                                 slots carry it */
    uint32_t  _pad8;
    MSV_ATOMIC(uint64_t) weight_updates;      /* updates done */
    MSV_ATOMIC(uint64_t) weight_update_failures;
    MSV_ATOMIC(uint64_t) weight_update_ms;    /* the last one's duration */
    MSV_ATOMIC(uint64_t) weight_pause_ms;     /* of that, with no step */

    /* steps that ran the model: time and sequences, not cumulative */
    MSV_ATOMIC(uint64_t) step_hist[MSV_STEP_BUCKETS];
    MSV_ATOMIC(uint64_t) step_us_sum;
    MSV_ATOMIC(uint64_t) batch_hist[MSV_BATCH_BUCKETS];
    MSV_ATOMIC(uint64_t) batch_sum;

    /* rows published, and their bytes, by enum msv_mask_mode */
    MSV_ATOMIC(uint64_t) rows_by_mode[4];
    MSV_ATOMIC(uint64_t) row_bytes_by_mode[4];

    /* the control channel: one command at a time (see struct msv_cmd) */
    struct msv_cmd        cmd;

    /* the producer's cursor, alone on its cache line */
    alignas(MSV_CACHELINE)
    MSV_ATOMIC(uint64_t) head;          /* bytes published, free-running */
};


/* ------------------------------------------------------------------ */
/* Readers                                                              */

/*
 * An entry's state word is (pid << 8) | enum msv_reader_state, so the
 * owner is claimed in the same CAS as the state: a reader that dies right
 * after the CAS leaves an entry the worker can reclaim by its pid.
 */
enum msv_reader_state {
    MSV_READER_FREE      = 0,
    MSV_READER_CLAIMED   = 1,  /* reader claimed it, hello not yet seen */
    MSV_READER_ATTACHED  = 2   /* worker set tail; rows flow */
};

struct msv_reader {
    alignas(MSV_CACHELINE)
    MSV_ATOMIC(uint64_t) state;         /* (pid << 8) | msv_reader_state */
    MSV_ATOMIC(uint64_t) heartbeat_ns;  /* reader's CLOCK_MONOTONIC */
    MSV_ATOMIC(uint32_t) armed;         /* reader sleeps: wake it */
    uint32_t  _pad0;
    uint64_t  attach_seq;               /* bumps on every attach */

    alignas(MSV_CACHELINE)
    MSV_ATOMIC(uint64_t) tail;          /* bytes consumed, free-running */
};

#define MSV_STATE_WORD(pid, st)  (((uint64_t) (uint32_t) (pid) << 8) | (st))
#define MSV_STATE_OF(w)          ((uint32_t) ((w) & 0xff))
#define MSV_PID_OF(w)            ((int32_t) ((w) >> 8))


/* ------------------------------------------------------------------ */
/* Request slots                                                        */

/*
 * FREE -> CLAIMED (reader, CAS with its pid) -> SUBMITTED (reader,
 * release) -> RUNNING (worker) -> FINISHED | ABORTED (worker, before it
 * publishes the request's last row) -> FREE (reader, after it consumed
 * that row; or the worker, when the owner died).
 */
enum msv_slot_state {
    MSV_SLOT_FREE      = 0,
    MSV_SLOT_CLAIMED   = 1,
    MSV_SLOT_SUBMITTED = 2,
    MSV_SLOT_RUNNING   = 3,
    MSV_SLOT_FINISHED  = 4,
    MSV_SLOT_ABORTED   = 5
};

enum msv_mask_mode {
    MSV_MASK_OFF      = 0,  /* no mask bytes */
    MSV_MASK_SELECTED = 1,  /* support ids + the sampled token's logprob */
    MSV_MASK_SUPPORT  = 2   /* support ids + the logprob of every id */
};

enum msv_finish {
    MSV_FINISH_NONE   = 0,  /* more rows follow */
    MSV_FINISH_STOP   = 1,  /* eos or a stop_token_id was sampled */
    MSV_FINISH_LENGTH = 2,  /* max_tokens or max_model_len reached */
    MSV_FINISH_ABORT  = 3   /* see enum msv_abort */
};

enum msv_abort {
    MSV_ABORT_NONE      = 0,
    MSV_ABORT_CANCELLED = 1,  /* the reader set cancel */
    MSV_ABORT_SHUTDOWN  = 2,  /* worker stopping (SIGTERM) */
    MSV_ABORT_INVALID   = 3,  /* slot contents failed validation */
    MSV_ABORT_NO_KV     = 4,  /* request can never fit the KV cache */
    MSV_ABORT_INTERNAL  = 5,  /* backend error */
    MSV_ABORT_PAUSED    = 6   /* pause with mode "abort" (version 3) */
};

struct msv_params {
    uint32_t  max_tokens;           /* >= 1 */
    uint32_t  min_tokens;
    float     temperature;          /* 0 = greedy */
    float     top_p;                /* (0, 1] */
    float     min_p;                /* [0, 1] */
    int32_t   top_k;                /* <= 0: off */
    float     repetition_penalty;   /* > 0, 1 = off */
    float     presence_penalty;
    float     frequency_penalty;
    uint32_t  has_seed;
    uint64_t  seed;
    uint32_t  ignore_eos;
    uint32_t  mask_mode;            /* enum msv_mask_mode */
    int32_t   logprobs;             /* -1: none; k >= 0: sampled + top k */
    uint32_t  n_stop;
    int32_t   stop_ids[MSV_MAX_STOP];
    uint32_t  n_bias;               /* entries at slot_bias_off */
    uint32_t  n;                    /* choices of the request, >= 1: a
                                       slot runs one of them */
};

struct msv_bias {
    int32_t   id;
    float     value;
};

struct msv_slot {
    alignas(MSV_CACHELINE)
    MSV_ATOMIC(uint64_t) state;     /* (pid << 8) | msv_slot_state */
    MSV_ATOMIC(uint32_t) cancel;    /* reader sets 1; worker aborts */
    uint32_t  reader;               /* index of the owning reader */
    uint64_t  cookie;               /* per request; rows carry it */

    /* written by the reader before SUBMITTED */
    struct msv_params params;
    uint32_t  n_prompt;
    uint32_t  _pad0;
    uint64_t  t_submit_ns;
    char      request_id[MSV_REQ_ID_MAX + 1];
    char      _pad1[7];

    /* written by the worker */
    uint64_t  seed_used;            /* valid once RUNNING */
    uint32_t  n_out;                /* tokens produced */
    uint32_t  finish;               /* enum msv_finish */
    uint32_t  abort_reason;         /* enum msv_abort */
    uint32_t  weight_seq;           /* ctrl->weight_seq at admission */
    uint64_t  t_start_ns;
    uint64_t  t_end_ns;
    uint32_t  weight_pos;           /* output index from which the next
                                       weight_seq produced the tokens (an
                                       update with mode keep); UINT32_MAX:
                                       none (version 3) */
    uint32_t  _pad3;
};


/* ------------------------------------------------------------------ */
/* Ring records and rows                                                */

/*
 * The ring holds records back to back.  A record never wraps: if the
 * contiguous space left before the end is smaller than the record, the
 * producer writes an MSV_REC_PAD record over that space and starts at
 * offset 0.  Every record's size is a multiple of MSV_REC_ALIGN, so a pad
 * header always fits.
 */
enum msv_rec_kind {
    MSV_REC_STEP = 1,   /* rows of one model step (a step may span records) */
    MSV_REC_PAD  = 2    /* skip to the ring's start */
};

struct msv_rec {
    uint32_t  bytes;    /* whole record, header included, 16-aligned */
    uint16_t  kind;     /* enum msv_rec_kind */
    uint16_t  n_rows;
    uint64_t  seq;      /* step number, from 1; the same for each part */
};

/*
 * One row per request that produced something in the step.  Payload after
 * the header, in this order:
 *   int32 ids[n_support]                 support, ascending, unique
 *   float lps[n_lps]                     n_lps = n_support (support mode),
 *                                        1 (selected), 0 (off)
 *   struct msv_top top[n_top]            best first, ties by lower id
 * then padding to MSV_ROW_ALIGN.  An abort row has token -1 and nothing
 * else.
 */
struct msv_row {
    uint32_t  bytes;        /* whole row, header included, 8-aligned */
    uint32_t  slot;
    uint64_t  cookie;
    int32_t   token;        /* sampled id, -1 in an abort row */
    uint32_t  pos;          /* output index t of this token */
    uint32_t  n_support;    /* L */
    uint32_t  n_lps;
    uint32_t  n_top;
    float     logprob;      /* sampled token's processed logprob, when any
                               capture (mask or logprobs) was asked */
    uint8_t   finish;       /* enum msv_finish */
    uint8_t   abort_reason; /* enum msv_abort */
    uint8_t   mode;         /* enum msv_mask_mode */
    uint8_t   _pad0;
    uint32_t  _pad1;
};

struct msv_top {
    int32_t   id;
    float     lp;
};

#if defined(__CUDACC__)
__host__ __device__
#endif
static inline uint32_t
msv_row_size(uint32_t n_support, uint32_t n_lps, uint32_t n_top)
{
    uint32_t  n = (uint32_t) sizeof(struct msv_row)
                  + 4 * n_support + 4 * n_lps
                  + (uint32_t) sizeof(struct msv_top) * n_top;

    return (n + MSV_ROW_ALIGN - 1) & ~(uint32_t) (MSV_ROW_ALIGN - 1);
}

static inline const int32_t *
msv_row_ids(const struct msv_row *w)
{
    return (const int32_t *) (w + 1);
}

static inline const float *
msv_row_lps(const struct msv_row *w)
{
    return (const float *) (msv_row_ids(w) + w->n_support);
}

static inline const struct msv_top *
msv_row_top(const struct msv_row *w)
{
    return (const struct msv_top *) (msv_row_lps(w) + w->n_lps);
}


/* ------------------------------------------------------------------ */
/* Socket handshake                                                     */

#define MSV_HELLO_MAGIC    0x4f4c4c48u   /* "HLLO" */
#define MSV_WELCOME_MAGIC  0x434c4557u   /* "WELC" */

struct msv_hello {          /* reader -> worker, with the reader's eventfd */
    uint32_t  magic;
    uint32_t  reader;       /* index of the entry the reader claimed */
    uint64_t  generation;   /* the one the reader mapped */
    int32_t   pid;
    uint32_t  _pad0;
};

struct msv_welcome {        /* worker -> reader, with its submission eventfd */
    uint32_t  magic;
    int32_t   status;       /* 0, or a negative errno */
    uint64_t  generation;
    uint64_t  tail;         /* where this reader starts reading */
};


/* ------------------------------------------------------------------ */
/* Layout helpers                                                       */

static inline struct msv_reader *
msv_reader_at(struct msv_ctrl *c, uint32_t i)
{
    return (struct msv_reader *) ((char *) c + c->readers_off) + i;
}

static inline struct msv_slot *
msv_slot_at(struct msv_ctrl *c, uint32_t i)
{
    return (struct msv_slot *) ((char *) c + c->slots_off
                                + (uint64_t) i * c->slot_bytes);
}

static inline int32_t *
msv_slot_prompt(struct msv_ctrl *c, struct msv_slot *s)
{
    return (int32_t *) ((char *) s + c->slot_prompt_off);
}

static inline struct msv_bias *
msv_slot_bias(struct msv_ctrl *c, struct msv_slot *s)
{
    return (struct msv_bias *) ((char *) s + c->slot_bias_off);
}

static inline uint8_t *
msv_ring_data(struct msv_ctrl *c)
{
    return (uint8_t *) c + c->ring_off;
}


#ifdef __cplusplus
}
#endif

#endif /* MSV_SHM_H */
