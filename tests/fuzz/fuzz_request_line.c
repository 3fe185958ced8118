/* fuzz_request_line: cli_request_parse over arbitrary bytes in every input
 * format; an accepted request must be well formed (one prompt, or one chat
 * request whose kept text is itself one JSON object, valid
 * params, arrays as long as they claim; an embedding request's inputs
 * each a non-empty text or id list), and an error must come with a
 * message; a structured-output constraint it carries is compiled. The
 * record writer is then run on the id it found. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "output.h"
#include "request_parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* the reader hands out NUL-terminated lines */
    char *line = malloc(size + 1);
    if (!line)
        return 0;
    memcpy(line, data, size);
    line[size] = '\0';
    sampling_params def = sampling_params_default();
    const char *stops[] = {"END"};
    def.stop = stops;
    def.n_stop = 1;
    const cli_format fmts[] = {CLI_FORMAT_TEXT, CLI_FORMAT_JSONL, CLI_FORMAT_OPENAI,
                               cli_detect_format(line, size)};
    /* each format strict (--strict) and lax (vLLM's leniency, the default) */
    for (size_t kk = 0; kk < 2 * (sizeof fmts / sizeof fmts[0]); kk++) {
        size_t k = kk / 2;
        bool strict = kk % 2 == 0;
        cli_request r;
        pg_error err;
        err.msg[0] = '\0';
        int rc = cli_request_parse_ex(&r, line, size, fmts[k], 3, 4, &def, 9, strict, &err);
        if (rc == PG_OK && strict && r.n_lax != 0)
            abort();
        if (rc == PG_OK) {
            if ((r.prompt != NULL) + (r.prompt_ids != NULL) + (r.chat_json != NULL) + (r.embed != NULL) != 1)
                abort();
            if (r.embed) { /* an embedding line: every input one non-empty text or id list */
                const cli_embed *em = r.embed;
                if (em->n_inputs < 1 || em->n_inputs > CLI_EMBED_MAX_INPUTS || em->dimensions < 0)
                    abort();
                for (int32_t i = 0; i < em->n_inputs; i++) {
                    if ((em->texts[i] != NULL) + (em->ids[i] != NULL) != 1)
                        abort();
                    if (em->texts[i] ? em->text_lens[i] == 0 : em->n_ids[i] <= 0)
                        abort();
                    for (int32_t j = 0; em->ids[i] && j < em->n_ids[i]; j++)
                        if (em->ids[i][j] < 0)
                            abort();
                }
            }
            if (r.chat_json) {
                json_doc d;
                if (json_parse(&d, r.chat_json, r.chat_json_len, "chat", NULL) != PG_OK)
                    abort();
                bool obj = json_is_object(&d, 0) && json_obj_get(&d, 0, "messages") >= 0;
                json_doc_free(&d);
                if (!obj)
                    abort();
            }
            if (r.prompt && r.prompt_len == 0)
                abort();
            if (r.prompt_ids && r.n_prompt_ids <= 0)
                abort();
            for (int32_t i = 0; i < r.n_prompt_ids; i++)
                if (r.prompt_ids[i] < 0)
                    abort();
            if (sampling_params_validate(&r.sp, NULL) != PG_OK || !r.id_json)
                abort();
            for (size_t i = 0; i < r.sp.n_stop; i++)
                if (!r.sp.stop[i][0])
                    abort();
            if (r.sp.structured_kind != GRAMMAR_NONE) { /* what the engine compiles */
                grammar *g = NULL;
                if (grammar_compile(&g, r.sp.structured_kind, r.sp.structured, r.sp.structured_len,
                                    NULL) == PG_OK)
                    grammar_destroy(g);
                else if (g)
                    abort();
            }
        } else if (!err.msg[0]) {
            abort();
        }
        cli_output_ctx ctx = {.fmt = fmts[k]};
        json_buf b = {0};
        cli_output_error(&b, &ctx, r.id_json, r.line, 400, err.msg);
        if (!b.oom && (b.len == 0 || b.data[b.len - 1] != '\n' || memchr(b.data, '\n', b.len) != b.data + b.len - 1))
            abort(); /* one record = one line */
        json_buf_free(&b);
        cli_request_free(&r);
    }
    free(line);
    return 0;
}
