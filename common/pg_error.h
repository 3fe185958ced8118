/* pg_error: the one way a library function in pagedgen reports failure.
 *
 * Every fallible function returns an int status (0 = ok, negative = the
 * pg_status below) and, when the caller passed a pg_error, fills it with one
 * lower-case line that says where, what was expected and what was found:
 *   "model.safetensors: tensor 'lm_head.weight': expected [512,64] F32, got [64,512] F32"
 * Only cli/ prints messages and exits; libraries never exit.
 */
#ifndef PG_ERROR_H
#define PG_ERROR_H

#include <stddef.h>

enum pg_status {
    PG_OK = 0,
    PG_EINVAL = -1,   /* bad argument or malformed input */
    PG_ENOMEM = -2,   /* host or device allocation failed */
    PG_EIO = -3,      /* open/read/mmap failed */
    PG_EFORMAT = -4,  /* a file's content is not what its format promises */
    PG_EUNSUPPORTED = -5, /* valid input we deliberately do not handle (yet) */
    PG_EDEVICE = -6,  /* an accelerator call failed */
    PG_ENOSPACE = -7, /* a pool is full; the caller decides (e.g. preempt) */
};

typedef struct pg_error {
    char msg[1024];
} pg_error;

/* Formats the message into err (may be NULL) and returns status, so that
 * `return pg_error_set(err, PG_EFORMAT, "...", ...);` reads as one line.
 * A later call overwrites an earlier message. */
int pg_error_set(pg_error *err, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Prepends "prefix: " to an existing message (adds context on the way up). */
int pg_error_wrap(pg_error *err, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* A short name for a status ("invalid input", "out of memory", ...). */
const char *pg_status_name(int status);

#endif /* PG_ERROR_H */
