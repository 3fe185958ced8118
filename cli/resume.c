/* resume: scan and repair an earlier output file (see resume.h). */
#include "resume.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "id_set.h"
#include "json.h"

struct cli_resume {
    cli_id_set *keys;     /* "s:<id>", "n:<id>" for results, "L:<line>" for errors */
    int64_t records;
    int64_t cut_bytes;
};

void cli_resume_destroy(cli_resume *r)
{
    if (!r)
        return;
    cli_id_set_destroy(r->keys);
    free(r);
}

static int add_key(cli_resume *r, const char *prefix, const char *s, size_t len)
{
    size_t pl = strlen(prefix);
    char *k = malloc(pl + len + 1);
    if (!k)
        return PG_ENOMEM;
    memcpy(k, prefix, pl);
    memcpy(k + pl, s, len);
    k[pl + len] = '\0';
    int rc = cli_id_set_add(r->keys, k, pl + len, 0, NULL);
    free(k);
    return rc < 0 ? rc : PG_OK;
}

/* One complete output line -> its key. Lines that are not records are ignored. */
static int scan_line(cli_resume *r, const char *line, size_t len)
{
    json_doc d;
    if (json_parse(&d, line, len, "output", NULL) != PG_OK)
        return PG_OK;
    int rc = PG_OK;
    if (!json_is_object(&d, 0))
        goto done;
    int e = json_obj_get(&d, 0, "error");
    if (e >= 0 && json_is_object(&d, e)) {
        int l = json_obj_get(&d, e, "line");
        int64_t v;
        if (l >= 0 && json_get_int(&d, l, 1, INT64_MAX, &v, NULL) == PG_OK) {
            char buf[32];
            int n = snprintf(buf, sizeof buf, "%lld", (long long)v);
            rc = add_key(r, "L:", buf, (size_t)n);
            r->records++;
        }
        goto done;
    }
    int id = json_obj_get(&d, 0, "custom_id");
    if (id < 0)
        id = json_obj_get(&d, 0, "id");
    if (json_is_string(&d, id)) {
        char *s = NULL;
        size_t n = 0;
        if (json_get_string(&d, id, &s, &n, NULL) == PG_OK) {
            rc = add_key(r, "s:", s, n);
            free(s);
            r->records++;
        }
    } else if (json_is_number(&d, id)) {
        int64_t v;
        if (json_get_int(&d, id, INT64_MIN, INT64_MAX, &v, NULL) == PG_OK) {
            char buf[32];
            int n = snprintf(buf, sizeof buf, "%lld", (long long)v);
            rc = add_key(r, "n:", buf, (size_t)n);
            r->records++;
        }
    }
done:
    json_doc_free(&d);
    return rc;
}

int cli_resume_load(cli_resume **out, const char *path, pg_error *err)
{
    *out = NULL;
    cli_resume *r = calloc(1, sizeof *r);
    if (!r || !(r->keys = cli_id_set_create())) {
        free(r);
        return pg_error_set(err, PG_ENOMEM, "out of memory");
    }
    FILE *f = fopen(path, "r+b");
    if (!f) {
        if (errno == ENOENT) {
            *out = r;
            return PG_OK;
        }
        int e = errno;
        cli_resume_destroy(r);
        return pg_error_set(err, PG_EIO, "%s: cannot open for --resume: %s", path, strerror(e));
    }
    char *buf = NULL;
    size_t cap = 0;
    long long good_end = 0; /* offset just past the last complete line */
    long long end = 0;
    ssize_t n;
    int rc = PG_OK;
    while ((n = getline(&buf, &cap, f)) > 0) {
        end += n;
        if (buf[n - 1] != '\n')
            break; /* partial last line */
        good_end = end;
        rc = scan_line(r, buf, (size_t)n - 1);
        if (rc != PG_OK)
            break;
    }
    free(buf);
    if (rc == PG_OK && ferror(f))
        rc = pg_error_set(err, PG_EIO, "%s: read error during --resume", path);
    else if (rc != PG_OK)
        pg_error_set(err, rc, "out of memory");
    if (rc == PG_OK && end > good_end) {
        r->cut_bytes = end - good_end;
        if (fflush(f) != 0 || ftruncate(fileno(f), (off_t)good_end) != 0)
            rc = pg_error_set(err, PG_EIO, "%s: cannot cut the partial last line: %s", path, strerror(errno));
    }
    fclose(f);
    if (rc != PG_OK) {
        cli_resume_destroy(r);
        return rc;
    }
    *out = r;
    return PG_OK;
}

int cli_resume_lookup(const cli_resume *r, const char *id_key, size_t key_len, int64_t line)
{
    if (!r)
        return CLI_RESUME_NEW;
    if (id_key && cli_id_set_has(r->keys, id_key, key_len))
        return CLI_RESUME_RESULT;
    char buf[32];
    int n = snprintf(buf, sizeof buf, "L:%lld", (long long)line);
    return cli_id_set_has(r->keys, buf, (size_t)n) ? CLI_RESUME_ERROR : CLI_RESUME_NEW;
}

int64_t cli_resume_records(const cli_resume *r) { return r ? r->records : 0; }
int64_t cli_resume_cut_bytes(const cli_resume *r) { return r ? r->cut_bytes : 0; }
