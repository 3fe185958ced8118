/* tok_pretok: pre-tokenizers — Split (String/Regex pattern, the five
 * SplitDelimiterBehaviors, invert), ByteLevel (add_prefix_space, GPT-2
 * regex, bytes -> printable chars), Metaspace (replacement, prepend_scheme,
 * split), Digits, and Sequence of them. Regexes run with PCRE2 in UTF+UCP
 * mode (JIT when available), standing in for HF's Oniguruma, with \s and
 * \S rewritten to Oniguruma's meaning (oniguruma_spaces below).
 *
 * A Sequence is run depth-first: stage k splits its piece and hands every
 * sub-piece to stage k+1; after the last stage each word goes to BPE. So no
 * list of pieces is ever built, whatever the text size. */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

/* GPT-2's byte-level pre-tokenizer pattern (HF pre_tokenizers/byte_level.rs). */
static const char gpt2_re[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* HF runs these patterns with Oniguruma, whose \s in UTF-8 is Unicode's
 * White_Space property (oniguruma src/make_unicode_property_data.py:
 * dic['Space'] = dic['White_Space']; CR_Space in unicode_property_data.c).
 * PCRE2's \s under PCRE2_UCP (10.42) is \h + \v, which adds U+180E
 * MONGOLIAN VOWEL SEPARATOR (a format character since Unicode 6.3). So
 * \s and \S become \p{White_Space} and \P{White_Space}, in and outside
 * classes; everything else is copied (a \Q...\E quote verbatim). Returns
 * a malloc'd pattern (*out_len bytes) or NULL when out of memory. */
static char *oniguruma_spaces(const char *pat, size_t len, size_t *out_len)
{
    size_t cap = 1;
    for (size_t i = 0; i < len; i++)
        cap += pat[i] == '\\' ? 16 : 1;
    char *o = malloc(cap), *w = o;
    if (!o)
        return NULL;
    bool quoted = false;
    for (size_t i = 0; i < len; i++) {
        if (pat[i] != '\\' || i + 1 == len) {
            *w++ = pat[i];
            continue;
        }
        char c = pat[++i];
        if (quoted && c == 'E')
            quoted = false;
        else if (!quoted && c == 'Q')
            quoted = true;
        if (!quoted && (c == 's' || c == 'S')) {
            memcpy(w, c == 's' ? "\\p{White_Space}" : "\\P{White_Space}", 15);
            w += 15;
        } else {
            *w++ = '\\';
            *w++ = c;
        }
    }
    *out_len = (size_t)(w - o);
    return o;
}

pcre2_code *tok_regex_compile(const char *pat, size_t len, bool literal, const char *label,
                              pg_error *err)
{
    int ec;
    PCRE2_SIZE eo;
    /* PCRE2_LITERAL admits UTF but not UCP */
    uint32_t opt = literal ? (PCRE2_UTF | PCRE2_LITERAL) : (PCRE2_UTF | PCRE2_UCP);
    size_t tl = len;
    char *tp = literal ? NULL : oniguruma_spaces(pat, len, &tl);
    if (!literal && !tp) {
        pg_error_set(err, PG_ENOMEM, "%s: out of memory", label);
        return NULL;
    }
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(tp ? tp : pat), tl, opt, &ec, &eo, NULL);
    free(tp);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        pg_error_set(err, PG_EFORMAT, "%s: regex '%.*s': %s at offset %zu", label,
                     (int)(len > 80 ? 80 : len), pat, (const char *)msg, (size_t)eo);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional: falls back to the interpreter */
    return re;
}

uint32_t tok_bytelevel_cp(unsigned b)
{
    if (b <= 32)
        return 256 + b;
    if (b >= 127 && b <= 160)
        return 256 + 33 + (b - 127);
    if (b == 173)
        return 256 + 67;
    return b;
}

int tok_bytelevel_byte(uint32_t cp)
{
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp >= 256 && cp <= 288)
        return (int)(cp - 256);
    if (cp >= 289 && cp <= 322)
        return (int)(cp - 289 + 127);
    if (cp == 323)
        return 173;
    return -1;
}

static int load_one(tokenizer *t, const json_doc *d, int node, const char *label, int depth,
                    void *ctx, pg_error *err)
{
    if (json_is_null(d, node))
        return PG_OK;
    if (!json_is_object(d, node))
        return pg_error_set(err, PG_EFORMAT, "%s: pre_tokenizer: expected an object", label);
    int ty = json_obj_get(d, node, "type");
    if (json_str_eq(d, ty, "Sequence"))
        return tok_load_sequence(t, d, node, "pretokenizers", "pre_tokenizer", label, depth,
                                 load_one, ctx, err);
    if (t->n_pre == TOK_MAX_PRE)
        return pg_error_set(err, PG_EUNSUPPORTED, "%s: more than %d pre-tokenizers", label,
                            TOK_MAX_PRE);
    tok_pre *p = &t->pre[t->n_pre];
    memset(p, 0, sizeof *p);
    if (json_str_eq(d, ty, "Split")) {
        p->kind = TOK_PRE_SPLIT;
        int pat = json_obj_get(d, node, "pattern");
        int ps = json_obj_get(d, pat, "String"), pr = json_obj_get(d, pat, "Regex");
        char *s = NULL;
        size_t sl;
        int rc = tok_json_strdup(d, ps >= 0 ? ps : pr, &s, &sl, label, "pre_tokenizer Split.pattern",
                                 err);
        if (rc)
            return rc;
        p->re = tok_regex_compile(s, sl, ps >= 0, label, err);
        free(s);
        if (!p->re)
            return PG_EFORMAT;
        t->n_pre++;
        p->invert = tok_json_bool(d, node, "invert", false);
        int b = json_obj_get(d, node, "behavior");
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                            "MergedWithNext", "Contiguous"};
        int found = -1;
        for (int k = 0; k < 5; k++)
            if (json_str_eq(d, b, names[k]))
                found = k;
        if (found < 0)
            return pg_error_set(err, PG_EFORMAT, "%s: pre_tokenizer Split.behavior: unknown", label);
        p->behavior = (enum tok_split_behavior)found;
        return PG_OK;
    }
    if (json_str_eq(d, ty, "ByteLevel")) {
        p->kind = TOK_PRE_BYTELEVEL;
        p->add_prefix_space = tok_json_bool(d, node, "add_prefix_space", true);
        if (tok_json_bool(d, node, "use_regex", true)) {
            if (!(p->re = tok_regex_compile(gpt2_re, sizeof gpt2_re - 1, false, label, err)))
                return PG_EFORMAT;
        }
        p->behavior = TOK_SPLIT_ISOLATED;
        t->n_pre++;
        return PG_OK;
    }
    if (json_str_eq(d, ty, "Metaspace")) {
        p->kind = TOK_PRE_METASPACE;
        int r = json_obj_get(d, node, "replacement");
        size_t rl = 0;
        if (r >= 0 && (json_get_string_buf(d, r, p->repl, sizeof p->repl, &rl, err) ||
                       rl == 0 || tok_utf8_len((unsigned char)p->repl[0]) != rl))
            return pg_error_set(err, PG_EFORMAT,
                                "%s: pre_tokenizer Metaspace.replacement: expected one char", label);
        if (r < 0) {
            memcpy(p->repl, "\xE2\x96\x81", 3);
            rl = 3;
        }
        p->repl_len = rl;
        p->split = tok_json_bool(d, node, "split", true);
        int sc = json_obj_get(d, node, "prepend_scheme");
        if (json_str_eq(d, sc, "first"))
            p->scheme = TOK_PREPEND_FIRST;
        else if (json_str_eq(d, sc, "never"))
            p->scheme = TOK_PREPEND_NEVER;
        else if (json_str_eq(d, sc, "always"))
            p->scheme = TOK_PREPEND_ALWAYS;
        else /* older files: add_prefix_space */
            p->scheme = tok_json_bool(d, node, "add_prefix_space", true) ? TOK_PREPEND_ALWAYS
                                                                        : TOK_PREPEND_NEVER;
        t->n_pre++;
        return PG_OK;
    }
    if (json_str_eq(d, ty, "Digits")) {
        p->kind = TOK_PRE_DIGITS;
        bool ind = tok_json_bool(d, node, "individual_digits", false);
        static const char dre[] = "\\p{N}";
        if (!(p->re = tok_regex_compile(dre, sizeof dre - 1, false, label, err)))
            return PG_EFORMAT;
        p->behavior = ind ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS;
        t->n_pre++;
        return PG_OK;
    }
    size_t n = 0;
    const char *r = ty >= 0 ? json_raw(d, ty, &n) : "";
    return pg_error_set(err, PG_EUNSUPPORTED,
                        "%s: pre_tokenizer type '%.*s' is not supported (expected Sequence, "
                        "Split, ByteLevel, Metaspace or Digits)",
                        label, (int)n, r);
}

int tok_pre_load(tokenizer *t, const json_doc *d, int node, const char *label, pg_error *err)
{
    if (node < 0)
        return PG_OK;
    return load_one(t, d, node, label, 0, NULL, err);
}

void tok_pre_free(tokenizer *t)
{
    for (int k = 0; k < t->n_pre; k++)
        pcre2_code_free(t->pre[k].re);
}

static int run_stage(tok_enc *e, int k, const char *s, size_t n, bool at_start);

/* Splits into (start, end, is_match) triples fed one at a time; the
 * behaviour state machine holds back at most one range (HF
 * NormalizedString::split, written as folds there). */
typedef struct splitter {
    tok_enc *e;
    int k;
    const char *s;
    bool at_start;
    enum tok_split_behavior behavior;
    bool have, prev_match;
    size_t pa, pb;
} splitter;

static int emit(splitter *sp, size_t a, size_t b)
{
    if (a == b)
        return PG_OK;
    tok_enc *e = sp->e;
    const tok_pre *p = &e->t->pre[sp->k];
    bool st = sp->at_start && a == 0;
    if (p->kind != TOK_PRE_BYTELEVEL)
        return run_stage(e, sp->k + 1, sp->s + a, b - a, st);
    tok_buf *m = &e->map_buf[sp->k];
    m->len = 0;
    if (!tok_buf_reserve(m, 2 * (b - a)))
        return PG_ENOMEM;
    for (size_t i = a; i < b; i++)
        m->len += tok_utf8_encode(m->p + m->len, tok_bytelevel_cp((unsigned char)sp->s[i]));
    return run_stage(e, sp->k + 1, m->p, m->len, st);
}

static int feed(splitter *sp, size_t a, size_t b, bool m)
{
    int rc = PG_OK;
    switch (sp->behavior) {
    case TOK_SPLIT_ISOLATED:
        return emit(sp, a, b);
    case TOK_SPLIT_REMOVED:
        return m ? PG_OK : emit(sp, a, b);
    case TOK_SPLIT_MERGED_PREV:
    case TOK_SPLIT_CONTIGUOUS: {
        /* `have` holds [pa, pb); the range extends it when it is a match
         * following a non-match (merged with previous) or the same kind as
         * the previous range (contiguous), else it is emitted */
        bool extend = sp->behavior == TOK_SPLIT_MERGED_PREV ? m && !sp->prev_match
                                                             : m == sp->prev_match;
        if (extend && sp->have) {
            sp->pb = b;
        } else {
            if (sp->have)
                rc = emit(sp, sp->pa, sp->pb);
            sp->have = true;
            sp->pa = a;
            sp->pb = b;
        }
        sp->prev_match = m;
        return rc;
    }
    case TOK_SPLIT_MERGED_NEXT:
        /* `have` holds a match waiting for the range after it */
        if (sp->have) {
            sp->have = false;
            if (!m)
                return emit(sp, sp->pa, b);
            if ((rc = emit(sp, sp->pa, sp->pb)))
                return rc;
        }
        if (m) {
            sp->have = true;
            sp->pa = a;
            sp->pb = b;
            return PG_OK;
        }
        return emit(sp, a, b);
    }
    return rc;
}

static int finish(splitter *sp)
{
    if (!sp->have)
        return PG_OK;
    sp->have = false;
    return emit(sp, sp->pa, sp->pb);
}

/* Regex find_iter over s[0, n): non-matches and matches, in order. */
static int split_regex(splitter *sp, const pcre2_code *re, size_t n, bool invert)
{
    tok_enc *e = sp->e;
    size_t pos = 0, prev = 0;
    int rc;
    while (pos <= n) {
        int r = pcre2_match(re, (PCRE2_SPTR)sp->s, n, pos, PCRE2_NO_UTF_CHECK, e->md, e->mctx);
        if (r == PCRE2_ERROR_JIT_STACKLIMIT && !e->jit) {
            /* a pathological input: retry with a JIT stack of up to 64 MiB */
            if (!e->mctx)
                e->mctx = pcre2_match_context_create(NULL);
            e->jit = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
            if (!e->mctx || !e->jit)
                return pg_error_set(e->err, PG_ENOMEM, "tokenizer: out of memory for a jit stack");
            pcre2_jit_stack_assign(e->mctx, NULL, e->jit);
            continue;
        }
        if (r == PCRE2_ERROR_NOMATCH)
            break;
        if (r < 0)
            return pg_error_set(e->err, PG_EINVAL, "tokenizer: regex match failed (pcre2 %d)", r);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t ms = ov[0], me = ov[1];
        if (prev != ms && (rc = feed(sp, prev, ms, invert)))
            return rc;
        if ((rc = feed(sp, ms, me, !invert)))
            return rc;
        prev = me;
        if (me == ms) {
            if (ms >= n)
                break;
            pos = ms + tok_utf8_len((unsigned char)sp->s[ms]);
        } else {
            pos = me;
        }
    }
    if (prev < n && (rc = feed(sp, prev, n, invert)))
        return rc;
    return finish(sp);
}

static int run_stage(tok_enc *e, int k, const char *s, size_t n, bool at_start)
{
    const tokenizer *t = e->t;
    if (n == 0)
        return PG_OK;
    if (k == t->n_pre)
        return tok_bpe_word(e, s, n);
    const tok_pre *p = &t->pre[k];
    splitter sp = {e, k, s, at_start, p->behavior, false, false, 0, 0};
    tok_buf *buf = &e->depth_buf[k];
    switch (p->kind) {
    case TOK_PRE_SPLIT:
    case TOK_PRE_DIGITS:
        return split_regex(&sp, p->re, n, p->invert);
    case TOK_PRE_BYTELEVEL:
        if (p->add_prefix_space && s[0] != ' ') {
            buf->len = 0;
            if (!tok_buf_put(buf, " ", 1) || !tok_buf_put(buf, s, n))
                return PG_ENOMEM;
            sp.s = buf->p;
            n = buf->len;
        }
        if (!p->re)
            return emit(&sp, 0, n);
        return split_regex(&sp, p->re, n, false);
    case TOK_PRE_METASPACE: {
        buf->len = 0;
        bool pre = p->scheme == TOK_PREPEND_ALWAYS || (p->scheme == TOK_PREPEND_FIRST && at_start);
        bool starts = n >= p->repl_len && memcmp(s, p->repl, p->repl_len) == 0;
        if (pre && !starts && !tok_buf_put(buf, p->repl, p->repl_len))
            return PG_ENOMEM;
        for (size_t i = 0; i < n;) {
            const char *sp_at = memchr(s + i, ' ', n - i);
            size_t j = sp_at ? (size_t)(sp_at - s) : n;
            if (!tok_buf_put(buf, s + i, j - i))
                return PG_ENOMEM;
            if (j < n && !tok_buf_put(buf, p->repl, p->repl_len))
                return PG_ENOMEM;
            i = j + 1;
        }
        sp.s = buf->p;
        n = buf->len;
        if (!p->split)
            return emit(&sp, 0, n);
        sp.behavior = TOK_SPLIT_MERGED_NEXT;
        size_t prev = 0;
        int rc;
        for (size_t i = 0; i + p->repl_len <= n;) {
            if (memcmp(sp.s + i, p->repl, p->repl_len) == 0) {
                if (prev != i && (rc = feed(&sp, prev, i, false)))
                    return rc;
                if ((rc = feed(&sp, i, i + p->repl_len, true)))
                    return rc;
                i += p->repl_len;
                prev = i;
            } else {
                i++;
            }
        }
        if (prev < n && (rc = feed(&sp, prev, n, false)))
            return rc;
        return finish(&sp);
    }
    }
    return PG_OK;
}

int tok_pretok_run(tok_enc *e, const char *s, size_t n, bool at_start)
{
    return run_stage(e, 0, s, n, at_start);
}
