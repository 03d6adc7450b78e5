#include "runtime/scheduling/simulate.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "runtime/parallel/pipeline_schedule.h"

namespace loom::sched {
namespace {

struct Node {
  SimulatedTask task;
  double duration = 0;
  double recompute = 0;  // of the duration, a forward run again
  // The device pools it takes while it runs, with how much of each (only
  // when devices are shared: Graph::Pool).
  std::vector<std::pair<int, double>> uses;
  double ready = 0;  // earliest start from inputs and the stage's previous task
  int pending = 0;
  std::vector<std::pair<int, double>> next;  // (node, delay)
};

class Graph {
 public:
  int Add(double duration, const SimulatedTask& task, double recompute = 0) {
    nodes_.push_back({task, duration, recompute});
    return static_cast<int>(nodes_.size()) - 1;
  }
  void Edge(int from, int to, double delay) {
    nodes_[from].next.push_back({to, delay});
    ++nodes_[to].pending;
  }
  // A pool of `capacity` devices that the tasks using it share.
  int Pool(double capacity) {
    capacity_.push_back(capacity);
    return static_cast<int>(capacity_.size()) - 1;
  }
  void Use(int node, int pool, double demand) { nodes_[node].uses.push_back({pool, demand}); }
  // Start and end times; false on a cycle (a schedule that deadlocks).
  // Without pools: Kahn's order, each task its duration from its ready
  // time. With them, an event loop in which the running tasks share each
  // pool (processor sharing): a task runs at the slowest of its pools'
  // min(1, capacity / demand of the tasks running on it).
  bool Run() {
    // Tasks whose inputs are all in, by ready time.
    std::priority_queue<std::pair<double, int>, std::vector<std::pair<double, int>>, std::greater<>>
        arrived;
    for (size_t t = 0; t < nodes_.size(); ++t) {
      if (nodes_[t].pending == 0) arrived.push({nodes_[t].ready, static_cast<int>(t)});
    }
    std::vector<std::pair<int, double>> running;  // (node, work left in seconds at full speed)
    std::vector<double> load(capacity_.size()), rate;
    size_t done = 0;
    double now = 0;
    auto finish = [&](int id, double end) {
      Node& n = nodes_[id];
      n.task.end = end;
      ++done;
      for (auto [to, delay] : n.next) {
        nodes_[to].ready = std::max(nodes_[to].ready, end + delay);
        if (--nodes_[to].pending == 0) arrived.push({nodes_[to].ready, to});
      }
    };
    while (!arrived.empty() || !running.empty()) {
      std::fill(load.begin(), load.end(), 0.0);
      for (auto [id, left] : running) {
        for (auto [pool, demand] : nodes_[id].uses) load[pool] += demand;
      }
      rate.assign(running.size(), 1.0);
      double next = arrived.empty() ? 1e300 : std::max(now, arrived.top().first);
      for (size_t i = 0; i < running.size(); ++i) {
        for (auto [pool, demand] : nodes_[running[i].first].uses) {
          if (load[pool] > capacity_[pool]) {
            rate[i] = std::min(rate[i], capacity_[pool] / load[pool]);
          }
        }
        next = std::min(next, now + running[i].second / rate[i]);
      }
      for (size_t i = 0; i < running.size(); ++i) running[i].second -= (next - now) * rate[i];
      now = next;
      for (size_t i = 0; i < running.size();) {
        if (running[i].second <= 1e-12 * std::max(1.0, nodes_[running[i].first].duration)) {
          finish(running[i].first, now);
          running[i] = running.back();
          running.pop_back();
        } else {
          ++i;
        }
      }
      while (!arrived.empty() && arrived.top().first <= now) {
        const int id = arrived.top().second;
        arrived.pop();
        Node& n = nodes_[id];
        n.task.start = n.ready;
        if (!n.uses.empty() && n.duration > 0) {
          running.push_back({id, n.duration});
        } else {
          finish(id, n.ready + n.duration);
        }
      }
    }
    return done == nodes_.size();
  }
  const Node& operator[](int t) const { return nodes_[t]; }
  int size() const { return static_cast<int>(nodes_.size()); }

 private:
  std::vector<Node> nodes_;
  std::vector<double> capacity_;
};

absl::Status CheckShares(const std::vector<double>& share, int pp, const char* what) {
  if (share.empty()) return absl::OkStatus();
  double sum = 0;
  for (double x : share) {
    if (!std::isfinite(x) || x < 0) {
      return absl::InvalidArgumentError(absl::StrCat("simulation: ", what, " has ", x));
    }
    sum += x;
  }
  if (static_cast<int>(share.size()) != pp || std::abs(sum - 1) > 1e-6) {
    return absl::InvalidArgumentError(absl::StrCat("simulation: ", what, " has ", share.size(),
                                                   " entries summing to ", sum, " for ", pp,
                                                   " stages (want one per stage, summing to 1)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SimulationResult> SimulateIteration(const std::vector<BinAssignment>& bins,
                                                   const SimulationOptions& o) {
  if (o.encoder_dp < 1 || o.encoder_pp < 1 || o.llm_dp < 1 || o.llm_pp < 1 || o.microbatches < 1 ||
      o.encoder_tp < 1 || o.llm_tp < 1) {
    return absl::InvalidArgumentError("simulation: every degree must be at least 1");
  }
  if (o.generator_dp < 0 || o.generator_tp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("simulation: generator_dp ", o.generator_dp,
                                                   " and generator_tp ", o.generator_tp,
                                                   " (want >= 0 and >= 1)"));
  }
  if (!(o.generator_forward_share >= 0 && o.generator_forward_share <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "simulation: a forward share of ", o.generator_forward_share, " is outside [0, 1]"));
  }
  if (o.shared_devices < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("simulation: shared_devices ", o.shared_devices, " is negative"));
  }
  for (double r : {o.encoder_recompute_ratio, o.llm_recompute_ratio}) {
    if (!(r >= 0) || !std::isfinite(r)) {
      return absl::InvalidArgumentError(
          absl::StrCat("simulation: a recompute ratio of ", r, " is not finite and >= 0"));
    }
  }
  for (double f : {o.encoder_forward_share, o.llm_forward_share}) {
    if (!(f >= 0 && f <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("simulation: a forward share of ", f, " is outside [0, 1]"));
    }
  }
  if (absl::Status s = CheckShares(o.encoder_stage_share, o.encoder_pp, "encoder_stage_share");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckShares(o.llm_stage_share, o.llm_pp, "llm_stage_share"); !s.ok()) {
    return s;
  }
  const bool mono = o.encoder_in_first_llm_stage;
  if (mono && (o.encoder_pp != 1 || o.encoder_dp != o.llm_dp)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "simulation: the encoder in the first LLM stage needs encoder_pp 1 and encoder_dp = "
        "llm_dp, not encoder_pp ",
        o.encoder_pp, ", encoder_dp ", o.encoder_dp, ", llm_dp ", o.llm_dp));
  }
  if (o.colocated && (mono || o.encoder_tp * o.encoder_pp * o.encoder_dp != o.llm_tp * o.llm_dp)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "simulation: colocated needs the encoder's ranks (",
        o.encoder_tp * o.encoder_pp * o.encoder_dp, ") to equal the LLM's first stage's (",
        o.llm_tp * o.llm_dp, "), and not the encoder inside the first LLM stage"));
  }
  const int m = o.microbatches, pe = o.encoder_pp, pl = o.llm_pp;
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
    if (!mono && x.generator > 0 &&
        (o.generator_dp == 0 || x.generator_rank < 0 || x.generator_rank >= o.generator_dp)) {
      return absl::InvalidArgumentError(absl::StrCat("simulation: bin ", b,
                                                     " has pictures for generator_rank ",
                                                     x.generator_rank, " of ", o.generator_dp));
    }
    if (mono && x.encoder_rank != x.llm_rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "simulation: bin ", b, " has encoder_rank ", x.encoder_rank, " and llm_rank ", x.llm_rank,
          "; with the encoder in the first LLM stage they are one"));
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
  auto share = [](const std::vector<double>& s, int pp, int stage) {
    return s.empty() ? 1.0 / pp : s[stage];
  };

  // Each stage's order of (forward?, bin), then its tasks with their
  // durations (a backward that is not live recomputes), chained.
  Graph g;
  // Shared devices: one pool that every rank's tasks draw their TP from.
  // Colocated: a pool per GPU of the LLM's first stage, which LLM rank k
  // (grid order: runtime/parallel/grid.h) and encoder rank k share.
  const int shared = o.shared_devices > 0 ? g.Pool(o.shared_devices) : -1;
  int first_gpu = -1;
  if (shared < 0 && o.colocated) {
    first_gpu = g.Pool(1);
    for (int k = 1; k < o.llm_tp * o.llm_dp; ++k) g.Pool(1);
  }
  auto devices = [&](bool encoder, int dp, int stage, int id, bool generator = false) {
    const int tp = generator ? o.generator_tp : encoder ? o.encoder_tp : o.llm_tp;
    if (generator) {
      if (shared >= 0) g.Use(id, shared, tp);
      return;
    }
    if (shared >= 0) {
      g.Use(id, shared, tp);
    } else if (first_gpu >= 0 && (encoder || stage == 0)) {
      const int rank = stage * ((encoder ? o.encoder_dp : o.llm_dp) * tp) + dp * tp;
      for (int t = 0; t < tp; ++t) g.Use(id, first_gpu + rank + t, 1);
    }
  };
  const size_t nb = bins.size();
  std::vector<int> ef(nb * pe, -1), eb(nb * pe, -1), lf(nb * pl, -1), lb(nb * pl, -1);
  struct StageRun {
    bool encoder;
    int dp, stage;
    std::vector<int> nodes;
    bool generator = false;
  };
  // The generator's stage after the LLM's last (pg 1), or inside it (mono).
  const int pg = !mono && o.generator_dp > 0 ? 1 : 0;
  std::vector<int> gf(nb, -1), gb(nb, -1);
  std::vector<StageRun> runs;
  auto run_stage = [&](bool encoder, int dp, int s, const std::vector<std::pair<bool, int>>& ops) {
    StageRun run{encoder, dp, s, {}};
    const int pp = encoder ? pe : pl;
    std::vector<int>& fwd = encoder ? ef : lf;
    std::vector<int>& bwd = encoder ? eb : lb;
    int live = -1;
    // The monolithic layout's first LLM stage carries the encoder too, its
    // last the generator.
    const bool carries_encoder = mono && !encoder && s == 0;
    const bool carries_generator = mono && !encoder && s == pp - 1;
    for (auto [forward, b] : ops) {
      const BinAssignment& x = bins[b];
      const double fs = encoder ? o.encoder_forward_share : o.llm_forward_share;
      const double cost = (encoder ? x.encoder : x.llm) *
                          share(encoder ? o.encoder_stage_share : o.llm_stage_share, pp, s);
      const double enc_cost = carries_encoder ? x.encoder : 0;
      const double efs = o.encoder_forward_share;
      const double gen_cost = carries_generator ? x.generator : 0;
      const double gfs = o.generator_forward_share;
      SimulatedTask t;
      t.encoder = encoder;
      t.dp = dp;
      t.stage = s;
      t.bin = b;
      double duration = 0, recompute = 0;
      if (forward) {
        t.kind = SimulatedTask::kForward;
        duration = cost * fs + enc_cost * efs + gen_cost * gfs;
        live = b;
      } else {
        t.kind = SimulatedTask::kBackward;
        t.recomputed = (encoder ? o.encoder_recompute : o.llm_recompute) && live != b;
        recompute =
            t.recomputed
                ? cost * fs * (encoder ? o.encoder_recompute_ratio : o.llm_recompute_ratio) +
                      enc_cost * efs * o.encoder_recompute_ratio +
                      gen_cost * gfs * o.llm_recompute_ratio
                : 0;
        duration = cost * (1 - fs) + enc_cost * (1 - efs) + gen_cost * (1 - gfs) + recompute;
        live = -1;
      }
      const int id = g.Add(duration, t, recompute);
      devices(encoder, dp, s, id);
      (forward ? fwd : bwd)[static_cast<size_t>(b) * pp + s] = id;
      if (!run.nodes.empty()) g.Edge(run.nodes.back(), id, 0);
      run.nodes.push_back(id);
    }
    runs.push_back(std::move(run));
  };
  std::vector<std::vector<int>> enc_bins(o.encoder_dp);
  for (size_t b = 0; b < nb && !mono; ++b) {
    if (bins[b].encoder > 0) enc_bins[bins[b].encoder_rank].push_back(static_cast<int>(b));
  }
  for (int e = 0; e < o.encoder_dp; ++e) {
    std::vector<int>& order = enc_bins[e];  // slot by slot, as the workers sort
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
      return std::make_pair(bins[x].microbatch, bins[x].llm_rank) <
             std::make_pair(bins[y].microbatch, bins[y].llm_rank);
    });
    std::vector<std::pair<bool, int>> ops;
    for (int b : order) ops.push_back({true, b});
    for (int b : order) ops.push_back({false, b});
    for (int s = 0; s < pe; ++s) run_stage(true, e, s, ops);
  }
  const int pe_llm = mono ? 0 : pe;  // encoder stages ahead of the LLM's in the pipeline
  for (int r = 0; r < o.llm_dp; ++r) {
    for (int s = 0; s < pl; ++s) {
      std::vector<std::pair<bool, int>> ops;
      for (const parallel::PipelineOp& op : parallel::OneFOneBSchedule(
               pe_llm + pl + pg, parallel::GlobalStage(false, s, pe_llm), m)) {
        ops.push_back({op.kind == parallel::PipelineOp::kForward,
                       bin_at[static_cast<size_t>(r) * m + op.microbatch]});
      }
      run_stage(false, r, s, ops);
    }
  }
  // The generator's replicas: their bins with pictures slot by slot, each
  // bin's forward then its backward.
  for (int k = 0; k < o.generator_dp && pg > 0; ++k) {
    std::vector<int> order;
    for (size_t b = 0; b < nb; ++b) {
      if (bins[b].generator > 0 && bins[b].generator_rank == k)
        order.push_back(static_cast<int>(b));
    }
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
      return std::make_pair(bins[x].microbatch, bins[x].llm_rank) <
             std::make_pair(bins[y].microbatch, bins[y].llm_rank);
    });
    StageRun run{false, k, pl, {}, true};
    for (int b : order) {
      for (const bool forward : {true, false}) {
        SimulatedTask t;
        t.kind = forward ? SimulatedTask::kForward : SimulatedTask::kBackward;
        t.generator = true;
        t.dp = k;
        t.stage = pl;
        t.bin = b;
        const double fs = o.generator_forward_share;
        const int id = g.Add(bins[b].generator * (forward ? fs : 1 - fs), t);
        devices(false, k, pl, id, /*generator=*/true);
        (forward ? gf : gb)[b] = id;
        if (!run.nodes.empty()) g.Edge(run.nodes.back(), id, 0);
        run.nodes.push_back(id);
      }
    }
    runs.push_back(std::move(run));
  }
  // Data dependencies of each bin.
  for (size_t b = 0; b < nb; ++b) {
    const BinAssignment& x = bins[b];
    const bool image = ef[b * pe] >= 0;
    for (int s = 1; s < pe && image; ++s) g.Edge(ef[b * pe + s - 1], ef[b * pe + s], 0);
    if (image) g.Edge(ef[b * pe + pe - 1], lf[b * pl], x.transfer);
    for (int s = 1; s < pl; ++s) g.Edge(lf[b * pl + s - 1], lf[b * pl + s], 0);
    g.Edge(lf[b * pl + pl - 1], lb[b * pl + pl - 1], 0);
    if (gf[b] >= 0) {  // the query states out, their gradients back
      g.Edge(lf[b * pl + pl - 1], gf[b], 0);
      g.Edge(gb[b], lb[b * pl + pl - 1], 0);
    }
    for (int s = pl - 1; s > 0; --s) g.Edge(lb[b * pl + s], lb[b * pl + s - 1], 0);
    if (image) g.Edge(lb[b * pl], eb[b * pe + pe - 1], x.transfer);
    for (int s = pe - 1; s > 0 && image; --s) g.Edge(eb[b * pe + s], eb[b * pe + s - 1], 0);
  }
  // A stage's gradient allreduce starts when every DP rank of that stage has
  // finished its last backward (a zero-length barrier per module stage).
  std::vector<int> barrier_enc(pe), barrier_llm(pl);
  for (int s = 0; s < pe; ++s) barrier_enc[s] = g.Add(0, {SimulatedTask::kAllreduce, true});
  for (int s = 0; s < pl; ++s) barrier_llm[s] = g.Add(0, {SimulatedTask::kAllreduce, false});
  const int barrier_gen = g.Add(0, {SimulatedTask::kAllreduce, false});
  std::vector<int> allreduce;
  for (const StageRun& run : runs) {
    const int barrier =
        run.generator ? barrier_gen : (run.encoder ? barrier_enc : barrier_llm)[run.stage];
    if (!run.nodes.empty()) g.Edge(run.nodes.back(), barrier, 0);
    SimulatedTask t;
    t.kind = SimulatedTask::kAllreduce;
    t.encoder = run.encoder;
    t.generator = run.generator;
    t.dp = run.dp;
    t.stage = run.stage;
    const double seconds =
        run.generator ? o.generator_allreduce_seconds
        : run.encoder
            ? o.encoder_allreduce_seconds
            : o.llm_allreduce_seconds + (mono && run.stage == 0 ? o.encoder_allreduce_seconds : 0) +
                  (mono && run.stage == pl - 1 ? o.generator_allreduce_seconds : 0);
    const int id = g.Add(seconds, t);
    if (shared < 0 && !run.generator) {
      devices(run.encoder, run.dp, run.stage, id);  // colocated: the links too
    }
    g.Edge(barrier, id, 0);
    allreduce.push_back(id);
  }
  if (!g.Run()) {
    return absl::InternalError("simulation: the stage orders deadlock");
  }

  SimulationResult result;
  for (int id : allreduce)
    result.iteration_seconds = std::max(result.iteration_seconds, g[id].task.end);
  for (const BinAssignment& x : bins) {
    result.llm_compute_seconds += x.llm;
    result.encoder_compute_seconds += x.encoder;
    result.generator_compute_seconds += x.generator;
  }
  // By module: 0 the LLM, 1 the encoder, 2 the generator.
  double span[3] = {0, 0, 0}, busy[3] = {0, 0, 0};
  for (const StageRun& run : runs) {
    if (run.nodes.empty()) continue;
    const int module = run.generator ? 2 : run.encoder ? 1 : 0;
    span[module] += g[run.nodes.back()].task.end;
    result.tasks += static_cast<int>(run.nodes.size());
    for (int id : run.nodes) {
      if (o.timeline) result.timeline.push_back(g[id].task);
      busy[module] += g[id].duration;
      result.recompute_seconds += g[id].recompute;
    }
  }
  result.llm_bubble_fraction = span[0] > 0 ? 1 - busy[0] / span[0] : 0;
  result.encoder_bubble_fraction = span[1] > 0 ? 1 - busy[1] / span[1] : 0;
  result.generator_bubble_fraction = span[2] > 0 ? 1 - busy[2] / span[2] : 0;
  if (result.iteration_seconds > 0) {
    result.llm_utilization =
        result.llm_compute_seconds / (result.iteration_seconds * o.llm_dp * pl);
    result.encoder_utilization =
        result.encoder_compute_seconds / (result.iteration_seconds * o.encoder_dp * pe);
    if (pg > 0) {
      result.generator_utilization =
          result.generator_compute_seconds / (result.iteration_seconds * o.generator_dp);
    }
  }
  if (o.timeline) {
    for (int id : allreduce) result.timeline.push_back(g[id].task);
    std::stable_sort(
        result.timeline.begin(), result.timeline.end(),
        [](const SimulatedTask& a, const SimulatedTask& b) { return a.start < b.start; });
  }
  return result;
}

}  // namespace loom::sched
