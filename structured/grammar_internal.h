/* grammar_internal: what grammar_nfa.c (Thompson NFA, determinization, the
 * stepper), grammar_regex.c and grammar_schema.c share. Not public API.
 *
 * The NFA: states 0 .. n_states-1; edges are byte ranges [lo, hi],
 * epsilons, or calls of a rule (the callee matches, then the edge's target
 * is reached). Every rule r has an NFA start and accept state; rule 0 is the
 * whole constraint. Emitters build fragments between two given states:
 * emit_x(nfa, from, to, ...) adds states and edges so that the strings x
 * describes lead from `from` to `to`.
 */
#ifndef PG_GRAMMAR_INTERNAL_H
#define PG_GRAMMAR_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar.h"
#include "pg_error.h"

enum { GNFA_BYTES = 0, GNFA_EPS = 1, GNFA_CALL = 2 };

typedef struct gnfa_edge {
    int32_t from, to;
    int32_t rule;      /* GNFA_CALL */
    uint8_t lo, hi;    /* GNFA_BYTES */
    uint8_t kind;
} gnfa_edge;

typedef struct gnfa {
    int32_t n_states;
    gnfa_edge *edges;
    int32_t n_edges, cap_edges;
    int32_t *rule_start, *rule_accept;  /* [n_rules] */
    int32_t n_rules, cap_rules;
    pg_error *err;
    int status;        /* first failure (sticky): every builder call is then a no-op */
    bool ambiguous;    /* the failure was an ambiguous recursion (determinization) */
    int any_inline;    /* JSON schemas: nesting levels of "any value" written inline
                          before falling back to rule calls (grammar_compile raises it
                          when calls make the automaton ambiguous) */
} gnfa;

/* Builders: on failure they set nfa->status (once, with a message) and
 * return -1 / do nothing; callers check nfa->status at the end. */
int32_t gnfa_state(gnfa *a);
void gnfa_bytes(gnfa *a, int32_t from, int32_t to, uint8_t lo, uint8_t hi);
void gnfa_eps(gnfa *a, int32_t from, int32_t to);
void gnfa_call(gnfa *a, int32_t from, int32_t to, int32_t rule);
/* A new rule with fresh start/accept states; its index. */
int32_t gnfa_rule(gnfa *a);
int gnfa_fail(gnfa *a, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* The literal bytes s[0, n). */
void gnfa_literal(gnfa *a, int32_t from, int32_t to, const char *s, size_t n);
/* Any code point in [lo, hi] (surrogates excluded) as UTF-8. */
void gnfa_utf8_range(gnfa *a, int32_t from, int32_t to, uint32_t lo, uint32_t hi);

/* How a regex's characters are written: as themselves (a top-level regex),
 * or as the text of a JSON string literal (a schema "pattern"/"format": '"',
 * '\\' and control characters as their one canonical escape, the one
 * json_buf_string writes). */
typedef enum gre_ctx { GRE_RAW = 0, GRE_JSON_STRING } gre_ctx;

/* Parses the regex src[0, len) (whole-string match; leading ^ and trailing
 * $ are accepted and ignored) and emits it between from and to. `what`
 * names it in messages ("regex", "pattern"). Returns 0 or the error status
 * (also set on the nfa). */
int gre_emit(gnfa *a, int32_t from, int32_t to, const char *src, size_t len, gre_ctx ctx,
             const char *what);

/* One JSON string character as it appears inside the quotes: any code point
 * except '"', '\\' and controls, or an escape (\" \\ \/ \b \f \n \r \t \uXXXX). */
void gjson_string_char(gnfa *a, int32_t from, int32_t to);

/* Emits the JSON schema src (kind JSON_SCHEMA) or any object (JSON_OBJECT)
 * as rule 0's body. Returns 0 or an error status. */
int gschema_emit(gnfa *a, grammar_kind kind, const char *src, size_t len);

/* ---- the compiled grammar (grammar_nfa.c builds it) ---- */

typedef struct gcall {
    int32_t rule, ret;   /* callee rule; the caller's DFA state after it returns */
} gcall;

struct grammar {
    int32_t n_states, n_classes, n_rules, n_calls;
    uint8_t cls[256];    /* byte -> class */
    int32_t *trans;      /* [n_states][n_classes]: >= 0 goto, -1 dead, <= -2 call calls[-2-v] */
    uint8_t *accept;     /* [n_states]: the rule may end here */
    int32_t *rule_start; /* [n_rules] DFA start states */
    gcall *calls;        /* [n_calls] */
    int32_t *dist;       /* [n_states]: fewest bytes to where the state's rule may end
                            (grammar_budget.c); NULL: not computed, no budget filter */
    int32_t grow;        /* the most one byte can raise grammar_bytes_to_end, >= 0 */
    int32_t *reach;      /* [n_states]: the largest distance reachable from the state
                            (grammar_budget.c); NULL: unknown */
};

/* Fills g->dist and g->grow (grammar_budget.c); PG_ENOMEM or PG_OK (also
 * when the grammar is too large to measure: dist then stays NULL). */
int gbudget_prepare(grammar *g);

/* One byte on s in place; false (s then unspecified) when refused. */
static inline bool gstep_byte(const grammar *g, grammar_state *s, uint8_t b)
{
    int32_t c = g->cls[b];
    for (;;) {
        int32_t t = s->st[s->n - 1];
        int32_t v = g->trans[(size_t)t * (size_t)g->n_classes + (size_t)c];
        if (v >= 0) {
            s->st[s->n - 1] = v;
            return true;
        }
        if (v <= -2) {
            if (s->n == GRAMMAR_MAX_DEPTH)
                return false;
            const gcall *k = &g->calls[-2 - v];
            s->st[s->n - 1] = k->ret;
            s->st[s->n++] = g->rule_start[k->rule];
            continue;
        }
        if (g->accept[t] && s->n > 1) {
            s->n--;
            continue;
        }
        return false;
    }
}

#endif /* PG_GRAMMAR_INTERNAL_H */
