// The parser's expressions: constant and dimension expressions, binary and unary operators,
// parentheses and lists, with their nesting limit (the Parser class is in parser_impl.h).

#include <fmt/format.h>

#include <string>
#include <utility>

#include "dsl/parser_impl.h"

namespace opfuse::dsl::parser_detail {

bool Parser::starts_expr(TokenKind kind) {
  switch (kind) {
    case TokenKind::Int:
    case TokenKind::Float:
    case TokenKind::String:
    case TokenKind::Ident:
    case TokenKind::KwTrue:
    case TokenKind::KwFalse:
    case TokenKind::LParen:
    case TokenKind::LBracket:
    case TokenKind::Minus:
      return true;
    default:
      return false;
  }
}

bool Parser::enter_nesting() {
  if (depth_ >= kMaxExprNesting) {
    error_here(fmt::format("expression is nested too deeply (limit {})", kMaxExprNesting),
               "use fewer parentheses, brackets, minus signs or chained operators; a const "
               "can hold part of the expression");
    return false;
  }
  ++depth_;
  return true;
}

ExprPtr Parser::make_binary(const Token& op, ExprPtr lhs, ExprPtr rhs) {
  auto expr = std::make_unique<Expr>();
  expr->kind = Expr::Kind::Binary;
  expr->loc = op.loc;
  expr->op = op.text[0];
  expr->operands.push_back(std::move(lhs));
  expr->operands.push_back(std::move(rhs));
  return expr;
}

ExprPtr Parser::parse_expr(const std::string& what) {
  if (!op_body_) return parse_additive(what);
  DepthRestore restore(depth_);
  ExprPtr lhs = parse_additive(what);
  if (!lhs) return nullptr;
  switch (peek().kind) {
    case TokenKind::Less:
    case TokenKind::Greater:
    case TokenKind::LessEqual:
    case TokenKind::GreaterEqual:
    case TokenKind::EqualEqual:
    case TokenKind::NotEqual:
      break;
    default:
      return lhs;
  }
  if (!enter_nesting()) return nullptr;
  const Token& op = advance();
  ExprPtr rhs = parse_additive(fmt::format("a value after '{}'", op.text));
  if (!rhs) return nullptr;
  auto expr = std::make_unique<Expr>();
  expr->kind = Expr::Kind::Compare;
  expr->loc = op.loc;
  expr->text = std::string(op.text);
  expr->operands.push_back(std::move(lhs));
  expr->operands.push_back(std::move(rhs));
  if (at(TokenKind::Less) || at(TokenKind::Greater) || at(TokenKind::LessEqual) ||
      at(TokenKind::GreaterEqual) || at(TokenKind::EqualEqual) || at(TokenKind::NotEqual)) {
    error_here("comparisons do not chain", "write select(a < b, ...) with one comparison");
    return nullptr;
  }
  return expr;
}

ExprPtr Parser::parse_additive(const std::string& what) {
  DepthRestore restore(depth_);
  ExprPtr lhs = parse_term(what);
  while (lhs && (at(TokenKind::Plus) || at(TokenKind::Minus))) {
    if (!enter_nesting()) return nullptr;
    const Token& op = advance();
    ExprPtr rhs = parse_term(fmt::format("a value after '{}'", op.text));
    if (!rhs) return nullptr;
    lhs = make_binary(op, std::move(lhs), std::move(rhs));
  }
  return lhs;
}

ExprPtr Parser::parse_term(const std::string& what) {
  DepthRestore restore(depth_);
  ExprPtr lhs = parse_unary(what);
  while (lhs && (at(TokenKind::Star) || at(TokenKind::Slash) || at(TokenKind::Percent))) {
    if (!enter_nesting()) return nullptr;
    const Token& op = advance();
    ExprPtr rhs = parse_unary(fmt::format("a value after '{}'", op.text));
    if (!rhs) return nullptr;
    lhs = make_binary(op, std::move(lhs), std::move(rhs));
  }
  return lhs;
}

ExprPtr Parser::parse_unary(const std::string& what) {
  if (!at(TokenKind::Minus)) return op_body_ ? parse_power(what) : parse_primary(what);
  DepthRestore restore(depth_);
  if (!enter_nesting()) return nullptr;
  const Token& minus = advance();
  ExprPtr operand = parse_unary("a value after '-'");
  if (!operand) return nullptr;
  auto expr = std::make_unique<Expr>();
  expr->kind = Expr::Kind::Unary;
  expr->loc = minus.loc;
  expr->op = '-';
  expr->operands.push_back(std::move(operand));
  return expr;
}

// base ^ exponent, right-associative; the exponent may carry a sign (x ^ -2), and -x ^ 2 is
// -(x ^ 2) as in mathematics.
ExprPtr Parser::parse_power(const std::string& what) {
  DepthRestore restore(depth_);
  ExprPtr base = parse_primary(what);
  if (!base || !at(TokenKind::Caret)) return base;
  if (!enter_nesting()) return nullptr;
  const Token& caret = advance();
  ExprPtr exponent = parse_unary("an exponent after '^'");
  if (!exponent) return nullptr;
  return make_binary(caret, std::move(base), std::move(exponent));
}

// name(args): the '(' is next. Arguments are expressions, positional or `name = value`.
ExprPtr Parser::parse_call(const Token& callee) {
  DepthRestore restore(depth_);
  if (!enter_nesting()) return nullptr;
  auto call = std::make_unique<Expr>();
  call->kind = Expr::Kind::Call;
  call->loc = callee.loc;
  call->text = std::string(callee.text);
  const SourceLoc open = advance().loc;
  if (accept(TokenKind::RParen)) return call;
  for (;;) {
    std::string name;
    SourceLoc name_loc;
    if (at(TokenKind::Ident) && peek(1).kind == TokenKind::Equals) {
      name = std::string(peek().text);
      name_loc = advance().loc;
      advance();
    }
    ExprPtr arg = parse_expr(fmt::format("an argument of '{}'", call->text));
    if (!arg) return nullptr;
    if (call->operands.size() >= kMaxArgsPerCall) {
      error_at(callee, fmt::format("a call may have at most {} arguments", kMaxArgsPerCall));
      return nullptr;
    }
    call->operands.push_back(std::move(arg));
    call->arg_names.push_back(std::move(name));
    call->arg_name_locs.push_back(name_loc);
    if (accept(TokenKind::Comma)) continue;
    if (accept(TokenKind::RParen)) return call;
    error_here(fmt::format("expected ',' or ')' in the call of '{}' opened at {}, found {}",
                           call->text, where(open), found()));
    return nullptr;
  }
}

ExprPtr Parser::parse_primary(const std::string& what) {
  const Token& token = peek();
  auto expr = std::make_unique<Expr>();
  expr->loc = token.loc;
  switch (token.kind) {
    case TokenKind::Int:
      expr->kind = Expr::Kind::Int;
      expr->int_value = token.int_value;
      expr->text = std::string(token.text);
      advance();
      return expr;
    case TokenKind::Float:
      expr->kind = Expr::Kind::Float;
      expr->float_value = token.float_value;
      expr->text = std::string(token.text);
      advance();
      return expr;
    case TokenKind::KwTrue:
    case TokenKind::KwFalse:
      expr->kind = Expr::Kind::Bool;
      expr->int_value = token.kind == TokenKind::KwTrue ? 1 : 0;
      advance();
      return expr;
    case TokenKind::String:
      expr->kind = Expr::Kind::String;
      expr->text = decode_string_literal(token.text);
      advance();
      return expr;
    case TokenKind::Ident:
      if (op_body_ && peek(1).kind == TokenKind::LParen) return parse_call(advance());
      expr->kind = Expr::Kind::Name;
      expr->text = std::string(token.text);
      advance();
      return expr;
    case TokenKind::LParen:
      return parse_parenthesized(what);
    case TokenKind::LBracket:
      return parse_list();
    default:
      break;
  }
  std::string hint;
  if (token.kind == TokenKind::RParen || token.kind == TokenKind::RBracket ||
      token.kind == TokenKind::Comma) {
    hint = "a value (a number, a name, a string, true/false or a [list]) is missing here";
  }
  error_here(fmt::format("expected {}, found {}", what, found()), std::move(hint));
  return nullptr;
}

ExprPtr Parser::parse_parenthesized(const std::string& what) {
  DepthRestore restore(depth_);
  if (!enter_nesting()) return nullptr;
  const SourceLoc open = advance().loc;
  ExprPtr inner = parse_expr(what);
  if (!inner) return nullptr;
  if (!accept(TokenKind::RParen)) {
    error_here(fmt::format("expected ')' to close the '(' at {}, found {}", where(open), found()));
    return nullptr;
  }
  return inner;
}

ExprPtr Parser::parse_list() {
  DepthRestore restore(depth_);
  if (!enter_nesting()) return nullptr;
  auto list = std::make_unique<Expr>();
  list->kind = Expr::Kind::List;
  list->loc = advance().loc;
  if (accept(TokenKind::RBracket)) return list;
  bool limit_reported = false;
  for (;;) {
    const Token& first = peek();
    ExprPtr element = parse_expr("a list element");
    if (!element) return nullptr;
    if (list->operands.size() < kMaxListElements) {
      list->operands.push_back(std::move(element));
    } else if (!limit_reported) {
      limit_reported = true;
      error_at(first, fmt::format("a list may have at most {} elements", kMaxListElements));
    }
    if (accept(TokenKind::Comma)) {
      if (accept(TokenKind::RBracket)) return list;
      continue;
    }
    if (accept(TokenKind::RBracket)) return list;
    error_here(fmt::format("expected ',' or ']' in the list opened at {}, found {}",
                           where(list->loc), found()));
    return nullptr;
  }
}

}  // namespace opfuse::dsl::parser_detail
