/* st_parse: the pure safetensors parser (see safetensors.h). It only reads
 * [buf, buf + len) and validates every header field before it hands out a
 * single tensor; st_open (safetensors.c) adds files, shards and lookup.
 *
 * File layout: [u64 LE header length N][N bytes JSON header][data area].
 * Header: {"__metadata__": {str: str}, "<name>": {"dtype": "F32",
 *          "shape": [d0, ..], "data_offsets": [begin, end]}, ...}
 * with begin/end relative to the data area (the format's own spec:
 * https://huggingface.co/docs/safetensors/index#format). */
#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "safetensors.h"

static uint64_t read_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--)
        v = (v << 8) | p[k];
    return v;
}

static const char *json_kind(const json_doc *d, int i)
{
    if (json_is_object(d, i)) return "an object";
    if (json_is_array(d, i)) return "an array";
    if (json_is_string(d, i)) return "a string";
    if (json_is_null(d, i)) return "null";
    if (json_is_bool(d, i)) return "a boolean";
    if (json_is_number(d, i)) return "a number";
    return "nothing";
}

/* "got" text for messages: the raw token, clipped. */
#define RAW_MAX 40
static void raw_clip(const json_doc *d, int i, char *buf, size_t cap)
{
    size_t n;
    const char *s = json_raw(d, i, &n);
    if (n > RAW_MAX) n = RAW_MAX;
    if (n >= cap) n = cap - 1;
    memcpy(buf, s, n);
    buf[n] = '\0';
}

/* A JSON array of exactly `want` (or at most `max` when want < 0) integers in
 * [0, INT64_MAX] into out[]; what names the field in messages. */
static int parse_int_array(const json_doc *d, int v, int want, int max, int64_t *out, int *n_out,
                           const char *label, const char *name, const char *what, pg_error *err)
{
    if (!json_is_array(d, v))
        return pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': expected %s to be an array of integers, got %s",
                            label, name, what, json_kind(d, v));
    int n = json_size(d, v);
    if (want >= 0 && n != want)
        return pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': expected %d entries in %s, got %d",
                            label, name, want, what, n);
    if (want < 0 && n > max)
        return pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': expected at most %d dims in %s, got %d",
                            label, name, max, what, n);
    int j = v + 1;
    for (int k = 0; k < n; k++) {
        if (j >= d->ntok)
            return pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': %s is truncated", label, name, what);
        if (json_get_int(d, j, 0, INT64_MAX, &out[k], NULL) != PG_OK) {
            char raw[RAW_MAX + 1];
            raw_clip(d, j, raw, sizeof raw);
            return pg_error_set(err, PG_EFORMAT,
                                "%s: tensor '%s': %s[%d]: expected a non-negative integer, got %s",
                                label, name, what, k, raw);
        }
        j = json_skip(d, j);
    }
    *n_out = n;
    return PG_OK;
}

/* One tensor entry {"dtype", "shape", "data_offsets"} (no other keys). On
 * success t holds dtype/shape/nbytes and *begin, *end the data offsets. */
static int parse_entry(const json_doc *d, int v, uint64_t data_len, const char *label,
                       const char *name, st_tensor *t, uint64_t *begin, uint64_t *end, pg_error *err)
{
    if (!json_is_object(d, v))
        return pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': expected an object {dtype, shape, data_offsets}, got %s",
                            label, name, json_kind(d, v));
    int i_dtype = -1, i_shape = -1, i_offs = -1;
    int n = json_size(d, v);
    int j = v + 1;
    for (int k = 0; k < n; k++) {
        if (j + 1 >= d->ntok || !json_is_string(d, j))
            return pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': malformed entry", label, name);
        int *slot = json_str_eq(d, j, "dtype") ? &i_dtype
                  : json_str_eq(d, j, "shape") ? &i_shape
                  : json_str_eq(d, j, "data_offsets") ? &i_offs : NULL;
        char raw[RAW_MAX + 1];
        raw_clip(d, j, raw, sizeof raw);
        if (!slot)
            return pg_error_set(err, PG_EFORMAT,
                                "%s: tensor '%s': unknown key '%s' (expected dtype, shape, data_offsets)",
                                label, name, raw);
        if (*slot >= 0)
            return pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': duplicate key '%s'", label, name, raw);
        *slot = j + 1;
        j = json_skip(d, j + 1);
    }
    if (i_dtype < 0 || i_shape < 0 || i_offs < 0)
        return pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': missing key '%s'", label, name,
                            i_dtype < 0 ? "dtype" : i_shape < 0 ? "shape" : "data_offsets");

    if (!json_is_string(d, i_dtype))
        return pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': expected dtype to be a string, got %s",
                            label, name, json_kind(d, i_dtype));
    size_t dlen;
    const char *ds = json_raw(d, i_dtype, &dlen);
    int dt = st_dtype_parse(ds, dlen);
    if (dt < 0) {
        char raw[RAW_MAX + 1];
        raw_clip(d, i_dtype, raw, sizeof raw);
        return pg_error_set(err, PG_EFORMAT,
                            "%s: tensor '%s': unknown dtype '%s' (expected F32, F16, BF16, F64, I8, U8, I16, I32, I64 or BOOL)",
                            label, name, raw);
    }
    t->dtype = (st_dtype)dt;

    int rc = parse_int_array(d, i_shape, -1, ST_MAX_DIMS, t->shape, &t->ndim, label, name, "shape", err);
    if (rc)
        return rc;
    int64_t offs[2];
    int noffs;
    rc = parse_int_array(d, i_offs, 2, 2, offs, &noffs, label, name, "data_offsets", err);
    if (rc)
        return rc;
    *begin = (uint64_t)offs[0];
    *end = (uint64_t)offs[1];
    if (*begin > *end)
        return pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64 "]: begin > end",
                            label, name, *begin, *end);
    if (*end > data_len)
        return pg_error_set(err, PG_EFORMAT,
                            "%s: tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64 "] run past the data area of %" PRIu64 " bytes",
                            label, name, *begin, *end, data_len);

    uint64_t elems = 1;
    for (int k = 0; k < t->ndim; k++) {
        uint64_t dim = (uint64_t)t->shape[k];
        if (dim != 0 && elems > UINT64_MAX / dim)
            return pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': shape product overflows at dim %d", label, name, k);
        elems *= dim;
    }
    uint64_t esize = st_dtype_size(t->dtype);
    if (elems > UINT64_MAX / esize || elems * esize > SIZE_MAX)
        return pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': byte size of %" PRIu64 " %s elements overflows",
                            label, name, elems, st_dtype_name(t->dtype));
    uint64_t nbytes = elems * esize;
    if (nbytes != *end - *begin)
        return pg_error_set(err, PG_EFORMAT,
                            "%s: tensor '%s': expected %" PRIu64 " bytes (%" PRIu64 " %s elements), got data_offsets [%" PRIu64 ",%" PRIu64 "] (%" PRIu64 " bytes)",
                            label, name, nbytes, elems, st_dtype_name(t->dtype), *begin, *end, *end - *begin);
    t->nbytes = (size_t)nbytes;
    return PG_OK;
}

/* __metadata__ must be an object of strings (the format says str -> str). */
static int check_metadata(const json_doc *d, int v, const char *label, pg_error *err)
{
    if (!json_is_object(d, v))
        return pg_error_set(err, PG_EFORMAT, "%s: __metadata__: expected an object of strings, got %s",
                            label, json_kind(d, v));
    int n = json_size(d, v);
    int j = v + 1;
    for (int k = 0; k < n; k++) {
        if (j + 1 >= d->ntok || !json_is_string(d, j))
            return pg_error_set(err, PG_EFORMAT, "%s: __metadata__: malformed object", label);
        if (!json_is_string(d, j + 1)) {
            char raw[RAW_MAX + 1];
            raw_clip(d, j, raw, sizeof raw);
            return pg_error_set(err, PG_EFORMAT, "%s: __metadata__: key '%s': expected a string, got %s",
                                label, raw, json_kind(d, j + 1));
        }
        j = json_skip(d, j + 1);
    }
    return PG_OK;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

typedef struct span {
    uint64_t begin, end;
    size_t idx; /* into the sorted tensor array */
} span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end ? 1 : 0;
}

/* Tensors sorted by name: refuses duplicate names and overlapping byte
 * ranges (empty tensors overlap nothing). */
static int check_names_and_overlaps(const st_tensor *t, size_t n, const uint8_t *data,
                                    const char *label, pg_error *err)
{
    for (size_t i = 1; i < n; i++)
        if (strcmp(t[i - 1].name, t[i].name) == 0)
            return pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': duplicate name", label, t[i].name);
    if (n < 2)
        return PG_OK;
    span *s = malloc(n * sizeof *s);
    if (!s)
        return pg_error_set(err, PG_ENOMEM, "%s: out of memory for %zu tensors", label, n);
    for (size_t i = 0; i < n; i++) {
        s[i].begin = (uint64_t)((const uint8_t *)t[i].data - data);
        s[i].end = s[i].begin + t[i].nbytes;
        s[i].idx = i;
    }
    qsort(s, n, sizeof *s, cmp_span);
    int rc = PG_OK;
    size_t last = SIZE_MAX; /* the non-empty span reaching furthest so far */
    for (size_t i = 0; i < n && rc == PG_OK; i++) {
        if (s[i].begin == s[i].end)
            continue;
        if (last != SIZE_MAX && s[i].begin < s[last].end)
            rc = pg_error_set(err, PG_EFORMAT,
                              "%s: tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64 "] overlap tensor '%s' [%" PRIu64 ",%" PRIu64 "]",
                              label, t[s[i].idx].name, s[i].begin, s[i].end, t[s[last].idx].name,
                              s[last].begin, s[last].end);
        if (last == SIZE_MAX || s[i].end > s[last].end)
            last = i;
    }
    free(s);
    return rc;
}

void st_tensors_free(st_tensor *t, size_t n)
{
    if (!t)
        return;
    for (size_t i = 0; i < n; i++)
        free((char *)(uintptr_t)t[i].name);
    free(t);
}

int st_parse(const uint8_t *buf, size_t len, const char *label, st_tensor **out_tensors, size_t *out_n,
             pg_error *err)
{
    *out_tensors = NULL;
    *out_n = 0;
    if (len < 8)
        return pg_error_set(err, PG_EFORMAT, "%s: file is %zu bytes, expected at least 8 (the header length)",
                            label, len);
    uint64_t hlen = read_le64(buf);
    if (hlen > ST_MAX_HEADER_BYTES)
        return pg_error_set(err, PG_EFORMAT, "%s: header length %" PRIu64 " exceeds the cap of %u bytes",
                            label, hlen, ST_MAX_HEADER_BYTES);
    if (hlen > len - 8)
        return pg_error_set(err, PG_EFORMAT,
                            "%s: header length %" PRIu64 " runs past the end of the file (%zu bytes after the length)",
                            label, hlen, len - 8);
    if (hlen < 2)
        return pg_error_set(err, PG_EFORMAT, "%s: header length %" PRIu64 ": expected a json object", label, hlen);
    const uint8_t *data = buf + 8 + hlen;
    uint64_t data_len = len - 8 - hlen;

    char hdr_label[512];
    snprintf(hdr_label, sizeof hdr_label, "%s: header", label);
    json_doc d;
    int rc = json_parse(&d, (const char *)buf + 8, (size_t)hlen, hdr_label, err);
    if (rc)
        return rc;
    if (!json_is_object(&d, 0)) {
        rc = pg_error_set(err, PG_EFORMAT, "%s: header: expected a json object, got %s", label, json_kind(&d, 0));
        json_doc_free(&d);
        return rc;
    }

    int members = json_size(&d, 0);
    st_tensor *t = calloc(members > 0 ? (size_t)members : 1, sizeof *t);
    if (!t) {
        json_doc_free(&d);
        return pg_error_set(err, PG_ENOMEM, "%s: out of memory for %d tensors", label, members);
    }
    size_t n = 0;
    int seen_metadata = 0;
    int j = 1;
    for (int k = 0; k < members && rc == PG_OK; k++) {
        if (j + 1 >= d.ntok || !json_is_string(&d, j)) {
            rc = pg_error_set(err, PG_EFORMAT, "%s: header: malformed object", label);
            break;
        }
        int v = j + 1;
        if (json_str_eq(&d, j, "__metadata__")) {
            if (seen_metadata++)
                rc = pg_error_set(err, PG_EFORMAT, "%s: header: duplicate __metadata__", label);
            else
                rc = check_metadata(&d, v, label, err);
            j = json_skip(&d, v);
            continue;
        }
        char *name = NULL;
        size_t name_len = 0;
        rc = json_get_string(&d, j, &name, &name_len, err);
        if (rc) {
            rc = pg_error_wrap(err, PG_EFORMAT, "%s: header: tensor name", label);
            break;
        }
        if (strlen(name) != name_len) {
            rc = pg_error_set(err, PG_EFORMAT, "%s: header: tensor name '%s' holds a NUL byte", label, name);
            free(name);
            break;
        }
        st_tensor *cur = &t[n];
        cur->name = name;
        cur->file = label;
        n++; /* owned by t[] from here, freed with it on error */
        uint64_t begin = 0, end = 0;
        rc = parse_entry(&d, v, data_len, label, name, cur, &begin, &end, err);
        if (rc == PG_OK)
            cur->data = data + begin;
        j = json_skip(&d, v);
    }
    json_doc_free(&d);
    if (rc == PG_OK) {
        qsort(t, n, sizeof *t, cmp_name);
        rc = check_names_and_overlaps(t, n, data, label, err);
    }
    if (rc) {
        st_tensors_free(t, n);
        return rc;
    }
    *out_tensors = t;
    *out_n = n;
    return PG_OK;
}
