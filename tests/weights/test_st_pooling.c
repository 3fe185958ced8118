/* tests/weights/test_st_pooling: sentence-transformers files (st_pooling.h)
 * as Qwen3-Embedding, e5-mistral and a mean-pooling model ship them, plus
 * refusals; st_pooling_load over a folder with and without them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "st_pooling.h"

/* modules.json of Qwen3-Embedding-0.6B (and e5-mistral-7b-instruct) */
static const char *MODULES =
    "[{\"idx\": 0, \"name\": \"0\", \"path\": \"\", \"type\": \"sentence_transformers.models.Transformer\"},"
    " {\"idx\": 1, \"name\": \"1\", \"path\": \"1_Pooling\", \"type\": \"sentence_transformers.models.Pooling\"},"
    " {\"idx\": 2, \"name\": \"2\", \"path\": \"2_Normalize\", \"type\": \"sentence_transformers.models.Normalize\"}]";
static const char *POOL_LAST =
    "{\"word_embedding_dimension\": 1024, \"pooling_mode_cls_token\": false, \"pooling_mode_mean_tokens\": false,"
    " \"pooling_mode_max_tokens\": false, \"pooling_mode_mean_sqrt_len_tokens\": false,"
    " \"pooling_mode_weightedmean_tokens\": false, \"pooling_mode_lasttoken\": true, \"include_prompt\": true}";

static void test_parse(void **state)
{
    (void)state;
    st_pooling_config c;
    memset(&c, 0, sizeof c);
    char *path = NULL;
    pg_error err;
    assert_int_equal(st_pooling_parse_modules(&c, &path, MODULES, strlen(MODULES), "modules.json", &err), PG_OK);
    assert_true(c.has_modules);
    assert_true(c.normalize);
    assert_string_equal(path, "1_Pooling");
    free(path);
    assert_int_equal(st_pooling_parse_pooling(&c, POOL_LAST, strlen(POOL_LAST), "p", &err), PG_OK);
    assert_int_equal(c.mode, ST_POOL_LAST);
    const char *mean = "{\"pooling_mode_cls_token\": false, \"pooling_mode_mean_tokens\": true}";
    assert_int_equal(st_pooling_parse_pooling(&c, mean, strlen(mean), "p", &err), PG_OK);
    assert_int_equal(c.mode, ST_POOL_MEAN);
    const char *cls = "{\"pooling_mode_cls_token\": true, \"pooling_mode_mean_tokens\": true}";
    assert_int_equal(st_pooling_parse_pooling(&c, cls, strlen(cls), "p", &err), PG_OK);
    assert_int_equal(c.mode, ST_POOL_CLS); /* the first true one, as vLLM */
    const char *mx = "{\"pooling_mode_max_tokens\": true}";
    assert_int_equal(st_pooling_parse_pooling(&c, mx, strlen(mx), "p", &err), PG_EUNSUPPORTED);
    printf("    %s\n", err.msg);
    const char *none = "{\"pooling_mode_max_tokens\": false}";
    assert_int_equal(st_pooling_parse_pooling(&c, none, strlen(none), "p", &err), PG_EFORMAT);
    printf("    %s\n", err.msg);
    const char *bad = "[{\"type\": 3}]";
    assert_int_equal(st_pooling_parse_modules(&c, &path, bad, strlen(bad), "modules.json", &err), PG_EFORMAT);
    assert_null(path);
    const char *escape = "[{\"type\": \"sentence_transformers.models.Pooling\", \"path\": \"../x\"}]";
    assert_int_equal(st_pooling_parse_modules(&c, &path, escape, strlen(escape), "modules.json", &err), PG_EFORMAT);
    printf("    %s\n", err.msg);
    /* Matryoshka keys of config.json */
    st_pooling_config m;
    memset(&m, 0, sizeof m);
    const char *cfg = "{\"hidden_size\": 8, \"matryoshka_dimensions\": [2, 4, 8]}";
    assert_int_equal(st_pooling_parse_matryoshka(&m, cfg, strlen(cfg), "config.json", &err), PG_OK);
    assert_true(m.is_matryoshka);
    assert_int_equal(m.n_matryoshka_dims, 3);
    assert_int_equal(m.matryoshka_dims[2], 8);
    memset(&m, 0, sizeof m);
    const char *cfg2 = "{\"is_matryoshka\": true}";
    assert_int_equal(st_pooling_parse_matryoshka(&m, cfg2, strlen(cfg2), "config.json", &err), PG_OK);
    assert_true(m.is_matryoshka);
    assert_int_equal(m.n_matryoshka_dims, 0);
    const char *cfg3 = "{\"matryoshka_dimensions\": [0]}";
    assert_int_equal(st_pooling_parse_matryoshka(&m, cfg3, strlen(cfg3), "config.json", &err), PG_EFORMAT);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_load(void **state)
{
    (void)state;
    char dir[] = "/tmp/pg_test_st_pooling_XXXXXX", p[256];
    assert_non_null(mkdtemp(dir));
    st_pooling_config c;
    pg_error err;
    /* no files at all: nothing, no error */
    assert_int_equal(st_pooling_load(&c, dir, &err), PG_OK);
    assert_false(c.has_modules);
    assert_int_equal(c.mode, ST_POOL_NONE);
    snprintf(p, sizeof p, "%s/modules.json", dir);
    write_file(p, MODULES);
    /* modules.json naming a Pooling folder that is missing: an error naming it */
    assert_int_not_equal(st_pooling_load(&c, dir, &err), PG_OK);
    printf("    %s\n", err.msg);
    assert_non_null(strstr(err.msg, "1_Pooling/config.json"));
    snprintf(p, sizeof p, "%s/1_Pooling", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/1_Pooling/config.json", dir);
    write_file(p, POOL_LAST);
    snprintf(p, sizeof p, "%s/config.json", dir);
    write_file(p, "{\"is_matryoshka\": true}");
    assert_int_equal(st_pooling_load(&c, dir, &err), PG_OK);
    assert_int_equal(c.mode, ST_POOL_LAST);
    assert_true(c.normalize);
    assert_true(c.is_matryoshka);
    unlink(p);
    snprintf(p, sizeof p, "%s/1_Pooling/config.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/1_Pooling", dir);
    rmdir(p);
    snprintf(p, sizeof p, "%s/modules.json", dir);
    unlink(p);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
