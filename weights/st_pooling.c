/* st_pooling: sentence-transformers pooling files (see st_pooling.h). */
#include "st_pooling.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file_io.h"
#include "json.h"

#define ST_POOLING_MAX_BYTES ((size_t)1 << 20)

int st_pooling_parse_modules(st_pooling_config *c, char **pool_path, const char *json, size_t len,
                             const char *label, pg_error *err)
{
    *pool_path = NULL;
    json_doc d;
    int rc = json_parse(&d, json, len, label, err);
    if (rc) return rc;
    if (!json_is_array(&d, 0)) {
        rc = pg_error_set(err, PG_EFORMAT, "%s: expected a list of modules", label);
        goto out;
    }
    c->has_modules = true;
    int n = json_size(&d, 0);
    for (int k = 0, t = 1; k < n; k++, t = json_skip(&d, t)) {
        int ty = json_is_object(&d, t) ? json_obj_get(&d, t, "type") : -1;
        if (ty < 0 || !json_is_string(&d, ty)) {
            rc = pg_error_set(err, PG_EFORMAT, "%s: module %d: expected an object with a string 'type'",
                              label, k);
            goto out;
        }
        if (json_str_eq(&d, ty, "sentence_transformers.models.Normalize")) {
            c->normalize = true;
        } else if (json_str_eq(&d, ty, "sentence_transformers.models.Pooling") && !*pool_path) {
            /* vLLM takes the first Pooling module */
            int p = json_obj_get(&d, t, "path");
            size_t pl;
            if (p < 0 || !json_is_string(&d, p)) {
                rc = pg_error_set(err, PG_EFORMAT, "%s: module %d (Pooling): expected a string 'path'",
                                  label, k);
                goto out;
            }
            if ((rc = json_get_string(&d, p, pool_path, &pl, err))) goto out;
            if (pl == 0 || strlen(*pool_path) != pl || strstr(*pool_path, "..")) {
                rc = pg_error_set(err, PG_EFORMAT, "%s: module %d (Pooling): path '%s' is not a folder "
                                  "inside the model", label, k, *pool_path);
                goto out;
            }
        }
    }
out:
    if (rc) {
        free(*pool_path);
        *pool_path = NULL;
    }
    json_doc_free(&d);
    return rc;
}

int st_pooling_parse_pooling(st_pooling_config *c, const char *json, size_t len, const char *label,
                             pg_error *err)
{
    json_doc d;
    int rc = json_parse(&d, json, len, label, err);
    if (rc) return rc;
    if (!json_is_object(&d, 0)) {
        rc = pg_error_set(err, PG_EFORMAT, "%s: expected a json object", label);
        goto out;
    }
    /* vLLM: the first key whose value is true, "pooling_mode_" and
     * "_tokens"/"_token" stripped, must name a supported pooling type */
    int n = json_size(&d, 0);
    rc = pg_error_set(err, PG_EFORMAT, "%s: expected a pooling_mode_* key set to true, found none", label);
    for (int k = 0, key = 1; k < n; k++) {
        int v = key + 1;
        size_t kl;
        const char *ks = json_raw(&d, key, &kl);
        bool on = false;
        pg_error e2;
        if (json_is_bool(&d, v) && json_get_bool(&d, v, &on, &e2) == PG_OK && on && kl > 13 &&
            strncmp(ks, "pooling_mode_", 13) == 0) {
            if (json_str_eq(&d, key, "pooling_mode_lasttoken"))
                c->mode = ST_POOL_LAST, rc = PG_OK;
            else if (json_str_eq(&d, key, "pooling_mode_mean_tokens"))
                c->mode = ST_POOL_MEAN, rc = PG_OK;
            else if (json_str_eq(&d, key, "pooling_mode_cls_token"))
                c->mode = ST_POOL_CLS, rc = PG_OK;
            else
                rc = pg_error_set(err, PG_EUNSUPPORTED, "%s: %.*s: pagedgen pools lasttoken, mean_tokens "
                                  "or cls_token only", label, (int)kl, ks);
            break;
        }
        key = json_skip(&d, v);
    }
out:
    json_doc_free(&d);
    return rc;
}

int st_pooling_parse_matryoshka(st_pooling_config *c, const char *json, size_t len,
                                const char *label, pg_error *err)
{
    json_doc d;
    int rc = json_parse(&d, json, len, label, err);
    if (rc) return rc;
    if (!json_is_object(&d, 0)) {
        rc = pg_error_set(err, PG_EFORMAT, "%s: expected a json object", label);
        goto out;
    }
    int v = json_obj_get(&d, 0, "is_matryoshka");
    if (v >= 0 && !json_is_null(&d, v) && (rc = json_get_bool(&d, v, &c->is_matryoshka, err))) {
        rc = pg_error_set(err, PG_EFORMAT, "%s: is_matryoshka: expected a bool", label);
        goto out;
    }
    v = json_obj_get(&d, 0, "matryoshka_dimensions");
    if (v >= 0 && !json_is_null(&d, v)) {
        int n = json_is_array(&d, v) ? json_size(&d, v) : -1;
        if (n < 0 || n > ST_POOLING_MAX_DIMS) {
            rc = pg_error_set(err, PG_EFORMAT, "%s: matryoshka_dimensions: expected a list of at most %d "
                              "integers", label, ST_POOLING_MAX_DIMS);
            goto out;
        }
        for (int k = 0; k < n; k++) {
            int64_t x;
            if (json_get_int(&d, json_arr_at(&d, v, k), 1, INT32_MAX, &x, err)) {
                rc = pg_error_set(err, PG_EFORMAT, "%s: matryoshka_dimensions[%d]: expected an integer >= 1",
                                  label, k);
                goto out;
            }
            c->matryoshka_dims[k] = (int32_t)x;
        }
        c->n_matryoshka_dims = n;
        /* vLLM: is_matryoshka = bool(matryoshka_dimensions) or is_matryoshka */
        if (n > 0) c->is_matryoshka = true;
    }
out:
    json_doc_free(&d);
    return rc;
}

/* Reads dir/name (must exist) and runs parse over it. */
static int parse_file(st_pooling_config *c, const char *dir, const char *name, char **pool_path,
                      int which, pg_error *err)
{
    char *path = pg_path_join(dir, name);
    if (!path) return pg_error_set(err, PG_ENOMEM, "out of memory");
    char *text = NULL;
    size_t len = 0;
    int rc = pg_read_file(path, ST_POOLING_MAX_BYTES, &text, &len, err);
    if (!rc) {
        if (which == 0)
            rc = st_pooling_parse_modules(c, pool_path, text, len, path, err);
        else if (which == 1)
            rc = st_pooling_parse_pooling(c, text, len, path, err);
        else
            rc = st_pooling_parse_matryoshka(c, text, len, path, err);
    }
    pg_file_free(text);
    free(path);
    return rc;
}

int st_pooling_load(st_pooling_config *out, const char *model_dir, pg_error *err)
{
    st_pooling_config c;
    memset(&c, 0, sizeof c);
    memset(out, 0, sizeof *out);
    char *path = pg_path_join(model_dir, "modules.json");
    if (!path) return pg_error_set(err, PG_ENOMEM, "out of memory");
    int have = pg_file_exists(path);
    free(path);
    char *pool = NULL;
    int rc = PG_OK;
    if (have && !(rc = parse_file(&c, model_dir, "modules.json", &pool, 0, err)) && pool) {
        char *cfg = pg_path_join(pool, "config.json");
        rc = cfg ? parse_file(&c, model_dir, cfg, NULL, 1, err) : pg_error_set(err, PG_ENOMEM, "out of memory");
        free(cfg);
    }
    free(pool);
    if (!rc) {
        char *p = pg_path_join(model_dir, "config.json");
        if (!p) return pg_error_set(err, PG_ENOMEM, "out of memory");
        int exists = pg_file_exists(p);
        free(p);
        if (exists) rc = parse_file(&c, model_dir, "config.json", NULL, 2, err);
    }
    if (!rc) *out = c;
    return rc;
}
