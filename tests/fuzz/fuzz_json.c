/* fuzz_json: json_parse over arbitrary bytes, then every accessor over every
 * token of an accepted document, and a write -> parse -> read round trip of
 * every string through json_buf_string, exact from the first trip (strings
 * json_parse accepts are valid UTF-8). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* s -> JSON literal -> parse -> unescape; the result, malloc'd. */
static char *round_trip(const char *s, size_t n, size_t *out_len)
{
    json_buf b = {0};
    json_buf_string(&b, s, n);
    if (b.oom)
        abort();
    json_doc d;
    char *u = NULL;
    if (json_parse(&d, b.data, b.len, "round trip", NULL) != PG_OK || !json_is_string(&d, 0) ||
        json_get_string(&d, 0, &u, out_len, NULL) != PG_OK)
        abort(); /* json_buf_string must always write valid JSON */
    json_doc_free(&d);
    json_buf_free(&b);
    return u;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_doc d;
    pg_error err;
    if (json_parse(&d, (const char *)data, size, "fuzz.json", &err) != PG_OK)
        return 0;
    if (d.ntok <= 0 || json_skip(&d, 0) != d.ntok)
        abort();
    for (int i = 0; i < d.ntok; i++) {
        int64_t iv;
        double dv;
        bool bv;
        char buf[16];
        (void)json_get_int(&d, i, INT64_MIN, INT64_MAX, &iv, NULL);
        (void)json_get_double(&d, i, &dv, NULL);
        (void)json_get_bool(&d, i, &bv, NULL);
        (void)json_get_string_buf(&d, i, buf, sizeof buf, NULL, NULL);
        if (json_is_object(&d, i)) {
            /* members come as key (string) / value pairs */
            int j = i + 1;
            for (int k = 0; k < json_size(&d, i); k++) {
                if (!json_is_string(&d, j))
                    abort();
                j = json_skip(&d, j + 1);
            }
            if (j != json_skip(&d, i))
                abort();
            (void)json_obj_get(&d, i, "a");
        }
        if (json_is_array(&d, i)) {
            int n = json_size(&d, i);
            if (n > 0 && json_arr_at(&d, i, n - 1) < 0)
                abort();
        }
        if (json_is_string(&d, i)) {
            char *s = NULL;
            size_t n = 0;
            if (json_get_string(&d, i, &s, &n, NULL) != PG_OK)
                abort(); /* escapes were checked by the parser */
            size_t n1, n2;
            char *u1 = round_trip(s, n, &n1);
            char *u2 = round_trip(u1, n1, &n2);
            if (n1 != n2 || memcmp(u1, u2, n1) != 0)
                abort(); /* the second trip is exact */
            if (n1 != n || memcmp(u1, s, n) != 0)
                abort(); /* so is the first: an accepted string is whole UTF-8
                            (json_buf_string would replace a bad byte) */
            free(u1);
            free(u2);
            free(s);
        }
    }
    json_doc_free(&d);
    return 0;
}
