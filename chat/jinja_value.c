/* jinja_value: arena, values, Python printing and json.dumps. See the header. */
#include "jinja_value.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena ---- */

struct jrt_chunk {
    jrt_chunk *next;
    size_t used, cap;
    max_align_t data[];
};

#define JRT_CHUNK_BYTES ((size_t)64 << 10)

void jrt_init(jinja_rt *rt, size_t max_bytes)
{
    memset(rt, 0, sizeof *rt);
    rt->max_bytes = max_bytes;
}

void jrt_free(jinja_rt *rt)
{
    jrt_chunk *c = rt->chunks;
    while (c) {
        jrt_chunk *next = c->next;
        free(c);
        c = next;
    }
    rt->chunks = NULL;
    rt->bytes = 0;
}

_Noreturn void jrt_fail(jinja_rt *rt, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rt->msg, sizeof rt->msg, fmt, ap);
    va_end(ap);
    longjmp(*rt->on_error, 1);
}

void *jrt_alloc(jinja_rt *rt, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (n == 0)
        n = sizeof(max_align_t);
    jrt_chunk *c = rt->chunks;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > JRT_CHUNK_BYTES / 2 ? n : JRT_CHUNK_BYTES;
        if (n > rt->max_bytes || rt->bytes > rt->max_bytes - n)
            jrt_fail(rt, "memory limit of %zu MiB reached", rt->max_bytes >> 20);
        jrt_chunk *nc = malloc(sizeof *nc + cap);
        if (!nc)
            jrt_fail(rt, "out of memory");
        nc->used = 0;
        nc->cap = cap;
        rt->bytes += cap;
        if (c && cap != JRT_CHUNK_BYTES) {
            /* a big block: keep the current chunk in front for small ones */
            nc->next = c->next;
            c->next = nc;
            nc->used = n;
            memset(nc->data, 0, n);
            return nc->data;
        }
        nc->next = c;
        rt->chunks = nc;
        c = nc;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

char *jrt_strndup(jinja_rt *rt, const char *s, size_t n)
{
    char *p = jrt_alloc(rt, n + 1);
    if (n)
        memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* ---- constructors ---- */

jv jv_undef(jinja_rt *rt, const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    jv v = {JV_UNDEF, {.undef = jrt_strndup(rt, buf, strlen(buf))}};
    return v;
}

jv jv_undef_name(jinja_rt *rt, const char *name)
{
    return jv_undef(rt, "'%.200s' is undefined", name);
}

jv jv_str_n(jinja_rt *rt, const char *s, size_t n)
{
    jv_str *p = jrt_alloc(rt, sizeof *p + n + 1);
    p->len = n;
    if (n)
        memcpy(p->s, s, n);
    p->s[n] = '\0';
    jv v = {JV_STR, {.s = p}};
    return v;
}

jv jv_cstr(jinja_rt *rt, const char *s) { return jv_str_n(rt, s, strlen(s)); }

jv jv_str_static(const jv_str *s)
{
    jv v = {JV_STR, {.s = s}};
    return v;
}

jv jv_list_new(jinja_rt *rt, size_t cap)
{
    jv_list *l = jrt_alloc(rt, sizeof *l);
    if (cap) {
        l->items = jrt_alloc(rt, cap * sizeof(jv));
        l->cap = cap;
    }
    jv v = {JV_LIST, {.list = l}};
    return v;
}

void jv_list_push(jinja_rt *rt, jv list, jv item)
{
    jv_list *l = list.u.list;
    if (l->len == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jv *items = jrt_alloc(rt, cap * sizeof(jv));
        if (l->len)
            memcpy(items, l->items, l->len * sizeof(jv));
        l->items = items;
        l->cap = cap;
    }
    l->items[l->len++] = item;
}

jv jv_list_as(jv list, enum jl_kind kind, const char *kind_name)
{
    list.u.list->kind = (unsigned char)kind;
    list.u.list->kind_name = kind_name;
    return list;
}

jv jv_dict_new(jinja_rt *rt, size_t cap)
{
    jv_dict *d = jrt_alloc(rt, sizeof *d);
    if (cap) {
        d->keys = jrt_alloc(rt, cap * sizeof(jv));
        d->vals = jrt_alloc(rt, cap * sizeof(jv));
        d->cap = cap;
    }
    jv v = {JV_DICT, {.dict = d}};
    return v;
}

/* A hash consistent with jv_eq: equal numbers hash alike (1 == 1.0 == True). */
static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_int(int64_t i)
{
    uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull;
    return x ^ (x >> 29);
}

static uint64_t jv_hash(jv v, int depth)
{
    switch (v.type) {
    case JV_STR: return hash_bytes(v.u.s->s, v.u.s->len);
    case JV_BIGINT: return hash_bytes(v.u.s->s, v.u.s->len) ^ 0x5bd1e995u;
    case JV_INT: return hash_int(v.u.i);
    case JV_BOOL: return hash_int(v.u.b);
    case JV_FLOAT:
        if (v.u.f == floor(v.u.f) && fabs(v.u.f) < 9.2e18)
            return hash_int((int64_t)v.u.f);
        {
            uint64_t bits;
            memcpy(&bits, &v.u.f, sizeof bits);
            return hash_int((int64_t)bits);
        }
    case JV_NONE: return 0x2545F4914F6CDD1Dull;
    case JV_LIST: {
        uint64_t h = 0x84222325u;
        if (depth > 8)
            return h;
        for (size_t i = 0; i < v.u.list->len && i < 64; i++)
            h = (h ^ jv_hash(v.u.list->items[i], depth + 1)) * 1099511628211ull;
        return h;
    }
    default: return 0; /* unhashable in Python; never equal across types anyway */
    }
}

static void index_insert(jv_dict *d, size_t entry)
{
    size_t mask = d->index_cap - 1;
    size_t slot = (size_t)jv_hash(d->keys[entry], 0) & mask;
    while (d->index[slot])
        slot = (slot + 1) & mask;
    d->index[slot] = (uint32_t)(entry + 1);
}

static void index_build(jinja_rt *rt, jv_dict *d, size_t want)
{
    size_t cap = 16;
    while (cap < want * 2 + 2)
        cap *= 2;
    d->index = jrt_alloc(rt, cap * sizeof *d->index);
    d->index_cap = cap;
    for (size_t i = 0; i < d->len; i++)
        index_insert(d, i);
}

static size_t dict_find(const jv_dict *d, jv key)
{
    if (d->index && d->index_cap) {
        size_t mask = d->index_cap - 1;
        for (size_t slot = (size_t)jv_hash(key, 0) & mask;; slot = (slot + 1) & mask) {
            uint32_t e = d->index[slot];
            if (!e)
                return (size_t)-1;
            if (jv_eq(d->keys[e - 1], key))
                return e - 1;
        }
    }
    for (size_t i = 0; i < d->len; i++)
        if (jv_eq(d->keys[i], key))
            return i;
    return (size_t)-1;
}

void jv_dict_set(jinja_rt *rt, jv dict, jv key, jv val)
{
    jv_dict *d = dict.u.dict;
    size_t i = dict_find(d, key);
    if (i != (size_t)-1) {
        d->vals[i] = val;
        return;
    }
    if (d->len == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        jv *k = jrt_alloc(rt, cap * sizeof(jv));
        jv *v = jrt_alloc(rt, cap * sizeof(jv));
        if (d->len) {
            memcpy(k, d->keys, d->len * sizeof(jv));
            memcpy(v, d->vals, d->len * sizeof(jv));
        }
        d->keys = k;
        d->vals = v;
        d->cap = cap;
    }
    if (d->len >= UINT32_MAX - 1)
        jrt_fail(rt, "dict too large");
    d->keys[d->len] = key;
    d->vals[d->len] = val;
    d->len++;
    if (d->index && d->len * 2 + 2 <= d->index_cap)
        index_insert(d, d->len - 1);
    else if (d->len >= 8)
        index_build(rt, d, d->len * 2);
}

void jv_dict_set_str(jinja_rt *rt, jv dict, const char *key, jv val)
{
    jv_dict_set(rt, dict, jv_cstr(rt, key), val);
}

jv jv_dict_get(jv dict, jv key)
{
    size_t i = dict_find(dict.u.dict, key);
    return i == (size_t)-1 ? jv_absent() : dict.u.dict->vals[i];
}

jv jv_dict_get_str(jv dict, const char *key, size_t len)
{
    const jv_dict *d = dict.u.dict;
    if (d->index && d->index_cap) {
        size_t mask = d->index_cap - 1;
        for (size_t slot = (size_t)hash_bytes(key, len) & mask;; slot = (slot + 1) & mask) {
            uint32_t e = d->index[slot];
            if (!e)
                return jv_absent();
            jv k = d->keys[e - 1];
            if (k.type == JV_STR && k.u.s->len == len && memcmp(k.u.s->s, key, len) == 0)
                return d->vals[e - 1];
        }
    }
    for (size_t i = 0; i < d->len; i++) {
        jv k = d->keys[i];
        if (k.type == JV_STR && k.u.s->len == len && memcmp(k.u.s->s, key, len) == 0)
            return d->vals[i];
    }
    return jv_absent();
}

jv jv_func_native(jinja_rt *rt, const char *name, jv_native fn, jv self)
{
    jv_func *f = jrt_alloc(rt, sizeof *f);
    f->name = name;
    f->native = fn;
    f->self = self;
    jv v = {JV_FUNC, {.fn = f}};
    return v;
}

/* ---- semantics ---- */

bool jv_truthy(jv v)
{
    switch (v.type) {
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STR: return v.u.s->len != 0;
    case JV_LIST: return v.u.list->kind == JL_GEN || v.u.list->len != 0;
    case JV_DICT: return v.u.dict->len != 0;
    case JV_NS: case JV_FUNC: case JV_BIGINT: return true;
    default: return false;
    }
}

static double num_f(jv v)
{
    return v.type == JV_FLOAT ? v.u.f : v.type == JV_INT ? (double)v.u.i : (double)v.u.b;
}

static int64_t num_i(jv v) { return v.type == JV_INT ? v.u.i : (int64_t)v.u.b; }

static double bigint_f(jv v) { return strtod(v.u.s->s, NULL); }

/* Nested containers deeper than this compare unequal and refuse to print
 * (CPython raises RecursionError near 1000 too); it keeps the C stack safe
 * from values a template nests in a loop. */
#define JV_MAX_NESTING 1000

static bool eq_depth(jv a, jv b, int depth);

bool jv_eq(jv a, jv b) { return eq_depth(a, b, 0); }

static bool eq_depth(jv a, jv b, int depth)
{
    if (depth > JV_MAX_NESTING)
        return false;
    if (a.type == JV_BIGINT || b.type == JV_BIGINT) {
        if (a.type == JV_BIGINT && b.type == JV_BIGINT)
            return a.u.s->len == b.u.s->len && memcmp(a.u.s->s, b.u.s->s, a.u.s->len) == 0;
        return false; /* never equal to an int64 or (exactly) to a float here */
    }
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.type == JV_FLOAT || b.type == JV_FLOAT)
            return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a.type != b.type)
        return false;
    switch (a.type) {
    case JV_ABSENT: case JV_UNDEF: case JV_NONE: return true;
    case JV_STR:
        return a.u.s->len == b.u.s->len && memcmp(a.u.s->s, b.u.s->s, a.u.s->len) == 0;
    case JV_LIST: {
        const jv_list *x = a.u.list, *y = b.u.list;
        if (x->kind == JL_GEN || y->kind == JL_GEN)
            return x == y;
        if (x->tuple != y->tuple || x->kind != y->kind || x->len != y->len)
            return false;
        for (size_t i = 0; i < x->len; i++)
            if (!eq_depth(x->items[i], y->items[i], depth + 1))
                return false;
        return true;
    }
    case JV_DICT: {
        const jv_dict *x = a.u.dict, *y = b.u.dict;
        if (x->len != y->len)
            return false;
        for (size_t i = 0; i < x->len; i++) {
            jv o = jv_dict_get(b, x->keys[i]);
            if (o.type == JV_ABSENT || !eq_depth(x->vals[i], o, depth + 1))
                return false;
        }
        return true;
    }
    case JV_NS: return a.u.dict == b.u.dict;
    case JV_FUNC: return a.u.fn == b.u.fn;
    default: return false;
    }
}

static int cmp_depth(jv a, jv b, bool *ok, int depth);

int jv_cmp(jv a, jv b, bool *ok) { return cmp_depth(a, b, ok, 0); }

static int cmp_depth(jv a, jv b, bool *ok, int depth)
{
    *ok = depth <= JV_MAX_NESTING;
    if (!*ok)
        return 0;
    if ((a.type == JV_BIGINT || jv_is_num(a)) && (b.type == JV_BIGINT || jv_is_num(b)) &&
        (a.type == JV_BIGINT || b.type == JV_BIGINT)) {
        double x = a.type == JV_BIGINT ? bigint_f(a) : num_f(a);
        double y = b.type == JV_BIGINT ? bigint_f(b) : num_f(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.type == JV_FLOAT || b.type == JV_FLOAT) {
            double x = num_f(a), y = num_f(b);
            return x < y ? -1 : x > y ? 1 : 0;
        }
        int64_t x = num_i(a), y = num_i(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.type == JV_STR && b.type == JV_STR) {
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int c = memcmp(a.u.s->s, b.u.s->s, n);
        if (c)
            return c < 0 ? -1 : 1;
        return a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len ? 1 : 0;
    }
    if (jv_is_plain_list(a) && jv_is_plain_list(b) && a.u.list->tuple == b.u.list->tuple) {
        const jv_list *x = a.u.list, *y = b.u.list;
        for (size_t i = 0; i < x->len && i < y->len; i++) {
            if (jv_eq(x->items[i], y->items[i]))
                continue;
            return cmp_depth(x->items[i], y->items[i], ok, depth + 1);
        }
        return x->len < y->len ? -1 : x->len > y->len ? 1 : 0;
    }
    *ok = false;
    return 0;
}

const char *jv_type_name(jv v)
{
    switch (v.type) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: case JV_BIGINT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST:
        switch (v.u.list->kind) {
        case JL_GEN: return strncmp(v.u.list->kind_name, "generator", 9) == 0 ? "generator" : "list_reverseiterator";
        case JL_VIEW: return v.u.list->kind_name;
        case JL_RANGE: return "range";
        default: return v.u.list->tuple ? "tuple" : "list";
        }
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_FUNC: return v.u.fn->macro ? "Macro" : "builtin_function_or_method";
    default: return "object";
    }
}

const char *jv_object_repr(jinja_rt *rt, jv v)
{
    if (v.type == JV_NONE)
        return "None";
    const char *t = jv_type_name(v);
    size_t n = strlen(t);
    char *p = jrt_alloc(rt, n + 8);
    memcpy(p, t, n);
    memcpy(p + n, " object", 8);
    return p;
}

/* ---- UTF-8 ---- */

const char *jv_memmem(const char *hay, size_t n, const char *needle, size_t m)
{
    if (m == 0)
        return hay;
    if (m > n)
        return NULL;
    const char *end = hay + (n - m);
    for (const char *p = hay; p <= end;) {
        p = memchr(p, needle[0], (size_t)(end - p) + 1);
        if (!p)
            return NULL;
        if (memcmp(p, needle, m) == 0)
            return p;
        p++;
    }
    return NULL;
}

size_t jv_utf8_count(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

size_t jv_utf8_offset(const char *s, size_t n, size_t k)
{
    size_t i = 0;
    while (i < n && k > 0) {
        i++;
        while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80)
            i++;
        k--;
    }
    return i;
}

/* ---- string builder ---- */

void jsb_init(jsb *b, jinja_rt *rt, size_t max)
{
    b->rt = rt;
    b->p = NULL;
    b->len = b->cap = 0;
    b->max = max;
}

void jsb_put(jsb *b, const char *s, size_t n)
{
    if (n == 0)
        return;
    if (n > b->max || b->len > b->max - n)
        jrt_fail(b->rt, "output limit of %zu bytes reached", b->max);
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = jrt_alloc(b->rt, cap);
        if (b->len)
            memcpy(p, b->p, b->len);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void jsb_puts(jsb *b, const char *s) { jsb_put(b, s, strlen(s)); }
void jsb_putc(jsb *b, char c) { jsb_put(b, &c, 1); }

void jinja_utf8_put(jsb *b, uint32_t cp)
{
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    jsb_put(b, u, n);
}

void jsb_printf(jsb *b, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    jsb_put(b, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

jv jsb_value(jsb *b) { return jv_str_n(b->rt, b->p ? b->p : "", b->len); }

/* ---- printing ---- */

void jv_write_float(jsb *b, double f)
{
    if (isnan(f)) {
        jsb_puts(b, "nan");
        return;
    }
    if (isinf(f)) {
        jsb_puts(b, f < 0 ? "-inf" : "inf");
        return;
    }
    /* the shortest digits that round-trip, as Python's repr (David Gay's
     * "shortest" mode), then Python's layout: exponent when exp < -4 or
     * exp >= 16 */
    char buf[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f)
            break;
    }
    char digits[24];
    int nd = 0;
    const char *p = buf;
    bool neg = false;
    if (*p == '-') {
        neg = true;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    if (neg)
        jsb_putc(b, '-');
    if (exp10 < -4 || exp10 >= 16) {
        jsb_putc(b, digits[0]);
        if (nd > 1) {
            jsb_putc(b, '.');
            jsb_put(b, digits + 1, (size_t)nd - 1);
        }
        jsb_printf(b, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    } else if (exp10 >= 0) {
        for (int i = 0; i <= exp10; i++)
            jsb_putc(b, i < nd ? digits[i] : '0');
        jsb_putc(b, '.');
        if (nd > exp10 + 1)
            jsb_put(b, digits + exp10 + 1, (size_t)(nd - exp10 - 1));
        else
            jsb_putc(b, '0');
    } else {
        jsb_puts(b, "0.");
        for (int i = 0; i < -exp10 - 1; i++)
            jsb_putc(b, '0');
        jsb_put(b, digits, (size_t)nd);
    }
}

static void write_str_repr(jsb *b, const char *s, size_t n)
{
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jsb_putc(b, q);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\')
            jsb_puts(b, "\\\\");
        else if (c == (unsigned char)q) {
            jsb_putc(b, '\\');
            jsb_putc(b, (char)c);
        } else if (c == '\n')
            jsb_puts(b, "\\n");
        else if (c == '\r')
            jsb_puts(b, "\\r");
        else if (c == '\t')
            jsb_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f)
            jsb_printf(b, "\\x%02x", c);
        else if (c == 0xC2 && i + 1 < n && (unsigned char)s[i + 1] >= 0x80 &&
                 (unsigned char)s[i + 1] <= 0xA0) {
            /* C1 controls and NBSP are not printable for Python */
            jsb_printf(b, "\\x%02x", (unsigned char)s[i + 1]);
            i++;
        } else
            jsb_putc(b, (char)c);
    }
    jsb_putc(b, q);
}

static void repr_depth(jsb *b, jv v, int depth);

static void write_seq(jsb *b, jv v, int depth)
{
    const jv_list *l = v.u.list;
    if (l->kind == JL_GEN) { /* CPython prints an address here */
        jsb_printf(b, "<%s at 0x7f0000000000>", l->kind_name);
        return;
    }
    if (l->kind == JL_RANGE) {
        if (l->range[2] == 1)
            jsb_printf(b, "range(%lld, %lld)", (long long)l->range[0], (long long)l->range[1]);
        else
            jsb_printf(b, "range(%lld, %lld, %lld)", (long long)l->range[0], (long long)l->range[1],
                       (long long)l->range[2]);
        return;
    }
    if (l->kind == JL_VIEW) {
        jv plain = v;
        jv_list copy = *l;
        copy.kind = JL_PLAIN;
        plain.u.list = &copy;
        jsb_printf(b, "%s(", l->kind_name);
        write_seq(b, plain, depth);
        jsb_putc(b, ')');
        return;
    }
    jsb_putc(b, l->tuple ? '(' : '[');
    for (size_t i = 0; i < l->len; i++) {
        if (i)
            jsb_puts(b, ", ");
        repr_depth(b, l->items[i], depth + 1);
    }
    if (l->tuple && l->len == 1)
        jsb_putc(b, ',');
    jsb_putc(b, l->tuple ? ')' : ']');
}

static void write_dict(jsb *b, const jv_dict *d, int depth)
{
    jsb_putc(b, '{');
    for (size_t i = 0; i < d->len; i++) {
        if (i)
            jsb_puts(b, ", ");
        repr_depth(b, d->keys[i], depth + 1);
        jsb_puts(b, ": ");
        repr_depth(b, d->vals[i], depth + 1);
    }
    jsb_putc(b, '}');
}

void jv_write_str(jsb *b, jv v)
{
    switch (v.type) {
    case JV_ABSENT: case JV_UNDEF: return;
    case JV_STR: jsb_put(b, v.u.s->s, v.u.s->len); return;
    default: jv_write_repr(b, v); return;
    }
}

void jv_write_repr(jsb *b, jv v) { repr_depth(b, v, 0); }

static void repr_depth(jsb *b, jv v, int depth)
{
    if (depth > JV_MAX_NESTING)
        jrt_fail(b->rt, "maximum recursion depth exceeded while getting the repr of an object");
    switch (v.type) {
    case JV_ABSENT: case JV_UNDEF: jsb_puts(b, "Undefined"); return;
    case JV_NONE: jsb_puts(b, "None"); return;
    case JV_BOOL: jsb_puts(b, v.u.b ? "True" : "False"); return;
    case JV_INT: jsb_printf(b, "%lld", (long long)v.u.i); return;
    case JV_BIGINT: jsb_put(b, v.u.s->s, v.u.s->len); return;
    case JV_FLOAT: jv_write_float(b, v.u.f); return;
    case JV_STR: write_str_repr(b, v.u.s->s, v.u.s->len); return;
    case JV_LIST: write_seq(b, v, depth); return;
    case JV_DICT: write_dict(b, v.u.dict, depth); return;
    case JV_NS:
        jsb_puts(b, "<Namespace ");
        write_dict(b, v.u.dict, depth);
        jsb_putc(b, '>');
        return;
    case JV_FUNC:
        if (v.u.fn->macro)
            jsb_printf(b, "<Macro '%s'>", v.u.fn->name);
        else
            jsb_printf(b, "<built-in method %s>", v.u.fn->name);
        return;
    }
}

jv jv_to_str(jinja_rt *rt, jv v)
{
    if (v.type == JV_STR)
        return v;
    jsb b;
    jsb_init(&b, rt, rt->max_bytes);
    jv_write_str(&b, v);
    return jsb_value(&b);
}

/* ---- json.dumps ---- */

static void json_string(jsb *b, const char *s, size_t n, bool ascii)
{
    jsb_putc(b, '"');
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char ubuf[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(ubuf, sizeof ubuf, "\\u%04x", c);
                esc = ubuf;
            } else if (c >= 0x80 && ascii) {
                /* ensure_ascii: \uXXXX, astral code points as surrogate pairs */
                size_t k = i;
                uint32_t cp = c;
                int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
                if (extra && i + (size_t)extra < n) {
                    cp = c & (0x3Fu >> extra);
                    for (int j = 1; j <= extra; j++)
                        cp = (cp << 6) | ((unsigned char)s[k + (size_t)j] & 0x3F);
                    i += (size_t)extra;
                } else
                    cp = 0xFFFD;
                jsb_put(b, s + k - run, run);
                run = 0;
                if (cp >= 0x10000) {
                    cp -= 0x10000;
                    jsb_printf(b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
                } else
                    jsb_printf(b, "\\u%04x", cp);
                continue;
            }
        }
        if (esc) {
            jsb_put(b, s + i - run, run);
            run = 0;
            jsb_puts(b, esc);
        } else
            run++;
    }
    jsb_put(b, s + n - run, run);
    jsb_putc(b, '"');
}

typedef struct json_opts {
    const char *indent, *item_sep, *key_sep;
    bool sort_keys, ensure_ascii;
    int depth;
} json_opts;

static void json_newline(jsb *b, const json_opts *o, int level)
{
    jsb_putc(b, '\n');
    for (int i = 0; i < level; i++)
        jsb_puts(b, o->indent);
}

static void json_value(jsb *b, jv v, const json_opts *o, int level);

static void json_key(jsb *b, jv k, bool ascii)
{
    /* json.dumps turns str/int/float/bool/None keys into strings */
    switch (k.type) {
    case JV_STR: json_string(b, k.u.s->s, k.u.s->len, ascii); return;
    case JV_NONE: jsb_puts(b, "\"null\""); return;
    case JV_BOOL: jsb_puts(b, k.u.b ? "\"true\"" : "\"false\""); return;
    case JV_INT: jsb_printf(b, "\"%lld\"", (long long)k.u.i); return;
    case JV_BIGINT:
        jsb_putc(b, '"');
        jsb_put(b, k.u.s->s, k.u.s->len);
        jsb_putc(b, '"');
        return;
    case JV_FLOAT:
        jsb_putc(b, '"');
        jv_write_float(b, k.u.f);
        jsb_putc(b, '"');
        return;
    default:
        jrt_fail(b->rt, "keys must be str, int, float, bool or None, not %s", jv_type_name(k));
    }
}

static int key_cmp_str(jv a, jv b)
{
    bool ok;
    return jv_cmp(a, b, &ok);
}

static void json_value(jsb *b, jv v, const json_opts *o, int level)
{
    if (level > 200)
        jrt_fail(b->rt, "tojson: nesting too deep");
    switch (v.type) {
    case JV_NONE: jsb_puts(b, "null"); return;
    case JV_BOOL: jsb_puts(b, v.u.b ? "true" : "false"); return;
    case JV_INT: jsb_printf(b, "%lld", (long long)v.u.i); return;
    case JV_BIGINT: jsb_put(b, v.u.s->s, v.u.s->len); return;
    case JV_FLOAT:
        if (isnan(v.u.f))
            jsb_puts(b, "NaN");
        else if (isinf(v.u.f))
            jsb_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else
            jv_write_float(b, v.u.f);
        return;
    case JV_STR: json_string(b, v.u.s->s, v.u.s->len, o->ensure_ascii); return;
    case JV_LIST: {
        const jv_list *l = v.u.list;
        if (l->kind != JL_PLAIN)
            jrt_fail(b->rt, "Object of type %s is not JSON serializable", jv_type_name(v));
        if (l->len == 0) {
            jsb_puts(b, "[]");
            return;
        }
        jsb_putc(b, '[');
        for (size_t i = 0; i < l->len; i++) {
            if (i)
                jsb_puts(b, o->item_sep);
            if (o->indent)
                json_newline(b, o, level + 1);
            json_value(b, l->items[i], o, level + 1);
        }
        if (o->indent)
            json_newline(b, o, level);
        jsb_putc(b, ']');
        return;
    }
    case JV_DICT: {
        const jv_dict *d = v.u.dict;
        if (d->len == 0) {
            jsb_puts(b, "{}");
            return;
        }
        size_t *order = jrt_alloc(b->rt, d->len * sizeof *order);
        for (size_t i = 0; i < d->len; i++)
            order[i] = i;
        if (o->sort_keys) {
            for (size_t i = 0; i < d->len; i++) {
                bool ok;
                if (d->keys[i].type != JV_STR)
                    jv_cmp(d->keys[i], d->keys[0], &ok);
                else
                    ok = d->keys[0].type == JV_STR;
                if (!ok)
                    jrt_fail(b->rt, "'<' not supported between instances of '%s' and '%s'",
                             jv_type_name(d->keys[i]), jv_type_name(d->keys[0]));
            }
            for (size_t i = 1; i < d->len; i++) /* insertion sort: stable */
                for (size_t j = i; j > 0 && key_cmp_str(d->keys[order[j]], d->keys[order[j - 1]]) < 0; j--) {
                    size_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
        }
        jsb_putc(b, '{');
        for (size_t i = 0; i < d->len; i++) {
            if (i)
                jsb_puts(b, o->item_sep);
            if (o->indent)
                json_newline(b, o, level + 1);
            json_key(b, d->keys[order[i]], o->ensure_ascii);
            jsb_puts(b, o->key_sep);
            json_value(b, d->vals[order[i]], o, level + 1);
        }
        if (o->indent)
            json_newline(b, o, level);
        jsb_putc(b, '}');
        return;
    }
    default:
        jrt_fail(b->rt, "Object of type %s is not JSON serializable", jv_type_name(v));
    }
}

void jv_write_json(jsb *b, jv v, const char *indent, const char *item_sep,
                   const char *key_sep, bool sort_keys, bool ensure_ascii)
{
    json_opts o = {indent, item_sep, key_sep, sort_keys, ensure_ascii, 0};
    if (!o.item_sep)
        o.item_sep = indent ? "," : ", ";
    if (!o.key_sep)
        o.key_sep = ": ";
    json_value(b, v, &o, 0);
}
