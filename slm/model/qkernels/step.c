/* qkernels/step.c: the fused decode step.
 *
 * slm_decode_step runs every layer of one token for each sequence of a batch in one parallel
 * region, over the same functions as the op-by-op path: team_matmul (matmul.c), attend_range
 * (attention.c), slm_rms_norm, slm_rope and gated (ops.c). slm_step_work_bytes sizes its
 * working memory. Called by slm/model/step_native.py, whose ctypes structures mirror slm_model,
 * slm_layer, slm_linear and slm_row here.
 *
 * Part of the unity build: _qkernels.c includes this file once, in dependency order; it is not
 * compiled on its own.
 */
#include "simd.h"
#include "blocks.h"

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

#define SLM_FETCH_ROWS 32 /* sequences whose keys and values the decode step fetches ahead */
#define SLM_FETCH_KV_BYTES (256 << 10) /* and at most this much of them, a thread: see step_matmul */

enum { P_Q, P_K, P_V, P_O, P_GATE, P_UP, P_DOWN, P_COUNT };

typedef struct {             /* one linear layer of the base */
    int32_t type, pad;
    const uint8_t *data;     /* (rows, row_bytes) */
    int64_t rows, row_bytes;
    const float *bias;       /* (rows) or NULL */
    const uint8_t *packed;   /* NULL, or the rows repacked for the int8 path (rows_q4x8.c) */
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
    int32_t int8;            /* 1: int8 activations for the products that take them (default mode) */
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
    int32_t *xi;             /* per thread: the sums of each 16 int8 values */
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
    TAKE(xs, float, b->xq_n / 32 * threads); TAKE(xi, int32_t, b->xq_n / 16 * threads);
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
 * attention reads (its cached positions): with a batch of rows they come cold from memory,
 * while the product itself is bound by arithmetic, not by memory. At most SLM_FETCH_KV_BYTES a
 * thread, the first sequences' (attention reads them first; the rest stream in behind): past
 * what the L2 holds beside the product's rows, the fetch evicts its own lines, and long
 * caches ran slower with all of it fetched than with none. */
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
        jobs[j] = (slm_job){w->type, 0, w->data, w->rows, w->row_bytes, outs[j], NULL, NULL, w->packed};
    }
    matmul_plan p;
    plan_matmul(&p, count, jobs, terms, B, 1, x, B, n, b->layout + b->layout_n * tid); /* (checked by step_checks) */
    if (m->int8 && n % 32 == 0) { /* each thread quantizes the (small) input itself: no barrier */
        int8_t *xq = b->xq + b->xq_n * tid;
        float *xd = b->xd + b->xq_n / 32 * tid, *xs = b->xs + b->xq_n / 32 * tid;
        int32_t *xi = b->xi + b->xq_n / 16 * tid;
        quantize_x8(x, B, n, xq, xd, xs, xi);
        p.xi = xi;
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
#pragma omp parallel SLM_TEAM_IF
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
