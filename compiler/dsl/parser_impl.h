// Internal to the parser: the Parser class that parser.cpp (the file, declarations, signatures,
// types, call arguments and sequence bodies) and parser_expressions.cpp (expressions) define
// between them. The limits and locations are described in dsl/parser.h.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dsl/lexer.h"
#include "dsl/parser.h"

namespace opfuse::dsl::parser_detail {

bool is_decl_keyword(TokenKind kind);

// What a token looks like in "found ..." messages: its spelling, shortened and made printable.
std::string describe(const Token& token);

std::string where(SourceLoc loc);

// Restores the nesting depth when an expression level is left, on every return path.
class DepthRestore {
 public:
  explicit DepthRestore(size_t& depth) : depth_(depth), saved_(depth) {}
  ~DepthRestore() { depth_ = saved_; }
  DepthRestore(const DepthRestore&) = delete;
  DepthRestore& operator=(const DepthRestore&) = delete;

 private:
  size_t& depth_;
  size_t saved_;
};

class Parser {
 public:
  Parser(FileId file, std::vector<Token> tokens, DiagnosticEngine& diags)
      : file_(file), tokens_(std::move(tokens)), diags_(diags) {}

  std::unique_ptr<Module> run();

 private:
  // ---- token access -------------------------------------------------------------------------
  const Token& peek(size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  bool at(TokenKind kind) const { return peek().kind == kind; }
  // Never moves past the final Eof token.
  const Token& advance() {
    const Token& token = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return token;
  }
  bool accept(TokenKind kind) {
    if (!at(kind)) return false;
    advance();
    return true;
  }

  // Reports at the current token unless it already has an error (from the lexer or from us).
  void error_here(std::string message, std::string hint = {}) {
    const Token& token = peek();
    if (token.has_error || (reported_any_ && pos_ <= last_error_pos_)) return;
    reported_any_ = true;
    last_error_pos_ = pos_;
    diags_.error(token.loc, std::move(message), std::move(hint));
  }
  // Reports at an earlier token (a name that crossed a limit).
  void error_at(const Token& token, std::string message, std::string hint = {}) {
    if (token.has_error) return;
    diags_.error(token.loc, std::move(message), std::move(hint));
  }
  std::string found() const { return describe(peek()); }

  // ---- recovery -----------------------------------------------------------------------------
  void skip_to_next_decl(size_t start) {
    if (pos_ == start) advance();
    while (!at(TokenKind::Eof) && !is_decl_keyword(peek().kind) && !at_op_decl()) advance();
  }

  // `op NAME`, `gated op NAME` or `fusion NAME` at the start of a line: the words are keywords
  // only there, so `backward`, `op` and `fusion` stay usable as names elsewhere.
  bool at_op_decl() const {
    if (!peek().first_on_line || !at(TokenKind::Ident)) return false;
    if (peek().text == "gated")
      return peek(1).kind == TokenKind::Ident && peek(1).text == "op" &&
             peek(2).kind == TokenKind::Ident;
    if (peek().text == "fusion") return peek(1).kind == TokenKind::Ident;
    return peek().text == "op" && peek(1).kind == TokenKind::Ident;
  }

  // Inside a body: the next line that starts like an op (`name(`) or a declaration, or the '}'.
  void skip_to_next_op(size_t start) {
    if (pos_ == start) advance();
    for (;; advance()) {
      const Token& token = peek();
      if (token.kind == TokenKind::Eof || token.kind == TokenKind::RBrace) return;
      if (!token.first_on_line) continue;
      if (is_decl_keyword(token.kind) || at_op_decl()) return;
      if (token.kind == TokenKind::Ident && peek(1).kind == TokenKind::LParen) return;
    }
  }

  // ---- declarations -------------------------------------------------------------------------
  bool parse_decl(Module& module);

  bool parse_import(Module& module);

  bool parse_const(Module& module);

  bool parse_recipe(Module& module);

  bool parse_sequence(Module& module);

  // parser_ops.cpp: `[gated] op NAME(...) = EXPR [backward(...) = EXPR]`.
  bool parse_op_decl(Module& module);
  bool parse_fusion_decl(Module& module);
  bool parse_op_params(std::vector<OpParam>& params, const std::string& what, bool allow_attrs);
  bool parse_learned_params(OpDecl& op);

  // The '(' is consumed; consumes through the ')'.
  bool parse_params(std::vector<Param>& params, std::string_view which,
                    const std::string& sequence);

  bool parse_type(TensorTypeExpr& type, const std::string& param);
  // At the word `quantized` after a signature type; consumes through the ')'.
  bool parse_quantized(Param& param);

  // The '(' is consumed; consumes through the ')'.
  bool parse_args(std::vector<Arg>& args, std::string_view callee);

  // ---- sequence body ------------------------------------------------------------------------
  void parse_body(SequenceDecl& seq, SourceLoc open);

  bool parse_op(OpStmt& op, const std::string& sequence);

  // ---- expressions --------------------------------------------------------------------------
  static bool starts_expr(TokenKind kind);

  // Counts one level of nesting at the current token; reports (once per expression, since the
  // failure unwinds the whole expression) when the limit is crossed.
  bool enter_nesting();

  static ExprPtr make_binary(const Token& op, ExprPtr lhs, ExprPtr rhs);

  // `what` names the expected value in "expected ..., found ..." messages.
  ExprPtr parse_expr(const std::string& what);

  // Op definitions (op_body_): comparisons above the sums, ^ below unary minus, calls.
  ExprPtr parse_additive(const std::string& what);
  ExprPtr parse_power(const std::string& what);
  ExprPtr parse_call(const Token& callee);

  ExprPtr parse_term(const std::string& what);

  ExprPtr parse_unary(const std::string& what);

  ExprPtr parse_primary(const std::string& what);

  ExprPtr parse_parenthesized(const std::string& what);

  ExprPtr parse_list();

  FileId file_;
  std::vector<Token> tokens_;
  DiagnosticEngine& diags_;
  size_t pos_ = 0;
  size_t depth_ = 0;
  bool op_body_ = false;  // inside an op definition's expression
  bool reported_any_ = false;
  size_t last_error_pos_ = 0;
};

}  // namespace opfuse::dsl::parser_detail
