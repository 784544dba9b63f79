// Host mirrors of kernel templates' params structs that several GPU tests launch directly
// (tests/gpu/test_block_cast_gpu.cpp, test_block_activation_gpu.cpp, test_block_norm_gpu.cpp,
// test_micro_scale_gpu.cpp),
// field for field; the sizes are checked against the layout rules of runtime/gpu/kernel_params.h.
#pragma once

namespace opfuse::test {

// Mirrors templates/block_cast.cuh's BlockCastParams<Input, Output> field for field.
struct BlockCastParams {
  const void* x;
  void* y;
  float* y_scale_inv;
  void* y_t;
  float* y_t_scale_inv;
  float epsilon;
  int power_of_2_scale;
  int rows;
  int cols;
};
static_assert(sizeof(BlockCastParams) == 56);

// Mirrors templates/micro_scale.cuh's MicroScaleParams<Input, Output> field for field.
struct MicroScaleParams {
  const void* x;
  unsigned char* codes;
  unsigned char* scales;
  void* y;
  const float* tensor_scale;
  const unsigned int* step;
  float* amax;
  const void* scale_record;
  unsigned long long seed;
  unsigned int stream;
  int rows;
  int cols;
};
static_assert(sizeof(MicroScaleParams) == 88);

}  // namespace opfuse::test
