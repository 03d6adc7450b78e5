// Small statistics shared by the benchmarks, the profiler and validation.
#ifndef LOOM_RUNTIME_BASE_STATS_H_
#define LOOM_RUNTIME_BASE_STATS_H_

#include <algorithm>
#include <vector>

namespace loom {

// The median (the mean of the two middle values of an even count); 0 for
// none.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace loom

#endif  // LOOM_RUNTIME_BASE_STATS_H_
