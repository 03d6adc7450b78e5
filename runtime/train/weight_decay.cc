#include "runtime/train/weight_decay.h"

#include "absl/status/status.h"
#include "runtime/base/log.h"

namespace loom {

const char* WeightDecayScopeName(WeightDecayScope scope) {
  return scope == WeightDecayScope::kAll ? "all" : "matrices";
}

absl::StatusOr<WeightDecayScope> ParseWeightDecayScope(const std::string& name) {
  if (name == "matrices") return WeightDecayScope::kMatrices;
  if (name == "all") return WeightDecayScope::kAll;
  return absl::InvalidArgumentError("weight decay scope \"" + name + "\": want matrices or all");
}

bool Decays(const ParamSpec& spec, WeightDecayScope scope) {
  if (scope == WeightDecayScope::kAll) return true;
  if (spec.master_shape.size() < 2) return false;  // norm weights, biases, cls_token
  for (const char* name : kNoDecayEmbeddings) {
    if (spec.name == name) return false;
  }
  return true;
}

std::vector<DecayRun> DecayRuns(const ParamSet& set, WeightDecayScope scope) {
  std::vector<DecayRun> runs;
  int64_t end = 0;
  for (const ParamSpec& s : set.specs()) {
    LOOM_CHECK(s.offset == end) << s.name << " at " << s.offset << ", not " << end;
    end = s.offset + s.numel;
    const bool decay = Decays(s, scope);
    if (!runs.empty() && runs.back().decay == decay) {
      runs.back().numel += s.numel;
    } else {
      runs.push_back({s.offset, s.numel, decay});
    }
  }
  LOOM_CHECK(end == set.size()) << "tensors cover " << end << " of " << set.size();
  return runs;
}

}  // namespace loom
