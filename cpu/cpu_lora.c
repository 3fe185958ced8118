/* cpu_lora: the CPU executor's LoRA delta (executor.h lora_add: PEFT's
 * lora.Linear.forward, result + lora_B(lora_A(x)) * scaling, per row).
 *
 * The step's rows are sorted by adapter slot, then by row index (a
 * counting sort: a fixed order, whatever the timing), rows with slot -1 or
 * with no A for this projection dropped. Each adapter's rows go, in slices
 * of CPU_LORA_ROWS, through
 *   shrink  u [m][r] = xs [m][K] @ A^T     cpu_gemm (the batch-invariant
 *           GEMM's canonical order, cpu_gemm.h; always f32 exact: A is an
 *           act buffer, not a weight, so --matmul-precision never applies)
 *   expand  y[t][n] = y[t][n] + scale * (sum over j increasing of
 *           u[j] * B[n][j])                 plain C, one rounding for each
 *           product and each sum (-ffp-contract=off), then the scale, then
 *           the add
 * where xs gathers the slice's rows of x. Both products compute a row from
 * that row alone in a fixed order, so a row's bits do not depend on T, on
 * which adapters its neighbours use, on the slicing, or on the thread
 * count (the expand's columns are split over the pool; the shrink's GEMM
 * is invariant by construction). tests/ops/test_lora_ops.c compares this
 * with a plain-loop twin bit for bit.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu_gemm.h"
#include "cpu_ops.h"

#define CPU_LORA_ROWS 64 /* rows gathered per slice: scratch [64][K + r] floats */

typedef struct lora_expand {
    float *y;
    int64_t ldy;
    const float *u;        /* [m][r] */
    const int32_t *rows;   /* [m] row of y of each u row */
    const float *B;        /* [N][r] */
    float scale;
    int32_t m, r, N;
} lora_expand;

static void lora_expand_chunk(void *ctx, int32_t w, int32_t nw)
{
    const lora_expand *e = ctx;
    int64_t n0, n1;
    cpu_pool_range(e->N, w, nw, 16, &n0, &n1);
    const int32_t r = e->r;
    for (int32_t i = 0; i < e->m; i++) {
        const float *u = e->u + (int64_t)i * r;
        float *y = e->y + (int64_t)e->rows[i] * e->ldy;
        for (int64_t n = n0; n < n1; n++) {
            const float *bn = e->B + n * r;
            float s = 0.0f;
            for (int32_t j = 0; j < r; j++)
                s = s + u[j] * bn[j];
            y[n] = y[n] + e->scale * s;
        }
    }
}

/* ce->lora_buf holds the sorted rows [T] i32, then xs [CPU_LORA_ROWS][K]
 * and u [CPU_LORA_ROWS][max rank] f32. */
static int lora_scratch(cpu_exec *ce, int32_t T, int32_t K, int32_t rmax)
{
    const size_t rows_bytes = ((size_t)T * sizeof(int32_t) + 63) & ~(size_t)63;
    const size_t need = rows_bytes + (size_t)CPU_LORA_ROWS * ((size_t)K + (size_t)rmax) * sizeof(float);
    if (need <= ce->lora_cap)
        return PG_OK;
    void *p = NULL;
    if (posix_memalign(&p, 64, need) != 0)
        return cpu_exec_fail(ce, PG_ENOMEM, "lora_add: out of memory for %zu bytes of scratch", need);
    free(ce->lora_buf);
    ce->lora_buf = p;
    ce->lora_cap = need;
    return PG_OK;
}

int cpu_op_lora_add(cpu_exec *ce, float *y, int32_t ldy, const float *x, int32_t K, int32_t N,
                    const float *const *A, const float *const *B, const float *scale, const int32_t *rank,
                    int32_t n_slots, const step_batch *b)
{
    const int32_t T = b->num_tokens;
    const int32_t *slot = b->lora_slots;
    if (!slot || T <= 0)
        return PG_OK;
    int32_t rmax = 1;
    for (int32_t t = 0; t < T; t++) {
        const int32_t a = slot[t];
        if (a < -1 || a >= n_slots)
            return cpu_exec_fail(ce, PG_EINVAL, "lora_add: row %d has slot %d, expected -1..%d", (int)t, (int)a,
                                 (int)n_slots - 1);
        if (a >= 0 && A[a]) {
            if (!B[a] || rank[a] < 1 || rank[a] > PG_LORA_MAX_RANK)
                return cpu_exec_fail(ce, PG_EINVAL, "lora_add: slot %d has rank %d (expected 1..%d) or no B",
                                     (int)a, (int)rank[a], PG_LORA_MAX_RANK);
            rmax = rank[a] > rmax ? rank[a] : rmax;
        }
    }
    int rc = lora_scratch(ce, T, K, rmax);
    if (rc)
        return rc;
    int32_t *rows = ce->lora_buf;
    float *xs = (float *)((char *)ce->lora_buf + (((size_t)T * sizeof(int32_t) + 63) & ~(size_t)63));
    float *u = xs + (size_t)CPU_LORA_ROWS * (size_t)K;
    /* group by slot, then by row index: one pass per slot present is a
     * counting sort's order (slots are few) */
    for (int32_t a = 0; a < n_slots; a++) {
        if (!A[a])
            continue;
        int32_t m = 0;
        for (int32_t t = 0; t < T; t++)
            if (slot[t] == a)
                rows[m++] = t;
        for (int32_t s0 = 0; s0 < m; s0 += CPU_LORA_ROWS) {
            const int32_t ms = m - s0 < CPU_LORA_ROWS ? m - s0 : CPU_LORA_ROWS;
            for (int32_t i = 0; i < ms; i++)
                memcpy(xs + (size_t)i * (size_t)K, x + (int64_t)rows[s0 + i] * K, (size_t)K * sizeof(float));
            cpu_gemm_with((cpu_gemm_variant)ce->gemm_variant, ce->pool, u, rank[a], xs, A[a], ms, rank[a], K);
            lora_expand e = {.y = y, .ldy = ldy, .u = u, .rows = rows + s0, .B = B[a], .scale = scale[a],
                             .m = ms, .r = rank[a], .N = N};
            /* small expands stay on the calling thread */
            const int64_t work = (int64_t)ms * N * rank[a];
            cpu_pool_run(ce->pool, work < 65536 ? 1 : 0, lora_expand_chunk, &e);
        }
    }
    return PG_OK;
}
