/*
 * control.c: commands from readers through the control page, acted on
 * between two steps.
 *
 * Pause holds the scheduler (enum msv_hold): mode "abort" ends every
 * request in flight with abort reason "paused" and holds everything;
 * mode "keep" holds everything, so the running sequences keep their KV
 * pages and go on after resume; mode "wait" holds admissions only and
 * answers once the last running request ended.  While paused, requests
 * that reach the queue stay there (readers stop submitting when they see
 * the paused state; one that raced with the pause waits for resume).
 * Resume lifts the hold.  Flush drops the cached prefix pages.
 *
 * A weight update loads and checks the checkpoint and stages the new
 * weights in the backend on a thread of its own while steps go on; then,
 * between two steps, it applies the mode (abort: requests in flight end
 * with reason "paused"; wait: no admissions from the start, and the swap
 * waits until nothing runs; keep: they go on, on the new weights), swaps
 * the weights, seals the KV cache (no page computed by the old weights
 * is found again) and bumps the weight version.  Any failure before the
 * swap leaves the old weights serving and nothing changed.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../shm/msv_cmd.h"
#include "../shm/msv_region.h"
#include "control.h"
#include "log.h"


static void msv_control_set(struct msv_control *k, uint32_t paused,
    uint32_t mode);

static const char  *msv_pause_names[] = { "abort", "wait", "keep" };


int
msv_control_init(struct msv_control *k, struct msv_ctrl *c,
    struct msv_sched *s, const char *weight_version,
    const struct msv_model_config *cfg, const struct msv_weights *w)
{
    int  i;

    memset(k, 0, sizeof(*k));
    k->c = c;
    k->s = s;
    k->cfg = *cfg;
    k->up.k = k;

    k->sig = calloc(w->n ? (size_t) w->n : 1, sizeof(struct msv_tensor_sig));
    if (k->sig == NULL) {
        return -1;
    }
    for (i = 0; i < w->n; i++) {
        memcpy(k->sig[i].name, w->t[i].name, sizeof(k->sig[i].name));
        k->sig[i].dtype = w->t[i].dtype;
        k->sig[i].ndim = w->t[i].ndim;
        memcpy(k->sig[i].shape, w->t[i].shape, sizeof(k->sig[i].shape));
    }
    k->n_sig = w->n;

    snprintf(c->weight_version, sizeof(c->weight_version), "%s",
             weight_version);
    atomic_store_explicit(&c->paused, MSV_RUNNING, memory_order_relaxed);
    return 0;
}


void
msv_control_free(struct msv_control *k)
{
    if (k->up.started) {
        pthread_join(k->up.th, NULL);
        k->up.started = 0;
        if (k->up.staged != NULL) {
            k->s->ops->drop_weights(k->s->be, k->up.staged);
            k->up.staged = NULL;
        }
    }
    free(k->sig);
    k->sig = NULL;
}


/* ------------------------------------------------------------------ */
/* Weight updates                                                       */

static const char *
msv_dtype_str(int dtype)
{
    return dtype == MSV_F32 ? "F32" : dtype == MSV_F16 ? "F16"
           : dtype == MSV_BF16 ? "BF16" : "unknown";
}


static void
msv_shape_str(char *buf, size_t len, int ndim, const int64_t *shape)
{
    int     d;
    size_t  n = 0;

    n += (size_t) snprintf(buf + n, len - n, "[");
    for (d = 0; d < ndim && d < 4 && n < len; d++) {
        n += (size_t) snprintf(buf + n, len - n, "%s%" PRId64, d ? ", " : "",
                               shape[d]);
    }
    if (n < len) {
        snprintf(buf + n, len - n, "]");
    }
}


/* The new config must describe the model being served: 0, or -1 with
 * the first field that differs in err. */
static int
msv_update_same_config(const struct msv_model_config *a,
    const struct msv_model_config *b, char *err, size_t len)
{
#define MSV_SAME(f, name)                                                    \
    if (a->f != b->f) {                                                      \
        snprintf(err, len, "config.json: %s differs from the model "         \
                 "served", name);                                            \
        return -1;                                                           \
    }

    MSV_SAME(arch, "architectures");
    MSV_SAME(vocab_size, "vocab_size");
    MSV_SAME(hidden, "hidden_size");
    MSV_SAME(intermediate, "intermediate_size");
    MSV_SAME(n_layers, "num_hidden_layers");
    MSV_SAME(n_heads, "num_attention_heads");
    MSV_SAME(n_kv_heads, "num_key_value_heads");
    MSV_SAME(head_dim, "head_dim");
    MSV_SAME(max_pos, "max_position_embeddings");
    MSV_SAME(rms_eps, "rms_norm_eps");
    MSV_SAME(rope_theta, "rope_theta");
    MSV_SAME(rope_type, "rope_scaling");
    MSV_SAME(rope_factor, "rope_scaling.factor");
    MSV_SAME(tie_embeddings, "tie_word_embeddings");
    MSV_SAME(qkv_bias, "attention_bias");
    MSV_SAME(qk_norm, "architectures (q/k norm)");

#undef MSV_SAME

    return 0;
}


/* Every tensor of the checkpoint is one of the model served, with its
 * dtype and shape, and none is missing: 0, or -1 naming the tensor. */
static int
msv_update_same_tensors(struct msv_control *k, const struct msv_weights *w,
    char *err, size_t len)
{
    int                       i;
    char                      s1[96], s2[96];
    const struct msv_tensor  *t;

    for (i = 0; i < k->n_sig; i++) {
        t = msv_weights_find(w, k->sig[i].name);
        if (t == NULL) {
            snprintf(err, len, "tensor %s: missing", k->sig[i].name);
            return -1;
        }
        if (t->dtype != k->sig[i].dtype) {
            snprintf(err, len, "tensor %s: dtype %s, the model served has "
                     "%s", t->name, msv_dtype_str(t->dtype),
                     msv_dtype_str(k->sig[i].dtype));
            return -1;
        }
        if (t->ndim != k->sig[i].ndim
            || memcmp(t->shape, k->sig[i].shape,
                      sizeof(int64_t) * (size_t) (t->ndim < 4 ? t->ndim : 4))
               != 0)
        {
            msv_shape_str(s1, sizeof(s1), t->ndim, t->shape);
            msv_shape_str(s2, sizeof(s2), k->sig[i].ndim, k->sig[i].shape);
            snprintf(err, len, "tensor %.120s: shape %.40s, the model "
                     "served has %.40s", t->name, s1, s2);
            return -1;
        }
    }

    if (w->n != k->n_sig) {
        for (i = 0; i < w->n; i++) {
            int  j;

            for (j = 0; j < k->n_sig; j++) {
                if (strcmp(w->t[i].name, k->sig[j].name) == 0) {
                    break;
                }
            }
            if (j == k->n_sig) {
                snprintf(err, len, "tensor %s: not in the model served",
                         w->t[i].name);
                return -1;
            }
        }
    }

    return 0;
}


/* The loader thread: read, check and stage; the main loop swaps. */
static void *
msv_update_main(void *arg)
{
    char                     path[MSV_CMD_PATH_MAX + 16];
    struct msv_update       *u = arg;
    struct msv_weights       w;
    struct msv_control      *k = u->k;
    struct msv_model_config  cfg;

    memset(&w, 0, sizeof(w));
    u->status = -EINVAL;

    snprintf(path, sizeof(path), "%s/config.json", u->path);
    if (msv_config_load(path, &cfg, u->err, sizeof(u->err)) != 0
        || msv_update_same_config(&k->cfg, &cfg, u->err, sizeof(u->err))
           != 0)
    {
        goto done;
    }

    if (msv_weights_load(u->path, &w, u->err, sizeof(u->err)) != 0
        || msv_weights_check(&k->cfg, &w, u->err, sizeof(u->err)) != 0
        || msv_update_same_tensors(k, &w, u->err, sizeof(u->err)) != 0)
    {
        goto done;
    }

    if (k->s->ops->stage_weights(k->s->be, &w, &u->staged, u->err,
                                 sizeof(u->err)) != 0)
    {
        u->status = -ENOMEM;
        goto done;
    }

    u->status = 0;

done:

    msv_weights_free(&w);
    /* U-done: release, pairs with the acquire load in the main loop:
     * status, err and staged are visible once done is */
    atomic_store_explicit(&u->done, 1, memory_order_release);
    return NULL;
}


static void
msv_update_start(struct msv_control *k, uint32_t mode)
{
    uint32_t            was;
    struct msv_update  *u = &k->up;

    was = atomic_load_explicit(&k->c->paused, memory_order_relaxed);

    if (mode > MSV_PAUSE_KEEP) {
        msv_cmd_done(k->c, -EINVAL, 0, was, "unknown mode");
        return;
    }

    if (k->s->ops->stage_weights == NULL) {
        char  msg[MSV_CMD_MSG_MAX];

        snprintf(msg, sizeof(msg), "the %s backend cannot update its "
                 "weights", k->s->ops->name);
        msv_cmd_done(k->c, -ENOTSUP, 0, was, msg);
        return;
    }

    if (mode == MSV_PAUSE_WAIT && k->s->hold == MSV_HOLD_ALL
        && k->s->n_active > 0)
    {
        /* paused with requests kept in place: they would never finish */
        msv_cmd_done(k->c, -EBUSY, 0, was, "the worker is paused with "
                     "requests kept in place, which cannot finish: resume "
                     "first, or use mode keep or abort");
        return;
    }

    memcpy(u->path, k->c->cmd.path, sizeof(u->path));
    u->path[sizeof(u->path) - 1] = '\0';
    memcpy(u->version, k->c->cmd.version, sizeof(u->version));
    u->version[sizeof(u->version) - 1] = '\0';
    u->mode = mode;
    u->staged = NULL;
    u->err[0] = '\0';
    u->t0 = msv_now_ns();
    atomic_store(&u->done, 0);

    if (pthread_create(&u->th, NULL, msv_update_main, u) != 0) {
        msv_cmd_done(k->c, -ENOMEM, 0, was, "cannot start the loader "
                     "thread");
        return;
    }

    u->started = 1;
    k->pending_op = MSV_OP_UPDATE;
    k->was_paused = was;
    k->prev_hold = k->s->hold;

    if (mode == MSV_PAUSE_WAIT && k->s->hold == MSV_HOLD_NONE) {
        /* the requests in flight finish on the old weights */
        k->s->hold = MSV_HOLD_ADMIT;
        msv_control_set(k, MSV_PAUSING, mode);
    }

    msv_info("control: updating the weights from %s to version \"%s\" "
             "(%s)", u->path, u->version, msv_pause_names[mode]);
}


/* Between two steps while an update is in progress.  0, or -1 on a
 * fatal scheduler error. */
static int
msv_update_poll(struct msv_control *k)
{
    char                msg[MSV_CMD_MSG_MAX];
    uint32_t            n;
    uint64_t            t1, t2;
    struct msv_update  *u = &k->up;

    if (!atomic_load_explicit(&u->done, memory_order_acquire)) {
        return 0;
    }

    if (u->started) {
        pthread_join(u->th, NULL);
        u->started = 0;
    }

    if (u->status != 0) {
        /* nothing changed: the old weights serve on */
        k->pending_op = MSV_OP_NONE;
        k->s->hold = k->prev_hold;
        msv_control_set(k, k->was_paused, atomic_load_explicit(
                            &k->c->pause_mode, memory_order_relaxed));
        atomic_fetch_add_explicit(&k->c->weight_update_failures, 1,
                                  memory_order_relaxed);
        msv_warn("control: weight update from %s failed, the old weights "
                 "serve on: %s", u->path, u->err);
        msv_cmd_done(k->c, u->status, 0, k->was_paused, u->err);
        return 0;
    }

    if (u->mode == MSV_PAUSE_WAIT && k->s->n_active > 0) {
        return 0;       /* the requests in flight are still finishing */
    }

    /* the swap, between two steps, after the rows the old weights made */
    t1 = msv_now_ns();
    n = 0;

    if (msv_sched_flush(k->s) != 0) {
        return -1;
    }

    if (u->mode == MSV_PAUSE_ABORT
        && msv_sched_abort_in_flight(k->s, MSV_ABORT_PAUSED, &n) != 0)
    {
        return -1;
    }
    if (u->mode == MSV_PAUSE_KEEP) {
        uint32_t          i;
        struct msv_slot  *sl;

        n = k->s->n_active;

        /* where each kept request's tokens change version (the first
         * change only: readers know two versions) */
        for (i = 0; i < k->s->n_slots; i++) {
            if (k->s->seqs[i].phase == MSV_SEQ_IDLE) {
                continue;
            }
            sl = msv_slot_at(k->c, i);
            if (sl->weight_pos == UINT32_MAX) {
                sl->weight_pos = k->s->seqs[i].n_out;
            }
        }
    }

    k->s->ops->commit_weights(k->s->be, u->staged);
    u->staged = NULL;
    msv_kv_seal(&k->s->kv, k->c->generation ^ u->t0);
    atomic_fetch_add_explicit(&k->c->cache_flushes, 1, memory_order_relaxed);

    memcpy(k->c->prev_weight_version, k->c->weight_version,
           sizeof(k->c->prev_weight_version));
    snprintf(k->c->weight_version, sizeof(k->c->weight_version), "%s",
             u->version);
    /*
     * W-seq: release, pairs with the reader's acquire load of weight_seq
     * before it reads the version strings of a finished request's slot.
     */
    atomic_fetch_add_explicit(&k->c->weight_seq, 1, memory_order_release);

    t2 = msv_now_ns();
    atomic_store_explicit(&k->c->weight_update_ms, (t2 - u->t0) / 1000000,
                          memory_order_relaxed);
    atomic_store_explicit(&k->c->weight_pause_ms, (t2 - t1) / 1000000,
                          memory_order_relaxed);
    atomic_fetch_add_explicit(&k->c->weight_updates, 1,
                              memory_order_relaxed);

    k->pending_op = MSV_OP_NONE;

    /* a worker paused before the update stays paused */
    if (k->was_paused == MSV_PAUSED) {
        k->s->hold = MSV_HOLD_ALL;
    } else {
        k->s->hold = MSV_HOLD_NONE;
        msv_control_set(k, MSV_RUNNING, MSV_PAUSE_ABORT);
    }

    snprintf(msg, sizeof(msg), "version \"%.64s\" serves after %.3f s "
             "(%.3f s between two steps), %u requests %s",
             u->version, (double) (t2 - u->t0) / 1e9,
             (double) (t2 - t1) / 1e9, n,
             u->mode == MSV_PAUSE_KEEP ? "kept" : "aborted");
    msv_info("control: %s", msg);
    msv_cmd_done(k->c, 0, n, k->was_paused, msg);
    return 0;
}


static void
msv_control_set(struct msv_control *k, uint32_t paused, uint32_t mode)
{
    atomic_store_explicit(&k->c->pause_mode, mode, memory_order_relaxed);
    /*
     * P-state: release, pairs with the reader's acquire load of paused
     * before it submits: a reader that sees RUNNING again after a resume
     * also sees the mode reset.
     */
    atomic_store_explicit(&k->c->paused, paused, memory_order_release);
}


static int
msv_control_pause(struct msv_control *k, uint32_t mode)
{
    char       msg[MSV_CMD_MSG_MAX];
    uint32_t   was, n;

    was = atomic_load_explicit(&k->c->paused, memory_order_relaxed);

    if (mode > MSV_PAUSE_KEEP) {
        msv_cmd_done(k->c, -EINVAL, 0, was, "unknown pause mode");
        return 0;
    }

    if (was == MSV_PAUSED) {
        /* paused already: nothing changes, not even the mode */
        msv_cmd_done(k->c, 0, 0, was, "already paused");
        return 0;
    }

    n = 0;

    switch (mode) {

    case MSV_PAUSE_ABORT:
        k->s->hold = MSV_HOLD_ALL;
        if (msv_sched_abort_in_flight(k->s, MSV_ABORT_PAUSED, &n) != 0) {
            return -1;
        }
        break;

    case MSV_PAUSE_KEEP:
        k->s->hold = MSV_HOLD_ALL;
        n = k->s->n_active;
        break;

    case MSV_PAUSE_WAIT:
        if (k->s->hold == MSV_HOLD_NONE) {
            k->s->hold = MSV_HOLD_ADMIT;
        }
        msv_control_set(k, MSV_PAUSING, mode);
        k->pending_op = MSV_OP_PAUSE;
        k->was_paused = was;
        msv_info("control: pausing (wait): %u requests to finish",
                 k->s->n_active);
        return 0;
    }

    /* paused: every row made so far is out */
    if (msv_sched_flush(k->s) != 0) {
        return -1;
    }
    msv_control_set(k, MSV_PAUSED, mode);

    snprintf(msg, sizeof(msg), "paused (%s): %u requests %s",
             msv_pause_names[mode], n, mode == MSV_PAUSE_ABORT ? "aborted"
                                                               : "kept");
    msv_info("control: %s", msg);
    msv_cmd_done(k->c, 0, n, was, msg);
    return 0;
}


static void
msv_control_resume(struct msv_control *k)
{
    uint32_t  was;

    was = atomic_load_explicit(&k->c->paused, memory_order_relaxed);

    k->s->hold = MSV_HOLD_NONE;
    msv_control_set(k, MSV_RUNNING, MSV_PAUSE_ABORT);

    if (was != MSV_RUNNING) {
        msv_info("control: resumed, %u requests running, %u queued",
                 k->s->n_active,
                 atomic_load_explicit(&k->c->waiting, memory_order_relaxed));
    }

    msv_cmd_done(k->c, 0, k->s->n_active, was,
                 was == MSV_RUNNING ? "not paused" : "resumed");
}


int
msv_control_poll(struct msv_control *k)
{
    char      msg[MSV_CMD_MSG_MAX];
    uint32_t  op, arg, n;

    if (k->pending_op == MSV_OP_UPDATE) {
        return msv_update_poll(k);
    }

    if (k->pending_op == MSV_OP_PAUSE) {
        if (k->s->n_active > 0) {
            return 0;
        }
        if (msv_sched_flush(k->s) != 0) {
            return -1;
        }
        k->pending_op = MSV_OP_NONE;
        k->s->hold = MSV_HOLD_ALL;
        msv_control_set(k, MSV_PAUSED, MSV_PAUSE_WAIT);
        msv_info("control: paused (wait): requests in flight finished");
        msv_cmd_done(k->c, 0, 0, k->was_paused, "paused (wait)");
        return 0;
    }

    if (!msv_cmd_take(k->c, &op, &arg)) {
        return 0;
    }

    switch (op) {

    case MSV_OP_PAUSE:
        return msv_control_pause(k, arg);

    case MSV_OP_RESUME:
        msv_control_resume(k);
        return 0;

    case MSV_OP_UPDATE:
        msv_update_start(k, arg);
        return 0;

    case MSV_OP_FLUSH_CACHE:
        n = msv_sched_flush_cache(k->s);
        snprintf(msg, sizeof(msg), "%u cached pages dropped", n);
        msv_info("control: cache flushed, %s", msg);
        msv_cmd_done(k->c, 0, n,
                     atomic_load_explicit(&k->c->paused,
                                          memory_order_relaxed), msg);
        return 0;

    default:
        msv_cmd_done(k->c, -EINVAL, 0,
                     atomic_load_explicit(&k->c->paused,
                                          memory_order_relaxed),
                     "unknown command");
        return 0;
    }
}
