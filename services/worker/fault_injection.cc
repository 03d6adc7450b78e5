#include "services/worker/fault_injection.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "runtime/base/log.h"

namespace loom {

namespace {

struct Fault {
  std::string entry;  // as written: names its marker file
  std::string role;
  int rank = 0;
  std::string phase;
  int64_t iteration = 0;
  int signal = SIGKILL;  // 0: hang (the calling thread sleeps for good)
  bool nan = false;      // the caller's gradients turn NaN, every time
};

std::vector<Fault> ParseFaults() {
  std::vector<Fault> faults;
  const char* env = std::getenv("LOOM_FAULTS");
  if (env == nullptr || *env == '\0') return faults;
  for (absl::string_view entry : absl::StrSplit(env, ',', absl::SkipWhitespace())) {
    std::vector<std::string> f = absl::StrSplit(entry, ':');
    Fault fault;
    fault.entry = std::string(entry);
    bool ok = (f.size() == 4 || f.size() == 5) &&
              (f[0] == "encoder_worker" || f[0] == "llm_worker" || f[0] == "generator_worker") &&
              absl::SimpleAtoi(f[1], &fault.rank) && absl::SimpleAtoi(f[3], &fault.iteration);
    bool known_phase = false;
    for (const char* p : kFaultPhases) known_phase = known_phase || (f.size() > 2 && f[2] == p);
    if (ok && f.size() == 5) {
      ok = f[4] == "kill" || f[4] == "stop" || f[4] == "hang" ||
           (f[4] == "nan" && f[2] == "allreduce");
      fault.signal = f[4] == "stop" ? SIGSTOP : f[4] == "hang" ? 0 : SIGKILL;
      fault.nan = f[4] == "nan";
    }
    if (!ok || !known_phase) {
      LOOM_LOG(ERROR).With("entry", fault.entry)
          << "LOOM_FAULTS: ignoring an entry that is not "
             "ROLE:RANK:PHASE:ITERATION[:kill|stop|hang], or ROLE:RANK:allreduce:ITERATION:nan";
      continue;
    }
    fault.role = f[0];
    fault.phase = f[2];
    faults.push_back(std::move(fault));
  }
  return faults;
}

}  // namespace

bool MaybeInjectFault(absl::string_view role, int rank, absl::string_view phase,
                      int64_t iteration) {
  static const std::vector<Fault>* faults = new std::vector<Fault>(ParseFaults());
  bool nan = false;
  for (const Fault& f : *faults) {
    if (f.role != role || f.rank != rank || f.phase != phase || f.iteration != iteration) continue;
    if (f.nan) {
      LOOM_LOG(WARNING).With("entry", f.entry) << "injecting NaN gradients";
      nan = true;
      continue;
    }
    const char* dir = std::getenv("LOOM_FAULTS_FIRED");
    if (dir == nullptr || *dir == '\0') {
      LOOM_LOG(ERROR).With("entry", f.entry) << "LOOM_FAULTS without LOOM_FAULTS_FIRED: ignored";
      continue;
    }
    const std::string marker = absl::StrCat(dir, "/", f.entry);
    const int fd = open(marker.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd < 0) {
      if (errno != EEXIST) {
        LOOM_LOG(ERROR).With("marker", marker).With("error", std::strerror(errno))
            << "LOOM_FAULTS: cannot mark the fault fired; not firing it";
      }
      continue;  // fired before this restart
    }
    close(fd);
    LOOM_LOG(WARNING).With("entry", f.entry) << "injecting a fault";
    if (f.signal == 0) {
      for (;;) absl::SleepFor(absl::Hours(1));  // the process answers on; its training does not
    }
    raise(f.signal);
  }
  return nan;
}

}  // namespace loom
