#include "dsl/lexer.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>

namespace opfuse::dsl {

namespace {

bool is_ident_start(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_ident_char(unsigned char c) { return is_ident_start(c) || is_digit(c); }

// A byte as it appears in a message: x when printable, \xNN otherwise.
std::string byte_text(unsigned char c) {
  if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') return std::string(1, char(c));
  return fmt::format("\\x{:02X}", c);
}
std::string describe_byte(unsigned char c) { return "'" + byte_text(c) + "'"; }

// Bytes that end a run of stray bytes: whatever can start a token, whitespace, a comment.
bool ends_stray_run(unsigned char c) {
  return is_ident_char(c) || std::string_view("\"#()[]{},:;=+-*/%^<>! \t\n\r\f\v").find(char(c)) !=
                                 std::string_view::npos;
}

struct Keyword {
  std::string_view spelling;
  TokenKind kind;
};
constexpr Keyword kKeywords[] = {
    {"import", TokenKind::KwImport}, {"const", TokenKind::KwConst},
    {"recipe", TokenKind::KwRecipe}, {"sequence", TokenKind::KwSequence},
    {"uses", TokenKind::KwUses},     {"with", TokenKind::KwWith},
    {"as", TokenKind::KwAs},         {"true", TokenKind::KwTrue},
    {"false", TokenKind::KwFalse},
};

// Which power of ten a float literal's leading digit stands for; tells an overflow (positive)
// from an underflow when from_chars reports the value out of range.
int64_t decimal_magnitude(std::string_view literal) {
  size_t i = 0;
  int64_t magnitude = 0;
  bool seen_nonzero = false;
  for (; i < literal.size() && is_digit(literal[i]); ++i) {
    if (literal[i] != '0') seen_nonzero = true;
    if (seen_nonzero) ++magnitude;
  }
  if (i < literal.size() && literal[i] == '.') {
    for (++i; i < literal.size() && is_digit(literal[i]); ++i) {
      if (seen_nonzero) continue;
      if (literal[i] != '0')
        seen_nonzero = true;
      else
        --magnitude;
    }
  }
  if (i < literal.size() && (literal[i] == 'e' || literal[i] == 'E')) {
    ++i;
    bool negative = false;
    if (i < literal.size() && (literal[i] == '+' || literal[i] == '-'))
      negative = literal[i++] == '-';
    int64_t exponent = 0;
    for (; i < literal.size() && is_digit(literal[i]); ++i) {
      exponent = std::min<int64_t>(exponent * 10 + (literal[i] - '0'), int64_t{1} << 40);
    }
    magnitude += negative ? -exponent : exponent;
  }
  return magnitude;
}

class Lexer {
 public:
  Lexer(FileId file, std::string_view text, DiagnosticEngine& diags)
      : file_(file), text_(text), diags_(diags) {}

  std::vector<Token> run() {
    std::vector<Token> tokens;
    // Tokens average several bytes; reserving avoids repeated growth (and copies) on large inputs.
    tokens.reserve(text_.size() / 2 + 16);
    for (;;) {
      skip_whitespace_and_comments();
      Token token = next_token();
      const bool done = token.kind == TokenKind::Eof;
      tokens.push_back(token);
      if (done) break;
    }
    return tokens;
  }

 private:
  bool at_end() const { return pos_ >= text_.size(); }
  unsigned char peek(size_t ahead = 0) const {
    return pos_ + ahead < text_.size() ? static_cast<unsigned char>(text_[pos_ + ahead]) : 0;
  }
  SourceLoc loc_at(size_t offset) const {
    return {file_, line_, static_cast<uint32_t>(offset - line_start_ + 1)};
  }

  void skip_whitespace_and_comments() {
    while (!at_end()) {
      const unsigned char c = peek();
      if (c == '\n') {
        ++pos_;
        ++line_;
        line_start_ = pos_;
        line_has_token_ = false;
      } else if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
        ++pos_;
      } else if (c == '#' || (c == '/' && peek(1) == '/')) {
        while (!at_end() && peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  Token make(TokenKind kind, size_t start) {
    Token token;
    token.kind = kind;
    token.loc = loc_at(start);
    token.text = text_.substr(start, pos_ - start);
    token.first_on_line = !line_has_token_;
    line_has_token_ = true;
    return token;
  }

  Token next_token() {
    const size_t start = pos_;
    if (at_end()) {
      Token eof = make(TokenKind::Eof, start);
      eof.first_on_line = true;
      return eof;
    }
    const unsigned char c = peek();
    if (is_ident_start(c)) return identifier(start);
    if (is_digit(c)) return number(start);
    if (c == '"') return string(start);
    ++pos_;
    switch (c) {
      case '(':
        return make(TokenKind::LParen, start);
      case ')':
        return make(TokenKind::RParen, start);
      case '[':
        return make(TokenKind::LBracket, start);
      case ']':
        return make(TokenKind::RBracket, start);
      case '{':
        return make(TokenKind::LBrace, start);
      case '}':
        return make(TokenKind::RBrace, start);
      case ',':
        return make(TokenKind::Comma, start);
      case ':':
        return make(TokenKind::Colon, start);
      case ';':
        return make(TokenKind::Semicolon, start);
      case '?':
        return make(TokenKind::Question, start);
      case '=':
        if (peek() == '=') {
          ++pos_;
          return make(TokenKind::EqualEqual, start);
        }
        return make(TokenKind::Equals, start);
      case '^':
        return make(TokenKind::Caret, start);
      case '<':
        if (peek() == '=') {
          ++pos_;
          return make(TokenKind::LessEqual, start);
        }
        return make(TokenKind::Less, start);
      case '>':
        if (peek() == '=') {
          ++pos_;
          return make(TokenKind::GreaterEqual, start);
        }
        return make(TokenKind::Greater, start);
      case '!':
        if (peek() == '=') {
          ++pos_;
          return make(TokenKind::NotEqual, start);
        }
        break;
      case '+':
        return make(TokenKind::Plus, start);
      case '*':
        return make(TokenKind::Star, start);
      case '/':
        return make(TokenKind::Slash, start);
      case '%':
        return make(TokenKind::Percent, start);
      case '-':
        if (peek() == '>') {
          ++pos_;
          return make(TokenKind::Arrow, start);
        }
        return make(TokenKind::Minus, start);
      default:
        break;
    }
    return stray_bytes(start, c);
  }

  // A run of bytes that cannot start a token (a UTF-8 character, binary junk) is one error, not
  // one per byte, so a pasted symbol does not use up the error limit.
  Token stray_bytes(size_t start, unsigned char first) {
    while (!at_end()) {
      if (ends_stray_run(peek())) break;
      ++pos_;
    }
    Token token = make(TokenKind::Invalid, start);
    token.has_error = true;
    diags_.error(token.loc, fmt::format("unexpected character {}", describe_byte(first)),
                 first >= 0x80 ? "names and numbers are ASCII; other text belongs in strings and "
                                 "comments"
                               : "outside strings and comments only names, numbers and "
                                 "( ) [ ] { } , : ; = + - * / % ^ < > <= >= == != -> may appear");
    return token;
  }

  Token identifier(size_t start) {
    while (!at_end() && is_ident_char(peek())) ++pos_;
    Token token = make(TokenKind::Ident, start);
    for (const Keyword& keyword : kKeywords) {
      if (token.text == keyword.spelling) token.kind = keyword.kind;
    }
    if (token.text.size() > kMaxIdentifierBytes) {
      token.has_error = true;
      diags_.error(token.loc,
                   fmt::format("identifier is too long ({} bytes; the limit is {})",
                               token.text.size(), kMaxIdentifierBytes),
                   "use a shorter name");
    }
    return token;
  }

  Token number(size_t start) {
    while (!at_end() && is_digit(peek())) ++pos_;
    bool is_float = false;
    if (peek() == '.' && is_digit(peek(1))) {
      is_float = true;
      ++pos_;
      while (!at_end() && is_digit(peek())) ++pos_;
    } else if (peek() == '.') {
      ++pos_;
      return bad_number(start, "expected a digit after the '.' of a number",
                        "write fractions with digits on both sides of the point, e.g. 1.0");
    }
    if (peek() == 'e' || peek() == 'E') {
      const size_t sign = (peek(1) == '+' || peek(1) == '-') ? 1 : 0;
      if (!is_digit(peek(1 + sign))) {
        pos_ += 1 + sign;
        return bad_number(start, "expected digits in the exponent of a number",
                          "write exponents with digits, e.g. 1e-5");
      }
      is_float = true;
      pos_ += 1 + sign;
      while (!at_end() && is_digit(peek())) ++pos_;
    }
    if (is_ident_char(peek())) {
      return bad_number(start, "a number must not be followed directly by a letter",
                        "put a space or an operator between a number and a name");
    }
    Token token = make(is_float ? TokenKind::Float : TokenKind::Int, start);
    if (is_float) {
      float_value(token);
    } else {
      int_value(token);
    }
    return token;
  }

  // Consumes the rest of a malformed number (letters and digits glued to it) as one Invalid token.
  Token bad_number(size_t start, std::string_view message, std::string_view hint) {
    while (!at_end() && (is_ident_char(peek()) || peek() == '.')) ++pos_;
    Token token = make(TokenKind::Invalid, start);
    token.has_error = true;
    diags_.error(token.loc, fmt::format("{}: '{}'", message, token.text), std::string(hint));
    return token;
  }

  void int_value(Token& token) {
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    int64_t value = 0;
    for (const char digit : token.text) {
      const int d = digit - '0';
      if (value > (kMax - d) / 10) {
        token.has_error = true;
        token.int_value = 0;
        diags_.error(token.loc,
                     fmt::format("integer literal is too large; the largest is {}", kMax));
        return;
      }
      value = value * 10 + d;
    }
    token.int_value = value;
  }

  void float_value(Token& token) {
    double value = 0.0;
    const char* first = token.text.data();
    const char* last = first + token.text.size();
    const auto [end, ec] = std::from_chars(first, last, value);
    if (ec == std::errc::result_out_of_range || (ec == std::errc() && std::isinf(value))) {
      if (decimal_magnitude(token.text) > 0) {
        token.has_error = true;
        token.float_value = 0.0;
        diags_.error(token.loc,
                     fmt::format("floating-point literal is too large; the largest is {}",
                                 std::numeric_limits<double>::max()));
        return;
      }
      // Too small for a double: it is zero, which is almost certainly not what was meant.
      diags_.warning(
          token.loc,
          fmt::format("floating-point literal '{}' is too small and becomes 0", token.text));
      value = 0.0;
    }
    token.float_value = value;
  }

  Token string(size_t start) {
    ++pos_;  // opening quote
    size_t decoded_bytes = 0;
    bool reported = false;
    for (;;) {
      if (at_end() || peek() == '\n') {
        Token token = make(TokenKind::Invalid, start);
        token.has_error = true;
        diags_.error(token.loc, "unterminated string",
                     "close the string with '\"' on the same line; write a newline as \\n");
        return token;
      }
      const unsigned char c = peek();
      if (c == '"') break;
      if (c == '\\') {
        const unsigned char escaped = peek(1);
        if (escaped != '"' && escaped != '\\' && escaped != 'n' && escaped != 't') {
          if (escaped == '\n' || pos_ + 1 >= text_.size()) {
            ++pos_;
            continue;  // the unterminated string is reported on the next round
          }
          reported = true;
          diags_.error(
              loc_at(pos_),
              fmt::format("unknown escape sequence '\\{}' in a string", byte_text(escaped)),
              "the escapes are \\\" \\\\ \\n and \\t");
        }
        pos_ += 2;
      } else if (c < 0x20 && c != '\t') {
        reported = true;
        diags_.error(loc_at(pos_),
                     fmt::format("control character {} in a string", describe_byte(c)),
                     "write a newline as \\n and a tab as \\t");
        ++pos_;
      } else {
        ++pos_;
      }
      ++decoded_bytes;
    }
    ++pos_;  // closing quote
    Token token = make(TokenKind::String, start);
    token.has_error = reported;
    if (decoded_bytes > kMaxStringBytes && !reported) {
      token.has_error = true;
      diags_.error(token.loc, fmt::format("string is too long ({} bytes; the limit is {})",
                                          decoded_bytes, kMaxStringBytes));
    }
    return token;
  }

  FileId file_;
  std::string_view text_;
  DiagnosticEngine& diags_;
  size_t pos_ = 0;
  uint32_t line_ = 1;
  size_t line_start_ = 0;
  bool line_has_token_ = false;
};

}  // namespace

std::vector<Token> lex(FileId file, const SourceManager& sources, DiagnosticEngine& diags) {
  return Lexer(file, sources.text(file), diags).run();
}

std::string decode_string_literal(std::string_view spelling) {
  if (spelling.size() >= 2 && spelling.front() == '"' && spelling.back() == '"') {
    spelling = spelling.substr(1, spelling.size() - 2);
  }
  std::string out;
  out.reserve(spelling.size());
  for (size_t i = 0; i < spelling.size(); ++i) {
    if (spelling[i] != '\\' || i + 1 == spelling.size()) {
      out.push_back(spelling[i]);
      continue;
    }
    switch (spelling[++i]) {
      case 'n':
        out.push_back('\n');
        break;
      case 't':
        out.push_back('\t');
        break;
      case '"':
        out.push_back('"');
        break;
      case '\\':
        out.push_back('\\');
        break;
      default:
        out.push_back('\\');
        out.push_back(spelling[i]);
        break;
    }
  }
  return out;
}

bool is_identifier(std::string_view text) {
  if (text.empty() || !is_ident_start(static_cast<unsigned char>(text[0]))) return false;
  for (const char c : text)
    if (!is_ident_char(static_cast<unsigned char>(c))) return false;
  return true;
}

std::string_view token_kind_name(TokenKind kind) {
  switch (kind) {
    case TokenKind::Eof:
      return "end of file";
    case TokenKind::Invalid:
      return "an invalid token";
    case TokenKind::Ident:
      return "a name";
    case TokenKind::Int:
      return "an integer";
    case TokenKind::Float:
      return "a number";
    case TokenKind::String:
      return "a string";
    case TokenKind::KwImport:
      return "'import'";
    case TokenKind::KwConst:
      return "'const'";
    case TokenKind::KwRecipe:
      return "'recipe'";
    case TokenKind::KwSequence:
      return "'sequence'";
    case TokenKind::KwUses:
      return "'uses'";
    case TokenKind::KwWith:
      return "'with'";
    case TokenKind::KwAs:
      return "'as'";
    case TokenKind::KwTrue:
      return "'true'";
    case TokenKind::KwFalse:
      return "'false'";
    case TokenKind::LParen:
      return "'('";
    case TokenKind::RParen:
      return "')'";
    case TokenKind::LBracket:
      return "'['";
    case TokenKind::RBracket:
      return "']'";
    case TokenKind::LBrace:
      return "'{'";
    case TokenKind::RBrace:
      return "'}'";
    case TokenKind::Comma:
      return "','";
    case TokenKind::Colon:
      return "':'";
    case TokenKind::Semicolon:
      return "';'";
    case TokenKind::Question:
      return "'?'";
    case TokenKind::Equals:
      return "'='";
    case TokenKind::Plus:
      return "'+'";
    case TokenKind::Minus:
      return "'-'";
    case TokenKind::Star:
      return "'*'";
    case TokenKind::Slash:
      return "'/'";
    case TokenKind::Percent:
      return "'%'";
    case TokenKind::Arrow:
      return "'->'";
    case TokenKind::Caret:
      return "'^'";
    case TokenKind::Less:
      return "'<'";
    case TokenKind::Greater:
      return "'>'";
    case TokenKind::LessEqual:
      return "'<='";
    case TokenKind::GreaterEqual:
      return "'>='";
    case TokenKind::EqualEqual:
      return "'=='";
    case TokenKind::NotEqual:
      return "'!='";
  }
  return "a token";
}

}  // namespace opfuse::dsl
