// The math of every op kind on the CPU, forward and backward, on row-major [rows, cols] views.
// One template per op serves both precisions: float (the GPU kernels' fp32 arithmetic) and double
// (the error-measuring mode). GEMMs go through BLAS (cblas_sgemm / cblas_dgemm), never a loop.
// Nothing here rounds to a storage dtype: the executor decides where rounding happens.
#pragma once

#include <cstdint>
#include <span>

#include "ir/pointwise_ops.h"

namespace opfuse::cpu::ops {

// A pointwise op (compiler/ir/pointwise_ops.h), evaluated from its reference definition. Plain:
// y = f(x) elementwise. Gated (TE): x is [rows, 2n], the first half the gate: y = f(gate, linear).
// `cols` is y's width (n). backward: dx (x's shape) = the definition's gradients times dy.
// `params`: a user-defined op's learned parameters (op.params() of them), each one element (a
// scalar) or `cols` (one per feature of y); backward sums each one's gradient over the rows (and,
// for a scalar, over the features) into `dparams`, accumulating in double.
template <typename T>
using ParamValues = std::span<const std::span<const T>>;
template <typename T>
using ParamGrads = std::span<const std::span<T>>;
template <typename T>
void pointwise_forward(const ir::PointwiseExpr& op, std::span<const T> x, ParamValues<T> params,
                       int64_t cols, std::span<T> y);
template <typename T>
void pointwise_backward(const ir::PointwiseExpr& op, std::span<const T> x, ParamValues<T> params,
                        std::span<const T> dy, int64_t cols, std::span<T> dx,
                        ParamGrads<T> dparams);

// LayerNorm over the last dimension (TE: biased variance, rstd = 1 / sqrt(var + eps),
// zero_centered_gamma uses gamma + 1). mean and rstd (one per row) are saved for backward.
template <typename T>
void layernorm_forward(std::span<const T> x, std::span<const T> gamma, std::span<const T> beta,
                       int64_t cols, double eps, bool zero_centered, std::span<T> y,
                       std::span<T> mean, std::span<T> rstd);
// dgamma and dbeta are accumulated into (+=).
template <typename T>
void layernorm_backward(std::span<const T> x, std::span<const T> gamma, std::span<const T> dy,
                        std::span<const T> mean, std::span<const T> rstd, int64_t cols,
                        bool zero_centered, std::span<T> dx, std::span<T> dgamma,
                        std::span<T> dbeta);

// RMSNorm: y = x * rstd * gamma (gamma + 1 when zero centered), rstd = 1 / sqrt(mean(x^2) + eps).
template <typename T>
void rmsnorm_forward(std::span<const T> x, std::span<const T> gamma, int64_t cols, double eps,
                     bool zero_centered, std::span<T> y, std::span<T> rstd);
template <typename T>
void rmsnorm_backward(std::span<const T> x, std::span<const T> gamma, std::span<const T> dy,
                      std::span<const T> rstd, int64_t cols, bool zero_centered, std::span<T> dx,
                      std::span<T> dgamma);

// y[M, N] = x[M, K] W[N, K]^T; dx = dy W; dW = dy^T x (written, not accumulated).
template <typename T>
void linear_forward(std::span<const T> x, std::span<const T> w, int64_t m, int64_t n, int64_t k,
                    std::span<T> y);
template <typename T>
void linear_dgrad(std::span<const T> dy, std::span<const T> w, int64_t m, int64_t n, int64_t k,
                  std::span<T> dx);
template <typename T>
void linear_wgrad(std::span<const T> dy, std::span<const T> x, int64_t m, int64_t n, int64_t k,
                  std::span<T> dw);

// y[r, c] += bias[c]; dbias[c] += sum over rows of dy[r, c].
template <typename T>
void add_bias(std::span<T> y, std::span<const T> bias, int64_t cols);
template <typename T>
void bias_grad(std::span<const T> dy, int64_t cols, std::span<T> dbias);

}  // namespace opfuse::cpu::ops
