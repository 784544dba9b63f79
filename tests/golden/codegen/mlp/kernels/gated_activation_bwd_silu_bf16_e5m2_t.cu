// opfuse generated kernel gated_activation_bwd_silu_bf16_e5m2_t
// Written by fusec from mlp.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence mlp, backward, fused dact_cast:
//     gated_activation_backward "swiglu_0" (mlp.fuse:16)
//     cast_fp8 "fc1.grad_output" (mlp.fuse:15)
//     swiglu backward bf16 -> e5m2 + transposed copy
//     quantizers: fc1.grad_output (e5m2)
//
// Name expression (NVRTC):
//   opfuse::gated_activation_bwd<opfuse::Silu, __nv_bfloat16, __nv_fp8_e5m2, true, false>
// Parameter, by value (templates/README.md):
//   opfuse::ActivationBwdParams<__nv_bfloat16, __nv_fp8_e5m2>
#include "activation.cuh"

template __global__ void opfuse::gated_activation_bwd<opfuse::Silu, __nv_bfloat16, __nv_fp8_e5m2, true, false>(opfuse::ActivationBwdParams<__nv_bfloat16, __nv_fp8_e5m2>);
