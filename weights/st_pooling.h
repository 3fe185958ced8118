/* st_pooling: what a sentence-transformers model folder says about its
 * embeddings, read as vLLM reads it (vllm/transformers_utils/config.py
 * get_pooling_config; model_config.is_matryoshka / matryoshka_dimensions):
 *
 *   modules.json            [{"type": "sentence_transformers.models.Pooling",
 *                             "path": "1_Pooling"}, {"type": "...Normalize"}, ...]
 *   <path>/config.json      {"pooling_mode_lasttoken": true, ...}: the first
 *                           pooling_mode_* key that is true names the pooling
 *   config.json             "is_matryoshka": bool, "matryoshka_dimensions": [int]
 *
 * Parsers are pure functions over a buffer; st_pooling_load reads the
 * files. Plain data out. Only the modes pagedgen pools (last, mean, cls)
 * are accepted; max, weightedmean, mean_sqrt_len are refused by name.
 */
#ifndef PG_ST_POOLING_H
#define PG_ST_POOLING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pg_error.h"

#define ST_POOLING_MAX_DIMS 32

typedef enum st_pool_mode {
    ST_POOL_NONE = 0,   /* no Pooling module (or no modules.json) */
    ST_POOL_LAST,       /* pooling_mode_lasttoken */
    ST_POOL_MEAN,       /* pooling_mode_mean_tokens */
    ST_POOL_CLS,        /* pooling_mode_cls_token */
} st_pool_mode;

typedef struct st_pooling_config {
    bool has_modules;       /* modules.json was found */
    st_pool_mode mode;      /* ST_POOL_NONE without a Pooling module */
    bool normalize;         /* a sentence_transformers.models.Normalize module */
    bool is_matryoshka;     /* config.json is_matryoshka, or matryoshka_dimensions given */
    int32_t matryoshka_dims[ST_POOLING_MAX_DIMS]; /* config.json matryoshka_dimensions */
    int32_t n_matryoshka_dims;                    /* 0: any dimensions (if is_matryoshka) */
} st_pooling_config;

/* modules.json text -> has_modules, normalize, and the Pooling module's
 * folder in *pool_path (malloc'd, NULL when there is none). PG_EFORMAT
 * naming label for anything that is not a list of {"type", "path"} objects. */
int st_pooling_parse_modules(st_pooling_config *c, char **pool_path, const char *json, size_t len,
                             const char *label, pg_error *err);
/* 1_Pooling/config.json text -> mode. PG_EFORMAT when no mode is true;
 * PG_EUNSUPPORTED for a mode pagedgen does not pool. */
int st_pooling_parse_pooling(st_pooling_config *c, const char *json, size_t len, const char *label,
                             pg_error *err);
/* config.json text -> is_matryoshka, matryoshka_dims (other keys ignored). */
int st_pooling_parse_matryoshka(st_pooling_config *c, const char *json, size_t len,
                                const char *label, pg_error *err);

/* Reads model_dir's modules.json (absent: has_modules false, mode NONE),
 * its Pooling config, and config.json's matryoshka keys. On error *out is
 * zeroed and the message names the file. */
int st_pooling_load(st_pooling_config *out, const char *model_dir, pg_error *err);

#endif /* PG_ST_POOLING_H */
