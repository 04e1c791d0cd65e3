/*
 * msv_region.h: create, open and map a worker's shared-memory region.
 */

#ifndef MSV_REGION_H
#define MSV_REGION_H

#include <stddef.h>
#include <stdint.h>

#include "msv_shm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the worker decides when it creates its region. */
struct msv_layout {
    uint32_t     n_slots;         /* max concurrent requests */
    uint32_t     n_readers;       /* <= MSV_MAX_READERS */
    uint32_t     vocab_size;
    uint32_t     max_model_len;
    uint32_t     max_logprobs;    /* <= MSV_MAX_LOGPROBS */
    uint32_t     n_eos;
    int32_t      eos_ids[MSV_MAX_EOS];
    uint64_t     ring_bytes;      /* power of two; checked against rows */
    const char  *model;
    const char  *backend;
    uint32_t     share_group;     /* 1: region and socket 0660, group gid */
    uint32_t     gid;             /* ... so that nginx's workers, running
                                     as another user in that group, can
                                     attach; 0 share_group: 0600 */
};

struct msv_region {
    struct msv_ctrl  *ctrl;
    size_t            bytes;
    int               fd;
    char              name[MSV_NAME_MAX + 2];  /* "/" + name */
};

/*
 * Worker: (re)create "/<name>" with mode 0600, lay it out, write a fresh
 * generation and the socket path, state MSV_WORKER_STARTING.  An existing
 * object of that name is unlinked first, so readers of an old worker keep
 * their old mapping and notice the new generation when they reopen.
 * Returns 0, or -1 with a one-line message in err.
 */
int msv_region_create(struct msv_region *rg, const char *name,
    const struct msv_layout *lay, char *err, size_t errlen);

/* Reader: map an existing region read-write and check magic, version,
 * sizes and offsets, and who owns it (msv_region_owner_check).  Returns 0,
 * or -1 with a message in err. */
int msv_region_open(struct msv_region *rg, const char *name, char *err,
    size_t errlen);

void msv_region_unmap(struct msv_region *rg);

/*
 * The checks a reader makes on the region behind fd (and on the socket
 * its control page names) before trusting either: no access for others
 * (mode & 007 == 0), and both owned by the user the worker process
 * (ctrl->worker_pid) runs as, so that a region or socket planted under
 * the name by another user is refused.  A worker that is gone is left to
 * the liveness checks.  Returns 0, or -1 with a message in err.
 */
int msv_region_owner_check(int fd, const struct msv_ctrl *c, char *err,
    size_t errlen);

/*
 * Worker: give the socket at path to group gid, mode 0660, the way
 * msv_region_create does for the region when lay->share_group is set.
 * Returns 0, or -1 with a message in err.
 */
int msv_sock_share(const char *path, uint32_t gid, char *err,
    size_t errlen);

/* Remove the shm object and its socket; 0 or -1 (errno set). */
int msv_region_unlink(const char *name);

/* Name checks shared by both sides: [A-Za-z0-9._-], 1..MSV_NAME_MAX. */
int msv_name_valid(const char *name);

/* The socket path for a region name: /dev/shm/<name>.sock */
void msv_sock_path(const char *name, char *out, size_t outlen);

uint64_t msv_now_ns(void);           /* CLOCK_MONOTONIC */
int msv_pid_alive(int32_t pid);      /* kill(pid, 0) says it exists */

#ifdef __cplusplus
}
#endif

#endif /* MSV_REGION_H */
