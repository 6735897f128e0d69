/* qkernels/simd.h: the CPU, as every kernel sees it.
 *
 * Holds the C and intrinsics headers, the OpenMP thread helpers (slm_threads and
 * slm_set_threads, which kernels_native.py calls; the fork guard of every parallel region,
 * SLM_TEAM_IF; thread_count and thread_index inside
 * parallel regions), the float16 and float32 loads from unaligned bytes, and the vector type
 * vf: LANES floats, the CPU's register width (AVX-512 16, AVX 8, else 4), with its loads,
 * lane sums and the int8 -> float conversion of 16 codes. Every other file builds on these;
 * nothing here knows a block format or a product.
 *
 * Part of the unity build: _qkernels.c includes this file once, in dependency order; it is not
 * compiled on its own.
 */
#ifndef SLM_QK_SIMD_H
#define SLM_QK_SIMD_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#include <pthread.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

/* Fork safety. GNU OpenMP keeps a team's threads for the next parallel region, and a child
 * forked after a team started has none of them: its first parallel region on a team waits for
 * them forever. So a process records whether it started a team, and a child forked after that
 * runs every parallel region on its calling thread alone (the region's if clause,
 * SLM_TEAM_IF), which needs no team: the same results, each output computed whole by one
 * thread as always, on one core. */
static int slm_team_started, slm_team_lost;

#ifdef _OPENMP
static void slm_on_fork_child(void) { slm_team_lost = slm_team_lost || slm_team_started; }

__attribute__((constructor)) static void slm_watch_forks(void) { pthread_atfork(NULL, NULL, slm_on_fork_child); }
#endif

/* Whether a parallel region may run on a team (every region's if clause). */
static inline int slm_team_allowed(void) {
    if (__atomic_load_n(&slm_team_lost, __ATOMIC_RELAXED)) return 0;
    if (!__atomic_load_n(&slm_team_started, __ATOMIC_RELAXED)) __atomic_store_n(&slm_team_started, 1, __ATOMIC_RELAXED);
    return 1;
}
#define SLM_TEAM_IF if (slm_team_allowed())

/* The number of threads a parallel region uses here. */
int slm_threads(void) {
#ifdef _OPENMP
    return slm_team_lost ? 1 : omp_get_max_threads();
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
 * one: four instructions fewer per block than two conversions. */
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
 * AVX-512, 8 with AVX, else 4): a wider vector type has no machine mode, and GCC then keeps
 * such variables in memory, accumulators included, which is several times slower. Codes
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
    /* (GCC lowers the generic i8 -> i16 -> i32 -> f32 conversions to about ten instructions
     * of 128- and 256-bit pieces here, against one) */
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
 * all its uses instead of making the load a memory operand of each (a core loads few 64-byte
 * vectors a cycle: a loop of FMAs that each load their operand runs at the loads' pace). */
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

/* The lanes' sum in a fixed order: with AVX-512 as a tree (16 dependent scalar adds are a
 * large part of a short row's dot product), else lane by lane. */
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

#endif /* SLM_QK_SIMD_H */
