/* cuda_memory: pinned host staging, device buffers grown on demand, and the
 * executor table's memory entries (mem_info, alloc, free, upload,
 * download_f32, sync). See cuda_exec_internal.h for the file map. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_exec_internal.h"
#include "dtype.h"
/* Reports a failed CUDA call. Also reads (and so clears) the runtime's
 * last error: a failed cudaMalloc or copy leaves it set, and the next
 * launch check (pgk_check_launch, cudaGetLastError) would report it as that
 * unrelated kernel's failure. A sticky error (a device fault) stays. */
int cx_fail(pg_error *err, int status, const char *what, cudaError_t e)
{
    (void)cudaGetLastError();
    return pg_error_set(err, status, "cuda: %s: %s: %s", what, cudaGetErrorName(e),
                        cudaGetErrorString(e));
}


/* 1 when st is being captured into a CUDA graph (or its capture was
 * invalidated): nothing may be allocated or freed then. */
int cx_stream_capturing(cudaStream_t st)
{
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        return 1;
    }
    return cs != cudaStreamCaptureStatusNone;
}

/* ---- pinned staging ---------------------------------------------------- */

static int pinned_wait(pinned_buf *pb, pg_error *err)
{
    if (pb->pending) {
        CUDA_TRY(err, "cudaEventSynchronize (staging)", cudaEventSynchronize(pb->ev));
        pb->pending = 0;
    }
    return 0;
}

/* Returns (in *h) a pinned buffer of at least bytes that the device no
 * longer reads. */
int cx_pinned_get(cudaStream_t st, pinned_buf *pb, size_t bytes, void **h, pg_error *err)
{
    int rc = pinned_wait(pb, err);
    if (rc)
        return rc;
    if (!pb->ev)
        CUDA_TRY(err, "cudaEventCreateWithFlags",
                 cudaEventCreateWithFlags(&pb->ev, cudaEventDisableTiming));
    if (pb->cap < bytes) {
        if (cx_stream_capturing(st))
            return pg_error_set(err, PG_EINVAL,
                                "cuda: pinned staging of %zu bytes (has %zu) while the stream is "
                                "captured into a CUDA graph: expected it sized by the warm-up",
                                bytes, pb->cap);
        size_t cap = pb->cap ? pb->cap : 4096;
        while (cap < bytes)
            cap *= 2;
        void *n = NULL;
        cudaError_t e = cudaMallocHost(&n, cap); /* cx_fail clears the last error */
        if (e != cudaSuccess)
            return cx_fail(err, PG_ENOMEM, "cudaMallocHost (staging)", e);
        if (pb->h)
            cudaFreeHost(pb->h);
        pb->h = n;
        pb->cap = cap;
    }
    *h = pb->h;
    return 0;
}

int cx_pinned_mark(pinned_buf *pb, cudaStream_t st, pg_error *err)
{
    CUDA_TRY(err, "cudaEventRecord (staging)", cudaEventRecord(pb->ev, st));
    pb->pending = 1;
    return 0;
}

void cx_pinned_free(pinned_buf *pb)
{
    if (pb->pending)
        cudaEventSynchronize(pb->ev);
    if (pb->h)
        cudaFreeHost(pb->h);
    if (pb->ev)
        cudaEventDestroy(pb->ev);
    memset(pb, 0, sizeof *pb);
}

/* Grows a device buffer to at least bytes (contents dropped). Refuses while
 * st is captured (the graph would hold the freed buffer; the driver
 * invalidates the capture anyway): the graphs' warm-up sizes every buffer a
 * capture touches. On a failed free nothing changes; on a failed
 * allocation *p is NULL and *cap_bytes 0. */
int cx_device_grow(cudaStream_t st, void **p, size_t *cap_bytes, size_t bytes,
                       const char *what, pg_error *err)
{
    if (*cap_bytes >= bytes && *p)
        return 0;
    if (cx_stream_capturing(st))
        return pg_error_set(err, PG_EINVAL,
                            "cuda: %s of %zu bytes (has %zu) while the stream is captured into a "
                            "CUDA graph: expected it sized by the warm-up before the capture",
                            what, bytes, *cap_bytes);
    size_t cap = *cap_bytes ? *cap_bytes : 4096;
    while (cap < bytes)
        cap *= 2;
    if (*p) {
        cudaError_t e = cudaFree(*p); /* implicitly waits for the work that used it */
        if (e != cudaSuccess)
            return cx_fail(err, PG_EDEVICE, "cudaFree (before a larger buffer)", e);
    }
    *p = NULL;
    *cap_bytes = 0;
    cudaError_t e = cudaMalloc(p, cap);
    if (e != cudaSuccess) {
        *p = NULL;
        return cx_fail(err, PG_ENOMEM, what, e);
    }
    *cap_bytes = cap;
    return 0;
}
int cx_mem_info(executor *ex, size_t *free_bytes, size_t *total_bytes)
{
    cuda_exec *c = cx(ex);
    size_t f = 0, t = 0;
    CUDA_TRY(&c->err, "cudaMemGetInfo", cudaMemGetInfo(&f, &t));
    *free_bytes = f;
    *total_bytes = t;
    return 0;
}

static int kind_dt(const cuda_exec *c, exec_buf_kind kind)
{
    switch (kind) {
    case EXEC_ACT: return c->act_dt;
    case EXEC_WT: return c->wt_dt;
    case EXEC_KV: return c->kv_dt;
    case EXEC_F32: return PGK_F32;
    case EXEC_I32: return -1;
    }
    return -2;
}

static const char *kind_name(exec_buf_kind kind)
{
    switch (kind) {
    case EXEC_ACT: return "activations";
    case EXEC_WT: return "weights";
    case EXEC_KV: return "kv cache";
    case EXEC_F32: return "f32";
    case EXEC_I32: return "i32";
    }
    return "?";
}

/* The table of alloc()'s buffers, ascending by address (cx_rows_after):
 * the index of the last entry at or below a, or n_allocs when none is. */
static size_t alloc_find(const cuda_exec *c, uintptr_t a)
{
    size_t lo = 0, hi = c->n_allocs; /* entries [0, lo) are <= a, [hi, n) above */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->allocs[mid].p <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo == 0 ? c->n_allocs : lo - 1;
}

/* Adds (p, bytes) to the table; 0 when the host is out of memory. */
static int alloc_record(cuda_exec *c, void *p, size_t bytes)
{
    if (c->n_allocs == c->allocs_cap) {
        size_t cap = c->allocs_cap ? 2 * c->allocs_cap : 64;
        cx_alloc_rec *n = realloc(c->allocs, cap * sizeof *n);
        if (!n)
            return 0;
        c->allocs = n;
        c->allocs_cap = cap;
    }
    size_t i = alloc_find(c, (uintptr_t)p);
    i = i == c->n_allocs ? 0 : i + 1; /* insert after the last entry below p */
    memmove(&c->allocs[i + 1], &c->allocs[i], (c->n_allocs - i) * sizeof *c->allocs);
    c->allocs[i] = (cx_alloc_rec){(uintptr_t)p, bytes};
    c->n_allocs++;
    return 1;
}

void *cx_alloc(executor *ex, exec_buf_kind kind, size_t n_elems)
{
    cuda_exec *c = cx(ex);
    size_t eb = exec_kind_bytes(ex, kind);
    if (eb == 0) {
        pg_error_set(&c->err, PG_EINVAL, "cuda alloc: unknown buffer kind %d", (int)kind);
        return NULL;
    }
    if (n_elems > ((size_t)-1 - 255) / eb) {
        pg_error_set(&c->err, PG_EINVAL, "cuda alloc: %zu elements of %s overflow", n_elems,
                     kind_name(kind));
        return NULL;
    }
    size_t bytes = n_elems * eb;
    if (bytes == 0)
        bytes = 64;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        size_t f = 0, t = 0;
        cudaMemGetInfo(&f, &t);
        pg_error_set(&c->err, PG_ENOMEM,
                     "cuda alloc: %.1f MiB of %s on device %d: %s: %s (free %.1f MiB of %.1f MiB)",
                     (double)bytes / 1048576.0, kind_name(kind), c->device, cudaGetErrorName(e),
                     cudaGetErrorString(e), (double)f / 1048576.0, (double)t / 1048576.0);
        return NULL;
    }
    if (!alloc_record(c, p, bytes)) {
        cudaFree(p);
        pg_error_set(&c->err, PG_ENOMEM, "cuda alloc: out of host memory (allocation table)");
        return NULL;
    }
    return p; /* cudaMalloc memory is at least 256-byte aligned */
}

void cx_free(executor *ex, void *p)
{
    if (!p)
        return;
    cuda_exec *c = cx(ex);
    size_t i = alloc_find(c, (uintptr_t)p);
    if (i < c->n_allocs && c->allocs[i].p == (uintptr_t)p) {
        memmove(&c->allocs[i], &c->allocs[i + 1], (c->n_allocs - i - 1) * sizeof *c->allocs);
        c->n_allocs--;
    }
    cudaFree(p);
}

int64_t cx_rows_after(const cuda_exec *c, const void *p, size_t row_bytes)
{
    const uintptr_t a = (uintptr_t)p;
    size_t i = alloc_find(c, a);
    if (i >= c->n_allocs || c->allocs[i].p > a || row_bytes == 0)
        return 0;
    const uintptr_t end = c->allocs[i].p + c->allocs[i].bytes;
    return a < end ? (int64_t)((end - a) / row_bytes) : 0;
}

/* Converts n elements of src (src_dtype, host, maybe unaligned) to dst_dt
 * into dst (host). */
static void convert_chunk(void *dst, int dst_dt, const unsigned char *src, st_dtype src_dtype,
                          size_t n)
{
    size_t sb = st_dtype_size(src_dtype);
    if (dst_dt == PGK_F32) {
        pg_convert_to_f32((float *)dst, src, src_dtype, n);
        return;
    }
    uint16_t *d = (uint16_t *)dst;
    if ((dst_dt == PGK_BF16 && src_dtype == ST_BF16) || (dst_dt == PGK_F16 && src_dtype == ST_F16)) {
        memcpy(d, src, n * 2u);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float f;
        if (src_dtype == ST_F32) {
            memcpy(&f, src + i * sb, 4);
        } else {
            uint16_t h;
            memcpy(&h, src + i * sb, 2);
            f = src_dtype == ST_F16 ? pg_f16_to_f32(h) : pg_bf16_to_f32(h);
        }
        d[i] = dst_dt == PGK_BF16 ? pg_f32_to_bf16(f) : pg_f32_to_f16(f);
    }
}

int cx_upload(executor *ex, void *dst, exec_buf_kind kind, size_t dst_elem_off,
                       const void *src, st_dtype src_dtype, size_t n_elems)
{
    cuda_exec *c = cx(ex);
    int dt = kind_dt(c, kind);
    size_t db = exec_kind_bytes(ex, kind);
    if (dt == -2 || db == 0)
        return pg_error_set(&c->err, PG_EINVAL, "cuda upload: unknown buffer kind %d", (int)kind);
    if (dt == -1 ? src_dtype != ST_I32 : !st_dtype_is_float_weight(src_dtype))
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda upload to %s: source dtype %s: expected %s", kind_name(kind),
                            st_dtype_name(src_dtype), dt == -1 ? "I32" : "F32, F16 or BF16");
    size_t sb = st_dtype_size(src_dtype);
    size_t per_chunk = STAGE_BYTES / db;
    const unsigned char *s = (const unsigned char *)src;
    unsigned char *d = (unsigned char *)dst + dst_elem_off * db;
    for (size_t done = 0, k = 0; done < n_elems; k++) {
        size_t n = n_elems - done < per_chunk ? n_elems - done : per_chunk;
        pinned_buf *pb = &c->stage[k % 2];
        void *h = NULL;
        int rc = cx_pinned_get(c->stream, pb, STAGE_BYTES, &h, &c->err);
        if (rc)
            return pg_error_wrap(&c->err, rc, "cuda upload");
        if (dt == -1)
            memcpy(h, s + done * sb, n * 4u);
        else
            convert_chunk(h, dt, s + done * sb, src_dtype, n);
        CUDA_TRY(&c->err, "cudaMemcpyAsync (upload)",
                 cudaMemcpyAsync(d + done * db, h, n * db, cudaMemcpyHostToDevice, c->stream));
        rc = cx_pinned_mark(pb, c->stream, &c->err);
        if (rc)
            return rc;
        done += n;
    }
    return 0;
}

int cx_download_f32(executor *ex, float *dst_host, const void *src, exec_buf_kind kind,
                             size_t n_elems)
{
    cuda_exec *c = cx(ex);
    int dt = kind_dt(c, kind);
    size_t sbytes = exec_kind_bytes(ex, kind);
    if (dt < 0)
        return pg_error_set(&c->err, PG_EINVAL,
                            "cuda download_f32: buffer kind %s: expected a float kind",
                            kind_name(kind));
    size_t per_chunk = STAGE_BYTES / sbytes;
    const unsigned char *s = (const unsigned char *)src;
    for (size_t done = 0; done < n_elems;) {
        size_t n = n_elems - done < per_chunk ? n_elems - done : per_chunk;
        void *h = NULL;
        int rc = cx_pinned_get(c->stream, &c->stage[0], STAGE_BYTES, &h, &c->err);
        if (rc)
            return pg_error_wrap(&c->err, rc, "cuda download_f32");
        CUDA_TRY(&c->err, "cudaMemcpyAsync (download)",
                 cudaMemcpyAsync(h, s + done * sbytes, n * sbytes, cudaMemcpyDeviceToHost,
                                 c->stream));
        CUDA_TRY(&c->err, "cudaStreamSynchronize (download)", cudaStreamSynchronize(c->stream));
        if (dt == PGK_F32) {
            memcpy(dst_host + done, h, n * 4u);
        } else {
            const uint16_t *hv = (const uint16_t *)h;
            for (size_t i = 0; i < n; i++)
                dst_host[done + i] = dt == PGK_BF16 ? pg_bf16_to_f32(hv[i]) : pg_f16_to_f32(hv[i]);
        }
        done += n;
    }
    return 0;
}

int cx_sync(executor *ex)
{
    cuda_exec *c = cx(ex);
    CUDA_TRY(&c->err, "cudaStreamSynchronize", cudaStreamSynchronize(c->stream));
    return 0;
}
