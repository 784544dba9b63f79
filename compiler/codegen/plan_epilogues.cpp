// SequenceBuilder::add_gated_epilogues (note "Fused GEMM epilogues" in docs/architecture.md):
// which FP8 fprop GEMMs an inference or a training forward may run with the gated activation after
// them folded into their epilogue (plan.h, GatedEpilogue; runtime/cutlass/fused_gemm.h runs them).
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "codegen/plan_builder.h"
#include "ir/pointwise_ops.h"

namespace opfuse::codegen {

namespace {

// The functors the runtime's gated GEMMs are compiled for (ir::fused_gemm_activation).
bool compiled_gated_functor(std::string_view functor) {
  for (const ir::PointwiseDef* def : ir::pointwise_defs()) {
    if (ir::fused_gemm_activation(*def) && ir::pointwise_functor_name(*def, {}) == functor)
      return true;
  }
  return false;
}

// The activation launch an inference forward runs for `step` (its variant where it has one).
const LaunchStep* inference_launch(const Step& step) {
  if (step.inference) return &step.inference->launch;
  return std::get_if<LaunchStep>(&step.body);
}

const ParamBinding* param(const LaunchStep& launch, std::string_view field) {
  for (const ParamBinding& p : launch.params)
    if (p.field == field) return &p;
  return nullptr;
}

}  // namespace

// The epilogue that computes exactly what `launch` (the activation step `act` as an inference or a
// training forward runs it) writes from the GEMM's D, or none: gated_activation_fwd with one of
// the compiled functors, D's two halves into an E4M3 copy with a per-tensor delayed-scaling
// scale, the transposed copy exactly when training, no statistics or learned parameters.
std::optional<GatedEpilogue> SequenceBuilder::match_gated_epilogue(const GemmStep& gemm,
                                                                   const Step& act,
                                                                   const LaunchStep* launch,
                                                                   bool training) const {
  if (launch == nullptr || launch->grid.x.value() == std::optional<int64_t>(0)) return {};
  const plan::Kernel* kernel = plan_.find_kernel(launch->kernel);
  if (kernel == nullptr || kernel->template_name != "gated_activation_fwd" ||
      kernel->template_args.size() != 4 || kernel->template_args[1] != "__nv_bfloat16" ||
      kernel->template_args[2] != "__nv_fp8_e4m3" ||
      kernel->template_args[3] != (training ? "true" : "false") ||
      !compiled_gated_functor(kernel->template_args[0]))
    return {};
  const ParamBinding* x = param(*launch, "x");
  const ParamBinding* y = param(*launch, "y");
  const ParamBinding* y_t = param(*launch, "y_t");
  const ParamBinding* scale = param(*launch, "scale");
  const ParamBinding* amax = param(*launch, "amax");
  const ParamBinding* rows = param(*launch, "rows");
  const ParamBinding* cols = param(*launch, "cols");
  if (x == nullptr || y == nullptr || scale == nullptr || amax == nullptr || rows == nullptr ||
      cols == nullptr || x->kind != ParamKind::Buffer || x->buffers.at(0) != gemm.d ||
      y->kind != ParamKind::Buffer || scale->kind != ParamKind::Quantizer ||
      scale->quantizer_value != QuantizerValue::Scale || amax->kind != ParamKind::Quantizer ||
      amax->quantizer_value != QuantizerValue::Amax || amax->quantizer != scale->quantizer ||
      rows->int_value != gemm.m)
    return {};
  if (training && (y_t == nullptr || y_t->kind != ParamKind::Buffer)) return {};
  const std::optional<int64_t> n = gemm.n.value(), half = cols->int_value.value();
  if (!n || !half || *n != 2 * *half) return {};
  // Nothing else: no statistics, scale record or learned parameter.
  const bool extra = std::any_of(launch->params.begin(), launch->params.end(), [&](auto& p) {
    if (&p == x || &p == y || &p == scale || &p == amax || &p == rows || &p == cols) return false;
    if (training && &p == y_t) return false;
    if (p.kind == ParamKind::Null) return false;
    return p.kind != ParamKind::Buffers ||
           std::any_of(p.buffers.begin(), p.buffers.end(), [](int b) { return b >= 0; });
  });
  if (extra) return {};
  const QuantizerPlan& q = out_.quantizers.at(size_t(scale->quantizer));
  if (q.spec.scaling != ScalingKind::Delayed || q.spec.format != DType::E4M3) return {};
  return GatedEpilogue{kernel->template_args[0], act.index, y->buffers.at(0),
                       training ? y_t->buffers.at(0) : -1, scale->quantizer};
}

// The GEMM qualifies when it is an FP8 x FP8 fprop into a plain BF16 D (no bias, no accumulation,
// per-tensor operand scales, cuBLASLt's TN layout) and the only forward step reading D is
// the gated activation match_gated_epilogue takes. In training, backward may read D too: the
// training kernel writes it.
void SequenceBuilder::add_gated_epilogues() {
  auto root_of = [&](int id) { return out_.buffers[size_t(id)].root; };  // set before the passes
  std::vector<std::vector<int>> forward_readers(out_.buffers.size());
  for (const Step& s : out_.steps) {
    if (s.phase != ir::Phase::Forward) continue;
    for (int id : s.reads) forward_readers[size_t(root_of(id))].push_back(s.index);
  }
  for (Step& g : out_.steps) {
    auto* gemm = std::get_if<GemmStep>(&g.body);
    if (gemm == nullptr || g.phase != ir::Phase::Forward || gemm->role != GemmRole::Fprop) continue;
    if (gemm->a.dtype != DType::E4M3 || gemm->b.dtype != DType::E4M3 ||
        gemm->a.scale_inv.quantizer < 0 || gemm->b.scale_inv.quantizer < 0 || gemm->a_transposed ||
        !gemm->b_transposed || gemm->d_dtype != DType::BF16 ||
        gemm->epilogue != GemmEpilogue::None || gemm->accumulate || gemm->d_quantizer >= 0)
      continue;
    const int d_root = root_of(gemm->d);
    if (!out_.buffers[size_t(d_root)].interface.empty()) continue;
    const std::vector<int>& readers = forward_readers[size_t(d_root)];
    if (readers.size() != 1 || readers[0] <= g.index) continue;
    const Step& act = out_.steps[size_t(readers[0])];
    gemm->inference_epilogue = match_gated_epilogue(*gemm, act, inference_launch(act), false);
    gemm->training_epilogue =
        match_gated_epilogue(*gemm, act, std::get_if<LaunchStep>(&act.body), true);
  }
}

}  // namespace opfuse::codegen
