// Every CUDA op against its CPU reference on the same random inputs (one op
// table across backends, as ggml's test-backend-ops). Runs only where a GPU
// is visible; elsewhere each test reports itself skipped.
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/activation/activation.h"
#include "kernels/attention/attention.h"
#include "kernels/embedding/embedding.h"
#include "kernels/loss/crossentropy.h"
#include "kernels/matmul/bf16.h"
#include "kernels/matmul/matmul.h"
#include "kernels/norm/norm.h"
#include "kernels/optim/optim.h"
#include "kernels/rope/rope.h"
#include "kernels/testing/gradcheck.h"
#include "runtime/backends/cuda/device.h"
#include "runtime/backends/cuda/gpu_testing.h"

#ifdef LOOM_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/ops.h"
#include "runtime/backends/cuda/cuda_check.h"
#endif

#ifdef LOOM_CUDA_EMU
#include "runtime/backends/cuda/emu/emu.h"
#endif

namespace loom::kernels {
namespace {

using loom::testing::AllClose;
using loom::testing::kCudaFlashBf16VsCpuBf16;
using loom::testing::kCudaVsCpuF32;
using loom::testing::RandomVector;
using loom::testing::Tolerance;

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LOOM_REQUIRE_GPU_OR_SKIP(loom::cuda::CompiledWithCuda(), "built without CUDA");
    LOOM_REQUIRE_GPU_OR_SKIP(loom::cuda::DeviceCount() > 0, "no usable CUDA device");
  }
};

#ifdef LOOM_WITH_CUDA

// A device copy of a host vector; Host() copies back after synchronising.
template <typename T>
class Dev {
 public:
  explicit Dev(const std::vector<T>& h) : n_(h.size()) {
    LOOM_CUDA_CHECK(cudaMalloc(&p_, sizeof(T) * std::max<size_t>(n_, 1)));
    LOOM_CUDA_CHECK(cudaMemcpy(p_, h.data(), sizeof(T) * n_, cudaMemcpyHostToDevice));
  }
  explicit Dev(size_t n) : Dev(std::vector<T>(n)) {}
  ~Dev() { cudaFree(p_); }
  T* get() { return p_; }
  std::vector<T> Host() {
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> h(n_);
    LOOM_CUDA_CHECK(cudaMemcpy(h.data(), p_, sizeof(T) * n_, cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

::testing::AssertionResult Agree(const std::vector<float>& gpu, const std::vector<float>& cpu,
                                 const loom::testing::Tolerance& tol = kCudaVsCpuF32) {
  if (gpu.size() != cpu.size()) return ::testing::AssertionFailure() << "size differs";
  return AllClose(gpu.data(), cpu.data(), cpu.size(), tol);
}

TEST_F(CudaOpsTest, Matmul) {
  const int M = 37, K = 64, N = 45;
  auto x = RandomVector(M * K, 1), w = RandomVector(N * K, 2), b = RandomVector(N, 3),
       g = RandomVector(M * N, 4);
  std::vector<float> out(M * N), dx(M * K, 0.5f), dw(N * K, 0.25f), db(N, 1.0f);
  matmul_forward_reference(out.data(), x.data(), w.data(), b.data(), M, K, N);
  Dev<float> dX(x), dW(w), dB(b), dG(g), dOut(out.size()), dDx(dx), dDw(dw), dDb(db);
  matmul_backward_reference(dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), M, K, N);
  cuda::matmul_forward(dOut.get(), dX.get(), dW.get(), dB.get(), M, K, N);
  cuda::matmul_backward(dDx.get(), dDw.get(), dDb.get(), dG.get(), dX.get(), dW.get(), M, K, N);
  EXPECT_TRUE(Agree(dOut.Host(), out));
  EXPECT_TRUE(Agree(dDx.Host(), dx));
  EXPECT_TRUE(Agree(dDw.Host(), dw));
  EXPECT_TRUE(Agree(dDb.Host(), db));
}

TEST_F(CudaOpsTest, MatmulBf16) {
  const int M = 64, K = 256, N = 96;
  auto x = RandomVector(M * K, 5), w = RandomVector(N * K, 6);
  Dev<float> dX(x), dW(w), dOut(M * N), dBack(x.size());
  Dev<uint16_t> hX(x.size()), hW(w.size());
  cuda::f32_to_bf16(hX.get(), dX.get(), x.size());
  cuda::f32_to_bf16(hW.get(), dW.get(), w.size());
  // The CPU side multiplies the same bf16-rounded values in fp32.
  std::vector<float> xr(x.size()), wr(w.size());
  {
    Dev<float> tmpX(x.size()), tmpW(w.size());
    cuda::bf16_to_f32(tmpX.get(), hX.get(), x.size());
    cuda::bf16_to_f32(tmpW.get(), hW.get(), w.size());
    xr = tmpX.Host();
    wr = tmpW.Host();
  }
  std::vector<float> want(M * N);
  matmul_forward_reference(want.data(), xr.data(), wr.data(), nullptr, M, K, N);
  cuda::matmul_forward_bf16(dOut.get(), hX.get(), hW.get(), nullptr, M, K, N);
  EXPECT_TRUE(Agree(dOut.Host(), want, loom::testing::kCudaBf16GemmVsCpu));
}

TEST_F(CudaOpsTest, Norms) {
  const int N = 19, C = 300;
  auto x = RandomVector(N * C, 7, 2.0f), w = RandomVector(C, 8), b = RandomVector(C, 9),
       g = RandomVector(N * C, 10);
  std::vector<float> y(N * C), mean(N), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  const float eps = 1e-6f;  // SigLIP's; Loom's own configs use kLayerNormEps
  // The device's gradients start where the CPU's do (backward accumulates).
  Dev<float> dX(x), dW(w), dB(b), dG(g), dY(y.size()), dM(N), dR(N), dDx(dx), dDw(dw), dDb(db);
  layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, eps);
  layernorm_backward(dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  cuda::layernorm_forward(dY.get(), dM.get(), dR.get(), dX.get(), dW.get(), dB.get(), N, C, eps);
  cuda::layernorm_backward(dDx.get(), dDw.get(), dDb.get(), dG.get(), dX.get(), dW.get(), dM.get(),
                           dR.get(), N, C);
  EXPECT_TRUE(Agree(dY.Host(), y));
  EXPECT_TRUE(Agree(dDx.Host(), dx));
  EXPECT_TRUE(Agree(dDw.Host(), dw));
  EXPECT_TRUE(Agree(dDb.Host(), db));

  std::vector<float> ry(N * C), rr(N), rdx(N * C, 0.0f), rdw(C, 0.0f);
  Dev<float> eY(ry.size()), eR(N), eDx(rdx), eDw(rdw);
  rmsnorm_forward(ry.data(), rr.data(), x.data(), w.data(), N, C, 1e-5f);
  rmsnorm_backward(rdx.data(), rdw.data(), g.data(), x.data(), w.data(), rr.data(), N, C);
  cuda::rmsnorm_forward(eY.get(), eR.get(), dX.get(), dW.get(), N, C, 1e-5f);
  cuda::rmsnorm_backward(eDx.get(), eDw.get(), dG.get(), dX.get(), dW.get(), eR.get(), N, C);
  EXPECT_TRUE(Agree(eY.Host(), ry));
  EXPECT_TRUE(Agree(eDx.Host(), rdx));
  EXPECT_TRUE(Agree(eDw.Host(), rdw));
}

TEST_F(CudaOpsTest, Activations) {
  const int n = 5000;
  auto x = RandomVector(n, 11, 4.0f), u = RandomVector(n, 12), g = RandomVector(n, 13);
  std::vector<float> y(n), dx(n, 0.0f), s(n), dg(n, 0.0f), du(n, 0.0f);
  Dev<float> dX(x), dU(u), dG(g), dY(n), dDx(dx), dS(n), dDg(dg), dDu(du);
  gelu_forward(y.data(), x.data(), n);
  gelu_backward(dx.data(), x.data(), g.data(), n);
  swiglu_forward(s.data(), x.data(), u.data(), n);
  swiglu_backward(dg.data(), du.data(), x.data(), u.data(), g.data(), n);
  cuda::gelu_forward(dY.get(), dX.get(), n);
  cuda::gelu_backward(dDx.get(), dX.get(), dG.get(), n);
  cuda::swiglu_forward(dS.get(), dX.get(), dU.get(), n);
  cuda::swiglu_backward(dDg.get(), dDu.get(), dX.get(), dU.get(), dG.get(), n);
  EXPECT_TRUE(Agree(dY.Host(), y));
  EXPECT_TRUE(Agree(dDx.Host(), dx));
  EXPECT_TRUE(Agree(dS.Host(), s));
  EXPECT_TRUE(Agree(dDg.Host(), dg));
  EXPECT_TRUE(Agree(dDu.Host(), du));
}

TEST_F(CudaOpsTest, ExactAndQuickGelu) {
  const int n = 5000;
  auto x = RandomVector(n, 21, 4.0f), g = RandomVector(n, 22);
  Dev<float> dX(x), dG(g);
  for (Activation act : {Activation::kGeluTanh, Activation::kGeluErf, Activation::kQuickGelu}) {
    std::vector<float> y(n), dx(n, 0.0f);
    activation_forward(act, y.data(), x.data(), n);
    activation_backward(act, dx.data(), x.data(), g.data(), n);
    Dev<float> dY(n), dDx(std::vector<float>(n, 0.0f));
    cuda::activation_forward(act, dY.get(), dX.get(), n);
    cuda::activation_backward(act, dDx.get(), dX.get(), dG.get(), n);
    EXPECT_TRUE(Agree(dY.Host(), y)) << static_cast<int>(act);
    EXPECT_TRUE(Agree(dDx.Host(), dx)) << static_cast<int>(act);
  }
}

TEST_F(CudaOpsTest, RopeAndEmbedding) {
  const int T = 9, NH = 4, NKV = 2, HD = 8, C = NH * HD, V = 11;
  auto qkv = RandomVector(T * (NH + 2 * NKV) * HD, 14);
  const std::vector<int32_t> pos = {0, 1, 2, 3, 0, 1, 0, 1, 2};
  std::vector<float> inv_freq(HD / 2);
  rope_inv_freq(inv_freq.data(), HD, kRopeTheta);
  auto fwd = qkv;
  rope_forward(fwd.data(), pos.data(), inv_freq.data(), T, NH, NKV, HD);
  auto bwd = qkv;
  rope_backward(bwd.data(), pos.data(), inv_freq.data(), T, NH, NKV, HD);
  Dev<float> dF(qkv), dB(qkv), dInv(inv_freq);
  Dev<int32_t> dP(pos);
  cuda::rope_forward(dF.get(), dP.get(), dInv.get(), T, NH, NKV, HD);
  cuda::rope_backward(dB.get(), dP.get(), dInv.get(), T, NH, NKV, HD);
  EXPECT_TRUE(Agree(dF.Host(), fwd));
  EXPECT_TRUE(Agree(dB.Host(), bwd));

  auto wte = RandomVector(V * C, 15), g = RandomVector(T * C, 16);
  const std::vector<int32_t> tok = {3, -1, 3, 0, 10, -1, 7, 7, 7};
  std::vector<float> out(T * C, 2.0f), dwte(V * C, 0.0f);
  embedding_forward(out.data(), tok.data(), wte.data(), T, C);
  embedding_backward(dwte.data(), g.data(), tok.data(), T, C);
  Dev<float> dWte(wte), dG(g), dOut(std::vector<float>(T * C, 2.0f)), dDwte(V * C);
  Dev<int32_t> dTok(tok);
  cuda::embedding_forward(dOut.get(), dTok.get(), dWte.get(), T, C);
  cuda::embedding_backward(dDwte.get(), dG.get(), dTok.get(), T, C);
  EXPECT_TRUE(Agree(dOut.Host(), out));
  EXPECT_TRUE(Agree(dDwte.Host(), dwte));
}

TEST_F(CudaOpsTest, Attention) {
  for (const auto& [causal, NKV] :
       std::vector<std::pair<bool, int>>{{false, 2}, {true, 2}, {true, 1}}) {
    const std::vector<int32_t> cu = {0, 5, 6, 17, 40};
    const int S = 4, T = 40, NH = 2, HD = 16, C = NH * HD;
    auto qkv = RandomVector(T * (NH + 2 * NKV) * HD, 17), g = RandomVector(T * C, 18);
    const int64_t na = attention_att_size(cu.data(), S, NH);
    std::vector<float> out(T * C), att(na), dqkv(qkv.size(), 0.0f);
    attention_forward_reference(out.data(), att.data(), qkv.data(), cu.data(), S, NH, NKV, HD,
                                causal);
    attention_backward_reference(dqkv.data(), g.data(), qkv.data(), att.data(), cu.data(), S, NH,
                                 NKV, HD, causal);
    Dev<float> dQkv(qkv), dG(g), dOut(out.size()), dAtt(na), dScratch(na), dD(dqkv.size());
    Dev<int32_t> dCu(cu);
    cuda::attention_forward(dOut.get(), dAtt.get(), dQkv.get(), dCu.get(), S, T, NH, NKV, HD,
                            causal);
    cuda::attention_backward(dD.get(), dScratch.get(), dG.get(), dQkv.get(), dAtt.get(), dCu.get(),
                             S, T, NH, NKV, HD, causal);
    EXPECT_TRUE(Agree(dOut.Host(), out)) << "causal " << causal << " NKV " << NKV;
    EXPECT_TRUE(Agree(dAtt.Host(), att)) << "causal " << causal << " NKV " << NKV;
    EXPECT_TRUE(Agree(dD.Host(), dqkv)) << "causal " << causal << " NKV " << NKV;
  }
}

// The memory-efficient kernels against the CPU's (kernels/attention), over
// head dimensions of every template instance, sequences longer than a tile,
// causal and full, grouped-query; backward twice gives the same bits. In
// fp32 (CUDA cores) and bf16 (tensor cores, against the CPU's bf16).
class CudaFlashAttentionTest : public CudaOpsTest, public ::testing::WithParamInterface<bool> {};

TEST_P(CudaFlashAttentionTest, EqualsTheCpuKernel) {
  const bool bf16 = GetParam();
  struct Case {
    std::vector<int32_t> cu;
    int NH, NKV, HD;
    bool causal;
  };
  for (const Case& c : std::vector<Case>{{{0, 5, 6, 17, 40}, 2, 2, 16, false},
                                         {{0, 5, 6, 17, 40}, 4, 1, 12, true},
                                         {{0, 150, 230}, 4, 2, 32, true},
                                         {{0, 70, 100}, 2, 2, 64, false},
                                         {{0, 45, 90}, 2, 1, 128, true}}) {
    const int S = static_cast<int>(c.cu.size()) - 1, T = c.cu.back(), C = c.NH * c.HD;
    auto qkv = RandomVector(static_cast<size_t>(T) * (c.NH + 2 * c.NKV) * c.HD, 31);
    if (bf16) RoundToBf16(qkv.data(), static_cast<int64_t>(qkv.size()));  // the contract
    auto g = RandomVector(static_cast<size_t>(T) * C, 32);
    auto d0 = RandomVector(qkv.size(), 33);  // backward accumulates
    std::vector<float> out(T * C), lse(static_cast<size_t>(T) * c.NH), dqkv = d0;
    flash_attention_forward(out.data(), lse.data(), qkv.data(), c.cu.data(), S, c.NH, c.NKV, c.HD,
                            c.causal, bf16);
    flash_attention_backward(dqkv.data(), g.data(), qkv.data(), out.data(), lse.data(), c.cu.data(),
                             S, c.NH, c.NKV, c.HD, c.causal, bf16);
    Dev<float> dQkv(qkv), dG(g), dOut(out.size()), dLse(lse.size()), dScratch(lse.size());
    Dev<float> dD(d0), dD2(d0);
    Dev<int32_t> dCu(c.cu);
    cuda::flash_attention_forward(dOut.get(), dLse.get(), dQkv.get(), dCu.get(), S, T, c.NH, c.NKV,
                                  c.HD, c.causal, bf16);
    cuda::flash_attention_backward(dD.get(), dScratch.get(), dG.get(), dQkv.get(), dOut.get(),
                                   dLse.get(), dCu.get(), S, T, c.NH, c.NKV, c.HD, c.causal, bf16);
    cuda::flash_attention_backward(dD2.get(), dScratch.get(), dG.get(), dQkv.get(), dOut.get(),
                                   dLse.get(), dCu.get(), S, T, c.NH, c.NKV, c.HD, c.causal, bf16);
    const std::string what = "HD " + std::to_string(c.HD) + " causal " + std::to_string(c.causal);
    const Tolerance& tol = bf16 ? kCudaFlashBf16VsCpuBf16 : kCudaVsCpuF32;
    EXPECT_TRUE(Agree(dOut.Host(), out, tol)) << what;
    EXPECT_TRUE(Agree(dLse.Host(), lse, tol)) << what;
    EXPECT_TRUE(Agree(dD.Host(), dqkv, tol)) << what;
    EXPECT_EQ(dD.Host(), dD2.Host()) << what << ": two backward runs differ";
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaFlashAttentionTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return std::string(p.param ? "Bf16" : "Fp32");
                         });

TEST_F(CudaOpsTest, CrossEntropyAndAdamW) {
  const int T = 7, V = 1000;
  auto logits = RandomVector(T * V, 19, 5.0f);
  const std::vector<int32_t> targets = {4, -1, 999, 0, 500, -1, 3};
  std::vector<float> dl(T * V);
  LossSum want =
      crossentropy_forward_backward(dl.data(), logits.data(), targets.data(), T, V, 0.2f);
  Dev<float> dL(logits), dDl(dl.size()), dLoss(T);
  Dev<int32_t> dT(targets);
  cuda::crossentropy_forward_backward(dDl.get(), dLoss.get(), dL.get(), dT.get(), T, V, 0.2f);
  EXPECT_TRUE(Agree(dDl.Host(), dl));
  double sum = 0;
  for (float l : dLoss.Host()) sum += l;
  EXPECT_NEAR(sum, want.sum, kCudaVsCpuF32.atol + kCudaVsCpuF32.rtol * want.sum);

  const int n = 3000;
  auto p = RandomVector(n, 20), gr = RandomVector(n, 21), m = RandomVector(n, 22, 0.1f);
  auto v = RandomVector(n, 23, 0.1f);
  for (float& x : v) x = x * x;
  Dev<float> dp(p), dg(gr), dm(m), dv(v);
  AdamWConfig c{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  adamw_update(p.data(), gr.data(), m.data(), v.data(), n, c, 7);
  cuda::adamw_update(dp.get(), dg.get(), dm.get(), dv.get(), n, c.lr, c.beta1, c.beta2, c.eps,
                     c.weight_decay, 7);
  EXPECT_TRUE(Agree(dp.Host(), p));
  EXPECT_TRUE(Agree(dm.Host(), m));
  EXPECT_TRUE(Agree(dv.Host(), v));

  Dev<float> ss(std::vector<float>{0.0f}), partials(cuda::kSumSquaresPartials);
  cuda::sum_squares(ss.get(), partials.get(), dg.get(), n);
  const double norm = global_norm({{gr.data(), n}});
  EXPECT_NEAR(ss.Host()[0], norm * norm, kCudaVsCpuF32.atol + kCudaVsCpuF32.rtol * norm * norm);
}

// Frozen weights (LLaVA's stage 1 freezes the vision tower and the LLM): a
// null weight or bias gradient is skipped, as by the CPU kernels, and the
// input gradient is still computed.
TEST_F(CudaOpsTest, NullWeightGradientsAreSkipped) {
  const int M = 11, K = 24, N = 13, C = 40;
  auto x = RandomVector(M * K, 31), w = RandomVector(N * K, 32), g = RandomVector(M * N, 33);
  std::vector<float> dx(M * K, 0.5f);
  Dev<float> dX(x), dW(w), dG(g), dDx(dx);
  matmul_backward_reference(dx.data(), nullptr, nullptr, g.data(), x.data(), w.data(), M, K, N);
  cuda::matmul_backward(dDx.get(), nullptr, nullptr, dG.get(), dX.get(), dW.get(), M, K, N);
  EXPECT_TRUE(Agree(dDx.Host(), dx));

  auto nx = RandomVector(M * C, 34), nw = RandomVector(C, 35), nb = RandomVector(C, 36),
       ng = RandomVector(M * C, 37);
  std::vector<float> y(M * C), mean(M), rstd(M), rr(M), ndx(M * C, 0.0f), rdx(M * C, 0.0f);
  Dev<float> eX(nx), eW(nw), eB(nb), eG(ng), eY(y.size()), eM(M), eR(M), eRr(M), eDx(ndx),
      eRdx(rdx);
  layernorm_forward(y.data(), mean.data(), rstd.data(), nx.data(), nw.data(), nb.data(), M, C,
                    1e-5f);
  layernorm_backward(ndx.data(), nullptr, nullptr, ng.data(), nx.data(), nw.data(), mean.data(),
                     rstd.data(), M, C);
  rmsnorm_forward(y.data(), rr.data(), nx.data(), nw.data(), M, C, 1e-5f);
  rmsnorm_backward(rdx.data(), nullptr, ng.data(), nx.data(), nw.data(), rr.data(), M, C);
  cuda::layernorm_forward(eY.get(), eM.get(), eR.get(), eX.get(), eW.get(), eB.get(), M, C, 1e-5f);
  cuda::layernorm_backward(eDx.get(), nullptr, nullptr, eG.get(), eX.get(), eW.get(), eM.get(),
                           eR.get(), M, C);
  cuda::rmsnorm_forward(eY.get(), eRr.get(), eX.get(), eW.get(), M, C, 1e-5f);
  cuda::rmsnorm_backward(eRdx.get(), nullptr, eG.get(), eX.get(), eW.get(), eRr.get(), M, C);
  EXPECT_TRUE(Agree(eDx.Host(), ndx));
  EXPECT_TRUE(Agree(eRdx.Host(), rdx));
}

// What replicated parameters' gradients (norm weights and biases, linear
// biases), attention's input gradient and the gradient norm come to: the
// same bits whatever order the GPU runs blocks and threads in. Otherwise TP
// replicas of a replicated tensor drift apart and a replay after a recovery
// differs. The emulation runs each schedule seed in its own order.
TEST_F(CudaOpsTest, ReductionsAreTheSameBitsUnderEverySchedule) {
  const int N = 96, C = 200, M = 96, K = 32, NB = 40;
  const std::vector<int32_t> cu = {0, 30, 31, 96};
  const int S = 3, T = 96, NH = 4, NKV = 2, HD = 8;
  auto x = RandomVector(N * C, 41), w = RandomVector(C, 42), b = RandomVector(C, 43),
       g = RandomVector(N * C, 44), mx = RandomVector(M * K, 45), mw = RandomVector(NB * K, 46),
       mg = RandomVector(M * NB, 47), qkv = RandomVector(T * (NH + 2 * NKV) * HD, 48),
       ag = RandomVector(T * NH * HD, 49), big = RandomVector(200000, 50);
  const int64_t na = attention_att_size(cu.data(), S, NH);
  std::vector<std::vector<float>> runs[2];
  for (int run = 0; run < 2; ++run) {
#ifdef LOOM_CUDA_EMU
    loom::cuda_emu::SetScheduleSeed(static_cast<uint64_t>(run) + 7);
#endif
    Dev<float> dX(x), dW(w), dB(b), dG(g), dY(N * C), dM(N), dR(N), dRr(N), dDx(N * C),
        dDw(std::vector<float>(C, 0.0f)), dDb(std::vector<float>(C, 0.0f)),
        dRw(std::vector<float>(C, 0.0f));
    cuda::layernorm_forward(dY.get(), dM.get(), dR.get(), dX.get(), dW.get(), dB.get(), N, C,
                            1e-5f);
    cuda::layernorm_backward(dDx.get(), dDw.get(), dDb.get(), dG.get(), dX.get(), dW.get(),
                             dM.get(), dR.get(), N, C);
    cuda::rmsnorm_forward(dY.get(), dRr.get(), dX.get(), dW.get(), N, C, 1e-5f);
    cuda::rmsnorm_backward(dDx.get(), dRw.get(), dG.get(), dX.get(), dW.get(), dRr.get(), N, C);
    Dev<float> eX(mx), eW(mw), eG(mg), eDw(std::vector<float>(NB * K, 0.0f)),
        eDb(std::vector<float>(NB, 0.0f));
    cuda::matmul_backward(nullptr, eDw.get(), eDb.get(), eG.get(), eX.get(), eW.get(), M, K, NB);
    Dev<float> aQkv(qkv), aG(ag), aOut(T * NH * HD), aAtt(na), aScratch(na),
        aD(std::vector<float>(qkv.size(), 0.0f));
    Dev<int32_t> aCu(cu);
    cuda::attention_forward(aOut.get(), aAtt.get(), aQkv.get(), aCu.get(), S, T, NH, NKV, HD, true);
    cuda::attention_backward(aD.get(), aScratch.get(), aG.get(), aQkv.get(), aAtt.get(), aCu.get(),
                             S, T, NH, NKV, HD, true);
    Dev<float> sBig(big), sSum(std::vector<float>{0.0f}), sPartials(cuda::kSumSquaresPartials);
    cuda::sum_squares(sSum.get(), sPartials.get(), sBig.get(), static_cast<int64_t>(big.size()));
    runs[run] = {dDw.Host(), dDb.Host(), dRw.Host(), eDb.Host(), aD.Host(), sSum.Host()};
  }
#ifdef LOOM_CUDA_EMU
  loom::cuda_emu::SetScheduleSeed(1);
#endif
  const char* names[] = {"layernorm dweight", "layernorm dbias", "rmsnorm dweight",
                         "matmul dbias",      "attention dqkv",  "sum of squares"};
  for (int i = 0; i < 6; ++i) {
    ASSERT_EQ(runs[0][i].size(), runs[1][i].size());
    int differ = 0;
    for (size_t k = 0; k < runs[0][i].size(); ++k) {
      differ += std::memcmp(&runs[0][i][k], &runs[1][i][k], sizeof(float)) != 0;
    }
    EXPECT_EQ(differ, 0) << names[i] << ": " << differ << " of " << runs[0][i].size()
                         << " values differ between two runs";
  }
}

#else

TEST_F(CudaOpsTest, BuiltWithoutCuda) {}  // SetUp() skips it

#endif  // LOOM_WITH_CUDA

}  // namespace
}  // namespace loom::kernels
