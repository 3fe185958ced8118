/* config: a Hugging Face LLaMA config.json (+ generation_config.json merged
 * on top) as plain data. Knows nothing about inference. */
#ifndef PG_CONFIG_H
#define PG_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pg_error.h"

#define LLAMA_MAX_EOS 8
#define LLAMA_MAX_LAYERS 4096 /* num_hidden_layers' range */

typedef enum llama_rope_scaling_type {
    LLAMA_ROPE_NONE = 0,
    LLAMA_ROPE_LINEAR,   /* positions divided by factor */
    LLAMA_ROPE_LLAMA3,   /* Llama 3.1 frequency-dependent scaling */
} llama_rope_scaling_type;

typedef struct llama_rope_scaling {
    llama_rope_scaling_type type;
    float factor;                           /* linear and llama3 */
    float low_freq_factor, high_freq_factor; /* llama3 */
    int32_t original_max_position_embeddings; /* llama3 */
} llama_rope_scaling;

/* What a model family changes in the LLaMA forward (STYLE.md habit 17):
 * core/model.c asks these fields, never the architecture's name. All zero
 * is Llama / Mistral. weights/README.md's key table is the same struct seen
 * from config.json. (head_dim and tie_word_embeddings, which differ by
 * family too, are plain llama_config fields.) */
typedef struct llama_family {
    /* Qwen2: self_attn.{q,k,v}_proj.bias ([Q], [KVD], [KVD]) added to the
     * projections (modeling_qwen2.py Qwen2Attention: bias=True; o_proj none) */
    bool qkv_bias;
    /* Qwen3: self_attn.{q,k}_norm.weight [hd]: RMSNorm over head_dim of
     * every q and k head, after the projection and before RoPE
     * (modeling_qwen3.py Qwen3Attention q_norm / k_norm, eps rms_norm_eps) */
    bool qk_norm;
    /* Sliding window on some layers only (Qwen2/3 use_sliding_window with
     * max_window_layers, or layer_types): layer l attends within
     * layer_window tokens when bit l of window_layers is set. 0 when every
     * layer has the window (then llama_config.sliding_window holds it) or
     * none does. */
    int32_t layer_window;
    uint64_t window_layers[LLAMA_MAX_LAYERS / 64];
    /* Mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE; 0 experts: every
     * MLP is dense). Layer l's MLP is sparse when bit l of moe_layers is
     * set (Qwen: decoder_sparse_step and mlp_only_layers; Mixtral: every
     * layer): router logits = h @ gate^T [E], p = softmax in f32 over all
     * E, the n_experts_per_tok largest p (ties: the lower expert id),
     * divided by their sum when norm_topk_prob, each expert an
     * Llama MLP of moe_intermediate_size, summed in rank order
     * (core/model.c, executor.h moe_route / moe_experts). */
    int32_t n_experts;             /* E: num_local_experts (Mixtral) / num_experts (Qwen) */
    int32_t n_experts_per_tok;     /* k <= E */
    int32_t moe_intermediate_size; /* Ie: an expert's (Mixtral: intermediate_size) */
    /* Qwen2-MoE: a shared expert of this size on every sparse layer, scaled
     * by sigmoid(h @ shared_expert_gate^T) and added; 0 = none */
    int32_t shared_expert_intermediate_size;
    bool norm_topk_prob;           /* Mixtral: always */
    /* checkpoint keys: block_sparse_moe.{gate,experts.E.w1|w3|w2} (Mixtral)
     * instead of mlp.{gate,experts.E.gate_proj|up_proj|down_proj} (Qwen) */
    bool moe_mixtral_keys;
    uint64_t moe_layers[LLAMA_MAX_LAYERS / 64];
} llama_family;

typedef struct llama_config {
    /* "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
     * "Qwen3ForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM" or
     * "Qwen3MoeForCausalLM" */
    char architecture[64];
    int32_t hidden_size;          /* H */
    int32_t intermediate_size;    /* I (dense MLPs; Mixtral: the experts') */
    int32_t num_hidden_layers;    /* L */
    int32_t num_attention_heads;  /* nh */
    int32_t num_key_value_heads;  /* nkv (default nh); nh % nkv == 0 */
    int32_t head_dim;             /* hd (default H / nh) */
    int32_t vocab_size;           /* V */
    float rms_norm_eps;
    float rope_theta;
    llama_rope_scaling rope_scaling;
    int32_t max_position_embeddings;
    /* The attention window of every layer in tokens (Mistral's; MistralConfig
     * default 4096 when the key is absent; Qwen's when every layer slides);
     * 0 = full attention in every layer, or a window on some layers only
     * (family.layer_window). The engine frees KV blocks behind this one. */
    int32_t sliding_window;
    llama_family family;
    bool tie_word_embeddings;
    int32_t bos_token_id;         /* -1 if absent */
    int32_t eos_token_ids[LLAMA_MAX_EOS]; /* config's, then generation_config's, deduplicated */
    int32_t n_eos_token_ids;
    /* generation_config.json sampling defaults; has_* false when absent */
    bool has_temperature, has_top_p, has_top_k, has_do_sample;
    float temperature, top_p;
    int32_t top_k;
    bool do_sample;               /* read, but not applied (vLLM ignores it) */
    /* the rest of vLLM's get_diff_sampling_param keys */
    bool has_repetition_penalty, has_min_p, has_max_new_tokens;
    float repetition_penalty;     /* > 0 */
    float min_p;                  /* [0, 1] */
    int32_t max_new_tokens;       /* >= 1: vLLM's default max_tokens, and a cap */
} llama_config;

/* Parses config.json text (pure; fuzz target). `label` names the file in
 * messages. Checks ranges (sizes > 0, nh % nkv == 0, head_dim even, ...)
 * and refuses, naming the key, what would change the math and is not
 * implemented: unsupported architectures (other MoE families by name),
 * attention_bias/mlp_bias true on Llama/Mistral and attention_bias on
 * Qwen3, hidden_act other than silu, rope types other than
 * default/linear/llama3, partial_rotary_factor != 1, a sliding_window on a
 * Llama config, a sliding layer without a window. Each family's defaults
 * are transformers' for its model_type. RoPE is
 * read from both layouts (rope_theta + rope_scaling, and transformers 5's
 * rope_parameters); two places that disagree are refused with both values.
 * weights/README.md has the table of keys. *out is written only on success. */
int llama_config_parse(llama_config *out, const char *json, size_t len,
                       const char *label, pg_error *err);
/* Merges generation_config.json text on top of cfg: its eos ids are added
 * to the list (deduplicated), its bos_token_id is used only when cfg has
 * none, its temperature/top_p/top_k/do_sample/repetition_penalty/min_p/
 * max_new_tokens set the has_* defaults. All
 * or nothing: cfg changes only on success. */
int llama_config_merge_generation(llama_config *cfg, const char *json, size_t len,
                                  const char *label, pg_error *err);
/* Reads DIR/config.json and, when present, DIR/generation_config.json
 * (through pg_read_file with a size cap). *out is written only on success. */
int llama_config_load(llama_config *out, const char *model_dir, pg_error *err);

/* Whether layer l's MLP is a mixture of experts (llama_family.moe_layers). */
static inline bool llama_layer_moe(const llama_config *c, int32_t l)
{
    return c->family.n_experts > 0 && l >= 0 && l < LLAMA_MAX_LAYERS &&
           ((c->family.moe_layers[l / 64] >> (l % 64)) & 1u);
}

/* The attention window of layer l in tokens, 0 = full attention. */
static inline int32_t llama_layer_window(const llama_config *c, int32_t l)
{
    if (c->sliding_window > 0)
        return c->sliding_window;
    if (c->family.layer_window > 0 && l >= 0 && l < LLAMA_MAX_LAYERS &&
        ((c->family.window_layers[l / 64] >> (l % 64)) & 1u))
        return c->family.layer_window;
    return 0;
}

#endif /* PG_CONFIG_H */
