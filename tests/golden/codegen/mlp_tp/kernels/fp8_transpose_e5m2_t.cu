// opfuse generated kernel fp8_transpose_e5m2_t
// Written by fusec from mlp_tp.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence mlp, backward:
//     fp8_transpose "fc2.grad_output" (mlp_tp.fuse:17)
//     transposed copy of e5m2
//     quantizers: fc2.grad_output (e5m2)
//
// Name expression (NVRTC):
//   opfuse::fp8_transpose<__nv_fp8_e5m2, true>
// Parameter, by value (templates/README.md):
//   opfuse::Fp8TransposeParams<__nv_fp8_e5m2>
#include "cast_transpose.cuh"

template __global__ void opfuse::fp8_transpose<__nv_fp8_e5m2, true>(opfuse::Fp8TransposeParams<__nv_fp8_e5m2>);
