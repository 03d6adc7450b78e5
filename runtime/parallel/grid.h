// One module's grid of worker ranks: tp x pp x dp (the plan's ModulePlan).
// The encoder and the LLM each have their own grid; nothing here knows of a
// world of all ranks (Megatron-LM #6307: module-level globals hand out the
// wrong grid's group when two modules differ, and nothing raises).
//
// Rank order, one for every module: TP fastest, then DP, then PP:
//
//   rank = pp * (dp_size * tp_size) + dp * tp_size + tp
//
// so a TP group is tp_size consecutive ranks (one node, where TP belongs), a
// pipeline stage is one contiguous block of dp_size * tp_size ranks, and a
// DP group is the ranks tp_size apart inside one stage. Worked example, tp 2
// x pp 2 x dp 3 (12 ranks):
//
//   stage 0: dp0 {0 1}  dp1 {2 3}  dp2 {4 5}
//   stage 1: dp0 {6 7}  dp1 {8 9}  dp2 {10 11}
//
//   rank 9 = (tp 1, pp 1, dp 1): TP group {8 9}, DP group {7 9 11},
//   previous stage rank 3, no next stage.
#ifndef LOOM_RUNTIME_PARALLEL_GRID_H_
#define LOOM_RUNTIME_PARALLEL_GRID_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace loom::parallel {

struct GridShape {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int size() const { return tp * pp * dp; }
};

struct GridPosition {
  int tp = 0;
  int pp = 0;
  int dp = 0;
  bool operator==(const GridPosition& o) const { return tp == o.tp && pp == o.pp && dp == o.dp; }
};

// INVALID_ARGUMENT naming `module` and the degree below 1.
absl::Status ValidateGrid(const GridShape& shape, const std::string& module);

// The position of `rank` (0 <= rank < shape.size(); checked) and back.
GridPosition PositionOf(const GridShape& shape, int rank);
int RankOf(const GridShape& shape, const GridPosition& p);

// The ranks that share `rank`'s stage and DP replica (its TP group) and that
// share its stage and TP position (its DP group), in increasing order; each
// includes `rank`.
std::vector<int> TpGroup(const GridShape& shape, int rank);
std::vector<int> DpGroup(const GridShape& shape, int rank);

// The rank at the same (tp, dp) one stage before / after `rank`'s; -1 when
// `rank` is in the first / last stage.
int PrevStageRank(const GridShape& shape, int rank);
int NextStageRank(const GridShape& shape, int rank);

}  // namespace loom::parallel

#endif  // LOOM_RUNTIME_PARALLEL_GRID_H_
