// The kernel shapes codegen lowers a fused group to (docs/codegen.md, note "Kernels by parts"):
// which shape a group of op kinds selects, and whether every kind of the group fits it. Codegen
// dispatches through select_kernel_shape (compiler/codegen/plan_groups.cpp), and a declared fusion
// (docs/language.md, "Declared fusions") is checked against the same table when it is declared,
// so a pattern codegen cannot lower is an error at build time, never at run time.
#pragma once

#include <span>
#include <string_view>

#include "ir/op_table.h"

namespace opfuse::ir {

enum class KernelShape : uint8_t {
  Alias,
  Fprop,
  Dgrad,
  Wgrad,
  NormForward,
  NormBackward,
  RowForward,  // a norm-like user-defined op (templates/row_expr.cuh)
  RowBackward,
  ActivationForward,
  ActivationBackward,
  BiasAdd,
  Cast,
  Fp8Transpose,
  EmulatedCast,
  TensorStats,
  TensorCapture,
  Collective,
  ModifyTensor,
  Dbias,
  ConstantScale,
  Quantize,
  Dropout,
  DropoutBackward,
};

struct KernelShapeInfo {
  KernelShape shape;
  std::string_view name;
  std::string_view parts;   // what a group of this shape may hold, for messages and docs
  bool (*selects)(OpKind);  // a group holding such a kind takes this shape (in table order)
  bool (*allows)(OpKind);   // every kind of the group must be one of these
};

std::span<const KernelShapeInfo> kernel_shapes();

// The shape a group of these kinds takes: the first in table order that one of its kinds selects
// (a group of aliases only: Alias). nullptr when no shape selects it.
const KernelShapeInfo* select_kernel_shape(std::span<const OpKind> kinds);

// Whether a group of these kinds lowers: it selects a shape that allows each of its kinds. The
// emitters check the group's dataflow on top (which operand each part reads), at plan time.
bool kernel_shape_allows(std::span<const OpKind> kinds);

}  // namespace opfuse::ir
