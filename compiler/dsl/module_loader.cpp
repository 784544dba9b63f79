#include "dsl/module_loader.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <variant>

#include "dsl/parser.h"
#include "dsl/stdlib.h"

namespace opfuse::dsl {

namespace {

namespace fs = std::filesystem;

// Closes a file descriptor on every return path.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { ::close(fd_); }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

// Reads a whole .fuse file; on failure returns false and says why in `reason`. Opening without
// blocking and checking the opened file (not the path) means a FIFO or a directory is refused
// instead of hanging or failing oddly, even if the path changes between the check and the read.
bool read_source_file(const std::string& path, std::string& text, std::string& reason) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    reason = std::strerror(errno);
    return false;
  }
  FdCloser closer(fd);
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    reason = std::strerror(errno);
    return false;
  }
  if (S_ISDIR(info.st_mode)) {
    reason = "it is a directory, not a .fuse file";
    return false;
  }
  if (!S_ISREG(info.st_mode)) {
    reason = "it is not a regular file";
    return false;
  }
  if (static_cast<uint64_t>(info.st_size) > SourceManager::kMaxFileBytes) {
    reason = fmt::format("the file is larger than the {} MiB limit for .fuse sources",
                         SourceManager::kMaxFileBytes >> 20);
    return false;
  }
  text.clear();
  char buffer[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got < 0) {
      if (errno == EINTR) continue;
      reason = std::strerror(errno);
      return false;
    }
    if (got == 0) break;
    text.append(buffer, static_cast<size_t>(got));
    // The file may grow after fstat; the limit holds for what is actually read.
    if (text.size() > SourceManager::kMaxFileBytes) {
      reason = fmt::format("the file is larger than the {} MiB limit for .fuse sources",
                           SourceManager::kMaxFileBytes >> 20);
      return false;
    }
  }
  return true;
}

// A file's identity: two spellings of one file (b.fuse, ./x/../b.fuse) load it once.
std::string file_identity(const fs::path& path) {
  std::error_code error;
  fs::path canonical = fs::weakly_canonical(path, error);
  if (error) canonical = fs::absolute(path, error).lexically_normal();
  return canonical.string();
}

class Loader {
 public:
  Loader(SourceManager& sources, DiagnosticEngine& diags) : sources_(sources), diags_(diags) {}

  LoadedModules load_root_file(const std::string& path) {
    std::string text;
    std::string reason;
    if (!read_source_file(path, text, reason)) {
      diags_.error(SourceLoc{}, fmt::format("cannot open '{}': {}", path, reason),
                   "give the path of a .fuse file");
      return std::move(result_);
    }
    const FileId file = sources_.add_buffer(path, std::move(text));
    load(file, file_identity(path));
    return std::move(result_);
  }

  LoadedModules load_root_source(std::string name, std::string text) {
    // In-memory text is no file on disk, so no import can name it: give it an identity no
    // canonical path can have.
    const std::string identity = "<memory>\n" + name;
    const FileId file = sources_.add_buffer(std::move(name), std::move(text));
    load(file, identity);
    return std::move(result_);
  }

 private:
  struct Frame {
    std::string identity;
    std::string base_name;
  };

  // Parses a file already in the SourceManager, loads its imports, then appends it: every module
  // lands after the modules it imports.
  void load(FileId file, std::string identity) {
    stack_.push_back({identity, sources_.base_name(file)});
    std::unique_ptr<Module> module = parse_module(file, sources_, diags_);
    const fs::path directory = fs::path(sources_.name(file)).parent_path();
    for (const Decl& decl : module->decls) {
      if (diags_.at_error_limit()) break;
      if (const auto* import_decl = std::get_if<ImportDecl>(&decl)) {
        load_import(*import_decl, directory);
      }
    }
    stack_.pop_back();
    loaded_.insert(std::move(identity));
    result_.modules.push_back(std::move(module));
  }

  void load_import(const ImportDecl& import, const fs::path& importer_directory) {
    if (import.path.empty()) {
      diags_.error(import.loc, "empty import path", "write: import \"other.fuse\"");
      return;
    }
    if (import.path.find('\0') != std::string::npos) {
      diags_.error(import.loc, "import path contains a NUL byte (\\x00)",
                   "remove the NUL byte from the path");
      return;
    }
    if (import.path == kStandardLibraryImport) {
      load_standard_library();
      return;
    }
    const fs::path written(import.path);
    const fs::path path =
        written.is_absolute() ? written : (importer_directory / written).lexically_normal();
    const std::string display = path.string();
    const std::string identity = file_identity(path);
    if (loaded_.contains(identity)) return;  // a diamond: already loaded through another import
    for (size_t i = 0; i < stack_.size(); ++i) {
      if (stack_[i].identity != identity) continue;
      std::string chain;
      for (size_t j = i; j < stack_.size(); ++j) chain += stack_[j].base_name + " -> ";
      chain += stack_[i].base_name;
      diags_.error(import.loc, fmt::format("import cycle: {}", chain),
                   "remove one of these imports; declarations both files need can move to a "
                   "third file that both import");
      return;
    }
    if (stack_.size() > kMaxImportDepth) {
      diags_.error(import.loc,
                   fmt::format("imports are nested too deeply (limit {} levels)", kMaxImportDepth),
                   "import the files from fewer levels, e.g. from the root file directly");
      return;
    }
    std::string text;
    std::string reason;
    if (!read_source_file(display, text, reason)) {
      diags_.error(import.loc, fmt::format("cannot open '{}': {}", display, reason),
                   "import paths are relative to the directory of the importing file");
      return;
    }
    load(sources_.add_buffer(display, std::move(text)), identity);
  }

  // `import "std"`: the compiled-in standard library (dsl/stdlib.h), loaded once per program
  // under an identity no file path can have.
  void load_standard_library() {
    const std::string identity = "<std>";
    if (loaded_.contains(identity)) return;
    for (const Frame& f : stack_)
      if (f.identity == identity) return;  // the library imports nothing; a cycle cannot close
    load(sources_.add_buffer(std::string(kStandardLibraryName),
                             std::string(standard_library_source())),
         identity);
  }

  SourceManager& sources_;
  DiagnosticEngine& diags_;
  std::vector<Frame> stack_;
  std::unordered_set<std::string> loaded_;
  LoadedModules result_;
};

}  // namespace

LoadedModules load_modules(const std::string& root_path, SourceManager& sources,
                           DiagnosticEngine& diags) {
  return Loader(sources, diags).load_root_file(root_path);
}

LoadedModules load_modules_from_source(std::string name, std::string text, SourceManager& sources,
                                       DiagnosticEngine& diags) {
  return Loader(sources, diags).load_root_source(std::move(name), std::move(text));
}

}  // namespace opfuse::dsl
