/* cuda_gemm: the one place that knows cuBLAS (STYLE.md habit 12). Every
 * matrix product of the CUDA executor (the model's matmuls and the lm_head
 * logits) goes through cuda_gemm_xwt. Internal to gpu/.
 *
 * The handle, its stream and its workspace belong to the cuda_gemm object,
 * which the executor owns: no globals.
 */
#ifndef PG_CUDA_GEMM_H
#define PG_CUDA_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "pg_error.h"

typedef struct cuda_gemm cuda_gemm;

/* cuBLAS workspace per handle: 32 MiB, NVIDIA's recommendation for Hopper
 * (cuBLAS docs, cublasSetWorkspace); 4 MiB would do on Ampere. */
#define CUDA_GEMM_WORKSPACE_BYTES ((size_t)32 << 20)

/* Creates the handle bound to stream st and a workspace of
 * CUDA_GEMM_WORKSPACE_BYTES device memory. */
int cuda_gemm_create(cuda_gemm **out, cudaStream_t st, pg_error *err);
void cuda_gemm_destroy(cuda_gemm *g); /* accepts NULL */

/* Rows per cuBLAS call in the batch-invariant mode (cuda_gemm_set_fixed_rows). */
#define CUDA_GEMM_FIXED_ROWS 128

/* fixed_rows > 0: every product is computed in calls of exactly fixed_rows
 * rows (the last chunk padded through a scratch buffer), so cuBLAS sees one
 * shape per (N, K) and picks the same kernel whatever M is: a row's result
 * no longer depends on the batch (executor.h "Determinism"). The price:
 * decode steps compute fixed_rows rows (free while the GEMM is bound by
 * reading the weights, which it is up to ~300 rows on an H100), and a
 * prefill of M rows reads the weights ceil(M / fixed_rows) times.
 * 0: one call of M rows (fastest; cuBLAS may pick a kernel by M). */
void cuda_gemm_set_fixed_rows(cuda_gemm *g, int32_t fixed_rows);

/* Counts the (re)allocations of the padding buffers of the fixed-rows mode
 * (they grow to the largest K and N seen, on every call, whatever M). A CUDA graph captured over
 * cuda_gemm_xwt holds their addresses: the executor re-captures its graphs
 * when this changed since their capture (cuda_executor.c). */
uint64_t cuda_gemm_buffers_generation(const cuda_gemm *g);

/* y[M][N] = x[M][K] . w[N][K]^T   (PyTorch nn.Linear, all row-major)
 * x and w: in_dt (PGK_BF16 or PGK_F32, both the same); y: y_dt (in_dt, or
 * PGK_F32 for logits). Accumulation is f32 (CUBLAS_COMPUTE_32F; no TF32).
 * Asynchronous on the handle's stream. Capturable into a CUDA graph (the
 * workspace is set explicitly, cuBLAS allocates nothing) once the padding
 * buffers have grown for the shapes used: one uncaptured call of each
 * (N, K) first, with any M (a call that would have to grow them while its
 * stream is capturing fails with PG_EINVAL and says so, allocating nothing). */
int cuda_gemm_xwt(cuda_gemm *g, void *y, int y_dt, const void *x, const void *w, int in_dt,
                  int32_t M, int32_t N, int32_t K, pg_error *err);

/* cuda_gemm_xwt where y and x are known to hold y_rows and x_rows rows
 * (>= M) from where they point to the end of their allocations. In the
 * fixed-rows mode a last, partial chunk whose fixed_rows padded rows fit in
 * both is computed in place — the padding rows of x are read (whatever
 * they hold: rows of a product never mix) and those of y OVERWRITTEN —
 * instead of through the padding buffers: two device copies fewer per
 * call, and the same cuBLAS call (fixed_rows rows, the same N, K and
 * leading dimensions), so the same bits. cuda_gemm_xwt is this with
 * y_rows = x_rows = M. */
int cuda_gemm_xwt_rows(cuda_gemm *g, void *y, int64_t y_rows, int y_dt, const void *x,
                       int64_t x_rows, const void *w, int in_dt, int32_t M, int32_t N, int32_t K,
                       pg_error *err);

/* Small batches (issue 30 item 5): gpu/gemv.cu (pgk_gemv) instead of cuBLAS
 * for a shape — bf16 x and w, K a multiple of 8 — chosen per (N, K, output
 * type) and for EVERY M, never per step: the two paths sum in different
 * orders, so a row's bits would otherwise depend on the batch it ran in.
 * Each path is position-invariant by itself (gemv.cu: one warp per output,
 * an order fixed by K; cuBLAS: the fixed-rows mode). Modes:
 *   OFF  (default) cuBLAS everywhere;
 *   ON   gemv.cu for every eligible shape (prefill too: it re-reads the
 *        weights once per 8 rows);
 *   AUTO each shape's first product is timed both ways at min(M, 8) rows
 *        (host clock, synchronized) and gemv.cu kept when >= 1.25x faster;
 *        the choice is then fixed for the run. Timing decides, so two runs
 *        may choose differently (and differ in the last bits) when the two
 *        paths are close: for byte-identical reruns, measure once and force.
 * The executor sets the mode from PAGEDGEN_CUDA_GEMV=off|on|auto. Changing
 * the mode forgets the choices. */
enum { CUDA_GEMM_GEMV_OFF = 0, CUDA_GEMM_GEMV_ON = 1, CUDA_GEMM_GEMV_AUTO = 2 };
void cuda_gemm_set_gemv(cuda_gemm *g, int mode);
/* AUTO's choices so far: returns their number; for 0 <= i < it, shape i's
 * N, K and choice (1 = gemv.cu). */
int32_t cuda_gemm_gemv_shapes(const cuda_gemm *g, int32_t i, int32_t *N, int32_t *K, int *gemv);

/* Device work queued so far: products (cuBLAS calls and gemv.cu launches), and the device-to-device
 * copies of the fixed-rows mode's padding (two per padded chunk). */
void cuda_gemm_counts(const cuda_gemm *g, uint64_t *products, uint64_t *copies);

#endif /* PG_CUDA_GEMM_H */
