#include "plan/quant_spec.h"

#include <fmt/format.h>

namespace opfuse::plan {

std::string quant_spec_string(const QuantSpec& s) {
  std::string out = fmt::format("{}({}", name(s.scaling), name(s.format));
  switch (s.scaling) {
    case ScalingKind::Delayed:
      out += fmt::format(", history = {}, amax = {}, margin = {}", s.history_length,
                         name(s.amax_compute), s.margin);
      break;
    case ScalingKind::Current:
      out += fmt::format(", epsilon = {}", s.epsilon);
      if (s.power_of_2_scale) out += ", power_of_2";
      break;
    case ScalingKind::Block1D:
    case ScalingKind::Block2D:
    case ScalingKind::MicroScaled:
      out += fmt::format(", {}x{}, scale = {}, epsilon = {}", s.block.rows, s.block.cols,
                         name(s.scale_dtype), s.epsilon);
      if (s.power_of_2_scale) out += ", power_of_2";
      if (s.rht) out += ", rht";
      if (s.stochastic_rounding) out += fmt::format(", stochastic_rounding(seed = {})", s.seed);
      break;
  }
  return out + ")";
}

}  // namespace opfuse::plan
