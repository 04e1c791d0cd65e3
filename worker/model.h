/*
 * model.h: model configuration (Hugging Face config.json or a preset) and
 * the host-side tensor table the backends build themselves from.
 */

#ifndef MSV_MODEL_H
#define MSV_MODEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum msv_arch {
    MSV_ARCH_LLAMA = 1,    /* LlamaForCausalLM: Llama 2/3.x */
    MSV_ARCH_QWEN2 = 2,    /* Qwen2ForCausalLM: q/k/v bias */
    MSV_ARCH_QWEN3 = 3     /* Qwen3ForCausalLM: q/k RMSNorm per head */
};

enum msv_rope_type {
    MSV_ROPE_DEFAULT = 0,
    MSV_ROPE_LLAMA3  = 1,  /* rope_scaling.rope_type == "llama3" */
    MSV_ROPE_LINEAR  = 2   /* rope_scaling.rope_type == "linear" */
};

struct msv_model_config {
    int       arch;              /* enum msv_arch */
    uint32_t  vocab_size;
    uint32_t  hidden;            /* hidden_size */
    uint32_t  intermediate;      /* intermediate_size */
    uint32_t  n_layers;
    uint32_t  n_heads;
    uint32_t  n_kv_heads;
    uint32_t  head_dim;          /* head_dim, or hidden / n_heads */
    uint32_t  max_pos;           /* max_position_embeddings */
    float     rms_eps;
    float     rope_theta;
    int       rope_type;         /* enum msv_rope_type */
    float     rope_factor;
    float     rope_low_freq_factor;
    float     rope_high_freq_factor;
    uint32_t  rope_orig_max_pos;
    int       tie_embeddings;
    int       qkv_bias;          /* Qwen2 */
    int       qk_norm;           /* Qwen3 */
    int       dtype;             /* enum msv_dtype of the checkpoint */
    uint32_t  n_eos;
    int32_t   eos_ids[8];
    int32_t   bos_id;            /* -1 if none */
    char      name[128];
};

enum msv_dtype {
    MSV_F32  = 1,
    MSV_F16  = 2,
    MSV_BF16 = 3
};

struct msv_tensor {
    char         name[128];
    int          dtype;          /* enum msv_dtype */
    int          ndim;
    int64_t      shape[4];
    const void  *data;           /* host memory: mmap or malloc */
    size_t       bytes;
    int          file;           /* index into msv_weights.files, -1 if
                                    generated */
};

struct msv_weights {
    struct msv_tensor  *t;
    int                 n;
    void              **maps;    /* mappings owned (files, or anonymous
                                    for dummy weights), unmapped by
                                    msv_weights_free */
    size_t             *map_bytes;
    int                 n_maps;
    char              **files;   /* paths of the files the tensors come
                                    from (owned) */
    int                 n_files;
    char                source[512];  /* what was loaded: the single
                                         file, the index file, or
                                         "dummy weights (seed N)" */
};

/* Parse config.json.  Errors name the file and the field. */
int msv_config_load(const char *path, struct msv_model_config *cfg,
    char *err, size_t errlen);

/* Built-in shapes for dummy weights: "tiny", "qwen3-0.6b", "qwen3-8b",
 * "llama3-8b" (docs/MODELS.md), or a path ending in ".json": that config
 * file.  cfg->dtype is set to what msv_weights_dummy will store. */
int msv_config_preset(const char *preset, struct msv_model_config *cfg,
    char *err, size_t errlen);

/* Parameters the config implies (embeddings, lm_head unless tied,
 * every layer, norms). */
uint64_t msv_config_n_params(const struct msv_model_config *cfg);

const char *msv_arch_name(int arch);
const char *msv_dtype_name(int dtype);

/* Load <dir>/model.safetensors or <dir>/model.safetensors.index.json
 * shards (mmap).  Errors name the file (and the tensor). */
int msv_weights_load(const char *dir, struct msv_weights *w, char *err,
    size_t errlen);

/* Random weights with the config's shapes, deterministic in seed:
 * projections N(0, 1/in_features), embeddings and lm_head
 * N(0, 4/hidden), biases N(0, 0.02^2), norms 1 (docs/MODELS.md).  F32
 * when the model is at most 1 GiB in fp32, BF16 above that (see
 * msv_config_dummy_dtype). */
int msv_weights_dummy(const struct msv_model_config *cfg, uint64_t seed,
    struct msv_weights *w, char *err, size_t errlen);

/* The dtype msv_weights_dummy stores for this config. */
int msv_config_dummy_dtype(const struct msv_model_config *cfg);

/* Check that every tensor the architecture needs is there with the
 * right shape and a supported dtype. */
int msv_weights_check(const struct msv_model_config *cfg,
    const struct msv_weights *w, char *err, size_t errlen);

const struct msv_tensor *msv_weights_find(const struct msv_weights *w,
    const char *name);

/* Convert n elements of t (from element off) to float. */
void msv_tensor_to_f32(const struct msv_tensor *t, size_t off, size_t n,
    float *out);

void msv_weights_free(struct msv_weights *w);

#ifdef __cplusplus
}
#endif

#endif /* MSV_MODEL_H */
