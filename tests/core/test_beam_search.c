/* test_beam_search: vLLM's beam search (core/beam_search.h).
 *   - the ranking on hand-computed cases: the score and its seq_len rule
 *     (prompt counted, a final eos not), length_penalty, the stable sort's
 *     ties (listing order: parent rank, then the parent's logprob order),
 *     completed eos candidates, ignore_eos;
 *   - through the engine over the fake backend (which checks every KV read
 *     against the beam's tokens, and the pool invariants after every step):
 *     width 1 = greedy under ignore_eos; beams share blocks (peak blocks in
 *     use below W x the unshared need); the same bytes across pool sizes
 *     that preempt, max_num_seqs, token budgets, prefix caching and the
 *     group's neighbours in the batch; outputs ordered by score. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "beam_search.h"
#include "engine_harness.h"
#include "kv_pool.h"
#include "test_support.h"

/* ---- the ranking ---------------------------------------------------------- */

static void test_score(void **state)
{
    (void)state;
    /* cum / seq_len^lp; seq_len counts the prompt, not a final eos */
    assert_true(beam_score(-6.0, 4, false, 1.0) == -1.5);
    assert_true(beam_score(-6.0, 4, true, 1.0) == -2.0);
    assert_true(beam_score(-6.0, 4, false, 0.0) == -6.0);
    assert_true(beam_score(-6.0, 4, false, 2.0) == -6.0 / 16.0);
    assert_true(beam_score(-6.0, 5, true, 2.0) == -6.0 / 16.0);
    assert_true(fabs(beam_score(-1.0, 9, false, 0.5) - (-1.0 / 3.0)) < 1e-15);
}

static void test_sort_stable_desc(void **state)
{
    (void)state;
    const double sc[] = {1.0, 3.0, 3.0, 2.0, 3.0, NAN, -INFINITY, 2.0};
    int32_t order[8], scr[8];
    beam_sort_desc(sc, 8, order, scr);
    const int32_t want[8] = {1, 2, 4, 3, 7, 0, 6, 5};
    for (int i = 0; i < 8; i++) assert_int_equal(order[i], want[i]);
    /* a longer run of equal keys keeps its input order through every merge width */
    double eq[37];
    int32_t o2[37], s2[37];
    for (int i = 0; i < 37; i++) eq[i] = i % 3 == 0 ? -1.0 : -2.0;
    beam_sort_desc(eq, 37, o2, s2);
    int32_t k = 0;
    for (int i = 0; i < 37; i += 3) assert_int_equal(o2[k++], i);
    for (int i = 0; i < 37; i++)
        if (i % 3) assert_int_equal(o2[k++], i);
}

/* Two live parents, four candidates each (2W, W = 2), eos = 2, seq_len 5
 * (prompt 3 + 2 generated): parent 0 (rank 0) cum -1.0, parent 1 -1.5. */
static const beam_cand cands[8] = {
    {0, 5, -1.0 - 0.5}, {0, 2, -1.0 - 0.6}, {0, 7, -1.0 - 1.0}, {0, 9, -1.0 - 2.0},
    {1, 4, -1.5 - 0.5}, {1, 6, -1.5 - 0.9}, {1, 2, -1.5 - 1.0}, {1, 8, -1.5 - 1.1},
};

static void test_select_eos_completes_ties_keep_listing(void **state)
{
    (void)state;
    int32_t live[8], done[8], is[24], n_live, n_done;
    double ds[8];
    beam_select(cands, 8, 5, 2, 2, false, 1.0, live, &n_live, done, &n_done, is, ds);
    /* both eos candidates complete, in listing order */
    assert_int_equal(n_done, 2);
    assert_int_equal(done[0], 1);
    assert_int_equal(done[1], 6);
    /* -1.5 (c0) first; c2 (-2.0) and c4 (-2.0) tie: c2 is listed first */
    assert_int_equal(n_live, 2);
    assert_int_equal(live[0], 0);
    assert_int_equal(live[1], 2);
    /* width 3: the third of the tie and the rest in order */
    beam_select(cands, 8, 5, 3, 2, false, 1.0, live, &n_live, done, &n_done, is, ds);
    assert_int_equal(n_live, 3);
    assert_int_equal(live[2], 4);
}

static void test_select_ignore_eos_uses_shorter_len(void **state)
{
    (void)state;
    /* ignore_eos: an eos candidate stays live and its score drops the eos
     * from seq_len: cum -2.3 over 4 = -0.575 loses to -2.6 over 5 = -0.52
     * with length_penalty 1, and wins with 0 (-2.3 > -2.6) */
    const beam_cand c[2] = {{0, 2, -2.3}, {0, 3, -2.6}};
    int32_t live[2], done[2], is[6], n_live, n_done;
    double ds[2];
    beam_select(c, 2, 5, 1, 2, true, 1.0, live, &n_live, done, &n_done, is, ds);
    assert_int_equal(n_done, 0);
    assert_int_equal(n_live, 1);
    assert_int_equal(live[0], 1);
    beam_select(c, 2, 5, 1, 2, true, 0.0, live, &n_live, done, &n_done, is, ds);
    assert_int_equal(live[0], 0);
    /* without ignore_eos it completes and the other is the only live one */
    beam_select(c, 2, 5, 1, 2, false, 0.0, live, &n_live, done, &n_done, is, ds);
    assert_int_equal(n_done, 1);
    assert_int_equal(done[0], 0);
    assert_int_equal(live[0], 1);
}

static void test_select_length_penalty_reorders(void **state)
{
    (void)state;
    /* same seq_len for every candidate: a positive penalty scales all
     * scores alike, so the order is the cum order; a negative cum and
     * length_penalty only changes magnitudes (vLLM's, no early stop) */
    const beam_cand c[3] = {{0, 10, -3.0}, {0, 11, -1.0}, {1, 12, -2.0}};
    int32_t live[3], done[3], is[9], n_live, n_done;
    double ds[3];
    beam_select(c, 3, 7, 3, -1, false, 2.5, live, &n_live, done, &n_done, is, ds);
    assert_int_equal(live[0], 1);
    assert_int_equal(live[1], 2);
    assert_int_equal(live[2], 0);
}

/* ---- through the engine --------------------------------------------------- */

static sampling_params beam_sp(int32_t width, int32_t max_tokens, double lp, bool ignore_eos)
{
    sampling_params sp = sampling_params_default();
    sp.temperature = 0.0f;
    sp.use_beam_search = true;
    sp.n = width;
    sp.max_tokens = max_tokens;
    sp.length_penalty = lp;
    sp.ignore_eos = ignore_eos;
    return sp;
}

/* n requests: k % 3 == 2 a neighbour (greedy or sampled n = 2) unless
 * beams_only, else a beam group of width 1 + k % 4 */
static void make_workload(workload *w, int32_t n, bool beams_only, uint64_t seed)
{
    pg_test_rng rng = {seed};
    w->n = 0;
    w->max_model_len = 96;
    w->reqs = calloc((size_t)n, sizeof *w->reqs);
    assert_non_null(w->reqs);
    for (int32_t k = 0; k < n; k++) {
        bool neighbour = k % 3 == 2;
        int32_t np = pg_test_rng_int(&rng, 3, 30);
        int32_t *p = malloc((size_t)np * sizeof *p);
        assert_non_null(p);
        for (int32_t i = 0; i < np; i++) p[i] = pg_test_rng_int(&rng, 2, HARNESS_VOCAB - 1);
        int32_t width = 1 + k % 4, max_t = pg_test_rng_int(&rng, 4, 30);
        double lp = (double)(k % 5) * 0.5 - 0.5;
        bool ig = k % 4 == 3;
        if (neighbour && beams_only) {
            free(p);
            continue;
        }
        wl_req *q = &w->reqs[w->n++];
        q->prompt = p;
        q->n_prompt = np;
        if (neighbour) {
            q->sp = sampling_params_default();
            q->sp.max_tokens = max_t;
            q->sp.n = k % 2 ? 2 : 1;
            q->sp.temperature = k % 2 ? 0.8f : 0.0f;
            q->sp.seed = (uint64_t)k;
        } else {
            q->sp = beam_sp(width, max_t, lp, ig);
        }
    }
}

static run_cfg base_cfg(void)
{
    run_cfg c = {.num_blocks = 4096, .block_size = 4, .max_num_seqs = 64,
                 .max_num_batched_tokens = 256, .prefix_caching = true,
                 .layout = KV_LAYOUT_PAGED, .follow_tokens = true};
    return c;
}

static void test_engine_invariance(void **state)
{
    (void)state;
    workload w, wb;
    make_workload(&w, 24, false, 11);
    make_workload(&wb, 24, true, 11);
    run_cfg c = base_cfg();
    run_result ref;
    run_workload(&w, &c, &ref);
    struct {
        const char *what;
        run_cfg c;
        bool preempts;
    } cfgs[] = {
        {"a pool that preempts", base_cfg(), true},
        {"max_num_seqs 5", base_cfg(), false},
        {"a budget of 7 tokens", base_cfg(), false},
        {"no prefix caching, small pool", base_cfg(), true},
        {"block size 16", base_cfg(), false},
    };
    cfgs[0].c.num_blocks = 60;
    cfgs[1].c.max_num_seqs = 5;
    cfgs[2].c.max_num_batched_tokens = 7;
    cfgs[3].c.prefix_caching = false;
    cfgs[3].c.num_blocks = 100;
    cfgs[4].c.block_size = 16;
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        run_result r;
        run_workload(&w, &cfgs[i].c, &r);
        assert_same_outputs(&ref, &r, w.n, cfgs[i].what);
        if (cfgs[i].preempts && r.stats.preemptions == 0)
            fail_msg("%s: expected preemptions, got none", cfgs[i].what);
        run_result_free(&r, w.n);
    }
    /* the beam groups alone give the same bytes as beside their neighbours */
    run_result alone;
    run_workload(&wb, &c, &alone);
    for (int32_t k = 0, j = 0; k < 24; k++) {
        if (k % 3 == 2) continue;
        if (strcmp(ref.sig[k], alone.sig[j]) != 0)
            fail_msg("request %d: with neighbours\n%s\nalone\n%s", (int)k, ref.sig[k], alone.sig[j]);
        j++;
    }
    run_result_free(&alone, wb.n);
    run_result_free(&ref, w.n);
    workload_free(&w);
    workload_free(&wb);
}

/* Runs one request through a fresh engine; the output and the stats. */
static bool copy_mode; /* engine_params.beam_copy_blocks for run_one */

static request_output *run_one(const int32_t *prompt, int32_t np, const sampling_params *sp,
                               int32_t num_blocks, engine_stats *st)
{
    fake_backend_params fp = {.vocab_size = HARNESS_VOCAB, .num_blocks = num_blocks, .block_size = 4,
                              .window = 4, .salt = 5, .follow_tokens = true};
    fake_backend *f = fake_backend_create(&fp);
    assert_non_null(f);
    static const int32_t eos[1] = {1};
    engine_params ep = engine_params_default();
    ep.block_size = 4;
    ep.num_blocks = num_blocks;
    ep.max_model_len = 256;
    ep.check_invariants = true;
    ep.beam_copy_blocks = copy_mode;
    ep.eos_token_ids = eos;
    ep.n_eos_token_ids = 1;
    engine_backend be = fake_backend_iface(f);
    engine *e = NULL;
    pg_error err = {{0}};
    if (engine_create(&e, &ep, &be, NULL, &err)) fail_msg("%s", err.msg);
    fake_backend_attach(f, e);
    uint64_t id;
    if (engine_add_request(e, prompt, np, sp, NULL, &id, &err)) fail_msg("%s", err.msg);
    fake_backend_set_prompt(f, id, prompt, np);
    while (engine_has_unfinished(e))
        if (engine_step(e, &err)) fail_msg("%s (fake: %s)", err.msg, fake_backend_error(f));
    request_output *o = NULL;
    assert_true(engine_pop_finished(e, &o));
    engine_get_stats(e, st);
    kv_pool_metrics m;
    kv_pool_get_metrics(engine_kv_pool(e), &m);
    assert_int_equal(m.blocks_in_use, 0);
    engine_destroy(e);
    fake_backend_destroy(f);
    return o;
}

static void test_width1_is_greedy(void **state)
{
    (void)state;
    const int32_t prompt[] = {5, 9, 13, 2, 40};
    sampling_params g = sampling_params_default();
    g.temperature = 0.0f;
    g.max_tokens = 40;
    g.ignore_eos = true;
    sampling_params b = beam_sp(1, 40, 1.0f, true);
    engine_stats st;
    request_output *og = run_one(prompt, 5, &g, 256, &st);
    request_output *ob = run_one(prompt, 5, &b, 256, &st);
    assert_int_equal(ob->n_outputs, 1);
    assert_int_equal(ob->outputs[0].n_tokens, og->outputs[0].n_tokens);
    assert_memory_equal(ob->outputs[0].token_ids, og->outputs[0].token_ids,
                        (size_t)og->outputs[0].n_tokens * sizeof(int32_t));
    assert_int_equal(ob->outputs[0].finish, FINISH_LENGTH);
    request_output_free(og);
    request_output_free(ob);
}

static void test_blocks_shared_and_ranked(void **state)
{
    (void)state;
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = 2 + (i * 7) % 60;
    int32_t n_stop = 0;
    for (int32_t width = 2; width <= 6; width += 2) {
        sampling_params b = beam_sp(width, 24, 1.0, false);
        engine_stats st;
        request_output *o = run_one(prompt, 40, &b, 512, &st);
        int32_t unshared = width * ((40 + 24 + 3) / 4);
        if (st.blocks_in_use_peak >= unshared)
            fail_msg("width %d: %d blocks at the peak, unshared needs %d", (int)width,
                     (int)st.blocks_in_use_peak, (int)unshared);
        /* the prompt (10 blocks) is held once: at most that + W x the output's */
        assert_true(st.blocks_in_use_peak <= 10 + width * (24 / 4 + 1));
        assert_int_equal(o->n_outputs, width);
        double prev = INFINITY;
        for (int32_t i = 0; i < o->n_outputs; i++) {
            const seq_output *s = &o->outputs[i];
            assert_int_equal(s->index, i);
            assert_true(s->has_cumulative_logprob);
            assert_true(s->cumulative_logprob <= 0.0);
            /* a completed beam's eos is not among its ids, nor in its length */
            if (s->finish == FINISH_STOP) {
                n_stop++;
                assert_int_equal(s->stop_token_id, 1);
            } else {
                assert_int_equal(s->finish, FINISH_LENGTH);
                assert_int_equal(s->n_tokens, 24);
            }
            for (int32_t t = 0; t < s->n_tokens; t++) assert_int_not_equal(s->token_ids[t], 1);
            double sc = beam_score(s->cumulative_logprob, 40 + s->n_tokens, false, 1.0);
            assert_true(sc <= prev);
            prev = sc;
        }
        request_output_free(o);
    }
    /* the eos path ran: some best beams completed by eos */
    assert_true(n_stop > 0);
}

/* The bench's run without sharing: beams copy their parent's blocks; the
 * same beams, more blocks, no copy-on-write. */
static void test_copy_mode_same_beams(void **state)
{
    (void)state;
    int32_t prompt[21];
    for (int i = 0; i < 21; i++) prompt[i] = 2 + (i * 11) % 60;
    sampling_params b = beam_sp(4, 20, 1.0, false);
    engine_stats s_shared, s_copy;
    copy_mode = false;
    request_output *a = run_one(prompt, 21, &b, 512, &s_shared);
    copy_mode = true;
    request_output *c = run_one(prompt, 21, &b, 512, &s_copy);
    copy_mode = false;
    assert_int_equal(a->n_outputs, c->n_outputs);
    for (int32_t i = 0; i < a->n_outputs; i++) {
        assert_int_equal(a->outputs[i].n_tokens, c->outputs[i].n_tokens);
        assert_memory_equal(a->outputs[i].token_ids, c->outputs[i].token_ids,
                            (size_t)a->outputs[i].n_tokens * sizeof(int32_t));
        assert_true(a->outputs[i].cumulative_logprob == c->outputs[i].cumulative_logprob);
    }
    assert_true(s_copy.blocks_in_use_peak > s_shared.blocks_in_use_peak);
    assert_int_equal(s_copy.cow_copies, 0);
    assert_true(s_shared.cow_copies > 0);
    request_output_free(a);
    request_output_free(c);
}

/* An interrupted run (engine_abort_all) hands out the group ranked as it
 * stands: the live beams with FINISH_ABORT, best first. */
static void test_abort_mid_search(void **state)
{
    (void)state;
    fake_backend_params fp = {.vocab_size = HARNESS_VOCAB, .num_blocks = 128, .block_size = 4,
                              .window = 4, .salt = 9, .follow_tokens = true};
    fake_backend *f = fake_backend_create(&fp);
    assert_non_null(f);
    engine_params ep = engine_params_default();
    ep.block_size = 4;
    ep.num_blocks = 128;
    ep.max_model_len = 128;
    ep.check_invariants = true;
    engine_backend be = fake_backend_iface(f);
    engine *e = NULL;
    pg_error err = {{0}};
    if (engine_create(&e, &ep, &be, NULL, &err)) fail_msg("%s", err.msg);
    fake_backend_attach(f, e);
    const int32_t prompt[] = {7, 8, 9, 10, 11, 12};
    sampling_params b = beam_sp(3, 40, 1.0, true);
    uint64_t id;
    if (engine_add_request(e, prompt, 6, &b, NULL, &id, &err)) fail_msg("%s", err.msg);
    fake_backend_set_prompt(f, id, prompt, 6);
    for (int k = 0; k < 5; k++)
        if (engine_step(e, &err)) fail_msg("%s", err.msg);
    engine_abort_all(e);
    request_output *o = NULL;
    assert_true(engine_pop_finished(e, &o));
    assert_int_equal(o->n_outputs, 3);
    double prev = INFINITY;
    for (int32_t i = 0; i < 3; i++) {
        assert_int_equal(o->outputs[i].finish, FINISH_ABORT);
        assert_int_equal(o->outputs[i].n_tokens, 5); /* a token a step, the prompt step too */
        assert_true(o->outputs[i].cumulative_logprob <= prev);
        prev = o->outputs[i].cumulative_logprob;
    }
    request_output_free(o);
    kv_pool_metrics m;
    kv_pool_get_metrics(engine_kv_pool(e), &m);
    assert_int_equal(m.blocks_in_use, 0);
    engine_destroy(e);
    fake_backend_destroy(f);
}

static void test_refusals(void **state)
{
    (void)state;
    pg_error err = {{0}};
    sampling_params b = beam_sp(2, 8, 1.0f, false);
    b.temperature = 0.7f;
    assert_int_equal(sampling_params_validate(&b, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "temperature"));
    b = beam_sp(11, 8, 1.0f, false);
    assert_int_equal(sampling_params_validate(&b, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "beam width"));
    b = beam_sp(2, 8, 1.0f, false);
    b.min_tokens = 2;
    assert_int_equal(sampling_params_validate(&b, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "min_tokens"));
    const char *stop[1] = {"x"};
    b = beam_sp(2, 8, 1.0f, false);
    b.stop = stop;
    b.n_stop = 1;
    assert_int_equal(sampling_params_validate(&b, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "stop"));
    b = beam_sp(2, 8, 1.0f, false);
    b.logprobs = 1;
    assert_int_equal(sampling_params_validate(&b, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "logprobs"));
    b = beam_sp(10, 8, 0.0f, true);
    assert_int_equal(sampling_params_validate(&b, &err), PG_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_score),
        cmocka_unit_test(test_sort_stable_desc),
        cmocka_unit_test(test_select_eos_completes_ties_keep_listing),
        cmocka_unit_test(test_select_ignore_eos_uses_shorter_len),
        cmocka_unit_test(test_select_length_penalty_reorders),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_width1_is_greedy),
        cmocka_unit_test(test_blocks_shared_and_ranked),
        cmocka_unit_test(test_copy_mode_same_beams),
        cmocka_unit_test(test_abort_mid_search),
        cmocka_unit_test(test_engine_invariance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
