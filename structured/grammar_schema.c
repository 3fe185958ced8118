/* grammar_schema: a JSON schema (subset) -> NFA, compact JSON (no
 * whitespace outside strings).
 *
 * Supported: type (one or a list) null/boolean/integer/number/string/array/
 * object; enum, const (written compactly, keys in the given order, strings
 * as json_buf_string escapes them); anyOf and oneOf (both as alternation:
 * oneOf's exclusivity is not enforced); $ref to "#" or a JSON pointer into
 * the document ("#/$defs/x", "#/definitions/x", ...), inlined, or a rule
 * call when it recurses; string minLength/maxLength (code points), pattern
 * (the whole string must match: implicit ^...$, as xgrammar), format
 * date/time/date-time/uuid; integer minimum/maximum/exclusiveMinimum/
 * exclusiveMaximum (a digit-by-digit range automaton; refused on number);
 * integer and number digit runs bounded as llama.cpp bounds them (at most
 * 16 integral digits, 16 fraction digits, a 16-digit exponent; see
 * GS_NUM_DIGITS), also on the open side of a one-sided range;
 * array items, prefixItems (tuples; items false closes them),
 * minItems/maxItems; object
 * properties (emitted in the listed order, the required ones always, the
 * others optionally), required, additionalProperties false/true (ignored
 * when properties are listed: only they are emitted, as xgrammar's strict
 * mode) or a schema (objects without properties only). A schema without
 * type/enum/const/anyOf/$ref and without type-specific keywords, or `true`,
 * means any JSON value. Annotations are ignored (title, description,
 * examples, default, $schema, $id, $comment, deprecated, readOnly,
 * writeOnly, $defs/definitions as containers); any other keyword is an
 * error naming it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"
#include "json.h"

#define GS_MAX_NEST 64  /* schema nesting while emitting (inlined $refs count) */

typedef struct sctx {
    gnfa *a;
    json_doc d;
    int32_t obj_rule, arr_rule;        /* generic object / array rules, -1 until needed */
    int32_t ref_node[GS_MAX_NEST * 4], ref_rule[GS_MAX_NEST * 4];
    int32_t n_refs, n_done;            /* rules [n_done, n_refs) still need their bodies */
    int32_t inl[GS_MAX_NEST];          /* $ref targets being inlined */
    int32_t n_inl;
    int json_depth;                    /* containers open around what is emitted now */
    int depth;
} sctx;

static const char *const annotations[] = {
    "title", "description", "examples", "default", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "$defs", "definitions",
};
static const char *const keywords[] = {
    "type", "enum", "const", "anyOf", "oneOf", "$ref", "minLength", "maxLength", "pattern",
    "format", "items", "minItems", "maxItems", "properties", "required", "additionalProperties",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "prefixItems",
};

static void emit_value(sctx *c, int node, int32_t from, int32_t to);
static void emit_any(sctx *c, int32_t from, int32_t to);

/* A JSON true / false literal (json_str_eq only compares strings). */
static bool is_bool_lit(const json_doc *d, int i, bool want)
{
    bool b;
    return json_is_bool(d, i) && json_get_bool(d, i, &b, NULL) == PG_OK && b == want;
}

static int key_text(const sctx *c, int key, char *buf, size_t cap)
{
    size_t n = 0;
    const char *raw = json_raw(&c->d, key, &n);
    size_t k = n < cap - 1 ? n : cap - 1;
    memcpy(buf, raw, k);
    buf[k] = 0;
    return (int)k;
}

/* ---- generic JSON --------------------------------------------------------- */

static void emit_string_any(sctx *c, int32_t from, int32_t to)
{
    gnfa *a = c->a;
    int32_t s = gnfa_state(a), e = gnfa_state(a);
    gnfa_bytes(a, from, s, '"', '"');
    gjson_string_char(a, s, s);
    gnfa_eps(a, s, e);
    gnfa_bytes(a, e, to, '"', '"');
}

/* ---- numbers: bounded digits ----------------------------------------------
 * A number's digit runs are bounded, as llama.cpp's json_schema_to_grammar
 * bounds them (common/json-schema-to-grammar.cpp, PRIMITIVE_RULES:
 * integral-part "[0] | [1-9] [0-9]{0,15}", decimal-part "[0-9]{1,16}", and
 * the exponent written as an integral-part): an integral part of at most 16
 * digits, a fraction of at most 16, an exponent of at most 16 without
 * leading zeros. A double holds about 16 significant digits, so nothing a
 * reader can keep is lost, and a model that keeps choosing digits
 * ("age":-5000000000000000000...) must end the number within 16 of them
 * instead of running to max_tokens with text that is not JSON (issue 23).
 * xgrammar leaves the runs unbounded. */
#define GS_NUM_DIGITS 16
#define GS_INT_RE "(0|[1-9][0-9]{0,15})" /* at most GS_NUM_DIGITS digits */

static void emit_integer(sctx *c, int32_t from, int32_t to)
{
    static const char re[] = "-?" GS_INT_RE;
    gre_emit(c->a, from, to, re, sizeof re - 1, GRE_RAW, "integer");
}

/* ---- integer ranges ---------------------------------------------------------- */

/* Same-length decimal strings x <= y (L digits, from position pos on):
 * every string between them, digit by digit. */
static void emit_digits_between(gnfa *a, int32_t from, int32_t to, const char *x, const char *y,
                                int pos, int L)
{
    if (a->status)
        return;
    if (pos == L) {
        gnfa_eps(a, from, to);
        return;
    }
    /* x's rest all '0' and y's all '9': any L - pos digits, a chain (without
     * it the three-way split below costs 3^(L - pos) states) */
    int k = pos;
    while (k < L && x[k] == '0' && y[k] == '9')
        k++;
    if (k == L) {
        int32_t cur = from;
        for (int j = pos; j < L && !a->status; j++) {
            int32_t nxt = j + 1 == L ? to : gnfa_state(a);
            gnfa_bytes(a, cur, nxt, '0', '9');
            cur = nxt;
        }
        return;
    }
    if (x[pos] == y[pos]) {
        int32_t nxt = pos + 1 == L ? to : gnfa_state(a);
        gnfa_bytes(a, from, nxt, (uint8_t)x[pos], (uint8_t)x[pos]);
        if (pos + 1 < L)
            emit_digits_between(a, nxt, to, x, y, pos + 1, L);
        return;
    }
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    /* x[pos], then the rest >= x's rest */
    int32_t s1 = pos + 1 == L ? to : gnfa_state(a);
    gnfa_bytes(a, from, s1, (uint8_t)x[pos], (uint8_t)x[pos]);
    if (pos + 1 < L)
        emit_digits_between(a, s1, to, x, nines, pos + 1, L);
    /* strictly between: any rest */
    if (y[pos] - x[pos] > 1) {
        int32_t s2 = pos + 1 == L ? to : gnfa_state(a);
        gnfa_bytes(a, from, s2, (uint8_t)(x[pos] + 1), (uint8_t)(y[pos] - 1));
        if (pos + 1 < L)
            emit_digits_between(a, s2, to, zeros, nines, pos + 1, L);
    }
    /* y[pos], then the rest <= y's rest */
    int32_t s3 = pos + 1 == L ? to : gnfa_state(a);
    gnfa_bytes(a, from, s3, (uint8_t)y[pos], (uint8_t)y[pos]);
    if (pos + 1 < L)
        emit_digits_between(a, s3, to, zeros, y, pos + 1, L);
}

/* Naturals in [lo, hi] (0 <= lo <= hi) written without leading zeros. */
static void emit_naturals(gnfa *a, int32_t from, int32_t to, int64_t lo, int64_t hi)
{
    char xs[24], ys[24];
    int llo = snprintf(xs, sizeof xs, "%lld", (long long)lo);
    int lhi = snprintf(ys, sizeof ys, "%lld", (long long)hi);
    for (int L = llo; L <= lhi && !a->status; L++) {
        char x[24], y[24];
        if (L == llo) {
            memcpy(x, xs, (size_t)L + 1);
        } else {
            x[0] = '1';
            memset(x + 1, '0', (size_t)L - 1);
        }
        if (L == lhi)
            memcpy(y, ys, (size_t)L + 1);
        else
            memset(y, '9', (size_t)L);
        x[L] = y[L] = 0;
        emit_digits_between(a, from, to, x, y, 0, L);
    }
}

/* Where the unbounded side of an integer range stops: the largest natural
 * of GS_NUM_DIGITS digits, or of as many digits as the bound on the other
 * side when it is longer (|bound| < 1e18, so at most 18 nines). As
 * llama.cpp's build_min_max_int (decimals_left = 16): minimum 0 alone is
 * 0 .. 9999999999999999, never a run of digits to max_tokens. */
static int64_t digits_cap(int64_t other)
{
    int n = snprintf(NULL, 0, "%lld", (long long)other);
    if (n < GS_NUM_DIGITS)
        n = GS_NUM_DIGITS;
    int64_t r = 0;
    for (int k = 0; k < n; k++)
        r = r * 10 + 9;
    return r;
}

/* A bound as an integer: ceil for a lower one, floor for an upper one;
 * an exclusive bound moves one past an integral value. */
static bool int_bound(sctx *c, int node, const char *key, bool lower, bool exclusive, int64_t *out)
{
    int v = json_obj_get(&c->d, node, key);
    if (v < 0)
        return false;
    double x;
    if (json_get_double(&c->d, v, &x, NULL) != PG_OK || !(x > -1e18 && x < 1e18)) {
        gnfa_fail(c->a, PG_EINVAL, "json schema: %s: expected a number of magnitude below 1e18", key);
        return false;
    }
    int64_t i = lower ? (int64_t)ceil(x) : (int64_t)floor(x);
    if (exclusive && (double)i == x)
        i += lower ? 1 : -1;
    *out = i;
    return true;
}

static void emit_integer_range(sctx *c, int node, int32_t from, int32_t to)
{
    gnfa *a = c->a;
    int64_t lo = INT64_MIN, hi = INT64_MAX, t;
    if (int_bound(c, node, "minimum", true, false, &t) && t > lo)
        lo = t;
    if (int_bound(c, node, "exclusiveMinimum", true, true, &t) && t > lo)
        lo = t;
    if (int_bound(c, node, "maximum", false, false, &t) && t < hi)
        hi = t;
    if (int_bound(c, node, "exclusiveMaximum", false, true, &t) && t < hi)
        hi = t;
    if (a->status)
        return;
    /* an open side ends after GS_NUM_DIGITS digits (see digits_cap) */
    if (hi == INT64_MAX)
        hi = digits_cap(lo > 0 ? lo : 0);
    if (lo == INT64_MIN)
        lo = -digits_cap(hi < 0 ? -hi : 0);
    if (lo > hi) {
        gnfa_fail(a, PG_EINVAL, "json schema: integer range [%lld, %lld] is empty (empty language)",
                  (long long)lo, (long long)hi);
        return;
    }
    /* the non-negative part [max(lo, 0), hi] */
    if (hi >= 0)
        emit_naturals(a, from, to, lo > 0 ? lo : 0, hi);
    /* the negative part: '-' then naturals in [max(1, -hi), -lo] (no "-0") */
    if (lo < 0) {
        int32_t m = gnfa_state(a);
        gnfa_bytes(a, from, m, '-', '-');
        emit_naturals(a, m, to, hi < 0 ? -hi : 1, -lo);
    }
}

static void emit_number(sctx *c, int32_t from, int32_t to)
{
    static const char re[] = "-?" GS_INT_RE "(\\.[0-9]{1,16})?([eE][+-]?" GS_INT_RE ")?";
    gre_emit(c->a, from, to, re, sizeof re - 1, GRE_RAW, "number");
}

/* '{' ( '}' | KEY ':' V ( ',' KEY ':' V )* '}' ), V a given schema node or
 * (node < 0) any value */
static void emit_map(sctx *c, int node, int32_t from, int32_t to)
{
    gnfa *a = c->a;
    int32_t open = gnfa_state(a), mem = gnfa_state(a), colon = gnfa_state(a), val = gnfa_state(a),
            after = gnfa_state(a);
    gnfa_bytes(a, from, open, '{', '{');
    gnfa_bytes(a, open, to, '}', '}');
    gnfa_eps(a, open, mem);
    emit_string_any(c, mem, colon);
    gnfa_bytes(a, colon, val, ':', ':');
    c->json_depth++;
    if (node < 0)
        emit_any(c, val, after);
    else
        emit_value(c, node, val, after);
    c->json_depth--;
    gnfa_bytes(a, after, mem, ',', ',');
    /* ',' must be followed by a member: mem -> KEY is the only way on */
    gnfa_bytes(a, after, to, '}', '}');
}

static void emit_list(sctx *c, int32_t from, int32_t to)
{
    gnfa *a = c->a;
    int32_t open = gnfa_state(a), item = gnfa_state(a), after = gnfa_state(a);
    gnfa_bytes(a, from, open, '[', '[');
    gnfa_bytes(a, open, to, ']', ']');
    gnfa_eps(a, open, item);
    c->json_depth++;
    emit_any(c, item, after);
    c->json_depth--;
    gnfa_bytes(a, after, item, ',', ',');
    gnfa_bytes(a, after, to, ']', ']');
}

static int32_t generic_rule(sctx *c, bool obj)
{
    int32_t *r = obj ? &c->obj_rule : &c->arr_rule;
    if (*r < 0) {
        *r = gnfa_rule(c->a);
        if (*r < 0)
            return -1;
        int32_t s = c->a->rule_start[*r], e = c->a->rule_accept[*r];
        int save = c->json_depth;
        c->json_depth = c->a->any_inline; /* inside the rules: calls */
        if (obj)
            emit_map(c, -1, s, e);
        else
            emit_list(c, s, e);
        c->json_depth = save;
    }
    return *r;
}

/* Any object / array: written inline above JSON nesting depth any_inline
 * (see GRAMMAR_MAX_ANY_INLINE; the depth is absolute, so every alternative
 * switches to calls at the same depth), else a call of the generic rule. */
static void emit_any_container(sctx *c, bool obj, int32_t from, int32_t to)
{
    if (c->json_depth < c->a->any_inline) {
        if (obj)
            emit_map(c, -1, from, to);
        else
            emit_list(c, from, to);
        return;
    }
    int32_t r = generic_rule(c, obj);
    if (r >= 0)
        gnfa_call(c->a, from, to, r);
}

static void emit_any(sctx *c, int32_t from, int32_t to)
{
    gnfa *a = c->a;
    if (a->status)
        return;
    emit_string_any(c, from, to);
    emit_number(c, from, to);
    gnfa_literal(a, from, to, "true", 4);
    gnfa_literal(a, from, to, "false", 5);
    gnfa_literal(a, from, to, "null", 4);
    emit_any_container(c, true, from, to);
    emit_any_container(c, false, from, to);
}

/* ---- literals (enum, const) ----------------------------------------------- */

static int serialize(const json_doc *d, int i, json_buf *b)
{
    if (json_is_string(d, i)) {
        char *s = NULL;
        size_t n = 0;
        if (json_get_string(d, i, &s, &n, NULL) != PG_OK)
            return PG_ENOMEM;
        json_buf_string(b, s, n);
        free(s);
        return PG_OK;
    }
    if (json_is_object(d, i) || json_is_array(d, i)) {
        bool obj = json_is_object(d, i);
        json_buf_put(b, obj ? "{" : "[", 1);
        int n = json_size(d, i), j = i + 1;
        for (int k = 0; k < n; k++) {
            if (k)
                json_buf_put(b, ",", 1);
            if (obj) {
                if (serialize(d, j, b))
                    return PG_ENOMEM;
                json_buf_put(b, ":", 1);
                j++;
            }
            if (serialize(d, j, b))
                return PG_ENOMEM;
            j = json_skip(d, j);
        }
        json_buf_put(b, obj ? "}" : "]", 1);
        return PG_OK;
    }
    size_t n = 0;
    const char *raw = json_raw(d, i, &n);
    json_buf_put(b, raw, n);
    return PG_OK;
}

static void emit_literal(sctx *c, int node, int32_t from, int32_t to)
{
    json_buf b = {0};
    if (serialize(&c->d, node, &b) != PG_OK || b.oom)
        gnfa_fail(c->a, PG_ENOMEM, "json schema: out of memory");
    else
        gnfa_literal(c->a, from, to, b.data, b.len);
    json_buf_free(&b);
}

/* ---- $ref -------------------------------------------------------------------- */

/* The node a local JSON pointer names, or -1 (error set). */
static int resolve_ref(sctx *c, int ref)
{
    char *s = NULL;
    size_t n = 0;
    if (!json_is_string(&c->d, ref) || json_get_string(&c->d, ref, &s, &n, NULL) != PG_OK) {
        gnfa_fail(c->a, PG_EINVAL, "json schema: $ref: expected a string");
        return -1;
    }
    int node = 0;
    if (n == 0 || s[0] != '#' || (n > 1 && s[1] != '/')) {
        gnfa_fail(c->a, PG_EUNSUPPORTED, "json schema: unsupported $ref '%.80s' (only local '#/...' pointers)", s);
        free(s);
        return -1;
    }
    size_t i = 1;
    while (i < n && node >= 0) {
        i++; /* '/' */
        char seg[256];
        size_t k = 0;
        while (i < n && s[i] != '/' && k < sizeof seg - 1) {
            if (s[i] == '~' && i + 1 < n && (s[i + 1] == '0' || s[i + 1] == '1')) {
                seg[k++] = s[i + 1] == '0' ? '~' : '/';
                i += 2;
            } else {
                seg[k++] = s[i++];
            }
        }
        seg[k] = 0;
        if (json_is_object(&c->d, node)) {
            node = json_obj_get(&c->d, node, seg);
        } else if (json_is_array(&c->d, node)) {
            char *end;
            long idx = strtol(seg, &end, 10);
            node = (*end || k == 0 || idx < 0 || idx >= json_size(&c->d, node))
                       ? -1 : json_arr_at(&c->d, node, (int)idx);
        } else {
            node = -1;
        }
    }
    if (node < 0)
        gnfa_fail(c->a, PG_EINVAL, "json schema: $ref '%.80s' points to nothing", s);
    free(s);
    return node;
}

static void emit_ref(sctx *c, int target, int32_t from, int32_t to)
{
    for (int32_t k = 0; k < c->n_inl; k++)
        if (c->inl[k] == target) {
            /* recursion: a rule for target, its body emitted later */
            int32_t rule = -1;
            for (int32_t j = 0; j < c->n_refs; j++)
                if (c->ref_node[j] == target)
                    rule = c->ref_rule[j];
            if (rule < 0) {
                if (c->n_refs == (int32_t)(sizeof c->ref_node / sizeof c->ref_node[0])) {
                    gnfa_fail(c->a, PG_EINVAL, "json schema: too many recursive $refs");
                    return;
                }
                rule = gnfa_rule(c->a);
                if (rule < 0)
                    return;
                c->ref_node[c->n_refs] = target;
                c->ref_rule[c->n_refs++] = rule;
            }
            gnfa_call(c->a, from, to, rule);
            return;
        }
    if (c->n_inl == GS_MAX_NEST) {
        gnfa_fail(c->a, PG_EINVAL, "json schema: $refs nested more than %d deep", GS_MAX_NEST);
        return;
    }
    c->inl[c->n_inl++] = target;
    emit_value(c, target, from, to);
    c->n_inl--;
}

/* ---- typed schemas --------------------------------------------------------------- */

static bool get_count(sctx *c, int node, const char *key, int64_t *out)
{
    int v = json_obj_get(&c->d, node, key);
    if (v < 0)
        return false;
    if (json_get_int(&c->d, v, 0, 1000000, out, NULL) != PG_OK) {
        gnfa_fail(c->a, PG_EINVAL, "json schema: %s: expected an integer in [0, 1000000]", key);
        return false;
    }
    return true;
}

static void emit_string(sctx *c, int node, int32_t from, int32_t to)
{
    gnfa *a = c->a;
    int pat = json_obj_get(&c->d, node, "pattern"), fmt = json_obj_get(&c->d, node, "format");
    int64_t mn = 0, mx = -1;
    bool has_min = get_count(c, node, "minLength", &mn);
    bool has_max = get_count(c, node, "maxLength", &mx);
    if (a->status)
        return;
    if ((pat >= 0 || fmt >= 0) && (has_min || has_max || (pat >= 0 && fmt >= 0))) {
        gnfa_fail(a, PG_EUNSUPPORTED, "json schema: %s together with %s is not supported",
                  pat >= 0 ? "pattern" : "format", has_min || has_max ? "minLength/maxLength" : "format");
        return;
    }
    if (has_max && mx < mn) {
        gnfa_fail(a, PG_EINVAL, "json schema: maxLength %lld < minLength %lld (empty language)",
                  (long long)mx, (long long)mn);
        return;
    }
    int32_t s = gnfa_state(a), e = gnfa_state(a);
    gnfa_bytes(a, from, s, '"', '"');
    gnfa_bytes(a, e, to, '"', '"');
    if (pat >= 0 || fmt >= 0) {
        char *re = NULL;
        size_t n = 0;
        if (!json_is_string(&c->d, pat >= 0 ? pat : fmt) ||
            json_get_string(&c->d, pat >= 0 ? pat : fmt, &re, &n, NULL) != PG_OK) {
            gnfa_fail(a, PG_EINVAL, "json schema: %s: expected a string", pat >= 0 ? "pattern" : "format");
            return;
        }
        if (pat >= 0) {
            gre_emit(a, s, e, re, n, GRE_JSON_STRING, "json schema: pattern");
        } else {
            static const char date[] = "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
            static const char time[] = "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?"
                                       "(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
            static const char uuid[] = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                                       "[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
            if (strcmp(re, "date") == 0) {
                gre_emit(a, s, e, date, sizeof date - 1, GRE_JSON_STRING, "format");
            } else if (strcmp(re, "time") == 0) {
                gre_emit(a, s, e, time, sizeof time - 1, GRE_JSON_STRING, "format");
            } else if (strcmp(re, "date-time") == 0) {
                int32_t m1 = gnfa_state(a), m2 = gnfa_state(a);
                gre_emit(a, s, m1, date, sizeof date - 1, GRE_JSON_STRING, "format");
                gnfa_bytes(a, m1, m2, 'T', 'T');
                gre_emit(a, m2, e, time, sizeof time - 1, GRE_JSON_STRING, "format");
            } else if (strcmp(re, "uuid") == 0) {
                gre_emit(a, s, e, uuid, sizeof uuid - 1, GRE_JSON_STRING, "format");
            } else {
                gnfa_fail(a, PG_EUNSUPPORTED, "json schema: unsupported format '%.40s'", re);
            }
        }
        free(re);
        return;
    }
    int32_t cur = s;
    for (int64_t k = 0; k < mn && !a->status; k++) {
        int32_t nxt = gnfa_state(a);
        gjson_string_char(a, cur, nxt);
        cur = nxt;
    }
    if (mx < 0) {
        gjson_string_char(a, cur, cur);
        gnfa_eps(a, cur, e);
        return;
    }
    for (int64_t k = mn; k < mx && !a->status; k++) {
        int32_t nxt = gnfa_state(a);
        gnfa_eps(a, cur, e);
        gjson_string_char(a, cur, nxt);
        cur = nxt;
    }
    gnfa_eps(a, cur, e);
}

/* The schema of item k: a prefixItems entry, else `items` (-1: any value,
 * -2: no more items). */
static int item_at(sctx *c, int *pre_cur, int npre, int items, int64_t k)
{
    if (k < npre) { /* k grows by one per call: walk the array once */
        int at = *pre_cur;
        *pre_cur = json_skip(&c->d, at);
        return at;
    }
    if (items < 0 || is_bool_lit(&c->d, items, true))
        return -1;
    if (is_bool_lit(&c->d, items, false))
        return -2;
    return items;
}

static void emit_item(sctx *c, int schema, int32_t from, int32_t to)
{
    c->json_depth++;
    if (schema < 0)
        emit_any(c, from, to);
    else
        emit_value(c, schema, from, to);
    c->json_depth--;
}

/* '[' items ']': item k follows item_at(k); minItems/maxItems count them;
 * past the prefix and the minimum an unbounded tail is a loop. */
static void emit_array(sctx *c, int node, int32_t from, int32_t to)
{
    gnfa *a = c->a;
    const json_doc *d = &c->d;
    int items = json_obj_get(d, node, "items"), pre = json_obj_get(d, node, "prefixItems");
    int64_t mn = 0, mx = -1;
    get_count(c, node, "minItems", &mn);
    bool has_max = get_count(c, node, "maxItems", &mx);
    if (a->status)
        return;
    if (has_max && mx < mn) {
        gnfa_fail(a, PG_EINVAL, "json schema: maxItems %lld < minItems %lld (empty language)",
                  (long long)mx, (long long)mn);
        return;
    }
    if (items >= 0 && json_is_array(d, items)) {
        gnfa_fail(a, PG_EUNSUPPORTED, "json schema: unsupported keyword 'items' as an array (use prefixItems)");
        return;
    }
    if (pre >= 0 && !json_is_array(d, pre)) {
        gnfa_fail(a, PG_EINVAL, "json schema: prefixItems: expected an array of schemas");
        return;
    }
    int npre = pre >= 0 ? json_size(d, pre) : 0, pre_cur = pre + 1;
    int32_t cur = gnfa_state(a);
    gnfa_bytes(a, from, cur, '[', '[');
    int64_t have = 0;
    bool closed = false;
    while (!a->status) {
        if (have >= mn) {
            gnfa_bytes(a, cur, to, ']', ']');
            closed = true;
        }
        if (mx >= 0 && have >= mx)
            break;
        int sch = item_at(c, &pre_cur, npre, items, have);
        if (sch == -2)
            break;
        if (have >= npre && mx < 0 && have >= mn && have >= 1) {
            int32_t x = gnfa_state(a);
            gnfa_bytes(a, cur, x, ',', ',');
            emit_item(c, sch, x, cur);
            break;
        }
        int32_t x = cur, y = gnfa_state(a);
        if (have > 0) {
            x = gnfa_state(a);
            gnfa_bytes(a, cur, x, ',', ',');
        }
        emit_item(c, sch, x, y);
        cur = y;
        have++;
    }
    if (!closed && !a->status)
        gnfa_fail(a, PG_EINVAL, "json schema: minItems %lld is more than the items allowed (empty language)",
                  (long long)mn);
}

static void emit_object(sctx *c, int node, int32_t from, int32_t to)
{
    gnfa *a = c->a;
    const json_doc *d = &c->d;
    int props = json_obj_get(d, node, "properties"), req = json_obj_get(d, node, "required"),
        ap = json_obj_get(d, node, "additionalProperties");
    if (props >= 0 && !json_is_object(d, props)) {
        gnfa_fail(a, PG_EINVAL, "json schema: properties: expected an object");
        return;
    }
    if (req >= 0 && !json_is_array(d, req)) {
        gnfa_fail(a, PG_EINVAL, "json schema: required: expected an array of strings");
        return;
    }
    if (ap >= 0 && !json_is_bool(d, ap) && !json_is_object(d, ap)) {
        gnfa_fail(a, PG_EINVAL, "json schema: additionalProperties: expected a boolean or a schema");
        return;
    }
    int np = props >= 0 ? json_size(d, props) : 0;
    if (np == 0) {
        if (req >= 0 && json_size(d, req) > 0) {
            gnfa_fail(a, PG_EINVAL, "json schema: required names properties that are not listed (empty language)");
            return;
        }
        if (ap >= 0 && is_bool_lit(d, ap, false)) {
            gnfa_literal(a, from, to, "{}", 2);
        } else if (ap >= 0 && json_is_object(d, ap)) {
            emit_map(c, ap, from, to);
        } else {
            emit_any_container(c, true, from, to);
        }
        return;
    }
    if (ap >= 0 && json_is_object(d, ap)) {
        gnfa_fail(a, PG_EUNSUPPORTED, "json schema: unsupported keyword 'additionalProperties' as a schema next to 'properties'");
        return;
    }
    if (np > 1000) {
        gnfa_fail(a, PG_EINVAL, "json schema: more than 1000 properties");
        return;
    }
    /* which properties are required */
    uint8_t *is_req = calloc((size_t)np, 1);
    int32_t *st = calloc((size_t)np + 1, sizeof *st);
    if (!is_req || !st) {
        free(is_req);
        free(st);
        gnfa_fail(a, PG_ENOMEM, "json schema: out of memory");
        return;
    }
    int nr = req >= 0 ? json_size(d, req) : 0;
    if (nr > 1000) {
        free(is_req);
        free(st);
        gnfa_fail(a, PG_EINVAL, "json schema: required lists more than 1000 names");
        return;
    }
    for (int k = 0, i = req + 1; k < nr && !a->status; k++, i = json_skip(d, i)) {
        char *name = NULL;
        size_t nl = 0;
        if (!json_is_string(d, i) || json_get_string(d, i, &name, &nl, NULL) != PG_OK) {
            gnfa_fail(a, PG_EINVAL, "json schema: required[%d]: expected a string", k);
            break;
        }
        int found = -1;
        for (int p = 0, key = props + 1; p < np; p++, key = json_skip(d, key + 1)) {
            char *kn = NULL;
            size_t kl = 0;
            if (json_get_string(d, key, &kn, &kl, NULL) == PG_OK && kl == nl &&
                memcmp(kn, name, nl) == 0)
                found = p;
            free(kn);
        }
        if (found < 0)
            gnfa_fail(a, PG_EINVAL, "json schema: required property '%.60s' is not in properties (empty language)", name);
        else
            is_req[found] = 1;
        free(name);
    }
    /* st[0]: after '{' (no member yet); st[i], i >= 1: after member i-1.
     * From st[i] a member k >= i may come when all of i .. k-1 are
     * optional; '}' when all of i .. np-1 are. */
    for (int i = 0; i <= np; i++)
        st[i] = gnfa_state(a);
    gnfa_bytes(a, from, st[0], '{', '{');
    for (int p = 0, key = props + 1; p < np && !a->status; p++, key = json_skip(d, key + 1)) {
        /* entry states of member p: first (no comma) and later (comma) */
        int32_t e_first = gnfa_state(a), e_more = gnfa_state(a), name = gnfa_state(a),
                val = gnfa_state(a);
        for (int i = 0; i <= p; i++) {
            bool ok = true;
            for (int j = i; j < p; j++)
                ok = ok && !is_req[j];
            if (ok)
                gnfa_eps(a, st[i], i == 0 ? e_first : e_more);
        }
        gnfa_eps(a, e_first, name);
        gnfa_bytes(a, e_more, name, ',', ',');
        char *kn = NULL;
        size_t kl = 0;
        json_buf kb = {0};
        if (json_get_string(d, key, &kn, &kl, NULL) != PG_OK) {
            gnfa_fail(a, PG_ENOMEM, "json schema: out of memory");
            break;
        }
        json_buf_string(&kb, kn, kl);
        json_buf_put(&kb, ":", 1);
        free(kn);
        if (kb.oom)
            gnfa_fail(a, PG_ENOMEM, "json schema: out of memory");
        else
            gnfa_literal(a, name, val, kb.data, kb.len);
        json_buf_free(&kb);
        c->json_depth++;
        emit_value(c, key + 1, val, st[p + 1]);
        c->json_depth--;
    }
    for (int i = 0; i <= np && !a->status; i++) {
        bool ok = true;
        for (int j = i; j < np; j++)
            ok = ok && !is_req[j];
        if (ok)
            gnfa_bytes(a, st[i], to, '}', '}');
    }
    free(is_req);
    free(st);
}

static bool has_bounds(const sctx *c, int node)
{
    return json_obj_get(&c->d, node, "minimum") >= 0 || json_obj_get(&c->d, node, "maximum") >= 0 ||
           json_obj_get(&c->d, node, "exclusiveMinimum") >= 0 ||
           json_obj_get(&c->d, node, "exclusiveMaximum") >= 0;
}

static void emit_type(sctx *c, int node, const char *t, size_t tl, int32_t from, int32_t to)
{
    gnfa *a = c->a;
#define IS(s) (tl == sizeof(s) - 1 && memcmp(t, s, tl) == 0)
    if (IS("null"))
        gnfa_literal(a, from, to, "null", 4);
    else if (IS("boolean")) {
        gnfa_literal(a, from, to, "true", 4);
        gnfa_literal(a, from, to, "false", 5);
    } else if (IS("integer") && has_bounds(c, node))
        emit_integer_range(c, node, from, to);
    else if (IS("integer"))
        emit_integer(c, from, to);
    else if (IS("number") && has_bounds(c, node))
        gnfa_fail(a, PG_EUNSUPPORTED, "json schema: minimum/maximum on type 'number' is not supported (only on 'integer')");
    else if (IS("number"))
        emit_number(c, from, to);
    else if (IS("string"))
        emit_string(c, node, from, to);
    else if (IS("array"))
        emit_array(c, node, from, to);
    else if (IS("object"))
        emit_object(c, node, from, to);
    else
        gnfa_fail(a, PG_EUNSUPPORTED, "json schema: unsupported type '%.*s'", (int)(tl > 40 ? 40 : tl), t);
#undef IS
}

static void emit_value(sctx *c, int node, int32_t from, int32_t to)
{
    gnfa *a = c->a;
    const json_doc *d = &c->d;
    if (a->status)
        return;
    if (++c->depth > GS_MAX_NEST) {
        gnfa_fail(a, PG_EINVAL, "json schema: nested more than %d deep", GS_MAX_NEST);
        return;
    }
    if (json_is_bool(d, node)) {
        if (is_bool_lit(d, node, true))
            emit_any(c, from, to);
        else
            gnfa_fail(a, PG_EINVAL, "json schema: the schema 'false' matches nothing (empty language)");
        c->depth--;
        return;
    }
    if (!json_is_object(d, node)) {
        gnfa_fail(a, PG_EINVAL, "json schema: expected a schema object");
        c->depth--;
        return;
    }
    /* every keyword must be known */
    int n = json_size(d, node);
    bool typed = false;
    for (int k = 0, key = node + 1; k < n; k++, key = json_skip(d, key + 1)) {
        bool known = false;
        for (size_t j = 0; j < sizeof annotations / sizeof *annotations && !known; j++)
            known = json_str_eq(d, key, annotations[j]);
        for (size_t j = 0; j < sizeof keywords / sizeof *keywords && !known; j++) {
            known = json_str_eq(d, key, keywords[j]);
            typed |= known && j >= 6; /* a type-specific keyword */
        }
        if (!known) {
            char kb[64];
            key_text(c, key, kb, sizeof kb);
            gnfa_fail(a, PG_EUNSUPPORTED, "json schema: unsupported keyword '%s'", kb);
            c->depth--;
            return;
        }
    }
    int ref = json_obj_get(d, node, "$ref"), en = json_obj_get(d, node, "enum"),
        cn = json_obj_get(d, node, "const"), any = json_obj_get(d, node, "anyOf"),
        one = json_obj_get(d, node, "oneOf"), ty = json_obj_get(d, node, "type");
    if (ref >= 0) {
        int target = resolve_ref(c, ref);
        if (target >= 0)
            emit_ref(c, target, from, to);
    } else if (en >= 0) {
        if (!json_is_array(d, en) || json_size(d, en) == 0)
            gnfa_fail(a, PG_EINVAL, "json schema: enum: expected a non-empty array");
        for (int k = 0, i = en + 1; k < json_size(d, en) && !a->status; k++, i = json_skip(d, i))
            emit_literal(c, i, from, to);
    } else if (cn >= 0) {
        emit_literal(c, cn, from, to);
    } else if (any >= 0 || one >= 0) {
        int alts = any >= 0 ? any : one;
        if (any >= 0 && one >= 0)
            gnfa_fail(a, PG_EUNSUPPORTED, "json schema: anyOf together with oneOf is not supported");
        else if (ty >= 0 || typed)
            gnfa_fail(a, PG_EUNSUPPORTED, "json schema: %s next to type keywords is not supported",
                      any >= 0 ? "anyOf" : "oneOf");
        else if (!json_is_array(d, alts) || json_size(d, alts) == 0)
            gnfa_fail(a, PG_EINVAL, "json schema: %s: expected a non-empty array", any >= 0 ? "anyOf" : "oneOf");
        for (int k = 0, i = alts + 1; !a->status && k < json_size(d, alts); k++, i = json_skip(d, i))
            emit_value(c, i, from, to);
    } else if (ty >= 0) {
        if (json_is_string(d, ty)) {
            size_t tl = 0;
            const char *t = json_raw(d, ty, &tl);
            emit_type(c, node, t, tl, from, to);
        } else if (json_is_array(d, ty) && json_size(d, ty) > 0) {
            for (int k = 0, i = ty + 1; k < json_size(d, ty) && !a->status; k++, i = json_skip(d, i)) {
                size_t tl = 0;
                const char *t = json_raw(d, i, &tl);
                if (!json_is_string(d, i))
                    gnfa_fail(a, PG_EINVAL, "json schema: type: expected a string or an array of strings");
                else
                    emit_type(c, node, t, tl, from, to);
            }
        } else {
            gnfa_fail(a, PG_EINVAL, "json schema: type: expected a string or an array of strings");
        }
    } else if (json_obj_get(d, node, "properties") >= 0 || json_obj_get(d, node, "required") >= 0 ||
               json_obj_get(d, node, "additionalProperties") >= 0) {
        emit_object(c, node, from, to);
    } else if (json_obj_get(d, node, "items") >= 0 || json_obj_get(d, node, "prefixItems") >= 0 ||
               json_obj_get(d, node, "minItems") >= 0 ||
               json_obj_get(d, node, "maxItems") >= 0) {
        emit_array(c, node, from, to);
    } else if (has_bounds(c, node)) {
        gnfa_fail(a, PG_EUNSUPPORTED, "json schema: minimum/maximum without \"type\": \"integer\" is not supported");
    } else if (typed) {
        emit_string(c, node, from, to);
    } else {
        emit_any(c, from, to);
    }
    c->depth--;
}

int gschema_emit(gnfa *a, grammar_kind kind, const char *src, size_t len)
{
    sctx *c = calloc(1, sizeof *c);
    if (!c)
        return gnfa_fail(a, PG_ENOMEM, "json schema: out of memory");
    c->a = a;
    c->obj_rule = c->arr_rule = -1;
    if (kind == GRAMMAR_JSON_OBJECT) {
        emit_map(c, -1, a->rule_start[0], a->rule_accept[0]);
        int rc = a->status;
        free(c);
        return rc;
    }
    /* a whole schema `true` / `false` (json_parse takes no bare literal) */
    size_t b = 0, n = len;
    while (b < n && (src[b] == ' ' || src[b] == '\t' || src[b] == '\n' || src[b] == '\r'))
        b++;
    while (n > b && (src[n - 1] == ' ' || src[n - 1] == '\t' || src[n - 1] == '\n' || src[n - 1] == '\r'))
        n--;
    if (n - b == 4 && memcmp(src + b, "true", 4) == 0) {
        emit_any(c, a->rule_start[0], a->rule_accept[0]);
        int rc = a->status;
        free(c);
        return rc;
    }
    if (n - b == 5 && memcmp(src + b, "false", 5) == 0) {
        free(c);
        return gnfa_fail(a, PG_EINVAL, "json schema: the schema 'false' matches nothing (empty language)");
    }
    pg_error e;
    if (json_parse(&c->d, src, len, "json schema", &e) != PG_OK) {
        free(c);
        return gnfa_fail(a, PG_EINVAL, "%s", e.msg);
    }
    c->inl[c->n_inl++] = 0;
    emit_value(c, 0, a->rule_start[0], a->rule_accept[0]);
    /* bodies of the recursive $ref rules (a body may add more) */
    while (!a->status && c->n_done < c->n_refs) {
        int32_t k = c->n_done++;
        c->n_inl = 0;
        c->inl[c->n_inl++] = c->ref_node[k];
        c->depth = 0;
        int32_t r = c->ref_rule[k];
        emit_value(c, c->ref_node[k], a->rule_start[r], a->rule_accept[r]);
    }
    int rc = a->status;
    json_doc_free(&c->d);
    free(c);
    return rc;
}
