/* qkernels/gemm_packed.c: a prompt's products over the packed layouts, four tokens at a time.
 *
 * gemm_q4x8, gemm_q4kx8 and gemm_q6kx8 multiply one group of eight packed rows (rows_q4x8.c,
 * rows_q6kx8.c) by four rows of int8 x, for the layouts' GEMV kernels' exact integers and
 * float operations: an output is the same bits whichever kernel computed it (the tests hold
 * the prompt's chunk to the bits of the one-token product). gemm_q5x8 is Q5_0's one kernel
 * (rows_q5x8.c), for one to four rows of x. dot_group_tiles runs them (and the GEMV kernels
 * for the last rows of x) over every row of x; packed_rows_blocked runs it over a range of
 * rows in cache-sized blocks, for matmul.c's block_rows.
 *
 * Why a kernel of its own: the GEMV kernels unpack a block's codes into eight vectors and then
 * run every row of x over them; with four rows of x the eight codes, four accumulators, the
 * integer sums and x's copies do not fit AVX2's sixteen registers, and the compiler spilled
 * codes, accumulators and x to the stack on every block. Here a block's codes are unpacked one
 * group of four values at a time and multiplied at once by the four rows' broadcast x values
 * (each broadcast read straight from x), the rows' integer sums (16-bit, as in the GEMV: no
 * overflow, so the order of the integer additions does not change them) in four registers:
 * about twelve live vectors, one pass over the weights' bytes per four rows of x.
 *
 * Part of the unity build: _qkernels.c includes this file once, in dependency order; it is not
 * compiled on its own.
 */
#include "simd.h"
#include "blocks.h"

#if defined(__AVX2__) && defined(__F16C__)
/* Four int8 values of x (any alignment) in every 32-bit lane. */
static inline __m256i x4_broadcast(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* The four sums in registers here: GCC otherwise reassociates the 16-bit additions (integers:
 * any order gives the same sums) into a tree over all the products and spills them. */
#define KEEP4(a, b, c, d) __asm__("" : "+x"(a), "+x"(b), "+x"(c), "+x"(d))

/* One 32-value run of four rows of x (xq rows n apart, at the run's first value) against the
 * eight groups of codes: s0..s3 (16-bit lanes, each row's pairs) = sum over the groups of
 * maddubs(codes, x[t]'s four values). The same integers as the GEMV kernels' (no lane
 * overflows: rows_q4x8.c), whatever the order of the additions. Named variables, not arrays:
 * GCC kept arrays of vectors on the stack. */
#define RUN_SUMS4(group, xq, n, s0, s1, s2, s3)                                                      \
    do {                                                                                              \
        const int8_t *x0_ = (xq), *x1_ = x0_ + (n), *x2_ = x1_ + (n), *x3_ = x2_ + (n);               \
        for (int c_ = 0; c_ < 8; c_++) {                                                              \
            const __m256i w_ = (group);                                                               \
            const __m256i m0_ = _mm256_maddubs_epi16(w_, x4_broadcast(x0_ + 4 * c_));                 \
            const __m256i m1_ = _mm256_maddubs_epi16(w_, x4_broadcast(x1_ + 4 * c_));                 \
            const __m256i m2_ = _mm256_maddubs_epi16(w_, x4_broadcast(x2_ + 4 * c_));                 \
            const __m256i m3_ = _mm256_maddubs_epi16(w_, x4_broadcast(x3_ + 4 * c_));                 \
            if (c_ == 0) s0 = m0_, s1 = m1_, s2 = m2_, s3 = m3_;                                      \
            else s0 = _mm256_add_epi16(s0, m0_), s1 = _mm256_add_epi16(s1, m1_),                      \
                 s2 = _mm256_add_epi16(s2, m2_), s3 = _mm256_add_epi16(s3, m3_);                      \
            KEEP4(s0, s1, s2, s3);                                                                    \
        }                                                                                             \
    } while (0)

/* dot_group_q4x8's results (rows_q4x8.c) for four rows of x, bit for bit. */
static inline __attribute__((always_inline)) void gemm_q4x8(const int type, const uint8_t *restrict grp, const int n,
                                                            const int8_t *restrict xq, const float *restrict dx,
                                                            const float *restrict xs, const int32_t *restrict xi,
                                                            float res[][8]) {
    const int blocks = n / 32, bytes = type == T_Q4_1 ? Q41X8_BYTES : Q4X8_BYTES, codes = bytes - 128;
    const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(15);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, m0 = a0, m1 = a0, m2 = a0, m3 = a0;
    for (int b = 0; b < blocks; b++) {
        const uint8_t *blk = grp + (size_t)b * bytes, *v = blk + codes;
        _mm_prefetch((const char *)blk + 1024, _MM_HINT_T0);
        _mm_prefetch((const char *)blk + 1024 + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)blk + 1024 + bytes - 1, _MM_HINT_T0);
        __m256i s0, s1, s2, s3;
        RUN_SUMS4(_mm256_and_si256(c_ < 4 ? _mm256_loadu_si256((const __m256i *)(v + 32 * c_))
                                          : _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(v + 32 * (c_ - 4))), 4),
                                   low4),
                  xq + 32 * b, n, s0, s1, s2, s3);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
#define Q4_ROW(t, s, a, m)                                                                                     \
        {                                                                                                      \
            __m256i p = _mm256_madd_epi16(s, ones);                                                            \
            if (type == T_Q4_0)                                                                                \
                p = _mm256_sub_epi32(p, _mm256_set1_epi32(8 * (xi[t * 2 * blocks + 2 * b] + xi[t * 2 * blocks + 2 * b + 1]))); \
            else                                                                                               \
                m = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16))),             \
                                    _mm256_set1_ps(xs[t * blocks + b]), m);                                    \
            a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(d, _mm256_set1_ps(dx[t * blocks + b])), a); \
        }
        Q4_ROW(0, s0, a0, m0) Q4_ROW(1, s1, a1, m1) Q4_ROW(2, s2, a2, m2) Q4_ROW(3, s3, a3, m3)
#undef Q4_ROW
    }
    if (type == T_Q4_1) a0 = _mm256_add_ps(a0, m0), a1 = _mm256_add_ps(a1, m1), a2 = _mm256_add_ps(a2, m2), a3 = _mm256_add_ps(a3, m3);
    _mm256_storeu_ps(res[0], a0), _mm256_storeu_ps(res[1], a1), _mm256_storeu_ps(res[2], a2), _mm256_storeu_ps(res[3], a3);
}

/* dot_group_q4kx8's results (rows_q4x8.c) for four rows of x, bit for bit: the same chain of
 * multiply-adds into each row's acc; the mins' chain (a sum of its own, added at the end) in a
 * second pass over the group, which frees their four registers in the first. */
static inline __attribute__((always_inline)) void gemm_q4kx8(const uint8_t *restrict grp, const int n,
                                                             const int8_t *restrict xq, const float *restrict dx,
                                                             const float *restrict xs, float res[][8]) {
    const int supers = n / 256, runs = n / 32;
    const __m256i low4 = _mm256_set1_epi8(15);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int b = 0; b < supers; b++) {
        const uint8_t *blk = grp + (size_t)b * Q4KX8_BYTES;
        for (int o = 0; o < 160; o += 64) _mm_prefetch((const char *)blk + 1024 + o, _MM_HINT_T0);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
        for (int k = 0; k < 8; k++) {
            const uint8_t *run = blk + 160 + 128 * k;
            _mm_prefetch((const char *)run + 1024, _MM_HINT_T0);
            _mm_prefetch((const char *)run + 1024 + 64, _MM_HINT_T0);
            const int r = 8 * b + k;
            __m256i s0, s1, s2, s3;
            RUN_SUMS4(_mm256_and_si256(c_ < 4 ? _mm256_loadu_si256((const __m256i *)(run + 32 * c_))
                                              : _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(run + 32 * (c_ - 4))), 4),
                                       low4),
                      xq + 32 * r, n, s0, s1, s2, s3);
            const __m128i sc8 = _mm_loadl_epi64((const __m128i *)(blk + 32 + 8 * k));
            const __m256i sc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sc8, sc8));
#define Q4K_ROW(t, s, a) \
            a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s, sc)), _mm256_mul_ps(d, _mm256_set1_ps(dx[t * runs + r])), a);
            Q4K_ROW(0, s0, a0) Q4K_ROW(1, s1, a1) Q4K_ROW(2, s2, a2) Q4K_ROW(3, s3, a3)
#undef Q4K_ROW
        }
    }
    __m256 m0 = _mm256_setzero_ps(), m1 = m0, m2 = m0, m3 = m0;
    for (int b = 0; b < supers; b++) {
        const uint8_t *blk = grp + (size_t)b * Q4KX8_BYTES;
        const __m256 neg_dmin = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16))));
        for (int k = 0; k < 8; k++) {
            const __m256 m = _mm256_mul_ps(neg_dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                                         _mm_loadl_epi64((const __m128i *)(blk + 96 + 8 * k)))));
            const int r = 8 * b + k;
            m0 = _mm256_fmadd_ps(m, _mm256_set1_ps(xs[r]), m0);
            m1 = _mm256_fmadd_ps(m, _mm256_set1_ps(xs[runs + r]), m1);
            m2 = _mm256_fmadd_ps(m, _mm256_set1_ps(xs[2 * runs + r]), m2);
            m3 = _mm256_fmadd_ps(m, _mm256_set1_ps(xs[3 * runs + r]), m3);
        }
    }
    _mm256_storeu_ps(res[0], _mm256_add_ps(a0, m0)), _mm256_storeu_ps(res[1], _mm256_add_ps(a1, m1));
    _mm256_storeu_ps(res[2], _mm256_add_ps(a2, m2)), _mm256_storeu_ps(res[3], _mm256_add_ps(a3, m3));
}

/* dot_group_q6kx8's results (rows_q6kx8.c) for four rows of x, bit for bit: per run and row
 * of x, the same four 16-bit pair sums each times its unit's scales by madd, the same offset,
 * their int32 sum (wrapping additions: any order gives the same bits), then the same
 * multiply-add. */
static inline __attribute__((always_inline)) void gemm_q6kx8(const uint8_t *restrict grp, const int n,
                                                             const int8_t *restrict xq, const float *restrict dx,
                                                             const int32_t *restrict xi, float res[][8]) {
    const int supers = n / 256, runs = n / 32;
    const __m256i low4 = _mm256_set1_epi8(15);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int b = 0; b < supers; b++) {
        const uint8_t *blk = grp + (size_t)b * Q6KX8_BYTES;
        _mm_prefetch((const char *)blk + 1024 + 16, _MM_HINT_T0);
        _mm_prefetch((const char *)blk + 1024 + 80, _MM_HINT_T0);
        _mm_prefetch((const char *)blk + 1024 + 143, _MM_HINT_T0);
        for (int k = 0; k < 8; k++) {
            const uint8_t *run = blk + 144 + 192 * k;
            for (int o = 0; o < 192; o += 64) _mm_prefetch((const char *)run + 1024 + o, _MM_HINT_T0);
            const __m128i sc = _mm_loadu_si128((const __m128i *)(blk + 16 + 16 * k));
            const __m256i sa = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sc, sc));
            const __m256i sb = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(sc, sc));
            const int r = 8 * b + k;
            const int8_t *x0 = xq + 32 * r, *x1 = x0 + n, *x2 = x1 + n, *x3 = x2 + n;
            __m256i q0, q1, q2, q3;
            for (int j = 0; j < 4; j++) { /* groups 2j, 2j + 1: unit j / 2's pair sums */
                const __m256i h = _mm256_loadu_si256((const __m256i *)(run + 128 + 32 * (j / 2)));
                const int c = 2 * j % 4, shift = 4 * (j / 2);
                const __m256i va = _mm256_loadu_si256((const __m256i *)(run + 32 * c));
                const __m256i vb = _mm256_loadu_si256((const __m256i *)(run + 32 * (c + 1)));
                const __m256i wa = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(va, shift), low4), q6_high(h, c));
                const __m256i wb = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(vb, shift), low4), q6_high(h, c + 1));
                const __m256i scale = j < 2 ? sa : sb;
                const int g = 4 * (j / 2) + c; /* the value group of wa: values 4g .. 4g + 3 */
#define Q6_PAIR(x, q)                                                                                          \
                {                                                                                              \
                    const __m256i u = _mm256_add_epi16(_mm256_maddubs_epi16(wa, x4_broadcast(x + 4 * g)),       \
                                                       _mm256_maddubs_epi16(wb, x4_broadcast(x + 4 * g + 4))); \
                    q = j == 0 ? _mm256_madd_epi16(u, scale) : _mm256_add_epi32(q, _mm256_madd_epi16(u, scale)); \
                }
                Q6_PAIR(x0, q0) Q6_PAIR(x1, q1) Q6_PAIR(x2, q2) Q6_PAIR(x3, q3)
#undef Q6_PAIR
                KEEP4(q0, q1, q2, q3);
            }
            const __m256i sab = _mm256_blend_epi16(sa, sb, 0xaa);
#define Q6_ROW(t, q, a)                                                                                              \
            {                                                                                                        \
                const int32_t sxa = xi[t * 2 * runs + 2 * r], sxb = xi[t * 2 * runs + 2 * r + 1];                    \
                const __m256i off = _mm256_madd_epi16(sab, _mm256_set1_epi32((int32_t)((uint32_t)sxb << 16 | (uint16_t)sxa))); \
                const __m256i p = _mm256_sub_epi32(q, _mm256_slli_epi32(off, 5));                                    \
                a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(d, _mm256_set1_ps(dx[t * runs + r])), a);    \
            }
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
            Q6_ROW(0, q0, a0) Q6_ROW(1, q1, a1) Q6_ROW(2, q2, a2) Q6_ROW(3, q3, a3)
#undef Q6_ROW
        }
    }
    _mm256_storeu_ps(res[0], a0), _mm256_storeu_ps(res[1], a1), _mm256_storeu_ps(res[2], a2), _mm256_storeu_ps(res[3], a3);
}

/* x . row 8g + r for NT <= SLM_TILE rows of x over a packed Q5_0 group (rows_q5x8.c), for one
 * token and a prompt's chunk alike (so they give the same bits). Per block and row of x: the
 * codes (q + 16) times x by maddubs, groups 0..3 and 4..7 each summed in 16 bits (four pairs:
 * at most 4 x 2 x 31 x 127 = 31496), pairs to int32 by madd, minus 16 times the x sum (the
 * offset), one multiply-add by d (the eight rows') times dx. */
static inline __attribute__((always_inline)) void gemm_q5x8(const int NT, const uint8_t *restrict grp, const int n,
                                                            const int8_t *restrict xq, const float *restrict dx,
                                                            const int32_t *restrict xi, float res[][8]) {
    const int blocks = n / 32;
    const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(15), bit4 = _mm256_set1_epi8(16);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m256i zero = _mm256_setzero_si256(), s0 = zero, s1 = zero, s2 = zero, s3 = zero, p0 = zero, p1 = zero, p2 = zero,
            p3 = zero;
    const int8_t *x0 = xq, *x1 = x0 + n, *x2 = x1 + n, *x3 = x2 + n;
/* the statement for each of the NT rows of x (t, its sums s and p, its accumulator a, its x) */
#define EACH_ROW(M) M(0, s0, p0, a0, x0) M(1, s1, p1, a1, x1) M(2, s2, p2, a2, x2) M(3, s3, p3, a3, x3)
    for (int b = 0; b < blocks; b++) {
        const uint8_t *blk = grp + (size_t)b * Q5X8_BYTES, *v = blk + 16;
        _mm_prefetch((const char *)blk + 1024, _MM_HINT_T0);
        _mm_prefetch((const char *)blk + 1024 + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)blk + 1024 + 128, _MM_HINT_T0);
        const __m256i h = _mm256_loadu_si256((const __m256i *)(blk + 144));
        for (int half = 0; half < 2; half++) {
            for (int c4 = 0; c4 < 4; c4++) {
                const int c = 4 * half + c4;
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(v + 32 * c4));
                const __m256i fifth = c < 4 ? _mm256_slli_epi16(h, 4 - c) : c == 4 ? h : _mm256_srli_epi16(h, c - 4);
                const __m256i w = _mm256_or_si256(_mm256_and_si256(half ? _mm256_srli_epi16(raw, 4) : raw, low4),
                                                  _mm256_and_si256(fifth, bit4));
#define Q5_GROUP(t, s, p, a, x)                                                                    \
                if (t < NT) {                                                                      \
                    const __m256i m = _mm256_maddubs_epi16(w, x4_broadcast(x + 32 * b + 4 * c));    \
                    s = c4 == 0 ? m : _mm256_add_epi16(s, m);                                      \
                }
                EACH_ROW(Q5_GROUP)
#undef Q5_GROUP
                KEEP4(s0, s1, s2, s3);
            }
#define Q5_HALF(t, s, p, a, x) \
            if (t < NT) p = half == 0 ? _mm256_madd_epi16(s, ones) : _mm256_add_epi32(p, _mm256_madd_epi16(s, ones));
            EACH_ROW(Q5_HALF)
#undef Q5_HALF
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
#define Q5_ROW(t, s, p, a, x)                                                                                          \
        if (t < NT) {                                                                                                  \
            const __m256i q = _mm256_sub_epi32(p, _mm256_set1_epi32(16 * (xi[t * 2 * blocks + 2 * b] + xi[t * 2 * blocks + 2 * b + 1]))); \
            a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_mul_ps(d, _mm256_set1_ps(dx[t * blocks + b])), a);       \
        }
        EACH_ROW(Q5_ROW)
#undef Q5_ROW
    }
#undef EACH_ROW
    _mm256_storeu_ps(res[0], a0);
    if (NT > 1) _mm256_storeu_ps(res[1], a1);
    if (NT > 2) _mm256_storeu_ps(res[2], a2);
    if (NT > 3) _mm256_storeu_ps(res[3], a3);
}
#define HAVE_GEMM4 1
#else
/* the same integers without AVX2 (results differ from the AVX2 build in float rounding only) */
static inline void gemm_q5x8(const int NT, const uint8_t *restrict grp, const int n, const int8_t *restrict xq,
                             const float *restrict dx, const int32_t *restrict xi, float res[][8]) {
    const int blocks = n / 32;
    for (int t = 0; t < NT; t++)
        for (int r = 0; r < 8; r++) {
            float acc = 0.0f;
            for (int b = 0; b < blocks; b++) {
                const uint8_t *blk = grp + (size_t)b * Q5X8_BYTES;
                int32_t isum = -16 * (xi[t * 2 * blocks + 2 * b] + xi[t * 2 * blocks + 2 * b + 1]);
                for (int v = 0; v < 32; v++) {
                    const int k = v / 4, i = v % 4;
                    const int code = ((blk[16 + 32 * (k % 4) + 4 * r + i] >> (4 * (k / 4))) & 15) |
                                     ((blk[144 + 4 * r + i] >> k & 1) << 4);
                    isum += code * xq[(int64_t)t * n + 32 * b + v];
                }
                acc += (float)isum * (half_to_float(blk + 2 * r) * dx[t * blocks + b]);
            }
            res[t][r] = acc;
        }
}
#endif

/* Rows [lo, hi) of the group of rows g0 .. g0 + 7 (packed at grp) for every row of x, into
 * out (tokens, out_n): four rows of x at a time, then the rest. */
static inline void dot_group_tiles(const int type, const uint8_t *restrict grp, const int n, const int8_t *restrict xq,
                                   const float *restrict dx, const float *restrict xs, const int32_t *restrict xi,
                                   const int64_t tokens,
                                   float *restrict out, const int64_t out_n, const int64_t g0, const int64_t lo,
                                   const int64_t hi) {
    const int64_t runs = n / 32;
    float res[SLM_TILE][8];
    for (int64_t t = 0; t < tokens; t += SLM_TILE) {
        const int NT = tokens - t < SLM_TILE ? (int)(tokens - t) : SLM_TILE;
        const int8_t *x = xq + t * n;
        const float *d = dx + t * runs;
        const int32_t *s = xi + t * 2 * runs;
        const float *f = xs + t * runs;
#ifdef HAVE_GEMM4
        if (NT == 4 && type == T_Q4_0) { gemm_q4x8(T_Q4_0, grp, n, x, d, f, s, res); goto store; }
        if (NT == 4 && type == T_Q4_1) { gemm_q4x8(T_Q4_1, grp, n, x, d, f, s, res); goto store; }
        if (NT == 4 && type == T_Q4_K) { gemm_q4kx8(grp, n, x, d, f, res); goto store; }
        if (NT == 4 && type == T_Q6_K) { gemm_q6kx8(grp, n, x, d, s, res); goto store; }
#endif
        switch (type * 8 + NT) {
#define TILE(k)                                                                 \
    case T_Q4_0 * 8 + k: dot_group_q4x8(T_Q4_0, k, grp, n, x, d, f, s, res); break; \
    case T_Q4_1 * 8 + k: dot_group_q4x8(T_Q4_1, k, grp, n, x, d, f, s, res); break; \
    case T_Q5_0 * 8 + k: gemm_q5x8(k, grp, n, x, d, s, res); break;                 \
    case T_Q4_K * 8 + k: dot_group_q4kx8(k, grp, n, x, d, f, res); break;       \
    case T_Q6_K * 8 + k: dot_group_q6kx8(k, grp, n, x, d, s, res); break;
        TILE(1) TILE(2) TILE(3) TILE(4)
#undef TILE
        }
    store:
        for (int j = 0; j < NT; j++)
            for (int64_t r = lo; r < hi; r++) out[(t + j) * out_n + r] = res[j][r - g0];
    }
}

/* Rows [r0, r1) of a packed weight for every row of x (one token, or a prompt's chunk), in blocks of
 * GEMM_ROWS rows and, within one, of about GEMM_X_BYTES of x: each block of x read from memory
 * once for the block's groups of rows, which stay in the cache meanwhile, instead of all of x
 * (larger than a core's L2) streamed once per group of eight rows. Each output is computed by
 * the same kernel whatever the blocks (dot_group_tiles). */
#define GEMM_ROWS 64
#define GEMM_X_BYTES (64 << 10)
static void packed_rows_blocked(const int type, const uint8_t *restrict packed, const int n,
                                const int8_t *restrict xq, const float *restrict dx, const float *restrict xs,
                                const int32_t *restrict xi, const int64_t tokens, float *restrict out,
                                const int64_t out_n, const int64_t r0, const int64_t r1) {
    const int64_t group_bytes = packed_group_bytes(type, n), runs = n / 32;
    int64_t block = GEMM_X_BYTES / n / SLM_TILE * SLM_TILE;
    if (block < SLM_TILE) block = SLM_TILE;
    for (int64_t b0 = r0, b1; b0 < r1; b0 = b1) {
        b1 = (b0 + GEMM_ROWS) / 8 * 8 < r1 ? (b0 + GEMM_ROWS) / 8 * 8 : r1; /* (a block ends on a group) */
        for (int64_t t0 = 0; t0 < tokens; t0 += block) {
            const int64_t nt = tokens - t0 < block ? tokens - t0 : block;
            for (int64_t g0 = b0 / 8 * 8; g0 < b1; g0 += 8)
                dot_group_tiles(type, packed + g0 / 8 * group_bytes, n, xq + t0 * n, dx + t0 * runs, xs + t0 * runs,
                                xi + t0 * 2 * runs, nt, out + t0 * out_n, out_n, g0, g0 > b0 ? g0 : b0,
                                g0 + 8 < b1 ? g0 + 8 : b1);
        }
    }
}
