#include "runtime/model/params.h"

#include <cmath>
#include <random>

#include "runtime/base/log.h"

namespace loom {

int ParamSet::Add(std::string name, Shape shape, Init init, float std) {
  LOOM_CHECK(!finalized_) << "Add after Finalize: " << name;
  ParamSpec s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.numel = NumElements(s.shape);
  s.offset = total_;
  s.init = init;
  s.std = std;
  total_ += s.numel;
  specs_.push_back(std::move(s));
  return static_cast<int>(specs_.size()) - 1;
}

void ParamSet::Finalize() {
  LOOM_CHECK(!finalized_) << "Finalize twice";
  finalized_ = true;
  data_.assign(total_, 0.0f);
  grad_.assign(total_, 0.0f);
  m_.assign(total_, 0.0f);
  v_.assign(total_, 0.0f);
}

void ParamSet::Initialize(uint64_t seed) {
  LOOM_CHECK(finalized_) << "Initialize before Finalize";
  // mt19937_64 and our own Box-Muller: std::normal_distribution is not the
  // same on every standard library.
  std::mt19937_64 rng(seed);
  auto uniform = [&] { return (static_cast<double>(rng() >> 11) + 0.5) / 9007199254740992.0; };
  for (const ParamSpec& s : specs_) {
    float* p = data_.data() + s.offset;
    for (int64_t i = 0; i < s.numel; ++i) {
      switch (s.init) {
        case Init::kZeros:
          p[i] = 0.0f;
          break;
        case Init::kOnes:
          p[i] = 1.0f;
          break;
        case Init::kNormal: {
          const double u1 = uniform(), u2 = uniform();
          p[i] = static_cast<float>(s.std * std::sqrt(-2.0 * std::log(u1)) *
                                    std::cos(6.283185307179586 * u2));
          break;
        }
      }
    }
  }
  std::fill(m_.begin(), m_.end(), 0.0f);
  std::fill(v_.begin(), v_.end(), 0.0f);
  step_ = 0;
}

void ParamSet::ZeroGrad() { std::fill(grad_.begin(), grad_.end(), 0.0f); }

}  // namespace loom
