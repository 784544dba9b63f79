// opfuse generated kernel reduce_column_partials_bf16
// Written by fusec from mlp_residual.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence fc1, backward, fused norm_backward_residual:
//     layernorm_backward "layernorm_0" (mlp_residual.fuse:20)
//     grad_add "layernorm_0" (mlp_residual.fuse:20)
//     dgamma, dbeta = column sums of the partials
//
// Name expression (NVRTC):
//   opfuse::reduce_column_partials<__nv_bfloat16>
// Parameter, by value (templates/README.md):
//   opfuse::ColumnPartialsParams<__nv_bfloat16>
#include "common/column_partials.cuh"

template __global__ void opfuse::reduce_column_partials<__nv_bfloat16>(opfuse::ColumnPartialsParams<__nv_bfloat16>);
