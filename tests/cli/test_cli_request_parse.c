/* tests/cli/test_cli_request_parse: each kind of good and bad input line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "id_set.h"
#include "request_parse.h"

static sampling_params defaults(void)
{
    sampling_params d = sampling_params_default();
    d.max_tokens = 256;
    d.temperature = 0.0f;
    return d;
}

static int parse(cli_request *r, const char *line, cli_format fmt, pg_error *err)
{
    sampling_params d = defaults();
    return cli_request_parse(r, line, strlen(line), fmt, 5, 6, &d, 42, err);
}

static void test_text_line(void **state)
{
    (void)state;
    cli_request r;
    pg_error err;
    assert_int_equal(parse(&r, "Once upon a time", CLI_FORMAT_TEXT, &err), PG_OK);
    assert_string_equal(r.prompt, "Once upon a time");
    assert_string_equal(r.id_json, "5");
    assert_int_equal(r.sp.max_tokens, 256);
    assert_true(r.sp.seed == cli_request_seed(42, 5));
    assert_true(cli_request_seed(42, 5) != cli_request_seed(42, 6));
    assert_true(cli_request_seed(42, 5) != cli_request_seed(43, 5));
    cli_request_free(&r);
}

static void test_jsonl_good(void **state)
{
    (void)state;
    cli_request r;
    pg_error err;
    assert_int_equal(parse(&r,
        "{\"id\": \"a\\u00e9\", \"prompt\": \"hi\", \"max_tokens\": 3, \"temperature\": 0.7, \"top_p\": 0.9,"
        " \"top_k\": 5, \"min_p\": 0.1, \"seed\": 7, \"n\": 2, \"stop\": [\"x\", \"yy\"],"
        " \"stop_token_ids\": [3, 4], \"ignore_eos\": true, \"include_stop_str_in_output\": true,"
        " \"skip_special_tokens\": false, \"presence_penalty\": 0.5, \"frequency_penalty\": -0.5,"
        " \"repetition_penalty\": 1.2, \"logprobs\": 2, \"min_tokens\": 1}",
        CLI_FORMAT_JSONL, &err), PG_OK);
    assert_string_equal(r.id_json, "\"a\xc3\xa9\"");
    assert_string_equal(r.id_key, "s:a\xc3\xa9");
    assert_int_equal(r.sp.max_tokens, 3);
    assert_true(r.sp.temperature == 0.7f);
    assert_int_equal(r.sp.top_k, 5);
    assert_true(r.sp.seed == 7);
    assert_int_equal(r.sp.n, 2);
    assert_int_equal(r.sp.n_stop, 2);
    assert_string_equal(r.sp.stop[1], "yy");
    assert_int_equal(r.sp.n_stop_token_ids, 2);
    assert_int_equal(r.sp.stop_token_ids[1], 4);
    assert_true(r.sp.ignore_eos && r.sp.include_stop_str_in_output && !r.sp.skip_special_tokens);
    assert_int_equal(r.sp.logprobs, 2);
    cli_request_free(&r);

    assert_int_equal(parse(&r, "{\"id\": 17, \"prompt_token_ids\": [1, 2, 3], \"seed\": null}",
                           CLI_FORMAT_JSONL, &err), PG_OK);
    assert_string_equal(r.id_json, "17");
    assert_string_equal(r.id_key, "n:17");
    assert_int_equal(r.n_prompt_ids, 3);
    assert_null(r.prompt);
    assert_true(r.sp.seed == cli_request_seed(42, 5));
    cli_request_free(&r);

    /* no id: the request index */
    assert_int_equal(parse(&r, "{\"prompt\": \"x\", \"stop\": \"s\"}", CLI_FORMAT_JSONL, &err), PG_OK);
    assert_string_equal(r.id_json, "5");
    assert_int_equal(r.sp.n_stop, 1);
    cli_request_free(&r);
}

static void test_jsonl_bad(void **state)
{
    (void)state;
    struct { const char *line; const char *msg; const char *id; } bad[] = {
        {"{\"prompt\": \"x\"", "invalid JSON", "5"},
        {"[1, 2]", "expected a JSON object", "5"},
        {"{\"id\": \"q\", \"prompt\": 3}", "field 'prompt': expected a string", "\"q\""},
        {"{\"prompt\": \"x\", \"max_tokens\": \"ten\"}", "field 'max_tokens': expected an integer", "5"},
        {"{\"prompt\": \"x\", \"max_tokens\": 0}", "field 'max_tokens': expected an integer in [1", "5"},
        {"{\"prompt\": \"x\", \"max_tokens\": 2.5}", "max_tokens", "5"},
        {"{\"prompt\": \"x\", \"colour\": 1}", "unknown field 'colour'", "5"},
        {"{\"prompt\": \"\"}", "empty prompt", "5"},
        {"{\"prompt_token_ids\": []}", "empty prompt", "5"},
        {"{\"prompt_token_ids\": [1, -2]}", "prompt_token_ids", "5"},
        {"{\"prompt\": \"x\", \"top_p\": 0}", "top_p must be in (0, 1]", "5"},
        {"{\"prompt\": \"x\", \"n\": 0}", "n must be in", "5"},
        {"{\"prompt\": \"x\", \"temperature\": -1}", "temperature", "5"},
        {"{\"prompt\": \"x\", \"ignore_eos\": 1}", "field 'ignore_eos': expected true or false", "5"},
        {"{\"prompt\": \"x\", \"stop\": [\"a\", 2]}", "field 'stop': expected a string", "5"},
        {"{\"prompt\": \"x\", \"stop\": \"\"}", "stop strings must be non-empty", "5"},
        {"{\"id\": [1], \"prompt\": \"x\"}", "field 'id': expected a string or an integer", NULL},
        {"{\"id\": 1.5, \"prompt\": \"x\"}", "field 'id'", NULL},
        {"{\"max_tokens\": 4}", "missing 'prompt'", "5"},
        {"{\"prompt\": \"x\", \"prompt_token_ids\": [1]}", "not both", "5"},
        {"{\"prompt\": \"x\", \"prompt\": \"y\"}", "given twice", "5"},
        {"{\"prompt\": \"x\", \"logprobs\": 99}", "logprobs", "5"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        cli_request r;
        pg_error err;
        int rc = parse(&r, bad[k].line, CLI_FORMAT_JSONL, &err);
        if (rc == PG_OK)
            fail_msg("case %zu accepted: %s", k, bad[k].line);
        if (!strstr(err.msg, bad[k].msg))
            fail_msg("case %zu: '%s' does not mention '%s'", k, err.msg, bad[k].msg);
        if (bad[k].id)
            assert_string_equal(r.id_json, bad[k].id);
        else
            assert_null(r.id_json);
        cli_request_free(&r);
    }
}

static void test_openai(void **state)
{
    (void)state;
    cli_request r;
    pg_error err;
    const char *good = "{\"custom_id\": \"req-1\", \"method\": \"POST\", \"url\": \"/v1/completions\", "
                       "\"body\": {\"model\": \"m\", \"prompt\": \"Hi\", \"max_tokens\": 5, \"logprobs\": 1}}";
    assert_int_equal(cli_detect_format(good, strlen(good)), CLI_FORMAT_OPENAI);
    assert_int_equal(parse(&r, good, CLI_FORMAT_OPENAI, &err), PG_OK);
    assert_string_equal(r.id_json, "\"req-1\"");
    assert_string_equal(r.prompt, "Hi");
    assert_int_equal(r.sp.max_tokens, 5);
    assert_int_equal(r.sp.logprobs, 1);
    cli_request_free(&r);

    struct { const char *line; const char *msg; } bad[] = {
        {"{\"custom_id\": \"c\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": {}}",
         "body: missing 'messages'"},
        {"{\"custom_id\": \"c\", \"method\": \"POST\", \"url\": \"/v1/embeddings\", \"body\": {}}",
         "body: missing 'input'"},
        {"{\"custom_id\": \"c\", \"method\": \"POST\", \"url\": \"/v1/score\", \"body\": {}}",
         "field 'url': expected \"/v1/completions\", \"/v1/chat/completions\" or \"/v1/embeddings\""},
        {"{\"custom_id\": \"c\", \"method\": \"GET\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\"}}",
         "field 'method'"},
        {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\", \"foo\": 1}}",
         "unknown field 'foo'"},
        {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [\"a\", \"b\"]}}",
         "list of prompts"},
        {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"x\", \"stream\": true}}",
         "only false"},
        {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\"}", "missing 'body'"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        int rc = parse(&r, bad[k].line, CLI_FORMAT_OPENAI, &err);
        assert_int_not_equal(rc, PG_OK);
        if (!strstr(err.msg, bad[k].msg))
            fail_msg("case %zu: '%s' does not mention '%s'", k, err.msg, bad[k].msg);
        assert_string_equal(r.id_json, "\"c\"");
        cli_request_free(&r);
    }
    assert_int_not_equal(parse(&r, "{\"url\": \"/v1/completions\"}", CLI_FORMAT_OPENAI, &err), PG_OK);
    assert_non_null(strstr(err.msg, "custom_id"));
    assert_null(r.id_json);
    cli_request_free(&r);
}

static void test_detect(void **state)
{
    (void)state;
    assert_int_equal(cli_detect_format("hello", 5), CLI_FORMAT_TEXT);
    assert_int_equal(cli_detect_format("  {\"prompt\": 1}", 15), CLI_FORMAT_JSONL);
    assert_int_equal(cli_detect_format("{\"prompt\": ", 11), CLI_FORMAT_JSONL);
}

static void test_duplicate_ids(void **state)
{
    (void)state;
    cli_id_set *s = cli_id_set_create();
    assert_non_null(s);
    char key[32];
    for (int k = 0; k < 1000; k++) {
        int n = snprintf(key, sizeof key, "n:%d", k);
        assert_int_equal(cli_id_set_add(s, key, (size_t)n, k + 1, NULL), 1);
    }
    int64_t first = 0;
    assert_int_equal(cli_id_set_add(s, "n:500", 5, 9999, &first), 0);
    assert_int_equal(first, 501);
    assert_true(cli_id_set_has(s, "n:999", 5));
    assert_false(cli_id_set_has(s, "s:999", 5));
    assert_int_equal(cli_id_set_add(s, "s:a\0b", 5, 1, NULL), 1); /* embedded NUL is part of the key */
    assert_false(cli_id_set_has(s, "s:a", 3));
    assert_int_equal(cli_id_set_count(s), 1001);
    cli_id_set_destroy(s);
}

static int parse_lax(cli_request *r, const char *line, cli_format fmt, pg_error *err)
{
    sampling_params d = defaults();
    return cli_request_parse_ex(r, line, strlen(line), fmt, 5, 6, &d, 42, false, err);
}

/* vLLM's leniency (pydantic lax mode, extra fields ignored) unless strict:
 * each coercion or ignored field counts in n_lax; cli_request_parse stays
 * strict. */
static void test_lax_and_strict(void **state)
{
    (void)state;
    cli_request r;
    pg_error err;
    const char *line =
        "{\"prompt\": \"hi\", \"max_tokens\": 3.0, \"temperature\": \"0.5\", \"top_k\": \"4\","
        " \"ignore_eos\": \"True\", \"skip_special_tokens\": 0.0, \"colour\": \"red\"}";
    assert_int_equal(parse_lax(&r, line, CLI_FORMAT_JSONL, &err), PG_OK);
    assert_int_equal(r.sp.max_tokens, 3);
    assert_true(r.sp.temperature == 0.5f);
    assert_int_equal(r.sp.top_k, 4);
    assert_true(r.sp.ignore_eos);
    assert_false(r.sp.skip_special_tokens);
    assert_int_equal(r.n_lax, 6);
    cli_request_free(&r);
    /* a clean line counts nothing */
    assert_int_equal(parse_lax(&r, "{\"prompt\": \"hi\", \"max_tokens\": 3}", CLI_FORMAT_JSONL, &err), PG_OK);
    assert_int_equal(r.n_lax, 0);
    cli_request_free(&r);
    /* strict: each is today's error */
    static const char *const strict_bad[][2] = {
        {"{\"prompt\": \"hi\", \"max_tokens\": 3.0}", "max_tokens"},
        {"{\"prompt\": \"hi\", \"temperature\": \"0.5\"}", "temperature"},
        {"{\"prompt\": \"hi\", \"ignore_eos\": \"true\"}", "ignore_eos"},
        {"{\"prompt\": \"hi\", \"colour\": \"red\"}", "unknown field 'colour'"},
    };
    for (size_t k = 0; k < sizeof strict_bad / sizeof strict_bad[0]; k++) {
        assert_int_equal(parse(&r, strict_bad[k][0], CLI_FORMAT_JSONL, &err), PG_EINVAL);
        assert_non_null(strstr(err.msg, strict_bad[k][1]));
        cli_request_free(&r);
    }
    /* what pydantic refuses in lax mode too */
    static const char *const lax_bad[][2] = {
        {"{\"prompt\": \"hi\", \"max_tokens\": 3.5}", "max_tokens"},
        {"{\"prompt\": \"hi\", \"max_tokens\": \"three\"}", "max_tokens"},
        {"{\"prompt\": \"hi\", \"temperature\": \"0.5x\"}", "temperature"},
        {"{\"prompt\": \"hi\", \"ignore_eos\": \"maybe\"}", "ignore_eos"},
        {"{\"prompt\": \"hi\", \"ignore_eos\": 2}", "ignore_eos"},
        {"{\"prompt\": \"hi\", \"top_k\": 1e30}", "top_k"},
    };
    for (size_t k = 0; k < sizeof lax_bad / sizeof lax_bad[0]; k++) {
        assert_int_equal(parse_lax(&r, lax_bad[k][0], CLI_FORMAT_JSONL, &err), PG_EINVAL);
        assert_non_null(strstr(err.msg, lax_bad[k][1]));
        cli_request_free(&r);
    }
    /* fields vLLM applies and pagedgen does not: an error unless neutral,
     * strict or not (never silently ignored) */
    static const char *const unsupported[] = {
        "{\"prompt\": \"hi\", \"logit_bias\": {\"5\": 10}}",
        "{\"prompt\": \"hi\", \"best_of\": 2}",
        "{\"prompt\": \"hi\", \"bad_words\": [\"x\"]}", "{\"prompt\": \"hi\", \"allowed_token_ids\": [1]}",
        "{\"prompt\": \"hi\", \"spaces_between_special_tokens\": false}",
    };
    for (size_t k = 0; k < sizeof unsupported / sizeof unsupported[0]; k++) {
        assert_int_equal(parse_lax(&r, unsupported[k], CLI_FORMAT_JSONL, &err), PG_EINVAL);
        assert_non_null(strstr(err.msg, "is not supported by pagedgen"));
        cli_request_free(&r);
        assert_int_equal(parse(&r, unsupported[k], CLI_FORMAT_JSONL, &err), PG_EINVAL);
        assert_non_null(strstr(err.msg, "is not supported by pagedgen"));
        cli_request_free(&r);
    }
    /* beam search (issue 35): vLLM's fields; n > 1 at temperature 0 is the
     * width; temperature > 0 is refused by name */
    assert_int_equal(parse(&r, "{\"prompt\": \"hi\", \"use_beam_search\": true, \"n\": 3, "
                               "\"temperature\": 0, \"length_penalty\": 0.6}", CLI_FORMAT_JSONL, &err), PG_OK);
    assert_true(r.sp.use_beam_search);
    assert_int_equal(r.sp.n, 3);
    assert_true(r.sp.length_penalty == 0.6);
    cli_request_free(&r);
    assert_int_equal(parse(&r, "{\"prompt\": \"hi\", \"use_beam_search\": true, \"n\": 3, \"temperature\": 0.5}",
                           CLI_FORMAT_JSONL, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "beam search: temperature"));
    cli_request_free(&r);
    assert_int_equal(parse(&r, "{\"prompt\": \"hi\", \"use_beam_search\": true, \"temperature\": 0, "
                               "\"stop\": [\"x\"]}", CLI_FORMAT_JSONL, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "beam search: stop"));
    cli_request_free(&r);
    assert_int_equal(parse(&r,
        "{\"prompt\": \"hi\", \"logit_bias\": {}, \"best_of\": 1,"
        " \"use_beam_search\": false, \"bad_words\": [], \"spaces_between_special_tokens\": true}",
        CLI_FORMAT_JSONL, &err), PG_OK);
    assert_int_equal(r.n_lax, 0);
    cli_request_free(&r);
    /* prompt_logprobs; echo with max_tokens 0 (prompt_logprobs = logprobs, one token
     * generated and dropped); max_tokens 0 without echo is vLLM's error */
    assert_int_equal(parse(&r, "{\"prompt\": \"hi\", \"prompt_logprobs\": 3}", CLI_FORMAT_JSONL, &err), PG_OK);
    assert_int_equal(r.sp.prompt_logprobs, 3);
    cli_request_free(&r);
    assert_int_equal(parse(&r, "{\"prompt\": \"hi\", \"prompt_logprobs\": 21}", CLI_FORMAT_JSONL, &err), PG_EINVAL);
    cli_request_free(&r);
    assert_int_equal(parse(&r,
        "{\"custom_id\": \"c\", \"method\": \"POST\", \"url\": \"/v1/completions\","
        " \"body\": {\"prompt\": [1, 2, 3], \"echo\": true, \"max_tokens\": 0, \"logprobs\": 1}}",
        CLI_FORMAT_OPENAI, &err), PG_OK);
    assert_true(r.echo && r.echo_only);
    assert_int_equal(r.sp.max_tokens, 1);
    assert_int_equal(r.sp.prompt_logprobs, 1);
    cli_request_free(&r);
    assert_int_equal(parse(&r,
        "{\"custom_id\": \"c\", \"method\": \"POST\", \"url\": \"/v1/completions\","
        " \"body\": {\"prompt\": [1, 2, 3], \"max_tokens\": 0}}",
        CLI_FORMAT_OPENAI, &err), PG_EINVAL);
    assert_string_equal(err.msg, "max_tokens must be at least 1, got 0.");
    cli_request_free(&r);
    /* greedy n > 1: vLLM's _verify_greedy_sampling message; sampled n > 1 is fine */
    assert_int_equal(parse_lax(&r, "{\"prompt\": \"hi\", \"n\": 2, \"temperature\": 0}", CLI_FORMAT_JSONL, &err),
                     PG_EINVAL);
    assert_string_equal(err.msg, "n must be 1 when using greedy sampling, got 2.");
    cli_request_free(&r);
    assert_int_equal(parse_lax(&r, "{\"prompt\": \"hi\", \"n\": 2, \"temperature\": 0.5}", CLI_FORMAT_JSONL, &err),
                     PG_OK);
    cli_request_free(&r);
    /* openai: unknown envelope and body keys ignored, model kept */
    assert_int_equal(parse_lax(&r,
        "{\"custom_id\": \"c\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"extra\": 1,"
        " \"body\": {\"model\": \"m1\", \"prompt\": \"hi\", \"max_tokens\": null, \"x_custom\": \"x\"}}",
        CLI_FORMAT_OPENAI, &err), PG_OK);
    assert_string_equal(r.model, "m1");
    assert_true(r.max_tokens_null);
    assert_false(r.max_tokens_set);
    assert_int_equal(r.n_lax, 2);
    cli_request_free(&r);
    assert_int_equal(parse_lax(&r,
        "{\"custom_id\": \"c\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\","
        " \"body\": {\"model\": \"m2\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
        " \"max_completion_tokens\": null}}",
        CLI_FORMAT_OPENAI, &err), PG_OK);
    assert_string_equal(r.model, "m2");
    assert_true(r.max_tokens_null);
    cli_request_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_line),
        cmocka_unit_test(test_jsonl_good),
        cmocka_unit_test(test_jsonl_bad),
        cmocka_unit_test(test_openai),
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_duplicate_ids),
        cmocka_unit_test(test_lax_and_strict),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
