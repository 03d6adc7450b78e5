// loom-train-local's --device: a bad value, and a GPU that is not there,
// are refused naming the flag; cpu trains.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace loom {
namespace {

std::string TrainLocal(const std::string& args, int* rc) {
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

TEST(TrainLocalDeviceTest, BadOrMissingDevicesAreRefusedByName) {
  int rc = 0;
  std::string out = TrainLocal("--device gpu --steps 0", &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("--device gpu: want cpu, cuda or cuda:N"), std::string::npos) << out;
  out = TrainLocal("--device cuda:x --steps 0", &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("got \"cuda:x\""), std::string::npos) << out;
  out = TrainLocal("--device cuda:999 --steps 0", &rc);  // no such GPU, or no CUDA at all
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("--device cuda:999: "), std::string::npos) << out;
}

TEST(TrainLocalDeviceTest, CpuTrains) {
  int rc = 0;
  const std::string out = TrainLocal("--device cpu --steps 2 --batch_size 4", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"step\":2"), std::string::npos) << out;
}

}  // namespace
}  // namespace loom
