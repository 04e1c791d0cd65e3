/*
 * send_bench.c: what the kernel costs the sender of a response body on a
 * loopback TCP connection, copied (writev, as nginx sends the module's
 * buffers today) or referenced (sendfile from a memfd, the pages handed
 * to the socket instead of copied), and what fresh pages cost.
 *
 *   make B=build build/bench/send_bench
 *   build/bench/send_bench [body_kb [seconds [repeats]]]
 *
 * Every body (default 1400 KB: a non-streaming packed response of 128
 * support rows of 1000 ids) is written before it is sent, as the module
 * writes its text, then sent whole.  Methods:
 *
 *   writev           into memory reused for every body, sent with writev
 *                    of 16 KB pieces, 64 a call (the module's block cache
 *                    and nginx's ngx_writev)
 *   writev-fresh     into anonymous pages mapped for the body and
 *                    unmapped after it (memory malloc gave back to the
 *                    kernel and takes again)
 *   memfd-alone      into a memfd made, mapped and closed for the body,
 *                    not sent: the fresh pages alone
 *   sendfile-fresh   the same memfd sent with sendfile: the only safe way
 *                    to send without copying, since the socket keeps
 *                    referencing the pages after sendfile returns (on
 *                    loopback even after the peer acknowledged them, until
 *                    its reader copied them out), so that a page must
 *                    never be written again once sent
 *   sendfile-reused  one memfd for every body, rewritten each time: the
 *                    floor of sending by reference, and not safe; the
 *                    bodies that arrived changed are counted
 *
 *   writev-thp       into anonymous memory mapped for the body in 2 MB
 *                    huge pages (madvise MADV_HUGEPAGE, where transparent
 *                    huge pages are on), sent with writev, unmapped after
 *                    it: what a fresh huge page costs
 *   vmsplice-fresh   into fresh 4 KB anonymous pages handed to a pipe by
 *                    vmsplice (referenced, not copied), then to the
 *                    socket by splice, unmapped after it: safe, since a
 *                    page the socket still references outlives the
 *                    mapping and is never written again
 *   vmsplice-thp     the same from fresh 2 MB pages (one fault a body)
 *
 * Each method has its own connection, drained by a child process that
 * checks every byte of every body (body k holds (i + k) mod 256 at i).
 * Times are the sending thread's user + system CPU time (getrusage),
 * writing and sending, per body: the median of `repeats` (default 5)
 * measurements of as many bodies as fit in `seconds` (default 0.5),
 * with the page faults per body.
 */

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>

#include "loopback.h"


#define PIECE        16384          /* NGX_HTTP_MASKSERVE_BODY_BUF */
#define IOVS         64             /* NGX_IOVS_PREALLOCATE */
#define MAX_REPEATS  64
#define HUGE_PAGE    (2u << 20)
#define PIPE_BYTES   (1u << 20)     /* the pipe of the vmsplice methods */

typedef enum {
    M_WRITEV, M_WRITEV_FRESH, M_MEMFD_ALONE, M_SENDFILE_FRESH,
    M_SENDFILE_REUSED, M_WRITEV_THP, M_VMSPLICE_FRESH, M_VMSPLICE_THP, M_N
} method_t;

static const char  *method_name[M_N] = {
    "writev", "writev-fresh", "memfd-alone", "sendfile-fresh",
    "sendfile-reused", "writev-thp", "vmsplice-fresh", "vmsplice-thp"
};

typedef struct {
    int       fd;                   /* the sending socket, -1: none */
    pid_t     child;
    int       verdict;              /* pipe: the child's count of bad bodies */
    size_t    body;
    uint64_t  k;                    /* bodies written */
    char     *reused;               /* M_WRITEV's memory */
    int       memfd;                /* M_SENDFILE_REUSED's */
    char     *map;
} conn_t;

static char    *pattern;            /* (i mod 256), body + 256 bytes */
static int      splice_pipe[2];


static void
die(const char *what)
{
    perror(what);
    exit(1);
}


static double
thread_cpu(long *faults)
{
    struct rusage  u;

    getrusage(RUSAGE_THREAD, &u);
    *faults = u.ru_minflt;

    return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6
           + u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6;
}


/* Read bodies of `body` bytes until EOF; exit with how many differed. */

static void
drain(int fd, size_t body, int verdict)
{
    char      *b;
    size_t     i, len;
    ssize_t    n;
    uint64_t   k, bad, at, wrong;

    b = malloc(1 << 20);
    if (b == NULL) {
        _exit(2);
    }

    k = 0;
    at = 0;
    bad = 0;
    wrong = 0;

    while ((n = read(fd, b, 1 << 20)) > 0) {
        for (i = 0; i < (size_t) n; i += len) {
            /* as far as the body's end: byte at of body k is at + k */
            len = body - at < (size_t) n - i ? body - at : (size_t) n - i;

            if (memcmp(b + i, pattern + (at + k) % 256, len) != 0) {
                wrong = 1;
            }

            at += len;

            if (at == body) {
                bad += wrong;
                wrong = 0;
                at = 0;
                k++;
            }
        }
    }

    if (write(verdict, &bad, sizeof(bad)) != sizeof(bad)) {
        _exit(2);
    }

    _exit(0);
}


static void
conn_open(conn_t *c, size_t body)
{
    int                 ls, fd, p[2];
    struct sockaddr_in  a;

    memset(c, 0, sizeof(*c));
    c->body = body;
    c->memfd = -1;

    ls = msv_loopback_listen(&a);
    if (ls < 0 || pipe(p) != 0) {
        die("send_bench: loopback listener");
    }

    c->child = fork();
    if (c->child < 0) {
        die("send_bench: fork");
    }

    if (c->child == 0) {
        close(ls);
        close(p[0]);
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *) &a, sizeof(a)) != 0) {
            _exit(2);
        }
        drain(fd, body, p[1]);
    }

    close(p[1]);
    c->verdict = p[0];

    c->fd = accept(ls, NULL, NULL);
    if (c->fd < 0) {
        die("send_bench: accept");
    }

    close(ls);
}


/* The bodies that arrived changed, once the child has read them all. */

static uint64_t
conn_close(conn_t *c)
{
    int       status;
    uint64_t  bad;

    close(c->fd);

    if (read(c->verdict, &bad, sizeof(bad)) != sizeof(bad)
        || waitpid(c->child, &status, 0) != c->child
        || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    {
        fprintf(stderr, "send_bench: the reader failed\n");
        exit(1);
    }

    close(c->verdict);

    return bad;
}


static void
send_writev(conn_t *c, const char *b)
{
    int           n;
    size_t        off, o, len;
    ssize_t       sent;
    struct iovec  iov[IOVS];

    /* the body's 16 KB pieces from off, the first what is left of one */
    for (off = 0; off < c->body; off += (size_t) sent) {
        for (n = 0, o = off; n < IOVS && o < c->body; n++, o += len) {
            len = PIECE - o % PIECE;
            len = len < c->body - o ? len : c->body - o;
            iov[n].iov_base = (char *) b + o;
            iov[n].iov_len = len;
        }

        sent = writev(c->fd, iov, n);
        if (sent <= 0) {
            die("send_bench: writev");
        }
    }
}


static void
send_file(conn_t *c, int fd)
{
    off_t    off;
    ssize_t  n;

    for (off = 0; (size_t) off < c->body; /* void */) {
        n = sendfile(c->fd, fd, &off, c->body - (size_t) off);
        if (n <= 0) {
            die("send_bench: sendfile");
        }
    }
}


/* A memfd of the body's size, mapped; its fd in *fd. */

static char *
memfd_map(size_t body, int *fd)
{
    char  *m;

    *fd = memfd_create("send_bench", MFD_CLOEXEC);
    if (*fd < 0 || ftruncate(*fd, (off_t) body) != 0) {
        die("send_bench: memfd");
    }

    m = mmap(NULL, body, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
    if (m == MAP_FAILED) {
        die("send_bench: mmap");
    }

    return m;
}


/*
 * Fresh anonymous memory for a body, 2 MB aligned, in huge pages when
 * huge (MADV_HUGEPAGE); its mapped length in *len.
 */
static char *
anon_map(size_t body, int huge, size_t *len)
{
    char    *m, *a;
    size_t   l;

    l = (body + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    m = mmap(NULL, l + HUGE_PAGE, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        die("send_bench: mmap");
    }

    /* keep the aligned l bytes, give back the rest */
    a = (char *) (((uintptr_t) m + HUGE_PAGE - 1)
                  & ~(uintptr_t) (HUGE_PAGE - 1));
    if (a > m) {
        munmap(m, (size_t) (a - m));
    }
    munmap(a + l, (size_t) (m + l + HUGE_PAGE - (a + l)));

    if (huge && madvise(a, l, MADV_HUGEPAGE) != 0) {
        die("send_bench: madvise (transparent huge pages off?)");
    }

    *len = l;
    return a;
}


/* The body's pages into the pipe (vmsplice), then into the socket. */

static void
send_splice(conn_t *c, char *b)
{
    size_t        off, left;
    ssize_t       n, s;
    struct iovec  v;

    for (off = 0; off < c->body; off += (size_t) n) {
        v.iov_base = b + off;
        v.iov_len = c->body - off < PIPE_BYTES ? c->body - off : PIPE_BYTES;

        n = vmsplice(splice_pipe[1], &v, 1, 0);
        if (n <= 0) {
            die("send_bench: vmsplice");
        }

        for (left = (size_t) n; left > 0; left -= (size_t) s) {
            s = splice(splice_pipe[0], NULL, c->fd, NULL, left,
                       SPLICE_F_MOVE | SPLICE_F_MORE);
            if (s <= 0) {
                die("send_bench: splice");
            }
        }
    }
}


/* Write body c->k and send it the method's way. */

static void
one_body(conn_t *c, method_t m)
{
    int     fd;
    char   *b;
    size_t  len;

    switch (m) {

    case M_WRITEV:
        memcpy(c->reused, pattern + c->k % 256, c->body);
        send_writev(c, c->reused);
        break;

    case M_WRITEV_FRESH:
        b = mmap(NULL, c->body, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (b == MAP_FAILED) {
            die("send_bench: mmap");
        }
        memcpy(b, pattern + c->k % 256, c->body);
        send_writev(c, b);
        munmap(b, c->body);
        break;

    case M_MEMFD_ALONE:
    case M_SENDFILE_FRESH:
        b = memfd_map(c->body, &fd);
        memcpy(b, pattern + c->k % 256, c->body);
        if (m == M_SENDFILE_FRESH) {
            send_file(c, fd);
        }
        munmap(b, c->body);
        close(fd);
        break;

    case M_WRITEV_THP:
    case M_VMSPLICE_FRESH:
    case M_VMSPLICE_THP:
        b = anon_map(c->body, m != M_VMSPLICE_FRESH, &len);
        memcpy(b, pattern + c->k % 256, c->body);
        if (m == M_WRITEV_THP) {
            send_writev(c, b);
        } else {
            send_splice(c, b);
        }
        munmap(b, len);
        break;

    default: /* M_SENDFILE_REUSED */
        memcpy(c->map, pattern + c->k % 256, c->body);
        send_file(c, c->memfd);
        break;
    }

    c->k++;
}


static int
cmp_double(const void *a, const void *b)
{
    double  x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : x > y;
}


int
main(int argc, char **argv)
{
    int       repeats, r;
    long      f0, f1, n;
    size_t    body, i;
    double    seconds, t0, t, s[MAX_REPEATS], faults[MAX_REPEATS], ms[M_N],
              pf[M_N];
    conn_t    c;
    method_t  m;
    uint64_t  bad[M_N];

    body = (argc > 1 ? (size_t) atol(argv[1]) : 1400) * 1024;
    seconds = argc > 2 ? atof(argv[2]) : 0.5;
    repeats = argc > 3 ? atoi(argv[3]) : 5;

    if (body == 0 || seconds <= 0 || repeats < 1 || repeats > MAX_REPEATS) {
        fprintf(stderr, "usage: %s [body_kb [seconds [repeats (1-%d)]]]\n",
                argv[0], MAX_REPEATS);
        return 2;
    }

    if (pipe(splice_pipe) != 0
        || fcntl(splice_pipe[1], F_SETPIPE_SZ, (int) PIPE_BYTES) < 0)
    {
        die("send_bench: the vmsplice methods' pipe");
    }

    pattern = malloc(body + 256);
    if (pattern == NULL) {
        die("send_bench: malloc");
    }

    for (i = 0; i < body + 256; i++) {
        pattern[i] = (char) i;
    }

    for (m = 0; m < M_N; m++) {
        conn_open(&c, body);

        if (m == M_WRITEV) {
            c.reused = malloc(body);
            if (c.reused == NULL) {
                die("send_bench: malloc");
            }
        }

        if (m == M_SENDFILE_REUSED) {
            c.map = memfd_map(body, &c.memfd);
        }

        one_body(&c, m);                    /* warm-up */

        for (r = 0; r < repeats; r++) {
            n = 0;
            t0 = thread_cpu(&f0);
            do {
                one_body(&c, m);
                n++;
                t = thread_cpu(&f1) - t0;
            } while (t < seconds || n < 8);

            s[r] = t / n;
            faults[r] = (double) (f1 - f0) / n;
        }

        bad[m] = conn_close(&c);

        qsort(s, repeats, sizeof(double), cmp_double);
        qsort(faults, repeats, sizeof(double), cmp_double);
        ms[m] = s[repeats / 2] * 1e3;
        pf[m] = faults[repeats / 2];

        free(c.reused);
        if (c.map) {
            munmap(c.map, body);
            close(c.memfd);
        }

        if (m != M_SENDFILE_REUSED && bad[m]) {
            fprintf(stderr, "send_bench: %s: %llu bodies arrived changed\n",
                    method_name[m], (unsigned long long) bad[m]);
            return 1;
        }
    }

    printf("body %zu KB, median of %d x %.2f s of the sender's CPU time\n\n",
           body / 1024, repeats, seconds);
    printf("| method | ms per body | us per 4 KB page | page faults per body "
           "| vs writev | bodies that arrived changed |\n");
    printf("|---|---:|---:|---:|---:|---:|\n");

    for (m = 0; m < M_N; m++) {
        printf("| %s | %.3f | %.2f | %.0f | %.2f | %llu |\n", method_name[m],
               ms[m], ms[m] * 1e3 / ((double) body / 4096), pf[m],
               ms[m] / ms[M_WRITEV], (unsigned long long) bad[m]);
    }

    return 0;
}
