#include "runtime/checkpoint/checkpoint.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "runtime/base/test_paths.h"

namespace loom {
namespace {

ParamSet Make(int extra = 0) {
  ParamSet p;
  p.Add("a.weight", {3, 4}, Init::kNormal, 0.5f);
  p.Add("a.bias", {4 + extra}, Init::kOnes);
  p.Finalize();
  p.Initialize(3);
  return p;
}

TEST(CheckpointTest, RoundTripsWeightsOptimizerStateAndStep) {
  ParamSet a = Make();
  for (size_t i = 0; i < a.adam_m().size(); ++i) {
    a.adam_m()[i] = 0.1f * i;
    a.adam_v()[i] = 0.2f * i;
  }
  a.step() = 17;
  const std::string path = testing::TempPath("rt.ckpt");
  ASSERT_TRUE(SaveModuleCheckpoint(a, "encoder", path).ok());
  ParamSet b = Make();
  b.Initialize(99);  // different weights, to be overwritten
  absl::Status s = LoadModuleCheckpoint(path, "encoder", &b);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(b.data(), a.data());
  EXPECT_EQ(b.adam_m(), a.adam_m());
  EXPECT_EQ(b.adam_v(), a.adam_v());
  EXPECT_EQ(b.step(), 17);
  std::ifstream tmp(path + ".tmp");
  EXPECT_FALSE(tmp.good()) << "temp file left behind";
}

TEST(CheckpointTest, RejectsTheWrongModuleOrShapeNamingIt) {
  ParamSet a = Make();
  const std::string path = testing::TempPath("m.ckpt");
  ASSERT_TRUE(SaveModuleCheckpoint(a, "encoder", path).ok());
  ParamSet b = Make();
  absl::Status s = LoadModuleCheckpoint(path, "llm", &b);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'encoder'"), absl::string_view::npos) << s;
  ParamSet c = Make(/*extra=*/1);
  s = LoadModuleCheckpoint(path, "encoder", &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("a.bias"), absl::string_view::npos) << s;
}

TEST(CheckpointTest, DetectsCorruptionAndTruncation) {
  ParamSet a = Make();
  const std::string path = testing::TempPath("c.ckpt");
  ASSERT_TRUE(SaveModuleCheckpoint(a, "encoder", path).ok());
  std::stringstream ss;
  ss << std::ifstream(path, std::ios::binary).rdbuf();
  std::string bytes = ss.str();

  std::string flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x40;
  std::ofstream(testing::TempPath("flip.ckpt"), std::ios::binary) << flipped;
  ParamSet b = Make();
  EXPECT_EQ(LoadModuleCheckpoint(testing::TempPath("flip.ckpt"), "encoder", &b).code(),
            absl::StatusCode::kDataLoss);

  std::ofstream(testing::TempPath("short.ckpt"), std::ios::binary)
      << bytes.substr(0, bytes.size() / 3);
  EXPECT_EQ(LoadModuleCheckpoint(testing::TempPath("short.ckpt"), "encoder", &b).code(),
            absl::StatusCode::kDataLoss);
  std::ofstream(testing::TempPath("empty.ckpt"), std::ios::binary) << "";
  EXPECT_EQ(LoadModuleCheckpoint(testing::TempPath("empty.ckpt"), "encoder", &b).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(LoadModuleCheckpoint(testing::TempPath("missing.ckpt"), "encoder", &b).code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace loom
