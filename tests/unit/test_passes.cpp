// Pass manager behaviour and the passes of passes/pipeline.cpp.
#include <gtest/gtest.h>

#include <algorithm>

#include "driver/frontend.h"
#include "ir/printer.h"
#include "passes/eliminate_aliases.h"
#include "passes/pass_manager.h"
#include "passes/pipeline.h"
#include "support/assert.h"

namespace opfuse {
namespace {

ir::Program build_or_fail(const std::string& text) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  auto p = load_program_from_source("p.fuse", text, sources, diags);
  EXPECT_TRUE(p) << diags.format_all();
  return p ? *p : ir::Program{};
}

const char* kAliases = R"(sequence s(x: bf16[t, 64]) -> (y: bf16[t, 64], e: bf16[t, 64]) {
  identity()
  rmsnorm(64)
  make_extra_output(e)
  reshape([t, 64])
  identity()
  gelu()
}
)";

TEST(EliminateAliases, RemovesIdentityAndSameShapeReshapeAndRewires) {
  ir::Program p = build_or_fail(kAliases);
  ASSERT_EQ(p.sequences[0].ops.size(), 6u);
  EXPECT_TRUE(passes::eliminate_aliases(p));
  const ir::Sequence& s = p.sequences[0];
  ASSERT_EQ(s.ops.size(), 3u);
  EXPECT_EQ(s.ops[0].kind, ir::OpKind::RMSNorm);
  EXPECT_EQ(s.ops[0].operands[0], s.inputs[0]);
  EXPECT_EQ(ir::op_info(s.ops[2].kind).name, "gelu");
  EXPECT_EQ(s.ops[2].operands[0], s.ops[1].results[0]);  // gelu reads the extra output
  EXPECT_EQ(s.outputs[1].value, s.ops[1].results[0]);
  EXPECT_FALSE(passes::eliminate_aliases(p));  // nothing left to do
}

TEST(EliminateAliases, KeepsAReshapeThatChangesTheShape) {
  ir::Program p =
      build_or_fail("sequence s(x: bf16[t, 64]) -> (y: bf16[t, 2, 32]) { reshape([t, 2, 32]) }\n");
  EXPECT_FALSE(passes::eliminate_aliases(p));
  EXPECT_EQ(p.sequences[0].ops.size(), 1u);
}

TEST(PassManager, DisablePrintAfterStopAfterAndTimings) {
  passes::PassManager manager(passes::default_pipeline());
  ir::Program p = build_or_fail(kAliases);
  passes::PassOptions options;
  options.print_after.insert("all");
  std::vector<std::string> printed;
  auto timings = manager.run(
      p, options, [&](std::string_view name, const ir::Program&) { printed.emplace_back(name); });
  ASSERT_EQ(timings.size(), manager.passes().size());
  EXPECT_TRUE(timings[0].changed);
  EXPECT_GE(timings[0].milliseconds, 0.0);
  // plan-quantization changes nothing under bf16, so it is not printed.
  EXPECT_EQ(printed, (std::vector<std::string>{"eliminate-aliases", "build-backward"}));

  // Unchanged passes are not printed; disabled passes do not run.
  ir::Program q = build_or_fail(kAliases);
  options.disabled.insert("eliminate-aliases");
  printed.clear();
  timings = manager.run(
      q, options, [&](std::string_view name, const ir::Program&) { printed.emplace_back(name); });
  EXPECT_TRUE(timings[0].skipped);
  EXPECT_EQ(printed, std::vector<std::string>{"build-backward"});
  EXPECT_EQ(std::count_if(q.sequences[0].ops.begin(), q.sequences[0].ops.end(),
                          [](const ir::Operation& op) { return op.phase == ir::Phase::Forward; }),
            6);
}

bool no_op(ir::Program&) { return false; }

TEST(PassManager, APassThatRequiresWhatNoEarlierPassProvidesIsAnInternalError) {
  EXPECT_THROW(
      passes::PassManager({{"use", "", no_op, {"thing"}, {}}, {"make", "", no_op, {}, {"thing"}}}),
      InternalError);
  EXPECT_NO_THROW(
      passes::PassManager({{"make", "", no_op, {}, {"thing"}}, {"use", "", no_op, {"thing"}, {}}}));
}

TEST(PassManager, DisablingAProviderOfAPassThatRunsIsReportedWithBothNames) {
  const passes::PassManager manager({{"make", "", no_op, {}, {"thing"}},
                                     {"other", "", no_op, {}, {}},
                                     {"use", "", no_op, {"thing"}, {}}});
  passes::PassOptions options;
  EXPECT_EQ(manager.broken_requirement(options), "");
  options.disabled = {"other"};
  EXPECT_EQ(manager.broken_requirement(options), "");
  options.disabled = {"make"};
  const std::string broken = manager.broken_requirement(options);
  EXPECT_EQ(broken,
            "pass 'make' is disabled, but pass 'use' requires the 'thing' that 'make' provides; "
            "disable 'use' as well, or keep 'make'");
  ir::Program program;
  EXPECT_THROW(manager.run(program, options, nullptr), passes::PassRequirementError);
  // Not when the pass that requires it is disabled too, or never runs (stop_after).
  options.disabled = {"make", "use"};
  EXPECT_EQ(manager.broken_requirement(options), "");
  options.disabled = {"make"};
  options.stop_after = "other";
  EXPECT_EQ(manager.broken_requirement(options), "");
}

// The pipeline's declarations: the backward before quantization, quantizers before fusion.
TEST(PassManager, TheDefaultPipelineDeclaresWhatItsPassesNeed) {
  const passes::PassManager manager(passes::default_pipeline());
  passes::PassOptions options;
  options.disabled = {"plan-quantization"};
  EXPECT_NE(manager.broken_requirement(options).find("pass 'fuse-forward' requires the "
                                                     "'quantizers' that 'plan-quantization'"),
            std::string::npos)
      << manager.broken_requirement(options);
  options.disabled = {"build-backward"};
  EXPECT_NE(manager.broken_requirement(options).find("pass 'plan-quantization' requires the "
                                                     "'backward' that 'build-backward'"),
            std::string::npos)
      << manager.broken_requirement(options);
  options.disabled = {"eliminate-aliases", "fuse-forward", "fuse-backward"};
  EXPECT_EQ(manager.broken_requirement(options), "");
}

TEST(PassManager, UnknownNamesAreReported) {
  const passes::PassManager manager(passes::default_pipeline());
  passes::PassOptions unknown;
  unknown.disabled.insert("no-such-pass");
  unknown.stop_after = "nor-this";
  EXPECT_EQ(manager.unknown_names(unknown), (std::vector<std::string>{"no-such-pass", "nor-this"}));
}

}  // namespace
}  // namespace opfuse
