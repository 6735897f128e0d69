/* qkernels/rows_q8k.c: products of one weight, int8 path, for the K types Q4_K, Q5_K, Q6_K.
 *
 * The same x as rows_q8.c quantizes (quantize_x8: per 32 values, one scale dx each), so that
 * a product mixing 32-value and K types (a Q4_K_M layer's q, k in Q4_K and v in Q6_K) shares
 * one quantized input, and x keeps the finer of the two granularities llama.cpp uses (its
 * Q8_K takes one scale per 256 values). A 256-value super-block is then eight runs of 32
 * values, each against one dx: per run the integer dot product with the unit scales applied
 * in integers (Q6_K's two 16-value units, Q4_K's and Q5_K's one 32-value unit), one float
 * conversion and one multiply-add by d * dx; the mins of Q4_K and Q5_K as one 8-lane
 * multiply-add of the super-block's mins by the sums of the rounded x over its runs (xs = dx * sum(q)).
 * Called by matmul.c's block_rows for Q8K_TYPE weights when a product runs with int8
 * activations. Uses rows_q8.c's sum8 and SLM_TILE (included before this file).
 *
 * Part of the unity build: _qkernels.c includes this file once, in dependency order; it is not
 * compiled on its own.
 */
#include "simd.h"
#include "blocks.h"

#define Q8K_TYPE(type) ((type) == T_Q4_K || (type) == T_Q5_K || (type) == T_Q6_K)
/* Every type that takes int8 activations */
#define INT8_TYPE(type) (Q8_TYPE(type) || Q8K_TYPE(type))

#if defined(__AVX2__)
/* Run k (values 32k .. 32k + 31) of a Q4_K / Q5_K block: its codes, 0..15 / 0..31, as
 * unsigned bytes in value order. Unit k is the low (k even) or high nibbles of
 * qs[32 (k / 2) ..], and for Q5_K bit k of each byte of qh[0 .. 31] its fifth bit. */
static inline __m256i k_run_codes(const int type, const uint8_t *restrict blk, const int k) {
    const __m256i qs = _mm256_loadu_si256((const __m256i *)(blk + (type == T_Q5_K ? 48 : 16) + 32 * (k / 2)));
    __m256i c = _mm256_and_si256(k % 2 ? _mm256_srli_epi16(qs, 4) : qs, _mm256_set1_epi8(15));
    if (type == T_Q5_K) {
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
        const __m256i at4 = k <= 4 ? _mm256_slli_epi16(qh, 4 - k) : _mm256_srli_epi16(qh, k - 4);
        c = _mm256_or_si256(c, _mm256_and_si256(at4, _mm256_set1_epi8(16)));
    }
    return c;
}

/* Run k = 4h + s of a Q6_K block, its codes q - 32 in -32..31 as signed bytes: the low (s < 2)
 * or high nibbles of ql[64h + 32 (s % 2) ..] and bits 2s, 2s + 1 of qh[32h ..] above them. */
static inline __m256i q6k_run_codes(const uint8_t *restrict blk, const int k) {
    const int h = k / 4, s = k % 4;
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (s % 2)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
    const __m256i lo = _mm256_and_si256(s < 2 ? ql : _mm256_srli_epi16(ql, 4), _mm256_set1_epi8(15));
    const __m256i hi2 = s == 0 ? _mm256_slli_epi16(qh, 4) : s == 1 ? _mm256_slli_epi16(qh, 2)
                      : s == 2 ? qh : _mm256_srli_epi16(qh, 2); /* bits 2s, 2s + 1 to 4, 5 */
    const __m256i hi = _mm256_and_si256(hi2, _mm256_set1_epi8(0x30));
    return _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
}

/* x[t] . row for NT <= SLM_TILE rows of int8 x, a row of K blocks (as dot_rows_q8). Per run,
 * 16-bit pair sums of unsigned codes times signed x (maddubs: no pair reaches its saturation,
 * codes <= 32 in magnitude and |x| <= 127), then pairs of those times the unit scale as 16-bit
 * integers (madd: exact in 32 bits), converted once. */
static inline __attribute__((always_inline)) void dot_rows_q8k(const int type, const int NT, const uint8_t *restrict row,
                                                               const int n, const int8_t *restrict xq,
                                                               const float *restrict dx, const float *restrict xs,
                                                               float *restrict out, const int64_t out_n) {
    const int has_min = type != T_Q6_K;
    const int bytes = type_info(type).bytes, supers = n / 256, runs = n / 32;
    __m256 acc[SLM_TILE], mins[SLM_TILE];
    for (int t = 0; t < NT; t++) acc[t] = mins[t] = _mm256_setzero_ps();
    for (int b = 0; b < supers; b++) {
        const uint8_t *blk = row + (size_t)b * bytes;
        /* a kilobyte ahead, each line of the block (see dot_rows_q8) */
        for (int o = 0; o < bytes; o += 64) _mm_prefetch((const char *)blk + 1024 + o, _MM_HINT_T0);
        float d;
        __m256i scale16[8]; /* per run: the unit scale(s) as 16-bit lanes, for madd */
        __m256 mvec = _mm256_setzero_ps(); /* the 8 units' mins, -(dmin * mn) */
        if (type == T_Q6_K) {
            d = half_to_float(blk + 208);
            /* int32 lane k: the scales of units 2k, 2k + 1 as two int16; run k takes the first
             * in its low 128 bits (values 0-15) and the second in its high 128 (16-31) */
            const __m256i pairs = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
            const __m256i split = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                                   2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                scale16[k] = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(pairs, _mm256_set1_epi32(k)), split);
        } else {
            float dmin;
            halves_to_floats(blk, &d, &dmin);
            uint64_t sc, mn;
            k_scales_mins(blk + 4, &sc, &mn);
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) scale16[k] = _mm256_set1_epi16((short)((sc >> (8 * k)) & 0xff));
            mvec = _mm256_mul_ps(_mm256_set1_ps(-dmin), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn))));
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m256i w = type == T_Q6_K ? q6k_run_codes(blk, k) : k_run_codes(type, blk, k);
            const __m256i aw = type == T_Q6_K ? _mm256_sign_epi8(w, w) : w; /* a signed code's sign moves onto x */
            const int r = 8 * b + k;
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                __m256i x = _mm256_loadu_si256((const __m256i *)(xq + (int64_t)t * n + 32 * r));
                if (type == T_Q6_K) x = _mm256_sign_epi8(x, w);
                const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, x), scale16[k]);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * dx[t * runs + r]), acc[t]);
            }
        }
        if (has_min)
            for (int t = 0; t < NT; t++) mins[t] = _mm256_fmadd_ps(mvec, _mm256_loadu_ps(xs + t * runs + 8 * b), mins[t]);
    }
    for (int t = 0; t < NT; t++) out[t * out_n] = has_min ? sum8(acc[t]) + sum8(mins[t]) : sum8(acc[t]);
}
#else
/* the same integers without AVX2, from blocks.h's scales and codes (results differ from the
 * AVX2 build in float rounding only) */
static inline void dot_rows_q8k(const int type, const int NT, const uint8_t *restrict row, const int n,
                                const int8_t *restrict xq, const float *restrict dx, const float *restrict xs,
                                float *restrict out, const int64_t out_n) {
    const block_type bt = type_info(type);
    const int runs = n / 32;
    for (int t = 0; t < NT; t++) {
        float acc = 0.0f;
        for (int b = 0; b < n / 256; b++) {
            const uint8_t *blk = row + (size_t)b * bt.bytes;
            float d[16], m[16];
            block_scales(type, blk, d, m);
            for (int k = 0; k < 8; k++) {
                const int r = 8 * b + k;
                int32_t isum[2] = {0, 0};
                for (int g = 0; g < 2; g++) {
                    int8_t codes[16];
                    const i8x16 c = block_codes(type, blk, 2 * k + g);
                    memcpy(codes, &c, 16);
                    for (int i = 0; i < 16; i++) isum[g] += codes[i] * xq[(int64_t)t * n + 32 * r + 16 * g + i];
                }
                if (bt.unit == 32)
                    acc += (float)(isum[0] + isum[1]) * (d[k] * dx[t * runs + r]) + m[k] * xs[t * runs + r];
                else
                    acc += ((float)isum[0] * d[2 * k] + (float)isum[1] * d[2 * k + 1]) * dx[t * runs + r];
            }
        }
        out[t * out_n] = acc;
    }
}
#endif

SLM_INT8_TILES(dot_tiles_q8k, dot_rows_q8k) /* (rows_q8.c) */
