// Reading the numbers of the flat JSON lines Loom's programs print
// (`loom up --json`, loom-train-local): {"step":12,"loss":4.21,...}.
#ifndef LOOM_RUNTIME_BASE_JSON_LINE_H_
#define LOOM_RUNTIME_BASE_JSON_LINE_H_

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"

namespace loom {

// The number after "NAME": in `line`; false when absent or not a number.
inline bool JsonNumberField(absl::string_view line, absl::string_view name, double* value) {
  const std::string key = "\"" + std::string(name) + "\":";
  const size_t at = line.find(key);
  if (at == absl::string_view::npos) return false;
  const size_t start = at + key.size();
  const size_t end = line.find_first_of(",}", start);
  return absl::SimpleAtod(line.substr(start, end == absl::string_view::npos ? end : end - start),
                          value);
}

}  // namespace loom

#endif  // LOOM_RUNTIME_BASE_JSON_LINE_H_
