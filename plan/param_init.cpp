#include "plan/param_init.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

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

void ParamInitializer::fill_shard(const ParamInit& init, std::span<float> values,
                                  const std::vector<int64_t>& shard_shape, const ShardSpec& shard,
                                  int tp, int rank) {
  int64_t elements = 1;
  for (int64_t d : shard_shape) elements *= d;
  if (elements != int64_t(values.size()))
    throw std::invalid_argument(
        fmt::format("{} values for a parameter shard of {} elements", values.size(), elements));
  if (!shard.sharded() || tp == 1) {
    fill(init, values);
    return;
  }
  if (shard.dim < 0 || size_t(shard.dim) >= shard_shape.size() || tp < 1 || rank < 0 || rank >= tp)
    throw std::invalid_argument(
        fmt::format("shard(dim = {}) of rank {} of {} does not fit a parameter of rank {}",
                    shard.dim, rank, tp, shard_shape.size()));
  std::vector<int64_t> full_shape = shard_shape;
  full_shape[size_t(shard.dim)] *= tp;
  std::vector<float> full(values.size() * size_t(tp));
  fill(init, full);
  const std::vector<float> mine = take_shard<float>(full, full_shape, shard, tp, rank);
  std::copy(mine.begin(), mine.end(), values.begin());
}

}  // namespace opfuse::plan
