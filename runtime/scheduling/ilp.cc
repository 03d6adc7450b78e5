#include "runtime/scheduling/ilp.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "coin/Cbc_C_Interface.h"

namespace loom::sched {

absl::StatusOr<IlpSolution> SolveBinIlp(const std::vector<std::vector<double>>& modules, int bins,
                                        const std::vector<std::vector<int>>& start,
                                        double time_limit_seconds) {
  // The encoder's and the LLM's rows always (as DFLOP's formulation has
  // them); a further module's only where it has any cost.
  std::vector<const std::vector<double>*> costs;
  for (size_t k = 0; k < modules.size(); ++k) {
    const std::vector<double>& m = modules[k];
    if (k < 2 || std::any_of(m.begin(), m.end(), [](double c) { return c > 0; })) {
      costs.push_back(&m);
    }
  }
  const int n = modules.empty() ? 0 : static_cast<int>(modules[0].size());
  const int k = bins, M = static_cast<int>(costs.size());
  // Columns: x(i, b) = i * k + b, then C. Rows: n assignment rows, k rows
  // per module with a cost, k non-empty rows.
  const int cols = n * k + 1, rows = n + (M + 1) * k;
  const int c_col = n * k;
  std::vector<int> starts, index;
  std::vector<double> value;
  starts.reserve(cols + 1);
  for (int i = 0; i < n; ++i) {
    for (int b = 0; b < k; ++b) {
      starts.push_back(static_cast<int>(index.size()));
      index.push_back(i);
      value.push_back(1);
      for (int m = 0; m < M; ++m) {
        if ((*costs[m])[i] > 0) {
          index.push_back(n + m * k + b);
          value.push_back((*costs[m])[i]);
        }
      }
      index.push_back(n + M * k + b);
      value.push_back(1);
    }
  }
  starts.push_back(static_cast<int>(index.size()));
  for (int b = 0; b < M * k; ++b) {
    index.push_back(n + b);
    value.push_back(-1);
  }
  starts.push_back(static_cast<int>(index.size()));
  std::vector<double> col_lb(cols, 0), col_ub(cols, 1), obj(cols, 0);
  col_ub[c_col] = 1e30;
  obj[c_col] = 1;
  std::vector<double> row_lb(rows), row_ub(rows);
  for (int i = 0; i < n; ++i) row_lb[i] = row_ub[i] = 1;
  for (int r = n; r < n + M * k; ++r) {
    row_lb[r] = -1e30;
    row_ub[r] = 0;
  }
  for (int r = n + M * k; r < rows; ++r) {
    row_lb[r] = 1;
    row_ub[r] = 1e30;
  }

  std::unique_ptr<Cbc_Model, void (*)(Cbc_Model*)> model(Cbc_newModel(), Cbc_deleteModel);
  Cbc_Model* m = model.get();
  Cbc_loadProblem(m, cols, rows, starts.data(), index.data(), value.data(), col_lb.data(),
                  col_ub.data(), obj.data(), row_lb.data(), row_ub.data());
  for (int c = 0; c < c_col; ++c) Cbc_setInteger(m, c);
  Cbc_setLogLevel(m, 0);
  Cbc_setMaximumSeconds(m, time_limit_seconds);
  Cbc_setAllowableGap(m, 1e-7);

  // The start: x from `start`, C its objective.
  std::vector<int> start_cols;
  std::vector<double> start_vals;
  double start_c = 0;
  for (int b = 0; b < k && b < static_cast<int>(start.size()); ++b) {
    for (int i : start[b]) {
      start_cols.push_back(i * k + b);
      start_vals.push_back(1);
    }
    for (int m = 0; m < M; ++m) {
      double load = 0;
      for (int i : start[b]) load += (*costs[m])[i];
      start_c = std::max(start_c, load);
    }
  }
  start_cols.push_back(c_col);
  start_vals.push_back(start_c);
  Cbc_setMIPStartI(m, static_cast<int>(start_cols.size()), start_cols.data(), start_vals.data());

  Cbc_solve(m);
  const double* x = Cbc_bestSolution(m);
  if (x == nullptr) {
    return absl::InternalError(
        absl::StrCat("ilp: CBC found no feasible solution in ", time_limit_seconds, " s"));
  }
  IlpSolution out;
  out.groups.resize(k);
  for (int i = 0; i < n; ++i) {
    int best = 0;
    for (int b = 1; b < k; ++b) {
      if (x[i * k + b] > x[i * k + best]) best = b;
    }
    out.groups[best].push_back(i);
  }
  out.objective = Cbc_getObjValue(m);
  out.bound = Cbc_getBestPossibleObjValue(m);
  out.optimal = Cbc_isProvenOptimal(m) != 0;
  return out;
}

}  // namespace loom::sched
