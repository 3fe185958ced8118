/* sampling: sampled logits rows turned into tokens on the device —
 * temperature, top-k, top-p, min-p, penalties, banned ids, a grammar mask
 * and the request's random stream — so a sampled row copies one id
 * instead of its V floats (gpu/README.md, "What still crosses PCIe"). The
 * arithmetic is common/pg_sample.h's definition, steps 0-9, the one
 * core/sampler.c computes on the host: the same token for the same row and
 * draw (tests/gpu/test_cuda_sampling.c compares them on the emulator).
 * Simple twin: core/sampler.c sampler_sample (and its own twin,
 * tests/core/test_sample_def.c).
 *
 * One block of SMP_THREADS per row; every sum after step 7 is an integer
 * sum (exact, so the block's order does not matter); selections (top-k's
 * k-th largest, top-p's cut) are radix selects over pg_smp_key with
 * per-bucket counts or weights in shared memory; the draw's inverse CDF
 * is an exclusive scan of per-thread chunk sums. The row is rewritten in
 * place (the logits after steps 0-6); a row whose logprobs are wanted is
 * first copied out after step 0 (raw_slot: the row the host's logprobs
 * read, which gpu/logprobs.cu then scores with the drawn token). */
#include "cuda_common.cuh"

#include "pg_sample.h"

#define SMP_THREADS 512
#define SMP_BINS 2048

/* A block-wide sum of v (integer: exact in any order); every thread gets
 * it. s: [SMP_THREADS] shared scratch. */
template <typename T> static __device__ __forceinline__ T smp_sum(T v, T *s)
{
    const int t = (int)threadIdx.x;
    s[t] = v;
    __syncthreads();
    for (int h = SMP_THREADS / 2; h > 0; h >>= 1) {
        if (t < h)
            s[t] = s[t] + s[t + h];
        __syncthreads();
    }
    T r = s[0];
    __syncthreads();
    return r;
}

static __device__ __forceinline__ uint32_t smp_max_u32(uint32_t v, uint32_t *s)
{
    const int t = (int)threadIdx.x;
    s[t] = v;
    __syncthreads();
    for (int h = SMP_THREADS / 2; h > 0; h >>= 1) {
        if (t < h && s[t + h] > s[t])
            s[t] = s[t + h];
        __syncthreads();
    }
    uint32_t r = s[0];
    __syncthreads();
    return r;
}

/* The exclusive prefix sum of v over the threads (Hillis-Steele, exact). */
static __device__ __forceinline__ uint64_t smp_excl_scan(uint64_t v, uint64_t *s)
{
    const int t = (int)threadIdx.x;
    s[t] = v;
    __syncthreads();
    for (int off = 1; off < SMP_THREADS; off <<= 1) {
        uint64_t a = t >= off ? s[t - off] : 0;
        __syncthreads();
        s[t] += a;
        __syncthreads();
    }
    uint64_t r = s[t] - v;
    __syncthreads();
    return r;
}

/* pg_smp_key's inverse */
static __device__ __forceinline__ float smp_unkey(uint32_t k)
{
    return pg_smp_ffrom((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* Bucket b (from the top) where the counts or weights hist[SMP_BINS]
 * (bucket width nb) reach rem from above: *rem drops what the buckets above
 * it hold. One thread. */
template <typename T> static __device__ __forceinline__ uint32_t smp_pick(const T *hist, uint32_t nb, T *rem)
{
    T acc = 0;
    uint32_t b = nb - 1;
    for (;; b--) {
        if (acc + hist[b] >= *rem || b == 0)
            break;
        acc += hist[b];
    }
    *rem -= acc;
    return b;
}

/* grid (n rows), block SMP_THREADS: ids[q] = the token of rows[q]. */
static __global__ void __launch_bounds__(SMP_THREADS, 1)
sample_kernel(int32_t *__restrict__ ids, float *__restrict__ logits, int32_t V,
              const pg_smp_row *__restrict__ rows, const int32_t *__restrict__ pen_ids,
              const int32_t *__restrict__ pen_cnt, const int32_t *__restrict__ ban_ids,
              const uint32_t *__restrict__ mask, float *__restrict__ raw,
              const int32_t *__restrict__ raw_slot)
{
    __shared__ uint64_t s_u64[SMP_THREADS];
    __shared__ uint32_t s_u32[SMP_THREADS];
    __shared__ uint64_t s_hist[SMP_BINS];
    __shared__ uint32_t s_bucket;
    __shared__ uint64_t s_rem;
    __shared__ int32_t s_found;
    const pg_smp_row R = rows[blockIdx.x];
    float *x = logits + (size_t)R.row * (size_t)V;
    const int32_t t = (int32_t)threadIdx.x;

    /* 0: the grammar mask */
    if (R.mask_first >= 0) {
        const uint32_t *mk = mask + R.mask_first;
        for (int32_t v = t; v < V; v += SMP_THREADS)
            if (!((mk[v >> 5] >> (v & 31)) & 1u))
                x[v] = -INFINITY;
        __syncthreads();
    }
    /* the row as the sampler's logprobs read it (after the mask, before
     * step 1), for pgk_logprobs: each thread copies the ids it masked */
    if (raw_slot && raw_slot[blockIdx.x] >= 0) {
        float *o = raw + (size_t)raw_slot[blockIdx.x] * (size_t)V;
        for (int32_t v = t; v < V; v += SMP_THREADS)
            o[v] = x[v];
        __syncthreads();
    }
    /* 1: penalties, one distinct id per entry */
    for (int32_t e = t; e < R.n_pen; e += SMP_THREADS) {
        const int32_t id = pen_ids[R.pen_first + e];
        x[id] = pg_smp_penalize(x[id], R.rep, pen_cnt[R.pen_first + e], R.freq, R.pres);
    }
    __syncthreads();
    /* 2: banned ids */
    for (int32_t e = t; e < R.n_ban; e += SMP_THREADS)
        x[ban_ids[R.ban_first + e]] = -INFINITY;
    __syncthreads();

    /* 3: greedy: the argmax, ties -> the lowest id, only > -inf (NaN never) */
    if (R.temperature < PG_SMP_EPS) {
        float bv = -INFINITY;
        int32_t bi = -1;
        for (int32_t v = t; v < V; v += SMP_THREADS)
            if (x[v] > bv) { /* ascending v within the thread: strict keeps the lowest */
                bv = x[v];
                bi = v;
            }
        /* (key, V - id) as one 64-bit max: larger value, then lower id */
        uint64_t cand = bi >= 0 ? ((uint64_t)pg_smp_key(bv + 0.0f) << 32) | (uint32_t)(V - bi) : 0;
        s_u64[t] = cand;
        __syncthreads();
        for (int h = SMP_THREADS / 2; h > 0; h >>= 1) {
            if (t < h && s_u64[t + h] > s_u64[t])
                s_u64[t] = s_u64[t + h];
            __syncthreads();
        }
        if (t == 0)
            ids[blockIdx.x] = s_u64[0] ? V - (int32_t)(uint32_t)s_u64[0] : -1;
        return;
    }

    /* 4: temperature; the max (as a key) and the alive count */
    uint32_t kmax = 0;
    int32_t alive = 0;
    for (int32_t v = t; v < V; v += SMP_THREADS) {
        const float y = pg_smp_temper(x[v], R.temperature);
        x[v] = y;
        const uint32_t k = pg_smp_key(y);
        kmax = k > kmax ? k : kmax;
        alive += y > -INFINITY;
    }
    kmax = smp_max_u32(kmax, s_u32);
    alive = (int32_t)smp_sum<uint32_t>((uint32_t)alive, s_u32);
    if (alive == 0) {
        if (t == 0)
            ids[blockIdx.x] = -1;
        return;
    }
    const float m = smp_unkey(kmax);

    /* 5: min-p */
    if (R.min_p > 0.0f) {
        const float thr = m + R.min_p_log;
        int32_t a = 0;
        for (int32_t v = t; v < V; v += SMP_THREADS) {
            const float y = x[v] >= thr ? x[v] : -INFINITY;
            x[v] = y;
            a += y > -INFINITY;
        }
        alive = (int32_t)smp_sum<uint32_t>((uint32_t)a, s_u32);
    }

    /* 6: top-k: the k-th largest key by a radix select on the counts */
    if (R.top_k > 0 && R.top_k < alive) {
        uint32_t prefix = 0, pmask = 0;
        if (t == 0)
            s_rem = (uint64_t)R.top_k;
        for (int pass = 0; pass < 3; pass++) {
            const int sh = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
            const uint32_t nb = pass == 2 ? 1024u : 2048u;
            for (uint32_t b = (uint32_t)t; b < nb; b += SMP_THREADS)
                s_hist[b] = 0;
            __syncthreads();
            for (int32_t v = t; v < V; v += SMP_THREADS) {
                const uint32_t k = pg_smp_key(x[v]);
                if (x[v] > -INFINITY && (k & pmask) == prefix)
                    atomicAdd((unsigned long long *)&s_hist[(k >> sh) & (nb - 1)], 1ull);
            }
            __syncthreads();
            if (t == 0) /* s_rem drops the buckets above */
                s_bucket = smp_pick<uint64_t>(s_hist, nb, &s_rem);
            __syncthreads();
            prefix |= s_bucket << sh;
            pmask |= (nb - 1) << sh;
            __syncthreads();
        }
        const float kth = smp_unkey(prefix);
        for (int32_t v = t; v < V; v += SMP_THREADS)
            x[v] = x[v] >= kth ? x[v] : -INFINITY;
        __syncthreads();
    }

    /* 7: the weights' total */
    uint64_t part = 0;
    for (int32_t v = t; v < V; v += SMP_THREADS)
        part += pg_smp_weight(x[v] - m);
    uint64_t total = smp_sum<uint64_t>(part, s_u64);

    /* 8: top-p: the cut (key ck, id cid) by a radix select on the weights,
     * then the cut key's tokens in ascending id order */
    uint32_t ck = 0;
    int32_t cid = V;
    const bool top_p = R.top_p < 1.0f;
    if (top_p) {
        uint32_t prefix = 0, pmask = 0;
        if (t == 0)
            s_rem = pg_smp_need(R.top_p, total);
        for (int pass = 0; pass < 3; pass++) {
            const int sh = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
            const uint32_t nb = pass == 2 ? 1024u : 2048u;
            for (uint32_t b = (uint32_t)t; b < nb; b += SMP_THREADS)
                s_hist[b] = 0;
            __syncthreads();
            for (int32_t v = t; v < V; v += SMP_THREADS) {
                const uint32_t k = pg_smp_key(x[v]);
                if (x[v] > -INFINITY && (k & pmask) == prefix)
                    atomicAdd((unsigned long long *)&s_hist[(k >> sh) & (nb - 1)],
                              (unsigned long long)pg_smp_weight(x[v] - m));
            }
            __syncthreads();
            if (t == 0) /* s_rem drops the buckets above */
                s_bucket = smp_pick<uint64_t>(s_hist, nb, &s_rem);
            __syncthreads();
            prefix |= s_bucket << sh;
            pmask |= (nb - 1) << sh;
            __syncthreads();
        }
        ck = prefix;
        const uint64_t rem = s_rem;
        /* the ties at ck in id order: thread t's chunk [u0, u1) of the ids,
         * the chunks' sums scanned, the one chunk where the running sum
         * reaches rem walked (one scan, not one per tile of ids) */
        if (t == 0)
            s_found = -1;
        const int32_t U = (V + SMP_THREADS - 1) / SMP_THREADS;
        const int32_t u0 = t * U < V ? t * U : V, u1 = u0 + U < V ? u0 + U : V;
        uint64_t us = 0;
        for (int32_t v = u0; v < u1; v++)
            us += x[v] > -INFINITY && pg_smp_key(x[v]) == ck ? pg_smp_weight(x[v] - m) : 0;
        const uint64_t ub = smp_excl_scan(us, s_u64); /* its barriers order s_found's start */
        if (us > 0 && ub < rem && ub + us >= rem) { /* one thread: the running sum crosses rem once */
            uint64_t cum = ub;
            for (int32_t v = u0; v < u1; v++) {
                cum += x[v] > -INFINITY && pg_smp_key(x[v]) == ck ? pg_smp_weight(x[v] - m) : 0;
                if (cum >= rem) {
                    s_found = v;
                    break;
                }
            }
        }
        __syncthreads();
        cid = s_found >= 0 ? s_found : V; /* not reached: the candidates reach rem */
        __syncthreads();
    }

    /* 9: the draw; thread t's chunk [c0, c1) of the ids, the chunks' sums
     * scanned, the one chunk holding the target walked */
    const int32_t C = (V + SMP_THREADS - 1) / SMP_THREADS;
    const int32_t c0 = t * C < V ? t * C : V, c1 = c0 + C < V ? c0 + C : V;
    uint64_t cs = 0;
    for (int32_t v = c0; v < c1; v++) {
        const uint32_t k = pg_smp_key(x[v]);
        const bool keep = !top_p || k > ck || (k == ck && v <= cid);
        cs += keep ? pg_smp_weight(x[v] - m) : 0;
    }
    if (top_p)
        total = smp_sum<uint64_t>(cs, s_u64);
    const uint64_t target = pg_smp_target(pg_smp_draw(R.key, R.counter), total);
    const uint64_t before = smp_excl_scan(cs, s_u64);
    if (cs > 0 && before <= target && target < before + cs) {
        uint64_t cum = before;
        for (int32_t v = c0; v < c1; v++) {
            const uint32_t k = pg_smp_key(x[v]);
            const bool keep = !top_p || k > ck || (k == ck && v <= cid);
            cum += keep ? pg_smp_weight(x[v] - m) : 0;
            if (cum > target) {
                ids[blockIdx.x] = v;
                break;
            }
        }
    }
}

extern "C" int pgk_sample(int32_t *ids, float *logits, int32_t V, const pg_smp_row *rows, int32_t n,
                          const int32_t *pen_ids, const int32_t *pen_cnt, const int32_t *ban_ids,
                          const uint32_t *mask, float *raw, const int32_t *raw_slot, pgk_launch *lk)
{
    if (n < 1 || V < 1 || V > PG_SMP_MAX_VOCAB)
        return pg_error_set(lk->err, PG_EINVAL, "sample: expected n >= 1 and V in [1, %d], got %d, %d",
                            (int)PG_SMP_MAX_VOCAB, (int)n, (int)V);
    sample_kernel<<<(unsigned)n, SMP_THREADS, 0, lk->st>>>(ids, logits, V, rows, pen_ids, pen_cnt, ban_ids,
                                                       mask, raw, raw_slot);
    return pgk_check_launch("sample_kernel", lk);
}
