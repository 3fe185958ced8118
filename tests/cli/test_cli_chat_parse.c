/* tests/cli/test_cli_chat_parse: chat requests in cli_request_parse — jsonl
 * "messages" lines and openai /v1/chat/completions bodies: every field,
 * null handling, vLLM's validators, the kept request text, errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "chat_render.h"
#include "request_parse.h"

static int parse(cli_request *r, const char *line, cli_format fmt, pg_error *err)
{
    sampling_params d = sampling_params_default();
    d.max_tokens = 256;
    d.temperature = 0.0f;
    return cli_request_parse(r, line, strlen(line), fmt, 5, 6, &d, 42, err);
}

#define MSGS "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]"

static void test_jsonl_every_field(void **state)
{
    (void)state;
    cli_request r;
    pg_error err;
    const char *line =
        "{\"id\": \"c1\", " MSGS ", \"add_generation_prompt\": false, \"continue_final_message\": true,"
        " \"chat_template_kwargs\": {\"enable_thinking\": false}, \"tools\": [{\"type\": \"function\"}],"
        " \"documents\": [{\"title\": \"t\", \"text\": \"x\"}], \"max_tokens\": 9, \"logprobs\": true,"
        " \"top_logprobs\": 3, \"n\": 2, \"stop\": [\"a\"], \"seed\": 11, \"temperature\": 0.5,"
        " \"top_p\": 0.9, \"top_k\": 4, \"min_p\": 0.05, \"presence_penalty\": 0.1,"
        " \"frequency_penalty\": 0.2, \"repetition_penalty\": 1.1, \"stop_token_ids\": [7],"
        " \"ignore_eos\": true, \"min_tokens\": 1, \"skip_special_tokens\": false,"
        " \"include_stop_str_in_output\": true}";
    assert_int_equal(parse(&r, line, CLI_FORMAT_JSONL, &err), PG_OK);
    assert_string_equal(r.id_json, "\"c1\"");
    assert_null(r.prompt);
    assert_null(r.prompt_ids);
    /* the whole object is kept for the renderer, byte for byte */
    assert_non_null(r.chat_json);
    assert_int_equal(r.chat_json_len, strlen(line));
    assert_string_equal(r.chat_json, line);
    assert_true(r.max_tokens_set);
    assert_int_equal(r.sp.max_tokens, 9);
    assert_int_equal(r.sp.logprobs, 3);
    assert_int_equal(r.sp.n, 2);
    assert_int_equal(r.sp.n_stop, 1);
    assert_string_equal(r.sp.stop[0], "a");
    assert_true(r.sp.seed == 11);
    assert_true(r.sp.temperature == 0.5f && r.sp.top_p == 0.9f && r.sp.min_p == 0.05f);
    assert_int_equal(r.sp.top_k, 4);
    assert_true(r.sp.presence_penalty == 0.1f && r.sp.frequency_penalty == 0.2f);
    assert_true(r.sp.repetition_penalty == 1.1f);
    assert_int_equal(r.sp.n_stop_token_ids, 1);
    assert_int_equal(r.sp.stop_token_ids[0], 7);
    assert_true(r.sp.ignore_eos && !r.sp.skip_special_tokens && r.sp.include_stop_str_in_output);
    assert_int_equal(r.sp.min_tokens, 1);
    cli_request_free(&r);
}

static void test_jsonl_defaults_and_nulls(void **state)
{
    (void)state;
    cli_request r;
    pg_error err;
    /* no id, no max_tokens: index id, max_tokens left to run.c */
    assert_int_equal(parse(&r, "{" MSGS "}", CLI_FORMAT_JSONL, &err), PG_OK);
    assert_string_equal(r.id_json, "5");
    assert_false(r.max_tokens_set);
    assert_int_equal(r.sp.logprobs, -1);
    assert_true(r.sp.seed == cli_request_seed(42, 5));
    cli_request_free(&r);

    /* null = not set, for every chat field */
    const char *nulls =
        "{" MSGS ", \"add_generation_prompt\": null, \"continue_final_message\": null,"
        " \"chat_template_kwargs\": null, \"tools\": null, \"documents\": null, \"max_tokens\": null,"
        " \"max_completion_tokens\": null, \"logprobs\": null, \"top_logprobs\": null, \"n\": null,"
        " \"stop\": null, \"seed\": null, \"temperature\": null, \"top_p\": null, \"top_k\": null,"
        " \"min_p\": null, \"presence_penalty\": null, \"frequency_penalty\": null,"
        " \"repetition_penalty\": null, \"stop_token_ids\": null, \"ignore_eos\": null,"
        " \"min_tokens\": null, \"skip_special_tokens\": null, \"include_stop_str_in_output\": null}";
    assert_int_equal(parse(&r, nulls, CLI_FORMAT_JSONL, &err), PG_OK);
    assert_false(r.max_tokens_set);
    assert_int_equal(r.sp.max_tokens, 256);
    assert_int_equal(r.sp.logprobs, -1);
    assert_int_equal(r.sp.n, 1);
    assert_true(r.sp.temperature == 0.0f);
    assert_true(r.sp.skip_special_tokens);
    cli_request_free(&r);

    /* logprobs true without top_logprobs: the sampled token's logprob only */
    assert_int_equal(parse(&r, "{" MSGS ", \"logprobs\": true}", CLI_FORMAT_JSONL, &err), PG_OK);
    assert_int_equal(r.sp.logprobs, 0);
    cli_request_free(&r);
    /* logprobs false with top_logprobs 0 is fine (vLLM checks only > 0) */
    assert_int_equal(parse(&r, "{" MSGS ", \"logprobs\": false, \"top_logprobs\": 0}", CLI_FORMAT_JSONL,
                           &err), PG_OK);
    assert_int_equal(r.sp.logprobs, -1);
    cli_request_free(&r);

    /* max_completion_tokens wins over max_tokens, in either order */
    assert_int_equal(parse(&r, "{" MSGS ", \"max_completion_tokens\": 3, \"max_tokens\": 8}",
                           CLI_FORMAT_JSONL, &err), PG_OK);
    assert_int_equal(r.sp.max_tokens, 3);
    assert_true(r.max_tokens_set);
    cli_request_free(&r);
    assert_int_equal(parse(&r, "{\"max_tokens\": 8, " MSGS ", \"max_completion_tokens\": 3}",
                           CLI_FORMAT_JSONL, &err), PG_OK);
    assert_int_equal(r.sp.max_tokens, 3);
    cli_request_free(&r);

    /* add_generation_prompt true alone, continue_final_message true alone */
    assert_int_equal(parse(&r, "{" MSGS ", \"add_generation_prompt\": true}", CLI_FORMAT_JSONL, &err), PG_OK);
    cli_request_free(&r);
    assert_int_equal(parse(&r, "{" MSGS ", \"continue_final_message\": true}", CLI_FORMAT_JSONL, &err),
                     PG_OK);
    cli_request_free(&r);
    /* a jsonl line's "model" names the base model or a --lora adapter (run.c resolves it) */
    assert_int_equal(parse(&r, "{" MSGS ", \"model\": \"ft-a\"}", CLI_FORMAT_JSONL, &err), PG_OK);
    assert_non_null(r.model);
    assert_string_equal(r.model, "ft-a");
    cli_request_free(&r);
}

static void test_jsonl_bad(void **state)
{
    (void)state;
    struct { const char *line; const char *msg; } bad[] = {
        {"{\"messages\": \"hi\"}", "field 'messages': expected an array of message objects"},
        {"{\"messages\": []}", "field 'messages': empty"},
        {"{\"messages\": [\"hi\"]}", "field 'messages': expected an array of message objects"},
        {"{\"messages\": null}", "field 'messages'"},
        {"{" MSGS ", \"prompt\": \"x\"}", "give either 'messages' or 'prompt', not both"},
        {"{\"prompt_token_ids\": [1], " MSGS "}", "give either 'messages' or 'prompt_token_ids'"},
        {"{" MSGS ", \"add_generation_prompt\": 1}", "field 'add_generation_prompt': expected true or false"},
        {"{" MSGS ", \"continue_final_message\": \"yes\"}", "field 'continue_final_message'"},
        {"{" MSGS ", \"add_generation_prompt\": true, \"continue_final_message\": true}",
         "cannot set both `continue_final_message` and `add_generation_prompt`"},
        {"{" MSGS ", \"chat_template_kwargs\": [1]}", "field 'chat_template_kwargs': expected an object"},
        {"{" MSGS ", \"tools\": {}}", "field 'tools': expected an array"},
        {"{" MSGS ", \"documents\": \"d\"}", "field 'documents': expected an array"},
        {"{" MSGS ", \"logprobs\": 2}", "field 'logprobs': expected true or false"},
        {"{" MSGS ", \"top_logprobs\": 2}", "when using `top_logprobs`, `logprobs` must be set to true"},
        {"{" MSGS ", \"logprobs\": true, \"top_logprobs\": 21}", "field 'top_logprobs': expected an integer in [0, 20]"},
        {"{" MSGS ", \"logprobs\": true, \"top_logprobs\": -1}", "field 'top_logprobs'"},
        {"{" MSGS ", \"max_completion_tokens\": 0}", "field 'max_completion_tokens': expected an integer in [1"},
        {"{" MSGS ", \"max_tokens\": 0}", "field 'max_tokens'"},
        {"{" MSGS ", \"model\": 3}", "field 'model': expected a string"},
        {"{" MSGS ", \"stream\": false}", "unknown field 'stream'"},
        {"{" MSGS ", \"colour\": 1}", "unknown field 'colour'"},
        {"{" MSGS ", " MSGS "}", "given twice"},
        {"{" MSGS ", \"top_p\": 0}", "top_p must be in (0, 1]"},
        {"{" MSGS ", \"stop\": \"\"}", "stop strings must be non-empty"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        cli_request r;
        pg_error err;
        int rc = parse(&r, bad[k].line, CLI_FORMAT_JSONL, &err);
        if (rc == PG_OK)
            fail_msg("case %zu accepted: %s", k, bad[k].line);
        if (!strstr(err.msg, bad[k].msg))
            fail_msg("case %zu: '%s' does not mention '%s'", k, err.msg, bad[k].msg);
        assert_string_equal(r.id_json, "5");
        cli_request_free(&r);
    }
}

#define CHAT_HEAD "{\"custom_id\": \"c\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": "

static void test_openai_chat(void **state)
{
    (void)state;
    cli_request r;
    pg_error err;
    const char *body = "{\"model\": \"m\", " MSGS ", \"user\": null, \"stream\": false, \"max_completion_tokens\": 4,"
                       " \"logprobs\": true, \"top_logprobs\": 2, \"temperature\": 0}";
    char line[1024];
    snprintf(line, sizeof line, CHAT_HEAD "%s}", body);
    assert_int_equal(cli_detect_format(line, strlen(line)), CLI_FORMAT_OPENAI);
    assert_int_equal(parse(&r, line, CLI_FORMAT_OPENAI, &err), PG_OK);
    assert_string_equal(r.id_json, "\"c\"");
    assert_string_equal(r.chat_json, body); /* the body, not the envelope */
    assert_int_equal(r.sp.max_tokens, 4);
    assert_int_equal(r.sp.logprobs, 2);
    assert_null(r.prompt);
    cli_request_free(&r);

    struct { const char *line; const char *msg; } bad[] = {
        {CHAT_HEAD "{}}", "body: missing 'messages'"},
        {CHAT_HEAD "[]}", "field 'body': expected an object"},
        {CHAT_HEAD "{" MSGS ", \"stream\": true}}", "field 'stream': only false is supported"},
        {CHAT_HEAD "{" MSGS ", \"model\": 3}}", "field 'model': expected a string"},
        {CHAT_HEAD "{" MSGS ", \"echo\": false}}", "unknown field 'echo'"},
        {CHAT_HEAD "{" MSGS ", \"prompt\": \"x\"}}", "not both"},
        {CHAT_HEAD "{" MSGS ", \"logprobs\": 1}}", "field 'logprobs': expected true or false"},
        {CHAT_HEAD "{" MSGS ", \"id\": 1}}", "unknown field 'id'"},
        {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {" MSGS "}}", "unknown field 'messages'"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        int rc = parse(&r, bad[k].line, CLI_FORMAT_OPENAI, &err);
        if (rc == PG_OK)
            fail_msg("case %zu accepted: %s", k, bad[k].line);
        if (!strstr(err.msg, bad[k].msg))
            fail_msg("case %zu: '%s' does not mention '%s'", k, err.msg, bad[k].msg);
        assert_string_equal(r.id_json, "\"c\"");
        assert_null(r.chat_json);
        cli_request_free(&r);
    }
}

/* --reasoning-parser's inputs: enable_thinking read with Python truthiness
 * (qwen3_reasoning_parser.py: chat_kwargs.get("enable_thinking", True)),
 * include_reasoning a bool (default true, null = not set) */
static void test_reasoning_fields(void **state)
{
    (void)state;
    static const struct { const char *kwargs; bool disabled; } kw[] = {
        {"", false},
        {", \"chat_template_kwargs\": null", false},
        {", \"chat_template_kwargs\": {}", false},
        {", \"chat_template_kwargs\": {\"enable_thinking\": true}", false},
        {", \"chat_template_kwargs\": {\"enable_thinking\": false}", true},
        {", \"chat_template_kwargs\": {\"enable_thinking\": null}", true},
        {", \"chat_template_kwargs\": {\"enable_thinking\": 0}", true},
        {", \"chat_template_kwargs\": {\"enable_thinking\": 0.0}", true},
        {", \"chat_template_kwargs\": {\"enable_thinking\": \"\"}", true},
        {", \"chat_template_kwargs\": {\"enable_thinking\": \"false\"}", false}, /* a non-empty string */
        {", \"chat_template_kwargs\": {\"enable_thinking\": []}", true},
        {", \"chat_template_kwargs\": {\"enable_thinking\": [0]}", false},
        {", \"chat_template_kwargs\": {\"x\": {\"enable_thinking\": false}}", false}, /* top level only */
    };
    for (size_t k = 0; k < sizeof kw / sizeof kw[0]; k++) {
        char line[512];
        snprintf(line, sizeof line, "{" MSGS "%s}", kw[k].kwargs);
        cli_request r;
        pg_error err;
        assert_int_equal(parse(&r, line, CLI_FORMAT_JSONL, &err), PG_OK);
        if (r.thinking_disabled != kw[k].disabled)
            fail_msg("%s: thinking_disabled %d, expected %d", line, r.thinking_disabled, kw[k].disabled);
        assert_false(r.exclude_reasoning);
        cli_request_free(&r);
    }
    static const struct { const char *v; int exclude; } inc[] = {
        {"true", 0}, {"false", 1}, {"null", 0}, {"\"no\"", 1}, {"2", -1},
    };
    for (size_t k = 0; k < sizeof inc / sizeof inc[0]; k++) {
        char line[512];
        snprintf(line, sizeof line,
                 "{\"custom_id\": \"a\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", "
                 "\"body\": {" MSGS ", \"include_reasoning\": %s}}", inc[k].v);
        cli_request r;
        pg_error err;
        sampling_params d = sampling_params_default();
        int rc = cli_request_parse_ex(&r, line, strlen(line), CLI_FORMAT_OPENAI, 0, 1, &d, 0, false, &err);
        if (inc[k].exclude < 0) {
            assert_int_equal(rc, PG_EINVAL);
            assert_non_null(strstr(err.msg, "include_reasoning"));
        } else {
            assert_int_equal(rc, PG_OK);
            assert_int_equal(r.exclude_reasoning, inc[k].exclude);
        }
        cli_request_free(&r);
    }
}

static void test_detect_chat(void **state)
{
    (void)state;
    /* a jsonl line with messages is jsonl; one with custom_id is openai */
    const char *a = "{" MSGS "}";
    assert_int_equal(cli_detect_format(a, strlen(a)), CLI_FORMAT_JSONL);
    const char *b = CHAT_HEAD "{" MSGS "}}";
    assert_int_equal(cli_detect_format(b, strlen(b)), CLI_FORMAT_OPENAI);
    /* the envelope's key names inside a message are not the envelope */
    const char *c = "{\"messages\": [{\"role\": \"user\", \"content\": \"body\"}, {\"custom_id\": 1}]}";
    assert_int_equal(cli_detect_format(c, strlen(c)), CLI_FORMAT_JSONL);
    /* a malformed line: the textual test */
    const char *m = "{\"custom_id\": \"x\", ";
    assert_int_equal(cli_detect_format(m, strlen(m)), CLI_FORMAT_OPENAI);
}

/* strftime_now's clock: the flag, else SOURCE_DATE_EPOCH, else the clock. */
static void test_chat_clock(void **state)
{
    (void)state;
    cli_options o;
    cli_options_init(&o);
    pg_error err;
    int64_t now = -1;
    assert_int_equal(cli_chat_clock(&o, "1785067200", &now, &err), PG_OK);
    assert_true(now == 1785067200);
    assert_int_equal(cli_chat_clock(&o, NULL, &now, &err), PG_OK);
    assert_true(now > 1700000000); /* the clock */
    assert_int_equal(cli_chat_clock(&o, "", &now, &err), PG_OK);
    assert_true(now > 1700000000);
    const char *bad[] = {"x", "-5", "12a", " 12", "1e9", "99999999999999999999", "+7"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        if (cli_chat_clock(&o, bad[k], &now, &err) != PG_EINVAL)
            fail_msg("SOURCE_DATE_EPOCH '%s' accepted", bad[k]);
        assert_non_null(strstr(err.msg, "SOURCE_DATE_EPOCH"));
    }
    o.has_chat_date = true;
    o.chat_date_unix = 43200;
    assert_int_equal(cli_chat_clock(&o, "x", &now, &err), PG_OK); /* the flag wins */
    assert_true(now == 43200);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jsonl_every_field),
        cmocka_unit_test(test_jsonl_defaults_and_nulls),
        cmocka_unit_test(test_jsonl_bad),
        cmocka_unit_test(test_openai_chat),
        cmocka_unit_test(test_reasoning_fields),
        cmocka_unit_test(test_detect_chat),
        cmocka_unit_test(test_chat_clock),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
