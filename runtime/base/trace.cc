#include "runtime/base/trace.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"
#include "runtime/base/file.h"

namespace loom::trace {

double NowMicros() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

v1::TraceEvent* AddSpan(v1::TraceFile* file, const std::string& name, const std::string& cat,
                        int pid, int tid, double start_us, double end_us, int64_t iteration) {
  v1::TraceEvent* e = file->add_trace_events();
  e->set_name(name);
  e->set_cat(cat);
  e->set_ph("X");
  e->set_pid(pid);
  e->set_tid(tid);
  e->set_ts(start_us);
  e->set_dur(std::max(0.0, end_us - start_us));
  (*e->mutable_args())["iteration"] = absl::StrCat(iteration);
  return e;
}

void NameTrack(v1::TraceFile* file, int pid, int tid, const std::string& name) {
  v1::TraceEvent* e = file->add_trace_events();
  e->set_name("thread_name");
  e->set_ph("M");
  e->set_pid(pid);
  e->set_tid(tid);
  (*e->mutable_args())["name"] = name;
}

absl::Status AppendLine(const std::string& path, const v1::TraceFile& file) {
  std::string line;
  if (!google::protobuf::util::MessageToJsonString(file, &line).ok()) {
    return absl::InternalError("trace: cannot write an event as JSON");
  }
  line += '\n';
  FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return absl::UnavailableError(absl::StrCat("trace: cannot open ", path));
  const bool ok = std::fwrite(line.data(), 1, line.size(), f) == line.size();
  if (std::fclose(f) != 0 || !ok) {
    return absl::UnavailableError(absl::StrCat("trace: cannot write ", path));
  }
  return absl::OkStatus();
}

absl::Status MergeTrace(const std::string& dir, const std::string& out) {
  std::error_code ec;
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".jsonl") paths.push_back(entry.path().string());
  }
  if (ec) return absl::NotFoundError(absl::StrCat("trace: cannot list ", dir, ": ", ec.message()));
  std::sort(paths.begin(), paths.end());
  v1::TraceFile merged, predicted;
  for (const std::string& path : paths) {
    absl::StatusOr<std::string> text = ReadFile(path);
    if (!text.ok()) return text.status();
    int number = 0;
    for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
      ++number;
      v1::TraceFile part;
      if (!google::protobuf::util::JsonStringToMessage(std::string(line), &part).ok()) {
        return absl::DataLossError(
            absl::StrCat("trace: ", path, " line ", number, " is not a trace line"));
      }
      for (v1::TraceEvent& e : *part.mutable_trace_events()) {
        (e.pid() == kPredictedPid ? predicted : merged).add_trace_events()->Swap(&e);
      }
    }
  }
  // Each iteration's measured start: its earliest measured event.
  std::map<int64_t, double> start;
  auto iteration_of = [](const v1::TraceEvent& e, int64_t* i) {
    auto it = e.args().find("iteration");
    return it != e.args().end() && absl::SimpleAtoi(it->second, i);
  };
  for (const v1::TraceEvent& e : merged.trace_events()) {
    int64_t i = 0;
    if (e.ph() != "X" || !iteration_of(e, &i)) continue;
    auto [it, fresh] = start.emplace(i, e.ts());
    if (!fresh) it->second = std::min(it->second, e.ts());
  }
  for (v1::TraceEvent& e : *predicted.mutable_trace_events()) {
    int64_t i = 0;
    if (e.ph() == "X") {
      if (!iteration_of(e, &i) || start.count(i) == 0) continue;  // never measured
      e.set_ts(e.ts() + start[i]);
    }
    merged.add_trace_events()->Swap(&e);
  }
  for (auto [pid, name] : {std::pair<int, const char*>{kMeasuredPid, "measured (workers)"},
                           {kPredictedPid, "predicted (loom-scheduler's simulator)"}}) {
    v1::TraceEvent* e = merged.add_trace_events();
    e->set_name("process_name");
    e->set_ph("M");
    e->set_pid(pid);
    (*e->mutable_args())["name"] = name;
  }
  merged.set_display_time_unit("ms");
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(merged, &json).ok()) {
    return absl::InternalError("trace: cannot write the merged trace as JSON");
  }
  return WriteFileAtomically(out, json);
}

std::vector<IterationFigures> TraceIterations(const v1::TraceFile& merged) {
  struct Track {
    double start = 1e300, end = 0, busy = 0;
  };
  // (iteration, pid) -> tid -> its compute spans; each iteration's measured start.
  std::map<std::pair<int64_t, int>, std::map<int, Track>> tracks;
  std::map<int64_t, double> start;
  for (const v1::TraceEvent& e : merged.trace_events()) {
    int64_t i = 0;
    auto it = e.args().find("iteration");
    if (e.ph() != "X" || it == e.args().end() || !absl::SimpleAtoi(it->second, &i)) continue;
    if (e.pid() == kMeasuredPid) {
      auto [s, fresh] = start.emplace(i, e.ts());
      if (!fresh) s->second = std::min(s->second, e.ts());
    }
    if (e.cat() != "forward" && e.cat() != "backward" && e.cat() != "recompute") continue;
    Track& t = tracks[{i, e.pid()}][e.tid()];
    t.start = std::min(t.start, e.ts());
    t.end = std::max(t.end, e.ts() + e.dur());
    t.busy += e.dur();
  }
  std::vector<IterationFigures> out;
  for (const auto& [i, t0] : start) {
    auto m = tracks.find({i, kMeasuredPid});
    auto p = tracks.find({i, kPredictedPid});
    if (m == tracks.end() || p == tracks.end()) continue;
    IterationFigures f;
    f.iteration = i;
    for (bool measured : {true, false}) {
      double end = 0, idle = 0, span = 0;
      for (const auto& [tid, t] : (measured ? m : p)->second) {
        end = std::max(end, t.end);
        span += t.end - t.start;
        idle += t.end - t.start - t.busy;
        (measured ? f.measured_busy : f.predicted_busy)[tid] = t.busy / 1e6;
      }
      (measured ? f.measured_seconds : f.predicted_seconds) = (end - t0) / 1e6;
      (measured ? f.measured_bubble : f.predicted_bubble) = span > 0 ? idle / span : 0;
    }
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace loom::trace
