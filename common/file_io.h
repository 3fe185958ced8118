/* file_io: the one checked way pagedgen reads a file (STYLE.md habit 11).
 *
 * pg_read_file reads a whole small file (config.json, tokenizer.json, an
 * index) into memory with a size cap; pg_map_file maps a large one (weights)
 * read-only. Errors name the path and the reason (errno text, size vs cap).
 */
#ifndef PG_FILE_IO_H
#define PG_FILE_IO_H

#include <stddef.h>

#include "pg_error.h"

/* Reads all of `path` into a malloc'd buffer with one extra NUL byte after
 * the content (so text parsers may treat it as a C string; the content may
 * itself hold NULs: *len is the true length). Files larger than max_bytes
 * are refused (PG_EFORMAT) without reading them. Not a regular file ->
 * PG_EIO. On error *out is NULL and *len is 0. Free with pg_file_free. */
int pg_read_file(const char *path, size_t max_bytes, char **out, size_t *len, pg_error *err);
void pg_file_free(char *buf); /* accepts NULL */

/* A read-only mapping of a whole regular file. An empty file gives
 * data == NULL, size == 0 (and is not an error here). */
typedef struct pg_map {
    const void *data; /* borrowed: valid until pg_unmap_file */
    size_t size;
} pg_map;

int pg_map_file(const char *path, pg_map *map, pg_error *err);
void pg_unmap_file(pg_map *map); /* accepts a zeroed map; zeroes it */

/* 1 if path names an existing regular file, 0 otherwise (never an error). */
int pg_file_exists(const char *path);
/* 1 if path names an existing directory. */
int pg_dir_exists(const char *path);
/* dir + "/" + name, malloc'd (free()); NULL when out of memory. */
char *pg_path_join(const char *dir, const char *name);

#endif /* PG_FILE_IO_H */
