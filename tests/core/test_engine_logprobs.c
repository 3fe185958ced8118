/* tests/core/test_engine_logprobs: the engine's logprob-rows plumbing
 * (engine_backend logprob_rows) over the fake backend, with a logprob_rows
 * that does what the CUDA executor does — pg_lsm_row_eval (the shared
 * definition, common/pg_logsoftmax.h) of each marked row into its
 * pg_lsm_row — and then poisons the marked rows with NaN, so a row the
 * engine still reads on the host after marking it changes the output. A
 * batch mixing plain greedy, greedy-with-logprobs, sampled-with-logprobs,
 * penalized-with-logprobs, n = 2 and prompt-logprobs requests (k 0 .. 20;
 * eos on, a small pool: preemptions; prompt logprobs one row per step,
 * as the fake backend returns last-token rows only: the lm_head slices
 * are tests/gpu/test_cuda_e2e.c's), must give the same outputs bit for bit with the path on and off (logprob_rows NULL),
 * and the marked rows must be exactly the prompt-logprob rows and the
 * greedy-with-logprobs tokens. Fails if the host's logprobs (core/sampler.c,
 * core/engine.c) leave the shared definition, or the engine reads a row it
 * handed to the backend. */
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
#include "pg_logsoftmax.h"
#include "test_support.h"

enum { V = 96, NREQ = 24, MAXS = 6, MAXOUT = 12, MAXP = 10 };

typedef struct lp_backend {
    engine_backend inner;
    pg_lsm_row *rows;             /* pending for the next forward (NULL: none) */
    int32_t L;
    uint64_t marked_prompt, marked_sampling;
} lp_backend;

/* The marked rows among logits rows [first, first + n) (buffer rows 0 ..
 * n-1): their results, then NaN. */
static void lb_take(lp_backend *lb, int32_t first, int32_t n, float *logits)
{
    for (int32_t j = 0; j < n; j++) {
        pg_lsm_row *q = &lb->rows[first + j];
        if (!q->want) continue;
        float *row = logits + (size_t)j * V;
        if (q->token >= 0) lb->marked_prompt++;
        else lb->marked_sampling++;
        pg_lsm_row_eval(q, row, V);
        for (int32_t v = 0; v < V; v++)
            row[v] = NAN;
    }
}

static int lb_forward(void *ctx, const step_batch *b, float *logits, pg_error *err)
{
    lp_backend *lb = ctx;
    pg_lsm_row *rows = lb->rows;
    lb->rows = NULL; /* for this forward only */
    int rc = lb->inner.forward(lb->inner.ctx, b, logits, err);
    if (rc || !rows)
        return rc;
    if (lb->L != b->num_logits)
        return pg_error_set(err, PG_EINVAL, "logprob rows: %d, step of %d", (int)lb->L, (int)b->num_logits);
    lb->rows = rows;
    lb_take(lb, 0, b->num_logits, logits);
    lb->rows = NULL;
    return PG_OK;
}

static int lb_logprob_rows(void *ctx, pg_lsm_row *rows, int32_t L, pg_error *err)
{
    lp_backend *lb = ctx;
    (void)err;
    lb->rows = L > 0 ? rows : NULL;
    lb->L = L;
    return PG_OK;
}

static int lb_copy(void *ctx, const int32_t *src_dst, int32_t n, pg_error *err)
{
    lp_backend *lb = ctx;
    return lb->inner.copy_blocks(lb->inner.ctx, src_dst, n, err);
}

typedef struct result {
    int32_t n_out[2], out[2][MAXOUT + 1];
    float lp[2][MAXOUT + 1];
    int32_t top_ids[2][MAXOUT + 1][PG_LSM_MAX_TOP];
    float top_lp[2][MAXOUT + 1][PG_LSM_MAX_TOP];
    float plp[MAXP];
    int32_t prank[MAXP], ptop_ids[MAXP][PG_LSM_MAX_TOP];
    float ptop_lp[MAXP][PG_LSM_MAX_TOP];
    int finish[2];
    bool done;
} result;

/* Request k: kind k % 8 — 0: plain greedy; 1: sampled with logprobs 4;
 * 2: greedy with logprobs (k % 21); 3: greedy with prompt logprobs
 * (k % 21) and logprobs 0; 4: greedy with logprobs 2 and a repetition
 * penalty (host); 5: greedy with logprobs 1 and min_tokens 3 (host while
 * eos is banned, then the backend's); 6: prompt logprobs 20, sampled;
 * 7: greedy n = 2 with logprobs 3 (forked: the host's, one row for
 * both; fanned out: each child's own row, the backend's). */
static sampling_params params_of(int k)
{
    sampling_params sp = sampling_params_default();
    sp.temperature = 0.0f;
    sp.max_tokens = 4 + k % 9;
    switch (k % 8) {
    case 1: sp.temperature = 0.9f; sp.seed = 11u + (uint64_t)k; sp.logprobs = 4; break;
    case 2: sp.logprobs = k % 21; break;
    case 3: sp.prompt_logprobs = k % 21; sp.logprobs = 0; break;
    case 4: sp.logprobs = 2; sp.repetition_penalty = 1.4f; break;
    case 5: sp.logprobs = 1; sp.min_tokens = 3; break;
    case 6: sp.prompt_logprobs = 20; sp.temperature = 0.7f; sp.seed = 5u; break;
    case 7: sp.n = 2; sp.logprobs = 3; break;
    default: break;
    }
    return sp;
}

static void run(bool device_lp, result *res, lp_backend *stats)
{
    fake_backend_params fp = {.vocab_size = V, .num_blocks = 12, .block_size = 4, .window = 3, .salt = 9};
    fake_backend *f = fake_backend_create(&fp);
    assert_non_null(f);
    lp_backend lb = {.inner = fake_backend_iface(f)};
    engine_backend be = {.ctx = &lb, .vocab_size = V, .forward = lb_forward,
                         .copy_blocks = lb_copy,
                         .logprob_rows = device_lp ? lb_logprob_rows : NULL};
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
            fail_msg("device logprobs %d: step: %s (fake backend: %s)", (int)device_lp, err.msg,
                     fake_backend_error(f) ? fake_backend_error(f) : "ok");
        request_output *o;
        while (engine_pop_finished(e, &o)) {
            int k = (int)(intptr_t)o->user;
            assert_true(k >= 0 && k < NREQ && !res[k].done && o->n_outputs <= 2);
            for (int32_t j = 0; j < o->n_outputs; j++) {
                const seq_output *so = &o->outputs[j];
                assert_true(so->n_tokens <= MAXOUT + 1 && so->n_top <= PG_LSM_MAX_TOP);
                res[k].n_out[j] = so->n_tokens;
                memcpy(res[k].out[j], so->token_ids, (size_t)so->n_tokens * sizeof(int32_t));
                if (so->token_logprobs)
                    memcpy(res[k].lp[j], so->token_logprobs, (size_t)so->n_tokens * sizeof(float));
                for (int32_t t = 0; t < so->n_tokens && so->n_top > 0; t++) {
                    memcpy(res[k].top_ids[j][t], so->top_ids + (size_t)t * so->n_top,
                           (size_t)so->n_top * sizeof(int32_t));
                    memcpy(res[k].top_lp[j][t], so->top_logprobs + (size_t)t * so->n_top,
                           (size_t)so->n_top * sizeof(float));
                }
                res[k].finish[j] = (int)so->finish;
            }
            if (o->prompt_logprobs) {
                assert_true(o->n_prompt_tokens <= MAXP && o->n_prompt_top <= PG_LSM_MAX_TOP);
                /* entry 0 is NaN (no logprob): compared as bytes, the same NaN */
                memcpy(res[k].plp, o->prompt_logprobs, (size_t)o->n_prompt_tokens * sizeof(float));
                memcpy(res[k].prank, o->prompt_ranks, (size_t)o->n_prompt_tokens * sizeof(int32_t));
                for (int32_t p = 0; p < o->n_prompt_tokens && o->n_prompt_top > 0; p++) {
                    memcpy(res[k].ptop_ids[p], o->prompt_top_ids + (size_t)p * o->n_prompt_top,
                           (size_t)o->n_prompt_top * sizeof(int32_t));
                    memcpy(res[k].ptop_lp[p], o->prompt_top_logprobs + (size_t)p * o->n_prompt_top,
                           (size_t)o->n_prompt_top * sizeof(float));
                }
            }
            res[k].done = true;
            request_output_free(o);
        }
    }
    assert_null(fake_backend_error(f));
    stats->marked_prompt = lb.marked_prompt;
    stats->marked_sampling = lb.marked_sampling;
    engine_destroy(e);
    fake_backend_destroy(f);
}

static void test_same_outputs(void **state)
{
    (void)state;
    static result on[NREQ], off[NREQ];
    lp_backend s_on = {0}, s_off = {0};
    run(true, on, &s_on);
    run(false, off, &s_off);
    uint64_t greedy_lp_tokens = 0, prompt_rows = 0;
    for (int k = 0; k < NREQ; k++) {
        assert_true(on[k].done && off[k].done);
        if (memcmp(&on[k], &off[k], sizeof on[k]))
            fail_msg("request %d (kind %d) differs with the logprob rows on", k, k % 8);
        if (k % 8 == 2 || k % 8 == 3) greedy_lp_tokens += (uint64_t)on[k].n_out[0];
        if (k % 8 == 3 || k % 8 == 6) prompt_rows += (uint64_t)(3 + k % 7 - 1);
    }
    printf("    rows taken by the backend: %llu prompt (of %llu, + recomputed after preemption), "
           "%llu sampling (greedy with logprobs: %llu tokens)\n", (unsigned long long)s_on.marked_prompt,
           (unsigned long long)prompt_rows, (unsigned long long)s_on.marked_sampling,
           (unsigned long long)greedy_lp_tokens);
    assert_true(s_off.marked_prompt == 0 && s_off.marked_sampling == 0);
    assert_true(s_on.marked_prompt >= prompt_rows && prompt_rows > 0);
    /* every greedy-with-logprobs token (kinds 2, 3) from a marked row,
     * plus kind 5's after its min_tokens and kind 7's when its n = 2 runs
     * as two fanned-out requests of n = 1 */
    assert_true(s_on.marked_sampling >= greedy_lp_tokens && greedy_lp_tokens > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_outputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
