#include "ir/builder.h"

#include <fmt/format.h>

#include "ir/builder_impl.h"
#include "support/spelling.h"

namespace opfuse::ir {
namespace builder_detail {

std::string const_value_string(const ConstValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return fmt::format("{}", *i);
  if (const auto* d = std::get_if<double>(&v)) return fmt::format("{}", *d);
  return std::get<bool>(v) ? "true" : "false";
}

const char* kind_word(GlobalName::Kind k) {
  switch (k) {
    case GlobalName::Kind::Const:
      return "constant";
    case GlobalName::Kind::Recipe:
      return "recipe";
    case GlobalName::Kind::Sequence:
      return "sequence";
    case GlobalName::Kind::Op:
      return "op";
    case GlobalName::Kind::Fusion:
      return "fusion";
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

std::optional<Program> Builder::run(const std::vector<const dsl::Module*>& modules) {
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
  // Op definitions after the constants (their defaults and bodies may name them).
  for (const dsl::Module* m : modules) {
    for (const dsl::Decl& d : m->decls) {
      if (diags_.at_error_limit()) return std::nullopt;
      if (const auto* o = std::get_if<dsl::OpDecl>(&d)) check_op(*o);
    }
  }
  // Fusions after the ops (their steps may name user-defined ops of any module).
  for (const dsl::Module* m : modules) {
    for (const dsl::Decl& d : m->decls) {
      if (diags_.at_error_limit()) return std::nullopt;
      if (const auto* f = std::get_if<dsl::FusionDecl>(&d)) define_fusion(*f);
    }
  }
  resolve_override();
  for (const dsl::Module* m : modules) {
    for (const dsl::Decl& d : m->decls) {
      if (diags_.at_error_limit()) return std::nullopt;
      if (const auto* s = std::get_if<dsl::SequenceDecl>(&d)) build_sequence(*s);
    }
  }
  check_quantized_pairs();
  if (diags_.has_errors()) return std::nullopt;
  return std::move(program_);
}

void Builder::declare(const dsl::Decl& d) {
  auto add = [&](const std::string& name, SourceLoc loc, GlobalName::Kind kind) {
    if (name.empty()) return;
    auto [it, inserted] = globals_.emplace(name, GlobalName{kind, loc});
    if (!inserted) {
      diags_.error(loc,
                   fmt::format("'{}' is already defined as a {}", name, kind_word(it->second.kind)),
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
  if (const auto* o = std::get_if<dsl::OpDecl>(&d)) declare_op(*o);
  if (const auto* f = std::get_if<dsl::FusionDecl>(&d))
    add(f->name, f->loc, GlobalName::Kind::Fusion);
}

std::vector<std::string> Builder::const_names() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : consts_) out.push_back(name);
  return out;
}

void Builder::define_const(const dsl::ConstDecl& c) {
  if (!c.value) return;
  if (auto v = eval(*c.value, /*allow_float=*/true)) {
    consts_[c.name] = *v;
  } else {
    failed_consts_.insert(c.name);  // its uses stay quiet: the definition's error says it all
  }
}

}  // namespace builder_detail

std::optional<Program> build_program(const std::vector<const dsl::Module*>& modules,
                                     DiagnosticEngine& diags, const BuildOptions& options) {
  builder_detail::Builder builder(diags, options);
  return builder.run(modules);
}

}  // namespace opfuse::ir
