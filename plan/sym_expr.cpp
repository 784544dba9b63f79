#include "plan/sym_expr.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <stdexcept>

namespace opfuse::plan {

SymExpr SymExpr::symbol(std::string name) {
  SymExpr e;
  e.factors_.push_back(std::move(name));
  return e;
}

SymExpr SymExpr::opaque(std::string call) { return symbol(std::move(call)); }

SymExpr SymExpr::parse(const std::string& text) {
  SymExpr result;
  int depth = 0;
  std::size_t begin = 0;
  auto add_factor = [&](std::size_t end) {
    std::string factor = text.substr(begin, end - begin);
    const auto first = factor.find_first_not_of(' ');
    const auto last = factor.find_last_not_of(' ');
    if (first == std::string::npos)
      throw std::invalid_argument(fmt::format("empty factor in plan expression '{}'", text));
    factor = factor.substr(first, last - first + 1);
    const bool integer = std::all_of(factor.begin() + (factor[0] == '-' ? 1 : 0), factor.end(),
                                     [](unsigned char c) { return std::isdigit(c) != 0; }) &&
                         factor != "-";
    if (integer) {
      result.constant_ *= std::stoll(factor);
    } else {
      result.factors_.push_back(std::move(factor));
    }
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '(') ++depth;
    if (text[i] == ')' && --depth < 0) break;
    if (text[i] == '*' && depth == 0) {
      add_factor(i);
      begin = i + 1;
    }
  }
  if (depth != 0)
    throw std::invalid_argument(
        fmt::format("unbalanced parentheses in plan expression '{}'", text));
  add_factor(text.size());
  if (result.constant_ == 0) result.factors_.clear();
  return result;
}

std::optional<int64_t> SymExpr::value() const {
  if (!is_known()) return std::nullopt;
  return constant_;
}

std::string SymExpr::text() const {
  if (factors_.empty()) return fmt::format("{}", constant_);
  std::string out;
  for (const std::string& f : factors_) out += (out.empty() ? "" : " * ") + f;
  if (constant_ != 1) out += fmt::format(" * {}", constant_);
  return out;
}

SymExpr operator*(const SymExpr& a, const SymExpr& b) {
  SymExpr product;
  product.constant_ = a.constant_ * b.constant_;
  if (product.constant_ == 0) return product;  // 0 * anything is known
  product.factors_ = a.factors_;
  product.factors_.insert(product.factors_.end(), b.factors_.begin(), b.factors_.end());
  return product;
}

SymExpr ceil_div(const SymExpr& a, int64_t divisor) {
  if (a.is_known()) return (a.constant_ + divisor - 1) / divisor;
  // ceil_div(c * X, d) == (c / d) * X exactly when d divides c.
  if (a.constant_ % divisor == 0) {
    SymExpr exact = a;
    exact.constant_ /= divisor;
    return exact;
  }
  return SymExpr::opaque(fmt::format("ceil_div({}, {})", a.text(), divisor));
}

SymExpr exact_div(const SymExpr& a, int64_t divisor) {
  if (divisor == 1) return a;
  if (a.constant_ % divisor == 0) {
    SymExpr exact = a;
    exact.constant_ /= divisor;
    return exact;
  }
  return SymExpr::opaque(fmt::format("div({}, {})", a.text(), divisor));
}

SymExpr min_of(const SymExpr& a, const SymExpr& b) {
  if (a.is_known() && b.is_known()) return std::min(a.constant_, b.constant_);
  return SymExpr::opaque(fmt::format("min({}, {})", a.text(), b.text()));
}

SymExpr max_of(const SymExpr& a, const SymExpr& b) {
  if (a.is_known() && b.is_known()) return std::max(a.constant_, b.constant_);
  return SymExpr::opaque(fmt::format("max({}, {})", a.text(), b.text()));
}

namespace {

// Recursive descent over: expr := term ('*' term)*; term := integer | name | name '(' expr ','
// expr ')'. Depth is bounded by the text, which the plan builder writes.
class Evaluator {
 public:
  Evaluator(const std::string& text, const std::map<std::string, int64_t>& bindings)
      : text_(text), bindings_(bindings) {}

  int64_t run() {
    const int64_t v = product();
    skip_space();
    if (at_ < text_.size()) fail("unexpected text");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw std::invalid_argument(
        fmt::format("plan expression '{}': {} at offset {}", text_, why, at_));
  }
  void skip_space() {
    while (at_ < text_.size() && text_[at_] == ' ') ++at_;
  }
  bool accept(char c) {
    skip_space();
    if (at_ < text_.size() && text_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!accept(c)) fail(fmt::format("expected '{}'", c));
  }
  int64_t product() {
    int64_t v = term();
    while (accept('*')) {
      if (__builtin_mul_overflow(v, term(), &v)) fail("the product overflows 64 bits");
    }
    return v;
  }
  int64_t term() {
    skip_space();
    if (at_ >= text_.size()) fail("unexpected end");
    const size_t start = at_;
    if (std::isdigit(static_cast<unsigned char>(text_[at_]))) {
      while (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]))) ++at_;
      try {
        return std::stoll(text_.substr(start, at_ - start));
      } catch (const std::out_of_range&) {
        fail("the number overflows 64 bits");
      }
    }
    while (at_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[at_])) || text_[at_] == '_'))
      ++at_;
    const std::string name = text_.substr(start, at_ - start);
    if (name.empty()) fail("expected a number or a name");
    if (!accept('(')) {
      const auto it = bindings_.find(name);
      if (it == bindings_.end()) fail(fmt::format("symbol '{}' is not bound", name));
      return it->second;
    }
    const int64_t a = product();
    expect(',');
    const int64_t b = product();
    expect(')');
    if (name == "ceil_div") {
      if (b <= 0) fail("ceil_div by a non-positive number");
      return a / b + (a % b > 0 ? 1 : 0);
    }
    if (name == "div") {
      if (b <= 0) fail("div by a non-positive number");
      if (a % b != 0) fail(fmt::format("{} does not divide by {}", a, b));
      return a / b;
    }
    if (name == "min") return std::min(a, b);
    if (name == "max") return std::max(a, b);
    fail(fmt::format("unknown function '{}'", name));
  }

  const std::string& text_;
  const std::map<std::string, int64_t>& bindings_;
  size_t at_ = 0;
};

}  // namespace

int64_t evaluate(const std::string& text, const std::map<std::string, int64_t>& bindings) {
  return Evaluator(text, bindings).run();
}

}  // namespace opfuse::plan
