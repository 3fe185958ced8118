/* request_embed: the embedding lines of a batch file (vLLM's
 * EmbeddingCompletionRequest, vllm/entrypoints/openai/protocol.py at
 * 0052bed36509c7a5a2d8e48265334e40cf2f5a0e; `vllm run-batch` serves it at
 * "/v1/embeddings"):
 *
 *   openai {"custom_id", "method": "POST", "url": "/v1/embeddings",
 *           "body": {"model", "input", "encoding_format", "dimensions",
 *                    "user", "add_special_tokens", "normalize"}}
 *   jsonl  {"id", "input", "encoding_format", "dimensions",
 *           "add_special_tokens", "normalize"}   (a line with "input")
 *
 * input: a string, a list of strings, a list of token ids, or a list of
 * lists of token ids — one embedding per string / id list, in order.
 * encoding_format "float" (default) or "base64" (little-endian f32 bytes).
 * dimensions: Matryoshka truncation (run.c checks it against the model);
 * null = all. add_special_tokens (default true: BOS, as vLLM) applies to
 * strings. normalize (vLLM's PoolingParams.normalize; default: the
 * model's). Sampling fields are unknown fields here.
 *
 * Pure: a function of the JSON; no tokenizer.
 */
#ifndef PG_CLI_REQUEST_EMBED_H
#define PG_CLI_REQUEST_EMBED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "json.h"
#include "pg_error.h"

#define CLI_EMBED_MAX_INPUTS 2048  /* vLLM/OpenAI: at most 2048 inputs per request */

typedef struct cli_embed {
    int32_t n_inputs;            /* >= 1 */
    char **texts;                /* [n_inputs] NUL-terminated, or NULL entries for id inputs */
    size_t *text_lens;           /* [n_inputs] */
    int32_t **ids;               /* [n_inputs] token ids, or NULL entries for text inputs */
    int32_t *n_ids;              /* [n_inputs] */
    bool base64;                 /* encoding_format "base64" */
    int32_t dimensions;          /* 0: not given */
    bool add_special_tokens;     /* default true */
    int normalize;               /* -1: the model's default; 0 / 1 */
} cli_embed;

/* Parses the embedding fields of object obj of d into *out (zeroed first).
 * skip_id: the jsonl "id" key is read elsewhere; openai: "model" and
 * "user" are accepted here (*model gets the model string, malloc'd, or
 * NULL). strict: an unknown field is an error; else it is ignored and
 * counted in *n_lax. PG_EINVAL with the field's name; PG_ENOMEM. On error
 * *out holds whatever was read: call cli_embed_free. */
int cli_embed_parse(cli_embed *out, const json_doc *d, int obj, bool skip_id, bool openai,
                    bool strict, int32_t *n_lax, char **model, pg_error *err);
void cli_embed_free(cli_embed *e); /* accepts NULL; frees the members, not e */

#endif /* PG_CLI_REQUEST_EMBED_H */
