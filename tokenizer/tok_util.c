/* tok_util: byte buffers, UTF-8 helpers (strict validation, incremental
 * lossy decoding) and the small JSON helpers the tokenizer loaders share
 * (strings, booleans, Sequence nodes). */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

bool tok_buf_reserve(tok_buf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return false;
    b->p = p;
    b->cap = cap;
    return true;
}

bool tok_buf_put(tok_buf *b, const void *s, size_t n)
{
    if (!tok_buf_reserve(b, n))
        return false;
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return true;
}

void tok_buf_free(tok_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* Second-byte range of a lead byte (Unicode Table 3-7); later bytes are
 * always 80..BF. */
static void second_range(unsigned char c, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c == 0xE0)
        *lo = 0xA0;
    else if (c == 0xED)
        *hi = 0x9F;
    else if (c == 0xF0)
        *lo = 0x90;
    else if (c == 0xF4)
        *hi = 0x8F;
}

/* Sequence length of a valid lead byte, 0 if c cannot start a sequence. */
static int lead_len(unsigned char c)
{
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return 2;
    if (c >= 0xE0 && c <= 0xEF)
        return 3;
    if (c >= 0xF0 && c <= 0xF4)
        return 4;
    return 0;
}

size_t tok_utf8_valid_prefix(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int k = lead_len(c);
        if (k == 0 || i + (size_t)k > n)
            return i;
        unsigned char lo, hi;
        second_range(c, &lo, &hi);
        if (s[i + 1] < lo || s[i + 1] > hi)
            return i;
        for (int j = 2; j < k; j++)
            if ((s[i + (size_t)j] & 0xC0) != 0x80)
                return i;
        i += (size_t)k;
    }
    return n;
}

uint32_t tok_utf8_decode(const unsigned char *s, size_t *n)
{
    unsigned char c = s[0];
    if (c < 0x80) {
        *n = 1;
        return c;
    }
    if (c < 0xE0) {
        *n = 2;
        return ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F);
    }
    if (c < 0xF0) {
        *n = 3;
        return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    }
    *n = 4;
    return ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
           ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

size_t tok_utf8_encode(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

bool tok_is_whitespace(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

bool tok_utf8_lossy_byte(tok_utf8_lossy *u, unsigned char c, tok_buf *out)
{
    if (u->npend > 0) {
        unsigned char lo = 0x80, hi = 0xBF;
        if (u->npend == 1)
            second_range(u->pend[0], &lo, &hi);
        if (c >= lo && c <= hi) {
            u->pend[u->npend++] = c;
            if (u->npend == u->need) {
                int k = u->npend;
                u->npend = 0;
                return tok_buf_put(out, u->pend, (size_t)k);
            }
            return true;
        }
        /* the pending bytes are a maximal invalid subpart; c starts afresh */
        u->npend = 0;
        if (!tok_buf_put(out, fffd, 3))
            return false;
    }
    int k = lead_len(c);
    if (k == 1)
        return tok_buf_put(out, &c, 1);
    if (k == 0)
        return tok_buf_put(out, fffd, 3);
    u->pend[0] = c;
    u->npend = 1;
    u->need = k;
    return true;
}

bool tok_utf8_lossy_flush(tok_utf8_lossy *u, tok_buf *out)
{
    if (u->npend == 0)
        return true;
    u->npend = 0;
    return tok_buf_put(out, fffd, 3);
}

int tok_json_strdup(const json_doc *d, int i, char **out, size_t *len, const char *label,
                    const char *what, pg_error *err)
{
    if (!json_is_string(d, i))
        return pg_error_set(err, PG_EFORMAT, "%s: %s: expected a string", label, what);
    int rc = json_get_string(d, i, out, len, err);
    if (rc)
        return pg_error_wrap(err, rc, "%s: %s", label, what);
    return PG_OK;
}

bool tok_json_bool(const json_doc *d, int obj, const char *key, bool dflt)
{
    int v = json_obj_get(d, obj, key);
    bool b = dflt;
    if (json_is_bool(d, v))
        json_get_bool(d, v, &b, NULL);
    return b;
}

int tok_load_sequence(tokenizer *t, const json_doc *d, int node, const char *key,
                      const char *what, const char *label, int depth, tok_step_load_fn one,
                      void *ctx, pg_error *err)
{
    int arr = json_obj_get(d, node, key);
    if (!json_is_array(d, arr))
        return pg_error_set(err, PG_EFORMAT, "%s: %s Sequence: expected a %s array", label, what,
                            key);
    if (depth > TOK_MAX_SEQ_DEPTH)
        return pg_error_set(err, PG_EFORMAT, "%s: %s Sequence: nested more than %d deep", label,
                            what, TOK_MAX_SEQ_DEPTH);
    int i = arr + 1;
    for (int k = 0; k < json_size(d, arr); k++, i = json_skip(d, i)) {
        int rc = one(t, d, i, label, depth + 1, ctx, err);
        if (rc)
            return rc;
    }
    return PG_OK;
}
