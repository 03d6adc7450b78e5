#include "runtime/scheduling/plan.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace loom::sched {
namespace {

constexpr double kParamStateBytes = 18;        // bf16 weight + fp32 master, grad, 2 moments
constexpr double kActBytesPerTokenLayer = 34;  // x hidden dim, bf16, fused attention
constexpr double kGradBytes = 2;               // bf16 gradients on the wire
constexpr double kMicrobatchHeadroom = 1.3;    // largest microbatch over the mean

double TpEfficiency(int tp) { return 1.0 / (1.0 + 0.04 * std::log2(static_cast<double>(tp))); }

double Efficiency(const ClusterSpec& c, double tokens_per_gpu) {
  return c.max_efficiency * tokens_per_gpu / (tokens_per_gpu + c.saturation_tokens);
}

double RingAllreduceSeconds(double bytes, int dp, int gpus_in_group, const ClusterSpec& c) {
  if (dp <= 1) return 0;
  const double bw = gpus_in_group > c.gpus_per_node ? c.inter_node_bytes_per_second
                                                    : c.intra_node_bytes_per_second;
  return 2.0 * (dp - 1) / dp * bytes / bw;
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
  }
  const double n = static_cast<double>(samples.size());
  s.mean_tiles /= n;
  s.mean_image_tokens /= n;
  s.mean_length /= n;
  s.mean_length_sq /= n;
  return s;
}

scheduler::v1::CostCoefficients CoefficientsOnOneGpu(const ModelConfig& model,
                                                     const ClusterSpec& cluster) {
  const ModelFlops f = AnalyticFlops(model, false);
  const double rate = cluster.peak_flops * cluster.max_efficiency;
  scheduler::v1::CostCoefficients c;
  c.set_encoder_per_tile(f.encoder_per_tile / rate);
  c.set_llm_per_token(f.llm_per_token / rate);
  c.set_llm_per_token_sq(f.llm_per_token_sq / rate);
  c.set_transfer_per_image_token(f.embedding_bytes_per_image_token /
                                 cluster.inter_node_bytes_per_second);
  return c;
}

absl::StatusOr<scheduler::v1::Plan> SearchPlan(const ClusterSpec& c, const ModelConfig& model,
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
  const auto t0 = std::chrono::steady_clock::now();
  const ModelFlops flops = AnalyticFlops(model, limits.recompute);
  const ModelFlops useful = AnalyticFlops(model, false);
  const double B = stats.global_batch;
  const double enc_flops = B * stats.mean_tiles * flops.encoder_per_tile;
  const double llm_flops =
      B * (stats.mean_length * flops.llm_per_token + stats.mean_length_sq * flops.llm_per_token_sq);
  const double useful_flops =
      B * (stats.mean_tiles * useful.encoder_per_tile + stats.mean_length * useful.llm_per_token +
           stats.mean_length_sq * useful.llm_per_token_sq);
  const double enc_params =
      static_cast<double>(VitParameterCount(model.vit) + ProjectorParameterCount(model));
  const double llm_params = static_cast<double>(LlmParameterCount(model.llm));
  const double budget = c.memory_bytes * limits.memory_fraction;
  const int patches = model.vit.patches_per_tile();

  struct Best {
    double time = INFINITY;
    int tp_e = 0, pp_e = 0, dp_e = 0, tp_l = 0, pp_l = 0, dp_l = 0, m = 0;
    double enc_stage = 0, llm_stage = 0, mem_e = 0, mem_l = 0, ar_e = 0, ar_l = 0;
  } best;
  int64_t candidates = 0;
  const int max_tp = std::min(limits.max_tp, c.gpus_per_node);
  for (int tp_l : Divisors(model.llm.heads, max_tp)) {
    for (int pp_l : Divisors(model.llm.layers, limits.max_llm_pp)) {
      for (int tp_e : Divisors(model.vit.heads, max_tp)) {
        for (int pp_e : Divisors(model.vit.layers, limits.max_encoder_pp)) {
          const int group_l = tp_l * pp_l, group_e = tp_e * pp_e;
          const double static_l = kParamStateBytes * llm_params / group_l;
          const double static_e = kParamStateBytes * enc_params / group_e;
          if (static_l > budget || static_e > budget) continue;
          for (int dp_l = 1; group_l * dp_l + group_e <= c.gpus; ++dp_l) {
            const int dp_e = (c.gpus - group_l * dp_l) / group_e;
            const double ar_l =
                RingAllreduceSeconds(kGradBytes * llm_params / group_l, dp_l, group_l * dp_l, c);
            const double ar_e =
                RingAllreduceSeconds(kGradBytes * enc_params / group_e, dp_e, group_e * dp_e, c);
            const int max_m = std::min<int>(limits.max_microbatches, static_cast<int>(B) / dp_l);
            for (int m = pp_l; m <= max_m; ++m) {
              ++candidates;
              // LLM stage: one microbatch through one stage.
              const double mb_tokens = B * stats.mean_length / (dp_l * m);
              const double eff_l = Efficiency(c, mb_tokens / tp_l) * TpEfficiency(tp_l);
              double llm_stage = llm_flops / (dp_l * m) / (pp_l * tp_l * c.peak_flops * eff_l);
              if (pp_l > 1) {
                const double bw = group_l > c.gpus_per_node ? c.inter_node_bytes_per_second
                                                            : c.intra_node_bytes_per_second;
                llm_stage += 2 * mb_tokens * model.llm.dim * 2 / tp_l / bw;
              }
              // Encoder stage: its share of one microbatch slot's tiles.
              const double slot_tiles = B * stats.mean_tiles / (dp_e * m);
              const double eff_e = Efficiency(c, slot_tiles * patches / tp_e) * TpEfficiency(tp_e);
              const double enc_stage =
                  enc_flops > 0 ? enc_flops / (dp_e * m) / (pp_e * tp_e * c.peak_flops * eff_e) : 0;
              const double transfer = B * stats.mean_image_tokens *
                                      flops.embedding_bytes_per_image_token / (dp_l * m) /
                                      c.inter_node_bytes_per_second;
              const double stage = std::max({llm_stage, enc_stage, transfer});
              const double time = (m + pp_e + pp_l - 1) * stage + std::max(ar_l, ar_e);
              if (time >= best.time) continue;
              const double mem_l = static_l + std::min(pp_l, m) * mb_tokens * kMicrobatchHeadroom *
                                                  kActBytesPerTokenLayer * model.llm.dim *
                                                  model.llm.layers / pp_l / tp_l;
              const double mem_e = static_e + std::min(pp_e + pp_l, m) * slot_tiles * patches *
                                                  kMicrobatchHeadroom * kActBytesPerTokenLayer *
                                                  model.vit.dim * model.vit.layers / pp_e / tp_e;
              if (mem_l > budget || mem_e > budget) continue;
              best = {time, tp_e,      pp_e,      dp_e,  tp_l,  pp_l, dp_l,
                      m,    enc_stage, llm_stage, mem_e, mem_l, ar_e, ar_l};
            }
          }
        }
      }
    }
  }
  if (!std::isfinite(best.time)) {
    return absl::ResourceExhaustedError(absl::StrCat("no plan for ", model.name, " on ", c.gpus,
                                                     " GPUs fits in ", budget / (1 << 30),
                                                     " GiB per GPU"));
  }
  scheduler::v1::Plan plan;
  plan.set_model(model.name);
  plan.set_cluster_gpus(c.gpus);
  auto fill = [](scheduler::v1::ModulePlan* p, int tp, int pp, int dp, double mem, double stage,
                 double allreduce) {
    p->set_tp(tp);
    p->set_pp(pp);
    p->set_dp(dp);
    p->set_gpus(tp * pp * dp);
    p->set_memory_bytes(mem);
    p->set_stage_seconds(stage);
    p->set_allreduce_seconds(allreduce);
  };
  fill(plan.mutable_encoder(), best.tp_e, best.pp_e, best.dp_e, best.mem_e, best.enc_stage,
       best.ar_e);
  fill(plan.mutable_llm(), best.tp_l, best.pp_l, best.dp_l, best.mem_l, best.llm_stage, best.ar_l);
  plan.set_microbatches(best.m);
  plan.set_global_batch(stats.global_batch);
  // Per-sample time coefficients at the chosen plan's efficiencies.
  const double mb_tokens = B * stats.mean_length / (best.dp_l * best.m);
  const double rate_l =
      best.tp_l * c.peak_flops * Efficiency(c, mb_tokens / best.tp_l) * TpEfficiency(best.tp_l);
  const double slot_tiles = B * stats.mean_tiles / (best.dp_e * best.m);
  const double rate_e = best.tp_e * c.peak_flops *
                        Efficiency(c, std::max(slot_tiles, 1.0) * patches / best.tp_e) *
                        TpEfficiency(best.tp_e);
  scheduler::v1::CostCoefficients* k = plan.mutable_costs();
  k->set_encoder_per_tile(flops.encoder_per_tile / rate_e);
  k->set_llm_per_token(flops.llm_per_token / rate_l);
  k->set_llm_per_token_sq(flops.llm_per_token_sq / rate_l);
  k->set_transfer_per_image_token(flops.embedding_bytes_per_image_token /
                                  c.inter_node_bytes_per_second);
  SetStageShares(model, best.pp_e, best.pp_l, k);
  plan.set_predicted_iteration_seconds(best.time);
  plan.set_predicted_mfu(useful_flops / (best.time * c.gpus * c.peak_flops));
  plan.set_candidates(candidates);
  plan.set_gpu_peak_flops(c.peak_flops);
  plan.set_gpu_memory_bytes(c.memory_bytes);
  plan.set_link_bytes_per_second(c.inter_node_bytes_per_second);
  plan.set_search_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return plan;
}

}  // namespace loom::sched
