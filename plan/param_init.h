// How a parameter starts out (declared by its op, docs/language.md) and the one seeded generator
// every consumer fills parameters with: `fusec run --device cpu` (the CPU reference, one rank or
// simulated ranks) and Session::own_parameters (from a compiled program or a build directory), so
// all start from the same values for the same seed, a tensor-parallel rank from its shard of them.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "plan/parallel.h"

namespace opfuse::plan {

struct ParamInit {
  enum class Kind : uint8_t { Normal, Constant };
  Kind kind = Kind::Constant;
  double value = 0;  // Normal: the standard deviation (mean 0); Constant: the value
  static ParamInit normal(double stddev) { return {Kind::Normal, stddev}; }
  static ParamInit constant(double value) { return {Kind::Constant, value}; }
  friend bool operator==(const ParamInit&, const ParamInit&) = default;
};
std::string param_init_string(const ParamInit& init);  // "normal(0.02)", "constant(1)"

// Fills parameters in creation order from one mt19937_64 seeded with `seed`: normal draws by
// Box-Muller from two uniform draws each (the same on every platform), constants without draws.
class ParamInitializer {
 public:
  explicit ParamInitializer(uint64_t seed) : rng_(seed) {}
  void fill(const ParamInit& init, std::span<float> values);
  // Rank `rank`'s shard (`values`, of shape `shard_shape`) of a parameter cut by `shard` over `tp`
  // ranks: draws the whole parameter, as the unsharded program's initializer does, and keeps
  // take_shard's part of it, so the ranks' shards join into the unsharded program's starting
  // value and the next parameter starts from the same draws as there. An unsharded parameter (or
  // tp = 1) is fill(). Throws std::invalid_argument when the shape does not fit `values`.
  void fill_shard(const ParamInit& init, std::span<float> values,
                  const std::vector<int64_t>& shard_shape, const ShardSpec& shard, int tp,
                  int rank);

 private:
  std::mt19937_64 rng_;
};

// One N(0, 1) value from two uniform draws of `rng`.
double next_normal(std::mt19937_64& rng);

}  // namespace opfuse::plan
