#include "jit/kernel_cache.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string_view>

#include "jit/sha256.h"
#include "support/assert.h"
#include "support/atomic_file.h"

namespace opfuse::jit {

namespace {

namespace fs = std::filesystem;

constexpr std::string_view kEntryMagic{"OPFKERN\n", 8};
constexpr std::uint32_t kEntryFormatVersion = 1;
constexpr std::string_view kEntrySuffix = ".opfk";
constexpr std::size_t kChecksumBytes = 32;

std::string environment_value(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

std::string errno_text(int error_number) { return std::strerror(error_number); }

// --- key serialization --------------------------------------------------------------------------

void hash_u64(Sha256& hasher, std::uint64_t value) {
  std::uint8_t bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<std::uint8_t>(value >> (8 * i));
  hasher.update(bytes, sizeof bytes);
}

// Tag and value both length-prefixed: "ab"+"c" and "a"+"bc" hash differently.
void hash_field(Sha256& hasher, std::string_view tag, std::string_view value) {
  hash_u64(hasher, tag.size());
  hasher.update(tag);
  hash_u64(hasher, value.size());
  hasher.update(value);
}

void hash_list(Sha256& hasher, std::string_view tag, const std::vector<std::string>& values) {
  hash_field(hasher, tag, std::to_string(values.size()));
  for (const std::string& value : values) hash_field(hasher, tag, value);
}

// --- entry encoding -----------------------------------------------------------------------------

void append_u32(std::string& out, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
}

void append_u64(std::string& out, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
}

nlohmann::json metadata_json(const CompiledKernel& kernel) {
  return {{"kernel_name", kernel.kernel_name},
          {"arch", kernel.arch},
          {"is_ptx", kernel.is_ptx},
          {"lowered_names", kernel.lowered_names},
          {"log", kernel.log},
          {"registers", kernel.registers},
          {"spill_store_bytes", kernel.spill_store_bytes},
          {"spill_load_bytes", kernel.spill_load_bytes},
          {"compile_ms", kernel.compile_ms}};
}

std::string encode_entry(const std::string& key, const CompiledKernel& kernel) {
  // Invalid UTF-8 in a log must not make the entry unwritable.
  const std::string metadata =
      metadata_json(kernel).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string entry(kEntryMagic);
  append_u32(entry, kEntryFormatVersion);
  append_u32(entry, static_cast<std::uint32_t>(key.size()));
  entry += key;
  append_u64(entry, metadata.size());
  entry += metadata;
  append_u64(entry, kernel.binary.size());
  entry.append(kernel.binary.data(), kernel.binary.size());
  Sha256 hasher;
  hasher.update(entry);
  const Sha256Digest checksum = hasher.finish();
  entry.append(reinterpret_cast<const char*>(checksum.data()), checksum.size());
  return entry;
}

// Reads the fields of an entry in order; every read is bounds-checked.
class EntryReader {
 public:
  explicit EntryReader(std::string_view bytes) : bytes_(bytes) {}

  bool read_bytes(std::size_t count, std::string_view* out) {
    if (count > bytes_.size() - position_) return false;
    *out = bytes_.substr(position_, count);
    position_ += count;
    return true;
  }
  bool read_u32(std::uint32_t* out) {
    std::string_view raw;
    if (!read_bytes(4, &raw)) return false;
    *out = 0;
    for (int i = 0; i < 4; ++i) *out |= std::uint32_t{static_cast<std::uint8_t>(raw[i])} << (8 * i);
    return true;
  }
  bool read_u64(std::uint64_t* out) {
    std::string_view raw;
    if (!read_bytes(8, &raw)) return false;
    *out = 0;
    for (int i = 0; i < 8; ++i) *out |= std::uint64_t{static_cast<std::uint8_t>(raw[i])} << (8 * i);
    return true;
  }
  bool read_sized(std::string_view* out) {
    std::uint64_t size = 0;
    return read_u64(&size) && size <= bytes_.size() && read_bytes(size, out);
  }
  std::size_t position() const { return position_; }
  std::size_t remaining() const { return bytes_.size() - position_; }

 private:
  std::string_view bytes_;
  std::size_t position_ = 0;
};

// Decodes and verifies an entry; on failure returns nullopt and sets `why`.
std::optional<CompiledKernel> decode_entry(std::string_view bytes, const std::string& expected_key,
                                           std::string* why) {
  EntryReader reader(bytes);
  std::string_view magic;
  if (!reader.read_bytes(kEntryMagic.size(), &magic) || magic != kEntryMagic) {
    *why = "not an opfuse kernel cache entry: bad magic";
    return std::nullopt;
  }
  std::uint32_t version = 0;
  if (!reader.read_u32(&version)) {
    *why = "truncated";
    return std::nullopt;
  }
  if (version != kEntryFormatVersion) {
    *why = fmt::format("format version {}, this opfuse reads {}", version, kEntryFormatVersion);
    return std::nullopt;
  }
  std::uint32_t key_size = 0;
  std::string_view key, metadata, binary, checksum;
  if (!reader.read_u32(&key_size) || !reader.read_bytes(key_size, &key) ||
      !reader.read_sized(&metadata) || !reader.read_sized(&binary)) {
    *why = fmt::format("truncated: {} bytes", bytes.size());
    return std::nullopt;
  }
  const std::size_t checksummed_bytes = reader.position();
  if (!reader.read_bytes(kChecksumBytes, &checksum)) {
    *why = fmt::format("truncated: {} bytes, the checksum is missing", bytes.size());
    return std::nullopt;
  }
  if (reader.remaining() != 0) {
    *why = fmt::format("{} unexpected bytes after the checksum", reader.remaining());
    return std::nullopt;
  }
  Sha256 hasher;
  hasher.update(bytes.substr(0, checksummed_bytes));
  const Sha256Digest actual = hasher.finish();
  if (checksum != std::string_view(reinterpret_cast<const char*>(actual.data()), actual.size())) {
    *why = "checksum mismatch";
    return std::nullopt;
  }
  if (key != expected_key) {
    *why = fmt::format("it holds the entry for key {}", key);
    return std::nullopt;
  }

  CompiledKernel kernel;
  try {
    const nlohmann::json json = nlohmann::json::parse(metadata);
    kernel.kernel_name = json.at("kernel_name").get<std::string>();
    kernel.arch = json.at("arch").get<std::string>();
    kernel.is_ptx = json.at("is_ptx").get<bool>();
    kernel.lowered_names = json.at("lowered_names").get<std::map<std::string, std::string>>();
    kernel.log = json.at("log").get<std::string>();
    kernel.registers = json.at("registers").get<int>();
    kernel.spill_store_bytes = json.at("spill_store_bytes").get<int>();
    kernel.spill_load_bytes = json.at("spill_load_bytes").get<int>();
    kernel.compile_ms = json.at("compile_ms").get<double>();
  } catch (const nlohmann::json::exception& error) {
    *why = fmt::format("bad metadata: {}", error.what());
    return std::nullopt;
  }
  kernel.binary.assign(binary.begin(), binary.end());
  return kernel;
}

// --- file system --------------------------------------------------------------------------------

// Creates the entry's directory and writes the entry atomically and durably (entries are loaded
// by later builds); returns "" or why it failed.
std::string write_entry(const std::string& dir, const std::string& final_path,
                        std::string_view bytes) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return fmt::format("cannot create {}: {}", dir, errno_text(errno));
  }
  return write_file_atomically(final_path, bytes, Durability::Durable);
}

}  // namespace

std::string kernel_cache_key(const KernelCacheKeyInputs& inputs) {
  std::vector<std::string> sorted_options = inputs.options;
  std::sort(sorted_options.begin(), sorted_options.end());
  Sha256 hasher;
  hash_field(hasher, "opfuse-kernel-cache-key", "1");
  hash_field(hasher, "source", inputs.source);
  hash_field(hasher, "templates", inputs.templates_digest);
  hash_list(hasher, "options", sorted_options);
  hash_field(hasher, "arch", inputs.arch);
  hash_list(hasher, "name_expressions", inputs.name_expressions);
  hash_field(hasher, "nvrtc_version", inputs.nvrtc_version);
  hash_field(hasher, "codegen_version", std::to_string(inputs.codegen_version));
  return to_hex(hasher.finish());
}

std::string hash_templates_dir(const std::string& dir) {
  Sha256 hasher;
  hash_field(hasher, "opfuse-templates", "1");
  if (dir.empty()) return to_hex(hasher.finish());

  std::vector<std::pair<std::string, fs::path>> files;  // (relative path, path)
  std::error_code error;
  for (auto it = fs::recursive_directory_iterator(dir, error);
       !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    std::error_code type_error;
    if (!it->is_regular_file(type_error)) continue;
    files.emplace_back(fs::relative(it->path(), dir).generic_string(), it->path());
  }
  if (error) {
    throw JitError(fmt::format("cannot list the templates directory {}: {}", dir, error.message()));
  }
  std::sort(files.begin(), files.end());

  hash_field(hasher, "file_count", std::to_string(files.size()));
  for (const auto& [relative, path] : files) {
    std::ifstream in(path, std::ios::binary);
    const std::string contents{std::istreambuf_iterator<char>(in), {}};
    if (!in && !in.eof()) {
      throw JitError(fmt::format("cannot read template {}; check its permissions", path.string()));
    }
    hash_field(hasher, "path", relative);
    hash_field(hasher, "contents", contents);
  }
  return to_hex(hasher.finish());
}

std::string KernelCache::default_directory() {
  if (std::string dir = environment_value("OPFUSE_CACHE_DIR"); !dir.empty()) return dir;
  // The XDG spec says relative values are invalid and must be ignored.
  if (std::string xdg = environment_value("XDG_CACHE_HOME"); !xdg.empty() && xdg.front() == '/') {
    return xdg + "/opfuse";
  }
  if (std::string home = environment_value("HOME"); !home.empty()) return home + "/.cache/opfuse";
  return {};
}

KernelCache::KernelCache(std::string directory, WarningSink warning_sink)
    : directory_(std::move(directory)), warning_sink_(std::move(warning_sink)) {
  if (directory_.empty()) {
    degrade("no directory: OPFUSE_CACHE_DIR, XDG_CACHE_HOME and HOME are all unset");
    return;
  }
  std::error_code error;
  fs::create_directories(directory_, error);
  if (error || !fs::is_directory(directory_, error)) {
    degrade(fmt::format("{} cannot be created: {}", directory_,
                        error ? error.message() : "not a directory"));
  }
}

void KernelCache::warn(const std::string& message) const {
  if (warning_sink_) {
    warning_sink_(message);
  } else {
    std::cerr << "opfuse: warning: " << message << std::endl;
  }
}

void KernelCache::degrade(const std::string& why) {
  writable_.store(false);
  if (degraded_warning_given_.exchange(true)) return;
  warn(fmt::format(
      "kernel cache directory is not usable ({}); continuing without caching kernels. Set "
      "OPFUSE_CACHE_DIR to a writable directory to cache them",
      why));
}

std::string KernelCache::entry_path(const std::string& key) const {
  // Keys become file names: anything but hex could escape the cache directory.
  OPFUSE_ASSERT(key.size() >= 2 && key.find_first_not_of("0123456789abcdef") == std::string::npos,
                "kernel cache key '{}' is not lower-case hex", key);
  return fmt::format("{}/{}/{}{}", directory_, key.substr(0, 2), key, kEntrySuffix);
}

std::optional<CompiledKernel> KernelCache::load(const std::string& key) {
  const std::string path = entry_path(key);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code error;
    if (fs::exists(path, error)) {
      corrupt_entries_++;
      warn(fmt::format("kernel cache entry {} is corrupt (cannot be read: {}); recompiling", path,
                       errno_text(errno)));
    }
    misses_++;
    return std::nullopt;
  }
  const std::string bytes{std::istreambuf_iterator<char>(in), {}};
  std::string why;
  std::optional<CompiledKernel> kernel = in.bad() ? std::nullopt : decode_entry(bytes, key, &why);
  if (!kernel) {
    if (why.empty()) why = "read error";
    corrupt_entries_++;
    misses_++;
    warn(fmt::format("kernel cache entry {} is corrupt ({}); recompiling", path, why));
    return std::nullopt;
  }
  hits_++;
  return kernel;
}

void KernelCache::store(const std::string& key, const CompiledKernel& kernel) {
  if (!writable_.load()) return;
  const std::string path = entry_path(key);
  const std::string dir = fs::path(path).parent_path().string();
  const std::string failure = write_entry(dir, path, encode_entry(key, kernel));
  if (!failure.empty()) {
    store_failures_++;
    degrade(failure);
    return;
  }
  stores_++;
}

KernelCacheStats KernelCache::stats() const {
  KernelCacheStats stats;
  stats.hits = hits_.load();
  stats.misses = misses_.load();
  stats.corrupt_entries = corrupt_entries_.load();
  stats.stores = stores_.load();
  stats.store_failures = store_failures_.load();
  return stats;
}

}  // namespace opfuse::jit
