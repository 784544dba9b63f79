// A generated corpus of hostile inputs through the whole front end, in process.
//
// The corpus is built here, deterministically (a fixed seed and our own generator, so every
// platform and standard library makes the same inputs), from dsl_examples/*.fuse and
// tests/errors/*.fuse: byte flips, deletions, duplicated slices, splices of two files,
// truncations, random binary, NUL bytes, huge lines, deep nesting, huge numbers and oversized
// sequences, signatures, files and import lists. Every input must end in a program without errors
// or in no program with at least one error: never a crash, a hang or an InternalError. The
// `asan` preset runs this under ASan+UBSan (label `frontend`), so the corpus is sized to finish in
// a few minutes there on two cores.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "driver/frontend.h"
#include "passes/pass_manager.h"
#include "passes/pipeline.h"
#include "support/assert.h"
#include "test_support.h"

namespace opfuse {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMinCorpusSize = 3000;
constexpr uint64_t kSeed = 0x0f05e5eed2024ull;
// At most this many failing inputs are saved and reported per family; the rest are counted.
constexpr int kMaxReportedFailures = 5;

// SplitMix64: tiny, fast and fully specified (std distributions differ between libraries).
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform enough in [0, n) for test data; n > 0.
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
  char byte() { return static_cast<char>(next() & 0xff); }

 private:
  uint64_t state_;
};

struct Case {
  std::string label;  // says how the input was made, for failure messages
  std::string text;
};

std::vector<std::string> read_dir(const std::string& dir) {
  std::vector<fs::path> paths;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_regular_file() && entry.path().extension() == ".fuse")
      paths.push_back(entry.path());
  std::sort(paths.begin(), paths.end());
  std::vector<std::string> texts;
  for (const auto& p : paths) texts.push_back(test::read_text(p.string()));
  return texts;
}

// The seeds every mutation starts from: the examples first, then the must-fail inputs.
const std::vector<std::string>& seeds() {
  static const std::vector<std::string> all = [] {
    auto texts = read_dir(test::source_path("dsl_examples"));
    auto errors = read_dir(test::source_path("tests/errors"));
    texts.insert(texts.end(), errors.begin(), errors.end());
    return texts;
  }();
  return all;
}

std::string repeat(const std::string& s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

// A valid program around `ops`, for inputs that stress one part of a sequence.
std::string sequence_with(const std::string& ops) {
  return "sequence s(x: bf16[t, 64]) -> (y: bf16[t, 64]) {\n" + ops + "}\n";
}

// ---- the families -------------------------------------------------------------------------------

std::vector<Case> byte_flips(Random& rng) {
  std::vector<Case> out;
  for (size_t s = 0; s < seeds().size(); ++s) {
    for (int variant = 0; variant < 10; ++variant) {
      std::string text = seeds()[s];
      if (text.empty()) continue;
      const size_t flips = 1 + rng.below(8);
      for (size_t i = 0; i < flips; ++i)
        text[rng.below(text.size())] ^= static_cast<char>(1 + rng.below(255));
      out.push_back(
          {"flip seed " + std::to_string(s) + " #" + std::to_string(variant), std::move(text)});
    }
  }
  return out;
}

std::vector<Case> deletions(Random& rng) {
  std::vector<Case> out;
  for (size_t s = 0; s < seeds().size(); ++s) {
    for (int variant = 0; variant < 8; ++variant) {
      std::string text = seeds()[s];
      if (text.empty()) continue;
      const size_t at = rng.below(text.size());
      // Mostly short cuts (a token or two), sometimes whole lines.
      const size_t length = 1 + rng.below(variant < 6 ? 8 : 120);
      text.erase(at, length);
      out.push_back(
          {"delete seed " + std::to_string(s) + " #" + std::to_string(variant), std::move(text)});
    }
  }
  return out;
}

std::vector<Case> duplications(Random& rng) {
  std::vector<Case> out;
  for (size_t s = 0; s < seeds().size(); ++s) {
    for (int variant = 0; variant < 6; ++variant) {
      std::string text = seeds()[s];
      if (text.empty()) continue;
      const size_t from = rng.below(text.size());
      const std::string slice = text.substr(from, 1 + rng.below(200));
      const size_t copies = 1 + rng.below(variant < 5 ? 3 : 50);
      text.insert(rng.below(text.size() + 1), repeat(slice, copies));
      out.push_back({"duplicate in seed " + std::to_string(s) + " #" + std::to_string(variant),
                     std::move(text)});
    }
  }
  return out;
}

std::vector<Case> splices(Random& rng) {
  std::vector<Case> out;
  const auto& all = seeds();
  for (int variant = 0; variant < 400; ++variant) {
    const size_t a = rng.below(all.size()), b = rng.below(all.size());
    const std::string& x = all[a];
    const std::string& y = all[b];
    std::string text = x.substr(0, rng.below(x.size() + 1)) + y.substr(rng.below(y.size() + 1));
    out.push_back({"splice seeds " + std::to_string(a) + "+" + std::to_string(b), std::move(text)});
  }
  return out;
}

// Token-level mutants that keep the file well-formed, so they reach name resolution, recipes and
// shape rules: a number replaced by an awkward value, a name replaced by another word.
std::vector<Case> token_swaps(Random& rng) {
  static const char* const kNumbers[] = {"0",
                                         "-1",
                                         "1",
                                         "3",
                                         "15",
                                         "17",
                                         "2",
                                         "4096",
                                         "-4096",
                                         "1.5",
                                         "1e-30",
                                         "9223372036854775807",
                                         "1099511627777",
                                         "(0 - 9223372036854775807 - 1)",
                                         "true",
                                         "[1, -1]"};
  static const char* const kWords[] = {"x",
                                       "y",
                                       "tokens",
                                       "hidden",
                                       "ffn",
                                       "fp8",
                                       "bf16",
                                       "fp32",
                                       "e4m3",
                                       "e5m2",
                                       "hybrid",
                                       "max",
                                       "most_recent",
                                       "residual",
                                       "linear",
                                       "swiglu",
                                       "gelu",
                                       "reshape",
                                       "identity",
                                       "make_extra_output",
                                       "add_extra_input",
                                       "quantize",
                                       "constant_scale",
                                       "layernorm",
                                       "delayed_scaling",
                                       "current_scaling",
                                       "fp8_weights",
                                       "mlp",
                                       "fc1",
                                       "bias",
                                       "eps",
                                       "size"};
  auto is_word = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
  };
  std::vector<Case> out;
  const size_t examples = read_dir(test::source_path("dsl_examples")).size();
  for (int variant = 0; variant < 700; ++variant) {
    // Mostly the valid examples: their mutants get furthest.
    const size_t s = variant % 4 == 3 ? rng.below(seeds().size()) : rng.below(examples);
    std::string text = seeds()[s];
    for (size_t swaps = 1 + rng.below(2); swaps > 0; --swaps) {
      // Find the token under a random position (skipping comments is not needed: they stay
      // comments).
      size_t at = rng.below(text.size() + 1);
      while (at < text.size() && !is_word(text[at])) ++at;
      if (at >= text.size()) continue;
      size_t begin = at, end = at;
      while (begin > 0 && is_word(text[begin - 1])) --begin;
      while (end < text.size() && is_word(text[end])) ++end;
      const bool number = std::isdigit(static_cast<unsigned char>(text[begin])) != 0;
      const std::string with =
          number ? kNumbers[rng.below(std::size(kNumbers))] : kWords[rng.below(std::size(kWords))];
      text.replace(begin, end - begin, with);
    }
    out.push_back({"token swap in seed " + std::to_string(s) + " #" + std::to_string(variant),
                   std::move(text)});
  }
  return out;
}

std::vector<Case> truncations() {
  std::vector<Case> out;
  for (size_t s = 0; s < seeds().size(); ++s) {
    const std::string& text = seeds()[s];
    for (size_t n = 0; n < text.size(); n += 97)
      out.push_back(
          {"truncate seed " + std::to_string(s) + " at " + std::to_string(n), text.substr(0, n)});
  }
  return out;
}

std::vector<Case> binary(Random& rng) {
  std::vector<Case> out;
  for (int variant = 0; variant < 150; ++variant) {
    std::string text(rng.below(4096), '\0');
    for (char& c : text) c = rng.byte();
    out.push_back({"random binary #" + std::to_string(variant), std::move(text)});
  }
  // Binary glued in front of and behind a valid program.
  for (int variant = 0; variant < 50; ++variant) {
    std::string junk(1 + rng.below(64), '\0');
    for (char& c : junk) c = rng.byte();
    const std::string& seed = seeds()[rng.below(seeds().size())];
    out.push_back({"binary around a seed #" + std::to_string(variant), junk + seed + junk});
  }
  return out;
}

std::vector<Case> nul_bytes(Random& rng) {
  std::vector<Case> out;
  for (size_t s = 0; s < seeds().size(); ++s) {
    std::string text = seeds()[s];
    const size_t count = 1 + rng.below(4);
    for (size_t i = 0; i < count; ++i) text.insert(rng.below(text.size() + 1), 1, '\0');
    out.push_back({"NUL in seed " + std::to_string(s), std::move(text)});
  }
  out.push_back({"only NULs", std::string(10000, '\0')});
  out.push_back({"NUL in an import path", std::string("import \"a\0b.fuse\"\n", 18)});
  out.push_back({"NUL in a string", std::string("const s = \"a\0b\"\n", 16)});
  out.push_back({"NUL in a comment", std::string("# a\0b\nconst a = 1\n", 18)});
  out.push_back({"NUL in a name", std::string("const a\0b = 1\n", 14)});
  return out;
}

std::vector<Case> huge_lines() {
  const size_t k64 = 64 * 1024, m2 = 2 * 1024 * 1024;
  std::vector<Case> out;
  for (size_t size : {k64, m2}) {
    const std::string n = std::to_string(size);
    out.push_back({n + "-byte identifier", "const " + std::string(size, 'a') + " = 1\n"});
    out.push_back({n + "-byte comment", "# " + std::string(size, 'c') + "\nconst a = 1\n"});
    out.push_back({n + "-byte string", "import \"" + std::string(size, 's') + "\"\n"});
    out.push_back({n + "-byte unterminated string", "import \"" + std::string(size, 's')});
    out.push_back({n + "-byte number", "const a = " + std::string(size, '7') + "\n"});
    out.push_back({n + "-byte line of '$'", std::string(size, '$')});
    out.push_back({n + "-byte chain of '+'", "const a = 1" + repeat(" + 1", size / 4) + "\n"});
    out.push_back({n + "-byte argument list",
                   sequence_with("  rmsnorm(" + repeat("64, ", size / 4) + ")\n")});
    out.push_back({n + "-byte dim list",
                   "sequence s(x: bf16[" + repeat("2, ", size / 3) + "]) -> (y: bf16[2]) {}\n"});
    out.push_back({n + "-byte one-line program", repeat("const a = 1 ", size / 12)});
  }
  return out;
}

// Op definitions (docs/language.md, "User-defined ops") at their limits: deep nesting of
// calls, powers and comparisons, chains of ops that would grow exponentially if each call were
// lowered anew, huge expressions, random expressions over the op grammar's tokens.
// Fusion declarations: steps, arguments and punctuation in random order, with ops of both
// phases, user ops and names that are none, against a sequence the fusion may match.
std::vector<Case> fusion_declarations(Random& rng) {
  std::vector<Case> out;
  static const char* const kTokens[] = {"constant_scale",
                                        "add_extra_input",
                                        "bias",
                                        "cast_fp8",
                                        "gelu",
                                        "linear",
                                        "linear_dgrad",
                                        "grad_add",
                                        "twice",
                                        "fused",
                                        "nope",
                                        "?",
                                        ";",
                                        "{",
                                        "}",
                                        "(",
                                        ")",
                                        "phase",
                                        "=",
                                        "backward",
                                        "forward",
                                        "priority",
                                        "-3",
                                        "1000",
                                        ",",
                                        "\n",
                                        "fusion",
                                        "op",
                                        "[",
                                        "0.5"};
  const std::string use =
      "sequence s(x: bf16[t, 64], r: bf16[t, 64]) -> (y: bf16[t, 64]) {\n"
      "  constant_scale(0.5)\n  twice()\n  add_extra_input(r)\n}\n";
  for (int variant = 0; variant < 300; ++variant) {
    std::string text = "op twice(x) = 2 * x\nfusion f";
    if (variant % 2 == 0) text += "(priority = 3) {";
    const size_t n = 1 + rng.below(16);
    for (size_t i = 0; i < n; ++i)
      text += std::string(" ") + kTokens[rng.below(std::size(kTokens))];
    if (variant % 3 != 0) text += " }";
    out.push_back({"fusion soup #" + std::to_string(variant), text + "\n" + use});
  }
  out.push_back({"axpy", "fusion axpy { constant_scale; add_extra_input }\n" + use});
  std::string many;
  for (int i = 0; i < 200; ++i)
    many += "fusion f" + std::to_string(i) + "(priority = " + std::to_string(i % 201 - 100) +
            ") { constant_scale; bias?; add_extra_input?; add_extra_input; cast_fp8? }\n";
  out.push_back({"200 fusions", many + use});
  out.push_back({"16 optional steps", "fusion f { constant_scale; add_extra_input" +
                                          repeat("; bias?", 14) + " }\n" + use});
  return out;
}

std::vector<Case> op_definitions(Random& rng) {
  std::vector<Case> out;
  const size_t depth = 10000;
  const std::string use = sequence_with("  f()\n");
  out.push_back({"10000 nested calls", "op f(x) = " + repeat("exp(", depth) + "x" +
                                           std::string(depth, ')') + "\n" + use});
  out.push_back({"10000 powers", "op f(x) = x" + repeat(" ^ x", depth) + "\n" + use});
  out.push_back({"10000 unary minus powers", "op f(x) = " + repeat("-x ^ ", depth) + "x\n" + use});
  out.push_back({"chained comparisons", "op f(x) = x < x < x\n" + use});
  // Each op calls the one before it twice with different arguments: 2^60 nodes if inlined.
  std::string doubling = "op f0(x) = x * x\n";
  for (int i = 1; i <= 60; ++i)
    doubling += "op f" + std::to_string(i) + "(x) = f" + std::to_string(i - 1) + "(x) * f" +
                std::to_string(i - 1) + "(x + " + std::to_string(i) + ")\n";
  out.push_back({"doubling chain", doubling + "op f(x) = f60(x)\n" + use});
  // The same with the same argument: hash-consing keeps it linear; it must build.
  std::string sharing = "op g0(x) = x * x\n";
  for (int i = 1; i <= 200; ++i)
    sharing += "op g" + std::to_string(i) + "(x) = g" + std::to_string(i - 1) + "(x) * g" +
               std::to_string(i - 1) + "(x)\n";
  out.push_back({"sharing chain", sharing + "op f(x) = tanh(g200(x))\n" + use});
  // Calls with other attribute values are lowered where they are made: nested past the limit,
  // each inside expressions nested to theirs, they must fail with an error, not the stack.
  std::string nested = "op h0(x, a: number = 1) = x * a\n";
  for (int i = 1; i <= 40; ++i)
    nested += "op h" + std::to_string(i) + "(x, a: number = 1) = " + repeat("-(", 30) + "h" +
              std::to_string(i - 1) + "(x, a = a + 1)" + std::string(30, ')') + "\n";
  out.push_back({"deep chain of attribute calls", nested + "op f(x) = h40(x)\n" + use});
  out.push_back({"4000 terms", "op f(x) = x" + repeat(" + x * 1.5", 4000) + "\n" + use});
  static const char* const kTokens[] = {
      "x",          "y",         "1",        "0.5",  "-",       "+",         "*",    "/",
      "^",          "<",         "<=",       ">",    ">=",      "==",        "!=",   "(",
      ")",          ",",         "[",        "]",    "select(", "exp(",      "log(", "sqrt(",
      "rsqrt(",     "tanh(",     "sigmoid(", "erf(", "abs(",    "min(",      "max(", "gelu(",
      "swiglu(",    "f(",        "g(",       "a",    "=",       "backward(", "dy",   "sum_last(",
      "mean_last(", "max_last(", "n("};
  for (int variant = 0; variant < 300; ++variant) {
    std::string text =
        variant % 3 == 0 ? "gated op f(x, a: number = 2) = " : "op f(x, a: number) = ";
    const size_t n = 1 + rng.below(24);
    for (size_t i = 0; i < n; ++i)
      text += std::string(kTokens[rng.below(std::size(kTokens))]) + " ";
    if (variant % 4 == 0) text += "\n  backward(x, dy) = dy * x";
    out.push_back({"op soup #" + std::to_string(variant),
                   "op g(x) = x\nop n(x) = x * rsqrt(sum_last(x * x) + 1e-6)\n" + text + "\n" +
                       sequence_with("  f(1)\n  g()\n  n()\n")});
  }
  // Learned parameters (`params(...)`): their list from the same kind of soup, then a body using
  // them, a backward giving their gradients (or not), and uses at widths that fit or do not.
  static const char* const kParamTokens[] = {"s",
                                             "w",
                                             ":",
                                             "fp32",
                                             "bf16",
                                             "int8",
                                             "[",
                                             "]",
                                             "64",
                                             "0",
                                             "-1",
                                             "1.5",
                                             "=",
                                             ",",
                                             "x",
                                             "a",
                                             "true",
                                             "(",
                                             ")",
                                             "[]",
                                             "[64]",
                                             "[64, 2]",
                                             "[1e3]",
                                             "dy",
                                             "s:",
                                             "tokens",
                                             "params(",
                                             "fp32[] = 1.0",
                                             "fp32[64] = 0.5",
                                             "\"s\""};
  for (int variant = 0; variant < 200; ++variant) {
    std::string text = variant % 5 == 0 ? "gated op f(x, y, a: number = 2) params("
                                        : "op f(x, a: number = 1) params(";
    const size_t n = rng.below(12);
    for (size_t i = 0; i < n; ++i)
      text += std::string(kParamTokens[rng.below(std::size(kParamTokens))]) + " ";
    if (variant % 2 == 0) text += std::string(n ? ", " : "") + "s: fp32[] = 2.0, w: fp32[64] = 1.0";
    text += ") = s * x * w";
    if (variant % 3 == 0) text += "\n  backward(x, dy) = [s * dy, x * dy, dy]";
    if (variant % 7 == 0) text += "\n  backward(x, dy) = s * dy";
    out.push_back({"params soup #" + std::to_string(variant),
                   text + "\nop g(x) = f(x)\n" +
                       sequence_with(variant % 2 == 0 ? "  f()\n  f(a = 3) as l\n" : "  f(2)\n")});
  }
  // Last-dimension reductions: more than the limit, nested deeply, through chains of norm-like
  // ops, in every place the language refuses them, and the standard library.
  std::string reductions = "op f(x) = x";
  for (int i = 0; i < 40; ++i) reductions += " + sum_last(x * " + std::to_string(i) + ")";
  out.push_back({"40 reductions", reductions + "\n" + use});
  out.push_back({"nested reductions",
                 "op f(x) = x" + repeat(" - mean_last(x", 30) + std::string(30, ')') + "\n" + use});
  std::string norm_chain = "op n0(x) = x - mean_last(x)\n";
  for (int i = 1; i <= 30; ++i)
    norm_chain += "op n" + std::to_string(i) + "(x) = n" + std::to_string(i - 1) + "(x) / " +
                  "max_last(n" + std::to_string(i - 1) + "(x))\n";
  out.push_back({"chain of norm-like ops", norm_chain + "op f(x) = n30(x)\n" + use});
  out.push_back({"reductions refused",
                 "import \"std\"\ngated op f(a, b) = sum_last(a) * l2_normalization(b)\n"
                 "op g(x) = x backward(x, dy) = max_last(dy)\nfusion h { l2_normalization }\n" +
                     use});
  out.push_back({"std twice",
                 "import \"std\"\nimport \"std\"\nop f(x) = l2_normalization(x, "
                 "eps = 0.1)\n" +
                     use});
  out.push_back({"many params", "op f(x) params(" + repeat("p: fp32[] = 1.0, ", 300) +
                                    "q: fp32[] = 0.0) = q * x\n" + use});
  out.push_back({"nine params",
                 "op f(x) params(a: fp32[] = 1.0, b: fp32[] = 1.0, c: fp32[] = 1.0, "
                 "d: fp32[] = 1.0, e: fp32[] = 1.0, g: fp32[] = 1.0, h: fp32[] = 1.0, "
                 "i: fp32[] = 1.0, j: fp32[] = 1.0) = a * x\n" +
                     use});
  return out;
}

std::vector<Case> deep_nesting() {
  std::vector<Case> out;
  const size_t depth = 10000;
  out.push_back(
      {"10000 '('", "const a = " + std::string(depth, '(') + "1" + std::string(depth, ')') + "\n"});
  out.push_back({"10000 '(' unclosed", "const a = " + std::string(depth, '(')});
  out.push_back(
      {"10000 '['", "const a = " + std::string(depth, '[') + "1" + std::string(depth, ']') + "\n"});
  out.push_back({"10000 '[' unclosed", "const a = " + std::string(depth, '[')});
  out.push_back({"10000 '-'", "const a = " + std::string(depth, '-') + "1\n"});
  out.push_back(
      {"10000 '- ('", "const a = " + repeat("-(", depth) + "1" + std::string(depth, ')') + "\n"});
  out.push_back(
      {"10000 '(' in an op argument", sequence_with("  rmsnorm(" + std::string(depth, '(') + "64" +
                                                    std::string(depth, ')') + ")\n")});
  out.push_back(
      {"10000 '[' in reshape", sequence_with("  reshape(" + std::string(depth, '[') + ")\n")});
  out.push_back({"10000 '-' in a dim",
                 "sequence s(x: bf16[" + std::string(depth, '-') + "1]) -> (y: bf16[1]) {}\n"});
  out.push_back({"10000 '{'", std::string(depth, '{')});
  out.push_back({"10000 '(' at top level", std::string(depth, '(')});
  // Just inside and just past the limit of 64.
  for (size_t d : {63, 64, 65})
    out.push_back({std::to_string(d) + " '('",
                   "const a = " + std::string(d, '(') + "1" + std::string(d, ')') + "\n"});
  return out;
}

std::vector<Case> huge_numbers() {
  std::vector<Case> out;
  const std::string digits300 = repeat("1234567890", 30);
  out.push_back({"300-digit integer", "const a = " + digits300 + "\n"});
  out.push_back({"300-digit float", "const a = " + digits300 + ".5\n"});
  out.push_back({"300-digit fraction", "const a = 0." + digits300 + "\n"});
  out.push_back({"1e999999", "const a = 1e999999\n"});
  out.push_back({"1e-999999", "const a = 1e-999999\n"});
  out.push_back({"1e+", "const a = 1e+\n"});
  out.push_back({"INT64_MAX + 1 in a dim",
                 "sequence s(x: bf16[9223372036854775807 + 1]) -> (y: bf16[1]) {}\n"});
  out.push_back({"-INT64_MIN", "const a = -(-9223372036854775807 - 1)\n"});
  out.push_back({"INT64_MIN / -1", "const a = (-9223372036854775807 - 1) / -1\n"});
  out.push_back({"INT64_MIN % -1", "const a = (-9223372036854775807 - 1) % -1\n"});
  out.push_back({"huge float times huge float", "const a = 1e300 * 1e300\n"});
  out.push_back({"eps = 1e999999", sequence_with("  rmsnorm(64, eps = 1e999999)\n")});
  out.push_back({"eps = 1e308 * 10", sequence_with("  rmsnorm(64, eps = 1e308 * 10)\n")});
  out.push_back({"linear of 2^40",
                 sequence_with("  linear(64, 1099511627776)\n  linear(1099511627776, 64)\n")});
  out.push_back({"dims whose product overflows",
                 "sequence s(x: bf16[1099511627776, 1099511627776, 1099511627776]) -> "
                 "(y: bf16[1099511627776, 1099511627776, 1099511627776]) {\n  reshape([-1])\n}\n"});
  out.push_back(
      {"amax_history = 10^300", "recipe r = delayed_scaling(amax_history = " + digits300 + ")\n"});
  out.push_back(
      {"scale = -1e38", sequence_with("  constant_scale(-3.4e38)\n  constant_scale(1e39)\n")});
  return out;
}

std::vector<Case> oversized() {
  std::vector<Case> out;
  out.push_back({"5000 ops", sequence_with(repeat("  gelu()\n", 5000))});
  out.push_back({"4000 ops", sequence_with(repeat("  identity()\n", 4000))});
  out.push_back({"2000 named ops", [] {
                   std::string ops;
                   for (int i = 0; i < 2000; ++i)
                     ops += "  relu() as r" + std::to_string(i % 1500) + "\n";
                   return sequence_with(ops);
                 }()});
  std::string inputs = "x: bf16[t, 64]";
  for (int i = 0; i < 300; ++i) inputs += ", r" + std::to_string(i) + ": bf16[t, 64]";
  out.push_back({"300 params", "sequence s(" + inputs + ") -> (y: bf16[t, 64]) {}\n"});
  std::string some = "x: bf16[t, 64]", adds;
  for (int i = 0; i < 200; ++i) {
    some += ", r" + std::to_string(i) + ": bf16[t, 64]";
    adds += "  add_extra_input(r" + std::to_string(i) + ")\n";
  }
  out.push_back({"200 extra inputs, all added",
                 "sequence s(" + some + ") -> (y: bf16[t, 64]) {\n" + adds + "}\n"});
  out.push_back({"300 args", sequence_with("  rmsnorm(" + repeat("64, ", 300) + ")\n")});
  out.push_back(
      {"300 recipe params", "recipe r = delayed_scaling(" + repeat("margin = 0, ", 300) + ")\n"});
  out.push_back({"300 flags", "sequence s(x: bf16[t, 64]) -> (y: bf16[t, 64]) with " +
                                  repeat("fp8_weights, ", 299) + "fp8_weights {}\n"});
  std::string decls;
  for (int i = 0; i < 20000; ++i)
    decls += "const c" + std::to_string(i) + " = " + std::to_string(i) + "\n";
  out.push_back({"20000 declarations", decls});
  out.push_back({"20000 duplicate declarations", repeat("const c = 1\n", 20000)});
  std::string chain = "const c0 = 1\n";
  for (int i = 1; i < 5000; ++i)
    chain += "const c" + std::to_string(i) + " = c" + std::to_string(i - 1) + " + 1\n";
  out.push_back({"5000 chained constants", chain});
  out.push_back({"20000 sequences", repeat("sequence s(x: bf16[t]) -> (y: bf16[t]) {}\n", 20000)});
  return out;
}

std::vector<Case> missing_imports() {
  std::vector<Case> out;
  std::string distinct;
  for (int i = 0; i < 2000; ++i)
    distinct += "import \"opfuse-missing-" + std::to_string(i) + ".fuse\"\n";
  out.push_back({"2000 distinct missing imports", distinct});
  out.push_back(
      {"2000 imports of one missing file", repeat("import \"opfuse-missing.fuse\"\n", 2000)});
  out.push_back({"deep missing path", "import \"" + repeat("missing/", 500) + "x.fuse\"\n"});
  out.push_back({"import of a directory", "import \".\"\nimport \"/\"\n"});
  out.push_back({"import of /dev/null", "import \"/dev/null\"\n"});
  out.push_back({"import between declarations",
                 "const a = 1\n" + repeat("import \"opfuse-missing.fuse\"\nconst b = a\n", 200)});
  return out;
}

using Family = std::vector<Case> (*)(Random&);

// Every family, each with its own generator state so adding a case to one family does not
// change the inputs of the others.
const std::map<std::string, std::vector<Case>>& corpus() {
  static const std::map<std::string, std::vector<Case>> all = [] {
    std::map<std::string, std::vector<Case>> families;
    auto random_family = [&](const std::string& name, Family make, uint64_t salt) {
      Random rng(kSeed ^ salt);
      families[name] = make(rng);
    };
    random_family("byte_flips", byte_flips, 1);
    random_family("deletions", deletions, 2);
    random_family("duplications", duplications, 3);
    random_family("splices", splices, 4);
    random_family("binary", binary, 5);
    random_family("nul_bytes", nul_bytes, 6);
    random_family("token_swaps", token_swaps, 7);
    random_family("op_definitions", op_definitions, 8);
    random_family("fusion_declarations", fusion_declarations, 9);
    families["truncations"] = truncations();
    families["huge_lines"] = huge_lines();
    families["deep_nesting"] = deep_nesting();
    families["huge_numbers"] = huge_numbers();
    families["oversized"] = oversized();
    families["missing_imports"] = missing_imports();
    return families;
  }();
  return all;
}

// Keeps a failing input where a developer can find it after the test (not in a temp dir that is
// removed at exit).
std::string save_failure(const std::string& family, size_t index, const std::string& text) {
  const fs::path path = fs::temp_directory_path() /
                        ("opfuse-fuzz-failure-" + family + "-" + std::to_string(index) + ".fuse");
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

// Runs one input through the front end and the pass pipeline; returns what went wrong, or "".
// `built` tells whether a program came back.
std::string run_one(const std::string& text, bool* built = nullptr) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  try {
    auto program = load_program_from_source("fuzz.fuse", text, sources, diags);
    const std::string rendered = diags.format_all();
    if (built) *built = program.has_value();
    if (program) {
      if (diags.has_errors()) return "a program was returned together with errors:\n" + rendered;
      const passes::PassManager manager(passes::default_pipeline());
      manager.run(*program, passes::PassOptions{}, nullptr);
    } else if (diags.error_count() == 0) {
      return "no program and no error";
    } else if (rendered.find(": error: ") == std::string::npos) {
      return "errors were counted but none was printed:\n" + rendered;
    }
  } catch (const InternalError& e) {
    return std::string("InternalError: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("exception: ") + e.what();
  }
  return {};
}

void run_family(const std::string& family) {
  const auto it = corpus().find(family);
  ASSERT_NE(it, corpus().end()) << family;
  ASSERT_FALSE(it->second.empty()) << family;
  int failures = 0;
  size_t programs = 0;
  for (size_t i = 0; i < it->second.size(); ++i) {
    const Case& c = it->second[i];
    bool built = false;
    const std::string problem = run_one(c.text, &built);
    programs += built;
    if (problem.empty()) continue;
    if (++failures <= kMaxReportedFailures) {
      ADD_FAILURE() << family << " input " << i << " (" << c.label
                    << "): " << problem.substr(0, 2000) << "\ninput saved to "
                    << save_failure(family, i, c.text);
    }
  }
  // How many mutants still build a program shows how deep the family reaches into the builder.
  ::testing::Test::RecordProperty("inputs", static_cast<int>(it->second.size()));
  ::testing::Test::RecordProperty("programs", static_cast<int>(programs));
  EXPECT_EQ(failures, 0) << family << ": " << failures << " of " << it->second.size()
                         << " inputs failed";
}

TEST(FuzzCorpus, HoldsAtLeast3000InputsInEveryFamily) {
  size_t total = 0;
  for (const auto& [name, cases] : corpus()) {
    EXPECT_FALSE(cases.empty()) << name;
    total += cases.size();
  }
  EXPECT_GE(total, kMinCorpusSize);
  EXPECT_GE(seeds().size(), 50u) << "the examples and tests/errors inputs seed the corpus";
}

TEST(FuzzCorpus, IsDeterministic) {
  Random a(kSeed), b(kSeed);
  std::vector<Case> first = byte_flips(a), second = byte_flips(b);
  ASSERT_EQ(first.size(), second.size());
  for (size_t i = 0; i < first.size(); ++i) ASSERT_EQ(first[i].text, second[i].text) << i;
}

TEST(FuzzCorpus, ByteFlips) { run_family("byte_flips"); }
TEST(FuzzCorpus, Deletions) { run_family("deletions"); }
TEST(FuzzCorpus, Duplications) { run_family("duplications"); }
TEST(FuzzCorpus, Splices) { run_family("splices"); }
TEST(FuzzCorpus, TokenSwaps) { run_family("token_swaps"); }
TEST(FuzzCorpus, TruncationsEvery97Bytes) { run_family("truncations"); }
TEST(FuzzCorpus, RandomBinary) { run_family("binary"); }
TEST(FuzzCorpus, NulBytes) { run_family("nul_bytes"); }
TEST(FuzzCorpus, HugeLines) { run_family("huge_lines"); }
TEST(FuzzCorpus, DeepNesting) { run_family("deep_nesting"); }
TEST(FuzzCorpus, OpDefinitions) { run_family("op_definitions"); }
TEST(FuzzCorpus, FusionDeclarations) { run_family("fusion_declarations"); }
TEST(FuzzCorpus, HugeNumbers) { run_family("huge_numbers"); }
TEST(FuzzCorpus, OversizedSequencesSignaturesAndFiles) { run_family("oversized"); }
TEST(FuzzCorpus, MissingImports) { run_family("missing_imports"); }

// The checks above must be able to fail: a well-formed program gives a program, a broken one
// gives errors, and both are told apart by run_one's rules.
TEST(FuzzCorpus, OracleAcceptsValidAndInvalidInputs) {
  EXPECT_EQ(run_one(sequence_with("  rmsnorm(64)\n")), "");
  EXPECT_EQ(run_one("const a = (1\n"), "");
  SourceManager sources;
  DiagnosticEngine diags(sources);
  EXPECT_TRUE(
      load_program_from_source("v.fuse", sequence_with("  gelu()\n"), sources, diags).has_value());
  EXPECT_FALSE(load_program_from_source("i.fuse", "const a = (1\n", sources, diags).has_value());
}

}  // namespace
}  // namespace opfuse
