/* jinja_parse: tokens -> AST, as jinja2 3.1's parser.py (same operator
 * precedence, same statements: if/elif/else, for/else with `if` filter and
 * tuple targets, set (incl. namespace attributes and block set), macro,
 * call, filter blocks, with, break/continue, transformers' generation
 * block; raw is handled by the lexer).
 *
 * Nodes live in the rt's arena. Filters and tests are resolved here, so an
 * unknown one fails at load as jinja2 fails at compile time. Nesting is
 * capped (JINJA_MAX_NESTING) so that a hostile template cannot overflow
 * the C stack. Errors fail the rt with rt->line/col set.
 */
#ifndef PG_JINJA_PARSE_H
#define PG_JINJA_PARSE_H

#include "jinja_lex.h"
#include "jinja_value.h"

#define JINJA_MAX_NESTING 64

typedef enum jnode_kind {
    /* statements */
    JN_TEMPLATE,   /* body */
    JN_TEXT,       /* value: the text */
    JN_OUTPUT,     /* a: expression to print */
    JN_IF,         /* a: test, body, else_body */
    JN_FOR,        /* a: target, b: iterable, c: filter or NULL, body, else_body, flag: recursive */
    JN_SET,        /* a: target (NAME, TUPLE of NAMEs, or ATTR on a name), b: value */
    JN_SETBLOCK,   /* a: target, body, c: filter chain applied to the body (FILTER nodes on a NULL input) */
    JN_MACRO,      /* name, args: parameter NAMEs, defaults (parallel, NULL = required), body */
    JN_CALLBLOCK,  /* a: the CALL expression, args/defaults: caller's parameters, body */
    JN_FILTERBLOCK,/* c: filter chain, body */
    JN_WITH,       /* args: targets, defaults: values, body */
    JN_SCOPE,      /* body (transformers' {% generation %}) */
    JN_BREAK,
    JN_CONTINUE,
    /* expressions */
    JN_CONST,      /* value */
    JN_NAME,       /* name */
    JN_ATTR,       /* a.name */
    JN_ITEM,       /* a[b] */
    JN_SLICE,      /* a[b:c:d]; absent parts are NULL */
    JN_CALL,       /* a(args; kw) */
    JN_FILTER,     /* a|name(args; kw): fn resolved */
    JN_TEST,       /* a is [not] name(args): fn resolved, flag: negated */
    JN_BINOP,      /* a op b: + - * / // % ** */
    JN_NEG,        /* -a */
    JN_POS,        /* +a */
    JN_NOT,        /* not a */
    JN_AND,        /* a and b */
    JN_OR,         /* a or b */
    JN_COMPARE,    /* a ops[i] args[i] ...: ==, !=, <, <=, >, >=, in, not in */
    JN_CONCAT,     /* args joined with ~ */
    JN_COND,       /* b if a else c (c NULL: undefined) */
    JN_LIST,       /* args */
    JN_TUPLE,      /* args */
    JN_DICT,       /* args: keys, defaults: values */
} jnode_kind;

/* compare operators beyond the lexer's */
enum { JCMP_IN = 512, JCMP_NOTIN };

typedef struct jnode jnode;

struct jinja_vm;
/* A filter: value, then its arguments. */
typedef jv (*jinja_filter_fn)(struct jinja_vm *vm, jv value, const jargs *a);
/* A test. */
typedef bool (*jinja_test_fn)(struct jinja_vm *vm, jv value, const jargs *a);

struct jnode {
    jnode_kind kind;
    int line, col;
    int height;              /* expression tree height (parser's guard) */
    int op;                  /* BINOP */
    bool flag;               /* FOR recursive, TEST negated */
    const char *name;        /* NAME, ATTR, FILTER, TEST, MACRO */
    jv value;                /* CONST, TEXT */
    jnode *a, *b, *c, *d;
    jnode **args;            /* call arguments, list items, parameters, ... */
    const char **kw;         /* keyword of args[i] or NULL (CALL, FILTER, TEST) */
    jnode **defaults;        /* parallel to args (MACRO, DICT, WITH) */
    int *ops;                /* COMPARE */
    int nargs;
    jnode **body, **else_body;
    int nbody, nelse;
    jinja_filter_fn filter;
    jinja_test_fn test;
    const char **missing;    /* frames: names that start Undefined (jinja_frames.c) */
    int nmissing;
};

/* Parses src[0, n) into an AST in rt's arena. */
jnode *jinja_parse(jinja_rt *rt, const char *src, size_t n);

/* Computes each frame's `missing` names (jinja_frames.c); jinja_parse
 * calls it. */
void jinja_analyze_frames(jinja_rt *rt, jnode *root);

/* The filter and test tables (jinja_filters.c); NULL when unknown. */
jinja_filter_fn jinja_find_filter(const char *name);
jinja_test_fn jinja_find_test(const char *name);

#endif /* PG_JINJA_PARSE_H */
