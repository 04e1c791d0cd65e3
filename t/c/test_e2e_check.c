/*
 * test_e2e_check.c: the response checker of bench/e2e_load and of the
 * end-to-end tests (bench/e2e/check.c), on documents made here: valid
 * JSON and packed masks pass, and each kind of broken mask, JSON or
 * packed, or of broken logprobs, tokens or finish_reason in a whole
 * choice, is caught with a message saying what is wrong; and whole
 * responses (bench/e2e/resp.c, sse.c), streams fed a byte or a few at a
 * time, with what spans their events checked; and responses of several
 * choices (sampling_params.n), whole and streamed, with a missing or a
 * duplicate index or a bad row in one choice caught, and their hashes the
 * same however the events split them.  t/50-client.t runs the load
 * client itself against a live stack.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "tap.h"
#include "msv_b64.h"
#include "check.h"
#include "resp.h"


/* Parse one document and check it; returns the checker's verdict. */

static int
check_expect(const char *json, const msv_expect_t *e, char *why,
    size_t whylen)
{
    int           rc;
    msv_doc_t     d;
    yajl_handle   h;
    yajl_status   st;

    memset(&d, 0, sizeof(d));
    msv_doc_reset(&d, e);
    h = yajl_alloc(&msv_doc_callbacks, NULL, &d);
    st = yajl_parse(h, (const unsigned char *) json, strlen(json));
    if (st == yajl_status_ok) {
        st = yajl_complete_parse(h);
    }
    yajl_free(h);

    if (st != yajl_status_ok) {
        snprintf(why, whylen, "%s", d.bad[0] ? d.bad : "(yajl error)");
        rc = -1;
    } else {
        rc = msv_doc_check(&d);
        snprintf(why, whylen, "%s", d.bad);
    }

    msv_doc_free(&d);
    return rc;
}


/* One event of a stream: no vocabulary, logprobs or max_tokens known. */

static int
check(const char *json, long top_k, double temperature, int variant,
    char *why, size_t whylen)
{
    msv_expect_t  e = { top_k, temperature, variant, 0, -1, -1, 0, 1 };

    return check_expect(json, &e, why, whylen);
}


static char *
b64(const void *p, size_t n)
{
    char       *s, *e;
    msv_b64_t   st;

    s = malloc(msv_b64_len(n) + 1);
    msv_b64_init(&st, 0);
    e = msv_b64_put(&st, s, p, n);
    e = msv_b64_end(&st, e);
    *e = '\0';
    return s;
}


/* A packed choice: tokens, lengths, ids, logprobs. */

static char *
packed(const char *tokens, const int32_t *len, size_t n, const int32_t *ids,
    size_t n_ids, const float *lps, size_t n_lps, const char *fmt)
{
    char  *l, *i, *p, *out;

    l = b64(len, 4 * n);
    i = b64(ids, 4 * n_ids);
    p = b64(lps, 4 * n_lps);
    out = malloc(strlen(l) + strlen(i) + strlen(p) + 512);
    sprintf(out, "{\"request_id\":\"r\",\"choices\":[{\"index\":0,"
            "\"token_ids\":[%s],\"sampling_mask_packed\":{\"format\":\"%s\","
            "\"lengths\":\"%s\",\"ids\":\"%s\",\"logprobs\":\"%s\"},"
            "\"finish_reason\":null}]}", tokens, fmt, l, i, p);
    free(l);
    free(i);
    free(p);
    return out;
}


/* A whole choice, as the end-to-end tests check it: its parts. */

static char *
choice(const char *tokens, const char *mask, const char *mlps,
    const char *logprobs, const char *finish)
{
    char  *out;

    out = malloc(strlen(tokens) + strlen(mask) + strlen(mlps)
                 + strlen(logprobs) + strlen(finish) + 256);
    sprintf(out, "{\"choices\":[{\"index\":0%s%s%s%s%s%s%s%s%s,"
            "\"finish_reason\":%s}]}",
            tokens[0] ? ",\"token_ids\":" : "", tokens,
            mask[0] ? ",\"sampling_mask\":" : "", mask,
            mlps[0] ? ",\"sampling_mask_logprobs\":" : "", mlps,
            logprobs[0] ? ",\"logprobs\":" : "", logprobs, "", finish);
    return out;
}


/* A whole response of n choices through resp.c, fed `step` bytes at a
 * time (0: all at once); returns its verdict, and its hash in *hash. */

static int
check_resp_n(const char *body, int stream, long n_choices, size_t step,
    uint64_t *hash, char *why, size_t whylen)
{
    msv_resp_t  r;
    size_t      n = strlen(body), off, k;
    int         rc = 0;

    memset(&r, 0, sizeof(r));
    r.e.top_k = 10;
    r.e.temperature = 1.0;
    r.e.variant = MSV_MODE_SELECTED;
    r.e.vocab = 16;
    r.e.max_tokens = 2;
    r.e.logprobs = -1;
    r.e.whole = !stream;
    r.e.n = n_choices;
    r.stream = stream;
    r.prompt_len = 3;
    r.max_tokens = 2;
    r.ignore_eos = 1;
    msv_resp_reset(&r);

    for (off = 0; off < n && rc == 0; off += k) {
        k = step && n - off > step ? step : n - off;
        rc = msv_resp_data(&r, body + off, k);
    }
    if (rc == 0 && msv_resp_end(&r) == 0) {
        msv_resp_check(&r);
    }
    snprintf(why, whylen, "%s", r.bad);
    rc = r.bad[0] ? -1 : 0;
    if (hash != NULL) {
        *hash = r.hash;
    }
    msv_resp_free(&r);
    return rc;
}


static int
check_resp(const char *body, int stream, size_t step, char *why,
    size_t whylen)
{
    return check_resp_n(body, stream, 1, step, NULL, why, whylen);
}


int
main(void)
{
    char            why[256];
    int             rc;
    size_t          k;

    /* rows [3, 9, 12] and [5]; the tokens 9 and 5 */
    static const int32_t  len[] = { 3, 1 };
    static const int32_t  ids[] = { 3, 9, 12, 5 };
    static const int32_t  unsorted[] = { 3, 12, 9, 5 };
    static const float    sel[] = { -1.5f, 0.0f };
    static const float    sup[] = { -1.0986123f, -1.0986123f, -1.0986123f,
                                    0.0f };
    static const float    sup_bad[] = { -1.0f, -1.0f, -1.0f, 0.0f };
    static const float    pos[] = { 0.5f, 0.0f };

    static const char  *json_ok =
        "{\"request_id\":\"r\",\"choices\":[{\"index\":0,\"token_ids\":[9,5],"
        "\"sampling_mask\":[[3,9,12],[5]],\"sampling_mask_logprobs\":"
        "[[-1.0986123,-1.0986123,-1.0986123],[0.0]],\"finish_reason\":"
        "\"length\"}],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":"
        "2}}";

    struct {
        const char  *name;
        char        *doc;
        long         top_k;
        int          variant;
        const char  *want;          /* NULL: valid */
    } cases[] = {
        { "JSON support", (char *) json_ok, 10, MSV_MODE_SUPPORT, NULL },
        { "packed selected",
          packed("9,5", len, 2, ids, 4, sel, 2, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SELECTED_PACKED, NULL },
        { "packed support",
          packed("9,5", len, 2, ids, 4, sup, 4, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SUPPORT_PACKED, NULL },
        { "a JSON mask where packed was asked", (char *) json_ok, 10,
          MSV_MODE_SUPPORT_PACKED, "a JSON mask, packed asked" },
        { "a packed mask where JSON was asked",
          packed("9,5", len, 2, ids, 4, sel, 2, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SELECTED, "a packed mask, JSON asked" },
        { "packed ids out of order",
          packed("9,5", len, 2, unsorted, 4, sel, 2, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SELECTED_PACKED, "not ascending" },
        { "packed lengths that do not add up",
          packed("9,5", len, 2, ids, 3, sel, 2, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SELECTED_PACKED, "the lengths add up to 4" },
        { "packed support rows not summing to 1",
          packed("9,5", len, 2, ids, 4, sup_bad, 4, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SUPPORT_PACKED, "logsumexp" },
        { "packed selected logprobs in support mode",
          packed("9,5", len, 2, ids, 4, sel, 2, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SUPPORT_PACKED, "2 logprobs in support mode" },
        { "a packed logprob above 0",
          packed("9,5", len, 2, ids, 4, pos, 2, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SELECTED_PACKED, "above 0" },
        { "a sampled token outside its packed row",
          packed("8,5", len, 2, ids, 4, sel, 2, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SELECTED_PACKED, "not in its mask row" },
        { "a packed row wider than top_k",
          packed("9,5", len, 2, ids, 4, sel, 2, MSV_PACKED_FORMAT), 2,
          MSV_MODE_SELECTED_PACKED, "top_k 2" },
        { "a packed row for fewer tokens",
          packed("9,5,7", len, 2, ids, 4, sel, 2, MSV_PACKED_FORMAT), 10,
          MSV_MODE_SELECTED_PACKED, "2 mask rows for 3 tokens" },
        { "another packed format",
          packed("9,5", len, 2, ids, 4, sel, 2, "csr-i32-f16-le-v1"), 10,
          MSV_MODE_SELECTED_PACKED, "format" },
        { "packed data that is not base64",
          strdup("{\"choices\":[{\"index\":0,\"token_ids\":[9],"
                 "\"sampling_mask_packed\":{\"format\":\"csr-i32-f32-le-v1\","
                 "\"lengths\":\"AQAAAA=\",\"ids\":\"CQAAAA==\",\"logprobs\":"
                 "\"AAAAAA==\"},\"finish_reason\":null}]}"), 10,
          MSV_MODE_SELECTED_PACKED, "invalid base64" },
        { "a packed object without its ids",
          strdup("{\"choices\":[{\"index\":0,\"token_ids\":[9],"
                 "\"sampling_mask_packed\":{\"format\":\"csr-i32-f32-le-v1\","
                 "\"lengths\":\"AQAAAA==\",\"logprobs\":\"AAAAAA==\"},"
                 "\"finish_reason\":null}]}"), 10,
          MSV_MODE_SELECTED_PACKED, "a key is missing" },
    };

    for (k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        rc = check(cases[k].doc, cases[k].top_k, 1.0, cases[k].variant, why,
                   sizeof(why));
        if (cases[k].want == NULL) {
            tap_ok(rc == 0, "%s passes%s%s", cases[k].name,
                   rc ? ": " : "", rc ? why : "");
        } else {
            tap_ok(rc != 0 && strstr(why, cases[k].want) != NULL,
                   "%s is caught (\"%s\")", cases[k].name, why);
        }
        if (cases[k].doc != json_ok) {
            free(cases[k].doc);
        }
    }

    /* whole choices with logprobs.content, as the tests check them */
    {
        static const char  *rows = "[[3,9,12],[5]]";
        static const char  *sup3 = "[[-1.0986123,-1.0986123,-1.0986123],"
                                   "[0.0]]";
        static const char  *lp_ok =
            "{\"content\":[{\"token_id\":9,\"logprob\":-1.0986123,"
            "\"top_logprobs\":[{\"token_id\":3,\"logprob\":-1.0986123},"
            "{\"token_id\":9,\"logprob\":-1.0986123}]},{\"token_id\":5,"
            "\"logprob\":0.0,\"top_logprobs\":[{\"token_id\":5,"
            "\"logprob\":0.0}]}]}";
        static const char  *lp_one =
            "{\"content\":[{\"token_id\":9,\"logprob\":-1.0986123,"
            "\"top_logprobs\":[]}]}";
        static const char  *lp_other =
            "{\"content\":[{\"token_id\":3,\"logprob\":-1.0986123,"
            "\"top_logprobs\":[]},{\"token_id\":5,\"logprob\":0.0,"
            "\"top_logprobs\":[]}]}";
        static const char  *lp_unsorted =
            "{\"content\":[{\"token_id\":9,\"logprob\":-1.0986123,"
            "\"top_logprobs\":[{\"token_id\":3,\"logprob\":-2},"
            "{\"token_id\":9,\"logprob\":-1.0986123}]},{\"token_id\":5,"
            "\"logprob\":0.0,\"top_logprobs\":[]}]}";
        static const char  *lp_above =
            "{\"content\":[{\"token_id\":9,\"logprob\":-1.0986123,"
            "\"top_logprobs\":[{\"token_id\":3,\"logprob\":-1.5}]},"
            "{\"token_id\":5,\"logprob\":0.0,\"top_logprobs\":[]}]}";
        static const char  *lp_differs =
            "{\"content\":[{\"token_id\":9,\"logprob\":-1.5,"
            "\"top_logprobs\":[{\"token_id\":3,\"logprob\":-1.0986123}]},"
            "{\"token_id\":5,\"logprob\":0.0,\"top_logprobs\":[]}]}";
        static const char  *lp_no_top =
            "{\"content\":[{\"token_id\":9,\"logprob\":-1.0986123},"
            "{\"token_id\":5,\"logprob\":0.0,\"top_logprobs\":[]}]}";

        struct {
            const char    *name;
            char          *doc;
            msv_expect_t   e;
            const char    *want;    /* NULL: valid */
        } wc[] = {
            { "a whole support choice with logprobs",
              choice("[9,5]", rows, sup3, lp_ok, "\"stop\""),
              { 10, 1.0, MSV_MODE_SUPPORT, 16, 4, 2, 1, 1 }, NULL },
            { "a whole choice without the mask, aborted",
              choice("[9,5]", "", "", "", "\"abort\""),
              { 10, 1.0, MSV_MODE_OFF, 16, 4, -1, 1, 1 }, NULL },
            { "a token outside the vocabulary",
              choice("[9,5]", rows, sup3, "", "\"stop\""),
              { 10, 1.0, MSV_MODE_SUPPORT, 8, 4, -1, 1, 1 },
              "token 9 outside the vocabulary of 8" },
            { "a mask id outside the vocabulary",
              choice("[9,5]", rows, sup3, "", "\"stop\""),
              { 10, 1.0, MSV_MODE_SUPPORT, 10, 4, -1, 1, 1 },
              "id 12 outside the vocabulary" },
            { "more tokens than max_tokens",
              choice("[9,5]", rows, sup3, "", "\"length\""),
              { 10, 1.0, MSV_MODE_SUPPORT, 16, 1, -1, 1, 1 },
              "more tokens (2) than max_tokens 1" },
            { "a whole choice with a null finish_reason",
              choice("[9,5]", rows, sup3, "", "null"),
              { 10, 1.0, MSV_MODE_SUPPORT, 16, 4, -1, 1, 1 },
              "finish_reason null" },
            { "an unknown finish_reason",
              choice("[9,5]", rows, sup3, "", "\"eos\""),
              { 10, 1.0, MSV_MODE_SUPPORT, 16, 4, -1, 1, 1 },
              "finish_reason \"eos\"" },
            { "a whole choice without token_ids",
              choice("", "", "", "", "\"stop\""),
              { 10, 1.0, MSV_MODE_OFF, 16, 4, -1, 1, 1 }, "no token_ids" },
            { "logprobs not asked for",
              choice("[9,5]", rows, sup3, lp_ok, "\"stop\""),
              { 10, 1.0, MSV_MODE_SUPPORT, 16, 4, -1, 1, 1 },
              "logprobs sent although not asked for" },
            { "logprobs null, not asked for",
              choice("[9,5]", "", "", "null", "\"stop\""),
              { 10, 1.0, MSV_MODE_OFF, 16, 4, -1, 1, 1 },
              "logprobs sent although not asked for" },
            { "logprobs asked for, not sent",
              choice("[9,5]", rows, sup3, "", "\"stop\""),
              { 10, 1.0, MSV_MODE_SUPPORT, 16, 4, 2, 1, 1 },
              "no logprobs.content" },
            { "fewer logprobs entries than tokens",
              choice("[9,5]", rows, sup3, lp_one, "\"stop\""),
              { 10, 1.0, MSV_MODE_SUPPORT, 16, 4, 2, 1, 1 },
              "1 entries for 2 tokens" },
            { "a logprobs entry of another token",
              choice("[9,5]", "", "", lp_other, "\"stop\""),
              { 10, 1.0, MSV_MODE_OFF, 16, 4, 2, 1, 1 },
              "token_id 3, sampled 9" },
            { "more top_logprobs than asked",
              choice("[9,5]", rows, sup3, lp_ok, "\"stop\""),
              { 10, 1.0, MSV_MODE_SUPPORT, 16, 4, 1, 1, 1 },
              "2 top_logprobs, 1 asked" },
            { "top_logprobs not best first",
              choice("[9,5]", "", "", lp_unsorted, "\"stop\""),
              { 10, 1.0, MSV_MODE_OFF, 16, 4, 2, 1, 1 }, "not best first" },
            { "a sampled logprob above the best",
              choice("[9,5]", "", "", lp_above, "\"stop\""),
              { 10, 1.0, MSV_MODE_OFF, 16, 4, 2, 1, 1 }, "above the best" },
            { "logprobs.content differing from the support",
              choice("[9,5]", rows, sup3, lp_differs, "\"stop\""),
              { 10, 1.0, MSV_MODE_SUPPORT, 16, 4, 2, 1, 1 },
              "logprobs.content logprob -1.5" },
            { "a logprobs entry without top_logprobs",
              choice("[9,5]", "", "", lp_no_top, "\"stop\""),
              { 10, 1.0, MSV_MODE_OFF, 16, 4, 2, 1, 1 },
              "an entry without its token_id" },
            { "a greedy selected logprob that is not 0",
              choice("[9,5]", "[[9],[5]]", "[-0.5,0.0]", "", "\"stop\""),
              { 10, 0.0, MSV_MODE_SELECTED, 16, 4, -1, 1, 1 },
              "greedy mask row 0: logprob -0.5" },
            { "a greedy support logprob that is not 0",
              choice("[9,5]", "[[9],[5]]", "[[-5e-05],[0.0]]", "",
                     "\"stop\""),
              { 10, 0.0, MSV_MODE_SUPPORT, 16, 4, -1, 1, 1 },
              "greedy mask row 0: logprob" },
            { "a greedy choice with logprob 0",
              choice("[9,5]", "[[9],[5]]", "[[0.0],[-0.0]]", "",
                     "\"stop\""),
              { 10, 0.0, MSV_MODE_SUPPORT, 16, 4, -1, 1, 1 }, NULL },
        };

        for (k = 0; k < sizeof(wc) / sizeof(wc[0]); k++) {
            rc = check_expect(wc[k].doc, &wc[k].e, why, sizeof(why));
            if (wc[k].want == NULL) {
                tap_ok(rc == 0, "%s passes%s%s", wc[k].name,
                       rc ? ": " : "", rc ? why : "");
            } else {
                tap_ok(rc != 0 && strstr(why, wc[k].want) != NULL,
                       "%s is caught (\"%s\")", wc[k].name, why);
            }
            free(wc[k].doc);
        }
    }

    /* whole responses, streams split anywhere */
    {
#define EV1  "{\"choices\":[{\"index\":0,\"token_ids\":[9],"             \
             "\"sampling_mask\":[[3,9]],\"sampling_mask_logprobs\":[-0.5],"  \
             "\"finish_reason\":null}]}"
#define EV2  "{\"choices\":[{\"index\":0,\"token_ids\":[5],"             \
             "\"sampling_mask\":[[5]],\"sampling_mask_logprobs\":[0],"       \
             "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":3," \
             "\"completion_tokens\":2}}"

        static const struct {
            const char  *name;
            const char  *body;
            int          stream;
            const char  *want;      /* NULL: valid */
        } rc_[] = {
            { "a stream", "data: " EV1 "\n\ndata: " EV2 "\n\ndata: [DONE]\n\n",
              1, NULL },
            { "a stream with CRLF lines and a comment",
              ": hi\r\n\r\ndata: " EV1 "\r\n\r\ndata: " EV2
              "\r\n\r\ndata: [DONE]\r\n\r\n", 1, NULL },
            { "a body", "{\"choices\":[{\"index\":0,\"token_ids\":[9,5],"
              "\"sampling_mask\":[[3,9],[5]],\"sampling_mask_logprobs\":"
              "[-0.5,0],\"finish_reason\":\"length\"}],\"usage\":"
              "{\"prompt_tokens\":3,\"completion_tokens\":2}}", 0, NULL },
            { "a stream without [DONE]",
              "data: " EV1 "\n\ndata: " EV2 "\n\n", 1,
              "did not end with data: [DONE]" },
            { "a stream ending inside an event",
              "data: " EV1 "\n\ndata: " EV2 "\n\ndata: [DONE]", 1,
              "ended inside an event" },
            { "an event after the last",
              "data: " EV2 "\n\ndata: " EV1 "\n\ndata: [DONE]\n\n", 1,
              "an event after the one with the finish_reason" },
            { "an event after [DONE]",
              "data: " EV1 "\n\ndata: " EV2 "\n\ndata: [DONE]\n\ndata: "
              EV1 "\n\n", 1, "an event after data: [DONE]" },
            { "a stream short of max_tokens with ignore_eos",
              "data: " EV2 "\n\ndata: [DONE]\n\n", 1,
              "usage.completion_tokens 2, tokens received 1" },
        };
        size_t  steps[] = { 0, 1, 7 }, si;
        char    how[48];

        for (k = 0; k < sizeof(rc_) / sizeof(rc_[0]); k++) {
            for (si = 0; si < sizeof(steps) / sizeof(steps[0]); si++) {
                rc = check_resp(rc_[k].body, rc_[k].stream, steps[si], why,
                                sizeof(why));
                if (steps[si] == 0) {
                    snprintf(how, sizeof(how), "in one read");
                } else {
                    snprintf(how, sizeof(how), "%zu bytes a read", steps[si]);
                }
                if (rc_[k].want == NULL) {
                    tap_ok(rc == 0, "%s, %s, passes%s%s", rc_[k].name, how,
                           rc ? ": " : "", rc ? why : "");
                } else {
                    tap_ok(rc != 0 && strstr(why, rc_[k].want) != NULL,
                           "%s, %s, is caught (\"%s\")", rc_[k].name, how,
                           why);
                }
            }
        }
#undef EV1
#undef EV2
    }

    /* several choices (sampling_params.n): whole bodies and streams */
    {
#define CH(i, tok, row, lp, fin)                                             \
        "{\"index\":" #i ",\"token_ids\":[" tok "],\"sampling_mask\":["      \
        row "],\"sampling_mask_logprobs\":[" lp "],\"finish_reason\":" fin "}"
#define USAGE(n)  ",\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":"    \
                  #n "}"
#define BODY(chs, n)  "{\"choices\":[" chs "]" USAGE(n) "}"
#define A0   CH(0, "9,5", "[3,9],[5]", "-0.5,0", "\"length\"")
#define A1   CH(1, "3,5", "[3,9],[5,7]", "-0.5,-0.1", "\"length\"")
#define A2   CH(2, "12,7", "[12],[5,7]", "0,-0.2", "\"length\"")
#define E(chs, u)  "data: {\"choices\":[" chs "]" u "}\n\n"

        /* whole documents, as check.c sees them: n = 3 */
        static const struct {
            const char  *name;
            const char  *doc;
            const char  *want;      /* NULL: valid */
        } nd[] = {
            { "three choices", BODY(A0 "," A1 "," A2, 6), NULL },
            { "three choices, a missing index",
              BODY(A0 "," A2, 4), "2 choices, expected 3" },
            { "three choices, a duplicate index",
              BODY(A0 "," A1 "," A1, 6), "choice index 1 twice" },
            { "three choices, an index out of range",
              BODY(A0 "," A1 "," CH(3, "12,7", "[12],[5,7]", "0,-0.2",
                                    "\"length\""), 6),
              "choices[2].index is not in 0..2" },
            { "three choices, one without its index",
              "{\"choices\":[" A0 "," A1 ",{\"token_ids\":[12,7],"
              "\"sampling_mask\":[[12],[5,7]],\"sampling_mask_logprobs\":"
              "[0,-0.2],\"finish_reason\":\"length\"}]" USAGE(6) "}",
              "choices[2] has no index" },
            { "three choices out of order",
              BODY(A1 "," A0 "," A2, 6), "choices[0].index is 1" },
            { "three choices, a sampled token outside its row in one",
              BODY(A0 "," CH(1, "3,5", "[3,9],[7]", "-0.5,-0.1",
                             "\"length\"") "," A2, 6),
              "choice 1: sampled token 5 is not in its mask row" },
            { "three choices, a row out of order in one",
              BODY(A0 "," A1 "," CH(2, "12,7", "[12],[7,5]", "0,-0.2",
                                    "\"length\""), 6),
              "row ids not ascending and unique" },
            { "four choices for n 3",
              BODY(A0 "," A1 "," A2 "," A2, 8), "more than 3 choices" },
        };
        msv_expect_t  e3 = { 10, 1.0, MSV_MODE_SELECTED, 16, 2, -1, 1, 3 };

        for (k = 0; k < sizeof(nd) / sizeof(nd[0]); k++) {
            rc = check_expect(nd[k].doc, &e3, why, sizeof(why));
            if (nd[k].want == NULL) {
                tap_ok(rc == 0, "%s passes%s%s", nd[k].name, rc ? ": " : "",
                       rc ? why : "");
            } else {
                tap_ok(rc != 0 && strstr(why, nd[k].want) != NULL,
                       "%s is caught (\"%s\")", nd[k].name, why);
            }
        }

        /* whole responses of n = 2, streams split anywhere; events carry
         * some of the choices, each with its index */
#define S0a  CH(0, "9", "[3,9]", "-0.5", "null")
#define S0b  CH(0, "5", "[5]", "0", "\"length\"")
#define S1a  CH(1, "3", "[3,9]", "-0.5", "null")
#define S1b  CH(1, "5", "[5,7]", "-0.1", "\"length\"")
        static const struct {
            const char  *name;
            const char  *body;
            int          stream;
            const char  *want;      /* NULL: valid */
        } nr[] = {
            { "a body of two choices", BODY(A0 "," A1, 4), 0, NULL },
            { "a stream of two choices",
              E(S0a "," S1a, "") E(S1b, "") E(S0b, USAGE(4))
              "data: [DONE]\n\n", 1, NULL },
            { "a stream of two choices, one event each",
              E(S1a, "") E(S0a, "") E(S0b, "") E(S1b, USAGE(4))
              "data: [DONE]\n\n", 1, NULL },
            { "a body of two choices, usage of one",
              BODY(A0 "," A1, 2), 0,
              "usage.completion_tokens 2, tokens received 4" },
            { "a choice after its finish_reason",
              E(S0a "," S1a, "") E(S0b, "") E(S0b "," S1b, USAGE(4))
              "data: [DONE]\n\n", 1,
              "choice 0 in an event after the one with its finish_reason" },
            { "usage before the last choice ended",
              E(S0a "," S1a, "") E(S0b, USAGE(4)) E(S1b, USAGE(4))
              "data: [DONE]\n\n", 1, "usage before the last event" },
            { "a stream where one choice never ends",
              E(S0a "," S1a, "") E(S0b, "") "data: [DONE]\n\n", 1,
              "data: [DONE] before an event with a finish_reason" },
            { "a choice short of max_tokens with ignore_eos",
              E(S0a "," S1b, "") E(S0b, USAGE(3)) "data: [DONE]\n\n", 1,
              "choice 1: 1 tokens with ignore_eos" },
            { "an event of two choices with the same index",
              E(S0a "," S0a, "") E(S0b "," S1b, USAGE(3))
              "data: [DONE]\n\n", 1, "choice index 0 twice" },
            { "an event without choices",
              E(S0a "," S1a, "") "data: {\"choices\":[]}\n\n"
              E(S0b "," S1b, USAGE(4)) "data: [DONE]\n\n", 1,
              "an event without choices" },
        };
        size_t    steps[] = { 0, 1, 7 }, si;
        uint64_t  h_body = 0, h;

        for (k = 0; k < sizeof(nr) / sizeof(nr[0]); k++) {
            for (si = 0; si < sizeof(steps) / sizeof(steps[0]); si++) {
                rc = check_resp_n(nr[k].body, nr[k].stream, 2, steps[si],
                                  &h, why, sizeof(why));
                if (nr[k].want == NULL) {
                    tap_ok(rc == 0, "%s, %zu bytes a read (0: all), "
                           "passes%s%s", nr[k].name, steps[si],
                           rc ? ": " : "", rc ? why : "");
                    /* the same tokens, however split into events */
                    if (k == 0 && si == 0) {
                        h_body = h;
                    } else {
                        tap_ok(rc == 0 && h == h_body, "%s, %zu bytes a "
                               "read: the hash of the body", nr[k].name,
                               steps[si]);
                    }
                } else {
                    tap_ok(rc != 0 && strstr(why, nr[k].want) != NULL,
                           "%s, %zu bytes a read (0: all), is caught "
                           "(\"%s\")", nr[k].name, steps[si], why);
                }
            }
        }

        /* another token in one choice: another hash */
        rc = check_resp_n(BODY(A0 "," CH(1, "9,5", "[3,9],[5,7]",
                                         "-0.5,-0.1", "\"length\""), 4),
                          0, 2, 0, &h, why, sizeof(why));
        tap_ok(rc == 0 && h != h_body, "another token of one choice changes "
               "the hash%s%s", rc ? ": " : "", rc ? why : "");
        /* the same choices under other indices: another hash */
        rc = check_resp_n(BODY(CH(0, "3,5", "[3,9],[5,7]", "-0.5,-0.1",
                                  "\"length\"") ","
                               CH(1, "9,5", "[3,9],[5]", "-0.5,0",
                                  "\"length\""), 4),
                          0, 2, 0, &h, why, sizeof(why));
        tap_ok(rc == 0 && h != h_body, "the choices swapped change the "
               "hash%s%s", rc ? ": " : "", rc ? why : "");

        /* a body of 700 KB (whitespace between its tokens): the parser
         * gets it in pieces of growing size (resp.c), whatever the reads;
         * the same hash, and a broken end still caught */
        {
            static const char  *small = BODY(A0 "," A1, 4);
            static const size_t  big_steps[] = { 1, 7, 4096, 0 };
            size_t   pad = 350000, len = strlen(small), half, bi;
            char    *big;

            big = malloc(len + 2 * pad + 2);
            half = strcspn(small, ",");        /* after the first key */
            memcpy(big, small, 1);
            memset(big + 1, ' ', pad);
            memcpy(big + 1 + pad, small + 1, half - 1);
            memset(big + pad + half, '\n', pad);
            memcpy(big + 2 * pad + half, small + half, len - half + 1);
            for (bi = 0; bi < sizeof(big_steps) / sizeof(big_steps[0]);
                 bi++)
            {
                rc = check_resp_n(big, 0, 2, big_steps[bi], &h, why,
                                  sizeof(why));
                tap_ok(rc == 0 && h == h_body, "a body of %zu bytes, %zu "
                       "bytes a read (0: all): passes, the same hash%s%s",
                       strlen(big), big_steps[bi], rc ? ": " : "",
                       rc ? why : "");
            }
            big[strlen(big) - 1] = ',';
            rc = check_resp_n(big, 0, 2, 4096, &h, why, sizeof(why));
            tap_ok(rc != 0 && strstr(why, "invalid JSON") != NULL,
                   "a body of %zu bytes broken at its end is caught "
                   "(\"%s\")", strlen(big), why);
            free(big);
        }
#undef CH
#undef USAGE
#undef BODY
#undef A0
#undef A1
#undef A2
#undef E
#undef S0a
#undef S0b
#undef S1a
#undef S1b
    }

    return tap_done();
}
