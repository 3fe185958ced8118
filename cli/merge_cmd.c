/* merge_cmd: `pagedgen merge -i INPUT [-o OUT] SHARD_OUTPUT...` — shard
 * outputs joined into input order (cli/README.md "Shards, schedulers and
 * merge").
 *
 * A shard's output holds its requests' records in input order (a resumed
 * shard is sorted back when it finishes: shard.h), so the merge is the
 * walk of merge_walk.h over the shard files; multi_device.c runs the same
 * walk over its workers' pipes. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "input.h"
#include "merge_walk.h"
#include "json.h"
#include "output.h"
#include "request_parse.h"
#include "resume.h"
#include "run.h"
#include "shard.h"

static void say(merge_state *ms, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void say(merge_state *ms, const char *fmt, ...)
{
    if ((ms->hush && *ms->hush) || ms->listed++ >= MERGE_LIST_MAX)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "pagedgen: %s: ", ms->label ? ms->label : "merge");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int cli_merge_advance(merge_state *ms, merge_shard *s)
{
    free(s->key);
    s->key = NULL;
    s->key_len = 0;
    s->len = getline(&s->line, &s->cap, s->f);
    if (s->len <= 0) {
        if (ferror(s->f))
            return pg_error_set(&ms->err, PG_EIO, "%s: read error", s->path);
        free(s->line);
        s->line = NULL;
        s->cap = 0;
        return PG_OK;
    }
    s->line_no++;
    if (s->line[s->len - 1] != '\n' && ms->cut_partial) {
        s->cut_bytes += s->len;
        free(s->line);
        s->line = NULL;
        s->cap = 0;
        return PG_OK;
    }
    if (s->line[s->len - 1] != '\n')
        return pg_error_set(&ms->err, PG_EFORMAT, "%s line %lld: a partial last line (the shard did not finish: "
                            "rerun it with --resume)", s->path, (long long)s->line_no);
    int rc = cli_record_key(s->line, (size_t)s->len - 1, &s->key, &s->key_len);
    return rc < 0 ? pg_error_set(&ms->err, PG_ENOMEM, "out of memory") : PG_OK;
}

/* The key a request's result record carries (NULL: only an error record of
 * its line can answer it), by the input rules of request_parse: text lines
 * and jsonl lines without an id are their index; openai lines their
 * custom_id. A line the run refused has an error record, matched by line. */
static char *request_key(cli_format fmt, const char *line, size_t len, int64_t index, size_t *klen)
{
    char buf[48];
    int n;
    if (fmt == CLI_FORMAT_TEXT) {
        n = snprintf(buf, sizeof buf, "n:%lld", (long long)index);
        *klen = (size_t)n;
        return strdup(buf);
    }
    json_doc d;
    if (json_parse(&d, line, len, "input", NULL) != PG_OK)
        return NULL;
    char *key = NULL;
    if (json_is_object(&d, 0)) {
        int id = json_obj_get(&d, 0, fmt == CLI_FORMAT_OPENAI ? "custom_id" : "id");
        int64_t v;
        char *str = NULL;
        size_t sl = 0;
        if (id < 0 && fmt == CLI_FORMAT_JSONL) {
            n = snprintf(buf, sizeof buf, "n:%lld", (long long)index);
            *klen = (size_t)n;
            key = strdup(buf);
        } else if (id >= 0 && json_is_string(&d, id) && json_get_string(&d, id, &str, &sl, NULL) == PG_OK) {
            key = malloc(sl + 3);
            if (key) {
                memcpy(key, "s:", 2);
                memcpy(key + 2, str, sl + 1);
                *klen = sl + 2;
            }
            free(str);
        } else if (id >= 0 && json_is_number(&d, id) && json_get_int(&d, id, INT64_MIN, INT64_MAX, &v, NULL) == PG_OK) {
            n = snprintf(buf, sizeof buf, "n:%lld", (long long)v);
            *klen = (size_t)n;
            key = strdup(buf);
        }
    }
    json_doc_free(&d);
    return key;
}

static bool answers(const merge_shard *s, const char *req_key, size_t req_len, const char *line_key,
                    size_t line_len)
{
    if (!s->line || !s->key)
        return false;
    if (s->key_len == line_len && memcmp(s->key, line_key, line_len) == 0)
        return true;
    return req_key && s->key[0] != 'L' && s->key_len == req_len && memcmp(s->key, req_key, req_len) == 0;
}

/* Markers, names and the input: which file is shard K, and are they one
 * job's? Returns CLI_EXIT_OK or the code to exit with (2 refused, 4 I/O). */
static int check_shards(merge_state *ms, cli_format *fmt)
{
    const cli_options *o = ms->o;
    int32_t n = 0;
    const char *n_from = NULL;
    cli_shard_marker *mk = calloc((size_t)o->n_merge_files, sizeof *mk);
    int32_t *ks = calloc((size_t)o->n_merge_files, sizeof *ks);
    bool *fin = calloc((size_t)o->n_merge_files, sizeof *fin);
    int code = CLI_EXIT_OK;
    if (!mk || !ks || !fin) {
        fprintf(stderr, "pagedgen: merge: out of memory\n");
        code = CLI_EXIT_IO;
        goto out;
    }
    for (int32_t i = 0; i < o->n_merge_files && code == CLI_EXIT_OK; i++) {
        const char *f = o->merge_files[i];
        int32_t k = 0, nn = 0;
        int rc = cli_shard_marker_read(f, &mk[i], &ms->err);
        if (rc == PG_OK) {
            fin[i] = true;
            k = mk[i].k;
            nn = mk[i].n;
        } else if (rc == CLI_SHARD_NO_MARKER) {
            if (access(f, R_OK) != 0) {
                fprintf(stderr, "pagedgen: merge: %s: %s\n", f, strerror(errno));
                code = CLI_EXIT_IO;
                break;
            }
            if (!cli_shard_name_parse(f, &k, &nn)) {
                fprintf(stderr, "pagedgen: merge: %s: no marker %s.done and no .K-of-N. in its name: cannot tell "
                                "which shard it is\n", f, f);
                code = CLI_EXIT_USAGE;
                break;
            }
        } else {
            fprintf(stderr, "pagedgen: merge: %s\n", ms->err.msg);
            code = rc == PG_EIO ? CLI_EXIT_IO : CLI_EXIT_USAGE;
            break;
        }
        ks[i] = k;
        if (n == 0) {
            n = nn;
            n_from = f;
        } else if (nn != n) {
            fprintf(stderr, "pagedgen: merge: %s is shard %d of %d, but %s is one of %d: refused\n", f, (int)k,
                    (int)nn, n_from, (int)n);
            code = CLI_EXIT_USAGE;
        }
    }
    if (code != CLI_EXIT_OK)
        goto out;
    ms->n = n;
    ms->sh = calloc((size_t)n, sizeof *ms->sh);
    if (!ms->sh) {
        fprintf(stderr, "pagedgen: merge: out of memory\n");
        code = CLI_EXIT_IO;
        goto out;
    }
    for (int32_t i = 0; i < o->n_merge_files && code == CLI_EXIT_OK; i++) {
        merge_shard *s = &ms->sh[ks[i]];
        if (s->path) {
            fprintf(stderr, "pagedgen: merge: shard %d of %d given twice (%s and %s): refused\n", (int)ks[i],
                    (int)n, s->path, o->merge_files[i]);
            code = CLI_EXIT_USAGE;
            break;
        }
        s->path = o->merge_files[i];
        s->finished = fin[i];
        s->m = mk[i];
        mk[i].flags = NULL; /* moved */
    }
    if (code != CLI_EXIT_OK)
        goto out;
    /* one job: the same input, flags and format in every marker */
    int64_t in_bytes = 0;
    uint64_t in_hash = 0;
    if (cli_shard_hash_file(o->input_path, &in_bytes, &in_hash, NULL, &ms->err) != PG_OK) {
        fprintf(stderr, "pagedgen: merge: %s\n", ms->err.msg);
        code = CLI_EXIT_IO;
        goto out;
    }
    const merge_shard *first = NULL;
    for (int32_t k = 0; k < n && code == CLI_EXIT_OK; k++) {
        const merge_shard *s = &ms->sh[k];
        if (!s->path || !s->finished)
            continue;
        if (s->m.input_bytes != in_bytes || s->m.input_hash != in_hash) {
            fprintf(stderr, "pagedgen: merge: %s was made from another input (%lld bytes, fnv1a64 %016llx; %s "
                            "has %lld bytes, %016llx): refused\n", s->path, (long long)s->m.input_bytes,
                    (unsigned long long)s->m.input_hash, o->input_path, (long long)in_bytes,
                    (unsigned long long)in_hash);
            code = CLI_EXIT_USAGE;
            break;
        }
        struct stat st;
        if (stat(s->path, &st) != 0 || (int64_t)st.st_size != s->m.output_bytes) {
            fprintf(stderr, "pagedgen: merge: %s changed since its shard finished (%lld bytes, its marker says "
                            "%lld): refused\n", s->path, (long long)(stat(s->path, &st) == 0 ? st.st_size : -1),
                    (long long)s->m.output_bytes);
            code = CLI_EXIT_USAGE;
            break;
        }
        if (!first) {
            first = s;
            continue;
        }
        if (strcmp(s->m.flags, first->m.flags) != 0 || strcmp(s->m.format, first->m.format) != 0) {
            fprintf(stderr, "pagedgen: merge: %s was made with other output-shaping flags than %s: refused\n"
                            "  %s: %s %s\n  %s: %s %s\n", s->path, first->path, s->path, s->m.format, s->m.flags,
                    first->path, first->m.format, first->m.flags);
            code = CLI_EXIT_USAGE;
        }
    }
    if (code != CLI_EXIT_OK)
        goto out;
    if (first) {
        *fmt = strcmp(first->m.format, "text") == 0 ? CLI_FORMAT_TEXT
               : strcmp(first->m.format, "openai") == 0 ? CLI_FORMAT_OPENAI : CLI_FORMAT_JSONL;
    }
out:
    for (int32_t i = 0; mk && i < o->n_merge_files; i++)
        cli_shard_marker_free(&mk[i]);
    free(mk);
    free(ks);
    free(fin);
    return code;
}

/* The input's format when no marker says it: detected from its first line. */
static int detect_format(merge_state *ms, cli_format *fmt)
{
    cli_input *in;
    if (cli_input_open(&in, ms->o->input_path, &ms->err) != PG_OK)
        return PG_EIO;
    const char *line;
    size_t len;
    int rc = cli_input_peek(in, &line, &len, &ms->err);
    *fmt = rc == CLI_INPUT_LINE ? cli_detect_format(line, len) : CLI_FORMAT_JSONL;
    cli_input_close(in);
    return rc < 0 ? PG_EIO : PG_OK;
}

int cli_merge_walk(merge_state *ms, cli_format fmt, int out_fd, int64_t *requests)
{
    const char *unit = ms->unit ? ms->unit : "shard";
    cli_input *in;
    if (cli_input_open(&in, ms->o->input_path, &ms->err) != PG_OK)
        return PG_EIO;
    int rc = PG_OK;
    int64_t index = 0;
    for (;;) {
        const char *line;
        size_t len;
        int64_t line_no;
        int r = cli_input_next(in, &line, &len, &line_no, &ms->err);
        if (r == CLI_INPUT_EINTR)
            continue;
        if (r == CLI_INPUT_EOF)
            break;
        if (r < 0) {
            rc = r;
            break;
        }
        size_t req_len = 0;
        char *req = request_key(fmt, line, len, index, &req_len);
        char lk[32];
        int ll = snprintf(lk, sizeof lk, "L:%lld", (long long)line_no);
        merge_shard *s = &ms->sh[index % ms->n];
        const char *shown = req ? req + 2 : "-";
        /* a record in its stream first: a line whose id an earlier line also
         * has is kept by that id, yet gets its own error record */
        bool here = s->path && answers(s, req, req_len, lk, (size_t)ll);
        int prior = !here && ms->kept ? cli_resume_lookup(ms->kept, req, req_len, line_no) : CLI_RESUME_NEW;
        if (prior != CLI_RESUME_NEW) {
            ms->skipped++; /* answered by an earlier run: its stream has no record for it */
            ms->skipped_errors += prior == CLI_RESUME_ERROR;
        } else if (!s->path) {
            ms->missing++;
            say(ms, "missing: id %s (line %lld): its %s %lld was not given", shown, (long long)line_no, unit,
                (long long)(index % ms->n));
        } else if (!here) {
            ms->missing++;
            say(ms, "missing: id %s (line %lld): no record in %s %lld's output at this point", shown,
                (long long)line_no, unit, (long long)(index % ms->n));
        } else {
            if (out_fd >= 0 && cli_write_all(out_fd, s->line, (size_t)s->len, &ms->err) != PG_OK)
                rc = PG_EIO;
            ms->written++;
            ms->written_errors += s->key[0] == 'L';
            if (rc == PG_OK)
                rc = cli_merge_advance(ms, s);
            while (rc == PG_OK && answers(s, req, req_len, lk, (size_t)ll)) {
                ms->duplicate++;
                say(ms, "duplicate: id %s (line %lld) answered again at line %lld of its %s's output", shown,
                    (long long)line_no, (long long)s->line_no, unit);
                rc = cli_merge_advance(ms, s);
            }
        }
        free(req);
        index++;
        if (rc != PG_OK)
            break;
    }
    cli_input_close(in);
    *requests = index;
    for (int32_t k = 0; k < ms->n && rc == PG_OK; k++) {
        merge_shard *s = &ms->sh[k];
        while (rc == PG_OK && s->path && s->line) {
            ms->extra++;
            if (ms->listed++ < MERGE_LIST_MAX)
                fprintf(stderr, "pagedgen: %s: %s line %lld: a record that answers no request of %s %d in "
                                "input order (%s)\n", ms->label ? ms->label : "merge", s->path,
                        (long long)s->line_no, unit, (int)k, s->key ? s->key : "not a record");
            rc = cli_merge_advance(ms, s);
        }
    }
    return rc;
}

int cli_run_merge(const cli_options *o)
{
    merge_state ms;
    memset(&ms, 0, sizeof ms);
    ms.o = o;
    cli_format fmt = CLI_FORMAT_AUTO;
    int code = check_shards(&ms, &fmt);
    char *tmp = NULL;
    int out_fd = -1;
    bool to_file = strcmp(o->output_path, "-") != 0;
    if (code != CLI_EXIT_OK)
        goto done;
    if (fmt == CLI_FORMAT_AUTO && detect_format(&ms, &fmt) != PG_OK) {
        fprintf(stderr, "pagedgen: merge: %s\n", ms.err.msg);
        code = CLI_EXIT_IO;
        goto done;
    }
    int32_t absent = 0, unfinished = 0;
    for (int32_t k = 0; k < ms.n; k++) {
        merge_shard *s = &ms.sh[k];
        if (!s->path) {
            absent++;
            fprintf(stderr, "pagedgen: merge: shard %d of %d is missing (no output given for it)\n", (int)k,
                    (int)ms.n);
            continue;
        }
        if (!s->finished) {
            unfinished++;
            fprintf(stderr, "pagedgen: merge: %s (shard %d of %d) has no marker %s.done: it has not finished "
                            "(rerun it with --resume)\n", s->path, (int)k, (int)ms.n, s->path);
        }
        if (!(s->f = fopen(s->path, "rb"))) {
            fprintf(stderr, "pagedgen: merge: %s: %s\n", s->path, strerror(errno));
            code = CLI_EXIT_IO;
            goto done;
        }
        if (cli_merge_advance(&ms, s) != PG_OK) {
            fprintf(stderr, "pagedgen: merge: %s\n", ms.err.msg);
            code = CLI_EXIT_IO;
            goto done;
        }
    }
    bool may_write = absent == 0 && unfinished == 0;
    if (may_write && to_file) {
        tmp = malloc(strlen(o->output_path) + 5);
        if (!tmp) {
            code = CLI_EXIT_IO;
            goto done;
        }
        sprintf(tmp, "%s.tmp", o->output_path);
        out_fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (out_fd < 0) {
            fprintf(stderr, "pagedgen: merge: %s: cannot create: %s\n", tmp, strerror(errno));
            code = CLI_EXIT_IO;
            goto done;
        }
    } else if (may_write) {
        out_fd = STDOUT_FILENO;
    }
    int64_t requests = 0;
    int rc = cli_merge_walk(&ms, fmt, out_fd, &requests);
    if (rc != PG_OK) {
        fprintf(stderr, "pagedgen: merge: %s\n", ms.err.msg);
        code = rc == PG_ENOMEM || rc == PG_EIO ? CLI_EXIT_IO : CLI_EXIT_LINES_FAILED;
        goto done;
    }
    int64_t problems = ms.missing + ms.duplicate + ms.extra;
    if (ms.listed > MERGE_LIST_MAX)
        fprintf(stderr, "pagedgen: merge: ... and %lld more\n", (long long)(ms.listed - MERGE_LIST_MAX));
    if (problems > 0 || !may_write) {
        fprintf(stderr, "pagedgen: merge: %lld requests: %lld missing, %lld answered twice, %lld records that "
                        "answer none; %s\n", (long long)requests, (long long)ms.missing, (long long)ms.duplicate,
                (long long)ms.extra, !may_write || to_file ? "nothing written" : "stdout is incomplete");
        code = CLI_EXIT_LINES_FAILED;
        goto done;
    }
    if (to_file) {
        if (fsync(out_fd) != 0 || close(out_fd) != 0) {
            out_fd = -1;
            fprintf(stderr, "pagedgen: merge: %s: write error: %s\n", tmp, strerror(errno));
            code = CLI_EXIT_IO;
            goto done;
        }
        out_fd = -1;
        if (rename(tmp, o->output_path) != 0) {
            fprintf(stderr, "pagedgen: merge: cannot rename %s to %s: %s\n", tmp, o->output_path, strerror(errno));
            code = CLI_EXIT_IO;
            goto done;
        }
        free(tmp);
        tmp = NULL;
        fprintf(stderr, "pagedgen: merge: %d shards, %lld requests, each answered once: %s\n", (int)ms.n,
                (long long)requests, o->output_path);
    }
done:
    if (out_fd > STDERR_FILENO)
        close(out_fd);
    if (tmp)
        unlink(tmp);
    free(tmp);
    for (int32_t k = 0; ms.sh && k < ms.n; k++) {
        merge_shard *s = &ms.sh[k];
        if (s->f)
            fclose(s->f);
        free(s->line);
        free(s->key);
        cli_shard_marker_free(&s->m);
    }
    free(ms.sh);
    return code;
}
