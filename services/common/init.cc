#include "services/common/init.h"

#include <signal.h>

#include <cstdio>
#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "runtime/base/log.h"
#include "runtime/base/open_files.h"

ABSL_FLAG(std::string, log_level, "info",
          "Least severe log records written: debug, info, warning or error.");
ABSL_FLAG(bool, check_flags, false,
          "Parse and check the command line, print \"flags ok\" and exit 0 without starting "
          "(how the Helm chart's test checks every container's args).");

namespace loom {

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

std::vector<std::string> InitService(int argc, char** argv, const std::string& service_name,
                                     const std::string& usage) {
  absl::SetProgramUsageMessage(usage);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  log::SetServiceName(service_name);
  log::Level level;
  if (!log::ParseLevel(absl::GetFlag(FLAGS_log_level), &level)) {
    std::fprintf(stderr,
                 "%s: invalid --log_level=%s (want debug, info, warning or "
                 "error)\n",
                 service_name.c_str(), absl::GetFlag(FLAGS_log_level).c_str());
    std::exit(1);
  }
  log::SetMinLevel(level);
  if (absl::GetFlag(FLAGS_check_flags)) {
    std::printf("%s: flags ok\n", service_name.c_str());
    // Nothing was started: skip the static destructors, which on a rare exit
    // crashed loom-preprocess here (a CI run of helm_test saw it).
    std::fflush(nullptr);
    std::_Exit(0);
  }
  BlockTerminationSignals();
  RaiseOpenFileLimit();  // a worker's peers, channels and checkpoint parts
  return std::vector<std::string>(positional.begin(), positional.end());
}

}  // namespace loom
