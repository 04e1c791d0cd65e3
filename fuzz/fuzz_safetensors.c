/*
 * fuzz_safetensors.c: libFuzzer target for the safetensors header parser
 * (msv_st_load in worker/safetensors.c), through a real file descriptor
 * (a memfd named by /proc/self/fd), the way the worker opens checkpoints.
 *
 * Input: byte 0 even: the rest is the file as is.  Odd: the rest is a
 * JSON header, up to the first NUL, then data; the 8-byte length is
 * computed, so that the search goes into the header's entries rather
 * than stopping at the length check.
 *
 * Checked: a refused file leaves the weights untouched and a one-line
 * error naming the file; an accepted one yields tensors whose bytes lie
 * inside the file's data section and match shape times element size.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model.h"
#include "safetensors.h"


#define msv_fz_check(cond)                                                   \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "fuzz_safetensors: %s:%d: %s\n", __FILE__,       \
                    __LINE__, #cond);                                        \
            abort();                                                         \
        }                                                                    \
    } while (0)


static int   msv_fz_fd = -1;
static char  msv_fz_path[64];


static void
msv_fz_write(const uint8_t *data, size_t size)
{
    msv_fz_check(ftruncate(msv_fz_fd, 0) == 0);
    msv_fz_check(size == 0
                 || pwrite(msv_fz_fd, data, size, 0) == (ssize_t) size);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int                 i, d;
    char                err[512];
    size_t              hlen, elsize;
    uint8_t            *file;
    uint64_t            numel;
    const uint8_t      *map, *lo, *hi;
    struct msv_tensor  *t;
    struct msv_weights  w;

    if (size < 1) {
        return 0;
    }

    if (data[0] & 1) {
        const uint8_t  *nul = memchr(data + 1, 0, size - 1);

        hlen = nul ? (size_t) (nul - data - 1) : size - 1;
        file = malloc(size + 8);
        for (i = 0; i < 8; i++) {
            file[i] = (uint8_t) ((uint64_t) hlen >> (8 * i));
        }
        memcpy(file + 8, data + 1, size - 1);
        msv_fz_write(file, size - 1 + 8);
        free(file);
    } else {
        msv_fz_write(data + 1, size - 1);
    }

    memset(&w, 0, sizeof(w));
    err[0] = '\0';

    if (msv_st_load(msv_fz_path, &w, err, sizeof(err)) != 0) {
        msv_fz_check(w.n == 0 && w.n_maps == 0 && w.n_files == 0);
        msv_fz_check(strncmp(err, msv_fz_path, strlen(msv_fz_path)) == 0);
        msv_fz_check(strchr(err, '\n') == NULL);
        free(w.t);
        free(w.maps);
        free(w.map_bytes);
        free(w.files);
        return 0;
    }

    msv_fz_check(w.n_maps == 1 && w.n_files == 1);
    map = w.maps[0];
    hlen = 0;
    for (i = 0; i < 8; i++) {
        hlen |= (size_t) map[i] << (8 * i);
    }
    lo = map + 8 + hlen;
    hi = map + w.map_bytes[0];

    for (i = 0; i < w.n; i++) {
        t = &w.t[i];
        msv_fz_check(t->file == 0);
        msv_fz_check(t->ndim >= 0 && t->ndim <= 4);
        msv_fz_check(strlen(t->name) < sizeof(t->name));
        elsize = t->dtype == MSV_F32 ? 4 : 2;
        numel = 1;
        for (d = 0; d < t->ndim; d++) {
            msv_fz_check(t->shape[d] >= 0);
            numel *= (uint64_t) t->shape[d];
        }
        msv_fz_check(t->bytes == numel * elsize);
        msv_fz_check((const uint8_t *) t->data >= lo
                     && (const uint8_t *) t->data <= hi
                     && t->bytes <= (size_t) (hi - (const uint8_t *) t->data));
        if (t->bytes) {
            /* touch the first and last byte: inside the mapping */
            volatile uint8_t  x;

            x = ((const uint8_t *) t->data)[0];
            x = ((const uint8_t *) t->data)[t->bytes - 1];
            (void) x;
        }
    }

    munmap(w.maps[0], w.map_bytes[0]);
    free(w.files[0]);
    free(w.t);
    free(w.maps);
    free(w.map_bytes);
    free(w.files);
    return 0;
}


int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
    msv_fz_fd = memfd_create("fuzz.safetensors", 0);
    if (msv_fz_fd < 0) {
        perror("memfd_create");
        abort();
    }
    snprintf(msv_fz_path, sizeof(msv_fz_path), "/proc/self/fd/%d",
             msv_fz_fd);
    return 0;
}
