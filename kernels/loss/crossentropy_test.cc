#include "kernels/loss/crossentropy.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gradcheck.h"
#include "kernels/testing/tolerances.h"

namespace loom::kernels {
namespace {

TEST(CrossEntropyTest, UniformLogitsGiveLogV) {
  const int V = 8;
  std::vector<float> logits(2 * V, 3.0f);
  const int32_t targets[] = {5, -1};
  LossSum l = crossentropy_forward(logits.data(), targets, 2, V);
  EXPECT_EQ(l.count, 1);
  EXPECT_NEAR(l.sum, std::log(8.0), loom::testing::ClosedFormF32(std::log(8.0)));
}

TEST(CrossEntropyTest, IsStableForLargeLogits) {
  const float logits[] = {1000.0f, 0.0f};
  const int32_t targets[] = {0};
  LossSum l = crossentropy_forward(logits, targets, 1, 2);
  EXPECT_NEAR(l.sum, std::log1p(std::exp(-1000.0)), loom::testing::ClosedFormF64(0.0));
}

TEST(CrossEntropyTest, GradientMatchesFiniteDifferencesAndMaskedRowsAreZero) {
  const int T = 4, V = 7;
  auto logits = loom::testing::RandomVector(T * V, 1, 3.0f);
  const int32_t targets[] = {3, -1, 0, 6};
  const float scale = 1.0f / 3.0f;  // three loss tokens
  std::vector<float> dlogits(T * V, 42.0f);
  LossSum l = crossentropy_forward_backward(dlogits.data(), logits.data(), targets, T, V, scale);
  EXPECT_EQ(l.count, 3);
  const double fwd = crossentropy_forward(logits.data(), targets, T, V).sum;
  EXPECT_NEAR(l.sum, fwd,
              loom::testing::ClosedFormF32(fwd));  // the fused and the plain forward, in fp32
  for (int v = 0; v < V; ++v) EXPECT_EQ(dlogits[V + v], 0.0f);
  auto loss = [&] { return crossentropy_forward(logits.data(), targets, T, V).sum * scale; };
  EXPECT_TRUE(loom::testing::CheckGradient(loss, logits.data(), dlogits.data(), logits.size(),
                                           logits.size()));
}

}  // namespace
}  // namespace loom::kernels
