/* id_set: a set of byte-string keys, each with an int64 value (the line
 * that first used it). Used for duplicate-id detection and for the ids
 * --resume finds already answered. Open addressing, grows by doubling;
 * memory is proportional to the number of keys (ids are short). */
#ifndef PG_CLI_ID_SET_H
#define PG_CLI_ID_SET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cli_id_set cli_id_set;

cli_id_set *cli_id_set_create(void);          /* NULL when out of memory */
void cli_id_set_destroy(cli_id_set *s);       /* accepts NULL */

/* Inserts key (copied) with value, unless present. Returns 1 when inserted,
 * 0 when it was already there (*existing gets its value, may be NULL), or a
 * negative pg_status (PG_ENOMEM). */
int cli_id_set_add(cli_id_set *s, const char *key, size_t len, int64_t value, int64_t *existing);
bool cli_id_set_has(const cli_id_set *s, const char *key, size_t len);
/* True with *value when key is present. */
bool cli_id_set_get(const cli_id_set *s, const char *key, size_t len, int64_t *value);
size_t cli_id_set_count(const cli_id_set *s);

#endif /* PG_CLI_ID_SET_H */
