// Note "Fused GEMM epilogues" (docs/architecture.md): a forward runs an FP8 fprop GEMM with the
// gated activation after it folded into its epilogue (runtime/cutlass/fused_gemm.h) where the
// plan marks the pair for that run mode (plan::GatedEpilogue), this GPU and the bound product are
// ones the compiled kernels take, B is a cached FP8 weight copy and set_fused_epilogues() has not
// turned it off. The activation step then runs nothing. An inference forward's kernel writes the
// activation's E4M3 output; a training forward's also its transposed copy and the GEMM's BF16
// output, which backward reads. Training forwards fuse only when set_fused_training_epilogues()
// asks: on the H200 that kernel is slower than the pair it replaces (bench/RESULTS.md).
//
// The kernel reads B with its gate and linear rows interleaved: the executor keeps that copy
// beside the weight cache (n x k bytes) and remakes it whenever the weight-cast group has been
// enqueued since (WeightCacheGroup::casts), in the stream order of the forward that reads it.
#include <fmt/format.h>

#include "cutlass/fused_gemm.h"
#include "gpu/executor_impl.h"
#include "gpu/plan_gemm.h"

namespace opfuse::gpu {

void SequenceExecutor::Impl::bind_fused_gemms(const std::map<std::string, std::int64_t>& values) {
  fused_gemms.clear();
  fused_refusals.clear();
  fused_of_step.assign(plan.steps.size(), -1);
  folded_by_step.assign(plan.steps.size(), -1);
  for (const Step& step : plan.steps) {
    const auto* gemm = std::get_if<GemmStep>(&step.body);
    if (gemm == nullptr || (!gemm->inference_epilogue && !gemm->training_epilogue)) continue;
    const plan::GatedEpilogue& e =
        gemm->inference_epilogue ? *gemm->inference_epilogue : *gemm->training_epilogue;
    FusedGemm fused;
    fused.step = step.index;
    fused.folded = e.step;
    fused.activation = e.activation;
    fused.m = evaluate_expr(gemm->m, values);
    fused.n = evaluate_expr(gemm->n, values);
    fused.k = evaluate_expr(gemm->k, values);
    fused.output = e.output;
    const int b_root = facts[static_cast<std::size_t>(gemm->b.buffer)].root;
    for (std::size_t g = 0; g < cache_groups.size() && fused.cache_group < 0; ++g) {
      for (int cast : cache_groups[g].steps) {
        for (int written : plan.steps[static_cast<std::size_t>(cast)].writes)
          if (facts[static_cast<std::size_t>(written)].root == b_root)
            fused.cache_group = static_cast<int>(g);
      }
    }
    // Why each mode's epilogue does not run fused (empty: it does).
    auto refusal = [&](const std::optional<plan::GatedEpilogue>& epilogue, bool training) {
      if (!epilogue) return std::string();
      if (epilogue->step != e.step || epilogue->output != e.output ||
          epilogue->quantizer != e.quantizer || epilogue->activation != e.activation)
        return std::string("the plan's inference and training epilogues fold different steps");
      std::string why = gated_gemm_refusal(e.activation, fused.m, fused.n, fused.k, sm, training);
      if (why.empty() && fused.cache_group < 0)
        why = "its B operand is not a cached FP8 weight copy (a weight-cast group's output)";
      return why;
    };
    const std::string inference_why = refusal(gemm->inference_epilogue, false);
    const std::string training_why = refusal(gemm->training_epilogue, true);
    fused.inference = gemm->inference_epilogue && inference_why.empty();
    fused.training = gemm->training_epilogue && training_why.empty();
    if (!inference_why.empty() && inference_why == training_why) {
      fused_refusals[step.index] = inference_why;
    } else if (!inference_why.empty() || !training_why.empty()) {
      std::string why;
      if (!inference_why.empty()) why = "in inference forwards: " + inference_why;
      if (!training_why.empty())
        why += fmt::format("{}in training forwards: {}", why.empty() ? "" : "; ", training_why);
      fused_refusals[step.index] = std::move(why);
    }
    if (!fused.inference && !fused.training) continue;
    if (fused.training) fused.output_t = gemm->training_epilogue->output_t;
    plan::ParamBinding value;
    value.kind = plan::ParamKind::Quantizer;
    value.quantizer = e.quantizer;
    value.quantizer_value = plan::QuantizerValue::Scale;
    fused.out_scale = static_cast<const float*>(state_pointer(value));
    value.quantizer_value = plan::QuantizerValue::Amax;
    fused.amax = static_cast<float*>(const_cast<void*>(state_pointer(value)));
    fused.interleaved_bytes = bytes[static_cast<std::size_t>(b_root)];
    fused_of_step[static_cast<std::size_t>(step.index)] = static_cast<int>(fused_gemms.size());
    folded_by_step[static_cast<std::size_t>(e.step)] = static_cast<int>(fused_gemms.size());
    fused_gemms.push_back(std::move(fused));
  }
  if (fused_epilogues) allocate_fused_gemms();
}

// The interleaved weight copies, made when fusing is on (bind() or set_fused_epilogues(true)), so
// that a session that never fuses holds no copy and no allocation happens inside a forward (an
// application may be capturing it).
void SequenceExecutor::Impl::allocate_fused_gemms() {
  for (FusedGemm& f : fused_gemms) {
    if (f.interleaved.data() == nullptr)
      f.interleaved = DeviceBuffer(f.interleaved_bytes, last_stream);
  }
}

const FusedGemm* SequenceExecutor::Impl::fused_at(int index, RunMode mode, bool as_gemm) const {
  const int f = (as_gemm ? fused_of_step : folded_by_step)[static_cast<std::size_t>(index)];
  if (!fusing_in(mode) || f < 0) return nullptr;
  const FusedGemm& fused = fused_gemms[static_cast<std::size_t>(f)];
  return fused.runs_in(mode) ? &fused : nullptr;
}

bool SequenceExecutor::Impl::runs_fused(int index) const {
  return fused_at(index, layout, true) != nullptr;
}

bool SequenceExecutor::Impl::folded(int index) const {
  return fused_at(index, layout, false) != nullptr;
}

void SequenceExecutor::Impl::run_fused(int index, const GemmArgs& args, cudaStream_t stream) {
  FusedGemm& f =
      fused_gemms[static_cast<std::size_t>(fused_of_step[static_cast<std::size_t>(index)])];
  if (!f.fresh(cache_groups)) {
    interleave_gated_rows(args.b, f.interleaved.data(), f.n, f.k, stream);
    f.interleaved_at = cache_groups[static_cast<std::size_t>(f.cache_group)].casts;
  }
  GatedGemmArgs gated;
  gated.activation = f.activation;
  gated.m = f.m, gated.n = f.n, gated.k = f.k;
  gated.a = args.a;
  gated.b = f.interleaved.data();
  gated.a_scale_inv = args.a_scale_inv;
  gated.b_scale_inv = args.b_scale_inv;
  gated.out_scale = f.out_scale;
  gated.amax = f.amax;
  gated.out = pointer(f.output);
  if (layout == RunMode::Training) {
    gated.out_t = pointer(f.output_t);
    gated.d = args.d;
  }
  launch_gated_gemm(gated, stream);
}

}  // namespace opfuse::gpu
