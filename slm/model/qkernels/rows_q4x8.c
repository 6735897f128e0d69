/* qkernels/rows_q4x8.c: Q4_0, Q4_1 and Q4_K weights repacked eight rows at a time, int8 path.
 *
 * pack_q4_01 and pack_q4_k build the layouts (derived data, in memory: packed_copies.packed
 * keeps one per weight once an int8 product needs it, through slm_pack; the stored blob is
 * never rewritten); dot_group_q4x8 and dot_group_q4kx8 multiply one group of eight rows by up
 * to SLM_TILE rows of int8 x. Called through gemm_packed.c's dot_group_tiles, from matmul.c's block_rows for a job with
 * a packed copy when a product runs with int8 activations.
 *
 * Why: on the row-by-row path (rows_q8.c) each 32 products of a row cost their own unpacking,
 * sign fixes, conversion, scale and a horizontal sum at the end, about twelve vector operations
 * for 32 products. With eight rows interleaved four codes at a time, one vector holds four
 * codes of each of eight rows, and a broadcast of the four matching x values multiplies all
 * eight rows in one maddubs: 256 products in about twenty operations, each int32 lane one row's
 * sum, scaled by the eight rows' d in one vector, no horizontal sum.
 *
 * Part of the unity build: _qkernels.c includes this file once, in dependency order; it is not
 * compiled on its own.
 */
#include "simd.h"
#include "blocks.h"

/* A packed block: block b of the eight rows 8g .. 8g + 7, at (g * blocks + b) * Q4X8_BYTES:
 * their eight d (float16), then four 32-byte vectors V0..V3 of codes (nibbles, 0..15). Byte
 * 4r + i of Vj holds, in its low nibble, value 4j + i of row r and, in its high nibble, value
 * 4 (j + 4) + i: V & 15 and V >> 4 give the eight vectors Wk (k = 0..7) whose bytes 4r .. 4r + 3
 * are values 4k .. 4k + 3 of row r. As many bytes as the rows' own blocks (8 x 18). */
#define Q4X8_BYTES 144
/* Q4_1: the same with the eight rows' m (float16) after their d, codes at 32 (8 x 20 bytes) */
#define Q41X8_BYTES 160

/* One packed run: codes[r][v] (< 16) = value v of row r, for eight rows of 32 values, into the
 * four 32-byte vectors described above, four codes (one 32-bit word) at a time. */
static inline void pack_nibble_run(const uint8_t codes[8][32], uint8_t *restrict dst) {
    for (int j = 0; j < 4; j++)
        for (int r = 0; r < 8; r++) {
            uint32_t lo, hi;
            memcpy(&lo, codes[r] + 4 * j, 4);
            memcpy(&hi, codes[r] + 4 * (j + 4), 4);
            const uint32_t v = lo | hi << 4; /* (codes below 16: no bit crosses a byte) */
            memcpy(dst + 32 * j + 4 * r, &v, 4);
        }
}

/* Rows (a multiple of 8) of Q4_0 or Q4_1 weights, n values each and row_bytes apart, packed
 * into out (rows * row_bytes bytes; shapes checked by slm_pack, rows_q6kx8.c). A block's byte j
 * holds value j in its low nibble and j + 16 in its high one, which is the layout's byte order
 * within a row already: word j of Vj's row r (its bytes 4r .. 4r + 3) is word j of row r's
 * codes, and packing moves 4-byte words. */
static inline __attribute__((always_inline)) void pack_q4_01(const int type, const uint8_t *data, int64_t rows,
                                                              int64_t row_bytes, int64_t n, uint8_t *out) {
    const int64_t blocks = n / 32, groups = rows / 8;
    const int bytes = type == T_Q4_1 ? Q41X8_BYTES : Q4X8_BYTES, fields = bytes - 128; /* d (and m) */
#pragma omp parallel for SLM_TEAM_IF schedule(static)
    for (int64_t g = 0; g < groups; g++)
        for (int64_t b = 0; b < blocks; b++) {
            uint8_t *o = out + (g * blocks + b) * bytes;
            for (int r = 0; r < 8; r++) {
                const uint8_t *blk = data + (8 * g + r) * row_bytes + (fields / 8 + 16) * b;
                memcpy(o + 2 * r, blk, 2);
                if (type == T_Q4_1) memcpy(o + 16 + 2 * r, blk + 2, 2);
                for (int j = 0; j < 4; j++) memcpy(o + fields + 32 * j + 4 * r, blk + fields / 8 + 4 * j, 4);
            }
        }
}

/* res[t][r] = x[t] . row 8g + r for NT <= SLM_TILE rows of int8 x (xq rows n apart; dx, the
 * scales, rows n / 32 apart; xi, the integer sums of each 16 values, n / 16 apart). Per block and
 * row of x: sum over k of maddubs(Wk, the broadcast x[4k .. 4k + 3]) in 16-bit lanes (no
 * overflow: a pair is at most 2 x 15 x 127, eight of them 30480), pairs summed to int32 by
 * madd, minus 8 times the x sum (the codes' offset: q = nibble - 8), then one multiply-add by
 * d (the eight rows') times dx. Each row's value is the same operations whatever the tile, the
 * thread or the other rows of x. */
#if defined(__AVX2__) && defined(__F16C__)
static inline __attribute__((always_inline)) void dot_group_q4x8(const int type, const int NT, const uint8_t *restrict grp,
                                                                 const int n, const int8_t *restrict xq,
                                                                 const float *restrict dx, const float *restrict xs,
                                                                 const int32_t *restrict xi, float res[][8]) {
    const int blocks = n / 32, bytes = type == T_Q4_1 ? Q41X8_BYTES : Q4X8_BYTES, codes = bytes - 128;
    const __m256i low4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    __m256 acc[SLM_TILE], mins[SLM_TILE];
    for (int t = 0; t < NT; t++) acc[t] = mins[t] = _mm256_setzero_ps();
    for (int b = 0; b < blocks; b++) {
        const uint8_t *blk = grp + (size_t)b * bytes;
        /* (a kilobyte ahead, as rows_q8.c: each line of the block) */
        _mm_prefetch((const char *)blk + 1024, _MM_HINT_T0);
        _mm_prefetch((const char *)blk + 1024 + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)blk + 1024 + bytes - 1, _MM_HINT_T0);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
        const __m256 m = type == T_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16))) : d;
        __m256i w[8];
        for (int j = 0; j < 4; j++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + codes + 32 * j));
            w[j] = _mm256_and_si256(v, low4);
            w[j + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        }
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const int8_t *xb = xq + (int64_t)t * n + 32 * b;
            int32_t x4[8];
            memcpy(x4, xb, 32);
            __m256i s = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(x4[0]));
#pragma GCC unroll 8
            for (int k = 1; k < 8; k++) s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[k], _mm256_set1_epi32(x4[k])));
            __m256i p = _mm256_madd_epi16(s, ones);
            if (type == T_Q4_0) /* the codes' offset 8 */
                p = _mm256_sub_epi32(p, _mm256_set1_epi32(8 * (xi[t * 2 * blocks + 2 * b] + xi[t * 2 * blocks + 2 * b + 1])));
            else /* Q4_1's min times the float sum of x */
                mins[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(xs[t * blocks + b]), mins[t]);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(d, _mm256_set1_ps(dx[t * blocks + b])), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) _mm256_storeu_ps(res[t], type == T_Q4_1 ? _mm256_add_ps(acc[t], mins[t]) : acc[t]);
}
#else
/* the same integers without AVX2 (results differ from the AVX2 build in float rounding only) */
static inline void dot_group_q4x8(const int type, const int NT, const uint8_t *restrict grp, const int n,
                                  const int8_t *restrict xq, const float *restrict dx, const float *restrict xs,
                                  const int32_t *restrict xi, float res[][8]) {
    const int blocks = n / 32, bytes = type == T_Q4_1 ? Q41X8_BYTES : Q4X8_BYTES, codes = bytes - 128;
    for (int t = 0; t < NT; t++)
        for (int r = 0; r < 8; r++) {
            float acc = 0.0f;
            for (int b = 0; b < blocks; b++) {
                const uint8_t *blk = grp + (size_t)b * bytes;
                int32_t isum = type == T_Q4_0 ? -8 * (xi[t * 2 * blocks + 2 * b] + xi[t * 2 * blocks + 2 * b + 1]) : 0;
                for (int v = 0; v < 32; v++) {
                    const int k = v / 4, i = v % 4;
                    const int code = (blk[codes + 32 * (k % 4) + 4 * r + i] >> (4 * (k / 4))) & 15;
                    isum += code * xq[(int64_t)t * n + 32 * b + v];
                }
                acc += (float)isum * (half_to_float(blk + 2 * r) * dx[t * blocks + b]);
                if (type == T_Q4_1) acc += half_to_float(blk + 16 + 2 * r) * xs[t * blocks + b];
            }
            res[t][r] = acc;
        }
}
#endif

/* A packed Q4_K super-block: super-block b of the eight rows 8g .. 8g + 7, at (g * supers + b) *
 * Q4KX8_BYTES: their eight d, their eight dmin (float16), the unit scales (unit u's eight rows
 * at 32 + 8u) and mins (at 96 + 8u) as bytes, then per run (unit) k of 32 values four 32-byte
 * vectors of codes laid out as a Q4_0 block's above, at 160 + 128k. (32 bytes more than the
 * rows' own 8 x 144: the 6-bit scales and mins unpacked once here, not per super-block.) */
#define Q4KX8_BYTES 1184

static void pack_q4_k(const uint8_t *data, int64_t rows, int64_t row_bytes, int64_t n, uint8_t *out) {
    const int64_t supers = n / 256, groups = rows / 8;
#pragma omp parallel for SLM_TEAM_IF schedule(static)
    for (int64_t g = 0; g < groups; g++)
        for (int64_t b = 0; b < supers; b++) {
            uint8_t *o = out + (g * supers + b) * Q4KX8_BYTES;
            for (int r = 0; r < 8; r++) {
                const uint8_t *blk = data + (8 * g + r) * row_bytes + 144 * b;
                memcpy(o + 2 * r, blk, 2);
                memcpy(o + 16 + 2 * r, blk + 2, 2);
                uint64_t sc, mn;
                k_scales_mins(blk + 4, &sc, &mn);
                for (int u = 0; u < 8; u++) {
                    o[32 + 8 * u + r] = (uint8_t)(sc >> (8 * u));
                    o[96 + 8 * u + r] = (uint8_t)(mn >> (8 * u));
                }
                /* unit u: the low or high nibbles of qs[32 (u / 2) ..]; word j of its Vj's row r:
                 * values 4j .. 4j + 3 (low nibbles) and 16 + 4j .. (high), four bytes at a time */
                for (int u = 0; u < 8; u++)
                    for (int j = 0; j < 4; j++) {
                        uint32_t a, c;
                        memcpy(&a, blk + 16 + 32 * (u / 2) + 4 * j, 4);
                        memcpy(&c, blk + 16 + 32 * (u / 2) + 16 + 4 * j, 4);
                        const uint32_t v = (a >> (4 * (u % 2)) & 0x0f0f0f0fu) | (c >> (4 * (u % 2)) & 0x0f0f0f0fu) << 4;
                        memcpy(o + 160 + 128 * u + 32 * j + 4 * r, &v, 4);
                    }
            }
        }
}

/* res[t][r] = x[t] . row 8g + r, as dot_group_q4x8: per run (one unit), the eight rows' integer
 * sums times their unit scales by madd (at most 2 x 30480 x 63), one multiply-add by d times dx;
 * the mins, -(dmin * mn), times the float sums of x (xs) per run in their own accumulator. */
#if defined(__AVX2__) && defined(__F16C__)
static inline __attribute__((always_inline)) void dot_group_q4kx8(const int NT, const uint8_t *restrict grp, const int n,
                                                                  const int8_t *restrict xq, const float *restrict dx,
                                                                  const float *restrict xs, float res[][8]) {
    const int supers = n / 256, runs = n / 32;
    const __m256i low4 = _mm256_set1_epi8(15);
    __m256 acc[SLM_TILE], mins[SLM_TILE];
    for (int t = 0; t < NT; t++) acc[t] = mins[t] = _mm256_setzero_ps();
    for (int b = 0; b < supers; b++) {
        const uint8_t *blk = grp + (size_t)b * Q4KX8_BYTES;
        for (int o = 0; o < 160; o += 64) _mm_prefetch((const char *)blk + 1024 + o, _MM_HINT_T0);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
        const __m256 neg_dmin = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16))));
        for (int k = 0; k < 8; k++) {
            const uint8_t *run = blk + 160 + 128 * k;
            _mm_prefetch((const char *)run + 1024, _MM_HINT_T0);
            _mm_prefetch((const char *)run + 1024 + 64, _MM_HINT_T0);
            __m256i w[8];
            for (int j = 0; j < 4; j++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(run + 32 * j));
                w[j] = _mm256_and_si256(v, low4);
                w[j + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            }
            const __m128i sc8 = _mm_loadl_epi64((const __m128i *)(blk + 32 + 8 * k));
            const __m256i sc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sc8, sc8)); /* each row's twice */
            const __m256 m = _mm256_mul_ps(neg_dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                                         _mm_loadl_epi64((const __m128i *)(blk + 96 + 8 * k)))));
            const int r = 8 * b + k;
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                int32_t x4[8];
                memcpy(x4, xq + (int64_t)t * n + 32 * r, 32);
                __m256i s = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(x4[0]));
#pragma GCC unroll 8
                for (int c = 1; c < 8; c++) s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[c], _mm256_set1_epi32(x4[c])));
                const __m256i p = _mm256_madd_epi16(s, sc);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(d, _mm256_set1_ps(dx[t * runs + r])), acc[t]);
                mins[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(xs[t * runs + r]), mins[t]);
            }
        }
    }
    for (int t = 0; t < NT; t++) _mm256_storeu_ps(res[t], _mm256_add_ps(acc[t], mins[t]));
}
#else
static inline void dot_group_q4kx8(const int NT, const uint8_t *restrict grp, const int n, const int8_t *restrict xq,
                                   const float *restrict dx, const float *restrict xs, float res[][8]) {
    const int supers = n / 256, runs = n / 32;
    for (int t = 0; t < NT; t++)
        for (int r = 0; r < 8; r++) {
            float acc = 0.0f, mins = 0.0f;
            for (int b = 0; b < supers; b++) {
                const uint8_t *blk = grp + (size_t)b * Q4KX8_BYTES;
                for (int k = 0; k < 8; k++) {
                    int32_t isum = 0;
                    for (int v = 0; v < 32; v++) {
                        const int c = v / 4, i = v % 4;
                        isum += ((blk[160 + 128 * k + 32 * (c % 4) + 4 * r + i] >> (4 * (c / 4))) & 15) *
                                xq[(int64_t)t * n + 32 * (8 * b + k) + v];
                    }
                    acc += (float)(isum * blk[32 + 8 * k + r]) * (half_to_float(blk + 2 * r) * dx[t * runs + 8 * b + k]);
                    mins += -half_to_float(blk + 16 + 2 * r) * (float)blk[96 + 8 * k + r] * xs[t * runs + 8 * b + k];
                }
            }
            res[t][r] = acc + mins;
        }
}
#endif
