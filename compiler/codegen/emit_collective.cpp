// The collectives of a tensor-parallel sequence (all_reduce, all_gather, reduce_scatter; their
// backward twins): one CollectiveStep each, which the executor runs through NCCL on the session's
// stream (runtime/comm). Never fused: NCCL's kernels are the transport. In a one-rank sequence
// (tp = 1) a collective is the identity, so it runs as a copy-free NCCL call over one rank.
#include <fmt/format.h>

#include "codegen/emit_groups.h"

namespace opfuse::codegen::emitters {

void emit_collective(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::AllReduce, OpKind::AllGather, OpKind::ReduceScatter});
  const ir::Operation& op = *g.parts.front();
  const ValueId x = op.operands.at(0);
  const ValueId y = op.results.at(0);
  const ir::Value& xv = b.value(x);
  CollectiveStep c;
  c.kind = op.kind == OpKind::AllReduce   ? plan::CollectiveKind::AllReduce
           : op.kind == OpKind::AllGather ? plan::CollectiveKind::AllGather
                                          : plan::CollectiveKind::ReduceScatter;
  c.dtype = xv.type.dtype;
  c.count = element_count_expr(xv.type.shape);
  c.input = b.buffer(x, op);
  c.output = b.buffer(y, op);
  const int tp = b.seq().parallel.tp;
  const char* what =
      c.kind == plan::CollectiveKind::AllReduce
          ? "sum over the {} ranks of {} {}"
          : (c.kind == plan::CollectiveKind::AllGather
                 ? "gather of the {} ranks' shares of {} {} (dim 0)"
                 : "sum over the {} ranks of {} {}, keeping this rank's share (dim 0)");
  b.add_collective(
      g,
      fmt::format(fmt::runtime(what), tp, name_of(xv.type.dtype), ir::shape_string(xv.type.shape)),
      std::move(c));
}

}  // namespace opfuse::codegen::emitters
