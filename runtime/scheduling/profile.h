// The profiler (issue 43 item 1, its first part): each module's real layers
// (runtime/model: the ViT and projector, the LLM; whole modules on one
// rank, TP 1) run on the target device over a grid of bin shapes, each
// point's forward + backward timed (the median of repeats, after a warm-up)
// and its peak memory read from the backend; the cost model's coefficients
// (cost_model.h CostCoefficients) are fitted to the points by least squares
// with their residuals (per sample, per tile; per sample, per token, per
// squared token). loom-schedule assign and simulate take such a
// profile in place of the analytic coefficients (--profile).
//
// The LLM's points separate its linear and quadratic terms: each token
// count as one sample and as four equal ones (the same tokens, a quarter of
// the attention). TP > 1 (on the CPU): the ranks of a TP group as threads,
// each its shard of every layer, their all-reduces through Gloo as the
// workers' are; a point's time is rank 0's (the ranks move in lockstep).
// Each point is also timed frozen (ProfilePoint.frozen_seconds): the ViT's
// forward with the projector training, the LLM's forward and input
// gradient; the profile's frozen shares price a frozen module.
// With ProfileOptions::communication, this host's all-reduces and UCX
// transfers too (profile_comm.h). Not yet: TP > 1 on a GPU.
#ifndef LOOM_RUNTIME_SCHEDULING_PROFILE_H_
#define LOOM_RUNTIME_SCHEDULING_PROFILE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "loom/scheduler/v1/scheduler.pb.h"
#include "runtime/model/config.h"
#include "runtime/model/ops.h"
#include "runtime/model/precision.h"

namespace loom::sched {

struct ProfileOptions {
  std::vector<int> tiles = {1, 2, 4, 8};            // per encoder bin
  std::vector<int> tokens = {128, 256, 512, 1024};  // per LLM bin (multiples of 4)
  int repeats = 3;
  uint64_t seed = 1;
  // TP degrees to measure: the first is the profile's own, the others its
  // at_tp. Each must divide both modules' heads; > 1 only on the CPU.
  std::vector<int> tps = {1};
  // The layers' precision (runtime/model/precision.h): fp32, or bf16 mixed
  // precision (bf16 products on the device's bf16 path).
  Precision precision = Precision::kFp32;
  // This host's communication too (profile_comm.h), over these group
  // sizes, into the profile (not its at_tp).
  bool communication = true;
  std::vector<int> allreduce_ranks = {2, 4};
};

// Times `model`'s modules on `ops` in `options.precision`. INVALID_ARGUMENT for an empty
// grid, a token count not a multiple of 4 or longer than the model's
// context, repeats < 1.
absl::StatusOr<scheduler::v1::Profile> ProfileModules(const ModelConfig& model, Ops* ops,
                                                      const ProfileOptions& options);

// Least squares of y = Σ_j c_j x_j over rows (x, y), every c_j >= 0 (a
// coefficient the unconstrained fit makes negative is dropped and the rest
// refitted). x rows all of one length; empty when there are no rows.
std::vector<double> FitNonNegative(const std::vector<std::vector<double>>& x,
                                   const std::vector<double>& y);

// `plan`'s cost coefficients from `profile`: per tile and per token on one
// rank of each module's TP group, from the profile measured at that TP
// (the profile's own or one of its at_tp). FAILED_PRECONDITION when a
// module of the plan runs at a TP the profile did not measure, unless
// `scaled_tp` is given: then such a module's coefficients are the
// profile's own divided by the planner's TP speed-up (tp x
// TpEfficiency(tp), plan.h), and `scaled_tp` names what was scaled ("" when
// nothing was).
// The profile in JSON file `path` (loom-schedule profile's output);
// INVALID_ARGUMENT naming the file when it is not one.
absl::StatusOr<scheduler::v1::Profile> ReadProfile(const std::string& path);

// `profile` as JSON into `path` (atomically; what ReadProfile reads).
absl::Status WriteProfile(const scheduler::v1::Profile& profile, const std::string& path);

// With `frozen` modules (the job's freeze): a frozen module's coefficients
// are the trained ones times the profile's frozen share (the vision
// tower's, or the forward's where the projector is frozen too; the LLM's),
// FAILED_PRECONDITION when the profile has none.
absl::Status ApplyProfile(const scheduler::v1::Profile& profile, scheduler::v1::Plan* plan,
                          std::string* scaled_tp = nullptr, const Frozen& frozen = {});

}  // namespace loom::sched

#endif  // LOOM_RUNTIME_SCHEDULING_PROFILE_H_
