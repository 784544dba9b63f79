// The Python extension module `opfuse._opfuse` (docs/python.md): what each binding file adds to
// it and the pieces they share. The module binds the embedding API (runtime/include/opfuse) and
// the CPU reference (reference_session.h); opfuse/__init__.py is the package's front.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "opfuse/program.h"

namespace opfuse::python {

namespace nb = nanobind;

// A compiled program as Python sees it: the GPU program (kernels compiled by NVRTC) and, made at
// the first CPU session, the front end's IR that the reference executor runs.
struct PyProgram {
  Program program;
  std::string path;    // the .fuse file; empty when compiled from text
  std::string source;  // the text, when compiled from text
  std::string name;    // the file name diagnostics show
  std::string recipe;  // CompileOptions::recipe
  std::shared_ptr<const ir::Program> front_end;

  // The sequence the CPU reference runs (empty name: the program's only one); UsageError naming
  // the sequences otherwise.
  const ir::Sequence& reference_sequence(const std::string& sequence);
};

// A CUDA stream from Python: None (the legacy default stream), an int (a cudaStream_t, as
// torch.cuda.Stream.cuda_stream gives), an object with a `cuda_stream` attribute (torch, cupy)
// or one with `__cuda_stream__()` (the CUDA stream protocol). TypeError otherwise.
cudaStream_t stream_from(nb::handle stream);

// The DLPack dtype of a tensor dtype; and its name for messages ("bfloat16", "float32").
nb::dlpack::dtype dlpack_dtype(TensorDType dtype);
std::string dlpack_dtype_name(nb::dlpack::dtype dtype);

// An array given to a session: any DLPack or buffer-protocol array, read-only ones included.
using InputArray = nb::ndarray<nb::ro>;

// The shape of a DLPack array; and the checks every session makes of an array for a tensor:
// its shape, dtype (`dtype`) and dense row-major strides, UsageError naming `where` otherwise.
std::vector<std::int64_t> array_shape(const InputArray& array);
void check_layout(const InputArray& array, const TensorInfo& info, nb::dlpack::dtype dtype,
                  const std::string& where);

void bind_errors(nb::module_& m);
void bind_types(nb::module_& m);
void bind_program(nb::module_& m);
void bind_session(nb::module_& m);
void bind_reference_session(nb::module_& m);
// quantized_bindings.cpp: quantize, dequantize, quantized_tensor_info.
void bind_quantized(nb::module_& m);
// bench_bindings.cpp: the private `_bench` submodule (opfuse's GEMM runner for bench/peers).
void bind_bench(nb::module_& m);

}  // namespace opfuse::python
