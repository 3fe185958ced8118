/* request_parse: one input line -> one request (prompt + sampling params),
 * or a per-line error. Pure: no I/O, no tokenizer, no engine; a pure
 * function of (line, format, index, defaults, base seed).
 *
 * Formats (vLLM names and semantics):
 *   text   the line (without its "\n" or "\r\n") is the prompt
 *   jsonl  {"id": string|integer, "prompt": string | "prompt_token_ids": [int],
 *           max_tokens, min_tokens, temperature, top_p, top_k, min_p, seed, n,
 *           stop (string|[string]), stop_token_ids, ignore_eos,
 *           include_stop_str_in_output, skip_special_tokens, presence_penalty,
 *           frequency_penalty, repetition_penalty, logprobs}
 *           null means "not set"; any other field is an error when strict,
 *           else ignored and counted (cli_request_parse_ex).
 *   openai {"custom_id": string, "method": "POST", "url": "/v1/completions",
 *           "body": {"model", "prompt": string|[int], max_tokens, ...}}
 *           (the same sampling fields, OpenAI's logprobs as an integer, plus
 *           model/user ignored and stream/echo accepted only as false).
 *
 * Chat requests (vLLM's ChatCompletionRequest names): a jsonl line with
 * "messages" instead of "prompt", or an openai line with "url":
 * "/v1/chat/completions" whose body has "messages". Their fields: messages
 * (an array of objects), add_generation_prompt, continue_final_message
 * (bools; both true is an error, as vLLM's check_generation_prompt),
 * chat_template_kwargs (object), tools, documents (arrays; only the template
 * sees them), max_tokens / max_completion_tokens (the latter wins; neither
 * = the rest of the context, see max_tokens_set), logprobs (a bool) +
 * top_logprobs (an int in [0, 20]; > 0 needs logprobs true), and the
 * sampling fields above. The request is not rendered here: chat_json keeps
 * the request object's text for chat_template_render (cli/chat_render.h).
 *
 * Embedding requests: a jsonl line with "input", or an openai line with
 * "url": "/v1/embeddings" (request_embed.h).
 */
#ifndef PG_CLI_REQUEST_PARSE_H
#define PG_CLI_REQUEST_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "options.h"
#include "request_embed.h"
#include "request_structured.h"
#include "pg_error.h"
#include "sampling_params.h"

typedef struct cli_request {
    int64_t index;              /* 0-based request index (non-blank lines) */
    int64_t line;               /* 1-based line number in the input */
    /* The id to echo, as JSON text ("7", "\"abc\""); for openai the custom_id.
     * Set on success and, when it could be read, on error too (else NULL:
     * the error record then uses the index for jsonl, null for openai). */
    char *id_json;
    /* Canonical key of the id for duplicate detection and --resume:
     * "s:<unescaped string>" or "n:<integer>". NULL when id_json is. */
    char *id_key;
    size_t id_key_len;
    /* Exactly one of prompt / prompt_ids / chat_json on success. Owned. */
    char *prompt;               /* NUL-terminated UTF-8 */
    size_t prompt_len;
    int32_t *prompt_ids;
    int32_t n_prompt_ids;
    /* A chat request: the JSON text of the request object (the jsonl line
     * or the openai body), NUL-terminated, for chat_template_render. */
    char *chat_json;
    size_t chat_json_len;
    /* An embedding request (request_embed.h: a jsonl line with "input", an
     * openai line to "/v1/embeddings"): owned; then none of prompt,
     * prompt_ids, chat_json is set. NULL for a generation request. */
    cli_embed *embed;
    /* The line set max_tokens or max_completion_tokens. A chat line that
     * did not gets the rest of the context (vLLM's chat default) unless
     * --max-tokens was given; run.c decides. */
    bool max_tokens_set;
    /* max_tokens (or max_completion_tokens) was an explicit null: vLLM's
     * "the rest of the context" (run.c decides, as for chat). */
    bool max_tokens_null;
    /* The openai body's "model" string (owned), NULL when absent or null;
     * run.c checks it against the served name (vLLM's 404). */
    char *model;
    /* Not strict: unknown fields ignored plus values coerced as pydantic's
     * lax mode does (3.0 or "3" for an int, "0.5" for a float, "true" for a
     * bool). 0 under strict parsing. */
    int32_t n_lax;
    /* openai /v1/completions "echo": true — the response text and logprobs
     * start with the prompt's (vLLM's serving_completion). echo_only: it
     * came with max_tokens 0 (sp.max_tokens is then 1; the one generated
     * token is left out of text and logprobs, as vLLM does). */
    bool echo, echo_only;
    sampling_params sp;         /* its stop / stop_token_ids point into the arrays below */
    char **stop;                /* owned strings */
    size_t n_stop;
    int32_t *stop_token_ids;
    size_t n_stop_token_ids;
    cli_structured structured;  /* structured outputs; sp.structured points into it */
    /* Chat lines, for --reasoning-parser: chat_template_kwargs.enable_thinking
     * was given and is falsy in Python's sense (false, null, 0, "", [], {});
     * "include_reasoning": false (vLLM's field, default true). */
    bool thinking_disabled, exclude_reasoning;
} cli_request;

/* Parses line[0, len) (no trailing newline). `defaults` is the fully
 * resolved default sampling (command line over generation_config); its stop
 * strings are copied when the line sets none. A line without "seed" gets
 * cli_request_seed(base_seed, index). On error returns PG_EINVAL with a
 * message for the error record ("field 'top_p': ..."); *out may hold an id.
 * Always call cli_request_free afterwards. */
int cli_request_parse(cli_request *out, const char *line, size_t len, cli_format fmt,
                      int64_t index, int64_t line_no, const sampling_params *defaults,
                      uint64_t base_seed, pg_error *err);
/* cli_request_parse with strict = false: vLLM's leniency (pydantic's lax
 * mode, extra fields ignored), each leniency counted in out->n_lax.
 * cli_request_parse is this with strict = true. */
int cli_request_parse_ex(cli_request *out, const char *line, size_t len, cli_format fmt,
                         int64_t index, int64_t line_no, const sampling_params *defaults,
                         uint64_t base_seed, bool strict, pg_error *err);
void cli_request_free(cli_request *r); /* accepts NULL; leaves *r zeroed */

/* seed = splitmix64(base ^ splitmix64(index)): reproducible, independent of
 * batching and of the other lines. */
uint64_t cli_request_seed(uint64_t base_seed, int64_t index);

/* Detects the format of a first non-blank line (never returns AUTO). */
cli_format cli_detect_format(const char *line, size_t len);

/* FNV-1a 64 of bytes (deterministic ids for openai output). */
uint64_t cli_hash64(const void *data, size_t len);

#endif /* PG_CLI_REQUEST_PARSE_H */
