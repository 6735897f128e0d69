/* qkernels/rows_q5x8.c: Q5_0 weights repacked eight rows at a time (Gemma 3's q, k, gate and up
 * in its Q4_K_M file), int8 path.
 *
 * pack_q5_0 builds the layout (derived data, in memory, as rows_q4x8.c's: packed_copies.packed
 * through slm_pack, rows_q6kx8.c); gemm_q5x8 (gemm_packed.c) multiplies one group of eight
 * rows by up to SLM_TILE rows of int8 x, for one token and for a prompt's chunk alike.
 *
 * Why: on the row-by-row int8 path (rows_q8.c) a prompt's chunk ran twice as slow as the
 * dequantized BLAS product, and the BLAS product was most of Gemma 3's prefill in the int8
 * mode; packed, a block's 256 codes of eight rows are a Q4_0 block's four vectors of nibbles
 * plus one vector of fifth bits.
 *
 * Part of the unity build: _qkernels.c includes this file once, in dependency order; it is not
 * compiled on its own.
 */
#include "simd.h"
#include "blocks.h"

/* A packed block: block b of the eight rows 8g .. 8g + 7, at (g * blocks + b) * Q5X8_BYTES:
 * their eight d (float16); four 32-byte vectors V0..V3 of the codes' low 4 bits laid out as a
 * packed Q4_0 block's (rows_q4x8.c: group k, values 4k .. 4k + 3 of each row, is V_k's low
 * nibbles for k < 4 and V_(k-4)'s high ones after); then one 32-byte vector H whose byte 4r + i
 * holds in bit k the fifth bit of value 4k + i of row r. As many bytes as the rows' own
 * (8 x 22). Codes are q + 16, 0..31. */
#define Q5X8_BYTES 176

static void pack_q5_0(const uint8_t *data, int64_t rows, int64_t row_bytes, int64_t n, uint8_t *out) {
    const int64_t blocks = n / 32, groups = rows / 8;
#pragma omp parallel for SLM_TEAM_IF schedule(static)
    for (int64_t g = 0; g < groups; g++)
        for (int64_t b = 0; b < blocks; b++) {
            uint8_t *o = out + (g * blocks + b) * Q5X8_BYTES;
            for (int r = 0; r < 8; r++) {
                const uint8_t *blk = data + (8 * g + r) * row_bytes + 22 * b;
                uint32_t qh;
                memcpy(o + 2 * r, blk, 2);
                memcpy(&qh, blk + 2, 4);
                /* a Q5_0 block's qs byte j: value j (low nibble), value j + 16 (high): word j
                 * of V_j's row r is word j of the row's qs, as for Q4_0 */
                for (int j = 0; j < 4; j++) memcpy(o + 16 + 32 * j + 4 * r, blk + 6 + 4 * j, 4);
                for (int i = 0; i < 4; i++) {
                    uint8_t h = 0;
                    for (int k = 0; k < 8; k++) h |= (uint8_t)((qh >> (4 * k + i) & 1u) << k);
                    o[144 + 4 * r + i] = h;
                }
            }
        }
}
