/* tests/core/test_engine_greedy: the engine's device-greedy plumbing
 * (engine_backend greedy_rows) over the fake backend, with a greedy_rows
 * that does what the CUDA executor does — the argmax of each marked row
 * (core/sampler.c's rule: strict >, ties -> lowest id) into ids — and then
 * poisons the marked rows with NaN, so a row the engine still samples on
 * the host after marking it fails the step. A batch mixing plain greedy
 * requests with sampled, logprobs, penalty, min_tokens, n = 2 and
 * prompt-logprobs ones (eos on, a small pool: preemptions) must give the
 * same outputs bit for bit with the path on and off (greedy_rows NULL),
 * and the rows marked must be exactly the plain greedy requests' tokens. */
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
#include "test_support.h"

enum { V = 96, NREQ = 24, MAXS = 6, MAXOUT = 12 };

typedef struct greedy_backend {
    engine_backend inner;
    const uint8_t *mask;          /* pending for the next forward (NULL: none) */
    int32_t *ids;
    int32_t L;
    uint64_t marked, calls;
} greedy_backend;

static int gb_forward(void *ctx, const step_batch *b, float *logits, pg_error *err)
{
    greedy_backend *gb = ctx;
    const uint8_t *mask = gb->mask;
    gb->mask = NULL; /* for this forward only */
    int rc = gb->inner.forward(gb->inner.ctx, b, logits, err);
    if (rc || !mask)
        return rc;
    if (gb->L != b->num_logits)
        return pg_error_set(err, PG_EINVAL, "greedy mask of %d rows, step of %d", (int)gb->L,
                            (int)b->num_logits);
    for (int32_t r = 0; r < gb->L; r++) {
        if (!mask[r]) continue;
        float *row = logits + (size_t)r * V, best = -INFINITY;
        int32_t id = -1;
        for (int32_t v = 0; v < V; v++)
            if (row[v] > best) {
                best = row[v];
                id = v;
            }
        gb->ids[r] = id;
        for (int32_t v = 0; v < V; v++)
            row[v] = NAN; /* never read: the host sampler would fail on it */
        gb->marked++;
    }
    return PG_OK;
}

static int gb_greedy(void *ctx, const uint8_t *greedy, int32_t L, int32_t *ids, pg_error *err)
{
    greedy_backend *gb = ctx;
    (void)err;
    gb->calls++;
    gb->mask = L > 0 ? greedy : NULL;
    gb->ids = ids;
    gb->L = L;
    return PG_OK;
}

static int gb_copy(void *ctx, const int32_t *src_dst, int32_t n, pg_error *err)
{
    greedy_backend *gb = ctx;
    return gb->inner.copy_blocks(gb->inner.ctx, src_dst, n, err);
}

typedef struct result {
    int32_t n_out[2], out[2][MAXOUT + 1];
    float lp[2][MAXOUT + 1];
    int finish[2];
    bool done;
} result;

/* Request k: kind k % 8 — 0, 3, 6: plain greedy; 1: sampled; 2: greedy
 * with logprobs; 4: greedy with a repetition penalty; 5: greedy with
 * min_tokens 3 (eos banned for its first 3 tokens, plain after); 7: greedy n = 2, or (k = 15) greedy
 * with prompt logprobs. */
static sampling_params params_of(int k)
{
    sampling_params sp = sampling_params_default();
    sp.temperature = 0.0f;
    sp.max_tokens = 4 + k % 9;
    switch (k % 8) {
    case 1: sp.temperature = 0.9f; sp.seed = 11u + (uint64_t)k; break;
    case 2: sp.logprobs = 3; break;
    case 4: sp.repetition_penalty = 1.4f; break;
    case 5: sp.min_tokens = 3; break;
    case 7:
        if (k == 15) sp.prompt_logprobs = 2;
        else sp.n = 2;
        break;
    default: break;
    }
    return sp;
}

static bool plain(int k) { return k % 8 == 0 || k % 8 == 3 || k % 8 == 6; }

static void run(bool device_greedy, result *res, uint64_t *marked, uint64_t *preempted)
{
    fake_backend_params fp = {.vocab_size = V, .num_blocks = 12, .block_size = 4, .window = 3, .salt = 9};
    fake_backend *f = fake_backend_create(&fp);
    assert_non_null(f);
    greedy_backend gb = {.inner = fake_backend_iface(f)};
    engine_backend be = {.ctx = &gb, .vocab_size = V, .forward = gb_forward, .copy_blocks = gb_copy,
                         .greedy_rows = device_greedy ? gb_greedy : NULL};
    const int32_t eos = 5;
    engine_params ep = engine_params_default();
    ep.block_size = 4;
    ep.num_blocks = 12;
    ep.max_num_seqs = MAXS;
    ep.max_num_batched_tokens = 16;
    ep.max_model_len = 40;
    ep.check_invariants = true;
    ep.watermark = 0.0f;
    ep.eos_token_ids = &eos;
    ep.n_eos_token_ids = 1;
    engine *e = NULL;
    pg_error err;
    assert_int_equal(engine_create(&e, &ep, &be, NULL, &err), PG_OK);
    fake_backend_attach(f, e);
    if (fake_backend_add_requests(f, e, NREQ, V, params_of, &err))
        fail_msg("%s", err.msg);
    while (engine_has_unfinished(e)) {
        if (engine_step(e, &err))
            fail_msg("device greedy %d: step: %s (fake backend: %s)", (int)device_greedy, err.msg,
                     fake_backend_error(f) ? fake_backend_error(f) : "ok");
        request_output *o;
        while (engine_pop_finished(e, &o)) {
            int k = (int)(intptr_t)o->user;
            assert_true(k >= 0 && k < NREQ && !res[k].done && o->n_outputs <= 2);
            for (int32_t j = 0; j < o->n_outputs; j++) {
                const seq_output *so = &o->outputs[j];
                assert_true(so->n_tokens <= MAXOUT + 1);
                res[k].n_out[j] = so->n_tokens;
                memcpy(res[k].out[j], so->token_ids, (size_t)so->n_tokens * sizeof(int32_t));
                if (so->token_logprobs)
                    memcpy(res[k].lp[j], so->token_logprobs, (size_t)so->n_tokens * sizeof(float));
                res[k].finish[j] = (int)so->finish;
            }
            res[k].done = true;
            request_output_free(o);
        }
    }
    engine_stats st;
    engine_get_stats(e, &st);
    *preempted = st.preemptions;
    *marked = gb.marked;
    assert_null(fake_backend_error(f));
    engine_destroy(e);
    fake_backend_destroy(f);
}

static void test_same_outputs(void **state)
{
    (void)state;
    static result on[NREQ], off[NREQ];
    uint64_t marked_on, marked_off, pre_on, pre_off;
    run(true, on, &marked_on, &pre_on);
    run(false, off, &marked_off, &pre_off);
    uint64_t plain_tokens = 0, maybe = 0;
    for (int k = 0; k < NREQ; k++) {
        assert_true(on[k].done && off[k].done);
        assert_memory_equal(&on[k], &off[k], sizeof on[k]);
        if (plain(k)) plain_tokens += (uint64_t)on[k].n_out[0];
        /* min_tokens: a plain argmax once the eos is no longer banned */
        if (k % 8 == 5 && on[k].n_out[0] > 3) plain_tokens += (uint64_t)on[k].n_out[0] - 3;
        /* n = 2 as two fanned-out requests of n = 1 (each its own row), and
         * prompt logprobs once no prompt row is in the step, may be too */
        if (k % 8 == 7) maybe += (uint64_t)on[k].n_out[0] + (uint64_t)on[k].n_out[1];
    }
    printf("    plain greedy tokens %llu (+ up to %llu), rows taken as ids %llu, preemptions %llu\n",
           (unsigned long long)plain_tokens, (unsigned long long)maybe, (unsigned long long)marked_on,
           (unsigned long long)pre_on);
    assert_int_equal(marked_off, 0);
    /* every plain greedy token came from a marked row, no sampled, logprobs
     * or penalized request's (one sampling row per generated token) */
    assert_true(marked_on >= plain_tokens && marked_on <= plain_tokens + maybe);
    assert_true(plain_tokens > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_outputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
