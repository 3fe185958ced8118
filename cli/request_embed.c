/* request_embed: embedding lines (see request_embed.h). */
#include "request_embed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cli_embed_free(cli_embed *e)
{
    if (!e)
        return;
    for (int32_t k = 0; k < e->n_inputs; k++) {
        if (e->texts)
            free(e->texts[k]);
        if (e->ids)
            free(e->ids[k]);
    }
    free(e->texts);
    free(e->text_lens);
    free(e->ids);
    free(e->n_ids);
    memset(e, 0, sizeof *e);
}

static int alloc_inputs(cli_embed *e, int32_t n, pg_error *err)
{
    e->texts = calloc((size_t)n, sizeof *e->texts);
    e->text_lens = calloc((size_t)n, sizeof *e->text_lens);
    e->ids = calloc((size_t)n, sizeof *e->ids);
    e->n_ids = calloc((size_t)n, sizeof *e->n_ids);
    if (!e->texts || !e->text_lens || !e->ids || !e->n_ids)
        return pg_error_set(err, PG_ENOMEM, "out of memory");
    e->n_inputs = n;
    return PG_OK;
}

/* A list of token ids at token v into ids[k]; what names it in errors. */
static int read_ids(cli_embed *e, const json_doc *d, int v, int32_t k, const char *what, pg_error *err)
{
    int n = json_size(d, v);
    if (n == 0)
        return pg_error_set(err, PG_EINVAL, "field '%s': empty list of token ids", what);
    e->ids[k] = malloc((size_t)n * sizeof *e->ids[k]);
    if (!e->ids[k])
        return pg_error_set(err, PG_ENOMEM, "out of memory");
    for (int j = 0, t = v + 1; j < n; j++, t = json_skip(d, t)) {
        int64_t x;
        pg_error e2;
        if (!json_is_number(d, t) || json_get_int(d, t, 0, INT32_MAX, &x, &e2) != PG_OK)
            return pg_error_set(err, PG_EINVAL, "field '%s': element %d: expected a token id (an integer >= 0)",
                                what, j);
        e->ids[k][j] = (int32_t)x;
    }
    e->n_ids[k] = n;
    return PG_OK;
}

static int read_text(cli_embed *e, const json_doc *d, int v, int32_t k, const char *what, pg_error *err)
{
    if (json_get_string(d, v, &e->texts[k], &e->text_lens[k], err) != PG_OK)
        return pg_error_set(err, PG_ENOMEM, "out of memory");
    if (e->text_lens[k] == 0)
        return pg_error_set(err, PG_EINVAL, "field '%s': empty string", what);
    return PG_OK;
}

/* "input": a string, [string], [int] or [[int]] (vLLM's Union order:
 * list[int], list[list[int]], str, list[str]). */
static int read_input(cli_embed *e, const json_doc *d, int v, pg_error *err)
{
    const char *expected = "field 'input': expected a string, a list of strings, a list of token ids or a "
                           "list of lists of token ids";
    if (json_is_string(d, v)) {
        int rc = alloc_inputs(e, 1, err);
        return rc ? rc : read_text(e, d, v, 0, "input", err);
    }
    if (!json_is_array(d, v))
        return pg_error_set(err, PG_EINVAL, "%s", expected);
    int n = json_size(d, v);
    if (n == 0)
        return pg_error_set(err, PG_EINVAL, "field 'input': empty list");
    int first = v + 1;
    if (json_is_number(d, first)) { /* one prompt of ids */
        int rc = alloc_inputs(e, 1, err);
        return rc ? rc : read_ids(e, d, v, 0, "input", err);
    }
    bool strings = json_is_string(d, first);
    if (!strings && !json_is_array(d, first))
        return pg_error_set(err, PG_EINVAL, "%s", expected);
    if (n > CLI_EMBED_MAX_INPUTS)
        return pg_error_set(err, PG_EINVAL, "field 'input': %d inputs, at most %d per line", n,
                            CLI_EMBED_MAX_INPUTS);
    int rc = alloc_inputs(e, n, err);
    if (rc)
        return rc;
    char what[48];
    for (int k = 0, t = first; k < n; k++, t = json_skip(d, t)) {
        snprintf(what, sizeof what, "input[%d]", k);
        if (strings ? !json_is_string(d, t) : !json_is_array(d, t))
            return pg_error_set(err, PG_EINVAL, "%s: every element must be a %s, as the first", expected,
                                strings ? "string" : "list of token ids");
        if ((rc = strings ? read_text(e, d, t, k, what, err) : read_ids(e, d, t, k, what, err)))
            return rc;
    }
    return PG_OK;
}

static int read_bool(const json_doc *d, int v, const char *field, bool *out, pg_error *err)
{
    pg_error e2;
    if (json_get_bool(d, v, out, &e2) != PG_OK)
        return pg_error_set(err, PG_EINVAL, "field '%s': expected a bool", field);
    return PG_OK;
}

int cli_embed_parse(cli_embed *out, const json_doc *d, int obj, bool skip_id, bool openai,
                    bool strict, int32_t *n_lax, char **model, pg_error *err)
{
    memset(out, 0, sizeof *out);
    out->add_special_tokens = true;
    out->normalize = -1;
    if (model)
        *model = NULL;
    if (!json_is_object(d, obj))
        return pg_error_set(err, PG_EINVAL, "field 'body': expected an object");
    bool have_input = false;
    int n = json_size(d, obj);
    for (int k = 0, key = obj + 1; k < n; k++) {
        int v = key + 1, rc = PG_OK;
        bool null = json_is_null(d, v);
        if (skip_id && json_str_eq(d, key, "id")) {
            /* read by the caller */
        } else if (json_str_eq(d, key, "input")) {
            if (have_input)
                return pg_error_set(err, PG_EINVAL, "field 'input' given twice");
            rc = read_input(out, d, v, err);
            have_input = true;
        } else if (json_str_eq(d, key, "encoding_format")) {
            if (!null && json_is_string(d, v) && json_str_eq(d, v, "base64"))
                out->base64 = true;
            else if (!null && !(json_is_string(d, v) && json_str_eq(d, v, "float")))
                rc = pg_error_set(err, PG_EINVAL, "field 'encoding_format': expected \"float\" or \"base64\"");
        } else if (json_str_eq(d, key, "dimensions")) {
            int64_t x;
            pg_error e2;
            if (!null && (!json_is_number(d, v) || json_get_int(d, v, INT32_MIN, INT32_MAX, &x, &e2) != PG_OK))
                rc = pg_error_set(err, PG_EINVAL, "field 'dimensions': expected an integer");
            else if (!null && x < 1)
                rc = pg_error_set(err, PG_EINVAL, "Dimensions must be greater than 0"); /* vLLM's message */
            else if (!null)
                out->dimensions = (int32_t)x;
        } else if (json_str_eq(d, key, "add_special_tokens")) {
            if (!null)
                rc = read_bool(d, v, "add_special_tokens", &out->add_special_tokens, err);
        } else if (json_str_eq(d, key, "normalize")) {
            bool b = false;
            if (!null && !(rc = read_bool(d, v, "normalize", &b, err)))
                out->normalize = b;
        } else if (json_str_eq(d, key, "truncate_prompt_tokens")) {
            if (!null)
                rc = pg_error_set(err, PG_EINVAL, "field 'truncate_prompt_tokens': not supported");
        } else if (openai && (json_str_eq(d, key, "model") || json_str_eq(d, key, "user"))) {
            bool is_model = json_str_eq(d, key, "model");
            size_t len;
            if (!null && !json_is_string(d, v))
                rc = pg_error_set(err, PG_EINVAL, "field '%s': expected a string", is_model ? "model" : "user");
            else if (!null && is_model && model && json_get_string(d, v, model, &len, err) != PG_OK)
                rc = pg_error_set(err, PG_ENOMEM, "out of memory");
        } else if (strict) {
            size_t kl;
            const char *ks = json_raw(d, key, &kl);
            rc = pg_error_set(err, PG_EINVAL, "unknown field '%.*s' in an embedding request", (int)(kl > 64 ? 64 : kl),
                              ks);
        } else {
            (*n_lax)++;
        }
        if (rc != PG_OK)
            return rc;
        key = json_skip(d, v);
    }
    if (!have_input)
        return pg_error_set(err, PG_EINVAL, openai ? "body: missing 'input'" : "missing 'input'");
    return PG_OK;
}
