// dump_ast (declared in dsl/ast.h): one node per line, two spaces per level, `@line:col` last,
// expressions in prefix form. Golden tests compare it, so it prints nothing that varies between
// runs (no pointers, no file ids).
#include <fmt/format.h>

#include <string>
#include <variant>

#include "dsl/ast.h"

namespace opfuse::dsl {

namespace {

std::string at(SourceLoc loc) { return fmt::format("@{}:{}", loc.line, loc.col); }

// A string payload as a quoted literal that reads back to the same bytes.
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += fmt::format("\\x{:02X}", c);
        } else {
          out.push_back(ch);
        }
    }
  }
  return out + "\"";
}

std::string expr_text(const Expr* expr) {
  if (expr == nullptr) return "<missing>";
  switch (expr->kind) {
    case Expr::Kind::Int:
      return expr->text.empty() ? fmt::format("{}", expr->int_value) : expr->text;
    case Expr::Kind::Float:
      return expr->text.empty() ? fmt::format("{}", expr->float_value) : expr->text;
    case Expr::Kind::Bool:
      return expr->int_value != 0 ? "true" : "false";
    case Expr::Kind::String:
      return quoted(expr->text);
    case Expr::Kind::Name:
      return expr->text;
    case Expr::Kind::Unary:
    case Expr::Kind::Binary: {
      std::string out = fmt::format("({}", expr->op);
      for (const ExprPtr& operand : expr->operands) out += " " + expr_text(operand.get());
      return out + ")";
    }
    case Expr::Kind::Compare:
      return fmt::format("({} {} {})", expr->text, expr_text(expr->operands.at(0).get()),
                         expr_text(expr->operands.at(1).get()));
    case Expr::Kind::Call: {
      std::string out = expr->text + "(";
      for (size_t i = 0; i < expr->operands.size(); ++i) {
        if (i > 0) out += ", ";
        if (i < expr->arg_names.size() && !expr->arg_names[i].empty())
          out += expr->arg_names[i] + " = ";
        out += expr_text(expr->operands[i].get());
      }
      return out + ")";
    }
    case Expr::Kind::List: {
      std::string out = "[";
      for (size_t i = 0; i < expr->operands.size(); ++i) {
        if (i > 0) out += ", ";
        out += expr_text(expr->operands[i].get());
      }
      return out + "]";
    }
  }
  return "<unknown>";
}

std::string type_text(const TensorTypeExpr& type) {
  std::string out = type.dtype + "[";
  for (size_t i = 0; i < type.dims.size(); ++i) {
    if (i > 0) out += ", ";
    out += expr_text(type.dims[i].get());
  }
  return out + "]";
}

class Dumper {
 public:
  std::string take() { return std::move(out_); }

  void operator()(const ImportDecl& decl) {
    line(0, "import {} {}", quoted(decl.path), at(decl.loc));
  }

  void operator()(const ConstDecl& decl) {
    line(0, "const {} = {} {}", decl.name, expr_text(decl.value.get()), at(decl.loc));
  }

  void operator()(const RecipeDecl& decl) {
    line(0, "recipe {} = {} {}", decl.name, decl.kind, at(decl.loc));
    args(1, decl.args);
  }

  void operator()(const SequenceDecl& decl) {
    line(0, "sequence {} {}", decl.name, at(decl.loc));
    for (const Param& param : decl.inputs) params(1, "input", param);
    for (const Param& param : decl.outputs) params(1, "output", param);
    if (decl.recipe) line(1, "uses {} {}", *decl.recipe, at(decl.recipe_loc));
    for (const SequenceFlag& flag : decl.flags) {
      line(1, "with {} {}", flag.name, at(flag.loc));
      args(2, flag.args);
    }
    for (const OpStmt& op : decl.body) {
      if (op.instance) {
        line(1, "op {} {} as {}", op.op, at(op.loc), *op.instance);
      } else {
        line(1, "op {} {}", op.op, at(op.loc));
      }
      args(2, op.args);
    }
    if (decl.close_loc.valid()) line(1, "end {}", at(decl.close_loc));
  }

  void operator()(const FusionDecl& decl) {
    line(0, "fusion {} {}", decl.name, at(decl.loc));
    args(1, decl.args);
    for (const FusionStep& step : decl.steps)
      line(1, "step {}{} {}", step.op, step.optional ? "?" : "", at(step.loc));
    if (decl.close_loc.valid()) line(1, "end {}", at(decl.close_loc));
  }

  void operator()(const OpDecl& decl) {
    line(0, "{}op {} {}", decl.gated ? "gated " : "", decl.name, at(decl.loc));
    op_params(1, decl.params);
    if (decl.has_learned) line(1, "params {}", at(decl.learned_loc));
    for (const OpLearnedParam& p : decl.learned)
      line(2, "param {}: {} = {} {}", p.name, type_text(p.type), expr_text(p.init.get()),
           at(p.loc));
    line(1, "= {}", expr_text(decl.body.get()));
    if (!decl.has_backward) return;
    line(1, "backward {}", at(decl.backward_loc));
    op_params(2, decl.backward_params);
    line(2, "= {}", expr_text(decl.backward.get()));
  }

 private:
  template <typename... Args>
  void line(int depth, fmt::format_string<Args...> format, Args&&... values) {
    out_.append(static_cast<size_t>(depth) * 2, ' ');
    out_ += fmt::format(format, std::forward<Args>(values)...);
    out_.push_back('\n');
  }

  void params(int depth, const char* role, const Param& param) {
    std::string quantized;
    if (param.quantized) {
      quantized = " quantized(";
      for (size_t i = 0; i < param.quantized->usages.size(); ++i)
        quantized += (i > 0 ? ", " : "") + param.quantized->usages[i].first;
      quantized += ")";
    }
    line(depth, "{} {}: {}{} {}", role, param.name, type_text(param.type), quantized,
         at(param.loc));
  }

  void args(int depth, const std::vector<Arg>& list) {
    for (const Arg& arg : list) {
      const std::string value = expr_text(arg.value.get());
      if (arg.name) {
        line(depth, "arg {} = {} {}", *arg.name, value, at(arg.name_loc));
      } else {
        line(depth, "arg {} {}", value, at(arg.value ? arg.value->loc : SourceLoc{}));
      }
    }
  }

  void op_params(int depth, const std::vector<OpParam>& list) {
    for (const OpParam& p : list) {
      if (!p.is_attr) {
        line(depth, "input {} {}", p.name, at(p.loc));
      } else if (p.default_value) {
        line(depth, "attr {} = {} {}", p.name, expr_text(p.default_value.get()), at(p.loc));
      } else {
        line(depth, "attr {} {}", p.name, at(p.loc));
      }
    }
  }

  std::string out_;
};

}  // namespace

std::string dump_ast(const Module& module) {
  Dumper dumper;
  for (const Decl& decl : module.decls) std::visit(dumper, decl);
  return dumper.take();
}

}  // namespace opfuse::dsl
