/* qkernels/low_rank.c: the LoRA terms a product adds to its outputs, y += (A x) B^T.
 *
 * A term's factors (slm_term) come in float32, and for the int8 mode also as A in Q8_0 rows
 * and B^T in halves (slm/model/int8_factors.py): when the product's x is int8 (matmul.c's
 * matmul_plan.xq), u = A x is taken row by row as an int8 block product (rows_q8.c, as for any
 * Q8_0 weight) and B^T read from its halves in tiles of 32 output rows (one contiguous run of
 * memory per tile, where B^T's rank rows were 16 streams), less than half the bytes a decode
 * step otherwise reads cold after the weights. term_u computes part of u, add_low_rank_rows adds u B^T over
 * a thread's output rows; matmul.c's team_matmul schedules both.
 *
 * Part of the unity build: _qkernels.c includes this file once, in dependency order; it is not
 * compiled on its own.
 */
#include "simd.h"
#include "vec.h"
#include "blocks.h"

/* A low-rank term of one job for one row of x (slm_matmul_rows: each row of a batch brings its
 * own composition's overlays). Mirrored by kernels_native.py's Term. */
typedef struct {
    int32_t rank;          /* 0: none */
    const float *a;        /* (rank, n) */
    const float *bt;       /* (rank, rows) */
    /* The same factors for the int8 mode (NULL: none), taken when the product's x is int8 and
     * both are there (term_int8). */
    const uint8_t *a8;     /* (rank, n / 32 * 34) */
    const uint16_t *bt16;  /* (ceil(rows / 32), rank, 32): B^T's columns in tiles of BT_TILE, zero-padded */
} slm_term;

#define BT_TILE 32 /* output rows of a tile of bt16 */

/* Whether a term is computed from its int8 mode's factors in a product whose x is int8 or not
 * (int8_x): the same answer for a term in every product over the same x, batched or not. */
static inline int term_int8(const slm_term *term, const int int8_x) {
    return int8_x && term->a8 != NULL && term->bt16 != NULL;
}

/* Where a term's A starts and the bytes of one of its rows (n values), as a product reads them. */
static inline const char *term_a(const slm_term *term, const int int8_x, const int64_t n, int64_t *row_bytes) {
    *row_bytes = term_int8(term, int8_x) ? n / 32 * 34 : (int64_t)sizeof(float) * n;
    return term_int8(term, int8_x) ? (const char *)term->a8 : (const char *)term->a;
}

/* The bytes of a term's B^T that rank k of output rows [r0, r1) reads, as a product reads them
 * (*bytes 0: none beyond rank 0's, the halves' tiles holding every rank). */
static inline const char *term_bt_span(const slm_term *term, const int int8_x, const int64_t rows, const int64_t k,
                                       const int64_t r0, const int64_t r1, int64_t *bytes) {
    if (!term_int8(term, int8_x)) {
        *bytes = (int64_t)sizeof(float) * (r1 - r0);
        return (const char *)(term->bt + k * rows + r0);
    }
    const int64_t tile_bytes = (int64_t)sizeof(uint16_t) * BT_TILE * term->rank, t0 = r0 / BT_TILE;
    *bytes = k > 0 ? 0 : tile_bytes * ((r1 + BT_TILE - 1) / BT_TILE - t0);
    return (const char *)term->bt16 + t0 * tile_bytes;
}

/* u[k] = A[k] . x for the `size` ranks from k of a term, for one row of x: x's floats, or its
 * int8 codes (xq, xd, xs: that row's, NULL when x is not int8) against A's Q8_0 rows. */
static inline void term_u(const slm_term *term, const float *x, const int8_t *xq, const float *xd, const float *xs,
                          const int64_t n, const int64_t k, const int64_t size, float *u) {
    if (term_int8(term, xq != NULL)) {
        const int64_t row_bytes = n / 32 * 34;
        for (int64_t i = k; i < k + size; i++)
            dot_tiles_q8(T_Q8_0, term->a8 + i * row_bytes, (int)n, xq, xd, xs, 1, u + i, 1);
    } else {
        dots(x, term->a + k * n, n, size, n, u + k);
    }
}

/* LANES floats from halves (exact: a half is a float). */
static inline __attribute__((always_inline)) vf load_halves(const uint16_t *at) {
#if LANES == 16
    return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)at));
#elif LANES == 8 && defined(__F16C__)
    return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)at));
#else
    float f[LANES];
    for (int i = 0; i < LANES; i++) f[i] = half_to_float((const uint8_t *)at + 2 * i);
    return load_vf(f);
#endif
}

/* The rows of x that share one term (a group, led by `first`): row s's u at u + u_at[s * count
 * + j], its output at out + s * rows, the group's next row after s next[s * count + j] (-1: none). */
typedef struct {
    int64_t first, rows;
    int count, j;
    const float *u;
    const int64_t *u_at, *next;
    float *out;
} term_group;

/* Columns [r0, r1) of a group's outputs from B^T's floats: y[s, r] += sum_k u_s[k] B^T[k, r], k
 * ascending. A block of 4 vectors of y stays in registers over all the ranks, and the group's
 * rows take turns over the same block of B^T (in the L1 by then): one load a multiply-add,
 * where y loaded and stored at every rank took three. Each y[s, r] gets the same operations in
 * the same order whatever the block, the group or the thread: the fused multiply-adds spelled
 * out and the last values in a padded vector (GCC contracted the vector loops and not a scalar
 * one in an AVX2 build, and SSE's scalar and vector adds kept different NaNs: a value's bits
 * then depended on where the thread's rows began). */
static void add_rows_of(const slm_term *term, const term_group *g, const int64_t r0, const int64_t r1) {
    const int64_t rank = term->rank, rows = g->rows, count = g->count, j = g->j;
    int64_t r = r0;
    for (; r + 4 * LANES <= r1; r += 4 * LANES)
        for (int64_t s = g->first; s >= 0; s = g->next[s * count + j]) {
            const float *u = g->u + g->u_at[s * count + j], *b = term->bt + r;
            float *o = g->out + s * rows + r;
            vf y0 = load_vf(o), y1 = load_vf(o + LANES), y2 = load_vf(o + 2 * LANES), y3 = load_vf(o + 3 * LANES);
            for (int64_t k = 0; k < rank; k++, b += rows) {
                y0 = fma_vf(u[k], load_vf(b), y0), y1 = fma_vf(u[k], load_vf(b + LANES), y1);
                y2 = fma_vf(u[k], load_vf(b + 2 * LANES), y2), y3 = fma_vf(u[k], load_vf(b + 3 * LANES), y3);
            }
            memcpy(o, &y0, sizeof y0), memcpy(o + LANES, &y1, sizeof y1);
            memcpy(o + 2 * LANES, &y2, sizeof y2), memcpy(o + 3 * LANES, &y3, sizeof y3);
        }
    for (; r + LANES <= r1; r += LANES)
        for (int64_t s = g->first; s >= 0; s = g->next[s * count + j]) {
            const float *u = g->u + g->u_at[s * count + j], *b = term->bt + r;
            float *o = g->out + s * rows + r;
            vf y = load_vf(o);
            for (int64_t k = 0; k < rank; k++, b += rows) y = fma_vf(u[k], load_vf(b), y);
            memcpy(o, &y, sizeof y);
        }
    if (r < r1) /* the last few values in one vector padded with zeros: each through the same instructions */
        for (int64_t s = g->first; s >= 0; s = g->next[s * count + j]) {
            const float *u = g->u + g->u_at[s * count + j];
            const size_t bytes = sizeof(float) * (size_t)(r1 - r);
            float part[LANES] = {0};
            memcpy(part, g->out + s * rows + r, bytes);
            vf y = load_vf(part);
            for (int64_t k = 0; k < rank; k++) {
                memcpy(part, term->bt + k * rows + r, bytes);
                y = fma_vf(u[k], load_vf(part), y);
            }
            memcpy(part, &y, sizeof y);
            memcpy(g->out + s * rows + r, part, bytes);
        }
}

/* add_rows_of over B^T's halves in tiles (bt16): a whole tile's 32 values of y in registers
 * over all the ranks, reading one contiguous run; the part of a tile outside [r0, r1) (a
 * thread's rows begin at multiples of 8) through padded vectors, each value through the same
 * fused multiply-adds in the same order either way. */
static void add_rows_half(const slm_term *term, const term_group *g, const int64_t r0, const int64_t r1) {
    const int64_t rank = term->rank, rows = g->rows, count = g->count, j = g->j;
    for (int64_t r = r0; r < r1;) {
        const int64_t t0 = r / BT_TILE * BT_TILE, end = t0 + BT_TILE < r1 ? t0 + BT_TILE : r1;
        const uint16_t *tile = term->bt16 + t0 * rank; /* (rank, BT_TILE) */
        if (r == t0 && end == t0 + BT_TILE) {
            int64_t s = g->first;
            /* the group's rows two at a time: each half of the tile converted once for both */
            for (int64_t s2; s >= 0 && (s2 = g->next[s * count + j]) >= 0; s = g->next[s2 * count + j]) {
                const float *u = g->u + g->u_at[s * count + j], *u2 = g->u + g->u_at[s2 * count + j];
                float *o = g->out + s * rows + t0, *o2 = g->out + s2 * rows + t0;
                vf y[BT_TILE / LANES], y2[BT_TILE / LANES];
                for (int v = 0; v < BT_TILE / LANES; v++) y[v] = load_vf(o + v * LANES), y2[v] = load_vf(o2 + v * LANES);
                for (int64_t k = 0; k < rank; k++)
                    for (int v = 0; v < BT_TILE / LANES; v++) {
                        const vf b = load_halves(tile + k * BT_TILE + v * LANES);
                        y[v] = fma_vf(u[k], b, y[v]), y2[v] = fma_vf(u2[k], b, y2[v]);
                    }
                memcpy(o, y, sizeof y), memcpy(o2, y2, sizeof y2);
            }
            if (s >= 0) { /* an odd row out: the same operations alone */
                const float *u = g->u + g->u_at[s * count + j];
                float *o = g->out + s * rows + t0;
                vf y[BT_TILE / LANES];
                for (int v = 0; v < BT_TILE / LANES; v++) y[v] = load_vf(o + v * LANES);
                for (int64_t k = 0; k < rank; k++)
                    for (int v = 0; v < BT_TILE / LANES; v++)
                        y[v] = fma_vf(u[k], load_halves(tile + k * BT_TILE + v * LANES), y[v]);
                memcpy(o, y, sizeof y);
            }
        } else {
            for (int64_t c = r; c < end; c += LANES) {
                const size_t left = (size_t)(end - c < LANES ? end - c : LANES);
                for (int64_t s = g->first; s >= 0; s = g->next[s * count + j]) {
                    const float *u = g->u + g->u_at[s * count + j];
                    float part[LANES] = {0}, b[LANES] = {0};
                    memcpy(part, g->out + s * rows + c, sizeof(float) * left);
                    vf y = load_vf(part);
                    for (int64_t k = 0; k < rank; k++) {
                        for (size_t i = 0; i < left; i++)
                            b[i] = half_to_float((const uint8_t *)(tile + k * BT_TILE + (c - t0) + (int64_t)i));
                        y = fma_vf(u[k], load_vf(b), y);
                    }
                    memcpy(part, &y, sizeof y);
                    memcpy(g->out + s * rows + c, part, sizeof(float) * left);
                }
            }
        }
        r = end;
    }
}

static void add_low_rank_rows(const slm_term *term, const int int8_x, const term_group *g, const int64_t r0,
                              const int64_t r1) {
    if (term_int8(term, int8_x))
        add_rows_half(term, g, r0, r1);
    else
        add_rows_of(term, g, r0, r1);
}
