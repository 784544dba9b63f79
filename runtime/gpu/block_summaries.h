// Note "Block summaries" on the GPU (docs/architecture.md; the CPU twin is
// runtime/cpu/block_summary.h): for a session that asks (SessionOptions::block_summaries), every
// quantized copy of a block-scaled or micro-scaled quantizer is summarized by a small kernel
// (templates/block_summary.cuh) launched right after the plan step that made it, on the same
// stream, into a record per copy that outlives the step; the host reads the records when asked.
// Plans carry nothing for it: the copies are found from what the plan says of its buffers (a
// Float8 copy's quantizer and scale grid, an emulated copy's Buffer::emulated_quantizer) and the
// step that writes each, so whichever kernel makes a copy (a cast of its own, or one fused into a
// producer) is summarized the same way. A normal run builds none of this and launches nothing.
//
// Why right after the writing step: the copy, its scale grid and its source live in memory the
// plan reuses later in the step; at that point they still hold what the cast read and wrote. A
// Float8 copy is summarized from itself (codes and grid, which the GEMMs read, so they exist
// whichever kernel made them: a cast folded into an activation keeps its source in registers);
// an emulated MXFP8 / NVFP4 copy from its source with the cast's scale math, since the emulated
// casts store no scales. An emulated copy whose source is in no buffer is not summarized
// (block_summaries() leaves it out); today every emulated cast reads its source from memory.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "gpu/device_memory.h"
#include "gpu/module.h"
#include "gpu/summary_copies.h"
#include "plan/plan.h"

namespace opfuse::gpu {

class QuantizerState;

// One copy's summary as the host reads it (cpu::BlockSummary's fields plus which copy it is).
struct CopySummary {
  int quantizer = 0;
  bool columnwise = false;
  int block_rows = 0;  // in the source's orientation
  int block_cols = 0;
  std::int64_t blocks = 0;
  std::int64_t zero_blocks = 0;
  float scale_inv_min = 0.0f;
  float scale_inv_max = 0.0f;
  bool has_tensor_scale = false;  // NVFP4
  float tensor_scale = 0.0f;
};

// Host mirror of templates/block_summary.cuh's BlockSummaryRecord (32 bytes).
struct BlockSummaryRecord {
  std::uint32_t least_complement;
  std::uint32_t greatest_bits;
  std::uint64_t zero_blocks;
  float tensor_scale;
  std::uint32_t unused[3];
};
static_assert(sizeof(BlockSummaryRecord) == 32, "must match templates/block_summary.cuh");

class BlockSummaries {
 public:
  // Finds the copies of `plan` (find_summary_copies, whose errors it throws) and compiles their
  // kernels for the current device (NVRTC, a few hundred ms).
  BlockSummaries(const plan::SequencePlan& plan, cudaStream_t stream);

  // Whether the plan has block-scaled or micro-scaled copies at all.
  bool empty() const { return targets_.empty(); }
  // After step `index` ran (its inference variant when `inference`): zeroes and fills the record
  // of every copy it wrote. `pointer` gives a buffer's device memory, `symbols` the bound sizes,
  // `quantizers` NVFP4's tensor scales (null for a plan without quantizers).
  void after_step(int index, bool inference, const std::function<const void*(int)>& pointer,
                  const QuantizerState* quantizers,
                  const std::map<std::string, std::int64_t>& symbols, cudaStream_t stream);
  // Every copy summarized so far, as its latest cast made it, in quantizer order (the row-wise
  // copy first); waits for `stream`.
  std::vector<CopySummary> download(cudaStream_t stream) const;

 private:
  struct Made {  // host side of a record: set when its copy was summarized
    bool made = false;
    std::int64_t blocks = 0;
  };

  const plan::SequencePlan& plan_;
  std::vector<SummaryCopy> targets_;       // quantizer order, row-wise first
  std::map<int, std::vector<int>> steps_;  // step index -> targets it writes
  std::vector<Made> made_;
  DeviceBuffer records_;
  std::vector<Module> module_;  // empty without targets
  std::map<std::string, Kernel> kernels_;
};

}  // namespace opfuse::gpu
