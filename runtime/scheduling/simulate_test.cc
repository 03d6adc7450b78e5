#include "runtime/scheduling/simulate.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/testing/tolerances.h"
#include "runtime/scheduling/schedule.h"

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

// Uniform microbatches through p LLM stages in 1F1B with activations kept:
// (m + p - 1)(F + B).
TEST(SimulateTest, OneFOneBMakespanOfUniformMicrobatches) {
  SimulationOptions o;
  o.encoder_recompute = o.llm_recompute = false;
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

// Ranks sharing devices (a CPU job on one host): 1F1B over 4 stages has up
// to 4 tasks at once. On one shared device the iteration is at least all
// the work one after another, and longer than with a device per stage; on
// four it is as with a device each. Two tasks at once on one device each
// run at half speed: the encoder's second forward overlaps the LLM's first.
TEST(SimulateTest, TasksSharingDevicesRunSlower) {
  SimulationOptions o;
  o.encoder_recompute = o.llm_recompute = false;
  o.llm_pp = 4;
  o.microbatches = 8;
  std::vector<BinAssignment> bins;
  for (int j = 0; j < 8; ++j) bins.push_back(Bin(0, j, 0, 0, 12));
  auto own = SimulateIteration(bins, o);
  ASSERT_TRUE(own.ok()) << own.status();
  o.shared_devices = 4;
  auto four = SimulateIteration(bins, o);
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_NEAR(four->iteration_seconds, own->iteration_seconds,
              testing::ClosedFormF64(own->iteration_seconds));
  o.shared_devices = 1;
  auto one = SimulateIteration(bins, o);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_GE(one->iteration_seconds, 8 * 12.0 - testing::ClosedFormF64(96.0));
  EXPECT_GT(one->iteration_seconds, own->iteration_seconds);
  // Encoder forwards 2 s each (cost 6), LLM forward 1 s, backward 2 s (cost
  // 3), transfers free. Own devices: enc F0 [0,2], enc F1 [2,4] beside LLM
  // F0 [2,3] and B0 [3,5]. Sharing one: enc F1 and LLM F0 both start at 2
  // at half speed, so LLM F0 ends at 4.
  SimulationOptions s;
  s.encoder_recompute = s.llm_recompute = false;
  s.microbatches = 2;
  s.encoder_forward_share = 1.0 / 3;
  s.llm_forward_share = 1.0 / 3;
  bins = {Bin(0, 0, 0, 6, 3), Bin(0, 1, 0, 6, 3)};
  s.timeline = true;
  auto apart = SimulateIteration(bins, s);
  ASSERT_TRUE(apart.ok()) << apart.status();
  s.shared_devices = 1;
  auto shared = SimulateIteration(bins, s);
  ASSERT_TRUE(shared.ok()) << shared.status();
  // One device does all the work (2 x 6 + 2 x 3 = 18 s) without a gap: the
  // encoder always has a forward or backward to run.
  EXPECT_NEAR(shared->iteration_seconds, 18.0, testing::ClosedFormF64(18.0));
  EXPECT_LT(apart->iteration_seconds, 18.0);
  for (const SimulatedTask& t : shared->timeline) {
    if (!t.encoder && t.kind == SimulatedTask::kForward && t.bin == 0) {
      EXPECT_NEAR(t.start, 2.0, testing::ClosedFormF64(2.0));
      EXPECT_NEAR(t.end, 4.0, testing::ClosedFormF64(4.0));  // 1 s of work at half speed
    }
  }
  // Two devices hold the encoder and a TP 1 LLM at once; a TP 2 LLM takes
  // both, so beside the encoder each runs at two thirds of its speed.
  s.shared_devices = 2;
  auto two = SimulateIteration(bins, s);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_NEAR(two->iteration_seconds, apart->iteration_seconds,
              testing::ClosedFormF64(apart->iteration_seconds));
  s.llm_tp = 2;
  auto tp = SimulateIteration(bins, s);
  ASSERT_TRUE(tp.ok()) << tp.status();
  EXPECT_GT(tp->iteration_seconds, apart->iteration_seconds);
  s.shared_devices = -1;
  EXPECT_EQ(SimulateIteration(bins, s).status().code(), absl::StatusCode::kInvalidArgument);
}

// Colocated: encoder rank k shares LLM rank k's GPU, one of the first
// stage's. With one LLM stage that GPU does all the work, as one shared
// device would (18 s, the example above); with two, the second stage's GPU
// is its own: its tasks run at full speed, and the iteration falls between
// a GPU per rank and one device for all.
TEST(SimulateTest, ColocatedEncoderSharesTheFirstLlmStagesGpus) {
  SimulationOptions s;
  s.encoder_recompute = s.llm_recompute = false;
  s.microbatches = 2;
  s.colocated = true;
  s.timeline = true;
  const std::vector<BinAssignment> bins = {Bin(0, 0, 0, 6, 3), Bin(0, 1, 0, 6, 3)};
  auto one_stage = SimulateIteration(bins, s);
  ASSERT_TRUE(one_stage.ok()) << one_stage.status();
  EXPECT_NEAR(one_stage->iteration_seconds, 18.0, testing::ClosedFormF64(18.0));
  s.llm_pp = 2;
  auto two = SimulateIteration(bins, s);
  ASSERT_TRUE(two.ok()) << two.status();
  s.colocated = false;
  auto apart = SimulateIteration(bins, s);
  ASSERT_TRUE(apart.ok()) << apart.status();
  s.shared_devices = 1;
  auto all_on_one = SimulateIteration(bins, s);
  ASSERT_TRUE(all_on_one.ok()) << all_on_one.status();
  EXPECT_GT(two->iteration_seconds, apart->iteration_seconds);
  EXPECT_LT(two->iteration_seconds, all_on_one->iteration_seconds);
  int second_stage = 0, slowed = 0;
  for (const SimulatedTask& t : two->timeline) {
    if (t.encoder || t.kind == SimulatedTask::kAllreduce) continue;
    const double alone = t.kind == SimulatedTask::kForward ? 0.5 : 1.0;  // 3 s over 2 stages
    if (t.stage == 1) {
      ++second_stage;
      EXPECT_NEAR(t.end - t.start, alone, testing::ClosedFormF64(alone));
    } else if (t.end - t.start > alone * (1 + 1e-9)) {
      ++slowed;  // beside an encoder task on the same GPU
    }
  }
  EXPECT_EQ(second_stage, 4);
  EXPECT_GT(slowed, 0);
}

// Colocated layouts must give the encoder exactly the first stage's GPUs:
// an encoder TP 2 rank spans both GPUs of a first stage of 2 DP ranks, and
// 2 encoder ranks cannot fill a first stage of 4.
TEST(SimulateTest, ColocatedEncoderRanksMustBeTheFirstStagesGpus) {
  SimulationOptions s;
  s.colocated = true;
  s.llm_dp = 2;
  s.encoder_tp = 2;
  const std::vector<BinAssignment> bins = {Bin(0, 0, 0, 6, 3), Bin(1, 0, 0, 6, 3)};
  auto spans = SimulateIteration(bins, s);
  ASSERT_TRUE(spans.ok()) << spans.status();
  s.colocated = false;
  auto apart = SimulateIteration(bins, s);
  ASSERT_TRUE(apart.ok()) << apart.status();
  // Each LLM rank shares its GPU with the one encoder rank's two bins.
  EXPECT_GT(spans->iteration_seconds, apart->iteration_seconds);
  s.colocated = true;
  s.llm_dp = 4;
  s.microbatches = 1;
  const std::vector<BinAssignment> four = {Bin(0, 0, 0, 6, 3), Bin(1, 0, 0, 6, 3),
                                           Bin(2, 0, 0, 6, 3), Bin(3, 0, 0, 6, 3)};
  EXPECT_EQ(SimulateIteration(four, s).status().code(), absl::StatusCode::kInvalidArgument);
}

// The monolithic layout: the first LLM stage runs each bin's encoder forward
// before its own and the encoder backward after its own, with no transfer,
// and allreduces both modules' gradients.
TEST(SimulateTest, EncoderInsideTheFirstLlmStage) {
  SimulationOptions o;
  o.encoder_recompute = o.llm_recompute = false;
  o.llm_pp = 2;
  o.microbatches = 2;
  o.encoder_in_first_llm_stage = true;
  o.llm_allreduce_seconds = 0.5;
  o.encoder_allreduce_seconds = 0.25;
  // Per bin: encoder F 1, B 2; each LLM stage F 1, B 2; the transfer of 5
  // does not apply on one GPU.
  const std::vector<BinAssignment> bins = {Bin(0, 0, 0, 3, 6, 5), Bin(0, 1, 0, 3, 6, 5)};
  auto r = SimulateIteration(bins, o);
  ASSERT_TRUE(r.ok()) << r.status();
  // Stage 0 (F0 F1 B0 B1): F0 0..2, F1 2..4, B0 5..9 (after stage 1's B0
  // 3..5), B1 9..13 (stage 1: F0 2..3, B0 3..5, F1 5..6, B1 6..8); then
  // 0.5 + 0.25 of allreduce.
  EXPECT_NEAR(r->iteration_seconds, 13.75, testing::ClosedFormF64(13.75));
  EXPECT_EQ(r->encoder_bubble_fraction, 0);  // no encoder stages of its own

  auto other_rank = SimulateIteration({Bin(0, 0, 1, 3, 6), Bin(0, 1, 0, 3, 6)}, o);
  EXPECT_EQ(other_rank.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(other_rank.status().message().find("encoder_rank 1"), absl::string_view::npos)
      << other_rank.status();
  o.encoder_pp = 2;
  auto staged = SimulateIteration(bins, o);
  EXPECT_NE(staged.status().message().find("encoder_pp 2"), absl::string_view::npos)
      << staged.status();
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

// An encoder shared by two LLM ranks serialises their encoder work: both
// forwards, then both backwards (the workers' order), each backward running
// its forward again (the stage holds only the last forward's activations).
TEST(SimulateTest, SharedEncoderRankSerialises) {
  SimulationOptions o;
  o.llm_dp = 2;
  o.encoder_dp = 1;
  const std::vector<BinAssignment> bins = {Bin(0, 0, 0, 3, 3), Bin(1, 0, 0, 3, 3)};
  auto r = SimulateIteration(bins, o);
  ASSERT_TRUE(r.ok());
  // enc F 0..1, 1..2; rank 0 LLM 1..4, rank 1 2..5; enc B (recompute 1 +
  // backward 2) of rank 0's bin 4..7, of rank 1's 7..10.
  EXPECT_NEAR(r->iteration_seconds, 10, testing::ClosedFormF64(10));
  EXPECT_NEAR(r->recompute_seconds, 2, testing::ClosedFormF64(2));
  o.encoder_recompute = o.llm_recompute = false;  // activations kept: 4..6, 6..8
  r = SimulateIteration(bins, o);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->iteration_seconds, 8, testing::ClosedFormF64(8));
  EXPECT_EQ(r->recompute_seconds, 0);
  // Each module as its job says: the LLM keeping (one stage: always live
  // anyway) changes nothing; the encoder recomputing again costs its 2 s.
  o.encoder_recompute = true;
  r = SimulateIteration(bins, o);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->iteration_seconds, 10, testing::ClosedFormF64(10));
  EXPECT_NEAR(r->recompute_seconds, 2, testing::ClosedFormF64(2));
  // A plan carries the job's choice into the simulator's options.
  scheduler::v1::Plan plan = PlanOfDegrees({2, 1, 1});
  EXPECT_TRUE(SimulationOptionsFor(plan).encoder_recompute);
  plan.set_encoder_recompute("selective");
  plan.set_llm_recompute("none");
  EXPECT_FALSE(SimulationOptionsFor(plan).encoder_recompute);
  EXPECT_FALSE(SimulationOptionsFor(plan).llm_recompute);
}

// Two LLM stages, two microbatches (F 1, B 2 per stage). Stage 0 runs F0 F1
// B0 B1 and recomputes both backwards; stage 1 runs F0 B0 F1 B1, each
// backward right after its forward (live, no recompute):
//   stage 0: F0 0..1  F1 1..2  B0 4..7 (needs stage 1's B0)  B1 7..10
//   stage 1: F0 1..2  B0 2..4  F1 4..5  B1 5..7
TEST(SimulateTest, PipelineStagesRecomputeWhatIsNotLive) {
  SimulationOptions o;
  o.llm_pp = 2;
  o.microbatches = 2;
  o.timeline = true;
  auto r = SimulateIteration({Bin(0, 0, 0, 0, 6), Bin(0, 1, 0, 0, 6)}, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->iteration_seconds, 10, testing::ClosedFormF64(10));
  EXPECT_NEAR(r->recompute_seconds, 2, testing::ClosedFormF64(2));
  // Busy 8 of stage 0's 10 s, 6 of stage 1's 7 s.
  EXPECT_NEAR(r->llm_bubble_fraction, 1 - 14.0 / 17, testing::ClosedFormF64(1));
  std::string order[2];
  for (const SimulatedTask& t : r->timeline) {
    if (t.kind == SimulatedTask::kAllreduce) continue;
    order[t.stage] += absl::StrCat(t.kind == SimulatedTask::kForward ? "F" : "B", t.bin,
                                   t.recomputed ? "r " : " ");
  }
  EXPECT_EQ(order[0], "F0 F1 B0r B1r ");
  EXPECT_EQ(order[1], "F0 B0 F1 B1 ");
}

// Stages take their share of a bin (the workers' FLOP-balanced split): a
// heavy last stage lengthens the pipeline against an even split.
TEST(SimulateTest, StageSharesSetEachStagesTime) {
  SimulationOptions o;
  o.llm_pp = 2;
  o.microbatches = 2;
  o.encoder_recompute = o.llm_recompute = false;
  const std::vector<BinAssignment> bins = {Bin(0, 0, 0, 0, 12), Bin(0, 1, 0, 0, 12)};
  auto even = SimulateIteration(bins, o);
  o.llm_stage_share = {0.25, 0.75};
  auto skewed = SimulateIteration(bins, o);
  ASSERT_TRUE(even.ok() && skewed.ok());
  // even: F 2, B 4 per stage; skewed: stage 0 F 1 B 2, stage 1 F 3 B 6.
  EXPECT_NEAR(even->iteration_seconds, 18, testing::ClosedFormF64(18));
  EXPECT_NEAR(skewed->iteration_seconds, 21, testing::ClosedFormF64(21));
  o.llm_stage_share = {0.5, 0.6};
  EXPECT_FALSE(SimulateIteration(bins, o).ok());
  o.llm_stage_share = {1.0};
  EXPECT_FALSE(SimulateIteration(bins, o).ok());
}

// The generator: a stage after the LLM's last. One bin: LLM F 2, generator
// F 1 + B 2, LLM B 4 (it waits for the pictures' gradients): 9; the
// generator's allreduce (0.5, from 5) hides under the LLM's backward. A bin
// without pictures skips it; bins on two generator replicas run at once;
// in the monolithic layout the LLM's last stage carries it.
TEST(SimulateTest, TheGeneratorRunsAfterTheLlmsLastStage) {
  SimulationOptions o;
  o.generator_dp = 1;
  o.generator_allreduce_seconds = 0.5;
  BinAssignment b = Bin(0, 0, 0, 0, 6);
  b.generator = 3;
  auto r = SimulateIteration({b}, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->iteration_seconds, 9, testing::ClosedFormF64(9.0));
  EXPECT_NEAR(r->generator_compute_seconds, 3, testing::ClosedFormF64(3.0));
  EXPECT_GT(r->generator_utilization, 0);
  o.generator_allreduce_seconds = 10;  // now the last to end: 5 + 10
  auto slow = SimulateIteration({b}, o);
  ASSERT_TRUE(slow.ok());
  EXPECT_NEAR(slow->iteration_seconds, 15, testing::ClosedFormF64(15.0));
  o.generator_allreduce_seconds = 0.5;
  // No pictures: the LLM alone (6), the generator's allreduce at 0.
  auto text = SimulateIteration({Bin(0, 0, 0, 0, 6)}, o);
  ASSERT_TRUE(text.ok());
  EXPECT_NEAR(text->iteration_seconds, 6, testing::ClosedFormF64(6.0));
  // Two LLM replicas' bins on one generator replica serialise there; on two
  // they run at once.
  o.llm_dp = 2;
  BinAssignment c = Bin(1, 0, 0, 0, 6);
  c.generator = 3;
  auto one = SimulateIteration({b, c}, o);
  o.generator_dp = 2;
  c.generator_rank = 1;
  auto two = SimulateIteration({b, c}, o);
  ASSERT_TRUE(one.ok() && two.ok());
  EXPECT_NEAR(two->iteration_seconds, 9, testing::ClosedFormF64(9.0));
  EXPECT_NEAR(one->iteration_seconds, 12, testing::ClosedFormF64(12.0));  // 2 + 3 + 3 + 4
  // A generator rank outside the plan is refused.
  c.generator_rank = 2;
  EXPECT_EQ(SimulateIteration({b, c}, o).status().code(), absl::StatusCode::kInvalidArgument);
  // Monolithic: the LLM's last stage runs the picture's forward after its
  // own and its backward before: the same 9 on one GPU group.
  SimulationOptions mono;
  mono.encoder_in_first_llm_stage = true;
  mono.llm_recompute = false;
  auto in_llm = SimulateIteration({b}, mono);
  ASSERT_TRUE(in_llm.ok()) << in_llm.status();
  EXPECT_NEAR(in_llm->iteration_seconds, 9, testing::ClosedFormF64(9.0));
}

// A text-only bin (no encoder cost) never waits for the encoder or a
// transfer, as the workers skip it.
TEST(SimulateTest, TextOnlyBinsSkipTheEncoder) {
  SimulationOptions o;
  auto r = SimulateIteration({Bin(0, 0, 0, 0, 3, 5)}, o);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->iteration_seconds, 3, testing::ClosedFormF64(3));
  EXPECT_EQ(r->tasks, 2);
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
