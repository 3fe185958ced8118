/* progress: what a long run shows on stderr. On a terminal one status line
 * redrawn a few times a second; otherwise one log line every
 * --log-interval seconds; nothing with --quiet. The summary at the end
 * (unless --quiet) reports requests, tokens, throughput, KV use,
 * preemptions and the prefix-cache hit rate (engine_get_stats). */
#ifndef PG_CLI_PROGRESS_H
#define PG_CLI_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"

typedef struct cli_progress_counts {
    int64_t total;      /* requests this run will answer or skip; -1 = unknown (pipe) */
    int64_t ok, failed; /* records written (or finished) this run */
    int64_t skipped;    /* answered by an earlier run (--resume) */
    int64_t skipped_failed; /* of which error records */
    int64_t lax_lines;  /* lines with ignored unknown fields or coerced values (not --strict) */
} cli_progress_counts;

typedef struct cli_progress cli_progress;

/* fd: where to draw (2). tty: draw the redrawn status line. */
int cli_progress_create(cli_progress **out, int fd, bool tty, bool quiet, double log_interval_s);
void cli_progress_destroy(cli_progress *p); /* accepts NULL */

/* Redraws when due (or always with force). Cheap when not due. */
void cli_progress_update(cli_progress *p, const cli_progress_counts *c, const engine_stats *s,
                         bool force);
/* Clears the status line and prints the summary. */
void cli_progress_summary(cli_progress *p, const cli_progress_counts *c, const engine_stats *s,
                          bool interrupted);

double cli_now_s(void); /* monotonic seconds */

#endif /* PG_CLI_PROGRESS_H */
