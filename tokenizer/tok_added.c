/* tok_added: added tokens (tokenizer.json "added_tokens") and splitting a
 * text on them, as Hugging Face's AddedVocabulary does: leftmost-longest
 * matches over a byte trie (HF uses Aho-Corasick LeftmostLongest), then
 * single_word / lstrip / rstrip applied to each match. Tokens with
 * normalized == false are matched in the raw text, the others in each
 * normalized piece. */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

int tok_added_load(tokenizer *t, const json_doc *d, int arr, const char *label, pg_error *err)
{
    if (arr < 0 || json_is_null(d, arr))
        return PG_OK;
    if (!json_is_array(d, arr))
        return pg_error_set(err, PG_EFORMAT, "%s: added_tokens: expected an array", label);
    int n = json_size(d, arr);
    t->added = calloc((size_t)n + 1, sizeof *t->added);
    if (!t->added)
        return pg_error_set(err, PG_ENOMEM, "%s: out of memory", label);
    int i = arr + 1;
    for (int k = 0; k < n; k++, i = json_skip(d, i)) {
        tok_added_token *a = &t->added[k];
        int64_t id;
        if (!json_is_object(d, i) || json_get_int(d, json_obj_get(d, i, "id"), 0, INT32_MAX - 1,
                                                  &id, NULL))
            return pg_error_set(err, PG_EFORMAT,
                                "%s: added_tokens[%d]: expected an object with an integer id",
                                label, k);
        int rc = tok_json_strdup(d, json_obj_get(d, i, "content"), &a->content, &a->content_len,
                                 label, "added_tokens[].content", err);
        if (rc)
            return rc;
        t->n_added = k + 1;
        if (a->content_len == 0 ||
            tok_utf8_valid_prefix((const unsigned char *)a->content, a->content_len) !=
                a->content_len)
            return pg_error_set(err, PG_EFORMAT,
                                "%s: added_tokens[%d]: expected non-empty UTF-8 content", label, k);
        a->id = (int32_t)id;
        a->special = tok_json_bool(d, i, "special", false);
        a->lstrip = tok_json_bool(d, i, "lstrip", false);
        a->rstrip = tok_json_bool(d, i, "rstrip", false);
        a->single_word = tok_json_bool(d, i, "single_word", false);
        a->normalized = tok_json_bool(d, i, "normalized", !a->special);
    }
    return PG_OK;
}

static int32_t new_node(tok_trie *tr, unsigned char b)
{
    if (tr->n == tr->cap) {
        int32_t cap = tr->cap ? tr->cap * 2 : 64;
        tok_trie_node *p = realloc(tr->nodes, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        tr->nodes = p;
        tr->cap = cap;
    }
    tok_trie_node *nd = &tr->nodes[tr->n];
    nd->child = nd->sibling = nd->token = -1;
    nd->byte = b;
    return tr->n++;
}

int tok_trie_insert(tok_trie *tr, const char *s, size_t n, int32_t token)
{
    if (tr->cap == 0)
        memset(tr->root, 0xFF, sizeof tr->root);
    if (n == 0)
        return PG_OK;
    const unsigned char *u = (const unsigned char *)s;
    int32_t cur = tr->root[u[0]];
    if (cur < 0) {
        if ((cur = new_node(tr, u[0])) < 0)
            return PG_ENOMEM;
        tr->root[u[0]] = cur;
    }
    for (size_t i = 1; i < n; i++) {
        int32_t c = tr->nodes[cur].child;
        while (c >= 0 && tr->nodes[c].byte != u[i])
            c = tr->nodes[c].sibling;
        if (c < 0) {
            if ((c = new_node(tr, u[i])) < 0)
                return PG_ENOMEM;
            tr->nodes[c].sibling = tr->nodes[cur].child;
            tr->nodes[cur].child = c;
        }
        cur = c;
    }
    if (tr->nodes[cur].token < 0) /* the same content twice: the first wins */
        tr->nodes[cur].token = token;
    return PG_OK;
}

void tok_trie_free(tok_trie *tr)
{
    free(tr->nodes);
    memset(tr, 0, sizeof *tr);
}

int32_t tok_trie_match(const tok_trie *tr, const char *s, size_t n, size_t pos, size_t *mlen)
{
    const unsigned char *u = (const unsigned char *)s;
    int32_t cur = tr->root[u[pos]];
    int32_t best = -1;
    size_t i = pos;
    while (cur >= 0) {
        i++;
        if (tr->nodes[cur].token >= 0) {
            best = tr->nodes[cur].token;
            *mlen = i - pos;
        }
        if (i >= n)
            break;
        int32_t c = tr->nodes[cur].child;
        while (c >= 0 && tr->nodes[c].byte != u[i])
            c = tr->nodes[c].sibling;
        cur = c;
    }
    return best;
}

/* Start of the char that ends at s[end) (s valid UTF-8). */
static size_t char_before(const char *s, size_t end)
{
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80)
        i--;
    return i;
}

/* Rust's `c.is_alphanumeric() || c == '_'` — exact for ASCII; any other
 * non-whitespace char counts as a word char (approximation: no Unicode
 * tables here; only single_word tokens use it). */
static bool is_word_cp(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
               cp == '_';
    return !tok_is_whitespace(cp);
}

int tok_added_split(tok_enc *e, const tok_trie *tr, const char *s, size_t n, size_t base_off,
                    tok_piece_fn piece)
{
    const tokenizer *t = e->t;
    size_t done = 0, pos = 0;
    int rc;
    if (tr->n == 0)
        return piece(e, s, n, base_off);
    while (pos < n) {
        if (tr->root[(unsigned char)s[pos]] < 0) {
            pos++;
            continue;
        }
        size_t mlen = 0;
        int32_t ti = tok_trie_match(tr, s, n, pos, &mlen);
        if (ti < 0) {
            pos++;
            continue;
        }
        const tok_added_token *a = &t->added[ti];
        size_t ms = pos, me = pos + mlen, cl;
        if (a->single_word) {
            bool ok = true;
            if (ms > 0) {
                size_t b = char_before(s, ms);
                ok = !is_word_cp(tok_utf8_decode((const unsigned char *)s + b, &cl));
            }
            if (ok && me < n)
                ok = !is_word_cp(tok_utf8_decode((const unsigned char *)s + me, &cl));
            if (!ok) {
                pos = me; /* HF's matcher resumes after the rejected match */
                continue;
            }
        }
        if (a->lstrip) {
            while (ms > done) {
                size_t b = char_before(s, ms);
                if (!tok_is_whitespace(tok_utf8_decode((const unsigned char *)s + b, &cl)))
                    break;
                ms = b;
            }
        }
        if (a->rstrip) {
            while (me < n) {
                uint32_t cp = tok_utf8_decode((const unsigned char *)s + me, &cl);
                if (!tok_is_whitespace(cp))
                    break;
                me += cl;
            }
        }
        if (ms > done && (rc = piece(e, s + done, ms - done, base_off + done)))
            return rc;
        if (!tok_enc_push(e, a->id))
            return PG_ENOMEM;
        done = pos = me;
    }
    if (done < n)
        return piece(e, s + done, n - done, base_off + done);
    return PG_OK;
}
