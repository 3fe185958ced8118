/* cpu_executor: the reference executor (core/executor.h) on the host.
 *
 * Element types: act, wt and kv are all f32 (upload converts F16/BF16/F32
 * with pg_convert_to_f32). Matrix multiplies use cpu_gemm (the project's own
 * fixed-reduction-order GEMM, not OpenBLAS, which rounds a row differently
 * depending on the batch shape); the other ops are plain C. Work is split
 * statically across a persistent pthread pool (cpu_pool); every output
 * element is computed by one worker in a fixed order, so results are
 * bit-identical for any batch composition and any thread count.
 *
 * OpenBLAS is not called on the hot path; its own threads stay idle.
 */
#ifndef PG_CPU_EXECUTOR_H
#define PG_CPU_EXECUTOR_H

#include <stdint.h>

#include "executor.h"
#include "pg_error.h"

typedef struct cpu_executor_params {
    int32_t threads; /* worker threads; 0 = all online cores */
    /* GEMM kernel variant (cpu_gemm.h cpu_gemm_variant): 0 = the fastest
     * this CPU runs. Every variant gives the same bits; choosing one is for
     * tests and benchmarks. One this CPU cannot run: PG_EUNSUPPORTED. */
    int32_t gemm_variant;
} cpu_executor_params;

/* Creates a CPU executor; destroy with (*out)->op->destroy(*out).
 * p may be NULL (defaults). On error *out is NULL and err says why. */
int cpu_executor_create(executor **out, const cpu_executor_params *p, pg_error *err);

#endif /* PG_CPU_EXECUTOR_H */
