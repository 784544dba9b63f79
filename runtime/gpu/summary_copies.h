// Note "Block summaries" (gpu/block_summaries.h): which copies of a plan are summarized, where
// each lives and which steps make it, read off the plan alone (no device, no CUDA headers), so
// that CPU tests can check it for every recipe and fusion.
#pragma once

#include <string>
#include <vector>

#include "plan/plan.h"

namespace opfuse::gpu {

// One copy to summarize, as the plan describes it (no device needed).
struct SummaryCopy {
  int quantizer = 0;
  bool columnwise = false;
  int copy = -1;             // the buffer holding the copy
  std::vector<int> writers;  // the launch steps that write it: each is followed by a summary
  // What the kernel reads: the copy itself (Float8), or the quantizer's source (emulated).
  int source = -1;
  bool transposed = false;  // Float8: the copy is stored transposed ([k, rows...])
  int grid = -1;            // Float8: the copy's scale_inv grid
  bool two_d = false;
  bool nvfp4 = false;
  int block_rows = 0, block_cols = 0;  // in the source's orientation
  std::string expression;              // the summary kernel's name expression
};

// Every block-scaled copy and emulated MXFP8 / NVFP4 copy of `plan` that a launch writes (an
// emulated one only with its source in a buffer), in quantizer order, the row-wise copy first.
// Throws UsageError for a tensor-parallel plan (a rank's copies are shares of the tensors), a
// quantizer index out of range, or an emulated copy whose source is not bf16, fp16 or fp32.
std::vector<SummaryCopy> find_summary_copies(const plan::SequencePlan& plan);

}  // namespace opfuse::gpu
