/*
 * msv_region.c: create, open, validate and map a worker's shared-memory
 * region (layout in msv_shm.h, protocol in shm/README.md).
 */

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "msv_region.h"


#define MSV_ROUND(x, a)   (((x) + (a) - 1) & ~((uint64_t) (a) - 1))
#define MSV_PAGE_MIN      4096


static uint64_t msv_page_size(void);
static uint64_t msv_pow2_at_least(uint64_t x);
static int msv_str_fits(const char *s, size_t size);
static uint64_t msv_new_generation(uint64_t old);
static uint64_t msv_old_generation(const char *shm_name);
static void msv_copy_tail(char *dst, size_t size, const char *src);
static int msv_layout_check(const char *name, const struct msv_layout *lay,
    char *err, size_t errlen);
static int msv_ctrl_check(const struct msv_ctrl *c, const char *name,
    uint64_t size, char *err, size_t errlen);


int
msv_name_valid(const char *name)
{
    size_t  i, n;

    if (name == NULL) {
        return 0;
    }

    n = strlen(name);
    if (n == 0 || n > MSV_NAME_MAX || strcmp(name, ".") == 0
        || strcmp(name, "..") == 0)
    {
        return 0;
    }

    for (i = 0; i < n; i++) {
        char  ch = name[i];

        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')
              || (ch >= '0' && ch <= '9') || ch == '.' || ch == '_'
              || ch == '-'))
        {
            return 0;
        }
    }

    return 1;
}


void
msv_sock_path(const char *name, char *out, size_t outlen)
{
    snprintf(out, outlen, "/dev/shm/%s.sock", name);
}


uint64_t
msv_now_ns(void)
{
    struct timespec  ts;

    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) {
        return 0;
    }
    return (uint64_t) ts.tv_sec * 1000000000ULL + (uint64_t) ts.tv_nsec;
}


int
msv_pid_alive(int32_t pid)
{
    if (pid <= 0) {
        return 0;
    }
    /* EPERM: it exists but belongs to someone else, still alive */
    return kill((pid_t) pid, 0) == 0 || errno == EPERM;
}


static uint64_t
msv_page_size(void)
{
    long  n = sysconf(_SC_PAGESIZE);

    return n >= MSV_PAGE_MIN ? (uint64_t) n : MSV_PAGE_MIN;
}


static uint64_t
msv_pow2_at_least(uint64_t x)
{
    uint64_t  p = 1;

    while (p < x) {
        p <<= 1;
    }
    return p;
}


/* s is NUL-terminated within size bytes */
static int
msv_str_fits(const char *s, size_t size)
{
    return memchr(s, '\0', size) != NULL;
}


/* Copy src, keeping its end when it is too long ("...tail"). */
static void
msv_copy_tail(char *dst, size_t size, const char *src)
{
    size_t  n = strlen(src);

    if (n < size) {
        memcpy(dst, src, n + 1);
        return;
    }
    memcpy(dst, "...", 3);
    memcpy(dst + 3, src + n - (size - 4), size - 4);
    dst[size - 1] = '\0';
}


/* The generation of a region still linked under this name, or 0. */
static uint64_t
msv_old_generation(const char *shm_name)
{
    int       fd;
    uint64_t  gen = 0;

    fd = shm_open(shm_name, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) {
        return 0;
    }
    if (pread(fd, &gen, sizeof(gen), offsetof(struct msv_ctrl, generation))
        != (ssize_t) sizeof(gen))
    {
        gen = 0;
    }
    close(fd);
    return gen;
}


/* A fresh random generation, never 0 and never the previous one. */
static uint64_t
msv_new_generation(uint64_t old)
{
    uint64_t  g = 0;

    if (getrandom(&g, sizeof(g), GRND_NONBLOCK) != (ssize_t) sizeof(g)) {
        /* no entropy yet: time and pid still differ across starts */
        g = msv_now_ns() * 0x9e3779b97f4a7c15ULL ^ (uint64_t) getpid() << 32;
    }
    while (g == 0 || g == old) {
        g = g * 6364136223846793005ULL + 1442695040888963407ULL;
    }
    return g;
}


static int
msv_layout_check(const char *name, const struct msv_layout *lay, char *err,
    size_t errlen)
{
    uint64_t  row, need;

    if (!msv_name_valid(name)) {
        snprintf(err, errlen, "shm name \"%s\": use 1..%d of [A-Za-z0-9._-]",
                 name != NULL ? name : "(null)", MSV_NAME_MAX);
        return -1;
    }
    if (lay->n_slots == 0 || lay->n_slots > 65536) {
        snprintf(err, errlen, "region /%s: n_slots %u not in 1..65536",
                 name, lay->n_slots);
        return -1;
    }
    if (lay->n_readers == 0 || lay->n_readers > MSV_MAX_READERS) {
        snprintf(err, errlen, "region /%s: n_readers %u not in 1..%d",
                 name, lay->n_readers, MSV_MAX_READERS);
        return -1;
    }
    if (lay->vocab_size == 0 || lay->vocab_size > (1u << 26)) {
        snprintf(err, errlen, "region /%s: vocab_size %u not in 1..%u",
                 name, lay->vocab_size, 1u << 26);
        return -1;
    }
    if (lay->max_model_len == 0 || lay->max_model_len > (1u << 24)) {
        snprintf(err, errlen, "region /%s: max_model_len %u not in 1..%u",
                 name, lay->max_model_len, 1u << 24);
        return -1;
    }
    if (lay->max_logprobs > MSV_MAX_LOGPROBS) {
        snprintf(err, errlen, "region /%s: max_logprobs %u above %d",
                 name, lay->max_logprobs, MSV_MAX_LOGPROBS);
        return -1;
    }
    if (lay->n_eos > MSV_MAX_EOS) {
        snprintf(err, errlen, "region /%s: n_eos %u above %d",
                 name, lay->n_eos, MSV_MAX_EOS);
        return -1;
    }
    if (lay->backend == NULL || strlen(lay->backend) >= 16) {
        snprintf(err, errlen, "region /%s: backend name missing or longer "
                 "than 15 bytes", name);
        return -1;
    }

    if (lay->ring_bytes < MSV_PAGE_MIN
        || (lay->ring_bytes & (lay->ring_bytes - 1)) != 0
        || lay->ring_bytes > (1ULL << 40))
    {
        snprintf(err, errlen, "region /%s: --ring-bytes %llu must be a power "
                 "of two in %d..2^40", name,
                 (unsigned long long) lay->ring_bytes, MSV_PAGE_MIN);
        return -1;
    }

    /* the largest row: whole vocabulary in support mode, every logprob */
    row = msv_row_size(lay->vocab_size, lay->vocab_size, lay->max_logprobs);
    need = sizeof(struct msv_rec) + row;
    if (lay->ring_bytes / 2 < need) {
        snprintf(err, errlen, "region /%s: --ring-bytes %llu too small: one "
                 "row can take %llu bytes (vocab %u, max_logprobs %u), so "
                 "--ring-bytes must be at least %llu", name,
                 (unsigned long long) lay->ring_bytes,
                 (unsigned long long) row, lay->vocab_size, lay->max_logprobs,
                 (unsigned long long) msv_pow2_at_least(2 * need));
        return -1;
    }

    return 0;
}


int
msv_region_create(struct msv_region *rg, const char *name,
    const struct msv_layout *lay, char *err, size_t errlen)
{
    int               fd;
    void             *base;
    uint32_t          i;
    uint64_t          slot_hdr, prompt, bias, slot_bytes, readers_off;
    uint64_t          slots_off, ring_off, total, old_gen;
    struct msv_ctrl  *c;

    memset(rg, 0, sizeof(*rg));
    rg->fd = -1;

    if (msv_layout_check(name, lay, err, errlen) != 0) {
        return -1;
    }

    slot_hdr = MSV_ROUND(sizeof(struct msv_slot), MSV_CACHELINE);
    prompt = MSV_ROUND((uint64_t) lay->max_model_len * 4, MSV_CACHELINE);
    bias = MSV_ROUND((uint64_t) MSV_MAX_BIAS * sizeof(struct msv_bias),
                     MSV_CACHELINE);
    slot_bytes = slot_hdr + prompt + bias;
    if (slot_bytes > UINT32_MAX) {
        snprintf(err, errlen, "region /%s: max_model_len %u makes a slot "
                 "larger than 4 GiB", name, lay->max_model_len);
        return -1;
    }

    readers_off = MSV_ROUND(sizeof(struct msv_ctrl), MSV_CACHELINE);
    slots_off = readers_off
                + (uint64_t) lay->n_readers * sizeof(struct msv_reader);
    ring_off = MSV_ROUND(slots_off + (uint64_t) lay->n_slots * slot_bytes,
                         msv_page_size());
    total = ring_off + lay->ring_bytes;

    snprintf(rg->name, sizeof(rg->name), "/%s", name);

    /*
     * A restarted worker gets a new object (new inode): readers of the old
     * one keep their mapping and notice the new generation on reopen.
     */
    old_gen = msv_old_generation(rg->name);
    if (shm_unlink(rg->name) != 0 && errno != ENOENT) {
        snprintf(err, errlen, "shm_unlink(%s): %s", rg->name,
                 strerror(errno));
        return -1;
    }

    fd = shm_open(rg->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "shm_open(%s): %s", rg->name, strerror(errno));
        return -1;
    }
    /*
     * The umask may have taken bits away; 0600 is the contract, or 0660
     * for the group nginx's workers run in (the group first, so that the
     * object is never open to a group it was not meant for).
     */
    if (lay->share_group && fchown(fd, (uid_t) -1, (gid_t) lay->gid) != 0) {
        snprintf(err, errlen, "fchown(%s, group %u): %s", rg->name,
                 lay->gid, strerror(errno));
        goto failed;
    }
    if (fchmod(fd, lay->share_group ? 0660 : 0600) != 0) {
        snprintf(err, errlen, "fchmod(%s): %s", rg->name, strerror(errno));
        goto failed;
    }
    if (ftruncate(fd, (off_t) total) != 0) {
        snprintf(err, errlen, "ftruncate(%s, %llu): %s", rg->name,
                 (unsigned long long) total, strerror(errno));
        goto failed;
    }

    base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        snprintf(err, errlen, "mmap(%s, %llu): %s", rg->name,
                 (unsigned long long) total, strerror(errno));
        goto failed;
    }

    /* ftruncate zero-filled everything: entries FREE, slots FREE, head 0 */
    c = base;
    c->version = MSV_LAYOUT_VERSION;
    c->ctrl_bytes = sizeof(struct msv_ctrl);
    c->region_bytes = total;
    c->generation = msv_new_generation(old_gen);
    c->worker_pid = (int32_t) getpid();

    c->readers_off = readers_off;
    c->n_readers = lay->n_readers;
    c->n_slots = lay->n_slots;
    c->slots_off = slots_off;
    c->slot_bytes = (uint32_t) slot_bytes;
    c->slot_prompt_off = (uint32_t) slot_hdr;
    c->slot_bias_off = (uint32_t) (slot_hdr + prompt);
    c->ring_off = ring_off;
    c->ring_bytes = lay->ring_bytes;
    c->max_row_bytes = msv_row_size(lay->vocab_size, lay->vocab_size,
                                    lay->max_logprobs);
    c->max_rec_bytes = (uint32_t) (lay->ring_bytes / 2 > UINT32_MAX
                                   ? 0x80000000u : lay->ring_bytes / 2);

    c->vocab_size = lay->vocab_size;
    c->max_model_len = lay->max_model_len;
    c->max_logprobs = lay->max_logprobs;
    c->n_eos = lay->n_eos;
    for (i = 0; i < lay->n_eos; i++) {
        c->eos_ids[i] = lay->eos_ids[i];
    }
    msv_copy_tail(c->model, sizeof(c->model),
                  lay->model != NULL ? lay->model : "");
    snprintf(c->backend, sizeof(c->backend), "%s", lay->backend);
    msv_sock_path(name, c->sock_path, sizeof(c->sock_path));
    snprintf(c->name, sizeof(c->name), "%s", name);

    atomic_store_explicit(&c->heartbeat_ns, msv_now_ns(),
                          memory_order_relaxed);
    atomic_store_explicit(&c->state, MSV_WORKER_STARTING,
                          memory_order_relaxed);

    /*
     * R-magic: release; pairs with A-magic in msv_region_open.  A reader
     * that maps the object while it is being laid out sees magic 0 and
     * refuses it; one that sees MSV_MAGIC sees every field above.
     */
    __atomic_store_n(&c->magic, MSV_MAGIC, __ATOMIC_RELEASE);

    rg->ctrl = c;
    rg->bytes = total;
    rg->fd = fd;
    return 0;

failed:

    close(fd);
    shm_unlink(rg->name);
    return -1;
}


static int
msv_ctrl_check(const struct msv_ctrl *c, const char *name, uint64_t size,
    char *err, size_t errlen)
{
    uint64_t  magic, readers_end, slots_end, slot_min, prompt_end;

    /* A-magic: acquire, pairs with R-magic in msv_region_create */
    magic = __atomic_load_n(&c->magic, __ATOMIC_ACQUIRE);
    if (magic == 0) {
        snprintf(err, errlen, "region /%s: magic is 0: the worker is still "
                 "laying it out, or it is not a maskserve region", name);
        return -1;
    }
    if (magic != MSV_MAGIC) {
        snprintf(err, errlen, "region /%s: bad magic %016llx, not a maskserve "
                 "region", name, (unsigned long long) magic);
        return -1;
    }
    if (c->version != MSV_LAYOUT_VERSION) {
        snprintf(err, errlen, "region /%s: layout version %u, this build "
                 "speaks %d", name, c->version, MSV_LAYOUT_VERSION);
        return -1;
    }
    if (c->ctrl_bytes != sizeof(struct msv_ctrl)) {
        snprintf(err, errlen, "region /%s: ctrl_bytes %u, this build expects "
                 "%zu", name, c->ctrl_bytes, sizeof(struct msv_ctrl));
        return -1;
    }
    if (c->region_bytes != size) {
        snprintf(err, errlen, "region /%s: region_bytes %llu but the object "
                 "has %llu bytes", name, (unsigned long long) c->region_bytes,
                 (unsigned long long) size);
        return -1;
    }
    if (c->n_readers == 0 || c->n_readers > MSV_MAX_READERS) {
        snprintf(err, errlen, "region /%s: n_readers %u not in 1..%d", name,
                 c->n_readers, MSV_MAX_READERS);
        return -1;
    }
    if (c->n_slots == 0) {
        snprintf(err, errlen, "region /%s: n_slots is 0", name);
        return -1;
    }
    if (c->readers_off < c->ctrl_bytes || c->readers_off % MSV_CACHELINE
        || c->readers_off > size)
    {
        snprintf(err, errlen, "region /%s: readers_off %llu out of range",
                 name, (unsigned long long) c->readers_off);
        return -1;
    }
    readers_end = c->readers_off
                  + (uint64_t) c->n_readers * sizeof(struct msv_reader);
    if (c->slots_off < readers_end || c->slots_off % MSV_CACHELINE
        || c->slots_off > size)
    {
        snprintf(err, errlen, "region /%s: slots_off %llu out of range",
                 name, (unsigned long long) c->slots_off);
        return -1;
    }

    slot_min = MSV_ROUND(sizeof(struct msv_slot), MSV_CACHELINE);
    prompt_end = (uint64_t) c->slot_prompt_off + (uint64_t) c->max_model_len
                 * 4;
    if (c->slot_bytes % MSV_CACHELINE || c->slot_bytes < slot_min
        || c->slot_prompt_off < sizeof(struct msv_slot)
        || c->slot_prompt_off % MSV_CACHELINE
        || c->slot_bias_off < prompt_end || c->slot_bias_off % MSV_CACHELINE
        || (uint64_t) c->slot_bias_off + MSV_MAX_BIAS
           * sizeof(struct msv_bias) > c->slot_bytes)
    {
        snprintf(err, errlen, "region /%s: slot layout (slot_bytes %u, "
                 "prompt at %u, bias at %u, max_model_len %u) inconsistent",
                 name, c->slot_bytes, c->slot_prompt_off, c->slot_bias_off,
                 c->max_model_len);
        return -1;
    }

    slots_end = c->slots_off + (uint64_t) c->n_slots * c->slot_bytes;
    if (c->ring_off < slots_end || c->ring_off % msv_page_size()
        || c->ring_off > size)
    {
        snprintf(err, errlen, "region /%s: ring_off %llu out of range or not "
                 "page aligned", name, (unsigned long long) c->ring_off);
        return -1;
    }
    if (c->ring_bytes < MSV_PAGE_MIN
        || (c->ring_bytes & (c->ring_bytes - 1)) != 0)
    {
        snprintf(err, errlen, "region /%s: ring_bytes %llu is not a power of "
                 "two >= %d", name, (unsigned long long) c->ring_bytes,
                 MSV_PAGE_MIN);
        return -1;
    }
    if (c->ring_off + c->ring_bytes != size) {
        snprintf(err, errlen, "region /%s: ring (%llu + %llu) does not end "
                 "at the region's end (%llu)", name,
                 (unsigned long long) c->ring_off,
                 (unsigned long long) c->ring_bytes,
                 (unsigned long long) size);
        return -1;
    }
    if (c->max_rec_bytes % MSV_REC_ALIGN
        || c->max_rec_bytes > c->ring_bytes / 2
        || c->max_row_bytes % MSV_ROW_ALIGN
        || c->max_row_bytes < sizeof(struct msv_row)
        || (uint64_t) c->max_row_bytes + sizeof(struct msv_rec)
           > c->max_rec_bytes)
    {
        snprintf(err, errlen, "region /%s: max_row_bytes %u / max_rec_bytes "
                 "%u do not fit ring_bytes %llu", name, c->max_row_bytes,
                 c->max_rec_bytes, (unsigned long long) c->ring_bytes);
        return -1;
    }
    if (c->vocab_size == 0 || c->max_model_len == 0
        || c->max_logprobs > MSV_MAX_LOGPROBS || c->n_eos > MSV_MAX_EOS)
    {
        snprintf(err, errlen, "region /%s: model facts out of range (vocab "
                 "%u, max_model_len %u, max_logprobs %u, n_eos %u)", name,
                 c->vocab_size, c->max_model_len, c->max_logprobs, c->n_eos);
        return -1;
    }
    if (!msv_str_fits(c->model, sizeof(c->model))
        || !msv_str_fits(c->backend, sizeof(c->backend))
        || !msv_str_fits(c->sock_path, sizeof(c->sock_path))
        || !msv_str_fits(c->name, sizeof(c->name)))
    {
        snprintf(err, errlen, "region /%s: a string field of the control "
                 "page is not NUL-terminated", name);
        return -1;
    }
    if (strcmp(c->name, name) != 0) {
        snprintf(err, errlen, "region /%s: control page names \"%s\"", name,
                 c->name);
        return -1;
    }

    return 0;
}


int
msv_region_open(struct msv_region *rg, const char *name, char *err,
    size_t errlen)
{
    int          fd;
    void        *base;
    struct stat  st;

    memset(rg, 0, sizeof(*rg));
    rg->fd = -1;

    if (!msv_name_valid(name)) {
        snprintf(err, errlen, "shm name \"%s\": use 1..%d of [A-Za-z0-9._-]",
                 name != NULL ? name : "(null)", MSV_NAME_MAX);
        return -1;
    }
    snprintf(rg->name, sizeof(rg->name), "/%s", name);

    fd = shm_open(rg->name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "shm_open(%s): %s%s", rg->name, strerror(errno),
                 errno == ENOENT ? " (no worker serves this name)" : "");
        return -1;
    }
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "fstat(%s): %s", rg->name, strerror(errno));
        close(fd);
        return -1;
    }
    if ((uint64_t) st.st_size < sizeof(struct msv_ctrl)) {
        snprintf(err, errlen, "region %s: %lld bytes, smaller than its "
                 "control page (%zu): not laid out yet, or not a maskserve "
                 "region", rg->name, (long long) st.st_size,
                 sizeof(struct msv_ctrl));
        close(fd);
        return -1;
    }

    base = mmap(NULL, (size_t) st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED,
                fd, 0);
    if (base == MAP_FAILED) {
        snprintf(err, errlen, "mmap(%s): %s", rg->name, strerror(errno));
        close(fd);
        return -1;
    }

    if (msv_ctrl_check(base, name, (uint64_t) st.st_size, err, errlen) != 0
        || msv_region_owner_check(fd, base, err, errlen) != 0)
    {
        munmap(base, (size_t) st.st_size);
        close(fd);
        return -1;
    }

    rg->ctrl = base;
    rg->bytes = (size_t) st.st_size;
    rg->fd = fd;
    return 0;
}


int
msv_region_owner_check(int fd, const struct msv_ctrl *c, char *err,
    size_t errlen)
{
    char         proc[32], sock[MSV_SOCK_PATH_MAX];
    struct stat  st, ps, ss;

    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "fstat(region %s): %s", c->name,
                 strerror(errno));
        return -1;
    }
    if (st.st_mode & 0007) {
        snprintf(err, errlen, "region %s: mode %04o gives other users "
                 "access: refused (the worker makes it 0600, or 0660 with "
                 "--group)", c->name, (unsigned) (st.st_mode & 07777));
        return -1;
    }

    snprintf(proc, sizeof(proc), "/proc/%d", (int) c->worker_pid);
    if (c->worker_pid <= 0 || stat(proc, &ps) != 0) {
        return 0;       /* no such process: the liveness checks decide */
    }
    if (ps.st_uid != st.st_uid) {
        snprintf(err, errlen, "region %s: owned by uid %u, but its worker "
                 "(pid %d) runs as uid %u: refused", c->name,
                 (unsigned) st.st_uid, (int) c->worker_pid,
                 (unsigned) ps.st_uid);
        return -1;
    }

    memcpy(sock, c->sock_path, sizeof(sock));
    sock[sizeof(sock) - 1] = '\0';
    if (sock[0] != '\0' && lstat(sock, &ss) == 0
        && (ss.st_uid != st.st_uid || (ss.st_mode & 0007)))
    {
        snprintf(err, errlen, "socket %s: owner uid %u mode %04o, the "
                 "region's owner is uid %u: refused", sock,
                 (unsigned) ss.st_uid, (unsigned) (ss.st_mode & 07777),
                 (unsigned) st.st_uid);
        return -1;
    }

    return 0;
}


int
msv_sock_share(const char *path, uint32_t gid, char *err, size_t errlen)
{
    if (chown(path, (uid_t) -1, (gid_t) gid) != 0) {
        snprintf(err, errlen, "chown(%s, group %u): %s", path, gid,
                 strerror(errno));
        return -1;
    }
    if (chmod(path, 0660) != 0) {
        snprintf(err, errlen, "chmod(%s, 0660): %s", path, strerror(errno));
        return -1;
    }
    return 0;
}


void
msv_region_unmap(struct msv_region *rg)
{
    if (rg->ctrl != NULL) {
        munmap(rg->ctrl, rg->bytes);
        rg->ctrl = NULL;
    }
    if (rg->fd >= 0) {
        close(rg->fd);
        rg->fd = -1;
    }
    rg->bytes = 0;
}


int
msv_region_unlink(const char *name)
{
    int   rc, saved;
    char  shm[MSV_NAME_MAX + 2], sock[MSV_SOCK_PATH_MAX];

    if (!msv_name_valid(name)) {
        errno = EINVAL;
        return -1;
    }

    snprintf(shm, sizeof(shm), "/%s", name);
    msv_sock_path(name, sock, sizeof(sock));

    rc = shm_unlink(shm);
    saved = errno;
    if (unlink(sock) != 0 && errno != ENOENT && rc == 0) {
        return -1;
    }
    errno = saved;
    return rc;
}
