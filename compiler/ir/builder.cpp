#include "ir/builder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <variant>

#include "plan/gemm_caps.h"
#include "support/assert.h"
#include "support/spelling.h"

namespace opfuse::ir {

namespace {

using dsl::Expr;

// A constant's value: integer, number or bool.
using ConstValue = std::variant<int64_t, double, bool>;

std::string const_value_string(const ConstValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return fmt::format("{}", *i);
  if (const auto* d = std::get_if<double>(&v)) return fmt::format("{}", *d);
  return std::get<bool>(v) ? "true" : "false";
}

// What a top-level name refers to, for messages like "'fp8' is a recipe".
struct GlobalName {
  enum class Kind { Const, Recipe, Sequence } kind;
  SourceLoc loc;
};

const char* kind_word(GlobalName::Kind k) {
  switch (k) {
    case GlobalName::Kind::Const:
      return "constant";
    case GlobalName::Kind::Recipe:
      return "recipe";
    case GlobalName::Kind::Sequence:
      return "sequence";
  }
  return "name";
}

std::string did_you_mean(std::string_view name, const std::vector<std::string>& candidates) {
  const std::string c = closest_spelling(name, candidates);
  return c.empty() ? std::string() : fmt::format("did you mean '{}'?", c);
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out;
}

class Builder {
 public:
  Builder(DiagnosticEngine& diags, const BuildOptions& options)
      : diags_(diags), options_(options) {}

  std::optional<Program> run(const std::vector<const dsl::Module*>& modules) {
    // Pass 1: register every top-level name so sequences can use recipes declared after them.
    for (const dsl::Module* m : modules)
      for (const dsl::Decl& d : m->decls) declare(d);
    // Pass 2: constants and recipes in order, then sequences.
    for (const dsl::Module* m : modules) {
      for (const dsl::Decl& d : m->decls) {
        if (diags_.at_error_limit()) return std::nullopt;
        if (const auto* c = std::get_if<dsl::ConstDecl>(&d)) define_const(*c);
        if (const auto* r = std::get_if<dsl::RecipeDecl>(&d)) define_recipe(*r);
      }
    }
    resolve_override();
    for (const dsl::Module* m : modules) {
      for (const dsl::Decl& d : m->decls) {
        if (diags_.at_error_limit()) return std::nullopt;
        if (const auto* s = std::get_if<dsl::SequenceDecl>(&d)) build_sequence(*s);
      }
    }
    if (diags_.has_errors()) return std::nullopt;
    return std::move(program_);
  }

 private:
  // ---- declarations --------------------------------------------------------------------------

  void declare(const dsl::Decl& d) {
    auto add = [&](const std::string& name, SourceLoc loc, GlobalName::Kind kind) {
      if (name.empty()) return;
      auto [it, inserted] = globals_.emplace(name, GlobalName{kind, loc});
      if (!inserted) {
        diags_.error(
            loc, fmt::format("'{}' is already defined as a {}", name, kind_word(it->second.kind)),
            "choose another name");
        diags_.note(it->second.loc, fmt::format("'{}' was defined here", name));
      }
    };
    if (const auto* c = std::get_if<dsl::ConstDecl>(&d))
      add(c->name, c->loc, GlobalName::Kind::Const);
    if (const auto* r = std::get_if<dsl::RecipeDecl>(&d))
      add(r->name, r->loc, GlobalName::Kind::Recipe);
    if (const auto* s = std::get_if<dsl::SequenceDecl>(&d))
      add(s->name, s->loc, GlobalName::Kind::Sequence);
  }

  std::vector<std::string> const_names() const {
    std::vector<std::string> out;
    for (const auto& [name, _] : consts_) out.push_back(name);
    return out;
  }

  void define_const(const dsl::ConstDecl& c) {
    if (!c.value) return;
    if (auto v = eval(*c.value, /*allow_float=*/true)) {
      consts_[c.name] = *v;
    } else {
      failed_consts_.insert(c.name);  // its uses stay quiet: the definition's error says it all
    }
  }

  // ---- constant expressions ---------------------------------------------------------------------

  // Evaluates a constant expression. Names must be constants. Reports and returns nullopt on error.
  std::optional<ConstValue> eval(const Expr& e, bool allow_float) {
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
        diags_.error(e.loc, "a list is not allowed here",
                     "lists are the shape argument of reshape");
        return std::nullopt;
      case Expr::Kind::Name: {
        if (failed_consts_.count(e.text)) return std::nullopt;
        auto it = consts_.find(e.text);
        if (it != consts_.end()) {
          if (!allow_float && std::holds_alternative<double>(it->second)) {
            diags_.error(
                e.loc, fmt::format("constant '{}' is the number {}, but an integer is needed here",
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
    }
    return std::nullopt;
  }

  std::optional<ConstValue> overflow(const Expr& e) {
    diags_.error(e.loc, "integer overflow in constant expression", "values must fit in 64 bits");
    return std::nullopt;
  }

  std::optional<ConstValue> eval_binary(const Expr& e, bool allow_float) {
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

  void unknown_name(const Expr& e) {
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

  std::optional<int64_t> eval_int(const Expr& e) {
    auto v = eval(e, /*allow_float=*/false);
    if (!v) return std::nullopt;
    if (auto* i = std::get_if<int64_t>(&*v)) return *i;
    diags_.error(e.loc, fmt::format("expected an integer, found {}", const_value_string(*v)));
    return std::nullopt;
  }

  std::optional<double> eval_number(const Expr& e) {
    auto v = eval(e, /*allow_float=*/true);
    if (!v) return std::nullopt;
    if (auto* i = std::get_if<int64_t>(&*v)) return double(*i);
    if (auto* d = std::get_if<double>(&*v)) return *d;
    diags_.error(e.loc, "expected a number, found a bool");
    return std::nullopt;
  }

  std::optional<bool> eval_bool(const Expr& e) {
    auto v = eval(e, /*allow_float=*/true);
    if (!v) return std::nullopt;
    if (auto* b = std::get_if<bool>(&*v)) return *b;
    diags_.error(e.loc, fmt::format("expected true or false, found {}", const_value_string(*v)));
    return std::nullopt;
  }

  // A plain identifier (enum words in recipes, I/O names in ops).
  std::optional<std::string> eval_word(const Expr& e, std::string_view what) {
    if (e.kind == Expr::Kind::Name) return e.text;
    diags_.error(e.loc, fmt::format("expected {} (a name)", what));
    return std::nullopt;
  }

  // One dimension of a signature type or reshape: a constant expression or a symbol.
  std::optional<Dim> eval_dim(const Expr& e, bool allow_minus_one) {
    if (e.kind == Expr::Kind::Name && failed_consts_.count(e.text)) return std::nullopt;
    if (e.kind == Expr::Kind::Name && !consts_.count(e.text)) {
      auto g = globals_.find(e.text);
      if (g != globals_.end()) {
        if (g->second.kind == GlobalName::Kind::Const) {
          diags_.error(e.loc, fmt::format("constant '{}' is used before its definition", e.text),
                       "move the const declaration above this use");
        } else {
          diags_.error(e.loc, fmt::format("'{}' is a {}, not a dimension", e.text,
                                          kind_word(g->second.kind)));
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
    if (const Expr* symbol = find_symbol(e)) {
      // A name near a constant is more likely a typo than a symbol used in arithmetic.
      if (!closest_spelling(symbol->text, const_names()).empty()) {
        unknown_name(*symbol);
      } else {
        diags_.error(
            symbol->loc,
            fmt::format("the symbolic dimension '{}' cannot be used in arithmetic", symbol->text),
            "write the symbol alone as a dimension; it is bound at run time");
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

  // The first name in `e` that is neither a constant nor another top-level name: a symbol.
  const Expr* find_symbol(const Expr& e) const {
    if (e.kind == Expr::Kind::Name)
      return consts_.count(e.text) || globals_.count(e.text) ? nullptr : &e;
    for (const auto& o : e.operands)
      if (const Expr* found = o ? find_symbol(*o) : nullptr) return found;
    return nullptr;
  }

  std::optional<TensorType> eval_type(const dsl::TensorTypeExpr& t) {
    auto dtype = parse_user_dtype(t.dtype);
    bool ok = true;
    if (!dtype) {
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

  // ---- recipes ----------------------------------------------------------------------------------

  struct ArgBinding {
    std::map<std::string, const dsl::Arg*> named;
  };

  void define_recipe(const dsl::RecipeDecl& d) {
    Recipe r;
    r.name = d.name;
    r.loc = d.loc;
    std::vector<std::string> allowed;
    if (d.kind == "delayed_scaling") {
      r.kind = RecipeKind::DelayedScaling;
      allowed = {"format", "amax_history", "amax_compute", "margin"};
    } else if (d.kind == "current_scaling") {
      r.kind = RecipeKind::CurrentScaling;
      allowed = {"format", "amax_epsilon", "power_of_2_scale"};
    } else if (d.kind == "bf16") {
      r.kind = RecipeKind::BF16;
    } else {
      std::string hint = did_you_mean(d.kind, {"delayed_scaling", "current_scaling", "bf16"});
      if (hint.empty()) hint = "use delayed_scaling(...), current_scaling(...) or bf16()";
      diags_.error(d.kind_loc, fmt::format("unknown recipe kind '{}'", d.kind), hint);
      return;
    }
    std::set<std::string> seen;
    bool ok = true;
    for (const dsl::Arg& a : d.args) {
      if (!a.value) {
        ok = false;
        continue;
      }
      if (!a.name) {
        diags_.error(a.value->loc,
                     fmt::format("recipe parameters are named, e.g. {}(format = hybrid)", d.kind),
                     allowed.empty() ? std::string("bf16() takes no parameters")
                                     : "parameters: " + join(allowed));
        ok = false;
        continue;
      }
      const std::string& name = *a.name;
      if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
        std::string hint = allowed.empty() ? std::string("bf16() takes no parameters")
                                           : "parameters of " + d.kind + ": " + join(allowed);
        if (auto near = did_you_mean(name, allowed); !near.empty()) hint = near;
        diags_.error(a.name_loc, fmt::format("{} has no parameter '{}'", d.kind, name), hint);
        ok = false;
        continue;
      }
      if (!seen.insert(name).second) {
        diags_.error(a.name_loc, fmt::format("parameter '{}' is given twice", name));
        ok = false;
        continue;
      }
      ok &= set_recipe_param(r, name, *a.value);
    }
    if (ok) program_.recipes.push_back(r);
    recipes_[d.name] = ok ? std::optional<Recipe>(r) : std::nullopt;
  }

  bool set_recipe_param(Recipe& r, const std::string& name, const Expr& v) {
    auto range_int = [&](int64_t lo, int64_t hi) -> std::optional<int64_t> {
      auto x = eval_int(v);
      if (!x) return std::nullopt;
      if (*x < lo || *x > hi) {
        diags_.error(v.loc, fmt::format("{} = {} is out of range", name, *x),
                     fmt::format("{} must be between {} and {}", name, lo, hi));
        return std::nullopt;
      }
      return x;
    };
    if (name == "format") {
      auto w = eval_word(v, "hybrid or e4m3");
      if (!w) return false;
      if (*w == "hybrid")
        r.format = Fp8Format::Hybrid;
      else if (*w == "e4m3")
        r.format = Fp8Format::E4M3;
      else {
        diags_.error(v.loc, fmt::format("unknown FP8 format '{}'", *w),
                     *w == "e5m2"
                         ? "E5M2 alone is not a recipe format (TE has HYBRID: E4M3 forward, "
                           "E5M2 gradients); use hybrid"
                         : "use hybrid or e4m3");
        return false;
      }
      return true;
    }
    if (name == "amax_history") {
      auto x = range_int(1, 1 << 16);
      if (x) r.amax_history = int(*x);
      return x.has_value();
    }
    if (name == "margin") {
      auto x = range_int(0, 32);
      if (x) r.margin = int(*x);
      return x.has_value();
    }
    if (name == "amax_compute") {
      auto w = eval_word(v, "max or most_recent");
      if (!w) return false;
      if (*w == "max")
        r.amax_compute = AmaxCompute::Max;
      else if (*w == "most_recent")
        r.amax_compute = AmaxCompute::MostRecent;
      else {
        diags_.error(v.loc, fmt::format("unknown amax_compute '{}'", *w), "use max or most_recent");
        return false;
      }
      return true;
    }
    if (name == "amax_epsilon") {
      auto x = eval_number(v);
      if (!x) return false;
      if (!(*x >= 0.0 && *x <= 1.0)) {
        diags_.error(v.loc, fmt::format("amax_epsilon = {} is out of range", *x),
                     "amax_epsilon must be between 0 and 1");
        return false;
      }
      r.amax_epsilon = *x;
      return true;
    }
    if (name == "power_of_2_scale") {
      auto b = eval_bool(v);
      if (b) r.power_of_2_scale = *b;
      return b.has_value();
    }
    OPFUSE_ASSERT(false, "unhandled recipe parameter {}", name);
    return false;
  }

  // Recipe names a sequence can use: the declared ones and the built-in bf16 (unless redeclared).
  std::vector<std::string> recipe_names() const {
    std::vector<std::string> names;
    if (!recipes_.count("bf16")) names.push_back("bf16");
    for (const auto& [n, _] : recipes_) names.push_back(n);
    return names;
  }

  // Looks up a recipe by name; nullopt (with an error unless already reported) when unusable.
  std::optional<Recipe> resolve_recipe(const std::string& name, SourceLoc loc) {
    auto it = recipes_.find(name);
    if (it != recipes_.end()) return it->second;  // nullopt: its declaration had errors, reported
    if (name == "bf16") return Recipe{};
    auto g = globals_.find(name);
    if (g != globals_.end()) {
      diags_.error(loc, fmt::format("'{}' is a {}, not a recipe", name, kind_word(g->second.kind)));
      return std::nullopt;
    }
    std::string hint = did_you_mean(name, recipe_names());
    if (hint.empty()) hint = "recipes: " + join(recipe_names());
    diags_.error(loc, fmt::format("unknown recipe '{}'", name), hint);
    return std::nullopt;
  }

  void resolve_override() {
    if (options_.recipe_override.empty()) return;
    auto it = recipes_.find(options_.recipe_override);
    if (it == recipes_.end() && options_.recipe_override != "bf16") {
      diags_.error(
          SourceLoc{},
          fmt::format("--recipe '{}' is not a recipe of this program", options_.recipe_override),
          "recipes: " + join(recipe_names()));
      return;
    }
    override_ = it == recipes_.end() ? std::optional<Recipe>(Recipe{}) : it->second;
  }

  // ---- sequences --------------------------------------------------------------------------------

  struct SequenceScope {
    Sequence seq;
    std::map<std::string, ValueId> extra_inputs;   // name -> value
    std::map<std::string, size_t> extra_outputs;   // name -> index in seq.outputs
    std::map<std::string, SourceLoc> used_inputs;  // extra inputs added, where
    std::map<std::string, SourceLoc> made_outputs;
    std::map<std::string, const dsl::Param*> params_by_name;
  };

  ValueId add_value(Sequence& s, ValueKind kind, TensorType type, std::string name,
                    int32_t producer) {
    const ValueId id = static_cast<ValueId>(s.values.size());
    s.values.push_back(Value{id, kind, std::move(type), std::move(name), producer});
    return id;
  }

  void build_sequence(const dsl::SequenceDecl& d) {
    SequenceScope sc;
    Sequence& s = sc.seq;
    s.name = d.name;
    s.loc = d.loc;
    bool ok = true;

    if (d.inputs.empty()) {
      diags_.error(d.loc, fmt::format("sequence '{}' has no inputs", d.name),
                   "the first input is the tensor the ops transform");
      return;
    }
    if (d.outputs.empty()) {
      diags_.error(d.loc, fmt::format("sequence '{}' has no outputs", d.name),
                   "the first output is the result of the last op");
      return;
    }
    std::map<std::string, SourceLoc> io_names;
    auto check_io_name = [&](const dsl::Param& p) {
      auto [it, inserted] = io_names.emplace(p.name, p.loc);
      if (!inserted) {
        diags_.error(
            p.loc,
            fmt::format("'{}' is already an input or output of sequence '{}'", p.name, d.name),
            "inputs and outputs share one namespace; rename one");
        ok = false;
      }
      return inserted;
    };
    for (size_t i = 0; i < d.inputs.size(); ++i) {
      const dsl::Param& p = d.inputs[i];
      if (!check_io_name(p)) continue;
      auto t = eval_type(p.type);
      if (!t) {
        ok = false;
        continue;
      }
      const ValueId v = add_value(s, ValueKind::Input, *t, p.name, -1);
      s.inputs.push_back(v);
      if (i > 0) sc.extra_inputs[p.name] = v;
      sc.params_by_name[p.name] = &p;
    }
    std::vector<std::optional<TensorType>> output_types;
    for (size_t i = 0; i < d.outputs.size(); ++i) {
      const dsl::Param& p = d.outputs[i];
      if (!check_io_name(p)) {
        output_types.push_back(std::nullopt);
        continue;
      }
      auto t = eval_type(p.type);
      if (!t) ok = false;
      output_types.push_back(t);
      s.outputs.push_back(SequenceOutput{p.name, 0, p.loc});
      if (i > 0) sc.extra_outputs[p.name] = s.outputs.size() - 1;
      sc.params_by_name[p.name] = &p;
    }
    if (!ok || s.inputs.size() != d.inputs.size()) return;

    // Recipe: the sequence's own `uses` is checked even when --recipe overrides it.
    std::optional<Recipe> own =
        Recipe{};  // no `uses`: no quantization, like TE outside fp8_autocast
    if (d.recipe) {
      own = resolve_recipe(*d.recipe, d.recipe_loc);
      if (!own) return;
    }
    s.recipe = override_ ? *override_ : *own;
    for (const dsl::SequenceFlag& f : d.flags) {
      if (f.name == "fp8_weights") {
        if (s.fp8_weights) diags_.warning(f.loc, "fp8_weights is given twice");
        s.fp8_weights = true;
        if (!s.recipe.is_fp8()) {
          diags_.warning(
              f.loc,
              fmt::format("fp8_weights has no effect: sequence '{}' uses the bf16 recipe", d.name),
              "add 'uses <an FP8 recipe>' to the sequence");
          s.fp8_weights = false;
        }
      } else {
        diags_.error(f.loc, fmt::format("unknown sequence option '{}'", f.name),
                     did_you_mean(f.name, {"fp8_weights"}).empty()
                         ? "the only option is fp8_weights"
                         : "did you mean 'fp8_weights'?");
        ok = false;
      }
    }

    // Instance names: user names first, then defaults that avoid them.
    std::map<std::string, SourceLoc> instances;
    for (const dsl::OpStmt& op : d.body) {
      if (!op.instance) continue;
      auto [it, inserted] = instances.emplace(*op.instance, op.instance_loc);
      if (!inserted) {
        diags_.error(
            op.instance_loc,
            fmt::format("layer name '{}' is already used in sequence '{}'", *op.instance, d.name),
            "layer names select layers in configs and checkpoints; make each unique");
        diags_.note(it->second, "first used here");
        ok = false;
      }
    }
    std::map<std::string, int> kind_counters;

    ValueId cur = s.inputs[0];
    for (const dsl::OpStmt& stmt : d.body) {
      if (diags_.at_error_limit()) return;
      const OpInfo* info = find_op(stmt.op);
      if (!info) {
        const std::string near = suggest_op(stmt.op);
        diags_.error(stmt.loc, fmt::format("unknown op '{}'", stmt.op),
                     near.empty() ? "see docs/language.md for the list of ops"
                                  : fmt::format("did you mean '{}'?", near));
        ok = false;
        break;  // the shapes after an unknown op are unknowable
      }
      std::string instance;
      if (stmt.instance) {
        instance = *stmt.instance;
      } else {
        do {
          instance = fmt::format("{}_{}", info->name, kind_counters[std::string(info->name)]++);
        } while (instances.count(instance));
        instances.emplace(instance, stmt.loc);
      }
      auto next = build_op(sc, stmt, *info, cur, instance, output_types);
      if (!next) {
        ok = false;
        break;  // later shapes depend on this one
      }
      cur = *next;
    }
    if (!ok) return;

    // Main output.
    const Value& last = s.value(cur);
    if (output_types[0] && !(last.type == *output_types[0])) {
      diags_.error(
          d.outputs[0].loc,
          fmt::format("sequence '{}' ends with {}, but its output '{}' is declared {}", d.name,
                      type_string(last.type), d.outputs[0].name, type_string(*output_types[0])),
          "change the declared output or the last op");
      ok = false;
    }
    s.outputs[0].value = cur;
    for (const auto& [name, index] : sc.extra_outputs) {
      if (!sc.made_outputs.count(name)) {
        diags_.error(
            s.outputs[index].loc, fmt::format("output '{}' is never produced", name),
            fmt::format("add make_extra_output({}) where the tensor should be exposed", name));
        ok = false;
      }
    }
    for (const auto& [name, v] : sc.extra_inputs) {
      if (!sc.used_inputs.count(name)) {
        diags_.warning(sc.params_by_name[name]->loc,
                       fmt::format("extra input '{}' of sequence '{}' is never used", name, d.name),
                       fmt::format("add add_extra_input({}) or remove the input", name));
      }
    }
    for (size_t i = 1; i < s.outputs.size(); ++i) {
      if (s.outputs[i].value == cur) {
        diags_.warning(s.outputs[i].loc,
                       fmt::format("extra output '{}' is the same tensor as the main output '{}'",
                                   s.outputs[i].name, s.outputs[0].name),
                       "move make_extra_output before the op whose input it should expose");
      }
    }
    if (ok) program_.sequences.push_back(std::move(s));
  }

  // Binds the call's arguments to the op's attributes (positional in order, then named).
  std::optional<AttrList> bind_attrs(const dsl::OpStmt& stmt, const OpInfo& info) {
    std::vector<const dsl::Arg*> bound(info.attrs.size(), nullptr);
    bool ok = true;
    size_t positional = 0;
    bool seen_named = false;
    for (const dsl::Arg& a : stmt.args) {
      if (!a.value) {
        ok = false;
        continue;
      }
      if (!a.name) {
        if (seen_named) {
          diags_.error(a.value->loc, "a positional argument cannot follow a named one",
                       "write positional arguments first");
          ok = false;
          continue;
        }
        if (positional >= info.attrs.size()) {
          diags_.error(a.value->loc,
                       fmt::format("'{}' takes {} argument{}, got more", info.name,
                                   info.attrs.size(), info.attrs.size() == 1 ? "" : "s"),
                       usage(info));
          ok = false;
          continue;
        }
        bound[positional++] = &a;
        continue;
      }
      seen_named = true;
      size_t index = info.attrs.size();
      for (size_t i = 0; i < info.attrs.size(); ++i)
        if (info.attrs[i].name == *a.name) index = i;
      if (index == info.attrs.size()) {
        std::vector<std::string> names;
        for (const AttrSpec& s : info.attrs) names.emplace_back(s.name);
        std::string hint = did_you_mean(*a.name, names);
        if (hint.empty()) hint = usage(info);
        diags_.error(a.name_loc, fmt::format("'{}' has no argument '{}'", info.name, *a.name),
                     hint);
        ok = false;
        continue;
      }
      if (bound[index]) {
        diags_.error(a.name_loc,
                     fmt::format("argument '{}' of '{}' is given twice", *a.name, info.name));
        ok = false;
        continue;
      }
      bound[index] = &a;
    }
    if (!ok) return std::nullopt;
    AttrList attrs;
    for (size_t i = 0; i < info.attrs.size(); ++i) {
      const AttrSpec& spec = info.attrs[i];
      if (!bound[i]) {
        if (spec.required) {
          diags_.error(
              stmt.loc,
              fmt::format("'{}' needs the argument '{}' ({})", info.name, spec.name, spec.doc),
              usage(info));
          ok = false;
          continue;
        }
        attrs.push_back(default_attr(spec));
        continue;
      }
      auto v = eval_attr(spec, *bound[i]->value);
      if (!v) {
        ok = false;
        continue;
      }
      attrs.push_back(Attr{std::string(spec.name), std::move(*v)});
    }
    if (!ok) return std::nullopt;
    return attrs;
  }

  static Attr default_attr(const AttrSpec& spec) {
    switch (spec.type) {
      case AttrType::Int:
        return {std::string(spec.name), int64_t(spec.default_value)};
      case AttrType::Float:
        return {std::string(spec.name), spec.default_value};
      case AttrType::Bool:
        return {std::string(spec.name), spec.default_value != 0};
      case AttrType::Name:
        return {std::string(spec.name), std::string()};
      case AttrType::Shape:
        return {std::string(spec.name), Shape{}};
    }
    return {std::string(spec.name), int64_t(0)};
  }

  static std::string usage(const OpInfo& info) {
    std::string out = fmt::format("usage: {}(", info.name);
    for (size_t i = 0; i < info.attrs.size(); ++i) {
      const AttrSpec& s = info.attrs[i];
      out += i ? ", " : "";
      out += std::string(s.name);
      if (!s.required) out += " = " + attr_value_string(default_attr(s).value);
    }
    return out + ")";
  }

  std::optional<AttrValue> eval_attr(const AttrSpec& spec, const Expr& e) {
    switch (spec.type) {
      case AttrType::Int: {
        auto v = eval_int(e);
        if (!v) return std::nullopt;
        if (double(*v) < spec.min || double(*v) > spec.max) {
          diags_.error(e.loc, fmt::format("{} = {} is out of range", spec.name, *v),
                       fmt::format("{} must be between {} and {}", spec.name, int64_t(spec.min),
                                   int64_t(spec.max)));
          return std::nullopt;
        }
        return AttrValue{*v};
      }
      case AttrType::Float: {
        auto v = eval_number(e);
        if (!v) return std::nullopt;
        if (*v < spec.min || *v > spec.max) {
          diags_.error(e.loc, fmt::format("{} = {} is out of range", spec.name, *v),
                       fmt::format("{} must be between {} and {}", spec.name, spec.min, spec.max));
          return std::nullopt;
        }
        return AttrValue{*v};
      }
      case AttrType::Bool: {
        auto v = eval_bool(e);
        if (!v) return std::nullopt;
        return AttrValue{*v};
      }
      case AttrType::Name: {
        auto w = eval_word(e, "the name of a sequence input or output");
        if (!w) return std::nullopt;
        return AttrValue{*w};
      }
      case AttrType::Shape: {
        if (e.kind != Expr::Kind::List) {
          diags_.error(e.loc, "expected a shape like [tokens, -1, 64]");
          return std::nullopt;
        }
        Shape shape;
        for (const auto& d : e.operands) {
          if (!d) return std::nullopt;
          auto dim = eval_dim(*d, /*allow_minus_one=*/true);
          if (!dim) return std::nullopt;
          shape.push_back(*dim);
        }
        if (shape.empty()) {
          diags_.error(e.loc, "a shape needs at least one dimension");
          return std::nullopt;
        }
        return AttrValue{shape};
      }
    }
    return std::nullopt;
  }

  SourceLoc attr_loc(const dsl::OpStmt& stmt, const OpInfo& info, const std::string& attr) {
    if (attr.empty()) return stmt.loc;
    size_t positional = 0;
    for (const dsl::Arg& a : stmt.args) {
      if (!a.value) continue;
      if (a.name) {
        if (*a.name == attr) return a.value->loc;
      } else if (positional < info.attrs.size() && info.attrs[positional++].name == attr) {
        return a.value->loc;
      }
    }
    return stmt.loc;
  }

  std::optional<ValueId> build_op(SequenceScope& sc, const dsl::OpStmt& stmt, const OpInfo& info,
                                  ValueId cur, const std::string& instance,
                                  const std::vector<std::optional<TensorType>>& output_types) {
    Sequence& s = sc.seq;
    auto attrs = bind_attrs(stmt, info);
    if (!attrs) return std::nullopt;

    const TensorType in_type = s.value(cur).type;
    const TensorType* extra = nullptr;
    std::optional<ValueId> extra_value;
    if (info.kind == OpKind::AddExtraInput || info.kind == OpKind::MakeExtraOutput) {
      const std::string& name = attr_name(*attrs, "name");
      const SourceLoc loc = attr_loc(stmt, info, "name");
      if (info.kind == OpKind::AddExtraInput) {
        auto it = sc.extra_inputs.find(name);
        if (it == sc.extra_inputs.end()) {
          unknown_io(sc, name, loc, /*want_input=*/true);
          return std::nullopt;
        }
        if (auto used = sc.used_inputs.find(name); used != sc.used_inputs.end()) {
          diags_.error(
              loc, fmt::format("extra input '{}' is already added", name),
              "each extra input is added once; declare a second input for a second residual");
          diags_.note(used->second, "added here");
          return std::nullopt;
        }
        sc.used_inputs[name] = loc;
        extra_value = it->second;
        extra = &s.value(it->second).type;
      } else {
        auto it = sc.extra_outputs.find(name);
        if (it == sc.extra_outputs.end()) {
          unknown_io(sc, name, loc, /*want_input=*/false);
          return std::nullopt;
        }
        if (auto made = sc.made_outputs.find(name); made != sc.made_outputs.end()) {
          diags_.error(loc, fmt::format("extra output '{}' is already made", name));
          diags_.note(made->second, "made here");
          return std::nullopt;
        }
        sc.made_outputs[name] = loc;
        // outputs[i] (i > 0) maps to output_types[i]: both follow the signature order.
        if (const auto& t = output_types.at(it->second)) extra = &*t;
      }
    }

    ShapeResult shape = info.shape_rule(ShapeInput{in_type, *attrs, extra});
    if (!shape.errors.empty()) {
      for (const ShapeError& e : shape.errors)
        diags_.error(attr_loc(stmt, info, e.attr), e.message, e.hint);
      return std::nullopt;
    }
    if (info.kind == OpKind::Linear && s.recipe.is_fp8()) {
      // The strictest FP8 rule of the architectures the compiler targets (plan/gemm_caps.h).
      const int64_t multiple = plan::gemm_dim_multiple(plan::gemm_caps(plan::kDefaultArch), true);
      for (const char* a : {"in", "out"}) {
        const int64_t n = attr_int(*attrs, a);
        if (n % multiple != 0) {
          diags_.error(
              attr_loc(stmt, info, a),
              fmt::format("{} = {} is not a multiple of {}, which FP8 GEMMs need "
                          "(cuBLASLt)",
                          a, n, multiple),
              fmt::format("pad the features to {} or use the bf16 recipe for this sequence",
                          (n + multiple - 1) / multiple * multiple));
          return std::nullopt;
        }
      }
    }

    const int32_t op_index = static_cast<int32_t>(s.ops.size());
    Operation op;
    op.kind = info.kind;
    op.attrs = std::move(*attrs);
    op.instance = instance;
    op.loc = stmt.loc;
    op.operands.push_back(cur);
    for (const ParamDecl& p : shape.params) {
      const ValueId v = add_value(s, ValueKind::Param, p.type, instance + "." + p.role, -1);
      s.values[v].init = p.init;
      s.params.push_back(v);
      op.operands.push_back(v);
    }
    if (extra_value) op.operands.push_back(*extra_value);
    const ValueId result = add_value(s, ValueKind::Result, shape.out, "", op_index);
    op.results.push_back(result);
    if (info.kind == OpKind::MakeExtraOutput) {
      // The extra output aliases the op's result (MakeExtraOutput copies nothing).
      s.outputs[sc.extra_outputs[attr_name(op.attrs, "name")]].value = result;
    }
    s.ops.push_back(std::move(op));
    return result;
  }

  void unknown_io(const SequenceScope& sc, const std::string& name, SourceLoc loc,
                  bool want_input) {
    const Sequence& s = sc.seq;
    if (want_input) {
      if (sc.extra_outputs.count(name)) {
        diags_.error(
            loc, fmt::format("'{}' is an output of sequence '{}'; add_extra_input needs an input",
                             name, s.name));
      } else if (!s.inputs.empty() && s.value(s.inputs[0]).name == name) {
        diags_.error(loc,
                     fmt::format("'{}' is the main input of sequence '{}', not an extra input",
                                 name, s.name),
                     "declare the residual as a second input");
      } else {
        std::vector<std::string> names;
        for (const auto& [n, _] : sc.extra_inputs) names.push_back(n);
        std::string hint = did_you_mean(name, names);
        if (hint.empty())
          hint = fmt::format("declare it as an extra input: sequence {}(..., {}: <type>)", s.name,
                             name);
        diags_.error(loc, fmt::format("unknown extra input '{}' in sequence '{}'", name, s.name),
                     hint);
      }
    } else {
      if (sc.extra_inputs.count(name)) {
        diags_.error(
            loc, fmt::format("'{}' is an input of sequence '{}'; make_extra_output needs an output",
                             name, s.name));
      } else if (!s.outputs.empty() && s.outputs[0].name == name) {
        diags_.error(loc,
                     fmt::format("'{}' is the main output of sequence '{}', not an extra output",
                                 name, s.name),
                     "the main output is the result of the last op; declare a second output");
      } else {
        std::vector<std::string> names;
        for (const auto& [n, _] : sc.extra_outputs) names.push_back(n);
        std::string hint = did_you_mean(name, names);
        if (hint.empty())
          hint = fmt::format("declare it as an extra output: -> (..., {}: <type>)", name);
        diags_.error(loc, fmt::format("unknown extra output '{}' in sequence '{}'", name, s.name),
                     hint);
      }
    }
  }

  DiagnosticEngine& diags_;
  const BuildOptions& options_;
  Program program_;
  std::map<std::string, GlobalName> globals_;
  std::map<std::string, ConstValue> consts_;
  std::set<std::string> failed_consts_;
  std::set<std::string> warned_symbols_;
  std::map<std::string, std::optional<Recipe>> recipes_;
  std::optional<Recipe> override_;
};

}  // namespace

std::optional<Program> build_program(const std::vector<const dsl::Module*>& modules,
                                     DiagnosticEngine& diags, const BuildOptions& options) {
  Builder builder(diags, options);
  return builder.run(modules);
}

}  // namespace opfuse::ir
