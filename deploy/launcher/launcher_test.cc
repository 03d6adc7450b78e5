#include "deploy/launcher/launcher.h"

#include <vector>

#include "gtest/gtest.h"

namespace loom {
namespace {

const ServiceBinary* Binary(common::v1::Role role) {
  for (const ServiceBinary& b : ServiceCatalog()) {
    if (b.role == role) return &b;
  }
  return nullptr;
}

// Encoder ranks 0..e-1 and LLM ranks 0..l-1 on one host (the last LLM rank
// on `other_host` when given), in launch order.
std::vector<LaunchedService> Workers(int e, int l, const std::string& other_host = "") {
  std::vector<LaunchedService> out;
  for (auto [role, n] :
       {std::pair{common::v1::ROLE_ENCODER_WORKER, e}, std::pair{common::v1::ROLE_LLM_WORKER, l}}) {
    for (int r = 0; r < n; ++r) {
      LaunchedService& s = out.emplace_back();
      s.binary = Binary(role);
      s.rank = r;
      s.host = "127.0.0.1";
    }
  }
  if (!other_host.empty()) out.back().host = other_host;
  return out;
}

std::vector<int> LocalRanks(const std::vector<LaunchedService>& services) {
  std::vector<int> out;
  for (const LaunchedService& s : services) out.push_back(s.local_rank);
  return out;
}

TEST(AssignLocalRanksTest, DisaggregatedWorkersEachGetAGpu) {
  std::vector<LaunchedService> s = Workers(2, 4);
  AssignLocalRanks(false, &s);
  EXPECT_EQ(LocalRanks(s), (std::vector<int>{0, 1, 2, 3, 4, 5}));
}

// Colocated: LLM ranks 0..3 (its first stage with TP 2 x DP 2) take GPUs
// 0..3 and encoder rank k shares LLM rank k's GPU.
TEST(AssignLocalRanksTest, ColocatedEncoderRankSharesItsLlmRanksGpu) {
  std::vector<LaunchedService> s = Workers(4, 8);
  AssignLocalRanks(true, &s);
  EXPECT_EQ(LocalRanks(s), (std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7}));
}

// An encoder rank whose LLM rank is on another host gets a GPU of its own.
TEST(AssignLocalRanksTest, ColocatedAcrossHostsFallsBackToItsOwnGpu) {
  std::vector<LaunchedService> s = Workers(2, 2, "10.0.0.2");
  AssignLocalRanks(true, &s);
  EXPECT_EQ(LocalRanks(s), (std::vector<int>{0, 1, 0, 0}));
}

}  // namespace
}  // namespace loom
