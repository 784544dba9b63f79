// opfuse generated kernel activation_bwd_gelu_bf16_e5m2_t_dbias
// Written by fusec from gelu_bias_mlp.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence gpt_mlp, backward, fused dact_cast:
//     activation_backward "gelu_0" (gelu_bias_mlp.fuse:16)
//     bias_grad "c_fc" (gelu_bias_mlp.fuse:15)
//     cast_fp8 "c_fc.grad_output" (gelu_bias_mlp.fuse:15)
//     gelu backward bf16 -> e5m2 + transposed copy + dbias partial sums
//     quantizers: c_fc.grad_output (e5m2)
//
// Name expression (NVRTC):
//   opfuse::activation_bwd<opfuse::Gelu, __nv_bfloat16, __nv_fp8_e5m2, true, true>
// Parameter, by value (templates/README.md):
//   opfuse::ActivationBwdParams<__nv_bfloat16, __nv_fp8_e5m2>
#include "activation.cuh"

template __global__ void opfuse::activation_bwd<opfuse::Gelu, __nv_bfloat16, __nv_fp8_e5m2, true, true>(opfuse::ActivationBwdParams<__nv_bfloat16, __nv_fp8_e5m2>);
