/* config -> rope table for real LLaMA-family configs, in both layouts that
 * transformers writes: rope_theta + rope_scaling (transformers 4.x) and
 * rope_parameters (transformers 5). Shapes and RoPE values are those of the
 * published config.json files (abridged to the keys that change the math);
 * each config is parsed in both layouts, must give the same llama_config,
 * and its inverse frequencies must match transformers' formulas
 * (modeling_rope_utils.py _compute_default_rope_parameters /
 * _compute_linear_scaling_rope_parameters / _compute_llama3_parameters)
 * evaluated here in double. A theta or scaling read wrongly is silent in
 * every other test: the model still produces fluent text. The Qwen2 /
 * Qwen3 entries also check the family's fields (config.h llama_family). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "config.h"
#include "rope_table.h"

typedef struct family {
    const char *name;
    const char *arch;
    int hidden, inter, layers, heads, kv_heads, head_dim, vocab, max_pos;
    double theta;
    /* rope scaling: "" (none), "linear" or "llama3" */
    const char *scaling;
    double factor, low, high;
    int orig_max;
    /* sliding_window: -1 absent, 0 null, > 0 the window */
    int window;
    int want_window; /* cfg.sliding_window */
    const char *extra; /* more keys, verbatim (NULL: none) */
} family;

/* The Qwen configs' window keys as shipped (no layer slides) */
#define QWEN_NO_WINDOW ",\"use_sliding_window\":false"

static const family families[] = {
    {"llama-2-7b", "LlamaForCausalLM", 4096, 11008, 32, 32, 32, 0, 32000, 4096, 10000.0, "", 0, 0, 0, 0, -1, 0, NULL},
    {"codellama-7b", "LlamaForCausalLM", 4096, 11008, 32, 32, 32, 0, 32016, 16384, 1000000.0, "", 0, 0, 0, 0, -1,
     0, NULL},
    {"llama-3.1-8b", "LlamaForCausalLM", 4096, 14336, 32, 32, 8, 0, 128256, 131072, 500000.0, "llama3", 8.0, 1.0,
     4.0, 8192, -1, 0, NULL},
    {"llama-3.2-1b", "LlamaForCausalLM", 2048, 8192, 16, 32, 8, 64, 128256, 131072, 500000.0, "llama3", 32.0, 1.0,
     4.0, 8192, -1, 0, NULL},
    {"mistral-7b-v0.1", "MistralForCausalLM", 4096, 14336, 32, 32, 8, 0, 32000, 32768, 10000.0, "", 0, 0, 0, 0,
     4096, 4096, NULL},
    {"mistral-7b-v0.3", "MistralForCausalLM", 4096, 14336, 32, 32, 8, 128, 32768, 32768, 1000000.0, "", 0, 0, 0, 0,
     0, 0, NULL},
    {"tinyllama-1.1b", "LlamaForCausalLM", 2048, 5632, 22, 32, 4, 0, 32000, 2048, 10000.0, "", 0, 0, 0, 0, -1, 0, NULL},
    {"smollm2-135m", "LlamaForCausalLM", 576, 1536, 30, 9, 3, 0, 49152, 8192, 100000.0, "", 0, 0, 0, 0, -1, 0, NULL},
    /* a linearly scaled long-context Llama 2 (LongChat-style) */
    {"llama-2-linear-x4", "LlamaForCausalLM", 4096, 11008, 32, 32, 32, 0, 32000, 16384, 10000.0, "linear", 4.0, 0, 0,
     0, -1, 0, NULL},
    /* Qwen (config.json of the published checkpoints, abridged): biases
     * (Qwen2) and q/k norms (Qwen3) come from the architecture, head_dim
     * 128 from Qwen3Config even where hidden / heads = 64 (0.6B) */
    {"qwen2-7b", "Qwen2ForCausalLM", 3584, 18944, 28, 28, 4, 0, 152064, 131072, 1000000.0, "", 0, 0, 0, 0, 131072, 0,
     QWEN_NO_WINDOW ",\"max_window_layers\":28"},
    {"qwen2.5-0.5b", "Qwen2ForCausalLM", 896, 4864, 24, 14, 2, 0, 151936, 32768, 1000000.0, "", 0, 0, 0, 0, 32768, 0,
     QWEN_NO_WINDOW ",\"max_window_layers\":21,\"tie_word_embeddings\":true"},
    {"qwen2.5-7b", "Qwen2ForCausalLM", 3584, 18944, 28, 28, 4, 0, 152064, 32768, 1000000.0, "", 0, 0, 0, 0, 131072, 0,
     QWEN_NO_WINDOW ",\"max_window_layers\":28"},
    {"qwen3-0.6b", "Qwen3ForCausalLM", 1024, 3072, 28, 16, 8, 128, 151936, 40960, 1000000.0, "", 0, 0, 0, 0, 0, 0,
     QWEN_NO_WINDOW ",\"max_window_layers\":28,\"tie_word_embeddings\":true,\"attention_bias\":false"},
    {"qwen3-8b", "Qwen3ForCausalLM", 4096, 12288, 36, 32, 8, 128, 151936, 40960, 1000000.0, "", 0, 0, 0, 0, 0, 0,
     QWEN_NO_WINDOW ",\"max_window_layers\":36,\"attention_bias\":false"},
};

/* The config.json text of f: v5 = transformers 5's rope_parameters layout. */
static void write_config(char *buf, size_t cap, const family *f, bool v5)
{
    char rope[256] = "", head_dim[32] = "", window[32] = "";
    if (f->head_dim)
        snprintf(head_dim, sizeof head_dim, ",\"head_dim\":%d", f->head_dim);
    if (f->window == 0)
        snprintf(window, sizeof window, ",\"sliding_window\":null");
    else if (f->window > 0)
        snprintf(window, sizeof window, ",\"sliding_window\":%d", f->window);
    char scaling[192] = "";
    if (strcmp(f->scaling, "linear") == 0)
        snprintf(scaling, sizeof scaling, "\"rope_type\":\"linear\",\"factor\":%.1f", f->factor);
    else if (strcmp(f->scaling, "llama3") == 0)
        snprintf(scaling, sizeof scaling,
                 "\"rope_type\":\"llama3\",\"factor\":%.1f,\"low_freq_factor\":%.1f,\"high_freq_factor\":%.1f,"
                 "\"original_max_position_embeddings\":%d",
                 f->factor, f->low, f->high, f->orig_max);
    if (v5)
        snprintf(rope, sizeof rope, ",\"rope_parameters\":{%s%s\"rope_theta\":%.1f}", scaling, scaling[0] ? "," : "",
                 f->theta);
    else if (scaling[0])
        snprintf(rope, sizeof rope, ",\"rope_theta\":%.1f,\"rope_scaling\":{%s}", f->theta, scaling);
    else
        snprintf(rope, sizeof rope, ",\"rope_theta\":%.1f,\"rope_scaling\":null", f->theta);
    snprintf(buf, cap,
             "{\"architectures\":[\"%s\"],\"hidden_size\":%d,\"intermediate_size\":%d,\"num_hidden_layers\":%d,"
             "\"num_attention_heads\":%d,\"num_key_value_heads\":%d,\"vocab_size\":%d,"
             "\"max_position_embeddings\":%d,\"rms_norm_eps\":1e-05,\"hidden_act\":\"silu\"%s%s%s%s}",
             f->arch, f->hidden, f->inter, f->layers, f->heads, f->kv_heads, f->vocab, f->max_pos, head_dim, window,
             rope, f->extra ? f->extra : "");
}

/* transformers' inverse frequencies, in double. */
static double ref_inv_freq(const family *f, int hd, int i)
{
    double inv = 1.0 / pow(f->theta, (double)(2 * i) / (double)hd);
    if (strcmp(f->scaling, "linear") == 0)
        return inv / f->factor;
    if (strcmp(f->scaling, "llama3") != 0)
        return inv;
    double low_wavelen = f->orig_max / f->low, high_wavelen = f->orig_max / f->high;
    double wavelen = 2.0 * M_PI / inv;
    if (wavelen < high_wavelen)
        return inv;
    if (wavelen > low_wavelen)
        return inv / f->factor;
    double smooth = (f->orig_max / wavelen - f->low) / (f->high - f->low);
    return (1.0 - smooth) * inv / f->factor + smooth * inv;
}

static void test_families_both_layouts(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof families / sizeof families[0]; k++) {
        const family *f = &families[k];
        llama_config c[2];
        for (int v5 = 0; v5 <= 1; v5++) {
            char json[2048];
            write_config(json, sizeof json, f, v5 != 0);
            pg_error err;
            int rc = llama_config_parse(&c[v5], json, strlen(json), f->name, &err);
            if (rc)
                fprintf(stderr, "%s (%s): %s\n", f->name, v5 ? "rope_parameters" : "rope_scaling", err.msg);
            assert_int_equal(rc, 0);
        }
        assert_memory_equal(&c[0], &c[1], sizeof c[0]);
        const llama_config *cfg = &c[0];
        int hd = f->head_dim ? f->head_dim : f->hidden / f->heads;
        assert_int_equal(cfg->head_dim, hd);
        assert_int_equal(cfg->num_key_value_heads, f->kv_heads);
        assert_true(cfg->rope_theta == (float)f->theta);
        assert_int_equal(cfg->sliding_window, f->want_window);
        for (int32_t l = 0; l < cfg->num_hidden_layers; l++)
            assert_int_equal(llama_layer_window(cfg, l), f->want_window);
        assert_int_equal(cfg->family.qkv_bias, strcmp(f->arch, "Qwen2ForCausalLM") == 0);
        assert_int_equal(cfg->family.qk_norm, strcmp(f->arch, "Qwen3ForCausalLM") == 0);

        float inv[256];
        pg_error err;
        assert_int_equal(rope_inv_freq(inv, cfg->head_dim, cfg->rope_theta, &cfg->rope_scaling, &err), 0);
        double worst = 0;
        for (int i = 0; i < hd / 2; i++) {
            double want = ref_inv_freq(f, hd, i);
            double rel = fabs((double)inv[i] - want) / want;
            if (rel > worst)
                worst = rel;
        }
        printf("    %-18s theta %-9g scaling %-6s head_dim %3d: max rel err %.2g\n", f->name, f->theta,
               f->scaling[0] ? f->scaling : "none", hd, worst);
        assert_true(worst < 2e-6);
    }
}

/* The same value in two places must agree; missing keys take
 * transformers 5's defaults. */
static void test_layout_conflicts_and_defaults(void **state)
{
    (void)state;
#define BASE "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":8," \
             "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"vocab_size\":16,\"max_position_embeddings\":4096"
    static const struct {
        const char *json;
        const char *want1, *want2; /* NULL: must parse */
    } cases[] = {
        {BASE ",\"rope_theta\":10000.0,\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":500000.0}}",
         "rope_theta", "500000"},
        {BASE ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2.0},"
              "\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":4.0}}",
         "disagree", "factor 4"},
        {BASE ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2.0},"
              "\"rope_parameters\":{\"rope_type\":\"default\"}}",
         "disagree", NULL},
        {BASE ",\"original_max_position_embeddings\":2048,\"rope_parameters\":{\"rope_type\":\"llama3\","
              "\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
              "\"original_max_position_embeddings\":8192}}",
         "original_max_position_embeddings", "2048"},
        {BASE ",\"partial_rotary_factor\":0.5}", "partial_rotary_factor", "not supported"},
        {BASE ",\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":4.0}}", "'yarn'", "not supported"},
        {BASE ",\"sliding_window\":4096}", "sliding_window", "LlamaConfig"},
        /* agreeing duplicates and the v5 defaults */
        {BASE ",\"rope_theta\":500000.0,\"rope_parameters\":{\"rope_theta\":500000.0}}", NULL, NULL},
        {BASE ",\"rope_parameters\":{}}", NULL, NULL},
        {BASE ",\"sliding_window\":null}", NULL, NULL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        llama_config c;
        pg_error err = {{0}};
        int rc = llama_config_parse(&c, cases[k].json, strlen(cases[k].json), "config.json", &err);
        if (!cases[k].want1) {
            if (rc)
                fprintf(stderr, "case %zu: %s\n", k, err.msg);
            assert_int_equal(rc, 0);
            continue;
        }
        if (rc == 0 || !strstr(err.msg, cases[k].want1) || (cases[k].want2 && !strstr(err.msg, cases[k].want2)))
            fprintf(stderr, "case %zu: rc %d, message '%s'\n", k, rc, err.msg);
        assert_true(rc != 0);
        assert_non_null(strstr(err.msg, cases[k].want1));
        if (cases[k].want2)
            assert_non_null(strstr(err.msg, cases[k].want2));
    }
    /* v5: llama3 without original_max_position_embeddings takes
     * max_position_embeddings; theta without any key is 10000 */
    const char *v5 = BASE ",\"rope_parameters\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
                          "\"high_freq_factor\":4.0}}";
    llama_config c;
    pg_error err;
    assert_int_equal(llama_config_parse(&c, v5, strlen(v5), "config.json", &err), 0);
    assert_int_equal(c.rope_scaling.type, LLAMA_ROPE_LLAMA3);
    assert_int_equal(c.rope_scaling.original_max_position_embeddings, 4096);
    assert_true(c.rope_theta == 10000.0f);
    /* Mistral without the key: MistralConfig's default window of 4096, applied
     * by the attention; the context stays max_position_embeddings */
    const char *mistral = "{\"architectures\":[\"MistralForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":8,"
                          "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"vocab_size\":16,"
                          "\"max_position_embeddings\":32768}";
    assert_int_equal(llama_config_parse(&c, mistral, strlen(mistral), "config.json", &err), 0);
    assert_int_equal(c.sliding_window, 4096);
    assert_int_equal(c.max_position_embeddings, 32768);
#undef BASE
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_families_both_layouts),
        cmocka_unit_test(test_layout_conflicts_and_defaults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
