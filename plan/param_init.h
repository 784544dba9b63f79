// How a parameter starts out (declared by its op, docs/language.md) and the one seeded generator
// every consumer fills parameters with: `fusec run --device cpu` (the CPU reference) and
// Session::own_parameters (from a compiled program or a build directory), so both start from the
// same values for the same seed.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>

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

 private:
  std::mt19937_64 rng_;
};

// One N(0, 1) value from two uniform draws of `rng`.
double next_normal(std::mt19937_64& rng);

}  // namespace opfuse::plan
