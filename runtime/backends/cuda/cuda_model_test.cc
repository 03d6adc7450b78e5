// The same layer code on the GPU and on the CPU (issue 20's "one code
// path"): a ViT encoder and an LLM built twice from one seed, one on CpuOps,
// one on CudaOps with its parameters placed on the device (and the
// generator likewise); forward and
// backward on the same inputs agree (kCudaModelVsCpuF32). Skips without a
// GPU (fails under LOOM_REQUIRE_GPU=1).
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gradcheck.h"
#include "kernels/testing/tolerances.h"
#include "runtime/backends/cuda/cuda_backend.h"
#include "runtime/backends/cuda/cuda_ops.h"
#include "runtime/backends/cuda/device.h"
#include "runtime/backends/cuda/gpu_testing.h"
#include "runtime/backends/cuda/nccl_communicator.h"
#include "runtime/comm/comm_testing.h"
#include "runtime/model/generator.h"
#include "runtime/model/llm.h"
#include "runtime/model/model.h"
#include "runtime/model/vit.h"
#include "runtime/tensor/buffer.h"

#ifdef LOOM_CUDA_EMU
#include "runtime/backends/cuda/emu/emu.h"
#endif

namespace loom {
namespace {

using testing::AllClose;
using testing::kCudaModelVsCpuF32;
using testing::RandomVector;

class CudaModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Ops>> ops = MakeCudaOps(0);
    LOOM_REQUIRE_GPU_OR_SKIP(ops.ok(), ops.status());
    gpu_ = *std::move(ops);
  }
  Buffer<float> Upload(const std::vector<float>& host) {
    Buffer<float> b(gpu_->backend());
    b.CopyFromHost(host.data(), host.size());
    return b;
  }
  static void ExpectGradsAgree(ParamSet& cpu, ParamSet& gpu,
                               const testing::Tolerance& t = kCudaModelVsCpuF32) {
    gpu.PullGrads();
    ASSERT_EQ(cpu.size(), gpu.size());
    for (int i = 0; i < static_cast<int>(cpu.specs().size()); ++i) {
      EXPECT_TRUE(AllClose(gpu.grads().data() + cpu.spec(i).offset,
                           cpu.grads().data() + cpu.spec(i).offset,
                           static_cast<size_t>(cpu.spec(i).numel), t))
          << cpu.spec(i).name;
    }
  }
  std::unique_ptr<Ops> gpu_;
};

// In fp32, and under bf16 mixed precision (bf16 GEMMs on tensor cores,
// bf16 kept activations) against the CPU's bf16.
class CudaLlmTest : public CudaModelTest, public ::testing::WithParamInterface<Precision> {};

TEST_P(CudaLlmTest, AnLlmTrainsTheSameOnBothBackends) {
  const Precision p = GetParam();
  const testing::Tolerance t =
      p == Precision::kBf16 ? testing::kCudaModelVsCpuBf16 : kCudaModelVsCpuF32;
  LlmConfig c = {/*vocab=*/64,      /*dim=*/32, /*layers=*/2, /*heads=*/4,
                 /*ffn_hidden=*/48, 10000.0f,   128};
  Llm cpu(c), gpu(c, nullptr, {}, gpu_.get());
  cpu.params().Initialize(3);
  gpu.params().Initialize(3);
  cpu.params().Place(CpuBackend::Get(), p);
  gpu.params().Place(gpu_->backend(), p);
  std::mt19937 rng(5);
  Sample a, b;
  for (int i = 0; i < 37; ++i) a.tokens.push_back(static_cast<int32_t>(rng() % c.vocab));
  for (int i = 0; i < 21; ++i) b.tokens.push_back(static_cast<int32_t>(rng() % c.vocab));
  const LlmBatch batch = PackSamples({&a, &b});
  cpu.params().ZeroGrad();
  gpu.params().ZeroGrad();
  ASSERT_TRUE(cpu.Forward(batch, nullptr).ok());
  ASSERT_TRUE(gpu.Forward(batch, nullptr).ok());
  const std::vector<float> want_logits = cpu.logits(), got_logits = gpu.logits();
  EXPECT_TRUE(AllClose(got_logits.data(), want_logits.data(), want_logits.size(), t));
  absl::StatusOr<kernels::LossSum> want = cpu.Backward(0.02f, nullptr);
  absl::StatusOr<kernels::LossSum> got = gpu.Backward(0.02f, nullptr);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(got->count, want->count);
  EXPECT_NEAR(got->sum, want->sum, t.rtol * std::abs(want->sum));
  ExpectGradsAgree(cpu.params(), gpu.params(), t);
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaLlmTest,
                         ::testing::Values(Precision::kFp32, Precision::kBf16),
                         [](const auto& info) { return std::string(PrecisionName(info.param)); });

TEST_F(CudaModelTest, AVitEncoderTrainsTheSameOnBothBackends) {
  VitConfig c = {/*tile_size=*/16, /*patch=*/4, /*dim=*/32, /*layers=*/2, /*heads=*/4,
                 /*mlp_hidden=*/64};
  VitEncoder cpu(c), gpu(c, nullptr, {}, gpu_.get());
  cpu.params().Initialize(9);
  gpu.params().Initialize(9);
  gpu.params().Place(gpu_->backend());
  const int N = 3;
  const std::vector<float> tiles = RandomVector(static_cast<size_t>(N) * 3 * 16 * 16, 11);
  const size_t out_n = static_cast<size_t>(N) * c.patches_per_tile() * c.dim;
  std::vector<float> want(out_n);
  cpu.params().ZeroGrad();
  gpu.params().ZeroGrad();
  ASSERT_TRUE(cpu.Forward(tiles.data(), N, want.data()).ok());
  Buffer<float> in = Upload(tiles), out(gpu_->backend());
  out.resize(out_n);
  ASSERT_TRUE(gpu.Forward(in.data(), N, out.data()).ok());
  const std::vector<float> got = out.ToHost();
  EXPECT_TRUE(AllClose(got.data(), want.data(), out_n, kCudaModelVsCpuF32));
  const std::vector<float> dout = RandomVector(out_n, 13);
  ASSERT_TRUE(cpu.Backward(dout.data()).ok());
  Buffer<float> d = Upload(dout);
  ASSERT_TRUE(gpu.Backward(d.data()).ok());
  ExpectGradsAgree(cpu.params(), gpu.params());
}

// The generator (a prefix-conditioned ViT, the timestep MLP, the
// condition projection, the head, the rectified-flow loss): its loss, the
// conditions' gradient and every parameter gradient agree.
TEST_F(CudaModelTest, AGeneratorTrainsTheSameOnBothBackends) {
  GeneratorConfig c = TinyGeneratorConfig(/*cond_dim=*/24);
  c.denoiser.tile_size = 8;
  c.denoiser.dim = 32;
  c.denoiser.mlp_hidden = 64;
  c.queries = 2;
  c.time_freqs = 8;
  Generator cpu(c), gpu(c, nullptr, gpu_.get());
  for (Generator* g : {&cpu, &gpu}) {
    g->params().Initialize(4);
    g->denoiser_params().Initialize(4);
  }
  gpu.params().Place(gpu_->backend());
  gpu.denoiser_params().Place(gpu_->backend());
  GeneratorBatch b;
  b.N = 3;
  b.images = RandomVector(static_cast<size_t>(b.N) * c.pixels(), 5);
  for (int n = 0; n < b.N; ++n) {
    GenerationDraw d = DrawGeneration(4, 1, n, 0, c.pixels());
    b.t.push_back(d.t);
    b.noise.insert(b.noise.end(), d.noise.begin(), d.noise.end());
  }
  const std::vector<float> cond = RandomVector(static_cast<size_t>(b.N) * c.queries * 24, 6);
  std::vector<float> want_dcond(cond.size(), 0.0f);
  for (Generator* g : {&cpu, &gpu}) {
    g->params().ZeroGrad();
    g->denoiser_params().ZeroGrad();
  }
  ASSERT_TRUE(cpu.Forward(b, cond.data()).ok());
  ASSERT_TRUE(cpu.Backward(0.5f, want_dcond.data()).ok());
  Buffer<float> gcond = Upload(cond), gdcond(gpu_->backend());
  gdcond.Zeros(cond.size());
  ASSERT_TRUE(gpu.Forward(b, gcond.data()).ok());
  EXPECT_NEAR(gpu.LossSum(), cpu.LossSum(), testing::Allowed(kCudaModelVsCpuF32, cpu.LossSum()));
  ASSERT_TRUE(gpu.Backward(0.5f, gdcond.data()).ok());
  const std::vector<float> got_dcond = gdcond.ToHost();
  EXPECT_TRUE(AllClose(got_dcond.data(), want_dcond.data(), cond.size(), kCudaModelVsCpuF32));
  ExpectGradsAgree(cpu.params(), gpu.params());
  ExpectGradsAgree(cpu.denoiser_params(), gpu.denoiser_params());
}

// An LLM batch of two samples with `images` image-token slots (-1) in the
// first.
LlmBatch ImageBatch(const LlmConfig& c, int images, Sample* a, Sample* b) {
  std::mt19937 rng(17);
  a->tokens.clear();
  b->tokens.clear();
  for (int i = 0; i < 5; ++i) a->tokens.push_back(static_cast<int32_t>(rng() % c.vocab));
  for (int i = 0; i < images; ++i) a->tokens.push_back(-1);
  for (int i = 0; i < 9; ++i) a->tokens.push_back(static_cast<int32_t>(rng() % c.vocab));
  for (int i = 0; i < 13; ++i) b->tokens.push_back(static_cast<int32_t>(rng() % c.vocab));
  return PackSamples({a, b});
}

// Tensor and sequence parallelism on GPUs: an LLM at TP 2, each rank on
// its own device with an NCCL group (the stream's rows all-gathered and
// reduce-scattered in device memory, the norms' gradients summed over it),
// against one CPU rank. A batch of 59 tokens: the rows pad to 60.
TEST_F(CudaModelTest, ASequenceParallelLlmOverNcclTrainsAsOneCpuRank) {
  constexpr int kTp = 2;
  if (cuda::DeviceCount() < kTp) GTEST_SKIP() << "needs " << kTp << " GPUs";
  LlmConfig c = {/*vocab=*/64,      /*dim=*/32, /*layers=*/2, /*heads=*/4,
                 /*ffn_hidden=*/48, 10000.0f,   128};
  std::mt19937 rng(5);
  Sample a, b;
  for (int i = 0; i < 37; ++i) a.tokens.push_back(static_cast<int32_t>(rng() % c.vocab));
  for (int i = 0; i < 22; ++i) b.tokens.push_back(static_cast<int32_t>(rng() % c.vocab));
  const LlmBatch batch = PackSamples({&a, &b});
  Llm cpu(c);
  cpu.params().Initialize(3);
  ASSERT_TRUE(cpu.Forward(batch, nullptr).ok());
  absl::StatusOr<kernels::LossSum> want = cpu.Backward(0.02f, nullptr);
  ASSERT_TRUE(want.ok());
  InMemoryStore gloo_store, nccl_store;
  std::vector<std::vector<float>> grads(kTp);
  std::vector<double> losses(kTp);
  // Gloo gathers the ranks' gradients on the host; NCCL runs the layers'.
  testing::OnRanks(kTp, "gather", &gloo_store, [&](int rank, Communicator* gloo) {
    absl::StatusOr<std::unique_ptr<Ops>> ops = MakeCudaOps(rank);
    ASSERT_TRUE(ops.ok()) << ops.status();
    NcclOptions o;
    o.prefix = "tp";
    o.rank = rank;
    o.size = kTp;
    o.device = rank;
    absl::StatusOr<std::unique_ptr<NcclCommunicator>> nccl = ConnectNccl(&nccl_store, o);
    ASSERT_TRUE(nccl.ok()) << nccl.status();
    Llm gpu(c, nccl->get(), {}, ops->get());
    gpu.set_sequence_parallel(true);
    gpu.params().Initialize(3);
    gpu.params().Place((*ops)->backend());
    ASSERT_TRUE(gpu.Forward(batch, nullptr).ok());
    absl::StatusOr<kernels::LossSum> got = gpu.Backward(0.02f, nullptr);
    ASSERT_TRUE(got.ok()) << got.status();
    losses[rank] = got->sum;
    gpu.params().PullGrads();
    absl::StatusOr<std::vector<float>> g = GatherGradients(gpu.params(), gloo);
    ASSERT_TRUE(g.ok()) << g.status();
    grads[rank] = *std::move(g);
  });
  const std::vector<float>& want_grads = cpu.params().grads();
  for (int r = 0; r < kTp; ++r) {
    EXPECT_NEAR(losses[r], want->sum, kCudaModelVsCpuF32.rtol * std::abs(want->sum)) << r;
    ASSERT_EQ(grads[r].size(), want_grads.size()) << r;
    EXPECT_TRUE(AllClose(grads[r].data(), want_grads.data(), want_grads.size(), kCudaModelVsCpuF32))
        << "rank " << r;
  }
}

// LLaVA's stage 1: the LLM is frozen (no weight gradients at all) and still
// hands the image embeddings their gradient.
TEST_F(CudaModelTest, AFrozenLlmGivesItsImagesTheirGradient) {
  LlmConfig c = {/*vocab=*/64,      /*dim=*/32, /*layers=*/2, /*heads=*/4,
                 /*ffn_hidden=*/48, 10000.0f,   128};
  Llm cpu(c), gpu(c, nullptr, {}, gpu_.get());
  cpu.params().Initialize(3);
  gpu.params().Initialize(3);
  gpu.params().Place(gpu_->backend());
  cpu.params().Freeze();
  gpu.params().Freeze();
  Sample a, b;
  const int images = 6;
  const LlmBatch batch = ImageBatch(c, images, &a, &b);
  const std::vector<float> emb = RandomVector(static_cast<size_t>(images) * c.dim, 19);
  std::vector<float> want(emb.size(), 0.0f);
  ASSERT_TRUE(cpu.Forward(batch, emb.data()).ok());
  ASSERT_TRUE(cpu.Backward(0.05f, want.data()).ok());
  Buffer<float> demb = Upload(emb), dgot = Upload(std::vector<float>(emb.size(), 0.0f));
  ASSERT_TRUE(gpu.Forward(batch, demb.data()).ok());
  ASSERT_TRUE(gpu.Backward(0.05f, dgot.data()).ok());
  const std::vector<float> got = dgot.ToHost();
  EXPECT_TRUE(AllClose(got.data(), want.data(), want.size(), kCudaModelVsCpuF32));
}

// A training step's memory comes from what the steps before it freed: after
// the first step, neither cudaMalloc nor cudaFree is called.
TEST_F(CudaModelTest, AStepAfterTheFirstAllocatesNothing) {
  LlmConfig c = {/*vocab=*/64,      /*dim=*/32, /*layers=*/2, /*heads=*/4,
                 /*ffn_hidden=*/48, 10000.0f,   128};
  Llm gpu(c, nullptr, {}, gpu_.get());
  gpu.params().Initialize(3);
  gpu.params().Place(gpu_->backend());
  Sample a, b;
  const LlmBatch batch = ImageBatch(c, 4, &a, &b);
  Buffer<float> emb = Upload(RandomVector(4 * static_cast<size_t>(c.dim), 21));
  Buffer<float> demb = Upload(std::vector<float>(4 * static_cast<size_t>(c.dim), 0.0f));
  auto step = [&] {
    gpu.params().ZeroGrad();
    ASSERT_TRUE(gpu.Forward(batch, emb.data()).ok());
    ASSERT_TRUE(gpu.Backward(0.05f, demb.data()).ok());
  };
  step();
  const CudaMemoryStats before = GetCudaMemoryStats(gpu_->backend());
#ifdef LOOM_CUDA_EMU
  const cuda_emu::Counters emu_before = cuda_emu::GetCounters();
#endif
  step();
  const CudaMemoryStats after = GetCudaMemoryStats(gpu_->backend());
  EXPECT_EQ(after.device_allocations, before.device_allocations);
  EXPECT_EQ(after.device_frees, before.device_frees);
  EXPECT_GT(after.cached_bytes + after.in_use_bytes, 0u);
#ifdef LOOM_CUDA_EMU
  const cuda_emu::Counters emu_after = cuda_emu::GetCounters();
  EXPECT_EQ(emu_after.mallocs, emu_before.mallocs);
  EXPECT_EQ(emu_after.frees, emu_before.frees);
#endif
}

// The image embeddings go into the LLM's rows, and their gradients out, in
// a fixed number of kernel launches however many image tokens a batch has
// (launches are counted by the emulation).
TEST_F(CudaModelTest, ImageTokensCostNoLaunchesOfTheirOwn) {
#ifndef LOOM_CUDA_EMU
  GTEST_SKIP() << "counts kernel launches, which the CUDA emulation does";
#else
  LlmConfig c = {/*vocab=*/64,      /*dim=*/32, /*layers=*/1, /*heads=*/4,
                 /*ffn_hidden=*/48, 10000.0f,   128};
  Llm gpu(c, nullptr, {}, gpu_.get());
  gpu.params().Initialize(3);
  gpu.params().Place(gpu_->backend());
  std::vector<int64_t> launches;
  for (int images : {2, 12}) {
    Sample a, b;
    const LlmBatch batch = ImageBatch(c, images, &a, &b);
    Buffer<float> emb = Upload(RandomVector(static_cast<size_t>(images) * c.dim, 23));
    Buffer<float> demb = Upload(std::vector<float>(static_cast<size_t>(images) * c.dim, 0.0f));
    const int64_t start = cuda_emu::GetCounters().launches;
    ASSERT_TRUE(gpu.Forward(batch, emb.data()).ok());
    ASSERT_TRUE(gpu.Backward(0.05f, demb.data()).ok());
    launches.push_back(cuda_emu::GetCounters().launches - start);
  }
  EXPECT_EQ(launches[1], launches[0])
      << "10 more image tokens, " << launches[1] - launches[0] << " more launches";
#endif
}

}  // namespace
}  // namespace loom
