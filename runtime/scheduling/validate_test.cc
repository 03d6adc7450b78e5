#include "runtime/scheduling/validate.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/base/trace.h"

namespace loom::sched {
namespace {

TEST(ValidateTest, ALayoutReplacesTheFieldsItNames) {
  job::v1::JobConfig job;
  job.mutable_parallel()->set_llm_dp(2);
  job.mutable_parallel()->set_llm_pp(3);
  ASSERT_TRUE(ApplyLayout("llm_pp: 1 microbatches: 4", &job).ok());
  EXPECT_EQ(job.parallel().llm_pp(), 1);
  EXPECT_EQ(job.parallel().microbatches(), 4);
  EXPECT_EQ(job.parallel().llm_dp(), 2);
}

TEST(ValidateTest, ABadLayoutIsNamedAndChangesNothing) {
  job::v1::JobConfig job;
  job.mutable_parallel()->set_llm_pp(3);
  for (const char* bad : {"llm_pp: 2 llm_ppp: 2", "llm_pp 2 x", "llm_pp: -"}) {
    absl::Status s = ApplyLayout(bad, &job);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("\"" + std::string(bad) + "\""), std::string::npos) << s;
    EXPECT_EQ(job.parallel().llm_pp(), 3) << bad;
  }
}

TEST(ValidateTest, LayoutsSplitAtSemicolons) {
  EXPECT_EQ(SplitLayouts(" llm_pp: 2 ;; encoder_tp: 2 microbatches: 4;"),
            (std::vector<std::string>{"llm_pp: 2", "encoder_tp: 2 microbatches: 4"}));
  EXPECT_TRUE(SplitLayouts(" ; ").empty());
}

// A span of `seconds` from `at` (seconds from the iteration's start t0).
void Span(trace::v1::TraceFile* f, int pid, int tid, const std::string& cat, double t0, double at,
          double seconds, int64_t iteration) {
  trace::AddSpan(f, cat, cat, pid, tid, t0 + at * 1e6, t0 + (at + seconds) * 1e6, iteration);
}

// Encoder 1 rank; LLM TP 1 x PP 2 x DP 1. Iteration i measures (1 + i)
// times the predicted spans.
trace::v1::TraceFile Trace(int iterations) {
  trace::v1::TraceFile f;
  for (int i = 0; i < iterations; ++i) {
    const double t0 = 1e9 + i * 1e7, k = 1 + i;
    using trace::kMeasuredPid, trace::kPredictedPid, trace::StageTrack, trace::WorkerTrack;
    Span(&f, kMeasuredPid, WorkerTrack(true, 0), "forward", t0, 0, 0.1 * k, i);
    Span(&f, kMeasuredPid, WorkerTrack(false, 0), "forward", t0, 0.1 * k, 0.2 * k, i);
    Span(&f, kMeasuredPid, WorkerTrack(false, 1), "forward", t0, 0.3 * k, 0.3 * k, i);
    Span(&f, kMeasuredPid, WorkerTrack(false, 1), "backward", t0, 0.6 * k, 0.3 * k, i);
    Span(&f, kMeasuredPid, WorkerTrack(false, 0), "recompute", t0, 0.9 * k, 0.1 * k, i);
    Span(&f, kMeasuredPid, WorkerTrack(false, 0), "allreduce", t0, 1.0 * k, 5, i);  // not compute
    Span(&f, kPredictedPid, StageTrack(true, 0, 0), "forward", t0, 0, 0.1, i);
    Span(&f, kPredictedPid, StageTrack(false, 0, 0), "forward", t0, 0.1, 0.2, i);
    Span(&f, kPredictedPid, StageTrack(false, 0, 1), "forward", t0, 0.3, 0.6, i);
    Span(&f, kPredictedPid, StageTrack(false, 0, 0), "backward", t0, 0.9, 0.1, i);
  }
  return f;
}

job::v1::JobConfig Job() {
  job::v1::JobConfig job;
  job::v1::ParallelConfig* p = job.mutable_parallel();
  p->set_encoder_tp(1);
  p->set_encoder_pp(1);
  p->set_encoder_dp(1);
  p->set_llm_tp(1);
  p->set_llm_pp(2);
  p->set_llm_dp(1);
  return job;
}

TEST(ValidateTest, FiguresAreMediansAfterTheWarmUp) {
  const std::string steps =
      "loom up: starting\n{\"iteration\":0,\"seconds\":9}\n{\"iteration\":1,\"seconds\":2}\n"
      "{\"iteration\":2,\"seconds\":4}\n{\"iteration\":3,\"seconds\":3}\n";
  const std::vector<std::pair<bool, std::string>> logs = {
      {true,
       "{\"predicted_bytes\":100,\"measured_bytes\":90}\n"
       "{\"msg\":\"x\"}\n{\"predicted_bytes\":120,\"measured_bytes\":110}\n"},
      {false, "{\"predicted_bytes\":300,\"measured_bytes\":200}\n"},
      {false, "{\"predicted_bytes\":250,\"measured_bytes\":260}\n"}};
  absl::StatusOr<LayoutResult> r = LayoutFigures(Job(), Trace(4), steps, logs, /*warmup=*/1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->iterations, 3);
  // Iterations 1..3 end at 1.0 k (k = 2, 3, 4): the median is 3 s; the
  // prediction is 1 s each time.
  EXPECT_NEAR(r->measured_s, 3.0, 1e-9);
  EXPECT_NEAR(r->predicted_s, 1.0, 1e-9);
  EXPECT_NEAR(r->step_s, 3.0, 1e-9);
  ASSERT_EQ(r->stages.size(), 3u);
  EXPECT_TRUE(r->stages[0].encoder);
  EXPECT_NEAR(r->stages[0].measured_s, 0.3, 1e-9);
  EXPECT_NEAR(r->stages[0].predicted_s, 0.1, 1e-9);
  EXPECT_FALSE(r->stages[1].encoder);
  EXPECT_EQ(r->stages[1].stage, 0);
  EXPECT_NEAR(r->stages[1].measured_s, 0.9, 1e-9);  // forward + recompute, no allreduce
  EXPECT_NEAR(r->stages[1].predicted_s, 0.3, 1e-9);
  EXPECT_EQ(r->stages[2].stage, 1);
  EXPECT_NEAR(r->stages[2].measured_s, 1.8, 1e-9);
  EXPECT_NEAR(r->stages[2].predicted_s, 0.6, 1e-9);
  EXPECT_EQ(r->encoder_measured_bytes, 110);  // the worker's last record
  EXPECT_EQ(r->encoder_predicted_bytes, 120);
  EXPECT_EQ(r->llm_measured_bytes, 260);  // the largest rank's
  EXPECT_EQ(r->llm_predicted_bytes, 300);
  EXPECT_EQ(r->ranks, 3);
  const std::string json = LayoutJson(*r);
  EXPECT_NE(json.find("\"predicted_s\":1.000000,\"measured_s\":3.000000"), std::string::npos)
      << json;
  EXPECT_NE(json.find("{\"module\":\"llm\",\"stage\":1,\"predicted_s\":0.600000"),
            std::string::npos)
      << json;
}

TEST(ValidateTest, ARunWithoutIterationsAfterTheWarmUpHasNoFigures) {
  absl::StatusOr<LayoutResult> r = LayoutFigures(Job(), Trace(2), "", {}, /*warmup=*/2);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ValidateTest, RankingsLeaveOutFailedRuns) {
  std::vector<LayoutResult> rs(4);
  rs[0].layout = "a";
  rs[0].predicted_s = 2.0;
  rs[0].measured_s = 2.2;
  rs[1].layout = "b";
  rs[1].predicted_s = 1.0;
  rs[1].measured_s = 1.5;
  rs[2].layout = "c";
  rs[2].predicted_s = 1.5;
  rs[2].measured_s = 1.2;
  rs[3].layout = "d \"quoted\"";
  rs[3].error = "loom up ended with exit 1\t";
  EXPECT_EQ(RankingJson(rs),
            "{\"ranking_predicted\":[\"b\",\"c\",\"a\"],\"ranking_measured\":[\"c\",\"b\",\"a\"],"
            "\"same_fastest\":false,\"largest_error\":0.3333,\"layouts\":4,\"measured\":3}");
  EXPECT_EQ(LayoutJson(rs[3]),
            "{\"layout\":\"d \\\"quoted\\\"\",\"error\":\"loom up ended with exit 1\\u0009\"}");
}

}  // namespace
}  // namespace loom::sched
