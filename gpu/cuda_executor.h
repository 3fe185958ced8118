/* cuda_executor: the executor table (core/executor.h) on an NVIDIA GPU —
 * CUDA kernels (one .cu file per op family in gpu/) and cuBLAS for the
 * matrix products (cuda_gemm.c). Plain C: this header includes no CUDA
 * header, so cli/ and the tests can use it; it is only built (and gpu_dep
 * only defines PG_HAVE_CUDA) when meson found nvcc and cuBLAS.
 *
 * Element types (announced in ex->act_bytes, wt_bytes, kv_bytes):
 *   precision 0 (default): activations and weights bf16, KV bf16 or f16;
 *   precision 1: everything f32 — slower, for checking the kernels against
 *     the f32 goldens (stories260K) and the CPU twin to tight tolerances.
 * Every reduction (GEMM, norm, softmax, attention) accumulates in f32.
 *
 * Determinism: the same schedule gives the same bits run after run. By
 * default the GEMMs run in fixed-size calls so that cuBLAS picks the same
 * kernel whatever the batch, and a row's result does not depend on the other
 * rows (cuda_gemm.c); with fast_gemm = 1 it may change in the last bits. The
 * kernels of gpu/ are batch-invariant: a row's reduction order depends
 * only on its own sequence and query length (a one-token query goes to the
 * decode kernel, a longer chunk to the prefill kernel, whatever else is in
 * the step); the two attention kernels sum in different orders, so the
 * same token computed in a chunk of 1 or of 5 may differ in the last bits.
 *
 * One process, one device: the executor calls cudaSetDevice(device) at
 * creation and assumes it stays current on the calling thread. Ops are
 * asynchronous on the executor's stream; logits() and sync() wait.
 *
 * Checks (begin_step, like the CPU twin): positions[t] must equal
 * seq_lens[s] - q_len + i (the kernels derive positions that way), slots
 * and block-table entries >= 0; embed rejects token ids outside [0, V).
 * copy_blocks copies all pairs in parallel and rejects a destination that is
 * another pair's source or destination (a chain a->b, b->c).
 *
 * Environment: PAGEDGEN_CUDA_SYNC=1 synchronizes after every kernel launch,
 * so a device fault is reported by the op that caused it.
 * PAGEDGEN_CUDA_GEMV=off|on|auto (default off): bf16 products on
 * gpu/gemv.cu instead of cuBLAS, chosen per shape for every M (cuda_gemm.h
 * cuda_gemm_set_gemv: on = every eligible shape, auto = by a measurement at
 * each shape's first product, fixed for the run).
 *
 * CUDA graphs (cuda_executor_set_graphs; the CLI turns them on unless
 * --enforce-eager): run_step (executor.h) replays a captured graph for a
 * pure decode step — every sequence one query token, every one sampling —
 * of at most max_batch sequences; prefill and mixed steps, decode steps
 * past the bounds, and every step once a mixture-of-experts op has run
 * (cuda_moe.c plans the expert groups on the host), run eagerly. What is captured: the model's whole
 * forward (embed, every layer's norms, GEMMs, rope_kv (bias, q/k norm,
 * rope, KV write), decode attention and its reduction, the final norm,
 * lm_head, the argmax of each logits row and its copy into pinned memory)
 * for the batch padded to its bucket
 * (cuda_plan_graph_sizes: 1, 2, 4, then multiples of 8 up to max_batch)
 * and for the context tier of its longest sequence (cuda_plan_graph_context:
 * 512, 2048, 8192, ... tokens up to max_seq_len), captured on the first step
 * of each (bucket, tier) after one warm-up step at max_batch and the top
 * tier, which sizes every buffer a capture touches (GEMM padding included)
 * so that no capture allocates. Before each replay the step's metadata
 * (token ids, positions, slots, seq lens, block tables padded to the tier's
 * ceil(context / block_size) entries, only the bucket's rows) is copied into
 * fixed device buffers; after it the logits rows of the real sequences
 * (not the padding's; not the greedy rows of cuda_executor_greedy_next_step)
 * are copied out. The decode grid of a graph is the tier's, at most
 * CUDA_PLAN_DECODE_MAX_SPLITS blocks per sequence and KV head. Graph and
 * eager steps give bit-identical logits and KV (the default fixed-rows GEMMs;
 * with fast_gemm the padded GEMM may differ in the last bits). A capture
 * that fails (the driver refused a call) is not an error: that (bucket,
 * tier) runs eagerly from then on, with one warning on stderr
 * (cuda_graph_info.eager_fallbacks).
 * Memory besides the eager path's: metadata (7 Pm + 1 + Pm * stride) int32,
 * logits Pm * V f32 on the device and pinned, the decode workspace for Pm
 * sequences of min(partitions of max_seq_len, 32) splits (Pm = max_batch),
 * LoRA's scratch Pm * PG_LORA_MAX_RANK act, plus what the driver keeps per
 * graph (not measurable here).
 *
 * LoRA (executor.h lora_add; gpu/lora.cu, cuda_lora.c): begin_step copies
 * step_batch.lora_slots with the metadata; lora_add launches a shrink and
 * an expand kernel per table of up to 64 slots that adapt the projection
 * (none when no slot does), each row reading its slot on the device. From
 * the first graphed step with slots on (the graphs captured before it are
 * dropped then), a graphed step's padded batch always carries slots (the
 * step's, -1 for every row when it has none, -1 for the padding), so a
 * graph captured by a step with adapters replays steps without and the
 * other way round, for any mix of slots, as long as the forward's sequence of lora_add calls
 * does not depend on which slots the rows use (call it for every adapted
 * projection whenever lora_slots != NULL, or always). The per-slot A, B,
 * scale and rank of every call are captured by value: a graph replays
 * them as they were at its capture, so the adapter slots' device buffers
 * must be allocated once (stable pointers) and a slot's contents must not
 * change while graphs captured with it are in use. When one does (an
 * adapter loaded into a slot after the first capture), the next eager step
 * that calls lora_add sees the new values and drops every graph, which
 * are captured again (cuda_lora.c, a signature of the calls); a step
 * replayed before any eager one would use the old values.
 * Scratch: u [T][max rank] act, grown on demand for eager steps; the
 * graphs' [max_batch][PG_LORA_MAX_RANK] is allocated at the warm-up.
 */
#ifndef PG_CUDA_EXECUTOR_H
#define PG_CUDA_EXECUTOR_H

#include <stdint.h>

#include "executor.h"
#include "pg_error.h"

typedef struct cuda_executor_params {
    int32_t device;       /* CUDA device ordinal, 0 .. cuda_device_count()-1 */
    int kv_dtype;         /* 0 bf16, 1 fp16 (precision 0); ignored with precision 1 (f32) */
    int precision;        /* 0 bf16 activations and weights (default), 1 f32 everything */
    int fast_gemm;        /* 0 (default): batch-invariant GEMMs in calls of exactly
                             CUDA_GEMM_FIXED_ROWS (128) rows (cuda_gemm.h); 1: one cuBLAS
                             call of M rows — faster prefill, but a row's last bits may
                             depend on the batch */
} cuda_executor_params;

/* The defaults: device 0, bf16 KV, bf16 precision. */
cuda_executor_params cuda_executor_params_default(void);

/* Creates the executor on p->device: stream, cuBLAS handle and workspace.
 * PG_EDEVICE (with the CUDA error name and string) when the device cannot
 * be used; on success *out is destroyed with (*out)->op->destroy(*out). */
int cuda_executor_create(executor **out, const cuda_executor_params *p, pg_error *err);

/* CUDA graphs for decode steps of up to max_batch sequences (0: off, the
 * default: every step eager) whose contexts are at most max_seq_len tokens
 * (max_model_len: the top context tier, which sizes the fixed block tables
 * and the graphs' decode workspace).
 * max_batch must not exceed the model's max_num_seqs nor its
 * max_num_batched_tokens (the warm-up runs a step of max_batch sequences).
 * Drops the graphs captured so far. PG_EINVAL when ex is not a cuda
 * executor or the bounds are out of range. */
int cuda_executor_set_graphs(executor *ex, int32_t max_batch, int32_t max_seq_len, pg_error *err);
/* Graphs captured and replays run so far (0 and 0 with graphs off). */
void cuda_executor_graph_stats(executor *ex, long *captures, long *replays);
/* The same and more (all 0 with graphs off, but the logits copies). */
typedef struct cuda_graph_info {
    long captures, replays;
    long eager_fallbacks;      /* buckets whose capture failed: their steps run eagerly */
    size_t workspace_bytes;    /* the graphs' decode split workspace (device) */
    size_t meta_upload_bytes;  /* step metadata the last graphed step copied to the device */
    size_t logits_copy_bytes;  /* logits the last step (graphed or eager) copied to the host */
    size_t logits_copy_total_bytes; /* ... every step so far (greedy, logprob and sampled
                                       rows copy none); these two also with graphs off */
} cuda_graph_info;
void cuda_executor_graph_info(executor *ex, cuda_graph_info *out);

/* Negative controls for the tests (tests/gpu/test_cuda_graphs.c), each of
 * which must make a graph-vs-eager comparison fail or be reported:
 *   SKIP_METADATA: replays no longer copy the step's metadata into the
 *     fixed buffers (they replay the last captured step's);
 *   REGROW: reallocate the graph logits buffer now, as a larger step
 *     would; tracked, so the graphs are captured again (a positive control);
 *   REGROW_UNTRACKED: the same without telling the graphs: the next replay
 *     writes to the freed buffer (the host emulator reports it; on a device
 *     it is a use-after-free — emulator only);
 *   FAIL_CAPTURE: the next capture synchronizes the stream, which the
 *     driver forbids while capturing: the capture fails, and that bucket
 *     must run eagerly from then on (with one warning), not end the run.
 * 0, or PG_EINVAL before the first graphed step. */
enum {
    CUDA_GRAPH_TEST_SKIP_METADATA = 1,
    CUDA_GRAPH_TEST_REGROW = 2,
    CUDA_GRAPH_TEST_REGROW_UNTRACKED = 3,
    CUDA_GRAPH_TEST_FAIL_CAPTURE = 4,
};
int cuda_executor_graph_test_fault(executor *ex, int fault);

/* Device-side greedy rows for the next step (run_step, or logits): for
 * every row r < L with greedy[r] != 0, ids_host[r] gets argmax_v of its
 * logits (ties -> lowest id, NaN never wins: core/sampler.c's greedy rule,
 * tests/gpu/test_cuda_executor.c) and its row of logits_host is left
 * unwritten: its V floats do not cross PCIe. The other rows are written as
 * always. For the rows the engine would take the argmax of unchanged
 * (temperature 0, no penalties, bias, grammar, banned ids or logprobs).
 * greedy and ids_host are borrowed until that step returns; the step
 * consumes the mask, and fails with PG_EINVAL when its L differs or a
 * greedy row has no logit > -inf. L = 0 clears it. PG_EINVAL when ex is
 * not a cuda executor. The executor table's greedy_rows (executor.h):
 * core/engine.c marks its plain greedy rows through model_backend. */
int cuda_executor_greedy_next_step(executor *ex, const uint8_t *greedy, int32_t L,
                                   int32_t *ids_host);

/* Device-side logprob rows for the next logits (run_step's, or the next
 * logits op of a forward: the model marks each lm_head slice of a scoring
 * step this way): for every row r < L with rows[r].want, rows[r] gets the
 * row's log-softmax results (pg_lsm_row: lse, the token's logprob and rank
 * — the argmax for token -1 —, the top k), computed by gpu/logprobs.cu with
 * common/pg_logsoftmax.h's definition, bit for bit the host sampler's; its
 * row of logits_host is left unwritten: sizeof(pg_lsm_row) = 184 bytes
 * cross PCIe instead of V x 4. The other rows are written as always. A row
 * may not be marked greedy (cuda_executor_greedy_next_step) as well. A row
 * of the pending sampled rows (cuda_executor_sample_rows) must have token
 * PG_LSM_SAMPLED, and only such a row: gpu/sampling.cu keeps it as the
 * sampler receives it (after its grammar mask) and gpu/logprobs.cu then
 * scores the id drawn from it, read on the device (rows[r].token out: that
 * id). rows is borrowed until that logits returns; the logits consumes it,
 * and fails with PG_EINVAL when its L differs or a row asks for a token
 * outside [PG_LSM_SAMPLED, V), PG_LSM_SAMPLED on a row not sampled or
 * another token on a sampled one, or k outside [0, PG_LSM_MAX_TOP]. L = 0
 * clears it. PG_EINVAL when ex is not a cuda executor. The executor
 * table's logprob_rows. */
int cuda_executor_logprob_rows(executor *ex, pg_lsm_row *rows, int32_t L);
/* Sampled rows of the next logits on the device (gpu/sampling.cu,
 * cuda_sample_rows.h; with logprobs: cuda_executor_logprob_rows'
 * PG_LSM_SAMPLED); PG_EINVAL when ex is not a cuda executor or req is
 * malformed. The executor table's sample_rows (executor.h). */
int cuda_executor_sample_rows(executor *ex, const pg_smp_batch *req);

/* pgk_logprobs over the f32 rows of a device buffer logits [n][V] (from
 * alloc(EXEC_F32)): rows_host[r] (token, k in; want set to 1) gets row r's
 * results. Synchronizes. For the tests (the device against
 * pg_lsm_row_eval). */
int cuda_executor_logprobs(executor *ex, pg_lsm_row *rows_host, const float *logits, int32_t n,
                           int32_t V);

/* Device work, counted where it is queued: kernels of gpu/'s .cu files
 * (every launch goes through pgk_check_launch, which counts it), cuBLAS
 * products and the GEMM's padding copies (cuda_gemm_counts). The launches
 * per decode step are printed with their breakdown in gpu/README.md
 * ("Launches per decode step") and held by tests/gpu/test_cuda_e2e.c
 * test_launches_per_step. */
typedef struct cuda_launch_counts {
    uint64_t kernels;     /* kernels launched */
    uint64_t gemms;       /* cuBLAS products */
    uint64_t copies;      /* device-to-device copies (GEMM padding) */
    uint64_t total;       /* kernels + gemms + copies */
} cuda_launch_counts;
/* *total (may be NULL): everything queued from the host since creation
 * (graph captures included, replays not). *last_step (may be NULL): the
 * work of the last run_step — an eager step's, or for a graph replay the
 * work its capture recorded plus what ran after the replay (logprob rows);
 * so a decode step counts the same graphed or eager, and the warm-up and
 * capture a first graphed step pays are not in it. Zeros when ex is not a
 * cuda executor. */
void cuda_executor_launch_counts(executor *ex, cuda_launch_counts *total,
                                 cuda_launch_counts *last_step);

/* Number of CUDA devices; 0 when there is no driver or no device (never
 * fails loudly: a machine without a GPU simply has 0). */
int cuda_device_count(void);

/* Greedy sampling on the device, for a later device-side sampler:
 * ids_host[r] = argmax_v logits[r][v] over the f32 rows of a device buffer
 * logits [rows][V] (from alloc(EXEC_F32)); ties -> lowest id, NaN never
 * wins. A row with no logit > -inf (all -inf or NaN) gets -1 and the call
 * fails with PG_EINVAL, as core/sampler.c's greedy sampling does.
 * Synchronizes. */
int cuda_executor_argmax(executor *ex, int32_t *ids_host, const float *logits, int32_t rows,
                         int32_t V);

#endif /* PG_CUDA_EXECUTOR_H */
