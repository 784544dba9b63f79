#include "api/state_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <tuple>
#include <utility>

#include "jit/sha256.h"
#include "plan/enums.h"
#include "support/atomic_file.h"

namespace opfuse::api {

namespace {

// The payload holds floats and tensor elements exactly as they sit in memory; the format is
// little-endian, so a big-endian host would need byte swaps that this build does not have.
static_assert(std::endian::native == std::endian::little,
              "state files store little-endian data as it sits in memory");

using nlohmann::json;

// Layout (docs/state_files.md): a fixed prelude, the JSON header, the payload, the checksum.
constexpr std::string_view kMagic{"OPFSTAT\n", 8};
constexpr std::size_t kVersionOffset = 8;
constexpr std::size_t kReservedOffset = 12;
constexpr std::size_t kHeaderSizeOffset = 16;
constexpr std::size_t kPayloadSizeOffset = 24;
constexpr std::size_t kPreludeBytes = 32;
constexpr std::size_t kChecksumBytes = 32;
// The header is padded with spaces (valid JSON whitespace) and every payload item starts on this
// boundary, so each tensor's absolute file offset is aligned for a direct copy or mmap.
constexpr std::size_t kAlignment = 64;
// A quantizer's payload: scale, scale_inv, then the amax history, all float32.
constexpr std::size_t kQuantizerScalarFloats = 2;

std::size_t align_up(std::size_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

void append_u32(std::string& out, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
}

void append_u64(std::string& out, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
}

std::uint64_t load_le(std::string_view bytes, std::size_t offset, int width) {
  std::uint64_t value = 0;
  for (int i = 0; i < width; ++i) {
    value |= std::uint64_t{static_cast<unsigned char>(bytes[offset + i])} << (8 * i);
  }
  return value;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Elements of `shape` times `element_bytes`, or nullopt for a negative dimension or overflow.
std::optional<std::uint64_t> byte_size(const std::vector<std::int64_t>& shape, int element_bytes) {
  std::uint64_t total = static_cast<std::uint64_t>(element_bytes);
  for (const std::int64_t dim : shape) {
    if (dim < 0) return std::nullopt;
    if (__builtin_mul_overflow(total, static_cast<std::uint64_t>(dim), &total)) return std::nullopt;
  }
  return total;
}

std::optional<plan::DType> dtype_named(std::string_view name) {
  for (const plan::DType t : {plan::DType::BF16, plan::DType::FP16, plan::DType::FP32,
                              plan::DType::E4M3, plan::DType::E5M2}) {
    if (plan::dtype_name(t) == name) return t;
  }
  return std::nullopt;
}

// --- writing -------------------------------------------------------------------------------------

[[noreturn]] void refuse_to_write(const std::string& path, const std::string& why) {
  throw UsageError(fmt::format("cannot write state file {}: {}; nothing was written", path, why));
}

// Throws UsageError for a state that would write a file read_state_file refuses.
void check_writable(const std::string& path, const StateFile& state) {
  const auto refuse = [&](const std::string& why) { refuse_to_write(path, why); };
  if (state.step < 0) refuse(fmt::format("the step count is negative ({})", state.step));
  if (state.quantizers_only && !state.tensors.empty()) {
    refuse(
        fmt::format("it holds the quantizer state only, yet has {} tensors", state.tensors.size()));
  }
  std::set<std::string_view> names;
  for (const StateTensor& tensor : state.tensors) {
    if (tensor.name.empty()) refuse("a tensor has an empty name");
    if (!names.insert(tensor.name).second)
      refuse(fmt::format("two tensors are named '{}'", tensor.name));
    const auto needed = byte_size(tensor.shape, plan::dtype_bytes(tensor.dtype));
    if (!needed) {
      refuse_to_write(path, fmt::format("tensor '{}' has an invalid shape {}", tensor.name,
                                        shape_text(tensor.shape)));
    }
    if (*needed != tensor.bytes.size()) {
      refuse(fmt::format("tensor '{}' has {} bytes, its shape {} of {} needs {}", tensor.name,
                         tensor.bytes.size(), shape_text(tensor.shape),
                         plan::dtype_name(tensor.dtype), *needed));
    }
  }
  names.clear();
  for (const StateQuantizer& quantizer : state.quantizers) {
    if (quantizer.name.empty()) refuse("a quantizer has an empty name");
    if (!names.insert(quantizer.name).second) {
      refuse(fmt::format("two quantizers are named '{}'", quantizer.name));
    }
    if (quantizer.state.amax_history.empty()) {
      refuse(fmt::format("quantizer '{}' has an empty amax history", quantizer.name));
    }
  }
}

std::string encode(const StateFile& state) {
  // Lay out the payload first: the header records every item's offset and size.
  json tensors = json::array();
  std::size_t payload_size = 0;
  for (const StateTensor& tensor : state.tensors) {
    payload_size = align_up(payload_size);
    tensors.push_back({{"name", tensor.name},
                       {"dtype", std::string(plan::dtype_name(tensor.dtype))},
                       {"shape", tensor.shape},
                       {"offset", payload_size},
                       {"size", tensor.bytes.size()}});
    if (tensor.shard.sharded())
      tensors.back()["shard"] = {{"dim", tensor.shard.dim}, {"blocks", tensor.shard.blocks}};
    payload_size += tensor.bytes.size();
  }
  json quantizers = json::array();
  for (const StateQuantizer& quantizer : state.quantizers) {
    payload_size = align_up(payload_size);
    const std::size_t length = quantizer.state.amax_history.size();
    quantizers.push_back({{"name", quantizer.name},
                          {"history_length", length},
                          {"offset", payload_size},
                          {"measurements", quantizer.state.measurements}});
    payload_size += (length + kQuantizerScalarFloats) * sizeof(float);
  }
  json header_json = {{"program", state.program},
                      {"recipe", state.recipe},
                      {"step", state.step},
                      {"tensors", std::move(tensors)},
                      {"quantizers", std::move(quantizers)}};
  if (state.tp > 1) header_json["parallel"] = {{"tp", state.tp}, {"rank", state.rank}};
  if (state.quantizers_only) header_json["contents"] = "quantizers";
  std::string header = header_json.dump(1);
  header.resize(align_up(kPreludeBytes + header.size()) - kPreludeBytes, ' ');

  std::string out;
  out.reserve(kPreludeBytes + header.size() + payload_size + kChecksumBytes);
  out.append(kMagic);
  append_u32(out, kStateFileFormatVersion);
  append_u32(out, 0);  // reserved
  append_u64(out, header.size());
  append_u64(out, payload_size);
  out += header;
  const std::size_t payload_start = out.size();
  for (const StateTensor& tensor : state.tensors) {
    out.resize(payload_start + align_up(out.size() - payload_start), '\0');
    out.append(reinterpret_cast<const char*>(tensor.bytes.data()), tensor.bytes.size());
  }
  for (const StateQuantizer& quantizer : state.quantizers) {
    out.resize(payload_start + align_up(out.size() - payload_start), '\0');
    const float scalars[kQuantizerScalarFloats] = {quantizer.state.scale,
                                                   quantizer.state.scale_inv};
    out.append(reinterpret_cast<const char*>(scalars), sizeof scalars);
    out.append(reinterpret_cast<const char*>(quantizer.state.amax_history.data()),
               quantizer.state.amax_history.size() * sizeof(float));
  }
  jit::Sha256 hasher;
  hasher.update(out);
  const jit::Sha256Digest digest = hasher.finish();
  out.append(reinterpret_cast<const char*>(digest.data()), digest.size());
  return out;
}

// --- reading -------------------------------------------------------------------------------------

[[noreturn]] void throw_unreadable(const std::string& path, int error_number) {
  throw StateFileError(
      fmt::format("cannot read state file {}: {}; check the path and its permissions", path,
                  std::strerror(error_number)));
}

std::string read_whole_file(const std::string& path) {
  const auto fail = [&](int error_number) { throw_unreadable(path, error_number); };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(errno);
  std::string bytes;
  // Checkpoints can be gigabytes: size the buffer once (the loop still reads to the real end).
  struct stat info {};
  if (::fstat(fd, &info) == 0 && info.st_size > 0)
    bytes.reserve(static_cast<std::size_t>(info.st_size));
  char buffer[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got == 0) break;
    if (got < 0) {
      if (errno == EINTR) continue;
      const int error_number = errno;
      ::close(fd);
      fail(error_number);
    }
    bytes.append(buffer, static_cast<std::size_t>(got));
  }
  ::close(fd);
  return bytes;
}

[[noreturn]] void throw_truncated(const std::string& path, std::size_t size, std::size_t needed) {
  throw StateFileError(fmt::format(
      "state file {} is truncated: it has {} bytes, its layout needs {}; it was cut short (an "
      "interrupted copy or a full disk?): use a complete copy",
      path, size, needed));
}

[[noreturn]] void throw_damaged(const std::string& path, const std::string& what) {
  throw StateFileError(fmt::format(
      "state file {} is damaged: {}; it was altered after opfuse wrote it: restore it from a "
      "good copy",
      path, what));
}

// Checks magic, version, sizes and checksum; returns the header text and the payload.
std::pair<std::string_view, std::string_view> verified_sections(const std::string& path,
                                                                std::string_view bytes) {
  if (bytes.size() < kMagic.size() && kMagic.starts_with(bytes)) {
    throw_truncated(path, bytes.size(), kPreludeBytes + kChecksumBytes);
  }
  if (!bytes.starts_with(kMagic)) {
    throw StateFileError(fmt::format(
        "{} is not an opfuse state file (it does not begin with the state-file magic); pass a "
        "file that opfuse saved",
        path));
  }
  if (bytes.size() < kPreludeBytes)
    throw_truncated(path, bytes.size(), kPreludeBytes + kChecksumBytes);
  const std::uint64_t version = load_le(bytes, kVersionOffset, 4);
  if (version > kStateFileFormatVersion) {
    throw StateFileError(fmt::format(
        "state file {} was written by a newer opfuse: format version {}, this build reads {}; "
        "load it with that opfuse version or a later one",
        path, version, kStateFileFormatVersion));
  }
  if (version == 0) throw_damaged(path, "its format version is 0, which no opfuse writes");
  const std::uint64_t header_size = load_le(bytes, kHeaderSizeOffset, 8);
  const std::uint64_t payload_size = load_le(bytes, kPayloadSizeOffset, 8);
  // Sizes come from the file: compare without overflowing before trusting their sum.
  const std::uint64_t room = bytes.size() - kPreludeBytes;
  if (header_size > room || payload_size > room - header_size ||
      room - header_size - payload_size < kChecksumBytes) {
    std::uint64_t needed = kPreludeBytes + kChecksumBytes;
    if (__builtin_add_overflow(needed, header_size, &needed) ||
        __builtin_add_overflow(needed, payload_size, &needed)) {
      needed = std::numeric_limits<std::uint64_t>::max();  // a damaged size field: report "huge"
    }
    throw_truncated(path, bytes.size(), needed);
  }
  const std::size_t total = kPreludeBytes + header_size + payload_size + kChecksumBytes;
  if (bytes.size() > total) {
    throw_damaged(path, fmt::format("it has {} bytes after the end its layout declares",
                                    bytes.size() - total));
  }
  jit::Sha256 hasher;
  hasher.update(bytes.substr(0, total - kChecksumBytes));
  const jit::Sha256Digest computed = hasher.finish();
  const std::string_view stored = bytes.substr(total - kChecksumBytes);
  if (std::memcmp(computed.data(), stored.data(), kChecksumBytes) != 0) {
    jit::Sha256Digest stored_digest{};
    std::memcpy(stored_digest.data(), stored.data(), kChecksumBytes);
    throw_damaged(path, fmt::format("checksum mismatch (stored sha256 {}, contents hash to {})",
                                    jit::to_hex(stored_digest), jit::to_hex(computed)));
  }
  if (load_le(bytes, kReservedOffset, 4) != 0) throw_damaged(path, "a reserved field is not 0");
  return {bytes.substr(kPreludeBytes, header_size),
          bytes.substr(kPreludeBytes + header_size, payload_size)};
}

// Reads the checksummed header into a StateFile, copying each item out of the payload. A header
// error here means the file was not made by a correct opfuse writer (its checksum holds).
class HeaderReader {
 public:
  HeaderReader(const std::string& path, std::string_view payload)
      : path_(path), payload_(payload) {}

  StateFile read(std::string_view header_text) {
    json header;
    try {
      header = json::parse(header_text);
    } catch (const json::exception& error) {
      fail(fmt::format("the header is not JSON ({})", error.what()));
    }
    if (!header.is_object()) fail("the header is not a JSON object");
    StateFile state;
    state.program = string_field(header, "program", "header");
    state.recipe = string_field(header, "recipe", "header");
    state.step = integer_field(header, "step", "header");
    if (header.contains("parallel")) {
      const json& parallel = header["parallel"];
      const std::int64_t tp = integer_field(parallel, "tp", "the header's parallel");
      const std::int64_t rank = integer_field(parallel, "rank", "the header's parallel");
      if (tp < 1 || tp > 1024 || rank >= tp)
        fail(fmt::format("parallel says rank {} of {} ranks", rank, tp));
      state.tp = static_cast<int>(tp);
      state.rank = static_cast<int>(rank);
    }
    if (header.contains("contents")) {
      const std::string contents = string_field(header, "contents", "header");
      if (contents != "all" && contents != "quantizers") {
        fail(fmt::format("contents is '{}', not 'all' or 'quantizers'", contents));
      }
      state.quantizers_only = contents == "quantizers";
    }
    std::set<std::string> names;
    for (const json& entry : array_field(header, "tensors")) {
      state.tensors.push_back(tensor(entry, state.tensors.size()));
      if (!names.insert(state.tensors.back().name).second) {
        fail(fmt::format("two tensors are named '{}'", state.tensors.back().name));
      }
    }
    if (state.quantizers_only && !state.tensors.empty()) {
      fail(fmt::format("it says it holds the quantizer state only, yet lists {} tensors",
                       state.tensors.size()));
    }
    names.clear();
    for (const json& entry : array_field(header, "quantizers")) {
      state.quantizers.push_back(quantizer(entry, state.quantizers.size()));
      if (!names.insert(state.quantizers.back().name).second) {
        fail(fmt::format("two quantizers are named '{}'", state.quantizers.back().name));
      }
    }
    check_no_overlap();
    return state;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw StateFileError(fmt::format(
        "state file {} is damaged: {}; it was not written by a working opfuse: restore it from a "
        "good copy",
        path_, what));
  }

  const json& field(const json& object, const char* key, const std::string& where) const {
    if (!object.is_object() || !object.contains(key)) {
      fail(fmt::format("{} has no field '{}'", where, key));
    }
    return object[key];
  }
  std::string string_field(const json& object, const char* key, const std::string& where) const {
    const json& value = field(object, key, where);
    if (!value.is_string()) fail(fmt::format("{}.{} is not a string", where, key));
    return value.get<std::string>();
  }
  std::int64_t integer_field(const json& object, const char* key, const std::string& where) const {
    const json& value = field(object, key, where);
    if (!value.is_number_integer() ||
        (value.is_number_unsigned() &&
         value.get<std::uint64_t>() > std::uint64_t{std::numeric_limits<std::int64_t>::max()}) ||
        value.get<std::int64_t>() < 0) {
      fail(fmt::format("{}.{} is not a non-negative 64-bit integer", where, key));
    }
    return value.get<std::int64_t>();
  }
  const json& array_field(const json& object, const char* key) const {
    const json& value = field(object, key, "header");
    if (!value.is_array()) fail(fmt::format("header.{} is not an array", key));
    return value;
  }

  // Bytes [offset, offset + size) of the payload, after checking they lie inside it.
  std::string_view payload_range(std::int64_t offset, std::uint64_t size,
                                 const std::string& where) {
    const auto begin = static_cast<std::uint64_t>(offset);
    if (begin > payload_.size() || size > payload_.size() - begin) {
      fail(fmt::format("{} lies outside the payload (offset {}, size {}, payload {} bytes)", where,
                       begin, size, payload_.size()));
    }
    if (size > 0) ranges_.emplace_back(begin, begin + size, where);
    return payload_.substr(begin, size);
  }

  StateTensor tensor(const json& entry, std::size_t index) {
    const std::string where = fmt::format("tensors[{}]", index);
    StateTensor tensor;
    tensor.name = string_field(entry, "name", where);
    if (tensor.name.empty()) fail(fmt::format("{} has an empty name", where));
    const std::string dtype = string_field(entry, "dtype", where);
    const auto parsed = dtype_named(dtype);
    if (!parsed) fail(fmt::format("{}.dtype '{}' is not a dtype opfuse knows", where, dtype));
    tensor.dtype = *parsed;
    const json& shape = field(entry, "shape", where);
    if (!shape.is_array()) fail(fmt::format("{}.shape is not an array", where));
    for (const json& dim : shape) {
      if (!dim.is_number_integer() || dim.get<std::int64_t>() < 0 ||
          (dim.is_number_unsigned() && dim.get<std::uint64_t>() > std::uint64_t{INT64_MAX})) {
        fail(fmt::format("{}.shape holds something other than sizes >= 0", where));
      }
      tensor.shape.push_back(dim.get<std::int64_t>());
    }
    if (entry.contains("shard")) {
      const std::string shard_where = where + ".shard";
      const std::int64_t dim = integer_field(entry["shard"], "dim", shard_where);
      const std::int64_t blocks = integer_field(entry["shard"], "blocks", shard_where);
      if (dim >= static_cast<std::int64_t>(tensor.shape.size()) || blocks < 1 ||
          tensor.shape[static_cast<std::size_t>(dim)] % blocks != 0)
        fail(fmt::format("{} does not fit the tensor's shape", shard_where));
      tensor.shard = {static_cast<int>(dim), static_cast<int>(blocks)};
    }
    const std::int64_t size = integer_field(entry, "size", where);
    const auto needed = byte_size(tensor.shape, plan::dtype_bytes(tensor.dtype));
    if (!needed || *needed != static_cast<std::uint64_t>(size)) {
      fail(fmt::format("{} ('{}') has size {}, but {} of {} needs {}", where, tensor.name, size,
                       shape_text(tensor.shape), dtype, needed ? std::to_string(*needed) : "more"));
    }
    const std::string_view bytes =
        payload_range(integer_field(entry, "offset", where), static_cast<std::uint64_t>(size),
                      fmt::format("{} ('{}')", where, tensor.name));
    tensor.bytes.assign(bytes.begin(), bytes.end());
    return tensor;
  }

  StateQuantizer quantizer(const json& entry, std::size_t index) {
    const std::string where = fmt::format("quantizers[{}]", index);
    StateQuantizer quantizer;
    quantizer.name = string_field(entry, "name", where);
    if (quantizer.name.empty()) fail(fmt::format("{} has an empty name", where));
    const std::int64_t length = integer_field(entry, "history_length", where);
    // Bounded before multiplying: the payload could not hold more floats than it has bytes.
    if (length < 1 || static_cast<std::uint64_t>(length) > payload_.size()) {
      fail(fmt::format("{} ('{}') has history length {}, which the payload cannot hold", where,
                       quantizer.name, length));
    }
    const auto floats = static_cast<std::size_t>(length) + kQuantizerScalarFloats;
    const std::string_view bytes =
        payload_range(integer_field(entry, "offset", where), floats * sizeof(float),
                      fmt::format("{} ('{}')", where, quantizer.name));
    std::vector<float> values(floats);
    std::memcpy(values.data(), bytes.data(), bytes.size());
    quantizer.state.scale = values[0];
    quantizer.state.scale_inv = values[1];
    quantizer.state.amax_history.assign(values.begin() + kQuantizerScalarFloats, values.end());
    // Optional: files written before opfuse saved it have none (docs/state_files.md); their
    // quantizers start counting again from 0.
    if (entry.contains("measurements")) {
      const std::int64_t measurements = integer_field(entry, "measurements", where);
      if (measurements > std::int64_t{std::numeric_limits<std::uint32_t>::max()}) {
        fail(fmt::format("{}.measurements is {}, more than a 32-bit count holds", where,
                         measurements));
      }
      quantizer.state.measurements = static_cast<std::uint32_t>(measurements);
    }
    return quantizer;
  }

  void check_no_overlap() {
    std::sort(ranges_.begin(), ranges_.end());
    for (std::size_t i = 1; i < ranges_.size(); ++i) {
      if (std::get<0>(ranges_[i]) < std::get<1>(ranges_[i - 1])) {
        fail(fmt::format("{} and {} overlap in the payload", std::get<2>(ranges_[i - 1]),
                         std::get<2>(ranges_[i])));
      }
    }
  }

  const std::string& path_;
  std::string_view payload_;
  std::vector<std::tuple<std::uint64_t, std::uint64_t, std::string>> ranges_;  // begin, end, what
};

}  // namespace

void write_state_file(const std::string& path, const StateFile& state) {
  check_writable(path, state);
  const std::string failure = write_file_atomically(path, encode(state), Durability::Durable);
  if (!failure.empty()) {
    throw StateFileError(fmt::format(
        "cannot write state file {}: {}; the old file there, if any, is unchanged: check that the "
        "directory exists and is writable and that the disk has room",
        path, failure));
  }
}

StateFile read_state_file(const std::string& path) {
  const std::string bytes = read_whole_file(path);
  const auto [header, payload] = verified_sections(path, bytes);
  return HeaderReader(path, payload).read(header);
}

std::vector<std::string> state_mismatches(const StateFile& file, const StateFile& expected) {
  std::vector<std::string> reasons;
  if (file.program != expected.program) {
    reasons.push_back(fmt::format("it was saved from program '{}', this is '{}'", file.program,
                                  expected.program));
  }
  if (file.tp != expected.tp || file.rank != expected.rank) {
    const auto layout = [](const StateFile& f) {
      return f.tp == 1 ? std::string("one rank's whole parameters")
                       : fmt::format("rank {} of {} ranks' shards", f.rank, f.tp);
    };
    reasons.push_back(fmt::format(
        "it holds {}, this session needs {} (a tensor-parallel checkpoint loads into the same "
        "rank of the same group size)",
        layout(file), layout(expected)));
  }
  if (file.recipe != expected.recipe) {
    reasons.push_back(fmt::format("it was saved with recipe '{}', this run uses '{}'", file.recipe,
                                  expected.recipe));
  }
  if (file.quantizers_only && !expected.quantizers_only) {
    reasons.push_back(
        "it holds the quantizer state only (saved with StateParts::Quantizers), not the "
        "parameters: load it with StateParts::Quantizers, or load a whole checkpoint");
  }
  // A load of the quantizer state alone compares no tensors.
  const std::span<const StateTensor> file_side =
      expected.quantizers_only ? std::span<const StateTensor>() : file.tensors;
  const std::span<const StateTensor> wanted =
      expected.quantizers_only ? std::span<const StateTensor>() : expected.tensors;
  std::map<std::string_view, const StateTensor*> file_tensors;
  for (const StateTensor& tensor : file_side) file_tensors.emplace(tensor.name, &tensor);
  for (const StateTensor& want : wanted) {
    const auto found = file_tensors.find(want.name);
    if (found == file_tensors.end()) {
      reasons.push_back(fmt::format("tensor '{}' is missing from the file", want.name));
      continue;
    }
    const StateTensor& have = *found->second;
    file_tensors.erase(found);
    if (have.dtype != want.dtype) {
      reasons.push_back(fmt::format("tensor '{}' is {} in the file, {} expected", want.name,
                                    plan::dtype_name(have.dtype), plan::dtype_name(want.dtype)));
    }
    if (have.shape != want.shape) {
      reasons.push_back(fmt::format("tensor '{}' has shape {} in the file, {} expected", want.name,
                                    shape_text(have.shape), shape_text(want.shape)));
    }
  }
  for (const auto& [name, tensor] : file_tensors) {
    reasons.push_back(fmt::format("the file has a tensor '{}' that this program lacks", name));
  }
  std::map<std::string_view, const StateQuantizer*> file_quantizers;
  for (const StateQuantizer& quantizer : file.quantizers) {
    file_quantizers.emplace(quantizer.name, &quantizer);
  }
  for (const StateQuantizer& want : expected.quantizers) {
    const auto found = file_quantizers.find(want.name);
    if (found == file_quantizers.end()) {
      reasons.push_back(fmt::format("quantizer '{}' is missing from the file", want.name));
      continue;
    }
    const std::size_t have_length = found->second->state.amax_history.size();
    file_quantizers.erase(found);
    if (have_length != want.state.amax_history.size()) {
      reasons.push_back(
          fmt::format("quantizer '{}' has amax history length {} in the file, {} "
                      "expected",
                      want.name, have_length, want.state.amax_history.size()));
    }
  }
  for (const auto& [name, quantizer] : file_quantizers) {
    reasons.push_back(fmt::format("the file has a quantizer '{}' that this program lacks", name));
  }
  return reasons;
}

void require_state_fits(const StateFile& file, const StateFile& expected, const std::string& path) {
  const std::vector<std::string> reasons = state_mismatches(file, expected);
  if (reasons.empty()) return;
  throw UsageError(fmt::format(
      "state file {} does not fit this program, nothing was loaded:\n  - {}\nload a state file "
      "saved from the same program and recipe",
      path, fmt::join(reasons, "\n  - ")));
}

}  // namespace opfuse::api
