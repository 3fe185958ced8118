/* request_structured: the structured-output fields of a request object
 * (any request kind: jsonl lines, openai completions bodies, chat bodies),
 * with vLLM's and OpenAI's names:
 *   structured_outputs: {"json": schema (object, or its JSON text as a string)
 *                        | "regex": string | "choice": [string]
 *                        | "json_object": true}          (vLLM >= 0.10.2)
 *   guided_json, guided_regex, guided_choice              (vLLM's older names;
 *                                                          guided_decoding_backend
 *                                                          accepted and ignored)
 *   response_format: {"type": "json_schema", "json_schema": {"name", "schema",
 *                     "strict", "description"}} | {"type": "json_object"}
 *                    | {"type": "text"}                   (OpenAI)
 * null means not set. Two constraints on one request are an error, as is
 * "grammar" / guided_grammar (EBNF is not supported). Pure: the schema is
 * only carried as text here; the engine compiles it (structured/grammar.h).
 */
#ifndef PG_CLI_REQUEST_STRUCTURED_H
#define PG_CLI_REQUEST_STRUCTURED_H

#include <stddef.h>

#include "grammar.h"
#include "json.h"
#include "pg_error.h"

typedef struct cli_structured {
    grammar_kind kind;   /* GRAMMAR_NONE when no field set one */
    char *text;          /* owned: schema JSON text, regex, or choices as a JSON array */
    size_t len;
    const char *field;   /* the field that set it (static string), for messages */
} cli_structured;

/* If `key` (a key token of an object in d, value token v) is one of the
 * fields above, reads it into *s and returns PG_OK or PG_EINVAL ("field
 * 'response_format': ..."); returns 1 when the key is none of them. */
int cli_structured_field(const json_doc *d, int key, int v, cli_structured *s, pg_error *err);
void cli_structured_free(cli_structured *s); /* leaves *s zeroed */

#endif /* PG_CLI_REQUEST_STRUCTURED_H */
