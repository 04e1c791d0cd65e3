/*
 * test_sampler.c: property tests of the sampler (docs/SAMPLER.md) on
 * random logits with fixed seeds, against an independent brute-force
 * reference: full sort of the vocabulary, double and long double sums.
 */

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "sample_contract.h"
#include "sampler.h"
#include "sampler_ref.h"
#include "mix.h"


/* ------------------------------------------------------------------ */
/* Test randomness (independent of the sampler's Philox)                */

static uint64_t  rng_state;

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

static double
rng_normal(void)
{
    double  u = rng_unif(), v = rng_unif();

    return sqrt(-2.0 * log(u + 0x1p-60)) * cos(2.0 * M_PI * v);
}


/* Logits of one of several shapes: smooth, quantized (many ties), a
 * few levels (huge ties), peaked like a language model, a few ulps
 * apart, or with non-finite values sprinkled in. */
static void
gen_logits(float *z, uint32_t V, int kind)
{
    uint32_t  i, n;
    double    sd = 0.3 + 4.0 * rng_unif();

    for (i = 0; i < V; i++) {
        switch (kind) {
        case 0:
            z[i] = (float) (sd * rng_normal());
            break;
        case 1:
            z[i] = (float) (round(sd * rng_normal() * 2.0) / 2.0);
            break;
        case 2:
            z[i] = (float) rng_below(3);
            break;
        case 3:
            z[i] = (float) (2.0 * rng_normal() - 5.0);
            break;
        case 5:
            z[i] = (float) rng_below(2);
            for (n = rng_below(6); n > 0; n--) {
                z[i] = nextafterf(z[i], INFINITY);
            }
            break;
        default:
            z[i] = (float) (sd * rng_normal());
            if (rng_below(10) == 0) {
                z[i] = rng_below(2) ? NAN : -INFINITY;
            }
            break;
        }
    }
    if (kind == 3) {
        n = 1 + rng_below(8);
        while (n--) {
            z[rng_below(V)] = (float) (8.0 + 10.0 * rng_unif());
        }
    }
    if (kind == 4 && rng_below(4) == 0) {
        z[rng_below(V)] = INFINITY;
    }
}

static const float  t_temps[] = { 0.0f, 0.3f, 0.7f, 1.0f, 1.0f, 1.5f };
static const float  t_top_ps[] = { 1.0f, 1.0f, 0.95f, 0.5f, 0.9f, 0.1f,
                                   0.999f };
static const float  t_min_ps[] = { 0.0f, 0.0f, 0.05f, 0.3f, 1.0f };

#define T_PICK(a)  (a)[rng_below(sizeof(a) / sizeof((a)[0]))]

static void
gen_case(struct msv_ref_case *c, uint32_t V, float *z0)
{
    uint32_t  i;
    int32_t   ks[] = { -1, 0, 1, 2, 5, 20, 1000, (int32_t) V,
                       (int32_t) V + 5, (int32_t) V - 1 };

    memset(c, 0, sizeof(*c));
    c->V = V;
    c->z0 = z0;
    gen_logits(z0, V, (int) rng_below(6));

    msv_ref_params(&c->p);
    c->p.temperature = T_PICK(t_temps);
    c->p.top_p = T_PICK(t_top_ps);
    c->p.min_p = T_PICK(t_min_ps);
    c->p.top_k = ks[rng_below(sizeof(ks) / sizeof(ks[0]))];
    if (rng_below(3) == 0) {
        c->p.repetition_penalty = rng_below(2) ? 1.3f : 0.8f;
    }
    if (rng_below(3) == 0) {
        c->p.frequency_penalty = rng_below(2) ? 0.25f : -0.1f;
    }
    if (rng_below(3) == 0) {
        c->p.presence_penalty = rng_below(2) ? 0.5f : -0.3f;
    }
    c->p.logprobs = (int32_t) rng_below(6) - 1;
    if (c->p.logprobs == 4) {
        c->p.logprobs = 20;
    }

    c->p.n_bias = rng_below(5);
    for (i = 0; i < c->p.n_bias; i++) {
        c->bias[i].id = (int32_t) rng_below(V);
        c->bias[i].value = (float) (10.0 * rng_unif() - 5.0);
    }

    c->n_prompt = rng_below(MSV_REF_MAX_HIST);
    for (i = 0; i < c->n_prompt; i++) {
        c->prompt[i] = (int32_t) rng_below(V);
    }
    c->t = rng_below(MSV_REF_MAX_HIST);
    for (i = 0; i < c->t; i++) {
        /* repeats, so the counts exceed 1 */
        c->out[i] = (int32_t) rng_below(V < 8 ? V : 8);
    }

    c->n_eos = 1 + rng_below(2);
    c->eos[0] = (int32_t) rng_below(V);
    c->eos[1] = (int32_t) rng_below(V);
    c->p.n_stop = rng_below(3);
    for (i = 0; i < c->p.n_stop; i++) {
        c->p.stop_ids[i] = (int32_t) rng_below(V);
    }
    c->p.min_tokens = rng_below(2) ? c->t + 1 : 0;
    c->p.ignore_eos = rng_below(4) == 0;
    c->seed = rng_next();
}


/* ------------------------------------------------------------------ */
/* One case through every mode, checked against the reference           */

static char  why[512];

#define FAIL(...)  do {                                                     \
        snprintf(why, sizeof(why), __VA_ARGS__);                            \
        return 1;                                                           \
    } while (0)

/* Scratch shared by the cases, sized for the largest vocabulary. */
struct scratch {
    float     *z;
    uint32_t  *sids;
    int32_t   *ids;
    float     *lps;
    struct msv_ref r;
};

static int
scratch_init(struct scratch *x, uint32_t V)
{
    x->z = malloc(V * sizeof(float));
    x->sids = malloc(V * sizeof(uint32_t));
    x->ids = malloc(V * sizeof(int32_t));
    x->lps = malloc(V * sizeof(float));
    if (msv_ref_alloc(&x->r, V) != 0) {
        return -1;
    }
    return x->z && x->sids && x->ids && x->lps ? 0 : -1;
}

static void
scratch_free(struct scratch *x)
{
    free(x->z);
    free(x->sids);
    free(x->ids);
    free(x->lps);
    msv_ref_free(&x->r);
}

static int
run_mode(struct msv_sampler *s, struct msv_ref_case *c, struct scratch *x,
    uint32_t mode, int32_t logprobs, struct msv_sample_out *o)
{
    int                    rc;
    struct msv_params      keep = c->p;
    struct msv_sample_req  rq;

    c->p.mask_mode = mode;
    c->p.logprobs = logprobs;
    msv_ref_req(c, &rq);
    memcpy(x->z, c->z0, c->V * sizeof(float));
    rc = msv_sample(s, x->z, &rq, o);
    c->p = keep;
    return rc;
}

static int
check_case(struct msv_sampler *s, struct msv_ref_case *c, struct scratch *x)
{
    int                    lpk;
    uint32_t               i, id, n, pos;
    double                 lsum, mx, lp_ref, tol, p1, cum;
    uint64_t               acc;
    struct msv_ref            *r = &x->r;
    struct msv_sample_out  sup, sel, off, offl;

    msv_ref_run(c, r);

    if (r->n_fin == 0) {
        if (run_mode(s, c, x, MSV_MASK_SUPPORT, -1, &sup) != -1) {
            FAIL("all logits -inf: rc is not -1");
        }
        return 0;
    }

    /* support mode, with top logprobs */
    lpk = c->p.logprobs >= 0 ? c->p.logprobs : 5;
    if (run_mode(s, c, x, MSV_MASK_SUPPORT, lpk, &sup) != 0) {
        FAIL("support mode failed: %s", msv_sampler_error(s));
    }
    for (i = 0; i < c->V; i++) {
        if (memcmp(&x->z[i], &r->zp[i], sizeof(float)) != 0) {
            FAIL("processed logit %u: %a, reference %a", i,
                 (double) x->z[i], (double) r->zp[i]);
        }
    }
    if (sup.token != r->token) {
        FAIL("token %d, reference %d", sup.token, r->token);
    }
    if (sup.n_support != r->n) {
        FAIL("|S| %u, reference %u", sup.n_support, r->n);
    }
    msv_ref_support(r, x->sids);
    for (i = 0; i < r->n; i++) {
        if ((uint32_t) sup.ids[i] != x->sids[i]) {
            FAIL("S[%u] = %d, reference %u", i, sup.ids[i], x->sids[i]);
        }
    }
    memcpy(x->ids, sup.ids, r->n * sizeof(int32_t));
    memcpy(x->lps, sup.lps, r->n * sizeof(float));

    /* the sampled token is in S; its lp is the selected lp */
    pos = UINT32_MAX;
    for (i = 0; i < r->n; i++) {
        if (x->ids[i] == sup.token) {
            pos = i;
        }
    }
    if (pos == UINT32_MAX) {
        FAIL("token %d not in S", sup.token);
    }
    if (memcmp(&sup.logprob, &x->lps[pos], sizeof(float)) != 0) {
        FAIL("logprob %a != lps[token] %a", (double) sup.logprob,
             (double) x->lps[pos]);
    }

    /* lps: against the long double reference, and normalized */
    mx = -INFINITY;
    for (i = 0; i < r->n; i++) {
        lp_ref = (double) ((long double) r->zp[x->ids[i]] - r->lse);
        tol = 1e-6 * (fabs(lp_ref) > 1.0 ? fabs(lp_ref) : 1.0);
        if (fabs((double) x->lps[i] - lp_ref) > tol) {
            FAIL("lp of %d: %.9g, reference %.9g", x->ids[i],
                 (double) x->lps[i], lp_ref);
        }
        mx = x->lps[i] > mx ? x->lps[i] : mx;
    }
    lsum = 0.0;
    for (i = 0; i < r->n; i++) {
        lsum += exp((double) x->lps[i] - mx);
    }
    if (fabs(mx + log(lsum)) > 1e-5) {
        FAIL("logsumexp of S is %.3g", mx + log(lsum));
    }

    /* |S| bounds, min-p threshold, greedy */
    if (c->p.temperature == 0.0f && r->n != 1) {
        FAIL("greedy |S| %u", r->n);
    }
    if (c->p.temperature > 0.0f && c->p.top_k > 0
        && r->n > (uint32_t) c->p.top_k)
    {
        FAIL("|S| %u > top_k %d", r->n, c->p.top_k);
    }
    if (c->p.temperature > 0.0f && c->p.min_p > 0.0f) {
        for (i = 0; i < r->n; i++) {
            if ((double) r->zp[x->ids[i]] - (double) r->zp[r->order[0]]
                < log((double) c->p.min_p))
            {
                FAIL("id %d in S under the min-p threshold", x->ids[i]);
            }
        }
    }

    /* top-p: S is the shortest prefix reaching tau, exactly and (up to
     * the weight rounding) in probabilities renormalized over S1 */
    if (r->tau >= 0.0) {
        acc = 0;
        for (i = 0; i + 1 < r->n; i++) {
            acc += r->q[i];
        }
        if ((double) acc >= r->tau || (double) (acc + r->q[r->n - 1])
                                      < r->tau)
        {
            FAIL("top-p prefix of %u not minimal", r->n);
        }
        lsum = 0.0;
        for (i = 0; i < r->n1; i++) {
            lsum += exp((double) r->zp[r->order[i]]
                        - (double) r->zp[r->order[0]]);
        }
        cum = 0.0;
        for (i = 0; i < r->n; i++) {
            p1 = exp((double) r->zp[r->order[i]]
                     - (double) r->zp[r->order[0]]) / lsum;
            if (i + 1 == r->n && cum >= (double) c->p.top_p + 1e-6) {
                FAIL("top-p: mass %.9g before the last kept token", cum);
            }
            cum += p1;
        }
        if (cum < (double) c->p.top_p - 1e-6) {
            FAIL("top-p: kept mass %.9g < top_p %g", cum,
                 (double) c->p.top_p);
        }
    }

    /* top logprobs: the best min(k, |S|) in rank order */
    n = (uint32_t) lpk < r->n ? (uint32_t) lpk : r->n;
    if (sup.n_top != n) {
        FAIL("n_top %u, want %u", sup.n_top, n);
    }
    for (i = 0; i < n; i++) {
        id = r->order[i];
        if ((uint32_t) sup.top[i].id != id) {
            FAIL("top[%u].id %d, reference %u", i, sup.top[i].id, id);
        }
        for (pos = 0; x->ids[pos] != (int32_t) id; pos++) {
            /* id is in S: found before the end */
        }
        if (memcmp(&sup.top[i].lp, &x->lps[pos], sizeof(float)) != 0) {
            FAIL("top[%u].lp differs from its support lp", i);
        }
    }

    /* selected mode: same token, ids, and lp */
    if (run_mode(s, c, x, MSV_MASK_SELECTED, -1, &sel) != 0) {
        FAIL("selected mode failed: %s", msv_sampler_error(s));
    }
    if (sel.token != sup.token || sel.n_support != r->n || sel.lps != NULL
        || memcmp(sel.ids, x->ids, r->n * sizeof(int32_t)) != 0
        || memcmp(&sel.logprob, &sup.logprob, sizeof(float)) != 0
        || sel.n_top != 0)
    {
        FAIL("selected mode differs from support mode");
    }

    /* off mode with logprobs: same token and lp, no mask */
    if (run_mode(s, c, x, MSV_MASK_OFF, lpk, &offl) != 0) {
        FAIL("off mode (logprobs) failed: %s", msv_sampler_error(s));
    }
    if (offl.token != sup.token || offl.n_support != 0 || offl.ids != NULL
        || memcmp(&offl.logprob, &sup.logprob, sizeof(float)) != 0
        || offl.n_top != n)
    {
        FAIL("off mode with logprobs differs");
    }
    for (i = 0; i < n; i++) {
        if (offl.top[i].id != (int32_t) r->order[i]) {
            FAIL("off mode top[%u] differs", i);
        }
    }

    /* off mode, nothing captured: same token */
    if (run_mode(s, c, x, MSV_MASK_OFF, -1, &off) != 0) {
        FAIL("off mode failed: %s", msv_sampler_error(s));
    }
    if (off.token != sup.token || off.n_support != 0 || off.n_top != 0
        || off.logprob != 0.0f)
    {
        FAIL("off mode: token %d, support mode %d", off.token, sup.token);
    }

    return 0;
}


/* ------------------------------------------------------------------ */
/* Tests                                                                */

static void
test_philox(void)
{
    static const uint32_t  kat[3][10] = {
        { 0, 0, 0, 0, 0, 0,
          0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8 },
        { 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
          0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd },
        { 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822,
          0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1 }
    };
    int       i, ok;
    uint32_t  out[4], ctr[4], key[2], bad, x;
    double    u, sum;

    for (i = 0; i < 3; i++) {
        msv_philox4x32_10(kat[i], kat[i] + 4, out);
        tap_ok(memcmp(out, kat[i] + 6, sizeof(out)) == 0,
               "philox4x32-10 known answer %d", i);
    }

    /* keying and counter layout, and the uniform conversion */
    ok = 1;
    bad = 0;
    sum = 0.0;
    for (i = 0; i < 100000; i++) {
        uint64_t  seed = 0x0123456789abcdefull + (uint64_t) i * 977;
        uint32_t  t = (uint32_t) i * 31u, id = (uint32_t) i * 7919u;

        ctr[0] = t;
        ctr[1] = 0;
        ctr[2] = id;
        ctr[3] = 0;
        key[0] = (uint32_t) seed;
        key[1] = (uint32_t) (seed >> 32);
        msv_philox4x32_10(ctr, key, out);
        x = msv_philox_bits(seed, t, id);
        u = msv_philox_uniform(seed, t, id);
        ok &= x == out[0];
        bad += !(u > 0.0 && u < 1.0) || u != (x + 0.5) / 4294967296.0
               || msv_philox_gumbel(seed, t, id) != -log(-log(u));
        sum += u;
    }
    tap_ok(ok, "msv_philox_bits is word 0 of counter (t, 0, id, 0), key "
           "(seed lo, seed hi)");

    ok = 1;
    for (i = 0; i < 10000; i++) {
        uint32_t  ids[4], four[4], l;

        for (l = 0; l < 4; l++) {
            ids[l] = (uint32_t) (i * 4 + l) * 2654435761u;
        }
        msv_philox_bits4((99 + (uint64_t) i) << 32, (uint32_t) i, ids, four);
        for (l = 0; l < 4; l++) {
            ok &= four[l] == msv_philox_bits((99 + (uint64_t) i) << 32,
                                             (uint32_t) i, ids[l]);
        }
    }
    tap_ok(ok, "msv_philox_bits4 equals msv_philox_bits lane by lane");
    tap_ok(bad == 0, "uniform = (x + 0.5) 2^-32 in (0, 1), gumbel = "
           "-log(-log(u)) (%u bad)", bad);
    tap_ok(fabs(sum / 100000 - 0.5) < 0.005, "uniform mean %.4f",
           sum / 100000);
}


/* Thousands of random cases against the reference.  One sampler per
 * vocabulary size serves every case of that size, so whatever a call
 * leaves in the scratch is there for the next. */
static void
test_brute_force(void)
{
    static const uint32_t  sizes[] = { 1, 2, 3, 7, 16, 50, 97, 256, 300,
                                       1000, 4099 };
    enum { N_SIZES = sizeof(sizes) / sizeof(sizes[0]) };
    int                    fails;
    float                 *z0;
    uint32_t               i, j, V, n, per;
    struct msv_ref_case           c;
    struct scratch         x;
    struct msv_sampler    *s[N_SIZES];

    struct {
        uint32_t     lo, hi;         /* sizes[lo..hi) */
        uint32_t     n;
        const char  *what;
    } plan[] = {
        { 0, 9, 3000, "1..300" }, { 9, 10, 150, "1000" },
        { 10, 11, 60, "4099" }
    };

    memset(s, 0, sizeof(s));
    z0 = malloc(4099 * sizeof(float));
    if (z0 == NULL || scratch_init(&x, 4099) != 0) {
        tap_ok(0, "brute force: out of memory");
        return;
    }
    for (j = 0; j < N_SIZES; j++) {
        s[j] = msv_sampler_new(sizes[j]);
        if (s[j] == NULL) {
            tap_ok(0, "brute force: sampler for V %u", sizes[j]);
            goto done;
        }
    }

    for (per = 0; per < sizeof(plan) / sizeof(plan[0]); per++) {
        fails = 0;
        n = plan[per].n;
        rng_state = 1000 + per;

        for (i = 0; i < n; i++) {
            j = plan[per].lo + rng_below(plan[per].hi - plan[per].lo);
            V = sizes[j];
            gen_case(&c, V, z0);
            if (check_case(s[j], &c, &x) != 0 && fails++ < 5) {
                tap_diag("case %u (V %u, T %g, top_k %d, top_p %g, "
                         "min_p %g): %s", i, V, (double) c.p.temperature,
                         c.p.top_k, (double) c.p.top_p, (double) c.p.min_p,
                         why);
            }
        }
        tap_ok(fails == 0, "brute force agrees on %u random cases, V %s "
               "(%d failed)", n, plan[per].what, fails);
    }

done:
    for (j = 0; j < N_SIZES; j++) {
        msv_sampler_free(s[j]);
    }
    free(z0);
    scratch_free(&x);
}


/* One large vocabulary, once per selection path. */
static void
test_large_vocab(void)
{
    uint32_t             i, V = 151936;
    struct msv_ref_case         c;
    struct scratch       x;
    struct msv_sampler  *s;

    struct {
        int32_t      top_k;
        float        top_p;
        float        min_p;
        const char  *what;
    } cfg[] = {
        { 20, 0.95f, 0.0f, "top_k 20 + top_p 0.95" },
        { -1, 0.95f, 0.0f, "top_p 0.95 alone" },
        { -1, 1.0f, 0.0f, "no truncation" },
        { 1000, 1.0f, 0.05f, "top_k 1000 + min_p 0.05" },
        { -1, 1.0f, 0.3f, "min_p 0.3 alone" },
    };

    s = msv_sampler_new(V);
    if (s == NULL || scratch_init(&x, V) != 0) {
        tap_ok(0, "V 151936: out of memory");
        return;
    }
    rng_state = 77;

    for (i = 0; i < sizeof(cfg) / sizeof(cfg[0]); i++) {
        memset(&c, 0, sizeof(c));
        c.V = V;
        c.z0 = malloc(V * sizeof(float));
        if (c.z0 == NULL) {
            tap_ok(0, "V 151936: out of memory");
            break;
        }
        gen_logits(c.z0, V, i == 2 ? 1 : 3);
        msv_ref_params(&c.p);
        c.p.top_k = cfg[i].top_k;
        c.p.top_p = cfg[i].top_p;
        c.p.min_p = cfg[i].min_p;
        c.p.temperature = 0.9f;
        c.p.logprobs = 8;
        c.t = 3;
        c.out[0] = 5;
        c.out[1] = 5;
        c.out[2] = 70000;
        c.p.frequency_penalty = 0.5f;
        c.seed = 42 + i;
        tap_ok(check_case(s, &c, &x) == 0, "V 151936, %s%s%s",
               cfg[i].what, why[0] ? ": " : "", why);
        why[0] = '\0';
        free(c.z0);
    }

    msv_sampler_free(s);
    scratch_free(&x);
}


/* A nucleus reaching 21 nats below the max (top_p just under 1), so the
 * race over the sorted nucleus stops early whenever the max draws a
 * large Gumbel value; every draw checked against the reference. */
static void
test_deep_nucleus(void)
{
    int                  fails;
    uint32_t             i, V = 2000;
    struct msv_ref_case         c;
    struct scratch       x;
    struct msv_sampler  *s;

    s = msv_sampler_new(V);
    if (s == NULL || scratch_init(&x, V) != 0) {
        tap_ok(0, "deep nucleus: out of memory");
        return;
    }
    memset(&c, 0, sizeof(c));
    c.V = V;
    c.z0 = malloc(V * sizeof(float));
    if (c.z0 == NULL) {
        tap_ok(0, "deep nucleus: out of memory");
        return;
    }
    for (i = 0; i < V; i++) {
        c.z0[i] = i == 0 ? 0.0f : (i <= 1500 ? -21.0f : -30.0f);
    }
    msv_ref_params(&c.p);
    c.p.top_p = 0.99999994f;
    c.p.top_k = 1800;

    fails = 0;
    for (i = 0; i < 40; i++) {
        c.seed = 1000 + i;
        c.t = i % 3;
        if (check_case(s, &c, &x) != 0 && fails++ < 3) {
            tap_diag("seed %u: %s", 1000 + i, why);
        }
    }
    tap_ok(fails == 0 && x.r.n > 1000, "a nucleus 21 nats deep (%u ids) "
           "agrees with the reference over 40 seeds", x.r.n);

    free(c.z0);
    scratch_free(&x);
    msv_sampler_free(s);
}


/* min-p at its exact boundary: the floats around max + log(min_p), each
 * in S exactly when (double) z - max >= log(min_p). */
static void
test_min_p_boundary(void)
{
    static const float  mins[] = { 0.05f, 0.3f, 0.7f, 1e-6f, 1.0f };
    static const float  maxs[] = { 0.0f, 3.7f, -12.3f, 1000.5f };
    int                    bad;
    float                  z[16], f;
    uint32_t               a, b, i, in;
    struct msv_params      p;
    struct msv_sample_req  rq;
    struct msv_sample_out  o;
    struct msv_sampler    *s;

    s = msv_sampler_new(16);
    if (s == NULL) {
        tap_ok(0, "sampler for V 16");
        return;
    }
    msv_ref_params(&p);
    p.mask_mode = MSV_MASK_SELECTED;
    memset(&rq, 0, sizeof(rq));
    rq.p = &p;

    bad = 0;
    for (a = 0; a < sizeof(mins) / sizeof(mins[0]); a++) {
        for (b = 0; b < sizeof(maxs) / sizeof(maxs[0]); b++) {
            p.min_p = mins[a];
            z[0] = maxs[b];
            f = (float) ((double) maxs[b] + log((double) mins[a]));
            for (i = 0; i < 7; i++) {
                f = nextafterf(f, -INFINITY);
            }
            for (i = 1; i < 16; i++) {
                z[i] = f < z[0] ? f : z[0];
                f = nextafterf(f, INFINITY);
            }
            /* which ids the contract keeps, before z is processed */
            in = 0;
            for (i = 0; i < 16; i++) {
                in |= ((double) z[i] - (double) z[0]
                       >= log((double) mins[a])) << i;
            }
            if (msv_sample(s, z, &rq, &o) != 0) {
                bad++;
                continue;
            }
            for (i = 0; i < o.n_support; i++) {
                in ^= 1u << o.ids[i];
            }
            if (in != 0) {
                bad++;
                tap_diag("min_p %g, max %g: S differs at the boundary",
                         (double) mins[a], (double) maxs[b]);
            }
        }
    }
    tap_ok(bad == 0, "min-p boundary exact, ulp by ulp (%d wrong)", bad);
    msv_sampler_free(s);
}


/* Hand-made cases with known answers. */
static void
test_known(void)
{
    int                    rc;
    float                  z[16];
    uint32_t               i;
    struct msv_params      p;
    struct msv_sample_req  rq;
    struct msv_sample_out  o;
    struct msv_sampler    *s;
    int32_t                eos = 3;

    s = msv_sampler_new(16);
    if (s == NULL) {
        tap_ok(0, "sampler for V 16");
        return;
    }

    msv_ref_params(&p);
    memset(&rq, 0, sizeof(rq));
    rq.p = &p;
    rq.eos = &eos;
    rq.n_eos = 1;
    rq.seed = 9;

    /* greedy: lowest id among ties, width 1, lp 0 */
    for (i = 0; i < 16; i++) {
        z[i] = (i == 5 || i == 9 || i == 12) ? 2.0f : 1.0f;
    }
    p.temperature = 0.0f;
    p.mask_mode = MSV_MASK_SUPPORT;
    p.logprobs = 3;
    rc = msv_sample(s, z, &rq, &o);
    tap_ok(rc == 0 && o.token == 5 && o.n_support == 1 && o.ids[0] == 5
           && o.lps[0] == 0.0f && o.logprob == 0.0f && o.n_top == 1
           && o.top[0].id == 5, "greedy: lowest id of the tied max, |S| 1");

    /* +inf (FLT_MAX) beside -FLT_MAX: every logprob is a float, the
     * far one -FLT_MAX, and the support still sums to 1 */
    for (i = 0; i < 16; i++) {
        z[i] = i == 2 ? INFINITY : (i == 7 ? -FLT_MAX : 0.0f);
    }
    p.temperature = 1.0f;
    p.logprobs = -1;
    rc = msv_sample(s, z, &rq, &o);
    {
        int  fin = rc == 0 && o.n_support == 16;

        for (i = 0; fin && i < 16; i++) {
            fin = isfinite(o.lps[i]) && (i != 7 || o.lps[i] == -FLT_MAX);
        }
        tap_ok(fin && o.token == 2 && o.lps[2] == 0.0f,
               "FLT_MAX beside -FLT_MAX: every support logprob finite");
    }
    p.logprobs = 3;

    /* top_k at a tie boundary keeps the lower ids */
    for (i = 0; i < 16; i++) {
        z[i] = i < 6 ? 3.0f : 0.0f;
    }
    p.temperature = 1.0f;
    p.top_k = 4;
    rc = msv_sample(s, z, &rq, &o);
    tap_ok(rc == 0 && o.n_support == 4 && o.ids[0] == 0 && o.ids[3] == 3
           && fabsf(o.lps[0] + logf(4.0f)) < 1e-6f,
           "top_k 4 over 6 tied: ids 0..3, lp -log 4");

    /* top_p 0.5 over four equal tokens: exactly two */
    p.top_k = -1;
    p.top_p = 0.5f;
    for (i = 0; i < 16; i++) {
        z[i] = i < 4 ? 0.0f : -INFINITY;
    }
    rc = msv_sample(s, z, &rq, &o);
    tap_ok(rc == 0 && o.n_support == 2 && o.ids[0] == 0 && o.ids[1] == 1,
           "top_p 0.5 over 4 equal: the two lowest ids");

    /* min_p 0.5: p >= 0.5 p_max means z >= max - log 2 */
    p.top_p = 1.0f;
    p.min_p = 0.5f;
    for (i = 0; i < 16; i++) {
        z[i] = -(float) i * 0.25f;
    }
    rc = msv_sample(s, z, &rq, &o);
    tap_ok(rc == 0 && o.n_support == 3 && o.ids[2] == 2,
           "min_p 0.5 keeps z >= max - log 2 (3 ids)");
    p.min_p = 0.0f;

    /* min_tokens masks eos and stop ids while t < min_tokens */
    for (i = 0; i < 16; i++) {
        z[i] = (float) i * 0.1f;
    }
    z[3] = 50.0f;
    z[7] = 40.0f;
    p.temperature = 0.0f;
    p.min_tokens = 2;
    p.n_stop = 1;
    p.stop_ids[0] = 7;
    rq.t = 1;
    rc = msv_sample(s, z, &rq, &o);
    tap_ok(rc == 0 && o.token == 15, "min_tokens: eos and stop id masked "
           "at t 1 (token %d)", o.token);
    z[3] = 50.0f;
    rq.t = 2;
    rc = msv_sample(s, z, &rq, &o);
    tap_ok(rc == 0 && o.token == 3, "min_tokens: eos allowed at t 2");
    z[3] = 50.0f;
    z[7] = 40.0f;
    rq.t = 1;
    p.ignore_eos = 1;
    rc = msv_sample(s, z, &rq, &o);
    tap_ok(rc == 0 && o.token == 3, "min_tokens: ignore_eos leaves eos");
    p.ignore_eos = 0;

    /* ... unless nothing else is finite */
    for (i = 0; i < 16; i++) {
        z[i] = -INFINITY;
    }
    z[3] = 1.0f;
    z[7] = 2.0f;
    rc = msv_sample(s, z, &rq, &o);
    tap_ok(rc == 0 && o.token == 7 && o.n_support == 1,
           "min_tokens: not applied when it would mask every token");
    p.min_tokens = 0;
    p.n_stop = 0;

    /* non-finite logits */
    for (i = 0; i < 16; i++) {
        z[i] = NAN;
    }
    z[11] = -INFINITY;
    rc = msv_sample(s, z, &rq, &o);
    tap_ok(rc == -1 && msv_sampler_error(s)[0] != '\0',
           "all NaN / -inf: -1 (%s)", msv_sampler_error(s));
    for (i = 0; i < 16; i++) {
        z[i] = i == 4 ? NAN : 1.0f;
    }
    z[6] = INFINITY;
    p.temperature = 1.0f;
    p.top_k = -1;
    rc = msv_sample(s, z, &rq, &o);
    tap_ok(rc == 0 && o.n_support == 15 && o.ids[4] == 5 && z[6] == FLT_MAX
           && o.token == 6, "NaN is dropped, +inf saturates to FLT_MAX");

    /* penalties on known values */
    for (i = 0; i < 16; i++) {
        z[i] = 0.0f;
    }
    {
        int32_t  prompt[2] = { 1, 2 }, out[3] = { 2, 3, 3 };

        z[1] = 2.0f;
        z[2] = -2.0f;
        z[3] = 1.0f;
        p.repetition_penalty = 2.0f;
        p.frequency_penalty = 0.5f;
        p.presence_penalty = 0.25f;
        p.mask_mode = MSV_MASK_OFF;
        rq.prompt = prompt;
        rq.n_prompt = 2;
        rq.out = out;
        rq.t = 3;
        rc = msv_sample(s, z, &rq, &o);
        tap_ok(rc == 0 && z[1] == 1.0f && z[2] == -4.75f && z[3] == -0.75f
               && z[0] == 0.0f, "penalties: rep /2 or *2, then frequency "
               "and presence on output ids");
        rq.prompt = NULL;
        rq.n_prompt = 0;
        rq.out = NULL;
        rq.t = 0;
        p.repetition_penalty = 1.0f;
        p.frequency_penalty = 0.0f;
        p.presence_penalty = 0.0f;
    }

    msv_sampler_free(s);
}


static void
test_invalid(void)
{
    int                    bad;
    float                  z[8];
    uint32_t               i, k;
    struct msv_bias        b;
    struct msv_params      p;
    struct msv_sample_req  rq;
    struct msv_sample_out  o;
    struct msv_sampler    *s;

    s = msv_sampler_new(8);
    if (s == NULL) {
        tap_ok(0, "sampler for V 8");
        return;
    }

    bad = 0;
    for (k = 0; k < 22; k++) {
        msv_ref_params(&p);
        memset(&rq, 0, sizeof(rq));
        rq.p = &p;
        rq.bias = &b;
        b.id = 1;
        b.value = 1.0f;
        switch (k) {
        case 0: p.temperature = -1.0f; break;
        case 1: p.temperature = NAN; break;
        case 2: p.top_p = 0.0f; break;
        case 3: p.top_p = 1.5f; break;
        case 4: p.top_p = NAN; break;
        case 5: p.min_p = -0.1f; break;
        case 6: p.min_p = 1.1f; break;
        case 7: p.min_p = NAN; break;
        case 8: p.repetition_penalty = 0.0f; break;
        case 9: p.repetition_penalty = -1.0f; break;
        case 10: p.repetition_penalty = NAN; break;
        case 11: p.presence_penalty = NAN; break;
        case 12: p.frequency_penalty = INFINITY; break;
        case 13: p.n_bias = 1; b.id = 8; break;
        case 14: p.n_bias = 1; b.id = -1; break;
        case 15: p.n_bias = 1; b.value = NAN; break;
        case 16: p.mask_mode = 3; break;
        case 17: p.logprobs = -2; break;
        case 18: p.logprobs = MSV_MAX_LOGPROBS + 1; break;
        case 19: p.n_stop = 1; p.stop_ids[0] = 8; break;
        case 20: p.temperature = INFINITY; break;
        default: p.repetition_penalty = 1.5f; rq.n_prompt = 1;
                 rq.prompt = (const int32_t *) &b.id; b.id = 9; break;
        }
        for (i = 0; i < 8; i++) {
            z[i] = (float) i;
        }
        if (msv_sample(s, z, &rq, &o) != -1 || msv_sampler_error(s)[0] == 0) {
            bad++;
            tap_diag("invalid case %u accepted", k);
        }
    }
    tap_ok(bad == 0, "22 kinds of invalid params are refused with a "
           "message (%d accepted)", bad);

    msv_ref_params(&p);
    rq.p = &p;
    rq.n_prompt = 0;
    tap_ok(msv_sample(s, NULL, &rq, &o) == -1, "NULL logits: -1");
    tap_ok(msv_sampler_new(0) == NULL
           && msv_sampler_new(MSV_SAMPLER_MAX_VOCAB + 1) == NULL,
           "vocab 0 and above the maximum refused");

    msv_sampler_free(s);
}


/* A request's outputs don't depend on what else went through the same
 * sampler: run it alone, then interleaved with two other requests. */
#define IL_V      1000
#define IL_STEPS  24

struct il_req {
    struct msv_params  p;
    struct msv_bias    bias[4];
    int32_t            toks[8 + IL_STEPS];     /* prompt, then output */
    uint32_t           n_prompt;
    uint64_t           seed;
    uint64_t           zseed;
};

static void
il_logits(const struct il_req *q, uint32_t t, float *z)
{
    uint32_t  i;

    rng_state = q->zseed * 1000003 + t;
    for (i = 0; i < IL_V; i++) {
        z[i] = (float) (2.0 * rng_normal());
    }
}

static int
il_step(struct msv_sampler *s, struct il_req *q, uint32_t t, float *z,
    struct msv_sample_out *o)
{
    int32_t                eos = 7;
    struct msv_sample_req  rq;

    il_logits(q, t, z);
    memset(&rq, 0, sizeof(rq));
    rq.p = &q->p;
    rq.bias = q->bias;
    rq.seed = q->seed;
    rq.t = t;
    rq.prompt = q->toks;
    rq.n_prompt = q->n_prompt;
    rq.out = q->toks + q->n_prompt;
    rq.eos = &eos;
    rq.n_eos = 1;
    if (msv_sample(s, z, &rq, o) != 0) {
        return -1;
    }
    q->toks[q->n_prompt + t] = o->token;
    return 0;
}

static void
test_interleave(void)
{
    int                    bad;
    float                 *z;
    uint32_t               t, i, n;
    struct il_req          a, b, c, a2;
    struct msv_sample_out  o;
    struct msv_sampler    *s1, *s2;
    int32_t               *ids;
    float                 *lps;
    struct msv_top         top[8];
    int32_t                tok[IL_STEPS];
    uint32_t               nsup[IL_STEPS];

    memset(&a, 0, sizeof(a));
    msv_ref_params(&a.p);
    a.p.top_k = 50;
    a.p.top_p = 0.9f;
    a.p.repetition_penalty = 1.2f;
    a.p.frequency_penalty = 0.3f;
    a.p.mask_mode = MSV_MASK_SUPPORT;
    a.p.logprobs = 5;
    a.p.min_tokens = 4;
    a.p.n_bias = 1;
    a.bias[0].id = 11;
    a.bias[0].value = 3.0f;
    a.n_prompt = 8;
    for (i = 0; i < 8; i++) {
        a.toks[i] = (int32_t) (i * 37);
    }
    a.seed = 123456789;
    a.zseed = 1;

    b = a;
    msv_ref_params(&b.p);
    b.p.min_p = 0.1f;
    b.p.presence_penalty = 1.0f;
    b.p.mask_mode = MSV_MASK_SELECTED;
    b.p.logprobs = 2;
    b.seed = 5;
    b.zseed = 2;

    c = a;
    msv_ref_params(&c.p);
    c.p.temperature = 0.5f;
    c.p.repetition_penalty = 0.7f;
    c.p.top_k = 900;
    c.p.mask_mode = MSV_MASK_SUPPORT;
    c.seed = 6;
    c.zseed = 3;

    a2 = a;

    s1 = msv_sampler_new(IL_V);
    s2 = msv_sampler_new(IL_V);
    z = malloc(IL_V * sizeof(float));
    ids = malloc((size_t) IL_STEPS * IL_V * sizeof(int32_t));
    lps = malloc((size_t) IL_STEPS * IL_V * sizeof(float));
    if (s1 == NULL || s2 == NULL || z == NULL || ids == NULL || lps == NULL)
    {
        tap_ok(0, "interleave: out of memory");
        return;
    }

    bad = 0;
    for (t = 0; t < IL_STEPS; t++) {
        if (il_step(s1, &a, t, z, &o) != 0) {
            bad++;
            break;
        }
        tok[t] = o.token;
        nsup[t] = o.n_support;
        memcpy(ids + t * IL_V, o.ids, o.n_support * sizeof(int32_t));
        memcpy(lps + t * IL_V, o.lps, o.n_support * sizeof(float));
        if (t == IL_STEPS - 1) {
            memcpy(top, o.top, o.n_top * sizeof(*top));
        }
    }

    for (t = 0; t < IL_STEPS && bad == 0; t++) {
        if (il_step(s2, &b, t, z, &o) != 0 || il_step(s2, &a2, t, z, &o) != 0)
        {
            bad++;
            break;
        }
        n = o.n_support;
        if (o.token != tok[t] || n != nsup[t]
            || memcmp(o.ids, ids + t * IL_V, n * sizeof(int32_t)) != 0
            || memcmp(o.lps, lps + t * IL_V, n * sizeof(float)) != 0
            || (t == IL_STEPS - 1
                && memcmp(o.top, top, o.n_top * sizeof(*top)) != 0))
        {
            bad++;
            tap_diag("step %u: interleaved output differs", t);
        }
        if (il_step(s2, &c, t, z, &o) != 0) {
            bad++;
        }
    }
    tap_ok(bad == 0, "a request's tokens, masks and lps are the same alone "
           "and interleaved with others (%u steps)", IL_STEPS);

    /* and the seed matters */
    n = 0;
    a2 = a;
    a2.seed = a.seed + 1;
    for (t = 0; t < IL_STEPS; t++) {
        if (il_step(s2, &a2, t, z, &o) == 0 && o.token != tok[t]) {
            n++;
        }
    }
    tap_ok(n > 0, "another seed draws other tokens (%u of %u differ)", n,
           IL_STEPS);

    free(z);
    free(ids);
    free(lps);
    msv_sampler_free(s1);
    msv_sampler_free(s2);
}


/* Empirical frequencies over many positions t match exp(lp). */
static void
test_frequencies(void)
{
    int                    rc;
    float                  z0[12], z[12], lp[12];
    double                 chi2, e;
    uint32_t               i, j, k, n_sup, N = 60000, outside, cnt[12];
    struct msv_params      p;
    struct msv_sample_req  rq;
    struct msv_sample_out  o;
    struct msv_sampler    *s;

    struct {
        int32_t      top_k;
        float        top_p;
        float        min_p;
        float        temp;
        const char  *what;
    } cfg[] = {
        { -1, 1.0f, 0.0f, 1.0f, "full softmax (inline race)" },
        { 8, 0.9f, 0.0f, 0.8f, "top_k 8, top_p 0.9, T 0.8 (sorted list)" },
        { 6, 1.0f, 0.0f, 1.3f, "top_k 6 (unsorted list)" },
        { -1, 1.0f, 0.02f, 1.0f, "min_p 0.02 (dense race)" },
    };
    static const float  base[12] = { 2.0f, 1.5f, 1.4f, 0.9f, 0.2f, 0.0f,
                                     -0.5f, -1.0f, -1.2f, -2.0f, -3.0f,
                                     -4.5f };

    s = msv_sampler_new(12);
    if (s == NULL) {
        tap_ok(0, "sampler for V 12");
        return;
    }

    for (k = 0; k < sizeof(cfg) / sizeof(cfg[0]); k++) {
        for (i = 0; i < 12; i++) {
            z0[i] = base[(i * 5 + k) % 12];
        }
        msv_ref_params(&p);
        p.top_k = cfg[k].top_k;
        p.top_p = cfg[k].top_p;
        p.min_p = cfg[k].min_p;
        p.temperature = cfg[k].temp;
        memset(&rq, 0, sizeof(rq));
        rq.p = &p;
        rq.seed = 0xfeedface + k;

        /* the distribution, from support mode */
        p.mask_mode = MSV_MASK_SUPPORT;
        memcpy(z, z0, sizeof(z));
        rc = msv_sample(s, z, &rq, &o);
        n_sup = rc == 0 ? o.n_support : 0;
        for (i = 0; i < 12; i++) {
            lp[i] = -INFINITY;
        }
        for (i = 0; i < n_sup; i++) {
            lp[o.ids[i]] = o.lps[i];
        }

        p.mask_mode = MSV_MASK_OFF;
        memset(cnt, 0, sizeof(cnt));
        for (j = 0; rc == 0 && j < N; j++) {
            rq.t = j;
            memcpy(z, z0, sizeof(z));
            rc = msv_sample(s, z, &rq, &o);
            cnt[o.token]++;
        }

        chi2 = 0.0;
        outside = 0;
        for (i = 0; i < 12; i++) {
            if (lp[i] == -INFINITY) {
                outside += cnt[i];
                continue;
            }
            e = N * exp((double) lp[i]);
            chi2 += (cnt[i] - e) * (cnt[i] - e) / e;
        }
        /* df = n_sup - 1; the bound is about p = 1e-5 */
        tap_ok(rc == 0 && outside == 0 && n_sup > 1
               && chi2 < (n_sup - 1) + 6.0 * sqrt(2.0 * (n_sup - 1)) + 8.0,
               "frequencies match exp(lp): %s, |S| %u, chi2 %.1f over %u "
               "draws", cfg[k].what, n_sup, chi2, N);
    }

    msv_sampler_free(s);
}


int
main(void)
{
    test_philox();
    test_known();
    test_min_p_boundary();
    test_invalid();
    test_brute_force();
    test_large_vocab();
    test_deep_nucleus();
    test_interleave();
    test_frequencies();
    return tap_done();
}
