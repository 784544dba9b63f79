// The fusec command line: exit codes, --help/--version, and the options of `check` and `ir`.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "gpu/device.h"
#include "opfuse/version.h"
#include "test_support.h"

namespace opfuse {
namespace {

using test::contains;
using test::count;
using test::fusec;
using test::shell_quoted;

constexpr int kExitOk = 0;
constexpr int kExitUserError = 1;
constexpr int kExitUsage = 2;

std::string example(const std::string& name) {
  return shell_quoted(test::source_path("dsl_examples/" + name + ".fuse"));
}

// fusec's stdout alone (stderr dropped), and its stderr alone (stdout dropped).
test::CommandResult fusec_stdout(const std::string& args) {
  return test::run_command("{ " + test::fusec_path() + " " + args + " 2>/dev/null; }");
}
test::CommandResult fusec_stderr(const std::string& args) {
  return test::run_command("{ " + test::fusec_path() + " " + args + " 2>&1 >/dev/null; }");
}

// Writes `text` to a fresh temp file named `name` and returns its quoted path.
std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = test::make_temp_dir("fusec") + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return shell_quoted(path);
}

// Identity ops and a reshape to the same shape: what eliminate-aliases removes.
const char* kAliases =
    "sequence s(x: bf16[t, 64]) -> (y: bf16[t, 2, 32]) {\n"
    "  identity()\n"
    "  rmsnorm(64)\n"
    "  reshape([t, 64])\n"
    "  reshape([t, 2, 32])\n"
    "}\n";

// ---- exit codes -------------------------------------------------------------------------------

TEST(FusecExitCodes, CleanProgramExitsZero) {
  const auto r = fusec("check " + example("mlp"));
  EXPECT_EQ(r.exit_code, kExitOk) << r.output;
  EXPECT_EQ(r.output, "");
}

TEST(FusecExitCodes, UserErrorExitsOne) {
  const auto r =
      fusec("check " + shell_quoted(test::source_path("tests/errors/name_unknown_op.fuse")));
  EXPECT_EQ(r.exit_code, kExitUserError) << r.output;
  EXPECT_TRUE(contains(r.output, "error: unknown op 'layernrom'")) << r.output;
}

TEST(FusecExitCodes, UnknownOptionIsAUsageError) {
  const auto r = fusec("check --bogus " + example("mlp"));
  EXPECT_EQ(r.exit_code, kExitUsage) << r.output;
  EXPECT_TRUE(contains(r.output, "--bogus")) << r.output;
}

TEST(FusecExitCodes, MissingFileArgumentIsAUsageError) {
  const auto check = fusec("check");
  EXPECT_EQ(check.exit_code, kExitUsage) << check.output;
  EXPECT_TRUE(contains(check.output, "files is required")) << check.output;
  const auto ir = fusec("ir");
  EXPECT_EQ(ir.exit_code, kExitUsage) << ir.output;
  EXPECT_TRUE(contains(ir.output, "file is required")) << ir.output;
}

TEST(FusecExitCodes, NonexistentFileIsAUsageErrorNamingIt) {
  const auto r = fusec("check /nonexistent/opfuse-no-such.fuse");
  EXPECT_EQ(r.exit_code, kExitUsage) << r.output;
  EXPECT_TRUE(contains(r.output, "/nonexistent/opfuse-no-such.fuse")) << r.output;
}

TEST(FusecExitCodes, NoSubcommandIsAUsageError) {
  const auto r = fusec("");
  EXPECT_EQ(r.exit_code, kExitUsage) << r.output;
  EXPECT_TRUE(contains(r.output, "fusec: error: a command is required; commands: check ir run"))
      << r.output;
}

// A directory where a .fuse file is expected: the directory is named, for every command.
TEST(FusecExitCodes, DirectoryGivenAsAFileIsAUsageErrorNamingIt) {
  const std::string dir = test::source_path("dsl_examples");
  const auto check = fusec_stderr("check " + shell_quoted(dir));
  EXPECT_EQ(check.exit_code, kExitUsage) << check.output;
  EXPECT_EQ(check.output, "fusec: error: files: File is actually a directory: " + dir +
                              "\nfusec: run 'fusec check --help' for usage\n");
  for (const std::string command : {"ir", "run", "build -o /nonexistent/out",
                                    "dump-kernels -o /nonexistent/out", "bench", "debug-plan"}) {
    const auto r = fusec_stderr(command + " " + shell_quoted(dir));
    EXPECT_EQ(r.exit_code, kExitUsage) << command << ": " << r.output;
    EXPECT_EQ(r.output.rfind("fusec: error: ", 0), 0u) << command << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "File is actually a directory: " + dir)) << r.output;
  }
}

// CLI11's errors in fusec's form, on stderr alone, with the help of the command given.
TEST(FusecExitCodes, CommandLineErrorsArePrintedAsFusecErrors) {
  struct Case {
    std::string args;
    std::string error;
    std::string help;
  };
  const std::vector<Case> cases = {
      {"check --nope " + example("mlp"), "The following argument was not expected: --nope",
       "fusec check"},
      {"check", "files is required", "fusec check"},
      {"ir --after", "--after: 1 required TEXT missing", "fusec ir"},
      {"frobnicate " + example("mlp"),
       "unknown command 'frobnicate'; commands: check ir run build dump-kernels bench "
       "debug-plan debug-report merge-state split-state train",
       "fusec"},
      {"--nope", "a command is required; commands: check ir", "fusec"},
  };
  for (const Case& c : cases) {
    const auto r = fusec_stderr(c.args);
    EXPECT_EQ(r.exit_code, kExitUsage) << c.args << ": " << r.output;
    EXPECT_EQ(r.output.rfind("fusec: error: " + c.error, 0), 0u) << c.args << ": " << r.output;
    EXPECT_EQ(count(r.output, "\n"), 2u) << c.args << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "\nfusec: run '" + c.help + " --help' for usage\n"))
        << c.args << ": " << r.output;
    EXPECT_EQ(fusec_stdout(c.args).output, "") << c.args;
  }
}

TEST(FusecExitCodes, UnknownPassIsAUsageErrorListingThePasses) {
  const auto after = fusec("ir --after eliminate-alias " + example("mlp"));
  EXPECT_EQ(after.exit_code, kExitUsage) << after.output;
  EXPECT_TRUE(contains(after.output,
                       "fusec: error: unknown pass 'eliminate-alias'; passes: eliminate-aliases"))
      << after.output;
  const auto disabled = fusec("ir --disable-pass nope " + example("mlp"));
  EXPECT_EQ(disabled.exit_code, kExitUsage) << disabled.output;
  EXPECT_TRUE(contains(disabled.output, "unknown pass 'nope'")) << disabled.output;
}

// plan-quantization requires the backward that build-backward provides: disabling the provider
// alone is a usage error naming both passes, for every command that takes --disable-pass.
TEST(FusecExitCodes, DisablingAPassALaterPassRequiresIsAUsageError) {
  for (const std::string command : {"ir", "build -o /nonexistent/out", "dump-kernels -o /no/out"}) {
    const auto r = fusec(command + " --disable-pass build-backward " + example("mlp"));
    EXPECT_EQ(r.exit_code, kExitUsage) << command << ": " << r.output;
    EXPECT_TRUE(contains(r.output,
                         "fusec: error: pass 'build-backward' is disabled, but pass "
                         "'plan-quantization' requires the 'backward' that 'build-backward' "
                         "provides"))
        << command << ": " << r.output;
  }
  // Disabling every pass that needs it as well is fine: the forward IR, unquantized.
  const auto r = fusec(
      "ir --disable-pass build-backward --disable-pass plan-quantization --disable-pass "
      "fuse-forward --disable-pass fuse-backward " +
      example("mlp"));
  EXPECT_EQ(r.exit_code, kExitOk) << r.output;
  EXPECT_FALSE(contains(r.output, "backward")) << r.output;
}

// ---- --help and --version -----------------------------------------------------------------------

TEST(FusecHelp, HelpIsPrintedOnStdout) {
  const auto out = fusec_stdout("--help");
  EXPECT_EQ(out.exit_code, kExitOk) << out.output;
  EXPECT_TRUE(contains(out.output, "Usage: fusec [OPTIONS] SUBCOMMAND")) << out.output;
  const auto err = fusec_stderr("--help");
  EXPECT_EQ(err.exit_code, kExitOk) << err.output;
  EXPECT_EQ(err.output, "");
  const auto check = fusec_stdout("check --help");
  EXPECT_EQ(check.exit_code, kExitOk) << check.output;
  EXPECT_TRUE(contains(check.output, "Usage: fusec check [OPTIONS] files...")) << check.output;
}

TEST(FusecHelp, HelpListsSubcommandsAndExitCodes) {
  const auto r = fusec("--help");
  EXPECT_EQ(r.exit_code, kExitOk) << r.output;
  EXPECT_TRUE(contains(r.output, "check")) << r.output;
  EXPECT_TRUE(contains(r.output, "ir")) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "Exit codes: 0 success, 1 errors in a .fuse program, 2 usage error, "
                       "3 internal error"))
      << r.output;
}

TEST(FusecHelp, SubcommandHelpAlsoListsExitCodes) {
  const auto r = fusec("ir --help");
  EXPECT_EQ(r.exit_code, kExitOk) << r.output;
  EXPECT_TRUE(contains(r.output, "--disable-pass")) << r.output;
  EXPECT_TRUE(contains(r.output, "2 usage error")) << r.output;
}

TEST(FusecHelp, VersionPrintsTheRuntimeVersion) {
  const auto r = fusec("--version");
  EXPECT_EQ(r.exit_code, kExitOk) << r.output;
  EXPECT_EQ(r.output, std::string("fusec (opfuse) ") + opfuse::version() + "\n");
}

// ---- ir options ---------------------------------------------------------------------------------

TEST(FusecIr, SequenceSelectsOneSequence) {
  const auto r = fusec("ir --sequence fc2 " + example("mlp_residual"));
  EXPECT_EQ(r.exit_code, kExitOk) << r.output;
  EXPECT_TRUE(contains(r.output, "sequence @fc2(")) << r.output;
  EXPECT_FALSE(contains(r.output, "sequence @fc1(")) << r.output;
  EXPECT_TRUE(contains(r.output, "recipe fp8 = delayed_scaling(")) << r.output;
}

TEST(FusecIr, UnknownSequenceIsAUserErrorListingTheSequences) {
  const auto r = fusec("ir --sequence fc3 " + example("mlp_residual"));
  EXPECT_EQ(r.exit_code, kExitUserError) << r.output;
  EXPECT_TRUE(contains(r.output, "fusec: error: no sequence 'fc3'")) << r.output;
  EXPECT_TRUE(contains(r.output, "sequences: fc1 fc2")) << r.output;
}

TEST(FusecIr, AfterAllPrintsTheBuildAndEachChangingPass) {
  const auto r = fusec("ir --after all " + temp_file("aliases.fuse", kAliases));
  ASSERT_EQ(r.exit_code, kExitOk) << r.output;
  const size_t build = r.output.find("// ----- IR after build -----\n");
  const size_t pass = r.output.find("// ----- IR after eliminate-aliases -----\n");
  ASSERT_NE(build, std::string::npos) << r.output;
  ASSERT_NE(pass, std::string::npos) << r.output;
  EXPECT_LT(build, pass);
  // The build shows both aliases; the pass's output has neither, and nothing is printed twice.
  const std::string before = r.output.substr(build, pass - build);
  const size_t next = r.output.find("// ----- IR after", pass + 1);
  const std::string after = r.output.substr(pass, next - pass);
  EXPECT_TRUE(contains(before, "identity(%x)")) << r.output;
  EXPECT_TRUE(contains(before, "{shape = [t, 64]}")) << r.output;
  EXPECT_FALSE(contains(after, "identity(")) << r.output;
  EXPECT_FALSE(contains(after, "{shape = [t, 64]}")) << r.output;
  EXPECT_TRUE(contains(after, "%0 = rmsnorm(%x,")) << r.output;
  // build, eliminate-aliases, build-backward; plan-quantization changes nothing under bf16.
  EXPECT_EQ(count(r.output, "sequence @s("), 3u) << r.output;
  EXPECT_FALSE(contains(r.output, "// ----- IR after plan-quantization")) << r.output;
}

TEST(FusecIr, AfterAPassPrintsTheIrWhereThePipelineStopped) {
  const auto r = fusec("ir --after eliminate-aliases " + temp_file("aliases.fuse", kAliases));
  ASSERT_EQ(r.exit_code, kExitOk) << r.output;
  EXPECT_FALSE(contains(r.output, "// ----- IR after")) << r.output;
  EXPECT_EQ(count(r.output, "sequence @s("), 1u) << r.output;
  EXPECT_FALSE(contains(r.output, "identity(")) << r.output;
  EXPECT_TRUE(contains(r.output, "%1 = reshape(%0) {shape = [t, 2, 32]} as \"reshape_1\""))
      << r.output;
}

TEST(FusecIr, DisablePassKeepsTheAliases) {
  const auto r =
      fusec("ir --disable-pass eliminate-aliases " + temp_file("aliases.fuse", kAliases));
  ASSERT_EQ(r.exit_code, kExitOk) << r.output;
  EXPECT_TRUE(contains(r.output, "%0 = identity(%x)")) << r.output;
  EXPECT_TRUE(contains(r.output, "{shape = [t, 64]}")) << r.output;
}

TEST(FusecIr, TimingsListEveryPassWithItsResult) {
  const std::string file = temp_file("aliases.fuse", kAliases);
  const auto r = fusec("ir --timings " + file);
  ASSERT_EQ(r.exit_code, kExitOk) << r.output;
  EXPECT_TRUE(contains(r.output, "pass")) << r.output;
  EXPECT_TRUE(contains(r.output, "ms")) << r.output;
  EXPECT_TRUE(contains(r.output, "eliminate-aliases")) << r.output;
  EXPECT_TRUE(contains(r.output, "changed")) << r.output;
  const auto skipped = fusec("ir --timings --disable-pass eliminate-aliases " + file);
  EXPECT_TRUE(contains(skipped.output, "disabled")) << skipped.output;
  const auto clean = fusec("ir --timings " + example("mlp"));
  EXPECT_TRUE(contains(clean.output, "no change")) << clean.output;
}

TEST(FusecIr, RecipeOptionReplacesTheSequencesRecipe) {
  const auto plain = fusec("ir " + example("mlp"));
  ASSERT_EQ(plain.exit_code, kExitOk) << plain.output;
  EXPECT_TRUE(contains(plain.output, "    uses fp8 {")) << plain.output;
  const auto bf16 = fusec("ir --recipe bf16 " + example("mlp"));
  ASSERT_EQ(bf16.exit_code, kExitOk) << bf16.output;
  EXPECT_TRUE(contains(bf16.output, "    uses bf16() {")) << bf16.output;
  EXPECT_FALSE(contains(bf16.output, "uses fp8")) << bf16.output;
}

TEST(FusecIr, UnknownRecipeOptionIsAUserError) {
  const auto r = fusec("check --recipe fp9 " + example("mlp"));
  EXPECT_EQ(r.exit_code, kExitUserError) << r.output;
  EXPECT_TRUE(contains(r.output, "--recipe 'fp9' is not a recipe of this program")) << r.output;
  EXPECT_TRUE(contains(r.output, "recipes: bf16, fp8")) << r.output;
}

// ---- check options ------------------------------------------------------------------------------

TEST(FusecCheck, WerrorTurnsAWarningIntoExitOne) {
  const std::string file =
      temp_file("warn.fuse",
                "sequence s(x: bf16[t, 64], r: bf16[t, 64]) -> (y: bf16[t, 64]) {\n  gelu()\n}\n");
  const auto plain = fusec("check " + file);
  EXPECT_EQ(plain.exit_code, kExitOk) << plain.output;
  EXPECT_TRUE(contains(plain.output, "warn.fuse:1:28: warning: extra input 'r'")) << plain.output;
  const auto strict = fusec("check --Werror " + file);
  EXPECT_EQ(strict.exit_code, kExitUserError) << strict.output;
  EXPECT_TRUE(contains(strict.output, "warn.fuse:1:28: error: extra input 'r'")) << strict.output;
}

TEST(FusecCheck, SeveralFilesWithOneBadReportTheBadOne) {
  const std::string bad =
      shell_quoted(test::source_path("tests/errors/shape_linear_in_mismatch.fuse"));
  const auto r = fusec("check " + example("mlp") + " " + bad + " " + example("mlp_residual"));
  EXPECT_EQ(r.exit_code, kExitUserError) << r.output;
  EXPECT_TRUE(contains(r.output, "shape_linear_in_mismatch.fuse:5:10: error: in = 32")) << r.output;
  EXPECT_TRUE(contains(r.output, "shape_linear_in_mismatch.fuse: 1 error, 0 warnings")) << r.output;
  EXPECT_FALSE(contains(r.output, "mlp.fuse")) << r.output;
  EXPECT_FALSE(contains(r.output, "mlp_residual.fuse")) << r.output;
}

TEST(FusecCheck, TwentyFiveErrorsShowTwentyAndCountTheRest) {
  std::string text;
  for (int i = 0; i < 25; ++i)
    text += "const c" + std::to_string(i) + " = " + std::to_string(i) + " $\n";
  const auto r = fusec("check " + temp_file("many.fuse", text));
  EXPECT_EQ(r.exit_code, kExitUserError) << r.output;
  EXPECT_EQ(count(r.output, ": error: "), 20u) << r.output;
  EXPECT_TRUE(contains(r.output, "many.fuse:20:")) << r.output;
  EXPECT_FALSE(contains(r.output, "many.fuse:21:")) << r.output;
  EXPECT_TRUE(contains(r.output, "opfuse: note: 5 more errors not shown (limit 20)")) << r.output;
  EXPECT_TRUE(contains(r.output, "many.fuse: 25 errors, 0 warnings")) << r.output;
}

}  // namespace
}  // namespace opfuse

namespace opfuse {
namespace {

// `fusec run --nproc N` (docs/parallel.md): without N GPUs it says why and runs nothing; on the
// CPU an N other than the sequence's tp, or none, names the group size (the simulated ranks
// themselves: test_parallel_run.cpp).
TEST(FusecParallel, NprocNeedsAGpuPerRankAndTheSequencesTp) {
  const std::string file = shell_quoted(test::source_path("dsl_examples/mlp_tp.fuse"));
  const auto cpu = fusec("run --nproc 4 --device cpu " + file + " --bind tokens=64");
  EXPECT_EQ(cpu.exit_code, kExitUserError) << cpu.output;
  EXPECT_TRUE(contains(cpu.output, "run it with --nproc 2, not --nproc 4")) << cpu.output;
  const auto gpus = fusec("run --nproc 2 --device gpu " + file + " --bind tokens=64");
  if (!gpu::gpu_available()) {
    EXPECT_EQ(gpus.exit_code, kExitUserError) << gpus.output;
    EXPECT_TRUE(contains(gpus.output, "--nproc 2 starts one process per GPU, but this machine has"))
        << gpus.output;
  }
  const auto one = fusec("run --device cpu " + file + " --bind tokens=64");
  EXPECT_EQ(one.exit_code, kExitUserError) << one.output;
  EXPECT_TRUE(contains(one.output, "tensor-parallel over tp = 2 ranks")) << one.output;
  const auto bad = fusec("run --nproc 0 " + file + " --bind tokens=64");
  EXPECT_EQ(bad.exit_code, kExitUsage) << bad.output;
}

}  // namespace
}  // namespace opfuse
