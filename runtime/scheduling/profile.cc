#include "runtime/scheduling/profile.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "runtime/base/file.h"
#include "runtime/base/rng.h"
#include "runtime/base/stats.h"
#include "runtime/comm/collective.h"
#include "runtime/model/llm.h"
#include "runtime/model/precision.h"
#include "runtime/model/projector.h"
#include "runtime/model/vit.h"
#include "runtime/scheduling/cost_model.h"
#include "runtime/scheduling/plan.h"
#include "runtime/scheduling/profile_comm.h"
#include "runtime/tensor/buffer.h"

namespace loom::sched {
namespace {

// A recompute ratio that says none (CostCoefficients: 0 is read as unset,
// that is 1).
constexpr double kNoRecompute = 1e-9;

// The least-squares coefficients of rows (x, y) over the columns `use` (the
// others' coefficients 0), from the normal equations. A column that is zero in
// every row keeps coefficient 0; while the system is singular (columns that
// the rows cannot tell apart, e.g. a grid of one tile count), its last
// column is left out too.
std::vector<double> LeastSquares(const std::vector<std::vector<double>>& x,
                                 const std::vector<double>& y, const std::vector<bool>& use) {
  std::vector<size_t> cols;
  for (size_t j = 0; j < use.size(); ++j) {
    bool nonzero = false;
    for (const auto& row : x) nonzero = nonzero || row[j] != 0;
    if (use[j] && nonzero) cols.push_back(j);
  }
  std::vector<double> c(use.size(), 0.0);
  for (; !cols.empty(); cols.pop_back()) {
    const size_t k = cols.size();
    std::vector<std::vector<double>> a(k, std::vector<double>(k, 0.0));
    std::vector<double> b(k, 0.0), solved;
    for (size_t r = 0; r < x.size(); ++r) {
      for (size_t i = 0; i < k; ++i) {
        for (size_t j = 0; j < k; ++j) a[i][j] += x[r][cols[i]] * x[r][cols[j]];
        b[i] += x[r][cols[i]] * y[r];
      }
    }
    if (!SolveLinear(std::move(a), std::move(b), &solved)) continue;
    for (size_t i = 0; i < k; ++i) c[cols[i]] = solved[i];
    break;
  }
  return c;
}

// The median seconds of `repeats` runs of `run` after one warm-up, and the
// backend's peak above what it held before the first.
absl::StatusOr<std::pair<double, int64_t>> Time(Backend* backend, int repeats,
                                                const std::function<absl::Status()>& run) {
  backend->Synchronize();
  const size_t before = backend->in_use_bytes();
  backend->ResetPeak();
  if (absl::Status s = run(); !s.ok()) return s;
  backend->Synchronize();
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = run(); !s.ok()) return s;
    backend->Synchronize();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const size_t peak = backend->peak_bytes();
  return std::make_pair(Median(seconds), static_cast<int64_t>(peak > before ? peak - before : 0));
}

// Random host values, uploaded.
Buffer<float> Random(Backend* backend, size_t n, Rng* rng) {
  std::vector<float> host(n);
  for (float& v : host) v = static_cast<float>(rng->Normal() * 0.5);
  Buffer<float> b(backend);
  b.CopyFromHost(host.data(), n);
  return b;
}

// An encoder bin of `n` tiles: random pixels in and embeddings' gradient
// back, the tower's output, the embeddings and the tower output's gradient.
struct EncoderBin {
  EncoderBin(const ModelConfig& model, Backend* backend, int n, Rng* rng)
      : in(Random(backend, static_cast<size_t>(n) * 3 * model.vit.tile_size * model.vit.tile_size,
                  rng)),
        demb(
            Random(backend, static_cast<size_t>(n) * model.tokens_per_tile() * model.llm.dim, rng)),
        out(backend),
        embs(backend),
        dvit(backend) {
    out.resize(static_cast<size_t>(n) * model.vit.patches_per_tile() * model.vit.dim);
    embs.resize(demb.size());
    dvit.resize(out.size());
  }
  Buffer<float> in, demb, out, embs, dvit;
};

// `sequences` text samples of `tokens` / `sequences` tokens each, packed.
LlmBatch TextBatch(int tokens, int sequences, int vocab, Rng* rng) {
  LlmBatch b;
  const int each = tokens / sequences;
  b.cu_seqlens.push_back(0);
  for (int s = 0; s < sequences; ++s) {
    for (int i = 0; i < each; ++i) {
      b.tokens.push_back(static_cast<int32_t>(rng->UniformInt(0, vocab - 1)));
      b.positions.push_back(i);
      b.targets.push_back(i + 1 < each ? static_cast<int32_t>(rng->UniformInt(0, vocab - 1)) : -1);
    }
    b.cu_seqlens.push_back(b.cu_seqlens.back() + each);
  }
  return b;
}

double MaxResidual(const scheduler::v1::Profile& p, const std::string& module) {
  double worst = 0;
  for (const auto& pt : p.points()) {
    if (pt.module() != module || pt.seconds() <= 0) continue;
    worst = std::max(worst, std::abs(pt.fitted_seconds() - pt.seconds()) / pt.seconds());
  }
  return worst;
}

// The median over `module`'s points of a part of forward + backward: the
// forward alone (`frozen` false) or the frozen pass.
double Share(const scheduler::v1::Profile& p, const std::string& module, bool frozen) {
  std::vector<double> shares;
  for (const auto& pt : p.points()) {
    if (pt.module() == module && pt.seconds() > 0) {
      const double part = frozen ? pt.frozen_seconds() : pt.forward_seconds();
      shares.push_back(std::min(1.0, part / pt.seconds()));
    }
  }
  return shares.empty() ? 0 : Median(shares);
}

}  // namespace

std::vector<double> FitNonNegative(const std::vector<std::vector<double>>& x,
                                   const std::vector<double>& y) {
  if (x.empty()) return {};
  std::vector<bool> use(x[0].size(), true);
  for (;;) {
    std::vector<double> c = LeastSquares(x, y, use);
    bool dropped = false;
    for (size_t j = 0; j < c.size(); ++j) {
      if (use[j] && c[j] < 0) {
        use[j] = false;
        dropped = true;
      }
    }
    if (!dropped) return c;
  }
}

namespace {

// The grid on one rank of a TP group (`tp` null: TP 1).
absl::StatusOr<scheduler::v1::Profile> ProfileRank(const ModelConfig& model, Ops* ops,
                                                   const ProfileOptions& options,
                                                   Communicator* tp) {
  Backend* backend = ops->backend();
  Rng rng(options.seed);
  scheduler::v1::Profile profile;
  profile.set_model(model.name);
  profile.set_device(backend->name());
  profile.set_tp(tp == nullptr ? 1 : tp->size());
  profile.set_repeats(options.repeats);
  profile.set_precision(PrecisionName(options.precision));

  VitEncoder vit(model.vit, tp, {}, ops);
  Projector projector(model, ops);
  Llm llm(model.llm, tp, {}, ops);
  for (ParamSet* p : {&vit.params(), &projector.params(), &llm.params()}) {
    p->Initialize(options.seed);
    p->Place(backend, options.precision, /*optimizer_on_device=*/true);
  }

  // The encoder: a bin's tiles through the ViT and the projector, and back.
  std::vector<scheduler::v1::ProfilePoint*> encoder_points, llm_points;
  std::vector<std::vector<double>> ex, lx;
  std::vector<double> ey, ly;
  for (int n : options.tiles) {
    EncoderBin bin(model, backend, n, &rng);
    absl::StatusOr<std::pair<double, int64_t>> t = Time(backend, options.repeats, [&] {
      if (absl::Status s = vit.Forward(bin.in.data(), n, bin.out.data()); !s.ok()) return s;
      projector.Forward(bin.out.data(), n, bin.embs.data());
      projector.Backward(bin.demb.data(), bin.dvit.data());
      return vit.Backward(bin.dvit.data());
    });
    if (!t.ok()) return t.status();
    absl::StatusOr<std::pair<double, int64_t>> f = Time(backend, options.repeats, [&] {
      if (absl::Status s = vit.Forward(bin.in.data(), n, bin.out.data()); !s.ok()) return s;
      projector.Forward(bin.out.data(), n, bin.embs.data());
      return absl::OkStatus();
    });
    if (!f.ok()) return f.status();
    scheduler::v1::ProfilePoint* pt = profile.add_points();
    encoder_points.push_back(pt);
    pt->set_module("encoder");
    pt->set_tiles(n);
    pt->set_seconds(t->first);
    pt->set_forward_seconds(f->first);
    pt->set_peak_bytes(t->second);
    ex.push_back({static_cast<double>(n), 1.0});
    ey.push_back(t->first);
  }
  // The LLM: each token count as one sample and as four.
  for (int tokens : options.tokens) {
    for (int sequences : {1, 4}) {
      const LlmBatch batch = TextBatch(tokens, sequences, model.llm.vocab, &rng);
      const double each = static_cast<double>(tokens / sequences);
      const double token_sq = sequences * each * each;
      absl::StatusOr<std::pair<double, int64_t>> t = Time(backend, options.repeats, [&] {
        if (absl::Status s = llm.Forward(batch, nullptr); !s.ok()) return s;
        return llm.Backward(1.0f / static_cast<float>(tokens), nullptr).status();
      });
      if (!t.ok()) return t.status();
      // The forward alone (its activations dropped unused).
      absl::StatusOr<std::pair<double, int64_t>> f =
          Time(backend, options.repeats, [&] { return llm.Forward(batch, nullptr); });
      if (!f.ok()) return f.status();
      scheduler::v1::ProfilePoint* pt = profile.add_points();
      llm_points.push_back(pt);
      pt->set_module("llm");
      pt->set_tokens(tokens);
      pt->set_sequences(sequences);
      pt->set_token_sq(token_sq);
      pt->set_seconds(t->first);
      pt->set_forward_seconds(f->first);
      pt->set_peak_bytes(t->second);
      lx.push_back({static_cast<double>(tokens), token_sq, static_cast<double>(sequences)});
      ly.push_back(t->first);
    }
  }
  // Frozen, as the workers run a frozen module: the ViT's forward alone,
  // the projector still training; the LLM's input gradient without weight
  // gradients. Each point again, the modules frozen now (for good: the
  // trained points are done).
  vit.params().Freeze();
  llm.params().Freeze();
  std::vector<double> efy, lfy;  // the frozen passes' seconds, as ey and ly
  for (size_t i = 0; i < options.tiles.size(); ++i) {
    const int n = options.tiles[i];
    EncoderBin bin(model, backend, n, &rng);
    absl::StatusOr<std::pair<double, int64_t>> t = Time(backend, options.repeats, [&] {
      if (absl::Status s = vit.Forward(bin.in.data(), n, bin.out.data()); !s.ok()) return s;
      projector.Forward(bin.out.data(), n, bin.embs.data());
      projector.Backward(bin.demb.data(), nullptr);
      return absl::OkStatus();
    });
    if (!t.ok()) return t.status();
    absl::StatusOr<std::pair<double, int64_t>> p = Time(backend, options.repeats, [&] {
      projector.Forward(bin.out.data(), n, bin.embs.data());
      return absl::OkStatus();
    });
    if (!p.ok()) return p.status();
    encoder_points[i]->set_frozen_seconds(t->first);
    encoder_points[i]->set_projector_forward_seconds(p->first);
    efy.push_back(t->first);
  }
  size_t k = 0;
  for (int tokens : options.tokens) {
    for (int sequences : {1, 4}) {
      const LlmBatch batch = TextBatch(tokens, sequences, model.llm.vocab, &rng);
      absl::StatusOr<std::pair<double, int64_t>> t = Time(backend, options.repeats, [&] {
        if (absl::Status s = llm.Forward(batch, nullptr); !s.ok()) return s;
        return llm.Backward(1.0f / static_cast<float>(tokens), nullptr).status();
      });
      if (!t.ok()) return t.status();
      llm_points[k++]->set_frozen_seconds(t->first);
      lfy.push_back(t->first);
    }
  }
  const std::vector<double> ec = FitNonNegative(ex, ey), lc = FitNonNegative(lx, ly);
  profile.set_encoder_per_tile(ec[0]);
  profile.set_encoder_per_sample(ec[1]);
  profile.set_llm_per_token(lc[0]);
  profile.set_llm_per_token_sq(lc[1]);
  profile.set_llm_per_sample(lc[2]);
  for (auto& pt : *profile.mutable_points()) {
    pt.set_fitted_seconds(pt.module() == "encoder"
                              ? ec[1] + ec[0] * pt.tiles()
                              : lc[2] * pt.sequences() + lc[0] * static_cast<double>(pt.tokens()) +
                                    lc[1] * pt.token_sq());
  }
  profile.set_encoder_forward_share(Share(profile, "encoder", false));
  profile.set_llm_forward_share(Share(profile, "llm", false));
  profile.set_encoder_vision_frozen_share(Share(profile, "encoder", true));
  profile.set_llm_frozen_share(Share(profile, "llm", true));
  const std::vector<double> efc = FitNonNegative(ex, efy), lfc = FitNonNegative(lx, lfy);
  profile.set_encoder_frozen_per_tile(efc[0]);
  profile.set_encoder_frozen_per_sample(efc[1]);
  profile.set_llm_frozen_per_token(lfc[0]);
  profile.set_llm_frozen_per_token_sq(lfc[1]);
  profile.set_llm_frozen_per_sample(lfc[2]);
  std::vector<double> ratios;
  for (const auto& pt : profile.points()) {
    if (pt.module() == "encoder" && pt.forward_seconds() > 0) {
      ratios.push_back(std::min(1.0, pt.projector_forward_seconds() / pt.forward_seconds()));
    }
  }
  profile.set_encoder_frozen_recompute_ratio(ratios.empty() ? 0 : Median(ratios));
  profile.set_encoder_max_residual(MaxResidual(profile, "encoder"));
  profile.set_llm_max_residual(MaxResidual(profile, "llm"));
  return profile;
}

// The grid at TP `tp`: its ranks as threads with Gloo over an in-memory
// rendezvous, rank 0's profile.
absl::StatusOr<scheduler::v1::Profile> ProfileAtTp(const ModelConfig& model, Ops* ops,
                                                   const ProfileOptions& options, int tp) {
  if (tp == 1) return ProfileRank(model, ops, options, nullptr);
  scheduler::v1::Profile rank0;
  InMemoryStore store;
  if (absl::Status s = OnGlooThreads(&store, absl::StrCat("profile-tp", tp), tp, absl::Seconds(120),
                                     [&](int rank, Communicator* comm) -> absl::Status {
                                       absl::StatusOr<scheduler::v1::Profile> p =
                                           ProfileRank(model, ops, options, comm);
                                       if (!p.ok()) return p.status();
                                       if (rank == 0) rank0 = *std::move(p);
                                       return absl::OkStatus();
                                     });
      !s.ok()) {
    return s;
  }
  return rank0;
}

}  // namespace

absl::StatusOr<scheduler::v1::Profile> ProfileModules(const ModelConfig& model, Ops* ops,
                                                      const ProfileOptions& options) {
  if (options.tiles.empty() || options.tokens.empty() || options.repeats < 1 ||
      options.tps.empty()) {
    return absl::InvalidArgumentError("profile: an empty grid or fewer than one repeat");
  }
  for (int t : options.tokens) {
    if (t < 4 || t % 4 != 0 || t > model.llm.max_seq) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile: ", t, " tokens per bin: want a multiple of 4 up to the context, ",
                       model.llm.max_seq));
    }
  }
  for (int n : options.tiles) {
    if (n < 1) return absl::InvalidArgumentError(absl::StrCat("profile: ", n, " tiles per bin"));
  }
  for (int g : options.allreduce_ranks) {
    if (options.communication && g < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile: an all-reduce over ", g, " ranks (want 2 or more)"));
    }
  }
  for (size_t i = 0; i < options.tps.size(); ++i) {
    const int tp = options.tps[i];
    if (absl::Status s = ValidateModelParallel(model, tp, 1, tp, 1); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("profile: TP ", tp, ": ", s.message()));
    }
    if (tp > 1 && std::string(ops->backend()->name()) != "cpu") {
      return absl::UnimplementedError(absl::StrCat(
          "profile: TP ", tp, " on ", ops->backend()->name(),
          ": TP profiles run on the CPU alone (a GPU's TP group needs its GPUs and NCCL)"));
    }
    if (std::find(options.tps.begin(), options.tps.begin() + i, tp) != options.tps.begin() + i) {
      return absl::InvalidArgumentError(absl::StrCat("profile: TP ", tp, " twice"));
    }
  }
  absl::StatusOr<scheduler::v1::Profile> profile = ProfileAtTp(model, ops, options, options.tps[0]);
  if (!profile.ok()) return profile;
  if (options.communication) {
    CommProfileOptions comm;
    comm.allreduce_ranks = options.allreduce_ranks;
    comm.repeats = options.repeats;
    if (absl::Status s = ProfileCommunication(model, comm, &*profile); !s.ok()) return s;
  }
  for (size_t i = 1; i < options.tps.size(); ++i) {
    absl::StatusOr<scheduler::v1::Profile> at = ProfileAtTp(model, ops, options, options.tps[i]);
    if (!at.ok()) return at.status();
    *profile->add_at_tp() = *std::move(at);
  }
  return profile;
}

absl::Status WriteProfile(const scheduler::v1::Profile& profile, const std::string& path) {
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  std::string json;
  if (auto s = google::protobuf::util::MessageToJsonString(profile, &json, print); !s.ok()) {
    return absl::InternalError(std::string(s.message()));
  }
  return WriteFileAtomically(path, json + "\n");
}

absl::StatusOr<scheduler::v1::Profile> ReadProfile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  scheduler::v1::Profile profile;
  if (auto s = google::protobuf::util::JsonStringToMessage(*text, &profile); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a profile: ", std::string(s.message())));
  }
  return profile;
}

absl::Status ApplyProfile(const scheduler::v1::Profile& profile, scheduler::v1::Plan* plan,
                          std::string* scaled_tp, const Frozen& frozen) {
  const int measured = std::max(profile.tp(), 1);
  std::array<double, 2> divide{1, 1};  // encoder, LLM
  std::array<const scheduler::v1::Profile*, 2> at{&profile, &profile};
  if (scaled_tp != nullptr) scaled_tp->clear();
  std::string tps = absl::StrCat(measured);
  for (const scheduler::v1::Profile& p : profile.at_tp()) absl::StrAppend(&tps, ", ", p.tp());
  int i = 0;
  for (const auto& [name, tp] : {std::pair<const char*, int>{"encoder", plan->encoder().tp()},
                                 std::pair<const char*, int>{"llm", plan->llm().tp()}}) {
    const int want = std::max(tp, 1);
    for (const scheduler::v1::Profile& p : profile.at_tp()) {
      if (p.tp() == want) at[i] = &p;
    }
    if (want != measured && at[i] == &profile) {
      if (scaled_tp == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat("the profile measured TP ", tps,
                                                          "; the plan's ", name, "_tp is ", tp,
                                                          " (loom-schedule profile --profile_tp)"));
      }
      divide[i] = want * TpEfficiency(want) / (measured * TpEfficiency(measured));
      absl::StrAppend(scaled_tp, scaled_tp->empty() ? "" : ", ", name, " TP ", want,
                      " scaled from the profile's TP ", measured);
    }
    ++i;
  }
  // A frozen module, as the workers run it: the frozen passes' own fits
  // (freezing removes the weight-gradient GEMMs, not attention's backward:
  // each term shrinks by its own factor) and the forward's share of that
  // pass. A frozen ViT keeps its output: a recompute is the projector's
  // forward (its ratio to the encoder's forward); none, and the forward
  // alone, with the projector frozen too.
  const scheduler::v1::Profile& e = *at[0];
  const scheduler::v1::Profile& l = *at[1];
  if ((frozen.vision && e.encoder_vision_frozen_share() <= 0) ||
      (frozen.llm && l.llm_frozen_share() <= 0)) {
    return absl::FailedPreconditionError(
        "the profile has no frozen points, and the job freezes the vision tower or the LLM: "
        "profile again (loom-schedule profile measures each module frozen too)");
  }
  scheduler::v1::CostCoefficients* c = plan->mutable_costs();
  if (frozen.vision && frozen.projector) {
    c->set_encoder_per_sample(e.encoder_per_sample() * e.encoder_forward_share() / divide[0]);
    c->set_encoder_per_tile(e.encoder_per_tile() * e.encoder_forward_share() / divide[0]);
    c->set_encoder_forward_share(1.0);
    c->set_encoder_recompute_ratio(kNoRecompute);
  } else if (frozen.vision) {
    c->set_encoder_per_sample(e.encoder_frozen_per_sample() / divide[0]);
    c->set_encoder_per_tile(e.encoder_frozen_per_tile() / divide[0]);
    c->set_encoder_forward_share(
        std::min(1.0, e.encoder_forward_share() / e.encoder_vision_frozen_share()));
    c->set_encoder_recompute_ratio(std::max(kNoRecompute, e.encoder_frozen_recompute_ratio()));
  } else {
    c->set_encoder_per_sample(e.encoder_per_sample() / divide[0]);
    c->set_encoder_per_tile(e.encoder_per_tile() / divide[0]);
    c->set_encoder_forward_share(e.encoder_forward_share());
  }
  if (frozen.llm) {
    c->set_llm_per_sample(l.llm_frozen_per_sample() / divide[1]);
    c->set_llm_per_token(l.llm_frozen_per_token() / divide[1]);
    c->set_llm_per_token_sq(l.llm_frozen_per_token_sq() / divide[1]);
    c->set_llm_forward_share(std::min(1.0, l.llm_forward_share() / l.llm_frozen_share()));
  } else {
    c->set_llm_per_sample(l.llm_per_sample() / divide[1]);
    c->set_llm_per_token(l.llm_per_token() / divide[1]);
    c->set_llm_per_token_sq(l.llm_per_token_sq() / divide[1]);
    c->set_llm_forward_share(l.llm_forward_share());
  }
  return absl::OkStatus();
}

}  // namespace loom::sched
