/* device: which executor runs the model, and how many KV blocks it gets.
 *
 * KV pool sizing (README "Memory"), in this order:
 *   --num-kv-blocks N        exactly N blocks;
 *   --kv-cache-memory SIZE   floor(SIZE / bytes per block);
 *   default, cpu             40% of MemAvailable;
 *   default, cuda            90% of the free device memory, minus the
 *                            weights and a 512 MiB activation reserve;
 * and the defaults are capped to max_num_seqs x ceil(max_model_len /
 * block_size) blocks: more could never be used at once. Without
 * --num-kv-blocks the pool must hold at least one max_model_len sequence. */
#ifndef PG_CLI_DEVICE_H
#define PG_CLI_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "executor.h"
#include "options.h"
#include "pg_error.h"

#define CLI_CPU_KV_FRACTION 0.40
#define CLI_CUDA_MEM_FRACTION 0.90
#define CLI_CUDA_RESERVE_BYTES ((uint64_t)512 << 20)

/* device "auto" | "cpu" | "cuda". PG_EUNSUPPORTED when cuda is asked of a
 * build or machine without it. Destroy with ex->op->destroy(ex). */
int cli_device_open(const char *device, int32_t threads, executor **out, pg_error *err);

typedef struct cli_kv_plan {
    int32_t num_blocks;
    size_t bytes_per_block;
    uint64_t budget_bytes;      /* the memory the plan was made from (0 with --num-kv-blocks) */
    const char *source;         /* "--num-kv-blocks", "--kv-cache-memory", "40% of MemAvailable", ... */
    int32_t capped_to;          /* > 0 when the default was capped to what can be used */
} cli_kv_plan;

/* Pure arithmetic behind cli_kv_plan_make (tested on its own). */
int32_t cli_kv_blocks_for(uint64_t budget_bytes, size_t bytes_per_block, int64_t cap_blocks);

/* Plans the pool for ex and cfg under the options. PG_EINVAL (with a hint)
 * when the pool cannot hold one max_model_len sequence. */
int cli_kv_plan_make(cli_kv_plan *plan, const cli_options *o, executor *ex,
                     const llama_config *cfg, int32_t max_model_len, pg_error *err);

#endif /* PG_CLI_DEVICE_H */
