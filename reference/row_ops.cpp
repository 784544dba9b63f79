#include "reference/row_ops.h"

#include <vector>

#include "ir/row_expr.h"
#include "support/assert.h"

namespace opfuse::cpu {

template <typename T>
void user_norm(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const ir::RowExpr expr(op.attrs);
  const Tensor<T>& x = ctx.in(op, 0);
  std::vector<std::span<const T>> params;
  for (size_t i = 1; i <= size_t(expr.params()); ++i) params.emplace_back(ctx.in(op, i).data);
  Tensor<T>& y = ctx.out(op, 0);
  const std::span<T> outputs[] = {y.data};
  expr.run<T>(expr.forward(), x.data, {}, params, x.cols(), outputs);
}

template <typename T>
void user_norm_backward(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const ir::RowExpr expr(op.attrs);
  const Tensor<T>& dy = ctx.in(op, 0);
  const Tensor<T>& x = ctx.in(op, 1);
  const size_t n_params = size_t(expr.params());
  std::vector<std::span<const T>> params;
  for (size_t i = 2; i < 2 + n_params; ++i) params.emplace_back(ctx.in(op, i).data);
  Tensor<T>& dx = ctx.out(op, 0);
  // Each parameter's per-element shares, then their sums over the rows.
  std::vector<std::vector<T>> shares(n_params, std::vector<T>(x.data.size()));
  std::vector<std::span<T>> outputs = {dx.data};
  for (auto& s : shares) outputs.emplace_back(s);
  expr.run<T>(expr.backward(), x.data, dy.data, params, x.cols(), outputs);
  const size_t cols = size_t(x.cols());
  for (size_t k = 0; k < n_params; ++k) {
    Tensor<T>& dp = ctx.out(op, k + 1);
    std::vector<double> sums(dp.data.size(), 0.0);
    OPFUSE_ASSERT(sums.size() == 1 || sums.size() == cols, "parameter {} of '{}' has {} elements",
                  k, op.instance, sums.size());
    for (size_t i = 0; i < shares[k].size(); ++i)
      sums[sums.size() == 1 ? 0 : i % cols] += double(shares[k][i]);
    for (size_t i = 0; i < sums.size(); ++i) dp.data[i] = T(sums[i]);
  }
}

template void user_norm<float>(ReferenceContext<float>&, const ir::Operation&);
template void user_norm<double>(ReferenceContext<double>&, const ir::Operation&);
template void user_norm_backward<float>(ReferenceContext<float>&, const ir::Operation&);
template void user_norm_backward<double>(ReferenceContext<double>&, const ir::Operation&);

}  // namespace opfuse::cpu
