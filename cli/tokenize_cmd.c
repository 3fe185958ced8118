/* tokenize_cmd: `pagedgen tokenize` — {"ids": [...], "count": N} per input
 * line, in input order. jsonl lines are {"text": "..."} (other fields are
 * ignored, so a golden file can be fed back as it is); text lines are
 * tokenized as they are (without their newline). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "input.h"
#include "json.h"
#include "line_tool.h"
#include "output.h"
#include "request_parse.h"
#include "run.h"
#include "tokenizer.h"

static int text_of(const char *line, size_t len, bool jsonl, char **text, size_t *tlen, pg_error *err)
{
    if (!jsonl) {
        *text = malloc(len + 1);
        if (!*text)
            return pg_error_set(err, PG_ENOMEM, "out of memory");
        memcpy(*text, line, len);
        (*text)[len] = '\0';
        *tlen = len;
        return PG_OK;
    }
    json_doc d;
    pg_error e;
    if (json_parse(&d, line, len, "line", &e) != PG_OK)
        return pg_error_set(err, PG_EINVAL, "invalid JSON (%s)", strncmp(e.msg, "line: ", 6) ? e.msg : e.msg + 6);
    int rc = PG_OK;
    int t = json_obj_get(&d, 0, "text");
    if (!json_is_object(&d, 0))
        rc = pg_error_set(err, PG_EINVAL, "expected a JSON object");
    else if (t < 0)
        rc = pg_error_set(err, PG_EINVAL, "missing 'text'");
    else if (!json_is_string(&d, t))
        rc = pg_error_set(err, PG_EINVAL, "field 'text': expected a string");
    else if (json_get_string(&d, t, text, tlen, &e) != PG_OK)
        rc = pg_error_set(err, PG_EINVAL, "field 'text': %s", e.msg);
    json_doc_free(&d);
    return rc;
}

typedef struct tokenize_ctx {
    const tokenizer *tok;
    bool jsonl;
    bool add_special;
} tokenize_ctx;

static bool tokenize_line(void *ctx, const char *line, size_t len, int64_t line_no, json_buf *b)
{
    const tokenize_ctx *c = ctx;
    char *text = NULL;
    size_t tlen = 0;
    int32_t *ids = NULL;
    size_t n = 0;
    pg_error e;
    bool ok = text_of(line, len, c->jsonl, &text, &tlen, &e) == PG_OK &&
              tok_encode(c->tok, text, tlen, c->add_special, &ids, &n, &e) == PG_OK;
    if (ok) {
        json_buf_puts(b, "{\"ids\":[");
        for (size_t k = 0; k < n; k++)
            json_buf_printf(b, k ? ",%d" : "%d", (int)ids[k]);
        json_buf_printf(b, "],\"count\":%zu}\n", n);
    } else {
        cli_line_error(b, e.msg, line_no);
    }
    free(text);
    free(ids);
    return ok;
}

int cli_run_tokenize(const cli_options *o)
{
    int code = CLI_EXIT_OK;
    tokenizer *tok = NULL;
    cli_input *in = NULL;
    pg_error err;
    cli_signals_install();

    if (cli_input_open(&in, o->input_path, &err) != PG_OK) {
        fprintf(stderr, "pagedgen: %s\n", err.msg);
        code = CLI_EXIT_IO;
        goto done;
    }
    if (tok_load(&tok, o->tokenizer_dir, &err) != PG_OK) {
        fprintf(stderr, "pagedgen: %s\n", err.msg);
        code = CLI_EXIT_MODEL;
        goto done;
    }
    tokenize_ctx c = {.tok = tok, .jsonl = o->input_format == CLI_FORMAT_JSONL, .add_special = !o->no_special};
    if (o->input_format == CLI_FORMAT_AUTO) {
        const char *line;
        size_t len;
        if (cli_input_peek(in, &line, &len, &err) == CLI_INPUT_LINE)
            c.jsonl = cli_detect_format(line, len) != CLI_FORMAT_TEXT;
    }
    code = cli_line_tool_run(o, in, tokenize_line, &c);
done:
    tok_free(tok);
    cli_input_close(in);
    return code;
}
