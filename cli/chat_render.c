/* chat_render: template + clock + tokenizer for chat lines (see chat_render.h). */
#include "chat_render.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "json.h"
#include "tokenizer.h"

int cli_chat_clock(const cli_options *o, const char *source_date_epoch, int64_t *now, pg_error *err)
{
    if (o->has_chat_date) {
        *now = o->chat_date_unix;
        return PG_OK;
    }
    if (source_date_epoch && *source_date_epoch) {
        /* reproducible-builds.org: a malformed value is an error, not a
         * silent fall-back to the clock */
        char *end = NULL;
        errno = 0;
        long long v = strtoll(source_date_epoch, &end, 10);
        if (*end != '\0' || errno == ERANGE || v < 0 || v > 253402300799LL ||
            source_date_epoch[0] < '0' || source_date_epoch[0] > '9')
            return pg_error_set(err, PG_EINVAL,
                                "SOURCE_DATE_EPOCH: expected whole seconds since 1970 (0..253402300799), "
                                "got '%.40s'", source_date_epoch);
        *now = (int64_t)v;
        return PG_OK;
    }
    *now = (int64_t)time(NULL);
    return PG_OK;
}

int cli_chat_open(cli_chat *c, const cli_options *o, const char *tokenizer_dir, const tokenizer *tok,
                  bool default_add_generation_prompt, pg_error *err)
{
    memset(c, 0, sizeof *c);
    int64_t now = 0;
    int rc = cli_chat_clock(o, getenv("SOURCE_DATE_EPOCH"), &now, err);
    if (rc != PG_OK)
        return rc;
    rc = chat_template_load(&c->tmpl, tokenizer_dir, o->chat_template_path, err);
    if (rc != PG_OK) {
        c->tmpl = NULL;
        return rc == PG_EINVAL ? PG_EFORMAT : rc; /* PG_EINVAL means a usage error here */
    }
    c->tok = tok;
    c->opts.now_unix = now;
    c->opts.default_add_generation_prompt = default_add_generation_prompt;
    return PG_OK;
}

void cli_chat_close(cli_chat *c)
{
    if (!c)
        return;
    chat_template_destroy(c->tmpl);
    c->tmpl = NULL;
}

int cli_chat_render(const cli_chat *c, const char *json, size_t len, char **text, size_t *text_len,
                    int32_t **ids, size_t *n_ids, pg_error *err)
{
    *text = NULL;
    *ids = NULL;
    *text_len = *n_ids = 0;
    if (!c->tmpl)
        return pg_error_set(err, PG_EINVAL, CLI_CHAT_NO_TEMPLATE);
    if (!c->tok)
        return pg_error_set(err, PG_EINVAL, "a chat request needs a tokenizer (give --tokenizer DIR)");
    json_doc d;
    pg_error e;
    if (json_parse(&d, json, len, "line", &e) != PG_OK)
        return pg_error_set(err, PG_EINVAL, "invalid JSON (%s)",
                            strncmp(e.msg, "line: ", 6) == 0 ? e.msg + 6 : e.msg);
    if (!json_is_object(&d, 0)) {
        json_doc_free(&d);
        return pg_error_set(err, PG_EINVAL, "expected a JSON object");
    }
    char *out = NULL;
    size_t out_len = 0;
    int rc = chat_template_render(c->tmpl, &d, 0, &c->opts, &out, &out_len, err);
    json_doc_free(&d);
    if (rc != PG_OK)
        return rc == PG_ENOMEM ? rc : PG_EINVAL;
    if (out_len == 0) {
        free(out);
        return pg_error_set(err, PG_EINVAL, "the chat template rendered an empty prompt");
    }
    if (tok_encode(c->tok, out, out_len, false, ids, n_ids, &e) != PG_OK) {
        free(out);
        return pg_error_set(err, PG_EINVAL, "rendered prompt: %s", e.msg);
    }
    *text = out;
    *text_len = out_len;
    return PG_OK;
}
