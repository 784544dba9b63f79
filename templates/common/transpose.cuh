// Byte transposes for the FP8 transposed (column-wise) copies.
//
// A thread reads 16 rows x 4 columns of staged FP8 bytes as 16 32-bit words (one per row), turns
// them into 4 columns x 16 rows with byte permutes (PRMT), and stores each column's 16 bytes with
// one 16-byte store into the [cols, rows] transposed tensor (rows % 16 == 0; other row counts
// store bytes).
#ifndef OPFUSE_TEMPLATES_COMMON_TRANSPOSE_CUH_
#define OPFUSE_TEMPLATES_COMMON_TRANSPOSE_CUH_

#include "types.cuh"

namespace opfuse {

// rows[i] holds bytes (column 0..3) of row i; columns[k] receives bytes (row 0..15) of column k,
// row 0 in the lowest byte (little-endian order, the memory order of the transposed tensor).
__device__ __forceinline__ void transpose_16x4_bytes(const unsigned int (&rows)[16],
                                                     uint4 (&columns)[4]) {
  unsigned int quads[4][4];  // quads[k][q]: column k, rows 4q..4q+3
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const unsigned int r0 = rows[4 * q], r1 = rows[4 * q + 1];
    const unsigned int r2 = rows[4 * q + 2], r3 = rows[4 * q + 3];
    // Interleave pairs of rows, then pairs of pairs (selector nibbles pick bytes 0-3 of the first
    // operand and 4-7 of the second).
    const unsigned int low01 = __byte_perm(r0, r1, 0x5140);   // r0.b0 r1.b0 r0.b1 r1.b1
    const unsigned int low23 = __byte_perm(r2, r3, 0x5140);   // r2.b0 r3.b0 r2.b1 r3.b1
    const unsigned int high01 = __byte_perm(r0, r1, 0x7362);  // r0.b2 r1.b2 r0.b3 r1.b3
    const unsigned int high23 = __byte_perm(r2, r3, 0x7362);  // r2.b2 r3.b2 r2.b3 r3.b3
    quads[0][q] = __byte_perm(low01, low23, 0x5410);
    quads[1][q] = __byte_perm(low01, low23, 0x7632);
    quads[2][q] = __byte_perm(high01, high23, 0x5410);
    quads[3][q] = __byte_perm(high01, high23, 0x7632);
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    columns[k] = make_uint4(quads[k][0], quads[k][1], quads[k][2], quads[k][3]);
  }
}

// Stores one column segment of a transposed tensor byte by byte, straight from the staged tile
// (byte i at column[i * pitch]): up to 16 bytes, at most rows_left. The path of row counts that
// are not a multiple of 16, where segments are not 16-byte aligned; reading shared memory again
// keeps it free of the 16-word transpose's registers (the tiled kernels' budgets are tight).
__device__ __forceinline__ void store_column_bytes(unsigned char* dst, const unsigned char* column,
                                                   int pitch, long long rows_left) {
  const int count = rows_left < 16 ? static_cast<int>(rows_left) : 16;
#pragma unroll 1
  for (int i = 0; i < count; ++i) dst[i] = column[i * pitch];
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_COMMON_TRANSPOSE_CUH_
