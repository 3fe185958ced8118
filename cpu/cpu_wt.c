/* cpu_wt: storage types of the CPU executor (see cpu_wt.h). */
#include "cpu_wt.h"

#include <math.h>

const char *cpu_wt_name(cpu_wt t)
{
    static const char *const names[CPU_WT_COUNT] = {"f32", "bf16", "int8"};
    return (unsigned)t < CPU_WT_COUNT ? names[t] : NULL;
}

const char *cpu_kv_name(cpu_kv t)
{
    static const char *const names[CPU_KV_COUNT] = {"f32", "bf16", "f16"};
    return (unsigned)t < CPU_KV_COUNT ? names[t] : NULL;
}

size_t cpu_wt_bytes(cpu_wt t, size_t n)
{
    switch (t) {
    case CPU_WT_BF16: return n * 2u;
    case CPU_WT_I8: return (n + CPU_I8_GROUP - 1) / CPU_I8_GROUP * CPU_I8_BLOCK_BYTES;
    default: return n * 4u;
    }
}

/* Quantizes n <= CPU_I8_GROUP values into one block. */
static void i8_block(unsigned char *blk, const float *v, size_t n)
{
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++)
        amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
    const float scale = amax / 127.0f;
    memcpy(blk, &scale, sizeof scale);
    for (size_t i = 0; i < CPU_I8_GROUP; i++) {
        float q = 0.0f;
        if (i < n && scale > 0.0f) {
            q = nearbyintf(v[i] / scale); /* round to nearest even (default mode) */
            q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
        }
        blk[4 + i] = (unsigned char)(int8_t)q;
    }
}

int cpu_wt_store(cpu_wt t, void *dst, size_t off, const void *src, st_dtype src_dtype, size_t n)
{
    const size_t es = st_dtype_size(src_dtype);
    const unsigned char *s = src;
    switch (t) {
    case CPU_WT_F32:
        pg_convert_to_f32((float *)dst + off, src, src_dtype, n);
        return 0;
    case CPU_WT_BF16: {
        uint16_t *d = (uint16_t *)dst + off;
        if (src_dtype == ST_BF16) {
            memcpy(d, src, n * sizeof *d);
            return 0;
        }
        float buf[256];
        for (size_t i = 0; i < n; i += 256) {
            const size_t m = n - i < 256 ? n - i : 256;
            pg_convert_to_f32(buf, s + i * es, src_dtype, m);
            for (size_t k = 0; k < m; k++)
                d[i + k] = pg_f32_to_bf16(buf[k]);
        }
        return 0;
    }
    case CPU_WT_I8: {
        if (off % CPU_I8_GROUP != 0)
            return 1;
        unsigned char *d = (unsigned char *)dst + off / CPU_I8_GROUP * CPU_I8_BLOCK_BYTES;
        float buf[CPU_I8_GROUP];
        for (size_t i = 0; i < n; i += CPU_I8_GROUP, d += CPU_I8_BLOCK_BYTES) {
            const size_t m = n - i < CPU_I8_GROUP ? n - i : CPU_I8_GROUP;
            pg_convert_to_f32(buf, s + i * es, src_dtype, m);
            i8_block(d, buf, m);
        }
        return 0;
    }
    case CPU_WT_COUNT:
        break;
    }
    return 1;
}

void cpu_wt_get_row(float *dst, const void *w, cpu_wt t, int64_t e0, int64_t n)
{
    if (t == CPU_WT_F32) {
        memcpy(dst, (const float *)w + e0, (size_t)n * sizeof *dst);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        dst[i] = cpu_wt_get(w, t, e0 + i);
}

size_t cpu_kv_bytes(cpu_kv t)
{
    return t == CPU_KV_F32 ? 4u : 2u;
}

void cpu_kv_store(cpu_kv t, void *dst, const float *src, int64_t n)
{
    uint16_t *d = dst;
    switch (t) {
    case CPU_KV_BF16:
        for (int64_t i = 0; i < n; i++) /* inline: vectorizes (dtype.h) */
            d[i] = pg_f32_to_bf16(src[i]);
        break;
    case CPU_KV_F16:
        for (int64_t i = 0; i < n; i++)
            d[i] = pg_f32_to_f16(src[i]);
        break;
    default:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    }
}

void cpu_kv_load(cpu_kv t, float *dst, const void *src, int64_t n)
{
    const uint16_t *s = src;
    switch (t) {
    case CPU_KV_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = pg_bf16_to_f32(s[i]);
        break;
    case CPU_KV_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = pg_f16_to_f32(s[i]);
        break;
    default:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    }
}
