// The packings behind the assignment algorithms (assign.h): how a batch's
// samples are split into bins, before assign.cc puts the bins on ranks, in
// order, and on encoder ranks. Internal to the scheduler's assignment.
#ifndef LOOM_RUNTIME_SCHEDULING_PACK_H_
#define LOOM_RUNTIME_SCHEDULING_PACK_H_

#include <algorithm>
#include <cstddef>
#include <vector>

#include "runtime/scheduling/assign.h"

namespace loom::sched {

// Samples' costs per module: e (encoder), l (LLM) and g (generator: all 0
// for a model without one), divided by `scale`.
struct Normalized {
  std::vector<double> e, l, g;
  double scale = 1;  // what the costs as given were divided by
  // The largest of a sample's (or a bin's) three loads, and the middle one.
  static double Max(double e, double l, double g) { return std::max({e, l, g}); }
  static double Mid(double e, double l, double g) {
    return std::max(std::min(e, l), std::min(std::max(e, l), g));
  }
  double Sum(int i) const { return e[i] + l[i] + g[i]; }
};

// Every module divided by one factor, the largest module's mean bin: the
// modules stay comparable in the units given (times on each module's ranks),
// and values sit near 1 whatever those units are (solver and search
// tolerances are absolute).
Normalized CommonScale(const std::vector<SampleLoad>& samples, int bins);

// Each module in units of its own mean bin (total / bins): the keys of lpt
// and entrain, as their papers define them.
Normalized Normalize(const std::vector<SampleLoad>& samples, int bins);

using Groups = std::vector<std::vector<int>>;  // sample indices per bin

// Sample indices sorted by decreasing key, ties by index.
std::vector<int> ByDecreasing(const std::vector<double>& key);

// Moves one sample into each empty group from the group with the most
// samples (its smallest-cost sample), so every bin runs.
void FillEmpty(const Normalized& n, Groups* groups);

// max over bins of max(encoder, LLM, generator), in the units of `n`.
double LargestBin(const Normalized& n, const Groups& groups);

// The packings (assign.h describes the algorithms).
Groups Sequential(size_t count, int bins);
Groups LptGroups(const Normalized& n, int bins);
Groups EntrainGroups(const Normalized& n, int bins, const AssignOptions& o);
// The 2-D greedy; `even`: the vector greedy's key and tie-break.
Groups GreedyGroups(const Normalized& n, int bins, bool even);
// `loom`: the best of every cheap packing (on `common`), improved by a local
// search that never raises the largest bin.
Groups LoomGroups(const Normalized& common, const Normalized& n, int bins, const AssignOptions& o);

}  // namespace loom::sched

#endif  // LOOM_RUNTIME_SCHEDULING_PACK_H_
