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

/* 1 when the n little-endian float32 values at p are all finite (an exponent of all ones is an
 * infinity or a NaN), else 0: the check of an adapter's tensors at activation, which imports
 * no NumPy (slm/model/finite.py). */
int slm_f32_all_finite(const uint8_t *p, int64_t n) {
    uint32_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, p + 4 * i, sizeof u);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return !bad;
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
    /* (from a zeroed register: _cvtsh_ss inserts into whatever register holds a stale value,
     * a false dependency that chained every block of a row to the one before) */
    const int bits = (int)((unsigned)p[0] | ((unsigned)p[1] << 8));
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)));
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

/* The two float16 at p and p + 2 (a block's scale and min), in one conversion where the CPU has
 * one: four instructions fewer per block than two conversions (Q4_1 +9% on Zen 4). */
static inline void halves_to_floats(const uint8_t *p, float *a, float *b) {
#ifdef __F16C__
    uint32_t both;
    memcpy(&both, p, 4);
    const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)both));
    *a = _mm_cvtss_f32(f);
    *b = _mm_cvtss_f32(_mm_movehdup_ps(f));
#else
    *a = half_to_float(p);
    *b = half_to_float(p + 2);
#endif
}

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

/* 16 int8 codes as floats, in PER16 vectors: one instruction per step where the CPU has one
 * (GCC's generic lowering of __builtin_convertvector takes widening steps to stay vectorised,
 * a direct i8 -> i32 one becoming 16 scalar ones, and is looser on AVX2 than the intrinsics),
 * else a plain loop the compiler vectorises. */
static inline void codes_to_f32(i8x16 q, vf out[PER16]) {
#if LANES == 16
    /* (GCC 12 lowers the generic i8 -> i16 -> i32 -> f32 conversions to ~10 instructions of
     * 128- and 256-bit pieces here: Q4_1 ran at 6.1 G weights/s on one Zen 4 core) */
    out[0] = (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32((__m128i)q));
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

/* v, kept in a register: an empty asm hides where it came from, so that GCC loads it once for
 * all its uses instead of making the load a memory operand of each (Zen 4 loads one 64-byte
 * vector a cycle: a loop of FMAs that each load their operand runs at the loads' pace). */
static inline vf in_register(vf v) {
#if LANES == 16
    __asm__("" : "+v"(v));
#endif
    return v;
}

static inline u8x16 load_u8x16(const uint8_t *p) {
    u8x16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The lanes' sum in a fixed order: with AVX-512 as a tree (16 dependent scalar adds were ~20% of
 * a 576-value row's dot product on Zen 4), else lane by lane. */
static inline float sum_lanes(vf v) {
#if LANES == 16
    return _mm512_reduce_add_ps((__m512)v);
#else
    float s = 0.0f;
    for (int j = 0; j < LANES; j++) s += v[j];
    return s;
#endif
}

#if LANES == 16
/* The lane sums of 16 vectors, one per lane, lane j that of v[j]: a tree that adds lane i to
 * lane i + 8, then i + 4, i + 2, i + 1 of each vector while packing them together (45 shuffles
 * and adds, against ~8 a vector summed alone). Every vector's lanes meet in the same tree
 * whatever its place among the 16, so a sum does not depend on the other vectors. */
static inline vf lane_sums16(const __m512 v[16]) {
    __m512 w[8], z[4], y[2];
    for (int j = 0; j < 8; j++) /* lanes 0-7: v[2j]'s i + (i + 8); 8-15: v[2j + 1]'s */
        w[j] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0xee));
    for (int j = 0; j < 4; j++) /* 128-bit block b: vector 4j + b's four partial sums */
        z[j] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * j], w[2 * j + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * j], w[2 * j + 1], 0xdd));
    for (int j = 0; j < 2; j++) /* block b: vectors 8j + b (two partials), then 8j + 4 + b */
        y[j] = _mm512_add_ps(_mm512_shuffle_ps(z[2 * j], z[2 * j + 1], 0x44),
                             _mm512_shuffle_ps(z[2 * j], z[2 * j + 1], 0xee));
    /* block b: the sums of vectors b, 4 + b, 8 + b, 12 + b; lane 4b + c holds vector 4c + b */
    const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xdd));
    return (vf)_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), s);
}
#endif

/* Q4_K/Q5_K: the 6-bit scales and mins of the 8 units out of their 12 bytes, byte u of sc and
 * mn for unit u. Units 0-3: the low 6 bits of bytes 0-3 (scale) and 4-7 (min); units 4-7: the
 * nibbles of bytes 8-11 (scale low, min high) with their top 2 bits in the top 2 bits of bytes
 * 0-3 (scale) and 4-7 (min). Four bytes at a time in integer words: unit by unit, GCC 12
 * vectorised the byte fields through stores to the stack that the loads after them could not
 * forward (Q4_K 1.8x slower). */
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
#if LANES == 16 /* (GCC vectorises this loop well for AVX-512: 14-28% faster here than the words below) */
        for (int u = 0; u < 16; u++) {
            d[u] = dd * (float)(blk[u] & 15);
            m[u] = -(dmin * (float)(blk[u] >> 4));
        }
#else /* (for AVX2 it did not: byte fields through the stack, as k_scales_mins says; 1.2-1.37x) */
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
 * the same bits, once a unit. One row of x (tiles of 4 rows of the weight, where the decoding
 * is most of the work): SmolLM2 decode 1.08x, with a LoRA 1.07x; 8 rows level. */
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

#define SLM_TILE 4 /* rows of int8 x per dot_rows_q8 call */
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
     * side by side are R short streams the hardware prefetcher does not follow (a 28 MB Q8_0
     * head ran 3x slower without) */
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
                        if (R > 1) xv = in_register(xv); /* (loaded once for the R rows: the tile ~3% faster) */
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
 * inlined into the one caller, GCC 12 kept the tiles' pointers and loop bounds on the stack and
 * copied accumulators between registers (8 rows of Q4_1 x 576, both cores, a C loop: 84 -> 92
 * G weight-rows/s split out). */
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

/* ---------------------------------------------------------------- int8 activations (opt-in)
 *
 * The faster mode that moves results (docs/numerics.md): x quantized once per product, per
 * 32 values, to q = round(x / dx) in -127..127 with dx = max|x| / 127, and each block's dot
 * product taken in integers, exactly: x . w over a block = dw * dx * (q . qw) (+ m * sum(x),
 * the float sum, for the types with a min). Only the 32-value types (Q4_0, Q4_1, Q5_0, Q5_1,
 * Q8_0) take it; the others keep float activations in the same call. A row's result is the
 * same sequence of operations whatever rows share the call, as on the float path. */
#define Q8_TYPE(type) ((type) == T_Q4_0 || (type) == T_Q4_1 || (type) == T_Q5_0 || (type) == T_Q5_1 || (type) == T_Q8_0)

/* x (tokens, n), n a multiple of 32 -> q (tokens, n), dx (tokens, n / 32) and the float sums of
 * each 32 values, xs (tokens, n / 32). A block holding a NaN gets dx NaN, so that it reaches the
 * output as it does on the float path. */
static void quantize_x8(const float *restrict x, int64_t tokens, int64_t n, int8_t *restrict q,
                        float *restrict dx, float *restrict xs) {
    for (int64_t b = 0; b < tokens * (n / 32); b++) {
        const float *xb = x + b * 32;
        float halves[2] = {0.0f, 0.0f}; /* the block's sum for the min of Q4_1 and Q5_1: its halves in order */
        for (int i = 0; i < 32; i++) halves[i / 16] += xb[i];
        xs[b] = halves[0] + halves[1];
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
            dx[b] = NAN;
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
        /* a kilobyte ahead: +2-19% on a 40 MB weight streamed by one thread (Q4_1, Q5_0, Q8_0) */
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

static inline __attribute__((always_inline)) void dot_tiles_q8(const int type, const uint8_t *restrict row, const int n,
                                                               const int8_t *restrict xq, const float *restrict dx,
                                                               const float *restrict xs, const int64_t tokens,
                                                               float *restrict out, const int64_t out_n) {
    const int64_t blocks = n / 32;
    int64_t t = 0;
    for (; t + SLM_TILE <= tokens; t += SLM_TILE)
        dot_rows_q8(type, SLM_TILE, row, n, xq + t * n, dx + t * blocks, xs + t * blocks, out + t * out_n, out_n);
    switch (tokens - t) {
#define REST(k) case k: dot_rows_q8(type, k, row, n, xq + t * n, dx + t * blocks, xs + t * blocks, out + t * out_n, out_n); break;
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

/* q . k for four rows k at once, `stride` floats apart (four independent accumulators: one
 * dot alone is a chain of dependent FMAs); dot1 is the same sum for one row. The compiler
 * does not round the two alike (measured: last-bit differences), so every caller groups its
 * rows into fours the same way whatever the thread count. */
static inline void dot4(const float *restrict q, const float *restrict k, const int64_t stride, const int64_t n,
                        float out[4]) {
    vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}; /* (named, not an array: kept in registers) */
    int64_t d = 0;
    for (; d + LANES <= n; d += LANES) {
        const vf qv = load_vf(q + d);
        a0 += qv * load_vf(k + d);
        a1 += qv * load_vf(k + stride + d);
        a2 += qv * load_vf(k + 2 * stride + d);
        a3 += qv * load_vf(k + 3 * stride + d);
    }
    float s[4] = {sum_lanes(a0), sum_lanes(a1), sum_lanes(a2), sum_lanes(a3)};
    for (int j = 0; j < 4; j++) {
        for (int64_t e = d; e < n; e++) s[j] += q[e] * k[j * stride + e];
        out[j] = s[j];
    }
}

static inline float dot1(const float *restrict q, const float *restrict k, const int64_t n) {
    vf a0 = {0};
    int64_t d = 0;
    for (; d + LANES <= n; d += LANES) a0 += load_vf(q + d) * load_vf(k + d);
    float s = sum_lanes(a0);
    for (int64_t e = d; e < n; e++) s += q[e] * k[e];
    return s;
}

/* out[i] = q . rows[i] for `count` rows `stride` floats apart: fours, then ones. */
static inline void dots(const float *restrict q, const float *restrict rows, const int64_t stride,
                        const int64_t count, const int64_t n, float *restrict out) {
    int64_t i = 0;
    for (; i + 4 <= count; i += 4) dot4(q, rows + i * stride, stride, n, out + i);
    for (; i < count; i++) out[i] = dot1(q, rows + i * stride, n);
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

/* One product over a shared input, laid out before a team of threads runs it (team_matmul):
 * the term of job j for row t is terms[j * job_stride + t * row_stride] (row_stride 0: one
 * term for every row); u_at[t * count + j] is where that term's u = A x[t] starts in u. Rows
 * whose term for a job is the same one (the same factors: rows of one composition in a batch,
 * every row of a prompt) form a group, led by its first row: next[t * count + j] is the group's
 * next row after t, or -1, and lead[t * count + j] says whether t leads. A group's factors are
 * read once for all its rows. */
typedef struct {
    int count;
    const slm_job *jobs;
    const slm_term *terms;
    int64_t job_stride, row_stride;
    const float *x;            /* (tokens, n) */
    int64_t tokens, n, total;  /* total: the rows of all jobs */
    int64_t first[SLM_MAX_JOBS + 1];
    const int64_t *u_at;       /* (tokens * count + 1) */
    const int64_t *next, *lead; /* (tokens * count) each */
    int64_t ranks;             /* the length of u */
    float *u;                  /* (ranks), shared by the team */
    float *rows_scratch;       /* n floats per thread (a decoded NF4 row) */
    const int8_t *xq;          /* (tokens, n): x as int8 (int8 activations), else NULL */
    const float *xd;           /* (tokens, n / 32): their scales */
    const float *xs;           /* (tokens, n / 32): the sums of x over each 32 values (int8) */
    int64_t *claim;            /* shared: rows of the dynamic part taken so far (NULL: static shares; see team_matmul) */
    const char *const *after_at; /* this thread's ranges read after the product (the decode step's */
    const int64_t *after_bytes;  /* keys and values), fetched during its rows after its factors */
    int after_count;
} matmul_plan;

static inline const slm_term *term_of(const matmul_plan *p, int64_t t, int j) {
    return &p->terms[j * p->job_stride + t * p->row_stride];
}

/* The slots plan_matmul lays a product out in: u_at, next and lead. */
#define PLAN_SLOTS(tokens, count) (3 * (tokens) * (count) + 1)

/* Checks the operands and fills p's layout in `layout` (PLAN_SLOTS). -1 when an argument is
 * out of range. */
static int plan_matmul(matmul_plan *p, int count, const slm_job *jobs, const slm_term *terms,
                       int64_t job_stride, int64_t row_stride, const float *x, int64_t tokens, int64_t n,
                       int64_t *layout) {
    if (count < 1 || count > SLM_MAX_JOBS || tokens < 1) return -1;
    int64_t *u_at = layout, *next = layout + tokens * count + 1, *lead = next + tokens * count;
    *p = (matmul_plan){.count = count, .jobs = jobs, .terms = terms, .job_stride = job_stride,
                       .row_stride = row_stride, .x = x, .tokens = tokens, .n = n, .u_at = u_at,
                       .next = next, .lead = lead};
    for (int j = 0; j < count; j++) {
        if (!valid_rows(jobs[j].type, n, jobs[j].row_bytes)) return -1;
        p->first[j] = p->total;
        p->total += jobs[j].rows;
    }
    p->first[count] = p->total;
    int64_t ranks = 0;
    for (int64_t t = 0; t < tokens; t++)
        for (int j = 0; j < count; j++) {
            const slm_term *term = &terms[j * job_stride + t * row_stride];
            if (term->rank < 0) return -1;
            u_at[t * count + j] = ranks;
            ranks += term->rank;
        }
    u_at[tokens * count] = ranks;
    p->ranks = ranks;
    for (int64_t i = 0; i < tokens * count; i++) {
        next[i] = -1;
        lead[i] = 1;
    }
    for (int j = 0; j < count; j++) /* (a batch is a few rows: the pairs are few) */
        for (int64_t t = 0; t < tokens; t++) {
            const slm_term *a = term_of(p, t, j);
            if (!lead[t * count + j] || a->rank == 0) continue;
            for (int64_t prev = t, s = t + 1; s < tokens; s++) {
                const slm_term *b = term_of(p, s, j);
                if (lead[s * count + j] && b->rank == a->rank && b->a == a->a && b->bt == a->bt) {
                    next[prev * count + j] = s;
                    lead[s * count + j] = 0;
                    prev = s;
                }
            }
        }
    return 0;
}

/* Byte ranges to bring into the cache ahead of their use, a few lines at a time (prefetch_some),
 * while the block products run. A product's low-rank factors are read right after its rows,
 * cold from memory (a decode step streams ~100 MB of weights past them): SmolLM2's r=16
 * factors, 19.6 MB a token, cost 1.1-1.6 ms of a ~8 ms token read that way, 0.75-0.9 ms
 * fetched during the rows. A hint only: ranges past SLM_PREFETCH_RANGES are left out (a
 * factor B^T is a range per rank: 8 rows on 3 adapters of r=16 take 144 in the q, k, v
 * product, and 128 left a third of them out). */
#define SLM_PREFETCH_RANGES 512
#define SLM_ALIGN 64 /* bytes: a cache line, an AVX-512 vector */
#define SLM_CHUNK_ROWS 16 /* rows of a weight between two prefetch_some calls */
#define SLM_FETCH_ROWS 32 /* sequences whose keys and values the decode step fetches ahead */
#define SLM_FETCH_KV_BYTES (256 << 10) /* and at most this much of them, a thread: see step_matmul */
#define SLM_CLAIM_STRIDE (SLM_ALIGN / (int64_t)sizeof(int64_t)) /* int64s: a claim counter's cache line */
typedef struct {
    const char *at[SLM_PREFETCH_RANGES];
    int64_t bytes[SLM_PREFETCH_RANGES];
    int count, next;  /* ranges; the one being fetched */
    int64_t done, lines; /* bytes of it fetched; lines of all */
} prefetch_list;

static void prefetch_add(prefetch_list *l, const void *at, int64_t bytes) {
    if (bytes <= 0 || l->count == SLM_PREFETCH_RANGES) return;
    l->at[l->count] = (const char *)at;
    l->bytes[l->count++] = bytes;
    l->lines += (bytes + 63) / 64;
}

static void prefetch_some(prefetch_list *l, int64_t lines) {
    for (; lines > 0 && l->next < l->count; lines--) {
        __builtin_prefetch(l->at[l->next] + l->done, 0, 2); /* (to L2: T1) */
        l->done += 64;
        if (l->done >= l->bytes[l->next]) {
            l->next++;
            l->done = 0;
        }
    }
}

/* The units [*u0, *u1) of a term of `rank` whose first unit is g (units of four ranks, numbered
 * across all terms) that fall in a thread's share [g0, g1); empty when none do. */
static inline void term_units_of(int64_t g, int64_t rank, int64_t g0, int64_t g1, int64_t *u0, int64_t *u1) {
    const int64_t units = (rank + 3) / 4;
    *u0 = g0 > g ? g0 - g : 0;
    *u1 = g1 - g < units ? g1 - g : units;
}

/* The rows [*r0, *r1) of job j that fall in a thread's rows [i0, i1) of all jobs. */
static inline void job_rows_of(const matmul_plan *p, int j, int64_t i0, int64_t i1, int64_t *r0, int64_t *r1) {
    *r0 = (i0 > p->first[j] ? i0 : p->first[j]) - p->first[j];
    *r1 = (i1 < p->first[j + 1] ? i1 : p->first[j + 1]) - p->first[j];
}

/* Rows [i0, i1) of all of a product's jobs (numbered across jobs) against every row of x, in
 * chunks of SLM_CHUNK_ROWS with per_row lines of `fetch` fetched a row. A row's outputs are
 * the same whichever thread takes it, and whichever rows share its call. */
static void block_rows(const matmul_plan *p, const int64_t i0, const int64_t i1, prefetch_list *fetch,
                       const int64_t per_row) {
    const int64_t n = p->n, tokens = p->tokens;
    const int count = p->count;
    float *w = p->rows_scratch + (size_t)n * (size_t)thread_index();
    for (int j = 0; j < count; j++) {
        const slm_job *job = &p->jobs[j];
        int64_t r0, r1;
        job_rows_of(p, j, i0, i1, &r0, &r1);
        for (int64_t c0 = r0; c0 < r1; c0 += SLM_CHUNK_ROWS) { /* chunks: the prefetches spread over the rows */
            const int64_t c1 = c0 + SLM_CHUNK_ROWS < r1 ? c0 + SLM_CHUNK_ROWS : r1;
            prefetch_some(fetch, per_row * (c1 - c0));
            if (p->xq != NULL && Q8_TYPE(job->type)) {
                for (int64_t r = c0; r < c1; r++) {
                    const uint8_t *row = job->data + r * job->row_bytes;
                    switch (job->type) {
#define DOT8(T) case T: dot_tiles_q8(T, row, (int)n, p->xq, p->xd, p->xs, tokens, job->out + r, job->rows); break;
                        DOT8(T_Q4_0) DOT8(T_Q4_1) DOT8(T_Q5_0) DOT8(T_Q5_1) DOT8(T_Q8_0)
#undef DOT8
                    }
                }
                continue;
            }
            switch (job->type) {
#define DOT(T, V, B, U, M)                                                                                 \
    case T:                                                                                                \
        dot_weight_rows(T, job->data, job->row_bytes, c0, c1, (int)n, p->x, tokens, job->out, job->rows); \
        break;
                BLOCK_TYPES(DOT)
#undef DOT
            default: /* NF4 */
                for (int64_t r = c0; r < c1; r++) {
                    decode_nf4(job->data + r * job->row_bytes, (int)n, w);
                    for (int64_t t = 0; t < tokens; t++) job->out[t * job->rows + r] = dot(w, p->x + t * n, (int)n);
                }
            }
        }
    }
}

static inline vf fma_vf(const float a, const vf b, const vf c) { /* a b + c, one rounding where the CPU fuses */
#if LANES == 16
    return (vf)_mm512_fmadd_ps(_mm512_set1_ps(a), (__m512)b, (__m512)c);
#elif LANES == 8 && defined(__FMA__)
    return (vf)_mm256_fmadd_ps(_mm256_set1_ps(a), (__m256)b, (__m256)c);
#else
    return c + a * b;
#endif
}

/* Rows [r0, r1) of job j's output, for every row of x in the group that t leads: y[s, r] +=
 * sum_k u_s[k] B^T[k, r], k ascending. A block of 4 vectors of y stays in registers over all
 * the ranks, and the group's rows take turns over the same block of B^T (in the L1 by then):
 * one load a multiply-add, where y loaded and stored at every rank took three (8 rows on 4
 * compositions: 0.65 ms of a 16.8 ms step). Each y[s, r] gets the same operations in the same
 * order whatever the block, the group or the thread: the fused multiply-adds spelled out and
 * the last values in a padded vector (GCC contracted the vector loops and not a scalar one in an
 * AVX2 build, and SSE's scalar and vector adds kept different NaNs: a value's bits then
 * depended on where the thread's rows began). */
static void add_low_rank(const matmul_plan *p, const int j, const int64_t t, const int64_t r0, const int64_t r1) {
    const int count = p->count;
    const slm_term *term = term_of(p, t, j);
    const int64_t rank = term->rank, rows = p->jobs[j].rows;
    float *const out = p->jobs[j].out;
    int64_t r = r0;
    for (; r + 4 * LANES <= r1; r += 4 * LANES)
        for (int64_t s = t; s >= 0; s = p->next[s * count + j]) {
            const float *u = p->u + p->u_at[s * count + j], *b = term->bt + r;
            float *o = out + s * rows + r;
            vf y0 = load_vf(o), y1 = load_vf(o + LANES), y2 = load_vf(o + 2 * LANES), y3 = load_vf(o + 3 * LANES);
            for (int64_t k = 0; k < rank; k++, b += rows) {
                y0 = fma_vf(u[k], load_vf(b), y0), y1 = fma_vf(u[k], load_vf(b + LANES), y1);
                y2 = fma_vf(u[k], load_vf(b + 2 * LANES), y2), y3 = fma_vf(u[k], load_vf(b + 3 * LANES), y3);
            }
            memcpy(o, &y0, sizeof y0), memcpy(o + LANES, &y1, sizeof y1);
            memcpy(o + 2 * LANES, &y2, sizeof y2), memcpy(o + 3 * LANES, &y3, sizeof y3);
        }
    for (; r + LANES <= r1; r += LANES)
        for (int64_t s = t; s >= 0; s = p->next[s * count + j]) {
            const float *u = p->u + p->u_at[s * count + j], *b = term->bt + r;
            float *o = out + s * rows + r;
            vf y = load_vf(o);
            for (int64_t k = 0; k < rank; k++, b += rows) y = fma_vf(u[k], load_vf(b), y);
            memcpy(o, &y, sizeof y);
        }
    if (r < r1) /* the last few values in one vector padded with zeros: each through the same instructions */
        for (int64_t s = t; s >= 0; s = p->next[s * count + j]) {
            const float *u = p->u + p->u_at[s * count + j];
            const size_t bytes = sizeof(float) * (size_t)(r1 - r);
            float part[LANES] = {0};
            memcpy(part, out + s * rows + r, bytes);
            vf y = load_vf(part);
            for (int64_t k = 0; k < rank; k++) {
                memcpy(part, term->bt + k * rows + r, bytes);
                y = fma_vf(u[k], load_vf(part), y);
            }
            memcpy(part, &y, sizeof y);
            memcpy(out + s * rows + r, part, bytes);
        }
}

/* This thread's share of a planned product, called by every thread of a team (inside a
 * parallel region: slm_matmul's own, or the decode step's). The outputs are complete once
 * every thread has returned (the caller's barrier). */
static void team_matmul(const matmul_plan *p) {
    const int64_t tid = thread_index(), nth = thread_count(), n = p->n, tokens = p->tokens;
    const int count = p->count;
    /* this thread's share of the u = A x (the A factors are as many bytes as the B factors, too
     * many to stream on one thread), in units of four ranks of one term: a unit is computed the
     * same way whichever thread takes it, so u does not depend on the thread count */
    int64_t units = 0;
    for (int64_t t = 0; t < tokens; t++)
        for (int j = 0; j < count; j++) units += p->lead[t * count + j] ? (term_of(p, t, j)->rank + 3) / 4 : 0;
    const int64_t g0 = units * tid / nth, g1 = units * (tid + 1) / nth;
    /* each thread takes one contiguous range of rows (of all jobs), the same in both loops */
    const int64_t i0 = p->total * tid / nth, i1 = p->total * (tid + 1) / nth;
    /* the factors this thread reads after its rows, fetched while it computes them: its A units,
     * then its columns of every B^T row */
    prefetch_list fetch = {.count = 0};
    for (int64_t t = 0, g = 0; t < tokens && g < g1; t++)
        for (int j = 0; j < count && g < g1; j++) {
            if (!p->lead[t * count + j]) continue;
            const slm_term *term = term_of(p, t, j);
            int64_t u0, u1;
            term_units_of(g, term->rank, g0, g1, &u0, &u1);
            const int64_t k1 = 4 * u1 < term->rank ? 4 * u1 : term->rank;
            if (u0 < u1) prefetch_add(&fetch, term->a + 4 * u0 * n, sizeof(float) * (k1 - 4 * u0) * n);
            g += (term->rank + 3) / 4;
        }
    for (int j = 0; j < count && p->ranks > 0; j++) {
        int64_t r0, r1;
        job_rows_of(p, j, i0, i1, &r0, &r1);
        for (int64_t t = 0; t < tokens && r0 < r1; t++) {
            if (!p->lead[t * count + j]) continue;
            const slm_term *term = term_of(p, t, j);
            for (int64_t k = 0; k < term->rank; k++)
                prefetch_add(&fetch, term->bt + k * p->jobs[j].rows + r0, sizeof(float) * (r1 - r0));
        }
    }
    for (int i = 0; i < p->after_count; i++) prefetch_add(&fetch, p->after_at[i], p->after_bytes[i]);
    const int64_t per_row = i1 > i0 ? fetch.lines / (i1 - i0) + 1 : 0;
    if (p->claim == NULL || tokens == 1) {
        block_rows(p, i0, i1, &fetch, per_row);
    } else { /* a fixed share each, then the rest taken in shrinking pieces by whichever thread
              * is free: the two cores of a VM do not run at one speed, and at a barrier the
              * faster one waited ~5% of an 8-row step (one row of x, memory-bound, gained
              * nothing and keeps the static shares) */
        const int64_t fixed = p->total * 3 / (4 * nth) / 4 * 4, rest = fixed * nth;
        block_rows(p, fixed * tid, fixed * (tid + 1), &fetch, per_row);
        for (;;) {
            const int64_t left = p->total - rest - __atomic_load_n(p->claim, __ATOMIC_RELAXED);
            if (left <= 0) break;
            const int64_t size = ((left / (2 * nth) > 32 ? left / (2 * nth) : 32) + 3) / 4 * 4;
            const int64_t a = rest + __atomic_fetch_add(p->claim, size, __ATOMIC_RELAXED);
            if (a >= p->total) break;
            block_rows(p, a, a + size < p->total ? a + size : p->total, &fetch, per_row);
        }
    }
    for (int64_t t = 0, g = 0; t < tokens && g < g1; t++) /* g: the first unit of the current term */
        for (int j = 0; j < count && g < g1; j++) {
            if (!p->lead[t * count + j]) continue;
            const slm_term *term = term_of(p, t, j);
            int64_t u0, u1;
            term_units_of(g, term->rank, g0, g1, &u0, &u1);
            for (int64_t unit = u0; unit < u1; unit++) {
                const int64_t k = 4 * unit, size = term->rank - k < 4 ? term->rank - k : 4;
                /* for every row of the group while these rows of A are in the cache */
                for (int64_t s = t; s >= 0; s = p->next[s * count + j])
                    dots(p->x + s * n, term->a + k * n, n, size, n, p->u + p->u_at[s * count + j] + k);
            }
            g += (term->rank + 3) / 4;
        }
    if (p->ranks > 0) {
#pragma omp barrier
    }
    /* (every u is ready) low-rank terms over the same rows, y[r] += sum_k u[k] B^T[k, r] */
    for (int j = 0; j < count && p->ranks > 0; j++) {
        int64_t r0, r1;
        job_rows_of(p, j, i0, i1, &r0, &r1);
        for (int64_t t = 0; t < tokens && r0 < r1; t++)
            if (p->lead[t * count + j]) add_low_rank(p, j, t, r0, r1);
    }
}

/* The shared body of slm_matmul and slm_matmul_rows: plan, scratch, one parallel region.
 * int8: int8 activations for the types that take them (n a multiple of 32). */
static int matmul_impl(int count, const slm_job *jobs, const slm_term *terms, int64_t job_stride,
                       int64_t row_stride, const float *x, int64_t tokens, int64_t n, int int8) {
    if (count < 1 || count > SLM_MAX_JOBS || tokens < 1) return -1;
    int64_t *layout = malloc(sizeof(int64_t) * (size_t)PLAN_SLOTS(tokens, count));
    if (layout == NULL) return -2;
    matmul_plan p;
    if (plan_matmul(&p, count, jobs, terms, job_stride, row_stride, x, tokens, n, layout) != 0) {
        free(layout);
        return -1;
    }
    int8 = int8 && n % 32 == 0;
    const int64_t threads = slm_threads(), blocks = int8 ? tokens * (n / 32) : 0;
    /* rows_scratch (n a thread), u, then with int8 activations xd, xs and xq */
    float *scratch = malloc(sizeof(float) * (size_t)(n * threads + p.ranks + 2 * blocks) +
                            (size_t)(int8 ? tokens * n : 0));
    if (scratch == NULL) {
        free(layout);
        return -2;
    }
    p.rows_scratch = scratch;
    p.u = scratch + n * threads;
    float *aligned = NULL;
    if ((uintptr_t)x % SLM_ALIGN) { /* (see slm_decode_step: a vector load of x across two cache lines) */
        aligned = aligned_alloc(SLM_ALIGN, (sizeof(float) * (size_t)(tokens * n) + SLM_ALIGN - 1) / SLM_ALIGN * SLM_ALIGN);
        if (aligned == NULL) {
            free(scratch);
            free(layout);
            return -2;
        }
        memcpy(aligned, x, sizeof(float) * (size_t)(tokens * n));
        p.x = aligned;
    }
    if (int8) {
        float *xd = p.u + p.ranks, *xs = xd + blocks;
        int8_t *xq = (int8_t *)(xs + blocks);
        quantize_x8(x, tokens, n, xq, xd, xs);
        p.xq = xq;
        p.xd = xd;
        p.xs = xs;
    }
    int64_t claim = 0;
    p.claim = &claim;
#pragma omp parallel
    team_matmul(&p);
    free(aligned);
    free(scratch);
    free(layout);
    return 0;
}

/* out[t, r] = x[t] . dequant(row r) + (A x[t]) . B[r] for every job, in one parallel region.
 * The result does not depend on the number of threads, nor on the other rows of x: each
 * output is computed whole by one thread, in a fixed order. int8: int8 activations (above).
 * x (tokens, n) float32, C order. Returns 0; -1 when an argument is out of range, -2 when
 * out of memory. */
int slm_matmul(int count, const slm_job *jobs, const float *x, int64_t tokens, int64_t n, int int8) {
    if (count < 1 || count > SLM_MAX_JOBS) return -1;
    slm_term terms[SLM_MAX_JOBS];
    for (int j = 0; j < count; j++) terms[j] = (slm_term){jobs[j].rank, jobs[j].lora_a, jobs[j].lora_bt};
    return matmul_impl(count, jobs, terms, 1, 0, x, tokens, n, int8);
}

/* slm_matmul for a batch of rows that each bring their own low-rank terms (the server's
 * decode step: one row per request, each on its own composition of the same base): terms
 * (count, tokens), the term of job j for row t at terms[j * tokens + t]; the jobs' own rank
 * and lora fields are ignored. Row t's result is bit for bit what slm_matmul gives for row t
 * alone with that term. */
int slm_matmul_rows(int count, const slm_job *jobs, const slm_term *terms, const float *x, int64_t tokens,
                    int64_t n, int int8) {
    return matmul_impl(count, jobs, terms, tokens, 1, x, tokens, n, int8);
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


/* ---- the rest of a decode step: small, single-threaded, no thread wake-ups ----------
 * (noinline: the decode step below calls these same functions, so that an op run alone and
 * the same op inside the step are one piece of machine code, bit for bit the same result) */

/* out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w; x, out (tokens, n); out may be x. */
__attribute__((noinline)) void slm_rms_norm(const float *x, const float *w, float *out, int64_t tokens, int64_t n,
                                            float eps) {
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
__attribute__((noinline)) void slm_rope(const float *x, float *out, const float *cos_t, const float *sin_t,
                                        int64_t tokens, int64_t heads, int64_t hd, int interleaved) {
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
 * parallel region of its own: the prefill runs its parts on its own two threads
 * (kernels_native.py), as it does its BLAS products, so that no OpenMP thread spins on a core
 * while they work. */

#define ATT_ROWS 16
#define ATT_POSITIONS 4

/* exp(x) in every lane: x = n ln2 + r, |r| <= ln2 / 2, exp(r) by Cephes' degree-6 polynomial
 * (relative error ~1e-7, a float's rounding), times 2^n through the exponent bits. NaN stays
 * NaN. Lanes below -64 ln 2 give 0: every use adds e^x to at least 1 (a softmax to its top
 * key's 1, a gated activation to 1), so 2^-64 is far below a float's rounding there, and no
 * result, nor a softmax weight made from it, is ever a denormal float (slow on many CPUs).
 * Lanes above 88 give e^88 (a gated activation's denominator is then as good as infinite). */
typedef int32_t vi __attribute__((vector_size(4 * LANES)));

static inline vf exp_vf(vf x) {
    const vf lowest = (vf){0} - 44.361419555836500f, highest = (vf){0} + 88.0f, magic = (vf){0} + 12582912.0f; /* 1.5 * 2^23 */
    const vi under = x < lowest, over = x > highest;
    x = (vf)(((vi)x & ~under) | ((vi)lowest & under));
    x = (vf)(((vi)x & ~over) | ((vi)highest & over));
    const vf shifted = x * 1.44269504088896341f + magic; /* round(x log2 e) in the low bits */
    const vf n = shifted - magic;
    const vf r = x - n * 0.693359375f - n * -2.12194440e-4f;
    vf p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const vi two_n = ((vi)shifted - 0x4B400000 + 127) << 23;
    return (vf)((vi)(p * (vf)two_n) & ~under);
}

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
 * chain of S dependent compares or adds) and its tail of one exp_vf a score, with a fourth
 * row weighed for nothing (weigh_three), cost one position's attention 8% at 62 keys and 20%
 * at 300 (SmolLM2, hot), and a 512-token prompt on SmolLM2 4%. */
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

/* weigh_block for three rows (a kv group of three heads: SmolLM2's): 3 rows x 4 vectors of hd
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

/* The gated activations, LANES values at a time with exp_vf. Every value, whatever its place
 * in a call, goes through gated_vectors' one loop (a short tail is padded to a whole vector),
 * so the decode step, which splits the values between its threads, gets each value's bits as
 * a call over all of them does. */
enum { ACT_SWIGLU, ACT_GEGLU }; /* the decode step's slm_model.activation */

__attribute__((noinline)) static void gated_vectors(int activation, const float *gate, const float *up, float *out,
                                                    int64_t vectors) {
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (int64_t i = 0; i < vectors * LANES; i += LANES) {
        const vf x = load_vf(gate + i), u = load_vf(up + i);
        vf y;
        if (activation == ACT_GEGLU) /* x/2 (1 + tanh(z)) = x / (1 + exp(-2z)), z = c (x + 0.044715 x^3) */
            y = x / (1.0f + exp_vf(-2.0f * (c * (x + 0.044715f * x * x * x)))) * u;
        else /* silu(x) = x / (1 + exp(-x)) */
            y = x / (1.0f + exp_vf(-x)) * u;
        memcpy(out + i, &y, sizeof y);
    }
}

static void gated(int activation, const float *gate, const float *up, float *out, int64_t n) {
    const int64_t whole = n / LANES, rest = n - whole * LANES;
    gated_vectors(activation, gate, up, out, whole);
    if (rest) {
        float g[LANES] = {0}, u[LANES] = {0}, o[LANES];
        memcpy(g, gate + whole * LANES, sizeof(float) * (size_t)rest);
        memcpy(u, up + whole * LANES, sizeof(float) * (size_t)rest);
        gated_vectors(activation, g, u, o, 1);
        memcpy(out + whole * LANES, o, sizeof(float) * (size_t)rest);
    }
}

/* out = silu(gate) * up = gate / (1 + exp(-gate)) * up, n values (out may be gate). */
void slm_swiglu(const float *gate, const float *up, float *out, int64_t n) { gated(ACT_SWIGLU, gate, up, out, n); }

/* out = gelu_tanh(gate) * up, GELU's tanh approximation (slm.model.mathops.gelu_tanh), n values. */
void slm_geglu(const float *gate, const float *up, float *out, int64_t n) { gated(ACT_GEGLU, gate, up, out, n); }

/* ---- the decode step: every layer of one token per sequence, in one call ------------
 *
 * One parallel region for the whole step instead of ~10 calls (each its own thread wake-up)
 * per layer. Per layer, with barriers between the phases ("rows": each thread its own
 * sequences of the batch):
 *
 *   rows        h = rms_norm(x, attn_norm)
 *   all         q, k, v = h W^T + low-rank terms        (team_matmul: rows split by thread)
 *   rows        + biases; q/k norms; RoPE; k, v into the cache slot; q * q_scale
 *   all         attention, (sequence, head) pairs split by thread
 *   all         a = att Wo^T (+ terms)
 *   rows        + bias; [post norm]; x += a; h = rms_norm(x, ffn_norm)
 *   all         gate, up = h W^T (+ terms)
 *   all         act(gate + bias) * (up + bias), elements split by thread
 *   all         f = act Wdown^T (+ terms)
 *   rows        + bias; [post norm]; x += f
 *
 * Each op is the function the op-by-op path (slm/model/decoder.py over NativeKernels) calls,
 * on the same values, so a sequence's result is bit for bit that path's, whatever the batch
 * (tests/test_step.py). */

enum { P_Q, P_K, P_V, P_O, P_GATE, P_UP, P_DOWN, P_COUNT };

typedef struct {             /* one linear layer of the base */
    int32_t type, pad;
    const uint8_t *data;     /* (rows, row_bytes) */
    int64_t rows, row_bytes;
    const float *bias;       /* (rows) or NULL */
} slm_linear;

typedef struct {             /* mirrored by slm/model/step_native.py's Layer */
    slm_linear w[P_COUNT];
    const float *attn_norm, *q_norm, *k_norm, *post_attn_norm, *ffn_norm, *post_ffn_norm; /* NULL: none */
    int64_t window;          /* positions a query sees, itself included; 0: all */
    int64_t table;           /* its RoPE table: 0 or 1 (the sliding layers' base) */
} slm_layer;

typedef struct {             /* the base: its sizes, its family's choices, its layers */
    int64_t layers, hidden, heads, kv_heads, head_dim, ffn;
    int32_t activation;      /* ACT_SWIGLU (0) or ACT_GEGLU (1, tanh) */
    int32_t interleaved;     /* RoPE on pairs (2i, 2i+1) (GGUF row order), else (i, i + hd/2) */
    float eps, q_scale;      /* q_scale: queries are multiplied by it (1: not) */
    const slm_layer *layer;  /* (layers) */
    const float *output_norm;
    int32_t int8;            /* 1: int8 activations for the products that take them (opt-in) */
    int32_t pad;
} slm_model;

typedef struct {             /* one sequence of the batch */
    int64_t position;        /* of its token */
    float *const *k, *const *v; /* per layer: its cache, (slots, kv_heads, head_dim) */
    const int64_t *slots;    /* per layer */
    const slm_term *terms;   /* (layers, P_COUNT): its composition's low-rank terms (rank 0: none) */
    const float *rope;       /* (2 tables, cos | sin, head_dim / 2) at its position */
} slm_row;

typedef struct {             /* the step's working memory, carved from one caller-owned block */
    float *h, *q, *k, *v, *qr, *att, *o, *g, *up, *f, *u, *rows, *p;
    int64_t *layout;         /* per thread: a product's plan, PLAN_SLOTS(B, SLM_MAX_JOBS) */
    slm_term *terms;         /* (P_COUNT, B): the current layer's terms, job-major */
    int8_t *xq;              /* per thread: a product's input as int8 (int8 activations) */
    float *xd, *xs;          /* per thread: their scales, and the sums of each 32 values */
    int64_t layout_n, xq_n;  /* per-thread lengths of layout and xq (xd, xs: xq_n / 32) */
    int64_t *claims;         /* (layers, P_COUNT) counters (team_matmul's claim, at a product's first job), a cache line each */
} step_buffers;

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* The longest key run and the most low-rank values (one product's u) a step over these rows
 * needs. */
static void step_needs(const slm_model *m, int64_t B, const slm_row *rows, int64_t *slots, int64_t *ranks) {
    *slots = 1;
    *ranks = 0;
    for (int64_t l = 0; l < m->layers; l++) {
        int64_t r = 0;
        for (int64_t t = 0; t < B; t++) {
            *slots = max64(*slots, rows[t].slots[l]);
            for (int j = 0; j < P_COUNT; j++) r += rows[t].terms ? rows[t].terms[l * P_COUNT + j].rank : 0;
        }
        *ranks = max64(*ranks, r);
    }
}

/* Lays the buffers out from `base` (NULL: only measure); returns the bytes they take. */
static int64_t carve(const slm_model *m, int64_t B, int64_t slots, int64_t ranks, int64_t threads, uint8_t *base,
                     step_buffers *b) {
    const int64_t H = m->hidden, Q = m->heads * m->head_dim, KV = m->kv_heads * m->head_dim, F = m->ffn;
    const int64_t N = max64(max64(H, Q), F);
    b->layout_n = PLAN_SLOTS(B, SLM_MAX_JOBS);
    b->xq_n = m->int8 ? B * N : 0;
    int64_t at = 0;
#define TAKE(field, type, count)                                    \
    do {                                                            \
        if (base) b->field = (type *)(base + at);                   \
        at += ((int64_t)sizeof(type) * (count) + SLM_ALIGN - 1) / SLM_ALIGN * SLM_ALIGN; \
    } while (0)
    TAKE(h, float, B * H); TAKE(q, float, B * Q); TAKE(k, float, B * KV); TAKE(v, float, B * KV);
    TAKE(qr, float, B * Q); TAKE(att, float, B * Q); TAKE(o, float, B * H); TAKE(g, float, B * F);
    TAKE(up, float, B * F); TAKE(f, float, B * H);
    TAKE(u, float, ranks + 1); TAKE(rows, float, N * threads); TAKE(p, float, (4 * slots + m->head_dim) * threads);
    TAKE(layout, int64_t, b->layout_n * threads); TAKE(terms, slm_term, P_COUNT * B);
    TAKE(xq, int8_t, b->xq_n * threads); TAKE(xd, float, b->xq_n / 32 * threads);
    TAKE(xs, float, b->xq_n / 32 * threads);
    TAKE(claims, int64_t, m->layers * P_COUNT * SLM_CLAIM_STRIDE);
#undef TAKE
    return at;
}

/* Bytes of working memory slm_decode_step needs for these rows (a caller keeps one block and
 * grows it when this says so). */
int64_t slm_step_work_bytes(const slm_model *m, int64_t B, const slm_row *rows) {
    int64_t slots, ranks;
    step_buffers b;
    step_needs(m, B, rows, &slots, &ranks);
    return carve(m, B, slots, ranks, slm_threads(), NULL, &b) + SLM_ALIGN; /* (room to align the block) */
}

static int step_checks(const slm_model *m, int64_t B, const slm_row *rows) {
    const int64_t H = m->hidden, Q = m->heads * m->head_dim, KV = m->kv_heads * m->head_dim, F = m->ffn;
    if (B < 1 || m->layers < 1 || m->kv_heads < 1 || m->heads % m->kv_heads || m->head_dim % 2) return -1;
    const int64_t out[P_COUNT] = {Q, KV, KV, H, F, F, H}, in[P_COUNT] = {H, H, H, Q, H, H, F};
    for (int64_t l = 0; l < m->layers; l++) {
        const slm_layer *L = &m->layer[l];
        for (int j = 0; j < P_COUNT; j++)
            if (L->w[j].rows != out[j] || !valid_rows(L->w[j].type, in[j], L->w[j].row_bytes)) return -1;
        if (L->table < 0 || L->table > 1 || L->window < 0) return -1;
        for (int64_t t = 0; t < B; t++) {
            const int64_t pos = rows[t].position, slots = rows[t].slots[l];
            /* a ring (slots < positions) only ever holds exactly a sliding layer's window */
            if (pos < 0 || slots < 1 || (pos >= slots && slots != L->window)) return -1;
            for (int j = 0; rows[t].terms && j < P_COUNT; j++) {
                const slm_term *term = &rows[t].terms[l * P_COUNT + j];
                if (term->rank < 0 || (term->rank > 0 && (term->a == NULL || term->bt == NULL))) return -1;
            }
        }
    }
    return 0;
}

/* The keys a row's query sees at layer l, in slot order: [*lo, *lo + *S) of its cache, a full
 * ring, else the window ending at its position. */
static inline void keys_seen(const slm_layer *L, const slm_row *row, int64_t l, int64_t *lo, int64_t *S) {
    const int64_t pos = row->position, slots = row->slots[l];
    *lo = 0;
    *S = slots;
    if (pos < slots) {
        *lo = L->window && pos - L->window + 1 > 0 ? pos - L->window + 1 : 0;
        *S = pos + 1 - *lo;
    }
}

/* This thread's share of a layer's attention: the (sequence, head) pairs [*i0, *i1) of B * nh. */
static inline void attention_share(const slm_model *m, int64_t B, int64_t *i0, int64_t *i1) {
    const int64_t tid = thread_index(), nth = thread_count();
    *i0 = B * m->heads * tid / nth;
    *i1 = B * m->heads * (tid + 1) / nth;
}

/* A product of the step: jobs `first` .. `first + count - 1` of layer L over input x (B, n),
 * each writing its (B, rows) output; the rows' low-rank terms gathered (job-major) into
 * b->terms at `slot`. Every thread plans its own copy (no barrier) and runs its share. The
 * q, k, v product also fetches the keys and values this thread's share of the layer's
 * attention reads (its cached positions): at 8 rows they come cold from memory, ~1.2 MB a
 * layer on SmolLM2, while the product itself is bound by arithmetic, not by memory. At most
 * SLM_FETCH_KV_BYTES a thread, the first sequences' (attention reads them first; the rest
 * stream in behind): past what the L2 holds beside the product's rows, the fetch evicts its
 * own lines, and 8 rows at ~250 positions ran 4.5% faster with no fetch at all than with
 * all of it (1.02-1.06x capped; ~60 and ~130 positions unchanged). */
static void step_matmul(const slm_model *m, const step_buffers *b, int64_t layer, int first, int count,
                        const float *x, int64_t n, float *const *outs, int64_t B, const slm_row *rows) {
    const int tid = thread_index();
    const char *after_at[2 * SLM_FETCH_ROWS];
    int64_t after_bytes[2 * SLM_FETCH_ROWS];
    int after = 0;
    if (first == P_Q) {
        const int64_t KV = m->kv_heads * m->head_dim;
        int64_t i0, i1;
        attention_share(m, B, &i0, &i1);
        int64_t budget = SLM_FETCH_KV_BYTES;
        for (int64_t t = i0 / m->heads; t < B && t * m->heads < i1 && after < 2 * SLM_FETCH_ROWS && budget > 0; t++) {
            int64_t lo, S;
            keys_seen(&m->layer[layer], &rows[t], layer, &lo, &S);
            const int64_t all = (int64_t)sizeof(float) * S * KV, bytes = all < budget / 2 ? all : budget / 2;
            after_at[after] = (const char *)(rows[t].k[layer] + lo * KV);
            after_bytes[after++] = bytes;
            after_at[after] = (const char *)(rows[t].v[layer] + lo * KV);
            after_bytes[after++] = bytes;
            budget -= 2 * bytes;
        }
    }
    slm_job jobs[SLM_MAX_JOBS];
    slm_term *terms = b->terms + (int64_t)first * B;
    for (int j = 0; j < count; j++) {
        const slm_linear *w = &m->layer[layer].w[first + j];
        jobs[j] = (slm_job){w->type, 0, w->data, w->rows, w->row_bytes, outs[j], NULL, NULL};
    }
    matmul_plan p;
    plan_matmul(&p, count, jobs, terms, B, 1, x, B, n, b->layout + b->layout_n * tid); /* (checked by step_checks) */
    if (m->int8 && n % 32 == 0) { /* each thread quantizes the (small) input itself: no barrier */
        int8_t *xq = b->xq + b->xq_n * tid;
        float *xd = b->xd + b->xq_n / 32 * tid, *xs = b->xs + b->xq_n / 32 * tid;
        quantize_x8(x, B, n, xq, xd, xs);
        p.xq = xq;
        p.xd = xd;
        p.xs = xs;
    }
    p.u = b->u;
    p.rows_scratch = b->rows;
    p.after_at = after_at;
    p.after_bytes = after_bytes;
    p.after_count = after;
    p.claim = b->claims + (layer * P_COUNT + first) * SLM_CLAIM_STRIDE; /* (zeroed before the step) */
    team_matmul(&p);
}

static void add_bias(float *y, const float *bias, int64_t B, int64_t n) {
    if (bias)
        for (int64_t t = 0; t < B; t++)
            for (int64_t i = 0; i < n; i++) y[t * n + i] += bias[i];
}

/* A sublayer's output y (B, H) closed into the residual stream: x += post_norm(y + bias)
 * (the family's post norm, if it has one), then h = rms_norm(x, next_norm). */
static void add_residual(float *x, float *y, const float *bias, const float *post_norm, const float *next_norm,
                         float *h, int64_t B, int64_t H, float eps) {
    add_bias(y, bias, B, H);
    if (post_norm) slm_rms_norm(y, post_norm, y, B, H, eps);
    for (int64_t i = 0; i < B * H; i++) x[i] += y[i];
    slm_rms_norm(x, next_norm, h, B, H, eps);
}

/* x (B, hidden): in, each sequence's embedded token; out (B, hidden): the final hidden states
 * after the output norm (the head's input). Each row's cache gains its position's keys and
 * values. 0: done; -1: arguments out of range (a bug in the caller); the work block too small. */
int slm_decode_step(const slm_model *m, int64_t B, const slm_row *rows, float *x, float *out, void *work,
                    int64_t work_bytes) {
    if (step_checks(m, B, rows) != 0) return -1;
    int64_t need_slots, need_ranks;
    step_needs(m, B, rows, &need_slots, &need_ranks);
    step_buffers b;
    const int64_t threads = slm_threads();
    /* the buffers from a 64-byte boundary (carve keeps each on one): NumPy's block starts 16
     * bytes past one, and the products' inputs then cost two cache lines a vector load */
    const int64_t skip = (int64_t)((SLM_ALIGN - (uintptr_t)work % SLM_ALIGN) % SLM_ALIGN);
    if (carve(m, B, need_slots, need_ranks, threads, NULL, &b) + skip > work_bytes) return -1;
    carve(m, B, need_slots, need_ranks, threads, (uint8_t *)work + skip, &b);
    const int64_t H = m->hidden, hd = m->head_dim, nh = m->heads, nkv = m->kv_heads;
    const int64_t Q = nh * hd, KV = nkv * hd, F = m->ffn, half = hd / 2;
    memset(b.claims, 0, sizeof(int64_t) * (size_t)(m->layers * P_COUNT * SLM_CLAIM_STRIDE));
#pragma omp parallel
    {
        const int tid = thread_index(), nth = thread_count();
        /* the row-wise work between the products: each thread its own rows (of B) */
        const int64_t t0 = B * tid / nth, t1 = B * (tid + 1) / nth, rows_here = t1 - t0;
        slm_rms_norm(x + t0 * H, m->layer[0].attn_norm, b.h + t0 * H, rows_here, H, m->eps);
        for (int64_t l = 0; l < m->layers; l++) {
            const slm_layer *L = &m->layer[l];
            if (tid == 0) /* this layer's terms, job-major: terms[j * B + t] */
                for (int j = 0; j < P_COUNT; j++)
                    for (int64_t t = 0; t < B; t++)
                        b.terms[j * B + t] = rows[t].terms ? rows[t].terms[l * P_COUNT + j] : (slm_term){0, NULL, NULL};
#pragma omp barrier
            float *qkv[3] = {b.q, b.k, b.v};
            step_matmul(m, &b, l, P_Q, 3, b.h, H, qkv, B, rows);
#pragma omp barrier
            for (int64_t t = t0; t < t1; t++) {
                float *q = b.q + t * Q, *k = b.k + t * KV, *v = b.v + t * KV;
                add_bias(q, L->w[P_Q].bias, 1, Q);
                add_bias(k, L->w[P_K].bias, 1, KV);
                add_bias(v, L->w[P_V].bias, 1, KV);
                if (L->q_norm) slm_rms_norm(q, L->q_norm, q, nh, hd, m->eps);
                if (L->k_norm) slm_rms_norm(k, L->k_norm, k, nkv, hd, m->eps);
                const int64_t pos = rows[t].position, slots = rows[t].slots[l];
                const int64_t slot = pos < slots ? pos : pos % slots;
                const float *c = rows[t].rope + L->table * 2 * half, *s = c + half;
                float *kc = rows[t].k[l] + slot * KV, *vc = rows[t].v[l] + slot * KV;
                slm_rope(q, b.qr + t * Q, c, s, 1, nh, hd, m->interleaved);
                slm_rope(k, kc, c, s, 1, nkv, hd, m->interleaved);
                memcpy(vc, v, sizeof(float) * (size_t)KV);
                if (m->q_scale != 1.0f)
                    for (int64_t i = 0; i < Q; i++) b.qr[t * Q + i] *= m->q_scale;
            }
#pragma omp barrier
            { /* this thread's share of the (sequence, head) pairs, a contiguous range */
                int64_t i0, i1;
                attention_share(m, B, &i0, &i1);
                for (int64_t t = i0 / nh; t < B && t * nh < i1; t++) {
                    int64_t lo, S;
                    keys_seen(L, &rows[t], l, &lo, &S);
                    const int64_t h0 = i0 > t * nh ? i0 - t * nh : 0, h1 = i1 < (t + 1) * nh ? i1 - t * nh : nh;
                    attend_range(b.qr + t * Q, rows[t].k[l] + lo * KV, rows[t].v[l] + lo * KV, b.att + t * Q, S, nh,
                                 nkv, hd, h0, h1, b.p + (4 * need_slots + hd) * tid);
                }
            }
#pragma omp barrier
            float *o[1] = {b.o};
            step_matmul(m, &b, l, P_O, 1, b.att, Q, o, B, rows);
#pragma omp barrier
            add_residual(x + t0 * H, b.o + t0 * H, L->w[P_O].bias, L->post_attn_norm, L->ffn_norm, b.h + t0 * H,
                         rows_here, H, m->eps);
#pragma omp barrier
            float *gu[2] = {b.g, b.up};
            step_matmul(m, &b, l, P_GATE, 2, b.h, H, gu, B, rows);
#pragma omp barrier
            { /* this thread's slice of the activation, the biases added first */
                const int64_t e0 = B * F * tid / nth, e1 = B * F * (tid + 1) / nth;
                for (int64_t e = e0; e < e1; e++) {
                    if (L->w[P_GATE].bias) b.g[e] += L->w[P_GATE].bias[e % F];
                    if (L->w[P_UP].bias) b.up[e] += L->w[P_UP].bias[e % F];
                }
                gated(m->activation, b.g + e0, b.up + e0, b.g + e0, e1 - e0);
            }
#pragma omp barrier
            float *f[1] = {b.f};
            step_matmul(m, &b, l, P_DOWN, 1, b.g, F, f, B, rows);
#pragma omp barrier
            /* then the next layer's input norm, or after the last the output norm */
            add_residual(x + t0 * H, b.f + t0 * H, L->w[P_DOWN].bias, L->post_ffn_norm,
                         l + 1 < m->layers ? m->layer[l + 1].attn_norm : m->output_norm,
                         (l + 1 < m->layers ? b.h : out) + t0 * H, rows_here, H, m->eps);
        }
    }
    return 0;
}

/* f32_all_finite(buffer) -> bool: slm_f32_all_finite from Python without ctypes (an
 * activation's finite check, slm/model/finite.py: importing ctypes is a few ms of each
 * `slm activate`). */
static PyObject *py_f32_all_finite(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0) return NULL;
    if (view.len % 4) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "%zd bytes are not whole float32 values", view.len);
    }
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = slm_f32_all_finite((const uint8_t *)view.buf, (int64_t)(view.len / 4));
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"f32_all_finite", py_f32_all_finite, METH_O, "Whether the little-endian float32 values in a buffer are all finite."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_qkernels",
                                    "C kernels, called through ctypes (and f32_all_finite directly).", -1, methods};

PyMODINIT_FUNC PyInit__qkernels(void) { return PyModule_Create(&module); }
