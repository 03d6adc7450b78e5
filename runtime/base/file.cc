#include "runtime/base/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace loom {
namespace {

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

absl::Status MakeDirectories(const std::string& dir) {
  std::string partial;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      if (!partial.empty() && mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        return Errno("mkdir", partial);
      }
    }
    if (i < dir.size()) partial.push_back(dir[i]);
  }
  return absl::OkStatus();
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;
  close(fd_);
  unlink(tmp_.c_str());
}

absl::Status AtomicFile::Open(const std::string& path) {
  path_ = path;
  tmp_ = path + ".tmp";
  fd_ = open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) return Errno("open", tmp_);
  return absl::OkStatus();
}

absl::Status AtomicFile::Write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno("write", tmp_);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status AtomicFile::Commit() {
  if (fsync(fd_) != 0) return Errno("fsync", tmp_);
  const int fd = fd_;
  fd_ = -1;
  if (close(fd) != 0) {
    unlink(tmp_.c_str());
    return Errno("close", tmp_);
  }
  if (rename(tmp_.c_str(), path_.c_str()) != 0) {
    absl::Status s = Errno("rename to", path_);
    unlink(tmp_.c_str());
    return s;
  }
  const size_t slash = path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path_.substr(0, slash);
  int dfd = open(dir.empty() ? "/" : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  AtomicFile f;
  if (absl::Status s = f.Open(path); !s.ok()) return s;
  if (absl::Status s = f.Write(contents.data(), contents.size()); !s.ok()) return s;
  return f.Commit();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::string msg = absl::StrCat(path, ": ", std::strerror(errno));
    return errno == ENOENT ? absl::NotFoundError(msg) : absl::InternalError(msg);
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::string msg = absl::StrCat(path, ": read: ", std::strerror(errno));
      ::close(fd);
      return absl::InternalError(msg);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

void KeepEarlierLogs(const std::string& path, int keep) {
  if (access(path.c_str(), F_OK) != 0) return;
  const std::string prev = path + ".prev";
  if (access(prev.c_str(), F_OK) == 0) {
    // PATH.prev.k -> PATH.prev.(k + 1), oldest first, so nothing is
    // overwritten but the one past `keep`.
    for (int k = keep - 1; k >= 1; --k) {
      const std::string from = absl::StrCat(prev, ".", k);
      if (access(from.c_str(), F_OK) == 0) {
        std::rename(from.c_str(), absl::StrCat(prev, ".", k + 1).c_str());
      }
    }
    if (keep >= 1) std::rename(prev.c_str(), (prev + ".1").c_str());
  }
  std::rename(path.c_str(), prev.c_str());
}

}  // namespace loom
