/* qkernels/vec.h: float vector math on top of simd.h.
 *
 * fma_vf (a b + c, one rounding where the CPU fuses), exp_vf (exp in every lane: the softmax
 * and the gated activations), and float dot products (dot, dot4, dot1, dots): the attention
 * scores, the NF4 rows of a product and the low-rank u = A x of a LoRA term. Each is written
 * so that a value's bits do not depend on which call, tile or thread computes it.
 *
 * Part of the unity build: _qkernels.c includes this file once, in dependency order; it is not
 * compiled on its own.
 */
#ifndef SLM_QK_VEC_H
#define SLM_QK_VEC_H

#include "simd.h"

static inline vf fma_vf(const float a, const vf b, const vf c) { /* a b + c, one rounding where the CPU fuses */
#if LANES == 16
    return (vf)_mm512_fmadd_ps(_mm512_set1_ps(a), (__m512)b, (__m512)c);
#elif LANES == 8 && defined(__FMA__)
    return (vf)_mm256_fmadd_ps(_mm256_set1_ps(a), (__m256)b, (__m256)c);
#else
    return c + a * b;
#endif
}

/* exp(x) in every lane: x = n ln2 + r, |r| <= ln2 / 2, exp(r) by Cephes' degree-6 polynomial
 * (relative error ~1e-7, a float's rounding), times 2^n through the exponent bits. NaN stays
 * NaN. Lanes below -64 ln 2 give 0: every use adds e^x to at least 1 (a softmax to its top
 * key's 1, a gated activation to 1), so 2^-64 is far below a float's rounding there, and no
 * result, nor a softmax weight made from it, is ever a denormal float (slow on many CPUs).
 * Lanes above 88 give e^88 (a gated activation's denominator is then as good as infinite). */
typedef int32_t vi __attribute__((vector_size(4 * LANES)));

static inline vf exp_vf(vf x) {
    const vf lowest = (vf){0} - 44.361419555836500f, highest = (vf){0} + 88.0f, magic = (vf){0} + 12582912.0f; /* 1.5 * 2^23 */
    const vi under = x < lowest, over = x > highest;
    x = (vf)(((vi)x & ~under) | ((vi)lowest & under));
    x = (vf)(((vi)x & ~over) | ((vi)highest & over));
    const vf shifted = x * 1.44269504088896341f + magic; /* round(x log2 e) in the low bits */
    const vf n = shifted - magic;
    const vf r = x - n * 0.693359375f - n * -2.12194440e-4f;
    vf p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const vi two_n = ((vi)shifted - 0x4B400000 + 127) << 23;
    return (vf)((vi)(p * (vf)two_n) & ~under);
}

static inline float dot(const float *restrict a, const float *restrict b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* q . k for four rows k at once, `stride` floats apart (four independent accumulators: one
 * dot alone is a chain of dependent FMAs); dot1 is the same sum for one row. The compiler
 * does not round the two alike (last-bit differences), so every caller groups its
 * rows into fours the same way whatever the thread count. */
static inline void dot4(const float *restrict q, const float *restrict k, const int64_t stride, const int64_t n,
                        float out[4]) {
    vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}; /* (named, not an array: kept in registers) */
    int64_t d = 0;
    for (; d + LANES <= n; d += LANES) {
        const vf qv = load_vf(q + d);
        a0 += qv * load_vf(k + d);
        a1 += qv * load_vf(k + stride + d);
        a2 += qv * load_vf(k + 2 * stride + d);
        a3 += qv * load_vf(k + 3 * stride + d);
    }
    float s[4] = {sum_lanes(a0), sum_lanes(a1), sum_lanes(a2), sum_lanes(a3)};
    for (int j = 0; j < 4; j++) {
        for (int64_t e = d; e < n; e++) s[j] += q[e] * k[j * stride + e];
        out[j] = s[j];
    }
}

static inline float dot1(const float *restrict q, const float *restrict k, const int64_t n) {
    vf a0 = {0};
    int64_t d = 0;
    for (; d + LANES <= n; d += LANES) a0 += load_vf(q + d) * load_vf(k + d);
    float s = sum_lanes(a0);
    for (int64_t e = d; e < n; e++) s += q[e] * k[e];
    return s;
}

/* out[i] = q . rows[i] for `count` rows `stride` floats apart: fours, then ones. */
static inline void dots(const float *restrict q, const float *restrict rows, const int64_t stride,
                        const int64_t count, const int64_t n, float *restrict out) {
    int64_t i = 0;
    for (; i + 4 <= count; i += 4) dot4(q, rows + i * stride, stride, n, out + i);
    for (; i < count; i++) out[i] = dot1(q, rows + i * stride, n);
}

#endif /* SLM_QK_VEC_H */
