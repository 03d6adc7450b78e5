// Timelines a person can open in Perfetto (ui.perfetto.dev) or
// chrome://tracing: `loom up --trace FILE`.
//
// While a job runs, each worker appends one line per iteration to
// DIR/<role>-<rank>.jsonl (its forwards, backwards, recomputes, sends,
// receive waits, allreduces and optimizer step, on its own track of pid 1,
// "measured"), and loom-scheduler appends each iteration's simulated
// timeline to DIR/predicted.jsonl (pid 2, one track per module replica and
// stage, times from the iteration's start). MergeTrace joins them into one
// trace file, each predicted iteration starting where the measured one
// started (its earliest measured event), so the two lie side by side.
#ifndef LOOM_RUNTIME_BASE_TRACE_H_
#define LOOM_RUNTIME_BASE_TRACE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "loom/trace/v1/trace.pb.h"

namespace loom::trace {

inline constexpr int kMeasuredPid = 1;
inline constexpr int kPredictedPid = 2;

// Tracks: a worker's own (measured), and a module replica's pipeline stage
// as the simulator predicts it; the encoder's first.
inline int WorkerTrack(bool encoder, int rank) { return (encoder ? 0 : 1000000) + rank; }
inline int GeneratorTrack(int rank) { return 100000000 + rank; }
inline int StageTrack(bool encoder, int dp, int stage) {
  return (encoder ? 0 : 1000000) + dp * 1000 + stage;
}

// Microseconds since the Unix epoch: processes on one machine line up (on
// several, as well as their clocks agree).
double NowMicros();

// A complete event ("X") from `start_us` to now, with args["iteration"].
v1::TraceEvent* AddSpan(v1::TraceFile* file, const std::string& name, const std::string& cat,
                        int pid, int tid, double start_us, double end_us, int64_t iteration);

// A track's name (a "thread_name" metadata event).
void NameTrack(v1::TraceFile* file, int pid, int tid, const std::string& name);

// Appends `file` as one JSON line to `path` (created if absent).
absl::Status AppendLine(const std::string& path, const v1::TraceFile& file);

// Joins every *.jsonl under `dir` into the trace file `out` (see above).
// DATA_LOSS naming the file and line for a line that is not a TraceFile.
absl::Status MergeTrace(const std::string& dir, const std::string& out);

// One iteration of a merged trace, measured (pid 1) beside predicted (pid
// 2), over the compute spans (forward, backward, recompute): seconds from
// the iteration's measured start (its earliest measured event) to the last
// span's end, the idle share of the tracks' spans (each track from its first
// span's start to its last's end), and each track's busy seconds.
struct IterationFigures {
  int64_t iteration = 0;
  double measured_seconds = 0, predicted_seconds = 0;
  double measured_bubble = 0, predicted_bubble = 0;
  std::map<int, double> measured_busy, predicted_busy;  // tid -> seconds
};

// The iterations that have both measured and predicted compute spans, in
// order.
std::vector<IterationFigures> TraceIterations(const v1::TraceFile& merged);

}  // namespace loom::trace

#endif  // LOOM_RUNTIME_BASE_TRACE_H_
