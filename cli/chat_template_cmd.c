/* chat_template_cmd: `pagedgen chat-template` — renders each input line (a
 * chat request object) with the chat template and writes {"text",
 * "token_ids"} or {"error": {"message", "line"}}, in input order. Other
 * fields of a line are ignored, so a goldens file can be fed back as it
 * is; add_generation_prompt defaults to false (transformers'
 * apply_chat_template default). Tokenized as generate tokenizes a chat
 * prompt: no BOS added, special tokens in the text are tokens. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat_render.h"
#include "input.h"
#include "json.h"
#include "output.h"
#include "run.h"
#include "tokenizer.h"

/* One line's record, with its final "\n". Returns true when it is a render. */
static bool render_line(json_buf *b, const cli_chat *chat, const char *line, size_t len, int64_t line_no)
{
    char *text = NULL;
    int32_t *ids = NULL;
    size_t text_len = 0, n = 0;
    pg_error e;
    bool ok = cli_chat_render(chat, line, len, &text, &text_len, &ids, &n, &e) == PG_OK;
    if (ok) {
        json_buf_puts(b, "{\"text\":");
        json_buf_string(b, text, text_len);
        json_buf_puts(b, ",\"token_ids\":[");
        for (size_t k = 0; k < n; k++)
            json_buf_printf(b, k ? ",%d" : "%d", (int)ids[k]);
        json_buf_puts(b, "]}\n");
    } else {
        json_buf_puts(b, "{\"error\":{\"message\":");
        json_buf_string(b, e.msg, strlen(e.msg));
        json_buf_printf(b, ",\"line\":%lld}}\n", (long long)line_no);
    }
    free(text);
    free(ids);
    return ok;
}

int cli_run_chat_template(const cli_options *o)
{
    int code = CLI_EXIT_OK;
    tokenizer *tok = NULL;
    cli_chat chat;
    memset(&chat, 0, sizeof chat);
    cli_input *in = NULL;
    int fd = -1;
    pg_error err;
    int64_t failed = 0;
    cli_signals_install();

    if (tok_load(&tok, o->tokenizer_dir, &err) != PG_OK) {
        fprintf(stderr, "pagedgen: %s\n", err.msg);
        code = CLI_EXIT_MODEL;
        goto done;
    }
    int rc = cli_chat_open(&chat, o, o->tokenizer_dir, tok, false, &err);
    if (rc != PG_OK) {
        fprintf(stderr, "pagedgen: %s\n", err.msg);
        code = rc == PG_EINVAL ? CLI_EXIT_USAGE : CLI_EXIT_MODEL;
        goto done;
    }
    if (!chat.tmpl)
        fprintf(stderr, "pagedgen: %s: no chat template found (every line will fail): pass "
                        "--chat-template FILE\n", o->tokenizer_dir);
    if (cli_input_open(&in, o->input_path, &err) != PG_OK) {
        fprintf(stderr, "pagedgen: %s\n", err.msg);
        code = CLI_EXIT_IO;
        goto done;
    }
    if (strcmp(o->output_path, "-") == 0) {
        fd = STDOUT_FILENO;
    } else if ((fd = open(o->output_path, O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0) {
        fprintf(stderr, "pagedgen: %s: cannot open output: %s\n", o->output_path, strerror(errno));
        code = CLI_EXIT_IO;
        goto done;
    }
    for (;;) {
        const char *line;
        size_t len;
        int64_t line_no;
        if (cli_signals_stop_requested()) {
            code = CLI_EXIT_INTERRUPTED;
            break;
        }
        rc = cli_input_next(in, &line, &len, &line_no, &err);
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
        if (!render_line(&b, &chat, line, len, line_no))
            failed++;
        pg_error e;
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
    cli_input_close(in);
    cli_chat_close(&chat);
    tok_free(tok);
    return code;
}
