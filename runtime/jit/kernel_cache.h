// Content-addressed disk cache of compiled kernels (docs/design.md, "JIT"; note "Kernel cache"
// below).
//
// Note "Kernel cache": an entry lives at <dir>/<key[0:2]>/<key>.opfk and holds, in order: the
// 8-byte magic "OPFKERN\n", a u32 format version, the key (u32 length + bytes), the kernel's
// metadata as JSON (u64 length + bytes), the binary (u64 length + bytes), then the SHA-256 of all
// the bytes before it. Integers are little-endian. Entries are written to a mkstemp file in the
// same directory, fsync'd, closed and renamed into place (then the directory is fsync'd), so
// readers see a whole entry or none and concurrent writers of one key simply replace each other
// with identical content. A load trusts nothing: any mismatch is a warning and a miss, and the
// recompiled kernel replaces the bad entry.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "nvrtc_compiler.h"

namespace opfuse::jit {

// Receives one warning sentence without the "opfuse: warning: " prefix.
using WarningSink = std::function<void(const std::string& message)>;

struct KernelCacheStats {
  std::int64_t hits = 0;
  std::int64_t misses = 0;           // includes corrupt entries
  std::int64_t corrupt_entries = 0;  // entries that existed but failed verification
  std::int64_t stores = 0;           // entries written
  std::int64_t store_failures = 0;   // writes that failed (the cache then stops writing)
};

// Everything a compiled kernel depends on, spelled out (docs/design.md, "JIT": cache keys spell out
// every input). kernel_cache_key hashes each field length-prefixed, so no two different inputs
// serialize to the same bytes.
struct KernelCacheKeyInputs {
  std::string source;
  std::string templates_digest;      // hash_templates_dir() of the templates directory
  std::vector<std::string> options;  // the full NVRTC option list; sorted before hashing
  std::string arch;
  std::vector<std::string> name_expressions;
  std::string nvrtc_version;  // "major.minor" from nvrtcVersion
  int codegen_version = 0;    // opfuse::kCodegenVersion
};

// Hex SHA-256 cache key of the inputs.
std::string kernel_cache_key(const KernelCacheKeyInputs& inputs);
// Hex SHA-256 over the relative path and contents of every regular file under `dir`, sorted by
// relative path; a fixed digest for "" (no templates directory). Throws JitError when unreadable.
std::string hash_templates_dir(const std::string& dir);

// Thread-safe; several processes may share one directory.
class KernelCache {
 public:
  // $OPFUSE_CACHE_DIR, else $XDG_CACHE_HOME/opfuse, else $HOME/.cache/opfuse ("" if none is set).
  static std::string default_directory();

  // A cache in `directory`, created if missing. An empty sink prints
  // "opfuse: warning: <message>" to stderr. A directory that cannot be created, or later cannot
  // be written, turns the cache into a no-op for stores with exactly one warning.
  explicit KernelCache(std::string directory = default_directory(), WarningSink warning_sink = {});

  // The verified entry for `key`, or nullopt (a miss) when absent or corrupt.
  std::optional<CompiledKernel> load(const std::string& key);
  // Writes the entry for `key` atomically; failures are counted and warned about, never thrown.
  void store(const std::string& key, const CompiledKernel& kernel);

  std::string entry_path(const std::string& key) const;
  const std::string& directory() const { return directory_; }
  // False once the directory has proven unusable for writing.
  bool writable() const { return writable_.load(); }
  KernelCacheStats stats() const;

 private:
  void warn(const std::string& message) const;
  // Marks the cache unwritable and warns, the first time only.
  void degrade(const std::string& why);

  std::string directory_;
  WarningSink warning_sink_;
  std::atomic<bool> writable_{true};
  std::atomic<bool> degraded_warning_given_{false};
  std::atomic<std::int64_t> hits_{0};
  std::atomic<std::int64_t> misses_{0};
  std::atomic<std::int64_t> corrupt_entries_{0};
  std::atomic<std::int64_t> stores_{0};
  std::atomic<std::int64_t> store_failures_{0};
};

}  // namespace opfuse::jit
