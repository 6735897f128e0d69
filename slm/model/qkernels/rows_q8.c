/* qkernels/rows_q8.c: products of one weight, int8 path (the default mode's activations).
 *
 * quantize_x8 quantizes x per 32 values; dot_rows_q8 / dot_tiles_q8 take each block's dot
 * product in integers (AVX2: VNNI where the CPU has it), for the 32-value types (Q8_TYPE).
 * Called by matmul.c's block_rows when a product runs with int8 activations
 * (NativeKernels.set_activations("int8"), docs/numerics.md).
 *
 * Part of the unity build: _qkernels.c includes this file once, in dependency order; it is not
 * compiled on its own.
 */
#include "simd.h"
#include "blocks.h"

/* ---------------------------------------------------------------- int8 activations (default)
 *
 * The default mode: faster, its results moved from the exact mode's (docs/numerics.md). x is
 * quantized once per product, per 32 values, to q = round(x / dx) in -127..127 with
 * dx = max|x| / 127, and each block's dot product taken in integers, exactly: x . w over a
 * block = dw * dx * (q . qw) (+ m * xs for the types with a min, xs = dx * sum(q): the rounded
 * block's own sum, as llama.cpp takes it; the float sum instead weights x's rounding errors by
 * uncentred codes, and they add up instead of cancelling: docs/numerics.md). Only the 32-value types (Q4_0, Q4_1, Q5_0, Q5_1,
 * Q8_0) take it; the others keep float activations in the same call. A row's result is the
 * same sequence of operations whatever rows share the call, as on the float path. */
#define SLM_TILE 4 /* rows of int8 x per dot_rows_q8 call */
#define Q8_TYPE(type) ((type) == T_Q4_0 || (type) == T_Q4_1 || (type) == T_Q5_0 || (type) == T_Q5_1 || (type) == T_Q8_0)

/* x (tokens, n), n a multiple of 32 -> q (tokens, n), dx (tokens, n / 32), the sums of each 32
 * rounded values, xs = dx * sum(q) (tokens, n / 32), and the integer sums of each 16 q, xi (tokens, n / 16:
 * the packed kernels' code offsets, rows_q4x8.c and rows_q6kx8.c). A block holding a NaN gets
 * dx NaN, so that it reaches the output as it does on the float path. */
static void quantize_x8(const float *restrict x, int64_t tokens, int64_t n, int8_t *restrict q,
                        float *restrict dx, float *restrict xs, int32_t *restrict xi) {
    for (int64_t b = 0; b < tokens * (n / 32); b++) {
        const float *xb = x + b * 32;
#if defined(__AVX2__)
        __m256 v[4], amax = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
        const __m256 sign = _mm256_set1_ps(-0.0f);
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(xb + 8 * k);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v[k], v[k], _CMP_UNORD_Q));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float max = _mm_cvtss_f32(m4);
        if (_mm256_movemask_ps(nan)) {
            dx[b] = xs[b] = NAN;
            xi[2 * b] = xi[2 * b + 1] = 0;
            memset(q + b * 32, 0, 32);
            continue;
        }
        const __m256 inv = _mm256_set1_ps(max > 0.0f ? 127.0f / max : 0.0f);
        __m256i i[4];
        for (int k = 0; k < 4; k++) i[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], inv)); /* to nearest, even */
        const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        _mm256_storeu_si256((__m256i *)(q + b * 32),
                            _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        dx[b] = max / 127.0f;
#else
        float amax = 0.0f;
        int nan = 0;
        for (int i = 0; i < 32; i++) {
            const float a = fabsf(xb[i]);
            amax = a > amax ? a : amax;
            nan |= xb[i] != xb[i];
        }
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        dx[b] = nan ? NAN : amax / 127.0f;
        for (int i = 0; i < 32; i++) q[b * 32 + i] = nan ? 0 : (int8_t)lrintf(xb[i] * inv);
#endif
        for (int h = 0; h < 2; h++) {
            int32_t sum = 0;
            for (int i = 0; i < 16; i++) sum += q[b * 32 + 16 * h + i];
            xi[2 * b + h] = sum;
        }
        xs[b] = dx[b] * (float)(xi[2 * b] + xi[2 * b + 1]); /* (NaN with dx) */
    }
}

/* A block's 32 codes in value order, as integers: signed (q - offset: Q4_0, Q5_0, Q8_0) or
 * unsigned (Q4_1, Q5_1: the min is applied in floats); d and m its scale and min. */
#if defined(__AVX2__)
static inline __m256i block_q8(const int type, const uint8_t *restrict blk, float *d, float *m) {
    const __m256i low4 = _mm256_set1_epi8(15);
    __m128i qs;
    uint32_t qh = 0;
    if (type == T_Q8_0 || type == T_Q4_0 || type == T_Q5_0) *d = half_to_float(blk);
    switch (type) {
    case T_Q8_0: return _mm256_loadu_si256((const __m256i *)(blk + 2));
    case T_Q4_0: qs = _mm_loadu_si128((const __m128i *)(blk + 2)); break;
    case T_Q4_1: halves_to_floats(blk, d, m); qs = _mm_loadu_si128((const __m128i *)(blk + 4)); break;
    case T_Q5_0: memcpy(&qh, blk + 2, 4); qs = _mm_loadu_si128((const __m128i *)(blk + 6)); break;
    default: /* T_Q5_1 */
        halves_to_floats(blk, d, m);
        memcpy(&qh, blk + 4, 4);
        qs = _mm_loadu_si128((const __m128i *)(blk + 8));
    }
    /* byte j: value j in its low nibble, value j + 16 in its high one */
    __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), low4);
    if (type == T_Q5_0 || type == T_Q5_1) { /* bit j of qh: value j's fifth bit */
#if defined(__AVX512BW__) && defined(__AVX512VL__)
        v = _mm256_mask_add_epi8(v, (__mmask32)qh, v, _mm256_set1_epi8(16)); /* qh as a mask, as it stands */
#else
        const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                                   _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                                                     0x0101010101010101LL, 0));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        const __m256i on = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        v = _mm256_or_si256(v, _mm256_and_si256(on, _mm256_set1_epi8(16)));
#endif
    }
    if (type == T_Q4_0) v = _mm256_sub_epi8(v, _mm256_set1_epi8(8));
    if (type == T_Q5_0) v = _mm256_sub_epi8(v, _mm256_set1_epi8(16));
    return v;
}

static inline float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Per 32-bit lane, the sum of its four products of unsigned bytes u by signed bytes s: one
 * VNNI instruction where the CPU has it, else maddubs + madd (the same integers: no pair of
 * products here reaches maddubs' int16 saturation, |code| <= 128 and |x| <= 127). */
static inline __m256i dot_u8_i8(__m256i u, __m256i s, __m256i ones16) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    (void)ones16;
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
    (void)ones16;
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones16);
#endif
}

/* x[t] . row for NT <= SLM_TILE rows of int8 x (xq rows n apart, dx and xs rows n / 32 apart):
 * per block, the codes unpacked once; per row, the 32 products summed in integers (dot_u8_i8
 * takes unsigned x signed bytes: a signed code's sign moves onto x), then scaled. */
static inline __attribute__((always_inline)) void dot_rows_q8(const int type, const int NT, const uint8_t *restrict row,
                                                              const int n, const int8_t *restrict xq,
                                                              const float *restrict dx, const float *restrict xs,
                                                              float *restrict out, const int64_t out_n) {
    const int has_min = type == T_Q4_1 || type == T_Q5_1, is_signed = !has_min;
    const int bytes = type_info(type).bytes, blocks = n / 32;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[SLM_TILE];
    float mins[SLM_TILE];
    for (int t = 0; t < NT; t++) {
        acc[t] = _mm256_setzero_ps();
        mins[t] = 0.0f;
    }
    for (int b = 0; b < blocks; b++) {
        float d, m = 0.0f;
        /* a kilobyte ahead: the hardware prefetcher alone leaves one thread waiting on memory */
        _mm_prefetch((const char *)row + (size_t)b * bytes + 1024, _MM_HINT_T0);
        const __m256i w = block_q8(type, row + (size_t)b * bytes, &d, &m);
        const __m256i aw = is_signed ? _mm256_sign_epi8(w, w) : w;
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(xq + (int64_t)t * n + 32 * b));
            if (is_signed) x = _mm256_sign_epi8(x, w);
            const __m256i p = dot_u8_i8(aw, x, ones);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * dx[t * blocks + b]), acc[t]);
            /* (an explicit fma: the compiler contracts `+= m * x` in some instantiations only) */
            if (has_min) mins[t] = fmaf(m, xs[t * blocks + b], mins[t]);
        }
    }
    for (int t = 0; t < NT; t++) out[t * out_n] = sum8(acc[t]) + mins[t];
}
#else
/* the same integers without AVX2 (results differ from the AVX2 build in float rounding only) */
static inline void dot_rows_q8(const int type, const int NT, const uint8_t *restrict row, const int n,
                               const int8_t *restrict xq, const float *restrict dx, const float *restrict xs,
                               float *restrict out, const int64_t out_n) {
    const block_type bt = type_info(type);
    const int blocks = n / 32;
    for (int t = 0; t < NT; t++) {
        float acc = 0.0f;
        for (int b = 0; b < blocks; b++) {
            const uint8_t *blk = row + (size_t)b * bt.bytes;
            float d[16], m[16];
            block_scales(type, blk, d, m);
            int32_t isum = 0;
            for (int g = 0; g < 2; g++) {
                int8_t codes[16];
                const i8x16 c = block_codes(type, blk, g);
                memcpy(codes, &c, 16);
                for (int i = 0; i < 16; i++) isum += codes[i] * xq[(int64_t)t * n + 32 * b + 16 * g + i];
            }
            acc += (float)isum * (d[0] * dx[t * blocks + b]) + (bt.has_min ? m[0] * xs[t * blocks + b] : 0.0f);
        }
        out[t * out_n] = acc;
    }
}
#endif

/* name(type, row, n, xq, dx, xs, tokens, out, out_n): `dot_rows` (rows_q8.c's or rows_q8k.c's:
 * both take x per 32 values) over every row of x, SLM_TILE at a time, then the rest, each call
 * with a constant row count so that its loops unroll. */
#define SLM_INT8_TILES(name, dot_rows)                                                                          \
    static inline __attribute__((always_inline)) void name(const int type, const uint8_t *restrict row,       \
                                                           const int n, const int8_t *restrict xq,            \
                                                           const float *restrict dx, const float *restrict xs, \
                                                           const int64_t tokens, float *restrict out,          \
                                                           const int64_t out_n) {                             \
        const int64_t blocks = n / 32;                                                                      \
        int64_t t = 0;                                                                                      \
        for (; t + SLM_TILE <= tokens; t += SLM_TILE)                                                       \
            dot_rows(type, SLM_TILE, row, n, xq + t * n, dx + t * blocks, xs + t * blocks, out + t * out_n, out_n); \
        switch (tokens - t) {                                                                               \
        case 1: dot_rows(type, 1, row, n, xq + t * n, dx + t * blocks, xs + t * blocks, out + t * out_n, out_n); break; \
        case 2: dot_rows(type, 2, row, n, xq + t * n, dx + t * blocks, xs + t * blocks, out + t * out_n, out_n); break; \
        case 3: dot_rows(type, 3, row, n, xq + t * n, dx + t * blocks, xs + t * blocks, out + t * out_n, out_n); break; \
        }                                                                                                   \
    }

SLM_INT8_TILES(dot_tiles_q8, dot_rows_q8)
