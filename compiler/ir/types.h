// Element types and symbolic tensor shapes of the IR.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "plan/enums.h"

namespace opfuse::ir {

// The IR's element types are the plan's (plan/enums.h): one enum from the parser to the runtime.
using plan::DType;
using plan::dtype_bytes;
using plan::dtype_is_fp8;
using plan::dtype_name;  // "bf16", "fp16", "fp32", "e4m3", "e5m2"
// Parses the dtypes a user may write in a signature (bf16, fp16, fp32).
std::optional<DType> parse_user_dtype(std::string_view name);

// One dimension: a known size, or a symbol bound at run time (`tokens`), divided by a known
// divisor where a tensor-parallel sequence splits it over its ranks (`tokens / tp`: the rank's
// share of the tokens; the bound size must divide, docs/parallel.md).
struct Dim {
  int64_t size = 0;     // valid when symbol is empty
  std::string symbol;   // non-empty for a symbolic dimension
  int64_t divisor = 1;  // symbolic dimensions: the size is symbol / divisor

  static Dim known(int64_t n) { return Dim{n, {}, 1}; }
  static Dim named(std::string s, int64_t divisor = 1) { return Dim{0, std::move(s), divisor}; }
  bool is_symbolic() const { return !symbol.empty(); }
  friend bool operator==(const Dim&, const Dim&) = default;
};

using Shape = std::vector<Dim>;

std::string dim_string(const Dim& d);      // "4096", "tokens", "tokens / 2"
std::string shape_string(const Shape& s);  // "[tokens, 4096]"

struct TensorType {
  DType dtype = DType::BF16;
  Shape shape;
  friend bool operator==(const TensorType&, const TensorType&) = default;
};

std::string type_string(const TensorType& t);  // "bf16[tokens, 4096]"

// Product of the known dimensions and the sorted list of symbols (a divided symbol as
// dim_string spells it): two shapes hold the same number of elements for every binding iff both
// parts are equal (used by reshape).
struct ElementCount {
  int64_t known = 1;  // saturates at INT64_MAX on overflow (overflowed = true)
  bool overflowed = false;
  std::vector<std::string> symbols;
  friend bool operator==(const ElementCount&, const ElementCount&) = default;
};
ElementCount element_count(const Shape& s);

}  // namespace opfuse::ir
