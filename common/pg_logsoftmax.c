/* pg_logsoftmax: the host's whole-row loops of the shared log-softmax
 * definition (pg_logsoftmax.h). On x86-64 the lane loop is built twice,
 * for the baseline and for AVX2 + FMA (chosen once per call by
 * __builtin_cpu_supports): both run the same IEEE operations — an fma is
 * exact whether the hardware or libm computes it, and the 256 lanes are
 * independent, so vectorizing them reorders nothing — so they give the
 * same bits; the FMA build is ~6x faster (no libm call per fma). */
#include "pg_logsoftmax.h"

/* Adds pg_lsm_exp(raw[v] - m) into lane[v % LANES] for v < V. */
#define PG_LSM_LANE_LOOP                                                           \
    {                                                                              \
        int32_t v0 = 0;                                                            \
        for (; v0 + PG_LSM_LANES <= V; v0 += PG_LSM_LANES)                         \
            for (int32_t j = 0; j < PG_LSM_LANES; j++)                             \
                lane[j] = lane[j] + pg_lsm_exp((double)raw[v0 + j] - m);          \
        for (int32_t j = 0; v0 + j < V; j++)                                       \
            lane[j] = lane[j] + pg_lsm_exp((double)raw[v0 + j] - m);              \
    }

static void pg_lsm_lanes_base(double *lane, const float *raw, int32_t V, double m)
PG_LSM_LANE_LOOP

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) static void pg_lsm_lanes_fma(double *lane, const float *raw,
                                                                 int32_t V, double m)
PG_LSM_LANE_LOOP
#endif

double pg_lsm_lse(const float *raw, int32_t V)
{
    double m = pg_lsm_from_bits(0xfff0000000000000ull); /* -inf */
    for (int32_t v = 0; v < V; v++)
        if ((double)raw[v] > m)
            m = (double)raw[v];
    m = m + 0.0;
    double lane[PG_LSM_LANES];
    for (int32_t j = 0; j < PG_LSM_LANES; j++)
        lane[j] = 0.0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        pg_lsm_lanes_fma(lane, raw, V, m);
    else
#endif
        pg_lsm_lanes_base(lane, raw, V, m);
    for (int32_t s = PG_LSM_LANES / 2; s > 0; s >>= 1)
        for (int32_t j = 0; j < s; j++)
            lane[j] = lane[j] + lane[j + s];
    return m + pg_lsm_log(lane[0]);
}

void pg_lsm_topk(const float *raw, int32_t V, int32_t k, int32_t *ids, float *vals)
{
    /* insertion into a sorted list of at most k */
    int32_t have = 0;
    for (int32_t v = 0; v < V && k > 0; v++) {
        float x = raw[v];
        if (have == k && !pg_lsm_better(x, v, vals[k - 1], ids[k - 1]))
            continue;
        int32_t pos = have < k ? have : k - 1;
        while (pos > 0 && pg_lsm_better(x, v, vals[pos - 1], ids[pos - 1])) {
            vals[pos] = vals[pos - 1];
            ids[pos] = ids[pos - 1];
            pos--;
        }
        vals[pos] = x;
        ids[pos] = v;
        if (have < k)
            have++;
    }
}

void pg_lsm_row_eval(pg_lsm_row *r, const float *raw, int32_t V)
{
    int32_t k = r->k < V ? r->k : V;
    float vals[PG_LSM_MAX_TOP];
    int32_t ids[PG_LSM_MAX_TOP];
    pg_lsm_topk(raw, V, k > 0 ? k : 1, ids, vals);
    r->lse = pg_lsm_lse(raw, V);
    if (r->token < 0) /* the argmax: the first in the order, when > -inf */
        r->token = vals[0] > -__builtin_inff() ? ids[0] : -1;
    r->logprob = r->token >= 0 ? pg_lsm_logprob(raw[r->token], r->lse) : 0.0f;
    int32_t rank = 1;
    for (int32_t v = 0; r->token >= 0 && v < V; v++)
        rank += raw[v] > raw[r->token];
    r->rank = rank;
    r->n_top = k;
    for (int32_t j = 0; j < PG_LSM_MAX_TOP; j++) {
        r->top_ids[j] = j < k ? ids[j] : -1;
        r->top_lp[j] = j < k ? pg_lsm_logprob(vals[j], r->lse) : 0.0f;
    }
}
