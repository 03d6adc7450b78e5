// Two simulated hosts for the multi-host tests: Linux network namespaces
// joined by one veth pair (host A 10.77.0.1, host B 10.77.0.2), made for
// each test and removed after it. Needs root (ip netns add); a test fails,
// naming it, where that is refused.
#ifndef LOOM_TESTS_INTEGRATION_NETNS_H_
#define LOOM_TESTS_INTEGRATION_NETNS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tests/integration/training_runs.h"

namespace loom {

// iproute2's `ip` (in sbin, which a test's PATH may lack).
std::string IpBinary();

// Runs `ip args`; an error naming the command and its output.
absl::Status Ip(const std::vector<std::string>& args);

class TwoHostsTest : public TrainingRuns {
 protected:
  void SetUp() override;
  void TearDown() override;

  static constexpr const char* kAddressA = "10.77.0.1";
  static constexpr const char* kAddressB = "10.77.0.2";
  std::string host_a_, host_b_;  // the namespaces
  std::string link_a_, link_b_;  // the veth pair's ends
};

}  // namespace loom

#endif  // LOOM_TESTS_INTEGRATION_NETNS_H_
