// The workers' timing reports: each replica's first stage reports, per
// iteration, its microbatches' forward + backward (summed over its stages,
// no recompute), each stage's total, the forwards' total and the recomputes
// against their first forwards; everything is checked before any of it
// refits the cost model (runtime/scheduling/cost_model.h), whose
// coefficients the next assignments are priced and simulated with.
#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/counter.h"
#include "runtime/parallel/grid.h"
#include "services/common/grpc_status.h"
#include "services/scheduler/scheduler_service.h"

namespace loom {

grpc::Status SchedulerServiceImpl::ReportTimings(grpc::ServerContext*,
                                                 const scheduler::v1::ReportTimingsRequest* request,
                                                 scheduler::v1::ReportTimingsResponse* response) {
  if (absl::Status s = Configured(); !s.ok()) return ToGrpcStatus(s);
  const common::v1::Role role = request->role();
  const bool encoder = role == common::v1::ROLE_ENCODER_WORKER;
  const bool generator = role == common::v1::ROLE_GENERATOR_WORKER;
  if (!encoder && !generator && role != common::v1::ROLE_LLM_WORKER) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "role: must be ROLE_ENCODER_WORKER, ROLE_LLM_WORKER or ROLE_GENERATOR_WORKER"));
  }
  // A generator replica reports its bins (slot and LLM replica each), not
  // its stages: it has one.
  const scheduler::v1::ModulePlan& mp = encoder     ? options_.plan.encoder()
                                        : generator ? options_.plan.generator()
                                                    : options_.plan.llm();
  const int dp = mp.dp();
  if (request->rank() < 0 || request->rank() >= dp) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("rank: ", request->rank(), " is outside the plan's ", dp, " DP ranks")));
  }
  std::shared_ptr<const Computed> c;
  {
    absl::MutexLock lock(&mu_);
    // From a process holding a rank of that DP replica (its first stage's
    // TP rank 0 reports).
    const parallel::GridShape grid{mp.tp(), mp.pp(), mp.dp()};
    absl::Status holds = absl::PermissionDeniedError(
        absl::StrCat(common::v1::Role_Name(role), " DP rank ", request->rank(),
                     ": the caller's incarnation holds none of its ranks"));
    for (int t = 0; t < grid.tp && !holds.ok(); ++t) {
      for (int p = 0; p < grid.pp && !holds.ok(); ++p) {
        if (CheckHolderLocked(role, parallel::RankOf(grid, {t, p, request->rank()}),
                              request->incarnation())
                .ok()) {
          holds = absl::OkStatus();
        }
      }
    }
    if (!holds.ok()) return ToGrpcStatus(holds);
    auto it = assignments_by_iteration_.find(request->iteration());
    if (it != assignments_by_iteration_.end()) c = it->second;
  }
  if (!c) {
    return ToGrpcStatus(absl::FailedPreconditionError(
        absl::StrCat("iteration: this scheduler holds no assignment for ", request->iteration())));
  }
  // Check every timing before using any.
  const int m = options_.plan.microbatches();
  std::vector<std::pair<std::vector<sched::SampleShape>, double>> observed;
  for (int k = 0; k < request->timings_size(); ++k) {
    const scheduler::v1::MicrobatchTiming& t = request->timings(k);
    const int llm_rank = encoder || generator ? t.llm_rank() : request->rank();
    auto bad = [&](const std::string& why) {
      return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat("timings[", k, "]: ", why)));
    };
    if (t.microbatch() < 0 || t.microbatch() >= m) {
      return bad(absl::StrCat("microbatch ", t.microbatch(), " is outside 0..", m - 1));
    }
    if (llm_rank < 0 || llm_rank >= options_.plan.llm().dp()) {
      return bad(absl::StrCat("llm_rank ", llm_rank, " is outside the plan"));
    }
    if (!std::isfinite(t.seconds()) || t.seconds() < 0) {
      return bad("seconds must be finite and non-negative");
    }
    const scheduler::v1::Bin& bin = c->assignment.bins(llm_rank * m + t.microbatch());
    if (encoder && bin.encoder_rank() != request->rank()) {
      return bad(absl::StrCat("bin (llm_rank ", llm_rank, ", microbatch ", t.microbatch(),
                              ") belongs to encoder rank ", bin.encoder_rank()));
    }
    if (generator && bin.generator_rank() != request->rank()) {
      return bad(absl::StrCat("bin (llm_rank ", llm_rank, ", microbatch ", t.microbatch(),
                              ") belongs to generator rank ", bin.generator_rank()));
    }
    std::vector<sched::SampleShape> shapes;
    for (int i : bin.indices()) shapes.push_back(c->shapes[i]);
    observed.emplace_back(std::move(shapes), t.seconds());
  }
  const int stages = mp.pp();
  if (request->stage_seconds_size() != 0 && request->stage_seconds_size() != stages) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("stage_seconds: ", request->stage_seconds_size(), " entries for the plan's ",
                     stages, " pipeline stages (want one per stage, or none)")));
  }
  double total = 0;
  for (const auto& [shapes, seconds] : observed) total += seconds;
  if (!std::isfinite(request->forward_seconds()) || request->forward_seconds() < 0 ||
      request->forward_seconds() > total * (1 + 1e-9)) {
    return ToGrpcStatus(
        absl::InvalidArgumentError(absl::StrCat("forward_seconds: ", request->forward_seconds(),
                                                " is outside 0 .. the timings' total ", total)));
  }
  for (double s : request->stage_seconds()) {
    if (!std::isfinite(s) || s < 0) {
      return ToGrpcStatus(
          absl::InvalidArgumentError("stage_seconds: must be finite and non-negative"));
    }
  }
  if (!std::isfinite(request->recompute_seconds()) || request->recompute_seconds() < 0 ||
      !std::isfinite(request->recomputed_forward_seconds()) ||
      request->recomputed_forward_seconds() < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "recompute_seconds, recomputed_forward_seconds: must be finite and non-negative"));
  }
  absl::MutexLock lock(&mu_);
  if (generator) {  // its time per output image; no stages, forward share or recompute
    if (request->stage_seconds_size() > 0 || request->forward_seconds() > 0 ||
        request->recompute_seconds() > 0 || request->recomputed_forward_seconds() > 0) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          "a generator report holds its bins' timings alone (no stage, forward or recompute "
          "seconds)"));
    }
    if (!options_.fixed_costs) {
      for (const auto& [shapes, seconds] : observed) costs_->ObserveGenerator(shapes, seconds);
    }
    reports_->Increment(static_cast<double>(observed.size()));
    *response->mutable_costs() = costs_->coefficients();
    return grpc::Status::OK;
  }
  if (options_.fixed_costs) {
    reports_->Increment(static_cast<double>(observed.size()));
    *response->mutable_costs() = costs_->coefficients();
    return grpc::Status::OK;
  }
  if (request->recomputed_forward_seconds() > 0) {
    costs_->ObserveRecompute(encoder, request->recompute_seconds(),
                             request->recomputed_forward_seconds());
  }
  if (request->forward_seconds() > 0) {
    costs_->ObserveForward(encoder, std::min(request->forward_seconds(), total), total);
  }
  if (request->stage_seconds_size() > 1) {
    costs_->ObserveStages(encoder, std::vector<double>(request->stage_seconds().begin(),
                                                       request->stage_seconds().end()));
  }
  for (const auto& [shapes, seconds] : observed) {
    if (encoder) {
      costs_->ObserveEncoder(shapes, seconds);
    } else {
      costs_->ObserveLlm(shapes, seconds);
    }
  }
  reports_->Increment(static_cast<double>(observed.size()));
  *response->mutable_costs() = costs_->coefficients();
  return grpc::Status::OK;
}

}  // namespace loom
