/*
 * weights.c: the host tensor table: loading a checkpoint directory
 * (single file or sharded through model.safetensors.index.json), making
 * deterministic dummy weights, checking names and shapes against the
 * config, and converting elements to fp32.
 */

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "mix.h"
#include "model.h"
#include "safetensors.h"


#define MSV_DUMMY_CHUNK  (1u << 20)    /* elements per fill job */


struct msv_want {
    char     name[128];
    int      ndim;
    int64_t  shape[2];
    int      kind;       /* MSV_INIT_* for dummy weights */
    float    scale;
};

enum {
    MSV_INIT_ONES = 1,
    MSV_INIT_NORMAL = 2
};

struct msv_fill {
    struct msv_tensor  *t;
    const uint64_t     *keys;   /* per tensor */
    const float        *scale;  /* per tensor, 0: ones */
    int                 n_t;
    uint64_t           *jobs;   /* (tensor << 32 | chunk) */
    size_t              n_jobs;
    size_t              next;
    pthread_mutex_t     mu;
};


static int msv_wants(const struct msv_model_config *cfg,
    struct msv_want **out, int *n);
static int msv_weights_load_index(const char *dir, const char *index,
    struct msv_weights *w, char *err, size_t errlen);
static int msv_weights_unique(struct msv_weights *w, char *err,
    size_t errlen);
static void *msv_fill_thread(void *arg);
static void msv_fill_chunk(struct msv_fill *f, int ti, size_t chunk);
static uint64_t msv_fnv1a(const char *s);
static const char *msv_tensor_file(const struct msv_weights *w,
    const struct msv_tensor *t);


int
msv_weights_load(const char *dir, struct msv_weights *w, char *err,
    size_t errlen)
{
    int          rc;
    char         path[4096];
    size_t       len;
    struct stat  st;

    memset(w, 0, sizeof(*w));

    len = strlen(dir);
    if (len + sizeof("/model.safetensors.index.json") > sizeof(w->source)) {
        snprintf(err, errlen, "%.64s...: path too long", dir);
        return -1;
    }

    if (len > 12 && strcmp(dir + len - 12, ".safetensors") == 0
        && stat(dir, &st) == 0 && S_ISREG(st.st_mode))
    {
        strcpy(w->source, dir);
        rc = msv_st_load(dir, w, err, errlen);
        goto done;
    }

    if (stat(dir, &st) == -1) {
        snprintf(err, errlen, "%s: %s", dir, strerror(errno));
        return -1;
    }

    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s: not a directory or a .safetensors file",
                 dir);
        return -1;
    }

    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);

    if (stat(path, &st) == 0) {
        strcpy(w->source, path);
        rc = msv_weights_load_index(dir, path, w, err, errlen);
        goto done;
    }

    snprintf(path, sizeof(path), "%s/model.safetensors", dir);

    if (stat(path, &st) == -1) {
        snprintf(err, errlen, "%s: no model.safetensors or "
                 "model.safetensors.index.json", dir);
        return -1;
    }

    strcpy(w->source, path);
    rc = msv_st_load(path, w, err, errlen);

done:

    if (rc == 0) {
        rc = msv_weights_unique(w, err, errlen);
    }

    if (rc != 0) {
        msv_weights_free(w);
        return -1;
    }

    return 0;
}


static int
msv_weights_load_index(const char *dir, const char *index,
    struct msv_weights *w, char *err, size_t errlen)
{
    int          j, f;
    char         path[4096];
    size_t       i, k, n;
    yajl_val     root, map, v;
    const char  *shard, *name, *base;

    if (msv_json_file_parse(index, &root, err, errlen) != 0) {
        return -1;
    }

    map = NULL;
    for (i = 0; i < root->u.object.len; i++) {
        if (strcmp(root->u.object.keys[i], "weight_map") == 0) {
            map = root->u.object.values[i];
        }
    }

    if (!YAJL_IS_OBJECT(map) || map->u.object.len == 0) {
        snprintf(err, errlen, "%s: weight_map: missing or empty", index);
        goto failed;
    }

    n = map->u.object.len;

    for (i = 0; i < n; i++) {
        v = map->u.object.values[i];
        name = map->u.object.keys[i];

        if (!YAJL_IS_STRING(v) || v->u.string[0] == '\0'
            || strchr(v->u.string, '/') != NULL
            || strcmp(v->u.string, "..") == 0)
        {
            snprintf(err, errlen, "%s: weight_map: tensor %s: not a file "
                     "name in this directory", index, name);
            goto failed;
        }

        shard = v->u.string;

        /* load each shard once, in order of first mention */
        for (k = 0; k < i; k++) {
            if (strcmp(map->u.object.values[k]->u.string, shard) == 0) {
                break;
            }
        }

        if (k < i) {
            continue;
        }

        if (snprintf(path, sizeof(path), "%s/%s", dir, shard)
            >= (int) sizeof(path))
        {
            snprintf(err, errlen, "%s: weight_map: %s: path too long", index,
                     shard);
            goto failed;
        }

        if (msv_st_load(path, w, err, errlen) != 0) {
            goto failed;
        }
        msv_info("mapped %s (%d tensors so far)", path, w->n);
    }

    /* every tensor the index names is in the shard it names */

    for (i = 0; i < n; i++) {
        name = map->u.object.keys[i];
        shard = map->u.object.values[i]->u.string;

        for (j = 0; j < w->n; j++) {
            if (strcmp(w->t[j].name, name) == 0) {
                break;
            }
        }

        if (j == w->n) {
            snprintf(err, errlen, "%s: weight_map: tensor %s: not found in "
                     "%s", index, name, shard);
            goto failed;
        }

        f = w->t[j].file;
        base = strrchr(w->files[f], '/');
        base = base ? base + 1 : w->files[f];

        if (strcmp(base, shard) != 0) {
            snprintf(err, errlen, "%s: weight_map: tensor %s: found in %s, "
                     "not in %s", index, name, base, shard);
            goto failed;
        }
    }

    yajl_tree_free(root);
    return 0;

failed:

    yajl_tree_free(root);
    return -1;
}


/* A name twice (two shards, or twice in one header) is a broken
 * checkpoint. */

static int
msv_weights_unique(struct msv_weights *w, char *err, size_t errlen)
{
    for (int i = 0; i < w->n; i++) {
        for (int j = i + 1; j < w->n; j++) {
            if (strcmp(w->t[i].name, w->t[j].name) == 0) {
                snprintf(err, errlen, "%s: tensor %s: also in %s",
                         msv_tensor_file(w, &w->t[j]), w->t[i].name,
                         msv_tensor_file(w, &w->t[i]));
                return -1;
            }
        }
    }

    return 0;
}


int
msv_weights_dummy(const struct msv_model_config *cfg, uint64_t seed,
    struct msv_weights *w, char *err, size_t errlen)
{
    int                i, n, dtype, nth, rc;
    long               ncpu;
    size_t             total, off, el, numel, j;
    uint8_t           *base;
    uint64_t          *keys;
    float             *scale;
    pthread_t          th[64];
    struct msv_want   *want;
    struct msv_fill    f;

    memset(w, 0, sizeof(*w));

    if (msv_wants(cfg, &want, &n) != 0) {
        snprintf(err, errlen, "dummy weights: out of memory");
        return -1;
    }

    dtype = msv_config_dummy_dtype(cfg);
    el = dtype == MSV_F32 ? 4 : 2;

    w->t = calloc((size_t) n, sizeof(struct msv_tensor));
    keys = calloc((size_t) n, sizeof(uint64_t));
    scale = calloc((size_t) n, sizeof(float));
    w->maps = calloc(1, sizeof(void *));
    w->map_bytes = calloc(1, sizeof(size_t));

    if (w->t == NULL || keys == NULL || scale == NULL || w->maps == NULL
        || w->map_bytes == NULL)
    {
        snprintf(err, errlen, "dummy weights: out of memory");
        goto failed;
    }

    total = 0;
    for (i = 0; i < n; i++) {
        numel = (size_t) want[i].shape[0]
                * (size_t) (want[i].ndim == 2 ? want[i].shape[1] : 1);
        total += (numel * el + 63) & ~(size_t) 63;
    }

    base = mmap(NULL, total, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        snprintf(err, errlen, "dummy weights: mmap of %zu bytes: %s", total,
                 strerror(errno));
        goto failed;
    }

    w->maps[0] = base;
    w->map_bytes[0] = total;
    w->n_maps = 1;

    off = 0;
    for (i = 0; i < n; i++) {
        struct msv_tensor  *t = &w->t[i];

        memcpy(t->name, want[i].name, sizeof(t->name));
        t->dtype = dtype;
        t->ndim = want[i].ndim;
        t->shape[0] = want[i].shape[0];
        t->shape[1] = want[i].ndim == 2 ? want[i].shape[1] : 0;
        numel = (size_t) t->shape[0] * (size_t) (t->ndim == 2
                                                 ? t->shape[1] : 1);
        t->bytes = numel * el;
        t->data = base + off;
        t->file = -1;
        off += (t->bytes + 63) & ~(size_t) 63;

        /* a tensor's values depend on the seed and its name only */
        keys[i] = msv_mix64(seed ^ msv_mix64(msv_fnv1a(t->name)));
        scale[i] = want[i].kind == MSV_INIT_ONES ? 0.0f : want[i].scale;
    }
    w->n = n;

    f.t = w->t;
    f.keys = keys;
    f.scale = scale;
    f.n_t = n;
    f.next = 0;
    f.n_jobs = 0;
    for (i = 0; i < n; i++) {
        f.n_jobs += (w->t[i].bytes / el + MSV_DUMMY_CHUNK - 1)
                    / MSV_DUMMY_CHUNK;
    }

    f.jobs = malloc(f.n_jobs * sizeof(uint64_t));
    if (f.jobs == NULL) {
        snprintf(err, errlen, "dummy weights: out of memory");
        goto failed;
    }

    f.n_jobs = 0;
    for (i = 0; i < n; i++) {
        numel = w->t[i].bytes / el;
        for (j = 0; j * MSV_DUMMY_CHUNK < numel; j++) {
            f.jobs[f.n_jobs++] = (uint64_t) i << 32 | j;
        }
    }

    if (pthread_mutex_init(&f.mu, NULL) != 0) {
        snprintf(err, errlen, "dummy weights: pthread_mutex_init failed");
        free(f.jobs);
        goto failed;
    }

    ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    nth = ncpu < 1 ? 1 : ncpu > 64 ? 64 : (int) ncpu;
    if ((size_t) nth > f.n_jobs) {
        nth = (int) f.n_jobs;
    }

    for (i = 1; i < nth; i++) {
        rc = pthread_create(&th[i], NULL, msv_fill_thread, &f);
        if (rc != 0) {
            nth = i;    /* run with the threads we have */
            break;
        }
    }

    msv_fill_thread(&f);

    for (i = 1; i < nth; i++) {
        pthread_join(th[i], NULL);
    }

    pthread_mutex_destroy(&f.mu);
    free(f.jobs);
    free(keys);
    free(scale);
    free(want);

    if (mprotect(base, total, PROT_READ) == -1) {
        snprintf(err, errlen, "dummy weights: mprotect: %s",
                 strerror(errno));
        msv_weights_free(w);
        return -1;
    }

    snprintf(w->source, sizeof(w->source), "dummy weights (seed %" PRIu64
             ")", seed);

    return 0;

failed:

    free(keys);
    free(scale);
    free(want);
    msv_weights_free(w);
    return -1;
}


static void *
msv_fill_thread(void *arg)
{
    size_t           k;
    uint64_t         job;
    struct msv_fill  *f = arg;

    for ( ;; ) {
        pthread_mutex_lock(&f->mu);
        k = f->next++;
        pthread_mutex_unlock(&f->mu);

        if (k >= f->n_jobs) {
            return NULL;
        }

        job = f->jobs[k];
        msv_fill_chunk(f, (int) (job >> 32), (size_t) (job & 0xffffffffu));
    }
}


/*
 * Element e of a tensor: ones for norms; otherwise an approximately
 * standard normal draw (the sum of four uniform 16-bit fields of a 64-bit
 * hash of (tensor key, e), centred and scaled to unit variance) times the
 * tensor's scale.  Counter-based, so the result does not depend on the
 * number of threads.
 */

static void
msv_fill_chunk(struct msv_fill *f, int ti, size_t chunk)
{
    int                 dt;
    float               v, sc;
    size_t              e, e0, e1, numel;
    uint32_t            u;
    uint64_t            h, key;
    struct msv_tensor  *t;

    t = &f->t[ti];
    dt = t->dtype;
    numel = t->bytes / (dt == MSV_F32 ? 4 : 2);
    e0 = chunk * MSV_DUMMY_CHUNK;
    e1 = e0 + MSV_DUMMY_CHUNK < numel ? e0 + MSV_DUMMY_CHUNK : numel;
    key = f->keys[ti];
    sc = f->scale[ti];

    for (e = e0; e < e1; e++) {
        if (sc == 0.0f) {
            v = 1.0f;

        } else {
            h = msv_mix64(key + e * 0x9e3779b97f4a7c15ULL);
            v = (float) ((h & 0xffff) + ((h >> 16) & 0xffff)
                         + ((h >> 32) & 0xffff) + (h >> 48) + 2.0);
            /* four uniforms on (0, 1): mean 2, variance 1/3 */
            v = (v * (1.0f / 65536.0f) - 2.0f) * 1.7320508f * sc;
        }

        if (dt == MSV_F32) {
            ((float *) t->data)[e] = v;

        } else {
            /* round to nearest even */
            memcpy(&u, &v, 4);
            u += 0x7fff + ((u >> 16) & 1);
            ((uint16_t *) t->data)[e] = (uint16_t) (u >> 16);
        }
    }
}


int
msv_weights_check(const struct msv_model_config *cfg,
    const struct msv_weights *w, char *err, size_t errlen)
{
    int                       i, n, d;
    char                      got[96], exp[64];
    size_t                    len;
    struct msv_want          *want;
    const struct msv_tensor  *t;

    if (msv_wants(cfg, &want, &n) != 0) {
        snprintf(err, errlen, "%s: out of memory", w->source);
        return -1;
    }

    for (i = 0; i < n; i++) {
        t = msv_weights_find(w, want[i].name);

        if (t == NULL) {
            snprintf(err, errlen, "%s: tensor %s: missing", w->source,
                     want[i].name);
            free(want);
            return -1;
        }

        if (t->dtype != MSV_F32 && t->dtype != MSV_F16
            && t->dtype != MSV_BF16)
        {
            snprintf(err, errlen, "%s: tensor %s: unsupported dtype %d",
                     msv_tensor_file(w, t), t->name, t->dtype);
            free(want);
            return -1;
        }

        if (t->ndim != want[i].ndim || t->shape[0] != want[i].shape[0]
            || (t->ndim == 2 && t->shape[1] != want[i].shape[1]))
        {
            len = 0;
            got[0] = '\0';
            for (d = 0; d < t->ndim && d < 4; d++) {
                len += (size_t) snprintf(got + len, sizeof(got) - len,
                                         "%s%" PRId64, d ? ", " : "",
                                         t->shape[d]);
                if (len >= sizeof(got)) {
                    break;
                }
            }

            if (want[i].ndim == 2) {
                snprintf(exp, sizeof(exp), "%" PRId64 ", %" PRId64,
                         want[i].shape[0], want[i].shape[1]);
            } else {
                snprintf(exp, sizeof(exp), "%" PRId64, want[i].shape[0]);
            }

            snprintf(err, errlen, "%s: tensor %s: shape mismatch: expected "
                     "[%s], got [%s]", msv_tensor_file(w, t), t->name, exp,
                     got);
            free(want);
            return -1;
        }
    }

    free(want);
    return 0;
}


const struct msv_tensor *
msv_weights_find(const struct msv_weights *w, const char *name)
{
    for (int i = 0; i < w->n; i++) {
        if (strcmp(w->t[i].name, name) == 0) {
            return &w->t[i];
        }
    }

    return NULL;
}


void
msv_tensor_to_f32(const struct msv_tensor *t, size_t off, size_t n,
    float *out)
{
    size_t          i;
    uint16_t        h;
    uint32_t        u, sign, exp, man;
    const uint8_t  *p;

    switch (t->dtype) {

    case MSV_F32:
        memcpy(out, (const uint8_t *) t->data + off * 4, n * 4);
        return;

    case MSV_BF16:
        p = (const uint8_t *) t->data + off * 2;
        for (i = 0; i < n; i++) {
            memcpy(&h, p + 2 * i, 2);
            u = (uint32_t) h << 16;
            memcpy(&out[i], &u, 4);
        }
        return;

    case MSV_F16:
        p = (const uint8_t *) t->data + off * 2;
        for (i = 0; i < n; i++) {
            memcpy(&h, p + 2 * i, 2);
            sign = (uint32_t) (h >> 15) << 31;
            exp = (h >> 10) & 0x1f;
            man = h & 0x3ff;

            if (exp == 0x1f) {
                /* inf, nan */
                u = sign | 0x7f800000u | (man << 13);

            } else if (exp != 0) {
                u = sign | ((exp + 112) << 23) | (man << 13);

            } else if (man == 0) {
                u = sign;

            } else {
                /* subnormal: man * 2^-24 exactly */
                float  f = (float) man * 5.9604644775390625e-8f;

                memcpy(&u, &f, 4);
                u |= sign;
            }

            memcpy(&out[i], &u, 4);
        }
        return;

    default:
        /* msv_weights_check refuses other dtypes before anyone converts */
        memset(out, 0, n * sizeof(float));
        return;
    }
}


void
msv_weights_free(struct msv_weights *w)
{
    int  i;

    for (i = 0; i < w->n_maps; i++) {
        if (w->maps[i] != NULL) {
            munmap(w->maps[i], w->map_bytes[i]);
        }
    }

    for (i = 0; i < w->n_files; i++) {
        free(w->files[i]);
    }

    free(w->t);
    free(w->maps);
    free(w->map_bytes);
    free(w->files);
    memset(w, 0, sizeof(*w));
}


/*
 * The tensors an architecture needs, with HF names and [out, in] shapes,
 * and how dummy weights initialise each.
 */

static int
msv_wants(const struct msv_model_config *cfg, struct msv_want **out, int *n)
{
    int               k, per;
    int64_t           h, q, kv, in, hd, v;
    uint32_t          l;
    struct msv_want  *w;

    h = cfg->hidden;
    q = (int64_t) cfg->n_heads * cfg->head_dim;
    kv = (int64_t) cfg->n_kv_heads * cfg->head_dim;
    in = cfg->intermediate;
    hd = cfg->head_dim;
    v = cfg->vocab_size;

    per = 9 + (cfg->qkv_bias ? 3 : 0) + (cfg->qk_norm ? 2 : 0);

    w = calloc((size_t) per * cfg->n_layers + 3, sizeof(struct msv_want));
    if (w == NULL) {
        return -1;
    }

    k = 0;

#define MSV_WANT(kd, sc, nd, s0, s1, ...)                                    \
    do {                                                                     \
        snprintf(w[k].name, sizeof(w[k].name), __VA_ARGS__);                \
        w[k].kind = (kd);                                                    \
        w[k].scale = (sc);                                                   \
        w[k].ndim = (nd);                                                    \
        w[k].shape[0] = (s0);                                                \
        w[k].shape[1] = (s1);                                                \
        k++;                                                                 \
    } while (0)

#define MSV_PROJ(s0, s1, ...)                                                \
    MSV_WANT(MSV_INIT_NORMAL, (float) (1.0 / sqrt((double) (s1))), 2, s0, s1, \
             __VA_ARGS__)

    MSV_WANT(MSV_INIT_NORMAL, (float) (2.0 / sqrt((double) h)), 2, v, h,
             "model.embed_tokens.weight");

    for (l = 0; l < cfg->n_layers; l++) {
        MSV_WANT(MSV_INIT_ONES, 0, 1, h, 0,
                 "model.layers.%u.input_layernorm.weight", l);
        MSV_PROJ(q, h, "model.layers.%u.self_attn.q_proj.weight", l);
        MSV_PROJ(kv, h, "model.layers.%u.self_attn.k_proj.weight", l);
        MSV_PROJ(kv, h, "model.layers.%u.self_attn.v_proj.weight", l);

        if (cfg->qkv_bias) {
            MSV_WANT(MSV_INIT_NORMAL, 0.02f, 1, q, 0,
                     "model.layers.%u.self_attn.q_proj.bias", l);
            MSV_WANT(MSV_INIT_NORMAL, 0.02f, 1, kv, 0,
                     "model.layers.%u.self_attn.k_proj.bias", l);
            MSV_WANT(MSV_INIT_NORMAL, 0.02f, 1, kv, 0,
                     "model.layers.%u.self_attn.v_proj.bias", l);
        }

        if (cfg->qk_norm) {
            MSV_WANT(MSV_INIT_ONES, 0, 1, hd, 0,
                     "model.layers.%u.self_attn.q_norm.weight", l);
            MSV_WANT(MSV_INIT_ONES, 0, 1, hd, 0,
                     "model.layers.%u.self_attn.k_norm.weight", l);
        }

        MSV_PROJ(h, q, "model.layers.%u.self_attn.o_proj.weight", l);
        MSV_WANT(MSV_INIT_ONES, 0, 1, h, 0,
                 "model.layers.%u.post_attention_layernorm.weight", l);
        MSV_PROJ(in, h, "model.layers.%u.mlp.gate_proj.weight", l);
        MSV_PROJ(in, h, "model.layers.%u.mlp.up_proj.weight", l);
        MSV_PROJ(h, in, "model.layers.%u.mlp.down_proj.weight", l);
    }

    MSV_WANT(MSV_INIT_ONES, 0, 1, h, 0, "model.norm.weight");

    if (!cfg->tie_embeddings) {
        MSV_WANT(MSV_INIT_NORMAL, (float) (2.0 / sqrt((double) h)), 2, v, h,
                 "lm_head.weight");
    }

#undef MSV_PROJ
#undef MSV_WANT

    *out = w;
    *n = k;

    return 0;
}


static const char *
msv_tensor_file(const struct msv_weights *w, const struct msv_tensor *t)
{
    if (t->file >= 0 && t->file < w->n_files) {
        return w->files[t->file];
    }

    return w->source;
}


static uint64_t
msv_fnv1a(const char *s)
{
    uint64_t  h = 0xcbf29ce484222325ULL;

    while (*s) {
        h ^= (uint8_t) *s++;
        h *= 0x100000001b3ULL;
    }

    return h;
}
