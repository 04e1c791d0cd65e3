/*
 * e2e_check.c: the response checker of the load client (bench/e2e/
 * check.c) as a program, so that the end-to-end tests (t/lib/MsvTest.pm)
 * check responses with the same code: one process checks a whole batch.
 *
 *   e2e_check [--vocab N] [--choice] [FILE]
 *
 * Input (FILE, or stdin): pairs of lines, a request (the JSON body of
 * POST /inference/v1/generate) and what it got, one JSON value a line:
 *   - an object: the non-streaming response body (with sampling_params.n,
 *     its n choices, each checked, index 0..n-1 once each) or, with
 *     --choice, one element of its "choices" checked as the only one (the
 *     tests merge a stream's events into one choice);
 *   - a string: the body of a stream (text/event-stream), JSON-encoded
 *     to fit on the line.
 * Each is checked against what its request asked (the mask mode and
 * format, top_k, temperature, max_tokens, ignore_eos, logprobs, the
 * prompt's length) and, with --vocab, the vocabulary: a body or a stream
 * as the load client checks it (resp.c: every document, then the whole:
 * [DONE], usage, finish_reason), a choice as a whole.  Output: one line
 * per pair, a JSON array of the problems found, [] when there are none.
 * The exit status is 1 when a pair has a problem, 2 on a usage or read
 * error.
 */

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>
#include <yajl/yajl_tree.h>

#include "array.h"
#include "check.h"
#include "resp.h"


/* what the request asked, beyond what each document is checked against */
typedef struct {
    msv_expect_t  e;
    long          prompt_len;       /* token_ids given; -1: a text prompt */
    int           ignore_eos;
} msv_ask_t;


/* What the request asked, as check.c wants it. */

static int
msv_ask_of(const char *req, long vocab, msv_ask_t *a, char *why,
    size_t whylen)
{
    msv_expect_t  *e = &a->e;
    char         err[128];
    const char  *p_mask[] = { "return_sampling_mask", NULL };
    const char  *p_mode[] = { "sampling_logprobs_mode", NULL };
    const char  *p_fmt[] = { "mask_format", NULL };
    const char  *p_k[] = { "sampling_params", "top_k", NULL };
    const char  *p_t[] = { "sampling_params", "temperature", NULL };
    const char  *p_max[] = { "sampling_params", "max_tokens", NULL };
    const char  *p_lp[] = { "sampling_params", "logprobs", NULL };
    const char  *p_eos[] = { "sampling_params", "ignore_eos", NULL };
    const char  *p_n[] = { "sampling_params", "n", NULL };
    const char  *p_ids[] = { "token_ids", NULL };
    const char  *s;
    yajl_val     root, v;
    int          packed;

    root = yajl_tree_parse(req, err, sizeof(err));
    if (root == NULL || !YAJL_IS_OBJECT(root)) {
        snprintf(why, whylen, "the request is not a JSON object");
        yajl_tree_free(root);
        return -1;
    }

    e->variant = MSV_MODE_OFF;
    if (YAJL_IS_TRUE(yajl_tree_get(root, p_mask, yajl_t_true))) {
        s = YAJL_GET_STRING(yajl_tree_get(root, p_fmt, yajl_t_string));
        packed = s != NULL && strcmp(s, "packed") == 0;
        s = YAJL_GET_STRING(yajl_tree_get(root, p_mode, yajl_t_string));
        if (s != NULL && strcmp(s, "support") == 0) {
            e->variant = packed ? MSV_MODE_SUPPORT_PACKED : MSV_MODE_SUPPORT;
        } else {
            e->variant = packed ? MSV_MODE_SELECTED_PACKED
                                : MSV_MODE_SELECTED;
        }
    }

    /* absent: the server's defaults (no top_k, temperature 1) */
    v = yajl_tree_get(root, p_k, yajl_t_number);
    e->top_k = v ? (long) YAJL_GET_DOUBLE(v) : -1;
    v = yajl_tree_get(root, p_t, yajl_t_number);
    e->temperature = v ? YAJL_GET_DOUBLE(v) : 1.0;
    v = yajl_tree_get(root, p_max, yajl_t_number);
    e->max_tokens = v ? (long) YAJL_GET_DOUBLE(v) : -1;
    v = yajl_tree_get(root, p_lp, yajl_t_number);
    e->logprobs = v ? (long) YAJL_GET_DOUBLE(v) : -1;
    v = yajl_tree_get(root, p_n, yajl_t_number);
    e->n = v ? (long) YAJL_GET_DOUBLE(v) : 1;
    e->vocab = vocab;
    e->whole = 1;
    a->ignore_eos = YAJL_IS_TRUE(yajl_tree_get(root, p_eos, yajl_t_true));
    v = yajl_tree_get(root, p_ids, yajl_t_array);
    a->prompt_len = v ? (long) YAJL_GET_ARRAY(v)->len : -1;

    yajl_tree_free(root);
    return 0;
}


/* Parse the response (or the choice) and check it; 0 or -1 with why. */

static int
msv_check_one(msv_doc_t *d, const char *resp, size_t n, int choice,
    const msv_expect_t *e, char *why, size_t whylen)
{
    yajl_handle     h;
    yajl_status     st;
    unsigned char  *msg;
    int             rc = 0;

    msv_doc_reset(d, e);
    h = yajl_alloc(&msv_doc_callbacks, NULL, d);
    if (h == NULL) {
        fprintf(stderr, "e2e_check: yajl_alloc failed\n");
        exit(2);
    }

    st = yajl_status_ok;
    if (choice) {
        st = yajl_parse(h, (const unsigned char *) "{\"choices\":[", 12);
    }
    if (st == yajl_status_ok) {
        st = yajl_parse(h, (const unsigned char *) resp, n);
    }
    if (st == yajl_status_ok && choice) {
        st = yajl_parse(h, (const unsigned char *) "]}", 2);
    }
    if (st == yajl_status_ok) {
        st = yajl_complete_parse(h);
    }

    if (st == yajl_status_client_canceled) {
        snprintf(why, whylen, "%s", d->bad);
        rc = -1;
    } else if (st != yajl_status_ok) {
        msg = yajl_get_error(h, 0, NULL, 0);
        snprintf(why, whylen, "invalid JSON: %s",
                 msg ? (char *) msg : "(no message)");
        if (msg) {
            yajl_free_error(h, msg);
        }
        rc = -1;
    } else if (!d->top_done) {
        snprintf(why, whylen, "empty JSON document");
        rc = -1;
    } else if (msv_doc_check(d) != 0) {
        snprintf(why, whylen, "%s", d->bad);
        rc = -1;
    }

    yajl_free(h);
    return rc;
}


/*
 * A response body (stream: the SSE text), checked as the load client
 * checks one: every document as it comes, then the whole.  0, or -1
 * with why.
 */

static int
msv_check_body(msv_resp_t *r, const msv_ask_t *a, const char *body, size_t n,
    int stream, char *why, size_t whylen)
{
    r->e = a->e;
    r->e.whole = !stream;
    r->stream = stream;
    r->prompt_len = a->prompt_len;
    r->max_tokens = a->e.max_tokens;
    r->ignore_eos = a->ignore_eos;
    r->abort_ok = 1;
    r->clock = NULL;
    msv_resp_reset(r);

    if (msv_resp_data(r, body, n) == 0 && msv_resp_end(r) == 0) {
        msv_resp_check(r);
    }
    msv_resp_stop(r);
    snprintf(why, whylen, "%s", r->bad);
    return r->bad[0] ? -1 : 0;
}


/* The text of a line holding one JSON string; NULL if it is not one. */

static char *
msv_line_string(const char *line, size_t n, size_t *len)
{
    char      *w, err[128], *s;
    yajl_val   root, v;

    w = malloc(n + 3);
    if (w == NULL) {
        return NULL;
    }
    w[0] = '[';
    memcpy(w + 1, line, n);
    w[n + 1] = ']';
    w[n + 2] = '\0';
    root = yajl_tree_parse(w, err, sizeof(err));
    free(w);

    s = NULL;
    if (YAJL_IS_ARRAY(root) && YAJL_GET_ARRAY(root)->len == 1) {
        v = YAJL_GET_ARRAY(root)->values[0];
        if (YAJL_IS_STRING(v)) {
            s = strdup(v->u.string);
            *len = strlen(s);
        }
    }
    yajl_tree_free(root);
    return s;
}


/* One line of output: the problems as a JSON array of strings. */

static void
msv_print_problems(const char *why)
{
    const unsigned char  *p;

    if (why == NULL) {
        fputs("[]\n", stdout);
        return;
    }
    fputs("[\"", stdout);
    for (p = (const unsigned char *) why; *p; p++) {
        if (*p == '"' || *p == '\\') {
            printf("\\%c", *p);
        } else if (*p < 0x20) {
            printf("\\u%04x", *p);
        } else {
            putchar(*p);
        }
    }
    fputs("\"]\n", stdout);
}


static void
msv_usage(FILE *f)
{
    fprintf(f, "usage: e2e_check [--vocab N] [--choice] [FILE]\n"
               "  pairs of lines in: a request, its response (--choice: "
               "one of its choices)\n"
               "  one line out per pair: a JSON array of its problems\n");
}


int
main(int argc, char **argv)
{
    static const struct option  longopts[] = {
        { "vocab",  required_argument, NULL, 'v' },
        { "choice", no_argument,       NULL, 'c' },
        { "help",   no_argument,       NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };

    char          *req = NULL, *resp = NULL, *end;
    char           why[MSV_CHECK_ERR_MAX];
    size_t         req_cap = 0, resp_cap = 0;
    ssize_t        n;
    long           vocab = 0;
    int            opt, choice = 0, bad = 0, rc;
    FILE          *in = stdin;
    msv_doc_t      d;
    msv_ask_t      a;
    msv_resp_t     r;
    char          *sse;
    size_t         sse_n, i;

    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case 'v':
            vocab = strtol(optarg, &end, 10);
            if (*optarg == '\0' || *end != '\0' || vocab < 0) {
                fprintf(stderr, "e2e_check: --vocab: not a count: %s\n",
                        optarg);
                return 2;
            }
            break;
        case 'c':
            choice = 1;
            break;
        case 'h':
            msv_usage(stdout);
            return 0;
        default:
            msv_usage(stderr);
            return 2;
        }
    }
    if (optind + 1 < argc) {
        msv_usage(stderr);
        return 2;
    }
    if (optind < argc) {
        in = fopen(argv[optind], "r");
        if (in == NULL) {
            fprintf(stderr, "e2e_check: %s: %m\n", argv[optind]);
            return 2;
        }
    }

    memset(&d, 0, sizeof(d));
    memset(&r, 0, sizeof(r));

    while (getline(&req, &req_cap, in) >= 0) {
        n = getline(&resp, &resp_cap, in);
        if (n < 0) {
            fprintf(stderr, "e2e_check: %s: a request without its "
                    "response\n", optind < argc ? argv[optind] : "stdin");
            return 2;
        }
        while (n > 0 && (resp[n - 1] == '\n' || resp[n - 1] == '\r')) {
            n--;
        }

        for (i = 0; i < (size_t) n && (resp[i] == ' ' || resp[i] == '\t');
             i++)
        {
            /* the first character says a body or a stream */
        }

        if (msv_ask_of(req, vocab, &a, why, sizeof(why)) != 0) {
            rc = -1;
        } else if (i < (size_t) n && resp[i] == '"') {
            sse = msv_line_string(resp, (size_t) n, &sse_n);
            if (sse == NULL) {
                snprintf(why, sizeof(why), "the stream is not one JSON "
                         "string");
                rc = -1;
            } else {
                rc = msv_check_body(&r, &a, sse, sse_n, 1, why, sizeof(why));
                free(sse);
            }
        } else if (choice) {
            a.e.n = 1;              /* one of the choices, alone */
            rc = msv_check_one(&d, resp, (size_t) n, 1, &a.e, why,
                               sizeof(why));
        } else {
            rc = msv_check_body(&r, &a, resp, (size_t) n, 0, why,
                                sizeof(why));
        }

        if (rc != 0) {
            msv_print_problems(why);
            bad = 1;
        } else {
            msv_print_problems(NULL);
        }
    }
    if (ferror(in)) {
        fprintf(stderr, "e2e_check: read error\n");
        return 2;
    }

    msv_doc_free(&d);
    msv_resp_free(&r);
    free(req);
    free(resp);
    if (in != stdin) {
        fclose(in);
    }
    return bad;
}
