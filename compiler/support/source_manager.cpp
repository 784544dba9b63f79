#include "support/source_manager.h"

#include <fstream>
#include <sstream>

namespace opfuse {

FileId SourceManager::add_buffer(std::string name, std::string text) {
  File f;
  f.name = std::move(name);
  f.text = std::move(text);
  f.line_starts.push_back(0);
  for (size_t i = 0; i < f.text.size(); ++i) {
    if (f.text[i] == '\n') f.line_starts.push_back(static_cast<uint32_t>(i + 1));
  }
  files_.push_back(std::move(f));
  return static_cast<FileId>(files_.size() - 1);
}

FileId SourceManager::add_file(const std::string& path, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (error) *error = "cannot open file";
    return kNoFile;
  }
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) {
    if (error) *error = "cannot read file (not a regular file?)";
    return kNoFile;
  }
  if (static_cast<uint64_t>(size) > kMaxFileBytes) {
    if (error) *error = "file is larger than the 4 MiB limit for .fuse sources";
    return kNoFile;
  }
  in.seekg(0, std::ios::beg);
  std::string text(static_cast<size_t>(size), '\0');
  if (size > 0 && !in.read(text.data(), size)) {
    if (error) *error = "cannot read file";
    return kNoFile;
  }
  return add_buffer(path, std::move(text));
}

std::string SourceManager::base_name(FileId id) const {
  const std::string& n = name(id);
  const size_t slash = n.find_last_of('/');
  return slash == std::string::npos ? n : n.substr(slash + 1);
}

std::string_view SourceManager::line_text(FileId id, uint32_t line) const {
  if (id >= files_.size()) return {};
  const File& f = files_[id];
  if (line == 0 || line > f.line_starts.size()) return {};
  const size_t begin = f.line_starts[line - 1];
  size_t end = line < f.line_starts.size() ? f.line_starts[line] - 1 : f.text.size();
  if (end > begin && f.text[end - 1] == '\r') --end;
  return std::string_view(f.text).substr(begin, end - begin);
}

}  // namespace opfuse
