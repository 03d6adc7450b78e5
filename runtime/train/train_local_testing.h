// Running loom-train-local from a test (its binary in the test's runfiles:
// data = [":loom-train-local"]) and reading the steps it prints.
#ifndef LOOM_RUNTIME_TRAIN_TRAIN_LOCAL_TESTING_H_
#define LOOM_RUNTIME_TRAIN_TRAIN_LOCAL_TESTING_H_

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace loom::testing {

// Its stdout and stderr; *rc its exit code (-1: killed).
inline std::string TrainLocal(const std::string& args, int* rc) {
  const std::string bin = std::string(std::getenv("TEST_SRCDIR")) + "/" +
                          std::getenv("TEST_WORKSPACE") + "/runtime/train/loom-train-local";
  FILE* p = popen((bin + " " + args + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// A number after "key": in a JSON line (NaN: none).
inline double JsonField(const std::string& line, const std::string& key) {
  const size_t at = line.find("\"" + key + "\":");
  return at == std::string::npos ? NAN : std::atof(line.c_str() + at + key.size() + 3);
}

struct PrintedStep {
  int step = 0;
  double loss = 0, grad_norm = 0;
};

// The step lines of its output, in order.
inline std::vector<PrintedStep> PrintedSteps(const std::string& out) {
  std::vector<PrintedStep> steps;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("{\"step\":", 0) == 0) {
      steps.push_back({static_cast<int>(JsonField(line, "step")), JsonField(line, "loss"),
                       JsonField(line, "grad_norm")});
    }
  }
  return steps;
}

}  // namespace loom::testing

#endif  // LOOM_RUNTIME_TRAIN_TRAIN_LOCAL_TESTING_H_
