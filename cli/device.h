/* device: which executor runs the model, how many KV blocks it gets, and
 * the model created with them.
 *
 * KV pool sizing (cli/README.md "Engine flags and the KV cache"), in this order:
 *   --num-kv-blocks N        exactly N blocks;
 *   --kv-cache-memory SIZE   floor(SIZE / bytes per block);
 *   default, cpu             40% of MemAvailable, or what the weights leave
 *                            of 90% of it when that is less;
 *   default, cuda            measured, vLLM's rule (cuda_plan_kv_blocks):
 *                            util x total - (total - free after loading the
 *                            model with a probe pool and running one
 *                            largest step on it, vLLM's profile run) - the
 *                            buffers the executor still grows while running;
 *                            the probe model is then destroyed and the model
 *                            created again with the planned pool;
 * and the defaults are capped to max_num_seqs x ceil(max_model_len /
 * block_size) blocks: more could never be used at once. Without
 * --num-kv-blocks the pool must hold at least one max_model_len sequence. */
#ifndef PG_CLI_DEVICE_H
#define PG_CLI_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "executor.h"
#include "model.h"
#include "options.h"
#include "pg_error.h"
#include "safetensors.h"

#define CLI_CPU_KV_FRACTION 0.40
/* Margin on top of the buffers cli_cuda_reserve_bytes models one by one:
 * kernel images loaded lazily on first launch (ours and cuBLAS's), cuBLAS
 * allocations at its first call, allocator granularity. */
#define CLI_CUDA_SLACK_BYTES ((uint64_t)64 << 20)

/* The executor --device asks for (auto: cuda when the driver reports a
 * device and the CUDA module loads, else cpu; cli/cuda_loader.h), made from --threads, --dtype,
 * --kv-cache-dtype, --cuda-device and --fast-gemm. PG_EUNSUPPORTED when cuda
 * is asked of a build or machine without it (the module missing: a message
 * naming the paths tried), PG_EINVAL when the flags do not
 * fit the device picked (both are usage errors); other codes are device
 * failures. Destroy with ex->op->destroy(ex). */
int cli_device_open(const cli_options *o, executor **out, pg_error *err);

/* The cpu executor's storage types (cpu_wt, cpu_kv) for the options and
 * the checkpoint's dtype: --quantization int8 -> int8; --dtype bfloat16, or
 * auto on a BF16 checkpoint -> bf16 (lossless); else f32 (an F16 checkpoint
 * too: f16 -> bf16 would round). The cache: as --kv-cache-dtype, auto = f32
 * for f32 weights, bf16 otherwise. */
void cli_cpu_storage(const cli_options *o, st_dtype checkpoint, int32_t *wt, int32_t *kv);

typedef struct cli_kv_plan {
    int32_t num_blocks;
    size_t bytes_per_block;
    uint64_t budget_bytes;      /* the memory the plan was made from (0 with --num-kv-blocks) */
    const char *source;         /* "--num-kv-blocks", "--kv-cache-memory", "40% of MemAvailable", ... */
    int32_t capped_to;          /* > 0 when the default was capped to what can be used */
    /* cuda default only (measured = 1): the numbers the plan came from */
    int measured;
    uint64_t total_bytes;       /* device memory */
    uint64_t free_after_load_bytes; /* free with the probe model loaded (its pool counted as one block) */
    uint64_t load_bytes;        /* free before - free after loading the probe */
    uint64_t reserve_bytes;     /* cli_cuda_reserve_bytes */
    uint64_t profile_bytes;     /* what the profile step (the largest step, run once on the
                                   probe) left allocated: lazily loaded kernels, cuBLAS and
                                   executor workspaces; counted as in use */
} cli_kv_plan;

/* Pure arithmetic behind cli_kv_plan_make (tested on its own). */
int32_t cli_kv_blocks_for(uint64_t budget_bytes, size_t bytes_per_block, int64_t cap_blocks);

/* Plans the pool for ex and cfg under the options, for every case but the
 * measured cuda default (cli_model_create does that one). PG_EINVAL (with a
 * hint) when the pool cannot hold one max_model_len sequence. */
int cli_kv_plan_make(cli_kv_plan *plan, const cli_options *o, executor *ex,
                     const llama_config *cfg, int32_t max_model_len, pg_error *err);

/* PG_ENOMEM, before anything is loaded, when the weights as ex stores them
 * plus the planned pool (plan NULL: the weights alone) exceed what ex->op->mem_info reports free ("cpu:
 * the model needs X GiB (...), Y GiB available ..."). */
int cli_cpu_check_memory(const cli_kv_plan *plan, executor *ex, const llama_config *cfg, pg_error *err);

/* Plans the pool and creates the model with it: *out (destroy with
 * model_destroy) and *plan. weights are borrowed for the call. On cuda
 * without --num-kv-blocks / --kv-cache-memory the model is loaded twice
 * (probe, then final; see the top of this file). PG_ENOMEM with every
 * number (total, free after loading, weights, utilization) when not even
 * one max_model_len sequence fits. */
int cli_model_create(model **out, cli_kv_plan *plan, const cli_options *o, executor *ex,
                     const llama_config *cfg, const st_file *weights, int32_t max_model_len,
                     pg_error *err);

/* Device bytes the CUDA executor allocates only while running, each at its
 * largest for these options and rounded as the executor grows it (powers of
 * two from 4 KiB): the lm_head logits [max_num_seqs][V] f32, the decode
 * attention split workspace for max_num_seqs sequences of max_model_len, the
 * step metadata, the GEMM padding buffers ([128][K] in, [128][N] out; none
 * with --fast-gemm), and unless --enforce-eager the CUDA graphs' own
 * metadata, logits and workspace for cli_cuda_graph_batch sequences; plus
 * CLI_CUDA_SLACK_BYTES. */
/* The largest decode step graphed on CUDA: min(max_num_seqs,
 * max_num_batched_tokens) (the warm-up runs a step of that many). */
int32_t cli_cuda_graph_batch(const cli_options *o);

uint64_t cli_cuda_reserve_bytes(const llama_config *cfg, const executor *ex, const cli_options *o,
                                int32_t max_model_len);

#endif /* PG_CLI_DEVICE_H */
