#include "runtime/data/shard.h"

#include <cstdio>
#include <fstream>

#include "gtest/gtest.h"
#include "runtime/base/test_paths.h"
#include "runtime/data/data_testing.h"

namespace loom::data {
namespace {

// 3000 bytes: larger than a tar block, so a cut can land inside it.
std::string Payload() {
  std::string p(3000, '\0');
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<char>(i * 7);
  return p;
}

std::vector<TarMember> ThreeSamples() {
  std::vector<TarMember> m;
  for (const char* key : {"a/s0", "a/s1", "a/s2"}) {
    for (TarMember& t : testing::SampleMembers(key, "<image> text", {{"0.png", Payload()}})) {
      m.push_back(std::move(t));
    }
  }
  return m;
}

TEST(ShardTest, SplitsWebDatasetNames) {
  std::string key, ext;
  ASSERT_TRUE(SplitMemberName("dir/abc.0.png", &key, &ext));
  EXPECT_EQ(key, "dir/abc");
  EXPECT_EQ(ext, "0.png");
  ASSERT_TRUE(SplitMemberName("x.y.z/k.json", &key, &ext));
  EXPECT_EQ(key, "x.y.z/k");
  EXPECT_FALSE(SplitMemberName("noext", &key, &ext));
  EXPECT_FALSE(SplitMemberName("dir/.hidden", &key, &ext));
  EXPECT_FALSE(SplitMemberName("trailing.", &key, &ext));
}

TEST(ShardTest, IndexThenReadEachSampleAtItsOffset) {
  const std::string path = loom::testing::TempPath("three.tar");
  ASSERT_TRUE(WriteTar(path, ThreeSamples()).ok());
  absl::StatusOr<ShardIndex> index = IndexShard(path, ShardLimits{});
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_TRUE(index->error.empty()) << index->error;
  ASSERT_EQ(index->samples.size(), 3u);
  for (int i = 2; i >= 0; --i) {  // any order
    absl::StatusOr<SampleFiles> s = ReadSample(path, index->samples[i], ShardLimits{});
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->key, "a/s" + std::to_string(i));
    ASSERT_EQ(s->files.size(), 2u);
    EXPECT_EQ(s->files.at("0.png"), Payload());
  }
}

TEST(ShardTest, TruncatedTarKeepsEverySampleBeforeTheCut) {
  const std::string tar = *TarToMemory(ThreeSamples());
  const MemoryShard whole = ReadShardFromMemory(tar, ShardLimits{});
  ASSERT_EQ(whole.samples.size(), 3u);
  // Cut inside the last sample's image data.
  const std::string cut = tar.substr(0, tar.size() - 1024 - 2000);
  const MemoryShard part = ReadShardFromMemory(cut, ShardLimits{});
  EXPECT_FALSE(part.error.empty());
  ASSERT_EQ(part.samples.size(), 2u);
  EXPECT_EQ(part.samples[1].key, "a/s1");
  ASSERT_EQ(part.broken.size(), 1u);
  EXPECT_EQ(part.broken[0].key, "a/s2");
  EXPECT_EQ(part.broken[0].reason, "truncated_tar");

  // The same through the file index, and every indexed sample reads back.
  const std::string path = loom::testing::TempPath("cut.tar");
  std::ofstream(path, std::ios::binary) << cut;
  absl::StatusOr<ShardIndex> index = IndexShard(path, ShardLimits{});
  ASSERT_TRUE(index.ok());
  ASSERT_EQ(index->samples.size(), 2u);
  ASSERT_EQ(index->broken.size(), 1u);
  EXPECT_EQ(index->broken[0].reason, "truncated_tar");
  for (const SampleRef& ref : index->samples)
    EXPECT_TRUE(ReadSample(path, ref, ShardLimits{}).ok());
}

TEST(ShardTest, GarbageAndEmptyInputsDoNotCrash) {
  EXPECT_TRUE(ReadShardFromMemory("", ShardLimits{}).samples.empty());
  EXPECT_TRUE(ReadShardFromMemory(std::string(5000, 'x'), ShardLimits{}).samples.empty());
  const std::string path = loom::testing::TempPath("garbage.tar");
  std::ofstream(path, std::ios::binary) << std::string(3000, '\x7f');
  absl::StatusOr<ShardIndex> index = IndexShard(path, ShardLimits{});
  ASSERT_TRUE(index.ok());
  EXPECT_TRUE(index->samples.empty());
  EXPECT_FALSE(index->error.empty());
  EXPECT_EQ(IndexShard(loom::testing::TempPath("missing.tar"), ShardLimits{}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ShardTest, OversizedMemberIsRefusedWithoutReadingIt) {
  ShardLimits limits;
  limits.max_member_bytes = 1000;
  std::vector<TarMember> m =
      testing::SampleMembers("big", "<image> x", {{"0.png", std::string(5000, 'p')}});
  for (TarMember& t : testing::SampleMembers("ok", "fine", {})) m.push_back(t);
  const MemoryShard s = ReadShardFromMemory(*TarToMemory(m), limits);
  ASSERT_EQ(s.samples.size(), 1u);
  EXPECT_EQ(s.samples[0].key, "ok");
  ASSERT_EQ(s.broken.size(), 1u);
  EXPECT_EQ(s.broken[0].reason, "member_too_large");
}

TEST(ShardTest, SameMembersGiveTheSameBytes) {
  EXPECT_EQ(*TarToMemory(ThreeSamples()), *TarToMemory(ThreeSamples()));
}

}  // namespace
}  // namespace loom::data
