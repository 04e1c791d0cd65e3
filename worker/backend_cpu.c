/*
 * backend_cpu.c: the CPU reference backend.  Plain fp32 math, written to
 * be obviously right rather than fast: it is the oracle the CUDA backend
 * is checked against.  Weights are converted to fp32 once at create; the
 * KV cache is paged (MSV_KV_BLOCK tokens a page; the batch brings each
 * sequence's page table, see kv.h); matmuls and attention are split over a small thread pool.
 *
 * One layer, for the T new tokens of a batch (x is [T][hidden]):
 *
 *   h = rmsnorm(x) * input_layernorm
 *   q, k, v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv)
 *   q, k = rmsnorm per head * q_norm, k_norm         (Qwen3 only)
 *   q, k = rope(q, pos), rope(k, pos)                (rotate_half)
 *   KV[seq][pos] = k, v
 *   a = softmax(q K^T / sqrt(head_dim)) V over positions <= pos (GQA)
 *   x = x + a Wo^T
 *   h = rmsnorm(x) * post_attention_layernorm
 *   x = x + (silu(h Wg^T) * (h Wu^T)) Wd^T
 *
 * then logits = (rmsnorm(x) * norm) lm_head^T for the rows asked for.
 */

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"


#define MSV_CPU_MAX_THREADS  64
#define MSV_CPU_TOK_BLOCK    32     /* tokens per matmul tile */
#define MSV_CPU_MM_INLINE    65536  /* multiply-adds below which a matmul
                                       is not worth waking the pool */


typedef void (*msv_pool_fn)(void *arg, int part, int nparts);

struct msv_pool {
    pthread_mutex_t   mu;
    pthread_cond_t    go;
    pthread_cond_t    done;
    pthread_t        *th;
    int               n;         /* helper threads (the caller is one more) */
    int               busy;      /* helpers still in the current job */
    int               stop;
    uint64_t          gen;       /* bumped for every job */
    msv_pool_fn       fn;
    void             *arg;
};

struct msv_pool_helper {
    struct msv_pool  *pool;
    int               part;
};

struct msv_cpu_layer {
    float  *in_norm;             /* [hidden] */
    float  *wq, *wk, *wv;        /* [q_dim|kv_dim][hidden] */
    float  *bq, *bk, *bv;        /* Qwen2, else NULL */
    float  *q_norm, *k_norm;     /* [head_dim], Qwen3, else NULL */
    float  *wo;                  /* [hidden][q_dim] */
    float  *post_norm;           /* [hidden] */
    float  *wg, *wu;             /* [intermediate][hidden] */
    float  *wd;                  /* [hidden][intermediate] */
};

struct msv_backend {
    struct msv_model_config   cfg;
    uint32_t                  q_dim, kv_dim;

    float                    *embed;       /* [vocab][hidden] */
    float                    *final_norm;  /* [hidden] */
    float                    *lm_head;     /* [vocab][hidden], may = embed */
    struct msv_cpu_layer     *layers;
    float                    *inv_freq;    /* [head_dim / 2] */

    /* paged KV: page ids are the allocator's (kv.h), the memory ours */
    uint32_t                  max_seqs, max_len, pages_per_seq, n_pages;
    float                   **kc, **vc;    /* per layer [n_pages][BLOCK]
                                              [kv_dim] */
    size_t                    kv_layer_bytes;
    const uint32_t *const    *bpages;      /* the running batch's tables */
    uint32_t                 *stamp;       /* [max_seqs] batch dedup */
    uint32_t                  stamp_gen;

    /* scratch, grown to the largest batch seen */
    size_t                    cap;         /* tokens */
    float                    *x, *h, *q, *k, *v, *a, *g, *u, *cs;
    uint32_t                 *tseq, *tpos;
    float                    *scores;      /* [nth][max_len] */

    int                       nth;
    struct msv_pool           pool;
    struct msv_pool_helper   *helpers;
};

struct msv_mm_job {
    float        *out;           /* [T][N] */
    const float  *in;            /* [T][K] */
    const float  *w;             /* [N][K] */
    const float  *bias;          /* [N] or NULL */
    size_t        T, N, K;
};

struct msv_attn_job {
    struct msv_backend  *b;
    uint32_t             layer;
    size_t               T;
};


static int msv_cpu_stage_weights(struct msv_backend *b,
    const struct msv_weights *w, void **staged, char *err, size_t errlen);
static void msv_cpu_commit_weights(struct msv_backend *b, void *staged);
static void msv_cpu_drop_weights(struct msv_backend *b, void *staged);
static void msv_cpu_free_weights(struct msv_backend *b);
static struct msv_backend *msv_cpu_create(const struct msv_model_config *cfg,
    const struct msv_weights *w, uint32_t max_seqs, uint32_t max_len,
    uint64_t kv_tokens, int threads, char *err, size_t errlen);
static uint32_t msv_cpu_kv_pages(struct msv_backend *b,
    uint32_t *page_tokens);
static int msv_cpu_forward(struct msv_backend *b,
    const struct msv_batch *batch, float *logits, char *err, size_t errlen);
static void msv_cpu_destroy(struct msv_backend *b);

static float *msv_cpu_kv_map(size_t bytes, char *err, size_t errlen);
static int msv_cpu_weights(struct msv_backend *b,
    const struct msv_weights *w, char *err, size_t errlen);
static float *msv_cpu_tensor(const struct msv_weights *w, const char *name,
    char *err, size_t errlen);
static void msv_cpu_rope_init(struct msv_backend *b);
static int msv_cpu_scratch(struct msv_backend *b, size_t T);
static void msv_cpu_layer(struct msv_backend *b, uint32_t l, size_t T);
static void msv_cpu_rmsnorm(float *out, const float *x, const float *w,
    size_t n, float eps);
static void msv_cpu_rope(float *v, const float *cs, uint32_t hd);
static void msv_cpu_matmul(struct msv_backend *b, float *out,
    const float *in, const float *w, const float *bias, size_t T, size_t N,
    size_t K);
static void msv_mm_part(void *arg, int part, int nparts);
static void msv_attn_part(void *arg, int part, int nparts);
static float msv_dot(const float *a, const float *b, size_t n);

static int msv_pool_start(struct msv_pool *p, int n,
    struct msv_pool_helper *helpers);
static void msv_pool_run(struct msv_pool *p, msv_pool_fn fn, void *arg);
static void msv_pool_stop(struct msv_pool *p);
static void *msv_pool_main(void *arg);


const struct msv_backend_ops  msv_backend_cpu = {
    "cpu",
    msv_cpu_create,
    msv_cpu_kv_pages,
    msv_cpu_forward,
    msv_cpu_destroy,
    NULL,                       /* host_alloc: malloc */
    NULL,                       /* host_free */
    NULL,                       /* sample_init: the CPU sampler */
    NULL,
    NULL,
    NULL,
    msv_cpu_stage_weights,
    msv_cpu_commit_weights,
    msv_cpu_drop_weights,
    NULL                        /* sample_ms: no device sampler */
};


static struct msv_backend *
msv_cpu_create(const struct msv_model_config *cfg,
    const struct msv_weights *w, uint32_t max_seqs, uint32_t max_len,
    uint64_t kv_tokens, int threads, char *err, size_t errlen)
{
    long                 ncpu;
    uint32_t             l;
    uint64_t             pages;
    struct msv_backend  *b;

    if (max_seqs == 0 || max_len == 0) {
        snprintf(err, errlen, "cpu backend: max_seqs and max_len must be "
                 "positive");
        return NULL;
    }

    if (cfg->n_heads == 0 || cfg->n_kv_heads == 0 || cfg->head_dim == 0
        || cfg->head_dim % 2 != 0 || cfg->n_heads % cfg->n_kv_heads != 0
        || cfg->hidden == 0 || cfg->vocab_size == 0)
    {
        snprintf(err, errlen, "cpu backend: inconsistent model config "
                 "(heads %u, kv heads %u, head_dim %u)", cfg->n_heads,
                 cfg->n_kv_heads, cfg->head_dim);
        return NULL;
    }

    if (msv_weights_check(cfg, w, err, errlen) != 0) {
        return NULL;
    }

    b = calloc(1, sizeof(struct msv_backend));
    if (b == NULL) {
        snprintf(err, errlen, "cpu backend: out of memory");
        return NULL;
    }

    b->cfg = *cfg;
    b->q_dim = cfg->n_heads * cfg->head_dim;
    b->kv_dim = cfg->n_kv_heads * cfg->head_dim;
    b->max_seqs = max_seqs;
    b->max_len = max_len;
    b->pages_per_seq = (max_len + MSV_KV_BLOCK - 1) / MSV_KV_BLOCK;

    if (threads <= 0) {
        ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        threads = ncpu < 1 ? 1 : (int) ncpu;
    }
    b->nth = threads > MSV_CPU_MAX_THREADS ? MSV_CPU_MAX_THREADS : threads;

    if (msv_cpu_weights(b, w, err, errlen) != 0) {
        goto failed;
    }

    msv_cpu_rope_init(b);
    if (b->inv_freq == NULL) {
        goto nomem;
    }

    /* KV pages */

    pages = kv_tokens == 0
            ? (uint64_t) max_seqs * b->pages_per_seq
            : (kv_tokens + MSV_KV_BLOCK - 1) / MSV_KV_BLOCK;

    if (pages == 0 || pages > UINT32_MAX / MSV_KV_BLOCK) {
        snprintf(err, errlen, "cpu backend: kv_tokens %llu out of range",
                 (unsigned long long) kv_tokens);
        goto failed;
    }
    b->n_pages = (uint32_t) pages;

    b->kv_layer_bytes = (size_t) b->n_pages * MSV_KV_BLOCK * b->kv_dim
                        * sizeof(float);
    b->kc = calloc(cfg->n_layers, sizeof(float *));
    b->vc = calloc(cfg->n_layers, sizeof(float *));
    if (b->kc == NULL || b->vc == NULL) {
        goto nomem;
    }

    /* anonymous mappings: pages of memory are only committed when a KV
     * page is first written */
    for (l = 0; l < cfg->n_layers; l++) {
        b->kc[l] = msv_cpu_kv_map(b->kv_layer_bytes, err, errlen);
        if (b->kc[l] == NULL) {
            goto failed;
        }

        b->vc[l] = msv_cpu_kv_map(b->kv_layer_bytes, err, errlen);
        if (b->vc[l] == NULL) {
            goto failed;
        }
    }

    b->stamp = calloc(max_seqs, sizeof(uint32_t));
    b->scores = malloc((size_t) b->nth * max_len * sizeof(float));
    if (b->stamp == NULL || b->scores == NULL) {
        goto nomem;
    }

    b->helpers = calloc((size_t) b->nth, sizeof(struct msv_pool_helper));
    if (b->helpers == NULL) {
        goto nomem;
    }

    if (msv_pool_start(&b->pool, b->nth - 1, b->helpers) != 0) {
        snprintf(err, errlen, "cpu backend: cannot start %d threads",
                 b->nth - 1);
        goto failed;
    }

    return b;

nomem:

    snprintf(err, errlen, "cpu backend: out of memory");

failed:

    msv_cpu_destroy(b);
    return NULL;
}


/* One layer's K or V cache: an anonymous mapping of bytes, or NULL with
 * err set. */

static float *
msv_cpu_kv_map(size_t bytes, char *err, size_t errlen)
{
    void  *m;

    m = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        snprintf(err, errlen, "cpu backend: KV cache: mmap of %zu "
                 "bytes: %s", bytes, strerror(errno));
        return NULL;
    }

    return m;
}


static int
msv_cpu_weights(struct msv_backend *b, const struct msv_weights *w,
    char *err, size_t errlen)
{
    char                   name[128];
    uint32_t               l;
    struct msv_cpu_layer  *ly;

    b->layers = calloc(b->cfg.n_layers, sizeof(struct msv_cpu_layer));
    if (b->layers == NULL) {
        snprintf(err, errlen, "cpu backend: out of memory");
        return -1;
    }

#define MSV_GET(dst, ...)                                                    \
    do {                                                                     \
        snprintf(name, sizeof(name), __VA_ARGS__);                           \
        (dst) = msv_cpu_tensor(w, name, err, errlen);                        \
        if ((dst) == NULL) {                                                 \
            return -1;                                                       \
        }                                                                    \
    } while (0)

    MSV_GET(b->embed, "model.embed_tokens.weight");
    MSV_GET(b->final_norm, "model.norm.weight");

    if (b->cfg.tie_embeddings) {
        b->lm_head = b->embed;
    } else {
        MSV_GET(b->lm_head, "lm_head.weight");
    }

    for (l = 0; l < b->cfg.n_layers; l++) {
        ly = &b->layers[l];

        MSV_GET(ly->in_norm, "model.layers.%u.input_layernorm.weight", l);
        MSV_GET(ly->wq, "model.layers.%u.self_attn.q_proj.weight", l);
        MSV_GET(ly->wk, "model.layers.%u.self_attn.k_proj.weight", l);
        MSV_GET(ly->wv, "model.layers.%u.self_attn.v_proj.weight", l);
        MSV_GET(ly->wo, "model.layers.%u.self_attn.o_proj.weight", l);

        if (b->cfg.qkv_bias) {
            MSV_GET(ly->bq, "model.layers.%u.self_attn.q_proj.bias", l);
            MSV_GET(ly->bk, "model.layers.%u.self_attn.k_proj.bias", l);
            MSV_GET(ly->bv, "model.layers.%u.self_attn.v_proj.bias", l);
        }

        if (b->cfg.qk_norm) {
            MSV_GET(ly->q_norm, "model.layers.%u.self_attn.q_norm.weight", l);
            MSV_GET(ly->k_norm, "model.layers.%u.self_attn.k_norm.weight", l);
        }

        MSV_GET(ly->post_norm,
                "model.layers.%u.post_attention_layernorm.weight", l);
        MSV_GET(ly->wg, "model.layers.%u.mlp.gate_proj.weight", l);
        MSV_GET(ly->wu, "model.layers.%u.mlp.up_proj.weight", l);
        MSV_GET(ly->wd, "model.layers.%u.mlp.down_proj.weight", l);
    }

#undef MSV_GET

    return 0;
}


static float *
msv_cpu_tensor(const struct msv_weights *w, const char *name, char *err,
    size_t errlen)
{
    size_t                    n, el;
    float                    *f;
    const struct msv_tensor  *t;

    t = msv_weights_find(w, name);
    if (t == NULL) {
        snprintf(err, errlen, "%s: tensor %s: missing", w->source, name);
        return NULL;
    }

    el = t->dtype == MSV_F32 ? 4 : 2;
    n = t->bytes / el;

    f = malloc(n ? n * sizeof(float) : sizeof(float));
    if (f == NULL) {
        snprintf(err, errlen, "cpu backend: tensor %s: out of memory", name);
        return NULL;
    }

    msv_tensor_to_f32(t, 0, n, f);
    return f;
}


/*
 * inv_freq[i] = 1 / theta^(2i / head_dim), then the scaling:
 *   linear:  divided by factor;
 *   llama3:  wavelengths above orig / low_freq_factor divided by factor,
 *            below orig / high_freq_factor kept, and in between a blend
 *            weighted by (orig / wavelen - low) / (high - low).
 * Computed in double and rounded once to float.
 */

static void
msv_cpu_rope_init(struct msv_backend *b)
{
    double                          f, wl, lo_wl, hi_wl, s, fac;
    uint32_t                        i, half;
    const struct msv_model_config  *c = &b->cfg;

    half = c->head_dim / 2;
    b->inv_freq = malloc(half * sizeof(float));
    if (b->inv_freq == NULL) {
        return;
    }

    for (i = 0; i < half; i++) {
        f = 1.0 / pow((double) c->rope_theta,
                      (double) (float) (2.0f * (float) i
                                        / (float) c->head_dim));
        fac = c->rope_factor > 0 ? c->rope_factor : 1.0;

        if (c->rope_type == MSV_ROPE_LINEAR) {
            f /= fac;

        } else if (c->rope_type == MSV_ROPE_LLAMA3) {
            lo_wl = c->rope_orig_max_pos / (double) c->rope_low_freq_factor;
            hi_wl = c->rope_orig_max_pos / (double) c->rope_high_freq_factor;
            wl = 2.0 * M_PI / f;

            if (wl > lo_wl) {
                f /= fac;

            } else if (wl >= hi_wl) {
                s = (c->rope_orig_max_pos / wl - c->rope_low_freq_factor)
                    / (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1.0 - s) * f / fac + s * f;
            }
        }

        b->inv_freq[i] = (float) f;
    }
}


static uint32_t
msv_cpu_kv_pages(struct msv_backend *b, uint32_t *page_tokens)
{
    *page_tokens = MSV_KV_BLOCK;
    return b->n_pages;
}


static int
msv_cpu_forward(struct msv_backend *b, const struct msv_batch *batch,
    float *logits, char *err, size_t errlen)
{
    size_t       T, t, r, rows;
    uint32_t     s, i, id, pos, half, hd, H, V;
    const float  *inv;

    H = b->cfg.hidden;
    V = b->cfg.vocab_size;
    hd = b->cfg.head_dim;

    if (batch == NULL || batch->n_seqs == 0 || batch->seq == NULL
        || batch->n_new == NULL || batch->pos0 == NULL
        || batch->tokens == NULL || batch->pages == NULL
        || batch->n_pages == NULL || logits == NULL)
    {
        snprintf(err, errlen, "cpu forward: empty or incomplete batch");
        return -1;
    }

    /* validate everything before touching the KV cache */

    if (++b->stamp_gen == 0) {
        memset(b->stamp, 0, b->max_seqs * sizeof(uint32_t));
        b->stamp_gen = 1;
    }

    T = 0;
    for (s = 0; s < batch->n_seqs; s++) {
        id = batch->seq[s];

        if (id >= b->max_seqs) {
            snprintf(err, errlen, "cpu forward: batch entry %u: sequence "
                     "%u is not below max_seqs %u", s, id, b->max_seqs);
            return -1;
        }

        if (b->stamp[id] == b->stamp_gen) {
            snprintf(err, errlen, "cpu forward: batch entry %u: sequence "
                     "%u appears twice", s, id);
            return -1;
        }
        b->stamp[id] = b->stamp_gen;

        if (batch->n_new[s] == 0) {
            snprintf(err, errlen, "cpu forward: batch entry %u: sequence "
                     "%u has no new tokens", s, id);
            return -1;
        }

        if ((uint64_t) batch->pos0[s] + batch->n_new[s]
            > (uint64_t) batch->n_pages[s] * MSV_KV_BLOCK)
        {
            snprintf(err, errlen, "cpu forward: sequence %u: positions up "
                     "to %llu but KV reserved for %llu tokens", id,
                     (unsigned long long) batch->pos0[s] + batch->n_new[s],
                     (unsigned long long) batch->n_pages[s] * MSV_KV_BLOCK);
            return -1;
        }

        if (batch->n_pages[s] > 0 && batch->pages[s] == NULL) {
            snprintf(err, errlen, "cpu forward: sequence %u: no page "
                     "table", id);
            return -1;
        }

        for (i = 0; i < batch->n_pages[s]; i++) {
            if (batch->pages[s][i] >= b->n_pages) {
                snprintf(err, errlen, "cpu forward: sequence %u: page %u "
                         "is id %u, the pool has %u pages", id, i,
                         batch->pages[s][i], b->n_pages);
                return -1;
            }
        }

        if ((uint64_t) batch->pos0[s] + batch->n_new[s] > b->max_len) {
            snprintf(err, errlen, "cpu forward: sequence %u: positions up "
                     "to %llu exceed max_len %u", id,
                     (unsigned long long) batch->pos0[s] + batch->n_new[s],
                     b->max_len);
            return -1;
        }

        T += batch->n_new[s];
    }

    for (t = 0; t < T; t++) {
        if (batch->tokens[t] < 0 || (uint32_t) batch->tokens[t] >= V) {
            snprintf(err, errlen, "cpu forward: token %zu: id %d is not "
                     "below vocab_size %u", t, batch->tokens[t], V);
            return -1;
        }
    }

    if (msv_cpu_scratch(b, T) != 0) {
        snprintf(err, errlen, "cpu forward: out of memory for %zu tokens",
                 T);
        return -1;
    }

    /* per token: owner sequence, position, rope cos/sin, embedding */

    half = hd / 2;
    inv = b->inv_freq;
    t = 0;
    for (s = 0; s < batch->n_seqs; s++) {
        for (i = 0; i < batch->n_new[s]; i++, t++) {
            pos = batch->pos0[s] + i;
            b->tseq[t] = s;
            b->tpos[t] = pos;

            for (uint32_t j = 0; j < half; j++) {
                float  ang = (float) pos * inv[j];

                b->cs[t * hd + j] = cosf(ang);
                b->cs[t * hd + half + j] = sinf(ang);
            }

            memcpy(b->x + t * H, b->embed + (size_t) batch->tokens[t] * H,
                   H * sizeof(float));
        }
    }

    b->bpages = batch->pages;
    for (uint32_t l = 0; l < b->cfg.n_layers; l++) {
        msv_cpu_layer(b, l, T);
    }
    b->bpages = NULL;

    /* final norm of the rows asked for, then lm_head */

    rows = batch->all_logits ? T : batch->n_seqs;
    t = 0;
    for (s = 0, r = 0; s < batch->n_seqs; s++) {
        t += batch->n_new[s];
        if (batch->all_logits) {
            continue;
        }
        msv_cpu_rmsnorm(b->h + r * H, b->x + (t - 1) * H, b->final_norm, H,
                        b->cfg.rms_eps);
        r++;
    }

    if (batch->all_logits) {
        for (t = 0; t < T; t++) {
            msv_cpu_rmsnorm(b->h + t * H, b->x + t * H, b->final_norm, H,
                            b->cfg.rms_eps);
        }
    }

    msv_cpu_matmul(b, logits, b->h, b->lm_head, NULL, rows, V, H);

    return 0;
}


static void
msv_cpu_layer(struct msv_backend *b, uint32_t l, size_t T)
{
    float                  *dst, g;
    size_t                  t, j, H, I, qd, kvd, off;
    uint32_t                hd, nh, nkv, h, page;
    const uint32_t         *tab;
    struct msv_attn_job     aj;
    struct msv_cpu_layer   *ly;

    ly = &b->layers[l];
    H = b->cfg.hidden;
    I = b->cfg.intermediate;
    hd = b->cfg.head_dim;
    nh = b->cfg.n_heads;
    nkv = b->cfg.n_kv_heads;
    qd = b->q_dim;
    kvd = b->kv_dim;

    /* attention */

    for (t = 0; t < T; t++) {
        msv_cpu_rmsnorm(b->h + t * H, b->x + t * H, ly->in_norm, H,
                        b->cfg.rms_eps);
    }

    msv_cpu_matmul(b, b->q, b->h, ly->wq, ly->bq, T, qd, H);
    msv_cpu_matmul(b, b->k, b->h, ly->wk, ly->bk, T, kvd, H);
    msv_cpu_matmul(b, b->v, b->h, ly->wv, ly->bv, T, kvd, H);

    for (t = 0; t < T; t++) {
        for (h = 0; h < nh; h++) {
            float  *qv = b->q + t * qd + (size_t) h * hd;

            if (ly->q_norm != NULL) {
                msv_cpu_rmsnorm(qv, qv, ly->q_norm, hd, b->cfg.rms_eps);
            }
            msv_cpu_rope(qv, b->cs + t * hd, hd);
        }

        for (h = 0; h < nkv; h++) {
            float  *kv = b->k + t * kvd + (size_t) h * hd;

            if (ly->k_norm != NULL) {
                msv_cpu_rmsnorm(kv, kv, ly->k_norm, hd, b->cfg.rms_eps);
            }
            msv_cpu_rope(kv, b->cs + t * hd, hd);
        }

        /* into the sequence's page for this position */
        tab = b->bpages[b->tseq[t]];
        page = tab[b->tpos[t] / MSV_KV_BLOCK];
        off = ((size_t) page * MSV_KV_BLOCK + b->tpos[t] % MSV_KV_BLOCK)
              * kvd;
        memcpy(b->kc[l] + off, b->k + t * kvd, kvd * sizeof(float));
        memcpy(b->vc[l] + off, b->v + t * kvd, kvd * sizeof(float));
    }

    aj.b = b;
    aj.layer = l;
    aj.T = T;
    msv_pool_run(&b->pool, msv_attn_part, &aj);

    msv_cpu_matmul(b, b->h, b->a, ly->wo, NULL, T, H, qd);

    for (j = 0; j < T * H; j++) {
        b->x[j] += b->h[j];
    }

    /* MLP */

    for (t = 0; t < T; t++) {
        msv_cpu_rmsnorm(b->h + t * H, b->x + t * H, ly->post_norm, H,
                        b->cfg.rms_eps);
    }

    msv_cpu_matmul(b, b->g, b->h, ly->wg, NULL, T, I, H);
    msv_cpu_matmul(b, b->u, b->h, ly->wu, NULL, T, I, H);

    for (j = 0; j < T * I; j++) {
        g = b->g[j];
        b->g[j] = g / (1.0f + expf(-g)) * b->u[j];
    }

    dst = b->h;
    msv_cpu_matmul(b, dst, b->g, ly->wd, NULL, T, H, I);

    for (j = 0; j < T * H; j++) {
        b->x[j] += dst[j];
    }
}


/* Items (token, head) split over the parts; each part has its own row of
 * scores. */

static void
msv_attn_part(void *arg, int part, int nparts)
{
    float                *sc, *out, m, sum, scale, p;
    size_t                it, i0, i1, t, hd, qd, kvd, off;
    uint32_t              h, kvh, group, pos, j, page;
    const uint32_t       *tab;
    const float          *q, *kc, *vc;
    struct msv_attn_job  *aj = arg;
    struct msv_backend   *b = aj->b;

    hd = b->cfg.head_dim;
    qd = b->q_dim;
    kvd = b->kv_dim;
    group = b->cfg.n_heads / b->cfg.n_kv_heads;
    kc = b->kc[aj->layer];
    vc = b->vc[aj->layer];
    sc = b->scores + (size_t) part * b->max_len;
    scale = 1.0f / sqrtf((float) hd);

    i0 = aj->T * b->cfg.n_heads * (size_t) part / (size_t) nparts;
    i1 = aj->T * b->cfg.n_heads * (size_t) (part + 1) / (size_t) nparts;

    for (it = i0; it < i1; it++) {
        t = it / b->cfg.n_heads;
        h = (uint32_t) (it % b->cfg.n_heads);
        kvh = h / group;
        pos = b->tpos[t];
        tab = b->bpages[b->tseq[t]];
        q = b->q + t * qd + (size_t) h * hd;
        out = b->a + t * qd + (size_t) h * hd;

        m = -INFINITY;
        for (j = 0; j <= pos; j++) {
            page = tab[j / MSV_KV_BLOCK];
            off = ((size_t) page * MSV_KV_BLOCK + j % MSV_KV_BLOCK) * kvd
                  + (size_t) kvh * hd;
            sc[j] = msv_dot(q, kc + off, hd) * scale;
            if (sc[j] > m) {
                m = sc[j];
            }
        }

        sum = 0.0f;
        for (j = 0; j <= pos; j++) {
            sc[j] = expf(sc[j] - m);
            sum += sc[j];
        }

        memset(out, 0, hd * sizeof(float));
        for (j = 0; j <= pos; j++) {
            page = tab[j / MSV_KV_BLOCK];
            off = ((size_t) page * MSV_KV_BLOCK + j % MSV_KV_BLOCK) * kvd
                  + (size_t) kvh * hd;
            p = sc[j] / sum;
            for (size_t d = 0; d < hd; d++) {
                out[d] += p * vc[off + d];
            }
        }
    }
}


static void
msv_cpu_rmsnorm(float *out, const float *x, const float *w, size_t n,
    float eps)
{
    float   r;
    double  ss;
    size_t  i;

    ss = 0.0;
    for (i = 0; i < n; i++) {
        ss += (double) x[i] * x[i];
    }

    r = (float) (1.0 / sqrt(ss / (double) n + (double) eps));

    for (i = 0; i < n; i++) {
        out[i] = w[i] * (x[i] * r);
    }
}


/* HF rotate_half: the two halves of the head are the pairs. */

static void
msv_cpu_rope(float *v, const float *cs, uint32_t hd)
{
    float     a, b, c, s;
    uint32_t  i, half;

    half = hd / 2;
    for (i = 0; i < half; i++) {
        a = v[i];
        b = v[i + half];
        c = cs[i];
        s = cs[half + i];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}


static void
msv_cpu_matmul(struct msv_backend *b, float *out, const float *in,
    const float *w, const float *bias, size_t T, size_t N, size_t K)
{
    struct msv_mm_job  j;

    j.out = out;
    j.in = in;
    j.w = w;
    j.bias = bias;
    j.T = T;
    j.N = N;
    j.K = K;

    if (T * N * K < MSV_CPU_MM_INLINE) {
        msv_mm_part(&j, 0, 1);
        return;
    }

    msv_pool_run(&b->pool, msv_mm_part, &j);
}


/* out[t][n] = in[t] . w[n] (+ bias[n]) for the part's share of n; every
 * dot product is done by one thread in one order, so results do not
 * depend on the number of threads. */

static void
msv_mm_part(void *arg, int part, int nparts)
{
    float               *o;
    size_t               n, n0, n1, t, t0, t1;
    const float         *wr;
    struct msv_mm_job   *j = arg;

    n0 = j->N * (size_t) part / (size_t) nparts;
    n1 = j->N * (size_t) (part + 1) / (size_t) nparts;

    for (t0 = 0; t0 < j->T; t0 += MSV_CPU_TOK_BLOCK) {
        t1 = t0 + MSV_CPU_TOK_BLOCK < j->T ? t0 + MSV_CPU_TOK_BLOCK : j->T;

        for (n = n0; n < n1; n++) {
            wr = j->w + n * j->K;
            for (t = t0; t < t1; t++) {
                o = j->out + t * j->N + n;
                *o = msv_dot(j->in + t * j->K, wr, j->K);
                if (j->bias != NULL) {
                    *o += j->bias[n];
                }
            }
        }
    }
}


static float
msv_dot(const float *a, const float *b, size_t n)
{
    float   s[8] = { 0 }, r;
    size_t  i, k;

    for (i = 0; i + 8 <= n; i += 8) {
        for (k = 0; k < 8; k++) {
            s[k] += a[i + k] * b[i + k];
        }
    }

    r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));

    for (; i < n; i++) {
        r += a[i] * b[i];
    }

    return r;
}


static int
msv_cpu_scratch(struct msv_backend *b, size_t T)
{
    size_t     cap, H, I, rows;
    float    **bufs[9];
    size_t     sizes[9];
    uint32_t **ids[2];

    if (T <= b->cap) {
        return 0;
    }

    cap = b->cap ? b->cap : 64;
    while (cap < T) {
        cap *= 2;
    }

    H = b->cfg.hidden;
    I = b->cfg.intermediate;
    rows = cap;

    bufs[0] = &b->x;  sizes[0] = rows * H;
    bufs[1] = &b->h;  sizes[1] = rows * (H > b->q_dim ? H : b->q_dim);
    bufs[2] = &b->q;  sizes[2] = rows * b->q_dim;
    bufs[3] = &b->k;  sizes[3] = rows * b->kv_dim;
    bufs[4] = &b->v;  sizes[4] = rows * b->kv_dim;
    bufs[5] = &b->a;  sizes[5] = rows * b->q_dim;
    bufs[6] = &b->g;  sizes[6] = rows * I;
    bufs[7] = &b->u;  sizes[7] = rows * I;
    bufs[8] = &b->cs; sizes[8] = rows * b->cfg.head_dim;

    for (int i = 0; i < 9; i++) {
        float  *p = realloc(*bufs[i], sizes[i] * sizeof(float));

        if (p == NULL) {
            return -1;
        }
        *bufs[i] = p;
    }

    /* each token's sequence and position, rows of them */
    ids[0] = &b->tseq;
    ids[1] = &b->tpos;

    for (int i = 0; i < 2; i++) {
        uint32_t  *p = realloc(*ids[i], rows * sizeof(uint32_t));

        if (p == NULL) {
            return -1;
        }
        *ids[i] = p;
    }

    b->cap = cap;
    return 0;
}


static void
msv_cpu_destroy(struct msv_backend *b)
{
    uint32_t  l;

    if (b == NULL) {
        return;
    }

    msv_pool_stop(&b->pool);
    free(b->helpers);

    msv_cpu_free_weights(b);
    free(b->inv_freq);

    for (l = 0; l < b->cfg.n_layers; l++) {
        if (b->kc != NULL && b->kc[l] != NULL) {
            munmap(b->kc[l], b->kv_layer_bytes);
        }
        if (b->vc != NULL && b->vc[l] != NULL) {
            munmap(b->vc[l], b->kv_layer_bytes);
        }
    }
    free(b->kc);
    free(b->vc);

    free(b->stamp);
    free(b->scores);

    free(b->x);
    free(b->h);
    free(b->q);
    free(b->k);
    free(b->v);
    free(b->a);
    free(b->g);
    free(b->u);
    free(b->cs);
    free(b->tseq);
    free(b->tpos);

    free(b);
}


/*
 * The pool: n helpers wait for the generation to change, run their part
 * of the job, and the last one to finish wakes the caller, which runs part
 * 0 itself.
 */

static int
msv_pool_start(struct msv_pool *p, int n, struct msv_pool_helper *helpers)
{
    int  i;

    memset(p, 0, sizeof(*p));

    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        return -1;
    }

    if (pthread_cond_init(&p->go, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        return -1;
    }

    if (pthread_cond_init(&p->done, NULL) != 0) {
        pthread_cond_destroy(&p->go);
        pthread_mutex_destroy(&p->mu);
        return -1;
    }

    p->th = calloc(n > 0 ? (size_t) n : 1, sizeof(pthread_t));
    if (p->th == NULL) {
        pthread_cond_destroy(&p->done);
        pthread_cond_destroy(&p->go);
        pthread_mutex_destroy(&p->mu);
        return -1;
    }

    /* mark as initialised for msv_pool_stop before threads exist */
    p->n = 0;
    p->stop = 0;

    for (i = 0; i < n; i++) {
        helpers[i + 1].pool = p;
        helpers[i + 1].part = i + 1;

        if (pthread_create(&p->th[i], NULL, msv_pool_main, &helpers[i + 1])
            != 0)
        {
            msv_pool_stop(p);
            return -1;
        }
        p->n++;
    }

    return 0;
}


static void
msv_pool_run(struct msv_pool *p, msv_pool_fn fn, void *arg)
{
    if (p->n == 0) {
        fn(arg, 0, 1);
        return;
    }

    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->busy = p->n;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);

    fn(arg, 0, p->n + 1);

    pthread_mutex_lock(&p->mu);
    while (p->busy > 0) {
        pthread_cond_wait(&p->done, &p->mu);
    }
    pthread_mutex_unlock(&p->mu);
}


static void *
msv_pool_main(void *arg)
{
    void                    *jarg;
    uint64_t                 seen;
    msv_pool_fn              fn;
    struct msv_pool_helper  *hp = arg;
    struct msv_pool         *p = hp->pool;

    /* jobs start at generation 1, so a helper that first runs after a
     * job was posted still sees it */
    seen = 0;
    pthread_mutex_lock(&p->mu);

    for ( ;; ) {
        while (p->gen == seen && !p->stop) {
            pthread_cond_wait(&p->go, &p->mu);
        }

        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }

        seen = p->gen;
        fn = p->fn;
        jarg = p->arg;
        pthread_mutex_unlock(&p->mu);

        fn(jarg, hp->part, p->n + 1);

        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0) {
            pthread_cond_signal(&p->done);
        }
    }
}


static void
msv_pool_stop(struct msv_pool *p)
{
    int  i;

    if (p->th == NULL) {
        return;
    }

    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);

    for (i = 0; i < p->n; i++) {
        pthread_join(p->th[i], NULL);
    }

    free(p->th);
    p->th = NULL;
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->go);
    pthread_mutex_destroy(&p->mu);
}


/* The weight arrays of b (what msv_cpu_weights made). */
static void
msv_cpu_free_weights(struct msv_backend *b)
{
    uint32_t  l;

    if (b->layers != NULL) {
        for (l = 0; l < b->cfg.n_layers; l++) {
            struct msv_cpu_layer  *ly = &b->layers[l];

            free(ly->in_norm);
            free(ly->wq);
            free(ly->wk);
            free(ly->wv);
            free(ly->bq);
            free(ly->bk);
            free(ly->bv);
            free(ly->q_norm);
            free(ly->k_norm);
            free(ly->wo);
            free(ly->post_norm);
            free(ly->wg);
            free(ly->wu);
            free(ly->wd);
        }
        free(b->layers);
    }

    if (b->lm_head != b->embed) {
        free(b->lm_head);
    }
    free(b->embed);
    free(b->final_norm);
    b->layers = NULL;
    b->embed = NULL;
    b->lm_head = NULL;
    b->final_norm = NULL;
}


/*
 * A weight update: the new arrays are built into a shadow backend that
 * holds only weights (the config is b's, read-only), so forward keeps
 * reading b's meanwhile; commit swaps the pointers.
 */
static int
msv_cpu_stage_weights(struct msv_backend *b, const struct msv_weights *w,
    void **staged, char *err, size_t errlen)
{
    struct msv_backend  *sh;

    /* every tensor with the shape the config gives, as at create */
    if (msv_weights_check(&b->cfg, w, err, errlen) != 0) {
        return -1;
    }

    sh = calloc(1, sizeof(struct msv_backend));
    if (sh == NULL) {
        snprintf(err, errlen, "cpu backend: out of memory");
        return -1;
    }

    sh->cfg = b->cfg;

    if (msv_cpu_weights(sh, w, err, errlen) != 0) {
        msv_cpu_free_weights(sh);
        free(sh);
        return -1;
    }

    *staged = sh;
    return 0;
}


static void
msv_cpu_commit_weights(struct msv_backend *b, void *staged)
{
    float                 *embed, *final_norm, *lm_head;
    struct msv_backend    *sh = staged;
    struct msv_cpu_layer  *layers;

    embed = b->embed;
    final_norm = b->final_norm;
    lm_head = b->lm_head;
    layers = b->layers;

    b->embed = sh->embed;
    b->final_norm = sh->final_norm;
    b->lm_head = sh->lm_head;
    b->layers = sh->layers;

    sh->embed = embed;
    sh->final_norm = final_norm;
    sh->lm_head = lm_head;
    sh->layers = layers;

    msv_cpu_drop_weights(b, sh);
}


static void
msv_cpu_drop_weights(struct msv_backend *b, void *staged)
{
    struct msv_backend  *sh = staged;

    (void) b;
    if (sh != NULL) {
        msv_cpu_free_weights(sh);
        free(sh);
    }
}
