/* test_storage_model: the CPU storage types through the whole model
 * (issue 13), on a small LLaMA checkpoint this test writes itself in BF16
 * (config.json + model.safetensors in a temp dir; untied lm_head, GQA 2,
 * an intermediate size of 80 so that down_proj's K is not a multiple of 32).
 *
 *  - bf16 storage of a bf16 checkpoint is lossless: the logits of every
 *    step are bit-identical to f32 storage of the same checkpoint (with an
 *    f32 and with a bf16 KV cache).
 *  - int8 weights: deterministic (1 vs 3 threads, bit for bit) and close to
 *    f32: max |dlogit| below 5% of max |logit| (observed 1.8%).
 *  - 16-bit KV caches stay close to the f32 cache: bf16 below 2% of max
 *    |logit| (observed 0.3%), f16 below 0.3% (observed 0.04%).
 *  - the executor's weight byte count follows the storage (f32 = 2 x bf16;
 *    int8 = 36 bytes per 32).
 * Steps: a 21-token prefill, then 6 decodes, one sequence (the ops tests
 * cover ragged batches). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config.h"
#include "cpu_executor.h"
#include "cpu_wt.h"
#include "model.h"
#include "safetensors.h"
#include "test_support.h"

#define H 64
#define I 80
#define NL 2
#define NH 4
#define NKV 2
#define HD 16
#define V 97
#define CTX 64

static char g_dir[256];

static void put_tensor(FILE *hdr, FILE *data, size_t *off, const char *name, int64_t d0, int64_t d1,
                       pg_test_rng *rng, float amp, int first)
{
    const size_t n = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1);
    for (size_t i = 0; i < n; i++) {
        const float v = amp > 0.0f ? pg_test_rng_uniform(rng, -amp, amp) : 1.0f;
        const uint16_t b = pg_f32_to_bf16(v);
        fwrite(&b, sizeof b, 1, data);
    }
    if (d1 > 0)
        fprintf(hdr, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                first ? "" : ",", name, (long long)d0, (long long)d1, *off, *off + 2 * n);
    else
        fprintf(hdr, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}",
                first ? "" : ",", name, (long long)d0, *off, *off + 2 * n);
    *off += 2 * n;
}

/* Writes the checkpoint into a fresh temp dir (g_dir). */
static int write_checkpoint(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/pg_storage_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir))
        return -1;
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":%d,"
               "\"intermediate_size\":%d,\"num_hidden_layers\":%d,\"num_attention_heads\":%d,"
               "\"num_key_value_heads\":%d,\"head_dim\":%d,\"vocab_size\":%d,\"max_position_embeddings\":%d,"
               "\"hidden_act\":\"silu\",\"rms_norm_eps\":1e-05,\"rope_theta\":10000.0,\"rope_scaling\":null,"
               "\"tie_word_embeddings\":false,\"bos_token_id\":1,\"eos_token_id\":2,\"torch_dtype\":\"bfloat16\"}",
            H, I, NL, NH, NKV, HD, V, CTX);
    fclose(f);

    /* header and data built separately, then joined */
    char *hbuf = NULL, *dbuf = NULL;
    size_t hlen = 0, dlen = 0, off = 0;
    FILE *hdr = open_memstream(&hbuf, &hlen), *data = open_memstream(&dbuf, &dlen);
    if (!hdr || !data)
        return -1;
    pg_test_rng rng = {13};
    fputc('{', hdr);
    put_tensor(hdr, data, &off, "lm_head.weight", V, H, &rng, 0.2f, 1);
    put_tensor(hdr, data, &off, "model.embed_tokens.weight", V, H, &rng, 1.0f, 0);
    put_tensor(hdr, data, &off, "model.norm.weight", H, 0, &rng, 0.0f, 0);
    for (int l = 0; l < NL; l++) {
        char name[128];
#define T2(suffix, d0, d1, amp)                                                      \
    (snprintf(name, sizeof name, "model.layers.%d." suffix, l),                      \
     put_tensor(hdr, data, &off, name, d0, d1, &rng, amp, 0))
        T2("input_layernorm.weight", H, 0, 0.0f);
        T2("post_attention_layernorm.weight", H, 0, 0.0f);
        T2("self_attn.q_proj.weight", NH * HD, H, 0.3f);
        T2("self_attn.k_proj.weight", NKV * HD, H, 0.3f);
        T2("self_attn.v_proj.weight", NKV * HD, H, 0.3f);
        T2("self_attn.o_proj.weight", H, NH * HD, 0.2f);
        T2("mlp.gate_proj.weight", I, H, 0.2f);
        T2("mlp.up_proj.weight", I, H, 0.2f);
        T2("mlp.down_proj.weight", H, I, 0.2f);
#undef T2
    }
    fputc('}', hdr);
    fclose(hdr);
    fclose(data);
    snprintf(path, sizeof path, "%s/model.safetensors", g_dir);
    f = fopen(path, "wb");
    if (!f)
        return -1;
    const uint64_t n = hlen;
    fwrite(&n, sizeof n, 1, f);
    fwrite(hbuf, 1, hlen, f);
    fwrite(dbuf, 1, dlen, f);
    fclose(f);
    free(hbuf);
    free(dbuf);
    return 0;
}

static int remove_checkpoint(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", g_dir);
    unlink(path);
    rmdir(g_dir);
    return 0;
}

#define N_PROMPT 21
#define N_DECODE 6
#define N_STEPS (1 + N_DECODE)

/* logits [N_STEPS][V] of the fixed run with storage (wt, kv) and threads;
 * *wt_bytes: model_weight_bytes on that executor. */
static void run(cpu_wt wt, cpu_kv kv, int32_t threads, float *logits, size_t *wt_bytes)
{
    llama_config cfg;
    st_file *st = NULL;
    pg_error err = {{0}};
    if (llama_config_load(&cfg, g_dir, &err) || st_open(&st, g_dir, &err))
        fail_msg("%s", err.msg);
    executor *ex = NULL;
    cpu_executor_params cp = {.threads = threads, .wt_dtype = (int32_t)wt, .kv_dtype = (int32_t)kv};
    if (cpu_executor_create(&ex, &cp, &err))
        fail_msg("%s", err.msg);
    model *m = NULL;
    model_params mp = {.num_kv_blocks = 4, .block_size = 16, .max_num_batched_tokens = 32, .max_num_seqs = 1};
    if (model_create(&m, ex, &cfg, st, &mp, &err))
        fail_msg("weights %s kv %s: %s", cpu_wt_name(wt), cpu_kv_name(kv), err.msg);
    st_close(st);
    *wt_bytes = model_weight_bytes(&cfg, ex);
    int32_t ids[N_PROMPT + N_DECODE], pos[N_PROMPT], slots[N_PROMPT], table[4] = {2, 0, 3, 1};
    for (int i = 0; i < N_PROMPT + N_DECODE; i++)
        ids[i] = (i * 37 + 5) % V;
    for (int step = 0; step < N_STEPS; step++) {
        const int32_t p0 = step == 0 ? 0 : N_PROMPT + step - 1, T = step == 0 ? N_PROMPT : 1;
        for (int32_t t = 0; t < T; t++) {
            pos[t] = p0 + t;
            slots[t] = table[pos[t] / 16] * 16 + pos[t] % 16;
        }
        int32_t qs[2] = {0, T}, len = p0 + T, row = T - 1;
        step_batch b = {.num_tokens = T, .num_seqs = 1, .block_size = 16, .token_ids = ids + p0, .positions = pos,
                        .slots = slots, .query_start = qs, .seq_lens = &len, .block_tables = table,
                        .block_table_stride = 4, .max_seq_len = len, .max_query_len = T, .num_logits = 1,
                        .logits_rows = &row};
        if (model_forward(m, &b, logits + (size_t)step * V, &err))
            fail_msg("forward: %s", err.msg);
    }
    model_destroy(m);
    ex->op->destroy(ex);
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double d = 0.0;
    for (size_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d;
}

static void test_bf16_is_lossless(void **state)
{
    (void)state;
    static float a[N_STEPS * V], b[N_STEPS * V];
    size_t wa, wb;
    run(CPU_WT_F32, CPU_KV_F32, 2, a, &wa);
    run(CPU_WT_BF16, CPU_KV_F32, 2, b, &wb);
    if (memcmp(a, b, sizeof a) != 0)
        fail_msg("bf16 storage of a bf16 checkpoint: logits differ from f32 storage (max |d| %g)",
                 max_abs_diff(a, b, N_STEPS * V));
    const size_t f32_bytes = 4 * ((size_t)(NL * 2 + 1) * H + HD / 2); /* norms, rope: always f32 */
    assert_int_equal(wa - f32_bytes, 2 * (wb - f32_bytes));
    /* the same with a bf16 cache on both sides */
    run(CPU_WT_F32, CPU_KV_BF16, 1, a, &wa);
    run(CPU_WT_BF16, CPU_KV_BF16, 2, b, &wb);
    if (memcmp(a, b, sizeof a) != 0)
        fail_msg("bf16 cache: bf16 storage differs from f32 storage (max |d| %g)", max_abs_diff(a, b, N_STEPS * V));
}

static void test_int8_and_16bit_kv(void **state)
{
    (void)state;
    static float ref[N_STEPS * V], x[N_STEPS * V], y[N_STEPS * V];
    size_t w32, w8;
    run(CPU_WT_F32, CPU_KV_F32, 2, ref, &w32);
    double max_ref = 0.0;
    for (size_t i = 0; i < N_STEPS * V; i++)
        max_ref = fmax(max_ref, fabs((double)ref[i]));
    run(CPU_WT_I8, CPU_KV_F32, 1, x, &w8);
    run(CPU_WT_I8, CPU_KV_F32, 3, y, &w8);
    if (memcmp(x, y, sizeof x) != 0)
        fail_msg("int8 weights: 1 and 3 threads differ");
    const double d8 = max_abs_diff(ref, x, N_STEPS * V);
    print_message("int8 weights: max |dlogit| %.4g (max |logit| %.3g)\n", d8, max_ref);
    /* int8 with per-32 scales: relative weight error <= 1/254 per element */
    assert_true(d8 > 0.0 && d8 < 0.05 * max_ref);
    const size_t wt_elems = (size_t)2 * V * H + (size_t)NL * ((NH + 2 * NKV) * HD * H + H * NH * HD + 3 * H * I);
    assert_int_equal(w8 - 4 * ((size_t)(NL * 2 + 1) * H + HD / 2), (wt_elems + 31) / 32 * 36);
    assert_int_equal(w32 - 4 * ((size_t)(NL * 2 + 1) * H + HD / 2), wt_elems * 4);
    const cpu_kv kvs[2] = {CPU_KV_BF16, CPU_KV_F16};
    for (int k = 0; k < 2; k++) {
        run(CPU_WT_F32, kvs[k], 2, x, &w32);
        const double d = max_abs_diff(ref, x, N_STEPS * V);
        print_message("kv %s: max |dlogit| %.4g\n", cpu_kv_name(kvs[k]), d);
        assert_true(d > 0.0 && d < (kvs[k] == CPU_KV_BF16 ? 0.02 : 0.003) * max_ref);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_is_lossless),
        cmocka_unit_test(test_int8_and_16bit_kv),
    };
    return cmocka_run_group_tests(tests, write_checkpoint, remove_checkpoint);
}
