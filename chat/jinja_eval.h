/* jinja_eval: runs a parsed template (jinja_parse.h) over a dict of
 * variables and returns its output, with jinja2 3.1's semantics under
 * transformers' ImmutableSandboxedEnvironment: default Undefined, Python
 * operators and truthiness, jinja2's scoping (a `set` inside a `for` body
 * or a macro stays there, each loop iteration starts from the enclosing
 * values; namespace attributes are shared), loop.*, macros and call blocks.
 *
 * Limits (jinja_limits) turn a hostile template into a clean error: total
 * evaluation steps, recursion depth, macro call depth, output bytes and
 * arena bytes. Errors fail the rt (jrt_fail) with rt->line set to the
 * statement being run.
 *
 * jinja_vm and the helpers below are shared with the builtin filters,
 * tests, methods and globals (jinja_filters.c, jinja_builtins.c).
 */
#ifndef PG_JINJA_EVAL_H
#define PG_JINJA_EVAL_H

#include "jinja_parse.h"
#include "jinja_value.h"

typedef struct jinja_limits {
    uint64_t max_steps;       /* statements + expressions + loop iterations */
    int max_depth;            /* nested evaluation (C recursion) */
    int max_call_depth;       /* nested macro calls */
    size_t max_output_bytes;  /* any one output buffer */
} jinja_limits;

/* The defaults chat_template uses: generous for real templates (which
 * take thousands of steps), tight enough to stop in well under a second. */
#define JINJA_DEFAULT_MAX_STEPS 20000000u
#define JINJA_DEFAULT_MAX_DEPTH 1500
#define JINJA_DEFAULT_MAX_CALL_DEPTH 100
#define JINJA_DEFAULT_MAX_OUTPUT ((size_t)64 << 20)
#define JINJA_DEFAULT_MAX_MEMORY ((size_t)512 << 20)
/* the sandbox's MAX_RANGE (jinja2/sandbox.py) */
#define JINJA_MAX_RANGE 100000

typedef struct jscope jscope;

typedef struct jinja_vm {
    jinja_rt *rt;
    const jinja_limits *lim;
    jsb *out;            /* where output goes now (macros and blocks swap it) */
    jscope *scope;       /* innermost scope */
    jv vars;             /* the render's variables (a dict), below every scope */
    uint64_t steps;
    int depth, call_depth;
    int flow;            /* a pending break/continue */
    int64_t now_unix;    /* strftime_now's clock */
} jinja_vm;

/* Renders root with `vars` (a JV_DICT) as the top-level variables; returns
 * the output (a JV_STR in rt's arena). */
jv jinja_render(jinja_rt *rt, const jnode *root, jv vars, const jinja_limits *lim,
                int64_t now_unix);

/* ---- for the builtins ---- */

/* One unit of work (fails past max_steps). */
void jinja_step(jinja_vm *vm);
/* Raises the error an Undefined carries (its message). */
_Noreturn void jinja_undef_fail(jinja_vm *vm, jv u);
/* jinja2's environment.getattr / getitem (attribute first, or item first). */
jv jinja_getattr(jinja_vm *vm, jv obj, const char *name);
jv jinja_getitem(jinja_vm *vm, jv obj, jv key);
/* Calls a callable value. */
jv jinja_call(jinja_vm *vm, jv fn, const jargs *a);
/* The elements of an iterable as a list (dict: keys; str: characters;
 * Undefined: empty); fails as Python does for the rest. */
jv jinja_iterate(jinja_vm *vm, jv v);
/* Applies a filter / test by name (map('upper'), select('odd')). */
jv jinja_filter_by_name(jinja_vm *vm, const char *name, jv value, const jargs *a);
bool jinja_test_by_name(jinja_vm *vm, const char *name, jv value, const jargs *a);

/* Python's a % b (numbers: modulo; a str: formatting). */
jv jinja_percent_or_mod(jinja_vm *vm, jv a, jv b);

/* fmt % args: Python's printf-style formatting (s r d i f e g x o %). */
jv jinja_percent_format(jinja_vm *vm, jv fmt, jv args);

/* jinja_builtins.c: a bound method of a str/list/dict value, or JV_ABSENT. */
jv jinja_method(jinja_vm *vm, jv self, const char *name);
/* jinja_builtins.c: a global function (range, namespace, dict,
 * raise_exception, strftime_now, cycler, joiner), or JV_ABSENT. */
jv jinja_global(jinja_vm *vm, const char *name);

/* Argument binding for builtins: fills out[i] for params[i] from a's
 * positional then keyword arguments (JV_ABSENT when not given); fails on
 * unknown keywords or too many arguments, naming `fname`. skip = leading
 * positional arguments already consumed (a filter's value). */
void jargs_bind(jinja_vm *vm, const jargs *a, const char *fname, const char *const *params,
                int nparams, jv *out);

#endif /* PG_JINJA_EVAL_H */
