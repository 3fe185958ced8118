/* pooling: pooled embeddings from hidden rows (see pooling.h). */
#include "pooling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct pooler {
    pooling_params p;
    int32_t H;
    int32_t n_prompt;
    double *acc;        /* [H] sum (MEAN) or the row (LAST, CLS) */
    int32_t n_rows;     /* rows summed since the last start over */
    int32_t next_pos;   /* MEAN: the position the next row must have */
};

const char *pooling_type_name(pooling_type t)
{
    switch (t) {
    case POOLING_LAST: return "last";
    case POOLING_MEAN: return "mean";
    case POOLING_CLS: return "cls";
    }
    return NULL;
}

int pooling_type_parse(const char *s, pooling_type *out, pg_error *err)
{
    if (strcmp(s, "last") == 0 || strcmp(s, "lasttoken") == 0)
        *out = POOLING_LAST;
    else if (strcmp(s, "mean") == 0)
        *out = POOLING_MEAN;
    else if (strcmp(s, "cls") == 0)
        *out = POOLING_CLS;
    else
        return pg_error_set(err, PG_EINVAL, "pooling: expected last, mean or cls, got '%s'", s);
    return PG_OK;
}

int pooling_params_validate(const pooling_params *p, int32_t hidden, pg_error *err)
{
    if (!pooling_type_name(p->type))
        return pg_error_set(err, PG_EINVAL, "pooling: unknown type %d", (int)p->type);
    if (p->dimensions < 0 || p->dimensions > hidden)
        return pg_error_set(err, PG_EINVAL, "pooling: dimensions: expected 1..%d (the hidden size), got %d",
                            (int)hidden, (int)p->dimensions);
    return PG_OK;
}

int pooler_create(pooler **out, const pooling_params *p, int32_t hidden, int32_t n_prompt,
                  pg_error *err)
{
    *out = NULL;
    if (hidden < 1 || n_prompt < 1)
        return pg_error_set(err, PG_EINVAL, "pooler: expected hidden >= 1 and a prompt, got %d, %d",
                            (int)hidden, (int)n_prompt);
    int rc = pooling_params_validate(p, hidden, err);
    if (rc) return rc;
    pooler *pl = calloc(1, sizeof *pl);
    if (!pl || !(pl->acc = calloc((size_t)hidden, sizeof *pl->acc))) {
        free(pl);
        return pg_error_set(err, PG_ENOMEM, "pooler: out of memory (hidden %d)", (int)hidden);
    }
    pl->p = *p;
    pl->H = hidden;
    pl->n_prompt = n_prompt;
    *out = pl;
    return PG_OK;
}

void pooler_destroy(pooler *pl)
{
    if (!pl) return;
    free(pl->acc);
    free(pl);
}

bool pooler_needs_all_rows(const pooler *pl)
{
    return pl->p.type != POOLING_LAST;
}

void pooler_rows_wanted(const pooler *pl, int32_t start, int32_t n_new, int32_t *first,
                        int32_t *count)
{
    *first = 0;
    *count = 0;
    int32_t end = start + n_new; /* exclusive */
    if (end > pl->n_prompt) end = pl->n_prompt;
    if (start >= end) return;
    switch (pl->p.type) {
    case POOLING_LAST:
        if (end == pl->n_prompt) {
            *first = end - 1 - start;
            *count = 1;
        }
        return;
    case POOLING_MEAN:
        *count = end - start;
        return;
    case POOLING_CLS:
        if (start == 0) *count = 1;
        return;
    }
}

void pooler_add(pooler *pl, int32_t pos0, const float *rows, int32_t count)
{
    const int32_t H = pl->H;
    if (count <= 0) return;
    if (pl->p.type == POOLING_MEAN) {
        if (pos0 == 0 || pos0 != pl->next_pos) { /* start over (recomputation) */
            memset(pl->acc, 0, (size_t)H * sizeof *pl->acc);
            pl->n_rows = 0;
            if (pos0 != 0) return; /* a gap: refused at finish */
        }
        /* position order, one row at a time: the same sums however the
         * prompt was chunked */
        for (int32_t r = 0; r < count; r++)
            for (int32_t j = 0; j < H; j++) pl->acc[j] += (double)rows[(size_t)r * (size_t)H + (size_t)j];
        pl->n_rows += count;
        pl->next_pos = pos0 + count;
        return;
    }
    /* LAST, CLS: the one row, if among those handed over */
    int32_t want = pl->p.type == POOLING_LAST ? pl->n_prompt - 1 : 0;
    if (want < pos0 || want >= pos0 + count) return;
    const float *row = rows + (size_t)(want - pos0) * (size_t)H;
    for (int32_t j = 0; j < H; j++) pl->acc[j] = (double)row[j];
    pl->n_rows = 1;
}

int pooler_finish(pooler *pl, float **out, int32_t *dim, pg_error *err)
{
    *out = NULL;
    *dim = 0;
    int32_t want = pl->p.type == POOLING_MEAN ? pl->n_prompt : 1;
    if (pl->n_rows != want)
        return pg_error_set(err, PG_EINVAL, "pooler: expected %d hidden rows, got %d", (int)want,
                            (int)pl->n_rows);
    int32_t d = pl->p.dimensions > 0 ? pl->p.dimensions : pl->H;
    float *v = malloc((size_t)d * sizeof *v);
    if (!v) return pg_error_set(err, PG_ENOMEM, "pooler: out of memory");
    /* torch: hidden.mean(dim=0) = sum / n; F.normalize: x / max(||x||_2, 1e-12) */
    double scale = pl->p.type == POOLING_MEAN ? 1.0 / (double)pl->n_rows : 1.0;
    double ss = 0.0;
    for (int32_t j = 0; j < d; j++) {
        double x = pl->acc[j] * scale;
        ss += x * x;
    }
    double inv = 1.0;
    if (pl->p.normalize) {
        double nrm = sqrt(ss);
        inv = 1.0 / (nrm > 1e-12 ? nrm : 1e-12);
    }
    for (int32_t j = 0; j < d; j++) v[j] = (float)(pl->acc[j] * scale * inv);
    *out = v;
    *dim = d;
    return PG_OK;
}
