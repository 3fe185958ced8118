/* embed_prepare: what an embedding line needs before it reaches the engine
 * — the run's default pooling, the line's pooling parameters (checked
 * against the model as vLLM's PoolingParams._set_default_parameters does)
 * and each input's token ids. Pure functions of their arguments (the
 * tokenizer is read only); run.c submits and collects (request_embed.h
 * parses the line, embed_output.h writes the record). */
#ifndef PG_CLI_EMBED_PREPARE_H
#define PG_CLI_EMBED_PREPARE_H

#include <stddef.h>
#include <stdint.h>

#include "options.h"
#include "pg_error.h"
#include "pooling.h"
#include "request_embed.h"
#include "st_pooling.h"

typedef struct tokenizer tokenizer;

/* The run's pooling: --pooling, else the folder's sentence-transformers
 * files (normalize iff a Normalize module), else vLLM's default for a
 * decoder LM served for "embed": LAST pooling (get_default_pooling_type),
 * normalized (PoolingParams normalize default true). *source names which
 * (a static string). */
void cli_embed_default_pooling(cli_pooling flag, const st_pooling_config *stp, pooling_params *out,
                               const char **source);

/* The line's pooling: base with the line's normalize and dimensions.
 * Returns NULL, or the refusal written into msg[cap] (vLLM's messages: a
 * model that is not Matryoshka, a dimension not in its list; and beyond
 * the hidden size). model_name is the served name the messages use. */
const char *cli_embed_line_params(const cli_embed *em, const pooling_params *base,
                                  const st_pooling_config *stp, int32_t hidden_size, const char *model_name,
                                  pooling_params *out, char *msg, size_t cap);

/* Input k's token ids (*ids malloc'd, *n >= 1): given ids checked against
 * vocab_size, or the text tokenized (with BOS when add_special_tokens; tok
 * may be NULL: then a text input is refused). Longer than
 * max_model_len - 1 is refused. PG_EINVAL naming input[k]; PG_ENOMEM. */
int cli_embed_input_ids(const cli_embed *em, int32_t k, const tokenizer *tok, int32_t vocab_size,
                        int32_t max_model_len, int32_t **ids, int32_t *n, pg_error *err);

#endif /* PG_CLI_EMBED_PREPARE_H */
