// Deterministic random numbers: the same seed gives the same stream on every
// machine (std:: distributions are implementation-defined, so the draws are
// made here from mt19937_64's raw output).
#ifndef LOOM_RUNTIME_BASE_RNG_H_
#define LOOM_RUNTIME_BASE_RNG_H_

#include <cmath>
#include <cstdint>
#include <random>

namespace loom {

// A well-mixed 64-bit seed for item `index` of stream `salt` under `seed`.
inline uint64_t MixSeed(uint64_t seed, int64_t index, uint64_t salt) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(index) * 0xBF58476D1CE4E5B9ULL +
               salt * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  z *= 0xD6E8FEB86659FD93ULL;
  return z ^ (z >> 29);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}

  uint64_t Next() { return engine_(); }
  // [0, 1)
  double Uniform() { return static_cast<double>(engine_() >> 11) * (1.0 / 9007199254740992.0); }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // [lo, hi], both included.
  int64_t UniformInt(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(engine_() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool Bernoulli(double p) { return Uniform() < p; }
  // Standard normal (Box-Muller).
  double Normal() {
    const double u1 = 1.0 - Uniform(), u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  // exp(N(log median, sigma)), clamped to [lo, hi].
  double LogNormal(double median, double sigma, double lo, double hi) {
    const double v = median * std::exp(sigma * Normal());
    return v < lo ? lo : (v > hi ? hi : v);
  }

 private:
  std::mt19937_64 engine_;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_BASE_RNG_H_
