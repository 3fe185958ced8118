/* pg_sample: sampling one token from one f32 logits row — ONE definition
 * that the host (core/sampler.c, the CPU path's sampler and the CUDA path's
 * for rows it reads back) and the device (gpu/sampling.cu) compute bit for
 * bit alike, so a sampled request's bytes do not depend on where its rows
 * were sampled. vLLM v1's semantics (vllm/v1/sample/sampler.py,
 * ops/penalties.py, ops/topk_topp_sampler.py; core/sampler.c says where
 * ours differ) in this canonical order of operations:
 *
 *   0. grammar mask (the engine's, before everything): tokens outside the
 *      structured-output mask -> -inf (eos / stop ids put back where the
 *      text may end: core/engine.c sample_seq).
 *   1. penalties, per distinct id of prompt ∪ output (pg_smp_penalize):
 *      repetition r over the set (x > 0 ? x / r : x * r), then, for an id
 *      the output holds c > 0 times, x = x - f * c (the product rounded
 *      first: two float operations) and x = x - p (presence).
 *   2. banned ids (min_tokens: eos + stop ids) -> -inf.
 *   3. temperature < PG_SMP_EPS (vLLM's _SAMPLING_EPS): the argmax, ties
 *      -> the lowest id, NaN never wins, no draw. Otherwise:
 *   4. x = pg_smp_temper(x, t): x / t (IEEE float division, as vLLM's
 *      logits.div_(temp)); NaN -> -inf; > FLT_MAX -> FLT_MAX; -0 -> +0.
 *      m = max x. Alive: x > -inf (none: no token).
 *   5. min-p (vLLM v1 runs it before top-k/top-p): x < m + lmp -> -inf,
 *      lmp = pg_smp_min_p_log(min_p) (float), the float add rounded.
 *   6. top-k (0 < k < #alive): x < the k-th largest alive x -> -inf
 *      (boundary ties kept, as vLLM's `logits < kth_value` mask).
 *   7. weights w_v = pg_smp_weight(x_v - m) (uint64 fixed point, 2^42 for
 *      the maximum; 0 for x = -inf or x - m below ~ -29.8); total = sum w_v.
 *      Integer sums are exact, so every later sum is the same in any order
 *      (the device sums with a block, the host with vector lanes).
 *   8. top-p (top_p < 1): order the alive tokens by (x descending, id
 *      ascending); keep the shortest non-empty prefix whose weights sum to
 *      >= need = pg_smp_need(top_p, total) (>= 1); every other w_v
 *      -> 0 and total = the prefix's sum. (vLLM sorts ascending and masks
 *      `cumsum <= 1 - p`: the same set up to tie order and rounding.)
 *   9. one draw z = pg_smp_draw(key, counter) (the request's stream:
 *      core/sampler.h sampler_rng), target = pg_smp_target(z, total) in
 *      [0, total); the token is the lowest id v with
 *      w_0 + ... + w_v > target (an inverse CDF in ascending id order).
 *
 * Logprobs (vLLM's default raw_logprobs) are of the raw row, before 0-9:
 * common/pg_logsoftmax.h's definition, unchanged.
 *
 * Every float operation here is one IEEE-754 operation or an explicit fma
 * (no libm: pg_smp_expf is our own; the C build is ISO C11, where GCC
 * contracts nothing; under nvcc the products are __fmul_rn and the
 * quotients __fdiv_rn so nothing fuses); everything after step 7 is
 * integer arithmetic. The per-element functions are static inline here,
 * __host__ __device__ under nvcc; the host's whole-row loops are in
 * core/sampler.c, the device's in gpu/sampling.cu. */
#ifndef PG_SAMPLE_H
#define PG_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "pg_logsoftmax.h"

#if defined(__CUDACC__)
#define PG_SMP_FN static __host__ __device__ __forceinline__
#else
#define PG_SMP_FN static inline
#endif

#if defined(__CUDA_ARCH__)
#define PG_SMP_FMAF(a, b, c) __fmaf_rn((a), (b), (c))
#define PG_SMP_MULF(a, b) __fmul_rn((a), (b))
#define PG_SMP_DIVF(a, b) __fdiv_rn((a), (b))
#else
#define PG_SMP_FMAF(a, b, c) __builtin_fmaf((a), (b), (c))
#define PG_SMP_MULF(a, b) ((a) * (b))
#define PG_SMP_DIVF(a, b) ((a) / (b))
#endif

#define PG_SMP_EPS 1e-5f              /* vLLM's _SAMPLING_EPS */
#define PG_SMP_FLT_MAX 3.40282347e+38f
/* The fixed-point unit of the weights: w = round(e * 2^42), e <= 1, so a
 * row of V < 2^22 tokens sums below 2^64. */
#define PG_SMP_WEIGHT_ONE 4398046511104.0 /* 2^42 */
#define PG_SMP_MAX_VOCAB (1 << 22)

PG_SMP_FN uint32_t pg_smp_fbits(float x)
{
#if defined(__CUDA_ARCH__)
    return (uint32_t)__float_as_uint(x);
#else
    uint32_t u;
    __builtin_memcpy(&u, &x, sizeof u);
    return u;
#endif
}

PG_SMP_FN float pg_smp_ffrom(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float x;
    __builtin_memcpy(&x, &u, sizeof x);
    return x;
#endif
}

/* ---- the random stream ------------------------------------------------ */

/* splitmix64's finalizer (Steele, Lea, Flood 2014): a bijection on 64 bits. */
PG_SMP_FN uint64_t pg_smp_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Draw number counter of the stream with key key: a pure function of both,
 * so a replayed sequence (preemption) replays its draws. */
PG_SMP_FN uint64_t pg_smp_draw(uint64_t key, uint64_t counter)
{
    return pg_smp_mix64(key ^ pg_smp_mix64(counter + 0x3c6ef372fe94f82bULL));
}

/* floor(z * total / 2^64): uniform in [0, total) */
PG_SMP_FN uint64_t pg_smp_target(uint64_t z, uint64_t total)
{
#if defined(__CUDA_ARCH__)
    return __umul64hi(z, total);
#else
    __extension__ typedef unsigned __int128 pg_smp_u128;
    return (uint64_t)(((pg_smp_u128)z * total) >> 64);
#endif
}

/* ---- per element ------------------------------------------------------ */

/* Step 1 on one logit: rep the repetition penalty (applied: the id is in
 * prompt ∪ output), c the id's count in the output, f / p the frequency
 * and presence penalties. */
PG_SMP_FN float pg_smp_penalize(float x, float rep, int32_t c, float f, float p)
{
    if (rep != 1.0f)
        x = x > 0.0f ? PG_SMP_DIVF(x, rep) : PG_SMP_MULF(x, rep);
    if (c > 0 && (f != 0.0f || p != 0.0f)) {
        x = x - PG_SMP_MULF(f, (float)c);
        x = x - p;
    }
    return x;
}

/* Step 4: x / t; NaN -> -inf, +inf (the only float above FLT_MAX) ->
 * FLT_MAX, -0 -> +0 (so step 8's order needs no special case). On the
 * bits, with integer selects (GCC keeps float selects after a compare that
 * may trap as branches and vectorizes nothing). */
PG_SMP_FN float pg_smp_temper(float x, float t)
{
    const uint32_t u = pg_smp_fbits(PG_SMP_DIVF(x, t));
    uint32_t r = (u & 0x7fffffffu) > 0x7f800000u ? 0xff800000u : u; /* NaN -> -inf */
    r = r == 0x7f800000u ? 0x7f7fffffu : r;                          /* +inf -> FLT_MAX */
    r = r == 0x80000000u ? 0u : r;                                   /* -0 -> +0 */
    return pg_smp_ffrom(r);
}

/* The key of -inf: every alive (> -inf, not NaN) x has a larger one. */
#define PG_SMP_KEY_NEG_INF 0x007fffffu

/* Step 5's lmp: log(min_p) for min_p in (0, 1], rounded to float (in
 * double by pg_logsoftmax.h's log: -log(1 / min_p)). */
PG_SMP_FN float pg_smp_min_p_log(float min_p)
{
    return (float)-pg_lsm_log(1.0 / (double)min_p);
}

/* e^x in float for x <= 0 (x = logit - max); x < -80 (and -inf, NaN) -> 0
 * (e^-80 ~ 2e-35 weighs 0 anyway). x = k ln2 + r with k = round(x / ln2)
 * (|r| <= ln2 / 2; ln2 in two parts, the high one with 12 significant bits
 * so k * ln2_hi is exact), e^r by its Taylor polynomial to r^7 (truncation
 * < 6e-9 relative: a few ulp in all), times 2^k by adding k to the
 * exponent field (k >= -116: the result stays normal). Branch-free: the
 * host's loops vectorize it. */
PG_SMP_FN float pg_smp_expf(float x)
{
    const float xc = x >= -80.0f ? x : -80.0f;
    const float magic = 12582912.0f; /* 1.5 * 2^23: t's low bits hold round(x / ln2) */
    const float t = PG_SMP_FMAF(xc, 1.44269502f, magic);
    const float k = t - magic;
    float r = PG_SMP_FMAF(-k, 0.693359375f, xc);
    r = PG_SMP_FMAF(-k, -2.12194440e-4f, r);
    float p = 1.98412698e-4f; /* 1/7! .. 1/0! */
    p = PG_SMP_FMAF(p, r, 1.38888889e-3f);
    p = PG_SMP_FMAF(p, r, 8.33333333e-3f);
    p = PG_SMP_FMAF(p, r, 4.16666667e-2f);
    p = PG_SMP_FMAF(p, r, 1.66666667e-1f);
    p = PG_SMP_FMAF(p, r, 0.5f);
    p = PG_SMP_FMAF(p, r, 1.0f);
    p = PG_SMP_FMAF(p, r, 1.0f);
    /* k = bits(t) - bits(magic) in [-116, 0]: p * 2^k by the exponent field */
    const uint32_t kb = (pg_smp_fbits(t) - pg_smp_fbits(magic)) << 23;
    /* 0 outside [-80, 0] by a bit mask, not a select: GCC keeps a select
     * of a computed float as a branch (-ftrapping-math) and vectorizes
     * nothing */
    const uint32_t keep = 0u - (uint32_t)(x >= -80.0f);
    return pg_smp_ffrom((pg_smp_fbits(p) + kb) & keep);
}

/* Step 7: the weight of a token d = x - m below the maximum:
 * round-to-nearest-even(pg_smp_expf(d) * 2^42) as an integer, by adding
 * 2^52 in double (exact: e * 2^42 <= 2^42 < 2^52). */
PG_SMP_FN uint64_t pg_smp_weight(float d)
{
    const double y = (double)pg_smp_expf(d) * PG_SMP_WEIGHT_ONE + 4503599627370496.0;
    return pg_lsm_bits(y) - 0x4330000000000000ull; /* bits(2^52) */
}

/* Step 8's need: (uint64)(top_p * (double)total), truncated, at least 1
 * (<= total for top_p < 1). */
PG_SMP_FN uint64_t pg_smp_need(float top_p, uint64_t total)
{
#if defined(__CUDA_ARCH__)
    uint64_t n = __double2ull_rz(__dmul_rn((double)top_p, __ull2double_rn(total)));
#else
    uint64_t n = (uint64_t)((double)top_p * (double)total);
#endif
    return n > 0 ? n : 1;
}

/* Step 8's order as one unsigned key: larger x -> larger key (a float's
 * bits made monotone; x is never NaN or -0 there). */
PG_SMP_FN uint32_t pg_smp_key(float x)
{
    uint32_t u = pg_smp_fbits(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* ---- one row's parameters, as the device takes them ------------------- */

/* What steps 1-9 need of a sampled row besides its logits (plain data;
 * built on the host by sampler_row_params, core/sampler.h). */
typedef struct pg_smp_row {
    int32_t row;         /* its logits row */
    int32_t top_k;       /* step 6; 0 = off */
    float temperature;   /* < PG_SMP_EPS: greedy (steps 1-3 only) */
    float top_p;         /* step 8; 1 = off */
    float min_p;         /* step 5; 0 = off */
    float min_p_log;     /* pg_smp_min_p_log(min_p) when min_p > 0 */
    float rep, freq, pres; /* step 1 */
    int32_t pen_first;   /* step 1: its distinct ids pen_ids[pen_first ..
                            pen_first + n_pen) with their output counts */
    int32_t n_pen;
    int32_t ban_first;   /* step 2: ban_ids[ban_first .. + n_ban) */
    int32_t n_ban;
    int32_t mask_first;  /* step 0: mask words [mask_first .. + ceil(V/32)),
                            bit v set = allowed; -1 = no mask */
    uint64_t key;        /* step 9: the stream's key and draw number */
    uint64_t counter;
} pg_smp_row;

/* One step's sampled rows handed to a backend that samples them where the
 * logits are (executor.h sample_rows; gpu/sampling.cu): the rows and the
 * arrays they index, all host memory borrowed until that step's logits
 * return; ids written then. Plain data. */
typedef struct pg_smp_batch {
    int32_t L;                  /* the step's logits rows */
    int32_t n;                  /* rows[n]: .row distinct, ascending, in [0, L) */
    const pg_smp_row *rows;
    const int32_t *pen_ids;     /* [n_pen] step 1's distinct ids */
    const int32_t *pen_cnt;     /* [n_pen] their output counts */
    int32_t n_pen;
    const int32_t *ban_ids;     /* [n_ban] */
    int32_t n_ban;
    const uint32_t *mask;       /* [n_mask] grammar mask words (bit v: token v allowed) */
    int32_t n_mask;
    int32_t *ids;               /* [n] out: the tokens; -1: none could be sampled */
} pg_smp_batch;

#endif /* PG_SAMPLE_H */
