/* fuzz_shard: the parsers merge and --resume trust with files they did not
 * write themselves: a shard marker (shard.h cli_shard_marker_parse), a
 * shard output line's key (resume.h cli_record_key) and a shard file name
 * (cli_shard_name_parse). What is accepted must hold the documented
 * invariants; a refusal must say why. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "resume.h"
#include "shard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    cli_shard_marker m;
    pg_error err;
    err.msg[0] = '\0';
    if (cli_shard_marker_parse(text, size, "x.done", &m, &err) == PG_OK) {
        if (m.n < 1 || m.k < 0 || m.k >= m.n || !m.flags || m.input_bytes < 0 || m.records < 0 ||
            m.output_bytes < 0 || m.exit_code < 0 || m.exit_code > 255 || memchr(m.format, '\0', sizeof m.format) == NULL)
            abort();
        cli_shard_marker_free(&m);
        if (m.flags)
            abort();
    } else if (err.msg[0] == '\0' || m.flags) {
        abort();
    }
    char *key = NULL;
    size_t klen = 0;
    int rc = cli_record_key(text, size, &key, &klen);
    if (rc == 1) {
        if (!key || klen < 2 || key[1] != ':' || (key[0] != 's' && key[0] != 'n' && key[0] != 'L'))
            abort();
    } else if (rc != 0 || key) {
        abort();
    }
    free(key);
    char *name = malloc(size + 1);
    if (!name)
        return 0;
    memcpy(name, data, size);
    name[size] = '\0';
    int32_t k = -1, n = -1;
    if (cli_shard_name_parse(name, &k, &n) && (n < 1 || k < 0 || k >= n))
        abort();
    free(name);
    return 0;
}
