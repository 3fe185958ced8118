/* prefill_attention: causal GQA attention of ragged query chunks over the
 * paged KV cache — prompt prefill, chunked prefill and prefill on top of a
 * cached prefix are one case: sequence s has q_len = query_start[s+1] -
 * query_start[s] query tokens, the last q_len of its seq_len context
 * tokens, whose K and V kv_write already stored. Query token i (0-based in
 * the chunk) sits at position seq_len - q_len + i and attends to keys
 * 0 .. that position (with a sliding window W > 0 only keys
 * pos - W + 1 .. pos: transformers' kv_idx > q_idx - W; the tile walk then
 * starts at the block's first row's lowest key).
 *
 * Algorithm: FlashAttention's tiling with the online softmax (Dao et al.
 * 2022), in f32 SIMT arithmetic from shared memory. A block owns R
 * flattened rows (query token, head of the GQA group) of one KV head — the
 * G heads of a group share every key and value tile — and walks the keys
 * in tiles of BK from key 0:
 *   m' = max(m, max_j S_j),  alpha = exp(m - m'),  p_j = exp(S_j - m')
 *   l' = l * alpha + sum_j p_j,  O' = O * alpha + sum_j p_j V_j
 *   out = O / l   at the end.
 * Masked keys contribute exactly nothing (alpha = 1, p = 0), so a row's
 * bits do not depend on which rows share its block or on the batch.
 *
 * Performance: prefill is compute-bound (every key tile serves R rows). This
 * SIMT version does the 4 * n^2/2 * nh * hd flops on the f32 pipes, not
 * on the tensor cores; a tensor-core (mma.sync / sm_90a wgmma) kernel is the
 * next step and would slot in behind the same launcher. Sequences with one
 * query token are skipped (decode kernel, paged_attention.cu).
 */
#include "cuda_common.cuh"

extern "C" {
#include "cuda_plan.h"
}

#define PF_NT CUDA_PLAN_ATTN_THREADS

/* grid (grid_x, nkv, P), block PF_NT, dynamic shared memory (f32):
 *   Qs [R][HD], Os [R][HD], Ks [BK][HD+1] (padded: conflict-free column
 *   reads), Vs [BK][HD], Ss [R][BK], ms [R], ls [R], als [R].
 * Block (x, kvh, z): sequence s = prefill_seqs[z] (the P sequences with
 * q_len >= 2, so decode sequences launch no block); rows r0 = x * R ..
 * r0 + nr - 1 of its q_len * G rows; row = i * G + g -> query token t = query_start[s] + i,
 * head h = kvh * G + g, position pos = seq_len - q_len + i.
 * Key j of the sequence: blk = block_tables[s][j / bs],
 *   K[j][d] = k_cache[((blk * bs + j % bs) * nkv + kvh) * HD + d]  (V alike).
 *   S[r][j] = (Q[r] . K[j]) * scale   for j <= pos(r) (and j > pos(r) - window
 *                                     when window > 0), else masked
 *   out[t][h * HD + d] = O[r][d] / l[r]. */
template <typename T, typename KV, int HD>
static __global__ void __launch_bounds__(PF_NT)
prefill_attention_kernel(T *__restrict__ out, const T *__restrict__ qkv,
                         const KV *__restrict__ k_cache, const KV *__restrict__ v_cache,
                         const int32_t *__restrict__ query_start,
                         const int32_t *__restrict__ seq_lens,
                         const int32_t *__restrict__ block_tables, int32_t bt_stride,
                         const int32_t *__restrict__ prefill_seqs, int32_t block_size,
                         int32_t nh, int32_t nkv, float scale, int32_t R, int32_t BK,
                         int32_t window)
{
    extern __shared__ float smem[];
    const int32_t s = prefill_seqs[blockIdx.z], kvh = blockIdx.y;
    const int32_t q0 = query_start[s];
    const int32_t q_len = query_start[s + 1] - q0;
    if (q_len < 2)
        return;
    const int32_t ctx = seq_lens[s];
    const int32_t G = nh / nkv;
    const int32_t rows_total = q_len * G;
    const int32_t r0 = blockIdx.x * R;
    if (r0 >= rows_total)
        return;
    const int32_t nr = min(R, rows_total - r0);
    const int32_t first_pos = ctx - q_len; /* position of query token 0 */

    float *Qs = smem;                     /* [R][HD] */
    float *Os = Qs + R * HD;              /* [R][HD] */
    float *Ks = Os + R * HD;              /* [BK][HD + 1] */
    float *Vs = Ks + BK * (HD + 1);       /* [BK][HD] */
    float *Ss = Vs + BK * HD;             /* [R][BK] */
    float *ms = Ss + R * BK;              /* [R] */
    float *ls = ms + R;                   /* [R] */
    float *als = ls + R;                  /* [R] */

    const int tid = threadIdx.x;
    const size_t row_stride = (size_t)(nh + 2 * nkv) * HD;
    const int32_t *bt = block_tables + (size_t)s * bt_stride;

    for (int i = tid; i < nr * HD; i += PF_NT) {
        int r = i / HD, d = i % HD;
        int32_t row = r0 + r, qi = row / G, g = row % G;
        Qs[r * HD + d] = to_f32(qkv[(size_t)(q0 + qi) * row_stride + (size_t)(kvh * G + g) * HD + d]);
        Os[r * HD + d] = 0.0f;
    }
    for (int r = tid; r < R; r += PF_NT) {
        ms[r] = -INFINITY;
        ls[r] = 0.0f;
    }
    /* keys needed by the last row of the block */
    const int32_t n_keys = first_pos + (r0 + nr - 1) / G + 1;

    /* the lowest key of the block's first row (window: pos - window + 1) */
    const int32_t k_lo = window > 0 ? max(0, first_pos + r0 / G - window + 1) : 0;

    for (int32_t kb = k_lo; kb < n_keys; kb += BK) {
        const int32_t nk = min(BK, n_keys - kb);
        __syncthreads(); /* the previous tile's K, V, S are no longer read */
        for (int i = tid; i < nk * HD; i += PF_NT) {
            int jj = i / HD, d = i % HD;
            int32_t j = kb + jj;
            int32_t blk = bt[j / block_size];
            size_t idx = (((size_t)blk * block_size + (size_t)(j % block_size)) * nkv + kvh) * HD + d;
            Ks[jj * (HD + 1) + d] = to_f32(k_cache[idx]);
            Vs[jj * HD + d] = to_f32(v_cache[idx]);
        }
        __syncthreads();
        /* S = Q K^T * scale, masked */
        for (int i = tid; i < R * BK; i += PF_NT) {
            int r = i / BK, jj = i % BK;
            float sv = -INFINITY;
            const int32_t pos = first_pos + (r0 + r) / G;
            if (r < nr && jj < nk && kb + jj <= pos && (window <= 0 || kb + jj > pos - window)) {
                const float *q = Qs + r * HD;
                const float *k = Ks + jj * (HD + 1);
                float acc = 0.0f;
#pragma unroll 8
                for (int d = 0; d < HD; d++)
                    acc = fmaf(q[d], k[d], acc);
                sv = acc * scale;
            }
            Ss[r * BK + jj] = sv;
        }
        __syncthreads();
        /* online softmax, one thread per row */
        for (int r = tid; r < nr; r += PF_NT) {
            float m_old = ms[r];
            float mt = -INFINITY;
            for (int jj = 0; jj < nk; jj++)
                mt = fmaxf(mt, Ss[r * BK + jj]);
            float m_new = fmaxf(m_old, mt);
            float alpha = 1.0f, sum = 0.0f;
            if (m_new == -INFINITY) {
                for (int jj = 0; jj < nk; jj++)
                    Ss[r * BK + jj] = 0.0f;
            } else {
                alpha = expf(m_old - m_new); /* m_old = -inf -> 0 */
                for (int jj = 0; jj < nk; jj++) {
                    float p = expf(Ss[r * BK + jj] - m_new); /* masked -> 0 */
                    Ss[r * BK + jj] = p;
                    sum += p;
                }
            }
            ls[r] = ls[r] * alpha + sum;
            ms[r] = m_new;
            als[r] = alpha;
        }
        __syncthreads();
        /* O = O * alpha + P V */
        for (int i = tid; i < nr * HD; i += PF_NT) {
            int r = i / HD, d = i % HD;
            float o = Os[r * HD + d] * als[r];
            const float *p = Ss + r * BK;
            for (int jj = 0; jj < nk; jj++)
                o = fmaf(p[jj], Vs[jj * HD + d], o);
            Os[r * HD + d] = o;
        }
    }
    __syncthreads();
    for (int i = tid; i < nr * HD; i += PF_NT) {
        int r = i / HD, d = i % HD;
        int32_t row = r0 + r, qi = row / G, g = row % G;
        out[(size_t)(q0 + qi) * nh * HD + (size_t)(kvh * G + g) * HD + d] =
            from_f32<T>(Os[r * HD + d] / ls[r]);
    }
}

extern "C" int pgk_prefill_attention(void *out, const void *qkv, int dt, const void *k_cache,
                                     const void *v_cache, int kv_dt, int32_t nh, int32_t nkv,
                                     int32_t hd, float scale, int32_t window, const pgk_batch *b,
                                     pgk_launch *lk)
{
    int rc = pgk_check_act_kv_pair("prefill_attention", dt, kv_dt, lk->err);
    if (rc)
        return rc;
    if (nh < 1 || nkv < 1 || nh % nkv != 0)
        return pg_error_set(lk->err, PG_EINVAL,
                            "prefill_attention: expected nh a multiple of nkv >= 1, got nh %d, nkv %d",
                            (int)nh, (int)nkv);
    if (b->num_seqs < 1 || b->num_prefill_seqs < 0 || b->num_prefill_seqs > 65535 ||
        b->num_prefill_seqs > b->num_seqs || nkv > 65535 || b->block_size < 1)
        return pg_error_set(lk->err, PG_EINVAL,
                            "prefill_attention: expected S >= 1, 0 <= prefill sequences <= min(S, "
                            "65535), nkv <= 65535 and block_size >= 1, got S %d, %d, nkv %d, "
                            "block_size %d", (int)b->num_seqs, (int)b->num_prefill_seqs, (int)nkv,
                            (int)b->block_size);
    if (b->num_prefill_seqs == 0)
        return 0;
    cuda_prefill_plan pl;
    rc = cuda_plan_prefill(&pl, hd, nh / nkv, b->max_query_len, CUDA_PLAN_SMEM_DEFAULT_BYTES, lk->err);
    if (rc)
        return rc;
    dim3 grid((unsigned)pl.grid_x, (unsigned)nkv, (unsigned)b->num_prefill_seqs);
    PGK_DISPATCH_ACT_KV(dt, kv_dt, PGK_HD_CASES(hd,
        prefill_attention_kernel<T, KV, HDC><<<grid, PF_NT, pl.smem_bytes, lk->st>>>(
            (T *)out, (const T *)qkv, (const KV *)k_cache, (const KV *)v_cache, b->query_start,
            b->seq_lens, b->block_tables, b->block_table_stride, b->prefill_seqs, b->block_size,
            nh, nkv, scale, pl.rows_per_block, pl.keys_per_tile, window)));
    return pgk_check_launch("prefill_attention_kernel", lk);
}
