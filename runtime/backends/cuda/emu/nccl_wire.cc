#include "nccl_wire.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace loom::cuda_emu::wire {
namespace {

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

socklen_t Address(int64_t pid, sockaddr_un* a) {
  std::memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  const std::string name = "loom-cuda-emu-nccl-" + std::to_string(pid);
  std::memcpy(a->sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

// Messages larger than this are refused as corrupt (the largest tensor a
// test moves is megabytes).
constexpr uint64_t kMaxPayload = uint64_t{1} << 34;

}  // namespace

Conn::Conn(int fd) : fd_(fd), writer_([this] { WriteLoop(); }) {}

Conn::~Conn() {
  Close(false);
  close(fd_);
}

void Conn::Post(Message m) {
  m.h.payload = m.payload.size();
  std::lock_guard<std::mutex> l(mu_);
  if (closing_) return;
  out_.push_back(std::move(m));
  cv_.notify_all();
}

bool Conn::Read(Message* m) {
  if (!ReadAll(fd_, reinterpret_cast<char*>(&m->h), sizeof(m->h))) return false;
  if (m->h.payload > kMaxPayload) return false;
  m->payload.resize(m->h.payload);
  return m->payload.empty() || ReadAll(fd_, m->payload.data(), m->payload.size());
}

void Conn::Close(bool flush) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!closing_) {
      closing_ = true;
      flush_ = flush;
      cv_.notify_all();
    }
  }
  // A writer blocked on a peer that does not read ends with the socket.
  if (!flush) shutdown(fd_, SHUT_RDWR);
  if (writer_.joinable()) writer_.join();
  shutdown(fd_, SHUT_RDWR);
}

void Conn::WriteLoop() {
  for (;;) {
    Message m;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return closing_ || !out_.empty(); });
      if (out_.empty() || (closing_ && !flush_)) return;
      m = std::move(out_.front());
      out_.pop_front();
    }
    if (!WriteAll(fd_, reinterpret_cast<const char*>(&m.h), sizeof(m.h)) ||
        !WriteAll(fd_, m.payload.data(), m.payload.size())) {
      return;  // the peer is gone: its reader sees the end
    }
  }
}

int Listen(int64_t pid) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un a;
  const socklen_t len = Address(pid, &a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(fd, 64) != 0) {
    const int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

int Connect(int64_t pid) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un a;
  const socklen_t len = Address(pid, &a);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), len) != 0) {
    const int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

}  // namespace loom::cuda_emu::wire
