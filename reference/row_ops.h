// The CPU reference of norm-like user-defined ops (compiler/ir/row_expr.h): the forward and
// backward row programs evaluated in float or double, as the pointwise user ops' reference
// evaluates their expression. The executor's kernel table (reference_kernels.cpp) names them.
#pragma once

#include "reference/reference_kernels.h"

namespace opfuse::cpu {

// (x, params...) -> y
template <typename T>
void user_norm(ReferenceContext<T>& ctx, const ir::Operation& op);
// (dy, x, params...) -> (dx, dparams...): each parameter's gradient summed over the rows (and,
// for a scalar, over the columns) in double.
template <typename T>
void user_norm_backward(ReferenceContext<T>& ctx, const ir::Operation& op);

}  // namespace opfuse::cpu
