// The op registry is complete: every op kind has its CPU reference kernel, every user op its
// backward rule (docs/architecture.md, "Adding an op"). A new kind whose entry misses either fails
// here, before any graph reaches the missing piece.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ir/backward_rules.h"
#include "ir/pointwise_ops.h"
#include "reference/reference_kernels.h"
#include "support/assert.h"

namespace opfuse {
namespace {

// Every kind an executor may meet: the fixed ones but Fused (it runs its parts), and the forward
// and backward kind of every pointwise definition.
std::vector<ir::OpKind> executable_kinds() {
  std::vector<ir::OpKind> kinds;
  for (size_t k = 0; k < ir::kNumOpKinds; ++k)
    if (ir::OpKind(k) != ir::OpKind::Fused) kinds.push_back(ir::OpKind(k));
  for (const ir::PointwiseDef* def : ir::pointwise_defs()) {
    kinds.push_back(ir::pointwise_kind(*def));
    kinds.push_back(ir::pointwise_backward_kind(*def));
  }
  return kinds;
}

std::string describe(ir::OpKind kind) {
  const ir::PointwiseDef* def = ir::pointwise_def(kind);
  return std::string(ir::op_info(kind).name) + (def ? " of " + std::string(def->name) : "");
}

TEST(OpRegistry, EveryKindHasAReferenceKernel) {
  for (const ir::OpKind kind : executable_kinds()) {
    EXPECT_NE(cpu::reference_kernel<float>(kind), nullptr) << describe(kind);
    EXPECT_NE(cpu::reference_kernel<double>(kind), nullptr) << describe(kind);
  }
}

TEST(OpRegistry, FusedOpsAndUnknownKindsHaveNoReferenceKernel) {
  EXPECT_EQ(cpu::reference_kernel<float>(ir::OpKind::Fused), nullptr);
  EXPECT_EQ(cpu::reference_kernel<float>(ir::OpKind(ir::kFirstPointwise - 1)), nullptr);
}

TEST(OpRegistry, EveryUserOpHasABackwardRule) {
  ASSERT_FALSE(ir::all_ops().empty());
  for (const ir::OpInfo& op : ir::all_ops()) {
    ASSERT_NE(op.backward, nullptr) << op.name;
    EXPECT_EQ(ir::backward_rule(op.kind), op.backward) << op.name;
  }
}

// One rule serves every pointwise op: the backward kind it emits names the definition.
TEST(OpRegistry, PointwiseOpsShareOneBackwardRule) {
  for (const ir::PointwiseDef* def : ir::pointwise_defs())
    EXPECT_EQ(ir::op_info(ir::pointwise_kind(*def)).backward, &ir::backward::pointwise)
        << def->name;
}

TEST(OpRegistry, AKindWithoutABackwardRuleIsAnInternalErrorNamingIt) {
  for (const ir::OpKind kind : executable_kinds()) {
    if (!ir::is_internal(kind)) continue;  // pointwise backward kinds are internal too
    EXPECT_EQ(ir::op_info(kind).backward, nullptr) << describe(kind);
    try {
      ir::backward_rule(kind);
      ADD_FAILURE() << describe(kind) << " has a backward rule";
    } catch (const InternalError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(ir::op_info(kind).name)), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace opfuse
