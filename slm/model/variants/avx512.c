/* The avx512 variant of the kernels (slm/model/cpu_variants.py): a source of its own only so
 * that each variant compiles to an object of its own; setup.py defines SLM_VARIANT. */
#include "../_qkernels.c"
