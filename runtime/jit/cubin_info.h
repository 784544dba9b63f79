// Resource usage read from a cubin itself: the register count and stack size that ptxas recorded
// for every function, found in the ELF's `.nv.info` sections. Unlike the `ptxas -v` lines of an
// NVRTC log (absent when NVRTC serves a compile from its own cache), the cubin always carries
// them. See note "Usage sources" in nvrtc_compiler.cpp for which source wins.
#pragma once

#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace opfuse::jit {

// The bytes are not a well-formed CUDA ELF (truncated, damaged, or another kind of file).
struct CubinFormatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One function symbol of the cubin. A value the cubin holds no record for is -1.
struct CubinFunction {
  std::string name;       // the symbol: mangled kernel name, or "$kernel$callee" for a callee
  bool is_entry = false;  // a __global__ kernel (STO_CUDA_ENTRY in the symbol's st_other)
  int registers = -1;     // EIATTR_REGCOUNT
  int frame_bytes = -1;   // EIATTR_FRAME_SIZE: this function's own local stack frame
  int stack_bytes = -1;   // EIATTR_MIN_STACK_SIZE: the frame plus its callees' ("cumulative")
};

struct CubinInfo {
  std::vector<CubinFunction> functions;  // symbol-table order

  // The entry functions only (what ptxas calls "entry function").
  std::vector<CubinFunction> entry_functions() const;
};

// Reads a 64-bit little-endian CUDA ELF (e_machine EM_CUDA). Every offset and size is checked
// against the buffer: damaged input throws CubinFormatError naming what is wrong, never reads
// outside `cubin`. Spill byte counts are not part of the cubin (ptxas reports them in its log).
CubinInfo read_cubin_info(std::span<const char> cubin);

}  // namespace opfuse::jit
