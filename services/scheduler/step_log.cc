#include "services/scheduler/step_log.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "loom/tensorboard/v1/event.pb.h"
#include "runtime/base/file.h"
#include "runtime/base/json_line.h"

namespace loom {
namespace {

double UnixSeconds(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

}  // namespace

absl::StatusOr<std::unique_ptr<StepLog>> StepLog::Open(const std::string& dir,
                                                       const std::string& run, bool fresh) {
  const std::string board = absl::StrCat(dir, "/tensorboard/", run);
  if (absl::Status s = MakeDirectories(board); !s.ok()) return s;
  if (fresh) {
    if (absl::Status s = WriteFileAtomically(dir + "/metrics.jsonl", ""); !s.ok()) return s;
  }
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "localhost");
  const absl::Time now = absl::Now();
  const std::string name = absl::StrCat(board, "/events.out.tfevents.", absl::ToUnixSeconds(now),
                                        ".", host, ".", getpid());
  // A name of its own: another log opened this second by this process
  // gets ".1", ".2", ...
  absl::StatusOr<TfRecordWriter> events = TfRecordWriter::Create(name);
  for (int i = 1; !events.ok() && absl::IsAlreadyExists(events.status()) && i < 1000; ++i) {
    events = TfRecordWriter::Create(absl::StrCat(name, ".", i));
  }
  if (!events.ok()) return events.status();
  tensorboard::v1::Event first;
  first.set_wall_time(UnixSeconds(now));
  first.set_file_version("brain.Event:2");
  if (absl::Status s = events->Append(first.SerializeAsString()); !s.ok()) return s;
  return std::unique_ptr<StepLog>(new StepLog(dir + "/metrics.jsonl", std::move(*events)));
}

absl::Status StepLog::Append(const scheduler::v1::StepReport& r, absl::Time at) {
  const int64_t step = r.iteration() + 1;
  const double tokens_per_second = r.seconds() > 0 ? r.tokens() / r.seconds() : 0;
  const std::string line = absl::StrCat(
      "{\"step\":", step, ",\"loss\":", JsonNumber(r.loss(), 6),
      ",\"grad_norm\":", JsonNumber(r.grad_norm(), 6), ",\"lr\":", JsonNumber(r.lr(), 9),
      ",\"samples\":", r.samples(), ",\"tokens\":", r.tokens(),
      ",\"loss_tokens\":", r.loss_tokens(), ",\"step_seconds\":", JsonNumber(r.seconds(), 4),
      ",\"tokens_per_second\":", JsonNumber(tokens_per_second, 1),
      ",\"skipped\":", r.skipped() ? "true" : "false",
      r.has_validation_loss()
          ? absl::StrCat(",\"validation_loss\":", JsonNumber(r.validation_loss(), 6),
                         ",\"validation_loss_tokens\":", r.validation_loss_tokens())
          : "",
      r.output_images() > 0
          ? absl::StrCat(",\"generation_loss\":", JsonNumber(r.generation_loss(), 6),
                         ",\"output_images\":", r.output_images())
          : "",
      ",\"time\":", JsonNumber(UnixSeconds(at), 3), "}\n");
  tensorboard::v1::Event e;
  e.set_wall_time(UnixSeconds(at));
  e.set_step(step);
  tensorboard::v1::Summary* summary = e.mutable_summary();
  for (const auto& [tag, v] : {std::pair<const char*, double>{"train/loss", r.loss()},
                               {"train/grad_norm", r.grad_norm()},
                               {"train/lr", r.lr()},
                               {"train/step_seconds", r.seconds()},
                               {"train/tokens_per_second", tokens_per_second},
                               {"train/samples", static_cast<double>(r.samples())},
                               {"train/loss_tokens", static_cast<double>(r.loss_tokens())}}) {
    tensorboard::v1::Summary::Value* value = summary->add_value();
    value->set_tag(tag);
    value->set_simple_value(static_cast<float>(v));
  }
  if (r.has_validation_loss()) {
    tensorboard::v1::Summary::Value* value = summary->add_value();
    value->set_tag("validation/loss");
    value->set_simple_value(static_cast<float>(r.validation_loss()));
  }
  if (r.output_images() > 0) {
    tensorboard::v1::Summary::Value* value = summary->add_value();
    value->set_tag("train/generation_loss");
    value->set_simple_value(static_cast<float>(r.generation_loss()));
  }
  absl::MutexLock lock(&mu_);
  std::FILE* f = std::fopen(metrics_path_.c_str(), "ab");
  if (f == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(metrics_path_, ": ", std::strerror(errno)));
  }
  const bool written = std::fwrite(line.data(), 1, line.size(), f) == line.size();
  if (std::fclose(f) != 0 || !written) {
    return absl::InternalError(absl::StrCat(metrics_path_, ": write failed"));
  }
  return events_.Append(e.SerializeAsString());
}

}  // namespace loom
