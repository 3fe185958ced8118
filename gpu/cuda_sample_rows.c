/* cuda_sample_rows: see cuda_sample_rows.h. */
#include "cuda_sample_rows.h"

#include <stdlib.h>
#include <string.h>

#include "cuda_kernels.h"

static size_t up16(size_t n) { return (n + 15u) & ~(size_t)15u; }

static int smp_fail(pg_error *err, const char *what, cudaError_t e)
{
    return pg_error_set(err, PG_EDEVICE, "cuda sample rows: %s: %s", what, cudaGetErrorString(e));
}

int cuda_smp_set(cuda_smp *s, const pg_smp_batch *req, pg_error *err)
{
    s->req = NULL;
    if (!req)
        return 0;
    if (req->L < 1 || req->n < 0 || req->n > req->L || req->n_pen < 0 || req->n_ban < 0 ||
        req->n_mask < 0 || (req->n > 0 && (!req->rows || !req->ids)) ||
        (req->n_pen > 0 && (!req->pen_ids || !req->pen_cnt)) || (req->n_ban > 0 && !req->ban_ids) ||
        (req->n_mask > 0 && !req->mask))
        return pg_error_set(err, PG_EINVAL, "cuda sample rows: expected 0 <= n <= L, counts >= 0 and "
                            "their arrays, got L %d n %d", (int)req->L, (int)req->n);
    s->req = req->n > 0 ? req : NULL;
    return 0;
}

void cuda_smp_clear(cuda_smp *s)
{
    s->req = NULL;
    s->launched = 0;
}

/* raw_d holds at least rows rows of V floats: grown to max(rows, min(2x
 * what it held, L)) rows (a steady decode reallocates it a few times at
 * most, never past the step's rows), after the stream's work (a kernel
 * queued earlier may read the old one). */
static int smp_raw_grow(cuda_smp *s, int32_t rows, int32_t L, int32_t V, cudaStream_t st, pg_error *err)
{
    const size_t row_bytes = (size_t)V * 4u, need = (size_t)rows * row_bytes;
    if (s->raw_cap >= need)
        return 0;
    size_t want = 2 * (s->raw_cap / row_bytes);
    want = want < (size_t)L ? want : (size_t)L;
    want = (want > (size_t)rows ? want : (size_t)rows) * row_bytes;
    cudaError_t e;
    if ((e = cudaStreamSynchronize(st)) != cudaSuccess)
        return smp_fail(err, "cudaStreamSynchronize", e);
    if (s->raw_d)
        cudaFree(s->raw_d);
    s->raw_d = NULL;
    s->raw_cap = 0;
    if ((e = cudaMalloc((void **)&s->raw_d, want)) != cudaSuccess)
        return smp_fail(err, "cudaMalloc (rows kept for their logprobs)", e);
    s->raw_cap = want;
    return 0;
}

int cuda_smp_launch(cuda_smp *s, float *logits_d, int32_t L, int32_t V, const pg_lsm_row *lp,
                    pgk_launch *lk)
{
    cudaStream_t st = lk->st;
    pg_error *err = lk->err;
    const pg_smp_batch *q = s->req;
    s->launched = 0;
    if (!q)
        return 0;
    s->req = NULL;
    if (q->L != L)
        return pg_error_set(err, PG_EINVAL, "cuda sample rows: the request has %d rows, the logits %d",
                            (int)q->L, (int)L);
    const int32_t W = (V + 31) / 32;
    if (s->marked_cap < L) {
        int32_t *m = realloc(s->marked, (size_t)L * sizeof *m);
        if (!m)
            return pg_error_set(err, PG_ENOMEM, "cuda sample rows: out of memory");
        s->marked = m;
        s->marked_cap = L;
    }
    memset(s->marked, 0, (size_t)L * sizeof *s->marked);
    if (s->raw_slot_cap < q->n) {
        int32_t *m = realloc(s->raw_slot, (size_t)q->n * sizeof *m);
        if (!m)
            return pg_error_set(err, PG_ENOMEM, "cuda sample rows: out of memory");
        s->raw_slot = m;
        s->raw_slot_cap = q->n;
    }
    int32_t n_raw = 0;
    for (int32_t i = 0; i < q->n; i++) {
        const pg_smp_row *r = &q->rows[i];
        if (r->row < 0 || r->row >= L || s->marked[r->row] || r->pen_first < 0 || r->n_pen < 0 ||
            r->pen_first + r->n_pen > q->n_pen || r->ban_first < 0 || r->n_ban < 0 ||
            r->ban_first + r->n_ban > q->n_ban || r->mask_first < -1 ||
            (r->mask_first >= 0 && r->mask_first + W > q->n_mask))
            return pg_error_set(err, PG_EINVAL, "cuda sample rows: row %d (logits row %d) out of range "
                                "(L %d, %d penalty ids, %d banned, %d mask words)", (int)i, (int)r->row,
                                (int)L, (int)q->n_pen, (int)q->n_ban, (int)q->n_mask);
        s->marked[r->row] = i + 1;
        const bool keep = lp && lp[r->row].want && lp[r->row].token == PG_LSM_SAMPLED;
        s->raw_slot[i] = keep ? n_raw++ : -1;
    }
    for (int32_t i = 0; i < q->n_pen; i++)
        if (q->pen_ids[i] < 0 || q->pen_ids[i] >= V)
            return pg_error_set(err, PG_EINVAL, "cuda sample rows: penalty id %d not in [0, %d)",
                                (int)q->pen_ids[i], (int)V);
    for (int32_t i = 0; i < q->n_ban; i++)
        if (q->ban_ids[i] < 0 || q->ban_ids[i] >= V)
            return pg_error_set(err, PG_EINVAL, "cuda sample rows: banned id %d not in [0, %d)",
                                (int)q->ban_ids[i], (int)V);
    /* one layout for the staging and the device copy */
    const size_t o_rows = 0, o_pi = up16((size_t)q->n * sizeof(pg_smp_row));
    const size_t o_pc = o_pi + up16((size_t)q->n_pen * 4u), o_ban = o_pc + up16((size_t)q->n_pen * 4u);
    const size_t o_mask = o_ban + up16((size_t)q->n_ban * 4u);
    const size_t o_slot = o_mask + up16((size_t)q->n_mask * 4u), o_ids = o_slot + up16((size_t)q->n * 4u);
    const size_t bytes = o_ids + up16((size_t)q->n * 4u);
    cudaError_t e;
    if (s->queued) { /* a failed step left a copy from the staging queued */
        if ((e = cudaStreamSynchronize(st)) != cudaSuccess)
            return smp_fail(err, "cudaStreamSynchronize", e);
        s->queued = false;
    }
    if (s->buf_d_cap < bytes) {
        if (s->buf_d)
            cudaFree(s->buf_d);
        s->buf_d = NULL;
        s->buf_d_cap = 0;
        if ((e = cudaMalloc(&s->buf_d, bytes * 2)) != cudaSuccess)
            return smp_fail(err, "cudaMalloc", e);
        s->buf_d_cap = bytes * 2;
    }
    if (s->buf_h_cap < bytes) {
        if (s->buf_h)
            cudaFreeHost(s->buf_h);
        s->buf_h = NULL;
        s->buf_h_cap = 0;
        if ((e = cudaMallocHost(&s->buf_h, bytes * 2)) != cudaSuccess)
            return smp_fail(err, "cudaMallocHost", e);
        s->buf_h_cap = bytes * 2;
    }
    if (n_raw > 0) {
        int rc = smp_raw_grow(s, n_raw, L, V, st, err);
        if (rc)
            return rc;
    }
    char *h = s->buf_h, *d = s->buf_d;
    memcpy(h + o_rows, q->rows, (size_t)q->n * sizeof(pg_smp_row));
    if (q->n_pen) {
        memcpy(h + o_pi, q->pen_ids, (size_t)q->n_pen * 4u);
        memcpy(h + o_pc, q->pen_cnt, (size_t)q->n_pen * 4u);
    }
    if (q->n_ban)
        memcpy(h + o_ban, q->ban_ids, (size_t)q->n_ban * 4u);
    if (q->n_mask)
        memcpy(h + o_mask, q->mask, (size_t)q->n_mask * 4u);
    memcpy(h + o_slot, s->raw_slot, (size_t)q->n * 4u);
    if ((e = cudaMemcpyAsync(d, h, o_ids, cudaMemcpyHostToDevice, st)) != cudaSuccess)
        return smp_fail(err, "cudaMemcpyAsync (rows)", e);
    s->queued = true;
    int rc = pgk_sample((int32_t *)(void *)(d + o_ids), logits_d, V, (const pg_smp_row *)(void *)(d + o_rows),
                        q->n, (const int32_t *)(void *)(d + o_pi), (const int32_t *)(void *)(d + o_pc),
                        (const int32_t *)(void *)(d + o_ban), (const uint32_t *)(void *)(d + o_mask),
                        n_raw > 0 ? s->raw_d : NULL,
                        n_raw > 0 ? (const int32_t *)(void *)(d + o_slot) : NULL, lk);
    if (rc)
        return rc;
    if ((e = cudaMemcpyAsync(h + o_ids, d + o_ids, (size_t)q->n * 4u, cudaMemcpyDeviceToHost, st)) !=
        cudaSuccess)
        return smp_fail(err, "cudaMemcpyAsync (ids)", e);
    s->ids_off = o_ids;
    s->req = q; /* kept for cuda_smp_finish */
    s->launched = q->n;
    return 0;
}

void cuda_smp_finish(cuda_smp *s)
{
    if (s->launched > 0 && s->req)
        memcpy(s->req->ids, (const char *)s->buf_h + s->ids_off, (size_t)s->launched * 4u);
    s->queued = false;
    s->req = NULL;
    s->launched = 0;
}

void cuda_smp_free(cuda_smp *s)
{
    if (s->buf_d)
        cudaFree(s->buf_d);
    if (s->buf_h)
        cudaFreeHost(s->buf_h);
    if (s->raw_d)
        cudaFree(s->raw_d);
    free(s->marked);
    free(s->raw_slot);
    memset(s, 0, sizeof *s);
}
