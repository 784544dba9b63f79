// Declarative fusion patterns (docs/design.md, "Passes"): a pattern is data, a chain of op steps
// linked by dataflow, and one engine (engine.cpp) matches every pattern the same way. Each
// pattern lives in its own file in this directory; patterns.cpp owns their priority order.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace opfuse::passes::fusion {

enum class Link : uint8_t {
  Start,     // step 0
  Consumes,  // reads step `from`'s first result (as any operand)
  Sibling,   // reads the same first operand as step `from` (two consumers of one tensor)
};

struct Step {
  std::span<const ir::OpKind> kinds{};
  // Instead of `kinds`: a trait of the op kind (ir::is_pointwise, ir::has_gelu_epilogue, ...), so
  // a new op with the trait fuses with no change here.
  bool (*is)(ir::OpKind) = nullptr;
  Link link = Link::Consumes;
  int from = 0;
  bool optional = false;
  // The first result may also be used outside the fused op (it then writes it); otherwise a
  // result another step reads must have no use outside the group.
  bool escapes_ok = false;
  bool (*when)(const ir::Sequence&, const ir::Operation&) = nullptr;
  // The fused kernel can compute the statistics of this step's first result (the tiled kernels'
  // kStats, templates/common/elementwise_tile.cuh): one whole-tensor statistics op reading it
  // (stats_can_fold) joins the group instead of keeping the result in memory.
  bool stats_ok = false;
  // A declared fusion's step naming a user-defined op: only that op of the carrier kind.
  std::string_view user_op{};
};

// The ops a match found, by step (nullptr for an optional step that was absent).
using Match = std::vector<const ir::Operation*>;

struct FusionPattern {
  std::string_view name;
  ir::Phase phase;
  std::span<const Step> steps;
  // A condition on the whole match (e.g. a linear has a bias from its attribute or a bias step).
  bool (*accept)(const ir::Sequence&, const Match&) = nullptr;
  std::string_view doc;
};

// Applies the patterns in order to the ops of `phase`; each op joins at most one fused op. The
// fused op stands at its last part's position, or at its first where an op between the parts
// reads a part's result and no part needs that op's (engine.cpp, fuse_position). Returns true
// when anything fused.
bool apply_patterns(ir::Sequence& seq, ir::Phase phase,
                    std::span<const FusionPattern* const> patterns);

// The patterns of `phase` in the order the fuse passes try them: the built-in ones (priority 0,
// patterns.cpp's order) and the program's declared fusions (ir::DeclaredFusion) by priority,
// higher first; ties keep the built-ins first, then declaration order. `storage` keeps the
// declared patterns alive while the result is used; their steps' kinds point into `program`.
struct DeclaredPatterns {
  std::vector<std::vector<Step>> steps;  // one per declared fusion
  std::vector<FusionPattern> patterns;
};
std::vector<const FusionPattern*> patterns_in_order(const ir::Program& program, ir::Phase phase,
                                                    DeclaredPatterns& storage);

// Conditions shared by several patterns.
// An FP8 cast can fold into its producer only under delayed scaling: current scaling needs the
// amax of the whole tensor before the first element is cast (TE computes it in a separate pass).
bool cast_can_fold(const ir::Sequence& seq, const ir::Operation& cast);

// An emulated_cast making an MXFP8 row-wise copy decoded to its source's dtype (not a quantized
// output's codes and scales, note "Quantized boundaries" in docs/architecture.md): a producer of
// the source can write it (norm_micro_cast, activation_micro_cast); NVFP4's cannot, its tensor
// scale needs the whole tensor's amax first.
bool mxfp8_rowwise_decoded(const ir::Sequence& seq, const ir::Operation& cast);

// A debug config's statistics op that a kernel reading or producing its tensor can compute
// instead: a LogTensorStats record of the whole tensor (no blockwise ranges; LogFp8TensorStats
// casts of its own stay separate kernels).
bool stats_can_fold(const ir::Sequence& seq, const ir::Operation& op);

// After the patterns of `phase`: each foldable statistics op that is still an op of its own moves
// into the kernel op that reads its tensor as its first input or produces it (a tiled activation
// or cast kernel, fused or not; docs/debugging.md, "Statistics fused into kernels"). Returns true
// when any moved.
bool fold_stats(ir::Sequence& seq, ir::Phase phase);

}  // namespace opfuse::passes::fusion
