/* tests/cli/test_cli_reasoning: the <think>...</think> splitter of
 * --reasoning-parser qwen3 / deepseek_r1 on every edge case of vLLM's
 * extract_reasoning (qwen3_reasoning_parser.py at 00a4c6a1, basic_parsers.py
 * at 9b533e7b): both tags, the start tag in the prompt, no end tag (cut),
 * thinking disabled, an empty output, text before <think>, two end tags,
 * Qwen3's implicit end at <tool_call><function=...>, and the prompt check
 * vLLM's structured outputs use. Expected values were worked out from the
 * Python source by hand and checked against a transcription of it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "reasoning.h"

#define NUL_ ((const char *)0) /* a null part */

typedef struct split_case {
    const char *text;
    cli_reasoning_parser p;
    bool thinking;
    const char *reasoning; /* NUL_ = null */
    const char *content;
} split_case;

#define Q CLI_REASONING_QWEN3
#define R1 CLI_REASONING_DEEPSEEK_R1

static const split_case cases[] = {
    /* both tags: the same for every parser and thinking state */
    {"<think>abc</think>def", Q, true, "abc", "def"},
    {"<think>abc</think>def", Q, false, "abc", "def"},
    {"<think>abc</think>def", R1, true, "abc", "def"},
    /* Qwen3's own layout: newlines kept on both sides */
    {"<think>\nabc\n</think>\n\ndef", Q, true, "\nabc\n", "\n\ndef"},
    /* the start tag in the prompt (DeepSeek-R1's template, Qwen3.5) */
    {"abc</think>def", R1, true, "abc", "def"},
    {"abc</think>def", Q, true, "abc", "def"},
    /* generation stops right after the end tag: content null */
    {"<think>abc</think>", Q, true, "abc", NUL_},
    {"<think>abc</think>", R1, true, "abc", NUL_},
    /* an empty reasoning is "", not null */
    {"</think>x", Q, true, "", "x"},
    {"<think></think>x", R1, true, "", "x"},
    /* no end tag: cut while thinking -> all reasoning; qwen3 with thinking
     * disabled -> all content */
    {"<think>abc", Q, true, "abc", NUL_},
    {"<think>abc", Q, false, NUL_, "abc"},
    {"<think>abc", R1, true, "abc", NUL_},
    {"<think>abc", R1, false, "abc", NUL_}, /* deepseek_r1 ignores enable_thinking */
    /* thinking disabled: no tag at all (the template wrote
     * <think>\n\n</think>\n\n into the prompt) */
    {"plain answer", Q, false, NUL_, "plain answer"},
    {"plain answer", Q, true, "plain answer", NUL_},
    {"plain answer", R1, true, "plain answer", NUL_},
    /* an empty output */
    {"", Q, true, "", NUL_},
    {"", Q, false, NUL_, ""},
    {"", R1, true, "", NUL_},
    /* text before <think> is dropped (partition keeps what follows) */
    {"pre<think>abc</think>def", Q, true, "abc", "def"},
    {"pre<think>abc", Q, false, NUL_, "abc"},
    /* only the first end tag splits */
    {"a</think>b</think>c", Q, true, "a", "b</think>c"},
    {"<think>a<think>b</think>c", R1, true, "a<think>b", "c"},
    /* qwen3: <tool_call> + <function...> ends the reasoning implicitly */
    {"<think>plan<tool_call>\n<function=f>x", Q, true, "plan", "<tool_call>\n<function=f>x"},
    {"plan<tool_call><function name=\"f\">", Q, true, "plan", "<tool_call><function name=\"f\">"},
    {"<tool_call>\xc2\xa0<function=f>", Q, true, NUL_, "<tool_call>\xc2\xa0<function=f>"},
    {"a<tool_call>\xe3\x80\x80<function\t", Q, true, "a", "<tool_call>\xe3\x80\x80<function\t"},
    /* ... but not a bare mention, nor <function> with no = or space */
    {"plan<tool_call>{\"name\": 1}", Q, true, "plan<tool_call>{\"name\": 1}", NUL_},
    {"plan<tool_call><function>", Q, true, "plan<tool_call><function>", NUL_},
    {"plan<tool_call>\n<function", Q, true, "plan<tool_call>\n<function", NUL_},
    /* only the first <tool_call> is looked at */
    {"a<tool_call>x<tool_call><function=f>", Q, true, "a<tool_call>x<tool_call><function=f>", NUL_},
    /* deepseek_r1 has no tool-call rule; qwen3 with thinking disabled
     * returns before it */
    {"plan<tool_call>\n<function=f>", R1, true, "plan<tool_call>\n<function=f>", NUL_},
    {"plan<tool_call>\n<function=f>", Q, false, NUL_, "plan<tool_call>\n<function=f>"},
    /* no parser: all content */
    {"<think>abc</think>def", CLI_REASONING_NONE, true, NUL_, "<think>abc</think>def"},
};

static void check_part(const char *what, size_t i, const char *text, bool has, size_t off, size_t len,
                       const char *want)
{
    if (want == NUL_) {
        if (has)
            fail_msg("case %zu (%s): %s: expected null, got \"%.*s\"", i, text, what, (int)len, text + off);
        return;
    }
    if (!has)
        fail_msg("case %zu (%s): %s: expected \"%s\", got null", i, text, what, want);
    if (len != strlen(want) || memcmp(text + off, want, len) != 0)
        fail_msg("case %zu (%s): %s: expected \"%s\", got \"%.*s\"", i, text, what, want, (int)len,
                 text + off);
}

static void test_split_cases(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const split_case *c = &cases[i];
        cli_reasoning_split s;
        memset(&s, 0xa5, sizeof s); /* every field must be written */
        cli_reasoning_split_text(c->p, c->text, strlen(c->text), c->thinking, &s);
        check_part("reasoning", i, c->text, s.has_reasoning, s.reasoning_off, s.reasoning_len, c->reasoning);
        check_part("content", i, c->text, s.has_content, s.content_off, s.content_len, c->content);
    }
}

/* the length is honoured: a tag past len is not seen, and no byte past len
 * is read (the buffer is not NUL-terminated there) */
static void test_split_respects_length(void **state)
{
    (void)state;
    const char buf[] = "abc</think>def";
    cli_reasoning_split s;
    cli_reasoning_split_text(Q, buf, 5, true, &s); /* "abc</" */
    assert_true(s.has_reasoning && s.reasoning_off == 0 && s.reasoning_len == 5);
    assert_false(s.has_content);
    char tail[] = {'x', '<', 't', 'o', 'o', 'l', '_', 'c', 'a', 'l', 'l', '>', '<', 'f', 'u', 'n', 'c', 't',
                   'i', 'o', 'n'};
    cli_reasoning_split_text(Q, tail, sizeof tail, true, &s); /* ends right after "<function" */
    assert_true(s.has_reasoning && s.reasoning_len == sizeof tail);
    assert_false(s.has_content);
}

static void test_parser_names(void **state)
{
    (void)state;
    cli_reasoning_parser p = CLI_REASONING_NONE;
    pg_error err;
    assert_int_equal(cli_reasoning_parser_parse("qwen3", &p, &err), PG_OK);
    assert_int_equal(p, CLI_REASONING_QWEN3);
    assert_int_equal(cli_reasoning_parser_parse("deepseek_r1", &p, &err), PG_OK);
    assert_int_equal(p, CLI_REASONING_DEEPSEEK_R1);
    assert_string_equal(cli_reasoning_parser_name(p), "deepseek_r1");
    assert_string_equal(cli_reasoning_parser_name(CLI_REASONING_QWEN3), "qwen3");
    assert_int_equal(cli_reasoning_parser_parse("granite", &p, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "--reasoning-parser: expected qwen3 or deepseek_r1, got 'granite'"));
}

static void test_prompt_ended(void **state)
{
    (void)state;
    const int32_t start = 5, end = 6;
    const int32_t disabled[] = {1, 5, 9, 9, 6, 9, 9}; /* <think>\n\n</think>\n\n at the end */
    const int32_t open[] = {1, 6, 9, 5, 9};           /* an earlier turn closed, this one open */
    const int32_t none[] = {1, 2, 3};
    assert_true(cli_reasoning_prompt_ended(disabled, 7, start, end));
    assert_false(cli_reasoning_prompt_ended(open, 5, start, end));
    assert_false(cli_reasoning_prompt_ended(none, 3, start, end));
    assert_false(cli_reasoning_prompt_ended(NULL, 0, start, end));
    const int32_t only_end[] = {6};
    assert_true(cli_reasoning_prompt_ended(only_end, 1, start, end));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_cases),
        cmocka_unit_test(test_split_respects_length),
        cmocka_unit_test(test_parser_names),
        cmocka_unit_test(test_prompt_ended),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
