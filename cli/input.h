/* input: the streaming line reader. Holds one line at a time (never the
 * whole file); blank lines (only spaces, tabs, CR) are skipped but counted
 * in line numbers; a line's trailing "\n" or "\r\n" is removed. */
#ifndef PG_CLI_INPUT_H
#define PG_CLI_INPUT_H

#include <stddef.h>
#include <stdint.h>

#include "pg_error.h"

typedef struct cli_input cli_input;

enum {
    CLI_INPUT_EOF = 0,
    CLI_INPUT_LINE = 1,
    CLI_INPUT_EINTR = 2,  /* a signal interrupted the read; call again or stop */
};

/* path "-" = stdin (not closed by cli_input_close). PG_EIO names the file. */
int cli_input_open(cli_input **out, const char *path, pg_error *err);
void cli_input_close(cli_input *in); /* accepts NULL */

/* Next non-blank line: *line is borrowed until the next call (NUL-terminated
 * at *len), *line_no is 1-based. Returns CLI_INPUT_LINE, CLI_INPUT_EOF,
 * CLI_INPUT_EINTR, or PG_EIO / PG_ENOMEM. */
int cli_input_next(cli_input *in, const char **line, size_t *len, int64_t *line_no, pg_error *err);
/* The next non-blank line without consuming it (format detection). */
int cli_input_peek(cli_input *in, const char **line, size_t *len, pg_error *err);

/* Non-blank lines of a regular file (a quick counting pass for the progress
 * total), or -1 for stdin, pipes and unreadable files. */
int64_t cli_input_count(const char *path);

#endif /* PG_CLI_INPUT_H */
