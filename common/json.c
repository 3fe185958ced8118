/* json: checked helpers over jsmn (see json.h). This file holds jsmn's
 * implementation; every other user includes the header form. */
#define PG_JSON_IMPLEMENTATION
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Length of a valid UTF-8 sequence starting at s (max n bytes), 0 if
 * invalid: RFC 3629 (no overlongs, no surrogates, nothing above U+10FFFF),
 * the definition serde_json (Hugging Face tokenizers) and Python's utf-8
 * codec (vLLM, transformers) hold JSON text to. */
static size_t utf8_valid_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t need;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) { need = 2; min = 0x80; }
    else if (c >= 0xE0 && c <= 0xEF) { need = 3; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 4; min = 0x10000; }
    else return 0;
    if (need > n) return 0;
    unsigned cp = c & (0x7F >> need);
    for (size_t k = 1; k < need; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return 0;
    return need;
}

/* ---- grammar checks jsmn leaves out --------------------------------------
 * jsmn (even with JSMN_STRICT) accepts texts that are not JSON: a missing
 * ':' or ',' ({"a" "b"}, {"a":1 "b":2}), trailing or doubled commas ([1,],
 * [1,,2]), [1:2], bad literals (tru, 01, 1.e5, --1) and raw control bytes
 * in strings. Accepting them would make object iteration (key, value, key,
 * value ...) read the wrong tokens, so one linear pass over the tokens,
 * using the parent links, checks what sits between sibling tokens and the
 * shape of every token. */

static size_t ext_start(const jsmntok_t *t) { return (size_t)t->start - (t->type == JSMN_STRING ? 1 : 0); }
static size_t ext_end(const jsmntok_t *t) { return (size_t)t->end + (t->type == JSMN_STRING ? 1 : 0); }

/* src[a, b) is whitespace with exactly one `sep` in it (sep 0: none). */
static bool gap_ok(const char *src, size_t a, size_t b, char sep)
{
    int seps = 0;
    for (size_t k = a; k < b; k++) {
        if (src[k] == sep && sep)
            seps++;
        else if (!is_ws(src[k]))
            return false;
    }
    return seps == (sep ? 1 : 0);
}

static bool digits(const char *s, size_t n, size_t *k)
{
    size_t k0 = *k;
    while (*k < n && s[*k] >= '0' && s[*k] <= '9')
        (*k)++;
    return *k > k0;
}

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? or true/false/null */
static bool literal_ok(const char *s, size_t n)
{
    if ((n == 4 && memcmp(s, "true", 4) == 0) || (n == 5 && memcmp(s, "false", 5) == 0) ||
        (n == 4 && memcmp(s, "null", 4) == 0))
        return true;
    size_t k = 0;
    if (k < n && s[k] == '-')
        k++;
    if (k < n && s[k] == '0')
        k++;
    else if (!digits(s, n, &k))
        return false;
    if (k < n && s[k] == '.') {
        k++;
        if (!digits(s, n, &k))
            return false;
    }
    if (k < n && (s[k] == 'e' || s[k] == 'E')) {
        k++;
        if (k < n && (s[k] == '+' || s[k] == '-'))
            k++;
        if (!digits(s, n, &k))
            return false;
    }
    return k == n;
}

/* Returns the byte offset of the first problem, or -1 when the tokens are
 * JSON; *why is left alone unless the problem has a more precise name than
 * "invalid json". `last[i]`: for a container or key, the byte after its
 * latest child. Strings must be valid UTF-8 (RFC 8259 section 8.1; serde_json
 * and Python refuse anything else): checked here, where every file and
 * request line is parsed, so no consumer ever sees half a character. */
static long grammar_check(const json_doc *d, size_t *last, const char **why)
{
    const jsmntok_t *tok = d->tok;
    const char *src = d->src;
    for (int i = 0; i < d->ntok; i++) {
        const jsmntok_t *t = &tok[i];
        int p = t->parent;
        if (t->type == JSMN_PRIMITIVE) {
            if (t->size != 0 || !literal_ok(src + t->start, (size_t)(t->end - t->start)))
                return t->start;
        } else if (t->type == JSMN_STRING) {
            bool key = p >= 0 && tok[p].type == JSMN_OBJECT;
            if (t->size != (key ? 1 : 0))
                return t->start;
            for (int k = t->start; k < t->end;) {
                unsigned char c = (unsigned char)src[k];
                if (c < 0x20) {
                    *why = "control byte in json string";
                    return k;
                }
                size_t adv = c < 0x80 ? 1 : utf8_valid_len((const unsigned char *)src + k, (size_t)(t->end - k));
                if (adv == 0) {
                    *why = "invalid utf-8 in json string";
                    return k;
                }
                k += (int)adv;
            }
        }
        if (t->type == JSMN_OBJECT || t->type == JSMN_ARRAY || t->type == JSMN_STRING)
            last[i] = (size_t)t->start + (t->type == JSMN_STRING ? 0 : 1);
        if (p < 0) {
            if (i != 0)
                return t->start;
            continue;
        }
        if (p >= i)
            return t->start;
        char sep;
        if (tok[p].type == JSMN_STRING)
            sep = ':'; /* a value after its key */
        else if (tok[p].type == JSMN_OBJECT || tok[p].type == JSMN_ARRAY)
            sep = last[p] == (size_t)tok[p].start + 1 ? 0 : ',';
        else
            return t->start; /* a child of a primitive: [1:2] */
        size_t from = tok[p].type == JSMN_STRING ? ext_end(&tok[p]) : last[p];
        if (!gap_ok(src, from, ext_start(t), sep))
            return (long)from;
        last[p] = ext_end(t);
        if (tok[p].type == JSMN_STRING) /* the object resumes after the value */
            last[tok[p].parent] = ext_end(t);
    }
    for (int i = 0; i < d->ntok; i++) {
        const jsmntok_t *t = &tok[i];
        if ((t->type == JSMN_OBJECT || t->type == JSMN_ARRAY) && !gap_ok(src, last[i], (size_t)t->end - 1, 0))
            return (long)last[i];
    }
    return -1;
}

/* The offset of the first '[' or '{' (outside strings) that opens a
 * container deeper than JSON_MAX_DEPTH, or -1. Linear, run before jsmn
 * (see JSON_MAX_DEPTH); unbalanced or malformed text is jsmn's to refuse. */
static long too_deep_at(const char *src, size_t len)
{
    int depth = 0;
    bool in_str = false;
    for (size_t k = 0; k < len; k++) {
        char c = src[k];
        if (in_str) {
            if (c == '\\')
                k++;
            else if (c == '"')
                in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '[' || c == '{') {
            if (++depth > JSON_MAX_DEPTH)
                return (long)k;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return -1;
}

int json_parse(json_doc *doc, const char *src, size_t len, const char *label, pg_error *err)
{
    memset(doc, 0, sizeof *doc);
    if (len > (size_t)INT32_MAX)
        return pg_error_set(err, PG_EFORMAT, "%s: json text of %zu bytes is too large", label, len);
    long deep = too_deep_at(src, len);
    if (deep >= 0)
        return pg_error_set(err, PG_EFORMAT, "%s: json nested more than %d deep at byte %ld",
                            label, JSON_MAX_DEPTH, deep);
    jsmn_parser p;
    jsmn_init(&p);
    int n = jsmn_parse(&p, src, len, NULL, 0);
    if (n < 0) {
        const char *why = n == JSMN_ERROR_PART ? "truncated json"
                        : n == JSMN_ERROR_INVAL ? "invalid json" : "json parse error";
        return pg_error_set(err, PG_EFORMAT, "%s: %s near byte %u", label, why, p.pos);
    }
    if (n == 0)
        return pg_error_set(err, PG_EFORMAT, "%s: empty json text", label);
    jsmntok_t *tok = malloc((size_t)n * sizeof *tok);
    if (!tok)
        return pg_error_set(err, PG_ENOMEM, "%s: out of memory for %d json tokens", label, n);
    jsmn_init(&p);
    int n2 = jsmn_parse(&p, src, len, tok, (unsigned)n);
    if (n2 != n) {
        free(tok);
        return pg_error_set(err, PG_EFORMAT, "%s: invalid json near byte %u", label, p.pos);
    }
    doc->src = src;
    doc->len = len;
    doc->tok = tok;
    doc->ntok = n;
    size_t *last = malloc((size_t)n * sizeof *last);
    if (!last) {
        json_doc_free(doc);
        return pg_error_set(err, PG_ENOMEM, "%s: out of memory for %d json tokens", label, n);
    }
    const char *why = NULL;
    long bad = grammar_check(doc, last, &why);
    free(last);
    if (bad >= 0) {
        json_doc_free(doc);
        if (why)
            return pg_error_set(err, PG_EFORMAT, "%s: %s at byte %ld", label, why, bad);
        return pg_error_set(err, PG_EFORMAT, "%s: invalid json near byte %ld", label, bad);
    }
    /* Exactly one root value, and only whitespace after it. */
    size_t end = (size_t)tok[0].end + (tok[0].type == JSMN_STRING ? 1 : 0);
    if (json_skip(doc, 0) != n) {
        json_doc_free(doc);
        return pg_error_set(err, PG_EFORMAT, "%s: more than one json value", label);
    }
    for (size_t k = end; k < len; k++) {
        if (!is_ws(src[k]) && src[k] != '\0') {
            json_doc_free(doc);
            return pg_error_set(err, PG_EFORMAT, "%s: trailing bytes after json value at byte %zu", label, k);
        }
    }
    return PG_OK;
}

void json_doc_free(json_doc *doc)
{
    if (!doc)
        return;
    free(doc->tok);
    memset(doc, 0, sizeof *doc);
}

int json_skip(const json_doc *d, int i)
{
    int end = d->tok[i].end;
    int j = i + 1;
    while (j < d->ntok && d->tok[j].start < end)
        j++;
    return j;
}

bool json_is_object(const json_doc *d, int i) { return i >= 0 && i < d->ntok && d->tok[i].type == JSMN_OBJECT; }
bool json_is_array(const json_doc *d, int i) { return i >= 0 && i < d->ntok && d->tok[i].type == JSMN_ARRAY; }
bool json_is_string(const json_doc *d, int i) { return i >= 0 && i < d->ntok && d->tok[i].type == JSMN_STRING; }

static bool prim_is(const json_doc *d, int i, const char *word)
{
    if (i < 0 || i >= d->ntok || d->tok[i].type != JSMN_PRIMITIVE)
        return false;
    size_t n = (size_t)(d->tok[i].end - d->tok[i].start);
    return n == strlen(word) && memcmp(d->src + d->tok[i].start, word, n) == 0;
}

bool json_is_null(const json_doc *d, int i) { return prim_is(d, i, "null"); }
bool json_is_bool(const json_doc *d, int i) { return prim_is(d, i, "true") || prim_is(d, i, "false"); }

bool json_is_number(const json_doc *d, int i)
{
    if (i < 0 || i >= d->ntok || d->tok[i].type != JSMN_PRIMITIVE)
        return false;
    char c = d->src[d->tok[i].start];
    return c == '-' || (c >= '0' && c <= '9');
}

int json_size(const json_doc *d, int i) { return (i >= 0 && i < d->ntok) ? d->tok[i].size : 0; }

int json_obj_get(const json_doc *d, int obj, const char *key)
{
    if (!json_is_object(d, obj))
        return -1;
    int n = d->tok[obj].size;
    int j = obj + 1;
    for (int k = 0; k < n && j < d->ntok; k++) {
        int v = j + 1;
        if (v >= d->ntok)
            return -1;
        if (json_str_eq(d, j, key))
            return v;
        j = json_skip(d, v);
    }
    return -1;
}

int json_arr_at(const json_doc *d, int arr, int k)
{
    if (!json_is_array(d, arr) || k < 0 || k >= d->tok[arr].size)
        return -1;
    int j = arr + 1;
    for (int m = 0; m < k; m++)
        j = json_skip(d, j);
    return j < d->ntok ? j : -1;
}

const char *json_raw(const json_doc *d, int i, size_t *len)
{
    *len = (size_t)(d->tok[i].end - d->tok[i].start);
    return d->src + d->tok[i].start;
}

bool json_str_eq(const json_doc *d, int i, const char *s)
{
    if (!json_is_string(d, i))
        return false;
    size_t n = (size_t)(d->tok[i].end - d->tok[i].start);
    return n == strlen(s) && memcmp(d->src + d->tok[i].start, s, n) == 0;
}

static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p[k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F)); return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Unescapes raw[0, n) into out (which has room for n + 1 bytes: an escape
 * never expands). Returns the length or -1 with *bad_at set. */
static long unescape(const char *raw, size_t n, char *out, size_t *bad_at)
{
    size_t o = 0;
    for (size_t k = 0; k < n; k++) {
        char c = raw[k];
        if (c != '\\') { out[o++] = c; continue; }
        if (++k >= n) { *bad_at = k; return -1; }
        switch (raw[k]) {
        case '"': out[o++] = '"'; break;
        case '\\': out[o++] = '\\'; break;
        case '/': out[o++] = '/'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case 'u': {
            unsigned cp;
            /* the four hex digits sit at k+1 .. k+4 */
            if (k + 4 >= n || hex4(raw + k + 1, &cp)) { *bad_at = k; return -1; }
            k += 4;
            if (cp >= 0xD800 && cp < 0xDC00) {
                /* a high surrogate wants "\uDC00".."\uDFFF" at k+1 .. k+6 */
                unsigned lo;
                if (k + 6 < n && raw[k + 1] == '\\' && raw[k + 2] == 'u'
                    && hex4(raw + k + 3, &lo) == 0 && lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    k += 6;
                } else {
                    cp = 0xFFFD;
                }
            } else if (cp >= 0xDC00 && cp < 0xE000) {
                cp = 0xFFFD;
            }
            o += put_utf8(out + o, cp);
            break;
        }
        default: *bad_at = k; return -1;
        }
    }
    out[o] = '\0';
    return (long)o;
}

int json_get_string(const json_doc *d, int i, char **out, size_t *len, pg_error *err)
{
    *out = NULL;
    if (!json_is_string(d, i))
        return pg_error_set(err, PG_EINVAL, "expected a string at byte %d", i >= 0 && i < d->ntok ? d->tok[i].start : -1);
    size_t n;
    const char *raw = json_raw(d, i, &n);
    char *buf = malloc(n + 1);
    if (!buf)
        return pg_error_set(err, PG_ENOMEM, "out of memory for a json string of %zu bytes", n);
    size_t bad = 0;
    long m = unescape(raw, n, buf, &bad);
    if (m < 0) {
        free(buf);
        return pg_error_set(err, PG_EFORMAT, "bad escape in json string at byte %zu", (size_t)d->tok[i].start + bad);
    }
    *out = buf;
    if (len)
        *len = (size_t)m;
    return PG_OK;
}

int json_get_string_buf(const json_doc *d, int i, char *buf, size_t cap, size_t *len, pg_error *err)
{
    char *s;
    size_t n;
    int rc = json_get_string(d, i, &s, &n, err);
    if (rc)
        return rc;
    if (n + 1 > cap) {
        free(s);
        return pg_error_set(err, PG_EINVAL, "string of %zu bytes is longer than %zu", n, cap - 1);
    }
    memcpy(buf, s, n + 1);
    free(s);
    if (len)
        *len = n;
    return PG_OK;
}

/* Copies a primitive token into a NUL-terminated scratch buffer. */
static int prim_text(const json_doc *d, int i, char *buf, size_t cap)
{
    if (!json_is_number(d, i))
        return -1;
    size_t n;
    const char *raw = json_raw(d, i, &n);
    if (n == 0 || n >= cap)
        return -1;
    memcpy(buf, raw, n);
    buf[n] = '\0';
    return 0;
}

int json_get_int(const json_doc *d, int i, int64_t lo, int64_t hi, int64_t *out, pg_error *err)
{
    char buf[64];
    if (prim_text(d, i, buf, sizeof buf))
        return pg_error_set(err, PG_EINVAL, "expected an integer");
    for (const char *p = buf; *p; p++)
        if (*p == '.' || *p == 'e' || *p == 'E')
            return pg_error_set(err, PG_EINVAL, "expected an integer, got %s", buf);
    errno = 0;
    char *end;
    long long v = strtoll(buf, &end, 10);
    if (errno || *end != '\0')
        return pg_error_set(err, PG_EINVAL, "expected an integer, got %s", buf);
    if (v < lo || v > hi)
        return pg_error_set(err, PG_EINVAL, "integer %s outside [%lld, %lld]", buf, (long long)lo, (long long)hi);
    *out = v;
    return PG_OK;
}

int json_get_double(const json_doc *d, int i, double *out, pg_error *err)
{
    char buf[128];
    if (prim_text(d, i, buf, sizeof buf))
        return pg_error_set(err, PG_EINVAL, "expected a number");
    errno = 0;
    char *end;
    double v = strtod(buf, &end);
    if (*end != '\0' || !isfinite(v))
        return pg_error_set(err, PG_EINVAL, "expected a finite number, got %s", buf);
    *out = v;
    return PG_OK;
}

int json_get_bool(const json_doc *d, int i, bool *out, pg_error *err)
{
    if (prim_is(d, i, "true")) { *out = true; return PG_OK; }
    if (prim_is(d, i, "false")) { *out = false; return PG_OK; }
    return pg_error_set(err, PG_EINVAL, "expected true or false");
}

/* ---- writing ------------------------------------------------------------ */

static bool buf_reserve(json_buf *b, size_t extra)
{
    if (b->oom)
        return false;
    if (b->len + extra + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->data = p;
    b->cap = cap;
    return true;
}

void json_buf_put(json_buf *b, const char *s, size_t len)
{
    if (!buf_reserve(b, len))
        return;
    memcpy(b->data + b->len, s, len);
    b->len += len;
    b->data[b->len] = '\0';
}

void json_buf_puts(json_buf *b, const char *s) { json_buf_put(b, s, strlen(s)); }

void json_buf_printf(json_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !buf_reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void json_buf_string(json_buf *b, const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    json_buf_put(b, "\"", 1);
    size_t run = 0; /* start of a run of bytes copied verbatim */
    size_t k = 0;
    while (k < len) {
        unsigned c = u[k];
        const char *esc = NULL;
        char tmp[8];
        size_t adv = 1;
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20 || c == 0x7F) { snprintf(tmp, sizeof tmp, "\\u%04x", c); esc = tmp; }
        else if (c >= 0x80) {
            adv = utf8_valid_len(u + k, len - k);
            if (adv == 0) { esc = "\\ufffd"; adv = 1; }
        }
        if (esc) {
            json_buf_put(b, s + run, k - run);
            json_buf_puts(b, esc);
            run = k + adv;
        }
        k += adv;
    }
    json_buf_put(b, s + run, len - run);
    json_buf_put(b, "\"", 1);
}

void json_buf_free(json_buf *b)
{
    if (!b)
        return;
    free(b->data);
    memset(b, 0, sizeof *b);
}
