#include "runtime/scheduling/assign.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/testing/tolerances.h"
#include "runtime/base/rng.h"

namespace loom::sched {
namespace {

std::vector<SampleLoad> LlmOnly(const std::vector<double>& llm) {
  std::vector<SampleLoad> s;
  for (double l : llm) s.push_back({0, l, 0});
  return s;
}

AssignResult RunAlgorithm(const std::vector<SampleLoad>& samples, const AssignOptions& o,
                          const std::string& algorithm) {
  absl::StatusOr<AssignResult> r = Assign(samples, o, algorithm);
  EXPECT_TRUE(r.ok()) << algorithm << ": " << r.status();
  return r.ok() ? *r : AssignResult{};
}

double Objective(const std::vector<SampleLoad>& s, const AssignOptions& o, const std::string& a) {
  return MeasureAssignment(s, RunAlgorithm(s, o, a)).objective;
}

AssignOptions Bins(int dp, int m, int enc = 1) {
  AssignOptions o;
  o.llm_dp = dp;
  o.microbatches = m;
  o.encoder_dp = enc;
  o.ilp_time_limit_seconds = 20;
  return o;
}

// {5,4,3,3,2,1} in 3 bins: {5,1} {4,2} {3,3} is perfect; arrival order is not.
TEST(AssignTest, KnownOptimumOneModule) {
  const auto s = LlmOnly({5, 4, 3, 3, 2, 1});
  const AssignOptions o = Bins(1, 3);
  EXPECT_NEAR(Objective(s, o, "loom"), 1.0, testing::ClosedFormF64(1.0));
  EXPECT_NEAR(Objective(s, o, "ilp"), 1.0, testing::Allowed(testing::kIlpSolver, 1.0));
  EXPECT_NEAR(Objective(s, o, "sequential"), 9.0 / 6.0,
              testing::ClosedFormF64(9.0 / 6.0));  // {5,4} {3,3} {2,1}
  AssignResult ilp = RunAlgorithm(s, o, "ilp");
  EXPECT_TRUE(ilp.ilp_optimal);
  EXPECT_NEAR(ilp.ilp_bound, 6.0,
              testing::Allowed(testing::kIlpSolver, 6.0));  // in the costs' units: the mean bin
}

// LPT's greedy is not optimal on {3,3,2,2,2} in 2 bins (it makes 7/5 against
// the optimum {3,3} {2,2,2} = 6/6); loom's search and the ILP find it.
TEST(AssignTest, LptMissesAnOptimumThatLoomFinds) {
  const auto s = LlmOnly({3, 3, 2, 2, 2});
  const AssignOptions o = Bins(2, 1);
  EXPECT_NEAR(Objective(s, o, "lpt"), 7.0 / 6.0, testing::ClosedFormF64(7.0 / 6.0));
  EXPECT_NEAR(Objective(s, o, "loom"), 1.0, testing::ClosedFormF64(1.0));
  EXPECT_NEAR(Objective(s, o, "ilp"), 1.0, testing::Allowed(testing::kIlpSolver, 1.0));
}

// Encoder-heavy and LLM-heavy samples: each bin must get one of each. A
// single combined key cannot see that; the vector packing does.
TEST(AssignTest, BalancesBothModulesAtOnce) {
  const std::vector<SampleLoad> s = {{2, 0, 0}, {0, 2, 0}, {2, 0, 0}, {0, 2, 0}};
  const AssignOptions o = Bins(2, 1);
  EXPECT_NEAR(Objective(s, o, "lpt"), 2.0, testing::ClosedFormF64(2.0));
  EXPECT_NEAR(Objective(s, o, "loom"), 1.0, testing::ClosedFormF64(1.0));
  EXPECT_NEAR(Objective(s, o, "ilp"), 1.0, testing::Allowed(testing::kIlpSolver, 1.0));
  EXPECT_NEAR(Objective(s, o, "entrain"), 1.0,
              testing::ClosedFormF64(1.0));  // encoder first, then text
}

// One sample larger than a mean bin: the lower bound is that sample.
TEST(AssignTest, GiantSampleSetsTheLowerBound) {
  const auto s = LlmOnly({10, 1, 1, 1});
  AssignResult r = RunAlgorithm(s, Bins(2, 1), "loom");
  AssignmentQuality q = MeasureAssignment(s, r);
  EXPECT_NEAR(q.llm.max_over_lower_bound, 1.0, testing::ClosedFormF64(1.0));
  ASSERT_EQ(r.bins.size(), 2u);
}

// DistTrain's 1F1B order: the smallest first, the p-1 next smallest last.
TEST(AssignTest, DistTrainOrdersSmallestFirstAndDrainLast) {
  // 8 samples in 4 microbatches of one rank; LPT pairs them as equal-ish bins
  // so use one sample per bin to see the order directly.
  const auto s = LlmOnly({8, 1, 6, 3, 5, 2, 7, 4});
  AssignOptions o = Bins(1, 8);
  o.pipeline_depth = 3;
  AssignResult r = RunAlgorithm(s, o, "disttrain");
  std::vector<double> order;
  for (const BinAssignment& b : r.bins) order.push_back(b.llm);
  ASSERT_EQ(order.size(), 8u);
  EXPECT_EQ(order.front(), 1);
  EXPECT_EQ(order[6], 3);  // drain: the 2 next smallest, larger first
  EXPECT_EQ(order[7], 2);
}

TEST(AssignTest, RejectsBadInput) {
  const auto s = LlmOnly({1, 2, 3});
  EXPECT_EQ(Assign(s, Bins(2, 2), "loom").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Assign(s, Bins(1, 1), "best").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Assign(s, Bins(0, 1), "loom").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Assign(LlmOnly({1, -2}), Bins(1, 1), "lpt").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Assign(LlmOnly({1, NAN}), Bins(1, 1), "lpt").status().code(),
            absl::StatusCode::kInvalidArgument);
  AssignOptions small = Bins(2, 2);
  small.ilp_max_variables = 10;
  EXPECT_EQ(Assign(LlmOnly({1, 2, 3, 4, 5, 6}), small, "ilp").status().code(),
            absl::StatusCode::kResourceExhausted);
}

// Onevision-like batch: 20% text-only, some huge image samples.
std::vector<SampleLoad> RandomBatch(uint64_t seed, int n) {
  Rng rng(seed);
  std::vector<SampleLoad> s(n);
  for (SampleLoad& x : s) {
    const double tiles = rng.Bernoulli(0.2) ? 0 : std::round(rng.LogNormal(4, 0.9, 1, 40));
    const double len = tiles * 144 + rng.LogNormal(120, 0.7, 10, 1000);
    x.encoder = tiles * 1e-3;
    x.llm = len * 2e-6 + len * len * 1e-10;
    x.transfer = tiles * 1e-5;
  }
  return s;
}

void CheckValid(const std::vector<SampleLoad>& s, const AssignOptions& o, const AssignResult& r,
                const std::string& algorithm) {
  SCOPED_TRACE(algorithm);
  ASSERT_EQ(r.bins.size(), static_cast<size_t>(o.llm_dp * o.microbatches));
  std::vector<int> seen(s.size(), 0);
  for (size_t k = 0; k < r.bins.size(); ++k) {
    const BinAssignment& b = r.bins[k];
    EXPECT_EQ(b.llm_rank, static_cast<int>(k) / o.microbatches);
    EXPECT_EQ(b.microbatch, static_cast<int>(k) % o.microbatches);
    EXPECT_GE(b.encoder_rank, 0);
    EXPECT_LT(b.encoder_rank, o.encoder_dp);
    EXPECT_GE(b.generator_rank, 0);
    EXPECT_LT(b.generator_rank, o.generator_dp);
    EXPECT_FALSE(b.samples.empty());
    double e = 0, l = 0, g = 0;
    for (int i : b.samples) {
      ++seen[i];
      e += s[i].encoder;
      l += s[i].llm;
      g += s[i].generator;
    }
    EXPECT_NEAR(b.encoder, e, testing::ClosedFormF64(e));
    EXPECT_NEAR(b.llm, l, testing::ClosedFormF64(l));
    EXPECT_NEAR(b.generator, g, testing::ClosedFormF64(g));
  }
  for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(seen[i], 1) << "sample " << i;
}

TEST(AssignTest, PropertiesOnRandomBatches) {
  const std::vector<AssignOptions> shapes = {Bins(2, 4, 2), Bins(4, 8, 3), Bins(8, 4, 16),
                                             Bins(1, 1, 1)};
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    for (const AssignOptions& o : shapes) {
      const auto s = RandomBatch(seed, 40 + static_cast<int>(seed) * 50);
      std::map<std::string, double> objective;
      for (const std::string& a : AlgorithmNames()) {
        if (a == "ilp") continue;  // a time limit makes it non-deterministic
        AssignResult r1 = RunAlgorithm(s, o, a), r2 = RunAlgorithm(s, o, a);
        CheckValid(s, o, r1, a);
        ASSERT_EQ(r1.bins.size(), r2.bins.size());
        for (size_t k = 0; k < r1.bins.size(); ++k) {
          EXPECT_EQ(r1.bins[k].samples, r2.bins[k].samples) << a << " is not deterministic";
          EXPECT_EQ(r1.bins[k].encoder_rank, r2.bins[k].encoder_rank) << a;
        }
        objective[a] = MeasureAssignment(s, r1).objective;
      }
      for (const char* a : {"sequential", "lpt", "disttrain", "entrain"}) {
        EXPECT_LE(objective["loom"],
                  objective[a] + testing::Allowed(testing::kSameSumOtherOrderF64, objective[a]))
            << "seed " << seed << ", " << o.llm_dp << "x" << o.microbatches << ": loom vs " << a;
      }
    }
  }
}

// The generator as a third module: two image samples (encoder 2, LLM 2)
// and two text → image samples (LLM 1, generator 4) in two bins. Arrival
// order puts both pictures in one bin (generator 8: twice the mean bin);
// balancing three loads puts one of each in each bin (1.0), and the two
// bins' pictures go to the two generator replicas.
TEST(AssignTest, BalancesTheGeneratorAsAThirdModule) {
  std::vector<SampleLoad> s = {{2, 2, 0}, {2, 2, 0}, {0, 1, 0}, {0, 1, 0}};
  s[2].generator = s[3].generator = 4;
  AssignOptions o = Bins(2, 1);
  o.generator_dp = 2;
  EXPECT_NEAR(Objective(s, o, "sequential"), 2.0, testing::ClosedFormF64(2.0));
  for (const char* a : {"greedy", "lpt", "loom"}) {
    EXPECT_NEAR(Objective(s, o, a), 1.0, testing::ClosedFormF64(1.0)) << a;
  }
  EXPECT_NEAR(Objective(s, o, "ilp"), 1.0, testing::Allowed(testing::kIlpSolver, 1.0));
  const AssignResult r = RunAlgorithm(s, o, "loom");
  CheckValid(s, o, r, "loom");
  EXPECT_NE(r.bins[0].generator_rank, r.bins[1].generator_rank);
  const AssignmentQuality q = MeasureAssignment(s, r);
  EXPECT_NEAR(q.generator.max_over_lower_bound, 1.0, testing::ClosedFormF64(1.0));
  EXPECT_NEAR(q.largest_bin, 4.0, testing::ClosedFormF64(4.0));
  // A negative generator cost is refused like any other.
  s[3].generator = -1;
  EXPECT_EQ(Assign(s, o, "loom").status().code(), absl::StatusCode::kInvalidArgument);
  o.generator_dp = 0;
  s[3].generator = 4;
  EXPECT_EQ(Assign(s, o, "loom").status().code(), absl::StatusCode::kInvalidArgument);
}

// Random batches where 20% of the samples draw an output image: every
// algorithm's assignment is valid (generator ranks included) and loom's
// largest bin, over all three modules, is no worse than any heuristic's.
TEST(AssignTest, LoomIsNeverWorseWithAGenerator) {
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    std::vector<SampleLoad> s = RandomBatch(seed, 300);
    Rng rng(seed + 100);
    for (SampleLoad& x : s) {
      if (rng.Bernoulli(0.2)) x.generator = rng.LogNormal(0.02, 0.3, 0.005, 0.1);
    }
    for (const AssignOptions& shape : {Bins(4, 8, 2), Bins(8, 4, 4)}) {
      AssignOptions o = shape;
      o.generator_dp = 3;
      std::map<std::string, double> largest;
      for (const std::string& a : AlgorithmNames()) {
        if (a == "ilp") continue;
        const AssignResult r = RunAlgorithm(s, o, a);
        CheckValid(s, o, r, a);
        largest[a] = MeasureAssignment(s, r).largest_bin;
      }
      const double loom = largest["loom"] / (1 + testing::kSameSumOtherOrderF64.rtol);
      for (const auto& [a, v] : largest) EXPECT_LE(loom, v) << "seed " << seed << " vs " << a;
      EXPECT_LT(largest["loom"], largest["sequential"]) << "seed " << seed;
    }
  }
}

// Token caps (parallel.encoder_max_tokens, llm_max_tokens): every
// algorithm, ilp included, leaves no bin over either cap, the assignment
// stays valid (every sample once, no empty bin), and a cap the batch cannot
// meet, or a sample over a cap, is refused naming it.
TEST(AssignTest, NoBinExceedsTheTokenCaps) {
  auto tokens = [](std::vector<SampleLoad> s) {
    for (SampleLoad& x : s) {
      x.encoder_tokens = static_cast<int64_t>(std::lround(x.encoder / 1e-3)) * 144;
      x.llm_tokens = x.encoder_tokens + static_cast<int64_t>(x.llm / 2e-6 / 2);
    }
    return s;
  };
  const std::vector<SampleLoad> s = tokens(RandomBatch(3, 120));
  int64_t enc = 0, llm = 0, big_e = 0, big_l = 0;
  for (const SampleLoad& x : s) {
    enc += x.encoder_tokens;
    llm += x.llm_tokens;
    big_e = std::max(big_e, x.encoder_tokens);
    big_l = std::max(big_l, x.llm_tokens);
  }
  AssignOptions o = Bins(2, 4, 2);
  o.ilp_time_limit_seconds = 2;
  // 30% above the mean bin, and no smaller than the largest sample: tight
  // enough that the algorithms' bins break it before the repair.
  o.encoder_max_tokens = std::max(big_e, enc * 13 / 10 / 8);
  o.llm_max_tokens = std::max(big_l, llm * 13 / 10 / 8);
  int repaired = 0;
  for (const std::string& a : AlgorithmNames()) {
    AssignOptions uncapped = o;
    uncapped.encoder_max_tokens = uncapped.llm_max_tokens = 0;
    const AssignResult before = RunAlgorithm(s, uncapped, a), r = RunAlgorithm(s, o, a);
    CheckValid(s, o, r, a);
    bool was_over = false;
    for (const BinAssignment& b : before.bins) {
      int64_t te = 0, tl = 0;
      for (int i : b.samples) te += s[i].encoder_tokens, tl += s[i].llm_tokens;
      was_over |= te > o.encoder_max_tokens || tl > o.llm_max_tokens;
    }
    repaired += was_over;
    for (const BinAssignment& b : r.bins) {
      int64_t te = 0, tl = 0;
      for (int i : b.samples) te += s[i].encoder_tokens, tl += s[i].llm_tokens;
      EXPECT_LE(te, o.encoder_max_tokens) << a;
      EXPECT_LE(tl, o.llm_max_tokens) << a;
    }
  }
  EXPECT_GT(repaired, 0) << "no algorithm broke the caps: the test checks no repair";
  // Below the mean bin the batch cannot fit.
  AssignOptions tight = o;
  tight.llm_max_tokens = std::max(big_l, llm / 8 * 9 / 10);
  absl::StatusOr<AssignResult> r = Assign(s, tight, "loom");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(r.status().message().find("llm_max_tokens"), absl::string_view::npos) << r.status();
  // A sample over a cap is named.
  AssignOptions small = o;
  small.encoder_max_tokens = big_e - 1;
  r = Assign(s, small, "lpt");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("over_token_cap"), absl::string_view::npos) << r.status();
}

TEST(AssignTest, IlpIsValidAndNoWorseThanItsStart) {
  const auto s = RandomBatch(7, 60);
  const AssignOptions o = Bins(2, 3, 2);
  AssignResult r = RunAlgorithm(s, o, "ilp");
  CheckValid(s, o, r, "ilp");
  const AssignmentQuality q = MeasureAssignment(s, r);
  const double loom = Objective(s, o, "loom");  // the ILP starts from loom's answer
  EXPECT_LE(q.objective, loom + testing::Allowed(testing::kIlpSolver, loom));
  EXPECT_LE(r.ilp_bound, q.largest_bin + testing::Allowed(testing::kIlpSolver, q.largest_bin));
  EXPECT_GE(r.ilp_bound, q.lower_bound - testing::Allowed(testing::kIlpSolver, q.lower_bound))
      << "no split beats the mean";
}

// Batches of the kinds people train on, with costs in one time unit (each
// module's time on its own ranks) and the encoder's total a given share of
// the LLM's.
enum class Mix { kDocument, kVideo, kTextHeavy, kOnevision, kMixture };

std::vector<SampleLoad> Distribution(Mix mix, uint64_t seed, int n, double encoder_share) {
  Rng rng(seed);
  std::vector<SampleLoad> s(n);
  for (SampleLoad& x : s) {
    Mix kind = mix;
    if (mix == Mix::kMixture) kind = static_cast<Mix>(rng.UniformInt(0, 3));
    double tiles = 0, text = 0;
    switch (kind) {
      case Mix::kDocument:  // one page image of 1-12 tiles, a short question and answer
        tiles = static_cast<double>(rng.UniformInt(1, 12));
        text = rng.LogNormal(60, 0.6, 8, 600);
        break;
      case Mix::kVideo:  // 8-64 frames, a caption
        tiles = static_cast<double>(rng.UniformInt(8, 64));
        text = rng.LogNormal(100, 0.5, 10, 800);
        break;
      case Mix::kTextHeavy:  // mostly long text-only samples, a few small images
        tiles = rng.Bernoulli(0.6) ? 0 : static_cast<double>(rng.UniformInt(1, 4));
        text = rng.LogNormal(700, 0.9, 20, 8192);
        break;
      default:  // onevision-like: 20% text-only, a heavy tail of tiles
        tiles = rng.Bernoulli(0.2) ? 0 : std::round(rng.LogNormal(4, 0.9, 1, 40));
        text = rng.LogNormal(120, 0.7, 10, 1000);
        break;
    }
    const double len = tiles * 64 + text;  // 64 image tokens per tile after the projector
    x.encoder = tiles;
    x.llm = len + len * len / 4096;  // a*L + b*L^2
    x.transfer = tiles * 1e-3;
  }
  double te = 0, tl = 0;
  for (const SampleLoad& x : s) {
    te += x.encoder;
    tl += x.llm;
  }
  for (SampleLoad& x : s) {
    x.encoder *= te > 0 ? encoder_share * tl / te : 0;
    x.llm *= 1e-3;  // milliseconds
    x.encoder *= 1e-3;
  }
  return s;
}

// The plain 2-D greedy, written here from its definition as the reference
// the shipped algorithms are held to: samples by decreasing max(encoder, LLM)
// cost (ties: lower index), each to the bin whose resulting max(encoder, LLM)
// is least (ties: lower bin). Returns its largest bin.
double PlainGreedyLargestBin(const std::vector<SampleLoad>& s, int bins) {
  std::vector<int> order(s.size());
  for (size_t i = 0; i < s.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return std::max(s[a].encoder, s[a].llm) > std::max(s[b].encoder, s[b].llm);
  });
  std::vector<double> e(bins, 0), l(bins, 0);
  for (int i : order) {
    int best = 0;
    for (int g = 1; g < bins; ++g) {
      if (std::max(e[g] + s[i].encoder, l[g] + s[i].llm) <
          std::max(e[best] + s[i].encoder, l[best] + s[i].llm)) {
        best = g;
      }
    }
    e[best] += s[i].encoder;
    l[best] += s[i].llm;
  }
  double worst = 0;
  for (int g = 0; g < bins; ++g) worst = std::max({worst, e[g], l[g]});
  return worst;
}

// `loom` is never worse than the plain 2-D greedy nor than any other
// algorithm Loom ships (the ILP aside: it starts from loom's answer and only
// improves it), on every batch of every distribution, compared in the units
// the costs are given in; at 4096 samples it is within 1% of the lower bound.
TEST(AssignTest, LoomIsNeverWorseThanAnyHeuristic) {
  const Mix mixes[] = {Mix::kDocument, Mix::kVideo, Mix::kTextHeavy, Mix::kOnevision,
                       Mix::kMixture};
  const char* mix_names[] = {"document", "video", "text-heavy", "onevision", "mixture"};
  struct Shape {
    int samples, llm_dp, microbatches, encoder_dp;
  };
  const Shape shapes[] = {{4096, 8, 8, 8}, {512, 4, 4, 2}, {97, 3, 5, 2}};
  int cases = 0;
  for (int k = 0; k < 5; ++k) {
    for (double share : {0.3, 0.9, 1.0, 1.6}) {
      for (uint64_t seed : {11, 12}) {
        for (const Shape& sh : shapes) {
          const std::vector<SampleLoad> s = Distribution(mixes[k], seed, sh.samples, share);
          const AssignOptions o = Bins(sh.llm_dp, sh.microbatches, sh.encoder_dp);
          SCOPED_TRACE(absl::StrCat(mix_names[k], " encoder share ", share, " seed ", seed, " ",
                                    sh.samples, " samples in ", sh.llm_dp, "x", sh.microbatches));
          std::map<std::string, AssignmentQuality> q;
          for (const std::string& a : AlgorithmNames()) {
            if (a == "ilp") continue;
            AssignResult r = RunAlgorithm(s, o, a);
            CheckValid(s, o, r, a);
            q[a] = MeasureAssignment(s, r);
          }
          // Equal bins may differ by the order their costs were summed in.
          const double loom = q["loom"].largest_bin / (1 + testing::kSameSumOtherOrderF64.rtol);
          for (const auto& [a, quality] : q) {
            EXPECT_LE(loom, quality.largest_bin) << "vs " << a;
          }
          EXPECT_LE(loom, PlainGreedyLargestBin(s, sh.llm_dp * sh.microbatches))
              << "vs the plain 2-D greedy";
          // Within 1% of the lower bound at 4096 samples, except text-heavy:
          // its encoder load sits in ~25 image samples of 1-4 tiles per bin,
          // so one tile is ~1.6% of a bin and the best integral split itself
          // can be that far above the mean the bound is made of.
          if (sh.samples == 4096) {
            EXPECT_LE(loom, (mixes[k] == Mix::kTextHeavy ? 1.02 : 1.01) * q["loom"].lower_bound);
          }
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 5 * 4 * 2 * 3);
}

// Costs in different scales: the module with the larger times decides the
// iteration, so a split that evens the small module at the cost of the large
// one is worse (the old per-module normalisation preferred it).
TEST(AssignTest, ComparesModulesInTheUnitsGiven) {
  // Encoder costs are tiny next to the LLM's: only the LLM's split matters.
  std::vector<SampleLoad> s;
  for (int i = 0; i < 8; ++i) s.push_back({i < 4 ? 1e-3 : 0.0, static_cast<double>(1 + i % 4), 0});
  const AssignOptions o = Bins(2, 1);
  const AssignmentQuality q = MeasureAssignment(s, RunAlgorithm(s, o, "loom"));
  EXPECT_NEAR(q.largest_bin, 10.0,
              testing::ClosedFormF64(10.0));  // LLM 1+2+3+4 = 20 in two bins of 10
  EXPECT_NEAR(q.objective, 1.0, testing::ClosedFormF64(1.0));
}

}  // namespace
}  // namespace loom::sched
