/* cpu_tree_avx512: the canonical 16-lane tree of cpu_gemm.h for sixteen
 * outputs at once on AVX-512, shared by the kernels that end a product
 * with it (cpu_gemm_kernel.c's avx512 variant, cpu_gemm_bf16_kernel.c's
 * avx512bf16 kernel). Only for files compiled with AVX-512F.
 *
 * a[16]: the 16 accumulator vectors (lane l of output j in a[j]).
 * Returns one vector whose lane 4c+j holds the tree of a[4j+c]: every
 * output sees the pairings (l, l+8), (l, l+4), (l, l+2), (l, l+1) in that
 * order, bit-identical to summing each vector alone (IEEE addition is
 * commutative, so operand order does not matter). */
#ifndef PG_CPU_TREE_AVX512_H
#define PG_CPU_TREE_AVX512_H

#ifndef __AVX512F__
#error "cpu_tree_avx512.h: compile with AVX-512F"
#endif

#include <immintrin.h>

static inline __m512 cpu_tree16_zmm(const __m512 *a)
{
    __m512 r[8], q[4], p[2];
    for (int i = 0; i < 8; i++)
        r[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)
        q[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++)
        p[i] = _mm512_add_ps(_mm512_shuffle_ps(q[2 * i], q[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(q[2 * i], q[2 * i + 1], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(p[0], p[1], 0x88), _mm512_shuffle_ps(p[0], p[1], 0xDD));
}

#endif /* PG_CPU_TREE_AVX512_H */
