/*
 * loopback.h: a TCP listener on 127.0.0.1 at a free port, for the
 * benchmarks that send to a reader process of their own (packed_bench,
 * send_bench).  Header-only.
 */

#ifndef MSV_BENCH_LOOPBACK_H
#define MSV_BENCH_LOOPBACK_H

#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>


/* The listening socket, its address in *a; -1 on failure (errno). */

static int
msv_loopback_listen(struct sockaddr_in *a)
{
    int        ls;
    socklen_t  sl;

    ls = socket(AF_INET, SOCK_STREAM, 0);
    memset(a, 0, sizeof(*a));
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sl = sizeof(*a);

    if (ls < 0 || bind(ls, (struct sockaddr *) a, sizeof(*a)) != 0
        || getsockname(ls, (struct sockaddr *) a, &sl) != 0
        || listen(ls, 1) != 0)
    {
        if (ls >= 0) {
            close(ls);
        }

        return -1;
    }

    return ls;
}


#endif /* MSV_BENCH_LOOPBACK_H */
