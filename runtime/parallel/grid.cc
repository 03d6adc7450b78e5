#include "runtime/parallel/grid.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/log.h"

namespace loom::parallel {

absl::Status ValidateGrid(const GridShape& shape, const std::string& module) {
  for (const auto& [name, v] :
       {std::pair<const char*, int>{"tp", shape.tp}, {"pp", shape.pp}, {"dp", shape.dp}}) {
    if (v < 1) {
      return absl::InvalidArgumentError(absl::StrCat(module, "_", name, ": must be >= 1, got ", v));
    }
  }
  return absl::OkStatus();
}

GridPosition PositionOf(const GridShape& shape, int rank) {
  LOOM_CHECK(rank >= 0 && rank < shape.size()) << "rank " << rank << " outside the grid";
  GridPosition p;
  p.tp = rank % shape.tp;
  p.dp = (rank / shape.tp) % shape.dp;
  p.pp = rank / (shape.tp * shape.dp);
  return p;
}

int RankOf(const GridShape& shape, const GridPosition& p) {
  LOOM_CHECK(p.tp >= 0 && p.tp < shape.tp && p.dp >= 0 && p.dp < shape.dp && p.pp >= 0 &&
             p.pp < shape.pp)
      << "position outside the grid";
  return p.pp * shape.dp * shape.tp + p.dp * shape.tp + p.tp;
}

std::vector<int> TpGroup(const GridShape& shape, int rank) {
  GridPosition p = PositionOf(shape, rank);
  std::vector<int> out;
  for (p.tp = 0; p.tp < shape.tp; ++p.tp) out.push_back(RankOf(shape, p));
  return out;
}

std::vector<int> DpGroup(const GridShape& shape, int rank) {
  GridPosition p = PositionOf(shape, rank);
  std::vector<int> out;
  for (p.dp = 0; p.dp < shape.dp; ++p.dp) out.push_back(RankOf(shape, p));
  return out;
}

int PrevStageRank(const GridShape& shape, int rank) {
  GridPosition p = PositionOf(shape, rank);
  if (p.pp == 0) return -1;
  --p.pp;
  return RankOf(shape, p);
}

int NextStageRank(const GridShape& shape, int rank) {
  GridPosition p = PositionOf(shape, rank);
  if (p.pp + 1 == shape.pp) return -1;
  ++p.pp;
  return RankOf(shape, p);
}

}  // namespace loom::parallel
