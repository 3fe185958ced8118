/* fuzz_safetensors: st_parse over arbitrary bytes. Whatever it accepts must
 * satisfy the contract: tensors sorted by unique name, every byte range
 * inside the input, nbytes == product(shape) * dtype size, no overlaps. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    st_tensor *t = NULL;
    size_t n = 0;
    pg_error err;
    if (st_parse(data, size, "fuzz.safetensors", &t, &n, &err) != PG_OK) {
        if (t != NULL || n != 0 || err.msg[0] == '\0')
            abort();
        return 0;
    }
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && strcmp(t[i - 1].name, t[i].name) >= 0)
            abort();
        if (t[i].ndim < 0 || t[i].ndim > ST_MAX_DIMS || (unsigned)t[i].dtype >= ST_DTYPE_COUNT)
            abort();
        size_t elems = 1;
        for (int k = 0; k < t[i].ndim; k++)
            elems *= (size_t)t[i].shape[k];
        if (elems * st_dtype_size(t[i].dtype) != t[i].nbytes)
            abort();
        const uint8_t *p = t[i].data;
        if (p < data || t[i].nbytes > size || p > data + size - t[i].nbytes)
            abort();
        /* touch the first and last byte: ASan checks they are inside */
        if (t[i].nbytes) {
            sink ^= p[0];
            sink ^= p[t[i].nbytes - 1];
        }
        for (size_t j = 0; j < i; j++) {
            const uint8_t *q = t[j].data;
            if (t[i].nbytes && t[j].nbytes && p < q + t[j].nbytes && q < p + t[i].nbytes)
                abort();
        }
    }
    (void)sink;
    st_tensors_free(t, n);
    return 0;
}
