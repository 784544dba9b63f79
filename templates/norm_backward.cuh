// LayerNorm and RMSNorm backward (included by norm.cuh, which holds the forward): dx of the
// input dtype (+ an optional extra gradient dresidual, the residual branch of MakeExtraOutput),
// and per-row-group dgamma/dbeta partial sums that reduce_column_partials
// (common/column_partials.cuh) adds deterministically. The hidden size is a template parameter:
// a row lives in registers (common/norm_shape.cuh). Launch rules: templates/README.md.
#ifndef OPFUSE_TEMPLATES_NORM_BACKWARD_CUH_
#define OPFUSE_TEMPLATES_NORM_BACKWARD_CUH_

#include "common/column_partials.cuh"
#include "common/launch_rules.h"
#include "common/norm_shape.cuh"
#include "common/reduce.cuh"
#include "common/types.cuh"
#include "common/vec.cuh"

namespace opfuse {

template <typename Input>
struct NormBwdParams {
  const Input* dy;         // [rows, hidden]
  const Input* x;          // [rows, hidden] forward input
  const Input* gamma;      // [hidden]
  const float* mean;       // [rows] (LayerNorm; RMSNorm ignores it)
  const float* rstd;       // [rows]
  const Input* dresidual;  // [rows, hidden] added into dx; nullptr: none
  Input* dx;               // [rows, hidden]
  float* dgamma_partial;   // [gridDim.x * rows_per_block, hidden] fp32
  float* dbeta_partial;    // [gridDim.x * rows_per_block, hidden] fp32 (LayerNorm)
  int rows;                // any value >= 0
};

namespace detail {

template <bool kIsRms, typename Input, int kHidden, bool kZeroCenteredGamma>
__device__ __forceinline__ void norm_bwd(const NormBwdParams<Input>& params) {
  using Shape = NormBwdShape<Input, kHidden>;
  constexpr int kVec = Shape::kVec;
  constexpr int kSlots = Shape::kVecsPerThread;
  constexpr int kRowsPerBlock = Shape::kRowsPerBlock;
  constexpr int kBlockThreads = Shape::kBlockThreads;
  constexpr int kSums = kIsRms ? 1 : 2;  // dgamma, and dbeta for LayerNorm
  constexpr bool kSharedPartials =
      launch::norm_bwd_partials_shared_bytes(kHidden, Shape::kInputBytes, kIsRms) > 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
  // sm_100's ptxas spills the two-row step of the bf16 4096 LayerNorm (12 bytes at 64 registers)
  // and it is not measured there: one row per step, partials where the rule puts them.
  constexpr int kRowsPerStep = 1;
#else
  constexpr int kRowsPerStep = launch::norm_bwd_rows_per_step(kHidden, Shape::kInputBytes, kIsRms);
#endif
  static_assert(kRowsPerStep == 1 || kRowsPerStep == 2, "one or two rows per step");

  __shared__ float4 reduce_scratch[kRowsPerBlock][2 * Shape::kWarpsPerRow];
  const int group = threadIdx.x / Shape::kThreadsPerRow;
  const int thread_in_row = threadIdx.x % Shape::kThreadsPerRow;
  GroupReducer<Shape::kWarpsPerRow, kRowsPerBlock, float4> reducer(reduce_scratch[group], group);

  // The thread's column partial sums (launch::norm_bwd_partials_shared_bytes): in shared memory
  // as float4 planes [sum][slot][kVec / 4][thread], so a warp's accesses are contiguous; else in
  // registers.
  constexpr int kPlanesPerSlot = kVec / 4;
  constexpr int kSharedPlanes = kSharedPartials ? kSums * kSlots * kPlanesPerSlot : 1;
  __shared__ float4 shared_partials[kSharedPlanes][kSharedPartials ? kBlockThreads : 1];
  float register_partials[kSharedPartials ? 1 : kSums][kSharedPartials ? 1 : kSlots][kVec];
  auto plane = [&](int sum, int s, int p) -> float4& {
    return shared_partials[(sum * kSlots + s) * kPlanesPerSlot + p][threadIdx.x];
  };
  auto read_partials = [&](int sum, int s, float(&out)[kVec]) {
    if constexpr (kSharedPartials) {
#pragma unroll
      for (int p = 0; p < kPlanesPerSlot; ++p) {
        const float4 v = plane(sum, s, p);
        out[4 * p] = v.x;
        out[4 * p + 1] = v.y;
        out[4 * p + 2] = v.z;
        out[4 * p + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) out[j] = register_partials[sum][s][j];
    }
  };
  auto write_partials = [&](int sum, int s, const float(&in)[kVec]) {
    if constexpr (kSharedPartials) {
#pragma unroll
      for (int p = 0; p < kPlanesPerSlot; ++p) {
        plane(sum, s, p) = make_float4(in[4 * p], in[4 * p + 1], in[4 * p + 2], in[4 * p + 3]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) register_partials[sum][s][j] = in[j];
    }
  };
  {
    const float zeros[kVec] = {};
#pragma unroll
    for (int sum = 0; sum < kSums; ++sum) {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) write_partials(sum, s, zeros);
    }
  }

  // A row group owns rows first, first + stride, first + 2 * stride, ... and takes kRowsPerStep
  // of them per step; each partial sum still adds the rows in that order.
  const long long stride = static_cast<long long>(gridDim.x) * kRowsPerBlock;
  for (long long first = static_cast<long long>(blockIdx.x) * kRowsPerBlock + group;
       first - group < params.rows; first += kRowsPerStep * stride) {
    // Row r of the step, derived where used rather than held across the barrier.
    auto row_of = [&](int r) { return first + r * stride; };
    bool valid[kRowsPerStep];
    Vec<Input, kVec> x_raw[kRowsPerStep][kSlots], dy_raw[kRowsPerStep][kSlots];
#pragma unroll
    for (int r = 0; r < kRowsPerStep; ++r) {
      const long long row = row_of(r);
      valid[r] = row < params.rows;
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int vector = Shape::vector_index(thread_in_row, s);
        if (valid[r] && Shape::slot_in_row(vector)) {
          x_raw[r][s] = load_vec<Input, kVec>(params.x + row * kHidden + vector * kVec);
          dy_raw[r][s] = load_vec<Input, kVec>(params.dy + row * kHidden + vector * kVec);
        }
      }
    }
    float mean[kRowsPerStep], rstd[kRowsPerStep];
#pragma unroll
    for (int r = 0; r < kRowsPerStep; ++r) {
      mean[r] = (!kIsRms && valid[r]) ? params.mean[row_of(r)] : 0.0f;
      rstd[r] = valid[r] ? params.rstd[row_of(r)] : 0.0f;
    }

    // x_hat = (x - mean) * rstd and g = dy * w are formed twice (before and after the reduction)
    // from the packed inputs, one element at a time: keeping them as floats across the barrier
    // would cost 2 * kRowsPerStep * kSlots * kVec registers. Idle slots and invalid rows hold
    // zeros, so every contribution there vanishes.
    // gamma is read per slot (an L1 hit) and kept packed: w = gamma (+ 1 when zero-centered).
    auto element = [&](int r, int s, int j, const Vec<Input, kVec>& gamma, float& x_hat, float& g,
                       float& dys) {
      const bool present = valid[r] && Shape::slot_in_row(Shape::vector_index(thread_in_row, s));
      const float xs = present ? to_float(x_raw[r][s].elems[j]) : 0.0f;
      dys = present ? to_float(dy_raw[r][s].elems[j]) : 0.0f;
      const float w = to_float(gamma.elems[j]);
      // Rounded products (never contracted into a consumer's fused multiply-add), so the
      // recomputed values after the barrier equal the first pass's whatever ptxas fuses.
      x_hat = __fmul_rn(xs - mean[r], rstd[r]);
      g = __fmul_rn(dys, kZeroCenteredGamma ? w + 1.0f : w);
    };
    int gamma_offset = 0;
    auto load_gamma = [&](int s) {
      const int vector = Shape::vector_index(thread_in_row, s);
      return Shape::slot_in_row(vector)
                 ? load_vec<Input, kVec>(params.gamma + gamma_offset + vector * kVec)
                 : zero_vec<Input, kVec>();
    };

    float2 sums[kRowsPerStep];  // per row: (sum g, sum g * x_hat)
#pragma unroll
    for (int r = 0; r < kRowsPerStep; ++r) sums[r] = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const Vec<Input, kVec> gamma = load_gamma(s);
      // dgamma, then dbeta: one partial vector live at a time.
      float partial[kVec];
      read_partials(0, s, partial);
#pragma unroll
      for (int r = 0; r < kRowsPerStep; ++r) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          float x_hat, g, dys;
          element(r, s, j, gamma, x_hat, g, dys);
          sums[r].x += g;
          sums[r].y += g * x_hat;
          partial[j] += dys * x_hat;
        }
      }
      write_partials(0, s, partial);
      if constexpr (!kIsRms) {
        read_partials(1, s, partial);
#pragma unroll
        for (int r = 0; r < kRowsPerStep; ++r) {
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            float x_hat, g, dys;
            element(r, s, j, gamma, x_hat, g, dys);
            partial[j] += dys;
          }
        }
        write_partials(1, s, partial);
      }
    }
    // The rows' raw words pass through an empty asm so the compiler cannot prove the second
    // pass's x_hat and g equal to the first's and keep those floats across the barrier.
#pragma unroll
    for (int r = 0; r < kRowsPerStep; ++r) {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        hide_from_optimizer(x_raw[r][s]);
        hide_from_optimizer(dy_raw[r][s]);
      }
    }
    hide_from_optimizer(gamma_offset);  // gamma is read again, not held across the barrier
    if constexpr (kRowsPerStep == 2) {
      const float4 both =
          reducer.allreduce_sum4(make_float4(sums[0].x, sums[0].y, sums[1].x, sums[1].y));
      sums[0] = make_float2(both.x, both.y);
      sums[1] = make_float2(both.z, both.w);
    } else {
      sums[0] = reducer.allreduce_sum2(sums[0]);
    }

#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int vector = Shape::vector_index(thread_in_row, s);
      if (!Shape::slot_in_row(vector)) continue;
      const Vec<Input, kVec> gamma = load_gamma(s);
#pragma unroll
      for (int r = 0; r < kRowsPerStep; ++r) {
        if (!valid[r]) continue;
        const float mean_g = kIsRms ? 0.0f : sums[r].x / static_cast<float>(kHidden);
        const float mean_g_x_hat = sums[r].y / static_cast<float>(kHidden);
        const long long offset = row_of(r) * kHidden + vector * kVec;
        float dx[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          float x_hat, g, dys;
          element(r, s, j, gamma, x_hat, g, dys);
          dx[j] = rstd[r] * (g - mean_g - x_hat * mean_g_x_hat);
        }
        if (params.dresidual != nullptr) {
          float extra[kVec];
          vec_to_float(load_vec<Input, kVec>(params.dresidual + offset), extra);
#pragma unroll
          for (int j = 0; j < kVec; ++j) dx[j] += extra[j];
        }
        store_vec(params.dx + offset, float_to_vec<Input, kVec>(dx, 1.0f));
      }
    }
  }

  // One partial row per row group (every one is written, zeros if it saw no rows).
  const long long partial_row = static_cast<long long>(blockIdx.x) * kRowsPerBlock + group;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int vector = Shape::vector_index(thread_in_row, s);
    if (!Shape::slot_in_row(vector)) continue;
    const long long offset = partial_row * kHidden + vector * kVec;
#pragma unroll
    for (int sum = 0; sum < kSums; ++sum) {
      Vec<float, kVec> partial;
      read_partials(sum, s, partial.elems);
      store_vec((sum == 0 ? params.dgamma_partial : params.dbeta_partial) + offset, partial);
    }
  }
}
}  // namespace detail

// Backward. Block: NormBwdShape<Input, kHidden>::kBlockThreads; grid: any gridDim.x >= 1; the
// partial buffers hold gridDim.x * NormBwdShape<Input, kHidden>::kRowsPerBlock rows.
template <typename Input, int kHidden, bool kZeroCenteredGamma = false>
__global__ void __launch_bounds__(NormBwdShape<Input, kHidden>::kBlockThreads,
                                  launch::min_blocks(NormBwdShape<Input, kHidden>::kBlockThreads,
                                                     launch::kNormBwdRegisterBudget))
    layernorm_bwd(NormBwdParams<Input> params) {
  detail::norm_bwd<false, Input, kHidden, kZeroCenteredGamma>(params);
}

template <typename Input, int kHidden, bool kZeroCenteredGamma = false>
__global__ void __launch_bounds__(NormBwdShape<Input, kHidden>::kBlockThreads,
                                  launch::min_blocks(NormBwdShape<Input, kHidden>::kBlockThreads,
                                                     launch::kNormBwdRegisterBudget))
    rmsnorm_bwd(NormBwdParams<Input> params) {
  detail::norm_bwd<true, Input, kHidden, kZeroCenteredGamma>(params);
}
}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_NORM_BACKWARD_CUH_
