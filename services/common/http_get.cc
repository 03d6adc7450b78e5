#include "services/common/http_get.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace loom {
namespace {

// Closes a file descriptor when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

int MillisLeft(absl::Time end) {
  return static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(end - absl::Now())));
}

}  // namespace

absl::StatusOr<HttpResponse> HttpGet(const std::string& host, int port, const std::string& path,
                                     absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  const std::string where = absl::StrCat("http://", host, ":", port, path);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    return absl::UnavailableError(absl::StrCat(where, ": ", gai_strerror(rc)));
  }
  Fd fd(socket(res->ai_family, res->ai_socktype | SOCK_NONBLOCK, res->ai_protocol));
  int rc = fd.get() < 0 ? -1 : connect(fd.get(), res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (fd.get() < 0 || (rc != 0 && errno != EINPROGRESS)) {
    return absl::UnavailableError(absl::StrCat(where, ": ", std::strerror(errno)));
  }
  pollfd p{fd.get(), POLLOUT, 0};
  if (poll(&p, 1, MillisLeft(end)) <= 0) {
    return absl::DeadlineExceededError(absl::StrCat(where, ": connect timed out"));
  }
  int err = 0;
  socklen_t len = sizeof(err);
  getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) return absl::UnavailableError(absl::StrCat(where, ": ", std::strerror(err)));

  std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host, "\r\nConnection: close\r\n\r\n");
  size_t sent = 0;
  while (sent < request.size()) {
    p = {fd.get(), POLLOUT, 0};
    if (poll(&p, 1, MillisLeft(end)) <= 0) {
      return absl::DeadlineExceededError(absl::StrCat(where, ": send timed out"));
    }
    ssize_t n = send(fd.get(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN) {
      return absl::UnavailableError(absl::StrCat(where, ": ", std::strerror(errno)));
    }
    if (n > 0) sent += static_cast<size_t>(n);
  }
  std::string reply;
  char buf[16384];
  for (;;) {
    p = {fd.get(), POLLIN, 0};
    if (poll(&p, 1, MillisLeft(end)) <= 0) {
      return absl::DeadlineExceededError(absl::StrCat(where, ": reply timed out"));
    }
    ssize_t n = recv(fd.get(), buf, sizeof(buf), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat(where, ": ", std::strerror(errno)));
    }
    reply.append(buf, static_cast<size_t>(n));
  }

  size_t header_end = reply.find("\r\n\r\n");
  if (header_end == std::string::npos || reply.rfind("HTTP/", 0) != 0) {
    return absl::InternalError(absl::StrCat(where, ": reply is not HTTP"));
  }
  HttpResponse out;
  std::vector<std::string> lines = absl::StrSplit(reply.substr(0, header_end), "\r\n");
  std::vector<std::string> status_line = absl::StrSplit(lines[0], ' ');
  if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &out.status_code)) {
    return absl::InternalError(absl::StrCat(where, ": bad status line '", lines[0], "'"));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    std::string lower = absl::AsciiStrToLower(lines[i]);
    if (lower.rfind("content-type:", 0) == 0) {
      out.content_type = std::string(absl::StripAsciiWhitespace(lines[i].substr(13)));
    }
  }
  out.body = reply.substr(header_end + 4);
  return out;
}

}  // namespace loom
