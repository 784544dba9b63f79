// opfuse generated kernel fp8_transpose_e4m3_t
// Written by fusec from mlp_tp.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence mlp, forward:
//     fp8_transpose "fc1.input" (mlp_tp.fuse:15)
//     transposed copy of e4m3
//     quantizers: fc1.input (e4m3)
//
// Name expression (NVRTC):
//   opfuse::fp8_transpose<__nv_fp8_e4m3, true>
// Parameter, by value (templates/README.md):
//   opfuse::Fp8TransposeParams<__nv_fp8_e4m3>
#include "cast_transpose.cuh"

template __global__ void opfuse::fp8_transpose<__nv_fp8_e4m3, true>(opfuse::Fp8TransposeParams<__nv_fp8_e4m3>);
