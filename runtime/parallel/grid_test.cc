#include "runtime/parallel/grid.h"

#include <set>

#include "gtest/gtest.h"

namespace loom::parallel {
namespace {

// The worked example of grid.h.
TEST(GridTest, WorkedExample) {
  const GridShape g{/*tp=*/2, /*pp=*/2, /*dp=*/3};
  ASSERT_EQ(g.size(), 12);
  EXPECT_EQ(PositionOf(g, 9), (GridPosition{1, 1, 1}));
  EXPECT_EQ(TpGroup(g, 9), (std::vector<int>{8, 9}));
  EXPECT_EQ(DpGroup(g, 9), (std::vector<int>{7, 9, 11}));
  EXPECT_EQ(PrevStageRank(g, 9), 3);
  EXPECT_EQ(NextStageRank(g, 9), -1);
  EXPECT_EQ(NextStageRank(g, 3), 9);
  EXPECT_EQ(PrevStageRank(g, 3), -1);
}

// For many shapes: positions and ranks are inverse, each TP and DP group has
// its degree's size, the groups of one kind partition the grid, every member
// of a group has the same group, and stage neighbours keep (tp, dp).
TEST(GridTest, GroupsPartitionEveryGrid) {
  for (int tp : {1, 2, 4}) {
    for (int pp : {1, 2, 3}) {
      for (int dp : {1, 2, 5}) {
        const GridShape g{tp, pp, dp};
        SCOPED_TRACE(testing::Message() << "tp " << tp << " pp " << pp << " dp " << dp);
        std::set<std::vector<int>> tp_groups, dp_groups;
        for (int r = 0; r < g.size(); ++r) {
          const GridPosition p = PositionOf(g, r);
          ASSERT_EQ(RankOf(g, p), r);
          const std::vector<int> t = TpGroup(g, r), d = DpGroup(g, r);
          EXPECT_EQ(static_cast<int>(t.size()), tp);
          EXPECT_EQ(static_cast<int>(d.size()), dp);
          for (int x : t) EXPECT_EQ(TpGroup(g, x), t);
          for (int x : d) EXPECT_EQ(DpGroup(g, x), d);
          tp_groups.insert(t);
          dp_groups.insert(d);
          if (int n = NextStageRank(g, r); n >= 0) {
            const GridPosition q = PositionOf(g, n);
            EXPECT_EQ(q.pp, p.pp + 1);
            EXPECT_EQ(q.tp, p.tp);
            EXPECT_EQ(q.dp, p.dp);
            EXPECT_EQ(PrevStageRank(g, n), r);
          } else {
            EXPECT_EQ(p.pp, pp - 1);
          }
        }
        EXPECT_EQ(static_cast<int>(tp_groups.size()), pp * dp);
        EXPECT_EQ(static_cast<int>(dp_groups.size()), pp * tp);
      }
    }
  }
}

TEST(GridTest, DegreesBelowOneAreNamed) {
  EXPECT_TRUE(ValidateGrid({2, 3, 4}, "llm").ok());
  absl::Status s = ValidateGrid({0, 1, 1}, "llm");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "llm_tp: must be >= 1, got 0");
  EXPECT_EQ(ValidateGrid({1, 1, -2}, "encoder").message(), "encoder_dp: must be >= 1, got -2");
}

}  // namespace
}  // namespace loom::parallel
