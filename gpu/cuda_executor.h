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
 *
 * CUDA graphs: not yet. model.c drives a step op by op through this table
 * and only logits() marks its end, so the executor cannot see a whole
 * decode step to capture; capture also needs every launch of a step to be
 * shape-stable (the decode grid grows with max_seq_len, the decode
 * workspace is grown on demand, begin_step writes a variable-length
 * metadata block). The plan is in place (cuda_plan_graph_sizes /
 * cuda_plan_graph_bucket: pad the decode batch to 1, 2, 4, 8, 16, 24, ...,
 * size the grid for max_model_len, fixed metadata offsets) and needs a
 * step-level entry in executor.h (begin_step .. logits as one call).
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
