#include "runtime/data/tokenizer.h"

#include "gtest/gtest.h"
#include "runtime/data/data_testing.h"
#include "runtime/data/datagen.h"

namespace loom::data {
namespace {

TEST(TokenizerTest, ReservedIdsAndVocabularyFitTheTinyModel) {
  const Tokenizer& t = testing::TestTokenizer();
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.pad_id(), 3);
  EXPECT_EQ(t.image_id(), 4);
  EXPECT_LE(t.vocab_size(), 256);
  EXPECT_GT(t.vocab_size(), 100) << "BPE merges were learned";
}

TEST(TokenizerTest, RoundTripsAndCompresses) {
  const Tokenizer& t = testing::TestTokenizer();
  const std::string text = "a picture of two red circles in the top left.";
  std::vector<int32_t> ids;
  ASSERT_TRUE(t.Encode(text, &ids).ok());
  EXPECT_EQ(t.Decode(ids), text);
  EXPECT_LT(ids.size(), text.size() / 2) << "generated text should compress well";
  for (int32_t id : ids) {
    EXPECT_GT(id, 4) << "no special id in ordinary text";
    EXPECT_LT(id, t.vocab_size());
  }
  // Text outside the training alphabet still encodes (unknown pieces).
  ids.clear();
  ASSERT_TRUE(t.Encode("Zürich 東京", &ids).ok());
  EXPECT_FALSE(ids.empty());
}

TEST(TokenizerTest, TrainingIsDeterministicAndRejectsTinyVocabularies) {
  const std::vector<std::string> texts = GenerateTexts(7, 300);
  absl::StatusOr<std::string> a = TrainTokenizer(texts, 128);
  absl::StatusOr<std::string> b = TrainTokenizer(texts, 128);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, *b);
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromSerialized(*a);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_LE((*t)->vocab_size(), 128);
  EXPECT_EQ(TrainTokenizer(texts, 8).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::FromSerialized("not a model").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::data
