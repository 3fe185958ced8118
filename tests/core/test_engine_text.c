/* test_engine_text: output text and stop strings with the real stories260K
 * tokenizer over the fake backend: text = decode(prompt + generated) -
 * decode(prompt); a stop string cuts the text before it (or after it with
 * include_stop_str_in_output), finishes with FINISH_STOP and names it. */
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
#include "tokenizer.h"

static tokenizer *g_tok;

static request_output *run(const int32_t *prompt, int32_t n, const sampling_params *sp)
{
    int32_t vocab = tok_vocab_size(g_tok);
    fake_backend_params fp = {.vocab_size = vocab, .num_blocks = 64, .block_size = 4,
                              .window = 3, .salt = 11};
    fake_backend *f = fake_backend_create(&fp);
    engine_params ep = engine_params_default();
    ep.block_size = 4;
    ep.num_blocks = 64;
    ep.max_model_len = 200;
    ep.check_invariants = true;
    engine_backend be = fake_backend_iface(f);
    engine *e;
    pg_error err;
    if (engine_create(&e, &ep, &be, g_tok, &err)) fail_msg("%s", err.msg);
    fake_backend_attach(f, e);
    uint64_t id;
    if (engine_add_request(e, prompt, n, sp, NULL, &id, &err)) fail_msg("%s", err.msg);
    fake_backend_set_prompt(f, id, prompt, n);
    request_output *o = NULL;
    while (engine_has_unfinished(e)) {
        if (engine_step(e, &err)) fail_msg("%s", err.msg);
        if (engine_pop_finished(e, &o)) break;
    }
    assert_non_null(o);
    engine_destroy(e);
    fake_backend_destroy(f);
    return o;
}

static void test_text_and_stop_strings(void **state)
{
    (void)state;
    pg_error err;
    const char *prompt_text = "Once upon a time, there was a little girl";
    int32_t *ids;
    size_t n_ids;
    assert_int_equal(tok_encode(g_tok, prompt_text, strlen(prompt_text), true, &ids, &n_ids, &err),
                     PG_OK);
    sampling_params sp = sampling_params_default();
    sp.temperature = 0.0f;
    sp.max_tokens = 60;
    sp.ignore_eos = true;
    request_output *free_run = run(ids, (int32_t)n_ids, &sp);
    const seq_output *fr = &free_run->outputs[0];
    assert_int_equal(fr->n_tokens, 60);
    assert_non_null(fr->text);
    /* text = decode(prompt + gen) - decode(prompt) */
    int32_t *all = malloc((n_ids + 60) * sizeof *all);
    memcpy(all, ids, n_ids * sizeof *ids);
    memcpy(all + n_ids, fr->token_ids, 60 * sizeof *all);
    char *full, *pre;
    size_t full_len, pre_len;
    assert_int_equal(tok_decode(g_tok, all, n_ids + 60, true, &full, &full_len, &err), PG_OK);
    assert_int_equal(tok_decode(g_tok, ids, n_ids, true, &pre, &pre_len, &err), PG_OK);
    assert_true(full_len >= pre_len);
    assert_int_equal(fr->text_len, full_len - pre_len);
    assert_memory_equal(fr->text, full + pre_len, fr->text_len);
    printf("  free run text: \"%s\"\n", fr->text);
    assert_true(fr->text_len > 8);

    /* a stop string from the middle of that text */
    char stop[8];
    size_t at = fr->text_len / 2;
    memcpy(stop, fr->text + at, 3);
    stop[3] = '\0';
    size_t first = (size_t)(strstr(fr->text, stop) - fr->text);
    const char *stops[2] = {"\x01never", stop};
    sp.stop = stops;
    sp.n_stop = 2;
    request_output *o = run(ids, (int32_t)n_ids, &sp);
    const seq_output *so = &o->outputs[0];
    assert_int_equal(so->finish, FINISH_STOP);
    assert_string_equal(so->stop_str, stop);
    assert_int_equal(so->text_len, first);
    assert_memory_equal(so->text, fr->text, first);
    assert_true(so->n_tokens < 60);
    assert_memory_equal(so->token_ids, fr->token_ids, (size_t)so->n_tokens * sizeof(int32_t));
    request_output_free(o);

    sp.include_stop_str_in_output = true;
    o = run(ids, (int32_t)n_ids, &sp);
    so = &o->outputs[0];
    assert_int_equal(so->finish, FINISH_STOP);
    assert_int_equal(so->text_len, first + 3);
    assert_memory_equal(so->text, fr->text, first + 3);
    request_output_free(o);

    /* min_tokens beyond the whole run: stop strings are not checked */
    sp.min_tokens = 60;
    o = run(ids, (int32_t)n_ids, &sp);
    assert_int_equal(o->outputs[0].finish, FINISH_LENGTH);
    assert_null(o->outputs[0].stop_str);
    assert_int_equal(o->outputs[0].text_len, fr->text_len);
    request_output_free(o);

    free(full);
    free(pre);
    free(all);
    free(ids);
    request_output_free(free_run);
}

/* A stop token id (vLLM v1): it is the last of token_ids; its text is in
 * the output only with include_stop_str_in_output. */
static void test_stop_token_text(void **state)
{
    (void)state;
    pg_error err;
    const char *prompt_text = "Once upon a time, there was a little girl";
    int32_t *ids;
    size_t n_ids;
    assert_int_equal(tok_encode(g_tok, prompt_text, strlen(prompt_text), true, &ids, &n_ids, &err),
                     PG_OK);
    sampling_params sp = sampling_params_default();
    sp.temperature = 0.0f;
    sp.max_tokens = 40;
    sp.ignore_eos = true;
    request_output *free_run = run(ids, (int32_t)n_ids, &sp);
    const seq_output *fr = &free_run->outputs[0];
    int32_t stop = fr->token_ids[10];
    int32_t first = 0;
    while (fr->token_ids[first] != stop) first++;
    sp.stop_token_ids = &stop;
    sp.n_stop_token_ids = 1;
    /* the text of the tokens before the stop id, and with it */
    char *before, *with;
    size_t before_len, with_len, pre_len;
    char *pre;
    int32_t *all = malloc((n_ids + 40) * sizeof *all);
    memcpy(all, ids, n_ids * sizeof *ids);
    memcpy(all + n_ids, fr->token_ids, 40 * sizeof *all);
    assert_int_equal(tok_decode(g_tok, ids, n_ids, true, &pre, &pre_len, &err), PG_OK);
    assert_int_equal(tok_decode(g_tok, all, n_ids + (size_t)first, true, &before, &before_len, &err), PG_OK);
    assert_int_equal(tok_decode(g_tok, all, n_ids + (size_t)first + 1, true, &with, &with_len, &err), PG_OK);
    assert_true(with_len > before_len);
    for (int inc = 0; inc < 2; inc++) {
        sp.include_stop_str_in_output = inc;
        request_output *o = run(ids, (int32_t)n_ids, &sp);
        const seq_output *so = &o->outputs[0];
        assert_int_equal(so->finish, FINISH_STOP);
        assert_int_equal(so->stop_token_id, stop);
        assert_int_equal(so->n_tokens, first + 1);
        assert_int_equal(so->token_ids[first], stop);
        const char *want = inc ? with : before;
        size_t want_len = (inc ? with_len : before_len) - pre_len;
        assert_int_equal(so->text_len, want_len);
        assert_memory_equal(so->text, want + pre_len, want_len);
        request_output_free(o);
    }
    free(all);
    free(pre);
    free(before);
    free(with);
    free(ids);
    request_output_free(free_run);
}

int main(void)
{
    pg_error err;
    if (tok_load(&g_tok, pg_test_shared_path("models/stories260K"), &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_and_stop_strings),
        cmocka_unit_test(test_stop_token_text),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tok_free(g_tok);
    return rc;
}
