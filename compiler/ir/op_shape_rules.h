// The shape rules of the fixed ops (compiler/ir/op_table.cpp's table names them): each checks an
// op's input and attributes and gives its output type, its parameters and any errors.
#pragma once

#include "ir/op_table.h"

namespace opfuse::ir::shape_rules {

ShapeResult same_shape(const ShapeInput& in);
ShapeResult layernorm_shape(const ShapeInput& in);
ShapeResult rmsnorm_shape(const ShapeInput& in);
ShapeResult linear_shape(const ShapeInput& in);
ShapeResult all_gather_shape(const ShapeInput& in);
ShapeResult reduce_scatter_shape(const ShapeInput& in);
ShapeResult bias_shape(const ShapeInput& in);
ShapeResult gated_shape(const ShapeInput& in);
ShapeResult user_plain_shape(const ShapeInput& in);
ShapeResult user_norm_shape(const ShapeInput& in);
ShapeResult user_gated_shape(const ShapeInput& in);
ShapeResult add_extra_input_shape(const ShapeInput& in);
ShapeResult make_extra_output_shape(const ShapeInput& in);
ShapeResult reshape_shape(const ShapeInput& in);
ShapeResult dropout_shape(const ShapeInput& in);

}  // namespace opfuse::ir::shape_rules
