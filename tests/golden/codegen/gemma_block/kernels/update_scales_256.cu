// opfuse generated kernel update_scales_256
// Written by fusec from gemma_block.fuse; `fusec build` compiles it with NVRTC through the name expression
// below. Do not edit: change the .fuse program and rebuild.
//
// Used by:
//   sequence gemma_mlp, backward:
//     the end-of-step scale update
//     update every quantizer's amax history, scale and scale_inv (delayed scaling)
//     quantizers: gate_up.input (e4m3), gate_up.weight (e4m3), gate_up.grad_output (e5m2), down.input (e4m3), down.weight (e4m3), down.grad_output (e5m2)
//
// Name expression (NVRTC):
//   opfuse::update_scales<256>
// Parameter, by value (templates/README.md):
//   opfuse::ScaleUpdateParams
#include "scale_update.cuh"

template __global__ void opfuse::update_scales<256>(opfuse::ScaleUpdateParams);
