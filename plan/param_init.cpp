#include "plan/param_init.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace opfuse::plan {

std::string param_init_string(const ParamInit& init) {
  return fmt::format("{}({})", init.kind == ParamInit::Kind::Normal ? "normal" : "constant",
                     init.value);
}

double next_normal(std::mt19937_64& rng) {
  const double u1 = (double(rng() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = double(rng() >> 11) * 0x1.0p-53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

void ParamInitializer::fill(const ParamInit& init, std::span<float> values) {
  if (init.kind == ParamInit::Kind::Normal) {
    for (float& x : values) x = float(init.value * next_normal(rng_));
  } else {
    std::fill(values.begin(), values.end(), float(init.value));
  }
}

}  // namespace opfuse::plan
