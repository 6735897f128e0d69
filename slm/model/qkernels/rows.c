/* qkernels/rows.c: products of one weight, float path.
 *
 * dot_tile multiplies R rows of a quantized weight by up to SLM_FTILE rows of x in registers,
 * straight from the blocks' bytes (block_scales, block_codes); dot_weight_rows runs rows
 * [r0, r1) of one weight against every row of x through one compiled function per (type,
 * rows of x). Called by matmul.c's block_rows for each thread's share of a product.
 *
 * Part of the unity build: _qkernels.c includes this file once, in dependency order; it is not
 * compiled on its own.
 */
#include "simd.h"
#include "vec.h"
#include "blocks.h"

/* A tile of the float path: R weight rows by NT rows of x, one accumulator each, in registers
 * (AVX-512 has 32 vector registers, AVX 16): NT up to SLM_FTILE, R = rows_per_tile(NT). */
#define SLM_FTILE (LANES == 16 ? 8 : 4)
#define SLM_RTILE 4
static inline int rows_per_tile(const int NT) { return LANES == 16 ? (NT <= 4 ? 4 : 2) : (NT <= 2 ? 2 : 1); }

/* x[t] . row r for R weight rows (row_bytes apart) and NT rows of x (n apart) at once, without
 * materialising the rows: per 16 weights, each row's codes decoded once to floats (d * q + m,
 * one rounding), then one fused multiply-add per row of x (each x vector loaded once for the R
 * weight rows). Each output is one accumulator taking the same sequence of operations whatever
 * tile computes it, so it does not depend on which other rows of x or of the weight share the
 * call, nor on the thread count (tests/test_kernels.py checks it bit for bit). Called with a
 * constant type, R and NT, so that each gets its own loop, the switches folded away and the
 * accumulators in registers. out[t * out_n + r]. */
static inline __attribute__((always_inline)) void dot_tile(const int type, const int R, const int NT,
                                                           const uint8_t *restrict rows, const int64_t row_bytes,
                                                           const int n, const float *restrict x,
                                                           float *restrict out, const int64_t out_n) {
    const block_type bt = type_info(type);
    const int units = bt.values / bt.unit, groups = bt.unit / 16;
    vf acc[SLM_RTILE][SLM_FTILE];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = (vf){0};
    /* the next tile's rows fetched while this one runs, a few lines a block: the R rows read
     * side by side are R short streams the hardware prefetcher does not follow (a large output
     * head runs several times slower without) */
    const int blocks = n / bt.values;
    const char *ahead = (const char *)rows + R * row_bytes;
    const int lines = (int)((R * row_bytes + 63) / 64 / blocks + 1);
    for (int b = 0; b < blocks; b++) {
        const float *xb = x + b * bt.values;
        for (int l = 0; l < lines; l++, ahead += 64) __builtin_prefetch(ahead, 0, 3);
        float d[SLM_RTILE][16], m[SLM_RTILE][16];
        for (int r = 0; r < R; r++) block_scales(type, rows + r * row_bytes + (size_t)b * bt.bytes, d[r], m[r]);
#pragma GCC unroll 16
        for (int u = 0; u < units; u++) {
#pragma GCC unroll 2
            for (int g = 0; g < groups; g++) {
                const int at = 16 * (u * groups + g);
                vf w[SLM_RTILE][PER16];
                for (int r = 0; r < R; r++) {
                    const uint8_t *blk = rows + r * row_bytes + (size_t)b * bt.bytes;
#if LANES == 16
                    if (NIBBLE_TYPE(type)) {
                        w[r][0] = nibble_weights(type, blk, u * groups + g, d[r][u], m[r][u]);
                        continue;
                    }
#endif
                    codes_to_f32(block_codes(type, blk, u * groups + g), w[r]);
                    for (int k = 0; k < PER16; k++) w[r][k] = bt.has_min ? w[r][k] * d[r][u] + m[r][u] : w[r][k] * d[r][u];
                }
#pragma GCC unroll 8
                for (int t = 0; t < NT; t++)
                    for (int k = 0; k < PER16; k++) {
                        vf xv = load_vf(xb + (int64_t)t * n + at + LANES * k);
                        if (R > 1) xv = in_register(xv); /* (loaded once for the R rows, not once a row) */
                        for (int r = 0; r < R; r++) acc[r][t] += w[r][k] * xv;
                    }
            }
        }
    }
#if LANES == 16
    if (R * NT >= 12) { /* (R * NT <= 16: rows_per_tile) the sums in one tree, the last padded: sum_lanes' bits */
        __m512 v[16];
        for (int i = 0; i < 16; i++) v[i] = i < R * NT ? (__m512)acc[i / NT][i % NT] : _mm512_setzero_ps();
        float s[16];
        const vf sums = lane_sums16(v);
        memcpy(s, &sums, sizeof s);
        for (int i = 0; i < R * NT; i++) out[i % NT * out_n + i / NT] = s[i];
        return;
    }
#endif
    for (int r = 0; r < R; r++)
        for (int t = 0; t < NT; t++) out[t * out_n + r] = sum_lanes(acc[r][t]);
}

/* Rows [r0, r1) of one weight against every row of x: tiles of rows_per_tile(NT) weight rows
 * by NT <= SLM_FTILE rows of x, the rest of the weight rows one at a time. */
static inline __attribute__((always_inline)) void dot_rows_tokens(const int type, const int NT,
                                                                  const uint8_t *restrict data, const int64_t row_bytes,
                                                                  int64_t r0, const int64_t r1, const int n,
                                                                  const float *restrict x, float *restrict out,
                                                                  const int64_t out_n) {
    const int R = rows_per_tile(NT);
    for (; r0 + R <= r1; r0 += R) dot_tile(type, R, NT, data + r0 * row_bytes, row_bytes, n, x, out + r0, out_n);
    for (; r0 < r1; r0++) dot_tile(type, 1, NT, data + r0 * row_bytes, row_bytes, n, x, out + r0, out_n);
}

/* Each (type, rows of x) its own function, called a chunk of rows at a time: with all of them
 * inlined into the one caller, GCC kept the tiles' pointers and loop bounds on the stack and
 * copied accumulators between registers. */
typedef void rows_tokens_fn(const uint8_t *restrict data, int64_t row_bytes, int64_t r0, int64_t r1, int n,
                            const float *restrict x, float *restrict out, int64_t out_n);
#define ROWS_TOKENS(T, NT)                                                                                 \
    static __attribute__((noinline)) void rows_tokens_##T##_##NT(                                          \
        const uint8_t *restrict data, int64_t row_bytes, int64_t r0, int64_t r1, int n,                    \
        const float *restrict x, float *restrict out, int64_t out_n) {                                      \
        dot_rows_tokens(T, NT, data, row_bytes, r0, r1, n, x, out, out_n);                                  \
    }
#if SLM_FTILE > 4
#define ROWS_TOKENS_ALL(T, V, B, U, M) ROWS_TOKENS(T, 1) ROWS_TOKENS(T, 2) ROWS_TOKENS(T, 3) ROWS_TOKENS(T, 4) \
    ROWS_TOKENS(T, 5) ROWS_TOKENS(T, 6) ROWS_TOKENS(T, 7) ROWS_TOKENS(T, 8)
#define ROWS_TOKENS_LIST(T) {rows_tokens_##T##_1, rows_tokens_##T##_2, rows_tokens_##T##_3, rows_tokens_##T##_4, \
    rows_tokens_##T##_5, rows_tokens_##T##_6, rows_tokens_##T##_7, rows_tokens_##T##_8}
#else
#define ROWS_TOKENS_ALL(T, V, B, U, M) ROWS_TOKENS(T, 1) ROWS_TOKENS(T, 2) ROWS_TOKENS(T, 3) ROWS_TOKENS(T, 4)
#define ROWS_TOKENS_LIST(T) {rows_tokens_##T##_1, rows_tokens_##T##_2, rows_tokens_##T##_3, rows_tokens_##T##_4}
#endif
BLOCK_TYPES(ROWS_TOKENS_ALL)

/* Rows [r0, r1) of one weight against `tokens` rows of x, in tiles of at most SLM_FTILE rows of x. */
static void dot_weight_rows(const int type, const uint8_t *restrict data, const int64_t row_bytes, const int64_t r0,
                            const int64_t r1, const int n, const float *restrict x, const int64_t tokens,
                            float *restrict out, const int64_t out_n) {
    rows_tokens_fn *const *fns = NULL;
    switch (type) {
#define FNS(T, V, B, U, M) case T: { static rows_tokens_fn *const f[SLM_FTILE] = ROWS_TOKENS_LIST(T); fns = f; break; }
    BLOCK_TYPES(FNS)
#undef FNS
    default: return;
    }
    for (int64_t t = 0; t < tokens; t += SLM_FTILE)
        fns[(tokens - t < SLM_FTILE ? tokens - t : SLM_FTILE) - 1](data, row_bytes, r0, r1, n, x + t * n, out + t * out_n, out_n);
}
