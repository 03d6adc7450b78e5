#include "kernels/embedding/embedding.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gradcheck.h"

namespace loom::kernels {
namespace {

using loom::testing::CheckGradient;
using loom::testing::RandomVector;
using loom::testing::WeightedSum;

TEST(EmbeddingTest, LooksUpRowsAndSkipsNegativeTokens) {
  const int V = 4, C = 3;
  auto wte = RandomVector(V * C, 1);
  const int32_t tokens[] = {2, -1, 0, 2};
  std::vector<float> out(4 * C, 9.0f);
  embedding_forward(out.data(), tokens, wte.data(), 4, C);
  for (int c = 0; c < C; ++c) {
    EXPECT_EQ(out[c], wte[2 * C + c]);
    EXPECT_EQ(out[C + c], 9.0f);  // untouched: an image slot
    EXPECT_EQ(out[2 * C + c], wte[c]);
  }
}

TEST(EmbeddingTest, BackwardMatchesFiniteDifferencesWithRepeatsAndSkips) {
  const int V = 5, C = 4, T = 6;
  auto wte = RandomVector(V * C, 2), g = RandomVector(T * C, 3);
  const int32_t tokens[] = {1, 1, -1, 4, 0, 1};
  std::vector<float> out(T * C, 0.0f);
  auto loss = [&] {
    embedding_forward(out.data(), tokens, wte.data(), T, C);
    return WeightedSum(out, g);
  };
  std::vector<float> dwte(V * C, 0.0f);
  embedding_backward(dwte.data(), g.data(), tokens, T, C);
  EXPECT_TRUE(CheckGradient(loss, wte.data(), dwte.data(), wte.size(), wte.size()));
  for (int c = 0; c < C; ++c) EXPECT_EQ(dwte[3 * C + c], 0.0f);  // token 3 never used
}

TEST(PatchifyTest, LaysOutPatchesLikeAConvWeight) {
  // One 4x4 tile, 3 channels, P = 2: pixel value = c*100 + y*10 + x.
  const int S = 4, P = 2;
  std::vector<float> tile(3 * S * S);
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < S; ++y)
      for (int x = 0; x < S; ++x) tile[(c * S + y) * S + x] = c * 100 + y * 10 + x;
  std::vector<float> patches(4 * 12);
  patchify(patches.data(), tile.data(), 1, S, P);
  // Patch 3 is grid (1,1): rows 2-3, cols 2-3. Its element (c=1, y=1, x=0) is pixel (1, 3, 2).
  EXPECT_EQ(patches[3 * 12 + (1 * P + 1) * P + 0], 100 + 30 + 2);
  // Patch 1 is grid (0,1); element (c=0,y=0,x=1) is pixel (0, 0, 3).
  EXPECT_EQ(patches[1 * 12 + 1], 3);
}

TEST(PositionTest, BackwardSumsOverTiles) {
  const int N = 3, Np = 4, C = 2;
  auto pos = RandomVector(Np * C, 4), x0 = RandomVector(N * Np * C, 5),
       g = RandomVector(N * Np * C, 6);
  std::vector<float> x;
  auto loss = [&] {
    x = x0;
    add_position_forward(x.data(), pos.data(), N, Np, C);
    return WeightedSum(x, g);
  };
  std::vector<float> dpos(Np * C, 0.0f);
  add_position_backward(dpos.data(), g.data(), N, Np, C);
  EXPECT_TRUE(CheckGradient(loss, pos.data(), dpos.data(), pos.size(), pos.size()));
}

}  // namespace
}  // namespace loom::kernels
