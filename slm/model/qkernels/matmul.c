/* qkernels/matmul.c: products over many weights sharing one input.
 *
 * slm_matmul (kernels_native.py's matmul_many: q, k, v or gate, up in one parallel region),
 * slm_matmul_rows (the server's batch: each row of x with its own LoRA terms) and
 * slm_dequantize (the prompt path: rows of a weight into floats for BLAS). A product is
 * planned (plan_matmul), then run by a team of threads (team_matmul): rows split between the
 * threads (block_rows, over rows.c, rows_q8.c, rows_q8k.c and the packed rows_q4x8.c,
 * rows_q6kx8.c), the next bytes prefetched, and the
 * low-rank terms added over the rows each thread just wrote (low_rank.c). step.c runs its
 * products through the same team_matmul inside its own parallel region.
 *
 * Part of the unity build: _qkernels.c includes this file once, in dependency order; it is not
 * compiled on its own.
 */
#include "simd.h"
#include "vec.h"
#include "blocks.h"

#define SLM_MAX_JOBS 4

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
    const uint8_t *packed; /* NULL, or the rows repacked for the int8 path (rows_q4x8.c, Q4_0) */
    const uint8_t *lora_a8;    /* NULL, or A as Q8_0 rows: the int8 mode's factors (see slm_term) */
    const uint16_t *lora_bt16; /* NULL, or lora_bt as IEEE halves */
} slm_job;

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
    const int32_t *xi;         /* (tokens, n / 16): the sums of xq over each 16 values */
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
                if (lead[s * count + j] && b->rank == a->rank && b->a == a->a && b->bt == a->bt && b->a8 == a->a8 &&
                    b->bt16 == a->bt16) {
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
 * cold from memory (a decode step streams all the weights past them), and fetched during the
 * rows they cost less of a token. A hint only: ranges past SLM_PREFETCH_RANGES are left out (a
 * factor B^T is a range per rank, so that a batch of rows on several adapters of rank 16
 * takes over a hundred in the q, k, v product). */
#define SLM_PREFETCH_RANGES 512
#define SLM_ALIGN 64 /* bytes: a cache line, an AVX-512 vector */
#define SLM_CHUNK_ROWS 16 /* rows of a weight between two prefetch_some calls */
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
        if (p->xq != NULL && job->packed != NULL && PACKED_TYPE(job->type) && tokens > SLM_TILE) { /* a prompt's: blocks */
            prefetch_some(fetch, per_row * (r1 - r0));
            packed_rows_blocked(job->type, job->packed, (int)n, p->xq, p->xd, p->xs, p->xi, tokens, job->out, job->rows, r0, r1);
            continue;
        }
        for (int64_t c0 = r0; c0 < r1; c0 += SLM_CHUNK_ROWS) { /* chunks: the prefetches spread over the rows */
            const int64_t c1 = c0 + SLM_CHUNK_ROWS < r1 ? c0 + SLM_CHUNK_ROWS : r1;
            prefetch_some(fetch, per_row * (c1 - c0));
            if (p->xq != NULL && job->packed != NULL && PACKED_TYPE(job->type)) { /* gemm_packed.c */
                packed_rows_blocked(job->type, job->packed, (int)n, p->xq, p->xd, p->xs, p->xi, tokens, job->out, job->rows, c0, c1);
                continue;
            }
            if (p->xq != NULL && INT8_TYPE(job->type)) {
                for (int64_t r = c0; r < c1; r++) {
                    const uint8_t *row = job->data + r * job->row_bytes;
                    switch (job->type) {
#define DOT8(T) case T: dot_tiles_q8(T, row, (int)n, p->xq, p->xd, p->xs, tokens, job->out + r, job->rows); break;
#define DOT8K(T) case T: dot_tiles_q8k(T, row, (int)n, p->xq, p->xd, p->xs, tokens, job->out + r, job->rows); break;
                        DOT8(T_Q4_0) DOT8(T_Q4_1) DOT8(T_Q5_0) DOT8(T_Q5_1) DOT8(T_Q8_0)
                        DOT8K(T_Q4_K) DOT8K(T_Q5_K) DOT8K(T_Q6_K)
#undef DOT8K
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
    /* each thread takes one contiguous range of rows (of all jobs), the same in both loops,
     * starting at a multiple of 8 (a packed group of rows_q4x8.c computed by one thread) */
    const int64_t i0 = tid == 0 ? 0 : p->total * tid / nth / 8 * 8;
    const int64_t i1 = tid + 1 == nth ? p->total : p->total * (tid + 1) / nth / 8 * 8;
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
            int64_t a_row;
            const char *a = term_a(term, p->xq != NULL, n, &a_row);
            if (u0 < u1) prefetch_add(&fetch, a + 4 * u0 * a_row, a_row * (k1 - 4 * u0));
            g += (term->rank + 3) / 4;
        }
    for (int j = 0; j < count && p->ranks > 0; j++) {
        int64_t r0, r1;
        job_rows_of(p, j, i0, i1, &r0, &r1);
        for (int64_t t = 0; t < tokens && r0 < r1; t++) {
            if (!p->lead[t * count + j]) continue;
            const slm_term *term = term_of(p, t, j);
            for (int64_t k = 0; k < term->rank; k++) {
                int64_t bytes;
                const char *at = term_bt_span(term, p->xq != NULL, p->jobs[j].rows, k, r0, r1, &bytes);
                prefetch_add(&fetch, at, bytes);
            }
        }
    }
    for (int i = 0; i < p->after_count; i++) prefetch_add(&fetch, p->after_at[i], p->after_bytes[i]);
    const int64_t per_row = i1 > i0 ? fetch.lines / (i1 - i0) + 1 : 0;
    if (p->claim == NULL || tokens == 1) {
        block_rows(p, i0, i1, &fetch, per_row);
    } else { /* a fixed share each, then the rest taken in shrinking pieces by whichever thread
              * is free: the cores of a VM do not run at one speed, and at a barrier the
              * faster one waits for the other (one row of x, memory-bound, gains nothing and
              * keeps the static shares) */
        const int64_t fixed = p->total * 3 / (4 * nth) / 8 * 8, rest = fixed * nth;
        block_rows(p, fixed * tid, fixed * (tid + 1), &fetch, per_row);
        for (;;) {
            const int64_t left = p->total - rest - __atomic_load_n(p->claim, __ATOMIC_RELAXED);
            if (left <= 0) break;
            const int64_t size = ((left / (2 * nth) > 32 ? left / (2 * nth) : 32) + 7) / 8 * 8;
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
                for (int64_t s = t; s >= 0; s = p->next[s * count + j]) {
                    const int64_t at = s * (n / 32); /* (x's int8 blocks, when it has them) */
                    term_u(term, p->x + s * n, p->xq ? p->xq + s * n : NULL, p->xd ? p->xd + at : NULL,
                           p->xs ? p->xs + at : NULL, n, k, size, p->u + p->u_at[s * count + j]);
                }
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
            if (p->lead[t * count + j]) {
                const term_group g = {t, p->jobs[j].rows, count, j, p->u, p->u_at, p->next, p->jobs[j].out};
                add_low_rank_rows(term_of(p, t, j), p->xq != NULL, &g, r0, r1);
            }
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
    /* rows_scratch (n a thread), u, then with int8 activations xd, xs, xi and xq */
    float *scratch = malloc(sizeof(float) * (size_t)(n * threads + p.ranks + 4 * blocks) +
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
        int32_t *xi = (int32_t *)(xs + blocks);
        int8_t *xq = (int8_t *)(xi + 2 * blocks);
        quantize_x8(x, tokens, n, xq, xd, xs, xi);
        p.xi = xi;
        p.xq = xq;
        p.xd = xd;
        p.xs = xs;
    }
    int64_t claim = 0;
    p.claim = &claim;
#pragma omp parallel SLM_TEAM_IF
    team_matmul(&p);
    free(aligned);
    free(scratch);
    free(layout);
    return 0;
}

/* out[t, r] = x[t] . dequant(row r) + (A x[t]) . B[r] for every job, in one parallel region.
 * The result does not depend on the number of threads, nor on the other rows of x: each
 * output is computed whole by one thread, in a fixed order. int8: int8 activations (rows_q8.c).
 * x (tokens, n) float32, C order. Returns 0; -1 when an argument is out of range, -2 when
 * out of memory. */
int slm_matmul(int count, const slm_job *jobs, const float *x, int64_t tokens, int64_t n, int int8) {
    if (count < 1 || count > SLM_MAX_JOBS) return -1;
    slm_term terms[SLM_MAX_JOBS];
    for (int j = 0; j < count; j++)
        terms[j] = (slm_term){jobs[j].rank, jobs[j].lora_a, jobs[j].lora_bt, jobs[j].lora_a8, jobs[j].lora_bt16};
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
