/* reorder: the bounded buffer that puts finished records back into input
 * order. Records carry a sequence number (0, 1, 2, ... in input order);
 * record `seq` may be put only while seq < next + capacity, where next is
 * the oldest record not yet released — the reader checks cli_reorder_can_admit
 * before it takes a new request, so when the buffer is full the reader waits
 * for the oldest request to finish (the engine keeps running meanwhile). */
#ifndef PG_CLI_REORDER_H
#define PG_CLI_REORDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pg_error.h"

typedef struct cli_reorder cli_reorder;

int cli_reorder_create(cli_reorder **out, size_t capacity); /* PG_ENOMEM, PG_EINVAL (0) */
void cli_reorder_destroy(cli_reorder *r);  /* accepts NULL; frees held records */

/* True when sequence number `seq` fits in the window (seq < next + capacity). */
bool cli_reorder_can_admit(const cli_reorder *r, uint64_t seq);
/* Takes ownership of data (malloc'd, len bytes) as record seq. PG_EINVAL when
 * seq is outside the window or already held (data is then not taken). */
int cli_reorder_put(cli_reorder *r, uint64_t seq, char *data, size_t len);
/* Hands out the record `next` if it is held, and advances next. The caller
 * owns *data. Returns false when the next record is not there yet. */
bool cli_reorder_pop_next(cli_reorder *r, char **data, size_t *len);
/* Hands out the held record with the lowest sequence number, even past a
 * gap (flushing on interrupt); next jumps past it. */
bool cli_reorder_pop_any(cli_reorder *r, char **data, size_t *len);
/* Skips sequence number `next` (a record that will never come). */
void cli_reorder_skip_next(cli_reorder *r);
uint64_t cli_reorder_next(const cli_reorder *r);
size_t cli_reorder_held(const cli_reorder *r);

#endif /* PG_CLI_REORDER_H */
