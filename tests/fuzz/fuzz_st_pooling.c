/* fuzz_st_pooling: the sentence-transformers parsers (st_pooling.h) over
 * arbitrary text, each as modules.json, a Pooling config.json and a
 * config.json's matryoshka keys. What is accepted must hold the documented
 * invariants; a refusal must say why. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "st_pooling.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    st_pooling_config c;
    pg_error err;
    char *path = NULL;
    memset(&c, 0, sizeof c);
    err.msg[0] = '\0';
    if (st_pooling_parse_modules(&c, &path, text, size, "modules.json", &err) == PG_OK) {
        if (!c.has_modules || (path && (path[0] == '\0' || strstr(path, ".."))))
            abort();
    } else if (err.msg[0] == '\0' || path) {
        abort();
    }
    free(path);
    memset(&c, 0, sizeof c);
    err.msg[0] = '\0';
    if (st_pooling_parse_pooling(&c, text, size, "config.json", &err) == PG_OK) {
        if (c.mode != ST_POOL_LAST && c.mode != ST_POOL_MEAN && c.mode != ST_POOL_CLS)
            abort();
    } else if (err.msg[0] == '\0') {
        abort();
    }
    memset(&c, 0, sizeof c);
    err.msg[0] = '\0';
    if (st_pooling_parse_matryoshka(&c, text, size, "config.json", &err) == PG_OK) {
        if (c.n_matryoshka_dims < 0 || c.n_matryoshka_dims > ST_POOLING_MAX_DIMS ||
            (c.n_matryoshka_dims > 0 && !c.is_matryoshka))
            abort();
        for (int32_t k = 0; k < c.n_matryoshka_dims; k++)
            if (c.matryoshka_dims[k] < 1)
                abort();
    } else if (err.msg[0] == '\0') {
        abort();
    }
    return 0;
}
