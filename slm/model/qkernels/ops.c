/* qkernels/ops.c: a layer's small element-wise ops.
 *
 * slm_rms_norm, slm_rope, slm_swiglu and slm_geglu (gated): called by kernels_native.py one
 * op at a time, and by step.c's fused step as the very same functions, so that both paths
 * give the same bits.
 *
 * Part of the unity build: _qkernels.c includes this file once, in dependency order; it is not
 * compiled on its own.
 */
#include "simd.h"
#include "vec.h"

/* ---- the rest of a decode step: small, single-threaded, no thread wake-ups ----------
 * (noinline: the decode step (step.c) calls these same functions, so that an op run alone and
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
