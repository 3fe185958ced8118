/* logprobs: the log-softmax results of marked logits rows on the device —
 * the row's lse, one token's logprob and rank, the top k — so that a row
 * that needs logprobs copies a few floats instead of its V (gpu/README.md,
 * "What still crosses PCIe"). The arithmetic is common/pg_logsoftmax.h's
 * definition, the one core/sampler.c and core/engine.c compute on the
 * host: the same bits (tests/gpu/test_cuda_executor.c compares them).
 * Simple twin: pg_lsm_lse + pg_lsm_topk, the host's whole-row functions. */
#include "cuda_common.cuh"

#define LP_THREADS PG_LSM_LANES /* one lane of the definition per thread */

/* The first n of a (na) and b (nb), two lists in pg_lsm_better's order,
 * into (ov, oi): a merge (the order is total, so the result is unique). */
/* List t (na entries) and list u (nb), both in pg_lsm_better's order in
 * (sv, si) rows of PG_LSM_MAX_TOP, merged into list t's row, at most n
 * entries (the order is total: the result is unique). In place, from the
 * back: count how many of each the first n take, then fill from the last
 * position down (position i + j never overwrites an unread entry of t). */
static __device__ __forceinline__ int32_t merge_top(float *av, int32_t *ai, int32_t na,
                                                    const float *bv, const int32_t *bi, int32_t nb,
                                                    int32_t n)
{
    int32_t i = 0, j = 0;
    while (i + j < n && (i < na || j < nb)) {
        if (j >= nb || (i < na && pg_lsm_better(av[i], ai[i], bv[j], bi[j])))
            i++;
        else
            j++;
    }
    const int32_t total = i + j;
    while (j > 0) { /* i + j - 1 >= i - 1: the slot of the last unread t entry or later */
        if (i > 0 && pg_lsm_better(bv[j - 1], bi[j - 1], av[i - 1], ai[i - 1])) {
            av[i + j - 1] = av[i - 1];
            ai[i + j - 1] = ai[i - 1];
            i--;
        } else {
            av[i + j - 1] = bv[j - 1];
            ai[i + j - 1] = bi[j - 1];
            j--;
        }
    }
    return total;
}

/* grid (n requests), block LP_THREADS. Request q reads row req[q].row of
 * logits [.][V]:
 *   m = max_v raw[v] + 0.0; thread j sums pg_lsm_exp(raw[v] - m) over
 *   v = j, j + 256, ... in order (lane j); the lanes fold by the fixed tree
 *   (s = 128 .. 1); lse = m + pg_lsm_log(lane 0)          (pg_logsoftmax.h)
 *   top: each thread keeps the best kk = max(k, 1) of its v's, then a tree
 *   of merges (8 levels) gives the row's best kk;
 *   token = req.token, the argmax (top 0, when > -inf) for -1, or for
 *   PG_LSM_SAMPLED sampled[req.sid] over row req.row of raw;
 *   rank = 1 + #{v: raw[v] > raw[token]}. */
static __global__ void __launch_bounds__(LP_THREADS)
logprobs_kernel(pg_lsm_row *__restrict__ out, const float *__restrict__ logits, int32_t V,
                const pgk_lp_req *__restrict__ req, const float *__restrict__ raw,
                const int32_t *__restrict__ sampled)
{
    __shared__ float s_v[LP_THREADS * PG_LSM_MAX_TOP];
    __shared__ int32_t s_i[LP_THREADS * PG_LSM_MAX_TOP];
    __shared__ int32_t s_n[LP_THREADS];
    __shared__ double s_d[LP_THREADS];
    __shared__ int32_t s_c[LP_THREADS];
    const pgk_lp_req rq = req[blockIdx.x];
    const bool smp = rq.token == PG_LSM_SAMPLED; /* the row pgk_sample copied, its drawn id */
    const float *row = (smp ? raw : logits) + (size_t)rq.row * (size_t)V;
    const int32_t t = (int32_t)threadIdx.x;
    const int32_t kk = rq.k > 0 ? rq.k : 1;

    /* max and this thread's top kk (its list lives in shared memory) */
    float *lv = &s_v[t * PG_LSM_MAX_TOP];
    int32_t *li = &s_i[t * PG_LSM_MAX_TOP];
    int32_t have = 0;
    double m = -INFINITY;
    for (int32_t v = t; v < V; v += LP_THREADS) {
        float x = row[v];
        if ((double)x > m)
            m = (double)x;
        if (have == kk && !pg_lsm_better(x, v, lv[kk - 1], li[kk - 1]))
            continue;
        int32_t pos = have < kk ? have : kk - 1;
        while (pos > 0 && pg_lsm_better(x, v, lv[pos - 1], li[pos - 1])) {
            lv[pos] = lv[pos - 1];
            li[pos] = li[pos - 1];
            pos--;
        }
        lv[pos] = x;
        li[pos] = v;
        if (have < kk)
            have++;
    }
    s_d[t] = m;
    s_n[t] = have;
    __syncthreads();
    for (int32_t s = LP_THREADS / 2; s > 0; s >>= 1) { /* max: exact in any order */
        if (t < s && s_d[t + s] > s_d[t])
            s_d[t] = s_d[t + s];
        __syncthreads();
    }
    m = s_d[0] + 0.0;
    __syncthreads();

    /* lane t of the sum, then the tree */
    double lane = 0.0;
    for (int32_t v = t; v < V; v += LP_THREADS)
        lane = lane + pg_lsm_exp((double)row[v] - m);
    s_d[t] = lane;
    __syncthreads();
    for (int32_t s = LP_THREADS / 2; s > 0; s >>= 1) {
        if (t < s)
            s_d[t] = s_d[t] + s_d[t + s];
        if (t < s) /* the top lists, merged alongside */
            s_n[t] = merge_top(&s_v[t * PG_LSM_MAX_TOP], &s_i[t * PG_LSM_MAX_TOP], s_n[t],
                               &s_v[(t + s) * PG_LSM_MAX_TOP], &s_i[(t + s) * PG_LSM_MAX_TOP],
                               s_n[t + s], kk);
        __syncthreads();
    }
    const double lse = m + pg_lsm_log(s_d[0]);

    /* the token and its rank */
    int32_t tok = smp ? sampled[rq.sid] : rq.token;
    if (rq.token == -1) /* the argmax: core/sampler.c's greedy rule (> -inf, NaN never wins) */
        tok = s_n[0] > 0 && s_v[0] > -INFINITY ? s_i[0] : -1;
    int32_t cnt = 0;
    if (tok >= 0) {
        const float xt = row[tok];
        for (int32_t v = t; v < V; v += LP_THREADS)
            cnt += row[v] > xt;
    }
    s_c[t] = cnt;
    __syncthreads();
    for (int32_t s = LP_THREADS / 2; s > 0; s >>= 1) {
        if (t < s)
            s_c[t] += s_c[t + s];
        __syncthreads();
    }
    if (t == 0) {
        pg_lsm_row *o = &out[blockIdx.x];
        o->want = 1;
        o->k = rq.k;
        o->token = tok;
        o->logprob = tok >= 0 ? pg_lsm_logprob(row[tok], lse) : 0.0f;
        o->rank = 1 + s_c[0];
        o->lse = lse;
        int32_t n = rq.k < s_n[0] ? rq.k : s_n[0];
        o->n_top = n;
        for (int32_t j = 0; j < PG_LSM_MAX_TOP; j++) {
            o->top_ids[j] = j < n ? s_i[j] : -1;
            o->top_lp[j] = j < n ? pg_lsm_logprob(s_v[j], lse) : 0.0f;
        }
    }
}

extern "C" int pgk_logprobs(pg_lsm_row *out, const float *logits, int32_t V, const pgk_lp_req *d_req,
                            int32_t n, const float *raw, const int32_t *sampled, pgk_launch *lk)
{
    if (n < 1 || V < 1)
        return pg_error_set(lk->err, PG_EINVAL, "logprobs: expected n, V >= 1, got %d, %d", (int)n, (int)V);
    logprobs_kernel<<<(unsigned)n, LP_THREADS, 0, lk->st>>>(out, logits, V, d_req, raw, sampled);
    return pgk_check_launch("logprobs_kernel", lk);
}
