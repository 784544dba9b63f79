#include "gpu/gemm.h"

#include <cublasLt.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "gpu/cuda_check.h"
#include "gpu/device_memory.h"
#include "opfuse/error.h"

namespace opfuse::gpu {
namespace {

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::BF16:
      return CUDA_R_16BF;
    case DType::FP16:
      return CUDA_R_16F;
    case DType::FP32:
      return CUDA_R_32F;
    case DType::E4M3:
      return CUDA_R_8F_E4M3;
    case DType::E5M2:
      return CUDA_R_8F_E5M2;
    case DType::E2M1:  // sm_100's NVFP4 GEMMs (packed codes); Hopper runs none
      return CUDA_R_4F_E2M1;
    case DType::E8M0:  // block scales, never a GEMM operand
      return CUDA_R_8U;
  }
  return CUDA_R_32F;
}

cublasLtEpilogue_t cublaslt_epilogue(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::None:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::Bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::GeluAuxBias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::DGelu:
      return CUBLASLT_EPILOGUE_DGELU;
    case GemmEpilogue::DGeluBiasGrad:
      return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case GemmEpilogue::BiasGradA:
      return CUBLASLT_EPILOGUE_BGRADB;  // cuBLASLt's B is our A (note "Row-major GEMMs")
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// The alignment check_gemm_args demands of A, B, C, D, bias and aux.
constexpr std::uint32_t kPointerAlignment = 16;
// cuBLASLt is told the alignment the pointers of a call have (16 to 256 bytes), and the algorithm
// chosen for a desc is kept per alignment class: telling it 16 for 256-byte aligned operands (what
// the executor's buffers are) excludes algorithms that need more, and on an H200 the fastest FP8
// algorithm for some shapes may be among them (torch._scaled_mm, which passes the real
// alignment, was up to 8% faster on one shape, bench/RESULTS.md).
constexpr std::uint32_t kMaxPointerAlignment = 256;
constexpr int kAlignmentClasses = 5;  // 16, 32, 64, 128, 256

// The largest power of two from 16 to 256 that every pointer of `args` is a multiple of (16 for
// less: check_gemm_args rejects those).
std::uint32_t pointer_alignment(const GemmArgs& args) {
  std::uintptr_t bits = 0;
  for (const void* pointer :
       {args.a, args.b, args.c, static_cast<const void*>(args.d),
        static_cast<const void*>(args.bias), static_cast<const void*>(args.aux)}) {
    bits |= reinterpret_cast<std::uintptr_t>(pointer);
  }
  std::uint32_t alignment = kMaxPointerAlignment;
  while (alignment > kPointerAlignment && bits % alignment != 0) alignment /= 2;
  return alignment;
}

int alignment_class(std::uint32_t alignment) {
  int index = 0;
  for (std::uint32_t a = kPointerAlignment; a < alignment; a *= 2) ++index;
  return index;
}
// cuBLASLt 13 refuses FP8 GEMMs (NOT_SUPPORTED at cublasLtMatmul although the heuristic chose an
// algorithm) whose scale or amax pointers are 4- or 8-byte aligned; 16 works (H100, cuBLASLt
// 13.1). Checked here so the failure is a clear UsageError before anything is enqueued.
constexpr std::uintptr_t kScalarPointerAlignment = 16;

// `why_needed` may hold one "{}", replaced by `epilogue`. Why not a formatted string: this runs
// on every GEMM call and must not allocate unless something is wrong.
void check_pointer(std::vector<std::string>& reasons, const char* name, const void* pointer,
                   bool needed, std::uintptr_t alignment, fmt::string_view why_needed,
                   std::string_view epilogue = {}) {
  if (pointer == nullptr) {
    if (needed) {
      reasons.push_back(
          fmt::format("{} is null but {}", name, fmt::format(fmt::runtime(why_needed), epilogue)));
    }
    return;
  }
  if (!needed) {
    reasons.push_back(fmt::format("{} is set but this desc does not use it: pass nullptr", name));
    return;
  }
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  if (address % alignment != 0) {
    reasons.push_back(fmt::format(
        "{} ({:#x}) is not {}-byte aligned: pass the start of a pool allocation or an offset "
        "that is a multiple of {} bytes",
        name, address, alignment, alignment));
  }
}

template <typename T>
void set_attribute(cublasLtMatmulDesc_t matmul, cublasLtMatmulDescAttributes_t attribute,
                   const T& value, const GemmDesc& desc) {
  OPFUSE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(matmul, attribute, &value, sizeof(value)),
                      describe(desc));
}

// cuBLASLt's descriptors and chosen algorithm for one desc.
struct Plan {
  cublasLtMatmulDesc_t matmul = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  // The pointer attributes last set on `matmul` (set_pointers skips them when unchanged).
  GemmArgs pointers_set;
  bool any_pointers_set = false;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    // Why statuses are dropped: destruction must not throw; these calls only free host memory.
    for (cublasLtMatrixLayout_t layout : {a, b, c, d}) {
      if (layout != nullptr) (void)cublasLtMatrixLayoutDestroy(layout);
    }
    if (matmul != nullptr) (void)cublasLtMatmulDescDestroy(matmul);
  }
};

struct PreferenceOwner {
  cublasLtMatmulPreference_t preference = nullptr;
  PreferenceOwner() = default;
  PreferenceOwner(const PreferenceOwner&) = delete;
  PreferenceOwner& operator=(const PreferenceOwner&) = delete;
  ~PreferenceOwner() {
    if (preference != nullptr) (void)cublasLtMatmulPreferenceDestroy(preference);
  }
};

cublasLtMatrixLayout_t make_layout(const CublasLtOperand& operand, DType dtype,
                                   const GemmDesc& desc) {
  cublasLtMatrixLayout_t layout = nullptr;
  OPFUSE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(
                          &layout, cuda_type(dtype), static_cast<std::uint64_t>(operand.rows),
                          static_cast<std::uint64_t>(operand.cols), operand.ld),
                      describe(desc));
  return layout;
}

bool same_pointers(const GemmArgs& x, const GemmArgs& y) {
  return x.bias == y.bias && x.aux == y.aux && x.a_scale_inv == y.a_scale_inv &&
         x.b_scale_inv == y.b_scale_inv && x.d_scale == y.d_scale && x.d_amax == y.d_amax;
}

// The pointer attributes of one call: cuBLASLt reads them from the matmul descriptor.
void set_pointers(Plan& plan, const GemmDesc& desc, const GemmArgs& args) {
  if (plan.any_pointers_set && same_pointers(plan.pointers_set, args)) return;
  plan.pointers_set = args;
  plan.any_pointers_set = true;
  if (epilogue_has_bias(desc.epilogue)) {
    set_attribute(plan.matmul, CUBLASLT_MATMUL_DESC_BIAS_POINTER, args.bias, desc);
  }
  if (epilogue_has_aux(desc.epilogue)) {
    set_attribute(plan.matmul, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, args.aux, desc);
  }
  if (is_fp8(desc.a)) {
    // cuBLASLt's A is our B and its B our A (note "Row-major GEMMs").
    set_attribute(plan.matmul, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, args.b_scale_inv, desc);
    set_attribute(plan.matmul, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, args.a_scale_inv, desc);
  }
  if (is_fp8(desc.d)) {
    set_attribute(plan.matmul, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, args.d_scale, desc);
    set_attribute(plan.matmul, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, args.d_amax, desc);
  }
}

}  // namespace

std::int32_t cublaslt_scale_mode(ScaleMode mode) {
  switch (mode) {
    case ScaleMode::Tensor:
      return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    case ScaleMode::Block1D:
      return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case ScaleMode::Block2D:
      return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    case ScaleMode::Vec32Ue8m0:
      return CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
    case ScaleMode::Vec16Ue4m3:
      return CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
  }
  return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

std::vector<std::string> check_gemm_args(const GemmDesc& desc, const GemmArgs& args) {
  std::vector<std::string> reasons;
  check_pointer(reasons, "a", args.a, true, kPointerAlignment, "every GEMM reads A");
  check_pointer(reasons, "b", args.b, true, kPointerAlignment, "every GEMM reads B");
  check_pointer(reasons, "d", args.d, true, kPointerAlignment, "every GEMM writes D");
  if (args.c != nullptr) {
    check_pointer(reasons, "c", args.c, desc.accumulate, kPointerAlignment, "");
  }
  const std::string_view epilogue = epilogue_name(desc.epilogue);
  check_pointer(reasons, "bias", args.bias, epilogue_has_bias(desc.epilogue), kPointerAlignment,
                "the {} epilogue uses the bias vector", epilogue);
  check_pointer(reasons, "aux", args.aux, epilogue_has_aux(desc.epilogue), kPointerAlignment,
                "the {} epilogue uses the aux matrix", epilogue);
  // Why 16 for grids: cuBLASLt reads block scales with vector loads.
  check_pointer(reasons, "a_scale_inv", args.a_scale_inv, is_fp8(desc.a),
                desc.a_scale == ScaleMode::Tensor ? kScalarPointerAlignment : kPointerAlignment,
                "A is FP8 and needs its dequantization factor");
  check_pointer(reasons, "b_scale_inv", args.b_scale_inv, is_fp8(desc.b),
                desc.b_scale == ScaleMode::Tensor ? kScalarPointerAlignment : kPointerAlignment,
                "B is FP8 and needs its dequantization factor");
  check_pointer(reasons, "d_scale", args.d_scale, is_fp8(desc.d), kScalarPointerAlignment,
                "D is FP8 and needs its quantization scale");
  // Why amax only with an FP8 D: cuBLASLt computes amax_D for FP8 outputs only.
  if (args.d_amax != nullptr) {
    check_pointer(reasons, "d_amax", args.d_amax, is_fp8(desc.d), kScalarPointerAlignment, "");
  }
  return reasons;
}

struct GemmRunner::Impl {
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace;
  GemmOptions options;
  // Per desc, per alignment class (pointer_alignment).
  std::unordered_map<GemmDesc, std::array<std::unique_ptr<Plan>, kAlignmentClasses>, GemmDescHash>
      plans;

  ~Impl() {
    plans.clear();
    if (handle != nullptr) (void)cublasLtDestroy(handle);
  }

  std::unique_ptr<Plan> make_plan(const GemmDesc& desc, const GemmArgs& args,
                                  std::uint32_t alignment, cudaStream_t stream);
  void matmul(const Plan& plan, const cublasLtMatmulAlgo_t& algo, const GemmDesc& desc,
              const GemmArgs& args, cudaStream_t stream) const;
  int fastest(const Plan& plan, const std::vector<cublasLtMatmulHeuristicResult_t>& candidates,
              const GemmDesc& desc, const GemmArgs& args, cudaStream_t stream) const;
};

// Autotuned choices by desc: index into the heuristic's list (note in GemmOptions::autotune).
std::mutex& tuned_mutex() {
  static std::mutex mutex;
  return mutex;
}
using TunedChoices = std::array<int, kAlignmentClasses>;  // -1: not tuned yet
std::unordered_map<GemmDesc, TunedChoices, GemmDescHash>& tuned_choices() {
  static std::unordered_map<GemmDesc, TunedChoices, GemmDescHash> choices;
  return choices;
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  OPFUSE_CUDA_CHECK(cudaStreamIsCapturing(stream, &status), "asking whether a stream captures");
  return status != cudaStreamCaptureStatusNone;
}

void GemmRunner::Impl::matmul(const Plan& plan, const cublasLtMatmulAlgo_t& algo,
                              const GemmDesc& desc, const GemmArgs& args,
                              cudaStream_t stream) const {
  const float alpha = 1.0f;
  const float beta = desc.accumulate ? 1.0f : 0.0f;
  // Why this C when not accumulating (beta = 0, C never read): a bf16/fp32 D goes in as C
  // (cuBLASLt treats C == D as in place); an FP8 D must not, because C's layout has the bias
  // type there and cuBLASLt 13 answers INVALID_VALUE for C == D with different types, so C is
  // null (measured on an H100, bench/RESULTS.md).
  const void* c =
      desc.accumulate ? (args.c != nullptr ? args.c : args.d) : (is_fp8(desc.d) ? nullptr : args.d);
  // cuBLASLt's A is our B and its B our A (note "Row-major GEMMs").
  OPFUSE_CUBLAS_CHECK(
      cublasLtMatmul(handle, plan.matmul, &alpha, args.b, plan.a, args.a, plan.b, &beta, c, plan.c,
                     args.d, plan.d, &algo, workspace.data(), workspace.size(), stream),
      describe(desc));
}

int GemmRunner::Impl::fastest(const Plan& plan,
                              const std::vector<cublasLtMatmulHeuristicResult_t>& candidates,
                              const GemmDesc& desc, const GemmArgs& args,
                              cudaStream_t stream) const {
  // Why rounds over all candidates, in alternating order, and a median per candidate: under
  // sustained FP8 GEMM load the GPU's clock drifts within tens of milliseconds (bench/RESULTS.md),
  // so a candidate timed once, in its turn, is timed at whatever clock its turn had; rounds give
  // every candidate the same mix of clocks.
  constexpr int kRounds = 5;
  constexpr int kRunsPerTiming = 2;
  const int count = static_cast<int>(candidates.size());
  std::vector<std::vector<float>> times(candidates.size());
  std::vector<bool> usable(candidates.size(), true);
  cudaEvent_t start = nullptr, stop = nullptr;
  OPFUSE_CUDA_CHECK(cudaEventCreate(&start), "autotuning a GEMM");
  OPFUSE_CUDA_CHECK(cudaEventCreate(&stop), "autotuning a GEMM");
  for (int round = 0; round < kRounds; ++round) {
    for (int k = 0; k < count; ++k) {
      const int i = round % 2 == 0 ? k : count - 1 - k;
      if (!usable[static_cast<std::size_t>(i)]) continue;
      const cublasLtMatmulAlgo_t& algo = candidates[static_cast<std::size_t>(i)].algo;
      try {
        if (round == 0) matmul(plan, algo, desc, args, stream);  // warm-up
        OPFUSE_CUDA_CHECK(cudaEventRecord(start, stream), "autotuning a GEMM");
        for (int run = 0; run < kRunsPerTiming; ++run) matmul(plan, algo, desc, args, stream);
        OPFUSE_CUDA_CHECK(cudaEventRecord(stop, stream), "autotuning a GEMM");
        OPFUSE_CUDA_CHECK(cudaEventSynchronize(stop), "autotuning a GEMM");
        float ms = 0;
        OPFUSE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop), "autotuning a GEMM");
        times[static_cast<std::size_t>(i)].push_back(ms);
      } catch (const ContextFaultError&) {
        throw;
      } catch (const CudaError&) {
        // Why go on: a candidate the heuristic offered may still refuse these pointers at
        // cublasLtMatmul (cuBLASLt answers NOT_SUPPORTED then); the others are still good. When
        // none runs, the caller's run with the heuristic's first reports the error.
        usable[static_cast<std::size_t>(i)] = false;
      }
    }
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  int best = 0;
  float best_ms = -1;
  for (int i = 0; i < count; ++i) {
    std::vector<float>& t = times[static_cast<std::size_t>(i)];
    if (!usable[static_cast<std::size_t>(i)] || t.empty()) continue;
    std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
    const float median = t[t.size() / 2];
    if (best_ms < 0 || median < best_ms) {
      best = i;
      best_ms = median;
    }
  }
  return best;
}

std::unique_ptr<Plan> GemmRunner::Impl::make_plan(const GemmDesc& desc, const GemmArgs& args,
                                                  std::uint32_t alignment, cudaStream_t stream) {
  const CublasLtProblem problem = to_cublaslt(desc);
  auto plan = std::make_unique<Plan>();
  OPFUSE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->matmul, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                      describe(desc));
  const cublasOperation_t transa = problem.a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t transb = problem.b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_attribute(plan->matmul, CUBLASLT_MATMUL_DESC_TRANSA, transa, desc);
  set_attribute(plan->matmul, CUBLASLT_MATMUL_DESC_TRANSB, transb, desc);
  set_attribute(plan->matmul, CUBLASLT_MATMUL_DESC_EPILOGUE, cublaslt_epilogue(desc.epilogue),
                desc);
  if (desc.sm_count_target > 0) {
    const std::int32_t sms = desc.sm_count_target;
    set_attribute(plan->matmul, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, sms, desc);
  }
  const DType vector_dtype = epilogue_vector_dtype(desc);
  if (is_fp8(desc.a)) {
    const std::int8_t fast_accum = desc.fast_accum ? 1 : 0;
    set_attribute(plan->matmul, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast_accum, desc);
    if (desc.a_scale != ScaleMode::Tensor) {
      // cuBLASLt's A is our B and its B our A (note "Row-major GEMMs").
      set_attribute(plan->matmul, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                    cublaslt_scale_mode(desc.b_scale), desc);
      set_attribute(plan->matmul, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                    cublaslt_scale_mode(desc.a_scale), desc);
    }
    // Why explicit: with FP8 operands the bias and aux types differ from D's default.
    if (epilogue_has_bias(desc.epilogue)) {
      set_attribute(plan->matmul, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, cuda_type(vector_dtype),
                    desc);
    }
    if (epilogue_has_aux(desc.epilogue)) {
      set_attribute(plan->matmul, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                    cuda_type(vector_dtype), desc);
    }
  }
  if (epilogue_has_aux(desc.epilogue)) {
    set_attribute(plan->matmul, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, problem.aux_ld, desc);
  }
  plan->a = make_layout(problem.a, problem.a.dtype, desc);
  plan->b = make_layout(problem.b, problem.b.dtype, desc);
  plan->d = make_layout(problem.d, problem.d.dtype, desc);
  // Why: cuBLASLt wants C in the bias type when D is FP8 (C is never read then: beta = 0).
  plan->c = make_layout(problem.d, is_fp8(desc.d) ? vector_dtype : desc.d, desc);

  PreferenceOwner owner;
  OPFUSE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&owner.preference), describe(desc));
  cublasLtMatmulPreference_t preference = owner.preference;
  const std::uint64_t workspace_bytes = workspace.size();
  OPFUSE_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_bytes, sizeof(workspace_bytes)),
      describe(desc));
  for (const auto attribute :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    OPFUSE_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment, sizeof(alignment)),
        describe(desc));
  }
  // Why a probe address: the heuristic reads the bias and aux pointers' values to learn their
  // alignment. An address exactly `alignment`-aligned (the workspace starts 256-aligned) makes it
  // pick an algorithm that works for every pointer of this alignment class, not only this call's.
  GemmArgs probe = args;
  void* const class_aligned = static_cast<char*>(workspace.data()) + alignment;
  if (epilogue_has_bias(desc.epilogue)) probe.bias = class_aligned;
  if (epilogue_has_aux(desc.epilogue)) probe.aux = class_aligned;
  set_pointers(*plan, desc, probe);

  constexpr int kCandidates = 8;
  std::vector<cublasLtMatmulHeuristicResult_t> results(options.autotune ? kCandidates : 1);
  int found = 0;
  OPFUSE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(
                          handle, plan->matmul, plan->a, plan->b, plan->c, plan->d, preference,
                          static_cast<int>(results.size()), results.data(), &found),
                      describe(desc));
  if (found == 0) {
    throw CudaError(fmt::format("cuBLASLt's heuristic found no algorithm for {} on this GPU: "
                                "check_gemm() accepts it, so this is a cuBLASLt limit not yet "
                                "in check_gemm; run it in bf16 or without the epilogue",
                                describe(desc)),
                    "cuBLASLt", static_cast<int>(CUBLAS_STATUS_NOT_SUPPORTED));
  }
  results.resize(static_cast<std::size_t>(found));
  int choice = 0;
  if (results.size() > 1 && !desc.accumulate) {
    const std::lock_guard<std::mutex> lock(tuned_mutex());
    TunedChoices& tuned =
        tuned_choices().try_emplace(desc, TunedChoices{-1, -1, -1, -1, -1}).first->second;
    int& tuned_choice = tuned[static_cast<std::size_t>(alignment_class(alignment))];
    if (tuned_choice >= 0) {
      choice = std::min(tuned_choice, found - 1);
    } else if (!capturing(stream)) {
      set_pointers(*plan, desc, args);
      choice = fastest(*plan, results, desc, args, stream);
      tuned_choice = choice;
    }
  }
  plan->algo = results[static_cast<std::size_t>(choice)].algo;
  return plan;
}

GemmRunner::GemmRunner(cudaStream_t stream, GemmOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  OPFUSE_CUBLAS_CHECK(cublasLtCreate(&impl_->handle));
  impl_->workspace = DeviceBuffer(kWorkspaceBytes, stream);
  // Why: runs may come on any stream; the stream-ordered allocation must be complete first.
  OPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

GemmRunner::~GemmRunner() = default;

std::size_t GemmRunner::cached_plans() const {
  std::size_t count = 0;
  for (const auto& [desc, by_alignment] : impl_->plans) {
    for (const auto& plan : by_alignment) count += plan != nullptr ? 1 : 0;
  }
  return count;
}

void GemmRunner::run(const GemmDesc& desc, const GemmArgs& args, cudaStream_t stream) {
  const auto known = impl_->plans.find(desc);
  if (known == impl_->plans.end()) {
    const std::vector<std::string> reasons = check_gemm(desc);
    if (!reasons.empty()) {
      throw UsageError(
          fmt::format("cannot run {}:\n  - {}", describe(desc), fmt::join(reasons, "\n  - ")));
    }
  }
  const std::vector<std::string> problems = check_gemm_args(desc, args);
  if (!problems.empty()) {
    throw UsageError(fmt::format("bad arguments for {}:\n  - {}", describe(desc),
                                 fmt::join(problems, "\n  - ")));
  }
  const std::uint32_t alignment = pointer_alignment(args);
  auto& by_alignment = known != impl_->plans.end() ? known->second : impl_->plans[desc];
  std::unique_ptr<Plan>& slot = by_alignment[static_cast<std::size_t>(alignment_class(alignment))];
  if (slot == nullptr) slot = impl_->make_plan(desc, args, alignment, stream);
  Plan& plan = *slot;
  set_pointers(plan, desc, args);
  impl_->matmul(plan, plan.algo, desc, args, stream);
}

}  // namespace opfuse::gpu
