#include "services/common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

extern char** environ;

namespace loom {

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(const std::vector<std::string>& argv,
                                                              const std::string& log_path) {
  if (argv.empty()) return absl::InvalidArgumentError("empty argv");
  int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open ", log_path, ": ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, log_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, log_fd, STDERR_FILENO);
  // The child starts with default dispositions and an empty signal mask, even
  // if this process blocks SIGTERM for its own sigwait().
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty, all;
  sigemptyset(&empty);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, argv[0].c_str(), &actions, &attr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(log_fd);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": ", std::strerror(rc)));
  }
  return std::unique_ptr<Subprocess>(new Subprocess(pid, log_path));
}

Subprocess::~Subprocess() {
  if (!reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &wait_status_, 0);
  }
}

bool Subprocess::running() {
  if (reaped_) return false;
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    wait_status_ = status;
    return false;
  }
  return true;
}

void Subprocess::Signal(int sig) {
  if (running()) kill(pid_, sig);
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (running()) {
    if (absl::Now() >= end) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " still running after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return wait_status_;
}

std::string Subprocess::ReadLog() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<ServingPorts> FindServingPorts(const std::string& log_text) {
  auto int_field = [](const std::string& line, const std::string& key, int* out) {
    const std::string needle = absl::StrCat("\"", key, "\":");
    size_t at = line.find(needle);
    if (at == std::string::npos) return false;
    size_t start = at + needle.size();
    size_t end = line.find_first_not_of("0123456789", start);
    return absl::SimpleAtoi(line.substr(start, end - start), out);
  };
  for (absl::string_view piece : absl::StrSplit(log_text, '\n')) {
    std::string line(piece);
    if (line.find("\"msg\":\"serving\"") == std::string::npos) continue;
    ServingPorts p;
    if (int_field(line, "grpc_port", &p.grpc_port) &&
        int_field(line, "metrics_port", &p.metrics_port)) {
      return p;
    }
  }
  return absl::NotFoundError("no \"serving\" record in the log");
}

absl::StatusOr<ServingPorts> WaitForServing(Subprocess& child, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  for (;;) {
    absl::StatusOr<ServingPorts> ports = FindServingPorts(child.ReadLog());
    if (ports.ok()) return ports;
    if (!child.running()) {
      std::string log = child.ReadLog();
      if (log.size() > 2000) log = log.substr(log.size() - 2000);
      absl::StatusOr<int> st = child.Wait(absl::ZeroDuration());
      return absl::FailedPreconditionError(absl::StrCat("pid ", child.pid(), " exited (",
                                                        DescribeWaitStatus(st.ok() ? *st : -1),
                                                        ") before serving; its log ends:\n", log));
    }
    if (absl::Now() >= end) {
      return absl::DeadlineExceededError(absl::StrCat("pid ", child.pid(), " not serving after ",
                                                      absl::FormatDuration(timeout),
                                                      "; log: ", child.log_path()));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

std::string DescribeWaitStatus(int status) {
  if (status < 0) return "unknown";
  if (WIFEXITED(status)) return absl::StrCat("exit ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("status ", status);
}

}  // namespace loom
