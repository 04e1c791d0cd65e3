/*
 * msv_params.h: the sampling-parameter rules, in one place: the defaults
 * of struct msv_params, the range of every field, and the check of a
 * whole request (parameters, bias entries, stop ids, prompt) against the
 * model it goes to.
 *
 * Every layer applies the same rules: the nginx module and maskserve-cli
 * set fields from JSON text with msv_param_set_*() and check the request
 * with msv_params_check() and msv_prompt_check() before they submit;
 * msv_slot_submit() and the worker's admission check it again (a slot is
 * written by another process); the sampler runs
 * msv_params_check_sampling() on every token, which costs a few compares
 * plus the bias and stop entries.
 * docs/API.md and docs/SAMPLER.md section 7 state the ranges.
 *
 * Every error is one line that names the JSON field
 * ("sampling_params.temperature ...") and its range.
 */

#ifndef MSV_PARAMS_H
#define MSV_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "msv_shm.h"

#ifdef __cplusplus
extern "C" {
#endif


#define MSV_DEFAULT_MAX_TOKENS   16

/*
 * The ranges of the float fields.  Each bound keeps the processed logits
 * of docs/SAMPLER.md section 1 far from FLT_MAX for any logits a model
 * produces (|z| up to 1e20 or so), so nothing saturates and every row is
 * exact; values beyond them have no use a row could show.
 */
#define MSV_TEMPERATURE_MIN      1e-5    /* or 0: greedy (vLLM's epsilon) */
#define MSV_REPETITION_MIN       0.01
#define MSV_REPETITION_MAX       100.0
#define MSV_PENALTY_MAX          1000.0  /* |presence|, |frequency| */
#define MSV_BIAS_MAX             100.0   /* |logit_bias value|, OpenAI's */

#define MSV_PARAM_ERR_MAX        200     /* error messages, NUL included */


/* The model facts a request is checked against; 0: not checked. */
struct msv_limits {
    uint32_t  vocab_size;
    uint32_t  max_model_len;
    uint32_t  max_logprobs;
};

enum msv_param_kind {
    MSV_PK_UINT = 1,    /* uint32_t; integers above UINT32_MAX: clipped */
    MSV_PK_INT,         /* int32_t; integers above INT32_MAX: clipped */
    MSV_PK_FLOAT,       /* float */
    MSV_PK_BOOL,        /* uint32_t 0 or 1 */
    MSV_PK_SEED,        /* uint64_t seed, has_seed */
    MSV_PK_STOP,        /* array of token ids: stop_ids, n_stop */
    MSV_PK_BIAS         /* object of token id to number */
};

/*
 * One field of sampling_params.  Integers: [imin, imax]; a larger integer
 * literal, up to any length, is an error when imax is set below INT64_MAX
 * and otherwise means "as many as there are" and is stored clipped.
 * Floats: [fmin, fmax] (fmin excluded when fmin_open), and 0 besides when
 * zero_ok.
 */
struct msv_param_rule {
    const char  *name;        /* the key in sampling_params */
    const char  *param;       /* as errors name it */
    uint8_t      kind;        /* enum msv_param_kind */
    uint8_t      fmin_open;
    uint8_t      zero_ok;
    uint16_t     offset;      /* of the field in struct msv_params */
    int64_t      imin, imax;
    double       fmin, fmax;
    const char  *range;       /* what is accepted, in words */
};

/* The fields, ending with a rule whose name is NULL. */
extern const struct msv_param_rule  msv_param_rules[];

/* The rule of key s (len bytes), or NULL for an unknown key. */
const struct msv_param_rule *msv_param_find(const char *s, size_t len);

/* The defaults: max_tokens 16, temperature 1, top_k -1, top_p 1, ... */
void msv_params_init(struct msv_params *p);


/*
 * Setting one field from its JSON value.  Each returns 0, or -1 with a
 * one-line message in err (MSV_PARAM_ERR_MAX bytes).  Numbers arrive as
 * the literal's text (valid JSON number syntax, not NUL-terminated), so
 * integers of any length are read exactly or saturated.
 */
int msv_param_set_number(struct msv_params *p, const struct msv_param_rule *r,
    const char *s, size_t len, char *err);
int msv_param_set_bool(struct msv_params *p, const struct msv_param_rule *r,
    int b, char *err);
/* null: the field's default */
void msv_param_set_null(struct msv_params *p, const struct msv_param_rule *r);
/* a value of the wrong JSON type ("a string", "an array", ...) */
int msv_param_wrong_type(const struct msv_param_rule *r, const char *what,
    char *err);

/* One element of stop_token_ids, appended to p->stop_ids. */
int msv_param_add_stop(struct msv_params *p, const char *s, size_t len,
    char *err);

/* A logit_bias key (decimal token id) and value. */
int msv_param_bias_id(const char *s, size_t len, int32_t *id, char *err);
int msv_param_bias_value(const char *s, size_t len, float *v, char *err);

/* A token id of token_ids (param "token_ids"). */
int msv_param_token(const char *s, size_t len, int32_t *id, char *err);


/*
 * The whole rule for a request's parameters and its bias entries
 * (p->n_bias of them), against lim (NULL, or a zero member: that part
 * unchecked).  Returns NULL when they are valid, or the name of the
 * first field that is not (with the message in err, when err is not
 * NULL).  min_tokens above max_tokens is an error here: msv_params_fit
 * applies the context afterwards.
 */
const char *msv_params_check(const struct msv_params *p,
    const struct msv_bias *bias, const struct msv_limits *lim, char *err);

/* The same but for the lengths (max_tokens, min_tokens), which the
 * scheduler applies: what the sampler checks on every token. */
const char *msv_params_check_sampling(const struct msv_params *p,
    const struct msv_bias *bias, const struct msv_limits *lim, char *err);

/* A request id: 1 to MSV_REQ_ID_MAX characters of [A-Za-z0-9._:-], not
 * "." or ".." (a path segment nginx would resolve).  Safe in a URI, a
 * Redis key and a log line as it is. */
int msv_request_id_valid(const char *p, size_t len);

/* The prompt: 1 to max_model_len - 1 ids in [0, vocab).  NULL or
 * "token_ids", as msv_params_check. */
const char *msv_prompt_check(const int32_t *prompt, uint32_t n_prompt,
    const struct msv_limits *lim, char *err);

/*
 * Fit checked parameters to the context, as vLLM does: max_tokens to
 * max_model_len - n_prompt, then min_tokens to max_tokens; a top_k of at
 * least the vocabulary is the vocabulary (off).  The result passes
 * msv_params_check.
 */
void msv_params_fit(struct msv_params *p, uint32_t n_prompt,
    const struct msv_limits *lim);

/* The limits a region's control page states. */
void msv_limits_of(const struct msv_ctrl *c, struct msv_limits *lim);


#ifdef __cplusplus
}
#endif

#endif /* MSV_PARAMS_H */
