/* pg_error: formatting of error messages (see pg_error.h). */
#include "pg_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int pg_error_set(pg_error *err, int status, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return status;
}

int pg_error_wrap(pg_error *err, int status, const char *fmt, ...)
{
    if (err) {
        char prefix[512];
        char old[sizeof err->msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(prefix, sizeof prefix, fmt, ap);
        va_end(ap);
        /* Build "prefix: old" by hand: the result is cut at the buffer's end,
         * which snprintf would warn about (-Wformat-truncation). */
        memcpy(old, err->msg, sizeof old);
        old[sizeof old - 1] = '\0';
        size_t np = strlen(prefix), no = strlen(old), cap = sizeof err->msg - 1;
        size_t k = 0;
        for (size_t i = 0; i < np && k < cap; i++)
            err->msg[k++] = prefix[i];
        for (size_t i = 0; i < 2 && k < cap; i++)
            err->msg[k++] = ": "[i];
        for (size_t i = 0; i < no && k < cap; i++)
            err->msg[k++] = old[i];
        err->msg[k] = '\0';
    }
    return status;
}

const char *pg_status_name(int status)
{
    switch (status) {
    case PG_OK: return "ok";
    case PG_EINVAL: return "invalid input";
    case PG_ENOMEM: return "out of memory";
    case PG_EIO: return "i/o error";
    case PG_EFORMAT: return "malformed file";
    case PG_EUNSUPPORTED: return "unsupported";
    case PG_EDEVICE: return "device error";
    case PG_ENOSPACE: return "no space";
    default: return "unknown error";
    }
}
