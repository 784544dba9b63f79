#include "gpu/summary_copies.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <utility>
#include <variant>

#include "../../templates/common/launch_rules.h"
#include "opfuse/error.h"

namespace opfuse::gpu {

namespace {

std::string input_type(const plan::SequencePlan& plan, int buffer, const std::string& copy) {
  switch (plan.buffers.at(static_cast<std::size_t>(buffer)).dtype) {
    case plan::DType::BF16:
      return "__nv_bfloat16";
    case plan::DType::FP16:
      return "__half";
    case plan::DType::FP32:
      return "float";
    default:
      throw UsageError(
          fmt::format("block summaries: the source of {} is {}, not bf16, fp16 or fp32", copy,
                      plan::dtype_name(plan.buffers.at(static_cast<std::size_t>(buffer)).dtype)));
  }
}

const char* spell(bool value) { return value ? "true" : "false"; }

}  // namespace

std::vector<SummaryCopy> find_summary_copies(const plan::SequencePlan& plan) {
  if (plan.parallel.active()) {
    throw UsageError(fmt::format(
        "sequence '{}' is tensor-parallel: block summaries are of whole tensors, and each rank "
        "casts only its share; leave SessionOptions::block_summaries off (the CPU reference "
        "shows none either)",
        plan.name));
  }
  std::vector<SummaryCopy> copies;
  std::set<std::pair<int, bool>> seen;  // (quantizer, column-wise): its first buffer is the copy
  for (const plan::Buffer& b : plan.buffers) {
    // A quantized output's MXFP8 / NVFP4 codes (note "Quantized boundaries" in
    // docs/architecture.md) carry one-byte scales no Float8 summary reads, and their cast decodes
    // nothing; the CPU reference summarizes them as little.
    if (b.quantizer >= 0 && static_cast<std::size_t>(b.quantizer) < plan.quantizers.size() &&
        plan.quantizers[static_cast<std::size_t>(b.quantizer)].spec.micro_scaled())
      continue;
    const bool float8 = b.quantizer >= 0 && b.scale_inv.buffer >= 0;
    const int q = float8 ? b.quantizer : b.emulated_quantizer;
    if (q < 0) continue;
    if (static_cast<std::size_t>(q) >= plan.quantizers.size())
      throw UsageError(fmt::format("plan buffer {} names quantizer {} of {}", b.name, q,
                                   plan.quantizers.size()));
    const plan::QuantizerPlan& quantizer = plan.quantizers[static_cast<std::size_t>(q)];
    // float8_block_scaling emulated (a target without block-scale GEMMs) decodes its copies too,
    // but summaries cover its native copies only, as the CPU reference's do.
    if (!float8 && !quantizer.spec.micro_scaled()) continue;
    const bool columnwise = b.usage == plan::CopyUsage::Columnwise;
    SummaryCopy t;
    for (const plan::Step& step : plan.steps) {
      if (std::holds_alternative<plan::LaunchStep>(step.body) &&
          std::ranges::find(step.writes, b.id) != step.writes.end())
        t.writers.push_back(step.index);
    }
    // A Float8 copy is summarized from itself and its grid; an emulated one from its source,
    // which a fused producer might keep in no buffer (note "Block summaries" in
    // gpu/block_summaries.h).
    if (t.writers.empty() || (!float8 && quantizer.source_buffer < 0) ||
        !seen.insert({q, columnwise}).second)
      continue;
    t.quantizer = q;
    t.columnwise = columnwise;
    t.copy = b.id;
    t.source = float8 ? b.id : quantizer.source_buffer;
    t.grid = float8 ? b.scale_inv.buffer : -1;
    t.transposed = float8 && b.layout == plan::CopyLayout::Transposed;
    const plan::QuantSpec& spec = quantizer.spec;
    t.nvfp4 = spec.nvfp4();
    // The spec's block is the row-wise copy's; the column-wise copy's runs down the columns.
    t.block_rows = columnwise ? spec.block.cols : spec.block.rows;
    t.block_cols = columnwise ? spec.block.rows : spec.block.cols;
    t.two_d = spec.block.rows > 1;
    if (float8) {
      t.expression = fmt::format("opfuse::float8_block_summary<{}, {}>",
                                 b.dtype == plan::DType::E5M2 ? "__nv_fp8_e5m2" : "__nv_fp8_e4m3",
                                 spell(t.two_d));
    } else {
      const std::string copy = fmt::format("the {} copy of quantizer '{}'",
                                           columnwise ? "column-wise" : "row-wise", quantizer.name);
      const int format = launch::micro_scale_format(spec.nvfp4(), spec.format == plan::DType::E5M2);
      t.expression = fmt::format("opfuse::micro_block_summary<{}, {}, {}, {}, {}>",
                                 input_type(plan, t.source, copy), format, spell(columnwise),
                                 spell(t.two_d), spell(spec.rht && columnwise));
    }
    copies.push_back(std::move(t));
  }
  // Quantizer order, the row-wise copy first: the CPU reference's order.
  std::ranges::stable_sort(copies, [](const SummaryCopy& x, const SummaryCopy& y) {
    return std::pair(x.quantizer, x.columnwise) < std::pair(y.quantizer, y.columnwise);
  });
  return copies;
}

}  // namespace opfuse::gpu
