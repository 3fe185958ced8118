/* test_engine_window: freeing KV blocks behind a sliding window (vLLM's
 * SlidingWindowManager; scheduler.h). The fake backend plays a model with
 * a window of W positions: it reads (and checks) only the positions its
 * queries see, fails on a null block-table entry inside the window, and
 * records the most blocks a sequence held in a step. With the engine's
 * sliding_window = W every sequence holds at most the blocks touching its
 * window and chunk (ceil((W - 1 + q_len) / B) + 1); with 0 (freeing off)
 * long sequences hold more (so the bound can fail). The outputs are
 * byte-identical on and off across chunked prefill, prefix caching,
 * preemption (tiny pools), n > 1 forks and fan-out; the harness checks the
 * pool invariants (ref counts = table entries + nothing leaked) after every
 * step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine_harness.h"
#include "kv_pool.h"

enum { W = 20 };

static workload g_wl;
static run_result g_ref; /* freeing off, plenty of room */

static int setup_workload(void **state)
{
    (void)state;
    wl_shape sh = {.n_requests = 30, .max_model_len = 256, .prompt_min = 1, .prompt_max = 90,
                   .out_min = 20, .out_max = 150, .max_n = 3};
    workload_make(&g_wl, &sh, 1717);
    run_cfg ref = {.num_blocks = 0, .block_size = 8, .max_num_seqs = 256,
                   .max_num_batched_tokens = 4096, .prefix_caching = true, .attn_window = W};
    run_workload(&g_wl, &ref, &g_ref);
    assert_int_equal(g_ref.stats.preemptions, 0);
    assert_true(g_ref.counts.max_held_over_bound > 0); /* the bound can fail */
    assert_int_equal(g_ref.counts.null_entries_skipped, 0);
    return 0;
}

static int teardown_workload(void **state)
{
    (void)state;
    run_result_free(&g_ref, g_wl.n);
    workload_free(&g_wl);
    return 0;
}

static run_result check(run_cfg c, const char *name)
{
    c.attn_window = W;
    run_result r;
    run_workload(&g_wl, &c, &r);
    assert_same_outputs(&g_ref, &r, g_wl.n, name);
    assert_int_equal(r.fcfs_violations, 0);
    printf("  %-44s steps %6llu preempt %4llu peak blocks %4d max held/seq %3d (off: %3d) "
           "skipped slots %llu\n", name, (unsigned long long)r.stats.steps,
           (unsigned long long)r.stats.preemptions, (int)r.stats.blocks_in_use_peak,
           (int)r.counts.max_held_blocks, (int)g_ref.counts.max_held_blocks,
           (unsigned long long)r.counts.null_entries_skipped);
    return r;
}

/* Freeing on, room for everything: the same outputs, every sequence within
 * the window's blocks, and a lower peak than with freeing off. */
static void test_window_frees_blocks(void **state)
{
    (void)state;
    for (int pc = 0; pc <= 1; pc++) {
        run_cfg c = {.num_blocks = 0, .block_size = 8, .max_num_seqs = 256,
                     .max_num_batched_tokens = 4096, .prefix_caching = pc, .sliding_window = W};
        run_result r = check(c, pc ? "free, prefix caching" : "free, no prefix caching");
        assert_true(r.counts.max_held_over_bound <= 0);
        assert_true(r.counts.null_entries_skipped > 0);
        assert_true(r.stats.blocks_in_use_peak < g_ref.stats.blocks_in_use_peak);
        run_result_free(&r, g_wl.n);
    }
}

/* Chunked prefill (small budgets), tiny pools (constant preemption and
 * recomputation), few sequence slots, block sizes, fan-out of n > 1. */
static void test_window_chunks_preemption_fanout(void **state)
{
    (void)state;
    const int32_t block_sizes[] = {4, 8, 16};
    const int32_t budgets[] = {7, 64, 4096};
    uint64_t preempted = 0;
    for (int bi = 0; bi < 3; bi++) {
        int32_t bs = block_sizes[bi];
        /* a pool where one sequence of the longest request barely fits
         * with freeing on: ceil((W - 1 + chunk) / bs) + 1 blocks plus the
         * forked group's shared ones */
        int32_t tiny = (W - 1 + 7 + bs - 1) / bs + 1 + 3 * 2;
        for (int k = 0; k < 3; k++)
            for (int pc = 0; pc <= 1; pc++)
                for (int fo = 0; fo <= 1; fo++) {
                    run_cfg c = {.num_blocks = k == 0 ? tiny : (k == 1 ? tiny * 3 : 0),
                                 .block_size = bs, .max_num_seqs = k == 2 ? 256 : 3,
                                 .max_num_batched_tokens = k == 0 ? 7 : budgets[k],
                                 .prefix_caching = pc, .fan_out_always = fo,
                                 .sliding_window = W};
                    char name[96];
                    snprintf(name, sizeof name, "bs %d pool %d budget %d pc %d fanout %d", (int)bs,
                             (int)c.num_blocks, (int)c.max_num_batched_tokens, pc, fo);
                    run_result r = check(c, name);
                    assert_true(r.counts.max_held_over_bound <= 0);
                    preempted += r.stats.preemptions;
                    run_result_free(&r, g_wl.n);
                }
    }
    assert_true(preempted > 0);
}

/* The point of freeing: a pool that preempts constantly without it runs
 * with fewer preemptions (more sequences fit). */
static void test_window_fits_more(void **state)
{
    (void)state;
    run_cfg c = {.num_blocks = 60, .block_size = 8, .max_num_seqs = 256,
                 .max_num_batched_tokens = 512, .prefix_caching = true, .attn_window = W};
    run_result off, on;
    run_workload(&g_wl, &c, &off);
    c.sliding_window = W;
    run_workload(&g_wl, &c, &on);
    assert_same_outputs(&g_ref, &off, g_wl.n, "off, 60 blocks");
    assert_same_outputs(&g_ref, &on, g_wl.n, "on, 60 blocks");
    printf("  60 blocks: preemptions off %llu on %llu, steps off %llu on %llu, peak running "
           "seqs off %d on %d\n", (unsigned long long)off.stats.preemptions,
           (unsigned long long)on.stats.preemptions, (unsigned long long)off.stats.steps,
           (unsigned long long)on.stats.steps, (int)off.stats.peak_running_seqs,
           (int)on.stats.peak_running_seqs);
    assert_true(off.stats.preemptions > 0);
    assert_true(on.stats.preemptions < off.stats.preemptions);
    assert_true(on.stats.peak_running_seqs > off.stats.peak_running_seqs);
    run_result_free(&off, g_wl.n);
    run_result_free(&on, g_wl.n);
}

/* An engine window larger than the model's would drop blocks the model
 * reads: the fake backend (as the executors) must refuse the step. */
static void test_window_too_large_is_caught(void **state)
{
    (void)state;
    fake_backend_params fp = {.vocab_size = HARNESS_VOCAB, .num_blocks = 64, .block_size = 4,
                              .window = 4, .salt = 5, .attn_window = 8};
    fake_backend *f = fake_backend_create(&fp);
    assert_non_null(f);
    engine_params ep = engine_params_default();
    ep.block_size = 4;
    ep.num_blocks = 64;
    ep.max_model_len = 128;
    ep.sliding_window = 4; /* smaller than the model's 8: drops blocks it reads */
    ep.check_invariants = true;
    engine_backend be = fake_backend_iface(f);
    engine *e = NULL;
    pg_error err = {{0}};
    assert_int_equal(engine_create(&e, &ep, &be, NULL, &err), 0);
    fake_backend_attach(f, e);
    int32_t prompt[3] = {1, 2, 3};
    sampling_params sp = sampling_params_default();
    sp.max_tokens = 40;
    sp.ignore_eos = true;
    uint64_t id;
    assert_int_equal(engine_add_request(e, prompt, 3, &sp, NULL, &id, &err), 0);
    fake_backend_set_prompt(f, id, prompt, 3);
    int rc = 0;
    for (int i = 0; i < 60 && rc == 0 && engine_has_unfinished(e); i++) rc = engine_step(e, &err);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(fake_backend_error(f), "is null but holds position"));
    engine_destroy(e);
    fake_backend_destroy(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_frees_blocks),
        cmocka_unit_test(test_window_chunks_preemption_fanout),
        cmocka_unit_test(test_window_fits_more),
        cmocka_unit_test(test_window_too_large_is_caught),
    };
    return cmocka_run_group_tests(tests, setup_workload, teardown_workload);
}
