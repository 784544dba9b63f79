// Device lowering of the scalar-expression primitives (compiler/ir/scalar_expr.h) that have no
// plain CUDA operator: the generated pointwise functors (compiler/ir/pointwise_ops.h) call these.
//
// sigmoid(z) = __fdividef(1, 1 + __expf(-z)): the hardware ex2/rcp approximations (relative error
// ~1e-7, far below bf16/FP8 resolution). With IEEE expf and division the activation kernels were
// compute-bound (SwiGLU forward 2.6 TB/s vs 3.8 TB/s on H200, measured; templates/README.md).
// For the same reason the generated code divides with __fdividef and exponentiates with __expf.
#ifndef OPFUSE_TEMPLATES_COMMON_SCALAR_MATH_CUH_
#define OPFUSE_TEMPLATES_COMMON_SCALAR_MATH_CUH_

namespace opfuse {

// The most learned parameters a user-defined op's functor reads (ir::kMaxUserParams): the size of
// the activation kernels' `learned` pointer arrays (activation.cuh). An enumerator, so that a
// header using none of it compiles without nvcc's unused-variable warning.
enum : int { kMaxLearnedParams = 8 };

__device__ __forceinline__ float sigmoid(float z) { return __fdividef(1.0f, 1.0f + __expf(-z)); }

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_COMMON_SCALAR_MATH_CUH_
