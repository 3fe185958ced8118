/* model: the LLaMA forward pass over a ragged step_batch, written once
 * against the executor interface (executor.h). Owns the device copies of
 * the weights (fused QKV and fused gate|up matrices, concatenated once at
 * load), the KV cache, the activation workspace and the RoPE table.
 *
 * Per layer (DESIGN.md): rmsnorm -> qkv matmul -> rope -> kv_write ->
 * paged attention -> o matmul (+ residual, fused into the next rmsnorm) ->
 * rmsnorm -> gate|up matmul -> silu*mul -> down matmul (+ residual).
 * Final norm and lm_head only for the rows that sample; final norm only,
 * on request, for the rows an embedding pools (model_hidden_rows).
 */
#ifndef PG_MODEL_H
#define PG_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "engine.h"
#include "executor.h"
#include "op_profile.h"
#include "pg_error.h"
#include "safetensors.h"

/* Sizes of what the model allocates on the executor; all > 0. For the
 * batches an engine builds: block_size equal to the engine's, the others at
 * least the engine's (engine_params). */
typedef struct model_params {
    int32_t num_kv_blocks;        /* KV pool size in blocks (engine num_blocks) */
    int32_t block_size;           /* tokens per block */
    int32_t max_num_batched_tokens; /* largest T of a step (workspace size) */
    int32_t max_num_seqs;         /* largest S (and L) of a step */
} model_params;

typedef struct model model;

/* Bytes of KV cache one block takes on ex (all layers, K and V). */
size_t model_kv_bytes_per_block(const llama_config *cfg, const executor *ex, int32_t block_size);
/* Bytes the weights take on ex once uploaded (fused layout). */
size_t model_weight_bytes(const llama_config *cfg, const executor *ex);

/* Checks every tensor's name ("model.layers.0...", or without "model." for a
 * base model saved alone: see model_has_lm_head), shape and dtype (F32, F16 or BF16) against cfg
 * (the message names the tensor, expected vs found), uploads them through ex
 * (fusing q|k|v and gate|up), allocates the KV cache and workspace. ex and
 * cfg are borrowed for the model's lifetime; weights only during the call
 * (the model keeps its own copies). PG_EINVAL for an invalid cfg or p,
 * PG_EFORMAT for a missing or mis-shaped tensor, PG_ENOMEM with the sizes
 * and the device's free memory; on error *out is NULL and nothing is left
 * allocated. */
int model_create(model **out, executor *ex, const llama_config *cfg, const st_file *weights,
                 const model_params *p, pg_error *err);
/* Frees every device buffer through ex (which must still exist). Accepts NULL. */
void model_destroy(model *m);

/* Runs the forward pass over b: writes the K/V of every token into its slot
 * and fills logits [b->num_logits][vocab] f32 (host memory, rows in
 * b->logits_rows order; untouched when num_logits = 0). Only the sizes are
 * checked (PG_EINVAL: T, S, L over the model_params, another block size);
 * the ids, positions, slots and tables must be valid (the engine builds
 * them). An executor failure returns its status with the op and layer.
 * On an executor with run_step (CUDA) the op-by-op forward is handed to it,
 * which may replay a captured graph of it instead (executor.h): the same
 * results. */
int model_forward(model *m, const step_batch *b, float *logits, pg_error *err);
/* model_forward for a step whose rows needing logits may be every token
 * (prompt logprobs, scoring): b->num_logits <= b->num_tokens, logits_rows
 * increasing. The logits arrive in slices of at most slice_rows rows, each
 * written to buf [slice_rows][vocab] f32 (host, the caller's) and handed to
 * sink(sink_ctx, first, n, buf, err) for rows first .. first+n-1 of
 * b->logits_rows, in order; host memory never holds more than one slice.
 * Each row's values are the bits model_forward gives for that row (the
 * head's arithmetic is row-local, the lm_head product row-invariant). A
 * sink error stops the forward and is returned as it is. */
int model_forward_rows(model *m, const step_batch *b, float *buf, int32_t slice_rows,
                       engine_rows_fn sink, void *sink_ctx, pg_error *err);
/* For the next model_forward only: its logits rows r < L with greedy[r]
 * != 0 are not written; ids[r] gets the argmax of that row on the device
 * (the executor's greedy_rows, executor.h: core/sampler.c's greedy rule,
 * bit for bit), so the row's logits stay there. PG_EUNSUPPORTED when the
 * executor has no greedy_rows (the CPU): the caller then samples every
 * row itself. greedy and ids are borrowed until that forward returns. */
int model_greedy_rows(model *m, const uint8_t *greedy, int32_t L, int32_t *ids, pg_error *err);
/* For the next model_forward or model_forward_rows only: its logits rows
 * r < L (L = its num_logits) with rows[r].want are not returned; rows[r]
 * gets their log-softmax results instead (the executor's logprob_rows,
 * executor.h; handed to it for the whole step, or per lm_head slice).
 * PG_EUNSUPPORTED when the executor has no logprob_rows (the CPU). rows
 * is borrowed until that forward returns; L = 0 clears it. */
int model_logprob_rows(model *m, pg_lsm_row *rows, int32_t L, pg_error *err);
/* For the next model_forward only: its logits rows req->rows[q].row are
 * not written; req->ids[q] gets the token sampled from that row on the
 * device (the executor's sample_rows, executor.h: common/pg_sample.h's
 * definition, core/sampler.c's token bit for bit). PG_EUNSUPPORTED when
 * the executor has none (the CPU). req is borrowed until that forward
 * returns; NULL clears it. */
int model_sample_rows(model *m, const pg_smp_batch *req, pg_error *err);
/* Copies KV blocks src_dst[2k] -> src_dst[2k+1], k < n_pairs, in every layer
 * (copy-on-write). PG_EINVAL, nothing copied, for an id outside the pool. */
int model_copy_blocks(model *m, const int32_t *src_dst, int32_t n_pairs, pg_error *err);

/* Right after model_forward: the final-norm hidden states (the rows the
 * lm_head would read) of the step's token rows row0 .. row0+n-1 into out
 * [n][H] f32 (host). Each row at most once per forward (the residual
 * stream is finished in place). PG_EINVAL for rows outside the workspace;
 * an executor failure returns its status. Embedding requests (pooling.h). */
int model_hidden_rows(model *m, int32_t row0, int32_t n, float *out, pg_error *err);

/* False for a headless embedding checkpoint (no "model." prefix, untied,
 * no lm_head.weight: what sentence-transformers saves, e.g.
 * Qwen3-Embedding-8B): it computes hidden rows only, and model_forward
 * refuses a batch with logits rows (PG_EUNSUPPORTED). */
bool model_has_lm_head(const model *m);

/* Times every op of every later forward into p (borrowed; NULL stops):
 * op_profile.h. Meaningful on an executor whose ops complete before they
 * return (the CPU); on CUDA the ops are asynchronous. */
void model_set_op_profile(model *m, op_profile *p);

/* --profile-steps: hands p (step_profile.h; borrowed, NULL stops) to the
 * executor's set_step_profile and marks every op of every later forward
 * (executor op_mark), so the executor reports its host phases of a step
 * and times each op on the device (CUDA, eager steps). PG_EUNSUPPORTED
 * (nothing set) when the executor has no step profile (the CPU: the
 * engine's phases still run; its forward is all "launch"). */
typedef struct step_profile step_profile;
int model_set_step_profile(model *m, step_profile *p);

/* LoRA adapters (issue 33; weights/lora_adapter.h). Uploads a's matrices
 * (A [r][in], B [out][r] per adapted projection) into act buffers of the
 * executor as resident slot *slot (0, 1, ... in call order); the forward
 * then adds, after each adapted projection (q, k, v into their columns of
 * qkv after Qwen2's bias, o, gate and up into gate_up, down), the deltas
 * of the rows whose step_batch.lora_slots name a slot (executor.h
 * lora_add: PEFT's lora.Linear.forward). a is borrowed for the call; name
 * is for messages. Refused: an executor without lora_add
 * (PG_EUNSUPPORTED, naming it), another layer count or projection shape,
 * a rank over PG_LORA_MAX_RANK (PG_EINVAL), an adapted MLP projection of
 * a mixture-of-experts layer (PG_EUNSUPPORTED, naming the module). */
typedef struct lora_adapter lora_adapter;
int model_lora_add(model *m, const lora_adapter *a, const char *name, int32_t *slot, pg_error *err);
int32_t model_lora_count(const model *m);

/* The engine backend over this model (borrows m). */
engine_backend model_backend(model *m);

#endif /* PG_MODEL_H */
