// One 1F1B schedule over the combined pipeline of both modules: the encoder's
// stages first, then the LLM's, numbered 0 .. S-1 (S = encoder_pp + llm_pp).
// Stage s runs, for m microbatches:
//
//   warm-up   min(m, S - s - 1) forwards
//   steady    one forward, one backward, until every forward ran
//   cool-down the remaining backwards
//
// The last stage alternates from the start; the first waits longest. Every
// microbatch's shapes come from the iteration's assignment, which every rank
// holds, so nothing here exchanges shapes. Worked example, S = 3, m = 4 (F2 =
// forward of microbatch 2, B0 = backward of microbatch 0):
//
//   stage 0: F0 F1 F2 B0 F3 B1 B2 B3        (warm-up 2)
//   stage 1: F0 F1 B0 F2 B1 F3 B2 B3        (warm-up 1)
//   stage 2: F0 B0 F1 B1 F2 B2 F3 B3        (warm-up 0)
//
// With fewer microbatches than stages (m < S) the warm-up is m: all forwards,
// then all backwards (torchtitan #775: a schedule that assumed m >= S hung).
#ifndef LOOM_RUNTIME_PARALLEL_PIPELINE_SCHEDULE_H_
#define LOOM_RUNTIME_PARALLEL_PIPELINE_SCHEDULE_H_

#include <string>
#include <vector>

namespace loom::parallel {

struct PipelineOp {
  enum Kind { kForward, kBackward };
  Kind kind = kForward;
  int microbatch = 0;
  bool operator==(const PipelineOp& o) const {
    return kind == o.kind && microbatch == o.microbatch;
  }
};

// The order stage `stage` (0 <= stage < stages) runs its 2m operations in.
// Requires stages >= 1, m >= 1 (checked).
std::vector<PipelineOp> OneFOneBSchedule(int stages, int stage, int m);

// The global stage of a module's stage: encoder stages come first.
inline int GlobalStage(bool encoder, int stage, int encoder_pp) {
  return encoder ? stage : encoder_pp + stage;
}

// Where a module's `layers` split into `stages` contiguous stages (1 <=
// stages <= layers, checked): stage s holds [bounds[s], bounds[s+1]). The
// split minimises the largest stage's cost, each layer costing 1, the first
// stage `first_extra` more and the last `last_extra` more (its embeddings,
// its head and loss, in layers); each stage holds at least one layer, and of
// equal splits the one with later stages larger wins.
std::vector<int> SplitLayers(int layers, int stages, double first_extra, double last_extra);

// "F0 F1 B0 ..." (for tests and logs).
std::string FormatSchedule(const std::vector<PipelineOp>& ops);

}  // namespace loom::parallel

#endif  // LOOM_RUNTIME_PARALLEL_PIPELINE_SCHEDULE_H_
