/* slm's C kernels: the quantized products, attention and the fused decode step of
 * slm/model/kernels_native.py and slm/model/step_native.py, which load them with ctypes.
 *
 * This file is the one translation unit that setup.py compiles (a unity build), once per CPU
 * variant (slm/model/cpu_variants.py: the same source under each variant's -march flags, into
 * the module _qkernels_<SLM_VARIANT>, through the one-line sources of variants/): it includes
 * the kernel sources of slm/model/qkernels/ in dependency order, and adds the Python module
 * glue at the end. One translation unit keeps every helper `static inline` and visible to the
 * compiler at each call site, so the kernels are inlined and vectorised as if written in one
 * file; the sources in qkernels/ are not compiled on their own.
 *
 * Every exported function is plain C over caller-owned buffers: no Python objects, no
 * allocation that outlives a call. Status codes: 0 done, -1 an argument refused (a shape, a
 * type or a job count the Python side should never pass), -2 out of memory for scratch.
 *
 * The kernel map (the files in include order; docs/kernels.md has the same map with the
 * Python callers):
 *
 *   qkernels/simd.h       the CPU: OpenMP thread helpers, float16 loads, the vector type vf
 *                         (LANES floats) and its lane operations
 *   qkernels/vec.h        float vector math: fused multiply-add, exp, dot products of floats
 *   qkernels/blocks.h     the block formats: GGML type ids, the block table, per type the
 *                         decoding of a block's scales and codes, a whole row into floats
 *   qkernels/rows.c       products, float path: rows of one weight against up to SLM_FTILE
 *                         rows of x, in register tiles
 *   qkernels/rows_q8.c    products, int8 path (the default mode): x quantized per 32 values,
 *                         integer dot products per block
 *   qkernels/rows_q8k.c   the same for the K types Q4_K, Q5_K, Q6_K: integer dot products
 *                         per 32 values of a super-block, unit scales applied in integers
 *   qkernels/rows_q4x8.c  the same for Q4_0 rows repacked eight at a time: eight rows'
 *                         products in one vector
 *   qkernels/rows_q5x8.c  the packed layout of Q5_0 rows (its kernel: gemm_packed.c)
 *   qkernels/rows_q6kx8.c the same for Q6_K, and slm_pack, the entry point of the packed layouts
 *   qkernels/gemm_packed.c a prompt's products over the packed layouts: eight rows times
 *                         four rows of x in registers, the GEMV kernels' bits
 *   qkernels/low_rank.c   LoRA terms, y += (A x) B^T: float32 factors, or the int8 mode's
 *                         (A in Q8_0 rows, B^T in halves)
 *   qkernels/matmul.c     products over many weights: slm_matmul, slm_matmul_rows (one
 *                         parallel region, LoRA terms added in it), slm_dequantize
 *   qkernels/attention.c  attention: slm_attend_one (a decode step's query), slm_attend_causal
 *                         (a prompt's queries, in tiles; slm_attend_causal_team on the team)
 *   qkernels/ops.c        the small ops of a layer: slm_rms_norm, slm_rope, slm_swiglu,
 *                         slm_geglu
 *   qkernels/step.c       the fused decode step: slm_decode_step, every layer of one token per
 *                         sequence in one parallel region
 *   _qkernels.c (here)    slm_f32_all_finite and the Python module (f32_all_finite,
 *                         cpu_supports)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h> /* first, as Python's headers require */

#include "qkernels/simd.h"
#include "qkernels/vec.h"
#include "qkernels/blocks.h"
#include "qkernels/rows.c"
#include "qkernels/rows_q8.c"
#include "qkernels/rows_q8k.c"
#include "qkernels/rows_q4x8.c"
#include "qkernels/rows_q5x8.c"
#include "qkernels/rows_q6kx8.c"
#include "qkernels/gemm_packed.c"
#include "qkernels/low_rank.c"
#include "qkernels/matmul.c"
#include "qkernels/attention.c"
#include "qkernels/ops.c"
#include "qkernels/step.c"

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

/* cpu_supports(name) -> bool: whether this CPU, and the OS's saving of its registers, has a
 * feature a variant requires (slm/model/cpu_variants.py), by cpuid: the baseline module, which
 * every x86-64 runs, answers for the others before one is loaded. */
static PyObject *py_cpu_supports(PyObject *self, PyObject *arg) {
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL) return NULL;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
#if defined(__clang__) || __GNUC__ < 12 /* (no ISA level names: their defining features) */
    int v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
             __builtin_cpu_supports("bmi2");
    int v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
#else
    int v3 = __builtin_cpu_supports("x86-64-v3"), v4 = __builtin_cpu_supports("x86-64-v4");
#endif
    if (strcmp(name, "x86-64-v3") == 0) return PyBool_FromLong(v3);
    if (strcmp(name, "x86-64-v4") == 0) return PyBool_FromLong(v4);
    if (strcmp(name, "avx512vnni") == 0) return PyBool_FromLong(__builtin_cpu_supports("avx512vnni"));
#endif
    return PyErr_Format(PyExc_ValueError, "no CPU feature %s here", name);
}

#define SLM_STR2(x) #x
#define SLM_STR(x) SLM_STR2(x)
#define SLM_CAT2(a, b) a##b
#define SLM_CAT(a, b) SLM_CAT2(a, b)

static PyMethodDef methods[] = {
    {"f32_all_finite", py_f32_all_finite, METH_O, "Whether the little-endian float32 values in a buffer are all finite."},
    {"cpu_supports", py_cpu_supports, METH_O, "Whether this CPU has a feature a kernel variant requires."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_qkernels_" SLM_STR(SLM_VARIANT),
                                    "C kernels, called through ctypes (and f32_all_finite directly).", -1, methods};

PyMODINIT_FUNC SLM_CAT(PyInit__qkernels_, SLM_VARIANT)(void) { return PyModule_Create(&module); }
