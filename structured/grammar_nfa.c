/* grammar_nfa: the NFA builder, determinization into rule DFAs, and the
 * stepper (see grammar.h for the automaton, grammar_internal.h for the
 * NFA).
 *
 * Determinization is the subset construction per rule over byte classes
 * (bytes that no edge tells apart share a column). A call edge is taken on
 * the bytes that can start its callee (FIRST): in a DFA state, a byte that
 * both a byte edge and a call edge (or calls of two different rules) could
 * take is refused at compile time ("ambiguous recursion") — the subset
 * handles any other nondeterminism. Afterwards every transition into a
 * state that cannot reach acceptance is removed, so a live state always
 * has a way to finish, and an empty language is a compile error.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"
#include "json.h"

/* ---- NFA builder ---------------------------------------------------------- */

int gnfa_fail(gnfa *a, int status, const char *fmt, ...)
{
    if (a->status)
        return a->status;
    a->status = status;
    if (a->err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(a->err->msg, sizeof a->err->msg, fmt, ap);
        va_end(ap);
    }
    return status;
}

int32_t gnfa_state(gnfa *a)
{
    if (a->status)
        return -1;
    if (a->n_states >= GRAMMAR_MAX_NFA_STATES) {
        gnfa_fail(a, PG_EINVAL, "grammar: the constraint is too large (more than %d automaton states)",
                  GRAMMAR_MAX_NFA_STATES);
        return -1;
    }
    return a->n_states++;
}

static void add_edge(gnfa *a, int32_t from, int32_t to, uint8_t kind, int32_t rule, uint8_t lo,
                     uint8_t hi)
{
    if (a->status || from < 0 || to < 0)
        return;
    if (a->n_edges == a->cap_edges) {
        int32_t cap = a->cap_edges ? 2 * a->cap_edges : 256;
        if (cap > 8 * GRAMMAR_MAX_NFA_STATES) {
            gnfa_fail(a, PG_EINVAL, "grammar: the constraint is too large (more than %d automaton edges)",
                      4 * GRAMMAR_MAX_NFA_STATES);
            return;
        }
        gnfa_edge *e = realloc(a->edges, (size_t)cap * sizeof *e);
        if (!e) {
            gnfa_fail(a, PG_ENOMEM, "grammar: out of memory");
            return;
        }
        a->edges = e;
        a->cap_edges = cap;
    }
    gnfa_edge *e = &a->edges[a->n_edges++];
    e->from = from;
    e->to = to;
    e->kind = kind;
    e->rule = rule;
    e->lo = lo;
    e->hi = hi;
}

void gnfa_bytes(gnfa *a, int32_t from, int32_t to, uint8_t lo, uint8_t hi)
{
    add_edge(a, from, to, GNFA_BYTES, -1, lo, hi);
}
void gnfa_eps(gnfa *a, int32_t from, int32_t to) { add_edge(a, from, to, GNFA_EPS, -1, 0, 0); }
void gnfa_call(gnfa *a, int32_t from, int32_t to, int32_t rule)
{
    add_edge(a, from, to, GNFA_CALL, rule, 0, 0);
}

int32_t gnfa_rule(gnfa *a)
{
    if (a->status)
        return -1;
    if (a->n_rules == a->cap_rules) {
        int32_t cap = a->cap_rules ? 2 * a->cap_rules : 8;
        int32_t *s = realloc(a->rule_start, (size_t)cap * sizeof *s);
        if (s)
            a->rule_start = s;
        int32_t *t = realloc(a->rule_accept, (size_t)cap * sizeof *t);
        if (t)
            a->rule_accept = t;
        if (!s || !t) {
            gnfa_fail(a, PG_ENOMEM, "grammar: out of memory");
            return -1;
        }
        a->cap_rules = cap;
    }
    int32_t s = gnfa_state(a), t = gnfa_state(a);
    if (a->status)
        return -1;
    a->rule_start[a->n_rules] = s;
    a->rule_accept[a->n_rules] = t;
    return a->n_rules++;
}

void gnfa_literal(gnfa *a, int32_t from, int32_t to, const char *s, size_t n)
{
    if (n == 0) {
        gnfa_eps(a, from, to);
        return;
    }
    int32_t cur = from;
    for (size_t i = 0; i < n && !a->status; i++) {
        int32_t nxt = i + 1 == n ? to : gnfa_state(a);
        gnfa_bytes(a, cur, nxt, (uint8_t)s[i], (uint8_t)s[i]);
        cur = nxt;
    }
}

static int utf8_put(uint8_t *out, uint32_t cp)
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* The classic split of a code point range into ranges whose UTF-8
 * encodings are products of byte ranges (as RE2 / Rust's utf8-ranges). */
void gnfa_utf8_range(gnfa *a, int32_t from, int32_t to, uint32_t lo, uint32_t hi)
{
    if (a->status || lo > hi)
        return;
    if (hi > 0x10FFFF)
        hi = 0x10FFFF;
    if (lo > hi)
        return;
    if (lo <= 0xDFFF && hi >= 0xD800) {
        if (lo < 0xD800)
            gnfa_utf8_range(a, from, to, lo, 0xD7FF);
        if (hi > 0xDFFF)
            gnfa_utf8_range(a, from, to, 0xE000, hi);
        return;
    }
    static const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF};
    for (int k = 0; k < 3; k++)
        if (lo <= bounds[k] && hi > bounds[k]) {
            gnfa_utf8_range(a, from, to, lo, bounds[k]);
            gnfa_utf8_range(a, from, to, bounds[k] + 1, hi);
            return;
        }
    if (hi < 0x80) {
        gnfa_bytes(a, from, to, (uint8_t)lo, (uint8_t)hi);
        return;
    }
    int n = hi < 0x800 ? 2 : hi < 0x10000 ? 3 : 4;
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                gnfa_utf8_range(a, from, to, lo, lo | m);
                gnfa_utf8_range(a, from, to, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                gnfa_utf8_range(a, from, to, lo, (hi & ~m) - 1);
                gnfa_utf8_range(a, from, to, hi & ~m, hi);
                return;
            }
        }
    }
    uint8_t x[4], y[4];
    utf8_put(x, lo);
    utf8_put(y, hi);
    int32_t cur = from;
    for (int i = 0; i < n && !a->status; i++) {
        int32_t nxt = i + 1 == n ? to : gnfa_state(a);
        gnfa_bytes(a, cur, nxt, x[i], y[i]);
        cur = nxt;
    }
}

void gjson_string_char(gnfa *a, int32_t from, int32_t to)
{
    gnfa_utf8_range(a, from, to, 0x20, 0x21);
    gnfa_utf8_range(a, from, to, 0x23, 0x5B);
    gnfa_utf8_range(a, from, to, 0x5D, 0x10FFFF);
    int32_t esc = gnfa_state(a);
    gnfa_bytes(a, from, esc, '\\', '\\');
    static const char simple[] = "\"\\/bfnrt";
    for (const char *p = simple; *p; p++)
        gnfa_bytes(a, esc, to, (uint8_t)*p, (uint8_t)*p);
    int32_t u = gnfa_state(a);
    gnfa_bytes(a, esc, u, 'u', 'u');
    int32_t cur = u;
    for (int i = 0; i < 4; i++) {
        int32_t nxt = i == 3 ? to : gnfa_state(a);
        gnfa_bytes(a, cur, nxt, '0', '9');
        gnfa_bytes(a, cur, nxt, 'a', 'f');
        gnfa_bytes(a, cur, nxt, 'A', 'F');
        cur = nxt;
    }
}

/* ---- the compiled grammar -------------------------------------------------- */

void grammar_destroy(grammar *g)
{
    if (!g)
        return;
    free(g->trans);
    free(g->accept);
    free(g->rule_start);
    free(g->calls);
    free(g->dist);
    free(g->reach);
    free(g);
}

int32_t grammar_num_states(const grammar *g) { return g->n_states; }
int32_t grammar_num_rules(const grammar *g) { return g->n_rules; }

/* ---- determinization --------------------------------------------------------- */

typedef struct ivec {
    int32_t *p;
    int32_t n, cap;
} ivec;

static bool ivec_push(ivec *v, int32_t x)
{
    if (v->n == v->cap) {
        int32_t cap = v->cap ? 2 * v->cap : 16;
        int32_t *p = realloc(v->p, (size_t)cap * sizeof *p);
        if (!p)
            return false;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = x;
    return true;
}

typedef struct det {
    gnfa *a;
    int32_t *off;          /* [n_states + 1] CSR of edges by from */
    gnfa_edge *ed;         /* sorted edges */
    uint8_t *is_accept;    /* [n_states] */
    uint32_t *mark;        /* [n_states] generation stamps */
    uint32_t gen;
    ivec stack;
    int64_t work;
    uint8_t cls[256];
    int32_t n_classes;
    uint64_t (*first)[4];  /* [n_rules] class bitsets */
    uint8_t *first_state;  /* [n_rules]: 0 todo, 1 in progress, 2 done */
    /* DFA states: sets in a pool */
    ivec pool;             /* concatenated sorted sets */
    ivec set_off;          /* [n_dfa + 1] */
    int32_t *htab;         /* open addressing: dfa id or -1 */
    size_t hcap;
    ivec trans;            /* [n_dfa][n_classes] */
    ivec calls;            /* pairs rule, ret */
} det;

static int det_oom(det *d) { return gnfa_fail(d->a, PG_ENOMEM, "grammar: out of memory"); }

static int det_budget(det *d, int64_t w)
{
    d->work += w;
    if (d->work > GRAMMAR_MAX_WORK)
        return gnfa_fail(d->a, PG_EINVAL,
                         "grammar: the constraint is too complex to compile (more than %d steps)",
                         GRAMMAR_MAX_WORK);
    return PG_OK;
}

static int cmp_i32(const void *x, const void *y)
{
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

/* Epsilon closure of seeds[0, n) into out (sorted, no duplicates). */
static int closure(det *d, const int32_t *seeds, int32_t n, ivec *out)
{
    out->n = 0;
    if (++d->gen == 0) {
        memset(d->mark, 0, (size_t)d->a->n_states * sizeof *d->mark);
        d->gen = 1;
    }
    d->stack.n = 0;
    for (int32_t i = 0; i < n; i++)
        if (d->mark[seeds[i]] != d->gen) {
            d->mark[seeds[i]] = d->gen;
            if (!ivec_push(&d->stack, seeds[i]))
                return det_oom(d);
        }
    while (d->stack.n > 0) {
        int32_t s = d->stack.p[--d->stack.n];
        if (!ivec_push(out, s))
            return det_oom(d);
        for (int32_t k = d->off[s]; k < d->off[s + 1]; k++) {
            const gnfa_edge *e = &d->ed[k];
            if (e->kind == GNFA_EPS && d->mark[e->to] != d->gen) {
                d->mark[e->to] = d->gen;
                if (!ivec_push(&d->stack, e->to))
                    return det_oom(d);
            }
        }
    }
    if (det_budget(d, out->n))
        return d->a->status;
    qsort(out->p, (size_t)out->n, sizeof *out->p, cmp_i32);
    return PG_OK;
}

static int first_of(det *d, int32_t r)
{
    if (d->first_state[r] == 2)
        return PG_OK;
    if (d->first_state[r] == 1)
        return gnfa_fail(d->a, PG_EUNSUPPORTED,
                         "grammar: left recursion (a $ref that reaches itself before any text)");
    d->first_state[r] = 1;
    ivec cl = {0};
    int32_t s0 = d->a->rule_start[r];
    int rc = closure(d, &s0, 1, &cl);
    for (int32_t i = 0; !rc && i < cl.n; i++) {
        int32_t s = cl.p[i];
        if (s == d->a->rule_accept[r] && r > 0)
            rc = gnfa_fail(d->a, PG_EUNSUPPORTED, "grammar: a recursive rule matches the empty string");
        for (int32_t k = d->off[s]; !rc && k < d->off[s + 1]; k++) {
            const gnfa_edge *e = &d->ed[k];
            if (e->kind == GNFA_BYTES) {
                for (int c = d->cls[e->lo]; c <= d->cls[e->hi]; c++)
                    d->first[r][c >> 6] |= 1ull << (c & 63);
            } else if (e->kind == GNFA_CALL) {
                /* closure() is not reentrant over cl: cl is ours, the
                 * stack and marks are rebuilt per call */
                rc = first_of(d, e->rule);
                for (int w = 0; !rc && w < 4; w++)
                    d->first[r][w] |= d->first[e->rule][w];
            }
        }
    }
    free(cl.p);
    d->first_state[r] = 2;
    return rc;
}

static uint64_t hash_set(const int32_t *s, int32_t n)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)n;
    for (int32_t i = 0; i < n; i++) {
        h ^= (uint64_t)(uint32_t)s[i];
        h *= 1099511628211ull;
        h ^= h >> 29;
    }
    return h;
}

static int rehash(det *d)
{
    size_t cap = d->hcap ? 2 * d->hcap : 1024;
    int32_t *t = malloc(cap * sizeof *t);
    if (!t)
        return det_oom(d);
    for (size_t i = 0; i < cap; i++)
        t[i] = -1;
    int32_t n = d->set_off.n - 1;
    for (int32_t id = 0; id < n; id++) {
        const int32_t *s = d->pool.p + d->set_off.p[id];
        int32_t len = d->set_off.p[id + 1] - d->set_off.p[id];
        size_t h = (size_t)hash_set(s, len) & (cap - 1);
        while (t[h] >= 0)
            h = (h + 1) & (cap - 1);
        t[h] = id;
    }
    free(d->htab);
    d->htab = t;
    d->hcap = cap;
    return PG_OK;
}

/* The DFA id of set s (creating it); -1 on error. */
static int32_t dfa_state(det *d, const ivec *s)
{
    int32_t n = d->set_off.n - 1;
    if ((size_t)(n + 1) * 2 > d->hcap && rehash(d))
        return -1;
    size_t h = (size_t)hash_set(s->p, s->n) & (d->hcap - 1);
    while (d->htab[h] >= 0) {
        int32_t id = d->htab[h];
        int32_t len = d->set_off.p[id + 1] - d->set_off.p[id];
        if (len == s->n && memcmp(d->pool.p + d->set_off.p[id], s->p, (size_t)len * sizeof *s->p) == 0)
            return id;
        h = (h + 1) & (d->hcap - 1);
    }
    if (n >= GRAMMAR_MAX_DFA_STATES) {
        gnfa_fail(d->a, PG_EINVAL, "grammar: the constraint is too large (more than %d DFA states)",
                  GRAMMAR_MAX_DFA_STATES);
        return -1;
    }
    for (int32_t i = 0; i < s->n; i++)
        if (!ivec_push(&d->pool, s->p[i])) {
            det_oom(d);
            return -1;
        }
    if (!ivec_push(&d->set_off, d->pool.n)) {
        det_oom(d);
        return -1;
    }
    for (int32_t c = 0; c < d->n_classes; c++)
        if (!ivec_push(&d->trans, -1)) {
            det_oom(d);
            return -1;
        }
    d->htab[h] = n;
    return n;
}

static int32_t add_call(det *d, int32_t rule, int32_t ret)
{
    for (int32_t k = 0; k < d->calls.n; k += 2)
        if (d->calls.p[k] == rule && d->calls.p[k + 1] == ret)
            return k / 2;
    if (!ivec_push(&d->calls, rule) || !ivec_push(&d->calls, ret)) {
        det_oom(d);
        return -1;
    }
    return d->calls.n / 2 - 1;
}

/* Expands DFA state id: one transition per byte class. */
static int expand(det *d, int32_t id, ivec *buckets, ivec *callb, ivec *cl)
{
    int32_t a0 = d->set_off.p[id], a1 = d->set_off.p[id + 1];
    for (int32_t c = 0; c < d->n_classes; c++) {
        buckets[c].n = 0;
        callb[c].n = 0;
    }
    for (int32_t i = a0; i < a1; i++) {
        int32_t s = d->pool.p[i];
        for (int32_t k = d->off[s]; k < d->off[s + 1]; k++) {
            const gnfa_edge *e = &d->ed[k];
            if (e->kind == GNFA_BYTES) {
                for (int c = d->cls[e->lo]; c <= d->cls[e->hi]; c++)
                    if (!ivec_push(&buckets[c], e->to))
                        return det_oom(d);
                if (det_budget(d, d->cls[e->hi] - d->cls[e->lo] + 1))
                    return d->a->status;
            } else if (e->kind == GNFA_CALL) {
                for (int c = 0; c < d->n_classes; c++)
                    if ((d->first[e->rule][c >> 6] >> (c & 63)) & 1)
                        if (!ivec_push(&callb[c], e->rule) || !ivec_push(&callb[c], e->to))
                            return det_oom(d);
            }
        }
    }
    for (int32_t c = 0; c < d->n_classes; c++) {
        int32_t v = -1;
        if (buckets[c].n > 0 && callb[c].n > 0 && (d->a->ambiguous = true))
            return gnfa_fail(d->a, PG_EUNSUPPORTED,
                             "grammar: ambiguous recursion: a recursive $ref or nested value and "
                             "another alternative can start with the same byte at one point");
        if (buckets[c].n > 0) {
            if (closure(d, buckets[c].p, buckets[c].n, cl))
                return d->a->status;
            v = dfa_state(d, cl);
        } else if (callb[c].n > 0) {
            int32_t rule = callb[c].p[0];
            int32_t nt = 0;
            for (int32_t k = 0; k < callb[c].n; k += 2) {
                if (callb[c].p[k] != rule && (d->a->ambiguous = true))
                    return gnfa_fail(d->a, PG_EUNSUPPORTED,
                                     "grammar: ambiguous recursion: two recursive alternatives can "
                                     "start with the same byte at one point");
                callb[c].p[nt++] = callb[c].p[k + 1];
            }
            if (closure(d, callb[c].p, nt, cl))
                return d->a->status;
            int32_t ret = dfa_state(d, cl);
            if (ret < 0)
                return d->a->status;
            int32_t k = add_call(d, rule, ret);
            if (k < 0)
                return d->a->status;
            v = -2 - k;
        } else {
            continue;
        }
        if (d->a->status)
            return d->a->status;
        d->trans.p[(size_t)id * (size_t)d->n_classes + (size_t)c] = v;
    }
    return PG_OK;
}

static void det_free(det *d, ivec *buckets, ivec *callb)
{
    if (buckets)
        for (int32_t c = 0; c < d->n_classes; c++)
            free(buckets[c].p);
    if (callb)
        for (int32_t c = 0; c < d->n_classes; c++)
            free(callb[c].p);
    free(buckets);
    free(callb);
    free(d->off);
    free(d->ed);
    free(d->is_accept);
    free(d->mark);
    free(d->stack.p);
    free(d->first);
    free(d->first_state);
    free(d->pool.p);
    free(d->set_off.p);
    free(d->htab);
    free(d->trans.p);
    free(d->calls.p);
}

/* Removes transitions into states that cannot reach acceptance (given the
 * rules); the language is empty when rule 0's start is such a state.
 * "Can finish" is a Horn-clause closure solved in linear time: an accepting
 * state can; a state with a goto into one that can, can; a state with a
 * call can once the callee's start and the return state both can. A
 * backward search over the reversed gotos, re-seeded by the calls that
 * became possible (at most n_calls + 1 rounds). */
static int prune(grammar *g)
{
    int32_t n = g->n_states, nc = g->n_classes;
    uint8_t *ok = calloc((size_t)n, 1);
    uint8_t *call_done = calloc((size_t)g->n_calls + 1, 1);
    int32_t *roff = calloc((size_t)n + 1, sizeof *roff);      /* reversed gotos, CSR */
    int32_t *coff = calloc((size_t)g->n_calls + 1, sizeof *coff); /* callers per call */
    int32_t *queue = malloc(((size_t)n + 1) * sizeof *queue);
    int32_t *rsrc = NULL, *csrc = NULL, *fill = NULL;
    int rc = PG_ENOMEM;
    if (!ok || !call_done || !roff || !coff || !queue)
        goto done;
    size_t n_goto = 0, n_callers = 0;
    for (int32_t st = 0; st < n; st++)
        for (int32_t c = 0; c < nc; c++) {
            int32_t v = g->trans[(size_t)st * (size_t)nc + (size_t)c];
            if (v >= 0) {
                roff[v + 1]++;
                n_goto++;
            } else if (v <= -2) {
                coff[-2 - v + 1]++;
                n_callers++;
            }
        }
    for (int32_t st = 0; st < n; st++)
        roff[st + 1] += roff[st];
    for (int32_t k = 0; k < g->n_calls; k++)
        coff[k + 1] += coff[k];
    rsrc = malloc((n_goto + 1) * sizeof *rsrc);
    csrc = malloc((n_callers + 1) * sizeof *csrc);
    fill = malloc(((size_t)n + (size_t)g->n_calls + 1) * sizeof *fill);
    if (!rsrc || !csrc || !fill)
        goto done;
    memcpy(fill, roff, (size_t)n * sizeof *fill);
    memcpy(fill + n, coff, (size_t)g->n_calls * sizeof *fill);
    for (int32_t st = 0; st < n; st++)
        for (int32_t c = 0; c < nc; c++) {
            int32_t v = g->trans[(size_t)st * (size_t)nc + (size_t)c];
            if (v >= 0)
                rsrc[fill[v]++] = st;
            else if (v <= -2)
                csrc[fill[n + (-2 - v)]++] = st;
        }
    int32_t qh = 0, qt = 0;
    for (int32_t st = 0; st < n; st++)
        if (g->accept[st]) {
            ok[st] = 1;
            queue[qt++] = st;
        }
    for (;;) {
        while (qh < qt) {
            int32_t v = queue[qh++];
            for (int32_t k = roff[v]; k < roff[v + 1]; k++)
                if (!ok[rsrc[k]]) {
                    ok[rsrc[k]] = 1;
                    queue[qt++] = rsrc[k];
                }
        }
        bool more = false;
        for (int32_t k = 0; k < g->n_calls; k++) {
            if (call_done[k] || !ok[g->rule_start[g->calls[k].rule]] || !ok[g->calls[k].ret])
                continue;
            call_done[k] = 1;
            for (int32_t j = coff[k]; j < coff[k + 1]; j++)
                if (!ok[csrc[j]]) {
                    ok[csrc[j]] = 1;
                    queue[qt++] = csrc[j];
                    more = true;
                }
        }
        if (!more)
            break;
    }
    for (int32_t st = 0; st < n; st++)
        for (int32_t c = 0; c < nc; c++) {
            int32_t *v = &g->trans[(size_t)st * (size_t)nc + (size_t)c];
            if ((*v >= 0 && !ok[*v]) || (*v <= -2 && !call_done[-2 - *v]))
                *v = -1;
        }
    rc = ok[g->rule_start[0]] ? PG_OK : PG_EINVAL;
done:
    free(ok);
    free(call_done);
    free(roff);
    free(coff);
    free(queue);
    free(rsrc);
    free(csrc);
    free(fill);
    return rc;
}

static int determinize(gnfa *a, grammar **out)
{
    det d;
    memset(&d, 0, sizeof d);
    d.a = a;
    int32_t ns = a->n_states;
    ivec *buckets = NULL, *callb = NULL;
    ivec cl = {0};
    grammar *g = NULL;
    d.off = calloc((size_t)ns + 1, sizeof *d.off);
    d.ed = malloc(((size_t)a->n_edges + 1) * sizeof *d.ed);
    d.is_accept = calloc((size_t)ns, 1);
    d.mark = calloc((size_t)ns, sizeof *d.mark);
    d.first = calloc((size_t)a->n_rules, sizeof *d.first);
    d.first_state = calloc((size_t)a->n_rules, 1);
    if (!d.off || !d.ed || !d.is_accept || !d.mark || !d.first || !d.first_state) {
        det_oom(&d);
        goto done;
    }
    for (int32_t k = 0; k < a->n_edges; k++)
        d.off[a->edges[k].from + 1]++;
    for (int32_t s = 0; s < ns; s++)
        d.off[s + 1] += d.off[s];
    {
        int32_t *fill = malloc(((size_t)ns + 1) * sizeof *fill);
        if (!fill) {
            det_oom(&d);
            goto done;
        }
        memcpy(fill, d.off, ((size_t)ns + 1) * sizeof *fill);
        for (int32_t k = 0; k < a->n_edges; k++)
            d.ed[fill[a->edges[k].from]++] = a->edges[k];
        free(fill);
    }
    for (int32_t r = 0; r < a->n_rules; r++)
        d.is_accept[a->rule_accept[r]] = 1;
    /* byte classes */
    {
        uint8_t bound[257] = {0};
        for (int32_t k = 0; k < a->n_edges; k++)
            if (a->edges[k].kind == GNFA_BYTES) {
                bound[a->edges[k].lo] = 1;
                bound[a->edges[k].hi + 1] = 1;
            }
        int c = 0;
        for (int b = 0; b < 256; b++) {
            if (b > 0 && bound[b])
                c++;
            d.cls[b] = (uint8_t)c;
        }
        d.n_classes = c + 1;
    }
    for (int32_t r = 0; r < a->n_rules && !a->status; r++)
        first_of(&d, r);
    if (a->status)
        goto done;
    buckets = calloc((size_t)d.n_classes, sizeof *buckets);
    callb = calloc((size_t)d.n_classes, sizeof *callb);
    int32_t *rstart = malloc((size_t)a->n_rules * sizeof *rstart);
    if (!buckets || !callb || !rstart || !ivec_push(&d.set_off, 0)) {
        free(rstart);
        det_oom(&d);
        goto done;
    }
    for (int32_t r = 0; r < a->n_rules && !a->status; r++) {
        if (closure(&d, &a->rule_start[r], 1, &cl) == PG_OK)
            rstart[r] = dfa_state(&d, &cl);
    }
    for (int32_t id = 0; !a->status && id < d.set_off.n - 1; id++)
        expand(&d, id, buckets, callb, &cl);
    if (a->status) {
        free(rstart);
        goto done;
    }
    g = calloc(1, sizeof *g);
    if (!g) {
        free(rstart);
        det_oom(&d);
        goto done;
    }
    g->n_states = d.set_off.n - 1;
    g->n_classes = d.n_classes;
    g->n_rules = a->n_rules;
    g->n_calls = d.calls.n / 2;
    memcpy(g->cls, d.cls, sizeof g->cls);
    g->trans = d.trans.p;
    d.trans.p = NULL;
    g->rule_start = rstart;
    g->accept = calloc((size_t)g->n_states, 1);
    g->calls = malloc(((size_t)g->n_calls + 1) * sizeof *g->calls);
    if (!g->accept || !g->calls) {
        det_oom(&d);
        goto done;
    }
    for (int32_t k = 0; k < g->n_calls; k++) {
        g->calls[k].rule = d.calls.p[2 * k];
        g->calls[k].ret = d.calls.p[2 * k + 1];
    }
    /* accepting: the set holds its rule's accept state */
    for (int32_t id = 0; id < g->n_states; id++)
        for (int32_t i = d.set_off.p[id]; i < d.set_off.p[id + 1]; i++)
            if (d.is_accept[d.pool.p[i]])
                g->accept[id] = 1;
    {
        int rc = prune(g);
        if (rc == PG_ENOMEM)
            det_oom(&d);
        else if (rc)
            gnfa_fail(a, PG_EINVAL, "grammar: the constraint matches nothing (empty language)");
        else if (gbudget_prepare(g) != PG_OK)
            det_oom(&d);
    }
done:
    free(cl.p);
    det_free(&d, buckets, callb);
    if (a->status) {
        grammar_destroy(g);
        return a->status;
    }
    *out = g;
    return PG_OK;
}

/* ---- compile ------------------------------------------------------------------ */

static int emit_choice(gnfa *a, const char *src, size_t len)
{
    json_doc d;
    pg_error e;
    if (json_parse(&d, src, len, "choice", &e) != PG_OK)
        return gnfa_fail(a, PG_EINVAL, "choice: %s", e.msg);
    int rc = PG_OK;
    if (!json_is_array(&d, 0) || json_size(&d, 0) == 0) {
        rc = gnfa_fail(a, PG_EINVAL, "choice: expected a non-empty array of strings");
    } else {
        int n = json_size(&d, 0);
        for (int k = 0, i = 1; k < n && !rc; k++, i = json_skip(&d, i)) {
            char *s = NULL;
            size_t sl = 0;
            if (!json_is_string(&d, i) || json_get_string(&d, i, &s, &sl, &e) != PG_OK) {
                rc = gnfa_fail(a, PG_EINVAL, "choice[%d]: expected a string", k);
                break;
            }
            gnfa_literal(a, a->rule_start[0], a->rule_accept[0], s, sl);
            free(s);
            rc = a->status;
        }
    }
    json_doc_free(&d);
    return rc;
}

/* One attempt: the NFA with `any_inline` inline levels of generic JSON,
 * then determinization. *ambiguous tells whether a failure was an
 * ambiguous recursion. */
static int compile_once(grammar **out, grammar_kind kind, const char *src, size_t len,
                        int any_inline, bool *ambiguous, pg_error *err)
{
    gnfa a;
    memset(&a, 0, sizeof a);
    a.err = err;
    a.any_inline = any_inline;
    int32_t r0 = gnfa_rule(&a);
    int rc = a.status;
    if (!rc) {
        switch (kind) {
        case GRAMMAR_JSON_SCHEMA:
        case GRAMMAR_JSON_OBJECT:
            rc = gschema_emit(&a, kind, src, len);
            break;
        case GRAMMAR_REGEX:
            rc = gre_emit(&a, a.rule_start[r0], a.rule_accept[r0], src, len, GRE_RAW, "regex");
            break;
        case GRAMMAR_CHOICE:
            rc = emit_choice(&a, src, len);
            break;
        default:
            rc = gnfa_fail(&a, PG_EINVAL, "grammar: unknown constraint kind %d", (int)kind);
        }
    }
    if (!rc && !a.status)
        rc = determinize(&a, out);
    else if (!rc)
        rc = a.status;
    *ambiguous = a.ambiguous;
    free(a.edges);
    free(a.rule_start);
    free(a.rule_accept);
    return rc;
}

/* "Any value" next to an alternative that starts with the same bracket
 * (anyOf [{}, {"type": "array", ...}]) makes a rule call ambiguous: then
 * the generic value is written out inline one more level, up to this many
 * (each level roughly doubles its size), before giving up. */
#define GRAMMAR_MAX_ANY_INLINE 4

int grammar_compile(grammar **out, grammar_kind kind, const char *src, size_t len,
                    pg_error *err)
{
    *out = NULL;
    if (kind != GRAMMAR_JSON_OBJECT && !src)
        return pg_error_set(err, PG_EINVAL, "grammar: expected a constraint, got NULL");
    if (len > GRAMMAR_MAX_SRC_BYTES)
        return pg_error_set(err, PG_EINVAL, "grammar: the constraint is %zu bytes, more than %d",
                            len, GRAMMAR_MAX_SRC_BYTES);
    for (int k = 0;; k++) {
        bool ambiguous = false;
        int rc = compile_once(out, kind, src, len, k, &ambiguous, err);
        if (rc == PG_OK || !ambiguous || k == GRAMMAR_MAX_ANY_INLINE ||
            (kind != GRAMMAR_JSON_SCHEMA && kind != GRAMMAR_JSON_OBJECT))
            return rc;
    }
}

/* ---- stepping --------------------------------------------------------------------- */

void grammar_state_init(const grammar *g, grammar_state *s)
{
    s->n = 1;
    s->st[0] = g->rule_start[0];
}

bool grammar_advance(const grammar *g, grammar_state *s, const uint8_t *bytes, size_t n)
{
    grammar_state t = *s;
    for (size_t i = 0; i < n; i++)
        if (!gstep_byte(g, &t, bytes[i]))
            return false;
    *s = t;
    return true;
}

bool grammar_can_end(const grammar *g, const grammar_state *s)
{
    for (int32_t i = 0; i < s->n; i++)
        if (!g->accept[s->st[i]])
            return false;
    return true;
}

