/* qkernels/rows_q6kx8.c: Q6_K weights repacked eight rows at a time, int8 path; and the entry
 * points of every packed layout.
 *
 * pack_q6_k builds the layout, dot_group_q6kx8 multiplies one group of eight rows by up to
 * SLM_TILE rows of int8 x, as rows_q4x8.c does for Q4_0 and Q4_K (why: see there). slm_pack
 * and slm_packed_bytes (called by packed_copies.packed) pack a weight of any of these types;
 * PACKED_TYPE says which types have a layout (gemm_packed.c's dot_group_tiles runs a group's
 * kernel over every row of x, for matmul.c's block_rows).
 *
 * Part of the unity build: _qkernels.c includes this file once, in dependency order; it is not
 * compiled on its own.
 */
#include "simd.h"
#include "blocks.h"

#define PACKED_TYPE(type) \
    ((type) == T_Q4_0 || (type) == T_Q4_1 || (type) == T_Q5_0 || (type) == T_Q4_K || (type) == T_Q6_K)

/* A packed super-block: super-block b of the eight rows 8g .. 8g + 7, at (g * supers + b) *
 * Q6KX8_BYTES (as many bytes as the rows' own, 8 x 210):
 *   0     their eight d (float16)
 *   16    the 16 unit scales (int8), unit u's eight rows at 16 + 8u
 *   144   eight runs of 32 values, 192 bytes each: V0..V3, H0, H1 (32 bytes each). Codes are
 *         q + 32, 0..63, in groups of four values (group c: values 4c .. 4c + 3 of the run):
 *         byte 4r + i of Vj holds the low 4 bits of value 4j + i of row r in its low nibble, of
 *         value 4 (j + 4) + i in its high one; bits 2j, 2j + 1 of byte 4r + i of H0 hold the
 *         high 2 bits of value 4j + i, of H1 those of value 4 (j + 4) + i. A run's first unit
 *         (16 values) is then V's low nibbles with H0, its second V's high nibbles with H1. */
#define Q6KX8_BYTES 1680

static void pack_q6_k(const uint8_t *data, int64_t rows, int64_t row_bytes, int64_t n, uint8_t *out) {
    const int64_t supers = n / 256, groups = rows / 8;
#pragma omp parallel for SLM_TEAM_IF schedule(static)
    for (int64_t g = 0; g < groups; g++)
        for (int64_t b = 0; b < supers; b++) {
            uint8_t *o = out + (g * supers + b) * Q6KX8_BYTES;
            uint8_t lo[8][8][32], hi[8][8][32]; /* [run][row][value]: the low 4 and high 2 bits */
            for (int r = 0; r < 8; r++) {
                const uint8_t *blk = data + (8 * g + r) * row_bytes + 210 * b;
                memcpy(o + 2 * r, blk + 208, 2);
                for (int u = 0; u < 16; u++) o[16 + 8 * u + r] = blk[192 + u];
                for (int k = 0; k < 8; k++) { /* run k = 4h + s: Q6_K's bits, see blocks.h, block_codes */
                    const int h = k / 4, s = k % 4;
                    for (int l = 0; l < 32; l++) {
                        lo[k][r][l] = (blk[64 * h + 32 * (s % 2) + l] >> (4 * (s / 2))) & 15;
                        hi[k][r][l] = (blk[128 + 32 * h + l] >> (2 * s)) & 3;
                    }
                }
            }
            for (int k = 0; k < 8; k++) {
                uint8_t *run = o + 144 + 192 * k;
                pack_nibble_run((const uint8_t(*)[32])lo[k], run);
                for (int m = 0; m < 2; m++) /* H_m: groups 4m + c, c = 0..3, at bits 2c */
                    for (int r = 0; r < 8; r++) {
                        uint32_t v = 0;
                        for (int c = 0; c < 4; c++) {
                            uint32_t f;
                            memcpy(&f, hi[k][r] + 4 * (4 * m + c), 4);
                            v |= f << (2 * c);
                        }
                        memcpy(run + 128 + 32 * m + 4 * r, &v, 4);
                    }
            }
        }
}

/* res[t][r] = x[t] . row 8g + r, as dot_group_q4x8 (rows_q4x8.c). Per run of 32 values and row
 * of x: per unit (16 values), two pairs of maddubs of four codes of every row by a broadcast of
 * four x values, each pair summed in 16 bits (at most 2 x 2 x 63 x 127 = 32004), times the
 * unit's scale by madd (exact in 32 bits); minus 32 times sum over the units of scale times the
 * x sum (the codes' offset), one madd of the rows' scale pairs by the two sums; then one
 * multiply-add by d (the eight rows') times dx. */
#if defined(__AVX2__) && defined(__F16C__)
static inline __m256i q6_high(__m256i h, const int c) { /* bits 2c, 2c + 1 of each byte at bits 4, 5 */
    const __m256i at = c == 0 ? _mm256_slli_epi16(h, 4) : c == 1 ? _mm256_slli_epi16(h, 2) : c == 2 ? h
                     : _mm256_srli_epi16(h, 2);
    return _mm256_and_si256(at, _mm256_set1_epi8(0x30));
}

static inline __attribute__((always_inline)) void dot_group_q6kx8(const int NT, const uint8_t *restrict grp, const int n,
                                                                  const int8_t *restrict xq, const float *restrict dx,
                                                                  const int32_t *restrict xi, float res[][8]) {
    const int supers = n / 256, runs = n / 32;
    const __m256i low4 = _mm256_set1_epi8(15);
    __m256 acc[SLM_TILE];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int b = 0; b < supers; b++) {
        const uint8_t *blk = grp + (size_t)b * Q6KX8_BYTES;
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
        _mm_prefetch((const char *)blk + 1024 + 16, _MM_HINT_T0); /* (its scales, as rows_q8.c) */
        _mm_prefetch((const char *)blk + 1024 + 80, _MM_HINT_T0);
        _mm_prefetch((const char *)blk + 1024 + 143, _MM_HINT_T0);
        for (int k = 0; k < 8; k++) {
            const uint8_t *run = blk + 144 + 192 * k;
            for (int o = 0; o < 192; o += 64) _mm_prefetch((const char *)run + 1024 + o, _MM_HINT_T0);
            const __m256i h0 = _mm256_loadu_si256((const __m256i *)(run + 128));
            const __m256i h1 = _mm256_loadu_si256((const __m256i *)(run + 160));
            __m256i w[8];
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(run + 32 * c));
                w[c] = _mm256_or_si256(_mm256_and_si256(v, low4), q6_high(h0, c));
                w[c + 4] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), q6_high(h1, c));
            }
            /* the two units' scales, each row's twice (madd pairs 16-bit lanes 2r, 2r + 1), and
             * the pairs (first unit's, second unit's) per row for the offset */
            const __m128i sc = _mm_loadu_si128((const __m128i *)(blk + 16 + 16 * k));
            const __m256i sa = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sc, sc));
            const __m256i sb = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(sc, sc));
            const __m256i sab = _mm256_blend_epi16(sa, sb, 0xaa);
            const int r = 8 * b + k;
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                int32_t x4[8];
                memcpy(x4, xq + (int64_t)t * n + 32 * r, 32);
                __m256i m[8];
#pragma GCC unroll 8
                for (int c = 0; c < 8; c++) m[c] = _mm256_maddubs_epi16(w[c], _mm256_set1_epi32(x4[c]));
                const __m256i pa = _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(m[0], m[1]), sa),
                                                    _mm256_madd_epi16(_mm256_add_epi16(m[2], m[3]), sa));
                const __m256i pb = _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(m[4], m[5]), sb),
                                                    _mm256_madd_epi16(_mm256_add_epi16(m[6], m[7]), sb));
                const int32_t sxa = xi[t * 2 * runs + 2 * r], sxb = xi[t * 2 * runs + 2 * r + 1];
                const __m256i off = _mm256_madd_epi16(sab, _mm256_set1_epi32((int32_t)((uint32_t)sxb << 16 | (uint16_t)sxa)));
                const __m256i p = _mm256_sub_epi32(_mm256_add_epi32(pa, pb), _mm256_slli_epi32(off, 5));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(d, _mm256_set1_ps(dx[t * runs + r])), acc[t]);
            }
        }
    }
    for (int t = 0; t < NT; t++) _mm256_storeu_ps(res[t], acc[t]);
}
#else
/* the same integers without AVX2 (results differ from the AVX2 build in float rounding only) */
static inline void dot_group_q6kx8(const int NT, const uint8_t *restrict grp, const int n, const int8_t *restrict xq,
                                   const float *restrict dx, const int32_t *restrict xi, float res[][8]) {
    const int supers = n / 256, runs = n / 32;
    for (int t = 0; t < NT; t++)
        for (int r = 0; r < 8; r++) {
            float acc = 0.0f;
            for (int b = 0; b < supers; b++) {
                const uint8_t *blk = grp + (size_t)b * Q6KX8_BYTES;
                for (int k = 0; k < 8; k++) {
                    const uint8_t *run = blk + 144 + 192 * k;
                    int32_t isum = 0;
                    for (int v = 0; v < 32; v++) {
                        const int c = v / 4, i = v % 4;
                        const int lo = (run[32 * (c % 4) + 4 * r + i] >> (4 * (c / 4))) & 15;
                        const int hi = (run[128 + 32 * (c / 4) + 4 * r + i] >> (2 * (c % 4))) & 3;
                        isum += (int8_t)blk[16 + 8 * (2 * k + v / 16) + r] * (lo + 16 * hi - 32) *
                                xq[(int64_t)t * n + 32 * (8 * b + k) + v];
                    }
                    acc += (float)isum * (half_to_float(blk + 2 * r) * dx[t * runs + 8 * b + k]);
                }
            }
            res[t][r] = acc;
        }
    (void)xi;
}
#endif

/* Bytes of one group of eight packed rows of n values. */
static inline int64_t packed_group_bytes(const int type, const int64_t n) {
    switch (type) {
    case T_Q4_0: return Q4X8_BYTES * (n / 32);
    case T_Q4_1: return Q41X8_BYTES * (n / 32);
    case T_Q5_0: return Q5X8_BYTES * (n / 32);
    case T_Q4_K: return Q4KX8_BYTES * (n / 256);
    default: return Q6KX8_BYTES * (n / 256);
    }
}

/* The bytes of the packed layout of rows (a multiple of 8) of a PACKED_TYPE weight, n values
 * each and row_bytes apart; -1 when the type or the shape is not one these layouts take. */
int64_t slm_packed_bytes(int type, int64_t rows, int64_t row_bytes, int64_t n) {
    if (!PACKED_TYPE(type) || !valid_rows(type, n, row_bytes) || rows % 8 != 0 || rows < 8) return -1;
    return rows / 8 * packed_group_bytes(type, n);
}

/* Such rows packed into out (slm_packed_bytes). Returns 0; -1 when refused. */
int slm_pack(int type, const uint8_t *data, int64_t rows, int64_t row_bytes, int64_t n, uint8_t *out) {
    if (slm_packed_bytes(type, rows, row_bytes, n) < 0) return -1;
    switch (type) {
    case T_Q4_0: pack_q4_01(T_Q4_0, data, rows, row_bytes, n, out); break;
    case T_Q4_1: pack_q4_01(T_Q4_1, data, rows, row_bytes, n, out); break;
    case T_Q5_0: pack_q5_0(data, rows, row_bytes, n, out); break;
    case T_Q4_K: pack_q4_k(data, rows, row_bytes, n, out); break;
    default: pack_q6_k(data, rows, row_bytes, n, out);
    }
    return 0;
}
