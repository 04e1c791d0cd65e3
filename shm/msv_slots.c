/*
 * msv_slots.c: the request slot table.  Lock-free: every transition is a
 * compare-and-swap of the slot's state word (pid << 8) | state, so an
 * owner that dies at any point leaves a word naming it, and no lock is
 * ever shared with the worker.  The state machine is in msv_shm.h and
 * shm/README.md.
 */

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "msv_params.h"
#include "msv_region.h"
#include "msv_slots.h"


/*
 * Cookies: a random 64-bit base per process plus a counter.  Within a
 * process they never repeat; two processes collide only if their bases
 * land within a few million of each other (odds about 2^-40).  A forked
 * child draws its own base (pthread_atfork), so the children of a process
 * that already submitted do not replay its sequence.
 */
static _Atomic uint64_t  msv_cookie_base;       /* 0: not drawn yet */
static _Atomic uint64_t  msv_cookie_next;
static _Atomic int       msv_cookie_atfork;


static void msv_cookie_forked(void);
static uint64_t msv_cookie_base_get(void);
static uint64_t msv_cookie_new(uint64_t previous);
static int msv_slot_cas(struct msv_slot *s, uint64_t *w, uint64_t to);


static void
msv_cookie_forked(void)
{
    atomic_store_explicit(&msv_cookie_base, 0, memory_order_relaxed);
}


static uint64_t
msv_cookie_base_get(void)
{
    uint64_t  b, fresh;

    b = atomic_load_explicit(&msv_cookie_base, memory_order_relaxed);
    if (b != 0) {
        return b;
    }

    if (atomic_exchange(&msv_cookie_atfork, 1) == 0
        && pthread_atfork(NULL, NULL, msv_cookie_forked) != 0)
    {
        atomic_store(&msv_cookie_atfork, 0);    /* try again next time */
    }

    if (getrandom(&fresh, sizeof(fresh), GRND_NONBLOCK)
        != (ssize_t) sizeof(fresh))
    {
        fresh = msv_now_ns() * 0x9e3779b97f4a7c15ULL
                ^ (uint64_t) getpid() << 40;
    }
    fresh |= 1;

    /* two threads drawing at once: the first one wins, both use it */
    b = 0;
    if (atomic_compare_exchange_strong_explicit(&msv_cookie_base, &b, fresh,
            memory_order_relaxed, memory_order_relaxed))
    {
        return fresh;
    }
    return b;
}


static uint64_t
msv_cookie_new(uint64_t previous)
{
    uint64_t  k, base = msv_cookie_base_get();

    do {
        k = base + atomic_fetch_add_explicit(&msv_cookie_next, 1,
                                             memory_order_relaxed);
    } while (k == 0 || k == previous);

    return k;
}


/*
 * One transition of a slot's word.  On success it is acq_rel: the release
 * half publishes what this side wrote into the slot before (the R edges
 * below), the acquire half sees what the previous owner wrote.
 */
static int
msv_slot_cas(struct msv_slot *s, uint64_t *w, uint64_t to)
{
    return atomic_compare_exchange_strong_explicit(&s->state, w, to,
               memory_order_acq_rel, memory_order_acquire);
}


int
msv_slot_claim(struct msv_ctrl *c, uint32_t reader, int32_t pid)
{
    uint32_t          i, k, start;
    uint64_t          w;
    struct msv_slot  *s;

    /* start where other processes are unlikely to be looking */
    start = (uint32_t) pid % c->n_slots;

    for (k = 0; k < c->n_slots; k++) {
        i = (start + k) % c->n_slots;
        s = msv_slot_at(c, i);

        /*
         * A-claim: acquire (in msv_slot_cas), pairs with R-free in
         * msv_slot_release / msv_slots_reap: the previous request is
         * completely over before we write this slot.
         */
        w = atomic_load_explicit(&s->state, memory_order_relaxed);
        if (MSV_STATE_OF(w) != MSV_SLOT_FREE) {
            continue;
        }
        if (!msv_slot_cas(s, &w, MSV_STATE_WORD(pid, MSV_SLOT_CLAIMED))) {
            continue;
        }

        /* ours: nobody else writes these while CLAIMED */
        s->reader = reader;
        atomic_store_explicit(&s->cancel, 0, memory_order_relaxed);
        return (int) i;
    }

    return -1;
}


void
msv_slot_unclaim(struct msv_ctrl *c, uint32_t i)
{
    uint64_t          w;
    struct msv_slot  *s;

    if (i >= c->n_slots) {
        return;
    }
    s = msv_slot_at(c, i);
    w = atomic_load_explicit(&s->state, memory_order_relaxed);
    if (MSV_STATE_OF(w) == MSV_SLOT_CLAIMED
        && MSV_PID_OF(w) == (int32_t) getpid())
    {
        /* R-free: release, pairs with A-claim */
        msv_slot_cas(s, &w, MSV_STATE_WORD(0, MSV_SLOT_FREE));
    }
}


uint64_t
msv_slot_submit(struct msv_ctrl *c, uint32_t i, const char *request_id,
    const struct msv_params *params, const int32_t *prompt,
    uint32_t n_prompt, const struct msv_bias *bias)
{
    size_t             n;
    uint64_t           w, cookie;
    struct msv_slot   *s;
    struct msv_limits  lim;

    /* the rules the worker applies again when it admits the slot */
    msv_limits_of(c, &lim);
    if (i >= c->n_slots || msv_prompt_check(prompt, n_prompt, &lim, NULL)
        || msv_params_check(params, bias, &lim, NULL)
        || (request_id != NULL && request_id[0] != '\0'
            && !msv_request_id_valid(request_id,
                                     strnlen(request_id, MSV_REQ_ID_MAX))))
    {
        return 0;
    }

    s = msv_slot_at(c, i);
    w = atomic_load_explicit(&s->state, memory_order_relaxed);
    if (MSV_STATE_OF(w) != MSV_SLOT_CLAIMED
        || MSV_PID_OF(w) != (int32_t) getpid())
    {
        return 0;
    }

    cookie = msv_cookie_new(__atomic_load_n(&s->cookie, __ATOMIC_RELAXED));

    s->params = *params;
    s->n_prompt = n_prompt;
    if (n_prompt > 0) {
        memcpy(msv_slot_prompt(c, s), prompt, (size_t) n_prompt * 4);
    }
    if (params->n_bias > 0) {
        memcpy(msv_slot_bias(c, s), bias,
               (size_t) params->n_bias * sizeof(struct msv_bias));
    }
    n = request_id != NULL ? strlen(request_id) : 0;
    if (n > MSV_REQ_ID_MAX) {
        n = MSV_REQ_ID_MAX;
    }
    memcpy(s->request_id, request_id != NULL ? request_id : "", n);
    s->request_id[n] = '\0';

    s->seed_used = 0;
    s->n_out = 0;
    s->finish = MSV_FINISH_NONE;
    s->abort_reason = MSV_ABORT_NONE;
    s->t_start_ns = 0;
    s->t_end_ns = 0;
    s->weight_pos = UINT32_MAX;
    s->t_submit_ns = msv_now_ns();
    __atomic_store_n(&s->cookie, cookie, __ATOMIC_RELAXED);

    /*
     * R-submit: release, pairs with the worker's acquire load of the
     * state word before it reads params, prompt and bias (A-submit in
     * the scheduler).  A CAS, not a store: if the slot was taken from us
     * (never while we live, but say so rather than trample it) we fail.
     */
    if (!msv_slot_cas(s, &w, MSV_STATE_WORD(MSV_PID_OF(w),
                                            MSV_SLOT_SUBMITTED)))
    {
        return 0;
    }

    return cookie;
}


void
msv_slot_cancel(struct msv_ctrl *c, uint32_t i, uint64_t cookie)
{
    struct msv_slot  *s;

    if (i >= c->n_slots || cookie == 0) {
        return;
    }
    s = msv_slot_at(c, i);
    if (__atomic_load_n(&s->cookie, __ATOMIC_RELAXED) != cookie) {
        return;
    }
    /* relaxed: the worker polls the flag once per step; nothing else
     * travels with it */
    atomic_store_explicit(&s->cancel, 1, memory_order_relaxed);
}


int
msv_slot_release(struct msv_ctrl *c, uint32_t i, uint64_t cookie)
{
    uint32_t          st;
    uint64_t          w;
    struct msv_slot  *s;

    if (i >= c->n_slots) {
        return -1;
    }
    s = msv_slot_at(c, i);

    /*
     * A-done: acquire, pairs with the worker's release of FINISHED or
     * ABORTED (R-slot in the scheduler): its n_out, finish and times are
     * visible once we see the final state.
     */
    w = atomic_load_explicit(&s->state, memory_order_acquire);
    st = MSV_STATE_OF(w);
    if ((st != MSV_SLOT_FINISHED && st != MSV_SLOT_ABORTED)
        || __atomic_load_n(&s->cookie, __ATOMIC_RELAXED) != cookie)
    {
        return -1;
    }

    /* R-free: release, pairs with A-claim of the next owner */
    return msv_slot_cas(s, &w, MSV_STATE_WORD(0, MSV_SLOT_FREE)) ? 0 : -1;
}


uint32_t
msv_slots_adopt(struct msv_ctrl *c, int32_t pid,
    void (*orphan)(void *ud, uint32_t slot, uint64_t cookie), void *ud)
{
    uint32_t          i, st, n;
    uint64_t          w, cookie;
    struct msv_slot  *s;

    n = 0;
    for (i = 0; i < c->n_slots; i++) {
        s = msv_slot_at(c, i);
        /* A-done: acquire, pairs with R-submit and with the worker's
         * release of the state: the cookie is the owner's */
        w = atomic_load_explicit(&s->state, memory_order_acquire);
        st = MSV_STATE_OF(w);
        if (MSV_PID_OF(w) != pid || st == MSV_SLOT_FREE
            || st == MSV_SLOT_CLAIMED)
        {
            continue;
        }
        cookie = __atomic_load_n(&s->cookie, __ATOMIC_RELAXED);

        if (st == MSV_SLOT_FINISHED || st == MSV_SLOT_ABORTED) {
            if (msv_slot_release(c, i, cookie) == 0) {
                n++;
            }
            continue;
        }

        /* SUBMITTED or RUNNING: nobody waits for it any more */
        msv_slot_cancel(c, i, cookie);
        if (orphan != NULL) {
            orphan(ud, i, cookie);
        }
    }

    return n;
}


uint32_t
msv_slot_state(struct msv_ctrl *c, uint32_t i)
{
    if (i >= c->n_slots) {
        return MSV_SLOT_FREE;
    }
    /* A-done: acquire, pairs with the worker's release of the state */
    return MSV_STATE_OF(atomic_load_explicit(&msv_slot_at(c, i)->state,
                                             memory_order_acquire));
}


void
msv_slot_census(struct msv_ctrl *c, uint32_t out[6])
{
    uint32_t  i, st;

    memset(out, 0, 6 * sizeof(uint32_t));
    for (i = 0; i < c->n_slots; i++) {
        st = MSV_STATE_OF(atomic_load_explicit(&msv_slot_at(c, i)->state,
                                               memory_order_relaxed));
        if (st < 6) {
            out[st]++;
        }
    }
}


/*
 * reader >= 0: slots past CLAIMED whose reader index is `reader`, unless
 * that entry is ATTACHED by the slot's own pid (the index was reused by a
 * live reader that owns them).  CLAIMED slots are left to the pid sweep:
 * their reader field is written just after the claim and is not yet
 * trustworthy.
 *
 * reader == -1: every slot, in any state but FREE, whose owner pid is
 * gone.
 *
 * Every freed slot is listed in out; when out is full the rest wait for
 * the next call, so the scheduler never misses a slot it was running.
 */
uint32_t
msv_slots_reap(struct msv_ctrl *c, int reader, uint32_t *out, uint32_t max)
{
    int32_t           pid;
    uint32_t          i, st, n;
    uint64_t          w, e;
    struct msv_slot  *s;

    if (reader >= (int) c->n_readers) {
        return 0;
    }

    e = 0;
    if (reader >= 0) {
        e = atomic_load_explicit(&msv_reader_at(c, (uint32_t) reader)->state,
                                 memory_order_acquire);
    }

    n = 0;
    for (i = 0; i < c->n_slots; i++) {
        if (out != NULL && n == max) {
            break;
        }

        s = msv_slot_at(c, i);
        /* acquire: pairs with R-submit, so reader is the owner's */
        w = atomic_load_explicit(&s->state, memory_order_acquire);
        st = MSV_STATE_OF(w);
        pid = MSV_PID_OF(w);
        if (st == MSV_SLOT_FREE) {
            continue;
        }

        if (reader >= 0) {
            if (st == MSV_SLOT_CLAIMED || s->reader != (uint32_t) reader) {
                continue;
            }
            if (MSV_STATE_OF(e) == MSV_READER_ATTACHED
                && MSV_PID_OF(e) == pid)
            {
                continue;
            }

        } else if (msv_pid_alive(pid)) {
            continue;
        }

        /*
         * R-free: release, pairs with A-claim.  The CAS fails if the word
         * moved since we looked (the owner released it, the worker
         * finished it): then it is not ours to free.
         */
        if (msv_slot_cas(s, &w, MSV_STATE_WORD(0, MSV_SLOT_FREE))) {
            if (out != NULL) {
                out[n] = i;
            }
            n++;
        }
    }

    return n;
}
