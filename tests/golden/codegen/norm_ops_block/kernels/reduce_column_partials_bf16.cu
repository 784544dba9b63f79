// opfuse generated kernel reduce_column_partials_bf16
// Written by fusec from norm_ops_block.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence norm_mlp, backward, fused cast_dbias:
//     bias_grad "fc2" (norm_ops_block.fuse:21)
//     cast_fp8 "fc2.grad_output" (norm_ops_block.fuse:21)
//     dbias = column sums of the partials
//     quantizers: fc2.grad_output (e5m2)
//   sequence norm_mlp, backward, fused dact_cast:
//     activation_backward "gelu_0" (norm_ops_block.fuse:20)
//     bias_grad "fc1" (norm_ops_block.fuse:19)
//     cast_fp8 "fc1.grad_output" (norm_ops_block.fuse:19)
//     dbias = column sums of the partials
//     quantizers: fc1.grad_output (e5m2)
//   sequence norm_mlp, backward:
//     user_norm_backward "norm1" (norm_ops_block.fuse:18)
//     dw = column sums of the partials
//
// Name expression (NVRTC):
//   opfuse::reduce_column_partials<__nv_bfloat16>
// Parameter, by value (templates/README.md):
//   opfuse::ColumnPartialsParams<__nv_bfloat16>
#include "common/column_partials.cuh"

template __global__ void opfuse::reduce_column_partials<__nv_bfloat16>(opfuse::ColumnPartialsParams<__nv_bfloat16>);
