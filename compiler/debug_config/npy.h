// NumPy's .npy format, version 1.0 (numpy.lib.format), for the tensors DumpTensors writes: the
// magic "\x93NUMPY", the version bytes 1 0, a little-endian uint16 header length, an ASCII
// Python dict `{'descr': '<f4', 'fortran_order': False, 'shape': (r, c), }` padded with spaces
// and a newline so that the data starts at a multiple of 64 bytes, then the data, row-major.
// numpy.load reads what write_npy writes; read_npy reads it back for tests and tools.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace opfuse::debug {

// A file that is not a well-formed .npy of a supported type, or cannot be written or read. The
// message names the file and says what is wrong.
class NpyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The element types written: float32 ('<f4') and uint8 ('|u1').
enum class NpyType : uint8_t { Float32, Uint8 };

struct NpyArray {
  NpyType type = NpyType::Float32;
  std::vector<int64_t> shape;  // () for a scalar
  std::vector<float> f32;      // Float32 data
  std::vector<uint8_t> u8;     // Uint8 data
};

// The file's bytes: header and data.
std::string npy_bytes(const NpyArray& array);
// Writes `array` to `path` atomically (a reader sees no file or the whole file). Throws NpyError
// "cannot write '<path>': <reason>". Checks that the data size matches the shape.
void write_npy(const std::string& path, const NpyArray& array);
// Parses .npy bytes; `name` is the file for messages. Throws NpyError "<name>: <what is wrong>"
// for a bad magic, another version, a malformed header, another dtype, Fortran order, or data
// shorter or longer than the shape says.
NpyArray parse_npy(std::string_view bytes, const std::string& name);
NpyArray read_npy(const std::string& path);

}  // namespace opfuse::debug
