// Activations forward and backward (+ dbias) with the 1 x 128 / 128 x 1 block-scaled cast of
// their output fused (float8_block_scaling): one kernel reads the activation's inputs once and
// writes the row-wise FP8 copy, the column-wise (transposed) copy and both scale_inv grids, where
// the unfused plan writes the activation's output in Input and block_cast_transpose reads it back.
// TE leaves its activations unfused under block scaling.
//
// Entry points: block_activation_fwd, block_gated_activation_fwd, block_activation_bwd,
// block_gated_activation_bwd, each <Act, Input, Output, kWriteTranspose[, kDbias]>, with the
// functor contract of activation.cuh (whose load/compute ops they reuse).
//
// Numerics: each value is computed in fp32 exactly as activation.cuh computes it, rounded to
// Input (the dtype the unfused activation writes), and block-quantized from there by
// block_cast.cuh's detail::block_cast_rows_tile, so the codes and scales are bit for bit those of
// the unfused pair. dbias sums the fp32 values before rounding, as activation_bwd does.
//
// Geometry (launch_rules.h, "Block-scaled activations"): block_cast.cuh's, a block of 256 threads
// per 128 x 128 tile of an output plane, 8 rows per thread. The tile's input vectors are copied
// into shared memory all at once (cp.async) and each output plane's rounded values replace one
// input's there until the cast reads them. The gated backward computes both planes (d gate, d
// linear) of a tile from one read of dy, gate and linear and quantizes them one after the other,
// so its plane width cols must be a multiple of 128 (a row block never straddles the two
// planes). Launch rules, shapes and alignment: templates/README.md ("Block-scaled activations").
#ifndef OPFUSE_TEMPLATES_BLOCK_ACTIVATION_CUH_
#define OPFUSE_TEMPLATES_BLOCK_ACTIVATION_CUH_

#include "activation.cuh"
#include "block_cast.cuh"
#include "common/async_copy.cuh"

namespace opfuse {

template <typename Input, typename Output>
struct BlockActivationParams {
  const Input* dy;       // backward: [rows, cols]; forward: unused (nullptr)
  const Input* x;        // plain [rows, cols]; gated [rows, 2 * cols] (gate | linear)
  Output* y;             // row-wise copy [rows, planes * cols]; nullptr: not written
  float* y_scale_inv;    // its 1 x 128 scale_inv grid; with y
  Output* y_t;           // column-wise copy [planes * cols, rows] (kWriteTranspose)
  float* y_t_scale_inv;  // its grid; with y_t
  float* dbias_partial;  // kDbias: [gridDim.y, planes * cols] fp32 column sums of the values
  float epsilon;         // amax floor
  int power_of_2_scale;  // nonzero: scales rounded down to a power of 2
  int rows;              // any >= 0
  int cols;              // the width n of one output plane; multiple of 8 (of 128: gated backward)
};

namespace detail {

// Dynamic shared memory (launch::block_activation_smem_bytes): the tile's input vectors, per
// input 128 rows x 16 16-byte slots, slot (row, vector) at row * 16 + vector; a thread fills its
// own slots (its cp.async copies) and reads them back, so no barrier is needed between. The
// rounded values of output plane p overwrite input p's slots as they are computed. Then, with
// kDbias, the warps' column sums. Each cast group's block_cast_rows_tile area overlays its plane's
// values once they are back in registers.
extern __shared__ __align__(16) unsigned char block_activation_smem[];

// Runs op's tiles: gridDim.x column tiles of 128 over one plane's width, row tiles strided by
// gridDim.y. kPlanes == 2 (the gated backward) quantizes plane p into columns [p * cols, +cols)
// of the [rows, 2 * cols] output. The whole tile's input vectors are copied into shared memory
// at once (cp.async, one group per pass), so a block keeps 32 KiB per input in flight without
// holding registers for them (loaded into registers in batches of one or two passes, the bytes in
// flight were limited by the registers: SwiGLU forward 56%, backward 50% of copy on an H200, now
// 71% and 57%); the arithmetic of pass b starts when its group has landed. The values go through
// shared memory rather than staying in registers from their computation to their cast: held across
// the arithmetic of the whole tile they spill. A block has
// launch::block_activation_threads(kPlanes) threads: all of them compute the tile, then group g
// (threads [256 g, +256)) casts plane g with block_cast.cuh's geometry and its own named barrier,
// so the gated backward's two casts run at once.
template <typename Input, typename Output, bool kWriteTranspose, bool kDbias, typename Op>
__device__ __forceinline__ void run_block_activation(const BlockActivationParams<Input, Output>& p,
                                                     const Op& op) {
  static_assert(DtypeTraits<Output>::kIsFp8, "block scaling casts to an FP8 format");
  static_assert(sizeof(Input) == 2, "2-byte inputs: a tile row is 16 threads' vectors");
  constexpr int kTile = launch::kBlockCastTile;
  constexpr int kVec = Op::kVec;
  constexpr int kPlanes = Op::kPlanes;
  constexpr int kLoads = Op::kLoads;
  constexpr int kThreads = launch::block_activation_threads(kPlanes);
  constexpr int kWarps = kThreads / 32;
  constexpr int kCastThreads = launch::kBlockCastThreads;
  constexpr int kVecsPerRow = kTile / kVec;
  constexpr int kSlotsPerInput = kTile * kVecsPerRow;
  constexpr int kRowsPerPass = kThreads / kVecsPerRow;  // of the computation: 16 or 32 rows
  constexpr int kPasses = kTile / kRowsPerPass;         // 8 or 4
  constexpr int kCastPasses = block_cast_passes<Input>();
  static_assert(kVec == launch::vector_elems(sizeof(Input)), "one 16-byte vector per pass");
  static_assert(kPlanes <= kLoads, "each output plane overwrites one input's slots");
  static_assert(kPasses <= 8, "copy_async_wait counts at most 7 groups in flight");
  static_assert(kSlotsPerInput * sizeof(BlockCastWords) == launch::kBlockActivationPlaneBytes,
                "launch::block_activation_smem_bytes: one input's vectors");
  static_assert(kCastPasses * kCastThreads == kSlotsPerInput, "a cast group covers the tile");
  static_assert(sizeof(BlockCastRowsShared<kWriteTranspose>) <= launch::kBlockActivationPlaneBytes,
                "a cast's shared area fits over its plane's values");

  BlockCastWords* slots = reinterpret_cast<BlockCastWords*>(block_activation_smem);
  float* dbias_scratch =
      reinterpret_cast<float*>(block_activation_smem + kLoads * launch::kBlockActivationPlaneBytes);
  auto slot = [&](int input, int pass) -> BlockCastWords& {
    return slots[input * kSlotsPerInput + pass * kThreads + threadIdx.x];
  };
  // The cast group of this thread (block_cast_rows_tile's kGrouped): its plane(s) and its area.
  constexpr int kGroups = kThreads / kCastThreads;
  constexpr bool kGrouped = kGroups > 1;
  const int group = static_cast<int>(threadIdx.x) / kCastThreads;
  auto& shared = *reinterpret_cast<BlockCastRowsShared<kWriteTranspose>*>(
      block_activation_smem + group * launch::kBlockActivationPlaneBytes);

  const int tile_col0 = blockIdx.x * kTile;  // within one plane
  const int vec_in_row = threadIdx.x % kVecsPerRow;
  const int row_in_pass = threadIdx.x / kVecsPerRow;
  const int col = tile_col0 + vec_in_row * kVec;
  const bool col_valid = col < p.cols;
  const long long rows = p.rows;
  // The cast's view: one [rows, planes * cols] tensor.
  const BlockCastParams<Input, Output> cast{nullptr,         p.y,       p.y_scale_inv,      p.y_t,
                                            p.y_t_scale_inv, p.epsilon, p.power_of_2_scale, p.rows,
                                            kPlanes * p.cols};

  // kDbias: each warp's column sums in shared memory (dbias_scratch, past the inputs), added to
  // tile by tile so that no sums stay in registers through the casts. The threads of one column
  // vector are lanes vec_in_row + k * kVecsPerRow of a warp: the first of them keeps the warp's
  // sums of that vector's columns (its own entries: no barrier until the warps' sums are added).
  [[maybe_unused]] const int lane = threadIdx.x & 31;
  [[maybe_unused]] float* const warp_dbias = dbias_scratch + (threadIdx.x >> 5) * kPlanes * kTile;
  if constexpr (kDbias) {
    if (lane < kVecsPerRow) {
#pragma unroll
      for (int plane = 0; plane < kPlanes; ++plane) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) warp_dbias[plane * kTile + vec_in_row * kVec + j] = 0.0f;
      }
    }
  }

  if (tile_col0 < p.cols) {
#pragma unroll 1
    for (long long tile_row0 = static_cast<long long>(blockIdx.y) * kTile; tile_row0 < rows;
         tile_row0 += static_cast<long long>(gridDim.y) * kTile) {
      // Every input vector of the tile in flight; rows and columns past the tensor copy zeros
      // (their values are set to 0 below, not computed).
#pragma unroll
      for (int b = 0; b < kPasses; ++b) {
        const long long row = tile_row0 + b * kRowsPerPass + row_in_pass;
        const bool valid = col_valid && row < rows;
#pragma unroll
        for (int k = 0; k < kLoads; ++k) {
          copy_async_16(&slot(k, b), valid ? op.source(k, row, col) : op.source(k, 0, 0), valid);
        }
        copy_async_commit();
      }
      float dbias[kPlanes][kVec];
#pragma unroll
      for (int plane = 0; plane < kPlanes; ++plane) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) dbias[plane][j] = 0.0f;
      }
#pragma unroll
      for (int b = 0; b < kPasses; ++b) {
        copy_async_wait(kPasses - 1 - b);
        const long long row = tile_row0 + b * kRowsPerPass + row_in_pass;
        float values[kPlanes][kVec];
        if (col_valid && row < rows) {
          Vec<Input, kVec> vectors[kLoads];
#pragma unroll
          for (int k = 0; k < kLoads; ++k) {
            vectors[k] =
                load_vec_coherent<Input, kVec>(reinterpret_cast<const Input*>(&slot(k, b)));
          }
          op.compute(Op::from_vectors(vectors), values);
        } else {
          // Past the tensor: 0, which no amax notices and no sum changes.
#pragma unroll
          for (int plane = 0; plane < kPlanes; ++plane) {
#pragma unroll
            for (int j = 0; j < kVec; ++j) values[plane][j] = 0.0f;
          }
        }
#pragma unroll
        for (int plane = 0; plane < kPlanes; ++plane) {
          if constexpr (kDbias) {
#pragma unroll
            for (int j = 0; j < kVec; ++j) dbias[plane][j] += values[plane][j];
          }
          const Vec<Input, kVec> rounded = float_to_vec<Input, kVec>(values[plane], 1.0f);
          slot(plane, b) = *reinterpret_cast<const BlockCastWords*>(&rounded);
        }
      }
      if constexpr (kDbias) {
#pragma unroll
        for (int plane = 0; plane < kPlanes; ++plane) {
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
#pragma unroll
            for (int mask = kVecsPerRow; mask < 32; mask <<= 1) {
              dbias[plane][j] += __shfl_xor_sync(kFullWarpMask, dbias[plane][j], mask);
            }
            if (lane < kVecsPerRow) {
              warp_dbias[plane * kTile + vec_in_row * kVec + j] += dbias[plane][j];
            }
          }
        }
      }
      // Several groups: a group casts values other threads computed. One group: a thread's cast
      // rows are its computed rows (the same slots), no barrier needed.
      if constexpr (kGrouped) {
        __syncthreads();
      }
      // The casts: with several groups, group g casts plane g; with one group, the planes one
      // after the other (a loop: unrolled, the two planes' casts spill).
      auto cast_plane = [&](int plane) {
        BlockCastWords raw[kCastPasses];
#pragma unroll
        for (int b = 0; b < kCastPasses; ++b) {
          raw[b] = slots[plane * kSlotsPerInput + b * kCastThreads + block_cast_tid<kGrouped>()];
        }
        // The group's threads have their values before its cast's area overwrites them (one
        // group, plane 1: the previous plane's transposed write is done with the area).
        block_cast_sync<kGrouped>();
        block_cast_rows_tile<Input, Output, kWriteTranspose, kGrouped>(raw, cast, shared, tile_row0,
                                                                       plane * p.cols + tile_col0);
      };
      if constexpr (kGrouped) {
        static_assert(kGroups == kPlanes, "a group per plane");
        cast_plane(group);
      } else {
#pragma unroll 1
        for (int plane = 0; plane < kPlanes; ++plane) cast_plane(plane);
      }
      // The next tile's copies overwrite the casts' areas.
      if (tile_row0 + static_cast<long long>(gridDim.y) * kTile < rows) __syncthreads();
    }
  }

  if constexpr (kDbias) {
    // The warps' sums added (every block writes its partial row, zeros where it had no tile).
    __syncthreads();
    const long long stride = static_cast<long long>(kPlanes) * p.cols;
#pragma unroll 1
    for (int i = threadIdx.x; i < kPlanes * kTile; i += kThreads) {
      const int plane = i / kTile;
      const int c = tile_col0 + i % kTile;
      if (c >= p.cols) continue;
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += dbias_scratch[w * kPlanes * kTile + i];
      p.dbias_partial[blockIdx.y * stride + plane * p.cols + c] = sum;
    }
  }
}

}  // namespace detail

// Block: launch::block_activation_threads(planes) (256; 512 for the gated backward). Grid:
// (launch::block_cast_grid_x(cols), launch::block_cast_grid_y(rows)) or any smaller gridDim.y >= 1.
// Dynamic shared memory: launch::block_activation_smem_bytes(loads, planes, kDbias).
template <typename Act, typename Input, typename Output, bool kWriteTranspose = true>
__global__ void __launch_bounds__(launch::block_activation_threads(1),
                                  launch::block_activation_min_blocks(false, 1))
    block_activation_fwd(BlockActivationParams<Input, Output> p) {
  static_assert(
      detail::LearnedCount<Act>::value == 0,
      "the block-scaled kernels take no learned parameters (codegen uses the tiled ones)");
  detail::run_block_activation<Input, Output, kWriteTranspose, false>(
      p, detail::ActivationFwdOp<Act, Input>{p.x, p.cols});
}

template <typename Act, typename Input, typename Output, bool kWriteTranspose = true>
__global__ void __launch_bounds__(launch::block_activation_threads(1),
                                  launch::block_activation_min_blocks(false, 1))
    block_gated_activation_fwd(BlockActivationParams<Input, Output> p) {
  static_assert(
      detail::LearnedCount<Act>::value == 0,
      "the block-scaled kernels take no learned parameters (codegen uses the tiled ones)");
  detail::run_block_activation<Input, Output, kWriteTranspose, false>(
      p, detail::GatedActivationFwdOp<Act, Input>{p.x, p.cols});
}

template <typename Act, typename Input, typename Output, bool kWriteTranspose = true,
          bool kDbias = false>
__global__ void __launch_bounds__(launch::block_activation_threads(1),
                                  launch::block_activation_min_blocks(true, 1))
    block_activation_bwd(BlockActivationParams<Input, Output> p) {
  static_assert(
      detail::LearnedCount<Act>::value == 0,
      "the block-scaled kernels take no learned parameters (codegen uses the tiled ones)");
  detail::run_block_activation<Input, Output, kWriteTranspose, kDbias>(
      p, detail::ActivationBwdOp<Act, Input>{p.dy, p.x, p.cols});
}

template <typename Act, typename Input, typename Output, bool kWriteTranspose = true,
          bool kDbias = false>
__global__ void __launch_bounds__(launch::block_activation_threads(2),
                                  launch::block_activation_min_blocks(true, 2))
    block_gated_activation_bwd(BlockActivationParams<Input, Output> p) {
  static_assert(
      detail::LearnedCount<Act>::value == 0,
      "the block-scaled kernels take no learned parameters (codegen uses the tiled ones)");
  detail::run_block_activation<Input, Output, kWriteTranspose, kDbias>(
      p, detail::GatedActivationBwdOp<Act, Input>{p.dy, p.x, p.cols});
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_BLOCK_ACTIVATION_CUH_
