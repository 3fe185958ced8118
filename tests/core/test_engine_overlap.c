/* tests/core/test_engine_overlap: the overlapped loop (core/engine_overlap.c)
 * over an asynchronous fake backend. The backend runs each forward (the
 * fake's checks: every token fed is the sequence's own, every slot read
 * was written, every cached block holds what its hash says) when it is
 * launched, as a device reads the step's host arrays when it is launched,
 * but hands the results over only at step_wait: until then the engine's
 * logits rows hold NaN and its greedy ids -7, so anything read before the
 * wait fails the run or changes its bytes. A batch mixing greedy, sampled
 * (seeded), logprobs, penalty, min_tokens, stop-id, n = 2 and
 * prompt-logprobs requests, eos on, a pool small enough to preempt, runs
 * three ways — overlapped, the same backend with serial_loop, and the
 * synchronous fake — with outputs equal bit for bit, and the overlapped
 * run must actually have built steps ahead (engine_stats steps_ahead),
 * rebuilt some after a sequence ended (steps_rebuilt), and preempted. */
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

enum { V = 96, NREQ = 32, MAXS = 6, MAXOUT = 14, MAXL = 64 };

typedef struct async_backend {
    engine_backend inner;
    bool armed, in_flight;
    float buf[MAXL * V];         /* the step's logits, "on the device" */
    float *dst;                  /* the engine's logits buffer */
    int32_t L;
    const uint8_t *gmask;        /* greedy rows of the next forward */
    int32_t *gids, gL;
    int32_t ids[MAXL];           /* their argmax, "on the device" */
    int32_t *ids_dst;
    uint64_t deferred, waits, sync_forwards, greedy_rows;
} async_backend;

static int ab_forward(void *ctx, const step_batch *b, float *logits, pg_error *err)
{
    async_backend *ab = ctx;
    const uint8_t *gm = ab->gmask;
    ab->gmask = NULL; /* for this forward only */
    if (ab->in_flight)
        return pg_error_set(err, PG_EINVAL, "async fake: a forward while one is in flight");
    if (b->num_logits > MAXL) return pg_error_set(err, PG_EINVAL, "async fake: too many rows");
    bool armed = ab->armed;
    ab->armed = false;
    int rc = ab->inner.forward(ab->inner.ctx, b, armed ? ab->buf : logits, err);
    if (rc) return rc;
    float *rows = armed ? ab->buf : logits;
    ab->ids_dst = NULL;
    if (gm) {
        if (ab->gL != b->num_logits)
            return pg_error_set(err, PG_EINVAL, "async fake: greedy mask of %d rows, step of %d",
                                (int)ab->gL, (int)b->num_logits);
        for (int32_t r = 0; r < ab->gL; r++) {
            if (!gm[r]) continue;
            const float *row = rows + (size_t)r * V;
            float best = -INFINITY;
            int32_t id = -1;
            for (int32_t v = 0; v < V; v++)
                if (row[v] > best) {
                    best = row[v];
                    id = v;
                }
            ab->ids[r] = id;
            ab->greedy_rows++;
        }
        ab->ids_dst = ab->gids;
        if (!armed)
            for (int32_t r = 0; r < ab->gL; r++)
                if (gm[r]) ab->gids[r] = ab->ids[r];
    }
    if (!armed) {
        ab->sync_forwards++;
        return PG_OK;
    }
    /* queued: nothing the engine may read is there yet */
    ab->deferred++;
    ab->in_flight = true;
    ab->dst = logits;
    ab->L = b->num_logits;
    for (size_t i = 0; i < (size_t)ab->L * V; i++) logits[i] = NAN;
    if (ab->ids_dst)
        for (int32_t r = 0; r < ab->gL; r++) ab->ids_dst[r] = -7;
    return PG_OK;
}

static int ab_defer(void *ctx, pg_error *err)
{
    async_backend *ab = ctx;
    if (ab->in_flight) return pg_error_set(err, PG_EINVAL, "async fake: defer while in flight");
    ab->armed = true;
    return PG_OK;
}

static int ab_wait(void *ctx, pg_error *err)
{
    async_backend *ab = ctx;
    if (!ab->in_flight) return pg_error_set(err, PG_EINVAL, "async fake: wait with nothing in flight");
    ab->in_flight = false;
    ab->waits++;
    memcpy(ab->dst, ab->buf, (size_t)ab->L * V * sizeof *ab->dst);
    if (ab->ids_dst) memcpy(ab->ids_dst, ab->ids, (size_t)ab->gL * sizeof *ab->ids_dst);
    return PG_OK;
}

static int ab_greedy(void *ctx, const uint8_t *greedy, int32_t L, int32_t *ids, pg_error *err)
{
    async_backend *ab = ctx;
    if (ab->in_flight) return pg_error_set(err, PG_EINVAL, "async fake: greedy rows while in flight");
    ab->gmask = L > 0 ? greedy : NULL;
    ab->gids = ids;
    ab->gL = L;
    return PG_OK;
}

static int ab_copy(void *ctx, const int32_t *src_dst, int32_t n, pg_error *err)
{
    async_backend *ab = ctx;
    if (ab->in_flight) return pg_error_set(err, PG_EINVAL, "async fake: block copy while in flight");
    return ab->inner.copy_blocks(ab->inner.ctx, src_dst, n, err);
}

typedef struct result {
    int32_t n_out[2], out[2][MAXOUT + 1];
    float lp[2][MAXOUT + 1];
    int finish[2];
    bool done;
} result;

/* Request k: kind k % 8 — 0, 3: plain greedy; 1, 6: sampled (seeded;
 * 6 with top_k); 2: greedy with logprobs; 4: a repetition penalty; 5:
 * min_tokens 3 and a stop id; 7: n = 2 sampled, or (k = 15) greedy with
 * prompt logprobs. */
static sampling_params params_of(int k)
{
    static const int32_t stop_id[1] = {17};
    sampling_params sp = sampling_params_default();
    sp.temperature = 0.0f;
    sp.max_tokens = 4 + k % 11;
    switch (k % 8) {
    case 1: sp.temperature = 0.9f; sp.seed = 11u + (uint64_t)k; break;
    case 6: sp.temperature = 1.1f; sp.top_k = 9; sp.seed = 5u + (uint64_t)k; break;
    case 2: sp.logprobs = 3; break;
    case 4: sp.repetition_penalty = 1.4f; break;
    case 5:
        sp.min_tokens = 3;
        sp.stop_token_ids = stop_id;
        sp.n_stop_token_ids = 1;
        break;
    case 7:
        if (k == 15) {
            sp.prompt_logprobs = 2;
        } else {
            sp.n = 2;
            sp.temperature = 0.8f;
            sp.seed = 3u + (uint64_t)k;
        }
        break;
    default: break;
    }
    return sp;
}

typedef enum mode { MODE_OVERLAP, MODE_SERIAL_LOOP, MODE_SYNC } mode;

static void run(mode md, int32_t num_blocks, result *res, engine_stats *stats, async_backend *ab)
{
    fake_backend_params fp = {.vocab_size = V, .num_blocks = num_blocks, .block_size = 4, .window = 3,
                              .salt = 9};
    fake_backend *f = fake_backend_create(&fp);
    assert_non_null(f);
    memset(ab, 0, sizeof *ab);
    ab->inner = fake_backend_iface(f);
    engine_backend be = {.ctx = ab, .vocab_size = V, .forward = ab_forward, .copy_blocks = ab_copy,
                         .greedy_rows = ab_greedy};
    if (md != MODE_SYNC) {
        be.step_defer = ab_defer;
        be.step_wait = ab_wait;
    }
    const int32_t eos = 5;
    engine_params ep = engine_params_default();
    ep.block_size = 4;
    ep.num_blocks = num_blocks;
    ep.max_num_seqs = MAXS;
    ep.max_num_batched_tokens = 16;
    ep.max_model_len = 40;
    ep.check_invariants = true;
    ep.watermark = 0.0f;
    ep.eos_token_ids = &eos;
    ep.n_eos_token_ids = 1;
    ep.serial_loop = md == MODE_SERIAL_LOOP;
    engine *e = NULL;
    pg_error err;
    assert_int_equal(engine_create(&e, &ep, &be, NULL, &err), PG_OK);
    fake_backend_attach(f, e);
    if (fake_backend_add_requests(f, e, NREQ, V, params_of, &err)) fail_msg("%s", err.msg);
    while (engine_has_unfinished(e)) {
        if (engine_step(e, &err))
            fail_msg("mode %d: step: %s (fake backend: %s)", (int)md, err.msg,
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
    engine_get_stats(e, stats);
    assert_null(fake_backend_error(f));
    engine_destroy(e);
    fake_backend_destroy(f);
}

static void compare(int32_t num_blocks, bool want_preemption)
{
    static result ov[NREQ], se[NREQ], sy[NREQ];
    memset(ov, 0, sizeof ov);
    memset(se, 0, sizeof se);
    memset(sy, 0, sizeof sy);
    static async_backend a_ov, a_se, a_sy;
    engine_stats s_ov, s_se, s_sy;
    run(MODE_OVERLAP, num_blocks, ov, &s_ov, &a_ov);
    run(MODE_SERIAL_LOOP, num_blocks, se, &s_se, &a_se);
    run(MODE_SYNC, num_blocks, sy, &s_sy, &a_sy);
    for (int k = 0; k < NREQ; k++) {
        assert_true(ov[k].done && se[k].done && sy[k].done);
        assert_memory_equal(&ov[k], &sy[k], sizeof ov[k]);
        assert_memory_equal(&se[k], &sy[k], sizeof se[k]);
    }
    printf("    blocks %d: overlapped %llu steps (%llu built ahead, %llu rebuilt, %llu deferred "
           "forwards, %llu waited, %llu greedy rows), serial %llu steps; preemptions %llu / %llu\n",
           (int)num_blocks, (unsigned long long)s_ov.steps, (unsigned long long)s_ov.steps_ahead,
           (unsigned long long)s_ov.steps_rebuilt, (unsigned long long)a_ov.deferred,
           (unsigned long long)a_ov.waits, (unsigned long long)a_ov.greedy_rows,
           (unsigned long long)s_sy.steps, (unsigned long long)s_ov.preemptions,
           (unsigned long long)s_sy.preemptions);
    /* the overlap happened, on most steps, and not in the serial loop */
    assert_true(s_ov.steps_ahead + s_ov.steps_rebuilt > s_ov.steps / 2);
    assert_true(s_ov.steps_rebuilt > 0);
    assert_true(a_ov.greedy_rows > 0);
    assert_int_equal(a_ov.deferred, a_ov.waits);
    assert_true(a_ov.sync_forwards > 0); /* the prompt-logprobs steps */
    assert_int_equal(s_se.steps_ahead + s_se.steps_rebuilt, 0);
    assert_int_equal(a_se.deferred, 0);
    assert_int_equal(s_sy.steps_ahead + s_sy.steps_rebuilt, 0);
    if (want_preemption) assert_true(s_ov.preemptions > 0 && s_sy.preemptions > 0);
}

static void test_overlap_same_outputs(void **state)
{
    (void)state;
    compare(64, false);
}

static void test_overlap_preempted(void **state)
{
    (void)state;
    compare(12, true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_overlap_same_outputs),
        cmocka_unit_test(test_overlap_preempted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
