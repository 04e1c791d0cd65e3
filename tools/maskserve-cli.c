/*
 * maskserve-cli: submit requests straight to a worker's region and print
 * every row as a JSON line.  Used by tests and for debugging, besides
 * nginx.
 *
 *   maskserve-cli --shm NAME [--requests FILE] [--timeout SEC] [--summary]
 *   maskserve-cli --shm NAME --stats
 *
 * FILE (default: standard input) holds one request per line, in the JSON
 * shape of POST /inference/v1/generate: request_id, token_ids,
 * sampling_params, return_sampling_mask, sampling_logprobs_mode.  All
 * requests are submitted at once as far as the worker has free slots;
 * the rest follow as slots free up.
 *
 * Output, one line per row:
 *   {"request_id":"a","slot":3,"step":17,"pos":0,"token":123,
 *    "finish":null,"logprob":-0.5,"ids":[...],"lps":[...],"top":[[id,lp]]}
 * and one line per finished request:
 *   {"request_id":"a","done":true,"seed":42,"completion_tokens":16,
 *    "finish":"length","abort_reason":null}
 * With --summary, rows are counted and checked (order, sampled token in
 * its support) instead of printed, and one line sums up the run:
 *   {"requests":64,"tokens":1024,"mask_ids":20480,"row_bytes":...,
 *    "seconds":1.5,"tokens_per_s":682.7}
 * Exit status: 0 when every request ended (whatever its finish reason),
 * 1 on a worker failure or timeout, 2 on bad input.
 */

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <yajl/yajl_tree.h>

#include "../shm/msv_link.h"
#include "../shm/msv_params.h"
#include "../shm/msv_region.h"
#include "../shm/msv_ring.h"
#include "../shm/msv_slots.h"

struct cli_req {
    char               id[MSV_REQ_ID_MAX + 1];
    struct msv_params  p;
    int32_t           *prompt;
    uint32_t           n_prompt;
    struct msv_bias   *bias;
    int                slot;          /* -1 until submitted */
    uint64_t           cookie;
    uint32_t           next_pos;
    int                done;
};

struct cli {
    struct msv_attachment  a;
    struct cli_req        *reqs;
    uint32_t               n_reqs;
    uint32_t               n_done;
    uint32_t               next_submit;
    struct cli_req       **by_slot;
    int                    failed;
    int                    summary;       /* count, check, don't print */
    uint64_t               tokens;
    uint64_t               mask_ids;
    uint64_t               row_bytes;
};

static const char *cli_finish[] = { "null", "\"stop\"", "\"length\"",
                                    "\"abort\"" };
static const char *cli_abort[] = { "null", "\"cancelled\"", "\"shutdown\"",
                                   "\"invalid\"", "\"no_kv\"",
                                   "\"internal\"", "\"paused\"" };


static int
cli_fail(const char *file, unsigned line, const char *msg)
{
    fprintf(stderr, "maskserve-cli: %s:%u: %s\n", file, line, msg);
    return -1;
}


/* A number's literal, as the parameter rules read it. */
static const char *
cli_lit(yajl_val v)
{
    return v != NULL && YAJL_IS_NUMBER(v) && v->u.number.r != NULL
           ? v->u.number.r : NULL;
}


/* One field of sampling_params, by the rules of shm/msv_params.h. */
static int
cli_param(struct cli_req *r, const struct msv_param_rule *rule, yajl_val e,
    char *err)
{
    size_t       j;
    const char  *lit;

    if (YAJL_IS_NULL(e)) {
        msv_param_set_null(&r->p, rule);
        return 0;
    }
    if (YAJL_IS_TRUE(e) || YAJL_IS_FALSE(e)) {
        return msv_param_set_bool(&r->p, rule, YAJL_IS_TRUE(e), err);
    }
    if ((lit = cli_lit(e)) != NULL) {
        return msv_param_set_number(&r->p, rule, lit, strlen(lit), err);
    }
    if (rule->kind == MSV_PK_STOP && YAJL_IS_ARRAY(e)) {
        for (j = 0; j < e->u.array.len; j++) {
            lit = cli_lit(e->u.array.values[j]);
            if (lit == NULL) {
                return msv_param_wrong_type(rule, "an array holding other "
                                            "than numbers", err);
            }
            if (msv_param_add_stop(&r->p, lit, strlen(lit), err) != 0) {
                return -1;
            }
        }
        return 0;
    }
    if (rule->kind == MSV_PK_BIAS && YAJL_IS_OBJECT(e)) {
        if (e->u.object.len > MSV_MAX_BIAS) {
            snprintf(err, MSV_PARAM_ERR_MAX, "%s has more than %d entries",
                     rule->param, MSV_MAX_BIAS);
            return -1;
        }
        for (j = 0; j < e->u.object.len; j++) {
            const char       *key = e->u.object.keys[j];
            struct msv_bias  *b = &r->bias[r->p.n_bias];

            lit = cli_lit(e->u.object.values[j]);
            if (msv_param_bias_id(key, strlen(key), &b->id, err) != 0) {
                return -1;
            }
            if (lit == NULL) {
                return msv_param_wrong_type(rule, "an object holding other "
                                            "than numbers", err);
            }
            if (msv_param_bias_value(lit, strlen(lit), &b->value, err) != 0) {
                return -1;
            }
            r->p.n_bias++;
        }
        return 0;
    }
    return msv_param_wrong_type(rule, YAJL_IS_STRING(e) ? "a string"
                                : YAJL_IS_ARRAY(e) ? "an array"
                                : "an object", err);
}


/* Parse one JSON request line into r. */
static int
cli_parse(struct msv_ctrl *c, const char *file, unsigned line, char *text,
    struct cli_req *r, unsigned seq)
{
    char                          ebuf[256], err[MSV_PARAM_ERR_MAX];
    size_t                        i;
    yajl_val                      root, v, sp;
    const char                   *mode, *lit;
    struct msv_limits             lim;
    const struct msv_param_rule  *rule;
    const char  *ids_path[] = { "token_ids", NULL };
    const char  *sp_path[] = { "sampling_params", NULL };
    const char  *id_path[] = { "request_id", NULL };
    const char  *mask_path[] = { "return_sampling_mask", NULL };
    const char  *mode_path[] = { "sampling_logprobs_mode", NULL };

    memset(r, 0, sizeof(*r));
    r->slot = -1;
    msv_params_init(&r->p);
    msv_limits_of(c, &lim);

    root = yajl_tree_parse(text, ebuf, sizeof(ebuf));
    if (root == NULL || !YAJL_IS_OBJECT(root)) {
        yajl_tree_free(root);
        return cli_fail(file, line, "not a JSON object");
    }

    v = yajl_tree_get(root, id_path, yajl_t_string);
    if (v != NULL) {
        snprintf(r->id, sizeof(r->id), "%s", YAJL_GET_STRING(v));
    } else {
        snprintf(r->id, sizeof(r->id), "cli-%u", seq);
    }

    v = yajl_tree_get(root, ids_path, yajl_t_array);
    if (v == NULL || v->u.array.len == 0
        || v->u.array.len >= c->max_model_len)
    {
        yajl_tree_free(root);
        return cli_fail(file, line, "token_ids: 1..max_model_len-1 ints");
    }
    r->n_prompt = (uint32_t) v->u.array.len;
    r->prompt = malloc(r->n_prompt * sizeof(int32_t));
    r->bias = calloc(MSV_MAX_BIAS, sizeof(struct msv_bias));
    if (r->prompt == NULL || r->bias == NULL) {
        yajl_tree_free(root);
        return cli_fail(file, line, "out of memory");
    }
    for (i = 0; i < r->n_prompt; i++) {
        lit = cli_lit(v->u.array.values[i]);
        if (lit == NULL) {
            yajl_tree_free(root);
            return cli_fail(file, line, "token_ids: an array of token ids");
        }
        if (msv_param_token(lit, strlen(lit), &r->prompt[i], err) != 0) {
            yajl_tree_free(root);
            return cli_fail(file, line, err);
        }
    }

    v = yajl_tree_get(root, mask_path, yajl_t_any);
    if (v != NULL && YAJL_IS_TRUE(v)) {
        r->p.mask_mode = MSV_MASK_SELECTED;
        v = yajl_tree_get(root, mode_path, yajl_t_string);
        mode = v != NULL ? YAJL_GET_STRING(v) : NULL;
        if (mode != NULL) {
            if (strcmp(mode, "support") == 0) {
                r->p.mask_mode = MSV_MASK_SUPPORT;
            } else if (strcmp(mode, "selected") != 0) {
                yajl_tree_free(root);
                return cli_fail(file, line, "sampling_logprobs_mode: "
                                "selected or support");
            }
        }
    }

    /* unknown keys are ignored, as the HTTP API ignores them */
    sp = yajl_tree_get(root, sp_path, yajl_t_object);
    for (i = 0; sp != NULL && i < sp->u.object.len; i++) {
        const char  *k = sp->u.object.keys[i];

        rule = msv_param_find(k, strlen(k));
        if (rule != NULL
            && cli_param(r, rule, sp->u.object.values[i], err) != 0)
        {
            yajl_tree_free(root);
            return cli_fail(file, line, err);
        }
    }

    yajl_tree_free(root);

    if (msv_prompt_check(r->prompt, r->n_prompt, &lim, err) != NULL
        || msv_params_check(&r->p, r->bias, &lim, err) != NULL)
    {
        return cli_fail(file, line, err);
    }
    if (r->p.n != 1) {
        /* a request here is one slot; several choices are nginx's */
        return cli_fail(file, line, "sampling_params.n: maskserve-cli runs "
                        "one choice per request (send n requests with "
                        "seeds s, s + 1, ...)");
    }
    msv_params_fit(&r->p, r->n_prompt, &lim);

    return 0;
}


static void
cli_submit_more(struct cli *k)
{
    int              i;
    struct cli_req  *r;
    int              kicked = 0;

    while (k->next_submit < k->n_reqs) {
        r = &k->reqs[k->next_submit];
        i = msv_slot_claim(k->a.rg.ctrl, k->a.reader, k->a.pid);
        if (i < 0) {
            break;
        }
        r->slot = i;
        r->cookie = msv_slot_submit(k->a.rg.ctrl, (uint32_t) i, r->id, &r->p,
                                    r->prompt, r->n_prompt, r->bias);
        k->by_slot[i] = r;
        k->next_submit++;
        kicked = 1;
    }
    if (kicked) {
        msv_kick(k->a.kick_fd);
    }
}


static void
cli_print_row(struct cli_req *r, uint64_t seq, const struct msv_row *w)
{
    uint32_t              i;
    const int32_t        *ids = msv_row_ids(w);
    const float          *lps = msv_row_lps(w);
    const struct msv_top *top = msv_row_top(w);

    printf("{\"request_id\":\"%s\",\"slot\":%u,\"step\":%llu,\"pos\":%u,"
           "\"token\":%d,\"finish\":%s,\"abort_reason\":%s,\"mode\":%u,"
           "\"logprob\":%.9g", r->id, w->slot, (unsigned long long) seq,
           w->pos, w->token, cli_finish[w->finish & 3],
           cli_abort[w->abort_reason <= 6 ? w->abort_reason : 5], w->mode,
           (double) w->logprob);

    if (w->n_support) {
        printf(",\"ids\":[");
        for (i = 0; i < w->n_support; i++) {
            printf(i ? ",%d" : "%d", ids[i]);
        }
        printf("],\"lps\":[");
        for (i = 0; i < w->n_lps; i++) {
            printf(i ? ",%.9g" : "%.9g", (double) lps[i]);
        }
        printf("]");
    }
    if (w->n_top) {
        printf(",\"top\":[");
        for (i = 0; i < w->n_top; i++) {
            printf(i ? ",[%d,%.9g]" : "[%d,%.9g]", top[i].id,
                   (double) top[i].lp);
        }
        printf("]");
    }
    printf("}\n");
}


/* The sampled token is in its ascending support row. */
static int
cli_in_support(const struct msv_row *w)
{
    uint32_t       lo = 0, hi = w->n_support, mid;
    const int32_t *ids = msv_row_ids(w);

    while (lo < hi) {
        mid = (lo + hi) / 2;
        if (ids[mid] < w->token) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo < w->n_support && ids[lo] == w->token;
}


static int
cli_on_row(void *ud, uint64_t seq, const struct msv_row *w)
{
    struct cli       *k = ud;
    struct cli_req   *r;
    struct msv_slot  *sl;

    if (w->slot >= k->a.rg.ctrl->n_slots) {
        return 0;
    }
    r = k->by_slot[w->slot];
    if (r == NULL || r->cookie != w->cookie) {
        return 0;                       /* another reader's request */
    }

    if (w->token >= 0 && w->pos != r->next_pos) {
        fprintf(stderr, "maskserve-cli: %s: row %u arrived, expected %u\n",
                r->id, w->pos, r->next_pos);
        k->failed = 1;
    }
    if (w->token >= 0) {
        r->next_pos = w->pos + 1;
    }

    if (k->summary) {
        k->tokens += w->token >= 0;
        k->mask_ids += w->n_support;
        k->row_bytes += w->bytes;
        if (w->n_support && !cli_in_support(w)) {
            fprintf(stderr, "maskserve-cli: %s: token %d not in its row %u\n",
                    r->id, w->token, w->pos);
            k->failed = 1;
        }
    } else {
        cli_print_row(r, seq, w);
    }

    if (w->finish != MSV_FINISH_NONE) {
        sl = msv_slot_at(k->a.rg.ctrl, w->slot);
        if (!k->summary) {
            printf("{\"request_id\":\"%s\",\"done\":true,\"seed\":%llu,"
                   "\"completion_tokens\":%u,\"finish\":%s,"
                   "\"abort_reason\":%s}\n", r->id,
                   (unsigned long long) sl->seed_used, r->next_pos,
                   cli_finish[w->finish & 3],
                   cli_abort[w->abort_reason <= 6 ? w->abort_reason : 5]);
        }
        msv_slot_release(k->a.rg.ctrl, w->slot, w->cookie);
        k->by_slot[w->slot] = NULL;
        r->done = 1;
        k->n_done++;
    }
    return 0;
}


static int
cli_stats(const char *name)
{
    char               err[256], eos[MSV_MAX_EOS * 12 + 1];
    uint32_t           census[6], i, readers = 0;
    struct msv_ctrl   *c;
    struct msv_region  rg;
    static const char *states[] = { "starting", "ready", "draining",
                                    "stopped" };

    if (msv_region_open(&rg, name, err, sizeof(err)) != 0) {
        fprintf(stderr, "maskserve-cli: %s\n", err);
        return 1;
    }
    c = rg.ctrl;
    msv_slot_census(c, census);
    eos[0] = '\0';
    for (i = 0; i < c->n_eos && i < MSV_MAX_EOS; i++) {
        snprintf(eos + strlen(eos), sizeof(eos) - strlen(eos), "%s%d",
                 i ? "," : "", c->eos_ids[i]);
    }
    for (i = 0; i < c->n_readers; i++) {
        readers += MSV_STATE_OF(atomic_load(&msv_reader_at(c, i)->state))
                   == MSV_READER_ATTACHED;
    }

    printf("{\"region\":\"%s\",\"generation\":%llu,\"pid\":%d,"
           "\"state\":\"%s\",\"alive\":%s,\"heartbeat_age_ms\":%llu,"
           "\"model\":\"%s\",\"backend\":\"%s\",\"vocab_size\":%u,"
           "\"max_model_len\":%u,\"eos_ids\":[%s],\"n_slots\":%u,"
           "\"readers\":%u,"
           "\"slots\":{\"free\":%u,\"claimed\":%u,\"submitted\":%u,"
           "\"running\":%u,\"finished\":%u,\"aborted\":%u},"
           "\"steps\":%llu,\"tokens\":%llu,\"requests_done\":%llu,"
           "\"ring_waits\":%llu,\"readers_evicted\":%llu,"
           "\"kv\":{\"tokens\":%llu,\"free\":%llu,\"cached\":%llu,"
           "\"evictions\":%llu,\"preemptions\":%llu,\"preempted\":%u},"
           "\"prefix\":{\"query_tokens\":%llu,\"hit_tokens\":%llu,"
           "\"prefill_tokens\":%llu},\"paused\":%u,"
           "\"weight_version\":\"%s\"}\n",
           c->name, (unsigned long long) c->generation, c->worker_pid,
           states[atomic_load(&c->state) & 3],
           msv_pid_alive(c->worker_pid) ? "true" : "false",
           (unsigned long long) ((msv_now_ns() - atomic_load(&c->heartbeat_ns))
                                 / 1000000),
           c->model, c->backend, c->vocab_size, c->max_model_len, eos,
           c->n_slots,
           readers, census[0], census[1], census[2], census[3], census[4],
           census[5], (unsigned long long) atomic_load(&c->steps),
           (unsigned long long) atomic_load(&c->tokens),
           (unsigned long long) atomic_load(&c->requests_done),
           (unsigned long long) atomic_load(&c->ring_waits),
           (unsigned long long) atomic_load(&c->readers_evicted),
           (unsigned long long) atomic_load(&c->kv_tokens_total),
           (unsigned long long) atomic_load(&c->kv_tokens_free),
           (unsigned long long) atomic_load(&c->kv_tokens_cached),
           (unsigned long long) atomic_load(&c->kv_evictions),
           (unsigned long long) atomic_load(&c->preemptions),
           atomic_load(&c->preempted),
           (unsigned long long) atomic_load(&c->prefix_query_tokens),
           (unsigned long long) atomic_load(&c->prefix_hit_tokens),
           (unsigned long long) atomic_load(&c->prefill_tokens),
           atomic_load(&c->paused), c->weight_version);

    msv_region_unmap(&rg);
    return 0;
}


int
main(int argc, char **argv)
{
    int                 c, idx, ep, stats;
    char                err[256], *line;
    FILE               *f;
    size_t              cap;
    ssize_t             len;
    unsigned            lineno;
    uint64_t            t0;
    double              timeout;
    struct cli          k;
    const char         *name, *file;
    struct epoll_event  ev, evs[4];

    static const struct option  longopts[] = {
        { "shm",      required_argument, 0, 's' },
        { "requests", required_argument, 0, 'r' },
        { "timeout",  required_argument, 0, 't' },
        { "stats",    no_argument,       0, 'S' },
        { "summary",  no_argument,       0, 'U' },
        { "help",     no_argument,       0, 'h' },
        { 0, 0, 0, 0 }
    };

    memset(&k, 0, sizeof(k));
    name = "maskserve-0";
    file = "-";
    timeout = 120;
    stats = 0;

    while ((c = getopt_long(argc, argv, "h", longopts, &idx)) != -1) {
        switch (c) {
        case 's': name = optarg; break;
        case 'r': file = optarg; break;
        case 't': timeout = atof(optarg); break;
        case 'S': stats = 1; break;
        case 'U': k.summary = 1; break;
        case 'h':
            printf("usage: maskserve-cli --shm NAME [--requests FILE] "
                   "[--timeout SEC] [--summary] | --shm NAME --stats\n");
            return 0;
        default:
            return 2;
        }
    }

    if (stats) {
        return cli_stats(name);
    }

    if (msv_attach(&k.a, name, err, sizeof(err)) != 0) {
        fprintf(stderr, "maskserve-cli: %s\n", err);
        return 1;
    }

    f = strcmp(file, "-") == 0 ? stdin : fopen(file, "r");
    if (f == NULL) {
        fprintf(stderr, "maskserve-cli: %s: %s\n", file, strerror(errno));
        return 2;
    }

    line = NULL;
    cap = 0;
    lineno = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (len <= 1) {
            continue;
        }
        k.reqs = realloc(k.reqs, (k.n_reqs + 1) * sizeof(struct cli_req));
        if (k.reqs == NULL
            || cli_parse(k.a.rg.ctrl, file, lineno, line, &k.reqs[k.n_reqs],
                         k.n_reqs) != 0)
        {
            return 2;
        }
        k.n_reqs++;
    }
    free(line);

    k.by_slot = calloc(k.a.rg.ctrl->n_slots, sizeof(struct cli_req *));
    ep = epoll_create1(EPOLL_CLOEXEC);
    ev.events = EPOLLIN;
    ev.data.u32 = 1;
    epoll_ctl(ep, EPOLL_CTL_ADD, k.a.wake_fd, &ev);
    ev.data.u32 = 2;
    ev.events = EPOLLIN | EPOLLRDHUP;
    epoll_ctl(ep, EPOLL_CTL_ADD, k.a.conn_fd, &ev);

    t0 = msv_now_ns();
    while (k.n_done < k.n_reqs) {
        cli_submit_more(&k);

        msv_reader_heartbeat(&k.a);
        if (msv_consume(&k.a.cons, cli_on_row, &k) < 0) {
            fprintf(stderr, "maskserve-cli: malformed ring record\n");
            return 1;
        }
        fflush(stdout);
        if (k.n_done == k.n_reqs) {
            break;
        }
        if (msv_attachment_check(&k.a) != 0) {
            fprintf(stderr, "maskserve-cli: worker %s lost: %s\n", name,
                    k.a.lost);
            return 1;
        }
        if ((double) (msv_now_ns() - t0) / 1e9 > timeout) {
            fprintf(stderr, "maskserve-cli: timeout: %u of %u requests done\n",
                    k.n_done, k.n_reqs);
            return 1;
        }
        if (msv_consumer_arm(&k.a.cons)) {
            continue;
        }
        if (epoll_wait(ep, evs, 4, 100) > 0) {
            msv_drain(k.a.wake_fd);
        }
    }

    if (k.summary) {
        double  sec = (double) (msv_now_ns() - t0) / 1e9;

        printf("{\"requests\":%u,\"tokens\":%llu,\"mask_ids\":%llu,"
               "\"row_bytes\":%llu,\"seconds\":%.3f,"
               "\"tokens_per_s\":%.1f}\n", k.n_reqs,
               (unsigned long long) k.tokens,
               (unsigned long long) k.mask_ids,
               (unsigned long long) k.row_bytes, sec,
               sec > 0 ? (double) k.tokens / sec : 0.0);
    }

    msv_detach(&k.a);
    return k.failed ? 1 : 0;
}
