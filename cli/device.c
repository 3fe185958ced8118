/* device: executor choice and KV pool sizing (see device.h). */
#include "device.h"

#include <string.h>
#include <unistd.h>

#include "cpu_executor.h"
#include "model.h"
#ifdef PG_HAVE_CUDA
#include "cuda_executor.h"
#endif

int cli_device_open(const char *device, int32_t threads, executor **out, pg_error *err)
{
    *out = NULL;
    bool want_cuda = strcmp(device, "cuda") == 0;
#ifdef PG_HAVE_CUDA
    if (strcmp(device, "auto") == 0 && cuda_device_count() > 0)
        want_cuda = true;
    if (want_cuda) {
        if (cuda_device_count() <= 0)
            return pg_error_set(err, PG_EUNSUPPORTED, "--device cuda: no CUDA device found");
        cuda_executor_params cp = cuda_executor_params_default();
        return cuda_executor_create(out, &cp, err);
    }
#else
    if (want_cuda)
        return pg_error_set(err, PG_EUNSUPPORTED,
                            "--device cuda: this pagedgen was built without CUDA (meson -Dcuda=enabled)");
#endif
    cpu_executor_params p = {.threads = threads};
    return cpu_executor_create(out, &p, err);
}

int32_t cli_kv_blocks_for(uint64_t budget_bytes, size_t bytes_per_block, int64_t cap_blocks)
{
    if (bytes_per_block == 0)
        return 0;
    uint64_t n = budget_bytes / bytes_per_block;
    if (cap_blocks > 0 && n > (uint64_t)cap_blocks)
        n = (uint64_t)cap_blocks;
    if (n > INT32_MAX)
        n = INT32_MAX;
    return (int32_t)n;
}

int cli_kv_plan_make(cli_kv_plan *plan, const cli_options *o, executor *ex,
                     const llama_config *cfg, int32_t max_model_len, pg_error *err)
{
    memset(plan, 0, sizeof *plan);
    plan->bytes_per_block = model_kv_bytes_per_block(cfg, ex, o->block_size);
    int64_t per_seq = ((int64_t)max_model_len + o->block_size - 1) / o->block_size;
    if (o->num_kv_blocks > 0) {
        plan->num_blocks = o->num_kv_blocks;
        plan->source = "--num-kv-blocks";
        return PG_OK;
    }
    int64_t cap = 0;
    if (o->kv_cache_bytes > 0) {
        plan->budget_bytes = o->kv_cache_bytes;
        plan->source = "--kv-cache-memory";
    } else {
        size_t free_b = 0, total_b = 0;
        if (ex->op->mem_info(ex, &free_b, &total_b) != PG_OK)
            return pg_error_set(err, PG_EDEVICE, "%s: cannot read free memory: %s (give --kv-cache-memory)",
                                ex->name, ex->op->last_error(ex));
        cap = (int64_t)o->max_num_seqs * per_seq;
        if (strcmp(ex->name, "cpu") == 0) {
            plan->budget_bytes = (uint64_t)((double)free_b * CLI_CPU_KV_FRACTION);
            plan->source = "40% of MemAvailable";
        } else {
            double usable = (double)free_b * CLI_CUDA_MEM_FRACTION;
            double rest = usable - (double)model_weight_bytes(cfg, ex) - (double)CLI_CUDA_RESERVE_BYTES;
            plan->budget_bytes = rest > 0 ? (uint64_t)rest : 0;
            plan->source = "90% of free device memory after weights";
        }
    }
    plan->num_blocks = cli_kv_blocks_for(plan->budget_bytes, plan->bytes_per_block, cap);
    if (cap > 0 && plan->num_blocks == cap)
        plan->capped_to = (int32_t)cap;
    if (plan->num_blocks < per_seq)
        return pg_error_set(err, PG_EINVAL,
                            "kv cache: %s gives %d blocks of %d tokens, but one %d-token sequence needs %lld "
                            "(%.1f MiB); raise --kv-cache-memory or lower --max-model-len",
                            plan->source, (int)plan->num_blocks, (int)o->block_size, (int)max_model_len,
                            (long long)per_seq,
                            (double)per_seq * (double)plan->bytes_per_block / 1048576.0);
    return PG_OK;
}
