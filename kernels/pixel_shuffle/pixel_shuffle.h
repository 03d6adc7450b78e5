// Pixel shuffle for the projector (InternVL/LLaVA-OneVision style): merges
// each 2×2 block of neighbouring patch embeddings of a tile into one token
// with 4× the channels, cutting image tokens by 4.
//
//   in  (N, G, G, C)  tile, grid row, grid column, channel (G even)
//   out (N, G/2, G/2, 4*C)  channels ordered (dy, dx, c)
#ifndef LOOM_KERNELS_PIXEL_SHUFFLE_PIXEL_SHUFFLE_H_
#define LOOM_KERNELS_PIXEL_SHUFFLE_PIXEL_SHUFFLE_H_

namespace loom::kernels {

void pixel_shuffle_forward(float* out, const float* inp, int N, int G, int C);
// dinp += the inverse permutation of dout.
void pixel_shuffle_backward(float* dinp, const float* dout, int N, int G, int C);

}  // namespace loom::kernels

#endif  // LOOM_KERNELS_PIXEL_SHUFFLE_PIXEL_SHUFFLE_H_
