/*
 * config.c: the model configuration, from a Hugging Face config.json (and
 * the generation_config.json beside it) or from a built-in preset.
 */

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "safetensors.h"


#define MSV_CFG_DIM_MAX  (1u << 24)    /* sanity bound on every size */


static yajl_val msv_cfg_get(yajl_val obj, const char *key);
static int msv_cfg_u32(yajl_val obj, const char *path, const char *pre,
    const char *key, int required, uint32_t dflt, uint32_t *out, char *err,
    size_t errlen);
static int msv_cfg_float(yajl_val obj, const char *path, const char *pre,
    const char *key, int required, double dflt, int positive, float *out,
    char *err, size_t errlen);
static int msv_cfg_bool(yajl_val obj, const char *path, const char *key,
    int dflt, int *out, char *err, size_t errlen);
static int msv_cfg_rope(yajl_val root, const char *path,
    struct msv_model_config *cfg, char *err, size_t errlen);
static int msv_cfg_eos(yajl_val v, const char *path,
    struct msv_model_config *cfg, char *err, size_t errlen);
static int msv_cfg_dtype(yajl_val root, const char *path,
    struct msv_model_config *cfg, char *err, size_t errlen);
static int msv_cfg_unsupported(yajl_val root, const char *path,
    char *err, size_t errlen);
static int msv_cfg_validate(const char *path, struct msv_model_config *cfg,
    char *err, size_t errlen);
static void msv_cfg_name(const char *path, struct msv_model_config *cfg);


/* The built-in presets; the fields left out are zero. */

static const struct {
    const char               *name;
    struct msv_model_config   cfg;
} msv_presets[] = {

    /* Qwen3-shaped and fast on a CPU; the vocabulary is deliberately not
     * a power of two */
    { "tiny", {
        .arch = MSV_ARCH_QWEN3, .vocab_size = 4099, .hidden = 64,
        .intermediate = 128, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
        .head_dim = 16, .max_pos = 4096, .rms_eps = 1e-6f,
        .rope_theta = 10000.0f, .rope_type = MSV_ROPE_DEFAULT,
        .rope_factor = 1.0f, .tie_embeddings = 0,
        .n_eos = 1, .eos_ids = { 0 }, .bos_id = -1 } },

    { "qwen3-8b", {
        .arch = MSV_ARCH_QWEN3, .vocab_size = 151936, .hidden = 4096,
        .intermediate = 12288, .n_layers = 36, .n_heads = 32,
        .n_kv_heads = 8, .head_dim = 128, .max_pos = 40960,
        .rms_eps = 1e-6f, .rope_theta = 1000000.0f,
        .rope_type = MSV_ROPE_DEFAULT, .rope_factor = 1.0f,
        .tie_embeddings = 0,
        .n_eos = 2, .eos_ids = { 151645, 151643 }, .bos_id = 151643 } },

    { "qwen3-0.6b", {
        .arch = MSV_ARCH_QWEN3, .vocab_size = 151936, .hidden = 1024,
        .intermediate = 3072, .n_layers = 28, .n_heads = 16,
        .n_kv_heads = 8, .head_dim = 128, .max_pos = 40960,
        .rms_eps = 1e-6f, .rope_theta = 1000000.0f,
        .rope_type = MSV_ROPE_DEFAULT, .rope_factor = 1.0f,
        .tie_embeddings = 1,
        .n_eos = 2, .eos_ids = { 151645, 151643 }, .bos_id = 151643 } },

    /* Llama 3.1 8B */
    { "llama3-8b", {
        .arch = MSV_ARCH_LLAMA, .vocab_size = 128256, .hidden = 4096,
        .intermediate = 14336, .n_layers = 32, .n_heads = 32,
        .n_kv_heads = 8, .head_dim = 128, .max_pos = 131072,
        .rms_eps = 1e-5f, .rope_theta = 500000.0f,
        .rope_type = MSV_ROPE_LLAMA3, .rope_factor = 8.0f,
        .rope_low_freq_factor = 1.0f, .rope_high_freq_factor = 4.0f,
        .rope_orig_max_pos = 8192, .tie_embeddings = 0,
        .n_eos = 3, .eos_ids = { 128001, 128008, 128009 },
        .bos_id = 128000 } }
};


int
msv_config_load(const char *path, struct msv_model_config *cfg, char *err,
    size_t errlen)
{
    int          rc, head_dim_given;
    char         gpath[4096];
    size_t       dl;
    yajl_val     root, v, groot;
    const char  *arch, *slash;

    memset(cfg, 0, sizeof(*cfg));
    cfg->bos_id = -1;

    rc = msv_json_file_parse(path, &root, err, errlen);
    if (rc != 0) {
        return -1;
    }

    v = msv_cfg_get(root, "architectures");
    if (v == NULL || YAJL_IS_NULL(v)) {
        snprintf(err, errlen, "%s: architectures: missing", path);
        goto failed;
    }

    if (!YAJL_IS_ARRAY(v) || v->u.array.len == 0
        || !YAJL_IS_STRING(v->u.array.values[0]))
    {
        snprintf(err, errlen, "%s: architectures: not a non-empty array "
                 "of strings", path);
        goto failed;
    }

    arch = v->u.array.values[0]->u.string;

    if (strcmp(arch, "Qwen3ForCausalLM") == 0) {
        cfg->arch = MSV_ARCH_QWEN3;
        cfg->qk_norm = 1;

    } else if (strcmp(arch, "LlamaForCausalLM") == 0) {
        cfg->arch = MSV_ARCH_LLAMA;

    } else if (strcmp(arch, "Qwen2ForCausalLM") == 0) {
        cfg->arch = MSV_ARCH_QWEN2;
        cfg->qkv_bias = 1;

    } else {
        snprintf(err, errlen, "%s: architectures: unsupported architecture "
                 "\"%.64s\" (supported: Qwen3ForCausalLM, LlamaForCausalLM, "
                 "Qwen2ForCausalLM)", path, arch);
        goto failed;
    }

    if (msv_cfg_u32(root, path, "", "vocab_size", 1, 0,
                    &cfg->vocab_size, err, errlen) != 0
        || msv_cfg_u32(root, path, "", "hidden_size", 1, 0,
                       &cfg->hidden, err, errlen) != 0
        || msv_cfg_u32(root, path, "", "intermediate_size", 1, 0,
                       &cfg->intermediate, err, errlen) != 0
        || msv_cfg_u32(root, path, "", "num_hidden_layers", 1, 0,
                       &cfg->n_layers, err, errlen) != 0
        || msv_cfg_u32(root, path, "", "num_attention_heads", 1, 0,
                       &cfg->n_heads, err, errlen) != 0
        || msv_cfg_u32(root, path, "", "num_key_value_heads", 0,
                       cfg->n_heads, &cfg->n_kv_heads, err, errlen) != 0
        || msv_cfg_u32(root, path, "", "max_position_embeddings", 1, 0,
                       &cfg->max_pos, err, errlen) != 0
        || msv_cfg_float(root, path, "", "rms_norm_eps", 0, 1e-6, 1,
                         &cfg->rms_eps, err, errlen) != 0)
    {
        goto failed;
    }

    v = msv_cfg_get(root, "head_dim");
    head_dim_given = v != NULL && !YAJL_IS_NULL(v);

    if (head_dim_given) {
        if (msv_cfg_u32(root, path, "", "head_dim", 1, 0, &cfg->head_dim,
                        err, errlen) != 0)
        {
            goto failed;
        }

    } else {
        if (cfg->hidden % cfg->n_heads != 0) {
            snprintf(err, errlen, "%s: head_dim: missing, and hidden_size "
                     "%u is not a multiple of num_attention_heads %u",
                     path, cfg->hidden, cfg->n_heads);
            goto failed;
        }
        cfg->head_dim = cfg->hidden / cfg->n_heads;
    }

    /* Llama ties embeddings only when the config says so; Qwen configs
     * always say (the library default is false for all three). */

    if (msv_cfg_bool(root, path, "tie_word_embeddings", 0,
                     &cfg->tie_embeddings, err, errlen) != 0)
    {
        goto failed;
    }

    if (msv_cfg_rope(root, path, cfg, err, errlen) != 0
        || msv_cfg_dtype(root, path, cfg, err, errlen) != 0
        || msv_cfg_unsupported(root, path, err, errlen) != 0)
    {
        goto failed;
    }

    v = msv_cfg_get(root, "bos_token_id");
    if (v != NULL && !YAJL_IS_NULL(v)) {
        if (!YAJL_IS_INTEGER(v) || v->u.number.i < 0
            || v->u.number.i > INT32_MAX)
        {
            snprintf(err, errlen, "%s: bos_token_id: not a token id", path);
            goto failed;
        }
        cfg->bos_id = (int32_t) v->u.number.i;
    }

    if (msv_cfg_eos(msv_cfg_get(root, "eos_token_id"), path, cfg, err,
                    errlen) != 0)
    {
        goto failed;
    }

    if (msv_cfg_validate(path, cfg, err, errlen) != 0) {
        goto failed;
    }

    yajl_tree_free(root);
    root = NULL;

    /* generation_config.json beside config.json: its eos ids are the ones
     * generation stops at; they are added to those of config.json */

    slash = strrchr(path, '/');
    dl = slash ? (size_t) (slash - path + 1) : 0;
    if (dl + sizeof("generation_config.json") > sizeof(gpath)) {
        snprintf(err, errlen, "%s: path too long", path);
        return -1;
    }
    memcpy(gpath, path, dl);
    strcpy(gpath + dl, "generation_config.json");

    rc = msv_json_file_parse(gpath, &groot, err, errlen);
    if (rc == -1) {
        return -1;
    }

    if (rc == 0) {
        rc = msv_cfg_eos(msv_cfg_get(groot, "eos_token_id"), gpath, cfg,
                         err, errlen);
        yajl_tree_free(groot);
        if (rc != 0) {
            return -1;
        }
    }

    for (uint32_t i = 0; i < cfg->n_eos; i++) {
        if ((uint32_t) cfg->eos_ids[i] >= cfg->vocab_size) {
            snprintf(err, errlen, "%s: eos_token_id: %d is not below "
                     "vocab_size %u", path, cfg->eos_ids[i],
                     cfg->vocab_size);
            return -1;
        }
    }

    if (cfg->bos_id >= 0 && (uint32_t) cfg->bos_id >= cfg->vocab_size) {
        snprintf(err, errlen, "%s: bos_token_id: %d is not below "
                 "vocab_size %u", path, cfg->bos_id, cfg->vocab_size);
        return -1;
    }

    msv_cfg_name(path, cfg);

    return 0;

failed:

    yajl_tree_free(root);
    return -1;
}


int
msv_config_preset(const char *preset, struct msv_model_config *cfg,
    char *err, size_t errlen)
{
    size_t  i, len;

    len = strlen(preset);
    if (len > 5 && strcmp(preset + len - 5, ".json") == 0) {
        if (msv_config_load(preset, cfg, err, errlen) != 0) {
            return -1;
        }
        cfg->dtype = msv_config_dummy_dtype(cfg);
        return 0;
    }

    for (i = 0; i < sizeof(msv_presets) / sizeof(msv_presets[0]); i++) {
        if (strcmp(preset, msv_presets[i].name) == 0) {
            break;
        }
    }

    if (i == sizeof(msv_presets) / sizeof(msv_presets[0])) {
        snprintf(err, errlen, "preset \"%.64s\": unknown (tiny, qwen3-0.6b, "
                 "qwen3-8b, llama3-8b, or a path to a config .json)",
                 preset);
        return -1;
    }

    *cfg = msv_presets[i].cfg;

    cfg->qk_norm = cfg->arch == MSV_ARCH_QWEN3;
    cfg->qkv_bias = cfg->arch == MSV_ARCH_QWEN2;
    cfg->dtype = msv_config_dummy_dtype(cfg);
    snprintf(cfg->name, sizeof(cfg->name), "%s", preset);

    return 0;
}


uint64_t
msv_config_n_params(const struct msv_model_config *cfg)
{
    uint64_t  h, q, kv, layer, n;

    h = cfg->hidden;
    q = (uint64_t) cfg->n_heads * cfg->head_dim;
    kv = (uint64_t) cfg->n_kv_heads * cfg->head_dim;

    layer = h * q + 2 * h * kv + q * h           /* q, k, v, o */
            + 3 * h * cfg->intermediate          /* gate, up, down */
            + 2 * h;                             /* two norms */

    if (cfg->qkv_bias) {
        layer += q + 2 * kv;
    }

    if (cfg->qk_norm) {
        layer += 2 * (uint64_t) cfg->head_dim;
    }

    n = (uint64_t) cfg->vocab_size * h + layer * cfg->n_layers + h;

    if (!cfg->tie_embeddings) {
        n += (uint64_t) cfg->vocab_size * h;
    }

    return n;
}


int
msv_config_dummy_dtype(const struct msv_model_config *cfg)
{
    return msv_config_n_params(cfg) * 4 > ((uint64_t) 1 << 30)
           ? MSV_BF16 : MSV_F32;
}


const char *
msv_arch_name(int arch)
{
    switch (arch) {
    case MSV_ARCH_LLAMA:
        return "LlamaForCausalLM";
    case MSV_ARCH_QWEN2:
        return "Qwen2ForCausalLM";
    case MSV_ARCH_QWEN3:
        return "Qwen3ForCausalLM";
    default:
        return "unknown";
    }
}


const char *
msv_dtype_name(int dtype)
{
    switch (dtype) {
    case MSV_F32:
        return "F32";
    case MSV_F16:
        return "F16";
    case MSV_BF16:
        return "BF16";
    default:
        return "unknown";
    }
}


static yajl_val
msv_cfg_get(yajl_val obj, const char *key)
{
    if (!YAJL_IS_OBJECT(obj)) {
        return NULL;
    }

    for (size_t i = 0; i < obj->u.object.len; i++) {
        if (strcmp(obj->u.object.keys[i], key) == 0) {
            return obj->u.object.values[i];
        }
    }

    return NULL;
}


static int
msv_cfg_u32(yajl_val obj, const char *path, const char *pre,
    const char *key, int required, uint32_t dflt, uint32_t *out, char *err,
    size_t errlen)
{
    yajl_val  v;

    v = msv_cfg_get(obj, key);

    if (v == NULL || YAJL_IS_NULL(v)) {
        if (required) {
            snprintf(err, errlen, "%s: %s%s: missing", path, pre, key);
            return -1;
        }
        *out = dflt;
        return 0;
    }

    if (!YAJL_IS_INTEGER(v)) {
        snprintf(err, errlen, "%s: %s%s: not an integer", path, pre, key);
        return -1;
    }

    if (v->u.number.i < 1 || v->u.number.i > MSV_CFG_DIM_MAX) {
        snprintf(err, errlen, "%s: %s%s: %lld is out of range [1, %u]",
                 path, pre, key, (long long) v->u.number.i,
                 MSV_CFG_DIM_MAX);
        return -1;
    }

    *out = (uint32_t) v->u.number.i;
    return 0;
}


static int
msv_cfg_float(yajl_val obj, const char *path, const char *pre,
    const char *key, int required, double dflt, int positive, float *out,
    char *err, size_t errlen)
{
    char      *end;
    double     d;
    yajl_val   v;

    v = msv_cfg_get(obj, key);

    if (v == NULL || YAJL_IS_NULL(v)) {
        if (required) {
            snprintf(err, errlen, "%s: %s%s: missing", path, pre, key);
            return -1;
        }
        *out = (float) dflt;
        return 0;
    }

    if (!YAJL_IS_NUMBER(v)) {
        snprintf(err, errlen, "%s: %s%s: not a number", path, pre, key);
        return -1;
    }

    errno = 0;
    d = strtod(v->u.number.r, &end);
    if (errno != 0 || *end != '\0' || !isfinite(d) || fabs(d) > 1e30
        || (positive && !(d > 0)))
    {
        snprintf(err, errlen, "%s: %s%s: %.32s is out of range%s", path,
                 pre, key, v->u.number.r, positive ? " (must be > 0)" : "");
        return -1;
    }

    *out = (float) d;
    return 0;
}


static int
msv_cfg_bool(yajl_val obj, const char *path, const char *key, int dflt,
    int *out, char *err, size_t errlen)
{
    yajl_val  v;

    v = msv_cfg_get(obj, key);

    if (v == NULL || YAJL_IS_NULL(v)) {
        *out = dflt;
        return 0;
    }

    if (YAJL_IS_TRUE(v)) {
        *out = 1;
        return 0;
    }

    if (YAJL_IS_FALSE(v)) {
        *out = 0;
        return 0;
    }

    snprintf(err, errlen, "%s: %s: not a boolean", path, key);
    return -1;
}


/*
 * RoPE: the theta and the scaling, either in the classic layout
 * (rope_theta, rope_scaling {rope_type|type, ...}) or in the newer one
 * (rope_parameters {rope_theta, rope_type, ...}).
 */

static int
msv_cfg_rope(yajl_val root, const char *path, struct msv_model_config *cfg,
    char *err, size_t errlen)
{
    char         pre[32];
    yajl_val     params, sc, v;
    const char  *type, *where;

    cfg->rope_type = MSV_ROPE_DEFAULT;
    cfg->rope_factor = 1.0f;

    params = msv_cfg_get(root, "rope_parameters");
    if (params != NULL && !YAJL_IS_NULL(params) && !YAJL_IS_OBJECT(params)) {
        snprintf(err, errlen, "%s: rope_parameters: not an object", path);
        return -1;
    }
    if (YAJL_IS_NULL(params)) {
        params = NULL;
    }

    if (params != NULL && msv_cfg_get(params, "rope_theta") != NULL) {
        if (msv_cfg_float(params, path, "rope_parameters.", "rope_theta", 1,
                          0, 1, &cfg->rope_theta, err, errlen) != 0)
        {
            return -1;
        }

    } else if (msv_cfg_float(root, path, "", "rope_theta", 0, 10000.0, 1,
                             &cfg->rope_theta, err, errlen) != 0)
    {
        return -1;
    }

    sc = msv_cfg_get(root, "rope_scaling");
    where = "rope_scaling";
    if (sc == NULL || YAJL_IS_NULL(sc)) {
        sc = params;
        where = "rope_parameters";
    }

    if (sc == NULL) {
        return 0;
    }

    if (!YAJL_IS_OBJECT(sc)) {
        snprintf(err, errlen, "%s: %s: not an object or null", path, where);
        return -1;
    }

    snprintf(pre, sizeof(pre), "%s.", where);

    v = msv_cfg_get(sc, "rope_type");
    if (v == NULL) {
        v = msv_cfg_get(sc, "type");
    }

    if (v == NULL || YAJL_IS_NULL(v)) {
        type = "default";

    } else if (!YAJL_IS_STRING(v)) {
        snprintf(err, errlen, "%s: %s.rope_type: not a string", path, where);
        return -1;

    } else {
        type = v->u.string;
    }

    if (strcmp(type, "default") == 0) {
        return 0;
    }

    if (strcmp(type, "linear") == 0) {
        cfg->rope_type = MSV_ROPE_LINEAR;
        return msv_cfg_float(sc, path, pre, "factor", 1, 0, 1,
                             &cfg->rope_factor, err, errlen);
    }

    if (strcmp(type, "llama3") == 0) {
        cfg->rope_type = MSV_ROPE_LLAMA3;

        if (msv_cfg_float(sc, path, pre, "factor", 1, 0, 1,
                          &cfg->rope_factor, err, errlen) != 0
            || msv_cfg_float(sc, path, pre, "low_freq_factor", 1, 0, 1,
                             &cfg->rope_low_freq_factor, err, errlen) != 0
            || msv_cfg_float(sc, path, pre, "high_freq_factor", 1, 0, 1,
                             &cfg->rope_high_freq_factor, err, errlen) != 0
            || msv_cfg_u32(sc, path, pre, "original_max_position_embeddings",
                           1, 0, &cfg->rope_orig_max_pos, err, errlen) != 0)
        {
            return -1;
        }

        if (!(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor)) {
            snprintf(err, errlen, "%s: %s.high_freq_factor: must be above "
                     "low_freq_factor", path, where);
            return -1;
        }

        return 0;
    }

    snprintf(err, errlen, "%s: %s.rope_type: \"%.32s\" is not supported "
             "(default, linear, llama3)", path, where, type);
    return -1;
}


static int
msv_cfg_eos(yajl_val v, const char *path, struct msv_model_config *cfg,
    char *err, size_t errlen)
{
    size_t    i, n;
    int64_t   id;
    uint32_t  j;
    yajl_val  x;

    if (v == NULL || YAJL_IS_NULL(v)) {
        return 0;
    }

    if (YAJL_IS_ARRAY(v)) {
        n = v->u.array.len;
    } else if (YAJL_IS_INTEGER(v)) {
        n = 1;
    } else {
        snprintf(err, errlen, "%s: eos_token_id: not an integer or a list "
                 "of integers", path);
        return -1;
    }

    for (i = 0; i < n; i++) {
        x = YAJL_IS_ARRAY(v) ? v->u.array.values[i] : v;

        if (!YAJL_IS_INTEGER(x) || x->u.number.i < 0
            || x->u.number.i > INT32_MAX)
        {
            snprintf(err, errlen, "%s: eos_token_id: not a token id", path);
            return -1;
        }
        id = x->u.number.i;

        for (j = 0; j < cfg->n_eos; j++) {
            if (cfg->eos_ids[j] == id) {
                break;
            }
        }

        if (j < cfg->n_eos) {
            continue;
        }

        if (cfg->n_eos == sizeof(cfg->eos_ids) / sizeof(cfg->eos_ids[0])) {
            snprintf(err, errlen, "%s: eos_token_id: more than %zu distinct "
                     "ids", path, sizeof(cfg->eos_ids) / sizeof(int32_t));
            return -1;
        }

        cfg->eos_ids[cfg->n_eos++] = (int32_t) id;
    }

    return 0;
}


static int
msv_cfg_dtype(yajl_val root, const char *path, struct msv_model_config *cfg,
    char *err, size_t errlen)
{
    yajl_val     v;
    const char  *key, *s;

    key = "dtype";
    v = msv_cfg_get(root, key);
    if (v == NULL || YAJL_IS_NULL(v)) {
        key = "torch_dtype";
        v = msv_cfg_get(root, key);
    }

    if (v == NULL || YAJL_IS_NULL(v)) {
        /* not declared: the tensors carry their own dtype */
        cfg->dtype = MSV_F32;
        return 0;
    }

    if (!YAJL_IS_STRING(v)) {
        snprintf(err, errlen, "%s: %s: not a string", path, key);
        return -1;
    }

    s = v->u.string;
    if (strncmp(s, "torch.", 6) == 0) {
        s += 6;
    }

    if (strcmp(s, "float32") == 0 || strcmp(s, "float") == 0) {
        cfg->dtype = MSV_F32;
    } else if (strcmp(s, "float16") == 0 || strcmp(s, "half") == 0) {
        cfg->dtype = MSV_F16;
    } else if (strcmp(s, "bfloat16") == 0) {
        cfg->dtype = MSV_BF16;
    } else {
        snprintf(err, errlen, "%s: %s: \"%.32s\" is not supported (float32, "
                 "float16, bfloat16)", path, key, v->u.string);
        return -1;
    }

    return 0;
}


/* Variants of the three architectures this code does not implement:
 * refuse them rather than compute something else. */

static int
msv_cfg_unsupported(yajl_val root, const char *path, char *err,
    size_t errlen)
{
    int          on;
    yajl_val     v;
    const char  *flags[] = { "attention_bias", "mlp_bias",
                             "use_sliding_window" };

    for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
        if (msv_cfg_bool(root, path, flags[i], 0, &on, err, errlen) != 0) {
            return -1;
        }
        if (on) {
            snprintf(err, errlen, "%s: %s: true is not supported", path,
                     flags[i]);
            return -1;
        }
    }

    v = msv_cfg_get(root, "hidden_act");
    if (v != NULL && !YAJL_IS_NULL(v)) {
        if (!YAJL_IS_STRING(v) || strcmp(v->u.string, "silu") != 0) {
            snprintf(err, errlen, "%s: hidden_act: only \"silu\" is "
                     "supported", path);
            return -1;
        }
    }

    return 0;
}


static int
msv_cfg_validate(const char *path, struct msv_model_config *cfg, char *err,
    size_t errlen)
{
    if (cfg->n_kv_heads > cfg->n_heads
        || cfg->n_heads % cfg->n_kv_heads != 0)
    {
        snprintf(err, errlen, "%s: num_key_value_heads: %u does not divide "
                 "num_attention_heads %u", path, cfg->n_kv_heads,
                 cfg->n_heads);
        return -1;
    }

    if (cfg->head_dim % 2 != 0) {
        snprintf(err, errlen, "%s: head_dim: %u is odd (RoPE needs pairs)",
                 path, cfg->head_dim);
        return -1;
    }

    if ((uint64_t) cfg->n_heads * cfg->head_dim > MSV_CFG_DIM_MAX) {
        snprintf(err, errlen, "%s: num_attention_heads x head_dim: too "
                 "large", path);
        return -1;
    }

    if (cfg->rope_type == MSV_ROPE_LLAMA3
        && cfg->rope_orig_max_pos == 0)
    {
        snprintf(err, errlen, "%s: rope_scaling."
                 "original_max_position_embeddings: missing", path);
        return -1;
    }

    return 0;
}


/* The model's name: the directory holding config.json. */

static void
msv_cfg_name(const char *path, struct msv_model_config *cfg)
{
    size_t       len;
    const char  *end, *start;

    end = strrchr(path, '/');
    if (end == NULL) {
        snprintf(cfg->name, sizeof(cfg->name), "%s", path);
        return;
    }

    while (end > path && end[-1] == '/') {
        end--;
    }

    start = end;
    while (start > path && start[-1] != '/') {
        start--;
    }

    len = (size_t) (end - start);
    if (len == 0 || (len == 1 && start[0] == '.')) {
        snprintf(cfg->name, sizeof(cfg->name), "%s", path);
        return;
    }

    if (len >= sizeof(cfg->name)) {
        len = sizeof(cfg->name) - 1;
    }
    memcpy(cfg->name, start, len);
    cfg->name[len] = '\0';
}
