/* jinja_frames: which names a frame starts with as "missing", as jinja2
 * 3.1's idtracking.py decides them at compile time.
 *
 * A frame is the template, a for-loop body (one per iteration), a macro or
 * call-block body, a with, set-block, filter-block or generation body.
 * jinja2 gives each name of a frame one load rule, from its first
 * occurrence in the frame's own code (child frames excluded): a read
 * resolves it from the enclosing frames / the context; an unconditional
 * store (`set x`, `macro x`) when no enclosing frame mentions the name makes
 * it a local that is *missing* until the store runs — so a loop or macro
 * body reading it earlier sees Undefined, not the context's value:
 *   {% for m in messages %}{{ x }}{% endfor %}{% set x = 1 %}   -> x undefined
 * A store inside an if branch makes it a read instead (branch_update).
 * Everything else is what dynamic scoping gives, so the evaluator only
 * needs each frame's missing names (jnode.missing), set to Undefined when
 * the frame's scope is created. */
#include <string.h>

#include "jinja_parse.h"

enum { SEEN_LOAD = 1, SEEN_STORE, SEEN_COND_STORE, SEEN_DECLARED };

typedef struct frame {
    const struct frame *parent;
    const char **names;
    int *first;          /* SEEN_*: how each name first occurred */
    int n, cap;
    jnode **children;    /* child frames, analysed after this one */
    int nchildren, ccap;
} frame;

static int find(const frame *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->names[i], name) == 0)
            return i;
    return -1;
}

static void record(jinja_rt *rt, frame *f, const char *name, int how)
{
    if (find(f, name) >= 0)
        return;
    if (f->n == f->cap) {
        int cap = f->cap ? f->cap * 2 : 16;
        const char **nn = jrt_alloc(rt, (size_t)cap * sizeof *nn);
        int *ff = jrt_alloc(rt, (size_t)cap * sizeof *ff);
        if (f->n) {
            memcpy(nn, f->names, (size_t)f->n * sizeof *nn);
            memcpy(ff, f->first, (size_t)f->n * sizeof *ff);
        }
        f->names = nn;
        f->first = ff;
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->first[f->n] = how;
    f->n++;
}

static void child(jinja_rt *rt, frame *f, jnode *n)
{
    if (f->nchildren == f->ccap) {
        int cap = f->ccap ? f->ccap * 2 : 8;
        jnode **c = jrt_alloc(rt, (size_t)cap * sizeof *c);
        if (f->nchildren)
            memcpy(c, f->children, (size_t)f->nchildren * sizeof *c);
        f->children = c;
        f->ccap = cap;
    }
    f->children[f->nchildren++] = n;
}

static void loads(jinja_rt *rt, frame *f, const jnode *e)
{
    if (!e)
        return;
    if (e->kind == JN_NAME) {
        record(rt, f, e->name, SEEN_LOAD);
        return;
    }
    loads(rt, f, e->a);
    loads(rt, f, e->b);
    loads(rt, f, e->c);
    loads(rt, f, e->d);
    for (int i = 0; i < e->nargs; i++) {
        if (e->args)
            loads(rt, f, e->args[i]);
        if (e->kind == JN_DICT && e->defaults)
            loads(rt, f, e->defaults[i]);
    }
}

static void store_target(jinja_rt *rt, frame *f, const jnode *t, bool cond)
{
    if (t->kind == JN_NAME)
        record(rt, f, t->name, cond ? SEEN_COND_STORE : SEEN_STORE);
    else if (t->kind == JN_ATTR) /* ns.attr = ...: a read of ns */
        loads(rt, f, t->a);
    else
        for (int i = 0; i < t->nargs; i++)
            store_target(rt, f, t->args[i], cond);
}

static void stmts(jinja_rt *rt, frame *f, jnode *const *body, int n, bool cond)
{
    for (int i = 0; i < n; i++) {
        jnode *s = body[i];
        switch (s->kind) {
        case JN_OUTPUT: loads(rt, f, s->a); break;
        case JN_IF: /* an elif chain is nested IFs: walk it without recursing */
            for (const jnode *x = s;;) {
                loads(rt, f, x->a);
                stmts(rt, f, x->body, x->nbody, true);
                if (x->nelse == 1 && x->else_body[0]->kind == JN_IF) {
                    x = x->else_body[0];
                    continue;
                }
                stmts(rt, f, x->else_body, x->nelse, true);
                break;
            }
            break;
        case JN_FOR:
            loads(rt, f, s->b);
            child(rt, f, s);
            stmts(rt, f, s->else_body, s->nelse, true);
            break;
        case JN_SET:
            loads(rt, f, s->b);
            store_target(rt, f, s->a, cond);
            break;
        case JN_SETBLOCK:
            store_target(rt, f, s->a, cond);
            loads(rt, f, s->c);
            child(rt, f, s);
            break;
        case JN_MACRO:
            record(rt, f, s->name, cond ? SEEN_COND_STORE : SEEN_STORE);
            child(rt, f, s);
            break;
        case JN_CALLBLOCK:
            loads(rt, f, s->a);
            child(rt, f, s);
            break;
        case JN_FILTERBLOCK:
            loads(rt, f, s->c);
            child(rt, f, s);
            break;
        case JN_WITH:
            for (int k = 0; k < s->nargs; k++)
                loads(rt, f, s->defaults[k]);
            child(rt, f, s);
            break;
        case JN_SCOPE: child(rt, f, s); break;
        default: break;
        }
    }
}

static bool mentioned_above(const frame *f, const char *name)
{
    for (const frame *p = f->parent; p; p = p->parent)
        if (find(p, name) >= 0)
            return true;
    return false;
}

static void declare_targets(jinja_rt *rt, frame *f, const jnode *t)
{
    if (t->kind == JN_NAME)
        record(rt, f, t->name, SEEN_DECLARED);
    else
        for (int i = 0; i < t->nargs; i++)
            declare_targets(rt, f, t->args[i]);
}

static void analyze(jinja_rt *rt, jnode *n, const frame *parent)
{
    frame f = {.parent = parent};
    switch (n->kind) {
    case JN_FOR:
        declare_targets(rt, &f, n->a);
        record(rt, &f, "loop", SEEN_DECLARED);
        loads(rt, &f, n->c);
        break;
    case JN_MACRO: case JN_CALLBLOCK:
        for (int i = 0; i < n->nargs; i++)
            record(rt, &f, n->args[i]->name, SEEN_DECLARED);
        record(rt, &f, "varargs", SEEN_DECLARED);
        record(rt, &f, "kwargs", SEEN_DECLARED);
        record(rt, &f, "caller", SEEN_DECLARED);
        for (int i = 0; i < n->nargs; i++)
            loads(rt, &f, n->defaults[i]);
        break;
    case JN_WITH:
        for (int i = 0; i < n->nargs; i++)
            declare_targets(rt, &f, n->args[i]);
        break;
    default: break;
    }
    stmts(rt, &f, n->body, n->nbody, false);
    int nm = 0;
    for (int i = 0; i < f.n; i++)
        nm += f.first[i] == SEEN_STORE && !mentioned_above(&f, f.names[i]);
    if (nm) {
        n->missing = jrt_alloc(rt, (size_t)nm * sizeof *n->missing);
        for (int i = 0; i < f.n; i++)
            if (f.first[i] == SEEN_STORE && !mentioned_above(&f, f.names[i]))
                n->missing[n->nmissing++] = f.names[i];
    }
    for (int i = 0; i < f.nchildren; i++)
        analyze(rt, f.children[i], &f);
}

void jinja_analyze_frames(jinja_rt *rt, jnode *root) { analyze(rt, root, NULL); }
