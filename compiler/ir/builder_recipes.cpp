// The IR builder's recipes: definitions, parameters, lookup and the --recipe override (the
// Builder class is in builder_impl.h).

#include <fmt/format.h>

#include <algorithm>

#include "ir/builder_impl.h"
#include "support/assert.h"

namespace opfuse::ir::builder_detail {

void Builder::define_recipe(const dsl::RecipeDecl& d) {
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
  } else if (d.kind == "float8_block_scaling") {
    r.kind = RecipeKind::Float8BlockScaling;
    r.format = Fp8Format::E4M3;  // TE's Float8BlockScaling default
    r.power_of_2_scale = true;
    allowed = {"format", "x_block", "w_block", "grad_block", "power_of_2_scale", "amax_epsilon"};
  } else if (d.kind == "mxfp8_block_scaling") {
    r.kind = RecipeKind::Mxfp8BlockScaling;
    r.format = Fp8Format::E4M3;  // TE's MXFP8BlockScaling default
    allowed = {"format"};
  } else if (d.kind == "nvfp4_block_scaling") {
    r.kind = RecipeKind::Nvfp4BlockScaling;
    allowed = {"rht", "stochastic_rounding", "w_2d", "seed"};
  } else if (d.kind == "bf16") {
    r.kind = RecipeKind::BF16;
  } else {
    std::string hint =
        did_you_mean(d.kind, {"delayed_scaling", "current_scaling", "float8_block_scaling",
                              "mxfp8_block_scaling", "nvfp4_block_scaling", "bf16"});
    if (hint.empty())
      hint =
          "use delayed_scaling(...), current_scaling(...), float8_block_scaling(...), "
          "mxfp8_block_scaling(...), nvfp4_block_scaling(...) or bf16()";
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
  if (ok && r.kind == RecipeKind::Float8BlockScaling) ok = check_block_dims(r, d);
  if (ok) program_.recipes.push_back(r);
  recipes_[d.name] = ok ? std::optional<Recipe>(r) : std::nullopt;
}

bool Builder::set_recipe_param(Recipe& r, const std::string& name, const Expr& v) {
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
                   *w == "e5m2" ? "E5M2 alone is not a recipe format (TE has HYBRID: E4M3 forward, "
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
  if (name == "x_block" || name == "w_block" || name == "grad_block") {
    auto x = range_int(1, 2);
    if (x) (name == "x_block" ? r.x_block : name == "w_block" ? r.w_block : r.grad_block) = int(*x);
    return x.has_value();
  }
  if (name == "power_of_2_scale" || name == "rht" || name == "stochastic_rounding" ||
      name == "w_2d") {
    auto b = eval_bool(v);
    if (b) {
      (name == "power_of_2_scale" ? r.power_of_2_scale
       : name == "rht"            ? r.rht
       : name == "w_2d"           ? r.w_2d
                                  : r.stochastic_rounding) = *b;
    }
    return b.has_value();
  }
  if (name == "seed") {
    auto x = range_int(0, int64_t(UINT32_MAX));
    if (x) r.seed = uint32_t(*x);
    return x.has_value();
  }
  OPFUSE_ASSERT(false, "unhandled recipe parameter {}", name);
  return false;
}

// cuBLASLt's block-scaled GEMMs take a 1-D and a 2-D operand or two 1-D ones, never two 2-D
// ones (docs/architecture.md, "GEMM capabilities"): fprop reads x and w, dgrad the gradient and w,
// wgrad the gradient and x.
bool Builder::check_block_dims(const Recipe& r, const dsl::RecipeDecl& d) {
  auto where = [&](const char* a, const char* b) {
    SourceLoc loc = d.kind_loc;
    for (const dsl::Arg& arg : d.args)
      if (arg.name && (*arg.name == a || *arg.name == b)) loc = arg.name_loc;  // the later one
    return loc;
  };
  struct Pair {
    const char* a;
    int a_dim;
    const char* b;
    int b_dim;
    const char* gemm;
  };
  for (const Pair& p : {Pair{"x_block", r.x_block, "w_block", r.w_block, "fprop"},
                        Pair{"grad_block", r.grad_block, "w_block", r.w_block, "dgrad"},
                        Pair{"x_block", r.x_block, "grad_block", r.grad_block, "wgrad"}}) {
    if (p.a_dim == 2 && p.b_dim == 2) {
      diags_.error(where(p.a, p.b),
                   fmt::format("{} = 2 with {} = 2 makes the {} GEMM 2-D x 2-D block-scaled, "
                               "which cuBLASLt cannot run",
                               p.a, p.b, p.gemm),
                   fmt::format("give one of {} and {} 1 (1 x 128 blocks)", p.a, p.b));
      return false;
    }
  }
  return true;
}

std::vector<std::string> Builder::recipe_names() const {
  std::vector<std::string> names;
  if (!recipes_.count("bf16")) names.push_back("bf16");
  for (const auto& [n, _] : recipes_) names.push_back(n);
  return names;
}

std::optional<Recipe> Builder::resolve_recipe(const std::string& name, SourceLoc loc) {
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

void Builder::resolve_override() {
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

}  // namespace opfuse::ir::builder_detail
