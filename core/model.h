/* model: the LLaMA forward pass over a ragged step_batch, written once
 * against the executor interface (executor.h). Owns the device copies of
 * the weights (fused QKV and fused gate|up matrices, concatenated once at
 * load), the KV cache, the activation workspace and the RoPE table.
 *
 * Per layer (DESIGN.md): rmsnorm -> qkv matmul -> rope -> kv_write ->
 * paged attention -> o matmul (+ residual, fused into the next rmsnorm) ->
 * rmsnorm -> gate|up matmul -> silu*mul -> down matmul (+ residual).
 * Final norm and lm_head only for the rows that sample.
 */
#ifndef PG_MODEL_H
#define PG_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "engine.h"
#include "executor.h"
#include "pg_error.h"
#include "safetensors.h"

typedef struct model_params {
    int32_t num_kv_blocks;        /* KV pool size in blocks */
    int32_t block_size;           /* tokens per block */
    int32_t max_num_batched_tokens; /* largest T of a step (workspace size) */
    int32_t max_num_seqs;         /* largest S (and L) of a step */
} model_params;

typedef struct model model;

/* Bytes of KV cache one block takes on ex (all layers, K and V). */
size_t model_kv_bytes_per_block(const llama_config *cfg, const executor *ex, int32_t block_size);
/* Bytes the weights take on ex once uploaded (fused layout). */
size_t model_weight_bytes(const llama_config *cfg, const executor *ex);

/* Checks every tensor's name, shape and dtype against cfg (the message names
 * the tensor, expected vs found), uploads them through ex, allocates the KV
 * cache and workspace. ex and cfg are borrowed for the model's lifetime;
 * weights only during the call. */
int model_create(model **out, executor *ex, const llama_config *cfg, const st_file *weights,
                 const model_params *p, pg_error *err);
void model_destroy(model *m); /* accepts NULL */

/* logits [b->num_logits][vocab] f32 on the host. */
int model_forward(model *m, const step_batch *b, float *logits, pg_error *err);
int model_copy_blocks(model *m, const int32_t *src_dst, int32_t n_pairs, pg_error *err);

/* The engine backend over this model (borrows m). */
engine_backend model_backend(model *m);

#endif /* PG_MODEL_H */
