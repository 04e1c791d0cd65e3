/*
 * test_region.c: creating, validating and opening a worker's region: the
 * layout the contract promises, a restart's new object and generation,
 * and a clear refusal for every malformed control page.
 */

#include <sys/mman.h>
#include <sys/stat.h>

#include "tap.h"
#include "shm_harness.h"


#define R64(x)  (((x) + 63) & ~(uint64_t) 63)


static void
layout(struct msv_layout *lay)
{
    memset(lay, 0, sizeof(*lay));
    lay->n_slots = 16;
    lay->n_readers = 8;
    lay->vocab_size = 151936;
    lay->max_model_len = 4096;
    lay->max_logprobs = 20;
    lay->n_eos = 2;
    lay->eos_ids[0] = 151643;
    lay->eos_ids[1] = 151645;
    lay->ring_bytes = 4u << 20;
    lay->model = "Qwen/Qwen3-0.6B";
    lay->backend = "cuda";
}


static void
test_create(void)
{
    int                 ok;
    char                err[256], name[64], sock[128];
    uint64_t            slot_hdr, gen1, ino1;
    struct stat         st;
    struct msv_ctrl    *c;
    struct msv_region   rg, rg2, ro;
    struct msv_layout   lay;

    hx_name(name, sizeof(name), "create");
    layout(&lay);

    if (!tap_ok(msv_region_create(&rg, name, &lay, err, sizeof(err)) == 0,
                "create: region /%s", name))
    {
        tap_diag("%s", err);
        return;
    }
    c = rg.ctrl;

    tap_ok(c->magic == MSV_MAGIC && c->version == MSV_LAYOUT_VERSION
           && c->ctrl_bytes == sizeof(struct msv_ctrl)
           && c->region_bytes == rg.bytes,
           "create: magic, version, ctrl_bytes, region_bytes");
    tap_ok(c->generation != 0 && c->worker_pid == (int32_t) getpid()
           && atomic_load(&c->state) == MSV_WORKER_STARTING
           && atomic_load(&c->heartbeat_ns) != 0,
           "create: generation %016llx, pid, STARTING, heartbeat",
           (unsigned long long) c->generation);

    slot_hdr = R64(sizeof(struct msv_slot));
    tap_ok(c->slot_prompt_off == slot_hdr
           && c->slot_bias_off == slot_hdr + R64(4096 * 4)
           && c->slot_bytes == slot_hdr + R64(4096 * 4)
                               + R64(MSV_MAX_BIAS * 8),
           "create: slot_bytes %u = header %llu + prompt + bias, 64-aligned",
           c->slot_bytes, (unsigned long long) slot_hdr);
    tap_ok(c->readers_off >= sizeof(struct msv_ctrl)
           && c->slots_off == c->readers_off + 8 * sizeof(struct msv_reader)
           && c->ring_off >= c->slots_off + 16ULL * c->slot_bytes
           && c->ring_off % 4096 == 0
           && c->ring_off + c->ring_bytes == c->region_bytes,
           "create: readers, slots, page-aligned ring in order");
    tap_ok(c->max_row_bytes == msv_row_size(151936, 151936, 20)
           && c->max_rec_bytes == (4u << 20) / 2,
           "create: max_row_bytes %u, max_rec_bytes %u", c->max_row_bytes,
           c->max_rec_bytes);
    msv_sock_path(name, sock, sizeof(sock));
    tap_ok(strcmp(c->sock_path, sock) == 0
           && strncmp(sock, "/dev/shm/", 9) == 0
           && strcmp(c->name, name) == 0
           && strcmp(c->model, "Qwen/Qwen3-0.6B") == 0
           && strcmp(c->backend, "cuda") == 0 && c->n_eos == 2
           && c->eos_ids[1] == 151645 && c->vocab_size == 151936,
           "create: socket path %s, name and model facts", c->sock_path);
    ok = fstat(rg.fd, &st) == 0;
    tap_ok(ok && (st.st_mode & 0777) == 0600, "create: mode 0600 (%o)",
           (unsigned) (st.st_mode & 0777));

    tap_ok(msv_region_open(&ro, name, err, sizeof(err)) == 0
           && ro.ctrl->generation == c->generation,
           "open: a reader maps and validates it");
    msv_region_unmap(&ro);

    /* a restart: new object, new generation, old mapping untouched */
    gen1 = c->generation;
    ino1 = st.st_ino;
    if (!tap_ok(msv_region_create(&rg2, name, &lay, err, sizeof(err)) == 0,
                "create again"))
    {
        return;
    }
    ok = fstat(rg2.fd, &st) == 0;
    tap_ok(ok && st.st_ino != ino1 && rg2.ctrl->generation != gen1
           && c->generation == gen1,
           "create again: new inode, generation %016llx, old mapping keeps "
           "its own", (unsigned long long) rg2.ctrl->generation);
    tap_ok(msv_region_open(&ro, name, err, sizeof(err)) == 0
           && ro.ctrl->generation == rg2.ctrl->generation,
           "open: the name now gives the new region");
    msv_region_unmap(&ro);
    msv_region_unmap(&rg);
    msv_region_unmap(&rg2);

    tap_ok(msv_region_unlink(name) == 0, "unlink: removed");
    tap_ok(msv_region_unlink(name) == -1 && errno == ENOENT,
           "unlink: again -> ENOENT");
    tap_ok(msv_region_open(&ro, name, err, sizeof(err)) == -1
           && strstr(err, "no worker serves this name") != NULL,
           "open: missing region: \"%s\"", err);
}


static void
test_create_refusals(void)
{
    char               err[256], name[64], want[64], longname[300];
    struct msv_region  rg;
    struct msv_layout  lay;

    hx_name(name, sizeof(name), "refuse");

    layout(&lay);
    lay.ring_bytes = 1u << 20;       /* one 151936-vocab row is ~1.2 MB */
    snprintf(want, sizeof(want), "at least %u", 4u << 20);
    tap_ok(msv_region_create(&rg, name, &lay, err, sizeof(err)) == -1
           && strstr(err, "--ring-bytes") != NULL
           && strstr(err, want) != NULL,
           "create: ring too small for a row: \"%s\"", err);

    layout(&lay);
    lay.ring_bytes = (4u << 20) + 4096;
    tap_ok(msv_region_create(&rg, name, &lay, err, sizeof(err)) == -1
           && strstr(err, "power of two") != NULL,
           "create: ring not a power of two: \"%s\"", err);

    layout(&lay);
    lay.n_readers = MSV_MAX_READERS + 1;
    tap_ok(msv_region_create(&rg, name, &lay, err, sizeof(err)) == -1
           && strstr(err, "n_readers") != NULL,
           "create: too many readers: \"%s\"", err);

    layout(&lay);
    lay.max_logprobs = MSV_MAX_LOGPROBS + 1;
    tap_ok(msv_region_create(&rg, name, &lay, err, sizeof(err)) == -1
           && strstr(err, "max_logprobs") != NULL,
           "create: max_logprobs above the cap: \"%s\"", err);

    layout(&lay);
    tap_ok(msv_region_create(&rg, "a/b", &lay, err, sizeof(err)) == -1
           && msv_region_create(&rg, "..", &lay, err, sizeof(err)) == -1
           && msv_region_create(&rg, "", &lay, err, sizeof(err)) == -1
           && strstr(err, "shm name") != NULL,
           "create: bad names refused: \"%s\"", err);
    tap_ok(msv_name_valid("worker-0.gpu_1") && !msv_name_valid("a b")
           && !msv_name_valid(NULL),
           "msv_name_valid: [A-Za-z0-9._-] only");

    /* a long model path keeps its informative end */
    memset(longname, 'x', sizeof(longname));
    memcpy(longname + sizeof(longname) - 12, "/Qwen3-0.6B", 12);
    lay.model = longname;
    if (!tap_ok(msv_region_create(&rg, name, &lay, err, sizeof(err)) == 0,
                "create: long model path accepted"))
    {
        return;
    }
    tap_ok(strncmp(rg.ctrl->model, "...", 3) == 0
           && strlen(rg.ctrl->model) == sizeof(rg.ctrl->model) - 1
           && strcmp(rg.ctrl->model + strlen(rg.ctrl->model) - 11,
                     "/Qwen3-0.6B") == 0,
           "create: a long model path is kept by its end: %.20s...",
           rg.ctrl->model);
    msv_region_unmap(&rg);
    msv_region_unlink(name);
}


/* Corrupt one field, expect msv_region_open to name it, restore. */
static void
test_open_refusals(void)
{
    int                 i;
    char                err[256], name[64], saved[sizeof(struct msv_ctrl)];
    struct msv_ctrl    *c;
    struct msv_region   rg, ro;
    struct msv_layout   lay;
    static const char  *expect[] = {
        "bad magic", "magic is 0", "layout version", "ctrl_bytes",
        "region_bytes", "n_readers", "readers_off", "slots_off",
        "slot layout", "ring_off", "power of two", "ring (",
        "max_row_bytes", "NUL-terminated", "control page names",
        "model facts"
    };

    hx_name(name, sizeof(name), "open");
    layout(&lay);
    if (msv_region_create(&rg, name, &lay, err, sizeof(err)) != 0) {
        tap_ok(0, "open: create: %s", err);
        return;
    }
    c = rg.ctrl;
    memcpy(saved, c, sizeof(saved));

    for (i = 0; i < 16; i++) {
        switch (i) {
        case 0: c->magic ^= 1; break;
        case 1: c->magic = 0; break;
        case 2: c->version = 99; break;
        case 3: c->ctrl_bytes -= 64; break;
        case 4: c->region_bytes += 4096; break;
        case 5: c->n_readers = 0; break;
        case 6: c->readers_off += 8; break;
        case 7: c->slots_off = c->readers_off; break;
        case 8: c->slot_bias_off = c->slot_prompt_off; break;
        case 9: c->ring_off += 64; break;
        case 10: c->ring_bytes -= 4096; break;
        case 11: c->ring_bytes /= 2; break;
        case 12: c->max_rec_bytes = c->max_row_bytes; break;
        case 13: memset(c->backend, 'x', sizeof(c->backend)); break;
        case 14: c->name[0] ^= 1; break;
        case 15: c->vocab_size = 0; break;
        }
        err[0] = '\0';
        tap_ok(msv_region_open(&ro, name, err, sizeof(err)) == -1
               && strstr(err, expect[i]) != NULL,
               "open refuses: \"%s\"", err);
        memcpy(c, saved, sizeof(saved));
    }

    tap_ok(msv_region_open(&ro, name, err, sizeof(err)) == 0,
           "open: restored page accepted");
    msv_region_unmap(&ro);

    /* an object shorter than its control page says */
    tap_ok(ftruncate(rg.fd, (off_t) (rg.bytes - 4096)) == 0
           && msv_region_open(&ro, name, err, sizeof(err)) == -1
           && strstr(err, "region_bytes") != NULL,
           "open: truncated object: \"%s\"", err);
    tap_ok(ftruncate(rg.fd, 100) == 0
           && msv_region_open(&ro, name, err, sizeof(err)) == -1
           && strstr(err, "smaller than its control page") != NULL,
           "open: object smaller than a control page: \"%s\"", err);

    /* the mapping is now beyond the file: drop it before touching it */
    munmap(rg.ctrl, rg.bytes);
    rg.ctrl = NULL;
    msv_region_unmap(&rg);
    msv_region_unlink(name);
}


int
main(void)
{
    test_create();
    test_create_refusals();
    test_open_refusals();
    return tap_done();
}
