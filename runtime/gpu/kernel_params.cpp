#include "gpu/kernel_params.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "opfuse/error.h"

namespace opfuse::gpu {
namespace {

using Kind = plan::ParamKind;

constexpr std::size_t kPointerBytes = 8;

std::size_t round_up(std::size_t value, std::size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// Size and alignment of one field as the templates declare it.
ParamField field_shape(const plan::ParamBinding& param) {
  switch (param.kind) {
    case Kind::Int:
    case Kind::Float:
      return {0, 4, 4};
    case Kind::Int64:
      return {0, 8, 8};
    case Kind::Buffers:
      if (param.buffers.empty()) {
        throw UsageError(fmt::format(
            "params field '{}' is an array of no buffers: the plan must list one entry per array "
            "element (-1 for nullptr)",
            param.field));
      }
      return {0, kPointerBytes * param.buffers.size(), kPointerBytes};
    case Kind::Null:
    case Kind::Buffer:
    case Kind::Quantizer:
    case Kind::Records:
    case Kind::StatRecord:
    case Kind::Capture:
    case Kind::DropoutStep:
      return {0, kPointerBytes, kPointerBytes};
  }
  return {0, kPointerBytes, kPointerBytes};
}

template <typename T>
void put(std::vector<unsigned char>& bytes, std::size_t offset, const T& value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

}  // namespace

std::int64_t evaluate_expr(const plan::SymExpr& expr,
                           const std::map<std::string, std::int64_t>& symbols) {
  if (const auto known = expr.value()) return *known;
  try {
    return plan::evaluate(expr.text(), symbols);
  } catch (const std::invalid_argument& error) {
    throw UsageError(
        fmt::format("cannot evaluate the plan expression '{}': {}", expr.text(), error.what()));
  }
}

ParamLayout param_layout(const std::vector<plan::ParamBinding>& params) {
  ParamLayout layout;
  std::size_t offset = 0;
  for (const plan::ParamBinding& param : params) {
    ParamField field = field_shape(param);
    field.offset = round_up(offset, field.alignment);
    offset = field.offset + field.bytes;
    layout.alignment = std::max(layout.alignment, field.alignment);
    layout.fields.push_back(field);
  }
  layout.bytes = round_up(offset, layout.alignment);
  return layout;
}

PackedParams pack_params(const std::vector<plan::ParamBinding>& params,
                         const std::map<std::string, std::int64_t>& symbols,
                         const StatePointer& state_pointer) {
  const ParamLayout layout = param_layout(params);
  PackedParams packed;
  packed.bytes.assign(layout.bytes, 0);  // nulls and padding stay zero
  for (std::size_t i = 0; i < params.size(); ++i) {
    const plan::ParamBinding& param = params[i];
    const std::size_t offset = layout.fields[i].offset;
    switch (param.kind) {
      case Kind::Null:
        break;
      case Kind::Buffer:
        packed.buffer_slots.push_back({offset, param.buffers.at(0)});
        break;
      case Kind::Buffers:
        for (std::size_t j = 0; j < param.buffers.size(); ++j) {
          if (param.buffers[j] >= 0) {
            packed.buffer_slots.push_back({offset + j * kPointerBytes, param.buffers[j]});
          }
        }
        break;
      case Kind::Quantizer:
      case Kind::Records:
      case Kind::StatRecord:
      case Kind::Capture:
      case Kind::DropoutStep:
        put(packed.bytes, offset, state_pointer(param));
        break;
      case Kind::Int: {
        const std::int64_t value = evaluate_expr(param.int_value, symbols);
        if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
          throw UsageError(fmt::format(
              "params field '{}' = {} ({}) does not fit the kernel's 4-byte int: bind smaller "
              "sizes",
              param.field, value, param.int_value.text()));
        }
        put(packed.bytes, offset, static_cast<int>(value));
        break;
      }
      case Kind::Int64:
        put(packed.bytes, offset, static_cast<long long>(evaluate_expr(param.int_value, symbols)));
        break;
      case Kind::Float:
        put(packed.bytes, offset, static_cast<float>(param.float_value));
        break;
    }
  }
  return packed;
}

}  // namespace opfuse::gpu
