/* resume: what an earlier (interrupted) run already wrote to -o FILE.
 *
 * Rules (cli/README.md "Resuming"): a request is answered when the file holds a
 * result record with its id (jsonl "id", openai "custom_id") or an error
 * record with its line number (error records count as answered: output is a
 * pure function of the input, so the same line fails the same way; delete
 * those records to retry them). A trailing line without "\n" is the partial
 * write of a killed run and is cut off. A complete line that is not a JSON
 * object is kept and ignored (its request runs again). */
#ifndef PG_CLI_RESUME_H
#define PG_CLI_RESUME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pg_error.h"

typedef struct cli_resume cli_resume;

/* Scans path (a missing file is an empty run) and truncates its partial
 * tail. PG_EIO when it cannot be read or truncated. */
int cli_resume_load(cli_resume **out, const char *path, pg_error *err);
void cli_resume_destroy(cli_resume *r); /* accepts NULL */

enum cli_resume_answer {
    CLI_RESUME_NEW = 0,        /* not in the file: run it */
    CLI_RESUME_RESULT,         /* a result record with this id */
    CLI_RESUME_ERROR,          /* an error record for this line */
};
/* id_key as cli_request.id_key (NULL: look up the line only), line 1-based. */
int cli_resume_lookup(const cli_resume *r, const char *id_key, size_t key_len, int64_t line);
/* Byte offset in the file of the record cli_resume_lookup finds (the
 * first one with that key), or -1. */
int64_t cli_resume_offset(const cli_resume *r, const char *id_key, size_t key_len, int64_t line);
int64_t cli_resume_kept_bytes(const cli_resume *r);     /* the file's size after the cut */
int64_t cli_resume_records(const cli_resume *r);        /* complete records found */
int64_t cli_resume_cut_bytes(const cli_resume *r);      /* bytes of the partial line removed */

/* The key an output line answers, by the rules above: "L:<line>" for an
 * error record, "s:<id>" / "n:<id>" for a result (openai "custom_id", else
 * "id"). Returns 1 with *key malloc'd, 0 when the line is not a record, or
 * PG_ENOMEM. (merge matches records to input lines with it.) */
int cli_record_key(const char *line, size_t len, char **key, size_t *key_len);

#endif /* PG_CLI_RESUME_H */
