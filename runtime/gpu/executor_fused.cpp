// Note "Fused GEMM epilogues" (docs/architecture.md): an inference forward runs an FP8 fprop GEMM
// with the gated activation after it folded into its epilogue (runtime/cutlass/fused_gemm.h)
// where the plan marks the pair (plan::GatedEpilogue), this GPU and the bound product are ones
// the compiled kernels take, B is a cached FP8 weight copy and set_fused_epilogues() has not
// turned it off. The activation step then runs nothing. Training forwards run both steps as
// planned (backward reads the GEMM's BF16 output).
//
// The kernel reads B with its gate and linear rows interleaved: the executor keeps that copy
// beside the weight cache (n x k bytes) and remakes it whenever the weight-cast group has been
// enqueued since (WeightCacheGroup::casts), in the stream order of the forward that reads it.
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
    if (gemm == nullptr || !gemm->inference_epilogue) continue;
    const plan::GatedEpilogue& e = *gemm->inference_epilogue;
    FusedGemm fused;
    fused.step = step.index;
    fused.folded = e.step;
    fused.activation = e.activation;
    fused.m = evaluate_expr(gemm->m, values);
    fused.n = evaluate_expr(gemm->n, values);
    fused.k = evaluate_expr(gemm->k, values);
    fused.output = e.output;
    std::string why = gated_gemm_refusal(e.activation, fused.m, fused.n, fused.k, sm);
    const int b_root = facts[static_cast<std::size_t>(gemm->b.buffer)].root;
    for (std::size_t g = 0; g < cache_groups.size() && fused.cache_group < 0; ++g) {
      for (int cast : cache_groups[g].steps) {
        for (int written : plan.steps[static_cast<std::size_t>(cast)].writes)
          if (facts[static_cast<std::size_t>(written)].root == b_root)
            fused.cache_group = static_cast<int>(g);
      }
    }
    if (why.empty() && fused.cache_group < 0)
      why = "its B operand is not a cached FP8 weight copy (a weight-cast group's output)";
    if (!why.empty()) {
      fused_refusals[step.index] = std::move(why);
      continue;
    }
    plan::ParamBinding value;
    value.kind = plan::ParamKind::Quantizer;
    value.quantizer = e.quantizer;
    value.quantizer_value = plan::QuantizerValue::Scale;
    fused.out_scale = static_cast<const float*>(state_pointer(value));
    value.quantizer_value = plan::QuantizerValue::Amax;
    fused.amax = static_cast<float*>(const_cast<void*>(state_pointer(value)));
    fused.interleaved = DeviceBuffer(bytes[static_cast<std::size_t>(b_root)], last_stream);
    fused_of_step[static_cast<std::size_t>(step.index)] = static_cast<int>(fused_gemms.size());
    folded_by_step[static_cast<std::size_t>(e.step)] = static_cast<int>(fused_gemms.size());
    fused_gemms.push_back(std::move(fused));
  }
}

bool SequenceExecutor::Impl::runs_fused(int index) const {
  return fused_epilogues && layout == RunMode::Inference &&
         fused_of_step[static_cast<std::size_t>(index)] >= 0;
}

bool SequenceExecutor::Impl::folded(int index) const {
  return fused_epilogues && layout == RunMode::Inference &&
         folded_by_step[static_cast<std::size_t>(index)] >= 0;
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
  launch_gated_gemm(gated, stream);
}

}  // namespace opfuse::gpu
