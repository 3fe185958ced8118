/* rope: rotary position embedding in place on the q and k heads of qkv,
 * HF rotate_half convention (LlamaRotaryEmbedding / apply_rotary_pos_emb):
 * the pair (x[i], x[i + hd/2]) of every head is rotated by
 * angle = position * inv_freq[i]:
 *   x'[i]        = x[i] * cos - x[i + hd/2] * sin
 *   x'[i + hd/2] = x[i + hd/2] * cos + x[i] * sin
 * Angles in f32 with the accurate sincosf (positions * inv_freq can reach
 * 1e5 rad; the fast __sincosf is wrong there), computed once per (token,
 * frequency) into shared memory and shared by the nh + nkv heads (the same
 * value every head computed before: same bits, (nh + nkv)x fewer sincosf). */
#include "qkv_steps.cuh" /* rope_angles, rope_rotate (shared with rope_kv.cu); ROPE_MAX_HALF */

/* grid (T), block 128: first thread j computes (sin, cos) of the
 * frequencies i = j, j+128, ... < hd/2 into sn, cs; then it handles pairs
 * p = j, j+128, ... of the
 * (nh + nkv) * hd/2 pairs of token t: head h = p / (hd/2), i = p % (hd/2),
 *   qkv[t][h*hd + i], qkv[t][h*hd + i + hd/2]   (heads 0..nh+nkv-1: q then k)
 * qkv [T][(nh + 2nkv) * hd]; inv_freq [hd/2] f32; positions [T]. */
template <typename T>
static __global__ void rope_kernel(T *__restrict__ qkv, const float *__restrict__ inv_freq,
                                   const int32_t *__restrict__ positions, int32_t nh, int32_t nkv,
                                   int32_t hd)
{
    __shared__ float sn[ROPE_MAX_HALF];
    __shared__ float cs[ROPE_MAX_HALF];
    int32_t t = blockIdx.x;
    int32_t half = hd / 2;
    int32_t n_pairs = (nh + nkv) * half;
    float pos = (float)positions[t];
    rope_angles(sn, cs, pos, inv_freq, half, threadIdx.x, blockDim.x);
    __syncthreads();
    T *row = qkv + (size_t)t * (size_t)(nh + 2 * nkv) * (size_t)hd;
    for (int32_t p = threadIdx.x; p < n_pairs; p += blockDim.x) {
        int32_t h = p / half, i = p % half;
        rope_rotate(row + (size_t)h * hd, i, half, sn[i], cs[i]);
    }
}

extern "C" int pgk_rope(void *qkv, const float *inv_freq, int dt, int32_t nh, int32_t nkv,
                        int32_t hd, const pgk_batch *b, pgk_launch *lk)
{
    int rc = pgk_check_act_dtype("rope", dt, lk->err);
    if (rc)
        return rc;
    if (nh < 1 || nkv < 1 || hd < 2 || hd % 2 != 0 || hd > 2 * ROPE_MAX_HALF || b->num_tokens < 1)
        return pg_error_set(lk->err, PG_EINVAL,
                            "rope: expected nh, nkv, T >= 1 and an even hd in [2, %d], got nh %d, "
                            "nkv %d, hd %d, T %d", 2 * ROPE_MAX_HALF, (int)nh, (int)nkv, (int)hd,
                            (int)b->num_tokens);
    PGK_DISPATCH_ACT(dt, rope_kernel<T><<<(unsigned)b->num_tokens, 128, 0, lk->st>>>(
        (T *)qkv, inv_freq, b->positions, nh, nkv, hd));
    return pgk_check_launch("rope_kernel", lk);
}
