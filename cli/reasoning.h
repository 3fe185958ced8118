/* reasoning: vLLM's --reasoning-parser for the <think>...</think>
 * convention (qwen3, deepseek_r1): splits a chat output's text into the
 * reasoning and the content of the assistant message. Pure functions over
 * a buffer; the offsets returned point into the text given.
 *
 * What each parser does (vLLM, non-streaming extract_reasoning; the
 * streaming path is not served here):
 *
 *   deepseek_r1  vllm/reasoning/basic_parsers.py
 *                BaseThinkingReasoningParser.extract_reasoning (at
 *                9b533e7b; DeepSeekR1ReasoningParser only overrides the
 *                streaming path): drop everything up to and including the
 *                first "<think>" if there is one; no "</think>" after that:
 *                the whole rest is reasoning, content null (the start tag
 *                was in the prompt, R1 style, and generation was cut); else
 *                reasoning = before the first "</think>", content = after
 *                it, null when empty.
 *   qwen3        vllm/reasoning/qwen3_reasoning_parser.py (at 00a4c6a1):
 *                the same, except when there is no "</think>": with
 *                chat_template_kwargs.enable_thinking falsy (the template
 *                then put "<think>\n\n</think>\n\n" in the prompt) the whole
 *                text is content and reasoning null; else a first
 *                "<tool_call>" followed, after Python-whitespace, by
 *                "<function" and a whitespace or "=" ends the reasoning
 *                there (reasoning before it, content from it, each null
 *                when empty); else the whole text is reasoning (cut).
 *
 * The reasoning may be "" (not null) where vLLM's is: "</think>x" gives
 * reasoning "" and content "x". */
#ifndef PG_CLI_REASONING_H
#define PG_CLI_REASONING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pg_error.h"

typedef enum cli_reasoning_parser {
    CLI_REASONING_NONE = 0,
    CLI_REASONING_QWEN3,
    CLI_REASONING_DEEPSEEK_R1,
} cli_reasoning_parser;

#define CLI_REASONING_START "<think>"
#define CLI_REASONING_END "</think>"

/* One output split: each part is null (has_* false) or text[off, off+len). */
typedef struct cli_reasoning_split {
    bool has_reasoning;
    size_t reasoning_off, reasoning_len;
    bool has_content;
    size_t content_off, content_len;
} cli_reasoning_split;

/* "qwen3" / "deepseek_r1" -> the parser; anything else PG_EINVAL naming
 * the choices. */
int cli_reasoning_parser_parse(const char *name, cli_reasoning_parser *out, pg_error *err);
const char *cli_reasoning_parser_name(cli_reasoning_parser p); /* "none" for NONE */

/* Splits text[0, len) as parser p does (see above). thinking_enabled: the
 * request's chat_template_kwargs.enable_thinking, true when absent (only
 * qwen3 reads it). p NONE: everything is content, reasoning null. */
void cli_reasoning_split_text(cli_reasoning_parser p, const char *text, size_t len, bool thinking_enabled,
                              cli_reasoning_split *out);

/* vLLM's BaseThinkingReasoningParser.is_reasoning_end over a prompt: the
 * last of start_id / end_id in ids[0, n) is end_id. vLLM's structured
 * outputs apply the grammar only once this holds (from the prompt on, or
 * after the model writes "</think>"). */
bool cli_reasoning_prompt_ended(const int32_t *ids, size_t n, int32_t start_id, int32_t end_id);

#endif /* PG_CLI_REASONING_H */
