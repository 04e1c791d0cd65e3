/*
 * safetensors.h: reading checkpoint files.  A safetensors file is an
 * 8-byte little-endian header length N, N bytes of JSON describing each
 * tensor (dtype, shape, data_offsets relative to the end of the header),
 * then the data.  The file is mapped read-only and every entry is checked
 * against the file before anything points into it.
 */

#ifndef MSV_SAFETENSORS_H
#define MSV_SAFETENSORS_H

#include <stddef.h>

#include <yajl/yajl_tree.h>

#include "model.h"

#define MSV_ST_HEADER_MAX  (100u << 20)   /* refuse larger JSON headers */

/* Map path and append its tensors to w (w->t, w->maps, w->files).  On
 * error nothing is appended and err names the file (and the tensor). */
int msv_st_load(const char *path, struct msv_weights *w, char *err,
    size_t errlen);

/* Read a whole JSON file into a yajl tree (free with yajl_tree_free).
 * -1 with err naming the file when it cannot be read or parsed; -2 when
 * it does not exist (err set too). */
int msv_json_file_parse(const char *path, yajl_val *root, char *err,
    size_t errlen);

#endif /* MSV_SAFETENSORS_H */
