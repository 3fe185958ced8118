/* jinja_parse: see the header. The functions mirror jinja2 3.1 parser.py
 * (parse_tuple, parse_condexpr, parse_or ... parse_primary, parse_postfix,
 * parse_filter_expr) so that precedence matches exactly: filters and tests
 * bind tighter than every binary operator, `~` sits between comparison and
 * `+`/`-`, and a `for` iterable is parsed without the conditional
 * expression so that `for x in xs if c` is a loop filter. */
#include "jinja_parse.h"

#include <stdio.h>
#include <string.h>

/* deepest expression tree (left-deep operator chains do not recurse in the
 * parser but do in the evaluator) */
#define JINJA_MAX_HEIGHT 256

typedef struct parser {
    jinja_rt *rt;
    jtok *t;
    size_t n, p;
    int depth;
    int loops;                 /* enclosing for loops (break/continue) */
    /* jinja2's end_token_stack and _tag_stack, for its EOF/unknown-tag messages */
    const char *const *end_stack[JINJA_MAX_NESTING + 2];
    const char *tag_stack[JINJA_MAX_NESTING + 2];
    int nend, ntag;
} parser;

static _Noreturn void fail_at(parser *P, const jtok *t, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#include <stdarg.h>
static _Noreturn void fail_at(parser *P, const jtok *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(P->rt->msg, sizeof P->rt->msg, fmt, ap);
    va_end(ap);
    P->rt->line = t->line;
    P->rt->col = t->col;
    longjmp(*P->rt->on_error, 1);
}

static jtok *cur(parser *P) { return &P->t[P->p]; }
static jtok *look(parser *P) { return &P->t[P->p + 1 < P->n ? P->p + 1 : P->p]; }
static jtok *next(parser *P)
{
    jtok *t = &P->t[P->p];
    if (P->p + 1 < P->n)
        P->p++;
    return t;
}

static bool is_name(const jtok *t, const char *s)
{
    return t->type == JT_NAME && t->len == strlen(s) && memcmp(t->s, s, t->len) == 0;
}
static bool is_op(const jtok *t, int op) { return t->type == JT_OP && t->op == op; }

static bool skip_name(parser *P, const char *s)
{
    if (!is_name(cur(P), s))
        return false;
    next(P);
    return true;
}
static bool skip_op(parser *P, int op)
{
    if (!is_op(cur(P), op))
        return false;
    next(P);
    return true;
}

static _Noreturn void fail_expected(parser *P, const char *what)
{
    jtok *t = cur(P);
    if (t->type == JT_EOF)
        fail_at(P, t, "unexpected end of template, expected %s.", what);
    fail_at(P, t, "expected token %s, got %s", what, jinja_tok_describe(P->rt, t));
}

static void expect_op(parser *P, int op)
{
    if (!skip_op(P, op)) {
        char w[8];
        snprintf(w, sizeof w, "'%c'", op);
        fail_expected(P, w);
    }
}

static void expect_type(parser *P, jtok_type type, const char *what)
{
    if (cur(P)->type != type)
        fail_expected(P, what);
    next(P);
}

static const char *tok_name(parser *P, const jtok *t)
{
    return jrt_strndup(P->rt, t->s, t->len);
}

static jnode *mk(parser *P, jnode_kind kind, const jtok *at)
{
    jnode *n = jrt_alloc(P->rt, sizeof *n);
    n->kind = kind;
    n->height = 1;
    n->line = at->line;
    n->col = at->col;
    return n;
}

static void enter(parser *P)
{
    if (++P->depth > JINJA_MAX_NESTING)
        fail_at(P, cur(P), "template nested too deeply (more than %d levels)", JINJA_MAX_NESTING);
}
static void leave(parser *P) { P->depth--; }

/* node arrays */
typedef struct nvec {
    jnode **v;
    const char **kw;
    int n, cap;
} nvec;

static void nv_push(parser *P, nvec *a, jnode *x, const char *kw)
{
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 4;
        jnode **v = jrt_alloc(P->rt, (size_t)cap * sizeof *v);
        const char **k = jrt_alloc(P->rt, (size_t)cap * sizeof *k);
        if (a->n) {
            memcpy(v, a->v, (size_t)a->n * sizeof *v);
            memcpy(k, a->kw, (size_t)a->n * sizeof *k);
        }
        a->v = v;
        a->kw = k;
        a->cap = cap;
    }
    a->v[a->n] = x;
    a->kw[a->n] = kw;
    a->n++;
}

/* ---- expressions ---- */

static jnode *parse_expression(parser *P, bool with_condexpr);
static jnode *parse_unary(parser *P, bool with_filter);
static jnode *parse_or(parser *P);
static jnode *parse_primary(parser *P);
static jnode *parse_postfix(parser *P, jnode *node);
static jnode *parse_filter_expr(parser *P, jnode *node);
static jnode *parse_filter(parser *P, jnode *node, bool start_inline);

/* Left-deep chains (a + b + c ..., x|f|g ..., a.b.c ...) do not recurse in
 * the parser but do in the evaluator: their height is capped here. */
static void grow(parser *P, jnode *n, const jnode *child, const jtok *at)
{
    if (child && child->height + 1 > n->height)
        n->height = child->height + 1;
    if (n->height > JINJA_MAX_HEIGHT)
        fail_at(P, at, "expression nested too deeply (more than %d levels)", JINJA_MAX_HEIGHT);
}

static jnode *chain(parser *P, jnode_kind kind, int op, jnode *l, jnode *r, const jtok *at)
{
    jnode *n = mk(P, kind, at);
    n->op = op;
    n->a = l;
    n->b = r;
    grow(P, n, l, at);
    grow(P, n, r, at);
    return n;
}

static jnode *parse_condexpr(parser *P)
{
    jtok *at = cur(P);
    jnode *expr1 = parse_or(P);
    while (is_name(cur(P), "if")) {
        next(P);
        jnode *expr2 = parse_or(P);
        jnode *expr3 = NULL;
        if (skip_name(P, "else")) {
            enter(P);
            expr3 = parse_condexpr(P);
            leave(P);
        }
        jnode *n = mk(P, JN_COND, at);
        n->a = expr2;
        n->b = expr1;
        n->c = expr3;
        grow(P, n, expr1, at);
        expr1 = n;
    }
    return expr1;
}

static jnode *parse_expression(parser *P, bool with_condexpr)
{
    enter(P);
    jnode *n = with_condexpr ? parse_condexpr(P) : parse_or(P);
    leave(P);
    return n;
}

static jnode *parse_not(parser *P);

static jnode *parse_and(parser *P)
{
    jnode *left = parse_not(P);
    while (is_name(cur(P), "and")) {
        jtok *at = next(P);
        left = chain(P, JN_AND, 0, left, parse_not(P), at);
    }
    return left;
}

static jnode *parse_or(parser *P)
{
    jnode *left = parse_and(P);
    while (is_name(cur(P), "or")) {
        jtok *at = next(P);
        left = chain(P, JN_OR, 0, left, parse_and(P), at);
    }
    return left;
}

static jnode *parse_compare(parser *P);

static jnode *parse_not(parser *P)
{
    if (is_name(cur(P), "not")) {
        jtok *at = next(P);
        enter(P);
        jnode *n = mk(P, JN_NOT, at);
        n->a = parse_not(P);
        leave(P);
        return n;
    }
    return parse_compare(P);
}

static jnode *parse_math1(parser *P);

static jnode *parse_compare(parser *P)
{
    jtok *at = cur(P);
    jnode *expr = parse_math1(P);
    nvec operands = {0};
    int ops[64];
    int nops = 0;
    for (;;) {
        jtok *t = cur(P);
        int op = 0;
        if (t->type == JT_OP && (t->op == JOP_EQ || t->op == JOP_NE || t->op == '<' ||
                                 t->op == '>' || t->op == JOP_LE || t->op == JOP_GE)) {
            op = t->op;
            next(P);
        } else if (is_name(t, "in")) {
            op = JCMP_IN;
            next(P);
        } else if (is_name(t, "not") && is_name(look(P), "in")) {
            op = JCMP_NOTIN;
            next(P);
            next(P);
        } else
            break;
        if (nops == 64)
            fail_at(P, t, "too many chained comparisons");
        ops[nops++] = op;
        nv_push(P, &operands, parse_math1(P), NULL);
    }
    if (!nops)
        return expr;
    jnode *n = mk(P, JN_COMPARE, at);
    n->a = expr;
    n->args = operands.v;
    n->nargs = operands.n;
    n->ops = jrt_alloc(P->rt, (size_t)nops * sizeof(int));
    memcpy(n->ops, ops, (size_t)nops * sizeof(int));
    return n;
}

static jnode *parse_concat(parser *P);

static jnode *parse_math1(parser *P)
{
    jnode *left = parse_concat(P);
    while (is_op(cur(P), '+') || is_op(cur(P), '-')) {
        jtok *at = next(P);
        left = chain(P, JN_BINOP, at->op, left, parse_concat(P), at);
    }
    return left;
}

static jnode *parse_math2(parser *P);

static jnode *parse_concat(parser *P)
{
    jtok *at = cur(P);
    jnode *first = parse_math2(P);
    if (!is_op(cur(P), '~'))
        return first;
    nvec args = {0};
    nv_push(P, &args, first, NULL);
    while (skip_op(P, '~'))
        nv_push(P, &args, parse_math2(P), NULL);
    jnode *n = mk(P, JN_CONCAT, at);
    n->args = args.v;
    n->nargs = args.n;
    return n;
}

static jnode *parse_pow(parser *P);

static jnode *parse_math2(parser *P)
{
    jnode *left = parse_pow(P);
    while (is_op(cur(P), '*') || is_op(cur(P), '/') || is_op(cur(P), JOP_FLOORDIV) ||
           is_op(cur(P), '%')) {
        jtok *at = next(P);
        left = chain(P, JN_BINOP, at->op, left, parse_pow(P), at);
    }
    return left;
}

static jnode *parse_pow(parser *P)
{
    jnode *left = parse_unary(P, true);
    while (is_op(cur(P), JOP_POW)) {
        jtok *at = next(P);
        left = chain(P, JN_BINOP, JOP_POW, left, parse_unary(P, true), at);
    }
    return left;
}

static jnode *parse_unary(parser *P, bool with_filter)
{
    jtok *t = cur(P);
    jnode *node;
    enter(P);
    if (is_op(t, '-') || is_op(t, '+')) {
        next(P);
        node = mk(P, is_op(t, '-') ? JN_NEG : JN_POS, t);
        node->a = parse_unary(P, false);
    } else
        node = parse_primary(P);
    node = parse_postfix(P, node);
    if (with_filter)
        node = parse_filter_expr(P, node);
    leave(P);
    return node;
}

static bool is_tuple_end(parser *P, const char *extra)
{
    jtok *t = cur(P);
    if (t->type == JT_VAR_END || t->type == JT_BLOCK_END || is_op(t, ')'))
        return true;
    return extra && is_name(t, extra);
}

static jnode *parse_tuple(parser *P, bool simplified, bool with_condexpr,
                          const char *extra_end, bool explicit_parens)
{
    jtok *at = cur(P);
    nvec args = {0};
    bool is_tuple = false;
    for (;;) {
        if (args.n)
            expect_op(P, ',');
        if (is_tuple_end(P, extra_end))
            break;
        jnode *x = simplified ? parse_primary(P) : parse_expression(P, with_condexpr);
        nv_push(P, &args, x, NULL);
        if (is_op(cur(P), ','))
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (args.n)
            return args.v[0];
        if (!explicit_parens)
            fail_at(P, cur(P), "Expected an expression, got %s", jinja_tok_describe(P->rt, cur(P)));
    }
    jnode *n = mk(P, JN_TUPLE, at);
    n->args = args.v;
    n->nargs = args.n;
    return n;
}

static jnode *parse_list(parser *P)
{
    jtok *at = next(P); /* [ */
    nvec items = {0};
    while (!is_op(cur(P), ']')) {
        if (items.n)
            expect_op(P, ',');
        if (is_op(cur(P), ']'))
            break;
        nv_push(P, &items, parse_expression(P, true), NULL);
    }
    expect_op(P, ']');
    jnode *n = mk(P, JN_LIST, at);
    n->args = items.v;
    n->nargs = items.n;
    return n;
}

static jnode *parse_dict(parser *P)
{
    jtok *at = next(P); /* { */
    nvec keys = {0}, vals = {0};
    while (!is_op(cur(P), '}')) {
        if (keys.n)
            expect_op(P, ',');
        if (is_op(cur(P), '}'))
            break;
        nv_push(P, &keys, parse_expression(P, true), NULL);
        expect_op(P, ':');
        nv_push(P, &vals, parse_expression(P, true), NULL);
    }
    expect_op(P, '}');
    jnode *n = mk(P, JN_DICT, at);
    n->args = keys.v;
    n->defaults = vals.v;
    n->nargs = keys.n;
    return n;
}

static jnode *parse_primary(parser *P)
{
    jtok *t = cur(P);
    jnode *n;
    if (t->type == JT_NAME) {
        next(P);
        n = mk(P, JN_CONST, t);
        if (is_name(t, "true") || is_name(t, "True"))
            n->value = jv_bool(true);
        else if (is_name(t, "false") || is_name(t, "False"))
            n->value = jv_bool(false);
        else if (is_name(t, "none") || is_name(t, "None"))
            n->value = jv_none();
        else {
            n->kind = JN_NAME;
            n->name = tok_name(P, t);
        }
        return n;
    }
    if (t->type == JT_STRING) {
        jsb b;
        jsb_init(&b, P->rt, (size_t)1 << 30);
        while (cur(P)->type == JT_STRING) {
            jtok *s = next(P);
            jsb_put(&b, s->s, s->len);
        }
        n = mk(P, JN_CONST, t);
        n->value = jsb_value(&b);
        return n;
    }
    if (t->type == JT_INT || t->type == JT_FLOAT) {
        next(P);
        n = mk(P, JN_CONST, t);
        n->value = t->type == JT_INT ? jv_int(t->ival) : jv_float(t->fval);
        return n;
    }
    if (is_op(t, '(')) {
        next(P);
        n = parse_tuple(P, false, true, NULL, true);
        expect_op(P, ')');
        return n;
    }
    if (is_op(t, '['))
        return parse_list(P);
    if (is_op(t, '{'))
        return parse_dict(P);
    if (t->type == JT_EOF)
        fail_at(P, t, "unexpected end of template");
    fail_at(P, t, "unexpected %s", jinja_tok_describe(P->rt, t));
}

/* ( args ) after the '(' is current */
static void parse_call_args(parser *P, jnode *n)
{
    expect_op(P, '(');
    nvec args = {0};
    bool seen_kw = false;
    enter(P);
    while (!is_op(cur(P), ')')) {
        if (args.n)
            expect_op(P, ',');
        if (is_op(cur(P), ')'))
            break;
        if (is_op(cur(P), '*') || is_op(cur(P), JOP_POW))
            fail_at(P, cur(P), "*args and **kwargs calls are not supported");
        if (cur(P)->type == JT_NAME && is_op(look(P), '=')) {
            const char *kw = tok_name(P, next(P));
            next(P);
            nv_push(P, &args, parse_expression(P, true), kw);
            seen_kw = true;
        } else {
            if (seen_kw)
                fail_at(P, cur(P), "invalid syntax for function call expression");
            nv_push(P, &args, parse_expression(P, true), NULL);
        }
    }
    expect_op(P, ')');
    leave(P);
    n->args = args.v;
    n->kw = args.kw;
    n->nargs = args.n;
}

static jnode *parse_subscribed(parser *P)
{
    jtok *at = cur(P);
    jnode *parts[3] = {NULL, NULL, NULL};
    if (is_op(cur(P), ':')) {
        next(P);
    } else {
        jnode *node = parse_expression(P, true);
        if (!is_op(cur(P), ':'))
            return node;
        next(P);
        parts[0] = node;
    }
    if (!is_op(cur(P), ':') && !is_op(cur(P), ']') && !is_op(cur(P), ','))
        parts[1] = parse_expression(P, true);
    if (is_op(cur(P), ':')) {
        next(P);
        if (!is_op(cur(P), ']') && !is_op(cur(P), ','))
            parts[2] = parse_expression(P, true);
    }
    jnode *n = mk(P, JN_SLICE, at);
    n->b = parts[0];
    n->c = parts[1];
    n->d = parts[2];
    return n;
}

static jnode *parse_postfix(parser *P, jnode *node)
{
    for (;;) {
        jtok *t = cur(P);
        if (is_op(t, '.')) {
            next(P);
            jtok *a = cur(P);
            if (a->type == JT_NAME) {
                next(P);
                jnode *n = mk(P, JN_ATTR, t);
                n->a = node;
                n->name = tok_name(P, a);
                node = n;
            } else if (a->type == JT_INT) {
                next(P);
                jnode *k = mk(P, JN_CONST, a);
                k->value = jv_int(a->ival);
                jnode *n = mk(P, JN_ITEM, t);
                n->a = node;
                n->b = k;
                node = n;
            } else
                fail_at(P, a, "expected name or number");
        } else if (is_op(t, '[')) {
            next(P);
            enter(P);
            nvec args = {0};
            while (!is_op(cur(P), ']')) {
                if (args.n)
                    expect_op(P, ',');
                nv_push(P, &args, parse_subscribed(P), NULL);
            }
            expect_op(P, ']');
            leave(P);
            jnode *key = args.n ? args.v[0] : NULL;
            if (args.n != 1) { /* x[] is x[()] for jinja2 */
                key = mk(P, JN_TUPLE, t);
                key->args = args.v;
                key->nargs = args.n;
            }
            if (key->kind == JN_SLICE) {
                key->a = node;
                node = key;
            } else {
                jnode *n = mk(P, JN_ITEM, t);
                n->a = node;
                n->b = key;
                node = n;
            }
        } else if (is_op(t, '(')) {
            jnode *n = mk(P, JN_CALL, t);
            n->a = node;
            parse_call_args(P, n);
            node = n;
        } else
            return node;
        jnode *child = node->kind == JN_SLICE || node->kind == JN_ITEM || node->kind == JN_ATTR ||
                               node->kind == JN_CALL ? node->a : NULL;
        grow(P, node, child, t);
    }
}

static const char *parse_dotted_name(parser *P)
{
    jtok *t = cur(P);
    if (t->type != JT_NAME)
        fail_expected(P, "'name'");
    next(P);
    jsb b;
    jsb_init(&b, P->rt, 4096);
    jsb_put(&b, t->s, t->len);
    while (is_op(cur(P), '.') && look(P)->type == JT_NAME) {
        next(P);
        jtok *s = next(P);
        jsb_putc(&b, '.');
        jsb_put(&b, s->s, s->len);
    }
    return b.p;
}

static jnode *parse_filter(parser *P, jnode *node, bool start_inline)
{
    while (is_op(cur(P), '|') || start_inline) {
        if (!start_inline)
            next(P);
        jtok *at = cur(P);
        jnode *n = mk(P, JN_FILTER, at);
        n->name = parse_dotted_name(P);
        n->filter = jinja_find_filter(n->name);
        if (!n->filter)
            fail_at(P, at, "No filter named '%s'.", n->name);
        n->a = node;
        if (is_op(cur(P), '('))
            parse_call_args(P, n);
        node = n;
        start_inline = false;
        grow(P, node, node->a, at);
    }
    return node;
}

static jnode *parse_test(parser *P, jnode *node)
{
    jtok *at = next(P); /* is */
    bool negated = skip_name(P, "not");
    jtok *nt = cur(P);
    jnode *n = mk(P, JN_TEST, at);
    n->name = parse_dotted_name(P);
    n->test = jinja_find_test(n->name);
    if (!n->test)
        fail_at(P, nt, "No test named '%s'.", n->name);
    n->a = node;
    n->flag = negated;
    jtok *t = cur(P);
    if (is_op(t, '(')) {
        parse_call_args(P, n);
    } else if ((t->type == JT_NAME || t->type == JT_STRING || t->type == JT_INT ||
                t->type == JT_FLOAT || is_op(t, '(') || is_op(t, '[') || is_op(t, '{')) &&
               !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
        if (is_name(t, "is"))
            fail_at(P, t, "You cannot chain multiple tests with is");
        enter(P);
        jnode *arg = parse_postfix(P, parse_primary(P));
        leave(P);
        n->args = jrt_alloc(P->rt, sizeof(jnode *));
        n->kw = jrt_alloc(P->rt, sizeof(char *));
        n->args[0] = arg;
        n->nargs = 1;
    }
    return n;
}

static jnode *parse_filter_expr(parser *P, jnode *node)
{
    for (;;) {
        jtok *t = cur(P);
        if (is_op(t, '|'))
            node = parse_filter(P, node, false);
        else if (is_name(t, "is"))
            node = parse_test(P, node);
        else if (is_op(t, '(')) {
            jnode *n = mk(P, JN_CALL, t);
            n->a = node;
            parse_call_args(P, n);
            node = n;
        } else
            return node;
    }
}

/* ---- statements ---- */

static void subparse(parser *P, const char *const *end, nvec *body);

static const char *const END_FOR[] = {"endfor", "else", NULL};
static const char *const END_FOR2[] = {"endfor", NULL};
static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_IF2[] = {"endif", NULL};
static const char *const END_SET[] = {"endset", NULL};
static const char *const END_MACRO[] = {"endmacro", NULL};
static const char *const END_CALL[] = {"endcall", NULL};
static const char *const END_FILTER[] = {"endfilter", NULL};
static const char *const END_WITH[] = {"endwith", NULL};
static const char *const END_GEN[] = {"endgeneration", NULL};

static bool in_list(const jtok *t, const char *const *names)
{
    for (; names && *names; names++)
        if (is_name(t, *names))
            return true;
    return false;
}

/* jinja2's _fail_ut_eof */
static _Noreturn void fail_unknown(parser *P, const jtok *t, const char *name)
{
    jsb b;
    jsb_init(&b, P->rt, 4096);
    if (name)
        jsb_printf(&b, "Encountered unknown tag '%s'.", name);
    else
        jsb_puts(&b, "Unexpected end of template.");
    if (P->nend) {
        bool expected = false;
        for (int i = 0; i < P->nend && name; i++)
            for (const char *const *e = P->end_stack[i]; *e; e++)
                if (strcmp(*e, name) == 0)
                    expected = true;
        jsb_puts(&b, expected ? " You probably made a nesting mistake. Jinja is expecting this tag, but currently looking for "
                              : " Jinja was looking for the following tags: ");
        const char *const *e = P->end_stack[P->nend - 1];
        for (int i = 0; e[i]; i++)
            jsb_printf(&b, "%s'%s'", i ? " or " : "", e[i]);
        jsb_putc(&b, '.');
    }
    if (P->ntag)
        jsb_printf(&b, " The innermost block that needs to be closed is '%s'.", P->tag_stack[P->ntag - 1]);
    fail_at(P, t, "%s", b.p);
}

/* parse_statements: block_end, body up to one of `end`, the end name stays current */
static void parse_statements(parser *P, const char *const *end, nvec *body, bool drop_needle)
{
    skip_op(P, ':');
    expect_type(P, JT_BLOCK_END, "'end of statement block'");
    subparse(P, end, body);
    if (drop_needle)
        next(P);
}

static jnode *parse_assign_target(parser *P, bool with_tuple, bool name_only,
                                  const char *extra_end, bool with_namespace)
{
    jtok *t = cur(P);
    jnode *target;
    if (with_namespace && t->type == JT_NAME && is_op(look(P), '.')) {
        next(P);
        next(P);
        jtok *attr = cur(P);
        if (attr->type != JT_NAME)
            fail_expected(P, "'name'");
        next(P);
        jnode *ns = mk(P, JN_NAME, t);
        ns->name = tok_name(P, t);
        target = mk(P, JN_ATTR, t);
        target->a = ns;
        target->name = tok_name(P, attr);
        return target;
    }
    if (name_only) {
        if (t->type != JT_NAME)
            fail_expected(P, "'name'");
        next(P);
        target = mk(P, JN_NAME, t);
        target->name = tok_name(P, t);
        return target;
    }
    target = with_tuple ? parse_tuple(P, true, true, extra_end, false) : parse_primary(P);
    bool ok = target->kind == JN_NAME;
    if (target->kind == JN_TUPLE) {
        ok = true;
        for (int i = 0; i < target->nargs; i++)
            ok = ok && target->args[i]->kind == JN_NAME;
    }
    if (!ok)
        fail_at(P, t, "can't assign to '%s'", target->kind == JN_CONST ? "Const" : "expression");
    return target;
}

static jnode **vec_body(nvec *v, int *n)
{
    *n = v->n;
    return v->v;
}

static jnode *parse_for(parser *P, jtok *at)
{
    jnode *n = mk(P, JN_FOR, at);
    n->a = parse_assign_target(P, true, false, "in", false);
    if (!skip_name(P, "in"))
        fail_expected(P, "'in'");
    n->b = parse_tuple(P, false, false, "recursive", false);
    if (skip_name(P, "if"))
        n->c = parse_expression(P, true);
    n->flag = skip_name(P, "recursive");
    nvec body = {0}, els = {0};
    P->loops++;
    parse_statements(P, END_FOR, &body, false);
    P->loops--;
    if (skip_name(P, "else"))
        parse_statements(P, END_FOR2, &els, true);
    else
        next(P);
    n->body = vec_body(&body, &n->nbody);
    n->else_body = vec_body(&els, &n->nelse);
    return n;
}

static jnode *parse_if(parser *P, jtok *at)
{
    jnode *n = mk(P, JN_IF, at);
    jnode *node = n;
    for (;;) {
        node->a = parse_tuple(P, false, false, NULL, false);
        nvec body = {0};
        parse_statements(P, END_IF, &body, false);
        node->body = vec_body(&body, &node->nbody);
        jtok *t = next(P);
        if (is_name(t, "elif")) {
            jnode *e = mk(P, JN_IF, t);
            node->else_body = jrt_alloc(P->rt, sizeof(jnode *));
            node->else_body[0] = e;
            node->nelse = 1;
            node = e;
            continue;
        }
        if (is_name(t, "else")) {
            nvec els = {0};
            parse_statements(P, END_IF2, &els, true);
            node->else_body = vec_body(&els, &node->nelse);
        }
        return n;
    }
}

static jnode *parse_set(parser *P, jtok *at)
{
    jnode *target = parse_assign_target(P, true, false, NULL, true);
    if (skip_op(P, '=')) {
        jnode *n = mk(P, JN_SET, at);
        n->a = target;
        n->b = parse_tuple(P, false, true, NULL, false);
        return n;
    }
    jnode *n = mk(P, JN_SETBLOCK, at);
    n->a = target;
    if (is_op(cur(P), '|'))
        n->c = parse_filter(P, NULL, false);
    nvec body = {0};
    parse_statements(P, END_SET, &body, true);
    n->body = vec_body(&body, &n->nbody);
    return n;
}

static void parse_signature(parser *P, jnode *n)
{
    nvec args = {0}, defs = {0};
    expect_op(P, '(');
    while (!is_op(cur(P), ')')) {
        if (args.n)
            expect_op(P, ',');
        jnode *arg = parse_assign_target(P, false, true, NULL, false);
        jnode *def = NULL;
        if (skip_op(P, '='))
            def = parse_expression(P, true);
        else if (defs.n && defs.v[defs.n - 1])
            fail_at(P, cur(P), "non-default argument follows default argument");
        nv_push(P, &args, arg, NULL);
        nv_push(P, &defs, def, NULL);
    }
    expect_op(P, ')');
    n->args = args.v;
    n->defaults = defs.v;
    n->nargs = args.n;
}

static jnode *parse_macro(parser *P, jtok *at)
{
    jnode *n = mk(P, JN_MACRO, at);
    jtok *name = cur(P);
    if (name->type != JT_NAME)
        fail_expected(P, "'name'");
    next(P);
    n->name = tok_name(P, name);
    parse_signature(P, n);
    int loops = P->loops;
    P->loops = 0;
    nvec body = {0};
    parse_statements(P, END_MACRO, &body, true);
    P->loops = loops;
    n->body = vec_body(&body, &n->nbody);
    return n;
}

static jnode *parse_call_block(parser *P, jtok *at)
{
    jnode *n = mk(P, JN_CALLBLOCK, at);
    if (is_op(cur(P), '('))
        parse_signature(P, n);
    jnode *call = parse_expression(P, true);
    if (call->kind != JN_CALL)
        fail_at(P, at, "expected call");
    n->a = call;
    nvec body = {0};
    int loops = P->loops;
    P->loops = 0;
    parse_statements(P, END_CALL, &body, true);
    P->loops = loops;
    n->body = vec_body(&body, &n->nbody);
    return n;
}

static jnode *parse_statement(parser *P)
{
    jtok *t = cur(P);
    if (t->type != JT_NAME)
        fail_at(P, t, "tag name expected");
    enter(P);
    const char *name = tok_name(P, t);
    P->tag_stack[P->ntag++] = name;
    next(P);
    jnode *n;
    if (strcmp(name, "for") == 0)
        n = parse_for(P, t);
    else if (strcmp(name, "if") == 0)
        n = parse_if(P, t);
    else if (strcmp(name, "set") == 0)
        n = parse_set(P, t);
    else if (strcmp(name, "macro") == 0)
        n = parse_macro(P, t);
    else if (strcmp(name, "call") == 0)
        n = parse_call_block(P, t);
    else if (strcmp(name, "filter") == 0) {
        n = mk(P, JN_FILTERBLOCK, t);
        n->c = parse_filter(P, NULL, true);
        nvec body = {0};
        parse_statements(P, END_FILTER, &body, true);
        n->body = vec_body(&body, &n->nbody);
    } else if (strcmp(name, "with") == 0) {
        n = mk(P, JN_WITH, t);
        nvec targets = {0}, vals = {0};
        while (cur(P)->type != JT_BLOCK_END) {
            if (targets.n)
                expect_op(P, ',');
            nv_push(P, &targets, parse_assign_target(P, true, false, NULL, false), NULL);
            expect_op(P, '=');
            nv_push(P, &vals, parse_expression(P, true), NULL);
        }
        n->args = targets.v;
        n->defaults = vals.v;
        n->nargs = targets.n;
        nvec body = {0};
        parse_statements(P, END_WITH, &body, true);
        n->body = vec_body(&body, &n->nbody);
    } else if (strcmp(name, "generation") == 0) {
        n = mk(P, JN_SCOPE, t);
        nvec body = {0};
        parse_statements(P, END_GEN, &body, true);
        n->body = vec_body(&body, &n->nbody);
    } else if (strcmp(name, "break") == 0 || strcmp(name, "continue") == 0) {
        if (!P->loops)
            fail_at(P, t, "'%s' outside loop", name);
        n = mk(P, name[0] == 'b' ? JN_BREAK : JN_CONTINUE, t);
    } else {
        P->ntag--;
        fail_unknown(P, t, name);
    }
    P->ntag--;
    leave(P);
    return n;
}

static void subparse(parser *P, const char *const *end, nvec *body)
{
    if (end)
        P->end_stack[P->nend++] = end;
    for (;;) {
        jtok *t = cur(P);
        if (t->type == JT_EOF) {
            if (end)
                fail_unknown(P, t, NULL); /* jinja2's fail_eof, the block still open */
            break;
        }
        if (t->type == JT_TEXT) {
            next(P);
            jnode *n = mk(P, JN_TEXT, t);
            n->value = jv_str_n(P->rt, t->s, t->len);
            nv_push(P, body, n, NULL);
        } else if (t->type == JT_VAR_BEGIN) {
            next(P);
            jnode *n = mk(P, JN_OUTPUT, t);
            n->a = parse_tuple(P, false, true, NULL, false);
            expect_type(P, JT_VAR_END, "'end of print statement'");
            nv_push(P, body, n, NULL);
        } else if (t->type == JT_BLOCK_BEGIN) {
            next(P);
            if (end && in_list(cur(P), end)) {
                P->nend--;
                return;
            }
            nv_push(P, body, parse_statement(P), NULL);
            expect_type(P, JT_BLOCK_END, "'end of statement block'");
        } else
            fail_at(P, t, "internal parser error");
    }
}

jnode *jinja_parse(jinja_rt *rt, const char *src, size_t n)
{
    parser P = {.rt = rt};
    jinja_lex(rt, src, n, &P.t, &P.n);
    nvec body = {0};
    subparse(&P, NULL, &body);
    jtok *at = cur(&P);
    if (at->type != JT_EOF)
        fail_at(&P, at, "unexpected %s", jinja_tok_describe(rt, at));
    jnode *root = mk(&P, JN_TEMPLATE, &P.t[0]);
    root->body = vec_body(&body, &root->nbody);
    jinja_analyze_frames(rt, root);
    return root;
}
