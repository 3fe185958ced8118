/* safetensors: read-only, validated access to Hugging Face weight files.
 *
 * Format (https://huggingface.co/docs/safetensors): u64 little-endian header
 * length N, then N bytes of JSON {"name": {"dtype": "F32", "shape": [..],
 * "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data area;
 * offsets are relative to the data area.
 *
 * st_open() maps every file read-only and validates every header field before
 * any tensor is handed out (header length inside the file and under a cap,
 * JSON, known dtype, shape, begin <= end inside the data area, byte size ==
 * product(shape) * dtype size with overflow checks, no overlaps, no duplicate
 * names). A sharded checkpoint is opened through model.safetensors.index.json
 * (weight_map: tensor -> shard file); every shard named there must exist and
 * every tensor of the map must be found in its shard.
 */
#ifndef PG_SAFETENSORS_H
#define PG_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "pg_error.h"

#define ST_MAX_DIMS 8
/* Headers above this are refused (real ones are < 1 MiB; the cap only stops
 * a lying length from making us allocate gigabytes). */
#define ST_MAX_HEADER_BYTES (100u * 1024u * 1024u)

/* One tensor. All pointers are borrowed: valid until st_close(). */
typedef struct st_tensor {
    const char *name;     /* NUL-terminated */
    st_dtype dtype;
    int ndim;             /* 0 .. ST_MAX_DIMS */
    int64_t shape[ST_MAX_DIMS];
    size_t nbytes;
    const void *data;     /* into the read-only mapping; may be unaligned */
    const char *file;     /* the shard's file name, for messages (st_parse: its label) */
} st_tensor;

typedef struct st_file st_file; /* opaque: one or more mapped files */

/* Opens `path`: a .safetensors file, a model.safetensors.index.json, or a
 * directory holding either (index preferred when both exist).
 * On error *out is NULL and err says which file and field. */
int st_open(st_file **out, const char *path, pg_error *err);
void st_close(st_file *f); /* accepts NULL */

size_t st_count(const st_file *f);
const st_tensor *st_at(const st_file *f, size_t i); /* i < st_count; sorted by name */
const st_tensor *st_find(const st_file *f, const char *name); /* NULL if absent */

/* Looks up `name` and checks its shape: ndim dims equal to shape[], and its
 * dtype: `want` exactly, or any of F32/F16/BF16 when want_any_float is set.
 * Errors read "model.safetensors: tensor 'x': expected [288,288] F32, got
 * [288,96] F32" or "...: tensor 'x' not found". */
int st_get(const st_file *f, const char *name, int want_any_float, st_dtype want,
           int ndim, const int64_t *shape, const st_tensor **out, pg_error *err);

/* ---- the pure parser (fuzz target; used by st_open) ----------------------
 * Parses and validates a whole safetensors image held in memory (buf, len:
 * the full file). On success *out_tensors is a malloc'd array of *out_n
 * tensors, sorted by name, whose name strings are malloc'd too (free with
 * st_tensors_free) and whose data pointers point into buf; their `file` is
 * `label` (borrowed: it must outlive them). `label` names the file in
 * messages. Never reads outside [buf, buf+len). An empty header ({}) is
 * valid and gives zero tensors. On error *out_tensors is NULL, *out_n 0. */
int st_parse(const uint8_t *buf, size_t len, const char *label,
             st_tensor **out_tensors, size_t *out_n, pg_error *err);
void st_tensors_free(st_tensor *t, size_t n);

#endif /* PG_SAFETENSORS_H */
