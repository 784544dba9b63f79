// The .fuse lexer: token kinds, literals and their limits, comments, locations, hostile bytes.
#include "dsl/lexer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "support/diagnostics.h"
#include "support/source_manager.h"

namespace opfuse::dsl {
namespace {

using K = TokenKind;

class Lexed {
 public:
  explicit Lexed(std::string text) {
    file_ = sources_.add_buffer("t.fuse", std::move(text));
    tokens = lex(file_, sources_, diags);
  }
  std::vector<K> kinds() const {
    std::vector<K> out;
    for (const Token& token : tokens) out.push_back(token.kind);
    return out;
  }
  // Each diagnostic as "line:col: message" (warnings prefixed "warning: ").
  std::vector<std::string> messages() const {
    std::vector<std::string> out;
    for (const Diagnostic& d : diags.diagnostics()) {
      out.push_back(std::to_string(d.loc.line) + ":" + std::to_string(d.loc.col) + ": " +
                    (d.severity == Severity::Warning ? "warning: " : "") + d.message);
    }
    return out;
  }

 private:
  SourceManager sources_;
  FileId file_ = kNoFile;

 public:
  DiagnosticEngine diags{sources_};
  std::vector<Token> tokens;
};

TEST(Lexer, RecognisesEveryTokenKind) {
  Lexed lexed(
      "import const recipe sequence uses with as true false name _x9 42 1.5 \"s\" "
      "( ) [ ] { } , : ; = + - * / % ->");
  const std::vector<K> expected = {
      K::KwImport, K::KwConst,   K::KwRecipe, K::KwSequence, K::KwUses, K::KwWith, K::KwAs,
      K::KwTrue,   K::KwFalse,   K::Ident,    K::Ident,      K::Int,    K::Float,  K::String,
      K::LParen,   K::RParen,    K::LBracket, K::RBracket,   K::LBrace, K::RBrace, K::Comma,
      K::Colon,    K::Semicolon, K::Equals,   K::Plus,       K::Minus,  K::Star,   K::Slash,
      K::Percent,  K::Arrow,     K::Eof};
  EXPECT_EQ(lexed.kinds(), expected);
  EXPECT_TRUE(lexed.messages().empty());
  EXPECT_EQ(lexed.tokens[10].text, "_x9");
}

TEST(Lexer, KeywordPrefixesAreIdentifiers) {
  Lexed lexed("imports asx true_ Sequence");
  EXPECT_EQ(lexed.kinds(), (std::vector<K>{K::Ident, K::Ident, K::Ident, K::Ident, K::Eof}));
}

TEST(Lexer, ArrowIsOneTokenAndMinusStaysMinus) {
  Lexed lexed("a->b - -c -->d");
  EXPECT_EQ(lexed.kinds(), (std::vector<K>{K::Ident, K::Arrow, K::Ident, K::Minus, K::Minus,
                                           K::Ident, K::Minus, K::Arrow, K::Ident, K::Eof}));
}

TEST(Lexer, IntegerValuesUpToInt64Max) {
  Lexed lexed("0 007 4096 9223372036854775807");
  ASSERT_EQ(lexed.tokens.size(), 5u);
  EXPECT_EQ(lexed.tokens[0].int_value, 0);
  EXPECT_EQ(lexed.tokens[1].int_value, 7);
  EXPECT_EQ(lexed.tokens[1].text, "007");
  EXPECT_EQ(lexed.tokens[2].int_value, 4096);
  EXPECT_EQ(lexed.tokens[3].int_value, INT64_MAX);
  EXPECT_TRUE(lexed.messages().empty());
}

TEST(Lexer, IntegerAboveInt64MaxIsAnError) {
  Lexed lexed("x 9223372036854775808 99999999999999999999999");
  EXPECT_EQ(lexed.messages(),
            (std::vector<std::string>{
                "1:3: integer literal is too large; the largest is 9223372036854775807",
                "1:23: integer literal is too large; the largest is 9223372036854775807"}));
  EXPECT_EQ(lexed.tokens[1].kind, K::Int);
  EXPECT_TRUE(lexed.tokens[1].has_error);
  EXPECT_FALSE(lexed.tokens[0].has_error);
}

TEST(Lexer, FloatForms) {
  Lexed lexed("1.5 1e-5 2E+3 0.25e2 3e0");
  ASSERT_EQ(lexed.kinds(),
            (std::vector<K>{K::Float, K::Float, K::Float, K::Float, K::Float, K::Eof}));
  EXPECT_DOUBLE_EQ(lexed.tokens[0].float_value, 1.5);
  EXPECT_DOUBLE_EQ(lexed.tokens[1].float_value, 1e-5);
  EXPECT_EQ(lexed.tokens[1].text, "1e-5");
  EXPECT_DOUBLE_EQ(lexed.tokens[2].float_value, 2000.0);
  EXPECT_DOUBLE_EQ(lexed.tokens[3].float_value, 25.0);
  EXPECT_DOUBLE_EQ(lexed.tokens[4].float_value, 3.0);
  EXPECT_TRUE(lexed.messages().empty());
}

TEST(Lexer, FloatOverflowIsAnErrorAndUnderflowAWarning) {
  Lexed lexed("1e308 1e309 123456.0e400 1e-400");
  EXPECT_EQ(lexed.messages(),
            (std::vector<std::string>{
                "1:7: floating-point literal is too large; the largest is 1.7976931348623157e+308",
                "1:13: floating-point literal is too large; the largest is 1.7976931348623157e+308",
                "1:26: warning: floating-point literal '1e-400' is too small and becomes 0"}));
  EXPECT_DOUBLE_EQ(lexed.tokens[0].float_value, 1e308);
  EXPECT_TRUE(lexed.tokens[1].has_error);
  EXPECT_EQ(lexed.tokens[3].float_value, 0.0);
}

TEST(Lexer, MalformedNumbersAreOneErrorEach) {
  Lexed lexed("1. 2e 3e+x 12abc 7");
  EXPECT_EQ(lexed.messages(),
            (std::vector<std::string>{
                "1:1: expected a digit after the '.' of a number: '1.'",
                "1:4: expected digits in the exponent of a number: '2e'",
                "1:7: expected digits in the exponent of a number: '3e+x'",
                "1:12: a number must not be followed directly by a letter: '12abc'"}));
  EXPECT_EQ(lexed.kinds(),
            (std::vector<K>{K::Invalid, K::Invalid, K::Invalid, K::Invalid, K::Int, K::Eof}));
}

TEST(Lexer, StringEscapesDecode) {
  Lexed lexed(R"("a\"b\\c\nd\te" "")");
  ASSERT_EQ(lexed.kinds(), (std::vector<K>{K::String, K::String, K::Eof}));
  EXPECT_EQ(lexed.tokens[0].text, R"("a\"b\\c\nd\te")");
  EXPECT_EQ(decode_string_literal(lexed.tokens[0].text), "a\"b\\c\nd\te");
  EXPECT_EQ(decode_string_literal(lexed.tokens[1].text), "");
  EXPECT_TRUE(lexed.messages().empty());
}

TEST(Lexer, UnknownEscapeIsReportedAtTheBackslash) {
  Lexed lexed(R"(x "ab\qc")");
  EXPECT_EQ(lexed.messages(),
            (std::vector<std::string>{"1:6: unknown escape sequence '\\q' in a string"}));
  EXPECT_EQ(lexed.tokens[1].kind, K::String);
  EXPECT_TRUE(lexed.tokens[1].has_error);
}

TEST(Lexer, UnterminatedStringStopsAtTheLineEnd) {
  Lexed lexed("import \"abc\nnext \"tail");
  EXPECT_EQ(lexed.messages(),
            (std::vector<std::string>{"1:8: unterminated string", "2:6: unterminated string"}));
  ASSERT_EQ(lexed.kinds(), (std::vector<K>{K::KwImport, K::Invalid, K::Ident, K::Invalid, K::Eof}));
  EXPECT_EQ(lexed.tokens[1].text, "\"abc");
  EXPECT_EQ(lexed.tokens[2].loc.line, 2u);
  EXPECT_TRUE(lexed.tokens[2].first_on_line);
}

TEST(Lexer, StringLengthLimit) {
  Lexed at_limit("\"" + std::string(kMaxStringBytes, 'a') + "\"");
  EXPECT_TRUE(at_limit.messages().empty());
  Lexed over_limit("\"" + std::string(kMaxStringBytes + 1, 'a') + "\"");
  EXPECT_EQ(over_limit.messages(),
            (std::vector<std::string>{"1:1: string is too long (4097 bytes; the limit is 4096)"}));
  // Escapes count once, as the byte they stand for.
  std::string escaped = "\"";
  for (size_t i = 0; i < kMaxStringBytes; ++i) escaped += "\\n";
  Lexed escaped_at_limit(escaped + "\"");
  EXPECT_TRUE(escaped_at_limit.messages().empty());
}

TEST(Lexer, IdentifierLengthLimit) {
  Lexed at_limit(std::string(kMaxIdentifierBytes, 'a'));
  EXPECT_TRUE(at_limit.messages().empty());
  Lexed over_limit("x " + std::string(kMaxIdentifierBytes + 1, 'b'));
  EXPECT_EQ(
      over_limit.messages(),
      (std::vector<std::string>{"1:3: identifier is too long (257 bytes; the limit is 256)"}));
  EXPECT_EQ(over_limit.tokens[1].kind, K::Ident);
}

TEST(Lexer, CommentsRunToTheLineEnd) {
  Lexed lexed("a # ( \" comment\nb // ) comment\n/ c #\n#\n//");
  EXPECT_EQ(lexed.kinds(), (std::vector<K>{K::Ident, K::Ident, K::Slash, K::Ident, K::Eof}));
  EXPECT_EQ(lexed.tokens[1].loc, (SourceLoc{lexed.tokens[1].loc.file, 2, 1}));
  EXPECT_EQ(lexed.tokens[3].text, "c");
  EXPECT_TRUE(lexed.messages().empty());
}

TEST(Lexer, ColumnsCountBytesAfterTabsAndMultibyteCharacters) {
  Lexed lexed("\tx\n\"\xC3\xA9\" y # \xE2\x82\xAC\n  \t z\r\nw");
  ASSERT_EQ(lexed.kinds(),
            (std::vector<K>{K::Ident, K::String, K::Ident, K::Ident, K::Ident, K::Eof}));
  auto line_col = [&](size_t i) {
    return std::to_string(lexed.tokens[i].loc.line) + ":" + std::to_string(lexed.tokens[i].loc.col);
  };
  EXPECT_EQ(line_col(0), "1:2");
  EXPECT_EQ(line_col(1), "2:1");
  EXPECT_EQ(line_col(2), "2:6");
  EXPECT_EQ(line_col(3), "3:5");
  EXPECT_EQ(line_col(4), "4:1");
  EXPECT_TRUE(lexed.messages().empty());
}

TEST(Lexer, NonAsciiOutsideStringsIsOneErrorPerRun) {
  Lexed lexed("a \xC3\xA9 b $$ c \xFF\xFE");
  EXPECT_EQ(lexed.messages(), (std::vector<std::string>{"1:3: unexpected character '\\xC3'",
                                                        "1:8: unexpected character '$'",
                                                        "1:13: unexpected character '\\xFF'"}));
  EXPECT_EQ(lexed.kinds(), (std::vector<K>{K::Ident, K::Invalid, K::Ident, K::Invalid, K::Ident,
                                           K::Invalid, K::Eof}));
  EXPECT_EQ(lexed.tokens[2].loc.col, 6u);
}

TEST(Lexer, NulBytesAreReportedNotFatal) {
  Lexed lexed(std::string("a\0b \"x\0y\"", 9));
  EXPECT_EQ(lexed.messages(),
            (std::vector<std::string>{"1:2: unexpected character '\\x00'",
                                      "1:7: control character '\\x00' in a string"}));
  EXPECT_EQ(lexed.kinds(), (std::vector<K>{K::Ident, K::Invalid, K::Ident, K::String, K::Eof}));
  EXPECT_EQ(lexed.tokens[2].loc.col, 3u);
}

TEST(Lexer, BinaryInputEndsWithEofAndReportsErrors) {
  std::string bytes;
  uint32_t state = 12345;
  for (int i = 0; i < 200000; ++i) {
    state = state * 1664525u + 1013904223u;  // a fixed pseudo-random byte stream
    bytes.push_back(static_cast<char>(state >> 24));
  }
  for (int c = 0; c < 256; ++c) bytes.push_back(static_cast<char>(c));
  Lexed lexed(bytes);
  ASSERT_FALSE(lexed.tokens.empty());
  EXPECT_EQ(lexed.tokens.back().kind, K::Eof);
  EXPECT_GT(lexed.diags.error_count(), DiagnosticEngine::kDefaultErrorLimit);
  for (size_t i = 0; i + 1 < lexed.tokens.size(); ++i) {
    EXPECT_NE(lexed.tokens[i].kind, K::Eof);
    if (lexed.tokens[i].kind == K::Invalid) {
      EXPECT_TRUE(lexed.tokens[i].has_error);
    }
  }
}

TEST(Lexer, FirstOnLineMarksTheFirstTokenOfEachLine) {
  Lexed lexed("a b\n  c # x\n\n d e\n# only a comment\n f");
  std::vector<bool> first;
  for (const Token& token : lexed.tokens) first.push_back(token.first_on_line);
  EXPECT_EQ(first, (std::vector<bool>{true, false, true, true, false, true, true}));
}

TEST(Lexer, EmptyInputIsJustEof) {
  Lexed lexed("");
  ASSERT_EQ(lexed.kinds(), (std::vector<K>{K::Eof}));
  EXPECT_EQ(lexed.tokens[0].loc.line, 1u);
  EXPECT_EQ(lexed.tokens[0].loc.col, 1u);
}

}  // namespace
}  // namespace opfuse::dsl
