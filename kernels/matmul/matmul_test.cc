#include "kernels/matmul/matmul.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/matmul/bf16.h"
#include "kernels/testing/gradcheck.h"

namespace loom::kernels {
namespace {

using loom::testing::AllClose;
using loom::testing::CheckGradient;
using loom::testing::kFastVsReferenceF32;
using loom::testing::RandomVector;
using loom::testing::WeightedSum;

struct Dims {
  int M, K, N;
};

class MatmulTest : public ::testing::TestWithParam<Dims> {};

TEST(MatmulReferenceTest, MatchesAHandComputedProduct) {
  // inp (2,3), weight (2,3) -> out (2,2)
  const float inp[] = {1, 2, 3, 4, 5, 6};
  const float weight[] = {1, 0, -1, 2, 1, 0};
  const float bias[] = {0.5f, -1};
  float out[4];
  matmul_forward_reference(out, inp, weight, bias, 2, 3, 2);
  EXPECT_FLOAT_EQ(out[0], 1 - 3 + 0.5f);
  EXPECT_FLOAT_EQ(out[1], 2 + 2 - 1);
  EXPECT_FLOAT_EQ(out[2], 4 - 6 + 0.5f);
  EXPECT_FLOAT_EQ(out[3], 8 + 5 - 1);
}

TEST_P(MatmulTest, BlasForwardMatchesReference) {
  const auto [M, K, N] = GetParam();
  auto inp = RandomVector(M * K, 1), w = RandomVector(N * K, 2), b = RandomVector(N, 3);
  std::vector<float> want(M * N), got(M * N, 123.0f);
  for (const float* bias :
       {static_cast<const float*>(b.data()), static_cast<const float*>(nullptr)}) {
    matmul_forward_reference(want.data(), inp.data(), w.data(), bias, M, K, N);
    matmul_forward(got.data(), inp.data(), w.data(), bias, M, K, N);
    EXPECT_TRUE(AllClose(got.data(), want.data(), want.size(), kFastVsReferenceF32));
  }
}

TEST_P(MatmulTest, BlasBackwardMatchesReferenceAndAccumulates) {
  const auto [M, K, N] = GetParam();
  auto inp = RandomVector(M * K, 4), w = RandomVector(N * K, 5), dout = RandomVector(M * N, 6);
  // Start from non-zero gradients: backward must add, not overwrite.
  auto dinp0 = RandomVector(M * K, 7), dw0 = RandomVector(N * K, 8), db0 = RandomVector(N, 9);
  auto dinp_want = dinp0, dw_want = dw0, db_want = db0;
  auto dinp_got = dinp0, dw_got = dw0, db_got = db0;
  matmul_backward_reference(dinp_want.data(), dw_want.data(), db_want.data(), dout.data(),
                            inp.data(), w.data(), M, K, N);
  matmul_backward(dinp_got.data(), dw_got.data(), db_got.data(), dout.data(), inp.data(), w.data(),
                  M, K, N);
  EXPECT_TRUE(AllClose(dinp_got.data(), dinp_want.data(), dinp_want.size(), kFastVsReferenceF32));
  EXPECT_TRUE(AllClose(dw_got.data(), dw_want.data(), dw_want.size(), kFastVsReferenceF32));
  EXPECT_TRUE(AllClose(db_got.data(), db_want.data(), db_want.size(), kFastVsReferenceF32));
}

TEST_P(MatmulTest, ReferenceBackwardMatchesFiniteDifferences) {
  const auto [M, K, N] = GetParam();
  auto inp = RandomVector(M * K, 10), w = RandomVector(N * K, 11), b = RandomVector(N, 12);
  auto g = RandomVector(M * N, 13);  // L = sum(out * g), so dL/dout = g
  std::vector<float> out(M * N);
  auto loss = [&] {
    matmul_forward_reference(out.data(), inp.data(), w.data(), b.data(), M, K, N);
    return WeightedSum(out, g);
  };
  std::vector<float> dinp(M * K, 0.0f), dw(N * K, 0.0f), db(N, 0.0f);
  matmul_backward_reference(dinp.data(), dw.data(), db.data(), g.data(), inp.data(), w.data(), M, K,
                            N);
  EXPECT_TRUE(CheckGradient(loss, inp.data(), dinp.data(), inp.size()));
  EXPECT_TRUE(CheckGradient(loss, w.data(), dw.data(), w.size()));
  EXPECT_TRUE(CheckGradient(loss, b.data(), db.data(), b.size()));
}

TEST(MatmulTest, NullInputGradientIsSkipped) {
  const int M = 3, K = 4, N = 5;
  auto inp = RandomVector(M * K, 14), w = RandomVector(N * K, 15), dout = RandomVector(M * N, 16);
  std::vector<float> dw_a(N * K, 0.0f), dw_b(N * K, 0.0f);
  matmul_backward(nullptr, dw_a.data(), nullptr, dout.data(), inp.data(), w.data(), M, K, N);
  matmul_backward_reference(nullptr, dw_b.data(), nullptr, dout.data(), inp.data(), w.data(), M, K,
                            N);
  EXPECT_TRUE(AllClose(dw_a.data(), dw_b.data(), dw_a.size(), kFastVsReferenceF32));
}

// A frozen weight: no weight gradient, the input gradient exactly as with one.
TEST(MatmulTest, NullWeightGradientGivesTheSameInputGradient) {
  const int M = 4, K = 6, N = 3;
  auto inp = RandomVector(M * K, 17), w = RandomVector(N * K, 18), dout = RandomVector(M * N, 19);
  std::vector<float> dx_a(M * K, 0.0f), dx_b(M * K, 0.0f), dw(N * K, 0.0f), db(N, 0.0f);
  matmul_backward(dx_a.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), M, K, N);
  matmul_backward(dx_b.data(), nullptr, nullptr, dout.data(), inp.data(), w.data(), M, K, N);
  EXPECT_EQ(dx_a, dx_b);
  std::vector<float> dx_r(M * K, 0.0f);
  matmul_backward_reference(dx_r.data(), nullptr, nullptr, dout.data(), inp.data(), w.data(), M, K,
                            N);
  EXPECT_TRUE(AllClose(dx_r.data(), dx_a.data(), dx_a.size(), kFastVsReferenceF32));
}

std::vector<float> RoundedToBf16(const std::vector<float>& x) {
  std::vector<float> out;
  for (float v : x) out.push_back(RoundToBf16(v));
  return out;
}

std::vector<uint16_t> Bf16Bits(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  F32ToBf16(out.data(), x.data(), static_cast<int64_t>(x.size()));
  return out;
}

// bf16 mixed precision's GEMM is the fp32 reference on operands rounded to
// bf16 (its products are exact in fp32); the bias gradient is the unrounded
// dout's; and it is not the fp32 GEMM on unrounded operands.
TEST_P(MatmulTest, Bf16IsTheReferenceOnRoundedOperands) {
  const auto [M, K, N] = GetParam();
  auto inp = RandomVector(M * K, 20), w = RandomVector(N * K, 21), b = RandomVector(N, 22),
       dout = RandomVector(M * N, 23);
  const std::vector<uint16_t> w16 = Bf16Bits(w);
  const std::vector<float> inp_r = RoundedToBf16(inp), w_r = RoundedToBf16(w),
                           dout_r = RoundedToBf16(dout);
  std::vector<float> want(M * N), got(M * N, 123.0f), fp32(M * N);
  matmul_forward_reference(want.data(), inp_r.data(), w_r.data(), b.data(), M, K, N);
  matmul_forward_bf16(got.data(), inp.data(), w16.data(), b.data(), M, K, N);
  EXPECT_TRUE(AllClose(got.data(), want.data(), want.size(), kFastVsReferenceF32));
  matmul_forward_reference(fp32.data(), inp.data(), w.data(), b.data(), M, K, N);
  double most = 0;
  for (int i = 0; i < M * N; ++i) most = std::max(most, std::fabs(double{fp32[i]} - got[i]));
  if (K > 1) {
    EXPECT_GT(most, 1e-4) << "the operands were not narrowed";
  }

  auto dinp0 = RandomVector(M * K, 24), dw0 = RandomVector(N * K, 25), db0 = RandomVector(N, 26);
  auto dinp_want = dinp0, dw_want = dw0, db_want = db0, dinp_got = dinp0, dw_got = dw0,
       db_got = db0;
  matmul_backward_reference(dinp_want.data(), dw_want.data(), nullptr, dout_r.data(), inp_r.data(),
                            w_r.data(), M, K, N);
  matmul_backward_reference(nullptr, nullptr, db_want.data(), dout.data(), inp.data(), w.data(), M,
                            K, N);
  matmul_backward_bf16(dinp_got.data(), dw_got.data(), db_got.data(), dout.data(), inp.data(),
                       w16.data(), M, K, N);
  EXPECT_TRUE(AllClose(dinp_got.data(), dinp_want.data(), dinp_want.size(), kFastVsReferenceF32));
  EXPECT_TRUE(AllClose(dw_got.data(), dw_want.data(), dw_want.size(), kFastVsReferenceF32));
  EXPECT_TRUE(AllClose(db_got.data(), db_want.data(), db_want.size(), kFastVsReferenceF32));
  // A frozen weight: the input gradient alone, the same.
  auto dinp_frozen = dinp0;
  matmul_backward_bf16(dinp_frozen.data(), nullptr, nullptr, dout.data(), inp.data(), w16.data(), M,
                       K, N);
  EXPECT_EQ(dinp_frozen, dinp_got);
}

TEST(Bf16Test, RoundsToNearestEvenAndKeepsNaNAndInfinity) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // a tie: to even (down)
  EXPECT_EQ(F32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // a tie: to even (up)
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::nanf("")))));
  EXPECT_TRUE(std::isinf(Bf16ToF32(F32ToBf16(INFINITY))));
  EXPECT_EQ(RoundToBf16(-2.5f), -2.5f);  // representable: unchanged
  std::vector<float> back(2);
  const uint16_t bits[2] = {0x3f80, 0xc020};
  Bf16ToF32(back.data(), bits, 2);
  EXPECT_EQ(back, (std::vector<float>{1.0f, -2.5f}));
}

INSTANTIATE_TEST_SUITE_P(Shapes, MatmulTest,
                         ::testing::Values(Dims{1, 1, 1}, Dims{3, 5, 7}, Dims{16, 32, 8},
                                           Dims{33, 17, 65}, Dims{64, 128, 96}),
                         [](const auto& info) {
                           return "M" + std::to_string(info.param.M) + "K" +
                                  std::to_string(info.param.K) + "N" + std::to_string(info.param.N);
                         });

}  // namespace
}  // namespace loom::kernels
