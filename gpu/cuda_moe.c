/* cuda_moe: the CUDA executor's mixture-of-experts ops (executor.h
 * moe_route, moe_experts, moe_shared_add; Mixtral, Qwen2-MoE, Qwen3-MoE).
 * The CPU twin is cpu/cpu_moe.c; gpu/README.md "Mixture of experts" has the
 * design and why it is so.
 *
 * moe_route and moe_shared_add are one kernel each (moe_route.cu,
 * moe_shared.cu). moe_experts, per call:
 *   1. the routed ids to the host (a copy and a stream synchronization:
 *      the grouping below is planned on the host, which is why a step with
 *      MoE layers runs eagerly, never from a CUDA graph: cuda_graphs.c);
 *   2. a counting sort of the (row, rank) pairs by expert, then by row
 *      index (cpu_moe.c's order): perm (slot -> row) and pos ((row, rank)
 *      -> slot); each expert's group starts on a slot whose rows are
 *      256-byte aligned in every buffer (the dense ops' operands are
 *      cudaMalloc'd, 256-aligned, and cuBLAS may choose its kernel by
 *      alignment), gaps marked -1; both to the device;
 *   3. xs[s] = x[perm[s]] (moe_experts.cu's gather);
 *   4. per expert with rows, in increasing id: gu = xs . Wgu^T through
 *      cuda_gemm_xwt_rows — the call cx_matmul makes for the dense MLP, so
 *      in the default fixed-rows mode every cuBLAS call has 128 rows and a
 *      row's bits are those of the dense product of that row alone (on
 *      gemv.cu when the mode picks it for the shape: the same choice as for
 *      the dense product of that shape); the buffers hold 128 rows past
 *      the last slot, so each group's last partial chunk runs in place (no
 *      padding copies; its padding rows overwrite later groups' rows,
 *      which are computed after it);
 *   5. one silu_mul over all slots (activation.cu: elementwise, the dense
 *      MLP's kernel);
 *   6. per expert: ys = act . Wd^T, as in 4;
 *   7. out[t] = sum_r w[t][r] * ys[pos[t][r]] in rank order
 *      (moe_experts.cu's combine).
 * A row's y_r is thus the dense ops' bits over that row alone: it does not
 * depend on which or how many rows share its experts, nor where it lands in
 * its group (tests/gpu/test_cuda_moe.c). An expert no row picks is not read.
 */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_exec_internal.h"

/* Refuses an MoE op inside a graph capture (the host plan synchronizes),
 * and marks the executor as running MoE layers: its steps run eagerly. */
static int moe_enter(cuda_exec *c, const char *op)
{
    c->moe.used = 1;
    if (cx_stream_capturing(c->stream))
        return pg_error_set(&c->err, PG_EUNSUPPORTED,
                            "cuda %s: mixture-of-experts layers plan their expert groups on the host "
                            "and cannot be captured into a CUDA graph (their steps run eagerly)", op);
    return 0;
}

int cx_moe_route(executor *ex, int32_t *ids, float *weights, const void *router, int32_t T, int32_t E,
                 int32_t k, int32_t norm_topk)
{
    cuda_exec *c = cx(ex);
    int rc = moe_enter(c, "moe_route");
    if (rc || T == 0)
        return rc;
    return pgk_moe_route(ids, weights, router, c->act_dt, T, E, k, norm_topk, &c->lk);
}

int cx_moe_shared_add(executor *ex, void *out, const void *shared, const void *gate, int32_t T, int32_t N)
{
    cuda_exec *c = cx(ex);
    int rc = moe_enter(c, "moe_shared_add");
    if (rc || T == 0)
        return rc;
    return pgk_moe_shared_add(out, shared, gate, c->act_dt, T, N, &c->lk);
}

/* Rows per alignment step: the least a such that a rows of row_bytes are a
 * multiple of 256 bytes (a power of two). */
static int32_t align_rows(size_t row_bytes)
{
    int32_t a = 1;
    while (((size_t)a * row_bytes) % 256u != 0)
        a *= 2;
    return a;
}

static size_t align256(size_t n)
{
    return (n + 255u) / 256u * 256u;
}

int cx_moe_experts(executor *ex, void *out, const void *x, const int32_t *ids, const float *weights,
                   void *const *w_gate_up, void *const *w_down, int32_t T, int32_t H, int32_t I, int32_t E,
                   int32_t k)
{
    cuda_exec *c = cx(ex);
    struct cx_moe *mo = &c->moe;
    int rc = moe_enter(c, "moe_experts");
    if (rc || T == 0)
        return rc;
    if (T < 0 || H < 1 || I < 1 || E < 1 || k < 1 || k > E)
        return pg_error_set(&c->err, PG_EINVAL, "cuda moe_experts: expected T >= 0, H, I >= 1, 1 <= k <= E, got "
                            "T %d, H %d, I %d, E %d, k %d", (int)T, (int)H, (int)I, (int)E, (int)k);
    const size_t n_pairs = (size_t)T * (size_t)k, eb = pgk_dtype_bytes(c->act_dt);
    /* 1. the ids to the host */
    void *h = NULL;
    if ((rc = cx_pinned_get(c->stream, &mo->ids_h, n_pairs * 4u, &h, &c->err)))
        return rc;
    CUDA_TRY(&c->err, "cudaMemcpyAsync (moe ids to the host)",
             cudaMemcpyAsync(h, ids, n_pairs * 4u, cudaMemcpyDeviceToHost, c->stream));
    CUDA_TRY(&c->err, "cudaStreamSynchronize (moe ids)", cudaStreamSynchronize(c->stream));
    const int32_t *id = h;
    /* 2. the plan: group starts (host), perm and pos (pinned, then device) */
    if ((size_t)E + 1 > mo->off_cap) {
        int32_t *n = realloc(mo->off, ((size_t)E + 1) * sizeof *n);
        if (!n)
            return pg_error_set(&c->err, PG_ENOMEM, "cuda moe_experts: out of host memory");
        mo->off = n;
        mo->off_cap = (size_t)E + 1;
    }
    int32_t *off = mo->off; /* [E + 1]: counts, then group starts, then (after the sort) group ends */
    memset(off, 0, ((size_t)E + 1) * sizeof *off);
    for (size_t i = 0; i < n_pairs; i++) {
        if (id[i] < 0 || id[i] >= E)
            return pg_error_set(&c->err, PG_EINVAL,
                                "cuda moe_experts: row %zu rank %zu: expert id %d outside [0, %d)", i / (size_t)k,
                                i % (size_t)k, (int)id[i], (int)E);
        off[id[i]]++;
    }
    int32_t a = align_rows((size_t)H * eb), a2 = align_rows((size_t)2 * (size_t)I * eb),
            a3 = align_rows((size_t)I * eb);
    a = a > a2 ? a : a2;
    a = a > a3 ? a : a3;
    int64_t S = 0; /* slots, gaps included */
    for (int32_t e = 0; e < E; e++) {
        const int32_t m = off[e];
        S = (S + a - 1) / a * a;
        off[e] = (int32_t)S; /* start of group e */
        S += m;
    }
    off[E] = (int32_t)S;
    const int64_t R = S + CUDA_GEMM_FIXED_ROWS; /* rows of every work buffer: in-place last chunks */
    void *ph = NULL;
    const size_t plan_bytes = ((size_t)S + n_pairs) * 4u;
    if ((rc = cx_pinned_get(c->stream, &mo->plan_h, plan_bytes, &ph, &c->err)))
        return rc;
    int32_t *perm = ph, *pos = perm + S;
    for (int64_t s = 0; s < S; s++)
        perm[s] = -1;
    /* the pairs in order (row-major): within a group, by row index */
    for (size_t i = 0; i < n_pairs; i++) {
        const int32_t slot = off[id[i]]++;
        perm[slot] = (int32_t)(i / (size_t)k);
        pos[i] = slot;
    }
    /* off[e] is now the end of group e; its start is the end of group
     * e - 1 rounded up to a (0 for e = 0) */
    size_t cap = mo->plan_cap;
    rc = cx_device_grow(c->stream, (void **)&mo->plan_d, &cap, plan_bytes, "cudaMalloc (moe plan)", &c->err);
    mo->plan_cap = cap;
    if (rc)
        return rc;
    CUDA_TRY(&c->err, "cudaMemcpyAsync (moe plan)",
             cudaMemcpyAsync(mo->plan_d, ph, plan_bytes, cudaMemcpyHostToDevice, c->stream));
    if ((rc = cx_pinned_mark(&mo->plan_h, c->stream, &c->err)))
        return rc;
    /* the work buffers, each 256-aligned: xs [R][H], gu [R][2I], act [R][I], ys [R][H] */
    const size_t b_x = align256((size_t)R * (size_t)H * eb), b_gu = align256((size_t)R * 2u * (size_t)I * eb),
                 b_act = align256((size_t)R * (size_t)I * eb);
    cap = mo->work_cap;
    rc = cx_device_grow(c->stream, &mo->work_d, &cap, 2 * b_x + b_gu + b_act, "cudaMalloc (moe work)", &c->err);
    mo->work_cap = cap;
    if (rc)
        return rc;
    char *xs = mo->work_d, *gu = xs + b_x, *act = gu + b_gu, *ys = act + b_act;
    /* 3. gather */
    if ((rc = pgk_moe_gather(xs, x, mo->plan_d, c->act_dt, (int32_t)S, H, &c->lk)))
        return rc;
    /* 4. - 6. the experts' products, in increasing id */
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t e = 0; e < E; e++) {
            const int32_t end = off[e], start = e == 0 ? 0 : off[e - 1];
            /* group e occupies [aligned start, end): its count is end minus
             * the aligned start (the slots between are the gap) */
            const int64_t s0 = (start + a - 1) / a * a, m = end - s0;
            if (m <= 0)
                continue; /* not read */
            if (!w_gate_up[e] || !w_down[e])
                return pg_error_set(&c->err, PG_EINVAL, "cuda moe_experts: expert %d has rows but no weights",
                                    (int)e);
            if (pass == 0)
                rc = cuda_gemm_xwt_rows(c->gemm, gu + (size_t)s0 * 2u * (size_t)I * eb, R - s0, c->act_dt,
                                        xs + (size_t)s0 * (size_t)H * eb, R - s0, w_gate_up[e], c->act_dt,
                                        (int32_t)m, 2 * I, H, &c->err);
            else
                rc = cuda_gemm_xwt_rows(c->gemm, ys + (size_t)s0 * (size_t)H * eb, R - s0, c->act_dt,
                                        act + (size_t)s0 * (size_t)I * eb, R - s0, w_down[e], c->act_dt,
                                        (int32_t)m, H, I, &c->err);
            if (rc || (rc = pgk_check_stream("moe_experts (cublasGemmEx)", &c->lk)))
                return rc;
        }
        if (pass == 0 && (rc = pgk_silu_mul(act, gu, c->act_dt, (int32_t)S, I, &c->lk)))
            return rc;
    }
    /* 7. un-permute and combine in rank order */
    return pgk_moe_combine(out, ys, mo->plan_d + S, weights, c->act_dt, T, H, k, &c->lk);
}
