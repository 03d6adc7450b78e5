#include "runtime/scheduling/batch_file.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"
#include "runtime/base/file.h"

namespace loom::sched {

absl::StatusOr<BatchFile> ParseBatchFile(const std::string& path, const std::string& text) {
  BatchFile out;
  std::set<std::string> keys;
  int line_no = 0, with_costs = 0, first_without = 0, first_with = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": ", why));
    };
    scheduler::v1::BatchSample s;
    if (auto st = google::protobuf::util::JsonStringToMessage(std::string(line), &s); !st.ok()) {
      return bad(std::string(st.message()));
    }
    if (s.key().empty()) return bad("no \"key\"");
    if (!keys.insert(s.key()).second) return bad(absl::StrCat("key \"", s.key(), "\" repeated"));
    if (s.image_tokens() < 0 || s.text_tokens() < 0 || s.loss_tokens() < 0 ||
        s.query_tokens() < 0) {
      return bad("a negative token count");
    }
    for (int p : s.output_images()) {
      if (p < 0) return bad("a negative patch count in \"output_images\"");
    }
    if (s.loss_tokens() > s.text_tokens()) return bad("more loss_tokens than text_tokens");
    for (int t : s.images()) {
      if (t < 0) return bad("a negative tile count in \"images\"");
    }
    if (s.has_encoder_cost() != s.has_llm_cost()) {
      return bad("\"encoder_cost\" and \"llm_cost\" go together: give both or neither");
    }
    if (s.has_encoder_cost()) {
      for (double c : {s.encoder_cost(), s.llm_cost()}) {
        if (!std::isfinite(c) || c < 0) return bad("a negative or non-finite cost");
      }
      ++with_costs;
      if (first_with == 0) first_with = line_no;
    } else if (first_without == 0) {
      first_without = line_no;
    }
    out.samples.push_back(std::move(s));
  }
  if (out.samples.empty()) return absl::InvalidArgumentError(path + ": no samples");
  if (with_costs > 0 && first_without > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": line ", first_with, " carries costs but line ", first_without,
                     " does not; give costs on every line or on none"));
  }
  out.has_costs = with_costs > 0;
  return out;
}

absl::StatusOr<BatchFile> ReadBatchFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseBatchFile(path, *text);
}

}  // namespace loom::sched
