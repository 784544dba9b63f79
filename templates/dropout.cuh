// Dropout (note "Dropout" in docs/language.md): the training forward draws a Philox4x32-10 mask
// (common/philox.cuh, the very function the CPU reference calls), writes y = keep ? x * scale : 0
// and the mask as packed bits; the backward reads those bits (never redraws them). The step the
// Philox counter takes is read from device memory at run time, so a recorded graph draws a fresh
// mask each step.
//
// Entry points: dropout_fwd<T, kWriteMask>, dropout_bwd<T> and dropout_advance_step.
// Launch: block launch::kTileThreads (256); grid (launch::tile_grid_x(cols),
// launch::tile_grid_y(rows)) or any smaller gridDim.y >= 1 (row tiles are strided). Each thread
// handles 8 consecutive elements of a row (one byte of mask), so cols % 8 == 0.
#ifndef OPFUSE_TEMPLATES_DROPOUT_CUH_
#define OPFUSE_TEMPLATES_DROPOUT_CUH_

#include "common/launch_rules.h"
#include "common/philox.cuh"
#include "common/vec.cuh"

namespace opfuse {

// The mask: ceil(cols / 32) 32-bit words per row; bit c % 32 of word [r, c / 32] is element
// [r, c] (1: kept); the unused bits of a row's last word are 0. Byte b of a word holds elements
// 8b .. 8b + 7 (little-endian), so the thread owning 8 elements writes one byte.
template <typename T>
struct DropoutFwdParams {
  const T* x;                // [rows, cols]
  T* y;                      // [rows, cols]: x * scale where kept, else 0 (kWriteMask = false: x)
  unsigned int* mask;        // [rows, ceil(cols / 32)] words (kWriteMask)
  const unsigned int* step;  // the executor's training-step counter (the Philox counter's word 2)
  unsigned long long seed;   // the Philox key
  unsigned long long threshold;  // keep when the Philox word >= threshold (< 2^32)
  float scale;                   // 1 / (1 - p), rounded to float on the host
  int stream;                    // the Philox counter's word 3 (the bits of an unsigned int)
  int rows;
  int cols;  // multiple of 8
};

template <typename T>
struct DropoutBwdParams {
  const T* dy;               // [rows, cols]
  const unsigned int* mask;  // the forward's mask
  T* dx;                     // [rows, cols]: dy * scale where kept, else 0
  float scale;
  int rows;
  int cols;  // multiple of 8
};

namespace detail {

inline constexpr int kDropoutElems = 8;  // per thread: one byte of mask

// Calls body(row, col) for each 8-element run of the block's 128 x 64 tiles.
template <typename Body>
__device__ __forceinline__ void for_each_dropout_run(int rows, int cols, Body body) {
  constexpr int kRunsPerRow = launch::kTileCols / kDropoutElems;
  const int col0 = static_cast<int>(blockIdx.x) * launch::kTileCols;
  for (long long tile = static_cast<long long>(blockIdx.y) * launch::kTileRows; tile < rows;
       tile += static_cast<long long>(gridDim.y) * launch::kTileRows) {
    for (int run = static_cast<int>(threadIdx.x); run < launch::kTileRows * kRunsPerRow;
         run += launch::kTileThreads) {
      const long long row = tile + run / kRunsPerRow;
      const int col = col0 + (run % kRunsPerRow) * kDropoutElems;
      if (row < rows && col < cols) body(row, col);
    }
  }
}

// Loads 8 elements (one or two 16-byte vectors) as floats.
template <typename T>
__device__ __forceinline__ void load_run(const T* ptr, float (&out)[kDropoutElems]) {
  constexpr int kVec = launch::vector_elems(static_cast<int>(sizeof(T)));
  static_assert(kDropoutElems % kVec == 0, "a run is whole vectors");
#pragma unroll
  for (int v = 0; v < kDropoutElems / kVec; ++v) {
    float part[kVec];
    vec_to_float(load_vec<T, kVec>(ptr + v * kVec), part);
#pragma unroll
    for (int j = 0; j < kVec; ++j) out[v * kVec + j] = part[j];
  }
}

template <typename T>
__device__ __forceinline__ void store_run(T* ptr, const float (&in)[kDropoutElems]) {
  constexpr int kVec = launch::vector_elems(static_cast<int>(sizeof(T)));
#pragma unroll
  for (int v = 0; v < kDropoutElems / kVec; ++v) {
    float part[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) part[j] = in[v * kVec + j];
    store_vec(ptr + v * kVec, float_to_vec<T, kVec>(part, 1.0f));
  }
}

}  // namespace detail

// Training (kWriteMask): element i = row * cols + col keeps when word i % 4 of
// dropout_random_words(i / 4, seed, *step, stream) >= threshold; y = x * scale (one fp32
// rounding, then the output dtype's) or 0. Inference (kWriteMask = false, the plan's inference
// variant): y = x, no mask, no draws.
template <typename T, bool kWriteMask>
__global__ void __launch_bounds__(launch::kTileThreads) dropout_fwd(DropoutFwdParams<T> p) {
  const unsigned int step = kWriteMask ? *p.step : 0u;
  const int words = (p.cols + 31) / 32;
  detail::for_each_dropout_run(p.rows, p.cols, [&](long long row, int col) {
    const long long base = row * p.cols + col;
    float values[detail::kDropoutElems];
    detail::load_run(p.x + base, values);
    if constexpr (kWriteMask) {
      unsigned int bits = 0;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        // base is a multiple of 8: each half is one whole Philox call.
        const Philox4x32 random =
            dropout_random_words(static_cast<unsigned long long>(base) / 4 + half, p.seed, step,
                                 static_cast<unsigned int>(p.stream));
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const bool keep = random.v[j] >= p.threshold;
          const int e = half * 4 + j;
          values[e] = keep ? __fmul_rn(values[e], p.scale) : 0.0f;
          bits |= (keep ? 1u : 0u) << e;
        }
      }
      unsigned char* row_bytes = reinterpret_cast<unsigned char*>(p.mask + row * words);
      row_bytes[col / 8] = static_cast<unsigned char>(bits);
      // The thread with a row's last run zeroes the unused bytes of its last word.
      if (col + detail::kDropoutElems == p.cols) {
        for (int b = p.cols / 8; b < words * 4; ++b) row_bytes[b] = 0;
      }
    }
    detail::store_run(p.y + base, values);
  });
}

// dx = dy * scale where the saved mask keeps the element, else 0.
template <typename T>
__global__ void __launch_bounds__(launch::kTileThreads) dropout_bwd(DropoutBwdParams<T> p) {
  const int words = (p.cols + 31) / 32;
  detail::for_each_dropout_run(p.rows, p.cols, [&](long long row, int col) {
    const long long base = row * p.cols + col;
    const unsigned int bits = reinterpret_cast<const unsigned char*>(p.mask + row * words)[col / 8];
    float values[detail::kDropoutElems];
    detail::load_run(p.dy + base, values);
#pragma unroll
    for (int e = 0; e < detail::kDropoutElems; ++e)
      values[e] = (bits >> e) & 1u ? __fmul_rn(values[e], p.scale) : 0.0f;
    detail::store_run(p.dx + base, values);
  });
}

struct DropoutStepParams {
  unsigned int* step;  // the executor's training-step counter
};

// End of a training step (a plan step end_step() runs, beside update_scales): the counter moves
// on on the device, so a recorded training step (Session::capture) advances it at every replay.
// Block 1 thread; grid 1. (A template so its name expression has the form of every other:
// opfuse::dropout_advance_step<>.)
template <int kSteps = 1>
__global__ void dropout_advance_step(DropoutStepParams p) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *p.step += static_cast<unsigned int>(kSteps);
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_DROPOUT_CUH_
