// The .fuse lexer: turns one source buffer into tokens (docs/language.md, "Lexical structure").
// Hostile bytes are reported through the DiagnosticEngine and lexing goes on, so the parser can
// still report the errors that follow.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "support/diagnostics.h"
#include "support/source_manager.h"

namespace opfuse::dsl {

enum class TokenKind : uint8_t {
  Eof,
  Invalid,  // bytes the lexer already reported (stray characters, an unterminated string)
  Ident,
  Int,
  Float,
  String,
  // Keywords.
  KwImport,
  KwConst,
  KwRecipe,
  KwSequence,
  KwUses,
  KwWith,
  KwAs,
  KwTrue,
  KwFalse,
  // Punctuation.
  LParen,
  RParen,
  LBracket,
  RBracket,
  LBrace,
  RBrace,
  Comma,
  Colon,
  Semicolon,
  Equals,
  Plus,
  Minus,
  Star,
  Slash,
  Percent,
  Arrow,  // ->
  // Operators of op definitions (docs/language.md, "User-defined ops").
  Caret,         // ^
  Less,          // <
  Greater,       // >
  LessEqual,     // <=
  GreaterEqual,  // >=
  EqualEqual,    // ==
  NotEqual,      // !=
  Question,      // ? (an optional step of a fusion declaration)
};

// Limits that keep hostile input bounded (docs/language.md, "Limits").
inline constexpr size_t kMaxIdentifierBytes = 256;
inline constexpr size_t kMaxStringBytes = 4096;  // after unescaping

struct Token {
  TokenKind kind = TokenKind::Eof;
  bool first_on_line = false;  // no token precedes it on its line (the parser's recovery point)
  bool has_error = false;      // the lexer already reported this token; say nothing more about it
  SourceLoc loc;               // of the first byte
  std::string_view text;       // spelling, pointing into the SourceManager's buffer
  int64_t int_value = 0;       // Int: the value (0 when it overflowed)
  double float_value = 0.0;    // Float: the value (0 when it overflowed)
};

// Lexes the whole buffer of `file`. The result always ends with one Eof token. The tokens' text
// points into `sources`, which must outlive them.
std::vector<Token> lex(FileId file, const SourceManager& sources, DiagnosticEngine& diags);

// The value of a String token's spelling (quotes removed, escapes \" \\ \n \t decoded). Only for
// spellings the lexer produced; unknown escapes (already reported) are kept as written.
std::string decode_string_literal(std::string_view spelling);

// Whether `text` lexes as one identifier token (ASCII letters, digits, '_'; not starting with a
// digit). Keywords pass: the parser reports them where a name is expected.
bool is_identifier(std::string_view text);

// How a token kind is written in messages: "')'", "'sequence'", "a name", "end of file".
std::string_view token_kind_name(TokenKind kind);

}  // namespace opfuse::dsl
