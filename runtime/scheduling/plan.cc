#include "runtime/scheduling/plan.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"

namespace loom::sched {
double TpEfficiency(int tp) { return 1.0 / (1.0 + 0.04 * std::log2(static_cast<double>(tp))); }

namespace {

constexpr double kGradBytes = 2;             // bf16 gradients on the wire
constexpr double kMicrobatchHeadroom = 1.3;  // largest microbatch over the mean

double Efficiency(const ClusterSpec& c, double tokens_per_gpu) {
  return c.max_efficiency * tokens_per_gpu / (tokens_per_gpu + c.saturation_tokens);
}

double RingAllreduceSeconds(double bytes, int dp, int gpus_in_group, const ClusterSpec& c) {
  if (dp <= 1) return 0;
  const double bw = gpus_in_group > c.gpus_per_node ? c.inter_node_bytes_per_second
                                                    : c.intra_node_bytes_per_second;
  return 2.0 * (dp - 1) / dp * bytes / bw;
}

// The largest of `stages` stages holding `layers` split evenly (the
// remainder one each on the earliest), the last also the head, in layers.
double LaterStageUnits(int layers, int stages, double head) {
  if (stages < 1) return 0;
  return std::max<double>((layers + stages - 1) / stages, layers / stages + head);
}

// The LLM DP degree after `dp` (PlanLimits::dp_step), `most` included.
int NextDp(int dp, int most, double step) {
  int next = dp + 1;
  if (step > 0 && dp > 64) next = std::max(next, static_cast<int>(dp * (1 + step)));
  return dp < most ? std::min(next, most) : next;
}

std::vector<int> Divisors(int n, int max) {
  std::vector<int> out;
  for (int d = 1; d <= std::min(n, max); ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

}  // namespace

BatchStats StatsOf(const std::vector<SampleShape>& samples, int global_batch) {
  BatchStats s;
  s.global_batch = global_batch;
  if (samples.empty()) return s;
  for (const SampleShape& x : samples) {
    const double l = x.length();
    s.mean_tiles += x.tiles;
    s.mean_image_tokens += x.image_tokens;
    s.mean_length += l;
    s.mean_length_sq += l * l;
    s.mean_output_images += x.output_images;
  }
  const double n = static_cast<double>(samples.size());
  s.mean_tiles /= n;
  s.mean_image_tokens /= n;
  s.mean_length /= n;
  s.mean_length_sq /= n;
  s.mean_output_images /= n;
  return s;
}

scheduler::v1::CostCoefficients CoefficientsOnOneGpu(const ModelConfig& model,
                                                     const ClusterSpec& cluster,
                                                     const Frozen& frozen) {
  const ModelFlops f = AnalyticFlops(model, false, frozen);
  const double rate = cluster.peak_flops * cluster.max_efficiency;
  scheduler::v1::CostCoefficients c;
  c.set_encoder_per_tile(f.encoder_per_tile / rate);
  c.set_llm_per_token(f.llm_per_token / rate);
  c.set_llm_per_token_sq(f.llm_per_token_sq / rate);
  c.set_generator_per_image(f.generator_per_image / rate);
  c.set_transfer_per_image_token(f.embedding_bytes_per_image_token /
                                 cluster.inter_node_bytes_per_second);
  return c;
}

namespace {

Recompute EncoderRecompute(const PlanLimits& limits) {
  return limits.encoder_recompute.value_or(limits.recompute);
}

// What a search needs of the batch and the model.
struct Workload {
  ModelFlops flops;                                       // with the limits' recompute
  double B = 0;                                           // samples per iteration
  double enc_flops = 0, llm_flops = 0, useful_flops = 0;  // per iteration
  double enc_trained = 0, llm_trained = 0;                // parameters with gradients (allreduced)
  double budget = 0;                                      // bytes per GPU
  int patches = 0;                                        // encoder rows per tile (VitConfig::seq)
  // A model with a generator: its FLOPs per iteration, its trained
  // parameters, its rows per output image (patches and the 1 + Q prefix).
  bool generator = false;
  double gen_flops = 0, gen_trained = 0;
  int gen_rows = 0;
};

absl::StatusOr<Workload> WorkloadOf(const ClusterSpec& c, const ModelConfig& model,
                                    const BatchStats& stats, const PlanLimits& limits) {
  if (c.gpus < 2) return absl::InvalidArgumentError("gpus: a plan needs at least 2 GPUs");
  if (c.gpus_per_node < 1) return absl::InvalidArgumentError("gpus_per_node must be at least 1");
  if (!(c.peak_flops > 0) || !(c.memory_bytes > 0)) {
    return absl::InvalidArgumentError("gpu_peak_flops and gpu_memory must be positive");
  }
  if (stats.global_batch < 1) return absl::InvalidArgumentError("global_batch must be at least 1");
  if (!(stats.mean_length > 0)) {
    return absl::InvalidArgumentError("the batch statistics have no tokens");
  }
  Workload w;
  w.flops = AnalyticFlops(model, limits.recompute == Recompute::kFull, limits.frozen);
  w.flops.encoder_per_tile =
      AnalyticFlops(model, EncoderRecompute(limits) == Recompute::kFull, limits.frozen)
          .encoder_per_tile;
  const ModelFlops useful = AnalyticFlops(model, false, limits.frozen);
  w.B = stats.global_batch;
  w.enc_flops = w.B * stats.mean_tiles * w.flops.encoder_per_tile;
  w.llm_flops = w.B * (stats.mean_length * w.flops.llm_per_token +
                       stats.mean_length_sq * w.flops.llm_per_token_sq);
  w.useful_flops =
      w.B * (stats.mean_tiles * useful.encoder_per_tile + stats.mean_length * useful.llm_per_token +
             stats.mean_length_sq * useful.llm_per_token_sq);
  const Frozen& f = limits.frozen;
  const double vit = static_cast<double>(VitParameterCount(model.vit));
  const double projector = static_cast<double>(ProjectorParameterCount(model));
  const double llm = static_cast<double>(LlmParameterCount(model.llm));
  w.enc_trained = (f.vision ? 0 : vit) + (f.projector ? 0 : projector);
  w.llm_trained = f.llm ? 0 : llm;
  w.budget = c.memory_bytes * limits.memory_fraction;
  w.patches = model.vit.seq();
  if (model.has_generator()) {
    w.generator = true;
    w.gen_flops = w.B * stats.mean_output_images * w.flops.generator_per_image;
    w.useful_flops += w.B * stats.mean_output_images * useful.generator_per_image;
    w.gen_trained =
        f.generator ? 0 : static_cast<double>(VitParameterCount(model.generator.denoiser));
    w.gen_rows = model.generator.denoiser.patches_per_tile() + 1 + model.generator.queries;
  }
  return w;
}

// What the runtime holds on a GPU (runtime/model/memory.h) on the fullest
// rank of a module's pipeline stages: the job's precision and sharding, the
// optimizer on the device, 1F1B's in-flight microbatches (encoder stages
// first), microbatches of `tokens` LLM tokens (`image_tokens` of them
// image positions) or bins of `tiles` tiles, `bins` of them per encoder
// replica.
StageMemoryOptions GpuMemoryOptions(const PlanLimits& limits, Recompute recompute, int tp, int dp,
                                    bool frozen) {
  StageMemoryOptions o;
  o.precision = limits.precision;
  o.tp = tp;
  o.optimizer_shards = limits.shard_optimizer ? dp : 1;
  o.dp = dp;
  o.frozen = frozen;
  o.recompute = recompute;
  o.device = true;
  o.optimizer_on_device = true;
  o.sequence_parallel = limits.sequence_parallel;
  return o;
}

// `last_stage` 0: the first stage alone.
double LlmPeakBytes(const ModelConfig& model, const PlanLimits& limits, int tp, int pp, int dp,
                    int m, double tokens, double image_tokens, int last_stage = -1) {
  const std::vector<int> b = LlmStages(model, pp).bounds;
  StageMemoryOptions o = GpuMemoryOptions(limits, limits.recompute, tp, dp, limits.frozen.llm);
  double peak = 0;
  for (int s = 0; s < (last_stage < 0 ? pp : last_stage + 1); ++s) {
    o.in_flight = std::min(m, pp - s);  // at LLM stage s, whatever the encoder's stages
    const MemoryEstimate e =
        LlmStageMemory(model.llm, b[s], b[s + 1], static_cast<int64_t>(std::ceil(tokens)),
                       static_cast<int64_t>(std::ceil(image_tokens)), o);
    peak = std::max(peak, static_cast<double>(e.total()));
  }
  return peak;
}

// The generator's peak (pp 1): its denoiser is a ViT over each picture's
// patches and its 1 + Q prefix rows, so its blocks are priced as the
// encoder's (the patch head and the conditions' projection, about a
// patch embedding's size each, are left out), `images` a microbatch,
// `bins` of them per replica, one live at a time (each bin's forward then
// its backward).
double GeneratorPeakBytes(const ModelConfig& model, const PlanLimits& limits, int tp, int dp,
                          double images, int bins) {
  const ModelConfig g = DenoiserAsEncoder(model);
  StageMemoryOptions o =
      GpuMemoryOptions(limits, limits.recompute, tp, dp, limits.frozen.generator);
  o.projector_frozen = true;
  o.sequence_parallel = false;  // the generator's blocks run without it
  const int64_t n = static_cast<int64_t>(std::ceil(images));
  return static_cast<double>(EncoderStageMemory(g, 0, g.vit.layers, n, bins, o, n).total());
}

double EncoderPeakBytes(const ModelConfig& model, const PlanLimits& limits, int tp, int pp, int dp,
                        double tiles, int bins) {
  const std::vector<int> b = VitStages(model, pp).bounds;
  StageMemoryOptions o =
      GpuMemoryOptions(limits, EncoderRecompute(limits), tp, dp, limits.frozen.vision);
  o.projector_frozen = limits.frozen.projector;
  double peak = 0;
  for (int s = 0; s < pp; ++s) {
    const MemoryEstimate e =
        EncoderStageMemory(model, b[s], b[s + 1], static_cast<int64_t>(std::ceil(tiles)), bins, o);
    peak = std::max(peak, static_cast<double>(e.total()));
  }
  return peak;
}

// Megatron-LM's memory, for its layout (SearchMonolithicPlan), not Loom's
// runtime: 18 bytes a trained parameter (bf16 weight, fp32 master,
// gradient and two moments), 2 a frozen one, and 34 · hidden bytes a token
// and layer of kept activations over TP (Korthikanti et al.: bf16, sequence
// parallelism, fused attention) for every microbatch in flight.
constexpr double kMegatronParamBytes = 18;
constexpr double kMegatronFrozenParamBytes = 2;
constexpr double kMegatronActBytesPerTokenLayer = 34;

double MegatronStateBytes(double params, bool frozen) {
  return params * (frozen ? kMegatronFrozenParamBytes : kMegatronParamBytes);
}

// Rates of one module replica (TP group) at a microbatch's tokens per GPU.
double LlmRate(const ClusterSpec& c, const BatchStats& stats, const Workload& w, int tp, int dp,
               int m) {
  const double mb_tokens = w.B * stats.mean_length / (dp * m);
  return tp * c.peak_flops * Efficiency(c, mb_tokens / tp) * TpEfficiency(tp);
}
double EncoderRate(const ClusterSpec& c, const BatchStats& stats, const Workload& w, int tp, int dp,
                   int m) {
  const double slot_tiles = w.B * stats.mean_tiles / (dp * m);
  return tp * c.peak_flops * Efficiency(c, std::max(slot_tiles, 1.0) * w.patches / tp) *
         TpEfficiency(tp);
}
double GeneratorRate(const ClusterSpec& c, const BatchStats& stats, const Workload& w, int tp,
                     int dp, int m) {
  const double slot_images = w.B * stats.mean_output_images / (dp * m);
  return tp * c.peak_flops * Efficiency(c, std::max(slot_images, 1.0) * w.gen_rows / tp) *
         TpEfficiency(tp);
}
// The query states' trip from the LLM's last stage to the generator and
// their gradients back, per microbatch: Q x D bf16 values a picture.
double QueryTransferSeconds(const ModelConfig& model, const BatchStats& stats, const Workload& w,
                            int dp, int m, double link) {
  if (!w.generator) return 0;
  return w.B * stats.mean_output_images * model.generator.queries * model.llm.dim * 2 / (dp * m) /
         link;
}

void FillModule(scheduler::v1::ModulePlan* p, int tp, int pp, int dp, int gpus, double mem,
                double stage, double allreduce) {
  p->set_tp(tp);
  p->set_pp(pp);
  p->set_dp(dp);
  p->set_gpus(gpus);
  p->set_memory_bytes(mem);
  p->set_stage_seconds(stage);
  p->set_allreduce_seconds(allreduce);
}

// The fields both searches fill the same way: per-sample time coefficients
// at the chosen degrees' efficiencies, the prediction and the search's cost.
void FillCommon(const ClusterSpec& c, const ClusterSpec& ce, const ModelConfig& model,
                const BatchStats& stats, const PlanLimits& limits, const Workload& w, double time,
                int64_t candidates, std::chrono::steady_clock::time_point t0,
                scheduler::v1::Plan* plan) {
  const auto& e = plan->encoder();
  const auto& l = plan->llm();
  const int m = plan->microbatches();
  plan->set_model(model.name);
  plan->set_cluster_gpus(c.gpus);
  plan->set_global_batch(stats.global_batch);
  scheduler::v1::CostCoefficients* k = plan->mutable_costs();
  const double rate_e = EncoderRate(ce, stats, w, e.tp(), e.dp(), m);
  const double rate_l = LlmRate(c, stats, w, l.tp(), l.dp(), m);
  k->set_encoder_per_tile(w.flops.encoder_per_tile / rate_e);
  k->set_llm_per_token(w.flops.llm_per_token / rate_l);
  k->set_llm_per_token_sq(w.flops.llm_per_token_sq / rate_l);
  if (w.generator) {
    const auto& g = plan->generator();
    k->set_generator_per_image(w.flops.generator_per_image /
                               GeneratorRate(c, stats, w, g.tp(), g.dp(), m));
  }
  k->set_transfer_per_image_token(
      plan->encoder_in_first_llm_stage()
          ? 0
          : w.flops.embedding_bytes_per_image_token /
                std::min(c.inter_node_bytes_per_second, ce.inter_node_bytes_per_second));
  SetStageShares(model, e.pp(), l.pp(), k);
  plan->set_encoder_recompute(RecomputeName(EncoderRecompute(limits)));
  plan->set_llm_recompute(RecomputeName(limits.recompute));
  plan->set_sequence_parallel(limits.sequence_parallel && (e.tp() > 1 || l.tp() > 1));
  plan->set_predicted_iteration_seconds(time);
  // Of the GPUs the plan runs on (the cluster's, when one pool).
  const bool separate = &c != &ce;
  const double peak =
      separate ? l.gpus() * c.peak_flops + e.gpus() * ce.peak_flops : c.gpus * c.peak_flops;
  plan->set_predicted_mfu(w.useful_flops / (time * peak));
  plan->set_candidates(candidates);
  plan->set_gpu_peak_flops(c.peak_flops);
  plan->set_gpu_memory_bytes(c.memory_bytes);
  plan->set_link_bytes_per_second(c.inter_node_bytes_per_second);
  plan->set_search_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace

absl::StatusOr<scheduler::v1::Plan> SearchPlan(const ClusterSpec& c, const ModelConfig& model,
                                               const BatchStats& stats, const PlanLimits& limits) {
  absl::StatusOr<std::vector<scheduler::v1::Plan>> plans = SearchPlans(c, model, stats, limits, 1);
  if (!plans.ok()) return plans.status();
  return std::move(plans->front());
}

namespace {

// A whole search's cost on each of its plans: configurations and seconds.
void StampSearch(int64_t candidates, std::chrono::steady_clock::time_point t0,
                 std::vector<scheduler::v1::Plan>* plans) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (scheduler::v1::Plan& p : *plans) {
    p.set_candidates(candidates);
    p.set_search_seconds(seconds);
  }
}

bool SameDegrees(const scheduler::v1::Plan& x, const scheduler::v1::Plan& y) {
  auto same = [](const scheduler::v1::ModulePlan& a, const scheduler::v1::ModulePlan& b) {
    return a.tp() == b.tp() && a.pp() == b.pp() && a.dp() == b.dp();
  };
  return same(x.encoder(), y.encoder()) && same(x.llm(), y.llm()) &&
         same(x.generator(), y.generator()) && x.colocated() == y.colocated();
}

// SearchPlans at the limits' recompute; `candidates` counts up.
// `encoder_pool`: the encoder on GPUs of that pool, all of them (no
// colocation); null: the encoder takes what the LLM leaves of `c`.
absl::StatusOr<std::vector<scheduler::v1::Plan>> SearchPlansAt(
    const ClusterSpec& c, const ModelConfig& model, const BatchStats& stats,
    const PlanLimits& limits, int count, std::chrono::steady_clock::time_point t0,
    int64_t& candidates, const ClusterSpec* encoder_pool = nullptr) {
  absl::StatusOr<Workload> work = WorkloadOf(c, model, stats, limits);
  if (!work.ok()) return work.status();
  const Workload& w = *work;
  const ModelFlops& flops = w.flops;
  const double B = w.B, enc_flops = w.enc_flops, llm_flops = w.llm_flops;
  const double budget = w.budget;
  const int patches = w.patches;
  const bool separate = encoder_pool != nullptr;
  const ClusterSpec& ce = separate ? *encoder_pool : c;
  const double budget_e = ce.memory_bytes * limits.memory_fraction;
  const double link = std::min(c.inter_node_bytes_per_second, ce.inter_node_bytes_per_second);

  struct Best {
    double time = INFINITY;
    int tp_e = 0, pp_e = 0, dp_e = 0, tp_l = 0, pp_l = 0, dp_l = 0, m = 0;
    double enc_stage = 0, llm_stage = 0, mem_e = 0, mem_l = 0, ar_e = 0, ar_l = 0;
    bool colocated = false;
    int tp_g = 0, dp_g = 0;  // the generator's (pp 1), where there is one
    double gen_stage = 0, mem_g = 0, ar_g = 0;
  };

  std::vector<Best> best;  // the `count` fastest that fit, fastest first
  // What a configuration must beat to be kept.
  auto bar = [&] { return static_cast<int>(best.size()) < count ? INFINITY : best.back().time; };
  const int max_tp = std::min(limits.max_tp, c.gpus_per_node);
  const int max_tp_e = std::min(limits.max_tp, ce.gpus_per_node);
  // The generator's TP degrees (0: no generator); it runs at pp 1 on GPUs
  // of its own, after the LLM's last stage.
  std::vector<int> gen_tps = {0};
  if (w.generator) {
    if (separate) {
      return absl::InvalidArgumentError(
          "a heterogeneous plan for a model with a generator: not searched yet");
    }
    gen_tps.clear();
    for (int tp : Divisors(model.generator.denoiser.heads, max_tp)) {
      if (GeneratorPeakBytes(model, limits, tp, c.gpus, 0, 0) <= budget) gen_tps.push_back(tp);
    }
  }
  for (int tp_l : Divisors(model.llm.kv(), max_tp)) {  // whole key/value groups
    for (int pp_l : Divisors(model.llm.layers, limits.max_llm_pp)) {
      std::map<int, int> least_m;  // LLM DP -> the least microbatch count that fits
      for (int tp_e : Divisors(model.vit.heads, max_tp_e)) {
        for (int pp_e : Divisors(model.vit.layers, limits.max_encoder_pp)) {
          const int group_l = tp_l * pp_l, group_e = tp_e * pp_e;
          // The parameters alone, at the most DP ranks (the fewest
          // moments): what no layout of these degrees holds less than.
          const double static_l = LlmPeakBytes(model, limits, tp_l, pp_l, c.gpus, 1, 0, 0);
          const double static_e = EncoderPeakBytes(model, limits, tp_e, pp_e, ce.gpus, 0, 0);
          if (static_l > budget || static_e > budget_e) continue;
          if (separate && ce.gpus < group_e) continue;
          // Disaggregated, the encoder on the GPUs the LLM leaves; colocated,
          // on the LLM's first-stage GPUs (tp_l x dp_l of them), beside it.
          for (bool colocated : {false, true})
            for (int tp_g : gen_tps) {
              if (colocated && (separate || !limits.colocate || tp_e % tp_l != 0)) continue;
              const int shared = colocated || separate ? 0 : group_e;  // of c's GPUs
              const int most_l = (c.gpus - shared - tp_g) / group_l;
              // Separate pools: the LLM on all of its GPUs (SearchHeterogeneousPlan
              // tries fewer as pools of their own).
              for (int dp_l = separate ? std::max(1, most_l) : 1; dp_l <= most_l;
                   dp_l = NextDp(dp_l, most_l, limits.dp_step)) {
                const int first = tp_l * dp_l;
                if (colocated && first % group_e != 0) continue;
                // The encoder's and the generator's replicas: the generator's
                // GPUs near their share of the two modules' FLOPs (stage
                // times go as FLOPs over GPUs), the encoder the rest.
                std::vector<std::pair<int, int>> splits;  // (dp_e, dp_g)
                const int rest = c.gpus - group_l * dp_l;
                if (tp_g == 0) {
                  splits.push_back({colocated  ? first / group_e
                                    : separate ? ce.gpus / group_e
                                               : rest / group_e,
                                    0});
                } else if (colocated) {
                  splits.push_back({first / group_e, rest / tp_g});
                } else {
                  const double work = w.gen_flops + w.enc_flops;
                  const double share = work > 0 ? w.gen_flops / work : 0.5;
                  const int most_g = (rest - group_e) / tp_g;  // the encoder keeps a replica
                  const int g0 = std::clamp(static_cast<int>(std::lround(rest * share / tp_g)), 1,
                                            std::max(1, most_g));
                  for (int dp_g = std::max(1, g0 - 1); dp_g <= std::min(most_g, g0 + 1); ++dp_g) {
                    splits.push_back({(rest - dp_g * tp_g) / group_e, dp_g});
                  }
                }
                for (const auto& [dp_e, dp_g] : splits) {
                  const double ar_l = RingAllreduceSeconds(kGradBytes * w.llm_trained / group_l,
                                                           dp_l, group_l * dp_l, c);
                  const double ar_e = RingAllreduceSeconds(kGradBytes * w.enc_trained / group_e,
                                                           dp_e, group_e * dp_e, ce);
                  const double ar_g = tp_g > 0
                                          ? RingAllreduceSeconds(kGradBytes * w.gen_trained / tp_g,
                                                                 dp_g, tp_g * dp_g, c)
                                          : 0;
                  const int max_m =
                      std::min<int>(limits.max_microbatches, static_cast<int>(B) / dp_l);
                  // The LLM's memory at m microbatches (>= pp_l: its in-flight
                  // count is fixed, its microbatches shrink as m grows, so the
                  // memory does not grow with m): the least m that fits, by
                  // bisection, is where the loop starts.
                  auto llm_bytes = [&](int m, int last_stage = -1) {
                    return LlmPeakBytes(
                        model, limits, tp_l, pp_l, dp_l, m,
                        B * stats.mean_length / (dp_l * m) * kMicrobatchHeadroom,
                        B * stats.mean_image_tokens / (dp_l * m) * kMicrobatchHeadroom, last_stage);
                  };
                  auto [memo, fresh] = least_m.try_emplace(dp_l, max_m + 1);
                  for (int lo = pp_l, hi = max_m; fresh && lo <= hi;) {
                    const int mid = lo + (hi - lo) / 2;
                    if (llm_bytes(mid) <= budget) {
                      memo->second = mid;
                      hi = mid - 1;
                    } else {
                      lo = mid + 1;
                    }
                  }
                  for (int m = memo->second; m <= max_m; ++m) {
                    ++candidates;
                    // LLM stage: one microbatch through one stage.
                    const double mb_tokens = B * stats.mean_length / (dp_l * m);
                    const double eff_l = Efficiency(c, mb_tokens / tp_l) * TpEfficiency(tp_l);
                    double llm_stage =
                        llm_flops / (dp_l * m) / (pp_l * tp_l * c.peak_flops * eff_l);
                    if (pp_l > 1) {
                      const double bw = group_l > c.gpus_per_node ? c.inter_node_bytes_per_second
                                                                  : c.intra_node_bytes_per_second;
                      llm_stage += 2 * mb_tokens * model.llm.dim * 2 / tp_l / bw;
                    }
                    // Encoder stage: its share of one microbatch slot's tiles
                    // (colocated: what each first-stage GPU spends on them).
                    const double slot_tiles = B * stats.mean_tiles / (dp_e * m);
                    const double eff_e =
                        Efficiency(ce, slot_tiles * patches / tp_e) * TpEfficiency(tp_e);
                    const double enc_stage =
                        enc_flops > 0
                            ? enc_flops / (dp_e * m) / (pp_e * tp_e * ce.peak_flops * eff_e)
                            : 0;
                    const double transfer = B * stats.mean_image_tokens *
                                            flops.embedding_bytes_per_image_token / (dp_l * m) /
                                            link;
                    // The generator: a stage after the LLM's last (pp 1), its
                    // microbatch slot's pictures, the query states' transfer.
                    const int pp_g = tp_g > 0 ? 1 : 0;
                    const double gen_stage =
                        tp_g > 0 && w.gen_flops > 0
                            ? w.gen_flops / (dp_g * m) / GeneratorRate(c, stats, w, tp_g, dp_g, m)
                            : 0;
                    const double gen_transfer =
                        QueryTransferSeconds(model, stats, w, dp_l, m, link);
                    // Colocated, the first stage's GPUs run both modules' work
                    // (as the monolithic layout's, plus the encoder's pipeline
                    // fill) and both allreduces.
                    const double time =
                        colocated
                            ? (m + pp_l + pp_g - 1) * std::max({llm_stage + enc_stage, transfer,
                                                                gen_stage, gen_transfer}) +
                                  (pp_e - 1) * enc_stage + std::max(ar_l + ar_e, ar_g)
                            : (m + pp_e + pp_l + pp_g - 1) *
                                      std::max({llm_stage, enc_stage, transfer, gen_stage,
                                                gen_transfer}) +
                                  std::max({ar_l, ar_e, ar_g});
                    if (time >= bar()) continue;
                    const double mem_l = llm_bytes(m);
                    double mem_e = EncoderPeakBytes(model, limits, tp_e, pp_e, dp_e,
                                                    slot_tiles * kMicrobatchHeadroom,
                                                    (dp_l * m + dp_e - 1) / dp_e);
                    if (colocated) {  // a GPU holds an encoder rank and a first-stage LLM rank
                      mem_e += llm_bytes(m, 0);
                    }
                    if (mem_l > budget || mem_e > (colocated ? budget : budget_e)) continue;
                    const double mem_g =
                        tp_g > 0 ? GeneratorPeakBytes(model, limits, tp_g, dp_g,
                                                      B * stats.mean_output_images / (dp_g * m) *
                                                          kMicrobatchHeadroom,
                                                      (dp_l * m + dp_g - 1) / dp_g)
                                 : 0;
                    if (mem_g > budget) continue;
                    const Best b{time,      tp_e,      pp_e,      dp_e,      tp_l,  pp_l, dp_l,
                                 m,         enc_stage, llm_stage, mem_e,     mem_l, ar_e, ar_l,
                                 colocated, tp_g,      dp_g,      gen_stage, mem_g, ar_g};
                    // One candidate per layout (its degrees), at its best
                    // microbatch count.
                    auto same = std::find_if(best.begin(), best.end(), [&](const Best& x) {
                      return x.tp_e == tp_e && x.pp_e == pp_e && x.dp_e == dp_e && x.tp_l == tp_l &&
                             x.pp_l == pp_l && x.dp_l == dp_l && x.colocated == colocated &&
                             x.tp_g == tp_g && x.dp_g == dp_g;
                    });
                    if (same != best.end()) {
                      if (same->time <= time) continue;
                      best.erase(same);
                    }
                    best.insert(std::upper_bound(
                                    best.begin(), best.end(), b,
                                    [](const Best& x, const Best& y) { return x.time < y.time; }),
                                b);
                    if (static_cast<int>(best.size()) > count) best.pop_back();
                  }
                }
              }
            }
        }
      }
    }
  }
  if (best.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat("no plan for ", model.name, " on ", c.gpus,
                                                     " GPUs fits in ", budget / (1 << 30),
                                                     " GiB per GPU"));
  }
  std::vector<scheduler::v1::Plan> plans;
  for (const Best& b : best) {
    scheduler::v1::Plan& plan = plans.emplace_back();
    FillModule(plan.mutable_encoder(), b.tp_e, b.pp_e, b.dp_e, b.tp_e * b.pp_e * b.dp_e, b.mem_e,
               b.enc_stage, b.ar_e);
    FillModule(plan.mutable_llm(), b.tp_l, b.pp_l, b.dp_l, b.tp_l * b.pp_l * b.dp_l, b.mem_l,
               b.llm_stage, b.ar_l);
    plan.set_microbatches(b.m);
    plan.set_colocated(b.colocated);
    if (b.tp_g > 0) {
      FillModule(plan.mutable_generator(), b.tp_g, 1, b.dp_g, b.tp_g * b.dp_g, b.mem_g, b.gen_stage,
                 b.ar_g);
    }
    FillCommon(c, ce, model, stats, limits, w, b.time, candidates, t0, &plan);
  }
  return plans;
}

}  // namespace

absl::StatusOr<std::vector<scheduler::v1::Plan>> SearchPlans(const ClusterSpec& c,
                                                             const ModelConfig& model,
                                                             const BatchStats& stats,
                                                             const PlanLimits& limits, int count) {
  if (count < 1) return absl::InvalidArgumentError(absl::StrCat("want ", count, " plans"));
  const auto t0 = std::chrono::steady_clock::now();
  int64_t candidates = 0;
  if (!limits.search_recompute)
    return SearchPlansAt(c, model, stats, limits, count, t0, candidates);
  // Every pair of the modules' recompute, merged: the `count` fastest
  // layouts, each at its fastest pair (the earlier pair at equal time).
  std::vector<scheduler::v1::Plan> merged;
  absl::Status last;
  for (Recompute llm : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    for (Recompute encoder : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      PlanLimits at = limits;
      at.search_recompute = false;
      at.recompute = llm;
      at.encoder_recompute = encoder;
      absl::StatusOr<std::vector<scheduler::v1::Plan>> plans =
          SearchPlansAt(c, model, stats, at, count, t0, candidates);
      if (!plans.ok()) {
        if (!absl::IsResourceExhausted(plans.status())) return plans.status();
        last = plans.status();
        continue;
      }
      for (scheduler::v1::Plan& p : *plans) {
        auto same = std::find_if(merged.begin(), merged.end(),
                                 [&](const scheduler::v1::Plan& x) { return SameDegrees(x, p); });
        if (same != merged.end()) {
          if (same->predicted_iteration_seconds() <= p.predicted_iteration_seconds()) continue;
          merged.erase(same);
        }
        merged.push_back(std::move(p));
      }
    }
  }
  if (merged.empty()) return last;
  std::stable_sort(merged.begin(), merged.end(), [](const auto& x, const auto& y) {
    return x.predicted_iteration_seconds() < y.predicted_iteration_seconds();
  });
  if (static_cast<int>(merged.size()) > count) merged.resize(count);
  StampSearch(candidates, t0, &merged);
  return merged;
}

absl::StatusOr<scheduler::v1::Plan> SearchHeterogeneousPlan(const std::vector<GpuKind>& kinds,
                                                            const ModelConfig& model,
                                                            const BatchStats& stats,
                                                            const PlanLimits& limits,
                                                            const HeterogeneousOptions& options) {
  absl::StatusOr<std::vector<scheduler::v1::Plan>> plans =
      SearchHeterogeneousPlans(kinds, model, stats, limits, options, 1);
  if (!plans.ok()) return plans.status();
  return std::move(plans->front());
}

absl::StatusOr<std::vector<scheduler::v1::Plan>> SearchHeterogeneousPlans(
    const std::vector<GpuKind>& kinds, const ModelConfig& model, const BatchStats& stats,
    const PlanLimits& limits, const HeterogeneousOptions& options, int count) {
  const auto t0 = std::chrono::steady_clock::now();
  if (count < 1) return absl::InvalidArgumentError(absl::StrCat("want ", count, " plans"));
  if (kinds.empty()) return absl::InvalidArgumentError("no GPU kinds");
  for (size_t i = 0; i < kinds.size(); ++i) {
    if (kinds[i].count < 1 || !(kinds[i].price_per_hour >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("GPU kind \"", kinds[i].name, "\": ", kinds[i].count, " GPUs at a price of ",
                       kinds[i].price_per_hour, " an hour (want >= 1 and >= 0)"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (kinds[j].name == kinds[i].name) {
        return absl::InvalidArgumentError(
            absl::StrCat("GPU kind \"", kinds[i].name, "\" named twice"));
      }
    }
  }
  PlanLimits at = limits;
  at.search_recompute = false;
  if (at.dp_step <= 0) at.dp_step = 0.01;
  // Each kind's counts to try: all of it, and halves of it down to an
  // eighth for the LLM's kind when minimising the cost (fewer GPUs, slower
  // but maybe cheaper per sample), to a 16th for an encoder on a kind of
  // its own (more encoder ranks than it needs only lengthen its
  // allreduce).
  auto counts = [&](int n, size_t levels) {
    std::vector<int> out = {n};
    while (out.size() < levels && out.back() / 2 >= 1) out.push_back(out.back() / 2);
    return out;
  };
  int64_t candidates = 0;
  std::vector<std::pair<double, scheduler::v1::Plan>> best;  // (key, plan), best first
  absl::Status last = absl::ResourceExhaustedError("no plan fits");
  for (const GpuKind& kl : kinds) {
    for (const GpuKind& ke : kinds) {
      const bool one = &kl == &ke;
      for (int nl : counts(kl.count, options.minimise_cost ? 4 : 1)) {
        for (int ne : one ? std::vector<int>{0} : counts(ke.count, 5)) {
          ClusterSpec cl = kl.gpu, ce = ke.gpu;
          cl.gpus = nl;
          ce.gpus = ne;
          absl::StatusOr<std::vector<scheduler::v1::Plan>> plans =
              SearchPlansAt(cl, model, stats, at, 1, t0, candidates, one ? nullptr : &ce);
          if (!plans.ok()) {
            last = plans.status();
            continue;
          }
          scheduler::v1::Plan& p = plans->front();
          p.mutable_llm()->set_gpu_kind(kl.name);
          p.mutable_encoder()->set_gpu_kind(ke.name);
          if (p.has_generator()) p.mutable_generator()->set_gpu_kind(kl.name);  // one kind
          p.set_cost_per_hour((p.llm().gpus() + p.generator().gpus()) * kl.price_per_hour +
                              (p.colocated() ? 0 : p.encoder().gpus() * ke.price_per_hour));
          p.set_cluster_gpus(p.llm().gpus() + p.generator().gpus() +
                             (p.colocated() ? 0 : p.encoder().gpus()));
          const double time = p.predicted_iteration_seconds();
          if (options.max_iteration_seconds > 0 && time > options.max_iteration_seconds) {
            last = absl::ResourceExhaustedError(absl::StrCat(
                "no plan is predicted within ", options.max_iteration_seconds, " s an iteration"));
            continue;
          }
          const double key =
              options.minimise_cost ? p.cost_per_hour() * time / stats.global_batch : time;
          auto at = std::upper_bound(best.begin(), best.end(), key,
                                     [](double k, const auto& x) { return k < x.first; });
          best.insert(at, {key, std::move(p)});
          if (static_cast<int>(best.size()) > count) best.pop_back();
        }
      }
    }
  }
  if (best.empty()) return last;
  std::vector<scheduler::v1::Plan> out;
  for (auto& [key, p] : best) out.push_back(std::move(p));
  StampSearch(candidates, t0, &out);
  return out;
}

absl::StatusOr<scheduler::v1::Plan> SearchMonolithicPlan(const ClusterSpec& c,
                                                         const ModelConfig& model,
                                                         const BatchStats& stats,
                                                         const PlanLimits& limits,
                                                         bool balance_first_stage) {
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<Workload> work = WorkloadOf(c, model, stats, limits);
  if (!work.ok()) return work.status();
  const Workload& w = *work;
  const LlmConfig& L = model.llm;
  // Stage costs in layers of the LLM: a layer, the head on the last stage.
  const double layer = static_cast<double>(LlmLayerWeights(L));
  const double head = 1.0 * L.dim * L.vocab / layer;
  const double llm_units = L.layers + head;
  struct Best {
    double time = INFINITY;
    int tp = 0, pp = 0, dp = 0, m = 0, first_layers = 0;
    double stage = 0, mem = 0, ar_l = 0, ar_e = 0, ar_g = 0, gen_mb = 0, gen_mem = 0;
  } best;
  // A generator runs inside the LLM's last stage, at the LLM's TP and DP
  // (as BAGEL's generation experts and Megatron MIMO run it): its state
  // and activations on those GPUs, its time added to that stage's.
  const double gen_params =
      w.generator ? static_cast<double>(VitParameterCount(model.generator.denoiser)) : 0;
  int64_t candidates = 0;
  const int max_tp = std::min(limits.max_tp, c.gpus_per_node);
  for (int tp : Divisors(L.kv(), max_tp)) {
    if (model.vit.heads % tp != 0) continue;  // one TP for every module
    if (w.generator && model.generator.denoiser.heads % tp != 0) continue;
    for (int pp : Divisors(L.layers, limits.max_llm_pp)) {
      const StageSplit even = LlmStages(model, pp);
      const Frozen& f = limits.frozen;
      const double static_first =  // stage 0 holds both modules
          (MegatronStateBytes(static_cast<double>(LlmParameterCount(L)), f.llm) / pp +
           MegatronStateBytes(static_cast<double>(VitParameterCount(model.vit)), f.vision) +
           MegatronStateBytes(static_cast<double>(ProjectorParameterCount(model)), f.projector)) /
          tp;
      if (static_first > w.budget) continue;
      for (int dp = 1; tp * pp * dp <= c.gpus; ++dp) {
        const int gpus = tp * pp * dp;
        const double ar_l =
            RingAllreduceSeconds(kGradBytes * w.llm_trained / (tp * pp), dp, gpus, c);
        const double ar_e = RingAllreduceSeconds(kGradBytes * w.enc_trained / tp, dp, gpus, c);
        const double ar_g = RingAllreduceSeconds(kGradBytes * w.gen_trained / tp, dp, gpus, c);
        const int max_m = std::min<int>(limits.max_microbatches, static_cast<int>(w.B) / dp);
        for (int m = pp; m <= max_m; ++m) {
          ++candidates;
          const double mb_tokens = w.B * stats.mean_length / (dp * m);
          const double llm_mb = w.llm_flops / (dp * m) / LlmRate(c, stats, w, tp, dp, m);
          const double enc_mb =
              w.enc_flops > 0 ? w.enc_flops / (dp * m) / EncoderRate(c, stats, w, tp, dp, m) : 0;
          double p2p = 0;
          if (pp > 1) {
            const double bw = gpus > c.gpus_per_node ? c.inter_node_bytes_per_second
                                                     : c.intra_node_bytes_per_second;
            p2p = 2 * mb_tokens * L.dim * 2 / tp / bw;
          }
          // Layers of the first stage: the LLM's own split's, or as many
          // as leave it no slower than the others (the rest split evenly,
          // remainders on the earliest); the largest later stage.
          int first = even.bounds[1];
          double later_units = 0;  // of the largest stage after the first
          for (int st = 1; st < pp && !balance_first_stage; ++st) {
            later_units = std::max(later_units, even.share[st] * llm_units);
          }
          if (balance_first_stage && pp > 1) {
            const double enc_units = enc_mb / llm_mb * llm_units;
            auto later = [&](int k) { return LaterStageUnits(L.layers - k, pp - 1, head); };
            auto worst = [&](int k) { return std::max(enc_units + k, later(k)); };
            const double x = (llm_units - (pp - 1) * enc_units) / pp;
            first = std::clamp(static_cast<int>(x), 1, L.layers - (pp - 1));
            for (int k : {first - 1, first + 1}) {
              if (k >= 1 && k <= L.layers - (pp - 1) && worst(k) < worst(first)) first = k;
            }
            later_units = later(first);
          }
          const double first_units =
              balance_first_stage ? first + (pp == 1 ? head : 0) : even.share[0] * llm_units;
          // The generator's microbatch on the last stage (the largest later
          // stage's time: an upper bound on the last's).
          const double gen_mb =
              w.gen_flops > 0 ? w.gen_flops / (dp * m) / GeneratorRate(c, stats, w, tp, dp, m) : 0;
          double stage = pp == 1 ? enc_mb + llm_mb * first_units / llm_units + gen_mb
                                 : std::max(enc_mb + llm_mb * first_units / llm_units,
                                            llm_mb * later_units / llm_units + gen_mb);
          stage += p2p;
          const double time = (m + pp - 1) * stage + ar_l + ar_e + ar_g;
          if (time >= best.time) continue;
          const double slot_tiles = w.B * stats.mean_tiles / (dp * m);
          const double act = kMicrobatchHeadroom * kMegatronActBytesPerTokenLayer / tp;
          const double mem =
              static_first + std::min(pp, m) * act *
                                 (mb_tokens * L.dim * first +
                                  slot_tiles * w.patches * model.vit.dim * model.vit.layers);
          if (mem > w.budget) continue;
          double gen_mem = 0;  // the stage that holds the generator: the last
          if (w.generator) {
            const GeneratorConfig& g = model.generator;
            const double slot_images = w.B * stats.mean_output_images / (dp * m);
            const double gen = MegatronStateBytes(gen_params, f.generator) / tp +
                               act * slot_images * w.gen_rows * g.denoiser.dim * g.denoiser.layers;
            gen_mem = pp == 1
                          ? mem + gen
                          : MegatronStateBytes(static_cast<double>(LlmParameterCount(L)), f.llm) /
                                    pp / tp +
                                std::min(pp, m) * act * mb_tokens * L.dim * later_units + gen;
            if (gen_mem > w.budget) continue;
          }
          best = {time, tp, pp, dp, m, first, stage, mem, ar_l, ar_e, ar_g, gen_mb, gen_mem};
        }
      }
    }
  }
  if (!std::isfinite(best.time)) {
    return absl::ResourceExhaustedError(absl::StrCat("no monolithic layout for ", model.name,
                                                     " on ", c.gpus, " GPUs fits in ",
                                                     w.budget / (1 << 30), " GiB per GPU"));
  }
  scheduler::v1::Plan plan;
  plan.set_encoder_in_first_llm_stage(true);
  FillModule(plan.mutable_encoder(), best.tp, 1, best.dp, 0, best.mem, best.stage, best.ar_e);
  FillModule(plan.mutable_llm(), best.tp, best.pp, best.dp, best.tp * best.pp * best.dp, best.mem,
             best.stage, best.ar_l);
  plan.set_microbatches(best.m);
  if (w.generator) {
    FillModule(plan.mutable_generator(), best.tp, 1, best.dp, 0, best.gen_mem, best.gen_mb,
               best.ar_g);
  }
  // The LLM's stage shares: the first stage's layers, the rest split evenly
  // (the later stages taking the remainder), the head on the last.
  scheduler::v1::CostCoefficients* k = plan.mutable_costs();
  if (balance_first_stage) {
    const int rest = L.layers - best.first_layers, later = best.pp - 1;
    for (int st = 0; st < best.pp; ++st) {
      double units = st == 0 ? best.first_layers : rest / later + (st - 1 < rest % later ? 1 : 0);
      if (st == best.pp - 1) units += head;
      k->add_llm_stage_share(units / llm_units);
    }
  }  // else FillCommon's: the LLM's own split
  FillCommon(c, c, model, stats, limits, w, best.time, candidates, t0, &plan);
  return plan;
}

}  // namespace loom::sched
