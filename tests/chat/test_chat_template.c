/* chat_template: where the template comes from (chat_template_load's
 * lookup order, bos/eos forms), the request variables (content parts,
 * continue_final_message, tools, kwargs) and the limits that keep a hostile
 * template from crashing or hanging the process. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "chat_template.h"
#include "json.h"

static char tmpdir[256];

static void write_file(const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void remove_file(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    unlink(path);
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pg_chat_test_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    const char *names[] = {"tokenizer_config.json", "chat_template.jinja", "chat_template.json", "override.jinja"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        remove_file(names[i]);
    rmdir(tmpdir);
    return 0;
}

/* Renders `request` (JSON) with t; returns rc, *out malloc'd on success. */
static int render(const chat_template *t, const char *request, char **out, pg_error *err)
{
    json_doc d;
    int rc = json_parse(&d, request, strlen(request), "request", err);
    assert_int_equal(rc, 0);
    chat_render_opts opts = {.now_unix = 0, .default_add_generation_prompt = false};
    size_t n;
    rc = chat_template_render(t, &d, 0, &opts, out, &n, err);
    json_doc_free(&d);
    return rc;
}

static const char *SIMPLE = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}";

static char *load_and_render(const char *override, pg_error *err, int *rc_out)
{
    chat_template *t = NULL;
    int rc = chat_template_load(&t, tmpdir, override, err);
    *rc_out = rc;
    if (rc || !t)
        return NULL;
    char *out = NULL;
    rc = render(t, SIMPLE, &out, err);
    assert_int_equal(rc, 0);
    chat_template_destroy(t);
    return out;
}

static void test_load_order(void **state)
{
    (void)state;
    pg_error err = {{0}};
    int rc;
    /* nothing at all: no template, no error */
    chat_template *t = (chat_template *)1;
    assert_int_equal(chat_template_load(&t, tmpdir, NULL, &err), 0);
    assert_null(t);
    /* chat_template.json beside */
    write_file("chat_template.json", "{\"chat_template\": \"json:{{ messages[0].content }}\"}");
    char *out = load_and_render(NULL, &err, &rc);
    assert_string_equal(out, "json:hi");
    free(out);
    /* chat_template.jinja beats .json */
    write_file("chat_template.jinja", "jinja:{{ messages[0].content }}\n");
    out = load_and_render(NULL, &err, &rc);
    assert_string_equal(out, "jinja:hi");
    free(out);
    /* chat_template.jinja beats tokenizer_config.json's entry too
     * (transformers >= 4.47), which beats chat_template.json; bos/eos as a
     * string and as {"content"} */
    write_file("tokenizer_config.json",
               "{\"bos_token\": \"<s>\", \"eos_token\": {\"content\": \"</s>\", \"lstrip\": false},"
               " \"chat_template\": \"{{ bos_token }}cfg:{{ messages[0].content }}{{ eos_token }}\"}");
    out = load_and_render(NULL, &err, &rc);
    assert_string_equal(out, "jinja:hi");
    free(out);
    char jinja_file[512];
    snprintf(jinja_file, sizeof jinja_file, "%s/chat_template.jinja", tmpdir);
    assert_int_equal(unlink(jinja_file), 0);
    out = load_and_render(NULL, &err, &rc);
    assert_string_equal(out, "<s>cfg:hi</s>");
    free(out);
    /* a list of named templates: "default" */
    write_file("tokenizer_config.json",
               "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"tool\"},"
               " {\"name\": \"default\", \"template\": \"default:{{ bos_token is defined }}\"}]}");
    out = load_and_render(NULL, &err, &rc);
    assert_string_equal(out, "default:False");
    free(out);
    /* the override always wins */
    write_file("override.jinja", "override");
    char path[512];
    snprintf(path, sizeof path, "%s/override.jinja", tmpdir);
    out = load_and_render(path, &err, &rc);
    assert_string_equal(out, "override");
    free(out);
    /* a list without "default" is an error */
    write_file("tokenizer_config.json", "{\"chat_template\": [{\"name\": \"x\", \"template\": \"t\"}]}");
    out = load_and_render(NULL, &err, &rc);
    assert_null(out);
    assert_int_equal(rc, PG_EFORMAT);
    assert_non_null(strstr(err.msg, "default"));
    /* a template that does not parse: FILE: chat template: line L, column C */
    write_file("tokenizer_config.json", "{\"chat_template\": \"ok\\n  {% if %}\"}");
    out = load_and_render(NULL, &err, &rc);
    assert_int_equal(rc, PG_EFORMAT);
    assert_non_null(strstr(err.msg, "tokenizer_config.json: chat template: line 2, column "));
    /* tokenizer_config.json without chat_template falls through to the .json */
    write_file("tokenizer_config.json", "{\"bos_token\": \"B\"}");
    out = load_and_render(NULL, &err, &rc);
    assert_string_equal(out, "json:hi");
    free(out);
}

static chat_template *make(const char *src)
{
    chat_template *t = NULL;
    pg_error err = {{0}};
    int rc = chat_template_create(&t, src, strlen(src), "t", "<s>", "</s>", &err);
    if (rc)
        fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    return t;
}

static void test_request_variables(void **state)
{
    (void)state;
    pg_error err = {{0}};
    char *out = NULL;
    chat_template *t = make("{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
                            "{{ tools is none }}{{ documents is none }}{{ add_generation_prompt }}{{ extra }}");
    /* content parts joined with "\n"; tools/documents None; kwargs at top level */
    assert_int_equal(render(t, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"},"
                               " {\"type\": \"text\", \"text\": \"b\"}]}], \"chat_template_kwargs\": {\"extra\": 7}}",
                            &out, &err), 0);
    assert_string_equal(out, "[user:a\nb]TrueTrueFalse7");
    free(out);
    assert_int_equal(render(t, "{\"messages\": [], \"add_generation_prompt\": true, \"tools\": []}", &out, &err), 0);
    assert_string_equal(out, "FalseTrueTrue");
    free(out);
    /* bad requests */
    assert_int_equal(render(t, "{\"messages\": 3}", &out, &err), PG_EINVAL);
    assert_int_equal(render(t, "{}", &out, &err), PG_EINVAL);
    assert_int_equal(render(t, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}", &out, &err), PG_EINVAL);
    assert_null(out);
    chat_template_destroy(t);
}

static void test_continue_final_message(void **state)
{
    (void)state;
    pg_error err = {{0}};
    char *out = NULL;
    chat_template *t = make("{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}"
                            "{% if add_generation_prompt %}<assistant>{% endif %}");
    const char *req = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"},"
                      " {\"role\": \"assistant\", \"content\": \"Hello, I\"}], \"add_generation_prompt\": false,"
                      " \"continue_final_message\": true}";
    assert_int_equal(render(t, req, &out, &err), 0);
    assert_string_equal(out, "<user>Hi</user>\n<assistant>Hello, I");
    free(out);
    /* with add_generation_prompt: refused */
    const char *both = "{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\"}],"
                       " \"add_generation_prompt\": true, \"continue_final_message\": true}";
    assert_int_equal(render(t, both, &out, &err), PG_EINVAL);
    chat_template_destroy(t);
    /* a template that trims the message: the cut is rstripped (transformers) */
    t = make("{% for m in messages %}{{ m.content | trim }}|{% endfor %}");
    assert_int_equal(render(t, "{\"messages\": [{\"role\": \"assistant\", \"content\": \"abc  \"}], \"continue_final_message\": true}",
                            &out, &err), 0);
    assert_string_equal(out, "abc");
    free(out);
    chat_template_destroy(t);
}

static void test_render_errors(void **state)
{
    (void)state;
    pg_error err = {{0}};
    char *out = NULL;
    chat_template *t = make("line one\n{% if messages | length > 0 %}{{ raise_exception('No messages allowed, sorry!') }}{% endif %}");
    assert_int_equal(render(t, SIMPLE, &out, &err), PG_EFORMAT);
    assert_non_null(strstr(err.msg, "No messages allowed, sorry!"));
    assert_non_null(strstr(err.msg, "line 2"));
    assert_null(out);
    /* the template is still usable after an error */
    assert_int_equal(render(t, "{\"messages\": []}", &out, &err), 0);
    assert_string_equal(out, "line one\n");
    free(out);
    chat_template_destroy(t);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Each hostile template must fail cleanly (PG_EFORMAT, naming the limit)
 * and quickly. */
static void expect_limit(const char *src, const char *what)
{
    pg_error err = {{0}};
    char *out = NULL;
    chat_template *t = NULL;
    double t0 = now_s();
    int rc = chat_template_create(&t, src, strlen(src), "t", NULL, NULL, &err);
    if (rc == 0) {
        rc = render(t, SIMPLE, &out, &err);
        chat_template_destroy(t);
    }
    double dt = now_s() - t0;
    if (rc != PG_EFORMAT || !strstr(err.msg, what))
        fprintf(stderr, "limit case %s: rc %d: %s\n", src, rc, rc ? err.msg : out);
    assert_int_equal(rc, PG_EFORMAT);
    assert_non_null(strstr(err.msg, what));
    assert_null(out);
    assert_true(dt < 30.0); /* generous: sanitizer builds on a loaded machine */
}

static void test_limits(void **state)
{
    (void)state;
    /* unbounded macro recursion */
    expect_limit("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion limit");
    /* nested loops: 1e15 iterations */
    expect_limit("{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}x{% endfor %}{% endfor %}{% endfor %}",
                 "limit");
    /* output doubling */
    expect_limit("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
                 "limit");
    expect_limit("{{ 'x' * 1000000000000 }}", "limit");
    /* the sandbox's range cap */
    expect_limit("{{ range(10000000) | length }}", "Range too big");
    /* deep nesting in the parser */
    char deep[4096];
    size_t k = 0;
    k += (size_t)snprintf(deep + k, sizeof deep - k, "{{ ");
    for (int i = 0; i < 1000; i++)
        deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 1000; i++)
        deep[k++] = ')';
    snprintf(deep + k, sizeof deep - k, " }}");
    expect_limit(deep, "nested too deeply");
    /* long left-deep chains */
    static char chain[300000];
    k = (size_t)snprintf(chain, sizeof chain, "{{ 1");
    for (int i = 0; i < 50000; i++)
        k += (size_t)snprintf(chain + k, sizeof chain - k, "+1");
    snprintf(chain + k, sizeof chain - k, " }}");
    expect_limit(chain, "nested too deeply");
    /* many nested blocks */
    static char blocks[200000];
    k = 0;
    for (int i = 0; i < 5000; i++)
        k += (size_t)snprintf(blocks + k, sizeof blocks - k, "{%% if true %%}");
    expect_limit(blocks, "nested too deeply");
    /* a value nested 100000 deep by a loop: printing it must not recurse unboundedly */
    expect_limit("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}"
                 "{{ ns.l == ns.l }}{{ ns.l }}",
                 "maximum recursion depth");
}

/* Long flat constructs are fine, and linear: 20000 elifs on one line (the
 * lexer once counted columns from the line start for every token). */
static void test_long_elif_chain(void **state)
{
    (void)state;
    size_t cap = 20000 * 40 + 200, k = 0;
    char *src = malloc(cap);
    assert_non_null(src);
    k += (size_t)snprintf(src + k, cap - k, "{%% set x = 19998 %%}{%% if x == 0 %%}a");
    for (int i = 1; i < 20000; i++)
        k += (size_t)snprintf(src + k, cap - k, "{%% elif x == %d %%}b%d", i, i);
    snprintf(src + k, cap - k, "{%% endif %%}");
    double t0 = now_s();
    chat_template *t = make(src);
    pg_error err = {{0}};
    char *out = NULL;
    assert_int_equal(render(t, SIMPLE, &out, &err), 0);
    assert_string_equal(out, "b19998");
    assert_true(now_s() - t0 < 10.0);
    free(out);
    chat_template_destroy(t);
    free(src);
}

/* A request object with 100000 keys fills its dict in linear time (hashed). */
static void test_big_object(void **state)
{
    (void)state;
    size_t cap = 100000 * 24 + 200, k = 0;
    char *req = malloc(cap);
    assert_non_null(req);
    k += (size_t)snprintf(req + k, cap - k, "{\"messages\": [], \"chat_template_kwargs\": {\"x\": {");
    for (int i = 0; i < 100000; i++)
        k += (size_t)snprintf(req + k, cap - k, "%s\"k%d\": %d", i ? ", " : "", i, i);
    snprintf(req + k, cap - k, "}}}");
    chat_template *t = make("{{ x | length }} {{ x['k99999'] }} {{ x.k5 }} {{ 'k7' in x }}");
    pg_error err = {{0}};
    char *out = NULL;
    double t0 = now_s();
    assert_int_equal(render(t, req, &out, &err), 0);
    assert_string_equal(out, "100000 99999 5 True");
    assert_true(now_s() - t0 < 10.0);
    free(out);
    chat_template_destroy(t);
    free(req);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_load_order, setup, teardown),
        cmocka_unit_test(test_request_variables),
        cmocka_unit_test(test_continue_final_message),
        cmocka_unit_test(test_render_errors),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_long_elif_chain),
        cmocka_unit_test(test_big_object),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
