#include "kernels/attention/attention.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/matmul/bf16.h"
#include "kernels/testing/gradcheck.h"

namespace loom::kernels {
namespace {

using loom::testing::AllClose;
using loom::testing::CheckGradient;
using loom::testing::kBf16VsFp32Model;
using loom::testing::kFastVsReferenceF32;
using loom::testing::RandomVector;
using loom::testing::WeightedSum;

struct Case {
  std::vector<int32_t> cu;  // cu_seqlens
  int NH, NKV, HD;
  bool causal;
  const char* name;
};

class AttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionTest, BlasMatchesReferenceForwardAndBackward) {
  const Case& c = GetParam();
  const int S = static_cast<int>(c.cu.size()) - 1, T = c.cu.back(), C = c.NH * c.HD,
            W = (c.NH + 2 * c.NKV) * c.HD;
  auto qkv = RandomVector(static_cast<size_t>(T) * W, 1);
  const int64_t na = attention_att_size(c.cu.data(), S, c.NH);
  std::vector<float> out_r(T * C), out_f(T * C), att_r(na), att_f(na);
  attention_forward_reference(out_r.data(), att_r.data(), qkv.data(), c.cu.data(), S, c.NH, c.NKV,
                              c.HD, c.causal);
  attention_forward(out_f.data(), att_f.data(), qkv.data(), c.cu.data(), S, c.NH, c.NKV, c.HD,
                    c.causal);
  EXPECT_TRUE(AllClose(out_f.data(), out_r.data(), out_r.size(), kFastVsReferenceF32));
  EXPECT_TRUE(AllClose(att_f.data(), att_r.data(), att_r.size(), kFastVsReferenceF32));

  auto dout = RandomVector(static_cast<size_t>(T) * C, 2);
  auto d0 = RandomVector(qkv.size(), 3);  // backward must accumulate
  auto dr = d0, df = d0;
  attention_backward_reference(dr.data(), dout.data(), qkv.data(), att_r.data(), c.cu.data(), S,
                               c.NH, c.NKV, c.HD, c.causal);
  attention_backward(df.data(), dout.data(), qkv.data(), att_f.data(), c.cu.data(), S, c.NH, c.NKV,
                     c.HD, c.causal);
  EXPECT_TRUE(AllClose(df.data(), dr.data(), dr.size(), kFastVsReferenceF32));
}

// The memory-efficient kernels compute the same function as the standard
// ones (out, dqkv), and lse is each row's log-sum-exp of its scores, taken
// here in double.
TEST_P(AttentionTest, FlashMatchesTheStandardKernels) {
  const Case& c = GetParam();
  const int S = static_cast<int>(c.cu.size()) - 1, T = c.cu.back(), C = c.NH * c.HD,
            W = (c.NH + 2 * c.NKV) * c.HD;
  auto qkv = RandomVector(static_cast<size_t>(T) * W, 6);
  std::vector<float> out_s(T * C), att(attention_att_size(c.cu.data(), S, c.NH));
  std::vector<float> out_f(T * C, NAN), lse(static_cast<size_t>(T) * c.NH, NAN);
  attention_forward(out_s.data(), att.data(), qkv.data(), c.cu.data(), S, c.NH, c.NKV, c.HD,
                    c.causal);
  flash_attention_forward(out_f.data(), lse.data(), qkv.data(), c.cu.data(), S, c.NH, c.NKV, c.HD,
                          c.causal);
  EXPECT_TRUE(AllClose(out_f.data(), out_s.data(), out_s.size(), kFastVsReferenceF32));
  std::vector<float> want_lse(lse.size());
  for (int s = 0; s < S; ++s) {
    for (int t = c.cu[s]; t < c.cu[s + 1]; ++t) {
      for (int h = 0; h < c.NH; ++h) {
        const float* q = qkv.data() + static_cast<int64_t>(t) * W + h * c.HD;
        const int kv = h / (c.NH / c.NKV);
        double sum = 0;
        for (int j = c.cu[s]; j <= (c.causal ? t : c.cu[s + 1] - 1); ++j) {
          const float* k = qkv.data() + static_cast<int64_t>(j) * W + (c.NH + kv) * c.HD;
          double dot = 0;
          for (int e = 0; e < c.HD; ++e) dot += static_cast<double>(q[e]) * k[e];
          sum += std::exp(dot / std::sqrt(static_cast<double>(c.HD)));
        }
        want_lse[static_cast<size_t>(t) * c.NH + h] = static_cast<float>(std::log(sum));
      }
    }
  }
  EXPECT_TRUE(AllClose(lse.data(), want_lse.data(), lse.size(), kFastVsReferenceF32));

  auto dout = RandomVector(static_cast<size_t>(T) * C, 7);
  auto d0 = RandomVector(qkv.size(), 8);  // backward must accumulate
  auto ds = d0, df = d0;
  attention_backward(ds.data(), dout.data(), qkv.data(), att.data(), c.cu.data(), S, c.NH, c.NKV,
                     c.HD, c.causal);
  flash_attention_backward(df.data(), dout.data(), qkv.data(), out_f.data(), lse.data(),
                           c.cu.data(), S, c.NH, c.NKV, c.HD, c.causal);
  EXPECT_TRUE(AllClose(df.data(), ds.data(), ds.size(), kFastVsReferenceF32));
}

TEST_P(AttentionTest, ReferenceBackwardMatchesFiniteDifferences) {
  const Case& c = GetParam();
  const int S = static_cast<int>(c.cu.size()) - 1, T = c.cu.back(), C = c.NH * c.HD,
            W = (c.NH + 2 * c.NKV) * c.HD;
  auto qkv = RandomVector(static_cast<size_t>(T) * W, 4);
  auto g = RandomVector(static_cast<size_t>(T) * C, 5);
  std::vector<float> out(T * C), att(attention_att_size(c.cu.data(), S, c.NH));
  auto loss = [&] {
    attention_forward_reference(out.data(), att.data(), qkv.data(), c.cu.data(), S, c.NH, c.NKV,
                                c.HD, c.causal);
    return WeightedSum(out, g);
  };
  loss();
  std::vector<float> dqkv(qkv.size(), 0.0f);
  attention_backward_reference(dqkv.data(), g.data(), qkv.data(), att.data(), c.cu.data(), S, c.NH,
                               c.NKV, c.HD, c.causal);
  EXPECT_TRUE(CheckGradient(loss, qkv.data(), dqkv.data(), qkv.size(), /*max_checks=*/200));
}

TEST(AttentionTest, SequencesDoNotSeeEachOther) {
  // Two packed sequences: changing the second must not change the first's output.
  const std::vector<int32_t> cu = {0, 3, 7};
  const int NH = 2, HD = 4, C = 8;
  auto qkv = RandomVector(7 * 3 * C, 6);
  std::vector<float> a(7 * C), b(7 * C), att(attention_att_size(cu.data(), 2, NH));
  attention_forward(a.data(), att.data(), qkv.data(), cu.data(), 2, NH, NH, HD, /*causal=*/false);
  for (size_t i = 3 * 3 * C; i < qkv.size(); ++i) qkv[i] += 1.0f;
  attention_forward(b.data(), att.data(), qkv.data(), cu.data(), 2, NH, NH, HD, /*causal=*/false);
  for (int i = 0; i < 3 * C; ++i) EXPECT_EQ(a[i], b[i]) << i;
}

TEST(AttentionTest, CausalRowsIgnoreTheFuture) {
  const std::vector<int32_t> cu = {0, 5};
  const int NH = 1, HD = 4, C = 4;
  auto qkv = RandomVector(5 * 3 * C, 7);
  std::vector<float> a(5 * C), b(5 * C), att(attention_att_size(cu.data(), 1, NH));
  attention_forward(a.data(), att.data(), qkv.data(), cu.data(), 1, NH, NH, HD, /*causal=*/true);
  for (size_t i = 4 * 3 * C; i < qkv.size(); ++i) qkv[i] -= 2.0f;  // change the last row only
  attention_forward(b.data(), att.data(), qkv.data(), cu.data(), 1, NH, NH, HD, /*causal=*/true);
  for (int i = 0; i < 4 * C; ++i) EXPECT_EQ(a[i], b[i]) << i;
  // The first row attends only to itself: its output is its own v.
  for (int d = 0; d < HD; ++d) EXPECT_FLOAT_EQ(b[d], qkv[2 * C + d]);
}

TEST(AttentionTest, GroupedQueryEqualsMultiHeadWithSharedKeysAndValues) {
  // NH 4 query heads over NKV 2 key/value heads = multi-head attention whose
  // heads 0,1 share k/v head 0 and heads 2,3 share k/v head 1; the gradient
  // of a shared k/v head is the sum over its query heads.
  const std::vector<int32_t> cu = {0, 4, 9};
  const int NH = 4, NKV = 2, HD = 3, T = 9, W = (NH + 2 * NKV) * HD, Wm = 3 * NH * HD;
  auto gqa = RandomVector(T * W, 8), g = RandomVector(T * NH * HD, 9);
  std::vector<float> mha(T * Wm);
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < NH; ++h) {
      for (int d = 0; d < HD; ++d) {
        mha[t * Wm + h * HD + d] = gqa[t * W + h * HD + d];
        mha[t * Wm + (NH + h) * HD + d] = gqa[t * W + (NH + h / 2) * HD + d];
        mha[t * Wm + (2 * NH + h) * HD + d] = gqa[t * W + (NH + NKV + h / 2) * HD + d];
      }
    }
  }
  const int64_t na = attention_att_size(cu.data(), 2, NH);
  std::vector<float> o1(T * NH * HD), o2(T * NH * HD), a1(na), a2(na);
  attention_forward(o1.data(), a1.data(), gqa.data(), cu.data(), 2, NH, NKV, HD, true);
  attention_forward(o2.data(), a2.data(), mha.data(), cu.data(), 2, NH, NH, HD, true);
  EXPECT_TRUE(AllClose(o1.data(), o2.data(), o1.size(), kFastVsReferenceF32));
  std::vector<float> d1(gqa.size(), 0.0f), d2(mha.size(), 0.0f);
  attention_backward(d1.data(), g.data(), gqa.data(), a1.data(), cu.data(), 2, NH, NKV, HD, true);
  attention_backward(d2.data(), g.data(), mha.data(), a2.data(), cu.data(), 2, NH, NH, HD, true);
  std::vector<float> folded(gqa.size(), 0.0f);
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < NH; ++h) {
      for (int d = 0; d < HD; ++d) {
        folded[t * W + h * HD + d] += d2[t * Wm + h * HD + d];
        folded[t * W + (NH + h / 2) * HD + d] += d2[t * Wm + (NH + h) * HD + d];
        folded[t * W + (NH + NKV + h / 2) * HD + d] += d2[t * Wm + (2 * NH + h) * HD + d];
      }
    }
  }
  EXPECT_TRUE(AllClose(d1.data(), folded.data(), d1.size(), kFastVsReferenceF32));
}

// ‖a − b‖ / ‖b‖ over n values.
double RelativeNorm(const float* a, const float* b, size_t n) {
  double d = 0, w = 0;
  for (size_t i = 0; i < n; ++i) {
    d += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    w += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(d / w);
}

// bf16 mixed precision's attention (the tensor cores' rounding of P, dO and
// dS) computes the fp32 function of the same bf16 qkv to bf16's precision,
// and does round: it is not the fp32 result.
TEST_P(AttentionTest, Bf16RoundsAtItsPointsAndStaysNearFp32) {
  const Case& c = GetParam();
  const int S = static_cast<int>(c.cu.size()) - 1, T = c.cu.back(), C = c.NH * c.HD,
            W = (c.NH + 2 * c.NKV) * c.HD;
  if (T == 0) return;
  auto qkv = RandomVector(static_cast<size_t>(T) * W, 9);
  RoundToBf16(qkv.data(), static_cast<int64_t>(qkv.size()));
  std::vector<float> out32(T * C), out16(T * C), lse32(static_cast<size_t>(T) * c.NH),
      lse16(lse32.size());
  flash_attention_forward(out32.data(), lse32.data(), qkv.data(), c.cu.data(), S, c.NH, c.NKV, c.HD,
                          c.causal, /*bf16=*/false);
  flash_attention_forward(out16.data(), lse16.data(), qkv.data(), c.cu.data(), S, c.NH, c.NKV, c.HD,
                          c.causal, /*bf16=*/true);
  EXPECT_EQ(lse16, lse32);  // the softmax's statistics stay fp32
  const double out_diff = RelativeNorm(out16.data(), out32.data(), out32.size());
  EXPECT_GT(out_diff, 0.0);
  EXPECT_LT(out_diff, kBf16VsFp32Model.rtol);
  auto dout = RandomVector(static_cast<size_t>(T) * C, 10);
  std::vector<float> d32(qkv.size(), 0.0f), d16(qkv.size(), 0.0f);
  flash_attention_backward(d32.data(), dout.data(), qkv.data(), out32.data(), lse32.data(),
                           c.cu.data(), S, c.NH, c.NKV, c.HD, c.causal, /*bf16=*/false);
  flash_attention_backward(d16.data(), dout.data(), qkv.data(), out32.data(), lse32.data(),
                           c.cu.data(), S, c.NH, c.NKV, c.HD, c.causal, /*bf16=*/true);
  const double grad_diff = RelativeNorm(d16.data(), d32.data(), d32.size());
  EXPECT_GT(grad_diff, 0.0);
  EXPECT_LT(grad_diff, kBf16VsFp32Model.rtol);
}

INSTANTIATE_TEST_SUITE_P(Packs, AttentionTest,
                         ::testing::Values(Case{{0, 4}, 1, 1, 4, false, "OneFull"},
                                           Case{{0, 4}, 2, 2, 3, true, "OneCausal"},
                                           Case{{0, 3, 8, 9, 15}, 2, 2, 4, false, "FourFull"},
                                           Case{{0, 3, 8, 9, 15}, 3, 3, 2, true, "FourCausal"},
                                           Case{{0, 0, 5}, 2, 2, 4, true, "WithEmpty"},
                                           Case{{0, 3, 8, 9, 15}, 4, 2, 4, true, "GqaCausal"},
                                           Case{{0, 6, 11}, 6, 1, 2, false, "MqaFull"},
                                           // Longer than kFlashBlock: several blocks
                                           // each way, lengths not multiples of it.
                                           Case{{0, 150, 230}, 4, 2, 8, true, "LongGqaCausal"},
                                           Case{{0, 70, 200}, 2, 2, 16, false, "LongFull"}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace loom::kernels
