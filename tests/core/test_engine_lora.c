/* test_engine_lora: the engine's LoRA plumbing (issue 33) over the fake
 * backend (no model): every token row of a step carries its request's
 * adapter slot (step_batch.lora_slots = sampling_params.lora - 1, NULL
 * when no row has one); the running requests, so every step, use at most
 * engine_params.max_loras distinct adapters, and the limit is reached;
 * every request finishes (no deadlock) with max_loras 1 too, in a pool
 * small enough to preempt; requests naming an adapter the engine does not
 * hold are refused. */
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

enum { VOCAB = 97, N_LORAS = 4, NREQ = 40 };

typedef struct lora_rig {
    fake_backend *f;
    engine_backend inner;
    uint64_t seq_ids[256];
    int32_t qstart[257];
    int32_t num_seqs;
    int32_t max_loras;
    int32_t steps, max_distinct, null_steps;
    uint64_t preemptions;
    char err[256];
} lora_rig;

static int32_t lora_of(int k) { return k % (N_LORAS + 1); } /* request k: 0 (base), 1..4 */

static sampling_params params_of(int k)
{
    sampling_params sp = sampling_params_default();
    sp.temperature = 0.0f;
    sp.max_tokens = 5 + k % 9;
    sp.ignore_eos = true;
    sp.lora = lora_of(k);
    return sp;
}

static void on_step(void *user, const uint64_t *seq_ids, const int32_t *qstart, const int32_t *positions,
                    int32_t num_seqs)
{
    (void)positions;
    lora_rig *r = user;
    memcpy(r->seq_ids, seq_ids, (size_t)num_seqs * sizeof *seq_ids);
    memcpy(r->qstart, qstart, (size_t)(num_seqs + 1) * sizeof *qstart);
    r->num_seqs = num_seqs;
}

static int forward(void *ctx, const step_batch *b, float *logits, pg_error *err)
{
    lora_rig *r = ctx;
    int rc = r->inner.forward(r->inner.ctx, b, logits, err); /* calls on_step first */
    if (rc)
        return rc;
    r->steps++;
    bool seen[N_LORAS + 1] = {false};
    int32_t distinct = 0, any = 0;
    for (int32_t i = 0; i < r->num_seqs; i++) {
        const int32_t want = lora_of((int)(r->seq_ids[i] >> 8)) - 1; /* engine.c: id << 8 | index */
        any |= want >= 0;
        distinct += want >= 0 && !seen[want + 1];
        seen[want + 1] = true;
        for (int32_t t = r->qstart[i]; t < r->qstart[i + 1]; t++) {
            const int32_t got = b->lora_slots ? b->lora_slots[t] : -1;
            if (got != want && !r->err[0])
                snprintf(r->err, sizeof r->err, "step %d row %d (request %llu): slot %d, expected %d", r->steps,
                         (int)t, (unsigned long long)(r->seq_ids[i] >> 8), (int)got, (int)want);
        }
    }
    if (!any && b->lora_slots && !r->err[0])
        snprintf(r->err, sizeof r->err, "step %d: lora_slots set with no adapter row", r->steps);
    r->null_steps += !b->lora_slots;
    if (distinct > r->max_distinct)
        r->max_distinct = distinct;
    if (r->max_loras > 0 && distinct > r->max_loras && !r->err[0])
        snprintf(r->err, sizeof r->err, "step %d: %d distinct adapters, max_loras %d", r->steps, (int)distinct,
                 (int)r->max_loras);
    return 0;
}

static void run(int32_t max_loras, int32_t num_blocks, int32_t max_num_seqs, lora_rig *r)
{
    memset(r, 0, sizeof *r);
    r->max_loras = max_loras;
    fake_backend_params fp = {.vocab_size = VOCAB, .num_blocks = num_blocks, .block_size = 4, .window = 4,
                              .salt = 5};
    r->f = fake_backend_create(&fp);
    assert_non_null(r->f);
    fake_backend_on_step(r->f, on_step, r);
    r->inner = fake_backend_iface(r->f);
    engine_backend be = r->inner;
    be.ctx = r;
    be.forward = forward;
    be.forward_rows = NULL; /* no prompt logprobs here */
    engine_params ep = engine_params_default();
    ep.block_size = 4;
    ep.num_blocks = num_blocks;
    ep.max_num_seqs = max_num_seqs;
    ep.max_num_batched_tokens = 64;
    ep.max_model_len = 64;
    ep.n_loras = N_LORAS;
    ep.max_loras = max_loras;
    ep.watermark = 0.0f; /* admit eagerly: the small pools below preempt */
    engine *e = NULL;
    pg_error err;
    if (engine_create(&e, &ep, &be, NULL, &err))
        fail_msg("%s", err.msg);
    fake_backend_attach(r->f, e);
    if (fake_backend_add_requests(r->f, e, NREQ, VOCAB, params_of, &err))
        fail_msg("%s", err.msg);
    /* an adapter the engine does not hold */
    sampling_params bad = params_of(0);
    bad.lora = N_LORAS + 1;
    const int32_t ids[2] = {1, 2};
    assert_int_equal(engine_add_request(e, ids, 2, &bad, NULL, NULL, &err), PG_EINVAL);
    int guard = 0;
    while (engine_has_unfinished(e)) {
        if (engine_step(e, &err))
            fail_msg("step: %s (%s)", err.msg, fake_backend_error(r->f) ? fake_backend_error(r->f) : "");
        if (++guard > 5000)
            fail_msg("max_loras %d: no progress after 5000 steps", (int)max_loras);
        request_output *o;
        while (engine_pop_finished(e, &o))
            request_output_free(o);
    }
    if (r->err[0])
        fail_msg("max_loras %d: %s", (int)max_loras, r->err);
    engine_stats st;
    engine_get_stats(e, &st);
    assert_int_equal((int)st.requests_finished, NREQ);
    r->preemptions = st.preemptions;
    engine_destroy(e);
    fake_backend_destroy(r->f);
}

static void test_slots_and_limit(void **state)
{
    (void)state;
    lora_rig r;
    run(0, 256, 32, &r); /* no limit: up to all four at once */
    assert_int_equal(r.max_distinct, N_LORAS);
    run(2, 256, 32, &r);
    assert_int_equal(r.max_distinct, 2);
    run(1, 256, 32, &r);
    assert_int_equal(r.max_distinct, 1);
}

static void test_no_deadlock_preempting(void **state)
{
    (void)state;
    lora_rig r;
    run(1, 7, 8, &r); /* a pool of 7 blocks of 4 for prompts of up to 9 + 13 tokens */
    assert_int_equal(r.max_distinct, 1);
    assert_true(r.preemptions > 0);
    run(3, 7, 8, &r);
    assert_true(r.max_distinct <= 3);
    assert_true(r.preemptions > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slots_and_limit),
        cmocka_unit_test(test_no_deadlock_preempting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
