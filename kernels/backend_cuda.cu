/*
 * backend_cuda.cu: the CUDA backend (struct msv_backend_ops).
 *
 * Weights are uploaded at create: matrices stay bf16 when the
 * checkpoint tensor is bf16 and become fp32 otherwise (fp32 as is, fp16
 * widened); norms and biases are fp32.  q/k/v and gate/up are fused into
 * one matrix each.  A weight update builds a second copy the same way,
 * on a stream of its own while steps go on, and swaps it in between two
 * steps (stage_weights, commit_weights).  The residual stream and every
 * intermediate are fp32; products with bf16 weights read the activations
 * rounded to bf16 (the default precision) or split into bf16 hi + lo
 * (MSV_ACT_BF16X2, MSV_CUDA_ACT=split).  KV is in pages of MSV_KV_BLOCK tokens, bf16 by
 * default and fp32 in split precision; the page ids come from the
 * batch's page tables (worker/kv.h).
 */

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "log.h"
#include "model.h"
#include "backend_cuda.h"
#include "cuda_common.cuh"
#include "norm.cuh"
#include "rope.cuh"
#include "attention.cuh"
#include "elementwise.cuh"
#include "gemm.cuh"
#include "sampling.h"

#define MSV_LM_CHUNK     512           /* logits rows per lm_head product */
#define MSV_ALIGN_TOKENS 64            /* scratch grows in these steps */
#define MSV_UPLOAD_CHUNK (1u << 22)    /* elements converted at a time */
#define MSV_PART_MAX     (64u << 20)   /* floats of attention workspace */
#define MSV_MAX_GRAPHS   64            /* captured decode steps kept */
#define MSV_CUBLAS_WS    (32u << 20)   /* cuBLAS workspace, fixed for graphs */
#define MSV_TM_EVENTS    1024          /* timing marks of one step */

/* timing categories */
#define MSV_TM_GEMM      0
#define MSV_TM_ATTN      1
#define MSV_TM_OTHER     2             /* the sum of the four below */
#define MSV_TM_COPY      3
#define MSV_TM_NORM      4             /* RMSNorm */
#define MSV_TM_ROPE      5             /* q/k norm + RoPE + KV store */
#define MSV_TM_SILU      6             /* SiLU(gate) * up */
#define MSV_TM_EMBED     7             /* the embedding gather */
#define MSV_TM_CATS      8

struct msv_cuda_graph {
    uint32_t          cap;             /* tokens, padded */
    uint32_t          max_ctx;         /* context bound of the attention */
    int               dev;             /* logits into the sampler's rows */
    cudaGraphExec_t   exec;
};

struct msv_cuda_layer {
    float            *attn_norm;       /* [hidden] */
    float            *ffn_norm;        /* [hidden] */
    float            *q_norm;          /* [head_dim], Qwen3, else NULL */
    float            *k_norm;
    float            *qkv_bias;        /* [(nh + 2 nkv) hd], Qwen2 */
    struct msv_dmat   qkv;             /* [(nh + 2 nkv) hd][hidden] */
    struct msv_dmat   o;               /* [hidden][nh hd] */
    struct msv_dmat   gate_up;         /* [2 inter][hidden] */
    struct msv_dmat   down;            /* [hidden][inter] */
};

/* Device allocations freed together. */
struct msv_cuda_allocs {
    void                    **p;
    int                       n;
    int                       cap;
    size_t                    bytes;           /* their sum */
    int                       oom;             /* one failed for lack of
                                                  device memory */
};

/*
 * One copy of the weights on the device: what create uploads, and what
 * stage_weights builds beside the copy in use.  The backend serves from
 * the fields of the same names in struct msv_backend; commit swaps them.
 */
struct msv_cuda_wset {
    void                     *embed;
    int                       embed_dtype;
    struct msv_dmat           lm_head;
    float                    *final_norm;
    struct msv_cuda_layer    *layers;
    struct msv_cuda_allocs    mem;
};

/*
 * Host-to-device copies of a weight upload, on a stream of their own:
 * two page-locked buffers, one filled (copied or converted from the
 * checkpoint's mapping) while the other's copy runs.  ev[i]: the copy
 * out of pin[i] is done.
 */
struct msv_cuda_stager {
    cudaStream_t              stream;
    void                     *pin[2];
    cudaEvent_t               ev[2];
    int                       cur;
};

struct msv_backend {
    struct msv_model_config   cfg;
    uint32_t                  max_seqs;
    uint32_t                  max_len;
    int                       split;   /* bf16 products read hi + lo */
    int                       invariant;   /* --batch-invariant */
    struct msv_gemm_inv       inv;     /* its pinned algorithms */
    const struct msv_gemm_inv *pin;    /* &inv when invariant, else NULL */
    int                       attn_mode;  /* MSV_ATTN_AUTO, _FOLD, _PARALLEL */
    int                       attn_stages; /* 0 (by the grid), 2, 3, 4 */
    int                       tiled;   /* prefill runs by the tiled
                                          attention (not when invariant) */
    int                       gu_bf16; /* gate/up product written bf16
                                          (bf16 precision, cuBLAS sizes) */
    int                       pdl;     /* programmatic launches allowed */
    size_t                    pf_cap;  /* MSV_CUDA_PREFETCH, bytes */
    int                       pf_on;   /* this pass asks weights into L2 */
    cudaStream_t              stream;
    cublasHandle_t            cublas;

    void                     *embed;   /* [vocab][hidden] */
    int                       embed_dtype;
    struct msv_dmat           lm_head; /* may share embed's memory */
    float                    *final_norm;
    float                    *inv_freq;        /* [head_dim / 2] */
    struct msv_cuda_layer    *layers;

    /* KV: [layer][k, v][page][kv head][MSV_KV_BLOCK][head_dim], bf16
     * (kv_bf16) or fp32 */
    void                     *kv;
    int                       kv_bf16;
    uint32_t                  n_pages;         /* pages sequences can own */
    uint32_t                  n_pages_alloc;   /* + the pad page */
    size_t                    page_elems;
    uint32_t                  pages_per_seq;
    uint32_t                 *seq_stamp;       /* duplicate check */
    uint32_t                  stamp;

    /* scratch for cap_tokens tokens, grown on demand */
    uint32_t                  cap_tokens;
    float                    *x;               /* [T][hidden] residual */
    float                    *qkv;             /* [T][(nh + 2 nkv) hd] */
    float                    *gu;              /* [T][2 inter] */
    void                     *act;             /* [T][max in] x 4 bytes */
    float                    *tmp;             /* BF16X2 products */
    float                    *logits;          /* [chunk][vocab] */
    float                    *part;            /* attention splits */
    size_t                    part_floats;

    /* sampling on the device: logits of every row stay there */
    struct msv_gsampler      *gs;
    float                    *dlogits;         /* [max_seqs][vocab] */

    /* batch description, pinned host copy and device copy (int32) */
    int32_t                  *meta_h;
    int32_t                  *meta_d;
    size_t                    meta_cap;

    /* decode steps as CUDA graphs */
    int                       use_graphs;
    uint32_t                  graph_cap;       /* largest padded batch */
    struct msv_cuda_graph     graphs[MSV_MAX_GRAPHS];
    int                       n_graphs;
    void                     *cublas_ws;

    /* MSV_CUDA_TIMING: a line per forward */
    FILE                     *tm_file;
    uint32_t                  tm_detail;       /* every tm_detail-th step */
    int                       tm_on;           /* this step: marks */
    cudaEvent_t               tm_start, tm_end;
    cudaEvent_t               tm_ev[MSV_TM_EVENTS];
    int                       tm_cat[MSV_TM_EVENTS];
    int                       tm_n;
    uint64_t                  tm_step;
    uint64_t                  tm_last_out;
    int                       tm_pend;         /* a forward's line waits */
    uint32_t                  tm_p_seqs, tm_p_T, tm_p_ctx;
    uint64_t                  tm_p_in, tm_p_launch;
    int                       tm_p_graph;

    /* a forward whose logits stay on the device returns once launched:
     * b->stream has not been waited on since (the sampler's run, which
     * the scheduler calls next on the same stream, waits on it) */
    int                       unsynced;

    /* device allocations other than the weights (KV, workspaces) */
    struct msv_cuda_allocs    allocs;

    /* the weights in use: embed ... layers above live in wmem */
    struct msv_cuda_allocs    wmem;
    int                       device;          /* for the update thread */
    struct msv_cuda_stager    up;              /* uploads of weights */
};


static void msv_cuda_destroy(struct msv_backend *b);
static void msv_cuda_drop_graphs(struct msv_backend *b);
static uint32_t msv_cuda_bucket(uint32_t n);


static uint64_t
msv_cuda_now_ns(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}


static int
msv_cuda_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list  ap;

    if (err != NULL && errlen > 0) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}


/* cudaMalloc that remembers the pointer in a (freed together). */
static int
msv_cuda_alloc_in(struct msv_cuda_allocs *a, void **p, size_t bytes,
    const char *what, char *err, size_t errlen)
{
    void        **na;
    cudaError_t   e;

    if (a->n == a->cap) {
        na = (void **) realloc(a->p, (a->cap * 2 + 16) * sizeof(void *));
        if (na == NULL) {
            return msv_cuda_err(err, errlen, "cuda: out of host memory");
        }
        a->p = na;
        a->cap = a->cap * 2 + 16;
    }

    e = cudaMalloc(p, bytes > 0 ? bytes : 1);
    if (e != cudaSuccess) {
        *p = NULL;
        (void) cudaGetLastError();     /* not sticky: clear it here */
        a->oom = a->oom || e == cudaErrorMemoryAllocation;
        return msv_cuda_err(err, errlen,
                            "cuda: allocating %s (%.1f MiB): %s", what,
                            (double) bytes / (1 << 20),
                            cudaGetErrorString(e));
    }
    a->p[a->n++] = *p;
    a->bytes += bytes;
    return 0;
}


static void
msv_cuda_allocs_free(struct msv_cuda_allocs *a)
{
    int  i;

    for (i = 0; i < a->n; i++) {
        cudaFree(a->p[i]);
    }
    free(a->p);
    memset(a, 0, sizeof(*a));
}


/* cudaMalloc that remembers the pointer for destroy. */
static int
msv_cuda_alloc(struct msv_backend *b, void **p, size_t bytes,
    const char *what, char *err, size_t errlen)
{
    return msv_cuda_alloc_in(&b->allocs, p, bytes, what, err, errlen);
}


static const struct msv_tensor *
msv_cuda_tensor(const struct msv_weights *w, const char *name, int ndim,
    int64_t d0, int64_t d1, char *err, size_t errlen)
{
    const struct msv_tensor  *t;

    t = msv_weights_find(w, name);
    if (t == NULL) {
        msv_cuda_err(err, errlen, "cuda: tensor %s: missing", name);
        return NULL;
    }

    if (t->ndim != ndim || t->shape[0] != d0
        || (ndim == 2 && t->shape[1] != d1))
    {
        if (ndim == 2) {
            msv_cuda_err(err, errlen, "cuda: tensor %s: %d-d [%lld, %lld], "
                         "expected [%lld, %lld]", name, t->ndim,
                         (long long) t->shape[0],
                         (long long) (t->ndim > 1 ? t->shape[1] : 0),
                         (long long) d0, (long long) d1);
        } else {
            msv_cuda_err(err, errlen, "cuda: tensor %s: %d-d [%lld, ...], "
                         "expected [%lld]", name, t->ndim,
                         (long long) t->shape[0], (long long) d0);
        }
        return NULL;
    }

    if (t->dtype != MSV_F32 && t->dtype != MSV_F16 && t->dtype != MSV_BF16) {
        msv_cuda_err(err, errlen, "cuda: tensor %s: unsupported dtype %d",
                     name, t->dtype);
        return NULL;
    }
    return t;
}


/* ---- weight uploads ----------------------------------------------------- */

#define MSV_STAGE_BYTES  (MSV_UPLOAD_CHUNK * sizeof(float))  /* a pin[] */

static void
msv_cuda_stager_free(struct msv_cuda_stager *st)
{
    int  i;

    if (st->stream != NULL) {
        cudaStreamSynchronize(st->stream);
    }
    for (i = 0; i < 2; i++) {
        if (st->ev[i] != NULL) {
            cudaEventDestroy(st->ev[i]);
        }
        if (st->pin[i] != NULL) {
            cudaFreeHost(st->pin[i]);
        }
    }
    if (st->stream != NULL) {
        cudaStreamDestroy(st->stream);
    }
    memset(st, 0, sizeof(*st));
}


static int
msv_cuda_stager_init(struct msv_cuda_stager *st, char *err, size_t errlen)
{
    int  i;

    memset(st, 0, sizeof(*st));
    MSV_CUDA_TRY(cudaStreamCreateWithFlags(&st->stream,
                                           cudaStreamNonBlocking),
                 err, errlen);
    for (i = 0; i < 2; i++) {
        MSV_CUDA_TRY(cudaEventCreateWithFlags(&st->ev[i],
                                              cudaEventDisableTiming),
                     err, errlen);
        MSV_CUDA_TRY(cudaHostAlloc(&st->pin[i], MSV_STAGE_BYTES,
                                   cudaHostAllocDefault), err, errlen);
    }
    return 0;
}


/* The next page-locked buffer, once the copy that last read it is done. */
static void *
msv_cuda_stager_next(struct msv_cuda_stager *st, char *err, size_t errlen)
{
    cudaError_t  e;

    e = cudaEventSynchronize(st->ev[st->cur]);
    if (e != cudaSuccess) {
        msv_cuda_fail(err, errlen, "cudaEventSynchronize", __FILE__,
                      __LINE__, e);
        return NULL;
    }
    return st->pin[st->cur];
}


/* Queue the copy of k bytes of the current buffer to dst; switch. */
static int
msv_cuda_stager_send(struct msv_cuda_stager *st, void *dst, size_t k,
    char *err, size_t errlen)
{
    MSV_CUDA_TRY(cudaMemcpyAsync(dst, st->pin[st->cur], k,
                                 cudaMemcpyHostToDevice, st->stream),
                 err, errlen);
    MSV_CUDA_TRY(cudaEventRecord(st->ev[st->cur], st->stream), err, errlen);
    st->cur ^= 1;
    return 0;
}


/* Copy bytes from host src to dst as they are. */
static int
msv_cuda_put(struct msv_cuda_stager *st, void *dst, const void *src,
    size_t bytes, char *err, size_t errlen)
{
    size_t  off, k;
    void   *pin;

    for (off = 0; off < bytes; off += k) {
        k = bytes - off < MSV_STAGE_BYTES ? bytes - off : MSV_STAGE_BYTES;
        pin = msv_cuda_stager_next(st, err, errlen);
        if (pin == NULL) {
            return -1;
        }
        memcpy(pin, (const char *) src + off, k);
        if (msv_cuda_stager_send(st, (char *) dst + off, k, err, errlen)
            != 0)
        {
            return -1;
        }
    }
    return 0;
}


/* Copy the n elements of t to dst as fp32. */
static int
msv_cuda_put_f32(struct msv_cuda_stager *st, const struct msv_tensor *t,
    float *dst, size_t n, char *err, size_t errlen)
{
    size_t  off, k;
    void   *pin;

    if (t->dtype == MSV_F32) {
        return msv_cuda_put(st, dst, t->data, n * sizeof(float), err, errlen);
    }

    for (off = 0; off < n; off += k) {
        k = n - off < MSV_UPLOAD_CHUNK ? n - off : MSV_UPLOAD_CHUNK;
        pin = msv_cuda_stager_next(st, err, errlen);
        if (pin == NULL) {
            return -1;
        }
        msv_tensor_to_f32(t, off, k, (float *) pin);
        if (msv_cuda_stager_send(st, dst + off, k * sizeof(float), err,
                                 errlen) != 0)
        {
            return -1;
        }
    }
    return 0;
}


/*
 * Upload the 2-d tensors names[0..n) (rows[i] x cols each) stacked into
 * one device matrix: bf16 when every part is bf16, fp32 otherwise.
 * want: 0, or the dtype the matrix must get (that of the copy in use).
 */
static int
msv_cuda_upload_mat(struct msv_cuda_wset *ws, struct msv_cuda_stager *st,
    const struct msv_weights *w, const char *const *names,
    const uint32_t *rows, int n, uint32_t cols, int want,
    struct msv_dmat *m, char *err, size_t errlen)
{
    const struct msv_tensor  *t[4];
    uint32_t                  total;
    size_t                    esz, off;
    int                       i, all_bf16;

    total = 0;
    all_bf16 = 1;
    for (i = 0; i < n; i++) {
        t[i] = msv_cuda_tensor(w, names[i], 2, rows[i], cols, err, errlen);
        if (t[i] == NULL) {
            return -1;
        }
        all_bf16 = all_bf16 && t[i]->dtype == MSV_BF16;
        total += rows[i];
    }

    m->dtype = all_bf16 ? MSV_BF16 : MSV_F32;
    m->rows = total;
    m->cols = cols;
    esz = all_bf16 ? 2 : 4;

    if (want != 0 && m->dtype != want) {
        return msv_cuda_err(err, errlen, "cuda: tensor %s: becomes %s on "
                            "the device, the model served has %s", names[0],
                            msv_dtype_name(m->dtype), msv_dtype_name(want));
    }

    if (msv_cuda_alloc_in(&ws->mem, &m->p, (size_t) total * cols * esz,
                          names[0], err, errlen) != 0)
    {
        return -1;
    }

    off = 0;
    for (i = 0; i < n; i++) {
        if (all_bf16) {
            if (msv_cuda_put(st, (char *) m->p + off * esz, t[i]->data,
                             (size_t) rows[i] * cols * esz, err, errlen)
                != 0)
            {
                return -1;
            }
        } else if (msv_cuda_put_f32(st, t[i], (float *) m->p + off,
                                    (size_t) rows[i] * cols, err, errlen)
                   != 0)
        {
            return -1;
        }
        off += (size_t) rows[i] * cols;
    }
    return 0;
}


/* Upload 1-d tensors names[0..n) (len[i] each), concatenated, as fp32. */
static int
msv_cuda_upload_vec(struct msv_cuda_wset *ws, struct msv_cuda_stager *st,
    const struct msv_weights *w, const char *const *names,
    const uint32_t *len, int n, float **out, char *err, size_t errlen)
{
    const struct msv_tensor  *t[4];
    size_t                    total, off;
    int                       i;

    total = 0;
    for (i = 0; i < n; i++) {
        t[i] = msv_cuda_tensor(w, names[i], 1, len[i], 0, err, errlen);
        if (t[i] == NULL) {
            return -1;
        }
        total += len[i];
    }

    if (msv_cuda_alloc_in(&ws->mem, (void **) out, total * sizeof(float),
                          names[0], err, errlen) != 0)
    {
        return -1;
    }

    off = 0;
    for (i = 0; i < n; i++) {
        if (msv_cuda_put_f32(st, t[i], *out + off, len[i], err, errlen)
            != 0)
        {
            return -1;
        }
        off += len[i];
    }
    return 0;
}


/*
 * RoPE inverse frequencies as Hugging Face computes them in fp32:
 * 1 / theta^(2i / d), then the llama3 or linear scaling.
 */
static void
msv_cuda_inv_freq(const struct msv_model_config *c, float *out)
{
    uint32_t  i, half;
    double    inv, wl, lo_wl, hi_wl, sm, pi;

    pi = 3.14159265358979323846;
    half = c->head_dim / 2;

    for (i = 0; i < half; i++) {
        inv = 1.0 / pow((double) c->rope_theta,
                        (double) ((float) (2 * i) / (float) c->head_dim));
        inv = (double) (float) inv;

        if (c->rope_type == MSV_ROPE_LINEAR) {
            inv /= c->rope_factor;

        } else if (c->rope_type == MSV_ROPE_LLAMA3) {
            lo_wl = c->rope_orig_max_pos / (double) c->rope_low_freq_factor;
            hi_wl = c->rope_orig_max_pos / (double) c->rope_high_freq_factor;
            wl = 2.0 * pi / inv;
            if (wl > lo_wl) {
                inv /= c->rope_factor;
            } else if (!(wl < hi_wl)) {
                sm = (c->rope_orig_max_pos / wl - c->rope_low_freq_factor)
                     / (c->rope_high_freq_factor - c->rope_low_freq_factor);
                inv = (1.0 - sm) * inv / c->rope_factor + sm * inv;
            }
        }
        out[i] = (float) inv;
    }
}


static int
msv_cuda_check_config(const struct msv_model_config *c, uint32_t max_seqs,
    uint32_t max_len, char *err, size_t errlen)
{
    if (c->arch != MSV_ARCH_LLAMA && c->arch != MSV_ARCH_QWEN2
        && c->arch != MSV_ARCH_QWEN3)
    {
        return msv_cuda_err(err, errlen, "cuda: config: unknown arch %d",
                            c->arch);
    }
    if (c->vocab_size == 0 || c->hidden == 0 || c->intermediate == 0
        || c->n_layers == 0 || c->n_heads == 0 || c->n_kv_heads == 0)
    {
        return msv_cuda_err(err, errlen, "cuda: config: vocab_size, "
                            "hidden_size, intermediate_size, layers and "
                            "heads must be positive");
    }
    if (c->n_heads % c->n_kv_heads != 0) {
        return msv_cuda_err(err, errlen, "cuda: config: num_attention_heads "
                            "%u is not a multiple of num_key_value_heads %u",
                            c->n_heads, c->n_kv_heads);
    }
    if (c->head_dim == 0 || c->head_dim % 2 != 0
        || c->head_dim > MSV_ATTN_MAX_HEAD_DIM)
    {
        return msv_cuda_err(err, errlen, "cuda: config: head_dim %u: must "
                            "be even and at most %d", c->head_dim,
                            MSV_ATTN_MAX_HEAD_DIM);
    }
    if (c->rope_theta <= 0.0f) {
        return msv_cuda_err(err, errlen, "cuda: config: rope_theta %g must "
                            "be positive", (double) c->rope_theta);
    }
    if ((c->rope_type == MSV_ROPE_LINEAR || c->rope_type == MSV_ROPE_LLAMA3)
        && !(c->rope_factor > 0.0f))
    {
        return msv_cuda_err(err, errlen, "cuda: config: rope_scaling.factor "
                            "must be positive");
    }
    if (c->rope_type == MSV_ROPE_LLAMA3
        && (!(c->rope_low_freq_factor > 0.0f)
            || c->rope_high_freq_factor <= c->rope_low_freq_factor
            || c->rope_orig_max_pos == 0))
    {
        return msv_cuda_err(err, errlen, "cuda: config: llama3 rope_scaling "
                            "needs 0 < low_freq_factor < high_freq_factor and "
                            "original_max_position_embeddings");
    }
    if (c->rope_type != MSV_ROPE_DEFAULT && c->rope_type != MSV_ROPE_LINEAR
        && c->rope_type != MSV_ROPE_LLAMA3)
    {
        return msv_cuda_err(err, errlen, "cuda: config: unknown rope type %d",
                            c->rope_type);
    }
    if (max_seqs == 0 || max_len == 0) {
        return msv_cuda_err(err, errlen, "cuda: max_seqs and max_len must be "
                            "positive");
    }
    if ((uint64_t) c->vocab_size * c->hidden > (uint64_t) INT32_MAX * 16
        || (uint64_t) c->hidden > INT32_MAX / 4
        || (uint64_t) c->intermediate > INT32_MAX / 4)
    {
        return msv_cuda_err(err, errlen, "cuda: config: dimensions too large");
    }
    return 0;
}


static void
msv_cuda_weights_free(struct msv_cuda_wset *ws)
{
    msv_cuda_allocs_free(&ws->mem);
    free(ws->layers);
    memset(ws, 0, sizeof(*ws));
}


/* Exchange the weights b serves from with ws. */
static void
msv_cuda_weights_swap(struct msv_backend *b, struct msv_cuda_wset *ws)
{
    struct msv_cuda_wset  t;

    t.embed = b->embed;
    t.embed_dtype = b->embed_dtype;
    t.lm_head = b->lm_head;
    t.final_norm = b->final_norm;
    t.layers = b->layers;
    t.mem = b->wmem;

    b->embed = ws->embed;
    b->embed_dtype = ws->embed_dtype;
    b->lm_head = ws->lm_head;
    b->final_norm = ws->final_norm;
    b->layers = ws->layers;
    b->wmem = ws->mem;

    *ws = t;
}


/*
 * Build a copy of the weights for config c from the host tensors w into
 * ws (zeroed by the caller): every tensor checked against c (a wrong
 * shape is refused naming the tensor), matrices fused and converted as
 * the file comment says, copied through st, whose stream is synchronized
 * before returning.  like: NULL, or the copy in use, whose device dtypes
 * the new one must have.  0, or -1 with err set; ws then holds what was
 * allocated (msv_cuda_weights_free, after st's stream is synchronized).
 */
static int
msv_cuda_weights_build(const struct msv_model_config *c,
    const struct msv_weights *w, struct msv_cuda_stager *st,
    const struct msv_backend *like, struct msv_cuda_wset *ws, char *err,
    size_t errlen)
{
    const struct msv_cuda_layer  *K;
    struct msv_cuda_layer        *L;
    char                          nm[8][160];
    const char                   *names[4];
    uint32_t                      rows[4], q, kv, i;

    ws->layers = (struct msv_cuda_layer *) calloc(c->n_layers,
                                                  sizeof(*ws->layers));
    if (ws->layers == NULL) {
        return msv_cuda_err(err, errlen, "cuda: out of host memory");
    }

#define MSV_WANT(f)  (like != NULL ? (f) : 0)

    /* embeddings (also the lm_head when tied), lm_head, final norm */
    names[0] = "model.embed_tokens.weight";
    rows[0] = c->vocab_size;
    if (msv_cuda_upload_mat(ws, st, w, names, rows, 1, c->hidden,
                            MSV_WANT(like->embed_dtype), &ws->lm_head, err,
                            errlen) != 0)
    {
        return -1;
    }
    ws->embed = ws->lm_head.p;
    ws->embed_dtype = ws->lm_head.dtype;

    if (!c->tie_embeddings) {
        names[0] = "lm_head.weight";
        if (msv_cuda_upload_mat(ws, st, w, names, rows, 1, c->hidden,
                                MSV_WANT(like->lm_head.dtype), &ws->lm_head,
                                err, errlen) != 0)
        {
            return -1;
        }
    }

    names[0] = "model.norm.weight";
    rows[0] = c->hidden;
    if (msv_cuda_upload_vec(ws, st, w, names, rows, 1, &ws->final_norm, err,
                            errlen) != 0)
    {
        return -1;
    }

    q = c->n_heads * c->head_dim;
    kv = c->n_kv_heads * c->head_dim;

    for (i = 0; i < c->n_layers; i++) {
        L = &ws->layers[i];
        K = like != NULL ? &like->layers[i] : NULL;

#define MSV_NAME(k, s)                                                       \
        snprintf(nm[k], sizeof(nm[k]), "model.layers.%u.%s", i, s)

        MSV_NAME(0, "self_attn.q_proj.weight");
        MSV_NAME(1, "self_attn.k_proj.weight");
        MSV_NAME(2, "self_attn.v_proj.weight");
        names[0] = nm[0]; names[1] = nm[1]; names[2] = nm[2];
        rows[0] = q; rows[1] = kv; rows[2] = kv;
        if (msv_cuda_upload_mat(ws, st, w, names, rows, 3, c->hidden,
                                MSV_WANT(K->qkv.dtype), &L->qkv, err, errlen)
            != 0)
        {
            return -1;
        }

        MSV_NAME(0, "self_attn.o_proj.weight");
        names[0] = nm[0];
        rows[0] = c->hidden;
        if (msv_cuda_upload_mat(ws, st, w, names, rows, 1, q,
                                MSV_WANT(K->o.dtype), &L->o, err, errlen)
            != 0)
        {
            return -1;
        }

        MSV_NAME(0, "mlp.gate_proj.weight");
        MSV_NAME(1, "mlp.up_proj.weight");
        names[0] = nm[0]; names[1] = nm[1];
        rows[0] = c->intermediate; rows[1] = c->intermediate;
        if (msv_cuda_upload_mat(ws, st, w, names, rows, 2, c->hidden,
                                MSV_WANT(K->gate_up.dtype), &L->gate_up, err,
                                errlen) != 0)
        {
            return -1;
        }

        MSV_NAME(0, "mlp.down_proj.weight");
        names[0] = nm[0];
        rows[0] = c->hidden;
        if (msv_cuda_upload_mat(ws, st, w, names, rows, 1, c->intermediate,
                                MSV_WANT(K->down.dtype), &L->down, err,
                                errlen) != 0)
        {
            return -1;
        }

        MSV_NAME(0, "input_layernorm.weight");
        names[0] = nm[0];
        rows[0] = c->hidden;
        if (msv_cuda_upload_vec(ws, st, w, names, rows, 1, &L->attn_norm,
                                err, errlen) != 0)
        {
            return -1;
        }

        MSV_NAME(0, "post_attention_layernorm.weight");
        if (msv_cuda_upload_vec(ws, st, w, names, rows, 1, &L->ffn_norm,
                                err, errlen) != 0)
        {
            return -1;
        }

        if (c->qk_norm) {
            MSV_NAME(0, "self_attn.q_norm.weight");
            rows[0] = c->head_dim;
            if (msv_cuda_upload_vec(ws, st, w, names, rows, 1, &L->q_norm,
                                    err, errlen) != 0)
            {
                return -1;
            }
            MSV_NAME(0, "self_attn.k_norm.weight");
            if (msv_cuda_upload_vec(ws, st, w, names, rows, 1, &L->k_norm,
                                    err, errlen) != 0)
            {
                return -1;
            }
        }

        if (c->qkv_bias) {
            MSV_NAME(0, "self_attn.q_proj.bias");
            MSV_NAME(1, "self_attn.k_proj.bias");
            MSV_NAME(2, "self_attn.v_proj.bias");
            names[0] = nm[0]; names[1] = nm[1]; names[2] = nm[2];
            rows[0] = q; rows[1] = kv; rows[2] = kv;
            if (msv_cuda_upload_vec(ws, st, w, names, rows, 3, &L->qkv_bias,
                                    err, errlen) != 0)
            {
                return -1;
            }
        }
#undef MSV_NAME
    }
#undef MSV_WANT

    MSV_CUDA_TRY(cudaStreamSynchronize(st->stream), err, errlen);
    return 0;
}


/* The weights b serves from, uploaded at create. */
static int
msv_cuda_upload(struct msv_backend *b, const struct msv_weights *w,
    char *err, size_t errlen)
{
    struct msv_cuda_wset  ws;

    memset(&ws, 0, sizeof(ws));
    if (msv_cuda_weights_build(&b->cfg, w, &b->up, NULL, &ws, err, errlen)
        != 0)
    {
        cudaStreamSynchronize(b->up.stream);    /* no copy into ws left */
        msv_cuda_weights_free(&ws);
        return -1;
    }
    msv_cuda_weights_swap(b, &ws);     /* b held none: ws is empty now */
    msv_cuda_weights_free(&ws);
    return 0;
}


/* RoPE's inverse frequencies, from the config alone. */
static int
msv_cuda_upload_inv_freq(struct msv_backend *b, char *err, size_t errlen)
{
    float   *inv;
    size_t   bytes;

    bytes = b->cfg.head_dim / 2 * sizeof(float);
    inv = (float *) malloc(bytes);
    if (inv == NULL) {
        return msv_cuda_err(err, errlen, "cuda: out of host memory");
    }
    msv_cuda_inv_freq(&b->cfg, inv);
    if (msv_cuda_alloc(b, (void **) &b->inv_freq, bytes, "inv_freq", err,
                       errlen) != 0)
    {
        free(inv);
        return -1;
    }
    if (cudaMemcpy(b->inv_freq, inv, bytes, cudaMemcpyHostToDevice)
        != cudaSuccess)
    {
        free(inv);
        return msv_cuda_err(err, errlen, "cuda: uploading inv_freq failed");
    }
    free(inv);
    return 0;
}


/*
 * kv_tokens 0: as many pages as fit in msv_cuda_memory_fraction() of the
 * device's memory, less what the weights already use and
 * MSV_CUDA_KV_HEADROOM for the scratch that grows with the batch; never
 * more than max_seqs * max_len tokens.  Page ids are handed out by the
 * caller's allocator (worker/kv.h).
 */
#define MSV_CUDA_KV_HEADROOM  ((size_t) 2 << 30)

static int
msv_cuda_init_kv(struct msv_backend *b, uint64_t kv_tokens, char *err,
    size_t errlen)
{
    const struct msv_model_config  *c = &b->cfg;
    uint64_t                        pages, cap;
    size_t                          bytes, page_bytes, dev_free, dev_total;
    double                          budget;

    b->pages_per_seq = MSV_CEIL_DIV(b->max_len, MSV_KV_BLOCK);
    b->page_elems = (size_t) c->n_kv_heads * MSV_KV_BLOCK * c->head_dim;
    b->kv_bf16 = !b->split;
    page_bytes = (size_t) c->n_layers * 2 * b->page_elems
                 * (b->kv_bf16 ? 2 : 4);
    cap = (uint64_t) b->max_seqs * b->pages_per_seq;

    if (kv_tokens != 0) {
        pages = MSV_CEIL_DIV(kv_tokens, (uint64_t) MSV_KV_BLOCK);
    } else {
        MSV_CUDA_TRY(cudaMemGetInfo(&dev_free, &dev_total), err, errlen);
        budget = msv_cuda_memory_fraction() * (double) dev_total
                 - (double) (dev_total - dev_free)
                 - (double) MSV_CUDA_KV_HEADROOM;
        pages = budget > 0 ? (uint64_t) (budget / (double) page_bytes) : 0;
        pages = pages > 0 ? pages - 1 : 0;      /* the pad page below */
        if (pages > cap) {
            pages = cap;
        }
        if (pages == 0) {
            return msv_cuda_err(err, errlen, "cuda: no room for the KV "
                                "cache in %.2f of %zu MiB (%zu MiB in use)",
                                msv_cuda_memory_fraction(), dev_total >> 20,
                                (dev_total - dev_free) >> 20);
        }
    }
    if (pages == 0 || pages > INT32_MAX) {
        return msv_cuda_err(err, errlen, "cuda: kv_tokens %llu: too many "
                            "pages", (unsigned long long) kv_tokens);
    }
    b->n_pages = (uint32_t) pages;

    /* one more page than sequences can own: the padding tokens of decode
     * graphs write and read it; zeroed so they compute on numbers */
    b->n_pages_alloc = b->n_pages + 1;
    bytes = (size_t) b->n_pages_alloc * page_bytes;
    if (msv_cuda_alloc(b, (void **) &b->kv, bytes, "the KV cache", err,
                       errlen) != 0)
    {
        return -1;
    }
    MSV_CUDA_TRY(cudaMemset(b->kv, 0, bytes), err, errlen);

    b->seq_stamp = (uint32_t *) calloc(b->max_seqs, sizeof(uint32_t));
    if (b->seq_stamp == NULL) {
        return msv_cuda_err(err, errlen, "cuda: out of host memory for the "
                            "page tables");
    }

    /* the workspace of split attention, for decode batches: up to
     * max_seqs tokens of max_len, capped (larger batches fold) */
    b->part_floats = attention_part_floats(b->max_seqs, c->n_heads,
                                           c->head_dim, b->max_len);
    if (b->part_floats > MSV_PART_MAX) {
        b->part_floats = MSV_PART_MAX;
    }
    if (msv_cuda_alloc(b, (void **) &b->part, b->part_floats * sizeof(float),
                       "the attention workspace", err, errlen) != 0)
    {
        return -1;
    }
    return 0;
}


/* MSV_CUDA_TIMING=FILE: a line per forward appended to FILE;
 * MSV_CUDA_TIMING_DETAIL=N: every N-th step also runs without a graph,
 * with events between launches, and its line gives the GPU time per kind
 * of work. */
static int
msv_cuda_init_timing(struct msv_backend *b, char *err, size_t errlen)
{
    const char  *path, *detail;
    int          i;

    path = getenv("MSV_CUDA_TIMING");
    if (path == NULL || path[0] == '\0') {
        return 0;
    }
    b->tm_file = fopen(path, "a");
    if (b->tm_file == NULL) {
        return msv_cuda_err(err, errlen, "cuda: MSV_CUDA_TIMING=%s: cannot "
                            "open for appending", path);
    }
    setvbuf(b->tm_file, NULL, _IOLBF, 0);
    MSV_CUDA_TRY(cudaEventCreate(&b->tm_start), err, errlen);
    MSV_CUDA_TRY(cudaEventCreate(&b->tm_end), err, errlen);

    detail = getenv("MSV_CUDA_TIMING_DETAIL");
    b->tm_detail = detail != NULL ? (uint32_t) strtoul(detail, NULL, 10) : 0;
    if (b->tm_detail) {
        for (i = 0; i < MSV_TM_EVENTS; i++) {
            MSV_CUDA_TRY(cudaEventCreate(&b->tm_ev[i]), err, errlen);
        }
    }
    return 0;
}


/* Batch invariant: an algorithm pinned for each weight shape of the
 * model (the uploaded weights time the candidates), one log line each.
 * A weight update keeps every shape and dtype (stage_weights), so the
 * plans hold for every copy. */
static int
msv_cuda_pin(struct msv_backend *b, char *err, size_t errlen)
{
    const struct msv_dmat  *m[5];
    char                    line[1024];
    uint32_t                l;
    int                     i, n;

    if (!b->invariant) {
        return 0;
    }
    for (l = 0; l <= b->cfg.n_layers; l++) {
        n = 0;
        if (l < b->cfg.n_layers) {
            m[n++] = &b->layers[l].qkv;
            m[n++] = &b->layers[l].o;
            m[n++] = &b->layers[l].gate_up;
            m[n++] = &b->layers[l].down;
        } else {
            m[n++] = &b->lm_head;
        }
        for (i = 0; i < n; i++) {
            if (gemm_inv_pin(&b->inv, b->cublas, m[i], b->stream, line,
                             sizeof(line), err, errlen) != 0)
            {
                return -1;
            }
            if (line[0] != '\0') {
                msv_info("cuda: %s", line);
            }
        }
    }
    return 0;
}


static struct msv_backend *
msv_cuda_create(const struct msv_model_config *cfg,
    const struct msv_weights *w, uint32_t max_seqs, uint32_t max_len,
    uint64_t kv_tokens, int threads, char *err, size_t errlen)
{
    struct msv_backend  *b;
    const char          *mode;
    int                  n_dev;
    cudaError_t          e;

    if (msv_cuda_check_config(cfg, max_seqs, max_len, err, errlen) != 0) {
        return NULL;
    }
    if (msv_weights_check(cfg, w, err, errlen) != 0) {
        return NULL;
    }

    e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0) {
        msv_cuda_err(err, errlen, "cuda: no usable GPU: %s",
                     e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        return NULL;
    }

    b = (struct msv_backend *) calloc(1, sizeof(*b));
    if (b == NULL) {
        msv_cuda_err(err, errlen, "cuda: out of host memory");
        return NULL;
    }
    b->cfg = *cfg;
    b->max_seqs = max_seqs;
    b->max_len = max_len;

    mode = getenv("MSV_CUDA_ACT");
    if (mode == NULL || mode[0] == '\0' || strcmp(mode, "bf16") == 0) {
        b->split = 0;
    } else if (strcmp(mode, "split") == 0) {
        b->split = 1;
    } else {
        msv_cuda_err(err, errlen, "cuda: MSV_CUDA_ACT=%s: expected \"split\" "
                     "or \"bf16\"", mode);
        goto failed;
    }

    /* MSV_CUDA_INVARIANT=1 (--batch-invariant): every product through
     * one cuBLASLt algorithm pinned per weight shape (gemm.cuh), so a
     * row's logits do not depend on the batch */
    mode = getenv("MSV_CUDA_INVARIANT");
    if (mode != NULL && strcmp(mode, "1") == 0) {
        if (b->split) {
            msv_cuda_err(err, errlen, "cuda: MSV_CUDA_INVARIANT=1 needs the "
                         "bf16 precision, not split");
            goto failed;
        }
        b->invariant = 1;
    } else if (mode != NULL && mode[0] != '\0' && strcmp(mode, "0") != 0) {
        msv_cuda_err(err, errlen, "cuda: MSV_CUDA_INVARIANT=%s: expected 0 "
                     "or 1", mode);
        goto failed;
    }

    /* MSV_CUDA_ATTN=fold|parallel|auto: the decode attention's form
     * (attention.cuh), auto when unset */
    mode = getenv("MSV_CUDA_ATTN");
    b->attn_mode = MSV_ATTN_AUTO;
    if (mode != NULL && strcmp(mode, "fold") == 0) {
        b->attn_mode = MSV_ATTN_FOLD;
    } else if (mode != NULL && strcmp(mode, "parallel") == 0) {
        b->attn_mode = MSV_ATTN_PARALLEL;
    } else if (mode != NULL && mode[0] != '\0' && strcmp(mode, "auto") != 0) {
        msv_cuda_err(err, errlen, "cuda: MSV_CUDA_ATTN=%s: expected fold, "
                     "parallel or auto", mode);
        goto failed;
    }

    /* MSV_CUDA_PREFETCH=MB (0 to 1024, 0 when unset): at batches whose
     * products all take a GEMV, the kernel before each product asks up
     * to MB megabytes of its weight into L2 (msv_cuda_pf) */
    mode = getenv("MSV_CUDA_PREFETCH");
    b->pf_cap = 0;
    if (mode != NULL && mode[0] != '\0') {
        char           *end;
        unsigned long   mb;

        mb = strtoul(mode, &end, 10);
        if (*end != '\0' || mode[0] < '0' || mode[0] > '9' || mb > 1024) {
            msv_cuda_err(err, errlen, "cuda: MSV_CUDA_PREFETCH=%s: expected "
                         "megabytes, 0 to 1024", mode);
            goto failed;
        }
        b->pf_cap = (size_t) mb << 20;
    }

    /* MSV_CUDA_ATTN_STAGES=2|3|4: the decode kernel's K/V stages, chosen
     * by the grid when unset */
    mode = getenv("MSV_CUDA_ATTN_STAGES");
    b->attn_stages = 0;
    if (mode != NULL && mode[0] != '\0') {
        if ((mode[0] < '2' || mode[0] > '4') || mode[1] != '\0') {
            msv_cuda_err(err, errlen, "cuda: MSV_CUDA_ATTN_STAGES=%s: "
                         "expected 2, 3 or 4", mode);
            goto failed;
        }
        b->attn_stages = mode[0] - '0';
    }

    e = cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        b->stream = NULL;
        msv_cuda_fail(err, errlen, "cudaStreamCreate", __FILE__, __LINE__, e);
        goto failed;
    }
    if (cublasCreate(&b->cublas) != CUBLAS_STATUS_SUCCESS) {
        b->cublas = NULL;
        msv_cuda_err(err, errlen, "cublas: cublasCreate failed");
        goto failed;
    }
    if (cublasSetStream(b->cublas, b->stream) != CUBLAS_STATUS_SUCCESS
        || cublasSetMathMode(b->cublas, CUBLAS_DEFAULT_MATH)
           != CUBLAS_STATUS_SUCCESS)
    {
        msv_cuda_err(err, errlen, "cublas: setting stream or math mode "
                     "failed");
        goto failed;
    }

    if (msv_cuda_alloc(b, &b->cublas_ws, MSV_CUBLAS_WS, "the cuBLAS "
                       "workspace", err, errlen) != 0)
    {
        goto failed;
    }
    if (cublasSetWorkspace(b->cublas, b->cublas_ws, MSV_CUBLAS_WS)
        != CUBLAS_STATUS_SUCCESS)
    {
        msv_cuda_err(err, errlen, "cublas: cublasSetWorkspace failed");
        goto failed;
    }

    /* the cuBLASLt products share the workspace: both run on b->stream,
     * one after another */
    if (b->invariant) {
        if (gemm_inv_init(&b->inv, b->cublas_ws, MSV_CUBLAS_WS, err, errlen)
            != 0)
        {
            goto failed;
        }
        b->pin = &b->inv;
    }

    if (msv_cuda_init_timing(b, err, errlen) != 0) {
        goto failed;
    }

    mode = getenv("MSV_CUDA_GRAPHS");
    b->use_graphs = !(mode != NULL && strcmp(mode, "0") == 0);

    /* MSV_CUDA_PDL=0: every kernel launched plainly, none starting
     * before the one ahead of it has finished (cuda_common.cuh); else
     * programmatic launches in batches whose products all take a GEMV
     * (msv_cuda_pdl_for) */
    mode = getenv("MSV_CUDA_PDL");
    b->pdl = !(mode != NULL && strcmp(mode, "0") == 0);

    /* MSV_CUDA_GU_BF16=0: the gate/up product stays fp32 in the bf16
     * precision too (the side-by-side reference of the bf16 product) */
    mode = getenv("MSV_CUDA_GU_BF16");
    b->gu_bf16 = !b->invariant && !(mode != NULL && strcmp(mode, "0") == 0);

    /* MSV_CUDA_TILED=0: prefill runs by the per-token attention too (the
     * side-by-side reference for the tiled kernel) */
    mode = getenv("MSV_CUDA_TILED");
    b->tiled = !b->invariant && !(mode != NULL && strcmp(mode, "0") == 0);
    b->graph_cap = max_seqs < MSV_LM_CHUNK ? msv_cuda_bucket(max_seqs)
                                           : MSV_LM_CHUNK;

    /* the device this thread uses: the update thread sets it too */
    e = cudaGetDevice(&b->device);
    if (e != cudaSuccess) {
        msv_cuda_fail(err, errlen, "cudaGetDevice", __FILE__, __LINE__, e);
        goto failed;
    }
    if (msv_cuda_stager_init(&b->up, err, errlen) != 0
        || msv_cuda_upload(b, w, err, errlen) != 0
        || msv_cuda_pin(b, err, errlen) != 0
        || msv_cuda_upload_inv_freq(b, err, errlen) != 0
        || msv_cuda_init_kv(b, kv_tokens, err, errlen) != 0)
    {
        goto failed;
    }

    e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        msv_cuda_fail(err, errlen, "cudaDeviceSynchronize", __FILE__,
                      __LINE__, e);
        goto failed;
    }
    return b;

failed:
    msv_cuda_destroy(b);
    return NULL;
}


static uint32_t
msv_cuda_kv_pages(struct msv_backend *b, uint32_t *page_tokens)
{
    *page_tokens = MSV_KV_BLOCK;
    return b->n_pages;
}


static void
msv_cuda_free_scratch(struct msv_backend *b)
{
    cudaFree(b->x);
    cudaFree(b->qkv);
    cudaFree(b->gu);
    cudaFree(b->act);
    cudaFree(b->tmp);
    cudaFree(b->logits);
    b->x = b->qkv = b->gu = b->tmp = b->logits = NULL;
    b->act = NULL;
    b->cap_tokens = 0;
}


static int
msv_cuda_scratch(struct msv_backend *b, uint32_t n_tokens, char *err,
    size_t errlen)
{
    const struct msv_model_config  *c = &b->cfg;
    size_t                          T, q, qkv, max_in, max_out, lm, tmp;

    if (n_tokens <= b->cap_tokens) {
        return 0;
    }

    msv_cuda_drop_graphs(b);           /* they hold the old pointers */
    msv_cuda_free_scratch(b);

    T = MSV_CEIL_DIV((size_t) n_tokens, MSV_ALIGN_TOKENS) * MSV_ALIGN_TOKENS;
    q = (size_t) c->n_heads * c->head_dim;
    qkv = q + 2 * (size_t) c->n_kv_heads * c->head_dim;
    max_in = c->hidden;
    max_in = q > max_in ? q : max_in;
    max_in = c->intermediate > max_in ? c->intermediate : max_in;
    max_out = qkv;
    max_out = c->hidden > max_out ? c->hidden : max_out;
    max_out = 2 * (size_t) c->intermediate > max_out
              ? 2 * (size_t) c->intermediate : max_out;
    lm = T < MSV_LM_CHUNK ? T : MSV_LM_CHUNK;
    tmp = 2 * (T * max_out > lm * c->vocab_size ? T * max_out
                                                 : lm * c->vocab_size);

    MSV_CUDA_TRY(cudaMalloc((void **) &b->x, T * c->hidden * sizeof(float)),
                 err, errlen);
    MSV_CUDA_TRY(cudaMalloc((void **) &b->qkv, T * qkv * sizeof(float)),
                 err, errlen);
    MSV_CUDA_TRY(cudaMalloc((void **) &b->gu,
                            T * 2 * c->intermediate * sizeof(float)),
                 err, errlen);
    MSV_CUDA_TRY(cudaMalloc(&b->act, T * max_in * 4), err, errlen);
    if (b->split) {
        MSV_CUDA_TRY(cudaMalloc((void **) &b->tmp, tmp * sizeof(float)),
                     err, errlen);
    }
    MSV_CUDA_TRY(cudaMalloc((void **) &b->logits,
                            lm * c->vocab_size * sizeof(float)),
                 err, errlen);

    b->cap_tokens = (uint32_t) T;
    return 0;
}


static int
msv_cuda_meta(struct msv_backend *b, size_t n, char *err, size_t errlen)
{
    size_t  cap;

    if (n <= b->meta_cap) {
        return 0;
    }

    msv_cuda_drop_graphs(b);
    cudaFreeHost(b->meta_h);
    cudaFree(b->meta_d);
    b->meta_h = NULL;
    b->meta_d = NULL;
    b->meta_cap = 0;

    cap = n + n / 2 + 1024;
    MSV_CUDA_TRY(cudaHostAlloc((void **) &b->meta_h, cap * sizeof(int32_t),
                               cudaHostAllocDefault), err, errlen);
    MSV_CUDA_TRY(cudaMalloc((void **) &b->meta_d, cap * sizeof(int32_t)),
                 err, errlen);
    b->meta_cap = cap;
    return 0;
}


/* ---- per-step timing (MSV_CUDA_TIMING) ---------------------------------- */

/* Close the segment that ends now: GPU time since the last mark goes to
 * category cat.  Only on the steps MSV_CUDA_TIMING_DETAIL picks, which
 * run without a graph. */
static void
msv_cuda_mark(struct msv_backend *b, int cat)
{
    if (!b->tm_on || b->tm_n >= MSV_TM_EVENTS) {
        return;
    }
    if (cudaEventRecord(b->tm_ev[b->tm_n], b->stream) == cudaSuccess) {
        b->tm_cat[b->tm_n++] = cat;
    }
}


/* One line per forward: the batch, host and GPU times, the gap and the
 * breakdown.  gap_ms: from the end of the previous forward to this one's
 * call (the sampler's run and the host's work between).  A forward that
 * waited for the device (async 0) ends when its call returns, and its
 * wall_ms is the call's time.  One that returned once launched (logits
 * on the device: async 1) has its line written once its events are
 * complete (after the sampler's run, or at the next forward or the end),
 * ends at its call + gpu_ms, and its wall_ms is gpu_ms, the device's
 * time for it. */
static void
msv_cuda_timing_line(struct msv_backend *b, uint32_t n_seqs, uint32_t T,
    uint32_t max_ctx, uint64_t t_in, uint64_t t_launch, int graph,
    int async)
{
    double  cat[MSV_TM_CATS], gpu, ms, wall, gap;
    float   f;
    int     i;
    uint64_t  t_out;

    t_out = msv_cuda_now_ns();
    gpu = 0.0;
    memset(cat, 0, sizeof(cat));
    if (cudaEventElapsedTime(&f, b->tm_start, b->tm_end) == cudaSuccess) {
        gpu = f;
    }
    for (i = 1; i < b->tm_n; i++) {
        if (cudaEventElapsedTime(&f, b->tm_ev[i - 1], b->tm_ev[i])
            == cudaSuccess)
        {
            cat[b->tm_cat[i]] += f;
        }
    }
    cat[MSV_TM_OTHER] += cat[MSV_TM_NORM] + cat[MSV_TM_ROPE]
                         + cat[MSV_TM_SILU] + cat[MSV_TM_EMBED];
    ms = 1e-6;
    wall = async ? gpu : (double) (t_out - t_in) * ms;
    gap = b->tm_last_out != 0 && t_in > b->tm_last_out
          ? (double) (t_in - b->tm_last_out) * ms : 0.0;
    fprintf(b->tm_file, "step %llu seqs %u tokens %u max_ctx %u graph %d "
            "detail %d "
            "gap_ms %.4f host_ms %.4f gpu_ms %.4f wall_ms %.4f "
            "gemm_ms %.4f attn_ms %.4f other_ms %.4f copy_ms %.4f "
            "norm_ms %.4f rope_ms %.4f silu_ms %.4f embed_ms %.4f\n",
            (unsigned long long) b->tm_step++, n_seqs, T, max_ctx, graph,
            b->tm_on, gap, (double) (t_launch - t_in) * ms, gpu, wall,
            cat[MSV_TM_GEMM], cat[MSV_TM_ATTN],
            cat[MSV_TM_OTHER], cat[MSV_TM_COPY], cat[MSV_TM_NORM],
            cat[MSV_TM_ROPE], cat[MSV_TM_SILU], cat[MSV_TM_EMBED]);
    b->tm_last_out = async ? t_in + (uint64_t) (gpu * 1e6)
                           : msv_cuda_now_ns();
}


/* The line of a forward that returned once launched, once the stream
 * has been waited on. */
static void
msv_cuda_timing_flush(struct msv_backend *b)
{
    if (b->tm_pend) {
        b->tm_pend = 0;
        msv_cuda_timing_line(b, b->tm_p_seqs, b->tm_p_T, b->tm_p_ctx,
                             b->tm_p_in, b->tm_p_launch, b->tm_p_graph, 1);
    }
}


/* ---- the pass ----------------------------------------------------------- */

/* A step's prefill plan (attention_plan) on the device, in the batch
 * description; n_tiles 0: none. */
struct msv_cuda_plan {
    const int32_t  *tiles;
    uint32_t        n_tiles;
    const int32_t  *rest;
    uint32_t        n_rest;
};


/*
 * Programmatic launches (msv_cuda_pdl) for a pass over n rows: only where
 * every product takes a GEMV (gemv_forward, or in the batch-invariant
 * mode the fixed-order one, where every shape's plan has it), whose
 * weight loads are what overlaps the kernel ahead.  Among cuBLAS products
 * our kernels, started early, held SM slots the products' blocks needed:
 * batch 64 ran 6.35 ms a step against 5.85 with plain launches (batch 1:
 * 4.58 against 4.67, bench/results/engine.md).  Launches never change
 * what a kernel computes, so the invariant mode takes them too.
 */
static void
msv_cuda_pdl_for(struct msv_backend *b, uint32_t n)
{
    int  gemv;

    gemv = b->invariant
           ? n <= MSV_GEMV_FIXED_MAX && gemm_inv_fixed_all(&b->inv)
           : n <= MSV_GEMV_MAX;
    msv_cuda_pdl = b->pdl && gemv;
    b->pf_on = b->pf_cap > 0 && gemv;
}


/*
 * What the kernel ahead of the product of w asks into L2: the first
 * pf_cap bytes of w (all of it if smaller), in passes where every product
 * is a GEMV (msv_cuda_pdl_for), else nothing.  Such a product reads each
 * weight once at the memory's rate, and the kernels between two products
 * (RMSNorm, q/k norm + RoPE, the attention) leave the bus idle: what the
 * prefetch brings in meanwhile, the product reads from L2.
 */
static struct msv_l2pf
msv_cuda_pf(const struct msv_backend *b, const struct msv_dmat *w)
{
    struct msv_l2pf  pf;
    size_t           bytes;

    pf.p = (const char *) w->p;
    pf.bytes = 0;
    if (b->pf_on) {
        bytes = (size_t) w->rows * w->cols * (w->dtype == MSV_BF16 ? 2 : 4);
        pf.bytes = (bytes < b->pf_cap ? bytes : b->pf_cap) / 16 * 16;
    }
    return pf;
}


/* One transformer layer over the batch's n tokens. */
static int
msv_cuda_layer(struct msv_backend *b, uint32_t l, uint32_t n,
    uint32_t max_ctx, const struct msv_kv_map *map,
    const struct msv_cuda_plan *plan, char *err, size_t errlen)
{
    const struct msv_model_config  *c = &b->cfg;
    struct msv_cuda_layer          *L = &b->layers[l];
    struct msv_qkv_args             qa;
    struct msv_attn_args            aa;
    size_t                          kv_bytes;
    int                             f, fd, gu_dtype;

    kv_bytes = (size_t) b->n_pages_alloc * b->page_elems
               * (b->kv_bf16 ? 2 : 4);

    /* attention block */
    f = msv_act_fmt_for(&L->qkv, b->split);
    MSV_CUDA_TRY(rmsnorm_forward(b->act, f, b->x, NULL, L->attn_norm, n,
                                 c->hidden, c->rms_eps,
                                 msv_cuda_pf(b, &L->qkv), b->stream),
                 err, errlen);
    msv_cuda_mark(b, MSV_TM_NORM);
    if (linear_forward(b->cublas, b->pin, &L->qkv, b->act, f, n, b->qkv, 0,
                       b->tmp, b->stream, err, errlen) != 0)
    {
        return -1;
    }
    msv_cuda_mark(b, MSV_TM_GEMM);

    memset(&qa, 0, sizeof(qa));
    qa.qkv = b->qkv;
    qa.n_tokens = n;
    qa.n_heads = c->n_heads;
    qa.n_kv_heads = c->n_kv_heads;
    qa.head_dim = c->head_dim;
    qa.bias = L->qkv_bias;
    qa.q_norm = L->q_norm;
    qa.k_norm = L->k_norm;
    qa.eps = c->rms_eps;
    qa.inv_freq = b->inv_freq;
    qa.kv = *map;
    qa.kv.k_cache = (char *) b->kv + (size_t) l * 2 * kv_bytes;
    qa.kv.v_cache = (char *) qa.kv.k_cache + kv_bytes;
    qa.pf = msv_cuda_pf(b, &L->o);      /* over RoPE and the attention */
    MSV_CUDA_TRY(qkv_rope_forward(&qa, b->stream), err, errlen);
    msv_cuda_mark(b, MSV_TM_ROPE);

    /* attention writes the o product's input format directly */
    f = msv_act_fmt_for(&L->o, b->split);
    memset(&aa, 0, sizeof(aa));
    aa.out = b->act;
    aa.out_fmt = f;
    aa.q = b->qkv;
    aa.q_stride = (c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
    aa.n_tokens = n;
    aa.n_heads = c->n_heads;
    aa.n_kv_heads = c->n_kv_heads;
    aa.head_dim = c->head_dim;
    aa.scale = (float) (1.0 / sqrt((double) c->head_dim));
    aa.kv = qa.kv;
    aa.max_ctx = max_ctx;
    aa.part = b->part;
    aa.part_floats = b->part_floats;
    aa.mode = b->attn_mode;
    aa.stages = b->attn_stages;
    if (aa.mode == MSV_ATTN_PARALLEL
        && attention_part_floats(n, c->n_heads, c->head_dim, max_ctx)
           > b->part_floats)
    {
        aa.mode = MSV_ATTN_FOLD;       /* asked for where it fits */
    }
    /* batch invariant: a token's output must not depend on how its
     * prompt was chunked, so no tiles (there is no plan either) */
    aa.tiles = plan->tiles;
    aa.n_tiles = plan->n_tiles;
    aa.rest = plan->rest;
    aa.n_rest = plan->n_rest;
    aa.tiled = b->invariant ? MSV_ATTN_TILED_OFF : MSV_ATTN_TILED_AUTO;
    MSV_CUDA_TRY(attention_forward(&aa, b->stream), err, errlen);
    msv_cuda_mark(b, MSV_TM_ATTN);

    if (linear_forward(b->cublas, b->pin, &L->o, b->act, f, n, b->x, 1,
                       b->tmp, b->stream, err, errlen) != 0)
    {
        return -1;
    }
    msv_cuda_mark(b, MSV_TM_GEMM);

    /* MLP block */
    f = msv_act_fmt_for(&L->gate_up, b->split);
    MSV_CUDA_TRY(rmsnorm_forward(b->act, f, b->x, NULL, L->ffn_norm, n,
                                 c->hidden, c->rms_eps,
                                 msv_cuda_pf(b, &L->gate_up), b->stream),
                 err, errlen);
    msv_cuda_mark(b, MSV_TM_NORM);
    fd = msv_act_fmt_for(&L->down, b->split);
    if (fd == MSV_ACT_BF16 && L->gate_up.rows == 2 * c->intermediate
        && gemv_silu_usable(&L->gate_up, f, n, b->pin != NULL))
    {
        /* the GEMV takes the batch: SiLU·up in the gate/up product's
         * kernel, bf16 into b->gu, which the down product reads (the
         * same bits as the product, then silu_mul_forward) */
        MSV_CUDA_TRY(gemv_silu_forward(&L->gate_up, b->act, n, b->gu,
                                       b->stream), err, errlen);
        msv_cuda_mark(b, MSV_TM_GEMM);
        if (linear_forward(b->cublas, b->pin, &L->down, b->gu, fd, n, b->x,
                           1, b->tmp, b->stream, err, errlen) != 0)
        {
            return -1;
        }
        msv_cuda_mark(b, MSV_TM_GEMM);
        return 0;
    }
    /* bf16 precision (bf16 weights read as bf16 activations): the
     * product is written bf16 (half the bytes written and read again by
     * SiLU·up), except where the GEMV takes the batch (its sums stay
     * fp32) */
    gu_dtype = b->gu_bf16 && f == MSV_ACT_BF16
               && !gemv_usable(&L->gate_up, f, n, 0)
               ? MSV_BF16 : MSV_F32;
    if (gu_dtype == MSV_BF16
        ? linear_forward_bf16(b->cublas, &L->gate_up, b->act, n, b->gu,
                              err, errlen) != 0
        : linear_forward(b->cublas, b->pin, &L->gate_up, b->act, f, n, b->gu,
                         0, b->tmp, b->stream, err, errlen) != 0)
    {
        return -1;
    }
    msv_cuda_mark(b, MSV_TM_GEMM);

    MSV_CUDA_TRY(silu_mul_forward(b->act, fd, b->gu, gu_dtype, n,
                                  c->intermediate, b->stream), err, errlen);
    msv_cuda_mark(b, MSV_TM_SILU);
    if (linear_forward(b->cublas, b->pin, &L->down, b->act, fd, n, b->x, 1,
                       b->tmp, b->stream, err, errlen) != 0)
    {
        return -1;
    }
    msv_cuda_mark(b, MSV_TM_GEMM);
    return 0;
}


/* Embedding and every layer over n tokens described at meta_d (layout in
 * msv_cuda_forward), plan NULL: no prefill tiles. */
static int
msv_cuda_body(struct msv_backend *b, uint32_t n, uint32_t cap,
    uint32_t max_ctx, const struct msv_cuda_plan *plan, char *err,
    size_t errlen)
{
    const struct msv_model_config  *c = &b->cfg;
    struct msv_kv_map               map;
    struct msv_cuda_plan            none;
    uint32_t                        l;

    if (plan == NULL) {
        memset(&none, 0, sizeof(none));
        plan = &none;
    }
    map.pos = b->meta_d + cap;
    map.tok_seq = b->meta_d + 2 * (size_t) cap;
    map.page_off = b->meta_d + 3 * (size_t) cap;
    map.pages = b->meta_d + 5 * (size_t) cap;
    map.k_cache = NULL;
    map.v_cache = NULL;
    map.kv_bf16 = b->kv_bf16;

    msv_cuda_pdl_for(b, n);
    MSV_CUDA_TRY(embed_forward(b->x, b->embed, b->embed_dtype, b->meta_d, n,
                               c->hidden, b->stream), err, errlen);
    msv_cuda_mark(b, MSV_TM_EMBED);

    for (l = 0; l < c->n_layers; l++) {
        if (msv_cuda_layer(b, l, n, max_ctx, &map, plan, err, errlen) != 0)
        {
            return -1;
        }
    }
    return 0;
}


/* Final norm of rows rows[r0, r0 + rc) (meta_d + 4 cap) and the lm_head
 * product into dst [rc][vocab] (b->logits, or the sampler's rows). */
static int
msv_cuda_head(struct msv_backend *b, uint32_t cap, uint32_t r0, uint32_t rc,
    float *dst, char *err, size_t errlen)
{
    const struct msv_model_config  *c = &b->cfg;
    int                             f;

    msv_cuda_pdl_for(b, rc);
    f = msv_act_fmt_for(&b->lm_head, b->split);
    MSV_CUDA_TRY(rmsnorm_forward(b->act, f, b->x, b->meta_d + 4 * (size_t) cap
                                 + r0, b->final_norm, rc, c->hidden,
                                 c->rms_eps, msv_cuda_pf(b, &b->lm_head),
                                 b->stream),
                 err, errlen);
    msv_cuda_mark(b, MSV_TM_NORM);
    if (linear_forward(b->cublas, b->pin, &b->lm_head, b->act, f, rc, dst,
                       0, b->tmp, b->stream, err, errlen) != 0)
    {
        return -1;
    }
    msv_cuda_mark(b, MSV_TM_GEMM);
    return 0;
}


static void
msv_cuda_drop_graphs(struct msv_backend *b)
{
    int  i;

    for (i = 0; i < b->n_graphs; i++) {
        cudaGraphExecDestroy(b->graphs[i].exec);
    }
    b->n_graphs = 0;
}


/* Decode batches of n tokens run padded to a bucket: powers of two up
 * to 8, then multiples of 16 up to 128, then of 32. */
static uint32_t
msv_cuda_bucket(uint32_t n)
{
    uint32_t  b;

    if (n <= 8) {
        for (b = 1; b < n; b <<= 1) { }
        return b;
    }
    if (n <= 128) {
        return MSV_CEIL_DIV(n, 16u) * 16;
    }
    return MSV_CEIL_DIV(n, 32u) * 32;
}


/*
 * The graph of a decode step over cap tokens whose longest context is at
 * most max_ctx: body and head captured once, replayed after the batch
 * description is copied in.  NULL (and graphs off for good) when the
 * capture fails; the step then runs eagerly.  dev: the lm_head writes
 * the sampler's device rows instead of the chunk copied to the host.
 */
static cudaGraphExec_t
msv_cuda_graph(struct msv_backend *b, uint32_t cap, uint32_t max_ctx, int dev)
{
    cudaGraph_t      g;
    cudaGraphExec_t  x;
    cudaError_t      e;
    char             err[256];
    int              i, rc;

    for (i = 0; i < b->n_graphs; i++) {
        if (b->graphs[i].cap == cap && b->graphs[i].max_ctx == max_ctx
            && b->graphs[i].dev == dev)
        {
            return b->graphs[i].exec;
        }
    }
    if (b->n_graphs == MSV_MAX_GRAPHS) {
        return NULL;
    }

    if (cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal)
        != cudaSuccess)
    {
        (void) cudaGetLastError();
        b->use_graphs = 0;
        return NULL;
    }
    rc = msv_cuda_body(b, cap, cap, max_ctx, NULL, err, sizeof(err));
    if (rc == 0) {
        rc = msv_cuda_head(b, cap, 0, cap, dev ? b->dlogits : b->logits, err,
                           sizeof(err));
    }
    g = NULL;
    e = cudaStreamEndCapture(b->stream, &g);
    x = NULL;
    if (rc != 0 || e != cudaSuccess || g == NULL
        || cudaGraphInstantiate(&x, g, 0) != cudaSuccess)
    {
        if (g != NULL) {
            cudaGraphDestroy(g);
        }
        (void) cudaGetLastError();
        b->use_graphs = 0;
        return NULL;
    }
    cudaGraphDestroy(g);

    b->graphs[b->n_graphs].cap = cap;
    b->graphs[b->n_graphs].max_ctx = max_ctx;
    b->graphs[b->n_graphs].dev = dev;
    b->graphs[b->n_graphs].exec = x;
    b->n_graphs++;
    return x;
}


static int
msv_cuda_forward(struct msv_backend *b, const struct msv_batch *bt,
    float *logits, char *err, size_t errlen)
{
    const struct msv_model_config  *c = &b->cfg;
    uint64_t                        T64, P64, t_in, t_launch;
    uint32_t                        s, seq, n, p0, T, P, R, r0, rc, k, t;
    uint32_t                        np, max_ctx, cap, gctx, decode;
    const uint32_t                 *sp;
    int32_t                        *tok, *pos, *tseq, *poff, *pages, *rows,
                                   *tiles, *rest;
    size_t                          meta_n;
    struct msv_cuda_plan            plan;
    cudaGraphExec_t                 gx;
    int                             tile;
    int                             dev;
    cudaError_t                     e;

    t_in = b->tm_file != NULL ? msv_cuda_now_ns() : 0;

    /* the last forward, if nothing has waited for it: its host buffers
     * (the batch description) are rewritten below */
    if (b->unsynced) {
        b->unsynced = 0;
        e = cudaStreamSynchronize(b->stream);
        if (e == cudaSuccess) {
            e = cudaGetLastError();
        }
        if (e != cudaSuccess) {
            b->tm_pend = 0;
            return msv_cuda_fail(err, errlen, "forward (the last one)",
                                 __FILE__, __LINE__, e);
        }
    }
    msv_cuda_timing_flush(b);

    if (bt == NULL || bt->n_seqs == 0 || bt->seq == NULL
        || bt->n_new == NULL || bt->pos0 == NULL || bt->tokens == NULL
        || bt->pages == NULL || bt->n_pages == NULL)
    {
        return msv_cuda_err(err, errlen, "cuda: forward: empty batch");
    }
    if (logits == NULL && (b->dlogits == NULL || bt->all_logits)) {
        return msv_cuda_err(err, errlen, "cuda: forward: logits on the "
                            "device need sample_init and one row per "
                            "sequence");
    }

    if (++b->stamp == 0) {
        memset(b->seq_stamp, 0, b->max_seqs * sizeof(uint32_t));
        b->stamp = 1;
    }

    T64 = 0;
    P64 = 0;
    max_ctx = 0;
    for (s = 0; s < bt->n_seqs; s++) {
        seq = bt->seq[s];
        n = bt->n_new[s];
        p0 = bt->pos0[s];
        if (seq >= b->max_seqs) {
            return msv_cuda_err(err, errlen, "cuda: forward: batch seq[%u] = "
                                "%u, max_seqs is %u", s, seq, b->max_seqs);
        }
        if (b->seq_stamp[seq] == b->stamp) {
            return msv_cuda_err(err, errlen, "cuda: forward: sequence %u "
                                "appears twice in the batch", seq);
        }
        b->seq_stamp[seq] = b->stamp;
        if (n == 0) {
            return msv_cuda_err(err, errlen, "cuda: forward: sequence %u has "
                                "no new tokens", seq);
        }
        if ((uint64_t) p0 + n > (uint64_t) bt->n_pages[s] * MSV_KV_BLOCK) {
            return msv_cuda_err(err, errlen, "cuda: forward: sequence %u: "
                                "%llu tokens but KV reserved for %llu", seq,
                                (unsigned long long) p0 + n,
                                (unsigned long long) bt->n_pages[s]
                                * MSV_KV_BLOCK);
        }
        if ((uint64_t) p0 + n > b->max_len) {
            return msv_cuda_err(err, errlen, "cuda: forward: sequence %u: "
                                "%llu tokens exceed max_len %u", seq,
                                (unsigned long long) p0 + n, b->max_len);
        }
        for (k = 0; k < MSV_CEIL_DIV(p0 + n, MSV_KV_BLOCK); k++) {
            if (bt->pages[s] == NULL || bt->pages[s][k] >= b->n_pages) {
                return msv_cuda_err(err, errlen, "cuda: forward: sequence "
                                    "%u: page %u is not in the pool of %u",
                                    seq, k, b->n_pages);
            }
        }
        T64 += n;
        P64 += MSV_CEIL_DIV(p0 + n, MSV_KV_BLOCK);
        max_ctx = p0 + n > max_ctx ? p0 + n : max_ctx;
    }
    if (T64 > INT32_MAX / 8) {
        return msv_cuda_err(err, errlen, "cuda: forward: %llu tokens in one "
                            "batch", (unsigned long long) T64);
    }
    T = (uint32_t) T64;
    P = (uint32_t) P64;
    R = bt->all_logits ? T : bt->n_seqs;

    for (t = 0; t < T; t++) {
        if (bt->tokens[t] < 0 || (uint32_t) bt->tokens[t] >= c->vocab_size) {
            return msv_cuda_err(err, errlen, "cuda: forward: token %d at "
                                "batch index %u is outside the vocabulary "
                                "(%u)", bt->tokens[t], t, c->vocab_size);
        }
    }

    /* A decode step (one new token per sequence, last-token logits) runs
     * as a graph padded to cap tokens; its attention is captured for a
     * context bound gctx: the model's longest where the decode attention
     * of cap tokens does not depend on the context (the serial form:
     * one graph a batch size), else a power-of-two number of splits. */
    dev = logits == NULL;
    decode = T == bt->n_seqs && !bt->all_logits;
    cap = T;
    gctx = max_ctx;
    b->tm_on = b->tm_file != NULL && b->tm_detail != 0
               && b->tm_step % b->tm_detail == 0;
    if (decode && b->use_graphs && !b->tm_on
        && msv_cuda_bucket(T) <= b->graph_cap
        && (!dev || msv_cuda_bucket(T) <= b->max_seqs))
    {
        cap = msv_cuda_bucket(T);
        gctx = attention_decode_bound(cap, c->n_heads, c->n_kv_heads,
                                      c->head_dim, b->kv_bf16, b->attn_mode,
                                      max_ctx, b->max_len);
    } else {
        decode = 0;
    }

    /*
     * The batch description, one int32 array in pinned memory, each part
     * at a fixed offset for cap tokens: tok[cap] pos[cap] tseq[cap]
     * poff[cap] rows[cap] pages[P + 1], then for a step that may tile its
     * prefill runs the attention plan, tiles[2 n_tiles] rest[n_rest] (room
     * for 3 T).  Padding tokens (decode graphs) are token 0 at position 0
     * of their own sequence, whose one page is the pad page that no
     * sequence owns.  Only steps with a run of MSV_ATTN_TILE_MIN tokens
     * are planned: never a decode step (so never a graph), never in the
     * batch-invariant mode or with MSV_CUDA_TILED=0, never with fp32 KV.
     */
    tile = 0;
    if (!decode && b->kv_bf16 && b->tiled) {
        for (s = 0; s < bt->n_seqs && !tile; s++) {
            tile = bt->n_new[s] >= MSV_ATTN_TILE_MIN;
        }
    }
    meta_n = 5 * (size_t) cap + P + 1 + (tile ? 3 * (size_t) T : 0);
    if (msv_cuda_meta(b, meta_n, err, errlen) != 0
        || msv_cuda_scratch(b, cap, err, errlen) != 0)
    {
        return -1;
    }

    tok = b->meta_h;
    pos = tok + cap;
    tseq = pos + cap;
    poff = tseq + cap;
    rows = poff + cap;
    pages = rows + cap;

    memcpy(tok, bt->tokens, T * sizeof(int32_t));
    t = 0;
    P = 0;
    for (s = 0; s < bt->n_seqs; s++) {
        seq = bt->seq[s];
        p0 = bt->pos0[s];
        n = bt->n_new[s];
        for (k = 0; k < n; k++) {
            pos[t] = (int32_t) (p0 + k);
            tseq[t] = (int32_t) s;
            if (bt->all_logits) {
                rows[t] = (int32_t) t;
            }
            t++;
        }
        if (!bt->all_logits) {
            rows[s] = (int32_t) (t - 1);
        }
        poff[s] = (int32_t) P;
        np = MSV_CEIL_DIV(p0 + n, MSV_KV_BLOCK);
        sp = bt->pages[s];
        for (k = 0; k < np; k++) {
            pages[P++] = (int32_t) sp[k];
        }
    }
    pages[P] = (int32_t) b->n_pages;           /* the pad page */
    for (t = T; t < cap; t++) {
        tok[t] = 0;
        pos[t] = 0;
        tseq[t] = (int32_t) t;
        poff[t] = (int32_t) P;
        rows[t] = (int32_t) t;
    }

    memset(&plan, 0, sizeof(plan));
    meta_n = 5 * (size_t) cap + P + 1;
    if (tile) {
        tiles = pages + P + 1;
        plan.n_tiles = attention_plan(pos, tseq, T, c->n_heads / c->n_kv_heads,
                                      MSV_ATTN_TILE_MIN, tiles, tiles + 2 * T,
                                      &plan.n_rest);
        rest = tiles + 2 * plan.n_tiles;
        memmove(rest, tiles + 2 * T, plan.n_rest * sizeof(int32_t));
        plan.tiles = b->meta_d + (tiles - b->meta_h);
        plan.rest = b->meta_d + (rest - b->meta_h);
        meta_n += 2 * (size_t) plan.n_tiles + plan.n_rest;
    }

    if (b->tm_file != NULL) {
        b->tm_n = 0;
        MSV_CUDA_TRY(cudaEventRecord(b->tm_start, b->stream), err, errlen);
    }
    MSV_CUDA_TRY(cudaMemcpyAsync(b->meta_d, b->meta_h,
                                 meta_n * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, b->stream),
                 err, errlen);
    msv_cuda_mark(b, MSV_TM_COPY);

    gx = decode ? msv_cuda_graph(b, cap, gctx, dev) : NULL;
    if (gx != NULL) {
        MSV_CUDA_TRY(cudaGraphLaunch(gx, b->stream), err, errlen);
        t_launch = b->tm_file != NULL ? msv_cuda_now_ns() : 0;
        if (!dev) {
            MSV_CUDA_TRY(cudaMemcpyAsync(logits, b->logits,
                                         (size_t) R * c->vocab_size
                                         * sizeof(float),
                                         cudaMemcpyDeviceToHost, b->stream),
                         err, errlen);
        }

    } else {
        if (msv_cuda_body(b, T, cap, max_ctx, &plan, err, errlen) != 0) {
            return -1;
        }
        for (r0 = 0; r0 < R; r0 += rc) {
            rc = R - r0 < MSV_LM_CHUNK ? R - r0 : MSV_LM_CHUNK;
            if (msv_cuda_head(b, cap, r0, rc,
                              dev ? b->dlogits + (size_t) r0 * c->vocab_size
                                  : b->logits, err, errlen) != 0)
            {
                return -1;
            }
            if (dev) {
                continue;   /* the sampler reads them where they are */
            }
            MSV_CUDA_TRY(cudaMemcpyAsync(logits + (size_t) r0 * c->vocab_size,
                                         b->logits,
                                         (size_t) rc * c->vocab_size
                                         * sizeof(float),
                                         cudaMemcpyDeviceToHost, b->stream),
                         err, errlen);
            msv_cuda_mark(b, MSV_TM_COPY);
        }
        t_launch = b->tm_file != NULL ? msv_cuda_now_ns() : 0;
    }

    if (b->tm_file != NULL) {
        MSV_CUDA_TRY(cudaEventRecord(b->tm_end, b->stream), err, errlen);
    }

    if (dev) {
        /* the logits stay for the sampler, whose run comes next on this
         * stream and waits for it: the host goes on with its own work
         * (the last step's rows into the ring, this step's sampling
         * rows) while the device computes; a fault shows at that wait */
        MSV_CUDA_TRY(cudaGetLastError(), err, errlen);
        b->unsynced = 1;
        if (b->tm_file != NULL) {
            b->tm_pend = 1;
            b->tm_p_seqs = bt->n_seqs;
            b->tm_p_T = T;
            b->tm_p_ctx = max_ctx;
            b->tm_p_in = t_in;
            b->tm_p_launch = t_launch;
            b->tm_p_graph = gx != NULL;
        }
        return 0;
    }

    e = cudaStreamSynchronize(b->stream);
    if (e == cudaSuccess) {
        e = cudaGetLastError();
    }
    if (e != cudaSuccess) {
        return msv_cuda_fail(err, errlen, "forward", __FILE__, __LINE__, e);
    }

    if (b->tm_file != NULL) {
        msv_cuda_timing_line(b, bt->n_seqs, T, max_ctx, t_in, t_launch,
                             gx != NULL, 0);
    }
    return 0;
}


static void
msv_cuda_destroy(struct msv_backend *b)
{
    struct msv_cuda_wset  ws;
    int                   i;

    if (b == NULL) {
        return;
    }

    if (b->stream != NULL) {
        cudaStreamSynchronize(b->stream);
    }
    if (b->tm_file != NULL) {
        msv_cuda_timing_flush(b);
    }
    msv_cuda_drop_graphs(b);
    if (b->tm_file != NULL) {
        fclose(b->tm_file);
        cudaEventDestroy(b->tm_start);
        cudaEventDestroy(b->tm_end);
        for (i = 0; b->tm_detail && i < MSV_TM_EVENTS; i++) {
            cudaEventDestroy(b->tm_ev[i]);
        }
    }
    msv_cuda_free_scratch(b);
    if (b->gs != NULL) {
        unsigned long long  pth[3];

        if (msv_gsampler_paths(b->gs, pth) == 1) {
            msv_info("device sampler: rows on the predicted floor %llu, "
                     "after the histogram %llu, in the resident kernel %llu",
                     pth[0], pth[1], pth[2]);
        }
    }
    msv_gsampler_free(b->gs);
    cudaFree(b->dlogits);
    cudaFreeHost(b->meta_h);
    cudaFree(b->meta_d);
    msv_cuda_stager_free(&b->up);
    memset(&ws, 0, sizeof(ws));
    msv_cuda_weights_swap(b, &ws);
    msv_cuda_weights_free(&ws);
    msv_cuda_allocs_free(&b->allocs);
    gemm_inv_free(&b->inv);
    if (b->cublas != NULL) {
        cublasDestroy(b->cublas);
    }
    if (b->stream != NULL) {
        cudaStreamDestroy(b->stream);
    }
    free(b->seq_stamp);
    free(b);
}


/* ------------------------------------------------------------------ */
/* Sampling on the device (kernels/sampling.cu)                         */

static int
msv_cuda_sample_init(struct msv_backend *b, uint32_t max_rows,
    uint32_t max_slots, uint32_t max_logprobs, void *ring,
    size_t ring_bytes, char *err, size_t errlen)
{
    if (max_rows > b->max_seqs) {
        return msv_cuda_err(err, errlen, "cuda: sampler: %u rows, the "
                            "backend has %u sequences", max_rows,
                            b->max_seqs);
    }
    b->gs = msv_gsampler_new(b->cfg.vocab_size, max_rows, max_slots,
                             max_logprobs, b->stream, err, errlen);
    if (b->gs == NULL) {
        return -1;
    }
    if (cudaMalloc((void **) &b->dlogits, (size_t) b->max_seqs
                   * b->cfg.vocab_size * sizeof(float)) != cudaSuccess)
    {
        msv_gsampler_free(b->gs);
        b->gs = NULL;
        b->dlogits = NULL;
        return msv_cuda_err(err, errlen, "cuda: sampler: no memory for "
                            "%u rows of logits", b->max_seqs);
    }
    if (ring != NULL
        && msv_cuda_host_register(ring, ring_bytes, err, errlen) != 0)
    {
        return -1;
    }
    return 0;
}


static int
msv_cuda_sample(struct msv_backend *b, const struct msv_sample_row *rows,
    uint32_t n, struct msv_sample_res *res, char *err, size_t errlen)
{
    int  rc;

    if (b->gs == NULL) {
        return msv_cuda_err(err, errlen, "cuda: sample before sample_init");
    }
    /* on b->stream, after the forward; with n > 0 it returns once the
     * stream is done (a fault of the forward's shows here) */
    rc = msv_gsampler_run(b->gs, b->dlogits, rows, n, res, err, errlen);
    if (rc == 0 && n > 0) {
        b->unsynced = 0;
        msv_cuda_timing_flush(b);
    }
    return rc;
}


static float
msv_cuda_sample_ms(struct msv_backend *b)
{
    return b->gs != NULL ? msv_gsampler_last_ms(b->gs, NULL) : 0.0f;
}


/*
 * The copies run on the sampler's copy stream, beside the next forward
 * on b->stream: the sampler's run after a forward ends with
 * cudaStreamSynchronize(b->stream), as does a forward whose logits go to
 * the host, and neither waits for them.  Only a device-wide
 * synchronization would: the cudaFree of scratch, the batch description
 * or the sampler's upload
 * buffer when a step outgrows them (a few times after start), and the
 * old weights' after a weight update.  Those make a copy land early,
 * which is still correct.
 */
static int
msv_cuda_sample_copy(struct msv_backend *b, uint32_t first, uint32_t n,
    void *dst, char *err, size_t errlen)
{
    if (b->gs == NULL) {
        return msv_cuda_err(err, errlen, "cuda: sample_copy before "
                            "sample_init");
    }
    return msv_gsampler_copy(b->gs, first, n, dst, err, errlen);
}


static int
msv_cuda_sample_wait(struct msv_backend *b, char *err, size_t errlen)
{
    if (b->gs == NULL) {
        return 0;               /* nothing was ever copied */
    }
    return msv_gsampler_wait(b->gs, err, errlen);
}


/* ------------------------------------------------------------------ */
/* Weight updates (worker/control.c)                                    */

/*
 * On the update thread, while the scheduler thread runs steps on the
 * copy in use: a second copy built by the load path of create, on the
 * upload stream (b->up, which forward never touches), into memory of its
 * own.  It reads b's config and the device dtypes of the copy in use,
 * which only commit changes, after this has returned.  Nothing of b
 * changes here; a failure frees what was allocated.
 */
static int
msv_cuda_stage_weights(struct msv_backend *b, const struct msv_weights *w,
    void **staged, char *err, size_t errlen)
{
    struct msv_cuda_wset  *ws;
    size_t                 dev_free, dev_total;
    char                   why[256];

    *staged = NULL;

    /* every tensor with the shape the config gives, as at create */
    if (msv_weights_check(&b->cfg, w, err, errlen) != 0) {
        return -1;
    }

    /* the device is per thread: this one has not chosen it yet */
    MSV_CUDA_TRY(cudaSetDevice(b->device), err, errlen);
    MSV_CUDA_TRY(cudaMemGetInfo(&dev_free, &dev_total), err, errlen);
    if (dev_free < b->wmem.bytes) {
        return msv_cuda_err(err, errlen, "cuda: not enough device memory "
                            "for a second copy of the weights: %.1f MiB "
                            "needed, %.1f MiB free (the old copy serves "
                            "until the swap)",
                            (double) b->wmem.bytes / (1 << 20),
                            (double) dev_free / (1 << 20));
    }

    ws = (struct msv_cuda_wset *) calloc(1, sizeof(*ws));
    if (ws == NULL) {
        return msv_cuda_err(err, errlen, "cuda: out of host memory");
    }

    if (msv_cuda_weights_build(&b->cfg, w, &b->up, b, ws, err, errlen)
        != 0)
    {
        /* copies may still be queued: let them end before freeing */
        cudaStreamSynchronize(b->up.stream);
        if (ws->mem.oom) {
            snprintf(why, sizeof(why), "%s", err);
            msv_cuda_err(err, errlen, "cuda: not enough device memory for "
                         "a second copy of the weights (%.1f MiB; the old "
                         "copy serves until the swap): %s",
                         (double) b->wmem.bytes / (1 << 20), why);
        }
        msv_cuda_weights_free(ws);
        free(ws);
        (void) cudaGetLastError();
        return -1;
    }

    *staged = ws;
    return 0;
}


/*
 * On the scheduler thread, between two steps: serve from the staged
 * copy.  The captured decode graphs bake in the old weights' pointers:
 * they are dropped and the next decode steps capture again.  The fused
 * matrices (q/k/v, gate/up) and the tied lm_head came with the staged
 * copy.  Then the old copy is freed.
 */
static void
msv_cuda_commit_weights(struct msv_backend *b, void *staged)
{
    struct msv_cuda_wset  *ws = (struct msv_cuda_wset *) staged;

    /* the last forward (which returns once launched when the device
     * sampler takes its logits) or its sampling may still be queued:
     * nothing may read the old copy once freed */
    if (cudaStreamSynchronize(b->stream) != cudaSuccess) {
        (void) cudaGetLastError();
    }
    msv_cuda_drop_graphs(b);
    msv_cuda_weights_swap(b, ws);
    msv_cuda_weights_free(ws);
    free(ws);
}


static void
msv_cuda_drop_weights(struct msv_backend *b, void *staged)
{
    struct msv_cuda_wset  *ws = (struct msv_cuda_wset *) staged;

    if (ws != NULL) {
        msv_cuda_weights_free(ws);
        free(ws);
    }
}


static struct msv_backend_ops
msv_cuda_make_ops(void)
{
    struct msv_backend_ops  o;

    memset(&o, 0, sizeof(o));
    o.name = "cuda";
    o.create = msv_cuda_create;
    o.kv_pages = msv_cuda_kv_pages;
    o.forward = msv_cuda_forward;
    o.destroy = msv_cuda_destroy;
    o.host_alloc = msv_cuda_host_alloc;
    o.host_free = msv_cuda_host_free;
    o.sample_init = msv_cuda_sample_init;
    o.sample = msv_cuda_sample;
    o.sample_copy = msv_cuda_sample_copy;
    o.sample_wait = msv_cuda_sample_wait;
    o.sample_ms = msv_cuda_sample_ms;
    o.stage_weights = msv_cuda_stage_weights;
    o.commit_weights = msv_cuda_commit_weights;
    o.drop_weights = msv_cuda_drop_weights;
    return o;
}


extern "C" const struct msv_backend_ops *
msv_backend_cuda_ops(void)
{
    static const struct msv_backend_ops  ops = msv_cuda_make_ops();

    return &ops;
}


extern "C" int
msv_cuda_device_count(void)
{
    int  n;

    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void) cudaGetLastError();
        return 0;
    }
    return n;
}


extern "C" void *
msv_cuda_host_alloc(size_t bytes)
{
    void  *p;

    if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
        (void) cudaGetLastError();
        return NULL;
    }
    return p;
}


extern "C" void
msv_cuda_host_free(void *p)
{
    if (p != NULL) {
        cudaFreeHost(p);
    }
}
