#include "debug_config/stat_request.h"

#include <charconv>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace opfuse::debug {

namespace {

// TE's recipe prefixes for what-if statistics, and what opfuse quantizes them with.
struct RecipePrefix {
  std::string_view prefix;
  std::optional<plan::ScalingKind> scaling;  // nullopt: a recipe opfuse cannot quantize with yet
};
constexpr RecipePrefix kRecipes[] = {
    {"fp8_delayed_scaling", plan::ScalingKind::Delayed},
    {"fp8_current_scaling", plan::ScalingKind::Current},
    {"fp8_block_scaling", plan::ScalingKind::Block1D},  // 128x128 for a weight (instrument.cpp)
    {"mxfp8", plan::ScalingKind::MicroScaled},
    {"nvfp4", std::nullopt},
};

std::vector<std::string_view> names_of(StatFamily family, bool with_parameters) {
  std::vector<std::string_view> out;
  for (const StatInfo& s : kStatTable) {
    if (s.family != family) continue;
    if (s.kind == StatKind::MaxBlockwiseDynamicRange && !with_parameters) continue;
    out.push_back(s.name);
  }
  return out;
}

constexpr int kMaxBlockSize = 4096;

std::optional<int> small_int(const ConfigNode& n) {
  if (n.kind != ConfigNode::Kind::Scalar || n.quoted) return std::nullopt;
  int v = 0;
  const char* last = n.scalar.data() + n.scalar.size();
  const auto [end, ec] = std::from_chars(n.scalar.data(), last, v);
  if (ec != std::errc() || end != last) return std::nullopt;
  return v;
}

std::optional<StatRequest> blockwise(const ConfigNode& entry, std::string& error,
                                     std::string& hint) {
  const std::string_view name = stat_name(StatKind::MaxBlockwiseDynamicRange);
  hint = fmt::format("write `- {}: {{block_size: 32, dims: 1}}`", name);
  if (entry.entries.size() != 1 || entry.entries[0].key != name) {
    error = "a statistic with parameters must be a one-key map";
    hint = fmt::format("only {} takes parameters: {}", name, hint.substr(6));
    return std::nullopt;
  }
  const ConfigNode& params = entry.entries[0].value;
  if (params.kind != ConfigNode::Kind::Map) {
    error = fmt::format("{} needs a map of block_size and dims", name);
    return std::nullopt;
  }
  StatRequest r;
  r.kind = StatKind::MaxBlockwiseDynamicRange;
  for (const ConfigNode::Entry& p : params.entries) {
    if (p.key == "block_size") {
      // Bounded so that a 2-D block's element count fits the kernel's int
      // (templates/tensor_stats.cuh).
      const auto v = small_int(p.value);
      if (!v || *v < 1 || *v > kMaxBlockSize) {
        error = fmt::format("block_size must be an integer from 1 to {}", kMaxBlockSize);
        return std::nullopt;
      }
      r.block_size = *v;
    } else if (p.key == "dims") {
      const auto v = small_int(p.value);
      if (!v || (*v != 1 && *v != 2)) {
        error = "dims must be 1 (blocks along a row) or 2 (square tiles)";
        return std::nullopt;
      }
      r.dims = *v;
    } else {
      error = fmt::format("{} has no parameter '{}'", name, p.key);
      hint = "it takes block_size and dims";
      return std::nullopt;
    }
  }
  if (r.block_size == 0) {
    error = fmt::format("{} needs block_size", name);
    return std::nullopt;
  }
  r.name = fmt::format("{}_block_size_{}_dims_{}", name, r.block_size, r.dims);
  hint.clear();
  return r;
}

}  // namespace

std::optional<StatRequest> parse_stat_request(const ConfigNode& entry, StatFamily family,
                                              std::string& error, std::string& hint) {
  const std::string_view feature =
      family == StatFamily::Tensor ? "LogTensorStats" : "LogFp8TensorStats";
  if (entry.kind == ConfigNode::Kind::Map && family == StatFamily::Tensor) {
    return blockwise(entry, error, hint);
  }
  if (entry.kind != ConfigNode::Kind::Scalar) {
    error = "a statistic must be a name";
    return std::nullopt;
  }
  StatRequest r;
  r.name = entry.scalar;
  std::string_view s = entry.scalar;
  std::optional<RecipePrefix> recipe;
  if (family == StatFamily::Quantized) {
    constexpr std::string_view kColumnwise = "_columnwise";
    if (s.size() > kColumnwise.size() && s.ends_with(kColumnwise)) {
      s.remove_suffix(kColumnwise.size());
      r.columnwise = true;
    }
    for (const RecipePrefix& p : kRecipes) {
      if (s.size() > p.prefix.size() && s.starts_with(p.prefix) && s[p.prefix.size()] == '_') {
        recipe = p;
        s.remove_prefix(p.prefix.size() + 1);
        break;
      }
    }
  }
  const std::optional<StatKind> kind = parse_stat(s);
  if (!kind || stat_family(*kind) != family) {
    error = fmt::format("unknown statistic '{}' for {}", entry.scalar, feature);
    if (kind) {
      hint = fmt::format("{} is a statistic of the {} tensor: it belongs to {}", s,
                         family == StatFamily::Tensor ? "quantized" : "high-precision",
                         family == StatFamily::Tensor ? "LogFp8TensorStats" : "LogTensorStats");
    } else if (family == StatFamily::Tensor) {
      hint = fmt::format("LogTensorStats computes {}", fmt::join(names_of(family, true), ", "));
    } else {
      hint = fmt::format("LogFp8TensorStats computes [recipe_]stat[_columnwise], stat one of {}",
                         fmt::join(names_of(family, true), ", "));
    }
    return std::nullopt;
  }
  if (*kind == StatKind::MaxBlockwiseDynamicRange) {
    error = fmt::format("{} needs block_size (and optionally dims)", s);
    hint = fmt::format("write `- {}: {{block_size: 32, dims: 1}}`", s);
    return std::nullopt;
  }
  r.kind = *kind;
  const bool block_recipe = recipe && (recipe->scaling == plan::ScalingKind::Block1D ||
                                       recipe->scaling == plan::ScalingKind::MicroScaled);
  if (recipe && !recipe->scaling) {
    error = fmt::format("'{}' asks about the {} recipe, which opfuse cannot quantize with yet",
                        entry.scalar, recipe->prefix);
    hint =
        "opfuse quantizes with fp8_delayed_scaling, fp8_current_scaling, fp8_block_scaling and "
        "mxfp8";
    return std::nullopt;
  }
  // TE logs overflows% only for delayed scaling: a scale derived from the tensor's own amax
  // (current scaling, or per block) cannot make an element overflow.
  if (*kind == StatKind::Overflows && recipe && recipe->scaling != plan::ScalingKind::Delayed) {
    error = fmt::format("'{}' is always 0", entry.scalar);
    hint = fmt::format(
        "overflows% is defined for delayed scaling only (as in TE): under {} the scale comes "
        "from the amax of the values it scales",
        recipe->prefix);
    return std::nullopt;
  }
  if (is_per_block_stat(*kind) && !block_recipe) {
    error = fmt::format("'{}' is a per-block statistic", entry.scalar);
    hint =
        fmt::format("write it with a block-scaled recipe: fp8_block_scaling_{} or mxfp8_{}", s, s);
    return std::nullopt;
  }
  if (recipe) r.recipe = recipe->scaling;
  return r;
}

}  // namespace opfuse::debug
