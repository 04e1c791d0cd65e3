/*
 * test_e2e_check.c: the response checker of bench/e2e_load
 * (bench/e2e/check.c), on documents made here: valid JSON and packed
 * masks pass, and each kind of broken mask, JSON or packed, is caught
 * with a message saying what is wrong.  t/50-client.t runs the load
 * client itself against a live stack.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "tap.h"
#include "msv_b64.h"
#include "check.h"


/* Parse one document and check it; returns the checker's verdict. */

static int
check(const char *json, long top_k, double temperature, int variant,
    char *why, size_t whylen)
{
    int           rc;
    msv_doc_t     d;
    yajl_handle   h;
    yajl_status   st;

    memset(&d, 0, sizeof(d));
    msv_doc_reset(&d);
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
        rc = msv_doc_check(&d, top_k, temperature, variant);
        snprintf(why, whylen, "%s", d.bad);
    }

    msv_doc_free(&d);
    return rc;
}


static char *
b64(const void *p, size_t n)
{
    char       *s, *e;
    msv_b64_t   st;

    s = malloc(msv_b64_len(n) + 1);
    msv_b64_init(&st);
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

    return tap_done();
}
