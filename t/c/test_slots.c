/*
 * test_slots.c: the request slot table: the claim / submit / cancel /
 * release cycle, concurrent claims from several processes, cookies,
 * reaping by dead pid and by reader index, and a reader taking back its
 * slots when it attaches again (msv_slots_adopt).
 */

#include <sys/mman.h>

#include "tap.h"
#include "shm_harness.h"


#define N_SLOTS   8
#define N_PROCS   4
#define N_ITER    20000


static void
layout(struct msv_layout *lay)
{
    memset(lay, 0, sizeof(*lay));
    lay->n_slots = N_SLOTS;
    lay->n_readers = 4;
    lay->vocab_size = 1000;
    lay->max_model_len = 33;     /* a 32-token prompt fits, 33 does not */
    lay->max_logprobs = 5;
    lay->ring_bytes = 65536;
    lay->model = "m";
    lay->backend = "cpu";
}


static void
params(struct msv_params *p, uint32_t n_bias)
{
    memset(p, 0, sizeof(*p));
    p->max_tokens = 16;
    p->temperature = 0.7f;
    p->top_p = 0.9f;
    p->top_k = 50;
    p->repetition_penalty = 1.0f;
    p->mask_mode = MSV_MASK_SUPPORT;
    p->logprobs = -1;
    p->n_bias = n_bias;
    p->n = 1;
}


/* The worker's side of a transition: CAS keeping the owner's pid. */
static int
worker_move(struct msv_ctrl *c, uint32_t i, uint32_t from, uint32_t to)
{
    struct msv_slot  *s = msv_slot_at(c, i);
    uint64_t          w = atomic_load(&s->state);

    if (MSV_STATE_OF(w) != from) {
        return -1;
    }
    return atomic_compare_exchange_strong(&s->state, &w,
               MSV_STATE_WORD(MSV_PID_OF(w), to)) ? 0 : -1;
}


static void
test_cycle(struct msv_ctrl *c)
{
    int                i, j, distinct;
    char               rid[200];
    int32_t            prompt[32];
    uint32_t           census[6];
    uint64_t           cookie, cookies[1000];
    struct msv_bias    bias[3] = { { 5, 1.5f }, { 9, -100.0f }, { 11, 2.0f } };
    struct msv_slot   *s;
    struct msv_params  p;

    for (j = 0; j < 32; j++) {
        prompt[j] = 100 + j;
    }
    params(&p, 3);

    i = msv_slot_claim(c, 1, getpid());
    tap_ok(i >= 0 && msv_slot_state(c, i) == MSV_SLOT_CLAIMED,
           "cycle: claimed slot %d", i);
    s = msv_slot_at(c, (uint32_t) i);
    tap_ok(s->reader == 1 && MSV_PID_OF(atomic_load(&s->state)) == getpid(),
           "cycle: slot names reader 1 and our pid");

    memset(rid, 'r', sizeof(rid));
    rid[sizeof(rid) - 1] = '\0';
    cookie = msv_slot_submit(c, i, rid, &p, prompt, 32, bias);
    tap_ok(cookie != 0 && msv_slot_state(c, i) == MSV_SLOT_SUBMITTED,
           "cycle: submitted, cookie %016llx", (unsigned long long) cookie);
    tap_ok(s->cookie == cookie && s->n_prompt == 32
           && memcmp(msv_slot_prompt(c, s), prompt, sizeof(prompt)) == 0
           && s->params.n_bias == 3
           && memcmp(msv_slot_bias(c, s), bias, sizeof(bias)) == 0
           && s->params.top_k == 50 && s->t_submit_ns != 0
           && strlen(s->request_id) == MSV_REQ_ID_MAX,
           "cycle: params, prompt, bias, request id (cut to %d) in the slot",
           MSV_REQ_ID_MAX);
    tap_ok(msv_slot_release(c, i, cookie) == -1,
           "cycle: release refused while SUBMITTED");

    tap_ok(worker_move(c, i, MSV_SLOT_SUBMITTED, MSV_SLOT_RUNNING) == 0,
           "cycle: worker takes it (RUNNING)");
    msv_slot_cancel(c, i, cookie + 1);
    tap_ok(atomic_load(&s->cancel) == 0, "cycle: cancel with another cookie "
           "ignored");
    msv_slot_cancel(c, i, cookie);
    tap_ok(atomic_load(&s->cancel) == 1, "cycle: cancel sets the flag");
    worker_move(c, i, MSV_SLOT_RUNNING, MSV_SLOT_ABORTED);
    tap_ok(msv_slot_release(c, i, cookie + 1) == -1
           && msv_slot_release(c, i, cookie) == 0
           && msv_slot_state(c, i) == MSV_SLOT_FREE,
           "cycle: ABORTED -> FREE only with the right cookie");
    tap_ok(msv_slot_release(c, i, cookie) == -1, "cycle: second release "
           "refused");

    i = msv_slot_claim(c, 2, getpid());
    msv_slot_unclaim(c, i);
    tap_ok(msv_slot_state(c, i) == MSV_SLOT_FREE, "cycle: unclaim frees");
    tap_ok(msv_slot_submit(c, i, "x", &p, prompt, 1, bias) == 0,
           "cycle: submit of a slot we do not hold -> 0");
    i = msv_slot_claim(c, 2, getpid());
    tap_ok(msv_slot_submit(c, i, "x", &p, prompt, 33, bias) == 0
           && msv_slot_state(c, i) == MSV_SLOT_CLAIMED,
           "cycle: prompt longer than max_model_len -> 0, still CLAIMED");
    p.n_bias = MSV_MAX_BIAS + 1;
    tap_ok(msv_slot_submit(c, i, "x", &p, prompt, 1, bias) == 0,
           "cycle: too many bias entries -> 0");

    /* the parameter rules of msv_params.h, against the region's model */
    params(&p, 3);
    p.temperature = 1e-38f;
    tap_ok(msv_slot_submit(c, i, "x", &p, prompt, 1, bias) == 0,
           "cycle: temperature 1e-38 -> 0");
    params(&p, 3);
    bias[0].value = 1e15f;
    tap_ok(msv_slot_submit(c, i, "x", &p, prompt, 1, bias) == 0,
           "cycle: a bias of 1e15 -> 0");
    bias[0].value = 1.5f;
    p.min_tokens = 17;
    tap_ok(msv_slot_submit(c, i, "x", &p, prompt, 1, bias) == 0,
           "cycle: min_tokens above max_tokens -> 0");
    params(&p, 3);
    p.logprobs = 6;
    tap_ok(msv_slot_submit(c, i, "x", &p, prompt, 1, bias) == 0,
           "cycle: logprobs above the region's max_logprobs -> 0");
    params(&p, 3);
    prompt[0] = 1000;
    tap_ok(msv_slot_submit(c, i, "x", &p, prompt, 1, bias) == 0
           && msv_slot_state(c, i) == MSV_SLOT_CLAIMED,
           "cycle: a prompt id == vocab -> 0, still CLAIMED");
    prompt[0] = 100;
    msv_slot_unclaim(c, i);
    params(&p, 0);

    /* one slot, reused: a fresh cookie every time */
    for (j = 0; j < 1000; j++) {
        i = msv_slot_claim(c, 0, getpid());
        cookies[j] = msv_slot_submit(c, i, "k", &p, prompt, 1, NULL);
        worker_move(c, i, MSV_SLOT_SUBMITTED, MSV_SLOT_FINISHED);
        msv_slot_release(c, i, cookies[j]);
    }
    distinct = 1;
    for (j = 0; j < 1000 && distinct; j++) {
        distinct = cookies[j] != 0 && (j == 0 || cookies[j] != cookies[j - 1]);
    }
    tap_ok(distinct && i == msv_slot_claim(c, 0, getpid()),
           "cycle: 1000 requests through slot %d, cookies non-zero and "
           "never repeated", i);
    msv_slot_unclaim(c, i);

    msv_slot_census(c, census);
    tap_ok(census[MSV_SLOT_FREE] == N_SLOTS, "cycle: census: all %u FREE",
           census[MSV_SLOT_FREE]);
}


/* Shared between the forked claimers. */
struct race {
    _Atomic int32_t   owner[N_SLOTS];
    _Atomic uint64_t  dup;
    _Atomic uint64_t  full;
    uint64_t          cookies[N_PROCS][N_ITER];
};


static void
racer(struct msv_ctrl *c, struct race *r, int me)
{
    int                held[3], nh, i;
    int32_t            pid = getpid(), zero, prompt = 1;
    uint64_t           x = (uint64_t) me * 7919 + 1, step, done, cookie;
    struct msv_params  p;

    params(&p, 0);
    alarm(60);
    nh = 0;
    done = 0;

    for (step = 0; done < N_ITER; step++) {
        x = hx_mix(x, step);

        /* hold up to 3 slots at once: 12 wanted, 8 exist */
        if (nh < 3 && (x & 1)) {
            i = msv_slot_claim(c, (uint32_t) me, pid);
            if (i < 0) {
                atomic_fetch_add(&r->full, 1);
                continue;
            }
            zero = 0;
            if (!atomic_compare_exchange_strong(&r->owner[i], &zero, pid)) {
                atomic_fetch_add(&r->dup, 1);
            }
            held[nh++] = i;
            continue;
        }
        if (nh == 0) {
            continue;
        }

        i = held[--nh];
        atomic_store(&r->owner[i], 0);
        if ((x >> 8) % 5 == 0) {
            msv_slot_unclaim(c, (uint32_t) i);
            continue;
        }
        cookie = msv_slot_submit(c, (uint32_t) i, "r", &p, &prompt, 1, NULL);
        r->cookies[me][done++] = cookie;
        /* play the worker too: done at once */
        if (worker_move(c, (uint32_t) i, MSV_SLOT_SUBMITTED,
                        MSV_SLOT_FINISHED) != 0
            || msv_slot_release(c, (uint32_t) i, cookie) != 0)
        {
            atomic_fetch_add(&r->dup, 1);
        }
    }

    while (nh > 0) {
        i = held[--nh];
        atomic_store(&r->owner[i], 0);
        msv_slot_unclaim(c, (uint32_t) i);
    }
    _exit(0);
}


static int
cmp_u64(const void *a, const void *b)
{
    uint64_t  x = *(const uint64_t *) a, y = *(const uint64_t *) b;

    return x < y ? -1 : x > y;
}


static void
test_race(struct msv_ctrl *c)
{
    int           k, rc, bad;
    pid_t         pid[N_PROCS];
    size_t        j, n;
    uint32_t      census[6];
    uint64_t     *all;
    struct race  *r;

    r = mmap(NULL, sizeof(*r), PROT_READ | PROT_WRITE,
             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (!tap_ok(r != MAP_FAILED, "race: shared scratch")) {
        return;
    }
    memset(r, 0, sizeof(*r));

    for (k = 0; k < N_PROCS; k++) {
        pid[k] = fork();
        if (pid[k] == 0) {
            racer(c, r, k);
        }
    }
    bad = 0;
    for (k = 0; k < N_PROCS; k++) {
        rc = hx_wait_child(pid[k]);
        bad += rc != 0;
    }

    tap_ok(bad == 0 && atomic_load(&r->dup) == 0,
           "race: %d processes x %d requests on %d slots: a slot never had "
           "two holders (%llu times all were taken)", N_PROCS, N_ITER,
           N_SLOTS, (unsigned long long) atomic_load(&r->full));

    all = malloc(sizeof(r->cookies));
    if (!tap_ok(all != NULL, "race: memory for the cookies")) {
        munmap(r, sizeof(*r));
        return;
    }
    n = 0;
    for (k = 0; k < N_PROCS; k++) {
        for (j = 0; j < N_ITER; j++) {
            if (r->cookies[k][j] != 0) {
                all[n++] = r->cookies[k][j];
            }
        }
    }
    qsort(all, n, sizeof(uint64_t), cmp_u64);
    for (j = 1; j < n && all[j] != all[j - 1]; j++) {
        /* look for a repeat */
    }
    tap_ok(n == N_PROCS * N_ITER && j >= n, "race: %zu cookies from %d "
           "processes, all distinct", n, N_PROCS);
    free(all);

    msv_slot_census(c, census);
    tap_ok(census[MSV_SLOT_FREE] == N_SLOTS, "race: every slot FREE after");
    munmap(r, sizeof(*r));
}


/* Claim until we hold slot `want`; give the others back. */
static int
claim_exactly(struct msv_ctrl *c, int want)
{
    int  got[N_SLOTS], n, i, held = -1;

    for (n = 0; n < N_SLOTS; n++) {
        got[n] = msv_slot_claim(c, 0, getpid());
        if (got[n] < 0) {
            break;
        }
        if (got[n] == want) {
            held = want;
        }
    }
    for (i = 0; i < n; i++) {
        if (got[i] != held) {
            msv_slot_unclaim(c, got[i]);
        }
    }
    return held;
}


static void
test_reap(struct msv_ctrl *c)
{
    int                i, a, b, d, cl, mine, ours[3], pfd[2];
    pid_t              pid;
    int32_t            prompt = 1, v[3];
    uint32_t           out[N_SLOTS], n, k, census[6];
    uint64_t           cookie, fresh;
    struct msv_params  p;
    struct msv_reader *e;

    params(&p, 0);

    /* a process that dies holding CLAIMED, SUBMITTED and RUNNING slots */
    if (pipe(pfd) != 0) {
        tap_ok(0, "reap: pipe");
        return;
    }
    mine = msv_slot_claim(c, 0, getpid());

    pid = fork();
    if (pid == 0) {
        v[0] = msv_slot_claim(c, 1, getpid());
        v[1] = msv_slot_claim(c, 1, getpid());
        v[2] = msv_slot_claim(c, 1, getpid());
        msv_slot_submit(c, v[1], "b", &p, &prompt, 1, NULL);
        msv_slot_submit(c, v[2], "d", &p, &prompt, 1, NULL);
        worker_move(c, v[2], MSV_SLOT_SUBMITTED, MSV_SLOT_RUNNING);
        _exit(write(pfd[1], v, sizeof(v)) == sizeof(v) ? 0 : 1);
    }
    close(pfd[1]);
    if (read(pfd[0], ours, sizeof(ours)) != sizeof(ours)) {
        tap_ok(0, "reap: child slots");
        return;
    }
    close(pfd[0]);
    hx_wait_child(pid);

    msv_slot_census(c, census);
    tap_ok(census[MSV_SLOT_CLAIMED] == 2 && census[MSV_SLOT_SUBMITTED] == 1
           && census[MSV_SLOT_RUNNING] == 1,
           "reap: dead pid %d left slots CLAIMED, SUBMITTED, RUNNING",
           (int) pid);

    n = msv_slots_reap(c, -1, out, 2);
    tap_ok(n == 2, "reap: out full after 2: the rest wait (%u)", n);
    n += msv_slots_reap(c, -1, out + 2, N_SLOTS - 2);
    k = 0;
    for (i = 0; i < (int) n; i++) {
        k += out[i] == (uint32_t) ours[0] || out[i] == (uint32_t) ours[1]
             || out[i] == (uint32_t) ours[2];
    }
    tap_ok(n == 3 && k == 3, "reap: the dead pid's 3 slots freed and listed "
           "(RUNNING %d among them)", ours[2]);
    tap_ok(msv_slot_state(c, mine) == MSV_SLOT_CLAIMED,
           "reap: a live owner's claimed slot untouched");
    msv_slot_unclaim(c, mine);

    /* by reader index */
    e = msv_reader_at(c, 2);
    a = msv_slot_claim(c, 2, getpid());
    b = msv_slot_claim(c, 2, getpid());
    d = msv_slot_claim(c, 3, getpid());
    cl = msv_slot_claim(c, 2, getpid());
    msv_slot_submit(c, a, "a", &p, &prompt, 1, NULL);
    cookie = msv_slot_submit(c, b, "b", &p, &prompt, 1, NULL);
    worker_move(c, b, MSV_SLOT_SUBMITTED, MSV_SLOT_FINISHED);
    msv_slot_submit(c, d, "d", &p, &prompt, 1, NULL);

    /* entry 2 ATTACHED by us: these are a live reader's, keep them */
    atomic_store(&e->state, MSV_STATE_WORD(getpid(), MSV_READER_ATTACHED));
    tap_ok(msv_slots_reap(c, 2, out, N_SLOTS) == 0,
           "reap: index 2 attached by the slots' own pid: nothing freed");

    /* entry 2 now another process's (pid 1 lives): ours are orphans */
    atomic_store(&e->state, MSV_STATE_WORD(1, MSV_READER_ATTACHED));
    n = msv_slots_reap(c, 2, out, N_SLOTS);
    tap_ok(n == 2 && msv_slot_state(c, a) == MSV_SLOT_FREE
           && msv_slot_state(c, b) == MSV_SLOT_FREE
           && msv_slot_state(c, d) == MSV_SLOT_SUBMITTED
           && msv_slot_state(c, cl) == MSV_SLOT_CLAIMED,
           "reap: index 2 reused by another pid: its SUBMITTED and FINISHED "
           "slots freed; reader 3's and the CLAIMED one kept (%u)", n);
    atomic_store(&e->state, 0);

    /* the old owner comes back late: the slot's new request is safe */
    tap_ok(claim_exactly(c, b) == b, "reap: slot %d claimed again", b);
    fresh = msv_slot_submit(c, b, "new", &p, &prompt, 1, NULL);
    msv_slot_cancel(c, b, cookie);
    tap_ok(fresh != 0 && fresh != cookie
           && atomic_load(&msv_slot_at(c, b)->cancel) == 0,
           "reap: a stale cookie does not cancel the new request");
    worker_move(c, b, MSV_SLOT_SUBMITTED, MSV_SLOT_FINISHED);
    tap_ok(msv_slot_release(c, b, cookie) == -1
           && msv_slot_state(c, b) == MSV_SLOT_FINISHED,
           "reap: nor does it release it");
    tap_ok(msv_slot_release(c, b, fresh) == 0, "reap: the new owner can");

    msv_slot_unclaim(c, cl);
    worker_move(c, d, MSV_SLOT_SUBMITTED, MSV_SLOT_FINISHED);
    msv_slot_release(c, d, msv_slot_at(c, d)->cookie);

    msv_slot_census(c, census);
    tap_ok(census[MSV_SLOT_FREE] == N_SLOTS, "reap: table clean after");
}


/* Slot i's state word, written outright (a process the test is not). */
static void
set_state(struct msv_ctrl *c, uint32_t i, int32_t pid, uint32_t st)
{
    atomic_store(&msv_slot_at(c, i)->state, MSV_STATE_WORD(pid, st));
}


/* What msv_slots_adopt passed on. */
struct adopted {
    uint32_t  n;
    uint32_t  slot[N_SLOTS];
    uint64_t  cookie[N_SLOTS];
};


static void
adopt_cb(void *ud, uint32_t slot, uint64_t cookie)
{
    struct adopted  *ad = ud;

    if (ad->n < N_SLOTS) {
        ad->slot[ad->n] = slot;
        ad->cookie[ad->n] = cookie;
        ad->n++;
    }
}


/*
 * A reader that lost the region and attached again (its requests ended):
 * this process's FINISHED and ABORTED slots freed, its SUBMITTED and
 * RUNNING ones cancelled and handed back as orphans with their cookies,
 * whatever reader index they were claimed under; a CLAIMED one and other
 * processes' slots left alone.
 */
static void
test_adopt(struct msv_ctrl *c)
{
    int                sub, run, fin, abo, cl, other, i;
    int32_t            prompt = 1;
    uint32_t           n, census[6];
    uint64_t           ck_sub, ck_run, ck_other;
    struct msv_params  p;
    struct adopted     ad;

    params(&p, 0);

    sub = msv_slot_claim(c, 1, getpid());
    run = msv_slot_claim(c, 2, getpid());
    fin = msv_slot_claim(c, 1, getpid());
    abo = msv_slot_claim(c, 3, getpid());
    cl = msv_slot_claim(c, 1, getpid());
    other = msv_slot_claim(c, 1, 1);       /* pid 1's (a live process) */
    ck_sub = msv_slot_submit(c, sub, "s", &p, &prompt, 1, NULL);
    ck_run = msv_slot_submit(c, run, "r", &p, &prompt, 1, NULL);
    msv_slot_submit(c, fin, "f", &p, &prompt, 1, NULL);
    msv_slot_submit(c, abo, "a", &p, &prompt, 1, NULL);
    worker_move(c, run, MSV_SLOT_SUBMITTED, MSV_SLOT_RUNNING);
    worker_move(c, fin, MSV_SLOT_SUBMITTED, MSV_SLOT_FINISHED);
    worker_move(c, abo, MSV_SLOT_SUBMITTED, MSV_SLOT_ABORTED);

    /* pid 1's slot, running (its submit is not ours to make: the state
     * and the cookie written as they would be) */
    ck_other = 0x5eed;
    __atomic_store_n(&msv_slot_at(c, other)->cookie, ck_other,
                     __ATOMIC_RELAXED);
    set_state(c, other, 1, MSV_SLOT_RUNNING);

    memset(&ad, 0, sizeof(ad));
    n = msv_slots_adopt(c, getpid(), adopt_cb, &ad);

    tap_ok(n == 2 && msv_slot_state(c, fin) == MSV_SLOT_FREE
           && msv_slot_state(c, abo) == MSV_SLOT_FREE,
           "adopt: the FINISHED and the ABORTED slot freed (%u)", n);
    i = ad.n == 2
        && ((ad.slot[0] == (uint32_t) sub && ad.cookie[0] == ck_sub
             && ad.slot[1] == (uint32_t) run && ad.cookie[1] == ck_run)
            || (ad.slot[1] == (uint32_t) sub && ad.cookie[1] == ck_sub
                && ad.slot[0] == (uint32_t) run && ad.cookie[0] == ck_run));
    tap_ok(i, "adopt: the SUBMITTED and the RUNNING slot handed back with "
           "their cookies (%u)", ad.n);
    tap_ok(msv_slot_state(c, sub) == MSV_SLOT_SUBMITTED
           && msv_slot_state(c, run) == MSV_SLOT_RUNNING
           && atomic_load(&msv_slot_at(c, sub)->cancel) == 1
           && atomic_load(&msv_slot_at(c, run)->cancel) == 1,
           "adopt: those stay, cancelled, for the worker to end");
    tap_ok(msv_slot_state(c, cl) == MSV_SLOT_CLAIMED
           && msv_slot_state(c, other) == MSV_SLOT_RUNNING
           && atomic_load(&msv_slot_at(c, other)->cancel) == 0,
           "adopt: a CLAIMED slot and another pid's slot untouched");

    /* the orphans end: their last rows free them */
    worker_move(c, sub, MSV_SLOT_SUBMITTED, MSV_SLOT_ABORTED);
    worker_move(c, run, MSV_SLOT_RUNNING, MSV_SLOT_ABORTED);
    tap_ok(msv_slot_release(c, sub, ck_sub) == 0
           && msv_slot_release(c, run, ck_run) == 0,
           "adopt: the orphans released by their cookies at their end");

    memset(&ad, 0, sizeof(ad));
    tap_ok(msv_slots_adopt(c, getpid(), adopt_cb, &ad) == 0 && ad.n == 0,
           "adopt: nothing left a second time");

    msv_slot_unclaim(c, cl);
    set_state(c, other, 0, MSV_SLOT_FREE);
    msv_slot_census(c, census);
    tap_ok(census[MSV_SLOT_FREE] == N_SLOTS, "adopt: table clean after");
}


int
main(void)
{
    char               err[256], name[64];
    struct msv_region  rg;
    struct msv_layout  lay;

    hx_name(name, sizeof(name), "slots");
    layout(&lay);
    if (msv_region_create(&rg, name, &lay, err, sizeof(err)) != 0) {
        tap_ok(0, "region: %s", err);
        return tap_done();
    }

    test_cycle(rg.ctrl);
    test_race(rg.ctrl);
    test_reap(rg.ctrl);
    test_adopt(rg.ctrl);

    msv_region_unmap(&rg);
    msv_region_unlink(name);
    return tap_done();
}
