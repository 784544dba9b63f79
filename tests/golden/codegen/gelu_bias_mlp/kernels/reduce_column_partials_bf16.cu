// opfuse generated kernel reduce_column_partials_bf16
// Written by fusec from gelu_bias_mlp.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence gpt_mlp, backward, fused cast_dbias:
//     bias_grad "c_proj" (gelu_bias_mlp.fuse:17)
//     cast_fp8 "c_proj.grad_output" (gelu_bias_mlp.fuse:17)
//     dbias = column sums of the partials
//     quantizers: c_proj.grad_output (e5m2)
//   sequence gpt_mlp, backward, fused dact_cast:
//     activation_backward "gelu_0" (gelu_bias_mlp.fuse:16)
//     bias_grad "c_fc" (gelu_bias_mlp.fuse:15)
//     cast_fp8 "c_fc.grad_output" (gelu_bias_mlp.fuse:15)
//     dbias = column sums of the partials
//     quantizers: c_fc.grad_output (e5m2)
//   sequence gpt_mlp, backward:
//     layernorm_backward "ln_2" (gelu_bias_mlp.fuse:14)
//     dgamma, dbeta = column sums of the partials
//
// Name expression (NVRTC):
//   opfuse::reduce_column_partials<__nv_bfloat16>
// Parameter, by value (templates/README.md):
//   opfuse::ColumnPartialsParams<__nv_bfloat16>
#include "common/column_partials.cuh"

template __global__ void opfuse::reduce_column_partials<__nv_bfloat16>(opfuse::ColumnPartialsParams<__nv_bfloat16>);
