#include "runtime/model/generator.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "runtime/base/log.h"

namespace loom {
namespace {

VitConfig DenoiserOf(const GeneratorConfig& c) {
  VitConfig v = c.denoiser;
  v.prefix = 1 + c.queries;
  v.class_token = false;
  v.pre_norm = false;
  v.final_norm = true;
  return v;
}

// SplitMix64's finaliser, to mix the draw's coordinates into one seed.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// (N · G², 3 · P²) patch rows (rows (n, gy, gx), columns (c, y, x), as
// kernels/embedding's patchify) -> (N, 3, S, S) images.
void Unpatchify(const float* rows, int N, int S, int P, float* img) {
  const int G = S / P;
  size_t o = 0;
  for (int n = 0; n < N; ++n) {
    for (int gy = 0; gy < G; ++gy) {
      for (int gx = 0; gx < G; ++gx) {
        for (int ch = 0; ch < 3; ++ch) {
          for (int y = 0; y < P; ++y) {
            for (int x = 0; x < P; ++x) {
              img[((static_cast<size_t>(n) * 3 + ch) * S + gy * P + y) * S + gx * P + x] =
                  rows[o++];
            }
          }
        }
      }
    }
  }
}

}  // namespace

GenerationDraw DrawGeneration(uint64_t seed, int64_t step, uint64_t sample, int image, int pixels) {
  uint64_t z = Mix(seed ^ 0x67656e6572617465ull);  // "generate"
  z = Mix(z ^ static_cast<uint64_t>(step));
  z = Mix(z ^ sample);
  z = Mix(z ^ static_cast<uint64_t>(image));
  std::mt19937_64 rng(z);
  auto uniform = [&] { return (static_cast<double>(rng() >> 11) + 0.5) / 9007199254740992.0; };
  GenerationDraw d;
  d.t = static_cast<float>(uniform());
  d.noise.resize(pixels);
  // Box-Muller, as ParamSet::Initialize (std::normal_distribution differs
  // between standard libraries).
  for (float& x : d.noise) {
    const double u1 = uniform(), u2 = uniform();
    x = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  return d;
}

LayerRange GeneratorStageLayers(const GeneratorConfig& c, int pp, int stage) {
  const int L = c.denoiser.layers;
  LOOM_CHECK(pp >= 1 && pp <= std::max(1, L) && stage >= 0 && stage < pp)
      << "generator stage " << stage << " of " << pp << " over " << L << " blocks";
  return {stage * L / pp, (stage + 1) * L / pp};
}

Generator::Generator(const GeneratorConfig& c, Communicator* tp, Ops* ops, LayerRange layers)
    : config_(c), ops_(ops), vit_(DenoiserOf(c), tp, layers, ops), params_(ShardOf(tp)) {
  config_.denoiser = DenoiserOf(c);
  LOOM_CHECK(c.queries >= 1 && c.cond_dim >= 1 && c.time_freqs >= 2 && c.time_freqs % 2 == 0)
      << "generator queries " << c.queries << ", cond_dim " << c.cond_dim << ", time_freqs "
      << c.time_freqs;
  const int64_t D = c.denoiser.dim, Fq = c.time_freqs, PD = c.denoiser.patch_dim();
  const float std = 0.02f;
  // The timestep MLP and the conditions' projection feed the first stage's
  // prefix rows; the patch head follows the last stage.
  if (first_stage()) {
    t1_w_ = params_.Add("time.fc1.weight", {D, Fq}, Init::kNormal, std);
    t1_b_ = params_.Add("time.fc1.bias", {D}, Init::kZeros);
    t2_w_ = params_.Add("time.fc2.weight", {D, D}, Init::kNormal, std);
    t2_b_ = params_.Add("time.fc2.bias", {D}, Init::kZeros);
    c_w_ = params_.Add("cond.weight", {D, c.cond_dim}, Init::kNormal, std);
    c_b_ = params_.Add("cond.bias", {D}, Init::kZeros);
  }
  if (last_stage()) {
    head_w_ = params_.Add("head.weight", {PD, D}, Init::kNormal, std);
    head_b_ = params_.Add("head.bias", {PD}, Init::kZeros);
  }
  params_.Finalize();
  for (Buffer<float>* b : {&freqs_, &th_, &tg_, &cond_, &y_, &err_})
    b->set_backend(ops_->backend());
}

absl::Status Generator::Run(const std::vector<float>& x_t, const std::vector<float>& t,
                            const float* in, int N, float* out) {
  const GeneratorConfig& c = config_;
  const int D = c.denoiser.dim, Fq = c.time_freqs, Q = c.queries, K = 1 + Q,
            Np = c.denoiser.patches_per_tile();
  N_ = N;
  if (!first_stage()) {  // the previous stage's rows
    y_.resize(last_stage() ? static_cast<size_t>(N) * Np * D : 0);
    if (absl::Status s = vit_.Forward(in, N, last_stage() ? y_.data() : out); !s.ok()) return s;
    return last_stage() ? Head(N) : absl::OkStatus();
  }
  const float* cond = in;
  // sinusoid(time_scale · t): [cos(a f_i)..., sin(a f_i)...], f_i =
  // 10000^(-i / half) (DiT's TimestepEmbedder).
  std::vector<float> f(static_cast<size_t>(N) * Fq);
  const int half = Fq / 2;
  for (int n = 0; n < N; ++n) {
    for (int i = 0; i < half; ++i) {
      const double a = c.time_scale * t[n] * std::exp(-std::log(10000.0) * i / half);
      f[static_cast<size_t>(n) * Fq + i] = static_cast<float>(std::cos(a));
      f[static_cast<size_t>(n) * Fq + half + i] = static_cast<float>(std::sin(a));
    }
  }
  freqs_.CopyFromHost(f.data(), f.size());
  th_.resize(static_cast<size_t>(N) * D);
  ops_->linear_forward(th_.data(), freqs_.data(), params_.weight(t1_w_), params_.param(t1_b_), N,
                       Fq, D);
  tg_.resize(th_.size());
  ops_->activation_forward(c.denoiser.act, tg_.data(), th_.data(), static_cast<int64_t>(N) * D);
  Buffer<float> temb(ops_->backend()), cp(ops_->backend()), prefix(ops_->backend()),
      xt(ops_->backend());
  temb.resize(static_cast<size_t>(N) * D);
  ops_->linear_forward(temb.data(), tg_.data(), params_.weight(t2_w_), params_.param(t2_b_), N, D,
                       D);
  cond_.resize(static_cast<size_t>(N) * Q * c.cond_dim);
  ops_->copy(cond_.data(), cond, static_cast<int64_t>(cond_.size()));
  cp.resize(static_cast<size_t>(N) * Q * D);
  ops_->linear_forward(cp.data(), cond_.data(), params_.weight(c_w_), params_.param(c_b_), N * Q,
                       c.cond_dim, D);
  prefix.resize(static_cast<size_t>(N) * K * D);
  for (int n = 0; n < N; ++n) {
    float* p = prefix.data() + static_cast<size_t>(n) * K * D;
    ops_->copy(p, temb.data() + static_cast<size_t>(n) * D, D);
    ops_->copy(p + D, cp.data() + static_cast<size_t>(n) * Q * D, static_cast<int64_t>(Q) * D);
  }
  xt.CopyFromHost(x_t.data(), x_t.size());
  y_.resize(last_stage() ? static_cast<size_t>(N) * Np * D : 0);
  if (absl::Status s = vit_.Forward(xt.data(), N, last_stage() ? y_.data() : out, prefix.data());
      !s.ok()) {
    return s;
  }
  return last_stage() ? Head(N) : absl::OkStatus();
}

absl::Status Generator::Head(int N) {
  const GeneratorConfig& c = config_;
  const int D = c.denoiser.dim, Np = c.denoiser.patches_per_tile(), PD = c.denoiser.patch_dim();
  err_.resize(static_cast<size_t>(N) * Np * PD);
  ops_->linear_forward(err_.data(), y_.data(), params_.weight(head_w_), params_.param(head_b_),
                       N * Np, D, PD);
  return absl::OkStatus();
}

absl::Status Generator::Forward(const GeneratorBatch& b, const float* cond) {
  LOOM_CHECK(first_stage() && last_stage()) << "Generator::Forward of one stage: ForwardStage";
  return ForwardStage(b, cond, nullptr);
}

absl::Status Generator::ForwardStage(const GeneratorBatch& b, const float* in, float* out) {
  const GeneratorConfig& c = config_;
  const size_t want = static_cast<size_t>(b.N) * c.pixels();
  if (b.N < 1 || b.images.size() != want || b.noise.size() != want ||
      b.t.size() != static_cast<size_t>(b.N)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generator batch of ", b.N, " images: ", b.images.size(), " pixels, ", b.noise.size(),
        " noise values and ", b.t.size(), " timesteps, want ", want, ", ", want, " and ", b.N));
  }
  std::vector<float> x_t(want), neg_v(want);
  for (int n = 0; n < b.N; ++n) {
    const float t = b.t[n];
    if (!(t >= 0.0f && t <= 1.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("generator image ", n, ": timestep ", t, " outside [0, 1]"));
    }
    for (size_t i = static_cast<size_t>(n) * c.pixels();
         i < static_cast<size_t>(n + 1) * c.pixels(); ++i) {
      x_t[i] = (1.0f - t) * b.images[i] + t * b.noise[i];
      neg_v[i] = b.images[i] - b.noise[i];  // -(ε - x0)
    }
  }
  if (absl::Status s = Run(x_t, b.t, in, b.N, out); !s.ok()) return s;
  loss_sum_ = 0;
  if (!last_stage()) return absl::OkStatus();
  // err = v̂ - v, in patch rows (the loss sums over every pixel alike).
  Buffer<float> target(ops_->backend()), rows(ops_->backend());
  target.CopyFromHost(neg_v.data(), want);
  rows.resize(want);
  ops_->patchify(rows.data(), target.data(), b.N, c.denoiser.tile_size, c.denoiser.patch);
  ops_->add(err_.data(), rows.data(), static_cast<int64_t>(want));
  loss_sum_ = ops_->sum_of_squares(err_.data(), static_cast<int64_t>(want)) / c.pixels();
  return absl::OkStatus();
}

absl::Status Generator::Backward(float grad_scale, float* dcond) {
  LOOM_CHECK(first_stage() && last_stage()) << "Generator::Backward of one stage: BackwardStage";
  return BackwardStage(grad_scale, nullptr, dcond);
}

absl::Status Generator::BackwardStage(float grad_scale, const float* dout, float* din) {
  const GeneratorConfig& c = config_;
  const int N = N_, D = c.denoiser.dim, Fq = c.time_freqs, Q = c.queries, K = 1 + Q,
            Np = c.denoiser.patches_per_tile(), PD = c.denoiser.patch_dim();
  LOOM_CHECK(N > 0) << "Generator::Backward without a Forward";
  Buffer<float> dpred(ops_->backend()), dy(ops_->backend()), dprefix(ops_->backend()),
      dtemb(ops_->backend()), dcp(ops_->backend()), dtg(ops_->backend()), dth(ops_->backend());
  if (last_stage()) {
    // d(Σ err² / pixels) = 2 err / pixels.
    dpred.CopyFrom(err_);
    ops_->scale(dpred.data(), 2.0f * grad_scale / c.pixels(), static_cast<int64_t>(dpred.size()));
    dy.Zeros(static_cast<size_t>(N) * Np * D);
    ops_->linear_backward(dy.data(), params_.grad(head_w_), params_.grad(head_b_), dpred.data(),
                          y_.data(), params_.weight(head_w_), N * Np, D, PD);
    dout = dy.data();
  }
  if (!first_stage()) return vit_.Backward(dout, din);
  float* dcond = din;
  dprefix.Zeros(static_cast<size_t>(N) * K * D);
  if (absl::Status s = vit_.Backward(dout, nullptr, dprefix.data()); !s.ok()) return s;
  dtemb.resize(static_cast<size_t>(N) * D);
  dcp.resize(static_cast<size_t>(N) * Q * D);
  for (int n = 0; n < N; ++n) {
    const float* p = dprefix.data() + static_cast<size_t>(n) * K * D;
    ops_->copy(dtemb.data() + static_cast<size_t>(n) * D, p, D);
    ops_->copy(dcp.data() + static_cast<size_t>(n) * Q * D, p + D, static_cast<int64_t>(Q) * D);
  }
  if (!params_.frozen()) {  // the timestep MLP has no input to hand a gradient to
    dtg.Zeros(static_cast<size_t>(N) * D);
    ops_->linear_backward(dtg.data(), params_.grad(t2_w_), params_.grad(t2_b_), dtemb.data(),
                          tg_.data(), params_.weight(t2_w_), N, D, D);
    dth.Zeros(dtg.size());
    ops_->activation_backward(c.denoiser.act, dth.data(), th_.data(), dtg.data(),
                              static_cast<int64_t>(N) * D);
    ops_->linear_backward(nullptr, params_.grad(t1_w_), params_.grad(t1_b_), dth.data(),
                          freqs_.data(), params_.weight(t1_w_), N, Fq, D);
  }
  ops_->linear_backward(dcond, params_.grad(c_w_), params_.grad(c_b_), dcp.data(), cond_.data(),
                        params_.weight(c_w_), N * Q, c.cond_dim, D);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Generator::Velocity(const std::vector<float>& x_t,
                                                       const std::vector<float>& t,
                                                       const float* cond, int N) {
  const GeneratorConfig& c = config_;
  if (N < 1 || x_t.size() != static_cast<size_t>(N) * c.pixels() ||
      t.size() != static_cast<size_t>(N)) {
    return absl::InvalidArgumentError(absl::StrCat("generator velocity of ", N,
                                                   " images: ", x_t.size(), " pixels and ",
                                                   t.size(), " timesteps"));
  }
  LOOM_CHECK(first_stage() && last_stage()) << "Generator::Velocity of one stage";
  if (absl::Status s = Run(x_t, t, cond, N, nullptr); !s.ok()) return s;
  const std::vector<float> rows = err_.ToHost();
  std::vector<float> v(x_t.size());
  Unpatchify(rows.data(), N, c.denoiser.tile_size, c.denoiser.patch, v.data());
  return v;
}

absl::StatusOr<std::vector<float>> Generator::Sample(const float* cond, int N, int euler_steps,
                                                     uint64_t seed) {
  if (N < 1 || euler_steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("sampling ", N, " images in ", euler_steps,
                                                   " Euler steps: want >= 1 of each"));
  }
  const int pixels = config_.pixels();
  std::vector<float> x;
  for (int n = 0; n < N; ++n) {
    const GenerationDraw d = DrawGeneration(seed, -1, static_cast<uint64_t>(n), 0, pixels);
    x.insert(x.end(), d.noise.begin(), d.noise.end());
  }
  const float dt = 1.0f / static_cast<float>(euler_steps);
  for (int k = 0; k < euler_steps; ++k) {
    const std::vector<float> t(N, 1.0f - static_cast<float>(k) * dt);
    absl::StatusOr<std::vector<float>> v = Velocity(x, t, cond, N);
    if (!v.ok()) return v.status();
    for (size_t i = 0; i < x.size(); ++i) x[i] -= dt * (*v)[i];
  }
  return x;
}

}  // namespace loom
