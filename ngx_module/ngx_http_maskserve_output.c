/*
 * ngx_http_maskserve_output.c: rows -> JSON text in the request's buffers.
 *
 * mask_format "json" writes the numbers as decimal text (msv_json).
 * "packed" writes the mask and the top logprobs as base64 of the ring's
 * own int32 and float32 data (msv_b64), encoded from the row straight into
 * the section buffers; each section is one base64 stream, closed when an
 * event or the body is composed, so that every event carries complete
 * strings covering exactly its tokens (docs/API.md, "Packed masks").
 *
 * Buffers come in two sizes: ctx->buf_size for the sections and a small
 * one for glue (the text between sections, the event's head and tail).
 * Glue goes at the end of the buffer linked last when it fits there (a
 * section's, usually), so that an event is a few large buffers rather
 * than many small ones.  Both sizes are tagged with the module and
 * recycled through the request's free lists once nginx has sent them
 * (ngx_chain_update_chains in ngx_http_maskserve_stream.c, then
 * ngx_http_maskserve_output_sent), so a long stream runs in constant
 * memory.
 *
 * A stream event takes its sections' buffers, but a section keeps the
 * memory left in its last one: once the event is sent, the section's
 * next rows go into the rest of the same block, where the event's bytes
 * end (ngx_http_maskserve_sec_hold and sec_resume).  An event of one
 * short row a choice then takes no buffer, and each row is written
 * where the one before ended, as a body's rows are.  While the event is
 * still in flight, the rest is written through a second ngx_buf_t over
 * the same block: the buffers over a block are sent in the order they
 * were linked, and only the last of them owns the memory (last_shadow,
 * as ngx_event_pipe.c marks the last buffer over a raw one); an earlier
 * one, once sent, gives back its ngx_buf_t and link alone
 * (ctx->free_bare), and the block goes back to the free lists with the
 * last.
 *
 * The memory of the large buffers outlives the request: when it ends it
 * goes to a per-process cache of blocks (NGX_HTTP_MASKSERVE_BLOCK_CACHE
 * of them at most) that the next requests take from, rather than back to
 * malloc, which would return it to the kernel and fault it in again,
 * page by page, for the next body.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "msv_shm.h"
#include "msv_json.h"
#include "msv_b64.h"
#include "ngx_http_maskserve_module.h"
#include "ngx_http_maskserve_util.h"
#include "ngx_http_maskserve_output.h"


#if !(NGX_HAVE_LITTLE_ENDIAN)
#error "the packed mask format sends the ring's rows as they are: " \
       "little-endian hosts only"
#endif


#define NGX_HTTP_MASKSERVE_SMALL  512

#define MSV_PACKED_FORMAT  "csr-i32-f32-le-v1"

/* the most one number with its separator takes */
#define MSV_ID_ROOM    (MSV_I32_MAX_CHARS + 1)
#define MSV_F32_ROOM   (MSV_F32_MAX_CHARS + 1)


/*
 * A choice's sections, for what is done to each of them alike: those JSON
 * writes first (a JSON choice never touches the others, nor their cache
 * lines), then those only packed masks and logprobs use.
 */
static const size_t  ngx_http_maskserve_secs[] = {
    offsetof(ngx_http_maskserve_choice_t, ids),
    offsetof(ngx_http_maskserve_choice_t, mask),
    offsetof(ngx_http_maskserve_choice_t, mlps),
    offsetof(ngx_http_maskserve_choice_t, lpc),
    offsetof(ngx_http_maskserve_choice_t, mlen),
    offsetof(ngx_http_maskserve_choice_t, tlen),
    offsetof(ngx_http_maskserve_choice_t, tids),
    offsetof(ngx_http_maskserve_choice_t, tlps)
};

#define NGX_HTTP_MASKSERVE_NSEC                                               \
    (sizeof(ngx_http_maskserve_secs) / sizeof(ngx_http_maskserve_secs[0]))

#define NGX_HTTP_MASKSERVE_NSEC_JSON  4

#define ngx_http_maskserve_nsec(ctx)                                          \
    ((ctx)->packed ? NGX_HTTP_MASKSERVE_NSEC : NGX_HTTP_MASKSERVE_NSEC_JSON)

#define ngx_http_maskserve_sec(ch, k)                                         \
    ((ngx_http_maskserve_sec_t *) ((u_char *) (ch)                            \
                                   + ngx_http_maskserve_secs[k]))


/* the process's free blocks, each linked through its first bytes */
static u_char      *ngx_http_maskserve_blocks;
static ngx_uint_t   ngx_http_maskserve_nblocks;

/* what the process formatted since ngx_http_maskserve_output_take */
static ngx_http_maskserve_fmt_count_t
                    ngx_http_maskserve_fmt[NGX_HTTP_MASKSERVE_FMT_N];
static ngx_uint_t   ngx_http_maskserve_fmt_any;

/*
 * The pass over the ring being formatted, from its first mask row: the
 * thread's CPU time, the wall time and the tick then, and its rows' times
 * in ticks, which count when it ends (ngx_http_maskserve_output_take)
 */
static ngx_uint_t   ngx_http_maskserve_pass_open;
static uint64_t     ngx_http_maskserve_pass_cpu;
static uint64_t     ngx_http_maskserve_pass_wall;
static uint64_t     ngx_http_maskserve_pass_tick;
static uint64_t     ngx_http_maskserve_pass_ticks[NGX_HTTP_MASKSERVE_FMT_N][2];


static ngx_chain_t *ngx_http_maskserve_get_buf(ngx_http_maskserve_ctx_t *ctx,
    size_t size);
static void ngx_http_maskserve_buf_init(ngx_buf_t *b, u_char *start,
    u_char *end, u_char *pos);
static u_char *ngx_http_maskserve_block(ngx_http_maskserve_ctx_t *ctx);
static void ngx_http_maskserve_blocks_cleanup(void *data);
static ngx_int_t ngx_http_maskserve_room(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_sec_t *sec, size_t need);
static ngx_int_t ngx_http_maskserve_sec_text(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_sec_t *sec, const char *s, size_t n);
static ngx_int_t ngx_http_maskserve_sec_array(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_sec_t *sec, const void *v, uint32_t n, ngx_uint_t f32);
static ngx_inline ngx_int_t ngx_http_maskserve_sec_row(
    ngx_http_maskserve_ctx_t *ctx, ngx_http_maskserve_sec_t *sec,
    const void *v, uint32_t n, ngx_uint_t f32);
static ngx_int_t ngx_http_maskserve_sec_top(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_sec_t *sec, const struct msv_row *w);
static ngx_int_t ngx_http_maskserve_row_mask(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch, const struct msv_row *w);
static ngx_inline uint64_t ngx_http_maskserve_clock(clockid_t clock);
static ngx_int_t ngx_http_maskserve_ids_json(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch, const struct msv_row *w);
static ngx_int_t ngx_http_maskserve_lps_json(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch, const struct msv_row *w);
static ngx_int_t ngx_http_maskserve_ids_packed(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch, const struct msv_row *w);
static ngx_int_t ngx_http_maskserve_lps_packed(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch, const struct msv_row *w);
static size_t ngx_http_maskserve_mask_bytes(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch);
static ngx_int_t ngx_http_maskserve_top_json(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch, const struct msv_row *w);
static ngx_int_t ngx_http_maskserve_top_packed(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch, const struct msv_row *w);
static ngx_int_t ngx_http_maskserve_sec_b64(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_sec_t *sec, const void *src, size_t n);
static void ngx_http_maskserve_sec_reset(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_sec_t *sec);
static void ngx_http_maskserve_choice_reset(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch);
static void ngx_http_maskserve_recycle(ngx_http_maskserve_ctx_t *ctx);
static void ngx_http_maskserve_sec_hold(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_sec_t *sec);
static void ngx_http_maskserve_sec_resume(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_sec_t *sec);
static void ngx_http_maskserve_sec_renew(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_sec_t *sec);
static ngx_uint_t ngx_http_maskserve_choice_pending(
    ngx_http_maskserve_choice_t *ch);
static ngx_int_t ngx_http_maskserve_compose_choice(
    ngx_http_maskserve_ctx_t *ctx, ngx_http_maskserve_choice_t *ch,
    ngx_uint_t final, ngx_chain_t ***ll);
static ngx_int_t ngx_http_maskserve_link(ngx_http_maskserve_ctx_t *ctx,
    ngx_chain_t ***ll, ngx_http_maskserve_sec_t *sec);
static ngx_buf_t *ngx_http_maskserve_glue_buf(ngx_http_maskserve_ctx_t *ctx,
    ngx_chain_t ***ll, size_t n);
static ngx_int_t ngx_http_maskserve_glue(ngx_http_maskserve_ctx_t *ctx,
    ngx_chain_t ***ll, const char *s, size_t n);
static ngx_int_t ngx_http_maskserve_glue2(ngx_http_maskserve_ctx_t *ctx,
    ngx_chain_t ***ll, const char *a, const char *b);
static ngx_int_t ngx_http_maskserve_fail_row(ngx_http_maskserve_ctx_t *ctx,
    ngx_uint_t status, const char *type, const char *param,
    const char *fmt, ...);


ngx_int_t
ngx_http_maskserve_output_init(ngx_http_maskserve_ctx_t *ctx)
{
    ngx_uint_t  i;

    /* sampling_params.n, set by the caller: one slot runs each */
    if (ctx->n_choices == 0) {
        ctx->n_choices = 1;
    }

    ctx->live = ctx->n_choices;
    ctx->choices = ngx_pcalloc(ctx->r->pool, ctx->n_choices
                               * sizeof(ngx_http_maskserve_choice_t));
    if (ctx->choices == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < ctx->n_choices; i++) {
        ctx->choices[i].index = i;
        ngx_http_maskserve_choice_reset(ctx, &ctx->choices[i]);
    }

    ctx->buf_size = ctx->stream && !ctx->packed
                    ? NGX_HTTP_MASKSERVE_STREAM_BUF
                    : NGX_HTTP_MASKSERVE_BODY_BUF;
    ctx->pending = 0;
    ctx->in_flight = 0;

    return NGX_OK;
}


ngx_int_t
ngx_http_maskserve_output_row(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch, const struct msv_row *w)
{
    char       *p;
    ngx_int_t   rc;

    if (w->token < 0) {
        /* an abort row carries nothing */
        return NGX_OK;
    }

    /* token_ids */

    if (ngx_http_maskserve_room(ctx, &ch->ids, MSV_ID_ROOM) != NGX_OK) {
        goto nomem;
    }

    p = (char *) ch->ids.buf->last;
    if (ch->ids.count++) {
        *p++ = ',';
    }

    p = msv_fmt_i32(p, w->token);
    ch->ids.bytes += p - (char *) ch->ids.buf->last;
    ctx->pending += p - (char *) ch->ids.buf->last;
    ch->ids.buf->last = (u_char *) p;

    ctx->completion_tokens++;
    ch->completion_tokens++;

    if (ctx->mode != MSV_MASK_OFF) {

        if (w->mode != ctx->mode || w->n_support == 0
            || (ctx->mode == MSV_MASK_SELECTED && w->n_lps != 1)
            || (ctx->mode == MSV_MASK_SUPPORT && w->n_lps != w->n_support))
        {
            return ngx_http_maskserve_fail_row(ctx,
                       NGX_HTTP_INTERNAL_SERVER_ERROR,
                       NGX_HTTP_MASKSERVE_SERVER, NULL,
                       "the worker sent a row without the requested mask "
                       "(mode %d, %uD ids, %uD logprobs)",
                       (int) w->mode, w->n_support, w->n_lps);
        }

        if (ctx->lcf->max_support && w->n_support > ctx->lcf->max_support) {
            return ngx_http_maskserve_fail_row(ctx, NGX_HTTP_BAD_REQUEST,
                       NGX_HTTP_MASKSERVE_INVALID, "return_sampling_mask",
                       "the sampling support of token %uD has %uD ids, more "
                       "than maskserve_max_support %ui; lower top_k or "
                       "top_p", w->pos, w->n_support,
                       ctx->lcf->max_support);
        }

        ctx->mask_entries += w->n_support;

        if (ngx_http_maskserve_row_mask(ctx, ch, w) != NGX_OK) {
            goto nomem;
        }
    }

    /* logprobs.content */

    if (ctx->logprobs >= 0) {
        rc = ctx->packed ? ngx_http_maskserve_top_packed(ctx, ch, w)
                         : ngx_http_maskserve_top_json(ctx, ch, w);
        if (rc != NGX_OK) {
            goto nomem;
        }
    }

    /*
     * A stream holds output only while the client has not taken the last
     * event (busy): what a fast client is sent at the end of this pass
     * does not count.  A non-streaming answer holds everything.
     */
    if (ctx->stream
        ? ctx->busy && ctx->pending + ctx->in_flight > ctx->lcf->output_limit
        : ctx->pending > ctx->lcf->output_limit)
    {
        if (ctx->stream) {
            return ngx_http_maskserve_fail_row(ctx,
                       NGX_HTTP_SERVICE_UNAVAILABLE,
                       NGX_HTTP_MASKSERVE_OVERLOAD, NULL,
                       "the client reads too slowly: %uz bytes of output "
                       "waiting exceed maskserve_output_limit %uz",
                       ctx->pending + ctx->in_flight,
                       ctx->lcf->output_limit);
        }

        return ngx_http_maskserve_fail_row(ctx, NGX_HTTP_BAD_REQUEST,
                   NGX_HTTP_MASKSERVE_INVALID, "sampling_params.max_tokens",
                   "the response exceeds maskserve_output_limit %uz bytes "
                   "after %ui tokens; use \"stream\": true or fewer tokens",
                   ctx->lcf->output_limit, ctx->completion_tokens);
    }

    return NGX_OK;

nomem:

    return ngx_http_maskserve_fail_row(ctx, NGX_HTTP_INTERNAL_SERVER_ERROR,
                                       NGX_HTTP_MASKSERVE_SERVER, NULL,
                                       "out of memory formatting the "
                                       "response");
}


/*
 * The row's mask, timed and counted: the one place where every mask row
 * is formatted, in either form.  The clock is read three times a row
 * (ngx_http_maskserve_output_tick: the time-stamp counter, about 10 ns a read on
 * x86-64, where CLOCK_MONOTONIC takes 24 ns through the vDSO and a system
 * call, some hundreds of ns, on hosts whose kernel clock has no vDSO
 * path).  The ids (packed: with the row's length) and the logprobs are
 * timed apart, as their rates differ fourfold.
 *
 * The ticks become nanoseconds at the end of the pass over the ring,
 * which is timed once with CLOCK_MONOTONIC (and the tick).  Wall time
 * also counts while the process is preempted, which on a busy host can be
 * most of it, so the pass is also timed with the thread's CPU time (a
 * system call, 0.5 us): the rows' times are scaled by the share of the
 * pass the process was on a CPU (1 when it was never preempted).
 */

static ngx_int_t
ngx_http_maskserve_row_mask(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch, const struct msv_row *w)
{
    size_t                           b0;
    uint64_t                         t0, t1, t2;
    ngx_int_t                        rc;
    ngx_uint_t                       f;
    ngx_http_maskserve_fmt_count_t  *c;

    b0 = ngx_http_maskserve_mask_bytes(ctx, ch);

    if (!ngx_http_maskserve_pass_open) {
        ngx_http_maskserve_pass_open = 1;
        ngx_http_maskserve_pass_cpu =
            ngx_http_maskserve_clock(CLOCK_THREAD_CPUTIME_ID);
        ngx_http_maskserve_pass_wall =
            ngx_http_maskserve_clock(CLOCK_MONOTONIC);
        ngx_http_maskserve_pass_tick = ngx_http_maskserve_output_tick();
    }

    t0 = ngx_http_maskserve_output_tick();

    rc = ctx->packed ? ngx_http_maskserve_ids_packed(ctx, ch, w)
                     : ngx_http_maskserve_ids_json(ctx, ch, w);
    if (rc != NGX_OK) {
        return rc;
    }

    t1 = ngx_http_maskserve_output_tick();

    rc = ctx->packed ? ngx_http_maskserve_lps_packed(ctx, ch, w)
                     : ngx_http_maskserve_lps_json(ctx, ch, w);
    if (rc != NGX_OK) {
        return rc;
    }

    t2 = ngx_http_maskserve_output_tick();

    f = ctx->packed ? NGX_HTTP_MASKSERVE_FMT_PACKED
                    : NGX_HTTP_MASKSERVE_FMT_JSON;
    c = &ngx_http_maskserve_fmt[f];
    c->rows++;
    c->ids += w->n_support;
    c->floats += w->n_lps;
    c->bytes += ngx_http_maskserve_mask_bytes(ctx, ch) - b0;
    ngx_http_maskserve_pass_ticks[f][0] += t1 - t0;
    ngx_http_maskserve_pass_ticks[f][1] += t2 - t1;
    ngx_http_maskserve_fmt_any = 1;

    return NGX_OK;
}


static ngx_inline uint64_t
ngx_http_maskserve_clock(clockid_t clock)
{
    struct timespec  ts;

    (void) clock_gettime(clock, &ts);

    return (uint64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}



/*
 * The bytes of the choice's mask sections, each base64 string counted as
 * if closed now (its last group with padding): the difference over a row
 * is what the row adds to the response.
 */

static size_t
ngx_http_maskserve_mask_bytes(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch)
{
    if (!ctx->packed) {
        return ch->mask.bytes + ch->mlps.bytes;
    }

    return ch->mlen.bytes + (ch->mlen.b64.n ? 4 : 0)
           + ch->mask.bytes + (ch->mask.b64.n ? 4 : 0)
           + ch->mlps.bytes + (ch->mlps.b64.n ? 4 : 0);
}


ngx_uint_t
ngx_http_maskserve_output_take(ngx_http_maskserve_fmt_count_t *out)
{
    double      ns;
    uint64_t    cpu, wall, ticks;
    ngx_uint_t  f, a;

    if (!ngx_http_maskserve_fmt_any) {
        return 0;
    }

    /* the pass ends: its rows' times, less the share spent preempted */
    if (ngx_http_maskserve_pass_open) {
        cpu = ngx_http_maskserve_clock(CLOCK_THREAD_CPUTIME_ID)
              - ngx_http_maskserve_pass_cpu;
        wall = ngx_http_maskserve_clock(CLOCK_MONOTONIC)
               - ngx_http_maskserve_pass_wall;
        ticks = ngx_http_maskserve_output_tick() - ngx_http_maskserve_pass_tick;

        /* ns a tick over the pass, by the share of it spent on a CPU */
        ns = ticks ? (double) ngx_min(cpu, wall) / (double) ticks : 0.0;

        for (f = 0; f < NGX_HTTP_MASKSERVE_FMT_N; f++) {
            for (a = 0; a < 2; a++) {
                /* a counter that went back (another CPU's) counts none */
                if (ngx_http_maskserve_pass_ticks[f][a] > ticks) {
                    ngx_http_maskserve_pass_ticks[f][a] = 0;
                }
            }

            ngx_http_maskserve_fmt[f].ids_ns +=
                (uint64_t) (ngx_http_maskserve_pass_ticks[f][0] * ns + 0.5);
            ngx_http_maskserve_fmt[f].floats_ns +=
                (uint64_t) (ngx_http_maskserve_pass_ticks[f][1] * ns + 0.5);
        }

        ngx_memzero(ngx_http_maskserve_pass_ticks,
                    sizeof(ngx_http_maskserve_pass_ticks));
        ngx_http_maskserve_pass_open = 0;
    }

    if (out) {
        ngx_memcpy(out, ngx_http_maskserve_fmt,
                   sizeof(ngx_http_maskserve_fmt));
    }

    ngx_memzero(ngx_http_maskserve_fmt, sizeof(ngx_http_maskserve_fmt));
    ngx_http_maskserve_fmt_any = 0;

    return 1;
}


/* a row of sampling_mask as JSON text */

static ngx_int_t
ngx_http_maskserve_ids_json(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch, const struct msv_row *w)
{
    return ngx_http_maskserve_sec_row(ctx, &ch->mask, msv_row_ids(w),
                                      w->n_support, 0);
}


/* its sampling_mask_logprobs: a row, or selected, one number */

static ngx_int_t
ngx_http_maskserve_lps_json(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch, const struct msv_row *w)
{
    char  *p;

    if (ctx->mode != MSV_MASK_SELECTED) {
        return ngx_http_maskserve_sec_row(ctx, &ch->mlps, msv_row_lps(w),
                                          w->n_lps, 1);
    }

    if (ch->mlps.count++) {
        if (ngx_http_maskserve_sec_text(ctx, &ch->mlps, ",", 1) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    if (ngx_http_maskserve_room(ctx, &ch->mlps, MSV_F32_ROOM) != NGX_OK) {
        return NGX_ERROR;
    }

    p = msv_fmt_f32((char *) ch->mlps.buf->last, msv_row_lps(w)[0]);
    ch->mlps.bytes += p - (char *) ch->mlps.buf->last;
    ctx->pending += p - (char *) ch->mlps.buf->last;
    ch->mlps.buf->last = (u_char *) p;

    return NGX_OK;
}


/* logprobs.content as JSON text */

static ngx_int_t
ngx_http_maskserve_top_json(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch, const struct msv_row *w)
{
    if (ch->lpc.count++) {
        if (ngx_http_maskserve_sec_text(ctx, &ch->lpc, ",", 1) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    return ngx_http_maskserve_sec_top(ctx, &ch->lpc, w);
}


/*
 * The same as base64 streams: the row's ids and logprobs go from the ring
 * into the output buffers as they are (little-endian int32 and float32).
 */

static ngx_int_t
ngx_http_maskserve_ids_packed(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch, const struct msv_row *w)
{
    int32_t  len;

    len = (int32_t) w->n_support;

    ch->mlen.count++;
    ch->mask.count++;

    if (ngx_http_maskserve_sec_b64(ctx, &ch->mlen, &len, 4) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_maskserve_sec_b64(ctx, &ch->mask, msv_row_ids(w),
                                      4 * (size_t) w->n_support);
}


static ngx_int_t
ngx_http_maskserve_lps_packed(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch, const struct msv_row *w)
{
    ch->mlps.count++;

    return ngx_http_maskserve_sec_b64(ctx, &ch->mlps, msv_row_lps(w),
                                      4 * (size_t) w->n_lps);
}


static ngx_int_t
ngx_http_maskserve_top_packed(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch, const struct msv_row *w)
{
    int32_t                len;
    uint32_t               i;
    const struct msv_top  *top;

    len = (int32_t) w->n_top;

    ch->lpc.count++;
    ch->tlen.count++;

    if (ngx_http_maskserve_sec_b64(ctx, &ch->lpc, &w->logprob, 4) != NGX_OK
        || ngx_http_maskserve_sec_b64(ctx, &ch->tlen, &len, 4) != NGX_OK)
    {
        return NGX_ERROR;
    }

    top = msv_row_top(w);

    for (i = 0; i < w->n_top; i++) {
        ch->tids.count++;
        ch->tlps.count++;

        if (ngx_http_maskserve_sec_b64(ctx, &ch->tids, &top[i].id, 4)
            != NGX_OK
            || ngx_http_maskserve_sec_b64(ctx, &ch->tlps, &top[i].lp, 4)
               != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_maskserve_output_pending(ngx_http_maskserve_ctx_t *ctx)
{
    ngx_uint_t                    i;
    ngx_http_maskserve_choice_t  *ch;

    for (i = 0; i < ctx->n_choices; i++) {
        ch = &ctx->choices[i];

        /* a stream also tells a choice's end as soon as it is known */
        if (ngx_http_maskserve_choice_pending(ch)
            || (ctx->stream && ch->done && !ch->reported))
        {
            return 1;
        }
    }

    return 0;
}


static ngx_uint_t
ngx_http_maskserve_choice_pending(ngx_http_maskserve_choice_t *ch)
{
    /* every row adds to ids; the others follow it */
    return ch->ids.count || ch->mask.count || ch->mlps.count
           || ch->lpc.count;
}


size_t
ngx_http_maskserve_output_held(ngx_http_maskserve_ctx_t *ctx)
{
    return ctx->pending + ctx->in_flight;
}


ngx_chain_t *
ngx_http_maskserve_output_compose(ngx_http_maskserve_ctx_t *ctx,
    ngx_uint_t final, off_t *len)
{
    u_char                       *p;
    ngx_buf_t                    *b;
    ngx_uint_t                    i, j, k;
    ngx_chain_t                  *out, **ll, *cl;
    ngx_http_maskserve_choice_t  *ch;

    out = NULL;
    ll = &out;

    /* head */

    cl = ngx_http_maskserve_get_buf(ctx, NGX_HTTP_MASKSERVE_SMALL);
    if (cl == NULL) {
        return NULL;
    }

    b = cl->buf;
    p = b->last;

    if (ctx->stream) {
        p = ngx_cpymem(p, "data: ", 6);
    }

    /* the id is [A-Za-z0-9._:-]: nothing to escape */
    p = ngx_cpymem(p, "{\"request_id\":\"", 15);
    p = ngx_cpymem(p, ctx->id.data, ctx->id.len);
    *p++ = '"';

    if (ctx->seed_known) {
        p = ngx_cpymem(p, ",\"seed\":", 8);
        p = (u_char *) msv_fmt_u64((char *) p, ctx->seed);
    }

    p = ngx_cpymem(p, ",\"choices\":[", sizeof(",\"choices\":[") - 1);
    b->last = p;

    *ll = cl;
    ll = &cl->next;

    k = 0;

    for (i = 0; i < ctx->n_choices; i++) {
        ch = &ctx->choices[i];

        /*
         * A stream event carries the choices that have new tokens or
         * whose end is new (each says its index); a body carries all.
         */
        if (ctx->stream && !ngx_http_maskserve_choice_pending(ch)
            && (ch->reported || !(ch->done || final)))
        {
            continue;
        }

        if (k++ && ngx_http_maskserve_glue(ctx, &ll, ",", 1) != NGX_OK) {
            return NULL;
        }

        if (ngx_http_maskserve_compose_choice(ctx, ch, final, &ll)
            != NGX_OK)
        {
            return NULL;
        }
    }

    /* tail */

    b = ngx_http_maskserve_glue_buf(ctx, &ll, NGX_HTTP_MASKSERVE_SMALL);
    if (b == NULL) {
        return NULL;
    }

    p = b->last;

    *p++ = ']';

    if (final) {
        p = ngx_cpymem(p, ",\"usage\":{\"prompt_tokens\":",
                       sizeof(",\"usage\":{\"prompt_tokens\":") - 1);
        p = (u_char *) msv_fmt_u64((char *) p, ctx->prompt_tokens);
        p = ngx_cpymem(p, ",\"completion_tokens\":",
                       sizeof(",\"completion_tokens\":") - 1);
        p = (u_char *) msv_fmt_u64((char *) p, ctx->completion_tokens);
        *p++ = '}';
    }

    *p++ = '}';

    if (ctx->stream) {
        *p++ = '\n';
        *p++ = '\n';

        if (final) {
            p = ngx_cpymem(p, "data: [DONE]\n\n", 14);
        }
    }

    b->last = p;

    /*
     * The sections now belong to the chain.  A stream's go on in what is
     * left of their last buffers once the event is sent, unless their
     * choice has ended.
     */

    for (i = 0; i < ctx->n_choices; i++) {
        ch = &ctx->choices[i];

        if (!ctx->stream || final || ch->done) {
            ngx_http_maskserve_choice_reset(ctx, ch);
            continue;
        }

        for (j = 0; j < ngx_http_maskserve_nsec(ctx); j++) {
            ngx_http_maskserve_sec_hold(ctx, ngx_http_maskserve_sec(ch, j));
        }
    }

    ctx->pending = 0;

    *len = 0;
    for (cl = out; cl; cl = cl->next) {
        *len += ngx_buf_size(cl->buf);
    }

    return out;
}


/*
 * One element of "choices": its sections between glue.  JSON:
 *   {"index":0,"token_ids":[..],"sampling_mask":[..],
 *    "sampling_mask_logprobs":[..],"logprobs":{"content":[..]},
 *    "finish_reason":..}
 * packed:
 *   {"index":0,"token_ids":[..],"sampling_mask_packed":{"format":"..",
 *    "lengths":"..","ids":"..","logprobs":".."},"logprobs_packed":{
 *    "format":"..","token_logprobs":"..","lengths":"..","ids":"..",
 *    "logprobs":".."},"finish_reason":..}
 */

static ngx_int_t
ngx_http_maskserve_compose_choice(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch, ngx_uint_t final, ngx_chain_t ***ll)
{
    u_char      *p;
    ngx_buf_t   *b;
    const char  *close;

    static const char  *finish[] = { "null", "\"stop\"", "\"length\"",
                                     "\"abort\"" };

    /* {"index":N,"seed":S,"token_ids":[ : 71 bytes at most */
    b = ngx_http_maskserve_glue_buf(ctx, ll, 80);
    if (b == NULL) {
        return NGX_ERROR;
    }

    p = ngx_cpymem(b->last, "{\"index\":", 9);
    p = (u_char *) msv_fmt_u64((char *) p, ch->index);

    if (ctx->n_choices > 1 && ch->seed_known) {
        /* choice i runs with seed s + i, or one the worker drew for it */
        p = ngx_cpymem(p, ",\"seed\":", 8);
        p = (u_char *) msv_fmt_u64((char *) p, ch->seed);
    }

    p = ngx_cpymem(p, ",\"token_ids\":[", 14);
    b->last = p;

    if (ngx_http_maskserve_link(ctx, ll, &ch->ids) != NGX_OK) {
        return NGX_ERROR;
    }

    close = "]";

    if (ctx->mode != MSV_MASK_OFF && ctx->packed) {
        if (ngx_http_maskserve_glue2(ctx, ll, close,
                ",\"sampling_mask_packed\":{\"format\":\"" MSV_PACKED_FORMAT
                "\",\"lengths\":\"") != NGX_OK
            || ngx_http_maskserve_link(ctx, ll, &ch->mlen) != NGX_OK
            || ngx_http_maskserve_glue2(ctx, ll, "\",\"ids\":\"", "")
               != NGX_OK
            || ngx_http_maskserve_link(ctx, ll, &ch->mask) != NGX_OK
            || ngx_http_maskserve_glue2(ctx, ll, "\",\"logprobs\":\"", "")
               != NGX_OK
            || ngx_http_maskserve_link(ctx, ll, &ch->mlps) != NGX_OK)
        {
            return NGX_ERROR;
        }

        close = "\"}";

    } else if (ctx->mode != MSV_MASK_OFF) {
        if (ngx_http_maskserve_glue2(ctx, ll, close, ",\"sampling_mask\":[")
            != NGX_OK
            || ngx_http_maskserve_link(ctx, ll, &ch->mask) != NGX_OK
            || ngx_http_maskserve_glue2(ctx, ll, "],",
                                        "\"sampling_mask_logprobs\":[")
               != NGX_OK
            || ngx_http_maskserve_link(ctx, ll, &ch->mlps) != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    if (ctx->logprobs >= 0 && ctx->packed) {
        if (ngx_http_maskserve_glue2(ctx, ll, close,
                ",\"logprobs_packed\":{\"format\":\"" MSV_PACKED_FORMAT
                "\",\"token_logprobs\":\"") != NGX_OK
            || ngx_http_maskserve_link(ctx, ll, &ch->lpc) != NGX_OK
            || ngx_http_maskserve_glue2(ctx, ll, "\",\"lengths\":\"", "")
               != NGX_OK
            || ngx_http_maskserve_link(ctx, ll, &ch->tlen) != NGX_OK
            || ngx_http_maskserve_glue2(ctx, ll, "\",\"ids\":\"", "")
               != NGX_OK
            || ngx_http_maskserve_link(ctx, ll, &ch->tids) != NGX_OK
            || ngx_http_maskserve_glue2(ctx, ll, "\",\"logprobs\":\"", "")
               != NGX_OK
            || ngx_http_maskserve_link(ctx, ll, &ch->tlps) != NGX_OK)
        {
            return NGX_ERROR;
        }

        close = "\"}";

    } else if (ctx->logprobs >= 0) {
        if (ngx_http_maskserve_glue2(ctx, ll, close,
                                     ",\"logprobs\":{\"content\":[")
            != NGX_OK
            || ngx_http_maskserve_link(ctx, ll, &ch->lpc) != NGX_OK)
        {
            return NGX_ERROR;
        }

        close = "]}";
    }

    /* the close, finish_reason, the weight versions: a small buffer */
    b = ngx_http_maskserve_glue_buf(ctx, ll, NGX_HTTP_MASKSERVE_SMALL);
    if (b == NULL) {
        return NGX_ERROR;
    }

    p = (u_char *) ngx_cpystrn(b->last, (u_char *) close, 4);
    p = ngx_cpymem(p, ",\"finish_reason\":", 17);
    /* a choice's end is told once: in its last event, or in the body */
    if ((ch->done || final) && !ch->reported) {
        ch->reported = 1;
        p = (u_char *) ngx_cpystrn(p, (u_char *) finish[ch->finish], 16);

        if (ch->finish == MSV_FINISH_ABORT
            && ch->abort_reason == MSV_ABORT_PAUSED)
        {
            /* ended by POST /inference/v1/pause (mode abort), not
             * cancelled */
            p = ngx_cpymem(p, ",\"abort_reason\":\"paused\"", 24);
        }

        /* the version of the weights it ran on (docs/API.md) */
        p = ngx_cpymem(p, ",\"weight_version\":\"", 19);
        p = ngx_cpystrn(p, ch->weight_version, MSV_VERSION_MAX + 1);
        *p++ = '"';

        if (ch->weight_spans) {
            /* kept through an update: the tokens of each version */
            p = ngx_sprintf(p, ",\"weight_versions\":[{\"version\":\"%s\","
                            "\"start\":0,\"end\":%ui},{\"version\":\"%s\","
                            "\"start\":%ui,\"end\":%ui}]",
                            ch->weight_version, ch->weight_pos,
                            ch->weight_next, ch->weight_pos,
                            ch->weight_end);
        }

    } else {
        p = ngx_cpymem(p, "null", 4);
    }
    *p++ = '}';
    b->last = p;

    return NGX_OK;
}


ngx_chain_t *
ngx_http_maskserve_output_error_event(ngx_http_maskserve_ctx_t *ctx)
{
    u_char       *p;
    size_t        len, esc, plen;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    esc = ngx_escape_json(NULL, ctx->err.message.data, ctx->err.message.len);
    plen = ctx->err.param ? ngx_strlen(ctx->err.param) : 0;

    len = sizeof("data: {\"error\":{\"message\":\"") - 1
          + ctx->err.message.len + esc
          + sizeof("\",\"type\":\"\",\"param\":\"\",\"code\":}}\n\n") - 1
          + ngx_strlen(ctx->err.type) + plen + NGX_INT_T_LEN
          + sizeof("data: [DONE]\n\n") - 1;

    b = ngx_create_temp_buf(ctx->r->pool, len);
    if (b == NULL) {
        return NULL;
    }

    cl = ngx_alloc_chain_link(ctx->r->pool);
    if (cl == NULL) {
        return NULL;
    }

    p = b->last;
    p = ngx_cpymem(p, "data: {\"error\":{\"message\":\"",
                   sizeof("data: {\"error\":{\"message\":\"") - 1);
    p = (u_char *) ngx_escape_json(p, ctx->err.message.data,
                                   ctx->err.message.len);
    p = ngx_sprintf(p, "\",\"type\":\"%s\",\"param\":", ctx->err.type);

    if (ctx->err.param) {
        p = ngx_sprintf(p, "\"%s\"", ctx->err.param);

    } else {
        p = ngx_cpymem(p, "null", 4);
    }

    p = ngx_sprintf(p, ",\"code\":%ui}}\n\ndata: [DONE]\n\n",
                    ctx->err.status);
    b->last = p;

    cl->buf = b;
    cl->next = NULL;

    return cl;
}


/*
 * What nginx gave back (ctx->free, both sizes mixed, the last sent first)
 * is moved onto one list per size, in its order and on top of what was
 * there: taking one is never a search, and it is the one sent last, the
 * likeliest to be still in the CPU's cache.  This runs right after
 * ngx_chain_update_chains, which has just walked the same links and
 * buffers: walked at the next row instead, one step later, they were out
 * of the cache, and the walk cost more than the rest of taking a buffer.
 * A buffer whose block a later buffer took on (no last_shadow) goes to
 * ctx->free_bare without its memory.
 */

static void
ngx_http_maskserve_recycle(ngx_http_maskserve_ctx_t *ctx)
{
    ngx_chain_t  *cl, *small, *big, *bare, **ls, **lb, **lr;

    if (ctx->free == NULL) {
        return;
    }

    small = NULL;
    big = NULL;
    bare = NULL;
    ls = &small;
    lb = &big;
    lr = &bare;

    for (cl = ctx->free; cl; cl = cl->next) {
        if (!cl->buf->last_shadow) {
            *lr = cl;
            lr = &cl->next;

        } else if ((size_t) (cl->buf->end - cl->buf->start)
                   == NGX_HTTP_MASKSERVE_SMALL)
        {
            *ls = cl;
            ls = &cl->next;

        } else {
            *lb = cl;
            lb = &cl->next;
        }
    }

    *ls = ctx->free_small;
    ctx->free_small = small;
    *lb = ctx->free_big;
    ctx->free_big = big;
    *lr = ctx->free_bare;
    ctx->free_bare = bare;
    ctx->free = NULL;
}


/*
 * A buffer of the given size class, from the free lists when possible:
 * the only one over its memory (last_shadow), until a section hands the
 * rest of it on to a second one (ngx_http_maskserve_sec_resume).
 */

static ngx_chain_t *
ngx_http_maskserve_get_buf(ngx_http_maskserve_ctx_t *ctx, size_t size)
{
    u_char       *start;
    ngx_buf_t    *b;
    ngx_chain_t  *cl, **fl;

    /* what update_chains gave back since the last recycle */
    ngx_http_maskserve_recycle(ctx);

    fl = size == NGX_HTTP_MASKSERVE_SMALL ? &ctx->free_small
                                          : &ctx->free_big;

    if (*fl) {
        cl = *fl;
        *fl = cl->next;
        goto found;
    }

    start = size == NGX_HTTP_MASKSERVE_BODY_BUF
            ? ngx_http_maskserve_block(ctx)
            : ngx_palloc(ctx->r->pool, size);
    if (start == NULL) {
        return NULL;
    }

    cl = ngx_alloc_chain_link(ctx->r->pool);
    if (cl == NULL) {
        return NULL;
    }

    b = ngx_calloc_buf(ctx->r->pool);
    if (b == NULL) {
        return NULL;
    }

    cl->buf = b;
    b->start = start;
    b->end = start + size;

found:

    start = cl->buf->start;
    ngx_http_maskserve_buf_init(cl->buf, start, start + size, start);

    cl->next = NULL;

    return cl;
}


/*
 * One of the module's buffers over start .. end, empty at pos, the last
 * over its memory.
 */

static void
ngx_http_maskserve_buf_init(ngx_buf_t *b, u_char *start, u_char *end,
    u_char *pos)
{
    ngx_memzero(b, sizeof(ngx_buf_t));

    b->start = start;
    b->end = end;
    b->pos = pos;
    b->last = pos;
    b->temporary = 1;
    b->last_shadow = 1;
    b->tag = (ngx_buf_tag_t) &ngx_http_maskserve_module;
}


/*
 * A block of BODY_BUF bytes for the request: from the process's cache, or
 * new.  The request keeps a list of its blocks; its pool's cleanup hands
 * them back (nothing of the request refers to them any more by then).
 */

static u_char *
ngx_http_maskserve_block(ngx_http_maskserve_ctx_t *ctx)
{
    u_char              *b, **e;
    ngx_pool_cleanup_t  *cln;

    if (ctx->blocks.elts == NULL) {
        if (ngx_array_init(&ctx->blocks, ctx->r->pool, 16, sizeof(u_char *))
            != NGX_OK)
        {
            return NULL;
        }

        cln = ngx_pool_cleanup_add(ctx->r->pool, 0);
        if (cln == NULL) {
            return NULL;
        }

        cln->handler = ngx_http_maskserve_blocks_cleanup;
        cln->data = ctx;
    }

    e = ngx_array_push(&ctx->blocks);
    if (e == NULL) {
        return NULL;
    }

    if (ngx_http_maskserve_blocks) {
        b = ngx_http_maskserve_blocks;
        ngx_memcpy(&ngx_http_maskserve_blocks, b, sizeof(u_char *));
        ngx_http_maskserve_nblocks--;

    } else {
        b = ngx_alloc(NGX_HTTP_MASKSERVE_BODY_BUF, ctx->r->pool->log);
        if (b == NULL) {
            ctx->blocks.nelts--;
            return NULL;
        }
    }

    *e = b;

    return b;
}


static void
ngx_http_maskserve_blocks_cleanup(void *data)
{
    ngx_http_maskserve_ctx_t  *ctx = data;

    u_char      **e;
    ngx_uint_t    i;

    e = ctx->blocks.elts;

    for (i = 0; i < ctx->blocks.nelts; i++) {
        if (ngx_http_maskserve_nblocks >= NGX_HTTP_MASKSERVE_BLOCK_CACHE) {
            ngx_free(e[i]);
            continue;
        }

        ngx_memcpy(e[i], &ngx_http_maskserve_blocks, sizeof(u_char *));
        ngx_http_maskserve_blocks = e[i];
        ngx_http_maskserve_nblocks++;
    }

    ctx->blocks.nelts = 0;
}


static ngx_int_t
ngx_http_maskserve_room(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_sec_t *sec, size_t need)
{
    ngx_chain_t  *cl;

    if (sec->buf && (size_t) (sec->buf->end - sec->buf->last) >= need) {
        return NGX_OK;
    }

    cl = ngx_http_maskserve_get_buf(ctx, ctx->buf_size);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    *sec->last = cl;
    sec->last = &cl->next;
    sec->buf = cl->buf;

    return NGX_OK;
}


static ngx_int_t
ngx_http_maskserve_sec_text(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_sec_t *sec, const char *s, size_t n)
{
    if (ngx_http_maskserve_room(ctx, sec, n) != NGX_OK) {
        return NGX_ERROR;
    }

    sec->buf->last = ngx_cpymem(sec->buf->last, s, n);
    sec->bytes += n;
    ctx->pending += n;

    return NGX_OK;
}


/*
 * A row's array in a section of rows, after a ',' unless it is the
 * section's first: when msv_json's bound for the whole of it fits in the
 * buffer at hand (all but the rows that reach a buffer's end), one check,
 * the section's words read once and written once, and msv_json writes
 * the brackets; else piece by piece (sec_array).  This runs inside the
 * format counters' intervals, where a short row's fixed cost weighs
 * against its few numbers.
 */

static ngx_inline ngx_int_t
ngx_http_maskserve_sec_row(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_sec_t *sec, const void *v, uint32_t n, ngx_uint_t f32)
{
    char       *p, *start;
    size_t      max;
    ngx_buf_t  *b;

    b = sec->buf;
    max = 1 + (f32 ? msv_json_f32s_max(n) : msv_json_ids_max(n));

    if (b == NULL || (size_t) (b->end - b->last) < max) {
        if (sec->count++
            && ngx_http_maskserve_sec_text(ctx, sec, ",", 1) != NGX_OK)
        {
            return NGX_ERROR;
        }

        return ngx_http_maskserve_sec_array(ctx, sec, v, n, f32);
    }

    start = (char *) b->last;
    p = start;

    if (sec->count++) {
        *p++ = ',';
    }

    p = f32 ? msv_json_f32s(p, v, n) : msv_json_ids(p, v, n);

    b->last = (u_char *) p;
    sec->bytes += p - start;
    ctx->pending += p - start;

    return NGX_OK;
}


/*
 * "[a,b,...]" of int32 ids or float32 values into a section: as many
 * elements as fit in the buffer at hand, then in new ones, each filled to
 * its end, all written by msv_json's array loop.
 */

static ngx_int_t
ngx_http_maskserve_sec_array(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_sec_t *sec, const void *v, uint32_t n, ngx_uint_t f32)
{
    char      *p, *start;
    size_t     room;
    uint32_t   i, k;

    if (ngx_http_maskserve_sec_text(ctx, sec, "[", 1) != NGX_OK) {
        return NGX_ERROR;
    }

    if (n == 0) {
        return ngx_http_maskserve_sec_text(ctx, sec, "]", 1);
    }

    for (i = 0; i < n; i += k) {
        room = sec->buf->end - sec->buf->last;
        k = f32 ? msv_json_f32s_fit(room) : msv_json_ids_fit(room);

        if (k == 0) {
            /* not one more here: a new buffer */
            if (ngx_http_maskserve_room(ctx, sec, ctx->buf_size) != NGX_OK) {
                return NGX_ERROR;
            }

            continue;
        }

        k = ngx_min(k, n - i);

        start = (char *) sec->buf->last;
        p = f32 ? msv_json_f32s_part(start, (const float *) v + i, k)
                : msv_json_ids_part(start, (const int32_t *) v + i, k);

        sec->buf->last = (u_char *) p;
        sec->bytes += p - start;
        ctx->pending += p - start;
    }

    /* the last element's ',' closes the array */
    sec->buf->last[-1] = ']';

    return NGX_OK;
}


/*
 * {"token_id":t,"logprob":lp,"top_logprobs":[{"token_id":i,"logprob":l},
 * ...]}, as vLLM's GenerateLogProbs content entries.
 */

#define MSV_TOP_ROOM                                                          \
    (sizeof("{\"token_id\":,\"logprob\":},") - 1 + MSV_I32_MAX_CHARS          \
     + MSV_F32_MAX_CHARS)

static ngx_int_t
ngx_http_maskserve_sec_top(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_sec_t *sec, const struct msv_row *w)
{
    char                  *p, *start;
    uint32_t               i;
    const struct msv_top  *top;

    if (ngx_http_maskserve_room(ctx, sec, MSV_TOP_ROOM + 20) != NGX_OK) {
        return NGX_ERROR;
    }

    start = (char *) sec->buf->last;
    p = start;

    p = (char *) ngx_cpymem(p, "{\"token_id\":", 12);
    p = msv_fmt_i32(p, w->token);
    p = (char *) ngx_cpymem(p, ",\"logprob\":", 11);
    p = msv_fmt_f32(p, w->logprob);
    p = (char *) ngx_cpymem(p, ",\"top_logprobs\":[", 17);

    sec->buf->last = (u_char *) p;
    sec->bytes += p - start;
    ctx->pending += p - start;

    top = msv_row_top(w);

    for (i = 0; i < w->n_top; i++) {
        if (ngx_http_maskserve_room(ctx, sec, MSV_TOP_ROOM) != NGX_OK) {
            return NGX_ERROR;
        }

        start = (char *) sec->buf->last;
        p = start;

        if (i) {
            *p++ = ',';
        }

        p = (char *) ngx_cpymem(p, "{\"token_id\":", 12);
        p = msv_fmt_i32(p, top[i].id);
        p = (char *) ngx_cpymem(p, ",\"logprob\":", 11);
        p = msv_fmt_f32(p, top[i].lp);
        *p++ = '}';

        sec->buf->last = (u_char *) p;
        sec->bytes += p - start;
        ctx->pending += p - start;
    }

    return ngx_http_maskserve_sec_text(ctx, sec, "]}", 2);
}


/*
 * Base64 of n more bytes into a section, filling each buffer to its end:
 * a 1000-id row is larger than a stream buffer.
 */

static ngx_int_t
ngx_http_maskserve_sec_b64(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_sec_t *sec, const void *src, size_t n)
{
    char          *p, *start;
    size_t         k;
    const u_char  *s;

    s = src;

    while (n) {
        /* 8 characters: a group completed from the carry and one more */
        if (ngx_http_maskserve_room(ctx, sec, 8) != NGX_OK) {
            return NGX_ERROR;
        }

        k = ngx_min(n, msv_b64_fits(sec->buf->end - sec->buf->last));

        start = (char *) sec->buf->last;
        p = msv_b64_put(&sec->b64, start, s, k);

        sec->buf->last = (u_char *) p;
        sec->bytes += p - start;
        ctx->pending += p - start;

        s += k;
        n -= k;
    }

    return NGX_OK;
}


static void
ngx_http_maskserve_sec_reset(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_sec_t *sec)
{
    sec->first = NULL;
    sec->last = &sec->first;
    sec->buf = NULL;
    sec->bytes = 0;
    sec->count = 0;
    sec->rest = 0;

    /*
     * A body is sent when the request ends, long after its base64 was
     * written, and by then it is out of the caches anyway: written around
     * them.  A stream event goes out at the end of the pass.
     */
    msv_b64_init(&sec->b64, !ctx->stream);
}


static void
ngx_http_maskserve_choice_reset(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_choice_t *ch)
{
    ngx_uint_t  k;

    for (k = 0; k < NGX_HTTP_MASKSERVE_NSEC; k++) {
        ngx_http_maskserve_sec_reset(ctx, ngx_http_maskserve_sec(ch, k));
    }
}


/*
 * A stream's section goes on in the rest of its last buffer after an
 * event, when at least a small buffer's worth is left: more than the
 * first write of any section takes (sec_top's room), so that the rest
 * is never linked empty, and room for the glue that follows a section.
 * The event holds the buffer until it is sent: hold notes where the rest
 * starts (past the event's glue, written there too), and
 * ngx_http_maskserve_output_sent, right after the send, resumes the
 * section there; a section does not take a row in between.  With less
 * than that left, the section takes a new buffer right after the send
 * instead (NGX_HTTP_MASKSERVE_RENEW): while the free lists' links and
 * buffers are still in the CPU's cache from ngx_chain_update_chains, and
 * so that the next row finds a buffer for the row hint to prefetch,
 * rather than taking one from cold lists in the middle of its numbers.
 * A section the event left out (nothing new in it) keeps what it has: a
 * buffer resumed or renewed earlier and still empty, or none.
 */

static void
ngx_http_maskserve_sec_hold(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_sec_t *sec)
{
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    if (sec->bytes == 0) {
        return;
    }

    b = sec->buf;
    cl = (ngx_chain_t *) ((u_char *) sec->last - offsetof(ngx_chain_t, next));

    ngx_http_maskserve_sec_reset(ctx, sec);

    if ((size_t) (b->end - b->last) < NGX_HTTP_MASKSERVE_SMALL) {
        sec->rest = NGX_HTTP_MASKSERVE_RENEW;
        ctx->carry = 1;
        return;
    }

    /* cl->next is the event's until it is sent: only noted here */
    sec->buf = b;
    sec->first = cl;
    sec->rest = (uint32_t) (b->last - b->start);
    ctx->carry = 1;
}


void
ngx_http_maskserve_output_sent(ngx_http_maskserve_ctx_t *ctx)
{
    ngx_uint_t                    i, k, renew;
    ngx_http_maskserve_sec_t     *sec;
    ngx_http_maskserve_choice_t  *ch;

    if (ctx->carry) {
        ctx->carry = 0;
        renew = 0;

        for (i = 0; i < ctx->n_choices; i++) {
            ch = &ctx->choices[i];

            for (k = 0; k < ngx_http_maskserve_nsec(ctx); k++) {
                sec = ngx_http_maskserve_sec(ch, k);

                if (sec->rest == NGX_HTTP_MASKSERVE_RENEW) {
                    renew = 1;

                } else if (sec->rest) {
                    ngx_http_maskserve_sec_resume(ctx, sec);
                }
            }
        }

        /*
         * After every resume: resume finds a buffer sent at once in
         * ctx->free, which taking a new buffer sorts onto the size lists
         */
        for (i = 0; renew && i < ctx->n_choices; i++) {
            ch = &ctx->choices[i];

            for (k = 0; k < ngx_http_maskserve_nsec(ctx); k++) {
                sec = ngx_http_maskserve_sec(ch, k);

                if (sec->rest == NGX_HTTP_MASKSERVE_RENEW) {
                    ngx_http_maskserve_sec_renew(ctx, sec);
                }
            }
        }
    }

    ngx_http_maskserve_recycle(ctx);
}


/*
 * A section whose last buffer the event took whole starts its next row
 * in a new one, taken now.  Without memory for it, the next row asks
 * again (ngx_http_maskserve_room) and fails there.
 */

static void
ngx_http_maskserve_sec_renew(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_sec_t *sec)
{
    ngx_chain_t  *cl;

    sec->rest = 0;

    cl = ngx_http_maskserve_get_buf(ctx, ctx->buf_size);
    if (cl == NULL) {
        return;
    }

    sec->first = cl;
    sec->last = &cl->next;
    sec->buf = cl->buf;
}


/*
 * A held section goes on at the rest of its buffer.  Sent at once (as
 * when the client keeps up), the buffer is empty and in ctx->free, with
 * its link: the section takes both back, still in the CPU's cache, and
 * writes on past what the event sent.  Still in flight, the buffer stays
 * the event's, and a new one over the same block takes the rest; the
 * event's, sent before it (buffers go out in the order they were
 * linked), then gives back only its ngx_buf_t and link (no last_shadow:
 * ngx_http_maskserve_recycle), and the block goes back with the last
 * buffer over it.  Without memory for a new one, the section starts
 * afresh at its next row and the block stays the event's buffer's.
 */

static void
ngx_http_maskserve_sec_resume(ngx_http_maskserve_ctx_t *ctx,
    ngx_http_maskserve_sec_t *sec)
{
    u_char       *start, *end, *rest;
    ngx_buf_t    *b, *nb;
    ngx_chain_t  *cl, **ll;

    b = sec->buf;
    cl = sec->first;
    start = b->start;
    end = b->end;
    rest = start + sec->rest;

    ngx_http_maskserve_sec_reset(ctx, sec);

    if (b->last == start) {
        /* ngx_chain_update_chains emptied it: it is in ctx->free */
        for (ll = &ctx->free; *ll && *ll != cl; ll = &(*ll)->next) {
            /* void */
        }

        if (*ll == NULL) {
            /* not there after all: the buffer keeps its block */
            return;
        }

        *ll = cl->next;
        nb = b;

    } else {
        cl = ctx->free_bare;

        if (cl) {
            ctx->free_bare = cl->next;

        } else {
            cl = ngx_alloc_chain_link(ctx->r->pool);
            if (cl == NULL) {
                return;
            }

            cl->buf = ngx_palloc(ctx->r->pool, sizeof(ngx_buf_t));
            if (cl->buf == NULL) {
                return;
            }
        }

        nb = cl->buf;
        b->last_shadow = 0;
    }

    ngx_http_maskserve_buf_init(nb, start, end, rest);

    cl->next = NULL;

    sec->first = cl;
    sec->last = &cl->next;
    sec->buf = nb;
}


/* Close a section's base64 string, if it has one open, and link it. */

static ngx_int_t
ngx_http_maskserve_link(ngx_http_maskserve_ctx_t *ctx, ngx_chain_t ***ll,
    ngx_http_maskserve_sec_t *sec)
{
    char  *p;

    if (sec->b64.n) {
        if (ngx_http_maskserve_room(ctx, sec, 4) != NGX_OK) {
            return NGX_ERROR;
        }

        p = msv_b64_end(&sec->b64, (char *) sec->buf->last);
        sec->bytes += p - (char *) sec->buf->last;
        ctx->pending += p - (char *) sec->buf->last;
        sec->buf->last = (u_char *) p;
    }

    /* a section carried on from the last event holds an empty buffer
     * until its first row: nothing to link then */
    if (sec->bytes) {
        **ll = sec->first;
        *ll = sec->last;
    }

    return NGX_OK;
}


/*
 * A buffer at the end of the chain *ll ends with, with room for n more
 * bytes (n at most a small buffer): the last one linked when it has the
 * room (one of ours, still to be sent: this chain is being composed),
 * else a new small one linked after it.  The chain always starts with the
 * event's head, so *ll is the next field of its last link.
 */

static ngx_buf_t *
ngx_http_maskserve_glue_buf(ngx_http_maskserve_ctx_t *ctx, ngx_chain_t ***ll,
    size_t n)
{
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    cl = (ngx_chain_t *) ((u_char *) *ll - offsetof(ngx_chain_t, next));
    b = cl->buf;

    if (b->tag == (ngx_buf_tag_t) &ngx_http_maskserve_module
        && (size_t) (b->end - b->last) >= n)
    {
        return b;
    }

    cl = ngx_http_maskserve_get_buf(ctx, NGX_HTTP_MASKSERVE_SMALL);
    if (cl == NULL) {
        return NULL;
    }

    **ll = cl;
    *ll = &cl->next;

    return cl->buf;
}


static ngx_int_t
ngx_http_maskserve_glue(ngx_http_maskserve_ctx_t *ctx, ngx_chain_t ***ll,
    const char *s, size_t n)
{
    ngx_buf_t  *b;

    b = ngx_http_maskserve_glue_buf(ctx, ll, n);
    if (b == NULL) {
        return NGX_ERROR;
    }

    b->last = ngx_cpymem(b->last, s, n);

    return NGX_OK;
}


/* Glue of two static strings, the end of one part and the next's key. */

static ngx_int_t
ngx_http_maskserve_glue2(ngx_http_maskserve_ctx_t *ctx, ngx_chain_t ***ll,
    const char *a, const char *b)
{
    size_t      na, nb;
    ngx_buf_t  *buf;

    na = ngx_strlen(a);
    nb = ngx_strlen(b);

    buf = ngx_http_maskserve_glue_buf(ctx, ll, na + nb);
    if (buf == NULL) {
        return NGX_ERROR;
    }

    buf->last = ngx_cpymem(buf->last, a, na);
    buf->last = ngx_cpymem(buf->last, b, nb);

    return NGX_OK;
}


static ngx_int_t
ngx_http_maskserve_fail_row(ngx_http_maskserve_ctx_t *ctx, ngx_uint_t status,
    const char *type, const char *param, const char *fmt, ...)
{
    u_char   *msg, *last;
    va_list   args;

    msg = ngx_pnalloc(ctx->r->pool, 256);
    if (msg == NULL) {
        ngx_http_maskserve_error(&ctx->err, NGX_HTTP_INTERNAL_SERVER_ERROR,
                                 NGX_HTTP_MASKSERVE_SERVER, NULL,
                                 "out of memory");
        return NGX_ERROR;
    }

    va_start(args, fmt);
    last = ngx_vslprintf(msg, msg + 256, fmt, args);
    va_end(args);

    ngx_http_maskserve_set_error(&ctx->err, status, type, param, msg,
                                 last - msg);

    return NGX_ERROR;
}
