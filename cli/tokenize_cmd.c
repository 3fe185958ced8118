/* tokenize_cmd: `pagedgen tokenize` — {"ids": [...], "count": N} per input
 * line, in input order. jsonl lines are {"text": "..."} (other fields are
 * ignored, so a golden file can be fed back as it is); text lines are
 * tokenized as they are (without their newline). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <errno.h>

#include "input.h"
#include "json.h"
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

int cli_run_tokenize(const cli_options *o)
{
    int code = CLI_EXIT_OK;
    tokenizer *tok = NULL;
    cli_input *in = NULL;
    int fd = -1;
    pg_error err;
    int64_t failed = 0;
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
    if (strcmp(o->output_path, "-") == 0) {
        fd = STDOUT_FILENO;
    } else if ((fd = open(o->output_path, O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0) {
        fprintf(stderr, "pagedgen: %s: cannot open output: %s\n", o->output_path, strerror(errno));
        code = CLI_EXIT_IO;
        goto done;
    }
    bool jsonl = o->input_format == CLI_FORMAT_JSONL;
    if (o->input_format == CLI_FORMAT_AUTO) {
        const char *line;
        size_t len;
        if (cli_input_peek(in, &line, &len, &err) == CLI_INPUT_LINE)
            jsonl = cli_detect_format(line, len) != CLI_FORMAT_TEXT;
    }
    for (;;) {
        const char *line;
        size_t len;
        int64_t line_no;
        if (cli_signals_stop_requested()) {
            code = CLI_EXIT_INTERRUPTED;
            break;
        }
        int rc = cli_input_next(in, &line, &len, &line_no, &err);
        if (rc == CLI_INPUT_EINTR)
            continue;
        if (rc == CLI_INPUT_EOF)
            break;
        if (rc < 0) {
            fprintf(stderr, "pagedgen: %s\n", err.msg);
            code = CLI_EXIT_IO;
            break;
        }
        json_buf b = {0};
        char *text = NULL;
        size_t tlen = 0;
        int32_t *ids = NULL;
        size_t n = 0;
        pg_error e;
        if (text_of(line, len, jsonl, &text, &tlen, &e) != PG_OK ||
            tok_encode(tok, text, tlen, !o->no_special, &ids, &n, &e) != PG_OK) {
            json_buf_puts(&b, "{\"error\":{\"message\":");
            json_buf_string(&b, e.msg, strlen(e.msg));
            json_buf_printf(&b, ",\"line\":%lld}}\n", (long long)line_no);
            failed++;
        } else {
            json_buf_puts(&b, "{\"ids\":[");
            for (size_t k = 0; k < n; k++)
                json_buf_printf(&b, k ? ",%d" : "%d", (int)ids[k]);
            json_buf_printf(&b, "],\"count\":%zu}\n", n);
        }
        free(text);
        free(ids);
        if (b.oom || cli_write_all(fd, b.data, b.len, &e) != PG_OK) {
            fprintf(stderr, "pagedgen: %s: %s\n", o->output_path, b.oom ? "out of memory" : e.msg);
            json_buf_free(&b);
            code = CLI_EXIT_IO;
            break;
        }
        json_buf_free(&b);
    }
    if (code == CLI_EXIT_OK && failed > 0)
        code = CLI_EXIT_LINES_FAILED;
done:
    if (fd > STDERR_FILENO)
        close(fd);
    tok_free(tok);
    cli_input_close(in);
    return code;
}
