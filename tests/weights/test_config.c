/* test_config: config.json / generation_config.json parsing: the real
 * stories260K and codellama configs, defaults, rope_scaling variants,
 * refusals (architecture, sliding window, biases, ranges), eos merging,
 * and the Qwen2 / Qwen3 families' defaults, windows and refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "test_support.h"

/* The smallest accepted config; BASE(x) inserts x before the closing brace. */
#define BASE(extra)                                                                            \
    "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":172," \
    "\"num_hidden_layers\":5,\"num_attention_heads\":8,\"vocab_size\":512" extra "}"

static int parse(llama_config *c, const char *json, pg_error *e)
{
    return llama_config_parse(c, json, strlen(json), "config.json", e);
}

static void expect_ok(llama_config *c, const char *json)
{
    pg_error e;
    if (parse(c, json, &e) != PG_OK)
        fail_msg("refused %s: %s", json, e.msg);
}

static void expect_refused(const char *json, const char *sub1, const char *sub2)
{
    llama_config c;
    pg_error e;
    strcpy(e.msg, "(unset)");
    if (parse(&c, json, &e) == PG_OK)
        fail_msg("accepted %s", json);
    if (!strstr(e.msg, "config.json") || (sub1 && !strstr(e.msg, sub1)) || (sub2 && !strstr(e.msg, sub2)))
        fail_msg("%s: message '%s' lacks '%s' / '%s'", json, e.msg, sub1 ? sub1 : "", sub2 ? sub2 : "");
}

static void test_stories260k(void **state)
{
    (void)state;
    llama_config c;
    pg_error e;
    if (llama_config_load(&c, pg_test_shared_path("models/stories260K"), &e) != PG_OK)
        fail_msg("%s", e.msg);
    assert_string_equal(c.architecture, "LlamaForCausalLM");
    assert_int_equal(c.hidden_size, 64);
    assert_int_equal(c.intermediate_size, 172);
    assert_int_equal(c.num_hidden_layers, 5);
    assert_int_equal(c.num_attention_heads, 8);
    assert_int_equal(c.num_key_value_heads, 4);
    assert_int_equal(c.head_dim, 8);
    assert_int_equal(c.vocab_size, 512);
    assert_int_equal(c.max_position_embeddings, 512);
    assert_true(c.rms_norm_eps == 1e-5f);
    assert_true(c.rope_theta == 10000.0f);
    assert_int_equal(c.rope_scaling.type, LLAMA_ROPE_NONE);
    assert_true(c.tie_word_embeddings);
    assert_int_equal(c.bos_token_id, 1);
    /* config says 2, generation_config [2, 1]: merged, deduplicated, in order */
    assert_int_equal(c.n_eos_token_ids, 2);
    assert_int_equal(c.eos_token_ids[0], 2);
    assert_int_equal(c.eos_token_ids[1], 1);
    assert_true(c.has_do_sample);
    assert_false(c.do_sample);
    assert_false(c.has_temperature || c.has_top_p || c.has_top_k);
}

static void test_codellama(void **state)
{
    (void)state;
    llama_config c;
    pg_error e;
    if (llama_config_load(&c, pg_test_shared_path("models/codellama-7b-sharded-index"), &e) != PG_OK)
        fail_msg("%s", e.msg);
    assert_int_equal(c.hidden_size, 4096);
    assert_int_equal(c.intermediate_size, 11008);
    assert_int_equal(c.num_hidden_layers, 32);
    assert_int_equal(c.num_attention_heads, 32);
    assert_int_equal(c.num_key_value_heads, 32); /* stated */
    assert_int_equal(c.head_dim, 128);           /* 4096 / 32 */
    assert_int_equal(c.vocab_size, 32016);
    assert_int_equal(c.max_position_embeddings, 16384);
    assert_true(c.rope_theta == 1000000.0f);
    assert_false(c.tie_word_embeddings);
    assert_int_equal(c.bos_token_id, 1);
    assert_true(c.n_eos_token_ids >= 1);
    assert_int_equal(c.eos_token_ids[0], 2);
}

static void test_defaults(void **state)
{
    (void)state;
    llama_config c;
    expect_ok(&c, BASE(""));
    assert_int_equal(c.num_key_value_heads, 8); /* = heads */
    assert_int_equal(c.head_dim, 8);            /* 64 / 8 */
    assert_true(c.rope_theta == 10000.0f);
    assert_true(c.rms_norm_eps == 1e-6f);
    assert_int_equal(c.max_position_embeddings, 2048);
    assert_int_equal(c.rope_scaling.type, LLAMA_ROPE_NONE);
    assert_false(c.tie_word_embeddings);
    assert_int_equal(c.bos_token_id, -1);
    assert_int_equal(c.n_eos_token_ids, 0);
    /* unknown keys and nulls are ignored */
    expect_ok(&c, BASE(",\"foo\":{\"bar\":[1,2,{}]},\"torch_dtype\":\"bfloat16\",\"num_key_value_heads\":null,"
                       "\"rope_scaling\":null,\"attention_bias\":false,\"mlp_bias\":false,\"hidden_act\":\"silu\""));
    assert_int_equal(c.num_key_value_heads, 8);
    /* no architectures: model_type decides */
    expect_ok(&c, "{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":1,\"num_hidden_layers\":1,"
                  "\"num_attention_heads\":1,\"vocab_size\":3}");
    assert_string_equal(c.architecture, "LlamaForCausalLM");
    assert_int_equal(c.head_dim, 64);
    /* Mistral without a window; explicit head_dim; eos list */
    expect_ok(&c, "{\"architectures\":[\"MistralForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":1,"
                  "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,"
                  "\"vocab_size\":300,\"sliding_window\":null,\"eos_token_id\":[7,9,7,256],\"bos_token_id\":5}");
    assert_string_equal(c.architecture, "MistralForCausalLM");
    assert_int_equal(c.head_dim, 32);
    assert_int_equal(c.num_key_value_heads, 2);
    assert_int_equal(c.n_eos_token_ids, 3);
    assert_int_equal(c.eos_token_ids[0], 7);
    assert_int_equal(c.eos_token_ids[1], 9);
    assert_int_equal(c.eos_token_ids[2], 256);
    assert_int_equal(c.bos_token_id, 5);
}

static void test_rope_scaling(void **state)
{
    (void)state;
    llama_config c;
    expect_ok(&c, BASE(",\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}"));
    assert_int_equal(c.rope_scaling.type, LLAMA_ROPE_LINEAR);
    assert_true(c.rope_scaling.factor == 2.0f);
    expect_ok(&c, BASE(",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":4}"));
    assert_int_equal(c.rope_scaling.type, LLAMA_ROPE_LINEAR);
    assert_true(c.rope_scaling.factor == 4.0f);
    /* Llama 3.1's block */
    expect_ok(&c, BASE(",\"rope_theta\":500000.0,\"rope_scaling\":{\"factor\":8.0,\"low_freq_factor\":1.0,"
                       "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"}"));
    assert_int_equal(c.rope_scaling.type, LLAMA_ROPE_LLAMA3);
    assert_true(c.rope_scaling.factor == 8.0f);
    assert_true(c.rope_scaling.low_freq_factor == 1.0f);
    assert_true(c.rope_scaling.high_freq_factor == 4.0f);
    assert_int_equal(c.rope_scaling.original_max_position_embeddings, 8192);
    assert_true(c.rope_theta == 500000.0f);
    expect_ok(&c, BASE(",\"rope_scaling\":{\"rope_type\":\"default\"}"));
    assert_int_equal(c.rope_scaling.type, LLAMA_ROPE_NONE);

    expect_refused(BASE(",\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4.0}"), "'yarn'", "linear, llama3");
    expect_refused(BASE(",\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":4.0}"), "'dynamic'", "not supported");
    expect_refused(BASE(",\"rope_scaling\":{\"factor\":4.0}"), "rope_type", NULL);
    expect_refused(BASE(",\"rope_scaling\":{\"type\":\"linear\"}"), "factor", NULL);
    expect_refused(BASE(",\"rope_scaling\":{\"type\":\"linear\",\"factor\":0}"), "factor", NULL);
    expect_refused(BASE(",\"rope_scaling\":{\"type\":\"linear\",\"factor\":\"2\"}"), "factor", NULL);
    expect_refused(BASE(",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"high_freq_factor\":4.0,"
                        "\"original_max_position_embeddings\":8192}"), "low_freq_factor", NULL);
    expect_refused(BASE(",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":4.0,"
                        "\"high_freq_factor\":1.0,\"original_max_position_embeddings\":8192}"), "high_freq_factor > low_freq_factor", NULL);
    expect_refused(BASE(",\"rope_scaling\":3"), "rope_scaling", NULL);
}

static void test_refusals(void **state)
{
    (void)state;
    expect_refused("{\"architectures\":[\"GemmaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":1,"
                   "\"num_hidden_layers\":1,\"num_attention_heads\":1,\"vocab_size\":3}",
                   "GemmaForCausalLM", "supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM");
    expect_refused("{\"model_type\":\"gpt2\",\"hidden_size\":64}", "LlamaForCausalLM", NULL);
    expect_refused("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":1,"
                   "\"num_hidden_layers\":1,\"num_attention_heads\":1,\"vocab_size\":3,\"sliding_window\":4096}",
                   "sliding_window", "supported: MistralForCausalLM");
    expect_refused("{\"architectures\":\"LlamaForCausalLM\"}", "architectures", NULL);
    expect_refused("{\"architectures\":[]}", "architectures", NULL);
    expect_refused(BASE(",\"attention_bias\":true"), "attention_bias", "not supported");
    expect_refused(BASE(",\"mlp_bias\":true"), "mlp_bias", NULL);
    expect_refused(BASE(",\"mlp_bias\":1"), "mlp_bias", "true or false");
    expect_refused(BASE(",\"hidden_act\":\"gelu\""), "hidden_act", NULL);
    /* ranges and types */
    expect_refused("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":0,\"intermediate_size\":1,"
                   "\"num_hidden_layers\":1,\"num_attention_heads\":1,\"vocab_size\":3}", "hidden_size", "outside");
    expect_refused("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64.5,\"intermediate_size\":1,"
                   "\"num_hidden_layers\":1,\"num_attention_heads\":1,\"vocab_size\":3}", "hidden_size", "integer");
    expect_refused("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":\"64\",\"intermediate_size\":1,"
                   "\"num_hidden_layers\":1,\"num_attention_heads\":1,\"vocab_size\":3}", "hidden_size", NULL);
    expect_refused("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":99999999999999999999,"
                   "\"intermediate_size\":1,\"num_hidden_layers\":1,\"num_attention_heads\":1,\"vocab_size\":3}",
                   "hidden_size", NULL);
    expect_refused("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":1,"
                   "\"num_hidden_layers\":1,\"num_attention_heads\":1}", "missing vocab_size", NULL);
    expect_refused(BASE(",\"num_key_value_heads\":3"), "num_key_value_heads", "divisor");
    expect_refused(BASE(",\"num_key_value_heads\":16"), "num_key_value_heads", "outside");
    expect_refused(BASE(",\"num_key_value_heads\":0"), "num_key_value_heads", NULL);
    expect_refused(BASE(",\"head_dim\":7"), "head_dim", "even");
    expect_refused(BASE(",\"rms_norm_eps\":-1e-5"), "rms_norm_eps", NULL);
    expect_refused(BASE(",\"rms_norm_eps\":0"), "rms_norm_eps", NULL);
    expect_refused(BASE(",\"rms_norm_eps\":1e-85"), "rms_norm_eps", NULL); /* 0 as a float */
    expect_refused(BASE(",\"rope_theta\":1e400"), "rope_theta", NULL);
    expect_refused(BASE(",\"max_position_embeddings\":-1"), "max_position_embeddings", NULL);
    expect_refused(BASE(",\"tie_word_embeddings\":\"yes\""), "tie_word_embeddings", NULL);
    expect_refused(BASE(",\"eos_token_id\":512"), "eos_token_id", NULL); /* outside the vocab */
    expect_refused(BASE(",\"eos_token_id\":[1,\"2\"]"), "eos_token_id", NULL);
    expect_refused(BASE(",\"eos_token_id\":[1,2,3,4,5,6,7,8,9]"), "eos_token_id", "at most 8");
    expect_refused(BASE(",\"bos_token_id\":-3"), "bos_token_id", NULL);
    expect_refused("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":65,\"intermediate_size\":1,"
                   "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"vocab_size\":3}", "multiple", NULL);
    /* not a config at all */
    expect_refused("[1,2,3]", "json object", NULL);
    expect_refused("{\"hidden_size\": 64,", "json", NULL);
    expect_refused("", "json", NULL);
}

/* Qwen2 / Qwen3: a minimal config of each; QBASE(arch, extra). */
#define QBASE(arch, extra)                                                                   \
    "{\"architectures\":[\"" arch "\"],\"hidden_size\":64,\"intermediate_size\":172,"        \
    "\"num_hidden_layers\":4,\"num_attention_heads\":32,\"vocab_size\":512" extra "}"

static bool layer_slides(const llama_config *c, int32_t l)
{
    return llama_layer_window(c, l) > 0;
}

/* Qwen2Config / Qwen3Config's defaults (configuration_qwen2.py,
 * configuration_qwen3.py; v4 and v5 agree), which differ from Llama's. */
static void test_qwen_defaults(void **state)
{
    (void)state;
    llama_config c;
    expect_ok(&c, QBASE("Qwen2ForCausalLM", ""));
    assert_string_equal(c.architecture, "Qwen2ForCausalLM");
    assert_int_equal(c.num_key_value_heads, 32); /* not num_attention_heads' default */
    assert_int_equal(c.head_dim, 2);             /* hidden / heads */
    assert_int_equal(c.max_position_embeddings, 32768);
    assert_true(c.rms_norm_eps == 1e-6f);
    assert_true(c.rope_theta == 10000.0f);
    assert_false(c.tie_word_embeddings);
    assert_true(c.family.qkv_bias);
    assert_false(c.family.qk_norm);
    assert_int_equal(c.sliding_window, 0);
    for (int32_t l = 0; l < 4; l++)
        assert_false(layer_slides(&c, l));

    expect_ok(&c, QBASE("Qwen3ForCausalLM", ""));
    assert_int_equal(c.num_key_value_heads, 32);
    assert_int_equal(c.head_dim, 128); /* Qwen3Config's, not hidden / heads */
    assert_int_equal(c.max_position_embeddings, 32768);
    assert_false(c.family.qkv_bias);
    assert_true(c.family.qk_norm);

    /* null kv heads is num_attention_heads (the "backward compatibility" branch) */
    expect_ok(&c, "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":172,"
                  "\"num_hidden_layers\":4,\"num_attention_heads\":16,\"vocab_size\":512,"
                  "\"num_key_value_heads\":null,\"head_dim\":64}");
    assert_int_equal(c.num_key_value_heads, 16);
    assert_int_equal(c.head_dim, 64);
    expect_ok(&c, QBASE("Qwen2ForCausalLM", ",\"num_key_value_heads\":4,\"head_dim\":16,\"tie_word_embeddings\":true"));
    assert_int_equal(c.num_key_value_heads, 4);
    assert_int_equal(c.head_dim, 16);
    assert_true(c.tie_word_embeddings);
    /* the absent-kv default of 32 must divide the heads */
    expect_refused("{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":172,"
                   "\"num_hidden_layers\":4,\"num_attention_heads\":16,\"vocab_size\":512}",
                   "num_key_value_heads", "Qwen default");
    /* the bare transformers of embedding models read as their family */
    expect_ok(&c, QBASE("Qwen3Model", ""));
    assert_string_equal(c.architecture, "Qwen3ForCausalLM");
    expect_ok(&c, QBASE("MistralModel", ""));
    assert_string_equal(c.architecture, "MistralForCausalLM");
    assert_int_equal(c.sliding_window, 4096);
    /* model_type without architectures */
    expect_ok(&c, "{\"model_type\":\"qwen3\",\"hidden_size\":64,\"intermediate_size\":172,"
                  "\"num_hidden_layers\":4,\"num_attention_heads\":32,\"vocab_size\":512}");
    assert_string_equal(c.architecture, "Qwen3ForCausalLM");
    expect_ok(&c, "{\"model_type\":\"qwen2\",\"hidden_size\":64,\"intermediate_size\":172,"
                  "\"num_hidden_layers\":4,\"num_attention_heads\":32,\"vocab_size\":512}");
    assert_string_equal(c.architecture, "Qwen2ForCausalLM");
    /* Qwen2 ignores attention_bias / mlp_bias (its biases are fixed); a Llama would refuse */
    expect_ok(&c, QBASE("Qwen2ForCausalLM", ",\"attention_bias\":false,\"mlp_bias\":true"));
    assert_true(c.family.qkv_bias);
    /* a Llama stays a Llama: no family fields */
    expect_ok(&c, BASE(""));
    assert_false(c.family.qkv_bias || c.family.qk_norm);
    assert_int_equal(c.family.layer_window, 0);
}

static void test_qwen_windows(void **state)
{
    (void)state;
    llama_config c;
    /* Qwen2.5's shipped keys: use_sliding_window false -> no window anywhere */
    expect_ok(&c, QBASE("Qwen2ForCausalLM", ",\"use_sliding_window\":false,\"sliding_window\":131072,\"max_window_layers\":2"));
    assert_int_equal(c.sliding_window, 0);
    for (int32_t l = 0; l < 4; l++)
        assert_false(layer_slides(&c, l));
    /* use_sliding_window: layers >= max_window_layers slide (default window 4096) */
    expect_ok(&c, QBASE("Qwen2ForCausalLM", ",\"use_sliding_window\":true,\"max_window_layers\":2"));
    assert_int_equal(c.sliding_window, 0);
    assert_int_equal(c.family.layer_window, 4096);
    assert_int_equal(llama_layer_window(&c, 0), 0);
    assert_int_equal(llama_layer_window(&c, 1), 0);
    assert_int_equal(llama_layer_window(&c, 2), 4096);
    assert_int_equal(llama_layer_window(&c, 3), 4096);
    /* the default max_window_layers 28 >= 4 layers: none slides */
    expect_ok(&c, QBASE("Qwen3ForCausalLM", ",\"use_sliding_window\":true,\"sliding_window\":64"));
    for (int32_t l = 0; l < 4; l++)
        assert_false(layer_slides(&c, l));
    /* every layer slides: the engine-level window (blocks are freed) */
    expect_ok(&c, QBASE("Qwen3ForCausalLM", ",\"use_sliding_window\":true,\"sliding_window\":64,\"max_window_layers\":0"));
    assert_int_equal(c.sliding_window, 64);
    assert_int_equal(c.family.layer_window, 0);
    for (int32_t l = 0; l < 4; l++)
        assert_int_equal(llama_layer_window(&c, l), 64);
    /* layer_types wins over max_window_layers */
    expect_ok(&c, QBASE("Qwen2ForCausalLM", ",\"use_sliding_window\":true,\"sliding_window\":8,\"max_window_layers\":0,"
                        "\"layer_types\":[\"sliding_attention\",\"full_attention\",\"sliding_attention\",\"full_attention\"]"));
    assert_int_equal(c.sliding_window, 0);
    assert_int_equal(llama_layer_window(&c, 0), 8);
    assert_int_equal(llama_layer_window(&c, 1), 0);
    assert_int_equal(llama_layer_window(&c, 2), 8);
    assert_int_equal(llama_layer_window(&c, 3), 0);
    /* transformers 5 writes layer_types of full attention beside a null window */
    expect_ok(&c, QBASE("Qwen3ForCausalLM", ",\"sliding_window\":null,\"layer_types\":[\"full_attention\","
                        "\"full_attention\",\"full_attention\",\"full_attention\"]"));
    for (int32_t l = 0; l < 4; l++)
        assert_false(layer_slides(&c, l));
    /* a sliding layer without a window is refused, not run as full attention */
    expect_refused(QBASE("Qwen2ForCausalLM", ",\"layer_types\":[\"sliding_attention\",\"full_attention\","
                         "\"full_attention\",\"full_attention\"]"),
                   "layer_types", "window is None");
    expect_refused(QBASE("Qwen2ForCausalLM", ",\"use_sliding_window\":true,\"sliding_window\":null,"
                         "\"layer_types\":[\"sliding_attention\",\"full_attention\",\"full_attention\",\"full_attention\"]"),
                   "layer_types", "window is None");
    expect_refused(QBASE("Qwen2ForCausalLM", ",\"layer_types\":[\"full_attention\"]"), "layer_types", "4 strings");
    expect_refused(QBASE("Qwen2ForCausalLM", ",\"layer_types\":[\"full_attention\",\"chunked_attention\","
                         "\"full_attention\",\"full_attention\"]"),
                   "layer_types[1]", NULL);
    expect_refused(QBASE("Qwen2ForCausalLM", ",\"use_sliding_window\":true,\"sliding_window\":0"), "sliding_window", NULL);
}

static void test_qwen_refusals(void **state)
{
    (void)state;
    /* MoE families other than Mixtral / Qwen2-MoE / Qwen3-MoE: by name */
    expect_refused(QBASE("DeepseekV3ForCausalLM", ""), "DeepseekV3ForCausalLM", "mixture-of-experts");
    expect_refused(QBASE("GptOssForCausalLM", ""), "GptOssForCausalLM", "mixture-of-experts");
    expect_refused("{\"model_type\":\"olmoe\",\"hidden_size\":64,\"intermediate_size\":172,"
                   "\"num_hidden_layers\":4,\"num_attention_heads\":32,\"vocab_size\":512}",
                   "olmoe", "mixture-of-experts");
    expect_refused(QBASE("Qwen3ForCausalLM", ",\"attention_bias\":true"), "attention_bias", NULL);
    expect_refused(QBASE("Qwen3ForCausalLM", ",\"hidden_act\":\"gelu\""), "hidden_act", NULL);
    expect_refused(QBASE("Qwen2ForCausalLM", ",\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4.0,"
                         "\"original_max_position_embeddings\":32768}"),
                   "yarn", NULL);
    expect_refused(QBASE("Qwen2VLForConditionalGeneration", ""), "not supported", "Qwen3ForCausalLM");
}

/* The three MoE families as transformers v5 main 008e5743 reads them
 * (configuration_mixtral.py, configuration_qwen2_moe.py,
 * configuration_qwen3_moe.py and their modeling files' decoder layers). */
static bool layer_moe(const llama_config *c, int32_t l)
{
    return llama_layer_moe(c, l);
}

static void test_moe_configs(void **state)
{
    (void)state;
    llama_config c;
    /* Mixtral: 8 experts, top 2, experts of intermediate_size, always
     * renormalized, every layer sparse; MixtralConfig's other defaults */
    expect_ok(&c, QBASE("MixtralForCausalLM", ""));
    assert_int_equal(c.family.n_experts, 8);
    assert_int_equal(c.family.n_experts_per_tok, 2);
    assert_int_equal(c.family.moe_intermediate_size, 172);
    assert_int_equal(c.family.shared_expert_intermediate_size, 0);
    assert_true(c.family.norm_topk_prob);
    assert_true(c.family.moe_mixtral_keys);
    assert_false(c.family.qkv_bias || c.family.qk_norm);
    for (int32_t l = 0; l < 4; l++)
        assert_true(layer_moe(&c, l));
    assert_false(layer_moe(&c, 4));
    assert_int_equal(c.num_key_value_heads, 8);
    assert_int_equal(c.head_dim, 2); /* 64 / 32 */
    assert_true(c.rope_theta == 1000000.0f);
    assert_true(c.rms_norm_eps == 1e-5f);
    assert_int_equal(c.max_position_embeddings, 131072);
    assert_int_equal(c.sliding_window, 0); /* None by default, unlike Mistral's 4096 */
    expect_ok(&c, QBASE("MixtralForCausalLM", ",\"num_local_experts\":4,\"num_experts_per_tok\":3,"
                        "\"sliding_window\":64,\"router_jitter_noise\":0.1,\"num_key_value_heads\":null"));
    assert_int_equal(c.family.n_experts, 4);
    assert_int_equal(c.family.n_experts_per_tok, 3);
    assert_int_equal(c.sliding_window, 64);
    assert_int_equal(c.num_key_value_heads, 32);
    expect_ok(&c, "{\"model_type\":\"mixtral\",\"hidden_size\":64,\"intermediate_size\":172,"
                  "\"num_hidden_layers\":4,\"num_attention_heads\":32,\"vocab_size\":512}");
    assert_string_equal(c.architecture, "MixtralForCausalLM");
    expect_refused(QBASE("MixtralForCausalLM", ",\"num_experts_per_tok\":9"), "num_experts_per_tok", "8");
    expect_refused(QBASE("MixtralForCausalLM", ",\"num_local_experts\":0"), "num_local_experts", NULL);

    /* Qwen2-MoE: 60 experts, top 4, 1408 / 5632 wide, no renormalization,
     * q/k/v biases (qkv_bias), 16 kv heads */
    expect_ok(&c, QBASE("Qwen2MoeForCausalLM", ""));
    assert_int_equal(c.family.n_experts, 60);
    assert_int_equal(c.family.n_experts_per_tok, 4);
    assert_int_equal(c.family.moe_intermediate_size, 1408);
    assert_int_equal(c.family.shared_expert_intermediate_size, 5632);
    assert_false(c.family.norm_topk_prob);
    assert_false(c.family.moe_mixtral_keys);
    assert_true(c.family.qkv_bias);
    assert_false(c.family.qk_norm);
    assert_int_equal(c.num_key_value_heads, 16);
    assert_int_equal(c.max_position_embeddings, 32768);
    assert_true(c.rope_theta == 10000.0f && c.rms_norm_eps == 1e-6f);
    for (int32_t l = 0; l < 4; l++)
        assert_true(layer_moe(&c, l));
    expect_ok(&c, QBASE("Qwen2MoeForCausalLM", ",\"qkv_bias\":false,\"decoder_sparse_step\":2,"
                        "\"mlp_only_layers\":[3,17],\"norm_topk_prob\":true,\"shared_expert_intermediate_size\":0"));
    assert_false(c.family.qkv_bias);
    assert_true(c.family.norm_topk_prob);
    assert_int_equal(c.family.shared_expert_intermediate_size, 0);
    /* (l + 1) % 2 == 0 and l not in mlp_only_layers: layer 1 only */
    assert_false(layer_moe(&c, 0));
    assert_true(layer_moe(&c, 1));
    assert_false(layer_moe(&c, 2));
    assert_false(layer_moe(&c, 3));
    /* num_experts 0: every layer dense */
    expect_ok(&c, QBASE("Qwen2MoeForCausalLM", ",\"num_experts\":0"));
    for (int32_t l = 0; l < 4; l++)
        assert_false(layer_moe(&c, l));
    expect_refused(QBASE("Qwen2MoeForCausalLM", ",\"decoder_sparse_step\":0"), "decoder_sparse_step", NULL);
    expect_refused(QBASE("Qwen2MoeForCausalLM", ",\"mlp_only_layers\":[-1]"), "mlp_only_layers[0]", NULL);
    expect_refused(QBASE("Qwen2MoeForCausalLM", ",\"use_sliding_window\":true"), "use_sliding_window", NULL);

    /* Qwen3-MoE: 128 experts, top 8, 768 wide, q/k norms, 4 kv heads,
     * head_dim hidden / heads when absent */
    expect_ok(&c, QBASE("Qwen3MoeForCausalLM", ""));
    assert_int_equal(c.family.n_experts, 128);
    assert_int_equal(c.family.n_experts_per_tok, 8);
    assert_int_equal(c.family.moe_intermediate_size, 768);
    assert_int_equal(c.family.shared_expert_intermediate_size, 0);
    assert_false(c.family.norm_topk_prob);
    assert_true(c.family.qk_norm);
    assert_false(c.family.qkv_bias);
    assert_int_equal(c.num_key_value_heads, 4);
    assert_int_equal(c.head_dim, 2);
    /* Qwen3-30B-A3B's config.json (the hub's, trimmed to the keys read) */
    expect_ok(&c, "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"decoder_sparse_step\":1,\"head_dim\":128,"
                  "\"hidden_act\":\"silu\",\"hidden_size\":2048,\"intermediate_size\":6144,"
                  "\"max_position_embeddings\":40960,\"max_window_layers\":48,\"mlp_only_layers\":[],"
                  "\"model_type\":\"qwen3_moe\",\"moe_intermediate_size\":768,\"norm_topk_prob\":true,"
                  "\"num_attention_heads\":32,\"num_experts\":128,\"num_experts_per_tok\":8,"
                  "\"num_hidden_layers\":48,\"num_key_value_heads\":4,\"rms_norm_eps\":1e-06,"
                  "\"rope_scaling\":null,\"rope_theta\":1000000.0,\"sliding_window\":null,"
                  "\"tie_word_embeddings\":false,\"use_sliding_window\":false,\"vocab_size\":151936}");
    assert_true(c.family.norm_topk_prob);
    assert_int_equal(c.head_dim, 128);
    for (int32_t l = 0; l < 48; l++)
        assert_true(layer_moe(&c, l));
    assert_int_equal(c.sliding_window, 0);
    expect_refused(QBASE("Qwen3MoeForCausalLM", ",\"attention_bias\":true"), "attention_bias", NULL);
    expect_refused(QBASE("Qwen3MoeForCausalLM", ",\"layer_types\":[\"full_attention\",\"sliding_attention\","
                         "\"full_attention\",\"full_attention\"]"),
                   "layer_types[1]", NULL);
    /* dense families have no experts */
    expect_ok(&c, QBASE("Qwen3ForCausalLM", ",\"num_experts\":8"));
    assert_int_equal(c.family.n_experts, 0);
    assert_false(layer_moe(&c, 0));
}

static void test_merge_generation(void **state)
{
    (void)state;
    llama_config c;
    pg_error e;
    expect_ok(&c, BASE(",\"eos_token_id\":2"));
    const char *gen = "{\"bos_token_id\":1,\"eos_token_id\":[128001,2,3],\"temperature\":0.6,\"top_p\":0.9,"
                      "\"top_k\":50,\"do_sample\":true,\"max_length\":4096,\"transformers_version\":\"4.45\"}";
    /* 128001 is outside this vocab: refused, and c does not change */
    llama_config before = c;
    assert_int_equal(llama_config_merge_generation(&c, gen, strlen(gen), "generation_config.json", &e), PG_EFORMAT);
    assert_true(strstr(e.msg, "generation_config.json: eos_token_id") != NULL);
    assert_memory_equal(&c, &before, sizeof c);

    gen = "{\"bos_token_id\":1,\"eos_token_id\":[2,3,2],\"temperature\":0.6,\"top_p\":0.9,"
          "\"top_k\":50,\"do_sample\":true,\"repetition_penalty\":1.1,\"min_p\":0.05,\"max_new_tokens\":77}";
    if (llama_config_merge_generation(&c, gen, strlen(gen), "generation_config.json", &e) != PG_OK)
        fail_msg("%s", e.msg);
    assert_int_equal(c.n_eos_token_ids, 2);
    assert_int_equal(c.eos_token_ids[0], 2);
    assert_int_equal(c.eos_token_ids[1], 3);
    assert_int_equal(c.bos_token_id, 1); /* config had none */
    assert_true(c.has_temperature && c.temperature == 0.6f);
    assert_true(c.has_top_p && c.top_p == 0.9f);
    assert_true(c.has_top_k && c.top_k == 50);
    assert_true(c.has_do_sample && c.do_sample);
    assert_true(c.has_repetition_penalty && c.repetition_penalty == 1.1f);
    assert_true(c.has_min_p && c.min_p == 0.05f);
    assert_true(c.has_max_new_tokens && c.max_new_tokens == 77);

    before = c;
    static const char *const bad[] = {
        "{\"top_p\":1.5}", "{\"top_p\":0}", "{\"temperature\":-1}", "{\"top_k\":-2}",
        "{\"do_sample\":\"true\"}", "[]", "{\"eos_token_id\":{}}", "nope",
        "{\"repetition_penalty\":0}", "{\"min_p\":1.5}", "{\"max_new_tokens\":0}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (llama_config_merge_generation(&c, bad[i], strlen(bad[i]), "generation_config.json", &e) == PG_OK)
            fail_msg("accepted %s", bad[i]);
        assert_true(strstr(e.msg, "generation_config.json") != NULL);
        assert_memory_equal(&c, &before, sizeof c);
    }
    /* nulls are absent */
    const char *nulls = "{\"temperature\":null,\"eos_token_id\":null}";
    assert_int_equal(llama_config_merge_generation(&c, nulls, strlen(nulls), "g", &e), PG_OK);
    assert_memory_equal(&c, &before, sizeof c);
}

static void test_load_errors(void **state)
{
    (void)state;
    llama_config c;
    pg_error e;
    assert_int_equal(llama_config_load(&c, "/nonexistent/model", &e), PG_EIO);
    assert_true(strstr(e.msg, "/nonexistent/model/config.json") != NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_codellama),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_rope_scaling),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_qwen_defaults),
        cmocka_unit_test(test_qwen_windows),
        cmocka_unit_test(test_qwen_refusals),
        cmocka_unit_test(test_moe_configs),
        cmocka_unit_test(test_merge_generation),
        cmocka_unit_test(test_load_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
