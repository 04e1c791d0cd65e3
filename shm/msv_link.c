/*
 * msv_link.c: the unix socket between a worker and its readers.  The
 * handshake exchanges eventfds (SCM_RIGHTS); the connection then stays
 * open and its EOF tells either side that the other is gone.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE         /* accept4, struct ucred */
#endif

#include <errno.h>
#include <poll.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "msv_link.h"
#include "msv_slots.h"


#define MSV_MAX_PASSED_FDS  4   /* room to receive (and close) extras */


union msv_cmsg_buf {
    struct cmsghdr  align;
    char            buf[CMSG_SPACE(sizeof(int) * MSV_MAX_PASSED_FDS)];
};


static int msv_set_timeouts(int fd, int timeout_ms);
static int msv_set_nonblock(int fd);
static ssize_t msv_recv_fd(int fd, void *buf, size_t len, int *fd_out);
static int msv_send_fd(int fd, const void *buf, size_t len, int pass);
static int msv_claim_entry(struct msv_ctrl *c, int32_t pid);
static void msv_release_entry(struct msv_ctrl *c, uint32_t i, int32_t pid);
static void msv_detach_slots(struct msv_attachment *a);


/* ------------------------------------------------------------------ */
/* Socket helpers                                                       */

static int
msv_set_timeouts(int fd, int timeout_ms)
{
    struct timeval  tv;

    tv.tv_sec = timeout_ms / 1000;
    tv.tv_usec = (timeout_ms % 1000) * 1000;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0
        || setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0)
    {
        return -1;
    }
    return 0;
}


static int
msv_set_nonblock(int fd)
{
    int  fl = fcntl(fd, F_GETFL);

    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) {
        return -1;
    }
    return 0;
}


/*
 * Read exactly len bytes (blocking, bounded by SO_RCVTIMEO) and at most
 * one passed fd, which lands in *fd_out (close-on-exec); extra fds are
 * closed.  Returns len, 0 on EOF before len bytes, -1 with errno
 * (ETIMEDOUT when the timeout ran out).
 */
static ssize_t
msv_recv_fd(int fd, void *buf, size_t len, int *fd_out)
{
    int                 *fds;
    size_t               got, i, nfd;
    ssize_t              n;
    struct iovec         iov;
    struct msghdr        msg;
    struct cmsghdr      *cm;
    union msv_cmsg_buf   cb;

    *fd_out = -1;
    got = 0;

    while (got < len) {
        iov.iov_base = (char *) buf + got;
        iov.iov_len = len - got;
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cb.buf;
        msg.msg_controllen = sizeof(cb.buf);

        n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                errno = ETIMEDOUT;
            }
            goto failed;
        }

        for (cm = CMSG_FIRSTHDR(&msg); cm != NULL;
             cm = CMSG_NXTHDR(&msg, cm))
        {
            if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) {
                continue;
            }
            fds = (int *) CMSG_DATA(cm);
            nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (i = 0; i < nfd; i++) {
                if (*fd_out < 0) {
                    *fd_out = fds[i];
                } else {
                    close(fds[i]);
                }
            }
        }

        if (n == 0) {
            if (*fd_out >= 0) {
                close(*fd_out);
                *fd_out = -1;
            }
            return 0;
        }
        got += (size_t) n;
    }

    return (ssize_t) got;

failed:

    if (*fd_out >= 0) {
        close(*fd_out);
        *fd_out = -1;
    }
    return -1;
}


/* Send len bytes with fd `pass` attached (none if pass < 0). */
static int
msv_send_fd(int fd, const void *buf, size_t len, int pass)
{
    ssize_t              n;
    struct iovec         iov;
    struct msghdr        msg;
    struct cmsghdr      *cm;
    union msv_cmsg_buf   cb;

    iov.iov_base = (void *) buf;
    iov.iov_len = len;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;

    if (pass >= 0) {
        memset(&cb, 0, sizeof(cb));
        msg.msg_control = cb.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int));
        cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &pass, sizeof(int));
    }

    do {
        n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);

    if (n < 0) {
        return -1;
    }
    if ((size_t) n != len) {
        errno = EPROTO;     /* a few dozen bytes into a fresh socket */
        return -1;
    }
    return 0;
}


void
msv_kick(int evfd)
{
    uint64_t  one = 1;

    /* EAGAIN: the counter is saturated, the other side is awake anyway */
    while (write(evfd, &one, sizeof(one)) < 0 && errno == EINTR) {
        /* retry */
    }
}


uint64_t
msv_drain(int evfd)
{
    uint64_t  v, total = 0;
    ssize_t   n;

    for ( ;; ) {
        n = read(evfd, &v, sizeof(v));
        if (n == (ssize_t) sizeof(v)) {
            total += v;
            continue;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        return total;   /* EAGAIN (drained) or an error: nothing more */
    }
}


/* ------------------------------------------------------------------ */
/* Worker side                                                          */

int
msv_listen(const char *path, char *err, size_t errlen)
{
    int                 fd;
    struct sockaddr_un  sa;

    if (strlen(path) >= sizeof(sa.sun_path)) {
        snprintf(err, errlen, "socket path %s longer than %zu bytes", path,
                 sizeof(sa.sun_path) - 1);
        return -1;
    }

    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket(AF_UNIX): %s", strerror(errno));
        return -1;
    }

    /* a previous worker's socket file: nobody listens there any more */
    if (unlink(path) != 0 && errno != ENOENT) {
        snprintf(err, errlen, "unlink(%s): %s", path, strerror(errno));
        goto failed;
    }

    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path) + 1);

    if (bind(fd, (struct sockaddr *) &sa, sizeof(sa)) != 0) {
        snprintf(err, errlen, "bind(%s): %s", path, strerror(errno));
        goto failed;
    }
    /*
     * Until this chmod the umask decides; a stranger who connects in that
     * instant still cannot attach: admission needs an entry CLAIMED in
     * the region, which is 0600.
     */
    if (chmod(path, 0600) != 0) {
        snprintf(err, errlen, "chmod(%s, 0600): %s", path, strerror(errno));
        goto failed;
    }
    if (listen(fd, 128) != 0) {
        snprintf(err, errlen, "listen(%s): %s", path, strerror(errno));
        goto failed;
    }

    return fd;

failed:

    close(fd);
    return -1;
}


int
msv_accept_hello(int lfd, struct msv_hello *h, int *evfd, int timeout_ms)
{
    int            conn, fd, saved;
    ssize_t        n;
    socklen_t      len;
    struct ucred   cred;
    const char    *why;

    *evfd = -1;

    conn = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (conn < 0) {
        return -1;      /* EAGAIN: nobody waiting */
    }

    fd = -1;
    why = NULL;

    if (msv_set_timeouts(conn, timeout_ms) != 0) {
        why = "setsockopt";
        goto failed;
    }

    n = msv_recv_fd(conn, h, sizeof(*h), &fd);
    if (n < 0) {
        why = errno == ETIMEDOUT ? "no hello in time" : "recvmsg";
        goto failed;
    }
    if (n == 0) {
        errno = EPROTO;
        why = "closed before its hello";
        goto failed;
    }
    if (h->magic != MSV_HELLO_MAGIC) {
        errno = EPROTO;
        why = "bad hello magic";
        goto failed;
    }
    if (fd < 0) {
        errno = EPROTO;
        why = "hello without an eventfd";
        goto failed;
    }

    len = sizeof(cred);
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        why = "SO_PEERCRED";
        goto failed;
    }
    if ((int32_t) cred.pid != h->pid) {
        errno = EPERM;
        why = "hello pid is not the peer's pid";
        goto failed;
    }

    if (msv_set_nonblock(conn) != 0 || msv_set_nonblock(fd) != 0) {
        why = "fcntl(O_NONBLOCK)";
        goto failed;
    }

    *evfd = fd;
    return conn;

failed:

    saved = errno;
    fprintf(stderr, "msv_accept_hello: reader connection dropped: %s: %s\n",
            why, strerror(saved));
    if (fd >= 0) {
        close(fd);
    }
    close(conn);
    errno = saved;
    return -1;
}


int
msv_send_welcome(int conn, const struct msv_welcome *w, int evfd)
{
    return msv_send_fd(conn, w, sizeof(*w), evfd);
}


int
msv_reader_admit(struct msv_ctrl *c, const struct msv_hello *h,
    uint64_t head, uint64_t *tail_out)
{
    uint64_t            w;
    struct msv_reader  *r;

    if (h->magic != MSV_HELLO_MAGIC) {
        return -EPROTO;
    }
    if (h->generation != c->generation) {
        return -ESTALE;
    }
    if (h->reader >= c->n_readers || h->pid <= 0) {
        return -EINVAL;
    }

    r = msv_reader_at(c, h->reader);
    w = MSV_STATE_WORD(h->pid, MSV_READER_CLAIMED);
    if (atomic_load_explicit(&r->state, memory_order_relaxed) != w) {
        return -EPERM;
    }

    /* the entry is the claimant's; these fields are ours to set */
    atomic_store_explicit(&r->tail, head, memory_order_relaxed);
    atomic_store_explicit(&r->armed, 0, memory_order_relaxed);
    atomic_store_explicit(&r->heartbeat_ns, msv_now_ns(),
                          memory_order_relaxed);
    r->attach_seq++;

    /*
     * R2: release, pairs with A2 in msv_ring_min_tail (and with the
     * reader's acquire in msv_attach): the tail is set before the entry
     * counts.  A CAS: the claimant may have given up meanwhile.
     */
    if (!atomic_compare_exchange_strong_explicit(&r->state, &w,
            MSV_STATE_WORD(h->pid, MSV_READER_ATTACHED),
            memory_order_release, memory_order_relaxed))
    {
        return -EPERM;
    }

    *tail_out = head;
    return 0;
}


int
msv_reader_evict(struct msv_ctrl *c, uint32_t i)
{
    uint64_t            w;
    struct msv_reader  *r;

    if (i >= c->n_readers) {
        return 0;
    }
    r = msv_reader_at(c, i);

    w = atomic_load_explicit(&r->state, memory_order_relaxed);
    for ( ;; ) {
        if (MSV_STATE_OF(w) == MSV_READER_FREE) {
            return 0;
        }
        if (MSV_STATE_OF(w) == MSV_READER_CLAIMED
            && msv_pid_alive(MSV_PID_OF(w)))
        {
            return 0;   /* a new reader mid-attach, not ours to drop */
        }
        if (atomic_compare_exchange_weak_explicit(&r->state, &w, 0,
                memory_order_release, memory_order_relaxed))
        {
            break;
        }
    }

    /*
     * F2: pairs with F3 in msv_consume: the producer writes over this
     * reader's unread bytes only after the FREE above is visible, so a
     * consumer that still sees itself ATTACHED after reading read intact
     * bytes.
     */
    atomic_thread_fence(memory_order_seq_cst);
    return 1;
}


/* ------------------------------------------------------------------ */
/* Reader side                                                          */

/* Claim a FREE entry, or else one whose owner died.  Index or -1. */
static int
msv_claim_entry(struct msv_ctrl *c, int32_t pid)
{
    int                 pass;
    uint32_t            i;
    uint64_t            w;
    struct msv_reader  *r;

    for (pass = 0; pass < 2; pass++) {
        for (i = 0; i < c->n_readers; i++) {
            r = msv_reader_at(c, i);
            w = atomic_load_explicit(&r->state, memory_order_relaxed);

            if (pass == 0 ? MSV_STATE_OF(w) != MSV_READER_FREE
                          : MSV_STATE_OF(w) == MSV_READER_FREE
                            || MSV_PID_OF(w) == pid
                            || msv_pid_alive(MSV_PID_OF(w)))
            {
                continue;
            }

            /*
             * acquire: pairs with the release that freed the entry
             * (msv_detach, msv_reader_evict): the old owner is done.
             */
            if (atomic_compare_exchange_strong_explicit(&r->state, &w,
                    MSV_STATE_WORD(pid, MSV_READER_CLAIMED),
                    memory_order_acquire, memory_order_relaxed))
            {
                atomic_store_explicit(&r->heartbeat_ns, msv_now_ns(),
                                      memory_order_relaxed);
                return (int) i;
            }
        }
    }

    return -1;
}


/* Free entry i if it is still ours (any state). */
static void
msv_release_entry(struct msv_ctrl *c, uint32_t i, int32_t pid)
{
    uint64_t            w;
    struct msv_reader  *r = msv_reader_at(c, i);

    w = atomic_load_explicit(&r->state, memory_order_relaxed);
    while (MSV_STATE_OF(w) != MSV_READER_FREE && MSV_PID_OF(w) == pid) {
        /* release: pairs with the acquire of the next claimant */
        if (atomic_compare_exchange_weak_explicit(&r->state, &w, 0,
                memory_order_release, memory_order_relaxed))
        {
            return;
        }
    }
}


int
msv_attach_start(struct msv_attachment *a, const char *name, char *err,
    size_t errlen)
{
    int                  e;
    uint32_t             st;
    uint64_t             now, hb;
    struct msv_ctrl     *c;
    struct msv_hello     h;
    struct sockaddr_un   sa;
    static const char   *states[] = { "starting", "ready", "draining",
                                      "stopped" };

    memset(a, 0, sizeof(*a));
    a->conn_fd = -1;
    a->wake_fd = -1;
    a->kick_fd = -1;
    a->reader = UINT32_MAX;

    if (msv_region_open(&a->rg, name, err, errlen) != 0) {
        return -1;
    }
    c = a->rg.ctrl;

    st = atomic_load_explicit(&c->state, memory_order_acquire);
    if (st != MSV_WORKER_READY) {
        snprintf(err, errlen, "worker of /%s is %s, not ready", name,
                 st < 4 ? states[st] : "in an unknown state");
        goto failed;
    }
    if (!msv_pid_alive(c->worker_pid)) {
        snprintf(err, errlen, "worker of /%s (pid %d) is gone: stale region",
                 name, (int) c->worker_pid);
        goto failed;
    }
    now = msv_now_ns();
    hb = atomic_load_explicit(&c->heartbeat_ns, memory_order_relaxed);
    if (now > hb && now - hb > MSV_HEARTBEAT_STALE_NS) {
        snprintf(err, errlen, "worker of /%s (pid %d): heartbeat %.1f s old",
                 name, (int) c->worker_pid, (double) (now - hb) / 1e9);
        goto failed;
    }

    a->pid = (int32_t) getpid();
    a->generation = c->generation;

    e = msv_claim_entry(c, a->pid);
    if (e < 0) {
        snprintf(err, errlen, "worker of /%s: all %u reader entries are "
                 "taken by live processes", name, c->n_readers);
        goto failed;
    }
    a->reader = (uint32_t) e;

    a->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (a->wake_fd < 0) {
        snprintf(err, errlen, "eventfd: %s", strerror(errno));
        goto failed;
    }

    a->conn_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (a->conn_fd < 0) {
        snprintf(err, errlen, "socket(AF_UNIX): %s", strerror(errno));
        goto failed;
    }
    if (msv_set_timeouts(a->conn_fd, MSV_ATTACH_TIMEOUT_MS) != 0) {
        snprintf(err, errlen, "setsockopt: %s", strerror(errno));
        goto failed;
    }

    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, c->sock_path,
           strnlen(c->sock_path, sizeof(sa.sun_path) - 1));
    while (connect(a->conn_fd, (struct sockaddr *) &sa, sizeof(sa)) != 0) {
        if (errno != EINTR) {
            snprintf(err, errlen, "connect(%s): %s", sa.sun_path,
                     strerror(errno));
            goto failed;
        }
    }

    memset(&h, 0, sizeof(h));
    h.magic = MSV_HELLO_MAGIC;
    h.reader = a->reader;
    h.generation = a->generation;
    h.pid = a->pid;
    if (msv_send_fd(a->conn_fd, &h, sizeof(h), a->wake_fd) != 0) {
        snprintf(err, errlen, "sending hello to %s: %s", sa.sun_path,
                 strerror(errno));
        goto failed;
    }

    return 0;

failed:

    msv_detach(a);
    return -1;
}


int
msv_attach_finish(struct msv_attachment *a, char *err, size_t errlen)
{
    int                  got_fd;
    uint64_t             w;
    ssize_t              n;
    const char          *name = a->rg.name + 1;
    struct pollfd        pfd;
    struct msv_ctrl     *c = a->rg.ctrl;
    struct msv_welcome   wel;

    pfd.fd = a->conn_fd;
    pfd.events = POLLIN;
    pfd.revents = 0;
    if (poll(&pfd, 1, 0) == 0) {
        return 1;               /* not yet */
    }

    /* the welcome is one small message: here whole, or EOF */
    n = msv_recv_fd(a->conn_fd, &wel, sizeof(wel), &got_fd);
    if (n <= 0) {
        snprintf(err, errlen, "waiting for the welcome on %s: %s",
                 c->sock_path, n == 0 ? "worker closed the connection"
                                     : strerror(errno));
        goto failed;
    }
    a->kick_fd = got_fd;

    if (wel.magic != MSV_WELCOME_MAGIC) {
        snprintf(err, errlen, "welcome from %s has bad magic %08x",
                 c->sock_path, wel.magic);
        goto failed;
    }
    if (wel.status != 0) {
        snprintf(err, errlen, "worker of /%s refused reader entry %u: %s",
                 name, a->reader, strerror(-wel.status));
        goto failed;
    }
    if (wel.generation != a->generation) {
        snprintf(err, errlen, "worker of /%s answered for generation %016llx,"
                 " we mapped %016llx", name,
                 (unsigned long long) wel.generation,
                 (unsigned long long) a->generation);
        goto failed;
    }

    /* acquire: pairs with R2 in msv_reader_admit */
    w = atomic_load_explicit(&msv_reader_at(c, a->reader)->state,
                             memory_order_acquire);
    if (w != MSV_STATE_WORD(a->pid, MSV_READER_ATTACHED)
        || atomic_load_explicit(&msv_reader_at(c, a->reader)->tail,
                                memory_order_relaxed) != wel.tail)
    {
        snprintf(err, errlen, "worker of /%s welcomed reader entry %u but did "
                 "not attach it", name, a->reader);
        goto failed;
    }

    if (msv_set_nonblock(a->conn_fd) != 0) {
        snprintf(err, errlen, "fcntl(O_NONBLOCK): %s", strerror(errno));
        goto failed;
    }

    msv_reader_heartbeat(a);
    msv_consumer_init(&a->cons, c, a->reader, wel.tail);
    return 0;

failed:

    msv_detach(a);
    return -1;
}


int
msv_attach(struct msv_attachment *a, const char *name, char *err,
    size_t errlen)
{
    int            rc;
    struct pollfd  pfd;

    if (msv_attach_start(a, name, err, errlen) != 0) {
        return -1;
    }

    pfd.fd = a->conn_fd;
    pfd.events = POLLIN;
    pfd.revents = 0;
    while (poll(&pfd, 1, MSV_ATTACH_TIMEOUT_MS) < 0 && errno == EINTR) {
        /* again */
    }

    rc = msv_attach_finish(a, err, errlen);
    if (rc == 1) {
        snprintf(err, errlen, "waiting for the welcome on %s: no answer "
                 "in %d ms", a->rg.ctrl->sock_path, MSV_ATTACH_TIMEOUT_MS);
        msv_detach(a);
        return -1;
    }
    return rc;
}


/* Our slots: free what we may, ask the worker to stop the rest. */
static void
msv_detach_slots(struct msv_attachment *a)
{
    uint32_t          i, st;
    uint64_t          w;
    struct msv_ctrl  *c = a->rg.ctrl;
    struct msv_slot  *s;

    for (i = 0; i < c->n_slots; i++) {
        s = msv_slot_at(c, i);
        w = atomic_load_explicit(&s->state, memory_order_acquire);
        st = MSV_STATE_OF(w);
        if (st == MSV_SLOT_FREE || MSV_PID_OF(w) != a->pid
            || s->reader != a->reader)
        {
            continue;
        }

        if (st == MSV_SLOT_SUBMITTED || st == MSV_SLOT_RUNNING) {
            atomic_store_explicit(&s->cancel, 1, memory_order_relaxed);
            continue;
        }

        /* CLAIMED, FINISHED, ABORTED: release, pairs with A-claim */
        atomic_compare_exchange_strong_explicit(&s->state, &w, 0,
            memory_order_release, memory_order_relaxed);
    }
}


void
msv_detach(struct msv_attachment *a)
{
    if (a->rg.ctrl != NULL && a->reader < a->rg.ctrl->n_readers) {
        msv_detach_slots(a);
        msv_release_entry(a->rg.ctrl, a->reader, a->pid);
    }
    a->reader = UINT32_MAX;

    if (a->conn_fd >= 0) {
        close(a->conn_fd);
        a->conn_fd = -1;
    }
    if (a->wake_fd >= 0) {
        close(a->wake_fd);
        a->wake_fd = -1;
    }
    if (a->kick_fd >= 0) {
        close(a->kick_fd);
        a->kick_fd = -1;
    }
    msv_region_unmap(&a->rg);
}


int
msv_attachment_check(struct msv_attachment *a)
{
    int               fd, replaced;
    char              b;
    ssize_t           n;
    uint64_t          now, hb, gen, stall;
    struct stat       now_st, our_st;
    struct msv_ctrl  *c = a->rg.ctrl;

    if (c == NULL || a->conn_fd < 0) {
        snprintf(a->lost, sizeof(a->lost), "not attached");
        return -1;
    }

    n = recv(a->conn_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0
        || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK
            && errno != EINTR))
    {
        snprintf(a->lost, sizeof(a->lost), "the worker closed its socket");
        return -1;
    }

    if (atomic_load_explicit(&a->cons.me->state, memory_order_relaxed)
        != a->cons.word)
    {
        snprintf(a->lost, sizeof(a->lost),
                 "the worker evicted this reader");
        return -1;
    }
    if (atomic_load_explicit(&c->state, memory_order_relaxed)
        == MSV_WORKER_STOPPED)
    {
        snprintf(a->lost, sizeof(a->lost), "the worker stopped");
        return -1;
    }
    if (!msv_pid_alive(c->worker_pid)) {
        snprintf(a->lost, sizeof(a->lost), "the worker (pid %d) is gone",
                 (int) c->worker_pid);
        return -1;
    }
    now = msv_now_ns();
    hb = atomic_load_explicit(&c->heartbeat_ns, memory_order_relaxed);
    stall = a->stall_ns ? a->stall_ns : MSV_HEARTBEAT_STALE_NS;
    if (now > hb && now - hb > stall) {
        snprintf(a->lost, sizeof(a->lost),
                 "no heartbeat from the worker (pid %d) for %.1f s, the "
                 "stall limit is %.1f s", (int) c->worker_pid,
                 (double) (now - hb) / 1e9, (double) stall / 1e9);
        return -1;
    }

    /*
     * The name may now hold a restarted worker's region: another object
     * (new inode), or none at all while it starts.
     */
    fd = shm_open(a->rg.name, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) {
        if (errno != ENOENT) {
            return 0;                       /* EMFILE and such: no verdict */
        }
        snprintf(a->lost, sizeof(a->lost), "the region was removed");
        return -1;
    }
    gen = 0;
    replaced = fstat(fd, &now_st) == 0 && fstat(a->rg.fd, &our_st) == 0
               && (now_st.st_ino != our_st.st_ino
                   || now_st.st_dev != our_st.st_dev);
    n = pread(fd, &gen, sizeof(gen), offsetof(struct msv_ctrl, generation));
    close(fd);

    if (replaced || (n == (ssize_t) sizeof(gen) && gen != a->generation)) {
        snprintf(a->lost, sizeof(a->lost),
                 "the worker was replaced by a new one");
        return -1;
    }
    return 0;
}


void
msv_reader_heartbeat(struct msv_attachment *a)
{
    if (a->rg.ctrl != NULL && a->reader < a->rg.ctrl->n_readers) {
        atomic_store_explicit(&msv_reader_at(a->rg.ctrl, a->reader)
                                  ->heartbeat_ns,
                              msv_now_ns(), memory_order_relaxed);
    }
}
