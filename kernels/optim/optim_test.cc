#include "kernels/optim/optim.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/tolerances.h"

namespace loom::kernels {
namespace {

TEST(AdamWTest, FirstStepMovesEachParameterByLrTimesSign) {
  // With bias correction, step 1 gives mhat = g, vhat = g²: update = lr * g / (|g| + eps).
  std::vector<float> p = {1.0f, -2.0f, 0.5f}, g = {0.3f, -4.0f, 0.0f}, m(3, 0.0f), v(3, 0.0f);
  AdamWConfig c;
  c.lr = 0.1f;
  adamw_update(p.data(), g.data(), m.data(), v.data(), 3, c, 1);
  EXPECT_NEAR(p[0], 0.9f, loom::testing::ClosedFormF32(0.9));
  EXPECT_NEAR(p[1], -1.9f, loom::testing::ClosedFormF32(1.9));
  EXPECT_NEAR(p[2], 0.5f, loom::testing::ClosedFormF32(0.5));
}

TEST(AdamWTest, TwoStepsMatchTheFormulaWithDecoupledDecay) {
  AdamWConfig c;
  c.lr = 0.01f;
  c.beta1 = 0.9f;
  c.beta2 = 0.99f;
  c.eps = 1e-8f;
  c.weight_decay = 0.1f;
  float p = 2.0f, m = 0, v = 0;
  const float g1 = 0.5f, g2 = -1.0f;
  adamw_update(&p, &g1, &m, &v, 1, c, 1);
  adamw_update(&p, &g2, &m, &v, 1, c, 2);
  // By hand (double):
  double P = 2.0, M = 0, Vv = 0;
  const double gs[] = {0.5, -1.0};
  for (int t = 1; t <= 2; ++t) {
    const double g = gs[t - 1];
    P *= 1 - 0.01 * 0.1;
    M = 0.9 * M + 0.1 * g;
    Vv = 0.99 * Vv + 0.01 * g * g;
    P -= 0.01 * (M / (1 - std::pow(0.9, t))) / (std::sqrt(Vv / (1 - std::pow(0.99, t))) + 1e-8);
  }
  EXPECT_NEAR(p, P, loom::testing::ClosedFormF32(P));
}

TEST(ClipTest, ScalesDownOnlyAboveTheMaximum) {
  std::vector<float> a = {3.0f, 0.0f}, b = {4.0f};
  std::vector<GradSpan> grads = {{a.data(), 2}, {b.data(), 1}};
  EXPECT_NEAR(global_norm(grads), 5.0, loom::testing::ClosedFormF64(5.0));
  EXPECT_NEAR(clip_global_norm(grads, 10.0), 5.0, loom::testing::ClosedFormF64(5.0));
  EXPECT_EQ(a[0], 3.0f);  // below the maximum: untouched
  EXPECT_NEAR(clip_global_norm(grads, 1.0), 5.0, loom::testing::ClosedFormF64(5.0));
  EXPECT_NEAR(global_norm(grads), 1.0, loom::testing::ClosedFormF32(1.0));
  EXPECT_NEAR(a[0] / b[0], 0.75, loom::testing::ClosedFormF32(0.75));  // direction kept
}

}  // namespace
}  // namespace loom::kernels
