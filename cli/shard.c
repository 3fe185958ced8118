/* shard: scheduler variables, shard output names, markers (see shard.h). */
#include "shard.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "file_io.h"
#include "json.h"

#define SHARD_MAX_N 1000000 /* as --shard K/N */

/* ---- --shard auto ------------------------------------------------------------ */

/* A whole decimal number in [0, SHARD_MAX_N] (as the schedulers write them). */
static bool env_num(const char *s, int64_t *out)
{
    if (!s || !*s)
        return false;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE || v < 0 || v > SHARD_MAX_N)
        return false;
    *out = v;
    return true;
}

/* Reads variable `name` as a number: 1 set and valid, 0 unset, PG_EINVAL
 * (with err) set but not a number. */
static int get_num(cli_env_lookup env, void *ctx, const char *name, int64_t *out, pg_error *err)
{
    const char *v = env(ctx, name);
    if (!v)
        return 0;
    if (!env_num(v, out))
        return pg_error_set(err, PG_EINVAL, "--shard auto: %s='%s' is not a whole number in [0, %d]", name, v,
                            SHARD_MAX_N);
    return 1;
}

static int check_count(int64_t sched_n, const char *what, int32_t n_given, pg_error *err)
{
    if (n_given > 0 && sched_n != n_given)
        return pg_error_set(err, PG_EINVAL, "--shard auto/%d: %s says the array has %lld tasks", (int)n_given,
                            what, (long long)sched_n);
    return PG_OK;
}

static int from_slurm(cli_env_lookup env, void *ctx, int64_t id, int32_t n_given, int64_t *k, int64_t *n,
                      char *source, size_t cap, pg_error *err)
{
    int64_t min = 0, max = 0, step = 1, count = 0;
    int has_min = get_num(env, ctx, "SLURM_ARRAY_TASK_MIN", &min, err);
    int has_max = has_min < 0 ? 0 : get_num(env, ctx, "SLURM_ARRAY_TASK_MAX", &max, err);
    int has_step = has_max < 0 ? 0 : get_num(env, ctx, "SLURM_ARRAY_TASK_STEP", &step, err);
    int has_count = has_step < 0 ? 0 : get_num(env, ctx, "SLURM_ARRAY_TASK_COUNT", &count, err);
    if (has_min < 0 || has_max < 0 || has_step < 0 || has_count < 0)
        return PG_EINVAL;
    if (!has_min)
        return pg_error_set(err, PG_EINVAL, "--shard auto: SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_MIN "
                                            "is not (sbatch sets both in a job array)");
    if (!has_step || step == 0)
        step = 1;
    if (id < min || (id - min) % step != 0)
        return pg_error_set(err, PG_EINVAL, "--shard auto: SLURM_ARRAY_TASK_ID=%lld is not SLURM_ARRAY_TASK_MIN=%lld "
                            "plus a multiple of SLURM_ARRAY_TASK_STEP=%lld", (long long)id, (long long)min,
                            (long long)step);
    *k = (id - min) / step;
    if (has_count) {
        if (count < 1)
            return pg_error_set(err, PG_EINVAL, "--shard auto: SLURM_ARRAY_TASK_COUNT=0");
        if (has_max && min + (count - 1) * step != max)
            return pg_error_set(err, PG_EINVAL, "--shard auto: the job array is not one evenly stepped range "
                                "(SLURM_ARRAY_TASK_MIN=%lld, _MAX=%lld, _STEP=%lld, _COUNT=%lld): submit it as "
                                "--array=A-B or --array=A-B:S", (long long)min, (long long)max, (long long)step,
                                (long long)count);
        if (check_count(count, "SLURM_ARRAY_TASK_COUNT", n_given, err) != PG_OK)
            return PG_EINVAL;
        *n = count;
    } else if (n_given > 0) {
        *n = n_given;
    } else {
        return pg_error_set(err, PG_EINVAL, "--shard auto: SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT "
                                            "is not: give the count, --shard auto/N");
    }
    snprintf(source, cap, "SLURM_ARRAY_TASK_ID=%lld (min %lld, step %lld, count %lld)", (long long)id,
             (long long)min, (long long)step, (long long)*n);
    return PG_OK;
}

int cli_shard_from_env(cli_env_lookup env, void *ctx, int32_t n_given, int32_t *k, int32_t *n,
                       char *source, size_t source_cap, pg_error *err)
{
    int64_t kk = 0, nn = 0, id = 0;
    int rc;
    if ((rc = get_num(env, ctx, "SLURM_ARRAY_TASK_ID", &id, err)) < 0)
        return rc;
    if (rc == 1) {
        if (from_slurm(env, ctx, id, n_given, &kk, &nn, source, source_cap, err) != PG_OK)
            return PG_EINVAL;
    } else if ((rc = get_num(env, ctx, "JOB_COMPLETION_INDEX", &id, err)) != 0) {
        if (rc < 0)
            return rc;
        if (n_given <= 0)
            return pg_error_set(err, PG_EINVAL, "--shard auto: JOB_COMPLETION_INDEX=%lld gives no count (a "
                                "Kubernetes pod is not told the Job's completions): use --shard auto/N with N "
                                "= spec.completions", (long long)id);
        kk = id;
        nn = n_given;
        snprintf(source, source_cap, "JOB_COMPLETION_INDEX=%lld", (long long)id);
    } else if ((rc = get_num(env, ctx, "AWS_BATCH_JOB_ARRAY_INDEX", &id, err)) != 0) {
        if (rc < 0)
            return rc;
        int64_t size = 0;
        int hs = get_num(env, ctx, "AWS_BATCH_JOB_ARRAY_SIZE", &size, err);
        if (hs < 0)
            return hs;
        if (hs == 1) {
            if (check_count(size, "AWS_BATCH_JOB_ARRAY_SIZE", n_given, err) != PG_OK)
                return PG_EINVAL;
            nn = size;
        } else if (n_given > 0) {
            nn = n_given;
        } else {
            return pg_error_set(err, PG_EINVAL, "--shard auto: AWS_BATCH_JOB_ARRAY_INDEX is set but "
                                                "AWS_BATCH_JOB_ARRAY_SIZE is not: give the count, --shard auto/N");
        }
        kk = id;
        snprintf(source, source_cap, "AWS_BATCH_JOB_ARRAY_INDEX=%lld, size %lld", (long long)id, (long long)nn);
    } else {
        return pg_error_set(err, PG_EINVAL, "--shard auto: no job array index in the environment (expected "
                                            "SLURM_ARRAY_TASK_ID, JOB_COMPLETION_INDEX or "
                                            "AWS_BATCH_JOB_ARRAY_INDEX); outside a scheduler use --shard K/N");
    }
    if (nn < 1 || kk >= nn)
        return pg_error_set(err, PG_EINVAL, "--shard auto: shard %lld of %lld does not exist (%s)", (long long)kk,
                            (long long)nn, source);
    *k = (int32_t)kk;
    *n = (int32_t)nn;
    return PG_OK;
}

/* ---- names ------------------------------------------------------------------- */

int cli_shard_output_path(const char *output, bool output_is_dir, const char *input, int32_t k,
                          int32_t n, char **out, pg_error *err)
{
    *out = NULL;
    char tag[48];
    snprintf(tag, sizeof tag, "%d-of-%d", (int)k, (int)n);
    json_buf b = {0};
    if (output_is_dir) {
        const char *base = strcmp(input, "-") == 0 ? "stdin" : input;
        const char *slash = strrchr(base, '/');
        if (slash)
            base = slash + 1;
        const char *dot = strrchr(base, '.');
        size_t blen = dot && dot != base ? (size_t)(dot - base) : strlen(base);
        if (blen == 0)
            return pg_error_set(err, PG_EINVAL, "-o %s: a directory, but the input '%s' has no file name to "
                                "name the shard after", output, input);
        size_t olen = strlen(output);
        json_buf_put(&b, output, olen);
        if (olen == 0 || output[olen - 1] != '/')
            json_buf_put(&b, "/", 1);
        json_buf_put(&b, base, blen);
        json_buf_printf(&b, ".%s.jsonl", tag);
    } else {
        const char *p = strstr(output, "{shard}");
        if (!p)
            return PG_OK;
        const char *s = output;
        for (; p; s = p + 7, p = strstr(s, "{shard}")) {
            json_buf_put(&b, s, (size_t)(p - s));
            json_buf_puts(&b, tag);
        }
        json_buf_puts(&b, s);
    }
    if (b.oom) {
        json_buf_free(&b);
        return pg_error_set(err, PG_ENOMEM, "out of memory");
    }
    *out = b.data;
    return PG_OK;
}

bool cli_shard_name_parse(const char *path, int32_t *k, int32_t *n)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    bool found = false;
    for (const char *p = strchr(base, '.'); p; p = strchr(p + 1, '.')) {
        const char *q = p + 1;
        char *end;
        if (*q < '0' || *q > '9')
            continue;
        errno = 0;
        long a = strtol(q, &end, 10);
        if (errno || strncmp(end, "-of-", 4) != 0)
            continue;
        q = end + 4;
        if (*q < '0' || *q > '9')
            continue;
        long b = strtol(q, &end, 10);
        if (errno || *end != '.' || b < 1 || b > SHARD_MAX_N || a < 0 || a >= b)
            continue;
        if (found)
            return false; /* ambiguous */
        found = true;
        *k = (int32_t)a;
        *n = (int32_t)b;
    }
    return found;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int cli_shard_flags_canonical(const char *raw, char **out)
{
    *out = NULL;
    char *copy = strdup(raw ? raw : "");
    if (!copy)
        return PG_ENOMEM;
    size_t cnt = 0;
    for (const char *p = copy; *p; p++)
        cnt += *p == '\n';
    char **lines = calloc(cnt + 1, sizeof *lines);
    if (!lines) {
        free(copy);
        return PG_ENOMEM;
    }
    size_t m = 0;
    for (char *p = copy, *nl; *p && (nl = strchr(p, '\n')); p = nl + 1) {
        *nl = '\0';
        lines[m++] = p;
    }
    qsort(lines, m, sizeof *lines, cmp_str);
    json_buf b = {0};
    json_buf_put(&b, "", 0);
    for (size_t i = 0; i < m; i++) {
        json_buf_puts(&b, lines[i]);
        json_buf_put(&b, "\n", 1);
    }
    free(lines);
    free(copy);
    if (b.oom || !b.data) {
        json_buf_free(&b);
        return PG_ENOMEM;
    }
    *out = b.data;
    return PG_OK;
}

/* ---- markers ----------------------------------------------------------------- */

void cli_shard_marker_free(cli_shard_marker *m)
{
    if (!m)
        return;
    free(m->flags);
    m->flags = NULL;
}

char *cli_shard_marker_path(const char *output)
{
    size_t n = strlen(output);
    char *p = malloc(n + 6);
    if (p) {
        memcpy(p, output, n);
        memcpy(p + n, ".done", 6);
    }
    return p;
}

int cli_shard_marker_write(const char *output, const cli_shard_marker *m, pg_error *err)
{
    char *path = cli_shard_marker_path(output);
    json_buf b = {0};
    json_buf_printf(&b, "{\"pagedgen_shard\":1,\"shard\":%d,\"of\":%d,\"input_bytes\":%lld,"
                        "\"input_fnv1a64\":\"%016" PRIx64 "\",\"format\":",
                    (int)m->k, (int)m->n, (long long)m->input_bytes, m->input_hash);
    json_buf_string(&b, m->format, strlen(m->format));
    json_buf_puts(&b, ",\"flags\":");
    json_buf_string(&b, m->flags ? m->flags : "", m->flags ? strlen(m->flags) : 0);
    json_buf_printf(&b, ",\"records\":%lld,\"output_bytes\":%lld,\"exit_code\":%d}\n", (long long)m->records,
                    (long long)m->output_bytes, (int)m->exit_code);
    char *tmp = path ? malloc(strlen(path) + 5) : NULL;
    if (!path || !tmp || b.oom) {
        free(path);
        free(tmp);
        json_buf_free(&b);
        return pg_error_set(err, PG_ENOMEM, "out of memory");
    }
    sprintf(tmp, "%s.tmp", path);
    int rc = PG_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        rc = pg_error_set(err, PG_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    } else {
        size_t off = 0;
        while (off < b.len) {
            ssize_t w = write(fd, b.data + off, b.len - off);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        if (off != b.len || fsync(fd) != 0)
            rc = pg_error_set(err, PG_EIO, "%s: cannot write: %s", tmp, strerror(errno));
        if (close(fd) != 0 && rc == PG_OK)
            rc = pg_error_set(err, PG_EIO, "%s: cannot write: %s", tmp, strerror(errno));
        if (rc == PG_OK && rename(tmp, path) != 0)
            rc = pg_error_set(err, PG_EIO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        if (rc != PG_OK)
            unlink(tmp);
    }
    free(tmp);
    free(path);
    json_buf_free(&b);
    return rc;
}

static int field_int(const json_doc *d, const char *path, const char *key, int64_t lo, int64_t hi, int64_t *v,
                     pg_error *err)
{
    int i = json_obj_get(d, 0, key);
    if (i < 0 || json_get_int(d, i, lo, hi, v, NULL) != PG_OK)
        return pg_error_set(err, PG_EFORMAT, "%s: not a shard marker: field '%s' missing or out of range", path,
                            key);
    return PG_OK;
}

int cli_shard_marker_parse(const char *buf, size_t len, const char *path, cli_shard_marker *m, pg_error *err)
{
    memset(m, 0, sizeof *m);
    json_doc d;
    int rc = json_parse(&d, buf, len, path, err);
    if (rc != PG_OK)
        return PG_EFORMAT;
    int64_t v[7];
    static const char *const keys[] = {"pagedgen_shard", "shard", "of", "input_bytes", "records", "output_bytes",
                                       "exit_code"};
    rc = json_is_object(&d, 0) ? PG_OK
                               : pg_error_set(err, PG_EFORMAT, "%s: not a shard marker (not an object)", path);
    for (int q = 0; q < 7 && rc == PG_OK; q++)
        rc = field_int(&d, path, keys[q], 0, INT64_MAX, &v[q], err);
    if (rc == PG_OK && (v[0] != 1 || v[2] < 1 || v[2] > SHARD_MAX_N || v[1] >= v[2] || v[6] > 255))
        rc = pg_error_set(err, PG_EFORMAT, "%s: not a shard marker of this version (pagedgen_shard %lld, shard "
                          "%lld of %lld)", path, (long long)v[0], (long long)v[1], (long long)v[2]);
    char hex[32];
    size_t hl = 0;
    int hi = json_obj_get(&d, 0, "input_fnv1a64");
    int fi = json_obj_get(&d, 0, "format");
    int gi = json_obj_get(&d, 0, "flags");
    if (rc == PG_OK &&
        (hi < 0 || json_get_string_buf(&d, hi, hex, sizeof hex, &hl, NULL) != PG_OK || hl != 16 ||
         fi < 0 || json_get_string_buf(&d, fi, m->format, sizeof m->format, NULL, NULL) != PG_OK ||
         gi < 0 || json_get_string(&d, gi, &m->flags, NULL, NULL) != PG_OK))
        rc = pg_error_set(err, PG_EFORMAT, "%s: not a shard marker: input_fnv1a64, format or flags missing", path);
    if (rc == PG_OK) {
        for (size_t i = 0; i < 16 && rc == PG_OK; i++)
            if (!((hex[i] >= '0' && hex[i] <= '9') || (hex[i] >= 'a' && hex[i] <= 'f')))
                rc = pg_error_set(err, PG_EFORMAT, "%s: input_fnv1a64 '%s' is not 16 hex digits", path, hex);
    }
    if (rc == PG_OK) {
        m->input_hash = strtoull(hex, NULL, 16);
        m->k = (int32_t)v[1];
        m->n = (int32_t)v[2];
        m->input_bytes = v[3];
        m->records = v[4];
        m->output_bytes = v[5];
        m->exit_code = (int32_t)v[6];
    }
    json_doc_free(&d);
    if (rc != PG_OK)
        cli_shard_marker_free(m);
    return rc;
}

int cli_shard_marker_read(const char *output, cli_shard_marker *m, pg_error *err)
{
    memset(m, 0, sizeof *m);
    char *path = cli_shard_marker_path(output);
    if (!path)
        return pg_error_set(err, PG_ENOMEM, "out of memory");
    if (access(path, F_OK) != 0 && errno == ENOENT) {
        free(path);
        return CLI_SHARD_NO_MARKER;
    }
    char *buf = NULL;
    size_t len = 0;
    int rc = pg_read_file(path, 1 << 20, &buf, &len, err);
    if (rc == PG_OK)
        rc = cli_shard_marker_parse(buf, len, path, m, err);
    else if (rc != PG_EFORMAT)
        rc = PG_EIO;
    pg_file_free(buf);
    free(path);
    return rc;
}

int cli_shard_hash_file(const char *path, int64_t *bytes, uint64_t *hash, int64_t *lines, pg_error *err)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return pg_error_set(err, PG_EIO, "%s: cannot open: %s", path, strerror(errno));
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a 64 offset basis */
    int64_t total = 0, nl = 0;
    unsigned char buf[1 << 16];
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            return pg_error_set(err, PG_EIO, "%s: read error: %s", path, strerror(e));
        }
        if (r == 0)
            break;
        for (ssize_t i = 0; i < r; i++) {
            nl += buf[i] == '\n';
            h ^= buf[i];
            h *= 0x100000001b3ULL; /* FNV 64 prime */
        }
        total += r;
    }
    close(fd);
    *bytes = total;
    *hash = h;
    if (lines)
        *lines = nl;
    return PG_OK;
}

int cli_shard_sort_output(const char *output, int64_t kept_bytes, const int64_t *order, size_t n,
                          pg_error *err)
{
    size_t plen = strlen(output);
    char *tmp = malloc(plen + 10);
    if (!tmp)
        return pg_error_set(err, PG_ENOMEM, "out of memory");
    memcpy(tmp, output, plen);
    memcpy(tmp + plen, ".sort.tmp", 10);
    FILE *kept = fopen(output, "rb"), *fresh = fopen(output, "rb"), *out = NULL;
    char *line = NULL;
    size_t cap = 0;
    int rc = PG_OK;
    if (!kept || !fresh || fseeko(fresh, (off_t)kept_bytes, SEEK_SET) != 0) {
        rc = pg_error_set(err, PG_EIO, "%s: cannot read it back to sort: %s", output, strerror(errno));
        goto done;
    }
    if (!(out = fopen(tmp, "wb"))) {
        rc = pg_error_set(err, PG_EIO, "%s: cannot create: %s", tmp, strerror(errno));
        goto done;
    }
    for (size_t i = 0; i < n && rc == PG_OK; i++) {
        FILE *from = order[i] >= 0 ? kept : fresh;
        if (order[i] >= 0 && fseeko(kept, (off_t)order[i], SEEK_SET) != 0) {
            rc = pg_error_set(err, PG_EIO, "%s: seek: %s", output, strerror(errno));
            break;
        }
        ssize_t got = getline(&line, &cap, from);
        if (got <= 0 || line[got - 1] != '\n' || (order[i] >= 0 && order[i] + got > kept_bytes))
            rc = pg_error_set(err, PG_EFORMAT, "%s: record %zu of the shard is not where the run left it", output,
                              i + 1);
        else if (fwrite(line, 1, (size_t)got, out) != (size_t)got)
            rc = pg_error_set(err, PG_EIO, "%s: write error: %s", tmp, strerror(errno));
    }
    if (rc == PG_OK && getline(&line, &cap, fresh) > 0)
        rc = pg_error_set(err, PG_EFORMAT, "%s: more records than the shard's requests", output);
    if (rc == PG_OK && (fflush(out) != 0 || fsync(fileno(out)) != 0))
        rc = pg_error_set(err, PG_EIO, "%s: write error: %s", tmp, strerror(errno));
    if (fclose(out) != 0 && rc == PG_OK)
        rc = pg_error_set(err, PG_EIO, "%s: write error: %s", tmp, strerror(errno));
    out = NULL;
    if (rc == PG_OK && rename(tmp, output) != 0)
        rc = pg_error_set(err, PG_EIO, "%s: cannot rename to %s: %s", tmp, output, strerror(errno));
    if (rc != PG_OK)
        unlink(tmp);
done:
    if (out)
        fclose(out);
    if (kept)
        fclose(kept);
    if (fresh)
        fclose(fresh);
    free(line);
    free(tmp);
    return rc;
}
