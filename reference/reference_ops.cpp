#include "reference_ops.h"

#include <cblas.h>

#include <cmath>
#include <type_traits>
#include <vector>

namespace opfuse::cpu::ops {

namespace {

// Row-major BLAS GEMM: C[M, N] = op(A) op(B) with op = transpose when the flag is set.
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
          const T* b, int64_t ldb, T* c, int64_t ldc) {
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, int(m), int(n), int(k), 1.0f, a, int(lda), b, int(ldb), 0.0f,
                c, int(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, int(m), int(n), int(k), 1.0, a, int(lda), b, int(ldb), 0.0,
                c, int(ldc));
  }
}

// zero_centered_gamma stores gamma - 1 (TE), so the effective weight adds the one back.
template <typename T>
T effective_gamma(const T* gamma, int64_t c, bool zero_centered) {
  return zero_centered ? gamma[c] + T(1) : gamma[c];
}

}  // namespace

// A learned parameter's value at column c: a scalar's one element, or the feature's.
template <typename T>
T param_at(std::span<const T> p, int64_t c) {
  return p.size() == 1 ? p[0] : p[size_t(c)];
}

template <typename T>
void pointwise_forward(const ir::PointwiseExpr& op, std::span<const T> x, ParamValues<T> params,
                       int64_t cols, std::span<T> y) {
  std::vector<T> scratch(op.graph().size());
  const int inputs = op.inputs();
  const int64_t rows = cols == 0 ? 0 : int64_t(y.size()) / cols;
  std::vector<T> p(params.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      // Plain: x[r, c]; gated: gate x[r, c] and linear x[r, n + c] of the row [gate | linear].
      const T in[2] = {x[r * inputs * cols + c], inputs == 2 ? x[r * 2 * cols + cols + c] : T(0)};
      for (size_t k = 0; k < params.size(); ++k) p[k] = param_at(params[k], c);
      y[r * cols + c] = op.forward<T>(std::span<const T>(in, size_t(inputs)), p, scratch);
    }
}

template <typename T>
void pointwise_backward(const ir::PointwiseExpr& op, std::span<const T> x, ParamValues<T> params,
                        std::span<const T> dy, int64_t cols, std::span<T> dx,
                        ParamGrads<T> dparams) {
  std::vector<T> scratch(op.graph().size());
  const int inputs = op.inputs();
  const int64_t rows = cols == 0 ? 0 : int64_t(dy.size()) / cols;
  std::vector<T> p(params.size());
  std::vector<T> grads(size_t(inputs) + params.size());
  // Per parameter and column (one column for a scalar): the sum over the rows so far.
  std::vector<std::vector<double>> sums(params.size());
  for (size_t k = 0; k < params.size(); ++k) sums[k].assign(params[k].size(), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t at = r * inputs * cols + c;
      const T in[2] = {x[at], inputs == 2 ? x[at + cols] : T(0)};
      for (size_t k = 0; k < params.size(); ++k) p[k] = param_at(params[k], c);
      op.backward<T>(std::span<const T>(in, size_t(inputs)), p, dy[r * cols + c], grads, scratch);
      dx[at] = grads[0];
      if (inputs == 2) dx[at + cols] = grads[1];
      for (size_t k = 0; k < params.size(); ++k)
        sums[k][params[k].size() == 1 ? 0 : size_t(c)] += double(grads[size_t(inputs) + k]);
    }
  for (size_t k = 0; k < dparams.size(); ++k)
    for (size_t i = 0; i < dparams[k].size(); ++i) dparams[k][i] = T(sums[k][i]);
}

template <typename T>
void layernorm_forward(std::span<const T> x, std::span<const T> gamma, std::span<const T> beta,
                       int64_t cols, double eps, bool zero_centered, std::span<T> y,
                       std::span<T> mean, std::span<T> rstd) {
  const int64_t rows = cols == 0 ? 0 : int64_t(x.size()) / cols;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x.data() + r * cols;
    T sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += xr[c];
    const T mu = sum / T(cols);
    T sq = 0;
    for (int64_t c = 0; c < cols; ++c) sq += (xr[c] - mu) * (xr[c] - mu);
    const T rs = T(1) / std::sqrt(sq / T(cols) + T(eps));
    for (int64_t c = 0; c < cols; ++c)
      y[r * cols + c] =
          (xr[c] - mu) * rs * effective_gamma(gamma.data(), c, zero_centered) + beta[c];
    mean[r] = mu;
    rstd[r] = rs;
  }
}

template <typename T>
void layernorm_backward(std::span<const T> x, std::span<const T> gamma, std::span<const T> dy,
                        std::span<const T> mean, std::span<const T> rstd, int64_t cols,
                        bool zero_centered, std::span<T> dx, std::span<T> dgamma,
                        std::span<T> dbeta) {
  const int64_t rows = cols == 0 ? 0 : int64_t(x.size()) / cols;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x.data() + r * cols;
    const T* dyr = dy.data() + r * cols;
    T mean_dxhat = 0, mean_dxhat_xhat = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const T xhat = (xr[c] - mean[r]) * rstd[r];
      const T dxhat = dyr[c] * effective_gamma(gamma.data(), c, zero_centered);
      mean_dxhat += dxhat;
      mean_dxhat_xhat += dxhat * xhat;
      dgamma[c] += dyr[c] * xhat;
      dbeta[c] += dyr[c];
    }
    mean_dxhat /= T(cols);
    mean_dxhat_xhat /= T(cols);
    for (int64_t c = 0; c < cols; ++c) {
      const T xhat = (xr[c] - mean[r]) * rstd[r];
      const T dxhat = dyr[c] * effective_gamma(gamma.data(), c, zero_centered);
      dx[r * cols + c] = rstd[r] * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
    }
  }
}

template <typename T>
void rmsnorm_forward(std::span<const T> x, std::span<const T> gamma, int64_t cols, double eps,
                     bool zero_centered, std::span<T> y, std::span<T> rstd) {
  const int64_t rows = cols == 0 ? 0 : int64_t(x.size()) / cols;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x.data() + r * cols;
    T sq = 0;
    for (int64_t c = 0; c < cols; ++c) sq += xr[c] * xr[c];
    const T rs = T(1) / std::sqrt(sq / T(cols) + T(eps));
    for (int64_t c = 0; c < cols; ++c)
      y[r * cols + c] = xr[c] * rs * effective_gamma(gamma.data(), c, zero_centered);
    rstd[r] = rs;
  }
}

template <typename T>
void rmsnorm_backward(std::span<const T> x, std::span<const T> gamma, std::span<const T> dy,
                      std::span<const T> rstd, int64_t cols, bool zero_centered, std::span<T> dx,
                      std::span<T> dgamma) {
  const int64_t rows = cols == 0 ? 0 : int64_t(x.size()) / cols;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x.data() + r * cols;
    const T* dyr = dy.data() + r * cols;
    T mean_dxhat_xhat = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const T xhat = xr[c] * rstd[r];
      mean_dxhat_xhat += dyr[c] * effective_gamma(gamma.data(), c, zero_centered) * xhat;
      dgamma[c] += dyr[c] * xhat;
    }
    mean_dxhat_xhat /= T(cols);
    for (int64_t c = 0; c < cols; ++c) {
      const T xhat = xr[c] * rstd[r];
      const T dxhat = dyr[c] * effective_gamma(gamma.data(), c, zero_centered);
      dx[r * cols + c] = rstd[r] * (dxhat - xhat * mean_dxhat_xhat);
    }
  }
}

template <typename T>
void linear_forward(std::span<const T> x, std::span<const T> w, int64_t m, int64_t n, int64_t k,
                    std::span<T> y) {
  gemm<T>(false, true, m, n, k, x.data(), k, w.data(), k, y.data(), n);
}

template <typename T>
void linear_dgrad(std::span<const T> dy, std::span<const T> w, int64_t m, int64_t n, int64_t k,
                  std::span<T> dx) {
  gemm<T>(false, false, m, k, n, dy.data(), n, w.data(), k, dx.data(), k);
}

template <typename T>
void linear_wgrad(std::span<const T> dy, std::span<const T> x, int64_t m, int64_t n, int64_t k,
                  std::span<T> dw) {
  gemm<T>(true, false, n, k, m, dy.data(), n, x.data(), k, dw.data(), k);
}

template <typename T>
void add_bias(std::span<T> y, std::span<const T> bias, int64_t cols) {
  for (size_t i = 0; i < y.size(); ++i) y[i] += bias[i % size_t(cols)];
}

template <typename T>
void bias_grad(std::span<const T> dy, int64_t cols, std::span<T> dbias) {
  for (size_t i = 0; i < dy.size(); ++i) dbias[i % size_t(cols)] += dy[i];
}

#define OPFUSE_INSTANTIATE_REFERENCE_OPS(T)                                                        \
  template void pointwise_forward<T>(const ir::PointwiseExpr&, std::span<const T>, ParamValues<T>, \
                                     int64_t, std::span<T>);                                       \
  template void pointwise_backward<T>(const ir::PointwiseExpr&, std::span<const T>,                \
                                      ParamValues<T>, std::span<const T>, int64_t, std::span<T>,   \
                                      ParamGrads<T>);                                              \
  template void layernorm_forward<T>(std::span<const T>, std::span<const T>, std::span<const T>,   \
                                     int64_t, double, bool, std::span<T>, std::span<T>,            \
                                     std::span<T>);                                                \
  template void layernorm_backward<T>(std::span<const T>, std::span<const T>, std::span<const T>,  \
                                      std::span<const T>, std::span<const T>, int64_t, bool,       \
                                      std::span<T>, std::span<T>, std::span<T>);                   \
  template void rmsnorm_forward<T>(std::span<const T>, std::span<const T>, int64_t, double, bool,  \
                                   std::span<T>, std::span<T>);                                    \
  template void rmsnorm_backward<T>(std::span<const T>, std::span<const T>, std::span<const T>,    \
                                    std::span<const T>, int64_t, bool, std::span<T>,               \
                                    std::span<T>);                                                 \
  template void linear_forward<T>(std::span<const T>, std::span<const T>, int64_t, int64_t,        \
                                  int64_t, std::span<T>);                                          \
  template void linear_dgrad<T>(std::span<const T>, std::span<const T>, int64_t, int64_t, int64_t, \
                                std::span<T>);                                                     \
  template void linear_wgrad<T>(std::span<const T>, std::span<const T>, int64_t, int64_t, int64_t, \
                                std::span<T>);                                                     \
  template void add_bias<T>(std::span<T>, std::span<const T>, int64_t);                            \
  template void bias_grad<T>(std::span<const T>, int64_t, std::span<T>);

OPFUSE_INSTANTIATE_REFERENCE_OPS(float)
OPFUSE_INSTANTIATE_REFERENCE_OPS(double)
#undef OPFUSE_INSTANTIATE_REFERENCE_OPS

}  // namespace opfuse::cpu::ops
