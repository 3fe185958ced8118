/* tok_normalize: the normalizers the Llama families use — Sequence,
 * Prepend (only a non-empty piece gets it), Replace (String or Regex
 * pattern, literal content), Strip (Unicode whitespace). The Unicode
 * normalization forms (NFC, NFKC, ...), Lowercase and the SentencePiece
 * "Precompiled" charsmap are refused at load with PG_EUNSUPPORTED. */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

static int load_one(tokenizer *t, const json_doc *d, int node, const char *label, int depth,
                    void *ctx, pg_error *err)
{
    if (json_is_null(d, node))
        return PG_OK;
    if (!json_is_object(d, node))
        return pg_error_set(err, PG_EFORMAT, "%s: normalizer: expected an object", label);
    int ty = json_obj_get(d, node, "type");
    if (json_str_eq(d, ty, "Sequence"))
        return tok_load_sequence(t, d, node, "normalizers", "normalizer", label, depth, load_one,
                                 ctx, err);
    tok_norm *p = realloc(t->norm, ((size_t)t->n_norm + 1) * sizeof *p);
    if (!p)
        return pg_error_set(err, PG_ENOMEM, "%s: out of memory", label);
    t->norm = p;
    tok_norm *nm = &t->norm[t->n_norm];
    memset(nm, 0, sizeof *nm);
    int rc;
    if (json_str_eq(d, ty, "Prepend")) {
        nm->kind = TOK_NORM_PREPEND;
        if ((rc = tok_json_strdup(d, json_obj_get(d, node, "prepend"), &nm->a, &nm->a_len, label,
                                  "normalizer Prepend.prepend", err)))
            return rc;
    } else if (json_str_eq(d, ty, "Replace")) {
        nm->kind = TOK_NORM_REPLACE;
        t->n_norm++; /* owned from here on, freed by tok_norm_free */
        int pat = json_obj_get(d, node, "pattern");
        int ps = json_obj_get(d, pat, "String"), pr = json_obj_get(d, pat, "Regex");
        if ((rc = tok_json_strdup(d, ps >= 0 ? ps : pr, &nm->a, &nm->a_len, label,
                                  "normalizer Replace.pattern", err)))
            return rc;
        if ((rc = tok_json_strdup(d, json_obj_get(d, node, "content"), &nm->b, &nm->b_len, label,
                                  "normalizer Replace.content", err)))
            return rc;
        if (ps < 0 && !(nm->re = tok_regex_compile(nm->a, nm->a_len, false, label, err)))
            return PG_EFORMAT;
        if (ps >= 0 && nm->a_len == 0)
            return pg_error_set(err, PG_EFORMAT, "%s: normalizer Replace: empty pattern", label);
        return PG_OK;
    } else if (json_str_eq(d, ty, "Strip")) {
        nm->kind = TOK_NORM_STRIP;
        nm->left = tok_json_bool(d, node, "strip_left", true);
        nm->right = tok_json_bool(d, node, "strip_right", true);
    } else {
        size_t n = 0;
        const char *r = ty >= 0 ? json_raw(d, ty, &n) : "";
        return pg_error_set(err, PG_EUNSUPPORTED,
                            "%s: normalizer type '%.*s' is not supported (expected Sequence, "
                            "Prepend, Replace or Strip)",
                            label, (int)n, r);
    }
    t->n_norm++;
    return PG_OK;
}

int tok_norm_load(tokenizer *t, const json_doc *d, int node, const char *label, pg_error *err)
{
    if (node < 0)
        return PG_OK;
    return load_one(t, d, node, label, 0, NULL, err);
}

void tok_norm_free(tokenizer *t)
{
    for (int k = 0; k < t->n_norm; k++) {
        free(t->norm[k].a);
        free(t->norm[k].b);
        pcre2_code_free(t->norm[k].re);
    }
    free(t->norm);
}

static int replace_all(tok_enc *e, const tok_norm *nm, const char *s, size_t n, tok_buf *out)
{
    out->len = 0;
    size_t pos = 0;
    if (!nm->re) {
        while (pos + nm->a_len <= n) {
            const char *f = nm->a_len == 1 ? memchr(s + pos, nm->a[0], n - pos) : NULL;
            if (nm->a_len != 1) {
                f = NULL;
                for (size_t i = pos; i + nm->a_len <= n; i++)
                    if (s[i] == nm->a[0] && memcmp(s + i, nm->a, nm->a_len) == 0) {
                        f = s + i;
                        break;
                    }
            }
            if (!f)
                break;
            size_t at = (size_t)(f - s);
            if (!tok_buf_put(out, s + pos, at - pos) || !tok_buf_put(out, nm->b, nm->b_len))
                return PG_ENOMEM;
            pos = at + nm->a_len;
        }
    } else {
        while (pos <= n) {
            int m = pcre2_match(nm->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, e->md, NULL);
            if (m < 0)
                break;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
            if (!tok_buf_put(out, s + pos, ov[0] - pos) || !tok_buf_put(out, nm->b, nm->b_len))
                return PG_ENOMEM;
            if (ov[1] == ov[0]) { /* empty match: copy one char and go on */
                if (ov[0] >= n) {
                    pos = n + 1;
                    break;
                }
                size_t cl = tok_utf8_len((unsigned char)s[ov[0]]);
                if (!tok_buf_put(out, s + ov[0], cl))
                    return PG_ENOMEM;
                pos = ov[0] + cl;
            } else {
                pos = ov[1];
            }
        }
        if (pos > n)
            pos = n;
    }
    return tok_buf_put(out, s + pos, n - pos) ? PG_OK : PG_ENOMEM;
}

static int strip_ws(const tok_norm *nm, const char *s, size_t n, tok_buf *out)
{
    size_t a = 0, b = n, cl;
    while (nm->left && a < b && tok_is_whitespace(tok_utf8_decode((const unsigned char *)s + a, &cl)))
        a += cl;
    while (nm->right && b > a) {
        size_t i = b - 1;
        while (i > a && ((unsigned char)s[i] & 0xC0) == 0x80)
            i--;
        if (!tok_is_whitespace(tok_utf8_decode((const unsigned char *)s + i, &cl)))
            break;
        b = i;
    }
    out->len = 0;
    return tok_buf_put(out, s + a, b - a) ? PG_OK : PG_ENOMEM;
}

int tok_normalize(const tokenizer *t, tok_enc *e, const char *s, size_t n, tok_buf *out)
{
    out->len = 0;
    if (!tok_buf_put(out, s, n))
        return PG_ENOMEM;
    for (int k = 0; k < t->n_norm; k++) {
        const tok_norm *nm = &t->norm[k];
        tok_buf *tmp = &e->norm_tmp;
        int rc = PG_OK;
        switch (nm->kind) {
        case TOK_NORM_PREPEND:
            if (out->len == 0)
                continue;
            tmp->len = 0;
            if (!tok_buf_put(tmp, nm->a, nm->a_len) || !tok_buf_put(tmp, out->p, out->len))
                rc = PG_ENOMEM;
            break;
        case TOK_NORM_REPLACE:
            rc = replace_all(e, nm, out->p, out->len, tmp);
            break;
        case TOK_NORM_STRIP:
            rc = strip_ws(nm, out->p, out->len, tmp);
            break;
        }
        if (rc)
            return rc;
        tok_buf sw = *out;
        *out = *tmp;
        *tmp = sw;
    }
    return PG_OK;
}
