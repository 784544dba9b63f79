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

}  // namespace

BlockSummaries::BlockSummaries(const plan::SequencePlan& plan, cudaStream_t stream)
    : plan_(plan), targets_(find_summary_copies(plan)) {
  for (std::size_t i = 0; i < targets_.size(); ++i)
    for (int step : targets_[i].writers) steps_[step].push_back(static_cast<int>(i));
  made_.assign(targets_.size(), {});
  if (targets_.empty()) return;
  records_ = DeviceBuffer(targets_.size() * sizeof(BlockSummaryRecord), stream);
  OPFUSE_CUDA_CHECK(cudaMemsetAsync(records_.data(), 0, records_.size(), stream),
                    "the block summaries' records");
  jit::CompileRequest request;
  request.kernel_name = "block_summaries";
  request.source = "#include \"block_summary.cuh\"\n";
  std::set<std::string> expressions;
  for (const SummaryCopy& t : targets_) expressions.insert(t.expression);
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
    const SummaryCopy& t = targets_[static_cast<std::size_t>(i)];
    // An inference variant leaves out the copies only backward reads, and where a fused norm
    // writes an MXFP8 row-wise copy (norm_micro_cast) its variant leaves out the norm's output,
    // the source that copy is summarized from: no summary of either there.
    auto left_out = [&](int buffer) {
      return std::ranges::find(step.writes, buffer) != step.writes.end() &&
             std::ranges::find(step.inference->writes, buffer) == step.inference->writes.end();
    };
    if (inference && step.inference && (left_out(t.copy) || left_out(t.source))) continue;
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
    const SummaryCopy& t = targets_[i];
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
