/* tokenizer: loading a tokenizer.json (+ tokenizer_config.json) and the
 * encode pipeline; the stages live in tok_*.c (see tok_internal.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file_io.h"
#include "tok_internal.h"

#define TOK_MAX_FILE_BYTES ((size_t)512 << 20)

bool tok_enc_push(tok_enc *e, int32_t id)
{
    if (e->n == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 256;
        int32_t *p = realloc(e->ids, cap * sizeof *p);
        if (!p)
            return false;
        e->ids = p;
        e->cap = cap;
    }
    e->ids[e->n++] = id;
    return true;
}

static bool has_regex(const tokenizer *t)
{
    for (int k = 0; k < t->n_pre; k++)
        if (t->pre[k].re)
            return true;
    for (int k = 0; k < t->n_norm; k++)
        if (t->norm[k].re)
            return true;
    return false;
}

static int enc_init(tok_enc *e, const tokenizer *t, pg_error *err)
{
    memset(e, 0, sizeof *e);
    e->t = t;
    e->err = err;
    if (!has_regex(t))
        return PG_OK;
    e->md = pcre2_match_data_create(4, NULL);
    if (!e->md)
        return pg_error_set(err, PG_ENOMEM, "tok_encode: out of memory");
    /* mctx/jit (a bigger JIT stack) are made only if a match runs out of
     * the default 32 KiB one (tok_pretok.c) */
    return PG_OK;
}

static void enc_free(tok_enc *e)
{
    free(e->ids);
    pcre2_match_data_free(e->md);
    pcre2_match_context_free(e->mctx);
    pcre2_jit_stack_free(e->jit);
    tok_buf_free(&e->norm_buf);
    tok_buf_free(&e->norm_tmp);
    free(e->ucs);
    for (int k = 0; k <= TOK_MAX_PRE; k++) {
        tok_buf_free(&e->depth_buf[k]);
        tok_buf_free(&e->map_buf[k]);
    }
    free(e->sym);
    free(e->heap);
}

static int piece_norm(tok_enc *e, const char *s, size_t n, size_t orig_off)
{
    return tok_pretok_run(e, s, n, orig_off == 0);
}

/* A piece of the raw text between added tokens: normalize it, split it on
 * the normalized added tokens, pre-tokenize and BPE the rest. */
static int piece_raw(tok_enc *e, const char *s, size_t n, size_t orig_off)
{
    const tokenizer *t = e->t;
    if (t->n_norm == 0)
        return tok_added_split(e, &t->trie_norm, s, n, orig_off, piece_norm);
    int rc = tok_normalize(t, e, s, n, &e->norm_buf);
    if (rc)
        return rc;
    /* nothing below touches norm_buf (pre-tokenizers use their own buffers) */
    return tok_added_split(e, &t->trie_norm, e->norm_buf.p, e->norm_buf.len, orig_off,
                           piece_norm);
}

int tok_encode(const tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids,
               size_t *n_ids, pg_error *err)
{
    *ids = NULL;
    *n_ids = 0;
    if (!t || (len && !text))
        return pg_error_set(err, PG_EINVAL, "tok_encode: null argument");
    size_t ok = tok_utf8_valid_prefix((const unsigned char *)text, len);
    if (ok != len)
        return pg_error_set(err, PG_EINVAL,
                            "tok_encode: expected UTF-8 text, found invalid byte 0x%02x at offset %zu",
                            (unsigned char)text[ok], ok);
    tok_enc e;
    int rc = enc_init(&e, t, err);
    for (size_t k = 0; !rc && add_special && k < t->n_prefix; k++)
        if (!tok_enc_push(&e, t->tmpl_prefix[k]))
            rc = PG_ENOMEM;
    if (!rc && len)
        rc = tok_added_split(&e, &t->trie_raw, text, len, 0, piece_raw);
    for (size_t k = 0; !rc && add_special && k < t->n_suffix; k++)
        if (!tok_enc_push(&e, t->tmpl_suffix[k]))
            rc = PG_ENOMEM;
    if (!rc && !e.ids && !(e.ids = malloc(sizeof(int32_t)))) /* empty: still malloc'd */
        rc = PG_ENOMEM;
    if (rc) {
        if (rc == PG_ENOMEM)
            pg_error_set(err, rc, "tok_encode: out of memory for a text of %zu bytes", len);
        enc_free(&e);
        return rc;
    }
    *ids = e.ids;
    *n_ids = e.n;
    e.ids = NULL;
    enc_free(&e);
    return PG_OK;
}

/* ---- loading ---- */

static int32_t find_token_id(const tokenizer *t, const char *s, size_t n)
{
    for (int32_t k = 0; k < t->n_added; k++)
        if (t->added[k].content_len == n && memcmp(t->added[k].content, s, n) == 0)
            return t->added[k].id;
    return tok_vocab_find(t, s, n);
}

static int load_post(tokenizer *t, const json_doc *d, int node, const char *label, int depth,
                     void *ctx, pg_error *err)
{
    if (node < 0 || json_is_null(d, node))
        return PG_OK;
    int ty = json_obj_get(d, node, "type");
    if (json_str_eq(d, ty, "ByteLevel"))
        return PG_OK; /* offsets only */
    if (json_str_eq(d, ty, "Sequence"))
        return tok_load_sequence(t, d, node, "processors", "post_processor", label, depth,
                                 load_post, ctx, err);
    if (!json_str_eq(d, ty, "TemplateProcessing"))
        return pg_error_set(err, PG_EUNSUPPORTED,
                            "%s: post_processor: expected TemplateProcessing, ByteLevel or Sequence",
                            label);
    int single = json_obj_get(d, node, "single");
    int specials = json_obj_get(d, node, "special_tokens");
    if (!json_is_array(d, single))
        return pg_error_set(err, PG_EFORMAT, "%s: post_processor.single: expected an array", label);
    bool seen_a = false;
    int i = single + 1;
    for (int k = 0; k < json_size(d, single); k++, i = json_skip(d, i)) {
        int sp = json_obj_get(d, i, "SpecialToken");
        if (json_obj_get(d, i, "Sequence") >= 0) {
            if (seen_a)
                return pg_error_set(err, PG_EUNSUPPORTED,
                                    "%s: post_processor.single: more than one sequence", label);
            seen_a = true;
            continue;
        }
        char name[256];
        size_t nl;
        int ids;
        if (sp < 0 || json_get_string_buf(d, json_obj_get(d, sp, "id"), name, sizeof name, &nl, err) ||
            !json_is_array(d, ids = json_obj_get(d, json_obj_get(d, specials, name), "ids")))
            return pg_error_set(err, PG_EFORMAT,
                                "%s: post_processor.single[%d]: expected a SpecialToken listed in "
                                "special_tokens with ids",
                                label, k);
        int j = ids + 1;
        for (int m = 0; m < json_size(d, ids); m++, j = json_skip(d, j)) {
            int64_t id;
            if (json_get_int(d, j, 0, INT32_MAX - 1, &id, err))
                return pg_error_wrap(err, PG_EFORMAT, "%s: post_processor special token '%s'",
                                     label, name);
            int32_t **arr = seen_a ? &t->tmpl_suffix : &t->tmpl_prefix;
            size_t *cnt = seen_a ? &t->n_suffix : &t->n_prefix;
            int32_t *p = realloc(*arr, (*cnt + 1) * sizeof *p);
            if (!p)
                return pg_error_set(err, PG_ENOMEM, "%s: out of memory", label);
            p[(*cnt)++] = (int32_t)id;
            *arr = p;
        }
    }
    return PG_OK;
}

/* The id of a special-token entry of tokenizer_config.json: a string or
 * {"content": ...}; -1 when absent/unknown. */
static int32_t config_token(const tokenizer *t, const json_doc *c, const char *key)
{
    int v = json_obj_get(c, 0, key);
    if (json_is_object(c, v))
        v = json_obj_get(c, v, "content");
    if (!json_is_string(c, v))
        return -1;
    char *s = NULL;
    size_t n;
    if (json_get_string(c, v, &s, &n, NULL))
        return -1;
    int32_t id = find_token_id(t, s, n);
    free(s);
    return id;
}

static int load_config(tokenizer *t, const char *cj, size_t cl, const char *label, pg_error *err)
{
    json_doc c;
    char lab[300];
    snprintf(lab, sizeof lab, "%s (tokenizer_config)", label);
    int rc = json_parse(&c, cj, cl, lab, err);
    if (rc)
        return rc;
    if (!json_is_object(&c, 0)) {
        json_doc_free(&c);
        return pg_error_set(err, PG_EFORMAT, "%s: expected an object", lab);
    }
    t->cleanup = tok_json_bool(&c, 0, "clean_up_tokenization_spaces", false);
    int32_t bos = config_token(t, &c, "bos_token"), eos = config_token(t, &c, "eos_token");
    if (bos >= 0)
        t->bos_id = bos;
    if (eos >= 0)
        t->eos_id = eos;
    /* transformers' LlamaTokenizerFast/CodeLlamaTokenizerFast rebuild the
     * template from add_bos_token / add_eos_token (update_post_processor). */
    int cls = json_obj_get(&c, 0, "tokenizer_class");
    bool llama = json_str_eq(&c, cls, "LlamaTokenizer") || json_str_eq(&c, cls, "LlamaTokenizerFast") ||
                 json_str_eq(&c, cls, "CodeLlamaTokenizer") ||
                 json_str_eq(&c, cls, "CodeLlamaTokenizerFast");
    int ab = json_obj_get(&c, 0, "add_bos_token"), ae = json_obj_get(&c, 0, "add_eos_token");
    if (llama && (json_is_bool(&c, ab) || json_is_bool(&c, ae))) {
        bool add_bos = tok_json_bool(&c, 0, "add_bos_token", true);
        bool add_eos = tok_json_bool(&c, 0, "add_eos_token", false);
        if ((add_bos && t->bos_id < 0) || (add_eos && t->eos_id < 0)) {
            json_doc_free(&c);
            return pg_error_set(err, PG_EFORMAT, "%s: add_bos/eos_token set but no bos/eos token",
                                lab);
        }
        free(t->tmpl_prefix);
        free(t->tmpl_suffix);
        t->tmpl_prefix = malloc(sizeof(int32_t));
        t->tmpl_suffix = malloc(sizeof(int32_t));
        t->n_prefix = t->n_suffix = 0;
        if (!t->tmpl_prefix || !t->tmpl_suffix) {
            json_doc_free(&c);
            return pg_error_set(err, PG_ENOMEM, "%s: out of memory", lab);
        }
        if (add_bos)
            t->tmpl_prefix[t->n_prefix++] = t->bos_id;
        if (add_eos)
            t->tmpl_suffix[t->n_suffix++] = t->eos_id;
    }
    json_doc_free(&c);
    return PG_OK;
}

static int build_tables(tokenizer *t, const char *label, pg_error *err)
{
    int32_t n = t->mv_n;
    for (int32_t k = 0; k < t->n_added; k++)
        if (t->added[k].id + 1 > n)
            n = t->added[k].id + 1;
    t->n_ids = n;
    t->piece = calloc((size_t)n + 1, sizeof *t->piece);
    t->piece_len = calloc((size_t)n + 1, sizeof *t->piece_len);
    t->is_special = calloc((size_t)n + 1, 1);
    if (!t->piece || !t->piece_len || !t->is_special)
        return pg_error_set(err, PG_ENOMEM, "%s: out of memory", label);
    for (int32_t id = 0; id < t->mv_n; id++) {
        if (t->mv_off[id] == UINT32_MAX)
            continue;
        t->piece[id] = t->mv_arena + t->mv_off[id];
        t->piece_len[id] = t->mv_len[id];
    }
    for (int32_t k = 0; k < t->n_added; k++) {
        const tok_added_token *a = &t->added[k];
        t->piece[a->id] = a->content;
        t->piece_len[a->id] = (uint32_t)a->content_len;
        t->is_special[a->id] = a->special;
    }
    /* tries: raw-text tokens, and normalized ones with normalized keys */
    memset(t->trie_raw.root, 0xFF, sizeof t->trie_raw.root);
    memset(t->trie_norm.root, 0xFF, sizeof t->trie_norm.root);
    tok_enc e;
    int rc = enc_init(&e, t, err);
    for (int32_t k = 0; k < t->n_added && !rc; k++) {
        const tok_added_token *a = &t->added[k];
        if (!a->normalized || t->n_norm == 0) {
            rc = tok_trie_insert(a->normalized ? &t->trie_norm : &t->trie_raw, a->content,
                                 a->content_len, k);
        } else if (!(rc = tok_normalize(t, &e, a->content, a->content_len, &e.norm_buf))) {
            rc = tok_trie_insert(&t->trie_norm, e.norm_buf.p, e.norm_buf.len, k);
        }
    }
    enc_free(&e);
    if (rc)
        return pg_error_set(err, rc, "%s: building the added-token matcher: %s", label,
                            pg_status_name(rc));
    return PG_OK;
}

int tok_load_from_memory(tokenizer **out, const char *json, size_t len, const char *config_json,
                         size_t config_len, const char *label, pg_error *err)
{
    *out = NULL;
    if (!label)
        label = "tokenizer.json";
    if (!json)
        return pg_error_set(err, PG_EINVAL, "%s: no json text", label);
    tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return pg_error_set(err, PG_ENOMEM, "%s: out of memory", label);
    t->bos_id = t->eos_id = t->unk_id = -1;
    json_doc d;
    int rc = json_parse(&d, json, len, label, err);
    if (rc) {
        free(t);
        return rc;
    }
    if (!json_is_object(&d, 0)) {
        rc = pg_error_set(err, PG_EFORMAT, "%s: expected a json object", label);
        goto fail;
    }
    if ((rc = tok_bpe_load(t, &d, json_obj_get(&d, 0, "model"), label, err)) ||
        (rc = tok_added_load(t, &d, json_obj_get(&d, 0, "added_tokens"), label, err)) ||
        (rc = tok_norm_load(t, &d, json_obj_get(&d, 0, "normalizer"), label, err)) ||
        (rc = tok_pre_load(t, &d, json_obj_get(&d, 0, "pre_tokenizer"), label, err)) ||
        (rc = tok_decoder_load(t, &d, json_obj_get(&d, 0, "decoder"), label, err)) ||
        (rc = load_post(t, &d, json_obj_get(&d, 0, "post_processor"), label, 0, NULL, err)) ||
        (rc = build_tables(t, label, err)))
        goto fail;
    for (int32_t k = 0; k < t->n_added; k++)
        if (t->added[k].id < 0 || t->added[k].id >= t->n_ids) {
            rc = pg_error_set(err, PG_EFORMAT, "%s: added token id out of range", label);
            goto fail;
        }
    if (t->n_prefix > 0)
        t->bos_id = t->tmpl_prefix[0];
    if (t->eos_id < 0) {
        int32_t id = find_token_id(t, "</s>", 4);
        if (id >= 0 && t->is_special[id])
            t->eos_id = id;
    }
    if (config_json && (rc = load_config(t, config_json, config_len, label, err)))
        goto fail;
    for (size_t k = 0; k < t->n_prefix + t->n_suffix; k++) {
        int32_t id = k < t->n_prefix ? t->tmpl_prefix[k] : t->tmpl_suffix[k - t->n_prefix];
        if (id < 0 || id >= t->n_ids) {
            rc = pg_error_set(err, PG_EFORMAT, "%s: post_processor token id %d out of range", label,
                              (int)id);
            goto fail;
        }
    }
    json_doc_free(&d);
    *out = t;
    return PG_OK;
fail:
    json_doc_free(&d);
    tok_free(t);
    return rc;
}

int tok_load(tokenizer **out, const char *dir, pg_error *err)
{
    *out = NULL;
    char path[4096], cpath[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", dir);
    char *json = NULL, *cj = NULL;
    size_t len = 0, cl = 0;
    int rc = pg_read_file(path, TOK_MAX_FILE_BYTES, &json, &len, err);
    if (rc)
        return rc;
    if (pg_file_exists(cpath) && (rc = pg_read_file(cpath, TOK_MAX_FILE_BYTES, &cj, &cl, err))) {
        pg_file_free(json);
        return rc;
    }
    rc = tok_load_from_memory(out, json, len, cj, cl, path, err);
    pg_file_free(json);
    pg_file_free(cj);
    return rc;
}

void tok_free(tokenizer *t)
{
    if (!t)
        return;
    tok_bpe_free(t);
    for (int32_t k = 0; k < t->n_added; k++)
        free(t->added[k].content);
    free(t->added);
    tok_trie_free(&t->trie_raw);
    tok_trie_free(&t->trie_norm);
    tok_norm_free(t);
    tok_pre_free(t);
    tok_decoder_free(t);
    free(t->tmpl_prefix);
    free(t->tmpl_suffix);
    free(t->piece);
    free(t->piece_len);
    free(t->is_special);
    free(t);
}

int32_t tok_vocab_size(const tokenizer *t) { return t->n_ids; }
int32_t tok_bos_id(const tokenizer *t) { return t->bos_id; }
int32_t tok_eos_id(const tokenizer *t) { return t->eos_id; }
bool tok_cleanup_default(const tokenizer *t) { return t->cleanup; }

bool tok_is_special(const tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && t->is_special[id];
}

const char *tok_piece(const tokenizer *t, int32_t id)
{
    if (id < 0 || id >= t->n_ids)
        return NULL;
    return t->piece[id];
}
