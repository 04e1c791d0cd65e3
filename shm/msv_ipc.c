/*
 * msv_ipc.c: the worker's side of the reader link.
 *
 * A reader attaches by connecting to the region's socket with a hello and
 * its eventfd; the worker sets the reader's tail to the published head,
 * marks it ATTACHED and answers with its own submission eventfd.  The
 * connection stays open: EOF means the reader process is gone, and the
 * worker then evicts it (its tail stops holding the ring back) and frees
 * its slots.  Readers whose pid vanished without a close (or who never
 * finished attaching) are swept once a second.
 */

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "msv_link.h"
#include "msv_region.h"
#include "msv_slots.h"
#include "msv_ipc.h"

#define msv_ipc_log(x, level, ...)                                           \
    do { if ((x)->log != NULL) (x)->log(level, __VA_ARGS__); } while (0)
#define msv_ipc_info(x, ...)  msv_ipc_log(x, MSV_IPC_INFO, __VA_ARGS__)
#define msv_ipc_warn(x, ...)  msv_ipc_log(x, MSV_IPC_WARN, __VA_ARGS__)

/*
 * epoll data: a reader's event carries its entry and its connection's fd,
 * so that an event of a connection closed earlier in the same batch (its
 * entry since taken by a new reader) is not taken for the new one's.
 */
#define MSV_EV_READER(i, fd)  (((uint64_t) (uint32_t) (fd) << 32) | (i))
#define MSV_EV_ID(d)          ((uint32_t) (d))
#define MSV_EV_FD(d)          ((int) ((d) >> 32))

#define MSV_EV_LISTEN  0xffff0001u
#define MSV_EV_SUBMIT  0xffff0002u


int
msv_ipc_init(struct msv_ipc *x, struct msv_ctrl *c,
    struct msv_producer *prod, uint64_t reader_timeout_ns,
    volatile sig_atomic_t *stop, char *err, size_t errlen)
{
    int                 i;
    struct epoll_event  ev;

    memset(x, 0, sizeof(*x));
    x->c = c;
    x->prod = prod;
    x->reader_timeout_ns = reader_timeout_ns;
    x->stop = stop;
    x->lfd = -1;
    x->evfd = -1;
    for (i = 0; i < MSV_MAX_READERS; i++) {
        x->conn[i] = -1;
    }

    x->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (x->epfd < 0) {
        snprintf(err, errlen, "epoll_create1: %s", strerror(errno));
        return -1;
    }

    x->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (x->evfd < 0) {
        snprintf(err, errlen, "eventfd: %s", strerror(errno));
        return -1;
    }

    x->lfd = msv_listen(c->sock_path, err, errlen);
    if (x->lfd < 0) {
        return -1;
    }

    ev.events = EPOLLIN;
    ev.data.u64 = MSV_EV_LISTEN;
    if (epoll_ctl(x->epfd, EPOLL_CTL_ADD, x->lfd, &ev) != 0) {
        snprintf(err, errlen, "epoll_ctl: %s", strerror(errno));
        return -1;
    }
    ev.data.u64 = MSV_EV_SUBMIT;
    if (epoll_ctl(x->epfd, EPOLL_CTL_ADD, x->evfd, &ev) != 0) {
        snprintf(err, errlen, "epoll_ctl: %s", strerror(errno));
        return -1;
    }

    return 0;
}


/* Free the slots of reader entry i (-1: of dead pids, whatever entry)
 * and forget their sequences. */
static void
msv_ipc_reap(struct msv_ipc *x, int i)
{
    uint32_t  slots[256], n, k, total;

    total = 0;
    do {
        n = msv_slots_reap(x->c, i, slots, 256);
        for (k = 0; k < n && k < 256; k++) {
            if (x->forget != NULL) {
                x->forget(x->forget_ud, slots[k]);
            }
        }
        total += n;
    } while (n == 256);

    x->slots_freed += total;

    if (total && i >= 0) {
        msv_ipc_info(x, "reader %d: freed %u slots", i, total);
    } else if (total) {
        msv_ipc_info(x, "freed %u slots of processes that are gone",
                     total);
    }
}


void
msv_ipc_evict(struct msv_ipc *x, uint32_t i, const char *why)
{
    int32_t   pid;
    uint64_t  w = atomic_load_explicit(&msv_reader_at(x->c, i)->state,
                                       memory_order_relaxed);

    /* a reader that detached cleanly has already cleared its entry */
    pid = MSV_STATE_OF(w) != MSV_READER_FREE ? MSV_PID_OF(w) : x->pid[i];
    msv_ipc_info(x, "reader %u (pid %d) detached: %s", i, (int) pid,
                 why);

    if (x->conn[i] >= 0) {
        epoll_ctl(x->epfd, EPOLL_CTL_DEL, x->conn[i], NULL);
        close(x->conn[i]);
        x->conn[i] = -1;
    }
    if (x->prod->wake_fd[i] >= 0) {
        close(x->prod->wake_fd[i]);
        x->prod->wake_fd[i] = -1;
    }

    if (MSV_STATE_OF(w) != MSV_READER_FREE && MSV_PID_OF(w) != x->pid[i]
        && x->pid[i] != 0)
    {
        /* the entry was freed by its reader and already claimed by
         * another process: that one's entry and slots are not ours */
        x->pid[i] = 0;
        return;
    }
    x->pid[i] = 0;
    if (msv_reader_evict(x->c, i)) {
        x->evicted++;
    }

    msv_ipc_reap(x, (int) i);
}


static void
msv_ipc_accept(struct msv_ipc *x)
{
    int                 conn, evfd;
    uint64_t            tail;
    struct msv_hello    h;
    struct msv_welcome  w;
    struct epoll_event  ev;

    for ( ;; ) {
        evfd = -1;
        conn = msv_accept_hello(x->lfd, &h, &evfd, 1000);
        if (conn < 0) {
            return;         /* EAGAIN, or a bad hello (already logged) */
        }

        memset(&w, 0, sizeof(w));
        w.magic = MSV_WELCOME_MAGIC;
        w.generation = x->c->generation;

        w.status = msv_reader_admit(x->c, &h,
                                    atomic_load_explicit(&x->c->head,
                                                         memory_order_relaxed),
                                    &tail);
        if (w.status != 0) {
            msv_ipc_warn(x, "reader hello rejected (entry %u, pid %d): %s",
                         h.reader, (int) h.pid, strerror(-w.status));
            msv_send_welcome(conn, &w, x->evfd);
            close(conn);
            if (evfd >= 0) {
                close(evfd);
            }
            continue;
        }

        if (x->conn[h.reader] >= 0) {
            /*
             * The entry's previous holder left without our noticing its
             * EOF yet: drop its connection and slots (reap never frees
             * the slots of the pid now attached there), keep the new one.
             */
            msv_ipc_info(x, "reader %u: previous holder pid %d replaced",
                         h.reader, (int) x->pid[h.reader]);
            epoll_ctl(x->epfd, EPOLL_CTL_DEL, x->conn[h.reader], NULL);
            close(x->conn[h.reader]);
            x->conn[h.reader] = -1;
            if (x->prod->wake_fd[h.reader] >= 0) {
                close(x->prod->wake_fd[h.reader]);
                x->prod->wake_fd[h.reader] = -1;
            }
            msv_ipc_reap(x, (int) h.reader);
        }

        w.tail = tail;
        if (msv_send_welcome(conn, &w, x->evfd) != 0) {
            msv_reader_evict(x->c, h.reader);
            close(conn);
            close(evfd);
            continue;
        }

        x->conn[h.reader] = conn;
        x->pid[h.reader] = h.pid;
        x->prod->wake_fd[h.reader] = evfd;

        ev.events = EPOLLIN | EPOLLRDHUP;
        ev.data.u64 = MSV_EV_READER(h.reader, conn);
        epoll_ctl(x->epfd, EPOLL_CTL_ADD, conn, &ev);

        x->admitted++;
        msv_ipc_info(x, "reader %u (pid %d) attached at %llu", h.reader,
                     (int) h.pid, (unsigned long long) tail);
    }
}


/* Once a second: readers and claimed slots whose processes are gone. */
static void
msv_ipc_sweep(struct msv_ipc *x)
{
    uint32_t           i;
    uint64_t           w, now = msv_now_ns();
    struct msv_reader *r;

    if (now - x->last_sweep_ns < 1000000000ULL) {
        return;
    }
    x->last_sweep_ns = now;

    for (i = 0; i < x->c->n_readers; i++) {
        r = msv_reader_at(x->c, i);
        w = atomic_load_explicit(&r->state, memory_order_relaxed);
        if (MSV_STATE_OF(w) != MSV_READER_FREE
            && !msv_pid_alive(MSV_PID_OF(w)))
        {
            msv_ipc_evict(x, i, "process gone");
        }
    }

    msv_ipc_reap(x, -1);
}


int
msv_ipc_poll(struct msv_ipc *x, int timeout_ms)
{
    int                 i, n;
    char                b[64];
    ssize_t             got;
    uint32_t            id;
    struct epoll_event  evs[16];

    n = epoll_wait(x->epfd, evs, 16, timeout_ms);
    if (n < 0) {
        n = 0;          /* EINTR: a signal; the caller looks at stop */
    }

    for (i = 0; i < n; i++) {
        id = MSV_EV_ID(evs[i].data.u64);

        if (evs[i].data.u64 == MSV_EV_LISTEN) {
            msv_ipc_accept(x);

        } else if (evs[i].data.u64 == MSV_EV_SUBMIT) {
            x->kicks += msv_drain(x->evfd);

        } else if (id < MSV_MAX_READERS && x->conn[id] >= 0
                   && x->conn[id] == MSV_EV_FD(evs[i].data.u64))
        {
            got = recv(x->conn[id], b, sizeof(b), MSG_DONTWAIT);
            if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)
                || (evs[i].events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)))
            {
                msv_ipc_evict(x, id, "connection closed");
            }
        }
    }

    msv_ipc_sweep(x);
    return n;
}


int
msv_ipc_ring_wait(void *ud, uint64_t waited_ns)
{
    struct msv_ipc     *x = ud;
    uint32_t            i, laggard;
    uint64_t            now, head, tail, min;
    struct msv_reader  *r;

    msv_ipc_poll(x, 1);

    now = msv_now_ns();
    head = atomic_load_explicit(&x->c->head, memory_order_relaxed);
    min = msv_ring_min_tail(x->c, head);

    if (now - x->last_wait_log_ns > 1000000000ULL) {
        x->last_wait_log_ns = now;
        msv_ipc_warn(x, "output ring full: waiting %llu ms for readers to "
                     "consume", (unsigned long long) (waited_ns / 1000000));
    }

    /*
     * A reader that holds the ring back for reader_timeout without a
     * heartbeat, or for three times that in any case, is evicted: its
     * requests are aborted by freeing their slots, so one stuck reader
     * cannot stall the worker.
     */
    if (waited_ns > x->reader_timeout_ns) {
        laggard = MSV_MAX_READERS;
        for (i = 0; i < x->c->n_readers; i++) {
            r = msv_reader_at(x->c, i);
            if (MSV_STATE_OF(atomic_load_explicit(&r->state,
                                                  memory_order_relaxed))
                != MSV_READER_ATTACHED)
            {
                continue;
            }
            tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
            if (tail == min) {
                laggard = i;
                break;
            }
        }
        if (laggard < MSV_MAX_READERS) {
            r = msv_reader_at(x->c, laggard);
            if (now - atomic_load_explicit(&r->heartbeat_ns,
                                           memory_order_relaxed)
                    > x->reader_timeout_ns
                || waited_ns > 3 * x->reader_timeout_ns)
            {
                msv_ipc_evict(x, laggard, "not consuming the ring");
                atomic_fetch_add_explicit(&x->c->readers_evicted, 1,
                                          memory_order_relaxed);
            }
        }
    }

    return *x->stop > 1 ? -1 : 0;
}


uint32_t
msv_ipc_readers(struct msv_ipc *x)
{
    uint32_t  i, n = 0;

    for (i = 0; i < MSV_MAX_READERS; i++) {
        n += x->conn[i] >= 0;
    }
    return n;
}


void
msv_ipc_close(struct msv_ipc *x)
{
    int  i;

    for (i = 0; i < MSV_MAX_READERS; i++) {
        if (x->conn[i] >= 0) {
            close(x->conn[i]);
            x->conn[i] = -1;
        }
        if (x->prod != NULL && x->prod->wake_fd[i] >= 0) {
            close(x->prod->wake_fd[i]);
            x->prod->wake_fd[i] = -1;
        }
    }
    if (x->lfd >= 0) {
        close(x->lfd);
    }
    if (x->evfd >= 0) {
        close(x->evfd);
    }
    if (x->epfd >= 0) {
        close(x->epfd);
    }
    unlink(x->c->sock_path);
}
