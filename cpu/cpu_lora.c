/* cpu_lora: the CPU executor's LoRA delta (executor.h lora_add: PEFT's
 * lora.Linear.forward, result + lora_B(lora_A(x)) * scaling, per row).
 *
 * The step's rows are sorted by adapter slot, then by row index (a
 * counting sort: a fixed order, whatever the timing), rows with slot -1 or
 * with no A for this projection dropped. Each adapter's rows go through
 * (the shrink in slices of CPU_LORA_ROWS gathered rows)
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
 *
 * Speed: the shrink spreads the groups over the pool (each group's GEMM
 * whole on one chunk: r columns are too few to split); the expand is one
 * pool dispatch per call for all groups, each chunk a range of columns,
 * a block of columns accumulating side by side (a fixed-width block the
 * compiler vectorizes; every column's sum is still j increasing from +0):
 * with B transposed per chunk for groups of CPU_LORA_TR rows or more, 64
 * columns (four independent AVX-512 sums: 16 were one chain of dependent
 * adds, batch 64 at 0.83x the base model, 0.89-0.92x with 64), and B read
 * in place, 16 columns, for fewer rows (decode at batch 1).
 */
#include <stdlib.h>
#include <string.h>

#include "cpu_gemm.h"
#include "cpu_ops.h"

#define CPU_LORA_ROWS 64 /* rows gathered per shrink: scratch [64][K] floats */
#define CPU_LORA_NB 64   /* columns of one expand block: a fixed trip count the compiler vectorizes, four AVX-512 vectors whose sums run side by side (16 columns were one chain of dependent adds) */
#define CPU_LORA_NB_FEW 16 /* the in-place expand's block (B read with stride rank: wider blocks measured slower at batch 1) */
#define CPU_LORA_TR 4    /* a group of this many rows or more reads B transposed (fewer: in place) */

/* The expand of every group for the columns [n0, n1) of one pool chunk. */
typedef struct lora_expand {
    float *y;
    int64_t ldy;
    const float *u;          /* [T][ur] the sorted rows' u, row i of the sort at i * ur */
    int32_t ur;
    const int32_t *rows;     /* [m] rows of y in sorted order */
    const int32_t *gstart;   /* [n_groups + 1] */
    const int32_t *gslot;    /* [n_groups] */
    int32_t n_groups;
    const float *const *B;   /* [slot] [N][rank] */
    const float *scale;
    const int32_t *rank;
    int32_t N;
    cpu_scratch *scratch;    /* per worker: Bt [rank][n1 - n0] */
} lora_expand;

static void lora_expand_chunk(void *ctx, int32_t w, int32_t nw)
{
    const lora_expand *e = ctx;
    int64_t lo, hi;
    cpu_pool_range(e->N, w, nw, CPU_LORA_NB, &lo, &hi);
    const int32_t n0 = (int32_t)lo, nc = (int32_t)(hi - lo);
    if (nc <= 0)
        return;
    float *bt = e->scratch[w].buf;
    for (int32_t g = 0; g < e->n_groups; g++) {
        const int32_t a = e->gslot[g], r = e->rank[a];
        const float *B = e->B[a];
        const float sc = e->scale[a];
        if (e->gstart[g + 1] - e->gstart[g] < CPU_LORA_TR) {
            /* a few rows (decode): B in place, 16 columns' sums side by side */
            for (int32_t i = e->gstart[g]; i < e->gstart[g + 1]; i++) {
                const float *u = e->u + (int64_t)i * e->ur;
                float *y = e->y + (int64_t)e->rows[i] * e->ldy + n0;
                int32_t c = 0;
                for (; c + CPU_LORA_NB_FEW <= nc; c += CPU_LORA_NB_FEW) {
                    const float *bc = B + (int64_t)(n0 + c) * r;
                    float acc[CPU_LORA_NB_FEW];
                    for (int32_t k = 0; k < CPU_LORA_NB_FEW; k++)
                        acc[k] = 0.0f;
                    for (int32_t j = 0; j < r; j++) {
                        const float uj = u[j];
                        for (int32_t k = 0; k < CPU_LORA_NB_FEW; k++)
                            acc[k] = acc[k] + uj * bc[(int64_t)k * r + j];
                    }
                    for (int32_t k = 0; k < CPU_LORA_NB_FEW; k++)
                        y[c + k] = y[c + k] + sc * acc[k];
                }
                for (; c < nc; c++) {
                    const float *bc = B + (int64_t)(n0 + c) * r;
                    float s = 0.0f;
                    for (int32_t j = 0; j < r; j++)
                        s = s + u[j] * bc[j];
                    y[c] = y[c] + sc * s;
                }
            }
            continue;
        }
        /* Bt [j][c] = B[n0 + c][j]: the expand then runs over columns */
        for (int32_t c = 0; c < nc; c++)
            for (int32_t j = 0; j < r; j++)
                bt[(int64_t)j * nc + c] = B[(int64_t)(n0 + c) * r + j];
        for (int32_t i = e->gstart[g]; i < e->gstart[g + 1]; i++) {
            const float *u = e->u + (int64_t)i * e->ur;
            float *y = e->y + (int64_t)e->rows[i] * e->ldy + n0;
            int32_t c = 0;
            for (; c + CPU_LORA_NB <= nc; c += CPU_LORA_NB) {
                float acc[CPU_LORA_NB];
                for (int32_t k = 0; k < CPU_LORA_NB; k++)
                    acc[k] = 0.0f;
                for (int32_t j = 0; j < r; j++) {
                    const float uj = u[j];
                    const float *b = bt + (int64_t)j * nc + c;
                    for (int32_t k = 0; k < CPU_LORA_NB; k++)
                        acc[k] = acc[k] + uj * b[k];
                }
                for (int32_t k = 0; k < CPU_LORA_NB; k++)
                    y[c + k] = y[c + k] + sc * acc[k];
            }
            for (; c < nc; c++) { /* the same sums, one column at a time */
                float s = 0.0f;
                for (int32_t j = 0; j < r; j++)
                    s = s + u[j] * bt[(int64_t)j * nc + c];
                y[c] = y[c] + sc * s;
            }
        }
    }
}

/* The shrink of the groups g = w, w + nw, ... (each group whole on one
 * chunk: the GEMM's bits do not depend on where it runs). */
typedef struct lora_shrink {
    const float *x;
    int32_t K, ur;
    const int32_t *rows, *gstart, *gslot;
    int32_t n_groups;
    const float *const *A;
    const int32_t *rank;
    float *u;
    cpu_scratch *scratch;    /* per worker: xs [CPU_LORA_ROWS][K] */
    int32_t variant;
} lora_shrink;

static void lora_shrink_chunk(void *ctx, int32_t w, int32_t nw)
{
    const lora_shrink *e = ctx;
    float *xs = e->scratch[w].buf;
    const int32_t K = e->K;
    for (int32_t g = w; g < e->n_groups; g += nw) {
        const int32_t a = e->gslot[g], end = e->gstart[g + 1];
        for (int32_t s0 = e->gstart[g]; s0 < end; s0 += CPU_LORA_ROWS) {
            const int32_t ms = end - s0 < CPU_LORA_ROWS ? end - s0 : CPU_LORA_ROWS;
            for (int32_t i = 0; i < ms; i++)
                memcpy(xs + (size_t)i * (size_t)K, e->x + (int64_t)e->rows[s0 + i] * K, (size_t)K * sizeof(float));
            cpu_gemm_with((cpu_gemm_variant)e->variant, NULL, e->u + (int64_t)s0 * e->ur, e->ur, xs, e->A[a], ms,
                          e->rank[a], K);
        }
    }
}

/* ce->lora_buf: the sorted rows [T] i32, group starts [n_slots + 1] and
 * slots [n_slots] i32, then xs [CPU_LORA_ROWS][K] and u [T][rmax] f32. */
static size_t align64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

static int lora_scratch(cpu_exec *ce, int32_t T, int32_t K, int32_t rmax, int32_t n_slots)
{
    const size_t ints = align64(((size_t)T + 2 * (size_t)n_slots + 1) * sizeof(int32_t));
    const size_t need = ints + align64((size_t)CPU_LORA_ROWS * (size_t)K * sizeof(float)) +
                        (size_t)T * (size_t)rmax * sizeof(float);
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
    int rc = lora_scratch(ce, T, K, rmax, n_slots);
    if (rc)
        return rc;
    int32_t *rows = ce->lora_buf, *gstart = rows + T, *gslot = gstart + n_slots + 1;
    float *xs = (float *)((char *)ce->lora_buf +
                          align64(((size_t)T + 2 * (size_t)n_slots + 1) * sizeof(int32_t)));
    float *u = xs + align64((size_t)CPU_LORA_ROWS * (size_t)K * sizeof(float)) / sizeof(float);
    /* group by slot, then by row index (one pass per slot: slots are few) */
    int32_t m = 0, n_groups = 0;
    for (int32_t a = 0; a < n_slots; a++) {
        if (!A[a])
            continue;
        const int32_t m0 = m;
        for (int32_t t = 0; t < T; t++)
            if (slot[t] == a)
                rows[m++] = t;
        if (m > m0) {
            gstart[n_groups] = m0;
            gslot[n_groups++] = a;
        }
    }
    gstart[n_groups] = m;
    if (m == 0)
        return PG_OK;
    (void)xs;
    const size_t per_worker = (size_t)N * (size_t)rmax > (size_t)CPU_LORA_ROWS * (size_t)K
                                  ? (size_t)N * (size_t)rmax : (size_t)CPU_LORA_ROWS * (size_t)K;
    if ((rc = cpu_exec_scratch(ce, per_worker)))
        return rc;
    /* shrink: the groups spread over the pool, each whole on one chunk (r
     * columns are too few to split one product) */
    lora_shrink sh = {.x = x, .K = K, .ur = rmax, .rows = rows, .gstart = gstart, .gslot = gslot,
                      .n_groups = n_groups, .A = A, .rank = rank, .u = u, .scratch = ce->scratch,
                      .variant = ce->gemm_variant};
    cpu_pool_run(ce->pool, n_groups, lora_shrink_chunk, &sh);
    /* expand: the columns split over the pool, every group in one dispatch
     * (a small one on the calling thread) */
    int64_t work = 0;
    for (int32_t g = 0; g < n_groups; g++)
        work += (int64_t)(gstart[g + 1] - gstart[g]) * N * rank[gslot[g]];
    lora_expand e = {.y = y, .ldy = ldy, .u = u, .ur = rmax, .rows = rows, .gstart = gstart, .gslot = gslot,
                     .n_groups = n_groups, .B = B, .scale = scale, .rank = rank, .N = N, .scratch = ce->scratch};
    cpu_pool_run(ce->pool, work < 262144 ? 1 : 0, lora_expand_chunk, &e);
    return PG_OK;
}
