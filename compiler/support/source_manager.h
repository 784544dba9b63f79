// Owns the text of every .fuse file the compiler reads and maps locations back to lines.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace opfuse {

using FileId = uint32_t;
inline constexpr FileId kNoFile = 0xffffffffu;

// A position in a .fuse file: 1-based line and column (column counts bytes).
struct SourceLoc {
  FileId file = kNoFile;
  uint32_t line = 0;
  uint32_t col = 0;
  bool valid() const { return file != kNoFile && line > 0; }
  friend bool operator==(const SourceLoc&, const SourceLoc&) = default;
};

class SourceManager {
 public:
  // Limits that keep hostile input bounded (see docs/language.md, "Limits").
  static constexpr size_t kMaxFileBytes = 4u << 20;

  // Adds a buffer under a display name (used in diagnostics) and returns its id.
  FileId add_buffer(std::string name, std::string text);
  // Reads a file; on failure returns kNoFile and fills `error` with the reason.
  FileId add_file(const std::string& path, std::string* error);

  const std::string& name(FileId id) const { return files_.at(id).name; }
  // The file's name without directories, as shown in kernel comments (`mlp.fuse:12`).
  std::string base_name(FileId id) const;
  const std::string& text(FileId id) const { return files_.at(id).text; }
  // The text of a 1-based line without its newline; empty when out of range.
  std::string_view line_text(FileId id, uint32_t line) const;
  size_t file_count() const { return files_.size(); }

 private:
  struct File {
    std::string name;
    std::string text;
    std::vector<uint32_t> line_starts;  // byte offset of each line
  };
  std::vector<File> files_;
};

}  // namespace opfuse
