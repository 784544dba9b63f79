#include "gpu/binding_check.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "gpu/gemm_desc.h"
#include "gpu/kernel_params.h"
#include "gpu/plan_gemm.h"
#include "opfuse/error.h"

namespace opfuse::gpu {
namespace {

std::map<std::string, std::int64_t> checked_symbols(
    const plan::SequencePlan& plan, const std::map<std::string, std::int64_t>& given, int num_sms) {
  std::map<std::string, std::int64_t> values;
  for (const std::string& symbol : plan.symbols) {
    if (symbol == plan::kNumSmsSymbol) continue;
    const auto found = given.find(symbol);
    if (found == given.end()) {
      // The SM count is bound by the executor, never by the caller: not listed.
      std::vector<std::string> sizes;
      for (const std::string& s : plan.symbols)
        if (s != plan::kNumSmsSymbol) sizes.push_back(s);
      throw UsageError(fmt::format(
          "sequence '{}' needs a size for '{}': bind every one of [{}] (Session::bind, or "
          "fusec's --bind NAME=SIZE, e.g. --bind {}=64)",
          plan.name, symbol, fmt::join(sizes, ", "), symbol));
    }
    if (found->second < 1 || found->second > kMaxSymbolValue) {
      throw UsageError(fmt::format("'{}' = {} for sequence '{}': sizes must be from 1 to {}",
                                   symbol, found->second, plan.name, kMaxSymbolValue));
    }
    values.emplace(symbol, found->second);
  }
  // A tensor-parallel plan's `tokens / tp`: each rank's share must be whole.
  for (const auto& [symbol, divisor] : plan.symbol_divisors) {
    const auto found = values.find(symbol);
    if (found != values.end() && found->second % divisor != 0) {
      throw UsageError(fmt::format(
          "'{}' = {} for sequence '{}' does not split into {} equal shares: the sequence is "
          "tensor-parallel over tp = {} ranks and a tensor's dimension is {} / {}; bind a "
          "multiple of {}",
          symbol, found->second, plan.name, divisor, plan.parallel.tp, symbol, divisor, divisor));
    }
  }
  for (const auto& [symbol, value] : given) {
    if (values.count(symbol) == 0) {
      throw UsageError(fmt::format(
          "sequence '{}' has no size '{}'{}: its sizes are [{}]", plan.name, symbol,
          symbol == plan::kNumSmsSymbol ? " to bind (num_sms comes from the device)" : "",
          fmt::join(plan.symbols, ", ")));
    }
  }
  values[plan::kNumSmsSymbol] = num_sms;
  return values;
}

void check_grid(const plan::Step& step, const plan::LaunchStep& launch,
                const std::map<std::string, std::int64_t>& values) {
  const std::int64_t x = evaluate_expr(launch.grid.x, values);
  const std::int64_t y = evaluate_expr(launch.grid.y, values);
  if (x < 0 || y < 0 || x > std::numeric_limits<int>::max() || y > 65535) {
    throw UsageError(
        fmt::format("{}: its grid ({}, {}) is outside CUDA's limits: bind smaller sizes",
                    describe_step(step), x, y));
  }
  // A kernel whose blocks run down the rows (the micro-scaled column-wise copies) names the
  // multiple its rows must be.
  const plan::SymExpr* rows = nullptr;
  const plan::SymExpr* multiple = nullptr;
  for (const auto& [name, expr] : launch.grid.dims) {
    if (name == "rows") rows = &expr;
    if (name == "rows_multiple") multiple = &expr;
  }
  if (rows != nullptr && multiple != nullptr) {
    const std::int64_t r = evaluate_expr(*rows, values);
    const std::int64_t m = evaluate_expr(*multiple, values);
    if (m > 0 && r % m != 0) {
      throw UsageError(fmt::format(
          "{}: its rows {} = {} are not a multiple of {}, which its scale blocks (running down "
          "the rows) need: bind the sizes in '{}' so that they are",
          describe_step(step), rows->text(), r, m, rows->text()));
    }
  }
}

void check_gemm_sizes(const plan::SequencePlan& plan, const plan::Step& step,
                      const plan::GemmStep& gemm, const std::map<std::string, std::int64_t>& values,
                      const plan::GemmCaps& caps) {
  const bool fp8 = is_fp8(gemm.a.dtype) || is_fp8(gemm.b.dtype);
  const std::int64_t multiple = plan::gemm_dim_multiple(caps, fp8);
  const std::pair<const char*, const plan::SymExpr*> dims[] = {
      {"m", &gemm.m}, {"n", &gemm.n}, {"k", &gemm.k}};
  for (const auto& [dim, expr] : dims) {
    const std::int64_t value = evaluate_expr(*expr, values);
    if (value % multiple == 0) continue;
    throw UsageError(fmt::format(
        "{}: {} = {} = {} is not a multiple of {}, which cuBLASLt needs for {} GEMMs: bind the "
        "sizes in '{}' so that it is",
        describe_step(step), dim, expr->text(), value, multiple, fp8 ? "FP8" : "16-bit",
        expr->text()));
  }
  const GemmDesc desc = gemm_desc(gemm, values, plan);
  const std::vector<std::string> reasons = check_gemm(desc);
  if (!reasons.empty()) {
    throw UsageError(fmt::format("{}: cuBLASLt cannot run {}: {}", describe_step(step),
                                 describe(desc), fmt::join(reasons, "; ")));
  }
}

}  // namespace

std::string describe_step(const plan::Step& step) {
  std::vector<std::string> locations;
  for (const plan::OpRef& op : step.ops) {
    if (!op.location.empty() &&
        std::find(locations.begin(), locations.end(), op.location) == locations.end()) {
      locations.push_back(op.location);
    }
  }
  if (locations.empty()) return fmt::format("step {} ({})", step.index, step.what);
  return fmt::format("step {} ({}, {})", step.index, step.what, fmt::join(locations, ", "));
}

std::map<std::string, std::int64_t> check_binding(const plan::SequencePlan& plan,
                                                  const std::map<std::string, std::int64_t>& given,
                                                  const plan::GemmCaps& caps, int num_sms) {
  std::map<std::string, std::int64_t> values = checked_symbols(plan, given, num_sms);
  for (const plan::Step& step : plan.steps) {
    if (const auto* launch = std::get_if<plan::LaunchStep>(&step.body)) {
      check_grid(step, *launch, values);
    } else if (const auto* gemm = std::get_if<plan::GemmStep>(&step.body)) {
      check_gemm_sizes(plan, step, *gemm, values, caps);
    }
    if (step.inference) check_grid(step, step.inference->launch, values);
  }
  return values;
}

std::map<std::string, int, std::less<>> caller_tensors(const plan::SequencePlan& plan) {
  std::map<std::string, int, std::less<>> callers;
  for (std::size_t id = 0; id < plan.buffers.size(); ++id) {
    const plan::Buffer& buffer = plan.buffers[id];
    if (!is_callers(buffer.role) || buffer.alias_of >= 0) continue;
    callers.emplace(ir_name(buffer.name), static_cast<int>(id));
  }
  return callers;
}

int caller_tensor(const plan::SequencePlan& plan,
                  const std::map<std::string, int, std::less<>>& callers, std::string_view name) {
  if (const auto found = callers.find(name); found != callers.end()) return found->second;
  std::vector<std::string> names;
  names.reserve(callers.size());
  for (const auto& [known, id] : callers) names.push_back(known);
  throw UsageError(fmt::format(
      "sequence '{}' takes no tensor '{}' from the caller: it takes [{}] (inputs, parameters "
      "and output gradients)",
      plan.name, name, fmt::join(names, ", ")));
}

}  // namespace opfuse::gpu
