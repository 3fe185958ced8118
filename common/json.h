/* json: the project's one way to read JSON, a thin checked layer over jsmn
 * (libjsmn-dev, header-only; this is the only header that includes it, so
 * every translation unit sees the same jsmn configuration).
 *
 * A json_doc holds the token array of one parsed text; token indices are
 * ints, -1 means "absent" (the is/size/get/obj/arr accessors accept -1 and
 * answer false, 0, -1 or an error; json_skip and json_raw need a valid
 * one). Nothing here allocates except json_parse, json_get_string and the
 * json_buf writers. Numbers are parsed with end-pointer and range checks.
 */
#ifndef PG_JSON_H
#define PG_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JSMN_STRICT
#define JSMN_PARENT_LINKS
#ifndef PG_JSON_IMPLEMENTATION
#define JSMN_HEADER
#endif
#include <jsmn.h>

#include "pg_error.h"

typedef struct json_doc {
    const char *src;   /* borrowed: the text must outlive the doc */
    size_t len;
    jsmntok_t *tok;    /* owned */
    int ntok;
} json_doc;

/* Containers nested deeper than this are refused by json_parse: jsmn closes
 * a container by walking up from the newest token, so parsing costs
 * O(depth) per closing bracket (a line of 40000 '[' then 40000 ']' took
 * 3 s, 1 MB of them minutes). The files and requests we read nest a few
 * levels. */
#define JSON_MAX_DEPTH 1000

/* Parses src[0, len) fully (trailing non-whitespace is an error; so is
 * nesting deeper than JSON_MAX_DEPTH, and a string that is not valid UTF-8:
 * RFC 8259 section 8.1, what serde_json (Hugging Face tokenizers) and
 * Python's json (transformers, vLLM) refuse, so every file and request line
 * read through here holds whole characters only). On error the message
 * names `label` (the loaders pass the file path) and the byte offset:
 * "<label>: invalid utf-8 in json string at byte N". Free with
 * json_doc_free. */
int json_parse(json_doc *doc, const char *src, size_t len, const char *label, pg_error *err);
void json_doc_free(json_doc *doc);

/* Index of the first token after the subtree rooted at i. */
int json_skip(const json_doc *d, int i);
bool json_is_object(const json_doc *d, int i);
bool json_is_array(const json_doc *d, int i);
bool json_is_string(const json_doc *d, int i);
bool json_is_null(const json_doc *d, int i);
bool json_is_number(const json_doc *d, int i); /* a primitive that is not true/false/null */
bool json_is_bool(const json_doc *d, int i);
/* Number of members (object) or elements (array). */
int json_size(const json_doc *d, int i);
/* Value token of `key` in object obj, or -1. Duplicate keys: the first. */
int json_obj_get(const json_doc *d, int obj, const char *key);
/* The k-th element of array arr (k < json_size), or -1. O(k). */
int json_arr_at(const json_doc *d, int arr, int k);
/* Raw (still escaped) bytes of token i. */
const char *json_raw(const json_doc *d, int i, size_t *len);
/* True if string token i equals s exactly (compares raw bytes: use for keys
 * without escapes). */
bool json_str_eq(const json_doc *d, int i, const char *s);

/* Unescapes string token i (\uXXXX incl. surrogate pairs -> UTF-8) into a
 * malloc'd NUL-terminated buffer. A lone surrogate becomes U+FFFD (as
 * Python's json would not, but HF files never hold one). Embedded NULs are
 * kept; *len gives the true length. */
int json_get_string(const json_doc *d, int i, char **out, size_t *len, pg_error *err);
/* Unescapes into a caller buffer; fails if it does not fit (cap includes NUL). */
int json_get_string_buf(const json_doc *d, int i, char *buf, size_t cap, size_t *len, pg_error *err);
/* Integer in [lo, hi]; "3.0" and "3e2" are refused, as are out-of-range values. */
int json_get_int(const json_doc *d, int i, int64_t lo, int64_t hi, int64_t *out, pg_error *err);
/* Finite number (any JSON number syntax). */
int json_get_double(const json_doc *d, int i, double *out, pg_error *err);
int json_get_bool(const json_doc *d, int i, bool *out, pg_error *err);

/* A growing output buffer: start zeroed, append, read data[0, len) (kept
 * NUL-terminated), free with json_buf_free. json_buf_string appends the
 * JSON string literal for s[0, len) (with quotes, escaped; invalid UTF-8
 * bytes become \ufffd). */
typedef struct json_buf {
    char *data;
    size_t len, cap;
    bool oom;  /* set once an append failed; later appends are no-ops */
} json_buf;
void json_buf_put(json_buf *b, const char *s, size_t len);
void json_buf_puts(json_buf *b, const char *s);
void json_buf_printf(json_buf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void json_buf_string(json_buf *b, const char *s, size_t len);
void json_buf_free(json_buf *b);

#endif /* PG_JSON_H */
