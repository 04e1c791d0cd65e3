/*
 * maskserve-logits: a backend's logits (CPU by default) for a prompt and
 * the tokens that followed it, computed the way the worker computes them
 * (the prompt in prefill chunks, then one token per step), so that a
 * trainer-side replay of a mask can be checked against the behaviour
 * logprobs the server returned.
 *
 *   maskserve-logits (--model DIR | --dummy PRESET) [--seed N]
 *       [--backend cpu|cuda] [--max-num-batched-tokens N]
 *       [--batch-invariant] --prompt IDS --tokens IDS --out FILE
 *
 * IDS is a comma-separated list of token ids.  --seed is the worker's
 * (it makes the dummy weights).  FILE receives len(tokens) rows of vocab
 * float32 (little-endian, row-major): row t holds the logits the token
 * tokens[t] was sampled from.  --batch-invariant is the worker's flag:
 * with it on both sides the CUDA logits of a lone sequence are those the
 * worker computed for it in any batch, bit for bit.  One JSON line on standard output:
 *   {"rows":3,"vocab":4096,"file":"out.f32"}
 * Exit status 0, 1 on a model or backend failure, 2 on bad arguments.
 */

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "kv_direct.h"
#include "model.h"


static void
usage(void)
{
    fprintf(stderr,
"usage: maskserve-logits (--model DIR | --dummy PRESET) [--seed N]\n"
"           [--backend cpu|cuda] [--max-num-batched-tokens N]\n"
"           [--batch-invariant] --prompt IDS --tokens IDS --out FILE\n");
}


static int
parse_ids(const char *opt, const char *s, int32_t **ids, uint32_t *n)
{
    char       *end;
    long long   v;
    uint32_t    cap;

    *n = 0;
    cap = 16;
    *ids = malloc(cap * sizeof(int32_t));
    if (*ids == NULL) {
        return -1;
    }

    while (*s) {
        errno = 0;
        v = strtoll(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX
            || (*end != ',' && *end != '\0'))
        {
            fprintf(stderr, "maskserve-logits: %s: not a list of token ids "
                    "at \"%s\"\n", opt, s);
            return -1;
        }

        if (*n == cap) {
            cap *= 2;
            *ids = realloc(*ids, cap * sizeof(int32_t));
            if (*ids == NULL) {
                return -1;
            }
        }

        (*ids)[(*n)++] = (int32_t) v;
        s = *end ? end + 1 : end;
    }

    return 0;
}


int
main(int argc, char **argv)
{
    int                              c, rc;
    char                             err[512], *end;
    FILE                            *f;
    float                           *logits;
    int32_t                         *prompt, *toks, *all;
    uint32_t                         n_prompt, n_toks, n_all, i, take, done;
    uint32_t                         seq, n_new, pos0, max_batched;
    uint64_t                         seed;
    const char                      *model, *dummy, *out, *ps, *ts, *backend;
    struct msv_batch                 b;
    struct msv_weights               w;
    struct msv_backend              *be;
    struct msv_model_config          cfg;
    const struct msv_backend_ops    *ops;

    static struct option  opts[] = {
        { "model",                  required_argument, 0, 'm' },
        { "dummy",                  required_argument, 0, 'd' },
        { "seed",                   required_argument, 0, 's' },
        { "backend",                required_argument, 0, 'b' },
        { "max-num-batched-tokens", required_argument, 0, 'B' },
        { "batch-invariant",        no_argument,       0, 'I' },
        { "prompt",                 required_argument, 0, 'p' },
        { "tokens",                 required_argument, 0, 't' },
        { "out",                    required_argument, 0, 'o' },
        { "help",                   no_argument,       0, 'h' },
        { 0, 0, 0, 0 }
    };

    model = dummy = out = ps = ts = NULL;
    backend = "cpu";
    seed = 0;
    max_batched = 2048;

    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'd': dummy = optarg; break;
        case 'p': ps = optarg; break;
        case 't': ts = optarg; break;
        case 'o': out = optarg; break;
        case 'b': backend = optarg; break;
        case 'I':
            /* read by the CUDA backend at create, as for the worker */
            if (setenv("MSV_CUDA_INVARIANT", "1", 1) != 0) {
                fprintf(stderr, "maskserve-logits: --batch-invariant: %s\n",
                        strerror(errno));
                return 1;
            }
            break;
        case 's':
            errno = 0;
            seed = strtoull(optarg, &end, 10);
            if (errno || *end || end == optarg || optarg[0] == '-') {
                fprintf(stderr, "maskserve-logits: --seed: not an unsigned "
                        "integer: \"%s\"\n", optarg);
                return 2;
            }
            break;
        case 'B':
            errno = 0;
            max_batched = (uint32_t) strtoul(optarg, &end, 10);
            if (errno || *end || max_batched == 0) {
                fprintf(stderr, "maskserve-logits: --max-num-batched-tokens: "
                        "not a positive integer: \"%s\"\n", optarg);
                return 2;
            }
            break;
        case 'h':
            usage();
            return 0;
        default:
            usage();
            return 2;
        }
    }

    if ((model == NULL) == (dummy == NULL) || ps == NULL || ts == NULL
        || out == NULL || optind != argc)
    {
        usage();
        return 2;
    }

    if (parse_ids("--prompt", ps, &prompt, &n_prompt) != 0
        || parse_ids("--tokens", ts, &toks, &n_toks) != 0)
    {
        return 2;
    }

    if (n_prompt == 0 || n_toks == 0) {
        fprintf(stderr, "maskserve-logits: --prompt and --tokens need at "
                "least one id each\n");
        return 2;
    }

    memset(&w, 0, sizeof(w));

    if (model != NULL) {
        char  path[4096];

        snprintf(path, sizeof(path), "%s/config.json", model);
        rc = msv_config_load(path, &cfg, err, sizeof(err))
             || msv_weights_load(model, &w, err, sizeof(err));

    } else {
        rc = msv_config_preset(dummy, &cfg, err, sizeof(err))
             || msv_weights_dummy(&cfg, seed, &w, err, sizeof(err));
    }

    if (rc || msv_weights_check(&cfg, &w, err, sizeof(err)) != 0) {
        fprintf(stderr, "maskserve-logits: %s\n", err);
        return 1;
    }

    n_all = n_prompt + n_toks;

    for (i = 0; i < n_all; i++) {
        int32_t  id = i < n_prompt ? prompt[i] : toks[i - n_prompt];

        if ((uint32_t) id >= cfg.vocab_size) {
            fprintf(stderr, "maskserve-logits: token id %d is outside the "
                    "vocabulary (%u)\n", id, cfg.vocab_size);
            return 2;
        }
    }

    if (strcmp(backend, "cpu") == 0) {
        ops = &msv_backend_cpu;

    } else if (strcmp(backend, "cuda") == 0) {
        ops = msv_backend_cuda();
        if (ops == NULL || !msv_cuda_available()) {
            fprintf(stderr, "maskserve-logits: --backend cuda: %s\n",
                    ops == NULL ? "this build has no CUDA backend"
                                : "no usable GPU");
            return 1;
        }

    } else {
        fprintf(stderr, "maskserve-logits: --backend: \"%s\" is neither cpu "
                "nor cuda\n", backend);
        return 2;
    }

    be = msv_kvd_create(ops, &cfg, &w, 1, n_all, 0, 1, err, sizeof(err));
    if (be == NULL) {
        fprintf(stderr, "maskserve-logits: %s backend: %s\n", backend, err);
        return 1;
    }

    all = malloc(n_all * sizeof(int32_t));
    /* where the backend writes logits fastest (pinned, for the GPU) */
    logits = ops->host_alloc ? ops->host_alloc((size_t) cfg.vocab_size
                                               * sizeof(float))
                             : malloc((size_t) cfg.vocab_size * sizeof(float));
    if (all == NULL || logits == NULL) {
        fprintf(stderr, "maskserve-logits: out of memory\n");
        return 1;
    }

    memcpy(all, prompt, n_prompt * sizeof(int32_t));
    memcpy(all + n_prompt, toks, n_toks * sizeof(int32_t));

    f = fopen(out, "wb");
    if (f == NULL) {
        fprintf(stderr, "maskserve-logits: %s: %s\n", out, strerror(errno));
        return 1;
    }

    if (msv_kvd_reserve(be, 0, n_all) != 0) {
        fprintf(stderr, "maskserve-logits: no KV pages for %u tokens\n",
                n_all);
        return 1;
    }

    /*
     * As the scheduler runs a lone sequence: the prompt in chunks of at
     * most max_batched tokens (the last chunk's logits give token 0), then
     * each sampled token alone.  The last token is not fed: nothing was
     * sampled from its logits.
     */
    seq = 0;
    done = 0;

    while (done < n_all - 1) {
        take = done < n_prompt ? n_prompt - done : 1;
        if (take > max_batched) {
            take = max_batched;
        }

        n_new = take;
        pos0 = done;

        b.n_seqs = 1;
        b.seq = &seq;
        b.n_new = &n_new;
        b.pos0 = &pos0;
        b.tokens = all + done;
        b.all_logits = 0;

        if (msv_kvd_forward(ops, be, &b, logits, err, sizeof(err)) != 0) {
            fprintf(stderr, "maskserve-logits: forward: %s\n", err);
            return 1;
        }

        done += take;

        if (done >= n_prompt
            && fwrite(logits, sizeof(float), cfg.vocab_size, f)
               != cfg.vocab_size)
        {
            fprintf(stderr, "maskserve-logits: %s: %s\n", out,
                    strerror(errno));
            return 1;
        }
    }

    if (fclose(f) != 0) {
        fprintf(stderr, "maskserve-logits: %s: %s\n", out, strerror(errno));
        return 1;
    }

    printf("{\"rows\":%u,\"vocab\":%u,\"file\":\"%s\"}\n", n_toks,
           cfg.vocab_size, out);

    msv_kvd_release(be, 0);
    msv_kvd_destroy(ops, be);
    msv_weights_free(&w);
    free(prompt);
    free(toks);
    free(all);
    if (ops->host_free) {
        ops->host_free(logits);
    } else {
        free(logits);
    }

    return 0;
}
