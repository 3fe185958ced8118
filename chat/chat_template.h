/* chat_template: a model's chat template (a Jinja2 program shipped in its
 * tokenizer_config.json) and the strings it sees, rendered exactly as
 * transformers' apply_chat_template renders it (jinja2's
 * ImmutableSandboxedEnvironment with trim_blocks=True, lstrip_blocks=True,
 * loopcontrols; tojson = json.dumps(ensure_ascii=False); raise_exception;
 * strftime_now). The Jinja interpreter lives in chat/jinja_*; this module
 * finds the template, builds the variables from a chat request and calls it.
 *
 * Depends on common/ (json, file_io) only: no tokenizer, no engine.
 */
#ifndef PG_CHAT_TEMPLATE_H
#define PG_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "json.h"
#include "pg_error.h"

typedef struct chat_template chat_template;

/* Finds and parses the template of a tokenizer folder, in this order:
 *   override_path (--chat-template FILE; always wins) when non-NULL,
 *   DIR/chat_template.jinja (transformers >= 4.47 prefers this file to the
 *     config's entry: PreTrainedTokenizerBase._from_pretrained),
 *   DIR/tokenizer_config.json "chat_template": a string, or a list of
 *     {"name", "template"} (the one named "default"),
 *   DIR/chat_template.json ({"chat_template": ...}).
 * bos_token / eos_token come from DIR/tokenizer_config.json (a string or
 * {"content": ...}); an absent one is undefined in the template.
 * No template anywhere: returns 0 with *out = NULL (the caller answers each
 * chat line with an error naming the fix). A template that does not parse:
 * PG_EFORMAT "FILE: chat template: line L, column C: <what>". */
int chat_template_load(chat_template **out, const char *tokenizer_dir,
                       const char *override_path, pg_error *err);

/* Parses template source src[0, len). `label` names it in messages.
 * bos_token / eos_token may be NULL (undefined in the template). */
int chat_template_create(chat_template **out, const char *src, size_t len,
                         const char *label, const char *bos_token,
                         const char *eos_token, pg_error *err);
void chat_template_destroy(chat_template *t); /* accepts NULL */

/* Where the template came from ("tokenizer_config.json", a path, ...). */
const char *chat_template_label(const chat_template *t);

typedef struct chat_render_opts {
    /* strftime_now's clock, UTC seconds since the epoch (the CLI takes it
     * from --chat-template-date, SOURCE_DATE_EPOCH or the clock). */
    int64_t now_unix;
    /* add_generation_prompt when the request does not say: true for
     * generation (vLLM's ChatCompletionRequest default), false for a bare
     * render (transformers' default). */
    bool default_add_generation_prompt;
} chat_render_opts;

/* Renders one conversation. `obj` is a JSON object token of `doc` holding
 *   "messages"               array of {"role", "content", ...} (required);
 *                            content as a list of {"type": "text", "text"}
 *                            parts is joined with "\n" as vLLM does for
 *                            string-content templates;
 *   "add_generation_prompt"  bool (default: opts);
 *   "continue_final_message" bool: as transformers, the render is cut after
 *                            the final message's content (an error with
 *                            add_generation_prompt true);
 *   "tools"                  array or null;
 *   "documents"              array or null;
 *   "chat_template_kwargs"   object: each key becomes a top-level variable.
 * Other keys of obj are ignored (a request body holds sampling fields too).
 * On success *out is malloc'd, NUL-terminated; the caller frees it.
 * On error returns PG_EINVAL (bad messages), or PG_EFORMAT for a render
 * error (raise_exception's message verbatim, an undefined attribute, a type
 * error, the output or recursion limits), and changes nothing. */
int chat_template_render(const chat_template *t, const json_doc *doc, int obj,
                         const chat_render_opts *opts, char **out, size_t *out_len,
                         pg_error *err);

#endif /* PG_CHAT_TEMPLATE_H */
