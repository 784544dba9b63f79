// Dense host tensors of the CPU reference executor, and the error it reports for bad run-time
// inputs (unbound symbols, wrong input shapes): a user error, not an internal one.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "opfuse/error.h"

namespace opfuse::cpu {

// Values of a sequence's symbolic dimensions, e.g. {"tokens", 64}.
using Bindings = std::map<std::string, int64_t, std::less<>>;

// A user error at run time (the message says what to change); tools exit with code 1.
struct ReferenceError : opfuse::Error {
  using opfuse::Error::Error;
};

// Row-major tensor. T is float (the GPU's arithmetic) or double (for measuring error).
template <typename T>
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<T> data;

  static Tensor zeros(const std::vector<int64_t>& shape) {
    Tensor t;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    t.shape = shape;
    t.data.assign(static_cast<size_t>(n), T(0));
    return t;
  }
  int64_t numel() const { return static_cast<int64_t>(data.size()); }
  // Size of the last dimension (1 for a scalar) and the number of rows before it.
  int64_t cols() const { return shape.empty() ? 1 : shape.back(); }
  int64_t rows() const { return cols() == 0 ? 0 : numel() / cols(); }
};

}  // namespace opfuse::cpu
