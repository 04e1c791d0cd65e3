/*
 * safetensors.c: map a safetensors file, validate its header, and append
 * its tensors to a weight table.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"


static int msv_st_open(const char *path, struct stat *st, char *err,
    size_t errlen);
static int msv_st_parse_entry(const char *path, const char *name,
    yajl_val v, const uint8_t *data, uint64_t data_bytes,
    struct msv_tensor *t, char *err, size_t errlen);
static int msv_st_dtype(const char *s, size_t *elsize);
static void msv_st_first_line(char *s);


int
msv_json_file_parse(const char *path, yajl_val *root, char *err,
    size_t errlen)
{
    int          fd;
    char        *buf, ebuf[256];
    ssize_t      n;
    size_t       got;
    struct stat  st;

    *root = NULL;

    fd = msv_st_open(path, &st, err, errlen);
    if (fd < 0) {
        return fd;
    }

    if (st.st_size > (off_t) (64 << 20)) {
        snprintf(err, errlen, "%s: too large for a JSON file (%lld bytes)",
                 path, (long long) st.st_size);
        close(fd);
        return -1;
    }

    buf = malloc((size_t) st.st_size + 1);
    if (buf == NULL) {
        snprintf(err, errlen, "%s: out of memory", path);
        close(fd);
        return -1;
    }

    got = 0;
    while (got < (size_t) st.st_size) {
        n = read(fd, buf + got, (size_t) st.st_size - got);
        if (n == -1 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            snprintf(err, errlen, "%s: read: %s", path,
                     n == 0 ? "unexpected end of file" : strerror(errno));
            free(buf);
            close(fd);
            return -1;
        }
        got += (size_t) n;
    }
    buf[got] = '\0';
    close(fd);

    ebuf[0] = '\0';
    *root = yajl_tree_parse(buf, ebuf, sizeof(ebuf));
    free(buf);

    if (*root == NULL) {
        msv_st_first_line(ebuf);
        snprintf(err, errlen, "%s: invalid JSON: %s", path,
                 ebuf[0] ? ebuf : "parse error");
        return -1;
    }

    if (!YAJL_IS_OBJECT(*root)) {
        snprintf(err, errlen, "%s: top level is not a JSON object", path);
        yajl_tree_free(*root);
        *root = NULL;
        return -1;
    }

    return 0;
}


int
msv_st_load(const char *path, struct msv_weights *w, char *err,
    size_t errlen)
{
    int                 fd, rc, file;
    char               *hdr, ebuf[256], *pathcopy, **files;
    void               *map, **maps;
    size_t              i, n, bytes, *map_bytes;
    uint64_t            hlen, data_bytes;
    yajl_val            root;
    struct stat         st;
    const uint8_t      *p;
    struct msv_tensor  *t, *tt;

    fd = msv_st_open(path, &st, err, errlen);
    if (fd < 0) {
        return -1;
    }

    bytes = (size_t) st.st_size;
    if (bytes < 8) {
        snprintf(err, errlen, "%s: truncated: %zu bytes, a safetensors "
                 "file starts with an 8-byte header length", path, bytes);
        close(fd);
        return -1;
    }

    map = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(err, errlen, "%s: mmap: %s", path, strerror(errno));
        return -1;
    }

    p = map;
    hlen = 0;
    for (i = 0; i < 8; i++) {
        hlen |= (uint64_t) p[i] << (8 * i);
    }

    if (hlen > bytes - 8) {
        snprintf(err, errlen, "%s: header length %" PRIu64 " is past the "
                 "end of the file (%zu bytes): truncated or not a "
                 "safetensors file", path, hlen, bytes);
        munmap(map, bytes);
        return -1;
    }

    if (hlen < 2 || hlen > MSV_ST_HEADER_MAX || p[8] != '{') {
        snprintf(err, errlen, "%s: bad header: length %" PRIu64 ", %s",
                 path, hlen,
                 hlen < 2 || hlen > MSV_ST_HEADER_MAX
                 ? "out of range" : "does not start with '{'");
        munmap(map, bytes);
        return -1;
    }

    hdr = malloc(hlen + 1);
    if (hdr == NULL) {
        snprintf(err, errlen, "%s: out of memory", path);
        munmap(map, bytes);
        return -1;
    }
    memcpy(hdr, p + 8, hlen);
    hdr[hlen] = '\0';

    ebuf[0] = '\0';
    root = yajl_tree_parse(hdr, ebuf, sizeof(ebuf));
    free(hdr);

    if (root == NULL || !YAJL_IS_OBJECT(root)) {
        msv_st_first_line(ebuf);
        snprintf(err, errlen, "%s: bad header: %s", path,
                 root == NULL ? (ebuf[0] ? ebuf : "invalid JSON")
                              : "not a JSON object");
        yajl_tree_free(root);
        munmap(map, bytes);
        return -1;
    }

    data_bytes = bytes - 8 - hlen;
    n = root->u.object.len;

    /* room for n more tensors, one more map and one more file name */

    t = realloc(w->t, (w->n + n + 1) * sizeof(struct msv_tensor));
    if (t == NULL) {
        goto nomem;
    }
    w->t = t;

    maps = realloc(w->maps, (w->n_maps + 1) * sizeof(void *));
    if (maps == NULL) {
        goto nomem;
    }
    w->maps = maps;

    map_bytes = realloc(w->map_bytes, (w->n_maps + 1) * sizeof(size_t));
    if (map_bytes == NULL) {
        goto nomem;
    }
    w->map_bytes = map_bytes;

    files = realloc(w->files, (w->n_files + 1) * sizeof(char *));
    if (files == NULL) {
        goto nomem;
    }
    w->files = files;

    pathcopy = strdup(path);
    if (pathcopy == NULL) {
        goto nomem;
    }

    file = w->n_files;
    tt = w->t + w->n;
    rc = 0;

    for (i = 0; i < n; i++) {
        const char  *name = root->u.object.keys[i];

        if (strcmp(name, "__metadata__") == 0) {
            continue;
        }

        rc = msv_st_parse_entry(path, name, root->u.object.values[i],
                                p + 8 + hlen, data_bytes, tt, err, errlen);
        if (rc != 0) {
            break;
        }

        tt->file = file;
        tt++;
    }

    yajl_tree_free(root);

    if (rc != 0) {
        free(pathcopy);
        munmap(map, bytes);
        return -1;
    }

    w->n = (int) (tt - w->t);
    w->maps[w->n_maps] = map;
    w->map_bytes[w->n_maps] = bytes;
    w->n_maps++;
    w->files[w->n_files++] = pathcopy;

    return 0;

nomem:

    snprintf(err, errlen, "%s: out of memory", path);
    yajl_tree_free(root);
    munmap(map, bytes);
    return -1;
}


/* Open path for reading and make sure it is a regular file: the
 * descriptor, or -1 with err set (-2 when path does not exist). */

static int
msv_st_open(const char *path, struct stat *st, char *err, size_t errlen)
{
    int  fd;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd == -1) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return errno == ENOENT ? -2 : -1;
    }

    if (fstat(fd, st) == -1) {
        snprintf(err, errlen, "%s: fstat: %s", path, strerror(errno));
        close(fd);
        return -1;
    }

    if (!S_ISREG(st->st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        close(fd);
        return -1;
    }

    return fd;
}


static int
msv_st_parse_entry(const char *path, const char *name, yajl_val v,
    const uint8_t *data, uint64_t data_bytes, struct msv_tensor *t,
    char *err, size_t errlen)
{
    int          d, dtype;
    size_t       elsize;
    uint64_t     numel, off[2], dim;
    yajl_val     jdtype, jshape, joff, x;
    const char  *k;

    if (strlen(name) >= sizeof(t->name)) {
        snprintf(err, errlen, "%s: tensor %.60s...: name longer than %zu "
                 "bytes", path, name, sizeof(t->name) - 1);
        return -1;
    }

    if (!YAJL_IS_OBJECT(v)) {
        snprintf(err, errlen, "%s: tensor %s: header entry is not an "
                 "object", path, name);
        return -1;
    }

    jdtype = jshape = joff = NULL;
    for (size_t i = 0; i < v->u.object.len; i++) {
        k = v->u.object.keys[i];
        if (strcmp(k, "dtype") == 0) {
            jdtype = v->u.object.values[i];
        } else if (strcmp(k, "shape") == 0) {
            jshape = v->u.object.values[i];
        } else if (strcmp(k, "data_offsets") == 0) {
            joff = v->u.object.values[i];
        }
    }

    if (!YAJL_IS_STRING(jdtype)) {
        snprintf(err, errlen, "%s: tensor %s: dtype: missing or not a "
                 "string", path, name);
        return -1;
    }

    dtype = msv_st_dtype(jdtype->u.string, &elsize);
    if (dtype == 0) {
        snprintf(err, errlen, "%s: tensor %s: unsupported dtype %.32s "
                 "(F32, F16 and BF16 are supported)", path, name,
                 jdtype->u.string);
        return -1;
    }

    if (!YAJL_IS_ARRAY(jshape)) {
        snprintf(err, errlen, "%s: tensor %s: shape: missing or not an "
                 "array", path, name);
        return -1;
    }

    if (jshape->u.array.len > 4) {
        snprintf(err, errlen, "%s: tensor %s: shape: %zu dimensions, at "
                 "most 4 supported", path, name, jshape->u.array.len);
        return -1;
    }

    memset(t, 0, sizeof(*t));
    strcpy(t->name, name);
    t->dtype = dtype;
    t->ndim = (int) jshape->u.array.len;

    numel = 1;
    for (d = 0; d < t->ndim; d++) {
        x = jshape->u.array.values[d];
        if (!YAJL_IS_INTEGER(x) || x->u.number.i < 0
            || x->u.number.i > ((int64_t) 1 << 40))
        {
            snprintf(err, errlen, "%s: tensor %s: shape[%d]: not a "
                     "non-negative integer in range", path, name, d);
            return -1;
        }
        dim = (uint64_t) x->u.number.i;
        t->shape[d] = (int64_t) dim;
        if (dim != 0 && numel > UINT64_MAX / 16 / dim) {
            snprintf(err, errlen, "%s: tensor %s: shape: too many "
                     "elements", path, name);
            return -1;
        }
        numel *= dim;
    }

    if (!YAJL_IS_ARRAY(joff) || joff->u.array.len != 2) {
        snprintf(err, errlen, "%s: tensor %s: data_offsets: missing or "
                 "not a pair", path, name);
        return -1;
    }

    for (d = 0; d < 2; d++) {
        x = joff->u.array.values[d];
        if (!YAJL_IS_INTEGER(x) || x->u.number.i < 0) {
            snprintf(err, errlen, "%s: tensor %s: data_offsets[%d]: not a "
                     "non-negative integer", path, name, d);
            return -1;
        }
        off[d] = (uint64_t) x->u.number.i;
    }

    if (off[1] < off[0]) {
        snprintf(err, errlen, "%s: tensor %s: data_offsets [%" PRIu64
                 ", %" PRIu64 "]: end before start", path, name, off[0],
                 off[1]);
        return -1;
    }

    if (off[1] > data_bytes) {
        snprintf(err, errlen, "%s: truncated: tensor %s needs data bytes "
                 "[%" PRIu64 ", %" PRIu64 ") but the data section has %"
                 PRIu64, path, name, off[0], off[1], data_bytes);
        return -1;
    }

    if (off[1] - off[0] != numel * elsize) {
        snprintf(err, errlen, "%s: tensor %s: data_offsets span %" PRIu64
                 " bytes, but shape and dtype %s need %" PRIu64, path,
                 name, off[1] - off[0], jdtype->u.string, numel * elsize);
        return -1;
    }

    t->data = data + off[0];
    t->bytes = (size_t) (off[1] - off[0]);

    return 0;
}


static int
msv_st_dtype(const char *s, size_t *elsize)
{
    if (strcmp(s, "F32") == 0) {
        *elsize = 4;
        return MSV_F32;
    }

    if (strcmp(s, "F16") == 0) {
        *elsize = 2;
        return MSV_F16;
    }

    if (strcmp(s, "BF16") == 0) {
        *elsize = 2;
        return MSV_BF16;
    }

    return 0;
}


/* yajl's messages span several lines (the input, a caret); keep the
 * first. */

static void
msv_st_first_line(char *s)
{
    char  *nl;

    nl = strchr(s, '\n');
    if (nl != NULL) {
        *nl = '\0';
    }

    /* and drop trailing blanks */
    for (size_t n = strlen(s); n > 0 && (s[n - 1] == ' '
                                         || s[n - 1] == '\r'); n--)
    {
        s[n - 1] = '\0';
    }
}
