/* ops_support: see ops_support.h. */
#include "ops_support.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

void *ops_dev_alloc(executor *ex, exec_buf_kind kind, size_t n)
{
    void *d = ex->op->alloc(ex, kind, n + OPS_GUARD);
    if (!d)
        fail_msg("%s: alloc of %zu elements failed: %s", ex->name, n + OPS_GUARD, ex->op->last_error(ex));
    return d;
}

static void ops_upload(executor *ex, void *d, exec_buf_kind kind, size_t off, const float *h, size_t n)
{
    int rc = ex->op->upload(ex, d, kind, off, h, ST_F32, n);
    if (rc)
        fail_msg("%s: upload failed: %s", ex->name, ex->op->last_error(ex));
}

void ops_dev_put(executor *ex, void *d, exec_buf_kind kind, const float *h, size_t n)
{
    float guard[OPS_GUARD];
    for (int i = 0; i < OPS_GUARD; i++)
        guard[i] = OPS_GUARD_VALUE;
    if (n)
        ops_upload(ex, d, kind, 0, h, n);
    ops_upload(ex, d, kind, n, guard, OPS_GUARD);
}

void ops_dev_put_rt(executor *ex, void *d, exec_buf_kind kind, float *h, size_t n)
{
    ops_dev_put(ex, d, kind, h, n);
    ops_dev_get(ex, h, d, kind, n, "input round trip");
}

void ops_dev_poison(executor *ex, void *d, exec_buf_kind kind, size_t n)
{
    float *nan = malloc((n ? n : 1) * sizeof *nan);
    assert_non_null(nan);
    for (size_t i = 0; i < n; i++)
        nan[i] = NAN;
    ops_dev_put(ex, d, kind, nan, n);
    free(nan);
}

void ops_dev_get(executor *ex, float *h, const void *d, exec_buf_kind kind, size_t n, const char *what)
{
    float *tmp = malloc((n + OPS_GUARD) * sizeof *tmp);
    assert_non_null(tmp);
    if (ex->op->sync(ex) != 0 || ex->op->download_f32(ex, tmp, d, kind, n + OPS_GUARD) != 0)
        fail_msg("%s: %s: download failed: %s", ex->name, what, ex->op->last_error(ex));
    for (int i = 0; i < OPS_GUARD; i++)
        if (tmp[n + (size_t)i] != OPS_GUARD_VALUE)
            fail_msg("%s: %s: guard element %d after %zu elements overwritten (%g)", ex->name, what, i, n,
                     (double)tmp[n + (size_t)i]);
    memcpy(h, tmp, n * sizeof *h);
    free(tmp);
}

void ops_check_close(const float *got, const double *ref, size_t n, double tol, const char *what)
{
    double max_ref = 0.0, max_err = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]))
            fail_msg("%s: element %zu is %g (reference %g)", what, i, (double)got[i], ref[i]);
        double e = fabs((double)got[i] - ref[i]);
        if (e > max_err) {
            max_err = e;
            worst = i;
        }
        if (fabs(ref[i]) > max_ref)
            max_ref = fabs(ref[i]);
    }
    double bound = tol * (max_ref > 1e-3 ? max_ref : 1e-3);
    if (max_err > bound)
        fail_msg("%s: max error %.3g at element %zu (got %.9g, reference %.9g) > %.3g (tol %.1g x max|ref| %.3g)",
                 what, max_err, worst, n ? (double)got[worst] : 0.0, n ? ref[worst] : 0.0, bound, tol, max_ref);
}

static int32_t *ops_ints(size_t n)
{
    int32_t *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

static void ops_batch_finish(ops_batch *ob, int32_t S, int32_t T, int32_t block_size, int32_t stride)
{
    step_batch *b = &ob->b;
    memset(b, 0, sizeof *b);
    b->num_tokens = T;
    b->num_seqs = S;
    b->block_size = block_size;
    b->token_ids = ob->token_ids;
    b->positions = ob->positions;
    b->slots = ob->slots;
    b->query_start = ob->query_start;
    b->seq_lens = ob->seq_lens;
    b->block_tables = ob->block_tables;
    b->block_table_stride = stride;
    b->num_logits = S;
    b->logits_rows = ob->logits_rows;
    for (int32_t s = 0; s < S; s++) {
        int32_t q = ob->query_start[s + 1] - ob->query_start[s];
        if (ob->seq_lens[s] > b->max_seq_len)
            b->max_seq_len = ob->seq_lens[s];
        if (q > b->max_query_len)
            b->max_query_len = q;
        ob->logits_rows[s] = ob->query_start[s + 1] - 1;
    }
    /* slots and positions from the tables */
    for (int32_t s = 0; s < S; s++) {
        int32_t q0 = ob->query_start[s], q1 = ob->query_start[s + 1];
        for (int32_t t = q0; t < q1; t++) {
            int32_t p = ob->seq_lens[s] - (q1 - t);
            ob->positions[t] = p;
            ob->slots[t] = ob->block_tables[(int64_t)s * stride + p / block_size] * block_size + p % block_size;
        }
    }
}

void ops_batch_build(ops_batch *ob, const ops_seq_spec *specs, int32_t S, int32_t block_size,
                     int32_t vocab, pg_test_rng *rng)
{
    memset(ob, 0, sizeof *ob);
    int32_t T = 0, need = 0, stride = 1;
    for (int32_t s = 0; s < S; s++) {
        assert_true(specs[s].q_len >= 1 && specs[s].q_len <= specs[s].seq_len);
        T += specs[s].q_len;
        int32_t nb = (specs[s].seq_len + block_size - 1) / block_size;
        need += nb;
        if (nb + 1 > stride)
            stride = nb + 1;
    }
    ob->num_blocks = 2 * need + 3;
    int32_t *perm = ops_ints((size_t)ob->num_blocks);
    for (int32_t i = 0; i < ob->num_blocks; i++)
        perm[i] = i;
    for (int32_t i = ob->num_blocks - 1; i > 0; i--) {
        int32_t j = pg_test_rng_int(rng, 0, i), tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    ob->token_ids = ops_ints((size_t)T);
    ob->positions = ops_ints((size_t)T);
    ob->slots = ops_ints((size_t)T);
    ob->query_start = ops_ints((size_t)S + 1);
    ob->seq_lens = ops_ints((size_t)S);
    ob->block_tables = ops_ints((size_t)S * (size_t)stride);
    ob->logits_rows = ops_ints((size_t)S);
    int32_t next = 0;
    for (int32_t s = 0; s < S; s++) {
        ob->query_start[s + 1] = ob->query_start[s] + specs[s].q_len;
        ob->seq_lens[s] = specs[s].seq_len;
        int32_t nb = (specs[s].seq_len + block_size - 1) / block_size;
        for (int32_t k = 0; k < stride; k++)
            ob->block_tables[(int64_t)s * stride + k] = k < nb ? perm[next++] : -1;
    }
    for (int32_t t = 0; t < T; t++)
        ob->token_ids[t] = pg_test_rng_int(rng, 0, vocab - 1);
    free(perm);
    ops_batch_finish(ob, S, T, block_size, stride);
}

void ops_batch_extract(ops_batch *out, const ops_batch *in, int32_t s)
{
    memset(out, 0, sizeof *out);
    const int32_t stride = in->b.block_table_stride;
    const int32_t q0 = in->query_start[s], q1 = in->query_start[s + 1], T = q1 - q0;
    out->num_blocks = in->num_blocks;
    out->token_ids = ops_ints((size_t)T);
    out->positions = ops_ints((size_t)T);
    out->slots = ops_ints((size_t)T);
    out->query_start = ops_ints(2);
    out->seq_lens = ops_ints(1);
    out->block_tables = ops_ints((size_t)stride);
    out->logits_rows = ops_ints(1);
    memcpy(out->token_ids, in->token_ids + q0, (size_t)T * sizeof(int32_t));
    memcpy(out->block_tables, in->block_tables + (int64_t)s * stride, (size_t)stride * sizeof(int32_t));
    out->query_start[1] = T;
    out->seq_lens[0] = in->seq_lens[s];
    ops_batch_finish(out, 1, T, in->b.block_size, stride);
}

void ops_batch_free(ops_batch *ob)
{
    free(ob->token_ids);
    free(ob->positions);
    free(ob->slots);
    free(ob->query_start);
    free(ob->seq_lens);
    free(ob->block_tables);
    free(ob->logits_rows);
    memset(ob, 0, sizeof *ob);
}
