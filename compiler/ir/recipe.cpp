#include "ir/recipe.h"

#include <fmt/format.h>

namespace opfuse::ir {

std::string_view recipe_kind_name(RecipeKind k) {
  switch (k) {
    case RecipeKind::BF16:
      return "bf16";
    case RecipeKind::DelayedScaling:
      return "delayed_scaling";
    case RecipeKind::CurrentScaling:
      return "current_scaling";
    case RecipeKind::Float8BlockScaling:
      return "float8_block_scaling";
    case RecipeKind::Mxfp8BlockScaling:
      return "mxfp8_block_scaling";
    case RecipeKind::Nvfp4BlockScaling:
      return "nvfp4_block_scaling";
  }
  return "?";
}

int micro_block_multiple(const Recipe& r) {
  return r.kind == RecipeKind::Mxfp8BlockScaling   ? 32
         : r.kind == RecipeKind::Nvfp4BlockScaling ? 16
                                                   : 0;
}

std::string_view fp8_format_name(Fp8Format f) { return f == Fp8Format::Hybrid ? "hybrid" : "e4m3"; }

std::string_view amax_compute_name(AmaxCompute a) {
  return a == AmaxCompute::Max ? "max" : "most_recent";
}

std::string recipe_string(const Recipe& r) {
  switch (r.kind) {
    case RecipeKind::BF16:
      return "bf16()";
    case RecipeKind::DelayedScaling:
      return fmt::format(
          "delayed_scaling(format = {}, amax_history = {}, amax_compute = {}, margin = {})",
          fp8_format_name(r.format), r.amax_history, amax_compute_name(r.amax_compute), r.margin);
    case RecipeKind::CurrentScaling:
      return fmt::format("current_scaling(format = {}, amax_epsilon = {}, power_of_2_scale = {})",
                         fp8_format_name(r.format), r.amax_epsilon, r.power_of_2_scale);
    case RecipeKind::Float8BlockScaling:
      return fmt::format(
          "float8_block_scaling(format = {}, x_block = {}, w_block = {}, grad_block = {}, "
          "power_of_2_scale = {}, amax_epsilon = {})",
          fp8_format_name(r.format), r.x_block, r.w_block, r.grad_block, r.power_of_2_scale,
          r.amax_epsilon);
    case RecipeKind::Mxfp8BlockScaling:
      return fmt::format("mxfp8_block_scaling(format = {})", fp8_format_name(r.format));
    case RecipeKind::Nvfp4BlockScaling:
      return fmt::format(
          "nvfp4_block_scaling(rht = {}, stochastic_rounding = {}, w_2d = {}, seed = {})", r.rht,
          r.stochastic_rounding, r.w_2d, r.seed);
  }
  return "?";
}

}  // namespace opfuse::ir
