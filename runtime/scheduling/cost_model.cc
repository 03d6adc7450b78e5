#include "runtime/scheduling/cost_model.h"

#include <cmath>
#include <utility>

namespace loom::sched {
namespace {

constexpr double kDecay = 0.99;      // per observation: old timings fade
constexpr double kStageDecay = 0.9;  // per iteration's stage times (one per replica)

// A decaying average of one module's ratio: `old` (0: none yet, `unseen`
// stands in) moves toward `fresh`.
double Blend(double old, double unseen, double fresh) {
  return kStageDecay * (old > 0 ? old : unseen) + (1 - kStageDecay) * fresh;
}
constexpr double kPriorPull = 1e-8;  // ridge toward the prior, relative to the data

// Ridge fit toward `prior`, coefficients kept non-negative (a coefficient
// that comes out negative is pinned to 0 and the rest refitted).
std::array<double, 3> FitNonNegative(const std::array<std::array<double, 3>, 3>& ata,
                                     const std::array<double, 3>& aty, int n,
                                     const std::array<double, 3>& prior) {
  std::array<bool, 3> free{true, true, true};
  std::array<double, 3> theta = prior;
  for (int round = 0; round < n; ++round) {
    std::array<int, 3> idx{};
    int k = 0;
    for (int j = 0; j < n; ++j) {
      if (free[j]) idx[k++] = j;
    }
    std::array<std::array<double, 3>, 3> a{};
    std::array<double, 3> b{}, x{};
    for (int r = 0; r < k; ++r) {
      const int i = idx[r];
      const double ridge = kPriorPull * ata[i][i] + 1e-300;
      for (int c = 0; c < k; ++c) a[r][c] = ata[i][idx[c]];
      a[r][r] += ridge;
      b[r] = aty[i] + ridge * prior[i];
    }
    std::vector<std::vector<double>> av(k, std::vector<double>(k));
    for (int r = 0; r < k; ++r) {
      for (int c = 0; c < k; ++c) av[r][c] = a[r][c];
    }
    std::vector<double> xv;
    if (!SolveLinear(std::move(av), std::vector<double>(b.begin(), b.begin() + k), &xv)) {
      return prior;
    }
    for (int r = 0; r < k; ++r) x[r] = xv[r];
    bool negative = false;
    for (int j = 0; j < n; ++j) theta[j] = 0;
    for (int r = 0; r < k; ++r) {
      theta[idx[r]] = x[r];
      if (x[r] < 0) {
        free[idx[r]] = false;
        negative = true;
      }
    }
    if (!negative) return theta;
  }
  for (double& t : theta) t = std::max(t, 0.0);
  return theta;
}

}  // namespace

namespace {

// Forward passes' worth of FLOPs a module's training costs: the forward, a
// weight-gradient pass if it trains, an input-gradient pass if anything
// before it (or inside it) needs one, and the recomputed forward when it runs
// backward at all. Attention has no weights: its backward is two passes
// whenever the module runs backward.
struct Passes {
  double weights = 1, attention = 1;
};
Passes ModulePasses(bool trains, bool input_grad, bool recompute) {
  if (!trains && !input_grad) return {};  // forward only
  const double r = recompute ? 1 : 0;
  return {1 + (trains ? 1 : 0) + (input_grad ? 1 : 0) + r, 3 + r};
}

}  // namespace

ModelFlops AnalyticFlops(const ModelConfig& c, bool recompute, const Frozen& frozen) {
  ModelFlops f;
  // The ViT's layers pass gradients down whenever it trains; the projector
  // needs its input gradient only for a trainable tower; the LLM always
  // passes gradients down (its own layers or the image embeddings train).
  const Passes vit_p = ModulePasses(!frozen.vision, !frozen.vision, recompute);
  const Passes proj_p = ModulePasses(!frozen.projector, !frozen.vision, recompute);
  const Passes llm_p = ModulePasses(!frozen.llm, true, recompute);
  const double t = c.vit.seq(), d = c.vit.dim, h = c.vit.mlp_hidden;
  double vit = 2 * c.vit.patches_per_tile() * c.vit.patch_dim() * d;  // patch embedding
  vit += c.vit.layers * 2 * t * (4 * d * d + 2 * d * h);              // qkv, out, mlp
  const double vit_attention = c.vit.layers * 4 * t * t * d;          // QK^T and AV, full
  const double tokens = c.tokens_per_tile();
  const double in = c.projector.pixel_shuffle ? 4 * d : d;
  const double projector = 2 * tokens * (in * c.projector.hidden + c.projector.hidden * c.llm.dim);
  f.encoder_per_tile =
      vit_p.weights * vit + vit_p.attention * vit_attention + proj_p.weights * projector;
  const double D = c.llm.dim, V = c.llm.vocab;
  f.llm_per_token =
      llm_p.weights * (c.llm.layers * 2 * static_cast<double>(LlmLayerWeights(c.llm)) + 2 * D * V);
  // QKᵀ and AV over the attention width heads x head_dim.
  f.llm_per_token_sq = llm_p.attention * c.llm.layers * 2.0 * c.llm.heads * c.llm.hd();
  f.embedding_bytes_per_image_token = 2 * D;
  if (c.has_generator()) {
    // The generator trains unless frozen and hands the LLM its conditions'
    // gradient when anything before it trains (MultimodalModel's rule).
    const Passes gen_p = ModulePasses(
        !frozen.generator, !frozen.llm || !frozen.vision || !frozen.projector, recompute);
    const GeneratorConfig& g = c.generator;
    VitConfig den = g.denoiser;
    den.prefix = 1 + g.queries;
    const double gt = den.seq(), gd = den.dim, gh = den.mlp_hidden;
    const double pd = den.patch_dim(), gp = den.patches_per_tile();
    double gen = 2 * gp * pd * gd * 2;       // patch embedding and the patch head
    gen += 2 * g.queries * g.cond_dim * gd;  // the conditions' projection
    gen += den.layers * 2 * gt * (4 * gd * gd + 2 * gd * gh);
    const double gen_attention = den.layers * 4 * gt * gt * gd;
    f.generator_per_image = gen_p.weights * gen + gen_p.attention * gen_attention;
  }
  return f;
}

SampleShape ShapeOf(const scheduler::v1::BatchSample& sample) {
  SampleShape s;
  for (int t : sample.images()) s.tiles += t;
  s.image_tokens = sample.image_tokens();
  s.text_tokens = sample.text_tokens();
  s.output_images = sample.output_images_size();
  s.query_tokens = sample.query_tokens();
  return s;
}

CostModel::CostModel(const scheduler::v1::CostCoefficients& prior)
    : prior_(prior), coefficients_(prior) {}

double CostModel::EncoderSeconds(const SampleShape& s) const {
  if (s.tiles <= 0) return 0;
  return coefficients_.encoder_per_sample() + coefficients_.encoder_per_tile() * s.tiles;
}

double CostModel::GeneratorSeconds(const SampleShape& s) const {
  return coefficients_.generator_per_image() * s.output_images;
}

double CostModel::LlmSeconds(const SampleShape& s) const {
  const double l = s.length();
  return coefficients_.llm_per_sample() + coefficients_.llm_per_token() * l +
         coefficients_.llm_per_token_sq() * l * l;
}

std::vector<SampleLoad> CostModel::Loads(const std::vector<SampleShape>& shapes,
                                         double transfer_seconds_per_image_token) const {
  std::vector<SampleLoad> out;
  out.reserve(shapes.size());
  for (const SampleShape& s : shapes) {
    SampleLoad load{EncoderSeconds(s), LlmSeconds(s),
                    transfer_seconds_per_image_token * s.image_tokens};
    load.generator = GeneratorSeconds(s);
    out.push_back(load);
  }
  return out;
}

bool CostModel::ObserveEncoder(const std::vector<SampleShape>& samples, double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return false;
  std::array<double, 3> x{};
  for (const SampleShape& s : samples) {
    if (s.tiles <= 0) continue;
    x[0] += s.tiles;
    x[1] += 1;
  }
  if (x[1] == 0) return false;  // nothing the encoder ran
  for (int i = 0; i < 2; ++i) {
    encoder_.aty[i] = kDecay * encoder_.aty[i] + x[i] * seconds;
    for (int j = 0; j < 2; ++j) encoder_.ata[i][j] = kDecay * encoder_.ata[i][j] + x[i] * x[j];
  }
  ++observations_;
  Refit();
  return true;
}

bool CostModel::ObserveGenerator(const std::vector<SampleShape>& samples, double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return false;
  double images = 0;
  for (const SampleShape& s : samples) images += s.output_images;
  if (images == 0) return false;  // nothing the generator ran
  generator_.aty[0] = kDecay * generator_.aty[0] + images * seconds;
  generator_.ata[0][0] = kDecay * generator_.ata[0][0] + images * images;
  ++observations_;
  Refit();
  return true;
}

bool CostModel::ObserveLlm(const std::vector<SampleShape>& samples, double seconds) {
  if (!std::isfinite(seconds) || seconds < 0 || samples.empty()) return false;
  std::array<double, 3> x{};
  for (const SampleShape& s : samples) {
    const double l = s.length();
    x[0] += l;
    x[1] += l * l;
    x[2] += 1;
  }
  for (int i = 0; i < 3; ++i) {
    llm_.aty[i] = kDecay * llm_.aty[i] + x[i] * seconds;
    for (int j = 0; j < 3; ++j) llm_.ata[i][j] = kDecay * llm_.ata[i][j] + x[i] * x[j];
  }
  ++observations_;
  Refit();
  return true;
}

void SetStageShares(const ModelConfig& model, int encoder_pp, int llm_pp,
                    scheduler::v1::CostCoefficients* costs) {
  if (costs->encoder_stage_share_size() != encoder_pp) {
    costs->clear_encoder_stage_share();
    for (double x : VitStages(model, encoder_pp).share) costs->add_encoder_stage_share(x);
  }
  if (costs->llm_stage_share_size() != llm_pp) {
    costs->clear_llm_stage_share();
    for (double x : LlmStages(model, llm_pp).share) costs->add_llm_stage_share(x);
  }
}

bool CostModel::ObserveStages(bool encoder, const std::vector<double>& seconds) {
  auto* share = encoder ? coefficients_.mutable_encoder_stage_share()
                        : coefficients_.mutable_llm_stage_share();
  const int n = static_cast<int>(seconds.size());
  if (n < 2 || (share->size() != 0 && share->size() != n)) return false;
  double total = 0;
  for (double s : seconds) {
    if (!std::isfinite(s) || s < 0) return false;
    total += s;
  }
  if (!(total > 0)) return false;
  if (share->size() == 0) share->Resize(n, 1.0 / n);
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    share->Set(i, kStageDecay * share->Get(i) + (1 - kStageDecay) * seconds[i] / total);
    sum += share->Get(i);
  }
  for (int i = 0; i < n; ++i) share->Set(i, share->Get(i) / sum);
  return true;
}

bool CostModel::ObserveForward(bool encoder, double forward, double total) {
  if (!(total > 0) || !std::isfinite(total) || !(forward >= 0) || forward > total) return false;
  if (encoder) {
    coefficients_.set_encoder_forward_share(
        Blend(coefficients_.encoder_forward_share(), 1.0 / 3, forward / total));
  } else {
    coefficients_.set_llm_forward_share(
        Blend(coefficients_.llm_forward_share(), 1.0 / 3, forward / total));
  }
  return true;
}

bool CostModel::ObserveRecompute(bool encoder, double recompute, double first) {
  if (!(first > 0) || !std::isfinite(first) || !(recompute >= 0) || !std::isfinite(recompute)) {
    return false;
  }
  if (encoder) {
    coefficients_.set_encoder_recompute_ratio(
        Blend(coefficients_.encoder_recompute_ratio(), 1.0, recompute / first));
  } else {
    coefficients_.set_llm_recompute_ratio(
        Blend(coefficients_.llm_recompute_ratio(), 1.0, recompute / first));
  }
  return true;
}

void CostModel::Refit() {
  if (encoder_.ata[0][0] > 0) {
    auto t = FitNonNegative(encoder_.ata, encoder_.aty, 2,
                            {prior_.encoder_per_tile(), prior_.encoder_per_sample(), 0});
    coefficients_.set_encoder_per_tile(t[0]);
    coefficients_.set_encoder_per_sample(t[1]);
  }
  if (llm_.ata[0][0] > 0) {
    auto t = FitNonNegative(
        llm_.ata, llm_.aty, 3,
        {prior_.llm_per_token(), prior_.llm_per_token_sq(), prior_.llm_per_sample()});
    coefficients_.set_llm_per_token(t[0]);
    coefficients_.set_llm_per_token_sq(t[1]);
    coefficients_.set_llm_per_sample(t[2]);
  }
  if (generator_.ata[0][0] > 0) {
    coefficients_.set_generator_per_image(std::max(0.0, generator_.aty[0] / generator_.ata[0][0]));
  }
}

bool SolveLinear(std::vector<std::vector<double>> a, std::vector<double> b,
                 std::vector<double>* x) {
  const size_t n = b.size();
  for (size_t c = 0; c < n; ++c) {
    size_t p = c;
    for (size_t r = c + 1; r < n; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[p][c])) p = r;
    }
    if (std::abs(a[p][c]) < 1e-300) return false;
    std::swap(a[c], a[p]);
    std::swap(b[c], b[p]);
    for (size_t r = c + 1; r < n; ++r) {
      const double f = a[r][c] / a[c][c];
      for (size_t k = c; k < n; ++k) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  x->assign(n, 0.0);
  for (size_t r = n; r-- > 0;) {
    double s = b[r];
    for (size_t k = r + 1; k < n; ++k) s -= a[r][k] * (*x)[k];
    (*x)[r] = s / a[r][r];
  }
  return true;
}

}  // namespace loom::sched
