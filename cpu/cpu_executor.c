/* cpu_executor: the executor table on the host (see cpu_executor.h).
 * This file holds memory management, argument checks and dispatch; the op
 * bodies are in cpu_ops.c, cpu_attention.c and cpu_gemm.c.
 */
#include "cpu_executor.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu_gemm.h"
#include "cpu_gemm_modes.h"
#include "cpu_ops.h"

int cpu_exec_fail(cpu_exec *ce, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ce->err, sizeof ce->err, fmt, ap);
    va_end(ap);
    return status;
}

int cpu_exec_scratch(cpu_exec *ce, size_t n)
{
    for (int32_t w = 0; w < ce->n_threads; w++) {
        cpu_scratch *s = &ce->scratch[w];
        if (s->cap >= n)
            continue;
        size_t cap = s->cap ? s->cap : 1024;
        while (cap < n)
            cap *= 2;
        float *p = NULL;
        if (posix_memalign((void **)&p, 64, cap * sizeof(float)) != 0)
            return cpu_exec_fail(ce, PG_ENOMEM, "cpu: out of memory for %zu floats of scratch", cap);
        free(s->buf);
        s->buf = p;
        s->cap = cap;
    }
    return PG_OK;
}

static cpu_exec *cpu_of(executor *ex)
{
    return (cpu_exec *)ex;
}

/* y [M][ldy] = x @ w^T in the executor's matmul precision (cpu_gemm_modes.h) */
int cpu_product(cpu_exec *ce, float *y, int64_t ldy, const float *x, const void *w, int32_t M, int32_t N,
                       int32_t K)
{
    const cpu_matmul_precision prec = (cpu_matmul_precision)ce->precision;
    const size_t need = cpu_gemm_mode_scratch_bytes(prec, M, K);
    if (need > ce->act_q_cap) {
        size_t cap = ce->act_q_cap ? ce->act_q_cap : 4096;
        while (cap < need)
            cap *= 2;
        void *p = NULL;
        if (posix_memalign(&p, 64, cap) != 0)
            return cpu_exec_fail(ce, PG_ENOMEM, "cpu: out of memory for %zu bytes of %s activations", cap,
                                 cpu_matmul_precision_name(prec));
        free(ce->act_q);
        ce->act_q = p;
        ce->act_q_cap = cap;
    }
    cpu_gemm_mode(prec, (cpu_gemm_variant)ce->gemm_variant, ce->wt, ce->pool, y, ldy, x, w, M, N, K,
                  need ? ce->act_q : NULL);
    return PG_OK;
}

/* ---- lifetime and memory ------------------------------------------------- */

static void cpu_destroy(executor *ex)
{
    if (!ex)
        return;
    cpu_exec *ce = cpu_of(ex);
    cpu_pool_destroy(ce->pool);
    if (ce->scratch)
        for (int32_t w = 0; w < ce->n_threads; w++)
            free(ce->scratch[w].buf);
    free(ce->scratch);
    free(ce->attn_tiles);
    free(ce->tok_seq);
    free(ce->act_q);
    free(ce->moe_buf);
    free(ce->lora_buf);
    free(ce);
}

static const char *cpu_last_error(executor *ex)
{
    return cpu_of(ex)->err;
}

static int cpu_mem_info(executor *ex, size_t *free_bytes, size_t *total_bytes)
{
    cpu_exec *ce = cpu_of(ex);
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return cpu_exec_fail(ce, PG_EIO, "mem_info: cannot open /proc/meminfo");
    char line[256];
    unsigned long long avail_kb = 0, total_kb = 0;
    int have_avail = 0, have_total = 0;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemAvailable: %llu kB", &avail_kb) == 1)
            have_avail = 1;
        else if (sscanf(line, "MemTotal: %llu kB", &total_kb) == 1)
            have_total = 1;
    }
    fclose(f);
    if (!have_avail || !have_total)
        return cpu_exec_fail(ce, PG_EFORMAT, "mem_info: /proc/meminfo lacks MemAvailable or MemTotal");
    if (free_bytes)
        *free_bytes = (size_t)avail_kb * 1024u;
    if (total_bytes)
        *total_bytes = (size_t)total_kb * 1024u;
    return PG_OK;
}

#define CPU_HUGE_PAGE_BYTES ((size_t)2 << 20)

static void *cpu_alloc(executor *ex, exec_buf_kind kind, size_t n_elems)
{
    cpu_exec *ce = cpu_of(ex);
    size_t eb = exec_kind_bytes(ex, kind);
    if (eb == 0) {
        cpu_exec_fail(ce, PG_EINVAL, "alloc: unknown buffer kind %d", (int)kind);
        return NULL;
    }
    if (n_elems > (SIZE_MAX - 64) / 8) {
        cpu_exec_fail(ce, PG_ENOMEM, "alloc: %zu elements of %zu bytes overflow size_t", n_elems, eb);
        return NULL;
    }
    /* int8 weights take whole blocks of 36 bytes per 32 elements */
    size_t bytes = ((kind == EXEC_WT ? cpu_wt_bytes(ce->wt, n_elems) : n_elems * eb) + 63) / 64 * 64;
    if (bytes == 0)
        bytes = 64;
    /* Large buffers (weights, the KV cache) are 2 MiB aligned and asked to
     * be backed by transparent huge pages: attention streams K/V rows
     * scattered over the pool, and 4 KiB pages cost it TLB misses (~17%
     * faster attention in a micro-benchmark). Measured through the CLI
     * (bench/RESULTS.md, 2026-11-28, 110m bf16, 64 x 128+128): 4 KiB KV
     * pages +26% user time, 4 KiB weight pages +23%. The KV buffer (not
     * prefaulted) is asked plane by plane at its first write instead, its
     * leads in 4 KiB pages while the run is small (cpu_kv_pages: one
     * request touched 54 MiB of huge pages for 9 MiB of slots). A refusal
     * is harmless. */
    size_t align = bytes >= CPU_HUGE_PAGE_BYTES ? CPU_HUGE_PAGE_BYTES : 64;
    void *p = NULL;
    if (posix_memalign(&p, align, bytes) != 0) {
        cpu_exec_fail(ce, PG_ENOMEM, "alloc: out of memory for %zu bytes", bytes);
        return NULL;
    }
    if (align == CPU_HUGE_PAGE_BYTES && kind == EXEC_KV && !ce->prefault_kv) {
        /* huge pages asked for at the first KV write, by plane
         * (cpu_kv_pages) */
        ce->kv_buf = p;
        ce->kv_buf_bytes = bytes;
        ce->kv_pages_stage = 0;
        ce->kv_lead_bytes = 0;
    } else if (align == CPU_HUGE_PAGE_BYTES) {
#ifdef MADV_HUGEPAGE
        (void)madvise(p, bytes, MADV_HUGEPAGE);
#endif
    }
    if (kind == EXEC_KV && ce->prefault_kv)
        memset(p, 0, bytes);
    return p;
}

static void cpu_free(executor *ex, void *p)
{
    cpu_exec *ce = cpu_of(ex);
    if (p && p == ce->kv_buf)
        ce->kv_buf = NULL;
    free(p);
}

static int cpu_upload(executor *ex, void *dst, exec_buf_kind kind, size_t dst_elem_off,
                      const void *src, st_dtype src_dtype, size_t n_elems)
{
    cpu_exec *ce = cpu_of(ex);
    if (!dst || (!src && n_elems))
        return cpu_exec_fail(ce, PG_EINVAL, "upload: NULL buffer");
    if (kind == EXEC_I32) {
        if (src_dtype != ST_I32)
            return cpu_exec_fail(ce, PG_EINVAL, "upload: an I32 buffer takes I32 data, got %s",
                                 st_dtype_name(src_dtype));
        memcpy((int32_t *)dst + dst_elem_off, src, n_elems * sizeof(int32_t));
        return PG_OK;
    }
    if (kind != EXEC_ACT && kind != EXEC_WT && kind != EXEC_KV && kind != EXEC_F32)
        return cpu_exec_fail(ce, PG_EINVAL, "upload: unknown buffer kind %d", (int)kind);
    if (src_dtype != ST_F32 && src_dtype != ST_F16 && src_dtype != ST_BF16)
        return cpu_exec_fail(ce, PG_EINVAL, "upload: expected F32, F16 or BF16 source, got %s",
                             st_dtype_name(src_dtype));
    if (kind == EXEC_WT) {
        if (cpu_wt_store(ce->wt, dst, dst_elem_off, src, src_dtype, n_elems) != 0)
            return cpu_exec_fail(ce, PG_EINVAL,
                                 "upload: int8 weights are quantized in blocks of %d elements: expected an "
                                 "element offset that is a multiple of %d, got %zu",
                                 CPU_I8_GROUP, CPU_I8_GROUP, dst_elem_off);
        return PG_OK;
    }
    if (kind == EXEC_KV && ce->kv != CPU_KV_F32) {
        const size_t es = st_dtype_size(src_dtype), eb = cpu_kv_bytes(ce->kv);
        float buf[256];
        for (size_t i = 0; i < n_elems; i += 256) {
            const size_t m = n_elems - i < 256 ? n_elems - i : 256;
            pg_convert_to_f32(buf, (const char *)src + i * es, src_dtype, m);
            cpu_kv_store(ce->kv, (char *)dst + (dst_elem_off + i) * eb, buf, (int64_t)m);
        }
        return PG_OK;
    }
    pg_convert_to_f32((float *)dst + dst_elem_off, src, src_dtype, n_elems);
    return PG_OK;
}

static int cpu_download_f32(executor *ex, float *dst_host, const void *src, exec_buf_kind kind,
                            size_t n_elems)
{
    cpu_exec *ce = cpu_of(ex);
    if (!dst_host || (!src && n_elems))
        return cpu_exec_fail(ce, PG_EINVAL, "download_f32: NULL buffer");
    if (kind == EXEC_I32) {
        const int32_t *s = src;
        for (size_t i = 0; i < n_elems; i++)
            dst_host[i] = (float)s[i];
        return PG_OK;
    }
    if (exec_kind_bytes(ex, kind) == 0)
        return cpu_exec_fail(ce, PG_EINVAL, "download_f32: unknown buffer kind %d", (int)kind);
    if (kind == EXEC_WT && ce->wt != CPU_WT_F32)
        cpu_wt_get_row(dst_host, src, ce->wt, 0, (int64_t)n_elems);
    else if (kind == EXEC_KV && ce->kv != CPU_KV_F32)
        cpu_kv_load(ce->kv, dst_host, src, (int64_t)n_elems);
    else
        memmove(dst_host, src, n_elems * sizeof(float));
    return PG_OK;
}

static int cpu_sync(executor *ex)
{
    (void)ex;
    return PG_OK;
}

static int cpu_begin_step(executor *ex, const step_batch *b)
{
    return cpu_check_batch(cpu_of(ex), "begin_step", b);
}

/* ---- ops ------------------------------------------------------------------ */

#define CPU_REQUIRE(cond, ...)                                         \
    do {                                                               \
        if (!(cond))                                                   \
            return cpu_exec_fail(ce, PG_EINVAL, __VA_ARGS__);          \
    } while (0)

static int cpu_check_heads(cpu_exec *ce, const char *op, int32_t nh, int32_t nkv, int32_t hd)
{
    CPU_REQUIRE(nh >= 1 && nkv >= 1 && nh % nkv == 0,
                "%s: expected nh a positive multiple of nkv, got nh %d, nkv %d", op, (int)nh, (int)nkv);
    CPU_REQUIRE(hd >= 2 && hd % 2 == 0, "%s: expected an even head_dim >= 2, got %d", op, (int)hd);
    return PG_OK;
}

static int cpu_embed(executor *ex, void *x, const void *table, int32_t H, int32_t V, const step_batch *b)
{
    cpu_exec *ce = cpu_of(ex);
    int rc = cpu_check_batch(ce, "embed", b);
    if (rc)
        return rc;
    CPU_REQUIRE(x && table && b->token_ids, "embed: NULL argument");
    CPU_REQUIRE(H >= 1 && V >= 1, "embed: expected H, V >= 1, got %d, %d", (int)H, (int)V);
    return cpu_op_embed(ce, x, table, H, V, b);
}

static int cpu_rmsnorm(executor *ex, void *out, void *residual, const void *x, const float *w,
                       int32_t rows, int32_t dim, float eps)
{
    cpu_exec *ce = cpu_of(ex);
    CPU_REQUIRE(out && x && w, "rmsnorm: NULL argument");
    CPU_REQUIRE(rows >= 0 && dim >= 1, "rmsnorm: expected rows >= 0, dim >= 1, got %d, %d", (int)rows, (int)dim);
    return cpu_op_rmsnorm(ce, out, residual, x, w, rows, dim, eps);
}

static int cpu_matmul(executor *ex, void *y, const void *x, const void *w, int32_t M, int32_t N, int32_t K)
{
    cpu_exec *ce = cpu_of(ex);
    CPU_REQUIRE(y && x && w, "matmul: NULL argument");
    CPU_REQUIRE(M >= 0 && N >= 1 && K >= 1, "matmul: expected M >= 0, N, K >= 1, got %d, %d, %d",
                (int)M, (int)N, (int)K);
    return cpu_product(ce, y, N, x, w, M, N, K);
}

static int cpu_add_bias(executor *ex, void *y, const float *bias, int32_t rows, int32_t N)
{
    cpu_exec *ce = cpu_of(ex);
    CPU_REQUIRE(y && bias, "add_bias: NULL argument");
    CPU_REQUIRE(rows >= 0 && N >= 1, "add_bias: expected rows >= 0, N >= 1, got %d, %d", (int)rows, (int)N);
    return cpu_op_add_bias(ce, y, bias, rows, N);
}

static int cpu_qk_norm(executor *ex, void *qkv, const float *q_w, const float *k_w, int32_t T, int32_t nh,
                       int32_t nkv, int32_t hd, float eps)
{
    cpu_exec *ce = cpu_of(ex);
    CPU_REQUIRE(qkv && q_w && k_w, "qk_norm: NULL argument");
    CPU_REQUIRE(T >= 0 && nh >= 1 && nkv >= 1 && hd >= 1,
                "qk_norm: expected T >= 0, nh, nkv, hd >= 1, got %d, %d, %d, %d", (int)T, (int)nh, (int)nkv, (int)hd);
    return cpu_op_qk_norm(ce, qkv, q_w, k_w, T, nh, nkv, hd, eps);
}

static int cpu_rope(executor *ex, void *qkv, const float *inv_freq, int32_t nh, int32_t nkv, int32_t hd,
                    const step_batch *b)
{
    cpu_exec *ce = cpu_of(ex);
    int rc = cpu_check_batch(ce, "rope", b);
    if (rc || (rc = cpu_check_heads(ce, "rope", nh, nkv, hd)))
        return rc;
    CPU_REQUIRE(qkv && inv_freq && b->positions, "rope: NULL argument");
    return cpu_op_rope(ce, qkv, inv_freq, nh, nkv, hd, b);
}

bool cpu_kv_tail_range(uintptr_t ps, size_t plane_bytes, uintptr_t *lo, uintptr_t *hi)
{
    const uintptr_t h = CPU_HUGE_PAGE_BYTES, page = 4096;
    if (plane_bytes > UINTPTR_MAX - ps || ps > UINTPTR_MAX - 2 * h)
        return false;
    const uintptr_t a = (ps + h + h - 1) / h * h, e = (ps + plane_bytes) / page * page;
    if (e <= a)
        return false;
    *lo = a;
    *hi = e;
    return true;
}

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1 */
#endif

/* Huge pages of the KV buffer in proportion to the run (issue 34 item 3).
 * The pool hands out blocks lowest id first (core/kv_pool.h), so a run
 * writes each plane's leading slots; asked for huge pages at allocation,
 * one request's first write in each of the 2 x layers planes faulted in a
 * whole 2 MiB page (54 MiB resident for 9 MiB of slots, 110m bf16), which
 * the kernel zeroes. So: at the first write the planes are found (model.c
 * lays them out back to back, V of a layer one plane after its K) and
 * every plane but its lead is asked for huge pages; once a write reaches
 * past the smallest lead, the leads are asked too and collapsed into huge
 * pages (MADV_COLLAPSE; refused on kernels before 6.1: they stay 4 KiB),
 * so a long run's attention reads huge pages everywhere, as before
 * (bench/RESULTS.md, 2026-11-28: 4 KiB KV pages cost +26% user time at
 * batch 64). Only madvise calls: what the buffer holds never changes. */
static void cpu_kv_pages(cpu_exec *ce, const char *k_cache, const char *v_cache, int32_t nkv,
                         int32_t hd, const step_batch *b)
{
#ifdef MADV_HUGEPAGE
    char *const base = ce->kv_buf;
    const size_t bytes = ce->kv_buf_bytes;
    if (ce->kv_pages_stage == 0) {
        const uintptr_t k = (uintptr_t)k_cache, v = (uintptr_t)v_cache, b0 = (uintptr_t)base;
        const size_t plane = v > k ? (size_t)(v - k) : 0;
        if (k < b0 || k >= b0 + bytes || plane == 0 || plane > bytes) {
            ce->kv_pages_stage = 2; /* not the layout above: all huge at once */
            (void)madvise(base, bytes, MADV_HUGEPAGE);
            return;
        }
        size_t lead = bytes;
        for (size_t ps = 0; ps + plane <= bytes; ps += plane) {
            uintptr_t lo, hi;
            if (cpu_kv_tail_range((uintptr_t)(base + ps), plane, &lo, &hi)) {
                (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
                if (lo - (uintptr_t)(base + ps) < lead)
                    lead = lo - (uintptr_t)(base + ps);
            } else if (plane < lead) {
                lead = plane;
            }
        }
        ce->kv_lead_bytes = lead;
        ce->kv_pages_stage = 1;
    }
    if (ce->kv_pages_stage == 1) {
        const size_t slot_bytes = (size_t)nkv * (size_t)hd * (size_t)ce->base.kv_bytes;
        int64_t top = -1;
        for (int32_t t = 0; t < b->num_tokens; t++)
            if (b->slots[t] > top)
                top = b->slots[t];
        if (top < 0 || (size_t)(top + 1) * slot_bytes <= ce->kv_lead_bytes)
            return;
        ce->kv_pages_stage = 2;
        (void)madvise(base, bytes, MADV_HUGEPAGE);
        const size_t plane = (size_t)((uintptr_t)v_cache - (uintptr_t)k_cache), h = CPU_HUGE_PAGE_BYTES;
        for (size_t ps = 0; ps + plane <= bytes; ps += plane) {
            uintptr_t lo, hi;
            const uintptr_t s = (uintptr_t)(base + ps) / h * h;
            if (!cpu_kv_tail_range((uintptr_t)(base + ps), plane, &lo, &hi))
                lo = (uintptr_t)(base + ps + plane) / 4096 * 4096;
            if (lo > s) /* (s >= base: the buffer is 2 MiB aligned) */
                (void)madvise((void *)s, lo - s, MADV_COLLAPSE);
        }
    }
#else
    (void)ce;
    (void)k_cache;
    (void)v_cache;
    (void)nkv;
    (void)hd;
    (void)b;
#endif
}

static int cpu_kv_write(executor *ex, void *k_cache, void *v_cache, const void *qkv, int32_t nh,
                        int32_t nkv, int32_t hd, const step_batch *b)
{
    cpu_exec *ce = cpu_of(ex);
    int rc = cpu_check_batch(ce, "kv_write", b);
    if (rc || (rc = cpu_check_heads(ce, "kv_write", nh, nkv, hd)))
        return rc;
    CPU_REQUIRE(k_cache && v_cache && qkv && b->slots, "kv_write: NULL argument");
    if (ce->kv_buf && ce->kv_pages_stage < 2)
        cpu_kv_pages(ce, k_cache, v_cache, nkv, hd, b);
    return cpu_op_kv_write(ce, k_cache, v_cache, qkv, nh, nkv, hd, b);
}

static int cpu_attention(executor *ex, void *out, const void *qkv, const void *k_cache,
                         const void *v_cache, int32_t nh, int32_t nkv, int32_t hd, float scale,
                         const step_batch *b)
{
    cpu_exec *ce = cpu_of(ex);
    int rc = cpu_check_batch(ce, "attention", b);
    if (rc || (rc = cpu_check_heads(ce, "attention", nh, nkv, hd)))
        return rc;
    CPU_REQUIRE(out && qkv && k_cache && v_cache, "attention: NULL argument");
    return cpu_op_attention(ce, out, qkv, k_cache, v_cache, nh, nkv, hd, scale, b);
}

static int cpu_silu_mul(executor *ex, void *out, const void *gate_up, int32_t T, int32_t I)
{
    cpu_exec *ce = cpu_of(ex);
    CPU_REQUIRE(out && gate_up, "silu_mul: NULL argument");
    CPU_REQUIRE(T >= 0 && I >= 1, "silu_mul: expected T >= 0, I >= 1, got %d, %d", (int)T, (int)I);
    return cpu_op_silu_mul(ce, out, gate_up, T, I);
}

static int cpu_gather_rows(executor *ex, void *dst, const void *src, int32_t dim, const step_batch *b)
{
    cpu_exec *ce = cpu_of(ex);
    int rc = cpu_check_batch(ce, "gather_rows", b);
    if (rc)
        return rc;
    CPU_REQUIRE(dst && src && (b->num_logits == 0 || b->logits_rows), "gather_rows: NULL argument");
    CPU_REQUIRE(dim >= 1 && b->num_logits >= 0, "gather_rows: expected dim >= 1, num_logits >= 0, got %d, %d",
                (int)dim, (int)b->num_logits);
    return cpu_op_gather_rows(ce, dst, src, dim, b);
}

static int cpu_logits(executor *ex, float *logits_host, const void *x, const void *w,
                      int32_t L, int32_t V, int32_t H)
{
    cpu_exec *ce = cpu_of(ex);
    CPU_REQUIRE(logits_host && x && w, "logits: NULL argument");
    CPU_REQUIRE(L >= 0 && V >= 1 && H >= 1, "logits: expected L >= 0, V, H >= 1, got %d, %d, %d",
                (int)L, (int)V, (int)H);
    return cpu_product(ce, logits_host, V, x, w, L, V, H);
}

static int cpu_copy_blocks(executor *ex, void *kv, int32_t n_planes, size_t plane_elems,
                           size_t block_elems, const int32_t *src_dst_host, int32_t n_pairs)
{
    cpu_exec *ce = cpu_of(ex);
    CPU_REQUIRE(kv && (n_pairs == 0 || src_dst_host), "copy_blocks: NULL argument");
    CPU_REQUIRE(n_planes >= 0 && n_pairs >= 0, "copy_blocks: expected n_planes, n_pairs >= 0, got %d, %d",
                (int)n_planes, (int)n_pairs);
    return cpu_op_copy_blocks(ce, kv, n_planes, plane_elems, block_elems, src_dst_host, n_pairs);
}

static int cpu_moe_route(executor *ex, int32_t *ids, float *weights, const void *router, int32_t T, int32_t E,
                         int32_t k, int32_t norm_topk)
{
    cpu_exec *ce = cpu_of(ex);
    CPU_REQUIRE(ids && weights && router, "moe_route: NULL argument");
    CPU_REQUIRE(T >= 0 && E >= 1 && k >= 1 && k <= E, "moe_route: expected T >= 0, 1 <= k <= E, got %d, %d, %d",
                (int)T, (int)k, (int)E);
    return cpu_op_moe_route(ce, ids, weights, router, T, E, k, norm_topk);
}

static int cpu_moe_experts(executor *ex, void *out, const void *x, const int32_t *ids, const float *weights,
                           void *const *w_gate_up, void *const *w_down, int32_t T, int32_t H, int32_t I, int32_t E,
                           int32_t k)
{
    cpu_exec *ce = cpu_of(ex);
    CPU_REQUIRE(out && x && ids && weights && w_gate_up && w_down, "moe_experts: NULL argument");
    CPU_REQUIRE(T >= 0 && H >= 1 && I >= 1 && E >= 1 && k >= 1 && k <= E,
                "moe_experts: expected T >= 0, H, I >= 1, 1 <= k <= E, got %d, %d, %d, %d, %d", (int)T, (int)H,
                (int)I, (int)k, (int)E);
    return cpu_op_moe_experts(ce, out, x, ids, weights, w_gate_up, w_down, T, H, I, E, k);
}

static int cpu_moe_shared_add(executor *ex, void *out, const void *shared, const void *gate, int32_t T, int32_t N)
{
    cpu_exec *ce = cpu_of(ex);
    CPU_REQUIRE(out && shared && gate, "moe_shared_add: NULL argument");
    CPU_REQUIRE(T >= 0 && N >= 1, "moe_shared_add: expected T >= 0, N >= 1, got %d, %d", (int)T, (int)N);
    return cpu_op_moe_shared_add(ce, out, shared, gate, T, N);
}

static int cpu_lora_add(executor *ex, void *y, int32_t ldy, const void *x, int32_t K, int32_t N,
                        const void *const *A, const void *const *B, const float *scale, const int32_t *rank,
                        int32_t n_slots, const step_batch *b)
{
    cpu_exec *ce = cpu_of(ex);
    CPU_REQUIRE(y && x && b, "lora_add: NULL argument");
    CPU_REQUIRE(K >= 1 && N >= 1 && ldy >= N && n_slots >= 0,
                "lora_add: expected K, N >= 1, ldy >= N, n_slots >= 0, got %d, %d, %d, %d", (int)K, (int)N,
                (int)ldy, (int)n_slots);
    CPU_REQUIRE(!b->lora_slots || (A && B && scale && rank), "lora_add: NULL slot arrays");
    return cpu_op_lora_add(ce, y, ldy, x, K, N, (const float *const *)A, (const float *const *)B, scale, rank,
                           n_slots, b);
}

static const executor_ops cpu_ops_table = {
    .destroy = cpu_destroy,
    .last_error = cpu_last_error,
    .mem_info = cpu_mem_info,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download_f32 = cpu_download_f32,
    .sync = cpu_sync,
    .begin_step = cpu_begin_step,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .add_bias = cpu_add_bias,
    .qk_norm = cpu_qk_norm,
    .rope = cpu_rope,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .silu_mul = cpu_silu_mul,
    .gather_rows = cpu_gather_rows,
    .logits = cpu_logits,
    .copy_blocks = cpu_copy_blocks,
    .moe_route = cpu_moe_route,
    .moe_experts = cpu_moe_experts,
    .moe_shared_add = cpu_moe_shared_add,
    .lora_add = cpu_lora_add,
};

int cpu_executor_create(executor **out, const cpu_executor_params *p, pg_error *err)
{
    *out = NULL;
    int32_t threads = p ? p->threads : 0;
    if (threads < 0 || threads > 1024)
        return pg_error_set(err, PG_EINVAL, "cpu executor: expected 0..1024 threads, got %d", (int)threads);
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n < 1 ? 1 : (n > 1024 ? 1024 : (int32_t)n);
    }
    const int32_t variant = p ? p->gemm_variant : CPU_GEMM_AUTO;
    if (variant < 0 || variant >= CPU_GEMM_VARIANT_COUNT)
        return pg_error_set(err, PG_EINVAL, "cpu executor: expected gemm_variant 0..%d, got %d",
                            (int)CPU_GEMM_VARIANT_COUNT - 1, (int)variant);
    if (!cpu_gemm_variant_available((cpu_gemm_variant)variant))
        return pg_error_set(err, PG_EUNSUPPORTED, "cpu executor: gemm variant %s: expected a CPU that runs it, this one does not",
                            cpu_gemm_variant_name((cpu_gemm_variant)variant));
    const int32_t wt = p ? p->wt_dtype : CPU_WT_F32, kv = p ? p->kv_dtype : CPU_KV_F32;
    if (wt < 0 || wt >= CPU_WT_COUNT || kv < 0 || kv >= CPU_KV_COUNT)
        return pg_error_set(err, PG_EINVAL, "cpu executor: expected wt_dtype 0..%d and kv_dtype 0..%d, got %d, %d",
                            (int)CPU_WT_COUNT - 1, (int)CPU_KV_COUNT - 1, (int)wt, (int)kv);
    const int32_t precision = p ? p->matmul_precision : CPU_MATMUL_EXACT;
    if (precision < 0 || precision >= CPU_MATMUL_COUNT)
        return pg_error_set(err, PG_EINVAL, "cpu executor: expected matmul_precision 0..%d, got %d",
                            (int)CPU_MATMUL_COUNT - 1, (int)precision);
    if (!cpu_matmul_precision_accepts((cpu_matmul_precision)precision, (cpu_wt)wt))
        return pg_error_set(err, PG_EINVAL, "cpu executor: matmul precision %s computes on %s weights, got %s storage",
                            cpu_matmul_precision_name((cpu_matmul_precision)precision),
                            precision == CPU_MATMUL_BF16 ? "bf16" : "int8", cpu_wt_name((cpu_wt)wt));
    cpu_exec *ce = calloc(1, sizeof *ce);
    if (!ce)
        return pg_error_set(err, PG_ENOMEM, "cpu executor: out of memory");
    ce->precision = precision;
    ce->prefault_kv = p && p->prefault_kv;
    ce->wt = (cpu_wt)wt;
    ce->kv = (cpu_kv)kv;
    ce->base.op = &cpu_ops_table;
    /* a forced GEMM variant shows in the name (same bits, other speed) */
    static const char *const names[CPU_GEMM_VARIANT_COUNT] = {"cpu", "cpu-generic", "cpu-avx2", "cpu-avx512"};
    ce->base.name = names[variant];
    ce->base.act_bytes = 4;
    ce->base.wt_bytes = wt == CPU_WT_F32 ? 4 : (wt == CPU_WT_BF16 ? 2 : 1);
    if (wt == CPU_WT_I8) {
        ce->base.wt_block_elems = CPU_I8_GROUP;
        ce->base.wt_block_bytes = CPU_I8_BLOCK_BYTES;
    }
    ce->base.kv_bytes = cpu_kv_bytes(ce->kv);
    ce->n_threads = threads;
    ce->gemm_variant = variant;
    ce->scratch = calloc((size_t)threads, sizeof *ce->scratch);
    if (!ce->scratch) {
        cpu_destroy(&ce->base);
        return pg_error_set(err, PG_ENOMEM, "cpu executor: out of memory");
    }
    int rc = cpu_pool_create(&ce->pool, threads, err);
    if (rc) {
        cpu_destroy(&ce->base);
        return pg_error_wrap(err, rc, "cpu executor");
    }
    *out = &ce->base;
    return PG_OK;
}
