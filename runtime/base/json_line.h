// The flat JSON lines Loom's programs print (`loom up --json`,
// loom-train-local): {"step":12,"loss":4.21,...}; writing and reading their
// numbers.
#ifndef LOOM_RUNTIME_BASE_JSON_LINE_H_
#define LOOM_RUNTIME_BASE_JSON_LINE_H_

#include <cmath>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace loom {

// `v` with `digits` decimals; null when it is not finite (JSON has no NaN:
// a skipped step's loss and norm).
inline std::string JsonNumber(double v, int digits) {
  return std::isfinite(v) ? absl::StrFormat("%.*f", digits, v) : std::string("null");
}

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
