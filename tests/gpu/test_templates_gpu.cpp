// Kernel templates run on the GPU against the CPU reference numerics, bit for bit.
// Label `gpu`: skips (visibly) where no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../../templates/common/launch_rules.h"
#include "cpu/numerics.h"
#include "cpu/quantizer_math.h"
#include "gpu_test_support.h"
#include "ir/pointwise_ops.h"
#include "jit/nvrtc_compiler.h"

namespace opfuse {
namespace {

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(call)

// Mirrors templates/common/quantizer_record.cuh's QuantizerRecord field for field.
struct QuantizerRecord {
  float* amax;
  float* amax_history;
  float* scale;
  float* scale_inv;
  int history_length;
  int mode;
  float fp8_max;
  int margin;
  float epsilon;
  int power_of_2_scale;
};
static_assert(sizeof(QuantizerRecord) == 56);

class TemplatesGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no GPU on this machine: skipping GPU template tests";
    }
  }

  // Compiles `source` for this GPU and returns the kernel for `expression`.
  cudaKernel_t load(const std::string& source, const std::string& expression) {
    test::TemplateKernels loaded = test::load_template_kernels(source, {expression});
    kernel_ = std::move(loaded.compiled);
    return loaded.kernels.front();
  }

  jit::CompiledKernel kernel_;
};

template <typename T>
T* device_copy(const std::vector<T>& host) {
  T* p = nullptr;
  if (cudaMalloc(&p, host.size() * sizeof(T)) != cudaSuccess) return nullptr;
  cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return p;
}

template <typename T>
std::vector<T> host_copy(const T* device, size_t n) {
  std::vector<T> out(n);
  cudaMemcpy(out.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost);
  return out;
}

struct CastParams {  // CastParams<__nv_bfloat16, __nv_fp8_e4m3>
  const void* x;
  void* y;
  void* y_t;
  const float* scale;
  float* amax;
  float* dbias_partial;
  int rows;
  int cols;
};

TEST_F(TemplatesGpu, CastTransposeBf16ToE4m3MatchesCpuBitForBit) {
  const int rows = 200, cols = 512;  // 200 is not a multiple of the 128-row tile: tails run
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<uint16_t> x(size_t(rows) * cols);
  float expected_amax = 0.0f;
  for (auto& v : x) {
    v = cpu::float_to_bf16(normal(rng));
    expected_amax = std::fmax(expected_amax, std::fabs(cpu::bf16_to_float(v)));
  }
  x[5] = cpu::float_to_bf16(1e6f);  // saturates to 448 after scaling
  expected_amax = std::fmax(expected_amax, cpu::bf16_to_float(x[5]));
  const float scale = 37.5f;

  cudaKernel_t kernel = load("#include \"cast_transpose.cuh\"\n",
                             "opfuse::cast_transpose<__nv_bfloat16, __nv_fp8_e4m3, true, false>");
  ASSERT_EQ(kernel_.spill_store_bytes, 0);
  uint16_t* d_x = device_copy(x);
  uint8_t *d_y = nullptr, *d_yt = nullptr;
  float *d_scale = device_copy(std::vector<float>{scale}),
        *d_amax = device_copy(std::vector<float>{0.0f});
  CUDA_OK(cudaMalloc(&d_y, x.size()));
  CUDA_OK(cudaMalloc(&d_yt, x.size()));
  CUDA_OK(cudaMemset(d_y, 0xAB, x.size()));  // poison: every byte must be written
  CUDA_OK(cudaMemset(d_yt, 0xAB, x.size()));
  CastParams params{d_x, d_y, d_yt, d_scale, d_amax, nullptr, rows, cols};
  void* args[] = {&params};
  const dim3 grid(launch::tile_grid_x(cols), launch::tile_grid_y(rows));
  CUDA_OK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, dim3(launch::kTileThreads),
                           args, 0, nullptr));
  CUDA_OK(cudaDeviceSynchronize());

  const auto y = host_copy(d_y, x.size());
  const auto y_t = host_copy(d_yt, x.size());
  const float amax = host_copy(d_amax, 1)[0];
  size_t mismatches = 0;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const size_t i = size_t(r) * cols + c;
      const uint8_t want =
          cpu::float_to_fp8(cpu::bf16_to_float(x[i]) * scale, cpu::Fp8Format::E4M3);
      mismatches += y[i] != want;
      mismatches += y_t[size_t(c) * rows + r] != want;
    }
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(amax, expected_amax);
  EXPECT_EQ(y[5], 0x7E);  // +448
  cudaFree(d_x), cudaFree(d_y), cudaFree(d_yt), cudaFree(d_scale), cudaFree(d_amax);
}

struct Fp8TransposeParams {  // Fp8TransposeParams<__nv_fp8_e4m3>
  const void* x;
  void* y_t;
  int rows;
  int cols;
};

// The transposed copy of gathered codes: every byte moved, none rescaled, for row counts that
// are and are not multiples of the 16-row store and the 128-row tile, and a partial column tile.
TEST_F(TemplatesGpu, Fp8TransposeMovesEveryCodeUnchanged) {
  cudaKernel_t kernel =
      load("#include \"cast_transpose.cuh\"\n", "opfuse::fp8_transpose<__nv_fp8_e4m3, true>");
  ASSERT_EQ(kernel_.spill_store_bytes, 0);
  std::mt19937 rng(11);
  for (const auto& [rows, cols] : {std::pair{256, 128}, std::pair{200, 80}, std::pair{37, 16}}) {
    SCOPED_TRACE(testing::Message() << rows << " x " << cols);
    std::vector<uint8_t> x(size_t(rows) * cols);
    for (auto& v : x) v = uint8_t(rng());  // every code, NaN (0x7F, 0xFF) included
    uint8_t* d_x = device_copy(x);
    uint8_t* d_yt = nullptr;
    CUDA_OK(cudaMalloc(&d_yt, x.size() + 64));
    CUDA_OK(cudaMemset(d_yt, 0xAB, x.size() + 64));  // poison, and a guard band after the end
    Fp8TransposeParams params{d_x, d_yt, rows, cols};
    void* args[] = {&params};
    // A smaller grid.y than the tile count walks the row tiles with a stride.
    const dim3 grid(launch::tile_grid_x(cols), 1);
    CUDA_OK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid,
                             dim3(launch::kTileThreads), args, 0, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const auto y_t = host_copy(d_yt, x.size() + 64);
    size_t mismatches = 0;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c)
        mismatches += y_t[size_t(c) * rows + r] != x[size_t(r) * cols + c];
    EXPECT_EQ(mismatches, 0u);
    for (size_t i = x.size(); i < y_t.size(); ++i) EXPECT_EQ(y_t[i], 0xAB) << "wrote past the end";
    cudaFree(d_x), cudaFree(d_yt);
  }
}

// Current scaling measured in one launch: every block raises the amax, the last block to arrive
// derives scale and scale_inv (derive_current_scale) and returns the arrival count to 0.
struct CurrentScaleState {
  float* words = nullptr;  // [measured amax, arrival count, running max, unused]
  float* scale = nullptr;
  float* scale_inv = nullptr;
  QuantizerRecord* record = nullptr;
  CurrentScaleState(float fp8_max, float epsilon, int power_of_2) {
    words = device_copy(std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f});
    scale = device_copy(std::vector<float>{1.0f});
    scale_inv = device_copy(std::vector<float>{1.0f});
    record = device_copy(std::vector<QuantizerRecord>{
        {words, words, scale, scale_inv, 1, 2, fp8_max, 0, epsilon, power_of_2}});
  }
  ~CurrentScaleState() { cudaFree(words), cudaFree(scale), cudaFree(scale_inv), cudaFree(record); }
  float* running_max() const { return words + 2; }  // the kernels' amax pointer
  // Expects the measured amax, its scale (CPU quantizer math), and a zero arrival count and
  // running max (ready for the next measurement without a memset).
  void expect(float amax, float fp8_max, float epsilon, bool power_of_2, const char* what) const {
    const auto got = host_copy(words, 4);
    const cpu::CurrentScale want = cpu::compute_current_scale(amax, fp8_max, epsilon, power_of_2);
    EXPECT_EQ(got[0], amax) << what;
    uint32_t arrivals = 0;
    std::memcpy(&arrivals, &got[1], 4);
    EXPECT_EQ(arrivals, 0u) << what << ": the last block resets the arrival count";
    EXPECT_EQ(got[2], 0.0f) << what << ": the last block resets the running max";
    EXPECT_EQ(host_copy(scale, 1)[0], want.scale) << what;
    EXPECT_EQ(host_copy(scale_inv, 1)[0], want.scale_inv) << what;
  }
};

TEST_F(TemplatesGpu, AmaxReduceDerivesTheCurrentScaleInItsLastBlock) {
  struct AmaxParams {  // AmaxParams<__nv_bfloat16>
    const void* x;
    long long count;
    float* amax;
    const QuantizerRecord* scale_record;
  };
  cudaKernel_t kernel = load("#include \"amax.cuh\"\n", "opfuse::amax_reduce<__nv_bfloat16>");
  const long long count = 3 * (1 << 20) + 5;  // a tail that is not a whole vector
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<uint16_t> x(static_cast<size_t>(count));
  const float fp8_max = 448.0f, epsilon = 1e-4f;
  CurrentScaleState state(fp8_max, epsilon, 1);
  uint16_t* d_x = nullptr;
  CUDA_OK(cudaMalloc(&d_x, x.size() * 2));
  // Three rounds with no reset between them, each with its own maximum (in the middle, near the
  // front, in the tail; round 1's is far below round 0's, so a running max left over from round 0
  // would show); grids of 528, 1 and 7 blocks.
  const std::vector<std::pair<size_t, float>> planted = {
      {x.size() / 2, 91.5f}, {17, -0.001f}, {x.size() - 1, -3000.0f}};
  const unsigned grids[] = {528, 1, 7};
  for (int round = 0; round < 3; ++round) {
    float want = 0.0f;
    for (auto& v : x) {
      v = cpu::float_to_bf16(round == 1 ? normal(rng) * 1e-4f : normal(rng));
    }
    x[planted[round].first] = cpu::float_to_bf16(planted[round].second);
    for (const uint16_t v : x) want = std::fmax(want, std::fabs(cpu::bf16_to_float(v)));
    CUDA_OK(cudaMemcpy(d_x, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    AmaxParams params{d_x, count, state.running_max(), state.record};
    void* args[] = {&params};
    CUDA_OK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(grids[round]),
                             dim3(launch::kAmaxThreads), args, 0, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    state.expect(want, fp8_max, epsilon, true, ("round " + std::to_string(round)).c_str());
  }
  cudaFree(d_x);
}

TEST_F(TemplatesGpu, ProducerMeasuresTheAmaxOfItsStoredBf16Output) {
  // SwiGLU forward to bf16 measuring the current-scaling amax of what it stores (the rounded
  // values, as amax_reduce reading the output back would), over a 2-D grid.
  struct ActivationFwdParams {  // ActivationFwdParams<__nv_bfloat16, __nv_bfloat16>
    const void* x;
    void* y;
    void* y_t;
    const float* scale;
    float* amax;
    const QuantizerRecord* scale_record;
    int rows;
    int cols;
  };
  cudaKernel_t kernel = load(
      "#include \"activation.cuh\"\n" + *ir::pointwise_functor_source("opfuse::pointwise_swiglu"),
      "opfuse::gated_activation_fwd<opfuse::pointwise_swiglu, __nv_bfloat16, __nv_bfloat16, "
      "false>");
  ASSERT_EQ(kernel_.spill_store_bytes, 0);
  const int rows = 300, cols = 512;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<uint16_t> x(size_t(rows) * 2 * cols);
  for (auto& v : x) v = cpu::float_to_bf16(normal(rng));
  const float fp8_max = 57344.0f;
  CurrentScaleState state(fp8_max, 0.0f, 0);
  uint16_t* d_x = device_copy(x);
  uint16_t* d_y = nullptr;
  CUDA_OK(cudaMalloc(&d_y, size_t(rows) * cols * 2));
  ActivationFwdParams params{d_x,          d_y,  nullptr, nullptr, state.running_max(),
                             state.record, rows, cols};
  void* args[] = {&params};
  const dim3 grid(launch::tile_grid_x(cols), launch::tile_grid_y(rows));
  ASSERT_GT(grid.x * grid.y, 1u);
  CUDA_OK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, dim3(launch::kTileThreads),
                           args, 0, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  float want = 0.0f;
  for (const uint16_t v : host_copy(d_y, size_t(rows) * cols)) {
    want = std::fmax(want, std::fabs(cpu::bf16_to_float(v)));
  }
  ASSERT_GT(want, 0.0f);
  state.expect(want, fp8_max, 0.0f, false, "swiglu -> bf16");
  cudaFree(d_x), cudaFree(d_y);
}

TEST_F(TemplatesGpu, UpdateScalesMatchesCpuQuantizerMathOver20Steps) {
  struct Case {
    int length, mode, margin;
    float fp8_max, epsilon;
    int pow2;
  };
  const std::vector<Case> cases = {
      {1024, 0, 0, 448.0f, 0.0f, 0},  {4, 1, 2, 448.0f, 0.0f, 0},  {1, 0, 0, 57344.0f, 0.0f, 0},
      {300, 0, 3, 57344.0f, 0.0f, 0}, {1, 2, 0, 448.0f, 1e-4f, 1}, {1, 2, 0, 57344.0f, 0.0f, 0},
  };
  cudaKernel_t kernel = load("#include \"scale_update.cuh\"\n", "opfuse::update_scales<256>");

  // Delayed scaling: slot 0 (this step's amax) apart, the older slots in the history; current
  // scaling: the amax is word 0 of its history.
  std::vector<cpu::DelayedScalingState> cpu_state(cases.size());
  std::vector<float*> d_amax(cases.size()), d_history(cases.size()), d_scale(cases.size()),
      d_scale_inv(cases.size());
  std::vector<QuantizerRecord> records;
  for (size_t i = 0; i < cases.size(); ++i) {
    cpu_state[i].amax_history.assign(cases[i].length, 0.0f);
    const bool current = cases[i].mode == 2;
    d_history[i] = device_copy(std::vector<float>(current ? 4 : std::max(cases[i].length - 1, 1)));
    d_amax[i] = current ? d_history[i] : device_copy(std::vector<float>{0.0f});
    d_scale[i] = device_copy(std::vector<float>{1.0f});
    d_scale_inv[i] = device_copy(std::vector<float>{1.0f});
    records.push_back({d_amax[i], d_history[i], d_scale[i], d_scale_inv[i], cases[i].length,
                       cases[i].mode, cases[i].fp8_max, cases[i].margin, cases[i].epsilon,
                       cases[i].pow2});
  }
  QuantizerRecord* d_records = device_copy(records);
  struct {
    const QuantizerRecord* records;
    int count;
  } params{d_records, int(records.size())};
  void* args[] = {&params};

  std::mt19937 rng(11);
  std::uniform_real_distribution<float> exponent(-30.0f, 12.0f);
  for (int step = 0; step < 20; ++step) {
    for (size_t i = 0; i < cases.size(); ++i) {
      float amax = std::exp2(exponent(rng));
      if (step == 3) amax = 0.0f;                // keeps the old scale
      if (step == 5 && i % 2) amax = NAN;        // skipped by max, kept-scale for most_recent
      if (step == 7 && i == 1) amax = INFINITY;  // keeps the old scale
      if (step == 9 && i == 0) amax = 1e-39f;    // subnormal: scale overflows to FLT_MAX
      cpu_state[i].amax_history[0] = amax;
      CUDA_OK(cudaMemcpy(d_amax[i], &amax, sizeof amax, cudaMemcpyHostToDevice));
      if (cases[i].mode == 2) {
        const auto s = cpu::compute_current_scale(amax, cases[i].fp8_max, cases[i].epsilon,
                                                  cases[i].pow2 != 0);
        cpu_state[i].scale = s.scale;
        cpu_state[i].scale_inv = s.scale_inv;
      } else {
        cpu::DelayedScalingParams p;
        p.fp8_max = cases[i].fp8_max;
        p.algo = cases[i].mode == 0 ? cpu::AmaxCompute::Max : cpu::AmaxCompute::MostRecent;
        p.margin = cases[i].margin;
        cpu::update_delayed(cpu_state[i], p);
      }
    }
    CUDA_OK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(records.size()), dim3(256),
                             args, 0, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    for (size_t i = 0; i < cases.size(); ++i) {
      const float scale = host_copy(d_scale[i], 1)[0];
      const float scale_inv = host_copy(d_scale_inv[i], 1)[0];
      ASSERT_EQ(std::memcmp(&scale, &cpu_state[i].scale, 4), 0)
          << "step " << step << " quantizer " << i << ": " << scale << " vs " << cpu_state[i].scale;
      ASSERT_EQ(std::memcmp(&scale_inv, &cpu_state[i].scale_inv, 4), 0)
          << "step " << step << " quantizer " << i;
      if (cases[i].mode != 2) {
        std::vector<float> history = host_copy(d_amax[i], 1);
        const auto older = host_copy(d_history[i], cases[i].length - 1);
        history.insert(history.end(), older.begin(), older.end());
        ASSERT_EQ(std::memcmp(history.data(), cpu_state[i].amax_history.data(), 4 * history.size()),
                  0)
            << "step " << step << " quantizer " << i;
      }
    }
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    if (d_amax[i] != d_history[i]) cudaFree(d_amax[i]);
    cudaFree(d_history[i]), cudaFree(d_scale[i]), cudaFree(d_scale_inv[i]);
  }
  cudaFree(d_records);
}

// LayerNorm/RMSNorm backward against a double-precision reference: the paths of
// launch_rules.h's norm_bwd rules (partials in shared memory with two rows per step: fp32 768 and
// bf16 256, the latter four row groups per block; partials in registers, one row per step: bf16
// 8192 LayerNorm), a grid whose row groups get odd row counts (the last step's second row past the
// end), zero-centered gamma and the residual gradient.
struct NormBackwardCase {
  bool bf16;
  bool rms;
  bool zero_centered;
  bool residual;
  int hidden;
  int rows;
  unsigned grid;
};

class NormBackwardGpu : public TemplatesGpu,
                        public ::testing::WithParamInterface<NormBackwardCase> {};

TEST_P(NormBackwardGpu, MatchesADoublePrecisionReference) {
  const NormBackwardCase c = GetParam();
  struct NormBwdParams {  // NormBwdParams<Input>
    const void* dy;
    const void* x;
    const void* gamma;
    const float* mean;
    const float* rstd;
    const void* dresidual;
    void* dx;
    float* dgamma_partial;
    float* dbeta_partial;
    int rows;
  };
  const std::string type = c.bf16 ? "__nv_bfloat16" : "float";
  const std::string expression =
      std::string(c.rms ? "opfuse::rmsnorm_bwd<" : "opfuse::layernorm_bwd<") + type + ", " +
      std::to_string(c.hidden) + ", " + (c.zero_centered ? "true" : "false") + ">";
  cudaKernel_t kernel = load("#include \"norm.cuh\"\n", expression);
  ASSERT_EQ(kernel_.spill_store_bytes, 0) << expression;
  const int bytes = c.bf16 ? 2 : 4;
  const int h = c.hidden, rows = c.rows;
  const size_t n = size_t(rows) * h;

  // Inputs, rounded to the input dtype first so both sides read the same values.
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto rounded = [&](float v) { return c.bf16 ? cpu::bf16_to_float(cpu::float_to_bf16(v)) : v; };
  std::vector<float> x(n), dy(n), gamma(h), residual(c.residual ? n : 0);
  for (auto& v : x) v = rounded(2.0f * normal(rng) + 0.5f);
  for (auto& v : dy) v = rounded(normal(rng));
  for (auto& v : gamma)
    v = rounded(c.zero_centered ? 0.2f * normal(rng) : 1.0f + 0.2f * normal(rng));
  for (auto& v : residual) v = rounded(normal(rng));
  std::vector<float> mean(rows), rstd(rows);
  for (int r = 0; r < rows; ++r) {
    double sum = 0.0, squares = 0.0;
    for (int j = 0; j < h; ++j) sum += x[size_t(r) * h + j];
    const double m = c.rms ? 0.0 : sum / h;
    for (int j = 0; j < h; ++j) squares += (x[size_t(r) * h + j] - m) * (x[size_t(r) * h + j] - m);
    mean[r] = float(m);
    rstd[r] = float(1.0 / std::sqrt(squares / h + 1e-5));
  }
  auto upload = [&](const std::vector<float>& values) -> void* {
    if (values.empty()) return nullptr;
    if (!c.bf16) return device_copy(values);
    std::vector<uint16_t> bits(values.size());
    for (size_t i = 0; i < values.size(); ++i) bits[i] = cpu::float_to_bf16(values[i]);
    return device_copy(bits);
  };
  void* d_x = upload(x);
  void* d_dy = upload(dy);
  void* d_gamma = upload(gamma);
  void* d_residual = upload(residual);
  float* d_mean = device_copy(mean);
  float* d_rstd = device_copy(rstd);
  void* d_dx = nullptr;
  CUDA_OK(cudaMalloc(&d_dx, n * bytes));
  const int rows_per_block = launch::norm_bwd_rows_per_block(h, bytes);
  const size_t partial_rows = size_t(c.grid) * rows_per_block;
  float *d_dgamma = nullptr, *d_dbeta = nullptr;
  CUDA_OK(cudaMalloc(&d_dgamma, partial_rows * h * 4));
  CUDA_OK(cudaMalloc(&d_dbeta, partial_rows * h * 4));
  NormBwdParams params{d_dy,       d_x,  d_gamma,  d_mean,  d_rstd,
                       d_residual, d_dx, d_dgamma, d_dbeta, rows};
  void* args[] = {&params};
  CUDA_OK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(c.grid),
                           dim3(launch::norm_bwd_block_threads(h, bytes)), args, 0, nullptr));
  CUDA_OK(cudaDeviceSynchronize());

  std::vector<float> dx(n);
  if (c.bf16) {
    const auto bits = host_copy(static_cast<const uint16_t*>(d_dx), n);
    for (size_t i = 0; i < n; ++i) dx[i] = cpu::bf16_to_float(bits[i]);
  } else {
    dx = host_copy(static_cast<const float*>(d_dx), n);
  }
  // dx within fp32 rounding of its terms (bf16 output: plus its own rounding).
  const double output_ulp = c.bf16 ? std::ldexp(1.0, -8) : 0.0;
  std::vector<double> dgamma(h, 0.0), dbeta(h, 0.0), magnitude(h, 0.0);
  for (int r = 0; r < rows; ++r) {
    double sum_g = 0.0, sum_gx = 0.0, scale = 0.0;
    for (int j = 0; j < h; ++j) {
      const size_t i = size_t(r) * h + j;
      const double w = gamma[j] + (c.zero_centered ? 1.0 : 0.0);
      const double x_hat = (double(x[i]) - mean[r]) * rstd[r];
      sum_g += dy[i] * w;
      sum_gx += dy[i] * w * x_hat;
      dgamma[j] += dy[i] * x_hat;
      dbeta[j] += dy[i];
      magnitude[j] += std::fabs(dy[i] * x_hat) + std::fabs(dy[i]);
      scale += std::fabs(dy[i] * w);
    }
    const double mean_g = c.rms ? 0.0 : sum_g / h, mean_gx = sum_gx / h;
    for (int j = 0; j < h; ++j) {
      const size_t i = size_t(r) * h + j;
      const double w = gamma[j] + (c.zero_centered ? 1.0 : 0.0);
      const double x_hat = (double(x[i]) - mean[r]) * rstd[r];
      const double want =
          rstd[r] * (dy[i] * w - mean_g - x_hat * mean_gx) + (c.residual ? residual[i] : 0.0);
      const double terms = rstd[r] * (std::fabs(dy[i] * w) + scale / h * (1.0 + std::fabs(x_hat)));
      const double tolerance = 3e-5 * terms + output_ulp * std::fabs(want) + 1e-30;
      ASSERT_LE(std::fabs(dx[i] - want), tolerance) << expression << " row " << r << " col " << j;
    }
  }
  // The partial rows' column sums: dgamma = sum dy * x_hat, dbeta = sum dy.
  const auto dgamma_partial = host_copy(d_dgamma, partial_rows * h);
  const auto dbeta_partial = host_copy(d_dbeta, partial_rows * h);
  for (int j = 0; j < h; ++j) {
    double got_gamma = 0.0, got_beta = 0.0;
    for (size_t p = 0; p < partial_rows; ++p) {
      got_gamma += dgamma_partial[p * h + j];
      got_beta += dbeta_partial[p * h + j];
    }
    ASSERT_NEAR(got_gamma, dgamma[j], 1e-5 * magnitude[j] + 1e-30) << expression << " col " << j;
    if (!c.rms) {
      ASSERT_NEAR(got_beta, dbeta[j], 1e-5 * magnitude[j] + 1e-30) << expression << " col " << j;
    }
  }
  cudaFree(d_x), cudaFree(d_dy), cudaFree(d_gamma), cudaFree(d_residual), cudaFree(d_mean);
  cudaFree(d_rstd), cudaFree(d_dx), cudaFree(d_dgamma), cudaFree(d_dbeta);
}

INSTANTIATE_TEST_SUITE_P(
    Templates, NormBackwardGpu,
    ::testing::Values(NormBackwardCase{false, false, false, false, 768, 301, 7},
                      NormBackwardCase{false, true, true, true, 768, 301, 7},
                      NormBackwardCase{true, false, true, true, 256, 333, 5},
                      NormBackwardCase{true, false, false, false, 4096, 1037, 13},
                      NormBackwardCase{true, false, false, true, 8192, 130, 3}),
    [](const ::testing::TestParamInfo<NormBackwardCase>& info) {
      const NormBackwardCase& c = info.param;
      return std::string(c.rms ? "rmsnorm_" : "layernorm_") + (c.bf16 ? "bf16_" : "fp32_") +
             std::to_string(c.hidden) + (c.zero_centered ? "_zero_centered" : "") +
             (c.residual ? "_residual" : "");
    });

}  // namespace
}  // namespace opfuse
