#include "plan/plan.h"

#include <algorithm>

namespace opfuse::plan {

std::vector<int> buffers_named_by(const Step& step, bool inference) {
  const bool variant = inference && step.inference.has_value();
  if (variant && step.inference->launch.grid.x.value() == std::optional<std::int64_t>(0)) return {};
  std::vector<int> ids(step.reads);
  const std::vector<int>& writes = variant ? step.inference->writes : step.writes;
  ids.insert(ids.end(), writes.begin(), writes.end());
  const LaunchStep* launch =
      variant ? &step.inference->launch : std::get_if<LaunchStep>(&step.body);
  if (launch != nullptr) {
    for (const ParamBinding& param : launch->params) {
      if (param.kind == ParamKind::Buffer || param.kind == ParamKind::Buffers)
        ids.insert(ids.end(), param.buffers.begin(), param.buffers.end());
    }
  } else if (const auto* gemm = std::get_if<GemmStep>(&step.body)) {
    ids.insert(ids.end(),
               {gemm->a.buffer, gemm->b.buffer, gemm->d, gemm->c, gemm->bias, gemm->aux});
    // A fused epilogue writes the activation step's outputs here already (GatedEpilogue).
    if (const auto& e = inference ? gemm->inference_epilogue : gemm->training_epilogue)
      ids.insert(ids.end(), {e->output, e->output_t});
  } else if (const auto* collective = std::get_if<CollectiveStep>(&step.body)) {
    ids.insert(ids.end(), {collective->input, collective->output});
  }
  std::erase_if(ids, [](int id) { return id < 0; });
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace opfuse::plan
