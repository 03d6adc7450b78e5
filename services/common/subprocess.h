// Child processes for the local launcher and integration tests.
//
// A Subprocess runs one binary with its stdout and stderr appended to a log
// file (so a chatty child can never block on a full pipe), and can be
// signalled and waited for with a deadline. The destructor kills (SIGKILL)
// and reaps a child that is still running, so a failing test leaves no
// process behind.
//
// Thread-safety: one thread per Subprocess.
#ifndef LOOM_SERVICES_COMMON_SUBPROCESS_H_
#define LOOM_SERVICES_COMMON_SUBPROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace loom {

class Subprocess {
 public:
  // Starts argv[0] (a path) with argv; stdout and stderr go to log_path.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(const std::vector<std::string>& argv,
                                                           const std::string& log_path);
  ~Subprocess();

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  bool running();

  // Sends `sig`; a no-op once the child has been reaped.
  void Signal(int sig);

  // Waits up to `timeout` for the child to exit and returns its wait status
  // (see WIFEXITED). DEADLINE_EXCEEDED if it is still running.
  absl::StatusOr<int> Wait(absl::Duration timeout);

  // The log file's contents so far ("" if unreadable).
  std::string ReadLog() const;

 private:
  Subprocess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}
  pid_t pid_;
  std::string log_path_;
  bool reaped_ = false;
  int wait_status_ = 0;
};

// The ports a chassis logged in its "serving" record.
struct ServingPorts {
  int grpc_port = 0;
  int metrics_port = 0;
};

// Finds the chassis's "serving" record in a log (JSON lines) text.
// NOT_FOUND if there is none yet.
absl::StatusOr<ServingPorts> FindServingPorts(const std::string& log_text);

// Polls the child's log until its "serving" record appears. Errors: the
// child exited first (FAILED_PRECONDITION, with the end of its log), or
// `timeout` passed (DEADLINE_EXCEEDED).
absl::StatusOr<ServingPorts> WaitForServing(Subprocess& child, absl::Duration timeout);

// A printable description of a wait status: "exit 0", "signal 9 (Killed)".
std::string DescribeWaitStatus(int status);

}  // namespace loom

#endif  // LOOM_SERVICES_COMMON_SUBPROCESS_H_
