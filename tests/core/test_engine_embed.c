/* tests/core/test_engine_embed: embedding requests in the engine over the
 * fake backend (which checks every KV write and read, prefix-cache
 * sharing and recomputation), with a hidden_rows that derives each row
 * from its (token, position): a random mix of generation and last / mean /
 * cls embedding requests in a small pool — chunked prefill, prefix-cache
 * hits, preemptions — must give every embedding the exact bits of the
 * pooler fed the whole prompt at once, and the generation requests the
 * outputs they get alone. Also: refusals (no hidden_rows, bad params). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"
#include "fake_backend.h"
#include "pooling.h"
#include "test_support.h"

enum { H = 6, V = 64, TMAX = 16 };

/* The fake backend plus hidden rows: row (token t, position p)[j] =
 * sin(0.37 t + 1.3 p + 0.11 j) — a wrong row, position or offset changes it. */
typedef struct embed_backend {
    engine_backend inner;
    int32_t tok[TMAX], pos[TMAX], T;
    uint64_t rows_asked;
} embed_backend;

static void row_of(int32_t t, int32_t p, float *out)
{
    for (int j = 0; j < H; j++)
        out[j] = (float)sin(0.37 * t + 1.3 * p + 0.11 * j);
}

static int eb_forward(void *ctx, const step_batch *b, float *logits, pg_error *err)
{
    embed_backend *eb = ctx;
    assert_true(b->num_tokens <= TMAX);
    memcpy(eb->tok, b->token_ids, (size_t)b->num_tokens * sizeof(int32_t));
    memcpy(eb->pos, b->positions, (size_t)b->num_tokens * sizeof(int32_t));
    eb->T = b->num_tokens;
    return eb->inner.forward(eb->inner.ctx, b, logits, err);
}

static int eb_copy(void *ctx, const int32_t *src_dst, int32_t n, pg_error *err)
{
    embed_backend *eb = ctx;
    return eb->inner.copy_blocks(eb->inner.ctx, src_dst, n, err);
}

static int eb_hidden(void *ctx, int32_t row0, int32_t n, float *out, pg_error *err)
{
    embed_backend *eb = ctx;
    if (row0 < 0 || n < 1 || row0 + n > eb->T)
        return pg_error_set(err, PG_EINVAL, "hidden_rows %d+%d outside the step's %d rows", (int)row0, (int)n,
                            (int)eb->T);
    for (int32_t r = 0; r < n; r++)
        row_of(eb->tok[row0 + r], eb->pos[row0 + r], out + (size_t)r * H);
    eb->rows_asked += (uint64_t)n;
    return PG_OK;
}

/* What the pooler gives with the whole prompt at once. */
static void expected(const int32_t *ids, int32_t n, const pooling_params *pp, float *out, int32_t *dim)
{
    float *rows = malloc((size_t)n * H * sizeof *rows);
    assert_non_null(rows);
    for (int32_t p = 0; p < n; p++)
        row_of(ids[p], p, rows + (size_t)p * H);
    pooler *pl;
    pg_error err;
    assert_int_equal(pooler_create(&pl, pp, H, n, &err), PG_OK);
    pooler_add(pl, 0, rows, n);
    float *v;
    assert_int_equal(pooler_finish(pl, &v, dim, &err), PG_OK);
    memcpy(out, v, (size_t)*dim * sizeof *v);
    free(v);
    pooler_destroy(pl);
    free(rows);
}

enum { NREQ = 48 };

typedef struct req {
    int32_t ids[24];
    int32_t n;
    bool embed;
    pooling_params pp;
    sampling_params sp;
} req;

typedef struct result {
    float vec[H];
    int32_t dim;
    int32_t out[16];
    int32_t n_out;
    bool done;
} result;

/* Runs reqs[lo..hi) (all if lo = 0, hi = NREQ) in one engine. */
static uint64_t run(const req *reqs, int lo, int hi, int32_t num_blocks, result *res, uint64_t *preempt)
{
    fake_backend_params fp = {.vocab_size = V, .num_blocks = num_blocks, .block_size = 4, .window = 3, .salt = 5};
    fake_backend *f = fake_backend_create(&fp);
    assert_non_null(f);
    embed_backend eb = {.inner = fake_backend_iface(f)};
    engine_backend be = {.ctx = &eb, .vocab_size = V, .forward = eb_forward, .copy_blocks = eb_copy,
                         .hidden_rows = eb_hidden, .hidden_size = H};
    engine_params ep = engine_params_default();
    ep.block_size = 4;
    ep.num_blocks = num_blocks;
    ep.max_num_seqs = 6;
    ep.max_num_batched_tokens = TMAX;
    ep.max_model_len = 40;
    ep.check_invariants = true;
    ep.watermark = 0.0f;
    engine *e = NULL;
    pg_error err;
    assert_int_equal(engine_create(&e, &ep, &be, NULL, &err), PG_OK);
    fake_backend_attach(f, e);
    for (int k = lo; k < hi; k++) {
        uint64_t id;
        int rc = reqs[k].embed ? engine_add_embed_request(e, reqs[k].ids, reqs[k].n, &reqs[k].pp, (void *)(intptr_t)k,
                                                          &id, &err)
                               : engine_add_request(e, reqs[k].ids, reqs[k].n, &reqs[k].sp, (void *)(intptr_t)k,
                                                    &id, &err);
        if (rc)
            fail_msg("request %d: %s", k, err.msg);
        fake_backend_set_prompt(f, id, reqs[k].ids, reqs[k].n);
    }
    while (engine_has_unfinished(e)) {
        if (engine_step(e, &err))
            fail_msg("step: %s (backend: %s)", err.msg, fake_backend_error(f) ? fake_backend_error(f) : "ok");
        request_output *o;
        while (engine_pop_finished(e, &o)) {
            int k = (int)(intptr_t)o->user;
            result *r = &res[k];
            r->done = true;
            if (reqs[k].embed) {
                assert_int_equal(o->n_outputs, 0);
                assert_non_null(o->embedding);
                r->dim = o->n_embedding;
                memcpy(r->vec, o->embedding, (size_t)o->n_embedding * sizeof(float));
            } else {
                assert_null(o->embedding);
                r->n_out = o->outputs[0].n_tokens;
                memcpy(r->out, o->outputs[0].token_ids, (size_t)r->n_out * sizeof(int32_t));
            }
            request_output_free(o);
        }
    }
    engine_stats st;
    engine_get_stats(e, &st);
    *preempt = st.preemptions;
    uint64_t hits = st.prefix_cache_hits;
    engine_destroy(e);
    fake_backend_destroy(f);
    return hits;
}

static void test_mixed_soak(void **state)
{
    (void)state;
    static req reqs[NREQ];
    pg_test_rng rng = {2026};
    const int32_t shared[8] = {1, 11, 12, 13, 14, 15, 16, 17}; /* a common prefix: prefix-cache hits */
    for (int k = 0; k < NREQ; k++) {
        req *q = &reqs[k];
        q->n = 2 + (int32_t)(pg_test_rng_next(&rng) % 20);
        bool pre = pg_test_rng_next(&rng) % 2;
        for (int32_t p = 0; p < q->n; p++)
            q->ids[p] = pre && p < 8 ? shared[p] : (int32_t)(3 + pg_test_rng_next(&rng) % (V - 3));
        q->embed = pg_test_rng_next(&rng) % 2 != 0;
        q->pp.type = (pooling_type)(pg_test_rng_next(&rng) % 3);
        q->pp.normalize = pg_test_rng_next(&rng) % 4 != 0;
        q->pp.dimensions = pg_test_rng_next(&rng) % 4 == 0 ? 3 : 0;
        q->sp = sampling_params_default();
        q->sp.temperature = 0.0f;
        q->sp.max_tokens = 1 + (int32_t)(pg_test_rng_next(&rng) % 16);
        q->sp.ignore_eos = true;
    }
    static result all[NREQ], alone[NREQ];
    uint64_t pre_all, pre_one, hits = run(reqs, 0, NREQ, 10, all, &pre_all);
    uint64_t max_pre = 0;
    for (int k = 0; k < NREQ; k++) {
        run(reqs, k, k + 1, 10, alone, &pre_one);
        max_pre = pre_one > max_pre ? pre_one : max_pre;
    }
    printf("    %d requests in a pool of 10 blocks of 4: %llu prefix-cache hits, %llu preemptions\n", NREQ,
           (unsigned long long)hits, (unsigned long long)pre_all);
    assert_true(pre_all > 0 && hits > 0);
    int n_embed = 0;
    for (int k = 0; k < NREQ; k++) {
        assert_true(all[k].done && alone[k].done);
        if (!reqs[k].embed) {
            assert_int_equal(all[k].n_out, alone[k].n_out);
            assert_memory_equal(all[k].out, alone[k].out, (size_t)all[k].n_out * sizeof(int32_t));
            continue;
        }
        n_embed++;
        float want[H];
        int32_t d;
        expected(reqs[k].ids, reqs[k].n, &reqs[k].pp, want, &d);
        assert_int_equal(all[k].dim, d);
        assert_memory_equal(all[k].vec, want, (size_t)d * sizeof(float));
        assert_memory_equal(alone[k].vec, want, (size_t)d * sizeof(float));
    }
    assert_true(n_embed > NREQ / 3);
}

static void test_refusals(void **state)
{
    (void)state;
    fake_backend_params fp = {.vocab_size = V, .num_blocks = 8, .block_size = 4, .window = 3};
    fake_backend *f = fake_backend_create(&fp);
    engine_backend be = fake_backend_iface(f); /* no hidden_rows */
    engine_params ep = engine_params_default();
    ep.block_size = 4;
    ep.num_blocks = 8;
    engine *e = NULL;
    pg_error err;
    assert_int_equal(engine_create(&e, &ep, &be, NULL, &err), PG_OK);
    const int32_t ids[3] = {1, 2, 3};
    pooling_params pp = {.type = POOLING_LAST, .normalize = true};
    assert_int_equal(engine_add_embed_request(e, ids, 3, &pp, NULL, NULL, &err), PG_EINVAL);
    printf("    %s\n", err.msg);
    engine_destroy(e);
    embed_backend eb = {.inner = be};
    engine_backend be2 = {.ctx = &eb, .vocab_size = V, .forward = eb_forward, .copy_blocks = eb_copy,
                          .hidden_rows = eb_hidden, .hidden_size = H};
    assert_int_equal(engine_create(&e, &ep, &be2, NULL, &err), PG_OK);
    pp.dimensions = H + 1;
    assert_int_equal(engine_add_embed_request(e, ids, 3, &pp, NULL, NULL, &err), PG_EINVAL);
    printf("    %s\n", err.msg);
    pp.dimensions = 0;
    const int32_t bad[2] = {1, V};
    assert_int_equal(engine_add_embed_request(e, bad, 2, &pp, NULL, NULL, &err), PG_EINVAL);
    printf("    %s\n", err.msg);
    assert_false(engine_has_unfinished(e));
    engine_destroy(e);
    fake_backend_destroy(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mixed_soak),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
