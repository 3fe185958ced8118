/* reasoning: vLLM's <think>...</think> reasoning parsers (see reasoning.h). */
#include "reasoning.h"

#include <string.h>

int cli_reasoning_parser_parse(const char *name, cli_reasoning_parser *out, pg_error *err)
{
    if (strcmp(name, "qwen3") == 0)
        *out = CLI_REASONING_QWEN3;
    else if (strcmp(name, "deepseek_r1") == 0)
        *out = CLI_REASONING_DEEPSEEK_R1;
    else
        return pg_error_set(err, PG_EINVAL, "--reasoning-parser: expected qwen3 or deepseek_r1, got '%.40s'",
                            name);
    return PG_OK;
}

const char *cli_reasoning_parser_name(cli_reasoning_parser p)
{
    switch (p) {
    case CLI_REASONING_QWEN3: return "qwen3";
    case CLI_REASONING_DEEPSEEK_R1: return "deepseek_r1";
    default: return "none";
    }
}

/* First occurrence of needle in h[0, n), or -1 (Python's str.find). */
static long find(const char *h, size_t n, const char *needle)
{
    size_t m = strlen(needle);
    if (m > n)
        return -1;
    for (size_t i = 0; i + m <= n; i++)
        if (h[i] == needle[0] && memcmp(h + i, needle, m) == 0)
            return (long)i;
    return -1;
}

/* Byte length of the Python whitespace character (str.isspace, which is
 * also what re's \s matches in a str pattern) at s[0, n), or 0: U+0009-000D,
 * U+001C-0020, U+0085, U+00A0, U+1680, U+2000-200A, U+2028, U+2029, U+202F,
 * U+205F, U+3000. */
static size_t py_space(const unsigned char *s, size_t n)
{
    if (n >= 1 && ((s[0] >= 0x09 && s[0] <= 0x0d) || (s[0] >= 0x1c && s[0] <= 0x20)))
        return 1;
    if (n >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0))
        return 2;
    if (n >= 3 && s[0] == 0xe1 && s[1] == 0x9a && s[2] == 0x80) /* U+1680 */
        return 3;
    if (n >= 3 && s[0] == 0xe2 && s[1] == 0x80 &&
        ((s[2] >= 0x80 && s[2] <= 0x8a) || s[2] == 0xa8 || s[2] == 0xa9 || s[2] == 0xaf))
        return 3; /* U+2000-200A, U+2028, U+2029, U+202F */
    if (n >= 3 && s[0] == 0xe2 && s[1] == 0x81 && s[2] == 0x9f) /* U+205F */
        return 3;
    if (n >= 3 && s[0] == 0xe3 && s[1] == 0x80 && s[2] == 0x80) /* U+3000 */
        return 3;
    return 0;
}

/* re.match(r"<function[\s=]", s.lstrip()) */
static bool function_follows(const char *s, size_t n)
{
    size_t i = 0, w;
    while (i < n && (w = py_space((const unsigned char *)s + i, n - i)) > 0)
        i += w;
    static const char tag[] = "<function";
    size_t m = sizeof tag - 1;
    if (n - i < m + 1 || memcmp(s + i, tag, m) != 0)
        return false;
    return s[i + m] == '=' || py_space((const unsigned char *)s + i + m, n - i - m) > 0;
}

static void set_reasoning(cli_reasoning_split *out, size_t off, size_t len, bool null_if_empty)
{
    out->has_reasoning = !(null_if_empty && len == 0);
    out->reasoning_off = off;
    out->reasoning_len = len;
}

/* `content or None` */
static void set_content(cli_reasoning_split *out, size_t off, size_t len)
{
    out->has_content = len > 0;
    out->content_off = off;
    out->content_len = len;
}

void cli_reasoning_split_text(cli_reasoning_parser p, const char *text, size_t len, bool thinking_enabled,
                              cli_reasoning_split *out)
{
    memset(out, 0, sizeof *out);
    if (p == CLI_REASONING_NONE) {
        out->has_content = true;
        out->content_len = len;
        return;
    }
    /* model_output.partition(start_token): keep what follows the first
     * start tag, or everything when there is none */
    size_t base = 0;
    long s = find(text, len, CLI_REASONING_START);
    if (s >= 0)
        base = (size_t)s + strlen(CLI_REASONING_START);
    const char *t = text + base;
    size_t n = len - base;
    long e = find(t, n, CLI_REASONING_END);
    if (e >= 0) {
        /* reasoning, _, content = model_output.partition(end_token);
         * return reasoning, content or None */
        size_t after = (size_t)e + strlen(CLI_REASONING_END);
        set_reasoning(out, base, (size_t)e, false);
        set_content(out, base + after, n - after);
        return;
    }
    if (p == CLI_REASONING_QWEN3) {
        if (!thinking_enabled) {
            /* thinking explicitly disabled: everything is content (not
             * `or None`: "" stays "") */
            out->has_content = true;
            out->content_off = base;
            out->content_len = n;
            return;
        }
        /* an implicit end of the reasoning: <tool_call> followed by a
         * <function=...> tag */
        long tc = find(t, n, "<tool_call>");
        if (tc >= 0) {
            size_t a = (size_t)tc + strlen("<tool_call>");
            if (function_follows(t + a, n - a)) {
                set_reasoning(out, base, (size_t)tc, true);
                set_content(out, base + (size_t)tc, n - (size_t)tc);
                return;
            }
        }
    }
    /* no end tag: all reasoning (cut, or the start tag was in the prompt) */
    set_reasoning(out, base, n, false);
}

bool cli_reasoning_prompt_ended(const int32_t *ids, size_t n, int32_t start_id, int32_t end_id)
{
    for (size_t i = n; i-- > 0;) {
        if (ids[i] == start_id)
            return false;
        if (ids[i] == end_id)
            return true;
    }
    return false;
}
