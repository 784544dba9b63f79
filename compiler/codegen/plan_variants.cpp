// SequenceBuilder::add_inference_variants (note "Inference variants"), split from plan.cpp.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "codegen/kernel_templates.h"
#include "codegen/plan_builder.h"
#include "support/assert.h"

namespace opfuse::codegen {

// Note "Inference variants": an inference forward (RunMode::Inference) runs no backward, so a
// transposed FP8 copy that only backward reads (wgrad/dgrad operands) need not be computed,
// written or allocated there; TE likewise drops columnwise usage under no_grad. A candidate from
// add_launch() becomes the step's variant, with its own kernel (kWriteTranspose = false), unless
// the copy is read in forward or is an interface result (but a quantized output's column-wise
// copy), or the group is a weight cast (reads
// only parameters: the executor caches its outputs across forwards, so a variant would only cost
// a compile).
void SequenceBuilder::add_inference_variants() {
  auto root_of = [&](int id) { return out_.buffers[size_t(id)].root; };  // set before the passes
  std::vector<bool> read_in_forward(out_.buffers.size()), interface(out_.buffers.size());
  for (const Buffer& b : out_.buffers)
    if (!b.interface.empty()) interface[size_t(root_of(b.id))] = true;
  // A quantized output's column-wise copy (and its grid) is only for the consumer's backward:
  // an inference forward makes none (note "Quantized boundaries" in docs/architecture.md).
  if (seq_.quantized_output && seq_.quantized_output->columnwise != ir::kNoValue) {
    const int copy = buffer_of_.at(seq_.quantized_output->columnwise);
    interface[size_t(root_of(copy))] = false;
    if (const int grid = out_.buffers[size_t(copy)].scale_inv.buffer; grid >= 0)
      interface[size_t(root_of(grid))] = false;
  }
  auto weight_cast = [&](const Step& s) { return s.weight_cache_group >= 0; };
  // The buffers a candidate drops: its copies, and those it serves.
  auto dropped_by = [&](const Step& s) {
    std::vector<int> dropped;
    for (const ParamBinding& p : std::get<LaunchStep>(s.body).params)
      if (binds_transposed_copy(p)) dropped.push_back(p.buffers.at(0));
    if (const auto served = serves_.find(s.index); served != serves_.end())
      dropped.insert(dropped.end(), served->second.begin(), served->second.end());
    return dropped;
  };
  // A kept variant with an empty grid runs nothing, so its reads are no forward reads: the
  // column-wise cast that reads the norm's 16-bit output (emit_norm_block_cast) lets the norm's
  // variant drop that output. Decided to a fixed point (a variant reset makes its step read
  // again), then the kept variants are made.
  std::vector<bool> keep(out_.steps.size());
  for (const Step& s : out_.steps) keep[size_t(s.index)] = s.inference && !weight_cast(s);
  auto silent = [&](const Step& s) {
    return keep[size_t(s.index)] && s.inference->launch.grid.x.value() == std::optional<int64_t>(0);
  };
  for (bool changed = true; changed;) {
    changed = false;
    std::fill(read_in_forward.begin(), read_in_forward.end(), false);
    for (const Step& s : out_.steps) {
      if (s.phase != ir::Phase::Forward || silent(s)) continue;
      for (int id : s.reads) read_in_forward[size_t(root_of(id))] = true;
    }
    for (const Step& s : out_.steps) {
      if (!keep[size_t(s.index)]) continue;
      const std::vector<int> dropped = dropped_by(s);
      const bool only_backward_reads = std::none_of(dropped.begin(), dropped.end(), [&](int id) {
        return read_in_forward[size_t(root_of(id))] || interface[size_t(root_of(id))];
      });
      if (!only_backward_reads) {
        changed = changed || silent(s);
        keep[size_t(s.index)] = false;
      }
    }
  }
  for (Step& s : out_.steps) {
    if (!s.inference) continue;
    if (!keep[size_t(s.index)]) {
      s.inference.reset();
      continue;
    }
    const auto& launch = std::get<LaunchStep>(s.body);
    const std::vector<int> dropped = dropped_by(s);
    auto keep_writes = [&] {
      for (int id : s.writes)
        if (std::find(dropped.begin(), dropped.end(), id) == dropped.end())
          s.inference->writes.push_back(id);
    };
    // Copies: registering the variant's kernel may move the plan's kernels.
    const Kernel& trained = *plan_.find_kernel(launch.kernel);
    const std::string template_name = trained.template_name;
    std::vector<std::string> args = trained.template_args;
    const KernelTemplate* t = find_kernel_template(template_name);
    OPFUSE_ASSERT(t != nullptr, "no kernel template '{}'", template_name);
    const auto flag = std::find_if(t->params.begin(), t->params.end(), [](const TemplateParam& p) {
      // dropout_fwd's mask, like a transposed copy, is an output only backward reads; the
      // norm's 16-bit output under block scaling is read only by the column-wise cast.
      return p.name == "kWriteTranspose" || p.name == "kWriteMask" ||
             p.name == "kWriteColumnwiseSource";
    });
    if (s.inference->launch.grid.x.value() == std::optional<int64_t>(0)) {
      // A launch whose one output is the copy (micro_scale_cast's column-wise copy, the
      // column-wise block cast of a norm's output), or that only serves one (NVFP4's Hadamard
      // amax, WithoutTranspose::serves): the variant runs nothing, the kernel stays the trained
      // one (no instantiation is compiled only to be skipped).
      s.inference->launch.kernel = launch.kernel;
      s.inference->launch.name_expression = launch.name_expression;
      keep_writes();
      continue;
    }
    const auto at = size_t(flag - t->params.begin());
    OPFUSE_ASSERT(flag != t->params.end() && at < args.size() && args[at] == "true",
                  "'{}' writes a transposed copy without kWriteTranspose (kWriteMask) = true",
                  launch.kernel);
    args[at] = "false";
    Kernel& kernel = kernel_for(plan_, template_name, args);
    kernel.uses.push_back(inference_uses_.at(s.index));
    s.inference->launch.kernel = kernel.id;
    s.inference->launch.name_expression = kernel.name_expression;
    keep_writes();
  }
}

}  // namespace opfuse::codegen
