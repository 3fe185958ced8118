/* request_structured: structured-output request fields (see the header).
 * Names: vLLM's SamplingParams.structured_outputs (StructuredOutputsParams:
 * json, regex, choice, grammar, json_object; vllm/sampling_params.py) and
 * the older guided_json / guided_regex / guided_choice / guided_grammar
 * request fields; OpenAI's response_format. */
#include "request_structured.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

void cli_structured_free(cli_structured *s)
{
    if (!s)
        return;
    free(s->text);
    memset(s, 0, sizeof *s);
}

static int set(cli_structured *s, const char *field, grammar_kind kind, const char *text,
               size_t len, pg_error *err)
{
    if (s->kind != GRAMMAR_NONE)
        return pg_error_set(err, PG_EINVAL,
                            "field '%s': only one structured-output constraint per request ('%s' "
                            "is already set)", field, s->field);
    char *t = malloc(len + 1);
    if (!t)
        return pg_error_set(err, PG_ENOMEM, "field '%s': out of memory", field);
    if (len)
        memcpy(t, text, len);
    t[len] = '\0';
    s->kind = kind;
    s->text = t;
    s->len = len;
    s->field = field;
    return PG_OK;
}

/* A schema: an object or boolean (its JSON text), or a string holding it. */
static int set_schema(cli_structured *s, const char *field, const json_doc *d, int v, pg_error *err)
{
    if (json_is_string(d, v)) {
        char *t = NULL;
        size_t n = 0;
        if (json_get_string(d, v, &t, &n, err) != PG_OK)
            return pg_error_set(err, PG_EINVAL, "field '%s': bad string", field);
        int rc = set(s, field, GRAMMAR_JSON_SCHEMA, t, n, err);
        free(t);
        return rc;
    }
    if (!json_is_object(d, v) && !json_is_bool(d, v))
        return pg_error_set(err, PG_EINVAL, "field '%s': expected a JSON schema (an object)", field);
    size_t n = 0;
    const char *raw = json_raw(d, v, &n);
    return set(s, field, GRAMMAR_JSON_SCHEMA, raw, n, err);
}

static int set_regex(cli_structured *s, const char *field, const json_doc *d, int v, pg_error *err)
{
    if (!json_is_string(d, v))
        return pg_error_set(err, PG_EINVAL, "field '%s': expected a string", field);
    char *t = NULL;
    size_t n = 0;
    if (json_get_string(d, v, &t, &n, err) != PG_OK)
        return pg_error_set(err, PG_EINVAL, "field '%s': bad string", field);
    int rc = set(s, field, GRAMMAR_REGEX, t, n, err);
    free(t);
    return rc;
}

static int set_choice(cli_structured *s, const char *field, const json_doc *d, int v, pg_error *err)
{
    if (!json_is_array(d, v) || json_size(d, v) == 0)
        return pg_error_set(err, PG_EINVAL, "field '%s': expected a non-empty array of strings", field);
    for (int k = 0, i = v + 1; k < json_size(d, v); k++, i = json_skip(d, i))
        if (!json_is_string(d, i))
            return pg_error_set(err, PG_EINVAL, "field '%s'[%d]: expected a string", field, k);
    size_t n = 0;
    const char *raw = json_raw(d, v, &n);
    return set(s, field, GRAMMAR_CHOICE, raw, n, err);
}

static int structured_outputs(cli_structured *s, const json_doc *d, int v, pg_error *err)
{
    static const char *const f = "structured_outputs";
    if (!json_is_object(d, v))
        return pg_error_set(err, PG_EINVAL, "field '%s': expected an object", f);
    int n = json_size(d, v);
    for (int k = 0, key = v + 1; k < n; k++, key = json_skip(d, key + 1)) {
        int x = key + 1;
        int rc = PG_OK;
        if (json_is_null(d, x))
            continue;
        if (json_str_eq(d, key, "json")) {
            rc = set_schema(s, "structured_outputs.json", d, x, err);
        } else if (json_str_eq(d, key, "regex")) {
            rc = set_regex(s, "structured_outputs.regex", d, x, err);
        } else if (json_str_eq(d, key, "choice")) {
            rc = set_choice(s, "structured_outputs.choice", d, x, err);
        } else if (json_str_eq(d, key, "json_object")) {
            if (!json_is_bool(d, x))
                return pg_error_set(err, PG_EINVAL, "field 'structured_outputs.json_object': expected a boolean");
            bool on = false;
            json_get_bool(d, x, &on, NULL);
            if (on)
                rc = set(s, "structured_outputs.json_object", GRAMMAR_JSON_OBJECT, "", 0, err);
        } else if (json_str_eq(d, key, "disable_any_whitespace")) {
            /* compact JSON is the only mode: true is what we do anyway */
            if (!json_is_bool(d, x))
                return pg_error_set(err, PG_EINVAL, "field 'structured_outputs.disable_any_whitespace': expected a boolean");
        } else if (json_str_eq(d, key, "disable_additional_properties")) {
            if (!json_is_bool(d, x))
                return pg_error_set(err, PG_EINVAL, "field 'structured_outputs.disable_additional_properties': expected a boolean");
        } else {
            size_t kl = 0;
            const char *kr = json_raw(d, key, &kl);
            return pg_error_set(err, PG_EINVAL,
                                "field 'structured_outputs': unsupported key '%.*s'",
                                (int)(kl > 40 ? 40 : kl), kr);
        }
        if (rc)
            return rc;
    }
    return PG_OK;
}

static int response_format(cli_structured *s, const json_doc *d, int v, pg_error *err)
{
    static const char *const f = "response_format";
    if (!json_is_object(d, v))
        return pg_error_set(err, PG_EINVAL, "field '%s': expected an object", f);
    int ty = json_obj_get(d, v, "type");
    if (json_str_eq(d, ty, "text"))
        return PG_OK;
    if (json_str_eq(d, ty, "json_object"))
        return set(s, "response_format", GRAMMAR_JSON_OBJECT, "", 0, err);
    if (json_str_eq(d, ty, "json_schema")) {
        int js = json_obj_get(d, v, "json_schema");
        if (!json_is_object(d, js))
            return pg_error_set(err, PG_EINVAL, "field 'response_format': expected 'json_schema': {\"name\", \"schema\"}");
        int sc = json_obj_get(d, js, "schema");
        if (sc < 0)
            return pg_error_set(err, PG_EINVAL, "field 'response_format.json_schema': missing 'schema'");
        return set_schema(s, "response_format.json_schema.schema", d, sc, err);
    }
    return pg_error_set(err, PG_EINVAL,
                        "field 'response_format': expected type \"text\", \"json_object\" or \"json_schema\"");
}

int cli_structured_field(const json_doc *d, int key, int v, cli_structured *s, pg_error *err)
{
    bool null = json_is_null(d, v);
    if (json_str_eq(d, key, "structured_outputs"))
        return null ? PG_OK : structured_outputs(s, d, v, err);
    if (json_str_eq(d, key, "guided_json"))
        return null ? PG_OK : set_schema(s, "guided_json", d, v, err);
    if (json_str_eq(d, key, "guided_regex"))
        return null ? PG_OK : set_regex(s, "guided_regex", d, v, err);
    if (json_str_eq(d, key, "guided_choice"))
        return null ? PG_OK : set_choice(s, "guided_choice", d, v, err);
    if (json_str_eq(d, key, "response_format"))
        return null ? PG_OK : response_format(s, d, v, err);
    if (json_str_eq(d, key, "guided_decoding_backend")) /* vLLM's backend choice: one here */
        return null || json_is_string(d, v)
                   ? PG_OK
                   : pg_error_set(err, PG_EINVAL, "field 'guided_decoding_backend': expected a string");
    if (json_str_eq(d, key, "guided_grammar"))
        return null ? PG_OK
                    : pg_error_set(err, PG_EINVAL, "field 'guided_grammar': grammars (EBNF) are not supported");
    return 1;
}
