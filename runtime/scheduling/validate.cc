#include "runtime/scheduling/validate.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "runtime/base/json_line.h"
#include "runtime/base/stats.h"
#include "runtime/base/trace.h"
#include "runtime/parallel/grid.h"

namespace loom::sched {
namespace {

class Errors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (text.empty()) text = absl::StrCat("column ", column + 1, ": ", message);
  }
  std::string text;
};

// Worker tracks are trace::WorkerTrack(encoder, rank); predicted ones
// trace::StageTrack(encoder, dp, stage).
constexpr int kLlmTracks = 1000000;

// `s` inside a JSON string.
std::string Escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

absl::Status ApplyLayout(const std::string& layout, job::v1::JobConfig* job) {
  job::v1::ParallelConfig parallel = job->parallel();
  google::protobuf::TextFormat::Parser parser;
  Errors errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.MergeFromString(layout, &parallel)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout \"", layout, "\": not a parallel { } body: ", errors.text));
  }
  *job->mutable_parallel() = parallel;
  return absl::OkStatus();
}

std::vector<std::string> SplitLayouts(const std::string& layouts) {
  std::vector<std::string> out;
  for (absl::string_view l : absl::StrSplit(layouts, ';')) {
    l = absl::StripAsciiWhitespace(l);
    if (!l.empty()) out.emplace_back(l);
  }
  return out;
}

absl::StatusOr<LayoutResult> LayoutFigures(
    const job::v1::JobConfig& job, const trace::v1::TraceFile& trace, const std::string& json_lines,
    const std::vector<std::pair<bool, std::string>>& log_texts, int warmup) {
  const job::v1::ParallelConfig& p = job.parallel();
  const parallel::GridShape grids[2] = {{p.encoder_tp(), p.encoder_pp(), p.encoder_dp()},
                                        {p.llm_tp(), p.llm_pp(), p.llm_dp()}};
  for (const parallel::GridShape& g : grids) {
    if (g.tp < 1 || g.pp < 1 || g.dp < 1) {
      return absl::InvalidArgumentError("layout figures: the job's parallel has a degree below 1");
    }
  }
  LayoutResult r;
  r.ranks = grids[0].size() + grids[1].size();
  std::vector<double> predicted, measured;
  // (module, stage) -> per iteration: the busiest rank's or replica's seconds.
  std::map<std::pair<int, int>, std::vector<double>> stage_measured, stage_predicted;
  for (const trace::IterationFigures& it : trace::TraceIterations(trace)) {
    if (it.iteration < warmup) continue;
    predicted.push_back(it.predicted_seconds);
    measured.push_back(it.measured_seconds);
    std::map<std::pair<int, int>, double> m, q;
    for (const auto& [tid, busy] : it.measured_busy) {
      const int module = tid >= kLlmTracks ? 1 : 0;
      const int rank = tid - module * kLlmTracks;
      if (rank >= grids[module].size()) continue;
      double& s = m[{module, parallel::PositionOf(grids[module], rank).pp}];
      s = std::max(s, busy);
    }
    for (const auto& [tid, busy] : it.predicted_busy) {
      const int module = tid >= kLlmTracks ? 1 : 0;
      double& s = q[{module, (tid - module * kLlmTracks) % 1000}];
      s = std::max(s, busy);
    }
    for (const auto& [key, s] : m) stage_measured[key].push_back(s);
    for (const auto& [key, s] : q) stage_predicted[key].push_back(s);
  }
  if (measured.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("no iteration after the warm-up (", warmup,
                                                      ") has both a measured and a predicted "
                                                      "timeline in the trace"));
  }
  r.iterations = static_cast<int>(measured.size());
  r.predicted_s = Median(predicted);
  r.measured_s = Median(measured);
  for (int module = 0; module < 2; ++module) {
    for (int stage = 0; stage < grids[module].pp; ++stage) {
      StageFigures f;
      f.encoder = module == 0;
      f.stage = stage;
      f.measured_s = Median(stage_measured[{module, stage}]);
      f.predicted_s = Median(stage_predicted[{module, stage}]);
      if (f.measured_s > 0 || f.predicted_s > 0) r.stages.push_back(f);
    }
  }
  std::vector<double> steps;
  for (absl::string_view line : absl::StrSplit(json_lines, '\n', absl::SkipEmpty())) {
    double iteration = 0, seconds = 0;
    if (!absl::StartsWith(line, "{") || !JsonNumberField(line, "iteration", &iteration) ||
        !JsonNumberField(line, "seconds", &seconds) || iteration < warmup) {
      continue;
    }
    steps.push_back(seconds);
  }
  r.step_s = Median(steps);
  for (const auto& [encoder, text] : log_texts) {
    // The worker's last memory record: after its largest microbatch.
    double measured_bytes = -1, predicted_bytes = -1;
    for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
      double m = 0, q = 0;
      if (JsonNumberField(line, "measured_bytes", &m) &&
          JsonNumberField(line, "predicted_bytes", &q)) {
        measured_bytes = m;
        predicted_bytes = q;
      }
    }
    int64_t& mb = encoder ? r.encoder_measured_bytes : r.llm_measured_bytes;
    int64_t& pb = encoder ? r.encoder_predicted_bytes : r.llm_predicted_bytes;
    mb = std::max(mb, static_cast<int64_t>(measured_bytes));
    pb = std::max(pb, static_cast<int64_t>(predicted_bytes));
  }
  return r;
}

std::string LayoutJson(const LayoutResult& r) {
  std::string out = absl::StrCat("{\"layout\":\"", Escaped(r.layout), "\"");
  if (!r.error.empty()) return absl::StrCat(out, ",\"error\":\"", Escaped(r.error), "\"}");
  absl::StrAppend(&out, ",\"predicted_s\":", JsonNumber(r.predicted_s, 6),
                  ",\"measured_s\":", JsonNumber(r.measured_s, 6), ",\"predicted_over_measured\":",
                  JsonNumber(r.measured_s > 0 ? r.predicted_s / r.measured_s : NAN, 4),
                  ",\"step_s\":", JsonNumber(r.step_s, 6), ",\"iterations\":", r.iterations,
                  ",\"stages\":[");
  for (size_t i = 0; i < r.stages.size(); ++i) {
    const StageFigures& s = r.stages[i];
    absl::StrAppend(&out, i ? "," : "", "{\"module\":\"", s.encoder ? "encoder" : "llm",
                    "\",\"stage\":", s.stage, ",\"predicted_s\":", JsonNumber(s.predicted_s, 6),
                    ",\"measured_s\":", JsonNumber(s.measured_s, 6), "}");
  }
  absl::StrAppend(&out, "],\"peak_bytes\":{\"encoder\":{\"predicted\":", r.encoder_predicted_bytes,
                  ",\"measured\":", r.encoder_measured_bytes,
                  "},\"llm\":{\"predicted\":", r.llm_predicted_bytes,
                  ",\"measured\":", r.llm_measured_bytes, "}}");
  absl::StrAppend(&out, ",\"ranks\":", r.ranks, ",\"host_cores\":", r.host_cores);
  if (!r.tp_scaled.empty()) absl::StrAppend(&out, ",\"tp_scaled\":\"", Escaped(r.tp_scaled), "\"");
  return out + "}";
}

std::string RankingJson(const std::vector<LayoutResult>& results) {
  std::vector<const LayoutResult*> ok;
  double worst = 0;
  for (const LayoutResult& r : results) {
    if (!r.error.empty() || r.measured_s <= 0) continue;
    ok.push_back(&r);
    worst = std::max(worst, std::abs(r.predicted_s / r.measured_s - 1));
  }
  auto ranked = [&](double LayoutResult::*by) {
    std::vector<const LayoutResult*> v = ok;
    std::stable_sort(v.begin(), v.end(), [by](const LayoutResult* a, const LayoutResult* b) {
      return a->*by < b->*by;
    });
    std::vector<std::string> names;
    for (const LayoutResult* r : v) names.push_back(absl::StrCat("\"", Escaped(r->layout), "\""));
    return names;
  };
  const std::vector<std::string> p = ranked(&LayoutResult::predicted_s);
  const std::vector<std::string> m = ranked(&LayoutResult::measured_s);
  return absl::StrCat("{\"ranking_predicted\":[", absl::StrJoin(p, ","), "],\"ranking_measured\":[",
                      absl::StrJoin(m, ","),
                      "],\"same_fastest\":", !p.empty() && p[0] == m[0] ? "true" : "false",
                      ",\"largest_error\":", JsonNumber(ok.empty() ? NAN : worst, 4),
                      ",\"layouts\":", results.size(), ",\"measured\":", ok.size(), "}");
}

}  // namespace loom::sched
