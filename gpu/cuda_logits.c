/* cuda_logits: the end of a step — lm_head into f32 logits, the greedy rows'
 * argmax and the logprob rows' log-softmax on the device, and the copy of
 * the other rows to the host; and the public entry points that mark those
 * rows (cuda_executor.h). See cuda_exec_internal.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_exec_internal.h"

/* The pending logprob rows (cuda_executor_logprob_rows) of logits_d [L][V]: their
 * requests uploaded, pgk_logprobs, the results queued for a copy into
 * pinned memory (cx_logits_out waits and hands them over). Not capturable
 * (runs after a replay, or in an eager step). Runs after the step's
 * sampled rows (cuda_smp_launch, given the rows: cx_rows_launch): a
 * PG_LSM_SAMPLED row reads the row the sampler kept and the id it drew,
 * both on the device. Sets c->lp_n. */
int cx_lp_launch(cuda_exec *c, const float *logits_d, int32_t L, int32_t V)
{
    c->lp_n = 0;
    if (!c->lp_L)
        return 0;
    if (c->lp_L != L)
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda logits: the logprob rows have %d rows, the step %d", (int)c->lp_L, (int)L);
    int32_t n = 0;
    for (int32_t r = 0; r < L; r++) {
        const pg_lsm_row *q = &c->lp_rows[r];
        if (!q->want)
            continue;
        if (q->token < PG_LSM_SAMPLED || q->token >= V || q->k < 0 || q->k > PG_LSM_MAX_TOP)
            return pg_error_set(&c->err, PG_EINVAL,
                                "cuda logprob rows: row %d: expected token in [%d, %d) and k in [0, %d], "
                                "got %d and %d", (int)r, PG_LSM_SAMPLED, (int)V, PG_LSM_MAX_TOP,
                                (int)q->token, (int)q->k);
        if ((q->token == PG_LSM_SAMPLED) != cuda_smp_marked(&c->smp, r))
            return pg_error_set(&c->err, PG_EINVAL,
                                "cuda logprob rows: row %d: expected token %d (the sampled one) exactly "
                                "for a row sampled on the device, got token %d on a row %s", (int)r,
                                PG_LSM_SAMPLED, (int)q->token,
                                cuda_smp_marked(&c->smp, r) ? "sampled" : "not sampled");
        if (c->greedy_L && c->greedy[r])
            return pg_error_set(&c->err, PG_EINVAL,
                                "cuda logprob rows: row %d: expected a row marked once, got it greedy too",
                                (int)r);
        n++;
    }
    if (n == 0)
        return 0;
    void *hq = NULL, *ho = NULL;
    size_t cap = c->lp_req_cap;
    int rc = cx_device_grow(c->stream, (void **)&c->lp_req_d, &cap, (size_t)n * sizeof(pgk_lp_req),
                         "cudaMalloc (logprob requests)", &c->err);
    c->lp_req_cap = cap;
    if (rc)
        return rc;
    cap = c->lp_out_cap;
    rc = cx_device_grow(c->stream, (void **)&c->lp_out_d, &cap, (size_t)n * sizeof(pg_lsm_row),
                     "cudaMalloc (logprob results)", &c->err);
    c->lp_out_cap = cap;
    if (rc || (rc = cx_pinned_get(c->stream, &c->lp_req_h, (size_t)n * sizeof(pgk_lp_req), &hq, &c->err)) ||
        (rc = cx_pinned_get(c->stream, &c->lp_out_h, (size_t)n * sizeof(pg_lsm_row), &ho, &c->err)))
        return rc;
    pgk_lp_req *req = hq;
    for (int32_t r = 0, q = 0; r < L; r++) {
        const pg_lsm_row *w = &c->lp_rows[r];
        if (!w->want)
            continue;
        if (w->token == PG_LSM_SAMPLED) { /* its kept row, its drawn id */
            const int32_t sid = cuda_smp_index(&c->smp, r), raw_row = cuda_smp_raw_row(&c->smp, sid);
            if (raw_row < 0)
                return pg_error_set(&c->err, PG_EINVAL, "cuda logprob rows: row %d: the sampled row was not "
                                    "kept for its logprobs", (int)r);
            req[q++] = (pgk_lp_req){.row = raw_row, .token = PG_LSM_SAMPLED, .k = w->k, .sid = sid};
        } else {
            req[q++] = (pgk_lp_req){.row = r, .token = w->token, .k = w->k};
        }
    }
    CUDA_TRY(&c->err, "cudaMemcpyAsync (logprob requests)",
             cudaMemcpyAsync(c->lp_req_d, hq, (size_t)n * sizeof(pgk_lp_req), cudaMemcpyHostToDevice,
                             c->stream));
    if ((rc = cx_pinned_mark(&c->lp_req_h, c->stream, &c->err)) ||
        (rc = pgk_logprobs(c->lp_out_d, logits_d, V, c->lp_req_d, n, cuda_smp_raw(&c->smp),
                           c->smp.launched > 0 ? cuda_smp_ids_d(&c->smp) : NULL, &c->lk)))
        return rc;
    CUDA_TRY(&c->err, "cudaMemcpyAsync (logprob results)",
             cudaMemcpyAsync(ho, c->lp_out_d, (size_t)n * sizeof(pg_lsm_row), cudaMemcpyDeviceToHost,
                             c->stream));
    c->lp_n = n;
    return 0;
}

int cx_rows_launch(cuda_exec *c, float *logits_d, int32_t L, int32_t V)
{
    /* the sampled rows first: a row also marked for its logprobs is kept as
     * the sampler reads it, and cx_lp_launch scores it with the drawn id */
    int rc = cuda_smp_launch(&c->smp, logits_d, L, V, c->lp_L == L ? c->lp_rows : NULL, &c->lk);
    if (!rc)
        rc = cx_lp_launch(c, logits_d, L, V);
    if (rc)
        c->lp_L = 0;
    return rc;
}

/* The logits rows of a step to the host: rows the pending greedy mask
 * (cuda_executor_greedy_next_step) marks get only their id (ids_pinned,
 * an argmax copy queued on the stream), the others their V floats, through
 * pinned memory (a DMA straight from the device; a pageable copy is staged
 * by the driver in pieces) — one copy per run of consecutive rows. Waits
 * for the stream (cx_logits_finish) unless defer_now: an asynchronous step
 * returns with the copies queued, its results written by
 * cuda_executor_wait_step; consumes the mask. */
int cx_logits_out(cuda_exec *c, float *logits_host, const float *logits_d, pinned_buf *ph,
                      const int32_t *ids_pinned, int32_t L, int32_t V)
{
    const uint8_t *gm = c->greedy_L ? c->greedy : NULL;
    int32_t *ids_host = c->greedy_ids;
    const int32_t gL = c->greedy_L;
    pg_lsm_row *lp = c->lp_n ? c->lp_rows : NULL; /* cx_lp_launch checked lp_L == L */
    const int32_t lp_n = c->lp_n;
    c->greedy_L = 0;
    c->lp_L = 0;
    c->lp_n = 0;
    c->logits_copy_bytes = 0;
    if (gm && (gL != L || !ids_pinned))
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda logits: the greedy mask has %d rows, the step %d", (int)gL, (int)L);
    const size_t row_bytes = (size_t)V * 4u;
    void *hv = NULL;
    int rc = cx_pinned_get(c->stream, ph, (size_t)L * row_bytes, &hv, &c->err);
    if (rc)
        return pg_error_wrap(&c->err, rc, "cuda logits");
    float *h = hv;
    for (int32_t r = 0, r1; r < L; r = r1) {
        for (r1 = r; r1 < L && !(gm && gm[r1]) && !(lp && lp[r1].want) && !cuda_smp_marked(&c->smp, r1);
             r1++)
            ;
        if (r1 == r) {
            r1 = r + 1; /* a greedy, logprob or sampled row: not copied */
            continue;
        }
        CUDA_TRY(&c->err, "cudaMemcpyAsync (logits)",
                 cudaMemcpyAsync(h + (size_t)r * V, logits_d + (size_t)r * V,
                                 (size_t)(r1 - r) * row_bytes, cudaMemcpyDeviceToHost, c->stream));
        c->logits_copy_bytes += (size_t)(r1 - r) * row_bytes;
        c->logits_copy_total += (size_t)(r1 - r) * row_bytes;
    }
    struct cx_pending *pd = &c->pend;
    pd->logits_host = logits_host;
    pd->h = h;
    pd->gm = gm;
    pd->ids_host = ids_host;
    pd->ids_pinned = ids_pinned;
    pd->lp = lp;
    pd->lp_n = lp_n;
    pd->L = L;
    pd->V = V;
    pd->active = 1;
    if (c->defer_now) { /* an asynchronous step: cx_logits_finish comes */
        c->defer_now = 0;
        return 0;
    }
    return cx_logits_finish(c);
}

int cx_logits_finish(cuda_exec *c)
{
    struct cx_pending *pd = &c->pend;
    if (!pd->active)
        return 0;
    pd->active = 0;
    float *logits_host = pd->logits_host;
    const float *h = pd->h;
    const uint8_t *gm = pd->gm;
    int32_t *ids_host = pd->ids_host;
    const int32_t *ids_pinned = pd->ids_pinned;
    pg_lsm_row *lp = pd->lp;
    const int32_t lp_n = pd->lp_n, L = pd->L, V = pd->V;
    const size_t row_bytes = (size_t)V * 4u;
    step_profile *sp = cuda_sprof_profile(c->sprof);
    double t0 = step_profile_now();
    cudaError_t e = cudaStreamSynchronize(c->stream);
    step_profile_add(sp, SP_WAIT, t0);
    if (e != cudaSuccess) {
        cuda_smp_clear(&c->smp);
        return cx_fail(&c->err, PG_EDEVICE, "cudaStreamSynchronize (logits)", e);
    }
    t0 = step_profile_now();
    const pg_lsm_row *lp_out = lp_n ? c->lp_out_h.h : NULL;
    for (int32_t r = 0, q = 0; r < L; r++) {
        if (lp && lp[r].want) { /* results in the order of the requests (cx_lp_launch) */
            lp[r] = lp_out[q++];
            continue;
        }
        if (cuda_smp_marked(&c->smp, r))
            continue; /* its id comes with cuda_smp_finish */
        if (!(gm && gm[r])) {
            memcpy(logits_host + (size_t)r * V, h + (size_t)r * V, row_bytes);
            continue;
        }
        ids_host[r] = ids_pinned[r];
        if (ids_host[r] < 0) {
            cuda_smp_clear(&c->smp);
            return pg_error_set(&c->err, PG_EINVAL,
                                "cuda logits: greedy row %d: no token can be sampled: all %d logits "
                                "are -inf or nan", (int)r, (int)V);
        }
    }
    cuda_smp_finish(&c->smp);
    step_profile_add(sp, SP_D2H, t0);
    return 0;
}

static size_t row_f32(int32_t V)
{
    return (size_t)V * 4u;
}

static int logits_impl(cuda_exec *c, float *logits_host, const void *x, const void *w, int32_t L,
                       int32_t V, int32_t H)
{
    if (L < 1 || V < 1 || H < 1)
        return pg_error_set(&c->err, PG_EINVAL, "cuda logits: expected L, V, H >= 1, got %d, %d, %d",
                            (int)L, (int)V, (int)H);
    size_t bytes = (size_t)L * (size_t)V * 4u;
    if (cx_graph_bound(c))
        return cx_graph_logits(c, x, w, L, V, H);
    size_t cap = c->logits_cap;
    int rc = cx_device_grow(c->stream, (void **)&c->logits_d, &cap, bytes, "cudaMalloc (logits)", &c->err);
    c->logits_cap = cap;
    if (rc)
        return rc;
    const int64_t x_rows = cx_rows_after(c, x, (size_t)H * pgk_dtype_bytes(c->act_dt));
    rc = cuda_gemm_xwt_rows(c->gemm, c->logits_d, (int64_t)(c->logits_cap / row_f32(V)), PGK_F32, x,
                            x_rows > L ? x_rows : L, w, c->act_dt, L, V, H, &c->err);
    if (rc)
        return rc;
    const int32_t *ids = NULL;
    if (c->greedy_L) { /* the greedy rows' ids: argmax on the device */
        cap = c->ids_cap;
        rc = cx_device_grow(c->stream, (void **)&c->ids_d, &cap, (size_t)L * 4u,
                         "cudaMalloc (argmax ids)", &c->err);
        c->ids_cap = cap;
        void *hi = NULL;
        if (rc || (rc = pgk_argmax(c->ids_d, c->logits_d, L, V, &c->lk)) ||
            (rc = cx_pinned_get(c->stream, &c->ids_h, (size_t)L * 4u, &hi, &c->err))) {
            c->greedy_L = 0;
            return rc;
        }
        CUDA_TRY(&c->err, "cudaMemcpyAsync (argmax ids)",
                 cudaMemcpyAsync(hi, c->ids_d, (size_t)L * 4u, cudaMemcpyDeviceToHost, c->stream));
        ids = hi;
    }
    if ((rc = cx_rows_launch(c, c->logits_d, L, V)))
        return rc;
    return cx_logits_out(c, logits_host, c->logits_d, &c->logits_h, ids, L, V);
}

int cx_logits(executor *ex, float *logits_host, const void *x, const void *w, int32_t L,
                       int32_t V, int32_t H)
{
    cuda_exec *c = cx(ex);
    int rc = logits_impl(c, logits_host, x, w, L, V, H);
    if (!cx_graph_bound(c)) { /* a mask is for one step, whatever happened (a graph's is the replay's) */
        c->greedy_L = 0;
        c->lp_L = 0;
        if (!c->pend.active) /* (a deferred copy-out still reads it) */
            cuda_smp_clear(&c->smp);
    }
    return rc;
}

int cuda_executor_greedy_next_step(executor *ex, const uint8_t *greedy, int32_t L,
                                   int32_t *ids_host)
{
    cuda_exec *c = cx_as_cuda(ex);
    if (!c)
        return PG_EINVAL;
    if (L < 0 || (L > 0 && (!greedy || !ids_host)))
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda greedy rows: expected L >= 0 and a mask and ids for L > 0, got L %d",
                            (int)L);
    c->greedy = greedy;
    c->greedy_ids = ids_host;
    c->greedy_L = L;
    return 0;
}

int cuda_executor_logprob_rows(executor *ex, pg_lsm_row *rows, int32_t L)
{
    cuda_exec *c = cx_as_cuda(ex);
    if (!c)
        return PG_EINVAL;
    if (L < 0 || (L > 0 && !rows))
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda logprob rows: expected L >= 0 and rows for L > 0, got L %d", (int)L);
    c->lp_rows = rows;
    c->lp_L = L;
    return 0;
}

int cuda_executor_sample_rows(executor *ex, const pg_smp_batch *req)
{
    cuda_exec *c = cx_as_cuda(ex);
    return c ? cuda_smp_set(&c->smp, req, &c->err) : PG_EINVAL;
}

int cuda_executor_logprobs(executor *ex, pg_lsm_row *rows_host, const float *logits, int32_t n,
                           int32_t V)
{
    cuda_exec *c = cx(ex);
    if (n < 1 || V < 1)
        return pg_error_set(&c->err, PG_EINVAL, "cuda logprobs: expected n, V >= 1, got %d, %d",
                            (int)n, (int)V);
    for (int32_t r = 0; r < n; r++)
        rows_host[r].want = 1;
    pg_lsm_row *saved = c->lp_rows;
    int32_t saved_L = c->lp_L;
    c->lp_rows = rows_host;
    c->lp_L = n;
    int rc = cx_lp_launch(c, logits, n, V);
    c->lp_rows = saved;
    c->lp_L = saved_L;
    if (!rc && c->lp_n == n) {
        cudaError_t e = cudaStreamSynchronize(c->stream);
        if (e != cudaSuccess)
            rc = cx_fail(&c->err, PG_EDEVICE, "logprobs result copy", e);
        else
            memcpy(rows_host, c->lp_out_h.h, (size_t)n * sizeof *rows_host);
    }
    c->lp_n = 0;
    return rc;
}
int cuda_executor_argmax(executor *ex, int32_t *ids_host, const float *logits, int32_t rows,
                         int32_t V)
{
    cuda_exec *c = cx(ex);
    int32_t *ids_d = NULL;
    if (rows < 1)
        return pg_error_set(&c->err, PG_EINVAL, "cuda argmax: rows %d < 1", (int)rows);
    CUDA_TRY(&c->err, "cudaMalloc (argmax ids)", cudaMalloc((void **)&ids_d, (size_t)rows * 4u));
    int rc = pgk_argmax(ids_d, logits, rows, V, &c->lk);
    if (rc == 0) {
        cudaError_t e = cudaMemcpyAsync(ids_host, ids_d, (size_t)rows * 4u, cudaMemcpyDeviceToHost,
                                        c->stream);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(c->stream);
        if (e != cudaSuccess)
            rc = cx_fail(&c->err, PG_EDEVICE, "argmax result copy", e);
    }
    for (int32_t r = 0; rc == 0 && r < rows; r++)
        if (ids_host[r] < 0)
            rc = pg_error_set(&c->err, PG_EINVAL,
                              "cuda argmax: row %d: no token can be sampled: all %d logits are -inf "
                              "or nan", (int)r, (int)V);
    cudaFree(ids_d);
    return rc;
}

