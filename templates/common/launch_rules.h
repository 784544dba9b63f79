// Launch geometry of every kernel family in templates/, as constexpr functions.
//
// This file is plain C++17 with no CUDA dependency on purpose: the device templates derive their
// block shapes from it, and the host-side codegen/runtime can include the very same file to compute
// block size, grid size and dynamic shared memory, so the two sides can never disagree.
// templates/README.md explains every rule in words.
#ifndef OPFUSE_TEMPLATES_COMMON_LAUNCH_RULES_H_
#define OPFUSE_TEMPLATES_COMMON_LAUNCH_RULES_H_

// Under nvcc/NVRTC the functions must be callable from device code (NVRTC rejects host functions);
// a host compiler sees plain constexpr functions.
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define OPFUSE_LAUNCH_RULE __host__ __device__ constexpr
#else
#define OPFUSE_LAUNCH_RULE constexpr
#endif

namespace opfuse {
namespace launch {

inline constexpr int kWarpSize = 32;
// Every global access of a family is one 16-byte vector per thread (LDG.128/STG.128).
inline constexpr int kVectorBytes = 16;

OPFUSE_LAUNCH_RULE long long ceil_div(long long numerator, long long denominator) {
  return (numerator + denominator - 1) / denominator;
}
OPFUSE_LAUNCH_RULE long long min_of(long long a, long long b) { return a < b ? a : b; }
OPFUSE_LAUNCH_RULE long long max_of(long long a, long long b) { return a > b ? a : b; }

// Register budgets. Every kernel states __launch_bounds__(threads, min_blocks(threads, budget)):
// without a minimum-blocks hint, ptxas (CUDA 13) picks its own occupancy target and can spill a
// kernel that would fit easily; with it, the budget is an upper bound that the kernels stay under
// without spilling (tests/unit/test_templates_compile.cpp checks both).
inline constexpr int kRegistersPerSm = 65536;
OPFUSE_LAUNCH_RULE int min_blocks(int block_threads, int register_budget) {
  return static_cast<int>(
      max_of(1, kRegistersPerSm / (static_cast<long long>(block_threads) * register_budget)));
}
// Measured on H200 (templates/README.md, "Performance"): the streaming kernels run best with 1024
// resident threads per SM (64 registers: RMSNorm to FP8 3.43 TB/s at 64 vs 3.18 at 80); kernels
// that cannot fit 64 without spilling get 80 or 128, decided by the rules below from their
// template parameters.
inline constexpr int kNormBwdRegisterBudget = 64;
inline constexpr int kSmallKernelRegisterBudget = 64;  // amax, scale update, column reduction
inline constexpr int kTileRegisterBudget = 64;
inline constexpr int kTileTransposeRegisterBudget = 80;
inline constexpr int kTileWideRegisterBudget = 128;

// Norm forward: the transposed path holds one 512-thread block per SM (its staged tile fills
// shared memory), so it may use 128. The others keep the row packed between passes (norm.cuh):
// RMSNorm fits 64 for any output; LayerNorm (two reductions per row) takes 80 (64 and 72 spill on
// sm_89 or sm_100a): 6 blocks of 128 threads per SM where 96 left 5 (H200, in the seed MLP's
// pipeline: the bf16 layernorm 80 -> 76-77 us, 81% -> 84-85% of copy).
OPFUSE_LAUNCH_RULE int norm_fwd_register_budget(bool is_rms, bool write_transpose) {
  return write_transpose ? 128 : (is_rms ? 64 : 80);
}

// Tiled families: one budget level (64 -> 80 -> 128) per source of pressure, found by compiling
// every instantiation of tests/unit/test_templates_compile.cpp for sm_89/sm_90a/sm_100a:
//   - the transposed write phase (with one input vector, 4 passes in flight spill 20 bytes at 64
//     on sm_90a);
//   - a second input vector with fp32 inputs, or with both the transposed copy and dbias.
// Three input vectors per element (gated backward, bias + residual) take 128 with dbias sums or
// fp32 inputs; 2-byte inputs without dbias fit 80, which keeps 3 blocks per SM instead of 2 (the
// bf16 SwiGLU backward to E5M2 + transposed copy went from 77% to 90% of copy on an H100).
OPFUSE_LAUNCH_RULE int tile_register_budget_level(int input_bytes, int loads_per_element,
                                                  bool write_transpose, bool dbias) {
  return loads_per_element >= 3
             ? (dbias || input_bytes == 4 ? 2 : 1)
             : (write_transpose ? 1 : 0) +
                   (loads_per_element >= 2 && (input_bytes == 4 || (write_transpose && dbias)) ? 1
                                                                                               : 0);
}
// With statistics (kStats: double-precision accumulators per thread) one level wider.
OPFUSE_LAUNCH_RULE int tile_register_budget(int input_bytes, int loads_per_element,
                                            bool write_transpose, bool dbias, bool stats = false) {
  return min_of(2,
                tile_register_budget_level(input_bytes, loads_per_element, write_transpose, dbias) +
                    (stats ? 1 : 0)) == 0
             ? kTileRegisterBudget
         : min_of(2, tile_register_budget_level(input_bytes, loads_per_element, write_transpose,
                                                dbias) +
                         (stats ? 1 : 0)) == 1
             ? kTileTransposeRegisterBudget
             : kTileWideRegisterBudget;
}

// Elements of a 16-byte vector of an input dtype: 8 for bf16/fp16, 4 for fp32.
OPFUSE_LAUNCH_RULE int vector_elems(int input_bytes) { return kVectorBytes / input_bytes; }

// ---------------------------------------------------------------------------------------------
// Normalization (norm.cuh). A "row group" of threads_per_row threads owns one row; a block holds
// rows_per_block groups. Each thread keeps vecs_per_thread vectors of the row in registers, so one
// row is read from memory once for statistics and normalization together.
// ---------------------------------------------------------------------------------------------
inline constexpr int kNormMaxThreadsPerRow = 1024;
// Forward keeps 4 vectors per thread (TE's tuned 4096-wide kernels use the same 128x4 shape);
// backward also holds dgamma/dbeta accumulators, so it keeps 1 to fit 64 registers (with 2 it
// needed 128 and half the occupancy).
inline constexpr int kNormFwdMaxVecsPerThread = 4;
inline constexpr int kNormBwdMaxVecsPerThread = 1;
// Threads a block aims for when one row needs fewer (several rows per block then). Small blocks
// keep the rows' reduction barriers independent: 128 beat 256 and 512 for a 4096-wide row (H200).
// The forward without a transposed copy aims for 256 instead: its blocks each hold an fp32 copy
// of gamma/beta (norm_affine_shared_bytes), and half as many blocks per SM share those (H200,
// [16384, 4096] bf16 alone: the FP8-output layernorm 65 -> 63 us, the bf16 one 77.5 -> 75.5 us).
inline constexpr int kNormTargetBlockThreads = 128;
inline constexpr int kNormFwdTargetBlockThreads = 256;

OPFUSE_LAUNCH_RULE int norm_vecs_per_row(int hidden, int input_bytes) {
  return hidden / vector_elems(input_bytes);
}
OPFUSE_LAUNCH_RULE int norm_vecs_per_thread(int hidden, int input_bytes, int max_vecs_per_thread) {
  return static_cast<int>(max_of(
      min_of(max_vecs_per_thread, ceil_div(norm_vecs_per_row(hidden, input_bytes), kWarpSize)),
      ceil_div(norm_vecs_per_row(hidden, input_bytes), kNormMaxThreadsPerRow)));
}
OPFUSE_LAUNCH_RULE int norm_threads_per_row(int hidden, int input_bytes, int max_vecs_per_thread) {
  return static_cast<int>(
      ceil_div(ceil_div(norm_vecs_per_row(hidden, input_bytes),
                        norm_vecs_per_thread(hidden, input_bytes, max_vecs_per_thread)),
               kWarpSize) *
      kWarpSize);
}
OPFUSE_LAUNCH_RULE int norm_rows_per_block(int hidden, int input_bytes, int max_vecs_per_thread) {
  return static_cast<int>(max_of(
      1, kNormTargetBlockThreads / norm_threads_per_row(hidden, input_bytes, max_vecs_per_thread)));
}
OPFUSE_LAUNCH_RULE int norm_block_threads(int hidden, int input_bytes, int max_vecs_per_thread) {
  return norm_threads_per_row(hidden, input_bytes, max_vecs_per_thread) *
         norm_rows_per_block(hidden, input_bytes, max_vecs_per_thread);
}

// The forward with a transposed FP8 copy stages a tile of normalized FP8 rows in dynamic shared
// memory, then writes each column's bytes of the tile as one segment of y_t. 32-row tiles give
// whole 32-byte sectors per column (16-byte segments run at half the bandwidth, measured); rows
// too wide for a 32-row tile in shared memory fall back to 16-row tiles.
inline constexpr int kMaxDynamicSharedBytes = 227 * 1024;  // sm_90 / sm_100 opt-in limit per block
// Staged row pitch: hidden + 4 bytes, so the two 16-row halves that one warp reads in the write
// phase fall on different banks.
OPFUSE_LAUNCH_RULE int norm_transpose_stage_pitch(int hidden) { return hidden + 4; }
OPFUSE_LAUNCH_RULE int norm_transpose_tile_rows(int hidden) {
  return 32LL * norm_transpose_stage_pitch(hidden) <= kMaxDynamicSharedBytes ? 32 : 16;
}
OPFUSE_LAUNCH_RULE int floor_power_of_2(int value) {
  return value >= 2 ? 2 * floor_power_of_2(value / 2) : 1;
}
// One block per SM (the staged tile fills shared memory), so it holds 512 threads: a power-of-2
// number of row groups, which divides the tile rows.
inline constexpr int kNormTransposeTargetBlockThreads = 512;
OPFUSE_LAUNCH_RULE int norm_transpose_rows_per_block(int hidden, int input_bytes) {
  return static_cast<int>(
      min_of(norm_transpose_tile_rows(hidden),
             floor_power_of_2(static_cast<int>(max_of(
                 1, kNormTransposeTargetBlockThreads /
                        norm_threads_per_row(hidden, input_bytes, kNormFwdMaxVecsPerThread))))));
}
OPFUSE_LAUNCH_RULE int norm_fwd_rows_per_block(int hidden, int input_bytes, bool write_transpose) {
  return write_transpose
             ? norm_transpose_rows_per_block(hidden, input_bytes)
             : static_cast<int>(max_of(
                   1, kNormFwdTargetBlockThreads /
                          norm_threads_per_row(hidden, input_bytes, kNormFwdMaxVecsPerThread)));
}
OPFUSE_LAUNCH_RULE int norm_fwd_block_threads(int hidden, int input_bytes, bool write_transpose) {
  return norm_threads_per_row(hidden, input_bytes, kNormFwdMaxVecsPerThread) *
         norm_fwd_rows_per_block(hidden, input_bytes, write_transpose);
}
OPFUSE_LAUNCH_RULE int norm_fwd_dynamic_smem_bytes(int hidden, bool write_transpose) {
  return write_transpose ? norm_transpose_tile_rows(hidden) * norm_transpose_stage_pitch(hidden)
                         : 0;
}
// Norm forward: gamma (+ 1 when zero-centered) and beta are widened to fp32 once per block into
// shared memory, so each row's last pass reads float4s instead of converting gamma/beta again
// (two conversions per element fewer: the FP8-output layernorm is instruction-bound on H200).
// Only within kNormAffineBlockBytes per block and kNormAffineSmBytes for the blocks resident on
// an SM (next to the transposed path's staged tile); otherwise gamma/beta are read per row.
inline constexpr int kNormAffineBlockBytes = 32 * 1024;
inline constexpr int kNormAffineSmBytes = 200 * 1024;
OPFUSE_LAUNCH_RULE int norm_affine_shared_bytes(int hidden, int input_bytes, bool is_rms,
                                                bool write_transpose) {
  const long long bytes = (is_rms ? 1LL : 2LL) * hidden * 4;
  const long long resident = write_transpose
                                 ? 1
                                 : min_blocks(norm_fwd_block_threads(hidden, input_bytes, false),
                                              norm_fwd_register_budget(is_rms, false));
  const long long tile = norm_fwd_dynamic_smem_bytes(hidden, write_transpose);
  return bytes <= kNormAffineBlockBytes && resident * bytes <= kNormAffineSmBytes &&
                 tile + bytes <= kMaxDynamicSharedBytes
             ? static_cast<int>(bytes)
             : 0;
}
OPFUSE_LAUNCH_RULE int norm_bwd_rows_per_block(int hidden, int input_bytes) {
  return norm_rows_per_block(hidden, input_bytes, kNormBwdMaxVecsPerThread);
}
OPFUSE_LAUNCH_RULE int norm_bwd_block_threads(int hidden, int input_bytes) {
  return norm_block_threads(hidden, input_bytes, kNormBwdMaxVecsPerThread);
}
// Norm backward: each thread's dgamma (and dbeta) partial sums live in shared memory when the
// block's fit in kNormBwdSharedPartialsBytes (each thread owns its slots: no atomics, the same
// addition order as registers). The registers they free hold a second row, so a row group takes
// two of its rows per step when a row is one vector per thread: both rows' loads in flight
// together and their four sums behind one barrier (one row per step at 64 registers left 2 rows in
// flight per SM and no loads during a row's reduction and stores; H100, [16384, 4096] bf16: 167 ->
// 146 us, 82% -> 94% of copy). Otherwise one row per step (partials in registers where they
// do not fit in shared memory).
inline constexpr int kNormBwdSharedPartialsBytes = 32 * 1024;
OPFUSE_LAUNCH_RULE int norm_bwd_partials_shared_bytes(int hidden, int input_bytes, bool is_rms) {
  const long long bytes =
      (is_rms ? 1LL : 2LL) * norm_vecs_per_thread(hidden, input_bytes, kNormBwdMaxVecsPerThread) *
      vector_elems(input_bytes) * 4 * norm_bwd_block_threads(hidden, input_bytes);
  return bytes <= kNormBwdSharedPartialsBytes ? static_cast<int>(bytes) : 0;
}
OPFUSE_LAUNCH_RULE int norm_bwd_rows_per_step(int hidden, int input_bytes, bool is_rms) {
  return norm_bwd_partials_shared_bytes(hidden, input_bytes, is_rms) > 0 &&
                 norm_vecs_per_thread(hidden, input_bytes, kNormBwdMaxVecsPerThread) == 1
             ? 2
             : 1;
}

// ---------------------------------------------------------------------------------------------
// Tiled elementwise families (cast_transpose.cuh, activation.cuh, bias.cuh): a block of 256
// threads owns a 128 x 64 tile of the output plane (128 rows, not 64: twice the loads between
// the barriers of the transposed copy, 76-80% -> 80-83% of copy on an H200); blockIdx.x picks the
// column tile, blockIdx.y walks the row tiles with a stride of gridDim.y.
// ---------------------------------------------------------------------------------------------
// Statistics a tiled kernel computes of a tensor it reads or produces anyway (the precision-debug
// features, docs/debugging.md, "Statistics fused into kernels"): the bits of its kStats.
inline constexpr int kStatsOfInput = 1;   // the op's first input, as loaded
inline constexpr int kStatsOfOutput = 2;  // its output's values rounded to StatsAs (the
                                          // high-precision tensor a folded FP8 cast replaces)
inline constexpr int kTileThreads = 256;
// templates/row_expr.cuh (norm-like user-defined ops): a block per row, grid-stride over the rows
// with at most this many blocks per SM; its learned parameters' column sums are one partial row
// per block.
inline constexpr int kRowExprThreads = 256;
inline constexpr int kRowExprBlocksPerSm = 4;
inline constexpr int kTileRows = 128;
inline constexpr int kTileCols = 64;
inline constexpr int kTileMaxGridY = 65535;

// A thread issues the loads of a batch of passes before converting any: 64 bytes per thread, and at
// least 2 passes (4 passes of one bf16 input, 2 of SwiGLU's two or the backward's three inputs).
// On an H200, 4 passes instead of 2 took the bf16 cast to E4M3 from 86% to 98% of copy, and with
// the transposed copy from 80-83% to 82-85% (80 registers; 86-88% at 64 with 20 bytes spilled);
// 4 passes of 2- or 3-input kernels spilled.
inline constexpr int kTileBatchBytesPerThread = 64;
OPFUSE_LAUNCH_RULE int tile_passes_per_batch(int passes, int loads_per_element) {
  return static_cast<int>(
      min_of(passes, floor_power_of_2(static_cast<int>(max_of(
                         2, kTileBatchBytesPerThread / (kVectorBytes * loads_per_element))))));
}

OPFUSE_LAUNCH_RULE int tile_grid_x(int cols) { return static_cast<int>(ceil_div(cols, kTileCols)); }
OPFUSE_LAUNCH_RULE int tile_grid_y(long long rows) {
  return static_cast<int>(max_of(1, min_of(ceil_div(rows, kTileRows), kTileMaxGridY)));
}

// ---------------------------------------------------------------------------------------------
// Block-scaled FP8 cast (block_cast.cuh, TE's Float8BlockScaling): one block of 256 threads per
// 128 x 128 tile of x (a 128 x 128 scale block, or 128 1 x 128 row blocks and 128 128 x 1 column
// blocks); blockIdx.x picks the column tile, blockIdx.y the row tile (strided by gridDim.y beyond
// kBlockCastMaxGridY row tiles). The whole tile is loaded at once (8 or 16 16-byte vectors per
// thread in flight) and held in registers until its column scales are known.
// ---------------------------------------------------------------------------------------------
inline constexpr int kBlockScaleLength = 128;  // Float8BlockScaling's block length
inline constexpr int kBlockCastThreads = 256;
inline constexpr int kBlockCastTile = kBlockScaleLength;
inline constexpr int kBlockCastMaxGridY = 65535;
// A thread holds its part of the tile in registers as 8 (2-byte inputs) or 16 (fp32) 16-byte
// vectors, 32 or 64 registers: 64 in all for 2-byte inputs (4 blocks per SM, 128 KiB of loads in
// flight), 128 for fp32 (2 blocks; 117-126 used on sm_89/sm_90a/sm_100a).
inline constexpr int kBlockCastRegisterBudget = 64;
inline constexpr int kBlockCastWideRegisterBudget = 128;
OPFUSE_LAUNCH_RULE int block_cast_register_budget(int input_bytes) {
  return input_bytes == 4 ? kBlockCastWideRegisterBudget : kBlockCastRegisterBudget;
}
// At least one block in each direction, so that an empty tensor (rows or cols 0) still launches.
OPFUSE_LAUNCH_RULE int block_cast_grid_x(int cols) {
  return static_cast<int>(max_of(1, ceil_div(cols, kBlockCastTile)));
}
OPFUSE_LAUNCH_RULE int block_cast_grid_y(long long rows) {
  return static_cast<int>(max_of(1, min_of(ceil_div(rows, kBlockCastTile), kBlockCastMaxGridY)));
}
// Block-scaled activations (block_activation.cuh): block_cast's tiles and grid over one output
// plane. A block copies its tile's input vectors into shared memory all at once (cp.async: 32 KiB
// per input in flight, no registers held for them); each output plane's rounded values replace one
// input's slots until the cast reads them back. A block has kBlockCastThreads threads per output
// plane: the gated backward's 512 threads compute the tile together, then cast its two planes at
// once, 256 threads each (at 256 threads and one plane after the other it ran at 82-83% of copy on
// an H200, issue-bound at 16 warps per SM). Registers: forward 80 (3 blocks per SM), plain
// backward 128 (2 blocks: at 80 its dbias sums spilled 32-144 bytes), gated backward 64 (2 blocks
// of 512 threads: its 96-112 KiB of shared memory allows no more).
inline constexpr int kBlockActivationRegisterBudget = 80;
inline constexpr int kBlockActivationBwdRegisterBudget = 128;
inline constexpr int kBlockActivationGatedBwdRegisterBudget = 64;
OPFUSE_LAUNCH_RULE int block_activation_threads(int planes) { return planes * kBlockCastThreads; }
OPFUSE_LAUNCH_RULE int block_activation_register_budget(bool backward, int planes) {
  return !backward    ? kBlockActivationRegisterBudget
         : planes > 1 ? kBlockActivationGatedBwdRegisterBudget
                      : kBlockActivationBwdRegisterBudget;
}
// The kernels' __launch_bounds__ minimum: the blocks per SM their threads and budget allow.
OPFUSE_LAUNCH_RULE int block_activation_min_blocks(bool backward, int planes) {
  return min_blocks(block_activation_threads(planes),
                    block_activation_register_budget(backward, planes));
}
// One input's vectors (128 x 128 2-byte values), then with dbias each warp's column sums per
// output plane.
inline constexpr int kBlockActivationPlaneBytes = kBlockCastTile * kBlockCastTile * 2;
OPFUSE_LAUNCH_RULE int block_activation_smem_bytes(int loads, int planes, bool dbias) {
  return loads * kBlockActivationPlaneBytes +
         (dbias ? planes * kBlockCastTile * (block_activation_threads(planes) / 32) * 4 : 0);
}
// The scale_inv grid of a stored [rows, cols] copy (runtime/cpu/block_quantization.h, note "Block
// scale grids"; cuBLASLt's VEC128_32F / BLK128x128_32F layouts): 1-D [ceil(cols / 128)]
// [roundup(rows, 4)], entry (r, c) at (c / 128) * inner + r; 2-D [ceil(rows / 128)]
// [roundup(ceil(cols / 128), 4)], entry (r, c) at (r / 128) * inner + c / 128. The row-wise copy
// is stored [rows, cols], the column-wise copy [cols, rows] (its own grid: swap the extents).
OPFUSE_LAUNCH_RULE long long block_scale_grid_outer(long long rows, long long cols, bool two_d) {
  return two_d ? ceil_div(rows, kBlockScaleLength) : ceil_div(cols, kBlockScaleLength);
}
OPFUSE_LAUNCH_RULE long long block_scale_grid_inner(long long rows, long long cols, bool two_d) {
  return two_d ? ceil_div(ceil_div(cols, kBlockScaleLength), 4) * 4 : ceil_div(rows, 4) * 4;
}
// Block summaries (block_summary.cuh): 256 threads; a grid-stride loop over the work items
// (float8_block_summary: a warp per block; micro_block_summary: a thread per block), at most
// kBlockSummaryMaxGrid blocks, at least one (an empty copy still writes its tensor scale).
inline constexpr int kBlockSummaryThreads = 256;
inline constexpr int kBlockSummaryMaxGrid = 2048;
OPFUSE_LAUNCH_RULE int block_summary_grid_x(long long threads) {
  return static_cast<int>(
      max_of(1, min_of(ceil_div(threads, kBlockSummaryThreads), kBlockSummaryMaxGrid)));
}
// Decoding a quantized tensor (quantized_tensor.cuh's dequantize): a grid-stride loop over the
// elements, kDequantizeThreads threads per block.
inline constexpr int kDequantizeThreads = 256;
inline constexpr int kDequantizeMaxGrid = 4096;
OPFUSE_LAUNCH_RULE int dequantize_grid_x(long long elements) {
  return static_cast<int>(
      max_of(1, min_of(ceil_div(elements, kDequantizeThreads), kDequantizeMaxGrid)));
}
// Block-scaled fake quantization (block_fake_quantize: the quantize op, and Float8 block scaling
// emulated), kBlockFakeQuantizeThreads threads per block, by its blocks (kBlocks):
//   kBlockRows (1 x 128): one warp per block of a row; grid x = ceil_div(rows *
//     block_row_count(cols), warps);
//   kBlockColumns (128 x 1): one thread per block (a column of a 128-row strip); grid x =
//     ceil_div(block_row_count(rows) * cols, threads);
//   kBlockTiles (128 x 128): one thread block per tile; grid x = max(1, ceil_div(cols, 128)),
//     y = min(max(1, ceil_div(rows, 128)), kBlockCastMaxGridY) (row tiles strided by grid y).
// Every grid may be smaller (the loops are grid-strided) but not empty.
inline constexpr int kBlockRows = 0;
inline constexpr int kBlockColumns = 1;
inline constexpr int kBlockTiles = 2;
inline constexpr int kBlockFakeQuantizeWarps = 8;
inline constexpr int kBlockFakeQuantizeThreads = kBlockFakeQuantizeWarps * 32;
OPFUSE_LAUNCH_RULE int block_row_count(long long cols) {
  return static_cast<int>(ceil_div(cols, kBlockScaleLength));
}
OPFUSE_LAUNCH_RULE long long block_fake_quantize_grid_x(long long rows, long long cols,
                                                        int blocks) {
  return blocks == kBlockRows
             ? max_of(1, ceil_div(rows * block_row_count(cols), kBlockFakeQuantizeWarps))
         : blocks == kBlockColumns
             ? max_of(1, ceil_div(block_row_count(rows) * cols, kBlockFakeQuantizeThreads))
             : max_of(1, ceil_div(cols, kBlockScaleLength));
}
OPFUSE_LAUNCH_RULE long long block_fake_quantize_grid_y(long long rows, int blocks) {
  return blocks == kBlockTiles
             ? max_of(1, min_of(ceil_div(rows, kBlockScaleLength), kBlockCastMaxGridY))
             : 1;
}

// ---------------------------------------------------------------------------------------------
// Micro-scaled casts (micro_scale.cuh: MXFP8 and NVFP4, emulated on Hopper). Blocks of 256
// threads in one of two geometries:
//  - row blocks (the rowwise copy with 1-D blocks): a thread owns one scale block of a row
//    (32 elements for MXFP8, 16 for NVFP4), item t of the rows * cols / block blocks in row-major
//    order; grid.x = micro_scale_grid_x (any size >= 1 works: grid-stride), grid.y = 1;
//  - column patches (the columnwise copy, 2-D blocks, the RHT amax): a warp owns `block` rows x
//    64 columns (a lane two adjacent columns of all of them), the 8 warps of a block consecutive
//    row groups; grid.x = ceil(cols / 64), grid.y = micro_scale_grid_y (a smaller grid.y is also
//    correct: row groups are strided by gridDim.y * 8).
// ---------------------------------------------------------------------------------------------
inline constexpr int kMicroScaleThreads = 256;
inline constexpr int kMicroScaleWarps = kMicroScaleThreads / kWarpSize;
// kFormat of micro_scale_cast.
inline constexpr int kMicroScaleE4M3 = 0;       // MXFP8, E4M3 elements
inline constexpr int kMicroScaleE5M2 = 1;       // MXFP8, E5M2 elements
inline constexpr int kMicroScaleE2M1 = 2;       // NVFP4
inline constexpr int kMicroScalePatchCols = 2;  // columns per lane in a column patch
inline constexpr int kMicroScaleStripCols = kWarpSize * kMicroScalePatchCols;  // 64
inline constexpr int kMicroScaleMaxGridX = 1 << 20;
inline constexpr int kMicroScaleMaxGridY = 65535;
// kFormat of a copy: NVFP4 (E2M1 elements), else MXFP8 with E5M2 or E4M3 elements.
OPFUSE_LAUNCH_RULE int micro_scale_format(bool nvfp4, bool e5m2) {
  return nvfp4 ? kMicroScaleE2M1 : e5m2 ? kMicroScaleE5M2 : kMicroScaleE4M3;
}
// Elements per scale block: 32 (MXFP8) or 16 (NVFP4).
OPFUSE_LAUNCH_RULE int micro_scale_block_size(int format) {
  return format == kMicroScaleE2M1 ? 16 : 32;
}
OPFUSE_LAUNCH_RULE bool micro_scale_uses_patches(bool columnwise, bool two_d) {
  return columnwise || two_d;
}
OPFUSE_LAUNCH_RULE int micro_scale_grid_x(long long rows, long long cols, int format,
                                          bool columnwise, bool two_d) {
  if (micro_scale_uses_patches(columnwise, two_d)) {
    return static_cast<int>(max_of(1, ceil_div(cols, kMicroScaleStripCols)));
  }
  const long long blocks = rows * (cols / micro_scale_block_size(format));
  return static_cast<int>(
      max_of(1, min_of(ceil_div(blocks, kMicroScaleThreads), kMicroScaleMaxGridX)));
}
OPFUSE_LAUNCH_RULE int micro_scale_grid_y(long long rows, int format, bool columnwise, bool two_d) {
  if (!micro_scale_uses_patches(columnwise, two_d)) return 1;
  const long long groups = ceil_div(rows, micro_scale_block_size(format));
  return static_cast<int>(
      max_of(1, min_of(ceil_div(groups, kMicroScaleWarps), kMicroScaleMaxGridY)));
}
// micro_scale_rht_amax: the column patches of NVFP4 (16 rows).
OPFUSE_LAUNCH_RULE int micro_scale_rht_amax_grid_x(long long cols) {
  return micro_scale_grid_x(0, cols, kMicroScaleE2M1, true, false);
}
OPFUSE_LAUNCH_RULE int micro_scale_rht_amax_grid_y(long long rows) {
  return micro_scale_grid_y(rows, kMicroScaleE2M1, true, false);
}
// A thread holds one scale block in registers: 64 registers for 2-byte inputs, 96 with stochastic
// rounding (the Philox words beside the block spilled 30-56 bytes at 64; the NVFP4 column-wise
// copy with stochastic rounding spilled 4 bytes at 80 on sm_90a, measured on an H200), 128 with
// stochastic rounding and the Hadamard transform (8 bytes of spills at 80 on sm_90a), 128 for
// fp32 inputs.
// ptxas needs the budgets for sm_100a too once every 64-bit row address is kept out of the
// registers (micro_scale.cuh: 32-bit row offsets from the patch's first element).
inline constexpr int kMicroScaleRegisterBudget = 64;
inline constexpr int kMicroScaleStochasticRegisterBudget = 96;
inline constexpr int kMicroScaleWideRegisterBudget = 128;
OPFUSE_LAUNCH_RULE int micro_scale_register_budget(int input_bytes, bool stochastic, bool rht) {
  if (input_bytes == 4 || (stochastic && rht)) return kMicroScaleWideRegisterBudget;
  return stochastic ? kMicroScaleStochasticRegisterBudget : kMicroScaleRegisterBudget;
}

// ---------------------------------------------------------------------------------------------
// Column partial sums -> final vector (common/column_partials.cuh): a block covers 128 columns
// with 8 slices of partial rows.
// ---------------------------------------------------------------------------------------------
inline constexpr int kColumnReduceThreads = 256;
inline constexpr int kColumnReduceColsPerBlock = 128;
OPFUSE_LAUNCH_RULE int column_reduce_grid_x(int cols) {
  return static_cast<int>(ceil_div(cols, kColumnReduceColsPerBlock));
}

// ---------------------------------------------------------------------------------------------
// amax of a tensor (amax.cuh) and the sequence-wide scale update (scale_update.cuh).
// ---------------------------------------------------------------------------------------------
inline constexpr int kAmaxThreads = 512;

// ---------------------------------------------------------------------------------------------
// statistics of a tensor (tensor_stats.cuh, quant_stats.cuh): at most kTensorStatsMaxBlocks
// partial records, merged by one final launch. 1024 blocks (about eight per SM of an H100) keep
// enough loads in flight for a memory-bound read; 256 ran the large MLP's statistics at ~60% of
// a copy's bandwidth.
// ---------------------------------------------------------------------------------------------
inline constexpr int kTensorStatsThreads = 256;
inline constexpr int kTensorStatsMaxBlocks = 1024;
// Doubles throughout (a record is 11 of them): a larger budget than the other small kernels.
inline constexpr int kTensorStatsRegisterBudget = 128;
// The merge of the partial records a tiled kernel's blocks wrote (kStats: one per block, at most
// about kStatsTileBlocksPerSm per SM): tensor_stats_final with kStatsMergeThreads threads.
inline constexpr int kStatsMergeThreads = 256;
// A tiled kernel with statistics runs few blocks over several tiles each: every block ends by
// merging its threads' accumulators, which at one tile per block cost as much as the tile itself
// (H200, [16384, 4096] cast: 0.09 ms plain, 0.34 ms with one tile per block). Without dbias it
// runs one wave: min_blocks(kTileThreads, tile_register_budget(..., stats)) blocks per SM, each an
// equal run of the tiles (a flat schedule: compiler/codegen/emit_stats.cpp). With dbias (whose
// column sums keep a block on one column tile) at most kStatsTileBlocksPerSm blocks per SM's worth
// of row blocks per column tile, each over strided row tiles.
inline constexpr int kStatsTileBlocksPerSm = 4;
inline constexpr int kScaleUpdateThreads = 256;

// ---------------------------------------------------------------------------------------------
// a tensor's float32 copy for the debug features (tensor_capture.cuh): a grid-stride loop.
// ---------------------------------------------------------------------------------------------
inline constexpr int kTensorCaptureThreads = 256;
inline constexpr int kTensorCaptureMaxBlocks = 1024;

}  // namespace launch
}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_COMMON_LAUNCH_RULES_H_
