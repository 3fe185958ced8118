/* jinja_builtins: see the header. Method semantics are CPython's (str,
 * list, dict); mutating methods are refused as jinja2's
 * ImmutableSandboxedEnvironment refuses them ("access to attribute
 * 'append' of 'list' object is unsafe."). */
#include "jinja_builtins.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- UTF-8 and character classes ---- */

uint32_t jinja_utf8_next(const char *s, size_t n, size_t *i)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t k = *i;
    uint32_t c = u[k];
    size_t extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    if (extra == 0 || k + extra >= n) {
        *i = k + 1; /* ASCII, or a truncated sequence: one byte */
        return c;
    }
    c &= 0x3Fu >> extra;
    for (size_t j = 1; j <= extra; j++)
        c = (c << 6) | (u[k + j] & 0x3F);
    *i = k + 1 + extra;
    return c;
}

bool jinja_is_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == ' ' || (c >= 0x1C && c <= 0x1F) || c == 0x85 ||
           c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

uint32_t jinja_upper(uint32_t c)
{
    if (c >= 'a' && c <= 'z') return c - 32;
    if (c < 0x80) return c;
    if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
    if (c == 0xFF) return 0x178;
    if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17F) {
        bool odd_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
        if (odd_lower ? (c & 1) == 0 : (c & 1) == 1) return c - 1;
        return c;
    }
    if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
    if (c == 0x3C2) return 0x3A3;
    if (c >= 0x430 && c <= 0x44F) return c - 32;
    if (c >= 0x450 && c <= 0x45F) return c - 80;
    return c;
}

uint32_t jinja_lower(uint32_t c)
{
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c < 0x80) return c;
    if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
    if (c == 0x178) return 0xFF;
    if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17F) {
        bool odd_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
        if (odd_lower ? (c & 1) == 1 : (c & 1) == 0) return c + 1;
        return c;
    }
    if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    return c;
}

static bool is_cased(uint32_t c) { return jinja_upper(c) != c || jinja_lower(c) != c; }

/* ---- string helpers ---- */

static const jv_str *want_str(jinja_vm *vm, jv v, const char *what)
{
    if (v.type == JV_STR)
        return v.u.s;
    if (v.type == JV_UNDEF)
        jinja_undef_fail(vm, v);
    jrt_fail(vm->rt, "%s must be str, not %s", what, jv_type_name(v));
}

static bool in_chars(const jv_str *chars, uint32_t c)
{
    for (size_t i = 0; i < chars->len;)
        if (jinja_utf8_next(chars->s, chars->len, &i) == c)
            return true;
    return false;
}

jv jinja_str_strip(jinja_vm *vm, jv sv, jv chars, char which)
{
    const jv_str *s = sv.u.s;
    const jv_str *cs = NULL;
    if (chars.type != JV_ABSENT && chars.type != JV_NONE)
        cs = want_str(vm, chars, "strip arg");
    size_t a = 0, e = s->len;
    if (which != 'r')
        while (a < e) {
            size_t k = a;
            uint32_t c = jinja_utf8_next(s->s, e, &k);
            if (cs ? !in_chars(cs, c) : !jinja_is_space(c))
                break;
            a = k;
        }
    if (which != 'l')
        while (e > a) {
            size_t k = e - 1;
            while (k > a && ((unsigned char)s->s[k] & 0xC0) == 0x80)
                k--;
            size_t k2 = k;
            uint32_t c = jinja_utf8_next(s->s, e, &k2);
            if (cs ? !in_chars(cs, c) : !jinja_is_space(c))
                break;
            e = k;
        }
    if (a == 0 && e == s->len)
        return sv;
    return jv_str_n(vm->rt, s->s + a, e - a);
}

jv jinja_str_case(jinja_vm *vm, jv sv, char how)
{
    const jv_str *s = sv.u.s;
    jsb b;
    jsb_init(&b, vm->rt, vm->lim->max_output_bytes);
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < s->len;) {
        uint32_t c = jinja_utf8_next(s->s, s->len, &i);
        uint32_t o;
        if (c == 0xDF && (how == 'u' || (how == 'c' && first) || (how == 't' && !prev_cased))) {
            jsb_puts(&b, how == 'u' ? "SS" : "Ss"); /* Python: 'ß'.upper() == 'SS' */
            prev_cased = true;
            first = false;
            continue;
        }
        switch (how) {
        case 'u': o = jinja_upper(c); break;
        case 'l': o = jinja_lower(c); break;
        case 'c': o = first ? jinja_upper(c) : jinja_lower(c); break;
        default: /* str.title: upper after an uncased character */
            o = prev_cased ? jinja_lower(c) : jinja_upper(c);
            prev_cased = is_cased(c);
            break;
        }
        first = false;
        jinja_utf8_put(&b, o);
    }
    return jsb_value(&b);
}

jv jinja_str_replace(jinja_vm *vm, jv sv, jv oldv, jv repv, int64_t count)
{
    const jv_str *s = sv.u.s;
    const jv_str *old = want_str(vm, oldv, "replace() argument 1");
    const jv_str *rep = want_str(vm, repv, "replace() argument 2");
    jsb b;
    jsb_init(&b, vm->rt, vm->lim->max_output_bytes);
    if (old->len == 0) {
        /* Python inserts rep between every character and at both ends */
        int64_t done = 0;
        size_t i = 0;
        for (;;) {
            if (count < 0 || done < count) {
                jsb_put(&b, rep->s, rep->len);
                done++;
            }
            if (i >= s->len)
                break;
            size_t k = i;
            jinja_utf8_next(s->s, s->len, &k);
            jsb_put(&b, s->s + i, k - i);
            i = k;
            jinja_step(vm);
        }
        return jsb_value(&b);
    }
    size_t i = 0;
    int64_t done = 0;
    while (i <= s->len) {
        const char *hit = (count < 0 || done < count)
                              ? jv_memmem(s->s + i, s->len - i, old->s, old->len) : NULL;
        if (!hit) {
            jsb_put(&b, s->s + i, s->len - i);
            break;
        }
        size_t h = (size_t)(hit - s->s);
        jsb_put(&b, s->s + i, h - i);
        jsb_put(&b, rep->s, rep->len);
        i = h + old->len;
        done++;
        jinja_step(vm);
    }
    return jsb_value(&b);
}

/* ---- str methods ---- */

#define ARGS(name, ...)                                                        \
    static const char *const params[] = {__VA_ARGS__};                         \
    jv p[sizeof params / sizeof params[0]];                                    \
    jargs_bind(vm, a, name, params, (int)(sizeof params / sizeof params[0]), p)

static jv m_strip(jinja_vm *vm, jv self, const jargs *a) { ARGS("strip", "chars"); return jinja_str_strip(vm, self, p[0], 'b'); }
static jv m_lstrip(jinja_vm *vm, jv self, const jargs *a) { ARGS("lstrip", "chars"); return jinja_str_strip(vm, self, p[0], 'l'); }
static jv m_rstrip(jinja_vm *vm, jv self, const jargs *a) { ARGS("rstrip", "chars"); return jinja_str_strip(vm, self, p[0], 'r'); }
static jv m_upper(jinja_vm *vm, jv self, const jargs *a) { ARGS("upper", "x"); (void)p; return jinja_str_case(vm, self, 'u'); }
static jv m_lower(jinja_vm *vm, jv self, const jargs *a) { ARGS("lower", "x"); (void)p; return jinja_str_case(vm, self, 'l'); }
static jv m_title(jinja_vm *vm, jv self, const jargs *a) { ARGS("title", "x"); (void)p; return jinja_str_case(vm, self, 't'); }
static jv m_capitalize(jinja_vm *vm, jv self, const jargs *a) { ARGS("capitalize", "x"); (void)p; return jinja_str_case(vm, self, 'c'); }

static int64_t opt_int(jinja_vm *vm, jv v, int64_t dflt)
{
    if (v.type == JV_ABSENT || v.type == JV_NONE)
        return dflt;
    if (v.type == JV_INT)
        return v.u.i;
    if (v.type == JV_BOOL)
        return v.u.b;
    if (v.type == JV_UNDEF)
        jinja_undef_fail(vm, v);
    jrt_fail(vm->rt, "'%s' object cannot be interpreted as an integer", jv_type_name(v));
}

static jv m_replace(jinja_vm *vm, jv self, const jargs *a)
{
    ARGS("replace", "old", "new", "count");
    return jinja_str_replace(vm, self, p[0], p[1], opt_int(vm, p[2], -1));
}

/* code point range [start, end) of a str method's optional start/end */
static void cp_range(jinja_vm *vm, const jv_str *s, jv vs, jv ve, size_t *bs, size_t *be, int64_t *cs)
{
    int64_t n = (int64_t)jv_utf8_count(s->s, s->len);
    int64_t st = opt_int(vm, vs, 0), en = opt_int(vm, ve, n);
    if (st < 0) st = st + n < 0 ? 0 : st + n;
    if (en < 0) en = en + n < 0 ? 0 : en + n;
    if (st > n) st = n;
    if (en > n) en = n;
    if (en < st) en = st;
    *bs = jv_utf8_offset(s->s, s->len, (size_t)st);
    *be = *bs + jv_utf8_offset(s->s + *bs, s->len - *bs, (size_t)(en - st));
    *cs = st;
}

static bool affix_match(jinja_vm *vm, const jv_str *s, size_t bs, size_t be, jv pre, bool end)
{
    if (pre.type == JV_LIST && pre.u.list->tuple) {
        for (size_t i = 0; i < pre.u.list->len; i++)
            if (affix_match(vm, s, bs, be, pre.u.list->items[i], end))
                return true;
        return false;
    }
    if (pre.type != JV_STR) {
        if (pre.type == JV_UNDEF)
            jinja_undef_fail(vm, pre);
        jrt_fail(vm->rt, "%s first arg must be str or a tuple of str, not %s",
                 end ? "endswith" : "startswith", jv_type_name(pre));
    }
    const jv_str *x = pre.u.s;
    if (x->len > be - bs)
        return false;
    return memcmp(end ? s->s + be - x->len : s->s + bs, x->s, x->len) == 0;
}

static jv m_startswith(jinja_vm *vm, jv self, const jargs *a)
{
    ARGS("startswith", "prefix", "start", "end");
    size_t bs, be;
    int64_t cs;
    cp_range(vm, self.u.s, p[1], p[2], &bs, &be, &cs);
    return jv_bool(affix_match(vm, self.u.s, bs, be, p[0], false));
}

static jv m_endswith(jinja_vm *vm, jv self, const jargs *a)
{
    ARGS("endswith", "suffix", "start", "end");
    size_t bs, be;
    int64_t cs;
    cp_range(vm, self.u.s, p[1], p[2], &bs, &be, &cs);
    return jv_bool(affix_match(vm, self.u.s, bs, be, p[0], true));
}

static jv find_impl(jinja_vm *vm, jv self, const jargs *a, const char *name, bool rev, bool count)
{
    ARGS(name, "sub", "start", "end");
    const jv_str *s = self.u.s, *sub = want_str(vm, p[0], "substring");
    size_t bs, be;
    int64_t cs;
    cp_range(vm, s, p[1], p[2], &bs, &be, &cs);
    if (count) {
        if (sub->len == 0)
            return jv_int((int64_t)jv_utf8_count(s->s + bs, be - bs) + 1);
        int64_t c = 0;
        for (size_t i = bs; i + sub->len <= be;) {
            const char *h = jv_memmem(s->s + i, be - i, sub->s, sub->len);
            if (!h)
                break;
            c++;
            i = (size_t)(h - s->s) + sub->len;
        }
        return jv_int(c);
    }
    if (sub->len > be - bs)
        return jv_int(-1);
    size_t hit = (size_t)-1;
    if (!rev) {
        const char *h = jv_memmem(s->s + bs, be - bs, sub->s, sub->len);
        if (h)
            hit = (size_t)(h - s->s);
    } else {
        for (size_t i = be - sub->len + 1; i-- > bs;)
            if (memcmp(s->s + i, sub->s, sub->len) == 0) {
                hit = i;
                break;
            }
    }
    if (hit == (size_t)-1)
        return jv_int(-1);
    return jv_int((int64_t)jv_utf8_count(s->s, hit));
}

static jv m_find(jinja_vm *vm, jv self, const jargs *a) { return find_impl(vm, self, a, "find", false, false); }
static jv m_rfind(jinja_vm *vm, jv self, const jargs *a) { return find_impl(vm, self, a, "rfind", true, false); }
static jv m_count(jinja_vm *vm, jv self, const jargs *a) { return find_impl(vm, self, a, "count", false, true); }
static jv m_index(jinja_vm *vm, jv self, const jargs *a)
{
    jv r = find_impl(vm, self, a, "index", false, false);
    if (r.u.i < 0)
        jrt_fail(vm->rt, "substring not found");
    return r;
}

static jv split_impl(jinja_vm *vm, jv self, const jargs *a, bool rev)
{
    ARGS(rev ? "rsplit" : "split", "sep", "maxsplit");
    const jv_str *s = self.u.s;
    int64_t maxsplit = opt_int(vm, p[1], -1);
    jv out = jv_list_new(vm->rt, 4);
    if (p[0].type == JV_ABSENT || p[0].type == JV_NONE) {
        /* runs of whitespace; no empty strings */
        size_t i = 0, n = s->len;
        size_t *starts = NULL;
        (void)starts;
        if (!rev) {
            int64_t splits = 0;
            while (i < n) {
                size_t k = i;
                while (k < n) {
                    size_t k2 = k;
                    if (!jinja_is_space(jinja_utf8_next(s->s, n, &k2)))
                        break;
                    k = k2;
                }
                i = k;
                if (i >= n)
                    break;
                if (maxsplit >= 0 && splits >= maxsplit) {
                    /* rest, right-stripped */
                    jv rest = jinja_str_strip(vm, jv_str_n(vm->rt, s->s + i, n - i), jv_absent(), 'r');
                    jv_list_push(vm->rt, out, rest);
                    break;
                }
                size_t e = i;
                while (e < n) {
                    size_t e2 = e;
                    if (jinja_is_space(jinja_utf8_next(s->s, n, &e2)))
                        break;
                    e = e2;
                }
                jv_list_push(vm->rt, out, jv_str_n(vm->rt, s->s + i, e - i));
                splits++;
                i = e;
                jinja_step(vm);
            }
            return out;
        }
        /* rsplit(): split from the right, then reverse */
        jv parts = jv_list_new(vm->rt, 4);
        size_t e = n;
        int64_t splits = 0;
        for (;;) {
            while (e > 0) {
                size_t k = e - 1;
                while (k > 0 && ((unsigned char)s->s[k] & 0xC0) == 0x80)
                    k--;
                size_t k2 = k;
                if (!jinja_is_space(jinja_utf8_next(s->s, n, &k2)))
                    break;
                e = k;
            }
            if (e == 0)
                break;
            if (maxsplit >= 0 && splits >= maxsplit) {
                jv_list_push(vm->rt, parts, jinja_str_strip(vm, jv_str_n(vm->rt, s->s, e), jv_absent(), 'l'));
                break;
            }
            size_t b = e;
            while (b > 0) {
                size_t k = b - 1;
                while (k > 0 && ((unsigned char)s->s[k] & 0xC0) == 0x80)
                    k--;
                size_t k2 = k;
                if (jinja_is_space(jinja_utf8_next(s->s, n, &k2)))
                    break;
                b = k;
            }
            jv_list_push(vm->rt, parts, jv_str_n(vm->rt, s->s + b, e - b));
            splits++;
            e = b;
            jinja_step(vm);
        }
        for (size_t k = parts.u.list->len; k-- > 0;)
            jv_list_push(vm->rt, out, parts.u.list->items[k]);
        return out;
    }
    const jv_str *sep = want_str(vm, p[0], "separator");
    if (sep->len == 0)
        jrt_fail(vm->rt, "empty separator");
    if (!rev) {
        size_t i = 0;
        int64_t splits = 0;
        for (;;) {
            const char *h = (maxsplit < 0 || splits < maxsplit)
                                ? jv_memmem(s->s + i, s->len - i, sep->s, sep->len) : NULL;
            if (!h) {
                jv_list_push(vm->rt, out, jv_str_n(vm->rt, s->s + i, s->len - i));
                return out;
            }
            size_t hpos = (size_t)(h - s->s);
            jv_list_push(vm->rt, out, jv_str_n(vm->rt, s->s + i, hpos - i));
            i = hpos + sep->len;
            splits++;
            jinja_step(vm);
        }
    }
    jv parts = jv_list_new(vm->rt, 4);
    size_t e = s->len;
    int64_t splits = 0;
    for (;;) {
        size_t hit = (size_t)-1;
        if ((maxsplit < 0 || splits < maxsplit) && e >= sep->len)
            for (size_t i = e - sep->len + 1; i-- > 0;)
                if (memcmp(s->s + i, sep->s, sep->len) == 0) {
                    hit = i;
                    break;
                }
        if (hit == (size_t)-1) {
            jv_list_push(vm->rt, parts, jv_str_n(vm->rt, s->s, e));
            break;
        }
        jv_list_push(vm->rt, parts, jv_str_n(vm->rt, s->s + hit + sep->len, e - hit - sep->len));
        e = hit;
        splits++;
        jinja_step(vm);
    }
    for (size_t k = parts.u.list->len; k-- > 0;)
        jv_list_push(vm->rt, out, parts.u.list->items[k]);
    return out;
}

static jv m_split(jinja_vm *vm, jv self, const jargs *a) { return split_impl(vm, self, a, false); }
static jv m_rsplit(jinja_vm *vm, jv self, const jargs *a) { return split_impl(vm, self, a, true); }

static jv m_splitlines(jinja_vm *vm, jv self, const jargs *a)
{
    ARGS("splitlines", "keepends");
    bool keep = jv_truthy(p[0]);
    const jv_str *s = self.u.s;
    jv out = jv_list_new(vm->rt, 4);
    size_t i = 0, start = 0;
    while (i < s->len) {
        size_t k = i;
        uint32_t c = jinja_utf8_next(s->s, s->len, &k);
        bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
                   c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
        if (!brk) {
            i = k;
            continue;
        }
        if (c == '\r' && k < s->len && s->s[k] == '\n')
            k++;
        jv_list_push(vm->rt, out, jv_str_n(vm->rt, s->s + start, (keep ? k : i) - start));
        start = i = k;
        jinja_step(vm);
    }
    if (start < s->len)
        jv_list_push(vm->rt, out, jv_str_n(vm->rt, s->s + start, s->len - start));
    return out;
}

static jv m_join(jinja_vm *vm, jv self, const jargs *a)
{
    ARGS("join", "iterable");
    jv items = jinja_iterate(vm, p[0]);
    jsb b;
    jsb_init(&b, vm->rt, vm->lim->max_output_bytes);
    for (size_t i = 0; i < items.u.list->len; i++) {
        jv x = items.u.list->items[i];
        if (x.type != JV_STR)
            jrt_fail(vm->rt, "sequence item %zu: expected str instance, %s found", i, jv_type_name(x));
        if (i)
            jsb_put(&b, self.u.s->s, self.u.s->len);
        jsb_put(&b, x.u.s->s, x.u.s->len);
    }
    return jsb_value(&b);
}

static jv m_removeprefix(jinja_vm *vm, jv self, const jargs *a)
{
    ARGS("removeprefix", "prefix");
    const jv_str *s = self.u.s, *x = want_str(vm, p[0], "removeprefix() argument");
    if (x->len <= s->len && memcmp(s->s, x->s, x->len) == 0)
        return jv_str_n(vm->rt, s->s + x->len, s->len - x->len);
    return self;
}

static jv m_removesuffix(jinja_vm *vm, jv self, const jargs *a)
{
    ARGS("removesuffix", "suffix");
    const jv_str *s = self.u.s, *x = want_str(vm, p[0], "removesuffix() argument");
    if (x->len && x->len <= s->len && memcmp(s->s + s->len - x->len, x->s, x->len) == 0)
        return jv_str_n(vm->rt, s->s, s->len - x->len);
    return self;
}

/* str.center/ljust/rjust(width, fillchar=' ') and str.zfill(width) */
static jv pad_impl(jinja_vm *vm, jv self, const jargs *a, const char *name, char how)
{
    ARGS(name, "width", "fillchar");
    const jv_str *s = self.u.s;
    int64_t w = opt_int(vm, p[0], 0);
    int64_t n = (int64_t)jv_utf8_count(s->s, s->len);
    if (w > (int64_t)(1 << 20))
        jrt_fail(vm->rt, "%s: width too large", name);
    if (w <= n)
        return self;
    const char *fill = " ";
    size_t fl = 1;
    if (p[1].type == JV_STR && jv_utf8_count(p[1].u.s->s, p[1].u.s->len) == 1) {
        fill = p[1].u.s->s;
        fl = p[1].u.s->len;
    } else if (p[1].type != JV_ABSENT)
        jrt_fail(vm->rt, "The fill character must be exactly one character long");
    int64_t pad = w - n, left;
    switch (how) {
    case 'c': left = pad / 2 + (pad & w & 1); break; /* CPython's pad() split */
    case 'l': left = 0; break;
    default: left = pad; break;
    }
    jsb b;
    jsb_init(&b, vm->rt, vm->lim->max_output_bytes);
    size_t body = 0;
    if (how == 'z') {
        fill = "0";
        fl = 1;
        if (s->len && (s->s[0] == '-' || s->s[0] == '+')) {
            jsb_putc(&b, s->s[0]);
            body = 1;
        }
    }
    for (int64_t i = 0; i < left; i++)
        jsb_put(&b, fill, fl);
    jsb_put(&b, s->s + body, s->len - body);
    for (int64_t i = 0; i < pad - left; i++)
        jsb_put(&b, fill, fl);
    return jsb_value(&b);
}

static jv m_center(jinja_vm *vm, jv self, const jargs *a) { return pad_impl(vm, self, a, "center", 'c'); }
static jv m_ljust(jinja_vm *vm, jv self, const jargs *a) { return pad_impl(vm, self, a, "ljust", 'l'); }
static jv m_rjust(jinja_vm *vm, jv self, const jargs *a) { return pad_impl(vm, self, a, "rjust", 'r'); }
static jv m_zfill(jinja_vm *vm, jv self, const jargs *a) { return pad_impl(vm, self, a, "zfill", 'z'); }

static jv str_pred(jinja_vm *vm, jv self, int kind)
{
    const jv_str *s = self.u.s;
    if (s->len == 0)
        return jv_bool(false);
    bool any_cased = false;
    for (size_t i = 0; i < s->len;) {
        uint32_t c = jinja_utf8_next(s->s, s->len, &i);
        switch (kind) {
        case 'd': if (!(c >= '0' && c <= '9')) return jv_bool(false); break;
        case 'a': if (!is_cased(c) && !(c >= 0xAA && c != 0xD7 && c != 0xF7 && c < 0x2000)) return jv_bool(false); break;
        case 'n': if (!is_cased(c) && !(c >= '0' && c <= '9')) return jv_bool(false); break;
        case 's': if (!jinja_is_space(c)) return jv_bool(false); break;
        case 'u': if (jinja_upper(c) != c) return jv_bool(false); any_cased |= is_cased(c); break;
        case 'l': if (jinja_lower(c) != c) return jv_bool(false); any_cased |= is_cased(c); break;
        }
    }
    if (kind == 'u' || kind == 'l')
        return jv_bool(any_cased);
    return jv_bool(true);
}

static jv m_isdigit(jinja_vm *vm, jv self, const jargs *a) { (void)a; return str_pred(vm, self, 'd'); }
static jv m_isalpha(jinja_vm *vm, jv self, const jargs *a) { (void)a; return str_pred(vm, self, 'a'); }
static jv m_isalnum(jinja_vm *vm, jv self, const jargs *a) { (void)a; return str_pred(vm, self, 'n'); }
static jv m_isspace(jinja_vm *vm, jv self, const jargs *a) { (void)a; return str_pred(vm, self, 's'); }
static jv m_isupper(jinja_vm *vm, jv self, const jargs *a) { (void)a; return str_pred(vm, self, 'u'); }
static jv m_islower(jinja_vm *vm, jv self, const jargs *a) { (void)a; return str_pred(vm, self, 'l'); }

/* "{} {0} {name}".format(...) (no format specs) */
static jv m_format(jinja_vm *vm, jv self, const jargs *a)
{
    const jv_str *s = self.u.s;
    jsb b;
    jsb_init(&b, vm->rt, vm->lim->max_output_bytes);
    int auto_idx = 0;
    for (size_t i = 0; i < s->len; i++) {
        char c = s->s[i];
        if (c == '{' && i + 1 < s->len && s->s[i + 1] == '{') {
            jsb_putc(&b, '{');
            i++;
            continue;
        }
        if (c == '}' && i + 1 < s->len && s->s[i + 1] == '}') {
            jsb_putc(&b, '}');
            i++;
            continue;
        }
        if (c == '}')
            jrt_fail(vm->rt, "Single '}' encountered in format string");
        if (c != '{') {
            jsb_putc(&b, c);
            continue;
        }
        const char *close = memchr(s->s + i, '}', s->len - i);
        if (!close)
            jrt_fail(vm->rt, "Single '{' encountered in format string");
        size_t fl = (size_t)(close - (s->s + i + 1));
        const char *field = s->s + i + 1;
        if (memchr(field, ':', fl) || memchr(field, '!', fl))
            jrt_fail(vm->rt, "format specs are not supported");
        jv v = jv_absent();
        if (fl == 0 || (field[0] >= '0' && field[0] <= '9')) {
            int idx = fl == 0 ? auto_idx++ : (int)strtol(field, NULL, 10);
            int pos = 0;
            for (int k = 0; k < a->n; k++)
                if (!a->kw || !a->kw[k]) {
                    if (pos == idx) {
                        v = a->v[k];
                        break;
                    }
                    pos++;
                }
            if (v.type == JV_ABSENT)
                jrt_fail(vm->rt, "Replacement index %d out of range for positional args tuple", idx);
        } else {
            for (int k = 0; k < a->n; k++)
                if (a->kw && a->kw[k] && strlen(a->kw[k]) == fl && memcmp(a->kw[k], field, fl) == 0)
                    v = a->v[k];
            if (v.type == JV_ABSENT)
                jrt_fail(vm->rt, "'%.*s'", (int)fl, field);
        }
        jv_write_str(&b, v);
        i += fl + 1;
    }
    return jsb_value(&b);
}

/* ---- dict and list methods ---- */

static jv m_items(jinja_vm *vm, jv self, const jargs *a)
{
    (void)a;
    const jv_dict *d = self.u.dict;
    jv out = jv_list_new(vm->rt, d->len);
    for (size_t i = 0; i < d->len; i++) {
        jv pair = jv_list_new(vm->rt, 2);
        pair.u.list->tuple = true;
        jv_list_push(vm->rt, pair, d->keys[i]);
        jv_list_push(vm->rt, pair, d->vals[i]);
        jv_list_push(vm->rt, out, pair);
    }
    return jv_list_as(out, JL_VIEW, "dict_items");
}

static jv m_keys(jinja_vm *vm, jv self, const jargs *a)
{
    (void)a;
    return jv_list_as(jinja_iterate(vm, self), JL_VIEW, "dict_keys");
}

static jv m_values(jinja_vm *vm, jv self, const jargs *a)
{
    (void)a;
    const jv_dict *d = self.u.dict;
    jv out = jv_list_new(vm->rt, d->len);
    for (size_t i = 0; i < d->len; i++)
        jv_list_push(vm->rt, out, d->vals[i]);
    return jv_list_as(out, JL_VIEW, "dict_values");
}

static jv m_get(jinja_vm *vm, jv self, const jargs *a)
{
    ARGS("get", "key", "default");
    jv v = jv_dict_get(self, p[0]);
    if (v.type != JV_ABSENT)
        return v;
    return p[1].type == JV_ABSENT ? jv_none() : p[1];
}

static jv m_list_index(jinja_vm *vm, jv self, const jargs *a)
{
    ARGS("index", "value");
    for (size_t i = 0; i < self.u.list->len; i++)
        if (jv_eq(self.u.list->items[i], p[0]))
            return jv_int((int64_t)i);
    jrt_fail(vm->rt, "value is not in list");
}

static jv m_list_count(jinja_vm *vm, jv self, const jargs *a)
{
    ARGS("count", "value");
    int64_t c = 0;
    for (size_t i = 0; i < self.u.list->len; i++)
        c += jv_eq(self.u.list->items[i], p[0]);
    return jv_int(c);
}

typedef struct method_def {
    const char *name;
    jv_native fn;
} method_def;

static const method_def str_methods[] = {
    {"strip", m_strip}, {"lstrip", m_lstrip}, {"rstrip", m_rstrip}, {"split", m_split},
    {"rsplit", m_rsplit}, {"splitlines", m_splitlines}, {"startswith", m_startswith},
    {"endswith", m_endswith}, {"upper", m_upper}, {"lower", m_lower}, {"title", m_title},
    {"capitalize", m_capitalize}, {"replace", m_replace}, {"find", m_find}, {"rfind", m_rfind},
    {"index", m_index}, {"count", m_count}, {"join", m_join}, {"format", m_format},
    {"removeprefix", m_removeprefix}, {"removesuffix", m_removesuffix},
    {"isdigit", m_isdigit}, {"isalpha", m_isalpha}, {"isalnum", m_isalnum},
    {"isspace", m_isspace}, {"isupper", m_isupper}, {"islower", m_islower},
    {"center", m_center}, {"ljust", m_ljust}, {"rjust", m_rjust}, {"zfill", m_zfill},
};
static const method_def dict_methods[] = {
    {"items", m_items}, {"keys", m_keys}, {"values", m_values}, {"get", m_get},
};
static const method_def list_methods[] = {
    {"index", m_list_index}, {"count", m_list_count},
};
/* jinja2 sandbox.py _mutable_spec: refused by ImmutableSandboxedEnvironment */
static const char *const list_mutators[] = {"append", "clear", "pop", "reverse", "insert",
                                            "sort", "extend", "remove", NULL};
static const char *const dict_mutators[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};

static jv find_method(jinja_vm *vm, jv self, const char *name, const method_def *t, size_t n,
                      const char *const *mutators)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0)
            return jv_func_native(vm->rt, t[i].name, t[i].fn, self);
    for (; mutators && *mutators; mutators++)
        if (strcmp(*mutators, name) == 0)
            return jv_undef(vm->rt, "access to attribute '%s' of '%s' object is unsafe.", name,
                            jv_type_name(self));
    return jv_absent();
}

jv jinja_method(jinja_vm *vm, jv self, const char *name)
{
    switch (self.type) {
    case JV_STR:
        return find_method(vm, self, name, str_methods, sizeof str_methods / sizeof str_methods[0], NULL);
    case JV_DICT:
        return find_method(vm, self, name, dict_methods, sizeof dict_methods / sizeof dict_methods[0],
                           dict_mutators);
    case JV_LIST:
        if (self.u.list->kind == JL_GEN || self.u.list->kind == JL_VIEW)
            return jv_absent();
        return find_method(vm, self, name, list_methods, sizeof list_methods / sizeof list_methods[0],
                           self.u.list->tuple || self.u.list->kind == JL_RANGE ? NULL : list_mutators);
    default:
        return jv_absent();
    }
}

/* ---- globals ---- */

static jv g_range(jinja_vm *vm, jv self, const jargs *a)
{
    (void)self;
    int64_t v[3] = {0, 0, 1};
    int np = 0;
    for (int i = 0; i < a->n; i++) {
        if (a->kw && a->kw[i])
            jrt_fail(vm->rt, "range() takes no keyword arguments");
        if (np == 3)
            jrt_fail(vm->rt, "range expected at most 3 arguments, got %d", a->n);
        jv x = a->v[i];
        if (x.type != JV_INT && x.type != JV_BOOL) {
            if (x.type == JV_UNDEF)
                jinja_undef_fail(vm, x);
            jrt_fail(vm->rt, "'%s' object cannot be interpreted as an integer", jv_type_name(x));
        }
        v[np++] = opt_int(vm, x, 0);
    }
    if (np == 0)
        jrt_fail(vm->rt, "range expected at least 1 argument, got 0");
    int64_t start = np == 1 ? 0 : v[0], stop = np == 1 ? v[0] : v[1], step = np == 3 ? v[2] : 1;
    if (step == 0)
        jrt_fail(vm->rt, "range() arg 3 must not be zero");
    double est = ((double)stop - (double)start) / (double)step;
    if (est > JINJA_MAX_RANGE + 1.0)
        jrt_fail(vm->rt, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", JINJA_MAX_RANGE);
    int64_t count = 0;
    if (step > 0 && start < stop)
        count = (stop - start - 1) / step + 1;
    else if (step < 0 && start > stop)
        count = (start - stop - 1) / -step + 1;
    if (count > JINJA_MAX_RANGE)
        jrt_fail(vm->rt, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", JINJA_MAX_RANGE);
    jv out = jv_list_new(vm->rt, (size_t)count);
    for (int64_t k = 0; k < count; k++)
        jv_list_push(vm->rt, out, jv_int(start + k * step));
    jv_list_as(out, JL_RANGE, "range");
    out.u.list->range[0] = start;
    out.u.list->range[1] = stop;
    out.u.list->range[2] = step;
    return out;
}

static jv kw_dict(jinja_vm *vm, const jargs *a, bool ns, const char *fname)
{
    jv d = jv_dict_new(vm->rt, (size_t)a->n);
    if (ns)
        d.type = JV_NS;
    for (int i = 0; i < a->n; i++) {
        if (a->kw && a->kw[i]) {
            jv_dict_set_str(vm->rt, d, a->kw[i], a->v[i]);
            continue;
        }
        jv src = a->v[i];
        if (i > 0 || (src.type != JV_DICT && src.type != JV_LIST))
            jrt_fail(vm->rt, "%s() takes at most 1 positional argument", fname);
        if (src.type == JV_DICT) {
            for (size_t k = 0; k < src.u.dict->len; k++)
                jv_dict_set(vm->rt, d, src.u.dict->keys[k], src.u.dict->vals[k]);
        } else {
            for (size_t k = 0; k < src.u.list->len; k++) {
                jv pair = src.u.list->items[k];
                if (pair.type != JV_LIST || pair.u.list->len != 2)
                    jrt_fail(vm->rt, "%s() sequence elements must be pairs", fname);
                jv_dict_set(vm->rt, d, pair.u.list->items[0], pair.u.list->items[1]);
            }
        }
    }
    return d;
}

static jv g_namespace(jinja_vm *vm, jv self, const jargs *a) { (void)self; return kw_dict(vm, a, true, "namespace"); }
static jv g_dict(jinja_vm *vm, jv self, const jargs *a) { (void)self; return kw_dict(vm, a, false, "dict"); }

static jv g_raise_exception(jinja_vm *vm, jv self, const jargs *a)
{
    (void)self;
    jsb b;
    jsb_init(&b, vm->rt, 4096);
    if (a->n > 0)
        jv_write_str(&b, a->v[0]);
    jrt_fail(vm->rt, "%s", b.p ? b.p : "");
}

static const char *const WDAY[] = {"Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"};
static const char *const MON[] = {"January", "February", "March", "April", "May", "June", "July",
                                  "August", "September", "October", "November", "December"};

jv jinja_strftime(jinja_vm *vm, const char *fmt, int64_t unix_s)
{
    time_t t = (time_t)unix_s;
    struct tm tm;
    if (!gmtime_r(&t, &tm))
        jrt_fail(vm->rt, "strftime_now: time out of range");
    jsb b;
    jsb_init(&b, vm->rt, vm->lim->max_output_bytes);
    for (const char *p = fmt; *p; p++) {
        if (*p != '%' || !p[1]) {
            jsb_putc(&b, *p);
            continue;
        }
        p++;
        bool nopad = false;
        if (*p == '-' && p[1]) {
            nopad = true;
            p++;
        }
        int hour12 = tm.tm_hour % 12 == 0 ? 12 : tm.tm_hour % 12;
        switch (*p) {
        case 'a': jsb_printf(&b, "%.3s", WDAY[tm.tm_wday]); break;
        case 'A': jsb_puts(&b, WDAY[tm.tm_wday]); break;
        case 'b': case 'h': jsb_printf(&b, "%.3s", MON[tm.tm_mon]); break;
        case 'B': jsb_puts(&b, MON[tm.tm_mon]); break;
        case 'd': jsb_printf(&b, nopad ? "%d" : "%02d", tm.tm_mday); break;
        case 'e': jsb_printf(&b, "%2d", tm.tm_mday); break;
        case 'm': jsb_printf(&b, nopad ? "%d" : "%02d", tm.tm_mon + 1); break;
        case 'y': jsb_printf(&b, nopad ? "%d" : "%02d", tm.tm_year % 100); break;
        case 'Y': jsb_printf(&b, "%d", tm.tm_year + 1900); break;
        case 'H': jsb_printf(&b, nopad ? "%d" : "%02d", tm.tm_hour); break;
        case 'I': jsb_printf(&b, nopad ? "%d" : "%02d", hour12); break;
        case 'M': jsb_printf(&b, nopad ? "%d" : "%02d", tm.tm_min); break;
        case 'S': jsb_printf(&b, nopad ? "%d" : "%02d", tm.tm_sec); break;
        case 'p': jsb_puts(&b, tm.tm_hour < 12 ? "AM" : "PM"); break;
        case 'j': if (nopad)
                jsb_printf(&b, "%d", tm.tm_yday + 1);
            else
                jsb_printf(&b, "%03d", tm.tm_yday + 1);
            break;
        case 'w': jsb_printf(&b, "%d", tm.tm_wday); break;
        case 'u': jsb_printf(&b, "%d", tm.tm_wday == 0 ? 7 : tm.tm_wday); break;
        case 'Z': jsb_puts(&b, "UTC"); break;
        case 'z': jsb_puts(&b, "+0000"); break;
        case 'F': jsb_printf(&b, "%d-%02d-%02d", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday); break;
        case 'T': jsb_printf(&b, "%02d:%02d:%02d", tm.tm_hour, tm.tm_min, tm.tm_sec); break;
        case '%': jsb_putc(&b, '%'); break;
        default: {
            /* the rest through the C library (C locale) */
            jsb_putc(&b, '%');
            jsb_putc(&b, *p);
        }
        }
    }
    return jsb_value(&b);
}

static jv g_strftime_now(jinja_vm *vm, jv self, const jargs *a)
{
    (void)self;
    ARGS("strftime_now", "format");
    const jv_str *f = want_str(vm, p[0], "strftime_now() argument");
    return jinja_strftime(vm, f->s, vm->now_unix);
}

static jv cycler_next(jinja_vm *vm, jv self, const jargs *a)
{
    (void)a;
    /* self: a namespace {items, pos} */
    jv items = jv_dict_get_str(self, "items", 5);
    jv pos = jv_dict_get_str(self, "pos", 3);
    if (items.u.list->len == 0)
        return jv_none();
    jv v = items.u.list->items[pos.u.i % (int64_t)items.u.list->len];
    jv_dict_set_str(vm->rt, self, "pos", jv_int(pos.u.i + 1));
    return v;
}

static jv g_cycler(jinja_vm *vm, jv self, const jargs *a)
{
    (void)self;
    jv items = jv_list_new(vm->rt, (size_t)a->n);
    for (int i = 0; i < a->n; i++)
        jv_list_push(vm->rt, items, a->v[i]);
    jv ns = jv_dict_new(vm->rt, 4);
    ns.type = JV_NS;
    jv_dict_set_str(vm->rt, ns, "items", items);
    jv_dict_set_str(vm->rt, ns, "pos", jv_int(0));
    jv_dict_set_str(vm->rt, ns, "next", jv_func_native(vm->rt, "next", cycler_next, ns));
    return ns;
}

static jv joiner_call(jinja_vm *vm, jv self, const jargs *a)
{
    (void)a;
    jv used = jv_dict_get_str(self, "used", 4);
    if (!jv_truthy(used)) {
        jv_dict_set_str(vm->rt, self, "used", jv_bool(true));
        return jv_str_n(vm->rt, "", 0);
    }
    return jv_dict_get_str(self, "sep", 3);
}

static jv g_joiner(jinja_vm *vm, jv self, const jargs *a)
{
    (void)self;
    ARGS("joiner", "sep");
    jv st = jv_dict_new(vm->rt, 2);
    jv_dict_set_str(vm->rt, st, "sep", p[0].type == JV_ABSENT ? jv_cstr(vm->rt, ", ") : p[0]);
    jv_dict_set_str(vm->rt, st, "used", jv_bool(false));
    return jv_func_native(vm->rt, "joiner", joiner_call, st);
}

static const method_def globals[] = {
    {"range", g_range}, {"namespace", g_namespace}, {"dict", g_dict},
    {"raise_exception", g_raise_exception}, {"strftime_now", g_strftime_now},
    {"cycler", g_cycler}, {"joiner", g_joiner},
};

jv jinja_global(jinja_vm *vm, const char *name)
{
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (strcmp(globals[i].name, name) == 0)
            return jv_func_native(vm->rt, globals[i].name, globals[i].fn, jv_none());
    return jv_absent();
}
