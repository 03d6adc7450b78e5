#include "runtime/scheduling/profile.h"

#include <cmath>

#include "gtest/gtest.h"
#include "runtime/model/config.h"
#include "runtime/model/memory.h"
#include "runtime/model/ops.h"
#include "runtime/scheduling/plan.h"
#include "runtime/scheduling/profile_comm.h"

namespace loom::sched {
namespace {

// The fitter recovers exact coefficients, and drops a negative one (the
// rest refitted without it).
TEST(ProfileTest, TheFitRecoversCoefficientsAndKeepsThemNonNegative) {
  std::vector<std::vector<double>> x;
  std::vector<double> y;
  for (double t : {128.0, 256.0, 512.0, 1024.0}) {
    for (double sq : {t * t, t * t / 4}) {
      x.push_back({t, sq});
      y.push_back(2e-6 * t + 3e-9 * sq);
    }
  }
  std::vector<double> c = FitNonNegative(x, y);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_NEAR(c[0], 2e-6, 1e-12);
  EXPECT_NEAR(c[1], 3e-9, 1e-15);
  // y falls with the second column: its coefficient would be negative.
  for (size_t i = 0; i < x.size(); ++i) y[i] = 1e-6 * x[i][0] - 1e-10 * x[i][1];
  c = FitNonNegative(x, y);
  EXPECT_EQ(c[1], 0.0);
  EXPECT_GT(c[0], 0.0);
  EXPECT_TRUE(FitNonNegative({}, {}).empty());
  // Columns the rows cannot tell apart (one tile count: tiles and the
  // constant): the last is left out and the rest still fit.
  c = FitNonNegative({{4, 1}, {4, 1}}, {2, 2});
  ASSERT_EQ(c.size(), 2u);
  EXPECT_DOUBLE_EQ(c[0], 0.5);
  EXPECT_EQ(c[1], 0.0);
}

// The tiny model's real layers on the CPU: one point per encoder bin and
// two per LLM token count, positive coefficients, each point's fitted time
// the coefficients' and the residuals the largest misfit.
TEST(ProfileTest, TheTinyModelsModulesAreTimedAndFitted) {
  absl::StatusOr<ModelConfig> model = ModelConfigByName("tiny");
  ASSERT_TRUE(model.ok());
  ProfileOptions o;
  o.tiles = {1, 2, 4};
  o.tokens = {32, 64, 128};
  o.repeats = 2;
  absl::StatusOr<scheduler::v1::Profile> p = ProfileModules(*model, CpuOps(), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->model(), "tiny");
  EXPECT_EQ(p->tp(), 1);
  ASSERT_EQ(p->points_size(), 3 + 2 * 3);
  EXPECT_EQ(p->comm_size(), 2 * 2 + 4);  // this host's communication (below)
  // Non-negative, and not all zero for a module (its times are positive, so
  // a zero fit is never the least-squares one). Which terms carry the time
  // depends on the machine's load (CI once fitted the encoder per sample
  // alone), so no single coefficient is asserted positive.
  for (double c : {p->encoder_per_sample(), p->encoder_per_tile(), p->llm_per_sample(),
                   p->llm_per_token(), p->llm_per_token_sq()}) {
    EXPECT_GE(c, 0);
  }
  EXPECT_GT(p->encoder_per_sample() + p->encoder_per_tile(), 0);
  EXPECT_GT(p->llm_per_sample() + p->llm_per_token() + p->llm_per_token_sq(), 0);
  double worst_e = 0, worst_l = 0;
  for (const auto& pt : p->points()) {
    EXPECT_GT(pt.seconds(), 0) << pt.DebugString();
    EXPECT_GT(pt.peak_bytes(), 0) << pt.DebugString();  // activations through the backend
    // The forward is timed on its own. Whether it comes out below forward +
    // backward depends on this machine's load, so that is not asserted; the
    // share the plan reads is clamped to 1 (below).
    EXPECT_GT(pt.forward_seconds(), 0) << pt.DebugString();
    EXPECT_GT(pt.frozen_seconds(), 0) << pt.DebugString();  // timed frozen too
    const double want = pt.module() == "encoder"
                            ? p->encoder_per_sample() + p->encoder_per_tile() * pt.tiles()
                            : p->llm_per_sample() * pt.sequences() +
                                  p->llm_per_token() * pt.tokens() +
                                  p->llm_per_token_sq() * pt.token_sq();
    EXPECT_DOUBLE_EQ(pt.fitted_seconds(), want);
    const double r = std::abs(pt.fitted_seconds() - pt.seconds()) / pt.seconds();
    (pt.module() == "encoder" ? worst_e : worst_l) =
        std::max(pt.module() == "encoder" ? worst_e : worst_l, r);
    if (pt.module() == "llm") {
      EXPECT_DOUBLE_EQ(pt.token_sq(),
                       static_cast<double>(pt.tokens()) * pt.tokens() / pt.sequences());
    }
  }
  for (double share : {p->encoder_forward_share(), p->llm_forward_share(),
                       p->encoder_vision_frozen_share(), p->llm_frozen_share()}) {
    EXPECT_GT(share, 0);
    EXPECT_LE(share, 1);
  }
  EXPECT_DOUBLE_EQ(p->encoder_max_residual(), worst_e);
  EXPECT_DOUBLE_EQ(p->llm_max_residual(), worst_l);
  // Bigger bins hold more activations (memory, unlike time, does not depend
  // on the machine's load).
  EXPECT_LT(p->points(0).peak_bytes(), p->points(2).peak_bytes());

  scheduler::v1::Plan plan;
  plan.mutable_encoder()->set_tp(1);
  plan.mutable_llm()->set_tp(1);
  ASSERT_TRUE(ApplyProfile(*p, &plan).ok());
  EXPECT_EQ(plan.costs().llm_per_token(), p->llm_per_token());
  EXPECT_EQ(plan.costs().llm_per_sample(), p->llm_per_sample());
  EXPECT_EQ(plan.costs().encoder_per_tile(), p->encoder_per_tile());
  EXPECT_EQ(plan.costs().llm_forward_share(), p->llm_forward_share());
  plan.mutable_llm()->set_tp(2);
  absl::Status s = ApplyProfile(*p, &plan);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("llm_tp is 2"), std::string::npos) << s;
  // Asked to, it scales the LLM's coefficients by the planner's TP model and
  // says so; the encoder (TP 1, measured) keeps the profile's.
  std::string scaled;
  ASSERT_TRUE(ApplyProfile(*p, &plan, &scaled).ok());
  EXPECT_EQ(scaled, "llm TP 2 scaled from the profile's TP 1");
  EXPECT_DOUBLE_EQ(plan.costs().llm_per_token(), p->llm_per_token() / (2 * TpEfficiency(2)));
  EXPECT_EQ(plan.costs().encoder_per_tile(), p->encoder_per_tile());
  EXPECT_LE(plan.costs().llm_per_token(), p->llm_per_token());  // 0 stays 0

  // Frozen modules (LLaVA's stage 1: the ViT and the LLM): each priced by
  // its frozen share of the trained pass, the forward's share of that
  // pass; the projector frozen too leaves the encoder its forward alone.
  plan.mutable_llm()->set_tp(1);
  Frozen stage1;
  stage1.vision = stage1.llm = true;
  ASSERT_TRUE(ApplyProfile(*p, &plan, nullptr, stage1).ok());
  EXPECT_EQ(plan.costs().encoder_per_tile(), p->encoder_frozen_per_tile());
  EXPECT_EQ(plan.costs().llm_per_token(), p->llm_frozen_per_token());
  EXPECT_EQ(plan.costs().llm_per_token_sq(), p->llm_frozen_per_token_sq());
  EXPECT_DOUBLE_EQ(plan.costs().llm_forward_share(),
                   std::min(1.0, p->llm_forward_share() / p->llm_frozen_share()));
  // The frozen ViT's output is kept: a recompute is the projector's forward.
  EXPECT_GT(p->encoder_frozen_recompute_ratio(), 0);
  EXPECT_LE(p->encoder_frozen_recompute_ratio(), 1);
  EXPECT_EQ(plan.costs().encoder_recompute_ratio(), p->encoder_frozen_recompute_ratio());
  for (const auto& pt : p->points()) {
    if (pt.module() == "encoder") {
      EXPECT_GT(pt.projector_forward_seconds(), 0);
    }
  }
  // The projector frozen too: the encoder's forward alone, no recompute.
  Frozen encoder;
  encoder.vision = encoder.projector = true;
  ASSERT_TRUE(ApplyProfile(*p, &plan, nullptr, encoder).ok());
  EXPECT_DOUBLE_EQ(plan.costs().encoder_per_tile(),
                   p->encoder_per_tile() * p->encoder_forward_share());
  EXPECT_DOUBLE_EQ(plan.costs().encoder_forward_share(), 1.0);
  EXPECT_LT(plan.costs().encoder_recompute_ratio(), 1e-6);
  EXPECT_EQ(plan.costs().llm_per_token(), p->llm_per_token());
  // A profile without frozen points cannot price a frozen module.
  scheduler::v1::Profile old = *p;
  old.set_llm_frozen_share(0);
  s = ApplyProfile(old, &plan, nullptr, stage1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("no frozen points"), std::string::npos) << s;
}

// Two bins a module, one timed run each: the grid the tests below need.
ProfileOptions SmallGrid() {
  ProfileOptions o;
  o.tiles = {1, 2};
  o.tokens = {32, 64};
  o.repeats = 1;
  o.communication = false;
  return o;
}

// bf16 mixed precision: the option reaches the profile (its label) and the
// grid runs on the layers' bf16 path. That the path rounds as bf16 is the
// precision tests' (precision_training_test); a bin's time is no evidence
// (timings are not asserted).
TEST(ProfileTest, Bf16IsProfiledAsSuch) {
  absl::StatusOr<ModelConfig> model = ModelConfigByName("tiny");
  ASSERT_TRUE(model.ok());
  ProfileOptions o = SmallGrid();
  o.precision = Precision::kBf16;
  absl::StatusOr<scheduler::v1::Profile> p = ProfileModules(*model, CpuOps(), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->precision(), "bf16");
  ASSERT_EQ(p->points_size(), 2 + 2 * 2);
  for (const auto& pt : p->points()) EXPECT_GT(pt.seconds(), 0) << pt.DebugString();
  o.precision = Precision::kFp32;
  absl::StatusOr<scheduler::v1::Profile> f = ProfileModules(*model, CpuOps(), o);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->precision(), "fp32");
}

// TP 2 measured (the group's ranks as threads over Gloo): its own points
// and fit in at_tp, which prices a module at TP 2 exactly, unscaled.
TEST(ProfileTest, ATpGroupIsMeasuredAsItsRanks) {
  absl::StatusOr<ModelConfig> model = ModelConfigByName("tiny");
  ASSERT_TRUE(model.ok());
  ProfileOptions o = SmallGrid();
  o.tps = {1, 2};
  absl::StatusOr<scheduler::v1::Profile> p = ProfileModules(*model, CpuOps(), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tp(), 1);
  ASSERT_EQ(p->at_tp_size(), 1);
  const scheduler::v1::Profile& two = p->at_tp(0);
  EXPECT_EQ(two.tp(), 2);
  EXPECT_EQ(two.at_tp_size(), 0);
  ASSERT_EQ(two.points_size(), p->points_size());
  for (const auto& pt : two.points()) EXPECT_GT(pt.seconds(), 0) << pt.DebugString();
  // (Which term carries a bin this small is the fit's call.)
  EXPECT_GT(two.encoder_per_tile() + two.encoder_per_sample(), 0);
  EXPECT_GT(two.llm_per_token() + two.llm_per_sample(), 0);
  scheduler::v1::Plan plan;
  plan.mutable_encoder()->set_tp(1);
  plan.mutable_llm()->set_tp(2);
  std::string scaled = "?";
  ASSERT_TRUE(ApplyProfile(*p, &plan, &scaled).ok());
  EXPECT_EQ(scaled, "");
  EXPECT_EQ(plan.costs().llm_per_token(), two.llm_per_token());
  EXPECT_EQ(plan.costs().llm_forward_share(), two.llm_forward_share());
  EXPECT_EQ(plan.costs().encoder_per_tile(), p->encoder_per_tile());
  plan.mutable_llm()->set_tp(4);  // not measured: named with what was
  absl::Status s = ApplyProfile(*p, &plan);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("measured TP 1, 2; the plan's llm_tp is 4"), std::string::npos) << s;
  // A TP the model's heads cannot split, or one twice, is refused up front.
  o.tps = {1, 3};
  EXPECT_EQ(ProfileModules(*model, CpuOps(), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.tps = {2, 2};
  EXPECT_EQ(ProfileModules(*model, CpuOps(), o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ProfileTest, BadGridsAreNamed) {
  absl::StatusOr<ModelConfig> model = ModelConfigByName("tiny");
  ASSERT_TRUE(model.ok());
  ProfileOptions o;
  o.tokens = {30};
  absl::StatusOr<scheduler::v1::Profile> p = ProfileModules(*model, CpuOps(), o);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("30 tokens per bin"), std::string::npos) << p.status();
  o = ProfileOptions();
  o.tokens = {model->llm.max_seq + 4};
  EXPECT_EQ(ProfileModules(*model, CpuOps(), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = ProfileOptions();
  o.repeats = 0;
  EXPECT_EQ(ProfileModules(*model, CpuOps(), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = ProfileOptions();
  o.allreduce_ranks = {2, 1};
  p = ProfileModules(*model, CpuOps(), o);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("all-reduce over 1 ranks"), std::string::npos) << p.status();
}

// This host's communication: all-reduces of each module's gradient size
// over 2 and 4 ranks (Gloo), transfers between two UCX workers, each fit
// as the proto says; a plan's all-reduces and its embeddings' transfer
// priced by them, a frozen set's gradient left out.
TEST(ProfileTest, CommunicationIsMeasuredFittedAndPricesAPlan) {
  absl::StatusOr<ModelConfig> model = ModelConfigByName("tiny");
  ASSERT_TRUE(model.ok());
  scheduler::v1::Profile p;
  CommProfileOptions o;
  o.repeats = 2;
  ASSERT_TRUE(ProfileCommunication(*model, o, &p).ok());
  EXPECT_EQ(p.vision_gradient_bytes(), 4 * VitStageParameters(model->vit, 0, model->vit.layers, 1));
  EXPECT_EQ(p.projector_gradient_bytes(), 4 * ProjectorParameters(*model));
  EXPECT_EQ(p.llm_gradient_bytes(), 4 * LlmStageParameters(model->llm, 0, model->llm.layers, 1));
  EXPECT_EQ(p.embedding_bytes_per_image_token(), 4 * model->llm.dim);
  int allreduces = 0, transfers = 0;
  for (const scheduler::v1::CommPoint& pt : p.comm()) {
    EXPECT_GT(pt.seconds(), 0) << pt.DebugString();
    const double b = static_cast<double>(pt.bytes());
    if (pt.kind() == "allreduce") {
      ++allreduces;
      EXPECT_TRUE(pt.ranks() == 2 || pt.ranks() == 4) << pt.DebugString();
      EXPECT_DOUBLE_EQ(pt.fitted_seconds(),
                       p.allreduce_latency_seconds() * 2 * (pt.ranks() - 1) +
                           p.allreduce_seconds_per_byte() * 2 * (pt.ranks() - 1) / pt.ranks() * b);
    } else {
      ++transfers;
      EXPECT_EQ(pt.kind(), "transfer");
      EXPECT_DOUBLE_EQ(pt.fitted_seconds(),
                       p.transfer_latency_seconds() + p.transfer_seconds_per_byte() * b);
    }
  }
  EXPECT_EQ(allreduces, 2 * 2);  // two sizes (the modules') over two group sizes
  EXPECT_EQ(transfers, 4);
  for (double c : {p.allreduce_latency_seconds(), p.allreduce_seconds_per_byte(),
                   p.transfer_latency_seconds(), p.transfer_seconds_per_byte()}) {
    EXPECT_GE(c, 0);
  }
  // Not asserted positive one by one: a loaded machine can hand a term's
  // time to the other. Some time is fitted to each kind.
  EXPECT_GT(p.allreduce_latency_seconds() + p.allreduce_seconds_per_byte(), 0);
  EXPECT_GT(p.transfer_latency_seconds() + p.transfer_seconds_per_byte(), 0);

  scheduler::v1::Plan plan;
  for (scheduler::v1::ModulePlan* m : {plan.mutable_encoder(), plan.mutable_llm()}) {
    m->set_tp(2);
    m->set_pp(1);
    m->set_dp(4);
  }
  ASSERT_TRUE(ApplyProfileCommunication(p, {}, &plan));
  const double ring = 2.0 * 3 / 4;
  EXPECT_DOUBLE_EQ(
      plan.llm().allreduce_seconds(),
      p.allreduce_latency_seconds() * 6 +
          p.allreduce_seconds_per_byte() * ring * static_cast<double>(p.llm_gradient_bytes()) / 2);
  // The ViT's layers split over TP, the projector whole on every rank.
  EXPECT_DOUBLE_EQ(
      plan.encoder().allreduce_seconds(),
      p.allreduce_latency_seconds() * 6 + p.allreduce_seconds_per_byte() * ring *
                                              (static_cast<double>(p.vision_gradient_bytes()) / 2 +
                                               static_cast<double>(p.projector_gradient_bytes())));
  // A bin's embeddings go to both of the LLM's TP ranks.
  EXPECT_DOUBLE_EQ(plan.costs().transfer_per_image_token(),
                   p.transfer_seconds_per_byte() * 4 * model->llm.dim * 2);
  // LLaVA's stage 1: the ViT and the LLM frozen, the projector's gradient
  // alone reduced.
  Frozen stage1;
  stage1.vision = stage1.llm = true;
  ASSERT_TRUE(ApplyProfileCommunication(p, stage1, &plan));
  EXPECT_EQ(plan.llm().allreduce_seconds(), 0);
  EXPECT_DOUBLE_EQ(
      plan.encoder().allreduce_seconds(),
      p.allreduce_latency_seconds() * 6 + p.allreduce_seconds_per_byte() * ring *
                                              static_cast<double>(p.projector_gradient_bytes()));
  // A profile without communication leaves a plan as it was.
  scheduler::v1::Plan untouched = plan;
  EXPECT_FALSE(ApplyProfileCommunication(scheduler::v1::Profile(), {}, &untouched));
  EXPECT_EQ(untouched.DebugString(), plan.DebugString());
}

}  // namespace
}  // namespace loom::sched
