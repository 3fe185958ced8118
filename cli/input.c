/* input: getline over a FILE (see input.h). */
#include "input.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct cli_input {
    FILE *f;
    bool is_stdin;
    const char *path;
    char *buf;          /* getline's buffer */
    size_t cap;
    size_t len;         /* of the current line */
    int64_t line_no;    /* of the current line */
    bool peeked;        /* buf holds a line not yet handed out by next() */
};

int cli_input_open(cli_input **out, const char *path, pg_error *err)
{
    *out = NULL;
    cli_input *in = calloc(1, sizeof *in);
    if (!in)
        return pg_error_set(err, PG_ENOMEM, "out of memory");
    in->path = path;
    if (strcmp(path, "-") == 0) {
        in->f = stdin;
        in->is_stdin = true;
    } else {
        in->f = fopen(path, "rb");
        if (!in->f) {
            int e = errno;
            free(in);
            return pg_error_set(err, PG_EIO, "%s: cannot open input: %s", path, strerror(e));
        }
    }
    *out = in;
    return PG_OK;
}

void cli_input_close(cli_input *in)
{
    if (!in)
        return;
    if (!in->is_stdin)
        fclose(in->f);
    free(in->buf);
    free(in);
}

static bool blank(const char *s, size_t n)
{
    for (size_t k = 0; k < n; k++)
        if (s[k] != ' ' && s[k] != '\t' && s[k] != '\r')
            return false;
    return true;
}

/* Reads lines into buf until a non-blank one. */
static int read_line(cli_input *in, pg_error *err)
{
    for (;;) {
        errno = 0;
        ssize_t n = getline(&in->buf, &in->cap, in->f);
        if (n < 0) {
            if (ferror(in->f)) {
                int e = errno;
                clearerr(in->f);
                if (e == EINTR)
                    return CLI_INPUT_EINTR;
                return pg_error_set(err, PG_EIO, "%s: read error: %s",
                                    in->is_stdin ? "stdin" : in->path, strerror(e));
            }
            return CLI_INPUT_EOF;
        }
        in->line_no++;
        size_t len = (size_t)n;
        if (len && in->buf[len - 1] == '\n')
            len--;
        if (len && in->buf[len - 1] == '\r')
            len--;
        in->buf[len] = '\0';
        if (blank(in->buf, len))
            continue;
        in->len = len;
        return CLI_INPUT_LINE;
    }
}

int cli_input_peek(cli_input *in, const char **line, size_t *len, pg_error *err)
{
    if (!in->peeked) {
        int rc = read_line(in, err);
        if (rc != CLI_INPUT_LINE)
            return rc;
        in->peeked = true;
    }
    *line = in->buf;
    *len = in->len;
    return CLI_INPUT_LINE;
}

int cli_input_next(cli_input *in, const char **line, size_t *len, int64_t *line_no, pg_error *err)
{
    if (!in->peeked) {
        int rc = read_line(in, err);
        if (rc != CLI_INPUT_LINE)
            return rc;
    }
    in->peeked = false;
    *line = in->buf;
    *len = in->len;
    *line_no = in->line_no;
    return CLI_INPUT_LINE;
}

int64_t cli_input_count(const char *path)
{
    if (strcmp(path, "-") == 0)
        return -1;
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return -1;
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    char chunk[1 << 16];
    int64_t count = 0;
    bool nonblank = false;
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        for (size_t k = 0; k < n; k++) {
            char c = chunk[k];
            if (c == '\n') {
                count += nonblank;
                nonblank = false;
            } else if (c != ' ' && c != '\t' && c != '\r') {
                nonblank = true;
            }
        }
    }
    count += nonblank;
    fclose(f);
    return count;
}
