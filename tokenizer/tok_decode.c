/* tok_decode: the decoder (ids -> text) and the incremental decoder.
 *
 * HF decoders are list-of-strings transforms (Rust tokenizers, src/decoders). The chains
 * the Llama families use are compiled at load into one token-at-a-time
 * machine that gives the same text:
 *   - per-token steps: Replace (String pattern), Strip, Metaspace
 *     (replacement -> " "; the first token loses all of them unless
 *     prepend_scheme is "never"),
 *   - ByteFallback: runs of "<0xHH>" tokens are collected; a run that is
 *     valid UTF-8 becomes its text, otherwise one U+FFFD per byte (Rust
 *     tokenizers' rule), decided when the run ends,
 *   - Fuse, then Strip(content, start, stop 0) on the fused text: up to
 *     `start` leading `content` chars of the whole text are dropped,
 *   - ByteLevel: GPT-2 chars -> bytes (a token with any other char keeps its
 *     UTF-8 bytes), then UTF-8 with maximal-subpart U+FFFD substitution
 *     (String::from_utf8_lossy),
 *   - no decoder: tokens joined with " ".
 * Other chains are refused at load (PG_EUNSUPPORTED). tok_decode and the
 * stream run the same machine, so the stream's output is the decode of the
 * whole sequence past the prompt: what the machine holds back (an open byte
 * run, an unfinished UTF-8 sequence) is all that is pending. Note that with
 * Rust's ByteFallback rule a run's text is only known when the run ends (one
 * bad byte turns the whole run into U+FFFDs), so byte-fallback characters
 * are emitted when the next non-byte token (or finish) arrives.
 * Ids without a piece are skipped, as HF skips them.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

static int add_step(tokenizer *t, const char *label, pg_error *err, tok_dstep **out)
{
    if (t->dec.n_steps == TOK_MAX_DSTEPS)
        return pg_error_set(err, PG_EUNSUPPORTED, "%s: decoder: more than %d steps", label,
                            TOK_MAX_DSTEPS);
    *out = &t->dec.steps[t->dec.n_steps++];
    memset(*out, 0, sizeof **out);
    return PG_OK;
}

typedef struct dec_load {
    bool fused, after_bf;
} dec_load;

static int load_one(tokenizer *t, const json_doc *d, int node, const char *label, int depth,
                    void *ctx, pg_error *err)
{
    dec_load *L = ctx;
    if (!json_is_object(d, node))
        return pg_error_set(err, PG_EFORMAT, "%s: decoder: expected an object", label);
    int ty = json_obj_get(d, node, "type");
    tok_decoder *dc = &t->dec;
    tok_dstep *st = NULL;
    int rc;
    if (json_str_eq(d, ty, "Sequence"))
        return tok_load_sequence(t, d, node, "decoders", "decoder", label, depth, load_one, L,
                                 err);
    bool per_token = json_str_eq(d, ty, "Replace") || json_str_eq(d, ty, "Metaspace") ||
                     (json_str_eq(d, ty, "Strip") && !L->fused);
    if (per_token && (L->fused || L->after_bf))
        return pg_error_set(err, PG_EUNSUPPORTED,
                            "%s: decoder: a per-token step after ByteFallback/Fuse/ByteLevel is "
                            "not supported",
                            label);
    if (json_str_eq(d, ty, "Replace")) {
        int pat = json_obj_get(d, node, "pattern");
        int ps = json_obj_get(d, pat, "String");
        if (ps < 0)
            return pg_error_set(err, PG_EUNSUPPORTED,
                                "%s: decoder Replace: only a String pattern is supported", label);
        if ((rc = add_step(t, label, err, &st)))
            return rc;
        st->kind = TOK_DEC_REPLACE;
        if ((rc = tok_json_strdup(d, ps, &st->a, &st->a_len, label, "decoder Replace.pattern",
                                  err)) ||
            (rc = tok_json_strdup(d, json_obj_get(d, node, "content"), &st->b, &st->b_len, label,
                                  "decoder Replace.content", err)))
            return rc;
        if (st->a_len == 0)
            return pg_error_set(err, PG_EFORMAT, "%s: decoder Replace: empty pattern", label);
        return PG_OK;
    }
    if (json_str_eq(d, ty, "Metaspace")) {
        if ((rc = add_step(t, label, err, &st)))
            return rc;
        st->kind = TOK_DEC_METASPACE;
        int r = json_obj_get(d, node, "replacement");
        if (r >= 0) {
            if ((rc = tok_json_strdup(d, r, &st->a, &st->a_len, label,
                                      "decoder Metaspace.replacement", err)))
                return rc;
        } else if (!(st->a = strdup("\xE2\x96\x81"))) {
            return pg_error_set(err, PG_ENOMEM, "%s: out of memory", label);
        } else {
            st->a_len = 3;
        }
        int sc = json_obj_get(d, node, "prepend_scheme");
        st->first_only = sc >= 0 ? !json_str_eq(d, sc, "never")
                                 : tok_json_bool(d, node, "add_prefix_space", true);
        return PG_OK;
    }
    if (json_str_eq(d, ty, "Strip")) {
        int64_t start = 0, stop = 0;
        int c = json_obj_get(d, node, "content");
        char ch[8];
        size_t chl = 0;
        if (json_get_string_buf(d, c, ch, sizeof ch, &chl, err) || chl == 0 ||
            json_get_int(d, json_obj_get(d, node, "start"), 0, 1 << 20, &start, err) ||
            json_get_int(d, json_obj_get(d, node, "stop"), 0, 1 << 20, &stop, err))
            return pg_error_set(err, PG_EFORMAT,
                                "%s: decoder Strip: expected content (one char), start, stop", label);
        if (!L->fused) {
            if ((rc = add_step(t, label, err, &st)))
                return rc;
            st->kind = TOK_DEC_STRIP;
            if (!(st->a = malloc(chl + 1)))
                return pg_error_set(err, PG_ENOMEM, "%s: out of memory", label);
            memcpy(st->a, ch, chl + 1);
            st->a_len = chl;
            st->start = (int)start;
            st->stop = (int)stop;
            return PG_OK;
        }
        if (stop != 0 || dc->strip_start != 0)
            return pg_error_set(err, PG_EUNSUPPORTED,
                                "%s: decoder Strip after Fuse: only one, with stop 0, is supported",
                                label);
        memcpy(dc->strip_ch, ch, chl);
        dc->strip_ch_len = chl;
        dc->strip_start = (int)start;
        return PG_OK;
    }
    if (json_str_eq(d, ty, "ByteFallback")) {
        if (L->fused || dc->byte_fallback)
            return pg_error_set(err, PG_EUNSUPPORTED,
                                "%s: decoder ByteFallback after Fuse/ByteLevel is not supported",
                                label);
        dc->byte_fallback = true;
        L->after_bf = true;
        return PG_OK;
    }
    if (json_str_eq(d, ty, "Fuse")) {
        L->fused = true;
        return PG_OK;
    }
    if (json_str_eq(d, ty, "ByteLevel")) {
        if (dc->byte_fallback || L->fused)
            return pg_error_set(err, PG_EUNSUPPORTED,
                                "%s: decoder ByteLevel after ByteFallback/Fuse is not supported",
                                label);
        dc->mode = TOK_DECM_BYTELEVEL;
        L->fused = true;
        return PG_OK;
    }
    size_t n = 0;
    const char *r = ty >= 0 ? json_raw(d, ty, &n) : "";
    return pg_error_set(err, PG_EUNSUPPORTED, "%s: decoder type '%.*s' is not supported", label,
                        (int)n, r);
}

int tok_decoder_load(tokenizer *t, const json_doc *d, int node, const char *label, pg_error *err)
{
    memset(&t->dec, 0, sizeof t->dec);
    if (node < 0 || json_is_null(d, node)) {
        t->dec.mode = TOK_DECM_NONE;
        return PG_OK;
    }
    t->dec.mode = TOK_DECM_CONCAT;
    dec_load L = {false, false};
    return load_one(t, d, node, label, 0, &L, err);
}

void tok_decoder_free(tokenizer *t)
{
    for (int k = 0; k < t->dec.n_steps; k++) {
        free(t->dec.steps[k].a);
        free(t->dec.steps[k].b);
    }
}

/* ---- the machine ---- */

typedef struct dec_state {
    const tokenizer *t;
    bool skip_special;
    long n_kept;       /* tokens that went through the chain (Metaspace's i == 0) */
    int strip_left;    /* global Strip: content chars still to drop */
    tok_buf run;       /* ByteFallback: bytes of the open run */
    tok_utf8_lossy lossy;
    tok_buf a, b;      /* per-token scratch */
} dec_state;

static void dec_init(dec_state *s, const tokenizer *t, bool skip_special)
{
    memset(s, 0, sizeof *s);
    s->t = t;
    s->skip_special = skip_special;
    s->strip_left = t->dec.strip_start;
}

static void dec_free(dec_state *s)
{
    tok_buf_free(&s->run);
    tok_buf_free(&s->a);
    tok_buf_free(&s->b);
}

/* Appends text of the fused output, after the global Strip. */
static bool dec_emit(dec_state *s, const char *p, size_t n, tok_buf *out)
{
    const tok_decoder *dc = &s->t->dec;
    while (s->strip_left > 0 && n > 0) {
        if (n >= dc->strip_ch_len && memcmp(p, dc->strip_ch, dc->strip_ch_len) == 0) {
            p += dc->strip_ch_len;
            n -= dc->strip_ch_len;
            s->strip_left--;
        } else {
            s->strip_left = 0;
        }
    }
    return tok_buf_put(out, p, n);
}

static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

static bool flush_run(dec_state *s, tok_buf *out)
{
    if (s->run.len == 0)
        return true;
    bool ok;
    if (tok_utf8_valid_prefix((const unsigned char *)s->run.p, s->run.len) == s->run.len) {
        ok = dec_emit(s, s->run.p, s->run.len, out);
    } else {
        ok = true;
        for (size_t i = 0; ok && i < s->run.len; i++)
            ok = dec_emit(s, fffd, 3, out);
    }
    s->run.len = 0;
    return ok;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Replaces every occurrence of pat in src by rep (into dst). */
static bool replace_into(tok_buf *dst, const char *src, size_t n, const char *pat, size_t pl,
                         const char *rep, size_t rl)
{
    dst->len = 0;
    size_t i = 0, last = 0;
    while (i + pl <= n) {
        if (src[i] == pat[0] && memcmp(src + i, pat, pl) == 0) {
            if (!tok_buf_put(dst, src + last, i - last) || !tok_buf_put(dst, rep, rl))
                return false;
            i += pl;
            last = i;
        } else {
            i++;
        }
    }
    return tok_buf_put(dst, src + last, n - last);
}

/* The per-token steps (Replace, Metaspace, Strip) on piece p[0, n); the
 * result in *op / *on (s->a or s->b, or p itself without steps). */
static int token_steps(dec_state *s, const char *p, size_t n, const char **op, size_t *on)
{
    const tok_decoder *dc = &s->t->dec;
    tok_buf *cur = &s->a, *nxt = &s->b;
    for (int k = 0; k < dc->n_steps; k++) {
        const tok_dstep *st = &dc->steps[k];
        bool ok = true;
        switch (st->kind) {
        case TOK_DEC_REPLACE:
            ok = replace_into(nxt, p, n, st->a, st->a_len, st->b, st->b_len);
            break;
        case TOK_DEC_METASPACE:
            ok = replace_into(nxt, p, n, st->a, st->a_len, " ",
                              (st->first_only && s->n_kept == 0) ? 0 : 1);
            break;
        case TOK_DEC_STRIP: { /* up to start chars at the front, stop at the back */
            size_t a = 0, b = n;
            for (int c = 0; c < st->start && b - a >= st->a_len &&
                            memcmp(p + a, st->a, st->a_len) == 0; c++)
                a += st->a_len;
            for (int c = 0; c < st->stop && b - a >= st->a_len &&
                            memcmp(p + b - st->a_len, st->a, st->a_len) == 0; c++)
                b -= st->a_len;
            nxt->len = 0;
            ok = tok_buf_put(nxt, p + a, b - a);
            break;
        }
        }
        if (!ok)
            return PG_ENOMEM;
        p = nxt->p;
        n = nxt->len;
        tok_buf *sw = cur;
        cur = nxt;
        nxt = sw;
    }
    *op = p;
    *on = n;
    return PG_OK;
}

static int dec_token(dec_state *s, int32_t id, tok_buf *out)
{
    const tokenizer *t = s->t;
    const tok_decoder *dc = &t->dec;
    if (id < 0 || id >= t->n_ids || !t->piece[id])
        return PG_OK;
    if (s->skip_special && t->is_special[id])
        return PG_OK;
    const char *p;
    size_t n;
    if (token_steps(s, t->piece[id], t->piece_len[id], &p, &n))
        return PG_ENOMEM;
    /* the scratch buffer token_steps did not return is free for the
     * ByteLevel text below */
    tok_buf *nxt = p == s->a.p ? &s->b : &s->a;
    bool ok = true;
    switch (dc->mode) {
    case TOK_DECM_NONE:
        ok = (s->n_kept == 0 || dec_emit(s, " ", 1, out)) && dec_emit(s, p, n, out);
        break;
    case TOK_DECM_CONCAT:
        if (dc->byte_fallback && n == 6 && memcmp(p, "<0x", 3) == 0 && p[5] == '>' &&
            hexval(p[3]) >= 0 && hexval(p[4]) >= 0) {
            char byte = (char)(hexval(p[3]) * 16 + hexval(p[4]));
            ok = tok_buf_put(&s->run, &byte, 1);
        } else {
            ok = flush_run(s, out) && dec_emit(s, p, n, out);
        }
        break;
    case TOK_DECM_BYTELEVEL: {
        /* all chars must map back to bytes, else the token's own bytes */
        bool all = true;
        size_t cl;
        for (size_t i = 0; i < n && all; i += cl)
            all = tok_bytelevel_byte(tok_utf8_decode((const unsigned char *)p + i, &cl)) >= 0;
        tok_buf *txt = nxt;
        txt->len = 0;
        for (size_t i = 0; i < n && ok; i += cl) {
            unsigned char byte;
            if (all) {
                byte = (unsigned char)tok_bytelevel_byte(tok_utf8_decode((const unsigned char *)p + i, &cl));
            } else {
                byte = (unsigned char)p[i];
                cl = 1;
            }
            ok = tok_utf8_lossy_byte(&s->lossy, byte, txt);
        }
        ok = ok && dec_emit(s, txt->p, txt->len, out);
        break;
    }
    }
    s->n_kept++;
    return ok ? PG_OK : PG_ENOMEM;
}

static int dec_finish(dec_state *s, tok_buf *out)
{
    bool ok = flush_run(s, out);
    s->a.len = 0;
    ok = ok && tok_utf8_lossy_flush(&s->lossy, &s->a) && dec_emit(s, s->a.p, s->a.len, out);
    return ok ? PG_OK : PG_ENOMEM;
}

/* transformers' clean_up_tokenization (tokenization_utils_base.py), the
 * same ten replaces in the same order, in place. */
static void cleanup(tok_buf *b)
{
    static const char *const pairs[][2] = {
        {" .", "."},  {" ?", "?"},     {" !", "!"},     {" ,", ","},     {" ' ", "'"},
        {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
    };
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        const char *pat = pairs[k][0], *rep = pairs[k][1];
        size_t pl = strlen(pat), rl = strlen(rep), w = 0, i = 0;
        while (i < b->len) {
            if (i + pl <= b->len && memcmp(b->p + i, pat, pl) == 0) {
                memmove(b->p + w, rep, rl);
                w += rl;
                i += pl;
            } else {
                b->p[w++] = b->p[i++];
            }
        }
        b->len = w;
    }
    if (b->p)
        b->p[b->len] = '\0';
}

int tok_decode_ex(const tokenizer *t, const int32_t *ids, size_t n_ids, unsigned flags,
                  char **text, size_t *len, pg_error *err)
{
    *text = NULL;
    *len = 0;
    if (!t || (n_ids && !ids))
        return pg_error_set(err, PG_EINVAL, "tok_decode: null argument");
    dec_state s;
    dec_init(&s, t, (flags & TOK_DECODE_SKIP_SPECIAL) != 0);
    tok_buf out = {0};
    int rc = PG_OK;
    for (size_t i = 0; i < n_ids && !rc; i++)
        rc = dec_token(&s, ids[i], &out);
    if (!rc)
        rc = dec_finish(&s, &out);
    if (!rc && !tok_buf_reserve(&out, 0))
        rc = PG_ENOMEM;
    dec_free(&s);
    if (rc) {
        tok_buf_free(&out);
        return pg_error_set(err, rc, "tok_decode: out of memory for %zu ids", n_ids);
    }
    out.p[out.len] = '\0';
    if (flags & TOK_DECODE_CLEANUP)
        cleanup(&out);
    *text = out.p;
    *len = out.len;
    return PG_OK;
}

int tok_decode(const tokenizer *t, const int32_t *ids, size_t n_ids, bool skip_special,
               char **text, size_t *len, pg_error *err)
{
    return tok_decode_ex(t, ids, n_ids, skip_special ? TOK_DECODE_SKIP_SPECIAL : 0, text, len,
                         err);
}

/* The stream: the machine's output passes a filter that drops the prompt's
 * share. Text the machine made final during the prompt is simply not
 * emitted. What it still held back at the end of the prompt (an open byte
 * run, an unfinished character) decodes, in decode(prompt), to some text Q;
 * the first generated output is compared with Q byte by byte and Q is
 * dropped when it comes out the same (then the concatenation is exactly
 * decode(prompt + generated) minus decode(prompt)); at the first difference
 * the held part of Q is released and everything is emitted (decode(prompt)
 * is then not a prefix of decode(prompt + generated), e.g. a prompt ending in
 * half an emoji that generation completes: the emoji is emitted). */
struct tok_stream {
    dec_state st;
    tok_buf raw;   /* machine output of the current call */
    tok_buf out;   /* what the caller gets */
    tok_buf q;     /* the prompt's held-back text, as decode(prompt) has it */
    size_t qm;     /* bytes of q matched so far */
    bool qdone;
};

static bool stream_filter(tok_stream *s)
{
    size_t i = 0;
    const char *r = s->raw.p;
    size_t n = s->raw.len;
    while (!s->qdone && i < n) {
        if (r[i] == s->q.p[s->qm]) {
            i++;
            if (++s->qm == s->q.len)
                s->qdone = true;
        } else {
            s->qdone = true;
            if (!tok_buf_put(&s->out, s->q.p, s->qm))
                return false;
        }
    }
    return tok_buf_put(&s->out, r + i, n - i);
}

int tok_stream_create(tok_stream **out, const tokenizer *t, bool skip_special,
                      const int32_t *prompt_ids, size_t n_prompt, pg_error *err)
{
    *out = NULL;
    if (!t || (n_prompt && !prompt_ids))
        return pg_error_set(err, PG_EINVAL, "tok_stream_create: null argument");
    tok_stream *s = calloc(1, sizeof *s);
    if (!s)
        return pg_error_set(err, PG_ENOMEM, "tok_stream_create: out of memory");
    dec_init(&s->st, t, skip_special);
    int rc = PG_OK;
    for (size_t i = 0; i < n_prompt && !rc; i++) {
        s->raw.len = 0; /* the prompt's final text is not ours to emit */
        rc = dec_token(&s->st, prompt_ids[i], &s->raw);
    }
    /* Q: what finishing the prompt would add, from a copy of the state */
    dec_state cp = s->st;
    memset(&cp.run, 0, sizeof cp.run);
    memset(&cp.a, 0, sizeof cp.a);
    memset(&cp.b, 0, sizeof cp.b);
    if (!rc && !tok_buf_put(&cp.run, s->st.run.p, s->st.run.len))
        rc = PG_ENOMEM;
    if (!rc)
        rc = dec_finish(&cp, &s->q);
    dec_free(&cp);
    s->qdone = s->q.len == 0;
    s->raw.len = 0;
    if (rc || !tok_buf_reserve(&s->out, 64) || !tok_buf_reserve(&s->raw, 64)) {
        tok_stream_free(s);
        return pg_error_set(err, PG_ENOMEM, "tok_stream_create: out of memory");
    }
    *out = s;
    return PG_OK;
}

int tok_stream_push(tok_stream *s, int32_t id, const char **new_text, size_t *new_len,
                    pg_error *err)
{
    s->out.len = 0;
    s->out.p[0] = '\0';
    s->raw.len = 0;
    if (dec_token(&s->st, id, &s->raw) || !stream_filter(s)) {
        *new_text = "";
        *new_len = 0;
        return pg_error_set(err, PG_ENOMEM, "tok_stream_push: out of memory");
    }
    *new_text = s->out.p;
    *new_len = s->out.len;
    return PG_OK;
}

int tok_stream_finish(tok_stream *s, const char **new_text, size_t *new_len, pg_error *err)
{
    s->out.len = 0;
    s->out.p[0] = '\0';
    s->raw.len = 0;
    if (dec_finish(&s->st, &s->raw) || !stream_filter(s)) {
        *new_text = "";
        *new_len = 0;
        return pg_error_set(err, PG_ENOMEM, "tok_stream_finish: out of memory");
    }
    *new_text = s->out.p;
    *new_len = s->out.len;
    return PG_OK;
}

void tok_stream_free(tok_stream *s)
{
    if (!s)
        return;
    dec_free(&s->st);
    tok_buf_free(&s->raw);
    tok_buf_free(&s->out);
    tok_buf_free(&s->q);
    free(s);
}

int tok_token_bytes(const tokenizer *t, int32_t id, char **bytes, size_t *len, pg_error *err)
{
    *bytes = NULL;
    *len = 0;
    if (!t || id < 0 || id >= t->n_ids || !t->piece[id] || t->is_special[id])
        return PG_OK;
    dec_state s;
    dec_init(&s, t, true);
    s.n_kept = 1; /* not the first token of the text */
    s.strip_left = 0;
    const tok_decoder *dc = &t->dec;
    const char *p;
    size_t n;
    tok_buf out = {0};
    int rc = token_steps(&s, t->piece[id], t->piece_len[id], &p, &n);
    bool ok = rc == PG_OK;
    if (ok && dc->mode == TOK_DECM_NONE) {
        ok = tok_buf_put(&out, " ", 1) && tok_buf_put(&out, p, n);
    } else if (ok && dc->mode == TOK_DECM_CONCAT) {
        if (dc->byte_fallback && n == 6 && memcmp(p, "<0x", 3) == 0 && p[5] == '>' &&
            hexval(p[3]) >= 0 && hexval(p[4]) >= 0) {
            char byte = (char)(hexval(p[3]) * 16 + hexval(p[4]));
            ok = tok_buf_put(&out, &byte, 1);
        } else {
            ok = tok_buf_put(&out, p, n);
        }
    } else if (ok) { /* ByteLevel: chars -> bytes, no UTF-8 repair */
        bool all = true;
        size_t cl;
        for (size_t i = 0; i < n && all; i += cl)
            all = tok_bytelevel_byte(tok_utf8_decode((const unsigned char *)p + i, &cl)) >= 0;
        for (size_t i = 0; i < n && ok; i += cl) {
            char byte;
            if (all) {
                byte = (char)tok_bytelevel_byte(tok_utf8_decode((const unsigned char *)p + i, &cl));
            } else {
                byte = p[i];
                cl = 1;
            }
            ok = tok_buf_put(&out, &byte, 1);
        }
    }
    dec_free(&s);
    if (!ok || !tok_buf_reserve(&out, 0)) {
        tok_buf_free(&out);
        return pg_error_set(err, PG_ENOMEM, "tok_token_bytes: out of memory");
    }
    out.p[out.len] = '\0';
    *bytes = out.p;
    *len = out.len;
    return PG_OK;
}
