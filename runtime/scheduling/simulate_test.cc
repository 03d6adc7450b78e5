#include "runtime/scheduling/simulate.h"

#include "gtest/gtest.h"
#include "kernels/testing/tolerances.h"

namespace loom::sched {
namespace {

BinAssignment Bin(int rank, int mb, int enc, double e, double l, double transfer = 0) {
  BinAssignment b;
  b.llm_rank = rank;
  b.microbatch = mb;
  b.encoder_rank = enc;
  b.encoder = e;
  b.llm = l;
  b.transfer = transfer;
  return b;
}

// One bin: encoder forward, transfer, LLM forward and backward, transfer back,
// encoder backward, allreduce.
TEST(SimulateTest, OneBinIsTheSumOfItsParts) {
  SimulationOptions o;
  o.llm_allreduce_seconds = 0.5;
  o.encoder_allreduce_seconds = 0.25;
  auto r = SimulateIteration({Bin(0, 0, 0, 3, 6, 1)}, o);
  ASSERT_TRUE(r.ok()) << r.status();
  // enc F 1, transfer 1, LLM F 2 + B 4 -> 8, transfer 1, enc B 2 -> 11, + 0.25.
  EXPECT_NEAR(r->iteration_seconds, 11.25, testing::ClosedFormF64(11.25));
}

// Uniform microbatches through p LLM stages in 1F1B: (m + p - 1)(F + B).
TEST(SimulateTest, OneFOneBMakespanOfUniformMicrobatches) {
  SimulationOptions o;
  o.llm_pp = 4;
  o.microbatches = 8;
  std::vector<BinAssignment> bins;
  for (int j = 0; j < 8; ++j) bins.push_back(Bin(0, j, 0, 0, 12));  // F 1, B 2 per stage
  auto r = SimulateIteration(bins, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->iteration_seconds, (8 + 4 - 1) * 3.0, testing::ClosedFormF64((8 + 4 - 1) * 3.0));
  EXPECT_NEAR(r->llm_utilization, 8 * 12.0 / (33.0 * 4),
              testing::ClosedFormF64(8 * 12.0 / (33.0 * 4)));
}

// The slowest DP rank sets the iteration: balancing bins shortens it.
TEST(SimulateTest, ImbalanceAcrossRanksCosts) {
  SimulationOptions o;
  o.llm_dp = 2;
  o.microbatches = 2;
  o.encoder_dp = 2;
  auto skewed = SimulateIteration(
      {Bin(0, 0, 0, 0, 6), Bin(0, 1, 0, 0, 6), Bin(1, 0, 1, 0, 3), Bin(1, 1, 1, 0, 3)}, o);
  auto even = SimulateIteration(
      {Bin(0, 0, 0, 0, 6), Bin(0, 1, 0, 0, 3), Bin(1, 0, 1, 0, 3), Bin(1, 1, 1, 0, 6)}, o);
  ASSERT_TRUE(skewed.ok() && even.ok());
  EXPECT_NEAR(skewed->iteration_seconds, 12, testing::ClosedFormF64(12));
  EXPECT_NEAR(even->iteration_seconds, 9, testing::ClosedFormF64(9));
}

// An encoder shared by two LLM ranks serialises their encoder work.
TEST(SimulateTest, SharedEncoderRankSerialises) {
  SimulationOptions o;
  o.llm_dp = 2;
  o.encoder_dp = 1;
  auto r = SimulateIteration({Bin(0, 0, 0, 3, 3), Bin(1, 0, 0, 3, 3)}, o);
  ASSERT_TRUE(r.ok());
  // enc F 1, 1 (ends 2); rank 1 LLM 2..5; enc B of rank 0's bin at 4..6, then
  // rank 1's at 6..8.
  EXPECT_NEAR(r->iteration_seconds, 8, testing::ClosedFormF64(8));
}

TEST(SimulateTest, RejectsBinsOutsideThePlan) {
  SimulationOptions o;
  o.microbatches = 2;
  EXPECT_FALSE(SimulateIteration({Bin(0, 0, 0, 1, 1)}, o).ok());  // microbatch 1 missing
  EXPECT_FALSE(SimulateIteration({Bin(0, 0, 0, 1, 1), Bin(0, 0, 0, 1, 1)}, o).ok());
  EXPECT_FALSE(SimulateIteration({Bin(0, 0, 3, 1, 1), Bin(0, 1, 0, 1, 1)}, o).ok());
  EXPECT_FALSE(SimulateIteration({Bin(1, 0, 0, 1, 1), Bin(0, 1, 0, 1, 1)}, o).ok());
}

}  // namespace
}  // namespace loom::sched
