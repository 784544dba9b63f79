#include "support/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace opfuse {

namespace {

std::string errno_text(int error_number) { return std::strerror(error_number); }

// Writes all bytes, retrying short writes; returns 0 or an errno value.
int write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t written = ::write(fd, bytes.data(), bytes.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    bytes.remove_prefix(static_cast<std::size_t>(written));
  }
  return 0;
}

// Makes a rename inside `dir` durable; returns 0 or an errno value.
int fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  const int result = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return result;
}

}  // namespace

std::string write_file_atomically(const std::string& path, std::string_view bytes,
                                  Durability durability) {
  const bool durable = durability == Durability::Durable;
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  std::string temp_path = fmt::format("{}/.tmp-{}-XXXXXX", dir, base);
  const int fd = ::mkstemp(temp_path.data());
  if (fd < 0) return fmt::format("cannot create a file in {}: {}", dir, errno_text(errno));

  std::string failure;
  // mkstemp makes 0600 files; outputs are ordinary readable files.
  if (::fchmod(fd, 0644) != 0) failure = fmt::format("chmod: {}", errno_text(errno));
  if (failure.empty()) {
    if (const int error = write_all(fd, bytes); error != 0) {
      failure = fmt::format("write: {}", errno_text(error));
    }
  }
  if (failure.empty() && durable && ::fsync(fd) != 0)
    failure = fmt::format("fsync: {}", errno_text(errno));
  if (::close(fd) != 0 && failure.empty()) failure = fmt::format("close: {}", errno_text(errno));
  if (failure.empty() && ::rename(temp_path.c_str(), path.c_str()) != 0) {
    failure = fmt::format("rename: {}", errno_text(errno));
  }
  if (!failure.empty()) {
    ::unlink(temp_path.c_str());
    return failure;
  }
  if (!durable) return {};
  if (const int error = fsync_directory(dir); error != 0) {
    return fmt::format("fsync of {}: {}", dir, errno_text(error));
  }
  return {};
}

}  // namespace opfuse
