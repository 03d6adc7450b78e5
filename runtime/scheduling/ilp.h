// DFLOP's per-batch ILP, solved by COIN-OR CBC: put N samples into K bins,
// minimise C with every bin's cost of every module (encoder, LLM, and the
// generator where there is one) <= C, every sample in exactly one bin,
// every bin non-empty.
#ifndef LOOM_RUNTIME_SCHEDULING_ILP_H_
#define LOOM_RUNTIME_SCHEDULING_ILP_H_

#include <vector>

#include "absl/status/statusor.h"

namespace loom::sched {

struct IlpSolution {
  std::vector<std::vector<int>> groups;  // sample indices per bin
  double objective = 0;                  // C of the solution found
  double bound = 0;                      // proven lower bound on C
  bool optimal = false;                  // the search finished
};

// `modules[m]` are module m's per-sample costs: the encoder's, the LLM's,
// then the generator's (which adds no rows when it has no cost at all); `start` is a feasible
// assignment the solver begins from. INTERNAL if CBC returns no feasible solution.
absl::StatusOr<IlpSolution> SolveBinIlp(const std::vector<std::vector<double>>& modules, int bins,
                                        const std::vector<std::vector<int>>& start,
                                        double time_limit_seconds);

}  // namespace loom::sched

#endif  // LOOM_RUNTIME_SCHEDULING_ILP_H_
