/*
 * check.h: the response checker of the e2e load client.  One JSON
 * document (an SSE event or a whole non-streaming body) is parsed by
 * yajl with msv_doc_callbacks straight into an msv_doc_t (the mask
 * values, in resp.c, by fast.c: the same checks, the same callbacks for
 * the rest) and checked against what was asked: each choice as it ends
 * (its index, token ids, one mask row and one logprob entry per token,
 * rows ascending and unique, the sampled token in its row, ids inside
 * the vocabulary, |row| <= top_k, greedy rows of one id with logprob 0,
 * selected logprobs <= 0, support rows summing to 1; logprobs.content
 * (when asked) one entry per token, the sampled token's, its
 * top_logprobs best first and at most as many as asked, its logprob that
 * of the support row; packed masks (mask_format "packed") are
 * base64-decoded and go through the same checks), then the document with
 * msv_doc_check: as many choices as sampling_params.n asked (a stream
 * event: one to n), each index once.  Of each choice only a summary
 * stays (msv_choice_t: counts and hashes); what spans events (counts per
 * choice, [DONE], usage) is the caller's.  The load client
 * (bench/e2e/load.c) checks every event with it, the end-to-end tests
 * (t/lib/MsvTest.pm) every choice, through bench/e2e_check.c.
 */

#ifndef MSV_E2E_CHECK_H
#define MSV_E2E_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include <yajl/yajl_parse.h>

#include "array.h"


#define MSV_CHECK_MAX_DEPTH   64
#define MSV_CHECK_ERR_MAX     256

/* a run's variant: the mask mode and, for the last two, packed */
enum {
    MSV_MODE_OFF = 0,
    MSV_MODE_SELECTED,
    MSV_MODE_SUPPORT,
    MSV_MODE_SELECTED_PACKED,
    MSV_MODE_SUPPORT_PACKED,
    MSV_N_MODES
};

extern const char  *msv_mode_names[MSV_N_MODES];

#define MSV_PACKED_FORMAT  "csr-i32-f32-le-v1"

/* the mask mode of a variant (off, selected, support) */
static inline int
msv_mask_of(int v)
{
    return v == MSV_MODE_SELECTED_PACKED ? MSV_MODE_SELECTED
           : v == MSV_MODE_SUPPORT_PACKED ? MSV_MODE_SUPPORT : v;
}

static inline int
msv_packed_of(int v)
{
    return v >= MSV_MODE_SELECTED_PACKED;
}


typedef enum {
    MSV_F_TOP = 0,          /* maps */
    MSV_F_CHOICE,
    MSV_F_USAGE,
    MSV_F_ERROR,
    MSV_F_CHOICES,          /* arrays */
    MSV_F_TOKENS,
    MSV_F_MASK,
    MSV_F_ROW,
    MSV_F_MLPS,
    MSV_F_LPROW,
    MSV_F_PACKED,           /* sampling_mask_packed (a map) */
    MSV_F_LOGPROBS,         /* logprobs (a map) */
    MSV_F_LPCONTENT,        /* logprobs.content (an array) */
    MSV_F_LPENTRY,          /* one of its entries (a map) */
    MSV_F_TOPS,             /* the entry's top_logprobs (an array) */
    MSV_F_TOPENTRY,         /* one of them (a map) */
    MSV_F_SKIP              /* anything we do not look into */
} msv_frame_kind_t;

/* keys we know, per map */
enum {
    MSV_K_NONE = 0,
    MSV_K_REQUEST_ID, MSV_K_SEED, MSV_K_CHOICES, MSV_K_USAGE, MSV_K_ERRORK,
    MSV_K_INDEX, MSV_K_TOKEN_IDS, MSV_K_MASK, MSV_K_MLPS, MSV_K_LOGPROBS,
    MSV_K_FINISH,
    MSV_K_PROMPT, MSV_K_COMPLETION,
    MSV_K_MESSAGE,
    MSV_K_PACKED, MSV_K_PFORMAT, MSV_K_PLENGTHS, MSV_K_PIDS, MSV_K_PLPS,
    MSV_K_CONTENT, MSV_K_TOKEN_ID, MSV_K_LOGPROB, MSV_K_TOPS,
    MSV_K_OTHER
};

typedef struct {
    msv_frame_kind_t  kind;
    int               key;          /* pending key of a map */
    uint32_t          seen;         /* keys seen in a map */
} msv_frame_t;

/* what a document is checked against: what the request asked */
typedef struct {
    long          top_k;            /* <= 0: no limit */
    double        temperature;      /* 0: greedy */
    int           variant;          /* MSV_MODE_* */
    long          vocab;            /* ids below it; 0: not checked */
    long          max_tokens;       /* -1: not checked */
    long          logprobs;         /* sampling_params.logprobs; -1: none */
    int           whole;            /* whole choices (a body, not an
                                       event): all n, each with token_ids
                                       and a finish_reason stop, length or
                                       abort */
    long          n;                /* sampling_params.n; < 1: 1 */
} msv_expect_t;


/* A choice of a document once checked: what spans the events.  The
 * hashes are polynomial (h = h * P + x + 1 over the values, P^count kept
 * beside), so that those of consecutive parts of a choice combine into
 * that of the whole: h(ab) = h(a) * pow(b) + h(b). */
typedef struct {
    long          index;
    long          n_tokens;
    long          n_rows;
    long long     n_mask_ids;
    uint64_t      hash, hpow;       /* of the token ids */
    uint64_t      mhash, mpow;      /* of the rows, length then ids */
    int           finish;           /* 0 absent, 1 null, 2 string */
    char          finish_str[16];
} msv_choice_t;

#define MSV_HASH_P  0x100000001b3ULL

/* h of a part followed by h, p of the next: h(ab) */
static inline uint64_t
msv_hash_cat(uint64_t h, uint64_t next_h, uint64_t next_pow)
{
    return h * next_pow + next_h;
}


typedef struct {
    const msv_expect_t  *e;         /* what it is checked against */

    /* parser state */
    msv_frame_t   stack[MSV_CHECK_MAX_DEPTH];
    int           depth;            /* frames in use */
    long          skip_depth;       /* containers open below a SKIP frame */
    int           top_done;

    /* what the document said */
    int           is_error;
    char          error[MSV_CHECK_ERR_MAX];
    long          n_choices;
    msv_choice_t *ch;               /* the choices checked, in order */
    size_t        ch_cap;
    msv_bytes_t   ch_seen;          /* per index: seen in this document */
    long          prompt_tokens;    /* usage; -1: absent */
    long          completion_tokens;

    /* the choice being parsed (reset at each) */
    long          index;            /* -1: absent */
    int           has_tokens;
    msv_i32s_t    tokens;
    int           has_mask;
    int           has_mlps;
    int           has_packed;       /* sampling_mask_packed, decoded */
    msv_bytes_t   pk[3];            /* its lengths, ids, logprobs: the
                                       bytes decoded (n); the ids' are
                                       in row_ids, after its n, until
                                       the map ends and adds them */
    msv_i32s_t    row_ids;          /* every row, concatenated */
    msv_i32s_t    row_off;          /* start of each row in row_ids */
    long          mlps_num;         /* selected: one number per token */
    long          mlps_arr;         /* support: one array per token */
    msv_i32s_t    lprow_len;
    msv_f64s_t    lprow_lse;
    msv_f64s_t    lp_vals;          /* every JSON mask logprob, in order
                                       (packed ones stay in pk[2]) */
    size_t        lp_start;         /* the support row's first in it */
    int           has_logprobs;     /* the key, whatever its value */
    int           has_lpcontent;    /* logprobs.content, an array */
    msv_i32s_t    lpc_tok;          /* per entry: token_id, */
    msv_f64s_t    lpc_lp;           /* logprob, */
    msv_i32s_t    lpc_ntop;         /* number of top_logprobs */
    long          lpe_tok;          /* the entry being parsed: -1 absent */
    double        lpe_lp;           /* NAN: absent */
    long          lpe_ntop;         /* -1: no top_logprobs */
    double        lpe_top0;         /* its first (best) top logprob */
    double        lpe_prev;         /* the previous one */
    double        top_lp;           /* the top entry being parsed */
    int           finish;           /* 0 absent, 1 null, 2 string */
    char          finish_str[16];

    /* the first problem found */
    char          bad[MSV_CHECK_ERR_MAX];

    /* set while yajl is fed text that only puts it back in step with
     * what the fast path (fast.c) read: the callbacks ignore it */
    int           mute;
} msv_doc_t;




/* yajl callbacks filling the msv_doc_t passed as their context */
extern yajl_callbacks  msv_doc_callbacks;

/* Empty the document for the next one, to be checked against e (which
 * must stay until the document is checked); keeps its arrays' memory. */
void msv_doc_reset(msv_doc_t *d, const msv_expect_t *e);

/* Free the document's arrays. */
void msv_doc_free(msv_doc_t *d);

/* Once parsed (each choice was checked as it ended): the checks of the
 * whole document, its error and choices.  0, or -1 with d->bad set. */
int msv_doc_check(msv_doc_t *d);

/*
 * A base64 string of sampling_mask_packed (k: 0 lengths, 1 ids, 2
 * logprobs) decoded outside yajl (fast.c), as msv_doc_callbacks would:
 * msv_doc_b64_room gives where its bytes go, with room for `bytes` and
 * MSV_B64DEC_SLACK more (it may move as it grows); msv_doc_b64_done
 * takes the verdict, got the bytes decoded or -1 when the string of
 * `chars` characters is not canonical base64, with the checks and the
 * message of the callback.  1, or 0 with d->bad set.
 */
char *msv_doc_b64_room(msv_doc_t *d, int k, size_t bytes);
int msv_doc_b64_done(msv_doc_t *d, int k, long got, size_t chars);

/* h * P^n + the hash of the n values (as the one of check.h, over
 * v[i] + 1), with *pow multiplied by P^n */
uint64_t msv_hash_i32s(uint64_t h, uint64_t *pow, const int32_t *v,
    size_t n);


#endif /* MSV_E2E_CHECK_H */
