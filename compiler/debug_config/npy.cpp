#include "debug_config/npy.h"

#include <bit>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "support/atomic_file.h"

namespace opfuse::debug {

namespace {

static_assert(std::endian::native == std::endian::little, ".npy data is written little-endian");

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr size_t kPreamble = 10;  // magic, two version bytes, the uint16 header length
constexpr size_t kAlign = 64;

std::string_view descr_of(NpyType t) { return t == NpyType::Float32 ? "<f4" : "|u1"; }
size_t item_size(NpyType t) { return t == NpyType::Float32 ? 4 : 1; }

std::string shape_text(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  return fmt::format("({})", fmt::join(shape, ", "));
}

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t data_count(const NpyArray& a) {
  return a.type == NpyType::Float32 ? a.f32.size() : a.u8.size();
}

// A tiny reader of the header dict numpy writes: 'key': value pairs, values a quoted string,
// True/False, or a tuple of integers.
class HeaderReader {
 public:
  HeaderReader(std::string_view text, const std::string& name) : text_(text), name_(name) {}

  void expect(char c) {
    skip_space();
    if (pos_ >= text_.size() || text_[pos_] != c) fail(fmt::format("expected '{}'", c));
    ++pos_;
  }
  bool peek(char c) {
    skip_space();
    return pos_ < text_.size() && text_[pos_] == c;
  }
  std::string quoted() {
    skip_space();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"'))
      fail("expected a quoted string");
    const char q = text_[pos_++];
    const size_t end = text_.find(q, pos_);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string s(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }
  bool boolean() {
    skip_space();
    if (text_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (text_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    fail("expected True or False");
  }
  std::vector<int64_t> tuple() {
    expect('(');
    std::vector<int64_t> out;
    while (!peek(')')) {
      skip_space();
      size_t digits = 0;
      int64_t v = 0;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        if (v > (int64_t(1) << 48)) fail("a dimension is too large");
        v = v * 10 + (text_[pos_++] - '0');
        ++digits;
      }
      if (digits == 0) fail("expected a dimension");
      out.push_back(v);
      if (!peek(',')) break;
      ++pos_;
    }
    expect(')');
    return out;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw NpyError(fmt::format("{}: malformed .npy header ({} at offset {})", name_, what, pos_));
  }

 private:
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n')) ++pos_;
  }
  std::string_view text_;
  const std::string& name_;
  size_t pos_ = 0;
};

}  // namespace

std::string npy_bytes(const NpyArray& array) {
  const int64_t count = element_count(array.shape);
  if (count < 0 || size_t(count) != data_count(array)) {
    throw NpyError(fmt::format(".npy array of shape {} holds {} values", shape_text(array.shape),
                               data_count(array)));
  }
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                   descr_of(array.type), shape_text(array.shape));
  // Pad with spaces to the alignment, the newline last (numpy.lib.format's layout).
  const size_t total = (kPreamble + header.size() + 1 + kAlign - 1) / kAlign * kAlign;
  header.append(total - kPreamble - header.size() - 1, ' ');
  header.push_back('\n');
  std::string out(kMagic);
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(char(header.size() & 0xFF));
  out.push_back(char(header.size() >> 8));
  out += header;
  const size_t bytes = size_t(count) * item_size(array.type);
  const size_t at = out.size();
  out.resize(at + bytes);
  if (bytes > 0) {
    const void* src = array.type == NpyType::Float32 ? static_cast<const void*>(array.f32.data())
                                                     : static_cast<const void*>(array.u8.data());
    std::memcpy(out.data() + at, src, bytes);
  }
  return out;
}

void write_npy(const std::string& path, const NpyArray& array) {
  const std::string bytes = npy_bytes(array);
  const std::string error = write_file_atomically(path, bytes, Durability::VisibleOnly);
  if (!error.empty()) throw NpyError(fmt::format("cannot write '{}': {}", path, error));
}

NpyArray parse_npy(std::string_view bytes, const std::string& name) {
  if (bytes.size() < kPreamble || bytes.substr(0, kMagic.size()) != kMagic)
    throw NpyError(fmt::format("{}: not a .npy file (bad magic)", name));
  if (bytes[6] != 1 || bytes[7] != 0) {
    throw NpyError(fmt::format("{}: .npy version {}.{} (only 1.0 is read)", name, int(bytes[6]),
                               int(bytes[7])));
  }
  const size_t header_len = size_t(uint8_t(bytes[8])) | (size_t(uint8_t(bytes[9])) << 8);
  if (kPreamble + header_len > bytes.size())
    throw NpyError(fmt::format("{}: .npy header runs past the end of the file", name));
  if ((kPreamble + header_len) % 16 != 0 || header_len == 0 ||
      bytes[kPreamble + header_len - 1] != '\n')
    throw NpyError(fmt::format("{}: .npy header is not padded to 16 bytes ending in '\\n'", name));
  HeaderReader h(bytes.substr(kPreamble, header_len), name);
  NpyArray out;
  bool has_descr = false, has_order = false, has_shape = false;
  h.expect('{');
  while (!h.peek('}')) {
    const std::string key = h.quoted();
    h.expect(':');
    if (key == "descr") {
      const std::string descr = h.quoted();
      if (descr == "<f4") {
        out.type = NpyType::Float32;
      } else if (descr == "|u1" || descr == "<u1") {
        out.type = NpyType::Uint8;
      } else {
        throw NpyError(fmt::format("{}: .npy dtype '{}' (float32 '<f4' or uint8 '|u1' are read)",
                                   name, descr));
      }
      has_descr = true;
    } else if (key == "fortran_order") {
      if (h.boolean()) throw NpyError(fmt::format("{}: Fortran-order .npy is not read", name));
      has_order = true;
    } else if (key == "shape") {
      out.shape = h.tuple();
      has_shape = true;
    } else {
      h.fail(fmt::format("unknown key '{}'", key));
    }
    if (!h.peek(',')) break;
    h.expect(',');
  }
  h.expect('}');
  if (!has_descr || !has_order || !has_shape)
    h.fail("the header needs descr, fortran_order and shape");
  const int64_t count = element_count(out.shape);
  const size_t data = bytes.size() - kPreamble - header_len;
  const size_t item = item_size(out.type);
  if (data / item != size_t(count) || data % item != 0) {
    throw NpyError(fmt::format("{}: .npy data holds {} bytes, shape {} needs {}", name, data,
                               shape_text(out.shape), size_t(count) * item));
  }
  const char* src = bytes.data() + kPreamble + header_len;
  if (out.type == NpyType::Float32) {
    out.f32.resize(size_t(count));
    if (count > 0) std::memcpy(out.f32.data(), src, data);
  } else {
    out.u8.assign(src, src + data);
  }
  return out;
}

NpyArray read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NpyError(fmt::format("{}: cannot read", path));
  std::ostringstream s;
  s << in.rdbuf();
  return parse_npy(s.str(), path);
}

}  // namespace opfuse::debug
