// Test helpers: deterministic random data, closeness checks against the
// tolerance table, and finite-difference gradient checks.
#ifndef LOOM_KERNELS_TESTING_GRADCHECK_H_
#define LOOM_KERNELS_TESTING_GRADCHECK_H_

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/tolerances.h"

namespace loom::testing {

// n values uniform in [-scale, scale), the same for the same seed.
inline std::vector<float> RandomVector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// sum_i out[i] * g[i] in double: the scalar loss L whose gradient dL/dout is
// g, used to test a backward against finite differences of its forward.
inline double WeightedSum(const std::vector<float>& out, const std::vector<float>& g) {
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * g[i];
  return s;
}

inline bool Close(double got, double want, const Tolerance& tol) {
  return std::fabs(got - want) <= tol.atol + tol.rtol * std::fabs(want);
}

// Every element of `got` within `tol` of `want`; reports the first few misses.
inline ::testing::AssertionResult AllClose(const float* got, const float* want, size_t n,
                                           const Tolerance& tol) {
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < n; ++i) {
    if (!Close(got[i], want[i], tol)) {
      if (bad++ < 5) {
        first += " [" + std::to_string(i) + "] got " + std::to_string(got[i]) + " want " +
                 std::to_string(want[i]) + ";";
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << n << " elements off (" << tol.reason << "):" << first;
}

// Checks `analytic` (dL/dparam for n parameters) against central differences
// of `loss` (which reads `param`), at up to `max_checks` evenly spread indices.
inline ::testing::AssertionResult CheckGradient(const std::function<double()>& loss, float* param,
                                                const float* analytic, size_t n,
                                                size_t max_checks = 64, float h = 1e-2f,
                                                const Tolerance& tol = kFiniteDifferenceF32) {
  const size_t step = n <= max_checks ? 1 : n / max_checks;
  for (size_t i = 0; i < n; i += step) {
    const float saved = param[i];
    param[i] = saved + h;
    const double up = loss();
    param[i] = saved - h;
    const double down = loss();
    param[i] = saved;
    const double numeric = (up - down) / (2.0 * h);
    if (!Close(analytic[i], numeric, tol)) {
      return ::testing::AssertionFailure()
             << "gradient [" << i << "]: analytic " << analytic[i] << " vs numeric " << numeric
             << " (" << tol.reason << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace loom::testing

#endif  // LOOM_KERNELS_TESTING_GRADCHECK_H_
