/* tok_normalize: the normalizers the Llama and Qwen families use —
 * Sequence, Prepend (only a non-empty piece gets it), Replace (String or
 * Regex pattern, literal content), Strip (Unicode whitespace) and the
 * Unicode normalization forms NFC (Qwen2/2.5/3), NFD, NFKC, NFKD.
 * Lowercase, BertNormalizer and the SentencePiece "Precompiled" charsmap
 * are refused at load with PG_EUNSUPPORTED.
 *
 * The normalization forms run on libutf8proc (Debian libutf8proc-dev), not
 * on tables of our own: NFC needs the canonical decompositions, combining
 * classes and composition exclusions of the whole UCD, which change with
 * every Unicode release; utf8proc is small (one C file, no dependencies),
 * made for exactly this, passes Unicode's NormalizationTest.txt and is
 * regenerated from each new UCD. ICU would do too but is a 36 MB
 * dependency (libicu72) for one function. Version skew (tokenizer/README.md): HF
 * tokenizers normalizes with the Rust crate unicode-normalization-alignments
 * 0.1.12 (Unicode 9.0.0); Debian bookworm's utf8proc 2.8.0 is Unicode
 * 15.0.0. By Unicode's normalization stability policy the two agree on
 * every text whose characters were assigned by Unicode 9.0; they can differ
 * only around characters assigned later (a newer combining mark is
 * reordered or composed here, left alone by Unicode 9 tables). */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tok_internal.h"

/* HF normalizer type -> utf8proc options (utf8proc_NFC & co. without
 * UTF8PROC_NULLTERM: a text may contain U+0000). */
static const struct {
    const char *name;
    int form;
} unicode_forms[] = {
    {"NFC", UTF8PROC_STABLE | UTF8PROC_COMPOSE},
    {"NFD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE},
    {"NFKC", UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT},
    {"NFKD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT},
};

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
        for (size_t k = 0; k < sizeof unicode_forms / sizeof unicode_forms[0]; k++)
            if (json_str_eq(d, ty, unicode_forms[k].name)) {
                nm->kind = TOK_NORM_UNICODE;
                nm->form = unicode_forms[k].form;
                t->n_norm++;
                return PG_OK;
            }
        size_t n = 0;
        const char *r = ty >= 0 ? json_raw(d, ty, &n) : "";
        return pg_error_set(err, PG_EUNSUPPORTED,
                            "%s: normalizer type '%.*s' is not supported (expected Sequence, "
                            "Prepend, Replace, Strip, NFC, NFD, NFKC or NFKD)",
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

/* The forms are computed per segment. A character below U+0300 (lead
 * byte below 0xCC) has NFC_Quick_Check=Yes and combining class 0, and is
 * never the second character of a canonical composition (those are
 * combining marks, U+0300 and up, and later scripts' vowel signs), so NFC
 * never moves or merges anything across it: NFC(a + b) = NFC(a) + NFC(b)
 * when b starts with such a character (tests/tokenizer checks this on
 * utf8proc's own data). The other forms change Latin-1 already (é, NBSP),
 * so for them only ASCII splits. Runs of such characters are copied; only
 * the segments from the character before a higher one to the next such
 * character go through utf8proc. */
static unsigned char split_limit(int form)
{
    return form == (UTF8PROC_STABLE | UTF8PROC_COMPOSE) ? 0xCC : 0x80;
}

/* utf8proc on one segment: it decomposes into code points (canonically
 * ordered), then utf8proc_reencode composes and writes UTF-8 over the
 * same buffer. Appends to out. */
static int unicode_segment(tok_enc *e, utf8proc_option_t opt, const char *s, size_t n,
                           tok_buf *out)
{
    utf8proc_ssize_t r;
    for (;;) {
        r = utf8proc_decompose((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n,
                               (utf8proc_int32_t *)e->ucs, (utf8proc_ssize_t)e->ucs_cap, opt);
        if (r < 0 || (size_t)r <= e->ucs_cap)
            break;
        size_t cap = (size_t)r + n / 4 + 16;
        int32_t *p = realloc(e->ucs, cap * sizeof *p);
        if (!p)
            return PG_ENOMEM;
        e->ucs = p;
        e->ucs_cap = cap;
    }
    if (r >= 0)
        r = utf8proc_reencode((utf8proc_int32_t *)e->ucs, r, opt);
    if (r < 0)
        return r == UTF8PROC_ERROR_NOMEM || r == UTF8PROC_ERROR_OVERFLOW
                   ? PG_ENOMEM
                   : pg_error_set(e->err, PG_EINVAL, "tokenizer: normalizer: utf8proc: %s",
                                  utf8proc_errmsg(r));
    return tok_buf_put(out, e->ucs, (size_t)r) ? PG_OK : PG_ENOMEM;
}

/* NFC/NFD/NFKC/NFKD of the (valid UTF-8) s into out. */
static int unicode_form(tok_enc *e, const tok_norm *nm, const char *s, size_t n, tok_buf *out)
{
    const unsigned char *u = (const unsigned char *)s;
    unsigned char limit = split_limit(nm->form);
    out->len = 0;
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && u[j] < limit) /* from a char boundary, a byte >= limit is a lead byte */
            j++;
        if (j == n)
            break;
        size_t k = j; /* the segment starts at the character before j, if any */
        if (k > i) {
            k--;
            while (k > i && (u[k] & 0xC0) == 0x80)
                k--;
        }
        size_t m = j + tok_utf8_len(u[j]); /* and ends before the next char below limit */
        while (m < n && u[m] >= limit)
            m += tok_utf8_len(u[m]);
        if (!tok_buf_put(out, s + i, k - i))
            return PG_ENOMEM;
        int rc = unicode_segment(e, (utf8proc_option_t)nm->form, s + k, m - k, out);
        if (rc)
            return rc;
        i = m;
    }
    return tok_buf_put(out, s + i, n - i) ? PG_OK : PG_ENOMEM;
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
        case TOK_NORM_UNICODE:
            rc = unicode_form(e, nm, out->p, out->len, tmp);
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
