/* jinja_value: the values a Jinja2 template computes with, the arena they
 * live in, and how they print (Python's str()/repr()) and serialize
 * (Python's json.dumps(ensure_ascii=False), as transformers' tojson).
 *
 * Memory: every value of a render (and every AST node of a parse) is
 * allocated from one jinja_rt arena and freed all at once by jrt_free; no
 * value owns memory of its own, so values are copied freely by struct.
 * Errors: a failing operation calls jrt_fail, which records the message
 * and longjmps to the rt's on_error (set by whoever runs the parse or the
 * render, chat_template.c); everything allocated so far stays in the arena
 * and is freed by jrt_free, so nothing leaks.
 *
 * Strings are UTF-8 byte strings; length, indexing and slicing count code
 * points as Python's str does.
 */
#ifndef PG_JINJA_VALUE_H
#define PG_JINJA_VALUE_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- runtime: arena + error exit ---- */

typedef struct jrt_chunk jrt_chunk;

typedef struct jinja_rt {
    jrt_chunk *chunks;    /* owned */
    size_t bytes;         /* allocated so far */
    size_t max_bytes;     /* jrt_alloc beyond this fails cleanly */
    jmp_buf *on_error;    /* borrowed; jrt_fail jumps here */
    char msg[512];        /* the error, once jrt_fail ran */
    int line, col;        /* where, when known (0 = unknown) */
} jinja_rt;

void jrt_init(jinja_rt *rt, size_t max_bytes);
void jrt_free(jinja_rt *rt); /* frees every allocation; rt can be reused */
/* Zeroed memory from the arena; fails (jrt_fail) past max_bytes. */
void *jrt_alloc(jinja_rt *rt, size_t n);
char *jrt_strndup(jinja_rt *rt, const char *s, size_t n);
_Noreturn void jrt_fail(jinja_rt *rt, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---- values ---- */

typedef enum jv_type {
    JV_ABSENT = 0, /* internal: "argument not given" (a zeroed jv) */
    JV_UNDEF,      /* jinja2's Undefined; u.undef is its error message */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,       /* list, or tuple when u.list->tuple */
    JV_DICT,
    JV_NS,         /* namespace(): a dict whose attributes can be set */
    JV_FUNC,       /* macro, builtin function or bound method */
    JV_BIGINT,     /* an int beyond int64 from JSON (Python has bignums): u.s
                      holds its decimal digits; it prints and serializes, and
                      compares as a float; arithmetic on it is refused */
} jv_type;

typedef struct jv_str {
    size_t len;      /* bytes, excluding the NUL */
    char s[];        /* NUL-terminated */
} jv_str;

typedef struct jv jv;
typedef struct jv_list jv_list;
typedef struct jv_dict jv_dict;
typedef struct jv_func jv_func;

struct jv {
    jv_type type;
    union {
        bool b;
        int64_t i;
        double f;
        const jv_str *s;
        jv_list *list;
        jv_dict *dict;   /* JV_DICT and JV_NS */
        jv_func *fn;
        const char *undef; /* JV_UNDEF: "'x' is undefined" and the like */
    } u;
};

/* What Python object a JV_LIST stands for. Filters that are generators in
 * jinja2 (select, map, items, ...) give JL_GEN: always true, no len(), not
 * subscriptable, printed as "<generator object ...>". dict.items() & co.
 * give JL_VIEW ("dict_items([...])"), range() gives JL_RANGE. */
enum jl_kind { JL_PLAIN = 0, JL_GEN, JL_VIEW, JL_RANGE };

struct jv_list {
    size_t len, cap;
    jv *items;
    bool tuple;
    unsigned char kind;     /* enum jl_kind */
    const char *kind_name;  /* JL_GEN / JL_VIEW: "generator object do_map", "dict_items" */
    const char *lazy_error; /* JL_GEN: the error its iteration raises (jinja2 fails late) */
    int64_t range[3];       /* JL_RANGE: start, stop, step (for printing) */
};

/* Insertion-ordered, keys compared with Python ==. */
struct jv_dict {
    size_t len, cap;
    jv *keys;
    jv *vals;
    /* from 8 entries on (jv_dict_set): open addressing over hashes
     * consistent with jv_eq, slot = entry index + 1, 0 = empty; keeps big
     * JSON objects and template-built dicts linear to fill */
    uint32_t *index;
    size_t index_cap;        /* a power of two, > 2 * len */
};

/* Arguments of a call: n values, kw[i] is the keyword of v[i] or NULL. */
typedef struct jargs {
    int n;
    jv *v;
    const char **kw;
} jargs;

struct jinja_vm;
typedef jv (*jv_native)(struct jinja_vm *vm, jv self, const jargs *a);

struct jv_func {
    const char *name;
    jv_native native;        /* builtin or bound method ... */
    jv self;                 /* ... with its receiver */
    const void *macro;       /* or a macro: its jnode (jinja_parse.h) */
    void *closure;           /* the macro's defining scope (jinja_eval.c) */
    jv caller;               /* `caller` inside a {% call %}'s macro */
    jv attrs;                /* a dict of attributes (the `loop` object), or JV_ABSENT */
};

static inline jv jv_absent(void) { jv v = {JV_ABSENT, {0}}; return v; }
static inline jv jv_none(void) { jv v = {JV_NONE, {0}}; return v; }
static inline jv jv_bool(bool b) { jv v = {JV_BOOL, {.b = b}}; return v; }
static inline jv jv_int(int64_t i) { jv v = {JV_INT, {.i = i}}; return v; }
static inline jv jv_float(double f) { jv v = {JV_FLOAT, {.f = f}}; return v; }
static inline bool jv_is_str(jv v) { return v.type == JV_STR; }
static inline bool jv_is_plain_list(jv v)
{
    return v.type == JV_LIST && v.u.list->kind == JL_PLAIN;
}
static inline bool jv_is_num(jv v)
{
    return v.type == JV_INT || v.type == JV_FLOAT || v.type == JV_BOOL;
}

jv jv_undef(jinja_rt *rt, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Undefined named `name` ("'name' is undefined"). */
jv jv_undef_name(jinja_rt *rt, const char *name);
jv jv_str_n(jinja_rt *rt, const char *s, size_t n);
jv jv_cstr(jinja_rt *rt, const char *s);
/* A string constant not in any arena (static storage). */
jv jv_str_static(const jv_str *s);
jv jv_list_new(jinja_rt *rt, size_t cap);
void jv_list_push(jinja_rt *rt, jv list, jv item);
/* Marks a fresh list as a generator / view (kind_name: static storage). */
jv jv_list_as(jv list, enum jl_kind kind, const char *kind_name);
jv jv_dict_new(jinja_rt *rt, size_t cap);
/* Sets key (replacing an equal key's value). */
void jv_dict_set(jinja_rt *rt, jv dict, jv key, jv val);
void jv_dict_set_str(jinja_rt *rt, jv dict, const char *key, jv val);
/* Value of key, or JV_ABSENT. */
jv jv_dict_get(jv dict, jv key);
jv jv_dict_get_str(jv dict, const char *key, size_t len);
jv jv_func_native(jinja_rt *rt, const char *name, jv_native fn, jv self);

/* Python truthiness (Undefined is false). */
bool jv_truthy(jv v);
/* Python ==. */
bool jv_eq(jv a, jv b);
/* Python <: sets *ok false when the types do not order (a TypeError). */
int jv_cmp(jv a, jv b, bool *ok);
/* Python type name for messages: 'str', 'int', 'NoneType', 'list', ... */
const char *jv_type_name(jv v);
/* jinja2's object_type_repr: "dict object", "None", "list object", ... */
const char *jv_object_repr(jinja_rt *rt, jv v);

/* memmem (a GNU extension, not in C11/POSIX). */
const char *jv_memmem(const char *hay, size_t n, const char *needle, size_t m);

/* UTF-8 helpers: code points in s[0, n); byte offset of code point k. */
size_t jv_utf8_count(const char *s, size_t n);
size_t jv_utf8_offset(const char *s, size_t n, size_t k);

/* ---- a growing string in the arena ---- */

typedef struct jsb {
    jinja_rt *rt;
    char *p;
    size_t len, cap;
    size_t max;      /* appending past this fails (the output limit) */
} jsb;

void jsb_init(jsb *b, jinja_rt *rt, size_t max);
void jsb_put(jsb *b, const char *s, size_t n);
/* Appends code point cp as UTF-8 (1-4 bytes). */
void jinja_utf8_put(jsb *b, uint32_t cp);
void jsb_puts(jsb *b, const char *s);
void jsb_putc(jsb *b, char c);
void jsb_printf(jsb *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
jv jsb_value(jsb *b); /* the string built so far, as a value */

/* ---- printing ---- */

/* Python str(v): what {{ v }} prints (Undefined prints nothing). */
void jv_write_str(jsb *b, jv v);
/* Python repr(v). */
void jv_write_repr(jsb *b, jv v);
/* Python repr(float) ('1.0', '1e+20', '0.0001', 'inf'). */
void jv_write_float(jsb *b, double f);
jv jv_to_str(jinja_rt *rt, jv v);

/* json.dumps(v, ensure_ascii=ensure_ascii, indent=indent, separators=seps,
 * sort_keys=sort_keys): indent NULL = one line; item_sep/key_sep NULL =
 * Python's defaults (", " or "," with indent, ": "). A value JSON cannot
 * hold fails as Python's TypeError does. */
void jv_write_json(jsb *b, jv v, const char *indent, const char *item_sep,
                   const char *key_sep, bool sort_keys, bool ensure_ascii);

#endif /* PG_JINJA_VALUE_H */
