/* qkernels/blocks.h: the block formats, per quant type.
 *
 * The GGML type ids (T_Q4_0 ... T_Q6_K, and T_NF4, slm's own), the table of block sizes
 * (BLOCK_TYPES, type_info; slm_block_size answers kernels_native.py which types the C side
 * has), and per type the two pieces every product is made of: block_scales (the scale and min
 * of each unit of a block) and block_codes (16 of its integer codes at a time), plus
 * nibble_weights (AVX-512: a unit's 16 possible values looked up). decode_row turns a whole
 * row into floats (slm_dequantize, NF4 rows); valid_rows is the shape check of every entry
 * point. A new block type starts here: a BLOCK_TYPES line and its cases in block_scales and
 * block_codes.
 *
 * Part of the unity build: _qkernels.c includes this file once, in dependency order; it is not
 * compiled on its own.
 */
#ifndef SLM_QK_BLOCKS_H
#define SLM_QK_BLOCKS_H

#include "simd.h"

/* Storage types by their GGML type ids (ggml.h's enum ggml_type), so that a GGUF tensor's type
 * passes through unchanged. NF4 has no GGML id: it takes one past GGML's range. */
enum {
    T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
    T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14,
    T_NF4 = 1024
};

#define SLM_MAX_COLS 65536 /* values in the longest row valid_rows accepts */

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

/* Q4_K/Q5_K: the 6-bit scales and mins of the 8 units out of their 12 bytes, byte u of sc and
 * mn for unit u. Units 0-3: the low 6 bits of bytes 0-3 (scale) and 4-7 (min); units 4-7: the
 * nibbles of bytes 8-11 (scale low, min high) with their top 2 bits in the top 2 bits of bytes
 * 0-3 (scale) and 4-7 (min). Four bytes at a time in integer words: unit by unit, GCC
 * vectorised the byte fields through stores to the stack that the loads after them could not
 * forward, a slower Q4_K. */
static inline void k_scales_mins(const uint8_t *s, uint64_t *sc, uint64_t *mn) {
    uint32_t a, b, c;
    memcpy(&a, s, 4);
    memcpy(&b, s + 4, 4);
    memcpy(&c, s + 8, 4);
    const uint32_t low6 = 0x3f3f3f3fu, low4 = 0x0f0f0f0fu, low2 = 0x03030303u; /* per byte */
    *sc = (a & low6) | (uint64_t)((c & low4) | ((a >> 6) & low2) << 4) << 32;
    *mn = (b & low6) | (uint64_t)(((c >> 4) & low4) | ((b >> 6) & low2) << 4) << 32;
}

/* out[i] = f * (byte i of v - bias), i < 8 (bytes little-endian) */
static inline void bytes8_times(uint64_t v, float f, int bias, float *restrict out) {
#if defined(__AVX2__)
    const __m256i q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)v)), _mm256_set1_epi32(bias));
    _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_set1_ps(f), _mm256_cvtepi32_ps(q)));
#else
    for (int i = 0; i < 8; i++) out[i] = f * (float)((int)(uint8_t)(v >> (8 * i)) - bias);
#endif
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
        halves_to_floats(blk, d, m);
        break;
    case T_Q2_K: { /* byte u: the unit's scale (low nibble) and min (high), times d and dmin */
        const float dd = half_to_float(blk + 80), dmin = half_to_float(blk + 82);
#if LANES == 16 /* (GCC vectorises this loop well for AVX-512: faster there than the words below) */
        for (int u = 0; u < 16; u++) {
            d[u] = dd * (float)(blk[u] & 15);
            m[u] = -(dmin * (float)(blk[u] >> 4));
        }
#else /* (for AVX2 it did not: byte fields through the stack, as k_scales_mins says) */
        const uint64_t low4 = 0x0f0f0f0f0f0f0f0full;
        for (int h = 0; h < 2; h++) {
            uint64_t v;
            memcpy(&v, blk + 8 * h, 8);
            bytes8_times(v & low4, dd, 0, d + 8 * h);
            bytes8_times((v >> 4) & low4, -dmin, 0, m + 8 * h); /* (-dmin) * mn = -(dmin * mn) */
        }
#endif
        break;
    }
    case T_Q3_K: { /* 6-bit scales biased by 32: the low 4 bits of unit u in byte u % 8 (units
                    * 0-7 in the low nibbles, 8-15 in the high), the top 2 in byte 8 + u % 4,
                    * at bit 2 * (u / 4) */
        uint64_t lo;
        uint32_t hi;
        memcpy(&lo, blk + 96, 8);
        memcpy(&hi, blk + 104, 4);
        const uint64_t low4 = 0x0f0f0f0f0f0f0f0full;
        const uint32_t low2 = 0x03030303u;
        const float dd = half_to_float(blk + 108);
        /* (byte fields in integer words, as k_scales_mins and for the same reason) */
        bytes8_times((lo & low4) | ((hi & low2) | (uint64_t)((hi >> 2) & low2) << 32) << 4, dd, 32, d);
        bytes8_times(((lo >> 4) & low4) | (((hi >> 4) & low2) | (uint64_t)((hi >> 6) & low2) << 32) << 4, dd, 32, d + 8);
        break;
    }
    case T_Q4_K:
    case T_Q5_K: {
        uint64_t sc, mn;
        k_scales_mins(blk + 4, &sc, &mn);
        bytes8_times(sc, half_to_float(blk), 0, d);
        bytes8_times(mn, -half_to_float(blk + 2), 0, m); /* (-dmin) * mn = -(dmin * mn), bit for bit */
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
#if defined(__AVX512BW__) && defined(__AVX512VL__) /* (every mask here has one bit a lane) */
    return (u8x16)_mm_mask_blend_epi8(_mm_test_epi8_mask((__m128i)v, (__m128i)mask), _mm_set1_epi8((char)clear),
                                      _mm_set1_epi8((char)set));
#else
    const u8x16 on = (u8x16)((v & mask) == mask);
    return (on & set) | (~on & clear);
#endif
}

/* Lane i: bit 16g + i of the little-endian bits[0 .. 3] (bits: 16 readable bytes), where the
 * if_bits mask finds it: byte 2g + i / 8 spread to lane i, mask 1 << (i % 8). */
static inline u8x16 spread_bits(const uint8_t *bits, const int g) {
    const u8x16 byte = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    return __builtin_shuffle(load_u8x16(bits), byte + (uint8_t)(2 * g));
}

/* if_bits of lane i = bit 16g + i of the little-endian bits[0 .. 3] (g: 0 or 1): with AVX-512
 * the 16 bits are a mask register as they stand, no shuffle spreading them to the lanes. */
static inline u8x16 if_lane_bits(const uint8_t *bits, const int g, uint8_t set, uint8_t clear) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    uint32_t all;
    memcpy(&all, bits, 4);
    return (u8x16)_mm_mask_blend_epi8((__mmask16)(all >> (16 * g)), _mm_set1_epi8((char)clear), _mm_set1_epi8((char)set));
#else
    const u8x16 lane_bit = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    return if_bits(spread_bits(bits, g), lane_bit, set, clear);
#endif
}

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
        return (i8x16)(field(q, -4 * g, 15) | if_lane_bits(qh, g, type == T_Q5_1 ? 16 : 0, type == T_Q5_1 ? 0 : 0xf0));
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

#if LANES == 16
/* The types whose codes are nibbles, 0-15: Q4_0, Q4_1, Q4_K. */
#define NIBBLE_TYPE(type) ((type) == T_Q4_0 || (type) == T_Q4_1 || (type) == T_Q4_K)

/* Values 16g .. 16g + 15 of a block of a NIBBLE_TYPE, d and m its unit's scale and min, looked
 * up in the unit's 16 possible values (vpermps reads the low 4 bits of each index: the bytes'
 * low nibbles as they stand, the high ones shifted down), instead of each code converted to a
 * float and dequantized: the table's d q + m (Q4_0: (q - 8) d) is that same computation, so
 * the same bits, once a unit. It pays with one row of x (tiles of 4 rows of the weight, where
 * the decoding is most of the work); with 8 rows of x the decoding is shared and it breaks even. */
static inline vf nibble_weights(const int type, const uint8_t *restrict blk, const int g, const float d, const float m) {
    const vf iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const vf table = type == T_Q4_0 ? (iota - 8.0f) * d : iota * d + m;
    /* the bytes holding the codes (as block_codes reads them), and whether in their high nibbles */
    const uint8_t *at = type == T_Q4_K ? blk + 16 + 32 * (g / 4) + 16 * (g % 2) : blk + (type == T_Q4_1 ? 4 : 2);
    const int high = type == T_Q4_K ? g / 2 % 2 : g;
    __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)at));
    if (high) codes = _mm512_srli_epi32(codes, 4);
    return (vf)_mm512_permutexvar_ps(codes, (__m512)table);
}
#endif

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

/* Whether rows of n values, row_bytes apart, are whole blocks of a type the kernels have. */
static int valid_rows(int type, int64_t n, int64_t row_bytes) {
    const block_type t = type_info(type);
    return n > 0 && n <= SLM_MAX_COLS && t.values > 0 && n % t.values == 0 && row_bytes == n / t.values * t.bytes;
}

#endif /* SLM_QK_BLOCKS_H */
