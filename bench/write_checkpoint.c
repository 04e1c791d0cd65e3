/*
 * write_checkpoint.c: a Hugging Face checkpoint directory (config.json
 * and one model.safetensors) holding the dummy weights of a preset, the
 * tensors and values the worker's --dummy PRESET --seed N serves
 * (worker/weights.c; bf16 for the 8B presets).  For the weight-update
 * benchmark, which needs a checkpoint of a real model's size on disk.
 *
 *   write_checkpoint PRESET DIR [SEED]
 *
 * Errors name the file.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "model.h"


static double
now_s(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}


static const char *
st_dtype(int dtype)
{
    return dtype == MSV_F32 ? "F32" : dtype == MSV_F16 ? "F16" : "BF16";
}


static int
write_full(int fd, const void *p, size_t n)
{
    const char  *c = p;
    ssize_t      k;

    while (n > 0) {
        k = write(fd, c, n);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k <= 0) {
            return -1;
        }
        c += k;
        n -= (size_t) k;
    }
    return 0;
}


static int
write_config(const char *path, const struct msv_model_config *c)
{
    FILE      *f;
    uint32_t   i;
    int        ok;

    f = fopen(path, "w");
    if (f == NULL) {
        return -1;
    }
    fprintf(f, "{\n  \"architectures\": [\"%s\"],\n", msv_arch_name(c->arch));
    fprintf(f, "  \"vocab_size\": %u,\n  \"hidden_size\": %u,\n"
            "  \"intermediate_size\": %u,\n  \"num_hidden_layers\": %u,\n"
            "  \"num_attention_heads\": %u,\n"
            "  \"num_key_value_heads\": %u,\n  \"head_dim\": %u,\n"
            "  \"max_position_embeddings\": %u,\n"
            "  \"rms_norm_eps\": %.9g,\n  \"rope_theta\": %.9g,\n",
            c->vocab_size, c->hidden, c->intermediate, c->n_layers,
            c->n_heads, c->n_kv_heads, c->head_dim, c->max_pos,
            (double) c->rms_eps, (double) c->rope_theta);
    if (c->rope_type == MSV_ROPE_LLAMA3) {
        fprintf(f, "  \"rope_scaling\": {\"rope_type\": \"llama3\", "
                "\"factor\": %.9g, \"low_freq_factor\": %.9g, "
                "\"high_freq_factor\": %.9g, "
                "\"original_max_position_embeddings\": %u},\n",
                (double) c->rope_factor, (double) c->rope_low_freq_factor,
                (double) c->rope_high_freq_factor, c->rope_orig_max_pos);
    } else if (c->rope_type == MSV_ROPE_LINEAR) {
        fprintf(f, "  \"rope_scaling\": {\"rope_type\": \"linear\", "
                "\"factor\": %.9g},\n", (double) c->rope_factor);
    }
    fprintf(f, "  \"tie_word_embeddings\": %s,\n  \"attention_bias\": %s,\n"
            "  \"hidden_act\": \"silu\",\n  \"torch_dtype\": \"%s\",\n",
            c->tie_embeddings ? "true" : "false",
            c->qkv_bias ? "true" : "false",
            c->dtype == MSV_F32 ? "float32"
            : c->dtype == MSV_F16 ? "float16" : "bfloat16");
    if (c->bos_id >= 0) {
        fprintf(f, "  \"bos_token_id\": %d,\n", c->bos_id);
    }
    fprintf(f, "  \"eos_token_id\": [");
    for (i = 0; i < c->n_eos; i++) {
        fprintf(f, "%s%d", i ? ", " : "", c->eos_ids[i]);
    }
    fprintf(f, "]\n}\n");
    ok = !ferror(f);
    return fclose(f) == 0 && ok ? 0 : -1;
}


int
main(int argc, char **argv)
{
    struct msv_model_config   cfg;
    struct msv_weights        w;
    char                      err[512], path[4096], *hdr, *nh;
    size_t                    cap, len, off, total;
    uint64_t                  seed, hl;
    double                    t0, t1;
    int                       i, fd, d;

    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: write_checkpoint PRESET DIR [SEED]\n");
        return 2;
    }
    seed = argc == 4 ? strtoull(argv[3], NULL, 10) : 1;

    if (msv_config_preset(argv[1], &cfg, err, sizeof(err)) != 0) {
        fprintf(stderr, "write_checkpoint: %s\n", err);
        return 2;
    }
    if (mkdir(argv[2], 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "write_checkpoint: %s: %s\n", argv[2],
                strerror(errno));
        return 1;
    }

    t0 = now_s();
    if (msv_weights_dummy(&cfg, seed, &w, err, sizeof(err)) != 0) {
        fprintf(stderr, "write_checkpoint: %s\n", err);
        return 1;
    }
    t1 = now_s();

    snprintf(path, sizeof(path), "%s/config.json", argv[2]);
    if (write_config(path, &cfg) != 0) {
        fprintf(stderr, "write_checkpoint: %s: cannot write\n", path);
        return 1;
    }

    /* the header: every tensor, data back to back in table order */
    cap = 4096;
    hdr = malloc(cap);
    if (hdr == NULL) {
        fprintf(stderr, "write_checkpoint: out of memory\n");
        return 1;
    }
    len = (size_t) snprintf(hdr, cap, "{\"__metadata__\":{\"format\":\"pt\"}");
    off = 0;
    for (i = 0; i < w.n; i++) {
        if (cap - len < 512) {
            cap *= 2;
            nh = realloc(hdr, cap);
            if (nh == NULL) {
                fprintf(stderr, "write_checkpoint: out of memory\n");
                return 1;
            }
            hdr = nh;
        }
        len += (size_t) snprintf(hdr + len, cap - len,
                                 ",\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                                 w.t[i].name, st_dtype(w.t[i].dtype));
        for (d = 0; d < w.t[i].ndim; d++) {
            len += (size_t) snprintf(hdr + len, cap - len, "%s%" PRId64,
                                     d ? "," : "", w.t[i].shape[d]);
        }
        len += (size_t) snprintf(hdr + len, cap - len,
                                 "],\"data_offsets\":[%zu,%zu]}", off,
                                 off + w.t[i].bytes);
        off += w.t[i].bytes;
    }
    total = off;
    hdr[len++] = '}';
    while (len % 8 != 0) {
        hdr[len++] = ' ';
    }

    snprintf(path, sizeof(path), "%s/model.safetensors", argv[2]);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    hl = len;
    if (fd < 0 || write_full(fd, &hl, 8) != 0
        || write_full(fd, hdr, len) != 0)
    {
        fprintf(stderr, "write_checkpoint: %s: %s\n", path, strerror(errno));
        return 1;
    }
    for (i = 0; i < w.n; i++) {
        if (write_full(fd, w.t[i].data, w.t[i].bytes) != 0) {
            fprintf(stderr, "write_checkpoint: %s: %s\n", path,
                    strerror(errno));
            return 1;
        }
    }
    if (close(fd) != 0) {
        fprintf(stderr, "write_checkpoint: %s: %s\n", path, strerror(errno));
        return 1;
    }

    printf("write_checkpoint: %s: %d tensors, %.2f GB (%s), generated in "
           "%.1f s, written in %.1f s\n", argv[2], w.n, (double) total / 1e9,
           msv_dtype_name(cfg.dtype), t1 - t0, now_s() - t1);
    free(hdr);
    msv_weights_free(&w);
    return 0;
}
