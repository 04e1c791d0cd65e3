/*
 * msv_params.c: the sampling-parameter rules (msv_params.h).
 *
 * The table msv_param_rules is the one statement of every field's range:
 * the setters check a value against its rule as it is parsed, and
 * msv_params_check runs the same rules over a filled struct (what a
 * reader wrote into a slot, or what the sampler was handed).
 */

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msv_params.h"


#define MSV_OFF(f)    ((uint16_t) offsetof(struct msv_params, f))
#define MSV_NO_MAX    INT64_MAX

/* the setters store scalar fields through 4-byte types */
#define MSV_IS4(f)    (sizeof(((struct msv_params *) 0)->f) == 4)
_Static_assert(MSV_IS4(max_tokens) && MSV_IS4(min_tokens)
               && MSV_IS4(temperature) && MSV_IS4(top_p) && MSV_IS4(min_p)
               && MSV_IS4(top_k) && MSV_IS4(repetition_penalty)
               && MSV_IS4(presence_penalty) && MSV_IS4(frequency_penalty)
               && MSV_IS4(ignore_eos) && MSV_IS4(logprobs) && MSV_IS4(n),
               "struct msv_params: scalar fields of 4 bytes");


const struct msv_param_rule  msv_param_rules[] = {
    { "max_tokens", "sampling_params.max_tokens", MSV_PK_UINT, 0, 0,
      MSV_OFF(max_tokens), 1, MSV_NO_MAX, 0, 0,
      "an integer >= 1 (clipped to the context left)" },
    { "min_tokens", "sampling_params.min_tokens", MSV_PK_UINT, 0, 0,
      MSV_OFF(min_tokens), 0, MSV_NO_MAX, 0, 0,
      "an integer >= 0 and <= max_tokens" },
    { "temperature", "sampling_params.temperature", MSV_PK_FLOAT, 0, 1,
      MSV_OFF(temperature), 0, 0, MSV_TEMPERATURE_MIN, FLT_MAX,
      "0 (greedy) or a number in [1e-05, 3.4e+38]" },
    { "top_k", "sampling_params.top_k", MSV_PK_INT, 0, 0,
      MSV_OFF(top_k), -1, MSV_NO_MAX, 0, 0,
      "-1 or 0 (off), or an integer >= 1 (the vocabulary or more: off)" },
    { "top_p", "sampling_params.top_p", MSV_PK_FLOAT, 1, 0,
      MSV_OFF(top_p), 0, 0, 0.0, 1.0,
      "a number in (0, 1]" },
    { "min_p", "sampling_params.min_p", MSV_PK_FLOAT, 0, 0,
      MSV_OFF(min_p), 0, 0, 0.0, 1.0,
      "a number in [0, 1]" },
    { "seed", "sampling_params.seed", MSV_PK_SEED, 0, 0,
      MSV_OFF(seed), 0, 0, 0, 0,
      "null or an integer in [0, 2^64)" },
    { "stop_token_ids", "sampling_params.stop_token_ids", MSV_PK_STOP, 0, 0,
      MSV_OFF(stop_ids), 0, 0, 0, 0,
      "an array of at most 32 token ids" },
    { "ignore_eos", "sampling_params.ignore_eos", MSV_PK_BOOL, 0, 0,
      MSV_OFF(ignore_eos), 0, 0, 0, 0,
      "true or false" },
    { "repetition_penalty", "sampling_params.repetition_penalty",
      MSV_PK_FLOAT, 0, 0,
      MSV_OFF(repetition_penalty), 0, 0, MSV_REPETITION_MIN,
      MSV_REPETITION_MAX,
      "a number in [0.01, 100]" },
    { "presence_penalty", "sampling_params.presence_penalty",
      MSV_PK_FLOAT, 0, 0,
      MSV_OFF(presence_penalty), 0, 0, -MSV_PENALTY_MAX, MSV_PENALTY_MAX,
      "a number in [-1000, 1000]" },
    { "frequency_penalty", "sampling_params.frequency_penalty",
      MSV_PK_FLOAT, 0, 0,
      MSV_OFF(frequency_penalty), 0, 0, -MSV_PENALTY_MAX, MSV_PENALTY_MAX,
      "a number in [-1000, 1000]" },
    { "logit_bias", "sampling_params.logit_bias", MSV_PK_BIAS, 0, 0,
      0, 0, 0, -MSV_BIAS_MAX, MSV_BIAS_MAX,
      "an object of at most 1024 token ids to numbers in [-100, 100]" },
    { "logprobs", "sampling_params.logprobs", MSV_PK_INT, 0, 0,
      MSV_OFF(logprobs), 0, MSV_MAX_LOGPROBS, 0, 0,
      "null or an integer in [0, 1024], at most the worker's max_logprobs" },
    { "n", "sampling_params.n", MSV_PK_UINT, 0, 0,
      MSV_OFF(n), 1, MSV_MAX_N, 0, 0,
      "an integer in [1, 1024] (at most maskserve_max_n)" },
    { NULL, NULL, 0, 0, 0, 0, 0, 0, 0, 0, NULL }
};


static const char *msv_check(const struct msv_params *p,
    const struct msv_bias *bias, const struct msv_limits *lim, char *err,
    int whole);
static int msv_err(char *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int msv_parse_int(const char *s, size_t len, int64_t *v);
static int msv_parse_double(const char *s, size_t len, double *v);
static int msv_float_ok(const struct msv_param_rule *r, double x);
static const struct msv_param_rule *msv_bias_rule(void);
static const char *msv_text(const char *s, size_t len, char *buf, size_t n);


const struct msv_param_rule *
msv_param_find(const char *s, size_t len)
{
    const struct msv_param_rule  *r;

    for (r = msv_param_rules; r->name != NULL; r++) {
        if (strlen(r->name) == len && memcmp(r->name, s, len) == 0) {
            return r;
        }
    }
    return NULL;
}


void
msv_params_init(struct msv_params *p)
{
    memset(p, 0, sizeof(*p));
    p->max_tokens = MSV_DEFAULT_MAX_TOKENS;
    p->min_tokens = 0;
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->top_k = -1;
    p->repetition_penalty = 1.0f;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->logprobs = -1;
    p->mask_mode = MSV_MASK_OFF;
    p->n = 1;
}


int
msv_param_set_number(struct msv_params *p, const struct msv_param_rule *r,
    const char *s, size_t len, char *err)
{
    char      buf[40];
    float     f;
    double    d;
    int64_t   v;
    uint64_t  u;
    char     *at = (char *) p + r->offset;

    switch (r->kind) {

    case MSV_PK_UINT:
    case MSV_PK_INT:
        if (msv_parse_int(s, len, &v) != 0) {
            return msv_err(err, "%s must be %s, not %s", r->param, r->range,
                           msv_text(s, len, buf, sizeof(buf)));
        }
        if (v < r->imin || v > r->imax) {
            return msv_err(err, "%s must be %s, not %s", r->param, r->range,
                           msv_text(s, len, buf, sizeof(buf)));
        }
        /* larger than the field holds: "all there are", clipped */
        if (r->kind == MSV_PK_UINT) {
            *(uint32_t *) at = v > UINT32_MAX ? UINT32_MAX : (uint32_t) v;
        } else {
            *(int32_t *) at = v > INT32_MAX ? INT32_MAX : (int32_t) v;
        }
        return 0;

    case MSV_PK_SEED:
        u = 0;
        if (len == 0 || s[0] == '-') {
            return msv_err(err, "%s must be %s, not %s", r->param, r->range,
                           msv_text(s, len, buf, sizeof(buf)));
        }
        for (size_t i = 0; i < len; i++) {
            if (s[i] < '0' || s[i] > '9'
                || u > (UINT64_MAX - (uint64_t) (s[i] - '0')) / 10)
            {
                return msv_err(err, "%s must be %s, not %s", r->param,
                               r->range, msv_text(s, len, buf, sizeof(buf)));
            }
            u = u * 10 + (uint64_t) (s[i] - '0');
        }
        p->seed = u;
        p->has_seed = 1;
        return 0;

    case MSV_PK_FLOAT:
        if (msv_parse_double(s, len, &d) != 0) {
            return msv_err(err, "%s must be %s, not %s", r->param, r->range,
                           msv_text(s, len, buf, sizeof(buf)));
        }
        /* the value and what it rounds to as a float: both in range, so
         * that 1e-50 is not taken for 0 */
        f = (float) d;
        if (!msv_float_ok(r, d) || !msv_float_ok(r, (double) f)) {
            return msv_err(err, "%s must be %s, not %s", r->param, r->range,
                           msv_text(s, len, buf, sizeof(buf)));
        }
        *(float *) at = f;
        return 0;

    default:
        return msv_param_wrong_type(r, "a number", err);
    }
}


int
msv_param_set_bool(struct msv_params *p, const struct msv_param_rule *r,
    int b, char *err)
{
    if (r->kind != MSV_PK_BOOL) {
        return msv_param_wrong_type(r, "a boolean", err);
    }
    *(uint32_t *) ((char *) p + r->offset) = b ? 1 : 0;
    return 0;
}


void
msv_param_set_null(struct msv_params *p, const struct msv_param_rule *r)
{
    struct msv_params  d;

    switch (r->kind) {
    case MSV_PK_UINT:
    case MSV_PK_INT:
    case MSV_PK_FLOAT:
    case MSV_PK_BOOL:
        /* every scalar field is 4 bytes */
        msv_params_init(&d);
        memcpy((char *) p + r->offset, (char *) &d + r->offset, 4);
        break;
    case MSV_PK_SEED:
        p->has_seed = 0;
        p->seed = 0;
        break;
    default:
        /* stop_token_ids, logit_bias: none */
        break;
    }
}


int
msv_param_wrong_type(const struct msv_param_rule *r, const char *what,
    char *err)
{
    return msv_err(err, "%s must be %s, not %s", r->param, r->range, what);
}


int
msv_param_token(const char *s, size_t len, int32_t *id, char *err)
{
    char     buf[40];
    int64_t  v;

    if (msv_parse_int(s, len, &v) != 0 || v < 0 || v > INT32_MAX) {
        return msv_err(err, "token_ids must be an array of token ids "
                       "(integers in [0, vocab)), not %s",
                       msv_text(s, len, buf, sizeof(buf)));
    }
    *id = (int32_t) v;
    return 0;
}


int
msv_param_add_stop(struct msv_params *p, const char *s, size_t len,
    char *err)
{
    char     buf[40];
    int64_t  v;

    if (msv_parse_int(s, len, &v) != 0 || v < 0 || v > INT32_MAX) {
        return msv_err(err, "sampling_params.stop_token_ids must be an "
                       "array of token ids (integers in [0, vocab)), not %s",
                       msv_text(s, len, buf, sizeof(buf)));
    }
    if (p->n_stop == MSV_MAX_STOP) {
        return msv_err(err, "sampling_params.stop_token_ids has more than "
                       "%d entries", MSV_MAX_STOP);
    }
    p->stop_ids[p->n_stop++] = (int32_t) v;
    return 0;
}


int
msv_param_bias_id(const char *s, size_t len, int32_t *id, char *err)
{
    char      buf[40];
    size_t    i;
    uint64_t  u;

    u = 0;
    for (i = 0; i < len && u <= INT32_MAX; i++) {
        if (s[i] < '0' || s[i] > '9') {
            break;
        }
        u = u * 10 + (uint64_t) (s[i] - '0');
    }
    if (len == 0 || i != len || u > INT32_MAX || (len > 1 && s[0] == '0')) {
        return msv_err(err, "sampling_params.logit_bias keys must be token "
                       "ids in decimal, not \"%s\"",
                       msv_text(s, len, buf, sizeof(buf)));
    }
    *id = (int32_t) u;
    return 0;
}


int
msv_param_bias_value(const char *s, size_t len, float *v, char *err)
{
    char    buf[40];
    double  d;

    if (msv_parse_double(s, len, &d) != 0
        || !msv_float_ok(msv_bias_rule(), d))
    {
        return msv_err(err, "sampling_params.logit_bias values must be "
                       "numbers in [-100, 100], not %s",
                       msv_text(s, len, buf, sizeof(buf)));
    }
    *v = (float) d;
    return 0;
}


const char *
msv_params_check(const struct msv_params *p, const struct msv_bias *bias,
    const struct msv_limits *lim, char *err)
{
    return msv_check(p, bias, lim, err, 1);
}


const char *
msv_params_check_sampling(const struct msv_params *p,
    const struct msv_bias *bias, const struct msv_limits *lim, char *err)
{
    return msv_check(p, bias, lim, err, 0);
}


/* whole: the request's too (the lengths); else what the sampler reads */
static const char *
msv_check(const struct msv_params *p, const struct msv_bias *bias,
    const struct msv_limits *lim, char *err, int whole)
{
    char                          e[MSV_PARAM_ERR_MAX];
    uint32_t                      i, vocab, max_lp;
    const struct msv_param_rule  *r;
    const char                   *at;
    int64_t                       v;

    if (err == NULL) {
        err = e;
    }
    vocab = lim != NULL ? lim->vocab_size : 0;
    max_lp = lim != NULL && lim->max_logprobs != 0 ? lim->max_logprobs
                                                   : MSV_MAX_LOGPROBS;

    for (r = msv_param_rules; r->name != NULL; r++) {
        at = (const char *) p + r->offset;

        switch (r->kind) {

        case MSV_PK_UINT:
        case MSV_PK_INT:
            if (r->kind == MSV_PK_UINT && !whole) {
                break;      /* max_tokens, min_tokens: the scheduler's */
            }
            v = r->kind == MSV_PK_UINT ? (int64_t) *(const uint32_t *) at
                                       : (int64_t) *(const int32_t *) at;
            /* logprobs -1 is "none", the value null sets */
            if (r->offset == offsetof(struct msv_params, logprobs)) {
                if (v < -1 || v > max_lp) {
                    msv_err(err, "%s must be %s (%u), not %lld", r->param,
                            r->range, max_lp, (long long) v);
                    return r->param;
                }
                break;
            }
            if (v < r->imin || v > r->imax) {
                msv_err(err, "%s must be %s, not %lld", r->param, r->range,
                        (long long) v);
                return r->param;
            }
            break;

        case MSV_PK_FLOAT:
            if (!msv_float_ok(r, (double) *(const float *) at)) {
                msv_err(err, "%s must be %s, not %g", r->param, r->range,
                        (double) *(const float *) at);
                return r->param;
            }
            break;

        case MSV_PK_BOOL:
            if (*(const uint32_t *) at > 1) {
                msv_err(err, "%s must be %s", r->param, r->range);
                return r->param;
            }
            break;

        case MSV_PK_SEED:
            if (p->has_seed > 1) {
                msv_err(err, "%s: has_seed must be 0 or 1", r->param);
                return r->param;
            }
            break;

        case MSV_PK_STOP:
            if (p->n_stop > MSV_MAX_STOP) {
                msv_err(err, "%s has more than %d entries", r->param,
                        MSV_MAX_STOP);
                return r->param;
            }
            for (i = 0; i < p->n_stop; i++) {
                if (p->stop_ids[i] < 0
                    || (vocab != 0 && (uint32_t) p->stop_ids[i] >= vocab))
                {
                    msv_err(err, "%s[%u] = %d is outside the vocabulary "
                            "[0, %u)", r->param, i, p->stop_ids[i], vocab);
                    return r->param;
                }
            }
            break;

        default: /* MSV_PK_BIAS */
            if (p->n_bias > MSV_MAX_BIAS) {
                msv_err(err, "%s has more than %d entries", r->param,
                        MSV_MAX_BIAS);
                return r->param;
            }
            if (p->n_bias > 0 && bias == NULL) {
                msv_err(err, "%s: %u entries but no array", r->param,
                        p->n_bias);
                return r->param;
            }
            for (i = 0; i < p->n_bias; i++) {
                if (bias[i].id < 0
                    || (vocab != 0 && (uint32_t) bias[i].id >= vocab))
                {
                    msv_err(err, "%s key %d is outside the vocabulary "
                            "[0, %u)", r->param, bias[i].id, vocab);
                    return r->param;
                }
                if (!msv_float_ok(r, (double) bias[i].value)) {
                    msv_err(err, "%s values must be numbers in [-100, 100], "
                            "not %g (token %d)", r->param,
                            (double) bias[i].value, bias[i].id);
                    return r->param;
                }
            }
            break;
        }
    }

    if (whole && p->min_tokens > p->max_tokens) {
        msv_err(err, "sampling_params.min_tokens %u exceeds max_tokens %u "
                "(max_tokens is %u when absent: the default)",
                p->min_tokens, p->max_tokens, MSV_DEFAULT_MAX_TOKENS);
        return "sampling_params.min_tokens";
    }

    if (p->mask_mode > MSV_MASK_SUPPORT) {
        msv_err(err, "sampling_logprobs_mode: mask mode %u is unknown",
                p->mask_mode);
        return "sampling_logprobs_mode";
    }

    return NULL;
}


int
msv_request_id_valid(const char *p, size_t len)
{
    size_t  i;
    char    ch;

    if (len == 0 || len > MSV_REQ_ID_MAX) {
        return 0;
    }
    if ((len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
    {
        return 0;
    }
    for (i = 0; i < len; i++) {
        ch = p[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')
              || (ch >= '0' && ch <= '9')
              || ch == '.' || ch == '_' || ch == ':' || ch == '-'))
        {
            return 0;
        }
    }
    return 1;
}


const char *
msv_prompt_check(const int32_t *prompt, uint32_t n_prompt,
    const struct msv_limits *lim, char *err)
{
    char      e[MSV_PARAM_ERR_MAX];
    uint32_t  i, vocab, len;

    if (err == NULL) {
        err = e;
    }
    vocab = lim != NULL ? lim->vocab_size : 0;
    len = lim != NULL ? lim->max_model_len : 0;

    if (n_prompt == 0) {
        msv_err(err, "token_ids must not be empty");
        return "token_ids";
    }
    if (prompt == NULL) {
        msv_err(err, "token_ids: %u ids but no array", n_prompt);
        return "token_ids";
    }
    if (len != 0 && n_prompt >= len) {
        msv_err(err, "prompt of %u tokens does not fit: max_model_len is %u, "
                "so at most %u prompt tokens", n_prompt, len, len - 1);
        return "token_ids";
    }
    for (i = 0; i < n_prompt; i++) {
        if (prompt[i] < 0 || (vocab != 0 && (uint32_t) prompt[i] >= vocab)) {
            msv_err(err, "token_ids[%u] = %d is outside the vocabulary "
                    "[0, %u)", i, prompt[i], vocab);
            return "token_ids";
        }
    }
    return NULL;
}


void
msv_params_fit(struct msv_params *p, uint32_t n_prompt,
    const struct msv_limits *lim)
{
    uint32_t  room;

    if (lim->max_model_len > n_prompt) {
        room = lim->max_model_len - n_prompt;
        if (p->max_tokens > room) {
            p->max_tokens = room;
        }
    }
    if (p->min_tokens > p->max_tokens) {
        p->min_tokens = p->max_tokens;
    }
    if (lim->vocab_size != 0 && p->top_k > 0
        && (uint32_t) p->top_k > lim->vocab_size)
    {
        p->top_k = (int32_t) lim->vocab_size;
    }
}


void
msv_limits_of(const struct msv_ctrl *c, struct msv_limits *lim)
{
    lim->vocab_size = c->vocab_size;
    lim->max_model_len = c->max_model_len;
    lim->max_logprobs = c->max_logprobs;
}


/* ------------------------------------------------------------------ */

static int
msv_err(char *err, const char *fmt, ...)
{
    va_list  ap;

    if (err != NULL) {
        va_start(ap, fmt);
        vsnprintf(err, MSV_PARAM_ERR_MAX, fmt, ap);
        va_end(ap);
    }
    return -1;
}


/*
 * An integer literal, saturated to int64: a longer one still has a sign
 * and a magnitude, and that is all the rules need ("clipped" or "out of
 * range").  -1: a fraction or an exponent (not an integer literal).
 */
static int
msv_parse_int(const char *s, size_t len, int64_t *v)
{
    int       neg;
    size_t    i;
    uint64_t  u;

    neg = len > 0 && s[0] == '-';
    i = neg ? 1 : 0;
    if (i == len) {
        return -1;
    }

    u = 0;
    for ( /* void */ ; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return -1;
        }
        if (u > (uint64_t) INT64_MAX / 10) {
            u = (uint64_t) INT64_MAX + 1;       /* above int64: saturated */
        } else {
            u = u * 10 + (uint64_t) (s[i] - '0');
        }
    }

    if (neg) {
        *v = u > (uint64_t) INT64_MAX ? INT64_MIN : -(int64_t) u;
    } else {
        *v = u > (uint64_t) INT64_MAX ? INT64_MAX : (int64_t) u;
    }
    return 0;
}


/* A number literal as a double; -1 when it is not finite as a double. */
static int
msv_parse_double(const char *s, size_t len, double *v)
{
    char    buf[64], *z, *end;
    double  d;

    z = len < sizeof(buf) ? buf : malloc(len + 1);
    if (z == NULL) {
        return -1;
    }
    memcpy(z, s, len);
    z[len] = '\0';

    errno = 0;
    d = strtod(z, &end);
    if (end != z + len || len == 0 || !isfinite(d)) {
        if (z != buf) {
            free(z);
        }
        return -1;
    }
    if (z != buf) {
        free(z);
    }
    *v = d;
    return 0;
}


/* The bounds as floats hold them: 1e-5 is accepted, as the float it is
 * stored as, and so is that float on the sampler's side. */
static int
msv_float_ok(const struct msv_param_rule *r, double x)
{
    double  lo = (double) (float) r->fmin, hi = (double) (float) r->fmax;

    if (r->zero_ok && x == 0.0) {
        return 1;
    }
    if (r->fmin_open ? !(x > lo) : !(x >= lo)) {
        return 0;
    }
    return x <= hi;
}


static const struct msv_param_rule *
msv_bias_rule(void)
{
    const struct msv_param_rule  *r;

    for (r = msv_param_rules; r->kind != MSV_PK_BIAS; r++) {
        /* void */
    }
    return r;
}


/* The literal as messages quote it: at most 32 bytes of it. */
static const char *
msv_text(const char *s, size_t len, char *buf, size_t n)
{
    size_t  m = len < 32 ? len : 32;

    if (m >= n) {
        m = n - 1;
    }
    memcpy(buf, s, m);
    if (len > m && m + 4 <= n - 1) {
        memcpy(buf + m, "...", 3);
        m += 3;
    }
    buf[m] = '\0';
    return buf;
}
