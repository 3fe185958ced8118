/* jinja_eval: see the header. Semantics follow jinja2 3.1 (runtime.py,
 * sandbox.py, compiler.py's frames) and CPython's operators. */
#include "jinja_eval.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { FLOW_NONE = 0, FLOW_BREAK, FLOW_CONTINUE };

struct jscope {
    jscope *parent;
    int n, cap;
    const char **names;
    jv *vals;
};

static jscope *scope_new(jinja_vm *vm, jscope *parent)
{
    jscope *s = jrt_alloc(vm->rt, sizeof *s);
    s->parent = parent;
    return s;
}

static void scope_set(jinja_vm *vm, jscope *s, const char *name, jv v)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->names[i], name) == 0) {
            s->vals[i] = v;
            return;
        }
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        const char **nn = jrt_alloc(vm->rt, (size_t)cap * sizeof *nn);
        jv *vv = jrt_alloc(vm->rt, (size_t)cap * sizeof *vv);
        if (s->n) {
            memcpy(nn, s->names, (size_t)s->n * sizeof *nn);
            memcpy(vv, s->vals, (size_t)s->n * sizeof *vv);
        }
        s->names = nn;
        s->vals = vv;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n] = v;
    s->n++;
}

/* A new frame's scope, its missing names set to Undefined (jinja_frames.c). */
static jscope *frame_scope(jinja_vm *vm, jscope *parent, const jnode *frame)
{
    jscope *s = scope_new(vm, parent);
    for (int i = 0; i < frame->nmissing; i++)
        scope_set(vm, s, frame->missing[i], jv_undef_name(vm->rt, frame->missing[i]));
    return s;
}

static jv lookup(jinja_vm *vm, const char *name)
{
    for (jscope *s = vm->scope; s; s = s->parent)
        for (int i = s->n - 1; i >= 0; i--)
            if (strcmp(s->names[i], name) == 0)
                return s->vals[i];
    jv v = jv_dict_get_str(vm->vars, name, strlen(name));
    if (v.type != JV_ABSENT)
        return v;
    v = jinja_global(vm, name);
    if (v.type != JV_ABSENT)
        return v;
    return jv_undef_name(vm->rt, name);
}

/* ---- errors and limits ---- */

static _Noreturn void fail_node(jinja_vm *vm, const jnode *n, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#include <stdarg.h>
static _Noreturn void fail_node(jinja_vm *vm, const jnode *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(vm->rt->msg, sizeof vm->rt->msg, fmt, ap);
    va_end(ap);
    if (n && !vm->rt->line)
        vm->rt->line = n->line;
    longjmp(*vm->rt->on_error, 1);
}

void jinja_step(jinja_vm *vm)
{
    if (++vm->steps > vm->lim->max_steps)
        jrt_fail(vm->rt, "evaluation limit of %llu steps reached",
                 (unsigned long long)vm->lim->max_steps);
}

_Noreturn void jinja_undef_fail(jinja_vm *vm, jv u)
{
    jrt_fail(vm->rt, "%s", u.type == JV_UNDEF && u.u.undef ? u.u.undef : "undefined value");
}

static void enter(jinja_vm *vm, const jnode *n)
{
    if (++vm->depth > vm->lim->max_depth)
        fail_node(vm, n, "recursion limit of %d levels reached", vm->lim->max_depth);
    jinja_step(vm);
}

/* ---- attribute and item access (jinja2 Environment.getattr/getitem) ---- */

static jv undef_attr(jinja_vm *vm, jv obj, const char *name)
{
    if (obj.type == JV_NS)
        return jv_undef(vm->rt, "'jinja2.utils.Namespace object' has no attribute '%.200s'", name);
    return jv_undef(vm->rt, "'%s' has no attribute '%.200s'", jv_object_repr(vm->rt, obj), name);
}

jv jinja_getattr(jinja_vm *vm, jv obj, const char *name)
{
    if (obj.type == JV_UNDEF)
        jinja_undef_fail(vm, obj);
    if (obj.type == JV_NS) {
        jv v = jv_dict_get_str(obj, name, strlen(name));
        return v.type != JV_ABSENT ? v : undef_attr(vm, obj, name);
    }
    if (obj.type == JV_FUNC && obj.u.fn->attrs.type == JV_DICT) { /* loop.* */
        jv v = jv_dict_get_str(obj.u.fn->attrs, name, strlen(name));
        if (v.type != JV_ABSENT)
            return v;
        return jv_undef(vm->rt, "'jinja2.runtime.LoopContext object' has no attribute '%.200s'", name);
    }
    jv m = jinja_method(vm, obj, name);
    if (m.type != JV_ABSENT)
        return m;
    if (obj.type == JV_DICT) {
        jv v = jv_dict_get_str(obj, name, strlen(name));
        if (v.type != JV_ABSENT)
            return v;
    }
    return undef_attr(vm, obj, name);
}

static bool index_of(jv key, int64_t *i)
{
    if (key.type == JV_INT) {
        *i = key.u.i;
        return true;
    }
    if (key.type == JV_BOOL) {
        *i = key.u.b;
        return true;
    }
    return false;
}

static jv undef_elem(jinja_vm *vm, jv obj, jv key)
{
    jsb b;
    jsb_init(&b, vm->rt, 4096);
    jv_write_repr(&b, key);
    return jv_undef(vm->rt, "%s has no element %.200s", jv_object_repr(vm->rt, obj), b.p);
}

jv jinja_getitem(jinja_vm *vm, jv obj, jv key)
{
    if (obj.type == JV_UNDEF)
        jinja_undef_fail(vm, obj);
    int64_t i;
    if (obj.type == JV_DICT) {
        jv v = jv_dict_get(obj, key);
        if (v.type != JV_ABSENT)
            return v;
    } else if (obj.type == JV_LIST && (obj.u.list->kind == JL_PLAIN || obj.u.list->kind == JL_RANGE) &&
               index_of(key, &i)) {
        const jv_list *l = obj.u.list;
        if (i < 0)
            i += (int64_t)l->len;
        if (i >= 0 && i < (int64_t)l->len)
            return l->items[i];
        return undef_elem(vm, obj, key);
    } else if (obj.type == JV_STR && index_of(key, &i)) {
        const jv_str *s = obj.u.s;
        size_t n = jv_utf8_count(s->s, s->len);
        if (i < 0)
            i += (int64_t)n;
        if (i >= 0 && i < (int64_t)n) {
            size_t a = jv_utf8_offset(s->s, s->len, (size_t)i);
            size_t e = jv_utf8_offset(s->s + a, s->len - a, 1);
            return jv_str_n(vm->rt, s->s + a, e);
        }
        return undef_elem(vm, obj, key);
    }
    if (key.type == JV_STR) {
        /* item lookup failed: jinja2 falls back to the attribute */
        if (obj.type == JV_NS) {
            jv v = jv_dict_get(obj, key);
            if (v.type != JV_ABSENT)
                return v;
        } else {
            jv m = jinja_method(vm, obj, key.u.s->s);
            if (m.type != JV_ABSENT)
                return m;
        }
        return undef_attr(vm, obj, key.u.s->s);
    }
    return undef_elem(vm, obj, key);
}

/* ---- iteration ---- */

jv jinja_iterate(jinja_vm *vm, jv v)
{
    switch (v.type) {
    case JV_UNDEF: return jv_list_new(vm->rt, 0);
    case JV_LIST:
        if (v.u.list->lazy_error)
            jrt_fail(vm->rt, "%s", v.u.list->lazy_error);
        return v;
    case JV_DICT: {
        jv l = jv_list_new(vm->rt, v.u.dict->len);
        for (size_t i = 0; i < v.u.dict->len; i++)
            jv_list_push(vm->rt, l, v.u.dict->keys[i]);
        return l;
    }
    case JV_STR: {
        const jv_str *s = v.u.s;
        jv l = jv_list_new(vm->rt, s->len);
        for (size_t i = 0; i < s->len;) {
            size_t e = i + jv_utf8_offset(s->s + i, s->len - i, 1);
            jv_list_push(vm->rt, l, jv_str_n(vm->rt, s->s + i, e - i));
            i = e;
        }
        return l;
    }
    default:
        jrt_fail(vm->rt, "'%s' object is not iterable", jv_type_name(v));
    }
}

/* ---- operators ---- */

static _Noreturn void type_error_binop(jinja_vm *vm, const char *op, jv a, jv b)
{
    jrt_fail(vm->rt, "unsupported operand type(s) for %s: '%s' and '%s'", op, jv_type_name(a),
             jv_type_name(b));
}

static double as_f(jv v)
{
    return v.type == JV_FLOAT ? v.u.f : v.type == JV_INT ? (double)v.u.i : (double)v.u.b;
}
static int64_t as_i(jv v) { return v.type == JV_INT ? v.u.i : (int64_t)v.u.b; }

static jv repeat(jinja_vm *vm, jv seq, int64_t times)
{
    if (times < 0)
        times = 0;
    if (seq.type == JV_STR) {
        const jv_str *s = seq.u.s;
        if (s->len && (uint64_t)times > vm->lim->max_output_bytes / s->len)
            jrt_fail(vm->rt, "string repetition beyond the output limit");
        jsb b;
        jsb_init(&b, vm->rt, vm->lim->max_output_bytes);
        for (int64_t k = 0; k < times; k++)
            jsb_put(&b, s->s, s->len);
        return jsb_value(&b);
    }
    const jv_list *l = seq.u.list;
    if (l->len && (uint64_t)times > (uint64_t)vm->lim->max_steps / l->len)
        jrt_fail(vm->rt, "list repetition too large");
    jv out = jv_list_new(vm->rt, l->len * (size_t)times);
    out.u.list->tuple = l->tuple;
    for (int64_t k = 0; k < times; k++)
        for (size_t i = 0; i < l->len; i++)
            jv_list_push(vm->rt, out, l->items[i]);
    return out;
}


static jv binop(jinja_vm *vm, int op, jv a, jv b)
{
    if (a.type == JV_UNDEF)
        jinja_undef_fail(vm, a);
    if (b.type == JV_UNDEF)
        jinja_undef_fail(vm, b);
    if ((a.type == JV_BIGINT || b.type == JV_BIGINT) && !(op == '%' && a.type == JV_STR))
        jrt_fail(vm->rt, "integer overflow: arithmetic on an integer beyond 64 bits");
    bool num = jv_is_num(a) && jv_is_num(b);
    bool fl = num && (a.type == JV_FLOAT || b.type == JV_FLOAT);
    int64_t r;
    switch (op) {
    case '+':
        if (num) {
            if (fl)
                return jv_float(as_f(a) + as_f(b));
            if (__builtin_add_overflow(as_i(a), as_i(b), &r))
                jrt_fail(vm->rt, "integer overflow");
            return jv_int(r);
        }
        if (a.type == JV_STR && b.type == JV_STR) {
            jsb s;
            jsb_init(&s, vm->rt, vm->lim->max_output_bytes);
            jsb_put(&s, a.u.s->s, a.u.s->len);
            jsb_put(&s, b.u.s->s, b.u.s->len);
            return jsb_value(&s);
        }
        if (jv_is_plain_list(a) && jv_is_plain_list(b) && a.u.list->tuple == b.u.list->tuple) {
            jv out = jv_list_new(vm->rt, a.u.list->len + b.u.list->len);
            out.u.list->tuple = a.u.list->tuple;
            for (size_t i = 0; i < a.u.list->len; i++)
                jv_list_push(vm->rt, out, a.u.list->items[i]);
            for (size_t i = 0; i < b.u.list->len; i++)
                jv_list_push(vm->rt, out, b.u.list->items[i]);
            return out;
        }
        if (a.type == JV_STR || jv_is_plain_list(a))
            jrt_fail(vm->rt, "can only concatenate %s (not \"%s\") to %s", jv_type_name(a),
                     jv_type_name(b), jv_type_name(a));
        type_error_binop(vm, "+", a, b);
    case '-':
        if (!num)
            type_error_binop(vm, "-", a, b);
        if (fl)
            return jv_float(as_f(a) - as_f(b));
        if (__builtin_sub_overflow(as_i(a), as_i(b), &r))
            jrt_fail(vm->rt, "integer overflow");
        return jv_int(r);
    case '*':
        if (num) {
            if (fl)
                return jv_float(as_f(a) * as_f(b));
            if (__builtin_mul_overflow(as_i(a), as_i(b), &r))
                jrt_fail(vm->rt, "integer overflow");
            return jv_int(r);
        }
        if ((a.type == JV_STR || jv_is_plain_list(a)) && (b.type == JV_INT || b.type == JV_BOOL))
            return repeat(vm, a, as_i(b));
        if ((b.type == JV_STR || jv_is_plain_list(b)) && (a.type == JV_INT || a.type == JV_BOOL))
            return repeat(vm, b, as_i(a));
        if (a.type == JV_STR || b.type == JV_STR)
            jrt_fail(vm->rt, "can't multiply sequence by non-int of type '%s'",
                     jv_type_name(a.type == JV_STR ? b : a));
        type_error_binop(vm, "*", a, b);
    case '/':
        if (!num)
            type_error_binop(vm, "/", a, b);
        if (as_f(b) == 0.0)
            jrt_fail(vm->rt, "division by zero");
        return jv_float(as_f(a) / as_f(b));
    case JOP_FLOORDIV:
        if (!num)
            type_error_binop(vm, "//", a, b);
        if (fl) {
            if (as_f(b) == 0.0)
                jrt_fail(vm->rt, "float floor division by zero");
            return jv_float(floor(as_f(a) / as_f(b)));
        } else {
            int64_t x = as_i(a), y = as_i(b);
            if (y == 0)
                jrt_fail(vm->rt, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1)
                jrt_fail(vm->rt, "integer overflow");
            int64_t q = x / y;
            if ((x % y != 0) && ((x < 0) != (y < 0)))
                q--;
            return jv_int(q);
        }
    case '%':
        if (a.type == JV_STR)
            return jinja_percent_format(vm, a, b);
        if (!num)
            type_error_binop(vm, "%", a, b);
        if (fl) {
            double x = as_f(a), y = as_f(b);
            if (y == 0.0)
                jrt_fail(vm->rt, "float modulo");
            double m = fmod(x, y);
            if (m != 0.0 && ((m < 0) != (y < 0)))
                m += y;
            return jv_float(m);
        } else {
            int64_t x = as_i(a), y = as_i(b);
            if (y == 0)
                jrt_fail(vm->rt, "integer division or modulo by zero");
            if (y == -1)
                return jv_int(0);
            int64_t m = x % y;
            if (m != 0 && ((m < 0) != (y < 0)))
                m += y;
            return jv_int(m);
        }
    case JOP_POW:
        if (!num)
            type_error_binop(vm, "** or pow()", a, b);
        if (!fl && as_i(b) >= 0) {
            int64_t base = as_i(a), e = as_i(b), acc = 1;
            while (e > 0) {
                if (e & 1)
                    if (__builtin_mul_overflow(acc, base, &acc))
                        jrt_fail(vm->rt, "integer overflow");
                e >>= 1;
                if (e && __builtin_mul_overflow(base, base, &base))
                    jrt_fail(vm->rt, "integer overflow");
            }
            return jv_int(acc);
        }
        if (as_f(a) == 0.0 && as_f(b) < 0)
            jrt_fail(vm->rt, "0.0 cannot be raised to a negative power");
        {
            double x = as_f(a), y = as_f(b), p = pow(x, y);
            if (isinf(p) && isfinite(x) && isfinite(y)) /* CPython raises, unlike for * */
                jrt_fail(vm->rt, "(34, 'Numerical result out of range')");
            if (x < 0 && y != floor(y))
                jrt_fail(vm->rt, "complex results are not supported");
            return jv_float(p);
        }
    default:
        jrt_fail(vm->rt, "unknown operator");
    }
}

/* The conversion spec is built from the template's format string (checked
 * to hold only flags, width and precision before one known conversion). */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
#endif
jv jinja_percent_format(jinja_vm *vm, jv fmt, jv args)
{
    jv list;
    if (args.type == JV_LIST && args.u.list->tuple)
        list = args;
    else {
        list = jv_list_new(vm->rt, 1);
        jv_list_push(vm->rt, list, args);
    }
    const jv_str *f = fmt.u.s;
    jsb b;
    jsb_init(&b, vm->rt, vm->lim->max_output_bytes);
    size_t ai = 0;
    for (size_t i = 0; i < f->len; i++) {
        char c = f->s[i];
        if (c != '%') {
            jsb_putc(&b, c);
            continue;
        }
        if (++i >= f->len)
            jrt_fail(vm->rt, "incomplete format");
        char spec[32];
        size_t sn = 0;
        spec[sn++] = '%';
        while (i < f->len && strchr("-+ #0123456789.", f->s[i]) && sn < 20)
            spec[sn++] = f->s[i++];
        if (i >= f->len)
            jrt_fail(vm->rt, "incomplete format");
        char conv = f->s[i];
        if (conv == '%') {
            jsb_putc(&b, '%');
            continue;
        }
        if (ai >= list.u.list->len)
            jrt_fail(vm->rt, "not enough arguments for format string");
        jv v = list.u.list->items[ai++];
        switch (conv) {
        case 's': case 'r': {
            jsb t;
            jsb_init(&t, vm->rt, vm->lim->max_output_bytes);
            if (conv == 's')
                jv_write_str(&t, v);
            else
                jv_write_repr(&t, v);
            spec[sn++] = 's';
            spec[sn] = '\0';
            jsb_printf(&b, spec, t.p ? t.p : "");
            break;
        }
        case 'd': case 'i':
            if (!jv_is_num(v))
                jrt_fail(vm->rt, "%%d format: a real number is required, not %s", jv_type_name(v));
            spec[sn++] = 'l';
            spec[sn++] = 'l';
            spec[sn++] = 'd';
            spec[sn] = '\0';
            jsb_printf(&b, spec, (long long)(v.type == JV_FLOAT ? (int64_t)v.u.f : as_i(v)));
            break;
        case 'f': case 'e': case 'g': case 'F': case 'E': case 'G': case 'x': case 'X': case 'o':
            if (!jv_is_num(v))
                jrt_fail(vm->rt, "must be real number, not %s", jv_type_name(v));
            if (conv == 'x' || conv == 'X' || conv == 'o') {
                spec[sn++] = 'l';
                spec[sn++] = 'l';
                spec[sn++] = conv;
                spec[sn] = '\0';
                jsb_printf(&b, spec, (long long)as_i(v));
            } else {
                spec[sn++] = conv;
                spec[sn] = '\0';
                jsb_printf(&b, spec, as_f(v));
            }
            break;
        default:
            jrt_fail(vm->rt, "unsupported format character '%c'", conv);
        }
    }
    /* Python: a single non-tuple argument that supports [] (list, dict) may go unused */
    bool mapping_like = !(args.type == JV_LIST && args.u.list->tuple) &&
                        ((args.type == JV_LIST && (args.u.list->kind == JL_PLAIN || args.u.list->kind == JL_RANGE)) ||
                         args.type == JV_DICT);
    if (ai < list.u.list->len && !mapping_like)
        jrt_fail(vm->rt, "not all arguments converted during string formatting");
    return jsb_value(&b);
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

static bool contains(jinja_vm *vm, jv item, jv container)
{
    switch (container.type) {
    case JV_UNDEF: return false;
    case JV_STR:
        if (item.type == JV_UNDEF)
            jinja_undef_fail(vm, item);
        if (item.type != JV_STR)
            jrt_fail(vm->rt, "'in <string>' requires string as left operand, not %s", jv_type_name(item));
        if (item.u.s->len == 0)
            return true;
        return jv_memmem(container.u.s->s, container.u.s->len, item.u.s->s, item.u.s->len) != NULL;
    case JV_LIST:
        jinja_iterate(vm, container); /* a generator's late error */
        for (size_t i = 0; i < container.u.list->len; i++)
            if (jv_eq(container.u.list->items[i], item))
                return true;
        return false;
    case JV_DICT:
        if ((jv_is_plain_list(item) && !item.u.list->tuple) || item.type == JV_DICT || item.type == JV_NS)
            jrt_fail(vm->rt, "unhashable type: '%s'", jv_type_name(item));
        return jv_dict_get(container, item).type != JV_ABSENT;
    default:
        jrt_fail(vm->rt, "argument of type '%s' is not iterable", jv_type_name(container));
    }
}

static bool compare(jinja_vm *vm, int op, jv a, jv b)
{
    switch (op) {
    case JOP_EQ: return jv_eq(a, b);
    case JOP_NE: return !jv_eq(a, b);
    case JCMP_IN: return contains(vm, a, b);
    case JCMP_NOTIN: return !contains(vm, a, b);
    default: break;
    }
    if (a.type == JV_UNDEF)
        jinja_undef_fail(vm, a);
    if (b.type == JV_UNDEF)
        jinja_undef_fail(vm, b);
    bool ok;
    int c = jv_cmp(a, b, &ok);
    const char *name = op == '<' ? "<" : op == '>' ? ">" : op == JOP_LE ? "<=" : ">=";
    if (!ok)
        jrt_fail(vm->rt, "'%s' not supported between instances of '%s' and '%s'", name,
                 jv_type_name(a), jv_type_name(b));
    switch (op) {
    case '<': return c < 0;
    case '>': return c > 0;
    case JOP_LE: return c <= 0;
    default: return c >= 0;
    }
}

jv jinja_percent_or_mod(jinja_vm *vm, jv a, jv b) { return binop(vm, '%', a, b); }

/* ---- slices (CPython's PySlice_AdjustIndices) ---- */

static int64_t slice_part(jinja_vm *vm, jv v, int64_t dflt)
{
    if (v.type == JV_ABSENT || v.type == JV_NONE)
        return dflt;
    if (v.type == JV_INT || v.type == JV_BOOL)
        return as_i(v);
    if (v.type == JV_UNDEF)
        jinja_undef_fail(vm, v);
    jrt_fail(vm->rt, "slice indices must be integers or None");
}

static jv do_slice(jinja_vm *vm, jv obj, jv vstart, jv vstop, jv vstep)
{
    if (obj.type == JV_UNDEF)
        jinja_undef_fail(vm, obj);
    int64_t step = slice_part(vm, vstep, 1);
    if (step == 0)
        jrt_fail(vm->rt, "slice step cannot be zero");
    int64_t len;
    if (obj.type == JV_LIST && (obj.u.list->kind == JL_GEN || obj.u.list->kind == JL_VIEW))
        jrt_fail(vm->rt, "'%s' object is not subscriptable", jv_type_name(obj));
    if (obj.type == JV_LIST)
        len = (int64_t)obj.u.list->len;
    else if (obj.type == JV_STR)
        len = (int64_t)jv_utf8_count(obj.u.s->s, obj.u.s->len);
    else
        jrt_fail(vm->rt, "'%s' object is not subscriptable", jv_type_name(obj));
    int64_t start = slice_part(vm, vstart, step < 0 ? len - 1 : 0);
    int64_t stop = slice_part(vm, vstop, step < 0 ? -1 - len : len);
    if (vstart.type == JV_INT || vstart.type == JV_BOOL) {
        if (start < 0) {
            start += len;
            if (start < 0)
                start = step < 0 ? -1 : 0;
        } else if (start >= len)
            start = step < 0 ? len - 1 : len;
    }
    if (vstop.type == JV_INT || vstop.type == JV_BOOL || vstop.type == JV_ABSENT ||
        vstop.type == JV_NONE) {
        if (stop < 0) {
            stop += len;
            if (stop < 0)
                stop = step < 0 ? -1 : 0;
        } else if (stop >= len)
            stop = step < 0 ? len - 1 : len;
    }
    if (obj.type == JV_LIST) { /* (a slice of a range is a list here, a range in Python) */
        jv out = jv_list_new(vm->rt, 0);
        out.u.list->tuple = obj.u.list->tuple;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
            jv_list_push(vm->rt, out, obj.u.list->items[i]);
        return out;
    }
    const jv_str *s = obj.u.s;
    if (step == 1) {
        if (stop <= start)
            return jv_str_n(vm->rt, "", 0);
        size_t a = jv_utf8_offset(s->s, s->len, (size_t)start);
        size_t e = a + jv_utf8_offset(s->s + a, s->len - a, (size_t)(stop - start));
        return jv_str_n(vm->rt, s->s + a, e - a);
    }
    /* general step: index the code points once */
    size_t *off = jrt_alloc(vm->rt, ((size_t)len + 1) * sizeof *off);
    size_t k = 0;
    for (size_t i = 0; i < s->len; i++)
        if (((unsigned char)s->s[i] & 0xC0) != 0x80)
            off[k++] = i;
    off[k] = s->len;
    jsb b;
    jsb_init(&b, vm->rt, vm->lim->max_output_bytes);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
        jsb_put(&b, s->s + off[i], off[i + 1] - off[i]);
    return jsb_value(&b);
}

/* ---- evaluation ---- */

static jv eval(jinja_vm *vm, const jnode *n);
static jv call_loop(jinja_vm *vm, const jv_func *f, const jargs *a);
static void exec_body(jinja_vm *vm, jnode *const *body, int n);

static void eval_args(jinja_vm *vm, const jnode *n, jargs *a)
{
    a->n = n->nargs;
    a->v = n->nargs ? jrt_alloc(vm->rt, (size_t)n->nargs * sizeof(jv)) : NULL;
    a->kw = n->kw;
    for (int i = 0; i < n->nargs; i++)
        a->v[i] = eval(vm, n->args[i]);
}

void jargs_bind(jinja_vm *vm, const jargs *a, const char *fname, const char *const *params,
                int nparams, jv *out)
{
    for (int i = 0; i < nparams; i++)
        out[i] = jv_absent();
    int pos = 0;
    for (int i = 0; i < a->n; i++) {
        if (a->kw && a->kw[i]) {
            int k;
            for (k = 0; k < nparams; k++)
                if (strcmp(params[k], a->kw[i]) == 0)
                    break;
            if (k == nparams)
                jrt_fail(vm->rt, "%s() got an unexpected keyword argument '%s'", fname, a->kw[i]);
            out[k] = a->v[i];
        } else {
            if (pos >= nparams)
                jrt_fail(vm->rt, "%s() takes at most %d argument%s (%d given)", fname, nparams,
                         nparams == 1 ? "" : "s", a->n);
            out[pos++] = a->v[i];
        }
    }
}

static jv call_macro(jinja_vm *vm, const jv_func *f, const jargs *a)
{
    const jnode *m = f->macro;
    if (++vm->call_depth > vm->lim->max_call_depth)
        jrt_fail(vm->rt, "macro recursion limit of %d calls reached", vm->lim->max_call_depth);
    jscope *saved_scope = vm->scope;
    jsb *saved_out = vm->out;
    int saved_flow = vm->flow;
    jscope *s = frame_scope(vm, f->closure, m);
    vm->scope = s;
    jv varargs = jv_list_new(vm->rt, 0);
    varargs.u.list->tuple = true;
    jv kwargs = jv_dict_new(vm->rt, 0);
    bool *given = jrt_alloc(vm->rt, (size_t)m->nargs + 1);
    int pos = 0;
    for (int i = 0; i < a->n; i++) {
        if (a->kw && a->kw[i]) {
            int k;
            for (k = 0; k < m->nargs; k++)
                if (strcmp(m->args[k]->name, a->kw[i]) == 0)
                    break;
            if (k < m->nargs) {
                scope_set(vm, s, m->args[k]->name, a->v[i]);
                given[k] = true;
            } else
                jv_dict_set_str(vm->rt, kwargs, a->kw[i], a->v[i]);
        } else if (pos < m->nargs) {
            scope_set(vm, s, m->args[pos]->name, a->v[i]);
            given[pos++] = true;
        } else {
            jv_list_push(vm->rt, varargs, a->v[i]);
        }
    }
    for (int k = 0; k < m->nargs; k++) {
        if (given[k])
            continue;
        if (m->defaults[k])
            scope_set(vm, s, m->args[k]->name, eval(vm, m->defaults[k]));
        else
            scope_set(vm, s, m->args[k]->name,
                      jv_undef(vm->rt, "parameter '%s' was not provided", m->args[k]->name));
    }
    scope_set(vm, s, "varargs", varargs);
    scope_set(vm, s, "kwargs", kwargs);
    if (f->caller.type != JV_ABSENT)
        scope_set(vm, s, "caller", f->caller);
    jsb out;
    jsb_init(&out, vm->rt, vm->lim->max_output_bytes);
    vm->out = &out;
    vm->flow = FLOW_NONE;
    exec_body(vm, m->body, m->nbody);
    vm->out = saved_out;
    vm->scope = saved_scope;
    vm->flow = saved_flow;
    vm->call_depth--;
    return jsb_value(&out);
}

jv jinja_call(jinja_vm *vm, jv fn, const jargs *a)
{
    if (fn.type == JV_UNDEF)
        jinja_undef_fail(vm, fn);
    if (fn.type != JV_FUNC)
        jrt_fail(vm->rt, "'%s' object is not callable", jv_type_name(fn));
    if (fn.u.fn->macro && fn.u.fn->attrs.type == JV_DICT)
        return call_loop(vm, fn.u.fn, a);
    if (fn.u.fn->macro)
        return call_macro(vm, fn.u.fn, a);
    return fn.u.fn->native(vm, fn.u.fn->self, a);
}

static jv apply_filter_chain(jinja_vm *vm, const jnode *f, jv input)
{
    if (!f)
        return input;
    jv v = apply_filter_chain(vm, f->a, input);
    jargs a;
    eval_args(vm, f, &a);
    return f->filter(vm, v, &a);
}

static jv eval(jinja_vm *vm, const jnode *n)
{
    enter(vm, n);
    jv r;
    switch (n->kind) {
    case JN_CONST: r = n->value; break;
    case JN_NAME: r = lookup(vm, n->name); break;
    case JN_ATTR: r = jinja_getattr(vm, eval(vm, n->a), n->name); break;
    case JN_ITEM: {
        jv obj = eval(vm, n->a);
        r = jinja_getitem(vm, obj, eval(vm, n->b));
        break;
    }
    case JN_SLICE: {
        if (!n->a) /* x[a:b, c]: a slice inside a tuple subscript */
            fail_node(vm, n, "indices must be integers or slices, not tuple");
        jv obj = eval(vm, n->a);
        jv p0 = n->b ? eval(vm, n->b) : jv_absent();
        jv p1 = n->c ? eval(vm, n->c) : jv_absent();
        jv p2 = n->d ? eval(vm, n->d) : jv_absent();
        r = do_slice(vm, obj, p0, p1, p2);
        break;
    }
    case JN_CALL: {
        jv fn = eval(vm, n->a);
        jargs a;
        eval_args(vm, n, &a);
        r = jinja_call(vm, fn, &a);
        break;
    }
    case JN_FILTER: {
        jv v = eval(vm, n->a);
        jargs a;
        eval_args(vm, n, &a);
        r = n->filter(vm, v, &a);
        break;
    }
    case JN_TEST: {
        jv v = eval(vm, n->a);
        jargs a;
        eval_args(vm, n, &a);
        bool t = n->test(vm, v, &a);
        r = jv_bool(n->flag ? !t : t);
        break;
    }
    case JN_BINOP: {
        jv a = eval(vm, n->a);
        r = binop(vm, n->op, a, eval(vm, n->b));
        break;
    }
    case JN_NEG: case JN_POS: {
        jv a = eval(vm, n->a);
        if (a.type == JV_UNDEF)
            jinja_undef_fail(vm, a);
        if (!jv_is_num(a))
            jrt_fail(vm->rt, "bad operand type for unary %c: '%s'", n->kind == JN_NEG ? '-' : '+',
                     jv_type_name(a));
        if (n->kind == JN_POS)
            r = a.type == JV_BOOL ? jv_int(a.u.b) : a;
        else if (a.type == JV_FLOAT)
            r = jv_float(-a.u.f);
        else {
            if (as_i(a) == INT64_MIN)
                jrt_fail(vm->rt, "integer overflow");
            r = jv_int(-as_i(a));
        }
        break;
    }
    case JN_NOT: r = jv_bool(!jv_truthy(eval(vm, n->a))); break;
    case JN_AND: {
        jv a = eval(vm, n->a);
        r = jv_truthy(a) ? eval(vm, n->b) : a;
        break;
    }
    case JN_OR: {
        jv a = eval(vm, n->a);
        r = jv_truthy(a) ? a : eval(vm, n->b);
        break;
    }
    case JN_COMPARE: {
        jv left = eval(vm, n->a);
        r = jv_bool(true);
        for (int i = 0; i < n->nargs; i++) {
            jv right = eval(vm, n->args[i]);
            if (!compare(vm, n->ops[i], left, right)) {
                r = jv_bool(false);
                break;
            }
            left = right;
        }
        break;
    }
    case JN_CONCAT: {
        jsb b;
        jsb_init(&b, vm->rt, vm->lim->max_output_bytes);
        for (int i = 0; i < n->nargs; i++)
            jv_write_str(&b, eval(vm, n->args[i]));
        r = jsb_value(&b);
        break;
    }
    case JN_COND:
        if (jv_truthy(eval(vm, n->a)))
            r = eval(vm, n->b);
        else if (n->c)
            r = eval(vm, n->c);
        else
            r = jv_undef(vm->rt, "the inline if-expression on line %d evaluated to false and no else section was defined.", n->line);
        break;
    case JN_LIST: case JN_TUPLE: {
        r = jv_list_new(vm->rt, (size_t)n->nargs);
        r.u.list->tuple = n->kind == JN_TUPLE;
        for (int i = 0; i < n->nargs; i++)
            jv_list_push(vm->rt, r, eval(vm, n->args[i]));
        break;
    }
    case JN_DICT: {
        r = jv_dict_new(vm->rt, (size_t)n->nargs);
        for (int i = 0; i < n->nargs; i++) {
            jv k = eval(vm, n->args[i]);
            if (k.type == JV_LIST && !k.u.list->tuple)
                jrt_fail(vm->rt, "unhashable type: 'list'");
            if (k.type == JV_DICT || k.type == JV_NS)
                jrt_fail(vm->rt, "unhashable type: '%s'", jv_type_name(k));
            jv_dict_set(vm->rt, r, k, eval(vm, n->defaults[i]));
        }
        break;
    }
    default:
        fail_node(vm, n, "internal error: statement evaluated as an expression");
    }
    vm->depth--;
    return r;
}

/* ---- statements ---- */

static void assign(jinja_vm *vm, const jnode *target, jv v)
{
    if (target->kind == JN_NAME) {
        scope_set(vm, vm->scope, target->name, v);
        return;
    }
    if (target->kind == JN_ATTR) { /* namespace attribute */
        jv ns = lookup(vm, target->a->name);
        if (ns.type != JV_NS)
            jrt_fail(vm->rt, "cannot assign attribute on non-namespace object");
        jv_dict_set_str(vm->rt, ns, target->name, v);
        return;
    }
    /* tuple unpacking */
    jv items = jinja_iterate(vm, v);
    size_t want = (size_t)target->nargs, got = items.u.list->len;
    if (got < want)
        jrt_fail(vm->rt, "not enough values to unpack (expected %zu, got %zu)", want, got);
    if (got > want)
        jrt_fail(vm->rt, "too many values to unpack (expected %zu)", want);
    for (size_t i = 0; i < want; i++)
        scope_set(vm, vm->scope, target->args[i]->name, items.u.list->items[i]);
}

static jv loop_cycle(jinja_vm *vm, jv self, const jargs *a)
{
    if (a->n == 0)
        jrt_fail(vm->rt, "no items for cycling given");
    return a->v[self.u.i % a->n];
}

/* loop.changed(*values): true when the values differ from the last call's */
static jv loop_changed(jinja_vm *vm, jv state, const jargs *a)
{
    jv now = jv_list_new(vm->rt, (size_t)a->n);
    for (int i = 0; i < a->n; i++)
        jv_list_push(vm->rt, now, a->v[i]);
    jv last = jv_dict_get_str(state, "last", 4);
    if (last.type != JV_ABSENT && jv_eq(last, now))
        return jv_bool(false);
    jv_dict_set_str(vm->rt, state, "last", now);
    return jv_bool(true);
}

static void run_for(jinja_vm *vm, const jnode *n, jv seq, int depth, jscope *outer);

/* loop(items) in a `recursive` loop: the body again over items, one level
 * deeper; returns what it printed. */
static jv loop_recurse(jinja_vm *vm, jv self, const jargs *a)
{
    (void)self;
    jrt_fail(vm->rt, "The loop must have the 'recursive' marker to be called recursively.");
    (void)a;
}

static jv call_loop(jinja_vm *vm, const jv_func *f, const jargs *a)
{
    if (a->n != 1)
        jrt_fail(vm->rt, "loop() takes exactly one argument");
    if (++vm->call_depth > vm->lim->max_call_depth)
        jrt_fail(vm->rt, "recursion limit of %d loop calls reached", vm->lim->max_call_depth);
    jsb *saved_out = vm->out;
    jscope *saved_scope = vm->scope;
    jsb out;
    jsb_init(&out, vm->rt, vm->lim->max_output_bytes);
    vm->out = &out;
    run_for(vm, f->macro, jinja_iterate(vm, a->v[0]), (int)f->self.u.i + 1, f->closure);
    vm->out = saved_out;
    vm->scope = saved_scope;
    vm->call_depth--;
    return jsb_value(&out);
}

static void exec_for(jinja_vm *vm, const jnode *n)
{
    run_for(vm, n, jinja_iterate(vm, eval(vm, n->b)), 1, vm->scope);
}

static void run_for(jinja_vm *vm, const jnode *n, jv seq, int depth, jscope *outer)
{
    /* `for x in xs if cond`: filter first, loop.* count the kept items */
    if (n->c) {
        jv kept = jv_list_new(vm->rt, seq.u.list->len);
        for (size_t i = 0; i < seq.u.list->len; i++) {
            vm->scope = scope_new(vm, outer);
            assign(vm, n->a, seq.u.list->items[i]);
            if (jv_truthy(eval(vm, n->c)))
                jv_list_push(vm->rt, kept, seq.u.list->items[i]);
        }
        vm->scope = outer;
        seq = kept;
    }
    size_t len = seq.u.list->len;
    if (len == 0) {
        exec_body(vm, n->else_body, n->nelse);
        return;
    }
    static const char *const keys[] = {"index", "index0", "revindex", "revindex0", "first", "last",
                                       "length", "depth", "depth0", "previtem", "nextitem", "cycle",
                                       "changed"};
    enum { NKEYS = sizeof keys / sizeof keys[0] };
    jv kv[NKEYS];
    for (int k = 0; k < NKEYS; k++)
        kv[k] = jv_cstr(vm->rt, keys[k]);
    jv changed = jv_func_native(vm->rt, "changed", loop_changed, jv_dict_new(vm->rt, 1));
    for (size_t i = 0; i < len; i++) {
        jinja_step(vm);
        jv item = seq.u.list->items[i];
        jscope *s = frame_scope(vm, outer, n);
        vm->scope = s;
        jv attrs = jv_dict_new(vm->rt, NKEYS);
        jv_dict *d = attrs.u.dict;
        jv vals[NKEYS] = {
            jv_int((int64_t)i + 1), jv_int((int64_t)i), jv_int((int64_t)(len - i)),
            jv_int((int64_t)(len - i - 1)), jv_bool(i == 0), jv_bool(i + 1 == len),
            jv_int((int64_t)len), jv_int(depth), jv_int(depth - 1),
            i > 0 ? seq.u.list->items[i - 1] : jv_undef(vm->rt, "there is no previous item"),
            i + 1 < len ? seq.u.list->items[i + 1] : jv_undef(vm->rt, "there is no next item"),
            jv_func_native(vm->rt, "cycle", loop_cycle, jv_int((int64_t)i)),
            changed,
        };
        for (int k = 0; k < NKEYS; k++) {
            d->keys[k] = kv[k];
            d->vals[k] = vals[k];
        }
        d->len = NKEYS;
        /* the loop object: attributes, and callable in a recursive loop */
        jv loop = jv_func_native(vm->rt, "loop", loop_recurse, jv_int(depth));
        loop.u.fn->attrs = attrs;
        if (n->flag) {
            loop.u.fn->macro = n;
            loop.u.fn->closure = outer;
        }
        scope_set(vm, s, "loop", loop);
        assign(vm, n->a, item);
        exec_body(vm, n->body, n->nbody);
        vm->scope = outer;
        if (vm->flow == FLOW_BREAK) {
            vm->flow = FLOW_NONE;
            break;
        }
        vm->flow = FLOW_NONE;
    }
}

static void exec_stmt(jinja_vm *vm, const jnode *n)
{
    enter(vm, n);
    vm->rt->line = n->line; /* errors name the statement being run */
    switch (n->kind) {
    case JN_TEXT: jsb_put(vm->out, n->value.u.s->s, n->value.u.s->len); break;
    case JN_OUTPUT: jv_write_str(vm->out, eval(vm, n->a)); break;
    case JN_IF: /* elif chains are nested IFs: walk them without recursing */
        for (const jnode *x = n;;) {
            if (jv_truthy(eval(vm, x->a))) {
                exec_body(vm, x->body, x->nbody);
                break;
            }
            if (x->nelse == 1 && x->else_body[0]->kind == JN_IF) {
                x = x->else_body[0];
                vm->rt->line = x->line;
                jinja_step(vm);
                continue;
            }
            exec_body(vm, x->else_body, x->nelse);
            break;
        }
        break;
    case JN_FOR: exec_for(vm, n); break;
    case JN_SET: assign(vm, n->a, eval(vm, n->b)); break;
    case JN_SETBLOCK: case JN_FILTERBLOCK: {
        /* the body is a frame of its own: its sets stay inside */
        jsb *saved = vm->out;
        jscope *saved_scope = vm->scope;
        jsb b;
        jsb_init(&b, vm->rt, vm->lim->max_output_bytes);
        vm->out = &b;
        vm->scope = frame_scope(vm, saved_scope, n);
        exec_body(vm, n->body, n->nbody);
        vm->scope = saved_scope;
        vm->out = saved;
        jv v = apply_filter_chain(vm, n->c, jsb_value(&b));
        if (n->kind == JN_SETBLOCK)
            assign(vm, n->a, v);
        else
            jv_write_str(vm->out, v);
        break;
    }
    case JN_MACRO: {
        jv_func *f = jrt_alloc(vm->rt, sizeof *f);
        f->name = n->name;
        f->macro = n;
        f->closure = vm->scope;
        jv v = {JV_FUNC, {.fn = f}};
        scope_set(vm, vm->scope, n->name, v);
        break;
    }
    case JN_CALLBLOCK: {
        /* caller: a macro made of the block's body */
        jv_func *c = jrt_alloc(vm->rt, sizeof *c);
        c->name = "caller";
        c->macro = n;
        c->closure = vm->scope;
        jv callerv = {JV_FUNC, {.fn = c}};
        const jnode *call = n->a;
        jv fn = eval(vm, call->a);
        jargs a;
        eval_args(vm, call, &a);
        if (fn.type == JV_FUNC && fn.u.fn->macro) {
            jv_func bound = *fn.u.fn;
            bound.caller = callerv;
            jv_write_str(vm->out, call_macro(vm, &bound, &a));
        } else
            jv_write_str(vm->out, jinja_call(vm, fn, &a));
        break;
    }
    case JN_WITH: {
        jscope *saved = vm->scope;
        jscope *s = frame_scope(vm, saved, n);
        jv *vals = jrt_alloc(vm->rt, (size_t)(n->nargs + 1) * sizeof(jv));
        for (int i = 0; i < n->nargs; i++)
            vals[i] = eval(vm, n->defaults[i]);
        vm->scope = s;
        for (int i = 0; i < n->nargs; i++)
            assign(vm, n->args[i], vals[i]);
        exec_body(vm, n->body, n->nbody);
        vm->scope = saved;
        break;
    }
    case JN_SCOPE: {
        jscope *saved = vm->scope;
        vm->scope = frame_scope(vm, saved, n);
        exec_body(vm, n->body, n->nbody);
        vm->scope = saved;
        break;
    }
    case JN_BREAK: vm->flow = FLOW_BREAK; break;
    case JN_CONTINUE: vm->flow = FLOW_CONTINUE; break;
    default: fail_node(vm, n, "internal error: expression run as a statement");
    }
    vm->depth--;
}

static void exec_body(jinja_vm *vm, jnode *const *body, int n)
{
    for (int i = 0; i < n && vm->flow == FLOW_NONE; i++) {
        exec_stmt(vm, body[i]);
    }
}

jv jinja_filter_by_name(jinja_vm *vm, const char *name, jv value, const jargs *a)
{
    jinja_filter_fn f = jinja_find_filter(name);
    if (!f)
        jrt_fail(vm->rt, "No filter named '%s'.", name);
    return f(vm, value, a);
}

bool jinja_test_by_name(jinja_vm *vm, const char *name, jv value, const jargs *a)
{
    jinja_test_fn t = jinja_find_test(name);
    if (!t)
        jrt_fail(vm->rt, "No test named '%s'.", name);
    return t(vm, value, a);
}

jv jinja_render(jinja_rt *rt, const jnode *root, jv vars, const jinja_limits *lim,
                int64_t now_unix)
{
    jsb out;
    jsb_init(&out, rt, lim->max_output_bytes);
    jinja_vm vm = {.rt = rt, .lim = lim, .out = &out, .vars = vars, .now_unix = now_unix};
    vm.scope = frame_scope(&vm, NULL, root);
    exec_body(&vm, root->body, root->nbody);
    return jsb_value(&out);
}
