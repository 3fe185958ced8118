/* chat goldens: every line of ../shared/chat_templates/goldens.jsonl (a
 * conversation rendered by jinja2 3.1 in transformers' environment, with
 * strftime_now pinned to 2026-07-26 12:00 UTC) reproduced byte for byte,
 * and every "error" line failing with a message that contains the
 * golden's error. The files are read in place (PAGEDGEN_SHARED). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chat_template.h"
#include "json.h"
#include "test_support.h"

#define GOLDEN_NOW_UNIX 1785067200 /* 2026-07-26 12:00:00 UTC */

static char *get_str(const json_doc *d, int obj, const char *key)
{
    int v = json_obj_get(d, obj, key);
    if (v < 0 || !json_is_string(d, v))
        return NULL;
    char *s = NULL;
    size_t n;
    if (json_get_string(d, v, &s, &n, NULL) != 0)
        return NULL;
    return s;
}

static void test_goldens(void **state)
{
    (void)state;
    size_t len;
    char *all = pg_test_read_file(pg_test_shared_path("chat_templates/goldens.jsonl"), &len);
    assert_non_null(all);
    int lines = 0, failures = 0;
    char *save = NULL;
    for (char *line = strtok_r(all, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        lines++;
        json_doc d;
        pg_error err = {{0}};
        assert_int_equal(json_parse(&d, line, strlen(line), "goldens.jsonl", &err), 0);
        char *name = get_str(&d, 0, "template"), *cas = get_str(&d, 0, "case");
        char *bos = get_str(&d, 0, "bos_token"), *eos = get_str(&d, 0, "eos_token");
        char *want = get_str(&d, 0, "text"), *want_err = get_str(&d, 0, "error");
        assert_non_null(name);
        assert_true(want || want_err);
        char rel[256];
        snprintf(rel, sizeof rel, "chat_templates/templates/%s.jinja", name);
        size_t tl;
        char *src = pg_test_read_file(pg_test_shared_path(rel), &tl);
        assert_non_null(src);
        chat_template *t = NULL;
        int rc = chat_template_create(&t, src, tl, rel, bos, eos, &err);
        if (rc) {
            fprintf(stderr, "%s/%s: parse failed: %s\n", name, cas, err.msg);
            failures++;
        } else {
            chat_render_opts opts = {.now_unix = GOLDEN_NOW_UNIX, .default_add_generation_prompt = false};
            char *out = NULL;
            size_t out_len = 0;
            rc = chat_template_render(t, &d, 0, &opts, &out, &out_len, &err);
            if (want) {
                if (rc || out_len != strlen(want) || memcmp(out, want, out_len) != 0) {
                    fprintf(stderr, "%s/%s: MISMATCH\n  want: %s\n  got:  %s\n", name, cas, want,
                            rc ? err.msg : out);
                    failures++;
                }
            } else if (rc == 0 || !strstr(err.msg, want_err)) {
                fprintf(stderr, "%s/%s: expected error '%s', got %s\n", name, cas, want_err,
                        rc ? err.msg : out);
                failures++;
            }
            free(out);
        }
        chat_template_destroy(t);
        free(src);
        free(name);
        free(cas);
        free(bos);
        free(eos);
        free(want);
        free(want_err);
        json_doc_free(&d);
    }
    free(all);
    fprintf(stderr, "%d golden lines, %d failures\n", lines, failures);
    assert_true(lines >= 70);
    assert_int_equal(failures, 0);
}

int main(void)
{
    pg_test_shared_dir(); /* skip (77) without the test data */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
