// What Loom's benchmarks time with: the median of a step's wall times.
#ifndef LOOM_RUNTIME_BASE_BENCH_TIMING_H_
#define LOOM_RUNTIME_BASE_BENCH_TIMING_H_

#include <algorithm>
#include <chrono>
#include <type_traits>
#include <vector>

#include "runtime/base/stats.h"

namespace loom::bench {

using ::loom::Median;  // runtime/base/stats.h

// Median seconds of `step` over `steps` runs after `warmup` unmeasured ones,
// `sync()` before and after each (a device's synchronise). A `step` that
// returns bool ends the timing on false, and then the result is 0.
template <typename Step, typename Sync>
double MedianSeconds(int warmup, int steps, Sync sync, Step step) {
  std::vector<double> t;
  for (int i = 0; i < warmup + steps; ++i) {
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    if constexpr (std::is_same_v<decltype(step()), bool>) {
      if (!step()) return 0;
    } else {
      step();
    }
    sync();
    if (i >= warmup) {
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  return Median(t);
}

}  // namespace loom::bench

#endif  // LOOM_RUNTIME_BASE_BENCH_TIMING_H_
