#include "runtime/scheduling/simulate.h"

#include <algorithm>
#include <deque>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace loom::sched {
namespace {

struct Task {
  double duration = 0;
  double ready = 0;  // earliest start from inputs and the stage's previous task
  double end = 0;
  int pending = 0;
  std::vector<std::pair<int, double>> next;  // (task, delay)
};

class Graph {
 public:
  int Add(double duration) {
    tasks_.push_back({duration});
    return static_cast<int>(tasks_.size()) - 1;
  }
  void Edge(int from, int to, double delay) {
    tasks_[from].next.push_back({to, delay});
    ++tasks_[to].pending;
  }
  // Kahn's order; false on a cycle (a schedule that deadlocks).
  bool Run() {
    std::deque<int> ready;
    for (size_t t = 0; t < tasks_.size(); ++t) {
      if (tasks_[t].pending == 0) ready.push_back(static_cast<int>(t));
    }
    size_t done = 0;
    while (!ready.empty()) {
      const int t = ready.front();
      ready.pop_front();
      ++done;
      Task& task = tasks_[t];
      task.end = task.ready + task.duration;
      for (auto [to, delay] : task.next) {
        tasks_[to].ready = std::max(tasks_[to].ready, task.end + delay);
        if (--tasks_[to].pending == 0) ready.push_back(to);
      }
    }
    return done == tasks_.size();
  }
  const Task& operator[](int t) const { return tasks_[t]; }
  int size() const { return static_cast<int>(tasks_.size()); }

 private:
  std::vector<Task> tasks_;
};

}  // namespace

absl::StatusOr<SimulationResult> SimulateIteration(const std::vector<BinAssignment>& bins,
                                                   const SimulationOptions& o) {
  if (o.encoder_dp < 1 || o.encoder_pp < 1 || o.llm_dp < 1 || o.llm_pp < 1 || o.microbatches < 1) {
    return absl::InvalidArgumentError("simulation: every degree must be at least 1");
  }
  const int m = o.microbatches, pe = o.encoder_pp, pl = o.llm_pp;
  const int depth = pe + pl;
  // bin_at[r * m + j]: the bin LLM rank r runs j-th.
  std::vector<int> bin_at(static_cast<size_t>(o.llm_dp) * m, -1);
  for (size_t b = 0; b < bins.size(); ++b) {
    const BinAssignment& x = bins[b];
    if (x.llm_rank < 0 || x.llm_rank >= o.llm_dp || x.microbatch < 0 || x.microbatch >= m ||
        x.encoder_rank < 0 || x.encoder_rank >= o.encoder_dp) {
      return absl::InvalidArgumentError(
          absl::StrCat("simulation: bin ", b, " (llm_rank ", x.llm_rank, ", microbatch ",
                       x.microbatch, ", encoder_rank ", x.encoder_rank, ") is outside the plan"));
    }
    int& slot = bin_at[static_cast<size_t>(x.llm_rank) * m + x.microbatch];
    if (slot >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("simulation: llm_rank ", x.llm_rank,
                                                     " has microbatch ", x.microbatch, " twice"));
    }
    slot = static_cast<int>(b);
  }
  for (size_t k = 0; k < bin_at.size(); ++k) {
    if (bin_at[k] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("simulation: llm_rank ", k / m, " has no microbatch ", k % m));
    }
  }

  Graph g;
  const size_t nb = bins.size();
  std::vector<int> ef(nb * pe), eb(nb * pe), lf(nb * pl), lb(nb * pl);
  for (size_t b = 0; b < nb; ++b) {
    const BinAssignment& x = bins[b];
    for (int s = 0; s < pe; ++s) {
      ef[b * pe + s] = g.Add(x.encoder / 3 / pe);
      eb[b * pe + s] = g.Add(2 * x.encoder / 3 / pe);
    }
    for (int s = 0; s < pl; ++s) {
      lf[b * pl + s] = g.Add(x.llm / 3 / pl);
      lb[b * pl + s] = g.Add(2 * x.llm / 3 / pl);
    }
    for (int s = 1; s < pe; ++s) g.Edge(ef[b * pe + s - 1], ef[b * pe + s], 0);
    g.Edge(ef[b * pe + pe - 1], lf[b * pl], x.transfer);
    for (int s = 1; s < pl; ++s) g.Edge(lf[b * pl + s - 1], lf[b * pl + s], 0);
    g.Edge(lf[b * pl + pl - 1], lb[b * pl + pl - 1], 0);
    for (int s = pl - 1; s > 0; --s) g.Edge(lb[b * pl + s], lb[b * pl + s - 1], 0);
    g.Edge(lb[b * pl], eb[b * pe + pe - 1], x.transfer);
    for (int s = pe - 1; s > 0; --s) g.Edge(eb[b * pe + s], eb[b * pe + s - 1], 0);
  }
  // Stage orders; the last task of each stage is where its allreduce can start.
  std::vector<int> llm_last, enc_last;
  auto chain = [&](const std::vector<int>& order, std::vector<int>* last) {
    for (size_t k = 1; k < order.size(); ++k) g.Edge(order[k - 1], order[k], 0);
    if (!order.empty()) last->push_back(order.back());
  };
  for (int r = 0; r < o.llm_dp; ++r) {
    for (int s = 0; s < pl; ++s) {
      const int warm = std::min(pl - s - 1, m);
      std::vector<int> order;
      auto at = [&](int j) { return static_cast<size_t>(bin_at[static_cast<size_t>(r) * m + j]); };
      for (int j = 0; j < warm; ++j) order.push_back(lf[at(j) * pl + s]);
      for (int j = warm; j < m; ++j) {
        order.push_back(lf[at(j) * pl + s]);
        order.push_back(lb[at(j - warm) * pl + s]);
      }
      for (int j = m - warm; j < m; ++j) order.push_back(lb[at(j) * pl + s]);
      chain(order, &llm_last);
    }
  }
  std::vector<std::vector<int>> enc_bins(o.encoder_dp);
  for (size_t b = 0; b < nb; ++b) enc_bins[bins[b].encoder_rank].push_back(static_cast<int>(b));
  for (int e = 0; e < o.encoder_dp; ++e) {
    for (int s = 0; s < pe; ++s) {
      // (key, llm_rank, task): forwards of slot t at 2t, backwards of slot
      // t - (depth - s - 1) at 2t + 1.
      std::vector<std::tuple<int, int, int>> keyed;
      for (int b : enc_bins[e]) {
        const BinAssignment& x = bins[b];
        keyed.emplace_back(2 * x.microbatch, x.llm_rank, ef[b * pe + s]);
        keyed.emplace_back(2 * (x.microbatch + depth - s - 1) + 1, x.llm_rank, eb[b * pe + s]);
      }
      std::sort(keyed.begin(), keyed.end());
      std::vector<int> order;
      for (const auto& k : keyed) order.push_back(std::get<2>(k));
      chain(order, &enc_last);
    }
  }
  if (!g.Run()) return absl::InternalError("simulation: the stage orders deadlock");

  SimulationResult result;
  result.tasks = g.size();
  double llm_end = 0, enc_end = 0;
  for (int t : llm_last) llm_end = std::max(llm_end, g[t].end + o.llm_allreduce_seconds);
  for (int t : enc_last) enc_end = std::max(enc_end, g[t].end + o.encoder_allreduce_seconds);
  result.iteration_seconds = std::max(llm_end, enc_end);
  for (const BinAssignment& x : bins) {
    result.llm_compute_seconds += x.llm;
    result.encoder_compute_seconds += x.encoder;
  }
  if (result.iteration_seconds > 0) {
    result.llm_utilization =
        result.llm_compute_seconds / (result.iteration_seconds * o.llm_dp * pl);
    result.encoder_utilization =
        result.encoder_compute_seconds / (result.iteration_seconds * o.encoder_dp * pe);
  }
  return result;
}

}  // namespace loom::sched
