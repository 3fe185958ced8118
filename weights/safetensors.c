/* safetensors: files, shards and lookup over the pure parser in st_parse.c
 * (see safetensors.h). One st_file holds every mapped shard and one array of
 * tensors from all of them, sorted by name (st_find is a binary search). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file_io.h"
#include "json.h"
#include "safetensors.h"

#define ST_INDEX_NAME "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"
/* A 405B checkpoint's index is ~100 KiB; this only bounds a runaway file. */
#define ST_MAX_INDEX_BYTES (64u * 1024u * 1024u)

typedef struct st_shard {
    char *name;   /* file name as the index (or the path's last part) spells it; owned */
    pg_map map;   /* read-only mapping of the whole file */
} st_shard;

struct st_file {
    char *label;  /* the opened file's name (index or single file), for messages; owned */
    st_shard *shards;
    size_t nshards;
    st_tensor *t; /* [n], sorted by name; names owned; data into shards[].map */
    size_t n;
};

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* The folder part of path ("." when it has none), malloc'd. */
static char *dir_name(const char *path)
{
    const char *s = strrchr(path, '/');
    if (!s)
        return strdup(".");
    size_t n = s == path ? 1 : (size_t)(s - path);
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, path, n);
        d[n] = '\0';
    }
    return d;
}

void st_close(st_file *f)
{
    if (!f)
        return;
    st_tensors_free(f->t, f->n);
    free(f->label);
    for (size_t i = 0; i < f->nshards; i++) {
        pg_unmap_file(&f->shards[i].map);
        free(f->shards[i].name);
    }
    free(f->shards);
    free(f);
}

/* Adds shard `name` (at path) to f: maps, parses, and appends its tensors. */
static int add_shard(st_file *f, const char *path, const char *name, pg_error *err)
{
    st_shard *sh = &f->shards[f->nshards];
    memset(sh, 0, sizeof *sh);
    sh->name = strdup(name);
    if (!sh->name)
        return pg_error_set(err, PG_ENOMEM, "%s: out of memory", path);
    f->nshards++; /* owned by f from here */
    int rc = pg_map_file(path, &sh->map, err);
    if (rc)
        return rc;
    st_tensor *t = NULL;
    size_t n = 0;
    rc = st_parse(sh->map.data, sh->map.size, sh->name, &t, &n, err);
    if (rc)
        return rc;
    st_tensor *all = realloc(f->t, (f->n + n + 1) * sizeof *all);
    if (!all) {
        st_tensors_free(t, n);
        return pg_error_set(err, PG_ENOMEM, "%s: out of memory for %zu tensors", name, f->n + n);
    }
    memcpy(all + f->n, t, n * sizeof *t);
    free(t); /* names moved into f->t */
    f->t = all;
    f->n += n;
    return PG_OK;
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

/* Sorts the merged tensors; a name held by two shards is an error. */
static int finish(st_file *f, pg_error *err)
{
    if (f->n > 1)
        qsort(f->t, f->n, sizeof *f->t, cmp_tensor_name);
    for (size_t i = 1; i < f->n; i++)
        if (strcmp(f->t[i - 1].name, f->t[i].name) == 0)
            return pg_error_set(err, PG_EFORMAT, "tensor '%s' appears in both %s and %s", f->t[i].name,
                                f->t[i - 1].file, f->t[i].file);
    return PG_OK;
}

static int open_single(st_file *f, const char *path, pg_error *err)
{
    f->label = strdup(base_name(path));
    f->shards = calloc(1, sizeof *f->shards);
    if (!f->shards || !f->label)
        return pg_error_set(err, PG_ENOMEM, "%s: out of memory", path);
    int rc = add_shard(f, path, base_name(path), err);
    return rc ? rc : finish(f, err);
}

/* One distinct shard named by the index, and a tensor that needs it. */
typedef struct shard_ref {
    char *file;
    char *first_tensor;
} shard_ref;

static int open_index(st_file *f, const char *index_path, pg_error *err)
{
    const char *label = base_name(index_path);
    char *text = NULL;
    size_t len = 0;
    json_doc d = {0};
    shard_ref *refs = NULL;
    size_t nrefs = 0;
    char *dir = NULL;
    f->label = strdup(label);
    if (!f->label)
        return pg_error_set(err, PG_ENOMEM, "%s: out of memory", label);
    int rc = pg_read_file(index_path, ST_MAX_INDEX_BYTES, &text, &len, err);
    if (rc)
        return rc;
    rc = json_parse(&d, text, len, label, err);
    if (rc)
        goto out_text;
    int wm = json_obj_get(&d, 0, "weight_map");
    if (!json_is_object(&d, 0) || !json_is_object(&d, wm)) {
        rc = pg_error_set(err, PG_EFORMAT, "%s: expected an object with a \"weight_map\" object", label);
        goto out_doc;
    }
    int members = json_size(&d, wm);
    if (members == 0) {
        rc = pg_error_set(err, PG_EFORMAT, "%s: weight_map is empty", label);
        goto out_doc;
    }
    refs = calloc((size_t)members, sizeof *refs);
    if (!refs) {
        rc = pg_error_set(err, PG_ENOMEM, "%s: out of memory", label);
        goto out_doc;
    }

    /* Pass 1: distinct shard files, each with one tensor that needs it. */
    for (int k = 0, j = wm + 1; k < members; k++, j = json_skip(&d, j + 1)) {
        char *tname = NULL, *file = NULL;
        if (j + 1 >= d.ntok || !json_is_string(&d, j) || !json_is_string(&d, j + 1)) {
            rc = pg_error_set(err, PG_EFORMAT, "%s: weight_map: expected tensor name -> shard file strings", label);
            goto out_refs;
        }
        rc = json_get_string(&d, j + 1, &file, NULL, err);
        if (rc) {
            rc = pg_error_wrap(err, PG_EFORMAT, "%s: weight_map", label);
            goto out_refs;
        }
        if (file[0] == '\0' || strchr(file, '/') || strcmp(file, ".") == 0 || strcmp(file, "..") == 0) {
            rc = pg_error_set(err, PG_EFORMAT, "%s: weight_map: shard '%s': expected a file name beside the index",
                              label, file);
            free(file);
            goto out_refs;
        }
        size_t r = 0;
        while (r < nrefs && strcmp(refs[r].file, file) != 0)
            r++;
        if (r < nrefs) {
            free(file);
            continue;
        }
        rc = json_get_string(&d, j, &tname, NULL, err);
        if (rc) {
            free(file);
            rc = pg_error_wrap(err, PG_EFORMAT, "%s: weight_map", label);
            goto out_refs;
        }
        refs[nrefs].file = file;
        refs[nrefs].first_tensor = tname;
        nrefs++;
    }

    /* Every shard must exist before any is mapped. */
    dir = dir_name(index_path);
    if (!dir) {
        rc = pg_error_set(err, PG_ENOMEM, "%s: out of memory", label);
        goto out_refs;
    }
    for (size_t r = 0; r < nrefs; r++) {
        char *p = pg_path_join(dir, refs[r].file);
        int ok = p && pg_file_exists(p);
        free(p);
        if (!ok) {
            rc = pg_error_set(err, PG_EIO, "%s: missing shard '%s' (needed by tensor '%s'): not found in %s",
                              label, refs[r].file, refs[r].first_tensor, dir);
            goto out_refs;
        }
    }
    f->shards = calloc(nrefs, sizeof *f->shards);
    if (!f->shards) {
        rc = pg_error_set(err, PG_ENOMEM, "%s: out of memory", label);
        goto out_refs;
    }
    for (size_t r = 0; r < nrefs && rc == PG_OK; r++) {
        char *p = pg_path_join(dir, refs[r].file);
        rc = p ? add_shard(f, p, refs[r].file, err) : pg_error_set(err, PG_ENOMEM, "%s: out of memory", label);
        free(p);
    }
    if (rc == PG_OK)
        rc = finish(f, err);

    /* Pass 2: every tensor of the map is in the shard the map names. */
    for (int k = 0, j = wm + 1; k < members && rc == PG_OK; k++, j = json_skip(&d, j + 1)) {
        char *tname = NULL, *file = NULL;
        rc = json_get_string(&d, j, &tname, NULL, err);
        if (rc == PG_OK)
            rc = json_get_string(&d, j + 1, &file, NULL, err);
        if (rc == PG_OK) {
            const st_tensor *t = st_find(f, tname);
            if (!t)
                rc = pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': weight_map names shard '%s', which does not hold it",
                                  label, tname, file);
            else if (strcmp(t->file, file) != 0)
                rc = pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': weight_map names shard '%s', found in '%s'",
                                  label, tname, file, t->file);
        }
        free(tname);
        free(file);
    }

out_refs:
    for (size_t r = 0; r < nrefs; r++) {
        free(refs[r].file);
        free(refs[r].first_tensor);
    }
    free(refs);
    free(dir);
out_doc:
    json_doc_free(&d);
out_text:
    pg_file_free(text);
    return rc;
}

int st_open(st_file **out, const char *path, pg_error *err)
{
    *out = NULL;
    st_file *f = calloc(1, sizeof *f);
    if (!f)
        return pg_error_set(err, PG_ENOMEM, "%s: out of memory", path);
    int rc;
    if (pg_dir_exists(path)) {
        char *idx = pg_path_join(path, ST_INDEX_NAME);
        char *one = pg_path_join(path, ST_SINGLE_NAME);
        if (!idx || !one)
            rc = pg_error_set(err, PG_ENOMEM, "%s: out of memory", path);
        else if (pg_file_exists(idx))
            rc = open_index(f, idx, err);
        else if (pg_file_exists(one))
            rc = open_single(f, one, err);
        else
            rc = pg_error_set(err, PG_EIO, "%s: expected %s or %s in this folder, found neither", path,
                              ST_INDEX_NAME, ST_SINGLE_NAME);
        free(idx);
        free(one);
    } else if (ends_with(path, ".json")) {
        rc = open_index(f, path, err);
    } else {
        rc = open_single(f, path, err);
    }
    if (rc) {
        st_close(f);
        return rc;
    }
    *out = f;
    return PG_OK;
}

size_t st_count(const st_file *f)
{
    return f->n;
}

const st_tensor *st_at(const st_file *f, size_t i)
{
    return i < f->n ? &f->t[i] : NULL;
}

const st_tensor *st_find(const st_file *f, const char *name)
{
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->t[mid].name, name);
        if (c == 0)
            return &f->t[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* "[288,96]" into buf. */
static void fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int k = 0; k < ndim && o < cap; k++)
        o += (size_t)snprintf(buf + o, cap - o, k ? ",%" PRId64 : "%" PRId64, shape[k]);
    if (o < cap)
        snprintf(buf + o, cap - o, "]");
}

int st_get(const st_file *f, const char *name, int want_any_float, st_dtype want, int ndim,
           const int64_t *shape, const st_tensor **out, pg_error *err)
{
    *out = NULL;
    const st_tensor *t = st_find(f, name);
    if (!t)
        return pg_error_set(err, PG_EFORMAT, "%s: tensor '%s' not found", f->label, name);
    int ok = want_any_float ? st_dtype_is_float_weight(t->dtype) : t->dtype == want;
    ok = ok && t->ndim == ndim;
    for (int k = 0; ok && k < ndim; k++)
        ok = t->shape[k] == shape[k];
    if (!ok) {
        char exp[160], got[160];
        fmt_shape(exp, sizeof exp, ndim, shape);
        fmt_shape(got, sizeof got, t->ndim, t->shape);
        return pg_error_set(err, PG_EFORMAT, "%s: tensor '%s': expected %s %s, got %s %s", t->file, name, exp,
                            want_any_float ? "F32|F16|BF16" : st_dtype_name(want), got, st_dtype_name(t->dtype));
    }
    *out = t;
    return PG_OK;
}
