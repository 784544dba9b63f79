#include "dsl/parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dsl/lexer.h"
#include "dsl/parser_impl.h"

namespace opfuse::dsl {

namespace parser_detail {

bool is_decl_keyword(TokenKind kind) {
  return kind == TokenKind::KwImport || kind == TokenKind::KwConst || kind == TokenKind::KwRecipe ||
         kind == TokenKind::KwSequence;
}

std::string describe(const Token& token) {
  if (token.kind == TokenKind::Eof) return "end of file";
  constexpr size_t kShown = 32;
  std::string shown;
  for (size_t i = 0; i < token.text.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(token.text[i]);
    if (c >= 0x20 && c < 0x7f) {
      shown.push_back(char(c));
    } else {
      shown += fmt::format("\\x{:02X}", c);
    }
  }
  if (token.text.size() > kShown) shown += "...";
  if (token.kind == TokenKind::String) return "string " + shown;
  return "'" + shown + "'";
}

std::string where(SourceLoc loc) { return fmt::format("{}:{}", loc.line, loc.col); }

std::unique_ptr<Module> Parser::run() {
  auto module = std::make_unique<Module>();
  module->file = file_;
  size_t decls_seen = 0;
  while (!at(TokenKind::Eof) && !diags_.at_error_limit()) {
    if (decls_seen == kMaxDeclsPerFile) {
      error_here(fmt::format("the file has more than {} declarations", kMaxDeclsPerFile),
                 "split it into several files joined with 'import'");
      break;
    }
    ++decls_seen;
    const size_t start = pos_;
    if (!parse_decl(*module)) skip_to_next_decl(start);
  }
  return module;
}

bool Parser::parse_decl(Module& module) {
  switch (peek().kind) {
    case TokenKind::KwImport:
      return parse_import(module);
    case TokenKind::KwConst:
      return parse_const(module);
    case TokenKind::KwRecipe:
      return parse_recipe(module);
    case TokenKind::KwSequence:
      return parse_sequence(module);
    default:
      break;
  }
  if (at_op_decl())
    return peek().text == "fusion" ? parse_fusion_decl(module) : parse_op_decl(module);
  std::string hint;
  if (at(TokenKind::Ident) && peek(1).kind == TokenKind::LParen) {
    hint = "ops belong in a sequence body: sequence NAME(inputs) -> (outputs) { op(...) }";
  }
  error_here(fmt::format("expected a declaration ('import', 'const', 'recipe' or 'sequence'), "
                         "found {}",
                         found()),
             std::move(hint));
  return false;
}

bool Parser::parse_import(Module& module) {
  advance();  // import
  if (!at(TokenKind::String)) {
    error_here(fmt::format("expected a quoted path after 'import', found {}", found()),
               "write: import \"other.fuse\"");
    return false;
  }
  const Token& path = advance();
  module.decls.emplace_back(ImportDecl{decode_string_literal(path.text), path.loc});
  return true;
}

bool Parser::parse_const(Module& module) {
  advance();  // const
  if (!at(TokenKind::Ident)) {
    error_here(fmt::format("expected a name after 'const', found {}", found()),
               "write: const hidden = 4096");
    return false;
  }
  const Token& name = advance();
  if (!at(TokenKind::Equals)) {
    error_here(fmt::format("expected '=' after 'const {}', found {}", name.text, found()),
               fmt::format("write: const {} = VALUE", name.text));
    return false;
  }
  advance();
  ExprPtr value = parse_expr(fmt::format("a value for const '{}'", name.text));
  if (!value) return false;
  module.decls.emplace_back(ConstDecl{std::string(name.text), name.loc, std::move(value)});
  return true;
}

bool Parser::parse_recipe(Module& module) {
  advance();  // recipe
  if (!at(TokenKind::Ident)) {
    error_here(fmt::format("expected a name after 'recipe', found {}", found()),
               "write: recipe fp8 = delayed_scaling(margin = 0)");
    return false;
  }
  RecipeDecl recipe;
  const Token& name = advance();
  recipe.name = std::string(name.text);
  recipe.loc = name.loc;
  if (!at(TokenKind::Equals)) {
    error_here(fmt::format("expected '=' after 'recipe {}', found {}", recipe.name, found()),
               fmt::format("write: recipe {} = delayed_scaling(...)", recipe.name));
    return false;
  }
  advance();
  if (!at(TokenKind::Ident)) {
    error_here(
        fmt::format("expected the recipe kind after 'recipe {} =', found {}", recipe.name, found()),
        "the kinds are delayed_scaling, current_scaling and bf16");
    return false;
  }
  const Token& kind = advance();
  recipe.kind = std::string(kind.text);
  recipe.kind_loc = kind.loc;
  if (!at(TokenKind::LParen)) {
    error_here(fmt::format("expected '(' after recipe kind '{}', found {}", recipe.kind, found()),
               fmt::format("write: {}() even without arguments", recipe.kind));
    return false;
  }
  advance();
  if (!parse_args(recipe.args, recipe.kind)) return false;
  module.decls.emplace_back(std::move(recipe));
  return true;
}

bool Parser::parse_sequence(Module& module) {
  advance();  // sequence
  if (!at(TokenKind::Ident)) {
    error_here(fmt::format("expected a name after 'sequence', found {}", found()),
               "write: sequence NAME(inputs) -> (outputs) { ops }");
    return false;
  }
  SequenceDecl seq;
  const Token& name = advance();
  seq.name = std::string(name.text);
  seq.loc = name.loc;
  if (!at(TokenKind::LParen)) {
    error_here(fmt::format("expected '(' to start the inputs of sequence '{}', found {}", seq.name,
                           found()),
               fmt::format("write: sequence {}(x: bf16[tokens, hidden]) -> (...)", seq.name));
    return false;
  }
  advance();
  if (!parse_params(seq.inputs, "inputs", seq.name)) return false;
  if (!accept(TokenKind::Arrow)) {
    error_here(
        fmt::format("expected '->' after the inputs of sequence '{}', found {}", seq.name, found()),
        "a sequence declares its outputs after '->'");
    // A missing arrow before the output list is read as if it were there, to find more errors.
    if (!at(TokenKind::LParen)) return false;
  }
  if (!at(TokenKind::LParen)) {
    error_here(fmt::format("expected '(' to start the outputs of sequence '{}', found {}", seq.name,
                           found()),
               "list the outputs in parentheses, e.g. -> (y: bf16[tokens, hidden])");
    return false;
  }
  advance();
  if (!parse_params(seq.outputs, "outputs", seq.name)) return false;
  if (accept(TokenKind::KwUses)) {
    if (!at(TokenKind::Ident)) {
      error_here(fmt::format("expected a recipe name after 'uses', found {}", found()),
                 "name a recipe declared with 'recipe NAME = ...'");
      return false;
    }
    const Token& recipe = advance();
    seq.recipe = std::string(recipe.text);
    seq.recipe_loc = recipe.loc;
  }
  if (accept(TokenKind::KwWith)) {
    do {
      if (!at(TokenKind::Ident)) {
        error_here(fmt::format("expected a flag name after 'with', found {}", found()),
                   "write: with fp8_weights, or with parallel(tp = 2)");
        return false;
      }
      const Token& flag = advance();
      SequenceFlag option{std::string(flag.text), flag.loc, false, {}};
      if (accept(TokenKind::LParen)) {
        option.has_args = true;
        if (!parse_args(option.args, option.name)) return false;
      }
      seq.flags.push_back(std::move(option));
    } while (accept(TokenKind::Comma));
  }
  if (!at(TokenKind::LBrace)) {
    error_here(fmt::format("expected '{{' to start the body of sequence '{}', found {}", seq.name,
                           found()),
               "after the outputs may come 'uses RECIPE' and 'with FLAG, ...', then '{'");
    return false;
  }
  const SourceLoc open = advance().loc;
  parse_body(seq, open);
  module.decls.emplace_back(std::move(seq));
  return true;
}

bool Parser::parse_params(std::vector<Param>& params, std::string_view which,
                          const std::string& sequence) {
  if (accept(TokenKind::RParen)) return true;
  bool limit_reported = false;
  for (;;) {
    if (!at(TokenKind::Ident)) {
      error_here(fmt::format("expected a parameter name in the {} of sequence '{}', found {}",
                             which, sequence, found()),
                 "write each parameter as 'name: dtype[dims]'");
      return false;
    }
    const Token& name = advance();
    const std::string param_name(name.text);
    if (!at(TokenKind::Colon)) {
      error_here(fmt::format("expected ':' after parameter '{}', found {}", param_name, found()),
                 fmt::format("write: {}: bf16[tokens, hidden]", param_name));
      return false;
    }
    advance();
    Param param;
    param.name = param_name;
    param.loc = name.loc;
    if (!parse_type(param.type, param_name)) return false;
    if (at(TokenKind::Ident) && peek().text == "quantized" && !parse_quantized(param)) return false;
    if (params.size() < kMaxParamsPerSignature) {
      params.push_back(std::move(param));
    } else if (!limit_reported) {
      limit_reported = true;
      error_at(
          name,
          fmt::format("sequence '{}' has more than {} {}", sequence, kMaxParamsPerSignature, which),
          "split the sequence, or pass fewer tensors");
    }
    if (accept(TokenKind::Comma)) {
      if (accept(TokenKind::RParen)) return true;
      continue;
    }
    if (accept(TokenKind::RParen)) return true;
    error_here(fmt::format("expected ',' or ')' after parameter '{}' of sequence '{}', found {}",
                           param_name, sequence, found()));
    return false;
  }
}

// `quantized(usage, ...)` after a signature type; the builder checks the usage names.
bool Parser::parse_quantized(Param& param) {
  QuantizedExpr q;
  q.loc = advance().loc;
  if (!accept(TokenKind::LParen)) {
    error_here(fmt::format("expected '(' after 'quantized' of parameter '{}', found {}", param.name,
                           found()),
               "list the copies it carries: quantized(rowwise, columnwise)");
    return false;
  }
  for (;;) {
    if (!at(TokenKind::Ident)) {
      error_here(fmt::format("expected a usage (rowwise, columnwise) in 'quantized' of "
                             "parameter '{}', found {}",
                             param.name, found()),
                 "write quantized(rowwise, columnwise)");
      return false;
    }
    const Token& usage = advance();
    q.usages.emplace_back(std::string(usage.text), usage.loc);
    if (accept(TokenKind::Comma)) {
      if (accept(TokenKind::RParen)) break;
      continue;
    }
    if (accept(TokenKind::RParen)) break;
    error_here(fmt::format("expected ',' or ')' after a usage of parameter '{}', found {}",
                           param.name, found()));
    return false;
  }
  param.quantized = std::move(q);
  return true;
}

bool Parser::parse_type(TensorTypeExpr& type, const std::string& param) {
  if (!at(TokenKind::Ident)) {
    error_here(fmt::format("expected a dtype after '{}:', found {}", param, found()),
               fmt::format("write: {}: bf16[tokens, hidden]", param));
    return false;
  }
  const Token& dtype = advance();
  type.dtype = std::string(dtype.text);
  type.loc = dtype.loc;
  if (!at(TokenKind::LBracket)) {
    error_here(
        fmt::format("expected '[' after dtype '{}' of parameter '{}', found {}", type.dtype, param,
                    found()),
        fmt::format("a tensor type lists its dims in brackets: {}[tokens, hidden]", type.dtype));
    return false;
  }
  advance();
  if (accept(TokenKind::RBracket)) return true;
  bool limit_reported = false;
  for (;;) {
    const Token& first = peek();
    ExprPtr dim = parse_expr(fmt::format("a dim of parameter '{}'", param));
    if (!dim) return false;
    if (type.dims.size() < kMaxDimsPerType) {
      type.dims.push_back(std::move(dim));
    } else if (!limit_reported) {
      limit_reported = true;
      error_at(first, fmt::format("parameter '{}' has more than {} dims", param, kMaxDimsPerType),
               "tensors have at most 64 dims; reshape them first");
    }
    if (accept(TokenKind::Comma)) {
      if (accept(TokenKind::RBracket)) return true;
      continue;
    }
    if (accept(TokenKind::RBracket)) return true;
    error_here(
        fmt::format("expected ',' or ']' after a dim of parameter '{}', found {}", param, found()),
        "separate dims with ',' and close the list with ']'");
    return false;
  }
}

bool Parser::parse_args(std::vector<Arg>& args, std::string_view callee) {
  if (accept(TokenKind::RParen)) return true;
  bool limit_reported = false;
  for (;;) {
    if (at(TokenKind::Ident) && peek(1).kind == TokenKind::LParen && peek().first_on_line) {
      // Arguments are never calls: this is the next op after a forgotten ')'.
      error_here(
          fmt::format("expected ')' after the arguments of '{}', found {}", callee, found()));
      return false;
    }
    Arg arg;
    const Token& first = peek();
    if (at(TokenKind::Ident) && peek(1).kind == TokenKind::Equals) {
      const Token& name = advance();
      advance();  // =
      arg.name = std::string(name.text);
      arg.name_loc = name.loc;
    }
    arg.value = parse_expr(arg.name ? fmt::format("a value for argument '{}'", *arg.name)
                                    : fmt::format("an argument of '{}'", callee));
    if (!arg.value) return false;
    if (args.size() < kMaxArgsPerCall) {
      args.push_back(std::move(arg));
    } else if (!limit_reported) {
      limit_reported = true;
      error_at(first, fmt::format("'{}' has more than {} arguments", callee, kMaxArgsPerCall));
    }
    if (accept(TokenKind::Comma)) {
      if (accept(TokenKind::RParen)) return true;
      continue;
    }
    if (accept(TokenKind::RParen)) return true;
    std::string hint;
    if (starts_expr(peek().kind) && !peek().first_on_line) {
      hint = "separate arguments with ','";
    }
    error_here(fmt::format("expected ')' after the arguments of '{}', found {}", callee, found()),
               std::move(hint));
    return false;
  }
}

void Parser::parse_body(SequenceDecl& seq, SourceLoc open) {
  bool limit_reported = false;
  for (;;) {
    if (diags_.at_error_limit()) return;
    if (at(TokenKind::RBrace)) {
      seq.close_loc = advance().loc;
      return;
    }
    if (at(TokenKind::Eof) || is_decl_keyword(peek().kind)) {
      // The declaration after a forgotten '}' still parses: leave its keyword for the caller.
      error_here(fmt::format("expected '}}' to close the body of sequence '{}' (opened at {}), "
                             "found {}",
                             seq.name, where(open), found()),
                 "every sequence body ends with '}'");
      return;
    }
    const size_t start = pos_;
    OpStmt op;
    if (!parse_op(op, seq.name)) {
      skip_to_next_op(start);
      continue;
    }
    if (seq.body.size() < kMaxOpsPerSequence) {
      seq.body.push_back(std::move(op));
    } else if (!limit_reported) {
      limit_reported = true;
      error_at(tokens_[start],
               fmt::format("sequence '{}' has more than {} ops", seq.name, kMaxOpsPerSequence),
               "split it into several sequences");
    }
  }
}

bool Parser::parse_op(OpStmt& op, const std::string& sequence) {
  if (!at(TokenKind::Ident)) {
    error_here(fmt::format("expected an op or '}}' in the body of sequence '{}', found {}",
                           sequence, found()),
               "each statement in a body is an op call, e.g. linear(hidden, ffn) as up_proj");
    return false;
  }
  const Token& name = advance();
  op.op = std::string(name.text);
  op.loc = name.loc;
  if (!at(TokenKind::LParen)) {
    error_here(fmt::format("expected '(' after op name '{}', found {}", op.op, found()),
               fmt::format("call the op with parentheses, even without arguments: {}()", op.op));
    return false;
  }
  advance();
  if (!parse_args(op.args, op.op)) return false;
  if (accept(TokenKind::KwAs)) {
    if (!at(TokenKind::Ident)) {
      error_here(fmt::format("expected an instance name after 'as', found {}", found()),
                 fmt::format("write: {}(...) as my_{}", op.op, op.op));
      return false;
    }
    const Token& instance = advance();
    op.instance = std::string(instance.text);
    op.instance_loc = instance.loc;
  }
  accept(TokenKind::Semicolon);
  return true;
}

}  // namespace parser_detail

std::unique_ptr<Module> parse_module(FileId file, const SourceManager& sources,
                                     DiagnosticEngine& diags) {
  return parser_detail::Parser(file, lex(file, sources, diags), diags).run();
}

}  // namespace opfuse::dsl
