#include "kernels/pixel_shuffle/pixel_shuffle.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gradcheck.h"

namespace loom::kernels {
namespace {

TEST(PixelShuffleTest, MergesTwoByTwoBlocks) {
  const int N = 1, G = 4, C = 1;
  std::vector<float> in(G * G);
  for (int i = 0; i < G * G; ++i) in[i] = i;  // value = y*4 + x
  std::vector<float> out(G * G);
  pixel_shuffle_forward(out.data(), in.data(), N, G, C);
  // Output token (1, 0) holds rows 2-3, cols 0-1: 8, 9, 12, 13.
  const float want[] = {8, 9, 12, 13};
  for (int k = 0; k < 4; ++k) EXPECT_EQ(out[(1 * 2 + 0) * 4 + k], want[k]);
}

TEST(PixelShuffleTest, BackwardIsTheInversePermutationAndAccumulates) {
  const int N = 2, G = 4, C = 3;
  auto in = loom::testing::RandomVector(N * G * G * C, 1);
  std::vector<float> out(in.size()), back(in.size(), 1.0f);
  pixel_shuffle_forward(out.data(), in.data(), N, G, C);
  pixel_shuffle_backward(back.data(), out.data(), N, G, C);
  for (size_t i = 0; i < in.size(); ++i) EXPECT_FLOAT_EQ(back[i], in[i] + 1.0f);
}

}  // namespace
}  // namespace loom::kernels
