#include "runtime/scheduling/pack.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <queue>
#include <utility>

namespace loom::sched {
namespace {

// The loom algorithm's local search: from a start assignment, moves and swaps
// samples out of the most loaded bin while that lowers it without making
// another bin as loaded. The largest bin never rises.
constexpr int kResplitTries = 4;  // lightest bins tried for a re-split of the heaviest

class LocalSearch {
 public:
  LocalSearch(const Normalized& n, Groups start)
      : n_(n),
        groups_(std::move(start)),
        e_(groups_.size(), 0),
        l_(groups_.size(), 0),
        g_(groups_.size(), 0) {
    for (size_t g = 0; g < groups_.size(); ++g) Refresh(static_cast<int>(g));
  }

  Groups Run() {
    Improve();
    return std::move(groups_);
  }

 private:
  double Load(int g) const { return Normalized::Max(e_[g], l_[g], g_[g]); }

  void Add(int g, int i) {
    groups_[g].push_back(i);
    e_[g] += n_.e[i];
    l_[g] += n_.l[i];
    g_[g] += n_.g[i];
  }
  void Remove(int g, int i) {
    e_[g] -= n_.e[i];
    l_[g] -= n_.l[i];
    g_[g] -= n_.g[i];
  }

  // Recomputes the loads of group g from its samples.
  void Refresh(int g) {
    e_[g] = l_[g] = g_[g] = 0;
    for (int i : groups_[g]) {
      e_[g] += n_.e[i];
      l_[g] += n_.l[i];
      g_[g] += n_.g[i];
    }
  }
  // Bin g's loads plus (sign 1) or less (-1) sample i's: their largest.
  double With(int g, int i, double sign) const {
    return Normalized::Max(e_[g] + sign * n_.e[i], l_[g] + sign * n_.l[i], g_[g] + sign * n_.g[i]);
  }

  // Each step lowers the most loaded bin below its load M without raising
  // another to M: a move of one sample, else a swap of two. Stops at a local
  // optimum or after a bounded number of steps.
  void Improve() {
    const int bins = static_cast<int>(groups_.size());
    const int max_steps = 50 * bins + 100;
    for (int step = 0; step < max_steps; ++step) {
      int a = 0;
      for (int g = 1; g < bins; ++g) {
        if (Load(g) > Load(a)) a = g;
      }
      const double m = Load(a) - 1e-9;
      if (MoveOut(a, m)) continue;
      // The other bins from the least loaded up: a swap with the first that
      // admits one, else a re-split of a and one of the lightest bins.
      std::vector<int> light(bins);
      std::iota(light.begin(), light.end(), 0);
      std::stable_sort(light.begin(), light.end(), [&](int x, int y) { return Load(x) < Load(y); });
      bool improved = false;
      for (int b : light) {
        if (b == a || Load(b) >= m) break;
        if ((improved = SwapWith(a, b, m))) break;
      }
      // Re-split partners: the lightest bins, then those with the most room
      // in the module that binds a (a bin light overall may be full there).
      std::vector<int> slack = light;
      const std::vector<double>& binds = g_[a] > std::max(e_[a], l_[a]) ? g_
                                         : l_[a] >= e_[a]               ? l_
                                                                        : e_;
      std::stable_sort(slack.begin(), slack.end(),
                       [&](int x, int y) { return binds[x] < binds[y]; });
      for (const std::vector<int>* partners : {&light, &slack}) {
        for (int k = 0, tried = 0; !improved && k < bins && tried < kResplitTries; ++k) {
          const int b = (*partners)[k];
          if (b == a) continue;
          ++tried;
          improved = Resplit(a, b, m);
        }
      }
      if (!improved) return;
    }
  }

  bool MoveOut(int a, double m) {
    if (groups_[a].size() < 2) return false;
    const int bins = static_cast<int>(groups_.size());
    double best = m;
    int best_k = -1, best_b = -1;
    for (size_t k = 0; k < groups_[a].size(); ++k) {
      const int i = groups_[a][k];
      const double na = With(a, i, -1);
      if (na >= best) continue;
      for (int b = 0; b < bins; ++b) {
        if (b == a) continue;
        const double v = std::max(na, With(b, i, 1));
        if (v < best) {
          best = v;
          best_k = static_cast<int>(k);
          best_b = b;
        }
      }
    }
    if (best_k < 0) return false;
    const int i = groups_[a][best_k];
    groups_[a].erase(groups_[a].begin() + best_k);
    Remove(a, i);
    Add(best_b, i);
    return true;
  }

  // The best swap of a sample of `a` with one of `b` that leaves both below m.
  bool SwapWith(int a, int b, double m) {
    double best = m;
    int best_k = -1, best_j = -1;
    for (size_t k = 0; k < groups_[a].size(); ++k) {
      const int i = groups_[a][k];
      for (size_t q = 0; q < groups_[b].size(); ++q) {
        const int j = groups_[b][q];
        const double de = n_.e[j] - n_.e[i], dl = n_.l[j] - n_.l[i], dg = n_.g[j] - n_.g[i];
        if (de >= 0 && dl >= 0 && dg >= 0) continue;  // a would not get lighter
        const double v = std::max(Normalized::Max(e_[a] + de, l_[a] + dl, g_[a] + dg),
                                  Normalized::Max(e_[b] - de, l_[b] - dl, g_[b] - dg));
        if (v < best) {
          best = v;
          best_k = static_cast<int>(k);
          best_j = static_cast<int>(q);
        }
      }
    }
    if (best_k < 0) return false;
    std::swap(groups_[a][best_k], groups_[b][best_j]);
    Refresh(a);
    Refresh(b);
    return true;
  }

  // Splits the samples of bins a and b anew (vector greedy, then the best
  // swaps between the two); kept if both end below m.
  bool Resplit(int a, int b, double m) {
    std::vector<int> all = groups_[a];
    all.insert(all.end(), groups_[b].begin(), groups_[b].end());
    std::stable_sort(all.begin(), all.end(), [&](int x, int y) {
      return Normalized::Max(n_.e[x], n_.l[x], n_.g[x]) >
             Normalized::Max(n_.e[y], n_.l[y], n_.g[y]);
    });
    const std::vector<int> old_a = groups_[a], old_b = groups_[b];
    groups_[a].clear();
    groups_[b].clear();
    e_[a] = l_[a] = g_[a] = e_[b] = l_[b] = g_[b] = 0;
    for (int i : all) {
      const double ma = With(a, i, 1), mb = With(b, i, 1);
      const int to = (ma < mb || (ma == mb && groups_[a].size() <= groups_[b].size())) ? a : b;
      Add(to, i);
    }
    for (int round = 0; round < 32; ++round) {
      const int hi = Load(a) >= Load(b) ? a : b, lo = hi == a ? b : a;
      if (!SwapWith(hi, lo, Load(hi) - 1e-12)) break;
    }
    if (!groups_[a].empty() && !groups_[b].empty() && std::max(Load(a), Load(b)) < m) return true;
    groups_[a] = old_a;
    groups_[b] = old_b;
    Refresh(a);
    Refresh(b);
    return false;
  }

  const Normalized& n_;
  Groups groups_;
  std::vector<double> e_, l_, g_;
};

// Largest-first to the least loaded group (ties: lowest group index).
void Lpt(const std::vector<int>& items, const std::vector<double>& size, std::vector<double>* load,
         Groups* groups) {
  using Entry = std::pair<double, int>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  for (size_t g = 0; g < groups->size(); ++g) heap.push({(*load)[g], static_cast<int>(g)});
  for (int i : items) {
    auto [l, g] = heap.top();
    heap.pop();
    (*groups)[g].push_back(i);
    (*load)[g] = l + size[i];
    heap.push({(*load)[g], g});
  }
}

}  // namespace

namespace {
struct Totals {
  double e = 0, l = 0, g = 0;
};
Totals TotalsOf(const std::vector<SampleLoad>& samples) {
  Totals t;
  for (const SampleLoad& s : samples) {
    t.e += s.encoder;
    t.l += s.llm;
    t.g += s.generator;
  }
  return t;
}
}  // namespace

Normalized CommonScale(const std::vector<SampleLoad>& samples, int bins) {
  const Totals t = TotalsOf(samples);
  Normalized n;
  const double mean = std::max({t.e, t.l, t.g}) / bins;
  n.scale = mean > 0 ? mean : 1.0;
  for (const SampleLoad& s : samples) {
    n.e.push_back(s.encoder / n.scale);
    n.l.push_back(s.llm / n.scale);
    n.g.push_back(s.generator / n.scale);
  }
  return n;
}

Normalized Normalize(const std::vector<SampleLoad>& samples, int bins) {
  const Totals t = TotalsOf(samples);
  Normalized n;
  for (const SampleLoad& s : samples) {
    n.e.push_back(t.e > 0 ? s.encoder * bins / t.e : 0);
    n.l.push_back(t.l > 0 ? s.llm * bins / t.l : 0);
    n.g.push_back(t.g > 0 ? s.generator * bins / t.g : 0);
  }
  return n;
}

std::vector<int> ByDecreasing(const std::vector<double>& key) {
  std::vector<int> order(key.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key[a] > key[b]; });
  return order;
}

// Moves one sample into each empty group from the group with the most samples
// (its smallest-cost sample), so every bin runs.
void FillEmpty(const Normalized& n, Groups* groups) {
  for (auto& g : *groups) {
    if (!g.empty()) continue;
    auto donor = std::max_element(groups->begin(), groups->end(),
                                  [](const auto& a, const auto& b) { return a.size() < b.size(); });
    auto smallest = std::min_element(donor->begin(), donor->end(), [&](int a, int b) {
      return n.Sum(a) < n.Sum(b) || (n.Sum(a) == n.Sum(b) && a < b);
    });
    g.push_back(*smallest);
    donor->erase(smallest);
  }
}

Groups Sequential(size_t count, int bins) {
  Groups groups(bins);
  for (size_t i = 0; i < count; ++i) groups[i * bins / count].push_back(static_cast<int>(i));
  return groups;
}

Groups LptGroups(const Normalized& n, int bins) {
  std::vector<double> size(n.e.size());
  for (size_t i = 0; i < size.size(); ++i) size[i] = n.Sum(static_cast<int>(i));
  Groups groups(bins);
  std::vector<double> load(bins, 0);
  Lpt(ByDecreasing(size), size, &load, &groups);
  return groups;
}

Groups EntrainGroups(const Normalized& n, int bins, const AssignOptions& o) {
  Groups groups(bins);
  std::vector<int> images, text;
  for (size_t i = 0; i < n.e.size(); ++i)
    (n.e[i] > 0 ? images : text).push_back(static_cast<int>(i));
  // 1. The encoder: image samples by decreasing encoder cost.
  std::vector<double> enc(bins, 0);
  std::vector<int> by_e = ByDecreasing(n.e);
  by_e.resize(images.size());  // text-only samples (cost 0) sort last
  Lpt(by_e, n.e, &enc, &groups);
  // 2. The LLM: text-only samples to the least LLM-loaded bins.
  std::vector<double> llm(bins, 0);
  for (int g = 0; g < bins; ++g) {
    for (int i : groups[g]) llm[g] += n.l[i];
  }
  std::vector<int> by_l = ByDecreasing(n.l);
  std::vector<int> text_by_l;
  for (int i : by_l) {
    if (n.e[i] == 0) text_by_l.push_back(i);
  }
  Lpt(text_by_l, n.l, &llm, &groups);
  // 3. Deferral in execution order (microbatch-major across ranks): a bin's
  // LLM load above the mean moves to later bins with room, as long as the
  // encoder's maximum does not rise.
  const double enc_max = *std::max_element(enc.begin(), enc.end());
  auto exec_index = [&](int g) { return (g % o.microbatches) * o.llm_dp + g / o.microbatches; };
  std::vector<int> order(bins);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return exec_index(a) < exec_index(b); });
  for (int pos = 0; pos < bins; ++pos) {
    const int g = order[pos];
    while (llm[g] > 1.0 && groups[g].size() > 1) {
      // The sample that frees the most LLM load per unit of encoder load moved.
      auto pick = std::max_element(groups[g].begin(), groups[g].end(), [&](int a, int b) {
        const double ra = n.l[a] / (n.e[a] + 1e-9), rb = n.l[b] / (n.e[b] + 1e-9);
        return ra < rb || (ra == rb && a > b);
      });
      const int s = *pick;
      int target = -1;
      for (int q = pos + 1; q < bins; ++q) {
        const int h = order[q];
        if (llm[h] + n.l[s] > llm[g] || enc[h] + n.e[s] > enc_max) continue;
        if (target < 0 || llm[h] < llm[target]) target = h;
      }
      if (target < 0) break;
      groups[g].erase(pick);
      groups[target].push_back(s);
      llm[g] -= n.l[s];
      enc[g] -= n.e[s];
      llm[target] += n.l[s];
      enc[target] += n.e[s];
    }
  }
  return groups;
}

// Largest bin of any module: max over bins of max(encoder, LLM,
// generator), in the units of `n`. The objective `loom` and `ilp` minimise
// (on CommonScale costs).
double LargestBin(const Normalized& n, const Groups& groups) {
  double worst = 0;
  for (const std::vector<int>& bin : groups) {
    double e = 0, l = 0, g = 0;
    for (int i : bin) {
      e += n.e[i];
      l += n.l[i];
      g += n.g[i];
    }
    worst = std::max({worst, e, l, g});
  }
  return worst;
}

// The vector greedy: samples by decreasing max(encoder, LLM, generator)
// cost, each to the bin whose resulting max of the three is least. Plain
// (`even` false): ties go to the lowest bin. Vector (`even` true): a
// sample's key also favours the one that loads more modules (its middle
// load), and ties between bins go to the one whose loads stay most even
// (least e² + l² + g²).
Groups GreedyGroups(const Normalized& n, int bins, bool even) {
  std::vector<double> key(n.e.size());
  for (size_t i = 0; i < key.size(); ++i) {
    key[i] = Normalized::Max(n.e[i], n.l[i], n.g[i]) +
             (even ? 1e-3 * Normalized::Mid(n.e[i], n.l[i], n.g[i]) : 0.0);
  }
  const double tie = even ? 1e-12 : 0.0;
  Groups groups(bins);
  std::vector<double> e(bins, 0), l(bins, 0), gen(bins, 0);
  for (int i : ByDecreasing(key)) {
    int best = 0;
    double best_max = INFINITY, best_sq = INFINITY;
    for (int g = 0; g < bins; ++g) {
      const double ge = e[g] + n.e[i], gl = l[g] + n.l[i], gg = gen[g] + n.g[i];
      const double mx = Normalized::Max(ge, gl, gg);
      const double sq = even ? ge * ge + gl * gl + gg * gg : 0.0;
      if (mx < best_max - tie || (even && mx < best_max + tie && sq < best_sq)) {
        best = g;
        best_max = mx;
        best_sq = sq;
      }
    }
    groups[best].push_back(i);
    e[best] += n.e[i];
    l[best] += n.l[i];
    gen[best] += n.g[i];
  }
  FillEmpty(n, &groups);
  return groups;
}

// `loom`: the best (least LargestBin on the common scale) of every cheap
// heuristic Loom ships, improved by the local search. So it is never worse
// than any of them on any batch, and the search only ever lowers it.
Groups LoomGroups(const Normalized& common, const Normalized& n, int bins, const AssignOptions& o) {
  Groups candidates[] = {GreedyGroups(common, bins, /*even=*/true),
                         GreedyGroups(common, bins, /*even=*/false), LptGroups(n, bins),
                         Sequential(common.e.size(), bins), EntrainGroups(n, bins, o)};
  Groups* best = &candidates[0];
  for (Groups& c : candidates) {
    FillEmpty(n, &c);  // every bin runs, whichever candidate wins
    if (LargestBin(common, c) < LargestBin(common, *best)) best = &c;
  }
  return LocalSearch(common, std::move(*best)).Run();
}

}  // namespace loom::sched
