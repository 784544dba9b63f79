// Resource usage read from a cubin itself: the register count and stack size that ptxas recorded
// for every function, and the parameter sizes of every entry, found in the ELF's `.nv.info`
// sections. Unlike the `ptxas -v` lines of an
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

// One parameter of an entry function as EIATTR_KPARAM_INFO records it: where it lies in the
// parameter constant bank and how many bytes it takes. opfuse kernels have one (the params struct).
struct CubinParam {
  int ordinal = 0;  // position in the signature
  int offset = 0;   // byte offset in the parameter bank
  int bytes = 0;
};

// One function symbol of the cubin. A value the cubin holds no record for is -1.
struct CubinFunction {
  std::string name;       // the symbol: mangled kernel name, or "$kernel$callee" for a callee
  bool is_entry = false;  // a __global__ kernel (STO_CUDA_ENTRY in the symbol's st_other)
  int registers = -1;     // EIATTR_REGCOUNT
  int frame_bytes = -1;   // EIATTR_FRAME_SIZE: this function's own local stack frame
  int stack_bytes = -1;   // EIATTR_MIN_STACK_SIZE: the frame plus its callees' ("cumulative")
  // Entries: the bytes of all parameters together (EIATTR_CBANK_PARAM_SIZE, else the size of
  // EIATTR_PARAM_CBANK) and each parameter, by ordinal; -1 and empty for callees.
  int params_bytes = -1;
  std::vector<CubinParam> params;
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
