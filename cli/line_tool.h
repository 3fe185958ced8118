/* line_tool: the loop shared by the line-by-line subcommands (`tokenize`,
 * `chat-template`): one JSON record per non-blank input line, in input
 * order, each written with one write(); SIGINT/SIGTERM stop between lines;
 * a line the callback answers with an error record makes the exit code
 * CLI_EXIT_LINES_FAILED. */
#ifndef PG_CLI_LINE_TOOL_H
#define PG_CLI_LINE_TOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "input.h"
#include "json.h"
#include "options.h"

/* Appends the record for one input line (with its final "\n") to out;
 * returns false when that record is an error record. */
typedef bool (*cli_line_fn)(void *ctx, const char *line, size_t len, int64_t line_no, json_buf *out);

/* Opens o->output_path ("-" = stdout), runs fn over every line of `in`
 * (borrowed: the caller opened it and closes it) and returns the exit code
 * (CLI_EXIT_OK, _LINES_FAILED, _IO, _INTERRUPTED); messages go to stderr. */
int cli_line_tool_run(const cli_options *o, cli_input *in, cli_line_fn fn, void *ctx);

/* Appends {"error": {"message": msg, "line": line_no}}\n. */
void cli_line_error(json_buf *out, const char *msg, int64_t line_no);

#endif /* PG_CLI_LINE_TOOL_H */
