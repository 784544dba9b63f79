#include "ir/types.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace opfuse::ir {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::BF16:
      return "bf16";
    case DType::FP16:
      return "fp16";
    case DType::FP32:
      return "fp32";
    case DType::E4M3:
      return "e4m3";
    case DType::E5M2:
      return "e5m2";
  }
  return "?";
}

std::optional<DType> parse_user_dtype(std::string_view name) {
  if (name == "bf16") return DType::BF16;
  if (name == "fp16") return DType::FP16;
  if (name == "fp32") return DType::FP32;
  return std::nullopt;
}

int dtype_bytes(DType t) {
  switch (t) {
    case DType::BF16:
    case DType::FP16:
      return 2;
    case DType::FP32:
      return 4;
    case DType::E4M3:
    case DType::E5M2:
      return 1;
  }
  return 0;
}

std::string dim_string(const Dim& d) {
  return d.is_symbolic() ? d.symbol : fmt::format("{}", d.size);
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
      c.symbols.push_back(d.symbol);
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
