#include "runtime/model/memory.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/comm/comm_testing.h"
#include "runtime/model/llm.h"
#include "runtime/model/projector.h"
#include "runtime/model/vit.h"

namespace loom {
namespace {

// A rank's place in a TP group, for building one rank's slice of a module
// (construction calls no collective).
class RankOnly final : public Communicator {
 public:
  RankOnly(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllreduceSum(float*, int64_t) override { return Unused(); }
  absl::Status AllreduceSum(double*, int64_t) override { return Unused(); }
  absl::Status AllreduceMax(float*, int64_t) override { return Unused(); }

 private:
  static absl::Status Unused() { return absl::UnimplementedError("not in this test"); }
  int rank_, size_;
};

ModelConfig Config(bool clip_like) {
  ModelConfig c;
  c.name = "memory-test";
  c.vit = {/*tile_size=*/32, /*patch=*/8, /*dim=*/48,
           /*layers=*/3,     /*heads=*/4, /*mlp_hidden=*/96};
  c.projector = {/*pixel_shuffle=*/!clip_like, /*hidden=*/80};
  c.llm = {/*vocab=*/640, /*dim=*/64, /*layers=*/4, /*heads=*/8, /*ffn_hidden=*/176};
  c.llm.kv_heads = 4;
  if (clip_like) {
    c.vit.class_token = true;
    c.vit.patch_bias = false;
    c.vit.pre_norm = true;
    c.vit.final_norm = false;
    c.llm.qkv_bias = true;
    c.llm.tie_embeddings = true;
  }
  return c;
}

TEST(MemoryModelTest, ParameterCountsAreTheModulesOwnOnEveryStageAndTpRank) {
  for (bool clip_like : {false, true}) {
    const ModelConfig c = Config(clip_like);
    for (int tp : {1, 2, 4}) {
      RankOnly comm(tp - 1, tp);
      Communicator* group = tp == 1 ? nullptr : &comm;
      // Tied embeddings keep the first and last layers in one stage.
      const std::vector<LayerRange> llm_ranges =
          c.llm.tie_embeddings ? std::vector<LayerRange>{{0, 4}}
                               : std::vector<LayerRange>{{0, 4}, {0, 1}, {1, 3}, {3, 4}};
      for (LayerRange r : llm_ranges) {
        Llm llm(c.llm, group, r);
        EXPECT_EQ(LlmStageParameters(c.llm, r.first, r.last, tp), llm.params().size())
            << "LLM [" << r.first << ", " << r.last << ") tp " << tp;
      }
      for (LayerRange r : {LayerRange{0, 3}, LayerRange{0, 1}, LayerRange{1, 3}}) {
        VitEncoder vit(c.vit, group, r);
        EXPECT_EQ(VitStageParameters(c.vit, r.first, r.last, tp), vit.params().size())
            << "ViT [" << r.first << ", " << r.last << ") tp " << tp;
      }
    }
    Projector projector(c);
    EXPECT_EQ(ProjectorParameters(c), projector.params().size());
  }
}

std::vector<float> Random(size_t n, std::mt19937* rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = d(*rng);
  return x;
}

// A packed batch of `T` tokens in two samples, `image` of them image
// positions.
LlmBatch Batch(int T, int image, int vocab, std::mt19937* rng) {
  LlmBatch b;
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  for (int t = 0; t < T; ++t) {
    b.tokens.push_back(t >= 1 && t <= image ? -1 : tok(*rng));
    b.targets.push_back(t + 1 < T ? tok(*rng) : -1);
    b.positions.push_back(t < T / 2 ? t : t - T / 2);
  }
  b.cu_seqlens = {0, T / 2, T};
  return b;
}

// The backend's peak over one LLM stage's life (built, placed, two
// microbatches through forward and backward, the second the largest), as
// the model predicts it.
TEST(MemoryModelTest, AnLlmStagesBuffersPeakWhereTheModelSays) {
  const ModelConfig c = Config(false);
  Backend* cpu = CpuOps()->backend();
  std::mt19937 rng(7);
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    for (LayerRange r : {LayerRange{0, 4}, LayerRange{0, 2}, LayerRange{2, 4}, LayerRange{1, 3}}) {
      SCOPED_TRACE(std::string(PrecisionName(p)) + " layers [" + std::to_string(r.first) + ", " +
                   std::to_string(r.last) + ")");
      const int T = 300, image = 40;
      const size_t before = cpu->in_use_bytes();
      cpu->ResetPeak();
      {
        Llm llm(c.llm, nullptr, r);
        llm.params().Initialize(1);
        llm.params().Place(cpu, p);
        for (int t : {T / 2, T}) {
          LlmBatch b = Batch(t, r.first == 0 ? image : 0, c.llm.vocab, &rng);
          const std::vector<float> emb = Random(static_cast<size_t>(image) * c.llm.dim, &rng);
          const std::vector<float> in = Random(static_cast<size_t>(t) * c.llm.dim, &rng);
          std::vector<float> dout = Random(in.size(), &rng), din(in.size());
          std::vector<float> demb(emb.size());
          ASSERT_TRUE(llm.Forward(b, r.first == 0 ? emb.data() : nullptr,
                                  r.first == 0 ? nullptr : in.data())
                          .ok());
          const bool last = r.last == c.llm.layers;
          ASSERT_TRUE(llm.Backward(1.0f / t, r.first == 0 ? demb.data() : nullptr,
                                   last ? nullptr : dout.data(),
                                   r.first == 0 ? nullptr : din.data())
                          .ok());
        }
      }
      const double measured = static_cast<double>(cpu->peak_bytes() - before);
      StageMemoryOptions o;
      o.precision = p;
      const MemoryEstimate e = LlmStageMemory(c.llm, r.first, r.last, T, image, o);
      // Within 1%: the model leaves out cu_seqlens and rounds no
      // allocation up to the backend's 64 bytes.
      EXPECT_NEAR(measured, e.buffers, 0.01 * e.buffers) << e.ToString();
    }
  }
}

// Under sequence parallelism at TP 2 and 4, with selective recompute or
// none: each rank's buffers peak where the model says (the ranks are
// threads of this process; each counts its own blocks).
TEST(MemoryModelTest, SequenceParallelStagesPeakWhereTheModelSays) {
  Backend* cpu = CpuOps()->backend();
  for (bool clip_like : {false, true}) {
    const ModelConfig c = Config(clip_like);
    for (Precision p : {Precision::kFp32, Precision::kBf16}) {
      for (Recompute rc : {Recompute::kNone, Recompute::kSelective}) {
        for (int tp : {2, 4}) {
          SCOPED_TRACE(std::string(clip_like ? "clip-like " : "") + PrecisionName(p) + " " +
                       RecomputeName(rc) + " tp " + std::to_string(tp));
          const int T = 301, image = 40, N = 5;  // T and N * seq pad over 2 and 4
          StageMemoryOptions o;
          o.precision = p;
          o.tp = tp;
          o.sequence_parallel = true;
          o.recompute = rc;
          for (bool encoder : {false, true}) {
            InMemoryStore store;
            std::vector<size_t> peaks(tp);
            testing::OnRanks(tp, "tp", &store, [&](int rank, Communicator* comm) {
              std::mt19937 rng(7 + rank);
              auto* host = static_cast<CpuBackend*>(cpu);
              host->ResetThreadPeak();
              const size_t before = host->thread_peak_bytes();
              if (encoder) {
                VitEncoder vit(c.vit, comm);
                vit.set_sequence_parallel(true);
                vit.set_recompute(rc);
                vit.params().Initialize(1);
                vit.params().Place(cpu, p);
                const std::vector<float> in =
                    Random(static_cast<size_t>(N) * 3 * c.vit.tile_size * c.vit.tile_size, &rng);
                Projector projector(c);
                projector.params().Initialize(2);
                projector.params().Place(cpu, p);
                std::vector<float> out(static_cast<size_t>(N) * c.vit.patches_per_tile() *
                                       c.vit.dim);
                ASSERT_TRUE(vit.Forward(in.data(), N, out.data()).ok());
                std::vector<float> emb(static_cast<size_t>(N) * c.tokens_per_tile() * c.llm.dim),
                    dout(out.size());
                projector.Forward(out.data(), N, emb.data());
                const std::vector<float> demb = Random(emb.size(), &rng);
                projector.Backward(demb.data(), dout.data());
                ASSERT_TRUE(vit.Backward(dout.data()).ok());
                peaks[rank] = host->thread_peak_bytes() - before;
                return;
              }
              Llm llm(c.llm, comm);
              llm.set_sequence_parallel(true);
              llm.set_recompute(rc);
              llm.params().Initialize(1);
              llm.params().Place(cpu, p);
              std::mt19937 batch_rng(3);  // every rank the same batch
              const LlmBatch b = Batch(T, image, c.llm.vocab, &batch_rng);
              const std::vector<float> emb = Random(static_cast<size_t>(image) * c.llm.dim, &rng);
              std::vector<float> demb(emb.size());
              ASSERT_TRUE(llm.Forward(b, emb.data()).ok());
              ASSERT_TRUE(llm.Backward(1.0f / T, demb.data()).ok());
              peaks[rank] = host->thread_peak_bytes() - before;
            });
            const MemoryEstimate e = encoder ? EncoderStageMemory(c, 0, c.vit.layers, N, 1, o)
                                             : LlmStageMemory(c.llm, 0, c.llm.layers, T, image, o);
            for (int r = 0; r < tp; ++r) {
              // Within 1%, as for one rank (AnLlmStagesBuffersPeakWhereTheModelSays).
              const double measured = static_cast<double>(peaks[r]);
              EXPECT_NEAR(measured, e.buffers, 0.01 * e.buffers)
                  << (encoder ? "encoder" : "LLM") << " rank " << r << ": " << e.ToString();
            }
          }
        }
      }
    }
  }
}

// The same for an encoder stage: the ViT's layers, and on the last stage
// the projector after them, in the worker's order (every forward, then the
// backwards).
TEST(MemoryModelTest, AnEncoderStagesBuffersPeakWhereTheModelSays) {
  Backend* cpu = CpuOps()->backend();
  std::mt19937 rng(9);
  for (bool clip_like : {false, true}) {
    const ModelConfig c = Config(clip_like);
    for (Precision p : {Precision::kFp32, Precision::kBf16}) {
      for (LayerRange r : {LayerRange{0, 3}, LayerRange{0, 1}, LayerRange{1, 3}}) {
        SCOPED_TRACE(std::string(clip_like ? "clip-like " : "") + PrecisionName(p) + " layers [" +
                     std::to_string(r.first) + ", " + std::to_string(r.last) + ")");
        const int N = 6;
        const bool first = r.first == 0, last = r.last == c.vit.layers;
        const size_t rows = static_cast<size_t>(c.vit.seq()) * c.vit.dim;
        const size_t before = cpu->in_use_bytes();
        cpu->ResetPeak();
        {
          VitEncoder vit(c.vit, nullptr, r);
          Projector projector(c);
          vit.params().Initialize(1);
          vit.params().Place(cpu, p);
          if (last) {
            projector.params().Initialize(2);
            projector.params().Place(cpu, p);
          }
          for (int n : {N / 2, N}) {
            const std::vector<float> in =
                first ? Random(static_cast<size_t>(n) * 3 * c.vit.tile_size * c.vit.tile_size, &rng)
                      : Random(n * rows, &rng);
            const size_t out_rows = static_cast<size_t>(n) * c.vit.patches_per_tile();
            std::vector<float> out(last ? out_rows * c.vit.dim : n * rows);
            ASSERT_TRUE(vit.Forward(in.data(), n, out.data()).ok());
            std::vector<float> dvit(out.size());
            if (last) {
              std::vector<float> emb(static_cast<size_t>(n) * c.tokens_per_tile() * c.llm.dim);
              projector.Forward(out.data(), n, emb.data());
              const std::vector<float> demb = Random(emb.size(), &rng);
              projector.Backward(demb.data(), dvit.data());
            } else {
              dvit = Random(out.size(), &rng);
            }
            std::vector<float> din(first ? 0 : in.size());
            ASSERT_TRUE(vit.Backward(dvit.data(), first ? nullptr : din.data()).ok());
          }
        }
        const double measured = static_cast<double>(cpu->peak_bytes() - before);
        StageMemoryOptions o;
        o.precision = p;
        const MemoryEstimate e = EncoderStageMemory(c, r.first, r.last, N, 1, o);
        EXPECT_NEAR(measured, e.buffers, 0.01 * e.buffers) << e.ToString();
      }
    }
  }
}

// Recompute none and selective: a stage keeps its in-flight microbatches'
// activations (SavedActivations), selective less the element-wise outputs.
// Three microbatches of a stage forward (each detached), then backward
// (each attached), peak where the model says for three in flight; and
// selective keeps less than none.
TEST(MemoryModelTest, KeptMicrobatchesPeakWhereTheModelSays) {
  const ModelConfig c = Config(false);
  Backend* cpu = CpuOps()->backend();
  std::mt19937 rng(11);
  constexpr int kInFlight = 3;
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    int64_t kept[3] = {0, 0, 0};
    for (Recompute rc : {Recompute::kNone, Recompute::kSelective}) {
      for (LayerRange r : {LayerRange{0, 2}, LayerRange{2, 4}}) {
        SCOPED_TRACE(std::string(PrecisionName(p)) + " " + RecomputeName(rc) + " LLM layers [" +
                     std::to_string(r.first) + ", " + std::to_string(r.last) + ")");
        const int T = 200, image = r.first == 0 ? 30 : 0;
        const size_t before = cpu->in_use_bytes();
        cpu->ResetPeak();
        {
          Llm llm(c.llm, nullptr, r);
          llm.set_recompute(rc);
          llm.params().Initialize(1);
          llm.params().Place(cpu, p);
          std::vector<LlmBatch> batches;
          std::vector<SavedActivations> saved(kInFlight);
          for (int j = 0; j < kInFlight; ++j) batches.push_back(Batch(T, image, c.llm.vocab, &rng));
          const std::vector<float> emb = Random(static_cast<size_t>(image) * c.llm.dim, &rng);
          const std::vector<float> in = Random(static_cast<size_t>(T) * c.llm.dim, &rng);
          std::vector<float> dout = Random(in.size(), &rng), din(in.size()), demb(emb.size());
          for (int j = 0; j < kInFlight; ++j) {
            ASSERT_TRUE(llm.Forward(batches[j], image > 0 ? emb.data() : nullptr,
                                    r.first == 0 ? nullptr : in.data())
                            .ok());
            saved[j] = llm.Detach();
          }
          for (int j = 0; j < kInFlight; ++j) {
            llm.Attach(&saved[j]);
            ASSERT_TRUE(llm.Backward(1.0f / T, image > 0 ? demb.data() : nullptr,
                                     r.last == c.llm.layers ? nullptr : dout.data(),
                                     r.first == 0 ? nullptr : din.data())
                            .ok());
          }
        }
        const double measured = static_cast<double>(cpu->peak_bytes() - before);
        StageMemoryOptions o;
        o.precision = p;
        o.recompute = rc;
        o.in_flight = kInFlight;
        const MemoryEstimate e = LlmStageMemory(c.llm, r.first, r.last, T, image, o);
        EXPECT_NEAR(measured, e.buffers, 0.01 * e.buffers) << e.ToString();
        if (r.first == 0) kept[static_cast<int>(rc)] = e.activations;
      }
      // The encoder's last stage, its ViT and projector kept for 3 bins.
      SCOPED_TRACE(std::string(PrecisionName(p)) + " " + RecomputeName(rc) + " encoder");
      const int N = 4;
      const LayerRange r{1, c.vit.layers};
      const size_t rows = static_cast<size_t>(c.vit.seq()) * c.vit.dim;
      const size_t before = cpu->in_use_bytes();
      cpu->ResetPeak();
      {
        VitEncoder vit(c.vit, nullptr, r);
        Projector projector(c);
        vit.set_recompute(rc);
        for (ParamSet* set : {&vit.params(), &projector.params()}) {
          set->Initialize(1);
          set->Place(cpu, p);
        }
        const std::vector<float> in = Random(N * rows, &rng);
        const size_t out_rows = static_cast<size_t>(N) * c.vit.patches_per_tile();
        std::vector<float> out(out_rows * c.vit.dim), dvit(out.size()), din(in.size());
        std::vector<float> emb(static_cast<size_t>(N) * c.tokens_per_tile() * c.llm.dim);
        const std::vector<float> demb = Random(emb.size(), &rng);
        std::vector<std::pair<SavedActivations, SavedActivations>> saved(kInFlight);
        for (int j = 0; j < kInFlight; ++j) {
          ASSERT_TRUE(vit.Forward(in.data(), N, out.data()).ok());
          projector.Forward(out.data(), N, emb.data());
          saved[j] = {vit.Detach(), projector.Detach()};
        }
        for (int j = 0; j < kInFlight; ++j) {
          vit.Attach(&saved[j].first);
          projector.Attach(&saved[j].second);
          projector.Backward(demb.data(), dvit.data());
          ASSERT_TRUE(vit.Backward(dvit.data(), din.data()).ok());
        }
      }
      const double measured = static_cast<double>(cpu->peak_bytes() - before);
      StageMemoryOptions o;
      o.precision = p;
      o.recompute = rc;
      const MemoryEstimate e = EncoderStageMemory(c, r.first, r.last, N, kInFlight, o);
      EXPECT_NEAR(measured, e.buffers, 0.01 * e.buffers) << e.ToString();
    }
    EXPECT_LT(kept[static_cast<int>(Recompute::kSelective)],
              kept[static_cast<int>(Recompute::kNone)]);
  }
}

// What each part scales with: sharding divides the moments, bf16 halves
// the kept activations, a frozen module holds neither gradients nor
// moments, the logits live on the last stage only.
TEST(MemoryModelTest, ThePartsFollowPrecisionShardingAndStage) {
  const ModelConfig c = Config(false);
  StageMemoryOptions o;
  const MemoryEstimate whole = LlmStageMemory(c.llm, 0, 4, 1024, 0, o);
  o.optimizer_shards = 4;
  const MemoryEstimate sharded = LlmStageMemory(c.llm, 0, 4, 1024, 0, o);
  EXPECT_EQ(sharded.moments, (whole.moments / 8 + 3) / 4 * 8);
  EXPECT_EQ(sharded.weights, whole.weights);
  o = {};
  o.precision = Precision::kBf16;
  const MemoryEstimate bf16 = LlmStageMemory(c.llm, 0, 4, 1024, 0, o);
  // One fp32 working layer besides the bf16 stash: about half the bytes
  // once there are many layers.
  EXPECT_LT(bf16.activations, whole.activations);
  LlmConfig deep = c.llm;
  deep.layers = 32;
  const MemoryEstimate deep_bf16 = LlmStageMemory(deep, 0, 32, 1024, 0, o);
  o.precision = Precision::kFp32;
  const MemoryEstimate deep_fp32 = LlmStageMemory(deep, 0, 32, 1024, 0, o);
  EXPECT_LT(deep_bf16.activations, 0.55 * deep_fp32.activations);
  o.precision = Precision::kBf16;
  EXPECT_EQ(bf16.bf16_weights, whole.weights / 2);
  EXPECT_GT(bf16.scratch, 0);
  EXPECT_EQ(whole.scratch, 0);
  o = {};
  o.frozen = true;
  const MemoryEstimate frozen = LlmStageMemory(c.llm, 0, 4, 1024, 0, o);
  EXPECT_EQ(frozen.grads + frozen.moments, 0);
  o = {};
  const MemoryEstimate first = LlmStageMemory(c.llm, 0, 2, 1024, 0, o);
  const MemoryEstimate last = LlmStageMemory(c.llm, 2, 4, 1024, 0, o);
  EXPECT_GT(last.workspace, first.workspace + 1024 * c.llm.vocab * 4);
  // Activations grow linearly in the tokens (attention keeps O(L) per head).
  const MemoryEstimate longer = LlmStageMemory(c.llm, 0, 4, 4096, 0, o);
  EXPECT_EQ(longer.activations, 4 * whole.activations);
  // On a GPU everything counted is the device's: the moments only where
  // the optimizer steps there.
  o.device = true;
  const MemoryEstimate gpu = LlmStageMemory(c.llm, 0, 4, 1024, 0, o);
  EXPECT_EQ(gpu.total(), gpu.buffers);
  EXPECT_EQ(gpu.moments, 0);
  o.optimizer_on_device = true;
  const MemoryEstimate gpu_optimizer = LlmStageMemory(c.llm, 0, 4, 1024, 0, o);
  EXPECT_EQ(gpu_optimizer.moments, whole.moments);
  EXPECT_EQ(gpu_optimizer.total(), gpu_optimizer.buffers);
}

}  // namespace
}  // namespace loom
