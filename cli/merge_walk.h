/* merge_walk: the k-way walk shared by `pagedgen merge` (merge_cmd.c) and
 * the multi-device run (multi_device.c): N streams of records, each in
 * input order, joined into one stream in input order.
 *
 * The walk reads the input file and takes request i's record from stream
 * i mod N: one line per stream in memory, whatever the sizes. A record
 * answers request (index i, line L) when it is an error record of line L
 * or a result whose id is the request's (resume.h cli_record_key, the same
 * rule --resume uses). What does not answer is counted (missing, answered
 * twice, answering nothing) and the first MERGE_LIST_MAX problems are
 * printed to stderr; records that do answer are written in order, so a
 * stream that ends early (a dead worker) leaves every other stream's
 * records written. */
#ifndef PG_CLI_MERGE_WALK_H
#define PG_CLI_MERGE_WALK_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "options.h"
#include "pg_error.h"
#include "resume.h"
#include "shard.h"

#define MERGE_LIST_MAX 20 /* problems listed one by one; the rest are counted */

typedef struct merge_shard {
    const char *path;     /* its name in messages (merge: the file, borrowed); NULL: no stream for this K */
    bool finished;        /* merge: has its marker */
    cli_shard_marker m;   /* merge: the marker */
    FILE *f;              /* the stream, owned by the caller */
    char *line;           /* the current record (with its "\n"), NULL at EOF */
    size_t cap;
    ssize_t len;
    int64_t line_no;      /* of the current record in the stream */
    char *key;            /* its cli_record_key, NULL when it is not a record */
    size_t key_len;
    int64_t cut_bytes;    /* cut_partial: the bytes of a partial last line dropped */
} merge_shard;

typedef struct merge_state {
    const cli_options *o; /* input_path is walked */
    merge_shard *sh;      /* [n] */
    int32_t n;
    const char *label;    /* message prefix after "pagedgen: " ("merge") */
    const char *unit;     /* what a stream is called in messages ("shard") */
    bool cut_partial;     /* a partial last line ends its stream (a worker that died writing
                           * it) instead of failing the walk (a shard that did not finish) */
    const cli_resume *kept; /* requests answered in it expect no record (NULL: none) */
    const volatile sig_atomic_t *hush; /* when set and non-zero, problems are counted, not listed
                                        * (an interrupted multi-device run: every later request is missing) */
    int64_t missing, duplicate, extra, listed, skipped, skipped_errors; /* skipped: kept answers */
    int64_t written, written_errors; /* records written, of which error records */
    pg_error err;
} merge_state;

/* Reads stream s's next line and its key. PG_EIO / PG_EFORMAT / PG_ENOMEM
 * in ms->err. */
int cli_merge_advance(merge_state *ms, merge_shard *s);

/* The walk: every stream must have been advanced once. Records go to
 * out_fd (< 0: checked, not written); *requests counts the input's
 * requests. A non-OK return is an error in ms->err (the counts say what
 * was found so far). */
int cli_merge_walk(merge_state *ms, cli_format fmt, int out_fd, int64_t *requests);

#endif /* PG_CLI_MERGE_WALK_H */
