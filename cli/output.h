/* output: formats result and error records (one JSON line each) and writes
 * them whole. The record shape follows the input format:
 *   text/jsonl in -> {"id", "outputs": [{"index", "text", "token_ids",
 *                     "finish_reason", "stop_reason"(, "logprobs")}],
 *                     "usage": {"prompt_tokens", "completion_tokens"}}
 *   openai in     -> the OpenAI batch output line of `vllm run-batch`, with
 *                    ids derived from custom_id (no random ids, no clock
 *                    unless --metrics).
 * Output is a pure function of the request and its result. */
#ifndef PG_CLI_OUTPUT_H
#define PG_CLI_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "json.h"
#include "options.h"
#include "pg_error.h"
#include "reasoning.h"

typedef struct tokenizer tokenizer;

typedef struct cli_output_ctx {
    cli_format fmt;              /* the input's format (TEXT writes jsonl records) */
    const tokenizer *tok;        /* may be NULL: then "text" is null */
    const char *model_name;      /* openai "model" */
    /* --lora NAMEs (options.h, not NUL-terminated): an adapter line's
     * openai "model" is its adapter's name, as vLLM's _get_model_name */
    const char *const *lora_names;
    const int32_t *lora_name_lens;
    int32_t n_loras;
    bool include_prompt, metrics;
    const int32_t *eos_ids;      /* the model's eos list (config + generation_config) */
    int32_t n_eos_ids;
    /* vLLM's primary eos (the tokenizer's eos_token, else the first of
     * eos_ids): a stop by it has stop_reason null; the other eos ids are
     * stop_token_ids in vLLM (update_from_generation_config), so a stop by
     * one of them names it. -1 = every eos id gives null. */
    int32_t primary_eos;
    /* --reasoning-parser: chat outputs are split into reasoning + content
     * (openai: the message's "content" and "reasoning"; jsonl: "reasoning"
     * and "content" beside "text"). NONE: records as before. */
    cli_reasoning_parser reasoning;
} cli_output_ctx;

/* What the CLI keeps of a request while the engine runs it (the engine's
 * `user` pointer). */
typedef struct cli_pending {
    uint64_t seq;                /* output sequence number (reorder) */
    int64_t index, line;
    bool chat;                   /* a chat request: openai lines get a chat.completion body */
    bool echo, echo_only;        /* openai completions echo (see cli_request) */
    bool thinking_disabled;      /* chat: enable_thinking falsy (see cli_request) */
    bool exclude_reasoning;      /* chat: include_reasoning false */
    int32_t lora;                /* the line's --lora adapter, 1 + its index; 0: the base model */
    char *id_json;               /* owned */
    char *prompt;                /* owned, only with --include-prompt (NULL for id prompts;
                                    a chat request's rendered prompt) */
    size_t prompt_len;
    int32_t *prompt_ids;         /* owned, only with --include-prompt */
    int32_t n_prompt_ids;
    /* An embedding line (embed_output.h): the line's record is this group
     * (n_embed > 0); each of its inputs runs as one engine request whose
     * user is a part (group != NULL, part = the input's index). */
    int32_t n_embed;             /* group: inputs */
    float **emb;                 /* group: [n_embed] vectors as parts finish, owned */
    int32_t emb_dim;             /* group: their length */
    int64_t emb_prompt_tokens;   /* group: summed over the parts */
    bool emb_base64;             /* group: encoding_format "base64" */
    char *emb_error;             /* group: a part the engine refused: the line's error, owned */
    int32_t emb_refs;            /* group: parts not yet freed (the last frees the group) */
    struct cli_pending *group;   /* part: its line's group */
    int32_t part;                /* part: the input's index */
} cli_pending;

/* Accepts NULL. A part releases its group (freed with its last part). */
void cli_pending_free(cli_pending *p);

/* Appends one record, with its final "\n", to b (b->oom on failure). */
void cli_output_result(json_buf *b, const cli_output_ctx *c, const cli_pending *p,
                       const request_output *o);
/* id_json NULL: the id is null (openai: derived from the line number).
 * status: the HTTP status vLLM would answer, 400 (BadRequestError) or 404
 * (NotFoundError: an unknown model); openai records carry it as
 * response.status_code and error.code, jsonl records ignore it. */
void cli_output_error(json_buf *b, const cli_output_ctx *c, const char *id_json, int64_t line,
                      int status, const char *message);

/* The openai batch line up to and including the body's "model" value:
 * {"id", "custom_id", "response": {"status_code": 200, "request_id", "body":
 * {"id": id_prefix + hash, "object", "created", "model": ... (for writers of
 * other bodies: embed_output.c). cli_output_openai_close ends the body,
 * the response and the line. */
void cli_output_openai_open(json_buf *b, const cli_output_ctx *c, const char *id_json, int64_t line,
                            const char *id_prefix, const char *object);
void cli_output_openai_close(json_buf *b);

/* write() until all len bytes are out (retries EINTR and short writes). */
int cli_write_all(int fd, const char *data, size_t len, pg_error *err);

#endif /* PG_CLI_OUTPUT_H */
