// The model's ops on a GPU (CudaOps) against the same ops on the CPU
// (CpuOps), on the same random inputs: the ops the layers call besides the
// big kernels (kernels/cuda:ops_cuda_test has those), through the Ops
// interface. Skips without a GPU (fails under LOOM_REQUIRE_GPU=1).
#include "runtime/backends/cuda/cuda_ops.h"

#include <cmath>
#include <functional>
#include <memory>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gradcheck.h"
#include "kernels/testing/tolerances.h"
#include "runtime/backends/cuda/gpu_testing.h"

#ifdef LOOM_CUDA_EMU
#include "runtime/backends/cuda/emu/emu.h"
#endif

namespace loom {
namespace {

using testing::AllClose;
using testing::kCudaVsCpuF32;
using testing::RandomVector;

// A buffer of the ops' backend, filled from the host; Host() reads it back.
template <typename T>
class Buf {
 public:
  Buf(Ops* ops, const std::vector<T>& host) : b_(ops->backend()), n_(host.size()) {
    p_ = b_->Allocate(sizeof(T) * n_);
    b_->CopyFromHost(p_, host.data(), sizeof(T) * n_);
  }
  ~Buf() { b_->Free(p_); }
  T* get() { return static_cast<T*>(p_); }
  std::vector<T> Host() {
    b_->Synchronize();
    std::vector<T> out(n_);
    b_->CopyToHost(out.data(), p_, sizeof(T) * n_);
    return out;
  }

 private:
  Backend* b_;
  size_t n_;
  void* p_;
};

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Ops>> ops = MakeCudaOps(0);
    LOOM_REQUIRE_GPU_OR_SKIP(ops.ok(), ops.status());
    gpu_ = *std::move(ops);
  }
  // Runs `op` on both backends over copies of `inputs`; compares `outputs`
  // (indices into the buffers) after.
  void Agree(const std::vector<std::vector<float>>& buffers,
             const std::function<void(Ops*, std::vector<float*>&)>& op, const char* what) {
    std::vector<std::vector<float>> cpu = buffers;
    std::vector<float*> cpu_ptrs;
    for (auto& b : cpu) cpu_ptrs.push_back(b.data());
    op(CpuOps(), cpu_ptrs);
    std::vector<std::unique_ptr<Buf<float>>> dev;
    std::vector<float*> dev_ptrs;
    for (const auto& b : buffers) {
      dev.push_back(std::make_unique<Buf<float>>(gpu_.get(), b));
      dev_ptrs.push_back(dev.back()->get());
    }
    op(gpu_.get(), dev_ptrs);
    for (size_t i = 0; i < buffers.size(); ++i) {
      const std::vector<float> got = dev[i]->Host();
      EXPECT_TRUE(AllClose(got.data(), cpu[i].data(), got.size(), kCudaVsCpuF32))
          << what << ", buffer " << i;
    }
  }
  std::unique_ptr<Ops> gpu_;
};

TEST_F(CudaOpsTest, PatchesPositionsAndPixelShuffle) {
  const int N = 3, S = 28, P = 14, G = S / P, C = 16;
  Agree(
      {RandomVector(N * G * G * 3 * P * P, 1), RandomVector(N * 3 * S * S, 2)},
      [&](Ops* o, std::vector<float*>& b) { o->patchify(b[0], b[1], N, S, P); }, "patchify");
  Agree(
      {RandomVector(N * G * G * C, 3), RandomVector(G * G * C, 4), RandomVector(G * G * C, 5)},
      [&](Ops* o, std::vector<float*>& b) {
        o->add_position_forward(b[0], b[1], N, G * G, C);
        o->add_position_backward(b[2], b[0], N, G * G, C);
      },
      "positions");
  const int g = 4;
  Agree(
      {RandomVector(N * g * g * C, 6), RandomVector(N * g * g * C, 7),
       RandomVector(N * g * g * C, 8)},
      [&](Ops* o, std::vector<float*>& b) {
        o->pixel_shuffle_forward(b[1], b[0], N, g, C);
        o->pixel_shuffle_backward(b[2], b[1], N, g, C);
      },
      "pixel shuffle");
}

TEST_F(CudaOpsTest, VocabShardEmbeddingAddsAndCopies) {
  const int T = 37, C = 24, V = 50, start = 50, shard = 50;
  std::vector<int32_t> tokens(T);
  // Both sides of the shard's edge (50), repeated tokens, image positions.
  for (int t = 0; t < T; ++t) tokens[t] = t % 5 == 0 ? -1 : (t * 3) % 20 + 45;
  std::vector<int32_t> cpu_tokens = tokens;
  Buf<int32_t> dev_tokens(gpu_.get(), tokens);
  Agree(
      {RandomVector(T * C, 9), RandomVector(V * C, 10), RandomVector(V * C, 11),
       RandomVector(T * C, 12)},
      [&](Ops* o, std::vector<float*>& b) {
        const int32_t* tk = o == CpuOps() ? cpu_tokens.data() : dev_tokens.get();
        o->vocab_embedding_forward(b[0], tk, b[1], T, C, start, shard);
        o->vocab_embedding_backward(b[2], b[3], tk, T, C, start, shard);
      },
      "vocab embedding");
  Agree(
      {RandomVector(T * C, 13), RandomVector(T * C, 14), RandomVector(C, 15),
       RandomVector(T * C, 16), RandomVector(T * C, 17)},
      [&](Ops* o, std::vector<float*>& b) {
        o->add(b[0], b[1], T * C);
        o->add_bias(b[0], b[2], T, C);
        o->copy(b[3], b[0], T * C);
        o->zero(b[4], T * C);
      },
      "add, bias, copy, zero");
}

// bf16 mixed precision's ops: the casts (the same bits), and the GEMMs on
// tensor cores against the CPU's widened sgemm (kernels/matmul/matmul.h).
TEST_F(CudaOpsTest, Bf16CastsAndGemmsAgree) {
  const int M = 37, K = 48, N = 29;
  const std::vector<float> x = RandomVector(M * K, 30), w = RandomVector(N * K, 31),
                           bias = RandomVector(N, 32), dout = RandomVector(M * N, 33);
  std::vector<uint16_t> w16(w.size());
  CpuOps()->f32_to_bf16(w16.data(), w.data(), static_cast<int64_t>(w.size()));
  Buf<float> dx(gpu_.get(), x), dw(gpu_.get(), w);
  Buf<uint16_t> dw16(gpu_.get(), std::vector<uint16_t>(w.size()));
  gpu_->f32_to_bf16(dw16.get(), dw.get(), static_cast<int64_t>(w.size()));
  EXPECT_EQ(dw16.Host(), w16) << "rounding differs";
  Buf<float> back(gpu_.get(), std::vector<float>(w.size()));
  gpu_->bf16_to_f32(back.get(), dw16.get(), static_cast<int64_t>(w.size()));
  std::vector<float> want_back(w.size());
  CpuOps()->bf16_to_f32(want_back.data(), w16.data(), static_cast<int64_t>(w.size()));
  EXPECT_EQ(back.Host(), want_back);
  std::vector<float> rounded = x;
  CpuOps()->round_to_bf16(rounded.data(), static_cast<int64_t>(x.size()));
  Buf<float> g_rounded(gpu_.get(), x);
  gpu_->round_to_bf16(g_rounded.get(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(g_rounded.Host(), rounded);
  EXPECT_NE(rounded, x);

  std::vector<float> out(M * N), dinp = RandomVector(M * K, 34), dweight = RandomVector(N * K, 35),
                                 dbias = RandomVector(N, 36);
  Buf<float> g_out(gpu_.get(), out), g_bias(gpu_.get(), bias), g_dout(gpu_.get(), dout),
      g_dinp(gpu_.get(), dinp), g_dweight(gpu_.get(), dweight), g_dbias(gpu_.get(), dbias);
  CpuOps()->matmul_forward_bf16(out.data(), x.data(), w16.data(), bias.data(), M, K, N);
  gpu_->matmul_forward_bf16(g_out.get(), dx.get(), dw16.get(), g_bias.get(), M, K, N);
  CpuOps()->matmul_backward_bf16(dinp.data(), dweight.data(), dbias.data(), dout.data(), x.data(),
                                 w16.data(), M, K, N);
  gpu_->matmul_backward_bf16(g_dinp.get(), g_dweight.get(), g_dbias.get(), g_dout.get(), dx.get(),
                             dw16.get(), M, K, N);
  for (auto [got, want, what] :
       {std::tuple{g_out.Host(), out, "out"}, std::tuple{g_dinp.Host(), dinp, "dinp"},
        std::tuple{g_dweight.Host(), dweight, "dweight"},
        std::tuple{g_dbias.Host(), dbias, "dbias"}}) {
    EXPECT_TRUE(AllClose(got.data(), want.data(), want.size(), testing::kCudaBf16GemmVsCpu))
        << what;
  }
}

// Empty batches (a text-only microbatch has no tiles): nothing to do, no
// failed launch.
TEST_F(CudaOpsTest, EmptySizesAreNoOps) {
  Buf<float> x(gpu_.get(), std::vector<float>(8, 1.0f));
  gpu_->add(x.get(), x.get(), 0);
  gpu_->add_bias(x.get(), x.get(), 0, 8);
  gpu_->patchify(x.get(), x.get(), 0, 28, 14);
  gpu_->add_position_forward(x.get(), x.get(), 0, 4, 2);
  gpu_->pixel_shuffle_forward(x.get(), x.get(), 0, 4, 2);
  gpu_->copy(x.get(), x.get(), 0);
  gpu_->zero(x.get(), 0);
  EXPECT_EQ(x.Host(), std::vector<float>(8, 1.0f));
}

TEST_F(CudaOpsTest, CrossEntropyWithItsGradientAgrees) {
  const int T = 21, V = 48;
  std::vector<int32_t> targets(T);
  for (int t = 0; t < T; ++t) targets[t] = t % 3 == 0 ? -1 : (t * 5) % V;
  const std::vector<float> logits = RandomVector(T * V, 20, 3.0f);
  std::vector<float> dlogits(T * V);
  const kernels::LossSum want = CpuOps()->crossentropy_forward_backward(
      dlogits.data(), logits.data(), targets.data(), T, V, 0.5f);
  Buf<float> d_logits(gpu_.get(), logits), d_dlogits(gpu_.get(), std::vector<float>(T * V));
  Buf<int32_t> d_targets(gpu_.get(), targets);
  const kernels::LossSum got = gpu_->crossentropy_forward_backward(d_dlogits.get(), d_logits.get(),
                                                                   d_targets.get(), T, V, 0.5f);
  EXPECT_EQ(got.count, want.count);
  EXPECT_NEAR(got.sum, want.sum, 1e-4 * want.count);
  const std::vector<float> got_d = d_dlogits.Host();
  EXPECT_TRUE(AllClose(got_d.data(), dlogits.data(), got_d.size(), kCudaVsCpuF32));
}

TEST_F(CudaOpsTest, CrossEntropyLossSumsAgree) {
  const int T = 19, V = 64;
  std::vector<int32_t> targets(T);
  for (int t = 0; t < T; ++t) targets[t] = t % 4 == 0 ? -1 : (t * 11) % V;
  const std::vector<float> logits = RandomVector(T * V, 18, 3.0f);
  const kernels::LossSum cpu = CpuOps()->crossentropy_forward(logits.data(), targets.data(), T, V);
  Buf<float> dev_logits(gpu_.get(), logits);
  Buf<int32_t> dev_targets(gpu_.get(), targets);
  const kernels::LossSum gpu =
      gpu_->crossentropy_forward(dev_logits.get(), dev_targets.get(), T, V);
  EXPECT_EQ(gpu.count, cpu.count);
  EXPECT_NEAR(gpu.sum, cpu.sum, 1e-4 * cpu.count) << "kCudaVsCpuF32's rtol per row";
}

// The vocab-parallel cross-entropy's three steps on one shard (columns
// [40, 80) of 120), some targets outside it, some rows without one.
TEST_F(CudaOpsTest, VocabShardCrossEntropyStepsAgree) {
  const int T = 13, V = 40, start = 40;
  std::vector<int32_t> targets(T);
  for (int t = 0; t < T; ++t) targets[t] = t % 5 == 0 ? -1 : (t * 17) % 120;
  const std::vector<float> logits = RandomVector(T * V, 19, 3.0f);
  std::vector<float> mx(T), dlogits(T * V);
  std::vector<double> sums(2 * T);
  Ops* cpu = CpuOps();
  cpu->crossentropy_shard_max(mx.data(), logits.data(), T, V);
  cpu->crossentropy_shard_sums(sums.data(), logits.data(), mx.data(), targets.data(), T, V, start);
  const kernels::LossSum want = cpu->crossentropy_shard_finish(
      dlogits.data(), logits.data(), mx.data(), sums.data(), targets.data(), T, V, start, 0.25f);

  Buf<float> d_logits(gpu_.get(), logits), d_mx(gpu_.get(), std::vector<float>(T)),
      d_dlogits(gpu_.get(), std::vector<float>(T * V));
  Buf<double> d_sums(gpu_.get(), std::vector<double>(2 * T));
  Buf<int32_t> d_targets(gpu_.get(), targets);
  gpu_->crossentropy_shard_max(d_mx.get(), d_logits.get(), T, V);
  gpu_->crossentropy_shard_sums(d_sums.get(), d_logits.get(), d_mx.get(), d_targets.get(), T, V,
                                start);
  const kernels::LossSum got =
      gpu_->crossentropy_shard_finish(d_dlogits.get(), d_logits.get(), d_mx.get(), d_sums.get(),
                                      d_targets.get(), T, V, start, 0.25f);
  EXPECT_EQ(d_mx.Host(), mx);  // a max is exact
  const std::vector<double> got_sums = d_sums.Host();
  for (int i = 0; i < 2 * T; ++i)
    EXPECT_NEAR(got_sums[i], sums[i], 1e-4 * std::abs(sums[i]) + 1e-5);
  const std::vector<float> got_d = d_dlogits.Host();
  EXPECT_TRUE(AllClose(got_d.data(), dlogits.data(), got_d.size(), kCudaVsCpuF32));
  EXPECT_EQ(got.count, want.count);
  EXPECT_NEAR(got.sum, want.sum, 1e-4 * want.count);
  // The loss alone (no gradient), as evaluation asks.
  const kernels::LossSum loss_only = gpu_->crossentropy_shard_finish(
      nullptr, d_logits.get(), d_mx.get(), d_sums.get(), d_targets.get(), T, V, start, 0.25f);
  EXPECT_EQ(loss_only.count, want.count);
  EXPECT_NEAR(loss_only.sum, want.sum, 1e-4 * want.count);
}

// The LLM's image-token rows: scattered in, their gradients gathered out.
TEST_F(CudaOpsTest, RowsScatterAndGather) {
  const int n = 3, C = 5, T = 8;
  const std::vector<int32_t> rows = {6, 1, 4};
  const std::vector<float> src = RandomVector(n * C, 8), big = RandomVector(T * C, 9);
  std::vector<float> dst = RandomVector(T * C, 10), acc = RandomVector(n * C, 11);
  Buf<float> ddst(gpu_.get(), dst), dsrc(gpu_.get(), src), dbig(gpu_.get(), big),
      dacc(gpu_.get(), acc);
  Buf<int32_t> drows(gpu_.get(), rows);
  CpuOps()->scatter_rows(dst.data(), src.data(), rows.data(), n, C);
  CpuOps()->gather_add_rows(acc.data(), big.data(), rows.data(), n, C);
  gpu_->scatter_rows(ddst.get(), dsrc.get(), drows.get(), n, C);
  gpu_->gather_add_rows(dacc.get(), dbig.get(), drows.get(), n, C);
  EXPECT_EQ(ddst.Host(), dst);
  EXPECT_EQ(dacc.Host(), acc);
  EXPECT_EQ(dst[6 * C + 2], src[2]);  // row 0 of src went to row 6
}

// Attention's backward runs on the device alone: no copy to the host (of
// the sequence boundaries, to size a scratch) stalls the stream.
TEST_F(CudaOpsTest, AttentionBackwardCopiesNothingToTheHost) {
#ifndef LOOM_CUDA_EMU
  GTEST_SKIP() << "counts copies, which the CUDA emulation does";
#else
  const std::vector<int32_t> cu = {0, 7, 19};
  const int S = 2, T = 19, NH = 2, NKV = 1, HD = 8;
  Buf<float> qkv(gpu_.get(), RandomVector(T * (NH + 2 * NKV) * HD, 3));
  Buf<float> g(gpu_.get(), RandomVector(T * NH * HD, 4));
  Buf<float> out(gpu_.get(), std::vector<float>(T * NH * HD));
  Buf<float> lse(gpu_.get(), std::vector<float>(T * NH));
  Buf<float> dqkv(gpu_.get(), std::vector<float>(T * (NH + 2 * NKV) * HD, 0.0f));
  Buf<int32_t> dcu(gpu_.get(), cu);
  gpu_->attention_forward(out.get(), lse.get(), qkv.get(), dcu.get(), S, T, NH, NKV, HD, true,
                          false);
  const int64_t before = cuda_emu::GetCounters().copies_to_host;
  gpu_->attention_backward(dqkv.get(), g.get(), qkv.get(), out.get(), lse.get(), dcu.get(), S, T,
                           NH, NKV, HD, true, false);
  EXPECT_EQ(cuda_emu::GetCounters().copies_to_host, before);
#endif
}

TEST(CudaOpsUnavailableTest, WithoutAGpuItSaysWhy) {
  absl::StatusOr<std::unique_ptr<Ops>> ops = MakeCudaOps(1000);
  ASSERT_FALSE(ops.ok());
  EXPECT_TRUE(ops.status().code() == absl::StatusCode::kUnimplemented ||
              ops.status().code() == absl::StatusCode::kFailedPrecondition)
      << ops.status();
}

}  // namespace
}  // namespace loom
