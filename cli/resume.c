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
    int64_t kept_bytes;   /* the file's size after the cut */
};

void cli_resume_destroy(cli_resume *r)
{
    if (!r)
        return;
    cli_id_set_destroy(r->keys);
    free(r);
}

static char *make_key(const char *prefix, const char *s, size_t len, size_t *out_len)
{
    size_t pl = strlen(prefix);
    char *k = malloc(pl + len + 1);
    if (!k)
        return NULL;
    memcpy(k, prefix, pl);
    memcpy(k + pl, s, len);
    k[pl + len] = '\0';
    *out_len = pl + len;
    return k;
}

int cli_record_key(const char *line, size_t len, char **key, size_t *key_len)
{
    *key = NULL;
    *key_len = 0;
    json_doc d;
    if (json_parse(&d, line, len, "output", NULL) != PG_OK)
        return 0;
    int rc = 0;
    char buf[32];
    if (!json_is_object(&d, 0))
        goto done;
    int e = json_obj_get(&d, 0, "error");
    if (e >= 0 && json_is_object(&d, e)) {
        int l = json_obj_get(&d, e, "line");
        int64_t v;
        if (l >= 0 && json_get_int(&d, l, 1, INT64_MAX, &v, NULL) == PG_OK) {
            int n = snprintf(buf, sizeof buf, "%lld", (long long)v);
            rc = (*key = make_key("L:", buf, (size_t)n, key_len)) ? 1 : PG_ENOMEM;
        }
        goto done;
    }
    int id = json_obj_get(&d, 0, "custom_id");
    if (id < 0)
        id = json_obj_get(&d, 0, "id");
    if (json_is_string(&d, id)) {
        char *str = NULL;
        size_t n = 0;
        if (json_get_string(&d, id, &str, &n, NULL) == PG_OK) {
            rc = (*key = make_key("s:", str, n, key_len)) ? 1 : PG_ENOMEM;
            free(str);
        }
    } else if (json_is_number(&d, id)) {
        int64_t v;
        if (json_get_int(&d, id, INT64_MIN, INT64_MAX, &v, NULL) == PG_OK) {
            int n = snprintf(buf, sizeof buf, "%lld", (long long)v);
            rc = (*key = make_key("n:", buf, (size_t)n, key_len)) ? 1 : PG_ENOMEM;
        }
    }
done:
    json_doc_free(&d);
    return rc;
}

/* One complete output line at byte `offset` -> its key (the first record
 * of a key keeps it). Lines that are not records are ignored. */
static int scan_line(cli_resume *r, const char *line, size_t len, int64_t offset)
{
    char *key;
    size_t klen;
    int rc = cli_record_key(line, len, &key, &klen);
    if (rc <= 0)
        return rc;
    rc = cli_id_set_add(r->keys, key, klen, offset, NULL);
    free(key);
    if (rc < 0)
        return rc;
    r->records++;
    return PG_OK;
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
        rc = scan_line(r, buf, (size_t)n - 1, good_end);
        good_end = end;
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
    r->kept_bytes = good_end;
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

int64_t cli_resume_offset(const cli_resume *r, const char *id_key, size_t key_len, int64_t line)
{
    int64_t v;
    if (!r)
        return -1;
    if (id_key && cli_id_set_get(r->keys, id_key, key_len, &v))
        return v;
    char buf[32];
    int n = snprintf(buf, sizeof buf, "L:%lld", (long long)line);
    return cli_id_set_get(r->keys, buf, (size_t)n, &v) ? v : -1;
}

int64_t cli_resume_kept_bytes(const cli_resume *r) { return r ? r->kept_bytes : 0; }
int64_t cli_resume_records(const cli_resume *r) { return r ? r->records : 0; }
int64_t cli_resume_cut_bytes(const cli_resume *r) { return r ? r->cut_bytes : 0; }
