#include "runtime/base/trace.h"

#include <cstdlib>
#include <string>

#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "runtime/base/file.h"

namespace loom::trace {
namespace {

std::string TempDir(const std::string& name) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  EXPECT_TRUE(MakeDirectories(dir).ok());
  return dir;
}

// Measured lines stay as written; each predicted iteration moves to where
// the measured one started; an iteration never measured is left out.
TEST(TraceTest, MergeAlignsPredictedIterationsWithMeasuredOnes) {
  const std::string dir = TempDir("merge");
  v1::TraceFile worker;
  NameTrack(&worker, kMeasuredPid, 7, "llm rank 7");
  AddSpan(&worker, "F0", "forward", kMeasuredPid, 7, 1500, 1600, 3);
  AddSpan(&worker, "B0", "backward", kMeasuredPid, 7, 1000, 1400, 3);  // earliest of iteration 3
  ASSERT_TRUE(AppendLine(dir + "/llm-7.jsonl", worker).ok());
  v1::TraceFile sim;
  AddSpan(&sim, "F0", "forward", kPredictedPid, 1, 10, 60, 3);
  AddSpan(&sim, "F0", "forward", kPredictedPid, 1, 0, 50, 9);
  ASSERT_TRUE(AppendLine(dir + "/predicted.jsonl", sim).ok());
  const std::string out = dir + "/trace.json";
  ASSERT_TRUE(MergeTrace(dir, out).ok());

  absl::StatusOr<std::string> json = ReadFile(out);
  ASSERT_TRUE(json.ok());
  EXPECT_NE(json->find("\"traceEvents\""), std::string::npos);
  v1::TraceFile merged;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(*json, &merged).ok());
  int measured = 0, predicted = 0, names = 0;
  for (const v1::TraceEvent& e : merged.trace_events()) {
    if (e.ph() == "M") {
      ++names;
      continue;
    }
    if (e.pid() == kMeasuredPid) ++measured;
    if (e.pid() == kPredictedPid) {
      ++predicted;
      EXPECT_EQ(e.args().at("iteration"), "3");
      EXPECT_DOUBLE_EQ(e.ts(), 1010);
      EXPECT_DOUBLE_EQ(e.dur(), 50);
    }
  }
  EXPECT_EQ(measured, 2);
  EXPECT_EQ(predicted, 1);
  EXPECT_EQ(names, 3);  // one track, two processes
}

TEST(TraceTest, ABadLineIsNamed) {
  const std::string dir = TempDir("bad");
  ASSERT_TRUE(
      WriteFileAtomically(dir + "/encoder-0.jsonl", "{\"traceEvents\":[]}\nnot json\n").ok());
  absl::Status s = MergeTrace(dir, dir + "/trace.json");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("encoder-0.jsonl line 2"), std::string::npos) << s;
  EXPECT_FALSE(MergeTrace(dir + "/missing", dir + "/trace.json").ok());
}

}  // namespace
}  // namespace loom::trace
