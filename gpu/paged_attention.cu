/* paged_attention: decode attention — one query token per sequence over its
 * paged KV context (vLLM's paged_attention v1/v2, Kwon et al. SOSP'23).
 *
 * Why it is bandwidth-bound. Per sequence and layer a decode step reads the
 * whole context once: seq_len * nkv * hd * 2 (K and V) * 2 bytes (bf16), and
 * does 2 * 2 * seq_len * nh * hd flops: with GQA group G = nh / nkv that is
 * G flops per byte — 4 for Llama-3-8B, far below the ~200 flops/byte an
 * H100 (≈3.35 TB/s HBM3, ≈67 TFLOP/s f32 SIMT) needs to be compute-bound.
 * So the kernel is designed around the bytes:
 *   - GQA-aware: one block serves all G query heads of a KV head (up to
 *     8 at once), so each key and value vector is loaded from memory once,
 *     not G times;
 *   - 16-byte loads: a thread loads 8 consecutive bf16 of a key (hd / 8
 *     threads — a "group" — share one key; a warp covers 32 * 8 elements of
 *     one or several keys, coalesced);
 *   - split over the context (v2): a long sequence is cut into partitions
 *     of P tokens (512 by default, cuda_plan_decode) spread over up to
 *     CUDA_PLAN_DECODE_MAX_SPLITS (32) blocks, so a batch of a few long
 *     sequences still fills the 132 SMs; a reduction kernel combines the
 *     blocks' results with their softmax statistics. The grid is bounded
 *     (a 128k-token CUDA graph launches 32 blocks per sequence and KV head,
 *     not 256 that mostly exit) and so is the workspace.
 * A Llama-3-8B decode step at batch 64 and 1k context moves 16 GB of
 * weights once (≈5 ms at 3 TB/s) plus 64 * 1024 * 32 layers * 8 * 128 * 2 *
 * 2 B = 8.6 GB of KV (≈2.9 ms): attention is a third of the step.
 *
 * Partition rule (deterministic): partition p of sequence s covers context
 * tokens [lo + p*P, min(lo + (p+1)*P, seq_len)), lo = 0, or with a sliding
 * window W > 0 lo = max(0, seq_len - W) (the query at seq_len - 1 sees
 * W keys: transformers' kv_idx > q_idx - W); P depends only on (hd, G), so a
 * sequence is split the same way whatever else is in the batch. Partition p
 * is computed by block z = p mod Z (Z = CUDA_PLAN_DECODE_MAX_SPLITS), which
 * merges its partitions z, z + Z, ... in that order into split z; the
 * reduction combines splits 0 .. min(np, Z) - 1 in order. Neither depends on
 * the grid (a step's or a graph's), so a sequence's bits are the same in
 * every batch. With one partition the block writes the output directly; the
 * reduction kernel skips such sequences.
 *
 * Sequences whose query length is not 1 (prefill chunks in a mixed step)
 * are skipped here and handled by prefill_attention.cu.
 */
#include "cuda_common.cuh"

extern "C" {
#include "cuda_plan.h"
}

#define DEC_NT CUDA_PLAN_ATTN_THREADS
#define DEC_EPT CUDA_PLAN_DECODE_EPT
#define DEC_MAXG CUDA_PLAN_DECODE_MAX_G

/* grid (nkv * n_chunks, S, nsplit), nsplit = min(max partitions, Z), block
 * DEC_NT, dynamic shared memory (cuda_plan_decode): q_s [gcp][HD],
 * sc [gcp][P], red [NG][HD], smax, ssum, rmax, rsum, w_prev, w_cur, w_sum
 * [gcp] (f32), gcp = min(G, DEC_MAXG).
 * Block (x, s, z): KV head kvh = x / n_chunks, query heads
 * h = kvh * G + g0 + g, g < gc, g0 = (x % n_chunks) * DEC_MAXG; the query
 * token t = query_start[s]; partitions p = z, z + Z, ... < np, each over the
 * context tokens j in [lo + p*P, min(lo + p*P + P, seq_len)).
 * Thread tid: group = tid / GT (GT = HD / 8 threads per key), lane_g =
 * tid % GT owns dims d0 = lane_g * 8 .. d0 + 7.
 *   key j lives at k_cache[((blk * bs + j % bs) * nkv + kvh) * HD + d],
 *   blk = block_tables[s][j / bs];   likewise v_cache.
 *   sc[g][j - p*P] = (q[t][h] . k[j]) * scale
 *   m_g = max_j sc, e_gj = exp(sc - m_g), l_g = sum_j e_gj
 *   o_g[d] = (sum_j e_gj * v[j][d]) / l_g
 * One partition: out[t][h*HD + d] = o_g[d]. Several: split z holds
 * part_out[s][h][z][d] = o, part_max[s][h][z] = m, part_sum[s][h][z] = l of
 * its first partition, then each further partition (m', l', o') is merged in:
 *   M = max(m, m'), w = l exp(m - M), w' = l' exp(m' - M), L = w + w'
 *   o = (o w + o' w') / L, m = M, l = L.
 * LONG = false (every sequence of the launch has at most Z partitions, so
 * every block runs one): the loop and the merge are compiled out — the
 * kernel of one partition per block, 101-112 registers (sm_80, sm_90), 4
 * blocks per SM. LONG = true: the loop and the merge, 128-170 registers
 * (at 3 blocks per SM = 168, sm_90 spilled for hd 64 and f32 hd 256), hence
 * 2 blocks per SM (nvcc_spillcheck.py fails the build on a spill).
 * A sequence of at most Z partitions gets the same operations, so the same
 * bits, from both (test_cuda_graphs: a graph at a 32k tier vs eager). */
template <typename T, typename KV, int HD, bool LONG>
static __global__ void __launch_bounds__(DEC_NT, LONG ? 2 : 4)
paged_attention_decode_kernel(T *__restrict__ out, float *__restrict__ part_out,
                              float *__restrict__ part_max, float *__restrict__ part_sum,
                              const T *__restrict__ qkv, const KV *__restrict__ k_cache,
                              const KV *__restrict__ v_cache,
                              const int32_t *__restrict__ query_start,
                              const int32_t *__restrict__ seq_lens,
                              const int32_t *__restrict__ block_tables, int32_t bt_stride,
                              int32_t block_size, int32_t nh, int32_t nkv, float scale,
                              int32_t P, int32_t nsplit, int32_t window)
{
    constexpr int GT = HD / DEC_EPT;   /* threads per key: 1 .. 32, divides 32 */
    constexpr int NG = DEC_NT / GT;    /* keys in flight per block */
    extern __shared__ float smem[];

    const int32_t s = blockIdx.y;
    const int32_t t = query_start[s];
    if (query_start[s + 1] - t != 1)
        return;
    const int32_t seq_len = seq_lens[s];
    const int32_t lo = window > 0 ? max(0, seq_len - window) : 0;
    const int32_t np = (seq_len - lo + P - 1) / P;
    if ((int32_t)blockIdx.z >= np)
        return;
    const int32_t G = nh / nkv;
    const int32_t n_chunks = (G + DEC_MAXG - 1) / DEC_MAXG;
    const int32_t kvh = blockIdx.x / n_chunks;
    const int32_t g0 = (blockIdx.x % n_chunks) * DEC_MAXG;
    const int32_t gc = min(DEC_MAXG, G - g0);
    const int32_t gcp = min(DEC_MAXG, G);

    float *q_s = smem;                       /* [gcp][HD] */
    float *sc = q_s + gcp * HD;              /* [gcp][P] */
    float *red = sc + gcp * P;               /* [NG][HD] = DEC_NT * DEC_EPT */
    float *smax = red + DEC_NT * DEC_EPT;    /* [gcp] */
    float *ssum = smax + gcp;                /* [gcp] */
    float *rmax = ssum + gcp;                /* [gcp] split z so far (merged partitions) */
    float *rsum = rmax + gcp;                /* [gcp] */
    float *w_prev = rsum + gcp;              /* [gcp] merge weights of split z so far, */
    float *w_cur = w_prev + gcp;             /* [gcp] of this partition */
    float *w_sum = w_cur + gcp;              /* [gcp] and their sum */

    const int tid = threadIdx.x;
    const int group = tid / GT, lane_g = tid % GT, d0 = lane_g * DEC_EPT;
    const size_t row_stride = (size_t)(nh + 2 * nkv) * HD;

    /* q heads of this chunk, f32 (read by every partition of the loop) */
    for (int i = tid; i < gc * HD; i += DEC_NT) {
        int g = i / HD, d = i % HD;
        q_s[g * HD + d] = to_f32(qkv[(size_t)t * row_stride + (size_t)(kvh * G + g0 + g) * HD + d]);
    }
    __syncthreads();

    /* LONG: the block loops over its partitions; else it runs its one */
#pragma unroll 1
    for (int32_t part = blockIdx.z;; part += CUDA_PLAN_DECODE_MAX_SPLITS) {
        /* split z = blockIdx.z already holds a partition (z < Z <= part) */
        const bool merge = LONG && part >= CUDA_PLAN_DECODE_MAX_SPLITS;
        const int32_t start = lo + part * P;
        const int32_t end = min(start + P, seq_len);
        const int32_t *bt = block_tables + (size_t)s * bt_stride; /* (not held across partitions) */
        /* scores: every thread runs the same number of iterations (the group
         * shuffles need the whole warp); keys past `end` compute on zeros. */
        for (int32_t jb = start; jb < end; jb += NG) {
            const int32_t j = jb + group;
            const bool valid = j < end;
            float k[DEC_EPT];
            if (valid) {
                int32_t blk = bt[j / block_size];
                size_t slot = (size_t)blk * block_size + (size_t)(j % block_size);
                load8(k, k_cache + (slot * nkv + kvh) * HD + d0);
            } else {
#pragma unroll
                for (int e = 0; e < DEC_EPT; e++)
                    k[e] = 0.0f;
            }
            for (int g = 0; g < gc; g++) {
                const float *qg = q_s + g * HD + d0;
                float acc = 0.0f;
#pragma unroll
                for (int e = 0; e < DEC_EPT; e++)
                    acc = fmaf(qg[e], k[e], acc);
#pragma unroll
                for (int o = GT / 2; o > 0; o >>= 1)
                    acc += __shfl_xor_sync(0xffffffffu, acc, o);
                if (valid && lane_g == 0)
                    sc[g * P + (j - start)] = acc * scale;
            }
        }
        __syncthreads();

        /* softmax statistics: warp w handles heads w, w + 4, ... */
        const int n = end - start;
        const int lane = tid & 31, warp = tid >> 5;
        for (int g = warp; g < gc; g += DEC_NT / 32) {
            float m = -INFINITY;
            for (int i = lane; i < n; i += 32)
                m = fmaxf(m, sc[g * P + i]);
            m = warp_max(m);
            float sum = 0.0f;
            for (int i = lane; i < n; i += 32) {
                float e = expf(sc[g * P + i] - m);
                sc[g * P + i] = e;
                sum += e;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                smax[g] = m;
                ssum[g] = sum;
            }
            if (LONG && lane == 0) {
                /* this partition's statistics merged into split z's (the
                 * same lane of the same warp wrote rmax[g], rsum[g] for the
                 * split's earlier partitions) */
                float M = m, L = sum;
                if (merge) {
                    M = fmaxf(rmax[g], m);
                    w_prev[g] = rsum[g] * expf(rmax[g] - M);
                    w_cur[g] = sum * expf(m - M);
                    L = w_prev[g] + w_cur[g];
                    w_sum[g] = L;
                }
                rmax[g] = M;
                rsum[g] = L;
                if (np > 1) {
                    const size_t split = ((size_t)s * nh + kvh * G + g0 + g) * nsplit + blockIdx.z;
                    part_max[split] = M;
                    part_sum[split] = L;
                }
            }
        }
        __syncthreads();

        /* values: acc[g][e] += e_gj * v[j][d0 + e] over this thread's keys */
        float acc[DEC_MAXG][DEC_EPT];
#pragma unroll
        for (int g = 0; g < DEC_MAXG; g++)
#pragma unroll
            for (int e = 0; e < DEC_EPT; e++)
                acc[g][e] = 0.0f;
        for (int32_t j = start + group; j < end; j += NG) {
            int32_t blk = bt[j / block_size];
            size_t slot = (size_t)blk * block_size + (size_t)(j % block_size);
            float v[DEC_EPT];
            load8(v, v_cache + (slot * nkv + kvh) * HD + d0);
#pragma unroll
            for (int g = 0; g < DEC_MAXG; g++) {
                if (g < gc) {
                    float p = sc[g * P + (j - start)];
#pragma unroll
                    for (int e = 0; e < DEC_EPT; e++)
                        acc[g][e] = fmaf(p, v[e], acc[g][e]);
                }
            }
        }

        /* combine the NG groups (fixed order) and normalize, one head at a time;
         * gc is the same for the whole block, so the barriers are uniform. */
#pragma unroll
        for (int g = 0; g < DEC_MAXG; g++) {
            if (g < gc) {
#pragma unroll
                for (int e = 0; e < DEC_EPT; e++)
                    red[group * HD + d0 + e] = acc[g][e];
                __syncthreads();
                const int32_t h = kvh * G + g0 + g;
                const float l = ssum[g];
                const size_t split = ((size_t)s * nh + h) * nsplit + blockIdx.z;
                for (int d = tid; d < HD; d += DEC_NT) {
                    float o = 0.0f;
                    for (int gr = 0; gr < NG; gr++)
                        o += red[gr * HD + d];
                    o = o / l;
                    if (np == 1)
                        out[(size_t)t * nh * HD + (size_t)h * HD + d] = from_f32<T>(o);
                    else if (!merge)
                        part_out[split * HD + d] = o;
                    else /* the thread that wrote this element of the split reads it */
                        part_out[split * HD + d] =
                            (part_out[split * HD + d] * w_prev[g] + o * w_cur[g]) / w_sum[g];
                }
                if (!LONG && np > 1 && tid == 0) { /* (LONG: with the merge above) */
                    part_max[split] = smax[g];
                    part_sum[split] = l;
                }
                __syncthreads(); /* red is rewritten by the next head */
            }
        }
        if (!LONG || part + CUDA_PLAN_DECODE_MAX_SPLITS >= np)
            break;
        __syncthreads(); /* sc, red, smax, ssum are rewritten by the next partition */
    }
}


/* grid (nh, S), block 128: combines the splits of sequences with
 * np = ceil((seq_len - lo) / P) > 1 (others were written directly), the
 * nz = min(np, Z) splits z of the decode kernel:
 *   M = max_z m_z,  w_z = l_z * exp(m_z - M),  L = sum_z w_z
 *   out[t][h*HD + d] = (sum_z w_z * o_z[d]) / L       (z in order 0..nz-1)
 * thread d = tid, tid + 128, ... */
template <typename T>
static __global__ void paged_attention_reduce_kernel(T *__restrict__ out,
                                                     const float *__restrict__ part_out,
                                                     const float *__restrict__ part_max,
                                                     const float *__restrict__ part_sum,
                                                     const int32_t *__restrict__ query_start,
                                                     const int32_t *__restrict__ seq_lens,
                                                     int32_t nh, int32_t hd, int32_t P,
                                                     int32_t nsplit, int32_t window)
{
    const int32_t h = blockIdx.x, s = blockIdx.y;
    const int32_t t = query_start[s];
    if (query_start[s + 1] - t != 1)
        return;
    const int32_t lo = window > 0 ? max(0, seq_lens[s] - window) : 0;
    const int32_t np = (seq_lens[s] - lo + P - 1) / P;
    if (np <= 1)
        return;
    const int32_t nz = min(np, (int32_t)CUDA_PLAN_DECODE_MAX_SPLITS);
    const size_t base = ((size_t)s * nh + h) * nsplit;
    float M = -INFINITY;
    for (int32_t p = 0; p < nz; p++)
        M = fmaxf(M, part_max[base + p]);
    float L = 0.0f;
    for (int32_t p = 0; p < nz; p++)
        L += part_sum[base + p] * expf(part_max[base + p] - M);
    for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int32_t p = 0; p < nz; p++) {
            float w = part_sum[base + p] * expf(part_max[base + p] - M);
            o = fmaf(w, part_out[(base + p) * hd + d], o);
        }
        out[(size_t)t * nh * hd + (size_t)h * hd + d] = from_f32<T>(o / L);
    }
}

extern "C" size_t pgk_decode_workspace_floats(int32_t num_seqs, int32_t nh, int32_t hd,
                                              int32_t max_seq_len, int32_t partition_size)
{
    int32_t np = cuda_plan_num_partitions(max_seq_len, partition_size);
    if (np <= 1)
        return 0;
    const int32_t nz = np < CUDA_PLAN_DECODE_MAX_SPLITS ? np : CUDA_PLAN_DECODE_MAX_SPLITS;
    return (size_t)num_seqs * (size_t)nh * (size_t)nz * ((size_t)hd + 2u);
}

template <typename T, typename KV, int HD>
static int launch_decode(T *out, float *ws, const T *qkv, const KV *k_cache, const KV *v_cache,
                         int32_t nh, int32_t nkv, float scale, int32_t window, const pgk_batch *b,
                         const cuda_decode_plan *pl, pgk_launch *lk)
{
    const int32_t G = nh / nkv;
    const int32_t n_chunks = (G + DEC_MAXG - 1) / DEC_MAXG;
    const int32_t S = b->num_seqs, mp = pl->splits;
    float *part_out = ws;
    float *part_max = ws ? ws + (size_t)S * nh * mp * HD : nullptr;
    float *part_sum = ws ? part_max + (size_t)S * nh * mp : nullptr;
    dim3 grid((unsigned)(nkv * n_chunks), (unsigned)S, (unsigned)mp);
    cudaStream_t st = lk->st;
    if (pl->max_partitions > CUDA_PLAN_DECODE_MAX_SPLITS)
        paged_attention_decode_kernel<T, KV, HD, true><<<grid, DEC_NT, pl->smem_bytes, st>>>(
            out, part_out, part_max, part_sum, qkv, k_cache, v_cache, b->query_start, b->seq_lens,
            b->block_tables, b->block_table_stride, b->block_size, nh, nkv, scale,
            pl->partition_size, mp, window);
    else
        paged_attention_decode_kernel<T, KV, HD, false><<<grid, DEC_NT, pl->smem_bytes, st>>>(
            out, part_out, part_max, part_sum, qkv, k_cache, v_cache, b->query_start, b->seq_lens,
            b->block_tables, b->block_table_stride, b->block_size, nh, nkv, scale,
            pl->partition_size, mp, window);
    int rc = pgk_check_launch("paged_attention_decode_kernel", lk);
    if (rc || mp <= 1)
        return rc;
    paged_attention_reduce_kernel<T><<<dim3((unsigned)nh, (unsigned)S), 128, 0, st>>>(
        out, part_out, part_max, part_sum, b->query_start, b->seq_lens, nh, HD,
        pl->partition_size, mp, window);
    return pgk_check_launch("paged_attention_reduce_kernel", lk);
}

extern "C" int pgk_decode_attention(void *out, const void *qkv, int dt, const void *k_cache,
                                    const void *v_cache, int kv_dt, int32_t nh, int32_t nkv,
                                    int32_t hd, float scale, int32_t window, const pgk_batch *b, float *ws,
                                    size_t ws_floats, pgk_launch *lk)
{
    int rc = pgk_check_act_kv_pair("decode_attention", dt, kv_dt, lk->err);
    if (rc)
        return rc;
    if (nh < 1 || nkv < 1 || nh % nkv != 0)
        return pg_error_set(lk->err, PG_EINVAL,
                            "decode_attention: expected nh a multiple of nkv >= 1, got nh %d, nkv %d",
                            (int)nh, (int)nkv);
    if (b->num_seqs < 1 || b->num_seqs > 65535 || b->block_size < 1)
        return pg_error_set(lk->err, PG_EINVAL,
                            "decode_attention: expected 1 <= S <= 65535 and block_size >= 1, "
                            "got S %d, block_size %d", (int)b->num_seqs, (int)b->block_size);
    if (!pgk_aligned(k_cache, 16) || !pgk_aligned(v_cache, 16) || !pgk_aligned(qkv, 16))
        return pg_error_set(lk->err, PG_EINVAL,
                            "decode_attention: expected 16-byte aligned qkv and kv planes, got %p, %p, %p",
                            qkv, k_cache, v_cache);
    cuda_decode_plan pl;
    rc = cuda_plan_decode(&pl, hd, nh / nkv, b->max_seq_len, CUDA_PLAN_SMEM_DEFAULT_BYTES, lk->err);
    if (rc)
        return rc;
    size_t need = pgk_decode_workspace_floats(b->num_seqs, nh, hd, b->max_seq_len, pl.partition_size);
    if (need > 0 && (ws == NULL || ws_floats < need))
        return pg_error_set(lk->err, PG_EINVAL,
                            "decode_attention: expected a workspace of %zu floats, got %zu",
                            need, ws ? ws_floats : (size_t)0);
    rc = PG_EINVAL; /* every supported (dtype pair, hd) sets it */
    PGK_DISPATCH_ACT_KV(dt, kv_dt, PGK_HD_CASES(hd,
        rc = launch_decode<T, KV, HDC>((T *)out, need ? ws : nullptr, (const T *)qkv,
                                       (const KV *)k_cache, (const KV *)v_cache, nh, nkv, scale,
                                       window, b, &pl, lk)));
    return rc;
}
