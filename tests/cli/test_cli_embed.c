/* tests/cli/test_cli_embed: embedding lines (request_embed.h) and their
 * records (embed_output.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "embed_output.h"
#include "embed_prepare.h"
#include "request_parse.h"

static int parse(cli_request *r, const char *line, cli_format fmt, bool strict, pg_error *err)
{
    sampling_params d = sampling_params_default();
    return cli_request_parse_ex(r, line, strlen(line), fmt, 0, 1, &d, 1, strict, err);
}

static void test_input_forms(void **state)
{
    (void)state;
    cli_request r;
    pg_error err;
    /* a string (jsonl: a line with "input") */
    assert_int_equal(parse(&r, "{\"id\": 3, \"input\": \"hello\"}", CLI_FORMAT_JSONL, true, &err), PG_OK);
    assert_non_null(r.embed);
    assert_null(r.prompt);
    assert_int_equal(r.embed->n_inputs, 1);
    assert_string_equal(r.embed->texts[0], "hello");
    assert_true(r.embed->add_special_tokens);
    assert_int_equal(r.embed->normalize, -1);
    assert_string_equal(r.id_json, "3");
    cli_request_free(&r);
    /* a list of strings, base64, dimensions, normalize, add_special_tokens */
    assert_int_equal(parse(&r, "{\"custom_id\": \"x\", \"method\": \"POST\", \"url\": \"/v1/embeddings\", \"body\": "
                               "{\"model\": \"m\", \"input\": [\"a\", \"b c\"], \"encoding_format\": \"base64\", "
                               "\"dimensions\": 8, \"normalize\": false, \"add_special_tokens\": false, \"user\": null}}",
                           CLI_FORMAT_OPENAI, true, &err), PG_OK);
    assert_int_equal(r.embed->n_inputs, 2);
    assert_string_equal(r.embed->texts[1], "b c");
    assert_true(r.embed->base64);
    assert_int_equal(r.embed->dimensions, 8);
    assert_int_equal(r.embed->normalize, 0);
    assert_false(r.embed->add_special_tokens);
    assert_string_equal(r.model, "m");
    cli_request_free(&r);
    /* a list of ids; a list of lists of ids */
    assert_int_equal(parse(&r, "{\"input\": [1, 2, 3]}", CLI_FORMAT_JSONL, true, &err), PG_OK);
    assert_int_equal(r.embed->n_inputs, 1);
    assert_int_equal(r.embed->n_ids[0], 3);
    assert_int_equal(r.embed->ids[0][2], 3);
    cli_request_free(&r);
    assert_int_equal(parse(&r, "{\"input\": [[1, 2], [7]]}", CLI_FORMAT_JSONL, true, &err), PG_OK);
    assert_int_equal(r.embed->n_inputs, 2);
    assert_int_equal(r.embed->n_ids[1], 1);
    assert_int_equal(r.embed->ids[1][0], 7);
    assert_null(r.embed->texts[1]);
    cli_request_free(&r);
}

static void expect_error(const char *line, cli_format fmt, const char *want)
{
    cli_request r;
    pg_error err;
    assert_int_equal(parse(&r, line, fmt, true, &err), PG_EINVAL);
    printf("    %s\n", err.msg);
    assert_non_null(strstr(err.msg, want));
    cli_request_free(&r);
}

static void test_bad_lines(void **state)
{
    (void)state;
    expect_error("{\"input\": 5}", CLI_FORMAT_JSONL, "field 'input': expected a string");
    expect_error("{\"input\": []}", CLI_FORMAT_JSONL, "field 'input': empty list");
    expect_error("{\"input\": \"\"}", CLI_FORMAT_JSONL, "empty string");
    expect_error("{\"input\": [\"a\", 3]}", CLI_FORMAT_JSONL, "every element must be a string");
    expect_error("{\"input\": [[1], [-2]]}", CLI_FORMAT_JSONL, "input[1]': element 0: expected a token id");
    expect_error("{\"input\": [[]]}", CLI_FORMAT_JSONL, "input[0]': empty list of token ids");
    expect_error("{\"input\": \"a\", \"encoding_format\": \"int8\"}", CLI_FORMAT_JSONL, "\"float\" or \"base64\"");
    expect_error("{\"input\": \"a\", \"dimensions\": 0}", CLI_FORMAT_JSONL, "Dimensions must be greater than 0");
    expect_error("{\"input\": \"a\", \"temperature\": 0.5}", CLI_FORMAT_JSONL, "unknown field 'temperature'");
    expect_error("{\"input\": \"a\", \"input\": \"b\"}", CLI_FORMAT_JSONL, "'input' given twice");
    expect_error("{\"custom_id\": \"x\", \"method\": \"POST\", \"url\": \"/v1/embeddings\", \"body\": {\"model\": \"m\"}}",
                 CLI_FORMAT_OPENAI, "body: missing 'input'");
    expect_error("{\"custom_id\": \"x\", \"method\": \"POST\", \"url\": \"/v1/score\", \"body\": {}}", CLI_FORMAT_OPENAI,
                 "\"/v1/embeddings\"");
    /* lax: an unknown field is ignored and counted */
    cli_request r;
    pg_error err;
    assert_int_equal(parse(&r, "{\"input\": \"a\", \"priority\": 0}", CLI_FORMAT_JSONL, false, &err), PG_OK);
    assert_int_equal(r.n_lax, 1);
    cli_request_free(&r);
}

/* base64 of f32 little-endian bytes: values checked against Python's
 * base64.b64encode(np.array([...], dtype="<f4").tobytes()). */
static void test_base64(void **state)
{
    (void)state;
    const float v[3] = {1.0f, -2.5f, 0.1f};
    json_buf b = {0};
    cli_put_base64_f32(&b, v, 1);
    assert_string_equal(b.data, "AACAPw==");
    json_buf_free(&b);
    memset(&b, 0, sizeof b);
    cli_put_base64_f32(&b, v, 3);
    assert_string_equal(b.data, "AACAPwAAIMDNzMw9");
    json_buf_free(&b);
}

static void test_records(void **state)
{
    (void)state;
    float a[2] = {0.6f, -0.8f}, c[2] = {1.0f, 0.0f};
    float *vs[2] = {a, c};
    cli_pending g = {.id_json = "\"q\"", .line = 4, .n_embed = 2, .emb = vs, .emb_dim = 2,
                     .emb_prompt_tokens = 7};
    cli_output_ctx ctx = {.fmt = CLI_FORMAT_JSONL, .model_name = "m"};
    json_buf b = {0};
    cli_output_embedding(&b, &ctx, &g);
    assert_string_equal(b.data, "{\"id\":\"q\",\"data\":[{\"index\":0,\"embedding\":[0.600000024,-0.800000012]},"
                                "{\"index\":1,\"embedding\":[1,0]}],\"usage\":{\"prompt_tokens\":7,"
                                "\"completion_tokens\":0}}\n");
    json_buf_free(&b);
    memset(&b, 0, sizeof b);
    ctx.fmt = CLI_FORMAT_OPENAI;
    g.n_embed = 1;
    g.emb_base64 = true;
    cli_output_embedding(&b, &ctx, &g);
    printf("    %s", b.data);
    assert_non_null(strstr(b.data, "\"custom_id\":\"q\",\"response\":{\"status_code\":200,"));
    assert_non_null(strstr(b.data, "\"body\":{\"id\":\"embd-"));
    assert_non_null(strstr(b.data, "\"object\":\"list\",\"created\":0,\"model\":\"m\",\"data\":[{\"index\":0,"
                                   "\"object\":\"embedding\",\"embedding\":\"mpkZP83MTL8=\"}],\"usage\":"
                                   "{\"prompt_tokens\":7,\"total_tokens\":7,\"completion_tokens\":0,"
                                   "\"prompt_tokens_details\":null}}},\"error\":null}\n"));
    json_buf_free(&b);
}

/* The run's pooling and a line's parameters against the model (vLLM's
 * PoolingParams checks and messages). */
static void test_params(void **state)
{
    (void)state;
    st_pooling_config none = {0}, st = {.has_modules = true, .mode = ST_POOL_MEAN, .normalize = false};
    pooling_params p;
    const char *src;
    cli_embed_default_pooling(CLI_POOLING_AUTO, &none, &p, &src);
    assert_int_equal(p.type, POOLING_LAST);
    assert_true(p.normalize);
    assert_non_null(strstr(src, "vLLM's default"));
    cli_embed_default_pooling(CLI_POOLING_AUTO, &st, &p, &src);
    assert_int_equal(p.type, POOLING_MEAN);
    assert_false(p.normalize);
    cli_embed_default_pooling(CLI_POOLING_CLS, &st, &p, &src);
    assert_int_equal(p.type, POOLING_CLS);
    assert_false(p.normalize); /* --pooling changes the pooling, not the Normalize module */
    assert_string_equal(src, "--pooling");

    cli_embed em = {.dimensions = 8, .normalize = -1};
    pooling_params base = {.type = POOLING_LAST, .normalize = true}, out;
    char msg[256];
    const char *bad = cli_embed_line_params(&em, &base, &none, 64, "m", &out, msg, sizeof msg);
    assert_non_null(bad);
    assert_string_equal(bad, "Model \"m\" does not support matryoshka representation, changing output dimensions "
                             "will lead to poor results.");
    st_pooling_config mat = {.is_matryoshka = true, .matryoshka_dims = {16, 32}, .n_matryoshka_dims = 2};
    bad = cli_embed_line_params(&em, &base, &mat, 64, "m", &out, msg, sizeof msg);
    assert_string_equal(bad, "Model \"m\" only supports [16, 32] matryoshka dimensions, use other output "
                             "dimensions will lead to poor results.");
    em.dimensions = 32;
    em.normalize = 0;
    assert_null(cli_embed_line_params(&em, &base, &mat, 64, "m", &out, msg, sizeof msg));
    assert_int_equal(out.dimensions, 32);
    assert_false(out.normalize);
    st_pooling_config any = {.is_matryoshka = true};
    em.dimensions = 65;
    assert_non_null(cli_embed_line_params(&em, &base, &any, 64, "m", &out, msg, sizeof msg));
    printf("    %s\n", msg);

    /* token ids: vocabulary, length, a text without a tokenizer */
    int32_t ids0[3] = {1, 2, 70}, *ids;
    int32_t *idv[1] = {ids0}, nid[1] = {3};
    char *texts[1] = {NULL};
    size_t tl[1] = {0};
    cli_embed e2 = {.n_inputs = 1, .texts = texts, .text_lens = tl, .ids = idv, .n_ids = nid};
    int32_t n;
    pg_error err;
    assert_int_equal(cli_embed_input_ids(&e2, 0, NULL, 64, 16, &ids, &n, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "input[0]: token id 70 is outside the vocabulary (size 64)"));
    assert_int_equal(cli_embed_input_ids(&e2, 0, NULL, 128, 3, &ids, &n, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "too long: 3 tokens, but max_model_len is 3"));
    assert_int_equal(cli_embed_input_ids(&e2, 0, NULL, 128, 4, &ids, &n, &err), PG_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[2], 70);
    free(ids);
    char t[] = "hi";
    texts[0] = t;
    tl[0] = 2;
    idv[0] = NULL;
    assert_int_equal(cli_embed_input_ids(&e2, 0, NULL, 128, 4, &ids, &n, &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "needs a tokenizer"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_input_forms),
        cmocka_unit_test(test_bad_lines),
        cmocka_unit_test(test_base64),
        cmocka_unit_test(test_records),
        cmocka_unit_test(test_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
