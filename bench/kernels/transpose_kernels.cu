// Microbenchmark of the FP8 cast kernels that also write a transposed copy (issue 6: every fused
// memory-bound kernel at >= 85% of the device copy bandwidth) and of float8_block_scaling's block
// casts and fused block activations (issue 18: the block quantize kernels at >= 85% of copy),
// built by nvcc straight from templates/ (bench/kernels/run.sh).
//
// Each kernel runs twice per case: as the templates are now ("current") and as they were at a
// reference commit ("original": templates/ of ORIGINAL_REV from git, see run.sh, renamed to
// namespace opfuse_original so both versions live in one program). Every case first checks that
// the current kernel's outputs equal the original's byte for byte (dbias partial sums: their
// column sums, within fp32 rounding, as the versions' tile heights differ) (outputs poisoned with
// different bytes first, fresh random inputs with NaN/Inf planted), then the large cases are
// timed: CUDA events around each launch, warm-up, median of --reps launches, inputs and outputs
// rotated over sets whose inputs together hold 3x the L2, both versions timed twice in alternation
// (the two medians show the noise). "of copy" divides by a cudaMemcpyAsync D2D moving the same
// number of bytes (bytes read + bytes written) timed the same way.
//
//   transpose_kernels [--reps N] [--only SUBSTRING[,SUBSTRING...]] [--skip-checks]
//                     [--ncu original|current|both] [--dirty-l2 MB]
// --ncu runs each large case's kernel(s) once, nothing else, for `ncu -k regex:...`.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "activation.cuh"
#include "block_activation.cuh"
#include "block_cast.cuh"
#include "cast_transpose.cuh"
#include "norm.cuh"
#include "opfuse_original/activation.cuh"
#include "opfuse_original/block_activation.cuh"
#include "opfuse_original/block_cast.cuh"
#include "opfuse_original/cast_transpose.cuh"
#include "opfuse_original/norm.cuh"

// The activations of the cases, in activation.cuh's functor contract (codegen generates these
// for a program's ops, e.g. tests/golden/codegen/mlp/kernels/gated_activation_bwd_swiglu_*.cu;
// both versions' kernels take the same functor).
namespace opfuse {
struct BenchSwiglu {  // silu(gate) * linear, as codegen writes the built-in swiglu
  static constexpr int kInputs = 2;
  __device__ __forceinline__ static float forward(const float (&in)[2]) {
    return in[0] * sigmoid(in[0]) * in[1];
  }
  __device__ __forceinline__ static void backward(const float (&in)[2], float dy,
                                                  float (&grad)[2]) {
    const float s = sigmoid(in[0]);
    grad[0] = s * (1.0f + in[0] * (1.0f - s)) * in[1] * dy;
    grad[1] = in[0] * s * dy;
  }
};
struct BenchGelu {  // the sigmoid approximation x * sigmoid(1.702 x)
  static constexpr int kInputs = 1;
  __device__ __forceinline__ static float forward(const float (&in)[1]) {
    return in[0] * sigmoid(1.702f * in[0]);
  }
  __device__ __forceinline__ static void backward(const float (&in)[1], float dy,
                                                  float (&grad)[1]) {
    const float s = sigmoid(1.702f * in[0]);
    grad[0] = dy * s * (1.0f + 1.702f * in[0] * (1.0f - s));
  }
};
}  // namespace opfuse

namespace {

#define CHECK_CUDA(call)                                                 \
  do {                                                                   \
    const cudaError_t status_ = (call);                                  \
    if (status_ != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(status_));                         \
      std::exit(2);                                                      \
    }                                                                    \
  } while (0)

using bf16 = __nv_bfloat16;
using e4m3 = __nv_fp8_e4m3;
using e5m2 = __nv_fp8_e5m2;

// ---- device helpers -------------------------------------------------------------------------

__device__ __forceinline__ std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// Uniform values in [lo, hi); with `specials`, a few NaN and +-Inf planted (elements 5, 1001,
// 77777 when present) so NaN/Inf handling of amax and the casts is compared too.
template <typename T>
__global__ void fill_random(T* data, std::size_t count, std::uint64_t seed, float lo, float hi,
                            bool specials) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::uint64_t bits = mix64(i * 0x9E3779B97F4A7C15ULL + seed);
    float v = lo + (hi - lo) * static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
    if (specials) {
      if (i == 5) v = __int_as_float(0x7FC00000);
      if (i == 1001) v = __int_as_float(0x7F800000);
      if (i == 77777) v = -__int_as_float(0x7F800000);
    }
    data[i] = opfuse::from_float<T>(v);
  }
}

__global__ void count_mismatches(const unsigned char* a, const unsigned char* b, std::size_t bytes,
                                 unsigned long long* mismatches,
                                 unsigned long long* first_mismatch) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < bytes;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    if (a[i] != b[i]) {
      atomicAdd(mismatches, 1ULL);
      atomicMin(first_mismatch, static_cast<unsigned long long>(i));
    }
  }
}

// ---- cases ----------------------------------------------------------------------------------

enum class Dtype { F32, BF16, F16 };
std::size_t dtype_bytes(Dtype d) { return d == Dtype::F32 ? 4 : 2; }

struct InputSpec {
  std::string name;
  Dtype dtype;
  std::size_t count;
  float lo, hi;
};
// A device scalar read by the kernel (the FP8 scale).
struct ScalarSpec {
  std::string name;
  float value;
};
struct OutputSpec {
  std::string name;
  std::size_t bytes;  // 0: the case does not use this output (a null pointer is passed)
  bool zero_first;    // amax: must hold 0 before the launch; everything else is poisoned
  // dbias partial sums: [rows of each version's grid.y, sum_cols] fp32, compared as column sums
  // within fp32 rounding (the versions' tiles may sum the rows in another order); 0: byte compare.
  std::size_t sum_cols = 0;
  unsigned partial_rows_original = 0, partial_rows_current = 0;
};

struct Launch {
  const void* kernel;
  dim3 grid, block;
  std::size_t smem;
};

// Pointers of one set: inputs, then scalars, then outputs, in spec order.
using Pointers = std::vector<void*>;

struct Case {
  std::string name;
  std::string shape;
  bool timed;  // large case: timed; small case: checked only
  std::vector<InputSpec> inputs;
  std::vector<ScalarSpec> scalars;
  std::vector<OutputSpec> outputs;
  std::size_t counted_bytes;  // bytes read + written, for GB/s
  // Geometry and kernel of either version, and the params struct bytes for given pointers (the
  // current structs may have fields the original's lack, e.g. scale_record).
  std::function<Launch(bool original)> launch;
  std::function<std::vector<unsigned char>(const Pointers&, bool original)> params;
};

int g_num_sms = 0;
std::size_t g_l2_bytes = 0;

template <typename Params>
std::vector<unsigned char> bytes_of(const Params& p) {
  std::vector<unsigned char> out(sizeof(Params));
  std::memcpy(out.data(), &p, sizeof(Params));
  return out;
}

// Launch rules of either version: codegen's formulas (compiler/codegen/plan_groups.cpp).
template <bool kOriginal>
struct Rules;
// Why a macro: the two versions' rules are the same calls in two namespaces.
#define OPFUSE_BENCH_RULES(ORIGINAL, NS)                                                      \
  template <>                                                                                 \
  struct Rules<ORIGINAL> {                                                                    \
    static dim3 tile_grid(long long rows, int cols) {                                         \
      return dim3(NS::launch::tile_grid_x(cols), NS::launch::tile_grid_y(rows));              \
    }                                                                                         \
    static int tile_threads() { return NS::launch::kTileThreads; }                            \
    static Launch norm_fwd(const void* kernel, int hidden, int bytes, bool rms, bool t,       \
                           long long rows) {                                                  \
      namespace l = NS::launch;                                                               \
      const int block = l::norm_fwd_block_threads(hidden, bytes, t);                          \
      const std::size_t smem = l::norm_fwd_dynamic_smem_bytes(hidden, t);                     \
      long long grid = 0;                                                                     \
      if (t) {                                                                                \
        grid = std::min<long long>(l::ceil_div(rows, l::norm_transpose_tile_rows(hidden)),    \
                                   g_num_sms);                                                \
      } else {                                                                                \
        const int resident = l::min_blocks(block, l::norm_fwd_register_budget(rms, false));   \
        grid = std::min<long long>(                                                           \
            l::ceil_div(rows, l::norm_fwd_rows_per_block(hidden, bytes, false)),              \
            static_cast<long long>(g_num_sms) * resident);                                    \
      }                                                                                       \
      return {kernel, dim3(static_cast<unsigned>(std::max<long long>(grid, 1))), dim3(block), \
              smem};                                                                          \
    }                                                                                         \
    static Launch norm_bwd(const void* kernel, int hidden, int bytes) {                       \
      namespace l = NS::launch;                                                               \
      const int block = l::norm_bwd_block_threads(hidden, bytes);                             \
      const int resident = l::min_blocks(block, l::kNormBwdRegisterBudget);                   \
      return {kernel, dim3(g_num_sms * resident), dim3(block), 0};                            \
    }                                                                                         \
    static int norm_bwd_rows_per_block(int hidden, int bytes) {                               \
      return NS::launch::norm_bwd_rows_per_block(hidden, bytes);                              \
    }                                                                                         \
    static dim3 block_grid(long long rows, int cols) {                                        \
      return dim3(NS::launch::block_cast_grid_x(cols), NS::launch::block_cast_grid_y(rows));  \
    }                                                                                         \
    static int block_threads() { return NS::launch::kBlockCastThreads; }                      \
    static int block_activation_threads(int planes) {                                         \
      return NS::launch::block_activation_threads(planes);                                    \
    }                                                                                         \
    static std::size_t block_activation_smem(int loads, int planes) {                         \
      return NS::launch::block_activation_smem_bytes(loads, planes, false);                   \
    }                                                                                         \
  };
OPFUSE_BENCH_RULES(false, opfuse)
OPFUSE_BENCH_RULES(true, opfuse_original)
#undef OPFUSE_BENCH_RULES

template <typename T>
Dtype dtype_of() {
  if constexpr (std::is_same_v<T, float>) return Dtype::F32;
  if constexpr (std::is_same_v<T, __half>) return Dtype::F16;
  return Dtype::BF16;
}
template <typename T>
constexpr bool is_fp8() {
  return std::is_same_v<T, e4m3> || std::is_same_v<T, e5m2>;
}
template <typename T>
float default_scale() {
  return std::is_same_v<T, e5m2> ? 4096.0f : 48.0f;
}

// layernorm_fwd / rmsnorm_fwd with saved statistics (a training forward).
template <bool kRms, typename In, typename Out, int kHidden, bool kZeroCentered, bool kTranspose>
Case norm_fwd_case(long long rows, bool timed) {
  const void* current =
      kRms ? reinterpret_cast<const void*>(
                 &opfuse::rmsnorm_fwd<In, Out, kHidden, kZeroCentered, kTranspose>)
           : reinterpret_cast<const void*>(
                 &opfuse::layernorm_fwd<In, Out, kHidden, kZeroCentered, kTranspose>);
  const void* original =
      kRms ? reinterpret_cast<const void*>(
                 &opfuse_original::rmsnorm_fwd<In, Out, kHidden, kZeroCentered, kTranspose>)
           : reinterpret_cast<const void*>(
                 &opfuse_original::layernorm_fwd<In, Out, kHidden, kZeroCentered, kTranspose>);
  const std::size_t n = static_cast<std::size_t>(rows) * kHidden;
  const std::size_t b = sizeof(In), ob = sizeof(Out);
  Case c;
  c.name = std::string(kRms ? "rmsnorm_fwd" : "layernorm_fwd") + (is_fp8<Out>() ? "->fp8" : "") +
           (kTranspose ? "+T" : "");
  c.shape = "[" + std::to_string(rows) + ", " + std::to_string(kHidden) + "]";
  c.timed = timed;
  c.inputs = {{"x", dtype_of<In>(), n, -3.0f, 3.0f},
              {"gamma", dtype_of<In>(), kHidden, 0.5f, 1.5f},
              {"beta", dtype_of<In>(), kHidden, -0.5f, 0.5f}};
  c.scalars = {{"scale", default_scale<Out>()}};
  c.outputs = {{"y", n * ob, false},
               {"y_t", kTranspose ? n * ob : 0, false},
               {"amax", 4, true},
               {"mean", kRms ? 0 : static_cast<std::size_t>(rows) * 4, false},
               {"rstd", static_cast<std::size_t>(rows) * 4, false}};
  c.counted_bytes = n * b + 2 * kHidden * b + n * ob * (kTranspose ? 2 : 1) + rows * 8;
  c.launch = [=](bool orig) {
    return orig ? Rules<true>::norm_fwd(original, kHidden, b, kRms, kTranspose, rows)
                : Rules<false>::norm_fwd(current, kHidden, b, kRms, kTranspose, rows);
  };
  c.params = [=](const Pointers& p, bool /*orig: same layout*/) {
    const auto* x = static_cast<const In*>(p[0]);
    const auto* gamma = static_cast<const In*>(p[1]);
    const auto* beta = static_cast<const In*>(p[2]);
    auto* y = static_cast<Out*>(p[4]);
    Out* y_t = kTranspose ? static_cast<Out*>(p[5]) : nullptr;
    const auto* scale = static_cast<const float*>(p[3]);
    auto *amax = static_cast<float*>(p[6]), *mean = static_cast<float*>(p[7]),
         *rstd = static_cast<float*>(p[8]);
    const int n_rows = static_cast<int>(rows);
    return bytes_of(opfuse::NormFwdParams<In, Out>{x, gamma, beta, y, y_t, scale, amax, nullptr,
                                                   mean, rstd, 1e-5f, n_rows});
  };
  return c;
}

template <typename In, int kHidden>
Case layernorm_bwd_case(long long rows, bool timed = false) {
  const void* current = reinterpret_cast<const void*>(&opfuse::layernorm_bwd<In, kHidden>);
  const void* original =
      reinterpret_cast<const void*>(&opfuse_original::layernorm_bwd<In, kHidden>);
  const std::size_t n = static_cast<std::size_t>(rows) * kHidden;
  const int b = sizeof(In);
  // The partial buffers hold gridDim.x * rows_per_block rows; both versions launch the same grid
  // (checked below), so one size fits.
  const Launch cur = Rules<false>::norm_bwd(current, kHidden, b);
  const std::size_t partial_rows =
      static_cast<std::size_t>(cur.grid.x) * Rules<false>::norm_bwd_rows_per_block(kHidden, b);
  Case c;
  c.name = "layernorm_bwd";
  c.shape = "[" + std::to_string(rows) + ", " + std::to_string(kHidden) + "]";
  c.timed = timed;
  c.inputs = {{"dy", dtype_of<In>(), n, -1.0f, 1.0f},
              {"x", dtype_of<In>(), n, -3.0f, 3.0f},
              {"gamma", dtype_of<In>(), kHidden, 0.5f, 1.5f},
              {"mean", Dtype::F32, static_cast<std::size_t>(rows), -0.2f, 0.2f},
              {"rstd", Dtype::F32, static_cast<std::size_t>(rows), 0.5f, 1.5f}};
  c.outputs = {{"dx", n * b, false},
               {"dgamma_partial", partial_rows * kHidden * 4, false},
               {"dbeta_partial", partial_rows * kHidden * 4, false}};
  c.counted_bytes = 3 * n * b;
  c.launch = [=](bool orig) {
    const Launch l = orig ? Rules<true>::norm_bwd(original, kHidden, b)
                          : Rules<false>::norm_bwd(current, kHidden, b);
    if (static_cast<std::size_t>(l.grid.x) *
            (orig ? Rules<true>::norm_bwd_rows_per_block(kHidden, b)
                  : Rules<false>::norm_bwd_rows_per_block(kHidden, b)) !=
        partial_rows) {
      std::fprintf(stderr, "layernorm_bwd: the versions need different partial buffers\n");
      std::exit(2);
    }
    return l;
  };
  c.params = [=](const Pointers& p, bool /*orig: same layout*/) {
    opfuse::NormBwdParams<In> params{
        static_cast<const In*>(p[0]),    static_cast<const In*>(p[1]),
        static_cast<const In*>(p[2]),    static_cast<const float*>(p[3]),
        static_cast<const float*>(p[4]), nullptr,
        static_cast<In*>(p[5]),          static_cast<float*>(p[6]),
        static_cast<float*>(p[7]),       static_cast<int>(rows)};
    return bytes_of(params);
  };
  return c;
}

// A tiled kernel's launch with an optional smaller grid.y (row tiles strided).
template <bool kOriginal>
Launch tile_launch(const void* kernel, long long rows, int cols, unsigned grid_y) {
  dim3 grid = Rules<kOriginal>::tile_grid(rows, cols);
  if (grid_y > 0) grid.y = std::min(grid.y, grid_y);
  return {kernel, grid, dim3(Rules<kOriginal>::tile_threads()), 0};
}

template <typename In, typename Out, bool kTranspose, bool kDbias>
Case cast_case(long long rows, int cols, bool timed, unsigned grid_y = 0) {
  const void* current =
      reinterpret_cast<const void*>(&opfuse::cast_transpose<In, Out, kTranspose, kDbias>);
  const void* original =
      reinterpret_cast<const void*>(&opfuse_original::cast_transpose<In, Out, kTranspose, kDbias>);
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  const unsigned partial_rows = tile_launch<false>(current, rows, cols, grid_y).grid.y;
  const unsigned partial_rows_original = tile_launch<true>(original, rows, cols, grid_y).grid.y;
  Case c;
  c.name = std::string("cast_transpose") + (kTranspose ? "+T" : "") + (kDbias ? "+dbias" : "");
  c.shape = "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
  c.timed = timed;
  c.inputs = {{"x", dtype_of<In>(), n, -300.0f, 300.0f}};
  c.scalars = {{"scale", 1.25f}};
  c.outputs = {{"y", n * sizeof(Out), false},
               {"y_t", kTranspose ? n * sizeof(Out) : 0, false},
               {"amax", 4, true},
               {"dbias_partial",
                kDbias ? std::size_t{std::max(partial_rows, partial_rows_original)} * cols * 4 : 0,
                false, static_cast<std::size_t>(cols), partial_rows_original, partial_rows}};
  c.counted_bytes = n * sizeof(In) + n * sizeof(Out) * (kTranspose ? 2 : 1);
  c.launch = [=](bool orig) {
    return orig ? tile_launch<true>(original, rows, cols, grid_y)
                : tile_launch<false>(current, rows, cols, grid_y);
  };
  c.params = [=](const Pointers& p, bool /*orig: same layout*/) {
    opfuse::CastParams<In, Out> params{static_cast<const In*>(p[0]),
                                       static_cast<Out*>(p[2]),
                                       kTranspose ? static_cast<Out*>(p[3]) : nullptr,
                                       static_cast<const float*>(p[1]),
                                       static_cast<float*>(p[4]),
                                       kDbias ? static_cast<float*>(p[5]) : nullptr,
                                       static_cast<int>(rows),
                                       cols};
    return bytes_of(params);
  };
  return c;
}

// gated_activation_fwd: x [rows, 2n] -> y [rows, n] (+ y_t [n, rows]).
template <typename Act, typename In, typename Out, bool kTranspose>
Case gated_fwd_case(long long rows, int n_cols, bool timed, unsigned grid_y = 0) {
  const void* current =
      reinterpret_cast<const void*>(&opfuse::gated_activation_fwd<Act, In, Out, kTranspose>);
  const void* original = reinterpret_cast<const void*>(
      &opfuse_original::gated_activation_fwd<Act, In, Out, kTranspose>);
  const std::size_t n = static_cast<std::size_t>(rows) * n_cols;
  Case c;
  c.name = std::string("swiglu_fwd->fp8") + (kTranspose ? "+T" : "");
  c.shape = "x [" + std::to_string(rows) + ", 2*" + std::to_string(n_cols) + "]";
  c.timed = timed;
  c.inputs = {{"x", dtype_of<In>(), 2 * n, -4.0f, 4.0f}};
  c.scalars = {{"scale", default_scale<Out>()}};
  c.outputs = {{"y", n * sizeof(Out), false},
               {"y_t", kTranspose ? n * sizeof(Out) : 0, false},
               {"amax", 4, true}};
  c.counted_bytes = 2 * n * sizeof(In) + n * sizeof(Out) * (kTranspose ? 2 : 1);
  c.launch = [=](bool orig) {
    return orig ? tile_launch<true>(original, rows, n_cols, grid_y)
                : tile_launch<false>(current, rows, n_cols, grid_y);
  };
  c.params = [=](const Pointers& p, bool /*orig: same layout*/) {
    const auto* x = static_cast<const In*>(p[0]);
    auto* y = static_cast<Out*>(p[2]);
    Out* y_t = kTranspose ? static_cast<Out*>(p[3]) : nullptr;
    const auto* scale = static_cast<const float*>(p[1]);
    auto* amax = static_cast<float*>(p[4]);
    const int n_rows = static_cast<int>(rows);
    return bytes_of(
        opfuse::ActivationFwdParams<In, Out>{x, y, y_t, scale, amax, nullptr, n_rows, n_cols});
  };
  return c;
}

// gated_activation_bwd: dy [rows, n], x [rows, 2n] -> dx [rows, 2n] (+ dx_t [2n, rows]), or the
// plain activation_bwd (dy, x [rows, n] -> dx [rows, n]).
template <bool kGated, typename Act, typename In, typename Out, bool kTranspose, bool kDbias>
Case act_bwd_case(long long rows, int n_cols, bool timed, unsigned grid_y = 0) {
  const void* current = nullptr;
  const void* original = nullptr;
  if constexpr (kGated) {
    current = reinterpret_cast<const void*>(
        &opfuse::gated_activation_bwd<Act, In, Out, kTranspose, kDbias>);
    original = reinterpret_cast<const void*>(
        &opfuse_original::gated_activation_bwd<Act, In, Out, kTranspose, kDbias>);
  } else {
    current =
        reinterpret_cast<const void*>(&opfuse::activation_bwd<Act, In, Out, kTranspose, kDbias>);
    original = reinterpret_cast<const void*>(
        &opfuse_original::activation_bwd<Act, In, Out, kTranspose, kDbias>);
  }
  const std::size_t n = static_cast<std::size_t>(rows) * n_cols;
  const std::size_t planes = kGated ? 2 : 1;
  const unsigned partial_rows = tile_launch<false>(current, rows, n_cols, grid_y).grid.y;
  const unsigned partial_rows_original = tile_launch<true>(original, rows, n_cols, grid_y).grid.y;
  Case c;
  c.name = std::string(kGated ? "swiglu_bwd" : "gelu_bwd") + "->fp8" + (kTranspose ? "+T" : "") +
           (kDbias ? "+dbias" : "");
  c.shape =
      "x [" + std::to_string(rows) + ", " + (kGated ? "2*" : "") + std::to_string(n_cols) + "]";
  c.timed = timed;
  c.inputs = {{"dy", dtype_of<In>(), n, -1.0f, 1.0f},
              {"x", dtype_of<In>(), planes * n, -4.0f, 4.0f}};
  c.scalars = {{"scale", default_scale<Out>()}};
  c.outputs = {
      {"dx", planes * n * sizeof(Out), false},
      {"dx_t", kTranspose ? planes * n * sizeof(Out) : 0, false},
      {"amax", 4, true},
      {"dbias_partial",
       kDbias ? std::size_t{std::max(partial_rows, partial_rows_original)} * planes * n_cols * 4
              : 0,
       false, planes * n_cols, partial_rows_original, partial_rows}};
  c.counted_bytes =
      n * sizeof(In) + planes * n * sizeof(In) + planes * n * sizeof(Out) * (kTranspose ? 2 : 1);
  c.launch = [=](bool orig) {
    return orig ? tile_launch<true>(original, rows, n_cols, grid_y)
                : tile_launch<false>(current, rows, n_cols, grid_y);
  };
  c.params = [=](const Pointers& p, bool /*orig: same layout*/) {
    const auto* dy = static_cast<const In*>(p[0]);
    const auto* x = static_cast<const In*>(p[1]);
    auto* dx = static_cast<Out*>(p[3]);
    Out* dx_t = kTranspose ? static_cast<Out*>(p[4]) : nullptr;
    const auto* scale = static_cast<const float*>(p[2]);
    auto* amax = static_cast<float*>(p[5]);
    float* partial = kDbias ? static_cast<float*>(p[6]) : nullptr;
    const int n_rows = static_cast<int>(rows);
    return bytes_of(opfuse::ActivationBwdParams<In, Out>{dy, x, dx, dx_t, scale, amax, nullptr,
                                                         partial, n_rows, n_cols});
  };
  return c;
}

// The scale_inv grid bytes of a [rows, cols] block-scaled copy (launch_rules.h; padding entries
// are not written, so the grids start zeroed in both versions).
std::size_t block_grid_bytes(long long rows, long long cols, bool two_d) {
  return static_cast<std::size_t>(opfuse::launch::block_scale_grid_outer(rows, cols, two_d) *
                                  opfuse::launch::block_scale_grid_inner(rows, cols, two_d)) *
         4;
}

template <bool kOriginal>
Launch block_launch(const void* kernel, long long rows, int cols, std::size_t smem = 0,
                    int threads = 0) {
  return {kernel, Rules<kOriginal>::block_grid(rows, cols),
          dim3(threads ? threads : Rules<kOriginal>::block_threads()), smem};
}

// block_cast_transpose (float8_block_scaling): x [rows, cols] -> the row-wise copy (1 x 128 or
// 128 x 128 blocks; `rowwise` false: not written, as after a norm that wrote it) and the
// column-wise copy [cols, rows], power-of-2 scales.
template <typename In, typename Out, bool kTwoD, bool kTranspose>
Case block_cast_case(long long rows, int cols, bool timed, bool rowwise = true) {
  const void* current =
      reinterpret_cast<const void*>(&opfuse::block_cast_transpose<In, Out, kTwoD, kTranspose>);
  const void* original = reinterpret_cast<const void*>(
      &opfuse_original::block_cast_transpose<In, Out, kTwoD, kTranspose>);
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  Case c;
  c.name = std::string("block_cast") + (kTwoD ? "128x128" : "1x128") + (rowwise ? "" : "-rows") +
           (kTranspose ? "+T" : "") + (std::is_same_v<Out, e5m2> ? "->e5m2" : "");
  c.shape = "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
  c.timed = timed;
  c.inputs = {{"x", dtype_of<In>(), n, -300.0f, 300.0f}};
  c.outputs = {{"y", rowwise ? n * sizeof(Out) : 0, false},
               {"y_scale_inv", rowwise ? block_grid_bytes(rows, cols, kTwoD) : 0, true},
               {"y_t", kTranspose ? n * sizeof(Out) : 0, false},
               {"y_t_scale_inv", kTranspose ? block_grid_bytes(cols, rows, kTwoD) : 0, true}};
  c.counted_bytes = n * sizeof(In) + n * sizeof(Out) * ((rowwise ? 1 : 0) + (kTranspose ? 1 : 0)) +
                    c.outputs[1].bytes + c.outputs[3].bytes;
  c.launch = [=](bool orig) {
    return orig ? block_launch<true>(original, rows, cols)
                : block_launch<false>(current, rows, cols);
  };
  c.params = [=](const Pointers& p, bool /*orig: same layout*/) {
    return bytes_of(opfuse::BlockCastParams<In, Out>{
        static_cast<const In*>(p[0]), rowwise ? static_cast<Out*>(p[1]) : nullptr,
        rowwise ? static_cast<float*>(p[2]) : nullptr,
        kTranspose ? static_cast<Out*>(p[3]) : nullptr,
        kTranspose ? static_cast<float*>(p[4]) : nullptr, 0.0f, 1, static_cast<int>(rows), cols});
  };
  return c;
}

// The fused block-scaled SwiGLU (block_activation.cuh): forward x [rows, 2n] -> y [rows, n] and
// y_t [n, rows]; backward dy [rows, n], x [rows, 2n] -> dx [rows, 2n] and dx_t [2n, rows]; both
// with their 1 x 128 / 128 x 1 grids.
template <bool kBackward, typename In, typename Out>
Case block_swiglu_case(long long rows, int n_cols, bool timed) {
  using Act = opfuse::BenchSwiglu;
  const void* current =
      kBackward
          ? reinterpret_cast<const void*>(
                &opfuse::block_gated_activation_bwd<Act, In, Out, true, false>)
          : reinterpret_cast<const void*>(&opfuse::block_gated_activation_fwd<Act, In, Out, true>);
  const void* original =
      kBackward ? reinterpret_cast<const void*>(
                      &opfuse_original::block_gated_activation_bwd<Act, In, Out, true, false>)
                : reinterpret_cast<const void*>(
                      &opfuse_original::block_gated_activation_fwd<Act, In, Out, true>);
  const std::size_t n = static_cast<std::size_t>(rows) * n_cols;
  const int planes = kBackward ? 2 : 1;
  const int loads = kBackward ? 3 : 2;
  const long long out_cols = static_cast<long long>(planes) * n_cols;
  Case c;
  c.name = std::string(kBackward ? "block_swiglu_bwd" : "block_swiglu_fwd") + "+T";
  c.shape = "x [" + std::to_string(rows) + ", 2*" + std::to_string(n_cols) + "]";
  c.timed = timed;
  c.inputs = {{"x", dtype_of<In>(), 2 * n, -4.0f, 4.0f}};
  if (kBackward) c.inputs.push_back({"dy", dtype_of<In>(), n, -1.0f, 1.0f});
  c.outputs = {{"y", planes * n * sizeof(Out), false},
               {"y_scale_inv", block_grid_bytes(rows, out_cols, false), true},
               {"y_t", planes * n * sizeof(Out), false},
               {"y_t_scale_inv", block_grid_bytes(out_cols, rows, false), true}};
  c.counted_bytes = (kBackward ? 3 : 2) * n * sizeof(In) + 2 * planes * n * sizeof(Out) +
                    c.outputs[1].bytes + c.outputs[3].bytes;
  c.launch = [=](bool orig) {
    return orig ? block_launch<true>(original, rows, n_cols,
                                     Rules<true>::block_activation_smem(loads, planes),
                                     Rules<true>::block_activation_threads(planes))
                : block_launch<false>(current, rows, n_cols,
                                      Rules<false>::block_activation_smem(loads, planes),
                                      Rules<false>::block_activation_threads(planes));
  };
  c.params = [=](const Pointers& p, bool /*orig: same layout*/) {
    const std::size_t o = kBackward ? 2 : 1;  // first output
    return bytes_of(opfuse::BlockActivationParams<In, Out>{
        kBackward ? static_cast<const In*>(p[1]) : nullptr, static_cast<const In*>(p[0]),
        static_cast<Out*>(p[o]), static_cast<float*>(p[o + 1]), static_cast<Out*>(p[o + 2]),
        static_cast<float*>(p[o + 3]), nullptr, 0.0f, 1, static_cast<int>(rows), n_cols});
  };
  return c;
}

std::vector<Case> all_cases() {
  using Gelu = opfuse::BenchGelu;
  using Silu = opfuse::BenchSwiglu;
  std::vector<Case> cases;
  // The large cases of bench/RESULTS.md (H100), each with its no-transpose twin where one exists.
  cases.push_back(norm_fwd_case<false, bf16, e4m3, 4096, false, true>(16384, true));
  cases.push_back(norm_fwd_case<false, bf16, e4m3, 4096, false, false>(16384, true));
  cases.push_back(norm_fwd_case<false, bf16, bf16, 4096, false, false>(16384, true));
  cases.push_back(norm_fwd_case<true, bf16, e4m3, 4096, false, false>(16384, true));
  cases.push_back(layernorm_bwd_case<bf16, 4096>(16384, true));
  cases.push_back(act_bwd_case<true, Silu, bf16, e5m2, true, false>(16384, 28672, true));
  cases.push_back(act_bwd_case<true, Silu, bf16, e5m2, false, false>(16384, 28672, true));
  cases.push_back(cast_case<bf16, e4m3, true, false>(57344, 4096, true));
  cases.push_back(cast_case<bf16, e4m3, true, false>(4096, 28672, true));
  cases.push_back(cast_case<bf16, e4m3, true, false>(16384, 4096, true));
  cases.push_back(cast_case<bf16, e4m3, true, false>(16384, 28672, true));
  cases.push_back(cast_case<bf16, e4m3, false, false>(16384, 28672, true));
  cases.push_back(gated_fwd_case<Silu, bf16, e4m3, true>(16384, 28672, true));
  cases.push_back(gated_fwd_case<Silu, bf16, e4m3, false>(16384, 28672, true));
  // float8_block_scaling's kernels at bench/workloads/mlp_large.fuse's sizes: fc2's output
  // gradient (both 1 x 128 copies), fc1's input after the norm wrote its row-wise copy, the
  // weights' 128 x 128 casts, and the fused SwiGLU forward and backward.
  cases.push_back(block_cast_case<bf16, e5m2, false, true>(16384, 4096, true));
  cases.push_back(block_cast_case<bf16, e4m3, false, false>(16384, 4096, true));
  cases.push_back(block_cast_case<bf16, e4m3, false, true>(16384, 4096, true, false));
  cases.push_back(block_cast_case<bf16, e4m3, true, true>(28672, 4096, true));
  cases.push_back(block_swiglu_case<false, bf16, e4m3>(16384, 14336, true));
  cases.push_back(block_swiglu_case<true, bf16, e5m2>(16384, 14336, true));
  // Small checks: tails (rows not a multiple of 16 or of the tile, partial column tiles), other
  // dtypes and widths (idle slots, several row groups per block: named barriers), dbias, and
  // grids with fewer row tiles than the tensor (strided row tiles).
  cases.push_back(norm_fwd_case<false, bf16, e4m3, 4096, false, true>(1037, false));
  cases.push_back(norm_fwd_case<false, bf16, e4m3, 4096, false, true>(1040, false));
  cases.push_back(norm_fwd_case<true, bf16, e4m3, 4096, true, true>(777, false));
  cases.push_back(norm_fwd_case<false, float, e5m2, 8192, false, true>(300, false));
  cases.push_back(norm_fwd_case<false, float, e4m3, 768, false, true>(515, false));
  cases.push_back(norm_fwd_case<false, float, e4m3, 768, false, false>(515, false));
  cases.push_back(norm_fwd_case<true, __half, e4m3, 1000, false, true>(333, false));
  cases.push_back(norm_fwd_case<false, __half, __half, 1000, false, false>(333, false));
  cases.push_back(norm_fwd_case<false, bf16, e4m3, 4096, false, false>(1037, false));
  cases.push_back(norm_fwd_case<true, bf16, bf16, 4096, true, false>(777, false));
  cases.push_back(layernorm_bwd_case<bf16, 512>(333));
  cases.push_back(layernorm_bwd_case<bf16, 4096>(1037));
  cases.push_back(layernorm_bwd_case<float, 768>(301));
  cases.push_back(cast_case<bf16, e4m3, true, false>(1037, 4104, false));
  cases.push_back(cast_case<bf16, e5m2, true, true>(1037, 4104, false, 7));
  cases.push_back(cast_case<float, e4m3, true, false>(515, 1000, false));
  cases.push_back(act_bwd_case<true, Silu, bf16, e5m2, true, true>(1037, 1032, false, 5));
  cases.push_back(act_bwd_case<false, Gelu, bf16, e5m2, true, true>(600, 2056, false));
  cases.push_back(gated_fwd_case<Silu, bf16, e4m3, true>(1037, 4104, false));
  cases.push_back(gated_fwd_case<Silu, bf16, e4m3, true>(4096, 4096, false, 13));
  cases.push_back(block_cast_case<bf16, e4m3, false, true>(1037, 4104, false));
  cases.push_back(block_cast_case<bf16, e5m2, false, true>(300, 1000, false, false));
  cases.push_back(block_cast_case<float, e4m3, false, true>(515, 1000, false));
  cases.push_back(block_cast_case<bf16, e4m3, true, true>(1037, 4104, false));
  cases.push_back(block_swiglu_case<false, bf16, e4m3>(1037, 1032, false));
  cases.push_back(block_swiglu_case<true, bf16, e5m2>(1037, 1024, false));
  return cases;
}

// ---- running ---------------------------------------------------------------------------------

struct Options {
  int reps = 60;
  int warmup = 5;
  std::string only;
  bool skip_checks = false;
  std::string ncu;  // "", "original", "current", "both"
};

struct Set {
  Pointers pointers;  // inputs, scalars, outputs
};

void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, std::max<std::size_t>(bytes, 16)));
  return p;
}

void fill_input(void* p, const InputSpec& in, std::uint64_t seed, bool specials) {
  const unsigned grid = 4 * g_num_sms;
  switch (in.dtype) {
    case Dtype::F32:
      fill_random<<<grid, 256>>>(static_cast<float*>(p), in.count, seed, in.lo, in.hi, specials);
      break;
    case Dtype::BF16:
      fill_random<<<grid, 256>>>(static_cast<bf16*>(p), in.count, seed, in.lo, in.hi, specials);
      break;
    case Dtype::F16:
      fill_random<<<grid, 256>>>(static_cast<__half*>(p), in.count, seed, in.lo, in.hi, specials);
      break;
  }
  CHECK_CUDA(cudaGetLastError());
}

Set make_set(const Case& c, std::uint64_t seed, bool specials) {
  Set s;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    const InputSpec& in = c.inputs[i];
    void* p = device_alloc(in.count * dtype_bytes(in.dtype));
    fill_input(p, in, seed + 1000 * i, specials && i == 0);
    s.pointers.push_back(p);
  }
  for (const ScalarSpec& sc : c.scalars) {
    void* p = device_alloc(sizeof(float));
    CHECK_CUDA(cudaMemcpy(p, &sc.value, sizeof(float), cudaMemcpyHostToDevice));
    s.pointers.push_back(p);
  }
  for (const OutputSpec& out : c.outputs) {
    void* p = out.bytes > 0 ? device_alloc(out.bytes) : nullptr;
    if (p != nullptr) CHECK_CUDA(cudaMemset(p, 0, out.bytes));
    s.pointers.push_back(p);
  }
  return s;
}

void free_set(Set& s) {
  for (void* p : s.pointers) {
    if (p != nullptr) CHECK_CUDA(cudaFree(p));
  }
  s.pointers.clear();
}

// Raises the kernel's dynamic shared memory limit once, where it needs more than 48 KiB.
void prepare_kernel(const Launch& l) {
  static std::set<const void*> prepared;
  if (l.smem > 48 * 1024 && prepared.insert(l.kernel).second) {
    CHECK_CUDA(cudaFuncSetAttribute(l.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(l.smem)));
  }
}

void launch_once(const Case& c, bool original, const Pointers& p, cudaStream_t stream) {
  const Launch l = c.launch(original);
  prepare_kernel(l);
  std::vector<unsigned char> params = c.params(p, original);
  void* args[] = {params.data()};
  CHECK_CUDA(cudaLaunchKernel(l.kernel, l.grid, l.block, args, l.smem, stream));
  CHECK_CUDA(cudaGetLastError());
}

std::size_t first_output(const Case& c) { return c.inputs.size() + c.scalars.size(); }

void reset_outputs(const Case& c, const Pointers& p, int poison) {
  for (std::size_t k = 0; k < c.outputs.size(); ++k) {
    if (c.outputs[k].bytes == 0) continue;
    CHECK_CUDA(cudaMemset(p[first_output(c) + k], c.outputs[k].zero_first ? 0 : poison,
                          c.outputs[k].bytes));
  }
}

// Column sums (in double) of `rows` fp32 partial rows of width `cols`, and the sums of |partial|.
void column_sums(const void* device, unsigned rows, std::size_t cols, std::vector<double>& sums,
                 std::vector<double>& magnitudes) {
  std::vector<float> host(rows * cols);
  CHECK_CUDA(cudaMemcpy(host.data(), device, host.size() * 4, cudaMemcpyDeviceToHost));
  sums.assign(cols, 0.0);
  magnitudes.assign(cols, 0.0);
  for (unsigned r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) {
      sums[c] += host[r * cols + c];
      magnitudes[c] += std::fabs(host[r * cols + c]);
    }
  }
}

// Columns whose sums differ by more than fp32 rounding of the partials (NaN matches NaN, an
// infinity only the same infinity).
std::size_t column_sum_mismatches(const OutputSpec& out, const void* original,
                                  const void* current) {
  std::vector<double> sums_original, sums_current, magnitudes, unused;
  column_sums(original, out.partial_rows_original, out.sum_cols, sums_original, magnitudes);
  column_sums(current, out.partial_rows_current, out.sum_cols, sums_current, unused);
  std::size_t mismatches = 0;
  for (std::size_t c = 0; c < out.sum_cols; ++c) {
    const double a = sums_original[c], b = sums_current[c];
    if (std::isnan(a) || std::isnan(b) || std::isinf(a) || std::isinf(b)) {
      mismatches += (std::isnan(a) && std::isnan(b)) || a == b ? 0 : 1;
    } else if (std::fabs(a - b) > 1e-4 * magnitudes[c] + 1e-30) {
      ++mismatches;
    }
  }
  return mismatches;
}

// Runs both versions on one input set with differently poisoned outputs; true when every output
// matches byte for byte.
bool check_case(const Case& c, std::uint64_t seed) {
  Set s = make_set(c, seed, /*specials=*/true);
  Pointers reference = s.pointers;  // same inputs, separate outputs
  for (std::size_t k = 0; k < c.outputs.size(); ++k) {
    reference[first_output(c) + k] =
        c.outputs[k].bytes > 0 ? device_alloc(c.outputs[k].bytes) : nullptr;
  }
  reset_outputs(c, reference, 0xA5);
  reset_outputs(c, s.pointers, 0x5A);
  launch_once(c, true, reference, nullptr);
  launch_once(c, false, s.pointers, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());

  unsigned long long* counters = static_cast<unsigned long long*>(device_alloc(16));
  bool ok = true;
  std::string detail;
  for (std::size_t k = 0; k < c.outputs.size(); ++k) {
    if (c.outputs[k].bytes == 0) continue;
    if (c.outputs[k].sum_cols > 0) {
      const std::size_t bad = column_sum_mismatches(c.outputs[k], reference[first_output(c) + k],
                                                    s.pointers[first_output(c) + k]);
      if (bad != 0) {
        ok = false;
        detail += " " + c.outputs[k].name + ": " + std::to_string(bad) + " column sums differ";
      }
      continue;
    }
    const unsigned long long init[2] = {0, ~0ULL};
    CHECK_CUDA(cudaMemcpy(counters, init, 16, cudaMemcpyHostToDevice));
    count_mismatches<<<4 * g_num_sms, 256>>>(
        static_cast<const unsigned char*>(reference[first_output(c) + k]),
        static_cast<const unsigned char*>(s.pointers[first_output(c) + k]), c.outputs[k].bytes,
        counters, counters + 1);
    CHECK_CUDA(cudaGetLastError());
    unsigned long long result[2];
    CHECK_CUDA(cudaMemcpy(result, counters, 16, cudaMemcpyDeviceToHost));
    if (result[0] != 0) {
      ok = false;
      detail += " " + c.outputs[k].name + ": " + std::to_string(result[0]) +
                " bytes differ (first at " + std::to_string(result[1]) + ")";
    }
  }
  std::printf("check %-28s %-22s %s%s\n", c.name.c_str(), c.shape.c_str(),
              ok ? "bit-exact" : "MISMATCH", detail.c_str());
  CHECK_CUDA(cudaFree(counters));
  for (std::size_t k = 0; k < c.outputs.size(); ++k) {
    if (reference[first_output(c) + k] != nullptr) {
      CHECK_CUDA(cudaFree(reference[first_output(c) + k]));
    }
  }
  free_set(s);
  return ok;
}

float median_of(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median time in ms of reps launches of `run(set index)`, after warm-up, one event pair each.
// --dirty-l2 MB: before each timed launch (outside its events) a memset of this many bytes leaves
// the L2 full of dirty lines, as a GEMM's output does for the kernel that follows it in a model.
void* g_dirty_buffer = nullptr;
std::size_t g_dirty_bytes = 0;
void dirty_l2(int i) {
  if (g_dirty_bytes > 0) CHECK_CUDA(cudaMemsetAsync(g_dirty_buffer, i & 0xFF, g_dirty_bytes));
}

float time_median(int reps, int warmup, int sets, const std::function<void(int)>& run) {
  for (int i = 0; i < warmup; ++i) {
    dirty_l2(i);
    run(i % sets);
  }
  std::vector<cudaEvent_t> events(2 * reps);
  for (cudaEvent_t& e : events) CHECK_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    dirty_l2(i);
    CHECK_CUDA(cudaEventRecord(events[2 * i]));
    run(i % sets);
    CHECK_CUDA(cudaEventRecord(events[2 * i + 1]));
  }
  CHECK_CUDA(cudaEventSynchronize(events.back()));
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventElapsedTime(&ms[i], events[2 * i], events[2 * i + 1]));
  }
  for (cudaEvent_t& e : events) CHECK_CUDA(cudaEventDestroy(e));
  return median_of(ms);
}

struct Timing {
  std::string name, shape;
  double gbytes;
  int sets;
  float original_ms[2], current_ms[2], copy_ms;
};

std::size_t input_bytes(const Case& c) {
  std::size_t bytes = 0;
  for (const InputSpec& in : c.inputs) bytes += in.count * dtype_bytes(in.dtype);
  return bytes;
}

// Sets of `bytes` each that together hold at least 3x the L2.
int sets_for(std::size_t bytes) {
  return static_cast<int>(std::max<std::size_t>(1, (3 * g_l2_bytes + bytes - 1) / bytes));
}

Timing time_case(const Case& c, const Options& o) {
  // Enough sets that the inputs of one pass over them hold 3x the L2.
  const int sets = sets_for(input_bytes(c));
  std::vector<Set> all;
  for (int i = 0; i < sets; ++i) all.push_back(make_set(c, 77 + 13 * i, false));
  prepare_kernel(c.launch(true));
  prepare_kernel(c.launch(false));
  Timing t{c.name, c.shape, c.counted_bytes / 1e9, sets, {0, 0}, {0, 0}, 0};
  for (int round = 0; round < 2; ++round) {
    t.original_ms[round] = time_median(
        o.reps, o.warmup, sets, [&](int i) { launch_once(c, true, all[i].pointers, nullptr); });
    t.current_ms[round] = time_median(
        o.reps, o.warmup, sets, [&](int i) { launch_once(c, false, all[i].pointers, nullptr); });
  }
  for (Set& s : all) free_set(s);

  // The copy moves counted_bytes / 2 from one buffer to another: counted_bytes in all.
  const std::size_t copy_bytes = c.counted_bytes / 2;
  const int copy_sets = sets_for(copy_bytes);
  std::vector<void*> src, dst;
  for (int i = 0; i < copy_sets; ++i) {
    src.push_back(device_alloc(copy_bytes));
    dst.push_back(device_alloc(copy_bytes));
    CHECK_CUDA(cudaMemset(src.back(), 0x3C, copy_bytes));
  }
  t.copy_ms = time_median(o.reps, o.warmup, copy_sets, [&](int i) {
    CHECK_CUDA(cudaMemcpyAsync(dst[i], src[i], copy_bytes, cudaMemcpyDeviceToDevice, nullptr));
  });
  for (void* p : src) CHECK_CUDA(cudaFree(p));
  for (void* p : dst) CHECK_CUDA(cudaFree(p));
  return t;
}

void print_resources(const Case& c) {
  for (bool original : {true, false}) {
    const Launch l = c.launch(original);
    cudaFuncAttributes attr{};
    CHECK_CUDA(cudaFuncGetAttributes(&attr, l.kernel));
    prepare_kernel(l);
    int resident = 0;
    CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, l.kernel,
                                                             static_cast<int>(l.block.x), l.smem));
    std::printf("  %-8s %-28s grid (%u, %u) block %u smem %zu+%zu regs %d local %zu blocks/SM %d\n",
                original ? "original" : "current", c.name.c_str(), l.grid.x, l.grid.y, l.block.x,
                static_cast<std::size_t>(attr.sharedSizeBytes), l.smem, attr.numRegs,
                static_cast<std::size_t>(attr.localSizeBytes), resident);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--reps" && i + 1 < argc) {
      o.reps = std::atoi(argv[++i]);
    } else if (arg == "--only" && i + 1 < argc) {
      o.only = argv[++i];
    } else if (arg == "--skip-checks") {
      o.skip_checks = true;
    } else if (arg == "--ncu" && i + 1 < argc) {
      o.ncu = argv[++i];
    } else if (arg == "--dirty-l2" && i + 1 < argc) {
      g_dirty_bytes = static_cast<std::size_t>(std::atol(argv[++i])) << 20;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--reps N] [--only SUBSTRING] [--skip-checks] "
                   "[--ncu original|current|both] [--dirty-l2 MB]\n",
                   argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  g_num_sms = prop.multiProcessorCount;
  g_l2_bytes = static_cast<std::size_t>(prop.l2CacheSize);
  if (g_dirty_bytes > 0) g_dirty_buffer = device_alloc(g_dirty_bytes);
  std::printf("device: %s, %d SMs, L2 %zu MiB; reps %d (median), warm-up %d\n", prop.name,
              g_num_sms, g_l2_bytes >> 20, o.reps, o.warmup);

  std::vector<Case> cases = all_cases();
  // --only takes comma-separated substrings of "name shape".
  const auto selected = [&](const Case& c) {
    if (o.only.empty()) return true;
    const std::string label = c.name + " " + c.shape;
    for (std::size_t start = 0; start <= o.only.size();) {
      const std::size_t comma = std::min(o.only.find(',', start), o.only.size());
      if (label.find(o.only.substr(start, comma - start)) != std::string::npos) return true;
      start = comma + 1;
    }
    return false;
  };

  if (!o.ncu.empty()) {
    for (const Case& c : cases) {
      if (!c.timed || !selected(c)) continue;
      Set s = make_set(c, 5, false);
      for (bool original : {true, false}) {
        if (o.ncu != "both" && (o.ncu == "original") != original) continue;
        prepare_kernel(c.launch(original));
        launch_once(c, original, s.pointers, nullptr);
        CHECK_CUDA(cudaDeviceSynchronize());
      }
      free_set(s);
    }
    return 0;
  }

  int failures = 0;
  if (!o.skip_checks) {
    std::uint64_t seed = 1;
    for (const Case& c : cases) {
      if (selected(c) && !check_case(c, seed++ * 7919)) ++failures;
    }
  }

  std::printf("resources:\n");
  for (const Case& c : cases) {
    if (c.timed && selected(c)) print_resources(c);
  }

  std::vector<Timing> timings;
  for (const Case& c : cases) {
    if (c.timed && selected(c)) timings.push_back(time_case(c, o));
  }
  std::printf("\n%-24s %-22s %8s | %17s %9s | %17s %9s | %7s %7s\n", "kernel", "shape", "GB",
              "original us (x2)", "GB/s", "current us (x2)", "GB/s", "copy", "copy%");
  for (const Timing& t : timings) {
    const float orig = std::min(t.original_ms[0], t.original_ms[1]);
    const float cur = std::min(t.current_ms[0], t.current_ms[1]);
    std::printf("%-24s %-22s %8.3f | %8.1f %8.1f %9.0f | %8.1f %8.1f %9.0f | %7.0f %3.0f->%3.0f\n",
                t.name.c_str(), t.shape.c_str(), t.gbytes, 1e3 * t.original_ms[0],
                1e3 * t.original_ms[1], t.gbytes / (orig * 1e-3), 1e3 * t.current_ms[0],
                1e3 * t.current_ms[1], t.gbytes / (cur * 1e-3), t.gbytes / (t.copy_ms * 1e-3),
                100.0 * t.copy_ms / orig, 100.0 * t.copy_ms / cur);
  }
  if (failures > 0) {
    std::printf("\n%d case(s) differ from the original kernels\n", failures);
    return 1;
  }
  return 0;
}
