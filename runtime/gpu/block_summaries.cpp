#include "gpu/block_summaries.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <set>
#include <utility>

#include "../../templates/common/launch_rules.h"
#include "gpu/cuda_check.h"
#include "gpu/device.h"
#include "gpu/kernel_params.h"
#include "gpu/quantizer_state.h"
#include "jit/nvrtc_compiler.h"
#include "opfuse/error.h"

namespace opfuse::gpu {

namespace {

// Host mirror of templates/block_summary.cuh's BlockSummaryParams<Input> (its layout does not
// depend on Input).
struct BlockSummaryParams {
  const void* x;
  const float* scale_inv;
  const float* tensor_scale;
  void* record;
  long long rows;
  long long cols;
};

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

BlockSummaries::BlockSummaries(const plan::SequencePlan& plan, cudaStream_t stream) : plan_(plan) {
  if (plan.parallel.active()) {
    throw UsageError(fmt::format(
        "sequence '{}' is tensor-parallel: block summaries are of whole tensors, and each rank "
        "casts only its share; leave SessionOptions::block_summaries off (the CPU reference "
        "shows none either)",
        plan.name));
  }
  // The copies by (quantizer, column-wise), each made by at least one step.
  std::set<std::pair<int, bool>> seen;
  for (const plan::Buffer& b : plan.buffers) {
    const bool float8 = b.quantizer >= 0 && b.scale_inv.buffer >= 0;
    const int q = float8 ? b.quantizer : b.emulated_quantizer;
    if (q < 0) continue;
    if (static_cast<std::size_t>(q) >= plan.quantizers.size())
      throw UsageError(fmt::format("plan buffer {} names quantizer {} of {}", b.name, q,
                                   plan.quantizers.size()));
    const plan::QuantizerPlan& quantizer = plan.quantizers[static_cast<std::size_t>(q)];
    const bool columnwise = b.usage == plan::CopyUsage::Columnwise;
    std::vector<int> writers;
    for (const plan::Step& step : plan.steps) {
      if (std::holds_alternative<plan::LaunchStep>(step.body) &&
          std::ranges::find(step.writes, b.id) != step.writes.end())
        writers.push_back(step.index);
    }
    // A Float8 copy is summarized from itself and its grid; an emulated one from its source,
    // which a fused producer might keep in no buffer (block_summaries.h).
    if (writers.empty() || (!float8 && quantizer.source_buffer < 0) ||
        !seen.insert({q, columnwise}).second)
      continue;
    Target t;
    t.quantizer = q;
    t.columnwise = columnwise;
    t.copy = b.id;
    t.source = float8 ? b.id : quantizer.source_buffer;
    t.grid = float8 ? b.scale_inv.buffer : -1;
    t.transposed = b.layout == plan::CopyLayout::Transposed;
    const plan::QuantSpec& spec = quantizer.spec;
    t.nvfp4 = spec.nvfp4();
    // The spec's block is the row-wise copy's; the column-wise copy's runs down the columns.
    t.block_rows = columnwise ? spec.block.cols : spec.block.rows;
    t.block_cols = columnwise ? spec.block.rows : spec.block.cols;
    const std::string copy = fmt::format("the {} copy of quantizer '{}'",
                                         columnwise ? "column-wise" : "row-wise", quantizer.name);
    const bool two_d = spec.block.rows > 1;
    t.two_d = two_d;
    if (float8) {
      t.expression = fmt::format("opfuse::float8_block_summary<{}, {}>",
                                 b.dtype == plan::DType::E5M2 ? "__nv_fp8_e5m2" : "__nv_fp8_e4m3",
                                 spell(two_d));
    } else {
      const std::string input = input_type(plan, t.source, copy);
      const int format = spec.nvfp4()                       ? launch::kMicroScaleE2M1
                         : spec.format == plan::DType::E5M2 ? launch::kMicroScaleE5M2
                                                            : launch::kMicroScaleE4M3;
      t.expression = fmt::format("opfuse::micro_block_summary<{}, {}, {}, {}, {}>", input, format,
                                 spell(columnwise), spell(two_d), spell(spec.rht && columnwise));
    }
    for (int step : writers) steps_[step].push_back(static_cast<int>(targets_.size()));
    targets_.push_back(std::move(t));
  }
  // Quantizer order, the row-wise copy first (the CPU reference's order); steps_ keeps indices.
  std::vector<int> order(targets_.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::ranges::sort(order, [&](int a, int b) {
    const Target& x = targets_[static_cast<std::size_t>(a)];
    const Target& y = targets_[static_cast<std::size_t>(b)];
    return std::pair(x.quantizer, x.columnwise) < std::pair(y.quantizer, y.columnwise);
  });
  std::vector<int> position(order.size());
  std::vector<Target> sorted;
  for (std::size_t i = 0; i < order.size(); ++i) {
    position[static_cast<std::size_t>(order[i])] = static_cast<int>(i);
    sorted.push_back(targets_[static_cast<std::size_t>(order[i])]);
  }
  targets_ = std::move(sorted);
  for (auto& [step, list] : steps_)
    for (int& target : list) target = position[static_cast<std::size_t>(target)];
  made_.assign(targets_.size(), {});
  if (targets_.empty()) return;
  records_ = DeviceBuffer(targets_.size() * sizeof(BlockSummaryRecord), stream);
  OPFUSE_CUDA_CHECK(cudaMemsetAsync(records_.data(), 0, records_.size(), stream),
                    "the block summaries' records");
  jit::CompileRequest request;
  request.kernel_name = "block_summaries";
  request.source = "#include \"block_summary.cuh\"\n";
  std::set<std::string> expressions;
  for (const Target& t : targets_) expressions.insert(t.expression);
  request.name_expressions.assign(expressions.begin(), expressions.end());
  request.arch = current_device().arch;
  module_.emplace_back(jit::compile_kernel(request));
  for (const std::string& expression : expressions)
    kernels_.emplace(expression, module_.front().kernel(expression));
}

void BlockSummaries::after_step(int index, bool inference,
                                const std::function<const void*(int)>& pointer,
                                const QuantizerState* quantizers,
                                const std::map<std::string, std::int64_t>& symbols,
                                cudaStream_t stream) {
  const auto found = steps_.find(index);
  if (found == steps_.end()) return;
  const plan::Step& step = plan_.steps.at(static_cast<std::size_t>(index));
  for (int i : found->second) {
    const Target& t = targets_[static_cast<std::size_t>(i)];
    // An inference variant leaves out the copies only backward reads.
    if (inference && step.inference &&
        std::ranges::find(step.inference->writes, t.copy) == step.inference->writes.end())
      continue;
    // The matrix the kernel reads, as the plan lays it out (a transposed copy is [k, rows...]:
    // its first dimension against the rest, as codegen's scale grids take it).
    const std::vector<plan::SymExpr>& shape =
        plan_.buffers.at(static_cast<std::size_t>(t.source)).shape;
    const std::size_t split = t.transposed ? std::min<std::size_t>(1, shape.size())
                                           : (shape.empty() ? 0 : shape.size() - 1);
    std::int64_t rows = 1, cols = 1;
    for (std::size_t d = 0; d < shape.size(); ++d)
      (d < split ? rows : cols) *= evaluate_expr(shape[d], symbols);
    const bool float8 = t.grid >= 0;
    // Float8: the stored copy's blocks (1 x 128 along its rows, or 128 x 128); micro: the
    // source's, whole blocks.
    const std::int64_t blocks =
        float8 ? launch::ceil_div(rows, t.two_d ? launch::kBlockScaleLength : 1) *
                     launch::ceil_div(cols, launch::kBlockScaleLength)
               : rows / t.block_rows * (cols / t.block_cols);
    auto* record = static_cast<BlockSummaryRecord*>(records_.data()) + i;
    BlockSummaryParams params{pointer(t.source),
                              float8 ? static_cast<const float*>(pointer(t.grid)) : nullptr,
                              t.nvfp4 && quantizers ? quantizers->scale(t.quantizer) : nullptr,
                              record,
                              rows,
                              cols};
    OPFUSE_CUDA_CHECK(cudaMemsetAsync(record, 0, sizeof(BlockSummaryRecord), stream),
                      "a block summary's record");
    const int grid = launch::block_summary_grid_x(float8 ? blocks * launch::kWarpSize : blocks);
    launch(kernels_.at(t.expression), dim3(static_cast<unsigned>(grid)),
           dim3(launch::kBlockSummaryThreads), 0, stream, params);
    made_[static_cast<std::size_t>(i)] = {true, blocks};
  }
}

std::vector<CopySummary> BlockSummaries::download(cudaStream_t stream) const {
  std::vector<BlockSummaryRecord> records(targets_.size());
  if (!records.empty()) {
    OPFUSE_CUDA_CHECK(cudaMemcpyAsync(records.data(), records_.data(), records_.size(),
                                      cudaMemcpyDeviceToHost, stream),
                      "reading the block summaries");
    OPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream), "reading the block summaries");
  }
  std::vector<CopySummary> out;
  for (std::size_t i = 0; i < targets_.size(); ++i) {
    if (!made_[i].made) continue;
    const Target& t = targets_[i];
    const BlockSummaryRecord& r = records[i];
    CopySummary s;
    s.quantizer = t.quantizer;
    s.columnwise = t.columnwise;
    s.block_rows = t.block_rows;
    s.block_cols = t.block_cols;
    s.blocks = made_[i].blocks;
    s.zero_blocks = static_cast<std::int64_t>(r.zero_blocks);
    // A copy without blocks has neither bound (the CPU's 0 and 0).
    if (s.blocks > 0) {
      s.scale_inv_min = std::bit_cast<float>(~r.least_complement);
      s.scale_inv_max = std::bit_cast<float>(r.greatest_bits);
    }
    s.has_tensor_scale = t.nvfp4;
    s.tensor_scale = t.nvfp4 ? r.tensor_scale : 0.0f;
    out.push_back(s);
  }
  return out;
}

}  // namespace opfuse::gpu
