#include "ir/types.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace opfuse::ir {

std::optional<DType> parse_user_dtype(std::string_view name) {
  if (name == "bf16") return DType::BF16;
  if (name == "fp16") return DType::FP16;
  if (name == "fp32") return DType::FP32;
  return std::nullopt;
}

std::string dim_string(const Dim& d) {
  if (!d.is_symbolic()) return fmt::format("{}", d.size);
  return d.divisor == 1 ? d.symbol : fmt::format("{} / {}", d.symbol, d.divisor);
}

std::string shape_string(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += dim_string(s[i]);
  }
  return out + "]";
}

std::string type_string(const TensorType& t) {
  return std::string(dtype_name(t.dtype)) + shape_string(t.shape);
}

ElementCount element_count(const Shape& s) {
  ElementCount c;
  for (const Dim& d : s) {
    if (d.is_symbolic()) {
      c.symbols.push_back(dim_string(d));
    } else if (!c.overflowed) {
      if (d.size != 0 && c.known > std::numeric_limits<int64_t>::max() / d.size) {
        c.overflowed = true;
        c.known = std::numeric_limits<int64_t>::max();
      } else {
        c.known *= d.size;
      }
    }
  }
  std::sort(c.symbols.begin(), c.symbols.end());
  return c;
}

}  // namespace opfuse::ir
