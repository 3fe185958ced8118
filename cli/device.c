/* device: executor choice, KV pool sizing and model creation (see device.h). */
#include "device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_executor.h"
#include "cpu_gemm_modes.h"
#include "cpu_wt.h"
#include "cuda_loader.h"
#include "cuda_plan.h"
#include "step_batch.h"

/* The checkpoint's weight dtype: that of model.embed_tokens.weight, F32
 * when the checkpoint cannot be read here (loading it reports why). */
static st_dtype checkpoint_dtype(const char *model_dir)
{
    st_file *f = NULL;
    pg_error ignored;
    st_dtype d = ST_F32;
    if (model_dir && st_open(&f, model_dir, &ignored) == PG_OK) {
        const st_tensor *t = st_find(f, "model.embed_tokens.weight");
        if (t)
            d = t->dtype;
        st_close(f);
    }
    return d;
}

_Static_assert((int)CLI_MATMUL_BF16 == (int)CPU_MATMUL_BF16 && (int)CLI_MATMUL_INT8 == (int)CPU_MATMUL_INT8,
               "--matmul-precision's values are the cpu executor's");

void cli_cpu_storage(const cli_options *o, st_dtype checkpoint, int32_t *wt, int32_t *kv)
{
    if (o->quantization == CLI_QUANT_INT8 || o->matmul_precision == CLI_MATMUL_INT8)
        *wt = CPU_WT_I8;
    else if (o->matmul_precision == CLI_MATMUL_BF16)
        *wt = CPU_WT_BF16; /* the mode computes on bf16: f32 and f16 checkpoints are rounded */
    else if (o->dtype == CLI_DTYPE_BF16 || (o->dtype == CLI_DTYPE_AUTO && checkpoint == ST_BF16))
        *wt = CPU_WT_BF16;
    else
        *wt = CPU_WT_F32; /* f32 and f16 checkpoints: f16 -> bf16 is not exact */
    switch (o->kv_cache_dtype) {
    case CLI_KV_DTYPE_F32: *kv = CPU_KV_F32; break;
    case CLI_KV_DTYPE_BF16: *kv = CPU_KV_BF16; break;
    case CLI_KV_DTYPE_FP16: *kv = CPU_KV_F16; break;
    default: *kv = *wt == CPU_WT_F32 ? CPU_KV_F32 : CPU_KV_BF16; break;
    }
}

/* --device auto: the CUDA module when the driver reports a device (or
 * when $PAGEDGEN_CUDA_MODULE names one: it is asked instead), else NULL
 * and the cpu. Nothing CUDA is loaded on a machine without a driver. */
static int auto_module(const cuda_module **m, pg_error *err)
{
    *m = NULL;
    const char *env = getenv(CLI_CUDA_MODULE_ENV);
    if (env && *env) {
        int rc = cli_cuda_load(m, err);
        if (rc != PG_OK)
            return pg_error_wrap(err, rc, "--device auto");
        if ((*m)->device_count() <= 0)
            *m = NULL;
        return PG_OK;
    }
    int n = cli_cuda_driver_device_count();
    if (n <= 0)
        return PG_OK;
    pg_error why;
    if (cli_cuda_load(m, &why) != PG_OK || (*m)->device_count() <= 0) {
        /* a GPU without a usable module: the cpu still runs; say so once */
        fprintf(stderr, "pagedgen: warning: --device auto: the driver reports %d CUDA device%s, but %s; "
                        "running on the cpu\n",
                n, n == 1 ? "" : "s", *m ? "the CUDA module finds none" : why.msg);
        *m = NULL;
    }
    return PG_OK;
}

int cli_device_open(const cli_options *o, executor **out, pg_error *err)
{
    *out = NULL;
    const cuda_module *m = NULL;
    int rc;
    if (strcmp(o->device, "cuda") == 0) {
        if ((rc = cli_cuda_load(&m, err)) != PG_OK)
            return rc;
    } else if (strcmp(o->device, "auto") == 0) {
        if ((rc = auto_module(&m, err)) != PG_OK)
            return rc;
    }
    if (m) {
        int n = m->device_count();
        if (n <= 0)
            return pg_error_set(err, PG_EUNSUPPORTED, "--device cuda: no CUDA device found");
        if (o->cuda_device >= n)
            return pg_error_set(err, PG_EINVAL, "--cuda-device %d: expected 0 .. %d (%d device%s found)",
                                (int)o->cuda_device, n - 1, n, n == 1 ? "" : "s");
        rc = cli_options_check_dtypes(o, "cuda", err);
        if (rc != PG_OK)
            return rc;
        cuda_executor_params cp = m->executor_params_default();
        cp.device = o->cuda_device;
        cp.precision = o->dtype == CLI_DTYPE_F32 ? 1 : 0;
        cp.kv_dtype = o->kv_cache_dtype == CLI_KV_DTYPE_FP16 ? 1 : 0; /* ignored with precision 1 */
        cp.fast_gemm = o->fast_gemm ? 1 : 0;
        rc = m->executor_create(out, &cp, err);
        /* the flags were checked above: any failure is the device's */
        return rc == PG_EINVAL ? PG_EDEVICE : rc;
    }
    rc = cli_options_check_dtypes(o, "cpu", err);
    if (rc != PG_OK) {
        if (strcmp(o->device, "auto") == 0)
            pg_error_wrap(err, rc, "--device auto picked the cpu (no CUDA device)");
        return rc;
    }
    cpu_executor_params p = {.threads = o->threads, .matmul_precision = (int32_t)o->matmul_precision};
    cli_cpu_storage(o, checkpoint_dtype(o->model_dir), &p.wt_dtype, &p.kv_dtype);
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

static int64_t blocks_per_seq(const cli_options *o, int32_t max_model_len)
{
    return ((int64_t)max_model_len + o->block_size - 1) / o->block_size;
}

static int too_small(const cli_kv_plan *plan, const cli_options *o, int32_t max_model_len,
                     pg_error *err)
{
    int64_t per_seq = blocks_per_seq(o, max_model_len);
    return pg_error_set(err, PG_EINVAL,
                        "kv cache: %s gives %d blocks of %d tokens, but one %d-token sequence needs %lld "
                        "(%.1f MiB); raise --kv-cache-memory or lower --max-model-len",
                        plan->source, (int)plan->num_blocks, (int)o->block_size, (int)max_model_len,
                        (long long)per_seq,
                        (double)per_seq * (double)plan->bytes_per_block / 1048576.0);
}

int cli_kv_plan_make(cli_kv_plan *plan, const cli_options *o, executor *ex,
                     const llama_config *cfg, int32_t max_model_len, pg_error *err)
{
    memset(plan, 0, sizeof *plan);
    plan->bytes_per_block = model_kv_bytes_per_block(cfg, ex, o->block_size);
    int64_t per_seq = blocks_per_seq(o, max_model_len);
    if (o->num_kv_blocks > 0) {
        plan->num_blocks = o->num_kv_blocks;
        plan->source = "--num-kv-blocks";
        return PG_OK;
    }
    int64_t cap = 0;
    if (o->kv_cache_bytes > 0) {
        plan->budget_bytes = o->kv_cache_bytes;
        plan->source = "--kv-cache-memory";
    } else if (strcmp(ex->name, "cpu") == 0) {
        size_t free_b = 0, total_b = 0;
        if (ex->op->mem_info(ex, &free_b, &total_b) != PG_OK)
            return pg_error_set(err, PG_EDEVICE, "%s: cannot read free memory: %s (give --kv-cache-memory)",
                                ex->name, ex->op->last_error(ex));
        cap = (int64_t)o->max_num_seqs * per_seq;
        plan->budget_bytes = (uint64_t)((double)free_b * CLI_CPU_KV_FRACTION);
        plan->source = "40% of MemAvailable";
        /* a large model: the pool gets what the weights leave of 90% */
        const double weights = (double)model_weight_bytes(cfg, ex), room = 0.9 * (double)free_b - weights;
        if ((double)plan->budget_bytes > room) {
            plan->budget_bytes = room > 0.0 ? (uint64_t)room : 0;
            plan->source = "90% of MemAvailable less the weights";
        }
    } else {
        return pg_error_set(err, PG_EINVAL,
                            "kv cache on %s: the default size is measured while loading the model "
                            "(cli_model_create)", ex->name);
    }
    plan->num_blocks = cli_kv_blocks_for(plan->budget_bytes, plan->bytes_per_block, cap);
    if (cap > 0 && plan->num_blocks == cap)
        plan->capped_to = (int32_t)cap;
    if (plan->num_blocks < per_seq)
        return too_small(plan, o, max_model_len, err);
    return PG_OK;
}

/* The capacity device_grow (gpu/cuda_executor.c) ends at for `bytes`:
 * doubling from 4096. */
static uint64_t grown_bytes(uint64_t bytes)
{
    uint64_t cap = 4096;
    while (cap < bytes)
        cap *= 2;
    return cap;
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

int32_t cli_cuda_graph_batch(const cli_options *o)
{
    return o->max_num_seqs < o->max_num_batched_tokens ? o->max_num_seqs : o->max_num_batched_tokens;
}

uint64_t cli_cuda_reserve_bytes(const llama_config *cfg, const executor *ex, const cli_options *o,
                                int32_t max_model_len)
{
    const uint64_t S = (uint64_t)o->max_num_seqs, T = (uint64_t)o->max_num_batched_tokens;
    const uint64_t H = (uint64_t)cfg->hidden_size, I = (uint64_t)cfg->intermediate_size;
    const uint64_t nh = (uint64_t)cfg->num_attention_heads, nkv = (uint64_t)cfg->num_key_value_heads;
    const uint64_t hd = (uint64_t)cfg->head_dim, V = (uint64_t)cfg->vocab_size;
    const uint64_t act = ex->act_bytes, stride = (uint64_t)blocks_per_seq(o, max_model_len);
    uint64_t total = CLI_CUDA_SLACK_BYTES;

    /* logits [L][V] f32, L <= S rows sample in a step (cuda_logits) */
    total += grown_bytes(S * V * 4u);
    /* sampled rows that want logprobs, kept as the sampler reads them for
     * gpu/logprobs.cu (cuda_sample_rows.c): up to S rows of V f32, grown
     * on demand (at most the step's rows) */
    total += grown_bytes(S * V * 4u);
    /* decode attention split workspace: S x nh x partitions x (hd + 2) f32
     * (pgk_decode_workspace_floats), only when a sequence spans more than
     * one partition */
    cuda_decode_plan dp;
    pg_error ignored;
    const bool split = nkv > 0 &&
                       cuda_plan_decode(&dp, (int32_t)hd, (int32_t)(nh / nkv), max_model_len,
                                        CUDA_PLAN_SMEM_DEFAULT_BYTES, &ignored) == 0 &&
                       dp.max_partitions > 1;
    if (split)
        total += grown_bytes(S * nh * (uint64_t)dp.max_partitions * (hd + 2u) * 4u);
    /* step metadata: 3T + (S + 1) + S + S x stride + L int32 (cuda_begin_step) */
    total += grown_bytes((3u * T + 2u * S + 1u + S * stride + S) * 4u);
    /* CUDA graphs (cuda_executor.h): their own metadata block, logits (device
     * and pinned) and decode workspace for the largest bucket */
    if (!o->enforce_eager) {
        const uint64_t G = (uint64_t)cli_cuda_graph_batch(o);
        total += grown_bytes((6u * G + 1u + G * stride) * 4u);
        total += grown_bytes(G * V * 4u);
        if (split)
            total += grown_bytes(G * nh * (uint64_t)dp.max_partitions * (hd + 2u) * 4u);
    }
    /* GEMM padding (cuda_gemm.c, batch-invariant mode): x [128][K] act for
     * the largest K, y [128][N] for the largest N (act, or the logits' f32) */
    if (!o->fast_gemm) {
        uint64_t k_max = max_u64(max_u64(H, I), nh * hd);
        uint64_t n_max = max_u64(max_u64((nh + 2u * nkv) * hd, 2u * I), H);
        total += 128u * k_max * act;
        total += 128u * max_u64(n_max * act, V * 4u);
    }
    return total;
}

/* The dummy step of the profile run (vLLM's profile_run): the largest step
 * the scheduler can form, max_num_batched_tokens tokens (no more than
 * max-num-seqs sequences of max-model-len hold) over min(max-num-seqs,
 * tokens) prefill sequences, every one sampling. Each token gets its own KV
 * slot, so the probe pool holds probe_blocks blocks. */
typedef struct profile_step {
    int32_t T, S, stride, probe_blocks;
} profile_step;

static void profile_shape(profile_step *p, const cli_options *o, int32_t max_model_len)
{
    int64_t T = o->max_num_batched_tokens, cap = (int64_t)o->max_num_seqs * max_model_len;
    if (T > cap)
        T = cap;
    p->T = (int32_t)T;
    p->S = o->max_num_seqs < p->T ? o->max_num_seqs : p->T;
    int32_t base = p->T / p->S, extra = p->T % p->S, bs = o->block_size;
    p->stride = (base + (extra > 0) + bs - 1) / bs;
    p->probe_blocks = extra * ((base + 1 + bs - 1) / bs) + (p->S - extra) * ((base + bs - 1) / bs);
}

/* Fills the dummy step into the host arrays (token 0 everywhere: ids are
 * calloc'ed) and runs it. */
static int profile_forward(model *probe, const profile_step *p, int32_t block_size, const int32_t *ids,
                           int32_t *pos, int32_t *slots, int32_t *qs, int32_t *lens, int32_t *rows,
                           int32_t *tables, float *logits, pg_error *err)
{
    const int32_t T = p->T, S = p->S, base = T / S, extra = T % S;
    int32_t next_block = 0, max_q = 0;
    qs[0] = 0;
    for (int32_t s = 0; s < S; s++) {
        int32_t q = base + (s < extra);
        qs[s + 1] = qs[s] + q;
        lens[s] = q;
        rows[s] = qs[s + 1] - 1;
        max_q = q > max_q ? q : max_q;
        int32_t nb = (q + block_size - 1) / block_size;
        for (int32_t k = 0; k < nb; k++)
            tables[(size_t)s * (size_t)p->stride + (size_t)k] = next_block + k;
        for (int32_t i = 0; i < q; i++) {
            pos[qs[s] + i] = i;
            slots[qs[s] + i] = (next_block + i / block_size) * block_size + i % block_size;
        }
        next_block += nb;
    }
    step_batch b = {
        .num_tokens = T, .num_seqs = S, .block_size = block_size, .token_ids = ids, .positions = pos,
        .slots = slots, .query_start = qs, .seq_lens = lens, .block_tables = tables,
        .block_table_stride = p->stride, .max_seq_len = max_q, .max_query_len = max_q,
        .num_logits = S, .logits_rows = rows,
    };
    int rc = model_forward(probe, &b, logits, err);
    if (rc != PG_OK)
        return pg_error_wrap(err, rc, "profile run (a %d-token step of %d sequences)", (int)T, (int)S);
    return PG_OK;
}

/* Runs the dummy step on the probe model: lazily loaded kernels, the
 * cuBLAS workspaces and every buffer the executor grows for a step of this
 * size are then allocated. The step's host arrays are freed here. */
static int profile_run(model *probe, const profile_step *p, const llama_config *cfg, int32_t block_size,
                       pg_error *err)
{
    const size_t T = (size_t)p->T, S = (size_t)p->S;
    int32_t *ids = calloc(T, sizeof *ids), *pos = calloc(T, sizeof *pos);
    int32_t *slots = calloc(T, sizeof *slots), *qs = calloc(S + 1, sizeof *qs);
    int32_t *lens = calloc(S, sizeof *lens), *rows = calloc(S, sizeof *rows);
    int32_t *tables = calloc(S * (size_t)p->stride, sizeof *tables);
    float *logits = malloc(S * (size_t)cfg->vocab_size * sizeof *logits);
    int rc;
    if (!ids || !pos || !slots || !qs || !lens || !rows || !tables || !logits)
        rc = pg_error_set(err, PG_ENOMEM, "profile run: out of host memory for a %d-token step", (int)p->T);
    else
        rc = profile_forward(probe, p, block_size, ids, pos, slots, qs, lens, rows, tables, logits, err);
    free(ids);
    free(pos);
    free(slots);
    free(qs);
    free(lens);
    free(rows);
    free(tables);
    free(logits);
    return rc;
}

/* The cuda default: load the model with a probe pool, read the free memory,
 * run the profile step, read it again, destroy the probe and plan with
 * cuda_plan_kv_blocks from the free memory after both. */
static int plan_cuda_measured(cli_kv_plan *plan, const cli_options *o, executor *ex,
                              const llama_config *cfg, const st_file *weights,
                              const model_params *final_params, int32_t max_model_len, pg_error *err)
{
    int64_t per_seq = blocks_per_seq(o, max_model_len);
    size_t free_before = 0, free_after = 0, free_profiled = 0, total = 0;
    if (ex->op->mem_info(ex, &free_before, &total) != PG_OK)
        return pg_error_set(err, PG_EDEVICE, "cuda: cannot read free memory: %s (give --kv-cache-memory)",
                            ex->op->last_error(ex));
    profile_step ps;
    profile_shape(&ps, o, max_model_len);
    model_params probe_params = *final_params;
    probe_params.num_kv_blocks = ps.probe_blocks;
    model *probe = NULL;
    int rc = model_create(&probe, ex, cfg, weights, &probe_params, err);
    if (rc != PG_OK)
        return pg_error_wrap(err, rc, "loading the model to measure device memory (%.1f MiB free of %.1f MiB)",
                             (double)free_before / 1048576.0, (double)total / 1048576.0);
    rc = ex->op->sync(ex);
    if (rc == PG_OK)
        rc = ex->op->mem_info(ex, &free_after, &total);
    if (rc != PG_OK) {
        model_destroy(probe);
        return pg_error_set(err, PG_EDEVICE, "cuda: cannot read free memory after loading: %s",
                            ex->op->last_error(ex));
    }
    rc = profile_run(probe, &ps, cfg, o->block_size, err);
    if (rc == PG_OK && (rc = ex->op->sync(ex)) == PG_OK)
        rc = ex->op->mem_info(ex, &free_profiled, &total);
    else if (rc == PG_OK)
        rc = pg_error_set(err, PG_EDEVICE, "cuda: profile run: %s", ex->op->last_error(ex));
    model_destroy(probe);
    if (rc != PG_OK)
        return rc;

    /* as if the probe had held one block (what the final model holds beside its pool) */
    const size_t extra_pool = (size_t)(ps.probe_blocks - 1) * plan->bytes_per_block;
    free_after += extra_pool;
    free_profiled += extra_pool;
    plan->profile_bytes = free_after > free_profiled ? free_after - free_profiled : 0;
    plan->measured = 1;
    plan->total_bytes = total;
    plan->free_after_load_bytes = free_after;
    plan->load_bytes = free_before > free_after ? free_before - free_after : 0;
    plan->reserve_bytes = cli_cuda_reserve_bytes(cfg, ex, o, max_model_len);
    free_after -= plan->profile_bytes; /* what the profile step left allocated counts as in use */
    plan->source = "--gpu-memory-utilization";
    cuda_mem_plan_in in = {
        .total_bytes = total,
        .free_bytes = free_after,
        .utilization = o->gpu_memory_utilization,
        .reserve_bytes = (size_t)plan->reserve_bytes,
        .kv_bytes_per_block = plan->bytes_per_block,
        .min_blocks = per_seq > INT32_MAX ? INT32_MAX : (int32_t)per_seq,
    };
    int32_t n = 0;
    rc = cuda_plan_kv_blocks(&n, &in, err);
    if (rc != PG_OK)
        return pg_error_wrap(err, rc,
                             "kv cache on cuda device %d (total %.1f MiB, free %.1f MiB after loading "
                             "%.1f MiB: weights %.1f MiB + workspaces, and the profile run %.1f MiB; "
                             "utilization %.2f; one %d-token sequence needs %lld blocks)",
                             (int)o->cuda_device, (double)total / 1048576.0,
                             (double)free_after / 1048576.0, (double)plan->load_bytes / 1048576.0,
                             (double)plan->profile_bytes / 1048576.0,
                             (double)model_weight_bytes(cfg, ex) / 1048576.0, o->gpu_memory_utilization,
                             (int)max_model_len, (long long)per_seq);
    double allowed = (double)total * o->gpu_memory_utilization - (double)(total - free_after) -
                     (double)plan->reserve_bytes;
    plan->budget_bytes = allowed > 0.0 ? (uint64_t)allowed : 0;
    int64_t cap = (int64_t)o->max_num_seqs * per_seq;
    plan->num_blocks = n;
    if (n >= cap) {
        plan->num_blocks = (int32_t)(cap > INT32_MAX ? INT32_MAX : cap);
        plan->capped_to = plan->num_blocks;
    }
    return PG_OK;
}

int cli_cpu_check_memory(const cli_kv_plan *plan, executor *ex, const llama_config *cfg, pg_error *err)
{
    size_t free_b = 0, total_b = 0;
    if (ex->op->mem_info(ex, &free_b, &total_b) != PG_OK)
        return PG_OK; /* nothing to compare with: loading reports a failed allocation */
    const double gib = 1073741824.0;
    const double weights = (double)model_weight_bytes(cfg, ex);
    const double kv = plan ? (double)plan->num_blocks * (double)plan->bytes_per_block : 0.0;
    if (weights + kv <= (double)free_b)
        return PG_OK;
    const char *wt = ex->wt_block_elems ? "int8" : (ex->wt_bytes == 2 ? "bf16" : "f32");
    if (!plan)
        return pg_error_set(err, PG_ENOMEM,
                            "cpu: the weights need %.1f GiB as %s (before any kv cache), %.1f GiB available "
                            "(MemAvailable); store them smaller (--dtype bfloat16, --quantization int8)",
                            weights / gib, wt, (double)free_b / gib);
    return pg_error_set(err, PG_ENOMEM,
                        "cpu: the model needs %.1f GiB (weights as %s %.1f GiB + kv cache %.1f GiB), "
                        "%.1f GiB available (MemAvailable); store the weights smaller (--dtype bfloat16, "
                        "--quantization int8) or give a smaller --kv-cache-memory",
                        (weights + kv) / gib, wt, weights / gib, kv / gib, (double)free_b / gib);
}

int cli_model_create(model **out, cli_kv_plan *plan, const cli_options *o, executor *ex,
                     const llama_config *cfg, const st_file *weights, int32_t max_model_len,
                     pg_error *err)
{
    *out = NULL;
    model_params mp = {
        .num_kv_blocks = 0,
        .block_size = o->block_size,
        .max_num_batched_tokens = o->max_num_batched_tokens,
        .max_num_seqs = o->max_num_seqs,
    };
    int rc;
    /* cpu: weights that cannot fit are refused before the pool is planned */
    if (strcmp(ex->name, "cpu") == 0 && (rc = cli_cpu_check_memory(NULL, ex, cfg, err)) != PG_OK)
        return rc;
    bool measure = strcmp(ex->name, "cpu") != 0 && o->num_kv_blocks == 0 && o->kv_cache_bytes == 0;
    if (measure) {
        memset(plan, 0, sizeof *plan);
        plan->bytes_per_block = model_kv_bytes_per_block(cfg, ex, o->block_size);
        rc = plan_cuda_measured(plan, o, ex, cfg, weights, &mp, max_model_len, err);
    } else {
        rc = cli_kv_plan_make(plan, o, ex, cfg, max_model_len, err);
    }
    if (rc != PG_OK)
        return rc;
    if (strcmp(ex->name, "cpu") == 0 && (rc = cli_cpu_check_memory(plan, ex, cfg, err)) != PG_OK)
        return rc;
    mp.num_kv_blocks = plan->num_blocks;
    rc = model_create(out, ex, cfg, weights, &mp, err);
    /* CUDA graphs for the decode steps (vLLM's default; --enforce-eager:
     * none), up to the largest decode step the scheduler can form; the
     * executor came from the module, which is loaded (cli_cuda_load returns
     * its table again) */
    if (rc == PG_OK && strcmp(ex->name, "cuda") == 0 && ex->op->run_step && !o->enforce_eager) {
        const cuda_module *m = NULL;
        int32_t max_batch = cli_cuda_graph_batch(o);
        if ((rc = cli_cuda_load(&m, err)) != PG_OK ||
            (rc = m->executor_set_graphs(ex, max_batch, max_model_len, err)) != PG_OK) {
            model_destroy(*out);
            *out = NULL;
        }
    }
    return rc;
}
