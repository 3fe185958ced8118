/* json: the nesting limit of json_parse (JSON_MAX_DEPTH). jsmn's cost per
 * closing bracket grows with the depth, so without the limit a line of
 * brackets took minutes; with it, deep texts are refused in linear time,
 * brackets inside strings do not count, and everything up to the limit
 * still parses. And strings must be valid UTF-8 (what serde_json and
 * Python's json refuse, json_parse refuses, naming the label and the byte).
 * (The rest of json is exercised by the loaders' tests and fuzz_json.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "json.h"
#include "test_support.h"

/* n '[' then n ']', optionally inside {"k": ...}; malloc'd. */
static char *nested(int n, bool in_object, size_t *len)
{
    size_t cap = 2 * (size_t)n + 16;
    char *s = malloc(cap), *w = s;
    assert_non_null(s);
    if (in_object) {
        memcpy(w, "{\"k\":", 5);
        w += 5;
    }
    memset(w, '[', (size_t)n);
    w += n;
    memset(w, ']', (size_t)n);
    w += n;
    if (in_object)
        *w++ = '}';
    *w = '\0';
    *len = (size_t)(w - s);
    return s;
}

static void test_depth_limit(void **state)
{
    (void)state;
    json_doc d;
    pg_error err;
    size_t len;
    /* exactly the limit parses (the root counts as one level) */
    char *s = nested(JSON_MAX_DEPTH, false, &len);
    assert_int_equal(json_parse(&d, s, len, "deep", &err), PG_OK);
    assert_int_equal(d.ntok, JSON_MAX_DEPTH);
    json_doc_free(&d);
    free(s);
    s = nested(JSON_MAX_DEPTH - 1, true, &len);
    assert_int_equal(json_parse(&d, s, len, "deep", &err), PG_OK);
    json_doc_free(&d);
    free(s);
    /* one more is refused, at the bracket that goes too deep */
    s = nested(JSON_MAX_DEPTH + 1, false, &len);
    assert_int_equal(json_parse(&d, s, len, "deep", &err), PG_EFORMAT);
    char want[128];
    snprintf(want, sizeof want, "deep: json nested more than %d deep at byte %d", JSON_MAX_DEPTH,
             JSON_MAX_DEPTH);
    assert_string_equal(err.msg, want);
    assert_null(d.tok);
    free(s);
    s = nested(JSON_MAX_DEPTH, true, &len);
    assert_int_equal(json_parse(&d, s, len, "deep", &err), PG_EFORMAT);
    free(s);
}

/* 200 KB of brackets: refused at once (jsmn alone took ~20 s; without the
 * limit this fails on the time bound) */
static void test_deep_is_fast(void **state)
{
    (void)state;
    json_doc d;
    pg_error err;
    size_t len;
    char *s = nested(100 * 1000, false, &len);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    assert_int_equal(json_parse(&d, s, len, "deep", &err), PG_EFORMAT);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s_taken = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    printf("    200 KB of brackets refused in %.3f ms\n", s_taken * 1e3);
    assert_true(s_taken < 1.0);
    free(s);
}

/* brackets inside strings (escaped quotes too) are text, not nesting */
static void test_brackets_in_strings(void **state)
{
    (void)state;
    size_t n = 3 * JSON_MAX_DEPTH;
    size_t cap = 2 * n + 64;
    char *s = malloc(cap), *w = s;
    assert_non_null(s);
    w += sprintf(w, "[\"\\\"");
    memset(w, '[', n);
    w += n;
    w += sprintf(w, "\",\"");
    memset(w, '{', n);
    w += n;
    w += sprintf(w, "\\\\\"]");
    json_doc d;
    pg_error err;
    int rc = json_parse(&d, s, (size_t)(w - s), "strings", &err);
    if (rc)
        fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, PG_OK);
    assert_int_equal(json_size(&d, 0), 2);
    char *v = NULL;
    size_t vl;
    assert_int_equal(json_get_string(&d, 1, &v, &vl, &err), PG_OK);
    assert_int_equal(vl, n + 1);
    assert_int_equal(v[0], '"');
    assert_int_equal(v[n], '[');
    free(v);
    assert_int_equal(json_get_string(&d, 2, &v, &vl, &err), PG_OK);
    assert_int_equal(vl, n + 1);
    assert_int_equal(v[n], '\\');
    free(v);
    json_doc_free(&d);
    free(s);
}

/* Parses text as one document labelled "f.json"; err holds the message. */
static int parse_text(const char *text, size_t len, pg_error *err)
{
    json_doc d;
    int rc = json_parse(&d, text, len, "f.json", err);
    if (rc == PG_OK)
        json_doc_free(&d);
    return rc;
}

/* RFC 3629 UTF-8 inside strings (keys too) is accepted, anything else is
 * refused at its first bad byte: a lone continuation byte, a truncated
 * sequence (also cut by the closing quote), an overlong form, a UTF-16
 * surrogate, a code point past U+10FFFF, 0xC0/0xC1/0xF5..0xFF. The error
 * names the label and the byte offset in the text, as serde_json's
 * "invalid unicode code point at line 1 column N" does. */
static void test_utf8_in_strings(void **state)
{
    (void)state;
    pg_error err = {{0}};
    static const char *const good[] = {
        "[\"a\xc3\xa9\",\"\xe2\x82\xac\",\"\xf0\x9f\x98\x80\"]",
        "{\"\xc3\xa9\":\"\xef\xbf\xbd\xf4\x8f\xbf\xbf\xed\x9f\xbf\xee\x80\x80\"}",
        "\"\\ud800 stays an escape, not raw bytes\"",
    };
    for (size_t k = 0; k < sizeof good / sizeof *good; k++) {
        int rc = parse_text(good[k], strlen(good[k]), &err);
        if (rc)
            fprintf(stderr, "good[%zu]: %s\n", k, err.msg);
        assert_int_equal(rc, PG_OK);
    }
    /* {text, offset of the first bad byte} */
    static const struct { const char *text; long at; } bad[] = {
        {"[\"ab\x80\"]", 4},                /* lone continuation */
        {"[\"a\xc3\"]", 3},                 /* cut by the closing quote */
        {"[\"a\xe2\x82\"]", 3},            /* truncated 3-byte */
        {"[\"\xc0\xaf\"]", 2},             /* overlong '/' */
        {"[\"\xe0\x80\xaf\"]", 2},        /* overlong, 3 bytes */
        {"[\"\xed\xa0\x80\"]", 2},        /* surrogate U+D800 */
        {"[\"\xf4\x90\x80\x80\"]", 2},   /* U+110000 */
        {"[\"x\xf5\x80\x80\x80\"]", 3},  /* 0xF5 never starts a sequence */
        {"[\"x\xff\"]", 3},
        {"{\"<s\xc7\":1}", 4},             /* in a key: the fuzz finding's shape */
        {"{\"k\":\"ok\",\"v\":[\"\xc3\xa9\xa9\"]}", 18},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        int rc = parse_text(bad[k].text, strlen(bad[k].text), &err);
        assert_int_equal(rc, PG_EFORMAT);
        char want[96];
        snprintf(want, sizeof want, "f.json: invalid utf-8 in json string at byte %ld", bad[k].at);
        if (strcmp(err.msg, want) != 0)
            fprintf(stderr, "bad[%zu]: got \"%s\", want \"%s\"\n", k, err.msg, want);
        assert_string_equal(err.msg, want);
    }
}

/* A raw invalid byte outside any string was already invalid json; inside
 * one it is now refused even where the loaders used to take it: the
 * tokenizer.json of ../shared/fuzz-findings/tokenizer-stream-half-char.bin
 * has "<s\xc7" as a vocabulary key. */
static void test_utf8_outside_strings(void **state)
{
    (void)state;
    pg_error err = {{0}};
    assert_int_equal(parse_text("[1,\xc3\xa9]", 7, &err), PG_EFORMAT);
    assert_int_equal(parse_text("\xef\xbb\xbf{}", 5, &err), PG_EFORMAT); /* BOM, as serde_json */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_depth_limit),
        cmocka_unit_test(test_deep_is_fast),
        cmocka_unit_test(test_brackets_in_strings),
        cmocka_unit_test(test_utf8_in_strings),
        cmocka_unit_test(test_utf8_outside_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
