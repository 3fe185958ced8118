/* chat_render: a chat request -> prompt text -> token ids, shared by
 * `generate` (chat lines) and `pagedgen chat-template`. Wraps the chat/
 * module: finds and parses the template once at start-up, resolves the
 * clock strftime_now sees, renders one request object and tokenizes the
 * text WITHOUT adding BOS (the template writes it, as vLLM's chat path
 * does with add_special_tokens=False; special and added tokens written in
 * the text are split out as single tokens by tok_encode). */
#ifndef PG_CLI_CHAT_RENDER_H
#define PG_CLI_CHAT_RENDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chat_template.h"
#include "options.h"
#include "pg_error.h"

typedef struct tokenizer tokenizer;

/* The message of a chat line when no template was found (the fix in it). */
#define CLI_CHAT_NO_TEMPLATE "model has no chat template: pass --chat-template FILE"

typedef struct cli_chat {
    chat_template *tmpl;       /* owned; NULL: the tokenizer folder has none */
    const tokenizer *tok;      /* borrowed; NULL: chat lines get an error */
    chat_render_opts opts;
} cli_chat;

/* Fills c: the template (--chat-template FILE always wins, else the
 * tokenizer folder's; bos_token / eos_token from the folder's
 * tokenizer_config.json) and the clock
 * (cli_chat_clock with getenv("SOURCE_DATE_EPOCH")). No template anywhere
 * is not an error (c->tmpl NULL). Errors, for a start-up refusal:
 * PG_EINVAL a malformed SOURCE_DATE_EPOCH (usage); anything else from
 * chat_template_load — a template that does not parse, with its line and
 * column, or an unreadable file (setup). On error nothing is held. */
int cli_chat_open(cli_chat *c, const cli_options *o, const char *tokenizer_dir, const tokenizer *tok,
                  bool default_add_generation_prompt, pg_error *err);
void cli_chat_close(cli_chat *c); /* accepts a zeroed or closed c */

/* strftime_now's clock, UTC seconds: --chat-template-date (its day at
 * 12:00 UTC), else source_date_epoch (the SOURCE_DATE_EPOCH variable, a
 * whole number of seconds; NULL or "" = unset), else time(NULL) — the one
 * input of a run that is not in its files unless pinned. */
int cli_chat_clock(const cli_options *o, const char *source_date_epoch, int64_t *now, pg_error *err);

/* Renders the chat request object json[0, len) (a jsonl line or an openai
 * body) and tokenizes the text. On success *text (NUL-terminated, length
 * *text_len) and *ids (*n_ids entries) are malloc'd and the caller frees
 * them. On error returns PG_EINVAL (or PG_ENOMEM) with the message for the
 * line's error record: no template, no tokenizer, a render error (the
 * template's raise_exception message verbatim), an empty render. */
int cli_chat_render(const cli_chat *c, const char *json, size_t len, char **text, size_t *text_len,
                    int32_t **ids, size_t *n_ids, pg_error *err);

#endif /* PG_CLI_CHAT_RENDER_H */
