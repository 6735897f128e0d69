/* qkernels/attention.c: attention over a cache of float32 keys and values.
 *
 * slm_attend_causal: a prompt's queries, in tiles of query rows that share their keys (the
 * prefill, kernels_native.py: on its own two threads, or on the OpenMP team with
 * slm_attend_causal_team). slm_attend_one: one position's query
 * (the op-by-op decode), through attend_range (a range of its heads, a kv group at a time in
 * attend_heads), which step.c's fused step calls for its share of the heads. Grouped-query
 * attention, sliding windows and the softmax (a vector at a time, exp_vf) are handled here.
 *
 * Part of the unity build: _qkernels.c includes this file once, in dependency order; it is not
 * compiled on its own.
 */
#include "simd.h"
#include "vec.h"

/* ---- a prompt's attention, in tiles ----------------------------------------------------
 *
 * A decode step's single query reads each key once whatever is done (attend_heads). A prompt's
 * queries read the same keys many times over, so here the work unit is a TILE: up to
 * ATT_ROWS query rows that read the same keys and values, namely the heads of one kv group
 * (grouped-query attention) at up to ATT_POSITIONS consecutive positions. Per tile:
 *
 *   scores  S (rows, keys) = Q K^T * scale   from the keys transposed once per call (keys
 *                                            in the lanes): 4 rows x 3 vectors of keys per
 *                                            register block, each key vector loaded once for
 *                                            4 rows, no sums across lanes
 *   softmax per row over its own keys        (the tile's keys run from its first row's window
 *                                            start to its last row's position: a row's other
 *                                            keys get weight 0), exp a vector at a time
 *   out     (rows, hd) = P V                 4 rows x 3 vectors of hd per register block: each
 *                                            value vector loaded once for 4 rows
 *
 * The masked keys outside the tile's range are never computed; inside it at most
 * ATT_POSITIONS - 1 per row are (and weigh 0). One call computes every parts-th tile, with no
 * parallel region of its own: in the float32 mode the prefill runs its parts on its own two
 * threads (kernels_native.py), as it does its BLAS products, so that no OpenMP thread spins on
 * a core while they work; in the int8 mode, whose prompt products run on the OpenMP team,
 * slm_attend_causal_team runs them on that team. */

#define ATT_ROWS 16
#define ATT_POSITIONS 4

/* The tiles' one register block, 4 rows x 3 vectors: out[i][at .. at + 3 LANES) =
 * sum_k a[i][k] b_k, b_k the 3 LANES floats at b + k * b_stride: each b vector loaded once for
 * the 4 rows, each a value broadcast once for the 3 vectors (12 accumulators, 3 b vectors and
 * a broadcast: 16 registers with AVX2), no sums across lanes. The scores are this over the
 * head's values with b the keys transposed (keys in the lanes); P V is this over the keys
 * with b the values. */
static inline void block_4x3(const float *const a[4], const float *b, int64_t b_stride, int64_t K,
                             float *const out[4], int64_t at) {
    vf c00 = {0}, c01 = {0}, c02 = {0}, c10 = {0}, c11 = {0}, c12 = {0};
    vf c20 = {0}, c21 = {0}, c22 = {0}, c30 = {0}, c31 = {0}, c32 = {0};
    for (int64_t k = 0; k < K; k++) {
        const float *bk = b + k * b_stride;
        const vf b0 = load_vf(bk), b1 = load_vf(bk + LANES), b2 = load_vf(bk + 2 * LANES);
        float w = a[0][k];
        c00 += w * b0, c01 += w * b1, c02 += w * b2;
        w = a[1][k];
        c10 += w * b0, c11 += w * b1, c12 += w * b2;
        w = a[2][k];
        c20 += w * b0, c21 += w * b1, c22 += w * b2;
        w = a[3][k];
        c30 += w * b0, c31 += w * b1, c32 += w * b2;
    }
    const vf acc[4][3] = {{c00, c01, c02}, {c10, c11, c12}, {c20, c21, c22}, {c30, c31, c32}};
    for (int i = 0; i < 4; i++) memcpy(out[i] + at, acc[i], sizeof acc[i]);
}

/* out[i] = sum_s p[i][s] v[s] for 4 rows over S values (value s at v + s * stride), 3 vectors
 * of hd at a time, then one, then lane by lane. */
static inline void weigh_block(const float *const p[4], const float *v, int64_t stride, int64_t S, int64_t hd,
                               float *const out[4]) {
    int64_t d = 0;
    for (; d + 3 * LANES <= hd; d += 3 * LANES) block_4x3(p, v + d, stride, S, out, d);
    for (; d + LANES <= hd; d += LANES) {
        vf c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0};
        for (int64_t s = 0; s < S; s++) {
            const vf v0 = load_vf(v + s * stride + d);
            c0 += p[0][s] * v0, c1 += p[1][s] * v0, c2 += p[2][s] * v0, c3 += p[3][s] * v0;
        }
        memcpy(out[0] + d, &c0, sizeof c0), memcpy(out[1] + d, &c1, sizeof c1);
        memcpy(out[2] + d, &c2, sizeof c2), memcpy(out[3] + d, &c3, sizeof c3);
    }
    for (; d < hd; d++)
        for (int i = 0; i < 4; i++) {
            float a = 0.0f;
            for (int64_t s = 0; s < S; s++) a += p[i][s] * v[s * stride + d];
            out[i][d] = a;
        }
}

/* p[lo, hi) = softmax(p[lo, hi) * scale), the rest of p[0, S) = 0: a vector at a time, the
 * top and the total as lane-wise maxima and sums (then across the lanes, in sum_lanes' fixed
 * order), the last (hi - lo) % LANES scores in one more vector. Its scalar loops (each a
 * chain of S dependent compares or adds) and a tail of one exp_vf a score cost a
 * noticeable part of an attention, growing with the keys. */
static void softmax_range(float *p, int64_t S, int64_t lo, int64_t hi, float scale) {
    const int64_t whole = lo + (hi - lo) / LANES * LANES, tail = hi - whole;
    vf last = (vf){0} - INFINITY; /* the tail in the low lanes, -inf above: e^-inf adds 0 */
    memcpy(&last, p + whole, sizeof(float) * (size_t)tail);
    last *= scale;
    vf tops = last;
    for (int64_t s = lo; s < whole; s += LANES) {
        const vf x = load_vf(p + s) * scale;
        memcpy(p + s, &x, sizeof x);
        const vi above = x > tops;
        tops = (vf)(((vi)x & above) | ((vi)tops & ~above));
    }
    float top = tops[0];
    for (int j = 1; j < LANES; j++) top = tops[j] > top ? tops[j] : top;
    vf totals = exp_vf(last - top);
    memcpy(p + whole, &totals, sizeof(float) * (size_t)tail);
    for (int64_t s = lo; s < whole; s += LANES) {
        const vf e = exp_vf(load_vf(p + s) - top);
        memcpy(p + s, &e, sizeof e);
        totals += e;
    }
    const float inv = 1.0f / sum_lanes(totals);
    for (int64_t s = lo; s < whole; s += LANES) {
        const vf x = load_vf(p + s) * inv;
        memcpy(p + s, &x, sizeof x);
    }
    for (int64_t s = whole; s < hi; s++) p[s] *= inv;
    for (int64_t s = 0; s < lo; s++) p[s] = 0.0f;
    for (int64_t s = hi; s < S; s++) p[s] = 0.0f;
}

/* ---- a decode step's attention ---------------------------------------------------------
 *
 * One query position: each key is read once whatever is done, so the unit is the heads of one
 * kv group, up to four: their scores sixteen keys at a time (score_keys), their softmaxes a
 * vector at a time (exp_vf), their weighted values in weigh_block's register blocks (each value
 * vector loaded once for the four). A head's result is the same operations whichever heads
 * share its call (the step splits a group between its threads when the batch is small). */

/* p[s] = q . key s for the S keys at k + s * stride, q and each key hd floats: with AVX-512 and
 * whole vectors per key, sixteen keys at a time (one accumulator a key over the head's vectors,
 * then lane_sums16; the last keys padded with repeats of the last one), else as dots does. */
static inline void score_keys(const float *restrict q, const float *restrict k, const int64_t stride,
                              const int64_t S, const int64_t hd, float *restrict p) {
    int64_t s = 0;
#if LANES == 16
    if (hd % LANES == 0)
        for (; s < S; s += 16) {
            const float *key[16];
            vf acc[16];
            for (int j = 0; j < 16; j++) key[j] = k + (s + j < S ? s + j : S - 1) * stride;
            /* the keys side by side over the head's vectors: sixteen independent sums (one key's
             * four dependent FMAs waited on each other) */
            const vf q0 = load_vf(q);
            for (int j = 0; j < 16; j++) acc[j] = q0 * load_vf(key[j]);
            for (int64_t d = LANES; d < hd; d += LANES) {
                const vf qd = load_vf(q + d);
                for (int j = 0; j < 16; j++) acc[j] += qd * load_vf(key[j] + d);
            }
            __m512 a[16];
            memcpy(a, acc, sizeof a);
            const vf sums = lane_sums16(a);
            memcpy(p + s, &sums, sizeof(float) * (size_t)(S - s < 16 ? S - s : 16));
        }
#endif
    if (s < S) dots(q, k + s * stride, stride, S - s, hd, p + s);
}

/* weigh_block for three rows (a kv group of three heads, as SmolLM2 has): 3 rows x 4 vectors of hd
 * a register block, no fourth row computed for nothing; each output the same sum over s in the
 * same order as weigh_block's, so the same bits. */
static inline void weigh_three(float *const p[4], const float *v, int64_t stride, int64_t S, int64_t hd,
                               float *const out[4]) {
    int64_t d = 0;
    for (; d + 4 * LANES <= hd; d += 4 * LANES) {
        vf c[3][4];
        memset(c, 0, sizeof c);
        for (int64_t s = 0; s < S; s++) {
            const float *vs = v + s * stride + d;
            const vf v0 = in_register(load_vf(vs)), v1 = in_register(load_vf(vs + LANES)),
                     v2 = in_register(load_vf(vs + 2 * LANES)), v3 = in_register(load_vf(vs + 3 * LANES));
            for (int i = 0; i < 3; i++) {
                const float w = p[i][s];
                c[i][0] += w * v0, c[i][1] += w * v1, c[i][2] += w * v2, c[i][3] += w * v3;
            }
        }
        for (int i = 0; i < 3; i++) memcpy(out[i] + d, c[i], sizeof c[i]);
    }
    if (d < hd) { /* the rest of hd as weigh_block does it (its fourth row into the sink) */
        const float *const pr[4] = {p[0], p[1], p[2], p[2]};
        float *const rest[4] = {out[0] + d, out[1] + d, out[2] + d, out[3] + d};
        weigh_block(pr, v + d, stride, S, hd - d, rest);
    }
}

/* Heads 0 .. count - 1 (1 <= count <= 4) of q (count, hd), all of kv head kv, attending to
 * the S keys of k, v (S, n_kv, hd); out (count, hd); p: 4 S + hd floats of scratch. */
__attribute__((noinline)) static void attend_heads(const float *restrict q, const float *restrict k,
                                                   const float *restrict v, float *restrict out, const int64_t count,
                                                   const int64_t S, const int64_t n_kv, const int64_t hd,
                                                   const int64_t kv, float *restrict p) {
    const int64_t stride = n_kv * hd;
    const float *qr[4];
    float *pr[4], *orow[4];
    for (int64_t i = 0; i < 4; i++) { /* rows past count repeat the last one's scores into a sink */
        const int64_t r = i < count ? i : count - 1;
        qr[i] = q + r * hd;
        pr[i] = p + r * S;
        orow[i] = i < count ? out + i * hd : p + 4 * S;
    }
    for (int64_t i = 0; i < count; i++) score_keys(qr[i], k + kv * hd, stride, S, hd, pr[i]);
    for (int64_t i = 0; i < count; i++) softmax_range(pr[i], S, 0, S, 1.0f / sqrtf((float)hd));
    if (count == 3)
        weigh_three(pr, v + kv * hd, stride, S, hd, orow);
    else
        weigh_block((const float *const *)pr, v + kv * hd, stride, S, hd, orow);
}

/* Query rows [i0, i1) of the (nh) heads of one position attending to keys 0 .. S - 1
 * (grouped-query: head h reads kv head h / (nh / n_kv)), in calls of up to four heads of one
 * group. q, out (nh, hd); k, v (S, n_kv, hd); p: 4 S + hd floats of scratch. */
static void attend_range(const float *q, const float *k, const float *v, float *out, int64_t S, int64_t nh,
                         int64_t n_kv, int64_t hd, int64_t i0, int64_t i1, float *p) {
    const int64_t group = nh / n_kv;
    for (int64_t h = i0; h < i1;) {
        const int64_t kv = h / group, end = (kv + 1) * group < i1 ? (kv + 1) * group : i1;
        const int64_t count = end - h < 4 ? end - h : 4;
        attend_heads(q + h * hd, k, v, out + h * hd, count, S, n_kv, hd, kv, p);
        h += count;
    }
}

/* One query position attending to keys 0..S-1. q, out (nh, hd); k, v (S, n_kv, hd). Returns
 * -2 when out of memory. */
int slm_attend_one(const float *q, const float *k, const float *v, float *out, int64_t S,
                   int64_t nh, int64_t n_kv, int64_t hd) {
    float *p = malloc(sizeof(float) * (size_t)(4 * S + hd));
    if (p == NULL) return -2;
    attend_range(q, k, v, out, S, nh, n_kv, hd, 0, nh, p);
    free(p);
    return 0;
}

/* Causal attention of T query positions first .. first + T - 1 (a prompt): query t sees keys
 * lo .. first + t, lo = first + t - window + 1 with a window (0: from key 0). q, out (T, nh,
 * hd); k, v (first + T, n_kv, hd). Writes the rows of the tiles u = part, part + parts, ...
 * (latest positions first). Returns -2 when out of memory. */
int slm_attend_causal(const float *q, const float *k, const float *v, float *out, int64_t T, int64_t first,
                      int64_t window, int64_t nh, int64_t n_kv, int64_t hd, int64_t part, int64_t parts) {
    const int64_t group = nh / n_kv, keys = first + T;
    const int64_t heads = group < ATT_ROWS ? group : ATT_ROWS;          /* heads per tile */
    const int64_t chunks = (group + heads - 1) / heads;                  /* tiles per group and positions */
    const int64_t per = ATT_ROWS / heads < ATT_POSITIONS ? ATT_ROWS / heads : ATT_POSITIONS;
    const int64_t spans = (T + per - 1) / per, units = n_kv * chunks * spans;
    const int64_t wide = 3 * LANES, ld = (keys + wide - 1) / wide * wide; /* a key row, padded */
    const int64_t S_max = (window && window + per - 1 < keys ? window + per - 1 : keys) + 2 * wide;
    const int64_t rows_max = ATT_ROWS + 3, stride = n_kv * hd; /* (rows padded to a multiple of 4) */
    const float scale = 1.0f / sqrtf((float)hd);
    float *kt = malloc(sizeof(float) * (size_t)(n_kv * hd * ld + rows_max * S_max + hd));
    if (kt == NULL) return -2;
    float *p = kt + n_kv * hd * ld, *sink = p + rows_max * S_max;
    /* every kv head's keys transposed: kt[g] (hd, ld), the padding keys 0 */
    for (int64_t gd = 0; gd < n_kv * hd; gd++) {
        const int64_t g = gd / hd, d = gd % hd;
        float *row = kt + gd * ld;
        for (int64_t s = 0; s < keys; s++) row[s] = k[s * stride + g * hd + d];
        for (int64_t s = keys; s < ld; s++) row[s] = 0.0f;
    }
    for (int64_t u = part; u < units; u += parts) {
        const int64_t span = spans - 1 - u % spans, rest = u / spans; /* latest positions first */
        const int64_t g = rest / chunks, h0 = g * group + rest % chunks * heads;
        const int64_t h1 = h0 + heads < (g + 1) * group ? h0 + heads : (g + 1) * group;
        const int64_t t0 = span * per, t1 = t0 + per < T ? t0 + per : T;
        const int64_t last = first + t1 - 1;
        const int64_t lo = window && first + t0 - window + 1 > 0 ? first + t0 - window + 1 : 0;
        const int64_t S = last + 1 - lo, rows = (t1 - t0) * (h1 - h0), padded = (rows + 3) / 4 * 4;
        const float *qrow[ATT_ROWS + 3];
        float *prow[ATT_ROWS + 3], *orow[ATT_ROWS + 3];
        for (int64_t i = 0; i < padded; i++) {
            const int64_t r = i < rows ? i : rows - 1, t = t0 + r / (h1 - h0), h = h0 + r % (h1 - h0);
            qrow[i] = q + (t * nh + h) * hd;
            prow[i] = p + i * S_max;
            orow[i] = i < rows ? out + (t * nh + h) * hd : sink;
        }
        /* scores from key lo on, in blocks that start at a multiple of 3 LANES: the keys
         * before lo in the first block are scored too and weigh 0 */
        const int64_t base = lo / wide * wide, skip = lo - base;
        const float *ktg = kt + g * hd * ld;
        for (int64_t i = 0; i < padded; i += 4)
            for (int64_t s = 0; s < skip + S; s += wide) block_4x3(qrow + i, ktg + base + s, ld, hd, prow + i, s);
        for (int64_t i = 0; i < padded; i++) {
            const int64_t pos = first + t0 + (i < rows ? i : rows - 1) / (h1 - h0);
            const int64_t from = window && pos - window + 1 > lo ? pos - window + 1 : lo;
            softmax_range(prow[i] + skip, S, from - lo, pos + 1 - lo, scale);
        }
        const float *vg = v + lo * stride + g * hd;
        for (int64_t i = 0; i < padded; i += 4) {
            const float *pr[4] = {prow[i] + skip, prow[i + 1] + skip, prow[i + 2] + skip, prow[i + 3] + skip};
            weigh_block(pr, vg, stride, S, hd, orow + i);
        }
    }
    free(kt);
    return 0;
}

/* slm_attend_causal on the kernels' OpenMP team, each thread its share of the tiles (the same
 * tiles, so the same bits, as any split): for a prompt whose products run on that team (the
 * int8 mode), whose threads would otherwise spin beside the prefill's own two threads while
 * they attend. Returns -2 when out of memory. */
int slm_attend_causal_team(const float *q, const float *k, const float *v, float *out, int64_t T, int64_t first,
                           int64_t window, int64_t nh, int64_t n_kv, int64_t hd) {
    int status = 0;
#pragma omp parallel SLM_TEAM_IF
    {
        const int mine = slm_attend_causal(q, k, v, out, T, first, window, nh, n_kv, hd, thread_index(), thread_count());
        if (mine != 0) {
#pragma omp atomic write
            status = mine;
        }
    }
    return status;
}
