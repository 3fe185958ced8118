/* jinja semantics: small templates whose expected output (or error) came
 * from jinja2 3.1.2 in transformers' environment — see jinja_diff.py, which
 * generated jinja_cases.h and checks it against jinja2 when installed.
 * Text must match byte for byte; an error must contain jinja2's message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chat_template.h"
#include "jinja_cases.h"
#include "json.h"

#define NOW_UNIX 1785067200 /* 2026-07-26 12:00:00 UTC, as jinja_diff.py */

/* Renders tmpl with vars as the top-level variables; returns 0 and *out, or
 * the error code and err. */
static int render_case(const char *tmpl, const char *vars, char **out, pg_error *err)
{
    chat_template *t = NULL;
    *out = NULL;
    int rc = chat_template_create(&t, tmpl, strlen(tmpl), "case", NULL, NULL, err);
    if (rc)
        return rc;
    /* vars: top-level variables, or a whole request when it starts with "messages" */
    size_t need = strlen(vars) + 64;
    char *req = malloc(need);
    if (strncmp(vars, "{\"messages\"", 11) == 0)
        snprintf(req, need, "%s", vars);
    else
        snprintf(req, need, "{\"messages\": [], \"chat_template_kwargs\": %s}", vars);
    json_doc d;
    rc = json_parse(&d, req, strlen(req), "request", err);
    if (!rc) {
        chat_render_opts opts = {.now_unix = NOW_UNIX, .default_add_generation_prompt = false};
        size_t n;
        rc = chat_template_render(t, &d, 0, &opts, out, &n, err);
        json_doc_free(&d);
    }
    free(req);
    chat_template_destroy(t);
    return rc;
}

static void test_cases(void **state)
{
    (void)state;
    int failures = 0;
    size_t n = sizeof JINJA_CASES / sizeof JINJA_CASES[0];
    for (size_t i = 0; i < n; i++) {
        const jinja_case *c = &JINJA_CASES[i];
        char *out = NULL;
        pg_error err = {{0}};
        int rc = render_case(c->tmpl, c->vars, &out, &err);
        bool ok;
        if (strcmp(c->kind, "text") == 0)
            ok = rc == 0 && strcmp(out, c->want) == 0;
        else
            ok = rc != 0 && strstr(err.msg, c->want) != NULL;
        if (!ok) {
            fprintf(stderr, "case %zu: %s\n  want %s: %s\n  got:  %s\n", i, c->tmpl, c->kind, c->want,
                    rc ? err.msg : out);
            failures++;
        }
        free(out);
    }
    fprintf(stderr, "%zu cases, %d failures\n", n, failures);
    assert_int_equal(failures, 0);
}

static void test_parse_errors(void **state)
{
    (void)state;
    int failures = 0;
    size_t n = sizeof JINJA_PARSE_ERRORS / sizeof JINJA_PARSE_ERRORS[0];
    for (size_t i = 0; i < n; i++) {
        const jinja_case *c = &JINJA_PARSE_ERRORS[i];
        chat_template *t = NULL;
        pg_error err = {{0}};
        int rc = chat_template_create(&t, c->tmpl, strlen(c->tmpl), "T", NULL, NULL, &err);
        /* "T: chat template: line L, column C: <jinja2's message>" */
        if (rc != PG_EFORMAT || strncmp(err.msg, "T: chat template: line ", 23) != 0 ||
            !strstr(err.msg, c->want)) {
            fprintf(stderr, "parse case %zu: %s\n  want: %s\n  got:  %s\n", i, c->tmpl, c->want,
                    rc ? err.msg : "(parsed)");
            failures++;
        }
        chat_template_destroy(t);
    }
    assert_int_equal(failures, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_parse_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
