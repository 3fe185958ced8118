/* shard: what `--shard auto` reads from a job scheduler, the names of shard
 * outputs, and the marker a finished shard leaves beside its output
 * (cli/README.md "Shards, schedulers and merge").
 *
 * Everything here but the file helpers at the end is pure: the environment
 * is read through a lookup function (getenv in the binary, a table in
 * tests/cli/test_cli_shard.c). */
#ifndef PG_CLI_SHARD_H
#define PG_CLI_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pg_error.h"

/* Returns the value of variable `name`, or NULL when it is not set. */
typedef const char *(*cli_env_lookup)(void *ctx, const char *name);

/* K and N of `--shard auto` (n_given 0) or `--shard auto/N` (n_given N)
 * from the first scheduler whose index variable is set:
 *   SLURM job array:   K = (SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN) /
 *                      SLURM_ARRAY_TASK_STEP (1 when unset),
 *                      N = SLURM_ARRAY_TASK_COUNT; the array must be one
 *                      evenly stepped range (MIN + (N-1) x STEP = MAX):
 *                      --array=1,3,7 is refused, its indices do not map
 *                      onto K = 0..N-1;
 *   Kubernetes Indexed Job: K = JOB_COMPLETION_INDEX, N from auto/N only
 *                      (the pod is not told the Job's completions);
 *   AWS Batch array job: K = AWS_BATCH_JOB_ARRAY_INDEX,
 *                      N = AWS_BATCH_JOB_ARRAY_SIZE.
 * A count the scheduler gives must equal n_given when both are known.
 * *source gets a one-line description of the variables used, for the
 * banner. PG_EINVAL, naming the variables, when none is set, a value is
 * not a whole number, or they are inconsistent. */
int cli_shard_from_env(cli_env_lookup env, void *ctx, int32_t n_given, int32_t *k, int32_t *n,
                       char *source, size_t source_cap, pg_error *err);

/* The output path of shard K of N: "{shard}" in `output` (each one) becomes
 * "K-of-N"; when output_is_dir, DIR/NAME.K-of-N.jsonl with NAME the input's
 * file name without its last extension ("stdin" for "-"). *out is malloc'd,
 * or NULL when neither applies (use `output` as it is). */
int cli_shard_output_path(const char *output, bool output_is_dir, const char *input, int32_t k,
                          int32_t n, char **out, pg_error *err);

/* "NAME.K-of-N.jsonl" (and "...K-of-N" anywhere before the last '.'):
 * true with *k, *n when the file name of path holds ".K-of-N." once. */
bool cli_shard_name_parse(const char *path, int32_t *k, int32_t *n);

/* The output-shaping flags in canonical form: the lines of raw
 * ("--flag=value\n" each, in command-line order) sorted, so that two runs
 * with the same flags in another order agree. *out malloc'd. */
int cli_shard_flags_canonical(const char *raw, char **out);

/* What a finished shard's marker records (OUTPUT.done, one JSON line). */
typedef struct cli_shard_marker {
    int32_t k, n;
    int64_t input_bytes;
    uint64_t input_hash;   /* FNV-1a 64 of the input file's bytes */
    char format[16];       /* the input format the run detected: text, jsonl, openai */
    char *flags;           /* cli_shard_flags_canonical of the run, owned */
    int64_t records;       /* lines of the output */
    int64_t output_bytes;  /* size of the output */
    int32_t exit_code;     /* 0, or 1 when some lines have error records */
} cli_shard_marker;
void cli_shard_marker_free(cli_shard_marker *m); /* frees flags only; accepts NULL */

/* The marker's path: output + ".done" (malloc'd; NULL when out of memory). */
char *cli_shard_marker_path(const char *output);

/* Writes the marker of `output` atomically: OUTPUT.done.tmp, fsync,
 * rename. PG_EIO names the file. */
int cli_shard_marker_write(const char *output, const cli_shard_marker *m, pg_error *err);
/* Parses a marker's text (label names it in errors) into *m: PG_OK, or
 * PG_EFORMAT naming the field (*m then holds nothing to free). Pure: the
 * fuzz target tests/fuzz/fuzz_shard.c drives it. */
int cli_shard_marker_parse(const char *buf, size_t len, const char *label, cli_shard_marker *m, pg_error *err);
/* Reads OUTPUT.done into *m: PG_OK, CLI_SHARD_NO_MARKER when there is
 * none, PG_EIO when it cannot be read, PG_EFORMAT naming the file and
 * field when it is not a marker. */
#define CLI_SHARD_NO_MARKER 1
int cli_shard_marker_read(const char *output, cli_shard_marker *m, pg_error *err);

/* Size, FNV-1a 64 and number of "\n" of a file's bytes (lines may be
 * NULL); PG_EIO names it. */
int cli_shard_hash_file(const char *path, int64_t *bytes, uint64_t *hash, int64_t *lines, pg_error *err);

/* Puts a resumed shard output back in input order: the file holds records
 * kept from earlier runs in [0, kept_bytes) and this run's records after
 * it, in input order. order[i] is, for the i-th request of the shard in
 * input order, the offset of its kept record, or -1 for this run's next
 * one. Written to OUTPUT.sort.tmp, fsynced, renamed over output: a kill
 * leaves the old file. PG_EFORMAT when the file does not hold what order
 * says (a record missing, one left over). */
int cli_shard_sort_output(const char *output, int64_t kept_bytes, const int64_t *order, size_t n,
                          pg_error *err);

#endif /* PG_CLI_SHARD_H */
