#include "services/scheduler/step_log.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "loom/tensorboard/v1/event.pb.h"
#include "runtime/base/file.h"
#include "runtime/base/json_line.h"
#include "runtime/base/test_paths.h"
#include "runtime/base/tfrecord.h"

namespace loom {
namespace {

scheduler::v1::StepReport Step(int64_t iteration, double loss, bool skipped = false) {
  scheduler::v1::StepReport r;
  r.set_iteration(iteration);
  r.set_loss(loss);
  r.set_grad_norm(0.5 + iteration);
  r.set_lr(1e-3 * (iteration + 1));
  r.set_samples(16);
  r.set_tokens(4000);
  r.set_loss_tokens(1000);
  r.set_seconds(0.25);
  r.set_skipped(skipped);
  return r;
}

// Three steps (the last skipped, its loss NaN) land as JSON lines and as
// TensorBoard events that read back with their CRCs, each scalar at step
// iteration + 1; a second log on the same folder continues metrics.jsonl
// and starts an events file of its own.
TEST(StepLogTest, StepsGoToJsonLinesAndTensorBoard) {
  const std::string dir = testing::TempPath("steplog");
  std::filesystem::remove_all(dir);
  const absl::Time t0 = absl::FromUnixSeconds(1700000000);
  std::string events_path;
  {
    absl::StatusOr<std::unique_ptr<StepLog>> log = StepLog::Open(dir, "job-1", /*fresh=*/true);
    ASSERT_TRUE(log.ok()) << log.status();
    ASSERT_TRUE((*log)->Append(Step(0, 4.5), t0).ok());
    ASSERT_TRUE((*log)->Append(Step(1, 4.25), t0 + absl::Seconds(1)).ok());
    ASSERT_TRUE((*log)->Append(Step(2, std::nan(""), true), t0 + absl::Seconds(2)).ok());
    events_path = (*log)->events_path();
  }
  absl::StatusOr<std::string> text = ReadFile(dir + "/metrics.jsonl");
  ASSERT_TRUE(text.ok());
  std::vector<std::string> lines = absl::StrSplit(*text, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  double v = 0;
  ASSERT_TRUE(JsonNumberField(lines[1], "step", &v));
  EXPECT_EQ(v, 2);
  ASSERT_TRUE(JsonNumberField(lines[1], "loss", &v));
  EXPECT_EQ(v, 4.25);
  ASSERT_TRUE(JsonNumberField(lines[1], "tokens_per_second", &v));
  EXPECT_EQ(v, 16000);
  ASSERT_TRUE(JsonNumberField(lines[1], "time", &v));
  EXPECT_EQ(v, 1700000001);
  EXPECT_NE(lines[2].find("\"loss\":null"), std::string::npos) << lines[2];
  EXPECT_NE(lines[2].find("\"skipped\":true"), std::string::npos) << lines[2];

  absl::StatusOr<std::vector<std::string>> records = ReadTfRecords(events_path);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 4u);
  tensorboard::v1::Event first;
  ASSERT_TRUE(first.ParseFromString((*records)[0]));
  EXPECT_EQ(first.file_version(), "brain.Event:2");
  for (int i = 1; i < 4; ++i) {
    tensorboard::v1::Event e;
    ASSERT_TRUE(e.ParseFromString((*records)[i]));
    EXPECT_EQ(e.step(), i);
    EXPECT_EQ(e.wall_time(), 1700000000 + i - 1);
    std::map<std::string, float> scalars;
    for (const auto& value : e.summary().value()) scalars[value.tag()] = value.simple_value();
    EXPECT_EQ(scalars.size(), 7u);
    EXPECT_FLOAT_EQ(scalars["train/grad_norm"], 0.5f + (i - 1));
    EXPECT_FLOAT_EQ(scalars["train/lr"], 1e-3f * i);
    EXPECT_FLOAT_EQ(scalars["train/tokens_per_second"], 16000.0f);
    if (i < 3) {
      EXPECT_FLOAT_EQ(scalars["train/loss"], i == 1 ? 4.5f : 4.25f);
    } else {
      EXPECT_TRUE(std::isnan(scalars["train/loss"]));
    }
  }

  EXPECT_EQ(events_path.rfind(dir + "/tensorboard/job-1/events.out.tfevents.", 0), 0u)
      << events_path;
  // The same run again (a resume): metrics.jsonl goes on, a new events file.
  absl::StatusOr<std::unique_ptr<StepLog>> again = StepLog::Open(dir, "job-1", /*fresh=*/false);
  ASSERT_TRUE(again.ok());
  // A model with a generator: its loss and output images go along.
  scheduler::v1::StepReport gen = Step(3, 4.0);
  gen.set_generation_loss(1.25);
  gen.set_output_images(7);
  ASSERT_TRUE((*again)->Append(gen, t0 + absl::Seconds(3)).ok());
  text = ReadFile(dir + "/metrics.jsonl");
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(*text, '\n', absl::SkipEmpty())).size(), 4u);
  EXPECT_NE((*again)->events_path(), events_path);
  EXPECT_EQ(ReadTfRecords(events_path)->size(), 4u) << "the first process's file is left alone";
  const std::vector<std::string> all = absl::StrSplit(*text, '\n', absl::SkipEmpty());
  ASSERT_TRUE(JsonNumberField(all[3], "generation_loss", &v)) << all[3];
  EXPECT_EQ(v, 1.25);
  ASSERT_TRUE(JsonNumberField(all[3], "output_images", &v)) << all[3];
  EXPECT_EQ(v, 7);
  EXPECT_EQ(lines[1].find("generation_loss"), std::string::npos) << "no generator, no field";
  absl::StatusOr<std::vector<std::string>> resumed = ReadTfRecords((*again)->events_path());
  ASSERT_TRUE(resumed.ok() && resumed->size() == 2u);
  tensorboard::v1::Event e;
  ASSERT_TRUE(e.ParseFromString((*resumed)[1]));
  std::map<std::string, float> scalars;
  for (const auto& value : e.summary().value()) scalars[value.tag()] = value.simple_value();
  EXPECT_FLOAT_EQ(scalars["train/generation_loss"], 1.25f);
  // A new job: metrics.jsonl starts over, its events in a run folder of its own.
  absl::StatusOr<std::unique_ptr<StepLog>> next = StepLog::Open(dir, "job-2", /*fresh=*/true);
  ASSERT_TRUE(next.ok());
  ASSERT_TRUE((*next)->Append(Step(0, 5.0), t0 + absl::Seconds(4)).ok());
  text = ReadFile(dir + "/metrics.jsonl");
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(*text, '\n', absl::SkipEmpty())).size(), 1u);
  EXPECT_EQ((*next)->events_path().rfind(dir + "/tensorboard/job-2/", 0), 0u);
}

TEST(StepLogTest, AFolderThatCannotBeMadeIsNamed) {
  const std::string file = testing::TempPath("steplog-file");
  ASSERT_TRUE(WriteFileAtomically(file, "x").ok());
  absl::Status s = StepLog::Open(file + "/run", "job-1", true).status();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(file), std::string::npos) << s;
}

}  // namespace
}  // namespace loom
