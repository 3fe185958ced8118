/* sampler: logits -> next token, vLLM v1 semantics (vllm/v1/sample/sampler.py,
 * ops/penalties.py, ops/topk_topp_sampler.py), deterministic per sequence,
 * by the definition of common/pg_sample.h (steps 1-9 there), which the
 * device computes bit for bit alike (gpu/sampling.cu).
 *
 * Where the definition departs from vLLM's tensors (and from this file
 * before issue 30):
 *   - min-p is tested in logit space: p_i >= min_p * p_max <=>
 *     x_i >= max + log(min_p) (no exp per token);
 *   - top-k keeps every logit >= the k-th largest (ties at the boundary
 *     all kept, as vLLM's `logits < kth_value` mask);
 *   - top-p keeps the shortest prefix of the survivors in (logit desc, id
 *     asc) order whose weights reach top_p of their total: vLLM's set up to
 *     tie order and rounding;
 *   - the softmax weights are pg_smp_expf(x - max) (our own float exp, not
 *     libm's expf) rounded to integers of 2^-42 (tokens more than ~29.8
 *     below the maximum after temperature weigh 0), summed exactly; the
 *     draw is a 64-bit integer in [0, total), the inverse CDF walks the
 *     ids in ascending order. Before issue 30 the weights were libm expf in
 *     float summed in double: a sampled (not a greedy) request's bytes
 *     changed with the definition (bench/RESULTS.md).
 *
 * Non-finite logits: NaN never wins the argmax and is -inf when sampling;
 * +inf is clamped to FLT_MAX when sampling. Logprobs are log_softmax of the
 * raw logits as given (before penalties, banning and temperature), by
 * common/pg_logsoftmax.h: exp terms in double summed in a fixed order, the
 * same bits as the device's (gpu/logprobs.cu); top k ties to the lower id,
 * NaN last.
 *
 * Speed (V = 151,936): no sort of the vocabulary (top-k: a k-heap or a
 * quickselect; top-p: a candidate bound and a radix select, sampler_top_p_cut),
 * the two whole-row loops vectorized (sampler_temper, sampler_weights), the
 * draw found through per-chunk sums; all scratch in the workspace. */
#include "sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pg_error.h"
#include "pg_logsoftmax.h"
#include "pg_sample.h"

#define SAMPLER_SAMPLING_EPS PG_SMP_EPS
/* top-k up to this uses a k-heap (one comparison per token, a sift for
 * the few that enter), above it a quickselect (O(V), a copy plus several
 * passes) */
#define SAMPLER_HEAP_MAX_K 1024
/* the draw's chunk sums (step 9) cover this many ids each */
#define SAMPLER_CHUNK 1024
/* top-p candidates up to this many are sorted, more go through the radix
 * select first */
#define SAMPLER_SORT_MAX 512

/* ---- RNG ------------------------------------------------------------- */

sampler_rng sampler_rng_init(uint64_t seed, int32_t seq_index)
{
    sampler_rng r;
    uint64_t s = pg_smp_mix64(seed + 0x9e3779b97f4a7c15ULL);
    uint64_t i = pg_smp_mix64((uint64_t)(uint32_t)seq_index + 0x6a09e667f3bcc909ULL);
    r.key = pg_smp_mix64(s ^ (i * 0xd1b54a32d192ed03ULL));
    r.counter = 0;
    return r;
}

/* Draw k of key K is pg_smp_draw(K, k) = mix64(K ^ mix64(k + c)): a pure
 * function of (key, k), so replaying a sequence (preemption) replays its
 * draws; keys are XORed with a mixed counter rather than added, so two
 * streams are not shifted copies of each other. 53 random bits -> [0, 1). */
double sampler_rng_uniform(sampler_rng *rng)
{
    uint64_t z = pg_smp_draw(rng->key, rng->counter);
    rng->counter++;
    return (double)(z >> 11) * 0x1.0p-53;
}

/* ---- workspace ------------------------------------------------------- */

typedef struct sampler_cand {
    uint32_t key; /* pg_smp_key of the tempered logit */
    int32_t id;
} sampler_cand;

struct sampler_workspace {
    int32_t vocab;
    bool fma;             /* the AVX2 + FMA build of the row loops runs here */
    float *raw;           /* [vocab] copy of the raw logits (logprobs) */
    float *sel;           /* [vocab] scratch for top-k */
    uint64_t *w;          /* [vocab] step 7's weights */
    uint64_t *csum;       /* [vocab / SAMPLER_CHUNK + 1] their chunk sums */
    uint64_t hist[4 * 2048]; /* top-p's radix select (four interleaved histograms) */
    sampler_cand *cand;   /* [vocab] top-p candidates */
    int32_t *counts;      /* [vocab] output-token counts; all 0 between calls */
    uint8_t *seen;        /* [vocab] prompt|output membership; all 0 between calls */
    pg_error err;         /* the last failure's message */
};

sampler_workspace *sampler_workspace_create(int32_t vocab_size)
{
    if (vocab_size < 1 || vocab_size > PG_SMP_MAX_VOCAB)
        return NULL;
    sampler_workspace *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    size_t n = (size_t)vocab_size;
    w->vocab = vocab_size;
#if defined(__x86_64__) && defined(__GNUC__)
    w->fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    w->raw = malloc(n * sizeof *w->raw);
    w->sel = malloc(n * sizeof *w->sel);
    w->w = malloc(n * sizeof *w->w);
    w->csum = malloc((n / SAMPLER_CHUNK + 1) * sizeof *w->csum);
    w->cand = malloc(n * sizeof *w->cand);
    w->counts = calloc(n, sizeof *w->counts);
    w->seen = calloc(n, sizeof *w->seen);
    if (!w->raw || !w->sel || !w->w || !w->csum || !w->cand || !w->counts || !w->seen) {
        sampler_workspace_destroy(w);
        return NULL;
    }
    return w;
}

void sampler_workspace_destroy(sampler_workspace *w)
{
    if (!w)
        return;
    free(w->seen);
    free(w->counts);
    free(w->cand);
    free(w->csum);
    free(w->w);
    free(w->sel);
    free(w->raw);
    free(w);
}

const char *sampler_workspace_error(const sampler_workspace *w)
{
    return w ? w->err.msg : "sampler: no workspace";
}

/* ---- helpers --------------------------------------------------------- */

static int sampler_check_ids(sampler_workspace *w, const char *what, const int32_t *ids, int32_t n,
                             int32_t vocab)
{
    if (n < 0 || (n > 0 && !ids))
        return pg_error_set(&w->err, PG_EINVAL, "sampler: %s: expected %d ids, got %s", what, (int)n,
                            n < 0 ? "a negative count" : "NULL");
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return pg_error_set(&w->err, PG_EINVAL, "sampler: %s[%d]: expected an id in [0, %d), got %d",
                                what, (int)i, (int)vocab, (int)ids[i]);
    return PG_OK;
}

/* Step 1's walk, shared by the host's apply and the device's row
 * description: each distinct id of prompt ∪ output once, in first-seen
 * order (prompt, then output), with its count in the output; an id never
 * in the output is skipped unless repetition applies. Leaves w->seen and
 * w->counts all zero again. */
typedef void (*sampler_pen_visit)(void *ctx, int32_t id, int32_t count);

static void sampler_walk_penalty_ids(sampler_workspace *w, const sampler_seq_view *seq, bool rep,
                                     sampler_pen_visit visit, void *ctx)
{
    for (int32_t i = 0; i < seq->n_output; i++)
        w->counts[seq->output_ids[i]]++;
    for (int pass = 0; pass < 2; pass++) {
        const int32_t *ids = pass ? seq->output_ids : seq->prompt_ids;
        int32_t n = pass ? seq->n_output : seq->n_prompt;
        for (int32_t i = 0; i < n; i++) {
            int32_t id = ids[i];
            if (w->seen[id] || (!rep && w->counts[id] == 0))
                continue;
            w->seen[id] = 1;
            visit(ctx, id, w->counts[id]);
        }
    }
    for (int pass = 0; pass < 2; pass++) {
        const int32_t *ids = pass ? seq->output_ids : seq->prompt_ids;
        int32_t n = pass ? seq->n_output : seq->n_prompt;
        for (int32_t i = 0; i < n; i++)
            w->seen[ids[i]] = 0;
    }
    for (int32_t i = 0; i < seq->n_output; i++)
        w->counts[seq->output_ids[i]] = 0;
}

typedef struct {
    float *logits;
    float r, f, pr;
} sampler_penalize_ctx;

static void sampler_penalize_visit(void *ctx, int32_t id, int32_t count)
{
    sampler_penalize_ctx *c = ctx;
    c->logits[id] = pg_smp_penalize(c->logits[id], c->r, count, c->f, c->pr);
}

typedef struct {
    int32_t *ids, *cnt, *n;
} sampler_collect_ctx;

static void sampler_collect_visit(void *ctx, int32_t id, int32_t count)
{
    sampler_collect_ctx *c = ctx;
    c->ids[*c->n] = id;
    c->cnt[*c->n] = count;
    (*c->n)++;
}

/* Step 1 (vLLM v1 apply_penalties: repetition over prompt|output, then
 * `logits -= frequency * output_bin_counts`, `logits -= presence *
 * output_mask`): pg_smp_penalize on each distinct id of prompt ∪ output. */
static void sampler_apply_penalties(sampler_workspace *w, const sampling_params *p, float *logits,
                                    const sampler_seq_view *seq)
{
    const float r = p->repetition_penalty;
    const float f = p->frequency_penalty, pr = p->presence_penalty;
    const bool rep = r != 1.0f, fp = f != 0.0f || pr != 0.0f;
    if (!rep && !fp)
        return;
    sampler_penalize_ctx ctx = {logits, r, f, pr};
    sampler_walk_penalty_ids(w, seq, rep, sampler_penalize_visit, &ctx);
}

/* Value of the k-th largest (k in [1, n]) of a[0..n), which it reorders:
 * quickselect with a three-way partition (many equal logits stay linear). */
static float sampler_kth_largest(float *a, int32_t n, int32_t k)
{
    int32_t lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float x0 = a[lo], x1 = a[lo + (hi - lo) / 2], x2 = a[hi];
        float pivot = x0 > x1 ? (x1 > x2 ? x1 : (x0 > x2 ? x2 : x0))
                              : (x0 > x2 ? x0 : (x1 > x2 ? x2 : x1)); /* median of 3 */
        /* descending: [lo, lt) > pivot, [lt, gt] == pivot, (gt, hi] < pivot */
        int32_t lt = lo, i = lo, gt = hi;
        while (i <= gt) {
            float v = a[i];
            if (v > pivot) {
                a[i++] = a[lt];
                a[lt++] = v;
            } else if (v < pivot) {
                a[i] = a[gt];
                a[gt--] = v;
            } else {
                i++;
            }
        }
        if (want < lt)
            hi = lt - 1;
        else if (want > gt)
            lo = gt + 1;
        else
            return pivot;
    }
    return a[lo];
}

/* The k-th largest (k in [1, n_alive]) of the finite logits[0..vocab), for
 * small k: a min-heap of the k largest seen so far in heap[k]; most tokens
 * lose one comparison against the heap's root. */
static float sampler_kth_largest_heap(const float *logits, int32_t vocab, float *heap, int32_t k)
{
    int32_t n = 0;
    for (int32_t i = 0; i < vocab; i++) {
        float v = logits[i];
        if (!(v > -INFINITY))
            continue;
        if (n < k) { /* sift up */
            int32_t c = n++;
            while (c > 0 && heap[(c - 1) / 2] > v) {
                heap[c] = heap[(c - 1) / 2];
                c = (c - 1) / 2;
            }
            heap[c] = v;
        } else if (v > heap[0]) { /* replace the root, sift down */
            int32_t c = 0;
            for (;;) {
                int32_t l = 2 * c + 1, r = l + 1, s = c;
                float sv = v;
                if (l < k && heap[l] < sv) {
                    s = l;
                    sv = heap[l];
                }
                if (r < k && heap[r] < sv)
                    s = r;
                if (s == c)
                    break;
                heap[c] = heap[s];
                c = s;
            }
            heap[c] = v;
        }
    }
    return heap[0];
}

/* log_softmax of raw[vocab]: the sampled token's logprob and the top n_top,
 * descending, ties by ascending id — common/pg_logsoftmax.h's definition,
 * which the device computes bit for bit alike (gpu/logprobs.cu). */
static void sampler_logprobs(const float *raw, int32_t vocab, sampler_result *res, int32_t n_top)
{
    double lse = pg_lsm_lse(raw, vocab);
    res->logprob = pg_lsm_logprob(raw[res->token_id], lse);
    pg_lsm_topk(raw, vocab, n_top, res->top_ids, res->top_logprobs);
    for (int32_t j = 0; j < n_top; j++)
        res->top_logprobs[j] = pg_lsm_logprob(res->top_logprobs[j], lse);
    res->n_top = n_top;
}

/* ---- sampling -------------------------------------------------------- */

static int32_t sampler_greedy(const float *logits, int32_t vocab)
{
    float best = -INFINITY;
    int32_t best_id = -1;
    for (int32_t i = 0; i < vocab; i++)
        if (logits[i] > best) { /* strict: ties keep the lowest id; NaN never wins */
            best = logits[i];
            best_id = i;
        }
    return best_id;
}

/* ---- sampling: steps 4-9 of common/pg_sample.h --------------------- */

/* The whole-row loops of steps 4 and 7, built twice on x86-64 (the
 * baseline and AVX2 + FMA, chosen once per call by __builtin_cpu_supports):
 * both run pg_sample.h's IEEE operations element by element (an fma is
 * exact whether the hardware or libm computes it; the integer sums are
 * exact in any order), so they give the same bits. */

/* Step 4 on x[n] in place: the tempered logits; returns the key of their
 * maximum (pg_smp_key; the max is exact in any order) and counts the alive.
 * Blocks of SAMPLER_LANES with a lane array each (a fixed trip count, so
 * GCC's -O2 vectorizes them), then the tail. */
#define SAMPLER_LANES 16
#define SAMPLER_TEMPER_LOOP                                                        \
    {                                                                              \
        uint32_t kl[SAMPLER_LANES];                                                \
        int32_t al[SAMPLER_LANES];                                                 \
        for (int32_t j = 0; j < SAMPLER_LANES; j++) {                              \
            kl[j] = 0;                                                             \
            al[j] = 0;                                                             \
        }                                                                          \
        int32_t i0 = 0;                                                            \
        for (; i0 + SAMPLER_LANES <= n; i0 += SAMPLER_LANES)                       \
            for (int32_t j = 0; j < SAMPLER_LANES; j++) {                          \
                float y = pg_smp_temper(x[i0 + j], t);                             \
                x[i0 + j] = y;                                                     \
                uint32_t k = pg_smp_key(y);                                        \
                kl[j] = k > kl[j] ? k : kl[j];                                     \
                al[j] += k > PG_SMP_KEY_NEG_INF;                                   \
            }                                                                      \
        for (int32_t j = 0; i0 + j < n; j++) {                                     \
            float y = pg_smp_temper(x[i0 + j], t);                                 \
            x[i0 + j] = y;                                                         \
            uint32_t k = pg_smp_key(y);                                            \
            kl[j] = k > kl[j] ? k : kl[j];                                         \
            al[j] += k > PG_SMP_KEY_NEG_INF;                                       \
        }                                                                          \
        uint32_t kmax = 0;                                                         \
        int32_t alive = 0;                                                         \
        for (int32_t j = 0; j < SAMPLER_LANES; j++) {                              \
            kmax = kl[j] > kmax ? kl[j] : kmax;                                    \
            alive += al[j];                                                        \
        }                                                                          \
        *n_alive = alive;                                                          \
        return kmax;                                                               \
    }

/* Step 7 on x[n]: w[i] = pg_smp_weight(x[i] - m), the sum of each chunk of
 * SAMPLER_CHUNK in csum[], returns the total (full chunks: a fixed trip
 * count, vectorized; then the tail). */
#define SAMPLER_WEIGHT_LOOP                                                        \
    {                                                                              \
        uint64_t total = 0;                                                        \
        int32_t c = 0, c0 = 0;                                                     \
        for (; c0 + SAMPLER_CHUNK <= n; c0 += SAMPLER_CHUNK, c++) {                \
            uint64_t s = 0;                                                        \
            for (int32_t i = 0; i < SAMPLER_CHUNK; i++) {                          \
                uint64_t wi = pg_smp_weight(x[c0 + i] - m);                        \
                w[c0 + i] = wi;                                                    \
                s += wi;                                                           \
            }                                                                      \
            csum[c] = s;                                                           \
            total += s;                                                            \
        }                                                                          \
        if (c0 < n) {                                                              \
            uint64_t s = 0;                                                        \
            for (int32_t i = c0; i < n; i++) {                                     \
                uint64_t wi = pg_smp_weight(x[i] - m);                             \
                w[i] = wi;                                                         \
                s += wi;                                                           \
            }                                                                      \
            csum[c] = s;                                                           \
            total += s;                                                            \
        }                                                                          \
        return total;                                                              \
    }

static uint32_t sampler_temper_base(float *restrict x, int32_t n, float t, int32_t *n_alive)
SAMPLER_TEMPER_LOOP
static uint64_t sampler_weight_base(const float *restrict x, int32_t n, float m, uint64_t *restrict w,
                                    uint64_t *restrict csum)
SAMPLER_WEIGHT_LOOP

#if defined(__x86_64__) && defined(__GNUC__)
#define SAMPLER_HAVE_FMA_BUILD 1
__attribute__((target("avx2,fma"))) static uint32_t sampler_temper_fma(float *restrict x, int32_t n, float t,
                                                                      int32_t *n_alive)
SAMPLER_TEMPER_LOOP
__attribute__((target("avx2,fma"))) static uint64_t sampler_weight_fma(const float *restrict x, int32_t n,
                                                                      float m, uint64_t *restrict w,
                                                                      uint64_t *restrict csum)
SAMPLER_WEIGHT_LOOP
#endif

static uint32_t sampler_temper(const sampler_workspace *ws, float *x, int32_t n, float t,
                               int32_t *n_alive)
{
#ifdef SAMPLER_HAVE_FMA_BUILD
    if (ws->fma)
        return sampler_temper_fma(x, n, t, n_alive);
#endif
    (void)ws;
    return sampler_temper_base(x, n, t, n_alive);
}

static uint64_t sampler_weights(const sampler_workspace *ws, const float *x, int32_t n, float m)
{
#ifdef SAMPLER_HAVE_FMA_BUILD
    if (ws->fma)
        return sampler_weight_fma(x, n, m, ws->w, ws->csum);
#endif
    return sampler_weight_base(x, n, m, ws->w, ws->csum);
}

/* The inverse of pg_smp_key. */
static float sampler_unkey(uint32_t k)
{
    return pg_smp_ffrom((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* descending by logit, ties by ascending id: step 8's order */
static int sampler_cand_cmp(const void *pa, const void *pb)
{
    const sampler_cand *a = pa, *b = pb;
    if (a->key != b->key)
        return a->key > b->key ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* Step 8: the last token (key, id) of the shortest prefix, in (x desc, id
 * asc) order, of the alive tokens of x[vocab] whose weights reach need.
 *
 * Only the tokens with x >= x_c, x_c the least x among those of weight
 * >= cw = (total - need) / (2 vocab), can be in that prefix: every other
 * token weighs < cw, so together < (total - need) / 2, and the tokens
 * x >= x_c (themselves a prefix of the order) weigh > need. Those
 * candidates are sorted when few; otherwise passes of a radix select on
 * their keys (digits of up to 11 bits, from the highest bit where the keys
 * differ; kmax: the row's largest key) with the weight of each bucket
 * narrow them down to a few, or to one key, whose tokens are then taken in
 * ascending id order. All sums are integers, exact: the same cut as a full
 * sort. */
static void sampler_top_p_cut(sampler_workspace *ws, const float *x, int32_t vocab, uint32_t kmax,
                              uint64_t total, uint64_t need, uint32_t *cut_key, int32_t *cut_id)
{
    const uint64_t *w = ws->w;
    const uint64_t cw = (total - need) / (2u * (uint64_t)vocab);
    uint32_t kc = 0xffffffffu;
    for (int32_t i = 0; i < vocab; i++) { /* integer compares only: vectorized */
        uint32_t k = pg_smp_key(x[i]);
        bool c = (w[i] >= cw) & (k > PG_SMP_KEY_NEG_INF) & (k < kc);
        kc = c ? k : kc;
    }
    sampler_cand *cand = ws->cand;
    int32_t n = 0;
    for (int32_t i = 0; i < vocab; i++) { /* branch-free: the pattern is random */
        uint32_t k = pg_smp_key(x[i]);
        cand[n].key = k;
        cand[n].id = i;
        n += k >= kc;
    }
    uint64_t rem = need;
    /* the candidates' keys lie in [kc, kmax]: they share every bit above
     * the highest one where kc and kmax differ, so the digits start there
     * (flat rows' keys differ in their low bits only) */
    int hb = kmax == kc ? 0 : 32 - __builtin_clz(kmax ^ kc);
    while (hb > 0 && n > SAMPLER_SORT_MAX) {
        const int sh = hb > 11 ? hb - 11 : 0;
        const uint32_t mk = (1u << (hb - sh)) - 1u;
        /* four interleaved histograms: a run of equal digits is not one
         * chain of dependent adds */
        uint64_t *h = ws->hist;
        memset(h, 0, 4 * (mk + 1) * sizeof *h);
        int32_t j = 0;
        for (; j + 4 <= n; j += 4)
            for (int u = 0; u < 4; u++)
                h[u * 2048 + ((cand[j + u].key >> sh) & mk)] += w[cand[j + u].id];
        for (; j < n; j++)
            h[(cand[j].key >> sh) & mk] += w[cand[j].id];
        uint64_t acc = 0;
        uint32_t b = mk;
        for (;; b--) { /* from the largest keys down; the candidates reach rem */
            const uint64_t hb4 = h[b] + h[2048 + b] + h[4096 + b] + h[6144 + b];
            if (acc + hb4 >= rem || b == 0)
                break;
            acc += hb4;
        }
        rem -= acc;
        int32_t m = 0;
        for (j = 0; j < n; j++) { /* stays in ascending id order; branch-free */
            cand[m] = cand[j];
            m += ((cand[j].key >> sh) & mk) == b;
        }
        n = m;
        hb = sh;
    }
    /* a few candidates, or one key in ascending id order: the order's walk */
    qsort(cand, (size_t)n, sizeof *cand, sampler_cand_cmp);
    uint64_t cum = 0;
    int32_t j = 0;
    for (; j < n - 1; j++) {
        cum += w[cand[j].id];
        if (cum >= rem)
            break;
    }
    *cut_key = cand[j].key;
    *cut_id = cand[j].id;
}

/* Steps 4-9 of common/pg_sample.h on logits (already penalized and
 * banned): the token, or -1 when no logit is alive. */
static int32_t sampler_random(sampler_workspace *ws, const sampling_params *p, float *x,
                              int32_t vocab, sampler_rng *rng)
{
    int32_t n_alive;
    const uint32_t kmax = sampler_temper(ws, x, vocab, p->temperature, &n_alive);
    if (n_alive == 0)
        return -1;
    const float m = sampler_unkey(kmax);

    if (p->min_p > 0.0f) { /* step 5 */
        const float thr = m + pg_smp_min_p_log(p->min_p);
        n_alive = 0;
        for (int32_t i = 0; i < vocab; i++) { /* a bit mask: vectorized */
            uint32_t keep = 0u - (uint32_t)(x[i] >= thr);
            x[i] = pg_smp_ffrom((pg_smp_fbits(x[i]) & keep) | (0xff800000u & ~keep));
            n_alive += (int32_t)(keep & 1u);
        }
    }

    if (p->top_k > 0 && p->top_k < n_alive) { /* step 6 */
        float kth;
        if (p->top_k <= SAMPLER_HEAP_MAX_K) {
            kth = sampler_kth_largest_heap(x, vocab, ws->sel, p->top_k);
        } else {
            int32_t n = 0;
            for (int32_t i = 0; i < vocab; i++)
                if (x[i] > -INFINITY)
                    ws->sel[n++] = x[i];
            kth = sampler_kth_largest(ws->sel, n, p->top_k);
        }
        for (int32_t i = 0; i < vocab; i++) {
            uint32_t keep = 0u - (uint32_t)(x[i] >= kth);
            x[i] = pg_smp_ffrom((pg_smp_fbits(x[i]) & keep) | (0xff800000u & ~keep));
        }
    }

    uint64_t total = sampler_weights(ws, x, vocab, m); /* step 7 */
    uint64_t *w = ws->w, *csum = ws->csum;
    const int32_t n_chunks = (vocab + SAMPLER_CHUNK - 1) / SAMPLER_CHUNK;

    if (p->top_p < 1.0f) { /* step 8 */
        uint32_t ck;
        int32_t cid;
        sampler_top_p_cut(ws, x, vocab, kmax, total, pg_smp_need(p->top_p, total), &ck, &cid);
        total = 0;
        for (int32_t c = 0; c < n_chunks; c++) {
            const int32_t c0 = c * SAMPLER_CHUNK;
            const int32_t c1 = c0 + SAMPLER_CHUNK < vocab ? c0 + SAMPLER_CHUNK : vocab;
            uint64_t s = 0;
            for (int32_t i = c0; i < c1; i++) { /* bit masks, no branch */
                uint32_t k = pg_smp_key(x[i]);
                uint32_t keep = 0u - (uint32_t)((k > ck) | ((k == ck) & (i <= cid)));
                uint64_t wi = w[i] & (uint64_t)(int64_t)(int32_t)keep;
                w[i] = wi;
                /* the kept set stays visible in the row */
                x[i] = pg_smp_ffrom((pg_smp_fbits(x[i]) & keep) | (0xff800000u & ~keep));
                s += wi;
            }
            csum[c] = s;
            total += s;
        }
    }

    /* step 9: the lowest id whose prefix sum exceeds the target (chunk sums
     * first, then the chunk) */
    const uint64_t target = pg_smp_target(pg_smp_draw(rng->key, rng->counter), total);
    rng->counter++;
    uint64_t cum = 0;
    int32_t c = 0;
    while (c < n_chunks - 1 && cum + csum[c] <= target)
        cum += csum[c++];
    const int32_t c1 = (c + 1) * SAMPLER_CHUNK < vocab ? (c + 1) * SAMPLER_CHUNK : vocab;
    for (int32_t i = c * SAMPLER_CHUNK; i < c1; i++) {
        cum += w[i];
        if (cum > target)
            return i;
    }
    return -1; /* not reached: target < total */
}

bool sampler_row_greedy(const sampling_params *params)
{
    return params->temperature < SAMPLER_SAMPLING_EPS;
}

int sampler_row_params(sampler_workspace *w, const sampling_params *p, const sampler_seq_view *seq,
                       const sampler_rng *rng, pg_smp_row *row, int32_t *pen_ids, int32_t *pen_cnt,
                       int32_t *n_pen, int32_t *ban_ids, int32_t *n_ban)
{
    if (!w)
        return PG_EINVAL;
    static const sampler_seq_view empty = {0};
    if (!seq)
        seq = &empty;
    int rc;
    if ((rc = sampler_check_ids(w, "prompt_ids", seq->prompt_ids, seq->n_prompt, w->vocab)) ||
        (rc = sampler_check_ids(w, "output_ids", seq->output_ids, seq->n_output, w->vocab)) ||
        (rc = sampler_check_ids(w, "banned_ids", seq->banned_ids, seq->n_banned, w->vocab)))
        return rc;
    memset(row, 0, sizeof *row);
    row->row = -1;
    row->mask_first = -1;
    row->temperature = p->temperature;
    row->top_k = p->top_k > 0 ? p->top_k : 0;
    row->top_p = p->top_p;
    row->min_p = p->min_p;
    row->min_p_log = p->min_p > 0.0f ? pg_smp_min_p_log(p->min_p) : 0.0f;
    row->rep = p->repetition_penalty;
    row->freq = p->frequency_penalty;
    row->pres = p->presence_penalty;
    row->key = rng->key;
    row->counter = rng->counter;
    /* step 1's ids, as sampler_apply_penalties walks them */
    row->pen_first = *n_pen;
    const bool rep = row->rep != 1.0f, fp = row->freq != 0.0f || row->pres != 0.0f;
    if (rep || fp) {
        sampler_collect_ctx ctx = {pen_ids, pen_cnt, n_pen};
        sampler_walk_penalty_ids(w, seq, rep, sampler_collect_visit, &ctx);
    }
    row->n_pen = *n_pen - row->pen_first;
    row->ban_first = *n_ban;
    for (int32_t i = 0; i < seq->n_banned; i++)
        ban_ids[(*n_ban)++] = seq->banned_ids[i];
    row->n_ban = seq->n_banned;
    return PG_OK;
}

bool sampler_plain_argmax(const sampling_params *params, const sampler_seq_view *seq)
{
    /* what sampler_sample changes before sampler_greedy, and logprobs */
    return params->temperature < SAMPLER_SAMPLING_EPS && params->logprobs < 0 &&
           params->repetition_penalty == 1.0f && params->frequency_penalty == 0.0f &&
           params->presence_penalty == 0.0f && (!seq || seq->n_banned == 0);
}

int sampler_sample(sampler_workspace *w, const sampling_params *params, float *logits,
                   int32_t vocab, const sampler_seq_view *seq, sampler_rng *rng,
                   sampler_result *result)
{
    if (!w)
        return PG_EINVAL;
    if (!params || !logits || !rng || !result)
        return pg_error_set(&w->err, PG_EINVAL, "sampler: expected params, logits, rng and result, got NULL");
    if (vocab < 1 || vocab > w->vocab)
        return pg_error_set(&w->err, PG_EINVAL, "sampler: vocab must be in [1, %d] (the workspace's size), got %d",
                            (int)w->vocab, (int)vocab);
    static const sampler_seq_view empty = {0};
    if (!seq)
        seq = &empty;
    int rc;
    if ((rc = sampler_check_ids(w, "prompt_ids", seq->prompt_ids, seq->n_prompt, vocab)) ||
        (rc = sampler_check_ids(w, "output_ids", seq->output_ids, seq->n_output, vocab)) ||
        (rc = sampler_check_ids(w, "banned_ids", seq->banned_ids, seq->n_banned, vocab)))
        return rc;
    int32_t n_top = params->logprobs < 0 ? 0 : (params->logprobs < vocab ? params->logprobs : vocab);
    if (n_top > 0 && (!result->top_ids || !result->top_logprobs))
        return pg_error_set(&w->err, PG_EINVAL, "sampler: logprobs = %d: expected top_ids and top_logprobs storage, got NULL",
                            (int)params->logprobs);

    if (params->logprobs >= 0)
        memcpy(w->raw, logits, (size_t)vocab * sizeof *logits);

    sampler_apply_penalties(w, params, logits, seq);
    for (int32_t i = 0; i < seq->n_banned; i++)
        logits[seq->banned_ids[i]] = -INFINITY;

    int32_t tok;
    if (params->temperature < SAMPLER_SAMPLING_EPS)
        tok = sampler_greedy(logits, vocab);
    else
        tok = sampler_random(w, params, logits, vocab, rng);
    if (tok < 0)
        return pg_error_set(&w->err, PG_EINVAL,
                            "sampler: no token can be sampled: all %d logits are -inf, nan or banned", (int)vocab);

    result->token_id = tok;
    result->logprob = 0.0f;
    result->n_top = 0;
    if (params->logprobs >= 0)
        sampler_logprobs(w->raw, vocab, result, n_top);
    return PG_OK;
}
