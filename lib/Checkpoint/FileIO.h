//===- FileIO.h - POSIX file helpers for checkpoints (private) ------------===//
//
// Plain POSIX calls rather than iostreams: checkpoints need fsync on files
// and directories, positioned reads of untrusted ranges and errno texts in
// every message, none of which iostreams give.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_LIB_CHECKPOINT_FILEIO_H
#define MESHPLAN_LIB_CHECKPOINT_FILEIO_H

#include "meshplan/Core/Result.h"

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace meshplan::ckpt::io {

inline std::string errnoText(int err) { return std::strerror(err); }

inline std::string joinPath(const std::string &dir, std::string_view name) {
  if (dir.empty())
    return std::string(name);
  if (dir.back() == '/')
    return dir + std::string(name);
  return dir + "/" + std::string(name);
}

/// Closes a descriptor on scope exit.
class Fd {
public:
  explicit Fd(int fd = -1) : fd(fd) {}
  Fd(const Fd &) = delete;
  Fd &operator=(const Fd &) = delete;
  Fd &operator=(Fd &&o) noexcept {
    if (this != &o) {
      if (fd >= 0)
        ::close(fd);
      fd = o.fd;
      o.fd = -1;
    }
    return *this;
  }
  ~Fd() {
    if (fd >= 0)
      ::close(fd);
  }
  int get() const { return fd; }
  bool ok() const { return fd >= 0; }
  /// Closes now, reporting the error (close can report a failed write-back).
  int release() {
    int rc = fd >= 0 ? ::close(fd) : 0;
    fd = -1;
    return rc;
  }

private:
  int fd;
};

/// Writes all of [data, data + size), retrying short writes and EINTR.
inline Result<void> writeAll(int fd, const std::byte *data, size_t size,
                             const std::string &path) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return makeError(path + ": write failed: " + errnoText(errno));
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return {};
}

/// Reads exactly `size` bytes at `offset`; a short file is an error.
inline Result<void> preadAll(int fd, std::byte *data, size_t size,
                             int64_t offset, const std::string &path) {
  while (size > 0) {
    ssize_t n = ::pread(fd, data, size, offset);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return makeError(path + ": read failed at byte " +
                       std::to_string(offset) + ": " + errnoText(errno));
    }
    if (n == 0)
      return makeError(path + ": unexpected end of file at byte " +
                       std::to_string(offset) +
                       " (the file was truncated while being read)");
    data += n;
    size -= static_cast<size_t>(n);
    offset += n;
  }
  return {};
}

/// fsync of a directory makes the entries created in it (by any process)
/// durable; fsync of a file, its data.
inline Result<void> fsyncPath(const std::string &path, bool directory) {
  Fd fd(::open(path.c_str(),
               O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0)));
  if (!fd.ok())
    return makeError(path + ": cannot open to fsync: " + errnoText(errno));
  if (::fsync(fd.get()) != 0)
    return makeError(path + ": fsync failed: " + errnoText(errno));
  return {};
}

} // namespace meshplan::ckpt::io

#endif // MESHPLAN_LIB_CHECKPOINT_FILEIO_H
