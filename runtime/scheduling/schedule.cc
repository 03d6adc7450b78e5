#include "runtime/scheduling/schedule.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "runtime/base/file.h"
#include "runtime/base/trace.h"
#include "runtime/scheduling/simulate.h"

namespace loom::sched {

scheduler::v1::Plan PlanOfDegrees(const Degrees& d) {
  scheduler::v1::Plan plan;
  for (auto [module, dp, tp, pp] :
       {std::make_tuple(plan.mutable_llm(), d.llm_dp, d.llm_tp, d.llm_pp),
        std::make_tuple(plan.mutable_encoder(), d.encoder_dp, d.encoder_tp, d.encoder_pp)}) {
    module->set_tp(tp);
    module->set_pp(pp);
    module->set_dp(dp);
    module->set_gpus(tp * pp * dp);
  }
  if (d.generator_dp > 0) {
    scheduler::v1::ModulePlan* g = plan.mutable_generator();
    g->set_tp(d.generator_tp);
    g->set_pp(d.generator_pp);
    g->set_dp(d.generator_dp);
    g->set_gpus(d.generator_tp * d.generator_pp * d.generator_dp);
  }
  plan.set_microbatches(d.microbatches);
  plan.set_colocated(d.colocate);
  plan.set_cluster_gpus(plan.llm().gpus() + (d.colocate ? 0 : plan.encoder().gpus()) +
                        plan.generator().gpus());
  return plan;
}

absl::StatusOr<scheduler::v1::Plan> PlanFromFileOrDegrees(const std::string& path,
                                                          const Degrees& d) {
  const int llm_dp = d.llm_dp, microbatches = d.microbatches, encoder_dp = d.encoder_dp;
  const bool degrees = llm_dp != 0 || microbatches != 0 || encoder_dp != 0;
  if (!path.empty()) {
    if (degrees) {
      return absl::InvalidArgumentError(
          "give --plan or --llm_dp/--microbatches/--encoder_dp, not both");
    }
    absl::StatusOr<std::string> text = ReadFile(path);
    if (!text.ok()) return text.status();
    scheduler::v1::Plan plan;
    if (auto s = google::protobuf::util::JsonStringToMessage(*text, &plan); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--plan ", path, ": ", s.message().ToString()));
    }
    return plan;
  }
  if (llm_dp < 1 || microbatches < 1 || encoder_dp < 1) {
    return absl::InvalidArgumentError(
        "give --plan FILE, or --llm_dp, --microbatches and --encoder_dp (each >= 1)");
  }
  if (d.llm_tp < 1 || d.encoder_tp < 1 || d.llm_pp < 1 || d.encoder_pp < 1) {
    return absl::InvalidArgumentError(
        "--llm_tp, --encoder_tp, --llm_pp and --encoder_pp must be >= 1");
  }
  return PlanOfDegrees(d);
}

SimulationOptions SimulationOptionsFor(const scheduler::v1::Plan& plan) {
  SimulationOptions so;
  so.encoder_dp = plan.encoder().dp();
  so.encoder_pp = plan.encoder().pp();
  so.llm_dp = plan.llm().dp();
  so.llm_pp = plan.llm().pp();
  so.microbatches = plan.microbatches();
  so.encoder_in_first_llm_stage = plan.encoder_in_first_llm_stage();
  so.encoder_allreduce_seconds = plan.encoder().allreduce_seconds();
  so.llm_allreduce_seconds = plan.llm().allreduce_seconds();
  so.encoder_stage_share.assign(plan.costs().encoder_stage_share().begin(),
                                plan.costs().encoder_stage_share().end());
  so.llm_stage_share.assign(plan.costs().llm_stage_share().begin(),
                            plan.costs().llm_stage_share().end());
  if (plan.costs().encoder_forward_share() > 0) {
    so.encoder_forward_share = plan.costs().encoder_forward_share();
  }
  if (plan.costs().llm_forward_share() > 0) so.llm_forward_share = plan.costs().llm_forward_share();
  if (plan.costs().encoder_recompute_ratio() > 0) {
    so.encoder_recompute_ratio = plan.costs().encoder_recompute_ratio();
  }
  if (plan.costs().llm_recompute_ratio() > 0) {
    so.llm_recompute_ratio = plan.costs().llm_recompute_ratio();
  }
  so.encoder_recompute = plan.encoder_recompute().empty() || plan.encoder_recompute() == "full";
  so.llm_recompute = plan.llm_recompute().empty() || plan.llm_recompute() == "full";
  so.shared_devices = plan.shared_devices();
  so.colocated = plan.colocated();
  so.encoder_tp = std::max(1, plan.encoder().tp());
  so.llm_tp = std::max(1, plan.llm().tp());
  if (plan.has_generator()) {  // its own stage, or inside the LLM's last (monolithic)
    so.generator_dp = plan.encoder_in_first_llm_stage() ? 0 : plan.generator().dp();
    so.generator_tp = std::max(1, plan.generator().tp());
    so.generator_allreduce_seconds = plan.generator().allreduce_seconds();
  }
  return so;
}

absl::StatusOr<scheduler::v1::Assignment> AssignForPlan(const scheduler::v1::Plan& plan,
                                                        const std::vector<std::string>& keys,
                                                        const std::vector<SampleLoad>& loads,
                                                        const std::string& algorithm,
                                                        double ilp_time_limit_seconds,
                                                        PredictedIteration* timeline) {
  if (keys.size() != loads.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(keys.size(), " keys but ", loads.size(), " sample costs"));
  }
  if (plan.llm().dp() < 1 || plan.encoder().dp() < 1 || plan.microbatches() < 1 ||
      plan.llm().pp() < 1 || plan.encoder().pp() < 1) {
    return absl::InvalidArgumentError(
        "the plan needs llm.dp, llm.pp, encoder.dp, encoder.pp and microbatches of at least 1");
  }
  AssignOptions o;
  o.llm_dp = plan.llm().dp();
  o.microbatches = plan.microbatches();
  o.encoder_dp = plan.encoder().dp();
  o.pipeline_depth =
      plan.llm().pp() + (plan.encoder_in_first_llm_stage() ? 0 : plan.encoder().pp());
  if (plan.has_generator()) {
    o.generator_dp = std::max(1, plan.generator().dp());
    // Its stages after the LLM's.
    if (!plan.encoder_in_first_llm_stage()) o.pipeline_depth += std::max(1, plan.generator().pp());
  }
  o.ilp_time_limit_seconds = ilp_time_limit_seconds;
  o.encoder_max_tokens = plan.encoder_max_tokens();
  o.llm_max_tokens = plan.llm_max_tokens();
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<AssignResult> result = Assign(loads, o, algorithm);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!result.ok()) return result.status();

  if (plan.encoder_in_first_llm_stage()) {
    for (BinAssignment& b : result->bins) {  // each replica encodes (and draws) its own bins
      b.encoder_rank = b.llm_rank;
      b.generator_rank = b.llm_rank;
      b.transfer = 0;
    }
  }
  SimulationOptions so = SimulationOptionsFor(plan);
  so.timeline = timeline != nullptr;
  absl::StatusOr<SimulationResult> sim = SimulateIteration(result->bins, so);
  if (!sim.ok()) return sim.status();
  const AssignmentQuality q = MeasureAssignment(loads, *result);

  scheduler::v1::Assignment out;
  for (const BinAssignment& b : result->bins) {
    scheduler::v1::Bin* bin = out.add_bins();
    bin->set_llm_rank(b.llm_rank);
    bin->set_microbatch(b.microbatch);
    bin->set_encoder_rank(b.encoder_rank);
    bin->set_generator_rank(b.generator_rank);
    for (int i : b.samples) {
      bin->add_samples(keys[i]);
      bin->add_indices(i);
    }
    bin->set_encoder_cost(b.encoder);
    bin->set_llm_cost(b.llm);
  }
  scheduler::v1::AssignmentSummary* s = out.mutable_summary();
  s->set_algorithm(algorithm);
  s->set_samples(static_cast<int>(loads.size()));
  s->set_bins(static_cast<int>(result->bins.size()));
  s->mutable_encoder()->set_max_over_lower_bound(q.encoder.max_over_lower_bound);
  s->mutable_encoder()->set_cv(q.encoder.cv);
  s->mutable_llm()->set_max_over_lower_bound(q.llm.max_over_lower_bound);
  s->mutable_llm()->set_cv(q.llm.cv);
  s->set_objective(q.objective);
  s->set_largest_bin(q.largest_bin);
  s->set_lower_bound(q.lower_bound);
  s->set_simulated_iteration_seconds(sim->iteration_seconds);
  s->set_wall_seconds(wall);
  s->set_ilp_bound(result->ilp_bound);
  s->set_ilp_optimal(result->ilp_optimal);
  if (timeline != nullptr) {
    timeline->bins = result->bins;
    timeline->simulation = std::move(*sim);
  }
  return out;
}

trace::v1::TraceFile PredictedTrace(const PredictedIteration& p, int64_t iteration,
                                    bool name_tracks) {
  trace::v1::TraceFile out;
  std::set<int> named;
  for (const SimulatedTask& t : p.simulation.timeline) {
    // The generator's stage sits after the LLM's last (stage llm_pp).
    const int tid = trace::StageTrack(t.encoder, t.dp, t.stage);
    if (name_tracks && named.insert(tid).second) {
      trace::NameTrack(&out, trace::kPredictedPid, tid,
                       t.generator ? absl::StrCat("generator dp ", t.dp, " (predicted)")
                                   : absl::StrCat(t.encoder ? "encoder" : "LLM", " dp ", t.dp,
                                                  " stage ", t.stage, " (predicted)"));
    }
    std::string name = "allreduce gradients", cat = "allreduce";
    if (t.kind != SimulatedTask::kAllreduce) {
      const bool f = t.kind == SimulatedTask::kForward;
      const BinAssignment& b = p.bins[t.bin];
      name = t.encoder ? absl::StrCat(f ? "F" : "B", " bin ", t.bin)
                       : absl::StrCat(f ? "F" : "B", " mb ", b.microbatch, " bin ", t.bin);
      if (t.recomputed) name += " (with recompute)";
      cat = f ? "forward" : "backward";
    }
    trace::AddSpan(&out, name, cat, trace::kPredictedPid, tid, t.start * 1e6, t.end * 1e6,
                   iteration);
  }
  return out;
}

}  // namespace loom::sched
