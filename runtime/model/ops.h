// The kernels a model's layers run, behind one interface per backend: the
// layer code (runtime/model, the tensor-parallel layers of runtime/parallel)
// calls Ops, never a kernel, so the same code serves the CPU kernels
// (kernels/<op>/) and, once parameters and activations live on the device,
// the CUDA kernels (kernels/cuda/ops.h) — one code path (ggml's backend ops,
// llm.c's forward/backward written once over its kernels).
//
// Contracts are the CPU kernels' (shapes, `+=` in backward, masks): see
// each kernel's header. Every pointer is memory of backend(); the integer
// arrays (tokens, positions, cu_seqlens, targets) too. Host-side values
// (sizes) are computed on the host from host copies.
//
// Thread-safety: the CPU ops are stateless and serve many threads; others
// say their own (CudaOps: one thread at a time).
#ifndef LOOM_RUNTIME_MODEL_OPS_H_
#define LOOM_RUNTIME_MODEL_OPS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/activation/activation.h"
#include "kernels/loss/crossentropy.h"
#include "kernels/optim/optim.h"
#include "runtime/tensor/backend.h"

namespace loom {

// A linear layer's weight as the layers hand it to Ops: fp32 (the master
// values, or their device copy), and under bf16 mixed precision also a bf16
// copy (raw bits) that the GEMMs read instead (ParamSet::weight). A bare
// fp32 pointer converts to one without a bf16 copy.
struct WeightRef {
  WeightRef(const float* w) : f32(w) {}  // NOLINT(runtime/explicit): the fp32 case
  WeightRef(const float* w, const uint16_t* h) : f32(w), bf16(h) {}
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
};

class Ops {
 public:
  virtual ~Ops() = default;
  // Where the pointers the ops take live.
  virtual Backend* backend() const = 0;

  // kernels/matmul: out (M, N) = inp (M, K) · weight (N, K)ᵀ + bias.
  virtual void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                              int M, int K, int N) = 0;
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, int M, int K, int N) = 0;

  // The same under bf16 mixed precision (kernels/matmul/matmul.h's _bf16
  // contract): the weight as bf16 bits, inp and dout rounded to bf16 by the
  // op, products summed in fp32, every output and gradient fp32.
  virtual void matmul_forward_bf16(float* out, const float* inp, const uint16_t* weight,
                                   const float* bias, int M, int K, int N) = 0;
  virtual void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout,
                                    const float* inp, const uint16_t* weight, int M, int K,
                                    int N) = 0;
  // The layers' linear layer: the bf16 GEMM where the weight has a bf16
  // copy, the fp32 one otherwise.
  void linear_forward(float* out, const float* inp, WeightRef weight, const float* bias, int M,
                      int K, int N) {
    if (weight.bf16 != nullptr) {
      matmul_forward_bf16(out, inp, weight.bf16, bias, M, K, N);
    } else {
      matmul_forward(out, inp, weight.f32, bias, M, K, N);
    }
  }
  void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, WeightRef weight, int M, int K, int N) {
    if (weight.bf16 != nullptr) {
      matmul_backward_bf16(dinp, dweight, dbias, dout, inp, weight.bf16, M, K, N);
    } else {
      matmul_backward(dinp, dweight, dbias, dout, inp, weight.f32, M, K, N);
    }
  }
  // n values narrowed to bf16 (round to nearest even) or widened (exact).
  virtual void f32_to_bf16(uint16_t* dst, const float* src, int64_t n) = 0;
  virtual void bf16_to_f32(float* dst, const uint16_t* src, int64_t n) = 0;
  // x rounded in place to the nearest bf16 value (kept as fp32).
  virtual void round_to_bf16(float* x, int64_t n) = 0;

  // kernels/optim, where the parameters live (runtime/train/trainer.h
  // OptimizerStep): one AdamW step over n parameters; Σ x² brought back to
  // the host (in double on the CPU; the CUDA kernel sums in fp32, its
  // blocks in a fixed order); x *= factor.
  virtual void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                            const kernels::AdamWConfig& config, int64_t step) = 0;
  virtual double sum_of_squares(const float* x, int64_t n) = 0;
  virtual void scale(float* x, float factor, int64_t n) = 0;

  // kernels/norm.
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, int N, int C,
                                 float eps) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, const float* mean,
                                  const float* rstd, int N, int C) = 0;
  virtual void rmsnorm_forward(float* out, float* rrms, const float* inp, const float* weight,
                               int N, int C, float eps) = 0;
  virtual void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                const float* weight, const float* rrms, int N, int C) = 0;

  // kernels/activation.
  virtual void activation_forward(kernels::Activation act, float* out, const float* inp,
                                  int64_t n) = 0;
  virtual void activation_backward(kernels::Activation act, float* dinp, const float* inp,
                                   const float* dout, int64_t n) = 0;
  virtual void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) = 0;
  virtual void swiglu_backward(float* dgate, float* dup, const float* gate, const float* up,
                               const float* dout, int64_t n) = 0;

  // kernels/rope (inv_freq: HD / 2 values on this backend).
  virtual void rope_forward(float* qkv, const int32_t* positions, const float* inv_freq, int T,
                            int NH, int NKV, int HD) = 0;
  virtual void rope_backward(float* dqkv, const int32_t* positions, const float* inv_freq, int T,
                             int NH, int NKV, int HD) = 0;

  // kernels/attention's memory-efficient attention (flash_attention_*):
  // packed variable-length sequences, `cu_seqlens` (S + 1) on this backend;
  // T = cu_seqlens[S] rows; `lse` holds T x NH floats (each row's
  // log-sum-exp), no L x L probabilities; backward reads the forward's
  // `out`. bf16: bf16 mixed precision's attention (kernels/attention's
  // bf16; qkv holds bf16 values), on tensor cores on CUDA.
  virtual void attention_forward(float* out, float* lse, const float* qkv,
                                 const int32_t* cu_seqlens, int S, int T, int NH, int NKV, int HD,
                                 bool causal, bool bf16) = 0;
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv,
                                  const float* out, const float* lse, const int32_t* cu_seqlens,
                                  int S, int T, int NH, int NKV, int HD, bool causal,
                                  bool bf16) = 0;

  // kernels/embedding: the ViT's patches and positions.
  virtual void patchify(float* patches, const float* tiles, int N, int S, int P) = 0;
  virtual void add_position_forward(float* x, const float* pos, int N, int Np, int C) = 0;
  virtual void add_position_backward(float* dpos, const float* dx, int N, int Np, int C) = 0;

  // kernels/pixel_shuffle.
  virtual void pixel_shuffle_forward(float* out, const float* inp, int N, int G, int C) = 0;
  virtual void pixel_shuffle_backward(float* dinp, const float* dout, int N, int G, int C) = 0;

  // The rows of a vocabulary shard [vocab_start, vocab_start + v_shard):
  // out (T, C) = table row of each token in the shard, 0 elsewhere (and at
  // tokens < 0); backward adds dout's rows to theirs.
  virtual void vocab_embedding_forward(float* out, const int32_t* tokens, const float* table, int T,
                                       int C, int vocab_start, int v_shard) = 0;
  virtual void vocab_embedding_backward(float* dtable, const float* dout, const int32_t* tokens,
                                        int T, int C, int vocab_start, int v_shard) = 0;

  // kernels/loss over whole rows of the vocabulary (one rank); the loss sum
  // comes back to the host.
  virtual kernels::LossSum crossentropy_forward(const float* logits, const int32_t* targets, int T,
                                                int V) = 0;
  virtual kernels::LossSum crossentropy_forward_backward(float* dlogits, const float* logits,
                                                         const int32_t* targets, int T, int V,
                                                         float grad_scale) = 0;

  // Megatron's vocab-parallel cross-entropy in three steps around the TP
  // group's two all-reduces (runtime/parallel/tensor_parallel.h); logits
  // (T, V) hold the shard's columns [vocab_start, vocab_start + V).
  // mx (T) = each row's max over the shard.
  virtual void crossentropy_shard_max(float* mx, const float* logits, int T, int V) = 0;
  // With mx the whole row's max: sums (2T) [2t] = Σ exp(x - mx[t]) over the
  // shard, [2t + 1] = x[target] - mx[t] where the shard holds the target, 0
  // otherwise; both 0 on rows without a target (< 0).
  virtual void crossentropy_shard_sums(double* sums, const float* logits, const float* mx,
                                       const int32_t* targets, int T, int V, int vocab_start) = 0;
  // From the group's sums: the loss sum, and with `dlogits` (softmax -
  // onehot) · grad_scale on rows with a target, 0 elsewhere.
  virtual kernels::LossSum crossentropy_shard_finish(float* dlogits, const float* logits,
                                                     const float* mx, const double* sums,
                                                     const int32_t* targets, int T, int V,
                                                     int vocab_start, float grad_scale) = 0;

  // Elementwise: x[i] += y[i]; out (M, N) += bias (N) on every row;
  // dst = src; x = 0.
  virtual void add(float* x, const float* y, int64_t n) = 0;
  virtual void add_bias(float* out, const float* bias, int M, int N) = 0;
  virtual void copy(float* dst, const float* src, int64_t n) = 0;
  virtual void zero(float* x, int64_t n) = 0;

  // Rows of C floats, `rows` (n) on this backend: dst row rows[i] = src row
  // i (scatter_rows); dst row i += src row rows[i] (gather_add_rows). The
  // LLM's image-token rows, in one launch however many there are.
  virtual void scatter_rows(float* dst, const float* src, const int32_t* rows, int n, int C) = 0;
  virtual void gather_add_rows(float* dst, const float* src, const int32_t* rows, int n, int C) = 0;
};

// The CPU kernels on host memory (CpuBackend). Process-wide.
Ops* CpuOps();

// A device as flags and job configs name it: "cpu" is -1, "cuda" is CUDA
// device 0 (the first visible one: a pod's own GPU), "cuda:N" device N.
// INVALID_ARGUMENT saying what it wants otherwise.
absl::StatusOr<int> ParseDevice(const std::string& name);

// The device a process opens for `name`: "cuda" is the GPU of its local
// rank (local_rank mod `devices`, so that the ranks on one machine spread
// over its GPUs; several share one when there are more ranks than GPUs);
// "cuda:N" is N whatever the rank; "cpu" is -1. ParseDevice's errors.
absl::StatusOr<int> ResolveDevice(const std::string& name, int local_rank, int devices);

// This process's rank among the ranks on its machine, from its launcher:
// LOOM_LOCAL_RANK (loom up), LOCAL_RANK (torchrun), SLURM_LOCALID (srun),
// OMPI_COMM_WORLD_LOCAL_RANK (mpirun), the first set; 0 when none is (one
// rank per pod or machine). INVALID_ARGUMENT naming a variable that is set
// but not a non-negative integer.
absl::StatusOr<int> LocalRankFromEnvironment();

}  // namespace loom

#endif  // LOOM_RUNTIME_MODEL_OPS_H_
