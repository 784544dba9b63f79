// The parser's op definitions:
// `[gated] op NAME(inputs, attrs) [params(...)] = EXPR [backward(...) = EXPR]`
// (docs/language.md, "User-defined ops"), and fusion declarations: `fusion NAME[(args)] { op;
// op?; ... }` ("Declared fusions"). The Parser class is in parser_impl.h. The words `op`, `gated`,
// `backward`, `params` and `fusion` are keywords only where a definition can stand.

#include <fmt/format.h>

#include <string>
#include <utility>

#include "dsl/parser_impl.h"

namespace opfuse::dsl::parser_detail {

namespace {

// Restores a flag on every return path.
class FlagRestore {
 public:
  FlagRestore(bool& flag, bool value) : flag_(flag), saved_(flag) { flag_ = value; }
  ~FlagRestore() { flag_ = saved_; }
  FlagRestore(const FlagRestore&) = delete;
  FlagRestore& operator=(const FlagRestore&) = delete;

 private:
  bool& flag_;
  bool saved_;
};

}  // namespace

bool Parser::parse_op_params(std::vector<OpParam>& params, const std::string& what,
                             bool allow_attrs) {
  if (!accept(TokenKind::LParen)) {
    error_here(fmt::format("expected '(' after {}, found {}", what, found()),
               "write: op NAME(x) = EXPR");
    return false;
  }
  if (accept(TokenKind::RParen)) return true;
  for (;;) {
    if (!at(TokenKind::Ident)) {
      error_here(fmt::format("expected an input or attribute name in {}, found {}", what, found()),
                 "inputs are names (x), attributes are `name: number = default`");
      return false;
    }
    if (params.size() >= kMaxParamsPerSignature) {
      error_here(fmt::format("{} has more than {} parameters", what, kMaxParamsPerSignature));
      return false;
    }
    const Token& name = advance();
    OpParam param{std::string(name.text), name.loc, false, nullptr};
    if (accept(TokenKind::Colon)) {
      if (!at(TokenKind::Ident) || peek().text != "number") {
        error_here(fmt::format("expected 'number' after '{}:', found {}", name.text, found()),
                   "an attribute is a number fixed where the op is used: `slope: number = 0.01`");
        return false;
      }
      advance();
      param.is_attr = true;
      if (accept(TokenKind::Equals)) {
        param.default_value = parse_expr(fmt::format("a default for '{}'", name.text));
        if (!param.default_value) return false;
      }
      if (!allow_attrs) {
        error_at(name,
                 fmt::format("{} takes the op's inputs and the gradient, not attributes", what),
                 "the op's attributes are in scope in its backward");
        return false;
      }
    } else if (!params.empty() && params.back().is_attr) {
      error_at(name, fmt::format("input '{}' follows an attribute in {}", name.text, what),
               "write the inputs first: op NAME(x, slope: number = 0.01)");
      return false;
    }
    params.push_back(std::move(param));
    if (accept(TokenKind::Comma)) continue;
    if (accept(TokenKind::RParen)) return true;
    error_here(fmt::format("expected ',' or ')' in {}, found {}", what, found()));
    return false;
  }
}

// `params(NAME: DTYPE[dims] = INIT, ...)`, the word `params` already seen. Whether the dtype
// and dims mean something is the builder's to say (at the definition); the form is checked here.
bool Parser::parse_learned_params(OpDecl& op) {
  op.has_learned = true;
  op.learned_loc = advance().loc;  // params
  advance();                       // (
  if (accept(TokenKind::RParen)) return true;
  for (;;) {
    if (!at(TokenKind::Ident)) {
      error_here(fmt::format("expected a parameter name in the params of '{}', found {}", op.name,
                             found()),
                 "write: params(scale: fp32[] = 1.0)");
      return false;
    }
    if (op.learned.size() >= kMaxParamsPerSignature) {
      error_here(
          fmt::format("op '{}' has more than {} parameters", op.name, kMaxParamsPerSignature));
      return false;
    }
    const Token& name = advance();
    OpLearnedParam param{std::string(name.text), name.loc, {}, nullptr};
    if (!accept(TokenKind::Colon)) {
      error_here(fmt::format("expected ':' and the type of parameter '{}' of op '{}', found {}",
                             name.text, op.name, found()),
                 fmt::format("a parameter has a type and a start value: {}: fp32[] = 1.0 (a "
                             "scalar) or {}: fp32[64] = 1.0 (one per feature)",
                             name.text, name.text));
      return false;
    }
    if (at(TokenKind::Ident) && peek(1).kind != TokenKind::LBracket) {
      const Token& dtype = advance();
      error_here(fmt::format("parameter '{}' of op '{}' needs a shape after its dtype, found {}",
                             name.text, op.name, found()),
                 fmt::format("[] for a scalar, [N] for one value per feature: {}: {}[] = 1.0",
                             name.text, dtype.text));
      return false;
    }
    if (!parse_type(param.type, std::string(name.text))) return false;
    if (!accept(TokenKind::Equals)) {
      error_here(fmt::format("expected '=' and the start value of parameter '{}', found {}",
                             name.text, found()),
                 fmt::format("every element starts at a number: {}: {}[...] = 1.0", name.text,
                             param.type.dtype));
      return false;
    }
    param.init = parse_expr(fmt::format("the start value of parameter '{}'", name.text));
    if (!param.init) return false;
    op.learned.push_back(std::move(param));
    if (accept(TokenKind::Comma)) {
      if (accept(TokenKind::RParen)) return true;
      continue;
    }
    if (accept(TokenKind::RParen)) return true;
    error_here(
        fmt::format("expected ',' or ')' in the params of '{}', found {}", op.name, found()));
    return false;
  }
}

bool Parser::parse_op_decl(Module& module) {
  OpDecl op;
  if (peek().text == "gated") {
    op.gated = true;
    advance();
  }
  advance();                      // op
  const Token& name = advance();  // at_op_decl() saw a name here
  op.name = std::string(name.text);
  op.loc = name.loc;
  if (!parse_op_params(op.params, fmt::format("op '{}'", op.name), /*allow_attrs=*/true))
    return false;
  if (at(TokenKind::Ident) && peek().text == "params" && peek(1).kind == TokenKind::LParen &&
      !parse_learned_params(op))
    return false;
  if (!accept(TokenKind::Equals)) {
    error_here(
        fmt::format("expected '=' and the expression of op '{}', found {}", op.name, found()),
        fmt::format("write: op {}(x) = EXPR", op.name));
    return false;
  }
  {
    FlagRestore in_body(op_body_, true);
    op.body = parse_expr(fmt::format("the expression of op '{}'", op.name));
    if (!op.body) return false;
    if (at(TokenKind::Ident) && peek().text == "backward" && peek(1).kind == TokenKind::LParen) {
      op.has_backward = true;
      op.backward_loc = advance().loc;
      if (!parse_op_params(op.backward_params, fmt::format("the backward of '{}'", op.name),
                           /*allow_attrs=*/false))
        return false;
      if (!accept(TokenKind::Equals)) {
        error_here(
            fmt::format("expected '=' and the gradient after the backward's inputs, found "
                        "{}",
                        found()),
            op.gated ? "write: backward(a, b, dy) = [d_a, d_b]" : "write: backward(x, dy) = EXPR");
        return false;
      }
      op.backward = parse_expr(fmt::format("the backward of op '{}'", op.name));
      if (!op.backward) return false;
    }
  }
  module.decls.emplace_back(std::move(op));
  return true;
}

bool Parser::parse_fusion_decl(Module& module) {
  FusionDecl fusion;
  advance();                      // fusion
  const Token& name = advance();  // at_op_decl() saw a name here
  fusion.name = std::string(name.text);
  fusion.loc = name.loc;
  if (accept(TokenKind::LParen) && !parse_args(fusion.args, "fusion " + fusion.name)) return false;
  if (!accept(TokenKind::LBrace)) {
    error_here(
        fmt::format("expected '{{' and the ops of fusion '{}', found {}", fusion.name, found()),
        fmt::format("write: fusion {} {{ constant_scale; add_extra_input }}", fusion.name));
    return false;
  }
  for (;;) {
    while (accept(TokenKind::Semicolon)) {
    }
    if (at(TokenKind::RBrace)) {
      fusion.close_loc = advance().loc;
      break;
    }
    if (!at(TokenKind::Ident)) {
      error_here(fmt::format("expected an op name in fusion '{}', found {}", fusion.name, found()),
                 "the steps are op names, separated by ';' or new lines; `bias?` may be absent");
      return false;
    }
    if (fusion.steps.size() >= kMaxFusionSteps) {
      error_here(fmt::format("fusion '{}' has more than {} steps", fusion.name, kMaxFusionSteps));
      return false;
    }
    const Token& op = advance();
    FusionStep step{std::string(op.text), op.loc, false};
    if (accept(TokenKind::Question)) step.optional = true;
    fusion.steps.push_back(std::move(step));
    if (at(TokenKind::Semicolon) || at(TokenKind::RBrace) || peek().first_on_line) continue;
    error_here(fmt::format("expected ';' or '}}' after '{}' in fusion '{}', found {}",
                           fusion.steps.back().op, fusion.name, found()),
               "a step is an op's name alone: the pattern matches the op whatever its arguments");
    return false;
  }
  module.decls.emplace_back(std::move(fusion));
  return true;
}

}  // namespace opfuse::dsl::parser_detail
