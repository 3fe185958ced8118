/* line_tool: see line_tool.h. */
#include "line_tool.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "output.h"
#include "run.h"

void cli_line_error(json_buf *out, const char *msg, int64_t line_no)
{
    json_buf_puts(out, "{\"error\":{\"message\":");
    json_buf_string(out, msg, strlen(msg));
    json_buf_printf(out, ",\"line\":%lld}}\n", (long long)line_no);
}

int cli_line_tool_run(const cli_options *o, cli_input *in, cli_line_fn fn, void *ctx)
{
    int fd;
    if (strcmp(o->output_path, "-") == 0) {
        fd = STDOUT_FILENO;
    } else if ((fd = open(o->output_path, O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0) {
        fprintf(stderr, "pagedgen: %s: cannot open output: %s\n", o->output_path, strerror(errno));
        return CLI_EXIT_IO;
    }
    int code = CLI_EXIT_OK;
    int64_t failed = 0;
    for (;;) {
        const char *line;
        size_t len;
        int64_t line_no;
        pg_error err;
        if (cli_signals_stop_requested()) {
            code = CLI_EXIT_INTERRUPTED;
            break;
        }
        int rc = cli_input_next(in, &line, &len, &line_no, &err);
        if (rc == CLI_INPUT_EINTR)
            continue;
        if (rc == CLI_INPUT_EOF)
            break;
        if (rc < 0) {
            fprintf(stderr, "pagedgen: %s\n", err.msg);
            code = CLI_EXIT_IO;
            break;
        }
        json_buf b = {0};
        if (!fn(ctx, line, len, line_no, &b))
            failed++;
        if (b.oom || cli_write_all(fd, b.data, b.len, &err) != PG_OK) {
            fprintf(stderr, "pagedgen: %s: %s\n", o->output_path, b.oom ? "out of memory" : err.msg);
            json_buf_free(&b);
            code = CLI_EXIT_IO;
            break;
        }
        json_buf_free(&b);
    }
    if (code == CLI_EXIT_OK && failed > 0)
        code = CLI_EXIT_LINES_FAILED;
    if (fd > STDERR_FILENO)
        close(fd);
    return code;
}
