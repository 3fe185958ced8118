/* embed_output: the record of an embedding line (a cli_pending group whose
 * parts have all finished), one JSON line:
 *
 *   openai in -> the run-batch line whose body is vLLM's EmbeddingResponse
 *                (vllm/entrypoints/openai/protocol.py at 0052bed36509c7a5a2d8e48265334e40cf2f5a0e:
 *                EmbeddingResponse {id "embd-...", object "list", created,
 *                model, data, usage}, EmbeddingResponseData {index, object
 *                "embedding", embedding}, UsageInfo {prompt_tokens,
 *                total_tokens, completion_tokens 0, prompt_tokens_details
 *                null}), in model_dump_json's field order
 *   jsonl in  -> {"id", "data": [{"index", "embedding"}],
 *                 "usage": {"prompt_tokens", "completion_tokens": 0}}
 *
 * "embedding" is a list of numbers (each f32 printed with 9 significant
 * digits: it reads back as the same f32) or, with encoding_format
 * "base64", the base64 of the f32 values' little-endian bytes (vLLM's
 * serving_embedding: np.array(embedding, dtype="float32").tobytes()).
 * A pure function of the group.
 */
#ifndef PG_CLI_EMBED_OUTPUT_H
#define PG_CLI_EMBED_OUTPUT_H

#include "json.h"
#include "output.h"

/* Appends the record of group g, with its "\n", to b. */
void cli_output_embedding(json_buf *b, const cli_output_ctx *c, const cli_pending *g);

/* Appends the base64 (RFC 4648, padded) of n f32 values' little-endian bytes. */
void cli_put_base64_f32(json_buf *b, const float *v, int32_t n);

#endif /* PG_CLI_EMBED_OUTPUT_H */
