/* jinja_filters: jinja2 3.1's builtin filters (filters.py) and tests
 * (tests.py) that chat templates use, plus transformers' tojson
 * (json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
 * sort_keys=sort_keys), chat_template_utils.py). The tables at the bottom
 * are what jinja_find_filter / jinja_find_test resolve at parse time. */
#include "jinja_builtins.h"
#include "jinja_eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARGS(name, ...)                                                        \
    static const char *const params[] = {__VA_ARGS__};                         \
    jv p[sizeof params / sizeof params[0]];                                    \
    jargs_bind(vm, a, name, params, (int)(sizeof params / sizeof params[0]), p)

static jv str_of(jinja_vm *vm, jv v) { return jv_to_str(vm->rt, v); }

static bool arg_bool(jv v, bool dflt) { return v.type == JV_ABSENT ? dflt : jv_truthy(v); }

static jv rest_args(const jargs *a, int skip, jargs *out)
{
    int k = a->n > skip ? skip : a->n;
    out->n = a->n - k;
    out->v = a->v ? a->v + k : NULL; /* no arithmetic on NULL (UB) */
    out->kw = a->kw ? a->kw + k : NULL;
    return jv_none();
}

/* ---- strings ---- */

static jv f_trim(jinja_vm *vm, jv v, const jargs *a)
{
    ARGS("trim", "chars");
    return jinja_str_strip(vm, str_of(vm, v), p[0], 'b');
}
static jv f_upper(jinja_vm *vm, jv v, const jargs *a) { (void)a; return jinja_str_case(vm, str_of(vm, v), 'u'); }
static jv f_lower(jinja_vm *vm, jv v, const jargs *a) { (void)a; return jinja_str_case(vm, str_of(vm, v), 'l'); }
static jv f_capitalize(jinja_vm *vm, jv v, const jargs *a) { (void)a; return jinja_str_case(vm, str_of(vm, v), 'c'); }

/* jinja2's do_title: words split on [-\s({\[<]+, each word's first
 * character upper-cased and the rest lower-cased */
static jv f_title(jinja_vm *vm, jv v, const jargs *a)
{
    (void)a;
    const jv_str *s = str_of(vm, v).u.s;
    jsb b;
    jsb_init(&b, vm->rt, vm->lim->max_output_bytes);
    bool word_start = true;
    for (size_t i = 0; i < s->len;) {
        uint32_t c = jinja_utf8_next(s->s, s->len, &i);
        bool sep = jinja_is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
        if (sep) {
            jinja_utf8_put(&b, c);
            word_start = true;
        } else {
            jinja_utf8_put(&b, word_start ? jinja_upper(c) : jinja_lower(c));
            word_start = false;
        }
    }
    return jsb_value(&b);
}

static jv f_replace(jinja_vm *vm, jv v, const jargs *a)
{
    ARGS("replace", "old", "new", "count");
    int64_t count = p[2].type == JV_INT ? p[2].u.i : -1;
    return jinja_str_replace(vm, str_of(vm, v), str_of(vm, p[0]), str_of(vm, p[1]), count);
}

static jv f_string(jinja_vm *vm, jv v, const jargs *a) { (void)a; return str_of(vm, v); }
static jv f_safe(jinja_vm *vm, jv v, const jargs *a) { (void)a; (void)vm; return v; }

static jv f_escape(jinja_vm *vm, jv v, const jargs *a)
{
    (void)a;
    const jv_str *s = str_of(vm, v).u.s;
    jsb b;
    jsb_init(&b, vm->rt, vm->lim->max_output_bytes);
    for (size_t i = 0; i < s->len; i++) {
        switch (s->s[i]) {
        case '&': jsb_puts(&b, "&amp;"); break;
        case '<': jsb_puts(&b, "&lt;"); break;
        case '>': jsb_puts(&b, "&gt;"); break;
        case '"': jsb_puts(&b, "&#34;"); break;
        case '\'': jsb_puts(&b, "&#39;"); break;
        default: jsb_putc(&b, s->s[i]);
        }
    }
    return jsb_value(&b);
}

static jv f_indent(jinja_vm *vm, jv v, const jargs *a)
{
    ARGS("indent", "width", "first", "blank");
    jv ind;
    if (p[0].type == JV_STR)
        ind = p[0];
    else {
        int64_t w = p[0].type == JV_ABSENT ? 4 : p[0].type == JV_INT ? p[0].u.i : 4;
        if (w < 0)
            w = 0;
        if (w > 4096)
            jrt_fail(vm->rt, "indent width too large");
        jsb sp;
        jsb_init(&sp, vm->rt, 8192);
        for (int64_t i = 0; i < w; i++)
            jsb_putc(&sp, ' ');
        ind = jsb_value(&sp);
    }
    bool first = arg_bool(p[1], false), blank = arg_bool(p[2], false);
    if (v.type != JV_STR) { /* jinja2's do_indent does `s += "\n"` */
        if (v.type == JV_UNDEF)
            jinja_undef_fail(vm, v);
        jrt_fail(vm->rt, "unsupported operand type(s) for +=: '%s' and 'str'", jv_type_name(v));
    }
    const jv_str *s = v.u.s;
    const jv_str *in = ind.u.s;
    jsb b;
    jsb_init(&b, vm->rt, vm->lim->max_output_bytes);
    /* jinja2: s += "\n" (newline normalization aside); lines after the
     * first get the indent, blank ones only with blank=True */
    size_t i = 0;
    bool first_line = true;
    while (i <= s->len) {
        const char *nl = memchr(s->s + i, '\n', s->len - i);
        size_t e = nl ? (size_t)(nl - s->s) : s->len;
        bool is_blank = e == i;
        if (first_line ? first : (blank || !is_blank))
            if (!(first_line && first && is_blank && !blank && e == s->len && !nl))
                jsb_put(&b, in->s, in->len);
        jsb_put(&b, s->s + i, e - i);
        if (!nl)
            break;
        jsb_putc(&b, '\n');
        i = e + 1;
        first_line = false;
        jinja_step(vm);
    }
    return jsb_value(&b);
}

static jv f_center(jinja_vm *vm, jv v, const jargs *a)
{
    ARGS("center", "width");
    const jv_str *s = str_of(vm, v).u.s;
    int64_t w = p[0].type == JV_INT ? p[0].u.i : 80;
    int64_t n = (int64_t)jv_utf8_count(s->s, s->len);
    if (w > 1 << 20)
        jrt_fail(vm->rt, "center width too large");
    if (w <= n)
        return str_of(vm, v);
    int64_t pad = w - n, left = pad / 2 + (pad & w & 1);
    jsb b;
    jsb_init(&b, vm->rt, vm->lim->max_output_bytes);
    for (int64_t i = 0; i < left; i++)
        jsb_putc(&b, ' ');
    jsb_put(&b, s->s, s->len);
    for (int64_t i = 0; i < pad - left; i++)
        jsb_putc(&b, ' ');
    return jsb_value(&b);
}

static jv f_wordcount(jinja_vm *vm, jv v, const jargs *a)
{
    (void)a;
    const jv_str *s = str_of(vm, v).u.s;
    int64_t n = 0;
    bool in = false;
    for (size_t i = 0; i < s->len; i++) {
        char c = s->s[i];
        bool w = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                 c == '_' || (unsigned char)c >= 0x80;
        if (w && !in)
            n++;
        in = w;
    }
    return jv_int(n);
}

static jv f_format(jinja_vm *vm, jv v, const jargs *a)
{
    jv args = jv_list_new(vm->rt, (size_t)a->n);
    args.u.list->tuple = true;
    for (int i = 0; i < a->n; i++)
        jv_list_push(vm->rt, args, a->v[i]);
    jv fmt = str_of(vm, v);
    return jinja_percent_format(vm, fmt, args);
}

/* ---- sequences ---- */

/* jinja2's generator filters iterate their input only when consumed; here
 * they run at once, and an input that cannot be iterated becomes a
 * generator whose iteration fails (jinja_iterate raises lazy_error). */
static jv gen_source(jinja_vm *vm, jv v, bool *ok)
{
    *ok = true;
    if (v.type == JV_STR || v.type == JV_LIST || v.type == JV_DICT || v.type == JV_UNDEF) {
        if (v.type == JV_LIST && v.u.list->lazy_error) {
            *ok = false;
            jv g = jv_list_new(vm->rt, 0);
            g.u.list->lazy_error = v.u.list->lazy_error;
            return g;
        }
        return jinja_iterate(vm, v);
    }
    *ok = false;
    jv g = jv_list_new(vm->rt, 0);
    jsb b;
    jsb_init(&b, vm->rt, 4096);
    jsb_printf(&b, "'%s' object is not iterable", jv_type_name(v));
    g.u.list->lazy_error = b.p;
    return g;
}

static jv gen(jv list, const char *name) { return jv_list_as(list, JL_GEN, name); }

static jv f_length(jinja_vm *vm, jv v, const jargs *a)
{
    (void)a;
    if (v.type == JV_LIST && v.u.list->kind == JL_GEN)
        jrt_fail(vm->rt, "object of type '%s' has no len()", jv_type_name(v));
    switch (v.type) {
    case JV_UNDEF: return jv_int(0);
    case JV_STR: return jv_int((int64_t)jv_utf8_count(v.u.s->s, v.u.s->len));
    case JV_LIST: return jv_int((int64_t)v.u.list->len);
    case JV_DICT: case JV_NS: return jv_int((int64_t)v.u.dict->len);
    default: jrt_fail(vm->rt, "object of type '%s' has no len()", jv_type_name(v));
    }
}

static jv f_list(jinja_vm *vm, jv v, const jargs *a)
{
    (void)a;
    jv src = jinja_iterate(vm, v);
    jv out = jv_list_new(vm->rt, src.u.list->len);
    for (size_t i = 0; i < src.u.list->len; i++)
        jv_list_push(vm->rt, out, src.u.list->items[i]);
    return out;
}

static jv f_first(jinja_vm *vm, jv v, const jargs *a)
{
    (void)a;
    jv l = jinja_iterate(vm, v);
    if (l.u.list->len == 0)
        return jv_undef(vm->rt, "No first item, sequence was empty.");
    return l.u.list->items[0];
}

static jv f_last(jinja_vm *vm, jv v, const jargs *a)
{
    (void)a;
    if (v.type == JV_LIST && v.u.list->kind == JL_GEN)
        jrt_fail(vm->rt, "'%s' object is not reversible", jv_type_name(v));
    jv l = jinja_iterate(vm, v);
    if (l.u.list->len == 0)
        return jv_undef(vm->rt, "No last item, sequence was empty.");
    return l.u.list->items[l.u.list->len - 1];
}

static jv f_reverse(jinja_vm *vm, jv v, const jargs *a)
{
    (void)a;
    if (v.type == JV_STR) {
        jv chars = jinja_iterate(vm, v);
        jsb b;
        jsb_init(&b, vm->rt, vm->lim->max_output_bytes);
        for (size_t i = chars.u.list->len; i-- > 0;)
            jv_write_str(&b, chars.u.list->items[i]);
        return jsb_value(&b);
    }
    /* jinja2: reversed(value) (an iterator), else list(value) reversed */
    bool was_gen = v.type == JV_LIST && v.u.list->kind == JL_GEN;
    if (v.type == JV_UNDEF)
        return gen(jv_list_new(vm->rt, 0), "reversed object");
    if (v.type != JV_LIST && v.type != JV_DICT)
        jrt_fail(vm->rt, "'%s' object is not reversible", jv_type_name(v));
    jv l = jinja_iterate(vm, v);
    jv out = jv_list_new(vm->rt, l.u.list->len);
    for (size_t i = l.u.list->len; i-- > 0;)
        jv_list_push(vm->rt, out, l.u.list->items[i]);
    if (was_gen)
        return out;
    return gen(out, v.type == JV_DICT ? "dict_reversekeyiterator object"
                    : v.u.list->tuple ? "reversed object" : "list_reverseiterator object");
}

/* jinja2's make_attrgetter: "a.b.0" item-first lookups */
static jv attr_get(jinja_vm *vm, jv item, jv attribute)
{
    if (attribute.type == JV_ABSENT || attribute.type == JV_NONE)
        return item;
    if (attribute.type == JV_INT)
        return jinja_getitem(vm, item, attribute);
    const jv_str *s = str_of(vm, attribute).u.s;
    size_t i = 0;
    for (;;) {
        const char *dot = memchr(s->s + i, '.', s->len - i);
        size_t e = dot ? (size_t)(dot - s->s) : s->len;
        jv key;
        bool digits = e > i;
        for (size_t k = i; k < e; k++)
            digits = digits && s->s[k] >= '0' && s->s[k] <= '9';
        if (digits)
            key = jv_int(strtoll(s->s + i, NULL, 10));
        else
            key = jv_str_n(vm->rt, s->s + i, e - i);
        if (item.type == JV_UNDEF)
            return item;
        item = jinja_getitem(vm, item, key);
        if (!dot)
            return item;
        i = e + 1;
    }
}

static jv f_join(jinja_vm *vm, jv v, const jargs *a)
{
    ARGS("join", "d", "attribute");
    jv l = jinja_iterate(vm, v);
    jv sep = p[0].type == JV_ABSENT ? jv_str_n(vm->rt, "", 0) : str_of(vm, p[0]);
    jsb b;
    jsb_init(&b, vm->rt, vm->lim->max_output_bytes);
    for (size_t i = 0; i < l.u.list->len; i++) {
        if (i)
            jsb_put(&b, sep.u.s->s, sep.u.s->len);
        jv_write_str(&b, attr_get(vm, l.u.list->items[i], p[1]));
        jinja_step(vm);
    }
    return jsb_value(&b);
}

static jv f_default(jinja_vm *vm, jv v, const jargs *a)
{
    ARGS("default", "default_value", "boolean");
    bool boolean = arg_bool(p[1], false);
    if (v.type == JV_UNDEF || (boolean && !jv_truthy(v)))
        return p[0].type == JV_ABSENT ? jv_str_n(vm->rt, "", 0) : p[0];
    return v;
}

static jv f_items(jinja_vm *vm, jv v, const jargs *a)
{
    (void)a;
    if (v.type == JV_UNDEF)
        return gen(jv_list_new(vm->rt, 0), "generator object do_items");
    if (v.type != JV_DICT) {
        jv g = jv_list_new(vm->rt, 0);
        g.u.list->lazy_error = "Can only get item pairs from a mapping.";
        return gen(g, "generator object do_items");
    }
    jv m = jinja_method(vm, v, "items");
    jargs none = {0};
    jv items = jinja_call(vm, m, &none);
    jv out = jv_list_new(vm->rt, items.u.list->len);
    for (size_t i = 0; i < items.u.list->len; i++)
        jv_list_push(vm->rt, out, items.u.list->items[i]);
    return gen(out, "generator object do_items");
}

/* sort key comparison: case-insensitive unless asked (jinja2 ignore_case) */
typedef struct sort_ctx {
    jinja_vm *vm;
    bool case_sensitive;
} sort_ctx;

static jv fold(sort_ctx *c, jv v)
{
    if (!c->case_sensitive && v.type == JV_STR)
        return jinja_str_case(c->vm, v, 'l');
    return v;
}

static int cmp_keys(sort_ctx *c, jv x, jv y)
{
    bool ok;
    int r = jv_cmp(fold(c, x), fold(c, y), &ok);
    if (!ok)
        jrt_fail(c->vm->rt, "'<' not supported between instances of '%s' and '%s'", jv_type_name(x),
                 jv_type_name(y));
    return r;
}

/* stable merge sort of items by keys */
static void sort_by(sort_ctx *c, jv *items, jv *keys, size_t n, bool reverse)
{
    if (n < 2)
        return;
    jv *ti = jrt_alloc(c->vm->rt, n * sizeof(jv));
    jv *tk = jrt_alloc(c->vm->rt, n * sizeof(jv));
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int r = cmp_keys(c, keys[j], keys[i]);
                bool take_right = reverse ? r > 0 : r < 0;
                if (take_right) {
                    ti[k] = items[j];
                    tk[k++] = keys[j++];
                } else {
                    ti[k] = items[i];
                    tk[k++] = keys[i++];
                }
                jinja_step(c->vm);
            }
            while (i < mid) {
                ti[k] = items[i];
                tk[k++] = keys[i++];
            }
            while (j < hi) {
                ti[k] = items[j];
                tk[k++] = keys[j++];
            }
        }
        memcpy(items, ti, n * sizeof(jv));
        memcpy(keys, tk, n * sizeof(jv));
    }
}

static jv f_sort(jinja_vm *vm, jv v, const jargs *a)
{
    ARGS("sort", "reverse", "case_sensitive", "attribute");
    jv l = f_list(vm, v, NULL);
    size_t n = l.u.list->len;
    jv *keys = jrt_alloc(vm->rt, (n + 1) * sizeof(jv));
    for (size_t i = 0; i < n; i++)
        keys[i] = attr_get(vm, l.u.list->items[i], p[2]);
    sort_ctx c = {vm, arg_bool(p[1], false)};
    sort_by(&c, l.u.list->items, keys, n, arg_bool(p[0], false));
    return l;
}

static jv f_dictsort(jinja_vm *vm, jv v, const jargs *a)
{
    ARGS("dictsort", "case_sensitive", "by", "reverse");
    if (v.type == JV_UNDEF) /* jinja2 calls value.items() */
        jinja_undef_fail(vm, v);
    if (v.type != JV_DICT)
        jrt_fail(vm->rt, "'%s' object has no attribute 'items'", jv_type_name(v));
    jv items = f_list(vm, f_items(vm, v, &(jargs){0}), NULL);
    size_t n = items.u.list->len;
    bool by_value = p[1].type == JV_STR && strcmp(p[1].u.s->s, "value") == 0;
    if (p[1].type == JV_STR && !by_value && strcmp(p[1].u.s->s, "key") != 0)
        jrt_fail(vm->rt, "You can only sort by either \"key\" or \"value\"");
    jv *keys = jrt_alloc(vm->rt, (n + 1) * sizeof(jv));
    for (size_t i = 0; i < n; i++)
        keys[i] = items.u.list->items[i].u.list->items[by_value ? 1 : 0];
    sort_ctx c = {vm, arg_bool(p[0], false)};
    sort_by(&c, items.u.list->items, keys, n, arg_bool(p[2], false));
    return items;
}

static jv f_unique(jinja_vm *vm, jv v, const jargs *a)
{
    ARGS("unique", "case_sensitive", "attribute");
    bool ok;
    jv l = gen_source(vm, v, &ok);
    if (!ok)
        return gen(l, "generator object do_unique");
    sort_ctx c = {vm, arg_bool(p[0], false)};
    jv out = jv_list_new(vm->rt, l.u.list->len);
    jv seen = jv_list_new(vm->rt, l.u.list->len);
    for (size_t i = 0; i < l.u.list->len; i++) {
        jv key = fold(&c, attr_get(vm, l.u.list->items[i], p[1]));
        if (jv_is_plain_list(key) ? !key.u.list->tuple : key.type == JV_DICT || key.type == JV_NS) {
            /* a set of seen items: Python fails on an unhashable one when iterated */
            jv g = jv_list_new(vm->rt, 0);
            jsb eb;
            jsb_init(&eb, vm->rt, 256);
            jsb_printf(&eb, "unhashable type: '%s'", jv_type_name(key));
            g.u.list->lazy_error = eb.p;
            return gen(g, "generator object do_unique");
        }
        bool dup = false;
        for (size_t k = 0; k < seen.u.list->len && !dup; k++) {
            dup = jv_eq(seen.u.list->items[k], key);
            jinja_step(vm);
        }
        if (!dup) {
            jv_list_push(vm->rt, seen, key);
            jv_list_push(vm->rt, out, l.u.list->items[i]);
        }
    }
    return gen(out, "generator object do_unique");
}

static jv minmax(jinja_vm *vm, jv v, const jargs *a, bool want_max)
{
    ARGS(want_max ? "max" : "min", "case_sensitive", "attribute");
    jv l = jinja_iterate(vm, v);
    if (l.u.list->len == 0)
        return jv_undef(vm->rt, "No aggregated item, sequence was empty.");
    sort_ctx c = {vm, arg_bool(p[0], false)};
    jv best = l.u.list->items[0];
    jv bk = attr_get(vm, best, p[1]);
    for (size_t i = 1; i < l.u.list->len; i++) {
        jv k = attr_get(vm, l.u.list->items[i], p[1]);
        int r = cmp_keys(&c, k, bk);
        if (want_max ? r > 0 : r < 0) {
            best = l.u.list->items[i];
            bk = k;
        }
    }
    return best;
}
static jv f_max(jinja_vm *vm, jv v, const jargs *a) { return minmax(vm, v, a, true); }
static jv f_min(jinja_vm *vm, jv v, const jargs *a) { return minmax(vm, v, a, false); }

static jv f_sum(jinja_vm *vm, jv v, const jargs *a)
{
    ARGS("sum", "attribute", "start");
    jv l = jinja_iterate(vm, v);
    jv acc = p[1].type == JV_ABSENT ? jv_int(0) : p[1];
    for (size_t i = 0; i < l.u.list->len; i++) {
        jv x = attr_get(vm, l.u.list->items[i], p[0]);
        if (!jv_is_num(acc) || !jv_is_num(x))
            jrt_fail(vm->rt, "unsupported operand type(s) for +: '%s' and '%s'", jv_type_name(acc),
                     jv_type_name(x));
        if (acc.type == JV_FLOAT || x.type == JV_FLOAT)
            acc = jv_float((acc.type == JV_FLOAT ? acc.u.f : (double)(acc.type == JV_INT ? acc.u.i : acc.u.b)) +
                           (x.type == JV_FLOAT ? x.u.f : (double)(x.type == JV_INT ? x.u.i : x.u.b)));
        else {
            int64_t r;
            if (__builtin_add_overflow(acc.type == JV_INT ? acc.u.i : acc.u.b,
                                       x.type == JV_INT ? x.u.i : x.u.b, &r))
                jrt_fail(vm->rt, "integer overflow");
            acc = jv_int(r);
        }
    }
    return acc;
}

static jv f_batch(jinja_vm *vm, jv v, const jargs *a)
{
    ARGS("batch", "linecount", "fill_with");
    if (p[0].type != JV_INT || p[0].u.i <= 0)
        jrt_fail(vm->rt, "batch: linecount must be a positive integer");
    int64_t n = p[0].u.i;
    bool ok;
    jv l = gen_source(vm, v, &ok);
    if (!ok)
        return gen(l, "generator object do_batch");
    jv out = jv_list_new(vm->rt, 0);
    jv cur = jv_list_new(vm->rt, 0);
    for (size_t i = 0; i < l.u.list->len; i++) {
        jv_list_push(vm->rt, cur, l.u.list->items[i]);
        if ((int64_t)cur.u.list->len == n) {
            jv_list_push(vm->rt, out, cur);
            cur = jv_list_new(vm->rt, 0);
        }
    }
    if (cur.u.list->len) {
        if (p[1].type != JV_ABSENT && p[1].type != JV_NONE)
            while ((int64_t)cur.u.list->len < n)
                jv_list_push(vm->rt, cur, p[1]);
        jv_list_push(vm->rt, out, cur);
    }
    return gen(out, "generator object do_batch");
}

/* select/reject/selectattr/rejectattr (jinja2 select_or_reject) */
static jv select_impl(jinja_vm *vm, jv v, const jargs *a, bool by_attr, bool keep)
{
    const char *name = "generator object select_or_reject";
    if (!jv_truthy(v)) /* jinja2: `if value:` before iterating */
        return gen(jv_list_new(vm->rt, 0), name);
    bool ok;
    jv l = gen_source(vm, v, &ok);
    if (!ok)
        return gen(l, name);
    int skip = 0;
    jv attribute = jv_absent();
    if (by_attr) {
        if (a->n < 1)
            jrt_fail(vm->rt, "Missing parameter for attribute name");
        attribute = a->v[0];
        skip = 1;
    }
    const char *test = NULL;
    if (a->n > skip) {
        jv t = a->v[skip];
        if (t.type != JV_STR)
            jrt_fail(vm->rt, "test name must be a string");
        test = t.u.s->s;
        if (!jinja_find_test(test))
            jrt_fail(vm->rt, "No test named '%s'.", test);
        skip++;
    }
    jargs rest;
    rest_args(a, skip, &rest);
    jv out = jv_list_new(vm->rt, l.u.list->len);
    for (size_t i = 0; i < l.u.list->len; i++) {
        jv item = l.u.list->items[i];
        jv x = by_attr ? attr_get(vm, item, attribute) : item;
        bool r = test ? jinja_test_by_name(vm, test, x, &rest) : jv_truthy(x);
        if (r == keep)
            jv_list_push(vm->rt, out, item);
        jinja_step(vm);
    }
    return gen(out, name);
}

static jv f_select(jinja_vm *vm, jv v, const jargs *a) { return select_impl(vm, v, a, false, true); }
static jv f_reject(jinja_vm *vm, jv v, const jargs *a) { return select_impl(vm, v, a, false, false); }
static jv f_selectattr(jinja_vm *vm, jv v, const jargs *a) { return select_impl(vm, v, a, true, true); }
static jv f_rejectattr(jinja_vm *vm, jv v, const jargs *a) { return select_impl(vm, v, a, true, false); }

static jv f_map(jinja_vm *vm, jv v, const jargs *a)
{
    if (!jv_truthy(v)) /* jinja2: `if value:` before iterating */
        return gen(jv_list_new(vm->rt, 0), "generator object sync_do_map");
    bool ok;
    jv l = gen_source(vm, v, &ok);
    if (!ok)
        return gen(l, "generator object sync_do_map");
    jv out = gen(jv_list_new(vm->rt, l.u.list->len), "generator object sync_do_map");
    jv attribute = jv_absent(), dflt = jv_absent();
    bool by_attr = false;
    for (int i = 0; i < a->n; i++)
        if (a->kw && a->kw[i]) {
            if (strcmp(a->kw[i], "attribute") == 0) {
                attribute = a->v[i];
                by_attr = true;
            } else if (strcmp(a->kw[i], "default") == 0)
                dflt = a->v[i];
        }
    if (by_attr) {
        for (size_t i = 0; i < l.u.list->len; i++) {
            jv x = attr_get(vm, l.u.list->items[i], attribute);
            if (x.type == JV_UNDEF && dflt.type != JV_ABSENT)
                x = dflt;
            jv_list_push(vm->rt, out, x);
            jinja_step(vm);
        }
        return out;
    }
    if (a->n < 1 || a->v[0].type != JV_STR || (a->kw && a->kw[0]))
        jrt_fail(vm->rt, "map requires a filter argument");
    const char *name = a->v[0].u.s->s;
    if (!jinja_find_filter(name))
        jrt_fail(vm->rt, "No filter named '%s'.", name);
    jargs rest;
    rest_args(a, 1, &rest);
    for (size_t i = 0; i < l.u.list->len; i++) {
        jv_list_push(vm->rt, out, jinja_filter_by_name(vm, name, l.u.list->items[i], &rest));
        jinja_step(vm);
    }
    return out;
}

static jv f_attr(jinja_vm *vm, jv v, const jargs *a)
{
    ARGS("attr", "name");
    /* jinja2's do_attr: Python attribute access only, no item fallback */
    const char *name = str_of(vm, p[0]).u.s->s;
    if (v.type == JV_UNDEF)
        jinja_undef_fail(vm, v);
    if (v.type == JV_NS) {
        jv x = jv_dict_get_str(v, name, strlen(name));
        if (x.type != JV_ABSENT)
            return x;
    }
    jv m = jinja_method(vm, v, name);
    if (m.type != JV_ABSENT)
        return m;
    return jv_undef(vm->rt, "'%s' has no attribute '%.200s'", jv_object_repr(vm->rt, v), name);
}

/* ---- numbers ---- */

static bool parse_int_str(const char *s, int64_t base, int64_t *out)
{
    while (*s == ' ' || *s == '\t' || *s == '\n')
        s++;
    char *end;
    long long v = strtoll(s, &end, (int)base);
    if (end == s)
        return false;
    while (*end == ' ' || *end == '\t' || *end == '\n')
        end++;
    if (*end)
        return false;
    *out = v;
    return true;
}

static jv f_int(jinja_vm *vm, jv v, const jargs *a)
{
    ARGS("int", "default", "base");
    jv dflt = p[0].type == JV_ABSENT ? jv_int(0) : p[0];
    int64_t base = p[1].type == JV_INT ? p[1].u.i : 10;
    switch (v.type) {
    case JV_INT: case JV_BIGINT: return v;
    case JV_BOOL: return jv_int(v.u.b);
    case JV_FLOAT:
        if (!isfinite(v.u.f) || fabs(v.u.f) >= 9.2e18)
            return dflt;
        return jv_int((int64_t)v.u.f);
    case JV_STR: {
        int64_t r;
        if (base >= 2 && base <= 36 && parse_int_str(v.u.s->s, base, &r))
            return jv_int(r);
        char *end;
        double d = strtod(v.u.s->s, &end);
        if (end != v.u.s->s && *end == '\0' && isfinite(d) && fabs(d) < 9.2e18)
            return jv_int((int64_t)d);
        return dflt;
    }
    case JV_UNDEF: jinja_undef_fail(vm, v);
    default: return dflt;
    }
}

static jv f_float(jinja_vm *vm, jv v, const jargs *a)
{
    ARGS("float", "default");
    jv dflt = p[0].type == JV_ABSENT ? jv_float(0.0) : p[0];
    switch (v.type) {
    case JV_INT: return jv_float((double)v.u.i);
    case JV_BOOL: return jv_float(v.u.b);
    case JV_FLOAT: return v;
    case JV_BIGINT: return jv_float(strtod(v.u.s->s, NULL));
    case JV_STR: {
        char *end;
        const char *s = v.u.s->s;
        while (*s == ' ')
            s++;
        double d = strtod(s, &end);
        while (*end == ' ' || *end == '\n')
            end++;
        if (end != s && *end == '\0')
            return jv_float(d);
        return dflt;
    }
    case JV_UNDEF: jinja_undef_fail(vm, v);
    default: return dflt;
    }
}

static jv f_abs(jinja_vm *vm, jv v, const jargs *a)
{
    (void)a;
    if (v.type == JV_INT)
        return jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
    if (v.type == JV_BOOL)
        return jv_int(v.u.b);
    if (v.type == JV_FLOAT)
        return jv_float(fabs(v.u.f));
    if (v.type == JV_UNDEF)
        jinja_undef_fail(vm, v);
    jrt_fail(vm->rt, "bad operand type for abs(): '%s'", jv_type_name(v));
}

/* Python's round(x, n): round half to even on the decimal value */
static double py_round(double x, int64_t nd)
{
    if (!isfinite(x) || nd > 300)
        return x;
    double m = pow(10.0, (double)nd);
    double y = x * m;
    double r = nearbyint(y); /* default rounding mode: half to even */
    if (fabs(y - trunc(y)) != 0.5)
        r = round(y);
    return r / m;
}

static jv f_round(jinja_vm *vm, jv v, const jargs *a)
{
    ARGS("round", "precision", "method");
    int64_t prec = p[0].type == JV_INT ? p[0].u.i : 0;
    const char *method = p[1].type == JV_STR ? p[1].u.s->s : "common";
    if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
        jrt_fail(vm->rt, "method must be common, ceil or floor");
    if (v.type == JV_UNDEF)
        jinja_undef_fail(vm, v);
    if (!jv_is_num(v))
        jrt_fail(vm->rt, "type %s doesn't define __round__ method", jv_type_name(v));
    if (strcmp(method, "common") == 0 && v.type != JV_FLOAT)
        return v.type == JV_BOOL ? jv_int(v.u.b) : v; /* round(int, n) is the int */
    double x = v.type == JV_FLOAT ? v.u.f : (double)(v.type == JV_INT ? v.u.i : v.u.b);
    if (strcmp(method, "common") == 0)
        return jv_float(py_round(x, prec));
    double m = pow(10.0, (double)prec);
    return jv_float((method[0] == 'c' ? ceil(x * m) : floor(x * m)) / m);
}

/* ---- tojson (transformers) ---- */

static jv f_tojson(jinja_vm *vm, jv v, const jargs *a)
{
    ARGS("tojson", "ensure_ascii", "indent", "separators", "sort_keys");
    const char *indent = NULL;
    if (p[1].type == JV_INT || p[1].type == JV_BOOL) {
        int64_t n = p[1].type == JV_INT ? p[1].u.i : p[1].u.b;
        if (n > 256)
            jrt_fail(vm->rt, "tojson: indent too large");
        char *sp = jrt_alloc(vm->rt, (size_t)(n > 0 ? n : 0) + 1);
        for (int64_t i = 0; i < n; i++)
            sp[i] = ' ';
        indent = sp;
    } else if (p[1].type == JV_STR)
        indent = p[1].u.s->s;
    else if (p[1].type != JV_ABSENT && p[1].type != JV_NONE)
        jrt_fail(vm->rt, "tojson: indent must be an int or a string");
    const char *item_sep = NULL, *key_sep = NULL;
    if (p[2].type == JV_LIST && p[2].u.list->len == 2 && p[2].u.list->items[0].type == JV_STR &&
        p[2].u.list->items[1].type == JV_STR) {
        item_sep = p[2].u.list->items[0].u.s->s;
        key_sep = p[2].u.list->items[1].u.s->s;
    } else if (p[2].type != JV_ABSENT && p[2].type != JV_NONE)
        jrt_fail(vm->rt, "tojson: separators must be a pair of strings");
    jsb b;
    jsb_init(&b, vm->rt, vm->lim->max_output_bytes);
    jv_write_json(&b, v, indent, item_sep, key_sep, arg_bool(p[3], false), arg_bool(p[0], false));
    return jsb_value(&b);
}

static jv f_pprint(jinja_vm *vm, jv v, const jargs *a)
{
    (void)a;
    jsb b;
    jsb_init(&b, vm->rt, vm->lim->max_output_bytes);
    jv_write_repr(&b, v);
    return jsb_value(&b);
}

/* ---- tests ---- */

static bool t_defined(jinja_vm *vm, jv v, const jargs *a) { (void)vm; (void)a; return v.type != JV_UNDEF; }
static bool t_undefined(jinja_vm *vm, jv v, const jargs *a) { (void)vm; (void)a; return v.type == JV_UNDEF; }
static bool t_none(jinja_vm *vm, jv v, const jargs *a) { (void)vm; (void)a; return v.type == JV_NONE; }
static bool t_string(jinja_vm *vm, jv v, const jargs *a) { (void)vm; (void)a; return v.type == JV_STR; }
static bool t_mapping(jinja_vm *vm, jv v, const jargs *a) { (void)vm; (void)a; return v.type == JV_DICT; }
static bool t_iterable(jinja_vm *vm, jv v, const jargs *a)
{
    (void)vm; (void)a;
    return v.type == JV_STR || v.type == JV_LIST || v.type == JV_DICT || v.type == JV_UNDEF;
}
static bool t_sequence(jinja_vm *vm, jv v, const jargs *a)
{
    (void)vm; (void)a;
    if (v.type == JV_LIST)
        return v.u.list->kind == JL_PLAIN || v.u.list->kind == JL_RANGE;
    return v.type == JV_STR || v.type == JV_DICT || v.type == JV_UNDEF;
}
static bool t_number(jinja_vm *vm, jv v, const jargs *a) { (void)vm; (void)a; return jv_is_num(v) || v.type == JV_BIGINT; }
static bool t_integer(jinja_vm *vm, jv v, const jargs *a) { (void)vm; (void)a; return v.type == JV_INT || v.type == JV_BIGINT; }
static bool t_float(jinja_vm *vm, jv v, const jargs *a) { (void)vm; (void)a; return v.type == JV_FLOAT; }
static bool t_boolean(jinja_vm *vm, jv v, const jargs *a) { (void)vm; (void)a; return v.type == JV_BOOL; }
static bool t_true(jinja_vm *vm, jv v, const jargs *a) { (void)vm; (void)a; return v.type == JV_BOOL && v.u.b; }
static bool t_false(jinja_vm *vm, jv v, const jargs *a) { (void)vm; (void)a; return v.type == JV_BOOL && !v.u.b; }
/* Undefined defines __call__ (it raises), so callable() is true for it */
static bool t_callable(jinja_vm *vm, jv v, const jargs *a) { (void)vm; (void)a; return v.type == JV_FUNC || v.type == JV_UNDEF; }
static bool t_escaped(jinja_vm *vm, jv v, const jargs *a) { (void)vm; (void)a; (void)v; return false; }

static jv arg1(jinja_vm *vm, const jargs *a, const char *name)
{
    if (a->n < 1)
        jrt_fail(vm->rt, "%s() missing 1 required positional argument", name);
    return a->v[0];
}

static bool t_eq(jinja_vm *vm, jv v, const jargs *a) { return jv_eq(v, arg1(vm, a, "eq")); }
static bool t_ne(jinja_vm *vm, jv v, const jargs *a) { return !jv_eq(v, arg1(vm, a, "ne")); }

static int t_cmp(jinja_vm *vm, jv v, const jargs *a, const char *op)
{
    jv o = arg1(vm, a, op);
    if (v.type == JV_UNDEF)
        jinja_undef_fail(vm, v);
    if (o.type == JV_UNDEF)
        jinja_undef_fail(vm, o);
    bool ok;
    int c = jv_cmp(v, o, &ok);
    if (!ok)
        jrt_fail(vm->rt, "'%s' not supported between instances of '%s' and '%s'", op,
                 jv_type_name(v), jv_type_name(o));
    return c;
}
static bool t_gt(jinja_vm *vm, jv v, const jargs *a) { return t_cmp(vm, v, a, ">") > 0; }
static bool t_ge(jinja_vm *vm, jv v, const jargs *a) { return t_cmp(vm, v, a, ">=") >= 0; }
static bool t_lt(jinja_vm *vm, jv v, const jargs *a) { return t_cmp(vm, v, a, "<") < 0; }
static bool t_le(jinja_vm *vm, jv v, const jargs *a) { return t_cmp(vm, v, a, "<=") <= 0; }

static bool t_in(jinja_vm *vm, jv v, const jargs *a)
{
    jv seq = arg1(vm, a, "in");
    if (seq.type == JV_STR) {
        if (v.type != JV_STR)
            jrt_fail(vm->rt, "'in <string>' requires string as left operand, not %s", jv_type_name(v));
        return v.u.s->len == 0 || jv_memmem(seq.u.s->s, seq.u.s->len, v.u.s->s, v.u.s->len) != NULL;
    }
    if (seq.type == JV_DICT)
        return jv_dict_get(seq, v).type != JV_ABSENT;
    jv l = jinja_iterate(vm, seq);
    for (size_t i = 0; i < l.u.list->len; i++)
        if (jv_eq(l.u.list->items[i], v))
            return true;
    return false;
}

/* value % d == r with Python's modulo, for ints and floats (tests.py) */
static bool py_mod_is(jinja_vm *vm, jv v, jv d, int64_t r, const char *what)
{
    if (v.type == JV_UNDEF)
        jinja_undef_fail(vm, v);
    if (d.type == JV_UNDEF)
        jinja_undef_fail(vm, d);
    if (!jv_is_num(v) || !jv_is_num(d))
        jrt_fail(vm->rt, "%s: unsupported operand type(s) for %%: '%s' and '%s'", what,
                 jv_type_name(v), jv_type_name(d));
    jv m = jinja_percent_or_mod(vm, v, d);
    return jv_eq(m, jv_int(r));
}

static bool t_odd(jinja_vm *vm, jv v, const jargs *a) { (void)a; return py_mod_is(vm, v, jv_int(2), 1, "odd"); }
static bool t_even(jinja_vm *vm, jv v, const jargs *a) { (void)a; return py_mod_is(vm, v, jv_int(2), 0, "even"); }
static bool t_divisibleby(jinja_vm *vm, jv v, const jargs *a)
{
    return py_mod_is(vm, v, arg1(vm, a, "divisibleby"), 0, "divisibleby");
}

/* str(value).islower() / .isupper(): some cased character, none of the other case */
static bool str_case_test(jinja_vm *vm, jv v, bool lower)
{
    const jv_str *s = jv_to_str(vm->rt, v).u.s;
    bool cased = false;
    for (size_t i = 0; i < s->len;) {
        uint32_t c = jinja_utf8_next(s->s, s->len, &i);
        uint32_t up = jinja_upper(c), lo = jinja_lower(c);
        if (up == c && lo == c)
            continue;
        cased = true;
        if (lower ? lo != c : up != c)
            return false;
    }
    return cased;
}
static bool t_lower(jinja_vm *vm, jv v, const jargs *a) { (void)a; return str_case_test(vm, v, true); }
static bool t_upper(jinja_vm *vm, jv v, const jargs *a) { (void)a; return str_case_test(vm, v, false); }

static bool t_sameas(jinja_vm *vm, jv v, const jargs *a)
{
    jv o = arg1(vm, a, "sameas");
    if (v.type != o.type)
        return false;
    switch (v.type) {
    case JV_NONE: case JV_UNDEF: return true;
    case JV_BOOL: return v.u.b == o.u.b;
    case JV_INT: return v.u.i == o.u.i;
    case JV_STR: return v.u.s == o.u.s;
    case JV_LIST: return v.u.list == o.u.list;
    case JV_DICT: case JV_NS: return v.u.dict == o.u.dict;
    case JV_FUNC: return v.u.fn == o.u.fn;
    default: return false;
    }
}

static bool t_filter(jinja_vm *vm, jv v, const jargs *a) { (void)vm; (void)a; return v.type == JV_STR && jinja_find_filter(v.u.s->s); }
static bool t_test(jinja_vm *vm, jv v, const jargs *a) { (void)vm; (void)a; return v.type == JV_STR && jinja_find_test(v.u.s->s); }

/* ---- tables ---- */

static const struct {
    const char *name;
    jinja_filter_fn fn;
} filters[] = {
    {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"capitalize", f_capitalize},
    {"center", f_center}, {"count", f_length}, {"d", f_default}, {"default", f_default},
    {"dictsort", f_dictsort}, {"e", f_escape}, {"escape", f_escape}, {"first", f_first},
    {"float", f_float}, {"forceescape", f_escape}, {"format", f_format}, {"indent", f_indent},
    {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last}, {"length", f_length},
    {"list", f_list}, {"lower", f_lower}, {"map", f_map}, {"max", f_max}, {"min", f_min},
    {"pprint", f_pprint}, {"reject", f_reject}, {"rejectattr", f_rejectattr},
    {"replace", f_replace}, {"reverse", f_reverse}, {"round", f_round}, {"safe", f_safe},
    {"select", f_select}, {"selectattr", f_selectattr}, {"sort", f_sort}, {"string", f_string},
    {"sum", f_sum}, {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim},
    {"unique", f_unique}, {"upper", f_upper}, {"wordcount", f_wordcount},
};

static const struct {
    const char *name;
    jinja_test_fn fn;
} tests[] = {
    {"!=", t_ne}, {"<", t_lt}, {"<=", t_le}, {"==", t_eq}, {">", t_gt}, {">=", t_ge},
    {"boolean", t_boolean}, {"callable", t_callable}, {"defined", t_defined},
    {"divisibleby", t_divisibleby}, {"eq", t_eq}, {"equalto", t_eq}, {"escaped", t_escaped},
    {"even", t_even}, {"false", t_false}, {"filter", t_filter}, {"float", t_float},
    {"ge", t_ge}, {"greaterthan", t_gt}, {"gt", t_gt}, {"in", t_in}, {"integer", t_integer},
    {"iterable", t_iterable}, {"le", t_le}, {"lessthan", t_lt}, {"lower", t_lower},
    {"lt", t_lt}, {"mapping", t_mapping}, {"ne", t_ne}, {"none", t_none}, {"number", t_number},
    {"odd", t_odd}, {"sameas", t_sameas}, {"sequence", t_sequence}, {"string", t_string},
    {"test", t_test}, {"true", t_true}, {"undefined", t_undefined}, {"upper", t_upper},
};

jinja_filter_fn jinja_find_filter(const char *name)
{
    for (size_t i = 0; i < sizeof filters / sizeof filters[0]; i++)
        if (strcmp(filters[i].name, name) == 0)
            return filters[i].fn;
    return NULL;
}

jinja_test_fn jinja_find_test(const char *name)
{
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (strcmp(tests[i].name, name) == 0)
            return tests[i].fn;
    return NULL;
}
