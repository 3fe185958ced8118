/* chat_template_cmd: `pagedgen chat-template` — renders each input line (a
 * chat request object) with the chat template and writes {"text",
 * "token_ids"} or {"error": {"message", "line"}}, in input order. Other
 * fields of a line are ignored, so a goldens file can be fed back as it
 * is; add_generation_prompt defaults to false (transformers'
 * apply_chat_template default). Tokenized as generate tokenizes a chat
 * prompt: no BOS added, special tokens in the text are tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_render.h"
#include "input.h"
#include "json.h"
#include "line_tool.h"
#include "output.h"
#include "run.h"
#include "tokenizer.h"

/* One line's record, with its final "\n". Returns true when it is a render. */
static bool render_line(void *ctx, const char *line, size_t len, int64_t line_no, json_buf *b)
{
    const cli_chat *chat = ctx;
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
        cli_line_error(b, e.msg, line_no);
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
    pg_error err;
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
    code = cli_line_tool_run(o, in, render_line, &chat);
done:
    cli_input_close(in);
    cli_chat_close(&chat);
    tok_free(tok);
    return code;
}
