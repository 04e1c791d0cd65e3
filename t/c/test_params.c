/*
 * test_params.c: the sampling-parameter rules (shm/msv_params.h) and the
 * CPU sampler over the extremes they accept.
 *
 * Rules: every field at its bounds and just past them, from JSON text
 * (integers of any length, floats that round at the bounds), messages
 * that name the field and its range, the whole-request check, the fit to
 * the context.  Sampler: random logits of several shapes and magnitudes,
 * parameters drawn from the corners of the accepted ranges; every row
 * must keep the contract of docs/SAMPLER.md exactly: finite logprobs
 * whose log-sum-exp over the support is 0 within 1e-4, the token in its
 * support, |S| <= top_k, greedy rows of width 1 with logprob 0, and
 * min(k, |S|) top entries.
 */

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "msv_params.h"
#include "sampler.h"
#include "mix.h"


static uint64_t  rng_state = 0x5eed;

static uint64_t
rng_next(void)
{
    return msv_splitmix64(&rng_state);
}

static double
rng_unif(void)
{
    return (double) (rng_next() >> 11) * 0x1p-53;
}

static uint32_t
rng_below(uint32_t n)
{
    return (uint32_t) (rng_unif() * n);
}


/* ------------------------------------------------------------------ */
/* The rules                                                            */

/* Set field `name` from `text`; 0 or -1, and err filled. */
static int
set(struct msv_params *p, const char *name, const char *text, char *err)
{
    const struct msv_param_rule  *r = msv_param_find(name, strlen(name));

    if (r == NULL) {
        snprintf(err, MSV_PARAM_ERR_MAX, "no rule for %s", name);
        return -2;
    }
    return msv_param_set_number(p, r, text, strlen(text), err);
}


static void
test_fields(void)
{
    char               err[MSV_PARAM_ERR_MAX], want[80], lit[40];
    size_t             i;
    struct msv_params  p, d;

    /* [field, text, 1: accepted] */
    static const struct { const char *f, *v; int ok; } cases[] = {
        { "max_tokens", "1", 1 }, { "max_tokens", "0", 0 },
        { "max_tokens", "-1", 0 }, { "max_tokens", "1.5", 0 },
        { "max_tokens", "1e3", 0 }, { "max_tokens", "4294967296", 1 },
        { "max_tokens", "9223372036854775807", 1 },
        { "max_tokens", "9223372036854775808", 1 },
        { "max_tokens", "18446744073709551616", 1 },
        { "max_tokens", "99999999999999999999999999999999999999999", 1 },
        { "max_tokens", "-99999999999999999999999999999999999999999", 0 },
        { "min_tokens", "0", 1 }, { "min_tokens", "-1", 0 },
        { "min_tokens", "100000000000000000000", 1 },
        { "top_k", "-1", 1 }, { "top_k", "0", 1 }, { "top_k", "-2", 0 },
        { "top_k", "2147483648", 1 }, { "top_k", "-2147483649", 0 },
        { "top_k", "1" "00000000000000000000000000", 1 },
        { "logprobs", "0", 1 }, { "logprobs", "1024", 1 },
        { "logprobs", "1025", 0 }, { "logprobs", "-1", 0 },
        { "logprobs", "99999999999999999999", 0 },
        { "seed", "0", 1 }, { "seed", "18446744073709551615", 1 },
        { "seed", "18446744073709551616", 0 }, { "seed", "-1", 0 },
        { "seed", "1.0", 0 },
        { "temperature", "0", 1 }, { "temperature", "-0", 1 },
        { "temperature", "0.0", 1 }, { "temperature", "1e-5", 1 },
        { "temperature", "0.00001", 1 }, { "temperature", "9.99e-6", 0 },
        { "temperature", "1e-38", 0 }, { "temperature", "1e-46", 0 },
        { "temperature", "1e-400", 1 },    /* the literal is 0 exactly */
        { "temperature", "3.4028234663852886e38", 1 },
        { "temperature", "3.5e38", 0 }, { "temperature", "1e999", 0 },
        { "temperature", "-1e-5", 0 },
        { "top_p", "1", 1 }, { "top_p", "1e-30", 1 }, { "top_p", "0", 0 },
        { "top_p", "1e-50", 0 }, { "top_p", "1.0000001", 0 },
        { "top_p", "-0.5", 0 },
        { "min_p", "0", 1 }, { "min_p", "1", 1 }, { "min_p", "1.01", 0 },
        { "min_p", "-1e-30", 0 },
        { "repetition_penalty", "0.01", 1 }, { "repetition_penalty", "100", 1 },
        { "repetition_penalty", "0.0099", 0 },
        { "repetition_penalty", "100.001", 0 },
        { "repetition_penalty", "1e-40", 0 }, { "repetition_penalty", "0", 0 },
        { "presence_penalty", "1000", 1 }, { "presence_penalty", "-1000", 1 },
        { "presence_penalty", "1000.1", 0 }, { "presence_penalty", "1e30", 0 },
        { "frequency_penalty", "-1000", 1 },
        { "frequency_penalty", "-1000.001", 0 },
        { "frequency_penalty", "3.4e38", 0 },
    };

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int  rc;

        msv_params_init(&p);
        p.max_tokens = UINT32_MAX;      /* min_tokens may be anything */
        err[0] = '\0';
        rc = set(&p, cases[i].f, cases[i].v, err);
        snprintf(want, sizeof(want), "sampling_params.%s must be ",
                 cases[i].f);
        if (cases[i].ok) {
            tap_ok(rc == 0 && msv_params_check(&p, NULL, NULL, NULL) == NULL,
                   "%s %s accepted %s", cases[i].f, cases[i].v, err);
        } else {
            snprintf(lit, sizeof(lit), "not %.32s", cases[i].v);
            tap_ok(rc == -1 && strncmp(err, want, strlen(want)) == 0
                   && strstr(err, lit) != NULL
                   && strchr(err, '\n') == NULL,
                   "%s %s refused: %s", cases[i].f, cases[i].v, err);
        }
    }

    /* what the accepted integers mean */
    msv_params_init(&p);
    set(&p, "max_tokens", "18446744073709551616", err);
    set(&p, "top_k", "99999999999999999999", err);
    set(&p, "min_tokens", "9223372036854775807", err);
    tap_ok(p.max_tokens == UINT32_MAX && p.top_k == INT32_MAX
           && p.min_tokens == UINT32_MAX,
           "integers above a field's type are stored clipped");
    set(&p, "seed", "18446744073709551615", err);
    tap_ok(p.has_seed == 1 && p.seed == UINT64_MAX, "seed 2^64-1 exact");
    set(&p, "temperature", "1e-5", err);
    tap_ok(p.temperature == 1e-5f, "temperature 1e-5 stored as the float");

    /* null: the default */
    msv_params_init(&d);
    for (i = 0; msv_param_rules[i].name != NULL; i++) {
        msv_param_set_null(&p, &msv_param_rules[i]);
    }
    tap_ok(memcmp(&p, &d, sizeof(p)) == 0,
           "null sets every field back to its default");

    /* wrong types */
    tap_ok(msv_param_set_bool(&p, msv_param_find("top_k", 5), 1, err) == -1
           && strstr(err, "sampling_params.top_k") == err
           && strstr(err, "not a boolean") != NULL,
           "a boolean for top_k: %s", err);
    tap_ok(msv_param_set_number(&p, msv_param_find("ignore_eos", 10), "1", 1,
                                err) == -1
           && strstr(err, "true or false, not a number") != NULL,
           "a number for ignore_eos: %s", err);
    tap_ok(msv_param_find("best_of", 7) == NULL
           && msv_param_find("top", 3) == NULL
           && msv_param_find("top_kk", 6) == NULL,
           "unknown keys have no rule");

    /* n: choices of one request, [1, MSV_MAX_N] */
    tap_ok(msv_param_find("n", 1) != NULL && p.n == 1,
           "n has a rule, default 1");
    tap_ok(msv_param_set_number(&p, msv_param_find("n", 1), "8", 1, err) == 0
           && p.n == 8, "n 8 is taken");
    tap_ok(msv_param_set_number(&p, msv_param_find("n", 1), "0", 1, err) == -1
           && strstr(err, "sampling_params.n must be") == err,
           "n 0 is refused: %s", err);
    tap_ok(msv_param_set_number(&p, msv_param_find("n", 1), "1025", 4, err)
           == -1 && strstr(err, "sampling_params.n") == err,
           "n 1025 is refused: %s", err);
    tap_ok(msv_param_set_number(&p, msv_param_find("n", 1),
                                "99999999999999999999", 20, err) == -1
           && strstr(err, "sampling_params.n") == err,
           "a huge n is refused, not clipped: %s", err);
    tap_ok(msv_param_set_number(&p, msv_param_find("n", 1), "2.0", 3, err)
           == -1 && strstr(err, "sampling_params.n") == err,
           "n 2.0 is refused: %s", err);
    tap_ok(msv_param_set_number(&p, msv_param_find("n", 1), "1024", 4, err)
           == 0 && p.n == 1024, "n 1024 is taken");
    p.n = 0;
    tap_ok(msv_params_check(&p, NULL, NULL, err) != NULL
           && strcmp(msv_params_check(&p, NULL, NULL, err),
                     "sampling_params.n") == 0,
           "a struct with n 0 fails the check: %s", err);
    msv_param_set_null(&p, msv_param_find("n", 1));
    tap_ok(p.n == 1, "n null is the default 1");
}


static void
test_entries(void)
{
    int                i, bad;
    char               err[MSV_PARAM_ERR_MAX];
    float              v;
    int32_t            id;
    struct msv_params  p;

    static const char  *bias_ok[] = { "100", "-100", "0", "1e-30", "99.9" };
    static const char  *bias_bad[] = { "100.001", "-100.5", "1e15", "-3e38",
                                       "1e999" };
    static const char  *key_bad[] = { "", "-1", "01", "1.0", "2147483648",
                                      "abc", "99999999999999999999" };

    bad = 0;
    for (i = 0; i < 5; i++) {
        bad += msv_param_bias_value(bias_ok[i], strlen(bias_ok[i]), &v, err)
               != 0;
        bad += msv_param_bias_value(bias_bad[i], strlen(bias_bad[i]), &v,
                                    err) == 0
               || strstr(err, "[-100, 100]") == NULL;
    }
    tap_ok(bad == 0, "logit_bias values: [-100, 100] accepted, beyond "
           "refused (%d wrong)", bad);

    bad = 0;
    for (i = 0; i < 7; i++) {
        bad += msv_param_bias_id(key_bad[i], strlen(key_bad[i]), &id, err)
               == 0;
    }
    bad += msv_param_bias_id("2147483647", 10, &id, err) != 0
           || id != INT32_MAX;
    bad += msv_param_bias_id("0", 1, &id, err) != 0 || id != 0;
    tap_ok(bad == 0, "logit_bias keys: decimal token ids only");

    msv_params_init(&p);
    bad = 0;
    for (i = 0; i < MSV_MAX_STOP; i++) {
        bad += msv_param_add_stop(&p, "7", 1, err) != 0;
    }
    bad += msv_param_add_stop(&p, "7", 1, err) == 0;
    tap_ok(bad == 0 && p.n_stop == MSV_MAX_STOP,
           "stop_token_ids: %d entries, no more (%s)", MSV_MAX_STOP, err);
    msv_params_init(&p);
    tap_ok(msv_param_add_stop(&p, "2147483648", 10, err) == -1
           && msv_param_add_stop(&p, "-1", 2, err) == -1
           && msv_param_token("1e2", 3, &id, err) == -1
           && msv_param_token("123", 3, &id, err) == 0 && id == 123,
           "token ids: integers in [0, 2^31)");
}


static void
test_request(void)
{
    char               err[MSV_PARAM_ERR_MAX];
    const char        *param;
    int32_t            prompt[4] = { 1, 2, 3, 4 };
    struct msv_bias    bias[2] = { { 5, 1.0f }, { 9, -100.0f } };
    struct msv_params  p;
    struct msv_limits  lim = { 1000, 64, 20 };

    msv_params_init(&p);
    p.n_bias = 2;
    tap_ok(msv_params_check(&p, bias, &lim, err) == NULL
           && msv_prompt_check(prompt, 4, &lim, err) == NULL,
           "a plain request passes");

    p.min_tokens = 17;
    param = msv_params_check(&p, bias, &lim, err);
    tap_ok(param != NULL && strcmp(param, "sampling_params.min_tokens") == 0
           && strstr(err, "default") != NULL,
           "min_tokens above the default max_tokens: %s", err);
    tap_ok(msv_params_check_sampling(&p, bias, &lim, err) == NULL,
           "... which the sampler does not read");
    p.min_tokens = 0;

    bias[1].value = 1e15f;
    param = msv_params_check(&p, bias, &lim, err);
    tap_ok(param != NULL && strcmp(param, "sampling_params.logit_bias") == 0,
           "a stored bias of 1e15 is refused: %s", err);
    bias[1].value = -100.0f;
    bias[1].id = 1000;
    param = msv_params_check(&p, bias, &lim, err);
    tap_ok(param != NULL && strstr(err, "outside the vocabulary") != NULL,
           "a bias id == vocab: %s", err);
    bias[1].id = 9;

    p.temperature = 1e-38f;
    tap_ok(msv_params_check_sampling(&p, bias, &lim, err) != NULL,
           "a stored temperature of 1e-38: %s", err);
    p.temperature = NAN;
    tap_ok(msv_params_check_sampling(&p, bias, &lim, err) != NULL,
           "a NaN temperature: %s", err);
    p.temperature = 1.0f;
    p.logprobs = 21;
    tap_ok(msv_params_check(&p, bias, &lim, err) != NULL
           && strstr(err, "(20)") != NULL,
           "logprobs above the worker's max_logprobs: %s", err);
    p.logprobs = -1;
    p.stop_ids[0] = 1000;
    p.n_stop = 1;
    tap_ok(msv_params_check(&p, bias, &lim, err) != NULL,
           "a stop id == vocab: %s", err);
    p.n_stop = MSV_MAX_STOP + 1;
    tap_ok(msv_params_check(&p, bias, &lim, err) != NULL,
           "n_stop above %d (a hostile slot): %s", MSV_MAX_STOP, err);
    p.n_stop = 0;
    p.n_bias = MSV_MAX_BIAS + 1;
    tap_ok(msv_params_check(&p, bias, &lim, err) != NULL,
           "n_bias above %d: %s", MSV_MAX_BIAS, err);
    p.n_bias = 0;
    p.mask_mode = 3;
    tap_ok(msv_params_check(&p, NULL, &lim, err) != NULL, "mask_mode 3: %s",
           err);
    p.mask_mode = 0;

    tap_ok(msv_prompt_check(prompt, 0, &lim, err) != NULL
           && msv_prompt_check(prompt, 64, &lim, err) != NULL
           && msv_prompt_check(NULL, 3, &lim, err) != NULL,
           "prompts: empty, == max_model_len, no array refused");
    prompt[2] = 1000;
    param = msv_prompt_check(prompt, 4, &lim, err);
    tap_ok(param != NULL && strcmp(param, "token_ids") == 0
           && strstr(err, "token_ids[2]") != NULL,
           "a prompt id == vocab: %s", err);

    /* the fit */
    p.max_tokens = UINT32_MAX;
    p.min_tokens = UINT32_MAX;
    p.top_k = INT32_MAX;
    msv_params_fit(&p, 4, &lim);
    tap_ok(p.max_tokens == 60 && p.min_tokens == 60 && p.top_k == 1000
           && msv_params_check(&p, NULL, &lim, NULL) == NULL,
           "fit: max_tokens and min_tokens to the 60 left, top_k to the "
           "vocabulary; the result passes");
}


/* ------------------------------------------------------------------ */
/* The sampler over the accepted extremes                               */

#define PV  1543        /* an odd vocabulary */
#define PT  24          /* output positions per case */

/* Logits: LM-like, flat, huge ties, few distinct, wide, with -inf. */
static void
gen(float *z, int kind, double scale)
{
    uint32_t  i;

    for (i = 0; i < PV; i++) {
        switch (kind) {
        case 0:  z[i] = (float) (scale * (rng_unif() - 0.5)); break;
        case 1:  z[i] = (float) (scale * 1e-3 * rng_unif()); break;
        case 2:  z[i] = (float) (scale * (double) rng_below(3)); break;
        case 3:  z[i] = (float) (scale * pow(rng_unif(), 8.0)); break;
        default:
            z[i] = rng_below(10) == 0 ? -INFINITY
                                      : (float) (scale * (rng_unif() - 0.7));
            break;
        }
    }
}


static int
check_row(const struct msv_params *p, const struct msv_sample_out *o,
    const char **why)
{
    uint32_t     i, in;
    long double  m, s;

    *why = NULL;
    if (o->token < 0 || o->token >= PV) {
        return *why = "token out of range", -1;
    }
    if (o->n_support == 0 || o->ids == NULL || o->lps == NULL) {
        return *why = "no support", -1;
    }
    if (p->top_k > 0 && o->n_support > (uint32_t) p->top_k) {
        return *why = "|S| > top_k", -1;
    }
    if (p->temperature == 0.0f
        && (o->n_support != 1 || o->lps[0] != 0.0f || o->logprob != 0.0f))
    {
        return *why = "greedy row not of width 1 with logprob 0", -1;
    }
    in = 0;
    m = -INFINITY;
    for (i = 0; i < o->n_support; i++) {
        if (!isfinite(o->lps[i]) || o->lps[i] > 0.0f) {
            return *why = "a non-finite or positive logprob", -1;
        }
        if (i > 0 && o->ids[i] <= o->ids[i - 1]) {
            return *why = "ids not ascending", -1;
        }
        in += o->ids[i] == o->token;
        if (o->lps[i] > m) {
            m = o->lps[i];
        }
    }
    if (in != 1) {
        return *why = "token not in its support", -1;
    }
    s = 0;
    for (i = 0; i < o->n_support; i++) {
        s += expl((long double) o->lps[i] - m);
    }
    if (fabsl(m + logl(s)) > 1e-4L) {
        return *why = "support log-sum-exp not 0 within 1e-4", -1;
    }
    if (!isfinite(o->logprob)) {
        return *why = "sampled logprob not finite", -1;
    }
    if (p->logprobs > 0) {
        if (o->n_top != (o->n_support < (uint32_t) p->logprobs
                         ? o->n_support : (uint32_t) p->logprobs))
        {
            return *why = "top entries not min(k, |S|)", -1;
        }
        for (i = 0; i < o->n_top; i++) {
            if (!isfinite(o->top[i].lp)) {
                return *why = "a non-finite top logprob", -1;
            }
        }
    }
    return 0;
}


static void
test_extremes(void)
{
    int                    kind, k, fails, rows, bad_params;
    float                 *z0, *z;
    double                 scale;
    uint32_t               t, i;
    int32_t                prompt[16], out[PT], eos = 2;
    const char            *why;
    struct msv_bias        bias[64];
    struct msv_params      p;
    struct msv_sampler    *s;
    struct msv_sample_req  rq;
    struct msv_sample_out  o;

    static const float  temps[] = { 0.0f, 1e-5f, 1e-3f, 1.0f, 1e5f, 1e30f,
                                    FLT_MAX };
    static const float  reps[] = { 1.0f, 0.01f, 100.0f };
    static const float  pens[] = { 0.0f, 1000.0f, -1000.0f };
    static const double scales[] = { 30.0, 1e4, 1e-3 };

    s = msv_sampler_new(PV);
    z0 = malloc(PV * sizeof(float));
    z = malloc(PV * sizeof(float));
    if (s == NULL || z0 == NULL || z == NULL) {
        tap_ok(0, "sampler for V %d", PV);
        return;
    }

    fails = 0;
    rows = 0;
    bad_params = 0;

    for (k = 0; k < 400; k++) {
        kind = k % 5;
        scale = scales[(k / 5) % 3];
        gen(z0, kind, scale);

        msv_params_init(&p);
        p.temperature = temps[rng_below(7)];
        p.repetition_penalty = reps[rng_below(3)];
        p.presence_penalty = pens[rng_below(3)];
        p.frequency_penalty = pens[rng_below(3)];
        p.top_k = rng_below(3) == 0 ? (int32_t) (1 + rng_below(PV + 10)) : -1;
        p.top_p = rng_below(3) == 0 ? (float) (rng_below(2) ? 1e-30
                                               : rng_unif()) : 1.0f;
        if (p.top_p == 0.0f) {
            p.top_p = 1.0f;
        }
        p.min_p = rng_below(3) == 0 ? (float) (rng_below(2) ? 1.0
                                               : 1e-30) : 0.0f;
        p.mask_mode = MSV_MASK_SUPPORT;
        p.logprobs = (int32_t) rng_below(8);
        p.min_tokens = rng_below(2) ? 4 : 0;
        p.n_stop = 2;
        p.stop_ids[0] = 1;
        p.stop_ids[1] = 3;
        p.n_bias = rng_below(2) ? 1 + rng_below(64) : 0;
        for (i = 0; i < p.n_bias; i++) {
            bias[i].id = (int32_t) rng_below(PV);
            bias[i].value = rng_below(2) ? 100.0f : -100.0f;
        }
        for (i = 0; i < 16; i++) {
            prompt[i] = (int32_t) rng_below(PV);
        }

        /* what the sampler is given was accepted at admission */
        bad_params += msv_params_check(&p, bias, NULL, NULL) != NULL;

        memset(&rq, 0, sizeof(rq));
        rq.p = &p;
        rq.bias = bias;
        rq.seed = rng_next();
        rq.prompt = prompt;
        rq.n_prompt = 16;
        rq.out = out;
        rq.eos = &eos;
        rq.n_eos = 1;

        for (t = 0; t < PT; t++) {
            memcpy(z, z0, PV * sizeof(float));
            rq.t = t;
            if (msv_sample(s, z, &rq, &o) != 0) {
                if (fails++ < 5) {
                    tap_diag("case %d t %u: %s", k, t, msv_sampler_error(s));
                }
                break;
            }
            rows++;
            if (check_row(&p, &o, &why) != 0) {
                if (fails++ < 5) {
                    tap_diag("case %d (kind %d, scale %g, T %g, r %g, "
                             "pr %g, f %g, top_k %d, top_p %g, min_p %g, "
                             "%u bias) t %u: %s", k, kind, scale,
                             (double) p.temperature,
                             (double) p.repetition_penalty,
                             (double) p.presence_penalty,
                             (double) p.frequency_penalty, p.top_k,
                             (double) p.top_p, (double) p.min_p, p.n_bias, t,
                             why);
                }
                break;
            }
            /* a history of repeats, so the penalties bite */
            out[t] = t % 3 == 0 ? o.token : out[t > 0 ? t - 1 : 0];
            if (t == 0) {
                out[0] = o.token;
            }
        }
    }

    tap_ok(bad_params == 0, "every drawn corner passes msv_params_check");
    tap_ok(fails == 0 && rows == 400 * PT,
           "%d rows at the corners of the accepted ranges keep the contract "
           "(%d failed)", rows, fails);

    free(z0);
    free(z);
    msv_sampler_free(s);
}


/* The request-id rule shared by the module, the slot table and the
 * worker (its ids go into Redis keys, URIs and log lines). */
static void
test_request_id(void)
{
    static const char  *good[] = { "a", "rollout-17.3", "A_b:c-d.e", "..a" };
    static const char  *bad[] = { "", ".", "..", "a b", "a\nb", "a\"b",
                                  "a/b", "a%b", "\x1b[31m", "caf\xc3\xa9" };
    char                 big[MSV_REQ_ID_MAX + 2];
    size_t               i;
    int                  ok = 1;

    for (i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        ok &= msv_request_id_valid(good[i], strlen(good[i]));
    }
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ok &= !msv_request_id_valid(bad[i], strlen(bad[i]));
    }
    memset(big, 'x', sizeof(big));
    ok &= msv_request_id_valid(big, MSV_REQ_ID_MAX);
    ok &= !msv_request_id_valid(big, MSV_REQ_ID_MAX + 1);
    tap_ok(ok, "request ids: [A-Za-z0-9._:-], 1 to %d, not . or ..; spaces, "
           "newlines, quotes, escapes and non-ASCII refused", MSV_REQ_ID_MAX);
}


int
main(void)
{
    test_fields();
    test_entries();
    test_request();
    test_extremes();
    test_request_id();
    return tap_done();
}
