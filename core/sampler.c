/* sampler: logits -> next token, vLLM v1 semantics (vllm/v1/sample/sampler.py,
 * ops/penalties.py, ops/topk_topp_sampler.py), deterministic per sequence.
 *
 * Steps, in vLLM v1's order:
 *   1. penalties: repetition over the SET of prompt+output ids
 *      (logit > 0 ? logit / r : logit * r), then frequency (logit -= f * count)
 *      and presence (logit -= p, once) over the output ids;
 *   2. banned ids (min_tokens: eos + stop ids) -> -inf;
 *   3. temperature < 1e-5 (_SAMPLING_EPS): greedy argmax, ties -> lowest id,
 *      no RNG draw;
 *   4. otherwise logits / temperature, then min-p (vLLM v1 applies it as an
 *      argmax-invariant logits processor BEFORE top-k/top-p: keep
 *      p >= min_p * p_max, i.e. exp(x - max) >= min_p, tested in logit
 *      space as x >= max + log(min_p)), top-k (keep every
 *      logit >= the k-th largest, so ties at the boundary are all kept, as
 *      vLLM's `logits_sort < kth_value` mask does), top-p (over the tokens
 *      still alive, renormalized: sort descending by (logit, id asc), keep
 *      the smallest prefix whose cumulative probability >= top_p, at least
 *      one token; the same set as vLLM's ascending `cumsum <= 1 - p` mask up
 *      to tie order), softmax, one uniform draw u, inverse CDF.
 *
 * The inverse CDF walks the surviving tokens in ASCENDING ID order (a fixed
 * order independent of which filters ran, so no sort is needed unless top-p
 * is on): the token is the first id whose cumulative weight exceeds
 * u * total. Weights are expf(x - max) in float, sums in double.
 *
 * Non-finite logits: NaN never wins the argmax and is -inf when sampling;
 * +inf is clamped to FLT_MAX when sampling. Logprobs are log_softmax of the
 * raw logits as given (before penalties, banning and temperature), by
 * common/pg_logsoftmax.h: exp terms in double summed in a fixed order, the
 * same bits as the device's (gpu/logprobs.cu); top k ties to the lower id,
 * NaN last. */
#include "sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pg_error.h"
#include "pg_logsoftmax.h"

#define SAMPLER_SAMPLING_EPS 1e-5f /* vLLM's _SAMPLING_EPS */
/* top-k up to this uses a k-heap (one comparison per token, a sift for
 * the few that enter), above it a quickselect (O(V), a copy plus several
 * passes) */
#define SAMPLER_HEAP_MAX_K 1024

/* ---- RNG ------------------------------------------------------------- */

/* splitmix64's finalizer (Steele, Lea, Flood 2014): a bijection on 64 bits
 * with good avalanche. */
static uint64_t sampler_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

sampler_rng sampler_rng_init(uint64_t seed, int32_t seq_index)
{
    sampler_rng r;
    uint64_t s = sampler_mix64(seed + 0x9e3779b97f4a7c15ULL);
    uint64_t i = sampler_mix64((uint64_t)(uint32_t)seq_index + 0x6a09e667f3bcc909ULL);
    r.key = sampler_mix64(s ^ (i * 0xd1b54a32d192ed03ULL));
    r.counter = 0;
    return r;
}

/* Draw k of key K is mix64(K ^ mix64(k + c)): a pure function of (key, k),
 * so replaying a sequence (preemption) replays its draws; keys are XORed
 * with a mixed counter rather than added, so two streams are not shifted
 * copies of each other. 53 random bits -> [0, 1). */
double sampler_rng_uniform(sampler_rng *rng)
{
    uint64_t z = sampler_mix64(rng->key ^ sampler_mix64(rng->counter + 0x3c6ef372fe94f82bULL));
    rng->counter++;
    return (double)(z >> 11) * 0x1.0p-53;
}

/* ---- workspace ------------------------------------------------------- */

typedef struct sampler_cand {
    float x;
    int32_t id;
} sampler_cand;

struct sampler_workspace {
    int32_t vocab;
    float *raw;           /* [vocab] copy of the raw logits (logprobs) */
    float *sel;           /* [vocab] scratch for the top-k quickselect */
    sampler_cand *cand;   /* [vocab] survivors, for the top-p sort */
    int32_t *counts;      /* [vocab] output-token counts; all 0 between calls */
    uint8_t *seen;        /* [vocab] prompt|output membership; all 0 between calls */
    pg_error err;         /* the last failure's message */
};

sampler_workspace *sampler_workspace_create(int32_t vocab_size)
{
    if (vocab_size < 1)
        return NULL;
    sampler_workspace *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    size_t n = (size_t)vocab_size;
    w->vocab = vocab_size;
    w->raw = malloc(n * sizeof *w->raw);
    w->sel = malloc(n * sizeof *w->sel);
    w->cand = malloc(n * sizeof *w->cand);
    w->counts = calloc(n, sizeof *w->counts);
    w->seen = calloc(n, sizeof *w->seen);
    if (!w->raw || !w->sel || !w->cand || !w->counts || !w->seen) {
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

/* vLLM v1 apply_penalties: repetition over prompt|output, then
 * `logits -= frequency * output_bin_counts`, `logits -= presence * output_mask`. */
static void sampler_apply_penalties(sampler_workspace *w, const sampling_params *p, float *logits,
                                    const sampler_seq_view *seq)
{
    const float r = p->repetition_penalty;
    const float f = p->frequency_penalty, pr = p->presence_penalty;
    if (r != 1.0f) {
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *ids = pass ? seq->output_ids : seq->prompt_ids;
            int32_t n = pass ? seq->n_output : seq->n_prompt;
            for (int32_t i = 0; i < n; i++) {
                int32_t id = ids[i];
                if (w->seen[id])
                    continue;
                w->seen[id] = 1;
                logits[id] = logits[id] > 0.0f ? logits[id] / r : logits[id] * r;
            }
        }
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *ids = pass ? seq->output_ids : seq->prompt_ids;
            int32_t n = pass ? seq->n_output : seq->n_prompt;
            for (int32_t i = 0; i < n; i++)
                w->seen[ids[i]] = 0;
        }
    }
    if (f != 0.0f || pr != 0.0f) {
        for (int32_t i = 0; i < seq->n_output; i++)
            w->counts[seq->output_ids[i]]++;
        for (int32_t i = 0; i < seq->n_output; i++) {
            int32_t id = seq->output_ids[i];
            if (w->counts[id] == 0)
                continue; /* already applied */
            logits[id] -= f * (float)w->counts[id];
            logits[id] -= pr;
            w->counts[id] = 0;
        }
    }
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

/* descending by logit, ties by ascending id: a total, deterministic order */
static int sampler_cand_cmp(const void *pa, const void *pb)
{
    const sampler_cand *a = pa, *b = pb;
    if (a->x != b->x)
        return a->x > b->x ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
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

/* Steps 4 of the file comment on logits (already penalized and banned). */
static int32_t sampler_random(sampler_workspace *w, const sampling_params *p, float *logits,
                              int32_t vocab, sampler_rng *rng)
{
    const float t = p->temperature;
    float m = -INFINITY;
    int32_t n_alive = 0;
    for (int32_t i = 0; i < vocab; i++) {
        float x = logits[i] / t;
        if (isnan(x))
            x = -INFINITY;
        else if (x > FLT_MAX)
            x = FLT_MAX;
        logits[i] = x;
        if (x > -INFINITY)
            n_alive++;
        if (x > m)
            m = x;
    }
    if (n_alive == 0)
        return -1;

    /* min-p: p_i >= min_p * p_max  <=>  exp(x_i - m) >= min_p  <=>
     * x_i >= m + log(min_p) (in logit space: no exp per token) */
    if (p->min_p > 0.0f) {
        const float thr = m + logf(p->min_p);
        n_alive = 0;
        for (int32_t i = 0; i < vocab; i++) {
            if (logits[i] >= thr)
                n_alive++;
            else
                logits[i] = -INFINITY;
        }
    }

    /* top-k: keep logits >= the k-th largest (boundary ties kept) */
    if (p->top_k > 0 && p->top_k < n_alive) {
        float kth;
        if (p->top_k <= SAMPLER_HEAP_MAX_K) {
            kth = sampler_kth_largest_heap(logits, vocab, w->sel, p->top_k);
        } else {
            int32_t n = 0;
            for (int32_t i = 0; i < vocab; i++)
                if (logits[i] > -INFINITY)
                    w->sel[n++] = logits[i];
            kth = sampler_kth_largest(w->sel, n, p->top_k);
        }
        n_alive = 0;
        for (int32_t i = 0; i < vocab; i++) {
            if (logits[i] >= kth)
                n_alive++;
            else
                logits[i] = -INFINITY;
        }
    }

    /* softmax weights e_i = exp(x_i - m) of the survivors, in w->sel */
    float *e = w->sel;
    double total = 0.0;
    for (int32_t i = 0; i < vocab; i++) {
        e[i] = logits[i] > -INFINITY ? expf(logits[i] - m) : 0.0f;
        total += (double)e[i];
    }

    /* top-p over the renormalized survivors. Only tokens with
     * e_i >= c = (1 - top_p) * total / (2 * vocab) need sorting: the rest sum
     * to < (1 - top_p) * total / 2, so the descending prefix reaching
     * top_p * total lies inside the sorted ones, and every token outside
     * sorts after every token inside (e is monotone in the logit). The
     * prefix is the one a full sort would give. */
    if (p->top_p < 1.0f && n_alive > 1) {
        const double c = (1.0 - (double)p->top_p) * total / (2.0 * (double)vocab);
        int32_t n = 0;
        for (int32_t i = 0; i < vocab; i++)
            if (e[i] > 0.0f && (double)e[i] >= c) {
                w->cand[n].x = logits[i];
                w->cand[n].id = i;
                n++;
            }
        qsort(w->cand, (size_t)n, sizeof *w->cand, sampler_cand_cmp);
        const double need = (double)p->top_p * total;
        double cum = 0.0;
        int32_t keep = 0;
        while (keep < n) {
            cum += (double)e[w->cand[keep].id];
            keep++;
            if (cum >= need)
                break;
        }
        /* drop cand[keep, n) and everything that was not a candidate */
        for (int32_t j = keep; j < n; j++)
            e[w->cand[j].id] = 0.0f;
        total = 0.0;
        for (int32_t i = 0; i < vocab; i++) {
            if (!(e[i] > 0.0f && (double)e[i] >= c))
                e[i] = 0.0f;
            if (e[i] == 0.0f)
                logits[i] = -INFINITY;
            total += (double)e[i];
        }
    }

    /* inverse CDF in ascending id order */
    double target = sampler_rng_uniform(rng) * total, cum = 0.0;
    int32_t last = -1;
    for (int32_t i = 0; i < vocab; i++) {
        if (e[i] > 0.0f) {
            cum += (double)e[i];
            last = i;
            if (cum > target)
                return i;
        }
    }
    return last; /* rounding: u * total landed at the very end */
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
