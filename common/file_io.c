/* file_io: checked whole-file reads and read-only maps (see file_io.h). */
#include "file_io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Opens path and fstat()s it; refuses anything that is not a regular file. */
static int open_regular(const char *path, int *fd_out, size_t *size_out, pg_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return pg_error_set(err, PG_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return pg_error_set(err, PG_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return pg_error_set(err, PG_EIO, "%s: expected a regular file, found %s", path,
                            S_ISDIR(st.st_mode) ? "a directory" : "something else");
    }
    if (st.st_size < 0 || (uint64_t)st.st_size > (uint64_t)SIZE_MAX - 1) {
        close(fd);
        return pg_error_set(err, PG_EIO, "%s: file size %lld does not fit in memory", path,
                            (long long)st.st_size);
    }
    *fd_out = fd;
    *size_out = (size_t)st.st_size;
    return PG_OK;
}

int pg_read_file(const char *path, size_t max_bytes, char **out, size_t *len, pg_error *err)
{
    *out = NULL;
    *len = 0;
    int fd = -1;
    size_t size = 0;
    int rc = open_regular(path, &fd, &size, err);
    if (rc != PG_OK)
        return rc;
    if (size > max_bytes) {
        close(fd);
        return pg_error_set(err, PG_EFORMAT, "%s: file is %zu bytes, expected at most %zu",
                            path, size, max_bytes);
    }
    char *buf = malloc(size + 1);
    if (!buf) {
        close(fd);
        return pg_error_set(err, PG_ENOMEM, "%s: cannot allocate %zu bytes", path, size + 1);
    }
    size_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, buf + got, size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? errno : 0;
            free(buf);
            close(fd);
            if (n == 0)
                return pg_error_set(err, PG_EIO, "%s: file shrank while reading: expected %zu bytes, got %zu",
                                    path, size, got);
            return pg_error_set(err, PG_EIO, "%s: read failed: %s", path, strerror(e));
        }
        got += (size_t)n;
    }
    close(fd);
    buf[size] = '\0';
    *out = buf;
    *len = size;
    return PG_OK;
}

void pg_file_free(char *buf)
{
    free(buf);
}

int pg_map_file(const char *path, pg_map *map, pg_error *err)
{
    map->data = NULL;
    map->size = 0;
    int fd = -1;
    size_t size = 0;
    int rc = open_regular(path, &fd, &size, err);
    if (rc != PG_OK)
        return rc;
    if (size == 0) {
        close(fd);
        return PG_OK;
    }
    void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the file alive */
    if (p == MAP_FAILED)
        return pg_error_set(err, PG_EIO, "%s: mmap of %zu bytes failed: %s", path, size, strerror(e));
    map->data = p;
    map->size = size;
    return PG_OK;
}

void pg_unmap_file(pg_map *map)
{
    if (map && map->data)
        munmap((void *)(uintptr_t)map->data, map->size);
    if (map) {
        map->data = NULL;
        map->size = 0;
    }
}

int pg_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int pg_dir_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

char *pg_path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}
