/*
 * test_weight_update.c: weight updates of a backend (stage_weights,
 * commit_weights, drop_weights): the CPU backend always, the CUDA backend
 * (kernels/backend_cuda.cu) in both precisions when a GPU is there.
 *
 * For the qwen3-tiny fixtures (fp32 with tied embeddings, bf16 with an
 * lm_head of its own): a checkpoint B of the same config with other
 * values (every tensor's elements reversed) and one with a wrong shape
 * are written to a scratch directory and loaded as the worker loads them.
 * A backend serving A runs a fixed schedule (a prefill of three
 * sequences, then decode steps, which on CUDA run as captured graphs);
 * then:
 *   - a stage of the wrong shape is refused naming the tensor, and the
 *     schedule gives A's logits again, bit for bit;
 *   - B staged on another thread while the schedule runs on A (those
 *     steps give A's logits), then dropped: A's logits still;
 *   - B staged, its host copy freed, committed: the schedule gives the
 *     logits of a fresh backend created on B, bit for bit (on CUDA its
 *     decode steps captured again as graphs);
 *   - CUDA: with the device memory filled, a stage is refused saying so,
 *     and B keeps serving identically;
 *   - then back to A.
 *
 * The memory-full case fills the GPU for a moment: run the test alone on
 * its GPU (prove runs the C tests one at a time).  Without CUDA in the
 * build, or without a GPU, the CUDA part says so and is skipped.
 */

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <yajl/yajl_tree.h>

#include "tap.h"
#include "backend.h"
#include "kv_direct.h"
#include "model.h"

#ifdef MSV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define N_SEQS     3
#define N_DECODE   12
#define MAX_SEQS   8
#define MAX_LEN    128
#define BAD_NAME   "model.layers.0.mlp.up_proj.weight"

static const char  *fixtures[] = { "qwen3-tiny", "qwen3-tiny-bf16" };
static const char  *precisions[] = { "bf16", "split" };

static char  dir[64];
static char  err[1024];


/* ---------------------------------------------------------------- */
/* checkpoints                                                        */

static void *
read_all(const char *path, size_t *n)
{
    FILE  *f;
    char  *buf;
    long   sz;

    f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (sz = ftell(f)) < 0
        || fseek(f, 0, SEEK_SET) != 0)
    {
        fclose(f);
        return NULL;
    }
    buf = malloc((size_t) sz + 1);
    if (buf == NULL || fread(buf, 1, (size_t) sz, f) != (size_t) sz) {
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[sz] = '\0';
    *n = (size_t) sz;
    return buf;
}


static int
write_all(const char *path, const void *p, size_t n)
{
    FILE  *f;
    int    ok;

    f = fopen(path, "wb");
    if (f == NULL) {
        return -1;
    }
    ok = fwrite(p, 1, n, f) == n;
    ok = fclose(f) == 0 && ok;
    return ok ? 0 : -1;
}


static yajl_val
obj_get(yajl_val o, const char *key)
{
    for (size_t i = 0; YAJL_IS_OBJECT(o) && i < o->u.object.len; i++) {
        if (strcmp(o->u.object.keys[i], key) == 0) {
            return o->u.object.values[i];
        }
    }
    return NULL;
}


/* Reverse the n elements of esz bytes at p. */
static void
reverse(unsigned char *p, size_t n, size_t esz)
{
    unsigned char  t[4];
    size_t         i;

    for (i = 0; i < n / 2; i++) {
        memcpy(t, p + i * esz, esz);
        memcpy(p + i * esz, p + (n - 1 - i) * esz, esz);
        memcpy(p + (n - 1 - i) * esz, t, esz);
    }
}


/*
 * Write <out>/config.json and <out>/model.safetensors from the checkpoint
 * in src: every tensor's elements reversed, and when swap is not NULL the
 * two dimensions of tensor swap exchanged in the header (same bytes, a
 * wrong shape).  0, or -1 with err set.
 */
static int
write_ckpt(const char *src, const char *out, const char *swap)
{
    char            path[600], ebuf[256], key[200], *hdr, *at, *sh;
    unsigned char  *all, *data;
    size_t          n, hn, i, s0, s1, esz;
    yajl_val        root, v, dt, off;
    uint64_t        len;
    long            d0, d1;
    int             rc;

    rc = -1;
    root = NULL;
    hdr = NULL;

    snprintf(path, sizeof(path), "%s/config.json", src);
    all = read_all(path, &n);
    snprintf(ebuf, sizeof(ebuf), "%s/config.json", out);
    if (all == NULL || (mkdir(out, 0700) != 0 && access(out, F_OK) != 0)
        || write_all(ebuf, all, n) != 0)
    {
        snprintf(err, sizeof(err), "%s: cannot copy its config.json", src);
        free(all);
        return -1;
    }
    free(all);

    snprintf(path, sizeof(path), "%s/model.safetensors", src);
    all = read_all(path, &n);
    if (all == NULL || n < 8) {
        snprintf(err, sizeof(err), "%s: cannot read", path);
        goto done;
    }
    memcpy(&len, all, 8);
    if (len > n - 8) {
        snprintf(err, sizeof(err), "%s: bad header length", path);
        goto done;
    }
    hn = (size_t) len;
    data = all + 8 + hn;
    hdr = malloc(hn + 1);
    if (hdr == NULL) {
        goto done;
    }
    memcpy(hdr, all + 8, hn);
    hdr[hn] = '\0';
    root = yajl_tree_parse(hdr, ebuf, sizeof(ebuf));
    if (!YAJL_IS_OBJECT(root)) {
        snprintf(err, sizeof(err), "%s: header: %s", path, ebuf);
        goto done;
    }

    for (i = 0; i < root->u.object.len; i++) {
        if (strcmp(root->u.object.keys[i], "__metadata__") == 0) {
            continue;
        }
        v = root->u.object.values[i];
        dt = obj_get(v, "dtype");
        off = obj_get(v, "data_offsets");
        if (!YAJL_IS_STRING(dt) || !YAJL_IS_ARRAY(off)
            || off->u.array.len != 2)
        {
            snprintf(err, sizeof(err), "%s: tensor %s: no dtype or offsets",
                     path, root->u.object.keys[i]);
            goto done;
        }
        esz = strcmp(dt->u.string, "F32") == 0 ? 4 : 2;
        s0 = (size_t) YAJL_GET_INTEGER(off->u.array.values[0]);
        s1 = (size_t) YAJL_GET_INTEGER(off->u.array.values[1]);
        if (s1 < s0 || s1 > n - 8 - hn) {
            snprintf(err, sizeof(err), "%s: tensor %s: bad offsets", path,
                     root->u.object.keys[i]);
            goto done;
        }
        reverse(data + s0, (s1 - s0) / esz, esz);
    }

    if (swap != NULL) {
        /* "NAME":{"dtype":"..","shape":[d0,d1] -> [d1,d0], same length */
        snprintf(key, sizeof(key), "\"%s\"", swap);
        at = strstr((char *) all + 8, key);
        sh = at != NULL ? strstr(at, "\"shape\":[") : NULL;
        if (sh == NULL || (size_t) (sh - (char *) all) >= 8 + hn
            || sscanf(sh, "\"shape\":[%ld,%ld]", &d0, &d1) != 2)
        {
            snprintf(err, sizeof(err), "%s: no 2-d shape of %s", path, swap);
            goto done;
        }
        snprintf(key, sizeof(key), "\"shape\":[%ld,%ld]", d1, d0);
        memcpy(sh, key, strlen(key));
    }

    snprintf(path, sizeof(path), "%s/model.safetensors", out);
    if (write_all(path, all, n) != 0) {
        snprintf(err, sizeof(err), "%s: cannot write", path);
        goto done;
    }
    rc = 0;

done:
    yajl_tree_free(root);
    free(hdr);
    free(all);
    return rc;
}


/* ---------------------------------------------------------------- */
/* the schedule                                                       */

#define N_ROWS  (N_SEQS * (1 + N_DECODE))

static uint32_t  plen[N_SEQS] = { 5, 9, 13 };

static int32_t
token(uint32_t seq, uint32_t pos, uint32_t vocab)
{
    uint64_t  x;

    x = (uint64_t) (seq + 1) * 0x9e3779b97f4a7c15ULL
        ^ (uint64_t) (pos + 7) * 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 31;
    return (int32_t) (x % vocab);
}


/*
 * A prefill of N_SEQS sequences (ids base ..) and N_DECODE decode steps
 * of all of them; out gets the last-token logits of every step,
 * [N_ROWS][vocab].  The sequences are released at the end.  0, or -1
 * with err set.
 */
static int
schedule(const struct msv_backend_ops *ops, struct msv_backend *b,
    uint32_t base, uint32_t vocab, float *out)
{
    struct msv_batch  bt;
    uint32_t          seq[N_SEQS], n_new[N_SEQS], pos0[N_SEQS], s, d, t;
    int32_t           tok[64];
    int               rc;

    rc = 0;
    t = 0;
    for (s = 0; s < N_SEQS; s++) {
        seq[s] = base + s;
        n_new[s] = plen[s];
        pos0[s] = 0;
        for (d = 0; d < plen[s]; d++) {
            tok[t++] = token(s, d, vocab);
        }
        if (msv_kvd_reserve(b, seq[s], plen[s] + N_DECODE) != 0) {
            snprintf(err, sizeof(err), "no KV pages for sequence %u",
                     seq[s]);
            rc = -1;
        }
    }

    memset(&bt, 0, sizeof(bt));
    bt.n_seqs = N_SEQS;
    bt.seq = seq;
    bt.n_new = n_new;
    bt.pos0 = pos0;
    bt.tokens = tok;
    bt.all_logits = 0;
    if (rc == 0) {
        rc = msv_kvd_forward(ops, b, &bt, out, err, sizeof(err));
    }

    for (d = 0; rc == 0 && d < N_DECODE; d++) {
        for (s = 0; s < N_SEQS; s++) {
            pos0[s] = plen[s] + d;
            n_new[s] = 1;
            tok[s] = token(s, pos0[s], vocab);
        }
        rc = msv_kvd_forward(ops, b, &bt,
                             out + (size_t) (1 + d) * N_SEQS * vocab, err,
                             sizeof(err));
    }

    for (s = 0; s < N_SEQS; s++) {
        msv_kvd_release(b, seq[s]);
    }
    return rc;
}


/* Bit-identical?  When not, a line saying where and by how much. */
static int
same(const float *a, const float *b, uint32_t vocab, const char *what)
{
    size_t  i, n;
    double  m;

    n = (size_t) N_ROWS * vocab;
    if (memcmp(a, b, n * sizeof(float)) == 0) {
        return 1;
    }
    m = 0;
    for (i = 0; i < n; i++) {
        double  d = (double) a[i] - (double) b[i];

        m = d < 0 ? (-d > m ? -d : m) : (d > m ? d : m);
    }
    for (i = 0; i < n && memcmp(&a[i], &b[i], sizeof(float)) == 0; i++) { }
    tap_diag("%s: first difference at row %zu, max |diff| %g", what,
             i / vocab, m);
    return 0;
}


/* Lines of a MSV_CUDA_TIMING file after byte from, and how many of them
 * ran as a graph. */
static void
timing_lines(const char *path, long from, int *lines, int *graphs)
{
    FILE  *f;
    char   line[512];

    *lines = 0;
    *graphs = 0;
    f = fopen(path, "r");
    if (f == NULL || fseek(f, from, SEEK_SET) != 0) {
        if (f != NULL) {
            fclose(f);
        }
        return;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        (*lines)++;
        *graphs += strstr(line, " graph 1 ") != NULL;
    }
    fclose(f);
}


static long
file_size(const char *path)
{
    FILE  *f;
    long   n;

    f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : 0;
    fclose(f);
    return n;
}


/* ---------------------------------------------------------------- */
/* staging on another thread, as the worker's update thread does        */

struct stager {
    const struct msv_backend_ops  *ops;
    struct msv_backend            *b;
    const struct msv_weights      *w;
    void                          *staged;
    int                            rc;
    char                           err[1024];
};


static void *
stage_main(void *arg)
{
    struct stager  *s = arg;

    s->rc = s->ops->stage_weights(s->b, s->w, &s->staged, s->err,
                                  sizeof(s->err));
    return NULL;
}


static int
stage_start(struct stager *s, pthread_t *th, const struct msv_backend_ops *ops,
    struct msv_backend *b, const struct msv_weights *w)
{
    memset(s, 0, sizeof(*s));
    s->ops = ops;
    s->b = b;
    s->w = w;
    s->rc = -1;
    return pthread_create(th, NULL, stage_main, s);
}


/* Stage w on a thread of its own and wait for it. */
static int
stage(struct stager *s, const struct msv_backend_ops *ops,
    struct msv_backend *b, const struct msv_weights *w)
{
    pthread_t  th;

    if (stage_start(s, &th, ops, b, w) != 0) {
        snprintf(s->err, sizeof(s->err), "pthread_create failed");
        return -1;
    }
    pthread_join(th, NULL);
    return s->rc;
}


/* Hold all the device memory cudaMalloc still gives, down to 64 KiB
 * pieces.  Returns how many pieces ptr[] got. */
static int
fill_device(void **ptr, int max)
{
#ifndef MSV_HAVE_CUDA
    (void) ptr;
    (void) max;
    return 0;
#else
    size_t  dev_free, dev_total, sz;
    int     n;

    n = 0;
    if (cudaMemGetInfo(&dev_free, &dev_total) != cudaSuccess) {
        (void) cudaGetLastError();
        return 0;
    }
    for (sz = dev_free; sz >= ((size_t) 64 << 10) && n < max; ) {
        if (cudaMalloc(&ptr[n], sz) == cudaSuccess) {
            n++;
        } else {
            (void) cudaGetLastError();
            sz /= 2;
        }
    }
    return n;
#endif
}


static void
unfill_device(void **ptr, int n)
{
#ifdef MSV_HAVE_CUDA
    for (int k = 0; k < n; k++) {
        cudaFree(ptr[k]);
    }
#else
    (void) ptr;
    (void) n;
#endif
}


/* ---------------------------------------------------------------- */

static void
test_update(const char *base, const char *name,
    const struct msv_backend_ops *ops, const char *prec)
{
    struct msv_model_config        cfg;
    struct msv_weights             wa, wb, wbad;
    struct msv_backend            *ba, *bb;
    struct stager                  st;
    pthread_t                      th;
    char                           src[512], db[600], dbad[600], path[700];
    char                           tma[700], tmb[700], what[128];
    float                         *outa, *outb, *out;
    void                          *fill[256];
    uint32_t                       V, round;
    long                           from;
    int                            lines, graphs, nfill, i, ok, started;
    int                            cuda;

    cuda = ops != &msv_backend_cpu;
    snprintf(what, sizeof(what), "%s %s%s%s", ops->name, name,
             prec != NULL ? " " : "", prec != NULL ? prec : "");
    snprintf(src, sizeof(src), "%s/%s", base, name);
    snprintf(db, sizeof(db), "%s/%s-B", dir, name);
    snprintf(dbad, sizeof(dbad), "%s/%s-bad", dir, name);
    snprintf(tma, sizeof(tma), "%s/%s-%s-a.timing", dir, name, prec != NULL ? prec : "cpu");
    snprintf(tmb, sizeof(tmb), "%s/%s-%s-b.timing", dir, name, prec != NULL ? prec : "cpu");
    memset(&wa, 0, sizeof(wa));
    memset(&wb, 0, sizeof(wb));
    memset(&wbad, 0, sizeof(wbad));
    ba = bb = NULL;
    outa = outb = out = NULL;

    snprintf(path, sizeof(path), "%s/config.json", src);
    if (!tap_ok(msv_config_load(path, &cfg, err, sizeof(err)) == 0
                && msv_weights_load(src, &wa, err, sizeof(err)) == 0
                && write_ckpt(src, db, NULL) == 0
                && write_ckpt(src, dbad, BAD_NAME) == 0
                && msv_weights_load(db, &wb, err, sizeof(err)) == 0
                && msv_weights_load(dbad, &wbad, err, sizeof(err)) == 0,
                "%s: A, B and a wrong shape load: %s", what,
                err[0] ? err : "ok"))
    {
        goto done;
    }
    V = cfg.vocab_size;
    outa = malloc((size_t) N_ROWS * V * sizeof(float));
    outb = malloc((size_t) N_ROWS * V * sizeof(float));
    out = malloc((size_t) N_ROWS * V * sizeof(float));
    if (outa == NULL || outb == NULL || out == NULL) {
        tap_ok(0, "%s: out of memory", what);
        goto done;
    }

    if (prec != NULL) {
        setenv("MSV_CUDA_ACT", prec, 1);
    }
    err[0] = '\0';

    /* B's logits from a backend of its own (on CUDA with a line per
     * step in tmb, as the updated one has in tma) */
    if (cuda) {
        setenv("MSV_CUDA_TIMING", tmb, 1);
    }
    bb = msv_kvd_create(ops, &cfg, &wb, MAX_SEQS, MAX_LEN,
                        MAX_SEQS * MAX_LEN, 1, err, sizeof(err));
    if (!tap_ok(bb != NULL && schedule(ops, bb, 0, V, outb) == 0,
                "%s: a backend created on B runs: %s", what,
                err[0] ? err : "ok"))
    {
        goto done;
    }
    msv_kvd_destroy(ops, bb);
    bb = NULL;

    /* the backend updated: A first */
    if (cuda) {
        setenv("MSV_CUDA_TIMING", tma, 1);
    }
    ba = msv_kvd_create(ops, &cfg, &wa, MAX_SEQS, MAX_LEN,
                        MAX_SEQS * MAX_LEN, 1, err, sizeof(err));
    unsetenv("MSV_CUDA_TIMING");
    if (!tap_ok(ba != NULL && schedule(ops, ba, 0, V, outa) == 0,
                "%s: a backend created on A runs: %s", what,
                err[0] ? err : "ok"))
    {
        goto done;
    }
    tap_ok(memcmp(outa, outb, (size_t) N_ROWS * V * sizeof(float)) != 0,
           "%s: A and B give different logits", what);
    if (cuda) {
        timing_lines(tma, 0, &lines, &graphs);
        tap_ok(lines == 1 + N_DECODE && graphs == N_DECODE,
               "%s: its decode steps ran as graphs (%d of %d steps)", what,
               graphs, lines);
    }
    tap_ok(schedule(ops, ba, 3, V, out) == 0 && same(out, outa, V, what),
           "%s: the schedule again: A's logits bit for bit", what);

    /* a wrong shape: refused naming the tensor, nothing changed */
    i = stage(&st, ops, ba, &wbad);
    tap_ok(i != 0 && st.staged == NULL && strstr(st.err, BAD_NAME) != NULL,
           "%s: a wrong shape is refused naming the tensor: %s", what,
           st.err);
    if (st.staged != NULL) {
        ops->drop_weights(ba, st.staged);
    }
    tap_ok(schedule(ops, ba, 0, V, out) == 0 && same(out, outa, V, what),
           "%s: after the refusal: A's logits bit for bit", what);

    /* B staged while steps run on A, then dropped */
    started = stage_start(&st, &th, ops, ba, &wb) == 0;
    ok = started;
    for (round = 0; ok && round < 3; round++) {
        ok = schedule(ops, ba, 3 * (round % 2), V, out) == 0
             && same(out, outa, V, what);
    }
    if (started) {
        pthread_join(th, NULL);
    }
    tap_ok(ok, "%s: steps during a stage: A's logits bit for bit: %s", what,
           err[0] ? err : "ok");
    tap_ok(st.rc == 0 && st.staged != NULL, "%s: B staged: %s", what,
           st.rc == 0 ? "ok" : st.err);
    if (st.staged != NULL) {
        ops->drop_weights(ba, st.staged);
    }
    tap_ok(schedule(ops, ba, 0, V, out) == 0 && same(out, outa, V, what),
           "%s: staged and dropped: A's logits bit for bit", what);

    /* B staged, its host copy gone, committed */
    i = stage(&st, ops, ba, &wb);
    msv_weights_free(&wb);
    if (!tap_ok(i == 0 && st.staged != NULL, "%s: B staged again: %s", what,
                i == 0 ? "ok" : st.err))
    {
        goto done;
    }
    ops->commit_weights(ba, st.staged);
    from = file_size(tma);
    tap_ok(schedule(ops, ba, 0, V, out) == 0
           && same(out, outb, V, what),
           "%s: committed: the logits of a backend created on B, bit for "
           "bit: %s", what, err[0] ? err : "ok");
    if (cuda) {
        timing_lines(tma, from, &lines, &graphs);
        tap_ok(lines == 1 + N_DECODE && graphs == N_DECODE,
               "%s: its decode steps ran as graphs again (%d of %d steps)",
               what, graphs, lines);

        /* no device memory for a second copy: refused, B serves on */
        nfill = fill_device(fill, 256);
        i = stage(&st, ops, ba, &wa);
        unfill_device(fill, nfill);
        tap_ok(nfill > 0 && i != 0 && st.staged == NULL
               && strstr(st.err, "not enough device memory for a second "
                         "copy") != NULL,
               "%s: with the device full, a stage is refused saying why: "
               "%s", what, st.err);
        tap_ok(schedule(ops, ba, 3, V, out) == 0
               && same(out, outb, V, what),
               "%s: after it: B's logits bit for bit: %s", what,
               err[0] ? err : "ok");
    }

    /* and back to A */
    i = stage(&st, ops, ba, &wa);
    if (tap_ok(i == 0 && st.staged != NULL, "%s: A staged: %s", what,
               i == 0 ? "ok" : st.err))
    {
        ops->commit_weights(ba, st.staged);
        tap_ok(schedule(ops, ba, 0, V, out) == 0
               && same(out, outa, V, what),
               "%s: back on A: A's logits bit for bit", what);
    }

done:
    if (ba != NULL) {
        msv_kvd_destroy(ops, ba);
    }
    if (bb != NULL) {
        msv_kvd_destroy(ops, bb);
    }
    msv_weights_free(&wa);
    msv_weights_free(&wb);
    msv_weights_free(&wbad);
    free(outa);
    free(outb);
    free(out);
    unlink(tma);
    unlink(tmb);
}


static void
clean_dir(void)
{
    char    path[700];
    size_t  i;

    for (i = 0; i < sizeof(fixtures) / sizeof(fixtures[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s-B/config.json", dir, fixtures[i]);
        unlink(path);
        snprintf(path, sizeof(path), "%s/%s-B/model.safetensors", dir,
                 fixtures[i]);
        unlink(path);
        snprintf(path, sizeof(path), "%s/%s-B", dir, fixtures[i]);
        rmdir(path);
        snprintf(path, sizeof(path), "%s/%s-bad/config.json", dir,
                 fixtures[i]);
        unlink(path);
        snprintf(path, sizeof(path), "%s/%s-bad/model.safetensors", dir,
                 fixtures[i]);
        unlink(path);
        snprintf(path, sizeof(path), "%s/%s-bad", dir, fixtures[i]);
        rmdir(path);
    }
    rmdir(dir);
}


int
main(void)
{
    const char  *base;
    size_t       i, j;

    (void) tap_plan;

    base = getenv("MSV_FIXTURES");
    if (base == NULL) {
        base = "t/fixtures";
    }
    snprintf(dir, sizeof(dir), "/tmp/msv_update_XXXXXX");
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }

    for (i = 0; i < sizeof(fixtures) / sizeof(fixtures[0]); i++) {
        test_update(base, fixtures[i], &msv_backend_cpu, NULL);
    }
    if (msv_backend_cuda() == NULL) {
        tap_diag("skip: cuda backend: this build has none (no nvcc)");
    } else if (!msv_cuda_available()) {
        tap_diag("skip: cuda backend: no usable GPU");
    } else {
        for (i = 0; i < sizeof(fixtures) / sizeof(fixtures[0]); i++) {
            for (j = 0; j < sizeof(precisions) / sizeof(precisions[0]); j++) {
                test_update(base, fixtures[i], msv_backend_cuda(),
                            precisions[j]);
            }
        }
    }

    clean_dir();
    return tap_done();
}
