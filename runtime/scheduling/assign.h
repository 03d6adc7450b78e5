// Per-iteration microbatch assignment: every sample of one global batch goes
// to a bin (LLM DP rank, microbatch) and every bin to an encoder rank; each
// LLM rank's microbatches are put in the order it runs them.
//
// Every sample loads each module (its images the encoder, its packed length
// the LLM, its output images the generator, in a model with one), so a bin
// has three costs (the generator's 0 without one). Costs are times on each
// module's own ranks, in one unit (the scheduler's: seconds), and a
// microbatch slot lasts as long as the slowest module's bin, so modules are
// compared in the units given: the objective of `greedy`, `ilp` and `loom`
// is the largest bin of any module, max over bins of max(encoder, LLM,
// generator). Without a generator every algorithm places samples exactly as
// it did for two modules.
//
// Algorithms (all deterministic; every LLM rank gets `microbatches` bins, every
// bin at least one sample):
//
//   sequential  Megatron-style: the batch in arrival order, cut into equal
//               counts; rank r takes the r-th contiguous slice.
//   lpt         DistTrain's intra-microbatch reordering: samples by
//               decreasing size, each to the least loaded bin. DistTrain
//               sorts by image size because its LLM sequences are packed to a
//               fixed length; here the LLM load varies too, so the size is the
//               sum of the modules' costs in mean-bin units.
//   disttrain   lpt plus DistTrain's inter-microbatch order for 1F1B: on
//               each rank the smallest microbatch first, the p-1 next
//               smallest last (the drain), and between them each position
//               takes the remaining microbatch closest in size to the one it
//               runs beside in the steady state (best fit).
//   entrain     Entrain's hierarchy: balance the encoder first (image samples
//               by decreasing encoder cost to the least encoder-loaded bin),
//               then the LLM (text-only samples to the least LLM-loaded bin),
//               then walk the bins in execution order deferring each bin's
//               LLM load above the mean to a later bin with room, without
//               raising the encoder's maximum. (The paper's two modules:
//               the generator's load is not looked at.)
//   greedy      the plain vector greedy, a baseline: samples by decreasing
//               max(encoder, LLM, generator) cost, each to the bin whose
//               resulting max of the three is least.
//   ilp         DFLOP's exact formulation: minimise C with every bin's cost
//               of every module <= C, every sample in one bin, every bin
//               non-empty; COIN-OR CBC under a time limit, started from
//               the loom solution. The quality reference; not deterministic
//               when the time limit cuts the search.
//   loom        ours: the best of the cheap heuristics above (sequential, lpt,
//               entrain, greedy, and a vector greedy that breaks ties towards
//               even loads), then a local search that moves or swaps samples
//               out of the most loaded bin while that lowers it without making
//               another bin as loaded, so it is never worse than any of them;
//               bins go to ranks so that rank totals balance, in DistTrain's
//               1F1B order; each microbatch slot's bins go to the encoder
//               ranks (and the generator ranks) with the least accumulated
//               load.
#ifndef LOOM_RUNTIME_SCHEDULING_ASSIGN_H_
#define LOOM_RUNTIME_SCHEDULING_ASSIGN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::sched {

// Costs of one sample, in seconds of forward + backward on one rank of each
// module; `transfer` is the time its embeddings take from encoder to LLM.
struct SampleLoad {
  double encoder = 0;
  double llm = 0;
  double transfer = 0;
  // What the token caps count (AssignOptions): the ViT's tokens (tiles x
  // patches per tile) and the packed LLM length.
  int64_t encoder_tokens = 0;
  int64_t llm_tokens = 0;
  // The generator's seconds for the sample's output images (CostModel::
  // Loads; 0 without a generator).
  double generator = 0;
};

struct AssignOptions {
  int llm_dp = 1;
  int microbatches = 1;  // per LLM rank
  int encoder_dp = 1;
  int generator_dp = 1;    // the generator's replicas (a model with one)
  int pipeline_depth = 2;  // encoder stages + LLM stages (the p of 1F1B)
  double ilp_time_limit_seconds = 10;
  int64_t ilp_max_variables = 400000;  // samples * bins above which `ilp` refuses
  // Token caps per bin (job parallel.encoder_max_tokens, llm_max_tokens; 0:
  // none): whatever the algorithm, no bin ends with more of a module's
  // tokens than its cap. A repair pass after the algorithm moves samples out
  // of a bin over a cap, each to the bin with room whose cost stays least.
  int64_t encoder_max_tokens = 0;
  int64_t llm_max_tokens = 0;
};

struct BinAssignment {
  int llm_rank = 0;
  int microbatch = 0;
  int encoder_rank = 0;
  int generator_rank = 0;    // the generator replica that draws its output images
  std::vector<int> samples;  // indices into the batch
  double encoder = 0;
  double llm = 0;
  double transfer = 0;
  double generator = 0;
};

struct AssignResult {
  std::vector<BinAssignment> bins;  // by llm_rank, then microbatch
  double ilp_bound = 0;             // ilp: proven lower bound on the largest bin
  bool ilp_optimal = false;
};

const std::vector<std::string>& AlgorithmNames();

// INVALID_ARGUMENT: an unknown algorithm (naming the known ones), a degree
// below 1, fewer samples than bins, a negative or non-finite cost, a sample
// over a token cap (naming the sample). RESOURCE_EXHAUSTED: `ilp` on a
// problem above ilp_max_variables; a batch whose bins cannot all be brought
// under the token caps (naming the cap and the batch's tokens).
absl::StatusOr<AssignResult> Assign(const std::vector<SampleLoad>& samples,
                                    const AssignOptions& options, const std::string& algorithm);

struct ModuleQuality {
  double max_over_lower_bound = 0;  // max bin / max(mean bin, largest sample)
  double cv = 0;                    // stddev / mean of the bin costs
};

struct AssignmentQuality {
  ModuleQuality encoder, llm, generator;  // generator: zeros without one
  double largest_bin = 0;                 // max over bins of any module's cost, in the costs' units
  double lower_bound = 0;                 // max(each module's mean bin, the largest sample cost)
  double objective = 0;                   // largest_bin / the largest module's mean bin
};

AssignmentQuality MeasureAssignment(const std::vector<SampleLoad>& samples,
                                    const AssignResult& result);

}  // namespace loom::sched

#endif  // LOOM_RUNTIME_SCHEDULING_ASSIGN_H_
