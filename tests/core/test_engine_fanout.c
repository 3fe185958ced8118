/* test_engine_fanout: parallel sampling (n > 1) run as independent child
 * requests (vLLM v1's fan-out) when the n sequences cannot run together —
 * n > max_num_seqs, a pool too small for all n at once, too few free
 * slots — over the fake backend, which checks every KV read and write; the
 * harness checks the pool invariants after every step, FCFS order and that
 * nothing leaks. The completions must be byte-identical to the forked
 * group's (each sequence keeps its RNG stream) whatever max_num_seqs, pool
 * size (down to constant preemption), block size, prefix caching or
 * layout. */
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
#include "sequence.h"

static workload g_wl;
static run_result g_ref; /* every request a forked group, plenty of room */

static int setup_workload(void **state)
{
    (void)state;
    wl_shape sh = {.n_requests = 40, .max_model_len = 128, .prompt_min = 1, .prompt_max = 70,
                   .out_min = 1, .out_max = 40, .max_n = 5};
    workload_make(&g_wl, &sh, 4242);
    int32_t n_multi = 0;
    for (int32_t i = 0; i < g_wl.n; i++) n_multi += g_wl.reqs[i].sp.n > 3;
    assert_true(n_multi >= 3); /* n > max_num_seqs below */
    run_cfg ref = {.num_blocks = 0, .block_size = 16, .max_num_seqs = 256,
                   .max_num_batched_tokens = 4096, .prefix_caching = false};
    run_workload(&g_wl, &ref, &g_ref);
    assert_int_equal(g_ref.stats.preemptions, 0);
    assert_true(g_ref.stats.cow_copies > 0); /* the groups forked */
    return 0;
}

static int teardown_workload(void **state)
{
    (void)state;
    run_result_free(&g_ref, g_wl.n);
    workload_free(&g_wl);
    return 0;
}

static void check(const run_cfg *c, const char *name, run_result *keep)
{
    run_result r;
    run_workload(&g_wl, c, &r);
    assert_same_outputs(&g_ref, &r, g_wl.n, name);
    assert_int_equal(r.fcfs_violations, 0);
    assert_int_equal(r.readmit_violations, 0);
    printf("  %-40s steps %6llu preempt %5llu prefix hits %4llu/%4llu cow %4llu peak %4d "
           "prompt tokens %6llu\n", name, (unsigned long long)r.stats.steps,
           (unsigned long long)r.stats.preemptions, (unsigned long long)r.stats.prefix_cache_hits,
           (unsigned long long)r.stats.prefix_cache_queries,
           (unsigned long long)r.stats.cow_copies, (int)r.stats.blocks_in_use_peak,
           (unsigned long long)r.stats.prompt_tokens);
    if (keep) *keep = r; else run_result_free(&r, g_wl.n);
}

/* max_num_seqs 1, 2, 3 (below n) with budgets from tiny to large, the
 * prefix cache on and off, pools from one sequence's worst case (constant
 * preemption) to plenty. */
static void test_fanout_max_num_seqs_and_pools(void **state)
{
    (void)state;
    int32_t bs = 16;
    int32_t one = workload_min_blocks(&g_wl, bs, 1);   /* one sequence alone */
    int32_t group = workload_min_blocks(&g_wl, bs, 0); /* the largest group */
    assert_true(one < group);
    uint64_t preempt_tight = 0;
    for (int32_t seqs = 1; seqs <= 3; seqs++) {
        const int32_t budgets[] = {5, 64, 4096};
        const int32_t pools[] = {one, one + 2, 2 * group, 16 * group};
        for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++)
            for (size_t p = 0; p < sizeof pools / sizeof pools[0]; p++)
                for (int cache = 0; cache <= 1; cache++) {
                    char name[96];
                    snprintf(name, sizeof name, "seqs %d budget %d pool %d cache %d", (int)seqs,
                             (int)budgets[b], (int)pools[p], cache);
                    run_cfg c = {.num_blocks = pools[p], .block_size = bs, .max_num_seqs = seqs,
                                 .max_num_batched_tokens = budgets[b], .prefix_caching = cache,
                                 .staggered = p == 1};
                    run_result r;
                    check(&c, name, &r);
                    if (p == 0) preempt_tight += r.stats.preemptions;
                    if (cache && seqs >= 2 && p == 3) assert_true(r.stats.prefix_cache_hits > 0);
                    run_result_free(&r, g_wl.n);
                }
    }
    assert_true(preempt_tight > 20); /* the smallest pools preempt constantly */
}

/* Larger max_num_seqs (fork fast path, fan-out only when slots run out),
 * block sizes, the contiguous layout, and fan-out forced everywhere. */
static void test_fanout_other_configs(void **state)
{
    (void)state;
    const int32_t seqs[] = {4, 5, 7, 64, 256};
    for (size_t i = 0; i < sizeof seqs / sizeof seqs[0]; i++) {
        char name[96];
        int32_t minb = workload_min_blocks(&g_wl, 8, 1);
        snprintf(name, sizeof name, "block 8 seqs %d pool %d", (int)seqs[i], (int)(2 * minb));
        run_cfg c = {.num_blocks = 2 * minb, .block_size = 8, .max_num_seqs = seqs[i],
                     .max_num_batched_tokens = 100, .prefix_caching = true};
        check(&c, name, NULL);
    }
    const int32_t bss[] = {1, 4, 32};
    for (size_t i = 0; i < sizeof bss / sizeof bss[0]; i++)
        for (int always = 0; always <= 1; always++) {
            char name[96];
            int32_t minb = workload_min_blocks(&g_wl, bss[i], 1);
            snprintf(name, sizeof name, "block %d seqs 2 always %d", (int)bss[i], always);
            run_cfg c = {.num_blocks = minb + minb / 3, .block_size = bss[i], .max_num_seqs = 2,
                         .max_num_batched_tokens = 48, .prefix_caching = true,
                         .fan_out_always = always};
            check(&c, name, NULL);
        }
    int32_t per = (g_wl.max_model_len + 15) / 16;
    for (int32_t s = 1; s <= 3; s++) {
        char name[96];
        snprintf(name, sizeof name, "contiguous seqs %d", (int)s);
        run_cfg c = {.num_blocks = per * (s + 1), .block_size = 16, .max_num_seqs = s,
                     .max_num_batched_tokens = 64, .layout = KV_LAYOUT_CONTIGUOUS};
        check(&c, name, NULL);
    }
}

/* Randomized soak with n up to 5 and max_num_seqs 1..4: staggered
 * arrivals, random pools from one sequence's worst case, invariants after
 * every step, same completions as the forked reference. */
static void test_fanout_soak(void **state)
{
    (void)state;
    wl_shape sh = {.n_requests = 150, .max_model_len = 96, .prompt_min = 1, .prompt_max = 60,
                   .out_min = 1, .out_max = 35, .max_n = 5, .arrival_span = 400};
    workload w;
    workload_make(&w, &sh, 17);
    run_cfg refc = {.num_blocks = 0, .block_size = 8, .max_num_seqs = 256,
                    .max_num_batched_tokens = 8192, .prefix_caching = false};
    run_result ref;
    run_workload(&w, &refc, &ref);
    pg_test_rng rng = {.s = 5};
    uint64_t preempt = 0;
    for (int round = 0; round < 6; round++) {
        int32_t bs = 1 << pg_test_rng_int(&rng, 1, 4);
        int32_t minb = workload_min_blocks(&w, bs, 1);
        run_cfg c = {.num_blocks = minb + pg_test_rng_int(&rng, 0, 2 * minb), .block_size = bs,
                     .max_num_seqs = pg_test_rng_int(&rng, 1, 4),
                     .max_num_batched_tokens = pg_test_rng_int(&rng, 4, 200),
                     .prefix_caching = round % 3 != 2, .staggered = true,
                     .fan_out_always = round == 4,
                     .watermark = round % 2 ? -1.0f : 0.0f};
        run_result r;
        run_workload(&w, &c, &r);
        assert_same_outputs(&ref, &r, w.n, "fan-out soak");
        assert_int_equal(r.fcfs_violations, 0);
        assert_int_equal(r.readmit_violations, 0);
        printf("  fan-out soak %d: block %d pool %d seqs %d budget %d cache %d: steps %llu "
               "preemptions %llu prefix hits %llu peak blocks %d\n", round, (int)bs,
               (int)c.num_blocks, (int)c.max_num_seqs, (int)c.max_num_batched_tokens,
               (int)c.prefix_caching, (unsigned long long)r.stats.steps,
               (unsigned long long)r.stats.preemptions,
               (unsigned long long)r.stats.prefix_cache_hits, (int)r.stats.blocks_in_use_peak);
        preempt += r.stats.preemptions;
        run_result_free(&r, w.n);
    }
    assert_true(preempt > 0);
    run_result_free(&ref, w.n);
    workload_free(&w);
}

/* ---- single requests ------------------------------------------------------- */

static const int32_t eos_ids[1] = {1};

typedef struct rig {
    fake_backend *f;
    engine *e;
} rig;

static void rig_open(rig *r, int32_t num_blocks, int32_t bs, int32_t max_num_seqs,
                     bool fan_out_always)
{
    engine_params ep = engine_params_default();
    ep.block_size = bs;
    ep.num_blocks = num_blocks;
    ep.max_model_len = 64;
    ep.max_num_seqs = max_num_seqs;
    ep.check_invariants = true;
    ep.fan_out_always = fan_out_always;
    ep.watermark = 0.0f;
    ep.eos_token_ids = eos_ids;
    ep.n_eos_token_ids = 1;
    fake_backend_params fp = {.vocab_size = HARNESS_VOCAB, .num_blocks = num_blocks,
                              .block_size = bs, .window = 4, .salt = 3};
    r->f = fake_backend_create(&fp);
    assert_non_null(r->f);
    engine_backend be = fake_backend_iface(r->f);
    pg_error err;
    if (engine_create(&r->e, &ep, &be, NULL, &err)) fail_msg("%s", err.msg);
    fake_backend_attach(r->f, r->e);
}

static void rig_close(rig *r)
{
    engine_destroy(r->e);
    fake_backend_destroy(r->f);
}

static uint64_t rig_add(rig *r, const int32_t *prompt, int32_t n, const sampling_params *sp)
{
    uint64_t id;
    pg_error err;
    if (engine_add_request(r->e, prompt, n, sp, NULL, &id, &err)) fail_msg("%s", err.msg);
    fake_backend_set_prompt(r->f, id, prompt, n);
    return id;
}

static request_output *rig_run(rig *r, const int32_t *prompt, int32_t n, const sampling_params *sp)
{
    rig_add(r, prompt, n, sp);
    pg_error err;
    request_output *o = NULL;
    for (int guard = 0; engine_has_unfinished(r->e); guard++) {
        assert_true(guard < 100000);
        if (engine_step(r->e, &err))
            fail_msg("%s (fake: %s)", err.msg,
                     fake_backend_error(r->f) ? fake_backend_error(r->f) : "ok");
    }
    assert_true(engine_pop_finished(r->e, &o));
    assert_false(engine_pop_finished(r->e, &(request_output *){NULL}));
    return o;
}

static void assert_same_request(const request_output *a, const request_output *b)
{
    assert_int_equal(a->n_outputs, b->n_outputs);
    for (int32_t k = 0; k < a->n_outputs; k++) {
        assert_int_equal(a->outputs[k].index, k);
        assert_int_equal(b->outputs[k].index, k);
        assert_int_equal(a->outputs[k].n_tokens, b->outputs[k].n_tokens);
        assert_int_equal(a->outputs[k].finish, b->outputs[k].finish);
        assert_memory_equal(a->outputs[k].token_ids, b->outputs[k].token_ids,
                            (size_t)a->outputs[k].n_tokens * sizeof(int32_t));
        if (a->outputs[k].token_logprobs)
            assert_memory_equal(a->outputs[k].token_logprobs, b->outputs[k].token_logprobs,
                                (size_t)a->outputs[k].n_tokens * sizeof(float));
    }
}

/* One request, n = 4, prompt of 10 tokens (2 full blocks of 4 + 2): the
 * forked group computes the prompt once; children find its 2 full blocks
 * in the prefix cache (in the same step, or later from the evictable
 * cache) and compute only the last 2 tokens each. */
static void test_fanout_prefix_sharing_counted(void **state)
{
    (void)state;
    sampling_params sp = sampling_params_default();
    sp.n = 4;
    sp.max_tokens = 6;
    sp.ignore_eos = true;
    sp.seed = 9;
    sp.logprobs = 1;
    int32_t p[10] = {3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    rig fork;
    rig_open(&fork, 64, 4, 8, false);
    request_output *ref = rig_run(&fork, p, 10, &sp);
    engine_stats sf;
    engine_get_stats(fork.e, &sf);
    assert_int_equal(sf.prompt_tokens, 10);
    assert_int_equal(sf.cow_copies, 3);
    const struct { int32_t seqs; bool always; uint64_t hits; } cfgs[] = {
        {1, false, 6}, {2, false, 6}, {3, false, 6}, {8, true, 6},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        rig r;
        rig_open(&r, 64, 4, cfgs[i].seqs, cfgs[i].always);
        request_output *o = rig_run(&r, p, 10, &sp);
        assert_same_request(ref, o);
        engine_stats s;
        engine_get_stats(r.e, &s);
        printf("  n 4 seqs %d always %d: prompt tokens %llu hits %llu cow %llu peak %d "
               "(fork: %llu, peak %d)\n", (int)cfgs[i].seqs, (int)cfgs[i].always,
               (unsigned long long)s.prompt_tokens, (unsigned long long)s.prefix_cache_hits,
               (unsigned long long)s.cow_copies, (int)s.blocks_in_use_peak,
               (unsigned long long)sf.prompt_tokens, (int)sf.blocks_in_use_peak);
        assert_int_equal(s.prompt_tokens, 10 + 3 * 2);
        assert_int_equal(s.prefix_cache_hits, cfgs[i].hits);
        assert_int_equal(s.cow_copies, 0);
        /* never more blocks than the fork: 2 shared + one of its own each */
        assert_true(s.blocks_in_use_peak <= sf.blocks_in_use_peak);
        request_output_free(o);
        rig_close(&r);
    }
    request_output_free(ref);
    rig_close(&fork);
}

/* n up to the limit with max_num_seqs 1, and n sequences that together
 * exceed the pool: accepted, same outputs. Refused only when one sequence
 * alone can never fit. */
static void test_fanout_refusals(void **state)
{
    (void)state;
    sampling_params sp = sampling_params_default();
    sp.ignore_eos = true;
    sp.seed = 77;
    sp.max_tokens = 20;
    int32_t p[7] = {2, 9, 4, 33, 5, 6, 7};
    sp.n = SAMPLING_PARAMS_MAX_N;
    rig a, b;
    rig_open(&a, 1024, 4, 256, false);
    rig_open(&b, 8, 4, 1, false); /* 64 x ceil(27/4) blocks together; one needs 7 */
    request_output *oa = rig_run(&a, p, 7, &sp);
    request_output *ob = rig_run(&b, p, 7, &sp);
    assert_same_request(oa, ob);
    engine_stats s;
    engine_get_stats(b.e, &s);
    assert_int_equal(s.peak_running_seqs, 1);
    request_output_free(oa);
    request_output_free(ob);
    sp.n = 2;
    sp.max_tokens = 30; /* ceil(37/4) = 10 blocks > 8 for one sequence */
    uint64_t id;
    pg_error err = {{0}};
    assert_int_equal(engine_add_request(b.e, p, 7, &sp, NULL, &id, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "KV blocks"));
    assert_false(engine_has_unfinished(b.e));
    rig_close(&a);
    rig_close(&b);
}

/* Interrupted run: the children still running or waiting are aborted, the
 * request comes out once with all n outputs in index order, no block is
 * left referenced; tearing down an engine with children frees them. */
static void test_fanout_abort_and_teardown(void **state)
{
    (void)state;
    sampling_params sp = sampling_params_default();
    sp.ignore_eos = true;
    sp.n = 5;
    sp.max_tokens = 8;
    int32_t p[6] = {3, 4, 5, 6, 7, 8};
    rig r;
    rig_open(&r, 64, 4, 2, false);
    rig_add(&r, p, 6, &sp);
    rig_add(&r, p, 3, &sp);
    pg_error err;
    for (int s = 0; s < 12; s++) assert_int_equal(engine_step(r.e, &err), PG_OK);
    engine_abort_all(r.e);
    assert_false(engine_has_unfinished(r.e));
    request_output *o;
    int32_t n_out = 0, aborted = 0, done = 0;
    while (engine_pop_finished(r.e, &o)) {
        assert_int_equal(o->n_outputs, 5);
        for (int32_t k = 0; k < 5; k++) {
            assert_int_equal(o->outputs[k].index, k);
            if (o->outputs[k].finish == FINISH_ABORT) aborted++;
            if (o->outputs[k].finish == FINISH_LENGTH) done++;
        }
        request_output_free(o);
        n_out++;
    }
    assert_int_equal(n_out, 2);
    assert_true(done >= 2); /* 12 steps: the first children finished */
    assert_true(aborted >= 1);
    kv_pool_metrics m;
    kv_pool_get_metrics(engine_kv_pool(r.e), &m);
    assert_int_equal(m.blocks_in_use, 0);
    /* teardown with children running and waiting (ASan checks the frees) */
    rig_add(&r, p, 6, &sp);
    rig_add(&r, p, 5, &sp);
    for (int s = 0; s < 5; s++) assert_int_equal(engine_step(r.e, &err), PG_OK);
    rig_close(&r);
}

/* request_fan_out on a request that already generated (a preempted
 * group): one child per live sequence in index order, each running the
 * parent's sequence in place (tokens, RNG, index kept); finished
 * sequences stay with the parent; children free only themselves. */
static void test_request_fan_out_keeps_sequences(void **state)
{
    (void)state;
    sampling_params sp = sampling_params_default();
    sp.n = 4;
    sp.max_tokens = 10;
    sp.seed = 3;
    int32_t p[3] = {5, 6, 7};
    request *r;
    pg_error err;
    assert_int_equal(request_create(&r, 9, p, 3, &sp, 64, eos_ids, 1, NULL, NULL, &err), PG_OK);
    for (int32_t i = 0; i < 4; i++)
        for (int32_t t = 0; t <= i; t++)
            assert_int_equal(sequence_append(&r->seqs[i], 10 + i, NULL, &err), PG_OK);
    r->seqs[1].finished = true;
    r->seqs[1].finish = FINISH_STOP;
    r->n_live = 3;
    sampler_rng rng2 = r->seqs[2].rng;
    request *kids[4];
    int32_t n = 0;
    assert_int_equal(request_fan_out(r, kids, &n), PG_OK);
    assert_int_equal(n, 3);
    assert_true(r->fanned_out);
    assert_int_equal(r->n_children, 3);
    const int32_t want_index[3] = {0, 2, 3};
    for (int32_t k = 0; k < 3; k++) {
        request *c = kids[k];
        assert_ptr_equal(c->parent, r);
        assert_ptr_equal(request_root(c), r);
        assert_int_equal(c->n, 1);
        assert_int_equal(c->n_live, 1);
        assert_int_equal(c->id, 9);
        assert_ptr_equal(c->seqs, &r->seqs[want_index[k]]);
        assert_ptr_equal(c->seqs[0].req, c);
        assert_int_equal(c->seqs[0].index, want_index[k]);
        assert_int_equal(c->seqs[0].n_tokens, 3 + want_index[k] + 1);
        assert_ptr_equal(request_leader(c), &c->seqs[0]);
        assert_int_equal(request_seq_target(c, &c->seqs[0], true), c->seqs[0].n_tokens);
    }
    assert_memory_equal(&kids[1]->seqs[0].rng, &rng2, sizeof rng2);
    for (int32_t k = 0; k < 3; k++) {
        kids[k]->seqs[0].req = r;
        request_destroy(kids[k]);
    }
    request_output *o = request_make_output(r, 0.0);
    assert_non_null(o);
    assert_int_equal(o->n_outputs, 4);
    for (int32_t k = 0; k < 4; k++) {
        assert_int_equal(o->outputs[k].index, k);
        assert_int_equal(o->outputs[k].n_tokens, k + 1);
    }
    assert_int_equal(o->outputs[1].finish, FINISH_STOP);
    request_output_free(o);
    request_destroy(r);
}

int main(void)
{
    const struct CMUnitTest single[] = {
        cmocka_unit_test(test_request_fan_out_keeps_sequences),
        cmocka_unit_test(test_fanout_prefix_sharing_counted),
        cmocka_unit_test(test_fanout_refusals),
        cmocka_unit_test(test_fanout_abort_and_teardown),
        cmocka_unit_test(test_fanout_soak),
    };
    const struct CMUnitTest equivalence[] = {
        cmocka_unit_test(test_fanout_max_num_seqs_and_pools),
        cmocka_unit_test(test_fanout_other_configs),
    };
    int rc = cmocka_run_group_tests_name("fanout single", single, NULL, NULL);
    rc |= cmocka_run_group_tests_name("fanout equivalence", equivalence, setup_workload,
                                      teardown_workload);
    return rc;
}
