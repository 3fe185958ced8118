/* grammar_mask: the vocabulary byte trie and the token mask (grammar.h).
 *
 * The trie is stored in preorder: node i has its byte, its depth (1 for a
 * token's first byte) and next[i], the index just past its subtree; the
 * tokens whose bytes end at node i are ids[tok0[i] .. tok0[i] + ntok[i]).
 * The mask walks the array once: at node i (depth d) the automaton state is
 * restored to the one after i's parent, stepped by i's byte, and on refusal
 * the walk jumps to next[i], skipping every token that starts with the
 * dead prefix. Restoring is an undo log of the stack writes, so one step
 * costs a table lookup and a couple of stores however deep the stack is.
 */
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

struct grammar_vocab {
    int32_t vocab;
    uint8_t *arena;      /* all token bytes */
    uint32_t *off, *len; /* [vocab] */
    int32_t n_nodes, max_len;
    uint8_t *byte;       /* [n_nodes] */
    uint16_t *depth;     /* [n_nodes] */
    int32_t *next;       /* [n_nodes] */
    int32_t *tok0;       /* [n_nodes] into ids */
    int32_t *ntok;       /* [n_nodes] */
    int32_t *ids;        /* token ids sorted by bytes */
};

/* Tokens longer than this are left out of the trie (never allowed). */
#define GV_MAX_TOKEN_BYTES 1024

void grammar_vocab_destroy(grammar_vocab *v)
{
    if (!v)
        return;
    free(v->arena);
    free(v->off);
    free(v->len);
    free(v->byte);
    free(v->depth);
    free(v->next);
    free(v->tok0);
    free(v->ntok);
    free(v->ids);
    free(v);
}

int32_t grammar_vocab_max_len(const grammar_vocab *v) { return v->max_len; }

int32_t grammar_vocab_size(const grammar_vocab *v) { return v->vocab; }
int32_t grammar_vocab_trie_nodes(const grammar_vocab *v) { return v->n_nodes; }
size_t grammar_mask_words(const grammar_vocab *v) { return ((size_t)v->vocab + 63) / 64; }

const uint8_t *grammar_vocab_bytes(const grammar_vocab *v, int32_t id, uint32_t *len)
{
    if (id < 0 || id >= v->vocab) {
        *len = 0;
        return NULL;
    }
    *len = v->len[id];
    return v->arena + v->off[id];
}

typedef struct gv_key {
    const uint8_t *p;
    uint32_t len;
    int32_t id;
} gv_key;

static int cmp_tok(const void *x, const void *y)
{
    const gv_key *a = x, *b = y;
    uint32_t m = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->p, b->p, m);
    if (c)
        return c;
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

int grammar_vocab_create(grammar_vocab **out, int32_t vocab_size, const char *const *bytes,
                         const uint32_t *lens, pg_error *err)
{
    *out = NULL;
    if (vocab_size < 1 || !bytes || !lens)
        return pg_error_set(err, PG_EINVAL, "grammar vocab: expected a vocabulary, got %d tokens",
                            (int)vocab_size);
    grammar_vocab *v = calloc(1, sizeof *v);
    if (!v)
        goto oom;
    v->vocab = vocab_size;
    v->off = calloc((size_t)vocab_size, sizeof *v->off);
    v->len = calloc((size_t)vocab_size, sizeof *v->len);
    v->ids = malloc((size_t)vocab_size * sizeof *v->ids);
    if (!v->off || !v->len || !v->ids)
        goto oom;
    size_t total = 0;
    for (int32_t i = 0; i < vocab_size; i++)
        if (bytes[i] && lens[i] <= GV_MAX_TOKEN_BYTES)
            total += lens[i];
    v->arena = malloc(total + 1);
    if (!v->arena)
        goto oom;
    size_t at = 0;
    int32_t n_ids = 0;
    for (int32_t i = 0; i < vocab_size; i++) {
        v->off[i] = (uint32_t)at;
        if (!bytes[i] || lens[i] == 0 || lens[i] > GV_MAX_TOKEN_BYTES)
            continue;
        memcpy(v->arena + at, bytes[i], lens[i]);
        v->len[i] = lens[i];
        at += lens[i];
        v->ids[n_ids++] = i;
        if ((int32_t)lens[i] > v->max_len)
            v->max_len = (int32_t)lens[i];
    }
    {
        gv_key *keys = malloc(((size_t)n_ids + 1) * sizeof *keys);
        if (!keys)
            goto oom;
        for (int32_t k = 0; k < n_ids; k++) {
            keys[k].p = v->arena + v->off[v->ids[k]];
            keys[k].len = v->len[v->ids[k]];
            keys[k].id = v->ids[k];
        }
        qsort(keys, (size_t)n_ids, sizeof *keys, cmp_tok);
        for (int32_t k = 0; k < n_ids; k++)
            v->ids[k] = keys[k].id;
        free(keys);
    }
    /* nodes <= total bytes */
    size_t cap = total + 1;
    v->byte = malloc(cap);
    v->depth = malloc(cap * sizeof *v->depth);
    v->next = malloc(cap * sizeof *v->next);
    v->tok0 = malloc(cap * sizeof *v->tok0);
    v->ntok = calloc(cap, sizeof *v->ntok);
    int32_t *path = malloc(((size_t)v->max_len + 1) * sizeof *path);
    if (!v->byte || !v->depth || !v->next || !v->tok0 || !v->ntok || !path) {
        free(path);
        goto oom;
    }
    int32_t plen = 0, n = 0;
    const uint8_t *prev = NULL;
    uint32_t prev_len = 0;
    for (int32_t k = 0; k < n_ids; k++) {
        int32_t id = v->ids[k];
        const uint8_t *b = v->arena + v->off[id];
        uint32_t l = v->len[id], lcp = 0;
        while (prev && lcp < l && lcp < prev_len && b[lcp] == prev[lcp])
            lcp++;
        while (plen > (int32_t)lcp)
            v->next[path[--plen]] = n;
        for (uint32_t dd = lcp; dd < l; dd++) {
            v->byte[n] = b[dd];
            v->depth[n] = (uint16_t)(dd + 1);
            v->tok0[n] = k;
            v->ntok[n] = 0;
            path[plen++] = n++;
        }
        int32_t node = path[l - 1];
        if (v->ntok[node] == 0)
            v->tok0[node] = k;
        v->ntok[node]++;
        prev = b;
        prev_len = l;
    }
    while (plen > 0)
        v->next[path[--plen]] = n;
    free(path);
    v->n_nodes = n;
    *out = v;
    return PG_OK;
oom:
    grammar_vocab_destroy(v);
    return pg_error_set(err, PG_ENOMEM, "grammar vocab: out of memory for %d tokens", (int)vocab_size);
}

/* gstep_byte with the stack writes logged as (index, old value), except
 * writes to index `skip` (-1: none), which the caller restores itself.
 * Returns 1 (accepted), 0 (refused) or 2: refused because the bottom frame's
 * rule ended (a frame below, if there were one, would decide). */
static inline int step_logged(const grammar *g, grammar_state *s, uint8_t b, int32_t *log,
                               int32_t *nlog, int32_t skip)
{
    int32_t c = g->cls[b];
    for (;;) {
        int32_t t = s->st[s->n - 1];
        int32_t v = g->trans[(size_t)t * (size_t)g->n_classes + (size_t)c];
        if (v >= 0) {
            if (s->n - 1 != skip) {
                log[(*nlog)++] = s->n - 1;
                log[(*nlog)++] = t;
            }
            s->st[s->n - 1] = v;
            return 1;
        }
        if (v <= -2) {
            if (s->n == GRAMMAR_MAX_DEPTH)
                return 0;
            const gcall *k = &g->calls[-2 - v];
            if (s->n - 1 != skip) {
                log[(*nlog)++] = s->n - 1;
                log[(*nlog)++] = t;
            }
            if (s->n != skip) {
                log[(*nlog)++] = s->n;
                log[(*nlog)++] = s->st[s->n];
            }
            s->st[s->n - 1] = k->ret;
            s->st[s->n++] = g->rule_start[k->rule];
            continue;
        }
        if (g->accept[t] && s->n > 1) {
            s->n--;
            continue;
        }
        return g->accept[t] ? 2 : 0;
    }
}

/* The walk's per-trie-depth snapshots. Level d is the stack after the d-th
 * byte of the current path: its height n, its top value, the undo-log
 * position, and the largest height of levels 0..d. Going back to level d
 * undoes the log, then rewrites the top. A write to level d's top index
 * needs no log entry when no shallower level was higher (such a level
 * would have that index below its own top; a level as high or lower has it
 * as its top, restored the same way, or above its stack). */
typedef struct gw_levels {
    int32_t *n, *top, *log, *maxn;
} gw_levels;

static bool levels_alloc(gw_levels *L, int32_t levels)
{
    int32_t *p = malloc((size_t)levels * 4 * sizeof *p);
    L->n = p;
    L->top = p ? p + levels : NULL;
    L->log = p ? p + 2 * levels : NULL;
    L->maxn = p ? p + 3 * levels : NULL;
    return p != NULL;
}

static inline void levels_save(gw_levels *L, int32_t d, const grammar_state *w, int32_t nlog)
{
    L->n[d] = w->n;
    L->top[d] = w->st[w->n - 1];
    L->log[d] = nlog;
    L->maxn[d] = d > 0 && L->maxn[d - 1] > w->n ? L->maxn[d - 1] : w->n;
}

/* Back to level d; returns the index whose writes need no log entry. */
static inline int32_t levels_restore(const gw_levels *L, int32_t d, grammar_state *w,
                                     const int32_t *log, int32_t *nlog)
{
    int32_t stop = L->log[d];
    while (*nlog > stop) {
        *nlog -= 2;
        w->st[log[*nlog]] = log[*nlog + 1];
    }
    w->n = L->n[d];
    w->st[w->n - 1] = L->top[d];
    return L->maxn[d] == L->n[d] ? L->n[d] - 1 : -1;
}

int32_t grammar_mask(const grammar *g, const grammar_vocab *v, const grammar_state *s,
                     uint64_t *mask)
{
    memset(mask, 0, grammar_mask_words(v) * sizeof *mask);
    int32_t levels = v->max_len + 1;
    /* one byte logs at most 4 words per call (<= GRAMMAR_MAX_DEPTH) + 2 */
    const int32_t per_byte = 4 * GRAMMAR_MAX_DEPTH + 2;
    int32_t cap = 8 * per_byte;
    gw_levels L;
    bool ok = levels_alloc(&L, levels);
    int32_t *log = malloc((size_t)cap * sizeof *log);
    if (!ok || !log) {
        free(L.n);
        free(log);
        return -1;
    }
    grammar_state w = *s;
    int32_t nlog = 0, count = 0;
    levels_save(&L, 0, &w, 0);
    int32_t i = 0;
    while (i < v->n_nodes) {
        int32_t d = v->depth[i];
        int32_t skip = levels_restore(&L, d - 1, &w, log, &nlog);
        if (nlog + per_byte > cap) {
            int32_t *nl = realloc(log, (size_t)cap * 2 * sizeof *nl);
            if (!nl) {
                free(L.n);
                free(log);
                return -1;
            }
            log = nl;
            cap *= 2;
        }
        if (step_logged(g, &w, v->byte[i], log, &nlog, skip) != 1) {
            i = v->next[i];
            continue;
        }
        for (int32_t k = 0; k < v->ntok[i]; k++) {
            int32_t id = v->ids[v->tok0[i] + k];
            mask[id >> 6] |= 1ull << (id & 63);
            count++;
        }
        levels_save(&L, d, &w, nlog);
        i++;
    }
    free(L.n);
    free(log);
    return count;
}

/* ---- the per-state mask cache ------------------------------------------------ */

/* For a DFA state t, the walk from the one-frame stack [t] sorts every token
 * into: accepted without ever leaving t's frame (then the frames below are
 * never read: accepted under any stack, but for the depth limit when it
 * pushed frames: `deep` keeps those with the most frames they stacked),
 * refused inside t's frame (refused under any stack), or uncertain: its
 * bytes ran t's rule to its end, so the caller frames decide (checked
 * token by token against the whole stack at mask time). xgrammar's
 * "adaptive token mask cache" (Dong et al., 2024) in its simplest form. */
typedef struct gc_entry {
    uint64_t *bits;          /* [words] accepted */
    int32_t *deep;           /* pairs (id, most frames on the relative stack), n_deep */
    int32_t *unsure;         /* ids, n_unsure */
    int32_t n_deep, n_unsure;
} gc_entry;

struct grammar_cache {
    const grammar *g;
    const grammar_vocab *v;
    gc_entry **e;            /* [g->n_states], NULL until computed */
    size_t bytes, max_bytes;
};

int grammar_cache_create(grammar_cache **out, const grammar *g, const grammar_vocab *v,
                         size_t max_bytes, pg_error *err)
{
    *out = NULL;
    grammar_cache *c = calloc(1, sizeof *c);
    if (c)
        c->e = calloc((size_t)g->n_states, sizeof *c->e);
    if (!c || !c->e) {
        free(c);
        return pg_error_set(err, PG_ENOMEM, "grammar cache: out of memory");
    }
    c->g = g;
    c->v = v;
    c->max_bytes = max_bytes;
    *out = c;
    return PG_OK;
}

void grammar_cache_destroy(grammar_cache *c)
{
    if (!c)
        return;
    for (int32_t s = 0; s < c->g->n_states; s++)
        if (c->e[s]) {
            free(c->e[s]->bits);
            free(c->e[s]->deep);
            free(c->e[s]->unsure);
            free(c->e[s]);
        }
    free(c->e);
    free(c);
}

size_t grammar_cache_bytes(const grammar_cache *c) { return c->bytes; }

static bool push2(int32_t **a, int32_t *n, int32_t *cap, int32_t x, int32_t y, int per)
{
    if (*n + per > *cap) {
        int32_t nc = *cap ? 2 * *cap : 64;
        int32_t *p = realloc(*a, (size_t)nc * sizeof *p);
        if (!p)
            return false;
        *a = p;
        *cap = nc;
    }
    (*a)[(*n)++] = x;
    if (per == 2)
        (*a)[(*n)++] = y;
    return true;
}

/* The walk of grammar_mask from [t], classifying (see above). NULL on OOM. */
static gc_entry *classify(const grammar *g, const grammar_vocab *v, int32_t t)
{
    gc_entry *en = calloc(1, sizeof *en);
    int32_t levels = v->max_len + 1;
    const int32_t per_byte = 4 * GRAMMAR_MAX_DEPTH + 2;
    int32_t cap = 8 * per_byte, cap_deep = 0, cap_unsure = 0;
    gw_levels L;
    bool ok = levels_alloc(&L, levels);
    int32_t *frames = malloc((size_t)levels * sizeof *frames); /* most frames on the path */
    int32_t *log = malloc((size_t)cap * sizeof *log);
    if (en)
        en->bits = calloc(grammar_mask_words(v), sizeof *en->bits);
    if (!en || !en->bits || !ok || !frames || !log)
        goto oom;
    grammar_state w;
    w.n = 1;
    w.st[0] = t;
    int32_t nlog = 0;
    levels_save(&L, 0, &w, 0);
    frames[0] = 1;
    int32_t i = 0;
    while (i < v->n_nodes) {
        int32_t d = v->depth[i];
        int32_t skip = levels_restore(&L, d - 1, &w, log, &nlog);
        if (nlog + per_byte > cap) {
            int32_t *nl = realloc(log, (size_t)cap * 2 * sizeof *nl);
            if (!nl)
                goto oom;
            log = nl;
            cap *= 2;
        }
        int verdict = step_logged(g, &w, v->byte[i], log, &nlog, skip);
        if (verdict == 2) { /* t's rule ended: the callers decide, for the whole subtree */
            for (int32_t j = i; j < v->next[i]; j++)
                for (int32_t k = 0; k < v->ntok[j]; k++)
                    if (!push2(&en->unsure, &en->n_unsure, &cap_unsure, v->ids[v->tok0[j] + k], 0, 1))
                        goto oom;
            i = v->next[i];
            continue;
        }
        if (verdict == 0) {
            i = v->next[i];
            continue;
        }
        int32_t mx = frames[d - 1] > w.n ? frames[d - 1] : w.n;
        for (int32_t k = 0; k < v->ntok[i]; k++) {
            int32_t id = v->ids[v->tok0[i] + k];
            en->bits[id >> 6] |= 1ull << (id & 63);
            if (mx > 1 && !push2(&en->deep, &en->n_deep, &cap_deep, id, mx, 2))
                goto oom;
        }
        levels_save(&L, d, &w, nlog);
        frames[d] = mx;
        i++;
    }
    en->n_deep /= 2;
    free(L.n);
    free(frames);
    free(log);
    return en;
oom:
    if (en) {
        free(en->bits);
        free(en->deep);
        free(en->unsure);
        free(en);
    }
    free(L.n);
    free(frames);
    free(log);
    return NULL;
}

int32_t grammar_mask_cached(grammar_cache *c, const grammar_state *s, uint64_t *mask)
{
    const grammar *g = c->g;
    const grammar_vocab *v = c->v;
    int32_t t = s->st[s->n - 1];
    gc_entry *en = c->e[t];
    if (!en) {
        if (c->bytes >= c->max_bytes)
            return grammar_mask(g, v, s, mask); /* over budget: walk every time */
        en = classify(g, v, t);
        if (!en)
            return -1;
        c->e[t] = en;
        c->bytes += grammar_mask_words(v) * 8 + (size_t)en->n_deep * 8 + (size_t)en->n_unsure * 4;
    }
    size_t words = grammar_mask_words(v);
    memcpy(mask, en->bits, words * sizeof *mask);
    for (int32_t k = 0; k < en->n_deep; k++) {
        int32_t id = en->deep[2 * k], frames = en->deep[2 * k + 1];
        if (s->n - 1 + frames > GRAMMAR_MAX_DEPTH)
            mask[id >> 6] &= ~(1ull << (id & 63));
    }
    if (s->n > 1)
        for (int32_t k = 0; k < en->n_unsure; k++) {
            int32_t id = en->unsure[k];
            grammar_state w = *s;
            if (grammar_advance(g, &w, v->arena + v->off[id], v->len[id]))
                mask[id >> 6] |= 1ull << (id & 63);
        }
    int32_t count = 0;
    for (size_t k = 0; k < words; k++)
        count += __builtin_popcountll(mask[k]);
    return count;
}
