/* grammar_regex: the regex subset -> NFA (see grammar_internal.h).
 *
 * Syntax (what JSON-schema patterns and vLLM guided_regex users write):
 * literals (UTF-8), escapes \. \\ \n \t \r \f \v \0 \xHH \uHHHH and any
 * escaped punctuation, classes [a-z] [^...] with ranges and \d \w \s inside,
 * \d \D \w \W \s \S, '.' (any code point but '\n'), groups ( ) (?: )
 * (?P<name> ) (?<name> ), alternation |, quantifiers ? * + {m} {m,} {m,n}
 * (a lazy '?' suffix is accepted: the language is the same). The match is
 * of the whole string: a leading ^ and a trailing $ are accepted and
 * ignored. Refused with a message naming the construct: backreferences,
 * lookaround, \b \B, anchors elsewhere, possessive quantifiers, POSIX
 * classes. Parsing is to an AST first so that a counted repetition can be
 * emitted as copies.
 */
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

#define GRE_MAX_COUNT 10000  /* m, n in {m,n} */
#define GRE_MAX_NEST 100     /* parenthesis depth */

enum { RE_EMPTY, RE_SET, RE_CAT, RE_ALT, RE_REP };

typedef struct re_node {
    int kind;
    int32_t child, next;   /* first child / next sibling (CAT, ALT, REP), -1 none */
    int32_t r0, nr;        /* SET: ranges [r0, r0 + nr) */
    int32_t min, max;      /* REP; max -1 = unbounded */
} re_node;

typedef struct re_parser {
    gnfa *a;
    const char *what;
    const unsigned char *s;
    size_t n, i;
    re_node *nodes;
    int32_t n_nodes, cap_nodes;
    uint32_t *rg;          /* pairs lo, hi */
    int32_t n_rg, cap_rg;  /* in pairs */
    int depth;
} re_parser;

static int re_err(re_parser *p, const char *fmt, const char *arg)
{
    return gnfa_fail(p->a, PG_EUNSUPPORTED, "%s: %s at offset %zu: %s", p->what, fmt, p->i,
                     arg ? arg : "");
}

static int32_t re_node_new(re_parser *p, int kind)
{
    if (p->a->status)
        return -1;
    if (p->n_nodes == p->cap_nodes) {
        int32_t cap = p->cap_nodes ? 2 * p->cap_nodes : 64;
        re_node *nn = realloc(p->nodes, (size_t)cap * sizeof *nn);
        if (!nn) {
            gnfa_fail(p->a, PG_ENOMEM, "%s: out of memory", p->what);
            return -1;
        }
        p->nodes = nn;
        p->cap_nodes = cap;
    }
    re_node *x = &p->nodes[p->n_nodes];
    memset(x, 0, sizeof *x);
    x->kind = kind;
    x->child = x->next = -1;
    return p->n_nodes++;
}

static bool re_range(re_parser *p, uint32_t lo, uint32_t hi)
{
    if (p->n_rg == p->cap_rg) {
        int32_t cap = p->cap_rg ? 2 * p->cap_rg : 64;
        uint32_t *r = realloc(p->rg, (size_t)cap * 2 * sizeof *r);
        if (!r) {
            gnfa_fail(p->a, PG_ENOMEM, "%s: out of memory", p->what);
            return false;
        }
        p->rg = r;
        p->cap_rg = cap;
    }
    p->rg[2 * p->n_rg] = lo;
    p->rg[2 * p->n_rg + 1] = hi;
    p->n_rg++;
    return true;
}

static int cmp_range(const void *x, const void *y)
{
    const uint32_t *a = x, *b = y;
    return (a[0] > b[0]) - (a[0] < b[0]);
}

/* Sorts and merges ranges [r0, n_rg), optionally complements them over
 * the code points; leaves them at [r0, n_rg). */
static bool re_normalize(re_parser *p, int32_t r0, bool negate)
{
    int32_t n = p->n_rg - r0;
    uint32_t *r = p->rg + 2 * r0;
    qsort(r, (size_t)n, 2 * sizeof *r, cmp_range);
    int32_t w = 0;
    for (int32_t k = 0; k < n; k++) {
        if (w > 0 && r[2 * k] <= r[2 * (w - 1) + 1] + 1) {
            if (r[2 * k + 1] > r[2 * (w - 1) + 1])
                r[2 * (w - 1) + 1] = r[2 * k + 1];
        } else {
            r[2 * w] = r[2 * k];
            r[2 * w + 1] = r[2 * k + 1];
            w++;
        }
    }
    p->n_rg = r0 + w;
    if (!negate)
        return true;
    /* complement into fresh ranges appended after, then moved down */
    uint32_t next = 0;
    int32_t base = p->n_rg;
    for (int32_t k = 0; k < w; k++) {
        uint32_t lo = p->rg[2 * (r0 + k)], hi = p->rg[2 * (r0 + k) + 1];
        if (lo > next && !re_range(p, next, lo - 1))
            return false;
        next = hi + 1;
    }
    if (next <= 0x10FFFF && !re_range(p, next, 0x10FFFF))
        return false;
    int32_t m = p->n_rg - base;
    memmove(p->rg + 2 * r0, p->rg + 2 * base, (size_t)m * 2 * sizeof *p->rg);
    p->n_rg = r0 + m;
    return true;
}

static bool re_class_escape(re_parser *p, unsigned char c)
{
    switch (c) {
    case 'd': return re_range(p, '0', '9');
    case 'w': return re_range(p, '0', '9') && re_range(p, 'A', 'Z') && re_range(p, '_', '_') &&
                     re_range(p, 'a', 'z');
    case 's': return re_range(p, '\t', '\r') && re_range(p, ' ', ' ');
    }
    return false;
}

static int hexv(unsigned char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Decodes one UTF-8 char at p->i (strict); -1 on invalid input. */
static int64_t re_utf8(re_parser *p)
{
    const unsigned char *s = p->s + p->i;
    size_t left = p->n - p->i;
    unsigned char c = s[0];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || (size_t)len > left)
        return -1;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80)
            return -1;
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return -1;
    p->i += (size_t)len;
    return cp;
}

/* An escape after '\' (p->i at the char after it) that stands for one code
 * point; -1 when it is not one (error set). Class escapes are handled by
 * the callers. */
static int64_t re_escape_cp(re_parser *p)
{
    if (p->i >= p->n) {
        re_err(p, "a trailing backslash", NULL);
        return -1;
    }
    unsigned char c = p->s[p->i++];
    switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
    case 'x':
    case 'u': {
        int nd = c == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int k = 0; k < nd; k++) {
            int h = p->i < p->n ? hexv(p->s[p->i]) : -1;
            if (h < 0) {
                re_err(p, "expected hex digits after", c == 'x' ? "\\x" : "\\u");
                return -1;
            }
            v = v * 16 + (uint32_t)h;
            p->i++;
        }
        if (v >= 0xD800 && v <= 0xDFFF) {
            re_err(p, "a surrogate code point is not a character", NULL);
            return -1;
        }
        return v;
    }
    }
    if (c >= '1' && c <= '9') {
        re_err(p, "unsupported construct", "backreference");
        return -1;
    }
    if (c == 'b' || c == 'B' || c == 'A' || c == 'z' || c == 'Z' || c == 'G') {
        re_err(p, "unsupported construct", c == 'b' || c == 'B' ? "word boundary \\b/\\B" : "anchor escape");
        return -1;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
        char what[4] = {'\\', (char)c, 0, 0};
        re_err(p, "unsupported escape", what);
        return -1;
    }
    if (c >= 0x80) {
        p->i--;
        int64_t cp = re_utf8(p);
        if (cp < 0)
            re_err(p, "invalid UTF-8", NULL);
        return cp;
    }
    return c; /* escaped punctuation */
}

static int32_t re_set_node(re_parser *p, int32_t r0)
{
    int32_t x = re_node_new(p, RE_SET);
    if (x >= 0) {
        p->nodes[x].r0 = r0;
        p->nodes[x].nr = p->n_rg - r0;
    }
    return x;
}

static int32_t re_class(re_parser *p)
{
    /* p->i after '[' */
    bool neg = false;
    if (p->i < p->n && p->s[p->i] == '^') {
        neg = true;
        p->i++;
    }
    int32_t r0 = p->n_rg;
    bool first = true;
    for (;;) {
        if (p->i >= p->n) {
            re_err(p, "unterminated character class", NULL);
            return -1;
        }
        unsigned char c = p->s[p->i];
        if (c == ']' && !first) {
            p->i++;
            break;
        }
        first = false;
        if (c == '[' && p->i + 1 < p->n && p->s[p->i + 1] == ':') {
            re_err(p, "unsupported construct", "POSIX class [:name:]");
            return -1;
        }
        int64_t lo;
        if (c == '\\') {
            p->i++;
            unsigned char e = p->i < p->n ? p->s[p->i] : 0;
            if (e == 'd' || e == 'w' || e == 's') {
                p->i++;
                if (!re_class_escape(p, e))
                    return -1;
                continue;
            }
            if (e == 'D' || e == 'W' || e == 'S') {
                re_err(p, "unsupported construct", "negated class escape inside [ ]");
                return -1;
            }
            if (e == 'b') { /* backspace inside a class */
                p->i++;
                lo = 8;
            } else {
                lo = re_escape_cp(p);
            }
        } else {
            lo = re_utf8(p);
            if (lo < 0)
                re_err(p, "invalid UTF-8", NULL);
        }
        if (lo < 0)
            return -1;
        int64_t hi = lo;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            if (p->s[p->i] == '\\') {
                p->i++;
                hi = re_escape_cp(p);
            } else {
                hi = re_utf8(p);
                if (hi < 0)
                    re_err(p, "invalid UTF-8", NULL);
            }
            if (hi < 0)
                return -1;
            if (hi < lo) {
                re_err(p, "a class range out of order", NULL);
                return -1;
            }
        }
        if (!re_range(p, (uint32_t)lo, (uint32_t)hi))
            return -1;
    }
    if (!re_normalize(p, r0, neg))
        return -1;
    return re_set_node(p, r0);
}

static int32_t re_alt(re_parser *p);

static int32_t re_atom(re_parser *p)
{
    unsigned char c = p->s[p->i];
    if (c == '(') {
        p->i++;
        if (p->i < p->n && p->s[p->i] == '?') {
            const char *rest = (const char *)p->s + p->i;
            size_t left = p->n - p->i;
            if (left >= 2 && rest[1] == ':') {
                p->i += 2;
            } else if (left >= 3 && (rest[1] == 'P' || rest[1] == '<') &&
                       (rest[1] == 'P' ? rest[2] == '<' : rest[2] != '=' && rest[2] != '!')) {
                const char *gt = memchr(rest, '>', left);
                if (!gt) {
                    re_err(p, "unterminated group name", NULL);
                    return -1;
                }
                p->i += (size_t)(gt - rest) + 1;
            } else {
                re_err(p, "unsupported construct", "lookaround or inline flags (?...)");
                return -1;
            }
        }
        if (++p->depth > GRE_MAX_NEST) {
            re_err(p, "groups nested too deep", NULL);
            return -1;
        }
        int32_t x = re_alt(p);
        p->depth--;
        if (x < 0)
            return -1;
        if (p->i >= p->n || p->s[p->i] != ')') {
            re_err(p, "expected ')'", NULL);
            return -1;
        }
        p->i++;
        return x;
    }
    if (c == '[') {
        p->i++;
        return re_class(p);
    }
    int32_t r0 = p->n_rg;
    if (c == '.') {
        p->i++;
        if (!re_range(p, 0, '\n' - 1) || !re_range(p, '\n' + 1, 0x10FFFF))
            return -1;
        return re_set_node(p, r0);
    }
    if (c == '\\') {
        p->i++;
        unsigned char e = p->i < p->n ? p->s[p->i] : 0;
        if (e == 'd' || e == 'w' || e == 's' || e == 'D' || e == 'W' || e == 'S') {
            p->i++;
            if (!re_class_escape(p, (unsigned char)(e | 0x20)) ||
                !re_normalize(p, r0, e == 'D' || e == 'W' || e == 'S'))
                return -1;
            return re_set_node(p, r0);
        }
        int64_t cp = re_escape_cp(p);
        if (cp < 0 || !re_range(p, (uint32_t)cp, (uint32_t)cp))
            return -1;
        return re_set_node(p, r0);
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') {
        re_err(p, "a quantifier with nothing to repeat", NULL);
        return -1;
    }
    if (c == '^' || c == '$') {
        re_err(p, "unsupported construct", "an anchor inside the pattern (only a leading ^ and a trailing $)");
        return -1;
    }
    int64_t cp = re_utf8(p);
    if (cp < 0) {
        re_err(p, "invalid UTF-8", NULL);
        return -1;
    }
    if (!re_range(p, (uint32_t)cp, (uint32_t)cp))
        return -1;
    return re_set_node(p, r0);
}

static bool re_number(re_parser *p, int32_t *out)
{
    size_t start = p->i;
    int64_t v = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        v = v * 10 + (p->s[p->i] - '0');
        if (v > GRE_MAX_COUNT) {
            re_err(p, "a repetition count above the limit", "10000");
            return false;
        }
        p->i++;
    }
    *out = (int32_t)v;
    return p->i > start;
}

/* A quantifier after an atom, if any: wraps x in a REP. */
static int32_t re_quant(re_parser *p, int32_t x)
{
    while (p->i < p->n) {
        unsigned char c = p->s[p->i];
        int32_t mn, mx;
        if (c == '*') {
            mn = 0; mx = -1; p->i++;
        } else if (c == '+') {
            mn = 1; mx = -1; p->i++;
        } else if (c == '?') {
            mn = 0; mx = 1; p->i++;
        } else if (c == '{') {
            size_t save = p->i;
            p->i++;
            if (!re_number(p, &mn)) {
                if (p->a->status)
                    return -1;
                p->i = save; /* a literal '{' (as Python's re) */
                return x;
            }
            mx = mn;
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                if (!re_number(p, &mx)) {
                    if (p->a->status)
                        return -1;
                    mx = -1;
                }
            }
            if (p->i >= p->n || p->s[p->i] != '}') {
                re_err(p, "expected '}' in a repetition", NULL);
                return -1;
            }
            p->i++;
            if (mx >= 0 && mx < mn) {
                re_err(p, "a repetition {m,n} with n < m", NULL);
                return -1;
            }
        } else {
            return x;
        }
        if (p->i < p->n && p->s[p->i] == '?')
            p->i++; /* lazy: same language */
        else if (p->i < p->n && p->s[p->i] == '+') {
            re_err(p, "unsupported construct", "possessive quantifier");
            return -1;
        }
        int32_t r = re_node_new(p, RE_REP);
        if (r < 0)
            return -1;
        p->nodes[r].child = x;
        p->nodes[r].min = mn;
        p->nodes[r].max = mx;
        x = r;
    }
    return x;
}

static int32_t re_cat(re_parser *p)
{
    int32_t cat = re_node_new(p, RE_CAT), last = -1;
    if (cat < 0)
        return -1;
    while (p->i < p->n && p->s[p->i] != '|' && p->s[p->i] != ')') {
        if (p->s[p->i] == '$' && p->i + 1 == p->n && p->depth == 0) {
            p->i++; /* trailing anchor */
            break;
        }
        int32_t x = re_atom(p);
        if (x < 0)
            return -1;
        x = re_quant(p, x);
        if (x < 0)
            return -1;
        if (last < 0)
            p->nodes[cat].child = x;
        else
            p->nodes[last].next = x;
        last = x;
    }
    return cat;
}

static int32_t re_alt(re_parser *p)
{
    int32_t first = re_cat(p);
    if (first < 0 || p->i >= p->n || p->s[p->i] != '|')
        return first;
    int32_t alt = re_node_new(p, RE_ALT);
    if (alt < 0)
        return -1;
    p->nodes[alt].child = first;
    int32_t last = first;
    while (p->i < p->n && p->s[p->i] == '|') {
        p->i++;
        int32_t x = re_cat(p);
        if (x < 0)
            return -1;
        p->nodes[last].next = x;
        last = x;
    }
    return alt;
}

/* The one escape json_buf_string writes for cp, or NULL when cp is written
 * as itself. */
static const char *json_escape(uint32_t cp, char *tmp)
{
    switch (cp) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    case '\b': return "\\b";
    case '\f': return "\\f";
    }
    if (cp < 0x20 || cp == 0x7F) {
        static const char hx[] = "0123456789abcdef";
        memcpy(tmp, "\\u00", 4);
        tmp[4] = hx[cp >> 4];
        tmp[5] = hx[cp & 15];
        tmp[6] = 0;
        return tmp;
    }
    return NULL;
}

static void re_emit_set(re_parser *p, const re_node *x, int32_t from, int32_t to, gre_ctx ctx)
{
    for (int32_t k = 0; k < x->nr; k++) {
        uint32_t lo = p->rg[2 * (x->r0 + k)], hi = p->rg[2 * (x->r0 + k) + 1];
        if (ctx == GRE_RAW) {
            gnfa_utf8_range(p->a, from, to, lo, hi);
            continue;
        }
        /* split out the code points that a JSON string escapes */
        uint32_t cur = lo;
        while (cur <= hi && !p->a->status) {
            char tmp[8];
            const char *esc = cur <= 0x7F ? json_escape(cur, tmp) : NULL;
            if (esc) {
                gnfa_literal(p->a, from, to, esc, strlen(esc));
                cur++;
                continue;
            }
            uint32_t end = cur;
            while (end < hi && !(end + 1 <= 0x7F && json_escape(end + 1, tmp)))
                end++;
            gnfa_utf8_range(p->a, from, to, cur, end);
            cur = end + 1;
        }
    }
}

static void re_emit(re_parser *p, int32_t node, int32_t from, int32_t to, gre_ctx ctx)
{
    gnfa *a = p->a;
    if (a->status)
        return;
    const re_node *x = &p->nodes[node];
    switch (x->kind) {
    case RE_EMPTY:
        gnfa_eps(a, from, to);
        return;
    case RE_SET:
        re_emit_set(p, x, from, to, ctx);
        return;
    case RE_CAT: {
        int32_t cur = from;
        if (x->child < 0) {
            gnfa_eps(a, from, to);
            return;
        }
        for (int32_t c = x->child; c >= 0 && !a->status; c = p->nodes[c].next) {
            int32_t nxt = p->nodes[c].next < 0 ? to : gnfa_state(a);
            re_emit(p, c, cur, nxt, ctx);
            cur = nxt;
        }
        return;
    }
    case RE_ALT:
        for (int32_t c = x->child; c >= 0 && !a->status; c = p->nodes[c].next)
            re_emit(p, c, from, to, ctx);
        return;
    case RE_REP: {
        int32_t cur = from;
        for (int32_t k = 0; k < x->min && !a->status; k++) {
            int32_t nxt = gnfa_state(a);
            re_emit(p, x->child, cur, nxt, ctx);
            cur = nxt;
        }
        if (x->max < 0) {
            int32_t loop = gnfa_state(a);
            gnfa_eps(a, cur, loop);
            re_emit(p, x->child, loop, loop, ctx);
            gnfa_eps(a, loop, to);
            return;
        }
        for (int32_t k = x->min; k < x->max && !a->status; k++) {
            int32_t nxt = gnfa_state(a);
            gnfa_eps(a, cur, to);
            re_emit(p, x->child, cur, nxt, ctx);
            cur = nxt;
        }
        gnfa_eps(a, cur, to);
        return;
    }
    }
}

int gre_emit(gnfa *a, int32_t from, int32_t to, const char *src, size_t len, gre_ctx ctx,
             const char *what)
{
    if (a->status)
        return a->status;
    re_parser p;
    memset(&p, 0, sizeof p);
    p.a = a;
    p.what = what;
    p.s = (const unsigned char *)src;
    p.n = len;
    if (p.n > 0 && p.s[0] == '^')
        p.i = 1;
    int32_t root = re_alt(&p);
    if (root >= 0 && p.i < p.n)
        re_err(&p, "unbalanced ')'", NULL);
    if (root < 0 && !a->status)
        re_err(&p, "cannot parse", NULL); /* every failure above sets a message; never reached */
    if (!a->status)
        re_emit(&p, root, from, to, ctx);
    free(p.nodes);
    free(p.rg);
    return a->status;
}
