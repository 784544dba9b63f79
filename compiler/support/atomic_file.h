// Writes a file so that readers see the old contents or the whole new contents, never a part:
// a temp file in the same directory, fsync, close, rename, then fsync of the directory. Shared by
// the kernel cache's entries and fusec's outputs (several processes may write the same path).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace opfuse {

enum class Durability : uint8_t {
  // fsync the file before the rename and the directory after it: the new contents survive a
  // power failure (kernel cache entries, which later builds load).
  Durable,
  // No fsync: readers still never see a torn file, but after a power failure the file may be
  // the old one or empty. For outputs a rebuild recreates (fusec build: ~35 fsyncs took 120-230 ms
  // of a 20 ms warm build on a busy disk).
  VisibleOnly,
};

// Returns "" on success, else why it failed (the temp file is removed). The directory must
// exist. The file gets mode 0644.
std::string write_file_atomically(const std::string& path, std::string_view bytes,
                                  Durability durability = Durability::Durable);

}  // namespace opfuse
