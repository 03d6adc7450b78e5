#include "kernels/attention/attention.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gradcheck.h"

namespace loom::kernels {
namespace {

using loom::testing::AllClose;
using loom::testing::CheckGradient;
using loom::testing::kFastVsReferenceF32;
using loom::testing::RandomVector;
using loom::testing::WeightedSum;

struct Case {
  std::vector<int32_t> cu;  // cu_seqlens
  int NH, HD;
  bool causal;
  const char* name;
};

class AttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionTest, BlasMatchesReferenceForwardAndBackward) {
  const Case& c = GetParam();
  const int S = static_cast<int>(c.cu.size()) - 1, T = c.cu.back(), C = c.NH * c.HD;
  auto qkv = RandomVector(static_cast<size_t>(T) * 3 * C, 1);
  const int64_t na = attention_att_size(c.cu.data(), S, c.NH);
  std::vector<float> out_r(T * C), out_f(T * C), att_r(na), att_f(na);
  attention_forward_reference(out_r.data(), att_r.data(), qkv.data(), c.cu.data(), S, c.NH, c.HD,
                              c.causal);
  attention_forward(out_f.data(), att_f.data(), qkv.data(), c.cu.data(), S, c.NH, c.HD, c.causal);
  EXPECT_TRUE(AllClose(out_f.data(), out_r.data(), out_r.size(), kFastVsReferenceF32));
  EXPECT_TRUE(AllClose(att_f.data(), att_r.data(), att_r.size(), kFastVsReferenceF32));

  auto dout = RandomVector(static_cast<size_t>(T) * C, 2);
  auto d0 = RandomVector(qkv.size(), 3);  // backward must accumulate
  auto dr = d0, df = d0;
  attention_backward_reference(dr.data(), dout.data(), qkv.data(), att_r.data(), c.cu.data(), S,
                               c.NH, c.HD, c.causal);
  attention_backward(df.data(), dout.data(), qkv.data(), att_f.data(), c.cu.data(), S, c.NH, c.HD,
                     c.causal);
  EXPECT_TRUE(AllClose(df.data(), dr.data(), dr.size(), kFastVsReferenceF32));
}

TEST_P(AttentionTest, ReferenceBackwardMatchesFiniteDifferences) {
  const Case& c = GetParam();
  const int S = static_cast<int>(c.cu.size()) - 1, T = c.cu.back(), C = c.NH * c.HD;
  auto qkv = RandomVector(static_cast<size_t>(T) * 3 * C, 4);
  auto g = RandomVector(static_cast<size_t>(T) * C, 5);
  std::vector<float> out(T * C), att(attention_att_size(c.cu.data(), S, c.NH));
  auto loss = [&] {
    attention_forward_reference(out.data(), att.data(), qkv.data(), c.cu.data(), S, c.NH, c.HD,
                                c.causal);
    return WeightedSum(out, g);
  };
  loss();
  std::vector<float> dqkv(qkv.size(), 0.0f);
  attention_backward_reference(dqkv.data(), g.data(), qkv.data(), att.data(), c.cu.data(), S, c.NH,
                               c.HD, c.causal);
  EXPECT_TRUE(CheckGradient(loss, qkv.data(), dqkv.data(), qkv.size(), /*max_checks=*/200));
}

TEST(AttentionTest, SequencesDoNotSeeEachOther) {
  // Two packed sequences: changing the second must not change the first's output.
  const std::vector<int32_t> cu = {0, 3, 7};
  const int NH = 2, HD = 4, C = 8;
  auto qkv = RandomVector(7 * 3 * C, 6);
  std::vector<float> a(7 * C), b(7 * C), att(attention_att_size(cu.data(), 2, NH));
  attention_forward(a.data(), att.data(), qkv.data(), cu.data(), 2, NH, HD, /*causal=*/false);
  for (size_t i = 3 * 3 * C; i < qkv.size(); ++i) qkv[i] += 1.0f;
  attention_forward(b.data(), att.data(), qkv.data(), cu.data(), 2, NH, HD, /*causal=*/false);
  for (int i = 0; i < 3 * C; ++i) EXPECT_EQ(a[i], b[i]) << i;
}

TEST(AttentionTest, CausalRowsIgnoreTheFuture) {
  const std::vector<int32_t> cu = {0, 5};
  const int NH = 1, HD = 4, C = 4;
  auto qkv = RandomVector(5 * 3 * C, 7);
  std::vector<float> a(5 * C), b(5 * C), att(attention_att_size(cu.data(), 1, NH));
  attention_forward(a.data(), att.data(), qkv.data(), cu.data(), 1, NH, HD, /*causal=*/true);
  for (size_t i = 4 * 3 * C; i < qkv.size(); ++i) qkv[i] -= 2.0f;  // change the last row only
  attention_forward(b.data(), att.data(), qkv.data(), cu.data(), 1, NH, HD, /*causal=*/true);
  for (int i = 0; i < 4 * C; ++i) EXPECT_EQ(a[i], b[i]) << i;
  // The first row attends only to itself: its output is its own v.
  for (int d = 0; d < HD; ++d) EXPECT_FLOAT_EQ(b[d], qkv[2 * C + d]);
}

INSTANTIATE_TEST_SUITE_P(Packs, AttentionTest,
                         ::testing::Values(Case{{0, 4}, 1, 4, false, "OneFull"},
                                           Case{{0, 4}, 2, 3, true, "OneCausal"},
                                           Case{{0, 3, 8, 9, 15}, 2, 4, false, "FourFull"},
                                           Case{{0, 3, 8, 9, 15}, 3, 2, true, "FourCausal"},
                                           Case{{0, 0, 5}, 2, 4, true, "WithEmpty"}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace loom::kernels
