/* test_engine_grammar: structured outputs in the engine, over the fake
 * backend (pseudo-random logits: every constrained output is a random walk
 * of the automaton) with the real stories260K tokenizer.
 *
 * - a batch of constrained requests (greedy, sampled, n = 3 forks) ends
 *   with FINISH_STOP and a text the constraint accepts; its token ids are
 *   the same with a pool small enough to preempt constantly and with one
 *   sequence per step (the automaton state is kept across preemption and
 *   forks start from the initial state);
 * - max_tokens in a non-accepting state gives FINISH_LENGTH;
 * - an automaton that can only end finishes the sequence with FINISH_STOP
 *   even with ignore_eos or min_tokens past it;
 * - refusals: no tokenizer, an unsupported schema (the keyword named). */
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
#include "grammar.h"
#include "test_support.h"
#include "tokenizer.h"

static tokenizer *g_tok;

typedef struct req_spec {
    grammar_kind kind;
    const char *src;
    float temperature;
    int32_t n, max_tokens, min_tokens;
    bool ignore_eos;
} req_spec;

static const req_spec batch[] = {
    {GRAMMAR_JSON_SCHEMA,
     "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":4},"
     "\"b\":{\"enum\":[true,\"x\",3]}},\"required\":[\"a\",\"b\"]}", 1.0f, 1, 120, 0, false},
    {GRAMMAR_CHOICE, "[\"alpha\",\"beta\",\"gamma\"]", 0.0f, 1, 50, 0, false},
    {GRAMMAR_REGEX, "[a-c]{2,5}-(x|yy)", 1.0f, 3, 50, 0, false},
    {GRAMMAR_JSON_SCHEMA,
     "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":3}", 1.0f, 2,
     80, 0, false},
    {GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"uuid\"}", 0.7f, 1, 120, 0, false},
    {GRAMMAR_CHOICE, "[\"yes\",\"no\"]", 1.0f, 1, 50, 0, true},
    {GRAMMAR_CHOICE, "[\"ok\"]", 0.0f, 1, 50, 20, false},
    {GRAMMAR_JSON_SCHEMA, "{\"anyOf\":[{\"type\":\"null\"},{\"const\":[1,2]}]}", 1.0f, 1, 50, 0, false},
};
#define N_KINDS ((int)(sizeof batch / sizeof batch[0]))
#define N_BATCH (5 * N_KINDS) /* each kind 5 times, different seeds */
static req_spec batch5[N_BATCH];

static request_output **run_batch(int32_t num_blocks, int32_t max_num_seqs, const req_spec *specs,
                                  int n_specs)
{
    int32_t vocab = tok_vocab_size(g_tok);
    fake_backend_params fp = {.vocab_size = vocab, .num_blocks = num_blocks, .block_size = 4,
                              .window = 3, .salt = 5};
    fake_backend *f = fake_backend_create(&fp);
    engine_params ep = engine_params_default();
    ep.block_size = 4;
    ep.num_blocks = num_blocks;
    ep.max_num_seqs = max_num_seqs;
    ep.max_model_len = 160;
    ep.check_invariants = true;
    ep.watermark = 0.0f;
    int32_t eos = tok_eos_id(g_tok);
    ep.eos_token_ids = &eos;
    ep.n_eos_token_ids = 1;
    engine_backend be = fake_backend_iface(f);
    engine *e;
    pg_error err;
    if (engine_create(&e, &ep, &be, g_tok, &err))
        fail_msg("%s", err.msg);
    fake_backend_attach(f, e);
    request_output **outs = calloc((size_t)n_specs, sizeof *outs);
    assert_non_null(outs);
    const int32_t prompt[] = {1, 400, 300, 288, 301, 270};
    for (int i = 0; i < n_specs; i++) {
        sampling_params sp = sampling_params_default();
        sp.temperature = specs[i].temperature;
        sp.n = specs[i].n;
        sp.max_tokens = specs[i].max_tokens;
        sp.min_tokens = specs[i].min_tokens;
        sp.ignore_eos = specs[i].ignore_eos;
        sp.seed = 100 + (uint64_t)i;
        sp.structured_kind = specs[i].kind;
        sp.structured = specs[i].src;
        sp.structured_len = specs[i].src ? strlen(specs[i].src) : 0;
        uint64_t id;
        if (engine_add_request(e, prompt, 6, &sp, NULL, &id, &err))
            fail_msg("request %d: %s", i, err.msg);
        assert_int_equal((int)id, i);
        fake_backend_set_prompt(f, id, prompt, 6);
    }
    while (engine_has_unfinished(e)) {
        if (engine_step(e, &err))
            fail_msg("%s (%s)", err.msg, fake_backend_error(f));
        request_output *o;
        while (engine_pop_finished(e, &o))
            outs[o->request_id] = o;
    }
    engine_stats st;
    engine_get_stats(e, &st);
    printf("# pool %d, max_num_seqs %d: %llu preemptions, peak %d blocks\n", (int)num_blocks,
           (int)max_num_seqs, (unsigned long long)st.preemptions, (int)st.blocks_in_use_peak);
    if (num_blocks < 64 && max_num_seqs > 8)
        assert_true(st.preemptions > 0);
    engine_destroy(e);
    fake_backend_destroy(f);
    return outs;
}

static bool accepts(const req_spec *r, const char *text, size_t len)
{
    grammar *g;
    pg_error err;
    if (grammar_compile(&g, r->kind, r->src, strlen(r->src), &err))
        fail_msg("%s", err.msg);
    grammar_state st;
    grammar_state_init(g, &st);
    bool ok = grammar_advance(g, &st, (const uint8_t *)text, len) && grammar_can_end(g, &st);
    grammar_destroy(g);
    return ok;
}

static void free_outs(request_output **o, int n)
{
    for (int i = 0; i < n; i++)
        request_output_free(o[i]);
    free(o);
}

static void test_batch_invariance(void **state)
{
    (void)state;
    for (int i = 0; i < N_BATCH; i++)
        batch5[i] = batch[i % N_KINDS];
    request_output **big = run_batch(1024, 256, batch5, N_BATCH);
    for (int i = 0; i < N_BATCH; i++) {
        assert_non_null(big[i]);
        for (int k = 0; k < big[i]->n_outputs; k++) {
            const seq_output *s = &big[i]->outputs[k];
            if (s->finish != FINISH_STOP)
                fail_msg("request %d.%d: finish %d, text '%s'", i, k, (int)s->finish, s->text);
            if (!accepts(&batch5[i], s->text, s->text_len))
                fail_msg("request %d.%d: '%s' is not in the language", i, k, s->text);
        }
    }
    /* n = 3 samples differ somewhere (forks have their own streams) */
    assert_true(big[2]->outputs[0].text_len != big[2]->outputs[1].text_len ||
                memcmp(big[2]->outputs[0].text, big[2]->outputs[1].text, big[2]->outputs[0].text_len) ||
                big[2]->outputs[1].text_len != big[2]->outputs[2].text_len ||
                memcmp(big[2]->outputs[1].text, big[2]->outputs[2].text, big[2]->outputs[1].text_len));
    const int32_t pools[][2] = {{48, 256}, {1024, 3}, {48, 4}};
    for (size_t p = 0; p < sizeof pools / sizeof *pools; p++) {
        request_output **o = run_batch(pools[p][0], pools[p][1], batch5, N_BATCH);
        for (int i = 0; i < N_BATCH; i++)
            for (int k = 0; k < big[i]->n_outputs; k++) {
                const seq_output *a = &big[i]->outputs[k], *b = &o[i]->outputs[k];
                assert_int_equal(a->n_tokens, b->n_tokens);
                assert_memory_equal(a->token_ids, b->token_ids, (size_t)a->n_tokens * sizeof(int32_t));
                assert_int_equal(a->finish, b->finish);
                assert_string_equal(a->text, b->text);
            }
        free_outs(o, N_BATCH);
    }
    free_outs(big, N_BATCH);
}

static void test_length_and_forced_end(void **state)
{
    (void)state;
    const req_spec specs[] = {
        /* 3 tokens cannot finish a 36-character uuid string */
        {GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"uuid\"}", 1.0f, 1, 3, 0, false},
        /* the only string: ends after it although eos is ignored / banned */
        {GRAMMAR_CHOICE, "[\"ok\"]", 1.0f, 1, 50, 0, true},
        {GRAMMAR_CHOICE, "[\"ok\"]", 1.0f, 1, 50, 30, false},
    };
    request_output **o = run_batch(1024, 256, specs, 3);
    assert_int_equal(o[0]->outputs[0].finish, FINISH_LENGTH);
    assert_int_equal(o[0]->outputs[0].n_tokens, 3);
    for (int i = 1; i < 3; i++) {
        assert_int_equal(o[i]->outputs[0].finish, FINISH_STOP);
        assert_string_equal(o[i]->outputs[0].text, "ok");
    }
    assert_int_equal(o[1]->outputs[0].stop_token_id, -1); /* ignore_eos: no eos named */
    free_outs(o, 3);
}

static void test_refusals(void **state)
{
    (void)state;
    fake_backend_params fp = {.vocab_size = 512, .num_blocks = 64, .block_size = 4, .window = 3,
                              .salt = 5};
    fake_backend *f = fake_backend_create(&fp);
    engine_params ep = engine_params_default();
    ep.block_size = 4;
    ep.num_blocks = 64;
    engine_backend be = fake_backend_iface(f);
    const int32_t prompt[] = {1, 2, 3};
    sampling_params sp = sampling_params_default();
    sp.structured_kind = GRAMMAR_JSON_OBJECT;
    pg_error err;
    engine *e;
    /* without a tokenizer */
    assert_int_equal(engine_create(&e, &ep, &be, NULL, &err), PG_OK);
    assert_int_equal(engine_add_request(e, prompt, 3, &sp, NULL, NULL, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "need a tokenizer"));
    engine_destroy(e);
    /* an unsupported keyword, an empty language */
    assert_int_equal(engine_create(&e, &ep, &be, g_tok, &err), PG_OK);
    sp.structured_kind = GRAMMAR_JSON_SCHEMA;
    sp.structured = "{\"type\":\"number\",\"multipleOf\":2}";
    sp.structured_len = strlen(sp.structured);
    assert_int_equal(engine_add_request(e, prompt, 3, &sp, NULL, NULL, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "unsupported keyword 'multipleOf'"));
    sp.structured_kind = GRAMMAR_REGEX;
    sp.structured = "a{2}b{0}c{1,0}";
    sp.structured_len = strlen(sp.structured);
    assert_int_equal(engine_add_request(e, prompt, 3, &sp, NULL, NULL, &err), PG_EINVAL);
    assert_false(engine_has_unfinished(e));
    engine_destroy(e);
    fake_backend_destroy(f);
}

int main(void)
{
    pg_error err;
    if (tok_load(&g_tok, pg_test_shared_path("models/stories260K"), &err))
        fail_msg("%s", err.msg);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_length_and_forced_end),
        cmocka_unit_test(test_refusals),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tok_free(g_tok);
    return rc;
}
