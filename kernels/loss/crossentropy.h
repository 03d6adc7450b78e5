// Cross-entropy over the vocabulary with a loss mask.
//
// Targets < 0 carry no loss (image positions, the last token of a sample,
// prompt tokens): they contribute nothing to the loss and get zero gradient.
//
// The training loss is the sum over the global batch divided by the number of
// loss tokens in the whole global batch (known before the iteration from the
// metadata), so every split of the batch into ranks and microbatches yields
// the same gradient. `grad_scale` is that 1 / global_loss_tokens.
#ifndef LOOM_KERNELS_LOSS_CROSSENTROPY_H_
#define LOOM_KERNELS_LOSS_CROSSENTROPY_H_

#include <cstdint>

namespace loom::kernels {

struct LossSum {
  double sum = 0;     // sum of -log p(target) over positions with a target
  int64_t count = 0;  // number of such positions
};

// Forward only (evaluation).
LossSum crossentropy_forward(const float* logits,     // (T, V)
                             const int32_t* targets,  // (T)
                             int T, int V);

// Forward and backward fused: dlogits = (softmax(logits) - onehot) *
// grad_scale on rows with a target, 0 elsewhere (overwritten, not added).
LossSum crossentropy_forward_backward(float* dlogits,          // (T, V)
                                      const float* logits,     // (T, V)
                                      const int32_t* targets,  // (T)
                                      int T, int V, float grad_scale);

}  // namespace loom::kernels

#endif  // LOOM_KERNELS_LOSS_CROSSENTROPY_H_
