// The .fuse parser: the AST of the seed example (golden), node details, error messages with exact
// locations, recovery, and the limits that keep hostile input bounded.
#include "dsl/parser.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <variant>
#include <vector>

#include "dsl/ast.h"
#include "support/diagnostics.h"
#include "support/source_manager.h"
#include "test_support.h"

namespace opfuse::dsl {
namespace {

class Parsed {
 public:
  explicit Parsed(std::string text, std::string name = "t.fuse") {
    file_ = sources_.add_buffer(std::move(name), std::move(text));
    module = parse_module(file_, sources_, diags);
  }
  // Each kept diagnostic as "file:line:col: message".
  std::vector<std::string> errors() const {
    std::vector<std::string> out;
    for (const Diagnostic& d : diags.diagnostics()) {
      out.push_back(sources_.name(d.loc.file) + ":" + std::to_string(d.loc.line) + ":" +
                    std::to_string(d.loc.col) + ": " + d.message);
    }
    return out;
  }
  std::string hint(size_t i) const { return diags.diagnostics().at(i).hint; }
  template <typename T>
  const T& decl(size_t i) const {
    return std::get<T>(module->decls.at(i));
  }

 private:
  SourceManager sources_;
  FileId file_ = kNoFile;

 public:
  DiagnosticEngine diags{sources_};
  std::unique_ptr<Module> module;
};

using Errors = std::vector<std::string>;

const char* kBody = "sequence s(x: bf16[t]) -> (y: bf16[t]) {\n";

TEST(Parser, SketchMatchesGoldenAst) {
  const std::string input_path = test::source_path("tests/golden/ast/sketch.fuse");
  const std::string golden_path = test::source_path("tests/golden/ast/sketch.ast");
  Parsed parsed(test::read_text(input_path), "sketch.fuse");
  ASSERT_EQ(parsed.errors(), Errors{});
  const std::string dump = dump_ast(*parsed.module);
  const char* update = std::getenv("OPFUSE_UPDATE_GOLDEN");
  if (update != nullptr && std::string(update) == "1") {
    std::ofstream(golden_path, std::ios::binary) << dump;
    GTEST_SKIP() << "rewrote " << golden_path;
  }
  EXPECT_EQ(dump, test::read_text(golden_path))
      << "run with OPFUSE_UPDATE_GOLDEN=1 to regenerate the golden after a deliberate change";
}

TEST(Parser, SketchDeclarationsInOrder) {
  Parsed parsed(test::read_text(test::source_path("tests/golden/ast/sketch.fuse")));
  ASSERT_EQ(parsed.module->decls.size(), 5u);
  EXPECT_EQ(parsed.decl<ConstDecl>(0).name, "hidden");
  EXPECT_EQ(parsed.decl<ConstDecl>(0).value->int_value, 4096);
  const auto& recipe = parsed.decl<RecipeDecl>(2);
  EXPECT_EQ(recipe.kind, "delayed_scaling");
  ASSERT_EQ(recipe.args.size(), 4u);
  EXPECT_EQ(*recipe.args[1].name, "amax_history");
  const auto& fc2 = parsed.decl<SequenceDecl>(4);
  EXPECT_EQ(fc2.recipe, "fp8");
  ASSERT_EQ(fc2.flags.size(), 1u);
  EXPECT_EQ(fc2.flags[0].name, "fp8_weights");
  ASSERT_EQ(fc2.body.size(), 3u);
  EXPECT_EQ(fc2.body[0].instance, "down_proj");
  EXPECT_EQ(fc2.close_loc, (SourceLoc{parsed.module->file, 17, 1}));
}

TEST(Parser, LiteralsBecomeTheirNodeKinds) {
  Parsed parsed(
      "const a = -1\nconst b = true\nconst c = false\nconst d = \"x\\ty\"\nconst e = 2.50\n"
      "const f = [1, -2, n,]\nconst g = []");
  ASSERT_EQ(parsed.errors(), Errors{});
  const Expr& a = *parsed.decl<ConstDecl>(0).value;
  ASSERT_EQ(a.kind, Expr::Kind::Unary);  // sema folds the minus
  EXPECT_EQ(a.op, '-');
  EXPECT_EQ(a.operands.at(0)->kind, Expr::Kind::Int);
  EXPECT_EQ(a.operands.at(0)->int_value, 1);
  EXPECT_EQ(parsed.decl<ConstDecl>(1).value->kind, Expr::Kind::Bool);
  EXPECT_EQ(parsed.decl<ConstDecl>(1).value->int_value, 1);
  EXPECT_EQ(parsed.decl<ConstDecl>(2).value->int_value, 0);
  EXPECT_EQ(parsed.decl<ConstDecl>(3).value->kind, Expr::Kind::String);
  EXPECT_EQ(parsed.decl<ConstDecl>(3).value->text, "x\ty");
  EXPECT_EQ(parsed.decl<ConstDecl>(4).value->text, "2.50");
  EXPECT_DOUBLE_EQ(parsed.decl<ConstDecl>(4).value->float_value, 2.5);
  EXPECT_EQ(parsed.decl<ConstDecl>(5).value->operands.size(), 3u);
  EXPECT_EQ(parsed.decl<ConstDecl>(6).value->kind, Expr::Kind::List);
  EXPECT_TRUE(parsed.decl<ConstDecl>(6).value->operands.empty());
}

TEST(Parser, OperatorPrecedenceAndLocations) {
  Parsed parsed("const x = 1 + 2 * -3 % (4 - 5) - 6");
  ASSERT_EQ(parsed.errors(), Errors{});
  EXPECT_EQ(dump_ast(*parsed.module), "const x = (- (+ 1 (% (* 2 (- 3)) (- 4 5))) 6) @1:7\n");
  const Expr& root = *parsed.decl<ConstDecl>(0).value;
  EXPECT_EQ(root.loc.col, 32u);               // the last '-'
  EXPECT_EQ(root.operands[0]->loc.col, 13u);  // '+'
  EXPECT_EQ(root.operands[1]->loc.col, 34u);  // 6
}

TEST(Parser, TrailingCommasAndSemicolonsAreAccepted) {
  Parsed parsed(
      "sequence s(x: bf16[t, h,], y: f32[],) -> (z: bf16[t],) with a, b {\n"
      "  linear(1, 2,); swiglu() as act; gelu()\n}\n");
  ASSERT_EQ(parsed.errors(), Errors{});
  const auto& seq = parsed.decl<SequenceDecl>(0);
  ASSERT_EQ(seq.inputs.size(), 2u);
  EXPECT_EQ(seq.inputs[0].type.dims.size(), 2u);
  EXPECT_TRUE(seq.inputs[1].type.dims.empty());
  EXPECT_EQ(seq.flags.size(), 2u);
  ASSERT_EQ(seq.body.size(), 3u);
  EXPECT_EQ(seq.body[1].instance, "act");
  EXPECT_EQ(seq.body[1].instance_loc, (SourceLoc{parsed.module->file, 2, 30}));
}

TEST(Parser, EmptySignaturesAndBody) {
  Parsed parsed("sequence s() -> () {}\nimport \"other.fuse\"");
  ASSERT_EQ(parsed.errors(), Errors{});
  EXPECT_EQ(dump_ast(*parsed.module),
            "sequence s @1:10\n  end @1:21\nimport \"other.fuse\" @2:8\n");
}

// ---- errors -----------------------------------------------------------------------------------

TEST(Parser, MissingCloseParenAfterArguments) {
  Parsed parsed(std::string(kBody) + "  linear(hidden, ffn as up_proj\n  swiglu()\n}\n");
  EXPECT_EQ(parsed.errors(),
            Errors{"t.fuse:2:22: expected ')' after the arguments of 'linear', found 'as'"});
  // Recovery resumes at the next line: the sequence keeps swiglu.
  const auto& seq = parsed.decl<SequenceDecl>(0);
  ASSERT_EQ(seq.body.size(), 1u);
  EXPECT_EQ(seq.body[0].op, "swiglu");
}

TEST(Parser, MissingCloseParenAtLineEnd) {
  Parsed parsed(std::string(kBody) + "  linear(hidden, ffn\n  swiglu()\n}\n");
  EXPECT_EQ(parsed.errors(),
            Errors{"t.fuse:3:3: expected ')' after the arguments of 'linear', found 'swiglu'"});
  EXPECT_EQ(parsed.decl<SequenceDecl>(0).body.size(), 1u);
}

TEST(Parser, MissingArrowBetweenSignatureLists) {
  Parsed parsed("sequence s(x: bf16[t]) (y: bf16[t]) {\n  bogus(1 2)\n}\n");
  EXPECT_EQ(parsed.errors(),
            (Errors{"t.fuse:1:24: expected '->' after the inputs of sequence 's', found '('",
                    "t.fuse:2:11: expected ')' after the arguments of 'bogus', found '2'"}));
  EXPECT_EQ(parsed.hint(0), "a sequence declares its outputs after '->'");
  EXPECT_EQ(parsed.hint(1), "separate arguments with ','");
}

TEST(Parser, BadTokenInDimList) {
  Parsed parsed("sequence s(x: bf16[tokens; hidden]) -> (y: bf16[:]) {}\nconst ok = 1");
  EXPECT_EQ(parsed.errors(),
            Errors{"t.fuse:1:26: expected ',' or ']' after a dim of parameter 'x', found ';'"});
  ASSERT_EQ(parsed.module->decls.size(), 1u);
  EXPECT_EQ(parsed.decl<ConstDecl>(0).name, "ok");

  Parsed missing_dim("sequence s(x: bf16[t, , h]) -> () {}");
  EXPECT_EQ(missing_dim.errors(),
            Errors{"t.fuse:1:23: expected a dim of parameter 'x', found ','"});
}

TEST(Parser, JunkBetweenOps) {
  Parsed parsed(std::string(kBody) +
                "  layernorm(h)\n  42 junk here\n  swiglu() extra\n  gelu()\n}\n");
  EXPECT_EQ(parsed.errors(),
            (Errors{"t.fuse:3:3: expected an op or '}' in the body of sequence 's', found '42'",
                    "t.fuse:5:3: expected '(' after op name 'extra', found 'gelu'"}));
  // Recovery keeps the ops around the junk.
  EXPECT_EQ(parsed.decl<SequenceDecl>(0).body.size(), 3u);
}

TEST(Parser, UnterminatedStringIsOneError) {
  Parsed parsed("import \"lib.fuse\nconst x = 1\nconst y = \"open\nconst z = 2\n");
  EXPECT_EQ(parsed.errors(),
            (Errors{"t.fuse:1:8: unterminated string", "t.fuse:3:11: unterminated string"}));
  ASSERT_EQ(parsed.module->decls.size(), 2u);
  EXPECT_EQ(parsed.decl<ConstDecl>(0).name, "x");
  EXPECT_EQ(parsed.decl<ConstDecl>(1).name, "z");
}

TEST(Parser, SeveralErrorsInOneRun) {
  Parsed parsed(
      "const = 4\n"
      "recipe r = delayed_scaling(margin = )\n"
      "sequence good(x: bf16[t]) -> (y: bf16[t]) { swiglu() }\n"
      "sequence bad(x bf16[t]) -> (y: bf16[t]) { swiglu() }\n"
      "sequence body(x: bf16[t]) -> (y: bf16[t]) {\n"
      "  linear(1,, 2)\n"
      "  gelu(\n"
      "  swiglu() as\n"
      "}\n"
      "const last = 1\n"
      "linear(3)\n");
  EXPECT_EQ(parsed.errors(),
            (Errors{"t.fuse:1:7: expected a name after 'const', found '='",
                    "t.fuse:2:37: expected a value for argument 'margin', found ')'",
                    "t.fuse:4:16: expected ':' after parameter 'x', found 'bf16'",
                    "t.fuse:6:12: expected an argument of 'linear', found ','",
                    "t.fuse:8:3: expected ')' after the arguments of 'gelu', found 'swiglu'",
                    "t.fuse:9:1: expected an instance name after 'as', found '}'",
                    "t.fuse:11:1: expected a declaration ('import', 'const', 'recipe' or "
                    "'sequence'), found 'linear'"}));
  EXPECT_EQ(parsed.hint(6),
            "ops belong in a sequence body: sequence NAME(inputs) -> (outputs) { op(...) }");
  // What parsed completely is kept.
  ASSERT_EQ(parsed.module->decls.size(), 3u);
  EXPECT_EQ(parsed.decl<SequenceDecl>(0).name, "good");
  EXPECT_EQ(parsed.decl<SequenceDecl>(1).name, "body");
  EXPECT_EQ(parsed.decl<ConstDecl>(2).name, "last");
}

TEST(Parser, MissingCloseBraceBeforeNextDeclaration) {
  Parsed parsed(std::string(kBody) + "  swiglu()\nsequence t() -> () {\n  gelu()\n");
  EXPECT_EQ(parsed.errors(),
            (Errors{"t.fuse:3:1: expected '}' to close the body of sequence 's' (opened at 1:40), "
                    "found 'sequence'",
                    "t.fuse:5:1: expected '}' to close the body of sequence 't' (opened at 3:20), "
                    "found end of file"}));
  ASSERT_EQ(parsed.module->decls.size(), 2u);
  EXPECT_EQ(parsed.decl<SequenceDecl>(1).body.size(), 1u);
}

TEST(Parser, KeywordsAreNotNames) {
  Parsed parsed("const as = 1\nsequence with() -> () {}\n");
  EXPECT_EQ(parsed.errors(),
            (Errors{"t.fuse:1:7: expected a name after 'const', found 'as'",
                    "t.fuse:2:10: expected a name after 'sequence', found 'with'"}));
}

TEST(Parser, LexerErrorsAreNotReportedTwice) {
  Parsed parsed(std::string(kBody) + "  linear(a $ b)\n  gelu(99999999999999999999)\n}\n");
  EXPECT_EQ(
      parsed.errors(),
      (Errors{"t.fuse:2:12: unexpected character '$'",
              "t.fuse:3:8: integer literal is too large; the largest is 9223372036854775807"}));
  EXPECT_EQ(parsed.decl<SequenceDecl>(0).body.size(), 1u);
}

TEST(Parser, BinaryInputEndsInDiagnosticsNotACrash) {
  std::string bytes;
  uint32_t state = 777;
  for (int i = 0; i < 100000; ++i) {
    state = state * 1664525u + 1013904223u;  // a fixed pseudo-random byte stream
    bytes.push_back(static_cast<char>(state >> 24));
  }
  Parsed parsed(bytes);
  ASSERT_NE(parsed.module, nullptr);
  EXPECT_GE(parsed.diags.error_count(), DiagnosticEngine::kDefaultErrorLimit);
  EXPECT_EQ(parsed.diags.diagnostics().size(), DiagnosticEngine::kDefaultErrorLimit);
  // The dump of whatever parsed is still well-formed text.
  EXPECT_EQ(dump_ast(*parsed.module).find('\0'), std::string::npos);
}

// ---- limits -----------------------------------------------------------------------------------

TEST(Parser, NestingAtTheLimitParses) {
  const size_t n = kMaxExprNesting;
  Parsed parsed("const x = " + std::string(n, '(') + "1" + std::string(n, ')') +
                "\nconst y = " + std::string(n, '-') + "1\n");
  EXPECT_EQ(parsed.errors(), Errors{});
  EXPECT_EQ(parsed.module->decls.size(), 2u);
}

TEST(Parser, NestingPastTheLimitIsOneErrorThenRecovery) {
  const size_t n = kMaxExprNesting + 1;
  Parsed parsed("const x = " + std::string(n, '(') + "1" + std::string(n, ')') +
                "\nconst ok = 1\n");
  EXPECT_EQ(parsed.errors(), Errors{"t.fuse:1:75: expression is nested too deeply (limit 64)"});
  ASSERT_EQ(parsed.module->decls.size(), 1u);
  EXPECT_EQ(parsed.decl<ConstDecl>(0).name, "ok");
}

TEST(Parser, MegabyteOfOpenParensGivesOneError) {
  Parsed parsed("const x = " + std::string(1 << 20, '(') + "\nconst ok = 1\n");
  EXPECT_EQ(parsed.errors(), Errors{"t.fuse:1:75: expression is nested too deeply (limit 64)"});
  EXPECT_EQ(parsed.module->decls.size(), 1u);
}

TEST(Parser, MegabyteOfMinusSignsInABodyGivesOneError) {
  Parsed parsed(std::string(kBody) + "  gelu(" + std::string(1 << 20, '-') + "1)\n  swiglu()\n}\n");
  EXPECT_EQ(parsed.errors(), Errors{"t.fuse:2:72: expression is nested too deeply (limit 64)"});
  EXPECT_EQ(parsed.decl<SequenceDecl>(0).body.size(), 1u);
}

TEST(Parser, LongOperatorChainsAndBracketsCountAsNesting) {
  std::string chain = "1";
  for (size_t i = 0; i < 200000; ++i) chain += "+1";
  Parsed parsed("const x = " + chain + "\nconst y = " + std::string(100000, '[') + "\n");
  EXPECT_EQ(parsed.errors(), (Errors{"t.fuse:1:140: expression is nested too deeply (limit 64)",
                                     "t.fuse:2:75: expression is nested too deeply (limit 64)"}));
}

TEST(Parser, ErrorLimitStopsTheParser) {
  std::string text = kBody;
  for (int i = 0; i < 50; ++i) text += "  op(1 2)\n";
  text += "}\n";
  Parsed parsed(text);
  EXPECT_EQ(parsed.diags.error_count(), DiagnosticEngine::kDefaultErrorLimit);
  EXPECT_EQ(parsed.diags.diagnostics().size(), DiagnosticEngine::kDefaultErrorLimit);
  EXPECT_EQ(parsed.errors().back(),
            "t.fuse:21:8: expected ')' after the arguments of 'op', found '2'");
}

TEST(Parser, OpsPerSequenceLimit) {
  std::string text = kBody;
  for (size_t i = 0; i < kMaxOpsPerSequence + 3; ++i) text += "  gelu()\n";
  text += "}\n";
  Parsed parsed(text);
  EXPECT_EQ(parsed.errors(), Errors{"t.fuse:4098:3: sequence 's' has more than 4096 ops"});
  EXPECT_EQ(parsed.decl<SequenceDecl>(0).body.size(), kMaxOpsPerSequence);
}

TEST(Parser, ParamsPerSignatureLimit) {
  std::string params;
  for (size_t i = 0; i <= kMaxParamsPerSignature; ++i)
    params += "p" + std::to_string(i) + ": f[1], ";
  Parsed parsed("sequence s(" + params + ") -> () {}");
  // "sequence s(" is 11 bytes, each "pN: f[1], " before p256 is 10, 11 or 12.
  const size_t col = 12 + 10 * 10 + 90 * 11 + 156 * 12;
  EXPECT_EQ(parsed.errors(),
            Errors{"t.fuse:1:" + std::to_string(col) + ": sequence 's' has more than 256 inputs"});
  EXPECT_EQ(parsed.decl<SequenceDecl>(0).inputs.size(), kMaxParamsPerSignature);
}

TEST(Parser, DimsPerTypeLimit) {
  std::string dims;
  for (size_t i = 0; i <= kMaxDimsPerType; ++i) dims += "1,";
  Parsed parsed("sequence s(x: f[" + dims + "]) -> () {}");
  EXPECT_EQ(parsed.errors(), Errors{"t.fuse:1:145: parameter 'x' has more than 64 dims"});
  EXPECT_EQ(parsed.decl<SequenceDecl>(0).inputs[0].type.dims.size(), kMaxDimsPerType);
}

TEST(Parser, ArgsPerCallLimit) {
  std::string args;
  for (size_t i = 0; i <= kMaxArgsPerCall; ++i) args += "1,";
  Parsed parsed(std::string(kBody) + "op(" + args + ")\n}\n");
  EXPECT_EQ(parsed.errors(), Errors{"t.fuse:2:516: 'op' has more than 256 arguments"});
  EXPECT_EQ(parsed.decl<SequenceDecl>(0).body.at(0).args.size(), kMaxArgsPerCall);
}

TEST(Parser, DeclarationsPerFileLimit) {
  std::string text;
  for (size_t i = 0; i < kMaxDeclsPerFile + 5; ++i) text += "const c = 1\n";
  Parsed parsed(text);
  EXPECT_EQ(parsed.errors(), Errors{"t.fuse:10001:1: the file has more than 10000 declarations"});
  EXPECT_EQ(parsed.module->decls.size(), kMaxDeclsPerFile);
}

}  // namespace
}  // namespace opfuse::dsl
