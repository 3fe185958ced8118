/* tests/cli/test_cli_options: sizes, numbers, flags, help text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "device.h"
#include "options.h"

static void test_sizes(void **state)
{
    (void)state;
    struct { const char *s; uint64_t want; } ok[] = {
        {"2GiB", 2ull << 30}, {"512MiB", 512ull << 20}, {"512M", 512ull << 20}, {"1.5G", 3ull << 29},
        {"1000000", 1000000}, {"1KB", 1000}, {"1kib", 1024}, {"4096B", 4096}, {"2GB", 2000000000ull},
        {"1TiB", 1ull << 40},
    };
    for (size_t k = 0; k < sizeof ok / sizeof ok[0]; k++) {
        uint64_t v = 0;
        pg_error err;
        assert_int_equal(cli_parse_size(ok[k].s, &v, &err), PG_OK);
        assert_true(v == ok[k].want);
    }
    const char *bad[] = {"", "0", "-1GiB", "2XB", "GiB", "1e400", "2 GiB", "nan", "0.1B"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        uint64_t v = 7;
        pg_error err;
        assert_int_equal(cli_parse_size(bad[k], &v, &err), PG_EINVAL);
        assert_non_null(strstr(err.msg, "--kv-cache-memory"));
        assert_true(v == 7);
    }
}

static int parse(cli_options *o, pg_error *err, int argc, ...)
{
    char *argv[64];
    va_list ap;
    va_start(ap, argc);
    argv[0] = (char *)"pagedgen";
    for (int k = 1; k < argc; k++)
        argv[k] = va_arg(ap, char *);
    va_end(ap);
    argv[argc] = NULL;
    return cli_options_parse(o, argc, argv, err);
}

static void test_defaults_and_flags(void **state)
{
    (void)state;
    cli_options o;
    pg_error err;
    assert_int_equal(parse(&o, &err, 3, "-m", "dir"), PG_OK);
    assert_int_equal(o.cmd, CLI_CMD_GENERATE);
    assert_string_equal(o.model_dir, "dir");
    assert_string_equal(o.input_path, "-");
    assert_string_equal(o.output_path, "-");
    assert_int_equal(o.block_size, 16);
    assert_int_equal(o.max_num_seqs, 256);
    assert_int_equal(o.max_num_batched_tokens, 2048);
    assert_true(o.prefix_caching);
    assert_int_equal(o.sampling_set, 0);
    assert_int_equal(o.shard_n, 1);
    assert_true(o.gpu_memory_utilization == 0.9);
    assert_int_equal(o.kv_cache_dtype, CLI_KV_DTYPE_AUTO);
    assert_int_equal(o.dtype, CLI_DTYPE_AUTO);
    assert_int_equal(o.cuda_device, 0);
    assert_false(o.fast_gemm);

    assert_int_equal(parse(&o, &err, 20, "generate", "-m", "d", "--kv-cache-memory", "2GiB",
                           "--stop", "a", "--stop", "bb", "--temperature", "0.5", "--shard", "2/3",
                           "--no-prefix-caching", "--kv-layout", "contiguous", "-q", "--max-tokens", "-1"),
                     PG_OK);
    assert_true(o.kv_cache_bytes == 2ull << 30);
    assert_int_equal(o.n_stop, 2);
    assert_string_equal(o.stop[1], "bb");
    assert_true(o.sampling_set & CLI_SET_TEMPERATURE);
    assert_true(o.sampling.temperature == 0.5f);
    assert_int_equal(o.shard_k, 2);
    assert_int_equal(o.shard_n, 3);
    assert_false(o.prefix_caching);
    assert_int_equal(o.layout, KV_LAYOUT_CONTIGUOUS);
    assert_true(o.quiet);
    assert_int_equal(o.sampling.max_tokens, -1);

    assert_int_equal(parse(&o, &err, 4, "tokenize", "--tokenizer", "t"), PG_OK);
    assert_int_equal(o.cmd, CLI_CMD_TOKENIZE);
    assert_string_equal(o.tokenizer_dir, "t");
    assert_int_equal(parse(&o, &err, 2, "--version"), PG_OK);
    assert_int_equal(o.cmd, CLI_CMD_VERSION);
    assert_int_equal(parse(&o, &err, 3, "tokenize", "--help"), PG_OK);
    assert_int_equal(o.cmd, CLI_CMD_HELP);
    assert_int_equal(o.help_for, CLI_CMD_TOKENIZE);

    /* chat: the generate flags and the chat-template subcommand */
    assert_int_equal(parse(&o, &err, 7, "-m", "d", "--chat-template", "t.jinja", "--chat-template-date",
                           "2026-07-26"), PG_OK);
    assert_string_equal(o.chat_template_path, "t.jinja");
    assert_true(o.has_chat_date);
    assert_true(o.chat_date_unix == 1785067200); /* 2026-07-26T12:00:00Z */
    assert_int_equal(parse(&o, &err, 3, "-m", "d"), PG_OK);
    assert_null(o.chat_template_path);
    assert_false(o.has_chat_date);
    assert_int_equal(parse(&o, &err, 8, "chat-template", "--tokenizer", "t", "-i", "in", "--chat-template",
                           "f"), PG_OK);
    assert_int_equal(o.cmd, CLI_CMD_CHAT_TEMPLATE);
    assert_string_equal(o.tokenizer_dir, "t");
    assert_string_equal(o.input_path, "in");
    assert_string_equal(o.chat_template_path, "f");
    assert_int_equal(parse(&o, &err, 4, "chat-template", "-m", "mdir"), PG_OK);
    assert_string_equal(o.tokenizer_dir, "mdir");
    assert_int_equal(parse(&o, &err, 3, "chat-template", "--help"), PG_OK);
    assert_int_equal(o.cmd, CLI_CMD_HELP);
    assert_int_equal(o.help_for, CLI_CMD_CHAT_TEMPLATE);
    assert_int_equal(parse(&o, &err, 3, "help", "chat-template"), PG_OK);
    assert_int_equal(o.help_for, CLI_CMD_CHAT_TEMPLATE);
}

/* --generation-config auto|vllm (auto by default) and --reasoning-parser */
static void test_generation_config_and_reasoning(void **state)
{
    (void)state;
    cli_options o;
    pg_error err;
    assert_int_equal(parse(&o, &err, 3, "-m", "d"), PG_OK);
    assert_true(o.generation_config_defaults);
    assert_int_equal(o.reasoning_parser, CLI_REASONING_NONE);
    assert_int_equal(parse(&o, &err, 5, "-m", "d", "--generation-config", "vllm"), PG_OK);
    assert_false(o.generation_config_defaults);
    assert_int_equal(parse(&o, &err, 7, "-m", "d", "--generation-config", "vllm", "--generation-config", "auto"),
                     PG_OK);
    assert_true(o.generation_config_defaults);
    assert_int_equal(parse(&o, &err, 5, "-m", "d", "--reasoning-parser", "qwen3"), PG_OK);
    assert_int_equal(o.reasoning_parser, CLI_REASONING_QWEN3);
    assert_int_equal(parse(&o, &err, 5, "-m", "d", "--reasoning-parser", "deepseek_r1"), PG_OK);
    assert_int_equal(o.reasoning_parser, CLI_REASONING_DEEPSEEK_R1);
}

static void test_dates(void **state)
{
    (void)state;
    pg_error err;
    int64_t t = 0;
    struct { const char *s; int64_t want; } good[] = {
        {"1970-01-01", 43200}, {"2000-02-29", 951825600}, {"2026-07-26", 1785067200},
        {"2024-12-31", 1735646400}, {"9999-12-31", 253402257600},
    };
    for (size_t k = 0; k < sizeof good / sizeof good[0]; k++) {
        assert_int_equal(cli_parse_date(good[k].s, &t, &err), PG_OK);
        if (t != good[k].want)
            fail_msg("%s -> %lld, expected %lld", good[k].s, (long long)t, (long long)good[k].want);
    }
    const char *bad[] = {"", "2026-7-26", "2026-07-26T00", "1969-12-31", "2026-13-01", "2026-00-10",
                         "2026-02-29", "1900-02-29", "2026-04-31", "2026-07-00", "2026/07/26", "+026-07-26",
                         "２０２６-07-26"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        if (cli_parse_date(bad[k], &t, &err) != PG_EINVAL)
            fail_msg("'%s' accepted", bad[k]);
        assert_non_null(strstr(err.msg, "--chat-template-date: expected a day as YYYY-MM-DD"));
    }
}

static void test_cuda_flags(void **state)
{
    (void)state;
    cli_options o;
    pg_error err;
    assert_int_equal(parse(&o, &err, 12, "-m", "d", "--gpu-memory-utilization", "0.5", "--kv-cache-dtype",
                           "fp16", "--dtype", "bfloat16", "--cuda-device", "3", "--fast-gemm"),
                     PG_OK);
    assert_true(o.gpu_memory_utilization == 0.5);
    assert_int_equal(o.kv_cache_dtype, CLI_KV_DTYPE_FP16);
    assert_int_equal(o.dtype, CLI_DTYPE_BF16);
    assert_int_equal(o.cuda_device, 3);
    assert_true(o.fast_gemm);
    assert_int_equal(parse(&o, &err, 5, "-m", "d", "--gpu-memory-utilization", "1"), PG_OK);
    assert_true(o.gpu_memory_utilization == 1.0);

    /* the accepted spellings and combinations */
    struct { int argc; const char *a[8]; cli_kv_dtype kv; cli_dtype dt; } ok[] = {
        {7, {"-m", "d", "--device", "cpu", "--kv-cache-dtype", "f32"}, CLI_KV_DTYPE_F32, CLI_DTYPE_AUTO},
        {7, {"-m", "d", "--device", "cpu", "--dtype", "float32"}, CLI_KV_DTYPE_AUTO, CLI_DTYPE_F32},
        {7, {"-m", "d", "--device", "cpu", "--kv-cache-dtype", "auto"}, CLI_KV_DTYPE_AUTO, CLI_DTYPE_AUTO},
        /* auto may still pick the cpu, which takes every cache type */
        {5, {"-m", "d", "--kv-cache-dtype", "f32"}, CLI_KV_DTYPE_F32, CLI_DTYPE_AUTO},
        {7, {"-m", "d", "--device", "cpu", "--kv-cache-dtype", "bf16"}, CLI_KV_DTYPE_BF16, CLI_DTYPE_AUTO},
        {7, {"-m", "d", "--device", "cpu", "--kv-cache-dtype", "f16"}, CLI_KV_DTYPE_FP16, CLI_DTYPE_AUTO},
        {7, {"-m", "d", "--device", "cpu", "--dtype", "bf16"}, CLI_KV_DTYPE_AUTO, CLI_DTYPE_BF16},
        {9, {"-m", "d", "--device", "cpu", "--dtype", "f32", "--kv-cache-dtype", "bf16"}, CLI_KV_DTYPE_BF16,
         CLI_DTYPE_F32},
        {9, {"-m", "d", "--device", "cpu", "--dtype", "bf16", "--kv-cache-dtype", "f32"}, CLI_KV_DTYPE_F32,
         CLI_DTYPE_BF16},
        {5, {"-m", "d", "--kv-cache-dtype", "bf16"}, CLI_KV_DTYPE_BF16, CLI_DTYPE_AUTO},
        {5, {"-m", "d", "--kv-cache-dtype", "bfloat16"}, CLI_KV_DTYPE_BF16, CLI_DTYPE_AUTO},
        {5, {"-m", "d", "--kv-cache-dtype", "float16"}, CLI_KV_DTYPE_FP16, CLI_DTYPE_AUTO},
        {9, {"-m", "d", "--device", "cuda", "--dtype", "float32", "--kv-cache-dtype", "fp32"},
         CLI_KV_DTYPE_F32, CLI_DTYPE_F32},
        {7, {"-m", "d", "--device", "cuda", "--kv-cache-dtype", "fp16"}, CLI_KV_DTYPE_FP16, CLI_DTYPE_AUTO},
        {7, {"-m", "d", "--device", "cuda", "--dtype", "bf16"}, CLI_KV_DTYPE_AUTO, CLI_DTYPE_BF16},
    };
    for (size_t k = 0; k < sizeof ok / sizeof ok[0]; k++) {
        char *argv[10] = {(char *)"pagedgen"};
        for (int j = 0; j < ok[k].argc - 1; j++)
            argv[j + 1] = (char *)ok[k].a[j];
        int rc = cli_options_parse(&o, ok[k].argc, argv, &err);
        if (rc != PG_OK)
            fail_msg("case %zu: %s", k, err.msg);
        assert_int_equal(o.kv_cache_dtype, ok[k].kv);
        assert_int_equal(o.dtype, ok[k].dt);
    }
    assert_string_equal(cli_kv_dtype_name(CLI_KV_DTYPE_FP16), "fp16");
    assert_string_equal(cli_dtype_name(CLI_DTYPE_BF16), "bfloat16");

    /* the same options checked again once the device is known (device.c) */
    assert_int_equal(parse(&o, &err, 5, "-m", "d", "--kv-cache-dtype", "f32"), PG_OK);
    assert_int_equal(cli_options_check_dtypes(&o, "cpu", &err), PG_OK);
    assert_int_equal(cli_options_check_dtypes(&o, "cuda", &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "--dtype float32"));
    assert_int_equal(parse(&o, &err, 5, "-m", "d", "--kv-cache-dtype", "fp16"), PG_OK);
    assert_int_equal(cli_options_check_dtypes(&o, "cuda", &err), PG_OK);
    assert_int_equal(cli_options_check_dtypes(&o, "cpu", &err), PG_OK);
    assert_int_equal(parse(&o, &err, 5, "-m", "d", "--dtype", "bfloat16"), PG_OK);
    assert_int_equal(cli_options_check_dtypes(&o, "cuda", &err), PG_OK);
    assert_int_equal(cli_options_check_dtypes(&o, "cpu", &err), PG_OK);
    /* f32 weights with a 16-bit cache: the cpu stores it, cuda cannot */
    assert_int_equal(parse(&o, &err, 7, "-m", "d", "--dtype", "float32", "--kv-cache-dtype", "bf16"), PG_OK);
    assert_int_equal(cli_options_check_dtypes(&o, "cpu", &err), PG_OK);
    assert_int_equal(cli_options_check_dtypes(&o, "cuda", &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "on cuda with --dtype float32"));
    /* int8 weights: cpu only */
    assert_int_equal(parse(&o, &err, 5, "-m", "d", "--quantization", "int8"), PG_OK);
    assert_int_equal(o.quantization, CLI_QUANT_INT8);
    assert_int_equal(cli_options_check_dtypes(&o, "cpu", &err), PG_OK);
    assert_int_equal(cli_options_check_dtypes(&o, "cuda", &err), PG_EINVAL);
    assert_non_null(strstr(err.msg, "--quantization int8"));
}

/* --device cuda:LIST / cuda:all (multi_device.c): the list, its refusals */
static void test_device_lists(void **state)
{
    (void)state;
    cli_options o;
    pg_error err;
    assert_int_equal(parse(&o, &err, 7, "-m", "d", "-i", "f", "--device", "cuda:0,2,1"), PG_OK);
    assert_string_equal(o.device, "cuda");
    assert_int_equal(o.n_devices, 3);
    assert_int_equal(o.devices[0], 0);
    assert_int_equal(o.devices[1], 2);
    assert_int_equal(o.devices[2], 1);
    assert_false(o.devices_all);
    assert_int_equal(parse(&o, &err, 7, "-m", "d", "-i", "f", "--device", "cuda:all"), PG_OK);
    assert_true(o.devices_all);
    assert_int_equal(o.n_devices, 0);
    /* cuda:N alone: the usual one-device run on N */
    assert_int_equal(parse(&o, &err, 7, "-m", "d", "-i", "f", "--device", "cuda:3"), PG_OK);
    assert_int_equal(o.n_devices, 0);
    assert_int_equal(o.cuda_device, 3);
    assert_false(o.devices_all);
    /* a later --device replaces the list */
    assert_int_equal(parse(&o, &err, 9, "-m", "d", "-i", "f", "--device", "cuda:0,1", "--device", "cpu"), PG_OK);
    assert_int_equal(o.n_devices, 0);
    assert_string_equal(o.device, "cpu");
    struct { const char *dev, *want; } bad[] = {
        {"cuda:0,0", "listed twice"}, {"cuda:x", "expected cuda:all or a list"}, {"cuda:", "expected cuda:all"},
        {"cuda:1,", "expected cuda:all"}, {"cuda:,1", "expected cuda:all"}, {"cuda:-1", "expected cuda:all"},
        {"cuda:1024", "expected cuda:all"}, {"cuda:0;1", "expected cuda:all"}, {"cuda: 1", "expected cuda:all"},
        {"cuda:ALL", "expected cuda:all"}, {"gpu:0", "expected auto, cpu, cuda"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        assert_int_equal(parse(&o, &err, 7, "-m", "d", "-i", "f", "--device", bad[k].dev), PG_EINVAL);
        if (!strstr(err.msg, bad[k].want))
            fail_msg("--device %s: %s", bad[k].dev, err.msg);
    }
    /* the workers read the input each: not stdin; no --shard with a list */
    assert_int_equal(parse(&o, &err, 5, "-m", "d", "--device", "cuda:0,1"), PG_EINVAL);
    assert_non_null(strstr(err.msg, "give -i FILE"));
    assert_int_equal(parse(&o, &err, 9, "-m", "d", "-i", "f", "--device", "cuda:all", "--shard", "0/2"), PG_EINVAL);
    assert_non_null(strstr(err.msg, "--shard"));
    assert_int_equal(parse(&o, &err, 8, "perplexity", "-m", "d", "-f", "t", "--device", "cuda:0,1"), PG_EINVAL);
    assert_non_null(strstr(err.msg, "one device"));
    assert_int_equal(parse(&o, &err, 8, "perplexity", "-m", "d", "-f", "t", "--device", "cuda:1"), PG_OK);
    assert_int_equal(o.cuda_device, 1);
}

static void test_usage_errors(void **state)
{
    (void)state;
    cli_options o;
    pg_error err;
    struct { int argc; const char *a[8]; const char *msg; } bad[] = {
        {0, {NULL}, "-m MODEL_DIR is required"},
        {3, {"-m", "d", "--bogus"}, "unknown option"},
        {4, {"-m", "d", "--block-size", "12"}, "power of two"},
        {4, {"-m", "d", "--top-p", "0"}, "--top-p"},
        {4, {"-m", "d", "--shard", "3/3"}, "--shard"},
        {4, {"-m", "d", "--device", "tpu"}, "--device"},
        {4, {"-m", "d", "--max-tokens", "0"}, "--max-tokens"},
        {4, {"-m", "d", "--generation-config", "hf"}, "--generation-config: expected auto or vllm, got 'hf'"},
        {4, {"-m", "d", "--reasoning-parser", "granite"}, "--reasoning-parser: expected qwen3 or deepseek_r1"},
        {4, {"-m", "d", "--threads", "x"}, "--threads"},
        {3, {"-m", "d", "--resume"}, "--resume needs -o FILE"},
        {1, {"frobnicate"}, "unknown command"},
        {3, {"-m", "d", "extra"}, "unexpected argument"},
        {2, {"tokenize", "--input-format=openai"}, "--input-format"},
        {4, {"-m", "d", "--chat-template-date", "2026-02-30"}, "--chat-template-date"},
        {1, {"chat-template"}, "chat-template: --tokenizer DIR is required"},
        {4, {"chat-template", "--tokenizer", "t", "--max-tokens=3"}, "unknown option"},
        {4, {"chat-template", "--tokenizer", "t", "-q"}, "unknown option"},
        {2, {"-m", "--temperature"}, NULL},
        {4, {"-m", "d", "--gpu-memory-utilization", "0"}, "--gpu-memory-utilization: expected a number in (0, 1]"},
        {4, {"-m", "d", "--gpu-memory-utilization", "1.01"}, "--gpu-memory-utilization"},
        {4, {"-m", "d", "--gpu-memory-utilization", "-0.5"}, "--gpu-memory-utilization"},
        {4, {"-m", "d", "--gpu-memory-utilization", "90%"}, "--gpu-memory-utilization"},
        {4, {"-m", "d", "--gpu-memory-utilization", "nan"}, "--gpu-memory-utilization"},
        {4, {"-m", "d", "--kv-cache-dtype", "int8"}, "--kv-cache-dtype: expected auto, bf16, fp16 or f32"},
        {4, {"-m", "d", "--dtype", "half"}, "--dtype: expected auto, bfloat16 or float32"},
        {4, {"-m", "d", "--cuda-device", "-1"}, "--cuda-device"},
        {4, {"-m", "d", "--cuda-device", "x"}, "--cuda-device"},
        {4, {"-m", "d", "--quantization", "fp8"}, "--quantization: expected int8 or none"},
        {6, {"-m", "d", "--quantization", "int8", "--dtype", "bf16"}, "expected --dtype auto"},
        {6, {"-m", "d", "--device", "cuda", "--quantization", "int8"}, "only the cpu executor quantizes"},
        {8, {"-m", "d", "--device", "cuda", "--dtype", "float32", "--kv-cache-dtype", "fp16"},
         "on cuda with --dtype float32 the kv cache is f32"},
        {6, {"-m", "d", "--device", "cuda", "--kv-cache-dtype", "f32"}, "needs --dtype float32"},
        {8, {"-m", "d", "--device", "cuda", "--dtype", "bfloat16", "--kv-cache-dtype", "f32"}, "needs --dtype float32"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char *argv[10] = {(char *)"pagedgen"};
        for (int j = 0; j < bad[k].argc; j++)
            argv[j + 1] = (char *)bad[k].a[j];
        int rc = cli_options_parse(&o, bad[k].argc + 1, argv, &err);
        if (!bad[k].msg) {
            /* "-m --temperature": the model dir is "--temperature"; fine */
            continue;
        }
        assert_int_equal(rc, PG_EINVAL);
        if (!strstr(err.msg, bad[k].msg))
            fail_msg("case %zu: '%s' does not mention '%s'", k, err.msg, bad[k].msg);
    }
}

static void check_help_lists(cli_command cmd)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    cli_options_help(f, cmd);
    fclose(f);
    const char *const *names = cli_options_names(cmd);
    size_t n = 0;
    for (; names[n]; n++) {
        char flag[64];
        snprintf(flag, sizeof flag, "--%s", names[n]);
        if (!strstr(buf, flag))
            fail_msg("help of command %d does not list %s", (int)cmd, flag);
    }
    assert_true(n > 5);
    /* every flag with a value states its default */
    assert_non_null(strstr(buf, "[default:"));
    free(buf);
}

static void test_help_lists_every_flag(void **state)
{
    (void)state;
    check_help_lists(CLI_CMD_GENERATE);
    check_help_lists(CLI_CMD_TOKENIZE);
    check_help_lists(CLI_CMD_CHAT_TEMPLATE);
}

static void test_kv_blocks_arithmetic(void **state)
{
    (void)state;
    assert_int_equal(cli_kv_blocks_for(1000, 100, 0), 10);
    assert_int_equal(cli_kv_blocks_for(1099, 100, 0), 10);
    assert_int_equal(cli_kv_blocks_for(1000, 100, 4), 4);
    assert_int_equal(cli_kv_blocks_for(1000, 0, 0), 0);
    assert_int_equal(cli_kv_blocks_for(UINT64_MAX, 1, 0), INT32_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_defaults_and_flags),
        cmocka_unit_test(test_cuda_flags),
        cmocka_unit_test(test_device_lists),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_generation_config_and_reasoning),
        cmocka_unit_test(test_dates),
        cmocka_unit_test(test_help_lists_every_flag),
        cmocka_unit_test(test_kv_blocks_arithmetic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
