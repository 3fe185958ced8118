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

/* gstep_byte with every stack write logged as (index, old value). */
static inline bool step_logged(const grammar *g, grammar_state *s, uint8_t b, int32_t *log,
                               int32_t *nlog)
{
    int32_t c = g->cls[b];
    for (;;) {
        int32_t t = s->st[s->n - 1];
        int32_t v = g->trans[(size_t)t * (size_t)g->n_classes + (size_t)c];
        if (v >= 0) {
            log[(*nlog)++] = s->n - 1;
            log[(*nlog)++] = t;
            s->st[s->n - 1] = v;
            return true;
        }
        if (v <= -2) {
            if (s->n == GRAMMAR_MAX_DEPTH)
                return false;
            const gcall *k = &g->calls[-2 - v];
            log[(*nlog)++] = s->n - 1;
            log[(*nlog)++] = t;
            log[(*nlog)++] = s->n;
            log[(*nlog)++] = s->st[s->n];
            s->st[s->n - 1] = k->ret;
            s->st[s->n++] = g->rule_start[k->rule];
            continue;
        }
        if (g->accept[t] && s->n > 1) {
            s->n--;
            continue;
        }
        return false;
    }
}

int32_t grammar_mask(const grammar *g, const grammar_vocab *v, const grammar_state *s,
                     uint64_t *mask)
{
    memset(mask, 0, grammar_mask_words(v) * sizeof *mask);
    int32_t levels = v->max_len + 1;
    /* one byte logs at most 4 words per call (<= GRAMMAR_MAX_DEPTH) + 2 */
    const int32_t per_byte = 4 * GRAMMAR_MAX_DEPTH + 2;
    int32_t cap = 8 * per_byte;
    int32_t *save_n = malloc((size_t)levels * 2 * sizeof *save_n);
    int32_t *log = malloc((size_t)cap * sizeof *log);
    if (!save_n || !log) {
        free(save_n);
        free(log);
        return -1;
    }
    int32_t *save_log = save_n + levels;
    grammar_state w = *s;
    int32_t nlog = 0, count = 0;
    save_n[0] = w.n;
    save_log[0] = 0;
    int32_t i = 0;
    while (i < v->n_nodes) {
        int32_t d = v->depth[i];
        /* back to the state after the parent */
        int32_t stop = save_log[d - 1];
        while (nlog > stop) {
            nlog -= 2;
            w.st[log[nlog]] = log[nlog + 1];
        }
        w.n = save_n[d - 1];
        if (nlog + per_byte > cap) {
            int32_t *nl = realloc(log, (size_t)cap * 2 * sizeof *nl);
            if (!nl) {
                free(save_n);
                free(log);
                return -1;
            }
            log = nl;
            cap *= 2;
        }
        if (!step_logged(g, &w, v->byte[i], log, &nlog)) {
            i = v->next[i];
            continue;
        }
        for (int32_t k = 0; k < v->ntok[i]; k++) {
            int32_t id = v->ids[v->tok0[i] + k];
            mask[id >> 6] |= 1ull << (id & 63);
            count++;
        }
        save_n[d] = w.n;
        save_log[d] = nlog;
        i++;
    }
    free(save_n);
    free(log);
    return count;
}
