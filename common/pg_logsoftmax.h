/* pg_logsoftmax: the log-softmax of one f32 logits row — ONE definition
 * that the host (core/sampler.c's logprobs, core/engine.c's prompt
 * logprobs) and the device (gpu/logprobs.cu) compute bit for bit alike, so
 * a row's logprobs do not depend on where they were taken.
 *
 *   m      = max_v (double)raw[v] + 0.0   (NaN never wins; + 0.0: -0 -> +0)
 *   t_v    = pg_lsm_exp((double)raw[v] - m)          (double; -inf -> 0)
 *   lane j = sum of t_v over v = j, j + 256, j + 512, ... in ascending v,
 *            from 0.0                                  (PG_LSM_LANES lanes)
 *   sum    = the lanes folded by a fixed tree: for s = 128, 64, ..., 1:
 *            lane[j] = lane[j] + lane[j + s] for j < s; sum = lane[0]
 *   lse    = m + pg_lsm_log(sum)
 *   logprob(v) = (float)((double)raw[v] - lse)
 *
 * and the top k of a row: descending by raw value, ties to the lower id,
 * NaN after everything (pg_lsm_better: a total order, so the top k is
 * unique, whatever order the candidates are merged in).
 *
 * Every floating-point operation here is one IEEE-754 double operation
 * (add, sub, mul, div) or an explicit fma, so the C compiler and nvcc give
 * the same bits: no libm (exp and log are our own, below; fma is exact by
 * definition), and no expression a compiler could contract into an fma
 * (every multiply-add is written as fma; the C build is ISO C11, where GCC
 * contracts nothing, and nvcc never fuses an explicit fma further).
 * Accuracy: pg_lsm_exp and pg_lsm_log are within a few ulp of exp and log
 * in double, so lse is good to ~1e-15 relative (the float logprobs are
 * correctly rounded in practice); what matters is that both sides run the
 * same operations.
 *
 * The per-element functions are static inline here, __host__ __device__
 * under nvcc; the host's whole-row loops are in pg_logsoftmax.c. */
#ifndef PG_LOGSOFTMAX_H
#define PG_LOGSOFTMAX_H

#include <stdbool.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define PG_LSM_FN static __host__ __device__ __forceinline__
#else
#define PG_LSM_FN static inline
#endif

#if defined(__CUDA_ARCH__)
#define PG_LSM_FMA(a, b, c) __fma_rn((a), (b), (c))
#else
#define PG_LSM_FMA(a, b, c) __builtin_fma((a), (b), (c))
#endif

/* Partial sums of the exp terms: lane j takes v = j, j + PG_LSM_LANES, ...
 * (the device's block size: one lane per thread); a power of two. */
#define PG_LSM_LANES 256
/* Most top entries a row can ask for (SAMPLING_PARAMS_MAX_LOGPROBS). */
#define PG_LSM_MAX_TOP 20

/* pg_lsm_row.token: the token sampled from the row where the row is
 * (executor.h sample_rows draws it; the logprobs are of the row as the
 * sampler received it, before its penalties and temperature: vLLM's
 * default "raw_logprobs"). */
#define PG_LSM_SAMPLED (-2)

/* The log-softmax results of one logits row, as a backend that keeps the
 * row returns them instead of the row (executor.h logprob_rows; the
 * device's gpu/logprobs.cu). Plain data. */
typedef struct pg_lsm_row {
    int32_t want;      /* in: 1 = take this row's results (the row itself is
                          then not returned); 0 = the row as always */
    int32_t token;     /* in: the token to score, in [0, V); -1: the row's
                          argmax (core/sampler.c's greedy rule: ties -> the
                          lowest id, NaN and -inf never win); PG_LSM_SAMPLED:
                          the token the backend samples from this row (a row
                          also handed to executor.h sample_rows).
                          out: the token (-1: no logit > -inf, or none
                          sampled) */
    int32_t k;         /* in: top entries wanted, 0 .. PG_LSM_MAX_TOP */
    int32_t n_top;     /* out: min(k, V) */
    double lse;        /* out: m + log(sum) of the row */
    float logprob;     /* out: pg_lsm_logprob(raw[token], lse); 0 for token -1 */
    int32_t rank;      /* out: 1 + #{v: raw[v] > raw[token]} */
    int32_t top_ids[PG_LSM_MAX_TOP]; /* out: [n_top] in pg_lsm_better's order, then -1 */
    float top_lp[PG_LSM_MAX_TOP];    /* out: [n_top] their logprobs, then 0 */
} pg_lsm_row;

PG_LSM_FN uint64_t pg_lsm_bits(double x)
{
#if defined(__CUDA_ARCH__)
    return (uint64_t)__double_as_longlong(x);
#else
    uint64_t u;
    __builtin_memcpy(&u, &x, sizeof u);
    return u;
#endif
}

PG_LSM_FN double pg_lsm_from_bits(uint64_t u)
{
#if defined(__CUDA_ARCH__)
    return __longlong_as_double((long long)u);
#else
    double x;
    __builtin_memcpy(&x, &u, sizeof x);
    return x;
#endif
}

/* e^x for x <= 0 (the only arguments a log-softmax has: raw - max); x < -700
 * (and -inf) gives 0 (e^-700 ~ 1e-304 is nothing beside a sum >= 1), NaN
 * stays NaN. x = k ln2 + r with k = round(x / ln2) (|r| <= ln2 / 2, ln2 in
 * two parts as in fdlibm), e^r by its Taylor polynomial to r^13 (truncation
 * < 2e-16 relative), times 2^k by adding k to the exponent field (the
 * result stays normal: k >= -1010). */
PG_LSM_FN double pg_lsm_exp(double x)
{
    /* selects, no branch (the host's lane loop vectorizes): an x outside
     * [-700, 0] is computed as -700 and replaced at the end */
    const double xc = x >= -700.0 ? x : -700.0;
    const double magic = 6755399441055744.0; /* 1.5 * 2^52: t's low bits hold round(x / ln2) */
    const double t = PG_LSM_FMA(xc, 1.4426950408889634, magic);
    const double k = t - magic;
    double r = PG_LSM_FMA(-k, 6.93147180369123816490e-01, xc);
    r = PG_LSM_FMA(-k, 1.90821492927058770002e-10, r);
    double p = 1.6059043836821613e-10; /* 1/13! .. 1/0! */
    p = PG_LSM_FMA(p, r, 2.08767569878681e-09);
    p = PG_LSM_FMA(p, r, 2.505210838544172e-08);
    p = PG_LSM_FMA(p, r, 2.755731922398589e-07);
    p = PG_LSM_FMA(p, r, 2.7557319223985893e-06);
    p = PG_LSM_FMA(p, r, 2.48015873015873e-05);
    p = PG_LSM_FMA(p, r, 0.0001984126984126984);
    p = PG_LSM_FMA(p, r, 0.001388888888888889);
    p = PG_LSM_FMA(p, r, 0.008333333333333333);
    p = PG_LSM_FMA(p, r, 0.041666666666666664);
    p = PG_LSM_FMA(p, r, 0.16666666666666666);
    p = PG_LSM_FMA(p, r, 0.5);
    p = PG_LSM_FMA(p, r, 1.0);
    p = PG_LSM_FMA(p, r, 1.0);
    /* p in [0.7, 1.42]; k = bits(t) - bits(magic) in [-1010, 0]: p * 2^k
     * by adding k to the exponent field (unsigned wrap-around adds a
     * negative k; the result stays normal) */
    const uint64_t kb = (pg_lsm_bits(t) - pg_lsm_bits(magic)) << 52;
    const double e = pg_lsm_from_bits(pg_lsm_bits(p) + kb);
    return x >= -700.0 ? e : (x != x ? x : 0.0);
}

/* log(x) for x in [1, 2^1000] (a sum of exp terms, the largest 1); NaN
 * stays NaN. x = 2^e f with f in [sqrt(1/2), sqrt(2)); log f = 2 atanh(s),
 * s = (f - 1) / (f + 1), |s| <= 0.172, by its series to s^21 (truncation
 * < 1e-17 relative); log x = e ln2_hi + (e ln2_lo + log f). */
PG_LSM_FN double pg_lsm_log(double x)
{
    if (!(x >= 1.0))
        return x != x ? x : pg_lsm_from_bits(0x7ff8000000000000ull); /* outside: NaN */
    if (x > 1.0e300)
        return x;
    uint64_t b = pg_lsm_bits(x);
    int e = (int)(b >> 52) - 1023;
    double f = pg_lsm_from_bits((b & 0x000fffffffffffffull) | 0x3ff0000000000000ull); /* [1, 2) */
    if (f > 1.4142135623730951) {
        f = f * 0.5;
        e++;
    }
    double s = (f - 1.0) / (f + 1.0);
    double z = s * s;
    double p = 0.09523809523809523; /* 2/21 .. 2/3 */
    p = PG_LSM_FMA(p, z, 0.10526315789473684);
    p = PG_LSM_FMA(p, z, 0.11764705882352941);
    p = PG_LSM_FMA(p, z, 0.13333333333333333);
    p = PG_LSM_FMA(p, z, 0.15384615384615385);
    p = PG_LSM_FMA(p, z, 0.18181818181818182);
    p = PG_LSM_FMA(p, z, 0.2222222222222222);
    p = PG_LSM_FMA(p, z, 0.2857142857142857);
    p = PG_LSM_FMA(p, z, 0.4);
    p = PG_LSM_FMA(p, z, 0.6666666666666666);
    double sz = s * z;
    double lf = PG_LSM_FMA(sz, p, 2.0 * s); /* 2s + 2s^3/3 + ... */
    double de = (double)e;
    return PG_LSM_FMA(de, 6.93147180369123816490e-01, PG_LSM_FMA(de, 1.90821492927058770002e-10, lf));
}

/* (a, ia) comes before (b, ib) in a top-k: larger, or equal (+0 == -0)
 * with a lower id; NaN after every number, NaNs by id. A total order. */
PG_LSM_FN bool pg_lsm_better(float a, int32_t ia, float b, int32_t ib)
{
    bool an = a != a, bn = b != b;
    if (an || bn)
        return an == bn ? ia < ib : bn;
    return a > b || (a == b && ia < ib);
}

/* The logprob of a raw logit under lse. */
PG_LSM_FN float pg_lsm_logprob(float raw, double lse)
{
    return (float)((double)raw - lse);
}

/* ---- the host's whole-row functions (pg_logsoftmax.c; the device splits
 *      the same work over a block: gpu/logprobs.cu) ------------------- */

#ifdef __cplusplus
extern "C" {
#endif

/* lse of raw[V] by the definition above (V >= 1). */
double pg_lsm_lse(const float *raw, int32_t V);

/* The top k (<= V) of raw[V] in pg_lsm_better's order: ids[k], values
 * raw[ids[j]] in vals[k] (the caller turns them into logprobs). */
void pg_lsm_topk(const float *raw, int32_t V, int32_t k, int32_t *ids, float *vals);

/* r's outputs from raw[V] (r->token, r->k as asked; r->want untouched):
 * the reference the device's gpu/logprobs.cu is compared with. */
void pg_lsm_row_eval(pg_lsm_row *r, const float *raw, int32_t V);

#ifdef __cplusplus
}
#endif

#endif /* PG_LOGSOFTMAX_H */
