/* tok_bpe: the BPE model of a tokenizer.json — vocab and merges in open-
 * addressing hash tables, and the merge loop of Hugging Face tokenizers
 * (models/bpe/word.rs): symbols in a linked list, candidate pairs in a
 * binary min-heap ordered by (merge rank, left position), stale candidates
 * dropped when popped. O(n log n) per word; nothing is cached. */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

int32_t tok_vocab_find(const tokenizer *t, const char *s, size_t n)
{
    size_t mask = t->vhash_cap - 1;
    size_t h = (size_t)tok_hash_bytes(s, n) & mask;
    for (;;) {
        int32_t id = t->vhash[h];
        if (id < 0)
            return -1;
        if (t->mv_len[id] == n && memcmp(t->mv_arena + t->mv_off[id], s, n) == 0)
            return id;
        h = (h + 1) & mask;
    }
}

static bool merge_find(const tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *nid)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t mask = t->mcap - 1;
    size_t h = (size_t)tok_hash_u64(key) & mask;
    for (;;) {
        const tok_merge_slot *m = &t->merges[h];
        if (m->key == UINT64_MAX)
            return false;
        if (m->key == key) {
            *rank = m->rank;
            *nid = m->new_id;
            return true;
        }
        h = (h + 1) & mask;
    }
}

/* A JSON string token's unescaped bytes: the raw bytes when there is no
 * escape (the common case), else unescaped into *tmp (malloc'd). */
static int str_bytes(const json_doc *d, int i, const char **s, size_t *n, char **tmp,
                     pg_error *err)
{
    size_t rl;
    const char *raw = json_raw(d, i, &rl);
    if (!memchr(raw, '\\', rl)) {
        *s = raw;
        *n = rl;
        return PG_OK;
    }
    free(*tmp);
    *tmp = NULL;
    int rc = json_get_string(d, i, tmp, n, err);
    *s = *tmp;
    return rc;
}

static int load_vocab(tokenizer *t, const json_doc *d, int vocab, const char *label,
                      pg_error *err)
{
    if (!json_is_object(d, vocab))
        return pg_error_set(err, PG_EFORMAT, "%s: model.vocab: expected an object", label);
    int n = json_size(d, vocab);
    /* pass 1: max id and arena size */
    int64_t max_id = -1;
    size_t arena = 0;
    int i = vocab + 1;
    for (int k = 0; k < n; k++) {
        int v = i + 1;
        int64_t id;
        if (!json_is_string(d, i) || json_get_int(d, v, 0, INT32_MAX - 1, &id, err))
            return pg_error_set(err, PG_EFORMAT,
                                "%s: model.vocab entry %d: expected \"piece\": id in [0, 2^31-1)",
                                label, k);
        if (id > max_id)
            max_id = id;
        arena += (size_t)(d->tok[i].end - d->tok[i].start) + 1;
        i = json_skip(d, v);
    }
    t->mv_n = (int32_t)(max_id + 1);
    t->mv_arena = malloc(arena + 1);
    t->mv_off = malloc(((size_t)t->mv_n + 1) * sizeof *t->mv_off);
    t->mv_len = calloc((size_t)t->mv_n + 1, sizeof *t->mv_len);
    t->vhash_cap = pow2_at_least((size_t)n * 2 + 1);
    t->vhash = malloc(t->vhash_cap * sizeof *t->vhash);
    if (!t->mv_arena || !t->mv_off || !t->mv_len || !t->vhash)
        return pg_error_set(err, PG_ENOMEM, "%s: out of memory for a vocab of %d", label, n);
    memset(t->mv_off, 0xFF, ((size_t)t->mv_n + 1) * sizeof *t->mv_off);
    memset(t->vhash, 0xFF, t->vhash_cap * sizeof *t->vhash);
    size_t pos = 0;
    char *tmp = NULL;
    i = vocab + 1;
    for (int k = 0; k < n; k++) {
        int v = i + 1;
        int64_t id;
        json_get_int(d, v, 0, INT32_MAX - 1, &id, NULL);
        const char *s;
        size_t sl;
        int rc = str_bytes(d, i, &s, &sl, &tmp, err);
        if (rc) {
            free(tmp);
            return pg_error_wrap(err, rc, "%s: model.vocab entry %d", label, k);
        }
        if (t->mv_off[id] != UINT32_MAX) { /* duplicate id: keep the first */
            i = json_skip(d, v);
            continue;
        }
        memcpy(t->mv_arena + pos, s, sl);
        t->mv_arena[pos + sl] = '\0';
        t->mv_off[id] = (uint32_t)pos;
        t->mv_len[id] = (uint32_t)sl;
        pos += sl + 1;
        if (tok_vocab_find(t, s, sl) < 0) {
            size_t h = (size_t)tok_hash_bytes(s, sl) & (t->vhash_cap - 1);
            while (t->vhash[h] >= 0)
                h = (h + 1) & (t->vhash_cap - 1);
            t->vhash[h] = (int32_t)id;
        }
        i = json_skip(d, v);
    }
    free(tmp);
    return PG_OK;
}

static int load_merges(tokenizer *t, const json_doc *d, int merges, const char *label,
                       pg_error *err)
{
    if (merges < 0) {
        t->mcap = 16;
    } else if (!json_is_array(d, merges)) {
        return pg_error_set(err, PG_EFORMAT, "%s: model.merges: expected an array", label);
    }
    int n = merges < 0 ? 0 : json_size(d, merges);
    t->mcap = pow2_at_least((size_t)n * 2 + 1);
    t->merges = malloc(t->mcap * sizeof *t->merges);
    if (!t->merges)
        return pg_error_set(err, PG_ENOMEM, "%s: out of memory for %d merges", label, n);
    for (size_t h = 0; h < t->mcap; h++)
        t->merges[h].key = UINT64_MAX;
    char *tmp_a = NULL, *tmp_b = NULL;
    char *cat = NULL;
    size_t cat_cap = 0;
    int rc = PG_OK;
    int i = merges + 1;
    for (int k = 0; k < n; k++) {
        const char *a, *b;
        size_t al, bl;
        if (json_is_string(d, i)) { /* "a b" */
            const char *s;
            size_t sl;
            if ((rc = str_bytes(d, i, &s, &sl, &tmp_a, err)))
                break;
            const char *sp = memchr(s, ' ', sl);
            if (!sp || memchr(sp + 1, ' ', sl - (size_t)(sp - s) - 1)) {
                rc = pg_error_set(err, PG_EFORMAT,
                                  "%s: model.merges[%d]: expected \"left right\" (one space)",
                                  label, k);
                break;
            }
            a = s;
            al = (size_t)(sp - s);
            b = sp + 1;
            bl = sl - al - 1;
        } else if (json_is_array(d, i) && json_size(d, i) == 2 && json_is_string(d, i + 1) &&
                   json_is_string(d, i + 2)) { /* ["a", "b"] */
            if ((rc = str_bytes(d, i + 1, &a, &al, &tmp_a, err)) ||
                (rc = str_bytes(d, i + 2, &b, &bl, &tmp_b, err)))
                break;
        } else {
            rc = pg_error_set(err, PG_EFORMAT,
                              "%s: model.merges[%d]: expected \"a b\" or [\"a\", \"b\"]", label, k);
            break;
        }
        if (al + bl > cat_cap) {
            cat_cap = (al + bl) * 2 + 16;
            char *c2 = realloc(cat, cat_cap);
            if (!c2) {
                rc = pg_error_set(err, PG_ENOMEM, "%s: out of memory", label);
                break;
            }
            cat = c2;
        }
        int32_t ia = tok_vocab_find(t, a, al), ib = tok_vocab_find(t, b, bl);
        memcpy(cat, a, al);
        memcpy(cat + al, b, bl);
        int32_t ic = tok_vocab_find(t, cat, al + bl);
        if (ia < 0 || ib < 0 || ic < 0) {
            rc = pg_error_set(err, PG_EFORMAT,
                              "%s: model.merges[%d]: expected its parts and their concatenation "
                              "in the vocab, found '%.*s' + '%.*s' missing",
                              label, k, (int)al, a, (int)bl, b);
            break;
        }
        uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
        size_t h = (size_t)tok_hash_u64(key) & (t->mcap - 1);
        while (t->merges[h].key != UINT64_MAX && t->merges[h].key != key)
            h = (h + 1) & (t->mcap - 1);
        t->merges[h].key = key; /* a repeated pair: the later rank wins, as in HF */
        t->merges[h].rank = (uint32_t)k;
        t->merges[h].new_id = ic;
        i = json_skip(d, i);
    }
    free(tmp_a);
    free(tmp_b);
    free(cat);
    return rc;
}

int tok_bpe_load(tokenizer *t, const json_doc *d, int model, const char *label, pg_error *err)
{
    if (!json_is_object(d, model))
        return pg_error_set(err, PG_EFORMAT, "%s: model: expected an object", label);
    int ty = json_obj_get(d, model, "type");
    if (ty >= 0 && !json_str_eq(d, ty, "BPE")) {
        size_t n;
        const char *r = json_raw(d, ty, &n);
        return pg_error_set(err, PG_EUNSUPPORTED, "%s: model.type: expected BPE, found %.*s",
                            label, (int)n, r);
    }
    static const char *const unsupported[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t k = 0; k < 2; k++) {
        int v = json_obj_get(d, model, unsupported[k]);
        if (v >= 0 && !json_is_null(d, v) && !(json_is_string(d, v) && json_size(d, v) == 0 &&
                                               d->tok[v].end == d->tok[v].start))
            return pg_error_set(err, PG_EUNSUPPORTED, "%s: model.%s: only null is supported",
                                label, unsupported[k]);
    }
    int dr = json_obj_get(d, model, "dropout");
    if (dr >= 0 && !json_is_null(d, dr)) {
        double p = 0;
        if (json_get_double(d, dr, &p, err) || p > 0.0)
            return pg_error_set(err, PG_EUNSUPPORTED, "%s: model.dropout: only null/0 is supported",
                                label);
    }
    int rc = load_vocab(t, d, json_obj_get(d, model, "vocab"), label, err);
    if (rc)
        return rc;
    if ((rc = load_merges(t, d, json_obj_get(d, model, "merges"), label, err)))
        return rc;
    t->byte_fallback = tok_json_bool(d, model, "byte_fallback", false);
    t->ignore_merges = tok_json_bool(d, model, "ignore_merges", false);
    t->fuse_unk = tok_json_bool(d, model, "fuse_unk", false);
    t->unk_id = -1;
    int unk = json_obj_get(d, model, "unk_token");
    if (json_is_string(d, unk)) {
        char *s = NULL;
        size_t sl;
        if ((rc = tok_json_strdup(d, unk, &s, &sl, label, "model.unk_token", err)))
            return rc;
        t->unk_id = tok_vocab_find(t, s, sl);
        free(s);
        if (t->unk_id < 0)
            return pg_error_set(err, PG_EFORMAT, "%s: model.unk_token: not in the vocab", label);
    }
    for (uint32_t cp = 0; cp < 0x800; cp++) {
        char u[4];
        size_t n = tok_utf8_encode(u, cp);
        t->char_id[cp] = tok_vocab_find(t, u, n);
    }
    for (int b = 0; b < 256; b++) {
        char u[8];
        static const char hex[] = "0123456789ABCDEF";
        u[0] = '<'; u[1] = '0'; u[2] = 'x';
        u[3] = hex[b >> 4]; u[4] = hex[b & 15]; u[5] = '>';
        t->byte_id[b] = tok_vocab_find(t, u, 6);
    }
    return PG_OK;
}

void tok_bpe_free(tokenizer *t)
{
    free(t->mv_arena);
    free(t->mv_off);
    free(t->mv_len);
    free(t->vhash);
    free(t->merges);
}

typedef struct bpe_sym {
    int32_t id, prev, next;
} bpe_sym;
typedef struct bpe_cand {
    uint64_t key; /* rank << 32 | left position: the heap order */
    int32_t right, lid, rid, nid;
} bpe_cand;

static void heap_push(bpe_cand *h, size_t *n, bpe_cand c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].key <= c.key)
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static bpe_cand heap_pop(bpe_cand *h, size_t *n)
{
    bpe_cand top = h[0];
    bpe_cand last = h[--(*n)];
    size_t i = 0, m = *n;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= m)
            break;
        size_t c = (l + 1 < m && h[l + 1].key < h[l].key) ? l + 1 : l;
        if (h[c].key >= last.key)
            break;
        h[i] = h[c];
        i = c;
    }
    if (m > 0)
        h[i] = last;
    return top;
}

static void add_cand(const tokenizer *t, bpe_sym *sym, bpe_cand *heap, size_t *nh, int32_t l)
{
    int32_t r = sym[l].next;
    if (r < 0)
        return;
    uint32_t rank;
    int32_t nid;
    if (!merge_find(t, sym[l].id, sym[r].id, &rank, &nid))
        return;
    bpe_cand c = {((uint64_t)rank << 32) | (uint32_t)l, r, sym[l].id, sym[r].id, nid};
    heap_push(heap, nh, c);
}

int tok_bpe_word(tok_enc *e, const char *w, size_t n)
{
    const tokenizer *t = e->t;
    if (n == 0)
        return PG_OK;
    if (t->ignore_merges) {
        int32_t id = tok_vocab_find(t, w, n);
        if (id >= 0)
            return tok_enc_push(e, id) ? PG_OK : PG_ENOMEM;
    }
    /* at most n symbols (one per byte) */
    if (e->sym_cap < n) {
        size_t cap = n < 64 ? 64 : n * 2;
        void *s = realloc(e->sym, cap * sizeof(bpe_sym));
        if (!s)
            return PG_ENOMEM;
        e->sym = s;
        void *h = realloc(e->heap, 3 * cap * sizeof(bpe_cand)); /* n-1 + 2 per merge */
        if (!h)
            return PG_ENOMEM;
        e->heap = h;
        e->sym_cap = cap;
    }
    bpe_sym *sym = e->sym;
    bpe_cand *heap = e->heap;
    int32_t ns = 0;
    bool last_unk = false;
    const unsigned char *u = (const unsigned char *)w;
    for (size_t i = 0; i < n;) {
        size_t cl = tok_utf8_len(u[i]);
        if (i + cl > n)
            cl = n - i;
        int32_t id;
        if (cl == 1)
            id = t->char_id[u[i]];
        else if (cl == 2)
            id = t->char_id[((u[i] & 0x1F) << 6) | (u[i + 1] & 0x3F)];
        else
            id = tok_vocab_find(t, w + i, cl);
        if (id >= 0) {
            sym[ns].id = id;
            ns++;
            last_unk = false;
        } else {
            bool bytes_ok = t->byte_fallback;
            for (size_t k = 0; bytes_ok && k < cl; k++)
                bytes_ok = t->byte_id[u[i + k]] >= 0;
            if (bytes_ok) {
                for (size_t k = 0; k < cl; k++)
                    sym[ns++].id = t->byte_id[u[i + k]];
                last_unk = false;
            } else if (t->unk_id >= 0) {
                if (!(t->fuse_unk && last_unk))
                    sym[ns++].id = t->unk_id;
                last_unk = true;
            } /* no unk token: the char is dropped, as HF does */
        }
        i += cl;
    }
    for (int32_t k = 0; k < ns; k++) {
        sym[k].prev = k - 1;
        sym[k].next = k + 1 < ns ? k + 1 : -1;
    }
    size_t nh = 0;
    for (int32_t k = 0; k + 1 < ns; k++)
        add_cand(t, sym, heap, &nh, k);
    while (nh > 0) {
        bpe_cand c = heap_pop(heap, &nh);
        int32_t l = (int32_t)(uint32_t)c.key;
        if (sym[l].id != c.lid || sym[l].next != c.right || sym[c.right].id != c.rid)
            continue; /* stale: one side was merged since */
        int32_t r = c.right;
        sym[l].id = c.nid;
        sym[l].next = sym[r].next;
        if (sym[r].next >= 0)
            sym[sym[r].next].prev = l;
        sym[r].id = -1;
        sym[r].next = -1;
        if (sym[l].prev >= 0)
            add_cand(t, sym, heap, &nh, sym[l].prev);
        add_cand(t, sym, heap, &nh, l);
    }
    for (int32_t k = ns > 0 ? 0 : -1; k >= 0; k = sym[k].next)
        if (!tok_enc_push(e, sym[k].id))
            return PG_ENOMEM;
    return PG_OK;
}
