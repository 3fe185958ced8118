/* tests/structured/test_grammar: the constrained-decoding automaton (structured/grammar).
 *
 * - languages: hand-written strings each constraint must accept / refuse
 *   (regex, JSON schema of every supported kind, choice, json_object);
 * - errors: unsupported keywords and constructs are named, empty languages
 *   and hostile inputs are refused (and quickly: the work and size limits);
 * - masks: the trie walk equals a brute-force reference (each token's
 *   bytes fed through grammar_advance) on random reachable states, for the
 *   stories260K (512, byte fallback) and llama3 (128k, byte-level)
 *   vocabularies; prints µs per mask p50/p99 (not asserted).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "grammar.h"
#include "test_support.h"
#include "tokenizer.h"

static grammar *compile_ok(grammar_kind kind, const char *src)
{
    grammar *g = NULL;
    pg_error err = {{0}};
    int rc = grammar_compile(&g, kind, src, src ? strlen(src) : 0, &err);
    if (rc)
        fail_msg("compile '%s': %s", src ? src : "(null)", err.msg);
    return g;
}

static bool matches(const grammar *g, const char *s)
{
    grammar_state st;
    grammar_state_init(g, &st);
    return grammar_advance(g, &st, (const uint8_t *)s, strlen(s)) && grammar_can_end(g, &st);
}

/* accept[] then NULL then reject[] then NULL */
static void check_lang(grammar_kind kind, const char *src, ...)
{
    grammar *g = compile_ok(kind, src);
    va_list ap;
    va_start(ap, src);
    const char *s;
    while ((s = va_arg(ap, const char *)))
        if (!matches(g, s))
            fail_msg("'%s' should accept '%s'", src, s);
    while ((s = va_arg(ap, const char *)))
        if (matches(g, s))
            fail_msg("'%s' should refuse '%s'", src, s);
    va_end(ap);
    grammar_destroy(g);
}

static void check_error(grammar_kind kind, const char *src, const char *needle)
{
    grammar *g = NULL;
    pg_error err = {{0}};
    clock_t t0 = clock();
    int rc = grammar_compile(&g, kind, src, strlen(src), &err);
    double s = (double)(clock() - t0) / CLOCKS_PER_SEC;
    if (rc == PG_OK)
        fail_msg("'%s' compiled, expected an error with '%s'", src, needle);
    assert_null(g);
    if (!strstr(err.msg, needle))
        fail_msg("'%s': message '%s' lacks '%s'", src, err.msg, needle);
    if (s > 5.0)
        fail_msg("'%s': refusing took %.1f s", src, s);
}

static void test_regex(void **state)
{
    (void)state;
    check_lang(GRAMMAR_REGEX, "[a-z]+@[a-z]+\\.com", "ab@cd.com", "x@y.com", NULL,
               "ab@cd.co", "@cd.com", "ab@cd.comm", "", NULL);
    check_lang(GRAMMAR_REGEX, "(ab|cd){2,3}", "abab", "abcdab", "cdcd", NULL, "ab", "abababab",
               "abc", NULL);
    check_lang(GRAMMAR_REGEX, "^\\d{3}-\\d{4}$", "555-1234", NULL, "5551234", "555-123", NULL);
    check_lang(GRAMMAR_REGEX, ".", "a", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", NULL, "\n",
               "ab", "\xc3", "\xed\xa0\x80", NULL);
    check_lang(GRAMMAR_REGEX, "[^a\\d]x", "bx", "\xe2\x82\xacx", NULL, "ax", "1x", "x", NULL);
    check_lang(GRAMMAR_REGEX, "a?b*c+", "c", "abbcc", "bc", NULL, "ab", "", "ca", NULL);
    check_lang(GRAMMAR_REGEX, "\\w+\\s\\W", "a_1 !", NULL, "a  !", "a b", NULL);
    check_lang(GRAMMAR_REGEX, "x{2,}", "xx", "xxxxx", NULL, "x", NULL);
    check_lang(GRAMMAR_REGEX, "(?:a|b)(?P<n>c)\\.\\u00e9\\x41", "ac.\xc3\xa9" "A", NULL, "ac.eA", NULL);
    check_lang(GRAMMAR_REGEX, "[-a]|[a-]", "-", "a", NULL, "b", NULL);
    check_lang(GRAMMAR_REGEX, "a{0}b", "b", NULL, "ab", NULL);
}

static void test_choice(void **state)
{
    (void)state;
    check_lang(GRAMMAR_CHOICE, "[\"yes\",\"no\",\"n/a\",\"\\u00e9\"]", "yes", "no", "n/a",
               "\xc3\xa9", NULL, "y", "yesno", "", "No", NULL);
}

static void test_schema(void **state)
{
    (void)state;
    check_lang(GRAMMAR_JSON_SCHEMA,
               "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":5},"
               "\"age\":{\"type\":\"integer\"},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\"],"
               "\"additionalProperties\":false}",
               "{\"name\":\"bob\",\"age\":3}", "{\"name\":\"bob\"}", "{\"name\":\"\",\"ok\":true}",
               "{\"name\":\"a\\\"\\u00e9\",\"age\":-10,\"ok\":false}", NULL,
               "{\"age\":3,\"name\":\"bob\"}", "{\"name\":\"bobbob\"}", "{\"name\":\"bob\",}",
               "{\"name\": \"bob\"}", "{}", "{\"name\":\"b\",\"age\":01}", "{\"name\":\"b\",\"age\":1.5}",
               "{\"name\":\"b\"\n}", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"enum\":[\"a\",1,null,{\"x\":[1, 2]},\"q\\\"\"]}", "\"a\"", "1",
               "null", "{\"x\":[1,2]}", "\"q\\\"\"", NULL, "\"b\"", "2", "{\"x\":[1, 2]}", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"const\":\"k\"}", "\"k\"", NULL, "\"K\"", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA,
               "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":2}",
               "[true]", "[true,false]", NULL, "[]", "[true,true,true]", "[1]", "[true,]", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"array\",\"items\":{\"type\":\"null\"},\"minItems\":2}",
               "[null,null]", "[null,null,null,null]", NULL, "[null]", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"array\",\"maxItems\":0}", "[]", NULL, "[1]", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}", "[]", "[1]",
               "[1,2,3,4]", NULL, "[1,]", "[,1]", "[\"a\"]", NULL);
    /* tuples (pydantic's Tuple[int, str]) */
    check_lang(GRAMMAR_JSON_SCHEMA,
               "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],"
               "\"minItems\":2,\"maxItems\":2}", "[1,\"a\"]", NULL, "[1]", "[\"a\",1]", "[1,\"a\",2]", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA,
               "{\"prefixItems\":[{\"const\":1}],\"items\":{\"type\":\"boolean\"}}", "[]", "[1]",
               "[1,true,false]", NULL, "[true]", "[1,2]", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"prefixItems\":[{\"const\":1}],\"items\":false}", "[]", "[1]", NULL,
               "[1,1]", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA,
               "{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"pattern\":\"^x+$\"}]}",
               "12", "\"xx\"", NULL, "\"y\"", "\"\"", "1.5", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"oneOf\":[{\"type\":\"number\"},{\"type\":\"null\"}]}", "1.5e-3",
               "-0", "null", "0.25", NULL, "1.", ".5", "01", "+1", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":[\"string\",\"null\"],\"minLength\":2}", "\"ab\"",
               "null", "\"\\n\\u0041\"", NULL, "\"a\"", "\"\\x\"", "\"\n\"", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"a\\\"b\\\\\\\\c\\n\"}",
               "\"a\\\"b\\\\c\\n\"", NULL, "\"a\"b\\c\"", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"date\"}", "\"2024-02-29\"", NULL,
               "\"2024-13-01\"", "\"24-01-01\"", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"date-time\"}",
               "\"2024-02-29T10:20:30Z\"", "\"2024-02-29T23:59:59.5+01:00\"", NULL,
               "\"2024-02-29 10:20:30Z\"", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"uuid\"}",
               "\"123e4567-e89b-12d3-a456-426614174000\"", NULL, "\"123e4567\"", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"time\"}", "\"10:20:30+00:00\"",
               NULL, "\"25:00:00Z\"", NULL);
    /* integer ranges */
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":0,\"maximum\":100}", "0", "7",
               "10", "99", "100", NULL, "-1", "101", "007", "1000", "-0", "", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":-25,\"exclusiveMaximum\":-3}",
               "-25", "-4", "-10", "-19", NULL, "-3", "-26", "0", "-0", "-30", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":15}", "15", "99", "100", "16",
               "1234567890123456", NULL, "14", "9", "-1", "015", "12345678901234567", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"maximum\":-7}", "-7", "-100", "-99999999999",
               NULL, "-6", "0", "7", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"exclusiveMinimum\":2.5,\"maximum\":3.9}",
               "3", NULL, "2", "4", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":-3,\"maximum\":1234}", "-3", "0",
               "-1", "1234", "999", "1000", "1199", NULL, "-4", "1235", "1240", "2000", NULL);
    /* recursion through $ref, and $defs / definitions pointers */
    check_lang(GRAMMAR_JSON_SCHEMA,
               "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
               "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"]}},"
               "\"$ref\":\"#/$defs/node\"}",
               "{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[]}]}", NULL,
               "{\"kids\":[]}", "{\"v\":1,\"kids\":[{}]}", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA,
               "{\"definitions\":{\"p\":{\"type\":\"integer\"}},\"type\":\"object\","
               "\"properties\":{\"a\":{\"$ref\":\"#/definitions/p\"},\"b\":{\"$ref\":\"#/definitions/p\"}}}",
               "{}", "{\"a\":1}", "{\"b\":2}", "{\"a\":1,\"b\":2}", NULL, "{\"b\":1,\"a\":2}", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA,
               "{\"type\":\"object\",\"properties\":{\"items\":{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}}}",
               "{}", "{\"items\":[{},{\"items\":[]}]}", NULL, "{\"items\":[1]}", NULL);
    /* any value next to alternatives that start with the same bracket: the
     * generic value is written inline down to their depth (no ambiguous calls) */
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"anyOf\":[{},{\"type\":\"array\",\"items\":{\"type\":\"number\"}}]}",
               "[1]", "[[1]]", "{\"a\":1}", "\"s\"", "[[[[[[[]]]]]]]", NULL, "[1,]", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA,
               "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"object\",\"properties\":"
               "{\"b\":{\"type\":\"array\",\"items\":{\"enum\":[[1]]}}}}}},{\"type\":\"object\"}]}",
               "{\"a\":{\"b\":[[1]]}}", "{\"a\":{\"b\":[[2,{}]]}}", "{\"z\":[[[[{}]]]]}", NULL, "{\"a\":}", NULL);
    /* any value / object */
    check_lang(GRAMMAR_JSON_SCHEMA, "{}", "1", "\"s\"", "[1,{\"a\":[null]},true]", "{}", NULL, "",
               "[1,]", "{\"a\"}", "tru", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "true", "1", "{\"a\":[]}", NULL, "", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"additionalProperties\":false}", "{}", NULL,
               "{\"a\":1}", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"properties\":{\"a\":true},\"additionalProperties\":true}", "{}",
               "{\"a\":[1]}", NULL, "{\"b\":1}", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\"}", "{}", "{\"a\":{\"b\":[]}}", NULL, "[]",
               "1", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA,
               "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"},\"title\":\"t\"}",
               "{}", "{\"a\":1,\"b\":2}", NULL, "{\"a\":\"x\"}", NULL);
    check_lang(GRAMMAR_JSON_OBJECT, NULL, "{}", "{\"a\":[1,{\"b\":null}],\"c\":\"d\"}", NULL, "[1]",
               "{\"a\":}", "{\"a\":1,}", "{} ", NULL);
}

/* Digit runs end (issue 23): at most 16 integral digits, 16 fraction
 * digits and a 16-digit exponent without leading zeros, as llama.cpp's
 * json_schema_to_grammar (integral-part "[0] | [1-9] [0-9]{0,15}",
 * decimal-part "[0-9]{1,16}"); the open side of a one-sided integer range
 * stops at 16 digits too, or at the given bound's length when longer. */
static void test_number_digits(void **state)
{
    (void)state;
    const char *d16 = "9999999999999999", *d17 = "99999999999999999";
    char n16[40], n17[40], f16[40], f17[40], e16[40], e17[40], e0[40];
    snprintf(n16, sizeof n16, "-%s", d16);
    snprintf(n17, sizeof n17, "-%s", d17);
    snprintf(f16, sizeof f16, "0.%s", d16);
    snprintf(f17, sizeof f17, "0.%s", d17);
    snprintf(e16, sizeof e16, "1.5E-%s", d16);
    snprintf(e17, sizeof e17, "1.5E-%s", d17);
    snprintf(e0, sizeof e0, "1e05");
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\"}", "0", "-0", d16, n16, "1000000000000000",
               NULL, d17, n17, "10000000000000000", "1.0", "00", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\"}", d16, n16, f16, e16, "-0.0e+0", "1E9", NULL,
               d17, n17, f17, e17, e0, "1.", NULL);
    /* any value (no type) and json_object mode use the same number */
    check_lang(GRAMMAR_JSON_SCHEMA, "{}", "[1.5,-2e10]", f16, NULL, f17, "[1,99999999999999999]", NULL);
    /* one-sided ranges: the open side stops at 16 digits */
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":0}", "0", d16, NULL, d17, "-1",
               NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":-5}", "-5", "0", d16, NULL, d17,
               "-6", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"maximum\":7}", "7", "-3", n16, NULL, n17,
               "8", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"exclusiveMaximum\":-10}", "-11", n16, NULL,
               n17, "-10", NULL);
    /* a bound longer than 16 digits keeps its own length on the open side */
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":100000000000000000}",
               "100000000000000000", "999999999999999999", NULL, d17, "1000000000000000000", NULL);
    check_lang(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"maximum\":-100000000000000000}",
               "-100000000000000000", "-999999999999999999", NULL, n17, "-1000000000000000000", NULL);
}

static void test_depth_limit(void **state)
{
    (void)state;
    grammar *g = compile_ok(GRAMMAR_JSON_OBJECT, NULL);
    char buf[200];
    /* {"a":[[[[...]]]]}: the stack holds the object, then one frame per array */
    for (int depth = 1; depth < 60; depth++) {
        int n = 0;
        n += sprintf(buf + n, "{\"a\":");
        for (int k = 0; k < depth; k++)
            buf[n++] = '[';
        for (int k = 0; k < depth; k++)
            buf[n++] = ']';
        buf[n++] = '}';
        buf[n] = 0;
        bool ok = matches(g, buf);
        assert_int_equal(ok, depth < GRAMMAR_MAX_DEPTH);
    }
    grammar_destroy(g);
}

static void test_errors(void **state)
{
    (void)state;
    check_error(GRAMMAR_JSON_SCHEMA, "{\"not\":{}}", "unsupported keyword 'not'");
    check_error(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"multipleOf\":3}", "unsupported keyword 'multipleOf'");
    check_error(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"minimum\":3}", "only on 'integer'");
    check_error(GRAMMAR_JSON_SCHEMA, "{\"minimum\":3}", "without");
    check_error(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "empty language");
    check_error(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"exclusiveMinimum\":4,\"exclusiveMaximum\":5}", "empty language");
    check_error(GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"required\":[\"x\"]}", "empty language");
    check_error(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}", "empty language");
    check_error(GRAMMAR_JSON_SCHEMA,
                "{\"type\":\"object\",\"properties\":{\"a\":false},\"required\":[\"a\"]}",
                "empty language");
    check_error(GRAMMAR_JSON_SCHEMA, "{\"type\":\"strin\"}", "unsupported type 'strin'");
    check_error(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"email\"}", "unsupported format 'email'");
    check_error(GRAMMAR_JSON_SCHEMA, " false ", "empty language");
    check_error(GRAMMAR_JSON_SCHEMA, "{\"prefixItems\":[{}],\"items\":false,\"minItems\":2}", "empty language");
    check_error(GRAMMAR_JSON_SCHEMA, "{\"$ref\":\"http://x/y\"}", "unsupported $ref");
    check_error(GRAMMAR_JSON_SCHEMA, "{\"$ref\":\"#/$defs/nope\"}", "points to nothing");
    check_error(GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\"", "json schema");
    /* a tree whose every node needs a child: no finite document */
    check_error(GRAMMAR_JSON_SCHEMA,
                "{\"type\":\"object\",\"properties\":{\"k\":{\"$ref\":\"#\"}},\"required\":[\"k\"]}",
                "empty language");
    check_error(GRAMMAR_REGEX, "(a)\\1", "backreference");
    check_error(GRAMMAR_REGEX, "(?=a)b", "lookaround");
    check_error(GRAMMAR_REGEX, "a\\bb", "word boundary");
    check_error(GRAMMAR_REGEX, "a(b", "expected ')'");
    check_error(GRAMMAR_REGEX, "ab)", "unbalanced");
    check_error(GRAMMAR_REGEX, "*a", "nothing to repeat");
    check_error(GRAMMAR_REGEX, "[b-a]", "out of order");
    check_error(GRAMMAR_REGEX, "a{3,2}", "n < m");
    check_error(GRAMMAR_REGEX, "a{100000}", "above the limit");
    check_error(GRAMMAR_REGEX, "[a-", "unterminated");
    check_error(GRAMMAR_CHOICE, "[]", "non-empty");
    check_error(GRAMMAR_CHOICE, "[1]", "expected a string");
    /* hostile: too many NFA states, exponential DFA, both refused by limits */
    check_error(GRAMMAR_REGEX, "(a{1000}){1000}", "too large");
    check_error(GRAMMAR_REGEX, "(a|b)*a(a|b){24}", "too large");
    check_error(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"maxLength\":1000000}", "too large");
    check_error(GRAMMAR_REGEX, "(a|b|c)*(a{50}|b{50}){40}", "too complex");
    /* a 99,001-state chain: pruning is linear (it was quadratic: a minute) */
    clock_t t0 = clock();
    grammar *g = compile_ok(GRAMMAR_REGEX, "(a{9000}){11}");
    assert_true(grammar_num_states(g) > 99000);
    assert_true((double)(clock() - t0) / CLOCKS_PER_SEC < 5.0);
    grammar_destroy(g);
}

/* ---- masks against the brute-force reference --------------------------------- */

typedef struct vocab_fixture {
    tokenizer *tok;
    grammar_vocab *v;
} vocab_fixture;

static grammar_vocab *load_vocab(const char *rel, tokenizer **tok_out)
{
    tokenizer *tok = NULL;
    pg_error err = {{0}};
    if (tok_load(&tok, pg_test_shared_path(rel), &err) != PG_OK)
        fail_msg("%s: %s", rel, err.msg);
    int32_t n = tok_vocab_size(tok);
    char **bytes = calloc((size_t)n, sizeof *bytes);
    uint32_t *lens = calloc((size_t)n, sizeof *lens);
    assert_non_null(bytes);
    assert_non_null(lens);
    for (int32_t i = 0; i < n; i++) {
        size_t l = 0;
        assert_int_equal(tok_token_bytes(tok, i, &bytes[i], &l, &err), PG_OK);
        lens[i] = (uint32_t)l;
    }
    grammar_vocab *v = NULL;
    assert_int_equal(grammar_vocab_create(&v, n, (const char *const *)bytes, lens, &err), PG_OK);
    for (int32_t i = 0; i < n; i++)
        free(bytes[i]);
    free(bytes);
    free(lens);
    *tok_out = tok;
    return v;
}

/* The decoded bytes of the one token text encodes to are `want`. */
static void check_token_bytes(const tokenizer *tok, const grammar_vocab *v, const char *text,
                              const char *want)
{
    int32_t *ids = NULL;
    size_t n = 0;
    pg_error err;
    assert_int_equal(tok_encode(tok, text, strlen(text), false, &ids, &n, &err), PG_OK);
    assert_true(n >= 1);
    uint32_t len;
    const uint8_t *b = grammar_vocab_bytes(v, ids[n - 1], &len);
    if (len != strlen(want) || memcmp(b, want, len) != 0)
        fail_msg("'%s': token %d has bytes '%.*s', expected '%s'", text, (int)ids[n - 1], (int)len,
                 (const char *)b, want);
    free(ids);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static const struct {
    grammar_kind kind;
    const char *src;
} mask_grammars[] = {
    {GRAMMAR_JSON_OBJECT, NULL},
    {GRAMMAR_JSON_SCHEMA,
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
     "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"maxItems\":3},"
     "\"score\":{\"type\":\"number\"},\"when\":{\"type\":\"string\",\"format\":\"date\"},"
     "\"any\":{}},\"required\":[\"name\",\"score\"]}"},
    {GRAMMAR_JSON_SCHEMA,
     "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
     "\"k\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}}}}},\"$ref\":\"#/$defs/n\"}"},
    {GRAMMAR_REGEX, "(\\w+ ){1,4}[A-Z][a-z]*\\.( [0-9]{2,3})?"},
    {GRAMMAR_CHOICE, "[\"positive\",\"negative\",\"neutral\",\"not sure\"]"},
    {GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\"}"},
};

/* Random walks: at every state, the trie mask must equal the reference.
 * Returns the mask times (µs) in *times, their count. */
static int walk_and_check(const grammar_vocab *v, int walks, int steps, double *times,
                          double *etimes, double *ctimes, int max_times)
{
    int32_t n = grammar_vocab_size(v);
    size_t words = grammar_mask_words(v);
    uint64_t *mask = malloc(words * sizeof *mask);
    uint64_t *cmask = malloc(words * sizeof *cmask);
    assert_non_null(cmask);
    int32_t *allowed = malloc((size_t)n * sizeof *allowed);
    assert_non_null(mask);
    assert_non_null(allowed);
    pg_test_rng rng = {0x1234};
    int nt = 0;
    for (size_t gi = 0; gi < sizeof mask_grammars / sizeof *mask_grammars; gi++) {
        grammar *g = compile_ok(mask_grammars[gi].kind, mask_grammars[gi].src);
        grammar_cache *cache = NULL;
        assert_int_equal(grammar_cache_create(&cache, g, v, (size_t)256 << 20, NULL), PG_OK);
        for (int w = 0; w < walks; w++) {
            grammar_state st;
            grammar_state_init(g, &st);
            for (int k = 0; k < steps; k++) {
                double t0 = now_us();
                int32_t cnt = grammar_mask(g, v, &st, mask);
                double t1 = now_us();
                int32_t ccnt = grammar_mask_cached(cache, &st, cmask);
                double t2 = now_us();
                /* a second time: from the cache */
                assert_int_equal(grammar_mask_cached(cache, &st, cmask), ccnt);
                double t3 = now_us();
                if (nt < max_times) {
                    times[nt] = t1 - t0;
                    etimes[nt] = t2 - t1;
                    ctimes[nt++] = t3 - t2;
                }
                assert_int_equal(ccnt, cnt);
                assert_memory_equal(cmask, mask, words * sizeof *mask);
                int32_t na = 0;
                for (int32_t id = 0; id < n; id++) {
                    uint32_t len;
                    const uint8_t *b = grammar_vocab_bytes(v, id, &len);
                    grammar_state t = st;
                    bool ref = len > 0 && grammar_advance(g, &t, b, len);
                    bool got = (mask[id >> 6] >> (id & 63)) & 1;
                    if (ref != got)
                        fail_msg("grammar %zu walk %d step %d: token %d: mask %d, reference %d", gi, w,
                                 k, (int)id, got, ref);
                    if (ref)
                        allowed[na++] = id;
                }
                assert_int_equal(cnt, na);
                if (na == 0) {
                    assert_true(grammar_can_end(g, &st)); /* pruned: live states can finish */
                    break;
                }
                /* half the time prefer the shortest allowed token: reach structure */
                int32_t pick = allowed[pg_test_rng_int(&rng, 0, na - 1)];
                if (pg_test_rng_int(&rng, 0, 1)) {
                    uint32_t best = UINT32_MAX, len;
                    for (int32_t j = 0; j < na; j++) {
                        grammar_vocab_bytes(v, allowed[j], &len);
                        if (len < best || (len == best && pg_test_rng_int(&rng, 0, 3) == 0)) {
                            best = len;
                            pick = allowed[j];
                        }
                    }
                }
                uint32_t len;
                const uint8_t *b = grammar_vocab_bytes(v, pick, &len);
                assert_true(grammar_advance(g, &st, b, len));
            }
        }
        grammar_cache_destroy(cache);
        grammar_destroy(g);
    }
    free(cmask);
    free(mask);
    free(allowed);
    return nt;
}

/* µs per mask, p50/p99: the trie walk (no cache), the engine's path (the
 * cache as the walk fills it: first visits walk, repeats hit) and a state
 * already cached. */
static void report(const char *name, const grammar_vocab *v, double *times, double *etimes,
                   double *ctimes, int nt)
{
    qsort(times, (size_t)nt, sizeof *times, cmp_double);
    qsort(etimes, (size_t)nt, sizeof *etimes, cmp_double);
    qsort(ctimes, (size_t)nt, sizeof *ctimes, cmp_double);
    printf("# grammar mask %s (vocab %d, %d trie nodes), %d masks: trie walk p50 %.1f us p99 %.1f us; "
           "engine path p50 %.1f us p99 %.1f us; cached state p50 %.1f us p99 %.1f us\n", name,
           (int)grammar_vocab_size(v), (int)grammar_vocab_trie_nodes(v), nt, times[nt / 2],
           times[(nt * 99) / 100], etimes[nt / 2], etimes[(nt * 99) / 100], ctimes[nt / 2],
           ctimes[(nt * 99) / 100]);
}

static void test_mask_stories(void **state)
{
    (void)state;
    tokenizer *tok;
    grammar_vocab *v = load_vocab("models/stories260K", &tok);
    static double times[20000], etimes[20000], ctimes[20000];
    int nt = walk_and_check(v, 20, 60, times, etimes, ctimes, 20000);
    report("stories260K", v, times, etimes, ctimes, nt);
    /* SentencePiece: "\u2581" is a space mid-text; "{" is the byte-fallback <0x7B> */
    check_token_bytes(tok, v, "Once", " Once");
    check_token_bytes(tok, v, "{", "{");
    uint32_t eos_len = 1;
    grammar_vocab_bytes(v, tok_eos_id(tok), &eos_len);
    assert_int_equal(eos_len, 0); /* special tokens never match */
    /* the byte-fallback pieces are single bytes, "\u2581" is a space */
    uint32_t len;
    int32_t n = grammar_vocab_size(v);
    int singles = 0;
    for (int32_t id = 0; id < n; id++) {
        const uint8_t *b = grammar_vocab_bytes(v, id, &len);
        singles += len == 1;
        for (uint32_t k = 0; k + 3 <= len; k++)
            assert_false(b[k] == 0xE2 && b[k + 1] == 0x96 && b[k + 2] == 0x81);
    }
    assert_true(singles >= 256);
    grammar_vocab_destroy(v);
    tok_free(tok);
}

/* grammar_bytes_to_end is exact: while it says d > 0 some byte takes it to
 * d - 1 (so d single bytes reach a complete match), and no byte takes it
 * below d - 1. */
static void check_descent(const grammar *g, const grammar_state *s0)
{
    grammar_state s = *s0;
    int32_t d = grammar_bytes_to_end(g, &s);
    assert_true(d >= 0 && d < 100000);
    assert_int_equal(d == 0, grammar_can_end(g, &s));
    while (d > 0) {
        int found = -1;
        for (int b = 0; b < 256; b++) {
            grammar_state t = s;
            uint8_t byte = (uint8_t)b;
            if (!grammar_advance(g, &t, &byte, 1))
                continue;
            int32_t dt = grammar_bytes_to_end(g, &t);
            if (dt < d - 1)
                fail_msg("byte %d takes bytes_to_end from %d to %d", b, (int)d, (int)dt);
            if (dt == d - 1 && found < 0)
                found = b;
        }
        if (found < 0)
            fail_msg("bytes_to_end %d but no byte brings it to %d", (int)d, (int)d - 1);
        uint8_t byte = (uint8_t)found;
        assert_true(grammar_advance(g, &s, &byte, 1));
        d--;
    }
    assert_true(grammar_can_end(g, &s));
}

/* Budgeted ends on stories260K's vocabulary: grammar_mask_budget keeps
 * exactly the tokens after which bytes_to_end <= the budget (the length
 * gate never skips a token that breaks it), and random walks whose budget
 * is a max_tokens count (budget = tokens left after this one - 1, as the
 * engine passes it) always reach a complete match in time. */
static void test_budget_stories(void **state)
{
    (void)state;
    tokenizer *tok;
    grammar_vocab *v = load_vocab("models/stories260K", &tok);
    int32_t n = grammar_vocab_size(v);
    size_t words = grammar_mask_words(v);
    uint64_t *mask = malloc(words * sizeof *mask), *full = malloc(words * sizeof *full);
    int32_t *kept = malloc((size_t)n * sizeof *kept);
    assert_non_null(mask);
    assert_non_null(full);
    assert_non_null(kept);
    static const char *const extra[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
        "\"age\":{\"type\":\"integer\"},\"x\":{\"type\":\"number\"}},\"required\":[\"name\",\"age\"]}",
        "{\"type\":\"array\",\"items\":{\"type\":\"string\"}}",
    };
    size_t n_gr = sizeof mask_grammars / sizeof *mask_grammars;
    pg_test_rng rng = {0x5eed};
    int forced = 0;
    for (size_t gi = 0; gi < n_gr + 2; gi++) {
        grammar *g = gi < n_gr ? compile_ok(mask_grammars[gi].kind, mask_grammars[gi].src)
                               : compile_ok(GRAMMAR_JSON_SCHEMA, extra[gi - n_gr]);
        for (int w = 0; w < 30; w++) {
            grammar_state st;
            grammar_state_init(g, &st);
            int32_t max_tokens = 8 + (int32_t)(pg_test_rng_next(&rng) % 40);
            if (max_tokens < grammar_bytes_to_end(g, &st) + 1)
                max_tokens = grammar_bytes_to_end(g, &st) + 1;
            for (int32_t out = 0;; out++) {
                check_descent(g, &st);
                bool can_end = grammar_can_end(g, &st);
                assert_true(out < max_tokens); /* ended in time */
                int32_t budget = max_tokens - out - 2;
                assert_true(grammar_mask(g, v, &st, full) >= 0);
                memcpy(mask, full, words * sizeof *mask);
                int32_t cnt = grammar_mask_budget(g, v, &st, mask, budget, can_end);
                int32_t nk = 0;
                for (int32_t id = 0; id < n; id++) {
                    bool in_full = (full[id >> 6] >> (id & 63)) & 1;
                    bool in = (mask[id >> 6] >> (id & 63)) & 1;
                    if (!in_full) {
                        assert_false(in);
                        continue;
                    }
                    uint32_t len;
                    const uint8_t *b = grammar_vocab_bytes(v, id, &len);
                    grammar_state t = st;
                    assert_true(grammar_advance(g, &t, b, len));
                    bool fits = grammar_bytes_to_end(g, &t) <= budget;
                    if (in != fits)
                        fail_msg("grammar %zu, budget %d: token %d (%u bytes) %s", gi, (int)budget,
                                 (int)id, len, in ? "kept but breaks the budget" : "cleared but fits");
                    forced += !in;
                    if (in)
                        kept[nk++] = id;
                }
                assert_int_equal(cnt, nk);
                /* end (eos) sometimes where allowed, always when nothing else is */
                if (can_end && (nk == 0 || pg_test_rng_next(&rng) % 4 == 0))
                    break;
                assert_true(nk > 0);
                int32_t id = kept[pg_test_rng_next(&rng) % (uint64_t)nk];
                uint32_t len;
                const uint8_t *b = grammar_vocab_bytes(v, id, &len);
                assert_true(grammar_advance(g, &st, b, len));
            }
        }
        grammar_destroy(g);
    }
    assert_true(forced > 0); /* the budget did clear tokens */
    free(mask);
    free(full);
    free(kept);
    grammar_vocab_destroy(v);
    tok_free(tok);
}

static void test_mask_llama3(void **state)
{
    (void)state;
    tokenizer *tok;
    grammar_vocab *v = load_vocab("tokenizers/llama3", &tok);
    static double times[2000], etimes[2000], ctimes[2000];
    int nt = walk_and_check(v, 2, 25, times, etimes, ctimes, 2000);
    report("llama3", v, times, etimes, ctimes, nt);
    {
        /* the cost of a budgeted mask where it bites: inside an unbounded
         * string (most of the vocabulary allowed), 3 bytes of budget left */
        grammar *g = compile_ok(GRAMMAR_JSON_SCHEMA,
                                "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\"}},\"required\":[\"s\"]}");
        grammar_state st;
        grammar_state_init(g, &st);
        assert_true(grammar_advance(g, &st, (const uint8_t *)"{\"s\":\"ab", 8));
        uint64_t *mask = malloc(grammar_mask_words(v) * sizeof *mask);
        assert_non_null(mask);
        int32_t before = grammar_mask(g, v, &st, mask);
        /* 8 bytes left: more than an escape inside the string can need
         * (\\u0000"} is 7), so the reach bound skips every token */
        double t00 = now_us();
        assert_int_equal(grammar_mask_budget(g, v, &st, mask, 8, false), before);
        print_message("# budgeted mask llama3, in a string, 8 bytes left: all kept, %.1f us\n", now_us() - t00);
        double t0 = now_us();
        int32_t after = grammar_mask_budget(g, v, &st, mask, 3, false);
        double t1 = now_us();
        assert_true(after > 0 && after < before);
        print_message("# budgeted mask llama3, in a string, 3 bytes left: %d of %d tokens kept, %.0f us\n",
                      (int)after, (int)before, t1 - t0);
        free(mask);
        grammar_destroy(g);
    }
    /* byte-level: "\u0120" is a space, "\u010a" a newline */
    check_token_bytes(tok, v, " the", " the");
    check_token_bytes(tok, v, "\n\n", "\n\n");
    check_token_bytes(tok, v, "\"}", "\"}");
    grammar_vocab_destroy(v);
    tok_free(tok);
}

int main(void)
{
    pg_test_shared_dir();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regex),
        cmocka_unit_test(test_choice),
        cmocka_unit_test(test_schema),
        cmocka_unit_test(test_number_digits),
        cmocka_unit_test(test_depth_limit),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_mask_stories),
        cmocka_unit_test(test_budget_stories),
        cmocka_unit_test(test_mask_llama3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
