// The IR builder's constant expressions: evaluation, overflow, unknown names, and the dimensions
// and tensor types of signatures (the Builder class is in builder_impl.h).

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "ir/builder_impl.h"
#include "support/spelling.h"

namespace opfuse::ir::builder_detail {

std::optional<ConstValue> Builder::eval(const Expr& e, bool allow_float) {
  switch (e.kind) {
    case Expr::Kind::Int:
      return ConstValue{e.int_value};
    case Expr::Kind::Float:
      if (!allow_float) {
        diags_.error(e.loc, fmt::format("expected an integer, found the number {}", e.text));
        return std::nullopt;
      }
      return ConstValue{e.float_value};
    case Expr::Kind::Bool:
      return ConstValue{e.int_value != 0};
    case Expr::Kind::String:
      diags_.error(e.loc, "a string is not allowed here", "strings appear only after 'import'");
      return std::nullopt;
    case Expr::Kind::List:
      diags_.error(e.loc, "a list is not allowed here", "lists are the shape argument of reshape");
      return std::nullopt;
    case Expr::Kind::Name: {
      if (failed_consts_.count(e.text)) return std::nullopt;
      auto it = consts_.find(e.text);
      if (it != consts_.end()) {
        if (!allow_float && std::holds_alternative<double>(it->second)) {
          diags_.error(e.loc,
                       fmt::format("constant '{}' is the number {}, but an integer is needed here",
                                   e.text, const_value_string(it->second)));
          return std::nullopt;
        }
        return it->second;
      }
      unknown_name(e);
      return std::nullopt;
    }
    case Expr::Kind::Unary: {
      if (e.operands.empty() || !e.operands[0]) return std::nullopt;
      auto v = eval(*e.operands[0], allow_float);
      if (!v) return std::nullopt;
      if (auto* i = std::get_if<int64_t>(&*v)) {
        if (*i == std::numeric_limits<int64_t>::min()) return overflow(e);
        return ConstValue{-*i};
      }
      if (auto* d = std::get_if<double>(&*v)) return ConstValue{-*d};
      diags_.error(e.loc, "cannot negate a bool");
      return std::nullopt;
    }
    case Expr::Kind::Binary:
      return eval_binary(e, allow_float);
    case Expr::Kind::Compare:
    case Expr::Kind::Call:  // the parser makes these only inside op definitions
      diags_.error(e.loc, "comparisons and calls belong in op definitions",
                   "a constant is numbers, constants and + - * / %");
      return std::nullopt;
  }
  return std::nullopt;
}

std::optional<ConstValue> Builder::overflow(const Expr& e) {
  diags_.error(e.loc, "integer overflow in constant expression", "values must fit in 64 bits");
  return std::nullopt;
}

std::optional<ConstValue> Builder::eval_binary(const Expr& e, bool allow_float) {
  if (e.operands.size() != 2 || !e.operands[0] || !e.operands[1]) return std::nullopt;
  auto a = eval(*e.operands[0], allow_float);
  auto b = eval(*e.operands[1], allow_float);
  if (!a || !b) return std::nullopt;
  if (std::holds_alternative<bool>(*a) || std::holds_alternative<bool>(*b)) {
    diags_.error(e.loc, fmt::format("'{}' does not apply to bools", e.op));
    return std::nullopt;
  }
  if (std::holds_alternative<int64_t>(*a) && std::holds_alternative<int64_t>(*b)) {
    const int64_t x = std::get<int64_t>(*a), y = std::get<int64_t>(*b);
    int64_t r = 0;
    switch (e.op) {
      case '+':
        if (__builtin_add_overflow(x, y, &r)) return overflow(e);
        return ConstValue{r};
      case '-':
        if (__builtin_sub_overflow(x, y, &r)) return overflow(e);
        return ConstValue{r};
      case '*':
        if (__builtin_mul_overflow(x, y, &r)) return overflow(e);
        return ConstValue{r};
      case '/':
      case '%':
        if (y == 0) {
          diags_.error(e.loc, fmt::format("division by zero in '{} {} {}'", x, e.op, y));
          return std::nullopt;
        }
        if (x == std::numeric_limits<int64_t>::min() && y == -1) return overflow(e);
        if (e.op == '%') return ConstValue{x % y};
        // Shapes are built from these: a silently truncated size would be a wrong shape.
        if (x % y != 0) {
          diags_.error(e.loc,
                       fmt::format("{} / {} is not a whole number (remainder {})", x, y, x % y),
                       "integer '/' must divide exactly; use a divisible value");
          return std::nullopt;
        }
        return ConstValue{x / y};
    }
    return std::nullopt;
  }
  const double x =
      std::holds_alternative<int64_t>(*a) ? double(std::get<int64_t>(*a)) : std::get<double>(*a);
  const double y =
      std::holds_alternative<int64_t>(*b) ? double(std::get<int64_t>(*b)) : std::get<double>(*b);
  double r = 0;
  switch (e.op) {
    case '+':
      r = x + y;
      break;
    case '-':
      r = x - y;
      break;
    case '*':
      r = x * y;
      break;
    case '/':
      if (y == 0) {
        diags_.error(e.loc, "division by zero in constant expression");
        return std::nullopt;
      }
      r = x / y;
      break;
    case '%':
      diags_.error(e.loc, "'%' needs integers");
      return std::nullopt;
  }
  if (!std::isfinite(r)) {
    diags_.error(e.loc, "constant expression is not finite");
    return std::nullopt;
  }
  return ConstValue{r};
}

void Builder::unknown_name(const Expr& e) {
  auto g = globals_.find(e.text);
  if (g != globals_.end() && g->second.kind != GlobalName::Kind::Const) {
    diags_.error(e.loc,
                 fmt::format("'{}' is a {}, not a value", e.text, kind_word(g->second.kind)));
    return;
  }
  if (g != globals_.end()) {
    diags_.error(e.loc, fmt::format("constant '{}' is used before its definition", e.text),
                 "move the const declaration above this use");
    return;
  }
  diags_.error(e.loc, fmt::format("unknown name '{}'", e.text),
               did_you_mean(e.text, const_names()));
}

std::optional<int64_t> Builder::eval_int(const Expr& e) {
  auto v = eval(e, /*allow_float=*/false);
  if (!v) return std::nullopt;
  if (auto* i = std::get_if<int64_t>(&*v)) return *i;
  diags_.error(e.loc, fmt::format("expected an integer, found {}", const_value_string(*v)));
  return std::nullopt;
}

std::optional<double> Builder::eval_number(const Expr& e) {
  auto v = eval(e, /*allow_float=*/true);
  if (!v) return std::nullopt;
  if (auto* i = std::get_if<int64_t>(&*v)) return double(*i);
  if (auto* d = std::get_if<double>(&*v)) return *d;
  diags_.error(e.loc, "expected a number, found a bool");
  return std::nullopt;
}

std::optional<bool> Builder::eval_bool(const Expr& e) {
  auto v = eval(e, /*allow_float=*/true);
  if (!v) return std::nullopt;
  if (auto* b = std::get_if<bool>(&*v)) return *b;
  diags_.error(e.loc, fmt::format("expected true or false, found {}", const_value_string(*v)));
  return std::nullopt;
}

std::optional<std::string> Builder::eval_word(const Expr& e, std::string_view what) {
  if (e.kind == Expr::Kind::Name) return e.text;
  diags_.error(e.loc, fmt::format("expected {} (a name)", what));
  return std::nullopt;
}

std::optional<Dim> Builder::eval_dim(const Expr& e, bool allow_minus_one) {
  if (e.kind == Expr::Kind::Name && failed_consts_.count(e.text)) return std::nullopt;
  if (e.kind == Expr::Kind::Name && !consts_.count(e.text)) {
    auto g = globals_.find(e.text);
    if (g != globals_.end()) {
      if (g->second.kind == GlobalName::Kind::Const) {
        diags_.error(e.loc, fmt::format("constant '{}' is used before its definition", e.text),
                     "move the const declaration above this use");
      } else {
        diags_.error(
            e.loc, fmt::format("'{}' is a {}, not a dimension", e.text, kind_word(g->second.kind)));
      }
      return std::nullopt;
    }
    const std::string near = closest_spelling(e.text, const_names());
    if (!near.empty() && warned_symbols_.insert(e.text).second) {
      diags_.warning(e.loc, fmt::format("'{}' is taken as a symbolic dimension", e.text),
                     fmt::format("did you mean the constant '{}'?", near));
    }
    return Dim::named(e.text);
  }
  // `tokens / tp`: a rank's share of a symbolic size (tensor-parallel sequences); the bound size
  // must divide, which the runtime checks before anything runs.
  if (e.kind == Expr::Kind::Binary && e.op == '/' && e.operands.size() == 2 && e.operands[0] &&
      e.operands[1] && e.operands[0]->kind == Expr::Kind::Name &&
      find_symbol(*e.operands[0]) == e.operands[0].get() && !find_symbol(*e.operands[1])) {
    auto divisor = eval_int(*e.operands[1]);
    if (!divisor) return std::nullopt;
    if (*divisor <= 0 || *divisor > (int64_t(1) << 20)) {
      diags_.error(
          e.operands[1]->loc,
          fmt::format("a symbolic dimension can be divided by 1 to 2^20, not {}", *divisor),
          "write `tokens / tp` for a rank's share of the tokens");
      return std::nullopt;
    }
    return Dim::named(e.operands[0]->text, *divisor);
  }
  if (const Expr* symbol = find_symbol(e)) {
    // A name near a constant is more likely a typo than a symbol used in arithmetic.
    if (!closest_spelling(symbol->text, const_names()).empty()) {
      unknown_name(*symbol);
    } else {
      diags_.error(
          symbol->loc,
          fmt::format("the symbolic dimension '{}' cannot be used in arithmetic", symbol->text),
          "write the symbol alone as a dimension, or divided by a constant (`tokens / tp`); it is "
          "bound at run time");
    }
    return std::nullopt;
  }
  auto v = eval_int(e);
  if (!v) return std::nullopt;
  if (*v == -1 && allow_minus_one) return Dim::known(-1);
  if (*v <= 0) {
    diags_.error(e.loc, fmt::format("dimension must be positive, got {}", *v));
    return std::nullopt;
  }
  if (*v > (int64_t(1) << 40)) {
    diags_.error(e.loc, fmt::format("dimension {} is larger than the limit 2^40", *v));
    return std::nullopt;
  }
  return Dim::known(*v);
}

const Expr* Builder::find_symbol(const Expr& e) const {
  if (e.kind == Expr::Kind::Name)
    return consts_.count(e.text) || globals_.count(e.text) ? nullptr : &e;
  for (const auto& o : e.operands)
    if (const Expr* found = o ? find_symbol(*o) : nullptr) return found;
  return nullptr;
}

std::optional<TensorType> Builder::eval_type(const dsl::TensorTypeExpr& t, bool quantized) {
  auto dtype = quantized ? std::optional<DType>(DType::BF16) : parse_user_dtype(t.dtype);
  bool ok = true;
  // The formats a quantized tensor's codes can have: FP8, and NVFP4's E2M1.
  const bool fp8 = t.dtype == "e4m3" || t.dtype == "e5m2" || t.dtype == "e2m1";
  if (quantized && !fp8) {
    diags_.error(t.loc,
                 fmt::format("a quantized tensor is declared in its FP8 format, not '{}'", t.dtype),
                 "write e4m3[...] quantized(...) (e2m1[...] under nvfp4_block_scaling)");
    ok = false;
  } else if (!dtype && fp8) {
    diags_.error(t.loc,
                 fmt::format("a quantized tensor ({}) in a signature must say its copies", t.dtype),
                 fmt::format("write {}[...] quantized(rowwise, columnwise)", t.dtype));
    ok = false;
  } else if (!dtype) {
    diags_.error(t.loc, fmt::format("unknown element type '{}'", t.dtype),
                 "sequence inputs and outputs are bf16, fp16 or fp32");
    ok = false;
  }
  TensorType out;
  out.dtype = dtype.value_or(DType::BF16);
  for (const auto& d : t.dims) {
    if (!d) return std::nullopt;
    auto dim = eval_dim(*d, /*allow_minus_one=*/false);
    if (!dim)
      ok = false;
    else
      out.shape.push_back(*dim);
  }
  if (out.shape.empty() && ok) {
    diags_.error(t.loc, "a tensor type needs at least one dimension");
    ok = false;
  }
  if (!ok) return std::nullopt;
  return out;
}

}  // namespace opfuse::ir::builder_detail
