/* tests/cli/test_cli_request_structured: the structured-output request
 * fields (cli/request_structured.c) through cli_request_parse, in jsonl
 * lines and openai bodies: which kind and text reach sampling_params, and
 * the per-line errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "request_parse.h"

static int parse(cli_request *r, const char *line, cli_format fmt, pg_error *err)
{
    sampling_params d = sampling_params_default();
    return cli_request_parse(r, line, strlen(line), fmt, 0, 1, &d, 1, err);
}

static void expect(const char *line, cli_format fmt, grammar_kind kind, const char *text)
{
    cli_request r;
    pg_error err = {{0}};
    if (parse(&r, line, fmt, &err) != PG_OK)
        fail_msg("%s: %s", line, err.msg);
    assert_int_equal(r.sp.structured_kind, kind);
    if (text) {
        assert_non_null(r.sp.structured);
        assert_int_equal(r.sp.structured_len, strlen(text));
        assert_memory_equal(r.sp.structured, text, strlen(text));
    }
    cli_request_free(&r);
}

static void expect_error(const char *line, cli_format fmt, const char *needle)
{
    cli_request r;
    pg_error err = {{0}};
    assert_int_equal(parse(&r, line, fmt, &err), PG_EINVAL);
    if (!strstr(err.msg, needle))
        fail_msg("%s: message '%s' lacks '%s'", line, err.msg, needle);
    cli_request_free(&r);
}

static void test_fields(void **state)
{
    (void)state;
    expect("{\"prompt\": \"x\"}", CLI_FORMAT_JSONL, GRAMMAR_NONE, NULL);
    expect("{\"prompt\": \"x\", \"guided_json\": {\"type\": \"integer\"}}", CLI_FORMAT_JSONL,
           GRAMMAR_JSON_SCHEMA, "{\"type\": \"integer\"}");
    expect("{\"prompt\": \"x\", \"guided_json\": \"{\\\"type\\\":\\\"null\\\"}\"}", CLI_FORMAT_JSONL,
           GRAMMAR_JSON_SCHEMA, "{\"type\":\"null\"}");
    expect("{\"prompt\": \"x\", \"guided_regex\": \"a\\\\d+\"}", CLI_FORMAT_JSONL, GRAMMAR_REGEX, "a\\d+");
    expect("{\"prompt\": \"x\", \"guided_regex\": \"a\", \"guided_decoding_backend\": \"xgrammar\"}",
           CLI_FORMAT_JSONL, GRAMMAR_REGEX, "a");
    expect("{\"prompt\": \"x\", \"guided_choice\": [\"a\", \"b\"]}", CLI_FORMAT_JSONL, GRAMMAR_CHOICE,
           "[\"a\", \"b\"]");
    expect("{\"prompt\": \"x\", \"structured_outputs\": {\"json\": true}}", CLI_FORMAT_JSONL,
           GRAMMAR_JSON_SCHEMA, "true");
    expect("{\"prompt\": \"x\", \"structured_outputs\": {\"regex\": \"[ab]\", \"json\": null, "
           "\"disable_any_whitespace\": true}}", CLI_FORMAT_JSONL, GRAMMAR_REGEX, "[ab]");
    expect("{\"prompt\": \"x\", \"structured_outputs\": {\"choice\": [\"y\"]}}", CLI_FORMAT_JSONL,
           GRAMMAR_CHOICE, "[\"y\"]");
    expect("{\"prompt\": \"x\", \"structured_outputs\": {\"json_object\": true}}", CLI_FORMAT_JSONL,
           GRAMMAR_JSON_OBJECT, NULL);
    expect("{\"prompt\": \"x\", \"structured_outputs\": {\"json_object\": false}}", CLI_FORMAT_JSONL,
           GRAMMAR_NONE, NULL);
    expect("{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_object\"}}", CLI_FORMAT_JSONL,
           GRAMMAR_JSON_OBJECT, NULL);
    expect("{\"prompt\": \"x\", \"response_format\": {\"type\": \"text\"}, \"guided_json\": null}",
           CLI_FORMAT_JSONL, GRAMMAR_NONE, NULL);
    expect("{\"custom_id\": \"c\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": "
           "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
           "{\"name\": \"n\", \"strict\": true, \"schema\": {\"enum\": [1]}}}}}",
           CLI_FORMAT_OPENAI, GRAMMAR_JSON_SCHEMA, "{\"enum\": [1]}");
}

static void test_errors(void **state)
{
    (void)state;
    expect_error("{\"prompt\": \"x\", \"guided_json\": 3}", CLI_FORMAT_JSONL, "field 'guided_json'");
    expect_error("{\"prompt\": \"x\", \"guided_regex\": [1]}", CLI_FORMAT_JSONL, "expected a string");
    expect_error("{\"prompt\": \"x\", \"guided_choice\": []}", CLI_FORMAT_JSONL, "non-empty array");
    expect_error("{\"prompt\": \"x\", \"guided_choice\": [\"a\", 1]}", CLI_FORMAT_JSONL,
                 "field 'guided_choice'[1]");
    expect_error("{\"prompt\": \"x\", \"guided_choice\": [\"a\"], \"guided_regex\": \"a\"}",
                 CLI_FORMAT_JSONL, "only one structured-output constraint");
    expect_error("{\"prompt\": \"x\", \"structured_outputs\": {\"regex\": \"a\", \"choice\": [\"a\"]}}",
                 CLI_FORMAT_JSONL, "only one");
    expect_error("{\"prompt\": \"x\", \"structured_outputs\": {\"grammar\": \"root ::= x\"}}",
                 CLI_FORMAT_JSONL, "unsupported key 'grammar'");
    expect_error("{\"prompt\": \"x\", \"structured_outputs\": 1}", CLI_FORMAT_JSONL, "expected an object");
    expect_error("{\"prompt\": \"x\", \"guided_grammar\": \"root ::= x\"}", CLI_FORMAT_JSONL,
                 "not supported");
    expect_error("{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\"}}",
                 CLI_FORMAT_JSONL, "json_schema");
    expect_error("{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
                 "{\"name\": \"n\"}}}", CLI_FORMAT_JSONL, "missing 'schema'");
    expect_error("{\"prompt\": \"x\", \"response_format\": {\"type\": \"yaml\"}}", CLI_FORMAT_JSONL,
                 "expected type");
    expect_error("{\"prompt\": \"x\", \"guided_jsn\": {}}", CLI_FORMAT_JSONL, "unknown field 'guided_jsn'");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fields),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
