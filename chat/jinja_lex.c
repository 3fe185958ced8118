/* jinja_lex: see the header. Follows jinja2 3.1 lexer.py (Lexer.tokeniter)
 * with trim_blocks=True and lstrip_blocks=True. */
#include "jinja_lex.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct lexer {
    jinja_rt *rt;
    const char *src;
    size_t n, pos;
    jtok *toks;
    size_t ntoks, cap;
    /* jinja2's line_starting: the last thing consumed ended a line */
    bool line_starting;
    char balance[64];
    int nbalance;
} lexer;

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static void where(const lexer *L, size_t pos, int *line, int *col)
{
    int l = 1;
    size_t bol = 0;
    for (size_t i = 0; i < pos && i < L->n; i++)
        if (L->src[i] == '\n') {
            l++;
            bol = i + 1;
        }
    *line = l;
    *col = (int)jv_utf8_count(L->src + bol, pos - bol) + 1;
}

static _Noreturn void lex_fail(lexer *L, size_t pos, const char *msg)
{
    where(L, pos, &L->rt->line, &L->rt->col);
    jrt_fail(L->rt, "%s", msg);
}

static jtok *push(lexer *L, jtok_type type, size_t pos)
{
    if (L->ntoks == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 64;
        jtok *t = jrt_alloc(L->rt, cap * sizeof *t);
        if (L->ntoks)
            memcpy(t, L->toks, L->ntoks * sizeof *t);
        L->toks = t;
        L->cap = cap;
    }
    jtok *t = &L->toks[L->ntoks++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->off = pos; /* line/col are filled in one pass at the end */
    return t;
}

static void push_text(lexer *L, size_t start, size_t end)
{
    if (end <= start)
        return;
    jtok *t = push(L, JT_TEXT, start);
    t->s = L->src + start;
    t->len = end - start;
}

/* Python-style escapes in a string literal (jinja2 decodes with
 * "unicode-escape"). */
static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void lex_string(lexer *L, jtok *t, size_t start, size_t end)
{
    jsb b;
    jsb_init(&b, L->rt, (size_t)1 << 30);
    for (size_t i = start; i < end; i++) {
        char c = L->src[i];
        if (c != '\\' || i + 1 >= end) {
            jsb_putc(&b, c);
            continue;
        }
        char e = L->src[++i];
        int ndig = 0;
        switch (e) {
        case 'n': jsb_putc(&b, '\n'); break;
        case 't': jsb_putc(&b, '\t'); break;
        case 'r': jsb_putc(&b, '\r'); break;
        case 'a': jsb_putc(&b, '\a'); break;
        case 'b': jsb_putc(&b, '\b'); break;
        case 'f': jsb_putc(&b, '\f'); break;
        case 'v': jsb_putc(&b, '\v'); break;
        case '\\': jsb_putc(&b, '\\'); break;
        case '\'': jsb_putc(&b, '\''); break;
        case '"': jsb_putc(&b, '"'); break;
        case '\n': break;
        case 'x': ndig = 2; break;
        case 'u': ndig = 4; break;
        case 'U': ndig = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                uint32_t v = 0;
                int k = 0;
                while (k < 3 && i < end && L->src[i] >= '0' && L->src[i] <= '7') {
                    v = v * 8 + (uint32_t)(L->src[i] - '0');
                    i++;
                    k++;
                }
                i--;
                jinja_utf8_put(&b, v);
            } else {
                jsb_putc(&b, '\\');
                jsb_putc(&b, e);
            }
        }
        if (ndig) {
            uint32_t v = 0;
            for (int k = 0; k < ndig; k++) {
                int h = i + 1 < end ? hexval(L->src[i + 1]) : -1;
                if (h < 0)
                    lex_fail(L, i, "invalid escape in string literal");
                v = v * 16 + (uint32_t)h;
                i++;
            }
            if (v > 0x10FFFF)
                lex_fail(L, i, "invalid escape in string literal");
            jinja_utf8_put(&b, v);
        }
    }
    t->type = JT_STRING;
    t->s = b.p ? b.p : "";
    t->len = b.len;
}

static bool is_name_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* digits with single underscores between them: returns the end */
static size_t scan_digits(const char *s, size_t i, size_t n)
{
    while (i < n && is_digit(s[i])) {
        i++;
        if (i + 1 < n && s[i] == '_' && is_digit(s[i + 1]))
            i++;
    }
    return i;
}

static void lex_number(lexer *L, size_t *pos)
{
    const char *s = L->src;
    size_t i = *pos, n = L->n;
    if (s[i] == '0' && i + 2 < n && strchr("xXoObB", s[i + 1])) {
        int base = s[i + 1] == 'x' || s[i + 1] == 'X' ? 16 : s[i + 1] == 'o' || s[i + 1] == 'O' ? 8 : 2;
        size_t e = i + 2;
        uint64_t v = 0;
        bool any = false;
        while (e < n) {
            char c = s[e];
            if (c == '_' && any && e + 1 < n) {
                e++;
                continue;
            }
            int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                    : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : 99;
            if (d >= base)
                break;
            if (v > (UINT64_MAX >> 4) || v * (uint64_t)base + (uint64_t)d > (uint64_t)INT64_MAX)
                lex_fail(L, i, "integer literal too large");
            v = v * (uint64_t)base + (uint64_t)d;
            any = true;
            e++;
        }
        if (any) {
            jtok *t = push(L, JT_INT, i);
            t->ival = (int64_t)v;
            *pos = e;
            return;
        }
    }
    size_t e = scan_digits(s, i, n);
    bool is_float = false;
    if (e + 1 < n && s[e] == '.' && is_digit(s[e + 1])) {
        e = scan_digits(s, e + 1, n);
        is_float = true;
    }
    if (e < n && (s[e] == 'e' || s[e] == 'E')) {
        size_t k = e + 1;
        if (k < n && (s[k] == '+' || s[k] == '-'))
            k++;
        if (k < n && is_digit(s[k])) {
            e = scan_digits(s, k, n);
            is_float = true;
        }
    }
    char buf[128];
    size_t m = 0;
    for (size_t k = i; k < e && m + 1 < sizeof buf; k++)
        if (s[k] != '_')
            buf[m++] = s[k];
    buf[m] = '\0';
    jtok *t = push(L, is_float ? JT_FLOAT : JT_INT, i);
    errno = 0;
    if (is_float) {
        t->fval = strtod(buf, NULL);
    } else {
        long long v = strtoll(buf, NULL, 10);
        if (errno == ERANGE || m + 1 >= sizeof buf)
            lex_fail(L, i, "integer literal too large");
        t->ival = v;
    }
    *pos = e;
}

static const struct {
    const char *s;
    int op;
} ops2[] = {
    {"==", JOP_EQ}, {"!=", JOP_NE}, {"<=", JOP_LE}, {">=", JOP_GE},
    {"//", JOP_FLOORDIV}, {"**", JOP_POW},
};

/* Lexes the inside of a {{ }} or {% %} starting at *pos; stops after the
 * end delimiter. Returns false at the end of the source (unclosed tag). */
static void lex_tag(lexer *L, size_t *ppos, bool block)
{
    const char *s = L->src;
    size_t n = L->n, i = *ppos;
    char endc = block ? '%' : '}';
    L->nbalance = 0;
    for (;;) {
        while (i < n && is_space(s[i]))
            i++;
        if (i >= n) {
            push(L, JT_EOF, i); /* the parser reports the unclosed tag */
            L->ntoks--;
            *ppos = i;
            return;
        }
        /* the end delimiter, unless brackets are open (jinja2's balancing_stack) */
        if (L->nbalance == 0) {
            size_t k = i;
            char sign = 0;
            if ((s[k] == '-' || s[k] == '+') && k + 2 < n && s[k + 1] == endc && s[k + 2] == '}') {
                sign = s[k];
                k++;
            }
            if (k + 1 < n && s[k] == endc && s[k + 1] == '}') {
                push(L, block ? JT_BLOCK_END : JT_VAR_END, i);
                k += 2;
                if (sign == '-')
                    while (k < n && is_space(s[k]))
                        k++;
                else if (block && sign != '+' && k < n && s[k] == '\n')
                    k++; /* trim_blocks */
                L->line_starting = k > 0 && s[k - 1] == '\n';
                *ppos = k;
                return;
            }
        }
        char c = s[i];
        if (is_name_start(c)) {
            size_t e = i;
            while (e < n && (is_name_start(s[e]) || is_digit(s[e])))
                e++;
            jtok *t = push(L, JT_NAME, i);
            t->s = s + i;
            t->len = e - i;
            i = e;
        } else if (is_digit(c)) {
            lex_number(L, &i);
        } else if (c == '\'' || c == '"') {
            size_t e = i + 1;
            while (e < n && s[e] != c) {
                if (s[e] == '\\')
                    e++;
                e++;
            }
            if (e >= n) {
                char msg[64];
                if (c == '\'')
                    snprintf(msg, sizeof msg, "unexpected char \"'\" at %zu", i);
                else
                    snprintf(msg, sizeof msg, "unexpected char '\"' at %zu", i);
                lex_fail(L, i, msg);
            }
            jtok *t = push(L, JT_STRING, i);
            lex_string(L, t, i + 1, e);
            i = e + 1;
        } else {
            int op = 0;
            for (size_t k = 0; k < sizeof ops2 / sizeof ops2[0]; k++)
                if (i + 1 < n && s[i] == ops2[k].s[0] && s[i + 1] == ops2[k].s[1]) {
                    op = ops2[k].op;
                    break;
                }
            if (op) {
                jtok *t = push(L, JT_OP, i);
                t->op = op;
                i += 2;
                continue;
            }
            if (!strchr("+-/*%~[](){}<>=.:|,;", c) || c == '\0') {
                char msg[64];
                if ((unsigned char)c >= 0x20 && (unsigned char)c < 0x7f)
                    snprintf(msg, sizeof msg, "unexpected char '%c' at %zu", c, i);
                else
                    snprintf(msg, sizeof msg, "unexpected char '\\x%02x' at %zu", (unsigned char)c, i);
                lex_fail(L, i, msg);
            }
            if (c == '(' || c == '[' || c == '{') {
                if (L->nbalance >= (int)sizeof L->balance)
                    lex_fail(L, i, "brackets nested too deeply");
                L->balance[L->nbalance++] = c == '(' ? ')' : c == '[' ? ']' : '}';
            } else if (c == ')' || c == ']' || c == '}') {
                char msg[64];
                if (L->nbalance == 0) {
                    snprintf(msg, sizeof msg, "unexpected '%c'", c);
                    lex_fail(L, i, msg);
                }
                char want = L->balance[--L->nbalance];
                if (want != c) {
                    snprintf(msg, sizeof msg, "unexpected '%c', expected '%c'", c, want);
                    lex_fail(L, i, msg);
                }
            }
            jtok *t = push(L, JT_OP, i);
            t->op = (unsigned char)c;
            i++;
        }
    }
}

/* {% raw %}: text up to {% endraw %}. Returns the position after it. */
static bool match_word_tag(const char *s, size_t n, size_t i, const char *word,
                           char *lsign, size_t *after)
{
    /* s[i] is at "{%" */
    size_t k = i + 2;
    *lsign = 0;
    if (k < n && (s[k] == '-' || s[k] == '+'))
        *lsign = s[k++];
    while (k < n && is_space(s[k]))
        k++;
    size_t wl = strlen(word);
    if (k + wl > n || memcmp(s + k, word, wl) != 0)
        return false;
    k += wl;
    if (k < n && (is_name_start(s[k]) || is_digit(s[k])))
        return false;
    while (k < n && is_space(s[k]))
        k++;
    char rsign = 0;
    if (k < n && (s[k] == '-' || s[k] == '+'))
        rsign = s[k++];
    if (k + 1 >= n || s[k] != '%' || s[k + 1] != '}')
        return false;
    k += 2;
    if (rsign == '-')
        while (k < n && is_space(s[k]))
            k++;
    else if (rsign != '+' && strcmp(word, "endraw") == 0 && k < n && s[k] == '\n')
        k++;
    *after = k;
    return true;
}

/* Text before a tag: '-' strips all whitespace, else lstrip_blocks strips
 * the spaces before a block/comment tag that starts its line. */
static size_t strip_text_end(const lexer *L, size_t start, size_t end, char sign, bool is_var)
{
    const char *s = L->src;
    if (sign == '-') {
        while (end > start && is_space(s[end - 1]))
            end--;
        return end;
    }
    if (sign == '+' || is_var)
        return end;
    size_t l = end;
    while (l > start && s[l - 1] != '\n')
        l--;
    if (l > start || L->line_starting) {
        size_t k = l;
        while (k < end && is_space(s[k]))
            k++;
        if (k == end)
            return l;
    }
    return end;
}

void jinja_lex(jinja_rt *rt, const char *src_in, size_t n_in, jtok **toks, size_t *ntoks)
{
    /* jinja2 (Lexer.tokeniter): newlines (\r\n, \r, \n) become \n and one
     * trailing newline is dropped (keep_trailing_newline=False) */
    char *norm = jrt_alloc(rt, n_in + 1);
    size_t n = 0;
    for (size_t i = 0; i < n_in; i++) {
        if (src_in[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < n_in && src_in[i + 1] == '\n')
                i++;
        } else
            norm[n++] = src_in[i];
    }
    if (n > 0 && norm[n - 1] == '\n')
        n--;
    norm[n] = '\0';
    const char *src = norm;
    lexer L = {.rt = rt, .src = src, .n = n, .line_starting = true};
    size_t pos = 0;
    while (pos < n) {
        /* the next tag start */
        size_t k = pos;
        const char *found = NULL;
        while (k + 1 < n) {
            found = memchr(src + k, '{', n - k - 1);
            if (!found)
                break;
            k = (size_t)(found - src);
            char c = src[k + 1];
            if (c == '{' || c == '%' || c == '#')
                break;
            k++;
            found = NULL;
        }
        if (!found) {
            push_text(&L, pos, n);
            break;
        }
        char kind = src[k + 1];
        char sign = k + 2 < n && (src[k + 2] == '-' || src[k + 2] == '+') ? src[k + 2] : 0;
        size_t tend = strip_text_end(&L, pos, k, sign, kind == '{');
        push_text(&L, pos, tend);
        size_t after = k + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            const char *e = NULL;
            for (size_t q = after; q + 1 < n; q++)
                if (src[q] == '#' && src[q + 1] == '}') {
                    e = src + q;
                    break;
                }
            if (!e)
                lex_fail(&L, k, "Missing end of comment tag");
            size_t q = (size_t)(e - src);
            size_t p2 = q + 2;
            if (q > after && src[q - 1] == '-') {
                while (p2 < n && is_space(src[p2]))
                    p2++;
            } else if (p2 < n && src[p2] == '\n')
                p2++;
            L.line_starting = src[p2 - 1] == '\n';
            pos = p2;
            continue;
        }
        char rs;
        size_t raw_after;
        if (kind == '%' && match_word_tag(src, n, k, "raw", &rs, &raw_after)) {
            /* raw begin: `raw -%}` strips, no trim_blocks newline */
            size_t body = raw_after, q = body;
            for (;; q++) {
                if (q + 1 >= n)
                    lex_fail(&L, k, "Missing end of raw directive");
                if (src[q] == '{' && src[q + 1] == '%' && match_word_tag(src, n, q, "endraw", &rs, &raw_after))
                    break;
            }
            push_text(&L, body, strip_text_end(&L, body, q, rs, false));
            pos = raw_after;
            L.line_starting = src[pos - 1] == '\n';
            continue;
        }
        push(&L, kind == '{' ? JT_VAR_BEGIN : JT_BLOCK_BEGIN, k);
        L.line_starting = false;
        pos = after;
        lex_tag(&L, &pos, kind == '%');
    }
    push(&L, JT_EOF, n);
    /* line/col from the byte offsets, in one pass */
    int line = 1, col = 0; /* col: code points since the line's start */
    size_t scanned = 0;
    for (size_t t = 0; t < L.ntoks; t++) {
        jtok *tk = &L.toks[t];
        for (; scanned < tk->off && scanned < n; scanned++) {
            if (src[scanned] == '\n') {
                line++;
                col = 0;
            } else if (((unsigned char)src[scanned] & 0xC0) != 0x80)
                col++;
        }
        tk->line = line;
        tk->col = col + 1;
    }
    *toks = L.toks;
    *ntoks = L.ntoks;
}

const char *jinja_tok_describe(jinja_rt *rt, const jtok *t)
{
    /* jinja2's describe_token, quoted as its messages quote it (!r) */
    char buf[96];
    switch (t->type) {
    case JT_EOF: return "'end of template'";
    case JT_TEXT: return "'template data / text'";
    case JT_VAR_BEGIN: return "'begin of print statement'";
    case JT_VAR_END: return "'end of print statement'";
    case JT_BLOCK_BEGIN: return "'begin of statement block'";
    case JT_BLOCK_END: return "'end of statement block'";
    case JT_NAME: snprintf(buf, sizeof buf, "'%.*s'", (int)(t->len > 60 ? 60 : t->len), t->s); break;
    case JT_STRING: return "'string'";
    case JT_INT: return "'integer'";
    case JT_FLOAT: return "'float'";
    case JT_OP:
        for (size_t k = 0; k < sizeof ops2 / sizeof ops2[0]; k++)
            if (ops2[k].op == t->op) {
                snprintf(buf, sizeof buf, "'%s'", ops2[k].s);
                return jrt_strndup(rt, buf, strlen(buf));
            }
        snprintf(buf, sizeof buf, "'%c'", t->op);
        break;
    }
    return jrt_strndup(rt, buf, strlen(buf));
}
