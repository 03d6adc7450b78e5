#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/log.h"
#include "runtime/parallel/pipeline_schedule.h"
#include "services/worker/training_worker_impl.h"

namespace loom {

using namespace worker;  // NOLINT: this file's vocabulary (tags, clock)

std::vector<float> TrainingWorker::Impl::Tiles(const IterationData& d,
                                               const scheduler::v1::Bin& bin, int* n) const {
  std::vector<float> tiles;
  *n = 0;
  for (int i : bin.indices()) {
    const Sample& s = d.samples.at(i);
    tiles.insert(tiles.end(), s.tiles.begin(), s.tiles.end());
    *n += s.num_tiles;
  }
  return tiles;
}

int TrainingWorker::Impl::TileCount(const IterationData& d, const scheduler::v1::Bin& bin) const {
  int n = 0;
  for (int i : bin.indices()) n += d.samples.at(i).num_tiles;
  return n;
}

absl::Status TrainingWorker::Impl::ForwardEncoder(const float* in, int n,
                                                  std::vector<float>* vit_out,
                                                  std::vector<float>* emb) {
  // A stage before the last hands on every row (the class token's too).
  const int rows = last_stage() ? model.vit.patches_per_tile() : model.vit.seq();
  vit_out->resize(static_cast<size_t>(n) * rows * model.vit.dim);
  if (absl::Status s = vit->Forward(in, n, Room(vit_out, kStageOut)); !s.ok()) {
    return s;
  }
  Unstage(vit_out, kStageOut);
  if (!last_stage()) return absl::OkStatus();
  emb->resize(static_cast<size_t>(n) * model.tokens_per_tile() * model.llm.dim);
  projector->Forward(Staged(vit_out, kStageOut), n, Room(emb, kStageEmb));
  Unstage(emb, kStageEmb);
  return absl::OkStatus();
}

std::vector<int> TrainingWorker::Impl::PeerGroup(int dp) const {
  const parallel::GridShape& other = encoder ? llm_grid : encoder_grid;
  const int stage = encoder ? 0 : other.pp - 1;
  std::vector<int> ranks;
  for (int t = 0; t < other.tp; ++t) ranks.push_back(parallel::RankOf(other, {t, stage, dp}));
  return ranks;
}

std::vector<int> TrainingWorker::Impl::GeneratorPeerGroup(int dp) const {
  std::vector<int> ranks;
  if (generator) {  // the LLM replica's last stage
    for (int t = 0; t < llm_grid.tp; ++t) {
      ranks.push_back(parallel::RankOf(llm_grid, {t, llm_grid.pp - 1, dp}));
    }
  } else {
    for (int t = 0; t < generator_grid.tp; ++t) {
      ranks.push_back(parallel::RankOf(generator_grid, {t, 0, dp}));
    }
  }
  return ranks;
}

absl::Status TrainingWorker::Impl::ResolvePeers(const worker::IterationData& d) {
  // Only the TP group's first rank at the modules' border sends across.
  if (pos.tp != 0) return absl::OkStatus();
  const auto& bins = d.assignment.bins();
  if (generator && !first_stage()) return absl::OkStatus();  // its neighbours: Join's
  if (generator || (!encoder && last_stage() && generator_grid.size() > 0)) {
    // Between the LLM's last stage and the generator, each bin with output
    // images (the assignment does not say which: every bin's).
    const common::v1::Role other =
        generator ? common::v1::ROLE_LLM_WORKER : common::v1::ROLE_GENERATOR_WORKER;
    const int replicas = (generator ? llm_grid : generator_grid).dp;
    std::vector<scheduler::v1::WorkerRef> refs;
    for (int b : d.bins) {
      const int dp = generator ? bins[b].llm_rank() : bins[b].generator_rank();
      if (dp < 0 || dp >= replicas) continue;  // a bad assignment: the send says
      for (int peer : GeneratorPeerGroup(dp)) {
        refs.emplace_back().set_role(other);
        refs.back().set_rank(peer);
      }
    }
    if (absl::Status s = peers->Resolve(refs); !s.ok()) return s;
    if (generator) return absl::OkStatus();
  }
  if (encoder ? !last_stage() : !first_stage()) return absl::OkStatus();
  const common::v1::Role other =
      encoder ? common::v1::ROLE_LLM_WORKER : common::v1::ROLE_ENCODER_WORKER;
  const int replicas = (encoder ? llm_grid : encoder_grid).dp;
  std::vector<scheduler::v1::WorkerRef> refs;
  for (int b : d.bins) {
    const scheduler::v1::Bin& bin = bins[b];
    const int dp = encoder ? bin.llm_rank() : bin.encoder_rank();
    if (dp < 0 || dp >= replicas)
      continue;  // no tensor crosses (or a bad assignment: the send says)
    for (int peer : PeerGroup(dp)) {
      refs.emplace_back().set_role(other);
      refs.back().set_rank(peer);
    }
  }
  return peers->Resolve(refs);
}

absl::Status TrainingWorker::Impl::SendToStage(int step, Transfer what, int64_t iteration, int bin,
                                               std::shared_ptr<std::vector<float>> data) {
  const int peer = step > 0 ? parallel::NextStageRank(grid(), options.rank)
                            : parallel::PrevStageRank(grid(), options.rank);
  LOOM_CHECK(peer >= 0) << "no stage " << pos.pp + step;
  absl::StatusOr<std::string> address = peers->Get(options.role, peer);
  if (!address.ok()) return address.status();
  const double s0 = trace::NowMicros();
  absl::Status s = ucx->Send(*address, WireTag(*scheduler, what, iteration, bin, pos.pp + step),
                             data->data(), data->size() * sizeof(float), data);
  Span("send", s0, iteration, "send ", TransferName(what), " bin ", bin, " to stage ",
       pos.pp + step);
  return s;
}

absl::Status TrainingWorker::Impl::Receive(Transfer what, int64_t iteration, int bin, size_t n,
                                           int from_dp, Received* out, double* wait) {
  const Transfer kind = TransferKind(what);
  // Between modules (the bridge, the generator's) the stage is 0.
  const bool bridge = kind != Transfer::kActivations && kind != Transfer::kActivationGrads;
  const int stage = bridge ? 0 : pos.pp;
  const auto w0 = Clock::now();
  const double s0 = trace::NowMicros();
  if (OverNccl(what, /*sending=*/false)) {
    // Activations come from the link's earlier stage (its rank 0), their
    // gradients from the later one.
    const int peer =
        bridge ? BridgeIndex(!encoder, from_dp, 0) : (kind == Transfer::kActivations ? 0 : 1);
    out->host.clear();
    out->device = Buffer<float>(ops->backend());
    out->device.resize(n);
    StallWatch::Waiting waiting(stall.get());
    absl::Status s =
        nccl_recv[static_cast<int>(kind)]->Recv(out->device.data(), n * sizeof(float), peer);
    *wait += Since(w0);
    Span("receive", s0, iteration, "receive ", TransferName(what), " bin ", bin, " over NCCL");
    return s;
  }
  // Owned here, so that a receive cut off mid-transfer can be left to UCX.
  auto buffer = std::make_shared<std::vector<float>>(n);
  StallWatch::Waiting waiting(stall.get());
  absl::Status s = ucx->RecvAll({{WireTag(*scheduler, what, iteration, bin, stage), buffer->data(),
                                  n * sizeof(float), buffer}},
                                stall->WaitLimit());
  if (s.ok()) out->host.swap(*buffer);
  out->device = Buffer<float>();
  *wait += Since(w0);
  Span("receive", s0, iteration, "receive ", TransferName(what), " bin ", bin);
  return s;
}

absl::Status TrainingWorker::Impl::SumOverStages(std::vector<double>* seconds,
                                                 const StageTotals& totals, double* wait,
                                                 int64_t iteration,
                                                 scheduler::v1::ReportTimingsRequest* timings) {
  StageTotals sum = totals;
  auto report = [&] {
    timings->set_forward_seconds(sum.forward);
    timings->set_recompute_seconds(sum.recompute);
    timings->set_recomputed_forward_seconds(sum.recomputed_forward);
  };
  if (pp_comm == nullptr) {
    report();
    return absl::OkStatus();
  }
  const size_t n = seconds->size(), pp = grid().pp;
  double own = 0;
  for (double s : *seconds) own += s;
  seconds->resize(n + pp + 3, 0.0);  // then each stage's total, then the totals
  (*seconds)[n + pos.pp] = own;
  (*seconds)[n + pp] = totals.forward;
  (*seconds)[n + pp + 1] = totals.recompute;
  (*seconds)[n + pp + 2] = totals.recomputed_forward;
  const auto w0 = Clock::now();
  const double s0 = trace::NowMicros();
  absl::Status s = pp_comm->AllreduceSum(seconds->data(), static_cast<int64_t>(seconds->size()));
  *wait += Since(w0);
  Span("allreduce", s0, iteration, "allreduce stage times");
  for (int p = 0; p < grid().pp; ++p) timings->add_stage_seconds((*seconds)[n + p]);
  sum = {(*seconds)[n + pp], (*seconds)[n + pp + 1], (*seconds)[n + pp + 2]};
  report();
  seconds->resize(n);
  return s;
}

// Each encoder stage runs every bin's forward in order, then every backward
// in the same order (the encoder feeds several LLM replicas, whose pipelines
// need its embeddings slot by slot). Under recompute full it keeps each
// bin's stage input, not its activations, and recomputes a bin's forward
// before its backward; under none or selective it keeps every bin's
// activations (SavedActivations) and recomputes no forward.
absl::Status TrainingWorker::Impl::EncoderIteration(const IterationData& d, double* compute,
                                                    double* wait, double* bubble,
                                                    scheduler::v1::ReportTimingsRequest* timings) {
  const auto p0 = Clock::now();
  StageTotals totals;
  std::vector<double> first_forward(d.bins.size(), 0.0);
  const auto& bins = d.assignment.bins();
  const size_t stage_floats = static_cast<size_t>(model.vit.seq()) * model.vit.dim;  // per tile
  std::vector<double> seconds(d.bins.size(), 0.0);  // by position in d.bins
  std::map<int, std::pair<Received, int>> inputs;   // bin -> (stage input, tiles)
  std::vector<float> vit_out, emb_scratch;
  int live = -1;  // the bin whose activations the modules hold
  // What runs backward (runtime/model/model.h Frozen): the ViT's layers
  // unless the tower is frozen; the last stage's projector unless the whole
  // encoder side is. A frozen tower before a trainable projector keeps each
  // bin's projector input instead of recomputing the tower.
  const bool vit_backward = !frozen.vision;
  const bool backward = vit_backward || (last_stage() && !frozen.projector);
  std::map<int, std::vector<float>> projector_in;  // bin -> the tower's output
  const bool keep = backward && recompute != Recompute::kFull;
  std::map<int, std::pair<SavedActivations, SavedActivations>> saved;  // bin -> (ViT, projector)
  for (size_t k = 0; k < d.bins.size(); ++k) {
    const int b = d.bins[k];
    int n = TileCount(d, bins[b]);
    if (n == 0) continue;  // text only: no stage sees this bin
    Received in;
    if (first_stage()) {
      in.host = Tiles(d, bins[b], &n);
    } else if (absl::Status s = Receive(d.T(Transfer::kActivations), d.iteration, b,
                                        n * stage_floats, -1, &in, wait);
               !s.ok()) {
      return s;
    }
    max_tiles = std::max<int64_t>(max_tiles, n);
    const auto t0 = Clock::now();
    const double s0 = trace::NowMicros();
    auto out = std::make_shared<std::vector<float>>();
    if (absl::Status s = ForwardEncoder(In(in, kStageIn), n, &vit_out, out.get()); !s.ok()) {
      return s;
    }
    if (keep) {
      auto& [vit_saved, projector_saved] = saved[b];
      if (vit_backward) vit_saved = vit->Detach();
      if (last_stage()) projector_saved = projector->Detach();
      in = Received();
    } else if (backward && !vit_backward) {
      projector_in[b] = vit_out;
    }
    inputs[b] = {vit_backward && !keep ? std::move(in) : Received(), n};
    live = b;
    first_forward[k] = Since(t0);
    seconds[k] += first_forward[k];
    totals.forward += first_forward[k];
    Span("forward", s0, d.iteration, "F bin ", b);
    if (!last_stage()) {
      absl::Status s;
      if (OverNccl(Transfer::kActivations, /*sending=*/true)) {
        s = SendOnDevice(d.T(Transfer::kActivations), 1, staged[kStageOut], vit_out.size(),
                         d.iteration, b);
      } else {
        *out = vit_out;
        s = SendToStage(1, d.T(Transfer::kActivations), d.iteration, b, out);
      }
      if (!s.ok()) return s;
      continue;
    }
    // The TP group's ranks hold the same embeddings: its first sends them to
    // every rank of the receiving LLM replica's first-stage TP group.
    if (pos.tp != 0) continue;
    InjectFault("transfer", d.iteration);
    const double s1 = trace::NowMicros();
    if (OverNccl(Transfer::kEmbeddings, /*sending=*/true)) {
      for (int t = 0; t < llm_grid.tp; ++t) {
        if (absl::Status s =
                SendOnDevice(d.T(Transfer::kEmbeddings), BridgeIndex(false, bins[b].llm_rank(), t),
                             staged[kStageEmb], out->size(), d.iteration, b);
            !s.ok()) {
          return s;
        }
      }
      continue;
    }
    for (int peer : PeerGroup(bins[b].llm_rank())) {
      absl::StatusOr<std::string> address = peers->Get(common::v1::ROLE_LLM_WORKER, peer);
      if (!address.ok()) return address.status();
      absl::Status s =
          ucx->Send(*address, WireTag(*scheduler, d.T(Transfer::kEmbeddings), d.iteration, b, 0),
                    out->data(), out->size() * sizeof(float), out);
      if (!s.ok()) return s;
    }
    Span("send", s1, d.iteration, "send embeddings bin ", b, " to LLM rank ", bins[b].llm_rank());
  }
  max_bins = std::max(max_bins, static_cast<int>(inputs.size()));
  int64_t iteration_tiles = 0;
  for (const auto& [b, in] : inputs) iteration_tiles += in.second;
  max_kept_tiles = std::max(max_kept_tiles, iteration_tiles);
  Received grad;
  std::vector<float> dvit;
  for (size_t k = 0; backward && k < d.bins.size(); ++k) {
    const int b = d.bins[k];
    auto in = inputs.find(b);
    if (in == inputs.end()) continue;  // no tiles: nothing was sent
    auto& [input, n] = in->second;
    absl::Status s = last_stage()
                         ? Receive(d.T(Transfer::kEmbeddingGrads), d.iteration, b,
                                   static_cast<size_t>(n) * model.tokens_per_tile() * model.llm.dim,
                                   bins[b].llm_rank(), &grad, wait)
                         : Receive(d.T(Transfer::kActivationGrads), d.iteration, b,
                                   n * stage_floats, -1, &grad, wait);
    if (!s.ok()) return s;
    if (keep) {
      auto& [vit_saved, projector_saved] = saved.at(b);
      if (vit_backward) vit->Attach(&vit_saved);
      if (last_stage()) projector->Attach(&projector_saved);
    } else if (live != b) {  // recompute
      const auto r0 = Clock::now();
      const double s0 = trace::NowMicros();
      if (vit_backward) {
        if (s = ForwardEncoder(In(input, kStageIn), n, &vit_out, &emb_scratch); !s.ok()) return s;
      } else {  // the projector alone, from the tower's output it kept
        vit_out.swap(projector_in.at(b));
        emb_scratch.resize(static_cast<size_t>(n) * model.tokens_per_tile() * model.llm.dim);
        projector->Forward(Stage(vit_out, kStageOut), n, Room(&emb_scratch, kStageEmb));
      }
      totals.recompute += Since(r0);
      totals.recomputed_forward += first_forward[k];
      Span("recompute", s0, d.iteration, "R bin ", b);
    }
    live = -1;
    const auto t0 = Clock::now();
    const double s0 = trace::NowMicros();
    const float* dout = In(grad, kStageGrad);
    if (last_stage()) {
      dvit.assign(
          vit_backward ? static_cast<size_t>(n) * model.vit.patches_per_tile() * model.vit.dim : 0,
          0.0f);
      projector->Backward(dout, vit_backward ? Stage(&dvit, kStageDvit) : nullptr);
      dout = Staged(&dvit, kStageDvit);
    }
    if (!vit_backward) {
      seconds[k] += Since(t0);
      Span("backward", s0, d.iteration, "B bin ", b);
      continue;
    }
    auto din = std::make_shared<std::vector<float>>(first_stage() ? 0 : n * stage_floats);
    if (s = vit->Backward(dout, first_stage() ? nullptr : Stage(din.get(), kStageDin)); !s.ok()) {
      return s;
    }
    const bool nccl_grads = OverNccl(Transfer::kActivationGrads, /*sending=*/true);
    if (!first_stage() && !nccl_grads) Unstage(din.get(), kStageDin);
    seconds[k] += Since(t0);
    Span("backward", s0, d.iteration, "B bin ", b);
    if (!first_stage()) {
      s = nccl_grads ? SendOnDevice(d.T(Transfer::kActivationGrads), 0, staged[kStageDin],
                                    din->size(), d.iteration, b)
                     : SendToStage(-1, d.T(Transfer::kActivationGrads), d.iteration, b, din);
      if (!s.ok()) return s;
    }
  }
  if (absl::Status s = FinishDeviceSends(); !s.ok()) return s;
  double busy = totals.recompute;
  for (double sec : seconds) busy += sec;
  *compute += busy;
  *bubble += std::max(0.0, Since(p0) - busy);
  recompute_seconds->Increment(totals.recompute);
  if (absl::Status s = SumOverStages(&seconds, totals, wait, d.iteration, timings); !s.ok())
    return s;
  for (size_t k = 0; k < d.bins.size(); ++k) {
    if (inputs.count(d.bins[k]) == 0) continue;
    scheduler::v1::MicrobatchTiming* t = timings->add_timings();
    t->set_microbatch(bins[d.bins[k]].microbatch());
    t->set_llm_rank(bins[d.bins[k]].llm_rank());
    t->set_seconds(seconds[k]);
  }
  return absl::OkStatus();
}

// Each LLM stage runs its replica's microbatches in the 1F1B order of the
// combined pipeline (runtime/parallel/pipeline_schedule.h: encoder stages
// first). Under recompute full it keeps each microbatch's stage input and
// recomputes the forward before a backward unless that microbatch's
// activations are still live; under none or selective it keeps each
// in-flight microbatch's activations (SavedActivations) instead of its
// input, and recomputes no forward.
absl::Status TrainingWorker::Impl::LlmIteration(const IterationData& d, double* compute,
                                                double* wait, double* bubble,
                                                scheduler::v1::ReportTimingsRequest* timings,
                                                double* loss_sum, double* tokens, double* samples,
                                                int64_t* loss_tokens) {
  const auto& bins = d.assignment.bins();
  // The gradient scale needs the whole global batch's loss tokens first.
  double lt = 0;
  for (const auto& [i, s] : d.samples) lt += static_cast<double>(LossTokens(s));
  const auto w0 = Clock::now();
  const double a0 = trace::NowMicros();
  if (absl::Status s = dp_comm->AllreduceSum(&lt, 1); !s.ok()) return s;
  *wait += Since(w0);
  Span("allreduce", a0, d.iteration, "allreduce loss tokens");
  if (lt <= 0)
    return absl::DataLossError(absl::StrCat("iteration ", d.iteration, ": no loss tokens"));
  *loss_tokens = static_cast<int64_t>(lt);
  const float scale = 1.0f / static_cast<float>(lt);

  // Every microbatch's shapes come from the assignment: no shape exchange.
  const int m = static_cast<int>(d.bins.size());
  std::vector<LlmBatch> batches(m);
  std::vector<int> image_tokens(m), sample_count(m);
  for (int j = 0; j < m; ++j) {
    const int b = d.bins[j];
    std::vector<const Sample*> mb;
    for (int i : bins[b].indices()) mb.push_back(&d.samples.at(i));
    batches[j] = PackSamples(mb);
    sample_count[j] = static_cast<int>(mb.size());
    image_tokens[j] = TileCount(d, bins[b]) * model.tokens_per_tile();
    max_tokens = std::max<int64_t>(max_tokens, batches[j].T());
    max_image_tokens = std::max<int64_t>(max_image_tokens, image_tokens[j]);
    if (batches[j].image_positions() != image_tokens[j]) {
      return absl::DataLossError(absl::StrCat("bin ", b, ": ", batches[j].image_positions(),
                                              " image slots for ", image_tokens[j],
                                              " image tokens"));
    }
  }
  if (m == 0) return absl::OkStatus();
  const size_t C = model.llm.dim;
  std::vector<Received> inputs(m);  // embeddings (first stage) or activations
  std::vector<double> seconds(m, 0.0);
  Received dout;
  int live = -1;
  const auto p0 = Clock::now();
  StageTotals totals;
  std::vector<double> first_forward(d.bins.size(), 0.0);
  const bool keep = recompute != Recompute::kFull;
  std::vector<SavedActivations> saved(keep ? m : 0);
  auto forward = [&](int j) {
    const bool img = image_tokens[j] > 0;
    const float* in = first_stage() && !img ? nullptr : In(inputs[j], kStageIn);
    return llm->Forward(batches[j], first_stage() ? in : nullptr, first_stage() ? nullptr : in);
  };
  const int stages = encoder_grid.pp + llm_grid.pp;
  for (const parallel::PipelineOp& op : parallel::OneFOneBSchedule(
           stages, parallel::GlobalStage(false, pos.pp, encoder_grid.pp), m)) {
    const int j = op.microbatch, b = d.bins[j];
    const size_t TC = static_cast<size_t>(batches[j].T()) * C;
    absl::Status s;
    if (op.kind == parallel::PipelineOp::kForward) {
      if (!first_stage()) {
        s = Receive(d.T(Transfer::kActivations), d.iteration, b, TC, -1, &inputs[j], wait);
      } else if (image_tokens[j] > 0) {
        s = Receive(d.T(Transfer::kEmbeddings), d.iteration, b, image_tokens[j] * C,
                    bins[b].encoder_rank(), &inputs[j], wait);
      }
      if (!s.ok()) return s;
      const auto t0 = Clock::now();
      const double s0 = trace::NowMicros();
      if (s = forward(j); !s.ok()) return s;
      live = j;
      first_forward[j] = Since(t0);
      seconds[j] += first_forward[j];
      totals.forward += first_forward[j];
      Span("forward", s0, d.iteration, "F mb ", j, " bin ", b);
      // The query positions' hidden states go to the generator replica that
      // draws the bin's output images (from the TP group's first rank).
      if (last_stage() && batches[j].query_positions() > 0 && pos.tp == 0) {
        auto states = std::make_shared<std::vector<float>>(llm->query_states().ToHost());
        if (s = SendAcrossGenerator(d.T(Transfer::kQueryStates), d.iteration, b,
                                    bins[b].generator_rank(), states);
            !s.ok()) {
          return s;
        }
      }
      if (!last_stage()) {
        if (OverNccl(Transfer::kActivations, /*sending=*/true)) {
          s = SendOnDevice(d.T(Transfer::kActivations), 1, llm->output(), TC, d.iteration, b);
        } else {
          auto out = std::make_shared<std::vector<float>>(llm->output().ToHost());
          s = SendToStage(1, d.T(Transfer::kActivations), d.iteration, b, out);
        }
        if (!s.ok()) return s;
      }
      if (keep) {
        saved[j] = llm->Detach();
        inputs[j] = Received();
      }
      continue;
    }
    if (!last_stage()) {
      if (s = Receive(d.T(Transfer::kActivationGrads), d.iteration, b, TC, -1, &dout, wait);
          !s.ok()) {
        return s;
      }
    }
    // Their gradient from the generator, where something before it trains.
    const bool query_grads = last_stage() && batches[j].query_positions() > 0 && QueryGradsWanted();
    Received dquery;
    if (query_grads) {
      if (s = Receive(d.T(Transfer::kQueryGrads), d.iteration, b,
                      static_cast<size_t>(batches[j].query_positions()) * C,
                      bins[b].generator_rank(), &dquery, wait);
          !s.ok()) {
        return s;
      }
    }
    if (keep) {
      llm->Attach(&saved[j]);
    } else if (live != j) {  // recompute
      const auto r0 = Clock::now();
      const double s0 = trace::NowMicros();
      if (s = forward(j); !s.ok()) return s;
      totals.recompute += Since(r0);
      totals.recomputed_forward += first_forward[j];
      Span("recompute", s0, d.iteration, "R mb ", j, " bin ", b);
    }
    live = -1;
    const auto t0 = Clock::now();
    const double s0 = trace::NowMicros();
    // Nothing trainable before the LLM: no embedding gradient at all.
    const bool send_image = first_stage() && image_tokens[j] > 0 && !frozen.encoder_side();
    auto grad = std::make_shared<std::vector<float>>(send_image ? image_tokens[j] * C : 0, 0.0f);
    auto din = std::make_shared<std::vector<float>>(first_stage() ? 0 : TC);
    absl::StatusOr<kernels::LossSum> loss =
        llm->Backward(scale, send_image ? Stage(grad.get(), kStageGrad) : nullptr,
                      last_stage() ? nullptr : In(dout, kStageOut),
                      first_stage() ? nullptr : Stage(din.get(), kStageDin),
                      query_grads ? In(dquery, kStageQuery) : nullptr);
    if (!loss.ok()) return loss.status();
    const bool nccl_image = OverNccl(Transfer::kEmbeddingGrads, /*sending=*/true);
    const bool nccl_grads = OverNccl(Transfer::kActivationGrads, /*sending=*/true);
    if (send_image && !nccl_image) Unstage(grad.get(), kStageGrad);
    if (!first_stage() && !nccl_grads) Unstage(din.get(), kStageDin);
    seconds[j] += Since(t0);
    Span("backward", s0, d.iteration, "B mb ", j, " bin ", b);
    // Its input is no longer needed: a stage keeps only the microbatches
    // 1F1B has in flight.
    inputs[j] = Received();
    if (last_stage()) {
      *loss_sum += loss->sum;
      *tokens += batches[j].T();
      *samples += sample_count[j];
    }
    if (!first_stage()) {
      s = nccl_grads ? SendOnDevice(d.T(Transfer::kActivationGrads), 0, staged[kStageDin], TC,
                                    d.iteration, b)
                     : SendToStage(-1, d.T(Transfer::kActivationGrads), d.iteration, b, din);
      if (!s.ok()) return s;
    }
    // Every TP rank holds the whole embedding gradient: the first sends it
    // to every rank of the encoder replica's last-stage TP group.
    if (!send_image || pos.tp != 0) continue;
    InjectFault("transfer", d.iteration);
    const double s1 = trace::NowMicros();
    if (nccl_image) {
      for (int t = 0; t < encoder_grid.tp; ++t) {
        if (s = SendOnDevice(d.T(Transfer::kEmbeddingGrads),
                             BridgeIndex(true, bins[b].encoder_rank(), t), staged[kStageGrad],
                             grad->size(), d.iteration, b);
            !s.ok()) {
          return s;
        }
      }
      continue;
    }
    for (int peer : PeerGroup(bins[b].encoder_rank())) {
      absl::StatusOr<std::string> address = peers->Get(common::v1::ROLE_ENCODER_WORKER, peer);
      if (!address.ok()) return address.status();
      s = ucx->Send(*address,
                    WireTag(*scheduler, d.T(Transfer::kEmbeddingGrads), d.iteration, b, 0),
                    grad->data(), grad->size() * sizeof(float), grad);
      if (!s.ok()) return s;
    }
    Span("send", s1, d.iteration, "send embedding grads bin ", b, " to encoder rank ",
         bins[b].encoder_rank());
  }
  if (absl::Status s = FinishDeviceSends(); !s.ok()) return s;
  double busy = totals.recompute;
  for (double sec : seconds) busy += sec;
  *compute += busy;
  *bubble += std::max(0.0, Since(p0) - busy);
  recompute_seconds->Increment(totals.recompute);
  if (absl::Status s = SumOverStages(&seconds, totals, wait, d.iteration, timings); !s.ok())
    return s;
  for (int j = 0; j < m; ++j) {
    scheduler::v1::MicrobatchTiming* t = timings->add_timings();
    t->set_microbatch(bins[d.bins[j]].microbatch());
    t->set_llm_rank(pos.dp);
    t->set_seconds(seconds[j]);
  }
  return absl::OkStatus();
}

absl::Status TrainingWorker::Impl::SendAcrossGenerator(Transfer what, int64_t iteration, int bin,
                                                       int dp,
                                                       std::shared_ptr<std::vector<float>> data) {
  const int replicas = (generator ? llm_grid : generator_grid).dp;
  if (dp < 0 || dp >= replicas) {
    return absl::DataLossError(absl::StrCat("bin ", bin, ": ", generator ? "LLM" : "generator",
                                            " rank ", dp, " is outside the plan's ", replicas));
  }
  const common::v1::Role other =
      generator ? common::v1::ROLE_LLM_WORKER : common::v1::ROLE_GENERATOR_WORKER;
  const double s0 = trace::NowMicros();
  for (int peer : GeneratorPeerGroup(dp)) {
    absl::StatusOr<std::string> address = peers->Get(other, peer);
    if (!address.ok()) return address.status();
    absl::Status s = ucx->Send(*address, WireTag(*scheduler, what, iteration, bin, 0), data->data(),
                               data->size() * sizeof(float), data);
    if (!s.ok()) return s;
  }
  Span("send", s0, iteration, "send ", TransferName(what), " bin ", bin, " to ",
       generator ? "LLM" : "generator", " rank ", dp);
  return absl::OkStatus();
}

// A generator replica runs its bins slot by slot, each bin's forward then
// its backward at once: the LLM replica's last stage waits for the gradient
// before its own backward of that microbatch. Under pipeline parallelism a
// bin's rows go down the stages and their gradient back up before the next
// bin starts. Each image's timestep and noise come from the job's seed, the
// step and the sample's id, as in loom-train-local
// (MultimodalModel::Forward).
absl::Status TrainingWorker::Impl::GeneratorIteration(const IterationData& d, double* compute,
                                                      double* wait,
                                                      scheduler::v1::ReportTimingsRequest* timings,
                                                      double* loss_sum, double* images) {
  const auto& bins = d.assignment.bins();
  // The generation loss's scale needs the global batch's output images.
  double total = 0;
  for (const auto& [i, s] : d.samples) total += s.num_gen_images;
  const auto w0 = Clock::now();
  if (absl::Status s = dp_comm->AllreduceSum(&total, 1); !s.ok()) return s;
  *wait += Since(w0);
  const float scale = total > 0 ? static_cast<float>(train.generation_weight / total) : 0.0f;
  const int Q = model.llm.gen_queries, pixels = model.generator.pixels();
  const size_t C = model.llm.dim;
  // Validation batches draw as loom-train-local evaluates: at step 0.
  const int64_t step = d.validation ? 0 : d.iteration + 1;
  const bool wanted = QueryGradsWanted();
  const bool backward = wanted || !frozen.generator;
  std::vector<int> ran;         // the bins with pictures, in order
  std::vector<double> seconds;  // each one's forward + backward on this stage
  for (int b : d.bins) {
    std::vector<const Sample*> samples;
    for (int i : bins[b].indices()) samples.push_back(&d.samples.at(i));
    absl::StatusOr<GeneratorBatch> drawn = GenerationBatch(samples, pixels, job.seed(), step);
    if (!drawn.ok()) {
      return absl::DataLossError(absl::StrCat("bin ", b, ": ", drawn.status().message()));
    }
    const GeneratorBatch& batch = *drawn;
    if (batch.N == 0) continue;  // the LLM sends nothing for it
    max_gen_images = std::max<int64_t>(max_gen_images, batch.N);
    // The first stage's input is the LLM's query states, the others' the
    // previous stage's rows.
    Received in;
    const size_t n = static_cast<size_t>(batch.N) * Q * C;
    const size_t rows = static_cast<size_t>(gen->StageFloats(batch.N));
    if (absl::Status s = first_stage() ? Receive(d.T(Transfer::kQueryStates), d.iteration, b, n,
                                                 bins[b].llm_rank(), &in, wait)
                                       : Receive(d.T(Transfer::kActivations), d.iteration, b, rows,
                                                 -1, &in, wait);
        !s.ok()) {
      return s;
    }
    auto t0 = Clock::now();
    double busy = 0;
    const double s0 = trace::NowMicros();
    auto out = std::make_shared<std::vector<float>>(last_stage() ? 0 : rows);
    if (absl::Status s = gen->ForwardStage(batch, In(in, kStageIn),
                                           last_stage() ? nullptr : Room(out.get(), kStageOut));
        !s.ok()) {
      return s;
    }
    if (!last_stage()) Unstage(out.get(), kStageOut);
    if (last_stage()) {
      *loss_sum += gen->LossSum();
      *images += batch.N;
    }
    ops->backend()->Synchronize();  // a device's work done, not just queued
    busy += Since(t0);
    Span("forward", s0, d.iteration, "F bin ", b);
    if (!last_stage()) {
      if (absl::Status s = SendToStage(1, d.T(Transfer::kActivations), d.iteration, b, out);
          !s.ok()) {
        return s;
      }
    }
    if (backward) {
      Received dout;
      if (!last_stage()) {
        if (absl::Status s =
                Receive(d.T(Transfer::kActivationGrads), d.iteration, b, rows, -1, &dout, wait);
            !s.ok()) {
          return s;
        }
      }
      t0 = Clock::now();
      const double s1 = trace::NowMicros();
      // The first stage's input gradient is the conditions' (where wanted),
      // the others' their input rows'.
      const bool send_in = first_stage() ? wanted : true;
      auto din =
          std::make_shared<std::vector<float>>(send_in ? (first_stage() ? n : rows) : 0, 0.0f);
      if (absl::Status s = gen->BackwardStage(scale, last_stage() ? nullptr : In(dout, kStageGrad),
                                              send_in ? Stage(din.get(), kStageDin) : nullptr);
          !s.ok()) {
        return s;
      }
      if (send_in) Unstage(din.get(), kStageDin);
      ops->backend()->Synchronize();
      busy += Since(t0);
      Span("backward", s1, d.iteration, "B bin ", b);
      if (!first_stage()) {
        if (absl::Status s = SendToStage(-1, d.T(Transfer::kActivationGrads), d.iteration, b, din);
            !s.ok()) {
          return s;
        }
      } else if (wanted && pos.tp == 0) {
        InjectFault("transfer", d.iteration);
        if (absl::Status s = SendAcrossGenerator(d.T(Transfer::kQueryGrads), d.iteration, b,
                                                 bins[b].llm_rank(), din);
            !s.ok()) {
          return s;
        }
      }
    }
    *compute += busy;
    ran.push_back(b);
    seconds.push_back(busy);
  }
  // The replica's time per bin, its stages' together (the first reports).
  if (pp_comm != nullptr && !seconds.empty()) {
    const auto w1 = Clock::now();
    if (absl::Status s =
            pp_comm->AllreduceSum(seconds.data(), static_cast<int64_t>(seconds.size()));
        !s.ok()) {
      return s;
    }
    *wait += Since(w1);
  }
  for (size_t k = 0; k < ran.size(); ++k) {
    scheduler::v1::MicrobatchTiming* t = timings->add_timings();
    t->set_microbatch(bins[ran[k]].microbatch());
    t->set_llm_rank(bins[ran[k]].llm_rank());
    t->set_seconds(seconds[k]);
  }
  return absl::OkStatus();
}

}  // namespace loom
