/* Fused dequantize-and-multiply kernels for slm's quantized linear layers.
 *
 * Loaded with ctypes (slm/model/kernels_native.py); the module init below exists only so
 * that setuptools can build and place this file like any extension. Every function here is
 * plain C over caller-owned buffers: no Python objects, no allocation that outlives a call.
 *
 * slm_matmul: out[t, r] = x[t] . dequant(row r) (+ a low-rank term) for up to SLM_MAX_JOBS
 * weights that share the input x (q, k and v; gate and up) in ONE parallel region, so a
 * decode step pays for fewer thread wake-ups. No float32 weight matrix is ever built: rows of
 * the GGML block types (Q4_0 ... Q8_0, Q2_K ... Q6_K) are dotted block by block straight from
 * their bytes, one loop per type from two per-type pieces (block_scales, block_codes); NF4 rows
 * (a table lookup per value) are decoded into a small per-thread buffer first. The LoRA
 * overlays of a weight are added in the same parallel region, over the rows each thread just
 * wrote.
 *
 * slm_dequantize: rows [start, stop) of one weight into a float32 buffer (the long-batch path,
 * where BLAS on a dequantized chunk wins), from the same two pieces.
 *
 * Types are GGML's type ids; the block layouts are ggml's (ggml-common.h, summarised at
 * BLOCK_TYPES below) and slm/quant's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

/* The number of threads a parallel region uses here. */
int slm_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Parallel regions started from the calling thread use n threads from now on. */
void slm_set_threads(int n) {
#ifdef _OPENMP
    if (n >= 1) omp_set_num_threads(n);
#else
    (void)n;
#endif
}

static inline int thread_count(void) {
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

static inline int thread_index(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* Storage types by their GGML type ids (ggml.h's enum ggml_type), so that a GGUF tensor's type
 * passes through unchanged. NF4 has no GGML id: it takes one past GGML's range. */
enum {
    T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
    T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14,
    T_NF4 = 1024
};
#define SLM_MAX_JOBS 4
#define SLM_MAX_COLS 65536

/* The GGML block types (ggml-common.h), values being d * q (+ m) with one scale d (and min m)
 * per unit of 16 or 32 values, q a small integer:
 *
 *   type  bytes  layout                                 unit  q
 *   Q4_0    18   d, qs[16]                                32  nibble - 8
 *   Q4_1    20   d, m, qs[16]                             32  nibble
 *   Q5_0    22   d, qh[4], qs[16]                         32  (nibble | qh bit << 4) - 16
 *   Q5_1    24   d, m, qh[4], qs[16]                      32  nibble | qh bit << 4
 *   Q8_0    34   d, qs[32] (int8)                         32  qs
 *   Q2_K    84   scales[16], qs[64], d, dmin              16  2 bits
 *   Q3_K   110   hmask[32], qs[64], scales[12], d         16  (2 bits | hmask bit << 2) - 4
 *   Q4_K   144   d, dmin, scales[12], qs[128]             32  nibble
 *   Q5_K   176   d, dmin, scales[12], qh[32], qs[128]     32  nibble | qh bit << 4
 *   Q6_K   210   ql[128], qh[64], scales[16] (int8), d    16  (nibble | 2 bits << 4) - 32
 *
 * d, m, dmin are float16. In the 32-value blocks byte j of qs holds value j in its low nibble
 * and value j + 16 in its high one, and bit j of qh (little-endian) is value j's fifth bit.
 * Where the bits of the K types' values and scales sit: block_codes and block_scales.
 * X(type, values per block, bytes per block, values per unit, has a min): */
#define BLOCK_TYPES(X)                                                                          \
    X(T_Q4_0, 32, 18, 32, 0) X(T_Q4_1, 32, 20, 32, 1) X(T_Q5_0, 32, 22, 32, 0)                   \
    X(T_Q5_1, 32, 24, 32, 1) X(T_Q8_0, 32, 34, 32, 0) X(T_Q2_K, 256, 84, 16, 1)                  \
    X(T_Q3_K, 256, 110, 16, 0) X(T_Q4_K, 256, 144, 32, 1) X(T_Q5_K, 256, 176, 32, 1)            \
    X(T_Q6_K, 256, 210, 16, 0)

typedef struct {
    int values, bytes, unit, has_min;
} block_type;

/* (all zero for a type the kernels lack) */
static inline block_type type_info(const int type) {
    switch (type) {
#define INFO(T, V, B, U, M) case T: return (block_type){V, B, U, M};
    BLOCK_TYPES(INFO)
#undef INFO
    case T_NF4: return (block_type){64, 36, 64, 0};
    }
    return (block_type){0, 0, 0, 0};
}

/* Values and bytes per block of a type; -1 when these kernels do not have it. */
int slm_block_size(int type, int64_t *values, int64_t *bytes) {
    const block_type t = type_info(type);
    *values = t.values;
    *bytes = t.bytes;
    return t.values > 0 ? 0 : -1;
}

static const float NF4_LEVELS[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

/* IEEE half -> float, exact for every value (normals, subnormals, inf, NaN): one instruction
 * where the CPU has F16C, else bit manipulation. */
#ifdef __F16C__
static inline float half_to_float(const uint8_t *p) {
    return _cvtsh_ss((unsigned short)((unsigned)p[0] | ((unsigned)p[1] << 8)));
}
#else
static inline float half_to_float(const uint8_t *p) {
    uint32_t h = (uint32_t)p[0] | ((uint32_t)p[1] << 8);
    uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        exp = 113;
        while (!(mant & 0x400)) { mant <<= 1; exp--; }
        bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
#endif

static inline float read_f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

/* GCC/Clang vector extensions. Floats go in vectors of the CPU's register width (16 lanes with
 * AVX-512, 8 with AVX, else 4): a wider vector type has no machine mode, and GCC (12) then
 * keeps such variables in memory, accumulators included (measured: 4-5x slower on AVX2). Codes
 * are unpacked 16 at a time in byte vectors (one SSE or NEON register). Loads go through
 * memcpy (no alignment). */
#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
#define PER16 (16 / LANES) /* float vectors per 16 values */
typedef float vf __attribute__((vector_size(4 * LANES)));
typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef int8_t i8x16 __attribute__((vector_size(16)));
typedef int16_t i16x16 __attribute__((vector_size(32)));
typedef int32_t i32x16 __attribute__((vector_size(64)));

/* 16 int8 codes as floats, in PER16 vectors: one instruction per step where the CPU has one
 * (GCC's generic lowering of __builtin_convertvector takes widening steps to stay vectorised,
 * a direct i8 -> i32 one becoming 16 scalar ones, and is looser on AVX2 than the intrinsics),
 * else a plain loop the compiler vectorises. */
static inline void codes_to_f32(i8x16 q, vf out[PER16]) {
#if LANES == 16
    out[0] = __builtin_convertvector(__builtin_convertvector(__builtin_convertvector(q, i16x16), i32x16), vf);
#elif defined(__AVX2__)
    out[0] = (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32((__m128i)q));
    out[1] = (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64((__m128i)q, (__m128i)q)));
#else
    int8_t codes[16];
    float f[16];
    memcpy(codes, &q, sizeof codes);
    for (int i = 0; i < 16; i++) f[i] = (float)codes[i];
    memcpy(out, f, sizeof f);
#endif
}

static inline vf load_vf(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline u8x16 load_u8x16(const uint8_t *p) {
    u8x16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float sum_lanes(vf v) {
    float s = 0.0f;
    for (int j = 0; j < LANES; j++) s += v[j];
    return s;
}

/* The scale d[u] and min m[u] of every unit u of one block (m only for the types with one). */
static inline void block_scales(const int type, const uint8_t *restrict blk, float *restrict d,
                                float *restrict m) {
    switch (type) {
    case T_Q4_0:
    case T_Q5_0:
    case T_Q8_0:
        d[0] = half_to_float(blk);
        break;
    case T_Q4_1:
    case T_Q5_1:
        d[0] = half_to_float(blk);
        m[0] = half_to_float(blk + 2);
        break;
    case T_Q2_K: { /* byte u: the unit's scale (low nibble) and min (high), times d and dmin */
        const float dd = half_to_float(blk + 80), dmin = half_to_float(blk + 82);
        for (int u = 0; u < 16; u++) {
            d[u] = dd * (float)(blk[u] & 15);
            m[u] = -(dmin * (float)(blk[u] >> 4));
        }
        break;
    }
    case T_Q3_K: { /* 6-bit scales biased by 32: the low 4 bits of unit u in byte u % 8 (units
                    * 0-7 in the low nibbles, 8-15 in the high), the top 2 in byte 8 + u % 4,
                    * at bit 2 * (u / 4) */
        const uint8_t *s = blk + 96;
        const float dd = half_to_float(blk + 108);
        for (int u = 0; u < 16; u++) {
            const int lo = (s[u % 8] >> (u / 8 * 4)) & 15, hi = (s[8 + u % 4] >> (u / 4 * 2)) & 3;
            d[u] = dd * (float)((lo | hi << 4) - 32);
        }
        break;
    }
    case T_Q4_K:
    case T_Q5_K: { /* 6-bit scales and mins of the 8 units in 12 bytes: units 0-3 in the low 6
                    * bits of bytes 0-3 (scale) and 4-7 (min); units 4-7 in the nibbles of bytes
                    * 8-11 (scale low, min high) with their top 2 bits in the top 2 bits of
                    * bytes 0-3 (scale) and 4-7 (min) */
        const uint8_t *s = blk + 4;
        const float dd = half_to_float(blk), dmin = half_to_float(blk + 2);
        for (int u = 0; u < 8; u++) {
            const int sc = u < 4 ? s[u] & 63 : (s[u + 4] & 15) | (s[u - 4] >> 6) << 4;
            const int mn = u < 4 ? s[u + 4] & 63 : (s[u + 4] >> 4) | (s[u] >> 6) << 4;
            d[u] = dd * (float)sc;
            m[u] = -(dmin * (float)mn);
        }
        break;
    }
    case T_Q6_K: { /* int8 scales */
        const float dd = half_to_float(blk + 208);
        for (int u = 0; u < 16; u++) d[u] = dd * (float)(int8_t)blk[192 + u];
        break;
    }
    }
}

/* Per lane: `set` where v has every bit of `mask`, else `clear` (a code's high bit put in place
 * as a value, offset included: ((v & mask) == mask) compiles to one compare, shifts of bytes
 * to several instructions). */
static inline u8x16 if_bits(u8x16 v, u8x16 mask, uint8_t set, uint8_t clear) {
    const u8x16 on = (u8x16)((v & mask) == mask);
    return (on & set) | (~on & clear);
}

/* Lane i: bit 16g + i of the little-endian bits[0 .. 3] (bits: 16 readable bytes), where the
 * if_bits mask finds it: byte 2g + i / 8 spread to lane i, mask 1 << (i % 8). */
static inline u8x16 spread_bits(const uint8_t *bits, const int g) {
    const u8x16 byte = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    return __builtin_shuffle(load_u8x16(bits), byte + (uint8_t)(2 * g));
}
static const u8x16 LANE_BIT = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};

/* The bits of v moved k places up (k < 0: down) and kept where `mask` is set: a field of each
 * byte moved into place. Shifted as 16-bit lanes (one instruction; x86 has no byte shifts) so
 * bits cross into the neighbouring byte: the mask must drop them. */
typedef uint16_t u16x8 __attribute__((vector_size(16)));
static inline u8x16 field(u8x16 v, const int k, uint8_t mask) {
    const u16x8 w = (u16x8)v;
    return (u8x16)(k >= 0 ? w << k : w >> -k) & mask;
}

/* q of values 16g .. 16g + 15 of one block (value = d * q + m of its unit), in int8. The K
 * types are 256 values in halves of 128 (h = g / 8), each four runs of 32 (s = g / 2 % 4)
 * taken from one 32-byte array at increasing bit offsets; l0 = 16 * (g % 2) is the position in
 * the run. */
static inline i8x16 block_codes(const int type, const uint8_t *restrict blk, const int g) {
    const int h = g / 8, s = g / 2 % 4, l0 = 16 * (g % 2);
    switch (type) {
    case T_Q4_0:
    case T_Q4_1: {
        const u8x16 q = load_u8x16(blk + (type == T_Q4_1 ? 4 : 2)), c = field(q, -4 * g, 15);
        return (i8x16)(type == T_Q4_1 ? c : c - 8);
    }
    case T_Q5_0:
    case T_Q5_1: { /* the fifth bits: bit 16g + i of the little-endian qh; for Q5_0, a clear one
                    * makes q = nibble - 16, in int8 nibble | 0xf0 */
        const uint8_t *qh = blk + (type == T_Q5_1 ? 4 : 2);
        const u8x16 q = load_u8x16(qh + 4);
        return (i8x16)(field(q, -4 * g, 15) | if_bits(spread_bits(qh, g), LANE_BIT, type == T_Q5_1 ? 16 : 0,
                                                      type == T_Q5_1 ? 0 : 0xf0));
    }
    case T_Q8_0:
        return (i8x16)load_u8x16(blk + 2 + 16 * g);
    case T_Q2_K: /* run s: bits 2s of qs[32h ..] */
        return (i8x16)field(load_u8x16(blk + 16 + 32 * h + l0), -2 * s, 3);
    case T_Q3_K: { /* as Q2_K, and bit 4h + s of hmask[0 .. 31]: when clear, q = 2 bits - 4, in
                    * int8 2 bits | 0xfc */
        const u8x16 q = load_u8x16(blk + 32 + 32 * h + l0), hm = load_u8x16(blk + l0);
        return (i8x16)(field(q, -2 * s, 3) | if_bits(hm, (u8x16){} + (uint8_t)(1 << (4 * h + s)), 0, 0xfc));
    }
    case T_Q4_K:
    case T_Q5_K: { /* unit j = g / 2: the low (j even) or high nibbles of qs[32 (j / 2) ..],
                    * and for Q5_K bit j of qh[0 .. 31] */
        const int j = g / 2;
        const u8x16 q = load_u8x16(blk + (type == T_Q5_K ? 48 : 16) + 32 * (j / 2) + l0);
        const u8x16 c = field(q, -4 * (j % 2), 15);
        return (i8x16)(type == T_Q5_K ? c | if_bits(load_u8x16(blk + 16 + l0), (u8x16){} + (uint8_t)(1 << j), 16, 0) : c);
    }
    case T_Q6_K: { /* run s: the low (s < 2) or high nibbles of ql[64h + 32 (s % 2) ..] and bits
                    * 2s of qh[32h ..] */
        const u8x16 ql = load_u8x16(blk + 64 * h + 32 * (s % 2) + l0), qh = load_u8x16(blk + 128 + 32 * h + l0);
        return (i8x16)((field(ql, s < 2 ? 0 : -4, 15) | field(qh, 4 - 2 * s, 0x30)) - 32);
    }
    }
    return (i8x16){0};
}

#define SLM_TILE 4 /* rows of x per dot_rows call (4 measured 0-12% faster at 8 rows than 8, on AVX-512) */

/* x[t] . row for NT <= SLM_TILE rows of x at once, without materialising the row: per unit, d * (q . x_u)
 * + m * sum(x_u), with the sums of x over each unit (xs) computed once per call. Each unit's
 * codes are unpacked once for all NT rows (a batch of decode steps reads and unpacks each
 * block once), and each row's accumulation is the same sequence of operations whatever NT is,
 * so a row's result does not depend on which other rows share the call (tests/test_kernels.py
 * checks it bit for bit). Called with a constant type and NT, so that each gets its own loop,
 * the switches folded away and the accumulators in registers. x rows are n apart, xs rows
 * xs_n apart, out rows out_n apart. */
static inline __attribute__((always_inline)) void dot_rows(const int type, const int NT, const uint8_t *restrict row,
                                                           const int n, const float *restrict x,
                                                           const float *restrict xs, const int64_t xs_n,
                                                           float *restrict out, const int64_t out_n) {
    const block_type bt = type_info(type);
    const int units = bt.values / bt.unit, groups = bt.unit / 16;
    vf acc[SLM_TILE];
    float mins[SLM_TILE];
    for (int t = 0; t < NT; t++) {
        acc[t] = (vf){0};
        mins[t] = 0.0f;
    }
    for (int b = 0; b < n / bt.values; b++) {
        const uint8_t *blk = row + (size_t)b * bt.bytes;
        const float *xb = x + b * bt.values;
        float d[16], m[16];
        block_scales(type, blk, d, m);
#pragma GCC unroll 16
        for (int u = 0; u < units; u++) {
            vf c[2][PER16]; /* the unit's codes: one or two groups of 16 */
#pragma GCC unroll 2
            for (int g = 0; g < groups; g++) codes_to_f32(block_codes(type, blk, u * groups + g), c[g]);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                vf p = {0};
#pragma GCC unroll 2
                for (int g = 0; g < groups; g++)
                    for (int k = 0; k < PER16; k++)
                        p += c[g][k] * load_vf(xb + (int64_t)t * n + 16 * (u * groups + g) + LANES * k);
                acc[t] += d[u] * p;
                if (bt.has_min) mins[t] += m[u] * xs[t * xs_n + b * units + u];
            }
        }
    }
    for (int t = 0; t < NT; t++) out[t * out_n] = sum_lanes(acc[t]) + mins[t];
}

/* The rows of x in tiles of at most SLM_TILE (the accumulators of a tile stay in registers). */
static inline __attribute__((always_inline)) void dot_tiles(const int type, const uint8_t *restrict row, const int n,
                                                            const float *restrict x, const float *restrict xs,
                                                            const int64_t xs_n, const int64_t tokens,
                                                            float *restrict out, const int64_t out_n) {
    int64_t t = 0;
    for (; t + SLM_TILE <= tokens; t += SLM_TILE)
        dot_rows(type, SLM_TILE, row, n, x + t * n, xs + t * xs_n, xs_n, out + t * out_n, out_n);
    switch (tokens - t) {
#define REST(k) case k: dot_rows(type, k, row, n, x + t * n, xs + t * xs_n, xs_n, out + t * out_n, out_n); break;
    REST(1) REST(2) REST(3)
#undef REST
    }
}

/* One row of n values (n a multiple of the block size) into w. */
static inline __attribute__((always_inline)) void decode_blocks(const int type, const uint8_t *restrict row,
                                                                const int n, float *restrict w) {
    const block_type bt = type_info(type);
    for (int b = 0; b < n / bt.values; b++) {
        const uint8_t *blk = row + (size_t)b * bt.bytes;
        float d[16], m[16];
        block_scales(type, blk, d, m);
        for (int g = 0; g < bt.values / 16; g++) {
            const int u = g * 16 / bt.unit;
            vf c[PER16];
            codes_to_f32(block_codes(type, blk, g), c);
            for (int k = 0; k < PER16; k++) {
                vf v = d[u] * c[k];
                if (bt.has_min) v += m[u];
                memcpy(w + b * bt.values + 16 * g + LANES * k, &v, sizeof v);
            }
        }
    }
}

/* NF4: 36 bytes per 64 values: absmax (f32), then pairs with the even element high. A table
 * lookup per value: the kernels decode a row once, then dot it. */
static inline void decode_nf4(const uint8_t *row, int n, float *restrict w) {
    for (int b = 0; b < n / 64; b++) {
        const uint8_t *blk = row + b * 36;
        const float a = read_f32(blk);
        float *restrict o = w + b * 64;
        for (int j = 0; j < 32; j++) {
            o[2 * j] = a * NF4_LEVELS[blk[4 + j] >> 4];
            o[2 * j + 1] = a * NF4_LEVELS[blk[4 + j] & 15];
        }
    }
}

static void decode_row(int type, const uint8_t *row, int n, float *restrict w) {
    switch (type) {
#define DECODE(T, V, B, U, M) case T: decode_blocks(T, row, n, w); break;
    BLOCK_TYPES(DECODE)
#undef DECODE
    case T_NF4: decode_nf4(row, n, w); break;
    }
}

static inline float dot(const float *restrict a, const float *restrict b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Whether rows of n values, row_bytes apart, are whole blocks of a type the kernels have. */
static int valid_rows(int type, int64_t n, int64_t row_bytes) {
    const block_type t = type_info(type);
    return n > 0 && n <= SLM_MAX_COLS && t.values > 0 && n % t.values == 0 && row_bytes == n / t.values * t.bytes;
}

/* One weight to multiply by the shared input, and optionally a low-rank term to add to its
 * output (the sum of the LoRA overlays on that weight, their ranks concatenated). The
 * layout is mirrored by slm/model/kernels_native.py's Job. */
typedef struct {
    int32_t type;          /* T_Q8_0, ... */
    int32_t rank;          /* 0: no low-rank term */
    const uint8_t *data;   /* (rows, row_bytes) */
    int64_t rows, row_bytes;
    float *out;            /* (tokens, rows) */
    const float *lora_a;   /* (rank, n): A */
    const float *lora_bt;  /* (rank, rows): (weight * scale * B)^T */
} slm_job;

/* A low-rank term of one job for one row of x (slm_matmul_rows: each row of a batch brings its
 * own composition's overlays). Mirrored by kernels_native.py's Term. */
typedef struct {
    int32_t rank;          /* 0: none */
    const float *a;        /* (rank, n) */
    const float *bt;       /* (rank, rows) */
} slm_term;

/* The shared body of slm_matmul and slm_matmul_rows: the term of job j for row t is
 * terms[j * job_stride + t * row_stride] (row_stride 0: one term for every row). */
static int matmul_impl(int count, const slm_job *jobs, const slm_term *terms, int64_t job_stride,
                       int64_t row_stride, const float *x, int64_t tokens, int64_t n) {
    if (count < 1 || count > SLM_MAX_JOBS || tokens < 1) return -1;
    int64_t total = 0, first[SLM_MAX_JOBS + 1];
    for (int j = 0; j < count; j++) {
        if (!valid_rows(jobs[j].type, n, jobs[j].row_bytes)) return -1;
        first[j] = total;
        total += jobs[j].rows;
    }
    first[count] = total;
    /* where each (row, job)'s u = A x starts in u (tokens x jobs offsets, then the values) */
    int64_t *u_at = malloc(sizeof(int64_t) * (size_t)(tokens * count + 1));
    if (u_at == NULL) return -2;
    int64_t ranks = 0;
    for (int64_t t = 0; t < tokens; t++)
        for (int j = 0; j < count; j++) {
            const slm_term *term = &terms[j * job_stride + t * row_stride];
            if (term->rank < 0) {
                free(u_at);
                return -1;
            }
            u_at[t * count + j] = ranks;
            ranks += term->rank;
        }
    u_at[tokens * count] = ranks;
    /* per thread: a decoded row (NF4); per token: the sums of x over each 16 and each 32
     * values (the units of the types with a min); then every u = A x */
    const int64_t threads = slm_threads(), sums = n / 16 + n / 32;
    float *scratch = malloc(sizeof(float) * (size_t)(n * threads + tokens * sums + ranks));
    if (scratch == NULL) {
        free(u_at);
        return -2;
    }
    float *xs16 = scratch + n * threads, *xs32 = xs16 + tokens * (n / 16);
    float *u = xs16 + tokens * sums;
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t i = 0; i < n / 16; i++) {
            float s = 0.0f;
            for (int j = 0; j < 16; j++) s += x[t * n + i * 16 + j];
            xs16[t * (n / 16) + i] = s;
            if (i % 2) xs32[t * (n / 32) + i / 2] = xs16[t * (n / 16) + i - 1] + s;
        }
#pragma omp parallel
    {
        const int64_t tid = thread_index(), nth = thread_count();
        /* this thread's share of the u = A x: the A factors are as many bytes as the B factors,
         * too many to stream on one thread */
        const int64_t k0 = ranks * tid / nth, k1 = ranks * (tid + 1) / nth;
        for (int64_t t = 0; t < tokens; t++)
            for (int j = 0; j < count; j++) {
                const slm_term *term = &terms[j * job_stride + t * row_stride];
                const int64_t at = u_at[t * count + j];
                for (int64_t k = 0; k < term->rank; k++)
                    if (at + k >= k0 && at + k < k1) u[at + k] = dot(term->a + k * n, x + t * n, (int)n);
            }
        /* each thread takes one contiguous range of rows (of all jobs), the same in both loops */
        const int64_t i0 = total * tid / nth, i1 = total * (tid + 1) / nth;
        float *w = scratch + (size_t)n * (size_t)tid;
        for (int64_t i = i0; i < i1; i++) {
            int j = 0;
            while (i >= first[j + 1]) j++;
            const slm_job *job = &jobs[j];
            const int64_t r = i - first[j];
            const uint8_t *row = job->data + r * job->row_bytes;
            float *o = job->out + r;
            switch (job->type) {
#define DOT(T, V, B, U, M)                                                                      \
    case T:                                                                                     \
        dot_tiles(T, row, (int)n, x, U == 16 ? xs16 : xs32, n / U, tokens, o, job->rows);       \
        break;
                BLOCK_TYPES(DOT)
#undef DOT
            default: /* NF4 */
                decode_nf4(row, (int)n, w);
                for (int64_t t = 0; t < tokens; t++) o[t * job->rows] = dot(w, x + t * n, (int)n);
            }
        }
        if (ranks > 0) {
#pragma omp barrier
        }
        /* (every u is ready) low-rank terms over the same rows: y[r] += sum_k u[k] B^T[k, r],
         * vectorised across rows (a 16-long dot per row would pay a horizontal sum per row) */
        for (int j = 0; j < count && ranks > 0; j++) {
            const slm_job *job = &jobs[j];
            const int64_t r0 = (i0 > first[j] ? i0 : first[j]) - first[j];
            const int64_t r1 = (i1 < first[j + 1] ? i1 : first[j + 1]) - first[j];
            if (r0 >= r1) continue;
            for (int64_t t = 0; t < tokens; t++) {
                const slm_term *term = &terms[j * job_stride + t * row_stride];
                const float *ut = u + u_at[t * count + j];
                float *restrict o = job->out + t * job->rows;
                for (int64_t k = 0; k < term->rank; k++) {
                    const float uk = ut[k], *b = term->bt + k * job->rows;
                    for (int64_t r = r0; r < r1; r++) o[r] += uk * b[r];
                }
            }
        }
    }
    free(scratch);
    free(u_at);
    return 0;
}

/* out[t, r] = x[t] . dequant(row r) + (A x[t]) . B[r] for every job, in one parallel region.
 * The result does not depend on the number of threads, nor on the other rows of x: each
 * output is computed whole by one thread, in a fixed order.
 * x (tokens, n) float32, C order. Returns 0; -1 when an argument is out of range, -2 when
 * out of memory. */
int slm_matmul(int count, const slm_job *jobs, const float *x, int64_t tokens, int64_t n) {
    if (count < 1 || count > SLM_MAX_JOBS) return -1;
    slm_term terms[SLM_MAX_JOBS];
    for (int j = 0; j < count; j++) terms[j] = (slm_term){jobs[j].rank, jobs[j].lora_a, jobs[j].lora_bt};
    return matmul_impl(count, jobs, terms, 1, 0, x, tokens, n);
}

/* slm_matmul for a batch of rows that each bring their own low-rank terms (the server's
 * decode step: one row per request, each on its own composition of the same base): terms
 * (count, tokens), the term of job j for row t at terms[j * tokens + t]; the jobs' own rank
 * and lora fields are ignored. Row t's result is bit for bit what slm_matmul gives for row t
 * alone with that term. */
int slm_matmul_rows(int count, const slm_job *jobs, const slm_term *terms, const float *x, int64_t tokens,
                    int64_t n) {
    return matmul_impl(count, jobs, terms, tokens, 1, x, tokens, n);
}

/* Rows [start, stop) of one weight into out ((stop - start), n) float32, on the calling
 * thread (the caller runs several of these at once, each feeding its own BLAS call). */
int slm_dequantize(int type, const uint8_t *data, int64_t row_bytes, int64_t start, int64_t stop,
                   int64_t n, float *out) {
    if (!valid_rows(type, n, row_bytes)) return -1;
    for (int64_t r = start; r < stop; r++)
        decode_row(type, data + r * row_bytes, (int)n, out + (r - start) * n);
    return 0;
}


/* ---- the rest of a decode step: small, single-threaded, no thread wake-ups ---------- */

/* out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w; x, out (tokens, n). */
void slm_rms_norm(const float *x, const float *w, float *out, int64_t tokens, int64_t n, float eps) {
    for (int64_t t = 0; t < tokens; t++) {
        const float *xt = x + t * n;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < n; i++) s += xt[i] * xt[i];
        const float r = 1.0f / sqrtf(s / (float)n + eps);
        for (int64_t i = 0; i < n; i++) out[t * n + i] = xt[i] * r * w[i];
    }
}

/* Rotary position embedding: x, out (tokens, heads, hd); cos, sin (tokens, hd/2). The pairs
 * rotated together are (2i, 2i+1) when interleaved (GGUF row order), else (i, i + hd/2). */
void slm_rope(const float *x, float *out, const float *cos_t, const float *sin_t, int64_t tokens,
              int64_t heads, int64_t hd, int interleaved) {
    const int64_t half = hd / 2;
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t h = 0; h < heads; h++) {
            const float *xh = x + (t * heads + h) * hd, *c = cos_t + t * half, *s = sin_t + t * half;
            float *oh = out + (t * heads + h) * hd;
            for (int64_t i = 0; i < half; i++) {
                const int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
                oh[a] = xh[a] * c[i] - xh[b] * s[i];
                oh[b] = xh[b] * c[i] + xh[a] * s[i];
            }
        }
}

/* One query position attending to keys 0..S-1 (grouped-query: head h reads kv head
 * h / (nh / n_kv)). q, out (nh, hd); k, v (S, n_kv, hd). Returns -2 when out of memory. */
int slm_attend_one(const float *q, const float *k, const float *v, float *out, int64_t S,
                   int64_t nh, int64_t n_kv, int64_t hd) {
    float *p = malloc(sizeof(float) * (size_t)(S > 0 ? S : 1));
    if (p == NULL) return -2;
    const float scale = 1.0f / sqrtf((float)hd);
    const int64_t group = nh / n_kv;
    for (int64_t h = 0; h < nh; h++) {
        const float *qh = q + h * hd;
        const int64_t kv = h / group;
        float top = -INFINITY;
        for (int64_t s = 0; s < S; s++) {
            p[s] = dot(qh, k + (s * n_kv + kv) * hd, (int)hd) * scale;
            top = p[s] > top ? p[s] : top;
        }
        float total = 0.0f;
        for (int64_t s = 0; s < S; s++) {
            p[s] = expf(p[s] - top);
            total += p[s];
        }
        float *oh = out + h * hd;
        for (int64_t d = 0; d < hd; d++) oh[d] = 0.0f;
        for (int64_t s = 0; s < S; s++) {
            const float ps = p[s] / total, *vs = v + (s * n_kv + kv) * hd;
            for (int64_t d = 0; d < hd; d++) oh[d] += ps * vs[d];
        }
    }
    free(p);
    return 0;
}

/* out = silu(gate) * up = gate / (1 + exp(-gate)) * up, n values. */
void slm_swiglu(const float *gate, const float *up, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_qkernels",
                                    "C kernels, called through ctypes.", -1, NULL};

PyMODINIT_FUNC PyInit__qkernels(void) { return PyModule_Create(&module); }
