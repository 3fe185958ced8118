/* request_parse: input line -> cli_request (see request_parse.h). */
#include "request_parse.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "json.h"

uint64_t cli_hash64(const void *data, size_t len)
{
    const unsigned char *p = data;
    uint64_t h = 14695981039346656037ull;
    for (size_t k = 0; k < len; k++) {
        h ^= p[k];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t cli_request_seed(uint64_t base_seed, int64_t index)
{
    return splitmix64(base_seed ^ splitmix64((uint64_t)index));
}

static bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

cli_format cli_detect_format(const char *line, size_t len)
{
    size_t k = 0;
    while (k < len && is_blank(line[k]))
        k++;
    if (k >= len || line[k] != '{')
        return CLI_FORMAT_TEXT;
    /* An object: openai when it carries the batch envelope's keys at the
     * top level (so a chat message whose content is "body" stays jsonl). A
     * cheap textual test keeps detection working on a malformed first line. */
    const char *s = line + k;
    size_t n = len - k;
    json_doc d;
    if (json_parse(&d, line, len, "line", NULL) == PG_OK) {
        bool openai = json_is_object(&d, 0) &&
                      (json_obj_get(&d, 0, "custom_id") >= 0 || json_obj_get(&d, 0, "body") >= 0);
        json_doc_free(&d);
        return openai ? CLI_FORMAT_OPENAI : CLI_FORMAT_JSONL;
    }
    static const char *const keys[] = {"\"custom_id\"", "\"body\""};
    for (size_t j = 0; j < 2; j++) {
        size_t kl = strlen(keys[j]);
        for (size_t p = 0; p + kl <= n; p++)
            if (memcmp(s + p, keys[j], kl) == 0)
                return CLI_FORMAT_OPENAI;
    }
    return CLI_FORMAT_JSONL;
}

void cli_request_free(cli_request *r)
{
    if (!r)
        return;
    free(r->id_json);
    free(r->id_key);
    free(r->prompt);
    free(r->prompt_ids);
    free(r->chat_json);
    cli_embed_free(r->embed);
    free(r->embed);
    free(r->model);
    for (size_t k = 0; k < r->n_stop; k++)
        free(r->stop[k]);
    free(r->stop);
    free(r->stop_token_ids);
    cli_structured_free(&r->structured);
    memset(r, 0, sizeof *r);
}

/* ---- small helpers -------------------------------------------------------- */

typedef struct pctx {
    const json_doc *d;
    cli_request *r;
    pg_error *err;
    bool has_seed;
    bool has_stop, has_stop_ids;
    bool strict;                /* today's errors; else pydantic lax mode, counted in r->n_lax */
} pctx;

/* pydantic's lax mode for a number given as a JSON string ("0.5", " 3 "):
 * the whole string must be a finite decimal number. */
static bool lax_number(pctx *c, int i, double *out)
{
    if (c->strict || !json_is_string(c->d, i))
        return false;
    char *s = NULL;
    size_t len = 0;
    pg_error e;
    if (json_get_string(c->d, i, &s, &len, &e) != PG_OK)
        return false;
    char *end = NULL;
    double v = strtod(s, &end);
    while (end && (*end == ' ' || *end == '\t' || *end == '\n'))
        end++;
    bool ok = len > 0 && end && *end == '\0' && end != s && isfinite(v) && strlen(s) == len;
    free(s);
    if (ok)
        *out = v;
    return ok;
}

/* A short description of token i for messages: its JSON text, cut at 40 bytes. */
static const char *describe(const json_doc *d, int i, char *buf, size_t cap)
{
    size_t n = 0;
    const char *raw = json_raw(d, i, &n);
    bool str = json_is_string(d, i);
    size_t keep = n > 40 ? 40 : n;
    snprintf(buf, cap, "%s%.*s%s%s", str ? "\"" : "", (int)keep, raw, n > keep ? "..." : "",
             str ? "\"" : "");
    return buf;
}

static int type_error(pctx *c, const char *field, int i, const char *expected)
{
    char b[64];
    return pg_error_set(c->err, PG_EINVAL, "field '%s': expected %s, found %s", field, expected,
                        describe(c->d, i, b, sizeof b));
}

static int not_object(pctx *c)
{
    char b[64];
    return pg_error_set(c->err, PG_EINVAL, "expected a JSON object, found %s", describe(c->d, 0, b, sizeof b));
}

static int range_error(pctx *c, const char *field, int i, int64_t lo, int64_t hi)
{
    char b[64];
    return pg_error_set(c->err, PG_EINVAL, "field '%s': expected an integer in [%lld, %lld], found %s",
                        field, (long long)lo, (long long)hi, describe(c->d, i, b, sizeof b));
}

static int get_i64(pctx *c, const char *field, int i, int64_t lo, int64_t hi, int64_t *out)
{
    double lax = 0.0;
    bool str = lax_number(c, i, &lax);
    if (!json_is_number(c->d, i) && !str)
        return type_error(c, field, i, "an integer");
    pg_error e;
    if (!str && json_get_int(c->d, i, lo, hi, out, &e) == PG_OK)
        return PG_OK;
    /* lax mode: an integral float (3.0) or a numeric string ("3"); pydantic
     * refuses a fractional part */
    double v = lax;
    if (!c->strict && (str || json_get_double(c->d, i, &v, &e) == PG_OK) && v == floor(v) &&
        v >= (double)lo && v <= (double)hi && fabs(v) < 9007199254740992.0) {
        *out = (int64_t)v;
        c->r->n_lax++;
        return PG_OK;
    }
    return range_error(c, field, i, lo, hi);
}

static int get_i32(pctx *c, const char *field, int i, int64_t lo, int64_t hi, int32_t *out)
{
    int64_t v;
    int rc = get_i64(c, field, i, lo, hi, &v);
    if (rc == PG_OK)
        *out = (int32_t)v;
    return rc;
}

static int get_f32(pctx *c, const char *field, int i, float *out)
{
    double v;
    pg_error e;
    if (lax_number(c, i, &v))
        c->r->n_lax++; /* lax mode: "0.5" for a float */
    else if (!json_is_number(c->d, i) || json_get_double(c->d, i, &v, &e) != PG_OK)
        return type_error(c, field, i, "a number");
    if (!(fabs(v) <= (double)FLT_MAX))
        return type_error(c, field, i, "a number in the float range");
    *out = (float)v;
    return PG_OK;
}

static int get_bool(pctx *c, const char *field, int i, bool *out)
{
    pg_error e;
    if (json_is_bool(c->d, i) && json_get_bool(c->d, i, out, &e) == PG_OK)
        return PG_OK;
    if (!c->strict) {
        /* pydantic's lax bool (docs.pydantic.dev Conversion Table): the
         * numbers 0, 1 (0.0, 1.0) and, lower-cased, the strings below */
        static const char *const yes[] = {"1", "on", "t", "true", "y", "yes"};
        static const char *const no[] = {"0", "off", "f", "false", "n", "no"};
        size_t n = 0;
        const char *raw = json_raw(c->d, i, &n);
        double v;
        if (json_is_number(c->d, i) && json_get_double(c->d, i, &v, &e) == PG_OK && (v == 0.0 || v == 1.0)) {
            *out = v == 1.0;
            c->r->n_lax++;
            return PG_OK;
        }
        if (json_is_string(c->d, i))
            for (size_t k = 0; k < 6; k++) {
                if (strlen(yes[k]) == n && strncasecmp(raw, yes[k], n) == 0) {
                    *out = true;
                    c->r->n_lax++;
                    return PG_OK;
                }
                if (strlen(no[k]) == n && strncasecmp(raw, no[k], n) == 0) {
                    *out = false;
                    c->r->n_lax++;
                    return PG_OK;
                }
            }
    }
    return type_error(c, field, i, "true or false");
}

static int get_str(pctx *c, const char *field, int i, char **out, size_t *len)
{
    if (!json_is_string(c->d, i))
        return type_error(c, field, i, "a string");
    pg_error e;
    if (json_get_string(c->d, i, out, len, &e) != PG_OK)
        return pg_error_set(c->err, PG_EINVAL, "field '%s': %s", field, e.msg);
    return PG_OK;
}

static int get_id_array(pctx *c, const char *field, int i, bool allow_empty, int32_t **out,
                        size_t *n_out)
{
    if (!json_is_array(c->d, i))
        return type_error(c, field, i, "an array of token ids");
    int n = json_size(c->d, i);
    if (n == 0 && !allow_empty)
        return pg_error_set(c->err, PG_EINVAL, "field '%s': empty", field);
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    if (!ids)
        return pg_error_set(c->err, PG_ENOMEM, "field '%s': out of memory", field);
    int t = i + 1;
    for (int k = 0; k < n; k++) {
        int64_t v;
        if (!json_is_number(c->d, t)) {
            free(ids);
            return type_error(c, field, t, "an array of token ids (integers >= 0)");
        }
        if (get_i64(c, field, t, 0, INT32_MAX, &v) != PG_OK) {
            free(ids);
            return PG_EINVAL;
        }
        ids[k] = (int32_t)v;
        t = json_skip(c->d, t);
    }
    *out = ids;
    *n_out = (size_t)n;
    return PG_OK;
}

static void free_stops(cli_request *r)
{
    for (size_t k = 0; k < r->n_stop; k++)
        free(r->stop[k]);
    free(r->stop);
    r->stop = NULL;
    r->n_stop = 0;
}

static int get_stop(pctx *c, int i)
{
    cli_request *r = c->r;
    free_stops(r);
    if (json_is_string(c->d, i)) {
        r->stop = calloc(1, sizeof *r->stop);
        if (!r->stop)
            return pg_error_set(c->err, PG_ENOMEM, "field 'stop': out of memory");
        size_t len;
        if (get_str(c, "stop", i, &r->stop[0], &len) != PG_OK)
            return PG_EINVAL;
        r->n_stop = 1;
        if (len == 0 || strlen(r->stop[0]) != len)
            return pg_error_set(c->err, PG_EINVAL, "field 'stop': stop strings must be non-empty and hold no NUL");
        return PG_OK;
    }
    if (!json_is_array(c->d, i))
        return type_error(c, "stop", i, "a string or an array of strings");
    int n = json_size(c->d, i);
    r->stop = calloc((size_t)n + 1, sizeof *r->stop);
    if (!r->stop)
        return pg_error_set(c->err, PG_ENOMEM, "field 'stop': out of memory");
    int t = i + 1;
    for (int k = 0; k < n; k++) {
        size_t len;
        if (!json_is_string(c->d, t))
            return type_error(c, "stop", t, "a string");
        if (get_str(c, "stop", t, &r->stop[k], &len) != PG_OK)
            return PG_EINVAL;
        r->n_stop = (size_t)k + 1;
        if (len == 0 || strlen(r->stop[k]) != len)
            return pg_error_set(c->err, PG_EINVAL, "field 'stop': stop strings must be non-empty and hold no NUL");
        t = json_skip(c->d, t);
    }
    return PG_OK;
}

/* Request fields vLLM knows and applies but pagedgen does not implement:
 * ignoring them like truly unknown fields would silently give other output
 * than vLLM, so anything but their neutral value is a line error. */
static bool neutral_value(const json_doc *d, int v, const char *neutral)
{
    if (json_is_null(d, v))
        return true;
    size_t n;
    const char *raw = json_raw(d, v, &n);
    if (!strcmp(neutral, "{}"))
        return json_is_object(d, v) && json_size(d, v) == 0;
    if (!strcmp(neutral, "[]"))
        return json_is_array(d, v) && json_size(d, v) == 0;
    return !json_is_string(d, v) && strlen(neutral) == n && memcmp(raw, neutral, n) == 0;
}

static int unsupported_field(pctx *c, int key, bool *is_unsupported)
{
    static const char *const fields[][2] = {
        {"logit_bias", "{}"}, {"allowed_token_ids", ""},
        {"bad_words", "[]"}, {"best_of", "1"},
        {"truncate_prompt_tokens", ""}, {"spaces_between_special_tokens", "true"},
        {"suffix", ""},
    };
    *is_unsupported = false;
    for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++) {
        if (!json_str_eq(c->d, key, fields[k][0]))
            continue;
        *is_unsupported = true;
        if (neutral_value(c->d, key + 1, fields[k][1][0] ? fields[k][1] : "null"))
            return PG_OK;
        return pg_error_set(c->err, PG_EINVAL,
                            "field '%s' is not supported by pagedgen (vLLM would apply it): leave it "
                            "out or set it to %s",
                            fields[k][0], fields[k][1][0] ? fields[k][1] : "null");
    }
    return PG_OK;
}

static int unknown_field(pctx *c, int key)
{
    bool unsupported;
    int rc = unsupported_field(c, key, &unsupported);
    if (unsupported)
        return rc;
    if (!c->strict) {
        /* vLLM (OpenAIBaseModel) logs and ignores fields it does not know */
        c->r->n_lax++;
        return PG_OK;
    }
    size_t n;
    const char *raw = json_raw(c->d, key, &n);
    return pg_error_set(c->err, PG_EINVAL, "unknown field '%.*s'", (int)(n > 60 ? 60 : n), raw);
}

/* The sampling fields shared by jsonl lines and openai bodies. A key that is
 * none of them is an "unknown field" (an error when strict, else ignored
 * and counted). Returns a pg_status. */
static int sampling_field(pctx *c, int key, int v, bool openai)
{
    const json_doc *d = c->d;
    sampling_params *sp = &c->r->sp;
    int src = cli_structured_field(d, key, v, &c->r->structured, c->err);
    if (src != 1)
        return src;
    if (json_is_null(d, v)) {
        /* null = not set, for every known field */
        static const char *const known[] = {
            "max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "n",
            "stop", "stop_token_ids", "ignore_eos", "include_stop_str_in_output",
            "skip_special_tokens", "presence_penalty", "frequency_penalty",
            "repetition_penalty", "logprobs", "prompt_logprobs", "use_beam_search",
            "length_penalty"};
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
            if (json_str_eq(d, key, known[k])) {
                if (k == 0)
                    c->r->max_tokens_null = true;
                return PG_OK;
            }
        return unknown_field(c, key);
    }
    if (json_str_eq(d, key, "max_tokens")) {
        c->r->max_tokens_set = true;
        return get_i32(c, "max_tokens", v, 1, INT32_MAX, &sp->max_tokens);
    }
    if (json_str_eq(d, key, "min_tokens"))
        return get_i32(c, "min_tokens", v, 0, INT32_MAX, &sp->min_tokens);
    if (json_str_eq(d, key, "temperature"))
        return get_f32(c, "temperature", v, &sp->temperature);
    if (json_str_eq(d, key, "top_p"))
        return get_f32(c, "top_p", v, &sp->top_p);
    if (json_str_eq(d, key, "top_k"))
        return get_i32(c, "top_k", v, INT32_MIN, INT32_MAX, &sp->top_k);
    if (json_str_eq(d, key, "min_p"))
        return get_f32(c, "min_p", v, &sp->min_p);
    if (json_str_eq(d, key, "presence_penalty"))
        return get_f32(c, "presence_penalty", v, &sp->presence_penalty);
    if (json_str_eq(d, key, "frequency_penalty"))
        return get_f32(c, "frequency_penalty", v, &sp->frequency_penalty);
    if (json_str_eq(d, key, "repetition_penalty"))
        return get_f32(c, "repetition_penalty", v, &sp->repetition_penalty);
    if (json_str_eq(d, key, "n"))
        return get_i32(c, "n", v, INT32_MIN, INT32_MAX, &sp->n);
    if (json_str_eq(d, key, "seed")) {
        int64_t s;
        int rc = get_i64(c, "seed", v, INT64_MIN, INT64_MAX, &s);
        if (rc == PG_OK) {
            sp->seed = (uint64_t)s;
            c->has_seed = true;
        }
        return rc;
    }
    if (json_str_eq(d, key, "logprobs")) {
        if (openai && json_is_bool(d, v))
            return type_error(c, "logprobs", v, "an integer (completions API)");
        return get_i32(c, "logprobs", v, 0, 20, &sp->logprobs);
    }
    if (json_str_eq(d, key, "prompt_logprobs"))
        return get_i32(c, "prompt_logprobs", v, 0, SAMPLING_PARAMS_MAX_LOGPROBS, &sp->prompt_logprobs);
    if (json_str_eq(d, key, "ignore_eos"))
        return get_bool(c, "ignore_eos", v, &sp->ignore_eos);
    /* beam search: vLLM's use_beam_search (n = the beam width) and
     * length_penalty (vllm/entrypoints/openai/protocol.py, both bodies);
     * length_penalty is used only with use_beam_search, as there */
    if (json_str_eq(d, key, "use_beam_search"))
        return get_bool(c, "use_beam_search", v, &sp->use_beam_search);
    if (json_str_eq(d, key, "length_penalty")) {
        /* a double, as vLLM's Python float: the score divides by seq_len**it */
        pg_error e;
        if (!json_is_number(d, v) || json_get_double(d, v, &sp->length_penalty, &e) != PG_OK ||
            !isfinite(sp->length_penalty))
            return type_error(c, "length_penalty", v, "a finite number");
        return PG_OK;
    }
    if (json_str_eq(d, key, "include_stop_str_in_output"))
        return get_bool(c, "include_stop_str_in_output", v, &sp->include_stop_str_in_output);
    if (json_str_eq(d, key, "skip_special_tokens"))
        return get_bool(c, "skip_special_tokens", v, &sp->skip_special_tokens);
    if (json_str_eq(d, key, "stop")) {
        c->has_stop = true;
        return get_stop(c, v);
    }
    if (json_str_eq(d, key, "stop_token_ids")) {
        free(c->r->stop_token_ids);
        c->r->stop_token_ids = NULL;
        c->r->n_stop_token_ids = 0;
        c->has_stop_ids = true;
        return get_id_array(c, "stop_token_ids", v, true, &c->r->stop_token_ids,
                            &c->r->n_stop_token_ids);
    }
    return unknown_field(c, key);
}

/* Rejects an object that names the same key twice (jsmn keeps both). */
static int check_duplicate_keys(pctx *c, int obj)
{
    const json_doc *d = c->d;
    int n = json_size(d, obj);
    int a = obj + 1;
    for (int i = 0; i < n; i++) {
        size_t la;
        const char *ra = json_raw(d, a, &la);
        int b = json_skip(d, a + 1);
        for (int j = i + 1; j < n; j++) {
            size_t lb;
            const char *rb = json_raw(d, b, &lb);
            if (la == lb && memcmp(ra, rb, la) == 0)
                return pg_error_set(c->err, PG_EINVAL, "field '%.*s' given twice",
                                    (int)(la > 60 ? 60 : la), ra);
            b = json_skip(d, b + 1);
        }
        a = json_skip(d, a + 1);
    }
    return PG_OK;
}

static int set_id_int(cli_request *r, int64_t v)
{
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%lld", (long long)v);
    free(r->id_json);
    free(r->id_key);
    r->id_json = strdup(buf);
    r->id_key = malloc((size_t)n + 3);
    if (!r->id_json || !r->id_key)
        return PG_ENOMEM;
    memcpy(r->id_key, "n:", 2);
    memcpy(r->id_key + 2, buf, (size_t)n + 1);
    r->id_key_len = (size_t)n + 2;
    return PG_OK;
}

static int set_id_str(cli_request *r, const char *s, size_t len)
{
    json_buf b = {0};
    json_buf_string(&b, s, len);
    json_buf_put(&b, "", 1); /* NUL */
    free(r->id_json);
    free(r->id_key);
    r->id_json = b.oom ? NULL : b.data;
    if (b.oom)
        json_buf_free(&b);
    r->id_key = malloc(len + 3);
    if (!r->id_json || !r->id_key)
        return PG_ENOMEM;
    memcpy(r->id_key, "s:", 2);
    memcpy(r->id_key + 2, s, len);
    r->id_key[len + 2] = '\0';
    r->id_key_len = len + 2;
    return PG_OK;
}

static int read_string_id(pctx *c, const char *field, int v)
{
    char *s = NULL;
    size_t len = 0;
    if (get_str(c, field, v, &s, &len) != PG_OK)
        return PG_EINVAL;
    int rc = set_id_str(c->r, s, len);
    free(s);
    if (rc != PG_OK)
        return pg_error_set(c->err, rc, "field '%s': out of memory", field);
    return PG_OK;
}

static int read_prompt(pctx *c, const char *field, int v, bool allow_ids)
{
    cli_request *r = c->r;
    if (json_is_string(c->d, v)) {
        if (get_str(c, field, v, &r->prompt, &r->prompt_len) != PG_OK)
            return PG_EINVAL;
        if (r->prompt_len == 0)
            return pg_error_set(c->err, PG_EINVAL, "empty prompt");
        return PG_OK;
    }
    if (allow_ids && json_is_array(c->d, v)) {
        size_t n = 0;
        if (json_size(c->d, v) == 0)
            return pg_error_set(c->err, PG_EINVAL, "empty prompt");
        if (get_id_array(c, field, v, false, &r->prompt_ids, &n) != PG_OK)
            return PG_EINVAL;
        r->n_prompt_ids = (int32_t)n;
        return PG_OK;
    }
    return type_error(c, field, v, allow_ids ? "a string or an array of token ids" : "a string");
}


/* A JSON number that is zero (0, 0.0, -0, 0e5). */
static bool json_raw_is_zero(const json_doc *d, int v)
{
    double x;
    pg_error e;
    return json_get_double(d, v, &x, &e) == PG_OK && x == 0.0;
}

/* The openai body's "model" (a string) into r->model. */
static int read_model(pctx *c, int v)
{
    size_t len;
    free(c->r->model);
    c->r->model = NULL;
    return get_str(c, "model", v, &c->r->model, &len);
}

/* ---- chat requests ------------------------------------------------------------ */

/* Python's bool() of a JSON value: false, null, 0, "", [] and {} are false. */
static bool py_truthy(const json_doc *d, int i)
{
    size_t n = 0;
    if (json_is_null(d, i))
        return false;
    if (json_is_bool(d, i)) {
        bool b = false;
        pg_error e;
        return json_get_bool(d, i, &b, &e) == PG_OK && b;
    }
    if (json_is_number(d, i)) {
        double x = 0.0;
        pg_error e;
        return json_get_double(d, i, &x, &e) != PG_OK || x != 0.0;
    }
    if (json_is_string(d, i)) {
        json_raw(d, i, &n); /* without the quotes; escapes still escaped */
        return n > 0;
    }
    return json_size(d, i) > 0; /* an array or object */
}

/* A chat field that must be of one JSON type or null (the template reads it;
 * its contents are the renderer's to check). */
static int chat_typed(pctx *c, const char *field, int v, bool (*is)(const json_doc *, int),
                      const char *expected)
{
    if (json_is_null(c->d, v) || is(c->d, v))
        return PG_OK;
    return type_error(c, field, v, expected);
}

static int chat_messages(pctx *c, int v)
{
    const json_doc *d = c->d;
    if (!json_is_array(d, v))
        return type_error(c, "messages", v, "an array of message objects");
    int n = json_size(d, v);
    if (n == 0)
        return pg_error_set(c->err, PG_EINVAL, "field 'messages': empty");
    int t = v + 1;
    for (int k = 0; k < n; k++) {
        if (!json_is_object(d, t))
            return type_error(c, "messages", t, "an array of message objects");
        t = json_skip(d, t);
    }
    return PG_OK;
}

/* The body of a chat request: a jsonl line (`openai` false; its "id" was
 * read by the caller) or an openai body. vLLM's ChatCompletionRequest
 * names; every other key is an "unknown field" (see unknown_field). */
static int parse_chat(pctx *c, int obj, bool openai)
{
    const json_doc *d = c->d;
    cli_request *r = c->r;
    if (check_duplicate_keys(c, obj) != PG_OK)
        return PG_EINVAL;
    int n = json_size(d, obj);
    int key = obj + 1;
    bool have_messages = false, agp_true = false, cfm_true = false, logprobs = false;
    bool have_mct = false;
    int32_t top_logprobs = 0, max_completion_tokens = 0;
    for (int k = 0; k < n; k++) {
        int v = key + 1;
        int rc = PG_OK;
        if (!openai && json_str_eq(d, key, "id")) {
            /* read by the caller */
        } else if (json_str_eq(d, key, "messages")) {
            rc = chat_messages(c, v);
            have_messages = true;
        } else if (json_str_eq(d, key, "prompt") || json_str_eq(d, key, "prompt_token_ids")) {
            rc = pg_error_set(c->err, PG_EINVAL, "give either 'messages' or '%s', not both",
                              json_str_eq(d, key, "prompt") ? "prompt" : "prompt_token_ids");
        } else if (json_str_eq(d, key, "add_generation_prompt") ||
                   json_str_eq(d, key, "continue_final_message")) {
            bool agp = json_str_eq(d, key, "add_generation_prompt");
            bool b = false;
            if (!json_is_null(d, v))
                rc = get_bool(c, agp ? "add_generation_prompt" : "continue_final_message", v, &b);
            if (agp)
                agp_true = b;
            else
                cfm_true = b;
        } else if (json_str_eq(d, key, "chat_template_kwargs")) {
            rc = chat_typed(c, "chat_template_kwargs", v, json_is_object, "an object");
            if (rc == PG_OK && json_is_object(d, v)) {
                /* --reasoning-parser qwen3 reads enable_thinking with
                 * Python truthiness (qwen3_reasoning_parser.py:
                 * chat_kwargs.get("enable_thinking", True)) */
                int et = json_obj_get(d, v, "enable_thinking");
                r->thinking_disabled = et >= 0 && !py_truthy(d, et);
            }
        } else if (json_str_eq(d, key, "include_reasoning")) {
            /* vLLM's ChatCompletionRequest.include_reasoning (default
             * true): false drops the parsed reasoning from the message */
            bool b = true;
            if (!json_is_null(d, v))
                rc = get_bool(c, "include_reasoning", v, &b);
            r->exclude_reasoning = !b;
        } else if (json_str_eq(d, key, "tools") || json_str_eq(d, key, "documents")) {
            rc = chat_typed(c, json_str_eq(d, key, "tools") ? "tools" : "documents", v, json_is_array,
                            "an array");
        } else if (json_str_eq(d, key, "max_completion_tokens")) {
            if (json_is_null(d, v)) {
                r->max_tokens_null = true;
            } else {
                rc = get_i32(c, "max_completion_tokens", v, 1, INT32_MAX, &max_completion_tokens);
                have_mct = true;
            }
        } else if (json_str_eq(d, key, "logprobs")) {
            if (!json_is_null(d, v))
                rc = get_bool(c, "logprobs", v, &logprobs);
        } else if (json_str_eq(d, key, "top_logprobs")) {
            if (!json_is_null(d, v))
                rc = get_i32(c, "top_logprobs", v, 0, SAMPLING_PARAMS_MAX_LOGPROBS, &top_logprobs);
        } else if ((openai && json_str_eq(d, key, "user")) || json_str_eq(d, key, "model")) {
            if (!json_is_string(d, v) && !json_is_null(d, v))
                rc = type_error(c, json_str_eq(d, key, "model") ? "model" : "user", v, "a string");
            else if (json_str_eq(d, key, "model") && json_is_string(d, v))
                rc = read_model(c, v);
        } else if (openai && json_str_eq(d, key, "stream")) {
            bool b = false;
            if (!json_is_null(d, v))
                rc = get_bool(c, "stream", v, &b);
            if (rc == PG_OK && b)
                rc = pg_error_set(c->err, PG_EINVAL, "field 'stream': only false is supported");
        } else {
            rc = sampling_field(c, key, v, openai);
        }
        if (rc != PG_OK)
            return rc;
        key = json_skip(d, v);
    }
    if (!have_messages)
        return pg_error_set(c->err, PG_EINVAL, openai ? "body: missing 'messages'" : "missing 'messages'");
    /* vLLM's ChatCompletionRequest validators, with their messages */
    if (cfm_true && agp_true)
        return pg_error_set(c->err, PG_EINVAL,
                            "cannot set both `continue_final_message` and `add_generation_prompt` to true");
    if (top_logprobs > 0 && !logprobs)
        return pg_error_set(c->err, PG_EINVAL,
                            "when using `top_logprobs`, `logprobs` must be set to true");
    /* the chat API's logprobs: a bool; the top list is top_logprobs long */
    r->sp.logprobs = logprobs ? top_logprobs : -1;
    if (have_mct) {
        /* the newer OpenAI name wins over max_tokens */
        r->sp.max_tokens = max_completion_tokens;
        r->max_tokens_set = true;
    }
    size_t len;
    const char *raw = json_raw(d, obj, &len);
    r->chat_json = malloc(len + 1);
    if (!r->chat_json)
        return pg_error_set(c->err, PG_ENOMEM, "out of memory");
    memcpy(r->chat_json, raw, len);
    r->chat_json[len] = '\0';
    r->chat_json_len = len;
    return PG_OK;
}

/* ---- embedding requests ---------------------------------------------------- */

static int parse_embed(pctx *c, int obj, bool openai)
{
    if (json_is_object(c->d, obj) && check_duplicate_keys(c, obj) != PG_OK)
        return PG_EINVAL;
    if (!(c->r->embed = calloc(1, sizeof *c->r->embed)))
        return pg_error_set(c->err, PG_ENOMEM, "out of memory");
    free(c->r->model);
    c->r->model = NULL;
    return cli_embed_parse(c->r->embed, c->d, obj, !openai, openai, c->strict, &c->r->n_lax,
                           openai ? &c->r->model : NULL, c->err);
}

/* ---- the formats ------------------------------------------------------------- */

static int parse_jsonl(pctx *c)
{
    const json_doc *d = c->d;
    if (!json_is_object(d, 0))
        return not_object(c);
    int idv = json_obj_get(d, 0, "id");
    if (idv >= 0 && !json_is_null(d, idv)) {
        if (json_is_string(d, idv)) {
            if (read_string_id(c, "id", idv) != PG_OK)
                return PG_EINVAL;
        } else if (json_is_number(d, idv)) {
            int64_t v;
            pg_error e;
            if (json_get_int(d, idv, INT64_MIN, INT64_MAX, &v, &e) != PG_OK) {
                free(c->r->id_json); c->r->id_json = NULL;
                free(c->r->id_key); c->r->id_key = NULL;
                return type_error(c, "id", idv, "a string or an integer");
            }
            if (set_id_int(c->r, v) != PG_OK)
                return pg_error_set(c->err, PG_ENOMEM, "field 'id': out of memory");
        } else {
            free(c->r->id_json); c->r->id_json = NULL;
            free(c->r->id_key); c->r->id_key = NULL;
            return type_error(c, "id", idv, "a string or an integer");
        }
    }
    if (json_obj_get(d, 0, "messages") >= 0)
        return parse_chat(c, 0, false);
    if (json_obj_get(d, 0, "input") >= 0)
        return parse_embed(c, 0, false);
    if (check_duplicate_keys(c, 0) != PG_OK)
        return PG_EINVAL;
    int n = json_size(d, 0);
    int key = 1;
    bool have_prompt = false;
    for (int k = 0; k < n; k++) {
        int v = key + 1;
        if (json_str_eq(d, key, "id")) {
            /* done above */
        } else if (json_str_eq(d, key, "prompt") || json_str_eq(d, key, "prompt_token_ids")) {
            bool ids = json_str_eq(d, key, "prompt_token_ids");
            if (have_prompt)
                return pg_error_set(c->err, PG_EINVAL, "give either 'prompt' or 'prompt_token_ids', not both");
            have_prompt = true;
            int rc = ids ? (json_is_array(d, v) ? read_prompt(c, "prompt_token_ids", v, true)
                                                : type_error(c, "prompt_token_ids", v, "an array of token ids"))
                         : read_prompt(c, "prompt", v, false);
            if (rc != PG_OK)
                return rc;
        } else if (json_str_eq(d, key, "model")) {
            /* vLLM's request "model": the served name or a --lora adapter */
            if (!json_is_string(d, v) && !json_is_null(d, v))
                return type_error(c, "model", v, "a string");
            if (json_is_string(d, v) && read_model(c, v) != PG_OK)
                return PG_EINVAL;
        } else {
            int rc = sampling_field(c, key, v, false);
            if (rc != PG_OK)
                return rc;
        }
        key = json_skip(d, v);
    }
    if (!have_prompt)
        return pg_error_set(c->err, PG_EINVAL, "missing 'prompt' (or 'prompt_token_ids')");
    return PG_OK;
}

static int parse_openai_body(pctx *c, int body)
{
    const json_doc *d = c->d;
    if (!json_is_object(d, body))
        return type_error(c, "body", body, "an object");
    if (check_duplicate_keys(c, body) != PG_OK)
        return PG_EINVAL;
    int n = json_size(d, body);
    int key = body + 1;
    bool have_prompt = false;
    for (int k = 0; k < n; k++) {
        int v = key + 1;
        if (json_str_eq(d, key, "prompt")) {
            if (json_is_array(d, v) && json_size(d, v) > 0 && json_is_string(d, v + 1))
                return pg_error_set(c->err, PG_EINVAL,
                                    "field 'prompt': a list of prompts is not supported; write one line per prompt");
            if (read_prompt(c, "prompt", v, true) != PG_OK)
                return PG_EINVAL;
            have_prompt = true;
        } else if (json_str_eq(d, key, "model") || json_str_eq(d, key, "user")) {
            if (!json_is_string(d, v) && !json_is_null(d, v))
                return type_error(c, json_str_eq(d, key, "model") ? "model" : "user", v, "a string");
            if (json_str_eq(d, key, "model") && json_is_string(d, v) && read_model(c, v) != PG_OK)
                return PG_EINVAL;
        } else if (json_str_eq(d, key, "echo")) {
            if (!json_is_null(d, v) && get_bool(c, "echo", v, &c->r->echo) != PG_OK)
                return PG_EINVAL;
        } else if (json_str_eq(d, key, "max_tokens") && json_is_number(d, v) && json_raw_is_zero(d, v)) {
            /* max_tokens 0: only with echo (checked below), vLLM's
             * echo_without_generation */
            c->r->echo_only = true;
            c->r->max_tokens_set = true;
            c->r->sp.max_tokens = 1;
        } else if (json_str_eq(d, key, "stream")) {
            bool b = false;
            if (!json_is_null(d, v) && get_bool(c, "stream", v, &b) != PG_OK)
                return PG_EINVAL;
            if (b)
                return pg_error_set(c->err, PG_EINVAL, "field 'stream': only false is supported");
        } else {
            int rc = sampling_field(c, key, v, true);
            if (rc != PG_OK)
                return rc;
        }
        key = json_skip(d, v);
    }
    if (!have_prompt)
        return pg_error_set(c->err, PG_EINVAL, "body: missing 'prompt'");
    if (c->r->echo_only && !c->r->echo)
        return pg_error_set(c->err, PG_EINVAL, "max_tokens must be at least 1, got 0.");
    /* vLLM's CompletionRequest.to_sampling_params: with echo the prompt's
     * logprobs come back too (prompt_logprobs = logprobs) */
    if (c->r->echo && c->r->sp.logprobs >= 0 && c->r->sp.prompt_logprobs < 0)
        c->r->sp.prompt_logprobs = c->r->sp.logprobs;
    return PG_OK;
}

static int parse_openai(pctx *c)
{
    const json_doc *d = c->d;
    if (!json_is_object(d, 0))
        return not_object(c);
    int cid = json_obj_get(d, 0, "custom_id");
    if (cid < 0)
        return pg_error_set(c->err, PG_EINVAL, "missing 'custom_id'");
    if (read_string_id(c, "custom_id", cid) != PG_OK)
        return PG_EINVAL;
    if (check_duplicate_keys(c, 0) != PG_OK)
        return PG_EINVAL;
    int n = json_size(d, 0);
    int key = 1;
    int body = -1;
    bool have_url = false, chat = false, embed = false;
    for (int k = 0; k < n; k++) {
        int v = key + 1;
        if (json_str_eq(d, key, "custom_id")) {
            /* done */
        } else if (json_str_eq(d, key, "method")) {
            if (!json_is_string(d, v) || !json_str_eq(d, v, "POST"))
                return type_error(c, "method", v, "\"POST\"");
        } else if (json_str_eq(d, key, "url")) {
            chat = json_is_string(d, v) && json_str_eq(d, v, "/v1/chat/completions");
            embed = json_is_string(d, v) && json_str_eq(d, v, "/v1/embeddings");
            if (!chat && !embed && (!json_is_string(d, v) || !json_str_eq(d, v, "/v1/completions")))
                return type_error(c, "url", v,
                                  "\"/v1/completions\", \"/v1/chat/completions\" or \"/v1/embeddings\"");
            have_url = true;
        } else if (json_str_eq(d, key, "body")) {
            body = v;
        } else if (unknown_field(c, key) != PG_OK) {
            return PG_EINVAL;
        }
        key = json_skip(d, v);
    }
    if (!have_url)
        return pg_error_set(c->err, PG_EINVAL, "missing 'url'");
    if (body < 0)
        return pg_error_set(c->err, PG_EINVAL, "missing 'body'");
    if (embed)
        return parse_embed(c, body, true);
    if (chat) {
        if (!json_is_object(d, body))
            return type_error(c, "body", body, "an object");
        return parse_chat(c, body, true);
    }
    return parse_openai_body(c, body);
}

static int copy_defaults(cli_request *r, const sampling_params *def)
{
    r->sp = *def;
    r->sp.stop = NULL;
    r->sp.n_stop = 0;
    r->sp.stop_token_ids = NULL;
    r->sp.n_stop_token_ids = 0;
    if (def->n_stop) {
        r->stop = calloc(def->n_stop, sizeof *r->stop);
        if (!r->stop)
            return PG_ENOMEM;
        for (size_t k = 0; k < def->n_stop; k++) {
            r->stop[k] = strdup(def->stop[k]);
            if (!r->stop[k])
                return PG_ENOMEM;
            r->n_stop = k + 1;
        }
    }
    if (def->n_stop_token_ids) {
        r->stop_token_ids = malloc(def->n_stop_token_ids * sizeof *r->stop_token_ids);
        if (!r->stop_token_ids)
            return PG_ENOMEM;
        memcpy(r->stop_token_ids, def->stop_token_ids, def->n_stop_token_ids * sizeof *r->stop_token_ids);
        r->n_stop_token_ids = def->n_stop_token_ids;
    }
    return PG_OK;
}

int cli_request_parse(cli_request *out, const char *line, size_t len, cli_format fmt,
                      int64_t index, int64_t line_no, const sampling_params *defaults,
                      uint64_t base_seed, pg_error *err)
{
    return cli_request_parse_ex(out, line, len, fmt, index, line_no, defaults, base_seed, true, err);
}

int cli_request_parse_ex(cli_request *out, const char *line, size_t len, cli_format fmt,
                         int64_t index, int64_t line_no, const sampling_params *defaults,
                         uint64_t base_seed, bool strict, pg_error *err)
{
    memset(out, 0, sizeof *out);
    out->index = index;
    out->line = line_no;
    if (copy_defaults(out, defaults) != PG_OK)
        return pg_error_set(err, PG_ENOMEM, "out of memory");
    if (fmt != CLI_FORMAT_OPENAI && set_id_int(out, index) != PG_OK)
        return pg_error_set(err, PG_ENOMEM, "out of memory");

    pctx c = {.r = out, .err = err, .strict = strict};
    int rc = PG_OK;
    if (fmt == CLI_FORMAT_TEXT || fmt == CLI_FORMAT_AUTO) {
        if (len == 0)
            return pg_error_set(err, PG_EINVAL, "empty prompt");
        out->prompt = malloc(len + 1);
        if (!out->prompt)
            return pg_error_set(err, PG_ENOMEM, "out of memory");
        memcpy(out->prompt, line, len);
        out->prompt[len] = '\0';
        out->prompt_len = len;
    } else {
        json_doc d;
        pg_error e;
        if (json_parse(&d, line, len, "line", &e) != PG_OK) {
            /* "line: invalid json near byte 12" -> "invalid JSON: ..." */
            const char *m = strncmp(e.msg, "line: ", 6) == 0 ? e.msg + 6 : e.msg;
            return pg_error_set(err, PG_EINVAL, "invalid JSON (%s)", m);
        }
        c.d = &d;
        rc = fmt == CLI_FORMAT_OPENAI ? parse_openai(&c) : parse_jsonl(&c);
        json_doc_free(&d);
        if (rc != PG_OK)
            return rc < 0 ? rc : PG_EINVAL;
    }
    out->sp.stop = (const char *const *)out->stop;
    out->sp.n_stop = out->n_stop;
    out->sp.stop_token_ids = out->stop_token_ids;
    out->sp.n_stop_token_ids = out->n_stop_token_ids;
    out->sp.structured_kind = out->structured.kind;
    out->sp.structured = out->structured.text;
    out->sp.structured_len = out->structured.len;
    if (!c.has_seed)
        out->sp.seed = cli_request_seed(base_seed, index);
    pg_error e;
    if (sampling_params_validate(&out->sp, &e) != PG_OK)
        return pg_error_set(err, PG_EINVAL, "%s", e.msg);
    /* vLLM's SamplingParams._verify_greedy_sampling (sampling_params.py at
     * 00388f65): greedy (temperature < _SAMPLING_EPS = 1e-5) with n > 1 is
     * refused, with its message */
    if (out->sp.temperature < 1e-5f && out->sp.n > 1 && !out->sp.use_beam_search)
        return pg_error_set(err, PG_EINVAL, "n must be 1 when using greedy sampling, got %d.", (int)out->sp.n);
    return PG_OK;
}
