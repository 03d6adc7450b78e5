// loom-up: starts every Loom service as its own process on this machine,
// reports each healthy, and stops them all cleanly on Ctrl-C or SIGTERM.
// `./loom up` builds the binaries and runs this.
#include <signal.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "deploy/launcher/launcher.h"
#include "services/common/init.h"

ABSL_FLAG(std::string, bin_dir, "",
          "Bazel's bin folder holding services/*/loom-*; default: the one this "
          "binary was built into.");
ABSL_FLAG(std::string, run_dir, ".loom/run", "Folder for this run's logs.");
ABSL_FLAG(std::string, bind_host, "127.0.0.1", "Address every service binds.");
ABSL_FLAG(int, base_port, 0,
          "0: every service picks free ports; else service i uses base+2i "
          "(gRPC) and base+2i+1 (/metrics).");
ABSL_FLAG(int, encoder_dp, 2, "Encoder worker ranks.");
ABSL_FLAG(int, llm_dp, 2, "LLM worker ranks.");
ABSL_FLAG(absl::Duration, startup_timeout, absl::Seconds(60),
          "How long each service may take to report serving.");
ABSL_FLAG(bool, exit_when_healthy, false,
          "Stop everything and exit 0 once every service is healthy (a smoke "
          "test of the whole deployment).");

namespace {

// <bin>/deploy/launcher/loom-up -> <bin>
std::string DefaultBinDir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  for (int i = 0; i < 3; ++i) path = path.substr(0, path.rfind('/'));
  return path;
}

}  // namespace

int main(int argc, char** argv) {
  loom::InitService(argc, argv, "loom-up", "loom-up: run every Loom service locally until Ctrl-C.");
  loom::LauncherOptions o;
  o.bin_dir = absl::GetFlag(FLAGS_bin_dir).empty() ? DefaultBinDir() : absl::GetFlag(FLAGS_bin_dir);
  o.run_dir = absl::GetFlag(FLAGS_run_dir);
  o.host = absl::GetFlag(FLAGS_bind_host);
  o.base_port = absl::GetFlag(FLAGS_base_port);
  o.encoder_dp = absl::GetFlag(FLAGS_encoder_dp);
  o.llm_dp = absl::GetFlag(FLAGS_llm_dp);
  o.startup_timeout = absl::GetFlag(FLAGS_startup_timeout);

  std::printf("loom up: starting %d services, logs in %s/logs\n", 2 + o.encoder_dp + o.llm_dp,
              o.run_dir.c_str());
  std::fflush(stdout);
  loom::Launcher launcher(o);
  absl::Status started = launcher.Start();
  std::printf("%s", loom::FormatServiceTable(launcher.services(), o.host).c_str());
  if (!started.ok()) {
    std::fprintf(stderr, "loom up: %s\n", std::string(started.message()).c_str());
    launcher.Stop();
    return 1;
  }
  std::printf("loom up: all %zu services healthy.%s\n", launcher.services().size(),
              absl::GetFlag(FLAGS_exit_when_healthy) ? "" : " Ctrl-C stops them.");
  std::fflush(stdout);

  int rc = 0;
  if (!absl::GetFlag(FLAGS_exit_when_healthy)) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    const timespec tick = {0, 200 * 1000 * 1000};
    for (;;) {
      int sig = sigtimedwait(&set, nullptr, &tick);
      if (sig == SIGTERM || sig == SIGINT) {
        std::printf("\nloom up: %s received, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
        break;
      }
      if (const loom::LaunchedService* s = launcher.FindExited()) {
        std::fprintf(stderr, "loom up: %s rank %d exited (%s); stopping the rest\n",
                     s->binary->name.c_str(), s->rank,
                     loom::DescribeWaitStatus(s->exit_status).c_str());
        rc = 1;
        break;
      }
    }
  }
  const bool clean = launcher.Stop();
  std::printf("%s", loom::FormatServiceTable(launcher.services(), o.host).c_str());
  std::printf("loom up: %s\n", clean ? "stopped cleanly" : "some services did not exit cleanly");
  return clean ? rc : 1;
}
