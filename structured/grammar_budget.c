/* grammar_budget: how many bytes a constrained text still needs before it
 * may end, and the mask filter that uses it so that a sequence with a
 * max_tokens budget reaches a complete match before the budget runs out
 * (issue 23: "an extraction job should not depend on max_tokens to stay
 * valid"; an unbounded JSON string on stories260K ran to max_tokens in one
 * request of five).
 *
 * dist[s] (per DFA state, computed once at compile): the fewest bytes from
 * s to a state where its rule may end. A grammar_state's distance is the sum
 * over its stack frames (the frames below the top hold return states).
 * grow: the most one byte can raise that sum (opening an optional property
 * raises it by its value's shortest form), so a token of len bytes raises
 * it by at most len * grow: tokens that short are never checked. reach
 * bounds it from the other side (see reach_of): inside a string of a flat
 * schema the distance cannot pass the few bytes that close it, so nothing
 * is checked until the budget is down to those bytes.
 */
#include <stdlib.h>

#include "grammar_internal.h"

#define GB_INF (INT32_MAX / 4)
/* Relaxation sweeps over all (state, class) pairs are capped by this much
 * work; a grammar past it (none seen) gets no budget filter. */
#define GB_MAX_WORK 200000000LL
#define GB_REACH_SWEEPS 16

static int32_t add_sat(int32_t a, int32_t b) { return a >= GB_INF || b >= GB_INF ? GB_INF : a + b; }

/* Fewest bytes from state s to the end of its rule when the next byte has
 * class c (that byte included); GB_INF if c is refused there. A call runs
 * the callee from its start on the same byte (gstep_byte), or returns at
 * once when the callee may match nothing. */
static int32_t step_cost(const grammar *g, const int32_t *dist, int32_t s, int32_t c, int depth)
{
    int32_t v = g->trans[(size_t)s * (size_t)g->n_classes + (size_t)c];
    if (v >= 0)
        return add_sat(1, dist[v]);
    if (v == -1 || depth >= GRAMMAR_MAX_DEPTH)
        return GB_INF;
    const gcall *k = &g->calls[-2 - v];
    int32_t st = g->rule_start[k->rule];
    int32_t h = add_sat(step_cost(g, dist, st, c, depth + 1), dist[k->ret]);
    if (h >= GB_INF && g->accept[st])
        h = step_cost(g, dist, k->ret, c, depth + 1);
    return h;
}

/* reach[s]: the largest distance a stack that starts as the one frame s
 * can come to (the states reachable from s, the frames its calls push
 * counted): after any token, the distance is at most the sum of reach over
 * the frames before it. Saturated at GRAMMAR_MAX_DEPTH times the largest
 * distance (no stack is deeper). NULL (only the grow gate then applies)
 * when it has not settled after GB_REACH_SWEEPS sweeps: a recursion that
 * pushes a frame with bytes after it (nested JSON values) raises reach by
 * a little each sweep up to the cap, which would cost more compile time
 * than the filter saves. */
static int32_t *reach_of(const grammar *g, const int32_t *dist)
{
    int32_t n = g->n_states, nc = g->n_classes;
    int32_t *reach = malloc(((size_t)n + 1) * sizeof *reach);
    if (!reach)
        return NULL;
    int32_t dmax = 0;
    for (int32_t s = 0; s < n; s++)
        if (dist[s] < GB_INF && dist[s] > dmax)
            dmax = dist[s];
    int32_t cap = dmax * GRAMMAR_MAX_DEPTH;
    for (int32_t s = 0; s < n; s++)
        reach[s] = dist[s];
    int sweeps = 0;
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t s = n - 1; s >= 0; s--) {
            if (dist[s] >= GB_INF)
                continue;
            int32_t r = reach[s];
            for (int32_t c = 0; c < nc; c++) {
                int32_t v = g->trans[(size_t)s * (size_t)nc + (size_t)c];
                if (v >= 0 && dist[v] < GB_INF && reach[v] > r)
                    r = reach[v];
                if (v <= -2) {
                    const gcall *k = &g->calls[-2 - v];
                    int32_t st = g->rule_start[k->rule];
                    if (dist[k->ret] >= GB_INF || dist[st] >= GB_INF)
                        continue;
                    int32_t in = add_sat(reach[st], dist[k->ret]);
                    if (in > r)
                        r = in;
                    if (reach[k->ret] > r)
                        r = reach[k->ret];
                }
            }
            if (r > cap)
                r = cap;
            if (r > reach[s]) {
                reach[s] = r;
                changed = true;
            }
        }
        if (changed && ++sweeps == GB_REACH_SWEEPS) {
            free(reach);
            return NULL;
        }
    }
    return reach;
}

int gbudget_prepare(grammar *g)
{
    int32_t n = g->n_states, nc = g->n_classes;
    int32_t *dist = malloc(((size_t)n + 1) * sizeof *dist);
    if (!dist)
        return PG_ENOMEM;
    for (int32_t s = 0; s < n; s++)
        dist[s] = g->accept[s] ? 0 : GB_INF;
    /* Bellman-Ford sweeps, newest states first (they lie nearer the ends) */
    long long work = 0;
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t s = n - 1; s >= 0; s--) {
            if (dist[s] == 0)
                continue;
            int32_t best = dist[s];
            for (int32_t c = 0; c < nc; c++) {
                int32_t h = step_cost(g, dist, s, c, 0);
                if (h < best)
                    best = h;
            }
            if (best < dist[s]) {
                dist[s] = best;
                changed = true;
            }
        }
        work += (long long)n * nc;
        if (work > GB_MAX_WORK) {
            free(dist);
            return PG_OK; /* no filter: g->dist stays NULL */
        }
    }
    int32_t grow = 0;
    for (int32_t s = 0; s < n; s++) {
        if (dist[s] >= GB_INF)
            continue;
        for (int32_t c = 0; c < nc; c++) {
            int32_t h = step_cost(g, dist, s, c, 0);
            if (h < GB_INF && h - 1 - dist[s] > grow)
                grow = h - 1 - dist[s];
        }
    }
    g->dist = dist;
    g->grow = grow;
    g->reach = reach_of(g, dist);
    return PG_OK;
}

int32_t grammar_bytes_to_end(const grammar *g, const grammar_state *s)
{
    if (!g->dist)
        return -1;
    int32_t d = 0;
    for (int32_t i = 0; i < s->n; i++)
        d = add_sat(d, g->dist[s->st[i]]);
    return d >= GB_INF ? INT32_MAX : d;
}

/* The distance after feeding token id to s, INT32_MAX if refused (or a
 * token without bytes, which no mask holds). */
static int32_t dist_after(const grammar *g, const grammar_vocab *v, const grammar_state *s, int32_t id)
{
    uint32_t len;
    const uint8_t *b = grammar_vocab_bytes(v, id, &len);
    grammar_state t = *s;
    if (len == 0 || !grammar_advance(g, &t, b, len))
        return INT32_MAX;
    return grammar_bytes_to_end(g, &t);
}

int32_t grammar_mask_budget(const grammar *g, const grammar_vocab *v, const grammar_state *s,
                            uint64_t *mask, int32_t budget_bytes, bool can_end)
{
    size_t words = grammar_mask_words(v);
    int32_t count = 0;
    for (size_t w = 0; w < words; w++)
        count += __builtin_popcountll(mask[w]);
    int32_t d = grammar_bytes_to_end(g, s);
    if (d < 0 || d == INT32_MAX)
        return count;
    /* no token can take the stack past the reach of its frames */
    if (g->reach) {
        long long r = 0;
        for (int32_t i = 0; i < s->n; i++)
            r += g->reach[s->st[i]];
        if (r <= budget_bytes)
            return count;
    }
    /* tokens of at most len0 bytes cannot pass the budget */
    long long room = (long long)budget_bytes - d;
    long long max_len = grammar_vocab_max_len(v);
    if (room >= max_len * g->grow)
        return count;
    long long len0 = room < 0 ? -1 : g->grow > 0 ? room / g->grow : max_len;
    /* one pass clears the tokens past the budget, remembering the closest */
    int32_t best = INT32_MAX;
    count = 0;
    for (size_t w = 0; w < words; w++)
        for (uint64_t m = mask[w]; m; m &= m - 1) {
            int32_t id = (int32_t)(w * 64 + (size_t)__builtin_ctzll(m));
            uint32_t len;
            grammar_vocab_bytes(v, id, &len);
            int32_t da = (long long)len > len0 ? dist_after(g, v, s, id) : 0;
            if (da > budget_bytes) {
                mask[w] &= ~(1ull << (id & 63));
                if (da < best)
                    best = da;
            } else {
                count++;
            }
        }
    if (count > 0 || can_end || best == INT32_MAX)
        return count;
    /* no token fits (max_tokens was too small from the start) and eos cannot
     * end the text here: keep the tokens that come closest (a token the
     * mask held is one s accepts, so dist_after finds them all again) */
    for (int32_t id = 0; id < grammar_vocab_size(v); id++) {
        if (dist_after(g, v, s, id) == best) {
            mask[id >> 6] |= 1ull << (id & 63);
            count++;
        }
    }
    return count;
}
