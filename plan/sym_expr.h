// Integer expressions over the symbols bound at run time (`tokens`, `batch`, the device's
// `num_sms`), as the plan spells sizes, grids and byte counts (note "Plan expressions" in
// docs/codegen.md). Known parts fold at construction, so a fully known size is a plain integer.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace opfuse::plan {

// The run-time symbol for the number of SMs of the device a plan runs on.
inline constexpr const char* kNumSmsSymbol = "num_sms";

// A product of a known factor and unknown factors (symbols or calls such as
// `ceil_div(tokens, 64)`), kept in a canonical order: factors as built, constant last.
class SymExpr {
 public:
  SymExpr() = default;
  // Implicit on purpose: sizes are written as plain integers (`rows * 8`).
  SymExpr(int64_t value) : constant_(value) {}
  static SymExpr symbol(std::string name);
  // The inverse of text() (a plan.json size): integer factors fold into the constant, every other
  // top-level factor is kept as written. Throws std::invalid_argument for empty or unbalanced text.
  static SymExpr parse(const std::string& text);

  bool is_known() const { return factors_.empty(); }
  std::optional<int64_t> value() const;
  // "tokens * 8192", "448", "min(ceil_div(tokens, 4), num_sms * 2)".
  std::string text() const;

  friend SymExpr operator*(const SymExpr& a, const SymExpr& b);
  friend bool operator==(const SymExpr&, const SymExpr&) = default;

 private:
  static SymExpr opaque(std::string call);  // a call that cannot fold: one factor
  friend SymExpr ceil_div(const SymExpr& a, int64_t divisor);
  friend SymExpr exact_div(const SymExpr& a, int64_t divisor);
  friend SymExpr min_of(const SymExpr& a, const SymExpr& b);
  friend SymExpr max_of(const SymExpr& a, const SymExpr& b);

  int64_t constant_ = 1;
  std::vector<std::string> factors_;
};

SymExpr ceil_div(const SymExpr& a, int64_t divisor);
// a / divisor where the binding makes it whole (`tokens / tp`): "div(tokens, 2)", whose
// evaluation fails for a size that does not divide.
SymExpr exact_div(const SymExpr& a, int64_t divisor);
SymExpr min_of(const SymExpr& a, const SymExpr& b);
SymExpr max_of(const SymExpr& a, const SymExpr& b);

// Evaluates a plan expression (integers, symbols, `*`, ceil_div/div/min/max calls) with `bindings`;
// throws std::invalid_argument naming the first unbound symbol or the malformed text.
int64_t evaluate(const std::string& text, const std::map<std::string, int64_t>& bindings);

}  // namespace opfuse::plan
