/* tests/cli/test_cli_device: executor choice from the flags, and the KV pool
 * planning of cli_model_create. The measured cuda default is run on a fake
 * device — the CPU executor renamed "cuda", with a memory meter over its
 * alloc/free and a made-up total — so the measure/destroy/recreate path,
 * its arithmetic and its out-of-memory message are checked without a GPU
 * (stories260K from the shared test data). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config.h"
#include "cpu_executor.h"
#include "cpu_wt.h"
#include "cuda_loader.h"
#include "device.h"
#include "model.h"
#include "step_batch.h"
#include "options.h"
#include "safetensors.h"
#include "test_support.h"

static int parse(cli_options *o, int argc, ...)
{
    char *argv[32];
    va_list ap;
    va_start(ap, argc);
    argv[0] = (char *)"pagedgen";
    for (int k = 1; k < argc; k++)
        argv[k] = va_arg(ap, char *);
    va_end(ap);
    argv[argc] = NULL;
    pg_error err;
    int rc = cli_options_parse(o, argc, argv, &err);
    if (rc != PG_OK)
        fail_msg("parse: %s", err.msg);
    return rc;
}

/* What --device auto would find: the driver's devices, or those of the
 * module $PAGEDGEN_CUDA_MODULE names. */
static int have_cuda_device(void)
{
    const cuda_module *m = NULL;
    pg_error err;
    if (getenv(CLI_CUDA_MODULE_ENV))
        return cli_cuda_load(&m, &err) == PG_OK && m->device_count() > 0;
    return cli_cuda_driver_device_count() > 0;
}

static void test_device_open(void **state)
{
    (void)state;
    cli_options o;
    pg_error err;
    executor *ex = NULL;

    parse(&o, 5, "-m", "d", "--device", "cpu");
    assert_int_equal(cli_device_open(&o, &ex, &err), PG_OK);
    assert_string_equal(ex->name, "cpu");
    assert_int_equal(ex->kv_bytes, 4);
    ex->op->destroy(ex);

    parse(&o, 7, "-m", "d", "--device", "cpu", "--kv-cache-dtype", "f32");
    assert_int_equal(cli_device_open(&o, &ex, &err), PG_OK);
    ex->op->destroy(ex);

    if (!have_cuda_device()) {
        /* auto picks the cpu here, which stores every type asked for */
        parse(&o, 5, "-m", "d", "--kv-cache-dtype", "fp16");
        assert_int_equal(cli_device_open(&o, &ex, &err), PG_OK);
        assert_int_equal(ex->kv_bytes, 2);
        assert_int_equal(ex->wt_bytes, 4);
        ex->op->destroy(ex);
        parse(&o, 5, "-m", "d", "--dtype", "bfloat16");
        assert_int_equal(cli_device_open(&o, &ex, &err), PG_OK);
        assert_int_equal(ex->wt_bytes, 2);
        assert_int_equal(ex->kv_bytes, 2); /* auto: bf16 for bf16 weights */
        ex->op->destroy(ex);
        parse(&o, 5, "-m", "d", "--quantization", "int8");
        assert_int_equal(cli_device_open(&o, &ex, &err), PG_OK);
        assert_int_equal(ex->wt_block_elems, 32);
        assert_int_equal(ex->wt_block_bytes, 36);
        assert_int_equal(exec_wt_bytes(ex, 64), 72);
        ex->op->destroy(ex);
        /* the model dir is read for auto: stories260K is f32, so f32 / f32 */
        parse(&o, 3, "-m", pg_test_shared_path("models/stories260K"));
        assert_int_equal(cli_device_open(&o, &ex, &err), PG_OK);
        assert_int_equal(ex->wt_bytes, 4);
        assert_int_equal(ex->kv_bytes, 4);
        ex->op->destroy(ex);
        /* --device cuda without a device (or without CUDA): unsupported */
        parse(&o, 5, "-m", "d", "--device", "cuda");
        assert_int_equal(cli_device_open(&o, &ex, &err), PG_EUNSUPPORTED);
        assert_null(ex);
        assert_non_null(strstr(err.msg, "--device cuda"));
    }
}

/* ---- a fake device: the cpu executor with a memory meter ---------------- */

typedef struct fake_dev {
    executor_ops ops;           /* the cpu table with alloc/free/mem_info replaced */
    const executor_ops *cpu;    /* the real table */
    size_t total, used;         /* used includes `others` */
    size_t others;              /* what other processes and the context hold */
    size_t peak;
    size_t lazy;                /* charged on the first step (a lazily loaded kernel, a
                                   cuBLAS workspace), held until the device closes */
    int steps;                  /* begin_step calls */
    int32_t first_T, first_S, first_L, first_max_q; /* the first step's shape */
    struct { void *p; size_t n; } live[1024];
    int n_live;
} fake_dev;

/* The op table has no user pointer; one fake device at a time. */
static fake_dev g_fake;

static void *fake_alloc(executor *ex, exec_buf_kind kind, size_t n)
{
    size_t bytes = n * exec_kind_bytes(ex, kind);
    if (g_fake.used + bytes > g_fake.total || g_fake.n_live == 1024)
        return NULL;
    void *p = g_fake.cpu->alloc(ex, kind, n);
    if (!p)
        return NULL;
    g_fake.live[g_fake.n_live].p = p;
    g_fake.live[g_fake.n_live].n = bytes;
    g_fake.n_live++;
    g_fake.used += bytes;
    if (g_fake.used > g_fake.peak)
        g_fake.peak = g_fake.used;
    return p;
}

static void fake_free(executor *ex, void *p)
{
    if (!p)
        return;
    for (int k = 0; k < g_fake.n_live; k++) {
        if (g_fake.live[k].p == p) {
            g_fake.used -= g_fake.live[k].n;
            g_fake.live[k] = g_fake.live[--g_fake.n_live];
            break;
        }
    }
    g_fake.cpu->free(ex, p);
}

static int fake_mem_info(executor *ex, size_t *free_bytes, size_t *total_bytes)
{
    (void)ex;
    *free_bytes = g_fake.total - g_fake.used;
    *total_bytes = g_fake.total;
    return 0;
}

static int fake_begin_step(executor *ex, const step_batch *b)
{
    if (g_fake.steps++ == 0) {
        g_fake.first_T = b->num_tokens;
        g_fake.first_S = b->num_seqs;
        g_fake.first_L = b->num_logits;
        g_fake.first_max_q = b->max_query_len;
        g_fake.used += g_fake.lazy;
        if (g_fake.used > g_fake.peak)
            g_fake.peak = g_fake.used;
    }
    return g_fake.cpu->begin_step(ex, b);
}

static executor *fake_open(size_t total_mib, size_t others_mib)
{
    executor *ex = NULL;
    cpu_executor_params p = {.threads = 1};
    pg_error err;
    assert_int_equal(cpu_executor_create(&ex, &p, &err), PG_OK);
    memset(&g_fake, 0, sizeof g_fake);
    g_fake.cpu = ex->op;
    g_fake.ops = *ex->op;
    g_fake.ops.alloc = fake_alloc;
    g_fake.ops.free = fake_free;
    g_fake.ops.mem_info = fake_mem_info;
    g_fake.ops.begin_step = fake_begin_step;
    g_fake.total = total_mib << 20;
    g_fake.others = g_fake.used = others_mib << 20;
    ex->op = &g_fake.ops;
    ex->name = "cuda";
    return ex;
}

static void fake_close(executor *ex)
{
    ex->op = g_fake.cpu;
    ex->name = "cpu";
    ex->op->destroy(ex);
}

typedef struct loaded {
    llama_config cfg;
    st_file *w;
} loaded;

static void load(loaded *l)
{
    pg_error err;
    const char *dir = pg_test_shared_path("models/stories260K");
    if (llama_config_load(&l->cfg, dir, &err) != PG_OK)
        fail_msg("%s", err.msg);
    if (st_open(&l->w, pg_test_shared_path("models/stories260K"), &err) != PG_OK)
        fail_msg("%s", err.msg);
}

static void test_explicit_pool_loads_once(void **state)
{
    (void)state;
    loaded l;
    load(&l);
    cli_options o;
    pg_error err;
    /* --num-kv-blocks / --kv-cache-memory: no probe, on cuda too */
    executor *ex = fake_open(256, 16);
    parse(&o, 5, "-m", "d", "--num-kv-blocks", "7");
    model *m = NULL;
    cli_kv_plan plan;
    assert_int_equal(cli_model_create(&m, &plan, &o, ex, &l.cfg, l.w, 512, &err), PG_OK);
    assert_int_equal(plan.num_blocks, 7);
    assert_false(plan.measured);
    assert_string_equal(plan.source, "--num-kv-blocks");
    size_t bpb = model_kv_bytes_per_block(&l.cfg, ex, 16);
    assert_int_equal(plan.bytes_per_block, bpb);
    size_t one_load = g_fake.used - g_fake.others;
    assert_int_equal(g_fake.peak, g_fake.used); /* loaded once */
    model_destroy(m);
    assert_int_equal(g_fake.used, g_fake.others);

    parse(&o, 5, "-m", "d", "--kv-cache-memory", "1MiB");
    assert_int_equal(cli_model_create(&m, &plan, &o, ex, &l.cfg, l.w, 512, &err), PG_OK);
    assert_int_equal(plan.num_blocks, (1 << 20) / bpb);
    assert_int_equal(g_fake.used - g_fake.others, one_load + (size_t)(plan.num_blocks - 7) * bpb);
    model_destroy(m);

    /* too small for one 512-token sequence (32 blocks) */
    parse(&o, 5, "-m", "d", "--kv-cache-memory", "64KiB");
    assert_int_equal(cli_model_create(&m, &plan, &o, ex, &l.cfg, l.w, 512, &err), PG_EINVAL);
    assert_null(m);
    assert_non_null(strstr(err.msg, "one 512-token sequence needs 32"));
    assert_int_equal(g_fake.used, g_fake.others);
    fake_close(ex);

    /* the cpu default: 40% of MemAvailable, capped to what can be used */
    cpu_executor_params cp = {.threads = 1};
    assert_int_equal(cpu_executor_create(&ex, &cp, &err), PG_OK);
    parse(&o, 5, "-m", "d", "--max-num-seqs", "2");
    assert_int_equal(cli_model_create(&m, &plan, &o, ex, &l.cfg, l.w, 512, &err), PG_OK);
    assert_int_equal(plan.num_blocks, 64);
    assert_int_equal(plan.capped_to, 64);
    assert_string_equal(plan.source, "40% of MemAvailable");
    model_destroy(m);
    ex->op->destroy(ex);
    st_close(l.w);
}

/* --dtype / --quantization / --kv-cache-dtype -> the cpu storage types */
static void test_cpu_storage(void **state)
{
    (void)state;
    cli_options o;
    int32_t wt, kv;
    parse(&o, 3, "-m", "d");
    cli_cpu_storage(&o, ST_F32, &wt, &kv);
    assert_true(wt == CPU_WT_F32 && kv == CPU_KV_F32); /* f32 checkpoints: unchanged */
    cli_cpu_storage(&o, ST_BF16, &wt, &kv);
    assert_true(wt == CPU_WT_BF16 && kv == CPU_KV_BF16);
    cli_cpu_storage(&o, ST_F16, &wt, &kv);
    assert_true(wt == CPU_WT_F32 && kv == CPU_KV_F32); /* f16 -> bf16 would round */
    parse(&o, 5, "-m", "d", "--dtype", "float32");
    cli_cpu_storage(&o, ST_BF16, &wt, &kv);
    assert_true(wt == CPU_WT_F32 && kv == CPU_KV_F32);
    parse(&o, 5, "-m", "d", "--dtype", "bf16");
    cli_cpu_storage(&o, ST_F32, &wt, &kv);
    assert_true(wt == CPU_WT_BF16 && kv == CPU_KV_BF16);
    parse(&o, 5, "-m", "d", "--quantization", "int8");
    cli_cpu_storage(&o, ST_BF16, &wt, &kv);
    assert_true(wt == CPU_WT_I8 && kv == CPU_KV_BF16);
    parse(&o, 7, "-m", "d", "--quantization", "int8", "--kv-cache-dtype", "f32");
    cli_cpu_storage(&o, ST_BF16, &wt, &kv);
    assert_true(wt == CPU_WT_I8 && kv == CPU_KV_F32);
    parse(&o, 5, "-m", "d", "--kv-cache-dtype", "fp16");
    cli_cpu_storage(&o, ST_F32, &wt, &kv);
    assert_true(wt == CPU_WT_F32 && kv == CPU_KV_F16);
}

/* The up-front memory check with a faked MemAvailable: a Llama-3-8B-shaped
 * model fits 23 GiB as bf16 or int8 and is refused as f32 with both
 * numbers; the default pool shrinks to what the weights leave. */
static void test_cpu_memory_check(void **state)
{
    (void)state;
    llama_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.hidden_size = 4096;
    cfg.intermediate_size = 14336;
    cfg.num_hidden_layers = 32;
    cfg.num_attention_heads = 32;
    cfg.num_key_value_heads = 8;
    cfg.head_dim = 128;
    cfg.vocab_size = 128256;
    cli_options o;
    pg_error err;
    const int32_t types[3] = {CPU_WT_F32, CPU_WT_BF16, CPU_WT_I8};
    for (int k = 0; k < 3; k++) {
        executor *ex = NULL;
        cpu_executor_params p = {.threads = 1, .wt_dtype = types[k],
                                 .kv_dtype = types[k] == CPU_WT_F32 ? CPU_KV_F32 : CPU_KV_BF16};
        assert_int_equal(cpu_executor_create(&ex, &p, &err), PG_OK);
        const executor_ops *real = ex->op;
        memset(&g_fake, 0, sizeof g_fake);
        g_fake.cpu = real;
        g_fake.ops = *real;
        g_fake.ops.mem_info = fake_mem_info;
        g_fake.total = (size_t)24 << 30;
        g_fake.used = (size_t)1 << 30; /* 23 GiB available */
        ex->op = &g_fake.ops;
        parse(&o, 7, "-m", "d", "--max-num-seqs", "4", "--max-model-len", "4096");
        cli_kv_plan plan;
        int rc = cli_kv_plan_make(&plan, &o, ex, &cfg, 4096, &err);
        if (types[k] == CPU_WT_F32) {
            /* 29.9 GiB of weights leave no pool at all */
            assert_int_equal(rc, PG_EINVAL);
            /* the weights alone are refused first (cli_model_create) */
            assert_int_equal(cli_cpu_check_memory(NULL, ex, &cfg, &err), PG_ENOMEM);
            assert_non_null(strstr(err.msg, "the weights need 29.9 GiB as f32 (before any kv cache), 23.0 GiB available"));
            plan.num_blocks = 256;
            plan.bytes_per_block = model_kv_bytes_per_block(&cfg, ex, 16);
            assert_int_equal(cli_cpu_check_memory(&plan, ex, &cfg, &err), PG_ENOMEM);
            assert_non_null(strstr(err.msg, "weights as f32 29.9 GiB"));
            assert_non_null(strstr(err.msg, "23.0 GiB available"));
        } else {
            if (rc != PG_OK)
                fail_msg("%s: %s", types[k] == CPU_WT_BF16 ? "bf16" : "int8", err.msg);
            assert_int_equal(cli_cpu_check_memory(&plan, ex, &cfg, &err), PG_OK);
            if (types[k] == CPU_WT_BF16) /* 15 GiB of weights: 40% of 23 GiB would not fit beside them */
                assert_string_equal(plan.source, "90% of MemAvailable less the weights");
        }
        /* a fixed --kv-cache-memory holds twice the blocks with a 16-bit cache */
        parse(&o, 5, "-m", "d", "--kv-cache-memory", "1GiB");
        assert_int_equal(cli_kv_plan_make(&plan, &o, ex, &cfg, 4096, &err), PG_OK);
        assert_int_equal(plan.num_blocks, types[k] == CPU_WT_F32 ? 256 : 512); /* f32 / bf16 cache */
        ex->op = real;
        ex->op->destroy(ex);
    }
}

static void test_reserve_bytes(void **state)
{
    (void)state;
    /* Llama-3-8B shapes, bf16, the default flags, max_model_len 8192: the
     * numbers worked by hand:
     *   logits     256 x 128256 x 4 = 131334144 -> 2^27
     *   sampled rows kept for their logprobs, the same: 2^27
     *   decode ws  256 x 32 x 16 partitions of 512 x 130 x 4 = 68157440 -> 2^27
     *   metadata   (3*2048 + 2*256 + 1 + 256*512 + 256) x 4 = 551940 -> 2^20
     *   gemm pads  128 x 14336 x 2 + 128 x 128256 x 4 = 3670016 + 65667072
     *   slack      2^26
     * and the CUDA graphs' own buffers for min(256, 2048) sequences:
     *   logits 2^27, decode ws 2^27,
     *   metadata (6*256 + 1 + 256*512) x 4 = 530436 -> 2^20 */
    llama_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.hidden_size = 4096;
    cfg.intermediate_size = 14336;
    cfg.num_hidden_layers = 32;
    cfg.num_attention_heads = 32;
    cfg.num_key_value_heads = 8;
    cfg.head_dim = 128;
    cfg.vocab_size = 128256;
    executor ex = {.op = NULL, .name = "cuda", .act_bytes = 2, .wt_bytes = 2, .kv_bytes = 2};
    cli_options o;
    parse(&o, 3, "-m", "d");
    const uint64_t graphs = (1u << 20) + (2u << 27);
    assert_true(cli_cuda_reserve_bytes(&cfg, &ex, &o, 8192) == (405929984u + (1u << 27)) + graphs);
    parse(&o, 4, "-m", "d", "--enforce-eager");
    assert_true(cli_cuda_reserve_bytes(&cfg, &ex, &o, 8192) == (405929984u + (1u << 27)));
    parse(&o, 5, "-m", "d", "--fast-gemm", "--enforce-eager");
    assert_true(cli_cuda_reserve_bytes(&cfg, &ex, &o, 8192) == (405929984u + (1u << 27)) - 69337088u);
    /* 512 tokens fit one partition: no decode workspace; metadata
     * (6144 + 512 + 1 + 256 x 32 + 256) x 4 = 60420 -> 2^16, the graphs'
     * (6*256 + 1 + 256*32) x 4 = 38916 -> 2^16; no pads with --fast-gemm */
    parse(&o, 4, "-m", "d", "--fast-gemm");
    assert_true(cli_cuda_reserve_bytes(&cfg, &ex, &o, 512) ==
                (64u << 20) + (128u << 20) + (128u << 20) + 65536u + 65536u + (128u << 20));
}

static void test_measured_plan(void **state)
{
    (void)state;
    loaded l;
    load(&l);
    cli_options o;
    pg_error err;
    model *m = NULL;
    cli_kv_plan plan;

    executor *ex = fake_open(256, 16);
    size_t bpb = model_kv_bytes_per_block(&l.cfg, ex, 16);
    parse(&o, 3, "-m", "d");
    assert_int_equal(cli_model_create(&m, &plan, &o, ex, &l.cfg, l.w, 512, &err), PG_OK);
    assert_true(plan.measured);
    assert_string_equal(plan.source, "--gpu-memory-utilization");
    assert_true(plan.total_bytes == g_fake.total);
    assert_true(plan.reserve_bytes == cli_cuda_reserve_bytes(&l.cfg, ex, &o, 512));
    /* the probe's load was measured: the final model holds exactly it,
     * with the probe's one block replaced by the planned pool */
    assert_true(plan.load_bytes > model_weight_bytes(&l.cfg, ex));
    assert_true(plan.free_after_load_bytes == g_fake.total - g_fake.others - plan.load_bytes);
    assert_true(g_fake.used == g_fake.others + plan.load_bytes + (size_t)(plan.num_blocks - 1) * bpb);
    /* vLLM's rule, worked here from the measured numbers */
    double budget = 0.9 * (double)g_fake.total - (double)(g_fake.others + plan.load_bytes) -
                    (double)plan.reserve_bytes;
    assert_int_equal(plan.num_blocks, (int32_t)(budget / (double)bpb));
    assert_true(plan.num_blocks > 32 && plan.num_blocks < 256 * 32);
    assert_int_equal(plan.capped_to, 0);
    /* the profile run: one step of the largest shape, before the plan, on
     * a probe pool with a slot per token (2048 tokens: 256 sequences of 8,
     * one 16-token block each) */
    assert_int_equal(g_fake.steps, 1);
    assert_int_equal(g_fake.first_T, 2048);
    assert_int_equal(g_fake.first_S, 256);
    assert_int_equal(g_fake.first_L, 256);
    assert_int_equal(g_fake.first_max_q, 8);
    assert_true(plan.profile_bytes == 0);
    assert_true(g_fake.peak >= g_fake.others + plan.load_bytes + 255u * bpb);
    model_destroy(m);
    assert_true(g_fake.used == g_fake.others);
    fake_close(ex);

    /* what the profile step leaves allocated (here 40 MiB charged on the
     * first step, as a lazily loaded kernel or a cuBLAS workspace would
     * be) is measured and counted as in use: the pool shrinks by it */
    int32_t without = plan.num_blocks;
    ex = fake_open(256, 16);
    g_fake.lazy = (size_t)40 << 20;
    assert_int_equal(cli_model_create(&m, &plan, &o, ex, &l.cfg, l.w, 512, &err), PG_OK);
    assert_true(plan.profile_bytes == g_fake.lazy);
    assert_true(plan.free_after_load_bytes == g_fake.total - g_fake.others - plan.load_bytes);
    assert_true(g_fake.used ==
                g_fake.others + g_fake.lazy + plan.load_bytes + (size_t)(plan.num_blocks - 1) * bpb);
    budget = 0.9 * (double)g_fake.total - (double)(g_fake.others + plan.load_bytes + g_fake.lazy) -
             (double)plan.reserve_bytes;
    assert_int_equal(plan.num_blocks, (int32_t)(budget / (double)bpb));
    int32_t fewer = without - plan.num_blocks, lazy_blocks = (int32_t)(g_fake.lazy / bpb);
    assert_true(fewer >= lazy_blocks && fewer <= lazy_blocks + 1);
    model_destroy(m);
    assert_true(g_fake.used == g_fake.others + g_fake.lazy);
    fake_close(ex);

    /* max-num-batched-tokens beyond what max-num-seqs x max-model-len hold:
     * the profile step is the largest the scheduler can form */
    ex = fake_open(256, 16);
    parse(&o, 7, "-m", "d", "--max-num-seqs", "2", "--max-num-batched-tokens", "4096");
    assert_int_equal(cli_model_create(&m, &plan, &o, ex, &l.cfg, l.w, 512, &err), PG_OK);
    assert_int_equal(g_fake.first_T, 1024);
    assert_int_equal(g_fake.first_S, 2);
    assert_int_equal(g_fake.first_max_q, 512);
    model_destroy(m);
    fake_close(ex);
    ex = fake_open(256, 16);

    /* capped to max-num-seqs x blocks per sequence */
    parse(&o, 5, "-m", "d", "--max-num-seqs", "2");
    assert_int_equal(cli_model_create(&m, &plan, &o, ex, &l.cfg, l.w, 512, &err), PG_OK);
    assert_int_equal(plan.num_blocks, 64);
    assert_int_equal(plan.capped_to, 64);
    model_destroy(m);

    /* a lower utilization leaves no room: PG_ENOMEM with the numbers, nothing left allocated */
    parse(&o, 5, "-m", "d", "--gpu-memory-utilization", "0.3");
    assert_int_equal(cli_model_create(&m, &plan, &o, ex, &l.cfg, l.w, 512, &err), PG_ENOMEM);
    assert_null(m);
    assert_true(g_fake.used == g_fake.others);
    const char *want[] = {"total 256.0 MiB", "utilization 0.30", "free ", "after loading", "weights ",
                          "one 512-token sequence needs 32 blocks", "raise --gpu-memory-utilization"};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
        if (!strstr(err.msg, want[k]))
            fail_msg("'%s' lacks '%s'", err.msg, want[k]);
    fake_close(ex);

    /* the weights do not even load: the model's own out-of-memory message */
    ex = fake_open(17, 16);
    parse(&o, 3, "-m", "d");
    assert_int_equal(cli_model_create(&m, &plan, &o, ex, &l.cfg, l.w, 512, &err), PG_ENOMEM);
    assert_null(m);
    assert_non_null(strstr(err.msg, "loading the model to measure device memory"));
    assert_non_null(strstr(err.msg, "out of memory"));
    assert_true(g_fake.used == g_fake.others);
    fake_close(ex);
    st_close(l.w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_open),
        cmocka_unit_test(test_explicit_pool_loads_once),
        cmocka_unit_test(test_cpu_storage),
        cmocka_unit_test(test_cpu_memory_check),
        cmocka_unit_test(test_reserve_bytes),
        cmocka_unit_test(test_measured_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
