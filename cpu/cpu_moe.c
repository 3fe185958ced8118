/* cpu_moe: the CPU executor's mixture-of-experts ops (executor.h moe_route,
 * moe_experts, moe_shared_add; Mixtral, Qwen2-MoE, Qwen3-MoE).
 *
 * Routing is per row: softmax in f32 with the project's own exp (cpu_math.h
 * cm_expf: the same bits on every ISA, unlike glibc's expf), a top-k by
 * repeated selection (strictly greater wins, so ties go to the lower
 * expert id), renormalization by the k weights' sum in rank order.
 *
 * Experts, the way STYLE.md habit 21 says (vLLM's fused_moe, grouped): the
 * (row, rank) pairs of a slice of rows are sorted by expert, then by row
 * index (a counting sort: a fixed order, whatever the timing); each
 * expert's rows are gathered and go through the executor's own products
 * (cpu_product: the batch-invariant GEMM, in the --matmul-precision mode),
 * silu_mul and the down product; then every row's k outputs are combined
 * in rank order: out = w0*y0, out = out + w1*y1, ... (one rounding per
 * product and per sum: -ffp-contract=off). A row's bits are the dense MLP
 * ops' over that row alone, so they do not depend on which or how many
 * rows share its experts, nor on the thread count; an expert no row picks
 * is never read (batch 1 streams k experts, not E).
 *
 * transformers sums the experts into a zero tensor by ascending expert id
 * (index_add_ in its expert loop) where we sum by rank: both are fixed
 * orders, equal up to f32 rounding of a k-term sum (the float64 reference
 * of tests/e2e/moe_reference.py is the arbiter).
 *
 * Rows run in slices of CPU_MOE_ROWS tokens so that the gathered scratch
 * is bounded ([rows * k][H + 3 Ie] floats) however large the step; a
 * slice's experts read their weights once per slice.
 *
 * Threads: when every group is small (at most CPU_MOE_SMALL rows: decode)
 * or there are many groups (at least 4 per thread: prefill over many
 * experts), the experts themselves are the parallel chunks (each expert's
 * products on one thread, whole), instead of splitting each product's
 * columns over the pool — at batch 1 that is 2k pool dispatches a layer
 * saved. Otherwise (a few big groups) each product is split by columns. Which thread
 * computes an expert never changes a value (the GEMM's results do not
 * depend on the pool: cpu_gemm.h), and the silu here is cpu_ops.c's
 * expression, so both ways give the same bits (tests/ops/test_moe_ops).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_gemm_modes.h"
#include "cpu_math.h"
#include "cpu_ops.h"

/* cm_v16f values pass between static inline helpers only (cpu_math.h) */
#pragma GCC diagnostic ignored "-Wpsabi"

#define CPU_MOE_ROWS 256
#define CPU_MOE_SMALL 4 /* rows per expert up to which experts run in parallel */

int cpu_op_moe_route(cpu_exec *ce, int32_t *ids, float *weights, const float *router, int32_t T, int32_t E,
                     int32_t k, int32_t norm_topk)
{
    if (cpu_exec_scratch(ce, (size_t)E) != PG_OK)
        return PG_ENOMEM;
    float *p = ce->scratch[0].buf;
    for (int32_t t = 0; t < T; t++) {
        const float *z = router + (int64_t)t * E;
        float mx = z[0];
        for (int32_t e = 1; e < E; e++)
            mx = z[e] > mx ? z[e] : mx;
        float sum = 0.0f;
        for (int32_t e = 0; e < E; e++) {
            p[e] = cm_expf(z[e] - mx);
            sum += p[e];
        }
        for (int32_t e = 0; e < E; e++)
            p[e] = p[e] / sum;
        int32_t *id = ids + (int64_t)t * k;
        float *w = weights + (int64_t)t * k;
        float wsum = 0.0f;
        for (int32_t r = 0; r < k; r++) {
            int32_t best = -1;
            for (int32_t e = 0; e < E; e++) {
                int taken = 0;
                for (int32_t q = 0; q < r; q++)
                    taken |= id[q] == e;
                /* strictly greater: the lower id keeps a tie; a NaN never wins */
                if (!taken && (best < 0 || p[e] > p[best]))
                    best = e;
            }
            id[r] = best;
            w[r] = p[best];
            wsum += w[r];
        }
        if (norm_topk)
            for (int32_t r = 0; r < k; r++)
                w[r] = w[r] / wsum;
    }
    return PG_OK;
}

/* Grows ce's MoE scratch to n bytes. */
static int moe_scratch(cpu_exec *ce, size_t n)
{
    if (n <= ce->moe_cap)
        return PG_OK;
    void *p = NULL;
    if (posix_memalign(&p, 64, n) != 0)
        return cpu_exec_fail(ce, PG_ENOMEM, "moe_experts: out of memory for %zu bytes of scratch", n);
    free(ce->moe_buf);
    ce->moe_buf = p;
    ce->moe_cap = n;
    return PG_OK;
}

static size_t align64(size_t n)
{
    return (n + 63) / 64 * 64;
}

/* Bytes of the modes' scratch per row of an expert's two products (K = H,
 * then K = I; cpu_gemm_mode_scratch_bytes is linear in the rows). */
static size_t mode_row_bytes(cpu_matmul_precision prec, int32_t H, int32_t I)
{
    const size_t a = cpu_gemm_mode_scratch_bytes(prec, 1, H), b = cpu_gemm_mode_scratch_bytes(prec, 1, I);
    return a > b ? a : b;
}

/* The experts of one slice as parallel chunks (see the header). */
typedef struct moe_job {
    cpu_exec *ce;
    const int32_t *off, *active; /* group starts [E + 1]; the experts with rows [n_active] */
    void *const *w_gate_up, *const *w_down;
    const float *xs;
    float *gu, *act, *ys;
    char *mode_scratch;          /* the modes' rounded rows (see cpu_op_moe_experts) */
    int32_t H, I;
} moe_job;

static void moe_expert_chunk(void *ctx, int32_t c, int32_t n_chunks)
{
    (void)n_chunks;
    const moe_job *j = ctx;
    cpu_exec *ce = j->ce;
    const int32_t e = j->active[c], H = j->H, I = j->I, m = j->off[e + 1] - j->off[e];
    const int64_t s0 = j->off[e];
    const cpu_matmul_precision prec = (cpu_matmul_precision)ce->precision;
    const cpu_gemm_variant v = (cpu_gemm_variant)ce->gemm_variant;
    /* the groups' regions, each 64-aligned, follow each other without
     * overlap: [align64(s0 * row) + 64 c, + m * row) */
    const size_t row = mode_row_bytes(prec, H, I);
    void *scratch = row ? j->mode_scratch + align64((size_t)s0 * row) + 64u * (size_t)c : NULL;
    float *gu = j->gu + s0 * 2 * I, *act = j->act + s0 * I;
    cpu_gemm_mode(prec, v, ce->wt, NULL, gu, 2 * I, j->xs + s0 * H, j->w_gate_up[e], m, 2 * I, H, scratch);
    for (int32_t r = 0; r < m; r++) {
        const float *g = gu + (int64_t)r * 2 * I, *u = g + I;
        float *o = act + (int64_t)r * I;
        for (int32_t i = 0; i < I; i++)
            o[i] = g[i] / (1.0f + expf(-g[i])) * u[i]; /* silu(g) * u: cpu_ops.c's silu_worker */
    }
    cpu_gemm_mode(prec, v, ce->wt, NULL, j->ys + s0 * H, H, act, j->w_down[e], m, H, I, scratch);
}

int cpu_op_moe_experts(cpu_exec *ce, float *out, const float *x, const int32_t *ids, const float *weights,
                       void *const *w_gate_up, void *const *w_down, int32_t T, int32_t H, int32_t I, int32_t E,
                       int32_t k)
{
    for (int64_t i = 0; i < (int64_t)T * k; i++)
        if (ids[i] < 0 || ids[i] >= E)
            return cpu_exec_fail(ce, PG_EINVAL, "moe_experts: row %lld rank %lld: expert id %d outside [0, %d)",
                                 (long long)(i / k), (long long)(i % k), (int)ids[i], (int)E);
    const int32_t R = T < CPU_MOE_ROWS ? T : CPU_MOE_ROWS; /* rows per slice */
    const size_t P = (size_t)R * (size_t)k;                /* (row, rank) pairs per slice */
    const size_t b_off = align64((size_t)(E + 1) * sizeof(int32_t)), b_perm = align64(P * sizeof(int32_t)),
                 b_pos = b_perm, b_xs = align64(P * (size_t)H * sizeof(float)),
                 b_gu = align64(P * 2u * (size_t)I * sizeof(float)), b_act = align64(P * (size_t)I * sizeof(float));
    /* the modes' rounded activations: at most one whole slice's worth, plus
     * one alignment per expert (the scratch is linear in the rows) */
    const cpu_matmul_precision prec = (cpu_matmul_precision)ce->precision;
    const size_t b_active = align64((size_t)E * sizeof(int32_t)),
                 b_mode = align64(P * mode_row_bytes(prec, H, I)) + 64u * (size_t)(E + 1);
    int rc = moe_scratch(ce, b_off + b_perm + b_pos + 2 * b_xs + b_gu + b_act + b_active + b_mode);
    if (rc)
        return rc;
    char *base = ce->moe_buf;
    int32_t *off = (int32_t *)base;                       /* [E + 1] group starts */
    int32_t *perm = (int32_t *)(base + b_off);            /* [P] slot -> row of the slice */
    int32_t *pos = (int32_t *)(base + b_off + b_perm);    /* [P] (row, rank) -> slot */
    float *xs = (float *)(base + b_off + b_perm + b_pos); /* [P][H] gathered rows, by slot */
    float *ys = (float *)((char *)xs + b_xs);             /* [P][H] expert outputs, by slot */
    float *gu = (float *)((char *)ys + b_xs);             /* [P][2I] */
    float *act = (float *)((char *)gu + b_gu);            /* [P][I] */
    int32_t *active = (int32_t *)((char *)act + b_act);   /* [E] experts with rows */
    char *mode_scratch = (char *)active + b_active;       /* per active expert c, its rows' worth:
                                                             align64(bytes(rows before it)) + 64 c */
    for (int32_t t0 = 0; t0 < T; t0 += R) {
        const int32_t n = T - t0 < R ? T - t0 : R;
        const int32_t *id = ids + (int64_t)t0 * k;
        /* counting sort of the pairs by expert, then by row (then rank:
         * one per row and expert) */
        memset(off, 0, (size_t)(E + 1) * sizeof *off);
        for (int64_t i = 0; i < (int64_t)n * k; i++)
            off[id[i] + 1]++;
        for (int32_t e = 0; e < E; e++)
            off[e + 1] += off[e];
        for (int64_t i = 0; i < (int64_t)n * k; i++) {
            const int32_t slot = off[id[i]]++;
            perm[slot] = (int32_t)(i / k);
            pos[i] = slot;
        }
        /* off[e] is now the end of group e: shift back to the starts */
        for (int32_t e = E; e > 0; e--)
            off[e] = off[e - 1];
        off[0] = 0;
        for (int32_t s = 0; s < n * k; s++)
            memcpy(xs + (int64_t)s * H, x + ((int64_t)t0 + perm[s]) * H, (size_t)H * sizeof(float));
        int32_t n_active = 0, biggest = 0;
        for (int32_t e = 0; e < E; e++) {
            const int32_t m = off[e + 1] - off[e];
            if (m > 0)
                active[n_active++] = e;
            biggest = m > biggest ? m : biggest;
        }
        const int by_expert = biggest <= CPU_MOE_SMALL || n_active >= 4 * ce->n_threads;
        if (by_expert) { /* the experts in parallel */
            moe_job job = {ce, off, active, w_gate_up, w_down, xs, gu, act, ys, mode_scratch, H, I};
            cpu_pool_run_chunks(ce->pool, n_active, moe_expert_chunk, &job);
        }
        for (int32_t e = 0; e < E && !by_expert; e++) {
            const int32_t m = off[e + 1] - off[e];
            if (m == 0)
                continue; /* not read */
            const int64_t s0 = off[e];
            if ((rc = cpu_product(ce, gu + s0 * 2 * I, 2 * I, xs + s0 * H, w_gate_up[e], m, 2 * I, H)) ||
                (rc = cpu_op_silu_mul(ce, act + s0 * I, gu + s0 * 2 * I, m, I)) ||
                (rc = cpu_product(ce, ys + s0 * H, H, act + s0 * I, w_down[e], m, H, I)))
                return rc;
        }
        /* combine in rank order */
        for (int32_t t = 0; t < n; t++) {
            float *o = out + ((int64_t)t0 + t) * H;
            const float *w = weights + ((int64_t)t0 + t) * k;
            const float *y = ys + (int64_t)pos[(int64_t)t * k] * H;
            for (int32_t h = 0; h < H; h++)
                o[h] = w[0] * y[h];
            for (int32_t r = 1; r < k; r++) {
                y = ys + (int64_t)pos[(int64_t)t * k + r] * H;
                const float wr = w[r];
                for (int32_t h = 0; h < H; h++)
                    o[h] = o[h] + wr * y[h];
            }
        }
    }
    return PG_OK;
}

int cpu_op_moe_shared_add(cpu_exec *ce, float *out, const float *shared, const float *gate, int32_t T, int32_t N)
{
    (void)ce;
    for (int32_t t = 0; t < T; t++) {
        /* F.sigmoid: 1 / (1 + exp(-g)) */
        const float s = 1.0f / (1.0f + cm_expf(-gate[t]));
        float *o = out + (int64_t)t * N;
        const float *y = shared + (int64_t)t * N;
        for (int32_t n = 0; n < N; n++)
            o[n] = o[n] + s * y[n];
    }
    return PG_OK;
}
