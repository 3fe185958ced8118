/* cpu_executor: the reference executor (core/executor.h) on the host.
 *
 * Element types: act is f32. wt (weights and the embedding table) is f32,
 * bf16 or int8 blocks, kv is f32, bf16 or f16 (cpu_wt.h; params below);
 * upload converts F16/BF16/F32 sources to them (a bf16 source into bf16
 * storage is copied as is; int8 is quantized at upload). Matrix multiplies use cpu_gemm (the project's own
 * fixed-reduction-order GEMM, not OpenBLAS, which rounds a row differently
 * depending on the batch shape); the other ops are plain C. Work is split
 * statically across a persistent pthread pool (cpu_pool); every output
 * element is computed by one worker in a fixed order, so results are
 * bit-identical for any batch composition and any thread count.
 *
 * OpenBLAS is not called on the hot path; its own threads stay idle.
 *
 * Across machines. The GEMM has one canonical reduction order on every
 * instruction set (cpu_gemm.h), chosen at run time, and the other ops are
 * plain C compiled with -ffp-contract=off (no FMA contraction; GCC does not
 * reorder float reductions without -ffast-math), so the bits do not depend
 * on the build's -march either (tests/ops/test_isa_identity.c builds cpu/
 * for x86-64, x86-64-v3 and native and compares stories260K's logits). The
 * one remaining dependence is libm: rope (sincosf) and silu (expf) call
 * glibc (attention's softmax uses its own exp, cpu_math.h), whose x86-64
 * ifuncs pick an FMA or an SSE2 implementation by CPU (AVX2 + FMA, else
 * FMA4, else SSE2). Every AVX2 and AVX-512 machine
 * gets the FMA one, so results agree across them (same glibc version); on
 * an x86-64 CPU without AVX2 + FMA (Intel before Haswell, AMD before
 * Excavator, Atom-class chips without AVX) the FMA and SSE2 versions
 * differ in the last bit for 36 of the 2.26e9 floats with |x| < 200
 * (expf 2, sinf 12, cosf 22; exhaustive check with glibc 2.36 and
 * GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX2,-FMA), so a prompt whose rope angles
 * or activations hit one of them can differ there. A libm of our own would
 * close that gap.
 */
#ifndef PG_CPU_EXECUTOR_H
#define PG_CPU_EXECUTOR_H

#include <stdbool.h>
#include <stdint.h>

#include "executor.h"
#include "pg_error.h"

typedef struct cpu_executor_params {
    int32_t threads; /* worker threads; 0 = all online cores */
    /* GEMM kernel variant (cpu_gemm.h cpu_gemm_variant): 0 = the fastest
     * this CPU runs. Every variant gives the same bits; choosing one is for
     * tests and benchmarks. One this CPU cannot run: PG_EUNSUPPORTED. */
    int32_t gemm_variant;
    /* Storage of weights (cpu_wt: 0 f32, 1 bf16, 2 int8) and of the KV cache
     * (cpu_kv: 0 f32, 1 bf16, 2 f16); 0 = f32. Every op widens them to f32
     * exactly (int8: dequantizes) and computes as with f32 storage. */
    int32_t wt_dtype;
    int32_t kv_dtype;
    /* Arithmetic of matmul and logits (cpu_gemm_modes.h
     * cpu_matmul_precision: 0 exact, 1 bf16, 2 int8): 0 = exact, the f32
     * canonical order above. bf16 needs wt_dtype bf16, int8 needs int8
     * (PG_EINVAL otherwise). */
    int32_t matmul_precision;
    /* Write the KV cache's pages when it is allocated (benchmarks: as
     * llama.cpp clears its KV buffer when a context is created, so the
     * first steps do not pay the kernel's page zeroing; the CLI leaves a
     * pool of 40% of memory to be touched as it fills). Values unchanged. */
    bool prefault_kv;
} cpu_executor_params;

/* Creates a CPU executor; destroy with (*out)->op->destroy(*out).
 * p may be NULL (defaults). On error *out is NULL and err says why. */
int cpu_executor_create(executor **out, const cpu_executor_params *p, pg_error *err);

#endif /* PG_CPU_EXECUTOR_H */
