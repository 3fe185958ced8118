/* cpu_attention: causal GQA attention over the paged KV cache (executor.h
 * "attention"), the reference the GPU kernel is tested against. Two
 * versions: cpu_op_attention (the fast one, what the executor runs) and
 * cpu_op_attention_ref (the simple twin it is tested against,
 * tests/ops/test_attention_fast.c). Both compute, for token t of sequence s
 * at position p, kv head g, query heads h = g*G .. g*G+G-1 (G = nh / nkv),
 * context positions j = lo..p, lo = 0 (full attention) or, with a sliding
 * window W = b->sliding_window > 0, lo = max(0, p - W + 1) (transformers'
 * sliding_window_overlay: kv_idx > q_idx - W, so W keys including p):
 *   slot_j   = block_tables[s][j / bs] * bs + j % bs
 *   k_j, v_j = k_cache/v_cache + slot_j * nkv*hd + g*hd       [hd] f32
 *   q_h      = qkv + t*(nh+2nkv)*hd + h*hd                    [hd] f32
 *   s[h][j]  = dot(q_h, k_j) * scale
 *   e[h][j]  = exp(s[h][j] - max_j s[h][j]); z_h = sum_j e[h][j]
 *   out[t][h*hd + d] = (sum_j e[h][j] * v_j[d]) * (1 / z_h)   (j order)
 * With a bf16 or f16 cache (ce->kv) k_j and v_j are the cached values
 * widened to f32 exactly (cpu_math.h cm_load_bf16 / cm_load_f16; the
 * twin: cpu_kv_load), and everything else is as with an f32 cache.
 * Every (t, h) is computed wholly by one chunk of work from its own inputs,
 * in an order fixed by (hd, p) alone, so a token's output does not depend on
 * the batch, the other sequences, its own query length or the thread count.
 *
 * The fast version's canonical order (what makes it bit-identical on every
 * instruction set: cpu_math.h, 16-lane vectors, multiply then add, no fma):
 *   dot:  lane l (0..15) sums q[d] * k[d] for d = l, l+16, ... in increasing
 *         d from +0 (the tail of hd read as zeros), then cm_hsum's tree
 *         (computed for 16 heads, or 16 rows of one head, at once by
 *         cm_hsum16: the same bits);
 *         s = dot * scale.
 *   max:  exact (any order gives the same value).
 *   e:    cm_exp(s - max), cpu_math.h's polynomial (not libm's expf).
 *   z:    sum of e[j] in increasing j from +0 (as the reference).
 *   out:  lane d: o[d] = o[d] + e[j] * v_j[d] for j = 0..p in order, from
 *         +0; then o[d] * (1 / z) (as the reference).
 * The reference keeps its own dot (8 lanes) and libm's expf: the two agree
 * to a few f32 ulps, not bit for bit (tests/ops/test_attention_fast.c also
 * checks the fast one against this order written out in scalar C).
 *
 * Speed (decode is a stream over the KV cache: ~1 MiB per token per layer
 * for a 110M model at 200 tokens of context). A work item is one token and
 * a range of its kv heads; at batch >= 2 * chunks every item takes all kv
 * heads, so it reads each KV block of its sequence as one contiguous
 * [bs][nkv][hd] run (the hardware prefetcher follows it), K once for the
 * scores of all query heads, then V once for all outputs; the block table is
 * read once per block. Scores are kept [j][head], so the dots of one K row
 * for 16 heads share one shuffle network (cm_hsum16) and the softmax runs
 * across 16 heads per vector. Items go to chunks in order, cut where the
 * summed cost (context length x heads) crosses an equal share; the pool runs
 * CHUNKS_PER_THREAD chunks per thread (a thread the OS delays holds only a
 * small share). Which chunk computes an item never changes its arithmetic.
 * Prefill: a sequence with several query rows in the step is cut into
 * tiles of up to ATTN_TILE_MAX consecutive rows, and an item is a tile x a
 * kv-head range (attn_tile): it walks its context once, and each K row
 * serves the dots of every (row, head) of the tile that reaches it (causal,
 * window), each V row their sums, while it sits in L1; otherwise a prompt of
 * P tokens streamed its K/V about P/2 times. Each (t, h) keeps the order
 * above, so a token's bits do not depend on its tile either (a tile of one
 * row, a decode, runs attn_item as before). Measured (2026-11-26, Zen 3
 * AVX2, 2 threads, 110m f32, --profile-ops, interleaved, best of 3): one
 * 512-token prompt with prompt logprobs, attention 903 -> 282 ms (17
 * GFLOP/s of mul + add; the forward 2923 -> 2150 ms); with a bf16 cache
 * 929 -> 374 ms, f16 2223 -> 560 ms; 64 prompts x 128 tokens, 15% -> 6% of
 * the forward (perf: 5% of the samples beside the GEMM's 76%). Tiles of 16
 * rows measured the same as 8 (ATTN_TILE_MAX) with twice the scratch.
 * Measured (bench/, 110m model, 2 cores): decode at batch 64 streams the
 * cache at about 19-20 GB/s of a 30 GB/s machine, 2.2-2.6x the old kernel; the
 * rest is DRAM latency across 4 KiB pages (huge pages for the KV cache gave
 * about 17% more in a micro-benchmark).
 * Vector width: cm_v16f is what the canonical order is written in, but on
 * AVX2 GCC 12 lowers a 64-byte vector's comparisons to a compare and branch
 * per lane, its 64-byte shuffles lane by lane, and a 64-byte value built
 * from two ymm through general registers. So the hot loops run in
 * attn_vf, the machine's vector (8 lanes on AVX2, 16 on AVX-512), each
 * 16-lane accumulator written as 16 / ATTN_VW parts; cm_hsum16 has its own
 * AVX2 network; the prefill softmax needs no per-lane ranges (scores out of
 * range are -inf); a tile over a 16-bit cache widens each group of rows
 * once for all its pairs. Same bits throughout. attention_bench, one
 * thread, Zen 3, 2026-11-26, before -> after: prefill 1 x 512 f32 36.4 ->
 * 15 ms, bf16 47.8 -> 19-23; 64 x 128 f32 168 -> 70-87, bf16 213 -> 103;
 * decode 64 at 512 f32 34.4 -> 14 (the memory ceiling), bf16 37.0 -> 9.8.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_math.h"
#include "cpu_ops.h"

/* cm_v16f values pass between static inline helpers only (cpu_math.h) */
#pragma GCC diagnostic ignored "-Wpsabi"

typedef struct attn_job {
    cpu_exec *ce;
    float *out;
    const float *qkv;
    const void *k_cache, *v_cache; /* of type ce->kv */
    int32_t nh, nkv, hd;
    float scale;
    const step_batch *b;
    /* fast version only */
    int32_t hsplit;             /* kv-head ranges per tile: items = n_tiles * hsplit */
    const int32_t *tiles;       /* [n_tiles + 1] first token row of each tile, then T */
    const int32_t *chunk_first; /* [n_chunks + 1] first item of each chunk */
    int32_t nhp;                /* nh rounded up to 16 */
    int32_t hdp;                /* hd rounded up to 16 */
    int64_t tile_e_floats;      /* score area of a tile item (attn_tile) */
    size_t chunk_floats;        /* scratch per chunk */
} attn_job;

/* first context position the token at position p attends to */
static inline int32_t attn_lo(const step_batch *b, int32_t p)
{
    const int32_t w = b->sliding_window;
    return w > 0 && p - w + 1 > 0 ? p - w + 1 : 0;
}

/* ---- the reference (the simple twin) --------------------------------------- */

/* dot(a, b) in 8 lanes: lane l sums i = l, l+8, ... in order; then a fixed
 * tree. The lane loop vectorizes without reassociation. */
static float attn_ref_dot(const float *a, const float *b, int32_t n)
{
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int32_t l = 0; l < 8; l++)
            acc[l] += a[i + l] * b[i + l];
    for (int32_t l = 0; i < n; i++, l++)
        acc[l] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* (t, g) pairs dealt round-robin (pair i -> worker i mod n); scratch of
 * worker w: scores [G][max_seq_len], then 1/z [G], then one K or V row
 * widened to f32 [hd]. */
static void attn_ref_worker(void *ctx, int32_t worker, int32_t n_workers)
{
    const attn_job *j = ctx;
    const step_batch *b = j->b;
    const int32_t hd = j->hd, nkv = j->nkv, G = j->nh / j->nkv, bs = b->block_size;
    const int64_t row = (int64_t)(j->nh + 2 * nkv) * hd, kvw = (int64_t)nkv * hd;
    const int64_t out_row = (int64_t)j->nh * hd;
    const int32_t ctx_cap = b->max_seq_len;
    float *scores = j->ce->scratch[worker].buf;
    float *inv_z = scores + (int64_t)G * ctx_cap;
    float *kvrow = inv_z + G;
    const cpu_kv kvt = j->ce->kv;
    const size_t eb = cpu_kv_bytes(kvt);
    const int64_t n_pairs = (int64_t)b->num_tokens * nkv;
    for (int64_t i = worker; i < n_pairs; i += n_workers) {
        const int32_t t = (int32_t)(i / nkv), g = (int32_t)(i % nkv);
        const int32_t s = j->ce->tok_seq[t], n_ctx = b->positions[t] + 1, lo = attn_lo(b, b->positions[t]);
        const int32_t *table = b->block_tables + (int64_t)s * b->block_table_stride;
        const float *q = j->qkv + t * row + (int64_t)g * G * hd;
        float *o = j->out + t * out_row + (int64_t)g * G * hd;

        for (int32_t c = lo; c < n_ctx; c++) {
            int64_t slot = (int64_t)table[c / bs] * bs + c % bs;
            const float *k = kvrow;
            cpu_kv_load(kvt, kvrow, (const char *)j->k_cache + (size_t)(slot * kvw + (int64_t)g * hd) * eb, hd);
            for (int32_t h = 0; h < G; h++)
                scores[(int64_t)h * ctx_cap + c] = attn_ref_dot(q + (int64_t)h * hd, k, hd) * j->scale;
        }
        for (int32_t h = 0; h < G; h++) {
            float *sc = scores + (int64_t)h * ctx_cap;
            float mx = sc[lo];
            for (int32_t c = lo + 1; c < n_ctx; c++)
                mx = sc[c] > mx ? sc[c] : mx;
            float z = 0.0f;
            for (int32_t c = lo; c < n_ctx; c++) {
                sc[c] = expf(sc[c] - mx);
                z += sc[c];
            }
            inv_z[h] = 1.0f / z;
            memset(o + (int64_t)h * hd, 0, (size_t)hd * sizeof(float));
        }
        for (int32_t c = lo; c < n_ctx; c++) {
            int64_t slot = (int64_t)table[c / bs] * bs + c % bs;
            const float *v = kvrow;
            cpu_kv_load(kvt, kvrow, (const char *)j->v_cache + (size_t)(slot * kvw + (int64_t)g * hd) * eb, hd);
            for (int32_t h = 0; h < G; h++) {
                const float e = scores[(int64_t)h * ctx_cap + c];
                float *oh = o + (int64_t)h * hd;
                for (int32_t d = 0; d < hd; d++)
                    oh[d] += e * v[d];
            }
        }
        for (int32_t h = 0; h < G; h++) {
            const float inv = inv_z[h];
            float *oh = o + (int64_t)h * hd;
            for (int32_t d = 0; d < hd; d++)
                oh[d] *= inv;
        }
    }
}

/* ---- the fast version ------------------------------------------------------ */

/* The hot inner loops use the machine's vector width (GCC splits a
 * 16-lane cm_v16f into memory round trips when it is kept in arrays on
 * AVX2, and turns its comparisons into a compare and branch per lane): a 16-lane dot accumulator is 16 / ATTN_VW vectors, lane l in
 * vector l / ATTN_VW; the sums and the widening are per element, so the
 * width changes no bits. */
#if !defined(ATTN_VW) /* 8 or 16; -DATTN_VW=16 tests the AVX-512 form elsewhere */
#if defined(__AVX512F__)
#define ATTN_VW 16
#else
#define ATTN_VW 8
#endif
#endif
typedef float attn_vf __attribute__((vector_size(ATTN_VW * 4)));
typedef int32_t attn_vi __attribute__((vector_size(ATTN_VW * 4)));

/* exp and max of ATTN_VW lanes: cm_exp's bits lane by lane; a > b ? a : b */
static inline __attribute__((always_inline)) attn_vf attn_vexp(attn_vf x)
{
#if ATTN_VW == 8
    return cm_exp8(x);
#else
    return cm_exp(x);
#endif
}
static inline __attribute__((always_inline)) attn_vf attn_vmax(attn_vf a, attn_vf b)
{
    const attn_vi m = (attn_vi)(a > b);
    return (attn_vf)(((attn_vi)a & m) | ((attn_vi)b & ~m));
}
static inline __attribute__((always_inline)) attn_vf attn_vload(const float *p)
{
    attn_vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline __attribute__((always_inline)) void attn_vstore(float *p, attn_vf v)
{
    memcpy(p, &v, sizeof v);
}

/* ATTN_VW cache elements from element e of c (type kvt), widened exactly
 * (cpu_math.h: cm_load_bf16 / cm_load_f16 at this width) */
static inline __attribute__((always_inline)) attn_vf attn_loadw(const void *c, int64_t e, const int kvt)
{
    attn_vf v;
    if (kvt == CPU_KV_F32) {
        memcpy(&v, (const float *)c + e, sizeof v);
        return v;
    }
    const uint16_t *h = (const uint16_t *)c + e;
#if ATTN_VW == 8
    return kvt == CPU_KV_BF16 ? cm_load_bf16_8(h) : cm_load_f16_8(h);
#else
    return kvt == CPU_KV_BF16 ? cm_load_bf16(h) : cm_load_f16(h);
#endif
}

/* elements [e, e + n) of c, zeros after; 0 < n < ATTN_VW (reads only n) */
static inline __attribute__((always_inline)) attn_vf attn_loadw_part(const void *c, int64_t e, int32_t n,
                                                                     const int kvt)
{
    if (kvt == CPU_KV_F32) {
        float f[ATTN_VW] = {0.0f};
        memcpy(f, (const float *)c + e, (size_t)n * sizeof(float));
        return attn_loadw(f, 0, kvt);
    }
    uint16_t h[ATTN_VW] = {0};
    memcpy(h, (const uint16_t *)c + e, (size_t)n * sizeof(uint16_t));
    return attn_loadw(h, 0, kvt);
}


/* Work chunks per pool thread (finer than threads: a late thread holds up
 * only a small share while the others take the rest). */
#define CHUNKS_PER_THREAD 4
/* Below this many query heads in an item the K dots are reduced one tree
 * per head (cm_hsum) instead of 16 at a time (cm_hsum16): same bits. */
#define ATTN_HSUM16_MIN_HEADS 6
/* At most this many chunks in all (the chunk table lives on the stack). */
#define MAX_CHUNKS 256

/* dot(qp, k) in 16 lanes (before the tree) into *acc; qp is zero-padded
 * to 16 * (nv + !!rem) floats, k = elements [ke, ke + nv * 16 + rem) of
 * the cache c. Lane l is lane l % ATTN_VW of part l / ATTN_VW (the
 * machine's vectors: no 16-lane value in registers, which GCC moves
 * through general registers on AVX2); a part wholly past the tail adds
 * nothing, which leaves its lanes (never -0) as adding q * 0 would. */
static inline __attribute__((always_inline)) void attn_dot_lanes(cm_v16f *acc, const float *qp, const void *c,
                                                                 int64_t ke, int32_t nv, int32_t rem, const int kvt)
{
    enum { P = CM_LANES / ATTN_VW };
    attn_vf part[P];
    for (int32_t p = 0; p < P; p++)
        part[p] = (attn_vf){0.0f};
    for (int32_t v = 0; v < nv; v++)
        for (int32_t p = 0; p < P; p++)
            part[p] = part[p] + attn_vload(qp + CM_LANES * v + ATTN_VW * p) *
                                    attn_loadw(c, ke + CM_LANES * v + ATTN_VW * p, kvt);
    for (int32_t p = 0; p < P && rem > ATTN_VW * p; p++) {
        const int32_t n = rem - ATTN_VW * p;
        const int64_t at = ke + CM_LANES * nv + ATTN_VW * p;
        part[p] = part[p] + attn_vload(qp + CM_LANES * nv + ATTN_VW * p) *
                                (n >= ATTN_VW ? attn_loadw(c, at, kvt) : attn_loadw_part(c, at, n, kvt));
    }
    memcpy(acc, part, sizeof *acc);
}

/* o[0..hd) += e * v[0..hd) lane by lane (o padded to 16 * (nv + !!rem));
 * v = elements [ve, ve + hd) of the cache c */
static inline __attribute__((always_inline)) void attn_axpy(float *o, float e, const void *c, int64_t ve, int32_t nv,
                                                            int32_t rem, const int kvt)
{
    const int32_t nw = (CM_LANES * nv + rem) / ATTN_VW, tail = (CM_LANES * nv + rem) % ATTN_VW;
    for (int32_t w = 0; w < nw; w++)
        attn_vstore(o + ATTN_VW * w, attn_vload(o + ATTN_VW * w) + e * attn_loadw(c, ve + ATTN_VW * w, kvt));
    if (tail)
        attn_vstore(o + ATTN_VW * nw,
                    attn_vload(o + ATTN_VW * nw) + e * attn_loadw_part(c, ve + ATTN_VW * nw, tail, kvt));
}

/* How many KV blocks ahead of the one being read a walk prefetches. A
 * decode item reads one kv head (hd elements) of every row, rows kvw
 * elements apart, blocks scattered over the pool: a strided, paged walk the
 * hardware prefetcher follows late, and the loads of K and V then waited on
 * DRAM (a third of a batch-1 int8 decode step in perf at 400 tokens of
 * context). A hint only: no value changes. */
#define ATTN_PF_BLOCKS 2
/* The hints fetch into L2 (prefetcht2), not L1: a narrow walk issues a hint
 * for every line of its run, and L1 has far fewer miss buffers than L2, so
 * hints into L1 stalled on them and left few lines in flight. Measured on a
 * 2-core Zen 4 (30 GB/s), 110m, batch-1 decode at 128-256 tokens of
 * context, --profile-ops, A/B runs interleaved: attention with a bf16 cache
 * 1050-1160 -> 303-307 us/token (with int8 weights 1019-1116 -> 334-399),
 * with an f32 cache 1037-1090 -> 712-732; at batch 64 (whole runs) decode
 * unchanged within noise, prefill 64-76 -> 57-58. */
#define ATTN_PF_LOCALITY 1
/* An item of all kv heads reads each block as one contiguous run
 * (bs * nkv * hd elements), which the hardware prefetcher streams by
 * itself; a hint per line then only competed with the loads for the miss
 * buffers (batch 64, 110m bf16, perf: a fifth of attention's samples on the
 * prefetch loop; ~10% more generated tok/s without it in A/B runs).
 * Such a run gets hints for its first lines only, across the jump to the
 * block's scattered page. */
#define ATTN_PF_WHOLE_RUN_LINES 8

/* prefetches the item's run of each row of context block blk (the run:
 * run_bytes from element offset g_off of a row), if the walk reaches it;
 * whole rows: the first lines of the block only */
static inline __attribute__((always_inline)) void attn_prefetch_block(const void *c, const int32_t *table, int32_t blk,
                                                                      int32_t bs, int32_t n_ctx, int64_t kvw,
                                                                      int64_t g_off, size_t run_bytes, size_t eb)
{
    const int32_t c0 = blk * bs;
    if (c0 >= n_ctx)
        return;
    const int32_t rows = n_ctx - c0 < bs ? n_ctx - c0 : bs;
    const char *base = (const char *)c + ((int64_t)table[blk] * bs * kvw + g_off) * (int64_t)eb;
    if (run_bytes == (size_t)kvw * eb) {
        for (int32_t o = 0; o < ATTN_PF_WHOLE_RUN_LINES; o++)
            __builtin_prefetch(base + (int64_t)o * 64, 0, ATTN_PF_LOCALITY);
        return;
    }
    for (int32_t r = 0; r < rows; r++)
        for (size_t o = 0; o < run_bytes; o += 64)
            __builtin_prefetch(base + (int64_t)r * kvw * (int64_t)eb + (int64_t)o, 0, ATTN_PF_LOCALITY);
}

/* Row stride of a narrow item's scores (attn_item), and the floats of a
 * chunk's score area (either layout). */
static inline int64_t attn_narrow_stride(int32_t max_seq_len)
{
    return ((int64_t)max_seq_len + CM_LANES - 1) / CM_LANES * CM_LANES + CM_LANES;
}
static inline int64_t attn_e_floats(int32_t max_seq_len, int32_t nhp)
{
    const int64_t wide = (int64_t)max_seq_len * nhp, narrow = (ATTN_HSUM16_MIN_HEADS - 1) * attn_narrow_stride(max_seq_len);
    return wide > narrow ? wide : narrow;
}

/* One item: token t, kv heads [g0, g1), query heads h0 .. h0+nhi-1 (local
 * index hi = h - h0). buf: this chunk's scratch,
 *   e     [max_seq_len][nhp]  scores, then exp(s - max), lanes = heads;
 *         an item of fewer than ATTN_HSUM16_MIN_HEADS heads (a decode item
 *         of one kv head) keeps them [nhi][Lp] instead, Lp = max_seq_len
 *         rounded up to 16, plus 16 (a store of 16 rows from the last one
 *         stays in its head's row; attn_e_floats): its softmax then runs
 *         16 rows of one head per vector, every lane used (cm_exp is
 *         lane-wise, the max exact and z summed in j order either way: the
 *         same bits)
 *   qp    [nh][hdp]           q, zero-padded
 *   o     [nh][hdp]           output accumulators
 *   inv_z [nhp]
 * (nhp = nh rounded up to 16; only the item's heads are used). */
static inline __attribute__((always_inline)) void attn_item(const attn_job *j, float *buf, int32_t t, int32_t g0,
                                                            int32_t g1, const int kvt)
{
    const step_batch *b = j->b;
    const int32_t hd = j->hd, hdp = j->hdp, nkv = j->nkv, G = j->nh / nkv, bs = b->block_size;
    const int32_t nv = hd / CM_LANES, rem = hd % CM_LANES, nhp = j->nhp;
    const int64_t kvw = (int64_t)nkv * hd;
    const int32_t s = j->ce->tok_seq[t], n_ctx = b->positions[t] + 1, lo = attn_lo(b, b->positions[t]);
    const int32_t *table = b->block_tables + (int64_t)s * b->block_table_stride;
    const int32_t h0 = g0 * G, nhi = (g1 - g0) * G;
    const int narrow = nhi < ATTN_HSUM16_MIN_HEADS;
    const int64_t Lp = attn_narrow_stride(b->max_seq_len);
    float *e = buf, *qp = e + attn_e_floats(b->max_seq_len, nhp), *o = qp + (int64_t)j->nh * hdp;
    float *inv_z = o + (int64_t)j->nh * hdp;

    const float *q = j->qkv + (int64_t)t * (j->nh + 2 * nkv) * hd + (int64_t)h0 * hd;
    for (int32_t hi = 0; hi < nhi; hi++) {
        memcpy(qp + (int64_t)hi * hdp, q + (int64_t)hi * hd, (size_t)hd * sizeof(float));
        memset(qp + (int64_t)hi * hdp + hd, 0, (size_t)(hdp - hd) * sizeof(float));
        memset(o + (int64_t)hi * hdp, 0, (size_t)hdp * sizeof(float));
    }

    const size_t eb = kvt == CPU_KV_F32 ? 4u : 2u, run_bytes = (size_t)(g1 - g0) * (size_t)hd * eb;
    for (int32_t d = 0; d < ATTN_PF_BLOCKS; d++)
        attn_prefetch_block(j->k_cache, table, lo / bs + d, bs, n_ctx, kvw, (int64_t)g0 * hd, run_bytes, eb);

    /* K: block by block, row by row (the item's kv heads of a row are one
     * contiguous run); the dots of up to 16 query heads are reduced at once */
    for (int32_t c0 = lo / bs * bs, blk = lo / bs; c0 < n_ctx; c0 += bs, blk++) {
        const int32_t rows = n_ctx - c0 < bs ? n_ctx - c0 : bs;
        attn_prefetch_block(j->k_cache, table, blk + ATTN_PF_BLOCKS, bs, n_ctx, kvw, (int64_t)g0 * hd, run_bytes, eb);
        const int64_t kb = (int64_t)table[blk] * bs * kvw + (int64_t)g0 * hd;
        const int32_t r0 = c0 < lo ? lo - c0 : 0;
        if (nhi < ATTN_HSUM16_MIN_HEADS) {
            /* few heads (a decode item of one kv head): the dots of up to 16
             * rows of one head are reduced at once: cm_hsum16 gives each
             * lane cm_hsum's bits, so each score is the value of one tree
             * per row and head, without a scalar tree per row */
            for (int32_t r = r0; r < rows; r += CM_LANES) {
                const int32_t nr = rows - r < CM_LANES ? rows - r : CM_LANES;
                for (int32_t hi = 0; hi < nhi; hi++) {
                    cm_v16f acc[CM_LANES];
                    for (int32_t i = 0; i < CM_LANES; i++)
                        if (i < nr)
                            attn_dot_lanes(&acc[i], qp + (int64_t)hi * hdp, j->k_cache,
                                           kb + (r + i) * kvw + (int64_t)(hi / G) * hd, nv, rem, kvt);
                        else
                            memset(&acc[i], 0, sizeof acc[i]);
                    /* rows c0 + r .. + 15 of head hi (past nr: written, never read) */
                    cm_store(e + hi * Lp + c0 + r, cm_hsum16(acc) * j->scale);
                }
            }
            continue;
        }
        for (int32_t r = r0; r < rows; r++) {
            const int64_t kr = kb + r * kvw;
            float *er = e + (int64_t)(c0 + r) * nhp;
            for (int32_t hg = 0; hg < nhi; hg += CM_LANES) {
                cm_v16f acc[CM_LANES];
                for (int32_t i = 0; i < CM_LANES; i++) {
                    const int32_t hi = hg + i;
                    if (hi < nhi)
                        attn_dot_lanes(&acc[i], qp + (int64_t)hi * hdp, j->k_cache, kr + (int64_t)(hi / G) * hd, nv,
                                       rem, kvt);
                    else
                        memset(&acc[i], 0, sizeof acc[i]);
                }
                cm_store(er + hg, cm_hsum16(acc) * j->scale);
            }
        }
    }
    /* V's first blocks load while the softmax runs */
    for (int32_t d = 0; d < ATTN_PF_BLOCKS; d++)
        attn_prefetch_block(j->v_cache, table, lo / bs + d, bs, n_ctx, kvw, (int64_t)g0 * hd, run_bytes, eb);

    /* softmax: max, e = exp(s - max), z summed in j order; narrow: one head
     * at a time, 16 rows per vector */
    for (int32_t hi = 0; narrow && hi < nhi; hi++) {
        float *eh = e + hi * Lp;
        float mx = eh[lo];
        for (int32_t c = lo + 1; c < n_ctx; c++)
            mx = eh[c] > mx ? eh[c] : mx;
        const attn_vf mxv = (attn_vf){0.0f} + mx;
        for (int32_t c = lo; c < n_ctx; c += ATTN_VW) /* past n_ctx: inside Lp, unused */
            attn_vstore(eh + c, attn_vexp(attn_vload(eh + c) - mxv));
        float z = 0.0f;
        for (int32_t c = lo; c < n_ctx; c++)
            z += eh[c];
        inv_z[hi] = 1.0f / z;
    }
    /* wide: 16 heads per vector, one row at a time */
    for (int32_t hg = 0; !narrow && hg < nhi; hg += ATTN_VW) {
        attn_vf mx = attn_vload(e + (int64_t)lo * nhp + hg);
        for (int32_t c = lo + 1; c < n_ctx; c++)
            mx = attn_vmax(mx, attn_vload(e + (int64_t)c * nhp + hg));
        attn_vf z = {0.0f};
        for (int32_t c = lo; c < n_ctx; c++) {
            const attn_vf ec = attn_vexp(attn_vload(e + (int64_t)c * nhp + hg) - mx);
            attn_vstore(e + (int64_t)c * nhp + hg, ec);
            z = z + ec;
        }
        attn_vstore(inv_z + hg, 1.0f / z);
    }

    /* V: the same walk, every query head's output accumulates over j */
    for (int32_t c0 = lo / bs * bs, blk = lo / bs; c0 < n_ctx; c0 += bs, blk++) {
        const int32_t rows = n_ctx - c0 < bs ? n_ctx - c0 : bs;
        const int64_t vb = (int64_t)table[blk] * bs * kvw + (int64_t)g0 * hd;
        attn_prefetch_block(j->v_cache, table, blk + ATTN_PF_BLOCKS, bs, n_ctx, kvw, (int64_t)g0 * hd, run_bytes, eb);
        for (int32_t r = c0 < lo ? lo - c0 : 0; r < rows; r++) {
            const int64_t vr = vb + r * kvw;
            for (int32_t hi = 0; hi < nhi; hi++) {
                const float ej = narrow ? e[hi * Lp + c0 + r] : e[(int64_t)(c0 + r) * nhp + hi];
                attn_axpy(o + (int64_t)hi * hdp, ej, j->v_cache, vr + (int64_t)(hi / G) * hd, nv, rem, kvt);
            }
        }
    }

    float *out = j->out + (int64_t)t * j->nh * hd + (int64_t)h0 * hd;
    for (int32_t hi = 0; hi < nhi; hi++) {
        const float inv = inv_z[hi];
        const float *oh = o + (int64_t)hi * hdp;
        float *dst = out + (int64_t)hi * hd;
        for (int32_t i = 0; i < nv; i++)
            cm_store(dst + CM_LANES * i, cm_load(oh + CM_LANES * i) * inv);
        if (rem) {
            const cm_v16f last = cm_load(oh + CM_LANES * nv) * inv;
            memcpy(dst + CM_LANES * nv, &last, (size_t)rem * sizeof(float));
        }
    }
}

/* ---- prefill tiles ------------------------------------------------------------ */


/* Most query rows in one tile (attn_tile): a K or V row read from the cache
 * serves the dots and sums of all of them while it is in L1. */
#define ATTN_TILE_MAX 8
/* A tile's score area is capped at this many floats (per chunk): long
 * contexts get shorter tiles (cpu_op_attention). */
#define ATTN_TILE_E_MAX_FLOATS ((int64_t)1 << 20)

static inline int32_t attn_round16(int32_t n)
{
    return (n + CM_LANES - 1) / CM_LANES * CM_LANES;
}

/* Rows [0, nr) of a 16-bit cache c, each the run [at + i * stride, + gw),
 * widened exactly into dst [nr][gw]; returns dst */
static inline __attribute__((always_inline)) const float *attn_widen_rows(float *dst, const void *c, int64_t at,
                                                                          int64_t stride, int64_t gw, int32_t nr,
                                                                          const int kvt)
{
    for (int32_t i = 0; i < nr; i++) {
        int64_t x = 0;
        for (; x + ATTN_VW <= gw; x += ATTN_VW)
            attn_vstore(dst + i * gw + x, attn_loadw(c, at + i * stride + x, kvt));
        if (x < gw) {
            const attn_vf t = attn_loadw_part(c, at + i * stride + x, (int32_t)(gw - x), kvt);
            memcpy(dst + i * gw + x, &t, (size_t)(gw - x) * sizeof(float));
        }
    }
    return dst;
}

/* One tile item: query rows t0 .. t0+nt-1 (2 <= nt <= ATTN_TILE_MAX) of one
 * sequence, kv heads [g0, g1), query heads h0 .. h0+nhi-1. The tile's pairs
 * (token tt, local head hi) are numbered q = tt * nhi + hi; pair q attends to
 * positions [lo[tt], n[tt]) of the tile's span [jlo, jhi) (the union). The
 * walk is the one of attn_item over the span, once for the whole tile, in
 * groups of up to 16 rows of a block (in L1 while every pair uses them):
 * for each pair the dots of the group's rows it reaches (16 rows per
 * cm_hsum16; a row out of its token's range scores -inf), then the
 * softmax over the span with ATTN_VW pairs per vector (a -inf score adds
 * exp = +0 to z), then for each pair its sums over the group's V rows in
 * increasing j.
 * Every pair sees the canonical order of the header: attn_item's bits.
 * buf: this chunk's scratch,
 *   e     [jhi - jlo][npp]     scores, then exp(s - max), lanes = pairs
 *         (npp = nt * nhi rounded up to 16; at most j->tile_e_floats)
 *   qp    [nt * nhi][hdp]      q, zero-padded
 *   o     [nt * nhi][hdp]      output accumulators
 *   inv_z [npp]
 *   rows  [16][(g1 - g0) * hd] a bf16 or f16 cache's group of K (then V)
 *         rows, widened once for all pairs (exactly, as attn_loadw)
 *         instead of once per pair */
static inline __attribute__((always_inline)) void attn_tile(const attn_job *j, float *buf, int32_t t0, int32_t nt,
                                                            int32_t g0, int32_t g1, const int kvt, const int NV)
{
    const step_batch *b = j->b;
    const int32_t hd = j->hd, hdp = j->hdp, nkv = j->nkv, G = j->nh / nkv, bs = b->block_size;
    const int32_t nv = hd / CM_LANES, rem = hd % CM_LANES;
    const int64_t kvw = (int64_t)nkv * hd, row = (int64_t)(j->nh + 2 * nkv) * hd;
    const int32_t s = j->ce->tok_seq[t0];
    const int32_t *table = b->block_tables + (int64_t)s * b->block_table_stride;
    const int32_t h0 = g0 * G, nhi = (g1 - g0) * G, np = nt * nhi, npp = attn_round16(np);
    int32_t lo[ATTN_TILE_MAX], n[ATTN_TILE_MAX], jlo = INT32_MAX, jhi = 0;
    for (int32_t tt = 0; tt < nt; tt++) {
        n[tt] = b->positions[t0 + tt] + 1;
        lo[tt] = attn_lo(b, b->positions[t0 + tt]);
        jlo = lo[tt] < jlo ? lo[tt] : jlo;
        jhi = n[tt] > jhi ? n[tt] : jhi;
    }
    float *e = buf, *qp = e + j->tile_e_floats, *o = qp + (int64_t)ATTN_TILE_MAX * j->nh * hdp;
    float *inv_z = o + (int64_t)ATTN_TILE_MAX * j->nh * hdp;
    float *rows_w = inv_z + attn_round16(ATTN_TILE_MAX * j->nh);
    const int64_t gw = (int64_t)(g1 - g0) * hd; /* the item's run of a row */

    for (int32_t tt = 0; tt < nt; tt++) {
        const float *q = j->qkv + (int64_t)(t0 + tt) * row + (int64_t)h0 * hd;
        for (int32_t hi = 0; hi < nhi; hi++) {
            float *qd = qp + (int64_t)(tt * nhi + hi) * hdp;
            memcpy(qd, q + (int64_t)hi * hd, (size_t)hd * sizeof(float));
            memset(qd + hd, 0, (size_t)(hdp - hd) * sizeof(float));
            memset(o + (int64_t)(tt * nhi + hi) * hdp, 0, (size_t)hdp * sizeof(float));
        }
    }

    /* A score a pair does not reach (outside its token's [lo, n), or a lane
     * past the last pair) is -inf, so the softmax needs no range per lane:
     * the max over the span is the max over the range, exp(-inf - max) is
     * +0, and z + +0 leaves z (>= +0) as it is. */
    for (int32_t c = jlo; np < npp && c < jhi; c++)
        for (int32_t q = np; q < npp; q++)
            e[(int64_t)(c - jlo) * npp + q] = -INFINITY;

    const size_t eb = kvt == CPU_KV_F32 ? 4u : 2u, run_bytes = (size_t)(g1 - g0) * (size_t)hd * eb;
    for (int32_t d = 0; d < ATTN_PF_BLOCKS; d++)
        attn_prefetch_block(j->k_cache, table, jlo / bs + d, bs, jhi, kvw, (int64_t)g0 * hd, run_bytes, eb);

    /* K: groups of up to 16 rows of a block; for each pair, the dots of the
     * rows its token reaches (q in registers when NV is known), reduced
     * 16 rows at once (cm_hsum16: cm_hsum's bits), stored into the rows'
     * lanes of the pair; the rows of a group stay in L1 for all pairs */
    for (int32_t c0 = jlo / bs * bs, blk = jlo / bs; c0 < jhi; c0 += bs, blk++) {
        const int32_t rows = jhi - c0 < bs ? jhi - c0 : bs;
        attn_prefetch_block(j->k_cache, table, blk + ATTN_PF_BLOCKS, bs, jhi, kvw, (int64_t)g0 * hd, run_bytes, eb);
        const int64_t kb = (int64_t)table[blk] * bs * kvw + (int64_t)g0 * hd;
        for (int32_t r = c0 < jlo ? jlo - c0 : 0; r < rows; r += CM_LANES) {
            const int32_t jj0 = c0 + r, nr = rows - r < CM_LANES ? rows - r : CM_LANES;
            /* the group's K rows as f32: the cache itself, or widened once */
            const float *kf = kvt == CPU_KV_F32 ? (const float *)j->k_cache + kb + (int64_t)r * kvw
                                                : attn_widen_rows(rows_w, j->k_cache, kb + (int64_t)r * kvw, kvw, gw,
                                                                  nr, kvt);
            const int64_t ks = kvt == CPU_KV_F32 ? kvw : gw;
            for (int32_t tt = 0; tt < nt; tt++) {
                const int32_t ra = lo[tt] - jj0 > 0 ? lo[tt] - jj0 : 0, rb = n[tt] - jj0 < nr ? n[tt] - jj0 : nr;
                if (ra >= rb) { /* the token reaches none of these rows */
                    for (int32_t i = 0; i < nr; i++)
                        for (int32_t hi = 0; hi < nhi; hi++)
                            e[(int64_t)(jj0 + i - jlo) * npp + tt * nhi + hi] = -INFINITY;
                    continue;
                }
                for (int32_t hi = 0; hi < nhi; hi++) {
                    const int32_t q = tt * nhi + hi;
                    const float *qq = qp + (int64_t)q * hdp;
                    const int64_t kr = (int64_t)(hi / G) * hd;
                    enum { P = CM_LANES / ATTN_VW };
                    const int32_t NW = NV * P; /* <= 16: NV <= 8 */
                    attn_vf qv[16];
                    cm_v16f acc[CM_LANES];
                    for (int32_t w = 0; w < NW; w++)
                        memcpy(&qv[w], qq + ATTN_VW * w, sizeof qv[w]);
                    for (int32_t i = 0; i < CM_LANES; i++) {
                        if (i < ra || i >= rb) {
                            acc[i] = cm_zero();
                        } else if (NV > 0) {
                            /* lane l of the 16: part l / ATTN_VW, d = l, l + 16, ... in order */
                            attn_vf part[P];
                            for (int32_t p = 0; p < P; p++)
                                part[p] = (attn_vf){0.0f};
                            for (int32_t w = 0; w < NW; w++)
                                part[w % P] = part[w % P] + qv[w] * attn_loadw(kf, kr + i * ks + ATTN_VW * w, CPU_KV_F32);
                            memcpy(&acc[i], part, sizeof acc[i]);
                        } else {
                            /* any hd: q from L1 (zero-padded to hdp), the tail
                             * of k read as zeros */
                            attn_vf part[P];
                            for (int32_t p = 0; p < P; p++)
                                part[p] = (attn_vf){0.0f};
                            int32_t w = 0;
                            for (; w < hd / ATTN_VW; w++) {
                                attn_vf qw;
                                memcpy(&qw, qq + ATTN_VW * w, sizeof qw);
                                part[w % P] = part[w % P] + qw * attn_loadw(kf, kr + i * ks + ATTN_VW * w, CPU_KV_F32);
                            }
                            if (hd % ATTN_VW) {
                                attn_vf qw;
                                memcpy(&qw, qq + ATTN_VW * w, sizeof qw);
                                part[w % P] = part[w % P] + qw * attn_loadw_part(kf, kr + i * ks + ATTN_VW * w,
                                                                                 hd % ATTN_VW, CPU_KV_F32);
                            }
                            memcpy(&acc[i], part, sizeof acc[i]);
                        }
                    }
                    const cm_v16f sc = cm_hsum16(acc) * j->scale;
                    float *eq = e + (int64_t)(jj0 - jlo) * npp + q;
                    for (int32_t i = 0; i < nr; i++)
                        eq[(int64_t)i * npp] = i >= ra && i < rb ? sc[i] : -INFINITY;
                }
            }
        }
    }
    for (int32_t d = 0; d < ATTN_PF_BLOCKS; d++)
        attn_prefetch_block(j->v_cache, table, jlo / bs + d, bs, jhi, kvw, (int64_t)g0 * hd, run_bytes, eb);

    /* softmax, 16 pairs per vector, over the whole span (scores out of a
     * pair's range are -inf, above): the max is exact in any order (NaN
     * aside: a NaN score makes the pair's output NaN either way), e =
     * exp(s - max), z summed in j order (attn_item's bits) */
    for (int32_t qg = 0; qg < np; qg += ATTN_VW) {
        attn_vf mx = (attn_vf){0.0f} + -INFINITY;
        for (int32_t c = jlo; c < jhi; c++)
            mx = attn_vmax(attn_vload(e + (int64_t)(c - jlo) * npp + qg), mx);
        attn_vf z = {0.0f};
        for (int32_t c = jlo; c < jhi; c++) {
            float *ep = e + (int64_t)(c - jlo) * npp + qg;
            const attn_vf ec = attn_vexp(attn_vload(ep) - mx);
            attn_vstore(ep, ec);
            z = z + ec;
        }
        attn_vstore(inv_z + qg, 1.0f / z);
    }

    /* V: the same groups of rows; each pair's sums over the rows its token
     * reaches, in increasing j (o in registers when NV is known) */
    for (int32_t c0 = jlo / bs * bs, blk = jlo / bs; c0 < jhi; c0 += bs, blk++) {
        const int32_t rows = jhi - c0 < bs ? jhi - c0 : bs;
        const int64_t vb = (int64_t)table[blk] * bs * kvw + (int64_t)g0 * hd;
        attn_prefetch_block(j->v_cache, table, blk + ATTN_PF_BLOCKS, bs, jhi, kvw, (int64_t)g0 * hd, run_bytes, eb);
        for (int32_t r = c0 < jlo ? jlo - c0 : 0; r < rows; r += CM_LANES) {
            const int32_t jj0 = c0 + r, nr = rows - r < CM_LANES ? rows - r : CM_LANES;
            const float *vf = kvt == CPU_KV_F32 ? (const float *)j->v_cache + vb + (int64_t)r * kvw
                                                : attn_widen_rows(rows_w, j->v_cache, vb + (int64_t)r * kvw, kvw, gw,
                                                                  nr, kvt);
            const int64_t vs = kvt == CPU_KV_F32 ? kvw : gw;
            for (int32_t tt = 0; tt < nt; tt++) {
                const int32_t ra = lo[tt] - jj0 > 0 ? lo[tt] - jj0 : 0, rb = n[tt] - jj0 < nr ? n[tt] - jj0 : nr;
                for (int32_t hi = 0; hi < nhi && ra < rb; hi++) {
                    const int32_t q = tt * nhi + hi;
                    float *oq = o + (int64_t)q * hdp;
                    const float *eq = e + (int64_t)(jj0 - jlo) * npp + q;
                    const int64_t vr = (int64_t)(hi / G) * hd;
                    if (NV > 0) {
                        const int32_t NW = NV * (CM_LANES / ATTN_VW); /* <= 16: NV <= 8 */
                        attn_vf ov[16];
                        memcpy(ov, oq, (size_t)NW * sizeof ov[0]);
                        for (int32_t i = ra; i < rb; i++) {
                            const float ej = eq[(int64_t)i * npp];
                            for (int32_t w = 0; w < NW; w++)
                                ov[w] = ov[w] + ej * attn_loadw(vf, vr + i * vs + ATTN_VW * w, CPU_KV_F32);
                        }
                        memcpy(oq, ov, (size_t)NW * sizeof ov[0]);
                    } else {
                        /* any hd: o in L1 (padded to hdp), the tail of v read
                         * as zeros */
                        for (int32_t i = ra; i < rb; i++) {
                            const float ej = eq[(int64_t)i * npp];
                            int32_t w = 0;
                            for (; w < hd / ATTN_VW; w++) {
                                attn_vf ow;
                                memcpy(&ow, oq + ATTN_VW * w, sizeof ow);
                                ow = ow + ej * attn_loadw(vf, vr + i * vs + ATTN_VW * w, CPU_KV_F32);
                                memcpy(oq + ATTN_VW * w, &ow, sizeof ow);
                            }
                            if (hd % ATTN_VW) {
                                attn_vf ow;
                                memcpy(&ow, oq + ATTN_VW * w, sizeof ow);
                                ow = ow + ej * attn_loadw_part(vf, vr + i * vs + ATTN_VW * w, hd % ATTN_VW, CPU_KV_F32);
                                memcpy(oq + ATTN_VW * w, &ow, sizeof ow);
                            }
                        }
                    }
                }
            }
        }
    }

    for (int32_t tt = 0; tt < nt; tt++) {
        float *out = j->out + (int64_t)(t0 + tt) * j->nh * hd + (int64_t)h0 * hd;
        for (int32_t hi = 0; hi < nhi; hi++) {
            const int32_t q = tt * nhi + hi;
            const float inv = inv_z[q];
            const float *oh = o + (int64_t)q * hdp;
            float *dst = out + (int64_t)hi * hd;
            for (int32_t i = 0; i < nv; i++)
                cm_store(dst + CM_LANES * i, cm_load(oh + CM_LANES * i) * inv);
            if (rem) {
                const cm_v16f last = cm_load(oh + CM_LANES * nv) * inv;
                memcpy(dst + CM_LANES * nv, &last, (size_t)rem * sizeof(float));
            }
        }
    }
}

/* attn_item (one token) or attn_tile, for each cache type (the loads are
 * inlined per type) and head size 64 and 128 (q or o of a pair in
 * registers: NV = hd / 16 vectors) */
static void attn_tile_f32(const attn_job *j, float *buf, int32_t t0, int32_t nt, int32_t g0, int32_t g1)
{
    if (nt == 1)
        attn_item(j, buf, t0, g0, g1, CPU_KV_F32);
    else if (j->hd == 64)
        attn_tile(j, buf, t0, nt, g0, g1, CPU_KV_F32, 4);
    else if (j->hd == 128)
        attn_tile(j, buf, t0, nt, g0, g1, CPU_KV_F32, 8);
    else
        attn_tile(j, buf, t0, nt, g0, g1, CPU_KV_F32, 0);
}
static void attn_tile_bf16(const attn_job *j, float *buf, int32_t t0, int32_t nt, int32_t g0, int32_t g1)
{
    if (nt == 1)
        attn_item(j, buf, t0, g0, g1, CPU_KV_BF16);
    else if (j->hd == 64)
        attn_tile(j, buf, t0, nt, g0, g1, CPU_KV_BF16, 4);
    else if (j->hd == 128)
        attn_tile(j, buf, t0, nt, g0, g1, CPU_KV_BF16, 8);
    else
        attn_tile(j, buf, t0, nt, g0, g1, CPU_KV_BF16, 0);
}
static void attn_tile_f16(const attn_job *j, float *buf, int32_t t0, int32_t nt, int32_t g0, int32_t g1)
{
    if (nt == 1)
        attn_item(j, buf, t0, g0, g1, CPU_KV_F16);
    else if (j->hd == 64)
        attn_tile(j, buf, t0, nt, g0, g1, CPU_KV_F16, 4);
    else if (j->hd == 128)
        attn_tile(j, buf, t0, nt, g0, g1, CPU_KV_F16, 8);
    else
        attn_tile(j, buf, t0, nt, g0, g1, CPU_KV_F16, 0);
}

/* kv heads [*g0, *g1) of item part `part` of hsplit */
static void attn_heads(int32_t nkv, int32_t part, int32_t hsplit, int32_t *g0, int32_t *g1)
{
    int64_t lo, hi;
    cpu_pool_range(nkv, part, hsplit, 1, &lo, &hi);
    *g0 = (int32_t)lo;
    *g1 = (int32_t)hi;
}

static void attn_chunk(void *ctx, int32_t chunk, int32_t n_chunks)
{
    (void)n_chunks;
    const attn_job *j = ctx;
    const int32_t nt = j->ce->n_threads;
    /* chunk c: region c / nt of worker c % nt's scratch (no two chunks share one) */
    float *buf = j->ce->scratch[chunk % nt].buf + (size_t)(chunk / nt) * j->chunk_floats;
    void (*item)(const attn_job *, float *, int32_t, int32_t, int32_t, int32_t) =
        j->ce->kv == CPU_KV_BF16 ? attn_tile_bf16 : (j->ce->kv == CPU_KV_F16 ? attn_tile_f16 : attn_tile_f32);
    for (int32_t i = j->chunk_first[chunk]; i < j->chunk_first[chunk + 1]; i++) {
        int32_t g0, g1;
        attn_heads(j->nkv, i % j->hsplit, j->hsplit, &g0, &g1);
        const int32_t t0 = j->tiles[i / j->hsplit];
        item(j, buf, t0, j->tiles[i / j->hsplit + 1] - t0, g0, g1);
    }
}

/* ---- entry points ----------------------------------------------------------- */

/* Checks the batch's attention inputs and fills ce->tok_seq. */
static int attn_prepare(cpu_exec *ce, const step_batch *b)
{
    const int32_t T = b->num_tokens;
    if (!b->positions || !b->seq_lens || !b->block_tables)
        return cpu_exec_fail(ce, PG_EINVAL, "attention: positions, seq_lens and block_tables are required");
    if (b->sliding_window < 0)
        return cpu_exec_fail(ce, PG_EINVAL, "attention: expected sliding_window >= 0, got %d", (int)b->sliding_window);
    if ((size_t)T > ce->tok_seq_cap) {
        int32_t *p = realloc(ce->tok_seq, (size_t)T * sizeof *p);
        if (!p)
            return cpu_exec_fail(ce, PG_ENOMEM, "attention: out of memory for %d token rows", (int)T);
        ce->tok_seq = p;
        ce->tok_seq_cap = (size_t)T;
    }
    int32_t max_len = 0;
    for (int32_t s = 0; s < b->num_seqs; s++) {
        int32_t len = b->seq_lens[s];
        if (len > max_len)
            max_len = len;
        int32_t n_blocks = (len + b->block_size - 1) / b->block_size;
        if (n_blocks > b->block_table_stride)
            return cpu_exec_fail(ce, PG_EINVAL, "attention: sequence %d: seq_len %d needs %d blocks, table stride is %d",
                                 (int)s, (int)len, (int)n_blocks, (int)b->block_table_stride);
        const int32_t *table = b->block_tables + (int64_t)s * b->block_table_stride;
        int32_t p_min = len;
        for (int32_t t = b->query_start[s]; t < b->query_start[s + 1]; t++) {
            if (b->positions[t] < 0 || b->positions[t] >= len)
                return cpu_exec_fail(ce, PG_EINVAL, "attention: token %d of sequence %d: expected position in [0,%d), got %d",
                                     (int)t, (int)s, (int)len, (int)b->positions[t]);
            ce->tok_seq[t] = s;
            if (b->positions[t] < p_min)
                p_min = b->positions[t];
        }
        /* a block wholly below the lowest key any query reads may be null
         * (dropped behind the sliding window); any other must be a block */
        const int32_t lo = p_min < len ? attn_lo(b, p_min) : 0;
        for (int32_t k = 0; k < n_blocks; k++)
            if (table[k] < 0 && (int64_t)(k + 1) * b->block_size > lo)
                return cpu_exec_fail(ce, PG_EINVAL, "attention: sequence %d: block table entry %d is %d, expected a "
                                     "block id >= 0 (it holds positions the queries read, from %d on)",
                                     (int)s, (int)k, (int)table[k], (int)lo);
    }
    if (max_len > b->max_seq_len)
        return cpu_exec_fail(ce, PG_EINVAL, "attention: max_seq_len is %d but a sequence has %d tokens",
                             (int)b->max_seq_len, (int)max_len);
    return PG_OK;
}

int cpu_op_attention_ref(cpu_exec *ce, float *out, const float *qkv, const void *k_cache,
                         const void *v_cache, int32_t nh, int32_t nkv, int32_t hd, float scale,
                         const step_batch *b)
{
    int rc = attn_prepare(ce, b);
    if (rc)
        return rc;
    /* scores [G][max_seq_len], then 1/z [G], then a K/V row [hd] */
    rc = cpu_exec_scratch(ce, (size_t)(nh / nkv) * ((size_t)b->max_seq_len + 1) + (size_t)hd);
    if (rc)
        return rc;
    attn_job job = {.ce = ce, .out = out, .qkv = qkv, .k_cache = k_cache, .v_cache = v_cache,
                    .nh = nh, .nkv = nkv, .hd = hd, .scale = scale, .b = b};
    double work = (double)b->num_tokens * nh * hd * (double)b->max_seq_len;
    cpu_pool_run(ce->pool, work < 32768.0 ? 1 : ce->n_threads, attn_ref_worker, &job);
    return PG_OK;
}

/* Cuts the step's query rows into tiles of up to nt_max consecutive rows of
 * one sequence (ce->attn_tiles: n_tiles + 1 entries, the last T); returns
 * n_tiles, and in *e_floats the largest score area of a tile of >= 2 rows
 * (span x pairs rounded up to 16, all nh heads). */
static int32_t attn_cut_tiles(cpu_exec *ce, const step_batch *b, int32_t nh, int32_t nt_max, int64_t *e_floats)
{
    int32_t n_tiles = 0;
    *e_floats = 0;
    for (int32_t s = 0; s < b->num_seqs; s++)
        for (int32_t t0 = b->query_start[s]; t0 < b->query_start[s + 1]; t0 += nt_max) {
            const int32_t nt = b->query_start[s + 1] - t0 < nt_max ? b->query_start[s + 1] - t0 : nt_max;
            ce->attn_tiles[n_tiles++] = t0;
            if (nt < 2)
                continue;
            int32_t jlo = INT32_MAX, jhi = 0;
            for (int32_t t = t0; t < t0 + nt; t++) {
                const int32_t l = attn_lo(b, b->positions[t]);
                jlo = l < jlo ? l : jlo;
                jhi = b->positions[t] + 1 > jhi ? b->positions[t] + 1 : jhi;
            }
            const int64_t ef = (int64_t)(jhi - jlo) * attn_round16(nt * nh);
            *e_floats = ef > *e_floats ? ef : *e_floats;
        }
    ce->attn_tiles[n_tiles] = b->num_tokens;
    return n_tiles;
}

int cpu_op_attention(cpu_exec *ce, float *out, const float *qkv, const void *k_cache,
                     const void *v_cache, int32_t nh, int32_t nkv, int32_t hd, float scale,
                     const step_batch *b)
{
    int rc = attn_prepare(ce, b);
    if (rc)
        return rc;
    const int32_t T = b->num_tokens;
    if ((size_t)T + 1 > ce->attn_tiles_cap) {
        int32_t *p = realloc(ce->attn_tiles, ((size_t)T + 1) * sizeof *p);
        if (!p)
            return cpu_exec_fail(ce, PG_ENOMEM, "attention: out of memory for %d tiles", (int)T + 1);
        ce->attn_tiles = p;
        ce->attn_tiles_cap = (size_t)T + 1;
    }
    /* tiles of ATTN_TILE_MAX rows, shorter where the score area would pass
     * ATTN_TILE_E_MAX_FLOATS (which tile a row is in never changes its bits) */
    int32_t nt_max = ATTN_TILE_MAX, n_tiles;
    int64_t tile_e = 0;
    for (;;) {
        n_tiles = attn_cut_tiles(ce, b, nh, nt_max, &tile_e);
        if (nt_max == 1 || tile_e <= ATTN_TILE_E_MAX_FLOATS)
            break;
        nt_max /= 2;
    }
    /* cost of token t: context x heads (+ a fixed part per token) */
    double work = 0.0;
    for (int32_t t = 0; t < T; t++)
        work += (double)(b->positions[t] + 1 - attn_lo(b, b->positions[t]));
    work *= (double)nh * hd;
    int32_t n_chunks = work < 32768.0 ? 1 : ce->n_threads * CHUNKS_PER_THREAD;
    if (n_chunks > MAX_CHUNKS)
        n_chunks = MAX_CHUNKS;
    /* all kv heads in one item unless there are too few tiles to share */
    int32_t hsplit = 1;
    while (hsplit < nkv && (int64_t)n_tiles * hsplit < 2 * (int64_t)n_chunks)
        hsplit++;
    const int64_t items = (int64_t)n_tiles * hsplit;
    if (n_chunks > items)
        n_chunks = (int32_t)items;

    attn_job job = {.ce = ce, .out = out, .qkv = qkv, .k_cache = k_cache, .v_cache = v_cache,
                    .nh = nh, .nkv = nkv, .hd = hd, .scale = scale, .b = b, .hsplit = hsplit,
                    .tiles = ce->attn_tiles};
    job.hdp = (hd + CM_LANES - 1) / CM_LANES * CM_LANES;
    job.nhp = attn_round16(nh);
    job.tile_e_floats = tile_e;
    /* an item of one row (attn_item) or a tile (attn_tile): the larger */
    const size_t item_floats = (size_t)attn_e_floats(b->max_seq_len, job.nhp) + (size_t)job.nhp +
                               2 * (size_t)nh * (size_t)job.hdp;
    const size_t tile_floats = nt_max < 2 ? 0
                                          : (size_t)tile_e + (size_t)attn_round16(ATTN_TILE_MAX * nh) +
                                                2 * (size_t)ATTN_TILE_MAX * (size_t)nh * (size_t)job.hdp +
                                                (ce->kv == CPU_KV_F32 ? 0 : (size_t)CM_LANES * (size_t)nkv * (size_t)hd);
    job.chunk_floats = item_floats > tile_floats ? item_floats : tile_floats;
    const int32_t per_worker = (n_chunks + ce->n_threads - 1) / ce->n_threads;
    rc = cpu_exec_scratch(ce, (size_t)per_worker * job.chunk_floats);
    if (rc)
        return rc;

    /* cut the items into n_chunks runs of about equal cost: a tile's is the
     * sum over its rows */
    int32_t first[MAX_CHUNKS + 1];
    double total = 0.0;
    for (int32_t t = 0; t < T; t++)
        total += (double)(b->positions[t] + 1 - attn_lo(b, b->positions[t]) + 16) * nkv;
    first[0] = 0;
    int32_t k = 1;
    double acc = 0.0;
    for (int64_t i = 0; i < items && k < n_chunks; i++) {
        const int32_t tile = (int32_t)(i / hsplit);
        int32_t g0, g1;
        attn_heads(nkv, (int32_t)(i % hsplit), hsplit, &g0, &g1);
        for (int32_t t = ce->attn_tiles[tile]; t < ce->attn_tiles[tile + 1]; t++)
            acc += (double)(b->positions[t] + 1 - attn_lo(b, b->positions[t]) + 16) * (g1 - g0);
        while (k < n_chunks && acc * n_chunks >= total * k)
            first[k++] = (int32_t)(i + 1);
    }
    while (k <= n_chunks)
        first[k++] = (int32_t)items;
    job.chunk_first = first;
    cpu_pool_run_chunks(ce->pool, n_chunks, attn_chunk, &job);
    return PG_OK;
}
