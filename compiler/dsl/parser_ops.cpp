// The parser's op definitions: `[gated] op NAME(inputs, attrs) = EXPR [backward(...) = EXPR]`
// (docs/language.md, "User-defined ops"), and fusion declarations: `fusion NAME[(args)] { op;
// op?; ... }` ("Declared fusions"). The Parser class is in parser_impl.h. The words `op`, `gated`,
// `backward` and `fusion` are keywords only where a definition can stand.

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
