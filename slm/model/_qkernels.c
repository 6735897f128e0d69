/* Fused dequantize-and-multiply kernels for slm's quantized linear layers.
 *
 * Loaded with ctypes (slm/model/kernels_native.py); the module init below exists only so
 * that setuptools can build and place this file like any extension. Every function here is
 * plain C over caller-owned buffers: no Python objects, no allocation that outlives a call.
 *
 * slm_matmul: out[t, r] = x[t] . dequant(row r) (+ a low-rank term) for up to SLM_MAX_JOBS
 * weights that share the input x (q, k and v; gate and up) in ONE parallel region, so a
 * decode step pays for fewer thread wake-ups. No float32 weight matrix is ever built: Q4 and
 * Q8 rows are dotted block by block straight from their bytes; NF4 rows (a table lookup per
 * value) are decoded into a small per-thread buffer first. The LoRA overlays of a weight are
 * added in the same parallel region, over the rows each thread just wrote.
 *
 * slm_dequantize: rows [start, stop) of one weight into a float32 buffer (the long-batch path,
 * where BLAS on a dequantized chunk wins).
 *
 * Block layouts are those of slm/quant (q8_0.py, q4_0.py, q4_1.py, nf4.py).
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

enum { T_Q8_0 = 0, T_Q4_0 = 1, T_Q4_1 = 2, T_NF4 = 3 };
#define SLM_MAX_JOBS 4
#define SLM_MAX_COLS 65536

static const float NF4_LEVELS[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

/* IEEE half -> float, exact for every value (normals, subnormals, inf, NaN): one instruction
 * where the CPU has F16C, else bit manipulation. */
#ifdef __F16C__
#include <immintrin.h>
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

/* One row of n values (n a multiple of the block size) into w, per type. Each inner loop
 * has a fixed trip count and no branches, so that it vectorises. */
static inline void decode_q8_0(const uint8_t *row, int n, float *restrict w) {
    for (int b = 0; b < n / 32; b++) { /* 34 bytes: d (f16), 32 int8 codes; x = d * q */
        const uint8_t *blk = row + b * 34;
        const float d = half_to_float(blk);
        const int8_t *q = (const int8_t *)(blk + 2);
        float *restrict o = w + b * 32;
        for (int j = 0; j < 32; j++) o[j] = d * (float)q[j];
    }
}

/* Q4_0 (18 bytes: d, 16 bytes; x = d * (q - 8)) and Q4_1 (20 bytes: d, m, 16 bytes;
 * x = d * q + m). Byte j holds value j in its low nibble and value j + 16 in its high. */
static inline void decode_q4(const uint8_t *row, int n, float *restrict w, const int with_min) {
    const int size = with_min ? 20 : 18;
    for (int b = 0; b < n / 32; b++) {
        const uint8_t *blk = row + b * size;
        const float d = half_to_float(blk);
        const float m = with_min ? half_to_float(blk + 2) : -8.0f * d;
        const uint8_t *q = blk + (with_min ? 4 : 2);
        float *restrict o = w + b * 32;
        for (int j = 0; j < 16; j++) o[j] = d * (float)(q[j] & 15) + m;
        for (int j = 0; j < 16; j++) o[j + 16] = d * (float)(q[j] >> 4) + m;
    }
}

/* NF4: 36 bytes per 64 values: absmax (f32), then pairs with the even element high. */
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

static inline void decode_row(int type, const uint8_t *row, int n, float *restrict w) {
    switch (type) {
    case T_Q8_0: decode_q8_0(row, n, w); break;
    case T_Q4_0: decode_q4(row, n, w, 0); break;
    case T_Q4_1: decode_q4(row, n, w, 1); break;
    case T_NF4: decode_nf4(row, n, w); break;
    }
}

/* GCC/Clang vector extensions: 16 lanes, lowered to whatever SIMD width the CPU has (one
 * AVX-512 register, two AVX2 registers, ...). Loads go through memcpy (no alignment). */
typedef float f32x16 __attribute__((vector_size(64)));
typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef int8_t i8x16 __attribute__((vector_size(16)));
typedef int16_t i16x16 __attribute__((vector_size(32)));
typedef int32_t i32x16 __attribute__((vector_size(64)));

/* Small integers to float in widening steps: GCC (12) turns a direct u8 -> f32 conversion
 * into 16 scalar instructions, and i8 -> i32 too, but each step below into vector ones. */
#define TO_F32(v) __builtin_convertvector(__builtin_convertvector((v), i32x16), f32x16)
#define I8_TO_F32(v) TO_F32(__builtin_convertvector((v), i16x16))

static inline f32x16 load_f32x16(const float *p) {
    f32x16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float sum_lanes(f32x16 v) {
    float s = 0.0f;
    for (int j = 0; j < 16; j++) s += v[j];
    return s;
}

/* x . row without materialising the row, for the types with an affine decode. Per block of
 * 32: d * (q . x_b) + m * sum(x_b), with sum(x_b) computed once per call (xsum). */
static inline float dot_q4(const uint8_t *row, int n, const float *restrict x,
                           const float *restrict xsum, const int with_min) {
    const int size = with_min ? 20 : 18;
    f32x16 acc = {0};
    float offsets = 0.0f;
    for (int b = 0; b < n / 32; b++) {
        const uint8_t *blk = row + b * size;
        const float d = half_to_float(blk);
        const float m = with_min ? half_to_float(blk + 2) : -8.0f * d;
        u8x16 q;
        memcpy(&q, blk + (with_min ? 4 : 2), sizeof q);
        const f32x16 lo = TO_F32(q & 15);  /* values 0..15 */
        const f32x16 hi = TO_F32(q >> 4);  /* values 16..31 */
        acc += d * (lo * load_f32x16(x + b * 32) + hi * load_f32x16(x + b * 32 + 16));
        offsets += m * xsum[b];
    }
    return sum_lanes(acc) + offsets;
}

static inline float dot_q8_0(const uint8_t *row, int n, const float *restrict x) {
    f32x16 acc = {0};
    for (int b = 0; b < n / 32; b++) {
        const uint8_t *blk = row + b * 34;
        const float d = half_to_float(blk);
        i8x16 q0, q1;
        memcpy(&q0, blk + 2, sizeof q0);
        memcpy(&q1, blk + 18, sizeof q1);
        acc += d * (I8_TO_F32(q0) * load_f32x16(x + b * 32) +
                    I8_TO_F32(q1) * load_f32x16(x + b * 32 + 16));
    }
    return sum_lanes(acc);
}

static inline float dot(const float *restrict a, const float *restrict b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
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

/* out[t, r] = x[t] . dequant(row r) + (A x[t]) . B[r] for every job, in one parallel region.
 * The result does not depend on the number of threads: each output is computed whole by one
 * thread, in a fixed order.
 * x (tokens, n) float32, C order. Returns 0; -1 when an argument is out of range, -2 when
 * out of memory. */
int slm_matmul(int count, const slm_job *jobs, const float *x, int64_t tokens, int64_t n) {
    if (n <= 0 || n > SLM_MAX_COLS || n % 32 != 0 || count < 1 || count > SLM_MAX_JOBS) return -1;
    int64_t total = 0, first[SLM_MAX_JOBS + 1], ranks = 0, rank_first[SLM_MAX_JOBS];
    for (int j = 0; j < count; j++) {
        if ((jobs[j].type == T_NF4 && n % 64 != 0) || jobs[j].rank < 0) return -1;
        first[j] = total;
        total += jobs[j].rows;
        rank_first[j] = ranks;
        ranks += jobs[j].rank;
    }
    first[count] = total;
    /* per thread: a decoded row (NF4); per token: the sums of x over each 32-value block, and
     * u = A x for every job's low-rank term */
    const int64_t threads = slm_threads(), blocks = n / 32;
    float *scratch = malloc(sizeof(float) * (size_t)(n * threads + tokens * (blocks + ranks)));
    if (scratch == NULL) return -2;
    float *xsum = scratch + n * threads, *u = xsum + tokens * blocks; /* u (tokens, ranks) */
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t b = 0; b < blocks; b++) {
            float s = 0.0f;
            for (int j = 0; j < 32; j++) s += x[t * n + b * 32 + j];
            xsum[t * blocks + b] = s;
        }
#pragma omp parallel
    {
        const int64_t tid = thread_index(), nth = thread_count();
        /* this thread's share of u = A x: the A factors are as many bytes as the B factors,
         * too many to stream on one thread */
        for (int64_t i = ranks * tid / nth; i < ranks * (tid + 1) / nth; i++) {
            int j = 0;
            while (j + 1 < count && i >= rank_first[j + 1]) j++;
            const int64_t k = i - rank_first[j];
            for (int64_t t = 0; t < tokens; t++) u[t * ranks + i] = dot(jobs[j].lora_a + k * n, x + t * n, (int)n);
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
            case T_Q8_0:
                for (int64_t t = 0; t < tokens; t++) o[t * job->rows] = dot_q8_0(row, (int)n, x + t * n);
                break;
            case T_Q4_0:
            case T_Q4_1:
                for (int64_t t = 0; t < tokens; t++)
                    o[t * job->rows] = dot_q4(row, (int)n, x + t * n, xsum + t * blocks, job->type == T_Q4_1);
                break;
            default: /* a table lookup per value: decode the row once, dot it per token */
                decode_row(job->type, row, (int)n, w);
                for (int64_t t = 0; t < tokens; t++) o[t * job->rows] = dot(w, x + t * n, (int)n);
            }
        }
        if (ranks > 0) {
#pragma omp barrier
        }
        /* (every u is ready) low-rank terms over the same rows: y[r] += sum_k u[k] B^T[k, r],
         * vectorised across rows (a 16-long dot per row would pay a horizontal sum per row) */
        for (int j = 0; j < count; j++) {
            const slm_job *job = &jobs[j];
            const int64_t r0 = (i0 > first[j] ? i0 : first[j]) - first[j];
            const int64_t r1 = (i1 < first[j + 1] ? i1 : first[j + 1]) - first[j];
            if (job->rank == 0 || r0 >= r1) continue;
            for (int64_t t = 0; t < tokens; t++)
                for (int64_t k = 0; k < job->rank; k++) {
                    const float uk = u[t * ranks + rank_first[j] + k], *b = job->lora_bt + k * job->rows;
                    float *restrict o = job->out + t * job->rows;
                    for (int64_t r = r0; r < r1; r++) o[r] += uk * b[r];
                }
        }
    }
    free(scratch);
    return 0;
}

/* Rows [start, stop) of one weight into out ((stop - start), n) float32, on the calling
 * thread (the caller runs several of these at once, each feeding its own BLAS call). */
int slm_dequantize(int type, const uint8_t *data, int64_t row_bytes, int64_t start, int64_t stop,
                   int64_t n, float *out) {
    if (n <= 0 || n > SLM_MAX_COLS) return -1;
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
