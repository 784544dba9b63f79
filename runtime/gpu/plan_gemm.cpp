#include "gpu/plan_gemm.h"

#include <fmt/format.h>

#include "gpu/kernel_params.h"
#include "opfuse/error.h"

namespace opfuse::gpu {

GemmDesc gemm_desc(const plan::GemmStep& step, const std::map<std::string, std::int64_t>& symbols) {
  GemmDesc desc;
  desc.m = evaluate_expr(step.m, symbols);
  desc.n = evaluate_expr(step.n, symbols);
  desc.k = evaluate_expr(step.k, symbols);
  desc.a = step.a.dtype;
  desc.b = step.b.dtype;
  desc.d = step.d_dtype;
  desc.a_transposed = step.a_transposed;
  desc.b_transposed = step.b_transposed;
  desc.epilogue = step.epilogue;
  desc.accumulate = step.accumulate;
  desc.fast_accum = step.fast_accum;
  return desc;
}

}  // namespace opfuse::gpu
