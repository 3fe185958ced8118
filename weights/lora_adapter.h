/* lora_adapter: one PEFT LoRA adapter folder (adapter_config.json +
 * adapter_model.safetensors) read against a base model's config, as f32
 * matrices per layer and projection. Nothing here runs a forward: a later
 * step computes, for each adapted projection with weight W [out, in],
 *     y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ
 * with A [r, in] and B [out, r] row-major (PEFT's lora_A.weight /
 * lora_B.weight, nn.Linear layout) and s = alpha / r, or alpha / sqrt(r)
 * with use_rslora, rank_pattern / alpha_pattern applied per module
 * (lora_config.h).
 *
 * Tensor names as PEFT's get_peft_model_state_dict saves them
 * (peft/utils/save_and_load.py, 5d602fdb): "base_model.model." + module +
 * ".lora_A.weight", the adapter name removed; the form with the adapter name
 * (".lora_A.default.weight") and without the "base_model.model." prefix are
 * read too, as vLLM's parse_fine_tuned_lora_name does (vllm/lora/utils.py,
 * 001e63a8). Modules are "model.layers.L.self_attn.{q,k,v,o}_proj" and
 * "model.layers.L.mlp.{gate,up,down}_proj".
 *
 * Every check happens at load, before any use: each tensor must be the A or
 * B of a projection the config selects (anything else — lora_embedding_*,
 * lm_head, modules_to_save copies, lora_magnitude_vector (DoRA), lora biases,
 * unknown names — is refused by name), each selected projection must have
 * both, shapes must be [r, in] / [out, r] for the base config's sizes (a
 * mismatch names the tensor and both shapes), dtype F32 / F16 / BF16
 * (converted to f32). */
#ifndef PG_LORA_ADAPTER_H
#define PG_LORA_ADAPTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "pg_error.h"
#include "safetensors.h"

typedef enum lora_proj {
    LORA_Q = 0, LORA_K, LORA_V, LORA_O, /* self_attn */
    LORA_GATE, LORA_UP, LORA_DOWN,      /* mlp */
    LORA_NPROJ,
} lora_proj;

/* "q_proj", ... and "self_attn" / "mlp" */
const char *lora_proj_name(lora_proj p);
const char *lora_proj_block(lora_proj p);
/* The projection's in / out features for the base config:
 * q [H -> nh·hd], k and v [H -> nkv·hd], o [nh·hd -> H], gate and up
 * [H -> I], down [I -> H]. */
void lora_proj_dims(const llama_config *base, lora_proj p, int32_t *in, int32_t *out);

/* One adapted projection of one layer; r == 0: not adapted (A, B NULL). */
typedef struct lora_weights {
    int32_t r, in, out;
    float scale;      /* s: alpha / r or alpha / sqrt(r) */
    float *A;         /* [r, in] row-major, owned */
    float *B;         /* [out, r] row-major, owned */
} lora_weights;

typedef struct lora_adapter {
    char base_model_name_or_path[512]; /* printed, never trusted */
    int32_t r;                 /* the config's r */
    double lora_alpha;
    bool use_rslora;
    int32_t max_rank;          /* the largest r of any adapted projection */
    int32_t n_adapted;         /* adapted (layer, projection) pairs */
    int32_t n_layers;          /* the base config's */
    lora_weights *w;           /* [n_layers * LORA_NPROJ], owned */
} lora_adapter;

/* The weights of layer l, projection p (r == 0 when not adapted). */
static inline const lora_weights *lora_adapter_at(const lora_adapter *a, int32_t l, lora_proj p)
{
    return &a->w[(size_t)l * LORA_NPROJ + (size_t)p];
}

/* Builds an adapter from adapter_config.json text and a parsed tensor list
 * (st_parse's or st_open's), checked against `base`. Pure (no files); the
 * fuzz and unit tests call it. Messages about the config's keys name
 * `config_label`, those about tensors `tensors_label`. On error *out is
 * NULL. */
int lora_adapter_build(lora_adapter **out, const char *config_json, size_t config_len,
                       const char *config_label, const st_tensor *tensors, size_t n_tensors,
                       const char *tensors_label, const llama_config *base, pg_error *err);

/* Reads DIR/adapter_config.json and DIR/adapter_model.safetensors.
 * Refused by name: adapter_model.bin (a pickle; convert it), a
 * new_embeddings.safetensors or a non-empty added_tokens.json (added
 * tokens). On error *out is NULL. */
int lora_adapter_load(lora_adapter **out, const char *dir, const llama_config *base, pg_error *err);
void lora_adapter_free(lora_adapter *a); /* accepts NULL */

#endif /* PG_LORA_ADAPTER_H */
