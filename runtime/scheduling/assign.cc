#include "runtime/scheduling/assign.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <queue>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/scheduling/ilp.h"
#include "runtime/scheduling/pack.h"

namespace loom::sched {
namespace {

// DistTrain's 1F1B order of one rank's microbatches, given their sizes:
// smallest first, the p-1 next smallest last (largest of them first), best
// fit between.
std::vector<int> OneFOneBOrder(const std::vector<double>& size, int depth) {
  const int m = static_cast<int>(size.size());
  std::vector<int> asc(m);
  std::iota(asc.begin(), asc.end(), 0);
  std::stable_sort(asc.begin(), asc.end(), [&](int a, int b) { return size[a] < size[b]; });
  const int tail = std::min(std::max(depth - 1, 0), m - 1);
  std::vector<int> order;
  order.push_back(asc[0]);
  std::vector<int> drain(asc.begin() + 1, asc.begin() + 1 + tail);
  std::vector<int> middle(asc.begin() + 1 + tail, asc.end());
  while (!middle.empty()) {
    const int pos = static_cast<int>(order.size());
    const double partner = size[order[std::max(0, pos - std::max(depth - 1, 1))]];
    auto best = std::min_element(middle.begin(), middle.end(), [&](int a, int b) {
      return std::abs(size[a] - partner) < std::abs(size[b] - partner);
    });
    order.push_back(*best);
    middle.erase(best);
  }
  order.insert(order.end(), drain.rbegin(), drain.rend());
  return order;
}

// Group g -> rank g / m, microbatch g % m, in the groups' order.
std::vector<std::vector<int>> RanksInOrder(int bins, int m) {
  std::vector<std::vector<int>> ranks(bins / m);
  for (int g = 0; g < bins; ++g) ranks[g / m].push_back(g);
  return ranks;
}

// Groups to ranks, m each, balancing the ranks' summed size: largest group
// first to the rank with the least total that still has room.
std::vector<std::vector<int>> RanksBalanced(const std::vector<double>& size, int ranks, int m) {
  std::vector<std::vector<int>> out(ranks);
  std::vector<double> total(ranks, 0);
  for (int g : ByDecreasing(size)) {
    int best = -1;
    for (int r = 0; r < ranks; ++r) {
      if (static_cast<int>(out[r].size()) == m) continue;
      if (best < 0 || total[r] < total[best]) best = r;
    }
    out[best].push_back(g);
    total[best] += size[g];
  }
  return out;
}

std::vector<BinAssignment> Layout(const std::vector<SampleLoad>& samples, const Normalized& n,
                                  const Groups& groups, const std::vector<std::vector<int>>& ranks,
                                  bool order_1f1b, bool balance_encoder, const AssignOptions& o) {
  std::vector<double> size(groups.size(), 0);
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int i : groups[g]) size[g] += n.Sum(i);
  }
  std::vector<BinAssignment> bins;
  for (int r = 0; r < o.llm_dp; ++r) {
    std::vector<int> mine = ranks[r];
    if (order_1f1b) {
      std::vector<double> s;
      for (int g : mine) s.push_back(size[g]);
      std::vector<int> order = OneFOneBOrder(s, o.pipeline_depth);
      std::vector<int> sorted;
      for (int k : order) sorted.push_back(mine[k]);
      mine = sorted;
    }
    for (int j = 0; j < o.microbatches; ++j) {
      BinAssignment b;
      b.llm_rank = r;
      b.microbatch = j;
      b.samples = groups[mine[j]];
      std::sort(b.samples.begin(), b.samples.end());
      for (int i : b.samples) {
        b.encoder += samples[i].encoder;
        b.llm += samples[i].llm;
        b.transfer += samples[i].transfer;
        b.generator += samples[i].generator;
      }
      bins.push_back(std::move(b));
    }
  }
  // Encoder ranks, and generator ranks, slot by slot: in turn, or each
  // slot's largest bins first to the ranks with the least accumulated load.
  auto place = [&](int dp, double BinAssignment::*cost, int BinAssignment::*rank) {
    std::vector<double> load(dp, 0);
    for (int j = 0; j < o.microbatches; ++j) {
      std::vector<int> slot;
      for (int r = 0; r < o.llm_dp; ++r) slot.push_back(r * o.microbatches + j);
      if (!balance_encoder) {
        for (int r = 0; r < o.llm_dp; ++r) bins[slot[r]].*rank = (j * o.llm_dp + r) % dp;
        continue;
      }
      std::stable_sort(slot.begin(), slot.end(),
                       [&](int a, int b) { return bins[a].*cost > bins[b].*cost; });
      for (int b : slot) {
        const int e = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
        bins[b].*rank = e;
        load[e] += bins[b].*cost;
      }
    }
  };
  place(o.encoder_dp, &BinAssignment::encoder, &BinAssignment::encoder_rank);
  place(o.generator_dp, &BinAssignment::generator, &BinAssignment::generator_rank);
  return bins;
}

absl::Status Validate(const std::vector<SampleLoad>& samples, const AssignOptions& o) {
  if (o.llm_dp < 1) return absl::InvalidArgumentError("llm_dp must be at least 1");
  if (o.microbatches < 1) return absl::InvalidArgumentError("microbatches must be at least 1");
  if (o.encoder_dp < 1) return absl::InvalidArgumentError("encoder_dp must be at least 1");
  if (o.generator_dp < 1) return absl::InvalidArgumentError("generator_dp must be at least 1");
  const int64_t bins = static_cast<int64_t>(o.llm_dp) * o.microbatches;
  if (static_cast<int64_t>(samples.size()) < bins) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the batch has ", samples.size(), " samples, fewer than the ", bins, " bins (llm_dp ",
        o.llm_dp, " x microbatches ", o.microbatches, "); every bin needs a sample"));
  }
  for (size_t i = 0; i < samples.size(); ++i) {
    const SampleLoad& s = samples[i];
    for (double v : {s.encoder, s.llm, s.transfer, s.generator}) {
      if (!std::isfinite(v) || v < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("sample ", i, " has a negative or non-finite cost"));
      }
    }
    for (auto [tokens, cap, what] :
         {std::make_tuple(s.encoder_tokens, o.encoder_max_tokens, "encoder_max_tokens"),
          std::make_tuple(s.llm_tokens, o.llm_max_tokens, "llm_max_tokens")}) {
      if (cap > 0 && tokens > cap) {
        return absl::InvalidArgumentError(
            absl::StrCat("sample ", i, " has ", tokens, " tokens, above parallel.", what, " (", cap,
                         "): loom-preprocess skips such samples (over_token_cap)"));
      }
    }
  }
  return absl::OkStatus();
}

// The token caps' repair pass: while a bin holds more of a module's tokens
// than its cap, one of its samples (the largest that fits somewhere) moves
// to the bin with room for it whose cost after the move is least. Every
// move lowers the tokens over the caps, so it ends; a bin over a cap holds
// at least two samples (none is over a cap alone), so none empties.
absl::Status CapTokens(const std::vector<SampleLoad>& samples, const Normalized& common,
                       const AssignOptions& o, Groups* groups) {
  const int64_t E = o.encoder_max_tokens, L = o.llm_max_tokens;
  if (E <= 0 && L <= 0) return absl::OkStatus();
  const size_t bins = groups->size();
  std::vector<int64_t> te(bins, 0), tl(bins, 0);
  std::vector<double> cost(bins, 0);
  for (size_t g = 0; g < bins; ++g) {
    for (int i : (*groups)[g]) {
      te[g] += samples[i].encoder_tokens;
      tl[g] += samples[i].llm_tokens;
      cost[g] += common.Sum(i);
    }
  }
  auto over = [&](size_t g) { return (E > 0 && te[g] > E) || (L > 0 && tl[g] > L); };
  auto fits = [&](size_t g, int i) {
    return (E <= 0 || te[g] + samples[i].encoder_tokens <= E) &&
           (L <= 0 || tl[g] + samples[i].llm_tokens <= L);
  };
  for (size_t g = 0; g < bins; ++g) {
    while (over(g)) {
      std::vector<int> order = (*groups)[g];  // the largest first, in the capped dimensions
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        auto size = [&](int i) {
          return (E > 0 ? static_cast<double>(samples[i].encoder_tokens) / E : 0.0) +
                 (L > 0 ? static_cast<double>(samples[i].llm_tokens) / L : 0.0);
        };
        return size(a) > size(b);
      });
      int moved = -1;
      size_t to = bins;
      for (int i : order) {
        for (size_t d = 0; d < bins; ++d) {
          if (d == g || !fits(d, i)) continue;
          if (to == bins || cost[d] < cost[to]) to = d;
        }
        if (to != bins) {
          moved = i;
          break;
        }
      }
      if (moved < 0) {
        int64_t all_e = 0, all_l = 0;
        for (const SampleLoad& s : samples) {
          all_e += s.encoder_tokens;
          all_l += s.llm_tokens;
        }
        const bool llm = L > 0 && tl[g] > L;
        return absl::ResourceExhaustedError(
            absl::StrCat("the batch's ", llm ? all_l : all_e, " ", llm ? "LLM" : "encoder",
                         " tokens do not fit ", bins, " microbatches of parallel.",
                         llm ? "llm_max_tokens " : "encoder_max_tokens ", llm ? L : E,
                         ": no sample of an overfull microbatch fits another; raise the cap or "
                         "parallel.microbatches"));
      }
      std::vector<int>& from = (*groups)[g];
      from.erase(std::find(from.begin(), from.end(), moved));
      (*groups)[to].push_back(moved);
      const double c = common.Sum(moved);
      te[g] -= samples[moved].encoder_tokens;
      tl[g] -= samples[moved].llm_tokens;
      cost[g] -= c;
      te[to] += samples[moved].encoder_tokens;
      tl[to] += samples[moved].llm_tokens;
      cost[to] += c;
    }
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<std::string>& AlgorithmNames() {
  static const auto* names = new std::vector<std::string>{
      "sequential", "lpt", "disttrain", "entrain", "greedy", "ilp", "loom"};
  return *names;
}

absl::StatusOr<AssignResult> Assign(const std::vector<SampleLoad>& samples, const AssignOptions& o,
                                    const std::string& algorithm) {
  const auto& names = AlgorithmNames();
  if (std::find(names.begin(), names.end(), algorithm) == names.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown algorithm \"", algorithm, "\"; known: ", absl::StrJoin(names, ", ")));
  }
  if (absl::Status s = Validate(samples, o); !s.ok()) return s;
  const int bins = o.llm_dp * o.microbatches;
  const Normalized n = Normalize(samples, bins);
  const Normalized common = CommonScale(samples, bins);  // modules in the units given
  AssignResult result;
  Groups groups;
  std::vector<std::vector<int>> ranks;
  bool order_1f1b = true, balance_encoder = true;
  bool balanced = true;  // bins to ranks so that rank totals balance, else in order
  if (algorithm == "sequential") {
    groups = Sequential(samples.size(), bins);
    balanced = order_1f1b = balance_encoder = false;
  } else if (algorithm == "lpt" || algorithm == "disttrain") {
    groups = LptGroups(n, bins);
    balanced = false;
    order_1f1b = algorithm == "disttrain";
  } else if (algorithm == "entrain") {
    groups = EntrainGroups(n, bins, o);
    FillEmpty(n, &groups);
    balanced = order_1f1b = false;
  } else if (algorithm == "greedy") {
    groups = GreedyGroups(common, bins, /*even=*/false);
  } else if (algorithm == "loom") {
    groups = LoomGroups(common, n, bins, o);
  } else {  // ilp
    const int64_t variables = static_cast<int64_t>(samples.size()) * bins;
    if (variables > o.ilp_max_variables) {
      return absl::ResourceExhaustedError(
          absl::StrCat("ilp: ", samples.size(), " samples x ", bins, " bins = ", variables,
                       " variables, above the limit of ", o.ilp_max_variables));
    }
    Groups start = LoomGroups(common, n, bins, o);
    absl::StatusOr<IlpSolution> sol =
        SolveBinIlp({common.e, common.l, common.g}, bins, start, o.ilp_time_limit_seconds);
    if (!sol.ok()) return sol.status();
    groups = std::move(sol->groups);
    result.ilp_bound = sol->bound * common.scale;  // back in the costs' units
    result.ilp_optimal = sol->optimal;
  }
  if (absl::Status s = CapTokens(samples, common, o, &groups); !s.ok()) return s;
  if (balanced) {
    std::vector<double> size(bins, 0);
    for (int g = 0; g < bins; ++g) {
      for (int i : groups[g]) size[g] += common.Sum(i);
    }
    ranks = RanksBalanced(size, o.llm_dp, o.microbatches);
  } else {
    ranks = RanksInOrder(bins, o.microbatches);
  }
  result.bins = Layout(samples, common, groups, ranks, order_1f1b, balance_encoder, o);
  return result;
}

AssignmentQuality MeasureAssignment(const std::vector<SampleLoad>& samples,
                                    const AssignResult& result) {
  AssignmentQuality q;
  const double k = static_cast<double>(result.bins.size());
  if (result.bins.empty()) return q;
  auto measure = [&](auto cost_of_sample, auto cost_of_bin) {
    double total = 0, largest = 0;
    for (const SampleLoad& s : samples) {
      total += cost_of_sample(s);
      largest = std::max(largest, cost_of_sample(s));
    }
    const double mean = total / k;
    double mx = 0, var = 0;
    for (const BinAssignment& b : result.bins) {
      mx = std::max(mx, cost_of_bin(b));
      var += (cost_of_bin(b) - mean) * (cost_of_bin(b) - mean);
    }
    ModuleQuality m;
    const double lb = std::max(mean, largest);
    m.max_over_lower_bound = lb > 0 ? mx / lb : 1.0;
    m.cv = mean > 0 ? std::sqrt(var / k) / mean : 0.0;
    return std::make_pair(m, mean);
  };
  auto [e, mean_e] = measure([](const SampleLoad& s) { return s.encoder; },
                             [](const BinAssignment& b) { return b.encoder; });
  auto [l, mean_l] = measure([](const SampleLoad& s) { return s.llm; },
                             [](const BinAssignment& b) { return b.llm; });
  auto [g, mean_g] = measure([](const SampleLoad& s) { return s.generator; },
                             [](const BinAssignment& b) { return b.generator; });
  q.encoder = e;
  q.llm = l;
  q.generator = g;
  for (const BinAssignment& b : result.bins) {
    q.largest_bin = std::max({q.largest_bin, b.encoder, b.llm, b.generator});
  }
  const double mean = std::max({mean_e, mean_l, mean_g});
  q.objective = mean > 0 ? q.largest_bin / mean : 0.0;
  q.lower_bound = mean;
  for (const SampleLoad& s : samples) {
    q.lower_bound = std::max({q.lower_bound, s.encoder, s.llm, s.generator});
  }
  return q;
}

}  // namespace loom::sched
