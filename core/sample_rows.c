/* sample_rows: see sample_rows.h. */
#include "sample_rows.h"

#include <stdlib.h>
#include <string.h>

struct sample_rows {
    int32_t max_rows;
    pg_smp_row *rows;           /* [max_rows] */
    int32_t *ids;               /* [max_rows] */
    int32_t *pen_ids, *pen_cnt; /* [pen_cap] */
    int32_t pen_cap;
    int32_t *ban_ids;           /* [ban_cap] */
    int32_t ban_cap;
    uint32_t *mask;             /* [mask_cap] the rows' masks, 32-bit words */
    int32_t mask_cap;
    int32_t *added, *added_row; /* [added_cap] terminators let in, and their row */
    int32_t added_cap, n_added;
    pg_smp_batch b;
};

sample_rows *sample_rows_create(int32_t max_rows)
{
    if (max_rows < 1)
        return NULL;
    sample_rows *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->max_rows = max_rows;
    s->rows = calloc((size_t)max_rows, sizeof *s->rows);
    s->ids = calloc((size_t)max_rows, sizeof *s->ids);
    if (!s->rows || !s->ids) {
        sample_rows_destroy(s);
        return NULL;
    }
    return s;
}

void sample_rows_destroy(sample_rows *s)
{
    if (!s)
        return;
    free(s->rows);
    free(s->ids);
    free(s->pen_ids);
    free(s->pen_cnt);
    free(s->ban_ids);
    free(s->mask);
    free(s->added);
    free(s->added_row);
    free(s);
}

void sample_rows_reset(sample_rows *s, int32_t L)
{
    memset(&s->b, 0, sizeof s->b);
    s->b.L = L;
    s->b.rows = s->rows;
    s->b.ids = s->ids;
    s->n_added = 0;
}

/* Room for `more` entries past `used` in an array pair of capacity *cap. */
static int grow(int32_t **a, int32_t **b, int32_t *cap, int32_t used, int32_t more)
{
    if (used + more <= *cap)
        return PG_OK;
    int32_t n = *cap ? *cap : 1024;
    while (n < used + more)
        n *= 2;
    int32_t *x = realloc(*a, (size_t)n * sizeof *x);
    if (!x)
        return PG_ENOMEM;
    *a = x;
    if (b) {
        int32_t *y = realloc(*b, (size_t)n * sizeof *y);
        if (!y)
            return PG_ENOMEM;
        *b = y;
    }
    *cap = n;
    return PG_OK;
}

int32_t sample_rows_add(sample_rows *s, sampler_workspace *ws, const sampling_params *params,
                        const sampler_seq_view *seq, const sampler_rng *rng, int32_t row,
                        pg_error *err)
{
    pg_smp_batch *b = &s->b;
    if (b->n >= s->max_rows || row < 0 || row >= b->L || (b->n > 0 && s->rows[b->n - 1].row >= row))
        return pg_error_set(err, PG_EINVAL, "sample_rows: row %d: expected at most %d rows, ascending "
                            "in [0, %d)", (int)row, (int)s->max_rows, (int)b->L);
    const int32_t n_hist = seq ? seq->n_prompt + seq->n_output : 0, n_ban = seq ? seq->n_banned : 0;
    if (grow(&s->pen_ids, &s->pen_cnt, &s->pen_cap, b->n_pen, n_hist) ||
        grow(&s->ban_ids, NULL, &s->ban_cap, b->n_ban, n_ban))
        return pg_error_set(err, PG_ENOMEM, "sample_rows: out of memory");
    b->pen_ids = s->pen_ids;
    b->pen_cnt = s->pen_cnt;
    b->ban_ids = s->ban_ids;
    int32_t q = b->n;
    int rc = sampler_row_params(ws, params, seq, rng, &s->rows[q], s->pen_ids, s->pen_cnt, &b->n_pen,
                                s->ban_ids, &b->n_ban);
    if (rc)
        return pg_error_set(err, rc, "sample_rows: %s", sampler_workspace_error(ws));
    s->rows[q].row = row;
    s->ids[q] = -1;
    b->n++;
    return q;
}

int sample_rows_set_mask(sample_rows *s, int32_t q, const uint64_t *mask, int32_t V,
                         const int32_t *term, int32_t n_term, pg_error *err)
{
    pg_smp_batch *b = &s->b;
    const int32_t W = (V + 31) / 32;
    if (b->n_mask + W > s->mask_cap) {
        int32_t n = s->mask_cap ? s->mask_cap : 4 * W;
        while (n < b->n_mask + W)
            n *= 2;
        uint32_t *x = realloc(s->mask, (size_t)n * sizeof *x);
        if (!x)
            return pg_error_set(err, PG_ENOMEM, "sample_rows: out of memory for a mask");
        s->mask = x;
        s->mask_cap = n;
    }
    if (grow(&s->added, &s->added_row, &s->added_cap, s->n_added, n_term))
        return pg_error_set(err, PG_ENOMEM, "sample_rows: out of memory for a mask");
    b->mask = s->mask;
    uint32_t *m = s->mask + b->n_mask;
    memcpy(m, mask, (size_t)W * sizeof *m); /* 64-bit words, little-endian: two 32-bit ones each */
    for (int32_t i = 0; i < n_term; i++) {
        const int32_t t = term[i];
        if (t < 0 || t >= V || ((m[t >> 5] >> (t & 31)) & 1u))
            continue;
        m[t >> 5] |= 1u << (t & 31);
        s->added[s->n_added] = t;
        s->added_row[s->n_added++] = q;
    }
    s->rows[q].mask_first = b->n_mask;
    b->n_mask += W;
    return PG_OK;
}

void sample_rows_mask_of(const sample_rows *s, int32_t q, uint64_t *out, int32_t V)
{
    const int32_t W = (V + 31) / 32;
    uint32_t *o = (uint32_t *)(void *)out;
    memcpy(o, s->mask + s->rows[q].mask_first, (size_t)W * sizeof *o);
    if (W & 1)
        o[W] = 0; /* the 64-bit word's upper half */
    for (int32_t i = 0; i < s->n_added; i++)
        if (s->added_row[i] == q)
            o[s->added[i] >> 5] &= ~(1u << (s->added[i] & 31));
}

const pg_smp_batch *sample_rows_batch(const sample_rows *s)
{
    return &s->b;
}

int32_t sample_rows_id(const sample_rows *s, int32_t q)
{
    return s->ids[q];
}
